"""Issue 23, the engine half: no silent wrong result on common models and inputs.

Each case ends in a correct result or a clear error raised up front (at construction or in
``InnerProblem.check``), naming the argument, the value and the fix. Models that change their
weights or buffers in forward: test_parametrizations.py.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.optim import adagrad, rmsprop

# -- group 3: inner optimizer constants -----------------------------------------------------------
NAN = math.nan
BAD_CONSTANTS = [
    # (factory, argument, bad value, the words of the message)
    (hg.optim.sgd, "lr", -0.1, "> 0"), (hg.optim.sgd, "lr", 0.0, "> 0"),
    (hg.optim.sgd, "lr", NAN, "> 0"),
    (hg.optim.sgd, "lr", math.inf, "> 0"),
    (hg.optim.sgd, "momentum", 1.0, r"in \[0, 1\)"),
    (hg.optim.sgd, "momentum", -0.5, r"in \[0, 1\)"),
    (hg.optim.sgd, "momentum", NAN, r"in \[0, 1\)"),
    (hg.optim.sgd, "dampening", 1.5, r"in \[0, 1\)"), (hg.optim.sgd, "weight_decay", -1e-4, ">= 0"),
    (hg.optim.sgd, "weight_decay", NAN, ">= 0"),
    (hg.optim.adam, "lr", -1e-3, "> 0"), (hg.optim.adam, "eps", 0.0, "> 0"),
    (hg.optim.adam, "eps", -1e-8, "> 0"),
    (hg.optim.adam, "weight_decay", -0.1, ">= 0"),
    (hg.optim.adamw, "lr", 0, "> 0"), (hg.optim.adamw, "eps", NAN, "> 0"),
    (hg.optim.adamw, "weight_decay", -1, ">= 0"),
    (rmsprop, "lr", -1e-2, "> 0"), (rmsprop, "alpha", 1.0, r"in \[0, 1\)"),
    (rmsprop, "alpha", -0.1, r"in \[0, 1\)"), (rmsprop, "eps", 0.0, "> 0"),
    (rmsprop, "momentum", 1.2, r"in \[0, 1\)"), (rmsprop, "weight_decay", -1.0, ">= 0"),
    (adagrad, "lr", -1.0, "> 0"), (adagrad, "lr_decay", -0.1, ">= 0"),
    (adagrad, "eps", 0.0, "> 0"), (adagrad, "weight_decay", NAN, ">= 0"),
]


@pytest.mark.parametrize(("factory", "arg", "bad", "words"), BAD_CONSTANTS,
                         ids=[f"{f.__name__}-{a}={b}" for f, a, b, _ in BAD_CONSTANTS])
def test_a_bad_optimizer_constant_is_refused_at_construction(factory: Any, arg: str, bad: float,
                                                              words: str) -> None:
    api = factory.__name__
    kw: dict[str, Any] = {"lr": 0.1} if arg != "lr" else {}
    with pytest.raises(ValueError, match=rf"^{api}: {arg}={bad!r} must be a number {words} \(or "
                                         rf"the name of a hyperparameter\), e.g. {arg}="):
        factory(**kw, **{arg: bad})


def test_the_message_of_a_negative_learning_rate() -> None:
    with pytest.raises(ValueError) as info:
        hg.optim.sgd(lr=-0.1)
    assert str(info.value) == ("sgd: lr=-0.1 must be a number > 0 (or the name of a "
                               "hyperparameter), e.g. lr=0.1.")


@pytest.mark.parametrize("betas", [(1.0, 0.999), (0.9, 1.0), (-0.1, 0.9), (0.9, NAN)])
def test_adam_betas_must_lie_in_the_unit_interval(betas: tuple[float, float]) -> None:
    i = 0 if not 0 <= betas[0] < 1 else 1
    for factory in (hg.optim.adam, hg.optim.adamw):
        with pytest.raises(ValueError, match=rf"{factory.__name__}: betas\[{i}\]=.* must be a "
                                             rf"number in \[0, 1\).*e.g. betas=\(0.9, 0.999\)"):
            factory(betas=betas)


def test_options_are_checked_too() -> None:
    with pytest.raises(ValueError, match=r"adam: eps_root=-1e-08 must be a number >= 0"):
        hg.optim.adam(eps_root=-1e-8)
    with pytest.raises(ValueError, match=r"adagrad: initial_accumulator_value=nan must be"):
        adagrad(initial_accumulator_value=NAN)


def test_valid_constants_and_hyperparameter_names_pass() -> None:
    hg.optim.sgd(lr=1, momentum=0.0, dampening=0.0, weight_decay=0)  # ints, edges of the domains
    hg.optim.sgd(lr="lr", momentum="mom", dampening="damp", weight_decay="wd")  # names: not checked
    hg.optim.adam(lr="lr", betas=(0.0, "b2"), eps=1e-12, weight_decay=0.0)
    hg.optim.adamw(betas=("b1", 0.5))
    rmsprop(alpha=0.0, momentum=0.99, centered=True)
    adagrad(lr_decay=0.0, initial_accumulator_value=0.1)


# -- shared problem -------------------------------------------------------------------------------
D = torch.float64


def _data(n: int = 16, dtype: torch.dtype = D) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


def _problem(hps: list[Any] | None = None, opt: Any = None, steps: int = 3,
             train_loss: Any = None, val_loss: Any = None, batches: Any = None,
             model: nn.Module | None = None) -> hg.InnerProblem:
    x, y = _data()

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    def vl(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    torch.manual_seed(0)
    return hg.InnerProblem(model or nn.Linear(4, 3).double(), train_loss or tl,
                           opt or hg.optim.sgd(lr="lr"),
                           hg.HyperParams(hps or [hg.Scalar("lr", 0.1, transform="log")]),
                           batches or [(x[:8], y[:8]), (x[8:], y[8:])], steps, val_loss or vl)


def _check(p: hg.InnerProblem) -> None:
    p.check(p.init_raw())


# -- group 1 (a): schedule windows no step reads --------------------------------------------------
def test_schedule_windows_after_the_last_step_are_refused() -> None:
    p = _problem([hg.Schedule("lr", 0.1, windows=8, transform="log")], steps=4)
    with pytest.raises(ValueError) as info:
        hg.ForwardMode().hypergradient(p, p.init_raw())
    assert str(info.value) == (
        "InnerProblem: Schedule('lr') has windows=8 but steps=4: windows [1, 3, 5, 7] are read "
        "by no step (step t reads window t * 8 // 4), so their hypergradients stay zero and "
        "tuning would report them as learned. Use windows <= steps, e.g. Schedule('lr', ..., "
        "windows=4), or more steps.")


def test_a_val_loss_that_looks_a_schedule_up_and_uses_nothing_of_it_is_no_excuse() -> None:
    """val_loss doing `hp["lr"]` without using the value let windows no step reads through:
    their hypergradients were exactly 0, and the Trainer returned them moved (0.05 to 0.59) by
    the schedule's smoothing, as learned (the kinds probe, 2026-12-07)."""
    x, y = _data()

    def val(m: Any, hp: Any) -> torch.Tensor:
        hp["lr"]  # looked up, not used
        return F.cross_entropy(m(x), y)

    p = _problem([hg.Schedule("lr", 0.1, windows=8, transform="log")], steps=4, val_loss=val)
    with pytest.raises(ValueError, match=r"windows=8 but steps=4: windows \[1, 3, 5, 7\] are "
                                         r"read by no step"):
        _check(p)


