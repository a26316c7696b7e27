"""Forward mode across processes: one process with one thread against 2 ranks with one thread
each (torch.distributed, gloo), column parallel and data parallel, on the benchmark MLP at K = 32
(the learning rate and 31 example-group weights: every column live at every step), float64.

Each configuration times the whole hypergradient (T inner steps and the gather), median of
repeats after a warm-up; a rank's time is the slowest rank's (the ranks meet at the start and
at the gather). The single process is timed before and after the parallel runs (median of all).
``max_rel_err``: the largest ``max|g_par - g_one| / max|g_one|`` over both parallel methods and
both ranks.

    python experiments/benchmarks/bench_distributed.py          # T = 20, 5 repeats
    python experiments/benchmarks/bench_distributed.py --quick  # T = 6, 3 repeats (< 1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402

import hypergrad as hg  # noqa: E402
from hypergrad import distributed as hd  # noqa: E402

K = 32
MODEL = "mlp"
NAME = "bench_distributed"


def problem(steps: int) -> hg.InnerProblem:
    return C.make_problem(MODEL, K, steps=steps, dtype=torch.float64)


def method(kind: str) -> hg.Method:
    if kind == "one":
        return hg.ForwardMode()
    if kind == "col":
        return hd.column_parallel()
    return hd.data_parallel(hg.ForwardMode())


def tangent_bytes(p: hg.InnerProblem, columns: int) -> int:
    s = p.initial_state()
    n = sum(v.numel() * v.element_size() for v in (*s.params.values(),
                                                   *[x for f in s.opt for x in f.values()]))
    return columns * n


def child(kind: str, steps: int, repeats: int, out: str) -> None:
    """One rank: time ``repeats`` hypergradients after a warm-up; rank 0 writes the times (the
    slowest rank's each) and its hypergradient."""
    torch.set_num_threads(1)
    with hd.launch(timeout=600):
        _time_ranks(kind, steps, repeats, out)


def _time_ranks(kind: str, steps: int, repeats: int, out: str) -> None:
    p = problem(steps)
    lam = p.init_raw()
    m = method(kind)
    g = m.hypergradient(p, lam).grad  # warm-up and the result
    times = []
    for _ in range(repeats):
        hd.barrier()
        t0 = time.perf_counter()
        m.hypergradient(p, lam)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        torch.distributed.all_reduce(dt, op=torch.distributed.ReduceOp.MAX)
        times.append(float(dt))
    held = len(m.columns(p)) if isinstance(m, hd.ParallelForward) and m.mesh.columns > 1 else K
    if hd.rank() == 0:
        Path(out).write_text(json.dumps({"times": times, "grad": g.tolist(), "held": held}))


def launch(kind: str, steps: int, repeats: int, ranks: int = 2) -> dict[str, Any]:
    """``ranks`` processes of this script as torchrun would start them; rank 0's JSON."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = C.RESULTS / f".{NAME}-{kind}.json"
    procs = []
    for r in range(ranks):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(ranks),
               "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--child", kind, "--steps", str(steps), "--repeats",
             str(repeats), "--out", str(out)], env=env, cwd=C.ROOT))
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        raise SystemExit(f"bench_distributed: the {kind} ranks ended with {codes}")
    got = json.loads(out.read_text())
    out.unlink()
    return dict(got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    steps = args.steps or (6 if args.quick else 20)
    repeats = args.repeats or (3 if args.quick else 5)
    C.setup()
    if args.child:
        child(args.child, steps, repeats, args.out)
        return
    torch.set_num_threads(1)
    mach = C.machine()
    C.print_machine(mach)
    print(f"# {MODEL} at K = {K}, T = {steps}, float64, batch {C.BATCH}; 1 thread per process")
    p = problem(steps)
    lam = p.init_raw()
    one = method("one")
    C.wait_quiet()
    ref = one.hypergradient(p, lam).grad  # warm-up and the reference

    def time_one() -> list[float]:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            one.hypergradient(p, lam)
            ts.append(time.perf_counter() - t0)
        return ts

    single = time_one()
    runs = {}
    for kind in ("col", "data"):
        C.wait_quiet()
        runs[kind] = launch(kind, steps, repeats)
    C.wait_quiet()
    single += time_one()
    t1 = statistics.median(single)
    rows: list[dict[str, Any]] = [{"mode": "one process", "ranks": 1, "seconds": t1,
                                   "speedup": 1.0, "rel_err": 0.0,
                                   "tangent_mib": tangent_bytes(p, K) / 2**20}]
    errs = []
    for kind, label in (("col", "column parallel"), ("data", "data parallel")):
        r = runs[kind]
        g = torch.tensor(r["grad"], dtype=torch.float64)
        err = float((g - ref).abs().max() / ref.abs().max())
        errs.append(err)
        t = statistics.median(r["times"])
        rows.append({"mode": label, "ranks": 2, "seconds": t, "speedup": t1 / t,
                     "rel_err": err, "tangent_mib": tangent_bytes(p, r["held"]) / 2**20,
                     "times": r["times"]})
    print(C.table(rows, [("mode", "mode", ""), ("ranks", "ranks", "d"),
                         ("seconds", "s / hypergradient", ".3f"), ("speedup", "speed-up", ".2f"),
                         ("rel_err", "max rel err", ".1e"),
                         ("tangent_mib", "tangents MiB / rank", ".1f")]))
    line = (f"distributed ranks=2 col_speedup={rows[1]['speedup']:.2f} "
            f"data_speedup={rows[2]['speedup']:.2f} max_rel_err={max(errs):.1e}")
    C.finish(NAME, {"machine": mach, "quick": args.quick, "model": MODEL, "K": K, "steps": steps,
                    "repeats": repeats,
                    "dtype": "float64", "batch": C.BATCH, "single_times": single, "rows": rows},
             args.json, line)


if __name__ == "__main__":
    main()
