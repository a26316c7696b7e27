"""Many runs through Hydra launchers: the submitit launcher (SLURM) in its ``submitit_local``
mode, which starts each job as a local process the way a cluster node would run it.

hydra-submitit-launcher and submitit are pure Python; ``make test`` installs them into a folder
of their own (``.venv/sweep-submitit``, Makefile: SUBMITIT_PINS, no dependencies pulled: torch
and hydra stay as they are), which this test puts first on PYTHONPATH for one subprocess.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBMITIT = Path(os.environ.get("HYPERGRAD_SWEEP_SUBMITIT", ROOT / ".venv" / "sweep-submitit"))
pytestmark = pytest.mark.slow


def test_the_submitit_launcher_runs_a_sweep_locally(tmp_path: Path) -> None:
    if not (SUBMITIT / "hydra_plugins" / "hydra_submitit_launcher").is_dir():
        pytest.skip(f"hydra-submitit-launcher is not installed in {SUBMITIT}: make "
                    f".venv/sweep-submitit/.installed (make test does)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SUBMITIT), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "hypergrad.cli", "--multirun", "experiment=ridge_diabetes",
         "debug=fast", "seed=0,1", "report.plots=false", "hydra/launcher=submitit_local",
         "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for job in (0, 1):
        res = json.loads((tmp_path / str(job) / "results.json").read_text())
        assert res["outer_steps"] == 2 and math.isfinite(res["learned_val_loss"])
    # submitit ran them as its jobs: one pickled submission and its logs per job
    logs = list((tmp_path / ".submitit").rglob("*_log.out"))
    assert len(logs) == 2, logs