def test_a_schedule_the_training_loss_reads_is_checked_too() -> None:
    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]) * hp["temp"], b[1])

    p = _problem([hg.Scalar("lr", 0.1), hg.Schedule("temp", 1.0, windows=5)], steps=3,
                 train_loss=tl)
    with pytest.raises(ValueError, match=r"Schedule\('temp'\) has windows=5 but steps=3: "
                                         r"windows \[2, 4\] are read by no step"):
        _check(p)


def test_schedules_whose_windows_all_act_pass() -> None:
    _check(_problem([hg.Schedule("lr", 0.1, windows=4, transform="log")], steps=4))
    _check(_problem([hg.Schedule("lr", 0.1, windows=3, transform="log")], steps=7))
    x, y = _data()

    def vl(m: Any, hp: Any) -> torch.Tensor:  # val_loss reads the whole schedule
        return F.cross_entropy(m(x), y) + 1e-3 * hp["lr"].sum()

    _check(_problem([hg.Schedule("lr", 0.1, windows=8, transform="log")], steps=4, val_loss=vl))


# -- group 1 (b), (c): per-example weights and hyperparameters bound to nothing ------------------
def _per_example(read: str) -> hg.InnerProblem:
    from hypergrad.data import MiniBatches

    x, y = _data()

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        losses = F.cross_entropy(m(b[0]), b[1], reduction="none")
        if read == "indexed":
            return (hp["w"][b[2]] * losses).mean()
        if read == "by_name_only":
            hp["w"]  # read, never used
        elif read == "detached":
            return (hp["w"][b[2]].detach() * losses).mean()
        return losses.mean()

    return hg.InnerProblem(nn.Linear(4, 3).double(), tl, hg.optim.sgd(lr=0.1),
                           hg.HyperParams([hg.PerExample("w", 1.0, n=16)]),
                           MiniBatches(x, y, batch_size=8), 3,
                           lambda m, hp: F.cross_entropy(m(x), y))


def test_per_example_weights_the_loss_never_reads_are_refused() -> None:
    with pytest.raises(ValueError, match=r"hyperparameters \['w'\] are bound to nothing"):
        _check(_per_example("not_at_all"))
    with pytest.raises(ValueError, match=r"hyperparameter 'w' is read by train_loss, but one "
                                         r"of .* cuts it from the autograd graph"):
        _check(_per_example("by_name_only"))
    with pytest.raises(ValueError, match=r"'w' is read by train_loss, but .detach\(\) in "
                                         r"train_loss cuts it from the autograd graph"):
        _check(_per_example("detached"))
    _check(_per_example("indexed"))


