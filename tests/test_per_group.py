"""``hypergrad.PerGroup``: one value per group of parameter tensors (regular expressions on their
names), a constant ``default`` for the rest: the recipe's "one weight decay for the weights, none
on biases and norms". Checked in float64 against reverse mode and finite differences, against
plain ``torch.optim`` parameter groups, through ``learned.yaml``, and as a Hydra kind."""

from __future__ import annotations

import re
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
from hypergrad.testing import hypergradcheck

DECAY = {"decay": r"weight$"}


def _problem(wd: hg.PerGroup, opt: str = "adamw", steps: int = 10) -> hg.InnerProblem:
    optimizer = (hg.optim.adamw(lr="lr", weight_decay="wd") if opt == "adamw"
                 else hg.optim.sgd(lr="lr", momentum=0.9, weight_decay="wd"))
    return layered_problem(optimizer, [hg.Scalar("lr", 0.05, transform="log"), wd], steps)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
@pytest.mark.parametrize("default", [0.0, 3e-3])
def test_forward_equals_reverse_and_finite_differences(opt: str, default: float) -> None:
    """Two groups (the first layer's weight, the other weights), the rest (biases, the
    LayerNorm's bias) at the constant default: K = 1 + 2."""
    wd = hg.PerGroup("wd", 0.05, "log", groups={"first": r"^0\.weight$", "other": r"weight$"},
                     default=default)
    p = _problem(wd, opt)
    assert p.num_hyperparams == 3
    g = torch.Generator().manual_seed(3)
    lam = p.init_raw() + 0.2 * torch.randn(3, generator=g, dtype=torch.float64)
    report = hypergradcheck(p, lam, strategies=())
    assert report.ok and report.max("fwd_vs_rev") < 1e-9, str(report)
    assert report.grad is not None and bool((report.grad[1:] != 0).all())


def test_the_parameters_of_no_group_read_the_default() -> None:
    p = _problem(hg.PerGroup("wd", 0.02, "log", groups=DECAY, default=0.0))
    wd = p.hyperparams.values(p.init_raw())["wd"]
    assert set(wd) == {"0.weight", "1.weight", "3.weight"}  # the LayerNorm's weight matches
    assert all(float(v) == pytest.approx(0.02) for v in wd.values())
    assert wd["0.bias"] == 0.0 and wd.get("3.bias") == 0.0  # dict.get reads it too


def test_trains_as_torch_optim_parameter_groups_and_exports_them() -> None:
    """The library's run equals a plain torch loop with two parameter groups (decay on the
    weights, none on the rest); ``learned.yaml``'s settings rebuild that optimizer."""
    p = _problem(hg.PerGroup("wd", 0.3, "log", groups=DECAY, default=0.0), steps=8)
    lam = p.init_raw()
    state = p.run(lam)
    m = layered_model()
    names = dict(m.named_parameters())
    weights = [w for n, w in names.items() if n.endswith("weight")]
    rest = [w for n, w in names.items() if not n.endswith("weight")]
    torch_opt = torch.optim.AdamW([{"params": weights, "weight_decay": 0.3},
                                   {"params": rest, "weight_decay": 0.0}], lr=0.05)
    settings = learned_settings(p, lam)
    groups = {g["params"][0]: g.get("weight_decay", settings["optimizer"]["defaults"].get(
        "weight_decay")) for g in settings["optimizer"]["param_groups"]}
    assert groups == {n: (pytest.approx(0.3) if n.endswith("weight") else 0.0) for n in names}
    m2 = layered_model()
    exported, _ = optimizer_from_settings(settings, m2, p.steps)
    for model, opt in ((m, torch_opt), (m2, exported)):
        assert_trained_as(train_like_torch(p, model, opt), state)


def test_the_trainer_tunes_it_and_leaves_the_rest() -> None:
    p = _problem(hg.PerGroup("wd", 0.05, "log", groups=DECAY, default=0.0))
    res = hg.Trainer(p, mode=hg.Offline(outer_steps=2), callbacks=[hg.run.Log(None)]).fit()
    assert res.lam.shape == (2,) and torch.isfinite(res.lam).all()
    wd = p.hyperparams.values(res.lam)["wd"]
    assert wd["0.bias"] == 0.0 and "0.bias" not in wd
    named = p.hyperparams.named(p.hyperparams.describe(res.lam), p.steps)
    assert set(named) == {"lr", "wd[decay]"}  # a group's value under the group's name


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"groups": {}}, ValueError, r"groups is empty"),
    ({"groups": "weight"}, TypeError, r"groups='weight' must map group names"),
    ({"groups": {"w": 3}}, TypeError, r"groups entry 'w': 3 must map"),
    ({"groups": {"w": "weight("}}, ValueError, r"pattern 'weight\(' of group 'w' is not a "
                                               r"regular expression"),
    ({"groups": DECAY, "default": float("nan")}, ValueError, r"default=nan must be a finite"),
    ({"groups": DECAY, "default": "0"}, TypeError, r"default='0' \(str\) must be a number"),
])
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        hg.PerGroup("wd", 0.1, "log", **kwargs)


