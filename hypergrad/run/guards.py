"""What keeps an outer loop from returning silently wrong hyperparameters.

- :class:`Guards`: the Trainer's part that holds the settings below (divergence, backtracking,
  clipping, bounds, a time budget, a memory budget), checked once, in its constructor.

- :func:`divergence`: a validation loss or hypergradient that is not finite, or a validation
  loss more than ``factor`` times the best seen, means the tuning diverged.
- :func:`outer_gradient`: the hypergradient the outer optimizer gets, clipped with its norm taken
  in float64, refused when its square would overflow the working dtype (Adam squares it: an
  overflow there freezes every later update without any error).
- :func:`worse`: with backtracking, whether an outer step is too bad to keep.
- :class:`Tracker`: the best point evaluated (returned instead of the last one), the last good
  one (kept on a divergence), and the hyperparameters whose hypergradient is exactly zero (the
  losses cannot differentiate them: warned about once, and again at the end if they never
  moved).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import TuningWarning, ZeroHypergradientWarning, is_real
from ..hyperparams import HyperParams

__all__ = ["Guards", "divergence", "outer_gradient", "worse", "Tracker", "Best",
           "MAX_BACKTRACKS"]

CLOCKS = ("wall", "cpu")
"""The clocks a time budget can be measured on (``Guards(clock=...)``): ``time.perf_counter``
and ``time.process_time``."""

MAX_BACKTRACKS = 10
"""Backtracks in a row after which the run stops as diverged."""

TOP = 32
"""How many of the best distinct points a :class:`Tracker` keeps."""

Best = tuple[float, Tensor, int]
"""``(validation loss, raw hyperparameters, outer step)`` of the best point evaluated."""


def _number(name: str, value: Any, ok: Callable[[float], bool], must: str) -> float | None:
    """``value`` as a float, checked: ``None`` or a number (not a bool) for which ``ok`` holds."""
    if value is None:
        return None
    # a NumPy number too (np.int64(10) from a grid was refused as "must be a number > 1")
    if not is_real(value) or not ok(float(value)):
        raise ValueError(f"Guards: {name}={value!r} must be {must}.")
    return float(value)



CHAOS = 1e8
"""A hypergradient norm above this many times the validation loss's size (at least 1) marks
chaotic inner training (:func:`_chaos`)."""


def _chaos(history: list[dict[str, Any]]) -> str:
    """A note for the end-of-run warnings when a hypergradient norm was astronomically large
    against the loss: the chaotic-training probe (SGD at lr 2, 300 steps) had |dE/dlam| 1.7e48
    to 1.7e67 in float64, every number finite and exact, and was told only to try another outer
    learning rate. Such a derivative is exact but holds in a neighbourhood far smaller than any
    outer step (Metz et al. 2021, "Gradients are not all you need")."""
    norms = [float(h["hypergrad_norm"]) for h in history
             if math.isfinite(float(h.get("hypergrad_norm", math.nan)))]
    vals = [abs(float(h["val_loss"])) for h in history
            if math.isfinite(float(h.get("val_loss", math.nan)))]
    if not norms or max(norms) <= CHAOS * max([1.0, *vals]):
        return ""
    return (f" The hypergradient's norm reached {max(norms):.3g} against validation losses of "
            f"{max([1.0, *vals]):.3g} at most: the inner training is chaotic there (a learning "
            f"rate at or past the edge of stability, a long horizon), and its exact derivative "
            f"says nothing an outer step's distance away (in float32, not even its sign: "
            f"rounding grows as fast). Start from a smaller learning rate or bound it "
            f"(bounds={{'lr': (lo, hi)}}), shorten the horizon, or tune with the default "
            f"search (outer=None: a line search of plain runs checks every step). Truncating "
            f"the hypergradient (method=hypergrad.ReverseMode(truncate=k)) tames it but biases "
            f"it towards larger learning rates (short-horizon bias: one probe's losses rose "
            f"0.62 -> 1.1 under it).")

class Guards:
    """What keeps tuning from diverging, running out of time or memory, or leaving its box.

    Args:
        divergence_factor: a validation loss above ``best + (factor - 1) * |best|`` (for
            positive losses: ``factor`` times the best seen) counts as divergence; ``None``
            turns this check off (non-finite values always stop the run). For a loss that can
            be zero or negative (a log-likelihood) the margin depends on an additive constant:
            near a best of 0 any rise stops the run (its message says so); add a constant that
            keeps the loss positive, or turn the check off.
        backtrack: offline: an outer step whose validation loss is not finite or above
            ``best + (backtrack - 1) * |best|``, or whose hypergradient is not finite, is not
            used: ``lam`` goes back to the best hyperparameters evaluated, the outer optimizer's
            learning rate is halved and its state reset (a line search along the outer
            trajectory), and tuning goes on. After 10 backtracks in a row the run stops as
            diverged. ``None`` (default): such a step stops the run per ``divergence_factor``.
        clip_norm: clip the hypergradient to this norm (computed in float64; ``None``: no
            clipping).
        bounds: ``{name: (low, high)}`` in *value* space, the search box; ``lam`` is projected
            into it after every update (e.g. per-example weights in ``[0, 1]``, a learning rate
            ``<= 1``).
        time_budget: offline: seconds on the ``clock`` for the outer steps of one ``fit()``
            call (``None``: no limit). An outer step starts only if it is expected to finish
            within the budget (as long as the median of the last three); the first always
            runs, and the final evaluation of the last point (one plain inner run) follows.
            The default search keeps room for the re-check of its best points (a plain run
            each) and runs them past the budget by at most that room where a slow run ate
            it.
        memory_budget: bytes the method may use (``None``: the device's available memory); a
            method that would not fit is refused before anything is allocated.
        clock: what ``time_budget`` and the records' ``seconds`` / ``elapsed`` measure:
            ``"wall"`` (default, ``time.perf_counter``) or ``"cpu"`` (``time.process_time``:
            this process's CPU time, all its threads together: with torch's two intra-op
            threads about twice the wall clock on a quiet machine; other processes' load
            inflates it less than the wall clock, but not to nothing (a thread that waits for
            its peer on a busy core spins); used by ``experiments/vs_optuna.py --suite``, on
            one thread, to give every contender the same budget).

    Example:
        >>> Guards(backtrack=1.5, bounds={"lr": (1e-4, 1.0)})
        Guards(backtrack=1.5, bounds={'lr': (0.0001, 1.0)})
    """

    def __init__(self, divergence_factor: float | None = 10.0, backtrack: float | None = None,
                 clip_norm: float | None = None,
                 bounds: Mapping[str, Sequence[float | None]] | None = None,
                 time_budget: float | None = None, memory_budget: float | None = None,
                 clock: str = "wall") -> None:
        self.divergence_factor = _number(
            "divergence_factor", divergence_factor, lambda v: v > 1,
            "a number > 1 (e.g. 10), or None to turn the check off")
        self.backtrack = _number(
            "backtrack", backtrack, lambda v: 1 <= v < math.inf,
            "a number >= 1 (e.g. 1.5: back to the best point when a step's validation loss is "
            "above 1.5 times the best), or None")
        self.clip_norm = _number("clip_norm", clip_norm, lambda v: 0 < v < math.inf,
                                 "a finite number > 0 or None")
        self.time_budget = _number("time_budget", time_budget, lambda v: 0 < v < math.inf,
                                   "seconds > 0, or None for no limit")
        self.memory_budget = _number("memory_budget", memory_budget, lambda v: v > 0,
                                     "bytes > 0, or None for the device's available memory")
        if bounds is not None and not isinstance(bounds, Mapping):
            raise TypeError(f"Guards: bounds={bounds!r} must be a mapping {{name: (low, "
                            f"high)}}.")
        self.bounds = {k: tuple(v) if isinstance(v, (list, tuple)) else v
                       for k, v in (bounds or {}).items()}
        if clock not in CLOCKS:
            raise ValueError(f"Guards: clock={clock!r} must be one of {list(CLOCKS)} (the "
                             f"wall clock, or this process's CPU time).")
        self.clock_name = clock

    def settings(self) -> dict[str, Any]:
        """The settings that change a run's result (in its fingerprint)."""
        return {"guards.clip_norm": self.clip_norm, "guards.backtrack": self.backtrack}

    def __repr__(self) -> str:
        defaults = Guards.__init__.__defaults__ or ()
        names = ("divergence_factor", "backtrack", "clip_norm", "bounds", "time_budget",
                 "memory_budget", "clock")
        attr = {"clock": "clock_name"}
        args = [f"{n}={getattr(self, attr.get(n, n))!r}" for n, d in zip(names, defaults)
                if getattr(self, attr.get(n, n)) != (d if n != "bounds" else {})]
        return f"Guards({', '.join(args)})"


def _above(v: float, best: float, factor: float) -> bool:
    """``v`` is above ``factor`` times ``best`` (any sign: by ``(factor - 1) |best|``)."""
    return v > best + (factor - 1) * abs(best)


NONFINITE_GRAD = "hypergradient entries are not finite"
"""How :func:`divergence` names a hypergradient that is not finite where the training was."""

TOO_LARGE = "its square overflows"
"""How :func:`outer_gradient` names a hypergradient too large for the dtype (the training did
not diverge)."""


NEAR_ZERO = 1e-8
"""A validation loss below this (and above 0) that exceeds ``divergence_factor`` times the best
is named as possibly rounding, not a diverging training, in the divergence message."""


def divergence(value: Tensor, grad: Tensor | None, best: Best | None,
               factor: float | None) -> str | None:
    """Why an evaluation means the tuning diverged, or ``None``."""
    v = float(value)
    if not math.isfinite(v):
        return f"the validation loss is {v}"
    if grad is not None:
        bad = int((~torch.isfinite(grad)).sum())
        if bad:
            return (f"{bad} of the {grad.numel()} {NONFINITE_GRAD} at a finite validation loss "
                    f"({v:.4g})")
    if best is not None and factor is not None and _above(v, best[0], factor):
        # at a best of 0 or below the margin (factor - 1) |best| says nothing of divergence:
        # the same objective shifted by a constant stopped at another step, or went on
        hint = ("" if best[0] > 0 else
                f"; a validation loss that can be zero or negative (a log-likelihood) gives the "
                f"factor no scale, the margin being (factor - 1) * |best| = "
                f"{(factor - 1) * abs(best[0]):.3g}: add a constant that keeps it positive, "
                f"or give Guards(divergence_factor=None)")
        if best[0] > 0 and v < NEAR_ZERO:  # a noise-free fit: both are rounding
            hint = ("; both losses are near 0, where a rise by any factor can be rounding "
                    "(a noise-free fit): give Guards(divergence_factor=None), or add a "
                    "constant to the validation loss")
        return (f"the validation loss {v:.4g} exceeds divergence_factor={factor:g} times the "
                f"best seen ({best[0]:.4g}, outer step {best[2]}){hint}")
    return None


def outer_gradient(grad: Tensor, clip_norm: float | None, dtype: torch.dtype,
                   diverged: str | None = None, value: float | None = None
                   ) -> tuple[Tensor | None, str | None]:
    """The (clipped) hypergradient in ``dtype``, or ``None`` and why there is none: the norm is
    taken in float64, and its square must be representable in ``dtype``. ``diverged``: how the
    inner training at that point diverges, where the caller found it does (the message then
    says so and advises a stable training, not a clip of a sound hypergradient). ``value``:
    the validation loss there; against it, a norm past :data:`CHAOS` times its size is named
    chaotic training, where a clip or float64 gives a finite but useless hypergradient (the
    advice was to clip, scale the loss down or run in float64; the chaos probe)."""
    g = grad.detach().to(torch.float64)
    norm = float(g.norm())
    if not math.isfinite(norm):
        return None, "the hypergradient's norm overflows even in float64"
    if clip_norm is not None and norm > clip_norm:
        g = g * (clip_norm / norm)
        norm = clip_norm
    if norm >= math.sqrt(torch.finfo(dtype).max):
        if diverged is not None:
            return None, (f"the hypergradient's norm {norm:.3g} is too large for "
                          f"{str(dtype).replace('torch.', '')} ({TOO_LARGE}): the inner "
                          f"training diverges, to {diverged}; make it stable first: a smaller "
                          f"learning rate (its initial value, or the upper bound in "
                          f"Guards(bounds=...) if it is tuned), or gradient clipping (the inner "
                          f"optimizer's clip_grad_norm=1.0)")
        scale = max(1.0, abs(value)) if value is not None and math.isfinite(value) else None
        if scale is not None and norm > CHAOS * scale:
            return None, (f"the hypergradient's norm {norm:.3g} is too large for "
                          f"{str(dtype).replace('torch.', '')} ({TOO_LARGE}), against a "
                          f"validation loss of {value:.4g}: the inner training is chaotic "
                          f"there (a learning rate at or past the edge of stability, a long "
                          f"horizon), and its exact derivative says nothing an outer step's "
                          f"distance away: a clip keeps its arbitrary direction, and float64 "
                          f"gives a finite one as useless. Start from a smaller learning rate "
                          f"or bound it (bounds={{'lr': (lo, hi)}}), shorten the horizon, or "
                          f"tune with the default search (outer=None)")
        wider = "" if dtype == torch.float64 else ", or run the problem in float64"
        return None, (f"the hypergradient's norm {norm:.3g} is too large for "
                      f"{str(dtype).replace('torch.', '')} ({TOO_LARGE}, which would "
                      f"freeze the outer optimizer; the training did not diverge: give "
                      f"Guards(clip_norm=...) or scale the validation loss down{wider})")
    return g.to(dtype), None


def worse(value: Tensor, grad: Tensor, best: Best | None, backtrack: float | None) -> str | None:
    """With ``backtrack``: why this outer step is not to be used, or ``None``."""
    if backtrack is None or best is None:
        return None
    v = float(value)
    if not math.isfinite(v):
        return f"validation loss {v}"
    if not bool(torch.isfinite(grad).all()):
        return "a hypergradient that is not finite"
    if _above(v, best[0], backtrack):
        return f"validation loss {v:.4g} > backtrack={backtrack:g} x best {best[0]:.4g}"
    return None


class Tracker:
    """The points an outer loop evaluated: the best and the last good one, and which
    hyperparameters ever had a non-zero hypergradient. ``lam0``: the initial raw values."""

    def __init__(self, hps: HyperParams, lam0: Tensor) -> None:
        self.hps = hps
        self.lam0 = lam0.detach().clone()
        self._grad: tuple[Tensor, Tensor] | None = None  # (lam, the outer gradient there)
        self.last_good = self.lam0.clone()  # lam of the last finite evaluation
        self.last_good_step = 0  # and its outer step
        self.last_good_val = math.nan  # and its validation loss
        self.nonzero: set[str] = set()
        self.zero_warned: set[str] = set()
        self.zero_hint = ""
        """What else can make a hypergradient exactly zero with the run's method (its
        warning's last words; finite differences in float32: rounding)."""
        self.top: list[Best] = []
        """The best distinct points evaluated, lowest validation loss first (at most
        :data:`TOP`; the first of equal losses first): the candidates the Trainer re-checks
        before returning one."""
        self.gradless_seen: list[Tensor] = []
        """Every such point (raw), once each, for the end-of-run warning."""
        self.gradless: list[Best] = []
        """Points evaluated at a finite validation loss whose hypergradient was not finite
        (a square root at 0 in a loss): kept out of :attr:`top` while the search runs, which
        steps from its best, and admitted as results at the end (:meth:`gradless_admitted`). The
        point returned ignored them: 0.0290 returned where 0.0204 had been evaluated (the
        divergence probe, 2026-12-07)."""

    @property
    def best_grad(self) -> Tensor | None:
        """The outer gradient taken at the best point, ``None`` where none was (the best is a
        plain run's point: the space-filling start, a line search, a restart)."""
        if self._grad is None or self.best is None or not torch.equal(self._grad[0],
                                                                      self.best[1]):
            return None
        return self._grad[1]

    def keep_grad(self, lam: Tensor, grad: Tensor) -> None:
        """Keep ``grad``, the outer gradient at ``lam``, if ``lam`` is the best point (points
        with a hypergradient were mostly evaluated before, by the previous line search, so
        the best's outer step says nothing about where its gradient was taken)."""
        if self.best is not None and torch.equal(self.best[1], lam):
            self._grad = (lam.detach().clone(), grad.detach().clone())

    @property
    def best(self) -> Best | None:
        """``(validation loss, lam, outer step)`` of the best point evaluated (the first of
        equal ones), or ``None`` before any."""
        return self.top[0] if self.top else None

    def track(self, value: Tensor, lam: Tensor, grad: Tensor | None, step: int,
              first: bool) -> None:
        """Record a finite evaluation at outer step ``step``; at the ``first`` one, warn about
        hyperparameters whose hypergradient is exactly zero."""
        v = float(value)
        self.last_good, self.last_good_step = lam.detach().clone(), step
        self.last_good_val = v
        self._keep(v, lam, step)
        if grad is None:
            return
        zero = []
        for name, sl in self.hps.slices.items():
            if bool(grad[sl].any()):
                self.nonzero.add(name)
            elif first and name not in self.zero_warned:
                zero.append(name)
        if zero:
            self.zero_warned.update(zero)
            one = "it" if len(zero) == 1 else "them"
            warnings.warn(ZeroHypergradientWarning(
                f"Trainer: the hypergradient of {zero} is exactly zero at the first outer step: "
                f"the losses do not change with {one} here (0 * hp, round(hp), a step function "
                f"of it, a value of it cached at an earlier call and read instead of hp[...], "
                f"or a stationary point: an objective at its minimum in it), so "
                f"hypergradients will not move {one} (a search's plain runs may, to values the "
                f"losses do not tell apart). Make the losses depend on it smoothly, or remove "
                f"it.{self.zero_hint}"), stacklevel=5)

    def _keep(self, v: float, lam: Tensor, step: int) -> None:
        for i, (w, x, _) in enumerate(self.top):
            if torch.equal(x, lam):  # the same point again: keep its first (lower) record
                if v < w:
                    self.top[i] = (v, lam.detach().clone(), step)
                    self.top.sort(key=lambda b: b[0])
                return
        if len(self.top) < TOP or v < self.top[-1][0]:
            self.top.append((v, lam.detach().clone(), step))
            self.top.sort(key=lambda b: b[0])
            del self.top[TOP:]

    def note_gradless(self, value: float, lam: Tensor, step: int) -> None:
        """Keep a point evaluated at a finite validation loss whose hypergradient was not
        finite as a result (:attr:`gradless`)."""
        if math.isfinite(value) and not any(torch.equal(x, lam) for _, x, _ in self.gradless):
            self._put_aside(value, lam, step)

    def set_aside(self, lam: Tensor, value: float) -> None:
        """Move the point ``lam`` from :attr:`top` to :attr:`gradless` (no hypergradient to
        step from there, found when the search came back to it), at the worse of its recorded
        loss and ``value``."""
        for i, (w, x, k) in enumerate(self.top):
            if torch.equal(x, lam):
                del self.top[i]
                self._put_aside(max(w, value), x, k)
                return

    def _put_aside(self, value: float, lam: Tensor, step: int) -> None:
        self.gradless = [b for b in self.gradless if not torch.equal(b[1], lam)]
        self.gradless.append((value, lam.detach().clone(), step))
        self.gradless.sort(key=lambda b: b[0])
        del self.gradless[TOP:]
        if not any(torch.equal(lam, y) for y in self.gradless_seen):
            self.gradless_seen.append(lam.detach().clone())

    @contextlib.contextmanager
    def gradless_admitted(self) -> Iterator[None]:
        """Inside, the :attr:`gradless` points are among the results (:attr:`top`), while the
        point returned is chosen; after, they are set apart again, so a resume or another
        ``fit()`` steps from a point with a hypergradient (back at such a point, the run
        stopped at once as diverged)."""
        held = list(self.gradless)
        for v, x, k in held:
            self._keep(v, x, k)
        try:
            yield
        finally:
            for _, x, _ in held:
                for i, (w, y, _) in enumerate(self.top):
                    if torch.equal(x, y):  # at the worse of its measurements (a re-check)
                        del self.top[i]
                        self.gradless = [(max(u, w), z, j) if torch.equal(z, x) else (u, z, j)
                                         for u, z, j in self.gradless]
                        break
            self.gradless.sort(key=lambda b: b[0])

    def demote(self, lam: Tensor, value: float) -> None:
        """Keep the worse of the recorded loss of ``lam`` and ``value`` (the point measured
        again on other batches: a stream's fresh pass), so that a point that trained well in
        one draw only is no longer the best; ``inf`` drops it from the candidates' top."""
        for i, (w, x, k) in enumerate(self.top):
            if torch.equal(x, lam):
                self.top[i] = (max(w, value), x, k)
                self.top.sort(key=lambda b: b[0])
                if not math.isfinite(self.top[-1][0]):
                    del self.top[-1]
                return

    def fallback(self, offline: bool) -> tuple[Tensor, int, float, str]:
        """What to return after a divergence: ``(lam, outer step, validation loss, words)``.
        Offline the best point; online (losses of a moving state) the last good one."""
        if offline and self.best is not None:
            val, lam, step = self.best
            return lam, step, val, (f"returned the best hyperparameters evaluated, of outer step "
                                    f"{step} (validation loss {val:.4g})")
        if self.best is not None:  # its own loss (the best one's was paired with it)
            return (self.last_good, self.last_good_step, self.last_good_val,
                    f"kept the last good hyperparameters, of outer step {self.last_good_step} "
                    f"(validation loss {self.last_good_val:.4g})")
        return self.lam0, 0, math.nan, ("the initial hyperparameters already diverge: returned "
                                        "them; start from values that train without diverging "
                                        "(a smaller learning rate, a milder penalty)")

    def warn_at_end(self, last_lam: Tensor | None, diverged: bool, offline: bool,
                    history: list[dict[str, Any]], best_step: int | None,
                    best_val: float | None, last_val: float | None,
                    searched: bool = False, still: str = "") -> None:
        """Name the hyperparameters that never moved, and say when tuning did not help
        (not when the Trainer also ran plain runs, ``searched``: a space-filling start or a
        restart may leave the first or the last hypergradient's point above the best, which
        is returned, and the search evaluated other values of every hyperparameter even where
        the outer loop ended at the initial point). ``still``: why nothing moved, where the
        Trainer knows (an outer learning rate of 0)."""
        if not history or last_lam is None:
            return
        last, first = self.hps.split(last_lam), self.hps.split(self.lam0)
        for name in self.hps.names:
            if name in self.zero_warned or not torch.equal(last[name], first[name]):
                continue
            if name not in self.nonzero:
                self.zero_warned.add(name)
                warnings.warn(ZeroHypergradientWarning(
                    f"Trainer: {name!r} never moved: its hypergradient was exactly zero at "
                    f"every outer step (the losses cannot differentiate it: .item(), float(), "
                    f"round, .detach(), torch.where on it, or 0 * hp)."), stacklevel=3)
            elif not diverged and not searched:  # a search's plain runs moved it
                init = self.hps.describe(self.lam0)[name]
                why = still or "bounds held it, or the outer steps were too small"
                warnings.warn(TuningWarning(
                    f"Trainer: {name!r} never moved from its initial value {init} ({why})."),
                    stacklevel=3)
        chaos = _chaos(history)
        if offline and not diverged and not searched:
            init_val = float(history[0]["val_loss"])
            if best_step == 0:
                warnings.warn(TuningWarning(
                    f"Trainer: no outer step improved on the initial hyperparameters "
                    f"(validation loss {init_val:.4g}; last {last_val:.4g}): returned the "
                    f"initial ones. Try another outer learning rate: smaller if the steps "
                    f"overshot (the last loss is above the initial one), larger if they barely "
                    f"moved.{chaos}"), stacklevel=3)
                return
            if last_val is not None and last_val > init_val:
                warnings.warn(TuningWarning(
                    f"Trainer: the last hyperparameters are worse than the initial ones "
                    f"(validation loss {last_val:.4g} vs {init_val:.4g}): returned the best "
                    f"evaluated ones, of outer step {best_step} ({best_val:.4g}); they are in "
                    f"TrainResult.lam, the last ones in last_lam.{chaos}"), stacklevel=3)
                return
        if chaos:
            # said only beside a failure above: a run that improved anyway (its line search
            # rejecting the wild steps; norms 5.3e11 and 5.9e9, validation 0.62 -> 0.41) or
            # went online (norms to 6.3e6) was not told that its hypergradients were noise
            got = ("the search's plain runs, which check every point, found what it returns"
                   if searched else
                   "online, the updates followed them" if not offline else
                   "the loss improved all the same; their directions may still be noise")
            warnings.warn(TuningWarning(
                f"Trainer: the hypergradients were not informative ({got}).{chaos}"),
                stacklevel=3)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's fields (the names of checkpoint version 2)."""
        best = None if self.best is None else {"val": self.best[0], "lam": self.best[1],
                                               "step": self.best[2]}
        return {"last_good": self.last_good, "last_good_step": self.last_good_step,
                "last_good_val": self.last_good_val,
                "best": best, "best_grad": self.best_grad, "nonzero": sorted(self.nonzero),
                "grad_at": None if self._grad is None else self._grad[0],  # where it was taken
                "top": [{"val": v, "lam": x, "step": k} for v, x, k in self.top],
                "gradless": [{"val": v, "lam": x, "step": k} for v, x, k in self.gradless]}

    def load_state_dict(self, ck: dict[str, Any], like: Tensor) -> None:
        """Restore from a checkpoint (older ones may lack fields), tensors as ``like``."""
        self.last_good = ck.get("last_good", ck["lam"]).to(like)
        self.last_good_step = int(ck.get("last_good_step", max(int(ck["outer_step"]) - 1, 0)))
        self.last_good_val = float(ck.get("last_good_val", math.nan))
        self.nonzero = set(ck.get("nonzero", []))
        self.top = [(float(b["val"]), b["lam"].to(like), int(b["step"]))
                    for b in ck.get("top", [])]
        self.gradless = [(float(b["val"]), b["lam"].to(like), int(b["step"]))
                         for b in ck.get("gradless", [])]
        best = ck.get("best")
        if not self.top and best is not None:  # an older checkpoint: its best point
            self.top = [(float(best["val"]), best["lam"].to(like), int(best["step"]))]
        bg, at = ck.get("best_grad"), ck.get("grad_at")
        if at is None and bg is not None and self.top:  # an older checkpoint: at its best
            at = self.top[0][1]
        self._grad = None if bg is None or at is None else (at.to(like), bg.to(like))
