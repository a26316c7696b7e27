"""Online hypergradients beyond RTHO: greedy one-step hypergradient descent (HD) and MARTHE.

Both are :class:`~hypergrad.OnlineMethod` s: they step with training and give a hypergradient at
any step, for tuning during one run.

- :class:`HD` (Baydin et al., ICLR 2018, "Online learning rate adaptation with hypergradient
  descent"): the derivative of ``E(s_t)`` through the **last** step only, with the state before
  it held fixed: ``h_t = (d s_t / d lam |_{s_{t-1}})^T grad_s E(s_t) + dE/dlam|direct``. Here
  ``E`` is the validation objective, as in MARTHE's framing (Baydin et al. use the training
  loss's next gradient). One vector-Jacobian product of the step, with respect to ``lam`` only,
  from the previous state kept beside the current one (memory ``2 |s|``, independent of K).
- :class:`MARTHE` (Donini et al., ICLR 2020, "MARTHE: Scheduling the learning rate via online
  hypergradients", eq. 9): forward mode with a discount, ``Z_t = mu A_t Z_{t-1} + B_t`` where
  ``A_t = d s_t / d s_{t-1}`` and ``B_t = d s_t / d lam``: the tangents are multiplied by ``mu``
  before each step. ``mu = 1`` is RTHO (:class:`~hypergrad.ForwardMode`), ``mu = 0`` keeps only
  the last step, which is HD with the validation gradient. Memory and cost as forward mode.
  The paper also adapts ``mu`` online; here it is fixed.

The two limits are checked against the independent code paths (HD's VJP, plain forward mode)
in tests/test_online.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.func import grad_and_value, vjp
from torch.utils._pytree import tree_map

from ..errors import is_real
from ..hvp import HVPStrategy
from ..problem import InnerProblem, InnerState
from ..tangent import TangentRule
from .base import MemoryEstimate, OnlineMethod, Sizes, checked, within_horizon
from .forward import ForwardMode, ForwardState

__all__ = ["HD", "HDState", "MARTHE"]


class HDState(NamedTuple):
    """The run of :class:`HD`: the current state, the one before the last step (the initial
    state at step 0), and the index of the next step."""

    state: InnerState
    prev: InnerState
    step: int


class HD(OnlineMethod, name="hd"):
    """Greedy one-step hypergradients (hypergradient descent), see the module docstring.

    At step 0 (no step taken) the hypergradient is the initial state's own derivative: the
    direct term, plus ``(d s_0 / d lam)^T grad_s E`` for initialisation hyperparameters.

    Example:
        >>> hd = HD()
        >>> run = hd.init(problem, lam)                  # doctest: +SKIP
        >>> run = hd.step(problem, run, lam)             # doctest: +SKIP
        >>> E, dE = hd.hypergradient_at(problem, run, lam)  # doctest: +SKIP
    """

    reaches_initial_weights = False

    def init(self, problem: InnerProblem, lam: Tensor, state: InnerState | None = None) -> HDState:
        """The run at step 0 from ``state`` (default the initial one): as
        :meth:`ForwardMode.init <hypergrad.ForwardMode.init>`, a state taken at step t starts
        a new run at step 0 (``._replace(step=t)`` continues from step t)."""
        checked(type(self).__name__, problem, lam)
        problem.begin_run()  # a new inner run; the last batch read stays for the step's VJP
        s = problem.initial_state(lam) if state is None else state
        return HDState(s, s, 0)

    def step(self, problem: InnerProblem, run: HDState, lam: Tensor) -> HDState:
        """One plain inner step; the state before it is kept for the hypergradient."""
        within_horizon(type(self).__name__, problem, run.step)
        with torch.no_grad():
            new = problem.step(run.state, lam, run.step)
        return HDState(new, run.state, run.step + 1)

    def hypergradient_at(self, problem: InnerProblem, run: HDState,
                         lam: Tensor) -> tuple[Tensor, Tensor]:
        """``(E(s_t), h_t)``: ``h_t = (d s_t / d lam |_{s_{t-1}})^T grad_s E(s_t) + direct``."""
        s = run.state
        (dp, db, direct), value = grad_and_value(problem.objective, argnums=(0, 1, 2))(
            s.params, s.buffers, lam)
        cot = InnerState(dp, db, tree_map(torch.zeros_like, s.opt))
        if run.step == 0:
            if not problem.init_items:
                return value.detach(), direct.detach()
            _, vjp_init = vjp(problem.initial_state, lam)  # type: ignore[misc]
            (dl,) = vjp_init(cot)
            return value.detach(), (direct + dl).detach()
        t, prev = run.step - 1, run.prev

        def last_step(lm: Tensor) -> InnerState:
            return problem.step(prev, lm, t)

        with problem.second_order():  # the step's VJP differentiates its gradient
            _, vjp_fn = vjp(last_step, lam)  # type: ignore[misc]
            (dl,) = vjp_fn(cot)
        return value.detach(), (direct + dl).detach()

    def truncate(self, run: HDState) -> HDState:
        """HD carries no derivative beyond the last step: the run unchanged."""
        return run

    def fingerprint(self) -> dict[str, Any]:
        """Greedy one-step hypergradients are not forward mode's: a resume keeps HD."""
        return {"method": "hd"}

    def estimate_memory(self, problem: InnerProblem,
                        sizes: Sizes | None = None) -> MemoryEstimate:
        """``2 |s| + max(v, o)``: the state and the state before the last step, and the larger
        of the last step's vector-Jacobian product ``v`` (:meth:`Sizes.step_vjp`, counted on
        fake tensors) and the validation loss's gradient ``o`` (:meth:`Sizes.objective`)."""
        sz = Sizes.of(problem) if sizes is None else sizes
        held = 2 * sz.state
        total = held + max(sz.step_vjp(), sz.objective())
        return MemoryEstimate(self.name, total, sz.state, sz.activations, 0,
                              total - held - sz.activations)

    def __repr__(self) -> str:
        return "HD()"


