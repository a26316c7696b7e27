"""Reverse mode's step VJP: double backward (reverse-over-reverse) against mixed mode
(forward-over-reverse for the second-order term, MixFlow-MG), side by side in one process.

One step VJP of reverse mode at a state a few steps into training, with a random adjoint: time
(median of round-robin calls) and peak memory (the largest growth of malloc's bytes in use during
one call, :func:`hypergrad.measure.measure`), for each model (the benchmark MLP 64-256-256-10,
the CNNs on 8x8 and 28x28 inputs, the MLP with BatchNorm) and optimizer (SGD with momentum and
weight decay, Adam), float32, batch 128. Both strategies give the same VJP to rounding
(tests/test_reverse.py). Double backward twice: by its direct route on autograd (the default
since 2026-11-28, where the loss draws no random numbers) and by ``torch.func.vjp`` of the step
(``DoubleBackward(direct=False)``, the route before; tests/test_step_vjp_routes.py).

    python experiments/benchmarks/bench_stepvjp.py          # full run (~3-5 min on 2 shared cores)
    python experiments/benchmarks/bench_stepvjp.py --quick  # mlp only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import hypergrad as hg  # noqa: E402
from hypergrad.measure import measure  # noqa: E402
from hypergrad.stepvjp import DoubleBackward, MixedMode  # noqa: E402

STRATEGIES: dict[str, Any] = {"double_backward": DoubleBackward,
                              "double_func": lambda: DoubleBackward(direct=False),
                              "mixed": MixedMode}


def bn_problem(optimizer: str) -> hg.InnerProblem:
    """The benchmark MLP with BatchNorm after each hidden layer, on random data."""
    torch.manual_seed(0)
    model = hg.tasks.mlp([64, 256, 256, 10], batchnorm=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 * C.BATCH, 64, generator=g)
    y = torch.randint(0, 10, (4 * C.BATCH,), generator=g)
    opt = (hg.optim.sgd(lr="lr", momentum=0.9, weight_decay=5e-4) if optimizer == "sgd"
           else hg.optim.adam(lr="lr", weight_decay=5e-4))
    return hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]), opt,
        hg.HyperParams([hg.Scalar("lr", 0.05, transform="log")]),
        hg.data.MiniBatches(x, y, batch_size=C.BATCH), 100,
        lambda m, hp: F.cross_entropy(m(x[:C.BATCH]), y[:C.BATCH]))


def problem_for(model: str, optimizer: str) -> hg.InnerProblem:
    if model == "bn_mlp":
        return bn_problem(optimizer)
    return C.make_problem(model, 1, optimizer=optimizer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="mlp only, SGD only")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--optimizers", nargs="*", default=None)
    ap.add_argument("--json", default=None,
                    help="output path (default results/bench_stepvjp.json)")
    args = ap.parse_args()
    tuned = C.setup()
    mach = C.machine()
    C.print_machine(mach)
    models = args.models or (["mlp"] if args.quick else ["mlp", "cnn8", "cnn28", "bn_mlp"])
    optimizers = args.optimizers or (["sgd"] if args.quick else ["sgd", "adam"])
    repeats = 3 if args.quick else 7
    print(f"# malloc tuned: {tuned}")
    C.wait_quiet()
    rows: list[dict[str, Any]] = []
    for opt in optimizers:
        for model in models:
            p = problem_for(model, opt)
            lam = p.init_raw()
            s = p.run(lam, stop=3)
            g = torch.Generator().manual_seed(1)
            adj = hg.InnerState(*(
                {k: torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in part.items()}
                for part in (s.params, s.buffers)), type(s.opt)(*(
                    {k: torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in d.items()}
                    for d in s.opt)))
            calls = {name: (lambda cls=cls: cls()(p, s, lam, 3, adj))
                     for name, cls in STRATEGIES.items()}
            times = C.interleaved_times(calls, repeats, 2, min_seconds=0.5)
            plain = C.median_time(lambda: p.step(s, lam, 3), repeats, 2, min_seconds=0.2)
            row: dict[str, Any] = {"optimizer": opt, "model": model,
                                   "plain_ms": 1e3 * plain}
            for name, fn in calls.items():
                mem = max(measure(fn)[1]["peak_extra_bytes"] for _ in range(3))
                row[f"{name}_ms"] = 1e3 * times[name]
                row[f"{name}_mib"] = mem / 2**20
            row["mixed_x_double"] = times["mixed"] / times["double_backward"]
            row["direct_x_func"] = times["double_backward"] / times["double_func"]
            row["mem_direct_x_func"] = row["double_backward_mib"] / max(row["double_func_mib"],
                                                                        1e-9)
            row["mem_mixed_x_double"] = row["mixed_mib"] / max(row["double_backward_mib"], 1e-9)
            rows.append(row)
            print(C.table([row], COLS).splitlines()[1], flush=True)
    print()
    print(C.table(rows, COLS))
    line = (f"stepvjp time mixed/double min={min(r['mixed_x_double'] for r in rows):.2f} "
            f"max={max(r['mixed_x_double'] for r in rows):.2f}; memory mixed/double "
            f"min={min(r['mem_mixed_x_double'] for r in rows):.2f} "
            f"max={max(r['mem_mixed_x_double'] for r in rows):.2f}; double backward "
            f"direct/torch.func time min={min(r['direct_x_func'] for r in rows):.2f} "
            f"max={max(r['direct_x_func'] for r in rows):.2f} memory "
            f"min={min(r['mem_direct_x_func'] for r in rows):.2f} "
            f"max={max(r['mem_direct_x_func'] for r in rows):.2f}")
    C.finish("bench_stepvjp", {"machine": mach, "rows": rows, "quick": args.quick}, args.json,
             line)


COLS = [("optimizer", "optimizer", ""), ("model", "model", ""),
        ("plain_ms", "plain step ms", ".2f"),
        ("double_backward_ms", "double ms", ".2f"), ("double_func_ms", "double func ms", ".2f"),
        ("direct_x_func", "direct/func", ".2f"), ("mixed_ms", "mixed ms", ".2f"),
        ("mixed_x_double", "time mixed/double", ".2f"),
        ("double_backward_mib", "double MiB", ".2f"), ("double_func_mib", "func MiB", ".2f"),
        ("mem_direct_x_func", "mem direct/func", ".2f"), ("mixed_mib", "mixed MiB", ".2f"),
        ("mem_mixed_x_double", "mem mixed/double", ".2f")]


if __name__ == "__main__":
    main()
