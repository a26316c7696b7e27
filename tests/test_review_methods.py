"""Review of the approximate and online methods (float64 unless said): silent wrong answers
found and fixed, each test failing before its fix."""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
import torch.nn.functional as F

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.errors import InnerNotConvergedWarning, SolverNotConvergedWarning
from hypergrad.testing import l2_mlp_case, rel_err


def _adam_mlp(hps: list[Any], optimizer: Any, steps: int = 12) -> hg.InnerProblem:
    """A float64 MLP on 48 digits trained by ``optimizer`` with hyperparameters ``hps``."""
    from hypergrad.tasks import digits_data, mlp

    torch.manual_seed(0)
    data = digits_data(48, 32, 1, seed=0, dtype=torch.float64)
    return hg.InnerProblem(
        mlp([64, 12, 10]).double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]), optimizer,
        hg.HyperParams(hps), MiniBatches(data.x_train, data.y_train, batch_size=16), steps,
        lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))


# -- finite differences --------------------------------------------------------------------------

def test_finite_differences_of_a_small_untransformed_value_stay_in_its_domain() -> None:
    """Adam's eps = 1e-8 as an untransformed hyperparameter: the step eps * max(1, |lam|) = 1e-5
    ran Adam at eps = -1e-5 and the difference was off reverse mode by 1.6e-4 here, 150 % on
    30 steps, without a word. A
    step relative to the value (1e-3 of it) is 1e-6 off."""
    problem = _adam_mlp([hg.Scalar("eps", 1e-8), hg.Scalar("lr", 0.01, transform="log")],
                        hg.optim.adam(lr="lr", eps="eps"))
    lam = problem.init_raw()
    exact = hg.ReverseMode().hypergradient(problem, lam).grad
    fd = hg.FiniteDifference()
    assert rel_err(fd.hypergradient(problem, lam).grad, exact) < 1e-5
    h = fd.steps_for(lam, problem.hyperparams)
    assert float(h[0]) == 1e-5 * 100 * 1e-8 and float(h[1]) == 1e-5 * abs(float(lam[1]))
    est = fd.estimate(problem, lam)
    assert rel_err(est.grad, exact) < 1e-5 and torch.equal(est.step, h)
    # values of 0.01 and more, zeros and transformed values keep eps * max(1, |lam|)
    assert fd.steps_for(torch.tensor([0.0, 0.5], dtype=torch.float64),
                        hg.HyperParams([hg.Scalar("a", 0.0), hg.Scalar("b", 0.5)])).tolist() == [
        1e-5, 1e-5]


# -- implicit differentiation: what its warnings tell to do ---------------------------------------

def _warned(fn: Any) -> tuple[Any, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, caught


def test_implicit_on_mini_batches_names_loss_steps() -> None:
    """Mini-batch training with the default loss_steps=None: the objective is the last batch
    only (48 of 64 per-example hypergradients exactly 0, 100 % off reverse mode). The warning
    said to train longer; it now names loss_steps, with the horizon filled in."""
    from torch import nn

    from hypergrad.tasks import digits_data

    data = digits_data(64, 64, 1, seed=0, dtype=torch.float64)
    torch.manual_seed(0)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, i = batch
        ce = F.cross_entropy(m(x), y, reduction="none")
        return (hp["w"][i] * ce).mean() + 0.05 * (m.params["weight"] ** 2).sum()

    problem = hg.InnerProblem(
        nn.Linear(64, 10).double(), train_loss, hg.optim.sgd(lr=0.5, momentum=0.9),
        hg.HyperParams([hg.PerExample("w", 0.8, n=64, transform="logit")]),
        MiniBatches(data.x_train, data.y_train, batch_size=16, shuffle=False), 40,
        lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))
    r, caught = _warned(lambda: hg.ImplicitDiff().hypergradient(problem, problem.init_raw()))
    said = [str(w.message) for w in caught if w.category is InnerNotConvergedWarning]
    assert len(said) == 1 and "loss_steps=None" in said[0], said
    assert "ImplicitDiff(loss_steps=range(36, 40)), the last one" in said[0]  # 4 per epoch
    assert int((r.grad == 0).sum()) == 48
    # full-batch training (one batch every step) is not told about loss_steps
    full = hg.InnerProblem(problem.fmodel.module, train_loss, problem.optimizer,
                           problem.hyperparams, [problem.batch(0)], 5, problem.val_loss)
    _, caught = _warned(lambda: hg.ImplicitDiff().hypergradient(full, full.init_raw()))
    said = [str(w.message) for w in caught if w.category is InnerNotConvergedWarning]
    assert len(said) == 1 and "loss_steps" not in said[0]


