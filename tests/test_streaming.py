"""Streaming data (issue 24.7): a DataLoader is read lazily, one pass per inner run.

- every inner run draws its own pass (shuffle and augmentation redrawn), and every evaluation
  of a step in one run sees the same batch, each read from the loader once (forward mode: the
  current one; reverse mode: the batches it replays, kept beside its states);
- forward = reverse = finite differences in float64 on a pass held fixed
  (``InnerProblem.fixed_pass``, which ``hypergradcheck`` uses);
- forward mode's memory does not grow with T (the batches are not stored);
- a Trainer killed between outer steps and resumed ends bitwise equal (the passes' seeds are
  in the checkpoint), with and without worker processes, offline and online;
- a one-shot iterator is refused.
"""

from __future__ import annotations

import functools
import gc
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fixtures import Interrupt, interrupt_after, make_trainer
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

import hypergrad as hg
from hypergrad.measure import measure


class Augmented(Dataset):
    """``n`` examples of ``d`` features made from their index, plus random noise drawn from
    torch's global generator on every read (augmentation); counts its reads."""

    def __init__(self, n: int = 32, d: int = 4) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d, generator=g, dtype=torch.float64)
        self.y = torch.randint(0, 3, (n,), generator=g)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        return self.x[i] + 0.1 * torch.randn(self.x.shape[1], dtype=torch.float64), self.y[i]


class Synthetic(Dataset):
    """Whole batches made on the fly from their example indices (the dataset holds no
    features), plus noise: ``ds[indices] -> (x, y)``, read by a DataLoader with a batch
    sampler and ``batch_size=None``."""

    def __init__(self, n: int, d: int) -> None:
        self.n, self.freq = n, torch.linspace(0.01, 1.0, d, dtype=torch.float64)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.tensor(idx)
        x = torch.sin(i[:, None].double() * self.freq)
        return x + 0.1 * torch.randn(x.shape, dtype=torch.float64), i % 3


def _problem(steps: int = 6, workers: int = 0, record: list[torch.Tensor] | None = None,
             loader: Any = None) -> tuple[hg.InnerProblem, Augmented]:
    d = 4  # the model reads the first 4 features of a batch
    ds = Augmented(32, d)
    if loader is None:
        loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers)
    with torch.random.fork_rng():  # the same weights; the process's generator left alone
        torch.manual_seed(0)
        model = nn.Linear(d, 3).double()
    xv = torch.randn(16, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    yv = torch.arange(16) % 3

    def train_loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
        x, y = batch
        if record is not None:
            kept = x.detach().clone()
            # a memory count runs the loss on tensors without data (hypergrad.footprint)
            if not is_fake(kept):
                record.append(kept)
        return F.cross_entropy(m(x[:, :d]), y)

    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log"),
                          hg.Scalar("mom", 0.5, transform="logit")])
    problem = hg.InnerProblem(model, train_loss, hg.optim.sgd(lr="lr", momentum="mom"), hps,
                              loader, steps, lambda m, hp: F.cross_entropy(m(xv), yv))
    return problem, ds


def _distinct(xs: list[torch.Tensor]) -> int:
    out: list[torch.Tensor] = []
    for x in xs:
        if not any(torch.equal(x, y) for y in out):
            out.append(x)
    return len(out)


