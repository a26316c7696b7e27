"""Least squares ``0.5 ||A x - y||^2`` with a large sparse ``A``: SparseOperator vs torch's sparse
autograd, at the scale of seed 000 (850,000 x 210,000, 0.1% non-zeros, float32, CPU).

SparseOperator's CPU kernels: MKL's CSR kernel (``torch.mv`` / ``torch.sparse.mm``, int32
indices) for ``A @ x`` and a threaded scatter kernel (scipy, one slice of the non-zeros per
thread) for the wide ``A^T @ r``, which MKL's gather over the 850,000-row ``r`` does slower
(see ``hypergrad.sparse._spmm``).

Measured in one run (medians over ``--repeats``):

- forward (product + loss) and backward (``loss.backward()``) times, and their ratio, for
  ``SparseOperator`` and for torch's own sparse autograd: ``sparse_csr`` as ``A.to_sparse_csr()``
  gives it (int64 indices), ``sparse_csr`` with int32 indices (its best case), and COO;
- a forward-mode tangent step with K = 8: one gradient plus 8 Hessian-vector products in one
  batched call, ``torch.func.vmap(vjp_fn)`` over ``torch.func.vjp(torch.func.grad(loss), x)``,
  the way the hypergradient engine does it, as a ratio to a plain gradient step (loss + backward);
- the peak resident set of each phase (``VmHWM`` of /proc/self/status, reset between phases
  through /proc/self/clear_refs where the kernel allows it; ``ru_maxrss`` for the whole run).

glibc's malloc returns big freed buffers (> 128 KiB, raised dynamically up to 32 MiB) to the OS
and gets them back page by page on the next call; the product outputs here (3.4 MB per vector,
27 MB for K = 8) are reallocated every step. At startup the script raises M_MMAP_THRESHOLD and
M_TRIM_THRESHOLD with mallopt (same effect as ``MALLOC_MMAP_THRESHOLD_=268435456
MALLOC_TRIM_THRESHOLD_=1073741824`` in the environment) after timing SparseOperator once with
glibc's defaults, so the JSON records whether it matters.

The last line printed is ``seed_scale bwd_over_fwd=<r> speedup_vs_torch_csr=<s>
k8_step_ratio=<t>`` (``--scale small`` prints ``small_scale ...``): ``r`` = our backward / our
forward, ``s`` = (torch csr forward + backward) / (ours), ``t`` = K=8 tangent step / gradient step.

Usage::

    python experiments/benchmarks/bench_sparse.py --scale small
    nohup python experiments/benchmarks/bench_sparse.py --scale seed > bench_seed.log 2>&1 &
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hypergrad.alloc import tune_malloc  # noqa: E402
from hypergrad.sparse import SparseOperator  # noqa: E402

SCALES = {
    # rows, cols, density: the seed's least-squares problem
    "seed": (850_000, 210_000, 1e-3),
    # same aspect ratio and density pattern, 1/25 of the non-zeros
    "small": (170_000, 42_000, 1e-3),
}
K = 8


# ----------------------------------------------------------------------------------------------
# memory


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_gb() -> float | None:
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 2**20


class Phase:
    """Peak resident set over a block: ``with Phase(store, "name"): ...``."""

    def __init__(self, store: dict[str, Any], name: str) -> None:
        self.store, self.name = store, name

    def __enter__(self) -> Phase:
        gc.collect()
        self.reset = _reset_peak()
        self.before = rss_gb()
        return self

    def __exit__(self, *exc: Any) -> None:
        hwm = _status_kib("VmHWM")
        self.store[self.name] = {
            "rss_before_gb": self.before, "rss_after_gb": rss_gb(),
            "peak_rss_gb": None if hwm is None else hwm / 2**20,
            "peak_is_per_phase": self.reset,
            # other processes on the machine skew timings: the 1-minute load at the phase's end
            "loadavg_1min_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        }


def set_malloc_thresholds(mmap_bytes: int = 256 << 20, trim_bytes: int = 1 << 30) -> dict:
    """Raise glibc's mmap and trim thresholds (hypergrad.alloc) so big buffers are reused."""
    ok = tune_malloc(mmap_threshold=mmap_bytes, trim_threshold=trim_bytes)
    if not ok:
        return {"applied": False, "why": "not glibc/Linux, or mallopt refused"}
    return {"applied": True, "mmap_threshold": mmap_bytes, "trim_threshold": trim_bytes}


