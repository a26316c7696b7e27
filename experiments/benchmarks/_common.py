"""Shared pieces of the benchmark scripts: the benchmark models and inner problems, timing,
FLOP counting, the matmul peak, peak memory of a configuration in a fresh process, machine facts,
and JSON/table output. Benchmarks are scripts, not tests (STYLE.md, habit 13).

On a GPU (:func:`use_device`): problems are built on the device, every timed call is bracketed
by ``torch.cuda.synchronize`` (kernels run asynchronously), the matmul peak is the device's, and
:func:`no_wait` drops the waits for a quiet CPU (the device is what is timed)."""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import hypergrad as hg  # noqa: E402
import hypergrad.data  # noqa: E402,F401
import hypergrad.measure  # noqa: E402,F401
import hypergrad.tasks  # noqa: E402,F401
from hypergrad.alloc import malloc_settings, tune_malloc  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BASE_MODELS = ("mlp", "cnn8", "cnn28")
MODELS = (*BASE_MODELS, "cnn28s2")
BATCH = 128
OPTIMIZERS = ("sgd", "adam", "adamw")


def setup() -> bool:
    """First thing in every benchmark: the allocator tuning the library documents."""
    return tune_malloc()


def _no_sync() -> None:
    pass


SYNC: Callable[[], None] = _no_sync
"""Called before and after every timed call: ``torch.cuda.synchronize`` once :func:`use_device`
named a CUDA device, so a call's time includes its kernels."""
WAIT = True
"""Whether timing waits for a quiet CPU and repeats calls other processes slowed (:func:`no_wait`
turns it off)."""


def use_device(device: str | torch.device | None) -> torch.device:
    """The benchmarks' device: ``cpu`` (``None``) or ``cuda[:i]``, which must be available; on
    CUDA every timed call is synchronized (:data:`SYNC`)."""
    global SYNC
    dev = torch.device(device or "cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {dev}: torch {torch.__version__} sees no CUDA device "
                             f"(torch.cuda.is_available() is False).")
        if dev.index is not None:
            torch.cuda.set_device(dev)
        SYNC = functools.partial(torch.cuda.synchronize, dev)
    else:
        SYNC = _no_sync
    return dev


def no_wait() -> None:
    """Time without waiting for a quiet CPU (a GPU run, or a dry run on a shared machine)."""
    global WAIT
    WAIT = False


# -- models and problems ---------------------------------------------------------------------------

def build_model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """The benchmark models and their input shape (without the batch axis)."""
    if name == "mlp":
        return hg.tasks.mlp([64, 256, 256, 10]), (64,)
    side = {"cnn8": 8, "cnn28": 28, "cnn28s2": 28}[name]
    stride = 2 if name == "cnn28s2" else 1
    out_side = (side - 1) // stride + 1
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=stride, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * out_side * out_side, 10))
    return model, (1, side, side)


def make_problem(name: str, k: int, *, steps: int = 100, n: int = 4 * BATCH,
                 hyper: str = "groups", windows: int = 8, seed: int = 0,
                 dtype: torch.dtype = torch.float32, optimizer: str = "sgd",
                 batch: int = BATCH, device: str | torch.device | None = None,
                 data_dtype: torch.dtype | None = None) -> hg.InnerProblem:
    """SGD with momentum and weight decay (or ``optimizer="adam"`` / ``"adamw"`` with weight
    decay) on random data, with ``K = k`` hyperparameters, on ``device`` (the same model and data
    as on the CPU: both are drawn there and moved).

    ``hyper="groups"``: the learning rate and ``k - 1`` example-group weights of the loss (data
    hyper-cleaning with groups ``idx % (k - 1)``): every column is live at every step.
    ``hyper="schedule"``: a learning-rate schedule of ``windows`` windows (``k`` is ignored).
    ``data_dtype``: the dtype the inputs are drawn in (then cast to ``dtype``; default
    ``dtype``): the same data in float32 and float64 problems.
    """
    torch.manual_seed(seed)
    model, shape = build_model(name)
    model = model.to(dtype=dtype, device=device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n, *shape), generator=g, dtype=data_dtype or dtype).to(dtype=dtype,
                                                                           device=device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    if hyper == "schedule":
        items: list[Any] = [hg.Schedule("lr", 0.05, windows=windows, transform="log")]
    else:
        items = [hg.Scalar("lr", 0.05, transform="log")]
        if k > 1:
            items.append(hg.Array("gw", 0.5, shape=(k - 1,), transform="logit"))
    hps = hg.HyperParams(items)
    groups = max(k - 1, 1)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        xb, yb, idx = batch
        nll = F.cross_entropy(m(xb), yb, reduction="none")
        if "gw" in hp:
            return (hp["gw"][idx % groups] * nll).mean()
        return nll.mean()

    xv, yv = x[:batch], y[:batch]

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(xv), yv)

    batches = hg.data.MiniBatches(x, y, batch_size=batch, seed=seed)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"make_problem: optimizer={optimizer!r}; choose from {OPTIMIZERS}.")
    opt = (hg.optim.sgd(lr="lr", momentum=0.9, weight_decay=5e-4) if optimizer == "sgd"
           else getattr(hg.optim, optimizer)(lr="lr", weight_decay=5e-4))
    return hg.InnerProblem(model, train_loss, opt, hps, batches, steps, val_loss)


