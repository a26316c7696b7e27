"""Reverse mode, the reference: store the states ``s_0..s_T`` (not the activation graph) and run
the adjoint recursion ``a_{t-1} = a_t^T d s_t / d s_{t-1}``, ``dE/dlam += a_t^T d s_t / d lam``
with one vector-Jacobian product of the step per t (Maclaurin et al. 2015; Franceschi et al.
2017). Memory ``O(T |s|)``; time about one gradient and one double-backward per step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.func import grad_and_value, vjp
from torch.utils._pytree import tree_map

from .method import HyperGradient, Method
from .problem import InnerProblem, InnerState
from .randomness import second_order

__all__ = ["ReverseMode"]


class ReverseMode(Method):
    """Unrolled reverse-mode hypergradients (exact, memory linear in ``T``)."""

    name = "reverse"

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        problem.check(lam)
        states = [problem.initial_state()]
        for t in range(problem.steps):
            states.append(problem.step(states[-1], lam, t))
        final = states[-1]
        (dp, db, dlam), value = grad_and_value(problem.objective, argnums=(0, 1, 2))(
            final.params, final.buffers, lam)
        adj = InnerState(dp, db, tree_map(torch.zeros_like, final.opt))
        hg = dlam
        for t in reversed(range(problem.steps)):
            states.pop()

            def step(s: Any, lm: Tensor, t: int = t) -> Any:
                return problem.step(s, lm, t)

            with second_order():  # the step's VJP differentiates its gradient
                _, vjp_fn = vjp(step, states[-1], lam)  # type: ignore[misc]
                adj, dl = vjp_fn(adj)
            hg = hg + dl
        return HyperGradient(value.detach(), hg.detach(), final)
