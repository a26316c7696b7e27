"""The errors and warnings hypergrad raises on its own account (besides ``ValueError`` /
``TypeError`` for bad arguments), so that users can catch or filter them by class.

Warnings are ordinary :class:`UserWarning` subclasses: ``warnings.simplefilter("ignore",
hypergrad.errors.TuningWarning)`` silences one kind, ``"error"`` turns it into an exception.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = [
    "HypergradWarning", "ZeroHypergradientWarning", "TuningWarning", "BoundsWarning",
    "CheckpointWarning", "PrecisionWarning", "DetachedValueWarning", "UnseededRandomnessWarning",
    "UnreadParameterWarning", "ConfigWarning",
    "CheckpointError", "ConfigError", "RunDirError", "ResumeMismatchError", "MemoryBudgetError",
    "InnerNotConvergedWarning", "SolverNotConvergedWarning", "DistributedError",
    "RanksMismatchError",
]


class HypergradWarning(UserWarning):
    """Base class of hypergrad's warnings."""


class ZeroHypergradientWarning(HypergradWarning):
    """A hyperparameter's hypergradient is exactly zero: the losses cannot differentiate it
    (``.item()``, ``float()``, ``round``, ``detach``, ``torch.where`` on it, ``0 * hp``), so
    gradient-based tuning never moves it."""


class TuningWarning(HypergradWarning):
    """Tuning did not help: the last hyperparameters are worse than the initial ones on the
    validation objective, or a hyperparameter never moved."""


class BoundsWarning(HypergradWarning):
    """An initial value lies outside the search box (``Guards(bounds=...)``): it was moved onto
    the nearest bound, where tuning starts."""


class CheckpointWarning(HypergradWarning):
    """A checkpoint could not be used as it is (unreadable, so the previous one was taken; or
    written by an older version without a fingerprint to check)."""


class InnerNotConvergedWarning(HypergradWarning):
    """Implicit differentiation at a state that is not near a stationary point of the training
    objective (its gradient norm has not fallen enough): the implicit hypergradient may be far
    off, even of the wrong sign."""


class SolverNotConvergedWarning(HypergradWarning):
    """The linear solver of implicit differentiation stopped above its tolerance."""


class PrecisionWarning(HypergradWarning):
    """Hypergradients of a float32 problem on CUDA with TF32 enabled for the model's
    convolutions (``torch.backends.cudnn.allow_tf32``, on by torch's default) or matrix products
    (``torch.backends.cuda.matmul.allow_tf32``): each product keeps a 10-bit mantissa, and the
    hypergradient of a run sums many of them (docs/benchmarks.md, "Precision"); also central
    finite differences of a problem in float32 (their rounding error is machine epsilon over
    the step)."""


class DetachedValueWarning(HypergradWarning):
    """A loss reads a value computed from the model's weights and then cut from the autograd
    graph (``.detach()``, ``.data``, an operation under ``torch.no_grad()``), e.g. a
    stop-gradient target: every method differentiates the loss as if that value were a
    constant, so hypergradients miss how it moves with the weights (only finite differences see
    it)."""


class UnseededRandomnessWarning(HypergradWarning):
    """A loss returns another value when evaluated again at the same weights, batch and step:
    it draws randomness hypergrad does not seed per step (Python's ``random``, NumPy, a
    ``torch.Generator`` of its own). Every method evaluates a step a different number of times,
    so forward mode, reverse mode and finite differences differentiate different functions."""


class UnreadParameterWarning(HypergradWarning):
    """The training loss does not read a trainable parameter while the inner optimizer moves it
    with a zero gradient (a weight decay, whatever its argument's name: the check runs one
    update with zero gradients): hypergrad updates every parameter, so that one moves at every
    step (toward 0 under a decay), where ``torch.optim`` skips a parameter whose ``.grad`` is
    ``None``. The hypergradients are exact for hypergrad's update; freeze the parameter
    (``requires_grad_(False)``) to train as torch does, or give it no decay."""


class ConfigWarning(HypergradWarning):
    """A ``hypergrad-run`` configuration that runs, but not as its files suggest: a preset of
    yours that extends a bundled one without the bundled preset's settings of its outer
    optimizer (``configs/experiment_outer/``), which apply by the experiment's name."""


class CheckpointError(RuntimeError):
    """No readable checkpoint in a run folder that should have one."""


class ConfigError(ValueError):
    """A ``hypergrad-run`` configuration that cannot run: a key that names no setting, a task
    builder that cannot be imported or returns no task, a run folder given with a literal '~',
    a value one of hypergrad's classes refuses while the config is built.
    The command prints its message alone (no traceback; ``HYDRA_FULL_ERROR=1`` shows one) and
    exits with status 2, as it does for :class:`RunDirError`, :class:`ResumeMismatchError` and
    :class:`MemoryBudgetError`."""


class RunDirError(ValueError):
    """A run folder already holds a run (and neither ``resume`` nor ``overwrite`` was given), or
    another live process is using it."""


class ResumeMismatchError(ValueError):
    """The run to resume differs from the checkpoint's in settings that define it."""


class MemoryBudgetError(ValueError):
    """The chosen method's memory estimate exceeds the memory budget."""


class DistributedError(RuntimeError):
    """A collective of a multi-process run failed: another rank died, or did not arrive within
    the timeout (:mod:`hypergrad.distributed`)."""


class RanksMismatchError(ValueError):
    """The processes of a multi-process run hold different problems or run settings (each
    rank's script or config built another one): every rank raises it together, naming the
    differing entries. ``hypergrad-run`` answers it as a usage error (status 2)."""


def is_real(value: object) -> bool:
    """Whether ``value`` is a real number as a setting takes one: a Python or NumPy int or
    float, not a bool (``True`` is an ``int`` to Python) and not a string (not exported)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def flag(api: str, key: str, value: object) -> bool:
    """A boolean option as a bool; anything but True/False (or 1/0, NumPy's too) is refused:
    ``bool("no")`` is True (``RunFolder(overwrite="no")`` threw the run away)."""
    if not isinstance(value, (bool, numbers.Integral, np.bool_)) or value not in (0, 1):
        raise TypeError(f"{api}: {key}={value!r} must be True or False, e.g. {key}=True.")
    return bool(value)


def raised_in_hypergrad(err: BaseException) -> bool:
    """Whether ``err`` was raised in hypergrad's own code (its innermost frame is in the
    package): one of its checks, whose message says what it is, not a failure in a user's
    code (not exported: for the command line's and the problem's messages)."""
    from pathlib import Path

    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    here = Path(__file__).resolve().parent
    return tb is not None and here in Path(tb.tb_frame.f_code.co_filename).resolve().parents
