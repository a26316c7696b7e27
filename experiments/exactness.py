"""Exactness table: forward vs reverse vs central finite differences vs every HVP strategy.

Every optimizer of ``hypergrad.testing.GRID`` (sgd, momentum, nesterov, adam, adamw, rmsprop,
rmsprop_centered, adagrad) x every hyperparameter kind that applies (scalar lr, momentum or beta1,
per-tensor weight decay, a schedule, per-example weights, a loss parameter) on a small MLP over
``load_digits``, float64, mini-batches. Errors are norm-wise relative per
hyperparameter group; the last line gives the worst case over the table.

    python experiments/exactness.py [--steps 20] [--json exactness.json]
"""

from __future__ import annotations

import argparse
import json
import time

from hypergrad.testing import GRID, KINDS, OPTIMIZERS, digits_case, hypergradcheck


def check_case(opt: str, kind: str, label: str, args: argparse.Namespace,
               **case: object) -> dict[str, object]:
    """Run every method on one case; print and return its row."""
    t = time.perf_counter()
    problem = digits_case(opt, kind, steps=args.steps, n_train=args.n_train,
                          windows=args.windows, **case)  # type: ignore[arg-type]
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
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    worst = dict.fromkeys(WORST, 0.0)
    t0 = time.perf_counter()
    print(f"{'optimizer':<17}{'kind':<15}{'K':>4}{'fwd_vs_rev':>12}{'fwd_vs_fd':>12}"
          f"{'strategies':>12}{'secs':>7}")
    for opt in OPTIMIZERS:
        for kind in KINDS:
            if kind == "momentum" and GRID[opt].momentum is None:
                print(f"{opt:<17}{kind:<15}{'':>4}{f'n/a ({opt} has no momentum)':>36}")
                continue
            rows.append(check_case(opt, kind, kind, args))
    # BatchNorm: running statistics are state with tangents; validation in eval mode reads them
    for opt, val_mode in (("momentum", "eval"), ("momentum", "train"), ("adam", "eval")):
        rows.append(check_case(opt, "lr", f"lr+bn/{val_mode}", args, batchnorm=True,
                               val_mode=val_mode))
    for k in WORST:
        worst[k] = max(float(r[k]) for r in rows)  # type: ignore[arg-type]
    print(f"{len(rows)} cases, T={args.steps}, float64, {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "worst": worst, "steps": args.steps}, fh, indent=1)
    print(f"max_rel_err fwd_vs_rev={worst['fwd_vs_rev']:.2e} fwd_vs_fd={worst['fwd_vs_fd']:.2e} "
          f"strategies={worst['strategies']:.2e}")


if __name__ == "__main__":
    main()
