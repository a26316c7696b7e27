"""A schedule per group of parameter tensors (``Schedule(..., groups={name: pattern})``): a
per-layer learning-rate schedule, as Maclaurin et al. (2015) learned them, K = groups x windows.
Checked in float64 against reverse mode and central finite differences, against a PerGroup
(one window) and a plain Schedule (equal rows), the forward-mode column plan, plain torch.optim
with a LambdaLR per parameter group from ``learned.yaml``, and through Hydra."""

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
from hypergrad.methods.forward import ColumnPlan
from hypergrad.run.outer import schedule_smoothing
from hypergrad.testing import hypergradcheck

GROUPS = {"first": r"^0\.", "last": r"^3\."}  # the LayerNorm's parameters read the default


def _lr(init: Any = (0.05, 0.02, 0.01), **kw: Any) -> hg.Schedule:
    return hg.Schedule("lr", list(init) if isinstance(init, tuple) else init,
                       transform=kw.pop("transform", "log"), windows=kw.pop("windows", 3),
                       groups=kw.pop("groups", GROUPS), default=kw.pop("default", 0.001), **kw)


CASES: dict[str, Any] = {
    "sgd_momentum": lambda: hg.optim.sgd(lr="lr", momentum=0.9),
    "adamw": lambda: hg.optim.adamw(lr="lr", weight_decay=0.01),
    "adam_clipped": lambda: hg.optim.adam(lr="lr", clip_grad_norm=0.5),
    "rmsprop": lambda: hg.optim.rmsprop(lr="lr"),
    "schedulefree": lambda: hg.optim.adamw_schedulefree(lr="lr", warmup_steps=2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_equals_reverse_and_finite_differences(name: str) -> None:
    p = layered_problem(CASES[name](), [_lr()], steps=9)
    assert p.num_hyperparams == 6 and p.hyperparams.items[0].shape() == (2, 3)
    g = torch.Generator().manual_seed(3)
    lam = p.init_raw() + 0.2 * torch.randn(6, generator=g, dtype=torch.float64)
    report = hypergradcheck(p, lam, strategies=())
    assert report.ok and report.max("fwd_vs_rev") < 1e-9, str(report)


def test_the_column_plan_reads_one_window_of_every_group() -> None:
    """Forward mode computes a window's columns from the step that first reads them, and the
    optimizer reads window w of each group at a step of window w (offsets g * W + w)."""
    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr(), hg.Scalar("wd", 0.1)], steps=9)
    plan = ColumnPlan(p)
    assert plan.first_read == [0, 3, 6, 0, 3, 6, 0]
    assert plan.optimizer_columns(0) == [0, 3] and plan.optimizer_columns(4) == [1, 4]
    assert plan.optimizer_columns(8) == [2, 5]


def test_one_window_is_a_per_group_value_and_equal_rows_a_shared_schedule() -> None:
    """Windows = 1: the PerGroup of the same groups (equal hypergradients, 1e-12). Every group
    at the same windows: the plain schedule's run, and its hypergradient per window is the sum
    over the groups'."""
    opt = hg.optim.sgd(lr="lr", momentum=0.9)
    a = layered_problem(opt, [_lr(0.05, windows=1)])
    b = layered_problem(opt, [hg.PerGroup("lr", 0.05, "log", groups=GROUPS, default=0.001)])
    ga = hg.ForwardMode().hypergradient(a, a.init_raw()).grad
    gb = hg.ForwardMode().hypergradient(b, b.init_raw()).grad
    torch.testing.assert_close(ga, gb, rtol=1e-12, atol=1e-15)
    grouped = layered_problem(opt, [_lr(groups={"all": ".*"}, default=None)], steps=9)
    split = layered_problem(opt, [_lr(groups={"first": r"^0\.", "rest": ".*"}, default=None)],
                            steps=9)
    plain = layered_problem(opt, [hg.Schedule("lr", [0.05, 0.02, 0.01], "log", windows=3)],
                            steps=9)
    gp = hg.ForwardMode().hypergradient(plain, plain.init_raw()).grad
    gs = hg.ForwardMode().hypergradient(split, split.init_raw()).grad
    torch.testing.assert_close(gs.reshape(2, 3).sum(0), gp, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(hg.ForwardMode().hypergradient(
        grouped, grouped.init_raw()).grad, gp, rtol=1e-12, atol=1e-15)
    sa, sb = split.run(split.init_raw()), plain.run(plain.init_raw())
    for n in sa.params:
        torch.testing.assert_close(sa.params[n], sb.params[n], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize(("init", "transform"), [
    ((0.05, 0.02, 0.01), "log"),
    ([[0.0, 0.05, 0.02], [0.03, 0.02, 0.0]], "identity"),  # a warm-up from 0 in one group
])
def test_learned_yaml_trains_as_torch_optim_with_a_lambdalr_per_group(init: Any,
                                                                      transform: str) -> None:
    p = layered_problem(hg.optim.sgd(lr="lr", momentum=0.9),
                        [_lr(init, transform=transform)], steps=9)
    lam = p.init_raw() + (0.2 if transform == "log" else 0.0)
    state = p.run(lam)
    settings = learned_settings(p, lam)
    assert set(settings["schedule"]["factors"]) == {"0.weight", "0.bias", "3.weight", "3.bias"}
    m = layered_model()
    optimizer, scheduler = optimizer_from_settings(settings, m, p.steps)
    assert_trained_as(train_like_torch(p, m, optimizer, scheduler), state)


def test_values_labels_and_binding() -> None:
    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr()], steps=9)
    hps, lam = p.hyperparams, p.init_raw()
    at4 = hps.values(lam, 4, p.steps)["lr"]
    assert {n: round(float(at4[n]), 12) for n in ("0.weight", "3.bias", "1.weight")} == {
        "0.weight": 0.02, "3.bias": 0.02, "1.weight": 0.001}
    assert list(hps.named(hps.describe(lam), p.steps)) == [
        "lr[first, steps 0-2]", "lr[first, steps 3-5]", "lr[first, steps 6-8]",
        "lr[last, steps 0-2]", "lr[last, steps 3-5]", "lr[last, steps 6-8]"]
    assert hps.items[0].binding() == {"groups": [["first", ["0.bias", "0.weight"]],
                                                 ["last", ["3.bias", "3.weight"]]],
                                      "default": 0.001}
    rows = hps.values(lam)["lr"]["0.weight"]  # inside a loss: the group's windows
    assert rows.shape == (3,)


