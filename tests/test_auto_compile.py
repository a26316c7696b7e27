"""``ForwardMode(compile=None)``, the default: after ``AUTO_COMPILE_AFTER_S`` seconds of eager
steps it times one step's products eager and compiled on the same inputs and keeps the
faster path (compiled only if at least 10 % faster, timed on one step's inputs), with the same
hypergradient either way.

The decision is tested with the two paths' speeds set by the test (the seconds it reads), the
compile failure with a ``torch.compile`` that cannot trace; one real compilation checks that the
hypergradient is the eager one (float64)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

import hypergrad as hg
import hypergrad.hvp as H
import hypergrad.methods.forward as F
from hypergrad.testing import digits_case


def _problem(steps: int = 14, kind: str = "per_tensor_wd") -> hg.InnerProblem:
    """K = 4 (a weight decay per parameter tensor, every column live from the first step): the
    batched products, where compiling applies."""
    return digits_case("momentum", kind, steps=steps, n_train=24, batch_size=8, hidden=8,
                       n_val=32)


def _speeds(monkeypatch: pytest.MonkeyPatch, compiled_s: float, eager_s: float) -> None:
    """Both paths run the eager products (no compilation); the measurement reads the seconds
    the test sets for each (a timing would flake on a loaded machine)."""
    monkeypatch.setattr(H.VmapVJP, "_run", lambda self, *args: H._vmap_vjp(*args))

    def timed(self: Any, fn: Any, *args: Any) -> tuple[Any, float]:
        return fn(*args), (compiled_s if fn is self.compiled else eager_s)

    monkeypatch.setattr(F._Trial, "_timed", timed)


@pytest.mark.parametrize("faster", ["compiled", "eager"])
def test_the_faster_path_is_kept(monkeypatch: pytest.MonkeyPatch, faster: str) -> None:
    monkeypatch.setattr(F, "AUTO_COMPILE_AFTER_S", 0.0)
    _speeds(monkeypatch, 0.01 if faster == "compiled" else 0.03,
            0.03 if faster == "compiled" else 0.01)
    problem = _problem()
    lam = problem.init_raw()
    fm = hg.ForwardMode()
    eager_hvp = fm.hvp
    assert fm.compile is None and fm.compile_report is None
    g = fm.hypergradient(problem, lam).grad
    rep = fm.compile_report
    assert rep is not None and rep["chosen"] == faster, rep
    assert rep["compiled_ms"] is not None and rep["eager_ms"] > 0
    if faster == "compiled":
        assert rep["compiled_ms"] <= 0.9 * rep["eager_ms"]
        assert isinstance(fm.hvp, H.VmapVJP) and fm.hvp.compile
    else:
        assert fm.hvp is eager_hvp and not fm.hvp.compile
    ref = hg.ForwardMode(compile=False).hypergradient(problem, lam).grad
    torch.testing.assert_close(g, ref, rtol=1e-12, atol=1e-14)  # eager products both ways


def test_nothing_is_measured_before_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "AUTO_COMPILE_AFTER_S", 3600.0)
    problem = _problem(steps=4)
    fm = hg.ForwardMode()
    fm.hypergradient(problem, problem.init_raw())
    assert fm.compile_report is None and not fm.hvp.compile


def test_given_choices_are_kept() -> None:
    assert hg.ForwardMode(compile=False)._auto is None
    assert hg.ForwardMode(hg.hvp.ColumnLoop())._auto is None  # only VmapVJP compiles
    assert hg.ForwardMode(hg.hvp.VmapVJP(chunk_size=2))._auto is not None  # as Hydra builds it
    assert hg.ForwardMode(compile=True).hvp.compile
    assert hg.ForwardMode().with_hvp(hg.hvp.ColumnLoop())._auto is None
    with pytest.raises(TypeError, match=r"compile='auto' must be True, False or None"):
        hg.ForwardMode(compile="auto")  # type: ignore[arg-type]


def test_a_model_that_does_not_trace_stays_eager_without_a_warning(
        monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder) -> None:
    monkeypatch.setattr(F, "AUTO_COMPILE_AFTER_S", 0.0)

    def no_trace(fn: Any, *a: Any, **k: Any) -> Any:
        def fails(*args: Any) -> Any:
            raise RuntimeError("cannot trace")
        return fails

    monkeypatch.setattr(torch, "compile", no_trace)
    problem = _problem()
    lam = problem.init_raw()
    fm = hg.ForwardMode()
    g = fm.hypergradient(problem, lam).grad
    rep = fm.compile_report
    assert rep is not None and rep["chosen"] == "eager" and "cannot trace" in rep["reason"]
    assert not fm.hvp.compile
    assert not [w for w in recwarn if "torch.compile failed" in str(w.message)]
    torch.testing.assert_close(g, hg.ReverseMode().hypergradient(problem, lam).grad,
                               rtol=1e-10, atol=1e-13)


@pytest.mark.slow
def test_a_real_compilation_gives_the_eager_hypergradient(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr(F, "AUTO_COMPILE_AFTER_S", 0.0)
    problem = _problem()
    lam = problem.init_raw()
    fm = hg.ForwardMode()
    g = fm.hypergradient(problem, lam).grad
    rep = fm.compile_report
    assert rep is not None and rep["compile_s"] > 0 and rep["chosen"] in ("compiled", "eager")
    torch.testing.assert_close(g, hg.ReverseMode().hypergradient(problem, lam).grad,
                               rtol=1e-10, atol=1e-13)


def test_the_trainer_says_what_was_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "AUTO_COMPILE_AFTER_S", 0.0)
    _speeds(monkeypatch, 0.01, 0.03)
    said: list[str] = []
    tr = hg.Trainer(_problem(), "forward", mode=hg.Offline(outer_steps=2),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    monkeypatch.setattr(tr, "message", said.append)
    tr.fit()
    lines = [m for m in said if m.startswith("compiled products:")]
    assert len(lines) == 1 and "compiled from here on" in lines[0], said


def test_the_time_budget_does_not_predict_steps_from_the_compilation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The outer step that measures (and compiles, here 6 s) is not what the next ones cost:
    the Trainer's time budget keeps going (before: it stopped there, predicting another 6 s)."""
    monkeypatch.setattr(F, "AUTO_COMPILE_AFTER_S", 0.0)
    first = [True]

    def run(self: H.VmapVJP, *args: Any) -> Any:
        if self.compile and first[0]:  # the compiling call
            first[0] = False
            time.sleep(6.0)
        return H._vmap_vjp(*args)

    monkeypatch.setattr(H.VmapVJP, "_run", run)
    tr = hg.Trainer(_problem(), "forward", mode=hg.Offline(outer_steps=1000),
                    guards=hg.Guards(time_budget=10.0),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    res = tr.fit()
    rep = tr.method.compile_report
    assert rep is not None and rep["trial_s"] >= 6.0
    # the measurement runs in outer step 0 (the start's points are plain runs)
    assert len(res.history) >= 2, [h.get("seconds") for h in res.history]


def test_chunked_products_are_not_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked products change the compiled call's shapes between calls (every chunk's slice
    compiles anew, up to dynamo's limit): eager, said in the report, nothing compiled."""
    monkeypatch.setattr(F, "AUTO_COMPILE_AFTER_S", 0.0)
    compiled: list[int] = []
    monkeypatch.setattr(torch, "compile", lambda fn, *a, **k: compiled.append(1) or fn)
    problem = _problem()
    fm = hg.ForwardMode(hg.hvp.VmapVJP(chunk_size=2))
    fm.hypergradient(problem, problem.init_raw())
    rep = fm.compile_report
    assert rep is not None and rep["chosen"] == "eager" and "not tried" in rep["reason"]
    assert "chunks" in rep["reason"]
    assert not compiled and not fm.hvp.compile


def _counting_compile(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``torch.compile`` as the identity, recording the column count of every call."""
    counts: list[int] = []

    def compile_(fn: Any, *a: Any, **k: Any) -> Any:
        def run(*args: Any) -> Any:
            counts.append(args[6].shape[0])  # eye: (columns, K)
            return fn(*args)
        return run

    monkeypatch.setattr(torch, "compile", compile_)
    return counts


def test_a_schedule_compiles_a_few_column_counts_with_the_eager_hypergradient(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule's windows start one after another, so the live columns grow step by step;
    the compiled products pad them with zero columns to at most ``COMPILE_BUCKETS`` counts
    (each count would compile anew) and give eager's hypergradient (float64)."""
    counts = _counting_compile(monkeypatch)
    problem = digits_case("sgd", "schedule", steps=16, n_train=24, batch_size=8, hidden=8,
                          n_val=32, windows=8)
    lam = problem.init_raw()
    eager = hg.ForwardMode(compile=False)
    g_eager = eager.hypergradient(problem, lam).grad
    live: list[int] = []
    with monkeypatch.context() as m:
        m.setattr(H, "_vmap_vjp", _recording(H._vmap_vjp, live))
        eager.hypergradient(problem, lam)
    g = hg.ForwardMode(compile=True).hypergradient(problem, lam).grad
    assert set(live) == set(range(2, 9)), live  # unpadded: a count per window (one: autograd)
    assert counts and set(counts) <= {2, 4, 6, 8} and len(set(counts)) <= H.COMPILE_BUCKETS
    torch.testing.assert_close(g, g_eager, rtol=1e-12, atol=1e-14)


def _recording(fn: Any, into: list[int]) -> Any:
    def run(*args: Any) -> Any:
        into.append(args[6].shape[0])
        return fn(*args)
    return run


def test_a_schedule_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns that start later no longer keep ``compile=None`` from measuring: the report
    says what it measured, and the compiled path, if kept, pads to a few counts."""
    monkeypatch.setattr(F, "AUTO_COMPILE_AFTER_S", 0.0)
    _speeds(monkeypatch, 0.01, 0.03)
    problem = digits_case("sgd", "schedule", steps=16, n_train=24, batch_size=8, hidden=8,
                          n_val=32, windows=8)
    fm = hg.ForwardMode()
    g = fm.hypergradient(problem, problem.init_raw()).grad
    rep = fm.compile_report
    assert rep is not None and rep["chosen"] == "compiled", rep
    g_eager = hg.ForwardMode(compile=False).hypergradient(problem, problem.init_raw()).grad
    torch.testing.assert_close(g, g_eager, rtol=1e-12, atol=1e-14)


def test_a_schedule_does_not_recompile_per_window() -> None:
    """Under torch.compile the step is a symbolic int; min() and indexing by the window guarded
    on each window's index: a 10-window schedule compiled 8 graphs (dynamo's limit, then eager
    with a warning per run). sym_min and select keep the window symbolic: 2 graphs (the first
    step's static one, then a dynamic one)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    hps = hg.HyperParams([hg.Schedule("lr", 0.1, "log", windows=10),
                          hg.Scalar("wd", 1e-3, "log")])
    lam = hps.init_raw(torch.float64) + torch.linspace(0, 1, 11, dtype=torch.float64)

    def lr(lam: torch.Tensor, t: int) -> torch.Tensor:
        return hps.values(lam, t, 100)["lr"] * 2

    compiled = torch.compile(lr)
    for t in range(0, 100, 10):
        assert torch.equal(compiled(lam, t), lr(lam, t))
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    torch._dynamo.reset()
