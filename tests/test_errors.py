"""Bad input fails early with a message naming the argument, what came, and the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.testing import digits_case, hypergradcheck


def _problem(hps: list[Any] | None = None, opt: hg.optim.Optimizer | None = None,
             steps: int = 3, train_loss: Any = None, val_loss: Any = None,
             dtype: torch.dtype = torch.float64) -> hg.InnerProblem:
    model = nn.Linear(4, 3).to(dtype)
    x, y = torch.randn(8, 4, dtype=dtype), torch.randint(0, 3, (8,))

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    def vl(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    return hg.InnerProblem(model, train_loss or tl, opt or hg.optim.sgd(lr="lr"),
                           hg.HyperParams(hps or [hg.Scalar("lr", 0.1, transform="log")]),
                           [(x, y)], steps, val_loss or vl)


def test_k_zero() -> None:
    with pytest.raises(ValueError, match=r"K = 0"):
        hg.HyperParams([])


def test_t_zero() -> None:
    with pytest.raises(ValueError, match=r"steps=0 must be an int >= 1"):
        _problem(steps=0)


def test_unknown_name_in_optimizer() -> None:
    with pytest.raises(ValueError, match=r"lr='lrr' names no hyperparameter; defined are \['lr'\]"):
        _problem(opt=hg.optim.sgd(lr="lrr"))


def test_unknown_name_in_loss() -> None:
    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1]) * hp["scale"]

    p = _problem(train_loss=tl)
    with pytest.raises(KeyError, match=r"unknown hyperparameter 'scale'; defined are \['lr'\]"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_bound_to_nothing() -> None:
    p = _problem(hps=[hg.Scalar("lr", 0.1, transform="log"), hg.Scalar("unused", 1.0)])
    with pytest.raises(ValueError, match=r"\['unused'\] are bound to nothing"):
        hg.ReverseMode().hypergradient(p, p.init_raw())


def test_loss_not_scalar() -> None:
    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1], reduction="none")

    p = _problem(train_loss=tl)
    with pytest.raises(ValueError, match=r"train_loss returned a tensor of shape \(8,\).*mean"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_loss_not_tensor() -> None:
    p = _problem(val_loss=lambda m, hp: 1.0)
    with pytest.raises(TypeError, match="val_loss returned float"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_lam_wrong_shape_and_dtype() -> None:
    p = _problem()
    with pytest.raises(ValueError, match=r"lam has shape \(2,\), expected \(1,\)"):
        hg.ForwardMode().hypergradient(p, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="lam has dtype torch.int64"):
        hg.ForwardMode().hypergradient(p, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"lam has dtype torch.float32 but the model is "):
        hg.ForwardMode().hypergradient(p, torch.zeros(1, dtype=torch.float32))


def test_non_float_dtype() -> None:
    with pytest.raises(TypeError, match="not a floating dtype"):
        hg.HyperParams([hg.Scalar("lr", 0.1)]).init_raw(torch.int32)
    model = nn.Linear(2, 2).double()
    model.weight.data = model.weight.data.half()
    with pytest.raises(TypeError, match="mix dtypes"):
        hg.InnerProblem(model, lambda m, b, hp: 0, hg.optim.sgd(lr=0.1),
                        hg.HyperParams([hg.Scalar("x", 1.0)]), [0], 1, lambda m, hp: 0)


def test_shape_mismatches() -> None:
    with pytest.raises(ValueError, match=r"init has shape \(2,\), expected a number or shape"):
        hg.HyperParams([hg.Array("t", [1.0, 2.0], shape=(3,))]).init_raw()
    with pytest.raises(ValueError, match=r"expected a number or shape \(1,\) \(a value per "
                                         r"window: 1 of them, or one for every window; for 3 "
                                         r"windows, Schedule\('lr', init=..., windows=3\)\)"):
        hg.HyperParams([hg.Schedule("lr", [0.1, 0.2, 0.3])]).init_raw()
    with pytest.raises(ValueError, match=r"params \['nope'\] are not trainable parameters"):
        _problem(hps=[hg.Scalar("lr", 0.1), hg.PerTensor("wd", 0.1, params=["nope"])])
    with pytest.raises(ValueError, match=r"parameters \['bias'\] have no value.*default="):
        _problem(hps=[hg.Scalar("lr", 0.1), hg.PerTensor("wd", 0.1, params=["weight"])])


def test_optimizer_bound_to_per_example() -> None:
    with pytest.raises(ValueError, match=r"lr is bound to 'w' of kind per_example"):
        _problem(hps=[hg.PerExample("w", n=8, init=1.0)], opt=hg.optim.sgd(lr="w"))


def test_transform_and_domain() -> None:
    with pytest.raises(ValueError, match=r"unknown transform='exp'"):
        hg.Scalar("lr", 0.1, transform="exp")
    with pytest.raises(ValueError, match=r"outside the domain of transform='log' \(values > 0\)"):
        hg.HyperParams([hg.Scalar("lr", -0.1, transform="log")]).init_raw()
    with pytest.raises(ValueError, match=r"name='my lr' must be a Python identifier"):
        hg.Scalar("my lr", 0.1)
    with pytest.raises(ValueError, match=r"names \['lr'\] are used more than once"):
        hg.HyperParams([hg.Scalar("lr", 0.1), hg.Scalar("lr", 0.2)])


def test_bad_optimizer_arguments() -> None:
    with pytest.raises(TypeError, match=r"sgd: lr=\[0.1\] must be a number or the name"):
        hg.optim.sgd(lr=[0.1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nesterov=True needs a momentum"):
        hg.optim.sgd(lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas=.* must be a pair"):
        hg.optim.adam(betas=(0.9,))  # type: ignore[arg-type]


def test_bad_strategy_arguments() -> None:
    with pytest.raises(ValueError, match=r"VmapVJP: chunk_size=0 must be None"):
        hg.hvp.VmapVJP(chunk_size=0)
    with pytest.raises(TypeError, match="hvp must be an HVPStrategy"):
        hg.ForwardMode(hvp="vmap")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps=0 must be a finite number > 0"):
        hg.FiniteDifference(eps=0)


def test_hypergradcheck_needs_float64() -> None:
    p = _problem(dtype=torch.float32)
    with pytest.raises(TypeError, match="hypergradcheck: the problem runs in torch.float32"):
        hypergradcheck(p)


def test_model_without_trainable_parameters() -> None:
    model = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter with requires_grad=True"):
        hg.InnerProblem(model, lambda m, b, hp: 0, hg.optim.sgd(lr=0.1),
                        hg.HyperParams([hg.Scalar("x", 1.0)]), [0], 1, lambda m, hp: 0)


def test_schedule_and_per_example_arguments() -> None:
    with pytest.raises(ValueError, match="windows=0 must be an int >= 1"):
        hg.Schedule("lr", 0.1, windows=0)
    with pytest.raises(ValueError, match=r"n is not given: it must be the number of training "
                                         r"examples .*hyperparams.items.w.n=\$\{task.n_train\}"):
        hg.PerExample("w", 1.0)  # n=0 was blamed as a value the user gave
    with pytest.raises(ValueError, match=r"n=-3 must be the number"):
        hg.PerExample("w", 1.0, n=-3)


def test_digits_case_bad_names() -> None:
    with pytest.raises(ValueError, match="opt='lion' must be in"):
        digits_case("lion", "lr")


# -- issue 12: named errors up front ------------------------------------------------------------
def test_unbound_hyperparameter_suggests_the_right_binding() -> None:
    p = _problem(hps=[hg.Scalar("lr", 0.1, transform="log"),
                      hg.Scalar("momentum", 0.5, transform="logit"),
                      hg.Scalar("wd", 1e-3, transform="log")])
    with pytest.raises(ValueError, match=r"\['momentum', 'wd'\] are bound to nothing") as info:
        hg.ForwardMode().hypergradient(p, p.init_raw())
    msg = str(info.value)
    assert "sgd(..., momentum='momentum', weight_decay='wd')" in msg
    assert "lr='momentum'" not in msg  # the old, wrong suggestion
    p = _problem(hps=[hg.Scalar("lr", 0.1, transform="log"), hg.Scalar("momentum", 0.9)],
                 opt=hg.optim.adam(lr="lr"))
    with pytest.raises(ValueError, match=r"adam\(\.\.\., betas=\('momentum', 0\.999\)\)"):
        hg.ReverseMode().hypergradient(p, p.init_raw())


@pytest.mark.parametrize("init", ["abc", None, [0.1, "x"]])
def test_non_numeric_init(init: Any) -> None:
    with pytest.raises(TypeError, match=r"Scalar\('lr'\): init=.* must be a number, a list"):
        hg.Scalar("lr", init)
    with pytest.raises(TypeError, match=r"Array\('l2'\): init=.* must be a number"):
        hg.Array("l2", init)


def _per_example_problem(n: int, n_data: int = 8) -> hg.InnerProblem:
    from hypergrad.data import MiniBatches

    x, y = torch.randn(n_data, 4, dtype=torch.float64), torch.randint(0, 3, (n_data,))

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return (hp["w"][b[2]] * F.cross_entropy(m(b[0]), b[1], reduction="none")).mean()

    return hg.InnerProblem(nn.Linear(4, 3).double(), tl, hg.optim.sgd(lr=0.1),
                           hg.HyperParams([hg.PerExample("w", 1.0, n=n)]),
                           MiniBatches(x, y, batch_size=4), 3,
                           lambda m, hp: F.cross_entropy(m(x), y))


@pytest.mark.parametrize("n", [4, 10])
def test_per_example_size_must_match_the_data(n: int) -> None:
    p = _per_example_problem(n)
    with pytest.raises(ValueError, match=rf"PerExample\('w'\) has n={n}, but the training data "
                                         rf"has 8 examples.*n=8"):
        hg.ForwardMode().hypergradient(p, p.init_raw())
    # indices beyond n in a batch of another kind (a list of (x, y, idx) batches)
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    q = hg.InnerProblem(nn.Linear(4, 3).double(), lambda m, b, hp: hp["w"][b[2]].mean(),
                        hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", 1.0, n=4)]),
                        [(x, y, torch.arange(8))], 2, lambda m, hp: F.cross_entropy(m(x), y))
    with pytest.raises(ValueError, match=r"the first mini-batch indexes example 7"):
        hg.ReverseMode().hypergradient(q, q.init_raw())



def test_a_negative_example_index_is_refused() -> None:
    """-1 (a data pipeline's padding) read weight n - 1, another example's: that example got
    the padded one's hypergradient, without an error (found by the hyperparameter review)."""
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    q = hg.InnerProblem(nn.Linear(4, 3).double(),
                        lambda m, b, hp: (hp["w"][b[2]] * F.cross_entropy(
                            m(b[0]), b[1], reduction="none")).mean(),
                        hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", 1.0, n=8)]),
                        [(x[:4], y[:4], torch.tensor([-1, 1, 2, 3]))], 2,
                        lambda m, hp: F.cross_entropy(m(x), y))
    with pytest.raises(ValueError, match=r"indices include -1; a negative index reads weight "
                                         r"n \+ index.*\[0, 8\)"):
        hg.ForwardMode().hypergradient(q, q.init_raw())


def test_example_indices_of_shape_batch_by_1_are_refused() -> None:
    """A Dataset returning torch.tensor([i]) as the index: the DataLoader stacks them to
    (B, 1), hp['w'][idx] * a (B,) loss broadcasts to (B, B), and every weight scaled the whole
    batch's loss: a hypergradient 86 % off, without a word (the per-example probe,
    2026-12-08)."""
    from torch.utils.data import DataLoader, Dataset

    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))

    class Wrapped(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> Any:
            return x[i], y[i], torch.tensor([i])

    q = hg.InnerProblem(nn.Linear(4, 3).double(),
                        lambda m, b, hp: (hp["w"][b[2]] * F.cross_entropy(
                            m(b[0]), b[1], reduction="none")).mean(),
                        hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", 1.0, n=8)]),
                        DataLoader(Wrapped(), batch_size=4), 2,
                        lambda m, hp: F.cross_entropy(m(x), y))
    with pytest.raises(ValueError, match=r"PerExample\('w'\): the first mini-batch's example "
                                         r"indices have shape \(4, 1\), not \(batch,\)"):
        hg.ForwardMode().hypergradient(q, q.init_raw())


@pytest.mark.parametrize("bad, match", [
    (8, r"PerExample\('w'\) has n=8, but the mini-batch of step 1 indexes example 8"),
    (-2, r"the example indices of the mini-batch of step 1 include -2")])
def test_example_indices_of_a_later_batch_are_checked(bad: int, match: str) -> None:
    """Only the first batch was checked: a later batch indexing past n failed as torch's bare
    IndexError at that step, and a negative index read another example's weight silently
    (the per-example data probe)."""
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    batches = [(x[:4], y[:4], torch.arange(4)), (x[4:], y[4:], torch.tensor([4, 5, 6, bad]))]
    q = hg.InnerProblem(nn.Linear(4, 3).double(),
                        lambda m, b, hp: (hp["w"][b[2]] * F.cross_entropy(
                            m(b[0]), b[1], reduction="none")).mean(),
                        hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", 1.0, n=8)]),
                        batches, 2, lambda m, hp: F.cross_entropy(m(x), y))
    for method in (hg.ForwardMode(), hg.ReverseMode()):
        with pytest.raises(ValueError, match=match):
            method.hypergradient(q, q.init_raw())


@pytest.mark.parametrize("bad, match", [
    (-1, r"the example indices of the mini-batch of step 1 include -1"),
    (8, r"PerExample\('w'\) has n=8, but the mini-batch of step 1 indexes example 8")])
def test_example_indices_of_a_dict_batch_are_checked(bad: int, match: str) -> None:
    """Dict batches (a collate_fn returning {"x", "y", "idx"}) were not checked: a negative
    index read another example's weight without an error, one past the end failed as torch's
    bare IndexError (the DataLoader probe)."""
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    batches = [{"x": x[:4], "y": y[:4], "idx": torch.arange(4)},
               {"x": x[4:], "y": y[4:], "idx": torch.tensor([4, 5, 6, bad])}]
    q = hg.InnerProblem(nn.Linear(4, 3).double(),
                        lambda m, b, hp: (hp["w"][b["idx"]] * F.cross_entropy(
                            m(b["x"]), b["y"], reduction="none")).mean(),
                        hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", 1.0, n=8)]),
                        batches, 2, lambda m, hp: F.cross_entropy(m(x), y))
    with pytest.raises(ValueError, match=match):
        hg.ForwardMode().hypergradient(q, q.init_raw())
    batches[1]["idx"] = torch.tensor([4, 5, 6, 7])
    hg.ForwardMode().hypergradient(q, q.init_raw())


def test_a_generator_function_as_batches_is_named() -> None:
    """A generator function is callable, so it was read as t -> batch: ``gen()`` failed with
    "takes 0 positional arguments but 1 was given", and ``gen(epochs=3)`` handed the loss a
    generator ("'generator' object is not subscriptable"; the DataLoader probe)."""
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))

    def gen(epochs: int = 3) -> Any:
        for _ in range(epochs):
            yield x, y

    def build(batches: Any) -> hg.InnerProblem:
        return hg.InnerProblem(nn.Linear(4, 3).double(),
                               lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                               hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1)]),
                               batches, 2, lambda m, hp: F.cross_entropy(m(x), y))

    with pytest.raises(ValueError, match=r"batches is a generator function \(gen\): .*an object "
                                         r"whose __iter__ returns gen\(\)"):
        build(gen)
    q = build(lambda t: gen())  # a callable returning a generator: named at the first batch
    with pytest.raises(TypeError, match=r"the mini-batch of step 0 is a generator, an iterator: "
                                        r"a callable batches must return step t's mini-batch"):
        hg.ForwardMode().hypergradient(q, q.init_raw())


