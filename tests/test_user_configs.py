"""A user's own config folder on top of the bundled presets (``--config-dir``): what it
changes must be what runs, and what it cannot change must be said (the config-folder probe,
2026-12-07)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from hypergrad.config import CONFIG_DIR, build, register_configs
from hypergrad.errors import ConfigError

register_configs()

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "hypergrad.cli"]
FAST = ["debug=fast", "report.plots=false", "report.retrain=false", "callbacks.progress=false",
        "mode.outer_steps=1"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


EXTENDS = """# @package _global_
defaults:
  - digits_schedule
  - _self_
name: mine
hyperparams:
  items:
    momentum: {init: 0.7}
"""


def _run(tmp_path: Path, conf: Path, *args: str) -> tuple[subprocess.CompletedProcess[str],
                                                          dict]:
    out = _cli("--config-dir", str(conf), *args, *FAST, f"hydra.run.dir={tmp_path / 'run'}",
               "folder.overwrite=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    resolved = (tmp_path / "run" / "config_resolved.yaml").read_text()
    import yaml

    return out, {"config": yaml.safe_load(resolved),
                 "results": json.loads((tmp_path / "run" / "results.json").read_text())}


def test_a_preset_extending_a_bundled_one_says_what_it_does_not_inherit(tmp_path: Path) -> None:
    """digits_schedule's sign steps of 0.5 live in experiment_outer/digits_schedule_sign.yaml,
    chosen by the experiment's name: a preset of yours extending it ran sign's 0.1 without a
    word (a different run: val loss 0.789 against 0.390 at debug=fast)."""
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "mine.yaml").write_text(EXTENDS)
    out, got = _run(tmp_path, conf, "experiment=mine")
    assert got["config"]["outer_optimizer"]["lr"] == 0.1
    assert "experiment=mine extends experiment=digits_schedule" in out.stderr
    said = [w for w in got["results"]["warnings"] if w.startswith("ConfigWarning")]
    assert len(said) == 1 and "experiment_outer/mine_sign.yaml" in said[0], said
    # what the warning says to do: inherit them (a copy), or keep sign's own (an empty file)
    (conf / "experiment_outer").mkdir()
    shutil.copy(CONFIG_DIR / "experiment_outer" / "digits_schedule_sign.yaml",
                conf / "experiment_outer" / "mine_sign.yaml")
    out, got = _run(tmp_path, conf, "experiment=mine")
    assert got["config"]["outer_optimizer"]["lr"] == 0.5 and "ConfigWarning" not in out.stderr
    (conf / "experiment_outer" / "mine_sign.yaml").write_text("")
    out, got = _run(tmp_path, conf, "experiment=mine")
    assert got["config"]["outer_optimizer"]["lr"] == 0.1 and "ConfigWarning" not in out.stderr
    # another outer optimizer than the one digits_schedule has settings for: nothing lost
    out, got = _run(tmp_path, conf, "experiment=mine", "outer_optimizer=adam")
    assert "ConfigWarning" not in out.stderr


def test_a_file_of_yours_under_a_bundled_options_name_is_refused(tmp_path: Path) -> None:
    """conf/model/mlp.yaml beside the bundled model/mlp.yaml: Hydra read the bundled one, and
    the user's (width 8 here) was never read, without a word."""
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    text = (CONFIG_DIR / "model" / "mlp.yaml").read_text()
    (conf / "model" / "mlp.yaml").write_text(text + "\n# mine\n")
    out = _cli("--config-dir", str(conf), "model=mlp", *FAST, f"hydra.run.dir={tmp_path / 'r'}",
               cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "has the name of a bundled option (model=mlp)" in out.stderr
    assert "model=mlp_mine" in out.stderr and not (tmp_path / "r" / "results.json").exists()
    # the same bytes (a copy of the bundled folder): nothing is lost, nothing refused
    (conf / "model" / "mlp.yaml").write_text(text)
    out = _cli("--config-dir", str(conf), "model=mlp", *FAST, f"hydra.run.dir={tmp_path / 'r'}",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("group", ["mode", "guards", "outer_optimizer"])
def test_a_group_left_empty_in_a_file_of_yours_is_refused(tmp_path: Path, group: str) -> None:
    """A preset with a ``mode:`` line and nothing under it made the group null: the Trainer
    ran its own default in place of the option chosen, mode=online on the command line
    included (it ran offline), guards without the preset's bounds, QuasiNewton for sign."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "empty.yaml").write_text(
        f"# @package _global_\ndefaults:\n  - digits_schedule\n  - _self_\n{group}:\n")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra.searchpath=[file://{tmp_path}]",
                                           "experiment=empty"])
    with pytest.raises(ConfigError, match=rf"{group} is null .* a config file of yours has a "
                                          rf"`{group}:` line with nothing under it"):
        build(cfg)


def test_an_empty_mode_is_refused_also_where_debug_fills_it(tmp_path: Path) -> None:
    """With debug=fast its mode part merged into the null group (mode.outer_steps offline,
    mode.interval online): the Trainer refused 'got dict {'interval': 4}', naming no file."""
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "empty.yaml").write_text(
        "# @package _global_\ndefaults:\n  - digits_schedule\n  - _self_\nmode:\n")
    out = _cli("--config-dir", str(conf), "experiment=empty", *FAST[:-1],
               f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "mode (chosen: mode=offline) is null" in out.stderr


def test_a_task_file_extending_a_bundled_one_is_told_to_drop_that_entry(tmp_path: Path) -> None:
    """A task file of yours with ``defaults: [digits]`` and its own ``_target_`` kept digits'
    settings, and the refusal told the user to write the file they had already written
    ('a command line cannot remove them ... give your task a config file of its own')."""
    conf = tmp_path / "conf"
    (conf / "task").mkdir(parents=True)
    (conf / "task" / "mix.yaml").write_text(
        "defaults:\n  - digits\n  - _self_\n_target_: hypergrad.Task\n")
    out = _cli("--config-dir", str(conf), "task=mix", *FAST, f"hydra.run.dir={tmp_path / 'r'}",
               cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "your task=mix extends in its defaults list" in out.stderr
    assert "Drop that entry" in out.stderr and "a command line cannot" not in out.stderr


def test_a_number_given_as_a_string_names_oc_decode() -> None:
    """``init: ${oc.env:LR}`` gives the string '0.3': the refusal named the type only."""
    import hypergrad as hg

    with pytest.raises(TypeError, match=r"init='0.3' \(str\) must be a number.*oc\.decode"):
        hg.Scalar("lr", "0.3")
    with pytest.raises(TypeError) as info:
        hg.Scalar("lr", "abc")
    assert "oc.decode" not in str(info.value)


def test_a_folder_of_an_earlier_version_resumes_through_the_cli(tmp_path: Path) -> None:
    """A run folder written before 2026-12-06 holds ``config.mode.search: None`` (later left
    out at null) and no ``multipliers`` / ``scales`` keys (added later at null): every such
    folder was refused, 'config.mode.search: None -> '<absent>'', and no command could give
    the 'original settings' the message asked for (the version-skew probe). A key set to a
    value still counts."""
    import torch

    from hypergrad.run.files import load_checkpoint, save_checkpoint

    run = tmp_path / "run"
    args = ["experiment=digits_schedule", *FAST[:-1], f"hydra.run.dir={run}"]
    out = _cli(*args, "mode.outer_steps=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    got = load_checkpoint(run)
    assert got is not None
    ck = got[0]
    fp = ck["fingerprint"]
    added = [k for k in fp if k.startswith("config.") and k.endswith(
        (".multipliers", ".scales", ".groups", ".default")) and fp[k] is None]
    assert added  # the keys an earlier version did not have
    for k in added:
        del fp[k]
    fp["config.mode.search"] = None
    save_checkpoint(run, ck)
    out = _cli(*args, "mode.outer_steps=2", "folder.resume=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert torch.load(run / "checkpoint.pt", weights_only=True)["outer_step"] == 2
    fp["config.task.steps"] = 99  # a real difference is still refused
    save_checkpoint(run, ck)
    out = _cli(*args, "mode.outer_steps=3", "folder.resume=true", cwd=tmp_path)
    assert out.returncode == 2 and "config.task.steps: 99 -> 12" in out.stderr, out.stderr[-800:]


def test_a_per_tensor_init_by_name_reaches_the_problem_by_name() -> None:
    """``hyperparams.items.wd.init={name: value}`` on the command line: each value goes to the
    parameter it names, whatever the model's order (a list is read in that order)."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[
            "experiment=digits_schedule", "debug=fast",
            "hyperparams.items.wd.init={2.bias:1e-5,0.weight:1e-4,0.bias:1e-3,2.weight:1e-2}"])
    task, _ = build(cfg)
    import hypergrad as hg

    wd = next(h for h in task.problem.hyperparams.items if h.name == "wd")
    assert isinstance(wd, hg.PerTensor)
    assert dict(zip(wd.params, wd.init)) == {"0.weight": 1e-4, "0.bias": 1e-3,
                                             "2.weight": 1e-2, "2.bias": 1e-5}


