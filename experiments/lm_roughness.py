"""Does the exact hypergradient predict what a step of useful length does on the long-horizon
study's language model (issue 26)? At the study's starting point (``forward_scales``'
hyperparameters: 10 learning-rate windows, a factor per layer group, a weight decay per layer
group, both betas; T = 1000 AdamW steps), forward mode's hypergradient of the validation loss
against central differences of the same loss (the same initial weights, batches and dropout
draws: the function the hypergradient differentiates) with steps ``h`` from 1e-3 to 0.3 in the
raw (log / logit) coordinates, one entry at a time.

If the validation loss is smooth at the scale of an outer step, the differences agree with the
hypergradient at every ``h``; if it is rough (a long unrolled run's known pathology), they agree
at small ``h`` only and the hypergradient does not tell a step of useful length which way to go.

    python experiments/lm_roughness.py [--seeds 0 1] [--entries ...] [--quick]
    python experiments/lm_roughness.py --seeds 0 1 --T 1000 --mu 0.99 0.997   # discounted

writes ``experiments/results/lm_roughness.json`` (resumable: one record per seed) and prints a
table and a last line ``lm_roughness T=<T> agree_small=<a>/<n> agree_large=<b>/<n>`` (at the
longest horizon run, how many (seed, entry) pairs have the sign of the hypergradient at the
smallest h, and at every h >= 0.1).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from horizon_common import resumed_rows  # noqa: E402
from horizon_lm import lm_study  # noqa: E402

import hypergrad as hg  # noqa: E402

STEPS = (1e-3, 1e-2, 3e-2, 0.1, 0.3)
ENTRIES = ("lr[0]", "lr[5]", "lr[embed]", "lr[mlp]", "lr[head]", "b1")
QUICK_ENTRIES = ("lr[0]", "lr[3]", "lr[embed]", "lr[mlp]", "lr[head]", "b1")
"""``--quick``'s default: its schedule has 4 windows (lr[5] stopped it at once)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--entries", nargs="+", default=None,
                    help=f"default: {' '.join(ENTRIES)} ({' '.join(QUICK_ENTRIES)} with --quick)")
    ap.add_argument("--steps", type=float, nargs="+", default=list(STEPS))
    ap.add_argument("--T", type=int, nargs="+", default=None,
                    help="inner steps (default: the study's); several: each in turn, for the "
                         "roughness against the horizon")
    ap.add_argument("--smooth", type=int, default=0, metavar="N",
                    help="instead: the hypergradient averaged over N points drawn around the "
                         "start (raw coordinates plus --sigma times a standard normal draw, "
                         "every entry at once): the slope a step of about sigma sees; written "
                         "to <out>_smoothed.json, compared there with the central differences")
    ap.add_argument("--sigma", type=float, default=0.1)
    ap.add_argument("--mu", type=float, nargs="+", default=None,
                    help="instead: the discounted hypergradient of MARTHE(mu) at the end of the "
                         "run (tangents multiplied by mu before every step: an effect older than "
                         "about 1/(1-mu) steps fades), per mu, beside the recorded central "
                         "differences; written to <out>_mu.json")
    ap.add_argument("--quick", action="store_true", help="the study's smoke size")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                         "lm_roughness.json"))
    a = ap.parse_args(argv)
    if a.entries is None:
        a.entries = list(QUICK_ENTRIES if a.quick else ENTRIES)
    if a.T is not None and min(a.T) < 1:
        ap.error(f"--T {' '.join(map(str, a.T))}: every horizon must be an int >= 1")
    torch.set_num_threads(1)
    out = Path(a.out)
    settings = {"quick": a.quick, "steps": a.steps, "entries": a.entries}
    rows = resumed_rows(out, "rows", settings)
    done = {(r["seed"], r["T"]) for r in rows}
    horizons = a.T or [lm_study(a.quick).T]
    if a.smooth:
        return smoothed(a, horizons, out.with_name(out.stem + "_smoothed.json"), rows)
    if a.mu:
        return discounted(a, horizons, out.with_name(out.stem + "_mu.json"), rows)
    for seed, T in [(s, T) for T in horizons for s in a.seeds]:
        if (seed, T) in done:
            continue
        p, index = _problem(a, seed, T)
        lam0 = p.init_raw()
        t0 = time.process_time()
        hgrad = hg.ForwardMode().hypergradient(p, lam0)
        hg_s = time.process_time() - t0

        def val(lam: torch.Tensor) -> float:
            return float(hg.FiniteDifference().objective_at(p, lam))

        base = val(lam0)
        row: dict[str, Any] = {"seed": seed, "T": T, "val": base,
                               "hypergradient_cpu_s": hg_s, "entries": {}}
        for e in a.entries:
            i = index[e]
            diffs = {}
            for h in a.steps:
                up, down = lam0.clone(), lam0.clone()
                up[i] += h
                down[i] -= h
                diffs[str(h)] = (val(up) - val(down)) / (2 * h)
            row["entries"][e] = {"hypergradient": float(hgrad.grad[i]), "central": diffs}
            print(f"T {T} seed {seed} {e:10s} hypergradient {float(hgrad.grad[i]):+.4f}  " +
                  "  ".join(f"h={h:g}: {d:+.4f}" for h, d in
                            zip(a.steps, diffs.values())), flush=True)
        rows.append(row)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**settings, "rows": rows}, indent=1))
    table(rows)
    small, large, n = summary([r for r in rows if r["T"] == max(horizons)], a.steps)
    print(f"lm_roughness T={max(horizons)} agree_small={small}/{n} agree_large={large}/{n}")
    return 0