def test_a_batch_source_shorter_than_the_horizon() -> None:
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    gen = ((x, y) for _ in range(3))
    with pytest.raises(ValueError, match=r"batches is a one-shot iterator \(generator\).*a "
                                         r"list of batches"):
        hg.InnerProblem(nn.Linear(4, 3).double(), lambda m, b, hp: m(b[0]).sum(),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1)]), gen, 5,
                        lambda m, hp: m(x).sum())
    with pytest.raises(ValueError, match="one-shot iterator"):
        _problem_with_batches(iter([]), 2)

    class Once:  # a re-iterable in name only: its second iter() yields nothing
        def __init__(self) -> None:
            self.left = [{"x": x, "y": y}] * 3

        def __iter__(self):  # type: ignore[no-untyped-def]
            while self.left:
                yield self.left.pop()

    p = _problem_with_batches(Once(), 5)  # the checks read two of the 3 (batch 0 twice)
    with pytest.raises(ValueError, match=r"ran out after 1 mini-batches of this pass and "
                                         r"iterating it again gave none.*a list of batches"):
        hg.ForwardMode().hypergradient(p, p.init_raw())

    class Empty:
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([])

    p = _problem_with_batches(Empty(), 2)
    with pytest.raises(ValueError, match="batches yielded no mini-batch"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def _problem_with_batches(batches: Any, steps: int) -> hg.InnerProblem:
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    return hg.InnerProblem(nn.Linear(4, 3).double(),
                           lambda m, b, hp: F.cross_entropy(m(b["x"]), b["y"]),
                           hg.optim.sgd(lr="lr"),
                           hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")]), batches,
                           steps, lambda m, hp: F.cross_entropy(m(x), y))


@pytest.mark.parametrize("method", [hg.ForwardMode(), hg.ReverseMode()], ids=["fwd", "rev"])
def test_an_empty_mini_batch_is_named(method: hg.Method) -> None:
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))

    def batch(t: int) -> dict[str, torch.Tensor]:  # step 2 gets no examples
        return {"x": x[:0], "y": y[:0]} if t == 2 else {"x": x, "y": y}

    p = _problem_with_batches(batch, 4)
    with pytest.raises(ValueError, match=r"the mini-batch of step 2 is empty: its tensor 0 has "
                                         r"shape \(0, 4\)"):
        method.hypergradient(p, p.init_raw())


