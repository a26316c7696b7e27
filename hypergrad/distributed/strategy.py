"""The Trainer across ``torchrun`` ranks: :class:`Ranks`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ResumeMismatchError
from ..methods.base import Method
from ..methods.forward import ForwardMode
from ..methods.reverse import ReverseMode
from ..run.files import load_checkpoint
from ..run.strategy import Strategy
from .parallel import ParallelForward, ParallelReverse, check_same_facts
from .process import broadcast_object, init, is_writer, world_size

__all__ = ["Ranks"]


class Ranks(Strategy):
    """Run a Trainer across the ranks of a ``torchrun`` launch: each method splits itself
    (:meth:`~hypergrad.Method.across_ranks`: forward mode its columns, or with
    ``data_parallel=D`` a ``D x P/D`` mesh; reverse mode its mini-batches), rank 0 alone logs
    and writes the run folder, the others load rank 0's checkpoint on resume. Outside a launch
    it is a single process.

    Args:
        data_parallel: ranks of forward mode that split each mini-batch (the rest split the
            columns); ``None``: forward mode splits its columns over all ranks. Reverse mode
            always splits the batch over all ranks.
        timeout: seconds a collective waits for a peer (see :func:`~hypergrad.distributed.init`).
        reduction: ``"mean"`` (the training loss is a mean over the batch) or ``"sum"``.

    Example:
        >>> # torchrun --nproc_per_node=2 tune.py
        >>> with hypergrad.distributed.launch():                          # doctest: +SKIP
        ...     hypergrad.Trainer(problem, strategy=Ranks()).fit()
    """

    def __init__(self, data_parallel: int | None = None, timeout: float | None = None,
                 reduction: str = "mean") -> None:
        if data_parallel is not None and (isinstance(data_parallel, bool)
                                          or not isinstance(data_parallel, int)
                                          or data_parallel < 1):
            raise ValueError(f"Ranks: data_parallel={data_parallel!r} must be None or an int "
                             f">= 1 dividing the number of processes.")
        from .shard import check_reduction

        self.data_parallel = data_parallel
        self.timeout = timeout
        # checked here, not first under torchrun (hypergrad-run distributed.reduction=avg ran)
        self.reduction = check_reduction("Ranks", reduction)

    @property
    def is_writer(self) -> bool:  # type: ignore[override]
        return is_writer()

    def setup(self, method: Method) -> Method:
        if not init(self.timeout):
            return method
        return method.across_ranks(self)

    def forward(self, method: ForwardMode) -> Method:
        """Forward mode across the ranks (what :meth:`ForwardMode.across_ranks` asks for)."""
        return ParallelForward(method, data=self.data_parallel, reduction=self.reduction)

    def reverse(self, method: ReverseMode) -> Method:
        """Reverse mode across the ranks (what :meth:`ReverseMode.across_ranks` asks for)."""
        return ParallelReverse(method, reduction=self.reduction)

    def fingerprint(self, method: Method) -> dict[str, Any]:
        if world_size() == 1:
            return {}
        return {"distributed.world_size": world_size()}

    def check_resume(self, old: dict[str, Any] | None, path: Path) -> None:
        if old is None:
            return
        was, now = int(old.get("distributed.world_size", 1)), world_size()
        if was != now:
            how = (f"torchrun --nproc_per_node={was} ..." if was > 1 else
                   "one process (no torchrun)")
            raise ResumeMismatchError(
                f"Trainer: cannot resume from {path}: it was written by a run of {was} "
                f"process{'es' if was > 1 else ''}, this run has {now}. A run resumes under the "
                f"world size it started with: relaunch with {how}, or start a new run (another "
                f"run folder, or overwrite=True; folder.overwrite=true on the command line).")

    def check_same_run(self, settings: dict[str, Any]) -> None:
        """Refuse ranks whose Trainers differ in what defines the run (the mode, the guards,
        the bounds, the outer optimizer and its settings, the run folder): each rank steps its
        own outer optimizer, so one with another learning rate or step count went its own
        way, and rank 0 summed hypergradients taken at other points (exit status 0)."""
        if world_size() == 1:
            return
        check_same_facts(settings, "Trainer", "run settings",
                         "Every rank must build the same Trainer (the same mode, guards, "
                         "bounds, outer optimizer and run folder): give each the same "
                         "arguments (one script, one config).")

    def follow(self, path: Path, resumed: bool, device: torch.device
               ) -> tuple[dict[str, Any], Path] | None:
        """After rank 0 opened the run folder: the other ranks load the same checkpoint
        (read-only; the folder must be one all ranks see) where rank 0 resumed (``resumed``,
        rank 0's: a rank given resume=False started afresh beside a resumed rank 0, which
        wrote a wrong record before the run failed)."""
        if world_size() == 1:
            return None
        loaded = bool(broadcast_object(bool(resumed) if is_writer() else None,
                                       "waiting for rank 0 to open the run folder"))
        if is_writer() or not loaded:
            return None
        return load_checkpoint(path, device)

    def writers_value(self, value: Any, what: str) -> Any:
        """Rank 0's ``value`` on every rank: only rank 0 calls the callbacks, so a stop one of
        them asked for would end rank 0's loop alone, and the others would wait on it."""
        if world_size() == 1:
            return value
        return broadcast_object(value, what)

    def now(self, seconds: float) -> float:
        """Rank 0's clock reading on every rank: each rank's own clock (its CPU time, or a wall
        clock read a moment apart) would decide a time budget, the start's points and a line
        search's trials apart, and the ranks' collectives would stop pairing."""
        if world_size() == 1:
            return seconds
        return float(broadcast_object(float(seconds), "agreeing on the clock"))

    def __repr__(self) -> str:
        return (f"Ranks(data_parallel={self.data_parallel}, timeout={self.timeout}, "
                f"reduction={self.reduction!r})")
