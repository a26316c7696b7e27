"""Differentiation paths found wrong or unguarded by review (2026-11-27): implicit
differentiation with the weight decay of RMSprop and Adagrad, AutoMode given inexact methods,
schedule-free AdamW's first beta at 0, finite differences in float32."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hypergrad as hg
from hypergrad.errors import PrecisionWarning
from hypergrad.methods import CG, MARTHE
from hypergrad.testing import digits_case, rel_err


def _ridge(opt: Any, steps: int) -> tuple[hg.InnerProblem, float]:
    """Least squares with a tuned L2 term in the loss and the optimizer's own constant weight
    decay ``WD``; the closed-form hypergradient at the optimum of both."""
    torch.manual_seed(0)
    x = torch.randn(80, 6, dtype=torch.float64)
    y = x @ torch.randn(6, dtype=torch.float64) + 0.3 * torch.randn(80, dtype=torch.float64)
    xt, yt, xv, yv = x[:50], y[:50], x[50:], y[50:]
    model = nn.Linear(6, 1, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()

    def train_loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        r = m(b[0])[:, 0] - b[1]
        return 0.5 * (r * r).mean() + 0.5 * hp["l2"] * (m.params["weight"] ** 2).sum()

    def val_loss(m: Any, hp: Any) -> torch.Tensor:
        r = m(xv)[:, 0] - yv
        return 0.5 * (r * r).mean()

    p = hg.InnerProblem(model, train_loss, opt,
                        hg.HyperParams([hg.Scalar("l2", L2, transform="log")]), [(xt, yt)],
                        steps, val_loss)
    a = xt.T @ xt / 50 + (L2 + WD) * torch.eye(6, dtype=torch.float64)
    w = torch.linalg.solve(a, xt.T @ yt / 50)
    dw = -torch.linalg.solve(a, w)  # d w* / d l2
    closed = float(L2 * (xv.T @ (xv @ w - yv) / 30) @ dw)  # d E / d log(l2)
    return p, closed


L2, WD = 0.1, 0.5


@pytest.mark.parametrize("name", ["sgd", "adam", "adagrad", "rmsprop"])
def test_implicit_counts_the_optimizers_constant_weight_decay(name: str) -> None:
    """RMSprop and Adagrad add ``wd w`` to the gradient like SGD and Adam, but had no penalty:
    implicit differentiation ignored it (36 % off at wd = 0.5, 1 % at 0.002 without a
    warning)."""
    opt = {"sgd": hg.optim.sgd(lr=0.1, weight_decay=WD),
           "adam": hg.optim.adam(lr=0.05, weight_decay=WD),
           "adagrad": hg.optim.adagrad(lr=0.5, weight_decay=WD),
           # eps = 1: near the optimum a scaled gradient step, which converges (a small eps
           # makes RMSprop's steps jitter at the size of lr around it)
           "rmsprop": hg.optim.rmsprop(lr=0.05, alpha=0.9, eps=1.0, weight_decay=WD)}[name]
    p, closed = _ridge(opt, 1500)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # converged: no InnerNotConvergedWarning
        got = hg.ImplicitDiff(CG(tol=1e-12)).hypergradient(p, p.init_raw())
    assert abs(float(got.grad[0]) - closed) < 1e-6 * abs(closed) + 1e-9, (float(got.grad[0]),
                                                                          closed)


def test_implicit_refuses_a_constant_decoupled_weight_decay() -> None:
    p, _ = _ridge(hg.optim.adamw(lr=0.05, weight_decay=0.01), 10)
    with pytest.raises(ValueError, match=r"adamw\(weight_decay=0.01\) decays the weights apart"):
        hg.ImplicitDiff().hypergradient(p, p.init_raw())
    p, _ = _ridge(hg.optim.adamw(lr=0.05, weight_decay=0.0), 10)
    hg.ImplicitDiff().check(p)  # no decay: nothing to refuse


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"forward": MARTHE(mu=0.0)}, r"forward=.*is not exact"),
    ({"reverse": hg.ReverseMode(truncate=2)}, r"reverse=.*is not exact"),
    ({"checkpointed": hg.ReverseMode(truncate=2, checkpoint=1)}, r"checkpointed=.*not exact"),
    ({"forward": hg.ReverseMode()}, r"forward=.* must be a ForwardMode"),
    ({"memory_budget": "4GB"}, r"memory_budget='4GB' must be bytes > 0"),
    ({"memory_budget": -1}, r"memory_budget=-1 must be bytes > 0")])
def test_automode_takes_exact_methods_and_a_budget_in_bytes(kwargs: dict[str, Any],
                                                            match: str) -> None:
    """MARTHE subclasses ForwardMode, so AutoMode(forward=MARTHE(mu=0)) was taken and chosen:
    a biased hypergradient (0.73 off) from a method that picks among exact ones."""
    with pytest.raises((ValueError, TypeError), match=match):
        hg.AutoMode(**kwargs)
    hg.AutoMode(forward=MARTHE(mu=1.0), memory_budget=4e9)  # mu = 1 is forward mode


@pytest.mark.parametrize("bad", [0, -1, float("nan"), True, "2GB", "1e9", [1e9]])
def test_every_memory_budget_is_checked_as_the_guards_check_it(bad: Any) -> None:
    """choose_method and check_memory took 0, -1 or NaN as a budget every method exceeds (and
    advised "a larger memory_budget"), failed on "2GB" as Python's bare conversion error and
    took "1e9" silently; AutoMode refused NumPy numbers and inf, which Guards takes (the
    memory probe)."""
    from hypergrad.methods import check_memory, choose_method

    p, _ = _ridge(hg.optim.sgd(lr=0.05), 4)
    for call, who in ((lambda: choose_method(p, memory_budget=bad), "choose_method"),
                      (lambda: check_memory(p, hg.ForwardMode(), memory_budget=bad),
                       "check_memory"),
                      (lambda: hg.AutoMode(memory_budget=bad), "AutoMode")):
        with pytest.raises(ValueError, match=rf"{who}: memory_budget=.* must be bytes > 0"):
            call()
    for good in (np.int64(10**9), np.float32(1e9), float("inf")):
        assert hg.AutoMode(memory_budget=good).memory_budget == float(good)
        assert hg.Guards(memory_budget=good).memory_budget == float(good)
        assert choose_method(p, memory_budget=good)[0] == "forward"


def test_schedulefree_refuses_a_first_beta_of_zero() -> None:
    """betas[0] = 0 passed the [0, 1) check and divided by zero in the last step."""
    with pytest.raises(ValueError, match=r"betas\[0\]=0.0 must be a number in \(0, 1\)"):
        hg.optim.adamw_schedulefree(lr=0.01, betas=(0.0, 0.999))


def test_finite_differences_of_a_float32_problem_warn() -> None:
    """In float32 a central difference at the default eps was 6-26 % off the exact
    hypergradient, without a word (forward and reverse mode: 1e-7)."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.randn(32)
    p = hg.InnerProblem(nn.Linear(4, 1), lambda m, b, hp: ((m(b[0])[:, 0] - b[1]) ** 2).mean(),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        [(x, y)], 3, lambda m, hp: ((m(x)[:, 0] - y) ** 2).mean())
    fd = hg.FiniteDifference()
    with pytest.warns(PrecisionWarning, match=r"FiniteDifference: .*torch.float32.*float64"):
        fd.hypergradient(p, p.init_raw())
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        fd.hypergradient(p, p.init_raw())  # once per instance
        p64 = digits_case("sgd", "lr", steps=3, n_train=64)
        got = hg.FiniteDifference().hypergradient(p64, p64.init_raw()).grad
    assert rel_err(got, hg.ReverseMode().hypergradient(p64, p64.init_raw()).grad) < 1e-6


