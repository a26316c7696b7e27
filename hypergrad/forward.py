"""Forward mode (Franceschi et al. 2017, RTHO/forward HO): carry ``Z_t = d s_t / d lam``.

Per step, with all K columns at once:

- ``G_t = H_t Z^w_{t-1} + (d^2 L / dw dlam) I_K`` from the HVP strategy (one batched call);
- ``Z_t = dU/ds Z_{t-1} + dU/dg G_t + dU/dh dh_t/dlam`` from ``torch.func.jvp`` of the optimizer's
  pure update under ``vmap`` (no hand-written derivative);
- at any step, ``dE/dlam = sum <Z_T, dE/ds_T> + dE/dlam|direct``.

Memory is ``O(K |s|)``, independent of ``T``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.func import grad_and_value, jvp, vmap
from torch.utils._pytree import tree_map

from .hvp import HVPStrategy, VmapVJP
from .method import HyperGradient, Method
from .problem import InnerProblem, InnerState

__all__ = ["ForwardMode", "ForwardState"]


class ForwardState(NamedTuple):
    """The inner state, its tangents (each tensor with a leading axis of size K) and the index of
    the next step."""

    state: InnerState
    tangents: InnerState
    step: int


class ForwardMode(Method):
    """Forward-mode hypergradients.

    Args:
        hvp: how to compute the K Hessian-vector products of a step (default :class:`VmapVJP`).

    Example:
        >>> fm = ForwardMode()
        >>> hg = fm.hypergradient(problem, problem.init_raw())  # doctest: +SKIP
        >>> # or step by step, with the hypergradient available at any step:
        >>> fs = fm.init(problem, lam); fs = fm.step(problem, fs, lam)  # doctest: +SKIP
        >>> E, dE = fm.hypergradient_at(problem, fs, lam)  # doctest: +SKIP
    """

    name = "forward"

    def __init__(self, hvp: HVPStrategy | None = None) -> None:
        if hvp is not None and not isinstance(hvp, HVPStrategy):
            raise TypeError(f"ForwardMode: hvp must be an HVPStrategy such as VmapVJP(), got "
                            f"{type(hvp).__name__}.")
        self.hvp = hvp if hvp is not None else VmapVJP()

    def init(self, problem: InnerProblem, lam: Tensor,
             state: InnerState | None = None) -> ForwardState:
        """Start at ``state`` (default: the initial state) with zero tangents, ``Z_0 = 0``."""
        problem.check(lam)
        s = problem.initial_state() if state is None else state
        k = problem.num_hyperparams
        z = tree_map(lambda v: torch.zeros((k, *v.shape), dtype=v.dtype, device=v.device), s)
        return ForwardState(s, z, 0)

    def step(self, problem: InnerProblem, fs: ForwardState, lam: Tensor) -> ForwardState:
        """One inner step of the state and of all K tangent columns."""
        t = fs.step
        s, z = fs.state, fs.tangents
        batch = problem.batch(t)
        eye = torch.eye(lam.shape[0], dtype=lam.dtype, device=lam.device)

        def loss(p: Any, b: Any, lm: Tensor) -> Any:
            return problem.train_objective(p, b, lm, t, batch)

        g, new_b, G, zb = self.hvp(loss, s.params, s.buffers, lam, z.params, z.buffers, eye)

        def update(g_: Any, opt: Any, p: Any, lm: Tensor) -> Any:
            return problem.update(g_, opt, p, lm, t)

        def column(zg: Any, zo: Any, zp: Any, e: Tensor) -> Any:
            return jvp(update, (g, s.opt, s.params, lam), (zg, zo, zp, e))

        (params, opt), (zp, zo) = vmap(column, out_dims=(None, 0))(G, z.opt, z.params, eye)
        return ForwardState(InnerState(params, new_b, opt), InnerState(zp, zb, zo), t + 1)

    def run(self, problem: InnerProblem, fs: ForwardState, lam: Tensor,
            stop: int | None = None) -> ForwardState:
        """Steps until ``stop`` (default: the horizon ``T``)."""
        for _ in range(fs.step, problem.steps if stop is None else stop):
            fs = self.step(problem, fs, lam)
        return fs

    @staticmethod
    def hypergradient_at(problem: InnerProblem, fs: ForwardState,
                         lam: Tensor) -> tuple[Tensor, Tensor]:
        """``(E, dE/dlam)`` at the current step: ``Z^T grad_s E + dE/dlam|direct``."""
        s, z = fs.state, fs.tangents
        (dp, db, direct), value = grad_and_value(problem.objective, argnums=(0, 1, 2))(
            s.params, s.buffers, lam)
        hg = direct.clone()
        for zs, ds in ((z.params, dp), (z.buffers, db)):
            for name, d in ds.items():
                hg = hg + zs[name].reshape(hg.shape[0], -1) @ d.reshape(-1)
        return value.detach(), hg.detach()

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        fs = self.run(problem, self.init(problem, lam), lam)
        value, hg = self.hypergradient_at(problem, fs, lam)
        return HyperGradient(value, hg, fs.state)

    def __repr__(self) -> str:
        return f"ForwardMode(hvp={self.hvp!r})"
