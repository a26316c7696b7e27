"""Review of how users' data and inner problems are built (hypergrad.data, hypergrad.problem):
each test reproduces a silent wrong answer or an unhelpful crash found by the review, and
fails without its fix."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.errors import UnseededRandomnessWarning
from hypergrad.testing import hypergradcheck

D = torch.float64


def _problem(batches: Any, steps: int = 3, model: nn.Module | None = None,
             train_loss: Any = None, val_loss: Any = None) -> hg.InnerProblem:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model if model is not None else nn.Linear(3, 2).double()
    xv = torch.randn(10, 3, dtype=D, generator=torch.Generator().manual_seed(1))
    yv = torch.arange(10) % 2

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    def vl(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(xv), yv)

    return hg.InnerProblem(model, train_loss or tl, hg.optim.sgd(lr="lr"),
                           hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")]),
                           batches, steps, val_loss or vl)


def _data(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, dtype=D, generator=g), torch.arange(n) % 2


@pytest.mark.parametrize("wrap", [tuple, list])
def test_the_data_sets_columns_as_batches_are_refused(wrap: Any) -> None:
    # batches=(x, y) was read as two mini-batches, x at step 0 and y at step 1: the loss
    # crashed with torch's "expected target dtype to be Long or Byte, but got Double"
    x, y = _data()
    with pytest.raises(TypeError, match=r"batches is a (tuple|list) of 2 tensors with 8 rows "
                                        r"each.*\(x, y\).*MiniBatches\(x, y, batch_size"):
        _problem(wrap((x, y)))


def test_the_data_sets_numpy_columns_as_batches_are_refused() -> None:
    # (x, y) of NumPy arrays: "linear(): argument 'input' (position 1) must be Tensor, not
    # numpy.ndarray", from the loss at step 0, which was x alone
    x, y = _data()
    with pytest.raises(TypeError, match=r"batches is a tuple of 2 arrays with 8 rows each.*"
                                        r"torch.as_tensor"):
        _problem((x.numpy(), y.numpy()))


def test_a_list_of_single_tensor_batches_stays_allowed() -> None:
    x, _ = _data()

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return m(b).pow(2).mean()

    p = _problem([x[:4], x[4:]], train_loss=tl)
    p.run(p.init_raw())


def test_a_dict_as_batches_is_refused() -> None:
    # a dict was read as a stream of its keys: IndexError: string index out of range
    x, y = _data()
    with pytest.raises(TypeError, match=r"batches is a dict with keys \['x', 'y'\].*\[batch\]"):
        _problem({"x": x, "y": y})


def test_a_map_style_dataset_names_the_dataloader() -> None:
    x, y = _data()
    with pytest.raises(TypeError, match=r"got TensorDataset: a data set of examples.*DataLoader"
                                        r"\(tensordataset, batch_size"):
        _problem(TensorDataset(x, y))


@pytest.mark.parametrize("which", ["train_loss", "val_loss"])
def test_a_loss_of_shape_one_is_refused_by_the_check(which: str) -> None:
    # a loss of shape (1,) passed check() and plain runs, then every hypergradient failed
    # with torch.func's "Expected f(*args) to return a scalar Tensor, got tensor with 1 dims"
    x, y = _data()
    xv, yv = _data(10)

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1]).reshape(1)

    def vl(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(xv), yv).reshape(1)

    p = _problem([(x, y)], **{which: tl if which == "train_loss" else vl})
    with pytest.raises(ValueError, match=rf"{which} returned a tensor of shape \(1,\); it must "
                                         rf"be a 0-d scalar.*squeeze"):
        p.check(p.init_raw())


class _StoredIterator:
    """A re-iterable in name only: ``__iter__`` returns one stored, endless generator, so
    every pass goes on where the last one stopped."""

    def __init__(self) -> None:
        def batches() -> Any:
            i = 0
            while True:
                g = torch.Generator().manual_seed(i)
                i += 1
                yield torch.randn(4, 3, dtype=D, generator=g), torch.arange(4) % 2

        self.it = batches()

    def __iter__(self) -> Any:
        return self.it


def test_an_iterable_returning_a_stored_iterator_is_refused() -> None:
    # each inner run went on where the last one stopped: two runs of one fixed pass ended at
    # other weights, and forward mode was 70 % off reverse mode, 100 % off finite differences
    p = _problem(_StoredIterator())
    with pytest.raises(ValueError, match=r"iter\(batches\) returned the same generator twice: "
                                         r"_StoredIterator.__iter__ returns a stored iterator"
                                         r".*def __iter__\(self\): yield from"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


class _Augmented(Dataset):  # type: ignore[type-arg]
    """Examples with noise added on every read: from a NumPy generator of the data set's own
    (``own=True``: not seeded by the pass), or NumPy's global one (seeded by the pass)."""

    def __init__(self, own: bool) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(32, 3, dtype=D, generator=g)
        self.y = torch.arange(32) % 2
        self.rng: Any = np.random.default_rng(0) if own else np.random

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.3 * torch.as_tensor(self.rng.normal(size=3)), self.y[i]


