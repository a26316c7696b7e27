"""Outer optimizers: what updates the raw hyperparameters from their hypergradients.

Any ``torch.optim.Optimizer`` works (the Trainer takes a factory ``params -> optimizer``, e.g.
``functools.partial(torch.optim.Adam, lr=0.05)``); this module adds the ones made for
hypergradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..errors import is_real

__all__ = ["SignDescent", "SearchOptimizer", "QuasiNewton", "OuterOptimizerFactory",
           "default_outer", "schedule_smoothing", "search_box", "shrink_lr", "SURROGATE_K"]

OuterOptimizerFactory = Callable[[list[Tensor]], torch.optim.Optimizer]


def _checked_precondition(who: str, precondition: Tensor | None,
                          optimizer: torch.optim.Optimizer) -> Tensor | None:
    """``precondition`` if it is a K x K matrix for the optimizer's one parameter of K
    entries (or ``None``); else a ValueError naming both."""
    if precondition is not None:
        sizes = [p.numel() for g in optimizer.param_groups for p in g["params"]]
        if len(sizes) != 1 or tuple(precondition.shape) != (sizes[0], sizes[0]):
            raise ValueError(f"{who}: precondition of shape {tuple(precondition.shape)} needs "
                             f"one parameter of that many entries; got parameters of {sizes} "
                             f"entries.")
    return precondition


def _whole(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer's attributes for pickling: torch's ``__getstate__`` keeps its defaults,
    state and groups only, so a Trainer sent to a worker process lost a search's box (and
    failed there), a precondition, a surrogate's points. Its hooks are torch's to remake."""
    return {k: v for k, v in opt.__dict__.items() if not k.startswith("_optimizer_")}


class SignDescent(torch.optim.Optimizer):
    """Sign steps with per-coordinate halving on a sign flip (FDS-style; Micaelli & Storkey 2021).

    ``lam -= step * sign(g)``; where ``sign(g)`` differs from the previous one, ``step *= factor``.
    Robust to the scale of hypergradients, which varies by orders of magnitude between kinds.
    The step sizes start at ``lr`` and scale with it: a new ``param_groups[0]["lr"]`` (a
    resume that gives another, a scheduler) rescales them at the next step.
    With ``precondition`` (a K x K matrix, e.g. :func:`schedule_smoothing`'s, for a parameter
    of K entries) the sign is taken of ``precondition @ g``: a schedule's windows step together
    instead of following one seed's window-to-window jitter.
    """

    def __init__(self, params: Any, lr: float = 0.1, factor: float = 0.5,
                 precondition: Tensor | None = None) -> None:
        if not is_real(lr) or not 0 < float(lr) < math.inf:  # "0.1" failed as '>' not supported
            raise ValueError(f"SignDescent: lr={lr!r} must be a number > 0 (the initial step in "
                             f"raw coordinates), e.g. lr=0.1.")
        if not is_real(factor) or not 0 < float(factor) <= 1:
            raise ValueError(f"SignDescent: factor={factor!r} must be a number in (0, 1] (the "
                             f"step's shrink on a sign flip), e.g. factor=0.5.")
        if precondition is not None and not isinstance(precondition, Tensor):
            raise TypeError(f"SignDescent: precondition must be a K x K tensor or None, got "
                            f"{type(precondition).__name__}.")
        super().__init__(params, dict(lr=float(lr), factor=float(factor)))
        self.precondition = _checked_precondition("SignDescent", precondition, self)

    def __getstate__(self) -> dict[str, Any]:
        return _whole(self)

    def resume_settings(self) -> dict[str, Any]:
        """Its settings outside its parameter groups (the preconditioner), which a checkpoint
        records so that a resume given others says so."""
        return {"precondition": self.precondition}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's; a state saved before it kept its lr (a checkpoint written before
        2026-12-06) takes the saved group's, so a resume that gives another lr still rescales
        the step sizes."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if st and "lr" not in st:
                    st["lr"] = float(group["lr"])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step_size"] = torch.full_like(p, group["lr"])
                    st["prev_sign"] = torch.zeros_like(p)
                    st["lr"] = float(group["lr"])
                if st.get("lr", group["lr"]) != group["lr"]:  # the lr they derive from
                    st["step_size"].mul_(group["lr"] / st["lr"])
                st["lr"] = float(group["lr"])
                g = p.grad
                if self.precondition is not None:
                    g = (self.precondition.to(g) @ g.reshape(-1)).reshape(g.shape)
                s = torch.sign(g)
                flip = s * st["prev_sign"] < 0
                st["step_size"][flip] *= group["factor"]
                p.sub_(st["step_size"] * s)
                st["prev_sign"].copy_(s)