def test_a_hyperparameter_bound_to_nothing_is_named() -> None:
    p = _problem([hg.Scalar("lr", 0.1, transform="log"), hg.Scalar("unused", 1.0)])
    with pytest.raises(ValueError, match=r"\['unused'\] are bound to nothing"):
        _check(p)


def test_an_initial_value_outside_the_transform_is_refused() -> None:
    with pytest.raises(ValueError, match=r"init=0.0 is outside the domain of transform='log'"):
        _problem([hg.Scalar("lr", 0.0, transform="log")]).init_raw()


# -- group 1 (d): user code that cuts the graph ---------------------------------------------------
def _no_grad_double(v: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return v * 2


CUTS: dict[str, tuple[Any, str]] = {
    "item": (lambda v: v.item(), r"\.item\(\)"),
    "float": (lambda v: float(v), r"float\(\)"),
    "detach": (lambda v: v.detach(), r"\.detach\(\)"),
    "data": (lambda v: v.data, r"\.data"),
    "no_grad": (_no_grad_double, r"torch\.no_grad\(\) \(around mul\)"),
    "numpy": (lambda v: torch.as_tensor(np.exp(v.detach().numpy())), r"\.detach\(\)"),
    "where": (lambda v: torch.where(v > 0, 1.0, 0.0),
              r"a comparison \(gt: a Python if, min\(\) or max\(\) against a number, a "
              r"torch.where condition; it has no derivative\)"),
    "min": (lambda v: torch.as_tensor(min(v, 0.05)),
            r"a comparison \((gt|lt): a Python if, min\(\) or max\(\) against a number, a "
            r"torch.where condition; it has no derivative\)"),
}


@pytest.mark.parametrize("where", ["train_loss", "val_loss"])
@pytest.mark.parametrize("cause", CUTS)
def test_a_hyperparameter_cut_from_the_graph_is_named_with_its_cause(cause: str,
                                                                      where: str) -> None:
    use, words = CUTS[cause]
    x, y = _data()

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        out = F.cross_entropy(m(b[0]), b[1])
        return out * (1 + use(hp["scale"])) if where == "train_loss" else out

    def vl(m: Any, hp: Any) -> torch.Tensor:
        out = F.cross_entropy(m(x), y)
        return out * (1 + use(hp["scale"])) if where == "val_loss" else out

    p = _problem([hg.Scalar("lr", 0.1, transform="log"), hg.Scalar("scale", 0.5)],
                 train_loss=tl, val_loss=vl)
    with pytest.raises(ValueError, match=rf"^InnerProblem: hyperparameter 'scale' is read by "
                                         rf"{where}, but {words} in {where} cuts it from the "
                                         rf"autograd graph, so its hypergradient is "
                                         rf"structurally zero"):
        hg.ReverseMode().hypergradient(p, p.init_raw())


@pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning")
def test_a_hyperparameter_given_to_numpy_is_named() -> None:
    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1]) * float(np.exp(hp["scale"]))

    p = _problem([hg.Scalar("lr", 0.1, transform="log"), hg.Scalar("scale", 0.5)],
                 train_loss=tl)
    with pytest.raises(ValueError, match=r"train_loss passes hyperparameter 'scale' to numpy, "
                                         r"which fails on a tensor that hypergrad "
                                         r"differentiates"):
        _check(p)


@pytest.mark.parametrize("use", [lambda v: 0 * v, torch.round, lambda v: torch.relu(v - 0.5)],
                         ids=["times0", "round", "relu_at_0"])
def test_a_numerically_zero_derivative_is_not_a_cut(use: Any) -> None:
    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1]) * (1 + use(hp["scale"]))

    _check(_problem([hg.Scalar("lr", 0.1, transform="log"), hg.Scalar("scale", 0.5)],
                    train_loss=tl))


# torch functions that take a number where a hyperparameter is given, or have no derivative
NO_DERIVATIVE: dict[str, tuple[Any, str]] = {
    "label_smoothing": (lambda o, y, s: F.cross_entropy(o, y, label_smoothing=s),
                        r"torch's cross_entropy_loss .* argument 'label_smoothing', and torch "
                        r"takes a Python number there.*\(1 - s\) \* F.cross_entropy"),
    "dropout": (lambda o, y, s: F.cross_entropy(F.dropout(o, p=s), y),
                r"torch's dropout .* argument 'p'.*There is no way to differentiate it: a "
                r"dropout mask's draws"),
    # the generic advice ("compute the loss with reduction='none'") for an attention dropout
    # rate (the sequence-models probe, 2026-12-07)
    "attention_dropout": (lambda o, y, s: F.cross_entropy(F.scaled_dot_product_attention(
        o[None, None], o[None, None], o[None, None], dropout_p=s)[0, 0], y),
        r"torch's scaled_dot_product_attention .* argument 'dropout_p'.*There is no way to "
        r"differentiate it: a dropout mask's draws do not move smoothly with dropout_p"),
    "leaky_relu": (lambda o, y, s: F.cross_entropy(F.leaky_relu(o, negative_slope=s), y),
                   r"torch's leaky_relu .*argument 'negative_slope'.*"
                   r"torch.where\(x >= 0, x, slope \* x\)"),
    "class_weights": (lambda o, y, s: F.cross_entropy(o, y, weight=s * torch.ones(3, dtype=D)),
                      r"torch's nll_loss_forward .* argument 'weight', and torch has no "
                      r"derivative in it.*w = hp\['class_weights'\]\[y\]"),
}