class MARTHE(ForwardMode, name="marthe"):
    """MARTHE with a fixed discount ``mu`` (see the module docstring): forward mode whose
    tangents are multiplied by ``mu`` before each step, ``Z_t = mu A_t Z_{t-1} + B_t``.

    Args:
        mu: the discount in ``[0, 1]``: 1 is RTHO / forward mode, 0 the one-step greedy
            hypergradient (HD with the validation gradient).
        hvp, tangent, skip_zero_columns, compile: as :class:`~hypergrad.ForwardMode`.

    Example:
        >>> MARTHE(mu=0.9)
        MARTHE(mu=0.9)
    """

    def __init__(self, mu: float = 0.9, hvp: HVPStrategy | None = None, *,
                 tangent: TangentRule | None = None, skip_zero_columns: bool = True,
                 compile: bool | None = None) -> None:
        if (not is_real(mu)
                or not 0 <= float(mu) <= 1):
            raise ValueError(f"MARTHE: mu={mu!r} must be a number in [0, 1] (1: RTHO / forward "
                             f"mode, 0: greedy one-step HD), e.g. mu=0.9.")
        super().__init__(hvp, tangent=tangent, skip_zero_columns=skip_zero_columns,
                         compile=compile)
        self.mu = float(mu)

    def step(self, problem: InnerProblem, fs: ForwardState, lam: Tensor, *,
             columns: Sequence[int] | None = None) -> ForwardState:
        """One step of ``Z_t = A_t (mu Z_{t-1}) + B_t``."""
        if self.mu == 0.0:  # exact zeros (0 * inf would be nan)
            fs = fs._replace(tangents=tree_map(torch.zeros_like, fs.tangents))
        elif self.mu != 1.0:
            fs = fs._replace(tangents=tree_map(lambda z: z * self.mu, fs.tangents))
        return super().step(problem, fs, lam, columns=columns)

    @property
    def reaches_initial_weights(self) -> bool:  # type: ignore[override]
        """``mu = 0`` cuts the tangents at every step (HD): the initial weights' are 0."""
        return self.mu > 0

    def check(self, problem: InnerProblem) -> None:
        """Initialisation hyperparameters are refused for ``mu < 1`` too: their tangents are
        discounted at every step, so their hypergradient is ``mu^T`` of the exact one (0.3^4 of
        it at T = 4; at mu = 0.9 and T = 300, 2e-14), and tuning would not move them."""
        super().check(problem)
        init = [h.name for h in problem.hyperparams.init_items]
        if init and 0 < self.mu < 1 and problem.steps > 0:
            factor = self.mu ** problem.steps
            raise ValueError(
                f"{self!r}: {init} set the initial weights, whose hypergradient MARTHE "
                f"discounts by mu^T = {self.mu:g}^{problem.steps} = {factor:.3g} (their "
                f"tangents are multiplied by mu at every step), so tuning would barely move "
                f"them. Use ForwardMode() or ReverseMode() for them (MARTHE(mu=1) is forward "
                f"mode), or drop them from the hyperparameters.")

    def _extra_held(self, k: int, state: int) -> float:
        """The discounted tangents ``mu Z`` are a copy beside the run's ``Z`` (``mu < 1``)."""
        return 0.0 if self.mu == 1.0 else float(k * state)

    def fingerprint(self) -> dict[str, Any]:
        """The discount (a resume must keep it; ``mu = 1`` is forward mode)."""
        return {} if self.mu == 1.0 else {"method": "marthe", "method.mu": self.mu}

    def __repr__(self) -> str:
        given = "" if self.compile is None else f", compile={self.compile}"
        return f"MARTHE(mu={self.mu:g}{given})"
