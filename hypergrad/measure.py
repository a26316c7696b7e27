"""Wall time and peak memory of a call, on CPU (resident set) or CUDA (allocator peak)."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["rss_bytes", "heap_bytes", "measure"]

T = TypeVar("T")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks",
                                                "keepcost")]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def heap_bytes() -> int:
    """Bytes in use in glibc's malloc (heap blocks + mmapped blocks): unlike the resident set, it
    falls when memory is freed even if the allocator keeps the pages. RSS where unavailable."""
    if _MALLINFO2 is None:
        return rss_bytes()
    mi = _MALLINFO2()
    return int(mi.uordblks + mi.hblkhd)


def rss_bytes() -> int:
    """Current resident set size of this process (Linux ``/proc``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            import os

            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def measure(fn: Callable[[], T], device: torch.device | str = "cpu",
            interval: float = 0.002) -> tuple[T, dict[str, Any]]:
    """Run ``fn()``; return its result and ``{"seconds", "peak_extra_bytes"}``.

    On CPU the peak is the largest growth of :func:`heap_bytes` (memory in use in malloc, which
    PyTorch's CPU allocator uses) over the call, sampled every ``interval`` seconds by a thread:
    allocations shorter-lived than that can be missed. On CUDA it is the allocator's peak.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize(dev)
        secs = time.perf_counter() - t0
        return out, {"seconds": secs,
                     "peak_extra_bytes": torch.cuda.max_memory_allocated(dev) - base}
    base = heap_bytes()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], heap_bytes())
            stop.wait(interval)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    try:
        out = fn()
    finally:
        secs = time.perf_counter() - t0
        stop.set()
        th.join()
    peak[0] = max(peak[0], heap_bytes())
    return out, {"seconds": secs, "peak_extra_bytes": peak[0] - base}
