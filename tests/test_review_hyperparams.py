"""Review of the hyperparameter kinds, their transforms and the search box (float64): silent
wrong answers found and fixed, each test failing before its fix, and one check of every kind
and transform in one problem (forward = reverse = finite differences)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fixtures import TINY

import hypergrad as hg
from hypergrad.run.bounds import Bounds
from hypergrad.testing import digits_case, hypergradcheck


def _quiet() -> list[hg.Callback]:
    return [hg.run.Log(None), hg.run.Progress(False)]


def _digits(hps: list[Any], optimizer: Any = None, train_loss: Any = None,
            steps: int = 6) -> hg.InnerProblem:
    """The MLP of ``digits_case`` (float64, 24 examples) with other hyperparameters."""
    base = digits_case("momentum", "lr", steps=steps, **TINY)
    return hg.InnerProblem(base.fmodel.module, train_loss or base.train_loss,
                           optimizer or hg.optim.sgd(lr="lr", momentum=0.9),
                           hg.HyperParams(hps), base.batch, steps, base.val_loss)


# -- the search box ------------------------------------------------------------------------------
def test_an_infinite_bound_is_no_bound_and_the_search_stays_finite() -> None:
    """``bounds={"lr": (1e-3, inf)}`` made the box's upper edge inf: the space-filling start
    trained at lr = exp(inf) and at NaN, silently. An infinite end on its own side (or a
    number that rounds to one in the problem's dtype) is now no bound, like None."""
    p = digits_case("momentum", "lr", **{**TINY, "steps": 6})
    tr = hg.Trainer(p, guards=hg.Guards(bounds={"lr": (1e-3, math.inf)}), callbacks=_quiet(),
                    mode=hg.Offline(outer_steps=1, start=2, recheck=0))
    lo, hi = tr.box
    assert bool(torch.isfinite(lo).all() and torch.isfinite(hi).all())
    assert float(hi[0]) == pytest.approx(math.log(0.1) + math.log(100.0))  # filled around init
    assert tr.bounds.values() == {"lr": [pytest.approx(1e-3), None]}
    res = tr.fit()
    assert all(bool(torch.isfinite(e["lam"]).all()) for e in res.evaluations)

    hps = hg.HyperParams([hg.Scalar("a", 0.5), hg.Scalar("lr", 0.1, "log")])
    assert Bounds(hps, torch.float64, {"a": (-math.inf, math.inf)}).raw == {"a": (None, None)}
    assert Bounds(hps, torch.float32, {"a": (None, 1e39)}).raw == {"a": (None, None)}  # inf in f32
    assert Bounds(hps, torch.float32, {"lr": (None, 1e300)}).raw == {"lr": (None, None)}
    with pytest.raises(ValueError, match=r"bounds\['a'\] low=inf is infinite in torch.float64, so "
                                         r"no finite value lies inside"):
        Bounds(hps, torch.float64, {"a": (math.inf, None)})
    with pytest.raises(ValueError, match=r"high=-1e\+39 is infinite in torch.float32"):
        Bounds(hps, torch.float32, {"a": (None, -1e39)})
    with pytest.raises(ValueError, match=r"outside the domain of transform='log' \(values > 0\); "
                                         r"give a bound in that domain, or None for no low bound"):
        Bounds(hps, torch.float64, {"lr": (0.0, 1.0)})


def test_a_bound_per_window_is_refused_with_why() -> None:
    """Checked correct (refused, not applied to one window): one (low, high) pair bounds every
    window of a schedule; lists per entry are named as not supported."""
    hps = hg.HyperParams([hg.Schedule("lr", 0.1, "log", 4)])
    with pytest.raises(ValueError, match=r"bounds are numbers \(or None for no bound\) \(one "
                                         r"pair bounds every entry of the hyperparameter"):
        Bounds(hps, torch.float64, {"lr": ([1e-4] * 4, [1.0] * 4)})
    b = Bounds(hps, torch.float64, {"lr": (1e-3, 0.05)})
    lam = torch.log(torch.tensor([1e-5, 0.01, 0.02, 1.0], dtype=torch.float64))
    b.project(lam)
    assert lam.exp().tolist() == pytest.approx([1e-3, 0.01, 0.02, 0.05])


# -- values, described values --------------------------------------------------------------------
def test_a_step_of_a_schedule_needs_its_horizon_and_is_not_negative(f64: torch.dtype) -> None:
    """``values(lam, step=3)`` read every step at the default horizon 1, so any step gave the
    last window; ``step=-1`` gave the last window too (Python's negative index)."""
    hps = hg.HyperParams([hg.Schedule("lr", [0.1, 0.2, 0.3, 0.4], windows=4), hg.Scalar("m", 0.5)])
    lam = hps.init_raw(f64)
    assert float(hps.values(lam, step=3, horizon=8)["lr"]) == pytest.approx(0.2)
    assert hps.values(lam)["lr"].shape == (4,)  # the whole schedule needs no horizon
    with pytest.raises(ValueError, match=r"step=3 without horizon; the schedules \['lr'\] read "
                                         r"window .*values\(lam, step=3, horizon=problem.steps\)"):
        hps.values(lam, step=3)
    with pytest.raises(ValueError, match=r"step=-1 must be an int >= 0"):
        hps.values(lam, step=-1, horizon=8)
    with pytest.raises(ValueError, match=r"Schedule\('lr'\): step=-1 must be >= 0"):
        hps.items[0].value(lam[:4], -1, 8)
    with pytest.raises(ValueError, match=r"horizon=0 must be an int >= 1"):
        hps.values(lam, step=0, horizon=0)
    plain = hg.HyperParams([hg.Scalar("m", 0.5)])  # nothing depends on the horizon
    assert float(plain.values(plain.init_raw(f64), step=3)["m"]) == 0.5


def test_named_values_keep_float64() -> None:
    """``named`` (results.json's ``learned_named``, TensorBoard's scalars) read the values at
    torch's default dtype: a learned 0.1234567890123 became 0.12345679104328156, 1e-50 became
    0."""
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log"), hg.Schedule("s", 0.1, windows=2),
                          hg.PerTensor("wd", 0.1, "log", params=["a", "b"])])
    named = hps.named({"lr": 0.1234567890123, "s": [1e-50, 3e39], "wd": [1e-3, 2e-3]}, 4)
    assert named == {"lr": 0.1234567890123, "s[steps 0-1]": 1e-50, "s[steps 2-3]": 3e39,
                     "wd[a]": 1e-3, "wd[b]": 2e-3}