def _problem(a: argparse.Namespace, seed: int, T: int) -> tuple[Any, dict[str, int]]:
    st = lm_study(a.quick)
    st.T = T
    p = st.task(seed, st.hyperparams(scales=True)).problem
    index = _index(list(p.hyperparams.named(p.hyperparams.describe(p.init_raw()), T)))
    missing = [e for e in a.entries if e not in index]
    if missing:
        raise SystemExit(f"lm_roughness: --entries {missing} are not entries of the study's "
                         f"hyperparameters; choose from {sorted(index)}")
    return p, index


def smoothed(a: argparse.Namespace, horizons: list[int], path: Path,
             rows: list[dict[str, Any]]) -> int:
    """``--smooth N``: per (seed, T) the mean of N hypergradients at points drawn around the
    start (seeded by the seed), per entry beside its central differences where ``rows`` has
    them; one record per (seed, T), resumable."""
    got = resumed_rows(path, "rows", {"quick": a.quick, "entries": a.entries})
    for seed, T in [(s, T) for T in horizons for s in a.seeds]:
        if any((r["seed"], r["T"], r["sigma"], r["samples"]) == (seed, T, a.sigma, a.smooth)
               for r in got):
            continue
        p, index = _problem(a, seed, T)
        lam0 = p.init_raw()
        g = torch.Generator().manual_seed(10_000 + seed)
        each: dict[str, list[float]] = {e: [] for e in a.entries}
        for _ in range(a.smooth):
            lam = lam0 + a.sigma * torch.randn(lam0.shape, generator=g, dtype=lam0.dtype)
            grad = hg.ForwardMode().hypergradient(p, lam).grad
            for e in a.entries:
                each[e].append(float(grad[index[e]]))
        got.append({"seed": seed, "T": T, "sigma": a.sigma, "samples": a.smooth,
                    "mean": {e: sum(v) / len(v) for e, v in each.items()}, "each": each})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"quick": a.quick, "entries": a.entries, "rows": got},
                                   indent=1))
    print(f"{'T':>5s} {'seed':>4s} {'entry':12s} {'at start':>9s} {'smoothed':>9s} "
          f"{'difference h=0.1':>17s} {'h=0.3':>8s}")
    for r in got:
        base = next((b for b in rows if (b["seed"], b["T"]) == (r["seed"], r["T"])), None)
        for e, m in r["mean"].items():
            c = base["entries"].get(e) if base else None
            cells = (f"{c['hypergradient']:+9.4f}", f"{c['central'].get('0.1', math.nan):+17.4f}",
                     f"{c['central'].get('0.3', math.nan):+8.4f}") if c else ("", "", "")
            print(f"{r['T']:5d} {r['seed']:4d} {e:12s} {cells[0]:>9s} {m:+9.4f} {cells[1]:>17s} "
                  f"{cells[2]:>8s}")
    return 0