def test_a_source_whose_passes_do_not_repeat_is_warned_about() -> None:
    # hypergradcheck read its fixed pass with other noise in every run and FAILED without a
    # word: forward 63 % off reverse, 100 % off finite differences
    p = _problem(DataLoader(_Augmented(own=True), batch_size=8, shuffle=True), steps=4)
    with pytest.warns(UnseededRandomnessWarning, match=r"batches \(DataLoader\) gave another "
                                                       r"mini-batch 0.*default_rng"):
        hypergradcheck(p, raise_exception=False)


def test_a_source_whose_passes_do_not_repeat_is_warned_about_by_the_checks() -> None:
    """The workers probe (2026-12-07): an offline forward-mode Trainer never reads a pass
    again, so it never warned, and its resumed run differed from the straight one (validation
    2.3145 against 2.2910 two steps after the resume). The checks now read batch 0 of their
    pass twice."""
    p = _problem(DataLoader(_Augmented(own=True), batch_size=8, shuffle=True), steps=4)
    with pytest.warns(UnseededRandomnessWarning, match=r"batches \(DataLoader\) gave another "
                                                       r"mini-batch 0"):
        p.check(p.init_raw())


def test_a_source_drawing_from_the_global_generators_repeats_its_passes() -> None:
    p = _problem(DataLoader(_Augmented(own=False), batch_size=8, shuffle=True), steps=4)
    report = hypergradcheck(p)  # no warning (warnings are errors here), and it passes
    assert report.ok


def _bn_net() -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(),
                             nn.Linear(8, 2)).double()


def test_a_model_given_in_eval_mode_is_refused() -> None:
    # model.eval() before building: training ran BatchNorm on its frozen running statistics,
    # validation loss 1.3297 after 5 steps against 1.3474 for a torch loop in train mode
    x, y = _data()
    net = _bn_net().eval()
    with pytest.raises(ValueError, match=r"the model is in eval mode.*BatchNorm1d \('1'\).*"
                                         r"Call model.train\(\)"):
        _problem([(x, y)], model=net)
    _problem([(x, y)], model=_bn_net())  # train mode
    net = _bn_net()
    net[1].eval()  # one layer frozen on purpose
    _problem([(x, y)], model=net)
    _problem([(x, y)], model=nn.Linear(3, 2).double().eval())  # nothing depends on the mode


def test_a_model_given_in_eval_mode_trains_as_its_author_said() -> None:
    # the way out the message names: every submodule in eval mode, on purpose
    x, y = _data()
    net = _bn_net().eval()
    net.training = True
    p = _problem([(x, y)], model=net, steps=2)
    s = p.run(p.init_raw())
    assert torch.equal(s.buffers.get("1.running_mean", net[1].running_mean),
                       net[1].running_mean)  # frozen statistics


