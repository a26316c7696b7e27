"""Review of the hyperparameter kinds, their transforms and the search box (float64): silent
wrong answers found and fixed, each test failing before its fix, and one check of every kind
and transform in one problem (forward = reverse = finite differences)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fixtures import TINY

import hypergrad as hg
from hypergrad.run.bounds import Bounds
from hypergrad.testing import digits_case


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
