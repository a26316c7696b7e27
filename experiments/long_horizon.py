"""Long horizons and a language model (issue 26): the evidence a practitioner asks for.

Three parts, each a module beside this one:

1. ``horizon`` (:mod:`horizon_memory`): peak memory and CPU time of one hypergradient of
   forward, reverse, checkpointed reverse and truncated reverse mode against the horizon T on
   an MLP whose tangent is 100 MB (K = 12, batches from a DataLoader); reverse where the memory
   guard lets it; where the time of a forward step goes (torch.profiler); the hypergradient's
   signal-to-noise and sign agreement against T over mini-batch orders.
2. ``schedule`` (:mod:`horizon_schedules`): short-horizon bias, measured. An FDS-style schedule
   (10 learning-rate windows, momentum, weight decay) over T = 5000 steps, tuned at equal CPU
   time by forward mode over the full horizon, the greedy online methods (HD, MARTHE, RTHO), a
   cosine recipe with a grid of peak learning rates, Optuna's TPE and random search; 3 seeds,
   results retrained from scratch and judged on test data; a noisy quadratic as the sanity
   problem.
3. ``lm`` (:mod:`horizon_lm`): a character-level transformer LM on the standard library's
   source (:mod:`hypergrad.tasks.charlm`), AdamW with clipping; forward mode (learning-rate
   windows with the first as warmup, weight decay per layer group, AdamW's betas; T = 1000)
   against the standard recipe, schedule-free AdamW and TPE at equal CPU time; 3 seeds, test
   bits per character.

Budgets are process CPU seconds of one single-threaded process (``time.process_time``,
``torch.set_num_threads(1)``), so the load of other processes on a shared machine does not
bias them; on a quiet machine CPU time and wall clock are the same.

Every finished unit (a method at a horizon, a tuner on a seed) is one JSON line of
``<out>/long_horizon_records.jsonl``, written as soon as it finishes; a restarted run skips the
units already there (the forward-mode runs of part 1 also resume mid-run from their
``RunFolder(inner_every=...)`` checkpoints). After every part the summary
``<out>/long_horizon.json`` and the plots are written again from all records.

    python experiments/long_horizon.py            # the full study (hours; resumable)
    python experiments/long_horizon.py --quick    # a smoke run in minutes (outputs/...quick)
    python experiments/long_horizon.py --parts lm --seeds 0 1 2
    python experiments/long_horizon.py --summarize   # rewrite the JSON and plots only

The last line: ``long_horizon mem_ratio_forward=<a> forward_vs_greedy=<b>
lm_forward_vs_recipe=<c>`` (one line).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "experiments"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import horizon_lm  # noqa: E402
import horizon_memory  # noqa: E402
import horizon_schedules  # noqa: E402
from horizon_common import RESULTS, Records, machine, one_thread  # noqa: E402

PARTS = ("horizon", "schedule", "lm")


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


SIZE_UNIT = "_size"
"""The records file's first unit: ``{"size": "quick" | "full"}`` (a file without it, written
before it was, takes the size of the run that next opens it)."""


def summary(records: Records, quick: bool) -> dict[str, Any]:
    """The JSON: ``summary`` (the issue's keys, each ratio with its seeds' standard error as
    ``<key>_se``) and each part's details."""
    hz = horizon_memory.summarize(records)
    sc = horizon_schedules.summarize(records, quick)
    lm = horizon_lm.summarize(records, quick)
    main = sc.get("teacher", {})
    seeds = main.get("seeds", [])
    fvg = main.get("forward_vs_greedy", (None, None))
    fvb = main.get("forward_vs_best", (None, None))
    lvr = lm.get("lm_forward_vs_recipe", (None, None))
    s = {"mem_ratio_forward": _num(hz.get("mem_ratio_forward")), "T_max": hz.get("T_max"),
         "horizon": main.get("T"), "seeds": len(seeds),
         "forward_vs_greedy": _num(fvg[0]), "forward_vs_greedy_se": _num(fvg[1]),
         "forward_vs_best": _num(fvb[0]), "forward_vs_best_se": _num(fvb[1]),
         "lm_seeds": len(lm.get("seeds", [])),
         "lm_forward_vs_recipe": _num(lvr[0]), "lm_forward_vs_recipe_se": _num(lvr[1])}
    return {"summary": s, "horizon": hz, "schedule": sc, "lm": lm, "quick": quick,
            "machine": machine(),
            "notes": {"budgets": "process CPU seconds of one single-threaded process "
                                 "(time.process_time); on a quiet machine = wall clock",
                      "forward_vs_greedy": "mean test loss of forward mode over that of the "
                                           "best greedy online method (HD, MARTHE, RTHO) on "
                                           "the teacher problem; _se: standard error of the "
                                           "per-seed ratios",
                      "forward_vs_best": "the same over the best of every other contender",
                      "lm_forward_vs_recipe": "mean test bits per character of forward mode "
                                              "over the better of the cosine recipe and "
                                              "schedule-free AdamW"}}


