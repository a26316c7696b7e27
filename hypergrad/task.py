"""What a user brings: a :class:`Task`, an inner problem and how to judge its result.

The :class:`~hypergrad.InnerProblem` holds the model, the training and validation losses, the
data (mini-batches) and the hyperparameters; a Task adds what a report needs: a name, how to
evaluate a trained state, reference points to compare the learned hyperparameters with, and
task-specific extra results. :class:`~hypergrad.Trainer` takes a Task or a bare problem;
``hypergrad-run`` builds a Task from the ``task`` config group (``_target_``: a function that
returns one, yours included).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from .problem import InnerProblem, InnerState

__all__ = ["Task"]


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

    Example:
        >>> Task(problem, evaluate=lambda s: {"val_acc": 0.9}, name="mine")  # doctest: +SKIP
    """

    problem: InnerProblem
    evaluate: Callable[[InnerState], Mapping[str, float]] | None = None
    references: dict[str, Tensor] = field(default_factory=dict)
    extra: Callable[[Tensor], dict[str, Any]] | None = None
    name: str = "task"

    def __post_init__(self) -> None:
        if not isinstance(self.problem, InnerProblem):
            raise TypeError(f"Task: problem must be an InnerProblem, got "
                            f"{type(self.problem).__name__}.")
        if self.evaluate is not None and not callable(self.evaluate):
            raise TypeError(f"Task: evaluate must be a callable state -> {{metric: float}}, got "
                            f"{type(self.evaluate).__name__}.")
