"""The Hydra layer: real configs compose, every option instantiates, bad values fail at
composition naming the key, and every experiment preset runs end to end with the debug preset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import DictConfig
from omegaconf.errors import ValidationError

import hypergrad as hg
from hypergrad.cli import run
from hypergrad.config import CONFIG_DIR, build, register_configs
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
                "method": lambda o: isinstance(o, hg.Method) or o == "auto"}[group]
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
