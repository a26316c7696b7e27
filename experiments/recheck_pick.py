"""How the Trainer's re-check chooses the point it returns (``SearchSettings.recheck_pick``),
judged on the suite's problems with the searches held fixed.

The default search re-checks its best points (and the point the descent started from) in
another batch order before it returns one. This runs the defaults once per problem and tuning
seed, at the suite's budget (30 plain runs of CPU time), retrains *every* re-checked point at the
suite's retrain seeds, and then scores each way of choosing among the same candidates: the
lower worse loss of the two orders (``worse``, the default since 2026-11-29), the lower mean
(``mean``, the default before), the other order's loss alone (``variant``), the tuning order's
alone (``tuning``) and, as the ceiling of any rule, the candidate that retrains best
(``hindsight``). The comparison is paired: one search, several rules.

    python experiments/recheck_pick.py --half dev --out experiments/results/recheck_pick_dev.json
    python experiments/recheck_pick.py --half eval --out experiments/results/recheck_pick_eval.json

Prints a table of mean test losses per problem and rule and a last line
``recheck_pick half=<h> worse_vs_mean=<geometric mean ratio> worst=<max ratio> changed=<n>/<runs>``.
``--tuner ablation``: the same with the suite's ablation (the defaults with the hypergradient
replaced by a two-run zeroth-order estimate, whose re-check chooses by the same rule): other
searches, so other candidates to judge the rules on. ``--quick``: one problem, one seed, a
budget of 20 plain runs (a smoke run in seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402
import vs_optuna as V  # noqa: E402

import hypergrad as hg  # noqa: E402

RETRAIN = V.SUITE_RETRAIN
"""The suite's retrain seeds (``vs_optuna.py --suite``)."""


def _trainer_rule(pick: str) -> Any:
    """The Trainer's own score of a candidate under ``SearchSettings(recheck_pick=pick)``."""
    settings = hg.run.SearchSettings(recheck_pick=pick)
    return lambda c: settings.recheck_score(c["val"], c["variant"])


RULES: dict[str, Any] = {
    "worse": _trainer_rule("worse"),
    "mean": _trainer_rule("mean"),
    "variant": lambda c: c["variant"],
    "tuning": lambda c: c["val"],
    "hindsight": lambda c: c["test"],
}
"""Each rule's score of a candidate: the lowest score is returned."""


def search(name: str, seed: int, budget: float, tuner: str = "hypergrad") -> dict[str, Any]:
    """The defaults on ``name`` at tuning seed ``seed`` within ``budget`` CPU seconds (``tuner``
    ``"ablation"``: with the suite's zeroth-order estimate for the hypergradient); every
    re-checked point retrained at :data:`RETRAIN` (mean test loss)."""
    task = V._suite_task(name, seed, select=True)
    p = task.problem
    kw: dict[str, Any] = {}
    if tuner == "ablation":
        space = V.SearchSpace.from_problem(p.hyperparams, task.bounds, dtype=p.dtype)
        kw["method"] = V.ZerothOrder(space, seed=seed)
    tr = hg.Trainer(p, guards=hg.Guards(bounds=task.bounds, time_budget=budget, clock="cpu"),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)], **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", V.HypergradWarning)
        res = tr.fit()
    key = "select_loss" if res.rechecked and "select_loss" in res.rechecked[0] else "val_loss"
    cands = []
    for r in res.rechecked:
        tests = V._test_at(name, r["lam"], RETRAIN)
        cands.append({"val": r[key], "variant": r[f"variant_{key}"],
                      "test": statistics.fmean(t["test_loss"] for t in tests),
                      "returned": bool(torch.equal(r["lam"], res.lam))})
    if not cands:  # nothing re-checked (too little time): the rules cannot differ
        tests = V._test_at(name, res.lam, RETRAIN)
        cands = [{"val": res.best_val_loss, "variant": res.best_val_loss,
                  "test": statistics.fmean(t["test_loss"] for t in tests), "returned": True}]
    return {"problem": name, "seed": seed, "tuner": tuner, "key": key, "candidates": cands}


def picks(rec: dict[str, Any]) -> dict[str, float]:
    """The test loss each rule's choice retrains at (ties: the first candidate, as the
    Trainer's ``min``)."""
    cs = rec["candidates"]
    return {rule: min(cs, key=score)["test"] for rule, score in RULES.items()}


def _payload(protocol: dict[str, Any], records: list[dict[str, Any]], half: str,
             planned: int) -> dict[str, Any]:
    """The JSON written: ``complete`` says whether every planned run is in it (an interrupted
    run's file looked finished)."""
    return {"protocol": protocol, "complete": len(records) == planned,
            "summary": summarize(records, half), "records": records}


