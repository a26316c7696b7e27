"""The declared Python range is the one that is checked: ``requires-python``'s floor is the
version ruff and mypy target, the README's, and the interpreter CI prefers."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_python_floor_is_declared_once_and_checked() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floor = re.fullmatch(r">=(\d+)\.(\d+)", meta["project"]["requires-python"])
    assert floor, meta["project"]["requires-python"]
    major, minor = int(floor[1]), int(floor[2])
    assert meta["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert meta["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    assert f"Python >= {major}.{minor}" in (ROOT / "README.md").read_text()
    assert f"python{major}.{minor}" in (ROOT / ".ci" / "run").read_text()
    assert sys.version_info >= (major, minor)
