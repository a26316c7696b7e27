"""Forward mode on models users train: ResNet-18, a transformer encoder, an LSTM classifier.

For each model (float32, batch 32) and K in {4, 16}, with every HVP strategy: the library's
plain training step (``problem.step``) over torch's own (``loss.backward(); opt.step()`` with
``torch.optim.SGD`` on the module), the cost of one tangent column in torch plain steps
(``(t_step / t_torch - 1) / K``; the FLOP floor is about 2), and each strategy's speedup over the
per-column loop (seed 002). ``t_torch`` of the column cost is timed in the same round robin as
the strategies (``torch ms``; ``alone``: timed beside the library's plain step only, the
reference of ``plain/torch``). Inner problem: SGD with momentum 0.9 and weight decay 5e-4; K
hyperparameters = the learning rate and ``K - 1`` example-group weights of the loss, so every
column is live at every step.

- ``resnet18``: torchvision's ResNet-18 layout (:func:`hypergrad.tasks.models.resnet18`,
  BatchNorm in train mode: running statistics are state with tangents), 3x32x32 inputs.
- ``transformer``: ``nn.TransformerEncoder``, d_model 64, 4 heads, 2 layers, feed-forward 128,
  dropout 0, sequence 32 (16 features per position), mean-pooled to a linear head.
- ``lstm``: ``nn.LSTM`` (16 inputs, hidden 128) over a sequence of 32, the last output to a
  linear head.

Memory (issue 23.6): for every row, and for reverse mode at each K, the peak extra memory of a
whole hypergradient of :data:`MEMORY_STEPS` inner steps (``hypergrad.measure.measure``: malloc's
bytes in use, sampled every millisecond; on CUDA the allocator's peak), each row in a fresh
process (the allocator's kept memory and the code paths' caches stay out: the hypergradient
runs once before it is measured), against the method's own estimate
(``method.estimate_memory(problem)``, what the Trainer's memory guard and ``method=auto``
decide by): columns ``est MiB``, ``peak MiB``, ``est/peak``.

    python experiments/benchmarks/bench_models.py            # full run: times, then memory
    python experiments/benchmarks/bench_models.py --quick    # K = 16, default vs loop (< 3 min)
    python experiments/benchmarks/bench_models.py --quick --device cuda --no-wait  # on a GPU
    python experiments/benchmarks/bench_models.py --memory   # memory only (no timing)

Last line: ``models plain_overhead_max=<a> col_cost_max=<b> batched_vs_loop_min=<c>`` over the
three models at K = 16 for the default strategy (``ForwardMode()``); the line before it (full
run, or the last with ``--memory``): ``models memory est_over_peak_min=<a> max=<b>`` over every
memory row.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

import hypergrad as hg  # noqa: E402
from hypergrad.tasks.models import RNNClassifier, TransformerClassifier, resnet18  # noqa: E402
from hypergrad.testing import classifier_case  # noqa: E402

MODELS = ("resnet18", "transformer", "lstm")
BATCH = 32
DEFAULT = "vmap_vjp"
DEVICE_ENV = "HYPERGRAD_BENCH_DEVICE"
"""The problems' device (``--device`` sets it, so fresh child processes inherit it)."""


def device() -> torch.device:
    return torch.device(os.environ.get(DEVICE_ENV) or "cpu")


def build(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    if name == "resnet18":
        return resnet18(num_classes=10), (3, 32, 32)
    if name == "transformer":
        return TransformerClassifier(d_model=64, nhead=4, layers=2, dim_feedforward=128,
                                     num_classes=10, in_features=16, dropout=0.0), (32, 16)
    if name == "lstm":
        return RNNClassifier(16, 128, 10, cell="lstm"), (32, 16)
    raise ValueError(f"bench_models: unknown model {name!r}; choose from {MODELS}.")


def make_problem(name: str, k: int, steps: int = 50) -> tuple[hg.InnerProblem, nn.Module, Any]:
    """The inner problem, the module, and the torch plain step on the same data, on
    :func:`device` (drawn on the CPU and moved: the same numbers on every device)."""
    dev = device()
    model, shape = build(name)
    model = model.to(dev)
    problem = classifier_case(model, shape, k, steps=steps, n=4 * BATCH, batch_size=BATCH,
                              device=dev)
    ref, _ = build(name)  # torch's own step trains a copy of the same module
    ref = ref.to(dev)
    ref.train()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    it = [0]

    def torch_step() -> None:
        xb, yb, _ = problem.batch(it[0] % steps)
        it[0] += 1
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ref(xb), yb).backward()
        opt.step()

    return problem, model, torch_step


MEMORY_STEPS = 3
"""Inner steps of the hypergradient whose peak memory is measured (forward mode's does not grow
with them; reverse mode stores one state more per step, which its estimate counts exactly)."""


