"""Initial-weight hyperparameters (float64): a per-layer scale of the initial weights
(InitScale: forward = reverse = finite differences) and the initial weights themselves
(InitWeights: forward = reverse = checkpointed reverse), the initial state they define, and
the errors for misuse."""

from __future__ import annotations

import pytest
import torch
from fixtures import SMALL
from torch.utils._pytree import tree_flatten

import hypergrad as hg
from hypergrad.testing import digits_case, hypergradcheck, rel_err


def _with(hps: list, opt: str = "momentum", steps: int = 6,  # type: ignore[type-arg]
          optimizer: hg.optim.Optimizer | None = None) -> hg.InnerProblem:
    base = digits_case(opt, "lr", **{**SMALL, "steps": steps})
    return hg.InnerProblem(base.fmodel.module, base.train_loss,
                           optimizer or hg.optim.sgd(lr="lr", momentum=0.9, weight_decay=1e-3),
                           hg.HyperParams(hps), base.batch, steps, base.val_loss)


@pytest.mark.parametrize("opt", ["momentum", "adam"])
def test_init_scale_forward_reverse_finite_differences(opt: str) -> None:
    optimizer = (hg.optim.sgd(lr="lr", momentum=0.9, weight_decay=1e-3) if opt == "momentum"
                 else hg.optim.adam(lr="lr", weight_decay=1e-3))
    lr0 = 0.1 if opt == "momentum" else 0.01
    problem = _with([hg.Scalar("lr", lr0, transform="log"),
                     hg.InitScale("init", 0.7, params=["0.weight", "2.weight"])],
                    optimizer=optimizer)
    report = hypergradcheck(problem, rtol_rev=1e-12, rtol_fd=1e-6)
    assert report.max("fwd_vs_rev") <= 1e-12 and report.max("fwd_vs_fd") <= 1e-6
    assert report.grad is not None and float(report.grad[1:].abs().min()) > 0


def test_init_weights_forward_equals_reverse() -> None:
    """The initial values of two bias vectors (K = 8 + 10): forward mode carries K tangents from
    Z_0 = I (on those entries); reverse mode adds a_0 at the end; checkpointing changes nothing;
    finite differences agree to their error."""
    problem = _with([hg.InitWeights("w0", params=["0.bias", "2.bias"]),
                     hg.Scalar("lr", 0.1, transform="log")])
    assert problem.num_hyperparams == 8 + 10 + 1
    lam = problem.init_raw()
    rev = hg.ReverseMode().hypergradient(problem, lam).grad
    assert rel_err(hg.ForwardMode().hypergradient(problem, lam).grad, rev) <= 1e-12
    assert torch.equal(hg.ReverseMode(checkpoint=2).hypergradient(problem, lam).grad, rev)
    fd = hg.FiniteDifference().hypergradient(problem, lam).grad
    assert rel_err(fd, rev) <= 1e-6


def test_initial_state_with_and_without_lam() -> None:
    problem = _with([hg.Scalar("lr", 0.1, transform="log"),
                     hg.InitScale("init", 0.5, params=["2.weight"])])
    lam = problem.init_raw()
    base, scaled = problem.initial_state(), problem.initial_state(lam)
    w = problem.fmodel.module.get_parameter("2.weight")
    assert torch.equal(base.params["2.weight"], w.detach())  # the model's own weights
    torch.testing.assert_close(scaled.params["2.weight"], 0.5 * w.detach(), rtol=1e-15, atol=0)
    assert torch.equal(scaled.params["0.weight"], base.params["0.weight"])
    plain = problem.run(lam)  # training starts from the scaled weights
    again = problem.run(lam, state=scaled)
    for a, b in zip(tree_flatten(plain)[0], tree_flatten(again)[0], strict=True):
        assert torch.equal(a, b)
    w0 = _with([hg.InitWeights("w0", params=["2.bias"], init=[0.5] * 10),
                hg.Scalar("lr", 0.1, transform="log")])
    b0 = w0.initial_state(w0.init_raw()).params["2.bias"]
    assert torch.equal(b0, torch.full((10,), 0.5, dtype=torch.float64, device=b0.device))


