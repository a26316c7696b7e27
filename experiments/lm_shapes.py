"""Which learning-rate shapes of AdamW reach schedule-free AdamW on the long-horizon study's
language model (issue 26: ``lm_forward_vs_recipe``)? A ceiling, not a contender: every shape
at every peak learning rate of the study's grid is trained at the retraining seeds and judged
on the test split, so each family's row is its best peak chosen with hindsight.

Shapes (AdamW with the recipe's betas 0.9 / 0.999, weight decay 0.01, clipping at 1.0):

- ``cosine``: the study's recipe (5% linear warmup, cosine to 0);
- ``linear``: 5% linear warmup, then linear decay to 0;
- ``stairs``: the linear decay as the forward contender's 10 equal windows hold it (window w
  at ``peak * (1 - w / 10)``; the first window, the warmup, at ``peak / 2``);
- ``constant``: 5% warmup, then the peak;
- ``long_warmup``: 25% linear warmup, cosine to a tenth of the peak (where the study's TPE
  contender ended at every seed: warmups of 23-29%, final learning rates 10-38% of the peak);
- ``long_warmup_b95``: the same with AdamW's beta2 at 0.95 (language models' usual setting; the
  forward contender tunes both betas, TPE neither);
- ``schedulefree``: schedule-free AdamW (the study's ``schedulefree`` contender) at that lr.

If a windowed shape reaches schedule-free's test bits per character, the forward contender's
10 windows can hold a schedule as good as schedule-free's averaged point, and what it lacks is
finding it within the budget; if none does, the gap is the family's.

    python experiments/lm_shapes.py [--peaks 0.0016 0.0032 ...] [--seeds 100 101 102]

writes ``experiments/results/lm_shapes.json`` (one record per finished run, resumable) and
prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from horizon_common import resumed_rows  # noqa: E402
from horizon_lm import LMStudy, _recipe, lm_study, train_torch  # noqa: E402

import hypergrad as hg  # noqa: E402

SHAPES = ("cosine", "linear", "stairs", "constant", "long_warmup", "long_warmup_b95",
          "schedulefree")


def spec_of(st: LMStudy, shape: str, peak: float) -> dict[str, Any] | None:
    """The run's schedule as :func:`horizon_lm.lm_values` reads it (``None``: schedule-free)."""
    if shape == "schedulefree":
        return None
    if shape == "cosine":
        return _recipe(st, peak)
    if shape.startswith("long_warmup"):
        spec = _recipe(st, peak, warmup=0.25, final=peak / 10)
        return {**spec, "b2": 0.95} if shape == "long_warmup_b95" else spec
    if shape == "stairs":
        w = st.windows
        lr = [peak / 2] + [peak * (1 - i / w) for i in range(1, w)]
        return {**_recipe(st, peak), "kind": "windows", "lr": lr}
    return {**_recipe(st, peak), "kind": "recipe_" + shape}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peaks", type=float, nargs="+",
                    default=[1e-4 * 2**i for i in range(4, 10)])
    ap.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102])
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--scales", type=float, nargs="+", default=None, metavar="FACTOR",
                    help="instead of the shapes: the ``stairs`` shape at each --peaks value with "
                         "one layer group's learning rate times each FACTOR (the other groups "
                         "at 1), every group in turn: how far a tuned factor per layer group "
                         "(``Schedule(..., scales=...)``, the ``forward_scales`` contender) "
                         "reaches past the windows alone; writes lm_shapes_scales.json")
    ap.add_argument("--combos", nargs="+", default=[], metavar="G=F,G=F",
                    help="with --scales: also these combinations of factors (e.g. "
                         "embed=2,mlp=0.25), one cell each")
    ap.add_argument("--quick", action="store_true", help="the study's smoke size")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "lm_shapes.json"))
    a = ap.parse_args(argv)
    st = lm_study(a.quick)
    if a.scales is not None:
        return scale_grid(st, a)
    out = Path(a.out)
    runs = resumed_rows(out, "runs", {"T": st.T, "quick": a.quick})
    done = {(r["shape"], r["peak"], r["seed"]) for r in runs}
    tasks: dict[int, hg.Task] = {}
    for seed in a.seeds:
        for shape in a.shapes:
            for peak in a.peaks:
                if (shape, peak, seed) in done:
                    continue
                t0 = time.process_time()
                spec = spec_of(st, shape, peak)
                got = (train_torch(st, seed, schedulefree_lr=peak, tasks=tasks) if spec is None
                       else train_torch(st, seed, spec, tasks=tasks))
                runs.append({"shape": shape, "peak": peak, "seed": seed,
                             "cpu_s": time.process_time() - t0, **got})
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps({"T": st.T, "quick": a.quick, "runs": runs},
                                          indent=1))
                print(f"{shape:12s} peak {peak:.4g} seed {seed}: test {got['test_bpc']:.4f} "
                      f"val {got['val_bpc']:.4f} bits/char", flush=True)
    table(runs, a.seeds)
    return 0


