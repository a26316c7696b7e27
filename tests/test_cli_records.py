"""`hypergrad-run`'s run records and settings, found by review (2026-11-27): every setting
reaches what it names or is refused, an overwrite that is refused keeps the old run, nothing a
run does not write again stays from an earlier one, and a bare InnerProblem runs online too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import hypergrad.cli as cli
from hypergrad.config import CONFIG_DIR, check_keys, global_groups
from hypergrad.errors import ConfigError

FAST = ["debug=fast", "report.plots=false", "callbacks.progress=false"]


def _compose(*overrides: str) -> DictConfig:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_folder_inner_every_reaches_the_run_folder(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """It was dropped: the CLI built its RunFolder without it (no checkpoint inside an inner
    run, and inner_every=0 was not refused)."""
    seen: list[Any] = []

    def stop(cfg: Any, folder: Any) -> Any:
        seen.append(folder.inner_every)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build", stop)
    with pytest.raises(KeyboardInterrupt):
        cli.run(_compose(*FAST, "folder.inner_every=4"), tmp_path / "a")
    assert seen == [4]
    with pytest.raises(ConfigError, match=r"inner_every=0 must be an int >= 1"):
        cli.run(_compose(*FAST, "folder.inner_every=0"), tmp_path / "b")


def test_a_refused_overwrite_keeps_the_old_run_and_an_overwrite_removes_its_tb_logs(
        tmp_path: Path) -> None:
    """The old run's files went before the new settings were built, so an overwrite refused
    for a misspelt bound lost the run; TensorBoard's event files stayed behind."""
    cli.run(_compose(*FAST, "report.retrain=false"), tmp_path)
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(b"old")
    (tmp_path / "tb" / "learned").mkdir()  # the learned point's HParams entry (it stayed)
    (tmp_path / "tb" / "learned" / "events.out.tfevents.1.host").write_bytes(b"old")
    before = _files(tmp_path)
    assert "checkpoint.pt" in before and "results.json" in before
    with pytest.raises(ConfigError, match=r"bounds name 'lrr' is not a hyperparameter"):
        cli.run(_compose(*FAST, "folder.overwrite=true", "+guards.bounds.lrr=[0.001,1]"),
                tmp_path)
    assert _files(tmp_path) == before
    cli.run(_compose(*FAST, "report.retrain=false", "folder.overwrite=true"), tmp_path)
    assert not (tmp_path / "tb" / "events.out.tfevents.1.host").exists()
    assert not (tmp_path / "tb" / "learned" / "events.out.tfevents.1.host").exists()


def test_a_resume_that_does_not_retrain_leaves_no_model_of_other_values(
        tmp_path: Path) -> None:
    """model_learned.pt (and the plots with report.plots=false) stayed from the first run,
    trained at the values it had learned, beside a results.json with other ones."""
    cli.run(_compose("debug=fast", "callbacks.progress=false", "mode.outer_steps=2"), tmp_path)
    assert (tmp_path / "model_learned.pt").exists() and (tmp_path / "val_curve.png").exists()
    cli.run(_compose(*FAST, "report.retrain=false", "mode.outer_steps=3",
                     "folder.resume=true"), tmp_path)
    assert not (tmp_path / "model_learned.pt").exists()
    assert not (tmp_path / "val_curve.png").exists()
    assert (tmp_path / "config_resolved.resume-1.yaml").exists()


def test_a_bare_inner_problem_runs_online_with_retraining(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder may return an InnerProblem (no evaluate): the online report called
    task.evaluate anyway (TypeError: 'NoneType' object is not callable, no results.json)."""
    (tmp_path / "bare_task_online.py").write_text(
        "from hypergrad.tasks.bundled import digits_task\n"
        "def build(hyperparams, optimizer, model, steps=12, seed=0):\n"
        "    return digits_task(hyperparams, optimizer, model, steps=steps, seed=seed).problem\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    results = cli.run(_compose("task=custom", "task._target_=bare_task_online.build",
                               "experiment=online_digits", "debug=fast_online",
                               "report.plots=false", "callbacks.progress=false"), out)
    assert (out / "results.json").exists()
    assert [r["hyperparameters"] for r in results["table"]][:2] == [
        "initial", "online run (its own final state)"]
    # no evaluate: each row has the validation loss of its retrained state (the table had no
    # number), which the sweep's objective reads (the online record's is another state's)
    learned = next(r for r in results["table"] if r["hyperparameters"] == "learned")
    assert cli.objective(results) == learned["val_loss"]


def test_the_sweep_objective_is_the_tunings_validation_loss_not_evaluates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An evaluate reporting its own val_loss (here 100x the objective; a model in eval mode
    where the objective runs it in train mode) was the learned row's val_loss, and the value a
    sweeper got (197 where tuning minimised 1.97). It is kept as evaluate.val_loss."""
    import warnings

    from hypergrad.errors import HypergradWarning

    (tmp_path / "own_val_task.py").write_text(
        "import hypergrad as hg\n"
        "from hypergrad.tasks.bundled import digits_task\n"
        "def build(hyperparams, optimizer, model, steps=12, seed=0):\n"
        "    t = digits_task(hyperparams, optimizer, model, steps=steps, seed=seed)\n"
        "    p = t.problem\n"
        "    def evaluate(state):\n"
        "        return {'val_loss': 100 * float(p.objective(state.params, state.buffers,\n"
        "                                                    p.init_raw())), 'other': 1.0}\n"
        "    return hg.Task(p, evaluate=evaluate, name='own_val')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        results = cli.run(_compose("task=custom", "task._target_=own_val_task.build",
                                   "hyperparams=lr_momentum", "inner_optimizer=sgd",
                                   "inner_optimizer.momentum=momentum", "mode.outer_steps=1",
                                   "report.plots=false", "callbacks.progress=false"), out)
    learned = next(r for r in results["table"] if r["hyperparameters"] == "learned")
    assert learned["evaluate.val_loss"] == pytest.approx(100 * learned["val_loss"])
    assert learned["other"] == 1.0
    # the learned row is the returned point trained again: the tuning's own loss
    assert learned["val_loss"] == pytest.approx(results["learned_val_loss"], rel=1e-6)
    assert cli.objective(results) == learned["val_loss"]
    assert any(issubclass(w.category, HypergradWarning) and "evaluate.val_loss" in str(w.message)
               for w in said)


