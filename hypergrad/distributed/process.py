"""The process group: start it from ``torchrun``'s environment, end it, and turn a failed
collective into an error that says what happened.

``torchrun --nproc_per_node=P script.py`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the
rendezvous address; :func:`init` starts the process group from them: ``gloo`` for CPU tensors
and, where CUDA is available, ``nccl`` for CUDA tensors (``"cpu:gloo,cuda:nccl"``), each rank on
``cuda:LOCAL_RANK`` (:func:`device`). :func:`launch` does the same as a context manager and
destroys the group when the block ends, so every rank exits cleanly. A peer that dies makes the
next collective fail at once; a peer that hangs makes it fail after ``timeout`` seconds (default
:data:`DEFAULT_TIMEOUT`, or ``HYPERGRAD_DIST_TIMEOUT``):
:class:`~hypergrad.errors.DistributedError`,
the process exits, and torchrun stops the other ranks.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..errors import DistributedError

__all__ = ["init", "launch", "launched", "active", "rank", "world_size", "is_writer", "device",
           "barrier", "broadcast_object", "collective", "set_timeout", "DEFAULT_TIMEOUT",
           "TIMEOUT_ENV"]

DEFAULT_TIMEOUT: float = 600.0
"""Seconds a collective waits for a peer before the job fails (10 minutes)."""
TIMEOUT_ENV = "HYPERGRAD_DIST_TIMEOUT"

_TIMEOUT: list[float] = []  # the timeout the group was started with, once started here
ON_DESTROY: list[Callable[[], None]] = []
"""What forgets the groups made on a process group when :func:`launch` destroys it."""


def launched() -> bool:
    """Whether this process was started by ``torchrun`` (or another launcher that sets
    ``WORLD_SIZE`` and ``RANK``) with more than one process."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ
    except ValueError:
        return False


