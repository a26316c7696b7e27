"""Allocator tuning for the large, short-lived buffers of batched tangent steps (glibc ``malloc``).

A batched step allocates and frees buffers of ``K x`` activation size (tens to hundreds of MiB)
several times per step. glibc serves every request above ``M_MMAP_THRESHOLD`` with a fresh
``mmap`` and gives it back with ``munmap`` when freed, so each step pays a page fault (and the
kernel's zeroing) on every 4 KiB page it touches, and ``free`` trims the heap top above
``M_TRIM_THRESHOLD``. The dynamic threshold tops out at 32 MiB, far below these buffers. On this
project's CPU machine that cost batched steps 2.3-2.7x on small CNNs (DESIGN.md).

:func:`tune_malloc` raises both thresholds with ``mallopt``, so freed buffers stay in the heap
and the next step reuses pages that are already mapped. The price: memory freed by PyTorch is
kept by the process (its resident set stays at its high-water mark) instead of going back to the
operating system. The same settings can be made without code, before the process starts::

    MALLOC_MMAP_THRESHOLD_=2147483647 MALLOC_TRIM_THRESHOLD_=2147483647 python train.py

The benchmarks under ``experiments/benchmarks`` and the CLI call :func:`tune_malloc` first thing;
library code never calls it (a library must not change its host's allocator behind its back).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys

__all__ = ["tune_malloc", "malloc_settings", "M_TRIM_THRESHOLD", "M_MMAP_THRESHOLD",
           "DEFAULT_THRESHOLD"]

M_TRIM_THRESHOLD = -1
"""glibc's ``mallopt`` parameter number for the heap-trim threshold."""
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number for the mmap threshold."""
DEFAULT_THRESHOLD = 2**31 - 1
"""Both thresholds' default: ``mallopt`` takes a C ``int``, and 2 GiB - 1 is its largest value,
above any single buffer of a step at the sizes this library targets."""

_applied: dict[str, int] | None = None


def tune_malloc(mmap_threshold: int = DEFAULT_THRESHOLD,
                trim_threshold: int = DEFAULT_THRESHOLD) -> bool:
    """Raise glibc's mmap and trim thresholds so large freed buffers are reused, not unmapped.

    Call it once, early (before the first large step); later allocations follow the new
    thresholds. A no-op returning ``False`` where the C library is not glibc (macOS, Windows,
    musl); ``True`` when both settings were applied.

    Args:
        mmap_threshold: requests at least this large (bytes) get their own ``mmap``.
        trim_threshold: free memory at the heap top above this (bytes) is returned to the OS.

    Returns:
        Whether the thresholds were applied.

    Example:
        >>> from hypergrad.alloc import tune_malloc
        >>> tune_malloc()  # doctest: +SKIP
        True
    """
    global _applied
    for name, v in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= DEFAULT_THRESHOLD:
            raise ValueError(f"tune_malloc({name}={v!r}): expected an int in [0, 2**31 - 1] "
                             f"(bytes), e.g. tune_malloc({name}=1 << 30).")
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    path = ctypes.util.find_library("c")
    if path is None:
        return False
    try:
        libc = ctypes.CDLL(path)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(M_TRIM_THRESHOLD, trim_threshold))
    if ok:
        _applied = {"mmap_threshold": mmap_threshold, "trim_threshold": trim_threshold}
    return ok


def malloc_settings() -> dict[str, int] | None:
    """The thresholds :func:`tune_malloc` applied in this process (``None`` if it has not)."""
    return dict(_applied) if _applied is not None else None
