"""Bounds on one entry of a hyperparameter (``Guards(bounds={"lr[0]": ...})``): a schedule's
window, a PerGroup's group, a PerTensor's parameter, by index or by name, in place of the
hyperparameter's own pair."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fixtures import CONFIGS_PAGE, run_cli
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.errors import BoundsWarning
from hypergrad.run.bounds import Bounds
from hypergrad.run.outer import search_box


def _problem(*items: hg.HyperParameter, wd: str = "wd") -> hg.InnerProblem:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (48,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           hg.optim.sgd(lr="lr", momentum=0.5, weight_decay=wd),
                           hg.HyperParams(list(items)), MiniBatches(x, y, batch_size=12, seed=0),
                           12, lambda m, hp: F.cross_entropy(m(x), y))


GROUPS = {"first": r"^0\.weight$", "rest": r"weight$"}


def _fit(p: hg.InnerProblem, bounds: dict[str, Any], steps: int = 3) -> dict[str, Any]:
    res = hg.Trainer(p, mode=hg.Offline(outer_steps=steps), guards=hg.Guards(bounds=bounds),
                     callbacks=[hg.run.Log(None)]).fit()
    return p.hyperparams.describe(res.lam)


def test_a_group_held_while_the_other_is_tuned() -> None:
    p = _problem(hg.Scalar("lr", 0.3, "log"),
                 hg.PerGroup("wd", 0.05, "log", groups=GROUPS, default=0.0))
    values = _fit(p, {"wd": (1e-4, 0.1), "wd[first]": (0.05, 0.05)})
    assert values["wd"][0] == pytest.approx(0.05, rel=1e-12)
    assert values["wd"][1] != pytest.approx(0.05, rel=1e-6) and 1e-4 <= values["wd"][1] <= 0.1


def test_a_schedule_window_by_index_and_a_tensor_by_name() -> None:
    """A warm-up window capped below the rest; one parameter's decay held; initial values
    outside an entry's bounds are moved onto them, and the warning names the key."""
    p = _problem(hg.Schedule("lr", 0.3, "log", windows=3),
                 hg.PerTensor("wd", 1e-3, "log"))
    with pytest.warns(BoundsWarning, match=r"lr=\[0.3, 0.3, 0.3\] -> \[0.0(1|09+)\d*, 0.3, 0.3\] "
                                           r"\(bounds \{'lr\[0\]': \[None, 0.0(1|09+)\d*\]\}\)"):
        values = _fit(p, {"lr[0]": (None, 0.01), "wd[2.bias]": (1e-3, 1e-3)})
    assert values["lr"][0] <= 0.01 + 1e-15 and max(values["lr"][1:]) > 0.01
    assert values["wd"][3] == pytest.approx(1e-3, rel=1e-12)  # 2.bias, the fourth tensor


def test_an_entry_moved_onto_its_own_bounds_leaves_the_others_default_range() -> None:
    """The default range of a hyperparameter's unbounded entries spans their own initial
    values: the start of an entry with bounds of its own, moved onto them, is not among them
    (wd[3] in [0.05, 0.06] made the other entries' box reach 5.0 instead of 0.1)."""
    p = _problem(hg.Scalar("lr", 0.3, "log"), hg.PerTensor("wd", 1e-3, "log"))
    with pytest.warns(BoundsWarning, match=r"moved onto the bounds: wd="):
        trainer = hg.Trainer(p, guards=hg.Guards(bounds={"wd[3]": (0.05, 0.06)}),
                             callbacks=[hg.run.Log(None)])
    sl = p.hyperparams.slices["wd"]
    box = torch.exp(torch.stack([trainer.box[0][sl], trainer.box[1][sl]], 1))
    torch.testing.assert_close(box, torch.tensor([[1e-5, 0.1]] * 3 + [[0.05, 0.06]],
                                                 dtype=torch.float64))
    # one side of its own: the entry's other side is filled past its bound as before
    one = Bounds(p.hyperparams, torch.float64, {"wd[0]": (0.05, None)})
    lam = p.init_raw()
    one.project(lam)
    lo, hi = search_box(p.hyperparams, one, lam)
    assert torch.exp(hi[sl][1:]).tolist() == pytest.approx([0.1] * 3)
    assert float(torch.exp(hi[sl][0])) == pytest.approx(5.0)  # its bound * 100


