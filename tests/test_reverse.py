"""Unrolled reverse mode, the reference: its final state is plain training's, its objective the
validation loss there, and it agrees with forward mode at every horizon (float64)."""

from __future__ import annotations

import pytest
import torch
from problems import SMALL, model_problem
from torch.utils._pytree import tree_flatten

import hypergrad as hg
from hypergrad.testing import digits_case, rel_err


@pytest.mark.parametrize("opt,kind", [("nesterov", "schedule"), ("adamw", "per_tensor_wd")])
def test_final_state_and_objective_are_plain_trainings(opt: str, kind: str) -> None:
    problem = digits_case(opt, kind, **SMALL)
    lam = problem.init_raw()
    res = hg.ReverseMode().hypergradient(problem, lam)
    plain = problem.run(lam)
    for a, b in zip(tree_flatten(res.state)[0], tree_flatten(plain)[0], strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        value = problem.objective(plain.params, plain.buffers, lam)
    assert torch.equal(res.objective, value)


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_agrees_with_forward_at_every_horizon(steps: int) -> None:
    problem = digits_case("momentum", "per_example", **{**SMALL, "steps": steps})
    lam = problem.init_raw()
    rev = hg.ReverseMode().hypergradient(problem, lam).grad
    assert rel_err(rev, hg.ForwardMode().hypergradient(problem, lam).grad) <= 1e-12


def test_reverse_replays_the_steps_random_draws() -> None:
    """Reverse mode re-runs each step inside its VJP: with dropout, the same masks as the
    forward sweep (else the two would differentiate different functions)."""
    problem = model_problem("dropout_mlp")
    lam = problem.init_raw()
    a, b = (hg.ReverseMode().hypergradient(problem, lam).grad for _ in range(2))
    assert torch.equal(a, b)
    assert rel_err(a, hg.ForwardMode().hypergradient(problem, lam).grad) <= 1e-12
