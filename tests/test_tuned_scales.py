"""One tuned schedule and a tuned factor per group of parameter tensors
(``Schedule(..., scales={name: pattern})``): a per-layer learning rate under a shared
learning-rate schedule, K = windows + groups. Checked in float64 against reverse mode and
central finite differences (every optimizer: ``tests/test_exactness.py``'s grid holds the kind
``tuned_scales``; here the case where every parameter is in a group), against the schedule per
group it restricts, against plain ``torch.optim`` parameter groups with ``LambdaLR`` through
``learned.yaml``, in the Trainer's search box, bounds, start and smoothing, and through
Hydra."""

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
from hypergrad.run.bounds import Bounds
from hypergrad.run.outer import LOG_RANGE, schedule_smoothing, search_box
from hypergrad.testing import hypergradcheck

SCALES = {"first": r"^0\.", "last": r"^3\."}  # the norm (1.*) reads the schedule itself


def _lr(init: Any = 0.05, windows: int = 3, **kw: Any) -> hg.Schedule:
    return hg.Schedule("lr", init, transform=kw.pop("transform", "log"), windows=windows,
                       scales=kw.pop("scales", SCALES), **kw)


def _off_tie(p: hg.InnerProblem, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return p.init_raw() + 0.2 * torch.randn(p.num_hyperparams, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw"])
def test_forward_equals_reverse_and_finite_differences_every_parameter_grouped(opt: str
                                                                              ) -> None:
    """With every parameter in a group, one direction of the K changes nothing: its
    hypergradient is orthogonal to it (the scales' entries sum to the windows')."""
    optimizer = (hg.optim.sgd(lr="lr", momentum=0.9) if opt == "sgd_momentum"
                 else hg.optim.adamw(lr="lr", weight_decay=0.01))
    p = layered_problem(optimizer, [_lr(scales={"first": r"^0\.", "rest": ".*"})], steps=9)
    assert p.num_hyperparams == 3 + 2
    lam = _off_tie(p)
    report = hypergradcheck(p, lam, strategies=())
    assert report.ok and report.max("fwd_vs_rev") < 1e-9, str(report)
    g = report.grad
    assert g is not None
    torch.testing.assert_close(g[:3].sum(), g[3:].sum(), rtol=1e-9, atol=1e-14)


def test_the_scaled_schedule_is_a_schedule_per_group_with_rows_a_factor_apart() -> None:
    """The same run as ``groups`` with row ``g`` = ``scale_g * windows``; each scale's
    hypergradient is the sum of its group's windows' (log transforms), each window's the sum of
    that window over every row."""
    windows, scales = [0.05, 0.03, 0.01], [0.5, 2.0]
    a = layered_problem(hg.optim.sgd(lr="lr", momentum=0.9), [_lr(windows + scales)], steps=9)
    rows = [[s * w for w in windows] for s in scales] + [windows]
    b = layered_problem(hg.optim.sgd(lr="lr", momentum=0.9), [hg.Schedule(
        "lr", rows, "log", windows=3, groups={"first": r"^0\.", "last": r"^3\.", "norm": ".*"})],
        steps=9)
    sa, sb = a.run(a.init_raw()), b.run(b.init_raw())
    for n in sa.params:
        torch.testing.assert_close(sa.params[n], sb.params[n], rtol=1e-13, atol=1e-15)
    ga = hg.ReverseMode().hypergradient(a, a.init_raw()).grad
    gb = hg.ReverseMode().hypergradient(b, b.init_raw()).grad.reshape(3, 3)
    torch.testing.assert_close(ga[:3], gb.sum(0), rtol=1e-11, atol=1e-15)
    torch.testing.assert_close(ga[3:], gb[:2].sum(1), rtol=1e-11, atol=1e-15)


def test_values_init_labels_and_binding() -> None:
    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr([0.05, 0.02, 0.01, 0.5, 2.0])], steps=9)
    hps = p.hyperparams
    at = {n: round(float(v), 12) for n, v in hps.values(p.init_raw(), 4, 9)["lr"].items()}
    assert at == {"0.weight": 0.01, "0.bias": 0.01, "1.weight": 0.02, "1.bias": 0.02,
                  "3.weight": 0.04, "3.bias": 0.04}
    inside = hps.values(p.init_raw())["lr"]  # inside a loss: every window, scaled
    torch.testing.assert_close(inside["3.weight"], 2.0 * inside["1.weight"])
    assert hps.named(hps.describe(p.init_raw()), 9) == pytest.approx({
        "lr[steps 0-2]": 0.05, "lr[steps 3-5]": 0.02, "lr[steps 6-8]": 0.01, "lr[first]": 0.5,
        "lr[last]": 2.0})
    # a number or the windows' values start every scale at 1
    assert _lr(0.05).init_raw(torch.float64).tolist() == pytest.approx(
        [torch.tensor(0.05).log().item()] * 3 + [0.0, 0.0])
    assert _lr([0.05, 0.02, 0.01]).init_raw(torch.float64)[3:].tolist() == [0.0, 0.0]
    item = hps.by_name["lr"]
    assert item.binding() == {"scales": {"groups": [["first", ["0.bias", "0.weight"]],
                                                    ["last", ["3.bias", "3.weight"]]],
                                         "default": None}}
    assert item.entry_labels() == ["first", "last"] and item.entries_of("last") == [4]
    assert item.base_numel == 3 and item.numel == 5
    plan = ColumnPlan(p)  # every step reads its window and every scale
    assert plan.first_read == [0, 3, 6, 0, 0]
    assert plan.optimizer_columns(4) == [1, 3, 4]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"transform": "identity"}, ValueError, r"scales multiply the schedule by tuned positive "
                                            r"factors, which needs transform='log'"),
    ({"groups": {"a": ".*"}}, ValueError, r"takes scales \(one schedule, a tuned factor per "
                                          r"group\) or groups"),
    ({"multipliers": {".*": 1.0}}, ValueError, r"or multipliers \(fixed factors\), not both"),
    ({"scales": {}}, ValueError, r"scales: groups is empty"),
    ({"scales": ["^0"]}, TypeError, r"scales: groups=\['\^0'\] must map group names"),
    ({"default": 0.1}, ValueError, r"with scales, the parameters of no group read the "
                                   r"schedule itself"),
])
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _lr(**kwargs)