def discounted(a: argparse.Namespace, horizons: list[int], path: Path,
               rows: list[dict[str, Any]]) -> int:
    """``--mu M..``: per (seed, T, mu) MARTHE(mu)'s hypergradient at the end of the run at the
    start, per entry, compared with the central differences ``rows`` has for that (seed, T);
    one record per (seed, T, mu), resumable. Last line: at the longest horizon, per mu, how
    many (seed, entry) pairs have the sign of the differences at every h >= 0.1, and the median
    ratio of the difference at h = 0.1 to the hypergradient."""
    got = resumed_rows(path, "rows", {"quick": a.quick, "entries": a.entries})
    for mu, seed, T in [(m, s, T) for m in a.mu for T in horizons for s in a.seeds]:
        if any((r["seed"], r["T"], r["mu"]) == (seed, T, mu) for r in got):
            continue
        p, index = _problem(a, seed, T)
        t0 = time.process_time()
        grad = hg.MARTHE(mu=mu).hypergradient(p, p.init_raw()).grad
        got.append({"seed": seed, "T": T, "mu": mu, "cpu_s": time.process_time() - t0,
                    "grad": {e: float(grad[index[e]]) for e in a.entries}})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"quick": a.quick, "entries": a.entries, "rows": got},
                                   indent=1))
    print(f"{'T':>5s} {'seed':>4s} {'mu':>6s} {'entry':10s} {'mu=1':>9s} {'discounted':>10s} "
          f"{'h=0.1':>8s} {'h=0.3':>8s}")
    for r in sorted(got, key=lambda r: (r["T"], r["mu"], r["seed"])):
        base = next((b for b in rows if (b["seed"], b["T"]) == (r["seed"], r["T"])), None)
        for e, g in r["grad"].items():
            c = base["entries"].get(e) if base else None
            cells = ((f"{c['hypergradient']:+9.4f}", f"{c['central'].get('0.1', math.nan):+8.4f}",
                      f"{c['central'].get('0.3', math.nan):+8.4f}") if c else ("", "", ""))
            print(f"{r['T']:5d} {r['seed']:4d} {r['mu']:6g} {e:10s} {cells[0]:>9s} {g:+10.4f} "
                  f"{cells[1]:>8s} {cells[2]:>8s}")
    T = max(horizons)
    parts = []
    for mu in a.mu:
        # the discounted hypergradients in the recorded rows' place: summary's count
        pairs = [{"entries": {e: {"hypergradient": g, "central": base["entries"][e]["central"]}
                              for e, g in r["grad"].items()}}
                 for r in got if (r["T"], r["mu"]) == (T, mu)
                 for base in rows if (base["seed"], base["T"]) == (r["seed"], T)]
        _, agree, n = summary(pairs, a.steps)
        ratios = [c["central"]["0.1"] / c["hypergradient"] for p in pairs
                  for c in p["entries"].values() if c["hypergradient"] and "0.1" in c["central"]]
        med = statistics.median(ratios) if ratios else math.nan
        parts.append(f"mu={mu:g}:agree_large={agree}/{n},median_ratio={med:.2f}")
    print(f"lm_roughness_mu T={T} " + " ".join(parts))
    return 0


def table(rows: list[dict[str, Any]]) -> None:
    """Per T and entry, over the seeds: the hypergradient and each step's central difference,
    both as their ratio to the hypergradient (1: the difference agrees)."""
    for T in sorted({r["T"] for r in rows}):
        rs = [r for r in rows if r["T"] == T]
        steps = list(rs[0]["entries"][next(iter(rs[0]["entries"]))]["central"])
        print(f"\nT = {T}, seeds {[r['seed'] for r in rs]}: central difference / hypergradient")
        print(f"{'entry':12s}" + "".join(f"{'h=' + h:>14s}" for h in steps))
        for e in rs[0]["entries"]:
            cells = []
            for h in steps:
                q = [r["entries"][e]["central"][h] / r["entries"][e]["hypergradient"]
                     for r in rs if e in r["entries"] and r["entries"][e]["hypergradient"]]
                cells.append(" ".join(f"{x:+.2f}" for x in q))
            print(f"{e:12s}" + "".join(f"{c:>14s}" for c in cells))


def _index(named: list[str]) -> dict[str, int]:
    """Raw index of each entry label: the names ``HyperParams.named`` gives (``lr[steps a-b]``
    per window, ``lr[group]`` per factor, ``wd[group]``, ``b1``), windows renamed ``lr[w]``."""
    out: dict[str, int] = {}
    w = 0
    for i, n in enumerate(named):
        if n.startswith("lr[steps"):
            out[f"lr[{w}]"] = i
            w += 1
        else:
            out[n] = i
    return out


def summary(rows: list[dict[str, Any]], steps: list[float]) -> tuple[int, int, int]:
    """(pairs whose difference at the smallest step has the hypergradient's sign, pairs whose
    differences at every step >= 0.1 have it, pairs)."""
    small = large = n = 0
    lo = str(min(steps))
    for r in rows:
        for e in r["entries"].values():
            g, c = e["hypergradient"], e["central"]
            n += 1
            small += math.copysign(1, c[lo]) == math.copysign(1, g)
            big = [v for h, v in c.items() if float(h) >= 0.1]
            large += bool(big) and all(math.copysign(1, v) == math.copysign(1, g) for v in big)
    return small, large, n


if __name__ == "__main__":
    raise SystemExit(main())