def test_truncated_reverse_drops_the_initialisation_term() -> None:
    """The initial weights' hypergradient flows through every step: truncated reverse mode
    (k < T) does not reach it (refused, it would be an exact 0: the next test), full reverse
    (k = T) does."""
    problem = _with([hg.InitScale("init", 1.0, params=["2.weight"]),
                     hg.Scalar("lr", 0.1, transform="log")])
    lam = problem.init_raw()
    with pytest.raises(ValueError, match=r"does not reach"):
        hg.ReverseMode(truncate=3).hypergradient(problem, lam)
    full = hg.ReverseMode(truncate=problem.steps).hypergradient(problem, lam).grad
    assert float(full[0]) != 0.0
    assert torch.equal(full, hg.ReverseMode().hypergradient(problem, lam).grad)


def test_misuse_is_named() -> None:
    with pytest.raises(ValueError, match=r"optimizer argument lr is bound to 'init' of kind "
                                         r"init_scale, which sets the initial weights"):
        _with([hg.InitScale("init", 0.1)], optimizer=hg.optim.sgd(lr="init"))
    with pytest.raises(ValueError, match=r"InitScale\('s'\): params \['nope'\] are not trainable"):
        _with([hg.InitScale("s", 1.0, params=["nope"]), hg.Scalar("lr", 0.1)])
    with pytest.raises(ValueError, match=r"InitWeights\('w0'\): not bound to a model yet"):
        hg.InitWeights("w0").shape()
    with pytest.raises(ValueError, match=r"InitScale\('s'\): parameter names are not bound"):
        hg.InitScale("s").shape()
    with pytest.raises(ValueError, match=r"init has shape \(3,\), expected a number or shape "
                                         r"\(10,\)"):
        _with([hg.InitWeights("w0", params=["2.bias"], init=[1.0, 2.0, 3.0]),
               hg.Scalar("lr", 0.1)]).init_raw()
    scale = hg.InitScale("s", 2.0)
    assert scale.transform == "log" and scale.kind == "init_scale"


def test_methods_that_cannot_reach_the_initial_weights_refuse_them() -> None:
    """Truncated reverse mode (truncate < T), HD and MARTHE(mu=0) gave an exact 0 for an
    initialisation hyperparameter, silently; the Trainer then warned that the losses do not
    change with it (they do: the method drops that dependence). Each now refuses, naming the
    hyperparameter and the fix; at truncate >= T, or MARTHE with mu > 0, nothing changes."""
    problem = _with([hg.Scalar("lr", 0.1, transform="log"),
                     hg.InitScale("init", 0.7, params=["2.weight"])])
    lam = problem.init_raw()
    full = hg.ReverseMode().hypergradient(problem, lam).grad
    assert float(full[1].abs()) > 0
    for method, reach in ((hg.ReverseMode(truncate=5), "its last 5 of T = 6 steps"),
                          (hg.HD(), "its one-step hypergradient"),
                          (hg.MARTHE(mu=0.0), "its one-step hypergradient")):
        with pytest.raises(ValueError, match=rf"\['init'\] set the initial weights, which "
                                             rf"{reach} does not reach: .*exactly 0"):
            method.hypergradient(problem, lam)
        with pytest.raises(ValueError, match=r"\['init'\] set the initial weights"):
            method.check(problem)  # the Trainer refuses it when built, not at its first fit
        if isinstance(method, hg.ReverseMode):
            with pytest.raises(ValueError, match=r"\['init'\] set the initial weights"):
                hg.Trainer(problem, method, mode=hg.Offline(outer_steps=1), callbacks=[])
    assert torch.equal(hg.ReverseMode(truncate=6).hypergradient(problem, lam).grad, full)
    # MARTHE(0 < mu < 1) discounts them by mu^T: refused when called directly too, as the
    # Trainer refuses it (its own check was skipped there: the kinds probe, 2026-12-07)
    with pytest.raises(ValueError, match=r"MARTHE\(mu=0.5\): \['init'\] set the initial weights"):
        hg.MARTHE(mu=0.5).hypergradient(problem, lam)
    assert float(hg.MARTHE(mu=1.0).hypergradient(problem, lam).grad[1].abs()) > 0
