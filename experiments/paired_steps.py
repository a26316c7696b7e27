"""Do one hypergradient's steps hold up in other batch orders? (issue 26, the teacher task)

At a development tuning seed of the long-horizon study's teacher task (:mod:`horizon_schedules`,
T = 5000): the cosine recipe's grid picks its peak learning rate (as the ``recipe`` contender
does), and the recipe is put on the study's 10 windows (each window the recipe's mean learning
rate over its steps; momentum and weight decay the recipe's). Every point is then judged in
three batch orders the tuning never saw (the tuning seed's initial weights, plain SGD, the
validation loss): the recipe, its windowed version, and steps of 0.1 and 0.3 (in the raw, log
coordinates, the largest entry of the direction) along the negative hypergradient of the
windowed version, taken by forward mode in the tuning seed's own batch order and in a new one.
Paired: every point in the same three orders, so the differences are not the orders' noise.

    python experiments/paired_steps.py --seeds 10 11 \
        --out experiments/results/paired_steps_teacher.json
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

ORDERS = (7000, 7001, 7002)
"""The batch orders (``batch_seed`` of :meth:`horizon_schedules.Study.train`) every point is
judged in."""
GRADIENT_ORDERS = (None, 8001)
"""The batch orders the hypergradients are taken in: the tuning seed's own (``None``), a new one."""
STEPS = (0.1, 0.3)


def windowed(st: hs.Study, spec: dict[str, Any]) -> list[float]:
    """The recipe's mean learning rate over each of the study's windows (the steps each
    window covers: :meth:`hypergrad.Schedule.steps`, the rule training reads them by)."""
    lr = [hs.spec_values(spec, t, st.T)["lr"] for t in range(st.T)]
    spans = hg.Schedule("lr", 1.0, windows=st.windows).steps(st.T)
    return [statistics.mean(lr[a:b + 1]) for a, b in spans]


def run_seed(st: hs.Study, seed: int) -> dict[str, Any]:
    def judged(spec: dict[str, Any]) -> list[float]:
        return [st.train(seed, spec, batch_seed=b)["val"] for b in ORDERS]

    rec = hs.tune_recipe(st, seed)
    out: dict[str, Any] = {"seed": seed, "recipe": rec["spec"], "recipe_val_tuning": rec["val"],
                           "recipe_val": judged(rec["spec"])}
    lrs = windowed(st, rec["spec"])
    wspec = {"kind": "windows", "lr": lrs, "momentum": 0.9, "wd": rec["spec"]["wd"]}
    out["windowed_lr"] = lrs
    out["windowed_val"] = base = judged(wspec)
    hps = st.hyperparams(schedule=True, lr0=lrs)  # momentum and decay: the recipe's
    lam = hps.init_raw(torch.float32)
    out["steps"] = []
    for order in GRADIENT_ORDERS:
        p = st.problem(seed, hps, batches=None if order is None else st.batches(order))
        g = hg.ForwardMode().hypergradient(p, lam).grad
        direction = -g / g.abs().max()
        for size in STEPS:
            v = hps.describe(lam + size * direction)
            spec = {"kind": "windows", "lr": list(v["lr"]), "momentum": float(v["momentum"]),
                    "wd": float(v["wd"])}
            val = judged(spec)
            out["steps"].append({"gradient_order": order, "step": size,
                                 "hypergradient": g.tolist(), "val": val,
                                 "minus_windowed": [a - b for a, b in zip(val, base)]})
            print(f"seed {seed} hypergradient in order {order} step {size}: val minus the "
                  f"windowed recipe's {[round(a - b, 4) for a, b in zip(val, base)]}",
                  flush=True)
    print(f"seed {seed}: recipe {statistics.mean(out['recipe_val']):.4f}, windowed "
          f"{statistics.mean(base):.4f} (mean validation loss over {len(ORDERS)} new orders)",
          flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[10, 11])
    ap.add_argument("--T", type=int, default=5000)
    ap.add_argument("--out", default=None, help="JSON file")
    args = ap.parse_args(argv)
    hc.one_thread()
    st = hs.Study("teacher", T=args.T, budget=200.0)
    rows = [run_seed(st, s) for s in args.seeds]
    steps = [s for r in rows for s in r["steps"]]
    worse = sum(statistics.mean(s["minus_windowed"]) > 0 for s in steps)
    better_windows = sum(w < r for row in rows
                         for w, r in zip(row["windowed_val"], row["recipe_val"]))
    summary = {"T": args.T, "seeds": args.seeds, "orders": list(ORDERS),
               "steps_worse_on_average": worse, "steps": len(steps),
               "windowed_better_than_recipe": better_windows,
               "judgements": len(rows) * len(ORDERS)}
    print(f"paired_steps steps_worse={worse}/{len(steps)} "
          f"windowed_better={better_windows}/{len(rows) * len(ORDERS)}")
    payload = {"summary": summary, "rows": rows, "machine": hc.machine()}
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=1))
    return payload


if __name__ == "__main__":
    main()