SURROGATE_K = range(16, 101)
"""The numbers of hyperparameters for which the offline default is the surrogate model
(:class:`~hypergrad.run.surrogate.Surrogate`) instead of :class:`QuasiNewton`: on the suite's
development half (four runs of 10 seeds) it was better at K = 30 and 50 in every run
(geometric mean of the test losses 0.93-0.95x), worse at K <= 15 (1.01-1.10x) and at K = 200
(1.25x); in the 10-seed headline run after it, see docs/benchmarks.md."""


def schedule_smoothing(items: Any, length: float | None) -> Tensor | None:
    """A preconditioner for :class:`QuasiNewton` (the Trainer fills it into one given without
    a preconditioner, with ``length`` = ``Offline(search=...)``'s
    :attr:`~hypergrad.run.modes.SearchSettings.smooth_schedule`) and
    :class:`SignDescent` over the raw hyperparameters of ``items``
    (``problem.hyperparams.items``, in their order) that couples the windows of each schedule:
    within a :class:`~hypergrad.Schedule` of ``n >= 3`` windows, a Gaussian kernel over the
    window index with length scale ``length * n`` windows, scaled so that its largest
    eigenvalue is 1 (a schedule's smooth changes keep their size, window-to-window jitter
    shrinks); the identity elsewhere. A sparse (COO) tensor holding the blocks and the
    identity's diagonal (``.to_dense()`` gives the matrix); ``None`` when there is nothing
    to couple (no such schedule, or ``length`` is ``None``)."""
    items = list(items)
    if length is None or not any(it.kind == "schedule" and getattr(it, "windows", it.numel) >= 3
                                 for it in items):
        # nothing to couple: no K x K identity built (1.95 GB at K = 16000 per-example
        # weights, on every Trainer built)
        return None
    k = sum(it.numel for it in items)
    rows, cols, vals = [], [], []
    plain = torch.ones(k, dtype=torch.bool)  # the identity's diagonal outside the blocks
    at = 0
    for it in items:
        n = getattr(it, "windows", it.numel)  # a schedule per group: each group's windows
        if it.kind == "schedule" and n >= 3:
            i = torch.arange(n, dtype=torch.float64)
            block = torch.exp(-(i[:, None] - i[None, :]) ** 2 / (2 * (length * n) ** 2))
            block = block / torch.linalg.eigvalsh(block)[-1]
            r, c = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
            for row in range(at, at + it.base_numel, n):  # not a schedule's scales
                rows.append(r.reshape(-1) + row)
                cols.append(c.reshape(-1) + row)
                vals.append(block.reshape(-1))
                plain[row:row + n] = False
        at += it.numel
    eye = torch.arange(k)[plain]
    rows.append(eye)
    cols.append(eye)
    vals.append(torch.ones(len(eye), dtype=torch.float64))
    # sparse: with a schedule beside thousands of per-example weights the dense matrix was
    # the Trainer's largest object, and written into every checkpoint (2 GB at K = 16000)
    return torch.sparse_coo_tensor(torch.stack([torch.cat(rows), torch.cat(cols)]),
                                   torch.cat(vals), (k, k), check_invariants=True).coalesce()


def default_outer(params: list[Tensor], box: tuple[Tensor, Tensor] | None = None,
                  online: bool = False) -> torch.optim.Optimizer:
    """The Trainer's default outer optimizer (``outer=None``). Offline: in the search ``box``
    (the Trainer passes :attr:`Trainer.box <hypergrad.Trainer.box>`), the surrogate model
    :class:`~hypergrad.run.surrogate.Surrogate` for K in :data:`SURROGATE_K` (16 to 100),
    else :class:`QuasiNewton`; until issue 27 it was Adam with lr 0.05, which took 1.5x TPE's
    test loss on the suite's development half (docs/guide.md, "The defaults"). Online: Adam
    with lr 0.05, as before: a line search needs whole plain inner runs, which online tuning
    (one run) cannot afford. The Trainer fills in what it leaves out: the box, QuasiNewton's
    :func:`schedule_smoothing`, the Surrogate's seed."""
    if online:
        return torch.optim.Adam(params, lr=0.05)
    if sum(p.numel() for p in params) in SURROGATE_K:
        from .surrogate import Surrogate

        return Surrogate(params, box=box)
    return QuasiNewton(params, box=box)