def test_the_smoothing_couples_windows_within_each_group_only() -> None:
    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr()], steps=9)
    sparse = schedule_smoothing(p.hyperparams.items, 0.5)
    assert sparse is not None and sparse.shape == (6, 6) and sparse.is_sparse
    kernel = sparse.to_dense()
    assert torch.count_nonzero(kernel[:3, 3:]) == 0 and torch.count_nonzero(kernel[3:, :3]) == 0
    torch.testing.assert_close(kernel[:3, :3], kernel[3:, 3:])
    assert kernel[0, 1] > 0


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"multipliers": {".*": 1.0}}, ValueError, r"takes groups \(a schedule per group\) or "
                                                r"multipliers"),
    ({"groups": None, "default": 0.1}, ValueError, r"default=0.1 is the value of the "
                                                    r"parameters that match no group; it needs"),
    ({"groups": {}}, ValueError, r"groups is empty"),
    ({"groups": {"a": "("}}, ValueError, r"pattern '\(' of group 'a' is not a regular"),
    ({"default": float("nan")}, ValueError, r"default=nan must be a finite"),
])
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _lr(**kwargs)


def test_binding_and_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match=r"Schedule\('lr'\): parameters \['1.weight', "
                                         r"'1.bias'\] match no group .* pass default="):
        layered_problem(hg.optim.sgd(lr="lr"), [_lr(default=None)])
    with pytest.raises(ValueError, match=r"groups \['late'\] match no parameter"):
        layered_problem(hg.optim.sgd(lr="lr"), [_lr(groups={"all": ".*", "late": "^3"})])
    with pytest.raises(ValueError, match=r"init has shape \(2,\), expected a number or shape "
                                         r"\(2, 3\) \(3 values, one per window, that "
                                         r"every group starts from, or a row of them"):
        layered_problem(hg.optim.sgd(lr="lr"), [_lr((0.1, 0.2))]).init_raw()
    with pytest.raises(ValueError, match=r"has groups but is not bound to a model yet"):
        item = _lr()
        item.value(item.init_raw(torch.float64), 0, 9)


def test_the_configs_page_command_runs(tmp_path: Path) -> None:
    """docs/configs.md's schedule-per-group command: learned.yaml holds each group's factors,
    results.json a row of windows per group."""
    import json

    import yaml

    run_cli(configs_block("hyperparams.items.lr.groups"), tmp_path)
    factors = yaml.safe_load((tmp_path / "learned.yaml").read_text())["schedule"]["factors"]
    assert set(factors) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    learned = json.loads((tmp_path / "results.json").read_text())["learned"]["lr"]
    assert len(learned) == 2 and len(learned[0]) == 5


def test_a_group_s_windows_are_bounded_by_its_name() -> None:
    """``Guards(bounds={"lr[last]": (v, v)})`` holds every window of one group while the other
    group's schedule is tuned; a window is bounded by its flat index."""
    start = [[0.03, 0.02, 0.01], [0.02, 0.02, 0.02]]  # inside the bounds
    p = layered_problem(hg.optim.sgd(lr="lr", momentum=0.9), [_lr(start)], steps=9)
    res = hg.Trainer(p, mode=hg.Offline(outer_steps=3),
                     guards=hg.Guards(bounds={"lr[last]": (0.02, 0.02), "lr[0]": (None, 0.04)}),
                     callbacks=[hg.run.Log(None)]).fit()
    first, last = p.hyperparams.describe(res.lam)["lr"]  # type: ignore[misc]
    assert last == pytest.approx([0.02] * 3, rel=1e-12)
    assert first[0] <= 0.04 * (1 + 1e-9) and first != pytest.approx(start[0])
    with pytest.raises(ValueError, match=r"'lr' has no entry 'middle'; its entries are the "
                                         r"indices 0-5 or one of \['first', 'last'\]"):
        hg.Trainer(p, guards=hg.Guards(bounds={"lr[middle]": (0.01, 0.1)}))
