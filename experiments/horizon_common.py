"""Shared parts of experiments/long_horizon.py: resumable records, the CPU clock, statistics.

- :class:`Records`: one JSON line per finished unit of work (a method at a horizon, a tuner on
  a seed); a restarted run skips the units already there, so a killed run loses at most the
  unit it was in.
- Budgets are **process CPU seconds** of a single-threaded process (``time.process_time`` with
  ``torch.set_num_threads(1)``): another process's load on a shared machine does not change
  them. On a quiet machine CPU time and wall clock are the same. The forward contenders'
  Trainer reads that clock too (``Guards(clock="cpu")``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"

SIGN_SMOOTH: float | None = None
"""The sign-step forward contender's coupling of a schedule's windows
(``SignDescent(precondition=schedule_smoothing(..., SIGN_SMOOTH))``); ``None``: each window's
own sign, as FDS (and the committed runs)."""


def one_thread() -> None:
    """One torch thread (the budgets are CPU seconds of one core), torch.compile's kernels
    compiled in this process (its worker processes' CPU seconds would escape the budget:
    ``ForwardMode()`` compiles its products in long runs), and glibc's malloc tuned as the
    benchmarks do."""
    import torch._inductor.config as inductor

    from hypergrad.alloc import tune_malloc

    torch.set_num_threads(1)
    inductor.compile_threads = 1
    tune_malloc()


def cpu() -> float:
    """This process's CPU seconds (user + system)."""
    return time.process_time()


def fit_forward(problem: Any, budget: float, bounds: dict[str, tuple[float, float]],
                defaults: bool, mode: Any = None) -> Any:
    """Forward-mode tuning of ``problem`` within ``budget`` CPU seconds in the box ``bounds``:
    the Trainer's default outer loop (``defaults``; ``mode`` replaces its default mode) or
    FDS-style sign steps of 0.5 with backtracking (the presets'); returns the
    :class:`~hypergrad.TrainResult`."""
    import functools

    import hypergrad as hg
    from hypergrad.run.outer import schedule_smoothing

    kw: dict[str, Any] = ({} if mode is None else {"mode": mode}) if defaults else dict(
        outer=functools.partial(hg.SignDescent, lr=0.5, precondition=schedule_smoothing(
            problem.hyperparams.items, SIGN_SMOOTH)),
        mode=hg.Offline(outer_steps=10**6))
    said: list[str] = []

    class Said(hg.Callback):
        def on_message(self, trainer: Any, text: str) -> None:
            said.append(text)

    tr = hg.Trainer(problem, hg.ForwardMode(),
                    guards=hg.Guards(time_budget=budget, bounds=bounds,
                                     backtrack=None if defaults else 1.5, clock="cpu"),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False), Said()], **kw)
    res = tr.fit()
    # what forward_info keeps: whether the surrogate model found the hypergradients at odds
    # with the plain runs' losses (docs/troubleshooting.md, "Rough losses"), its last fit
    res.rough = any("do not describe the validation losses" in t for t in said)
    res.surrogate_fit = getattr(tr.outer, "last_fit", None)
    return res


def forward_info(res: Any) -> dict[str, Any]:
    """What a forward contender's record keeps of its run: outer steps, plain runs, the
    re-checked pairs, the validation curve."""
    return {"best_step": res.best_step, "hypergradients": len(res.history),
            "plain_runs": len(res.evaluations),
            "rechecked": [(r["val_loss"], r["variant_val_loss"]) for r in res.rechecked],
            "val_curve": [h["val_loss"] for h in res.history],
            "backtracks": sum(bool(h.get("backtracked")) for h in res.history),
            "rough": getattr(res, "rough", None),
            "surrogate_fit": getattr(res, "surrogate_fit", None)}


class Records:
    """A JSON-lines file of finished units: ``{"unit": key, ...}`` per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: dict[str, dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:  # a line cut by a kill: that unit runs again
                        continue
                    self.rows[row["unit"]] = row

    def done(self, unit: str) -> bool:
        return unit in self.rows

    def get(self, unit: str) -> dict[str, Any]:
        return self.rows[unit]

    def add(self, unit: str, row: dict[str, Any]) -> dict[str, Any]:
        from hypergrad.run.files import dumps

        row = {"unit": unit, **row}
        with open(self.path, "a") as fh:
            fh.write(dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.rows[unit] = row
        return row

    def where(self, **match: Any) -> list[dict[str, Any]]:
        return [r for r in self.rows.values() if all(r.get(k) == v for k, v in match.items())]


def resumed_rows(out: Path, key: str, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows ``out`` holds under ``key`` where a run of the same ``settings`` wrote it (a
    resume goes on from them), ``[]`` where there is no file. A file written under other
    settings is refused, naming them: a smoke run's rows were taken as the full study's (the
    full command trained nothing and printed them), and rows of two sizes met in one table.
    A setting the file does not record (one written before it was) is not compared."""
    if not out.exists():
        return []
    data = json.loads(out.read_text())
    other = {k: (data[k], v) for k, v in settings.items() if k in data and data[k] != v}
    if other:
        said = ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in other.items())
        raise SystemExit(f"{out} holds rows of a run with other settings ({said}): resume it "
                         f"with its settings, or give another --out.")
    return list(data[key])


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (``nan`` for fewer than 2 values)."""
    xs = [float(x) for x in xs]
    if not xs:
        return math.nan, math.nan
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan)


def ratio_se(num: Sequence[float], den: Sequence[float]) -> tuple[float, float]:
    """``mean(num) / mean(den)`` and the standard error of the per-seed ratios
    ``num_s / den_s`` (paired by seed)."""
    if not num or not den:
        return math.nan, math.nan
    r = statistics.fmean(num) / statistics.fmean(den)
    per = [a / b for a, b in zip(num, den)]
    return r, (statistics.stdev(per) / math.sqrt(len(per)) if len(per) > 1 else math.nan)


def _cpu_model() -> str:
    """The CPU's model name, as the benchmarks record it (CPU-second budgets buy what this CPU
    does in them)."""
    bench = str(Path(__file__).resolve().parent / "benchmarks")
    if bench not in sys.path:
        sys.path.append(bench)
    import _common

    return str(_common.machine()["cpu"])


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "argv": sys.argv[1:],
            "clock": "process CPU seconds (time.process_time), one torch thread"}


def optuna_within_budget(sampler: Any, first: dict[str, Any], budget: float,
                         evaluate: Callable[[Any], tuple[float, dict[str, Any]]],
                         default: dict[str, Any]) -> dict[str, Any]:
    """Optuna's ask/tell loop in this process's CPU seconds: the study starts at ``first``
    (enqueued), ``evaluate(trial)`` suggests, trains and returns (validation loss, spec); a next
    trial starts only while the last one's cost still fits in ``budget``. The best spec on
    validation (``default`` until one is finite), its loss, the seconds and the evaluations."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.enqueue_trial(first)
    t0 = cpu()
    best: tuple[float, dict[str, Any]] = (math.inf, default)
    last, n = 0.0, 0
    while not n or cpu() - t0 + last <= budget:
        t1 = cpu()
        tr = study.ask()
        val, spec = evaluate(tr)
        study.tell(tr, val if math.isfinite(val) else 1e30)
        last, n = cpu() - t1, n + 1
        if val < best[0]:
            best = (val, spec)
    return {"val": best[0], "cpu_s": cpu() - t0, "evals": n, "spec": best[1], "info": {}}
