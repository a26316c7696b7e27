"""The configuration path's review: values of the wrong type, keys that name no setting and
targets that cannot be imported are refused naming the key, through ``hypergrad-run`` and
through :func:`hypergrad.config.build` alike."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig

import hypergrad as hg
from hypergrad.config import CONFIG_DIR, build, register_configs
from hypergrad.errors import ConfigError

register_configs()


def _compose(overrides: list[str], searchpath: Path | None = None) -> DictConfig:
    extra = [] if searchpath is None else [f"hydra.searchpath=[file://{searchpath}]"]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[*extra, *overrides])


@pytest.mark.parametrize("option", ["adam", "sgd"])
def test_a_torch_outer_optimizers_lr_of_the_wrong_type_fails_at_composition(option: str) -> None:
    """torch.optim's ``lr: float | Tensor`` made the schema's field Any: ``lr=abc`` reached
    torch.optim.Adam, whose ``'<=' not supported between instances of 'float' and 'str'``
    came as a traceback from torch."""
    with pytest.raises(ConfigCompositionException) as info:
        _compose([f"outer_optimizer={option}", "outer_optimizer.lr=abc"])
    assert "outer_optimizer.lr" in str(info.value.__cause__)
    cfg = _compose([f"outer_optimizer={option}", "outer_optimizer.lr=1e-2"])
    assert cfg.outer_optimizer.lr == 0.01


@pytest.fixture
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder: model modules (one that imports a missing dependency) and a config
    folder with model options naming them."""
    (tmp_path / "review_models.py").write_text(
        "from torch import nn\n"
        "class MyNet(nn.Sequential):\n"
        "    def __init__(self, n_in, n_out, width=8):\n"
        "        super().__init__(nn.Linear(n_in, width), nn.Tanh(), nn.Linear(width, n_out))\n")
    (tmp_path / "review_broken_models.py").write_text("import review_no_such_dependency\n")
    for name in ("review_models", "review_broken_models"):
        sys.modules.pop(name, None)
    monkeypatch.syspath_prepend(str(tmp_path))
    conf = tmp_path / "conf" / "model"
    conf.mkdir(parents=True)
    for option, target in [("mine", "review_models.MyNet"), ("typo", "review_models.MyNett"),
                           ("broken", "review_broken_models.MyNet")]:
        (conf / f"{option}.yaml").write_text(f"_target_: {target}\n_partial_: true\n")
    return tmp_path


@pytest.mark.parametrize(("option", "match"), [
    ("typo", r"model._target_=review_models.MyNett: review_models has no 'MyNett'; did you "
             r"mean 'MyNet'\?"),
    ("broken", r"model._target_=review_broken_models.MyNet: importing review_broken_models "
               r"failed: No module named 'review_no_such_dependency'"),
])
def test_a_models_target_that_cannot_be_imported_is_named_with_its_cause(
        option: str, match: str, user_folder: Path) -> None:
    """Was Hydra's "Error locating target 'review_broken_models.MyNet'", without the cause (a
    dependency the user's module imports is missing) or the nearest name; only the task's
    target was located."""
    cfg = _compose([f"model={option}", "debug=fast"], user_folder / "conf")
    with pytest.raises(ConfigError, match=match):
        build(cfg)
    task, _ = build(_compose(["model=mine", "debug=fast"], user_folder / "conf"))
    assert task.problem.fmodel.initial_params()["0.weight"].shape[0] == 8  # MyNet's width


@pytest.mark.parametrize(("override", "near"), [
    ("+trainer.outer_steps=5", "mode.outer_steps"),
    ("+report.plot=false", "report.plots"),
])
def test_build_refuses_a_key_that_names_no_setting(override: str, near: str) -> None:
    """``hypergrad.config.build`` (the compose API's way to a Trainer) ignored a key added
    with ``+`` that names no setting: ``+trainer.outer_steps=5`` ran 2 outer steps, silently;
    only hypergrad-run checked the keys."""
    with pytest.raises(ConfigError, match=rf"did you mean {near}\?.*build\(cfg, groups="):
        build(_compose(["debug=fast", override]))


def test_build_takes_a_users_own_groups_keys() -> None:
    cfg = _compose(["debug=fast", "+augment.noise=0.1"])  # as a group of the user's would
    with pytest.raises(ConfigError, match=r"'augment.noise'"):
        build(cfg)
    _, trainer = build(cfg, groups=["augment"])
    assert trainer.mode.outer_steps == 2


def test_offline_counts_say_auto_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"start='atuo' must be an int >= 0 or \"auto\""):
        hg.Offline(start="atuo")
    with pytest.raises(ValueError, match=r"recheck=-1 must be an int >= 0 or \"auto\""):
        hg.Offline(recheck=-1)


@pytest.mark.parametrize("value", ["false", None, 2])
def test_online_reset_tangents_must_be_a_bool(value: object) -> None:
    """``bool("false")`` is True: ``Online(reset_tangents="false")`` truncated after every
    update."""
    with pytest.raises(TypeError, match=r"reset_tangents=.* must be True or False"):
        hg.Online(interval=5, reset_tangents=value)  # type: ignore[arg-type]
    assert hg.Online(interval=5, reset_tangents=False).reset_tangents is False


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-c", "from hypergrad.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