def test_binding_names_what_matched_nothing() -> None:
    names = ["0.weight", "0.bias", "1.weight"]
    with pytest.raises(ValueError, match=r"\['0.bias'\] match no group .* pass default="):
        hg.PerGroup("wd", 0.1, "log", groups=DECAY).bind(names)
    with pytest.raises(ValueError, match=r"groups \['late'\] match no parameter .* 'late' "
                                         r"matches only \['0.weight'\], taken by an earlier"):
        hg.PerGroup("wd", 0.1, "log", groups={"all": "weight", "late": r"^0\.w"},
                    default=0.0).bind(names)
    # a group of frozen parameters: they are not listed, and the message says why
    with pytest.raises(ValueError, match=r"groups \['first'\] match no parameter .*only "
                                         r"trainable parameters are listed: a frozen one"):
        hg.PerGroup("wd", 0.1, "log", groups={"first": r"^2\.", "rest": "."}).bind(names)
    unbound = hg.PerGroup("wd", 0.1, "log", groups=DECAY, default=0.0)
    with pytest.raises(ValueError, match="not bound to a model yet"):
        unbound.value(torch.zeros(1), 0, 1)


def test_the_old_import_path_is_the_core_class() -> None:
    from hypergrad.tasks.charlm import PerGroup

    assert PerGroup is hg.PerGroup


def test_hydra_kind_per_group() -> None:
    """``kind@items.wd: per_group`` composes and instantiates; ``groups`` is required."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from hypergrad.config import CONFIG_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[
            "hyperparams=digits_schedule", "hyperparams/kind@hyperparams.items.wd=per_group",
            "+hyperparams.items.wd.groups={decay: weight$}",
            "+hyperparams.items.wd.default=0.0"])
        hps = instantiate(cfg.hyperparams, _convert_="all")
        wd = hps.by_name["wd"]
        assert isinstance(wd, hg.PerGroup) and wd.groups == {"decay": "weight$"}
        assert wd.default == 0.0 and wd.name == "wd"
        lm = compose("config", overrides=["experiment=charlm"])
        item = instantiate(lm.hyperparams, _convert_="all").by_name["wd"]
        assert isinstance(item, hg.PerGroup) and len(item.groups) == 5


def test_the_configs_page_command_runs(tmp_path: Path) -> None:
    """docs/configs.md's per_group command (shortened by debug=fast) runs; learned.yaml decays
    the weights and not the biases, and the log names the group."""
    import yaml

    run_cli(configs_block("per_group"), tmp_path)
    learned = yaml.safe_load((tmp_path / "learned.yaml").read_text())["optimizer"]
    decay = {g["params"][0]: g.get("weight_decay", learned["defaults"].get("weight_decay"))
             for g in learned["param_groups"]}
    assert set(decay) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert decay["0.bias"] == decay["2.bias"] == 0.0 and decay["0.weight"] > 0
    assert "wd[decay]=" in (tmp_path / "cli.log").read_text()


def test_a_zero_width_box_holds_the_recipe_decay_while_the_rest_is_tuned() -> None:
    """guide.md: ``Guards(bounds={"wd": (0.1, 0.1)})`` keeps the weights' decay at 0.1 (the
    biases at the default 0) while the Trainer tunes the learning rate."""
    p = _problem(hg.PerGroup("wd", 0.1, "log", groups=DECAY, default=0.0))
    res = hg.Trainer(p, mode=hg.Offline(outer_steps=3),
                     guards=hg.Guards(bounds={"wd": (0.1, 0.1)}),
                     callbacks=[hg.run.Log(None)]).fit()
    values = p.hyperparams.describe(res.lam)
    assert values["wd"] == [pytest.approx(0.1, rel=1e-12)]
    assert values["lr"] != pytest.approx(0.05, rel=1e-6)  # the learning rate moved


def test_the_configs_page_quoted_patterns_compose() -> None:
    """docs/configs.md's quoted override (patterns with ``^`` and ``\\``, which Hydra's grammar
    refuses unquoted) composes to those regular expressions, which bind as the page says."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from hypergrad.config import CONFIG_DIR, register_configs

    page = (Path(__file__).resolve().parents[1] / "docs" / "configs.md").read_text()
    override = re.search(r'`"(\+hyperparams\.items\.wd\.groups=\{first:[^"]*)"`', page)
    assert override, "the quoted example is gone from docs/configs.md"
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[
            "experiment=digits_schedule", "hyperparams/kind@hyperparams.items.wd=per_group",
            override.group(1), "hyperparams.items.wd.default=0.0"])
    wd = instantiate(cfg.hyperparams, _convert_="all").by_name["wd"]
    assert wd.groups == {"first": r"^0\.weight", "rest": "weight$"}
    bound = wd.bind(["0.weight", "0.bias", "2.weight", "2.bias"])
    assert bound.binding()["groups"] == [["first", ["0.weight"]], ["rest", ["2.weight"]]]
