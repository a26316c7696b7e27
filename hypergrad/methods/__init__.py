"""How to differentiate the inner training: one module per method, each owning its name, its
memory estimate, what a resume must match and how it runs across ranks
(:mod:`hypergrad.methods.base`), and one registry of them by name.

=====================  ===================================================================
``forward``            :class:`ForwardMode`: tangents carried forward, memory independent of T
``reverse``            :class:`ReverseMode`: the unrolled reference (truncated, checkpointed)
``finite_difference``  :class:`FiniteDifference`: central differences, the check
``implicit``           :class:`ImplicitDiff`: the implicit function theorem at a converged state
``hd``                 :class:`HD`: greedy one-step hypergradients (online)
``marthe``             :class:`MARTHE`: discounted forward mode (online)
``auto``               :class:`AutoMode`: forward, reverse or checkpointed reverse, per problem
=====================  ===================================================================

A method of your own: ``class Mine(hypergrad.Method, name="mine")``; see docs/extending.md.
"""

from __future__ import annotations

from .auto import AutoMode, choose_method
from .base import (
    ENTRY_POINTS,
    HyperGradient,
    MemoryEstimate,
    Method,
    OnlineMethod,
    Sizes,
    create,
    register,
    registered,
)
from .finite_diff import FDEstimate, FiniteDifference
from .forward import ColumnPlan, ForwardMode, ForwardState, initial_tangents
from .implicit import CG, FixedPoint, ImplicitDiff, LinearSolver, Neumann
from .memory import available_memory, check_memory, estimate_memory
from .online import HD, MARTHE, HDState
from .reverse import ReverseMode

__all__ = [
    "Method", "OnlineMethod", "HyperGradient", "register", "registered", "create",
    "ENTRY_POINTS", "MemoryEstimate", "Sizes", "estimate_memory", "check_memory",
    "available_memory",
    "ForwardMode", "ForwardState", "ColumnPlan", "initial_tangents", "ReverseMode",
    "FiniteDifference", "FDEstimate", "ImplicitDiff", "LinearSolver", "CG", "Neumann",
    "FixedPoint", "HD", "HDState", "MARTHE", "AutoMode", "choose_method",
]