def shrink_lr(optimizer: torch.optim.Optimizer, factor: float = 0.5) -> list[float]:
    """Multiply every group's learning rate by ``factor`` and forget the optimizer's state (its
    moments and step sizes belong to the steps being undone): a restart with smaller steps, for
    backtracking. Returns the new learning rates."""
    lrs = []
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = group["lr"] * factor
            lrs.append(group["lr"])
    optimizer.state.clear()
    return lrs


class SearchOptimizer(torch.optim.Optimizer):
    """An outer optimizer that searches with plain inner runs in the search box (the base of
    :class:`QuasiNewton` and :class:`~hypergrad.run.Surrogate`). What the Trainer does with one:

    - gives it its own search box when ``box`` is ``None`` (raw low and high bounds,
      :func:`search_box`), and sets ``value``, the validation loss at the current point,
      before each step;
    - calls ``step(closure)`` offline, where ``closure()`` trains one plain inner run at the
      parameter's current value and returns its validation loss (``None``: the time budget is
      spent); afterwards ``trials`` (the plain runs spent), ``improved`` (whether the point
      moved) and ``stalled`` (nothing better found: the Trainer restarts elsewhere) say what
      happened;
    - reports every plain run it makes outside ``step`` (the start, restarts, the leftover
      time) to :meth:`observe`, and spends the time left after the last hypergradient on
      :meth:`next_point`'s points (``None``: quasi-random ones).
    """

    def __getstate__(self) -> dict[str, Any]:
        return _whole(self)

    def __init__(self, params: Any, defaults: dict[str, Any],
                 box: tuple[Tensor, Tensor] | None = None) -> None:
        super().__init__(params, defaults)
        self.box = box
        self.value: float | None = None  # the validation loss at the current point
        self.trials = 0
        self.improved = False
        self.stalled = False
        self.uses_closure = True

    def step(self, closure: Callable[[], float | None] | None = None  # type: ignore[override]
             ) -> None:
        """One outer step from the current point with the hypergradient in ``p.grad``; the
        ``closure`` as above."""
        raise NotImplementedError

    def observe(self, x: Tensor, value: float, grad: Tensor | None = None) -> None:
        """A plain run the Trainer made at raw ``x`` (validation loss ``value``); nothing here
        (a surrogate model keeps it)."""

    def resume_settings(self) -> dict[str, Any]:
        """Its settings outside its parameter groups, which a checkpoint records so that a
        resume given others says so (none here)."""
        return {}

    def next_point(self, like: Tensor) -> Tensor | None:
        """The next point worth a plain run when no hypergradient fits any more (raw, like
        ``like``); ``None``: the Trainer's quasi-random points."""
        return None

    def _width(self, p: Tensor) -> Tensor:
        if self.box is None:
            return torch.ones_like(p)
        lo, hi = self.box
        return (hi - lo).to(p).clamp_min(1e-12)

    def _project(self, x: Tensor) -> Tensor:
        if self.box is None:
            return x
        lo, hi = self.box
        return torch.minimum(torch.maximum(x, lo.to(x)), hi.to(x))

    def _feasible(self, x: Tensor, d: Tensor) -> Tensor:
        """``d`` without the coordinates that would leave the box from ``x``'s bound
        (projected, such a step moves them nowhere: a line search along it trained the same
        point again and again)."""
        if self.box is None:
            return d
        lo, hi = self.box
        return d.masked_fill(((x <= lo.to(x)) & (d < 0)) | ((x >= hi.to(x)) & (d > 0)), 0.0)