# ----------------------------------------------------------------------------------------------
# data


def make_csr(m: int, n: int, density: float, seed: int,
             chunk_rows: int = 32_768) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random CSR matrix (m, n): row lengths ~ Binomial(n, density), distinct sorted column
    indices in each row, N(0, 1) float32 values. Built row-block by row-block straight into the
    int32 CSR arrays (no COO and no global sort), reproducible from ``seed``.

    Returns ``crow`` (m+1,) int32, ``col`` (nnz,) int32, ``val`` (nnz,) float32."""
    rng = np.random.default_rng(seed)
    counts = rng.binomial(n, density, size=m).astype(np.int64)
    crow64 = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=crow64[1:])
    nnz = int(crow64[-1])
    assert nnz < 2**31 and max(m, n) < 2**31
    col = np.empty(nnz, dtype=np.int32)
    for r0 in range(0, m, chunk_rows):
        r1 = min(m, r0 + chunk_rows)
        c = counts[r0:r1]
        s, e = int(crow64[r0]), int(crow64[r1])
        local = np.repeat(np.arange(r1 - r0, dtype=np.int64), c)
        # k distinct sorted columns from [0, n): sort k draws from [0, n - k] and add 0..k-1
        draws = (rng.random(e - s) * np.repeat(n - c + 1, c)).astype(np.int64)
        keys = local * n + draws
        keys.sort()  # keeps rows grouped: draws < n
        keys -= local * n
        keys += np.arange(e - s, dtype=np.int64) - np.repeat(crow64[r0:r1] - s, c)
        col[s:e] = keys
    val = rng.standard_normal(nnz, dtype=np.float32)
    return crow64.astype(np.int32), col, val


# ----------------------------------------------------------------------------------------------
# timing


def matmul_by(A: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: A @ x


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def time_fwd_bwd(product: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor,
                 y: torch.Tensor, repeats: int, slow_limit: float) -> dict[str, Any]:
    """Times ``loss = 0.5 ||product(x) - y||^2`` (forward) and ``loss.backward()``. The first
    call is a warm-up unless it is slower than ``slow_limit`` s, then it is the only one."""
    x = x0.clone().requires_grad_()
    fwd: list[float] = []
    bwd: list[float] = []
    for i in range(repeats + 1):
        x.grad = None
        gc.collect()
        t0 = time.perf_counter()
        loss = 0.5 * (product(x) - y).square().sum()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        del loss
        if i == 0 and t2 - t0 > slow_limit:
            return {"fwd_s": fwd[0], "bwd_s": bwd[0], "bwd_over_fwd": bwd[0] / fwd[0],
                    "step_s": fwd[0] + bwd[0], "runs": 1, "timed_once_too_slow": True,
                    "fwd_all_s": fwd, "bwd_all_s": bwd, "grad": x.grad}
    fwd, bwd = fwd[1:], bwd[1:]
    steps = [a + b for a, b in zip(fwd, bwd, strict=True)]
    return {"fwd_s": _median(fwd), "bwd_s": _median(bwd),
            "bwd_over_fwd": _median(bwd) / _median(fwd), "step_s": _median(steps),
            "runs": repeats, "timed_once_too_slow": False, "fwd_all_s": fwd, "bwd_all_s": bwd,
            "grad": x.grad}


def time_k8(op: SparseOperator, x0: torch.Tensor, y: torch.Tensor, V: torch.Tensor,
            repeats: int) -> dict[str, Any]:
    """One gradient + K Hessian-vector products: vmap(vjp_fn) over vjp(grad(loss))."""
    loss_fn = lambda x: 0.5 * (op @ x - y).square().sum()
    grad_fn = torch.func.grad(loss_fn)
    ts = []
    for _ in range(repeats + 1):
        gc.collect()
        t0 = time.perf_counter()
        g, vjp_fn = torch.func.vjp(grad_fn, x0)
        (HV,) = torch.func.vmap(vjp_fn)(V)
        ts.append(time.perf_counter() - t0)
        del vjp_fn
    return {"k8_step_s": _median(ts[1:]), "k8_all_s": ts[1:], "g": g, "HV": HV}


# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=sorted(SCALES), default="seed")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON path (default experiments/benchmarks/results/"
                         "bench_sparse_<scale>.json)")
    ap.add_argument("--repeats", type=int, default=7,
                    help="timed repeats for SparseOperator (median quoted)")
    ap.add_argument("--baseline-repeats", type=int, default=3,
                    help="timed repeats for torch's sparse autograd")
    ap.add_argument("--slow-limit", type=float, default=30.0,
                    help="a baseline whose first forward+backward takes longer (s) is timed once")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    ap.add_argument("--no-mallopt", action="store_true",
                    help="keep glibc's malloc defaults throughout")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.baseline_repeats < 1:
        ap.error("--repeats and --baseline-repeats must be >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out_path = args.out or (Path(__file__).resolve().parent / "results"
                            / f"bench_sparse_{args.scale}.json")
    warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta")
    warnings.filterwarnings("ignore", message=".*[Ss]parse invariant checks")

    m, n, density = SCALES[args.scale]
    mem: dict[str, Any] = {}
    res: dict[str, Any] = {
        "scale": args.scale, "shape": [m, n], "density": density, "dtype": "float32",
        "seed": args.seed, "K": K, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "repeats": args.repeats,
        "baseline_repeats": args.baseline_repeats, "loss": "0.5*||A x - y||^2",
        "forward_timed": "product + loss", "backward_timed": "loss.backward()",
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    print(f"bench_sparse: scale={args.scale} A=({m}, {n}) density={density} float32 "
          f"threads={torch.get_num_threads()} torch={torch.__version__}", flush=True)

    with Phase(mem, "generate"):
        t0 = time.perf_counter()
        crow, col, val = make_csr(m, n, density, args.seed)
        res["generate_s"] = time.perf_counter() - t0
    nnz = int(col.shape[0])
    res["nnz"] = nnz
    print(f"  generated nnz={nnz:,} in {res['generate_s']:.1f} s", flush=True)
    g = torch.Generator().manual_seed(args.seed + 1)
    x0 = torch.randn(n, generator=g)
    y = torch.randn(m, generator=g)
    V = torch.randn(K, n, generator=g)

    with Phase(mem, "build_operator"):
        t0 = time.perf_counter()
        op = SparseOperator.from_csr(crow, col, val, (m, n))  # shares crow/col/val
        res["build_operator_s"] = time.perf_counter() - t0
    res["operator_bytes"] = op.nbytes
    print(f"  SparseOperator built in {res['build_operator_s']:.1f} s "
          f"({op.nbytes / 2**30:.2f} GiB for A and A^T)", flush=True)
    ours_product = matmul_by(op)
    rows: dict[str, dict[str, Any]] = {}

    # 1. ours with glibc's malloc defaults, then with raised thresholds
    if not args.no_mallopt:
        with Phase(mem, "ours_default_malloc"):
            r = time_fwd_bwd(ours_product, x0, y, args.repeats, args.slow_limit)
            k = time_k8(op, x0, y, V, args.repeats)
        r.pop("grad")
        rows["ours_default_malloc"] = {**r, "k8_step_s": k["k8_step_s"]}
        del k
        res["mallopt"] = set_malloc_thresholds()
    else:
        res["mallopt"] = {"applied": False, "why": "--no-mallopt"}

    with Phase(mem, "ours"):
        r = time_fwd_bwd(ours_product, x0, y, args.repeats, args.slow_limit)
    grad_ours = r.pop("grad")
    rows["ours"] = r
    print(f"  ours: fwd {r['fwd_s'] * 1e3:.1f} ms, bwd {r['bwd_s'] * 1e3:.1f} ms", flush=True)

    with Phase(mem, "ours_k8"):
        k = time_k8(op, x0, y, V, args.repeats)
    rows["ours"]["k8_step_s"] = k["k8_step_s"]
    rows["ours"]["k8_all_s"] = k["k8_all_s"]
    # correctness at scale: the gradient against the closed form, two HVP columns against
    # explicit products
    with torch.no_grad():
        g_ref = op.T @ (op @ x0 - y)
        err_g = float((k["g"] - g_ref).norm() / g_ref.norm())
        err_autograd = float((grad_ours - g_ref).norm() / g_ref.norm())
        errs_h = [float((k["HV"][i] - op.T @ (op @ V[i])).norm() / k["HV"][i].norm())
                  for i in (0, K - 1)]
    res["check_rel_err"] = {"grad_func": err_g, "grad_autograd": err_autograd,
                            "hvp_cols_0_and_last": errs_h}
    del k
    print(f"  ours K={K} step {rows['ours']['k8_step_s'] * 1e3:.1f} ms; rel. errors grad "
          f"{err_g:.1e}/{err_autograd:.1e}, HVP {max(errs_h):.1e}", flush=True)

    # the baselines need neither A^T nor the operator: free them (the CSR of A lives on in the
    # numpy arrays crow/col/val, which the operator shared)
    op_nbytes = op.nbytes
    del op, ours_product
    gc.collect()

    # 2. torch sparse_csr, int32 indices (its best case), on the same arrays: no extra memory
    A32 = torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(col),
                                  torch.from_numpy(val), (m, n))

    def baseline(name: str, label: str, A: torch.Tensor) -> None:
        """Time a torch sparse layout's product and backward; its gradient against ours."""
        with Phase(mem, name):
            r = time_fwd_bwd(matmul_by(A), x0, y, args.baseline_repeats, args.slow_limit)
        gdiff = float((r.pop("grad") - grad_ours).norm() / grad_ours.norm())
        rows[name] = {**r, "grad_rel_diff_vs_ours": gdiff}
        print(f"  {label}: fwd {r['fwd_s'] * 1e3:.1f} ms, bwd {r['bwd_s'] * 1e3:.1f} ms",
              flush=True)

    baseline("torch_csr_int32", "torch csr int32", A32)
    del A32

    # 3. COO (the seed's layout), then 4. A.to_sparse_csr() of it (int64 indices)
    with Phase(mem, "build_coo"):
        t0 = time.perf_counter()
        idx = torch.empty(2, nnz, dtype=torch.int64)
        idx[0] = torch.repeat_interleave(torch.arange(m), torch.from_numpy(np.diff(crow)).long())
        idx[1] = torch.from_numpy(col)
        A_coo = torch.sparse_coo_tensor(idx, torch.from_numpy(val), (m, n), is_coalesced=True)
        del idx
        res["build_coo_s"] = time.perf_counter() - t0
    baseline("torch_coo", "torch coo", A_coo)
    with Phase(mem, "build_torch_csr"):
        t0 = time.perf_counter()
        A_csr = A_coo.to_sparse_csr()
        res["to_sparse_csr_s"] = time.perf_counter() - t0
        res["to_sparse_csr_index_dtype"] = str(A_csr.crow_indices().dtype)
        del A_coo
    baseline("torch_csr", "torch csr (A.to_sparse_csr())", A_csr)
    del A_csr
    gc.collect()

    ours = rows["ours"]
    res["rows"] = rows
    res["memory"] = mem
    res["ru_maxrss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    r_ = ours["bwd_over_fwd"]
    s_ = rows["torch_csr"]["step_s"] / ours["step_s"]
    t_ = ours["k8_step_s"] / ours["step_s"]
    res["summary"] = {
        "bwd_over_fwd": r_, "speedup_vs_torch_csr": s_, "k8_step_ratio": t_,
        "speedup_vs_torch_csr_int32": rows["torch_csr_int32"]["step_s"] / ours["step_s"],
        "speedup_vs_torch_coo": rows["torch_coo"]["step_s"] / ours["step_s"],
        "targets": {"bwd_over_fwd<=1.5": r_ <= 1.5, "speedup_vs_torch_csr>=30": s_ >= 30,
                    "k8_step_ratio<=12": t_ <= 12},
    }
    if "ours_default_malloc" in rows:
        d = rows["ours_default_malloc"]
        res["summary"]["default_malloc"] = {
            "step_s": d["step_s"], "k8_step_s": d["k8_step_s"],
            "tuned_over_default_step": ours["step_s"] / d["step_s"],
            "tuned_over_default_k8": ours["k8_step_s"] / d["k8_step_s"]}

    # table
    print()
    hdr = (f"{'method':<30}{'fwd ms':>11}{'bwd ms':>12}{'bwd/fwd':>9}{'step ms':>12}"
           f"{'K=8 ms':>10}{'runs':>6}{'peak RSS GB':>13}")
    print(hdr)
    print("-" * len(hdr))
    labels = {"ours_default_malloc": "SparseOperator (glibc malloc)",
              "ours": "SparseOperator", "torch_csr": "torch csr (A.to_sparse_csr())",
              "torch_csr_int32": "torch csr, int32 indices", "torch_coo": "torch coo"}
    for key in ("ours_default_malloc", "ours", "torch_csr", "torch_csr_int32", "torch_coo"):
        if key not in rows:
            continue
        r = rows[key]
        k8 = f"{r['k8_step_s'] * 1e3:10.1f}" if "k8_step_s" in r else f"{'-':>10}"
        runs = f"{r['runs']}{'*' if r['timed_once_too_slow'] else ''}"
        peak = mem.get(key, {}).get("peak_rss_gb")
        print(f"{labels[key]:<30}{r['fwd_s'] * 1e3:11.1f}{r['bwd_s'] * 1e3:12.1f}"
              f"{r['bwd_over_fwd']:9.2f}{r['step_s'] * 1e3:12.1f}{k8}{runs:>6}"
              f"{peak if peak is None else round(peak, 2):>13}")
    if any(r["timed_once_too_slow"] for r in rows.values()):
        print(f"  * timed once: the first forward+backward took > {args.slow_limit:g} s")
    print(f"step = forward + backward (median of per-run sums); K=8 = gradient + {K} HVPs via "
          f"vmap(vjp_fn) of vjp(grad(loss)); nnz={nnz:,}; operator {op_nbytes / 2**30:.2f} GiB; "
          f"whole-run max RSS {res['ru_maxrss_gb']:.2f} GiB; mallopt {res['mallopt']}")
    for key in ("generate", "build_operator", "ours_k8", "build_coo", "build_torch_csr"):
        if key in mem and mem[key]["peak_rss_gb"] is not None:
            print(f"  peak RSS during {key}: {mem[key]['peak_rss_gb']:.2f} GB")
    print(f"  speedup vs torch csr int32 {res['summary']['speedup_vs_torch_csr_int32']:.1f}x, "
          f"vs torch coo {res['summary']['speedup_vs_torch_coo']:.1f}x; generate "
          f"{res['generate_s']:.1f} s, build operator {res['build_operator_s']:.1f} s, "
          f"to_sparse_csr {res['to_sparse_csr_s']:.1f} s")
    if "default_malloc" in res["summary"]:
        d = res["summary"]["default_malloc"]
        print(f"  mallopt: step {d['tuned_over_default_step']:.3f}x, K=8 "
              f"{d['tuned_over_default_k8']:.3f}x of the glibc-default times")

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(f"wrote {out_path}")
    print(f"{args.scale}_scale bwd_over_fwd={r_:.2f} speedup_vs_torch_csr={s_:.1f} "
          f"k8_step_ratio={t_:.2f}", flush=True)
    return res


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
