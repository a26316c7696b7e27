"""Exactness table: forward vs reverse vs central finite differences vs every HVP strategy.

Every optimizer of ``hypergrad.testing.GRID`` (sgd, momentum, nesterov, adam, adamw, rmsprop,
rmsprop_centered, adagrad) x every hyperparameter kind that applies (scalar lr, momentum or beta1,
per-tensor weight decay, a schedule, per-example weights, a loss parameter) on a small MLP over
``load_digits``, float64, mini-batches. Errors are norm-wise relative per
hyperparameter group; the last line gives the worst case over the table.

    python experiments/exactness.py [--steps 20] [--json exactness.json] [--device cuda]

``--device cuda`` runs every case on the GPU (still float64, where TF32 never applies);
``--optimizers``/``--kinds`` run a part of the grid (the GPU suite's dry run).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hypergrad.testing import GRID, KINDS, OPTIMIZERS, digits_case, hypergradcheck


def check_case(opt: str, kind: str, label: str, args: argparse.Namespace,
               **case: object) -> dict[str, object]:
    """Run every method on one case; print and return its row."""
    t = time.perf_counter()
    problem = digits_case(opt, kind, steps=args.steps, n_train=args.n_train,
                          windows=args.windows, device=args.device,
                          **case)  # type: ignore[arg-type]
    rep = hypergradcheck(problem, raise_exception=False)
    row = {"optimizer": opt, "kind": label, "K": problem.num_hyperparams,
           **{k: rep.max(k) for k in WORST}, "seconds": time.perf_counter() - t}
    print(f"{opt:<17}{label:<15}{row['K']:>4}{row['fwd_vs_rev']:>12.2e}"
          f"{row['fwd_vs_fd']:>12.2e}{row['strategies']:>12.2e}{row['seconds']:>7.1f}",
          flush=True)
    return row


WORST = ("fwd_vs_rev", "fwd_vs_fd", "strategies")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="inner steps T (>= 20 for the claim)")
    ap.add_argument("--windows", type=int, default=4, help="schedule windows (>= 3)")
    ap.add_argument("--n-train", type=int, default=64, help="training examples (K of per_example)")
    ap.add_argument("--json", default=None, help="also write the table here")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    ap.add_argument("--optimizers", nargs="+", default=None, choices=OPTIMIZERS,
                    metavar="OPTIMIZER", help=f"a subset of {OPTIMIZERS}")
    ap.add_argument("--kinds", nargs="+", default=None, choices=KINDS, metavar="KIND",
                    help=f"a subset of {KINDS}")
    args = ap.parse_args()
    if args.json and not Path(args.json).parent.is_dir():  # found after the whole grid ran
        ap.error(f"--json {args.json}: no folder {Path(args.json).parent}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"exactness: --device {args.device}, but torch {torch.__version__} "
                         f"sees no CUDA device.")
    optimizers, kinds = args.optimizers or OPTIMIZERS, args.kinds or KINDS
    rows: list[dict[str, object]] = []
    worst = dict.fromkeys(WORST, 0.0)
    t0 = time.perf_counter()
    print(f"{'optimizer':<17}{'kind':<15}{'K':>4}{'fwd_vs_rev':>12}{'fwd_vs_fd':>12}"
          f"{'strategies':>12}{'secs':>7}")
    for opt in optimizers:
        for kind in kinds:
            if kind == "momentum" and GRID[opt].momentum is None:
                print(f"{opt:<17}{kind:<15}{'':>4}{f'n/a ({opt} has no momentum)':>36}")
                continue
            rows.append(check_case(opt, kind, kind, args))
    # BatchNorm: running statistics are state with tangents; validation in eval mode reads them
    for opt, val_mode in (("momentum", "eval"), ("momentum", "train"), ("adam", "eval")):
        if opt not in optimizers or "lr" not in kinds:
            continue
        rows.append(check_case(opt, "lr", f"lr+bn/{val_mode}", args, batchnorm=True,
                               val_mode=val_mode))
    for k in WORST:
        worst[k] = max((float(r[k]) for r in rows), default=0.0)  # type: ignore[arg-type]
    print(f"{len(rows)} cases, T={args.steps}, float64, {args.device}, "
          f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "worst": worst, "steps": args.steps,
                       "device": args.device}, fh, indent=1)
    print(f"max_rel_err fwd_vs_rev={worst['fwd_vs_rev']:.2e} fwd_vs_fd={worst['fwd_vs_fd']:.2e} "
          f"strategies={worst['strategies']:.2e}")


if __name__ == "__main__":
    main()
