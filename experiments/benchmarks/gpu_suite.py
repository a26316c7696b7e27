"""The GPU suite (issue 25.3): one command that measures the library on one CUDA device and
writes one JSON naming it, within a time budget (default 540 s: it fits a 10-minute call).

    python experiments/benchmarks/gpu_suite.py --out DIR                  # on a GPU machine
    python experiments/benchmarks/gpu_suite.py --device cpu --dry-run --out DIR   # every part,
                                                                          # tiny, on the CPU

Parts, in this order, each in a fresh process with its own share of the budget (time a part
does not use goes to the later ones; a part that cannot get its minimum is skipped, and the JSON
says so; one that fails or runs out of time is recorded with its error, and the suite goes on):

1. ``env``: the device (``torch.cuda.get_device_name``, capability, memory), torch/CUDA/cuDNN
   versions, the TF32 and cuDNN flags (``torch.backends.cuda.matmul.allow_tf32``,
   ``torch.backends.cudnn.allow_tf32``, ``cudnn.benchmark``, ``cudnn.deterministic``,
   ``torch.get_float32_matmul_precision()``), ``nvidia-smi``. The suite changes none of them:
   every part runs with torch's defaults and records them.
2. ``step``: seed 002's case. A forward-mode step with ``VmapVJP`` (batched, the default)
   against ``ColumnLoop`` (the per-column loop of seed 002) and ``VmapVJP`` unchunked, at
   K = 16 and 64 on ``_common``'s mlp and cnn28 (float32, batch 128), synchronized medians after
   warm-up (``bench_step.config_rows``: FLOP/s as a share of a float32 8192^3 matmul timed in
   the same process, also given with TF32 on); the allocator's peak over two steps
   (``torch.cuda.max_memory_allocated``); forward- against reverse-mode hypergradient time and
   peak memory over T = 50 steps.
3. ``models``: ``bench_models.py --quick --device cuda`` (ResNet-18, transformer, LSTM, K = 16,
   default vs loop); its memory rows (estimate against the allocator's peak) if time is left.
4. ``exactness``: the pytest tests marked ``gpu``; ``experiments/exactness.py --device cuda``
   (every optimizer x hyperparameter kind, float64: forward = reverse = finite differences, where
   TF32 never applies); ``tests/test_exactness.py`` with ``HYPERGRAD_TEST_DEVICE=cuda``
   (``hypergrad.testing.digits_case`` then builds its problems on the GPU).
5. ``resume``: a Trainer run (float64, forward mode, Adam outer steps) killed after 2 outer
   steps and resumed, against the uninterrupted run and against a second uninterrupted run,
   bitwise, with ``torch.use_deterministic_algorithms`` off and on (each in a fresh process; on:
   ``CUBLAS_WORKSPACE_CONFIG=:4096:8``), on two problems whose backward passes accumulate with
   atomics on CUDA: the digits MLP with per-example weights (``gather``/``index`` backward:
   ``scatter_add``/``index_put``) and a bag-of-tokens model (``index_select`` of embedding rows,
   whose backward is ``index_add`` with repeated tokens, pooled by ``index_add``). The part
   passes if the run with deterministic algorithms is bitwise equal; the other is recorded.

Output in ``--out``: ``gpu_suite.json`` (rewritten after every part) and one ``<part>.log`` per
part that ran: at most 6 files (a remote call brings back 8). Scratch files (run folders, the
scripts' own JSON) go to a temporary folder. The last lines: a table of the parts, then
``gpu_suite device=<name> parts_ok=<n>/<m> batched_vs_loop_K64=<x> fwd_over_rev_T=<y>
exactness_max_fwd_vs_rev=<z>``: the default's speedup over the loop at K = 64 (the minimum over
the models), forward- over reverse-mode time for one hypergradient of T steps at K = 64 (the
maximum over the models), and the worst forward-vs-reverse relative error of the exactness
table. ``--dry-run`` runs every part at tiny sizes (mlp at K = 4 and 64 and cnn8 at K = 4,
batch 8, T = 2; bench_models on the transformer at K = 2; three exactness cases and two tests;
resume runs of 3 outer steps of T = 3) in one to two minutes on 2 CPU cores;
``tests/test_gpu_suite.py`` runs it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

PARTS = ("env", "step", "models", "exactness", "resume")
SHARE = {"env": 0.03, "step": 0.30, "models": 0.16, "exactness": 0.37, "resume": 0.14}
"""Each part's share of the time left when it starts, relative to the parts still to run."""
MIN_S = {"env": 5.0, "step": 40.0, "models": 30.0, "exactness": 30.0, "resume": 20.0}
"""A part whose share is below this is skipped (a dry run needs a tenth of it)."""
GRACE_S = 8.0
"""A part's process is told its budget minus this, and killed at its budget plus this."""
TOL = {"fwd_vs_rev": 1e-8, "fwd_vs_fd": 1e-5, "strategies": 1e-10}
"""The exactness tolerances of tests/test_exactness.py."""
DEVICE_ENV = "HYPERGRAD_TEST_DEVICE"  # hypergrad.testing.TEST_DEVICE_ENV


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_cmd(cmd: list[str], timeout: float, work: Path, env: dict[str, str] | None = None,
            label: str = "cmd") -> dict[str, Any]:
    """Run ``cmd`` in its own process group with a hard ``timeout`` (the whole group is killed
    then); its output is echoed to this process's stdout (the part's log) and returned."""
    out_path = Path(tempfile.mkstemp(prefix=f"{label}_", suffix=".out", dir=work)[1])
    print(f"$ {' '.join(cmd)}   (timeout {timeout:.0f} s)", flush=True)
    t0 = time.perf_counter()
    with open(out_path, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env or _child_env(), start_new_session=True)
        _ACTIVE.add(proc.pid)
        timed_out = False
        try:
            rc = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.returncode
        _ACTIVE.discard(proc.pid)
    output = out_path.read_text(errors="replace")
    sys.stdout.write(output if output.endswith("\n") or not output else output + "\n")
    secs = time.perf_counter() - t0
    print(f"$ rc={rc}{' (timed out)' if timed_out else ''} after {secs:.1f} s", flush=True)
    return {"returncode": rc, "timed_out": timed_out, "seconds": secs, "output": output}


