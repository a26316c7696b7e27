"""hypergrad: forward-mode gradient-based hyperparameter optimization for PyTorch.

Hypergradients of a validation objective with respect to training hyperparameters, by
differentiating through T steps of ordinary training (Franceschi et al., ICML 2017). Forward mode
carries the tangents of the training state with all K Hessian-vector products of a step batched in
one call; unrolled reverse mode and central finite differences are built in as references.

The public names, by what they are for:

- **Hyperparameters**: :class:`HyperParams` of :class:`Scalar`, :class:`Schedule`,
  :class:`PerTensor`, :class:`PerGroup`, :class:`PerExample`, :class:`Array`,
  :class:`InitScale`, :class:`InitWeights`.
- **The problem**: :class:`InnerProblem` (model, losses, data, inner optimizer from
  :mod:`hypergrad.optim`, hyperparameters), its :class:`InnerState`, and a :class:`Task` (a
  problem and how to evaluate its result).
- **How to differentiate** (:mod:`hypergrad.methods`): :class:`Method`, :class:`OnlineMethod`,
  :class:`HyperGradient`, :class:`ForwardMode`, :class:`ReverseMode`,
  :class:`FiniteDifference`, :class:`ImplicitDiff`, :class:`HD`, :class:`MARTHE`,
  :class:`AutoMode`.
- **Tuning** (:mod:`hypergrad.run`): :class:`Trainer` and what it returns, :class:`TrainResult`;
  its parts :class:`Offline`, :class:`Online`, :class:`Guards`, :class:`RunFolder`,
  :class:`Callback`; the outer optimizer :class:`SignDescent`.
- **Subpackages**: :mod:`~hypergrad.optim` (inner optimizers), :mod:`~hypergrad.methods`,
  :mod:`~hypergrad.distributed` (torchrun), :mod:`~hypergrad.testing` (oracles and checks),
  :mod:`~hypergrad.errors`. Strategy internals live in their modules: :mod:`hypergrad.hvp`
  (Hessian-vector products), :mod:`hypergrad.tangent`, :mod:`hypergrad.stepvjp`,
  :mod:`hypergrad.sparse`, :mod:`hypergrad.data`, :mod:`hypergrad.tasks` (bundled tasks).
"""

from __future__ import annotations

from . import distributed, errors, methods, optim, testing
from . import export as export  # hypergrad.export, as the docs name it (not in __all__)
from .hyperparams import (
    Array,
    HyperParams,
    InitScale,
    InitWeights,
    PerExample,
    PerGroup,
    PerTensor,
    Scalar,
    Schedule,
)
from .methods import (
    HD,
    MARTHE,
    AutoMode,
    FiniteDifference,
    ForwardMode,
    HyperGradient,
    ImplicitDiff,
    Method,
    OnlineMethod,
    ReverseMode,
)
from .problem import InnerProblem, InnerState
from .run import Callback, Guards, Offline, Online, RunFolder, SignDescent, Trainer, TrainResult
from .task import Task

__version__ = "0.1.0"

__all__ = [
    # hyperparameters
    "HyperParams", "Scalar", "Schedule", "PerTensor", "PerGroup", "PerExample", "Array",
    "InitScale", "InitWeights",
    # the problem
    "InnerProblem", "InnerState", "Task",
    # how to differentiate
    "Method", "OnlineMethod", "HyperGradient", "ForwardMode", "ReverseMode", "FiniteDifference",
    "ImplicitDiff", "HD", "MARTHE", "AutoMode",
    # tuning
    "Trainer", "TrainResult", "Offline", "Online", "Guards", "RunFolder", "Callback",
    "SignDescent",
    # subpackages
    "optim", "methods", "distributed", "testing", "errors",
]