@pytest.mark.parametrize("use", NO_DERIVATIVE)
def test_a_torch_argument_without_a_derivative_is_named_with_the_operation_written_out(
        use: str) -> None:
    """torch's own TypeError (``must be float, not Tensor``) or RuntimeError (``not
    differentiable with respect to argument 'weight'``) came with a note about the data's
    shapes (the losses probe)."""
    loss, words = NO_DERIVATIVE[use]
    p = _problem([hg.Scalar("lr", 0.1, transform="log"), hg.Scalar("s", 0.1)],
                 train_loss=lambda m, b, hp: loss(m(b[0]), b[1], hp["s"]))
    with pytest.raises(ValueError, match=r"^InnerProblem: train_loss gives " + words):
        _check(p)


def test_the_written_out_operations_are_torchs() -> None:
    """Each operation the refusal above writes out equals torch's own at a number."""
    from hypergrad.problem import _WRITTEN_OUT

    g = torch.Generator().manual_seed(0)
    out, x2 = torch.randn(6, 3, generator=g, dtype=D), torch.randn(6, 3, generator=g, dtype=D)
    y, t = torch.randint(0, 3, (6,), generator=g), torch.rand(6, 3, generator=g, dtype=D)
    s = slope = alpha = beta = delta = margin = 0.3
    x, z, pred, target, x1, p = out, out, out, x2, out[:, 0], out.sigmoid()
    sign = torch.tensor([1.0, -1, 1, 1, -1, -1], dtype=D)
    w3 = torch.tensor([0.5, 2.0, 1.5], dtype=D)
    hp = {"class_weights": w3}
    pos_weight, w = w3, w3
    expected = {
        "label_smoothing": F.cross_entropy(out, y, label_smoothing=s),
        "negative_slope": F.leaky_relu(x, slope), "alpha": F.elu(x, alpha),
        "softplus": F.softplus(x, beta), "delta": F.huber_loss(pred, target, delta=delta),
        "smooth_l1_loss": F.smooth_l1_loss(pred, target, beta=beta),
        "margin": F.margin_ranking_loss(x1, x2[:, 0], sign, margin=margin),
        "nll_loss_forward": F.cross_entropy(out, y, weight=w3),
        "pos_weight": F.binary_cross_entropy_with_logits(z, t, pos_weight=w3),
        "binary_cross_entropy": F.binary_cross_entropy(p, t, weight=w3),
    }
    checked = 0
    for (fn, arg), code in _WRITTEN_OUT.items():
        if code.startswith("none"):
            continue
        names = {"x": x, "out": out, "y": y, "t": sign if fn == "margin_ranking_loss" else t,
                 "z": z, "pred": pred, "target": target, "x1": x1, "x2": x2[:, 0], "p": p,
                 "s": s, "slope": slope, "alpha": alpha, "beta": beta, "delta": delta,
                 "margin": margin, "hp": hp, "pos_weight": pos_weight, "w": w, "F": F,
                 "torch": torch}
        *pre, last = code.split("; ")
        for stmt in pre:
            exec(stmt, names)  # noqa: S102 - the message's own code
        got = eval(last, names)  # noqa: S307
        key = fn if fn in expected else arg
        torch.testing.assert_close(got, expected[key], rtol=1e-12, atol=1e-12, msg=fn)
        checked += 1
    assert checked == len(expected)


def test_a_hyperparameter_bound_to_the_optimizer_may_be_read_as_a_number() -> None:
    logged: list[float] = []

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        logged.append(hp["lr"].item())
        return F.cross_entropy(m(b[0]), b[1])

    _check(_problem(train_loss=tl))
    assert logged


# -- group 4: data problems named as data problems ------------------------------------------------
def test_nan_in_the_training_data_is_named_before_training() -> None:
    from hypergrad.data import MiniBatches

    x, y = _data()
    x[13, 2] = math.nan  # not in the first mini-batch of the unshuffled data
    p = _problem(batches=MiniBatches(x, y, batch_size=8, shuffle=False))
    with pytest.raises(ValueError) as info:
        hg.ForwardMode().hypergradient(p, p.init_raw())
    assert str(info.value).startswith(
        "InnerProblem: the training data has non-finite values: MiniBatches tensor 0 (shape "
        "(16, 4)) has 1 NaN and 0 inf entry (the first at index (13, 2)). A NaN or inf input "
        "makes the losses and every hypergradient NaN, which would look like a diverging "
        "learning rate. Clean the data")