def test_binding_and_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match=r"Schedule\('lr'\): scales: groups \['late'\] match "
                                         r"no parameter"):
        layered_problem(hg.optim.sgd(lr="lr"), [_lr(scales={"all": ".*", "late": "^3"})])
    with pytest.raises(ValueError, match=r"init has shape \(2,\), expected a number or shape "
                                         r"\(5,\) \(3 values, one per window, the scales "
                                         r"starting at 1, or 5: the windows, then a scale per "
                                         r"group of \['first', 'last'\]\)"):
        _lr((0.1, 0.2)).init_raw(torch.float64)
    with pytest.raises(ValueError, match=r"has scales but is not bound to a model yet"):
        item = _lr()
        item.value(item.init_raw(torch.float64), 0, 9)


def test_the_windows_pair_bounds_the_windows_and_a_group_key_its_scale() -> None:
    """``bounds={"lr": ...}`` is in the schedule's units and bounds the windows only; the
    scales (factors around 1) get a box of their own, 1/100 to 100, or ``"lr[group]"``'s."""
    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr(0.05)], steps=9)
    hps = p.hyperparams
    bounds = Bounds(hps, torch.float64, {"lr": (1e-3, 0.1), "lr[last]": (0.5, 4.0)})
    lo, hi = search_box(hps, bounds, p.init_raw())
    torch.testing.assert_close(lo.exp(), torch.tensor([1e-3] * 3 + [0.01, 0.5],
                                                       dtype=torch.float64))
    torch.testing.assert_close(hi.exp(), torch.tensor([0.1] * 3 + [100.0, 4.0],
                                                       dtype=torch.float64))
    lam = torch.tensor([0.0] * 3 + [3.0, 3.0], dtype=torch.float64)  # values 1, 1, 1, e^3, e^3
    bounds.project(lam)
    assert lam.exp().tolist() == pytest.approx([0.1] * 3 + [torch.e ** 3, 4.0])
    free_lo, free_hi = search_box(hps, Bounds(hps, torch.float64, {}), p.init_raw())
    assert (free_hi - free_lo).tolist() == pytest.approx([2 * LOG_RANGE] * 5)
    assert free_lo[3:].tolist() == pytest.approx([-LOG_RANGE] * 2)


def test_the_start_draws_the_windows_at_one_level_and_each_scale_on_its_own() -> None:
    p = layered_problem(hg.optim.sgd(lr="lr", weight_decay="wd"),
                        [_lr(0.05), hg.Scalar("wd", 1e-3, "log")],
                        steps=9)
    trainer = hg.Trainer(p, mode=hg.Offline(outer_steps=1, start=4),
                         callbacks=[hg.run.Log(None)])
    assert trainer._draw_columns().tolist() == [0, 0, 0, 1, 2, 3]
    pts = torch.stack(trainer._space_filling(4, 0))
    assert torch.equal(pts[:, 0], pts[:, 2]) and not torch.equal(pts[:, 3], pts[:, 4])