@pytest.mark.parametrize("name", ["my_data.npz", Path("my_data.npz")])
def test_a_file_name_as_batches_is_refused(name: Any) -> None:
    # a str was read as a stream of its characters: IndexError: string index out of range
    with pytest.raises(TypeError, match=r"batches is (str|PosixPath|WindowsPath) 'my_data.npz'"
                                        r": a file name is not read.*numpy.load.*MiniBatches"):
        _problem(name)


def test_minibatches_read_the_seed_they_have_now() -> None:
    # the epoch's cached order ignored a seed set afterwards: step 0 read seed 0's batch
    # [8, 4, 1, 0, 2] after mb.seed = 1 (seed 1's is [5, 3, 8, 0, 2]) while the next epochs
    # followed seed 1 (the seed attribute is what InnerProblem.variant moves)
    x = torch.arange(10.0).unsqueeze(1)
    mb = MiniBatches(x, batch_size=5, seed=0)
    mb(0)
    mb.seed = 1
    fresh = MiniBatches(x, batch_size=5, seed=1)
    for t in range(4):
        assert torch.equal(mb(t)[-1], fresh(t)[-1]), t


def test_a_dataloader_that_drops_its_only_batch_says_so() -> None:
    # the message was "batches yielded no mini-batch; give at least one." alone
    x, y = _data(6)
    p = _problem(DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, drop_last=True))
    with pytest.raises(ValueError, match=r"yielded no mini-batch.*drop_last=True and "
                                         r"batch_size=8, but its dataset has 6 examples.*use "
                                         r"batch_size <= 6 or drop_last=False"):
        p.run(p.init_raw())


def test_a_dataloader_ending_each_epoch_on_one_example_is_refused_for_batchnorm() -> None:
    # 9 examples in batches of 4: step 2 read a batch of 1 and torch's BatchNorm failed there,
    # after a whole epoch: "Expected more than 1 value per channel when training"
    x, y = _data(9)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
    with pytest.raises(ValueError, match=r"last batch of every epoch holds 1 example \(9 "
                                         r"examples, batch_size=4, drop_last=False\).*"
                                         r"BatchNorm '1'.*drop_last=True"):
        _problem(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True), model=net)
    p = _problem(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, drop_last=True),
                 model=net, steps=4)
    p.run(p.init_raw())
    _problem(DataLoader(TensorDataset(x, y), batch_size=4))  # no BatchNorm: nothing to fail
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False),
                        nn.Linear(4, 2)).double()
    with pytest.raises(ValueError, match=r"last batch of every epoch holds 1 example"):
        _problem(DataLoader(TensorDataset(x, y), batch_size=4), model=net)
    net[1].eval()  # no running statistics: batch statistics in eval mode too
    with pytest.raises(ValueError, match=r"last batch of every epoch holds 1 example"):
        _problem(DataLoader(TensorDataset(x, y), batch_size=4), model=net)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
    net[1].eval()  # frozen running statistics: one example is fine
    _problem(DataLoader(TensorDataset(x, y), batch_size=4), model=net)


