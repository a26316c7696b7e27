"""What a run reports (issue 24.3-5): one numbering of outer steps in the log, metrics.jsonl,
results.json and the plots; every value under its name; results.json says which validation loss
is at the learned point and which after the last update; the plots mark the learned point and
the backtracked steps and draw a learned schedule as a step function beside the initial one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib
import pytest
import torch

import hypergrad as hg
from hypergrad import report

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``experiment=cnn_digits debug=fast`` (a schedule of 5 windows, momentum, a weight decay per
    tensor: K = 12; 2 outer steps) through ``hypergrad-run``."""
    out = tmp_path_factory.mktemp("run") / "r"
    proc = subprocess.run([sys.executable, "-m", "hypergrad.cli", "experiment=cnn_digits",
                           "debug=fast", f"hydra.run.dir={out}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout + proc.stderr


def test_outer_steps_are_numbered_one_way_everywhere(run: tuple[Path, str]) -> None:
    folder, text = run
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    res = json.loads((folder / "results.json").read_text())
    n = res["outer_steps"]
    # outer step k evaluates the point after k updates: 0 .. n-1 in metrics, n after the last
    assert [r["outer_step"] for r in records] == list(range(n))
    assert res["last_step"] == n
    by_step = {r["outer_step"]: r["val_loss"] for r in records}
    by_step[n] = res["last_val_loss"]
    assert res["learned_val_loss"] == by_step[res["learned_step"]]
    assert res["learned_val_loss"] == min(by_step.values())
    log = (folder / "cli.log").read_text()
    summary = re.search(r"best \S+ \(outer step (\d+)\), last \S+ \(outer step (\d+)\)", log)
    assert summary and (int(summary[1]), int(summary[2])) == (res["learned_step"], n)
    assert f"learned hyperparameters (outer step {res['learned_step']})" in log
    assert f"last hyperparameters (outer step {n})" in log
    for line in (log + text).splitlines():  # the prefix once per line
        assert line.count("[hypergrad]") <= 1, line


def test_every_value_is_named_and_windows_cover_the_horizon(run: tuple[Path, str]) -> None:
    folder, _ = run
    res = json.loads((folder / "results.json").read_text())
    named, T = res["learned_named"], res["T"]
    windows = [tuple(map(int, m.groups())) for k in named
               if (m := re.fullmatch(r"lr\[steps (\d+)-(\d+)\]", k))]
    assert len(windows) == len(res["learned"]["lr"]) == 5
    assert windows[0][0] == 0 and windows[-1][1] == T - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(windows, windows[1:]))  # contiguous, no overlap
    params = [k[3:-1] for k in named if k.startswith("wd[")]
    assert params == ["1.weight", "1.bias", "3.weight", "3.bias", "6.weight", "6.bias"]
    flat = [v for k, v in named.items() if k.startswith("wd[")]
    assert flat == res["learned"]["wd"] and named["momentum"] == res["learned"]["momentum"]
    assert {"val_curve.png", "hyperparams.png", "schedule.png"} <= {p.name for p in
                                                                     folder.iterdir()}


def _history() -> tuple[hg.HyperParams, list[dict[str, Any]], torch.Tensor, torch.Tensor]:
    hps = hg.HyperParams([hg.Schedule("lr", 0.1, windows=3, transform="log"),
                          hg.Scalar("momentum", 0.5, transform="logit")])
    lams = [hps.init_raw(torch.float64) + 0.1 * k for k in range(4)]
    losses = [1.0, 0.8, 0.9, 0.85]
    hist = [{"outer_step": k, "val_loss": losses[k], "hyperparams": hps.describe(lams[k]),
             "backtracked": k == 2} for k in range(4)]
    return hps, hist, lams[0], lams[1]


def test_the_plots_mark_the_learned_point_the_backtracks_and_the_schedule() -> None:
    import matplotlib.pyplot as plt

    hps, hist, lam0, lam1 = _history()
    last = (4, 0.95, hps.describe(lam1 + 0.5))
    figs = report.figures(hps, 30, hist, lam0, lam1, best_step=1, last=last)
    try:
        assert set(figs) == {"val_curve.png", "hyperparams.png", "schedule.png"}
        lines = {ln.get_label(): ln for ln in figs["val_curve.png"].axes[0].get_lines()}
        star = lines["learned (outer step 1)"]
        assert list(star.get_xdata()) == [1] and list(star.get_ydata()) == [0.8]
        back = lines["backtracked (not used: back to the best point)"]
        assert list(back.get_xdata()) == [2]
        assert list(lines["after the last update"].get_xdata()) == [4]
        assert list(lines["validation loss"].get_xdata()) == [0, 1, 2, 3, 4]
        axes = figs["hyperparams.png"].axes
        assert [ax.get_ylabel() for ax in axes] == ["lr", "momentum"]
        assert {ln.get_label() for ln in axes[0].get_lines()} >= {
            "lr[steps 0-9]", "lr[steps 10-19]", "lr[steps 20-29]"}
        sched = {ln.get_label(): ln for ln in figs["schedule.png"].axes[0].get_lines()}
        assert set(sched) == {"initial", "learned"}
        learned = hps.values(lam1)["lr"]
        ys = list(sched["learned"].get_ydata())
        assert len(ys) == 31 and sched["learned"].get_drawstyle() == "steps-post"
        assert ys[0] == pytest.approx(float(learned[0])) and ys[29] == pytest.approx(
            float(learned[2]))
        assert ys[10] == pytest.approx(float(learned[1]))
    finally:
        for f in figs.values():
            plt.close(f)


def test_the_table_keeps_its_columns_for_a_diverged_runs_losses() -> None:
    """A diverged run's 7.5e55 was printed in fixed point: 60 characters that ran into the next
    column, which then read as part of the same number."""
    text = report.table([{"hyperparameters": "initial", "val_mse": 7.4879e55, "test_mse": 0.5},
                         {"hyperparameters": "learned", "val_mse": 0.25, "test_mse": 0.5}])
    head, first, second = text.splitlines()
    assert len(first) == len(second) == len(head)
    assert first.split() == ["initial", "7.488e+55", "0.5000"]


def test_the_table_shows_small_values_not_zeros() -> None:
    """val_loss 1.23e-5 and test_mse 4.5e-7 were printed as 0.0000 (a regression's retrained
    table, as hypergrad-run logs it, read all zeros)."""
    text = report.table([{"hyperparameters": "learned", "val_loss": 1.23e-5, "test_mse": 4.5e-7,
                          "zero": 0.0, "acc": 0.5}])
    assert text.splitlines()[1].split() == ["learned", "1.23e-05", "4.5e-07", "0.0000", "0.5000"]