def test_the_trainer_refuses_implicit_for_optimizer_hyperparameters_before_training() -> None:
    """A learning rate is no hyperparameter of the training loss: the Trainer refuses
    ImplicitDiff when it is built (was: after the first full inner run, from inside fit())."""
    p = digits_case("sgd", "lr", steps=4, n_train=16, batch_size=8, hidden=4, n_val=16)
    runs = []
    real_run = p.run
    p.run = lambda *a, **k: runs.append(1) or real_run(*a, **k)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match=r"ImplicitDiff: hyperparameters \['lr'\] are read by "
                                         r"the optimizer"):
        hg.Trainer(p, method="implicit")
    assert runs == []


def test_the_cli_refuses_implicit_for_the_learning_rate_as_a_usage_error(tmp_path: Path) -> None:
    """``hypergrad-run method=implicit`` on the default job (the learning rate tuned): the
    message alone, exit status 2, no results written (was a traceback out of fit())."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    out = subprocess.run([sys.executable, "-m", "hypergrad.cli", "method=implicit", "debug=fast",
                          f"hydra.run.dir={tmp_path}"], capture_output=True, text=True,
                         env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.startswith("hypergrad-run: ImplicitDiff: hyperparameters ['lr']")
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize(("beta2", "warned"), [(0.9999999, True), (0.999, False)])
def test_a_beta_within_rounding_of_one_in_float32_warns(beta2: float, warned: bool) -> None:
    """Adam's beta2 = 0.9999999 tuned in float32: 1 - beta2 is 1.2e-7, a rounding unit, and
    the hypergradient came out -7e-9 where float64 gives +1e-10 (forward and reverse 35 %
    apart), without a word (the numerics probe)."""
    import warnings

    import torch.nn.functional as F
    from torch import nn

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    torch.manual_seed(0)
    p = hg.InnerProblem(nn.Linear(4, 3), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.adam(lr=0.01, betas=(0.9, "b2")),
                        hg.HyperParams([hg.Scalar("b2", beta2, transform="logit")]),
                        [(x, y)], 4, lambda m, hp: F.cross_entropy(m(x), y))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        p.check(p.init_raw())
        p.check(p.init_raw())  # once per hyperparameter
    said = [str(w.message) for w in got if issubclass(w.category, hg.errors.PrecisionWarning)]
    assert len(said) == (1 if warned else 0), said
    if warned:
        assert "hyperparameter 'b2' is 0.999999" in said[0], said[0]
        assert "within 100 rounding units of torch.float32" in said[0], said[0]
        assert "Build the problem in float64" in said[0], said[0]
