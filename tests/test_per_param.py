"""A constant optimizer argument that differs between parameter tensors (``PerParam``, written
``{pattern: value}``): the recipe's fixed weight decay on the weights and none on biases and
norms, with no tangent column. Checked in float64 against reverse mode and finite differences,
against plain ``torch.optim`` parameter groups and through ``learned.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import (
    assert_trained_as,
    configs_block,
    layered_model,
    layered_problem,
    run_cli,
    train_like_torch,
)

import hypergrad as hg
from hypergrad.export import learned_settings, optimizer_from_settings
from hypergrad.optim import PerParam
from hypergrad.testing import hypergradcheck

RECIPE = {r"weight$": 0.3, r".*": 0.0}


def _problem(optimizer: hg.optim.Optimizer, steps: int = 10) -> hg.InnerProblem:
    return layered_problem(optimizer, [hg.Schedule("lr", 0.05, transform="log", windows=2)],
                           steps)


OPTIMIZERS = {
    "adamw": lambda: hg.optim.adamw(lr="lr", weight_decay=RECIPE),
    "adam_betas": lambda: hg.optim.adam(lr="lr", betas=({r"^0\.": 0.8, ".*": 0.95}, 0.999),
                                        weight_decay=RECIPE),
    "sgd": lambda: hg.optim.sgd(lr="lr", momentum={r"^3\.": 0.5, ".*": 0.9},
                                weight_decay=RECIPE),
    "sgd_clipped": lambda: hg.optim.sgd(lr="lr", momentum=0.9, weight_decay=RECIPE,
                                        clip_grad_norm=0.5),
    "rmsprop": lambda: hg.optim.rmsprop(lr="lr", weight_decay=RECIPE, momentum=0.5),
    "adagrad": lambda: hg.optim.adagrad(lr="lr", weight_decay=RECIPE),
    "schedulefree": lambda: hg.optim.adamw_schedulefree(lr="lr", weight_decay=RECIPE),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_forward_equals_reverse_and_finite_differences(name: str) -> None:
    p = _problem(OPTIMIZERS[name]())
    assert p.num_hyperparams == 2  # the constants add no column
    # off the tie of equal windows (schedule-free's running maximum of the learning rate has
    # a kink there, where finite differences disagree with any one-sided derivative)
    lam = p.init_raw() + torch.tensor([0.2, -0.1], dtype=torch.float64)
    report = hypergradcheck(p, lam, strategies=())
    assert report.ok and report.max("fwd_vs_rev") < 1e-9, str(report)


@pytest.mark.parametrize("name", ["adamw", "sgd", "adam_betas"])
def test_trains_as_torch_optim_parameter_groups_and_exports_them(name: str) -> None:
    """The library's run equals a plain torch loop whose parameter groups hold the constants;
    ``learned.yaml``'s settings rebuild that optimizer."""
    opt = OPTIMIZERS[name]()
    p = _problem(opt, steps=8)
    lam = p.init_raw()
    hp0 = p.hyperparams.values(lam, 0, p.steps)
    state = p.run(lam.detach())
    m = layered_model()
    # one torch.optim parameter group per tensor, each holding that tensor's constants
    twins = {n: opt.at_param(n).to_torch([w], hp0) for n, w in m.named_parameters()}
    torch_opt = type(twins["0.weight"])([t.param_groups[0] for t in twins.values()])
    decay = {n: t.param_groups[0]["weight_decay"] for n, t in twins.items()}
    assert decay == {n: 0.3 if n.endswith("weight") else 0.0 for n in decay}
    settings = learned_settings(p, lam)
    defaults = settings["optimizer"]["defaults"]
    written = {g["params"][0]: {**defaults, **g} for g in settings["optimizer"]["param_groups"]}
    assert {n: g.get("weight_decay", 0.0) for n, g in written.items()} == {
        n: v for n, v in decay.items() if n in written}
    assert any(n.endswith("bias") for n in written)  # the groups that differ are written
    m2 = layered_model()
    exported, _ = optimizer_from_settings(settings, m2, p.steps)
    for model, o in ((m, torch_opt), (m2, exported)):
        assert_trained_as(train_like_torch(p, model, o), state)


