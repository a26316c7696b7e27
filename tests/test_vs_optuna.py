"""experiments/vs_optuna.py's pieces: the search space (the same box for hypergrad's projection
and for the samplers, in raw coordinates), the budget accounting (what finished within the
budget, gradient-equivalents) and the tuners' runs on a tiny problem."""

from __future__ import annotations

import functools
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import hypergrad as hg
from hypergrad.testing import digits_case

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import vs_optuna  # noqa: E402
from tuners import (  # noqa: E402
    LOG_RANGE,
    LOGIT_RANGE,
    Run,
    SearchSpace,
    plain_steps,
    raw_from_values,
    run_optuna,
    run_trainer,
    validation_loss,
)

SMALL = dict(steps=8, n_train=32, batch_size=8, hidden=8, n_val=32)


def _schedule_problem(**kw: Any) -> hg.InnerProblem:
    """An MLP with a 3-window lr schedule (log), a momentum (logit) and per-tensor wd (log):
    the kinds of the digits_schedule preset."""
    from hypergrad.data import MiniBatches
    from hypergrad.tasks import digits_data, mlp

    torch.manual_seed(0)
    data = digits_data(n_train=32, n_val=32, n_test=32)
    model = mlp([64, 8, 10])
    hps = hg.HyperParams([hg.Schedule("lr", 0.02, windows=3, transform="log"),
                          hg.Scalar("momentum", 0.5, transform="logit"),
                          hg.PerTensor("wd", 1e-4, transform="log")])

    def loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    return hg.InnerProblem(
        model, loss, hg.optim.sgd(lr="lr", momentum="momentum", weight_decay="wd"), hps,
        MiniBatches(data.x_train, data.y_train, batch_size=8), kw.get("steps", 8),
        lambda m, hp: torch.nn.functional.cross_entropy(m(data.x_val), data.y_val))


def test_the_box_is_the_presets_bounds_else_a_documented_box_around_init() -> None:
    p = _schedule_problem()
    space = SearchSpace.from_problem(p.hyperparams, {"lr": [1e-4, 3.0]})
    assert space.names == ["lr[0]", "lr[1]", "lr[2]", "momentum",
                           "wd[0]", "wd[1]", "wd[2]", "wd[3]"] and space.dim == 8
    lo, hi = space.low.tolist(), space.high.tolist()
    assert lo[:3] == pytest.approx([math.log(1e-4)] * 3) and hi[:3] == pytest.approx(
        [math.log(3.0)] * 3)  # the preset's bounds, in raw (log) coordinates
    assert (lo[3], hi[3]) == pytest.approx((-LOGIT_RANGE, LOGIT_RANGE))  # logit: fixed range
    assert lo[4:] == pytest.approx([math.log(1e-4) - LOG_RANGE] * 4)  # log: init +- log(100)
    assert hi[4:] == pytest.approx([math.log(1e-4) + LOG_RANGE] * 4)
    assert space.value_bounds["wd"] == pytest.approx((1e-6, 1e-2))
    assert space.value_bounds["lr"] == (1e-4, 3.0)
    assert space.contains(p.init_raw())
    half = SearchSpace.from_problem(p.hyperparams, {"lr": [None, 1.0]})  # one end given
    assert half.value_bounds["lr"] == pytest.approx((2e-4, 1.0))
    with pytest.raises(ValueError, match=r"bounds for \['nope'\]"):
        SearchSpace.from_problem(p.hyperparams, {"nope": [0, 1]})
    with pytest.raises(ValueError, match="need low < high"):
        SearchSpace.from_problem(p.hyperparams, {"lr": [1.0, 0.1]})
    with pytest.raises(ValueError, match="a sampler needs a finite box"):
        SearchSpace.from_problem(p.hyperparams, {"lr": [0.0, 1.0]})


def test_the_trainer_projects_into_the_same_box_the_samplers_draw_from() -> None:
    p = _schedule_problem()
    space = SearchSpace.from_problem(p.hyperparams, {"lr": [1e-4, 3.0]})
    tr = hg.Trainer(p, guards=hg.Guards(bounds=space.value_bounds), callbacks=[hg.run.Log(None)])
    far = torch.tensor([9.0, -20.0, 0.5, 7.0, -30.0, 3.0, -9.0, 0.0])
    with torch.no_grad():
        tr.lam.copy_(far)
    tr.bounds.project(tr.lam)
    assert torch.allclose(tr.lam, space.clamp(far), atol=1e-5)
    assert space.contains(tr.lam) and not space.contains(far)


