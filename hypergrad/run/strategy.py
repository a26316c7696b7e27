"""How a run uses processes: a :class:`Strategy` object, so the Trainer's loop never asks "am I
distributed?". This one runs in a single process (the default);
:class:`hypergrad.distributed.Ranks` runs a method across ``torchrun`` ranks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..methods.base import Method

__all__ = ["Strategy"]


class Strategy:
    """A single process: the method as it is, this process writes the run folder."""

    is_writer: bool = True
    """Whether this process logs and writes the run folder."""

    def setup(self, method: Method) -> Method:
        """The method this process runs. A single process refuses a multi-process launch,
        where every rank would run and write the whole run on its own."""
        try:
            several = int(os.environ.get("WORLD_SIZE", "1")) > 1
        except ValueError:
            several = False
        if several:
            raise RuntimeError(
                f"Trainer: this process is one of WORLD_SIZE={os.environ['WORLD_SIZE']} "
                f"(torchrun), but the Trainer runs a single process: every rank would tune and "
                f"write on its own. Pass strategy=hypergrad.distributed.Ranks() (and start "
                f"the process group with `with hypergrad.distributed.launch():`).")
        return method

    def fingerprint(self, method: Method) -> dict[str, Any]:
        """What a checkpoint records about the processes (nothing for one)."""
        return {}

    def check_resume(self, old: dict[str, Any] | None, path: Path) -> None:
        """Refuse a checkpoint that another layout of processes wrote."""
        was = 1 if old is None else int(old.get("distributed.world_size", 1))
        if was != 1:
            from ..errors import ResumeMismatchError

            raise ResumeMismatchError(
                f"Trainer: cannot resume from {path}: it was written by a run of {was} "
                f"processes, this run has 1. Relaunch with torchrun --nproc_per_node={was} "
                f"and strategy=hypergrad.distributed.Ranks(), or start a new run.")

    def check_same_run(self, settings: dict[str, Any]) -> None:
        """Refuse processes built with other run settings (nothing to compare here)."""

    def follow(self, path: Path, resumed: bool, device: torch.device
               ) -> tuple[dict[str, Any], Path] | None:
        """On a process that does not write: the checkpoint the writer opened (``resumed``:
        whether it did; ``None`` here)."""
        return None

    def writers_value(self, value: Any, what: str) -> Any:
        """The writing process's ``value`` on every process (what its callbacks decided):
        this process's own."""
        return value

    def now(self, seconds: float) -> float:
        """The clock reading every process decides by (a time budget, a line search's room):
        this process's own."""
        return seconds

    def __repr__(self) -> str:
        return "Strategy()"
