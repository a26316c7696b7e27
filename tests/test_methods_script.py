"""experiments/methods.py runs at small sizes and its last line holds the checks of issue 14."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_methods_script_quick(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "experiments/methods.py", "--quick", "--json",
                          str(tmp_path / "m.json")], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"methods truncated_full=(\S+) checkpointed=(\S+) "
                     r"implicit_closed_form=(\S+) implicit_vs_forward=(\S+) "
                     r"marthe_limits=(\S+)", last)
    assert m, last
    a, b, c, d, e = map(float, m.groups())
    assert a <= 1e-12 and b <= 1e-12 and e <= 1e-12
    assert c <= 1e-8 and d <= 1e-3
    rows = json.loads((tmp_path / "m.json").read_text())["rows"]
    methods = {r["method"] for r in rows}
    for name in ("forward", "HD", "MARTHE mu=0.9", "implicit CG", "implicit Neumann",
                 "implicit FixedPoint", "reverse checkpoint=sqrt", "reverse step_vjp=mixed"):
        assert name in methods, name
    refused = [r for r in rows if r["method"] == "implicit" and r["problem"].startswith("digits")]
    assert refused and "read by the optimizer" in refused[0]["note"]
