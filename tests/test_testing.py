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