def test_the_smoothing_couples_the_windows_only() -> None:
    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr(0.05, windows=4)], steps=8)
    sparse = schedule_smoothing(p.hyperparams.items, 0.5)
    assert sparse is not None and sparse.shape == (6, 6) and sparse.is_sparse
    kernel = sparse.to_dense()
    assert kernel[0, 1] > 0
    torch.testing.assert_close(kernel[4:, :], torch.eye(6, dtype=torch.float64)[4:])
    torch.testing.assert_close(kernel[:, 4:], torch.eye(6, dtype=torch.float64)[:, 4:])


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_learned_yaml_trains_as_torch_optim_groups_with_lambdalr(opt: str) -> None:
    """The library's run equals plain torch from ``learned.yaml``: a parameter group per tensor
    holding ``scale * lr`` and ``LambdaLR`` over the shared windows."""
    optimizer = (hg.optim.sgd(lr="lr", momentum=0.9) if opt == "sgd"
                 else hg.optim.adamw(lr="lr", weight_decay=0.01))
    p = layered_problem(optimizer, [_lr([0.05, 0.02, 0.01, 0.5, 2.0])], steps=9)
    lam = p.init_raw()
    state = p.run(lam)
    settings = learned_settings(p, lam)
    groups = {g["params"][0]: g.get("lr", settings["optimizer"]["defaults"]["lr"])
              for g in settings["optimizer"]["param_groups"]}
    assert groups == pytest.approx({"0.weight": 0.025, "0.bias": 0.025, "1.weight": 0.05,
                                    "1.bias": 0.05, "3.weight": 0.1, "3.bias": 0.1}, rel=1e-12)
    assert [w[2] for w in settings["schedule"]["windows"]] == pytest.approx([1.0, 0.4, 0.2])
    m = layered_model()
    torch_opt, scheduler = optimizer_from_settings(settings, m, p.steps)
    assert_trained_as(train_like_torch(p, m, torch_opt, scheduler), state)


def test_the_trainer_tunes_a_scale_and_reports_it(tmp_path: Path) -> None:
    """A few outer steps move the scales (they have hypergradients of their own) and the run's
    records name them."""
    p = layered_problem(hg.optim.sgd(lr="lr", momentum=0.9), [_lr(0.05)], steps=9)
    res = hg.Trainer(p, mode=hg.Offline(outer_steps=3, start=0, recheck=0),
                     callbacks=[hg.run.Log(None)]).fit()
    named = p.hyperparams.named(p.hyperparams.describe(res.lam), p.steps)
    assert set(named) >= {"lr[first]", "lr[last]"}
    assert named["lr[first]"] != 1.0 and named["lr[last]"] != 1.0


def test_the_configs_page_command_runs(tmp_path: Path) -> None:
    """docs/configs.md's scales command: learned.yaml holds the hidden layer's rate as its
    learned factor of the output layer's, results.json the windows and then the scale."""
    import json

    import yaml

    run_cli(configs_block("hyperparams.items.lr.scales"), tmp_path)
    learned = yaml.safe_load((tmp_path / "learned.yaml").read_text())["optimizer"]
    lr = {n: learned["defaults"]["lr"] for n in ("0.weight", "0.bias", "2.weight", "2.bias")}
    lr |= {g["params"][0]: g["lr"] for g in learned["param_groups"] if "lr" in g}
    values = json.loads((tmp_path / "results.json").read_text())["learned"]["lr"]
    assert len(values) == 5 + 1
    assert lr["0.weight"] == pytest.approx(values[5] * lr["2.weight"], rel=1e-5)
    assert lr["2.bias"] == lr["2.weight"]


def test_the_schedule_figure_draws_the_windows_and_names_the_learned_scales() -> None:
    import matplotlib.pyplot as plt

    from hypergrad import report

    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr([0.05, 0.02, 0.01, 0.5, 2.0])], steps=9)
    lam0 = p.init_raw()
    lam = lam0 + 0.1
    figs = report.figures(p.hyperparams, 9, [], lam0, lam)
    try:
        ax = figs["schedule.png"].axes[0]
        assert ax.get_title().endswith("learned scales first 0.553, last 2.21")
        ys = {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()}["initial"]
        assert ys[0] == pytest.approx(0.05) and ys[8] == pytest.approx(0.01) and len(ys) == 10
    finally:
        for f in figs.values():
            plt.close(f)


def test_the_comparison_s_samplers_draw_from_the_trainer_s_box() -> None:
    """experiments/tuners.py's SearchSpace gives the scales the box the Trainer fills (1/100
    to 100 around their initial values) and bounds them by their own keys, so every contender
    of vs_optuna.py searches the same space."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from tuners import SearchSpace

    p = layered_problem(hg.optim.sgd(lr="lr"), [_lr([0.05, 0.02, 0.01, 0.5, 2.0])], steps=9)
    space = SearchSpace.from_problem(p.hyperparams, {"lr": (1e-3, 0.1)})
    want = {"lr": (1e-3, 0.1), "lr[first]": (0.005, 50.0), "lr[last]": (0.02, 200.0)}
    assert set(space.value_bounds) == set(want)
    for key, pair in want.items():
        assert space.value_bounds[key] == pytest.approx(pair, rel=1e-12)
    trainer = hg.Trainer(p, guards=hg.Guards(bounds=space.value_bounds),
                         callbacks=[hg.run.Log(None)])
    torch.testing.assert_close(trainer.box[0], space.low)
    torch.testing.assert_close(trainer.box[1], space.high)