# -- timing, FLOPs, peak ---------------------------------------------------------------------------

def _cpu_jiffies() -> tuple[int, int]:
    """(busy jiffies of the whole machine, jiffies of this process) from ``/proc``."""
    with open("/proc/stat") as fh:
        f = [int(v) for v in fh.readline().split()[1:]]
    busy = sum(f) - f[3] - (f[4] if len(f) > 4 else 0)  # minus idle and iowait
    with open("/proc/self/stat") as fh:
        st = fh.read().rsplit(")", 1)[1].split()
    return busy, int(st[11]) + int(st[12])  # utime + stime


def others_busy() -> Callable[[], float]:
    """Start a probe; calling it gives the CPU seconds other processes used since (Linux)."""
    try:
        b0, s0 = _cpu_jiffies()
    except OSError:
        return lambda: 0.0
    hz = os.sysconf("SC_CLK_TCK")

    def stop() -> float:
        b1, s1 = _cpu_jiffies()
        return max(0, (b1 - b0) - (s1 - s0)) / hz

    return stop


def wait_quiet(max_wait: float = 1800.0, share: float = 0.15, window: float = 2.0) -> float:
    """Wait until other processes use less than ``share`` of one core over ``window`` seconds
    (the benchmarks share their machine); returns the seconds waited (0 after :func:`no_wait`)."""
    if not WAIT:
        return 0.0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_wait:
        probe = others_busy()
        time.sleep(window)
        if probe() < share * window:
            break
    return time.perf_counter() - t0


def _contended(other: float, dt: float, max_other: float) -> bool:
    """Whether other processes' CPU seconds ``other`` during a call of ``dt`` seconds exceed
    ``max_other`` of one core, beyond the 2-3 ticks of rounding ``/proc`` accounting has (a
    short call would otherwise be flagged on rounding alone)."""
    tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
    return other > max(max_other * dt, 3 * tick)


