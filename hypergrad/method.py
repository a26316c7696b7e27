"""What every way of differentiating returns, and the interface they share."""

from __future__ import annotations

import abc
from typing import NamedTuple

from torch import Tensor

from .problem import InnerProblem, InnerState

__all__ = ["Method", "HyperGradient"]


class HyperGradient(NamedTuple):
    """Result of a hypergradient computation.

    objective: ``E(w_T, lam)``, 0-d. grad: ``dE/dlam``, shape ``(K,)`` (raw, unconstrained space).
    state: the inner state at step ``T``.
    """

    objective: Tensor
    grad: Tensor
    state: InnerState


class Method(abc.ABC):
    """How to differentiate the inner training with respect to ``lam``: :class:`ForwardMode`,
    :class:`ReverseMode` or :class:`FiniteDifference`. All run the problem's one step function."""

    name: str = "abstract"

    @abc.abstractmethod
    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        """Train ``problem.steps`` inner steps at ``lam`` and return ``dE/dlam``."""
