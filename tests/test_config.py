"""The Hydra layer: real configs compose, every option of every group (nested ones included)
instantiates its object, bad values fail at composition naming the key, the schemas follow the
code's signatures, and every experiment preset runs end to end with the debug preset."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException, HydraException, InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

import hypergrad as hg
from hypergrad import Trainer
from hypergrad.cli import run
from hypergrad.config import CONFIG_DIR, build, config_fingerprint, register_configs, schema
from hypergrad.errors import (
    HypergradWarning,
    ResumeMismatchError,
    RunDirError,
    ZeroHypergradientWarning,
)
from hypergrad.hyperparams import HyperParameter
from hypergrad.methods.implicit import LinearSolver
from hypergrad.stepvjp import StepVJP

register_configs()
GROUPS = ["task", "model", "hyperparams", "inner_optimizer", "outer_optimizer", "method", "mode",
          "guards", "folder", "callbacks", "distributed"]
PRESET_DIRS = ("experiment", "debug", "sweep",  # @package _global_ presets, run below
               "experiment_outer")  # a preset's outer optimizer's settings, checked below
ALL_GROUPS = sorted(str(d.relative_to(CONFIG_DIR)) for d in CONFIG_DIR.rglob("*")
                    if d.is_dir() and d.relative_to(CONFIG_DIR).parts[0] not in PRESET_DIRS
                    and any(d.glob("*.yaml")))
OPTIONS = [(g, p.stem) for g in ALL_GROUPS for p in sorted((CONFIG_DIR / g).glob("*.yaml"))]
PRESETS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
NESTED = {"method/hvp": hg.hvp.HVPStrategy, "method/solver": LinearSolver,
          "method/step_vjp": StepVJP, "method/tangent": hg.tangent.TangentRule}
"""Nested groups of a method: the attribute of the method they set (the group's last name) and
the base class of their objects."""


def _compose(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def _user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **sources: str) -> None:
    """Write a user's modules (``name=source``) into ``tmp_path`` and make them importable
    afresh, as the folder ``hypergrad-run`` runs from is."""
    import sys

    for name, source in sources.items():
        (tmp_path / f"{name}.py").write_text(source)
        sys.modules.pop(name, None)
    monkeypatch.syspath_prepend(str(tmp_path))


def _parent_methods(sub: str) -> list[str]:
    """The method options whose defaults lists select the nested group ``sub`` (``hvp``, ...)."""
    out = [p.stem for p in sorted((CONFIG_DIR / "method").glob("*.yaml"))
           if re.search(rf"^  - {sub}: ", p.read_text(), re.M)]
    assert out, f"no method option selects method/{sub}"
    return out


def test_every_group_has_options_and_presets_exist() -> None:
    assert set(GROUPS) | set(NESTED) | {"hyperparams/kind"} == set(ALL_GROUPS)
    assert {"digits_schedule", "hypercleaning", "ridge_diabetes", "breast_cancer_l2",
            "online_digits", "sparse_regression"} <= set(PRESETS)
    methods = {o for g, o in OPTIONS if g == "method"}
    assert {"forward", "reverse", "auto", "checkpointed", "truncated", "implicit", "hd",
            "marthe", "finite_difference"} <= methods


_KIND_EXTRA = {"per_example": ["hyperparams.items.extra.n=3"],
               "per_group": ["hyperparams.items.extra.groups={w: weight}"]}
"""Arguments a kind needs besides ``init`` to instantiate."""


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_instantiates(group: str, option: str, tmp_path: Path) -> None:
    if group == "task":  # a task needs matching parts: take them from a preset using it
        preset = {"digits": "digits_schedule", "hypercleaning": "hypercleaning",
                  "ridge_diabetes": "ridge_diabetes", "breast_cancer": "breast_cancer_l2",
                  "sparse_regression": "sparse_regression", "charlm": "charlm"}
        if option == "custom":  # any builder by _target_ (docs/own-model.md)
            cfg = _compose(["task=custom", "task._target_=hypergrad.tasks.bundled.digits_task",
                            "debug=fast"])
        else:
            cfg = _compose([f"experiment={preset[option]}", "debug=fast"])
        task, trainer = build(cfg)
        assert isinstance(task.problem, hg.InnerProblem) and isinstance(trainer, Trainer)
        return
    if group == "hyperparams/kind":  # one more item of this kind beside the bare config's lr
        cfg = _compose([f"+hyperparams/kind@hyperparams.items.extra={option}",
                        "hyperparams.items.extra.init=0.5", *_KIND_EXTRA.get(option, [])])
        hps = instantiate(cfg.hyperparams, _convert_="all")
        assert isinstance(hps, hg.HyperParams) and hps.names == ["lr", "extra"]
        item = hps.by_name["extra"]
        target = cfg.hyperparams["items"].extra._target_
        assert isinstance(item, HyperParameter) and target.endswith(type(item).__name__)
        return
    if group in NESTED:  # within every method that has it; the method holds the object
        sub = group.split("/")[1]
        for parent in _parent_methods(sub):
            cfg = _compose([f"method={parent}", f"{group}={option}"])
            method = instantiate(cfg.method, _convert_="all")
            holder = method.forward if isinstance(method, hg.AutoMode) else method
            obj = getattr(holder, sub)
            assert isinstance(obj, NESTED[group]), (parent, obj)
            assert cfg.method[sub]._target_.endswith(type(obj).__name__)
        return
    # options that read another group's values (interpolations) compose within their preset
    context = {("hyperparams", "sparse_weights"): ["experiment=sparse_regression"]}
    cfg = _compose([*context.get((group, option), []), f"{group}={option}", "debug=fast"])
    if group == "folder":  # a folder needs its path: build() gives it
        _, trainer = build(cfg, folder=tmp_path)
        assert isinstance(trainer.folder, hg.RunFolder)
        trainer.close()
        return
    obj = instantiate(cfg[group], _convert_="all")
    expected = {"model": callable, "hyperparams": lambda o: isinstance(o, hg.HyperParams),
                "inner_optimizer": lambda o: isinstance(o, hg.optim.Optimizer),
                "outer_optimizer": callable,
                "method": lambda o: isinstance(o, (hg.Method, hg.AutoMode)),
                "mode": lambda o: isinstance(o, (hg.Offline, hg.Online)),
                "guards": lambda o: isinstance(o, hg.Guards),
                "callbacks": lambda o: all(isinstance(c, hg.Callback) for c in o),
                "distributed": lambda o: isinstance(o, hg.distributed.Ranks)}[group]
    assert expected(obj), obj


def test_method_options_are_the_objects_they_say() -> None:
    def method(*overrides: str) -> Any:
        return instantiate(_compose(list(overrides)).method, _convert_="all")

    fwd = method("method=forward")
    assert type(fwd) is hg.ForwardMode and isinstance(fwd.hvp, hg.hvp.VmapVJP)
    assert isinstance(fwd.tangent, hg.tangent.AutoTangent) and fwd.skip_zero_columns
    rev = method("method=reverse")
    assert type(rev) is hg.ReverseMode and rev.truncate is None and rev.checkpoint is None
    assert isinstance(rev.step_vjp, hg.stepvjp.DoubleBackward)
    assert method("method=checkpointed").checkpoint == "sqrt"
    tape = method("method=reverse", "method.tape=true")
    assert type(tape) is hg.ReverseMode and tape.tape and tape.label() == "reverse (tape)"
    tr = method("method=truncated", "method.truncate=7", "method/step_vjp=mixed")
    assert tr.truncate == 7 and isinstance(tr.step_vjp, hg.stepvjp.MixedMode)
    imp = method("method=implicit", "method/solver=neumann", "method.solver.maxiter=500",
                 "method.loss_steps=[3,4]")
    assert isinstance(imp, hg.ImplicitDiff) and isinstance(imp.solver, hg.methods.Neumann)
    assert imp.solver.maxiter == 500 and imp.loss_steps == [3, 4]
    assert type(method("method=hd")) is hg.HD
    mar = method("method=marthe", "method.mu=0.5", "method/hvp=loop")
    assert type(mar) is hg.MARTHE and mar.mu == 0.5 and isinstance(mar.hvp, hg.hvp.ColumnLoop)
    fd = method("method=finite_difference", "method.eps=1e-4")
    assert isinstance(fd, hg.FiniteDifference) and fd.eps == 1e-4


def test_method_auto_keeps_the_forward_settings() -> None:
    cfg = _compose(["method=auto", "method.hvp.chunk_size=3", "method.hvp.memory_budget=5e8",
                    "method.hvp.compile=true"])
    auto = instantiate(cfg.method, _convert_="all")
    assert isinstance(auto, hg.AutoMode) and isinstance(auto.forward.hvp, hg.hvp.VmapVJP)
    hvp = auto.forward.hvp
    assert (hvp.chunk_size, hvp.memory_budget, hvp.compile) == (3, 5e8, True)
    cfg = _compose(["method=auto", "method/hvp=fwd_over_rev", "method.hvp.chunk_size=2",
                    "method/step_vjp@method.reverse.step_vjp=mixed"])
    auto = instantiate(cfg.method, _convert_="all")
    assert isinstance(auto.forward.hvp, hg.hvp.ForwardOverReverse)
    assert auto.forward.hvp.chunk_size == 2
    assert isinstance(auto.reverse.step_vjp, hg.stepvjp.MixedMode)
    assert isinstance(auto.checkpointed.step_vjp, hg.stepvjp.MixedMode)


@pytest.mark.parametrize("overrides,key", [
    (["task.n_trian=5"], "n_trian"),                        # a typo in a key
    (["task.steps=abc"], "steps"),                          # a wrong type
    (["mode=sideways"], "sideways"),                        # not one of the choices
    (["mode.outer_steps=1.5"], "outer_steps"),
    (["mode.interval=3"], "interval"),                      # online's, not offline's
    (["guards.backtrak=1.5"], "backtrak"),
    (["folder.resum=true"], "resum"),
    (["method=magic"], "magic"),                            # a method that does not exist
    (["method=fowrard"], "fowrard"),
    (["method/hvp=magic"], "magic"),                        # an HVP strategy likewise
    (["method.hvp.chunk_sise=3"], "chunk_sise"),            # a misspelt method option
    (["method.hvp.chunk_size=abc"], "chunk_size"),
    (["method.mu=0.5"], "mu"),                              # MARTHE's, not forward mode's
    (["method/hvp=loop", "method.hvp.compile=true"], "compile"),  # only VmapVJP compiles
    (["method=reverse", "method.hvp.chunk_size=3"], "hvp"),  # reverse mode has no HVP
    (["method=implicit", "method/solver=cg", "method.solver.alpha=0.1"], "alpha"),
    (["inner_optimizer.momentun=0.9"], "momentun"),
    (["inner_optimizer=adam", "inner_optimizer.momentum=0.9"], "momentum"),
    (["hyperparams.items.lr.windowz=3"], "windowz"),
    (["hyperparams.items.lr.windows=3"], "windows"),         # lr is a scalar here
    (["hyperparams=digits_schedule", "hyperparams.items.momentum.windows=3"], "windows"),
    (["hyperparams=digits_schedule", "hyperparams.items.wd.n=3"], "n"),
    (["hyperparams=digits_schedule", "hyperparams.items.lr.windows=many"], "windows"),
    (["outer_optimizer=sign", "outer_optimizer.momentum=0.9"], "momentum"),
])
def test_bad_values_fail_at_composition(overrides: list[str], key: str) -> None:
    with pytest.raises((ConfigCompositionException, ValidationError, HydraException)) as info:
        _compose(overrides)
    text = str(info.value) + str(info.value.__cause__)
    assert re.search(rf"\b{key}\b", text), text


def test_a_kind_is_chosen_per_item_and_names_come_from_keys() -> None:
    cfg = _compose(["hyperparams=digits_schedule", "hyperparams/kind@hyperparams.items.wd=scalar",
                    "+hyperparams/kind@hyperparams.items.smooth=scalar",
                    "hyperparams.items.smooth.init=0.1"])
    hps = instantiate(cfg.hyperparams, _convert_="all")
    assert hps.names == ["lr", "momentum", "wd", "smooth"]
    assert [type(it) for it in hps.items] == [hg.Schedule, hg.Scalar, hg.Scalar, hg.Scalar]
    assert hps.by_name["wd"].init == 1e-4 and hps.by_name["wd"].transform == "log"
    assert hps.by_name["lr"].windows == 5 and hps.by_name["smooth"].init == 0.1
    # the option sets windows for lr: as a scalar it has none, and composition says so
    with pytest.raises(ConfigCompositionException, match="Key 'windows' not in 'ScalarConf'"):
        _compose(["hyperparams=digits_schedule", "hyperparams/kind@hyperparams.items.lr=scalar"])
    forced = _compose(["+hyperparams.items.lr.windows=3"])  # `+` adds a key on purpose: then
    with pytest.raises(InstantiationException, match="windows"):  # the object refuses it
        instantiate(forced.hyperparams, _convert_="all")


def test_schemas_follow_the_signatures() -> None:
    store = ConfigStore.instance().repo
    factories = set(hg.optim.registered())
    assert {"sgd", "adam", "adamw", "rmsprop", "adagrad"} <= factories
    assert {f"schema_{n}.yaml" for n in factories} <= set(store["inner_optimizer"])
    fields = schema(hg.ForwardMode).__dataclass_fields__
    assert list(fields) == ["_target_", "hvp", "tangent", "skip_zero_columns", "compile"]
    assert fields["_target_"].default == "hypergrad.ForwardMode"

    class Odd:
        def __init__(self, where: object = object()) -> None: ...

    with pytest.raises(TypeError, match="the default of 'where' is object"):
        schema(Odd)


@pytest.mark.usefixtures("isolated_registries")
def test_a_new_inner_optimizer_needs_no_config_code() -> None:
    # what a user does to add an optimizer: a factory registered by name (and a YAML if wanted)
    @hg.optim.register(name="fancy_sgd")
    def fancy(lr: hg.optim.base.Arg = 0.01, rho: float = 0.9, centered: bool = False
              ) -> hg.optim.SGD:
        return hg.optim.sgd(lr=lr)

    register_configs()
    node = ConfigStore.instance().repo["inner_optimizer"]["schema_fancy_sgd.yaml"].node
    assert set(node) == {"_target_", "lr", "rho", "centered"} and node.rho == 0.9
    cfg = _compose(["inner_optimizer=schema_fancy_sgd", "inner_optimizer.rho=0.5"])
    assert cfg.inner_optimizer.rho == 0.5
    with pytest.raises(ConfigCompositionException, match="rhoo"):
        _compose(["inner_optimizer=schema_fancy_sgd", "inner_optimizer.rhoo=0.5"])
    with pytest.raises((ConfigCompositionException, ValidationError), match="centered"):
        _compose(["inner_optimizer=schema_fancy_sgd", "inner_optimizer.centered=sometimes"])
    assert isinstance(hg.optim.create("fancy_sgd", lr=0.1), hg.optim.SGD)


def test_methods_and_their_options_are_safe_to_change_on_resume() -> None:
    base = ["experiment=digits_schedule", "debug=fast"]
    fp = config_fingerprint(_compose(base))
    assert not [k for k in fp if k.startswith("config.method.")]
    for change in (["method/hvp=loop"], ["method.hvp.chunk_size=3"], ["method=auto"],
                   ["method=reverse", "method/step_vjp=mixed"]):
        assert config_fingerprint(_compose(base + change)) == fp, change
    kind = config_fingerprint(_compose(base + ["hyperparams/kind@hyperparams.items.wd=scalar"]))
    assert kind != fp  # the hyperparameters' kinds are not
    assert fp["config.hyperparams.items.lr.name"] == "lr"


@pytest.mark.parametrize("method,cls", [("marthe", hg.MARTHE), ("hd", hg.HD)])
def test_online_methods_from_hydra(method: str, cls: type, tmp_path: Path) -> None:
    cfg = _compose(["experiment=online_digits", f"method={method}", "debug=fast_online",
                    "report.plots=false"])
    _, trainer = build(cfg)
    assert type(trainer.method) is cls
    results = run(cfg, tmp_path)
    assert results["mode"] == "online" and results["method"] == method
    assert results["method_settings"] == {
        k.removeprefix("method."): v for k, v in trainer.method.fingerprint().items()
        if k != "method"}
    assert results["outer_steps"] >= 1
    assert all(v == v for v in results["learned"].values())  # no NaN
    if method == "marthe":
        mu = _compose(["experiment=online_digits", "method=marthe", "method.mu=0.5"])
        assert instantiate(mu.method, _convert_="all").mu == 0.5


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_end_to_end_with_debug(preset: str, tmp_path: Path) -> None:
    cfg = _compose([f"experiment={preset}", "debug=fast"])  # online presets too (interval 4)
    results = run(cfg, tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["name"] == preset and on_disk["outer_steps"] >= 1
    labels = [r["hyperparameters"] for r in on_disk["table"]]
    assert labels[0] == "initial" and "learned" in labels
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == on_disk["outer_steps"]
    for png in results["plots"]:
        assert (tmp_path / png).stat().st_size > 1000
    assert on_disk["plots"] == results["plots"]  # results.json names them (it never did)
    assert (tmp_path / "config_resolved.yaml").exists()
    assert {"learned.yaml", "model_learned.pt"} <= set(on_disk["learned_files"])
    assert (tmp_path / "model_learned.pt").stat().st_size > 0
    if preset == "ridge_diabetes":
        assert on_disk["extra"]["closed_form"]["rel_diff_finite_T"] < 1e-10
    if preset == "hypercleaning":
        flags = on_disk["extra"]["flip_detection"]
        assert flags["f1"] is None if flags["n_flagged"] == 0 else 0 <= flags["f1"] <= 1
        assert set(on_disk["compare_methods"]) == {"forward", "reverse"}


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_composes_with_every_outer_optimizer(preset: str) -> None:
    """A preset's settings of its own outer optimizer (``experiment_outer/``) apply where that
    optimizer is chosen and nowhere else: ``experiment=digits_schedule
    outer_optimizer=quasi_newton`` failed at composition on the preset's sign-step ``lr``."""
    own = re.search(r"^  - override /outer_optimizer: (\w+)", (
        CONFIG_DIR / "experiment" / f"{preset}.yaml").read_text(), re.M)
    assert own, preset
    settings = OmegaConf.load(CONFIG_DIR / "experiment_outer" / f"{preset}_{own.group(1)}.yaml")
    for option in sorted(p.stem for p in (CONFIG_DIR / "outer_optimizer").glob("*.yaml")):
        cfg = _compose([f"experiment={preset}", f"outer_optimizer={option}"])
        outer = instantiate(cfg.outer_optimizer, _convert_="all")
        assert callable(outer), option
        alone = _compose([f"outer_optimizer={option}"]).outer_optimizer
        want = OmegaConf.merge(alone, settings) if option == own.group(1) else alone
        assert cfg.outer_optimizer == want, (preset, option)


# -- issue 12 ------------------------------------------------------------------------------------
def test_the_bare_config_is_consistent() -> None:
    cfg = _compose([])  # bare `hypergrad-run`: every hyperparameter bound
    task, trainer = build(cfg)
    task.problem.check(task.problem.init_raw())
    assert isinstance(trainer, Trainer) and task.problem.hyperparams.names == ["lr"]


@pytest.mark.filterwarnings("ignore::hypergrad.errors.TuningWarning")  # 2 outer steps of Adam
def test_a_truncated_runs_results_say_it_was_truncated(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """results.json's ``method`` is the family (``reverse``), the same for the exact and the
    truncated method: ``method_settings`` and the log's first line say the truncation."""
    import logging

    cfg = _compose(["experiment=digits_schedule", "debug=fast", "method=truncated",
                    "method.truncate=5", "report.plots=false"])
    with caplog.at_level(logging.INFO, logger="hypergrad"), pytest.warns(
            ZeroHypergradientWarning, match=r"last 5 of T = 12 steps .* do not read lr's "
                                            r"windows 0-1 of 5 \(steps 0-4\)"):
        results = run(cfg, tmp_path)
    assert results["method"] == "reverse" and results["method_settings"] == {"truncate": 5}
    assert "method=ReverseMode(truncate=5)" in caplog.text
    exact = run(_compose(["experiment=digits_schedule", "debug=fast", "method=reverse",
                          "report.plots=false"]), tmp_path / "exact")
    assert exact["method"] == "reverse" and exact["method_settings"] == {}
    # the preset's truncate=20 over T = 12 steps is full reverse mode: recorded as exact
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hypergrad"):
        full = run(_compose(["experiment=digits_schedule", "debug=fast", "method=truncated",
                             "report.plots=false"]), tmp_path / "full")
        assert full["method_settings"] == {} and "method=ReverseMode()" in caplog.text
        assert "with truncate=20 >= T = 12 steps is full reverse mode" in caplog.text
        ck = run(_compose(["experiment=digits_schedule", "debug=fast", "method=checkpointed",
                           "method.checkpoint=5", "report.plots=false"]), tmp_path / "ck")
    assert ck["method_settings"] == {}
    assert "method=ReverseMode(checkpoint=5)" in caplog.text  # the log says it checkpoints


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
    with pytest.raises(RunDirError, match="already holds a run.*folder.resume=true"):
        run(_compose(base), tmp_path)
    run(_compose(base + ["folder.resume=true", "mode.outer_steps=3"]), tmp_path)
    assert (tmp_path / "config_resolved.yaml").read_text() == first
    assert "outer_steps: 3" in (tmp_path / "config_resolved.resume-1.yaml").read_text()
    assert _strict((tmp_path / "results.json").read_text())["outer_steps"] == 3
    with pytest.raises(ResumeMismatchError, match=r"config.task.steps: 12 -> 10"):
        run(_compose(base + ["folder.resume=true", "task.steps=10"]), tmp_path)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["outer_step"] for x in lines] == [0, 1, 2]
    run(_compose(base + ["folder.overwrite=true", "mode.outer_steps=1"]), tmp_path)
    assert not (tmp_path / "config_resolved.resume-1.yaml").exists()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


# -- issue 24: unknown keys, --help, resume messages -----------------------------------------------
@pytest.mark.parametrize("override,key,near", [
    ("+trainer.outer_step=3", "trainer.outer_step", "mode.outer_steps"),
    ("+mode.outer_step=3", "mode.outer_step", "mode.outer_steps"),
    ("+guards.backtrak=1.5", "guards.backtrak", "guards.backtrack"),
    ("+task.n_trian=5", "task.n_trian", "task.n_train"),
    ("+method.hvp.chunks=3", "method.hvp.chunks", "method.hvp.chunk_size"),
])
def test_a_key_that_names_no_setting_is_refused_with_the_nearest(override: str, key: str,
                                                                near: str) -> None:
    from hypergrad.config import check_keys

    cfg = _compose(["experiment=digits_schedule", override])
    with pytest.raises(ValueError, match=rf"'{re.escape(key)}' \(did you mean .*"
                                         rf"{re.escape(near)}"):
        check_keys(cfg)
    check_keys(_compose(["experiment=digits_schedule"]))  # the preset itself is clean


@pytest.mark.parametrize(("override", "fix"), [
    ("+hyperparams.items.momentum.groups={a: .*}",
     r"'hyperparams.items.momentum.groups' \(a setting of hyperparams/kind=schedule, "
     r"hyperparams/kind=per_group, not of hyperparams.items.momentum._target_=hypergrad.Scalar: "
     r"choose that option, e.g. hyperparams/kind@hyperparams.items.momentum=schedule\)"),
    ("+method.truncate=5", r"'method.truncate' \(a setting of method=reverse, not of "
                           r"method._target_=hypergrad.ForwardMode: choose that option, e.g. "
                           r"method=reverse\)"),
])
def test_a_setting_of_another_option_names_the_option_that_takes_it(override: str,
                                                                     fix: str) -> None:
    """``groups`` on a scalar item, ``truncate`` on forward mode: the refusal names the
    options of the same group that take the key and the override that chooses one (it said
    only that the key names no setting)."""
    from hypergrad.config import check_keys

    cfg = _compose(["experiment=digits_schedule", override])
    with pytest.raises(ValueError, match=fix):
        check_keys(cfg)
    # chosen as the message says, the key is a setting
    chosen = fix.rsplit("e.g. ", 1)[1].replace("\\)", "")
    check_keys(_compose(["experiment=digits_schedule", chosen, override.lstrip("+")]))



def test_a_key_in_a_users_config_file_and_a_users_own_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hypergrad.config import check_keys

    for group in ("task", "augment"):
        (tmp_path / group).mkdir()
    # the user's own task builder, by _target_, with a typo in the user's file
    (tmp_path / "user_task_builder.py").write_text(
        "def build(hyperparams, optimizer, model, n_train=100, steps=10):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "task" / "mine.yaml").write_text(
        "_target_: user_task_builder.build\nn_trian: 50\nsteps: 5\n")
    # a schema's option extended in the user's file: refused at composition already
    (tmp_path / "task" / "digits_typo.yaml").write_text(
        "defaults:\n  - digits\n  - _self_\nn_trian: 100\n")
    (tmp_path / "augment" / "strong.yaml").write_text("noise: 0.1\n")

    def user(*overrides: str) -> DictConfig:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose("config", overrides=[f"hydra.searchpath=[file://{tmp_path}]",
                                                *overrides])

    cfg = user("task=mine", "+augment=strong")
    with pytest.raises(ValueError, match=r"'task.n_trian' \(did you mean task.n_train"):
        check_keys(cfg, ["augment", "task"])
    del cfg.task.n_trian
    check_keys(cfg, ["augment", "task"])  # a group of the user's folder is a legitimate append
    with pytest.raises(ValueError, match=r"'augment.noise'"):
        check_keys(cfg, ["task"])  # the same key not chosen as a group: refused
    with pytest.raises(ConfigCompositionException, match="n_trian"):
        user("task=digits_typo")


@pytest.mark.slow
def test_the_cli_answers_a_usage_error_with_its_message_alone(tmp_path: Path) -> None:
    """A configuration that cannot run is the user's to fix: the message without a traceback
    into hypergrad's code, exit status 2, the message in the run's log file too;
    HYDRA_FULL_ERROR=1 still gives the traceback."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "hypergrad.cli", "task=custom", f"hydra.run.dir={tmp_path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("hypergrad-run: task._target_ is not set"), out.stderr
    assert "Traceback" not in out.stderr and "Error executing job" not in out.stderr
    logged = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "ERROR" in logged and "task._target_ is not set" in logged
    full = subprocess.run(cmd + ["hydra.run.dir=" + str(tmp_path / "full")], capture_output=True,
                          text=True, env={**env, "HYDRA_FULL_ERROR": "1"}, timeout=300)
    assert full.returncode == 1 and "Traceback" in full.stderr
    assert "hypergrad.errors.ConfigError: task._target_ is not set" in full.stderr
    # a setting one of hypergrad's classes refuses while Hydra builds it: the config key, the
    # class and its message (was Hydra's "Error in call to target ...: ValueError('...')")
    bad = subprocess.run([sys.executable, "-m", "hypergrad.cli", "debug=fast",
                          "mode.outer_steps=-1", f"hydra.run.dir={tmp_path / 'bad'}"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.startswith("hypergrad-run: mode (hypergrad.run.modes.Offline): Offline: "
                                 "outer_steps=-1 must be an int >= 0."), bad.stderr
    assert "Error in call to target" not in bad.stderr


@pytest.mark.slow
def test_hydras_repository_copies_share_the_one_config_store() -> None:
    """Hydra 1.3 deep-copies its config repository for every group ``--help`` lists, and with
    it the ConfigStore and every schema (8 of --help's 13 s on a slow machine): after
    register_configs a copy is the singleton itself; composing and listing still work."""
    import copy

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    cs = ConfigStore.instance()
    assert copy.deepcopy(cs) is cs
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        assert "schema_sgd" in loader.get_group_options("inner_optimizer", ObjectType.CONFIG)
        assert compose("config", overrides=["inner_optimizer=adam"]).inner_optimizer


def test_the_cli_refuses_a_misspelt_override_and_help_lists_only_choices(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "hypergrad.cli", "debug=fast",
                          "+trainer.outer_step=3", f"hydra.run.dir={tmp_path}"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0 and "did you mean mode.outer_steps" in out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()
    helped = subprocess.run([sys.executable, "-m", "hypergrad.cli", "--help"],
                            capture_output=True, text=True, env=env, timeout=300).stdout
    assert "mode: offline, online" in helped and "method: " in helped
    assert "schema_" not in helped
    assert "debug: fast" in helped and "for_mode" not in helped  # config.yaml picks that part
    assert "experiment_outer" not in helped  # and a preset's outer settings


def test_a_resume_mismatch_says_what_differs_in_ten_lines_and_where_the_settings_are(
        tmp_path: Path) -> None:
    base = ["experiment=ridge_diabetes", "debug=fast", "report.plots=false",
            "report.retrain=false"]
    run(_compose(base), tmp_path)
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- experiment=ridge_diabetes\n")
    with pytest.raises(ResumeMismatchError) as info:
        run(_compose(["experiment=digits_schedule", "debug=fast", "folder.resume=true",
                      "report.plots=false"]), tmp_path)
    text = str(info.value)
    assert len(text.splitlines()) <= 10 and len(text) < 1500, text
    assert "... and " in text and "more" in text  # many keys differ: the first ones shown
    # the run's own resolved settings; not .hydra/ (the folder's first invocation's, which an
    # overwrite discards: it pointed at the discarded run's command line)
    assert f"The original run's settings: {tmp_path / 'config_resolved.yaml'} (each " in text
    assert ".hydra*/overrides.yaml" in text


@pytest.mark.parametrize("option,cls", [("surrogate", "Surrogate"),
                                        ("quasi_newton", "QuasiNewton")])
def test_the_default_outer_optimizers_are_options_in_the_trainers_box(option: str,
                                                                      cls: str) -> None:
    """outer_optimizer=surrogate / quasi_newton: the offline defaults chosen by name, in the
    Trainer's search box (their configs have no box: the Trainer gives its own)."""
    cfg = _compose([f"outer_optimizer={option}", "debug=fast"])
    _, trainer = build(cfg)
    assert type(trainer.outer).__name__ == cls
    assert trainer.outer.box is not None and trainer.outer.box[0].equal(trainer.box[0])
    assert "box" not in cfg.outer_optimizer


@pytest.mark.parametrize("preset", ["digits_schedule", "cnn_digits", "hypercleaning",
                                    "ridge_diabetes", "breast_cancer_l2", "sparse_regression"])
def test_the_run_seed_reaches_the_problem(preset: str) -> None:
    """``seed=3`` is the problem's run seed too (dropout and other draws in the step, the
    Trainer's quasi-random start, its Surrogate's candidates): the bundled tasks used to leave
    it at 0, so a sweep over seeds varied the initial weights and batch order only."""
    task, trainer = build(_compose([f"experiment={preset}", "debug=fast", "seed=3"]))
    assert task.problem.seed == 3
    task0, _ = build(_compose([f"experiment={preset}", "debug=fast"]))
    assert task0.problem.seed == 0


def test_a_seed_that_does_not_reach_the_problem_is_said(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A custom builder that builds its InnerProblem without the run's seed: ``seed=3`` would
    move only the initial weights; the warning names both seeds and the fix."""
    _user_modules(tmp_path, monkeypatch, seedless_task=(
        "from hypergrad.tasks.bundled import digits_task\n"
        "def build(hyperparams, optimizer, model, steps=4, **settings):\n"
        "    return digits_task(hyperparams, optimizer, model, steps=steps, n_train=64,\n"
        "                       n_val=32, batch_size=16)\n"))
    over = ["task=custom", "task._target_=seedless_task.build", "debug=fast",
            "hyperparams=lr_momentum", "inner_optimizer=sgd", "inner_optimizer.momentum=momentum"]
    build(_compose(over))  # seed 0 = the builder's: nothing to say
    with pytest.warns(HypergradWarning, match=r"seed=3 but the task's InnerProblem has seed=0.*"
                                              r"InnerProblem\(\.\.\., seed=seed\)"):
        build(_compose([*over, "seed=3"]))


@pytest.mark.parametrize(("target", "match"), [
    (None, r"task._target_ is not set: task=custom runs a task builder of your own.*"
           r"task._target_=my_task.build"),
    ("builder_task.buidl", r"builder_task has no 'buidl'; did you mean 'build'\? "
                           r"\(its callables: Maker, build, nothing\)"),
    ("no_such_module_here.build", r"no module 'no_such_module_here' is importable from .*: run "
                                  r"hypergrad-run from the folder that holds "
                                  r"no_such_module_here.py"),
    ("broken_task.build", r"importing broken_task failed: ZeroDivisionError: division by zero"),
    ("builder_task.nothing", r"task._target_=builder_task.nothing returned NoneType None; a task "
                             r"builder returns a hypergrad.Task"),
    ("builder_task.Maker.biuld", r"builder_task.Maker has no 'biuld'; did you mean 'build'\?"),
    ("builder_task.Maker.build", r"task._target_=builder_task.Maker.build returned NoneType"),
], ids=["unset", "misspelt", "no_module", "module_fails", "returns_none", "nested_misspelt",
        "nested_found"])
def test_a_custom_task_builder_that_cannot_be_used_is_named(
        target: str | None, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hydra's own messages here were a traceback ending in MissingMandatoryValue, "Error
    locating target" without its cause, and the Trainer's "problem must be a InnerProblem"."""
    _user_modules(tmp_path, monkeypatch, broken_task="x = 1 / 0\n", builder_task=(
        "def build(hyperparams, optimizer, model, **settings):\n    return None\n"
        "def nothing(hyperparams, optimizer, model, **settings):\n    return None\n"
        "class Maker:\n    @staticmethod\n"
        "    def build(hyperparams, optimizer, model, **settings):\n        return None\n"))
    monkeypatch.chdir(tmp_path)
    over = ["task=custom", "debug=fast"] + ([] if target is None else [f"task._target_={target}"])
    with pytest.raises((ValueError, TypeError), match=match):
        build(_compose(over))


def test_a_custom_builder_may_return_a_bare_inner_problem(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _user_modules(tmp_path, monkeypatch, bare_task=(
        "from hypergrad.tasks.bundled import digits_task\n"
        "def build(hyperparams, optimizer, model, seed=0, **settings):\n"
        "    return digits_task(hyperparams, optimizer, model, steps=4, n_train=64, n_val=32,\n"
        "                       batch_size=16, seed=seed).problem\n"))
    task, trainer = build(_compose(["task=custom", "task._target_=bare_task.build", "debug=fast"]))
    assert isinstance(task, hg.Task) and task.evaluate is None and task.problem is trainer.problem


def test_device_names_and_what_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``device=``: cpu, auto (the CPU without CUDA), cuda (this rank's GPU), cuda:N; a GPU asked
    for where there is none, or a name torch does not know, is refused naming the choices."""
    from hypergrad.tasks.bundled import device_of

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_of("cpu") == device_of(None) == device_of("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device='cuda' but torch.cuda.is_available\(\) is "
                                         r"False.*device=cpu, or device=auto"):
        device_of("cuda")
    with pytest.raises(ValueError, match=r"device='gpu'; use 'cpu', 'cuda', 'cuda:N' or 'auto'"):
        device_of("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert device_of("cuda") == device_of("auto") == torch.device("cuda", 1)  # this rank's
    assert device_of("cuda:0") == torch.device("cuda", 0)


def test_a_device_the_task_does_not_take_is_said() -> None:
    """A builder that does not take ``device`` (or a config that does not pass it on: here
    ``task.device=cpu``) builds on the CPU whatever ``device=`` says: the run warns (the meta
    device stands in for a GPU on this machine)."""
    from omegaconf import OmegaConf

    from hypergrad.config import _check_task

    task, _ = build(_compose(["experiment=sparse_regression", "debug=fast", "task.device=cpu"]))
    assert task.problem.device == torch.device("cpu")
    _check_task(OmegaConf.create({"seed": 0, "device": "cpu"}), task)  # nothing to say
    with pytest.warns(HypergradWarning, match=r"device=meta but the task built its problem on "
                                              r"cpu.*task.device=\$\{device\}"):
        _check_task(OmegaConf.create({"seed": 0, "device": "meta"}), task)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("preset", ["digits_schedule", "hypercleaning", "ridge_diabetes",
                                    "breast_cancer_l2", "sparse_regression"])
def test_hypergrad_run_on_the_gpu(preset: str, tmp_path: Path) -> None:
    """``hypergrad-run device=cuda``: the bundled task's model and data on the GPU, a short
    run through to its results. Not marked ``gpu``: the GPU suite runs those on the device
    image, which has no Hydra; experiments/benchmarks/cuda_tests.sh runs this one."""
    cfg = _compose([f"experiment={preset}", "debug=fast", "device=cuda", "report.plots=false",
                    "report.retrain=false"])
    task, trainer = build(cfg)
    assert task.problem.device.type == "cuda"
    res = trainer.fit()
    assert all(math.isfinite(h["val_loss"]) for h in res.history)


def test_results_are_written_before_the_method_comparison(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """hypercleaning's report.compare_methods takes a forward-mode hypergradient after tuning
    (27 s at K = 1200, twice the tuning): a run stopped during it had no results.json,
    learned.yaml or learned_weights.pt."""
    import hypergrad

    def stopped(self: Any, problem: Any, lam: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(hypergrad.ForwardMode, "hypergradient", stopped)
    with pytest.raises(KeyboardInterrupt):
        run(_compose(["experiment=hypercleaning", "debug=fast", "report.plots=false"]),
            tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["compare_methods"] == {} and "learned" in on_disk
    assert (tmp_path / "learned_weights.pt").exists()
