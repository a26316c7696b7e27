"""Development check of the space-filling start's layout (``hypergrad.run.trainer.SHARED_START``)
on a schedule problem outside the suite's evaluation half: the long-horizon study's teacher MLP
(:mod:`horizon_schedules`) at a shorter horizon, development tuning seeds (not the study's),
the Trainer's defaults (``forward_defaults``) with one level per schedule (``shared``, the
default) or a level per window (``independent``); each result retrained on 3 fresh seeds.

    python experiments/start_dev.py --variant shared --out experiments/results/start_dev_shared.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import horizon_schedules as hs  # noqa: E402

from hypergrad.run import trainer as trainer_module  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=("shared", "independent"), default="shared")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10, 16)))
    ap.add_argument("--T", type=int, default=1000)
    ap.add_argument("--budget", type=float, default=40.0, help="CPU seconds per tuning seed")
    ap.add_argument("--out", default=None, help="JSON file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.variant == "independent":
        trainer_module.SHARED_START = ()
    st = hs.Study("teacher", T=args.T, budget=args.budget)
    rows = []
    for seed in args.seeds:
        got = hs.tune_forward(st, seed, defaults=True)
        test = statistics.mean(st.train(s, got["spec"])["test"] for s in (200, 201, 202))
        rows.append({"seed": seed, "val": got["val"], "test": test, "lr": got["spec"]["lr"],
                     "hypergradients": got["info"]["hypergradients"],
                     "plain_runs": got["info"]["plain_runs"]})
        print(f"seed {seed}: val {got['val']:.4f} test {test:.4f}", flush=True)
    summary = {"variant": args.variant, "T": args.T, "budget_cpu_s": args.budget,
               "seeds": args.seeds, "mean_test": statistics.mean(r["test"] for r in rows),
               "mean_val": statistics.mean(r["val"] for r in rows)}
    print(f"start_dev {args.variant} mean_test={summary['mean_test']:.4f} "
          f"mean_val={summary['mean_val']:.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