def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: the estimate and the measured peak extra memory of one row (the
    hypergradient of ``MEMORY_STEPS`` steps, run once to load the code paths, then measured)."""
    C.setup()
    problem, _, _ = make_problem(spec["model"], spec["k"], steps=MEMORY_STEPS)
    method: hg.Method = (hg.ReverseMode() if spec["strategy"] == "reverse"
                         else hg.ForwardMode(C.make_strategy(spec["strategy"])))
    lam = problem.init_raw()
    est = method.estimate_memory(problem)
    out: dict[str, Any] = {"est_bytes": est.total, "est": str(est),
                           "columns": est.columns, "states": est.states}
    try:
        method.hypergradient(problem, lam)  # warm: code paths, caches, the Sizes probe
        gc.collect()
        _, m = hg.measure.measure(lambda: method.hypergradient(problem, lam),
                                  problem.device, interval=0.001)
    except (NotImplementedError, RuntimeError) as err:
        out["unsupported"] = str(err).splitlines()[0]
        return out
    out["peak_bytes"] = m["peak_extra_bytes"]
    return out


def memory_rows(models: list[str], ks: list[int], strategies: list[str]) -> list[dict[str, Any]]:
    """Every (model, K, strategy) row and reverse mode at each K, each in a fresh process."""
    rows = []
    for name in models:
        for k in ks:
            for s in [*strategies, "reverse"]:
                r = C.in_subprocess(__file__, [json.dumps({"model": name, "k": k,
                                                           "strategy": s})])
                row: dict[str, Any] = {"model": name, "k": k, "strategy": s}
                if "error" in r or "unsupported" in r:
                    row["unsupported"] = r.get("unsupported") or r["error"].splitlines()[-1]
                    print(f"{name:<12}{k:>3}  {s}: no memory row: {row['unsupported']}",
                          flush=True)
                    rows.append(row)
                    continue
                mb = 2**20
                row.update(est_mib=r["est_bytes"] / mb, peak_mib=r["peak_bytes"] / mb,
                           est_over_peak=r["est_bytes"] / max(r["peak_bytes"], 1),
                           columns=r["columns"], states=r["states"], est=r["est"])
                rows.append(row)
                print(C.table([row], MEM_COLS).splitlines()[1], flush=True)
    return rows


MEM_COLS = [("model", "model", ""), ("k", "K", "d"), ("strategy", "strategy", ""),
            ("est_mib", "est MiB", ".1f"), ("peak_mib", "peak MiB", ".1f"),
            ("est_over_peak", "est/peak", ".2f")]


def memory_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["est_over_peak"] for r in rows if "est_over_peak" in r]
    if not ratios:
        return {"line": "models memory n/a"}
    a, b = min(ratios), max(ratios)
    return {"est_over_peak_min": a, "est_over_peak_max": b,
            "line": f"models memory est_over_peak_min={a:.2f} max={b:.2f}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="K = 16, default strategy vs loop")
    ap.add_argument("--memory", action="store_true",
                    help="only the memory rows (estimate against measured peak), no timing")
    ap.add_argument("--no-memory", action="store_true", help="only the timing rows")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--ks", nargs="*", type=int, default=None)
    ap.add_argument("--strategies", nargs="*", default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", default=None, help="output path (default results/bench_models.json)")
    ap.add_argument("--device", default=None, help="cpu (default) or cuda[:i]")
    ap.add_argument("--no-wait", action="store_true",
                    help="do not wait for a quiet CPU nor repeat contended calls (on a GPU)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(memory_child(json.loads(args.child))))
        return
    if args.device:
        os.environ[DEVICE_ENV] = args.device
    dev = C.use_device(device())  # on CUDA: every timed call synchronized
    if args.no_wait:
        C.no_wait()
    tuned = C.setup()
    models = args.models or list(MODELS)
    ks = args.ks or ([16] if args.quick else [4, 16])
    strategies = args.strategies or (["loop", DEFAULT] if args.quick
                                     else list(C.STRATEGY_NAMES))
    if "loop" not in strategies and not args.memory:
        strategies = ["loop", *strategies]
    repeats = args.repeats or (2 if args.quick else 5)
    mach = C.machine(dev)
    C.print_machine(mach)
    if args.memory:
        print(f"# malloc tuned: {tuned}; memory only", flush=True)
        mrows = memory_rows(models, ks, strategies)
        print()
        print(C.table([r for r in mrows if "est_over_peak" in r], MEM_COLS))
        msum = memory_summary(mrows)
        C.finish("bench_models", {"machine": mach, "memory_rows": mrows, "memory": msum},
                 args.json or str(C.RESULTS / "bench_models_memory.json"), msum["line"])
        return
    waited = C.wait_quiet()
    print(f"# malloc tuned: {tuned}; waited {waited:.0f} s for a quiet machine", flush=True)

    rows: list[dict[str, Any]] = []
    for name in models:
        for k in ks:
            problem, _, torch_step = make_problem(name, k)
            lam = problem.init_raw()
            plain = C.plain_stepper(problem, lam)
            plains = C.interleaved_times({"torch": torch_step, "plain": plain}, 10, 3,
                                         min_seconds=1.0)
            t_torch, t_plain = plains["torch"], plains["plain"]
            steppers, unsupported = {}, {}
            for s in strategies:
                step = C.forward_stepper(problem, lam, hg.ForwardMode(C.make_strategy(s)))
                try:
                    step()  # a strategy torch cannot run on this model is reported, not timed
                except (NotImplementedError, RuntimeError) as err:
                    unsupported[s] = str(err).splitlines()[0]
                    print(f"{name:<12}{k:>3}  {s}: unsupported: {unsupported[s]}", flush=True)
                    continue
                steppers[s] = step
            rows.extend({"model": name, "k": k, "strategy": s, "unsupported": why}
                        for s, why in unsupported.items())
            # torch's step is timed again in the strategies' round robin (a block of calls of
            # about 0.5 s), so the column cost compares steps run in the same memory and cache
            # state: alone, in a fresh process, torch's ResNet step took 72-90 ms; after a K = 4
            # run in the same process, 83-120 ms, which made columns look cheaper
            n_torch = max(1, round(0.5 / t_torch))

            def torch_block(n: int = n_torch) -> None:
                for _ in range(n):
                    torch_step()

            times = C.interleaved_times({"torch_block": torch_block, **steppers}, repeats, 1)
            t_ref = times["torch_block"] / n_torch
            for s in steppers:
                t = times[s]
                row = {"model": name, "k": k, "strategy": s, "ms": 1e3 * t,
                       "torch_ms": 1e3 * t_ref, "torch_alone_ms": 1e3 * t_torch,
                       "plain_ms": 1e3 * t_plain,
                       "plain_overhead": t_plain / t_torch, "x_torch": t / t_ref,
                       "col_cost": (t / t_ref - 1) / k, "vs_loop": times["loop"] / t}
                rows.append(row)
                print(C.table([row], COLS).splitlines()[1], flush=True)
    print()
    print(C.table([r for r in rows if "unsupported" not in r], COLS))
    summary = summarize(rows)
    payload = {"machine": mach, "rows": rows, "summary": summary, "quick": args.quick}
    line = summary.get("line", "models n/a")
    if args.no_memory:
        C.finish("bench_models", payload, args.json, line)
        return
    print(f"\n## peak memory of a hypergradient of {MEMORY_STEPS} steps against the method's "
          f"estimate", flush=True)
    mrows = memory_rows(models, ks, strategies)
    print()
    print(C.table([r for r in mrows if "est_over_peak" in r], MEM_COLS))
    msum = memory_summary(mrows)
    payload.update(memory_rows=mrows, memory=msum)
    # C.finish, with the memory line last but one (the timing line stays the last)
    out = C.write_json("bench_models", {**payload, "line": line,
                                        "contended_repeats": len(C.CONTENDED)}, args.json)
    print(f"\n# JSON: {out}")
    print(msum["line"])
    print(line)

COLS = [("model", "model", ""), ("k", "K", "d"), ("strategy", "strategy", ""),
        ("ms", "ms/step", ".1f"), ("torch_ms", "torch ms", ".1f"),
        ("torch_alone_ms", "alone", ".1f"), ("plain_ms", "plain ms", ".1f"),
        ("plain_overhead", "plain/torch", ".2f"), ("x_torch", "x torch", ".1f"),
        ("col_cost", "torch steps/col", ".2f"), ("vs_loop", "vs loop", ".2f")]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    at16 = [r for r in rows if r["k"] == 16 and r["strategy"] == DEFAULT and "ms" in r]
    if {r["model"] for r in at16} != set(MODELS):
        return {}
    a = max(r["plain_overhead"] for r in at16)
    b = max(r["col_cost"] for r in at16)
    c = min(r["vs_loop"] for r in at16)
    line = f"models plain_overhead_max={a:.2f} col_cost_max={b:.2f} batched_vs_loop_min={c:.2f}"
    return {"plain_overhead_max": a, "col_cost_max": b, "batched_vs_loop_min": c, "line": line,
            "per_model": {r["model"]: {k: r[k] for k in ("plain_overhead", "col_cost", "vs_loop")}
                          for r in at16}}


if __name__ == "__main__":
    main()