def write(records: Records, out: Path, quick: bool) -> dict[str, Any]:
    from hypergrad.run.files import dumps, write_text_atomic

    payload = summary(records, quick)
    plots = []
    for make in (lambda: horizon_memory.plot(records, out / "long_horizon_memory.png"),
                 lambda: horizon_schedules.plot(records, quick,
                                                lambda n: out / f"long_horizon_{n}.png"),
                 lambda: horizon_lm.plot(records, quick, out / "long_horizon_lm.png")):
        got = make()
        if isinstance(got, list):
            plots += got
        elif got:
            plots.append(got)
    payload["plots"] = [Path(p).name for p in plots]
    write_text_atomic(out / "long_horizon.json", dumps(payload, indent=1) + "\n")
    return payload


def _f(x: Any, fmt: str = ".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:{fmt}}"


def _pm(ms: Any, fmt: str = ".4f") -> str:
    m, se = ms if isinstance(ms, (list, tuple)) else (ms, None)
    return _f(m, fmt) + ("" if se is None or not math.isfinite(se) else f" ± {se:{fmt}}")


def tables(payload: dict[str, Any]) -> str:
    """The tables of docs/benchmarks.md, rendered from the JSON."""
    out = []
    hz = payload["horizon"]
    if hz.get("rows"):
        out.append("method          T   peak MiB   CPU s / hypergradient   note")
        for r in hz["rows"]:
            if r.get("refused"):
                note = (f"refused by the memory guard (estimate "
                        f"{r['estimate_bytes'] / 2**30:.1f} GiB)")
                out.append(f"{r['method']:<12}{r['T']:>6}{'-':>11}{'-':>24}   {note}")
            else:
                note = (f"resumed at inner step {r['resumed_at']}" if r.get("resumed_at")
                        else "")
                out.append(f"{r['method']:<12}{r['T']:>6}{r['peak_bytes'] / 2**20:>11.0f}"
                           f"{r['cpu_s']:>24.1f}   {note}")
        out.append("")
    if hz.get("profile"):
        pr = hz["profile"]
        out.append(f"forward step, all K columns: {pr['cpu_s_per_step'] * 1e3:.0f} CPU ms; top "
                   f"operators by self time:")
        for t in pr["top"][:8]:
            out.append(f"  {t['op']:<44}{t['self_ms_per_step']:>8.1f} ms  {t['share']:>5.1%}")
        out.append("")
    if hz.get("snr"):
        out.append("    T  passes  median |mean|/std  sign agreement  pairwise cosine")
        for r in hz["snr"]:
            out.append(f"{r['T']:>5}{r['passes']:>8}{r['snr_median']:>19.2f}"
                       f"{r['sign_agreement_mean']:>16.2f}{_f(r['pairwise_cosine'], '.2f'):>17}")
        out.append("")
    for name, st in payload["schedule"].items():
        if not st.get("table"):
            continue
        out.append(f"{name}: T = {st['T']}, {st['budget_cpu_s']:g} CPU s per tuner and seed, "
                   f"seeds {st['seeds']}")
        out.append(f"{'tuner':<17}{'test loss (retrained)':>26}{'val at budget':>22}"
                   f"{'evals':>8}{'CPU s':>8}")
        for c, r in sorted(st["table"].items(), key=lambda kv: kv[1]["test"][0]):
            out.append(f"{c:<17}{_pm(r['test']):>26}{_pm(r['val']):>22}{r['evals']:>8.0f}"
                       f"{r['cpu_s']:>8.0f}")
        b = st.get("baselines") or {}
        if b.get("best_constant"):
            out.append(f"baselines (retrained): best constant lr {b['best_constant']['lr']:.3g} "
                       f"test {b['best_constant']['test']:.4f}; worst finite constant lr "
                       f"{b['worst_finite_constant']['lr']:.3g} test "
                       f"{b['worst_finite_constant']['test']:.4f}; best cosine lr "
                       f"{b['best_cosine']['lr']:.3g} test {b['best_cosine']['test']:.4f}")
        for k in ("forward_vs_greedy", "forward_vs_best"):
            if k in st:
                ref = st.get("best_greedy" if k == "forward_vs_greedy" else "best_other")
                out.append(f"{k} = {_pm(st[k], '.3f')} (against {ref})")
        for k in ("defaults_vs_greedy", "defaults_vs_best"):  # the Trainer's default outer loop
            if k in st:
                ref = st.get("best_greedy" if k == "defaults_vs_greedy" else "best_other")
                out.append(f"{k} = {_pm(st[k], '.3f')} (forward_defaults against {ref})")
        out.append("")
    lm = payload["lm"]
    if lm.get("table"):
        out.append(f"char LM: T = {lm['T']}, {lm['budget_cpu_s']:g} CPU s per tuner and seed, "
                   f"seeds {lm['seeds']}")
        out.append(f"{'tuner':<21}{'test bits/char':>20}{'val bits/char':>20}{'evals':>8}"
                   f"{'CPU s':>8}")
        for c, r in sorted(lm["table"].items(), key=lambda kv: kv[1]["test_bpc"][0]):
            out.append(f"{c:<21}{_pm(r['test_bpc']):>20}{_pm(r['val_bpc']):>20}"
                       f"{r['evals']:>8.0f}{r['cpu_s']:>8.0f}")
        for k in ("lm_forward_vs_recipe", "lm_forward_vs_tpe", "lm_forward_sign_vs_recipe",
                  "lm_forward_schedulefree_vs_recipe", "lm_forward_scales_vs_recipe",
                  "lm_forward_scales_vs_tpe_scales", "lm_forward_scales_sign_vs_recipe"):
            if k in lm:
                out.append(f"{k} = {_pm(lm[k], '.3f')}")
    return "\n".join(out)


def last_line(s: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        return "nan" if x is None else f"{x:.4g}"

    return (f"long_horizon mem_ratio_forward={f(s['mem_ratio_forward'])} "
            f"forward_vs_greedy={f(s['forward_vs_greedy'])} "
            f"lm_forward_vs_recipe={f(s['lm_forward_vs_recipe'])}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of every part in minutes")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="tuning seeds of parts 2 and 3 (default 0 1 2; quick: 0)")
    ap.add_argument("--out", default=None, help="folder of the records, JSON and plots "
                    "(default experiments/results; quick: outputs/long_horizon_quick)")
    ap.add_argument("--studies", nargs="+", default=None, choices=("teacher", "nqm"),
                    help="part 2: only these problems (default both)")
    ap.add_argument("--contenders", nargs="+", default=None,
                    choices=horizon_schedules.CONTENDERS,
                    help="part 2: only these contenders (default all; with --out, a rerun of "
                         "some beside the committed records)")
    ap.add_argument("--lm-contenders", nargs="+", default=None,
                    choices=horizon_lm.CONTENDERS,
                    help="part 3: only these contenders (default all; with --out, a rerun of "
                         "some beside the committed records)")
    ap.add_argument("--summarize", action="store_true",
                    help="only rewrite the JSON and plots from the records")
    args = ap.parse_args(argv)
    if args.seeds is not None and min(args.seeds) < 0:
        ap.error(f"--seeds {' '.join(map(str, args.seeds))}: seeds are ints >= 0")
    one_thread()
    out = Path(args.out) if args.out else (ROOT / "outputs" / "long_horizon_quick"
                                           if args.quick else RESULTS)
    if args.summarize and not (out / "long_horizon_records.jsonl").exists():
        # an all-NaN summary with exit status 0, and a records file stamped full in a new
        # (mistyped) folder (the experiment scripts probe)
        ap.error(f"--summarize: {out} holds no records (long_horizon_records.jsonl); give "
                 f"the --out of a run")
    out.mkdir(parents=True, exist_ok=True)
    records = Records(out / "long_horizon_records.jsonl")
    # a smoke run's records (T = 30, 8 CPU s) were summarised as the full study's, and a full
    # run into their folder skipped its units as done: one size per records file
    size = "quick" if args.quick else "full"
    had = records.rows.get(SIZE_UNIT, {}).get("size")
    if had is not None and had != size:
        fix = "add --quick" if had == "quick" else "leave out --quick"
        ap.error(f"--out {out} holds the records of a {had} run; a {size} run"
                 f"{' (or --summarize)' if size == 'full' else ''} would mix them with its own. "
                 f"Give another --out, or {fix}.")
    if had is None:
        records.add(SIZE_UNIT, {"size": size})
    # forward mode's run folders (checkpoints of hundreds of MB): never under results/
    work = (Path(args.out) / "long_horizon_runs" if args.out else
            ROOT / "outputs" / ("long_horizon_runs_quick" if args.quick else "long_horizon_runs"))
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    t0 = time.time()

    def log(text: str) -> None:
        print(f"[{time.time() - t0:7.0f} s] {text}", flush=True)

    if not args.summarize:
        for part in args.parts:
            if part == "horizon":
                horizon_memory.run(records, args.quick, work, log)
            elif part == "schedule":
                horizon_schedules.run(records, args.quick, seeds, log, only=args.studies,
                                      contenders=args.contenders)
            else:
                horizon_lm.run(records, args.quick, seeds, log, contenders=args.lm_contenders)
            write(records, out, args.quick)
    payload = write(records, out, args.quick)
    print(tables(payload))
    print(f"# records: {records.path}; JSON: {out / 'long_horizon.json'}")
    print(last_line(payload["summary"]))
    return payload


if __name__ == "__main__":
    main()
