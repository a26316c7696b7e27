"""Development check of the space-filling start's layout (``SearchSettings.shared_start``,
``hypergrad.run.SearchSettings``) on a schedule problem outside the suite's evaluation half:
the long-horizon study's teacher MLP
(:mod:`horizon_schedules`) at a shorter horizon, development tuning seeds (not the study's),
the Trainer's defaults (``forward_defaults``) with one level per schedule (``shared``, the
default) or a level per window (``independent``); each result retrained on 3 fresh seeds.

    python experiments/start_dev.py --variant shared --out experiments/results/start_dev_shared.json

``--variant resample`` (a check of what the teacher task's tuned points fit, issue 26): the
defaults with every outer step's hypergradient and line search in a new batch order
(``InnerProblem.variant(2 + outer step)``; the start in the problem's own order), instead of
the one order of the tuning seed throughout. ``--variant average2``: every evaluation (each
hypergradient and each plain run) the mean over two batch orders (the problem's own and its
variant 2), at twice the cost; the re-check in variant 1 as before.

``--variant smooth --smooth L``: the default QuasiNewton's schedule coupling
(``SearchSettings.smooth_schedule``) at length ``L`` (a share of the windows; the
default since it was measured here is 0.2); ``--variant no_smooth``: every window on its own,
as the defaults were before (the ``shared`` runs committed before it were made so).

``--task charlm``: the language model of ``horizon_lm.py`` at development seeds (the study
tunes at 0-2), retrained at its seeds 100-102 and judged in test bits per character (a start
whose schedules also warm up and decay was weighed here and not kept: docs/benchmarks_history.md).

``--variant no_recheck_first``: the re-check compares the best points only, not also the point
the first hypergradient was taken at (``SearchSettings.recheck_first``, on by default
since it was weighed here and on the suite's development half; the committed
``start_dev_t5000_recheck_first.json`` is the default now).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import horizon_common as hc  # noqa: E402
import horizon_schedules as hs  # noqa: E402

import hypergrad as hg  # noqa: E402
from hypergrad.run import trainer as trainer_module  # noqa: E402


def _resample_per_outer_step() -> None:
    """Patch the Trainer (this process only): outer step k's hypergradient and its plain runs
    in the problem's variant 2 + k (a new batch order); variant 1 stays the re-check's."""
    tr = trainer_module.Trainer
    hypergradient, timed = tr._hypergradient, tr._timed_value

    def in_order(self: Any, lam: Any) -> Any:
        self._order = 2 + self.outer_step
        with self.problem.variant(self._order):
            return hypergradient(self, lam)

    def timed_in_order(self: Any, lam: Any, variant: int) -> Any:
        return timed(self, lam, getattr(self, "_order", 0) if variant == 0 else variant)

    tr._hypergradient, tr._timed_value = in_order, timed_in_order  # type: ignore[method-assign]


def _average_two_orders() -> None:
    """Patch the Trainer (this process only): every hypergradient and plain run of the search
    is the mean over the problem's batch order and its variant 2 (the budget's forecasts count
    both runs); the re-check (variant 1) is unchanged."""
    from hypergrad.methods.base import HyperGradient

    tr = trainer_module.Trainer
    hypergradient, timed = tr._hypergradient, tr._timed_value

    def averaged(self: Any, lam: Any) -> Any:
        a = hypergradient(self, lam)
        with self.problem.variant(2):
            b = hypergradient(self, lam)
        return HyperGradient((a.objective + b.objective) / 2, (a.grad + b.grad) / 2, a.state,
                             a.info)

    def timed_averaged(self: Any, lam: Any, variant: int) -> Any:
        if variant != 0:
            return timed(self, lam, variant)
        (v0, sel), (v2, _) = timed(self, lam, 0), timed(self, lam, 2)
        both = self._plain_recent[-2] + self._plain_recent[-1]
        self._plain_recent[-2:] = [both]
        self._plain_seconds = both
        return (v0 + v2) / 2, sel

    tr._hypergradient, tr._timed_value = averaged, timed_averaged  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=("shared", "independent", "resample", "average2",
                                          "smooth", "no_smooth", "no_recheck_first"),
                    default="shared")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10, 16)))
    ap.add_argument("--T", type=int, default=None,
                    help="--task teacher: inner steps (default 1000)")
    ap.add_argument("--budget", type=float, default=40.0, help="CPU seconds per tuning seed")
    ap.add_argument("--contender", choices=("defaults", "sign", "recipe"), default="defaults",
                    help="the Trainer's defaults, the study's sign-step forward contender, or "
                         "its cosine recipe (the grid over the peak; the variant does not apply)")
    ap.add_argument("--smooth", type=float, default=0.2,
                    help="--variant smooth: the schedule kernel's length scale (share of windows)")
    ap.add_argument("--task", choices=("teacher", "charlm"), default="teacher",
                    help="the teacher MLP (T from --T) or the language model of "
                         "horizon_lm.py (its T = 1000; retrained at its seeds 100-102 and "
                         "judged in test bits per character; --contender defaults only)")
    ap.add_argument("--quick", action="store_true",
                    help="--task charlm: the study's smoke size (T = 30, a tiny model)")
    ap.add_argument("--out", default=None, help="JSON file")
    args = ap.parse_args(argv)
    if args.task == "charlm" and args.T is not None:
        ap.error(f"--T {args.T}: --task charlm runs the language model's own horizon (T = 1000; "
                 "--quick: 30); leave --T out")
    if args.task == "teacher" and args.quick:
        ap.error("--quick is for --task charlm; give the teacher a smaller --T instead")
    if args.T is None:
        args.T = 1000
    if args.budget <= 0 or args.T < 1:  # the library named time_budget=-1.000005 instead
        ap.error(f"--budget {args.budget:g} and --T {args.T}: the budget must be seconds > 0, "
                 f"the horizon an int >= 1")
    torch.set_num_threads(1)
    search: dict[str, Any] = {}  # the defaults' search settings for this variant
    if args.variant == "independent":
        search["shared_start"] = ()
    if args.variant == "resample":
        _resample_per_outer_step()
    if args.variant == "average2":
        _average_two_orders()
    if args.variant == "smooth":
        search["smooth_schedule"] = args.smooth
        hc.SIGN_SMOOTH = args.smooth
    if args.variant == "no_recheck_first":
        search["recheck_first"] = False
    if args.variant == "no_smooth":
        search["smooth_schedule"] = None
    mode = hg.Offline.default(search=search)
    if args.task == "charlm":
        return _charlm(args, mode)
    st = hs.Study("teacher", T=args.T, budget=args.budget)
    rows = []
    for seed in args.seeds:
        got = (hs.tune_recipe(st, seed) if args.contender == "recipe" else
               hs.tune_forward(st, seed, defaults=args.contender == "defaults", mode=mode))
        rt = [st.train(s, got["spec"]) for s in (200, 201, 202)]
        lr = (hs.spec_curve(got["spec"], st.T, points=st.windows)["lr"]
              if args.contender == "recipe" else got["spec"]["lr"])
        test = statistics.mean(r["test"] for r in rt)
        rows.append({"seed": seed, "val": got["val"], "test": test,
                     "val_retrain": statistics.mean(r["val"] for r in rt), "lr": lr,
                     "hypergradients": got["info"].get("hypergradients", 0),
                     "plain_runs": got["info"].get("plain_runs", got["evals"])})
        print(f"seed {seed}: val {got['val']:.4f} test {test:.4f}", flush=True)
        if args.out:  # after every seed: an interrupted run kept nothing
            Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    summary = {"variant": args.variant, "contender": args.contender,
               "smooth_schedule": (mode.search.smooth_schedule if args.contender == "defaults"
                                   else hc.SIGN_SMOOTH),
               "search": mode.search.changed(),
               "T": args.T, "budget_cpu_s": args.budget,
               "seeds": args.seeds, "mean_test": statistics.mean(r["test"] for r in rows),
               "mean_val": statistics.mean(r["val"] for r in rows)}
    print(f"start_dev {args.variant} mean_test={summary['mean_test']:.4f} "
          f"mean_val={summary['mean_val']:.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


def _charlm(args: argparse.Namespace, mode: hg.Offline) -> None:
    """``--task charlm``: the defaults with ``mode`` on the language model at development seeds
    (the study tunes at 0-2), each result retrained at the study's seeds 100-102."""
    import horizon_lm as hl

    if args.contender != "defaults":
        raise SystemExit("--task charlm: --contender defaults only")
    st = hl.lm_study(args.quick)
    st.budget = args.budget
    tasks: dict[int, hg.Task] = {}
    rows = []
    for seed in args.seeds:
        got = hl.tune_forward(st, seed, defaults=True, mode=mode)
        rt = hl.retrain(st, got["spec"], [100, 101, 102], tasks)
        test = statistics.mean(r["test_bpc"] for r in rt)
        rows.append({"seed": seed, "val": got["val"], "test_bpc": test,
                     "test_bpc_each": [r["test_bpc"] for r in rt], "lr": got["spec"]["lr"],
                     "spec": got["spec"], "cpu_s": got["cpu_s"],
                     "hypergradients": got["info"].get("hypergradients", 0),
                     "plain_runs": got["info"].get("plain_runs", got["evals"])})
        print(f"seed {seed}: val {got['val']:.4f} test {test:.4f} bits/char", flush=True)
        if args.out:  # as it goes: a run can be cut off
            Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    summary = {"task": "charlm", "variant": args.variant, "search": mode.search.changed(),
               "T": st.T, "budget_cpu_s": args.budget, "seeds": args.seeds,
               "mean_test_bpc": statistics.mean(r["test_bpc"] for r in rows)}
    print(f"start_dev charlm {args.variant} mean_test_bpc={summary['mean_test_bpc']:.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
