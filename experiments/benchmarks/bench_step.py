"""Per-step cost of forward mode: every HVP strategy side by side, in one process.

For each model (mlp, cnn8, cnn28, cnn28s2) and K in {1, 4, 16, 64}: the median time of one
forward-mode step (``ForwardMode(hvp).step``: the gradient, K Hessian-vector products, the update
and its tangent) as a ratio to one plain SGD step (``problem.step``), the speedup over the
per-column loop (seed 002), the achieved GFLOP/s (FLOPs of the step, counted by torch's FLOP
counter on the loop step, over its time) as a share of a large float32 matmul measured in the same
run, the cost of one column in plain steps (``(step / plain - 1) / K``; the FLOP count says 2),
and the peak extra memory (resident-set growth over plain training, measured in a fresh
process per configuration because the tuned allocator keeps freed memory).

    python experiments/benchmarks/bench_step.py            # full run (~15 min on 2 cores)
    python experiments/benchmarks/bench_step.py --quick    # < 2 min
    python experiments/benchmarks/bench_step.py --device cuda --no-wait   # on a GPU

On CUDA every timed call is synchronized, the peak is a float32 8192^3 matmul on the device
(under the TF32 setting the run records), and memory is the allocator's peak over two steps.

The last line: ``speedup_vs_loop K16=<a> K64=<b> peak_share K64=<c>``, each the minimum over the
three base models (mlp, cnn8, cnn28), for the default strategy ``VmapVJP()``.
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

DEFAULT = "vmap_vjp"  # ForwardMode()'s strategy: VmapVJP() with automatic chunking


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Peak extra memory of 2 forward-mode steps of one configuration (fresh process; on CUDA
    the allocator's peak)."""
    C.setup()
    device = C.use_device(spec.get("device"))
    p = C.make_problem(spec["model"], spec["k"], device=device)
    lam = p.init_raw()
    warm_p = C.make_problem(spec["model"], 1, device=device)
    warm = C.forward_stepper(warm_p, warm_p.init_raw(),
                             hg.ForwardMode(C.make_strategy(spec["strategy"])))
    fm = hg.ForwardMode(C.make_strategy(spec["strategy"]))

    def run() -> None:
        step = C.forward_stepper(p, lam, fm)  # allocates the K tangents: counted
        step()
        step()

    if device.type == "cuda":
        warm()
        return hg.measure.measure(run, device)[1]
    return C.child_memory(run, warm)