_ACTIVE: set[int] = set()
"""Process groups this process started and has not yet seen end (each its own session)."""


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """End the process group this suite started for ``proc``: SIGTERM (a part's process then
    ends the groups it started itself), then SIGKILL for what is left of it."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    _ACTIVE.discard(proc.pid)


def _on_sigterm(signum: int, frame: Any) -> None:
    """Killed (a part out of time, or the suite itself): end the groups started from here."""
    for pgid in list(_ACTIVE):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    raise SystemExit(128 + signum)


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


# -- the parts (each runs in its own process: ``--child PART``) -----------------------------------

class Part:
    """What a part's process knows: its device, sizes, deadline and scratch folder; ``save``
    writes what it has so far (the parent reads it even if the part is killed)."""

    def __init__(self, name: str, device: str, dry: bool, deadline: float, work: Path) -> None:
        self.name, self.device, self.dry = name, device, dry
        self.deadline, self.work = deadline, work
        self.data: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self, **data: Any) -> None:
        self.data.update(data)
        _write_json(self.work / f"{self.name}.json", self.data)


def part_env(p: Part) -> None:
    import _common as C
    import torch

    dev = C.use_device(p.device)
    facts = C.device_facts(dev)
    env_vars = {k: os.environ.get(k) for k in (
        "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE",
        "PYTORCH_CUDA_ALLOC_CONF", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "OMP_NUM_THREADS")}
    versions: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("numpy", "sklearn", "scipy"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    smi = None
    if dev.type == "cuda" and shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                 "power.limit,persistence_mode", "--format=csv"],
                capture_output=True, text=True, timeout=15).stdout.strip()
        except (OSError, subprocess.SubprocessError) as err:
            smi = f"nvidia-smi failed: {err}"
    p.save(device=facts, machine=C.machine(), versions=versions, env_vars=env_vars,
           nvidia_smi=smi, ok=True)
    print(json.dumps(p.data, indent=1, default=str))


def _sizes(dry: bool) -> dict[str, Any]:
    if dry:  # seconds on 2 CPU cores
        return {"models": ["mlp", "cnn8"], "ks": [4, 64], "leave_out": [["cnn8", 64]],
                "repeats": 1, "min_seconds": 0.0,
                "steps": 2, "problem": {"n": 32, "batch": 8}, "hyper_repeats": 1,
                "matmul_n": 512, "strategies": ["loop", "vmap_vjp"]}
    return {"models": ["mlp", "cnn28"], "ks": [16, 64], "repeats": 10, "min_seconds": 0.3,
            "steps": 50, "problem": {}, "hyper_repeats": 3, "matmul_n": None,
            "strategies": ["loop", "vmap_vjp", "vmap_vjp_unchunked"]}


def part_step(p: Part) -> None:
    import _common as C
    import bench_step
    import torch

    import hypergrad as hg

    dev = C.use_device(p.device)
    C.no_wait()
    C.setup()
    sz = _sizes(p.dry)
    p.save(device=C.device_facts(dev), sizes=sz, rows=[], hypergradients=[], skipped=[])
    peak = C.matmul_peak(sz["matmul_n"], device=dev)
    peak_tf32 = None
    if dev.type == "cuda":  # the same matmul with TF32 allowed, for reference
        was = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            peak_tf32 = C.matmul_peak(sz["matmul_n"], device=dev)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = was
    p.save(matmul_peak_gflops=peak, matmul_peak_tf32_gflops=peak_tf32)
    print(f"# matmul peak {peak:.0f} GFLOP/s (TF32 allowed: {peak_tf32})", flush=True)
    kw = {"device": dev, "steps": sz["steps"], **sz["problem"]}
    took: dict[tuple[str, int], float] = {}
    for model in sz["models"]:
        for k in sz["ks"]:
            if [model, k] in sz.get("leave_out", []):
                continue
            prev = [(kk, s) for (m, kk), s in took.items() if m == model]
            # about half of a configuration's time grows with K (the estimate from the last K)
            need = prev[-1][1] * (0.5 + 0.5 * k / prev[-1][0]) if prev else 10.0
            if p.left() < need and not p.dry:  # a dry run runs every configuration
                p.data["skipped"].append({"model": model, "k": k, "why": (
                    f"needs about {need:.0f} s, {p.left():.0f} s left")})
                p.save()
                print(f"# skipped {model} K={k}: {p.data['skipped'][-1]['why']}", flush=True)
                continue
            t0 = time.perf_counter()
            try:
                rows = bench_step.config_rows(model, k, sz["strategies"], sz["repeats"], peak,
                                              sz["min_seconds"], **kw)
            except Exception as err:  # recorded, the other configurations go on
                p.data["rows"].append({"model": model, "k": k, "error": _error(err)})
                p.save()
                continue
            problem = C.make_problem(model, k, **kw)
            lam = problem.init_raw()
            for row in rows:  # the peak of two steps (the K tangents allocated inside)
                fm = hg.ForwardMode(C.make_strategy(row["strategy"]))

                def two_steps(fm: hg.ForwardMode = fm) -> None:
                    step = C.forward_stepper(problem, lam, fm)
                    step()
                    step()

                try:
                    _, mem = hg.measure.measure(two_steps, dev)
                    row["peak_mib"] = mem["peak_extra_bytes"] / 2**20
                except Exception as err:
                    row["peak_error"] = _error(err)
                p.data["rows"].append(row)
                print(C.table([row], STEP_COLS).splitlines()[1], flush=True)
            p.save()
            took[(model, k)] = time.perf_counter() - t0
            # forward against reverse mode: one hypergradient of T steps each
            t_step = min(r["ms"] for r in rows if "ms" in r) / 1e3
            need = 2 * (sz["hyper_repeats"] + 1) * sz["steps"] * t_step
            if p.left() < need and not p.dry:
                p.data["skipped"].append({"model": model, "k": k, "what": "fwd_vs_rev", "why": (
                    f"needs about {need:.0f} s, {p.left():.0f} s left")})
                p.save()
                continue
            try:
                p.data["hypergradients"].append(
                    _fwd_vs_rev(problem, lam, dev, sz["hyper_repeats"], model, k))
            except Exception as err:
                p.data["hypergradients"].append({"model": model, "k": k, "error": _error(err)})
            print(json.dumps(p.data["hypergradients"][-1]), flush=True)
            p.save()
    problems = [f"{r['model']} K={r['k']}: {r['error']}"
                for r in p.data["rows"] + p.data["hypergradients"] if "error" in r]
    p.save(summary=_step_summary(p.data), problems=problems, ok=not problems)


def _fwd_vs_rev(problem: Any, lam: Any, dev: Any, repeats: int, model: str,
                k: int) -> dict[str, Any]:

    import hypergrad as hg

    fwd, rev = hg.ForwardMode(), hg.ReverseMode()
    g_f = fwd.hypergradient(problem, lam).grad  # warm-up, and the agreement in float32
    g_r = rev.hypergradient(problem, lam).grad
    secs: dict[str, list[float]] = {"forward": [], "reverse": []}
    peak: dict[str, int] = {"forward": 0, "reverse": 0}
    for _ in range(repeats):  # round robin; hypergrad.measure synchronizes and reads the peak
        for name, method in (("forward", fwd), ("reverse", rev)):
            _, m = hg.measure.measure(lambda method=method: method.hypergradient(problem, lam),
                                      dev)
            secs[name].append(m["seconds"])
            peak[name] = max(peak[name], m["peak_extra_bytes"])
    t_f, t_r = statistics.median(secs["forward"]), statistics.median(secs["reverse"])
    rel = float((g_f - g_r).norm() / g_r.norm().clamp_min(1e-30))
    return {"model": model, "k": k, "T": problem.steps, "forward_s": t_f, "reverse_s": t_r,
            "fwd_over_rev": t_f / t_r, "forward_peak_mib": peak["forward"] / 2**20,
            "reverse_peak_mib": peak["reverse"] / 2**20, "rel_diff_float32": rel,
            "repeats": repeats}


STEP_COLS = [("model", "model", ""), ("k", "K", "d"), ("strategy", "strategy", ""),
             ("ms", "ms/step", ".2f"), ("x_plain", "x plain", ".1f"),
             ("speedup_vs_loop", "vs loop", ".2f"), ("gflops", "GFLOP/s", ".0f"),
             ("peak_share", "peak", ".3f"), ("col_x_plain", "plain/col", ".2f"),
             ("peak_mib", "peak MiB", ".0f")]


def _step_summary(d: dict[str, Any]) -> dict[str, Any]:
    rows = [r for r in d.get("rows", []) if r.get("strategy") == "vmap_vjp" and "ms" in r]
    out: dict[str, Any] = {}
    for k in sorted({r["k"] for r in rows}):
        at = [r for r in rows if r["k"] == k]
        out[f"batched_vs_loop_k{k}"] = {r["model"]: r["speedup_vs_loop"] for r in at}
        out[f"peak_share_k{k}"] = {r["model"]: r["peak_share"] for r in at}
    hyp = [h for h in d.get("hypergradients", []) if "fwd_over_rev" in h]
    for k in sorted({h["k"] for h in hyp}):
        out[f"fwd_over_rev_k{k}"] = {h["model"]: h["fwd_over_rev"] for h in hyp if h["k"] == k}
    at64 = out.get("batched_vs_loop_k64", {})
    f64 = out.get("fwd_over_rev_k64", {})
    out["batched_vs_loop_K64_min"] = min(at64.values()) if at64 else None
    out["fwd_over_rev_K64_max"] = max(f64.values()) if f64 else None
    out["T"] = d.get("sizes", {}).get("steps")
    return out


def part_models(p: Part) -> None:
    script = str(HERE / "bench_models.py")
    has_memory = "--no-memory" in (HERE / "bench_models.py").read_text()
    base = [sys.executable, script, "--quick", "--device", p.device, "--no-wait"]
    if p.dry:
        base += ["--models", "transformer", "--ks", "2", "--repeats", "1"]
    runs: list[dict[str, Any]] = []
    p.save(runs=runs, memory_rows_supported=has_memory)
    timing_json = p.work / "bench_models.json"
    cmd = [*base, "--json", str(timing_json), *(["--no-memory"] if has_memory else [])]
    r = run_cmd(cmd, p.left(), p.work, label="models")
    runs.append(_cmd_record(cmd, r))
    if timing_json.exists() and r["returncode"] == 0:
        d = json.loads(timing_json.read_text())
        p.save(rows=d.get("rows"), summary=d.get("summary"), line=d.get("line"),
               machine=d.get("machine"))
    p.save(ok=r["returncode"] == 0 and not r["timed_out"],
           problems=[] if r["returncode"] == 0 and not r["timed_out"] else [
               f"bench_models {'timed out' if r['timed_out'] else 'failed'}: "
               f"{_tail(r['output'], 1)}"])
    if has_memory and not p.dry and p.left() > 90:
        mem_json = p.work / "bench_models_memory.json"
        cmd = [*base, "--memory", "--json", str(mem_json)]
        r = run_cmd(cmd, p.left(), p.work, label="models_memory")
        runs.append(_cmd_record(cmd, r))
        if mem_json.exists() and r["returncode"] == 0:
            d = json.loads(mem_json.read_text())
            p.save(memory_rows=d.get("memory_rows"), memory=d.get("memory"))
        p.save()
    elif has_memory:
        p.save(memory_rows_skipped=("dry run" if p.dry else
                                    f"{p.left():.0f} s left, the memory rows need about 90"))


def _cmd_record(cmd: list[str], r: dict[str, Any]) -> dict[str, Any]:
    rec = {"cmd": " ".join(cmd[1:]), "returncode": r["returncode"], "timed_out": r["timed_out"],
           "seconds": round(r["seconds"], 1)}
    if r["returncode"] != 0 or r["timed_out"]:
        rec["tail"] = _tail(r["output"])
    return rec


_TEST_LINE = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", re.M)


def pytest_results(output: str) -> dict[str, Any]:
    """Counts and the failing tests' names from ``pytest -v`` output (complete or cut off)."""
    found = _TEST_LINE.findall(output)
    counts: dict[str, int] = {}
    for _, status in found:
        counts[status.lower()] = counts.get(status.lower(), 0) + 1
    bad = [n for n, s in found if s in ("FAILED", "ERROR")]
    errors = re.findall(r"^ERROR (\S+)", output, re.M)  # collection errors
    return {"counts": counts, "failed": bad + [e for e in errors if e not in bad]}


