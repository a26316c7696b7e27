"""Three tuners over one search space at one wall-clock budget (``vs_optuna.py``).

- hypergrad: the preset's :class:`~hypergrad.Trainer` (method, outer optimizer), projected into
  the search space's box (as ``Guards(bounds=...)``) and stopped by ``Guards(time_budget=...)``;
- Optuna's TPE sampler and Optuna's RandomSampler, driven with ask/tell: each trial one full
  inner training at the proposed hyperparameters.

All three search the same space: the preset's hyperparameters in the raw (transformed)
coordinates the Trainer optimizes, each in a box (:class:`SearchSpace`), and are judged by the
same number, the validation loss ``E(w_T)`` after one inner run (the number the Trainer records
per outer step). A tuner's result at budget ``B`` is the best validation loss among the points
it evaluated that finished within ``B`` seconds of its start.

Optuna is imported only by :func:`run_optuna` (the ``compare`` extra).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from hypergrad.hyperparams import TRANSFORMS, HyperParams
from hypergrad.problem import InnerProblem

__all__ = ["SearchSpace", "Run", "validation_loss", "run_optuna", "run_trainer",
           "LOG_RANGE", "LOGIT_RANGE", "IDENTITY_RANGE", "plain_steps", "ZerothOrder",
           "sampler", "SAMPLERS"]

LOG_RANGE = math.log(100.0)
"""A log-transformed hyperparameter without bounds: raw ``init +- log(100)``, i.e. values from
``init / 100`` to ``init * 100``."""
LOGIT_RANGE = 6.0
"""A logit-transformed one without bounds: raw ``[-6, 6]``, values ``0.0025 .. 0.9975``."""
IDENTITY_RANGE = 1.0
"""An identity-transformed one without bounds: ``init +- 1``."""


def _default_box(transform: str, init: Tensor) -> tuple[float, float]:
    """Value-space bounds of a hyperparameter without (one of) its bounds, from its initial
    values (shape (n,), value space): the documented box around the initial value."""
    lo, hi = float(init.min()), float(init.max())
    if transform == "log":
        return lo * math.exp(-LOG_RANGE), hi * math.exp(LOG_RANGE)
    if transform == "logit":
        s = 1.0 / (1.0 + math.exp(LOGIT_RANGE))
        return min(s, lo), max(1.0 - s, hi)
    return lo - IDENTITY_RANGE, hi + IDENTITY_RANGE


@dataclass
class SearchSpace:
    """A box in raw coordinates: ``low[i] <= lam[i] <= high[i]`` for the K raw hyperparameters.

    ``value_bounds[name] = (low, high)`` is the same box in value space per hyperparameter, in
    the form :class:`~hypergrad.Guards` takes as ``bounds`` (the Trainer projects ``lam``
    into them),
    so the hypergradient tuner and the samplers search the same space. ``names[i]`` names raw
    coordinate ``i`` for Optuna (``lr[0]``, ``momentum``, ``wd[3]``).
    """

    names: list[str]
    low: Tensor
    high: Tensor
    value_bounds: dict[str, tuple[float, float]]

    @classmethod
    def from_problem(cls, hyperparams: HyperParams,
                     bounds: Mapping[str, Sequence[float | None]] | None = None,
                     dtype: torch.dtype = torch.float64) -> SearchSpace:
        """The preset's bounds (value space) where given; elsewhere (and for a ``None`` end) the
        box around the initial value: raw ``init +- log(100)`` for ``log`` transforms, raw
        ``[-6, 6]`` for ``logit``, ``init +- 1`` for ``identity``. Every coordinate of one
        hyperparameter gets the same bounds (a box spanning all of its initial values)."""
        bounds = dict(bounds or {})
        unknown = sorted(set(bounds) - set(hyperparams.names))
        if unknown:
            raise ValueError(f"SearchSpace: bounds for {unknown}, which are not hyperparameters "
                             f"({hyperparams.names}).")
        names: list[str] = []
        low: list[float] = []
        high: list[float] = []
        vb: dict[str, tuple[float, float]] = {}
        for it in hyperparams.items:
            fwd, inverse = TRANSFORMS[it.transform][:2]
            init = fwd(it.init_raw(torch.float64).reshape(-1))
            d_lo, d_hi = _default_box(it.transform, init)
            given = list(bounds.get(it.name) or (None, None))
            v_lo = d_lo if given[0] is None else float(given[0])
            v_hi = d_hi if given[1] is None else float(given[1])
            if not v_lo < v_hi:
                raise ValueError(f"SearchSpace: bounds of {it.name!r} are ({v_lo}, {v_hi}); "
                                 f"need low < high.")
            r_lo = float(inverse(torch.tensor(v_lo, dtype=torch.float64)))
            r_hi = float(inverse(torch.tensor(v_hi, dtype=torch.float64)))
            if not (math.isfinite(r_lo) and math.isfinite(r_hi)):
                raise ValueError(f"SearchSpace: bounds ({v_lo}, {v_hi}) of {it.name!r} map to "
                                 f"raw ({r_lo}, {r_hi}) under transform={it.transform!r}: a "
                                 f"sampler needs a finite box.")
            vb[it.name] = (v_lo, v_hi)
            n, base = it.numel, it.base_numel
            names += [it.name] if it.shape() == () else [f"{it.name}[{i}]" for i in range(n)]
            low += [r_lo] * base
            high += [r_hi] * base
            # a schedule's tuned scales (factors, not in the windows' units): the box around
            # their initial values, as the Trainer fills it, bounded by their own keys
            for label in it.entry_labels()[:n - base]:
                f = init[it.entries_of(label)]
                s_lo, s_hi = _default_box(it.transform, f)
                vb[f"{it.name}[{label}]"] = (s_lo, s_hi)
                low.append(math.log(s_lo))
                high.append(math.log(s_hi))
        return cls(names, torch.tensor(low, dtype=dtype), torch.tensor(high, dtype=dtype), vb)

    @property
    def dim(self) -> int:
        return len(self.names)

    def clamp(self, lam: Tensor) -> Tensor:
        """``lam`` projected into the box (in ``lam``'s dtype)."""
        return torch.minimum(torch.maximum(lam, self.low.to(lam)), self.high.to(lam))

    def contains(self, lam: Tensor, tol: float = 1e-6) -> bool:
        lo, hi = self.low.to(torch.float64), self.high.to(torch.float64)
        x = lam.detach().to(torch.float64)
        return bool(((x >= lo - tol) & (x <= hi + tol)).all())

    def params(self, lam: Tensor) -> dict[str, float]:
        """``{coordinate name: raw value}`` of a point (projected into the box): what Optuna's
        ``enqueue_trial`` takes."""
        x = self.clamp(lam.detach().to(torch.float64))
        return {n: float(v) for n, v in zip(self.names, x.tolist())}

    def suggest(self, trial: Any, dtype: torch.dtype = torch.float32) -> Tensor:
        """One ``trial.suggest_float`` per raw coordinate, uniform in its box (Optuna)."""
        vals = [trial.suggest_float(n, float(lo), float(hi))
                for n, lo, hi in zip(self.names, self.low.tolist(), self.high.tolist())]
        return torch.tensor(vals, dtype=dtype)


def raw_from_values(hyperparams: HyperParams, values: Mapping[str, Any],
                    dtype: torch.dtype = torch.float32) -> Tensor:
    """The raw ``lam`` of ``values`` as :meth:`HyperParams.describe` gives them (the inverse
    transforms; a Trainer history record holds values)."""
    parts = []
    for it in hyperparams.items:
        inverse = TRANSFORMS[it.transform][1]
        v = torch.as_tensor(values[it.name], dtype=torch.float64).reshape(-1)
        parts.append(inverse(v))
    return torch.cat(parts).to(dtype)


def validation_loss(problem: InnerProblem, lam: Tensor) -> float:
    """``E(w_T)`` after one plain inner run at ``lam``: a black-box tuner's objective, the same
    number the Trainer records per outer step."""
    with torch.no_grad():
        s = problem.run(lam)
        return float(problem.objective(s.params, s.buffers, lam))


@dataclass
class Run:
    """One tuner's run: every evaluated point with the seconds (since the tuner started) at
    which its evaluation finished, in order."""

    tuner: str
    seed: int
    budget: float
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lams: list[Tensor] = field(default_factory=list, repr=False)
    seconds: float = 0.0  # the whole run, past the budget included
    info: dict[str, Any] = field(default_factory=dict)
    returned: int | None = None
    """The index of the point the tuner itself returned, where it chooses otherwise than by
    the lowest validation loss of one run (the Trainer's re-check); ``None``: :meth:`best`."""

    def add(self, t: float, loss: float, lam: Tensor) -> None:
        self.times.append(float(t))
        self.losses.append(float(loss) if math.isfinite(loss) else math.inf)
        self.lams.append(lam.detach().clone())

    def within(self, budget: float | None = None) -> list[int]:
        """Indices of the evaluations that finished within ``budget`` (default: the run's)."""
        b = self.budget if budget is None else budget
        return [i for i, t in enumerate(self.times) if t <= b]

    def best(self, budget: float | None = None) -> tuple[float, int]:
        """``(best validation loss, its index)`` among the evaluations within the budget
        (``(inf, -1)`` if none finished in time)."""
        idx = self.within(budget)
        if not idx:
            return math.inf, -1
        i = min(idx, key=lambda j: self.losses[j])
        return self.losses[i], i

    def chosen(self) -> tuple[float, int]:
        """``(validation loss, index)`` of the tuner's result: the point it returned if it
        was decided within the budget (:attr:`returned`), else :meth:`best`."""
        if self.returned is not None and self.seconds <= self.budget * (1 + 1e-6):
            return self.losses[self.returned], self.returned
        return self.best()

    def answer(self) -> tuple[float, Any]:
        """``(validation loss, lam)`` of the tuner's result (:meth:`chosen`); where nothing
        finished within the budget, its starting point (``lams[0]``) with loss ``inf``."""
        best, idx = self.chosen()
        return best, self.lams[idx] if idx >= 0 else self.lams[0]

    def curve(self, grid: Sequence[float]) -> list[float]:
        """Best validation loss found by each time of ``grid`` (``inf`` before the first)."""
        out, best, j = [], math.inf, 0
        order = sorted(range(len(self.times)), key=self.times.__getitem__)
        for g in grid:
            while j < len(order) and self.times[order[j]] <= g:
                best = min(best, self.losses[order[j]])
                j += 1
            out.append(best)
        return out


def plain_steps(run: Run, steps: int, ratio: float, budget: float | None = None) -> float:
    """Gradient-equivalents a run spent within the budget: plain inner steps, a hypergradient
    counted as ``ratio`` plain inner runs (its measured time over a plain run's). ``run.info``
    says which evaluations were hypergradients (``"hypergradients"``: their indices)."""
    idx = run.within(budget)
    hyper = set(run.info.get("hypergradients", []))
    return float(sum(steps * (ratio if i in hyper else 1.0) for i in idx))


SAMPLERS = ("tpe", "tpe_hyperband", "random", "cmaes")
"""Optuna's contenders: TPE, TPE with the Hyperband pruner over inner steps, random search,
CMA-ES."""

REPORTS = 9
"""Intermediate validation losses per trial for the Hyperband pruner (every T / 9 steps)."""


def sampler(name: str, seed: int, space: SearchSpace, start: Tensor | None = None) -> Any:
    """Optuna's sampler for contender ``name`` (:data:`SAMPLERS`), seeded; CMA-ES with its
    defaults (the mean at the box's centre, a step of a sixth of the box; the ``cmaes``
    package), its first trial the enqueued initial point as every contender's."""
    import optuna

    if name in ("tpe", "tpe_hyperband"):
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(f"sampler: unknown contender {name!r}; use one of {SAMPLERS}.")


def run_optuna(problem: InnerProblem, space: SearchSpace, budget: float, sampler: Any,
               name: str, seed: int, start: Tensor | None = None,
               pruner: Any = None, clock: Callable[[], float] = time.perf_counter) -> Run:
    """Ask/tell with ``sampler`` until the next trial would not finish within ``budget``
    (expected: as long as the previous one), one full inner run per trial. ``start`` (the
    preset's initial point) is enqueued as the first trial, as hypergrad starts there. A
    non-finite validation loss is told as ``inf`` (the worst value), so the sampler learns
    to avoid it. With a ``pruner`` (Hyperband), each trial reports its validation loss every
    ``T / REPORTS`` inner steps and stops when the pruner says so (told as pruned: its
    point is not a candidate, its seconds count). ``clock``: what the budget measures (the
    suite passes ``time.process_time``: this process's CPU time)."""
    import optuna

    study = optuna.create_study(direction="minimize", sampler=sampler, pruner=pruner)
    if start is not None:
        study.enqueue_trial(space.params(start))
    run = Run(name, seed, budget)
    run.info["pruned"] = 0
    last = None
    t0 = clock()
    T = problem.steps
    marks = sorted({max(1, round(T * (i + 1) / REPORTS)) for i in range(REPORTS)})
    while True:
        now = clock() - t0
        if last is not None and now + last > budget:
            break
        t1 = clock()
        trial = study.ask()
        lam = space.suggest(trial, problem.dtype)
        if pruner is None:
            loss = validation_loss(problem, lam)
        else:
            loss, pruned = _reported_run(problem, lam, trial, marks)
            if pruned:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                run.info["pruned"] += 1
                last = min(last or math.inf, clock() - t1)
                continue
        study.tell(trial, loss if math.isfinite(loss) else math.inf)
        end = clock()
        last = end - t1
        run.add(end - t0, loss, lam)
    run.seconds = clock() - t0
    return run


def _reported_run(problem: InnerProblem, lam: Tensor, trial: Any,
                  marks: list[int]) -> tuple[float, bool]:
    """One inner run that reports its validation loss at each of ``marks`` (inner steps);
    ``(loss, pruned)``."""
    with torch.no_grad():
        state, start = None, 0
        loss = math.inf
        for stop in marks:
            state = problem.run(lam, state, start=start, stop=stop)
            start = stop
            loss = float(problem.objective(state.params, state.buffers, lam))
            if not math.isfinite(loss):
                return math.inf, False
            if stop < problem.steps:
                trial.report(loss, stop)
                if trial.should_prune():
                    return loss, True
        return loss, False


def run_trainer(trainer: Any, space: SearchSpace, name: str, seed: int, budget: float,
                clock: Callable[[], float] = time.perf_counter) -> Run:
    """``trainer.fit()`` (its guards' ``time_budget`` set to ``budget``); the evaluated points are
    the
    hyperparameters of each outer step (finished at the record's ``elapsed``) and the point
    after the last update (finished when ``fit`` returns)."""
    hps = trainer.problem.hyperparams
    t0 = clock()
    res = trainer.fit()
    end = clock() - t0
    run = Run(name, seed, budget)
    points = [(rec["elapsed"], rec["val_loss"],
               raw_from_values(hps, rec["hyperparams"], trainer.problem.dtype), True)
              for rec in res.history]
    points += [(e["elapsed"], e["val_loss"], e["lam"], False)  # plain runs (start, search)
               for e in getattr(res, "evaluations", [])]
    points.sort(key=lambda x: x[0])
    for t, v, lam, _ in points:
        run.add(t, v, lam)
    run.info["hypergradients"] = [i for i, x in enumerate(points) if x[3]]
    run.info["plain_runs"] = len(points) - len(res.history)
    if res.last_lam is not None and res.last_val_loss is not None and not res.diverged:
        run.add(end, res.last_val_loss, res.last_lam)
    run.seconds = end
    chose = getattr(res, "best_select_loss", None) is not None  # by a held-out select_loss
    if getattr(res, "rechecked", None) or chose:  # or among re-checked points
        same = [i for i in run.within() if torch.equal(run.lams[i], res.lam.to(run.lams[i]))]
        run.returned = same[0] if same else None
        run.info["rechecked"] = [(r["val_loss"], r["variant_val_loss"]) for r in res.rechecked]
        if chose:
            run.info["select_loss"] = res.best_select_loss
    run.info.update(outer_steps=len(res.history), diverged=bool(res.diverged),
                    out_of_time=bool(res.out_of_time), method=res.method)
    for lam in run.lams:
        if not space.contains(lam, tol=1e-4):
            raise RuntimeError(f"run_trainer: the Trainer left the search space at "
                               f"{hps.describe(lam)}; its guards' bounds must be "
                               f"space.value_bounds.")
    return run


class ZerothOrder:
    """The ablation's "hypergradient": the same outer loop with the hypergradient replaced by a
    zeroth-order estimate (SPSA, Spall 1992): two plain runs, at ``lam`` and at ``lam + c
    delta``, with ``delta`` a random sign vector scaled by the search box's widths (``c`` of
    each width); the estimate is ``(f(lam + c delta) - f(lam)) / c`` times ``delta`` divided
    by the widths, in raw coordinates. Its directions are random signs times a
    finite difference, its cost two plain runs whatever K. A :class:`hypergrad.Method`, so
    the Trainer runs it with its defaults unchanged (the same start, line search and
    quasi-Newton model; where they average each hypergradient over two batch orders,
    ``SearchSettings.two_orders``, two such estimates with their own signs)."""

    def __new__(cls, space: SearchSpace, c: float = 0.05, seed: int = 0) -> Any:
        from hypergrad.methods.base import HyperGradient, Method

        class _ZerothOrder(Method):
            name = "zeroth_order"

            def __init__(self) -> None:
                self.width = (space.high - space.low).clamp_min(1e-12)
                self.gen = torch.Generator().manual_seed(seed)

            def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
                w = self.width.to(lam)
                with torch.no_grad():
                    state = problem.run(lam)
                    f0 = problem.objective(state.params, state.buffers, lam)
                    delta = (torch.randint(0, 2, lam.shape, generator=self.gen) * 2 - 1).to(lam)
                    lam1 = space.clamp(lam + c * delta * w)
                    s1 = problem.run(lam1)
                    f1 = problem.objective(s1.params, s1.buffers, lam1)
                g = (f1 - f0) / c * delta / w
                if not bool(torch.isfinite(g).all()):
                    g = torch.zeros_like(g)
                return HyperGradient(f0.detach(), g.detach(), state)

        return _ZerothOrder()