def test_inf_in_a_later_batch_of_a_list_is_named() -> None:
    x, y = _data()
    x[9, 0] = -math.inf
    p = _problem(batches=[(x[:8], y[:8]), (x[8:], y[8:])])
    with pytest.raises(ValueError, match=r"tensor 0 of mini-batch 1 \(shape \(8, 4\)\) has 0 NaN "
                                         r"and 1 inf entry \(the first at index \(1, 0\)\)"):
        _check(p)


def test_nan_in_the_first_batch_of_a_callable_is_named() -> None:
    x, y = _data()
    x[0, 0] = math.nan
    p = _problem(batches=lambda t: (x, y))
    with pytest.raises(ValueError, match=r"tensor 0 of mini-batch 0 \(shape \(16, 4\)\) has 1 "
                                         r"NaN"):
        _check(p)


@pytest.mark.parametrize("source", ["callable", "dataloader"])
def test_nan_in_a_later_batch_read_lazily_is_named_when_training_fails(source: str) -> None:
    """A stream or a callable is checked at batch 0 only (its other batches are read as the
    steps ask); a NaN in a later one made the Trainer blame the learning rate ("the initial
    hyperparameters already diverge ... a smaller learning rate"). Now, when nothing ever
    trained finitely, the Trainer reads a pass and names the batch and the entry."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _data()
    x[13, 2] = math.nan  # in mini-batch 1 of 8
    batches = (DataLoader(TensorDataset(x, y), batch_size=8) if source == "dataloader" else
               (lambda t: (x[8 * (t % 2):8 * (t % 2) + 8], y[8 * (t % 2):8 * (t % 2) + 8])))
    p = _problem(batches=batches)
    _check(p)  # batch 0 is clean
    r = hg.Trainer(p, "forward", callbacks=[hg.run.Log(None), hg.run.Progress(False)],
                   mode=hg.Offline(outer_steps=2)).fit()
    assert r.diverged and r.message is not None
    assert ("the training data is not finite: tensor 0 of mini-batch 1 (shape (8, 4)) has 1 NaN "
            "and 0 inf entry (the first at index (5, 2)). That is a data problem, not a "
            "learning rate") in r.message
    assert "smaller learning rate" not in r.message
    assert p.non_finite_batch() == ("tensor 0 of mini-batch 1 (shape (8, 4)) has 1 NaN and 0 "
                                    "inf entry (the first at index (5, 2))")
    x[13, 2] = 0.0
    assert p.non_finite_batch() == ""


def test_nan_in_the_validation_data_is_named() -> None:
    x_val, y_val = _data(10)
    x_val[[2, 5], 1] = math.nan

    def vl(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(x_val), y_val)

    p = _problem(val_loss=vl)
    with pytest.raises(ValueError, match=r"val_loss is nan at the initial weights \(the weights "
                                         r"are finite\): 'x_val' \(which val_loss closes over\) "
                                         r"\(shape \(10, 4\)\) has 2 NaN and 0 inf entries.*data "
                                         r"problem, not a learning rate"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_nan_in_data_a_training_loss_indexes_is_named() -> None:
    X, Y = _data()
    X[3, 3] = math.nan

    def tl(m: Any, idx: Any, hp: Any) -> torch.Tensor:  # batches are example indices
        return F.cross_entropy(m(X[idx]), Y[idx])

    p = _problem(train_loss=tl, batches=[torch.arange(8), torch.arange(8, 16)])
    with pytest.raises(ValueError, match=r"train_loss is nan at step 0 .*'X' \(which train_loss "
                                         r"closes over\) \(shape \(16, 4\)\) has 1 NaN"):
        _check(p)


def test_a_loss_that_is_nan_by_itself_is_named() -> None:
    def vl(m: Any, hp: Any) -> torch.Tensor:
        return torch.log(torch.zeros((), dtype=D)) * 0

    p = _problem(val_loss=vl)
    with pytest.raises(ValueError, match=r"val_loss is nan at the initial weights, with finite "
                                         r"weights and hyperparameters \{'lr': 0.1\d*\}: the loss "
                                         r"itself"):
        _check(p)


def _no_grad_val(m: Any, hp: Any) -> torch.Tensor:
    x, y = _data()
    with torch.no_grad():  # evaluation code's habit
        return F.cross_entropy(m(x), y)


@pytest.mark.parametrize("cut", [
    _no_grad_val,
    lambda m, hp: F.cross_entropy(m(_data()[0]).detach(), _data()[1]),
    lambda m, hp: torch.tensor(F.cross_entropy(m(_data()[0]), _data()[1]).item(), dtype=D),
], ids=["no_grad", "detach", "item"])
def test_a_validation_loss_cut_from_the_weights_is_refused(cut: Any) -> None:
    # every hypergradient would be exactly zero; it was a ZeroHypergradientWarning blaming the
    # hyperparameters (0 * hp, round(hp)) after the first costly hypergradient
    p = _problem(val_loss=cut)
    with pytest.raises(ValueError, match=r"val_loss does not depend on the model's weights: .*"
                                         r"torch.no_grad\(\), .detach\(\), .item\(\)"):
        _check(p)
    with pytest.raises(ValueError, match=r"val_loss does not depend on the model's weights"):
        hg.Trainer(p, mode=hg.Offline(outer_steps=1)).fit()


def test_a_training_loss_cut_from_the_weights_is_refused() -> None:
    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]).detach(), b[1])

    with pytest.raises(ValueError, match=r"train_loss does not depend on the model's weights: "
                                         r".*the inner optimizer would not train the model"):
        _check(_problem(train_loss=tl))


@pytest.mark.parametrize(("given", "says"), [
    ("sgd_instance", r"got torch.optim.SGD: use hypergrad.optim.sgd\(lr='lr', momentum=0.9, "
                     r"weight_decay=0.0005\) \(its arguments constants or the names of "
                     r"hyperparameters to tune"),
    ("adamw_class", r"got the class torch.optim.AdamW: use hypergrad.optim.adamw\(lr='lr'\)"),
    ("adam_name", r"got 'adam': use hypergrad.optim.adam\(lr='lr'\)"),
    ("other", r"got int\.$"),
])
def test_a_torch_optimizer_given_as_the_inner_optimizer_is_translated(given: str,
                                                                       says: str) -> None:
    net = nn.Linear(4, 3).double()
    opt = {"sgd_instance": torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9,
                                           weight_decay=5e-4),
           "adamw_class": torch.optim.AdamW, "adam_name": "adam", "other": 3}[given]
    with pytest.raises(TypeError, match=r"optimizer must come from hypergrad.optim .*" + says):
        _problem(opt=opt)


def test_nan_initial_weights_are_named() -> None:
    model = nn.Linear(4, 3).double()
    with torch.no_grad():
        model.bias[1] = math.nan
    p = _problem(model=model)
    with pytest.raises(ValueError, match=r"initial parameter 'bias' has 1 NaN and 0 inf entry"):
        _check(p)


@pytest.mark.parametrize(("model_dtype", "data_dtype", "fix"), [
    (torch.float32, torch.float64, r"model.double\(\), or the data, x.float\(\)"),
    (torch.float64, torch.float32, r"model.float\(\), or the data, x.double\(\)"),
])
def test_a_model_and_data_of_different_dtypes_get_one_clear_error(
        model_dtype: torch.dtype, data_dtype: torch.dtype, fix: str) -> None:
    x, y = _data(dtype=data_dtype)
    p = _problem(model=nn.Linear(4, 3).to(model_dtype), batches=[(x, y)],
                 val_loss=lambda m, hp: F.cross_entropy(m(x.to(model_dtype)), y))
    with pytest.raises(TypeError, match=rf"^InnerProblem: the model is {model_dtype} but tensor 0 "
                                        rf"of mini-batch 0 is {data_dtype} \(shape \(16, 4\)\), "
                                        rf"and torch cannot mix them in train_loss .*{fix}"):
        p.check(p.init_raw())


def test_data_whose_features_do_not_fit_the_model_get_a_note_of_the_shapes() -> None:
    """Torch's ``mat1 and mat2 shapes cannot be multiplied (16x6 and 4x3)`` names neither the
    data nor the model: the error keeps its type and message, and a note gives mini-batch 0's
    shapes and dtypes and the model's first parameters. An error hypergrad raises itself gets
    no note (its message says what it is)."""
    x, y = _data()
    wide = torch.cat([x, x[:, :2]], dim=1)
    p = _problem(batches=[(wide, y)])
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as err:
        p.check(p.init_raw())
    note = "\n".join(getattr(err.value, "__notes__", []))
    assert "raised by train_loss at its first call" in note
    assert "tensor 0 of mini-batch 0: (16, 6) float64" in note and "weight (3, 4)" in note
    bad_labels = _problem(batches=[(x, y + 5)])
    with pytest.raises(IndexError, match="out of bounds") as err:
        bad_labels.check(bad_labels.init_raw())
    assert "tensor 1 of mini-batch 0: (16,) int64" in "\n".join(err.value.__notes__)
    from hypergrad.data import MiniBatches

    own = _problem(train_loss=lambda m, b, hp: MiniBatches(b[0], batch_size=0)(0)[0].sum())
    with pytest.raises(ValueError, match="batch_size=0 must be an int >= 1") as err:
        own.check(own.init_raw())  # raised inside hypergrad: no note
    assert not getattr(err.value, "__notes__", [])


def test_validation_data_of_another_dtype_is_named() -> None:
    x32, y = _data(dtype=torch.float32)
    p = _problem(val_loss=lambda m, hp: F.cross_entropy(m(x32), y))
    with pytest.raises(TypeError, match=r"the model is torch.float64 but 'x32' \(which val_loss "
                                        r"closes over\) is torch.float32"):
        _check(p)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_hyperparameters_are_refused(dtype: torch.dtype) -> None:
    hps = hg.HyperParams([hg.Scalar("lr", 0.1)])
    with pytest.raises(TypeError, match=rf"init_raw: dtype={dtype}; hypergradients need float32 "
                                        rf"or float64 \(tangents"):
        hps.init_raw(dtype)
    with pytest.raises(TypeError, match=rf"lam has dtype {dtype}; hypergradients need float32"):
        _check_lam(_problem(), torch.zeros(1, dtype=dtype))


def _check_lam(p: hg.InnerProblem, lam: torch.Tensor) -> None:
    p.check(lam)


@pytest.mark.parametrize("method", ["forward", "reverse", "finite_difference", "auto"])
def test_a_nan_hyperparameter_is_named_by_every_method(method: str) -> None:
    """A NaN in ``lam`` passed to a method directly gave a NaN hypergradient without a word;
    every method checks ``lam`` through ``InnerProblem.check``. An infinity is a value at its
    transform's edge (a logit momentum of exactly 1, the sparse-regression task's reference
    weights of 0 and 1) and runs."""
    from fixtures import lr_momentum

    p = lr_momentum(steps=3)
    m = hg.methods.create(method)
    lam = p.init_raw()
    m.hypergradient(p, lam)  # finite: fine (and the one-time checks done)
    lam = p.init_raw()
    lam[1] = math.nan
    with pytest.raises(ValueError, match=r"^InnerProblem: lam is NaN at momentum \(raw, "
                                         r"untransformed values: \[nan\]\)"):
        m.hypergradient(p, lam)
    lam = p.init_raw().repeat(1)
    lam[0] = math.nan
    with pytest.raises(ValueError, match=r"NaN at lr \("):
        p.run(lam)
    lam = p.init_raw()
    lam[1] = -math.inf  # momentum exactly 0
    assert math.isfinite(float(p.objective(*p.run(lam)[:2], lam)))


# -- the troubleshooting page's examples run ------------------------------------------------------
DOC = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting_engine.md"


def test_the_troubleshooting_page_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    for i, code in enumerate(blocks):
        exec(compile(code, f"troubleshooting_engine.md[python block {i}]", "exec"), {})


def test_the_troubleshooting_page_names_every_message_of_this_change() -> None:
    text = DOC.read_text()
    for words in ("must be a number > 0 (or the name of a hyperparameter)",
                  "are read by no step", "cuts it from the autograd graph",
                  "the training data has non-finite values", "torch cannot mix them",
                  "writes the parameter", "updates its buffer", "replaces its buffer",
                  "uses the hook-based", "renormalises the rows", "keep 8 to 11 bits",
                  "passes hyperparameter 'scale' to numpy", "changed its own tensors",
                  "state that hypergrad updates itself", "initial parameter 'bias'",
                  "is nan at the initial weights", "whose backward (_embedding_bag_backward)",
                  "whose gradient divides each row's by how often",
                  "leaves out the row's lookups although forward reads them",
                  "lam is NaN at"):
        assert words in text, words


def test_a_constant_buffer_of_minus_infinity_is_a_mask_not_a_fault() -> None:
    """A causal mask registered as a buffer (-inf above the diagonal) is common in attention
    models: it is not refused; a NaN in it, or an infinity in a buffer training updates, is."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("mask", torch.triu(torch.full((4, 4), float("-inf")), 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (torch.softmax(self.lin(x)[:, None, :] + self.mask, -1) * x[:, None]).sum(1)

    torch.manual_seed(0)
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 4, (8,))
    model = Masked().double()

    def problem() -> hg.InnerProblem:
        return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                               hg.optim.sgd(lr="lr"),
                               hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")]),
                               [(x, y)], 2, lambda m, hp: F.cross_entropy(m(x), y))

    p = problem()
    p.check(p.init_raw())  # accepted
    model.mask[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"buffer 'mask' has 1 NaN"):
        problem().check(p.init_raw())


