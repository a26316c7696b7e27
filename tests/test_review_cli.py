"""`hypergrad-run` as a user meets it, found by review (2026-11-27): a refused job of a
``--multirun`` sweep fails alone (it ended the whole sweep), a diverged run gives sweepers
``inf`` (NaN stopped an Optuna study), resuming a folder without a checkpoint is answered as a
usage error (a traceback), and a run that diverged from its start writes no learned.yaml of the
values that diverged."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import hypergrad.cli as cli
from hypergrad.config import CONFIG_DIR, build, check_keys
from hypergrad.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "hypergrad.cli"]
FAST = ["debug=fast", "report.plots=false", "callbacks.progress=false"]
ENV = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {
    "OMP_NUM_THREADS": "1"}


def _compose(*overrides: str) -> DictConfig:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=300)


def test_a_refused_job_of_a_sweep_fails_alone(tmp_path: Path) -> None:
    """The refusal exited the process (status 2): the sweep's later jobs never ran (joblib:
    the jobs beside it were killed mid-run, run.lock left), and an Optuna study stopped at its
    first refused trial."""
    out = _cli("--multirun", "guards.backtrack=0.5,1.5", *FAST, "report.retrain=false",
               f"hydra.sweep.dir={tmp_path}")
    assert out.returncode != 0  # the sweep still says a job failed
    assert "backtrack=0.5 must be a number >= 1" in out.stderr
    # the message and Hydra's line naming the job's overrides, no traceback through the
    # sweeper's frames (2026-12-06: about 20 lines of it)
    assert "Traceback" not in out.stderr and "Error executing job with overrides" in out.stderr
    assert not (tmp_path / "0" / "results.json").exists()
    assert "backtrack=0.5 must be" in (tmp_path / "0" / "cli.log").read_text()
    assert json.loads((tmp_path / "1" / "results.json").read_text())["outer_steps"] == 2


def test_a_diverged_run_gives_sweepers_inf_and_no_learned_settings(tmp_path: Path) -> None:
    """NaN went to the sweeper: optuna 2.10 (hydra-optuna-sweeper's pin) refuses NaN in tell()
    and the sweeper's own FAIL path then raised, ending the study; learned.yaml held the start's
    diverging values as torch.optim settings."""
    results = cli.run(_compose(*FAST, "experiment=ridge_diabetes", "inner_optimizer.lr=1e40",
                               "mode.outer_steps=0", "report.retrain=false"), tmp_path)
    assert results["diverged"] and results["learned_val_loss"] is None
    assert cli.objective(results) == math.inf
    settings = yaml.safe_load((tmp_path / "learned.yaml").read_text())
    assert set(settings) == {"not_written"} and "diverged" in settings["not_written"]
    assert not (tmp_path / "model_learned.pt").exists()
    rows = [{"hyperparameters": "learned", "val_loss": math.nan}]
    assert cli.objective({"table": rows, "learned_val_loss": 0.5}) == math.inf
    assert cli.objective({"table": [], "learned_val_loss": 0.5}) == 0.5


def test_a_run_diverged_after_a_step_names_where_its_last_values_come_from(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The log said 'last hyperparameters (outer step None)' for a run that diverged at outer
    step 1 (the records probe)."""
    caplog.set_level("INFO")
    results = cli.run(_compose(*FAST, "experiment=ridge_diabetes", "mode.outer_steps=4",
                               "outer_optimizer.lr=4", "hyperparams.items.l2.init=1.0",
                               "hyperparams.items.l2.transform=identity",
                               "report.retrain=false"), tmp_path)
    assert results["diverged"]
    log = caplog.text
    assert "outer step None" not in log
    assert "last hyperparameters (where the run diverged)" in log


def test_resuming_a_folder_without_a_checkpoint_is_a_usage_error(tmp_path: Path) -> None:
    """A folder with records and no checkpoint (a run of mode.outer_steps=0 before
    2026-12-08, which wrote none): resuming it ended in CheckpointError's traceback (status
    1)."""
    cli.run(_compose(*FAST, "mode.outer_steps=0", "report.retrain=false"), tmp_path)
    (tmp_path / "checkpoint.pt").unlink()
    out = _cli(*FAST, "folder.resume=true", "report.retrain=false", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "no checkpoint" in out.stderr and "folder.overwrite=true" in out.stderr


def test_a_negative_seed_is_refused_naming_it() -> None:
    """seed=-1 ended in numpy's "expected non-negative integer", naming neither the key nor
    the value."""
    with pytest.raises(ConfigError, match=r"seed=-1: a seed must be an int >= 0"):
        build(_compose(*FAST, "seed=-1"))


def test_results_say_a_run_was_stopped_by_its_time_budget(tmp_path: Path) -> None:
    """results.json of a run cut short by guards.time_budget looked like a finished one (the
    reason was in cli.log alone)."""
    cli.run(_compose(*FAST, "report.retrain=false", "mode.outer_steps=100000",
                     "guards.time_budget=0.5"), tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["out_of_time"] is True and 0 < on_disk["outer_steps"] < 100000


def test_an_own_model_target_over_a_bundled_option_says_how_to_give_it_a_file() -> None:
    """model._target_=mine over model=mlp was refused as a misspelling ('model.hidden' names
    no setting. Check the spelling), though the user typed none and no command line can remove
    mlp's keys (its schema refuses deletion)."""
    cfg = _compose(*FAST, "model._target_=hypergrad.tasks.bundled.linear_factory")
    with pytest.raises(ConfigError, match=r"model._target_=hypergrad.tasks.bundled."
                                          r"linear_factory does not take hidden, activation, "
                                          r"batchnorm: .*--config-dir conf model=mine"):
        check_keys(cfg)
    with pytest.raises(ConfigError, match=r"'model.hiden' \(did you mean model.hidden\?\)"):
        check_keys(_compose(*FAST, "+model.hiden=3"))  # a typo stays one


def test_a_resume_that_starts_afresh_records_its_own_config(tmp_path: Path) -> None:
    """A run killed before its first checkpoint leaves config_resolved.yaml alone; resumed with
    other settings (it starts afresh: nothing to resume), the folder kept the killed run's
    config_resolved.yaml (task.steps=3000) beside results of the new one (T = 12)."""
    (tmp_path / "config_resolved.yaml").write_text("task:\n  steps: 3000\n")
    results = cli.run(_compose(*FAST, "report.retrain=false", "folder.resume=true"), tmp_path)
    assert results["T"] == 12
    written = yaml.safe_load((tmp_path / "config_resolved.yaml").read_text())
    assert written["task"]["steps"] == 12
    assert not (tmp_path / "config_resolved.resume-1.yaml").exists()


def test_a_refusal_inside_your_own_task_builder_is_a_usage_error(tmp_path: Path) -> None:
    """A task builder of your own that passes a setting hypergrad refuses (steps=-3 to
    InnerProblem) got Hydra's 'Error in call to target my_task.build' and exit status 1, as if
    the builder had failed; hypergrad's own refusal is a usage error (status 2) naming the key,
    the builder and the fix, wherever it is called from. An error of the builder's own code
    keeps Hydra's answer."""
    (tmp_path / "my_task.py").write_text(
        "import torch\nimport hypergrad as hg\n\n\n"
        "def build(hyperparams, optimizer, model, steps=5, fail=False):\n"
        "    if fail:\n"
        "        raise ValueError('my own builder failed')\n"
        "    x = torch.randn(16, 3)\n"
        "    y = x.sum(1)\n"
        "    return hg.InnerProblem(torch.nn.Linear(3, 1),\n"
        "                           lambda m, b, hp: ((m(b[0])[:, 0] - b[1]) ** 2).mean(),\n"
        "                           optimizer, hyperparams, [(x, y)], steps,\n"
        "                           lambda m, hp: ((m(x)[:, 0] - y) ** 2).mean())\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "task=custom", "task._target_=my_task.build", *FAST, *args,
                               f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True,
                              text=True, cwd=tmp_path, env=ENV, timeout=300)

    out = run("++task.steps=-3")
    assert out.returncode == 2, out.stderr
    assert "hypergrad-run: task (my_task.build): InnerProblem: steps=-3 must be" in out.stderr
    out = run("+task.fail=true")
    assert out.returncode == 1 and "my own builder failed" in out.stderr, out.stderr


def test_a_sweep_whose_jobs_share_one_folder_keeps_the_first_jobs_run(tmp_path: Path) -> None:
    """``-m seed=0,1 folder.overwrite=true hydra.sweep.subdir=one``: job #1 deleted job #0's
    run (an INFO line said so) and the sweep exited 0 with seed 1's run alone. The second job
    is refused naming the subdir's fix; without overwrite the refusal named hydra.run.dir,
    which a sweep ignores."""
    out = _cli("--multirun", "seed=0,1", "folder.overwrite=true", *FAST, "report.retrain=false",
               f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=one")
    assert out.returncode != 0
    assert "job 0 of the same sweep wrote its run" in out.stderr
    assert "hydra.sweep.subdir=${hydra.job.num}" in out.stderr
    assert (tmp_path / "one" / "results.json").exists()
    assert yaml.safe_load((tmp_path / "one" / "config_resolved.yaml").read_text())["seed"] == 0
    folder = tmp_path / "again"
    assert _cli(*FAST, "report.retrain=false", f"hydra.run.dir={folder / '0'}").returncode == 0
    out = _cli("--multirun", "seed=0,1", *FAST, "report.retrain=false",
               f"hydra.sweep.dir={folder}")
    assert "choose another folder with hydra.sweep.dir=... or hydra.sweep.subdir=" in out.stderr


def test_a_diverged_grid_point_is_never_the_best_of_the_grid() -> None:
    """The report marked the grid's best with min() over the rows' validation losses: a first
    grid point whose loss was NaN (it diverged) was returned by min() and marked best."""
    rows = [{"hyperparameters": "learned", "val_loss": 0.5},
            {"hyperparameters": "grid lr=1e+30", "val_loss": math.nan},
            {"hyperparameters": "grid lr=10", "val_loss": math.inf},
            {"hyperparameters": "grid lr=1", "val_loss": 0.9},
            {"hyperparameters": "grid lr=0.1", "val_loss": 0.7},
            {"hyperparameters": "grid lr=0.01"}]
    cli._mark_best_of_grid(rows)
    assert [r["hyperparameters"] for r in rows if r.get("best_of_grid")] == ["grid lr=0.1"]
    nan_only = [{"hyperparameters": "grid lr=1", "val_loss": math.nan}]
    cli._mark_best_of_grid(nan_only)
    assert "best_of_grid" not in nan_only[0]


MODELS = '''
import torch
from torch import nn


class OneOutput(nn.Module):  # a last layer of 1 output where the task needs 10
    def __init__(self, n_in, n_out):
        super().__init__()
        self.body = nn.Linear(n_in, 1)

    def forward(self, x):
        return self.body(x)


class Breaks(nn.Module):  # fails after its first few forwards (the task's checks pass)
    calls = 0
    error = RuntimeError("my model broke at call 21")

    def __init__(self, n_in, n_out):
        super().__init__()
        self.body = nn.Linear(n_in, n_out)

    def forward(self, x):
        type(self).calls += 1
        if type(self).calls > 20:
            raise type(self).error
        return self.body(x)


class Interrupts(Breaks):  # Ctrl-C during tuning, as a user presses it
    calls = 0
    error = KeyboardInterrupt()


class RanksFail(Breaks):  # a collective failing as a dead or hung peer makes it
    calls = 0
    from hypergrad.errors import DistributedError
    error = DistributedError("hypergrad.distributed: rank 0 of 2: gathering failed (10 s).")


class Wide(nn.Module):  # a setting of its own, given a string on the command line
    def __init__(self, n_in, n_out, width=16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, width), nn.Linear(width, n_out))

    def forward(self, x):
        return self.body(x)
'''


@pytest.mark.parametrize("model", ["OneOutput", "Breaks", "Wide", "Interrupts", "RanksFail"])
def test_a_failing_model_of_your_own_is_named_and_the_folder_says_why(tmp_path: Path,
                                                                      model: str) -> None:
    """A model of the wrong output shape failed inside the loss with an indexing error naming
    neither the model nor the shape; an error raised in your own code left the run folder's
    cli.log empty (only usage errors were written there). A model of your own that fails on
    its own setting (``model.width=abc``) was answered as a refused setting of the bundled
    task that built it ("task (hypergrad.tasks.bundled.digits_task): empty(): ..."); it is
    your code's error, with the line in your file."""
    (tmp_path / "my_models.py").write_text(MODELS)
    conf = tmp_path / "conf" / "model"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text(f"_target_: my_models.{model}\n_partial_: true\n")
    run_dir = tmp_path / "run"
    bad = ["+model.width=abc"] if model == "Wide" else []
    out = subprocess.run([*CLI, "--config-dir", str(tmp_path / "conf"), "model=mine", *FAST,
                          *bad, "report.retrain=false", f"hydra.run.dir={run_dir}"],
                         capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert out.returncode != 0
    logged = (run_dir / "cli.log").read_text()
    if model == "OneOutput":
        said = ("digits_task: the model (OneOutput, built as model(64, 10)) returns (2, 1) for 2 "
                "examples; the task needs shape (2, 10)")
        assert said in out.stderr and said in logged
    elif model == "Interrupts":  # what to do next, not a page of traceback (exit status 130)
        said = ("hypergrad-run: interrupted (KeyboardInterrupt) before the first checkpoint: "
                f"the run folder {run_dir} holds none to resume from; run the command again "
                f"(hydra.run.dir={run_dir} reuses the folder)")
        assert out.returncode == 130 and said in out.stderr and said in logged
        assert "Traceback" not in out.stderr
    elif model == "RanksFail":  # the command line's timeout and next step, no traceback
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
        assert "gathering failed (10 s). On the command line the timeout is " \
               "distributed.timeout=<seconds>." in out.stderr
        assert (f"hypergrad-run: stopped (the ranks' failure above) before the first "
                f"checkpoint: the run folder {run_dir} holds none") in out.stderr
    elif model == "Wide":
        assert "task (hypergrad.tasks.bundled.digits_task)" not in out.stderr
        assert re.search(r"caused by TypeError: empty\(\).*\(in your code: \S*my_models.py:"
                         r"\d+, __init__\)", out.stderr), out.stderr
        assert re.search(r"raised at \S*linear.py:\d+, from your code at \S*my_models.py:",
                         logged), logged
    else:
        assert "hypergrad-run: the run failed: RuntimeError: my model broke at call 21" in logged
        assert "my_models.py" in logged  # where it was raised


def test_an_interrupted_sweep_says_what_the_command_line_does_next(tmp_path: Path) -> None:
    """Ctrl-C in a --multirun printed Hydra's traceback with the Trainer's Python advice
    (folder=hypergrad.RunFolder(...)); the command line's was in the job's cli.log only (the
    sweep probe, 2026-12-07)."""
    (tmp_path / "my_models.py").write_text(MODELS)
    conf = tmp_path / "conf" / "model"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text("_target_: my_models.Interrupts\n_partial_: true\n")
    out = subprocess.run([*CLI, "--config-dir", str(tmp_path / "conf"), "--multirun",
                          "model=mine", *FAST, "report.retrain=false",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                         capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert "hypergrad-run: interrupted (KeyboardInterrupt)" in out.stderr, out.stderr[-3000:]
    assert "Trainer: interrupted" not in out.stderr
    # as a single run stops: status 130 (143 for SIGTERM), no traceback (it exited 1 after
    # Python's 60 lines: a pre-empted SLURM sweep read as a crash; the sweeper probe), and the
    # job's summary line says interrupted, not failed
    assert out.returncode == 130 and "Traceback" not in out.stderr, out.stderr[-3000:]
    line = json.loads((tmp_path / "sweep" / cli.SWEEP_SUMMARY).read_text().splitlines()[0])
    assert line["status"] == "interrupted" and line["error"] == "KeyboardInterrupt"


def test_a_second_sweep_into_a_running_sweeps_folder_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep started into the folder of one still running took its multirun.yaml for an
    earlier sweep's (renamed it), replaced its id, and the two mixed their jobs' folders and
    summary lines (the folder probe). The sweep folder is locked while its sweep runs."""
    from omegaconf import OmegaConf

    from hypergrad.cli import KeepSweepRecord

    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    running = KeepSweepRecord()
    running.on_multirun_start(cfg)
    (tmp_path / "multirun.yaml").write_text("the running sweep's\n")
    with pytest.raises(SystemExit) as ended:
        KeepSweepRecord().on_multirun_start(cfg)
    assert ended.value.code == 2
    assert "is in use by another sweep; give this one another hydra.sweep.dir" in \
        capsys.readouterr().err
    assert (tmp_path / "multirun.yaml").read_text() == "the running sweep's\n"
    running.on_multirun_end(cfg)
    later = KeepSweepRecord()
    later.on_multirun_start(cfg)  # after it ended: its records kept as an earlier sweep's
    assert (tmp_path / "multirun.2.yaml").read_text() == "the running sweep's\n"
    later.on_multirun_end(cfg)
    assert not (tmp_path / ".hypergrad_sweep.lock").exists()


def test_a_label_smoothing_that_can_leave_0_1_is_warned_about() -> None:
    """configs.md's example added `smooth` with the scalar kind's identity transform: tuning
    drove it to -0.30 (the loss unbounded below), written to learned.yaml without a word. The
    page now gives transform=logit, and the task warns without it."""
    from hypergrad.errors import HypergradWarning

    smooth = ["+hyperparams/kind@hyperparams.items.smooth=scalar",
              "hyperparams.items.smooth.init=0.1"]
    with pytest.warns(HypergradWarning, match=r"label smoothing 'smooth' has "
                                              r"transform='identity'.*transform=logit"):
        build(_compose(*FAST, *smooth))
    build(_compose(*FAST, *smooth, "hyperparams.items.smooth.transform=logit"))  # no warning
    page = (ROOT / "docs" / "configs.md").read_text()
    assert "hyperparams.items.smooth.transform=logit" in " ".join(page.split())


def test_a_swept_value_outside_the_bounds_is_refused_not_moved(tmp_path: Path) -> None:
    """An Optuna study sampling lr in [100, 10000] against the preset's bounds [1e-4, 1]: the
    Trainer moved every trial's value onto the bound and trained there, while the sweeper
    recorded the value it had asked for (its best reported as lr = 9062, trained at 1.0). In a
    sweep such a job is now refused, naming the value, the bounds and the fix; the jobs inside
    the bounds run."""
    out = _cli("--multirun", "experiment=digits_schedule", *FAST, "report.retrain=false",
               "hyperparams.items.lr.init=0.5,100", f"hydra.sweep.dir={tmp_path}")
    assert out.returncode != 0
    said = ("In a sweep this job is refused (a single run would move them onto the bounds): "
            "the sweeper would record the value it asked for, not the one trained")
    assert said in out.stderr and said in (tmp_path / "1" / "cli.log").read_text()
    # the values as asked and their bounds, not "were moved onto the bounds" (nothing was):
    # the message contradicted itself (the sweeper probe, 2026-12-08)
    assert "initial values outside guards.bounds: lr=[100.0, 100.0, " in out.stderr
    assert "were moved" not in out.stderr and "to silence this" not in out.stderr
    assert not (tmp_path / "1" / "results.json").exists()
    assert json.loads((tmp_path / "0" / "results.json").read_text())["outer_steps"] > 0


def test_a_second_sweep_into_the_same_folder_keeps_the_first_ones_record(tmp_path: Path) -> None:
    """Hydra rewrote the sweep folder's multirun.yaml at every sweep, also when every job of
    the second was refused (its folder held a run): the folder's jobs were then described by
    settings they never ran with. The earlier record is kept as multirun.2.yaml, and the
    command says which job folders are the earlier sweep's."""
    first = _cli("--multirun", "experiment=ridge_diabetes", "mode.outer_steps=1", *FAST,
                 "report.retrain=false", "seed=0,1", f"hydra.sweep.dir={tmp_path}")
    assert first.returncode == 0, first.stderr
    second = _cli("--multirun", "experiment=ridge_diabetes", "mode.outer_steps=1", *FAST,
                  "report.retrain=false", "seed=5", f"hydra.sweep.dir={tmp_path}")
    assert second.returncode != 0  # job 0's folder holds a run: refused
    kept = yaml.safe_load((tmp_path / "multirun.2.yaml").read_text())
    now = yaml.safe_load((tmp_path / "multirun.yaml").read_text())
    assert "seed=0,1" in kept["hydra"]["overrides"]["task"]
    assert "seed=5" in now["hydra"]["overrides"]["task"]
    said = second.stdout + second.stderr
    assert ("holds an earlier sweep: its records are kept (multirun.yaml as multirun.2.yaml, "
            "sweep_summary.jsonl as sweep_summary.2.jsonl)") in said
    assert "its job folders (0, 1) stay" in said
    # the job lines of each sweep apart: job 0 was in one file twice (done, then failed)
    old_jobs = [json.loads(x) for x in (tmp_path / "sweep_summary.2.jsonl").read_text()
                .splitlines()]
    new_jobs = [json.loads(x) for x in (tmp_path / cli.SWEEP_SUMMARY).read_text().splitlines()]
    assert [(r["job"], r["status"]) for r in old_jobs] == [(0, "done"), (1, "done")]
    assert [(r["job"], r["status"]) for r in new_jobs] == [(0, "failed")]


def test_two_jobs_of_one_sweep_never_share_a_folder_in_any_process(tmp_path: Path) -> None:
    """Under joblib each job is a process of its own, and the refusal of a second job of the
    sweep in one folder was kept per process: job 1, folder.overwrite=true, deleted job 0's
    finished run. The folder now says which sweep's job ran there (the process's set is
    emptied here, as another process's would be); another sweep's job may resume or overwrite
    it."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from hypergrad.errors import RunDirError
    from hypergrad.run import RunFolder

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=FAST, return_hydra_config=True)
    run_dir = tmp_path / "shared"

    def job(num: int, sweep: str) -> None:
        (tmp_path / cli.SWEEP_ID).write_text(sweep + "\n")
        c = copy.deepcopy(cfg)
        OmegaConf.set_readonly(c, False)
        with open_dict(c):
            c.hydra.mode, c.hydra.job.num = RunMode.MULTIRUN, num
            c.hydra.sweep.dir = str(tmp_path)
        HydraConfig.instance().set_config(c)
        cli._SWEEP_FOLDERS.clear()  # a job of another process
        cli._prepare_run_dir(RunFolder(run_dir, overwrite=True))
        (run_dir / "results.json").write_text("{}")  # its run

    try:
        job(0, "first")
        with pytest.raises(RunDirError, match=r"where job 0 of the same sweep wrote its run"):
            job(1, "first")
        assert (run_dir / "results.json").exists()
        job(1, "second")  # a sweep run again into the folder: its job 1 may overwrite
        mark = json.loads((run_dir / cli.SWEEP_JOB).read_text())
        assert (mark["sweep"], mark["job"]) == ("second", 1)
        assert mark["overrides"]["debug"] == "fast"  # what a resume of the job compares
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]
        cli._SWEEP_FOLDERS.clear()


def test_results_json_says_what_the_recheck_saw(tmp_path: Path) -> None:
    """The learned point of the default search is the re-check's choice, not always the
    lowest validation loss of metrics.jsonl; the re-check's losses were in cli.log alone.
    results.json keeps them, the returned point marked."""
    out = _cli(*FAST, "outer_optimizer=quasi_newton", "mode.start=auto", "mode.recheck=auto",
               "report.retrain=false", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    checked = res["rechecked"]
    assert len(checked) >= 2 and sum(r["returned"] for r in checked) == 1
    back = next(r for r in checked if r["returned"])
    assert back["values"] == res["learned"] and back["val_loss"] == res["learned_val_loss"]
    assert min(checked, key=lambda r: max(r["val_loss"], r["variant_val_loss"])) is back
    # the search's plain runs are kept too (metrics.jsonl has the hypergradients' points
    # only): the start's points, each with its values, and every re-checked point is one of
    # the points evaluated
    evals = res["evaluations"]
    assert sum(e["kind"] == "start" for e in evals) >= 2
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    seen = [(e["values"], e["val_loss"]) for e in evals] + [
        (r["hyperparams"], r["val_loss"]) for r in lines if "hyperparams" in r]
    assert all((r["values"], r["val_loss"]) in seen for r in checked)


def test_a_sweep_keeps_a_line_per_job_whatever_the_launcher(tmp_path: Path) -> None:
    """A sweep with the basic launcher or joblib left its results in one folder per job and
    its failures in the middle of the output: sweep_summary.jsonl has a line per job, what it
    returned to the sweeper and its learned point, or why it failed."""
    out = _cli("--multirun", *FAST, "report.retrain=false", "hyperparams.items.lr.init=0.5,-1",
               f"hydra.sweep.dir={tmp_path}")
    assert out.returncode != 0  # job 1 is refused
    lines = [json.loads(x) for x in (tmp_path / cli.SWEEP_SUMMARY).read_text().splitlines()]
    by = {r["job"]: r for r in lines}
    assert sorted(by) == [0, 1]
    done, failed = by[0], by[1]
    res = json.loads((tmp_path / "0" / "results.json").read_text())
    assert done["status"] == "done" and done["learned"] == res["learned"]
    assert done["returned"] == pytest.approx(cli.objective(res))
    assert done["folder"] == str(tmp_path / "0") and "hyperparams.items.lr.init=0.5" in \
        done["overrides"]
    assert failed["status"] == "failed" and "hyperparams.items.lr.init=-1" in failed["overrides"]
    assert failed["error"].startswith("ConfigError: ") and "lr" in failed["error"]


def test_an_interrupted_sweep_job_names_the_sweep_folder_to_resume(tmp_path: Path) -> None:
    """A --multirun job interrupted said to continue with hydra.run.dir=<its folder>, which a
    sweep ignores: following it restarted every job afresh in a new folder."""
    (tmp_path / "my_models.py").write_text(MODELS)
    conf = tmp_path / "conf" / "model"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text("_target_: my_models.Interrupts\n_partial_: true\n")
    sweep = tmp_path / "sweep"
    out = subprocess.run([*CLI, "--multirun", "--config-dir", str(tmp_path / "conf"),
                          "model=mine", *FAST, "report.retrain=false", "seed=0",
                          f"hydra.sweep.dir={sweep}"],
                         capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert out.returncode != 0
    logged = (sweep / "0" / "cli.log").read_text()
    assert (f"run the command again (hydra.sweep.dir={sweep} (the sweep's folder: each job "
            f"resumes its own) reuses the folders)") in logged, logged
    assert "hydra.run.dir" not in logged


def test_a_sweep_into_a_relative_folder_with_chdir_keeps_its_record(tmp_path: Path) -> None:
    """With hydra.job.chdir=true a relative hydra.sweep.dir (the default is one) was looked
    for from each job's run folder: no sweep_summary.jsonl was written, without a word, and
    no job marked its folder (the guard that keeps two jobs of one sweep apart was off)."""
    out = subprocess.run([*CLI, "--multirun", *FAST, "report.retrain=false", "seed=0,1",
                          "hydra.job.chdir=true", "hydra.sweep.dir=rel/sweep"],
                         capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    folder = tmp_path / "rel" / "sweep"
    lines = [json.loads(x) for x in (folder / cli.SWEEP_SUMMARY).read_text().splitlines()]
    assert sorted(r["job"] for r in lines) == [0, 1]
    assert all(r["status"] == "done" for r in lines)
    for job in ("0", "1"):
        assert json.loads((folder / job / cli.SWEEP_JOB).read_text())["job"] == int(job)


def test_a_kind_option_without_its_required_key_is_a_usage_error(tmp_path: Path) -> None:
    """``hyperparams/kind@hyperparams.items.lr=per_group`` without ``groups`` ended in a 40-line
    traceback through Hydra's instantiate (omegaconf's MissingMandatoryValue, exit status 1):
    now one message naming the key and how to give it, exit status 2."""
    out = _cli(*FAST, "hyperparams/kind@hyperparams.items.lr=per_group",
               f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "hyperparams.items.lr.groups has no value and needs one" in out.stderr
    assert "hyperparams.items.lr.groups=<value>" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(("choice", "key"), [("mode=online", "mode.outer_steps"),
                                             ("inner_optimizer=adam", "inner_optimizer.momentum")])
def test_a_preset_key_the_option_chosen_beside_it_lacks_is_explained(
        tmp_path: Path, choice: str, key: str) -> None:
    """``experiment=digits_schedule mode=online`` failed with Hydra's "Key 'outer_steps' not
    in 'OnlineConf'" alone: neither who set the key nor what to do."""
    out = subprocess.run([*CLI, "experiment=digits_schedule", choice,
                          f"hydra.run.dir={tmp_path}"], capture_output=True, text=True,
                         env=ENV, timeout=300)
    group, _, option = choice.partition("=")
    assert out.returncode == 1 and (
        f"hypergrad-run: experiment=digits_schedule sets {key} for its own {group} option, "
        f"and {choice} has no '{key.rpartition('.')[2]}'") in out.stderr, out.stderr
    assert ("experiment=online_digits is the bundled online preset" in out.stderr) == (
        option == "online")


@pytest.mark.parametrize(("word", "said"), [
    ("report", "'report' is not an override: the arguments are Hydra overrides, key=value"),
    ("digits_schedule", "'digits_schedule' is a preset: give it as experiment=digits_schedule")])
def test_a_word_that_is_no_override_is_explained(tmp_path: Path, word: str, said: str) -> None:
    """``hypergrad-run report`` (there is no report command) and a preset's name alone got
    only Hydra's "Error parsing override ... missing EQUAL" (the callbacks and records probe,
    2026-12-07)."""
    from hypergrad.cli import _bare_word

    out = subprocess.run([*CLI, word, f"hydra.run.dir={tmp_path}"], capture_output=True,
                         text=True, env=ENV, timeout=300)
    assert out.returncode == 1 and said in out.stderr, out.stderr
    assert _bare_word(["--config-dir", "mine", "experiment=charlm", "~seed", "-m"]) is None
    # --cfg job: 'job' is the flag's value (it was told "not an override" under Hydra's own
    # error of a misspelt key; the docs probe)
    assert _bare_word(["--cfg", "job", "task.n_trian=5"]) is None
    assert _bare_word(["-c", "all", "experiment=charlm"]) is None


def test_a_bad_report_setting_is_refused_before_any_work(tmp_path: Path) -> None:
    """report.orders=-1 was refused only after the tuning and the retraining: the run's
    results.json, learned.yaml and model were never written (the report probe, 2026-12-07)."""
    from hypergrad.cli import run

    with pytest.raises(ConfigError, match=r"report.orders=-1 must be an int >= 0"):
        run(_compose(*FAST, "report.orders=-1"), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing trained, no folder made


def test_a_missing_hydra_plugin_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """hydra/launcher=joblib or +sweep=... without their plugins got Hydra's "Could not find
    'hydra/launcher/joblib'" alone (the packaging probe, 2026-12-07)."""
    import importlib.util

    from hypergrad.cli import _missing_plugin

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert "pip install 'hypergrad-forward[sweep]'" in str(
        _missing_plugin(["--multirun", "hydra/launcher=joblib"]))
    # in an environment of its own: it pins optuna<3, which would replace compare's optuna>=4
    # (the sweep probe, 2026-12-07)
    apart = "pip install 'hypergrad-forward[sweep-optuna]' in a virtual environment of its own"
    assert apart in str(_missing_plugin(["+sweep=digits_schedule", "--multirun"]))
    assert _missing_plugin(["experiment=charlm"]) is None
    monkeypatch.undo()
    found = importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None
    assert (_missing_plugin(["hydra/launcher=joblib"]) is None) == found


def test_a_list_of_one_groups_options_is_told_to_sweep() -> None:
    """method=[forward,reverse] (a list meant as a sweep) got Hydra's "Merge error:
    ReverseModeConf is not a subclass of ForwardModeConf" alone (the sweep probe, 2026-12-07)."""
    out = _cli(*FAST, "method=[forward,reverse]", "hydra.run.dir=/nonexistent/never")
    assert out.returncode == 1
    assert ("method=[forward,reverse] gives the method group a list of options, which Hydra "
            "merges into one config; to run each of them, sweep: hypergrad-run --multirun "
            "method=forward,reverse." in out.stderr), out.stderr


def test_the_retrained_points_are_also_trained_in_orders_the_tuning_never_saw(
        tmp_path: Path) -> None:
    """The retrained table trains every point in the tuning's batch order, the one the learned
    point was chosen in: the demo's learned row led the best grid point on validation there,
    and in other orders the grid point had the lower test loss (the reports probe).
    ``table_other_orders`` holds each point's mean over report.orders orders the tuning never
    saw (variants 3, 4), the best grid point marked by those."""
    import torch

    from hypergrad.config import build

    out = _cli(*FAST, "report.orders=2", "mode.outer_steps=1", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    other = res["table_other_orders"]
    assert other["variants"] == [3, 4]
    assert [r["hyperparameters"] for r in other["rows"]] == [
        r["hyperparameters"] for r in res["table"]]
    assert "batch orders the tuning never saw" in (tmp_path / "cli.log").read_text()
    task, _ = build(_compose(*FAST, "report.orders=2"))
    p = task.problem
    initial = next(r for r in other["rows"] if r["hyperparameters"] == "initial")
    vals = []
    for k in (3, 4):
        with p.variant(k), torch.no_grad():
            s = p.run(p.init_raw())
            vals.append(float(p.objective(s.params, s.buffers, p.init_raw())))
    assert initial["val_loss"] == pytest.approx(sum(vals) / 2, rel=1e-6)
    assert initial["val_loss"] != next(r for r in res["table"]
                                       if r["hyperparameters"] == "initial")["val_loss"]
    grid = [r for r in other["rows"] if r["hyperparameters"].startswith("grid ")]
    assert [r.get("best_of_grid", False) for r in grid] == [
        r["val_loss"] == min(g["val_loss"] for g in grid) for r in grid]
    # 0: none; a bad value is refused
    out = _cli(*FAST, "report.orders=0", "mode.outer_steps=1",
               f"hydra.run.dir={tmp_path / 'none'}")
    assert out.returncode == 0 and "table_other_orders" not in json.loads(
        (tmp_path / "none" / "results.json").read_text())
    out = _cli(*FAST, "report.orders=-1", f"hydra.run.dir={tmp_path / 'bad'}")
    assert out.returncode == 2 and "report.orders=-1 must be an int >= 0" in out.stderr


def test_an_online_run_that_diverged_says_which_steps_its_point_trained(tmp_path: Path) -> None:
    """It logged "after update 0, inner step 40" for a run stopped at step 8 whose point the
    first 4 steps used (the online probe, 2026-12-07)."""
    out = _cli("experiment=online_digits", *FAST, "task.steps=40",
               "mode.interval=4", "outer_optimizer=sgd", "outer_optimizer.lr=300",
               "guards.bounds.lr=[1e-4,1e6]", "report.orders=0", "report.retrain=false",
               f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-2000:]
    log = out.stdout + out.stderr
    assert "learned hyperparameters (after 0 updates: the values of inner steps up to 4)" in log


def test_a_sweep_resumed_with_other_values_is_refused_and_with_the_same_resumes(
        tmp_path: Path) -> None:
    """A sweep run again with folder.resume=true resumed job N's run whatever values the new
    sweep gave job N: an Optuna sweep proposes new ones, and the study recorded lr=0.0123 with
    the loss of the run made at lr=0.0748 (the Optuna probe). Here a grid stands in for the
    sampler's new proposals."""
    args = ["--multirun", "experiment=ridge_diabetes", "mode.outer_steps=1", *FAST,
            "report.retrain=false", f"hydra.sweep.dir={tmp_path}"]
    first = _cli(*args, "seed=0,1")
    assert first.returncode == 0, first.stderr
    again = _cli(*args, "seed=0,1", "folder.resume=true")
    assert again.returncode == 0, again.stderr
    other = _cli(*args, "seed=1,0", "folder.resume=true")
    assert other.returncode != 0
    said = other.stdout + other.stderr
    assert ("folder.resume=true in a sweep, but " in said and "holds the run of job 0 made "
            "with other values than this job's (seed: 0 -> 1)" in said), said[-3000:]
    # what a single run's resume may change, a sweep's may too: more outer steps, what is
    # reported (refused as "other values" until 2026-12-08: a sweep's runs could not be
    # extended; the sweeper probe); fewer outer steps stay refused (the result would be the
    # longer run's, recorded under the fewer)
    longer = [a for a in args if a not in ("mode.outer_steps=1", "report.retrain=false")]
    more = _cli(*longer, "mode.outer_steps=2", "report.retrain=true", "seed=0,1",
                "folder.resume=true")
    assert more.returncode == 0, more.stderr[-3000:]
    for job in ("0", "1"):
        assert len((tmp_path / job / "metrics.jsonl").read_text().splitlines()) == 2
    fewer = _cli(*args, "seed=0,1", "folder.resume=true")
    assert fewer.returncode != 0
    assert "(mode.outer_steps: 2 -> 1)" in fewer.stdout + fewer.stderr



def test_compare_methods_times_the_runs_own_method(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """report.compare_methods built a fresh ForwardMode(): the run's method.compile=false (or
    an HVP chunk size) was dropped, and its compile trial was timed into the comparison, 14.5 s
    against 0.04 (the report probe, 2026-12-07)."""
    from hypergrad import ForwardMode
    from hypergrad.cli import run

    seen: list[object] = []
    real = ForwardMode.hypergradient

    def spy(self: ForwardMode, problem: object, lam: object) -> object:
        seen.append(self.compile)
        return real(self, problem, lam)  # type: ignore[arg-type]

    monkeypatch.setattr(ForwardMode, "hypergradient", spy)
    run(_compose(*FAST, "method=forward", "method.compile=false", "report.compare_methods=true",
                 "report.retrain=false"), tmp_path)
    assert seen and seen[-1] is False  # the compare's call: the run's own setting
