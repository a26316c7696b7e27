"""experiments/suite.py: the problems build as stated (K, a box for every hyperparameter, the
initial point inside it, finite losses), and the committed dev / eval split is the one its seed
draws, with the committed hash."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import suite  # noqa: E402

from hypergrad.errors import HypergradWarning  # noqa: E402
from hypergrad.hyperparams import TRANSFORMS  # noqa: E402


def test_the_split_is_the_one_its_seed_draws_and_its_hash_is_committed() -> None:
    assert suite.make_split(suite.SPLIT_SEED) == suite.SPLIT
    assert suite.split_hash(suite.SPLIT) == suite.SPLIT_HASH
    dev, ev = set(suite.SPLIT["dev"]), set(suite.SPLIT["eval"])
    assert not dev & ev and dev | ev == set(suite.PROBLEMS)
    assert len(suite.PROBLEMS) >= 12 and len(ev) >= 6
    low = [n for n in ev if suite.PROBLEMS[n].K <= suite.LOW_K]
    assert 2 * len(low) >= len(ev)  # at least half of the evaluation problems with K <= 15
    ks = [p.K for p in suite.PROBLEMS.values()]
    assert min(ks) == 2 and max(ks) >= 200
    assert {p.task for p in suite.PROBLEMS.values()} == {"classification", "regression"}


@pytest.mark.parametrize("name", list(suite.PROBLEMS))
def test_every_problem_builds_with_its_box_and_a_finite_loss(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypergradWarning)
        task = suite.build(name, 0)
    p = task.problem
    assert p.num_hyperparams == suite.PROBLEMS[name].K and p.steps <= 200
    assert set(task.bounds) == set(p.hyperparams.names)
    lam = p.init_raw()
    for item in p.hyperparams.items:  # the initial point lies inside the box
        lo, hi = task.bounds[item.name]
        v = TRANSFORMS[item.transform][0](lam[p.hyperparams.slices[item.name]])
        assert bool((v >= lo * (1 - 1e-6)).all() and (v <= hi * (1 + 1e-6)).all()), item.name
    state = p.run(lam)
    val = float(p.objective(state.params, state.buffers, lam))
    test = task.test(state)
    assert torch.isfinite(torch.tensor([val, test["test_loss"]])).all()


@pytest.mark.parametrize("name", ["wine_adam_small_batch", "diabetes_momentum"])
def test_the_trainer_gets_the_validation_split_cut_in_two_and_the_others_all_of_it(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """build(select=True) with SELECT_SHARE > 0 (--variants select_50): val_loss on one part
    of the validation split, select_loss on the held-out rest (stratified for a classifier);
    their sizes weighted, the two losses give the whole split's loss, which build() without
    select evaluates. With the committed SELECT_SHARE = 0, the Trainer gets the whole split."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypergradWarning)
        assert suite.build(name, 0, select=True).problem.select_loss is None
        monkeypatch.setattr(suite, "SELECT_SHARE", 0.5)
        whole, cut = suite.build(name, 0), suite.build(name, 0, select=True)
    assert whole.problem.select_loss is None and cut.problem.select_loss is not None
    lam = whole.problem.init_raw()
    with torch.no_grad():
        s = whole.problem.run(lam)
        full = float(whole.problem.objective(s.params, s.buffers, lam))
        fit = float(cut.problem.objective(s.params, s.buffers, lam))
        held = float(cut.problem.select(s.params, s.buffers, lam))
    assert fit != held
    # the whole split's mean loss is the parts' means weighted by their rows: the held-out
    # part's weight is its share (up to the rounding of a stratified split's rows)
    held_weight = (full - fit) / (held - fit)
    assert held_weight == pytest.approx(suite.SELECT_SHARE, abs=0.03)