def config_rows(model: str, k: int, strategies: list[str], repeats: int, peak: float,
                min_seconds: float = 0.3, **problem_kw: Any) -> list[dict[str, Any]]:
    """The rows of one (model, K): every strategy's forward-mode step timed round-robin against
    the others (for at least ``min_seconds``; the plain step for 5/3 of it), over a plain step,
    as FLOP/s and a share of ``peak`` (GFLOP/s). ``problem_kw`` goes to
    :func:`_common.make_problem` (``device``, sizes)."""
    p = C.make_problem(model, k, **problem_kw)
    lam = p.init_raw()
    plain = C.plain_stepper(p, lam)
    t_plain = C.median_time(plain, 20, 3, min_seconds=min_seconds * 5 / 3)
    flops_plain = C.count_flops(plain)
    loop_step = C.forward_stepper(p, lam, hg.ForwardMode(hg.hvp.ColumnLoop()))
    flops = C.count_flops(loop_step)  # the step's work, the same for every strategy
    methods = {name: hg.ForwardMode(C.make_strategy(name)) for name in strategies}
    steppers = {name: C.forward_stepper(p, lam, m) for name, m in methods.items()}
    for name, step in steppers.items():  # compile / first-call costs out of the way
        for _ in range(2 if name.endswith("compiled") else 0):
            step()
    times = C.interleaved_times(steppers, repeats, 1, min_seconds=min_seconds)
    rows = []
    for name in strategies:
        t = times[name]
        row = {
            "model": model, "k": k, "strategy": name, "ms": 1e3 * t,
            "plain_ms": 1e3 * t_plain, "x_plain": t / t_plain,
            "speedup_vs_loop": times["loop"] / t if "loop" in times else None,
            "gflops": flops / t / 1e9, "peak_share": flops / t / 1e9 / peak,
            "flops_per_plain": flops / flops_plain,
            "col_x_plain": (t / t_plain - 1) / k,
        }
        if getattr(methods[name].hvp, "_compile_failed", False):
            row["note"] = "torch.compile failed: ran eager"
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="mlp and cnn8, K in {4, 16}, no memory")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--ks", nargs="*", type=int, default=None)
    ap.add_argument("--strategies", nargs="*", default=None)
    ap.add_argument("--compile", action="store_true", help="also time VmapVJP(compile=True)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-malloc-tuning", action="store_true",
                    help="leave glibc's malloc thresholds alone (to measure what tuning buys)")
    ap.add_argument("--json", default=None, help="output path (default results/bench_step.json)")
    ap.add_argument("--device", default=None, help="cpu (default) or cuda[:i]")
    ap.add_argument("--no-wait", action="store_true",
                    help="do not wait for a quiet CPU nor repeat contended calls (on a GPU)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return

    device = C.use_device(args.device)
    if args.no_wait:
        C.no_wait()
    tuned = False if args.no_malloc_tuning else C.setup()
    models = args.models or (["mlp", "cnn8"] if args.quick else list(C.MODELS))
    ks = args.ks or ([4, 16] if args.quick else [1, 4, 16, 64])
    strategies = args.strategies or list(C.STRATEGY_NAMES)
    if args.compile:
        strategies.append("vmap_vjp_compiled")
    repeats = 3 if args.quick else 5
    memory = not (args.quick or args.no_memory)
    mach = C.machine(device)
    C.print_machine(mach)
    waited = C.wait_quiet()
    peak = C.matmul_peak(device=device)
    size = "8192^3" if device.type == "cuda" else "2048^3"
    print(f"# matmul peak (float32 {size}): {peak:.1f} GFLOP/s; malloc tuned: {tuned}; "
          f"waited {waited:.0f} s for a quiet machine", flush=True)

    rows: list[dict[str, Any]] = []
    for model in models:
        for k in ks:
            for row in config_rows(model, k, strategies, repeats, peak, device=device):
                name = row["strategy"]
                if memory and not name.endswith("compiled"):
                    mem = C.in_subprocess(__file__, [json.dumps(
                        {"model": model, "k": k, "strategy": name, "device": str(device)})])
                    row["extra_mb"] = mem.get("peak_extra_bytes", float("nan")) / 2**20
                    if "error" in mem:
                        row["memory_error"] = mem["error"][-300:]
                rows.append(row)
                print(C.table([row], COLS).splitlines()[1], flush=True)
    peak_end = C.matmul_peak(device=device)
    if peak_end > peak:  # use the better of the two peaks: shares are conservative
        for r in rows:
            r["peak_share"] = r["gflops"] / peak_end
        peak = peak_end

    print()
    print(C.table(rows, COLS))
    summary = summarize(rows)
    payload = {"machine": mach, "matmul_peak_gflops": peak, "rows": rows, "summary": summary,
               "contended_repeats": len(C.CONTENDED), "quick": args.quick}
    out = C.write_json("bench_step", payload, args.json)
    print(f"\n# {len(C.CONTENDED)} timed calls repeated because other processes used the CPU; "
          f"JSON: {out}")
    if summary:
        print(summary["line"])


COLS = [("model", "model", ""), ("k", "K", "d"), ("strategy", "strategy", ""),
        ("ms", "ms/step", ".1f"), ("x_plain", "x plain", ".1f"),
        ("speedup_vs_loop", "vs loop", ".2f"), ("gflops", "GFLOP/s", ".0f"),
        ("peak_share", "peak", ".2f"), ("flops_per_plain", "FLOPs/plain", ".1f"),
        ("col_x_plain", "plain/col", ".2f"),
        ("extra_mb", "extra MB", ".0f"), ("note", "note", "")]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The acceptance line: minimum over the base models present, default strategy."""
    base = [m for m in C.BASE_MODELS if any(r["model"] == m for r in rows)]

    def val(k: int, key: str) -> float | None:
        vals = [r[key] for r in rows if r["model"] in base and r["k"] == k
                and r["strategy"] == DEFAULT and r[key] is not None]
        return min(vals) if len(vals) == len(base) and vals else None

    a, b, c = val(16, "speedup_vs_loop"), val(64, "speedup_vs_loop"), val(64, "peak_share")
    if a is None and b is None:
        return {}
    fmt = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
    line = f"speedup_vs_loop K16={fmt(a)} K64={fmt(b)} peak_share K64={fmt(c)}"
    return {"speedup_vs_loop_k16": a, "speedup_vs_loop_k64": b, "peak_share_k64": c,
            "models": base, "line": line}


if __name__ == "__main__":
    main()