def exactness_rows(output: str) -> list[dict[str, Any]]:
    """The rows exactness.py printed (what a run cut off by its timeout got through)."""
    rows = []
    for line in output.splitlines():
        f = line.split()
        if len(f) != 7:
            continue
        try:
            vals = [float(v) for v in f[3:]]
            k = int(f[2])
        except ValueError:
            continue
        rows.append({"optimizer": f[0], "kind": f[1], "K": k, "fwd_vs_rev": vals[0],
                     "fwd_vs_fd": vals[1], "strategies": vals[2], "seconds": vals[3]})
    return rows


def part_exactness(p: Part) -> None:
    py = sys.executable
    start_left = p.left()
    p.save(tolerances=TOL)
    problems: list[str] = []
    # (a) the tests marked gpu (skipped by tests/conftest.py without CUDA)
    files = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").glob("test_*.py")
                   if "mark.gpu" in f.read_text())
    if files:
        cmd = [py, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "gpu", *files]
        r = run_cmd(cmd, min(p.left(), 0.15 * start_left + 10), p.work, label="pytest_gpu")
        gpu = {**_cmd_record(cmd, r), **pytest_results(r["output"]), "files": files}
        problems += _test_problems("tests marked gpu", r, gpu, ok_codes=(0, 5))
    else:
        gpu = {"files": [], "counts": {}, "failed": [], "note": "no test is marked gpu"}
    p.save(gpu_tests=gpu)
    # (b) the exactness table on the device
    ex_json = p.work / "exactness.json"
    cmd = [py, str(ROOT / "experiments" / "exactness.py"), "--device", p.device,
           "--json", str(ex_json)]
    if p.dry:
        cmd += ["--steps", "2", "--n-train", "16", "--optimizers", "adam",
                "--kinds", "lr", "per_example"]
    r = run_cmd(cmd, min(p.left(), 0.6 * p.left() + 5), p.work, label="exactness")
    if ex_json.exists() and r["returncode"] == 0:
        table = json.loads(ex_json.read_text())
        rows, complete = table["rows"], True
    else:
        rows, complete = exactness_rows(r["output"]), False
    worst = {k: max((float(row[k]) for row in rows), default=None) for k in TOL}
    within = all(v is not None and v <= TOL[k] for k, v in worst.items())
    if not complete:
        problems.append(f"exactness.py {'timed out' if r['timed_out'] else 'failed'} after "
                        f"{len(rows)} cases")
    problems += [f"exactness {k} {v:.1e} > {TOL[k]:g}" for k, v in worst.items()
                 if v is not None and v > TOL[k]]
    p.save(table={**_cmd_record(cmd, r), "complete": complete, "cases": len(rows),
                  "worst": worst, "within_tolerances": within, "rows": rows})
    # (c) tests/test_exactness.py with its digits problems on the device
    cmd = [py, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_exactness.py"]
    if p.dry:
        cmd += ["-k", "sgd-lr or adam-per_example"]
    r = run_cmd(cmd, p.left(), p.work, env=_child_env({DEVICE_ENV: p.device}),
                label="pytest_exactness")
    tests = {**_cmd_record(cmd, r), **pytest_results(r["output"]), "env": f"{DEVICE_ENV}="
             f"{p.device}"}
    problems += _test_problems("test_exactness.py", r, tests)
    p.save(exactness_tests=tests, problems=problems, ok=not problems)


def _test_problems(what: str, r: dict[str, Any], res: dict[str, Any],
                   ok_codes: tuple[int, ...] = (0,)) -> list[str]:
    if r["timed_out"]:
        return [f"{what} timed out after {sum(res['counts'].values())} tests"]
    if res["failed"]:
        return [f"{what}: {len(res['failed'])} failed: {', '.join(res['failed'][:5])}"]
    if r["returncode"] not in ok_codes:
        return [f"{what}: pytest exited with {r['returncode']}"]
    return []


def part_resume(p: Part) -> None:
    runs = []
    for det in (False, True):
        extra = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if det else {}
        cmd = [sys.executable, __file__, "--child", "resume_run", "--device", p.device,
               "--work", str(p.work), *(["--deterministic"] if det else []),
               *(["--dry-run"] if p.dry else [])]
        budget = p.left() / (2 - det) - 1  # half of what is left for the first
        r = run_cmd(cmd, budget, p.work, env=_child_env(extra), label=f"resume_det{int(det)}")
        path = p.work / f"resume_run_det{int(det)}.json"
        rec = json.loads(path.read_text()) if path.exists() else {}
        rec.update(deterministic=det, returncode=r["returncode"], timed_out=r["timed_out"],
                   env=extra)
        if r["returncode"] != 0 or r["timed_out"]:
            rec["tail"] = _tail(r["output"])
        runs.append(rec)
        p.save(runs=runs)
    problems = []
    for r in runs:
        mode = "deterministic" if r["deterministic"] else "default"
        if r["returncode"] != 0 or r["timed_out"]:
            problems.append(f"{mode} run {'timed out' if r['timed_out'] else 'failed'}")
        problems += [f"{mode} {c['problem']}: {c['error']}" for c in r.get("cases", [])
                     if c.get("error")]
        if r["deterministic"]:  # bitwise equality is the claim only with these on
            problems += [f"deterministic {c['problem']}: the resumed run differs from the "
                         f"uninterrupted one" for c in r.get("cases", [])
                         if "resumed_equal" in c and not c["resumed_equal"]]
    if len(runs) < 2:
        problems.append("the deterministic run did not start")
    p.save(problems=problems, summary={("deterministic" if r["deterministic"] else "default"): {
        c["problem"]: {"resumed_equal": c.get("resumed_equal"),
                       "rerun_equal": c.get("rerun_equal"), "error": c.get("error")}
        for c in r.get("cases", [])} for r in runs}, ok=not problems)


def _token_problem(device: Any, steps: int) -> Any:
    """A bag of tokens: embedding rows picked by ``index_select`` (its backward is ``index_add``
    over repeated tokens) and pooled per example by ``index_add``, then tanh and a linear head;
    per-example weights and the learning rate as hyperparameters; float64."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import hypergrad as hg

    class TokenBag(nn.Module):
        def __init__(self, vocab: int = 24, dim: int = 16, classes: int = 4) -> None:
            super().__init__()
            self.emb = nn.Parameter(0.3 * torch.randn(vocab, dim))
            self.head = nn.Linear(dim, classes)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            b, length = tokens.shape
            rows = self.emb.index_select(0, tokens.reshape(-1))
            seg = torch.arange(b, device=tokens.device).repeat_interleave(length)
            pooled = torch.zeros(b, rows.shape[-1], dtype=rows.dtype,
                                 device=rows.device).index_add(0, seg, rows)
            return self.head(torch.tanh(pooled / length))

    torch.manual_seed(0)
    model = TokenBag().double().to(device)
    g = torch.Generator().manual_seed(0)
    n, length = 64, 12
    tokens = torch.randint(0, 24, (n + 32, length), generator=g)
    y = (tokens[:, :3].sum(1) % 4).to(device)
    tokens = tokens.to(device)
    x_tr, y_tr, x_val, y_val = tokens[:n], y[:n], tokens[n:], y[n:]
    hps = hg.HyperParams([hg.Scalar("lr", 0.3, transform="log"),
                          hg.PerExample("ex_w", n=n, init=0.5, transform="logit")])

    def train_loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
        xb, yb, idx = batch
        return (hp["ex_w"][idx] * F.cross_entropy(m(xb), yb, reduction="none")).mean()

    def val_loss(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(x_val), y_val)

    return hg.InnerProblem(model, train_loss, hg.optim.sgd(lr="lr", momentum=0.9), hps,
                           hg.data.MiniBatches(x_tr, y_tr, batch_size=16), steps, val_loss)


class _Interrupt(Exception):
    """A run killed between outer steps (tests/fixtures.py's ``interrupt_after``)."""


def child_resume_run(device: str, dry: bool, deterministic: bool, work: Path) -> None:
    """One process: every resume case with deterministic algorithms ``deterministic``."""
    import _common as C
    import torch

    import hypergrad as hg
    from hypergrad.run import Log, Progress
    from hypergrad.testing import digits_case

    dev = C.use_device(device)
    torch.use_deterministic_algorithms(deterministic)
    steps, outer, n_train = (3, 3, 32) if dry else (20, 4, 64)
    makers: dict[str, Callable[[], Any]] = {
        "digits_per_example": lambda: digits_case(
            "adam", "per_example", steps=steps, n_train=n_train, batch_size=16, hidden=16,
            device=dev),
        "token_bag_index_add": lambda: _token_problem(dev, steps),
    }
    out: dict[str, Any] = {"device": C.device_facts(dev), "steps": steps, "outer_steps": outer,
                           "interrupted_after": 2, "cases": []}
    path = work / f"resume_run_det{int(deterministic)}.json"

    def fit(make: Callable[[], Any], folder: Path, resume: bool = False,
            kill_after: int | None = None) -> Any:
        calls = [0]

        def evaluate(state: Any) -> dict[str, float]:
            calls[0] += 1
            if kill_after is not None and calls[0] > kill_after:
                raise _Interrupt
            return {}

        task = hg.Task(make(), evaluate=evaluate)
        tr = hg.Trainer(task, "forward", functools.partial(torch.optim.Adam, lr=0.1),
                        hg.Offline(outer), hg.Guards(), hg.RunFolder(folder, resume=resume),
                        [Log(None), Progress(False)])
        return tr.fit()

    for name, make in makers.items():
        case: dict[str, Any] = {"problem": name}
        base = work / f"resume_det{int(deterministic)}_{name}"
        t0 = time.perf_counter()
        try:
            full = fit(make, base / "full")
            again = fit(make, base / "again")
            try:
                fit(make, base / "part", kill_after=2)
                raise RuntimeError("the interrupted run was not interrupted")
            except _Interrupt:
                pass
            ck = torch.load(base / "part" / "checkpoint.pt", weights_only=True,
                            map_location="cpu")
            resumed = fit(make, base / "part", resume=True)
            case.update(checkpoint_outer_step=int(ck["outer_step"]),
                        K=int(full.lam.numel()),
                        resumed_equal=_same(resumed, full), rerun_equal=_same(again, full),
                        resumed_max_abs_diff=_max_diff(resumed, full),
                        rerun_max_abs_diff=_max_diff(again, full))
        except Exception as err:
            case["error"] = _error(err)
        case["seconds"] = time.perf_counter() - t0
        out["cases"].append(case)
        _write_json(path, out)
        print(json.dumps(case), flush=True)


def _same(a: Any, b: Any) -> bool:
    """Bitwise: the learned and last hyperparameters and every outer step's validation loss
    and hypergradient norm."""
    import torch

    return bool(torch.equal(a.lam.cpu(), b.lam.cpu())
                and torch.equal(a.last_lam.cpu(), b.last_lam.cpu())
                and [h.get("val_loss") for h in a.history] == [h.get("val_loss") for h in b.history]
                and [h.get("hypergrad_norm") for h in a.history]
                == [h.get("hypergrad_norm") for h in b.history])


def _max_diff(a: Any, b: Any) -> float:
    return float((a.last_lam.cpu() - b.last_lam.cpu()).abs().max())


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip()[:600]}"


CHILDREN = {"env": part_env, "step": part_step, "models": part_models,
            "exactness": part_exactness, "resume": part_resume}


# -- the parent: budgets, the JSON, the table ---------------------------------------------------

def run_part(name: str, budget: float, args: argparse.Namespace, work: Path,
             out: Path) -> dict[str, Any]:
    """Run one part in a fresh process, its output to ``out/<name>.log``; what it saved (all of
    it, or what it had when it failed or was killed) with its status."""
    deadline = time.time() + budget - GRACE_S
    cmd = [sys.executable, __file__, "--child", name, "--device", args.device, "--work",
           str(work), "--deadline", str(deadline), *(["--dry-run"] if args.dry_run else [])]
    log = out / f"{name}.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        fh.write(f"# gpu_suite part {name}: budget {budget:.0f} s, {_now()}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=_child_env(), start_new_session=True)
        _ACTIVE.add(proc.pid)
        timed_out = False
        try:
            rc = proc.wait(timeout=budget + GRACE_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.returncode
        _ACTIVE.discard(proc.pid)
    secs = time.perf_counter() - t0
    path = work / f"{name}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    part_ok = bool(data.pop("ok", False))
    status = "timeout" if timed_out else ("ok" if rc == 0 and part_ok else "failed")
    rec: dict[str, Any] = {"status": status, "seconds": round(secs, 1),
                           "budget_s": round(budget, 1), "returncode": rc, "log": log.name,
                           **data}
    if name == "step":  # from the rows it saved, also when it was killed before its end
        rec["summary"] = _step_summary(rec)
    if status != "ok":
        text = log.read_text(errors="replace")
        rec["error"] = (f"killed after {budget + GRACE_S:.0f} s (its budget)" if timed_out
                        else _tail(text, 25) if rc != 0
                        else "; ".join(data.get("problems") or ["a check of the part failed"]))
    return rec


def allot(left: float, todo: list[str], dry: bool) -> tuple[float, float]:
    """(the next part's budget, its minimum): its share of what is left among the parts still
    to run."""
    name = todo[0]
    budget = left * SHARE[name] / sum(SHARE[n] for n in todo)
    return min(budget, left), MIN_S[name] / (10 if dry else 1)


def summary_line(result: dict[str, Any]) -> str:
    parts = result["parts"]
    n_ok = sum(1 for p in parts.values() if p.get("status") == "ok")
    step = parts.get("step", {}).get("summary", {})
    worst = parts.get("exactness", {}).get("table", {}).get("worst", {}).get("fwd_vs_rev")

    def fmt(v: Any, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    name = re.sub(r"\s+", "_", str(result.get("device") or "unknown"))
    return (f"gpu_suite device={name} parts_ok={n_ok}/{len(parts)} "
            f"batched_vs_loop_K64={fmt(step.get('batched_vs_loop_K64_min'), '.2f')} "
            f"fwd_over_rev_T={fmt(step.get('fwd_over_rev_K64_max'), '.2f')} "
            f"exactness_max_fwd_vs_rev={fmt(worst, '.2e')}")


def _what(name: str, p: dict[str, Any]) -> str:
    """One cell of the parts table: the part's main result."""
    if p.get("status") == "skipped":
        return p.get("why", "")
    if name == "env" and "device" in p:
        d = p["device"]
        return (f"{d.get('name')}, cap {d.get('capability')}, TF32 matmul "
                f"{d.get('matmul_allow_tf32')} / cuDNN {d.get('cudnn_allow_tf32')}, "
                f"benchmark {d.get('cudnn_benchmark')}")
    if name == "step" and "summary" in p:
        s = p["summary"]
        ks = sorted(int(k[len("batched_vs_loop_k"):]) for k in s
                    if k.startswith("batched_vs_loop_k"))
        cells = [f"K={k} vs loop " + " ".join(f"{m} {v:.2f}" for m, v in
                                              s[f"batched_vs_loop_k{k}"].items()) for k in ks]
        f = s.get("fwd_over_rev_k64") or {}
        if f:
            cells.append("fwd/rev K=64 " + " ".join(f"{m} {v:.2f}" for m, v in f.items()))
        return "; ".join(cells)
    if name == "models":
        return p.get("line") or ""
    if name == "exactness" and "table" in p:
        t = p["table"]
        w = t.get("worst", {})
        tests = p.get("exactness_tests", {}).get("counts", {})
        gpu = p.get("gpu_tests", {}).get("counts", {})
        return (f"{t.get('cases')} cases, fwd_vs_rev {w.get('fwd_vs_rev') or 0:.1e}, "
                f"fwd_vs_fd {w.get('fwd_vs_fd') or 0:.1e}; test_exactness {tests}; gpu {gpu}")
    if name == "resume" and "summary" in p:
        return "; ".join(f"{mode}: " + ", ".join(
            f"{prob} resumed={'=' if c['resumed_equal'] else '!='} "
            f"rerun={'=' if c['rerun_equal'] else '!='}" if not c.get("error") else
            f"{prob} error" for prob, c in cases.items()) for mode, cases in p["summary"].items())
    return ""


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{'part':<10}{'status':>9}{'secs':>8}{'budget':>8}  result")
    for name, p in result["parts"].items():
        cell = _what(name, p)
        if p.get("status") in ("failed", "timeout") and p.get("error"):
            cell = f"[{p['error'].strip().splitlines()[-1]}] {cell}"
        print(f"{name:<10}{p.get('status', ''):>9}{p.get('seconds', 0):>8.1f}"
              f"{p.get('budget_s', 0):>8.0f}  {cell}")
    rows = result["parts"].get("step", {}).get("rows") or []
    if rows:
        import _common as C

        print()
        print(C.table([r for r in rows if "ms" in r], STEP_COLS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:1, or cpu")
    ap.add_argument("--out", default=str(HERE / "results" / "gpu_suite"),
                    help="folder for gpu_suite.json and the parts' logs")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="seconds for the whole suite (default 540: a 10-minute call)")
    ap.add_argument("--dry-run", action="store_true", help="every part at tiny sizes")
    ap.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--deterministic", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    if args.child == "resume_run":
        child_resume_run(args.device, args.dry_run, args.deterministic, Path(args.work))
        return
    if args.child:
        part = Part(args.child, args.device, args.dry_run, args.deadline, Path(args.work))
        CHILDREN[args.child](part)
        return

    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "suite": "gpu_suite", "started": _now(), "device_arg": args.device,
        "dry_run": args.dry_run, "budget_s": args.budget_s, "host": platform.node(),
        "argv": sys.argv[1:], "device": None,
        "parts": {name: {"status": "pending"} for name in args.parts}}
    import torch

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        msg = (f"gpu_suite: --device {args.device}, but torch {torch.__version__} sees no CUDA "
               f"device (torch.cuda.is_available() is False). Run it on a machine with a GPU, "
               f"or check the suite itself with --device cpu --dry-run.")
        result["error"] = msg
        _write_json(out / "gpu_suite.json", result)
        print(msg, file=sys.stderr)
        raise SystemExit(2)
    work = Path(tempfile.mkdtemp(prefix="gpu_suite_"))
    result["scratch"] = str(work)
    _write_json(out / "gpu_suite.json", result)
    todo = list(args.parts)
    try:
        while todo:
            name = todo[0]
            left = args.budget_s - (time.perf_counter() - t_start)
            budget, minimum = allot(left, todo, args.dry_run)
            if budget < minimum:
                result["parts"][name] = {"status": "skipped", "budget_s": round(budget, 1),
                                         "why": f"does not fit: {budget:.0f} s of the "
                                                f"{left:.0f} s left, it needs {minimum:.0f}"}
            else:
                print(f"# part {name}: budget {budget:.0f} s", flush=True)
                result["parts"][name] = run_part(name, budget, args, work, out)
            if name == "env" and result["parts"][name].get("device"):
                result["device"] = result["parts"][name]["device"].get("name")
            print(f"# part {name}: {result['parts'][name]['status']}", flush=True)
            todo.pop(0)
            result["seconds"] = round(time.perf_counter() - t_start, 1)
            _write_json(out / "gpu_suite.json", result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result["device"] is None:  # env skipped or failed: name it here
        result["device"] = (torch.cuda.get_device_name(torch.device(args.device))
                            if torch.device(args.device).type == "cuda" else "cpu")
    result["line"] = summary_line(result)
    result["finished"] = _now()
    _write_json(out / "gpu_suite.json", result)
    print_table(result)
    print(f"\n# JSON: {out / 'gpu_suite.json'} ({result['seconds']:.0f} s)")
    print(result["line"])
    ok = all(p.get("status") == "ok" for p in result["parts"].values())
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