# -- (a) one pass per inner run, one batch per step ----------------------------------------------
def test_each_inner_run_draws_its_pass_and_every_evaluation_of_a_step_sees_one_batch() -> None:
    seen: list[torch.Tensor] = []
    problem, ds = _problem(steps=6, record=seen)
    lam = problem.init_raw()
    problem.check(lam)
    from hypergrad.data import Stream

    assert isinstance(problem.stream, Stream)
    runs = []
    for _ in range(2):
        problem.begin_run()
        runs.append([problem.batch(t)[0].clone() for t in range(6)])
    # shuffle and augmentation redrawn: the two runs' batches differ
    assert not any(torch.equal(a, b) for a, b in zip(*runs))
    # the same run read again (a step before the last one read): the same batches
    assert all(torch.equal(problem.batch(t)[0], runs[1][t]) for t in range(6))
    assert problem.stream.replays == 1

    for method in (hg.ForwardMode(), hg.ReverseMode(), hg.ReverseMode(checkpoint=2)):
        seen.clear()
        reads, replays = ds.reads, problem.stream.replays
        method.hypergradient(problem, lam)
        # each batch read from the loader once, and every evaluation of step t (the gradient,
        # its HVPs, the backward sweep's VJPs, recomputed segments) sees that one batch
        assert ds.reads - reads == 6 * 8, method
        assert problem.stream.replays == replays, method
        # (forward mode with VmapVJP evaluates the loss once per step: the gradient's forward
        # pass serves the products too; reverse mode evaluates steps again)
        assert len(seen) >= 6 and _distinct(seen) == 6, method
    # two inner runs of the same method see different batches: different hypergradients
    a = hg.ForwardMode().hypergradient(problem, lam).grad
    b = hg.ForwardMode().hypergradient(problem, lam).grad
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_forward_equals_reverse_and_finite_differences_on_a_fixed_pass(workers: int) -> None:
    problem, _ = _problem(steps=6, workers=workers)
    lam = problem.init_raw()
    with problem.fixed_pass() as seed:
        fwd = hg.ForwardMode().hypergradient(problem, lam).grad
        rev = hg.ReverseMode().hypergradient(problem, lam).grad
        ck = hg.ReverseMode(checkpoint=2).hypergradient(problem, lam).grad
        fd = hg.FiniteDifference().hypergradient(problem, lam).grad
    assert isinstance(seed, int)
    assert hg.testing.rel_err(fwd, rev) < 1e-12 and torch.equal(rev, ck)
    assert hg.testing.rel_err(fwd, fd) < 1e-6
    with problem.fixed_pass(seed):  # the same pass again, by its seed
        assert torch.equal(hg.ForwardMode().hypergradient(problem, lam).grad, fwd)
    other = hg.ForwardMode().hypergradient(problem, lam).grad  # a pass of its own
    assert hg.testing.rel_err(other, fwd) > 1e-3
    if workers == 0:  # every method of the check on one pass
        report = hg.testing.hypergradcheck(problem)
        assert report.ok and report.max("fwd_vs_rev") < 1e-12


# -- (b) memory ----------------------------------------------------------------------------------
B, D = 64, 256  # a batch: 64 x 256 float64 = 128 KiB (the model reads 4 of the features)


def _batch_bytes_alive() -> int:
    gc.collect()
    return sum(x.untyped_storage().nbytes() for x in gc.get_objects()
               if issubclass(type(x), torch.Tensor) and tuple(x.shape) == (B, D))


def _synthetic(steps: int) -> hg.InnerProblem:
    ds = Synthetic(B * 600, D)
    loader = DataLoader(ds, batch_size=None,
                        sampler=BatchSampler(RandomSampler(ds), B, drop_last=True))
    return _problem(steps=steps, loader=loader)[0]


def _forward_run(steps: int) -> hg.InnerProblem:
    problem = _synthetic(steps)
    hg.ForwardMode().hypergradient(problem, problem.init_raw())
    return problem


def test_forward_memory_does_not_grow_with_the_horizon() -> None:
    batch = B * D * 8
    peaks, held = {}, {}
    for steps in (50, 500):
        before = _batch_bytes_alive()
        problem, stats = measure(lambda s=steps: _forward_run(s))  # type: ignore[misc]
        peaks[steps] = stats["peak_extra_bytes"]
        held[steps] = _batch_bytes_alive() - before  # while the problem is alive
        del problem
    # storing the batches would hold 500 x 128 KiB = 62.5 MiB at T = 500, 6.25 MiB at T = 50;
    # a streamed pass holds the current batch and the checks' first batch (VmapVJP's first
    # call keeps step 0's batch alive besides, whatever the source)
    assert held[50] == held[500] <= 3 * batch, held
    print(f"peak extra heap: T=50 {peaks[50] / 2**20:.1f} MiB, T=500 {peaks[500] / 2**20:.1f} "
          f"MiB; batches held after the run: {held[50] // batch} and {held[500] // batch}")
    assert peaks[500] < peaks[50] + 16 * 2**20, peaks
    assert peaks[500] < 0.25 * 500 * batch, peaks
    # reverse mode keeps the batches it replays while it runs, and drops them after
    problem = _synthetic(50)
    before = _batch_bytes_alive()
    hg.ReverseMode().hypergradient(problem, problem.init_raw())
    assert _batch_bytes_alive() - before <= 2 * batch
    est = hg.ReverseMode().estimate_memory(problem)
    assert est is not None and est.total > 50 * batch  # the kept batches are in its estimate


