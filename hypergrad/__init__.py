"""hypergrad: forward-mode gradient-based hyperparameter optimization for PyTorch.

Hypergradients of a validation objective with respect to training hyperparameters, by
differentiating through T steps of ordinary training (Franceschi et al., ICML 2017). Forward mode
carries the tangents of the training state with all K Hessian-vector products of a step batched in
one call; unrolled reverse mode and central finite differences are built in as references.
"""

from __future__ import annotations

from . import distributed, errors, optim, testing
from .choice import AutoMethod, AutoMode, estimate_memory, make_method
from .finite_diff import FiniteDifference
from .forward import ForwardMode, ForwardState
from .hvp import BatchedAutograd, ColumnLoop, ForwardOverReverse, HVPStrategy, VmapVJP
from .hyperparams import (
    HyperParams,
    InitScale,
    InitWeights,
    PerExample,
    PerTensor,
    Scalar,
    Schedule,
)
from .hyperparams import Tensor_ as Tensor
from .implicit import CG, FixedPoint, ImplicitDiff, LinearSolver, Neumann
from .method import HyperGradient, Method, OnlineMethod
from .model import ModelFn
from .online import HD, MARTHE, HDState
from .optim import adam, adamw, sgd
from .problem import InnerProblem, InnerState
from .reverse import ReverseMode
from .sparse import SparseOperator, load_npz, load_svmlight
from .stepvjp import DoubleBackward, MixedMode, StepVJP
from .tangent import JVP, AutoTangent, ClosedForm, DiagonalJacobian, TangentRule
from .trainer import SignDescent, Trainer, TrainResult, choose_method

__version__ = "0.1.0"

__all__ = [
    "HyperParams", "Scalar", "PerTensor", "Schedule", "PerExample", "Tensor", "InitScale",
    "InitWeights",
    "optim", "testing", "distributed", "sgd", "adam", "adamw",
    "InnerProblem", "InnerState", "ModelFn",
    "Method", "OnlineMethod", "AutoMode", "HyperGradient",
    "ForwardMode", "ForwardState", "ReverseMode", "FiniteDifference",
    "StepVJP", "DoubleBackward", "MixedMode",
    "ImplicitDiff", "LinearSolver", "CG", "Neumann", "FixedPoint",
    "HD", "HDState", "MARTHE",
    "HVPStrategy", "VmapVJP", "BatchedAutograd", "ForwardOverReverse", "ColumnLoop",
    "TangentRule", "AutoTangent", "ClosedForm", "DiagonalJacobian", "JVP",
    "Trainer", "TrainResult", "SignDescent", "choose_method", "make_method", "estimate_memory",
    "AutoMethod", "errors",
    "SparseOperator", "load_npz", "load_svmlight",
]
