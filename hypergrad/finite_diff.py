"""Central finite differences over the same inner loop: the check every AD path is held to."""

from __future__ import annotations

import torch
from torch import Tensor

from .method import HyperGradient, Method
from .problem import InnerProblem

__all__ = ["FiniteDifference"]


class FiniteDifference(Method):
    """``dE/dlam_k ~ (E(lam + eps e_k) - E(lam - eps e_k)) / (2 eps)``: 2K inner runs.

    Args:
        eps: step in raw (unconstrained) space. In float64, 1e-5 balances truncation
            (``O(eps^2)``) and rounding (``O(1e-16 / eps)``) errors.
    """

    name = "finite_difference"

    def __init__(self, eps: float = 1e-5) -> None:
        if not eps > 0:
            raise ValueError(f"FiniteDifference: eps={eps!r} must be > 0, e.g. 1e-5 in float64.")
        self.eps = float(eps)

    def objective_at(self, problem: InnerProblem, lam: Tensor) -> Tensor:
        s = problem.run(lam)
        with torch.no_grad():
            return problem.objective(s.params, s.buffers, lam)

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        problem.check(lam)
        state = problem.run(lam)
        with torch.no_grad():
            value = problem.objective(state.params, state.buffers, lam)
        hg = torch.zeros_like(lam)
        for k in range(lam.shape[0]):
            e = torch.zeros_like(lam)
            e[k] = self.eps
            hg[k] = (self.objective_at(problem, lam + e)
                     - self.objective_at(problem, lam - e)) / (2 * self.eps)
        return HyperGradient(value, hg, state)
