"""The outer loop: tune hyperparameters by their hypergradients, offline or online.

- Offline (forward-mode HO, Franceschi et al. 2017): every outer step trains ``T`` inner steps from
  the initial state, takes ``dE/dlam`` at step ``T`` (any :class:`~hypergrad.Method`) and updates
  ``lam`` with an outer optimizer.
- Online (RTHO, same paper; HD; MARTHE): one training run; every ``interval`` inner steps ``lam``
  is updated from the hypergradient the :class:`~hypergrad.OnlineMethod` gives at that step, and
  training goes on (``reset_tangents``: the method's truncation).

The Trainer is the only stateful object: it holds ``lam``, the outer optimizer and, online, the
method's run state, and it runs the loops. What else an outer loop needs lives beside it: the
guards against divergence and the best-point tracking in :mod:`hypergrad.guards`, bounds in
:mod:`hypergrad.bounds`, checkpoint contents, fingerprints and resume checks in
:mod:`hypergrad.runstate` (file mechanics in :mod:`hypergrad.checkpoint`), outer optimizers and
backtracking's learning-rate cut in :mod:`hypergrad.outer`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import distributed as _dist
from . import runstate
from .bounds import Bounds
from .choice import AutoMode, check_memory, choose_method, make_method
from .forward import ForwardMode
from .guards import Tracker, divergence, outer_gradient, worse
from .method import HyperGradient, Method, OnlineMethod
from .online import HD, MARTHE
from .outer import OuterOptimizerFactory, SignDescent, default_outer, shrink_lr
from .problem import InnerProblem, InnerState
from .reverse import ReverseMode
from .runstate import SAFE_TO_CHANGE, RunFolder

__all__ = ["Trainer", "TrainResult", "SignDescent", "choose_method", "make_method",
           "OuterOptimizerFactory", "SAFE_TO_CHANGE"]

Evaluate = Callable[[InnerState], Mapping[str, float]]

METHODS: dict[str, Callable[[], Method]] = {
    "forward": ForwardMode, "reverse": ReverseMode, "auto": AutoMode, "hd": HD, "marthe": MARTHE}
"""The methods the Trainer builds from a name (with their defaults)."""

MAX_BACKTRACKS = 10
"""Backtracks in a row after which the run stops as diverged."""


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns.

    ``lam`` / ``values``: the **best** hyperparameters evaluated (lowest validation loss; the
    initial point and, offline, the point after the last update included), raw and
    transformed. Online, the validation loss is measured on a moving inner state, so ``lam`` is
    the last value there. ``best_step``: how many outer updates led to ``lam`` (0: the initial
    hyperparameters). ``last_lam`` / ``last_values``: where the outer optimizer ended (on a
    divergence: the hyperparameters that diverged), ``last_val_loss`` their validation loss.
    ``state``: the inner state trained at ``last_lam`` (offline: by the final evaluation; online:
    the run's own final state; ``None`` after a divergence). ``out_of_time``: offline tuning
    stopped before ``outer_steps`` because the next outer step would not have finished within
    ``time_budget``.
    """

    lam: Tensor
    values: dict[str, Any]
    history: list[dict[str, Any]]
    method: str
    diverged: bool = False
    message: str = ""
    state: InnerState | None = field(default=None, repr=False)
    last_lam: Tensor | None = field(default=None, repr=False)
    last_values: dict[str, Any] | None = None
    best_step: int | None = None
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    out_of_time: bool = False


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _check_number(name: str, value: Any, ok: Callable[[float], bool], must: str) -> None:
    """``value`` is ``None`` or a number (not a bool) for which ``ok`` holds."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not ok(value)):
        raise ValueError(f"Trainer: {name}={value!r} must be {must}.")


class Trainer:
    """Tune ``problem``'s hyperparameters by gradient descent on ``E``.

    Args:
        problem: the :class:`InnerProblem`.
        method: any :class:`Method`, or a name: ``"forward"``, ``"reverse"``, ``"auto"``,
            ``"hd"``, ``"marthe"``. The method that runs is ``method.resolve(problem, mode,
            memory_budget)``: itself, or the one :class:`~hypergrad.AutoMode` picks (forward,
            reverse or checkpointed reverse, from the memory estimates and K; the reason is
            logged). A method given (not picked) is checked against ``memory_budget`` before
            anything is allocated (:class:`~hypergrad.errors.MemoryBudgetError` with the numbers
            and the options). Online tuning needs an :class:`~hypergrad.OnlineMethod`
            (``ForwardMode``, ``MARTHE``, ``HD``).
        outer_optimizer: a factory ``params -> torch.optim.Optimizer`` over the raw
            hyperparameters, e.g. ``functools.partial(torch.optim.Adam, lr=0.05)`` or
            ``SignDescent``; default Adam with lr 0.05.
        outer_steps: offline: hyperparameter updates (each a full inner run of ``T`` steps).
        time_budget: offline: seconds of wall clock for the outer steps of this ``fit()`` call
            (``None``: no limit). An outer step starts only if it is expected to finish within
            the budget (expected: as long as the previous one); the first always runs, and the
            final evaluation of the last point (one plain inner run) follows. Each history
            record has ``elapsed``, the seconds since ``fit()`` started, so the best point found
            by any time can be read off. Tuning against other tuners at equal wall clock.
        backtrack: offline: an outer step whose validation loss is not finite or above
            ``best + (backtrack - 1) * |best|`` (for positive losses: ``backtrack`` times the best
            seen), or whose hypergradient is not finite, is not used: ``lam`` goes back to the
            best hyperparameters evaluated, the outer optimizer's learning rate is halved and
            its state reset (a line search along the outer trajectory), and tuning goes on.
            After 10 backtracks in a row the run stops as diverged. ``None`` (default): such a
            step stops the run per ``divergence_factor``. Useful with large outer steps (sign
            descent) and with ``time_budget``, where a stop wastes the rest of the budget.
        mode: ``"offline"`` or ``"online"`` (update every ``interval`` inner steps of one run;
            ``reset_tangents`` truncates after each update: ``method.truncate``, for forward
            mode and MARTHE ``Z = 0``).
        clip_norm: clip the hypergradient to this norm (computed in float64; ``None``: no
            clipping).
        bounds: ``{name: (low, high)}`` in *value* space; ``lam`` is projected into them after
            every update (e.g. per-example weights in ``[0, 1]``, a learning rate ``<= 1``).
        run_dir: where ``metrics.jsonl`` and ``checkpoint.pt`` go (``None``: nothing written).
            A folder that already holds a run is refused unless ``resume`` or ``overwrite``;
            ``run.lock`` keeps other processes out while this Trainer uses it.
        resume: continue from ``run_dir``'s checkpoint if there is one. The checkpoint's
            fingerprint must match this run (see :data:`SAFE_TO_CHANGE` for what may differ);
            the outer optimizer's hyperparameters given now replace the checkpoint's.
        evaluate: ``state -> {metric: float}`` logged after each outer step (e.g. test accuracy).
        progress: tqdm bars for outer and inner loops (when stderr is a terminal; otherwise one
            log line per outer step, so log files get no escape codes).
        tensorboard: also log scalars to ``run_dir/tb`` (needs the ``tensorboard`` package).
        memory_budget: bytes the method may use (``None``: the device's available memory).
        log: where messages go (default ``print``).
        divergence_factor: a validation loss above ``best + (factor - 1) * |best|`` (for positive
            losses: ``factor`` times the best seen) counts as divergence; ``None`` turns this
            check off (non-finite values always stop the run).
        overwrite: discard a run already in ``run_dir`` (its checkpoints and metrics).
        fingerprint: extra ``{key: JSON-like value}`` that defines the run (``hypergrad-run``
            passes its resolved config), stored in the checkpoint and compared on resume.
    """

    def __init__(self, problem: InnerProblem, method: Method | str = "forward",
                 outer_optimizer: OuterOptimizerFactory | None = None, outer_steps: int = 10,
                 mode: str = "offline", interval: int = 10, reset_tangents: bool = False,
                 clip_norm: float | None = None,
                 bounds: Mapping[str, Sequence[float | None]] | None = None,
                 run_dir: str | Path | None = None, resume: bool = False,
                 evaluate: Evaluate | None = None, progress: bool = True,
                 tensorboard: bool = False, memory_budget: float | None = None,
                 log: Callable[[str], None] = print, *,
                 divergence_factor: float | None = 10.0, overwrite: bool = False,
                 fingerprint: Mapping[str, Any] | None = None,
                 time_budget: float | None = None, backtrack: float | None = None) -> None:
        if not isinstance(problem, InnerProblem):
            raise TypeError(f"Trainer: problem must be an InnerProblem, got "
                            f"{type(problem).__name__}.")
        if mode not in ("offline", "online"):
            raise ValueError(f"Trainer: mode={mode!r}; use 'offline' or 'online'.")
        if isinstance(outer_steps, bool) or not isinstance(outer_steps, int) or outer_steps < 0:
            raise ValueError(f"Trainer: outer_steps={outer_steps!r} must be an int >= 0.")
        if mode == "online" and (isinstance(interval, bool) or not isinstance(interval, int)
                                 or not 1 <= interval <= problem.steps):
            raise ValueError(f"Trainer: interval={interval!r} must be an int in [1, steps="
                             f"{problem.steps}] for online tuning.")
        _check_number("time_budget", time_budget, lambda v: 0 < v < math.inf,
                      "seconds > 0, or None for no limit")
        _check_number("backtrack", backtrack, lambda v: 1 <= v < math.inf,
                      "a number >= 1 (e.g. 1.5: back to the best point when a step's validation "
                      "loss is above 1.5 times the best), or None")
        if (time_budget is not None or backtrack is not None) and mode != "offline":
            raise NotImplementedError(
                "Trainer: time_budget and backtrack are for offline tuning (whole inner runs "
                "per outer step); online tuning is one run of `steps` inner steps.")
        _check_number("clip_norm", clip_norm, lambda v: 0 < v < math.inf,
                      "a finite number > 0 or None")
        _check_number("divergence_factor", divergence_factor, lambda v: v > 1,
                      "a number > 1 (e.g. 10), or None to turn the check off")
        _check_number("memory_budget", memory_budget, lambda v: v > 0,
                      "bytes > 0, or None for the device's available memory")
        if resume and overwrite:
            raise ValueError("Trainer: resume=True and overwrite=True contradict each other: "
                             "resume continues the run in run_dir, overwrite discards it; pass "
                             "one of them.")
        # under torchrun: rank 0 logs, shows progress and writes; methods split across ranks
        log, progress, tensorboard = _dist.trainer_io(log, progress, tensorboard)
        self.problem, self.log, self.mode = problem, log, mode
        self.lam = problem.init_raw().requires_grad_(False)
        problem.check(self.lam)  # losses, shapes and bindings, before anything costly
        self.method = _dist.wrap(self._resolve_method(method, memory_budget))
        self.outer_steps, self.interval, self.reset_tangents = outer_steps, interval, reset_tangents
        self.time_budget = None if time_budget is None else float(time_budget)
        self.backtrack = None if backtrack is None else float(backtrack)
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.divergence_factor = None if divergence_factor is None else float(divergence_factor)
        self.bounds = Bounds(problem.hyperparams, problem.dtype, bounds)
        self.evaluate, self.progress, self._tty = evaluate, progress, _isatty(sys.stderr)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.outer = (outer_optimizer or default_outer)([self.lam])
        if not isinstance(self.outer, torch.optim.Optimizer):
            raise TypeError("Trainer: outer_optimizer(params) must return a torch.optim.Optimizer.")
        self.history: list[dict[str, Any]] = []
        self.tracker = Tracker(problem.hyperparams, self.lam)
        self.outer_step = 0
        self._backtracks = 0  # in a row
        self._fit_start = time.perf_counter()
        self.run_state: Any = None  # online: the method's run state
        self._fingerprint: dict[str, Any] = {}
        if tensorboard and self.run_dir is None:
            raise ValueError("Trainer: tensorboard=True needs a run_dir.")
        self.folder = (RunFolder(self.run_dir) if self.run_dir is not None
                       and _dist.is_writer() else None)
        try:
            if self.run_dir is not None:
                self._fingerprint = runstate.fingerprint(
                    problem, self._settings(),
                    {**(fingerprint or {}), **_dist.fingerprint(self.method)})
                got = (self.folder.open(resume, overwrite, problem.device, log)
                       if self.folder is not None else None)
                got = _dist.follow_run_dir(self.run_dir, resume, problem.device) or got
                if got is not None:
                    self._load(*got)
                if tensorboard and self.folder is not None:
                    self.folder.tensorboard()
        except BaseException:
            self.close()
            raise
        self.bounds.project(self.lam)

    @property
    def fstate(self) -> Any:
        """The earlier name of :attr:`run_state` (online: the method's run state)."""
        return self.run_state

    # -- set-up ----------------------------------------------------------------------------------
    def _resolve_method(self, method: Method | str, memory_budget: float | None) -> Method:
        if isinstance(method, str):
            if method not in METHODS:
                raise ValueError(f"Trainer: method={method!r}; use one of {list(METHODS)} or a "
                                 f"Method such as ForwardMode().")
            method = METHODS[method]()
        if not isinstance(method, Method):
            raise TypeError(f"Trainer: method must be a Method or one of {list(METHODS)}, got "
                            f"{type(method).__name__}.")
        chosen, why = method.resolve(self.problem, self.mode, memory_budget)
        if why:
            self.log(f"[hypergrad] method={method.name} {why}")
        if self.mode == "online" and not isinstance(chosen, OnlineMethod):
            raise NotImplementedError(
                f"Trainer: online tuning needs hypergradients during training, from an "
                f"OnlineMethod (ForwardMode, MARTHE or HD); {type(chosen).__name__} gives one "
                f"only after a whole run. Use method='forward', 'marthe' or 'hd' (or "
                f"ForwardMode(), MARTHE(mu), HD()), or mode='offline'.")
        if chosen is method:  # a method picked by resolve() was picked to fit
            check_memory(self.problem, chosen, self.mode, memory_budget)
        return chosen

    def _settings(self) -> dict[str, Any]:
        """The Trainer's settings that define a run (in its fingerprint)."""
        out: dict[str, Any] = {
            "trainer.mode": self.mode, "trainer.outer_optimizer": type(self.outer).__name__,
            "trainer.clip_norm": self.clip_norm, "trainer.backtrack": self.backtrack,
            "trainer.bounds": self.bounds.values()}
        if self.mode == "online":
            out["trainer.interval"] = self.interval
            out["trainer.reset_tangents"] = bool(self.reset_tangents)
        return out

    # -- the loops -------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Run to the end (or resume to the end); returns the best and the last hyperparameters
        (:class:`TrainResult`)."""
        self.problem.check(self.lam)
        self._fit_start = time.perf_counter()
        if self.folder is not None:
            self.folder.lock.acquire()
        try:
            res = self._fit_offline() if self.mode == "offline" else self._fit_online()
        finally:
            self.close()
        self.tracker.warn_at_end(res.last_lam, res.diverged, self.mode == "offline",
                                 self.history, res.best_step, res.best_val_loss,
                                 res.last_val_loss)
        return res

    def close(self) -> None:
        """Release ``run_dir``'s lock without fitting (``fit`` releases it when it ends)."""
        if self.folder is not None:
            self.folder.lock.release()

    def _bar(self, total: int, initial: int, desc: str, leave: bool = True) -> Any:
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, leave=leave,
                    disable=not (self.progress and self._tty), dynamic_ncols=True)

    def _hypergradient(self, lam: Tensor) -> HyperGradient:
        m, p = self.method, self.problem
        if not isinstance(m, OnlineMethod):
            return m.hypergradient(p, lam)
        run = m.init(p, lam)  # stepped here for the inner progress bar
        with self._bar(p.steps, 0, "inner", leave=False) as bar:
            while run.step < p.steps:
                run = m.step(p, run, lam)
                bar.update()
        value, grad = m.hypergradient_at(p, run, lam)
        return HyperGradient(value, grad, run.state)

    def _step(self, value: Tensor, grad: Tensor, lam_used: Tensor) -> str | None:
        """Guard, track the best, update ``lam``; returns why the run diverged, or ``None``."""
        tr = self.tracker
        why = divergence(value, grad, tr.best, self.divergence_factor)
        if why is not None:
            return why
        tr.track(value, lam_used, grad, self.outer_step, first=not self.history)
        g, why = outer_gradient(grad, self.clip_norm, self.lam.dtype)
        if g is None:
            return why
        if tr.best is not None and tr.best[2] == self.outer_step:
            tr.best_grad = g.detach().clone()
        self._update(g)
        if not bool(torch.isfinite(self.lam).all()):
            return "the outer optimizer's update made the hyperparameters non-finite"
        return None

    def _update(self, g: Tensor) -> None:
        self.lam.grad = g
        self.outer.step()
        self.lam.grad = None
        self.bounds.project(self.lam)

    def _back(self, why: str) -> None:
        """Back to the best point evaluated, with half the outer learning rate and a fresh
        outer optimizer state, and a step from there along its (known) hypergradient: a
        backtracking line search that costs no extra evaluation."""
        best, best_grad = self.tracker.best, self.tracker.best_grad
        assert best is not None
        self._backtracks += 1
        with torch.no_grad():
            self.lam.copy_(best[1])
        lrs = shrink_lr(self.outer, 0.5)
        if best_grad is not None:
            self._update(best_grad.clone())
        self.log(f"[hypergrad] outer step {self.outer_step}: {why}: back to the best "
                 f"hyperparameters (outer step {best[2]}), outer lr halved to "
                 f"{', '.join(f'{x:.3g}' for x in lrs)}, a step from there")

    def _fit_offline(self) -> TrainResult:
        last_seconds: float | None = None  # of the previous outer step of this fit() call
        out_of_time = False
        with self._bar(self.outer_steps, self.outer_step, "outer") as bar:
            while self.outer_step < self.outer_steps:
                t0 = time.perf_counter()
                if (self.time_budget is not None and last_seconds is not None
                        and t0 - self._fit_start + last_seconds > self.time_budget):
                    out_of_time = True
                    self.log(f"[hypergrad] time_budget={self.time_budget:g} s: stopped after "
                             f"outer step {self.outer_step} ({t0 - self._fit_start:.1f} s; the "
                             f"next would take about {last_seconds:.1f} s)")
                    break
                lam_used = self.lam.detach().clone()
                hg = self._hypergradient(lam_used)
                value, grad = hg.objective, hg.grad
                bad = worse(value, grad, self.tracker.best, self.backtrack)
                backtracked = bad is not None and self._backtracks < MAX_BACKTRACKS
                if bad is not None and backtracked:
                    self._back(bad)
                else:
                    why = self._step(value, grad, lam_used)
                    if why is not None:
                        return self._diverged(why, lam_used, value)
                    self._backtracks = 0
                last_seconds = time.perf_counter() - t0
                self._record(value, grad, lam_used, hg.state, last_seconds,
                             backtracked=backtracked, info=hg.info)
                bar.update()
                bar.set_postfix(val=f"{float(value):.4g}")
        res = self._finish_offline()
        res.out_of_time = out_of_time and not res.diverged
        return res

    def _finish_offline(self) -> TrainResult:
        """Evaluate the hyperparameters after the last update (no hypergradient: one plain
        inner run), so the best evaluated point can be returned."""
        last = self.lam.detach().clone()
        with torch.no_grad():
            state = self.problem.run(last)
            value = self.problem.objective(state.params, state.buffers, last)
        why = divergence(value, None, self.tracker.best, self.divergence_factor)
        if why is not None:
            return self._diverged(f"after the last update, {why}", last, value)
        self.tracker.track(value, last, None, self.outer_step, first=False)
        assert self.tracker.best is not None
        best_val, best_lam, best_step = self.tracker.best
        hps = self.problem.hyperparams
        if self.history:
            self.log(f"[hypergrad] validation loss: initial {self.history[0]['val_loss']:.4g}, "
                     f"best {best_val:.4g} (outer step {best_step}), last {float(value):.4g} "
                     f"(outer step {self.outer_step})")
        return TrainResult(best_lam.clone(), hps.describe(best_lam), list(self.history),
                           self.method.name, state=state, last_lam=last,
                           last_values=hps.describe(last), best_step=best_step,
                           best_val_loss=best_val, last_val_loss=float(value))

    def _fit_online(self) -> TrainResult:
        m, p = self.method, self.problem
        assert isinstance(m, OnlineMethod)
        if self.run_state is None:
            self.run_state = m.init(p, self.lam.detach().clone())
        t0 = time.perf_counter()
        with self._bar(p.steps, self.run_state.step, f"inner (online, {m.name})") as bar:
            while self.run_state.step < p.steps:
                lam_used = self.lam.detach().clone()
                self.run_state = m.step(p, self.run_state, lam_used)
                bar.update()
                if self.run_state.step % self.interval and self.run_state.step < p.steps:
                    continue
                value, grad = m.hypergradient_at(p, self.run_state, lam_used)
                why = self._step(value, grad, lam_used)
                if why is not None:
                    return self._diverged(why, lam_used, value)
                if self.reset_tangents:
                    self.run_state = m.truncate(self.run_state)
                self._record(value, grad, lam_used, self.run_state.state,
                             time.perf_counter() - t0, inner_step=self.run_state.step)
                t0 = time.perf_counter()
                bar.set_postfix(val=f"{float(value):.4g}")
        last = self.lam.detach().clone()
        hps = self.problem.hyperparams
        last_val = self.history[-1]["val_loss"] if self.history else None
        return TrainResult(last, hps.describe(last), list(self.history), m.name,
                           state=self.run_state.state, last_lam=last.clone(),
                           last_values=hps.describe(last), best_step=self.outer_step,
                           best_val_loss=last_val, last_val_loss=last_val)

    def _diverged(self, why: str, lam_used: Tensor, value: Tensor) -> TrainResult:
        hps = self.problem.hyperparams
        bad_lam, last_val = lam_used.detach().clone(), float(value)
        if not torch.equal(self.lam, lam_used):  # the update itself went wrong
            bad_lam, last_val = self.lam.detach().clone(), math.nan
        bad = hps.describe(bad_lam)
        keep, keep_step, keep_val, kept = self.tracker.fallback(self.mode == "offline")
        with torch.no_grad():
            self.lam.copy_(keep)
        msg = (f"[hypergrad] stopped at outer step {self.outer_step}: {why}, with "
               f"hyperparameters {bad}. The tuning diverged; {kept}: {hps.describe(keep)}. "
               f"Try a smaller outer learning rate, clip_norm=..., or bounds=... on learning "
               f"rates.")
        self.log(msg)
        if self.folder is not None:
            self.folder.mark_stopped(self.problem.device, self.lam, msg)
        return TrainResult(keep.clone(), hps.describe(keep), list(self.history),
                           self.method.name, diverged=True, message=msg, state=None,
                           last_lam=bad_lam, last_values=bad, best_step=keep_step,
                           best_val_loss=None if math.isnan(keep_val) else keep_val,
                           last_val_loss=last_val)

    # -- logging and checkpoints -----------------------------------------------------------------
    def _record(self, value: Tensor, grad: Tensor, lam_used: Tensor, state: InnerState,
                seconds: float, inner_step: int | None = None, backtracked: bool = False,
                info: Mapping[str, Any] | None = None) -> None:
        rec: dict[str, Any] = {"outer_step": self.outer_step, "val_loss": float(value),
                               "hypergrad_norm": float(grad.detach().double().norm()),
                               "seconds": seconds,
                               "elapsed": time.perf_counter() - self._fit_start,
                               "hyperparams": self.problem.hyperparams.describe(lam_used)}
        if inner_step is not None:
            rec["inner_step"] = inner_step
        if backtracked:
            rec["backtracked"] = True
        if info:  # what an approximate method reports (ImplicitDiff: residual, iterations)
            rec["info"] = dict(info)
        if self.evaluate is not None and math.isfinite(rec["val_loss"]):
            rec.update({k: float(v) for k, v in self.evaluate(state).items()})
        self.history.append(rec)
        self.outer_step += 1
        if self.run_dir is not None:
            ck = self._checkpoint()  # on every rank: a split run's columns are gathered
            if self.folder is not None:
                self.folder.write(ck, rec)
        if self.progress and not self._tty:  # a log file: a line, not a progress bar
            total = self.outer_steps if self.mode == "offline" else self.problem.steps
            where = (f"outer step {self.outer_step}/{total}" if inner_step is None else
                     f"inner step {inner_step}/{total}")
            self.log(f"[hypergrad] {where}: val_loss {rec['val_loss']:.4g}, "
                     f"|dE/dlam| {rec['hypergrad_norm']:.3g}, {seconds:.1f} s")

    def _checkpoint(self) -> dict[str, Any]:
        ck: dict[str, Any] = {
            "version": 3, "mode": self.mode, "outer_step": self.outer_step,
            "lam": self.lam.detach().clone(), "outer": self.outer.state_dict(),
            "outer_class": type(self.outer).__name__, "method": self.method.name,
            "history": self.history, "backtracks": self._backtracks, "stopped": "",
            "fingerprint": self._fingerprint, "rng": runstate.rng_state(),
            **self.tracker.state_dict()}
        if self.run_state is not None:
            assert isinstance(self.method, OnlineMethod)
            ck["online"] = runstate.pack_run(  # a split run's columns gathered (every rank)
                _dist.checkpoint_method(self.method),
                _dist.full_run(self.method, self.problem, self.run_state))
        return ck

    def _load(self, ck: dict[str, Any], path: Path) -> None:
        _dist.check_resume(ck.get("fingerprint"), path)  # the same number of processes
        runstate.check_resume(ck, path, self.mode, self._fingerprint, self.lam.shape[0])
        runstate.load_outer(self.outer, ck, path, self.log)
        name = ck.get("method", self.method.name)
        if self.mode == "offline" and name != self.method.name:
            self.log(f"[hypergrad] resume: the checkpoint's run used method={name}, this one "
                     f"uses {self.method.name} (the same hypergradients to rounding)")
        with torch.no_grad():
            self.lam.copy_(ck["lam"])
        if self.mode == "online":
            assert isinstance(self.method, OnlineMethod)
            run = runstate.unpack_run(ck, _dist.checkpoint_method(self.method), self.problem,
                                      self.lam.detach().clone(), path, self.log)
            self.run_state = _dist.local_run(self.method, self.problem, run)
        self.history = list(ck["history"])
        self.tracker.load_state_dict(ck, self.lam)
        self._backtracks = int(ck.get("backtracks", 0))
        self.outer_step = int(ck["outer_step"])
        runstate.set_rng_state(ck["rng"])
        if self.folder is not None:  # metrics.jsonl agrees with the checkpoint again
            self.folder.rewrite_metrics(self.history)
        self.log(f"[hypergrad] resumed from {path} at outer step {self.outer_step}")
        if ck.get("stopped"):
            self.log(f"[hypergrad] that run had stopped on a divergence; continuing from the "
                     f"hyperparameters it kept: {self.problem.hyperparams.describe(self.lam)}")
