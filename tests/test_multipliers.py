"""Fixed multipliers per parameter tensor on one tuned value (``Scalar`` / ``Schedule`` with
``multipliers={pattern: factor}``): a layer-wise learning-rate scale under a tuned schedule, at
no extra tangent column. Checked in float64 against reverse mode and central finite
differences for every optimizer, against the PerGroup it abbreviates (its hypergradient is the
multiplier-weighted sum of the groups'), against plain ``torch.optim`` parameter groups with
``LambdaLR`` through ``learned.yaml``, and through Hydra."""

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
from hypergrad.testing import hypergradcheck

LAYERS = {r"^0\.": 0.3, r"^1\.": 0.0, r".*": 1.0}  # a smaller rate first, the norm frozen


def _lr(init: Any = 0.05, **kw: Any) -> hg.Schedule:
    return hg.Schedule("lr", init, transform=kw.pop("transform", "log"), windows=2,
                       multipliers=kw.pop("multipliers", LAYERS), **kw)


CASES: dict[str, Any] = {
    "adamw": lambda: (hg.optim.adamw(lr="lr", weight_decay=0.01), [_lr()]),
    "sgd_momentum": lambda: (hg.optim.sgd(lr="lr", momentum="mom"), [
        _lr(), hg.Scalar("mom", 0.8, "logit", multipliers={r"^3\.": 0.5, r".*": 1.0})]),
    "sgd_clipped": lambda: (hg.optim.sgd(lr="lr", momentum=0.9, clip_grad_norm=0.5), [_lr()]),
    "adam_l2": lambda: (hg.optim.adam(lr="lr", weight_decay="wd"), [
        _lr(), hg.Scalar("wd", 0.05, "log", multipliers={r"weight$": 1.0, r".*": 0.0})]),
    "rmsprop": lambda: (hg.optim.rmsprop(lr="lr", momentum=0.5), [_lr()]),
    "adagrad": lambda: (hg.optim.adagrad(lr="lr"), [_lr()]),
    "schedulefree": lambda: (hg.optim.adamw_schedulefree(lr="lr"), [_lr()]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_equals_reverse_and_finite_differences(name: str) -> None:
    opt, items = CASES[name]()
    p = layered_problem(opt, items)
    assert p.num_hyperparams == sum(it.numel for it in items)  # no column per multiplier
    # off the tie of equal windows (schedule-free's running maximum of the learning rate has
    # a kink there, where finite differences disagree with any one-sided derivative)
    g = torch.Generator().manual_seed(3)
    lam = p.init_raw() + 0.2 * torch.randn(p.num_hyperparams, generator=g, dtype=torch.float64)
    report = hypergradcheck(p, lam, strategies=())
    assert report.ok and report.max("fwd_vs_rev") < 1e-9, str(report)


def test_the_hypergradient_is_the_multiplier_weighted_sum_of_the_groups() -> None:
    """``multipliers`` abbreviate a PerGroup held at ``factor * value``: the same trained
    weights, and ``d/d value = sum_g factor_g * d/d value_g`` (identity transforms)."""
    lr = hg.Schedule("lr", [0.04, 0.02], windows=2, multipliers=LAYERS)
    groups = hg.PerGroup("lr", [0.3 * 0.04, 0.0, 0.04], groups={"first": r"^0\.",
                                                                 "norm": r"^1\.", "rest": ".*"})
    a = layered_problem(hg.optim.sgd(lr="lr", momentum=0.9), [lr])
    # the PerGroup cannot hold a schedule: one window at a time, the other held at its value
    b = layered_problem(hg.optim.sgd(lr="lr", momentum=0.9), [groups])
    one = layered_problem(hg.optim.sgd(lr="lr", momentum=0.9),
                   [hg.Schedule("lr", [0.04, 0.04], windows=2, multipliers=LAYERS)])
    ga = hg.ForwardMode().hypergradient(one, one.init_raw()).grad
    gb = hg.ForwardMode().hypergradient(b, b.init_raw()).grad
    torch.testing.assert_close(ga.sum(), 0.3 * gb[0] + 0.0 * gb[1] + 1.0 * gb[2],
                               rtol=1e-12, atol=1e-15)
    sa, sb = one.run(one.init_raw()), b.run(b.init_raw())
    for n in sa.params:
        torch.testing.assert_close(sa.params[n], sb.params[n], rtol=1e-13, atol=1e-15)
    assert torch.equal(a.run(a.init_raw()).params["1.weight"], layered_model()[1].weight)  # frozen


@pytest.mark.parametrize(("opt", "init", "transform"), [
    ("sgd", 0.05, "log"), ("adamw", 0.01, "log"),
    ("sgd", [0.0, 0.05], "identity"),  # a warm-up from 0: the base is the largest window's
])
def test_learned_yaml_trains_as_torch_optim_groups_with_lambdalr(opt: str, init: Any,
                                                                 transform: str) -> None:
    """The library's run equals plain torch from ``learned.yaml``: a parameter group per
    tensor holding ``factor * lr`` and ``LambdaLR`` over the windows."""
    optimizer = (hg.optim.sgd(lr="lr", momentum=0.9) if opt == "sgd"
                 else hg.optim.adamw(lr="lr", weight_decay=0.01))
    p = layered_problem(optimizer, [_lr(init, transform=transform)], steps=8)
    lam = p.init_raw() + (0.3 if transform == "log" else 0.0)
    state = p.run(lam)
    settings = learned_settings(p, lam)
    groups = {g["params"][0]: g.get("lr", settings["optimizer"]["defaults"]["lr"])
              for g in settings["optimizer"]["param_groups"]}
    base = max(p.hyperparams.describe(lam)["lr"])  # type: ignore[type-var]
    if transform == "log":
        base = p.hyperparams.describe(lam)["lr"][0]  # type: ignore[index]
    assert groups == pytest.approx({"0.weight": 0.3 * base, "0.bias": 0.3 * base,
                                    "1.weight": 0.0, "1.bias": 0.0, "3.weight": base,
                                    "3.bias": base}, rel=1e-12)
    m = layered_model()
    torch_opt, scheduler = optimizer_from_settings(settings, m, p.steps)
    assert_trained_as(train_like_torch(p, m, torch_opt, scheduler), state)


def test_the_loss_reads_a_value_per_parameter_and_reports_stay_unmultiplied() -> None:
    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr([0.05, 0.02])])
    values = p.hyperparams.values(p.init_raw(), 7, p.steps)
    assert {n: round(float(v), 12) for n, v in values["lr"].items()} == {
        "0.weight": 0.006, "0.bias": 0.006, "1.weight": 0.0, "1.bias": 0.0, "3.weight": 0.02,
        "3.bias": 0.02}
    assert set(p.hyperparams.values(p.init_raw())["lr"]) == set(values["lr"])  # whole windows
    assert p.hyperparams.describe(p.init_raw())["lr"] == pytest.approx([0.05, 0.02])
    assert p.num_hyperparams == 2


