"""Reverse mode on autograd's tape against reverse mode's stored-states sweep.

``ReverseMode()`` runs the inner steps plainly, keeps every state, then takes each step's VJP
by recomputing the step (the step runs twice): on autograd directly where the loss draws no
random numbers (since 2026-11-28), ``torch.func.vjp`` of the step with
``DoubleBackward(direct=False)`` (timed too: the route before). ``ReverseMode(tape=True)``
records the run once on autograd's tape, every step's gradient with its graph, and takes
``dE/dlam`` in one backward pass (memory: the whole run's graph). Both give the same
hypergradient. On the suite's small problems (experiments/suite.py, K <= 15, where the Trainer's
``"auto"`` method is reverse mode) this times a plain run, both reverse modes and forward mode
(eager) in one process, round-robin, median of the repeats, one thread, and prints each in plain
runs. A loss that draws random numbers takes the direct route too where its draws agree with
``torch.func``'s (checked once, bit for bit): ``--lm`` adds the long-horizon study's character
language model with dropout (``horizon_lm``, K = 17, T = ``--lm-steps``).

    python experiments/benchmarks/bench_tape.py           # the K <= 15 problems, 5 repeats
    python experiments/benchmarks/bench_tape.py --quick   # 2 problems, 3 repeats (< 1 min)
    python experiments/benchmarks/bench_tape.py --problems --lm   # the language model alone
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C  # noqa: E402
import torch  # noqa: E402

import hypergrad as hg  # noqa: E402
from hypergrad.stepvjp import DoubleBackward  # noqa: E402

QUICK = ("digits_adam_schedule", "wine_per_tensor_lr")


def main() -> None:
    import suite

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--problems", nargs="*", default=None, choices=list(suite.PROBLEMS))
    ap.add_argument("--lm", action="store_true",
                    help="also the character language model with dropout (horizon_lm)")
    ap.add_argument("--lm-steps", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-wait", action="store_true",
                    help="do not wait for a quiet machine (tests; the ratios get noisier)")
    args = ap.parse_args()
    tuned = C.setup()
    torch.set_num_threads(1)
    mach = C.machine()
    C.print_machine(mach)
    print(f"# malloc tuned: {tuned}; one thread")
    names = args.problems if args.problems is not None else (
        list(QUICK) if args.quick else [n for n, p in suite.PROBLEMS.items() if p.K <= suite.LOW_K])
    if args.lm:
        names.append("charlm_dropout")
    repeats = 3 if args.quick else 5
    if args.no_wait:
        C.no_wait()  # no waiting, and no repeating calls other processes slowed
    else:
        C.wait_quiet()
    rows: list[dict[str, Any]] = []
    for name in names:
        p = _lm(args.lm_steps) if name == "charlm_dropout" else suite.build(name, 0).problem
        lam = p.init_raw()
        tape, rev, fwd = (hg.ReverseMode(tape=True), hg.ReverseMode(),
                          hg.ForwardMode(compile=False))
        func = hg.ReverseMode(step_vjp=DoubleBackward(direct=False))

        def plain() -> None:
            with torch.no_grad():
                p.run(lam)

        fns = {"plain": plain, "reverse": lambda: rev.hypergradient(p, lam),
               "reverse_func": lambda: func.hypergradient(p, lam),
               "tape": lambda: tape.hypergradient(p, lam),
               "forward": lambda: fwd.hypergradient(p, lam)}
        times = C.interleaved_times(fns, repeats, 1)
        g_tape, g_rev = tape.hypergradient(p, lam).grad, rev.hypergradient(p, lam).grad
        g_func = func.hypergradient(p, lam).grad
        rows.append({"problem": name, "K": p.num_hyperparams, "T": p.steps,
                     "plain_s": times["plain"],
                     **{f"{k}_x_plain": times[k] / times["plain"]
                        for k in ("reverse", "reverse_func", "tape", "forward")},
                     "tape_vs_reverse": times["tape"] / times["reverse"],
                     "direct_vs_func": times["reverse"] / times["reverse_func"],
                     "rel_diff": max(hg.testing.rel_err(g_tape, g_rev),
                                     hg.testing.rel_err(g_func, g_rev)),
                     # a loss that draws: whether reverse mode took the direct route
                     "direct_draws": p.direct_draws})
        print(C.table(rows[-1:], COLS).splitlines()[1], flush=True)
    print()
    print(C.table(rows, COLS))
    r = sorted(x["tape_vs_reverse"] for x in rows)
    xs = [x["tape_x_plain"] for x in rows]
    d = sorted(x["direct_vs_func"] for x in rows)
    # statistics.median: r[len(r) // 2] was the larger middle value (--quick's 2 rows: the max)
    line = (f"tape_vs_reverse median={statistics.median(r):.2f} max={r[-1]:.2f} "
            f"(problems {len(rows)}); tape in plain runs {min(xs):.2f}-{max(xs):.2f}; "
            f"reverse direct/torch.func median={statistics.median(d):.2f} max={d[-1]:.2f}")
    C.finish("bench_tape", {"machine": mach, "rows": rows, "quick": args.quick}, args.json, line)


def _lm(steps: int) -> hg.InnerProblem:
    """The long-horizon study's character language model (dropout 0.1, AdamW, clipping) over
    ``steps`` inner steps."""
    from horizon_lm import lm_study

    st = lm_study(False)
    st.T = steps
    return st.task(0).problem


COLS = [("problem", "problem", ""), ("K", "K", "d"), ("T", "T", "d"),
        ("plain_s", "plain s", ".3f"), ("reverse_x_plain", "reverse x plain", ".2f"),
        ("reverse_func_x_plain", "torch.func route x plain", ".2f"),
        ("tape_x_plain", "tape x plain", ".2f"), ("forward_x_plain", "forward x plain", ".2f"),
        ("tape_vs_reverse", "tape/reverse", ".2f"), ("direct_vs_func", "direct/func", ".2f"),
        ("rel_diff", "rel diff", ".1e")]


if __name__ == "__main__":
    main()
