"""The Hydra layer: real configs compose, every option instantiates, bad values fail at
composition naming the key, and every experiment preset runs end to end with the debug preset."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import DictConfig
from omegaconf.errors import ValidationError

import hypergrad as hg
from hypergrad.cli import run
from hypergrad.config import CONFIG_DIR, build, register_configs
from hypergrad.errors import HypergradWarning, ResumeMismatchError, RunDirError
from hypergrad.trainer import Trainer

register_configs()
GROUPS = ["problem", "model", "hyperparams", "inner_optimizer", "outer_optimizer", "method"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONFIG_DIR / g).glob("*.yaml"))]
PRESETS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def _compose(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def test_every_group_has_options_and_presets_exist() -> None:
    assert {g for g, _ in OPTIONS} == set(GROUPS)
    assert {"digits_schedule", "hypercleaning", "ridge_diabetes", "breast_cancer_l2",
            "online_digits", "sparse_regression"} <= set(PRESETS)


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_instantiates(group: str, option: str) -> None:
    # options that read another group's values (interpolations) compose within their preset
    context = {("hyperparams", "sparse_weights"): ["experiment=sparse_regression"]}
    cfg = _compose([*context.get((group, option), []), f"{group}={option}", "debug=fast"])
    if group == "problem":  # a problem needs matching parts: take them from a preset using it
        preset = {"digits": "digits_schedule", "hypercleaning": "hypercleaning",
                  "ridge_diabetes": "ridge_diabetes", "breast_cancer": "breast_cancer_l2",
                  "sparse_regression": "sparse_regression"}
        cfg = _compose([f"experiment={preset[option]}", "debug=fast"])
        task, trainer = build(cfg)
        assert isinstance(task.problem, hg.InnerProblem) and isinstance(trainer, Trainer)
        return
    obj = instantiate(cfg[group], _convert_="all")
    expected = {"model": callable, "hyperparams": lambda o: isinstance(o, hg.HyperParams),
                "inner_optimizer": lambda o: isinstance(o, hg.optim.Optimizer),
                "outer_optimizer": callable,
                "method": lambda o: isinstance(o, (hg.Method, hg.AutoMethod))}[group]
    assert expected(obj), obj


@pytest.mark.parametrize("override,key", [
    ("problem.n_trian=5", "n_trian"),          # a typo in a key
    ("problem.steps=abc", "steps"),            # a wrong type
    ("trainer.mode=sideways", "mode"),         # not one of the choices
    ("method.hvp=magic", "hvp"),
    ("trainer.outer_steps=1.5", "outer_steps"),
    ("hyperparams.items.lr.windowz=3", "windowz"),
])
def test_bad_values_fail_at_composition(override: str, key: str) -> None:
    with pytest.raises((ConfigCompositionException, ValidationError)) as info:
        _compose([override])
    text = str(info.value) + str(info.value.__cause__)
    assert key in text


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_end_to_end_with_debug(preset: str, tmp_path: Path) -> None:
    cfg = _compose([f"experiment={preset}", "debug=fast"])
    results = run(cfg, tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["name"] == preset and on_disk["outer_steps"] >= 1
    labels = [r["hyperparameters"] for r in on_disk["table"]]
    assert labels[0] == "initial" and "learned" in labels
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == on_disk["outer_steps"]
    for png in results["plots"]:
        assert (tmp_path / png).stat().st_size > 1000
    assert (tmp_path / "config_resolved.yaml").exists()
    if preset == "ridge_diabetes":
        assert on_disk["extra"]["closed_form"]["rel_diff_finite_T"] < 1e-10
    if preset == "hypercleaning":
        assert 0 <= on_disk["extra"]["flip_detection"]["f1"] <= 1
        assert set(on_disk["compare_methods"]) == {"forward", "reverse"}


# -- issue 12 ------------------------------------------------------------------------------------
def test_the_bare_config_is_consistent() -> None:
    cfg = _compose([])  # bare `hypergrad-run`: every hyperparameter bound
    task, trainer = build(cfg)
    task.problem.check(task.problem.init_raw())
    assert isinstance(trainer, Trainer) and task.problem.hyperparams.names == ["lr"]


@pytest.mark.filterwarnings("ignore::hypergrad.errors.TuningWarning")  # 2 outer steps of Adam
def test_a_check_that_cannot_apply_is_skipped_and_results_are_written(tmp_path: Path) -> None:
    cfg = _compose(["experiment=ridge_diabetes", "debug=fast", "inner_optimizer=adam",
                    "report.plots=false"])
    with pytest.warns(HypergradWarning, match="closed-form check of the hypergradient is "
                                              "skipped"):
        run(cfg, tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert "plain gradient descent" in on_disk["extra"]["closed_form"]["skipped"]


def test_per_example_size_is_checked_when_building() -> None:
    cfg = _compose(["experiment=hypercleaning", "debug=fast", "hyperparams.items.weights.n=10"])
    with pytest.raises(Exception, match=r"'weights' has n=10 but n_train=500"):
        build(cfg)


def _strict(text: str) -> Any:
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))


def test_resume_keeps_the_original_config_and_refuses_changes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    base = ["experiment=ridge_diabetes", "debug=fast", "report.plots=false",
            "report.retrain=false"]
    with caplog.at_level(logging.INFO, logger="hypergrad"):
        run(_compose(base), tmp_path)
    assert re.search(r"learned hyperparameters \(outer step \d\): l2=\d", caplog.text)
    first = (tmp_path / "config_resolved.yaml").read_text()
    _strict((tmp_path / "results.json").read_text())
    with pytest.raises(RunDirError, match="already holds a run.*trainer.resume=true"):
        run(_compose(base), tmp_path)
    run(_compose(base + ["trainer.resume=true", "trainer.outer_steps=3"]), tmp_path)
    assert (tmp_path / "config_resolved.yaml").read_text() == first
    assert "outer_steps: 3" in (tmp_path / "config_resolved.resume-1.yaml").read_text()
    assert _strict((tmp_path / "results.json").read_text())["outer_steps"] == 3
    with pytest.raises(ResumeMismatchError, match=r"config.problem.steps: 12 -> 10"):
        run(_compose(base + ["trainer.resume=true", "problem.steps=10"]), tmp_path)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["outer_step"] for x in lines] == [0, 1, 2]
    run(_compose(base + ["trainer.overwrite=true", "trainer.outer_steps=1"]), tmp_path)
    assert not (tmp_path / "config_resolved.resume-1.yaml").exists()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1
