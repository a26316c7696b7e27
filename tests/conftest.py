from __future__ import annotations

import pytest
import torch


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