@pytest.mark.parametrize(("start", "stop", "error"),
                         [(0, 6, ValueError), (0, -2, ValueError), (3, 2, ValueError),
                          (0, 2.5, TypeError), (True, 3, TypeError)])
def test_a_plain_run_outside_the_horizon_is_refused(start: Any, stop: Any, error: type) -> None:
    """run(stop=T + 3) trained past the horizon on the last window's values, and stop=-2
    returned the initial state, without a word (the intermediate-steps probe)."""
    p = _problem([hg.Schedule("lr", 0.1, windows=2, transform="log")], steps=4)
    with pytest.raises(error, match=r"^InnerProblem.run: "):
        p.run(p.init_raw(), start=start, stop=stop)
    full = p.run(p.init_raw())
    part = p.run(p.init_raw(), state=p.run(p.init_raw(), stop=2), start=2, stop=4)
    assert all(torch.equal(full.params[k], part.params[k]) for k in full.params)


def test_a_non_integer_step_is_named() -> None:
    p = _problem(steps=3)
    fwd = hg.ForwardMode()
    run = fwd.init(p, p.init_raw())._replace(step=1.5)
    with pytest.raises(TypeError, match=r"ForwardMode.step: the run's step must be an int >= 0, "
                                        r"got 1.5 \(float\)"):
        fwd.step(p, run, p.init_raw())



