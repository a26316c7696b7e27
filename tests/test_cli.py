"""The console script in real processes: multirun sweeps, and a run killed with SIGKILL then
resumed ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "hypergrad.cli"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(CLI + args, capture_output=True, text=True, env=ENV, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_multirun_over_seeds(launcher: str, tmp_path: Path) -> None:
    _run(["--multirun", "experiment=ridge_diabetes", "debug=fast", "seed=0,1",
          f"hydra/launcher={launcher}", f"hydra.sweep.dir={tmp_path}"])
    results = sorted(tmp_path.glob("*/results.json"))
    assert len(results) == 2
    vals = [json.loads(p.read_text())["learned"]["l2"] for p in results]
    assert vals[0] != vals[1]  # different seeds, different data splits


def test_sigkill_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    args = ["experiment=digits_schedule", "debug=fast", "problem.steps=20",
            "trainer.outer_steps=25", "problem.dtype=float64", "report.retrain=false",
            "report.plots=false"]
    _run(args + [f"hydra.run.dir={tmp_path / 'full'}"])
    part = tmp_path / "part"
    proc = subprocess.Popen(CLI + args + [f"hydra.run.dir={part}"], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = part / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (part / "results.json").exists()
    killed_at = torch.load(part / "checkpoint.pt", weights_only=True)["outer_step"]
    assert 3 <= killed_at < 25
    _run(args + [f"hydra.run.dir={part}", "trainer.resume=true"])
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(part / "checkpoint.pt", weights_only=True)
    assert a["outer_step"] == b["outer_step"] == 25
    assert torch.equal(a["lam"], b["lam"])  # float64, deterministic: bitwise equal
    ra = json.loads((tmp_path / "full" / "results.json").read_text())
    rb = json.loads((part / "results.json").read_text())
    assert ra["learned"] == rb["learned"]
    lines = (part / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["outer_step"] for x in lines] == list(range(25))