def test_a_metric_named_like_a_rows_own_field_keeps_its_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A metric 'best_of_grid' was overwritten by the grid's mark and left out of the printed
    table; one named 'error' read as a failed evaluate. Both are kept as evaluate.<name>."""
    import warnings

    (tmp_path / "own_field_task.py").write_text(
        "import hypergrad as hg\n"
        "from hypergrad.tasks.bundled import digits_task\n"
        "def build(hyperparams, optimizer, model, steps=6, seed=0):\n"
        "    t = digits_task(hyperparams, optimizer, model, steps=steps, seed=seed)\n"
        "    return hg.Task(t.problem, evaluate=lambda s: {'best_of_grid': 0.25, 'error': 0.5},\n"
        "                   name='own_field')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = cli.run(_compose("task=custom", "task._target_=own_field_task.build",
                                   "hyperparams=lr_momentum", "inner_optimizer=sgd",
                                   "inner_optimizer.momentum=momentum", "mode.outer_steps=1",
                                   "report.plots=false", "callbacks.progress=false"),
                          tmp_path / "run")
    for row in results["table"]:
        assert row["evaluate.best_of_grid"] == 0.25 and row["evaluate.error"] == 0.5, row
        assert "error" not in row and "best_of_grid" not in row


def test_the_sweep_objective_falls_back_to_the_learned_validation_loss() -> None:
    """A task whose evaluate reports no val_loss gave sweepers NaN."""
    rows = [{"hyperparameters": "initial"}, {"hyperparameters": "learned", "test_loss": 1.0}]
    assert cli.objective({"table": rows, "learned_val_loss": 0.5}) == 0.5
    rows[1]["val_loss"] = 0.25
    assert cli.objective({"table": rows, "learned_val_loss": 0.5}) == 0.25


def test_misspelt_report_keys_and_keys_under_global_groups_are_refused() -> None:
    """`+report.plot=false` ran (with plots) and `+experiment.outer_steps=5` was ignored: only
    nodes with a _target_ were checked, and every chosen group was a valid top-level key."""
    assert global_groups() == {"experiment", "debug", "sweep"}
    with pytest.raises(ConfigError, match=r"'report.plot' \(did you mean report.plots\?\)"):
        check_keys(_compose(*FAST, "+report.plot=false"))
    cfg = _compose(*FAST, "+experiment.outer_steps=5")
    check_keys(cfg, ["experiment"])  # a group's own node (a user's +augment=...) is allowed
    with pytest.raises(ConfigError, match=r"'experiment.outer_steps' \(did you mean "
                                          r"mode.outer_steps"):
        check_keys(cfg, [])


def test_a_resumed_runs_records_keep_the_runs_clock(tmp_path: Path) -> None:
    """metrics.jsonl's elapsed restarted at 0 in the resumed invocation (its curve went back in
    time) and results.json said only how long that invocation took."""
    import json

    first = cli.run(_compose(*FAST, "report.retrain=false", "mode.outer_steps=2"), tmp_path)
    more = cli.run(_compose(*FAST, "report.retrain=false", "mode.outer_steps=3",
                            "folder.resume=true"), tmp_path)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    elapsed = [json.loads(line)["elapsed"] for line in lines]
    assert len(elapsed) == 3 and elapsed[1] < elapsed[2] <= more["elapsed"]
    # the first invocation's end (its final evaluation) came after its last record, which the
    # resumed run goes on from: first["elapsed"] may exceed elapsed[2]
    assert elapsed[1] <= first["elapsed"]


def test_a_runs_warnings_are_kept_in_results_json(tmp_path: Path) -> None:
    """Python wrote them to stderr only (not to cli.log, lost under a joblib sweep): a run whose
    inner training diverged (inner lr = 50: validation losses of 3e55) left results.json and
    learned.yaml looking like any other."""
    from hypergrad.errors import TuningWarning

    with pytest.warns(TuningWarning, match="inner training diverges"):
        results = cli.run(_compose(*FAST, "experiment=ridge_diabetes", "inner_optimizer.lr=50"),
                          tmp_path)
    said = [w for w in results["warnings"] if "inner training diverges" in w]
    assert len(said) == 1 and said[0].startswith("TuningWarning: ")
    import json

    assert json.loads((tmp_path / "results.json").read_text())["warnings"] == results["warnings"]


def test_a_rank_other_than_0_names_itself_in_the_shared_log_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun the ranks of one run folder share its cli.log: a refusal every rank
    wrote read as the same line twice."""
    import logging

    handler = logging.FileHandler(tmp_path / "cli.log")
    logging.getLogger().addHandler(handler)
    try:
        cli._to_log_file("hypergrad-run: refused")
        monkeypatch.setenv("RANK", "1")
        cli._to_log_file("hypergrad-run: refused")
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    lines = (tmp_path / "cli.log").read_text().splitlines()
    assert lines == ["hypergrad-run: refused", "(rank 1) hypergrad-run: refused"]


