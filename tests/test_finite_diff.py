"""Finite differences: the step scaled per hyperparameter, the two-step estimate and its own
error, and hypergradcheck reporting groups where finite differences cannot check."""

from __future__ import annotations

import pytest
import torch

import hypergrad as hg
from hypergrad.errors import DetachedValueWarning
from hypergrad.testing import FD_SLACK, digits_case, hypergradcheck, rel_err

SMALL = dict(steps=4, n_train=16, batch_size=8, hidden=6, n_val=16)


def test_step_scales_with_the_raw_value(f64: torch.dtype) -> None:
    lam = torch.tensor([-6.0, 0.5, 3.0], dtype=f64)
    assert hg.FiniteDifference(1e-5).steps_for(lam).tolist() == pytest.approx([6e-5, 1e-5, 3e-5])
    assert hg.FiniteDifference(1e-5, relative=False).steps_for(lam).tolist() == [1e-5] * 3


def test_estimate_is_sharper_than_one_difference_and_bounds_its_error() -> None:
    """On a smooth problem the extrapolated estimate is closer to reverse mode than a single
    central difference, and its reported error bounds its actual error."""
    problem = digits_case("momentum", "lr", **SMALL)
    lam = problem.init_raw()
    exact = hg.ReverseMode().hypergradient(problem, lam).grad
    est = hg.FiniteDifference(1e-3).estimate(problem, lam)
    one = hg.FiniteDifference(1e-3).hypergradient(problem, lam).grad
    assert rel_err(est.grad, exact) < rel_err(one, exact) / 10
    assert ((est.grad - exact).abs() <= est.error).all()
    assert est.step.tolist() == hg.FiniteDifference(1e-3).steps_for(lam).tolist()


def test_rough_objective_is_reported_not_failed(f64: torch.dtype) -> None:
    """A loss with a kink at the scale of the step: finite differences disagree with themselves,
    the check reports them as unreliable for that group and still holds forward = reverse."""
    torch.manual_seed(0)
    x = torch.randn(32, 3, dtype=f64)
    y = torch.randn(32, dtype=f64)
    model = torch.nn.Linear(3, 1).double()
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log"),
                          hg.Scalar("wd", 1e-2, transform="log")])

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        xb, yb = batch
        wd = hp["wd"] * sum(p.pow(2).sum() for p in m.params.values())
        return ((m(xb)[:, 0] - yb) ** 2).mean() + wd

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return ((m(x)[:, 0] - y) ** 2).mean()

    problem = hg.InnerProblem(model, train_loss, hg.optim.sgd(lr="lr", weight_decay="wd"), hps,
                              [(x, y)], 3, val_loss)
    lam = problem.init_raw()
    # a kink of the objective in the final bias, placed so that lr's finite-difference step h
    # crosses it and the step h / 2 does not
    fm = hg.ForwardMode()
    fs = fm.run(problem, fm.init(problem, lam), lam)
    b, db_dlr = float(fs.state.params["bias"][0]), float(fs.tangents.params["bias"][0, 0])
    h = float(hg.FiniteDifference(1e-4).steps_for(lam)[0])
    target = b + 0.75 * h * db_dlr

    def val_loss2(m, hp):  # type: ignore[no-untyped-def]
        return 10 * (m.params["bias"][0] - target).abs() + ((m(x)[:, 0] - y) ** 2).mean()

    problem.val_loss = val_loss2
    rep = hypergradcheck(problem, lam, fd_eps=1e-4, raise_exception=False)
    assert rep.max("fwd_vs_rev") <= 1e-12
    assert "lr" in rep.fd_unreliable
    assert rep.fd_tolerance["lr"] == pytest.approx(FD_SLACK * rep.fd_error["lr"])
    assert rep.ok  # reported, not failed
    assert "finite differences unreliable" in str(rep)


def test_a_wrong_gradient_still_fails_where_finite_differences_are_reliable() -> None:
    problem = digits_case("adam", "lr", **SMALL)
    rep = hypergradcheck(problem, raise_exception=False)
    assert rep.ok and not rep.fd_unreliable
    rep.fwd_vs_fd["lr"] = 1e-3  # as if forward were off by 0.1%
    assert not rep.ok