class QuasiNewton(SearchOptimizer):
    """The Trainer's default outer optimizer for K <= 15 and K > 100 (:func:`default_outer`;
    16 <= K <= 100: the Surrogate): L-BFGS directions built from the hypergradients, a line
    search of plain inner runs along each, steps measured in the search box.

    Every outer step the Trainer hands it the hypergradient ``g`` at the current point ``x``
    (``p.grad``) and a ``closure(x) -> validation loss`` that trains one plain inner run (about
    a fifth of a hypergradient's cost) and returns ``None`` when the time budget is spent:

    - **Coordinates scaled to the box**: ``u = x / width`` per raw coordinate (``box``: the
      low and high raw bounds, see :func:`search_box`), so a learning rate in log space, a
      momentum in logit space and a per-example weight take steps of comparable size whatever
      their kind or transform.
    - **Direction**: the first step, and a step after a reset, is steepest descent in ``u``
      scaled so that the root mean square of its coordinates is ``step`` (default 0.15 of the
      box) and no coordinate moves more than half the box; later steps are L-BFGS directions
      (the last ``memory`` pairs of point and hypergradient differences: a quadratic model fit
      to the hypergradients, which no black-box tuner has), pairs with ``s.y <= 0`` skipped.
    - **Line search** on the validation loss with plain runs, projected into the box: a step
      that lowers the loss is doubled while it keeps lowering it (up to ``expand`` times); one
      that does not is halved (up to ``backtrack`` times); the best point becomes ``x`` and the
      next hypergradient is taken there. When no trial improves, the memory is dropped and the
      search repeats once along steepest descent with a quarter of the step.
    - **Schedules move smoothly** (``precondition``, a symmetric positive definite K x K
      matrix in box units, or ``None``): the steepest-descent direction is ``-P g`` and
      L-BFGS starts from the inverse-Hessian model ``gamma P`` instead of ``gamma I``. Where
      none is given, the Trainer fills in :func:`schedule_smoothing` (give the identity for
      no coupling), which couples neighbouring windows of each learning-rate (or other)
      schedule: one training seed's hypergradient of a 10-window schedule jitters from window
      to window with that seed's batch order, and a schedule that follows the jitter fits
      that order (issue 26's teacher task).
    - **No steps below** ``min_step`` (2% of the box, in its largest coordinate): between
      points that close, the validation loss of one training seed differs mostly by noise (on
      the suite's development half, a line search that went on halving picked such noise:
      points near the edge of stable training whose loss at fresh seeds was 2-5 times higher).
      A shorter direction is lengthened to ``min_step``, and backtracking stops there; when
      no step of at least that length improves, the search has converged as far as one seed
      can tell, and the Trainer restarts elsewhere.

    Attributes after a step: ``trials`` (the plain runs it spent), ``improved`` (whether it
    moved), ``stalled`` (no trial improved even after the retry: the Trainer restarts).
    """

    def __init__(self, params: Any, box: tuple[Tensor, Tensor] | None = None,
                 step: float = 0.15, memory: int = 6, expand: int = 3,
                 backtrack: int = 3, min_step: float = 0.02,
                 precondition: Tensor | None = None) -> None:
        if not step > 0 or memory < 0 or expand < 0 or backtrack < 0 or not min_step >= 0:
            raise ValueError(f"QuasiNewton: step={step!r} must be > 0, memory={memory!r}, "
                             f"expand={expand!r}, backtrack={backtrack!r} and "
                             f"min_step={min_step!r} >= 0.")
        super().__init__(params, dict(step=step, memory=memory, expand=expand,
                                      backtrack=backtrack, min_step=min_step), box=box)
        self.precondition = _checked_precondition("QuasiNewton", precondition, self)

    def resume_settings(self) -> dict[str, Any]:
        """The preconditioner (see :meth:`SearchOptimizer.resume_settings`)."""
        return {"precondition": self.precondition}

    @torch.no_grad()
    def step(self, closure: Callable[[], float | None] | None = None  # type: ignore[override]
             ) -> None:
        """One line search from the current point along the direction from ``p.grad``.

        ``closure`` evaluates the validation loss at the parameter's current value (set by
        this method; ``None`` back: out of time). Without a closure, a plain step of size
        ``step`` along the direction is taken (no search)."""
        group = self.param_groups[0]
        (p,) = [q for q in group["params"] if q.grad is not None] or [None]
        if p is None:
            return
        st = self.state[p]
        w = self._width(p)
        x0 = p.detach().clone()
        g = p.grad.detach() * w  # the gradient in box units
        self.trials, self.improved, self.stalled = 0, False, False
        if not bool(g.any()):  # nothing to follow (every hyperparameter's is exactly zero):
            self.stalled = True  # a plateau; the next hypergradient here would be this one
            return
        value = self.value
        if "s" in st and value is not None:
            s_u, y_u = (x0 - st["x"]) / w, g - st["g"]
            sy = float(s_u @ y_u)
            if sy > 1e-10 * float(s_u.norm() * y_u.norm()):
                st["s"].append(s_u)
                st["y"].append(y_u)
                del st["s"][:-group["memory"]], st["y"][:-group["memory"]]
        st.setdefault("s", [])
        st.setdefault("y", [])
        st["x"], st["g"] = x0, g.clone()
        st.setdefault("scale", group["step"])
        for attempt in range(2):
            d = self._feasible(x0, self._direction(g, st, use_memory=attempt == 0))
            top = float(d.abs().max())
            if top == 0.0:  # every coordinate it moves is on the bound it points out of
                continue
            if top < group["min_step"]:  # no shorter step than the noise floor
                d = d * (group["min_step"] / top)
            if closure is None or value is None:
                p.copy_(self._project(x0 + d * w))
                return
            best, alpha = self._search(p, x0, d, w, value, closure, group)
            if best is None:  # out of time
                p.copy_(x0)
                return
            floor = 2 * group["min_step"]
            if alpha > 0:
                self.value, self.improved = best, True
                if not st["s"]:  # steepest descent: the next first step starts at this scale
                    st["scale"] = min(max(st["scale"] * alpha, floor), 0.5)
                return
            st["s"].clear()
            st["y"].clear()
            st["scale"] = max(st["scale"] / 4, floor)
        self.stalled = True
        p.copy_(x0)

    def _h0(self, q: Tensor) -> Tensor:
        """The initial inverse-Hessian model applied to ``q`` (box units): the identity, or
        the ``precondition`` matrix."""
        return q if self.precondition is None else self.precondition.to(q) @ q

    def _direction(self, g: Tensor, st: dict[str, Any], use_memory: bool) -> Tensor:
        if not use_memory or not st["s"]:
            d = self._h0(g)
            rms = float(d.pow(2).mean().sqrt())
            if rms == 0.0:
                return torch.zeros_like(g)
            return (-d / rms * st["scale"]).clamp(-0.5, 0.5)
        q = g.clone()
        alphas = []
        for s, y in zip(reversed(st["s"]), reversed(st["y"])):
            rho = 1.0 / float(y @ s)
            a = rho * float(s @ q)
            alphas.append((a, rho, s, y))
            q -= a * y
        s, y = st["s"][-1], st["y"][-1]
        q = self._h0(q) * (float(s @ y) / float(y @ self._h0(y)))
        for a, rho, s, y in reversed(alphas):
            b = rho * float(y @ q)
            q += (a - b) * s
        d = -q
        if float(d @ g) >= 0:  # not a descent direction: steepest descent instead
            st["s"].clear()
            st["y"].clear()
            return self._direction(g, st, use_memory=False)
        return d.clamp(-0.5, 0.5)

    def _search(self, p: Tensor, x0: Tensor, d: Tensor, w: Tensor, value: float,
                closure: Callable[[], float | None], group: dict[str, Any]
                ) -> tuple[float | None, float]:
        """Try ``x0 + a d`` (in box units), doubling ``a`` while the loss falls or halving it
        until it does; leaves ``p`` at the best point; returns its loss and ``a`` (0: none
        better than ``value``)."""
        best, best_a = value, 0.0

        def trial(a: float) -> float | None:
            p.copy_(self._project(x0 + a * d * w))
            self.trials += 1
            v = closure()
            return None if v is None else (v if math.isfinite(v) else math.inf)

        v = trial(1.0)
        if v is None:
            return None, 0.0
        if v < best:
            best, best_a = v, 1.0
            a = 1.0
            for _ in range(group["expand"]):
                a *= 2
                if float((self._project(x0 + a * d * w) - self._project(
                        x0 + a / 2 * d * w)).abs().max()) == 0.0:
                    break  # the box stops the step
                v = trial(a)
                if v is None or not v < best:
                    break
                best, best_a = v, a
        else:
            a = 1.0
            for _ in range(group["backtrack"]):
                a /= 2
                if a * float(d.abs().max()) < group["min_step"]:
                    break  # steps this small only pick the noise of one seed's training
                v = trial(a)
                if v is None:
                    break
                if v < best:
                    best, best_a = v, a
                    break
        p.copy_(self._project(x0 + best_a * d * w))
        return best, best_a


