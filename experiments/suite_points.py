"""Where the defaults' returned points lie on one suite problem, beside their ablation's: the
point each contender returns at each tuning seed, in the problem's own units, with its
re-checked losses and its test loss at each of the suite's retraining seeds.

A diagnosis, not a comparison (``vs_optuna.py --suite`` is that): it reruns single contenders
of the suite (``vs_optuna.suite_run``, the suite's budget rule) at the seeds asked for, to see
what a seed that retrains badly returned.

    python experiments/suite_points.py --problem cancer_mlp_schedule --seeds 3 8 14 16 0 1 2 4

Writes ``experiments/results/suite_points_<problem>.json`` (``--out``) and prints one line per
run and a last line ``suite_points problem=<p> <tuner>=<mean test>/<worst test> ...``.
``--quick``: one seed, the budget of 14 plain runs (a smoke run in seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402
import vs_optuna as V  # noqa: E402

RETRAIN = V.SUITE_RETRAIN
"""The suite's retrain seeds (``vs_optuna.py --suite``)."""


def point(tuner: str, name: str, seed: int, budget: float) -> dict[str, Any]:
    """One contender's run at one tuning seed: the point it returns, described, and its test
    loss at each retraining seed."""
    run = V.suite_run(tuner, name, seed, budget)
    best, lam = run.answer()
    task = suite.build(name, seed)
    tests = [t["test_loss"] for t in V._test_at(name, lam, RETRAIN)]
    return {"tuner": tuner, "seed": seed, "val": best, "evals": len(run.within()),
            "rechecked": run.info.get("rechecked"),
            "point": task.problem.hyperparams.describe(lam),
            "tests": tests, "test_loss": statistics.fmean(tests)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="cancer_mlp_schedule", choices=list(suite.PROBLEMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tuners", nargs="+", default=["hypergrad", "ablation"],
                    choices=list(V.SUITE_TUNERS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    seeds = args.seeds[:1] if args.quick else args.seeds
    n_plain = 14 if args.quick else suite.BUDGET_PLAIN_RUNS
    budget = n_plain * V._plain_seconds(args.problem)
    runs = []
    for seed in seeds:
        for tuner in args.tuners:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's experimental warnings
                r = point(tuner, args.problem, seed, budget)
            runs.append(r)
            desc = " ".join(f"{k}=" + (" ".join(f"{x:.3g}" for x in v) if isinstance(v, list)
                                       else f"{v:.3g}") for k, v in r["point"].items())
            print(f"{tuner:<10} seed {seed:>3}  val {r['val']:.4f}  tests "
                  f"{' '.join(f'{t:.3f}' for t in r['tests'])}  {desc}", flush=True)
    summary = {t: {"mean_test": statistics.fmean(r["test_loss"] for r in runs
                                                 if r["tuner"] == t),
                   "worst_test": max(r["test_loss"] for r in runs if r["tuner"] == t)}
               for t in args.tuners}
    payload = {"problem": args.problem, "seeds": seeds, "retrain_seeds": RETRAIN,
               "budget_plain_runs": n_plain, "quick": args.quick, "summary": summary,
               "runs": runs}
    out = Path(args.out) if args.out else (
        V.ROOT / ("outputs" if args.quick else "experiments/results")
        / f"suite_points_{args.problem}{'_quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    print(f"suite_points problem={args.problem} " + " ".join(
        f"{t}={s['mean_test']:.4g}/{s['worst_test']:.4g}" for t, s in summary.items()))
    return payload


if __name__ == "__main__":
    main()
