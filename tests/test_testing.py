"""hypergradcheck reports agreement, and fails loudly when a strategy is wrong."""

from __future__ import annotations

import math

import pytest

import hypergrad as hg
from hypergrad.testing import HypergradcheckError, digits_case, hypergradcheck

SMALL = dict(steps=4, n_train=16, batch_size=8, hidden=6, n_val=16)


class _Broken(hg.hvp.VmapVJP):
    """Scales every Hessian-vector product by 1.001: a subtle bug."""

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        g, nb, G, zb = super().__call__(*args, **kwargs)
        return g, nb, {k: 1.001 * v for k, v in G.items()}, zb


def test_report_table() -> None:
    rep = hypergradcheck(digits_case("adam", "schedule", **SMALL))
    text = str(rep)
    assert rep.ok and "fwd_vs_rev" in text and "lr" in text and text.endswith(")")


def test_detects_a_wrong_strategy() -> None:
    problem = digits_case("momentum", "lr", **SMALL)
    with pytest.raises(HypergradcheckError, match="FAILED"):
        hypergradcheck(problem, strategies=[_Broken()])
    rep = hypergradcheck(problem, strategies=[_Broken()], raise_exception=False)
    assert rep.max("strategies") > 1e-6 and not rep.ok


def test_a_nan_error_fails_the_check() -> None:
    """A NaN hypergradient makes every error NaN; ``NaN > tol`` is False, so the report once
    said ok (found with schedule-free AdamW's square root at a zero second moment)."""
    from hypergrad.testing import CheckReport

    nan = float("nan")
    tol = {"fwd_vs_rev": 1e-8, "fwd_vs_fd": 1e-5, "strategies": 1e-10}
    good = CheckReport({"lr": 1e-15}, {"lr": 1e-9}, {"lr": 0.0}, tol, None, {"lr": 1e-7},
                       {"lr": 1e-5})
    assert good.ok and good.max("fwd_vs_rev") == 1e-15
    for which in ("fwd_vs_rev", "fwd_vs_fd", "strategies"):
        errs = {"fwd_vs_rev": {"lr": 1e-15}, "fwd_vs_fd": {"lr": 1e-9}, "strategies": {"lr": 0.0}}
        errs[which] = {"lr": nan}
        bad = CheckReport(errs["fwd_vs_rev"], errs["fwd_vs_fd"], errs["strategies"], tol, None,
                          {"lr": 1e-7}, {"lr": 1e-5})
        assert not bad.ok, which
        assert math.isnan(bad.max(which))


def test_a_nearly_zero_group_is_judged_by_the_rounding_of_the_whole() -> None:
    """Adam with a weight on its training loss (Adam is invariant to the loss's scale up to
    eps): that group's hypergradient is 5e-8 beside the learning rate's 0.2, and a correct
    check FAILED on rounding (strategies 1.6e-10 of the group's own norm), without saying
    which comparison failed."""
    import torch
    import torch.nn.functional as F

    from hypergrad.data import MiniBatches
    from hypergrad.tasks import digits_data, mlp
    from hypergrad.testing import CheckReport, group_rel_errs

    data = digits_data(n_train=32, n_val=32, dtype=torch.float64)
    torch.manual_seed(0)
    p = hg.InnerProblem(
        mlp([64, 8, 10]).double(),
        lambda m, b, hp: hp["scale"] * F.cross_entropy(m(b[0]), b[1]), hg.optim.adam(lr="lr"),
        hg.HyperParams([hg.Scalar("lr", 0.01, transform="log"),
                        hg.Scalar("scale", 1.0, transform="log")]),
        MiniBatches(data.x_train, data.y_train, batch_size=8), steps=8,
        val_loss=lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))
    rep = hypergradcheck(p)  # raised HypergradcheckError
    assert rep.grad is not None and abs(float(rep.grad[1])) < 1e-6 * abs(float(rep.grad[0]))
    # a real error in that group is still found: 10 % of it
    hps, ref = p.hyperparams, rep.grad
    wrong = ref.clone()
    wrong[1] *= 1.1
    assert group_rel_errs(hps, wrong, ref, 1e-6)["scale"] > 1e-3
    tol = {"fwd_vs_rev": 1e-8, "fwd_vs_fd": 1e-5, "strategies": 1e-10}
    bad = CheckReport({"lr": 1e-15, "scale": 3e-8}, {"lr": 1e-9, "scale": 1e-9},
                      {"lr": 0.0, "scale": 0.0}, tol, None, {"lr": 1e-7, "scale": 1e-7},
                      {"lr": 1e-5, "scale": 1e-5})
    assert bad.failures() == ["fwd_vs_rev scale: 3.00e-08 > 1e-08"]
    assert "FAILED [fwd_vs_rev scale: 3.00e-08 > 1e-08]" in str(bad)