def _sampled(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A callable batch source drawing its examples from torch's default generator."""
    x, y = _data(32)
    idx = torch.randint(0, 32, (8,))
    return x[idx], y[idx]


def test_a_callable_drawing_from_torch_gives_one_batch_per_step() -> None:
    # the callable ran unseeded at every evaluation of a step: batch(0) twice gave two batches,
    # and reverse mode (which evaluates steps again) was 13x off forward mode
    p = _problem(_sampled, steps=4)
    assert torch.equal(p.batch(0)[0], p.batch(0)[0])
    assert not torch.equal(p.batch(0)[0], p.batch(1)[0])
    before = torch.random.get_rng_state()
    p.batch(2)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's stream untouched
    report = hypergradcheck(p)
    assert report.ok
    assert p.varies  # a variant draws other batches
    with p.variant(1):
        other = p.batch(0)[0]
    assert not torch.equal(other, p.batch(0)[0])


def test_a_callable_drawing_from_numpy_is_warned_about() -> None:
    x, y = _data(32)
    rng = np.random.default_rng(0)

    def sampled(t: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(rng.integers(0, 32, 8))
        return x[idx], y[idx]

    p = _problem(sampled, steps=2)
    with pytest.warns(UnseededRandomnessWarning, match=r"batches gave two mini-batches for "
                                                       r"step 0"):
        p.check(p.init_raw())


def test_a_callable_drawing_from_numpy_from_a_later_step_on_is_warned_about() -> None:
    """NumPy noise from step 2 on passed the check, which read step 0 alone: forward mode
    1.1e-3 from reverse mode, checkpointed reverse 4.7e-3, no word (the randomness probe,
    2026-12-07). The check reads the middle and last steps too."""
    x, y = _data(32)
    rng = np.random.default_rng(0)

    def noisy(t: int) -> tuple[torch.Tensor, torch.Tensor]:
        xb = x[:8] + (0.1 * torch.from_numpy(rng.normal(size=(8, x.shape[1]))).to(x.dtype)
                      if t >= 2 else 0.0)
        return xb, y[:8]

    p = _problem(noisy, steps=6)
    with pytest.warns(UnseededRandomnessWarning, match=r"batches gave two mini-batches for "
                                                       r"step 3"):
        p.check(p.init_raw())


def test_a_loss_unpacking_minibatches_without_the_indices_is_told_so() -> None:
    # x, y = batch on a MiniBatches batch (x, y, idx): "too many values to unpack (expected 2)"
    x, y = _data()

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        xb, yb = b
        return F.cross_entropy(m(xb), yb)

    p = _problem(MiniBatches(x, y, batch_size=4), train_loss=tl)
    with pytest.raises(ValueError, match=r"train_loss unpacks the mini-batch into 2 values.*"
                                         r"its 2 tensors and then the example indices: 3 "
                                         r"values.*x, y, idx = batch"):
        p.check(p.init_raw())


class _Reusing:
    """A loader that copies every batch into one pair of preallocated tensors."""

    def __init__(self) -> None:
        self.x, self.y = _data(32)

    def __iter__(self) -> Any:
        bx = torch.empty(8, 3, dtype=D)
        by = torch.empty(8, dtype=torch.long)
        perm = torch.randperm(32)
        for i in range(4):
            idx = perm[i * 8:(i + 1) * 8]
            bx.copy_(self.x[idx])
            by.copy_(self.y[idx])
            yield bx, by


def test_a_source_reusing_its_buffers_is_refused() -> None:
    # reverse mode replayed its kept batches, all overwritten by the last one read: on one
    # fixed pass reverse mode gave -0.0232 and forward mode 0.0085, without an error
    p = _problem(_Reusing(), steps=6)
    with pytest.raises(ValueError, match=r"batches \(_Reusing\) changed in place after it was "
                                         r"read \(its tensor 0, shape \(8, 3\)\).*yield "
                                         r"x.clone\(\)"), p.fixed_pass():
        hg.ForwardMode().hypergradient(p, p.init_raw())
        hg.ReverseMode().hypergradient(p, p.init_raw())


def test_a_loss_writing_the_batch_in_place_is_refused_and_the_data_restored() -> None:
    # x.div_(100) in train_loss: the checks divided batch 0 again at every evaluation (the
    # data set changed run after run), then the first hypergradient failed in torch.func
    x, y = _data()
    x100 = x * 100

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        xb = b[0]
        xb.div_(100)
        return F.cross_entropy(m(xb), b[1])

    batch = (x100.clone(), y)
    p = _problem([batch], train_loss=tl)
    with pytest.raises(ValueError, match=r"train_loss writes the mini-batch in place \(tensor "
                                         r"0 of mini-batch 0, shape \(8, 3\); restored now\)"
                                         r".*x = x / 255"):
        p.check(p.init_raw())
    assert torch.equal(batch[0], x100)
    # a source that gives a new tensor at each call (MiniBatches indexes its data): the check
    # saw another call's batch than the loss wrote, and forward mode failed in torch.func
    from hypergrad.data import MiniBatches

    p = _problem(MiniBatches(x100.clone(), y, batch_size=4, seed=0), train_loss=tl)
    with pytest.raises(ValueError, match=r"train_loss writes the mini-batch in place"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_a_distributed_sampler_shuffles_each_pass() -> None:
    # DistributedSampler shuffles by seed + epoch, and nothing set its epoch: every inner run
    # read the same order (shuffling per run, as a DataLoader with shuffle=True has, lost)
    x, y = _data(32)
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True)
    p = _problem(DataLoader(ds, batch_size=8, sampler=sampler), steps=4)
    runs = []
    for _ in range(2):
        p.begin_run()
        runs.append(torch.cat([p.batch(t)[0] for t in range(4)]))
    assert not torch.equal(runs[0], runs[1])
    with p.fixed_pass():  # a pass read again is the same pass
        again = []
        for _ in range(2):
            p.begin_run()
            again.append(torch.cat([p.batch(t)[0] for t in range(4)]))
    assert torch.equal(again[0], again[1])


def test_minibatches_refuse_tensors_on_different_devices() -> None:
    """x on one device and y on another: a CPU index into the other device's tensor fails
    only at the first batch (or a batch mixes devices, and the loss fails inside torch.func);
    refused at construction, naming each tensor's device. (A meta tensor stands in for a GPU's
    on a machine without one.)"""
    x, y = torch.randn(6, 2), torch.zeros(6, device="meta")
    with pytest.raises(ValueError, match=r"different devices \(argument 0 on cpu, argument 1 "
                                         r"on meta\).*MiniBatches\(x.to\(dev\)"):
        MiniBatches(x, y, batch_size=2)
    with pytest.raises(ValueError, match="different devices"):
        hg.data.split_validation(x, y, share=0.5)
    MiniBatches(x, torch.zeros(6), batch_size=2)  # one device: fine


def test_batch_fingerprint_of_a_batch_of_images_tells_orders_apart() -> None:
    """A batch of 256 3x224x224 uint8 images (38.5M entries, past float32's 2**24 exact
    integers): the fingerprint is taken (its sampled positions once rounded past the last entry,
    the IndexError made it None and the checks it serves were off for such batches) and tells an
    order of examples from another."""
    from hypergrad.data import batch_fingerprint

    x = torch.zeros(256, 3, 224, 224, dtype=torch.uint8)
    x[0] = 1
    swapped = torch.cat([x[1:], x[:1]])
    a, b = batch_fingerprint((x,)), batch_fingerprint((swapped,))
    assert a is not None and b is not None
    assert a[0][2] == b[0][2] == 3 * 224 * 224  # the same sum, another order
    assert a != b


def test_a_tensor_as_batches_is_refused_and_unshuffled_leftovers_are_named() -> None:
    """batches=x (the data tensor) was read as a stream of its rows, one example a step without
    its batch axis (E 1.39 against 0.84 with [x]); MiniBatches without shuffling dropped the
    same last rows in every epoch (their per-example hypergradients exactly 0), unsaid."""
    import warnings

    import hypergrad as hg
    from hypergrad.data import MiniBatches

    x = torch.randn(24, 5, dtype=torch.float64)
    model = torch.nn.Linear(5, 5).double()
    for data in (x, x.numpy()):
        with pytest.raises(TypeError, match=r"batches is a (tensor|array) of shape \(24, 5\): "
                                             r"iterating it gives one row per step.*\[x\]"):
            hg.InnerProblem(model, lambda m, b, hp: (m(b) - b).pow(2).mean(),
                            hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1)]),
                            data, 3, lambda m, hp: m(x).pow(2).mean())
    with pytest.warns(UserWarning, match=r"examples 20-23 are never read"):
        MiniBatches(x, batch_size=5, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MiniBatches(x, batch_size=6, shuffle=False)
        MiniBatches(x, batch_size=5)


def test_per_example_over_a_subset_names_the_renumbering() -> None:
    """A DataLoader over a Subset keeps the full set's indices: n=len(subset) was refused
    with 'n must be the number of training examples', which it was; the message now says
    why and what to do."""
    from torch.utils.data import DataLoader, Subset, TensorDataset

    import hypergrad as hg

    x, y = torch.randn(24, 5, dtype=torch.float64), torch.randint(0, 3, (24,))
    sub = Subset(TensorDataset(x, y, torch.arange(24)), range(8, 24))

    def loss(m, b, hp):  # type: ignore[no-untyped-def]
        return (hp["w"][b[2]] * torch.nn.functional.cross_entropy(m(b[0]), b[1],
                                                                    reduction="none")).mean()

    p = hg.InnerProblem(torch.nn.Linear(5, 3).double(), loss, hg.optim.sgd(lr=0.1),
                        hg.HyperParams([hg.PerExample("w", 1.0, n=16)]),
                        DataLoader(sub, batch_size=16), 2,
                        lambda m, hp: torch.nn.functional.cross_entropy(m(x), y))
    with pytest.raises(ValueError, match=r"indexes example \d+.*A Subset or random_split keeps "
                                         r"the full data set's indices"):
        p.check(p.init_raw())



def test_examples_no_step_reads_are_named_for_per_example_weights() -> None:
    """1200 examples, 6 steps of 64: 816 weights got a hypergradient of exactly 0 at every
    point and kept the search's values (one level for all, from the default start), written
    to the learned file beside the others, with no word."""
    from hypergrad.errors import ZeroHypergradientWarning

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (48,),
                                                                              generator=g)
    torch.manual_seed(0)

    def make(steps: int) -> hg.InnerProblem:
        return hg.InnerProblem(
            nn.Linear(3, 2).double(),
            lambda m, b, hp: (hp["w"][b[2]] * F.cross_entropy(m(b[0]), b[1],
                                                             reduction="none")).mean(),
            hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", n=48, init=1.0)]),
            MiniBatches(x, y, batch_size=8, seed=0), steps,
            lambda m, hp: F.cross_entropy(m(x), y))

    p = make(3)
    with pytest.warns(ZeroHypergradientWarning, match=r"24 of the 48 training examples are "
                                                      r"read by no step of the run \(3 steps "
                                                      r"of 8\).*'w'.*steps >= 6"):
        grad = hg.ReverseMode().hypergradient(p, p.init_raw()).grad
    read = torch.zeros(48, dtype=torch.bool)
    for t in range(3):
        read[p.batch(t)[2]] = True
    assert int((grad == 0).sum()) == 24 and bool((grad[~read] == 0).all())
    full = make(6)  # an epoch: every example read, no warning
    hg.ReverseMode().hypergradient(full, full.init_raw())


