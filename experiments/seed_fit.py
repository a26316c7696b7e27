"""What a tuned point of the long-horizon study's teacher task fits at its tuning seed: the
initial weights or the mini-batch order. Each contender's result (from
``experiments/results/long_horizon_records.jsonl``) is trained again with plain PyTorch SGD at
its tuning seed's initialisation and new batch orders, and at new initialisations with the
tuning seed's batch order; the validation loss of each, beside the tuning and the retrained
(both new) ones.

    python experiments/seed_fit.py --out experiments/results/seed_fit_teacher.json
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
import horizon_schedules as hs  # noqa: E402

RECORDS = Path(__file__).resolve().parent / "results" / "long_horizon_records.jsonl"


def val_after(st: hs.Study, spec: dict[str, Any], init_seed: int, batch_seed: int) -> float:
    """The validation loss after training ``spec`` from ``net(init_seed)`` on the batches of
    ``batch_seed``."""
    return st.train(init_seed, spec, batch_seed=batch_seed)["val"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                    help="tuning seeds of the records")
    ap.add_argument("--contenders", nargs="+", default=["forward_defaults", "forward", "tpe",
                                                        "recipe"])
    ap.add_argument("--records", default=str(RECORDS))
    ap.add_argument("--out", default=None, help="JSON file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    st = hs.studies(False)["teacher"]
    rows = [json.loads(line) for line in Path(args.records).read_text().splitlines()]
    have = {(r.get("contender"), r.get("seed")) for r in rows if r.get("study") == "teacher"}
    missing = [(c, s) for s in args.seeds for c in args.contenders if (c, s) not in have]
    if missing:  # they were skipped without a word, and an empty result written
        ap.error(f"no teacher record in {args.records} for (contender, seed) {missing[:6]}; "
                 f"the records hold {sorted(have, key=str)[:12]}")
    new = (100, 101, 102)
    out = []
    print(f"{'contender':<17}{'seed':>5}{'tuning':>8}{'again':>8}{'new batches':>13}"
          f"{'new init':>10}{'both new':>10}")
    for seed in args.seeds:
        for c in args.contenders:
            hit = [r for r in rows if r.get("study") == "teacher" and r.get("contender") == c
                   and r.get("seed") == seed]
            if not hit:
                continue
            r = hit[0]
            row = {"contender": c, "seed": seed, "tuning_val": r["val"],
                   "again": val_after(st, r["spec"], seed, seed),
                   "new_batches": statistics.mean(val_after(st, r["spec"], seed, b)
                                                  for b in new),
                   "new_init": statistics.mean(val_after(st, r["spec"], i, seed) for i in new),
                   "both_new": r["val_retrain"]}
            out.append(row)
            print(f"{c:<17}{seed:>5}{row['tuning_val']:>8.4f}{row['again']:>8.4f}"
                  f"{row['new_batches']:>13.4f}{row['new_init']:>10.4f}{row['both_new']:>10.4f}",
                  flush=True)
    for c in args.contenders:  # means over the seeds
        got = [r for r in out if r["contender"] == c]
        if got:
            print(f"{c:<17}{'mean':>5}" + "".join(
                f"{statistics.mean(r[k] for r in got):>{w}.4f}" for k, w in
                (("tuning_val", 8), ("again", 8), ("new_batches", 13), ("new_init", 10),
                 ("both_new", 10))))
    if args.out:
        Path(args.out).write_text(json.dumps({"T": st.T, "retrain_seeds": list(new),
                                              "rows": out}, indent=1))


if __name__ == "__main__":
    main()
