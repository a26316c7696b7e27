"""Forward mode vs unrolled reverse mode on the same problem, T in {10, 100, 1000}.

For each horizon: both hypergradients side by side (max relative difference), wall time and peak
memory of each (memory in use in malloc, sampled; see hypergrad.measure). Forward memory stays
flat in T; reverse stores T states.

    python experiments/compare.py [--steps 10 100 1000] [--json compare.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import hypergrad as hg
from hypergrad.alloc import tune_malloc
from hypergrad.measure import measure
from hypergrad.testing import digits_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if min(args.steps) < 1 or args.hidden < 1:  # a library traceback, not the flag
        ap.error(f"--steps {args.steps} and --hidden {args.hidden} must be >= 1")
    if args.json and not Path(args.json).resolve().parent.is_dir():  # found after the run
        ap.error(f"--json {args.json}: its folder does not exist")
    tune_malloc()
    rows = []
    print(f"{'T':>6}{'K':>4}{'max_rel_diff':>14}{'fwd_s':>9}{'rev_s':>9}{'fwd_MiB':>10}"
          f"{'rev_MiB':>10}")
    for t in args.steps:
        # an MLP (64-hidden-10) in float64, 4-window learning-rate schedule (one window per step
        # below T = 4: a window no step reads is refused), Nesterov momentum
        w = min(4, t)
        problem = digits_case("nesterov", "schedule", steps=t, n_train=512, batch_size=64,
                              hidden=args.hidden, n_val=256, windows=w)
        lam = problem.init_raw()
        warm = digits_case("nesterov", "schedule", steps=4, windows=w)
        hg.ForwardMode().hypergradient(warm, lam)
        fwd, mf = measure(lambda: hg.ForwardMode().hypergradient(problem, lam))
        rev, mr = measure(lambda: hg.ReverseMode().hypergradient(problem, lam))
        diff = float(((fwd.grad - rev.grad).abs() / rev.grad.abs().clamp_min(1e-300)).max())
        row = {"T": t, "K": problem.num_hyperparams, "max_rel_diff": diff,
               "forward": fwd.grad.tolist(), "reverse": rev.grad.tolist(),
               "forward_seconds": mf["seconds"], "reverse_seconds": mr["seconds"],
               "forward_peak_mib": mf["peak_extra_bytes"] / 2**20,
               "reverse_peak_mib": mr["peak_extra_bytes"] / 2**20}
        rows.append(row)
        print(f"{t:>6}{row['K']:>4}{diff:>14.2e}{mf['seconds']:>9.2f}{mr['seconds']:>9.2f}"
              f"{row['forward_peak_mib']:>10.1f}{row['reverse_peak_mib']:>10.1f}", flush=True)
        print(f"{'':>6}    forward {[f'{v:.6e}' for v in row['forward']]}")
        print(f"{'':>6}    reverse {[f'{v:.6e}' for v in row['reverse']]}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float64")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