def test_weights_no_step_reads_from_a_list_of_batches_are_named_by_the_trainer() -> None:
    """A list of batches read by 2 of its 4 steps (or a DataLoader drawing with replacement,
    ``n`` above the data's size): half the weights got a hypergradient of exactly 0 and kept
    the search's values, with no word; only a MiniBatches counted its reads up front (the
    per-example probe). The Trainer names them at its first hypergradient, once."""
    from hypergrad.errors import ZeroHypergradientWarning

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (40,),
                                                                              generator=g)
    idx = torch.arange(40)
    batches = [(x[i:i + 10], y[i:i + 10], idx[i:i + 10]) for i in range(0, 40, 10)]

    def make(source: Any, steps: int) -> hg.InnerProblem:
        torch.manual_seed(0)
        return hg.InnerProblem(
            nn.Linear(3, 2).double(),
            lambda m, b, hp: (hp["w"][b[2]] * F.cross_entropy(m(b[0]), b[1],
                                                             reduction="none")).mean(),
            hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", n=40, init=1.0)]),
            source, steps, lambda m, hp: F.cross_entropy(m(x), y))

    tr = hg.Trainer(make(batches, 2), "reverse", mode=hg.Offline(outer_steps=2),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        tr.fit()
    said = [str(w.message) for w in got if issubclass(w.category, ZeroHypergradientWarning)]
    assert len(said) == 1 and "20 of the 40 entries of PerExample 'w'" in said[0], said
    # every example read: nothing said; a MiniBatches already said it when its data was checked
    for source, steps in ((batches, 4), (MiniBatches(x, y, batch_size=10, seed=0), 2)):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            hg.Trainer(make(source, steps), "reverse", mode=hg.Offline(outer_steps=1),
                       callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
        assert not [w for w in got if "at the first outer step" in str(w.message)]
    # a shuffled DataLoader reads other examples in each run's pass: those unread in the
    # first were told they "keep the values the search gives them", and moved (the placement
    # probe); unshuffled, they do keep them
    data = torch.utils.data.TensorDataset(x, y, idx)
    for shuffle in (True, False):
        loader = torch.utils.data.DataLoader(data, batch_size=10, shuffle=shuffle)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            hg.Trainer(make(loader, 2), "reverse", mode=hg.Offline(outer_steps=1),
                       callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
        said = [str(w.message) for w in got
                if issubclass(w.category, ZeroHypergradientWarning)]
        assert len(said) == 1 and " of the 40 entries" in said[0], said
        assert ("The batch source shuffles" in said[0]) == shuffle, said
        assert ("keep the values the search gives them" in said[0]) != shuffle, said


def test_an_inf_the_validation_loss_saturates_is_named_when_the_hypergradient_is_nan() -> None:
    """One inf in the validation data under tanh: the loss stays finite (1.84), every method's
    hypergradient is NaN, and the Trainer blamed the method and advised method='reverse'
    (also NaN) (the numeric-extremes probe)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    xv = torch.randn(10, 3, dtype=D, generator=torch.Generator().manual_seed(1))
    xv[5, 1] = float("inf")
    yv = torch.arange(10) % 2
    x = torch.randn(16, 3, dtype=D)
    p = hg.InnerProblem(m, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        [(x, torch.arange(16) % 2)], 3, lambda m, hp: F.cross_entropy(m(xv), yv))
    res = hg.Trainer(p, callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    assert res.diverged and ("data a loss reads is not: 'xv' (which val_loss closes over) "
                             "(shape (10, 3)) has 0 NaN and 1 inf entry (the first at index "
                             "(5, 1))") in res.message, res.message


def test_a_batchnorm_batch_of_one_says_so() -> None:
    """torch's 'Expected more than 1 value per channel' came with a note to check the
    features and labels."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
    with pytest.raises(ValueError, match="per channel") as got:
        _problem([(torch.randn(1, 3, dtype=D), torch.zeros(1, dtype=torch.long))],
                 model=m).check(hg.HyperParams([hg.Scalar("lr", 0.1)]).init_raw(D))
    assert any("BatchNorm layer in training mode got one example per channel" in n and
               "batch_size >= 2" in n for n in getattr(got.value, "__notes__", []))


def test_an_error_on_a_later_batch_names_the_step_and_the_batch() -> None:
    """A target out of range in mini-batch 1: torch's bare 'Target 5 is out of bounds.' (the
    check's note on the shapes covers mini-batch 0 only)."""
    x, y = _data(8)
    bad = y.clone()
    bad[2] = 5
    p = _problem([(x, y), (x, bad)], steps=2)
    with pytest.raises(IndexError, match="out of bounds") as got:
        p.run(p.init_raw())
    assert any("raised by train_loss at inner step 1, on mini-batch 1: tensor 0 (8, 3) float64, "
               "tensor 1 (8,) int64 in [0, 5]" in n for n in getattr(got.value, "__notes__", []))


def test_setting_the_mode_inside_a_loss_is_refused_naming_val_mode() -> None:
    """The callbacks probe (2026-12-07): m.train() or m.eval() inside a loss failed as
    "'bool' object is not callable" (the bound model's mode flag shadowed the method)."""
    x, y = _data()

    def train_loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        assert m.training
        m.eval()
        return F.cross_entropy(m(b[0]), b[1])

    p = _problem([(x, y)], model=_bn_net())
    p.train_loss = train_loss
    with pytest.raises(TypeError, match=r"m.eval\(\) inside a loss: .*InnerProblem\(val_mode="):
        p.check(p.init_raw())