@pytest.mark.parametrize(("multipliers", "error", "match"), [
    ({}, ValueError, r"Schedule\('lr'\): multipliers=\{\} must map regular expressions"),
    ({3: 0.1}, TypeError, r"the key 3 must be a regular expression"),
    ({"^0": "0.1"}, TypeError, r"multipliers\['\^0'\]='0.1' must be a number"),
    ({"^0(": 0.1}, ValueError, r"'\^0\(' is not a regular expression"),
    ({"^0": float("nan"), ".*": 1.0}, ValueError, r"multipliers \{'\^0': nan\} must be finite"),
    # a negative factor of a learning rate was gradient ascent, accepted without a word
    ({"^0": -0.5, ".*": 1.0}, ValueError, r"multipliers \{'\^0': -0.5\} must be finite numbers "
                                          r">= 0"),
])
def test_bad_multipliers_are_named(multipliers: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _lr(multipliers=multipliers)


def test_the_problem_refuses_unmatched_parameters_and_unused_patterns() -> None:
    with pytest.raises(ValueError, match=r"Schedule\('lr'\): multipliers=\{'\^0\\\\.': 0.3\}: "
                                         r"parameters \['1.weight', '1.bias', '3.weight', "
                                         r"'3.bias'\] match no pattern"):
        layered_problem(hg.optim.sgd(lr="lr"), [_lr(multipliers={r"^0\.": 0.3})])
    with pytest.raises(ValueError, match=r"patterns \['\^9'\] match no parameter"):
        layered_problem(hg.optim.sgd(lr="lr"), [_lr(multipliers={"^9": 0.3, ".*": 1.0})])
    with pytest.raises(ValueError, match=r"not bound to a model yet"):
        item = _lr()
        item.value(item.init_raw(torch.float64), 0, 10)


def test_the_multipliers_are_part_of_the_binding() -> None:
    """A run's fingerprint holds its hyperparameters' bindings: a resumed run with other
    multipliers is refused as another problem."""
    assert _lr().binding() == {"multipliers": LAYERS}
    assert hg.Schedule("lr", 0.05, windows=2).binding() is None
    assert _lr() != _lr(multipliers={".*": 1.0})


def test_a_frozen_layer_under_schedule_free_equals_the_package() -> None:
    """Schedule-free AdamW with a multiplier of 0 on one layer: the package's parameter group
    at ``lr=0`` averages with weight 0 (``weight / weight_sum if weight_sum != 0 else 0``);
    the library's 0 / 0 gave NaN weights before it did the same."""
    schedulefree = pytest.importorskip("schedulefree")
    p = layered_problem(hg.optim.adamw_schedulefree(lr="lr", warmup_steps=2),
                 [hg.Scalar("lr", 0.02, "log", multipliers={r"^0\.": 0.0, ".*": 1.0})], steps=6)
    state = p.run(p.init_raw())
    m = layered_model()
    groups = [{"params": [w for n, w in m.named_parameters() if n.startswith("0.")], "lr": 0.0},
              {"params": [w for n, w in m.named_parameters() if not n.startswith("0.")]}]
    ref = schedulefree.AdamWScheduleFree(groups, lr=0.02, warmup_steps=2)
    ref.train()
    train_like_torch(p, m, ref)
    ref.eval()
    assert_trained_as(m, state)
    assert torch.equal(state.params["0.weight"], layered_model()[0].weight)


def test_multipliers_on_a_value_no_optimizer_argument_reads_are_refused() -> None:
    with pytest.raises(ValueError, match=r"Scalar\('l2'\) has multipliers per parameter tensor "
                                         r"but no optimizer argument reads it"):
        layered_problem(hg.optim.sgd(lr="lr"), [hg.Scalar("lr", 0.1, "log"),
                                         hg.Scalar("l2", 0.1, "log", multipliers={".*": 1.0})])


def test_the_configs_page_command_runs(tmp_path: Path) -> None:
    """docs/configs.md's multipliers command (shortened by debug=fast) runs through Hydra;
    learned.yaml gives the first layer half the rate of the rest."""
    import yaml

    run_cli(configs_block("multipliers"), tmp_path)
    learned = yaml.safe_load((tmp_path / "learned.yaml").read_text())["optimizer"]
    lr = {n: learned["defaults"]["lr"] for n in ("0.weight", "0.bias", "2.weight", "2.bias")}
    lr |= {g["params"][0]: g["lr"] for g in learned["param_groups"] if "lr" in g}
    assert lr["0.weight"] == lr["0.bias"] == pytest.approx(0.5 * lr["2.weight"], rel=1e-6)
    assert lr["2.bias"] == lr["2.weight"]
    assert (tmp_path / "schedule.png").exists()


def test_a_pattern_that_reaches_a_tied_weight_by_its_other_name_is_named() -> None:
    """``head.weight = emb.weight``: the shared tensor is listed once, as ``emb.weight``, so a
    multiplier ``^head\\.`` gave ``head.bias`` 0.1 and the tied weight 1.0 without a word (the
    pattern matched ``head.bias``, so it was not refused as matching nothing; the per-layer
    probe, 2026-12-07). Constant per-parameter arguments and groups alike."""
    import warnings

    import torch.nn.functional as F
    from torch import nn

    from hypergrad.errors import ConfigWarning

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.head = nn.Embedding(5, 3), nn.Linear(3, 5)
            self.head.weight = self.emb.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.emb(x).mean(1))

    x, y = torch.randint(0, 5, (8, 2)), torch.randint(0, 5, (8,))

    def build(hp: Any, opt: Any) -> hg.InnerProblem:
        torch.manual_seed(0)
        return hg.InnerProblem(Tied().double(), lambda m, b, h: F.cross_entropy(m(b[0]), b[1]),
                               opt, hg.HyperParams([hp]), [(x, y)], 2,
                               lambda m, h: F.cross_entropy(m(x), y))

    head = {r"^head\.": 0.1, r".*": 1.0}
    for hp, opt, where in [
        (hg.Scalar("lr", 0.3, "log", multipliers=head), hg.optim.sgd(lr="lr"),
         r"Scalar\('lr'\).multipliers"),
        (hg.Scalar("lr", 0.3, "log"), hg.optim.sgd(lr="lr", weight_decay={r"^head\.": 0.0,
                                                                            r".*": 0.1}),
         r"sgd's weight_decay"),
        (hg.Scalar("lr", 0.3, "log"), hg.optim.adam(lr="lr", betas=({r"^head\.": 0.5,
                                                                     r".*": 0.9}, 0.999)),
         r"adam's betas\[0\]"),  # a pair's entry (not looked at before)
        (hg.PerGroup("lr", 0.3, "log", groups={"head": r"^head\.", "rest": r".*"}),
         hg.optim.sgd(lr="lr"), r"PerGroup\('lr'\).groups")]:
        with pytest.warns(ConfigWarning, match=rf"^InnerProblem: {where}: the pattern "
                                               r"'\^head\\\\.' matches 'head.weight', another "
                                               r"name of the tied parameter 'emb.weight'"):
            build(hp, opt)
    # a pattern that only the other name matches: refused, and why
    for hp, opt in [(hg.Scalar("lr", 0.3, "log", multipliers={r"^head\.weight$": 0.1,
                                                              r".*": 1.0}),
                     hg.optim.sgd(lr="lr")),
                    (hg.PerGroup("lr", 0.3, "log", groups={"w": r"^head\.weight$",
                                                           "rest": r".*"}),
                     hg.optim.sgd(lr="lr"))]:
        with pytest.raises(ValueError, match=r"match no parameter.*a tied one is listed once, "
                                             r"under its first name"):
            build(hp, opt)
    # named by the name it is listed under: it takes the value asked for, nothing said
    named = {r"^emb\.weight$": 0.1, r".*": 1.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        build(hg.Scalar("lr", 0.3, "log", multipliers=named), hg.optim.sgd(lr="lr"))