def test_implicit_names_what_keeps_training_from_a_stationary_point() -> None:
    """Dropout (one draw is the objective) and BatchNorm under weight decay (scale-invariant
    weights: no stationary point) keep ||grad_w L(w_T)|| at 0.22-0.61 of its start however
    long the training (measured at T = 2000 on digits); the warning only said to train
    longer. A plain MLP is told to train longer, nothing more."""
    from torch import nn

    from hypergrad.tasks import digits_data

    torch.manual_seed(0)
    data = digits_data(64, 32, 1, seed=0, dtype=torch.float64)
    batch = [(data.x_train, data.y_train)]

    def said(*mid: nn.Module, val_mode: str = "eval") -> str:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 16), *mid, nn.Tanh(), nn.Linear(16, 10)).double()
        problem = hg.InnerProblem(
            model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
            hg.optim.sgd(lr=0.2, weight_decay="wd"),
            hg.HyperParams([hg.Scalar("wd", 1e-2, transform="log")]), batch, 6,
            lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val), val_mode=val_mode)
        _, caught = _warned(lambda: hg.ImplicitDiff().hypergradient(problem,
                                                                    problem.init_raw()))
        told = [str(w.message) for w in caught if w.category is InnerNotConvergedWarning]
        assert len(told) == 1, told
        return told[0]

    plain = said()
    assert "Train longer" in plain and "may not help" not in plain
    drop = said(nn.Dropout(0.2))
    assert "Training longer may not help here: the training loss draws random numbers" in drop
    assert "normalizes" not in drop
    bn = said(nn.BatchNorm1d(16), val_mode="train")  # its statistics: no part of the theorem
    assert "the model normalizes (BatchNorm1d): the weights before a normalization" in bn
    assert "forward or reverse mode is exact" in bn and "draws random" not in bn


def test_implicit_at_a_saddle_says_the_hessian_is_indefinite() -> None:
    """An L2 MLP whose w_T has negative curvature: CG stops on it and the hypergradient was
    returned 96 % off forward mode with 'Raise maxiter, use CG()' (it was CG); now the warning
    says that the Hessian is not positive definite and what to do."""
    problem = l2_mlp_case(300, l2=1e-3)
    r, caught = _warned(lambda: hg.ImplicitDiff(hg.methods.CG(maxiter=300)).hypergradient(
        problem, problem.init_raw()))
    said = [str(w.message) for w in caught if w.category is SolverNotConvergedWarning]
    assert r.info is not None and "breakdown" in r.info
    assert len(said) == 1 and "non-positive curvature" in said[0]
    assert "not positive definite" in said[0] and "Raise maxiter" not in said[0]


def test_implicit_in_float32_says_when_the_residual_is_rounding() -> None:
    """A float32 problem cannot bring CG's residual to the default tol=1e-10: every call warned
    'Raise maxiter, use CG()' (it was CG, at 3.6e-7, its hypergradient 2e-7 off float64's). The
    warning now says that this is float32's rounding level and which tol to give."""
    from torch import nn

    from hypergrad.tasks import digits_data

    def problem(dtype: torch.dtype) -> hg.InnerProblem:
        data = digits_data(64, 64, 1, seed=0, dtype=dtype)
        torch.manual_seed(0)

        def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
            return (F.cross_entropy(m(batch[0]), batch[1])
                    + hp["l2"] * (m.params["weight"] ** 2).sum())

        return hg.InnerProblem(
            nn.Linear(64, 10).to(dtype), train_loss, hg.optim.sgd(lr=0.5, momentum=0.9),
            hg.HyperParams([hg.Scalar("l2", 0.05, transform="log")]),
            [(data.x_train, data.y_train)], 300,
            lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))

    p64, p32 = problem(torch.float64), problem(torch.float32)
    want = hg.ImplicitDiff().hypergradient(p64, p64.init_raw()).grad
    r, caught = _warned(lambda: hg.ImplicitDiff().hypergradient(p32, p32.init_raw()))
    said = [str(w.message) for w in caught if w.category is SolverNotConvergedWarning]
    assert len(said) == 1 and "torch.float32's rounding level" in said[0], said
    assert "Raise maxiter" not in said[0] and "not positive definite" not in said[0], said
    assert rel_err(r.grad.double(), want) < 1e-4
    # the tol it names (a power of ten above the residual reached) is one the solve meets: one
    # machine's CG reached 3.6e-7 (tol=1e-6 named), another's broke down at 1.4e-4 on a
    # curvature of -4.9e-9 (the bias shift, singular in exact arithmetic; tol=1e-3 named)
    tol = float(re.search(r"CG\(tol=([0-9.e+-]+)\)", said[0]).group(1))
    assert 2 * r.info["residual"] <= tol < 20 * r.info["residual"]
    _, caught = _warned(lambda: hg.ImplicitDiff(hg.methods.CG(tol=tol)).hypergradient(
        p32, p32.init_raw()))
    assert not [w for w in caught if w.category is SolverNotConvergedWarning]
