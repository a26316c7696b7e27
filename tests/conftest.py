from __future__ import annotations

import os

import pytest
import torch

# ForwardMode(compile=None) decides by measurement after 30 s of eager steps: never in the
# tests (and the scripts they start), which check the results, not the speed;
# tests/test_auto_compile.py sets it per test.
os.environ["HYPERGRAD_AUTO_COMPILE_AFTER_S"] = "inf"
import hypergrad.methods.forward as _forward  # noqa: E402

_forward.AUTO_COMPILE_AFTER_S = float("inf")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest worker per core (pytest -n auto): each, and the processes its
    # tests start, computes on one thread, so the workers do not fight over the cores
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def f64() -> torch.dtype:
    """The dtype for exactness checks (passed explicitly; the global default is untouched)."""
    return torch.float64


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def isolated_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Methods and optimizers a test registers are forgotten after it (the registries are
    process-wide: a test's own registrations must not reach the others)."""
    import hypergrad.methods.base as methods
    import hypergrad.optim.base as optimizers

    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))
    monkeypatch.setattr(optimizers, "_FACTORIES", dict(optimizers._FACTORIES))
