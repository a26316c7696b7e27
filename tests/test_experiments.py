"""The experiment scripts run, and print what the README says they print."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _script(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_exactness_script_small(tmp_path: Path) -> None:
    # 3 windows over the 3 steps: with the script's default 4, window 3 is read by no step,
    # which InnerProblem.check refuses (issue 23)
    out = _script("experiments/exactness.py", "--steps", "3", "--windows", "3", "--n-train", "16",
                  "--json", str(tmp_path / "e.json"))
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"max_rel_err fwd_vs_rev=(\S+) fwd_vs_fd=(\S+) strategies=(\S+)", last)
    assert m, last
    x, y, z = map(float, m.groups())
    assert x <= 1e-8 and y <= 1e-5 and z <= 1e-10
    assert (tmp_path / "e.json").exists()


def test_compare_script_small() -> None:
    out = _script("experiments/compare.py", "--steps", "3", "6", "--hidden", "8")
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["3", "6"]
    assert all(float(r[2]) < 1e-10 for r in rows)  # forward = reverse


def test_benchmark_tables_render_the_committed_results() -> None:
    """BENCHMARKS.md's tables come from tables.py over the committed JSON: every benchmark
    renders, with its summary line, and the bench_step table holds the default strategy."""
    out = _script("experiments/benchmarks/tables.py")
    for name in ("bench_step", "bench_memory", "bench_schedule", "bench_conv", "bench_tangent"):
        assert f"### {name}" in out
        assert f"{name}.json not found" not in out
    assert "| vmap_vjp |" in out and "`speedup_vs_loop K16=" in out
    assert "`forward_flat T" in out
    unknown = subprocess.run([sys.executable, "experiments/benchmarks/tables.py", "bench_nope"],
                             capture_output=True, text=True, cwd=ROOT)
    assert unknown.returncode != 0 and "unknown benchmark 'bench_nope'" in unknown.stderr


def test_vs_optuna_script_small(tmp_path: Path) -> None:
    """The head-to-head at a tiny size: three tuners, the table, the JSON summary, the curves
    and the last line. The budget (5 s) leaves every tuner at least one evaluation on a loaded
    machine (at 1.5 s one of them sometimes finished none)."""
    import json

    pytest.importorskip("optuna")
    out = _script("experiments/vs_optuna.py", "--quick", "--problems", "digits_schedule",
                  "--seeds", "1", "--retrain-seeds", "1", "--budget-scale", "0.5",
                  "--max-wait", "0", "--retry-contended", "0", "--override", "task.steps=30",
                  "--out", str(tmp_path))
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"vs_optuna wins=(\d)/1 seeds=1", last)
    assert m, last
    assert "val loss at B" in out and "test loss (retrained)" in out
    data = json.loads((tmp_path / "vs_optuna_quick.json").read_text())
    assert data["summary"] == {"wins": int(m[1]), "problems": 1, "seeds": 1}
    res = data["problems"]["digits_schedule"]
    # the cost ratio is measured (positive, finite); its size is a timing, which unit tests do
    # not judge (on a loaded machine a 30-step plain run timed 0.97 of a reverse hypergradient)
    assert res["K"] == 10 and res["T"] == 30 and 0 < res["costs"]["ratio"] < math.inf
    assert set(res["tuners"]) == {"hypergrad", "tpe", "random"}
    for tr in res["tuners"].values():
        seed = tr["seeds"][0]
        assert seed["evals"] >= 1 and seed["grad_equivalents"] > 0
        assert seed["best_time"] <= res["budget_s"] and seed["val_at_budget"] > 0
        assert tr["retrain"]["test_loss"]["mean"] > 0
    assert (tmp_path / "vs_optuna_digits_schedule.png").stat().st_size > 1000


def test_bench_vs_jax_runs_both_sides_on_the_same_step(tmp_path: Path) -> None:
    """The peer benchmark's torch and JAX children compute the same tangent step (the sums of
    their tangents after the same steps agree), and the parent prints its table and last line."""
    pytest.importorskip("jax")
    out = _script("experiments/benchmarks/bench_vs_jax.py", "--rows", "mlp:4", "cnn:4",
                  "--rounds", "1", "--steps", "3", "--threads", "1", "--compile", "eager",
                  "--json", str(tmp_path / "vs_jax.json"))
    last = out.strip().splitlines()[-1]
    assert last.startswith("vs_jax max_ratio=") and "rows=2 threads=1" in last
    rows = json.loads((tmp_path / "vs_jax.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["mlp", "cnn"]
    assert all(r["torch_chose"] == ["eager"] for r in rows)  # --compile eager
    for r in rows:
        assert r["check_rel_diff"] < 1e-4, r  # float32: the same numbers to rounding
        assert r["torch_ms"] > 0 and r["jax_ms"] > 0


def test_bench_precision_compares_float32_with_float64(tmp_path: Path) -> None:
    """The precision benchmark's float32 hypergradients are float32-close to the float64 one of
    the same problem (same data, drawn in float64), and it prints its table and last line."""
    out = _script("experiments/benchmarks/bench_precision.py", "--models", "mlp", "--k", "3",
                  "--steps", "3", "--json", str(tmp_path / "p.json"))
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"precision device=cpu worst_fp32_vs_fp64=(\S+) worst_tf32_vs_fp64=n/a",
                     last)
    assert m, last
    assert 0 < float(m.group(1)) < 1e-4  # float32 rounding, not a different problem
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["mlp"] and rows[0]["fwd32_vs_rev32"] < 1e-4


def test_bench_tape_times_both_reverse_modes_with_the_same_hypergradient(tmp_path: Path) -> None:
    """One suite problem: the row has both reverse modes (and forward mode) in plain runs, the
    same hypergradient, and the last line."""
    out = _script("experiments/benchmarks/bench_tape.py", "--quick", "--no-wait", "--problems",
                  "wine_per_tensor_lr", "--json", str(tmp_path / "t.json"))
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"tape_vs_reverse median=\S+ max=\S+ \(problems 1\); tape in plain "
                        r"runs \S+-\S+; reverse direct/torch.func median=\S+ max=\S+",
                        last), last
    (row,) = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert row["problem"] == "wine_per_tensor_lr" and row["rel_diff"] < 1e-5
    assert row["tape_x_plain"] > 1 and row["reverse_x_plain"] > 1
    assert row["reverse_func_x_plain"] > 1 and row["direct_vs_func"] > 0


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="times git revisions: a checkout only "
                                                         "(the sdist has no history)")
def test_bench_code_versions_times_a_revision_in_its_own_tree(tmp_path: Path) -> None:
    """HEAD's tree extracted and timed in a fresh process: a hypergradient costs more than a
    plain run; a revision that is no commit is named."""
    out = _script("experiments/benchmarks/bench_code_versions.py", "--code", "HEAD",
                  "--problems", "wine_per_tensor_lr", "--rounds", "1", "--repeats", "1",
                  "--no-wait", "--out", str(tmp_path / "c.json"))
    assert re.fullmatch(r"code_versions HEAD=\S+", out.strip().splitlines()[-1])
    got = json.loads((tmp_path / "c.json").read_text())["code"]["HEAD"]
    assert len(got["commit"]) == 40 and got["problems"]["wine_per_tensor_lr"]["plain_runs"] > 1
    bad = subprocess.run([sys.executable, "experiments/benchmarks/bench_code_versions.py",
                          "--code", "no-such-rev", "--no-wait"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert bad.returncode != 0 and "--code 'no-such-rev' is not a commit" in bad.stderr


def test_bench_tape_times_the_language_model_with_dropout_on_the_direct_route(
        tmp_path: Path) -> None:
    """``--lm``: the char LM (dropout) as a row, its reverse mode on the direct route (its draws
    agree with torch.func's), the same hypergradient as the torch.func route."""
    _script("experiments/benchmarks/bench_tape.py", "--quick", "--no-wait", "--problems", "--lm",
            "--lm-steps", "10", "--json", str(tmp_path / "t.json"))
    (row,) = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert row["problem"] == "charlm_dropout" and row["K"] == 17 and row["T"] == 10
    assert row["direct_draws"] is True and row["rel_diff"] < 1e-4
    assert row["reverse_x_plain"] > 1 and row["direct_vs_func"] > 0


def test_profile_plain_profiles_both_steps() -> None:
    out = _script("experiments/benchmarks/profile_plain.py", "--model", "transformer",
                  "--k", "2", "--rows", "3")
    assert "## library step" in out and "## torch step" in out
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"profile_plain model=transformer device=cpu lib_ms=(\S+) torch_ms=(\S+) "
                     r"lib_ops=(\d+) torch_ops=(\d+)", last)
    assert m, last
    assert float(m.group(1)) > 0 and int(m.group(3)) > 0


def test_bench_plain_lm_times_the_three_plain_runs(tmp_path: Path) -> None:
    """The language model's plain run three ways at the smoke size: the library's flat and
    per-parameter updates end at the same validation loss (the script refuses otherwise), every
    time is positive, and the last line has the three ratios."""
    out = _script("experiments/benchmarks/bench_plain_lm.py", "--quick", "--out",
                  str(tmp_path / "b.json"))
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"bench_plain_lm lib_over_torch=(\S+) per_parameter_over_torch=(\S+) "
                     r"flat_speedup=(\S+)", last)
    assert m, last
    got = json.loads((tmp_path / "b.json").read_text())
    assert got["val"]["library"] == got["val"]["library_per_parameter"]
    assert all(s > 0 for v in got["seconds"].values() for s in v)
    assert float(m.group(1)) == pytest.approx(got["summary"]["lib_over_torch"], abs=0.01)