def test_a_missing_value_in_a_partial_model_of_yours_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``width: ???`` in a model file with ``_partial_: true`` (as docs/own-model.md shows):
    Hydra leaves a missing value out of a partial, so the run trained at the class's default
    width 16 while config.yaml recorded ``???`` (the own-config probe, 2026-12-07)."""
    (tmp_path / "nets_partial49.py").write_text(
        "import torch.nn as nn\n\n\nclass Net(nn.Sequential):\n"
        "    def __init__(self, n_in, n_out, width=16):\n"
        "        super().__init__(nn.Linear(n_in, width), nn.Tanh(), nn.Linear(width, n_out))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text(
        "_target_: nets_partial49.Net\n_partial_: true\nwidth: ???\n")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra.searchpath=[file://{tmp_path}]",
                                           "model=mine", "task.steps=2"])
    with pytest.raises(ConfigError, match=r"^model.width is \?\?\? \(no value\) in a _partial_: "
                                          r"true node: .*nets_partial49.Net's default width=16"):
        build(cfg)
    cfg.model.width = 8  # a value: built at that width
    task, _ = build(cfg)
    assert task.problem.fmodel.module[0].out_features == 8


def test_an_option_of_yours_without_its_schema_line_is_told_so(tmp_path: Path) -> None:
    """A hyperparams option of one's own without ``- schema_hyperparams`` was told of a
    ``hyperparams:`` line with nothing under it, which the file never had."""
    conf = tmp_path / "conf"
    (conf / "hyperparams").mkdir(parents=True)
    (conf / "hyperparams" / "mine.yaml").write_text(
        "defaults:\n  - /hyperparams/kind@items.lr: scalar\n  - _self_\n"
        "items:\n  lr: {init: 0.03, transform: log}\n")
    out = _cli("--config-dir", str(conf), "hyperparams=mine", *FAST,
               f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert ("hyperparams (chosen: hyperparams=mine) holds settings (items) but no _target_: an "
            "option file of your own starts its defaults list with the schema it extends "
            "(schema_hyperparams)") in out.stderr, out.stderr[-2000:]
