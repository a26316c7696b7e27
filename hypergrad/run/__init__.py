"""The outer loop and its parts: :class:`Trainer` (the loop), :class:`Offline` / :class:`Online`
(when to update; :class:`SearchSettings`: the default search's settings), :class:`Guards`
(divergence, backtracking, clipping, bounds, budgets), :class:`RunFolder` (lock, checkpoints,
metrics, resume), callbacks (:class:`Log`, :class:`Progress`, :class:`TensorBoard`), outer
optimizers (:class:`QuasiNewton` and :class:`Surrogate`, the defaults, both
:class:`SearchOptimizer`, and :class:`SignDescent`) and the single-process :class:`Strategy`."""

from __future__ import annotations

from .bounds import Bounds
from .callbacks import Callback, Log, Progress, TensorBoard
from .folder import SAFE_TO_CHANGE, RunFolder
from .guards import Guards
from .modes import Mode, Offline, Online, SearchSettings
from .outer import OuterOptimizerFactory, QuasiNewton, SearchOptimizer, SignDescent
from .strategy import Strategy
from .surrogate import Surrogate
from .trainer import Trainer, TrainResult

__all__ = ["Trainer", "TrainResult", "Offline", "Online", "Mode",
           "SearchSettings", "Guards", "Bounds",
           "RunFolder", "SAFE_TO_CHANGE", "Callback", "Log", "Progress", "TensorBoard",
           "SignDescent", "SearchOptimizer", "QuasiNewton", "Surrogate", "OuterOptimizerFactory",
           "Strategy"]