def test_the_same_run_as_a_per_group_hyperparameter_held_fixed() -> None:
    """A PerGroup weight decay at the same values gives the same trained weights (and its
    hypergradient for the learning rate is the same): the constant is that, minus a column."""
    lr = hg.Schedule("lr", 0.05, transform="log", windows=2)
    wd = hg.PerGroup("wd", 0.3, "log", groups={"decay": r"weight$"}, default=0.0)
    a = layered_problem(hg.optim.adamw(lr="lr", weight_decay=RECIPE), [lr])
    b = layered_problem(hg.optim.adamw(lr="lr", weight_decay="wd"), [lr, wd])
    ga = hg.ForwardMode().hypergradient(a, a.init_raw()).grad
    gb = hg.ForwardMode().hypergradient(b, b.init_raw()).grad
    torch.testing.assert_close(ga, gb[:2], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("value", "error", "match"), [
    ({}, ValueError, r"weight_decay=\{\} must map regular expressions"),
    ({3: 0.1}, TypeError, r"the key 3 must be a regular expression"),
    ({"weight$": "0.1"}, TypeError, r"weight_decay\['weight\$'\]='0.1' must be a number"),
    ({"weight(": 0.1}, ValueError, r"'weight\(' is not a regular expression"),
    ({"weight$": -0.1, ".*": 0.0}, ValueError, r"weight_decay\['weight\$'\]=-0.1 must be a "
                                               r"number >= 0"),
])
def test_bad_values_are_named(value: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        hg.optim.adamw(lr="lr", weight_decay=value)


def test_the_problem_refuses_unmatched_parameters_and_unused_patterns() -> None:
    with pytest.raises(ValueError, match=r"optimizer argument weight_decay=\{'weight\$': 0.1\}: "
                                         r"parameters \['0.bias', '1.bias', '3.bias'\] match no "
                                         r"pattern; add one for them \(r'\.\*': <value> last"):
        _problem(hg.optim.adamw(lr="lr", weight_decay={"weight$": 0.1}))
    with pytest.raises(ValueError, match=r"patterns \['wieght'\] match no parameter"):
        _problem(hg.optim.adamw(lr="lr", weight_decay={"wieght": 0.1, ".*": 0.0}))
    with pytest.raises(ValueError, match=r"patterns \['bias'\] match no parameter \(or only "
                                         r"parameters an earlier pattern took\)"):
        _problem(hg.optim.adamw(lr="lr", weight_decay={".*": 0.0, "bias": 0.1}))


def test_the_whole_model_twin_names_the_per_parameter_groups() -> None:
    opt = hg.optim.sgd(lr=0.1, weight_decay=RECIPE)
    with pytest.raises(NotImplementedError, match=r"value per parameter.*at_param"):
        opt.to_torch([torch.zeros(1)])
    assert opt.at_param("0.bias").args["weight_decay"] == 0.0
    assert PerParam(RECIPE) == opt.args["weight_decay"]
    assert repr(opt) == ("sgd(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, "
                         "weight_decay={'weight$': 0.3, '.*': 0.0})")


def test_a_clipped_optimizer_resolves_its_inner_constants() -> None:
    clipped = hg.optim.sgd(lr=0.1, weight_decay=RECIPE, clip_grad_norm=1.0)
    one = clipped.at_param("0.bias")
    assert isinstance(one, hg.optim.ClipGradNorm) and one.max_norm == 1.0
    assert one.inner.args["weight_decay"] == 0.0 and clipped.at_param("0.weight").inner.args[
        "weight_decay"] == 0.3
    plain = hg.optim.sgd(lr=0.1, weight_decay=0.3)
    assert plain.at_param("0.bias") is plain and plain.per_param() == {}


def test_the_configs_page_command_runs(tmp_path: Path) -> None:
    """docs/configs.md's constant-per-parameter command (shortened by debug=fast) runs through
    Hydra; learned.yaml decays the weights and not the biases."""
    import yaml

    run_cli(configs_block("inner_optimizer.weight_decay"), tmp_path)
    learned = yaml.safe_load((tmp_path / "learned.yaml").read_text())["optimizer"]
    decay = {n: learned["defaults"]["weight_decay"] for n in ("0.weight", "2.weight")}
    decay |= {g["params"][0]: g["weight_decay"] for g in learned["param_groups"]}
    assert decay == {"0.weight": 0.001, "2.weight": 0.001, "0.bias": 0.0, "2.bias": 0.0}
    assert len(learned["param_groups"]) == 2


def test_the_configs_page_recipe_file_runs(tmp_path: Path) -> None:
    """docs/configs.md's optimizer config of your own (a pattern with ``^``, which an override
    cannot hold) through ``--config-dir``: learned.yaml holds the two momenta."""
    import yaml

    (tmp_path / "conf" / "inner_optimizer").mkdir(parents=True)
    (tmp_path / "conf" / "inner_optimizer" / "recipe.yaml").write_text(
        configs_block("'^0", "yaml"))
    run_cli(configs_block("inner_optimizer=recipe"), tmp_path / "run", cwd=tmp_path)
    learned = yaml.safe_load((tmp_path / "run" / "learned.yaml").read_text())["optimizer"]
    momentum = {n: learned["defaults"]["momentum"] for n in ("0.weight", "0.bias")}
    momentum |= {g["params"][0]: g["momentum"] for g in learned["param_groups"]}
    assert momentum == {"0.weight": 0.5, "0.bias": 0.5, "2.weight": 0.9, "2.bias": 0.9}
