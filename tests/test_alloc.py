"""The allocator tuning the benchmarks and the CLI apply: glibc's mallopt, a no-op elsewhere."""

from __future__ import annotations

import platform
import sys

import pytest

from hypergrad import alloc


def test_tune_malloc_applies_on_glibc() -> None:
    applied = alloc.tune_malloc()
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert applied is glibc
    if glibc:
        assert alloc.malloc_settings() == {"mmap_threshold": alloc.DEFAULT_THRESHOLD,
                                           "trim_threshold": alloc.DEFAULT_THRESHOLD}


def test_tune_malloc_is_a_no_op_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alloc.platform, "libc_ver", lambda: ("", ""))
    assert alloc.tune_malloc() is False


@pytest.mark.parametrize("bad", [-1, 2**31, 1.5, True, "big"])
def test_bad_thresholds_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match=r"tune_malloc\(mmap_threshold="):
        alloc.tune_malloc(mmap_threshold=bad)  # type: ignore[arg-type]
