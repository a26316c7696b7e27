"""Optuna over the presets with Hydra multirun (``hydra/sweeper=optuna``): a 2-trial sweep of
digits_schedule's 10 hyperparameters through ``hypergrad-run --multirun ... +sweep=...``.

hydra-optuna-sweeper pins optuna<3 (and SQLAlchemy<2), which cannot share the test venv with the
optuna 4+ that experiments/vs_optuna.py uses. ``make test`` installs the plugin's pure-Python
packages into a folder of their own (``.venv/sweep-optuna``, Makefile: SWEEPER_PINS), and this
test puts that folder first on PYTHONPATH for one subprocess only.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SWEEPER = Path(os.environ.get("HYPERGRAD_SWEEP_OPTUNA", ROOT / ".venv" / "sweep-optuna"))
pytestmark = pytest.mark.slow


def test_the_optuna_sweeper_runs_over_a_preset(tmp_path: Path) -> None:
    if not (SWEEPER / "hydra_plugins" / "hydra_optuna_sweeper").is_dir():
        pytest.skip(f"hydra-optuna-sweeper is not installed in {SWEEPER}: make "
                    f".venv/sweep-optuna/.installed (make test does)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SWEEPER), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run(
        [sys.executable, "-m", "hypergrad.cli", "--multirun", "experiment=digits_schedule",
         "+sweep=digits_schedule", "debug=fast", "hydra.sweeper.n_trials=2",
         f"hydra.sweep.dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert best["name"] == "optuna"
    names = {f"hyperparams.items.lr.init.{i}" for i in range(5)} | {
        f"hyperparams.items.wd.init.{i}" for i in range(4)} | {"hyperparams.items.momentum.init"}
    assert set(best["best_params"]) == names  # the preset's K = 10, one Optuna param each
    trials = [json.loads((tmp_path / str(i) / "results.json").read_text()) for i in range(2)]
    for r in trials:  # each trial trained once at the sampled values, no hypergradient
        assert r["outer_steps"] == 0 and r["table"] == [] and math.isfinite(r["learned_val_loss"])
    assert best["best_value"] == pytest.approx(min(r["learned_val_loss"] for r in trials))
    lr = [best["best_params"][f"hyperparams.items.lr.init.{i}"] for i in range(5)]
    winner = min(trials, key=lambda r: r["learned_val_loss"])
    assert winner["learned"]["lr"] == pytest.approx(lr, rel=1e-6)
    assert all(1e-4 <= v <= 3.0 for v in lr)


def test_a_second_optuna_sweep_keeps_the_first_ones_best_and_maximize_is_refused(
        tmp_path: Path) -> None:
    """The Optuna sweeper writes no multirun.yaml, so a sweep run again into its folder
    replaced optimization_results.yaml (its best point) with a worse one without a word; each
    job returns a loss, and direction=maximize made a diverged job's inf the best value."""
    if not (SWEEPER / "hydra_plugins" / "hydra_optuna_sweeper").is_dir():
        pytest.skip(f"hydra-optuna-sweeper is not installed in {SWEEPER}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SWEEPER), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def sweep(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hypergrad.cli", "--multirun", "experiment=digits_schedule",
             "+sweep=digits_schedule", "debug=fast", "hydra.sweeper.n_trials=1",
             "report.plots=false", f"hydra.sweep.dir={tmp_path}", *extra],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)

    first = sweep()
    assert first.returncode == 0, first.stderr[-3000:]
    best = (tmp_path / "optimization_results.yaml").read_text()
    second = sweep("folder.overwrite=true", "hydra.sweeper.sampler.seed=7")
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "optimization_results.2.yaml").read_text() == best
    assert "optimization_results.yaml as optimization_results.2.yaml" in (
        second.stdout + second.stderr)
    third = sweep("folder.overwrite=true", "hydra.sweeper.direction=maximize")
    assert third.returncode != 0
    assert "hydra.sweeper.direction=maximize" in third.stderr
    assert "use hydra.sweeper.direction=minimize" in third.stderr
    fourth = sweep("folder.overwrite=true", "hydra.sweeper.direction=[minimize,minimize]")
    assert fourth.returncode != 0  # every job trained, then Optuna failed each trial
    assert "asks for a study of 2 objectives, but each job returns one loss" in fourth.stderr


def test_an_optuna_sweep_without_multirun_is_refused(tmp_path: Path) -> None:
    """+sweep=digits_schedule without --multirun ran once at the config's own values with
    mode.outer_steps=0 and reported them as the "learned hyperparameters" (the sweep probe,
    2026-12-07)."""
    if not (SWEEPER / "hydra_plugins" / "hydra_optuna_sweeper").is_dir():
        pytest.skip(f"hydra-optuna-sweeper is not installed in {SWEEPER}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SWEEPER), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run(
        [sys.executable, "-m", "hypergrad.cli", "experiment=digits_schedule",
         "+sweep=digits_schedule", "debug=fast", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 2
    assert "the sweeper is Optuna's" in out.stderr and "Add --multirun." in out.stderr
    assert not (tmp_path / "results.json").exists()