# -- (c) a killed run resumes bitwise ------------------------------------------------------------
@pytest.mark.parametrize("mode,workers", [("offline", 0), ("offline", 2), ("online", 0)])
def test_a_killed_run_resumes_bitwise_equal(mode: str, workers: int, tmp_path: Path) -> None:
    made: list[Augmented] = []

    def mk(run_dir: Path, resume: bool = False, evaluate: Any = None) -> hg.Trainer:
        problem, ds = _problem(steps=6, workers=workers)
        made.append(ds)
        return make_trainer(problem, "forward", functools.partial(torch.optim.Adam, lr=0.1),
                            mode=mode, interval=2, outer_steps=3, run_dir=run_dir,
                            resume=resume, evaluate=evaluate)

    full = mk(tmp_path / "full").fit()
    with pytest.raises(Interrupt):  # dies during its 3rd outer step, after 2 checkpoints
        mk(tmp_path / "part", evaluate=interrupt_after(2)).fit()
    ck = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)
    assert ck["outer_step"] == 2
    resumed = mk(tmp_path / "part", resume=True).fit()
    assert torch.equal(resumed.lam, full.lam)
    assert [h["val_loss"] for h in resumed.history] == [h["val_loss"] for h in full.history]
    assert full.state is not None and resumed.state is not None
    assert all(torch.equal(resumed.state.params[k], v) for k, v in full.state.params.items())
    assert ck["batches"]["passes"] >= 1  # the passes' state is in the checkpoint
    if workers == 0:  # the loader was read by every inner run, not once at construction
        runs = 3 if mode == "offline" else 1
        assert made[0].reads >= runs * 6 * 8


def test_the_passes_go_on_from_the_checkpoints_state() -> None:
    problem, _ = _problem()
    stream = problem.stream
    assert stream is not None
    problem.begin_run()
    first = problem.batch(3)[0].clone()
    state = stream.state_dict()
    problem.begin_run()
    nxt = problem.batch(0)[0].clone()
    again, _ = _problem()
    assert again.stream is not None
    again.stream.load_state_dict(state)  # mid-run: the same pass, read to the step asked
    assert torch.equal(again.batch(3)[0], first)
    again.begin_run()  # then the pass that came next
    assert torch.equal(again.batch(0)[0], nxt)


# -- (d) refusals --------------------------------------------------------------------------------
def _with(batches: Any) -> hg.InnerProblem:
    x = torch.randn(8, 4, dtype=torch.float64)
    return hg.InnerProblem(nn.Linear(4, 3).double(), lambda m, b, hp: m(b[0]).sum(),
                           hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1)]),
                           batches, 3, lambda m, hp: m(x).sum())


def test_a_one_shot_iterator_is_refused() -> None:
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    gen = ((x, y) for _ in range(10))  # enough batches, but only one pass
    with pytest.raises(ValueError, match=r"batches is a one-shot iterator \(generator\).*every "
                                         r"inner run.*reads its batches from the start.*a "
                                         r"torch DataLoader"):
        _with(gen)
    loader = DataLoader([(x[i], y[i]) for i in range(8)], batch_size=4)
    with pytest.raises(ValueError, match="one-shot iterator"):
        _with(iter(loader))
    _with(loader)  # the loader itself starts a new pass on each iter()


