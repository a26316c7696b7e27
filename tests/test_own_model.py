"""docs/own-model.md, verbatim, in an empty folder: its python blocks that name a file
(``# my_task.py``) are written to that file, its bash block runs as written (your data file,
``hypergrad-run`` with your task by ``_target_`` on the command line and from your own config
folder), and its last python block uses what was learned in plain PyTorch. Both runs write
results.json and model_learned.pt, and learn the same values."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
DOC = Path(__file__).resolve().parents[1] / "docs" / "own-model.md"


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(python|bash)\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_own_model_page_runs_verbatim_in_an_empty_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks()
    assert [k for k, _ in blocks] == ["python", "python", "bash", "python"]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    for kind, text in blocks[:3]:
        first = text.splitlines()[0]
        if kind == "python":
            name = re.match(r"# (\w+\.py)", first)
            assert name, first
            (tmp_path / name.group(1)).write_text(text)
        else:
            out = subprocess.run(["bash", "-e", "-c", text], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=900)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = {}
    for run in ("cli", "conf"):
        folder = tmp_path / "runs" / run
        res = json.loads((folder / "results.json").read_text())
        assert res["task"] == "my_cnn" and res["outer_steps"] == 4
        assert (folder / "model_learned.pt").stat().st_size > 0
        assert "learned.yaml" in res["learned_files"]
        learned = [r for r in res["table"] if r["hyperparameters"] == "learned"][0]
        assert 0.0 <= learned["test_acc"] <= 1.0
        runs[run] = res["learned_named"]
    assert runs["cli"] == runs["conf"] and set(runs["cli"]) == {"lr", "momentum"}
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    exec(compile(blocks[3][1], f"{DOC.name}[use]", "exec"), {"__name__": "__own_model__"})
