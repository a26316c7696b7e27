"""Where the library's plain training step spends its time against torch's own step, on one of
bench_models' models (``torch.profiler``): the operators by self time (CPU and, on a GPU, the
device), the number of operator calls and of kernel launches per step.

    python experiments/benchmarks/profile_plain.py --model resnet18 --device cuda
    python experiments/benchmarks/profile_plain.py --model transformer        # on the CPU

The library's step is ``problem.step`` in plain training (``InnerProblem.step`` under no
function transform: torch.autograd.grad on a functional call, then the optimizer's update with
the hyperparameters of the step); torch's is ``loss.backward(); torch.optim.SGD.step()`` on a
copy of the module (SGD with momentum 0.9 and weight decay 5e-4 in both). Last line:
``profile_plain model=<m> device=<d> lib_ms=<a> torch_ms=<b> lib_ops=<n> torch_ops=<m>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (str(HERE), str(HERE.parents[1])):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _common as C  # noqa: E402
import bench_models as BM  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402


def timed(fn: Callable[[], None], dev: torch.device, n: int = 20) -> float:
    """Median seconds of ``n`` synchronized calls after 3 warm-up calls."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def profiled(fn: Callable[[], None], dev: torch.device, steps: int = 5) -> Any:
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    return prof


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18", choices=BM.MODELS)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--rows", type=int, default=15)
    args = ap.parse_args()
    import os

    os.environ[BM.DEVICE_ENV] = args.device
    dev = C.use_device(args.device)
    problem, _, torch_step = BM.make_problem(args.model, args.k)
    lam = problem.init_raw()
    lib_step = C.plain_stepper(problem, lam)
    t_lib, t_torch = timed(lib_step, dev), timed(torch_step, dev)
    steps = 5
    out: dict[str, Any] = {}
    for name, fn in (("library", lib_step), ("torch", torch_step)):
        prof = profiled(fn, dev, steps)
        avg = prof.key_averages()
        calls = sum(e.count for e in avg) / steps
        key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        launches = sum(e.count for e in avg if e.key in ("cudaLaunchKernel",
                                                         "cuLaunchKernel",
                                                         "cudaLaunchKernelExC")) / steps
        out[name] = calls
        print(f"\n## {name} step: {1e3 * (t_lib if name == 'library' else t_torch):.2f} ms, "
              f"{calls:.0f} operator calls, {launches:.0f} kernel launches per step")
        print(avg.table(sort_by=key, row_limit=args.rows))
        if dev.type == "cuda":
            print(avg.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(f"profile_plain model={args.model} device={dev.type} lib_ms={1e3 * t_lib:.2f} "
          f"torch_ms={1e3 * t_torch:.2f} lib_ops={out['library']:.0f} "
          f"torch_ops={out['torch']:.0f}")


if __name__ == "__main__":
    main()