@pytest.mark.parametrize(("outer_lr", "warned"), [(1.0, True), (0.05, False)])
def test_online_learned_values_that_retrain_worse_are_warned(
        tmp_path: Path, outer_lr: float, warned: bool) -> None:
    """An online run's final values, retrained from scratch, trained worse than the initial
    ones (validation 1.04 against 0.47 here; HD's learning rate grown to 1.125 gave 5.6e11),
    and the table showed it without a word: the values an online run ends with suit the end
    of a training, not a whole one."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        results = cli.run(_compose("experiment=online_digits", "task.steps=200",
                                   f"outer_optimizer.lr={outer_lr}", "report.orders=0",
                                   "report.plots=false", "callbacks.progress=false"), tmp_path)
    val = {r["hyperparameters"]: r["val_loss"] for r in results["table"]}
    assert (val["learned"] > val["initial"]) is warned
    said = [str(w.message) for w in seen if "retrained from scratch" in str(w.message)]
    assert len(said) == int(warned)
    if warned:
        assert f"{val['learned']:.4g}" in said[0] and "mode=offline" in said[0]
        assert "TrainResult.state" in said[0]  # the run's own model is there to use
        assert any("retrained from scratch" in w for w in results["warnings"])
    head = (tmp_path / "learned.yaml").read_text().splitlines()[0]
    assert head.startswith("# Caution, not a tuned point: hypergrad-run: the learned "
                           if warned else "# What hypergrad learned")


def test_learned_yaml_of_values_whose_training_diverges_says_so(tmp_path: Path) -> None:
    """learned.yaml called SGD's lr 9e7, which trains to a validation loss of 3.1e7, "What
    hypergrad learned, for your own training": the warning that it is not a tuned point went
    to stderr only."""
    import warnings

    import yaml  # type: ignore[import-untyped]

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        cli.run(_compose(*FAST, "hyperparams.items.lr.init=1e8", "report.orders=0"), tmp_path)
    text = (tmp_path / "learned.yaml").read_text()
    assert text.startswith("# Caution, not a tuned point: Trainer: the inner training diverges")
    assert "# The values hypergrad returned, for your own training" in text
    assert "What hypergrad learned" not in text
    assert yaml.safe_load(text)["optimizer"]["class"] == "torch.optim.SGD"  # still loads


def test_a_run_of_no_outer_step_resumes(tmp_path: Path) -> None:
    """mode.outer_steps=0 (a baseline, the Optuna preset's trials) wrote no checkpoint, so a
    resume found its records and refused it ("it has results.json, ... but no checkpoint"):
    every finished job of a sweep rerun with folder.resume=true failed (the sweeper probe,
    2026-12-08). It resumes to the same result now, and can ask for outer steps."""
    first = cli.run(_compose(*FAST, "mode.outer_steps=0", "report.orders=0"), tmp_path)
    assert (tmp_path / "checkpoint.pt").exists() and first["outer_steps"] == 0
    again = cli.run(_compose(*FAST, "mode.outer_steps=0", "report.orders=0",
                             "folder.resume=true"), tmp_path)
    assert again["learned_val_loss"] == first["learned_val_loss"]
    assert again["table"] == first["table"]
    more = cli.run(_compose(*FAST, "mode.outer_steps=2", "report.orders=0",
                            "folder.resume=true"), tmp_path)
    assert more["outer_steps"] == 2
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