def test_a_gap_far_beyond_unreliable_finite_differences_still_fails() -> None:
    """Where finite differences' own error estimate exceeded rtol_fd, the group was not
    checked at all: a training loss reading half its L2 coefficient through .item() (the
    hypergradient half the true one) passed with fwd_vs_fd = 0.5 beside fd_error = 1.4e-5 (the
    methods probe). Here rtol_fd below every estimate makes every group "unreliable"."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 5, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    hps = hg.HyperParams([hg.Scalar("l2", 0.1, "log")])

    def build(cut: bool) -> hg.InnerProblem:
        def train_loss(m, b, hp):  # type: ignore[no-untyped-def]
            sq = (m.params["weight"] ** 2).sum()
            c = 0.5 * hp["l2"] + 0.5 * (hp["l2"].item() if cut else hp["l2"])
            return ((m(b[0])[:, 0] - b[1]) ** 2).mean() + c * sq

        torch.manual_seed(0)
        return hg.InnerProblem(torch.nn.Linear(5, 1).double(), train_loss,
                               hg.optim.sgd(lr=0.1), hps, [(x, y)], 8,
                               lambda m, hp: ((m(x)[:, 0] - y) ** 2).mean())

    good = hypergradcheck(build(False), rtol_fd=1e-14, raise_exception=False)
    assert good.fd_unreliable == ["l2"] and good.ok, str(good)
    with pytest.warns(DetachedValueWarning, match="hyperparameter 'l2' through .item()"):
        bad = hypergradcheck(build(True), rtol_fd=1e-14, raise_exception=False)
    assert bad.fd_unreliable == ["l2"] and bad.fwd_vs_fd["l2"] > 0.3
    assert not bad.ok and "fwd_vs_fd l2" in "; ".join(bad.failures()), str(bad)


def test_a_zero_finite_difference_of_a_float32_problem_names_rounding() -> None:
    """A weight decay of 1e-8 moves a float32 validation loss by less than its rounding: its
    finite difference is exactly 0, and the Trainer's warning blamed the losses ("0 * hp,
    round(hp), a step function"; the methods probe)."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 5), torch.randn(32)
    p = hg.InnerProblem(torch.nn.Linear(5, 1), lambda m, b, hp: ((m(b[0])[:, 0] - b[1]) ** 2)
                        .mean(), hg.optim.sgd(lr="lr", weight_decay="wd"),
                        hg.HyperParams([hg.Scalar("lr", 0.1, "log"),
                                        hg.Scalar("wd", 1e-8, "log")]),
                        [(x, y)], 5, lambda m, hp: ((m(x)[:, 0] - y) ** 2).mean())
    with pytest.warns(hg.errors.ZeroHypergradientWarning,
                      match=r"\['wd'\] is exactly zero.*finite differences of a float32 "
                            r"problem may be the cause"), \
            pytest.warns(hg.errors.PrecisionWarning):
        hg.Trainer(p, method=hg.FiniteDifference(), mode=hg.Offline(outer_steps=1),
                   callbacks=[hg.run.Log(None)]).fit()


def test_a_lam_that_requires_grad_gives_a_plain_hypergradient() -> None:
    """FiniteDifference returned a hypergradient that required grad when ``lam`` did (every
    other method returns a plain tensor; the placement probe, 2026-12-07)."""
    problem = digits_case("momentum", "lr", **SMALL)
    lam = problem.init_raw().requires_grad_()
    fd = hg.FiniteDifference(1e-3)
    got = fd.hypergradient(problem, lam)
    assert not got.grad.requires_grad and not got.objective.requires_grad
    est = fd.estimate(problem, lam)
    assert not est.grad.requires_grad and not est.value.requires_grad
    assert lam.grad is None


def test_a_hyperparameter_on_its_domains_edge_is_differenced_on_one_side() -> None:
    """The kinds probe (2026-12-07): an identity weight decay starting at 0 could not be
    checked: the central step to -1e-6 was refused (weight decay >= 0), so finite differences
    and hypergradcheck failed. The side inside is differenced to second order."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (16,), generator=g)
    torch.manual_seed(0)
    p = hg.InnerProblem(torch.nn.Linear(4, 3).double(),
                        lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr", weight_decay="wd"),
                        hg.HyperParams([hg.Scalar("lr", 0.3, "log"), hg.Scalar("wd", 0.0)]),
                        [(x[:8], y[:8]), (x[8:], y[8:])], 6,
                        lambda m, hp: F.cross_entropy(m(x), y))
    lam = p.init_raw()
    rev = hg.ReverseMode().hypergradient(p, lam).grad
    fd = hg.FiniteDifference().hypergradient(p, lam).grad
    assert float((fd - rev).norm() / rev.norm()) < 1e-8
    assert hg.testing.hypergradcheck(p).ok