def scale_grid(st: LMStudy, a: argparse.Namespace) -> int:
    """The ``stairs`` shape at each peak, one layer group's learning rate scaled at a time
    (``--scales``); the table: per (group, factor) the mean test and validation bits per
    character over the seeds and the ratio to the unscaled shape, paired by seed."""
    out = Path(a.out).with_name(Path(a.out).stem + "_scales.json")
    runs = resumed_rows(out, "runs", {"T": st.T, "quick": a.quick})
    done = {(r["peak"], r["group"], r["factor"], r["seed"]) for r in runs}
    tasks: dict[int, hg.Task] = {}
    cells: list[tuple[float, str | None, float]] = [
        (peak, g, f) for peak in a.peaks for g in [None, *st.groups()]
        for f in ([1.0] if g is None else a.scales)]
    cells += [(peak, c, 1.0) for peak in a.peaks for c in a.combos]
    for seed in a.seeds:
        for peak, g, f in cells:
            if (peak, g, f, seed) in done:
                continue
            t0 = time.process_time()
            spec = spec_of(st, "stairs", peak)
            assert spec is not None
            if g is not None and "=" in g:  # a combination (--combos)
                spec["lr_scale"] = {k: float(v) for k, v in
                                    (kv.split("=") for kv in g.split(","))}
            elif g is not None:
                spec["lr_scale"] = {g: f}
            got = train_torch(st, seed, spec, tasks=tasks)
            runs.append({"peak": peak, "group": g, "factor": f, "seed": seed,
                         "cpu_s": time.process_time() - t0, **got})
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"T": st.T, "quick": a.quick, "runs": runs}, indent=1))
            print(f"stairs peak {peak:.4g} {g or '-'} x{f:g} seed {seed}: test "
                  f"{got['test_bpc']:.4f} val {got['val_bpc']:.4f} bits/char", flush=True)
    print(f"\n{'peak':>8s} {'group':10s} {'factor':>6s} {'test bpc':>9s} {'val bpc':>9s} "
          f"{'test / unscaled':>16s}")
    for peak, g, f in cells:
        rs = {r["seed"]: r for r in runs if (r["peak"], r["group"], r["factor"]) == (peak, g, f)
              and r["seed"] in a.seeds}
        base = {r["seed"]: r for r in runs if (r["peak"], r["group"]) == (peak, None)
                and r["seed"] in a.seeds}
        if len(rs) < len(a.seeds) or len(base) < len(a.seeds):
            continue
        test = sum(r["test_bpc"] for r in rs.values()) / len(rs)
        val = sum(r["val_bpc"] for r in rs.values()) / len(rs)
        ratios = [rs[s]["test_bpc"] / base[s]["test_bpc"] for s in a.seeds]
        m = sum(ratios) / len(ratios)
        se = (sum((x - m) ** 2 for x in ratios) / max(len(ratios) - 1, 1) / len(ratios)) ** 0.5
        print(f"{peak:8.4g} {g or '-':10s} {f:6g} {test:9.4f} {val:9.4f} "
              f"{m:10.4f} ± {se:.4f}")
    return 0


def table(runs: list[dict[str, Any]], seeds: list[int]) -> None:
    """Per shape and peak the mean test bits per character over ``seeds``; per shape its best
    peak by test (a ceiling, with hindsight), its validation beside it."""
    print(f"\n{'shape':12s} {'peak':>8s} {'test bpc':>9s} {'val bpc':>9s}")
    best: dict[str, tuple[float, float, float]] = {}
    for shape in SHAPES:
        for peak in sorted({r["peak"] for r in runs if r["shape"] == shape}):
            rs = [r for r in runs if r["shape"] == shape and r["peak"] == peak
                  and r["seed"] in seeds]
            if len(rs) < len(seeds):
                continue
            test = sum(r["test_bpc"] for r in rs) / len(rs)
            val = sum(r["val_bpc"] for r in rs) / len(rs)
            print(f"{shape:12s} {peak:8.4g} {test:9.4f} {val:9.4f}")
            if math.isfinite(test) and (shape not in best or test < best[shape][1]):
                best[shape] = (peak, test, val)
    print("\nbest peak per shape (by test, with hindsight):")
    for shape, (peak, test, val) in sorted(best.items(), key=lambda kv: kv[1][1]):
        print(f"  {shape:12s} peak {peak:.4g}: test {test:.4f}, val {val:.4f}")


if __name__ == "__main__":
    raise SystemExit(main())