def test_persistent_workers_are_refused() -> None:
    ds = Augmented()
    loader = DataLoader(ds, batch_size=8, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="persistent_workers=True.*persistent_workers=False"):
        _with(loader)


class Plain(Dataset):
    """Fixed examples, no augmentation."""

    def __init__(self, n: int, d: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d, generator=g, dtype=torch.float64)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


@pytest.mark.parametrize(("data", "shuffle", "varies"), [
    ("plain", False, False), ("plain", True, True), ("augmented", False, True)])
def test_a_loader_that_reads_the_same_batches_every_pass_does_not_vary(
        data: str, shuffle: bool, varies: bool) -> None:
    """A DataLoader with shuffle=False over fixed examples reads the same batches every pass:
    the problem does not vary (``InnerProblem.varies``), so the default search neither
    re-checks its best points in another batch order nor takes a second hypergradient there,
    which would be the same run again (it counted as varying, as every stream did). A
    shuffle or an augmentation makes the passes differ."""
    ds = Plain(32, 4) if data == "plain" else Augmented(32, 4)
    p, _ = _problem(loader=DataLoader(ds, batch_size=8, shuffle=shuffle))
    assert p.varies is varies
    tr = hg.Trainer(p, "reverse", mode=hg.Offline(outer_steps=1, recheck="auto"),
                    guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    assert tr._two_orders() is varies
    res = tr.fit()
    assert bool(res.rechecked) is varies


def test_per_example_weights_of_another_size_than_the_loaders_data_set_are_refused() -> None:
    """``PerExample(n=58)`` over a DataLoader of 48 examples ran, the 10 weights no example
    reads getting a hypergradient of 0 forever (MiniBatches' size was checked, a DataLoader's
    was not); ``n`` must be ``len(loader.dataset)``."""
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (48,), generator=g)
    ds = TensorDataset(x, y, torch.arange(48))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Linear(4, 3).double()

    def problem(n: int) -> hg.InnerProblem:
        return hg.InnerProblem(
            model, lambda m, b, hp: (hp["w"][b[2]] * F.cross_entropy(m(b[0]), b[1],
                                                                     reduction="none")).mean(),
            hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", 1.0, n=n)]),
            DataLoader(ds, batch_size=8, shuffle=True), 3,
            lambda m, hp: F.cross_entropy(m(x), y))

    for n in (58, 40):
        p = problem(n)
        with pytest.raises(ValueError, match=rf"has n={n}, but the training data has 48 "
                                             rf"examples"):
            p.check(p.init_raw())
    good = problem(48)
    good.check(good.init_raw())


class _Whole(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """An iterable dataset of 32 examples that every worker reads whole."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self) -> Any:
        yield from zip(self.x, self.y)


class _Split(_Whole):
    """The same, split by worker (torch.utils.data.get_worker_info())."""

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        yield from zip(self.x[k::n], self.y[k::n])


@pytest.mark.parametrize(("dataset", "workers", "init", "warned"), [
    (_Whole, 2, None, True), (_Split, 2, None, False), (_Whole, 0, None, False),
    (_Whole, 2, lambda i: None, False)])  # a worker_init_fn: taken to split it
def test_an_iterable_dataset_every_worker_reads_whole_is_warned(
        dataset: type, workers: int, init: Any, warned: bool) -> None:
    """A DataLoader with 2 workers over an IterableDataset that does not split its stream by
    worker gives every example twice a pass: PyTorch says nothing, and the hypergradients
    were of a problem with every batch doubled."""
    import warnings

    x, y = torch.randn(32, 5), torch.randint(0, 3, (32,))
    loader = DataLoader(dataset(x, y), batch_size=8, num_workers=workers, worker_init_fn=init)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        hg.InnerProblem(nn.Linear(5, 3), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        loader, 4, lambda m, hp: F.cross_entropy(m(x), y))
    told = [w for w in said if "get_worker_info" in str(w.message)]
    assert len(told) == int(warned)
    if warned:
        assert "every example comes 2 times a pass" in str(told[0].message)
        assert told[0].filename == __file__  # the user's line
