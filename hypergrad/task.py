"""What a user brings: a :class:`Task`, an inner problem and how to judge its result.

The :class:`~hypergrad.InnerProblem` holds the model, the training and validation losses, the
data (mini-batches) and the hyperparameters; a Task adds what a report needs: a name, how to
evaluate a trained state, reference points to compare the learned hyperparameters with, and
task-specific extra results. :class:`~hypergrad.Trainer` takes a Task or a bare problem;
``hypergrad-run`` builds a Task from the ``task`` config group (``_target_``: a function that
returns one, yours included).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from .errors import HypergradWarning
from .problem import InnerProblem, InnerState

__all__ = ["Task"]

ONLINE_ROW = "online run (its own final state)"
"""The label of hypergrad-run's row of an online run's own final state."""
RESERVED_LABELS = ("initial", "learned", ONLINE_ROW)
"""The labels of hypergrad-run's own rows of the retrained table (and ``last ...``)."""


@dataclass
class Task:
    """An inner problem and how to judge its result.

    Attributes:
        problem: the :class:`~hypergrad.InnerProblem` (model, losses, data, hyperparameters).
        evaluate: ``state -> {metric: float}`` of a trained state (e.g. test loss and accuracy);
            logged after every outer step and for the retrained points of ``hypergrad-run``.
            ``None``: no metrics beyond the validation loss.
        references: ``{label: raw lam}`` baselines (a grid of constant learning rates, say)
            that ``hypergrad-run`` retrains and reports beside the learned point.
        extra: ``raw lam -> {name: result}``, task-specific results for the learned point (a
            closed-form check, a cleaner's F1), written to ``results.json``.
        name: for logs and ``results.json``.
        fingerprint: ``{key: JSON-like value}`` of what else defines a run of this task and
            none of the problem's tensors shows (a corpus's digest: its test text is read by
            ``evaluate`` only), stored in a run folder's checkpoint and compared on resume, and
            written to ``results.json`` by ``hypergrad-run``.

    Example:
        >>> Task(problem, evaluate=lambda s: {"val_acc": 0.9}, name="mine")  # doctest: +SKIP
    """

    problem: InnerProblem
    evaluate: Callable[[InnerState], Mapping[str, float]] | None = None
    references: dict[str, Tensor] = field(default_factory=dict)
    extra: Callable[[Tensor], dict[str, Any]] | None = None
    name: str = "task"
    fingerprint: dict[str, Any] = field(default_factory=dict)
    _said: set[str] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.problem, InnerProblem):
            raise TypeError(f"Task: problem must be an InnerProblem, got "
                            f"{type(self.problem).__name__}.")
        if self.evaluate is not None and not callable(self.evaluate):
            raise TypeError(f"Task: evaluate must be a callable state -> {{metric: float}}, got "
                            f"{type(self.evaluate).__name__}.")
        if not isinstance(self.fingerprint, Mapping):  # failed at fit time, as a list
            raise TypeError(f"Task: fingerprint must be a dict {{key: JSON-like value}}, got "
                            f"{type(self.fingerprint).__name__}.")
        if self.extra is not None and not callable(self.extra):
            raise TypeError(f"Task: extra must be a callable raw lam -> {{name: result}}, got "
                            f"{type(self.extra).__name__}.")
        self._check_references()

    def _check_references(self) -> None:
        """Each reference a raw point of the problem's shape, under a label of its own: one
        labelled "learned" replaced the learned row (and model_learned.pt) with its own, and
        one of another shape failed only after the tuning, naming lam and not the reference."""
        if not isinstance(self.references, Mapping):
            raise TypeError(f"Task: references must be a dict {{label: raw lam}}, got "
                            f"{type(self.references).__name__}.")
        hps = self.problem.hyperparams
        for label, lam in self.references.items():
            if not isinstance(label, str):  # was told it "is taken by the report's own rows"
                raise TypeError(f"Task: references label {label!r} must be a string, e.g. "
                                f"'ref {label}'.")
            if label in RESERVED_LABELS or label.startswith("last"):
                raise ValueError(f"Task: references label {label!r} is taken by the report's "
                                 f"own rows ({', '.join(RESERVED_LABELS)}, last ...); name it "
                                 f"otherwise, e.g. 'ref {label}'.")
            if not isinstance(lam, Tensor) or lam.shape != (hps.num_raw,):
                what = (f"shape {tuple(lam.shape)}" if isinstance(lam, Tensor)
                        else type(lam).__name__)
                raise ValueError(f"Task: references[{label!r}] is a {what}; a reference is a "
                                 f"raw point of the problem's K = {hps.num_raw} "
                                 f"hyperparameters, a tensor of shape ({hps.num_raw},): e.g. "
                                 f"problem.init_raw() with entries changed.")
            if not lam.is_floating_point():
                raise ValueError(f"Task: references[{label!r}] has dtype {lam.dtype}; a "
                                 f"reference is a raw point: a floating tensor, e.g. "
                                 f"problem.init_raw() with entries changed.")
            if lam.dtype != self.problem.dtype or lam.device != self.problem.device:
                # in the problem's dtype and on its device: a float32 reference of a float64
                # problem failed after the whole tuning, and no report was written (the Task
                # probe)
                self.references[label] = lam.detach().to(device=self.problem.device,
                                                         dtype=self.problem.dtype)

    def metrics(self, state: InnerState, fields: Mapping[str, Any] | None = None,
                reserved: Collection[str] = ()) -> dict[str, float]:
        """``evaluate(state)`` checked: a mapping of metric names (strings) to numbers, ``{}``
        without ``evaluate``. The metrics join a record and never overwrite its own fields: a
        name among ``fields`` (the record's values) whose value agrees with the record's (a
        classifier's evaluation of the validation split, the same loss) is left out; one that
        differs (a test loss reported as ``val_loss``; a validation loss of the model in eval
        mode where the objective runs it in train mode), or a name among ``reserved`` (the
        record's other fields), is kept as ``evaluate.<name>``, and a warning says so once."""
        if self.evaluate is None:
            return {}
        # a copy: problem.model(state) shares the state's storage, so an evaluate that trained
        # or scaled the model it was given wrote into the run (a CLI run saved all-zero
        # weights as model_learned.pt; online, the one run went on from them: the Task probe)
        if isinstance(state, InnerState):
            state = state._replace(
                params={k: v.detach().clone() for k, v in state.params.items()},
                buffers={k: v.detach().clone() for k, v in state.buffers.items()})
        out = self.evaluate(state)
        if not isinstance(out, Mapping):
            raise TypeError(f"Task {self.name!r}: evaluate returned {type(out).__name__} "
                            f"{out!r}; it must return a mapping {{metric name: number}}, e.g. "
                            f"{{'test_loss': 0.31}}.")
        fields = fields or {}
        # a diverged run's metrics are NaN for that reason, which the record already says
        diverged = any(isinstance(v, float) and not math.isfinite(v) for v in fields.values())
        metrics: dict[str, float] = {}
        for k, v in out.items():
            if not isinstance(k, str):
                raise TypeError(f"Task {self.name!r}: evaluate returned the metric name {k!r}; "
                                f"names must be strings.")
            try:
                x = float(v)
            except (TypeError, ValueError, OverflowError):  # an int past float's range too
                raise TypeError(f"Task {self.name!r}: evaluate returned {k}={v!r}; a metric "
                                f"must be a number (a float or a one-element tensor).") from None
            if not math.isfinite(x) and not diverged and f"finite:{k}" not in self._said:
                self._said.add(f"finite:{k}")
                warnings.warn(
                    f"Task {self.name!r}: evaluate returned {k}={x} for a model whose "
                    f"losses are finite: a mean over no examples (an empty test or validation "
                    f"split: check how evaluate cuts the data) or a metric that overflows; "
                    f"kept as it is.", HypergradWarning, stacklevel=3)
            own = fields.get(k)
            if k in fields and isinstance(own, (int, float)) and not isinstance(own, bool) and (
                    x == own or (math.isnan(x) and math.isnan(own))
                    or abs(x - own) <= 1e-5 * max(1.0, abs(own))):
                # the record's own value, computed again (NaN too: a diverged run's val_loss
                # was kept as evaluate.val_loss, told to rename a metric never written)
                continue
            if k in fields or k in reserved:
                if k not in self._said:
                    self._said.add(k)
                    was = f" (the record's: {own!r})" if k in fields else ""
                    # the bundled tasks' evaluate runs the model in eval mode: with
                    # val_mode='train' its val_loss is another number, not a misnamed metric
                    # (the advice to rename a metric the user never wrote: the reports probe)
                    why = (" The record's is the objective's, with the model in train mode "
                           "(the problem's val_mode='train': dropout on, BatchNorm on the "
                           "validation batch's statistics); an evaluate that runs it in eval "
                           "mode, as the bundled tasks' does, gives another value. Both are "
                           "kept." if k == "val_loss" and self.problem.val_mode == "train"
                           else " Rename the metric (e.g. 'test_loss') to keep it under a "
                           "name of its own.")
                    warnings.warn(
                        f"Task {self.name!r}: evaluate returned {k}={x:.6g}, a name the "
                        f"record uses for its own field{was}; kept as 'evaluate.{k}', the "
                        f"record's value unchanged.{why}", HypergradWarning, stacklevel=3)
                k = f"evaluate.{k}"
                if k in out:  # one of the user's own: one of the two would be lost
                    raise ValueError(
                        f"Task {self.name!r}: evaluate returned both {k[9:]!r} (a name the "
                        f"record uses, kept as {k!r}) and {k!r}; rename one of them.")
            metrics[k] = x
        return metrics
