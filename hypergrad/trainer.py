"""The outer loop: tune hyperparameters by their hypergradients, offline or online.

- Offline (forward-mode HO, Franceschi et al. 2017): every outer step trains ``T`` inner steps from
  the initial state, takes ``dE/dlam`` at step ``T`` and updates ``lam`` with an outer optimizer.
- Online (RTHO, same paper): one training run; every ``interval`` inner steps ``lam`` is updated
  from the current tangents and training goes on (tangents optionally reset: truncation).

The Trainer is the only stateful object: it holds ``lam``, the outer optimizer and, online, the
inner state and tangents. Everything needed to resume is checkpointed (:mod:`hypergrad.checkpoint`)
with a fingerprint of what defines the run, so a resume with other settings is refused.

Guards: a validation loss or hypergradient that is not finite, a hypergradient whose norm
overflows the working dtype, or a validation loss more than ``divergence_factor`` times the best
seen stops the run; offline, the best evaluated hyperparameters are returned (never worse on the
validation objective than any point evaluated, the initial one included), the last ones are
reported beside them.
"""

from __future__ import annotations

import math
import random
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import distributed as _dist
from .checkpoint import (
    METRICS,
    TRAINER_FILES,
    RunLock,
    append_line,
    clear_run_dir,
    digest,
    dumps,
    fingerprint_diff,
    load_checkpoint,
    save_checkpoint,
    used_files,
    write_text_atomic,
)
from .choice import AutoMethod, check_memory, choose_method, make_method, no_draws
from .errors import (
    CheckpointError,
    CheckpointWarning,
    ResumeMismatchError,
    RunDirError,
    TuningWarning,
    ZeroHypergradientWarning,
)
from .forward import ForwardMode, ForwardState
from .hyperparams import TRANSFORMS
from .method import Method
from .outer import OuterOptimizerFactory, SignDescent
from .problem import InnerProblem, InnerState

__all__ = ["Trainer", "TrainResult", "SignDescent", "choose_method", "make_method",
           "OuterOptimizerFactory", "SAFE_TO_CHANGE"]

Evaluate = Callable[[InnerState], Mapping[str, float]]

SAFE_TO_CHANGE = ("outer_steps", "time_budget", "progress", "evaluate", "tensorboard",
                  "memory_budget",
                  "divergence_factor", "log", "the outer optimizer's hyperparameters (lr, ...)",
                  "the method (forward or reverse mode: the same hypergradients to rounding) "
                  "and its HVP strategy and chunking")
"""Trainer settings that may differ when a run is resumed; every other setting, and the
problem (K and layout, T, dtype, model, optimizer, initial values and state, first batch,
validation loss at the start), is in the checkpoint's fingerprint and must match."""


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