# -- the kinds' arguments ------------------------------------------------------------------------
def test_two_initialisation_kinds_on_one_tensor_are_refused() -> None:
    """An InitWeights after an InitScale of the same tensor discarded the scale: its
    hypergradient exactly 0 and no warning, so tuning reported an untouched value as learned."""
    with pytest.raises(ValueError, match=r"parameter '2.bias' is set by two initialisation "
                                         r"hyperparameters, 's' and 'w0'.*params=\[\.\.\.\]"):
        _digits([hg.Scalar("lr", 0.1, "log"), hg.InitScale("s", 0.7, params=["2.bias"]),
                 hg.InitWeights("w0", params=["2.bias"])])
    with pytest.raises(ValueError, match=r"'0.weight' is set by two .* 'a' and 'b'"):
        _digits([hg.Scalar("lr", 0.1, "log"), hg.InitScale("a", 0.7),  # every tensor
                 hg.InitScale("b", 0.7, params=["0.weight"])])
    p = _digits([hg.Scalar("lr", 0.1, "log"), hg.InitScale("s", 0.7, params=["0.weight"]),
                 hg.InitWeights("w0", params=["2.bias"])])  # different tensors: fine
    assert p.num_hyperparams == 1 + 1 + 10


def test_a_tied_or_frozen_parameter_in_params_is_named_with_why() -> None:
    """Checked correct (not silent: refused), the message now says why a tied alias, a frozen
    parameter or a buffer is not in the list."""
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc, self.dec = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
            self.dec.weight = self.enc.weight
            self.frozen = torch.nn.Linear(4, 4).requires_grad_(False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.dec(torch.tanh(self.enc(x))) + self.frozen(x)

    x = torch.randn(8, 4, dtype=torch.float64)
    for name in ("dec.weight", "frozen.weight"):
        for item in (hg.PerTensor("wd", 1e-3, "log", params=[name], default=0.0),
                     hg.InitScale("s", 1.0, params=[name])):
            with pytest.raises(ValueError, match=r"are not trainable parameters of the model; "
                                                 r"choose from \['enc.weight', 'enc.bias', "
                                                 r"'dec.bias'\] \(a frozen parameter .* a tied "
                                                 r"parameter is listed once"):
                hg.InnerProblem(Tied().double(), lambda m, b, hp: m(b).pow(2).mean(),
                                hg.optim.sgd(lr=0.1, weight_decay="wd" if item.name == "wd"
                                             else 0.0),
                                hg.HyperParams([item]), [x], 2, lambda m, hp: m(x).pow(2).mean())


@pytest.mark.parametrize("make", [
    lambda: hg.PerTensor("wd", 1e-3, "log", params=[], default=0.0),
    lambda: hg.InitScale("s", 1.0, params=[]),
    lambda: hg.InitWeights("w0", params=[]),
])
def test_an_empty_parameter_list_is_refused(make: Any) -> None:
    """``params=[]`` tuned nothing without a word (a PerTensor of K = 0 whose parameters all
    read the default; an InitScale of none) or failed in torch.cat (InitWeights)."""
    with pytest.raises(ValueError, match=r"params=\[\] lists no parameter, so it would tune "
                                         r"nothing; .* params=None for every trainable"):
        make()


def test_a_parameter_name_as_a_string_is_refused_by_every_kind_that_lists_tensors() -> None:
    for make in (lambda: hg.InitScale("s", 1.0, params="0.weight"),
                 lambda: hg.InitWeights("w0", params="0.weight")):
        with pytest.raises(TypeError, match=r"params='0.weight' must be a list .*"
                                            r"params=\['0.weight'\]"):
            make()


@pytest.mark.parametrize("default,error", [(float("nan"), ValueError), (math.inf, ValueError),
                                           ("0.1", TypeError), (True, TypeError),
                                           ([0.1], TypeError)])
def test_a_per_tensor_default_is_a_finite_number(default: Any, error: type) -> None:
    """``default=nan`` trained every unlisted tensor with a NaN weight decay (a NaN
    hypergradient); a string, a bool or a list failed deep in the optimizer's update."""
    with pytest.raises(error, match=r"PerTensor\('wd'\): default=.* must be a (finite )?"
                                    r"number, the constant value of the parameters not in "
                                    r"params, e.g. default=0.0"):
        hg.PerTensor("wd", 1e-3, "log", params=["0.weight"], default=default)


def test_a_per_tensor_default_given_as_a_tensor_reads_as_a_number() -> None:
    wd = hg.PerTensor("wd", 1e-3, "log", params=["0.weight"], default=torch.tensor(0.01))
    assert wd.default == pytest.approx(0.01) and isinstance(wd.default, float)


def test_a_per_tensor_value_read_with_get_gives_the_default() -> None:
    """``hp["wd"].get("b", 0.0)`` skipped the default (``dict.get`` does not call
    ``__missing__``): a penalty written in the loss read 0.0 where the optimizer read 0.5."""
    wd = hg.PerTensor("wd", 0.1, params=["a"], default=0.5).bind(["a", "b"])
    v = wd.value(torch.zeros(1), 0, 1)
    assert v.get("b", 0.0) == v["b"] == 0.5 and float(v.get("a", 0.0)) == 0.0
    no_default = hg.PerTensor("wd", 0.1, params=["a", "b"]).bind(["a", "b"])
    assert no_default.value(torch.zeros(2), 0, 1).get("c", 7.0) == 7.0


def test_an_init_that_requires_grad_gives_a_leaf_lam(f64: torch.dtype) -> None:
    """An init read off a tensor that requires grad (a model's weight, a learned tensor) put its
    graph into ``lam``: the Trainer failed with torch's "only change requires_grad flags of leaf
    variables", and finite differences returned a hypergradient with a grad_fn."""
    def train_loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        x, y, idx = b
        return (F.cross_entropy(m(x), y, reduction="none") * hp["cw"][y]).mean()

    w = torch.full((10,), 1.0, dtype=f64, requires_grad=True)
    p = _digits([hg.Array("cw", w, transform="log")], hg.optim.sgd(lr=0.1), train_loss)
    lam = p.init_raw()
    assert lam.is_leaf and not lam.requires_grad
    assert hg.FiniteDifference().hypergradient(p, lam).grad.grad_fn is None
    hg.Trainer(p, mode=hg.Offline(outer_steps=1, start=1, recheck=0), callbacks=_quiet())


# -- every kind and transform in one problem -----------------------------------------------------
def test_every_kind_and_transform_in_one_problem_agrees_with_reverse_and_finite_differences(
        ) -> None:
    """Checked correct by the review (no fix): a schedule (log), a per-tensor momentum over two
    tensors with a default for the others (logit), a per-tensor weight decay in another order
    than the model's (log, default 0), per-example weights (identity), class weights (an Array,
    log), an L2 coefficient (identity) and an initial scale (identity) of a tensor also under
    weight decay."""
    def train_loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        x, y, idx = b
        logp = F.log_softmax(m(x), -1)
        nll = -(logp * hp["cw"][None, :]).gather(1, y[:, None])[:, 0]
        return ((hp["ex"][idx] * nll).mean()
                + hp["l2"] * sum((w ** 2).sum() for w in m.params.values()))

    p = _digits([
        hg.Schedule("lr", [0.1, 0.05], windows=2, transform="log"),
        hg.PerTensor("mom", 0.9, "logit", params=["0.weight", "2.bias"], default=0.5),
        hg.PerTensor("wd", [1e-3, 2e-3], "log", params=["2.weight", "0.bias"], default=0.0),
        hg.PerExample("ex", 1.0, n=24),
        hg.Array("cw", 1.0, shape=(10,), transform="log"),
        hg.Scalar("l2", 1e-4),
        hg.InitScale("s", [0.8, 1.2], params=["2.weight", "0.weight"], transform="identity"),
    ], hg.optim.sgd(lr="lr", momentum="mom", weight_decay="wd"), train_loss, steps=4)
    report = hypergradcheck(p, strategies=[])
    assert report.max("fwd_vs_rev") < 1e-12 and report.max("fwd_vs_fd") < 1e-5


def test_an_init_scale_of_a_tensor_that_starts_at_zero_is_refused_or_left_out() -> None:
    """A zero-initialised tensor (a BatchNorm or LayerNorm bias) scales to itself: InitScale
    over every parameter gave it a dimension whose hypergradient is exactly 0 at every step
    (no warning: the zero-hypergradient warning is per hyperparameter, and the others move),
    and the default search spent a dimension of its box on it. Listed, it is refused with the
    fix; with params=None it is left out."""
    base = digits_case("momentum", "lr", steps=4, **TINY)
    model = base.fmodel.module
    with torch.no_grad():
        model[2].bias.zero_()

    def build(scale: Any) -> hg.InnerProblem:
        return hg.InnerProblem(model, base.train_loss, hg.optim.sgd(lr="lr", momentum=0.9),
                               hg.HyperParams([hg.Scalar("lr", 0.1, "log"), scale]),
                               base.batch, 4, base.val_loss)

    with pytest.raises(ValueError, match=r"InitScale\('s'\): params \['2.bias'\] start at "
                                         r"exactly zero.*InitWeights"):
        build(hg.InitScale("s", 1.0, params=["0.weight", "2.bias"]))
    p = build(hg.InitScale("s", 1.0))
    scale = p.hyperparams.by_name["s"]
    assert scale.params == ["0.weight", "0.bias", "2.weight"]
    got = hg.ForwardMode().hypergradient(p, p.hyperparams.init_raw(torch.float64))
    assert bool(got.grad[p.hyperparams.slices["s"]].ne(0).all())
