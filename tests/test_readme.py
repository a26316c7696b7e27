"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples() -> None:
    assert BLOCKS


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i: int, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(BLOCKS[i], f"README.md[python block {i}]", "exec"), {"__name__": "__readme__"})
