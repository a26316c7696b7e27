"""Review of the approximate and online methods (float64 unless said): silent wrong answers
found and fixed, each test failing before its fix."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.testing import rel_err


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