def active() -> bool:
    """Whether a process group of more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    return dist.get_rank() if active() else 0


def world_size() -> int:
    """The number of processes (1 when not distributed)."""
    return dist.get_world_size() if active() else 1


def is_writer() -> bool:
    """Whether this process writes files and logs: rank 0, or the only process. Under a
    launcher before the group is started, the launcher's ``RANK``: a Trainer given ``Ranks()``
    outside :func:`launch` picks its callbacks before its strategy starts the group, and every
    rank ran them (a callback writing a file wrote it once per rank; the distributed probe)."""
    if not active() and launched():
        return int(os.environ["RANK"]) == 0
    return rank() == 0


def device() -> torch.device:
    """The device this rank should put its model on: ``cuda:LOCAL_RANK`` where CUDA is available
    (one GPU per rank), else the CPU. A rank whose ``LOCAL_RANK`` has no GPU of its own (more
    processes per node than GPUs) is refused, naming both fixes: NCCL takes one rank per GPU."""
    if torch.cuda.is_available():
        local, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local >= count:
            raise RuntimeError(
                f"hypergrad.distributed: LOCAL_RANK={local} but this node has {count} CUDA "
                f"device(s), and each rank needs one of its own. Launch at most {count} "
                f"process(es) per node (torchrun --nproc_per_node={count}), or run the ranks on "
                f"the CPU with CUDA_VISIBLE_DEVICES='' (gloo).")
        return torch.device("cuda", local)
    return torch.device("cpu")


def _timeout(timeout: float | None) -> float:
    if timeout is None:
        env = os.environ.get(TIMEOUT_ENV)
        try:
            timeout = float(env) if env else DEFAULT_TIMEOUT
        except ValueError:
            raise ValueError(f"hypergrad.distributed: {TIMEOUT_ENV}={env!r} must be seconds, "
                             f"e.g. {TIMEOUT_ENV}=600.") from None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"hypergrad.distributed.init: timeout={timeout!r} must be seconds > 0, "
                         f"e.g. timeout=600.")
    return float(timeout)


def init(timeout: float | None = None, backend: str | None = None, *,
         init_method: str = "env://", rank: int | None = None,
         world_size: int | None = None) -> bool:
    """Start the process group from the launcher's environment (``torchrun``); returns whether
    this process is now one of several. Does nothing outside a multi-process launch, or when a
    process group is already running (yours is used as it is).

    Args:
        timeout: seconds a collective waits for a peer (default :data:`DEFAULT_TIMEOUT`, or the
            ``HYPERGRAD_DIST_TIMEOUT`` environment variable). It must exceed the time between
            two collectives: one outer step offline with column parallelism.
        backend: default ``"cpu:gloo,cuda:nccl"`` where CUDA is available, else ``"gloo"``.
        init_method, rank, world_size: as ``torch.distributed.init_process_group`` (tests start
            processes without torchrun this way).
    """
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return dist.get_world_size() > 1
    if rank is None and not launched():
        return False
    seconds = _timeout(timeout)
    _TIMEOUT[:] = [seconds]
    if backend is None:
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(device())
    dist.init_process_group(backend, init_method=init_method,
                            timeout=timedelta(seconds=seconds),
                            rank=-1 if rank is None else rank,
                            world_size=-1 if world_size is None else world_size)
    return dist.get_world_size() > 1


@contextlib.contextmanager
def launch(timeout: float | None = None, backend: str | None = None) -> Iterator[bool]:
    """``with launch() as several:`` starts the process group (:func:`init`; ``several``: whether
    this process is one of several) and, when the block ends, meets the other ranks and destroys
    the group, so that every rank exits with status 0 after a successful run; a block that
    raises destroys the group without meeting them (its error is raised, the others' next
    collective fails). Outside a multi-process launch it does nothing. A group that was running
    before is left running."""
    started = not (dist.is_available() and dist.is_initialized())
    several = init(timeout, backend)
    failed = True
    try:
        yield several
        failed = False
    finally:
        if started and dist.is_available() and dist.is_initialized():
            # after an error the others are not at the end: a barrier would meet one of their
            # collectives (gloo aborts the process on the sizes' mismatch, and this rank's error
            # is never printed); the group destroyed, their collective fails instead
            if not failed:
                with contextlib.suppress(Exception):  # a peer already gone: nothing to meet
                    barrier("meeting at the end of the run")
            dist.destroy_process_group()
            for forget in ON_DESTROY:
                forget()
            # free the groups (and their gloo threads' work) while the interpreter is alive: a
            # gloo thread that drops its last Python reference during interpreter shutdown is
            # stopped mid-unwind, and the process aborts after a run that succeeded
            gc.collect()


def set_timeout(seconds: float) -> None:
    """Change the timeout of the running process group's collectives (e.g. a short one once
    every rank has started, a start-up being slower than a step)."""
    from torch.distributed import distributed_c10d

    seconds = _timeout(seconds)
    distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))
    _TIMEOUT[:] = [seconds]


def sync_device() -> torch.device:
    """Where the tensors of control messages live: the CPU unless the group has only NCCL."""
    return torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")


@contextlib.contextmanager
def collective(what: str) -> Iterator[None]:
    """Turn a failed collective (a peer died, or did not arrive within the timeout) into a
    :class:`~hypergrad.errors.DistributedError` that says so."""
    try:
        yield
    except RuntimeError as err:
        if isinstance(err, DistributedError):
            raise
        t = _TIMEOUT[0] if _TIMEOUT else None
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        raise DistributedError(
            f"hypergrad.distributed: rank {rank()} of {world_size()}: {what} failed: another "
            f"rank died or did not arrive within the timeout"
            f"{'' if t is None else f' ({t:g} s)'} ({type(err).__name__}: {first}). The job "
            f"stops here; the failing rank's own error is in its output. A step slower than the "
            f"timeout needs a larger one ({TIMEOUT_ENV}=..., or init(timeout=...)).") from err


def barrier(what: str = "barrier") -> None:
    """All ranks meet (an all-reduce of one number on the CPU group, which obeys the timeout)."""
    if not active():
        return
    x = torch.zeros(1, device=sync_device())
    with collective(what):
        dist.all_reduce(x)


def gather_objects(obj: Any, what: str = "gather") -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not active():
        return [obj]
    box: list[Any] = [None] * world_size()
    with collective(what):
        dist.all_gather_object(box, obj)
    return box


def broadcast_object(obj: Any, what: str = "broadcast") -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    box = [obj]
    with collective(what):
        dist.broadcast_object_list(box, src=0)
    return box[0]