def test_vs_optuna_suite_quick_writes_the_summary_and_the_last_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``vs_optuna.py --suite --quick`` on its 2 problems with budgets of 20 plain runs (room
    for the start and one hypergradient): every contender runs (hypergrad's defaults, the
    ablation, TPE, TPE + Hyperband, random, CMA-ES), the JSON holds the summary the issue asks
    for, and the last line says it."""
    import json

    import vs_optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's experimental and deprecation warnings
        payload = vs_optuna.suite_main(["--suite", "--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads((tmp_path / "vs_optuna_suite_quick.json").read_text())["summary"]
    assert summary == json.loads(json.dumps(payload["summary"]))
    assert set(summary) >= {"problems", "seeds", "dev_win_rate", "eval_win_rate",
                            "eval_worst_ratio", "ablation_win_rate"}
    assert summary["problems"] == 2 and summary["seeds"] == 1
    for half in ("dev", "eval"):  # seed by seed: one seed, so no standard error
        for r in (summary.get(f"{half}_paired") or {}).values():
            assert r["vs_tpe"]["seeds"] == 1 and r["vs_tpe"]["se"] is None
            assert r["vs_tpe"]["lower"] + r["vs_tpe"]["higher"] <= 1
    assert out[-1].startswith("vs_optuna_suite eval_win_rate=") and "problems=2 seeds=1" in out[-1]
    for name in vs_optuna.QUICK_PROBLEMS:
        tuners = payload["problems"][name]["tuners"]
        assert set(tuners) == set(vs_optuna.SUITE_TUNERS)
        for tr in tuners.values():
            run = tr["seeds"][0]
            assert run["evals"] >= 1 and math.isfinite(run["test_loss"])
            assert len(run["anytime_test"]) == len(vs_optuna.CHECKPOINTS)
        assert tuners["hypergrad"]["seeds"][0]["hypergradients"] >= 1
        # what a hypergradient costs in the budget's units: more than a plain run
        assert payload["problems"][name]["hypergradient_plain_runs"] > 1
    assert (tmp_path / "vs_optuna_suite_dev.png").exists()
    assert (tmp_path / "vs_optuna_suite_eval.png").exists()

    # --join: a run of other seeds (here the same records moved to seed 1, losses doubled)
    # joins seed by seed, the statistics recomputed over both
    first = tmp_path / "vs_optuna_suite_quick.json"
    other = json.loads(first.read_text())
    for prob in other["problems"].values():
        prob["budget_s"] *= 1.3  # measured on a busier machine: --join says so
        for tr in prob["tuners"].values():
            for run in tr["seeds"]:
                run["seed"] += 1
                run["test_loss"] *= 2
    second = tmp_path / "seed1.json"
    second.write_text(json.dumps(other))
    common = ["--suite", "--half", "none", "--retrain-seeds", "1", "--out", str(tmp_path / "j")]
    # the budget rule is the runs' (20 plain runs), checked: the joined table was labelled
    # with this command line's default of 30
    with pytest.raises(SystemExit, match=r"its budget is 20 plain runs, this run's 30 "
                                         r"\(--plain-runs\)"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vs_optuna.suite_main([*common, "--seeds", "2", "--join", str(first), str(second)])
    common += ["--plain-runs", "20"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joined = vs_optuna.suite_main([*common, "--seeds", "2", "--join", str(first),
                                       str(second)])
    assert joined["summary"]["seeds"] == 2 and joined["summary"]["problems"] == 2
    assert joined["summary"]["max_budget_spread"] == pytest.approx(1.3)
    assert "(1.30x apart, over 1.15x): the machine's load differed" in capsys.readouterr().out
    # the joined --quick pieces make a --quick result, named so: they were written under the
    # committed result's name, labelled "quick": false (the experiment scripts probe)
    assert not (tmp_path / "j" / "vs_optuna_suite.json").exists()
    written = json.loads((tmp_path / "j" / "vs_optuna_suite_quick.json").read_text())
    assert written["protocol"]["plain_runs"] == 20 and written["protocol"]["quick"] is True
    for name in vs_optuna.QUICK_PROBLEMS:
        for t, tr in joined["problems"][name]["tuners"].items():
            assert [r["seed"] for r in tr["seeds"]] == [0, 1]
            one = payload["problems"][name]["tuners"][t]["seeds"][0]["test_loss"]
            assert tr["test_loss"]["mean"] == pytest.approx(1.5 * one)
    for argv, said in (([*common, "--seeds", "1", "--join", str(first), str(second)],
                        r"are not \[0\]"),
                       ([*common, "--seeds", "-1", "--join", str(first)],
                        r"--seeds -1 must be >= 1"),
                       ([*common, "--seeds", "2", "--out", str(first), "--join", str(first),
                         str(second)], r"--out .* is a file; give a folder"),
                       ([*common, "--seeds", "2", "--join", str(first), str(first)],
                        r"are not \[0, 1\]"),
                       ([*common, "--seeds", "2", "--join", str(second), str(tmp_path
                         / "j" / "vs_optuna_suite_quick.json")], "in both")):
        with pytest.raises(SystemExit, match=said), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vs_optuna.suite_main(argv)

    # --replace: runs of hypergrad alone over the joined seeds (losses here a third of the
    # joined ones) replace its column; the other contenders' and the statistics follow
    alone = json.loads(first.read_text())
    moved = json.loads(second.read_text())
    for run in (alone, moved):
        for prob in run["problems"].values():
            prob["tuners"] = {"hypergrad": prob["tuners"]["hypergrad"]}
            for rec in prob["tuners"]["hypergrad"]["seeds"]:
                rec["test_loss"] /= 3
    (tmp_path / "alone0.json").write_text(json.dumps(alone))
    (tmp_path / "alone1.json").write_text(json.dumps(moved))
    join = ["--seeds", "2", "--join", str(first), str(second)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        replaced = vs_optuna.suite_main([*common, *join, "--replace", str(tmp_path / "alone0.json"),
                                         str(tmp_path / "alone1.json")])
    for name in vs_optuna.QUICK_PROBLEMS:
        got, was = replaced["problems"][name], joined["problems"][name]
        assert got["replaced"] == ["hypergrad"]
        assert got["tuners"]["hypergrad"]["test_loss"]["mean"] == pytest.approx(
            was["tuners"]["hypergrad"]["test_loss"]["mean"] / 3)
        # as JSON text: an anytime curve's NaN (no evaluation yet at a checkpoint, which a slow
        # run can give) is not equal to itself as a float
        assert json.dumps(got["tuners"]["tpe"], sort_keys=True) == json.dumps(
            was["tuners"]["tpe"], sort_keys=True)
        vs = replaced["summary"]
        assert vs["problems"] == 2
    full = tmp_path / "full.json"  # a full run's piece beside the --quick ones
    full.write_text(json.dumps({**moved, "protocol": {**moved["protocol"], "quick": False}}))
    for argv, said in (([*common, "--seeds", "2", "--join", str(first), str(second), "--replace",
                         str(tmp_path / "alone0.json")], r"covers tuning seeds \[0\], the joined"),
                       ([*common, *join, "--replace", str(full)], r"--replace .*full.json: a "
                                                                  r"full run's, and this run is "
                                                                  r"--quick"),
                       ([*common, "--seeds", "2", "--join", str(first), str(full)],
                        r"--join: runs of two sizes"),
                       ([*common, "--seeds", "1", "--replace", str(first)], "give the runs to "
                                                                            "join too")):
        with pytest.raises(SystemExit, match=said), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vs_optuna.suite_main(argv)


@pytest.mark.parametrize("tuner", ["hypergrad", "ablation"])
def test_recheck_pick_scores_every_rule_on_the_same_candidates(
        tuner: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``experiments/recheck_pick.py --quick`` (``--tuner``: the defaults, or their zeroth-order
    ablation): one search, every re-checked point retrained, each rule's choice the candidate
    with its lowest score (``worse``: the worse of both orders; ``mean``; ``hindsight``: the
    lowest test loss, never above any rule's); the run's own choice is the default rule's; the
    last line says the ratio."""
    import json

    import recheck_pick

    payload = recheck_pick.main(["--quick", "--tuner", tuner, "--out", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(payload))
    (rec,) = payload["records"]
    assert rec["tuner"] == payload["protocol"]["tuner"] == tuner
    cs = rec["candidates"]
    assert len(cs) >= 2 and sum(c["returned"] for c in cs) == 1
    got = recheck_pick.picks(rec)
    assert got["worse"] == min(cs, key=lambda c: max(c["val"], c["variant"]))["test"]
    assert got["mean"] == min(cs, key=lambda c: c["val"] + c["variant"])["test"]
    assert got["hindsight"] == min(c["test"] for c in cs) <= min(got.values())
    assert next(c for c in cs if c["returned"])["test"] == got["worse"]  # the Trainer's rule
    line = capsys.readouterr().out.strip().splitlines()[-1]
    ratio = got["worse"] / got["mean"]
    which = "" if tuner == "hypergrad" else " tuner=ablation"
    assert line == (f"recheck_pick half=dev{which} worse_vs_mean={ratio:.4f} worst={ratio:.4f} "
                    f"changed={int(got['worse'] != got['mean'])}/1")


def test_suite_points_describes_each_returned_point(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``suite_points.py --quick``: one seed, both contenders; each run's point is described
    in the problem's units (the 5 windows of the schedule, the momentum, a decay per tensor),
    tested at the 3 retraining seeds, and the last line gives each contender's mean / worst."""
    import json

    import suite_points

    out = tmp_path / "points.json"
    payload = suite_points.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text())["summary"] == payload["summary"]
    assert [r["tuner"] for r in payload["runs"]] == ["hypergrad", "ablation"]
    for r in payload["runs"]:
        assert r["seed"] == 0 and len(r["tests"]) == 3
        assert r["test_loss"] == pytest.approx(sum(r["tests"]) / 3)
        assert len(r["point"]["lr"]) == 5 and 0 < r["point"]["momentum"] < 1
        assert len(r["point"]["wd"]) == 4
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("suite_points problem=cancer_mlp_schedule hypergrad=")