def search_box(hps: Any, raw_bounds: Any, lam0: Tensor) -> tuple[Tensor, Tensor]:
    """The search box in raw coordinates, ``(low, high)`` of shape ``(K,)``: the bounds given
    (``Guards(bounds=...)``: a :class:`~hypergrad.run.bounds.Bounds`, or ``{name: (raw low,
    raw high)}``), and where a bound is missing the box around the initial value that
    ``experiments/tuners.py`` gives the black-box tuners too: raw ``init +- log(100)`` for
    ``log`` transforms (values from init / 100 to init * 100), ``[-6, 6]`` (or wider, to hold
    the initial value) for ``logit``, ``init +- 1`` for ``identity``; a side filled so reaches
    at least half that box's width past a bound given on the other side. Each entry takes its
    own bounds where it has them (``Guards(bounds={"lr[0]": ...})``), and the default range of
    the others spans their initial values alone. A schedule's tuned
    ``scales`` are filled around their own initial values (1/100 to 100 of the schedule), never
    by the windows' pair."""
    lo = torch.empty_like(lam0)
    hi = torch.empty_like(lam0)
    for item in hps.items:
        sl = hps.slices[item.name]
        whole = (raw_bounds.raw if hasattr(raw_bounds, "raw") else raw_bounds).get(
            item.name, (None, None))
        own = raw_bounds.entries.get(item.name, {}) if hasattr(raw_bounds, "entries") else {}
        # the hyperparameter's own entries, then a schedule's scales (factors around 1: a box
        # of their own, not the windows' bounds), each filled around its initial values; the
        # hyperparameter's pair on its own entries, then each entry's own in its place
        mid = sl.start + item.base_numel
        for part, pair in ((slice(sl.start, mid), whole), (slice(mid, sl.stop), (None, None))):
            if part.start == part.stop:
                continue
            entries = [(sl.start + i, e) for i, e in own.items()
                       if part.start <= sl.start + i < part.stop]
            # the default range spans the entries bounded by nothing of their own: an entry's
            # start moved onto its own bounds (wd[3] in [0.05, 0.06], the others at 1e-3)
            # widened every other entry's range to 5.0 instead of 0.1
            free = torch.ones(part.stop - part.start, dtype=torch.bool)
            free[[i - part.start for i, _ in entries]] = False
            x = lam0[part][free.to(lam0.device)] if bool(free.any()) else lam0[part]
            if item.transform == "log":
                d_lo, d_hi, width = x.min() - LOG_RANGE, x.max() + LOG_RANGE, 2 * LOG_RANGE
            elif item.transform == "logit":
                d_lo, d_hi, width = (torch.clamp(x.min(), max=-6.0),
                                     torch.clamp(x.max(), min=6.0), 12.0)
            else:
                d_lo, d_hi, width = x.min() - 1.0, x.max() + 1.0, 2.0
            for where, (b_lo, b_hi) in [(part, pair)] + entries:
                # a side filled by default reaches past the bound given on the other side: a
                # logit's [-6, 6] with low=0.999 (raw 6.9) was the box [6.9, 6.9], and the
                # value never moved
                lo[where] = d_lo if b_lo is None else b_lo.to(lo)  # the bounds live on the CPU
                hi[where] = d_hi if b_hi is None else b_hi.to(hi)
                if b_hi is None and b_lo is not None:
                    hi[where] = torch.maximum(hi[where], lo[where] + width / 2)
                if b_lo is None and b_hi is not None:
                    lo[where] = torch.minimum(lo[where], hi[where] - width / 2)
    return lo, hi


LOG_RANGE = math.log(100.0)

