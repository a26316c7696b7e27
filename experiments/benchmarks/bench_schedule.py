"""An 8-window learning-rate schedule against its 8 dense columns.

Forward mode skips the columns of windows that have not started (their tangents are exactly zero
until a step reads them): over T steps, window w's column is live for (8 - w) / 8 of the run, so
the batched Hessian-vector products see 4.5 of the 8 columns on average and the FLOP floor of the
run falls from 1 + 2 * 8 to 1 + 2 * 4.5 plain steps per step (0.59). Both runs are timed side by
side in this process (the whole run of T steps, median of repeats) and give the same
hypergradient.

The FLOP floor assumes every column costs 2 plain steps (the FLOP count of one Hessian-vector
product). Batched columns cost less than that (their GEMMs are larger), which moves the achievable
ratio up, towards the step's fixed cost. So the run also fits the per-step time to
``a + b * live`` (seconds; from the dense and skipping runs of the same process, in plain-step
units) and prints ``bound``: the ratio even a step with no fixed cost beyond one plain step
(``a = 1``) would reach with the measured per-column cost ``b``: ``(1 + b live) / (1 + b K)``.

    python experiments/benchmarks/bench_schedule.py          # full run
    python experiments/benchmarks/bench_schedule.py --quick  # < 2 min
    python experiments/benchmarks/bench_schedule.py --compile  # + the skipping run compiled

``--compile`` adds ``ForwardMode(compile=True)``: the compiled products pad the live columns to
at most ``hypergrad.hvp.COMPILE_BUCKETS`` counts (each count would compile anew); its first run
(the compilations) is the warm-up, outside the timing, and reported as ``compile s``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

import hypergrad as hg  # noqa: E402

WINDOWS = 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--compile", action="store_true",
                    help="also time the skipping run compiled (ForwardMode(compile=True))")
    args = ap.parse_args()
    tuned = C.setup()
    mach = C.machine()
    C.print_machine(mach)
    models = args.models or (["mlp", "cnn8"] if args.quick else list(C.BASE_MODELS))
    steps = args.steps or (32 if args.quick else 64)
    repeats = 3 if args.quick else 5
    print(f"# malloc tuned: {tuned}; T = {steps} steps, {WINDOWS} windows")
    C.wait_quiet()
    rows: list[dict[str, Any]] = []
    for model in models:
        p = C.make_problem(model, WINDOWS, steps=steps, hyper="schedule", windows=WINDOWS)
        lam = p.init_raw()
        methods = {"dense": hg.ForwardMode(skip_zero_columns=False),
                   "skip": hg.ForwardMode()}
        if args.compile:
            methods["compiled"] = hg.ForwardMode(compile=True)
        grads, first_s = {}, {}
        for name, m in methods.items():
            t0 = time.perf_counter()
            grads[name] = m.hypergradient(p, lam).grad  # warm-up and the result
            first_s[name] = time.perf_counter() - t0
        times = C.interleaved_times({name: (lambda m=m: m.hypergradient(p, lam))
                                     for name, m in methods.items()}, repeats, 0)
        plain = C.plain_stepper(p, lam)
        t_plain = C.median_time(plain, 20, 3, min_seconds=0.5)
        first = [min(t for t in range(steps) if p.hyperparams.items[0].window(t, steps) == w)
                 for w in range(WINDOWS)]
        live = sum(steps - f for f in first) / steps
        dense_x, skip_x = times["dense"] / steps / t_plain, times["skip"] / steps / t_plain
        col = (dense_x - skip_x) / (WINDOWS - live)  # b: plain steps per live column
        fixed = dense_x - WINDOWS * col  # a: plain steps per step, whatever the columns
        rows.append({
            "model": model, "T": steps, "dense_s": times["dense"], "skip_s": times["skip"],
            "ratio": times["skip"] / times["dense"],
            "floor_ratio": (1 + 2 * live) / (1 + 2 * WINDOWS), "avg_live": live,
            "dense_x_plain": dense_x, "skip_x_plain": skip_x,
            "col_x_plain": col, "fixed_x_plain": fixed,
            "bound": (1 + col * live) / (1 + col * WINDOWS),
            "rel_diff": hg.testing.rel_err(grads["skip"], grads["dense"]),
        })
        if args.compile:
            rows[-1].update({
                "compiled_s": times["compiled"],
                "compiled_ratio": times["compiled"] / times["skip"],
                "compile_s": first_s["compiled"] - times["compiled"],
                "compiled_rel_diff": hg.testing.rel_err(grads["compiled"], grads["skip"])})
        print(C.table(rows[-1:], COLS + (COMPILED_COLS if args.compile else [])).splitlines()[1],
              flush=True)
    print()
    cols = COLS + (COMPILED_COLS if args.compile else [])
    print(C.table(rows, cols))
    worst = max(r["ratio"] for r in rows)
    line = (f"schedule_vs_dense max_ratio={worst:.2f} (models {', '.join(models)}); bound at "
            f"a fixed cost of one plain step: {max(r['bound'] for r in rows):.2f}")
    if args.compile:
        line += (f"; compiled/skip min={min(r['compiled_ratio'] for r in rows):.2f} "
                 f"max={max(r['compiled_ratio'] for r in rows):.2f}")
    C.finish("bench_schedule", {"machine": mach, "rows": rows, "quick": args.quick}, args.json,
             line)


COLS = [("model", "model", ""), ("T", "T", "d"), ("dense_s", "dense s", ".2f"),
        ("skip_s", "skip s", ".2f"), ("ratio", "skip/dense", ".2f"),
        ("floor_ratio", "FLOP floor", ".2f"), ("avg_live", "live cols", ".2f"),
        ("dense_x_plain", "dense x plain", ".1f"), ("skip_x_plain", "skip x plain", ".1f"),
        ("fixed_x_plain", "a", ".2f"), ("col_x_plain", "b", ".2f"), ("bound", "bound", ".2f"),
        ("rel_diff", "rel diff", ".1e")]
COMPILED_COLS = [("compiled_s", "compiled s", ".2f"), ("compiled_ratio", "compiled/skip", ".2f"),
                 ("compile_s", "compile s", ".1f"), ("compiled_rel_diff", "rel diff c", ".1e")]


if __name__ == "__main__":
    main()
