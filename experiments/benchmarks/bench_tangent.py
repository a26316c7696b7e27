"""The optimizer's part of a forward-mode step: the update's tangent in closed form against the
general paths, side by side in one process.

A forward step is the gradient, K Hessian-vector products, then the optimizer's update and its
tangent (``Z_w' = dU/dw Z_w + dU/dg G + ...`` over the K columns, plus the hyperparameters' own
terms). Three ways to get that tangent, all equal to rounding (tests/test_perf_forward.py):

- ``closed``: the update's derivative written out (SGD with momentum, weight decay, dampening,
  Nesterov; Adam and AdamW with bias corrections, eps and weight decay): a few fused
  multiply-adds over the K columns per tensor, no autograd (the default);
- ``diagonal``: the update's diagonal Jacobian from one reverse pass, then the same
  multiply-adds (the path for elementwise optimizers without a closed form);
- ``jvp``: ``jvp`` of the update under ``vmap`` (the path for any other update).

For each optimizer, model and K: the whole step's time per path (ms), and each path's step as a
ratio to the closed form's.

    python experiments/benchmarks/bench_tangent.py          # full run
    python experiments/benchmarks/bench_tangent.py --quick  # < 1 min
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

import hypergrad as hg  # noqa: E402
from hypergrad.tangent import JVP, ClosedForm, DiagonalJacobian  # noqa: E402

PATHS = {"closed": ClosedForm, "diagonal": DiagonalJacobian, "jvp": JVP}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="mlp only, K in {4, 16}")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--ks", nargs="*", type=int, default=None)
    ap.add_argument("--optimizers", nargs="*", default=list(C.OPTIMIZERS))
    ap.add_argument("--json", default=None, help="output path (default results/bench_tangent.json)")
    args = ap.parse_args()
    tuned = C.setup()
    mach = C.machine()
    C.print_machine(mach)
    models = args.models or (["mlp"] if args.quick else ["mlp", "cnn8"])
    ks = args.ks or ([4, 16] if args.quick else [4, 16, 64])
    repeats = 3 if args.quick else 5
    print(f"# malloc tuned: {tuned}")
    C.wait_quiet()
    rows: list[dict[str, Any]] = []
    for opt in args.optimizers:
        for model in models:
            for k in ks:
                p = C.make_problem(model, k, optimizer=opt)
                lam = p.init_raw()
                steppers = {path: C.forward_stepper(p, lam, hg.ForwardMode(tangent=rule()))
                            for path, rule in PATHS.items()}
                steppers["plain"] = C.plain_stepper(p, lam)
                for step in steppers.values():
                    step()
                times = C.interleaved_times(steppers, repeats, 2, min_seconds=0.3)
                row: dict[str, Any] = {"optimizer": opt, "model": model, "k": k,
                                       "plain_ms": 1e3 * times["plain"]}
                for path in PATHS:
                    row[f"{path}_ms"] = 1e3 * times[path]
                    row[f"{path}_x_closed"] = times[path] / times["closed"]
                rows.append(row)
                print(C.table([row], COLS).splitlines()[1], flush=True)
    print()
    print(C.table(rows, COLS))
    gain = min(r["diagonal_x_closed"] for r in rows)
    line = (f"tangent diagonal/closed min={gain:.2f} "
            f"max={max(r['diagonal_x_closed'] for r in rows):.2f}; "
            f"jvp/closed max={max(r['jvp_x_closed'] for r in rows):.2f}")
    C.finish("bench_tangent", {"machine": mach, "rows": rows, "quick": args.quick}, args.json,
             line)


COLS = [("optimizer", "optimizer", ""), ("model", "model", ""), ("k", "K", "d"),
        ("plain_ms", "plain ms", ".2f"), ("closed_ms", "closed ms", ".2f"),
        ("diagonal_ms", "diagonal ms", ".2f"), ("jvp_ms", "jvp ms", ".2f"),
        ("diagonal_x_closed", "diagonal/closed", ".2f"), ("jvp_x_closed", "jvp/closed", ".2f")]


if __name__ == "__main__":
    main()