def test_an_entry_pair_replaces_the_hyperparameter_pair_in_the_box_and_the_projection() -> None:
    p = _problem(hg.Schedule("lr", 0.1, "log", windows=3), hg.Scalar("wd", 1e-3, "log"))
    hps = p.hyperparams
    b = Bounds(hps, torch.float64, {"lr": (1e-3, 1.0), "lr[1]": (0.5, 2.0)})
    lam = p.init_raw().clone()
    b.project(lam)
    assert hps.describe(lam)["lr"] == pytest.approx([0.1, 0.5, 0.1], rel=1e-12)
    lo, hi = search_box(hps, b, p.init_raw())
    got = torch.exp(torch.stack([lo[:3], hi[:3]], 1))
    torch.testing.assert_close(got, torch.tensor([[1e-3, 1.0], [0.5, 2.0], [1e-3, 1.0]],
                                                 dtype=torch.float64))
    # the same box as a mapping of whole hyperparameters for the pairs the entries do not set
    lo2, hi2 = search_box(hps, {"lr": b.raw["lr"]}, p.init_raw())
    assert torch.equal(lo2[[0, 2, 3]], lo[[0, 2, 3]]) and torch.equal(hi2[[0, 2, 3]],
                                                                     hi[[0, 2, 3]])
    assert b.values() == {"lr": [pytest.approx(1e-3), pytest.approx(1.0)],
                          "lr[1]": [pytest.approx(0.5), pytest.approx(2.0)]}
    # inside the entry's pair but outside the hyperparameter's: kept (the projection clamped to
    # both, holding lr[1] at 1.0 where the box reached 2.0, and a warm-up window at the pair's
    # floor)
    lam[hps.slices["lr"]] = torch.log(torch.tensor([2e-4, 1.5, 3.0], dtype=torch.float64))
    b.project(lam)
    assert hps.describe(lam)["lr"] == pytest.approx([1e-3, 1.5, 1.0], rel=1e-12)
    low = Bounds(hps, torch.float64, {"lr": (1e-2, 1.0), "lr[0]": (1e-4, 0.05)})
    lam[hps.slices["lr"]] = torch.log(torch.tensor([2e-4, 1e-3, 0.5], dtype=torch.float64))
    low.project(lam)
    assert hps.describe(lam)["lr"] == pytest.approx([2e-4, 1e-2, 0.5], rel=1e-12)


def test_overlapping_entry_keys_are_refused_and_each_key_reports_its_own_pair() -> None:
    """``"wd[first]"`` and ``"wd[0]"`` bound the same entry: the later key's pair applied
    while the fingerprint listed both, as if both did; now refused, naming both keys (the
    bounds probe, 2026-12-07). The fingerprint shows each key with the pair it was given."""
    p = _problem(hg.Scalar("lr", 0.3, "log"),
                 hg.PerGroup("wd", 0.05, "log", groups=GROUPS, default=0.0))
    with pytest.raises(ValueError, match=r"bounds\['wd\[first\]'\] and bounds\['wd\[0\]'\] "
                                         r"name the same entries"):
        Bounds(p.hyperparams, torch.float64, {"wd[first]": (1e-4, 0.1), "wd[0]": (0.01, 0.02)})
    b = Bounds(p.hyperparams, torch.float64, {"wd[first]": (1e-4, 0.1), "wd[1]": (0.01, 0.02)})
    assert b.values() == {"wd[first]": [pytest.approx(1e-4), pytest.approx(0.1)],
                          "wd[1]": [pytest.approx(0.01), pytest.approx(0.02)]}
    lam = p.init_raw().clone()
    b.project(lam)
    assert p.hyperparams.describe(lam)["wd"][1] == pytest.approx(0.02, rel=1e-12)


def test_the_run_fingerprint_holds_entry_bounds() -> None:
    p = _problem(hg.Scalar("lr", 0.3, "log"),
                 hg.PerGroup("wd", 0.05, "log", groups=GROUPS, default=0.0))
    t = hg.Trainer(p, guards=hg.Guards(bounds={"wd[rest]": (1e-4, 0.1)}))
    assert t.settings()["trainer.bounds"] == {"wd[rest]": [pytest.approx(1e-4),
                                                           pytest.approx(0.1)]}


@pytest.mark.parametrize(("bounds", "match"), [
    ({"wd[middle]": (0.0, 1.0)}, r"bounds name 'wd\[middle\]': 'wd' has no entry 'middle'; "
                                 r"its entries are the indices 0-1 or one of \['first', "
                                 r"'rest'\]"),
    ({"wd[2]": (0.0, 1.0)}, r"'wd' has no entry '2'"),
    ({"mom[0]": (0.0, 1.0)}, r"bounds name 'mom\[0\]' is not a hyperparameter; defined are "
                             r"\['lr', 'wd'\] \(one entry of one: 'name\[index\]'"),
    ({"wd": [(1e-3, 0.1), (1e-4, 1e-2)]}, r"bound one entry with its own key, e.g. "
                                          r"'wd\[0\]': \(low, high\)"),
])
def test_bad_entry_bounds_are_named(bounds: dict[str, Any], match: str) -> None:
    p = _problem(hg.Scalar("lr", 0.3, "log"),
                 hg.PerGroup("wd", 0.05, "log", groups=GROUPS, default=0.0))
    with warnings.catch_warnings(), pytest.raises(ValueError, match=match):
        hg.Trainer(p, guards=hg.Guards(bounds=bounds))