def test_the_cli_names_a_task_module_that_fails_while_importing(tmp_path: Path) -> None:
    """hypergrad-run checks the keys before building, and that check imported the target:
    the user's module's own ZeroDivisionError came as a traceback through Hydra, not as
    build()'s "importing ... failed" (only the compose API's way gave the message)."""
    (tmp_path / "review_zero_task.py").write_text("x = 1 / 0\n")
    out = _cli(["task=custom", "task._target_=review_zero_task.build", "debug=fast",
                f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("hypergrad-run: task._target_=review_zero_task.build: importing "
                                 "review_zero_task failed: ZeroDivisionError"), out.stderr
    assert "Traceback" not in out.stderr


def test_a_key_a_preset_sets_that_a_users_builder_does_not_take_names_the_preset(
        tmp_path: Path) -> None:
    """debug=fast sets task.steps; a builder of the user's without ``steps`` was told to check
    the spelling of a key the user never typed."""
    (tmp_path / "review_nosteps_task.py").write_text(
        "from hypergrad.tasks.bundled import digits_task\n"
        "def build(hyperparams, optimizer, model, seed=0):\n"
        "    return digits_task(hyperparams, optimizer, model, steps=4, n_train=64, n_val=32,\n"
        "                       batch_size=16, seed=seed)\n")
    out = _cli(["task=custom", "task._target_=review_nosteps_task.build", "debug=fast",
                f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert ("'task.steps' (set by debug=fast, but task._target_=review_nosteps_task.build takes "
            "no 'steps': give it that argument, or leave debug=fast out)") in out.stderr, out.stderr


def test_an_interpolation_naming_no_key_is_refused_naming_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hyperparams=example_weights reads ${task.n_train}; over a task of the user's that has no
    n_train, hypergrad-run answered with a traceback (InterpolationKeyError from the config's
    fingerprint) and build() with Hydra's instantiation error."""
    (tmp_path / "review_own_task.py").write_text(
        "from hypergrad.tasks.bundled import hypercleaning_task\n"
        "def build(hyperparams, optimizer, model, steps=4, seed=0):\n"
        "    return hypercleaning_task(hyperparams, optimizer, model, steps=steps, n_train=40,\n"
        "                              n_val=20, seed=seed)\n")
    sys.modules.pop("review_own_task", None)
    monkeypatch.syspath_prepend(str(tmp_path))
    over = ["task=custom", "task._target_=review_own_task.build", "hyperparams=example_weights",
            "inner_optimizer.lr=0.5",
            "debug=fast"]
    with pytest.raises(ConfigError, match=re.escape(
            "hyperparams.items.weights.n=${task.n_train} does not resolve: Interpolation key "
            "'task.n_train' not found. Give hyperparams.items.weights.n a value of its own "
            "(hyperparams.items.weights.n=...), or add the key it names (+task.n_train=...).")):
        build(_compose(over))
    task, _ = build(_compose([*over, "hyperparams.items.weights.n=40"]))
    assert task.problem.num_hyperparams == 40
    build(_compose(["debug=fast", "name=${hydra:job.name}"]))  # build() reads no name: fine
    out = _cli([*over, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("hypergrad-run: hyperparams.items.weights.n=${task.n_train} "
                                 "does not resolve"), out.stderr


def test_an_online_mode_with_a_method_that_cannot_run_online_is_a_usage_error(
        tmp_path: Path) -> None:
    """The Trainer's NotImplementedError (online reverse mode, online backtracking) came out of
    hypergrad-run as a traceback ("Error executing job"), its message at the end."""
    over = ["experiment=online_digits", "debug=fast_online", "method=reverse"]
    with pytest.raises(ConfigError, match=r"mode=online method=reverse: Trainer: online tuning "
                                          r"needs hypergradients during training"):
        build(_compose(over))
    with pytest.raises(ConfigError, match=r"mode=online method=forward: .*for offline tuning"):
        build(_compose(["experiment=online_digits", "debug=fast_online",
                        "guards.backtrack=1.5"]))
    out = _cli([*over, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("hypergrad-run: mode=online method=reverse: Trainer: online "
                                 "tuning needs"), out.stderr


def test_a_hyperparameter_without_a_kind_is_named_with_the_fix(tmp_path: Path) -> None:
    """An item of a user's hyperparams option whose kind the defaults list does not choose
    reached HyperParams as a dict: "expected hypergrad hyperparameters ..., got dict: {'init':
    0.1, ...}", naming neither the item nor how to give it a kind."""
    (tmp_path / "hyperparams").mkdir()
    (tmp_path / "hyperparams" / "nokind.yaml").write_text(
        "defaults:\n  - schema_hyperparams\n  - _self_\nitems:\n"
        "  lr: {init: 0.1, transform: log}\n")
    with pytest.raises(ConfigError, match=re.escape(
            "hyperparams.items.lr has no kind: choose one in the hyperparams option's defaults "
            "list, `- kind@items.lr: scalar`")):
        build(_compose(["hyperparams=nokind", "debug=fast"], tmp_path))
    _, trainer = build(_compose(["hyperparams=nokind", "debug=fast",
                                 "+hyperparams/kind@hyperparams.items.lr=scalar"], tmp_path))
    assert trainer.problem.hyperparams.names == ["lr"]
