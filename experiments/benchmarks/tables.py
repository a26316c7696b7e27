"""Markdown tables from the benchmarks' JSON results, for docs/benchmarks.md (numbers are copied
from the files the benchmark runs wrote, never typed by hand).

    python experiments/benchmarks/tables.py                 # every results/bench_*.json found
    python experiments/benchmarks/tables.py bench_step      # one benchmark
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def markdown(rows: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str, str]]) -> str:
    """``cols``: ``(key, header, format)``; a missing value prints as ``-``."""
    out = ["| " + " | ".join(h for _, h, _ in cols) + " |",
           "|" + "|".join("---:" if f else "---" for _, _, f in cols) + "|"]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            cells.append("-" if v is None else (format(v, fmt) if fmt else str(v)))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def machine_line(m: dict[str, Any]) -> str:
    return (f"{m['cpu']}, {m['cores']} cores ({m['torch_threads']} torch threads), "
            f"{m['memory_gib']} GiB, torch {m['torch']}, Python {m['python']}, {m['libc']}, "
            f"malloc tuned: {m['malloc'] is not None}")


def bench_step(d: dict[str, Any]) -> str:
    cols = [("model", "model", ""), ("k", "K", "d"), ("strategy", "strategy", ""),
            ("ms", "ms/step", ".1f"), ("x_plain", "x SGD step", ".1f"),
            ("speedup_vs_loop", "speedup vs loop", ".2f"), ("gflops", "GFLOP/s", ".0f"),
            ("peak_share", "share of peak", ".2f"),
            ("col_x_plain", "SGD steps per column", ".2f"), ("extra_mb", "extra MB", ".0f"),
            ("note", "note", "")]
    rows = [{**r, "col_x_plain": r.get("col_x_plain", (r["x_plain"] - 1) / r["k"])}
            for r in d["rows"]]
    head = (f"matmul peak {d['matmul_peak_gflops']:.0f} GFLOP/s; "
            f"{d.get('contended_repeats', 0)} timed calls repeated for contention\n\n")
    return head + markdown(rows, cols) + f"\n\n`{d['summary'].get('line', '')}`"


def bench_memory(d: dict[str, Any]) -> str:
    h = markdown(d["horizon"], [("method", "method", ""), ("T", "T", "d"),
                                ("in_use_mb", "peak in use MB", ".1f"),
                                ("extra_mb", "peak RSS growth MB", ".1f"),
                                ("seconds", "s", ".1f")])
    c = markdown(d["chunking"], [("strategy", "strategy", ""), ("chunk", "columns/call", ""),
                                 ("ms", "ms/step", ".0f"),
                                 ("time_vs_unchunked", "x unchunked time", ".2f"),
                                 ("extra_mb", "peak extra MB", ".0f"),
                                 ("saved_mb", "saved MB/column", ".1f"),
                                 ("factor", "MB/column / saved", ".1f")])
    return f"{h}\n\n{c}\n\n`{d['line']}`"


def bench_schedule(d: dict[str, Any]) -> str:
    cols = [("model", "model", ""), ("T", "T", "d"), ("dense_s", "dense s", ".2f"),
            ("skip_s", "skipping s", ".2f"), ("ratio", "skipping/dense", ".2f"),
            ("floor_ratio", "FLOP floor", ".2f"), ("dense_x_plain", "dense x SGD", ".1f"),
            ("skip_x_plain", "skipping x SGD", ".1f"),
            ("fixed_x_plain", "fixed cost a (SGD steps)", ".2f"),
            ("col_x_plain", "per column b (SGD steps)", ".2f"),
            ("bound", "bound at a = 1", ".2f"), ("rel_diff", "rel diff", ".1e")]
    return markdown(d["rows"], cols) + f"\n\n`{d['line']}`"


def bench_conv(d: dict[str, Any]) -> str:
    c = markdown(d["conv_backward"], [
        ("what", "case", ""), ("input", "input", ""), ("cout", "Cout", "d"),
        ("stride", "stride", "d"), ("builtin_fwd_ms", "fwd ms", ".3f"),
        ("builtin_bwd_ms", "bwd ms", ".3f"), ("nn_grad_bwd_ms", "nn.grad bwd ms", ".3f"),
        ("bwd_ratio", "nn.grad / built-in", ".2f"), ("builtin_bwd_over_fwd", "bwd / fwd", ".2f")])
    h = markdown(d["hvp"], [("model", "model", ""), ("k", "K", "d"),
                            ("plain_ms", "SGD step ms", ".1f"),
                            ("flop_steps_per_col", "FLOPs per column (SGD steps)", ".2f"),
                            ("vmap_vjp_steps_per_col", "time per column, batched", ".2f"),
                            ("loop_steps_per_col", "time per column, loop", ".2f")])
    k = ""
    if "kernels" in d:
        k = "\n\n" + markdown(d["kernels"], [
            ("kind", "pass", ""), ("shape", "shape", ""), ("layout", "layout", ""),
            ("ms", "ms", ".1f"), ("gflops", "GFLOP/s", ".0f"),
            ("peak_share", "share of peak", ".2f"),
            ("per_flop_vs_loop", "per FLOP vs batch 128", ".2f")])
    return f"{c}\n\n{h}{k}\n\n`{d['line']}`"


def bench_tangent(d: dict[str, Any]) -> str:
    cols = [("optimizer", "optimizer", ""), ("model", "model", ""), ("k", "K", "d"),
            ("plain_ms", "plain step ms", ".2f"), ("closed_ms", "closed form ms", ".2f"),
            ("diagonal_ms", "diagonal Jacobian ms", ".2f"), ("jvp_ms", "jvp ms", ".2f"),
            ("diagonal_x_closed", "diagonal / closed", ".2f"),
            ("jvp_x_closed", "jvp / closed", ".2f")]
    return markdown(d["rows"], cols) + f"\n\n`{d['line']}`"


def bench_stepvjp(d: dict[str, Any]) -> str:
    cols = [("optimizer", "optimizer", ""), ("model", "model", ""),
            ("plain_ms", "plain step ms", ".2f"),
            ("double_backward_ms", "double backward ms", ".2f"),
            ("mixed_ms", "mixed mode ms", ".2f"), ("mixed_x_double", "time mixed / double", ".2f"),
            ("double_backward_mib", "double backward MiB", ".2f"),
            ("mixed_mib", "mixed mode MiB", ".2f"),
            ("mem_mixed_x_double", "memory mixed / double", ".2f")]
    return markdown(d["rows"], cols) + f"\n\n`{d['line']}`"


def bench_distributed(d: dict[str, Any]) -> str:
    cols = [("mode", "mode", ""), ("ranks", "ranks", "d"),
            ("seconds", "s / hypergradient", ".3f"), ("speedup", "speed-up", ".2f"),
            ("rel_err", "max rel err", ".1e"), ("tangent_mib", "tangents MiB / rank", ".1f")]
    head = (f"{d['model']} at K = {d['K']}, T = {d['steps']}, {d['dtype']}, batch {d['batch']}, "
            f"one thread per process, median of {d['repeats']} (one process: of "
            f"{2 * d['repeats']}, before and after)\n\n")
    return head + markdown(d["rows"], cols) + f"\n\n`{d['line']}`"


RENDER = {"bench_step": bench_step, "bench_memory": bench_memory,
          "bench_schedule": bench_schedule, "bench_conv": bench_conv,
          "bench_tangent": bench_tangent, "bench_stepvjp": bench_stepvjp,
          "bench_distributed": bench_distributed}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=list(RENDER), help="benchmarks to render")
    ap.add_argument("--dir", default=str(RESULTS))
    args = ap.parse_args(argv)
    for name in args.names:
        if name not in RENDER:
            sys.exit(f"tables.py: unknown benchmark {name!r}; choose from {sorted(RENDER)}.")
        path = Path(args.dir) / f"{name}.json"
        if not path.exists():
            print(f"<!-- {path} not found: run experiments/benchmarks/{name}.py -->\n")
            continue
        d = json.loads(path.read_text())
        quick = " (--quick)" if d.get("quick") else ""
        print(f"### {name}{quick}\n\nMachine: {machine_line(d['machine'])}\n")
        print(RENDER[name](d) + "\n")


if __name__ == "__main__":
    main()
