"""Memory of forward mode: flat in the horizon T (against unrolled reverse mode, linear in T), and
chunked against unchunked batched Hessian-vector products at K = 64.

Peak memory is the growth of the process's peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs``) over its size after the problem is built and the code paths are warm,
each configuration in a fresh process: the tuned allocator keeps freed memory, so one process
could not measure several configurations honestly. Times are measured side by side in this
process.

    python experiments/benchmarks/bench_memory.py          # full run (~5 min on 2 cores)
    python experiments/benchmarks/bench_memory.py --quick  # < 2 min
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

import hypergrad as hg  # noqa: E402

HORIZON_MODEL, HORIZON_K = "cnn8", 64


def child(spec: dict[str, Any]) -> dict[str, Any]:
    C.setup()
    if spec["kind"] == "horizon":
        p = C.make_problem(HORIZON_MODEL, HORIZON_K, steps=spec["steps"])
        warm_p = C.make_problem(HORIZON_MODEL, 1, steps=2)  # loads code, keeps little memory
        method: Any = hg.ForwardMode() if spec["method"] == "forward" else hg.ReverseMode()
        in_use: dict[str, Any] = {}

        def run() -> None:  # also the peak of malloc's bytes in use (sampled every 2 ms)
            in_use.update(hg.measure.measure(lambda: method.hypergradient(p, p.init_raw()))[1])

        res = C.child_memory(run, lambda: method.hypergradient(warm_p, warm_p.init_raw()))
        res["in_use_peak_bytes"] = in_use["peak_extra_bytes"]
        return res
    p = C.make_problem(spec["model"], spec["k"])
    warm_p = C.make_problem(spec["model"], 1)
    fm = hg.ForwardMode(C.make_strategy(spec["strategy"]))
    warm = C.forward_stepper(warm_p, warm_p.init_raw(), hg.ForwardMode(hg.hvp.VmapVJP()))

    def run() -> None:
        step = C.forward_stepper(p, p.init_raw(), fm)
        step()
        step()

    res = C.child_memory(run, warm)
    strat = fm.hvp
    s0 = p.initial_state()
    b0 = p.batch(0)
    f = lambda pp, bb, lm: p.train_objective(pp, bb, lm, 0, b0)  # noqa: E731
    res["chunk"] = strat.columns_per_call(f, s0.params, s0.buffers, p.init_raw(), spec["k"])
    res["saved_bytes"] = hg.hvp.saved_bytes(f, s0.params, s0.buffers, p.init_raw())
    return res


def mem(spec: dict[str, Any]) -> dict[str, Any]:
    return C.in_subprocess(__file__, [json.dumps(spec)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    tuned = C.setup()
    mach = C.machine()
    C.print_machine(mach)
    print(f"# malloc tuned: {tuned}")
    mb = 2**20

    # 1. horizon: forward flat, reverse linear
    horizons = [10, 100] if args.quick else [10, 100, 1000]
    hrows = []
    for method in ("forward", "reverse"):
        for T in horizons:
            r = mem({"kind": "horizon", "method": method, "steps": T})
            hrows.append({"method": method, "T": T,
                          "extra_mb": r.get("peak_extra_bytes", float("nan")) / mb,
                          "in_use_mb": r.get("in_use_peak_bytes", float("nan")) / mb,
                          "seconds": r.get("seconds"), "error": r.get("error")})
    print("\n## peak extra memory against the horizon T "
          f"({HORIZON_MODEL}, K = {HORIZON_K}, SGD with momentum)")
    print(C.table(hrows, [("method", "method", ""), ("T", "T", "d"),
                          ("in_use_mb", "peak in use MB", ".1f"),
                          ("extra_mb", "peak RSS growth MB", ".1f"), ("seconds", "s", ".1f")]))
    # the method's live memory: the peak of malloc's bytes in use; the resident set also holds
    # what the tuned allocator keeps after frees (it fragments over the first ~100 steps, then
    # stays put), printed beside it
    fwd = {r["T"]: r["in_use_mb"] for r in hrows if r["method"] == "forward"}
    rev = {r["T"]: r["in_use_mb"] for r in hrows if r["method"] == "reverse"}
    fwd_rss = {r["T"]: r["extra_mb"] for r in hrows if r["method"] == "forward"}
    t_hi = max(horizons)
    flat = fwd[t_hi] / fwd[10]
    flat_rss = fwd_rss[t_hi] / fwd_rss[10]
    # the last two horizons' ratio beside the whole range's, where they differ (--quick has
    # two horizons only: the same ratio was printed twice)
    last_two = (f", T={t_hi} / T={horizons[-2]}: {fwd_rss[t_hi] / fwd_rss[horizons[-2]]:.3f}"
                if horizons[-2] != 10 else "")
    print(f"forward in use T={t_hi} / T=10: {flat:.3f}; RSS growth T={t_hi} / T=10: "
          f"{flat_rss:.3f}{last_two}   reverse in use T={t_hi} / T=10: "
          f"{rev[t_hi] / rev[10]:.1f} ({(rev[t_hi] - rev[10]) / (t_hi - 10) * 1024:.0f} KB/step)")

    # 2. chunked vs unchunked batched HVP at K = 64
    model = "cnn8" if args.quick else "cnn28"
    k = 64
    avail = C._meminfo_kb("MemAvailable") * 1024
    configs = ["vmap_vjp", "vmap_vjp_chunk4", "vmap_vjp_chunk16"]
    if avail > 12 * 2**30 or args.quick:
        configs.append("vmap_vjp_unchunked")
    else:
        print(f"# skipped unchunked K = 64: only {avail / 2**30:.1f} GiB available")
    crows = []
    p = C.make_problem(model, k)
    lam = p.init_raw()
    C.wait_quiet()
    for name in configs:
        step = C.forward_stepper(p, lam, hg.ForwardMode(C.make_strategy(name)))
        t = C.median_time(step, 3, 1)
        r = mem({"kind": "chunk", "model": model, "k": k, "strategy": name})
        crows.append({"strategy": name, "chunk": r.get("chunk"), "ms": 1e3 * t,
                      "extra_mb": r.get("peak_extra_bytes", float("nan")) / mb,
                      "saved_mb": r.get("saved_bytes", float("nan")) / mb,
                      "error": r.get("error")})
    un = next((r for r in crows if r["strategy"] == "vmap_vjp_unchunked"), None)
    for r in crows:
        if un is not None:
            r["time_vs_unchunked"] = r["ms"] / un["ms"]
        if r["chunk"]:
            r["factor"] = ((r["extra_mb"] / r["chunk"]) / r["saved_mb"]
                           if r["saved_mb"] else None)
    print(f"\n## K = {k} on {model}: automatic chunks (default budget "
          f"{hg.hvp.DEFAULT_MEMORY_BUDGET / 2**30:.0f} GiB) against fixed and no chunking")
    print(C.table(crows, [("strategy", "strategy", ""), ("chunk", "chunk", ""),
                          ("ms", "ms/step", ".0f"), ("time_vs_unchunked", "x unchunked", ".2f"),
                          ("extra_mb", "extra MB", ".0f"), ("saved_mb", "saved MB/col", ".1f"),
                          ("factor", "MB/col/saved", ".1f")]))
    default = crows[0]
    line = (f"forward_flat T{t_hi}/T10={flat:.3f} (in use; RSS {flat_rss:.3f}) "
            f"default_chunk K{k} {model}: "
            f"extra={default['extra_mb'] / 1024:.2f}GB")
    if un is not None:
        line += f" time_vs_unchunked={default['time_vs_unchunked']:.2f}"
    C.finish("bench_memory", {"machine": mach, "horizon": hrows, "chunking": crows,
                              "quick": args.quick}, args.json, line)


if __name__ == "__main__":
    main()