CONTENDED: list[float] = []
"""Seconds of CPU other processes took during measurements that were repeated because of it."""


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1,
                min_seconds: float = 0.0, max_other: float = 0.1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` calls (at least
    ``min_seconds`` of measuring in all, so short calls get more repeats).

    A call during which other processes used more than ``max_other`` of one core's time is
    discarded and measured again after the machine is quiet (two cores shared with other jobs
    make OpenMP barriers wait whole scheduler ticks: a contended call can take 10x longer)."""
    return interleaved_times({"": fn}, repeats, warmup, min_seconds, max_other)[""]


def interleaved_times(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1,
                      min_seconds: float = 0.0, max_other: float = 0.1) -> dict[str, float]:
    """Median wall time of each ``fns[name]()``, measured round-robin (one call of each per
    round), so a slow spell of a shared machine falls on every candidate alike and their ratios
    stay honest. Contended calls are repeated as in :func:`median_time` (not after
    :func:`no_wait`). Each call is bracketed by :data:`SYNC`."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    SYNC()
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    retries = 0
    while (min(len(v) for v in times.values()) < repeats
           or time.perf_counter() - start < min_seconds):
        for name, fn in fns.items():
            probe = others_busy()
            SYNC()
            t0 = time.perf_counter()
            fn()
            SYNC()
            dt = time.perf_counter() - t0
            other = probe()
            if WAIT and _contended(other, dt, max_other) and retries < 20 * repeats:
                CONTENDED.append(other)
                retries += 1
                wait_quiet()
                continue
            times[name].append(dt)
    return {name: statistics.median(v) for name, v in times.items()}


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of the matrix products and convolutions ``fn()`` runs (torch's FLOP counter)."""
    with FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


def matmul_peak(n: int | None = None, repeats: int = 10,
                device: str | torch.device | None = None) -> float:
    """GFLOP/s of a large float32 matmul: the best of ``repeats`` (the machine's practical peak
    for the dtype the benchmarks run in). ``n``: 2048 on the CPU, 8192 on a GPU. On CUDA it runs
    under the current TF32 setting (``torch.backends.cuda.matmul.allow_tf32``)."""
    dev = torch.device(device or "cpu")
    n = n or (8192 if dev.type == "cuda" else 2048)
    sync = functools.partial(torch.cuda.synchronize, dev) if dev.type == "cuda" else _no_sync
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    out = torch.empty(n, n, device=dev)
    best = float("inf")
    for _ in range(repeats + 2):
        sync()
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


# -- memory ----------------------------------------------------------------------------------------

def _proc_kb(path: str, key: str) -> int:
    """The ``key:`` field, in kB, of a ``/proc`` file such as ``/proc/self/status``."""
    with open(path) as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _status_kb(key: str) -> int:
    return _proc_kb("/proc/self/status", key)


def reset_peak_rss() -> int:
    """Reset this process's peak resident set (``VmHWM``) to its current size (Linux
    ``/proc/self/clear_refs``, value 5); returns the current size in bytes."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status_kb("VmRSS") * 1024


def peak_rss() -> int:
    """Peak resident set (``VmHWM``) since the last :func:`reset_peak_rss`, in bytes."""
    return _status_kb("VmHWM") * 1024


def in_subprocess(script: str, args: Sequence[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``script --child ARGS`` in a fresh interpreter; it prints one JSON line last."""
    cmd = [sys.executable, script, "--child", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if res.returncode != 0:
        return {"error": (res.stderr or res.stdout)[-2000:], "returncode": res.returncode}
    return json.loads(res.stdout.strip().splitlines()[-1])


# -- strategies and step functions ------------------------------------------------------------

STRATEGY_NAMES = ("loop", "vmap_vjp", "is_grads_batched", "fwd_over_rev")


def make_strategy(name: str) -> hg.hvp.HVPStrategy:
    """``loop`` (the seed's baseline), the library's strategies with their default (automatic)
    chunking, ``vmap_vjp_unchunked`` (all K columns in one call), ``vmap_vjp_chunkN``, and
    ``vmap_vjp_compiled`` (the optional ``torch.compile`` path)."""
    if name == "loop":
        return hg.hvp.ColumnLoop()
    if name == "vmap_vjp_unchunked":
        return hg.hvp.VmapVJP(memory_budget=float("inf"))
    if name.startswith("vmap_vjp_chunk"):
        return hg.hvp.VmapVJP(chunk_size=int(name[len("vmap_vjp_chunk"):]))
    if name == "vmap_vjp_compiled":
        return hg.hvp.VmapVJP(compile=True)
    from hypergrad.hvp import STRATEGIES
    return STRATEGIES[name]()


def plain_stepper(problem: hg.InnerProblem, lam: torch.Tensor) -> Callable[[], None]:
    """One plain training step per call (``problem.step``, as ``problem.run`` does it)."""
    st = [problem.initial_state(), 0]

    def step() -> None:
        with torch.no_grad():
            st[0] = problem.step(st[0], lam, st[1] % problem.steps)
        st[1] += 1

    return step


def forward_stepper(problem: hg.InnerProblem, lam: torch.Tensor,
                    method: hg.ForwardMode) -> Callable[[], None]:
    """One forward-mode step per call (state and all K tangents), restarting at the horizon."""
    fs = [method.init(problem, lam)]

    def step() -> None:
        f = fs[0]
        if f.step >= problem.steps:
            f = method.init(problem, lam)
        fs[0] = method.step(problem, f, lam)

    return step


def child_memory(run: Callable[[], Any], warm: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Peak resident-set growth of ``run()`` in this (fresh) process: ``warm()`` first loads the
    code paths (imports, decompositions) outside the measurement."""
    if warm is not None:
        warm()
    base = reset_peak_rss()
    t0 = time.perf_counter()
    run()
    return {"peak_extra_bytes": peak_rss() - base, "base_rss_bytes": base,
            "seconds": time.perf_counter() - t0}


# -- machine facts and output ----------------------------------------------------------------------

def device_facts(device: str | torch.device | None = None) -> dict[str, Any]:
    """The device and the settings its float32 numbers depend on: its name (the CPU's model on
    the CPU), compute capability and memory, torch/CUDA/cuDNN versions, and the TF32 and cuDNN
    flags (recorded on the CPU too, where they do not apply)."""
    dev = torch.device(device or "cpu")
    out: dict[str, Any] = {"type": dev.type, "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        out.update(index=idx, name=torch.cuda.get_device_name(idx),
                   capability=".".join(map(str, torch.cuda.get_device_capability(idx))),
                   memory_gib=round(props.total_memory / 2**30, 2),
                   multiprocessors=props.multi_processor_count,
                   device_count=torch.cuda.device_count())
    else:
        out.update(name=machine()["cpu"] or "cpu", capability=None,
                   memory_gib=machine()["memory_gib"], multiprocessors=os.cpu_count(),
                   device_count=0)
    out.update(
        matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
        matmul_allow_fp16_reduced_precision=(
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
        cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
        cudnn_enabled=torch.backends.cudnn.enabled,
        cudnn_benchmark=torch.backends.cudnn.benchmark,
        cudnn_deterministic=torch.backends.cudnn.deterministic,
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        # torch >= 2.9's precision settings, where they exist ("tf32", "ieee", "none")
        fp32_precision=getattr(torch.backends, "fp32_precision", None),
        matmul_fp32_precision=getattr(torch.backends.cuda.matmul, "fp32_precision", None),
        cudnn_conv_fp32_precision=getattr(getattr(torch.backends.cudnn, "conv", None),
                                          "fp32_precision", None),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled())
    return out


def machine(device: str | torch.device | None = None) -> dict[str, Any]:
    """The machine's facts; with a CUDA ``device``, also :func:`device_facts` under ``device``."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        mem_gb = _meminfo_kb("MemTotal") / 2**20
    except OSError:
        mem_gb = float("nan")
    out = {
        "cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "memory_gib": round(mem_gb, 1), "torch": torch.__version__,
        "python": platform.python_version(), "libc": "-".join(platform.libc_ver()),
        "malloc": malloc_settings(),
    }
    if device is not None and torch.device(device).type == "cuda":
        out["device"] = device_facts(device)
    return out


def _meminfo_kb(key: str) -> int:
    return _proc_kb("/proc/meminfo", key)


def write_json(name: str, payload: dict[str, Any], path: str | None = None) -> Path:
    out = Path(path) if path else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str))
    return out


def finish(name: str, payload: dict[str, Any], path: str | None, line: str) -> Path:
    """The end of a benchmark run: its JSON (``payload`` with the summary ``line`` and the count
    of timed calls repeated for contention) written, its path printed, the summary line last."""
    out = write_json(name, {**payload, "line": line, "contended_repeats": len(CONTENDED)}, path)
    print(f"\n# JSON: {out}")
    print(line)
    return out


def table(rows: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str, str]]) -> str:
    """A plain-text table: ``cols`` are ``(key, header, format)``."""
    cells = []
    for r in rows:
        line = []
        for key, _, fmt in cols:
            v = r.get(key)
            line.append("-" if v is None else (format(v, fmt) if fmt else str(v)))
        cells.append(line)
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(cols)]
    fmt_line = lambda vals: "  ".join(f"{v:>{w}}" for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([fmt_line([h for _, h, _ in cols])] + [fmt_line(c) for c in cells])


def print_machine(m: dict[str, Any]) -> None:
    print(f"# {m['cpu']}, {m['cores']} cores ({m['torch_threads']} torch threads), "
          f"{m['memory_gib']} GiB, torch {m['torch']}, {m['libc']}, malloc tuned: "
          f"{m['malloc'] is not None}")
    if "device" in m:
        d = m["device"]
        print(f"# device: {d['name']} (capability {d['capability']}, {d['memory_gib']} GiB), "
              f"CUDA {d['cuda']}, cuDNN {d['cudnn']}, TF32 matmul {d['matmul_allow_tf32']} / "
              f"cuDNN {d['cudnn_allow_tf32']}, cudnn.benchmark {d['cudnn_benchmark']}")
