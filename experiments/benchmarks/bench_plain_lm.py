"""The library's plain run against plain PyTorch on the long-horizon study's language model:
the cost of a plain inner run, which is what a black-box tuner pays per trial and what the
Trainer pays per line-search trial (issue 26's TPE contenders train in plain PyTorch).

Three ways to train the same network at the same schedule for T steps, one process, one thread,
interleaved, the median of ``--repeats`` each:

- ``library``: ``InnerProblem.run`` (a plain run: the gradient by eager autograd, which on this
  model draws dropout bit for bit as the differentiated passes' ``torch.func`` does,
  ``InnerProblem.eager_draws``, then Adam's flat update: the parameters that read equal
  hyperparameters concatenated, :meth:`hypergrad.optim.Adam.update`);
- ``library_per_parameter``: the same with the per-parameter update every differentiated pass
  runs (the plain run's update before 2026-11-29);
- ``torch``: ``experiments/horizon_lm.train_torch(..., evaluate=False)`` (``torch.optim.AdamW``
  with parameter groups, foreach; ``clip_grad_norm_``): the training alone.

    python experiments/benchmarks/bench_plain_lm.py [--T 200] [--repeats 5] [--quick]

writes ``results/bench_plain_lm.json`` and prints a table and the last line
``bench_plain_lm lib_over_torch=<a> per_parameter_over_torch=<b> flat_speedup=<c>``. The
library's two runs end at the same validation loss to the last bit (checked).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (str(HERE), str(HERE.parents[0]), str(HERE.parents[1])):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
from horizon_common import machine  # noqa: E402
from horizon_lm import lm_study, train_torch, windows_spec  # noqa: E402

# the module (``hypergrad.optim.adam`` as an attribute is the factory function of that name)
adam_module = importlib.import_module("hypergrad.optim.adam")


def library_run(problem: Any, lam: torch.Tensor, flat: bool) -> float:
    """A plain run's validation loss, with the flat update or the per-parameter one."""
    saved = adam_module.plain_update
    if not flat:
        adam_module.plain_update = lambda *a: False  # type: ignore[assignment]
    try:
        with torch.no_grad():
            s = problem.run(lam)
            return float(problem.objective(s.params, s.buffers, lam))
    finally:
        adam_module.plain_update = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the study's smoke size, 2 repeats")
    ap.add_argument("--out", default=str(HERE / "results" / "bench_plain_lm.json"))
    a = ap.parse_args(argv)
    from hypergrad.alloc import tune_malloc

    tune_malloc()  # as every benchmark here (docs/benchmarks.md, "Allocator tuning")
    torch.set_num_threads(1)
    st = lm_study(a.quick)
    st.T = 20 if a.quick else a.T
    repeats = 2 if a.quick else a.repeats
    task = st.task(0)
    p = task.problem
    lam = p.init_raw()
    spec = windows_spec(st, p.hyperparams.describe(lam))
    runs: dict[str, Any] = {
        "library": lambda: library_run(p, lam, True),
        "library_per_parameter": lambda: library_run(p, lam, False),
        "torch": lambda: train_torch(st, 0, spec, tasks={0: task}, evaluate=False)}
    for fn in runs.values():  # warm-up: first calls allocate and build caches
        fn()
    secs: dict[str, list[float]] = {k: [] for k in runs}
    vals: dict[str, list[float]] = {"library": [], "library_per_parameter": []}
    for _ in range(repeats):
        for name, fn in runs.items():
            t0 = time.process_time()
            out = fn()
            secs[name].append(time.process_time() - t0)
            if name in vals:
                vals[name].append(out)
    if vals["library"] != vals["library_per_parameter"]:
        raise SystemExit(f"bench_plain_lm: the flat update's run ended at {vals['library']}, "
                         f"the per-parameter one's at {vals['library_per_parameter']}")
    med = {k: statistics.median(v) for k, v in secs.items()}
    summary = {"lib_over_torch": med["library"] / med["torch"],
               "per_parameter_over_torch": med["library_per_parameter"] / med["torch"],
               "flat_speedup": med["library_per_parameter"] / med["library"]}
    print(f"char LM, T = {st.T} steps, {repeats} repeats, median CPU s per plain run")
    print(f"{'run':24s} {'CPU s':>8s} {'x torch':>8s}")
    for k, v in med.items():
        print(f"{k:24s} {v:8.3f} {v / med['torch']:8.2f}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(),
                               "T": st.T, "repeats": repeats, "quick": a.quick,
                               "seconds": secs, "median": med, "val": vals,
                               "summary": summary}, indent=1))
    print(f"bench_plain_lm lib_over_torch={summary['lib_over_torch']:.2f} "
          f"per_parameter_over_torch={summary['per_parameter_over_torch']:.2f} "
          f"flat_speedup={summary['flat_speedup']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