class Trainer:
    """Tune ``problem``'s hyperparameters by gradient descent on ``E``.

    Args:
        problem: the :class:`InnerProblem`.
        method: a :class:`Method` (``ForwardMode(...)``, ``ReverseMode()``), ``"forward"``,
            ``"reverse"`` or ``"auto"`` / an :class:`~hypergrad.choice.AutoMethod` (chosen by
            :func:`choose_method` from both memory estimates and K, reason logged). Forward and
            reverse mode are checked against ``memory_budget`` before anything is allocated
            (:class:`~hypergrad.errors.MemoryBudgetError` with the numbers and the options).
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
        mode: ``"offline"`` or ``"online"`` (RTHO: update every ``interval`` inner steps of one
            run; ``reset_tangents`` sets ``Z = 0`` after each update, i.e. truncation).
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

    def __init__(self, problem: InnerProblem, method: Method | AutoMethod | str = "forward",
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
        if time_budget is not None and (
                isinstance(time_budget, bool) or not isinstance(time_budget, (int, float))
                or not time_budget > 0 or not math.isfinite(time_budget)):
            raise ValueError(f"Trainer: time_budget={time_budget!r} must be seconds > 0, or None "
                             f"for no limit.")
        if backtrack is not None and (isinstance(backtrack, bool)
                                      or not isinstance(backtrack, (int, float))
                                      or not 1 <= backtrack < math.inf):
            raise ValueError(f"Trainer: backtrack={backtrack!r} must be a number >= 1 (e.g. "
                             f"1.5: back to the best point when a step's validation loss is "
                             f"above 1.5 times the best), or None.")
        if (time_budget is not None or backtrack is not None) and mode != "offline":
            raise NotImplementedError(
                "Trainer: time_budget and backtrack are for offline tuning (whole inner runs "
                "per outer step); online tuning is one run of `steps` inner steps.")
        if clip_norm is not None and not (isinstance(clip_norm, (int, float))
                                          and math.isfinite(clip_norm) and clip_norm > 0):
            raise ValueError(f"Trainer: clip_norm={clip_norm!r} must be a finite number > 0 or "
                             f"None.")
        if divergence_factor is not None and not (
                isinstance(divergence_factor, (int, float)) and divergence_factor > 1):
            raise ValueError(f"Trainer: divergence_factor={divergence_factor!r} must be a number "
                             f"> 1 (e.g. 10), or None to turn the check off.")
        if memory_budget is not None and not (isinstance(memory_budget, (int, float))
                                              and memory_budget > 0):
            raise ValueError(f"Trainer: memory_budget={memory_budget!r} must be bytes > 0, or "
                             f"None for the device's available memory.")
        if resume and overwrite:
            raise ValueError("Trainer: resume=True and overwrite=True contradict each other: "
                             "resume continues the run in run_dir, overwrite discards it; pass "
                             "one of them.")
        self.problem = problem
        log, progress, tensorboard = _dist.trainer_io(log, progress, tensorboard)
        self.log = log
        self.mode = mode
        self.lam = problem.init_raw().requires_grad_(False)
        problem.check(self.lam)  # losses, shapes and bindings, before anything costly
        self.method = _dist.wrap(self._resolve_method(method, memory_budget))
        self.outer_steps = outer_steps
        self.time_budget = None if time_budget is None else float(time_budget)
        self.backtrack = None if backtrack is None else float(backtrack)
        self._backtracks = 0  # in a row
        self._best_grad: Tensor | None = None  # the outer gradient taken at the best point
        self._fit_start = time.perf_counter()
        self.interval = interval
        self.reset_tangents = reset_tangents
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.divergence_factor = None if divergence_factor is None else float(divergence_factor)
        self.bounds = self._check_bounds(bounds or {})
        self.evaluate = evaluate
        self.progress = progress
        self._tty = _isatty(sys.stderr)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        factory = outer_optimizer or (lambda ps: torch.optim.Adam(ps, lr=0.05))
        self.outer = factory([self.lam])
        if not isinstance(self.outer, torch.optim.Optimizer):
            raise TypeError("Trainer: outer_optimizer(params) must return a torch.optim.Optimizer.")
        self.history: list[dict[str, Any]] = []
        self._lam0 = self.lam.detach().clone()
        self._last_good = self.lam.detach().clone()  # lam of the last finite evaluation
        self._last_good_step = 0  # and its outer step
        self._best: tuple[float, Tensor, int] | None = None  # (val loss, lam, outer step)
        self._nonzero: set[str] = set()  # hyperparameters with a non-zero hypergradient seen
        self._zero_warned: set[str] = set()
        self.outer_step = 0
        self.fstate: ForwardState | None = None
        self._tb: Any = None
        self._lock: RunLock | None = None
        self._fingerprint: dict[str, Any] = {}
        if self.run_dir is not None and _dist.is_writer():
            self._lock = RunLock(self.run_dir).acquire()
        try:
            if self.run_dir is not None:
                self._fingerprint = self._make_fingerprint(
                    {**(fingerprint or {}), **_dist.fingerprint(self.method)})
                _dist.open_run_dir(self, resume, overwrite)  # rank 0 opens, the others follow
            if tensorboard:
                self._tb = self._tensorboard()
        except BaseException:
            self.close()
            raise
        self._project()

    # -- set-up ----------------------------------------------------------------------------------
    def _resolve_method(self, method: Method | AutoMethod | str,
                        memory_budget: float | None) -> Method:
        p = self.problem
        if isinstance(method, str):
            m = make_method(method) if method in ("forward", "reverse", "auto") else None
            if m is None:
                raise ValueError(f"Trainer: method={method!r}; use 'forward', 'reverse', 'auto' "
                                 f"or a Method such as ForwardMode().")
            method = m
        if isinstance(method, AutoMethod):
            name, why = choose_method(p, self.mode, memory_budget, forward=method.forward)
            self.log(f"[hypergrad] method=auto chose {name}: {why}")
            return method.forward if name == "forward" else method.reverse
        if not isinstance(method, Method):
            raise TypeError(f"Trainer: method must be a Method or 'forward'/'reverse'/'auto', got "
                            f"{type(method).__name__}.")
        if self.mode == "online" and not isinstance(method, ForwardMode):
            raise NotImplementedError(
                f"Trainer: online tuning needs hypergradients during training, which only "
                f"ForwardMode gives; got {type(method).__name__}. Use method='forward'."
            )
        check_memory(p, method, self.mode, memory_budget)
        return method

    def _check_bounds(self, bounds: Mapping[str, Sequence[float | None]]
                      ) -> dict[str, tuple[Tensor | None, Tensor | None]]:
        hps = self.problem.hyperparams
        out = {}
        for name, lohi in bounds.items():
            if name not in hps.by_name:
                raise ValueError(f"Trainer: bounds name {name!r} is not a hyperparameter; defined "
                                 f"are {hps.names}.")
            if isinstance(lohi, (str, bytes)) or not isinstance(lohi, Sequence) or len(lohi) != 2:
                raise ValueError(f"Trainer: bounds[{name!r}]={lohi!r} must be (low, high), "
                                 f"either may be None.")
            item = hps.by_name[name]
            inverse, valid, domain = TRANSFORMS[item.transform][1:]
            raw: list[Tensor | None] = []
            for v in lohi:
                if v is None:
                    raw.append(None)
                    continue
                if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                    raise ValueError(f"Trainer: bounds[{name!r}]={list(lohi)!r} has {v!r}; bounds "
                                     f"are numbers (or None for no bound).")
                t = torch.tensor(float(v), dtype=self.problem.dtype)
                if not valid(t):
                    raise ValueError(f"Trainer: bounds[{name!r}] value {v} is outside the domain "
                                     f"of transform={item.transform!r} ({domain}).")
                raw.append(inverse(t))  # transforms are increasing: bounds map to raw bounds
            lo, hi = lohi
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"Trainer: bounds[{name!r}]=({lo}, {hi}) has low > high; give "
                                 f"(low, high) = ({hi}, {lo}).")
            out[name] = (raw[0], raw[1])
        return out

    def _make_fingerprint(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        """What defines this run: the problem's facts and the Trainer's settings that change
        the result (see :data:`SAFE_TO_CHANGE` for those left out), plus ``extra``."""
        p, hps = self.problem, self.problem.hyperparams
        with no_draws(p), torch.no_grad():  # draws nothing from the run's generators
            s0, lam0 = p.initial_state(), p.init_raw()
            start = float(p.objective(s0.params, s0.buffers, lam0))
            first = digest(p.batch(0))
        init = {}
        for it, sl in zip(hps.items, hps.slices.values()):
            vals = TRANSFORMS[it.transform][0](lam0[sl]).tolist()
            init[it.name] = vals if len(vals) <= 16 else digest(lam0[sl])
        opt = p.optimizer
        fp: dict[str, Any] = {
            "problem.K": p.num_hyperparams,
            "problem.layout": [[it.name, it.kind, it.numel, it.transform] for it in hps.items],
            "problem.steps": p.steps,
            "problem.dtype": str(p.dtype).replace("torch.", ""),
            "problem.model": [[n, list(v.shape)] for n, v in s0.params.items()],
            "problem.optimizer": [opt.name, {k: repr(v) for k, v in sorted(opt.args.items())}],
            "problem.initial_values": init,
            "problem.initial_state": digest(s0),
            "problem.first_batch": first,
            "problem.val_loss_at_start": float(f"{start:.6g}") if math.isfinite(start) else
            repr(start),
            "trainer.mode": self.mode,
            "trainer.outer_optimizer": type(self.outer).__name__,
            "trainer.clip_norm": self.clip_norm,
            "trainer.backtrack": self.backtrack,
            "trainer.bounds": {n: [None if v is None else float(v) for v in
                                   self._bounds_values(n)] for n in self.bounds},
        }
        if self.mode == "online":
            fp["trainer.interval"] = self.interval
            fp["trainer.reset_tangents"] = bool(self.reset_tangents)
        fp.update(extra)
        return fp

    def _bounds_values(self, name: str) -> list[float | None]:
        item = self.problem.hyperparams.by_name[name]
        fwd = TRANSFORMS[item.transform][0]
        return [None if r is None else float(fwd(r)) for r in self.bounds[name]]

    def _open_run_dir(self, resume: bool, overwrite: bool) -> None:
        assert self.run_dir is not None
        used = used_files(self.run_dir)
        if not used:
            if resume:
                self.log(f"[hypergrad] resume: no checkpoint in {self.run_dir}, starting afresh")
            return
        if overwrite:
            gone = clear_run_dir(self.run_dir, TRAINER_FILES)
            self.log(f"[hypergrad] overwrite: removed {gone} from {self.run_dir}")
            return
        if not resume:
            n = 0
            if (self.run_dir / METRICS).exists():
                n = len((self.run_dir / METRICS).read_text().splitlines())
            raise RunDirError(
                f"Trainer: run_dir={str(self.run_dir)!r} already holds a run ({', '.join(used)}; "
                f"{n} outer steps in {METRICS}). Pass resume=True to continue it (hypergrad-run: "
                f"trainer.resume=true), overwrite=True to discard it (trainer.overwrite=true), or "
                f"use another run_dir (hydra.run.dir=...).")
        got = load_checkpoint(self.run_dir, self.problem.device)
        if got is None:
            raise CheckpointError(
                f"Trainer: cannot resume from {self.run_dir}: it has {', '.join(used)} but no "
                f"checkpoint. Start afresh with overwrite=True (trainer.overwrite=true).")
        self._load(*got)

    # -- guards ---------------------------------------------------------------------------------
    def _project(self) -> None:
        slices = self.problem.hyperparams.slices
        with torch.no_grad():
            for name, (lo, hi) in self.bounds.items():
                self.lam[slices[name]] = self.lam[slices[name]].clamp(lo, hi)

    def _threshold(self) -> float | None:
        if self._best is None or self.divergence_factor is None:
            return None
        best = self._best[0]
        return best + (self.divergence_factor - 1) * abs(best)

    def _guard(self, value: Tensor, grad: Tensor | None) -> str | None:
        """Why this evaluation means divergence, or ``None``."""
        v = float(value)
        if not math.isfinite(v):
            return f"the validation loss is {v}"
        if grad is not None:
            bad = int((~torch.isfinite(grad)).sum())
            if bad:
                return f"{bad} of the {grad.numel()} hypergradient entries are not finite"
        limit = self._threshold()
        if limit is not None and v > limit:
            assert self._best is not None
            return (f"the validation loss {v:.4g} exceeds divergence_factor="
                    f"{self.divergence_factor:g} times the best seen ({self._best[0]:.4g}, "
                    f"outer step {self._best[2]})")
        return None

    def _outer_gradient(self, grad: Tensor) -> tuple[Tensor | None, str | None]:
        """The (clipped) hypergradient the outer optimizer gets, or why there is none: the norm
        is taken in float64, and its square must be representable in ``lam``'s dtype (Adam
        squares the gradient: an overflow there freezes every later update)."""
        g = grad.detach().to(torch.float64)
        norm = float(g.norm())
        if not math.isfinite(norm):
            return None, "the hypergradient's norm overflows even in float64"
        if self.clip_norm is not None and norm > self.clip_norm:
            g = g * (self.clip_norm / norm)
            norm = self.clip_norm
        limit = math.sqrt(torch.finfo(self.lam.dtype).max)
        if norm >= limit:
            return None, (f"the hypergradient's norm {norm:.3g} is too large for "
                          f"{str(self.lam.dtype).replace('torch.', '')} (its square overflows, "
                          f"which would freeze the outer optimizer)")
        return g.to(self.lam.dtype), None

    def _track(self, value: Tensor, lam_used: Tensor, grad: Tensor | None) -> None:
        v = float(value)
        self._last_good = lam_used.detach().clone()
        self._last_good_step = self.outer_step
        if self._best is None or v < self._best[0]:
            self._best = (v, lam_used.detach().clone(), self.outer_step)
        if grad is None:
            return
        first = not self.history
        zero = []
        for name, sl in self.problem.hyperparams.slices.items():
            if bool(grad[sl].any()):
                self._nonzero.add(name)
            elif first and name not in self._zero_warned:
                zero.append(name)
        if zero:
            self._zero_warned.update(zero)
            warnings.warn(ZeroHypergradientWarning(
                f"Trainer: the hypergradient of {zero} is exactly zero at the first outer step: "
                f"the losses cannot differentiate {'it' if len(zero) == 1 else 'them'}, so "
                f"tuning will not move {'it' if len(zero) == 1 else 'them'}. Read the "
                f"hyperparameter as a tensor (no .item(), float(), round, .detach(), "
                f"torch.where on it, or 0 * hp), or remove it."), stacklevel=4)

    # -- the loops -------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Run to the end (or resume to the end); returns the best and the last hyperparameters
        (:class:`TrainResult`)."""
        self.problem.check(self.lam)
        self._fit_start = time.perf_counter()
        if self._lock is not None:
            self._lock.acquire()
        try:
            if self.mode == "offline":
                res = self._fit_offline()
            else:
                res = self._fit_online()
        finally:
            if self._lock is not None:
                self._lock.release()
        self._warn_at_end(res)
        return res

    def close(self) -> None:
        """Release ``run_dir``'s lock without fitting (``fit`` releases it when it ends)."""
        if self._lock is not None:
            self._lock.release()

    def _bar(self, total: int, initial: int, desc: str, leave: bool = True) -> Any:
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, leave=leave,
                    disable=not (self.progress and self._tty), dynamic_ncols=True)

    def _hypergradient(self, lam: Tensor) -> tuple[Tensor, Tensor, InnerState]:
        if isinstance(self.method, ForwardMode):  # stepped here for the inner progress bar
            fm = self.method
            fs = fm.init(self.problem, lam)
            with self._bar(self.problem.steps, 0, "inner", leave=False) as bar:
                for _ in range(self.problem.steps):
                    fs = fm.step(self.problem, fs, lam)
                    bar.update()
            value, grad = fm.hypergradient_at(self.problem, fs, lam)
            return value, grad, fs.state
        r = self.method.hypergradient(self.problem, lam)
        return r.objective, r.grad, r.state

    def _step(self, value: Tensor, grad: Tensor, lam_used: Tensor) -> str | None:
        """Guard, track the best, update ``lam``; returns why the run diverged, or ``None``."""
        why = self._guard(value, grad)
        if why is not None:
            return why
        self._track(value, lam_used, grad)
        g, why = self._outer_gradient(grad)
        if g is None:
            return why
        if self._best is not None and self._best[2] == self.outer_step:
            self._best_grad = g.detach().clone()
        self.lam.grad = g
        self.outer.step()
        self.lam.grad = None
        self._project()
        if not bool(torch.isfinite(self.lam).all()):
            return "the outer optimizer's update made the hyperparameters non-finite"
        return None

    def _worse(self, value: Tensor, grad: Tensor) -> str | None:
        """With ``backtrack``: why this outer step is not to be used, or ``None``."""
        if self.backtrack is None or self._best is None:
            return None
        v, best = float(value), self._best[0]
        if not math.isfinite(v):
            return f"validation loss {v}"
        if not bool(torch.isfinite(grad).all()):
            return "a hypergradient that is not finite"
        if v > best + (self.backtrack - 1) * abs(best):
            return f"validation loss {v:.4g} > backtrack={self.backtrack:g} x best {best:.4g}"
        return None

    def _back(self, why: str) -> None:
        """Back to the best point evaluated, with half the outer learning rate and a fresh
        outer optimizer state, and a step from there along its (known) hypergradient: a
        backtracking line search that costs no extra evaluation."""
        assert self._best is not None
        self._backtracks += 1
        with torch.no_grad():
            self.lam.copy_(self._best[1])
        lrs = []
        for group in self.outer.param_groups:
            if "lr" in group:
                group["lr"] = group["lr"] * 0.5
                lrs.append(group["lr"])
        self.outer.state.clear()
        if self._best_grad is not None:
            self.lam.grad = self._best_grad.clone()
            self.outer.step()
            self.lam.grad = None
            self._project()
        self.log(f"[hypergrad] outer step {self.outer_step}: {why}: back to the best "
                 f"hyperparameters (outer step {self._best[2]}), outer lr halved to "
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
                value, grad, state = self._hypergradient(lam_used)
                bad = self._worse(value, grad)
                if bad is not None and self._backtracks < 10:
                    last_seconds = time.perf_counter() - t0
                    self._back(bad)
                    self._record(value, grad, lam_used, state, last_seconds, backtracked=True)
                    bar.update()
                    continue
                why = self._step(value, grad, lam_used)
                if why is not None:
                    return self._diverged(why, lam_used, value)
                self._backtracks = 0
                last_seconds = time.perf_counter() - t0
                self._record(value, grad, lam_used, state, last_seconds)
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
        why = self._guard(value, None)
        if why is not None:
            return self._diverged(f"after the last update, {why}", last, value)
        self._track(value, last, None)
        assert self._best is not None
        best_val, best_lam, best_step = self._best
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
        fm = self.method
        assert isinstance(fm, ForwardMode)
        p = self.problem
        if self.fstate is None:
            self.fstate = fm.init(p, self.lam.detach().clone())
        t0 = time.perf_counter()
        with self._bar(p.steps, self.fstate.step, "inner (online)") as bar:
            while self.fstate.step < p.steps:
                lam_used = self.lam.detach().clone()
                self.fstate = fm.step(p, self.fstate, lam_used)
                bar.update()
                if self.fstate.step % self.interval and self.fstate.step < p.steps:
                    continue
                value, grad = fm.hypergradient_at(p, self.fstate, lam_used)
                why = self._step(value, grad, lam_used)
                if why is not None:
                    return self._diverged(why, lam_used, value)
                if self.reset_tangents:
                    z = self.fstate.tangents
                    zeros = tree_unflatten([torch.zeros_like(x) for x in tree_flatten(z)[0]],
                                           tree_flatten(z)[1])
                    self.fstate = self.fstate._replace(tangents=zeros)
                self._record(value, grad, lam_used, self.fstate.state,
                             time.perf_counter() - t0, inner_step=self.fstate.step)
                t0 = time.perf_counter()
                bar.set_postfix(val=f"{float(value):.4g}")
        last = self.lam.detach().clone()
        hps = self.problem.hyperparams
        last_val = self.history[-1]["val_loss"] if self.history else None
        return TrainResult(last, hps.describe(last), list(self.history), self.method.name,
                           state=self.fstate.state, last_lam=last.clone(),
                           last_values=hps.describe(last), best_step=self.outer_step,
                           best_val_loss=last_val, last_val_loss=last_val)

    def _diverged(self, why: str, lam_used: Tensor, value: Tensor) -> TrainResult:
        hps = self.problem.hyperparams
        bad_lam, last_val = lam_used.detach().clone(), float(value)
        if not torch.equal(self.lam, lam_used):  # the update itself went wrong
            bad_lam, last_val = self.lam.detach().clone(), math.nan
        bad = hps.describe(bad_lam)
        if self.mode == "offline" and self._best is not None:
            keep_val, keep, keep_step = self._best
            kept = (f"returned the best hyperparameters evaluated, of outer step {keep_step} "
                    f"(validation loss {keep_val:.4g})")
        elif self._best is not None:  # online: the hyperparameters of the last finite interval
            keep, keep_step, keep_val = self._last_good, self._last_good_step, self._best[0]
            kept = f"kept the last good hyperparameters, of outer step {keep_step}"
        else:
            keep, keep_step, keep_val = self._lam0, 0, math.nan
            kept = ("the initial hyperparameters already diverge: returned them; start from a "
                    "smaller learning rate")
        with torch.no_grad():
            self.lam.copy_(keep)
        msg = (f"[hypergrad] stopped at outer step {self.outer_step}: {why}, with "
               f"hyperparameters {bad}. The tuning diverged; {kept}: {hps.describe(keep)}. "
               f"Try a smaller outer learning rate, clip_norm=..., or bounds=... on learning "
               f"rates.")
        self.log(msg)
        self._mark_stopped(msg)
        return TrainResult(keep.clone(), hps.describe(keep), list(self.history),
                           self.method.name, diverged=True, message=msg, state=None,
                           last_lam=bad_lam, last_values=bad, best_step=keep_step,
                           best_val_loss=None if math.isnan(keep_val) else keep_val,
                           last_val_loss=last_val)

    def _mark_stopped(self, msg: str) -> None:
        """Rewrite the last checkpoint with the hyperparameters kept (not the diverged ones),
        so a resume (e.g. with a smaller outer learning rate) starts from them."""
        if self.run_dir is None or not _dist.is_writer():
            return
        got = load_checkpoint(self.run_dir, self.problem.device)
        if got is None:
            return
        ck, _ = got
        ck["lam"] = self.lam.detach().clone()
        ck["stopped"] = msg
        save_checkpoint(self.run_dir, ck)

    def _warn_at_end(self, res: TrainResult) -> None:
        hps = self.problem.hyperparams
        if self.outer_step == 0 or res.last_lam is None:
            return
        last = hps.split(res.last_lam)
        first = hps.split(self._lam0)
        for name in hps.names:
            if name in self._zero_warned or not torch.equal(last[name], first[name]):
                continue
            if name not in self._nonzero:
                self._zero_warned.add(name)
                warnings.warn(ZeroHypergradientWarning(
                    f"Trainer: {name!r} never moved: its hypergradient was exactly zero at "
                    f"every outer step (the losses cannot differentiate it: .item(), float(), "
                    f"round, .detach(), torch.where on it, or 0 * hp)."), stacklevel=3)
            elif not res.diverged:
                init = hps.describe(self._lam0)[name]
                warnings.warn(TuningWarning(
                    f"Trainer: {name!r} never moved from its initial value {init} (bounds held "
                    f"it, or the outer steps were too small)."), stacklevel=3)
        if self.mode != "offline" or res.diverged or not self.history:
            return
        init_val = float(self.history[0]["val_loss"])
        last_val = res.last_val_loss
        if res.best_step == 0:
            warnings.warn(TuningWarning(
                f"Trainer: no outer step improved on the initial hyperparameters (validation "
                f"loss {init_val:.4g}; last {last_val:.4g}): returned the initial ones. Try a "
                f"smaller outer learning rate."), stacklevel=3)
        elif last_val is not None and last_val > init_val:
            warnings.warn(TuningWarning(
                f"Trainer: the last hyperparameters are worse than the initial ones (validation "
                f"loss {last_val:.4g} vs {init_val:.4g}): returned the best evaluated ones, of "
                f"outer step {res.best_step} ({res.best_val_loss:.4g}); they are in "
                f"TrainResult.lam, the last ones in last_lam."), stacklevel=3)

    # -- logging and checkpoints -----------------------------------------------------------------
    def _record(self, value: Tensor, grad: Tensor, lam_used: Tensor, state: InnerState,
                seconds: float, inner_step: int | None = None,
                backtracked: bool = False) -> None:
        rec: dict[str, Any] = {"outer_step": self.outer_step, "val_loss": float(value),
                               "hypergrad_norm": float(grad.detach().double().norm()),
                               "seconds": seconds,
                               "elapsed": time.perf_counter() - self._fit_start,
                               "hyperparams": self.problem.hyperparams.describe(lam_used)}
        if inner_step is not None:
            rec["inner_step"] = inner_step
        if backtracked:
            rec["backtracked"] = True
        if self.evaluate is not None and math.isfinite(rec["val_loss"]):
            rec.update({k: float(v) for k, v in self.evaluate(state).items()})
        self.history.append(rec)
        self.outer_step += 1
        if self.run_dir is not None:
            ck = self._checkpoint()  # on every rank: split tangents are gathered
            if _dist.is_writer():
                save_checkpoint(self.run_dir, ck)  # first: metrics.jsonl is
                append_line(self.run_dir / METRICS, dumps(rec))  # rewritten from it on resume
        if self._tb is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, rec["outer_step"])
        if self.progress and not self._tty:  # a log file: a line, not a progress bar
            total = self.outer_steps if self.mode == "offline" else self.problem.steps
            where = (f"outer step {self.outer_step}/{total}" if inner_step is None else
                     f"inner step {inner_step}/{total}")
            self.log(f"[hypergrad] {where}: val_loss {rec['val_loss']:.4g}, "
                     f"|dE/dlam| {rec['hypergrad_norm']:.3g}, {seconds:.1f} s")

    def _tensorboard(self) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("Trainer: tensorboard=True needs the tensorboard package: "
                              "pip install tensorboard.") from e
        if self.run_dir is None:
            raise ValueError("Trainer: tensorboard=True needs a run_dir.")
        return SummaryWriter(str(self.run_dir / "tb"))

    def _checkpoint(self) -> dict[str, Any]:
        np_state: Any = np.random.get_state()
        best = None if self._best is None else {"val": self._best[0], "lam": self._best[1],
                                                  "step": self._best[2]}
        ck: dict[str, Any] = {
            "version": 2, "mode": self.mode, "outer_step": self.outer_step,
            "lam": self.lam.detach().clone(), "outer": self.outer.state_dict(),
            "outer_class": type(self.outer).__name__, "method": self.method.name,
            "history": self.history, "last_good": self._last_good,
            "last_good_step": self._last_good_step, "best": best,
            "best_grad": self._best_grad, "backtracks": self._backtracks,
            "nonzero": sorted(self._nonzero),
            "stopped": "", "fingerprint": self._fingerprint,
            "rng": {"torch": torch.get_rng_state(), "python": _py_rng(),
                    "numpy": torch.as_tensor(np_state[1].astype(np.int64)),
                    "numpy_pos": int(np_state[2])},
        }
        if self.fstate is not None:
            ck["inner"] = {"step": self.fstate.step,
                           "state": tree_flatten(self.fstate.state)[0],
                           "tangents": _dist.gather_tangents(self.method, self.problem,
                                                             self.fstate)}
        return ck

    def _load(self, ck: dict[str, Any], path: Path) -> None:
        if ck.get("mode") != self.mode:
            raise ResumeMismatchError(
                f"Trainer: checkpoint {path} is from mode={ck.get('mode')!r}, this run is "
                f"mode={self.mode!r}; use another run_dir.")
        old = ck.get("fingerprint")
        _dist.check_resume(old, path)
        if old is None:
            warnings.warn(CheckpointWarning(
                f"Trainer: checkpoint {path} was written by an older hypergrad without a "
                f"fingerprint: whether this run matches it cannot be checked."), stacklevel=4)
        else:
            diff = fingerprint_diff(old, self._fingerprint)
            if diff:
                lines = "\n  ".join(diff)
                raise ResumeMismatchError(
                    f"Trainer: cannot resume from {path}: this run differs from the one in the "
                    f"checkpoint in what defines it (old -> new):\n  {lines}\nResume with the "
                    f"original settings, or start a new run: another run_dir (hypergrad-run: "
                    f"hydra.run.dir=...) or overwrite=True (trainer.overwrite=true). Settings "
                    f"that may change on resume: {', '.join(SAFE_TO_CHANGE)}.")
        if tuple(ck["lam"].shape) != tuple(self.lam.shape):
            raise ResumeMismatchError(
                f"Trainer: checkpoint {path} has K={ck['lam'].shape[0]} hyperparameters, this "
                f"problem has K={self.lam.shape[0]}.")
        cls = ck.get("outer_class", type(self.outer).__name__)
        if cls != type(self.outer).__name__:
            raise ResumeMismatchError(
                f"Trainer: checkpoint {path} was written with outer optimizer {cls}, this run "
                f"uses {type(self.outer).__name__}; its state cannot carry over. Resume with "
                f"{cls}, or start a new run.")
        settings = [{k: v for k, v in g.items() if k != "params"}
                    for g in self.outer.param_groups]
        try:
            self.outer.load_state_dict(ck["outer"])
        except (KeyError, ValueError, IndexError, TypeError, RuntimeError) as e:
            raise ResumeMismatchError(
                f"Trainer: the outer optimizer state in {path} does not fit "
                f"{type(self.outer).__name__} ({type(e).__name__}: {e}); resume with the outer "
                f"optimizer of the original run, or start a new run.") from e
        changed = []
        for group, new in zip(self.outer.param_groups, settings):
            for k, v in new.items():
                if k in group and group[k] != v:
                    changed.append(f"{k} {group[k]!r} -> {v!r}")
                group[k] = v
        if changed:
            self.log(f"[hypergrad] resume: outer optimizer settings given now replace the "
                     f"checkpoint's: {', '.join(changed)}")
        if ck.get("method", self.method.name) != self.method.name:
            self.log(f"[hypergrad] resume: the checkpoint's run used method={ck['method']}, this "
                     f"one uses {self.method.name} (the same hypergradients to rounding)")
        with torch.no_grad():
            self.lam.copy_(ck["lam"])
        self.history = list(ck["history"])
        self._last_good = ck.get("last_good", ck["lam"]).to(self.lam)
        self._last_good_step = int(ck.get("last_good_step", max(int(ck["outer_step"]) - 1, 0)))
        best = ck.get("best")
        if best is not None:
            self._best = (float(best["val"]), best["lam"].to(self.lam), int(best["step"]))
        self._nonzero = set(ck.get("nonzero", []))
        bg = ck.get("best_grad")
        self._best_grad = None if bg is None else bg.to(self.lam)
        self._backtracks = int(ck.get("backtracks", 0))
        self.outer_step = int(ck["outer_step"])
        torch.set_rng_state(ck["rng"]["torch"])
        random.setstate(_py_rng_restore(ck["rng"]["python"]))
        np.random.set_state(("MT19937", ck["rng"]["numpy"].numpy().astype(np.uint32),
                             ck["rng"]["numpy_pos"], 0, 0.0))
        if "inner" in ck:
            s0 = self.problem.initial_state()
            spec = tree_flatten(s0)[1]
            state = tree_unflatten(list(ck["inner"]["state"]), spec)
            tangents = tree_unflatten(_dist.local_tangents(
                self.method, self.problem, list(ck["inner"]["tangents"])), spec)
            self.fstate = ForwardState(state, tangents, int(ck["inner"]["step"]))
        if self.run_dir is not None and _dist.is_writer():  # metrics.jsonl agrees again
            write_text_atomic(self.run_dir / METRICS,
                              "".join(dumps(rec) + "\n" for rec in self.history))
        self.log(f"[hypergrad] resumed from {path} at outer step {self.outer_step}")
        if ck.get("stopped"):
            self.log(f"[hypergrad] that run had stopped on a divergence; continuing from the "
                     f"hyperparameters it kept: {self.problem.hyperparams.describe(self.lam)}")


def _py_rng() -> list[Any]:
    version, state, gauss = random.getstate()
    return [version, list(state), gauss]


def _py_rng_restore(x: list[Any]) -> tuple[Any, ...]:
    return (x[0], tuple(x[1]), x[2])
