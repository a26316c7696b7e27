"""experiments/benchmarks/gpu_suite.py (issue 25.3): its dry run on the CPU writes every part's
fields and the last line; without CUDA, ``--device cuda`` stops with a clear message; and, on a
GPU (marked ``gpu``: the suite's exactness part runs it), the float64 checks on CUDA tensors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hypergrad as hg
from hypergrad.testing import digits_case, hypergradcheck, rel_err

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "experiments" / "benchmarks" / "gpu_suite.py"
PARTS = ["env", "step", "models", "exactness", "resume"]
LINE = re.compile(r"^gpu_suite device=\S+ parts_ok=(\d+)/(\d+) batched_vs_loop_K64=(\S+) "
                  r"fwd_over_rev_T=(\S+) exactness_max_fwd_vs_rev=(\S+)$")


def _suite(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SUITE), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


@pytest.mark.slow
def test_dry_run_writes_every_part_and_the_last_line(tmp_path: Path) -> None:
    res = _suite("--device", "cpu", "--dry-run", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    m = LINE.match(last)
    assert m, last
    assert m.group(1) == m.group(2) == "5"
    for value in m.groups()[2:]:
        float(value)  # every number measured
    d = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert d["line"] == last and d["dry_run"] and d["device"]
    assert list(d["parts"]) == PARTS
    assert {p["status"] for p in d["parts"].values()} == {"ok"}
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(
        ["gpu_suite.json", *(f"{p}.log" for p in PARTS)])  # at most 8 files come back
    env, step, models, exact, resume = (d["parts"][p] for p in PARTS)
    for key in ("matmul_allow_tf32", "cudnn_allow_tf32", "cudnn_benchmark",
                "cudnn_deterministic", "float32_matmul_precision", "name", "capability",
                "memory_gib", "torch", "cuda", "cudnn"):
        assert key in env["device"], key
    assert step["device"]["matmul_allow_tf32"] is not None  # the flags it ran with
    assert step["matmul_peak_gflops"] > 0
    rows = [r for r in step["rows"] if "ms" in r]
    configs = {("mlp", 4), ("mlp", 64), ("cnn8", 4)}
    assert {(r["model"], r["k"], r["strategy"]) for r in rows} == {
        (m, k, s) for m, k in configs for s in ("loop", "vmap_vjp")}
    for r in rows:
        assert r["peak_share"] > 0 and r["speedup_vs_loop"] > 0 and "peak_mib" in r
    hyp = step["hypergradients"]
    assert {(h["model"], h["k"]) for h in hyp} == configs
    for h in hyp:
        assert h["fwd_over_rev"] > 0 and h["rel_diff_float32"] < 1e-3
        assert h["forward_peak_mib"] >= 0 and h["reverse_peak_mib"] >= 0
    assert step["summary"]["batched_vs_loop_K64_min"] == pytest.approx(float(m.group(3)),
                                                                       abs=0.01)
    assert [r["strategy"] for r in models["rows"]] == ["loop", "vmap_vjp"]
    assert models["runs"][0]["returncode"] == 0
    assert exact["table"]["complete"] and exact["table"]["cases"] == 3
    assert exact["table"]["within_tolerances"]
    assert exact["exactness_tests"]["counts"] == {"passed": 2}
    assert exact["exactness_tests"]["env"] == "HYPERGRAD_TEST_DEVICE=cpu"
    assert exact["gpu_tests"]["files"] == ["tests/test_gpu_suite.py"]
    assert exact["gpu_tests"]["counts"].get("skipped", 0) >= 1  # no CUDA here
    assert [r["deterministic"] for r in resume["runs"]] == [False, True]
    for run in resume["runs"]:
        assert run["returncode"] == 0
        assert {c["problem"] for c in run["cases"]} == {"digits_per_example",
                                                        "token_bag_index_add"}
        for c in run["cases"]:
            assert c["checkpoint_outer_step"] == 2
            assert c["resumed_equal"] and c["rerun_equal"]  # the CPU is deterministic


def test_parts_that_do_not_fit_the_budget_are_skipped_and_said(tmp_path: Path) -> None:
    res = _suite("--device", "cpu", "--dry-run", "--budget-s", "0.01", "--out", str(tmp_path),
                 timeout=120)
    assert res.returncode == 1
    assert res.stdout.strip().splitlines()[-1].startswith("gpu_suite device=cpu parts_ok=0/5 ")
    d = json.loads((tmp_path / "gpu_suite.json").read_text())
    for part in d["parts"].values():
        assert part["status"] == "skipped" and "does not fit" in part["why"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_cuda_without_a_gpu_stops_with_a_clear_message(tmp_path: Path) -> None:
    res = _suite("--device", "cuda", "--out", str(tmp_path), timeout=120)
    assert res.returncode == 2
    assert "sees no CUDA device" in res.stderr and "--device cpu --dry-run" in res.stderr
    assert "sees no CUDA device" in json.loads((tmp_path / "gpu_suite.json").read_text())[
        "error"]


SMALL = dict(steps=6, n_train=24, batch_size=8, hidden=8, n_val=32, windows=3)


@pytest.mark.gpu
@pytest.mark.parametrize("opt,kind", [("adam", "per_example"), ("momentum", "schedule"),
                                      ("rmsprop", "per_tensor_wd")])
def test_float64_checks_on_cuda_agree_with_the_cpu(opt: str, kind: str) -> None:
    problem = digits_case(opt, kind, device="cuda", **SMALL)
    assert problem.device.type == "cuda"
    rep = hypergradcheck(problem)  # forward = reverse = finite differences, on the GPU
    assert rep.grad is not None
    cpu = digits_case(opt, kind, device="cpu", **SMALL)
    ref = hg.ForwardMode().hypergradient(cpu, cpu.init_raw()).grad
    assert rel_err(rep.grad.cpu(), ref) <= 1e-10