def test_nan_targets_loaded_from_disk(tmp_path: Any) -> None:
    import numpy as np
    import scipy.sparse

    from hypergrad.tasks.sparse_regression import sparse_regression_task

    a = scipy.sparse.random(20, 6, density=0.5, format="csr", random_state=0)
    scipy.sparse.save_npz(tmp_path / "a.npz", a)
    y = np.ones(20)
    y[[3, 11]] = np.nan
    np.save(tmp_path / "a_y.npy", y)
    hps = hg.HyperParams([hg.Array("res_w", 0.5, shape=(2,), transform="logit"),
                          hg.Array("l2", 1e-3, shape=(2,), transform="log")])
    with pytest.raises(ValueError, match=r"a_y.npy has 2 non-finite targets .*rows \[3, 11\]"):
        sparse_regression_task(hps, hg.optim.sgd(lr=0.1), data_path=str(tmp_path / "a.npz"),
                               groups=2, feature_groups=2)


def test_per_example_weights_indexed_by_labels_are_named_as_a_possible_cause() -> None:
    """A DataLoader of (x, y) without example indices and a loss reading b[-1]: the labels
    0..2 were read as example indices, 3 of 48 weights learned, and the warning blamed the
    shuffle (the per-example probe, 2026-12-08)."""
    import warnings

    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (48,),
                                                                                generator=g)
    torch.manual_seed(0)
    q = hg.InnerProblem(nn.Linear(4, 3).double(),
                        lambda m, b, hp: (hp["w"][b[-1]] * F.cross_entropy(
                            m(b[0]), b[1], reduction="none")).mean(),
                        hg.optim.sgd(lr=0.1), hg.HyperParams([hg.PerExample("w", 0.5, n=48,
                                                                            transform="logit")]),
                        DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True), 6,
                        lambda m, hp: F.cross_entropy(m(x), y))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        hg.Trainer(q, "reverse", mode=hg.Offline(outer_steps=1, start=0, recheck=0),
                   callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    told = [str(w.message) for w in said if "of PerExample 'w' have a hypergradient of "
            "exactly 0" in str(w.message)]
    assert len(told) == 1, [str(w.message)[:100] for w in said]
    assert ("Only 3 entries were read where the run's 6 batches of 8 hold 48 examples: does "
            "the loss index 'w' by each example's index") in told[0]