def test_the_configs_page_entry_bound_runs(tmp_path: Path) -> None:
    """docs/configs.md's command bounding one schedule window through Hydra (``++`` and the
    brackets escaped): the first window starts at and keeps its own upper bound."""
    import json

    line = next(ln for ln in CONFIGS_PAGE.read_text().splitlines()
                if "one window's own bound" in ln)
    run_cli(line.split("  #")[0], tmp_path)
    lr = json.loads((tmp_path / "results.json").read_text())["learned"]["lr"]
    assert lr[0] <= 0.05 * (1 + 1e-6) and max(lr[1:]) > 0.05


def test_tensor_and_numpy_ends_are_numbers() -> None:
    """A 0-d tensor end was refused with a garbled hint about per-entry keys; a NumPy pair was
    'must be (low, high)'."""
    import numpy as np

    p = _problem(hg.Scalar("lr", 0.1, "log"), hg.Scalar("wd", 1e-3, "log"))
    want = Bounds(p.hyperparams, torch.float64, {"lr": (0.01, 1.0)}).raw["lr"]
    for given in ((torch.tensor(0.01), 1.0), np.array([0.01, 1.0]), torch.tensor([0.01, 1.0]),
                  (np.float32(0.01), np.int64(1))):
        got = Bounds(p.hyperparams, torch.float64, {"lr": given}).raw["lr"]
        assert all(a is not None and b is not None and float(a) == pytest.approx(float(b))
                   for a, b in zip(got, want)), given
    with pytest.raises(ValueError, match=r"bounds\['lr'\]=\[\[0.01, 0.02\], 1.0\] has "
                                         r"\[0.01, 0.02\].*own key, e.g. 'lr\[0\]': "):
        Bounds(p.hyperparams, torch.float64, {"lr": ([0.01, 0.02], 1.0)})


def test_an_entry_end_none_keeps_the_hyperparameter_end() -> None:
    """``{"lr": (1e-3, 1), "lr[0]": (None, 0.05)}`` caps window 0 and keeps its floor of 1e-3
    (the None dropped it: the box filled that side around the initial value, down to 5e-4),
    as the configs page's example reads; a kept end that leaves nothing between is named."""
    p = _problem(hg.Schedule("lr", 0.05, "log", windows=3), hg.Scalar("wd", 1e-3, "log"))
    hps = p.hyperparams
    b = Bounds(hps, torch.float64, {"lr": (1e-3, 1.0), "lr[0]": (None, 0.05),
                                    "lr[1]": (0.01, None)})
    lo, hi = search_box(hps, b, p.init_raw())
    got = torch.exp(torch.stack([lo[:3], hi[:3]], 1))
    torch.testing.assert_close(got, torch.tensor([[1e-3, 0.05], [0.01, 1.0], [1e-3, 1.0]],
                                                 dtype=torch.float64))
    lam = p.init_raw().clone()
    lam[hps.slices["lr"]] = torch.tensor([-30.0, 30.0, 0.0], dtype=torch.float64)
    b.project(lam)
    assert hps.describe(lam)["lr"] == pytest.approx([1e-3, 1.0, 1.0], rel=1e-12)
    assert b.values()["lr[0]"] == [None, pytest.approx(0.05)]  # as given, for the fingerprint
    with pytest.raises(ValueError, match=r"bounds\['lr\[0\]'\]=\(None, 0.0001\) keeps the low "
                                         r"end of bounds\['lr'\]=\(0.001, 1\).*give both ends"):
        Bounds(hps, torch.float64, {"lr": (1e-3, 1.0), "lr[0]": (None, 1e-4)})


