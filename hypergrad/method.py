"""What every way of differentiating returns, and the interfaces methods share.

- :class:`Method`: ``hypergradient(problem, lam)`` (:class:`~hypergrad.ForwardMode`,
  :class:`~hypergrad.ReverseMode`, :class:`~hypergrad.FiniteDifference`,
  :class:`~hypergrad.AutoMode`), and ``resolve(problem, mode)``: the method that actually runs
  (itself, or the one :class:`~hypergrad.AutoMode` picks) and why.
- :class:`OnlineMethod`: what online tuning needs (RTHO): ``init`` a run, ``step`` it, and the
  ``hypergradient_at`` any step; ``truncate`` forgets the carried derivatives. Its run state is
  a NamedTuple of tensors with at least ``state`` (the :class:`~hypergrad.InnerState`) and
  ``step`` (the index of the next inner step), so it can be checkpointed as a pytree.
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

from torch import Tensor

from .problem import InnerProblem, InnerState

__all__ = ["Method", "OnlineMethod", "HyperGradient"]


class HyperGradient(NamedTuple):
    """Result of a hypergradient computation.

    objective: ``E(w_T, lam)``, 0-d. grad: ``dE/dlam``, shape ``(K,)`` (raw, unconstrained space).
    state: the inner state at step ``T``. info: what an approximate method reports about
    itself (:class:`~hypergrad.ImplicitDiff`: the solver's residual and iterations); ``None``
    for the others.
    """

    objective: Tensor
    grad: Tensor
    state: InnerState
    info: dict[str, Any] | None = None


class Method(abc.ABC):
    """How to differentiate the inner training with respect to ``lam``. All methods run the
    problem's one step function, so their agreement is a real test."""

    name: str = "abstract"

    @abc.abstractmethod
    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        """Train ``problem.steps`` inner steps at ``lam`` and return ``dE/dlam``."""

    def resolve(self, problem: InnerProblem, mode: str = "offline",
                memory_budget: float | None = None) -> tuple[Method, str]:
        """The method that runs ``problem`` in ``mode`` (``"offline"`` or ``"online"``) and why
        (empty: it was given). A concrete method is itself."""
        return self, ""


class OnlineMethod(Method):
    """A method that gives hypergradients during one run (online tuning)."""

    @abc.abstractmethod
    def init(self, problem: InnerProblem, lam: Tensor, state: InnerState | None = None) -> Any:
        """The run state at step 0 (from ``state``, default the problem's initial state)."""

    @abc.abstractmethod
    def step(self, problem: InnerProblem, run: Any, lam: Tensor) -> Any:
        """One inner step of the run."""

    @abc.abstractmethod
    def hypergradient_at(self, problem: InnerProblem, run: Any,
                         lam: Tensor) -> tuple[Tensor, Tensor]:
        """``(E, dE/dlam)`` at the run's current step."""

    @abc.abstractmethod
    def truncate(self, run: Any) -> Any:
        """The run with its carried derivative information reset (truncation)."""

    def run(self, problem: InnerProblem, run: Any, lam: Tensor, stop: int | None = None) -> Any:
        """Steps until ``stop`` (default: the horizon ``T``)."""
        for _ in range(run.step, problem.steps if stop is None else stop):
            run = self.step(problem, run, lam)
        return run

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        r = self.run(problem, self.init(problem, lam), lam)
        value, grad = self.hypergradient_at(problem, r, lam)
        return HyperGradient(value, grad, r.state)