def _late_term(hps: list[Any], stream: bool = False, never: bool = False) -> hg.InnerProblem:
    """A training loss with an L2 term on some batches only: those whose first target is 2,
    which batch 0 is not (``never``: no batch)."""
    x, y = _data()
    y = y.clone()
    y[0], y[8] = 0, 2

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        loss = F.cross_entropy(m(b[0]), b[1])
        if int(b[1][0]) == 2 and not never:
            loss = loss + hp["wd"] * sum((w ** 2).sum() for w in m.params.values())
        return loss

    batches: Any = [(x[:8], y[:8]), (x[8:], y[8:])]
    if stream:
        batches = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                              batch_size=8)
    return _problem([hg.Scalar("lr", 0.1, transform="log"), *hps], steps=4, train_loss=tl,
                    batches=batches)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["scalar", "schedule"])
def test_a_loss_term_that_batch_0_does_not_switch_on_is_tuned(kind: str, stream: bool) -> None:
    """A training-loss term read on some batches only, not batch 0's, was refused as 'bound to
    nothing: neither train_loss nor val_loss reads them' by every method and by a plain run
    (the placement probe, 2026-12-07): the check read step 0 alone. Later steps are now read
    too, and the hypergradient is exact."""
    wd = (hg.Scalar("wd", 0.05, transform="log") if kind == "scalar" else
          hg.Schedule("wd", 0.05, windows=2, transform="log"))
    p = _late_term([wd], stream=stream)
    report = hg.testing.hypergradcheck(p)
    assert report.grad is not None
    g = report.grad[1:]
    assert bool((g != 0).any())
    if kind == "schedule":  # steps 1 and 3 read it, one in each window
        assert bool((g != 0).all())


