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


def _has_joblib_launcher() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("launcher", ["basic", pytest.param("joblib", marks=pytest.mark.skipif(
    not _has_joblib_launcher(), reason="the sweep extra (hydra-joblib-launcher) not installed"))])
def test_multirun_over_seeds(launcher: str, tmp_path: Path) -> None:
    _run(["--multirun", "experiment=ridge_diabetes", "debug=fast", "seed=0,1",
          f"hydra/launcher={launcher}", f"hydra.sweep.dir={tmp_path}"])
    results = sorted(tmp_path.glob("*/results.json"))
    assert len(results) == 2
    vals = [json.loads(p.read_text())["learned"]["l2"] for p in results]
    assert vals[0] != vals[1]  # different seeds, different data splits


def test_sigkill_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    args = ["experiment=digits_schedule", "debug=fast", "task.steps=20",
            "mode.outer_steps=25", "task.dtype=float64", "report.retrain=false",
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
    _run(args + [f"hydra.run.dir={part}", "folder.resume=true"])
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(part / "checkpoint.pt", weights_only=True)
    assert a["outer_step"] == b["outer_step"] == 25
    assert torch.equal(a["lam"], b["lam"])  # float64, deterministic: bitwise equal
    ra = json.loads((tmp_path / "full" / "results.json").read_text())
    rb = json.loads((part / "results.json").read_text())
    assert ra["learned"] == rb["learned"]
    lines = (part / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["outer_step"] for x in lines] == list(range(25))


def test_sigterm_names_the_folder_to_resume_and_a_resume_drops_the_earlier_reports(
        tmp_path: Path) -> None:
    """SIGTERM (how SLURM and Kubernetes stop a job) killed the run with no word in cli.log
    and left its lock; Ctrl-C's message did not name the folder (the same command with
    folder.resume=true alone started afresh in a new time-stamped folder). A resumed run
    stopped before its end kept the earlier end's results.json, which read as final (the
    crash-safety probe). Now: an interrupt like Ctrl-C's (exit status 143), naming the
    folder; the earlier end's reports go when the resume starts."""
    args = ["experiment=digits_schedule", "debug=fast", "task.steps=20", "task.dtype=float64",
            "report.retrain=false", "report.plots=false", f"hydra.run.dir={tmp_path}"]
    _run([*args, "mode.outer_steps=2"])
    assert (tmp_path / "results.json").exists()
    env = {k: v for k, v in ENV.items() if k != "HYDRA_FULL_ERROR"}  # the user's message
    proc = subprocess.Popen(CLI + [*args, "mode.outer_steps=500", "folder.resume=true"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be stopped"
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    said = (f"hypergrad-run: interrupted (SIGTERM); the run folder {tmp_path} keeps the last "
            f"checkpoint and its records: continue with the same command and "
            f"folder.resume=true hydra.run.dir={tmp_path}")
    assert proc.returncode == 143 and said in err, err
    assert said in (tmp_path / "cli.log").read_text()
    assert not (tmp_path / "results.json").exists() and not (tmp_path / "run.lock").exists()


def test_help_says_what_it_does() -> None:
    out = _run(["--help"], timeout=120).stdout
    assert "tune training hyperparameters" in out and "Examples:" in out
    assert "hypergrad-run experiment=digits_schedule" in out and "folder.resume=true" in out


# A small Trainer run in its own process: argv = run_dir, "fresh" | "resume"; writes the
# learned hyperparameters next to the run folder.
SCRIPT = """
import functools, sys, torch
import hypergrad as hg
from hypergrad.testing import digits_case
problem = digits_case("adam", "per_tensor_wd", steps=12, n_train=32, batch_size=8, hidden=8,
                      n_val=32)
trainer = hg.Trainer(problem, outer=functools.partial(torch.optim.Adam, lr=0.1),
                     mode=hg.Offline(outer_steps=6),
                     folder=hg.RunFolder(sys.argv[1], resume=sys.argv[2] == "resume"),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)])
res = trainer.fit()
torch.save({"lam": res.lam, "last": res.last_lam}, sys.argv[1] + ".result.pt")
"""


def _script(run_dir: Path, how: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(ENV)
    if fault:
        env["HYPERGRAD_TEST_CHECKPOINT_FAULT"] = fault
    return subprocess.run([sys.executable, "-c", SCRIPT, str(run_dir), how], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    run_dir = tmp_path_factory.mktemp("full") / "run"
    out = _script(run_dir, "fresh")
    assert out.returncode == 0, out.stderr
    return torch.load(str(run_dir) + ".result.pt", weights_only=True)


@pytest.mark.parametrize("fault", ["kill-after-bytes=2000", "kill-after-rotate"])
def test_sigkill_inside_the_checkpoint_write_loses_at_most_one_outer_step(
        fault: str, tmp_path: Path, uninterrupted: dict[str, torch.Tensor]) -> None:
    run_dir = tmp_path / "run"
    out = _script(run_dir, "fresh", f"step=3,{fault}")  # dies writing outer step 3's checkpoint
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert not (tmp_path / "run.result.pt").exists()
    if fault == "kill-after-rotate":  # the new file not yet in place: the old one is both
        # (a hard link: checkpoint.pt was missing in that moment, for a reader or a copy)
        assert (run_dir / "checkpoint.pt").samefile(run_dir / "checkpoint.prev.pt")
        survivor = run_dir / "checkpoint.pt"
    else:
        assert list(run_dir.glob(".tmp-checkpoint-*"))  # the half-written file is there
        survivor = run_dir / "checkpoint.pt"
    assert torch.load(survivor, weights_only=True)["outer_step"] == 2  # one step lost, no more
    assert (run_dir / "run.lock").exists()  # left by the killed process
    out = _script(run_dir, "resume")
    assert out.returncode == 0, out.stderr
    assert "is missing" not in out.stderr
    res = torch.load(str(run_dir) + ".result.pt", weights_only=True)
    assert torch.equal(res["lam"], uninterrupted["lam"])  # bitwise: float64, deterministic
    assert torch.equal(res["last"], uninterrupted["last"])
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["outer_step"] for x in lines] == list(range(6))
    assert not list(run_dir.glob(".tmp-*")) and not (run_dir / "run.lock").exists()