def summarize(records: list[dict[str, Any]], half: str) -> dict[str, Any]:
    by: dict[str, list[dict[str, float]]] = {}
    for rec in records:
        by.setdefault(rec["problem"], []).append(picks(rec))
    problems = {}
    for name, rows in by.items():
        mean = {rule: statistics.fmean(r[rule] for r in rows) for rule in RULES}
        d = [math.log(r["worse"] / r["mean"]) for r in rows]
        problems[name] = {
            "mean_test": mean, "runs": len(rows),
            "log_worse_over_mean": statistics.fmean(d),
            "se": statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None,
            "changed": sum(r["worse"] != r["mean"] for r in rows),
            "lower": sum(r["worse"] < r["mean"] for r in rows)}
    ratios = {rule: [problems[n]["mean_test"][rule] / problems[n]["mean_test"]["mean"]
                     for n in problems] for rule in RULES}
    return {"half": half, "problems": problems,
            "geo_ratio_to_mean": {rule: math.exp(statistics.fmean(map(math.log, rs)))
                                  for rule, rs in ratios.items()},
            "worst_ratio_to_mean": {rule: max(rs) for rule, rs in ratios.items()},
            "changed": sum(p["changed"] for p in problems.values()),
            "lower": sum(p["lower"] for p in problems.values()),
            "runs": sum(p["runs"] for p in problems.values())}


def table(s: dict[str, Any]) -> str:
    lines = [f"{'problem':<32}" + "".join(f"{r:>10}" for r in RULES)
             + "   log(worse/mean)  changed lower"]
    for name, p in s["problems"].items():
        se = "" if p["se"] is None else f" +- {p['se']:.3f}"
        lines.append(f"{name:<32}" + "".join(f"{p['mean_test'][r]:>10.4f}" for r in RULES)
                     + f"   {p['log_worse_over_mean']:+.3f}{se:<8}  {p['changed']:>4}/{p['runs']}"
                     f" {p['lower']:>4}")
    lines.append(f"{'geometric mean, ratio to mean':<32}"
                 + "".join(f"{s['geo_ratio_to_mean'][r]:>10.4f}" for r in RULES))
    lines.append(f"{'worst ratio to mean':<32}"
                 + "".join(f"{s['worst_ratio_to_mean'][r]:>10.4f}" for r in RULES))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--half", choices=["dev", "eval"], default="dev")
    ap.add_argument("--tuner", choices=["hypergrad", "ablation"], default="hypergrad")
    ap.add_argument("--problems", nargs="+", default=None, help="default: the half's problems")
    ap.add_argument("--seeds", type=int, default=10, help="tuning seeds 0..n-1")
    ap.add_argument("--plain-runs", type=int, default=30, help="budget in plain runs")
    ap.add_argument("--quick", action="store_true",
                    help="the half's first problem, one seed, 20 plain runs")
    ap.add_argument("--out", default=None,
                    help="JSON file (written after every run; a run of the same protocol "
                         "into it goes on where it stopped)")
    args = ap.parse_args(argv)
    for flag, v in (("--seeds", args.seeds), ("--plain-runs", args.plain_runs)):
        if v < 1:  # --seeds 0 ended in KeyError: 'summary'
            ap.error(f"{flag} {v}: must be an int >= 1")
    torch.set_num_threads(1)
    names = args.problems or suite.SPLIT[args.half]
    unknown = sorted(set(names) - set(suite.PROBLEMS))
    if unknown:
        ap.error(f"--problems: unknown {unknown}; the suite's problems are "
                 f"{sorted(suite.PROBLEMS)}")
    seeds, n_plain = range(args.seeds), args.plain_runs
    if args.quick:
        names, seeds, n_plain = names[:1], range(1), 20
    protocol = {"tuner": args.tuner, "budget_plain_runs": n_plain, "retrain_seeds": RETRAIN,
                "seeds": list(seeds), "split_hash": suite.SPLIT_HASH}
    plan = [(name, seed) for name in names for seed in seeds]
    records: list[dict[str, Any]] = []
    if args.out and Path(args.out).exists():  # an interrupted run: its runs kept, not redone
        old = json.loads(Path(args.out).read_text())
        if old.get("protocol") != protocol:
            ap.error(f"--out {args.out} holds the records of another protocol "
                     f"({old.get('protocol')}); give another --out, or remove it")
        records = [r for r in old.get("records", []) if (r["problem"], r["seed"]) in plan]
    done = {(r["problem"], r["seed"]) for r in records}
    payload: dict[str, Any] = {}
    for name in names:
        budget = n_plain * V._plain_seconds(name)
        for seed in seeds:
            if (name, seed) in done:
                continue
            rec = search(name, seed, budget, args.tuner)
            records.append(rec)
            got = picks(rec)
            print(f"{name} seed {seed}: {len(rec['candidates'])} re-checked; test worse "
                  f"{got['worse']:.4f}, mean {got['mean']:.4f}", flush=True)
            payload = _payload(protocol, records, args.half, len(plan))
            if args.out:
                Path(args.out).write_text(json.dumps(payload, indent=1))
    payload = _payload(protocol, records, args.half, len(plan))
    s = payload["summary"]
    print(table(s))
    print(f"recheck_pick half={args.half}{'' if args.tuner == 'hypergrad' else ' tuner=ablation'} "
          f"worse_vs_mean={s['geo_ratio_to_mean']['worse']:.4f} "
          f"worst={s['worst_ratio_to_mean']['worse']:.4f} changed={s['changed']}/{s['runs']}")
    return payload


if __name__ == "__main__":
    main()