def test_a_loss_term_no_step_switches_on_is_still_refused() -> None:
    p = _late_term([hg.Scalar("wd", 0.05, transform="log")], never=True)
    with pytest.raises(ValueError, match=r"hyperparameters \['wd'\] are bound to nothing"):
        _check(p)


def test_a_buffer_assigned_its_initial_value_first_is_still_carried() -> None:
    """The dtypes probe (2026-12-07): ``self.warm = self.calls > 3`` leaves the flag at its
    initial False in the first call, so the probe pass took it for no write: it stayed False
    for the whole run (objective 1.1095 against torch's 1.5105), with no word. An assignment
    is now a write whatever its value."""

    class Warm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))
            self.register_buffer("warm", torch.zeros((), dtype=torch.bool))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training:
                self.calls = self.calls + 1
                self.warm = self.calls > 3
            return self.lin(x) * torch.where(self.warm, 3.0, 1.0)

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 3, generator=g, dtype=torch.float64),
                torch.randint(0, 2, (8,), generator=g)) for _ in range(6)]
    torch.manual_seed(0)
    model = Warm().double()
    twin = copy.deepcopy(model)
    problem = hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                              hg.optim.sgd(lr="lr"),
                              hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")]),
                              batches, 6, lambda m, hp: F.cross_entropy(m(batches[0][0]),
                                                                        batches[0][1]))
    state = problem.run(problem.init_raw())
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        opt.step()
    assert bool(twin.warm) and float(state.buffers["warm"]) == 1.0
    for k, w in twin.named_parameters():
        torch.testing.assert_close(state.params[k], w.detach(), rtol=1e-14, atol=1e-14)


def test_an_integer_buffer_past_the_models_exact_range_is_refused() -> None:
    """A float32 model's long counter from 2**24 + 1 came back as 16777216.0 (the state carries
    written integer buffers in the model's dtype), and a forward reading n % 2 trained
    otherwise than torch (1.2156 against 1.6254), with no word (the dtypes probe)."""

    class Count(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.register_buffer("n", torch.tensor(2 ** 24 + 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training:
                self.n = self.n + 1
            return self.lin(x) * (1 + (self.n % 2).to(x.dtype))

    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    problem = hg.InnerProblem(Count(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                              hg.optim.sgd(lr="lr"),
                              hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")]),
                              [(x, y)], 3, lambda m, hp: F.cross_entropy(m(x), y))
    with pytest.raises(ValueError, match=r"buffer 'n' \(torch.int64\), written by its forward, "
                                         r"reached 1677721[78]: the training state carries it "
                                         r"as torch.float32, exact up to 16777216 only"):
        problem.run(problem.init_raw())
