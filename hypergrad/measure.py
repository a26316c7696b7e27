"""Wall time and peak memory of a call, on CPU (resident set) or CUDA (allocator peak)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["rss_bytes", "measure"]

T = TypeVar("T")


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

    On CPU the peak is the largest resident-set growth over the call, sampled every
    ``interval`` seconds by a thread (allocations shorter than that can be missed; freed memory
    that the allocator keeps counts as used). On CUDA it is the allocator's peak.
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
    base = rss_bytes()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes())
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
    peak[0] = max(peak[0], rss_bytes())
    return out, {"seconds": secs, "peak_extra_bytes": peak[0] - base}