def test_entries_bound_by_the_names_the_outputs_give_them() -> None:
    """results.json's learned_named and the log name a schedule's window by its steps and an
    array's entry by its indices; bounds took only the flat index ('lr[steps 3-5]' and
    'l2[1, 2]' were refused)."""
    hps = hg.HyperParams([hg.Schedule("lr", 0.3, "log", windows=3),
                          hg.Array("l2", 1e-3, shape=(2, 3))])
    named = list(hps.named(hps.values(hps.init_raw(torch.float64)), 12))
    assert named[:3] == ["lr[steps 0-3]", "lr[steps 4-7]", "lr[steps 8-11]"]
    by_name = Bounds(hps, torch.float64, {"lr[steps 4-7]": (0.01, 0.02), "l2[1, 2]": (0.5, 1)},
                     horizon=12)
    by_index = Bounds(hps, torch.float64, {"lr[1]": (0.01, 0.02), "l2[5]": (0.5, 1)})
    assert by_name.entries == by_index.entries
    with pytest.raises(ValueError, match=r"has no entry 'steps 4-7'"):
        Bounds(hps, torch.float64, {"lr[steps 4-7]": (0.01, 0.02)})  # no horizon: no steps
    with pytest.raises(ValueError, match=r"has no entry '2, 0'"):
        Bounds(hps, torch.float64, {"l2[2, 0]": (0.5, 1)})
    p = _problem(hg.Schedule("lr", 0.3, "log", windows=3), hg.Scalar("wd", 1e-3, "log"))
    with pytest.warns(BoundsWarning, match=r"moved onto the bounds: lr="):
        values = _fit(p, {"lr[steps 4-7]": (0.01, 0.02)}, steps=1)
    assert 0.01 - 1e-12 <= values["lr"][1] <= 0.02 + 1e-12


def test_one_entry_named_twice_is_refused() -> None:
    """'wd[0]' and 'wd[0.weight]' (or 'lr[0]' and 'lr[steps 0-4]') name one entry: the later
    pair won without a word, and the fingerprint listed both (the bounds probe, 2026-12-07)."""
    hps = hg.HyperParams([hg.PerTensor("wd", 1e-3, "log", params=["0.weight", "0.bias"]),
                          hg.Schedule("lr", 0.1, windows=4, transform="log")])
    with pytest.raises(ValueError, match=r"bounds\['wd\[0\]'\] and bounds\['wd\[0.weight\]'\] "
                                         r"name the same entries of 'wd'; give one of them"):
        Bounds(hps, torch.float64, {"wd[0]": (1e-4, 1e-3), "wd[0.weight]": (1e-2, 1e-1)})
    with pytest.raises(ValueError, match=r"name the same entries of 'lr'"):
        Bounds(hps, torch.float64, {"lr[0]": (1e-3, 1.0), "lr[steps 0-4]": (1e-2, 1.0)},
               horizon=20)
    Bounds(hps, torch.float64, {"wd": (1e-4, 1e-1), "wd[0]": (1e-3, 1e-2)})  # a refinement


@pytest.mark.parametrize("transform", ["log", "logit", "identity"])
def test_a_value_moved_onto_a_bound_lies_inside_it(transform: str) -> None:
    """The round trip value -> raw -> value landed a rounding step outside: a logit bound of
    0.45 held values at 0.44999999999999996, 0.9 at 0.8999999999999999, and a user's
    assert v >= low failed (the bounds probe, 2026-12-07)."""
    hps = hg.HyperParams([hg.Scalar("m", 0.5, transform)])
    for low, high in [(0.45, 0.9), (0.15, 0.95), (0.3, 0.85), (0.06, 0.55)]:
        b = Bounds(hps, torch.float64, {"m": (low, high)})
        for start in (-30.0, 30.0):  # far below and far above, in raw coordinates
            lam = torch.tensor([start], dtype=torch.float64)
            b.project(lam)
            assert low <= hps.describe(lam)["m"] <= high


def test_a_box_of_one_point_is_refused_and_bounds_outside_a_domain_are_said_at_once() -> None:
    """(the bounds probe, 2026-12-07) Every hyperparameter held by low == high: the default
    search spent its whole budget at that point, restarting 'at a quasi-random point' 12
    times. An identity learning rate bounded to (-1, 1), below sgd's lr >= 0: said only when
    a step reached the edge."""
    p = _problem(hg.Scalar("lr", 0.3, "log"), hg.Scalar("wd", 0.01, "log"))
    with pytest.raises(ValueError, match=r"holds every hyperparameter at one value \(low == "
                                         r"high\): there is nothing to tune"):
        hg.Trainer(p, guards=hg.Guards(bounds={"lr": (0.3, 0.3), "wd": (0.01, 0.01)}),
                   callbacks=[hg.run.Log(None)])
    hg.Trainer(p, guards=hg.Guards(bounds={"lr": (0.3, 0.3)}), callbacks=[hg.run.Log(None)])
    q = _problem(hg.Scalar("lr", 0.3, "identity"), hg.Scalar("wd", 0.01, "log"))
    with pytest.warns(BoundsWarning, match=r"Guards\(bounds=\{'lr': \[-1.0, 1.0\]\}\) reaches "
                                           r"outside the domain of sgd's lr"):
        hg.Trainer(q, guards=hg.Guards(bounds={"lr": (-1.0, 1.0)}),
                   callbacks=[hg.run.Log(None)])