class _Trial:
    """What SearchSpace.suggest needs of an Optuna trial: ``suggest_float``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float]] = []

    def suggest_float(self, name: str, low: float, high: float) -> float:
        self.calls.append((name, low, high))
        return low + 0.25 * (high - low)


def test_samplers_get_one_uniform_float_per_raw_coordinate() -> None:
    p = _schedule_problem()
    space = SearchSpace.from_problem(p.hyperparams, {"lr": [1e-4, 3.0]})
    trial = _Trial()
    lam = space.suggest(trial, torch.float32)
    assert [c[0] for c in trial.calls] == space.names
    assert [c[1] for c in trial.calls] == space.low.tolist()
    assert lam.dtype == torch.float32 and space.contains(lam)
    start = space.params(torch.full((8,), 50.0))  # enqueued points are projected too
    assert list(start) == space.names and start["momentum"] == pytest.approx(LOGIT_RANGE)


def test_values_map_back_to_raw() -> None:
    p = _schedule_problem()
    lam = torch.tensor([-1.0, -2.0, 0.5, 1.5, -8.0, -9.0, -10.0, -7.0])
    back = raw_from_values(p.hyperparams, p.hyperparams.describe(lam))
    assert torch.allclose(back, lam, atol=1e-5)


def test_the_result_at_a_budget_counts_only_what_finished_in_time() -> None:
    run = Run("x", 0, budget=10.0)
    for t, v in [(1.0, 0.5), (4.0, 0.3), (9.5, 0.4), (10.5, 0.1)]:
        run.add(t, v, torch.zeros(2))
    run.add(11.0, math.nan, torch.zeros(2))
    assert run.within() == [0, 1, 2]
    assert run.best() == (0.3, 1) and run.best(11.0) == (0.1, 3)
    assert run.best(0.5) == (math.inf, -1)
    assert run.losses[-1] == math.inf  # a diverged evaluation ranks last
    assert run.curve([0.0, 1.0, 5.0, 10.0, 12.0]) == [math.inf, 0.5, 0.3, 0.3, 0.1]
    # gradient-equivalents: plain steps; a hypergradient counts as `ratio` plain runs
    run.info["hypergradients"] = [0, 1]
    assert plain_steps(run, steps=100, ratio=6.0) == 100 * (6 + 6 + 1)
    assert plain_steps(run, steps=100, ratio=6.0, budget=12.0) == 100 * (6 + 6 + 1 + 1 + 1)


def test_optuna_runs_in_the_box_from_the_initial_point_within_the_budget() -> None:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    p = digits_case("momentum", "schedule", **SMALL)
    space = SearchSpace.from_problem(p.hyperparams, {"lr": [1e-3, 1.0]})
    run = run_optuna(p, space, 2.0, optuna.samplers.TPESampler(seed=0), "tpe", 0,
                     start=p.init_raw())
    assert len(run.times) >= 2 and run.times == sorted(run.times)
    assert torch.allclose(run.lams[0], space.clamp(p.init_raw()))  # enqueued first
    assert run.losses[0] == pytest.approx(validation_loss(p, run.lams[0]))
    assert all(space.contains(lam) for lam in run.lams)
    assert len(run.within()) >= len(run.times) - 1  # at most one trial ends past the budget


def test_the_trainer_run_is_its_outer_steps_and_its_last_point() -> None:
    p = digits_case("momentum", "schedule", **SMALL)
    space = SearchSpace.from_problem(p.hyperparams, {"lr": [1e-3, 0.2]})
    tr = hg.Trainer(p, outer=functools.partial(hg.SignDescent, lr=0.5),
                    mode=hg.Offline(outer_steps=4),
                    guards=hg.Guards(bounds=space.value_bounds, time_budget=60.0),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    run = run_trainer(tr, space, "hypergrad", 0, 60.0)
    assert run.info["outer_steps"] == 4 and len(run.times) == 5  # + the point after the last
    assert run.info["hypergradients"] == [0, 1, 2, 3]
    assert run.times == sorted(run.times)
    assert run.losses[-1] == pytest.approx(validation_loss(p, run.lams[-1]), rel=1e-5)
    assert run.losses[1] == pytest.approx(validation_loss(p, run.lams[1]), rel=1e-4)


def test_the_trainer_run_answers_with_the_point_the_trainer_returned() -> None:
    """With the defaults the Trainer re-checks its best points in another batch order and may
    return one other than the lowest of one run: the comparison judges that one."""
    p = _schedule_problem(steps=8)
    space = SearchSpace.from_problem(p.hyperparams, {"lr": [1e-3, 0.2]})
    tr = hg.Trainer(p, mode=hg.Offline(outer_steps=3, start=4, recheck=4),
                    guards=hg.Guards(bounds=space.value_bounds, time_budget=60.0),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    run = run_trainer(tr, space, "hypergrad", 0, 60.0)
    assert run.returned is not None and len(run.info["rechecked"]) == 4
    val, idx = run.chosen()
    means = [a + b for a, b in run.info["rechecked"]]
    assert val == pytest.approx(run.info["rechecked"][means.index(min(means))][0], rel=1e-6)
    assert run.chosen() != run.best() or min(means) == means[0]
    run.seconds = run.budget * 2  # decided after the budget: the best within it instead
    assert run.chosen() == run.best()


def test_the_paired_comparison_is_seed_by_seed() -> None:
    """log(test a / test b) per tuning seed: a tuner lower at every seed by a factor that
    varies has a negative mean with a standard error; a seed b lacks is left out."""
    def runs(losses: dict[int, float]) -> dict[str, Any]:
        return {"seeds": [{"seed": s, "test_loss": v} for s, v in losses.items()]}

    results = {"p": {"tuners": {"hypergrad": runs({0: 0.5, 1: 0.8, 2: 1.0, 3: 0.1}),
                                "tpe": runs({0: 1.0, 1: 1.0, 2: 1.25})}}}
    r = vs_optuna.paired(results, "p", "hypergrad", "tpe")
    d = [math.log(0.5), math.log(0.8), math.log(0.8)]
    assert r is not None and r["seeds"] == 3 and (r["lower"], r["higher"]) == (3, 0)
    assert r["log_ratio"] == pytest.approx(sum(d) / 3)
    assert r["se"] == pytest.approx(statistics.stdev(d) / math.sqrt(3))
    assert vs_optuna.paired(results, "p", "hypergrad", "ablation") is None  # not run
    table = vs_optuna.paired_table({"eval_paired": {"p": {"vs_tpe": r, "vs_ablation": None}}})
    assert "*  3/0" in table.splitlines()[-1]  # |mean| > 2 se: marked


def test_runs_of_another_size_are_not_joined_and_bad_arguments_are_named() -> None:
    """--join of two --quick pieces wrote vs_optuna_suite.json, the committed result's name,
    labelled "quick": false; --seeds 0 gave an IndexError, --retrain-seeds 0 one after all
    the tuning, --budget-scale -1 a Hydra error naming time_budget (the experiment scripts
    probe, 2026-12-07)."""
    import subprocess

    with pytest.raises(SystemExit, match=r"--join a.json: a --quick run's, and this run is "
                                         r"full: combine runs of one size"):
        vs_optuna._same_size("--join", "a.json", {"quick": True}, False)
    vs_optuna._same_size("--merge", "b.json", {}, False)  # written before it said: full
    for args, said in ((["--seeds", "0"], "--seeds 0: must be an int >= 1"),
                       (["--retrain-seeds", "0"], "--retrain-seeds 0: must be an int >= 1"),
                       (["--budget-scale", "-1"], "--budget-scale -1.0: must be a finite "
                                                  "number > 0")):
        got = subprocess.run([sys.executable, str(ROOT / "experiments" / "vs_optuna.py"),
                              *args], capture_output=True, text=True, timeout=300)
        assert got.returncode == 2 and said in got.stderr, got.stderr[-2000:]
