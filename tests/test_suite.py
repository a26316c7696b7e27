"""experiments/suite.py: the problems build as stated (K, a box for every hyperparameter, the
initial point inside it, finite losses), and the committed dev / eval split is the one its seed
draws, with the committed hash."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import suite  # noqa: E402

from hypergrad.errors import HypergradWarning  # noqa: E402
from hypergrad.hyperparams import TRANSFORMS  # noqa: E402


def test_the_split_is_the_one_its_seed_draws_and_its_hash_is_committed() -> None:
    assert suite.make_split(suite.SPLIT_SEED) == suite.SPLIT
    assert suite.split_hash(suite.SPLIT) == suite.SPLIT_HASH
    dev, ev = set(suite.SPLIT["dev"]), set(suite.SPLIT["eval"])
    assert not dev & ev and dev | ev == set(suite.PROBLEMS)
    assert len(suite.PROBLEMS) >= 12 and len(ev) >= 6
    low = [n for n in ev if suite.PROBLEMS[n].K <= suite.LOW_K]
    assert 2 * len(low) >= len(ev)  # at least half of the evaluation problems with K <= 15
    ks = [p.K for p in suite.PROBLEMS.values()]
    assert min(ks) == 2 and max(ks) >= 200
    assert {p.task for p in suite.PROBLEMS.values()} == {"classification", "regression"}


@pytest.mark.parametrize("name", list(suite.PROBLEMS))
def test_every_problem_builds_with_its_box_and_a_finite_loss(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypergradWarning)
        task = suite.build(name, 0)
    p = task.problem
    assert p.num_hyperparams == suite.PROBLEMS[name].K and p.steps <= 200
    assert set(task.bounds) == set(p.hyperparams.names)
    lam = p.init_raw()
    for item in p.hyperparams.items:  # the initial point lies inside the box
        lo, hi = task.bounds[item.name]
        v = TRANSFORMS[item.transform][0](lam[p.hyperparams.slices[item.name]])
        assert bool((v >= lo * (1 - 1e-6)).all() and (v <= hi * (1 + 1e-6)).all()), item.name
    state = p.run(lam)
    val = float(p.objective(state.params, state.buffers, lam))
    test = task.test(state)
    assert torch.isfinite(torch.tensor([val, test["test_loss"]])).all()
