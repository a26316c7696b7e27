"""The outer loop: tune hyperparameters by their hypergradients, offline or online.

The Trainer is a loop that delegates to its parts, each holding its own settings:

- the **problem** (:class:`~hypergrad.InnerProblem`, or a :class:`~hypergrad.Task` that adds how
  to evaluate a trained state);
- the **method** (any :class:`~hypergrad.Method`, or a registered name);
- the **outer** optimizer (a factory ``params -> torch.optim.Optimizer`` over the raw
  hyperparameters; :mod:`hypergrad.run.outer`);
- the **mode**: :class:`~hypergrad.Offline` (a whole inner run per outer step) or
  :class:`~hypergrad.Online` (updates every ``interval`` steps of one run);
- the **guards** (:class:`~hypergrad.Guards`: divergence, backtracking, clipping, bounds, time
  and memory budgets);
- the **folder** (:class:`~hypergrad.RunFolder`: lock, checkpoints, metrics, resume check);
- **callbacks** (:class:`~hypergrad.Callback`: messages, progress, TensorBoard, yours);
- the **strategy** (:class:`~hypergrad.run.strategy.Strategy`: one process, or
  :class:`hypergrad.distributed.Ranks` under torchrun).

The Trainer holds ``lam``, the outer optimizer's state and, online, the method's run state; a
checkpoint is :meth:`Trainer.state_dict`.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

from ..errors import (
    BoundsWarning,
    CheckpointWarning,
    ConfigWarning,
    HypergradWarning,
    ResumeMismatchError,
    TuningWarning,
    ZeroHypergradientWarning,
)
from ..hyperparams import TRANSFORMS
from ..methods.auto import AutoMode
from ..methods.base import HyperGradient, Method, OnlineMethod, create, run_fingerprint
from ..methods.finite_diff import FiniteDifference
from ..methods.memory import check_memory, out_of_memory
from ..problem import InnerProblem, InnerState
from ..task import Task
from .bounds import Bounds
from .callbacks import Callback
from .callbacks import callbacks as with_defaults
from .files import CHECKPOINT, PREVIOUS, digest, json_safe
from .folder import (
    RunFolder,
    check_resume,
    load_outer,
    problem_fingerprint,
    rng_state,
    set_rng_state,
)
from .guards import (
    MAX_BACKTRACKS,
    NONFINITE_GRAD,
    TOO_LARGE,
    Guards,
    Tracker,
    divergence,
    outer_gradient,
    worse,
)
from .modes import Mode, Offline, Online, SearchSettings
from .outer import (
    OuterOptimizerFactory,
    QuasiNewton,
    SearchOptimizer,
    default_outer,
    schedule_smoothing,
    search_box,
    shrink_lr,
)
from .strategy import Strategy
from .surrogate import ROUGH_SHARE, Surrogate

__all__ = ["Trainer", "TrainResult"]

CHECKPOINT_VERSION = 5
"""The checkpoint's format; a checkpoint of a later one is refused on resume, naming both (5
since 2026-12-07: a record's long lists of values are packed into tensors, which a reader of 4
would take for the values)."""

RECORD_FIELDS = ("outer_step", "val_loss", "hypergrad_norm", "seconds", "elapsed",
                 "hyperparams", "inner_step", "backtracked", "info")
"""The fields of an outer step's record (``history``, ``metrics.jsonl``) that the task's
metrics may not overwrite (:meth:`Task.metrics <hypergrad.Task.metrics>`)."""

TWO_ORDERS_VARIANT = 2
"""The other batch order of a hypergradient averaged over two
(:attr:`SearchSettings.two_orders <hypergrad.run.modes.SearchSettings.two_orders>`): not the
re-check's (variant 1), which stays an order the search never saw."""

RECHECK_APART = 0.02
"""Points the re-check compares differ by at least this share of the search box in some
coordinate (the line search's smallest step): neighbours from one line search score alike in
any batch order."""

NOT_TUNED = "so they are not a tuned point"
"""Words of the Trainer's warning that the point returned trains far above the untrained
model's validation loss, by which hypergrad-run heads ``learned.yaml`` with it."""

_BOX_RULE = {"log": "the box spans init / 100 to init * 100",
             "identity": "the box spans init - 1 to init + 1"}
"""How :func:`~hypergrad.run.outer.search_box` fills a side no bound gives, per transform."""


@dataclass(repr=False)
class TrainResult:
    """What :meth:`Trainer.fit` returns.

    ``lam`` / ``values``: the **best** hyperparameters evaluated (lowest validation loss; the
    initial point and, offline, the point after the last update included), raw and
    transformed. Online, the validation loss is measured on a moving inner state, so ``lam`` is
    the last value there, after the last update; ``best_val_loss`` (= ``last_val_loss``) is the
    last record's, the run's final state, trained before that update (``best_step`` counts the
    updates, one past the last record's ``outer_step``). ``best_step``: how many outer updates
    led to ``lam`` (0: where the descent started: the initial hyperparameters, or the best
    point of a space-filling start); a point that outer step k's line search or restarts
    tried counts k + 1 whether or not the step then moved there, so it is in
    ``evaluations`` with that ``outer_step``, and ``history[best_step]`` (where step k + 1
    ran) holds the point the step took, which can be another.
    ``last_lam`` / ``last_values``: where the outer optimizer ended (on a divergence: the
    hyperparameters that diverged), ``last_val_loss`` their validation loss.
    ``state``: the inner state trained at ``last_lam`` (offline: by the final evaluation; online:
    the run's own final state; ``None`` after a divergence). ``out_of_time``: offline tuning
    stopped before ``outer_steps`` because the next outer step would not have finished within
    the guards' ``time_budget``. ``evaluations``: the points evaluated by plain inner runs
    (the space-filling start, the line search; :attr:`Trainer.evaluations`; ``lam`` raw and
    ``hyperparams`` its values, as in ``history``). ``rechecked``:
    offline with ``Offline(recheck=...)``, the best points trained again in another batch
    order before ``lam`` was chosen among them by the worse of its two validation losses
    (``SearchSettings.recheck_pick``; ``"mean"``: their mean)
    (``{"lam", "val_loss", "variant_val_loss", "outer_step", "hyperparams"}`` each: ``lam``
    raw, ``hyperparams`` its values as in ``history``; ``best_val_loss`` stays
    the chosen point's loss in the problem's own order). With the problem's ``select_loss``
    (offline), ``lam`` is the point with the lowest held-out ``select_loss`` (re-checked: the
    lowest worse of it in both orders, ``"select_loss"`` and ``"variant_select_loss"`` in
    ``rechecked``), ``best_select_loss`` its value. ``elapsed``: the run's seconds on the
    guards' clock, over every ``fit()`` call that led to it (a resumed run counts its earlier
    calls up to their last checkpoint), as the records' ``elapsed``. ``method``: the name of
    the method that ran (``method.resolve``'s: the one ``"auto"`` picked); ``diverged`` and
    ``message``: whether and why the run stopped on a divergence (or another guard);
    ``stopped``: the reason given to :meth:`Trainer.stop` where a callback ended the fit
    (``""`` otherwise); ``history``:
    a record per hypergradient (``metrics.jsonl``'s lines); ``problem``: the problem tuned.
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
    problem: InnerProblem | None = field(default=None, repr=False)
    evaluations: list[dict[str, Any]] = field(default_factory=list, repr=False)
    rechecked: list[dict[str, Any]] = field(default_factory=list, repr=False)
    best_select_loss: float | None = None
    elapsed: float = 0.0
    last_step: int | None = None
    """Offline: the outer step whose point ``last_lam`` is (the last record's where the descent
    ended without an update after it, as a line search that found nothing better)."""
    stopped: str = ""

    def __repr__(self) -> str:
        """The outcome in a few lines: long value lists and the records counted, not printed
        (the whole history and the K values of every record made 140 KB at K = 300)."""
        def short(v: Any) -> Any:
            return f"<{len(v)} values>" if isinstance(v, (list, tuple)) and len(v) > 12 else v

        def values(d: Mapping[str, Any] | None) -> Any:
            return None if d is None else {k: short(v) for k, v in d.items()}

        msg = self.message if len(self.message) <= 200 else self.message[:200] + "..."
        return (f"TrainResult(method={self.method!r}, values={values(self.values)}, "
                f"best_step={self.best_step}, best_val_loss={self.best_val_loss}, "
                f"last_values={values(self.last_values)}, last_step={self.last_step}, "
                f"last_val_loss={self.last_val_loss}, history=<{len(self.history)} records>, "
                f"evaluations=<{len(self.evaluations)}>, rechecked=<{len(self.rechecked)}>, "
                f"diverged={self.diverged}, out_of_time={self.out_of_time}, "
                + (f"stopped={self.stopped!r}, " if self.stopped else "")
                + f"elapsed={self.elapsed:.3g}, message={msg!r})")

    def learned_optimizer(self, params: Any, steps: int | None = None) -> tuple[Any, Any]:
        """``(optimizer, scheduler)`` of ``torch.optim`` at the learned hyperparameters
        (:attr:`lam`) for your own ``params`` (the model, or ``{name: tensor}``): per-tensor
        values as parameter groups, a learning-rate schedule as ``LambdaLR`` stretched over
        ``steps`` (default: the horizon it was learned on). See :mod:`hypergrad.export`."""
        from ..export import learned_optimizer

        if self.problem is None:
            raise ValueError("TrainResult.learned_optimizer: this result holds no problem.")
        return learned_optimizer(self.problem, self.lam, params, steps)


def _checked(method: Method, lam: Tensor, got: Any) -> HyperGradient:
    """What a method returned, if it is a :class:`~hypergrad.HyperGradient` whose ``grad`` has
    ``lam``'s shape; a method of one's own that returned another shape, a tuple or ``None``
    failed inside torch or the guards ("attempting to assign a gradient of size...")."""
    fix = (f"{type(method).__name__}.hypergradient must return HyperGradient(objective, grad, "
           f"state) with grad of lam's shape {tuple(lam.shape)} (docs/extending.md)")
    if not isinstance(got, HyperGradient):
        raise TypeError(f"Trainer: method {type(method).__name__} returned "
                        f"{type(got).__name__}; {fix}.")
    g = got.grad
    if not isinstance(g, Tensor) or g.shape != lam.shape or not g.is_floating_point():
        what = (f"grad of shape {tuple(g.shape)} and dtype {g.dtype}"
                if isinstance(g, Tensor) else f"grad={type(g).__name__}")
        raise ValueError(f"Trainer: method {type(method).__name__} returned {what}; {fix}.")
    if not isinstance(got.state, InnerState):
        # state=None was taken: the point then never entered select_loss's choice (a worse
        # one was returned with no word), and a Task's evaluate failed on None.params (the
        # extending probe)
        raise TypeError(f"Trainer: method {type(method).__name__} returned state="
                        f"{type(got.state).__name__}; {fix}, state the InnerState its inner "
                        f"run ended in (problem.run(lam) returns one), which select_loss, "
                        f"evaluate and the records read.")
    return got


def _part(name: str, value: Any, cls: type, example: str) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"Trainer: {name} must be a {cls.__name__} such as {example}, got "
                        f"{type(value).__name__} {value!r}.")


def _check_outer(opt: Any, lam: Tensor, online: bool = False) -> None:
    """Refuse an outer optimizer the loop cannot drive: not an optimizer, one over other
    tensors than ``lam`` (the hyperparameters would never move, and only a warning at the end
    would blame the bounds or the step size), or one whose ``step`` needs a closure
    (``torch.optim.LBFGS``: it re-evaluates the objective several times per step, outside the
    guards; the loop calls ``step()`` once per hypergradient)."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"Trainer: outer(params) must return a torch.optim.Optimizer, got "
                        f"{type(opt).__name__}; e.g. outer=functools.partial(torch.optim.Adam, "
                        f"lr=0.05).")
    if not any(q is lam for g in opt.param_groups for q in g["params"]):
        raise ValueError(f"Trainer: outer(params) returned an optimizer ({type(opt).__name__}) "
                         f"over other tensors than the params it was given (the raw "
                         f"hyperparameters), so they would never move; build it from them: "
                         f"outer=lambda params: {type(opt).__name__}(params, ...).")
    if isinstance(opt, torch.optim.SparseAdam):  # else torch's error inside the first step
        raise ValueError("Trainer: outer=SparseAdam takes sparse gradients only, and a "
                         "hypergradient is dense; use torch.optim.Adam.")
    closure = inspect.signature(type(opt).step).parameters.get("closure")
    if (not isinstance(opt, SearchOptimizer) and closure is not None
            and closure.default is inspect.Parameter.empty):
        raise NotImplementedError(
            f"Trainer: outer={type(opt).__name__} needs a closure that re-evaluates the "
            f"objective within each step, which the Trainer does not give (one hypergradient "
            f"per outer step, checked by the guards). "
            + ("Online (one inner run, no plain runs to search with) use Adam, the default "
               "there (outer=None, or outer=functools.partial(torch.optim.Adam, lr=0.05))."
               if online else
               "For L-BFGS directions with a line search of plain inner runs use the default, "
               "QuasiNewton (outer=None, or "
               "outer=functools.partial(hypergrad.run.QuasiNewton))."))


_OVER = {
    "ended": ("the line search found nothing better and no restart point is near the best",
              "the descent ends here"),
    "rough": ("the surrogate model treats the hypergradients as noise",
              "the time left goes to plain runs at its proposals, not to more hypergradients "
              "(SearchSettings(rough_plain=False) keeps taking them)")}
"""Why an offline descent ended before its steps or budget (``Trainer._over``, checkpointed),
and what follows."""


def _apart(a: Any, b: Any, tol: float) -> bool:
    """Whether two described values (numbers, or lists and dicts of them) differ by more than
    ``tol`` relative."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() != b.keys() or any(_apart(a[k], b[k], tol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) != len(b) or any(_apart(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) > tol * max(abs(a), abs(b))
    return bool(a != b)


def _group_settings(outer: Any) -> list[dict[str, Any]]:
    """The outer optimizer's parameter-group settings (not the parameters), comparable."""
    def plain(v: Any) -> Any:
        return v.tolist() if isinstance(v, Tensor) else v

    return [{k: plain(v) for k, v in g.items() if k != "params"}
            for g in getattr(outer, "param_groups", [])]


def _state_marks(outer: Any) -> list[Any]:
    """What tells an outer optimizer's state changed outside its steps: each entry's tensors by
    identity and in-place version (nothing read from the device), other values by repr."""
    state = getattr(outer, "state", None)
    if not isinstance(state, Mapping):
        return []
    return [(id(k), sorted((str(n), (id(v), v._version) if isinstance(v, Tensor) else repr(v))
                           for n, v in s.items()) if isinstance(s, Mapping) else repr(s))
            for k, s in state.items()]


def _each(callbacks: list[Callback], call: Callable[[Callback], Any]) -> None:
    """``call`` every callback, also after one raised (a record one of them failed on still
    reaches TensorBoard and the others); then the first error is raised."""
    first: BaseException | None = None
    for cb in callbacks:
        try:
            call(cb)
        except Exception as err:  # noqa: BLE001 - raised below, after the others
            first = first or err
    if first is not None:
        raise first


def _qualified(cls: type) -> str:
    """How a user names ``cls``: ``torch.optim.Adam``, ``hypergrad.SignDescent``."""
    mod = cls.__module__
    if mod.startswith("torch.optim"):
        return f"torch.optim.{cls.__name__}"
    if mod.startswith("hypergrad."):
        return f"hypergrad.{cls.__name__}"
    return f"{mod}.{cls.__name__}"


class Trainer:
    """Tune a problem's hyperparameters by gradient descent on the validation objective ``E``.

    Args:
        problem: the :class:`~hypergrad.InnerProblem`, or a :class:`~hypergrad.Task` (its
            ``evaluate`` is logged after every outer step).
        method: any :class:`~hypergrad.Method`, or a registered name (``"forward"``,
            ``"reverse"``, ``"auto"``, ``"hd"``, ``"marthe"``, ``"implicit"``,
            ``"finite_difference"``, yours) or import path; default ``"auto"`` (forward mode
            for one hyperparameter or online, else reverse mode where its states fit: about 5
            plain runs per hypergradient whatever K). The method that runs is
            ``method.resolve(problem, mode, memory_budget)``: itself, or the one
            :class:`~hypergrad.AutoMode` picks (the reason is logged). A method given (not
            picked) is checked against the memory budget before anything is allocated.
        outer: the outer optimizer, a factory ``params -> torch.optim.Optimizer`` over the raw
            hyperparameters, e.g. ``functools.partial(torch.optim.Adam, lr=0.05)`` or
            ``functools.partial(SignDescent, lr=0.5)``; default offline
            (:func:`~hypergrad.run.outer.default_outer`), in the search box: for 16 <= K <= 100
            :class:`~hypergrad.run.surrogate.Surrogate` (a model of the validation loss from
            the plain runs and the hypergradients), else
            :class:`~hypergrad.run.outer.QuasiNewton` (L-BFGS directions from the
            hypergradients, a line search of plain runs along each); online Adam with lr
            0.05 (one run has no plain runs to search with).
        mode: :class:`~hypergrad.Offline` or :class:`~hypergrad.Online` (needs an
            :class:`~hypergrad.OnlineMethod`); default :meth:`Offline.default()
            <hypergrad.Offline.default>`: a space-filling start, then outer steps until the
            time budget (10 without one).
        guards: :class:`~hypergrad.Guards` (divergence, backtracking, clipping, bounds, time
            and memory budgets); default ``Guards()``.
        folder: a :class:`~hypergrad.RunFolder` or a path (``RunFolder(path)``): where
            ``metrics.jsonl`` and ``checkpoint.pt`` go; ``None``: nothing written.
        callbacks: :class:`~hypergrad.Callback` objects, added to the defaults (``Log()``,
            ``Progress()``); one of a default's type replaces it (``Log(None)``: silent).
        strategy: how the run uses processes (default: one;
            ``hypergrad.distributed.Ranks()`` under torchrun).

    Example:
        >>> trainer = Trainer(problem, "forward", mode=Offline(outer_steps=20),
        ...                   guards=Guards(bounds={"lr": (1e-4, 1.0)}),
        ...                   folder="runs/lr")                   # doctest: +SKIP
        >>> result = trainer.fit()                                 # doctest: +SKIP
        >>> result.values["lr"]                                    # doctest: +SKIP
    """

    def __init__(self, problem: InnerProblem | Task, method: Method | str = "auto",
                 outer: OuterOptimizerFactory | None = None, mode: Mode | None = None,
                 guards: Guards | None = None, folder: RunFolder | str | Path | None = None,
                 callbacks: Sequence[Callback] | None = None,
                 strategy: Strategy | None = None) -> None:
        task = problem if isinstance(problem, Task) else None
        if task is None:
            _part("problem", problem, InnerProblem, "InnerProblem(...) or Task(problem)")
            task = Task(problem)  # type: ignore[arg-type]
        self.task, self.problem = task, task.problem
        self.mode = Offline.default() if mode is None else mode
        _part("mode", self.mode, Mode, "Offline(outer_steps=10) or Online(interval=10)")
        self.guards = Guards() if guards is None else guards
        _part("guards", self.guards, Guards, "Guards(backtrack=1.5)")
        self.strategy = Strategy() if strategy is None else strategy
        _part("strategy", self.strategy, Strategy, "hypergrad.distributed.Ranks()")
        self.callbacks = with_defaults(callbacks) if self.strategy.is_writer else []
        # what a callback's on_message may read from here on (the method's choice is said
        # while the Trainer is built: a hook reading outer_step raised AttributeError)
        self.history: list[dict[str, Any]] = []
        self.outer_step = 0
        if folder is not None and not isinstance(folder, RunFolder):
            folder = RunFolder(folder)
        self.folder = folder
        self.mode.check(self.problem)
        if self.mode.online and (self.guards.time_budget is not None
                                 or self.guards.backtrack is not None):
            given = ", ".join(f"{k}={v!r}" for k, v in (("time_budget", self.guards.time_budget),
                                                         ("backtrack", self.guards.backtrack))
                              if v is not None)
            raise NotImplementedError(
                f"Trainer: Guards(time_budget=..., backtrack=...) are for offline tuning (whole "
                f"inner runs per outer step); online tuning is one run of `steps` inner steps. "
                f"Given: {given}; leave it unset online (hypergrad-run: guards.time_budget=null, "
                f"guards.backtrack=null).")
        p = self.problem
        self.search = (self.mode.search if isinstance(self.mode, Offline)
                       else SearchSettings())
        """The default search's settings (``Offline(search=...)``)."""
        self.lam = p.init_raw().requires_grad_(False)
        p.check(self.lam)  # losses, shapes and bindings, before anything costly
        self.method = self.strategy.setup(self._resolve(create(method)))
        every = None if folder is None else folder.inner_every
        if every is not None and (self.mode.online or not isinstance(self.method, OnlineMethod)):
            # a long hypergradient killed mid-run would be lost whole, where the user asked
            # for checkpoints within it
            warnings.warn(CheckpointWarning(
                f"Trainer: RunFolder(inner_every={every}) checkpoints within an inner run only "
                f"offline and for a method the Trainer steps (forward mode, MARTHE, HD); "
                f"{self.method!r}"
                f"{' online' if self.mode.online else ' takes its hypergradient in one call'}, "
                f"so checkpoints come after each "
                f"{'update' if self.mode.online else 'outer step'} only. For checkpoints "
                f"within the inner run use method='forward' offline (hypergrad-run: "
                f"method=forward), or drop inner_every."), stacklevel=2)
        if not isinstance(self.method, OnlineMethod):
            # a user's per-step callback (a logger, a kill switch) did nothing without a word
            # under reverse mode (the checkpoint probe, 2026-12-08)
            own = [type(cb).__name__ for cb in self.callbacks
                   if type(cb).on_inner_step is not Callback.on_inner_step
                   and not type(cb).__module__.startswith("hypergrad.")]
            if own:
                warnings.warn(HypergradWarning(
                    f"Trainer: {', '.join(own)} define(s) on_inner_step, which {self.method!r} "
                    f"never calls: it takes each hypergradient in one call. Forward mode, "
                    f"MARTHE and HD call it after every inner step (method='forward'); or "
                    f"act in on_outer_step instead."), stacklevel=2)
        self.bounds = Bounds(p.hyperparams, p.dtype, self.guards.bounds, horizon=p.steps)
        self._start_in_bounds()
        self.box = search_box(p.hyperparams, self.bounds, self.lam)
        self._own_box = search_box(p.hyperparams, {}, self.lam)  # with no bound given
        """The search box in raw coordinates ``(low, high)``: the bounds, and where a bound is
        missing a box around the initial value (:func:`~hypergrad.run.outer.search_box`),
        inside the domains of the inner optimizer's arguments (:attr:`domain`)."""
        self.domain = self._domain_bounds()
        """Where a hyperparameter read by an inner-optimizer argument with a domain (a
        momentum in [0, 1), an eps > 0) could leave it through its transform (identity, or
        log for a domain below 1): :class:`~hypergrad.run.bounds.Bounds` at the domain's
        edges, which every point tried is held inside (an identity momentum tuned to 1.2 was
        returned as the best point); ``None`` where none can."""
        if self.domain is not None:
            domains = p.hyperparameter_domains()
            for name, (lo, hi) in self.domain.raw.items():
                ends = self.bounds.raw.get(name, (None, None))
                if ((lo is not None and ends[0] is not None and bool(ends[0] < lo))
                        or (hi is not None and ends[1] is not None and bool(ends[1] > hi))):
                    # said only later, when a step reached the edge (the bounds probe)
                    warnings.warn(BoundsWarning(
                        f"Trainer: Guards(bounds={{{name!r}: {self.bounds.of(name)[name]}}}) "
                        f"reaches outside the domain of {domains[name][4]}: points there are "
                        f"held at the domain's edge. Give bounds inside it."), stacklevel=2)
                sl = p.hyperparams.slices[name]
                part = slice(sl.start, sl.start + p.hyperparams.by_name[name].base_numel)
                with torch.no_grad():
                    if lo is not None:
                        self.box[0][part] = self.box[0][part].clamp(min=lo.to(self.box[0]))
                    if hi is not None:
                        self.box[1][part] = self.box[1][part].clamp(max=hi.to(self.box[1]))
        if bool(torch.equal(self.box[0], self.box[1])):
            # the default search spent a whole budget at that one point, restarting "at a
            # quasi-random point" 12 times (the bounds probe)
            raise ValueError(
                "Trainer: Guards(bounds=...) holds every hyperparameter at one value (low == "
                "high): there is nothing to tune. Evaluate that point with problem.run(lam) "
                "(hypergrad-run: mode.outer_steps=0), or widen a bound.")
        self._left_domain: set[str] = set()
        if isinstance(outer, torch.optim.Optimizer):
            raise TypeError(f"Trainer: outer must be a factory params -> optimizer (the Trainer "
                            f"makes the optimizer over its raw hyperparameters), got the "
                            f"optimizer {type(outer).__name__}(...) itself; pass e.g. "
                            f"outer=functools.partial({_qualified(type(outer))}, lr=0.05).")
        if outer is not None and not callable(outer):  # outer="adam": 'str' not callable
            raise TypeError(f"Trainer: outer={outer!r} must be a factory params -> optimizer, "
                            f"e.g. outer=functools.partial(torch.optim.Adam, lr=0.05), "
                            f"hypergrad.SignDescent, or None (the default search).")
        if outer is None:
            self.outer = default_outer([self.lam], self.box, online=self.mode.online)
        else:
            try:
                self.outer = outer([self.lam])
            except ValueError as err:  # torch.optim's "Invalid learning rate: -0.1", naming
                # neither the Trainer's argument nor the fix
                given = ("" if type(outer).__name__.startswith("_")  # Hydra's deferred call
                         else f"outer={outer!r}; ")
                raise ValueError(f"Trainer: the outer optimizer refused its settings: {err} "
                                 f"({given}hypergrad-run: outer_optimizer.*). Give it the "
                                 f"values the refusal asks for.") from err
            except (TypeError, AttributeError) as err:  # Adam.step given, a misspelt argument
                raise TypeError(f"Trainer: outer={outer!r} failed when called with the "
                                f"parameters [lam] ({type(err).__name__}: {err}); it must be a "
                                f"factory params -> optimizer, e.g. outer=functools.partial("
                                f"torch.optim.Adam, lr=0.05).") from err
        _check_outer(self.outer, self.lam, self.mode.online)
        if self.mode.online and isinstance(self.outer, SearchOptimizer):
            # it searches with plain inner runs, of which one online run has none: a Surrogate
            # never moved the hyperparameters (its warning blamed the bounds), and QuasiNewton's
            # plain steps of a share of the box, its curvature from hypergradients of other
            # inner states, jumped to the box's edge and returned that untrained point
            raise ValueError(
                f"Trainer: outer optimizer {type(self.outer).__name__} searches with plain "
                f"inner runs, which online tuning (one run) does not have: it would not tune "
                f"(a Surrogate never moves; QuasiNewton takes steps of a share of the search box "
                f"on curvature from other inner states). Online, give one that steps on the "
                f"hypergradient alone: outer=None (the default, Adam with lr 0.05), "
                f"functools.partial(torch.optim.Adam, lr=...) or hypergrad.SignDescent "
                f"(hypergrad-run: outer_optimizer=adam or sign), or tune offline "
                f"(mode=Offline(); hypergrad-run: mode=offline).")
        self._outer_given = [{k: v for k, v in g.items() if k != "params"}
                             for g in self.outer.param_groups]
        """The outer optimizer's settings as built (a resume compares its own with them)."""
        if isinstance(self.outer, SearchOptimizer):  # what the default or a user's leaves out
            if self.outer.box is None:  # outer=functools.partial(QuasiNewton, step=0.3): the box
                self.outer.box = self.box
            if isinstance(self.outer, QuasiNewton) and self.outer.precondition is None:
                self.outer.precondition = schedule_smoothing(p.hyperparams.items,
                                                             self.search.smooth_schedule)
            if isinstance(self.outer, Surrogate) and self.outer.seed is None:
                self.outer.seed_with(p.seed)  # every training seed draws its own candidates
        self.evaluations: list[dict[str, Any]] = []
        """Every point evaluated by a plain inner run (space-filling start, line search,
        restart): ``{"elapsed", "val_loss", "lam", "kind", "outer_step", "hyperparams"}`` (the
        outer step
        during which it ran: a line search's points are those of the next one, the result's
        ``best_step``); the points with a hypergradient are in ``history``."""
        self.selections: list[dict[str, Any]] = []
        """Offline with the problem's ``select_loss``: every finite evaluation (hypergradient,
        plain run, final evaluation) as ``{"lam", "val_loss", "select_loss", "outer_step"}``;
        the point returned is chosen by ``select_loss`` among them."""
        self._over: str | None = None  # why the descent ended (_OVER), else None
        self._stop_asked: str | None = None  # Trainer.stop's reason within this fit()
        self._good: dict[str, Any] | None = None  # where an interrupted fit() goes back to
        self._good_run: Any = None  # and, online, its run state
        self.result: TrainResult | None = None
        """The last finished ``fit()``'s :class:`~hypergrad.TrainResult` (also kept when a
        callback's ``on_fit_end`` raised after the fit had finished)."""
        self._plain_seconds: float | None = None
        self._plain_recent: list[float] = []  # the seconds of this fit's plain runs
        self._rechecks = 0  # points to re-check before returning one (set by fit())
        self._starts_used = 0  # quasi-random points used by the start and restarts
        self._searched: list[Tensor] = []  # the points line searches started from
        self._recoveries = 0  # outer steps in a row whose point gave no usable hypergradient
        self._budget_cut = False  # the time budget stopped the outer steps (not a stall)
        self._first_point: tuple[float, Tensor, int] | None = None  # the first hypergradient's
        self._ahead = 0  # 1 while an outer step's update runs: its plain runs' points follow it
        self.initial_lam = self.lam.detach().clone()
        """The raw hyperparameters tuning starts from (the problem's, moved into the bounds)."""
        self.tracker = Tracker(p.hyperparams, self.lam)
        if isinstance(self.method, FiniteDifference) and p.dtype != torch.float64:
            self.tracker.zero_hint = (
                f" Here finite differences of a {str(p.dtype).replace('torch.', '')} problem "
                f"may be the cause: a difference of the validation loss below its rounding "
                f"comes out 0 (a weight decay of 1e-4 in float32). Take them in float64 "
                f"(model.double() and the data), with a larger eps, or use forward or reverse "
                f"mode (method='auto').")
        self.run_state: Any = None  # online: the method's run state
        self._inner: tuple[dict[str, Any], str] | None = None  # resumed within an inner run
        self._pass_start: dict[str, Any] | None = None  # the stream before the outer step's pass
        self._backtracks = 0  # in a row
        self._undone: Tensor | None = None  # a last update undone at the final evaluation
        self._compile_said = False
        self._rough_said = False
        self._fit_start = self._now()
        self._elapsed_before = 0.0  # the run's seconds before this fit() call (its records)
        self._elapsed_done = 0.0  # the run's seconds at the end of this Trainer's last fit()
        self._elapsed_resumed = 0.0  # at the end of the last fit() of the run resumed
        self._fingerprint: dict[str, Any] = {}
        self.strategy.check_same_run(self._run_settings())
        if self.folder is not None:
            self._open_folder(self.folder)

    def _now(self) -> float:
        """Seconds on the guards' clock: ``time.perf_counter`` (``Guards(clock="wall")``) or
        ``time.process_time`` (``"cpu"``); across ranks, rank 0's (:meth:`Strategy.now
        <hypergrad.run.strategy.Strategy.now>`: every rank decides the budget alike)."""
        return self.strategy.now(
            time.process_time() if self.guards.clock_name == "cpu" else time.perf_counter())

    @contextlib.contextmanager
    def _next_step_points(self) -> Iterator[None]:
        """Inside, the plain runs of an outer step's update (its line search, a restart) count
        as the next outer step's points: after ``k + 1`` updates (``best_step``)."""
        self._ahead = 1
        try:
            yield
        finally:
            self._ahead = 0

    def _elapsed(self) -> float:
        """Seconds of this run on the guards' clock: those of the earlier fit() calls up to
        their last record (a resumed run's records go on from the checkpoint's) and this
        call's."""
        return self._elapsed_before + self._now() - self._fit_start

    # -- set-up ----------------------------------------------------------------------------------
    def _resolve(self, method: Method) -> Method:
        chosen, why = method.resolve(self.problem, self.mode.name, self.guards.memory_budget)
        if why:
            self.message(f"method={method.name} {why}")
        if self.mode.online and not isinstance(chosen, OnlineMethod):
            raise NotImplementedError(
                f"Trainer: online tuning needs hypergradients during training, from an "
                f"OnlineMethod (ForwardMode, MARTHE or HD); {type(chosen).__name__} gives one "
                f"only after a whole run. Use method='forward', 'marthe' or 'hd', or "
                f"mode=Offline() (hypergrad-run: method=forward, marthe or hd, or "
                f"mode=offline).")
        chosen.check(self.problem)
        if self.mode.online and self.problem.select_loss is not None:
            # best_select_loss came back None without a word (the reports probe)
            warnings.warn(ConfigWarning(
                "Trainer: the problem's select_loss is not used online: the one run's "
                "hyperparameters are returned where they ended, with no points to choose "
                "among. Tune offline (mode=Offline()) to have the returned point chosen by "
                "select_loss, or build the problem without it."), stacklevel=4)
        if not isinstance(method, AutoMode):  # AutoMode's pick was picked to fit
            est = check_memory(self.problem, chosen, self.mode.name,
                               self.guards.memory_budget, "Trainer")
            if self.guards.memory_budget is not None and est is None:
                # the budget given was dropped without a word (the extending probe)
                warnings.warn(ConfigWarning(
                    f"Trainer: Guards(memory_budget={self.guards.memory_budget:g}) is not "
                    f"checked: {repr(chosen)} has no memory estimate (its estimate_memory "
                    f"returns None; a method of one's own may give one, docs/extending.md)."),
                    stacklevel=4)
        return chosen

    def _start_in_bounds(self) -> None:
        """Move initial values outside the guards' bounds onto them, and say where to."""
        hps = self.problem.hyperparams
        before = hps.describe(self.lam)
        self.bounds.project(self.lam)
        after = hps.describe(self.lam)
        def bounds_of(n: str) -> Any:  # the pair, or the keys of entries bounded apart
            given = self.bounds.of(n)
            return given[n] if list(given) == [n] else given

        # a value on a bound up to rounding (0.010000000000000004 against a bound of 0.01, the
        # raw end moved inside by a rounding step) is no move to tell of
        tol = 16 * float(torch.finfo(self.lam.dtype).eps)
        names = [n for n in hps.names if _apart(before[n], after[n], tol)]
        moved = [f"{n}={before[n]} -> {after[n]} (bounds {bounds_of(n)})" for n in names]
        if moved:
            said = BoundsWarning(
                f"Trainer: initial values outside Guards(bounds=...) were moved onto the "
                f"bounds: {'; '.join(moved)}. Tuning starts there (hypergrad-run retrains that "
                f"point as 'initial'); give an initial value inside the bounds to silence "
                f"this.")
            # the values and their bounds alone, for hypergrad-run's refusal in a sweep (where
            # nothing is moved: its message said "were moved", then "refused instead")
            def short(v: Any) -> Any:  # float32's 100.00000762939453 as 100
                return ([short(x) for x in v] if isinstance(v, list) else
                        float(f"{v:.7g}") if isinstance(v, float) else v)

            said.outside = [  # type: ignore[attr-defined]
                f"{n}={short(before[n])} (bounds {bounds_of(n)})" for n in names]
            warnings.warn(said, stacklevel=3)

    def settings(self) -> dict[str, Any]:
        """The settings of the parts that define a run (in its fingerprint): the mode's, the
        guards', the bounds, the outer optimizer's class and the method's own."""
        return {**{f"trainer.{k}": v for k, v in self.mode.settings().items()},
                **{f"trainer.{k}": v for k, v in self.guards.settings().items()},
                "trainer.bounds": self.bounds.values(),
                "trainer.outer_optimizer": type(self.outer).__name__,
                **run_fingerprint(self.method)}

    def _run_settings(self) -> dict[str, Any]:
        """:meth:`settings` and what else every process of a run must share: the outer
        optimizer's settings, the step count and the guards' stopping rules (also those a
        resume may change: a rank given 3 outer steps beside rank 0's 4 aborted in a
        collective, one given 5 after rank 0 had written a finished run), and the run
        folder."""
        more = getattr(self.outer, "resume_settings", None)
        outer = more() if callable(more) else {}
        g = self.guards
        return {**self.settings(), "trainer.outer_given": self._outer_given,
                "trainer.mode.outer_steps": getattr(self.mode, "outer_steps", None),
                "trainer.guards.divergence_factor": g.divergence_factor,
                "trainer.guards.time_budget": g.time_budget,
                "trainer.guards.clock": g.clock_name,
                **{f"trainer.outer.{k}": digest(v) if isinstance(v, Tensor) else v
                   for k, v in outer.items()},
                "trainer.folder": None if self.folder is None else str(self.folder.path)}

    def _run_fingerprint(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What defines this run (:func:`problem_fingerprint`), made once: at the folder's
        opening (``extra``: its own keys), else when a state is first taken or loaded (a
        Trainer without a folder compared nothing, and took another problem's state)."""
        if not self._fingerprint or extra is not None:
            if not isinstance(self.task.fingerprint, Mapping):
                raise TypeError(f"Task: fingerprint must be a dict {{key: value}}, got "
                                f"{type(self.task.fingerprint).__name__}.")
            given = dict(extra or {})
            both = sorted(k for k in self.task.fingerprint if k in given
                          and json_safe(self.task.fingerprint[k]) != json_safe(given[k]))
            if both:  # the folder's value was dropped, and a resume that changed it went on
                raise ValueError(
                    f"Trainer: fingerprint key {both[0]!r} is given by the Task "
                    f"({self.task.fingerprint[both[0]]!r}) and by the RunFolder "
                    f"({given[both[0]]!r}) with other values; name one of them otherwise.")
            self._fingerprint = problem_fingerprint(
                self.problem, self.settings(), {**(extra or {}), **self.task.fingerprint,
                                                **self.strategy.fingerprint(self.method)})
        return self._fingerprint

    def _open_folder(self, folder: RunFolder) -> None:
        p = self.problem
        self._run_fingerprint(folder.extra)
        # open() gives the lock back when it refuses (a folder that another Trainer holds
        # included: closing it here released that Trainer's lock)
        got = folder.open(p.device, self.message) if self.strategy.is_writer else None
        try:
            got = self.strategy.follow(folder.path, got is not None, p.device) or got
            if got is not None:
                self.load_state_dict(*got)
        except BaseException:
            self.close()
            raise

    # -- messages and callbacks ------------------------------------------------------------------
    def message(self, text: str) -> None:
        """Send a message to the callbacks (:class:`~hypergrad.run.callbacks.Log` prints it);
        every callback gets it, also after one raised (then the first error is raised)."""
        self._emit("on_message", text)

    def _emit(self, event: str, *args: Any) -> None:
        """``event`` to every callback, watched as :meth:`_watched` says in the callbacks of
        one's own that override it (``on_outer_step``: :meth:`_emit_record`). A change of
        ``lam``'s values through ``.data`` (which no version counter sees) is caught where
        the values are compared: always, but in the inner steps on a device other than the
        CPU, whose check reads no tensor back (no sync per step). Unwatched, ``on_fit_start``'s
        and ``on_inner_step``'s ``.data`` edits ran to the end with other learning rates
        than the straight run's, and ``on_fit_end``'s steered the next fit() where a resume
        would not go (the callbacks probe, 2026-12-08)."""
        if event not in ("on_fit_start", "on_inner_step", "on_message", "on_fit_end") or (
                not hasattr(self, "lam")):  # a message while the Trainer is built
            _each(self.callbacks, lambda cb: getattr(cb, event)(self, *args))
            return
        base = getattr(Callback, event)
        values = event != "on_inner_step" or self.lam.device.type == "cpu"

        def call(cb: Callback) -> None:
            hook = getattr(type(cb), event, base)
            if hook is base or type(cb).__module__.startswith("hypergrad."):
                getattr(cb, event)(self, *args)
            else:
                self._watched(cb, event, lambda: getattr(cb, event)(self, *args),
                              values=values)

        _each(self.callbacks, call)

    def _watched(self, cb: Callback, event: str, call: Callable[[], Any],
                 values: bool = True) -> None:
        """``call`` (a callback's hook), refused where it changed what the run steps with:
        ``trainer.lam`` (in place, or rebound to another tensor, which the outer optimizer
        never sees: tuning froze without a word), the outer optimizer's settings or state,
        and the problem's horizon. Each outer step's checkpoint is written before the
        callbacks, so a resume went on without the change and ended elsewhere than the
        straight run; a rebound ``lam`` or a cleared outer state went unnoticed (the callbacks
        probe, 2026-12-07). ``values``: compare ``lam``'s values (one read from the device),
        else its in-place version counter (the copy that restores it is made either way: no
        read)."""
        lam_obj = self.lam
        lam = lam_obj.detach().clone()
        version = lam_obj._version
        outer = getattr(self, "outer", None)
        groups = _group_settings(outer)
        state = _state_marks(outer)
        steps = self.problem.steps
        call()
        who = f"Trainer: callback {type(cb).__name__}.{event}"
        moved = (self.lam is not lam_obj or (not torch.equal(lam_obj, lam) if values
                                             else lam_obj._version != version))
        if moved:
            how = "rebound trainer.lam to another tensor" if self.lam is not lam_obj else \
                "changed trainer.lam"
            self.lam = lam_obj
            with torch.no_grad():
                self.lam.copy_(lam)
            raise RuntimeError(
                f"{who} {how} (restored): callbacks observe the run, and the checkpoints are "
                f"written before them (none holds a callback's change), so a resume would go "
                f"on from the point "
                f"before the change (a rebound tensor is not the one the outer optimizer "
                f"steps: tuning would stop moving). Set hyperparameters before fit() (a new "
                f"Trainer, or Guards(bounds=...) to keep them in a range).")
        if self.problem.steps != steps:
            now_steps, self.problem.steps = self.problem.steps, steps
            raise RuntimeError(
                f"{who} changed the problem's steps {steps} -> {now_steps} (restored): the "
                f"records and the run folder's fingerprint are of one horizon. Build a new "
                f"problem and Trainer for another.")
        now = _group_settings(outer)
        # the settings it had (a key added, a scheduler's initial_lr, is no change of them)
        changed = next((f"{k} {a[k]!r} -> {b.get(k)!r}" for a, b in zip(groups, now)
                        for k in a if a[k] != b.get(k)), None)
        if changed is not None:
            # an outer learning-rate scheduler stepped here: a resume went on at the
            # checkpoint's lr (0.1 where the straight run had 0.05; the bounds probe)
            for g, kept in zip(getattr(outer, "param_groups", []), groups):
                g.update(copy.deepcopy(kept))
            raise RuntimeError(
                f"{who} changed the outer optimizer's {changed} (restored): the checkpoints are "
                f"written before the callbacks (none holds a callback's change), so a resume "
                f"would go on with "
                f"the setting before the change (an outer learning-rate scheduler stepped in "
                f"a callback). The Trainer has no outer schedule: its default search sets its "
                f"own steps, and Guards(backtrack=...) halves an outer learning rate after a "
                f"worse step.")
        if _state_marks(outer) != state:
            raise RuntimeError(
                f"{who} changed the outer optimizer's state (its moments or step counts): "
                f"the checkpoints are written before the callbacks (none holds a callback's "
                f"change), so a resume "
                f"would go on with the state before the change. Callbacks observe the run; "
                f"restart with a new Trainer for another outer state.")

    def _emit_record(self, rec: dict[str, Any]) -> None:
        """``on_outer_step`` with a copy of the record for each callback: one that edits what it
        is given (rounds it for its log, pops a key) changes neither the history, the result and
        the checkpoints nor what the next callback sees. One that changes what the run steps
        with is refused (:meth:`_watched`)."""
        _each(self.callbacks, lambda cb: self._watched(
            cb, "on_outer_step", lambda: cb.on_outer_step(self, copy.deepcopy(rec))))

    def _note_interrupt(self, err: BaseException) -> None:
        """Where an interrupted run's folder stands, as a note of the ``KeyboardInterrupt``."""
        if isinstance(err, KeyboardInterrupt) and self.folder is not None:
            where = self.folder.path
            err.add_note(
                f"Trainer: interrupted with {self.outer_step} outer steps done; "
                + (f"the run folder {where} keeps the last checkpoint and its records: "
                   f"continue with folder=hypergrad.RunFolder({str(where)!r}, resume=True)"
                   if (where / CHECKPOINT).exists() or (where / PREVIOUS).exists() else
                   f"the run folder {where} holds no checkpoint yet (nothing to resume)"))

    @property
    def inner_step(self) -> int:
        """Online: the index of the next inner step of the run (0 before it starts)."""
        return 0 if self.run_state is None else int(self.run_state.step)

    # -- the loops -------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Run to the end (or resume to the end); returns the best and the last hyperparameters
        (:class:`TrainResult`)."""
        try:  # an error here (a check, a callback's on_message) kept the folder locked
            self.problem.check(self.lam)
            self._rechecks = (self.mode.recheck_points(self.problem)
                              if isinstance(self.mode, Offline) else 0)
            if self._two_orders() and not self.history:
                self.message(f"each hypergradient is the mean of two batch orders' (K = "
                             f"{self.problem.num_hyperparams} <= search.two_orders = "
                             f"{self.search.two_orders}; one order: "
                             f"Offline.default(search={{'two_orders': 0}}))")
        except BaseException as err:
            self.close()
            self._note_interrupt(err)
            raise
        self._fit_start = self._now()
        self._undone = None  # this call's (a second fit() is told of its own last update)
        self._stop_asked = None
        # the records' elapsed go on from the run's last record (a resume, a second fit()):
        # the time budget is per call, the records' clock is the run's
        # (on a second fit() of this Trainer, from the first call's end: its final evaluation
        # and re-checks come after its last record)
        inner = [] if self._inner is None else [float(self._inner[0].get("elapsed", 0.0))]
        self._elapsed_before = max([self._elapsed_done, self._elapsed_resumed, *inner,
                                    *(float(r.get("elapsed", 0.0))
                                                                  for r in (*self.history,
                                                                            *self.evaluations))])
        self._plain_recent = []
        if self.folder is not None and self.strategy.is_writer:
            self.folder.reacquire()
        try:
            self._emit("on_fit_start")
            self._good = None
            self._mark_good()
            try:
                res = self._fit_online() if self.mode.online else self._fit_offline()
            except (MemoryError, RuntimeError) as err:  # torch.OutOfMemoryError is one
                oom = out_of_memory(self.problem, self.method, self.mode.name,
                                    self.guards.memory_budget, err,
                                    f"at outer step {self.outer_step}",
                                    folder=self.folder is not None)
                if oom is None:
                    raise
                raise oom from None  # not the allocator's raw error; the records stay
        except BaseException as err:
            self._go_back(err)
            self.close()
            self._note_interrupt(err)
            # the callbacks still close what they opened; one that fails doing so does not
            # hide the error that stopped the run
            for cb in self.callbacks:
                try:
                    cb.on_fit_end(self, None)
                except Exception as late:  # noqa: BLE001 - kept as a note of the first
                    err.add_note(f"then {type(cb).__name__}.on_fit_end raised "
                                 f"{type(late).__name__}: {late}")
            raise
        res.elapsed = self._elapsed_done = self._elapsed()
        if self.folder is not None and self.strategy.is_writer and self.history:
            # the final evaluation and re-checks came after the last record: a resume counted
            # from that record, and the run's elapsed went down (0.1085 s, then 0.1052 s)
            self.folder.note_elapsed(self.problem.device, res.elapsed)
        self.close()
        res.problem = self.problem
        res.evaluations = list(self.evaluations)
        self.tracker.warn_at_end(res.last_lam if self._undone is None else self._undone,
                                 res.diverged, not self.mode.online,
                                 self.history, res.best_step, res.best_val_loss,
                                 res.last_val_loss, searched=bool(self.evaluations),
                                 still=("the outer optimizer's learning rate is 0" if all(
                                     g.get("lr", None) == 0 for g in self.outer.param_groups)
                                     else ""))
        self._warn_budget(res)
        self._warn_untrained(res)
        self.result = res
        try:
            self._emit("on_fit_end", res)
        except Exception as err:
            err.add_note("Trainer: the fit had finished before this callback raised; its "
                         "TrainResult is trainer.result")
            raise
        return res

    def _go_back(self, err: BaseException) -> None:
        """After ``err`` stopped an offline fit within an outer step: the Trainer back at that
        step's start (:meth:`_mark_good`), so that ``fit()`` again goes on as the run not
        stopped would. It was left within a line search: the next hypergradient was taken at
        a trial point, the quasi-Newton memory half updated, the start cut short."""
        good, self._good = self._good, None
        if good is None:
            return
        try:
            self.outer.load_state_dict(copy.deepcopy(good["outer"]))
            self._restore(good)
            self.run_state = self._good_run
        except Exception as late:  # noqa: BLE001 - kept as a note of the error that stopped it
            err.add_note(f"Trainer: going back to the start of outer step "
                         f"{good['outer_step']} failed ({type(late).__name__}: {late}); build "
                         f"a new Trainer")
            return
        where = (f"at inner step {0 if self.run_state is None else int(self.run_state.step)}, "
                 f"after its last update" if self.mode.online
                 else f"at the start of outer step {self.outer_step}")
        err.add_note(f"Trainer: back {where}, as the run left it: fit() again goes on from "
                     f"there")

    def _warn_untrained(self, res: TrainResult) -> None:
        """Warn when the point returned trains to a validation loss far above the untrained
        model's (its initial weights, at that point): the inner training diverges there, and
        the outer loop only compared diverged runs with each other (a ridge problem at inner
        lr=5 returned a "best" validation loss of 2.6e44 without a word: the divergence guard
        measures against the best point seen, and every point was diverged)."""
        best = res.best_val_loss
        if best is None or not math.isfinite(best):
            return
        far = self._far_above_untrained(best, res.lam)
        if far is None:
            return
        # online: the run's own training (along its updates) ended there; it was not warned
        # (lr 2000: validation losses 963-1327 against the untrained 2.3, learned.yaml lr 1803)
        what = ("the online run's training (with the hyperparameters returned) ends at"
                if self.mode.online else "the hyperparameters returned train to")
        warnings.warn(TuningWarning(
            f"Trainer: the inner training diverges: {what} "
            f"{far}, {NOT_TUNED}. Make the inner training stable first: a "
            f"smaller learning rate "
            f"(its initial value, or the upper bound in Guards(bounds=...) if it is tuned), or "
            f"gradient clipping (the inner optimizer's clip_grad_norm=1.0)."), stacklevel=3)

    def _far_above_untrained(self, value: float, lam: Tensor) -> str | None:
        """Where ``value``, the validation loss trained at ``lam``, is far above the untrained
        model's (its initial weights at ``lam``; ``divergence_factor`` times, 10 without one):
        what it is, in words; else ``None``."""
        p = self.problem
        with torch.no_grad():
            s0 = p.initial_state(lam)
            untrained = float(p.objective(s0.params, s0.buffers, lam))
        factor = self.guards.divergence_factor or 10.0
        # guards._above's margin, floored: an untrained loss of exactly 0 gives no scale
        if not math.isfinite(untrained) or value <= untrained + (factor - 1) * max(
                abs(untrained), 1e-8):
            return None
        return (f"a validation loss of {value:.4g}, above {factor:g} times the "
                f"untrained model's {untrained:.4g} (its initial weights at the same "
                f"hyperparameters)")

    def _warn_budget(self, res: TrainResult) -> None:
        """Warn when the time budget stopped the outer steps before they could tune: at most
        one hypergradient, and the initial hyperparameters returned (else only
        ``TrainResult.out_of_time`` said so; a descent that ended itself does not warn)."""
        budget = self.guards.time_budget
        if (budget is None or not self._budget_cut or res.diverged or len(self.history) > 1
                or not torch.equal(res.lam, self.initial_lam)):
            return
        warnings.warn(TuningWarning(
            f"Trainer: time_budget={budget:g} s ended tuning after {len(self.history)} "
            f"hypergradient(s) and {len(self.evaluations)} plain run(s): nothing better "
            f"than the initial hyperparameters was found, and they are returned. Give the "
            f"budget room for several outer steps (the defaults spend 15 % of it on a "
            f"space-filling start)."), stacklevel=3)

    def stop(self, reason: str = "Trainer.stop()") -> None:
        """End the :meth:`fit` under way after its current outer step, e.g. from a callback's
        ``on_outer_step`` (early stopping). Offline, the result is chosen as after the last outer
        step (the final evaluation and re-checks run); online, the one inner run stops at that
        update, its state the run's so far. ``TrainResult.stopped`` holds ``reason``. Only this
        ``fit()`` ends: the next, or a resume, goes on. Under torchrun the writing rank's
        callbacks decide, for every rank."""
        if not isinstance(reason, str) or not reason:
            raise TypeError(f"Trainer.stop: reason={reason!r} must be a non-empty str (it is "
                            f"kept as TrainResult.stopped).")
        self._stop_asked = reason

    def _stopping(self) -> bool:
        """Whether :meth:`stop` was asked (after a record: its callbacks ran); the writing
        process's answer on every process, which only it calls callbacks on."""
        asked = self.strategy.writers_value(self._stop_asked, "agreeing on Trainer.stop")
        if asked is None:
            return False
        self._stop_asked = asked
        self.message(f"outer step {self.outer_step - 1}: stopped by Trainer.stop ({asked}); "
                     f"fit() again, or a resume, goes on from here")
        return True

    def close(self) -> None:
        """Release the run folder's lock without fitting (``fit`` releases it when it ends)."""
        if self.folder is not None and self.strategy.is_writer:
            self.folder.close()

    def _two_orders(self) -> bool:
        """Whether the offline search averages each hypergradient over two batch orders
        (``Offline(search=...)``'s :attr:`~hypergrad.run.modes.SearchSettings.two_orders`):
        with a :class:`~hypergrad.run.outer.SearchOptimizer` (the default outer optimizers),
        where the problem's runs vary, at K up to the setting."""
        return (isinstance(self.mode, Offline) and isinstance(self.outer, SearchOptimizer)
                and self.problem.varies
                and self.problem.num_hyperparams <= self.search.two_orders)

    def _hypergradient(self, lam: Tensor) -> HyperGradient:
        m, p = self.method, self.problem
        hg = _checked(m, lam, m.hypergradient(p, lam) if not isinstance(m, OnlineMethod)
                      else self._stepped_hypergradient(lam))
        if not self._two_orders() or not bool(torch.isfinite(hg.grad).all()):
            return hg
        # the other order, for every exact method alike: forward mode (a stepped method) took
        # the problem's order alone while the log said two, so a resume that swapped reverse
        # for forward, or method="auto" at K = 1, ran another search
        with p.variant(TWO_ORDERS_VARIANT):
            other = _checked(m, lam, m.hypergradient(p, lam)).grad
        if not bool(torch.isfinite(other).all()):  # the problem's own order alone
            return hg
        return hg._replace(grad=(hg.grad + other) / 2)

    def _stepped_hypergradient(self, lam: Tensor) -> HyperGradient:
        """A stepped method's hypergradient over the run, step by step: the inner progress
        and, with ``RunFolder(inner_every=...)``, checkpoints within the run."""
        m, p = self.method, self.problem
        assert isinstance(m, OnlineMethod)
        # the stream before this outer step's pass (restored from the outer checkpoint on a
        # resume): what its inner checkpoints give a resume that does not step
        self._pass_start = None if p.stream is None else p.stream.state_dict()
        run = self._resume_inner(lam)
        if run is None:
            run = m.init(p, lam)  # stepped here for the inner progress
        every = None if self.folder is None else self.folder.inner_every
        while run.step < p.steps:
            run = m.step(p, run, lam)
            self._emit("on_inner_step", int(run.step), p.steps)
            if every is not None and run.step % every == 0 and run.step < p.steps:
                self._checkpoint_inner(run, lam)
        value, grad = m.hypergradient_at(p, run, lam)
        return HyperGradient(value, grad, run.state)

    def _checkpoint_inner(self, run: Any, lam: Tensor) -> None:
        """A checkpoint within this outer step's inner run (``RunFolder(inner_every=...)``): the
        outer step's checkpoint plus the method's run state, its ``lam`` and the stream."""
        assert self.folder is not None and isinstance(self.method, OnlineMethod)
        ck = self._checkpoint()
        ck["inner"] = {"outer_step": self.outer_step, "lam": lam.detach().clone(),
                       "run": self.method.state_dict(self.problem, run),
                       "batches": ck.get("batches"),
                       # the run's seconds so far: a resume counts them (a long hypergradient
                       # killed after hours would show only its resumed remainder)
                       "elapsed": self._elapsed()}
        if self._pass_start is not None:
            # a resume by a method that does not step (reverse mode) drops the inner entry and
            # runs this outer step again: from the start of its pass, not the next pass (a
            # shuffled DataLoader read other batches, and the hypergradient differed; the
            # resume probe, 2026-12-07)
            ck["batches"] = self._pass_start
        if self.strategy.is_writer:
            self.folder.write_inner(ck)

    def _resume_inner(self, lam: Tensor) -> Any:
        """The run state of a checkpoint written within this outer step's inner run, if the
        run was resumed from one at the same ``lam``; else ``None``."""
        got, self._inner = self._inner, None
        if got is None or got[0]["outer_step"] != self.outer_step or not torch.equal(
                got[0]["lam"].to(lam), lam):
            return None
        entry, where = got
        assert isinstance(self.method, OnlineMethod)
        run = self.method.load_state_dict(self.problem, lam, entry["run"], where)
        if self.problem.stream is not None and entry.get("batches") is not None:
            self.problem.stream.load_state_dict(entry["batches"])  # after the run's init
        self.message(f"outer step {self.outer_step}: the inner run resumed at step "
                     f"{int(run.step)} of {self.problem.steps}")
        return run

    def _warn_unread_weights(self, grad: Tensor) -> None:
        """At the first hypergradient: per-example weights of which some (not all) entries
        have a hypergradient of exactly 0, the examples no step read (a list of batches or a
        DataLoader that does not reach them, one that draws with replacement, ``n`` above the
        data's size), where the source cannot say so up front as a
        :class:`~hypergrad.data.MiniBatches` does: they kept the search's values without a
        word."""
        if self.problem.counts_reads:
            return  # the problem warned when it checked its data (... read by no step)
        for it in self.problem.hyperparams.items:
            if it.kind != "per_example":
                continue
            g = grad[self.problem.hyperparams.slices[it.name]]
            zero = int((g == 0).sum())
            if not 0 < zero < g.numel():
                continue
            stream = self.problem.stream
            read = g.numel() - zero
            size = getattr(getattr(stream, "source", None), "batch_size", None)
            # fewer than half of what the run's batches hold: the loss may read another
            # tensor than the examples' indices (a loader without them: the labels 0..9 read
            # as indices, 10 of 300 entries learned; the per-example probe, 2026-12-08)
            few = ((f" Only {read} entries were read where the run's {self.problem.steps} "
                    f"batches of {size} hold {self.problem.steps * size} examples: does the "
                    f"loss index {it.name!r} by each example's index (the batch's last "
                    f"element, as MiniBatches gives), and not by its labels?")
                   if isinstance(size, int) and read < min(g.numel(),
                                                           self.problem.steps * size) / 2
                   else "")
            if stream is not None and stream.varies():
                # a shuffled source reads other examples in the next run's pass: those unread
                # now were told they "keep the values the search gives them", and moved (13
                # distinct values after 3 steps; the placement probe, 2026-12-07)
                warnings.warn(ZeroHypergradientWarning(
                    f"Trainer: {zero} of the {g.numel()} entries of PerExample {it.name!r} have "
                    f"a hypergradient of exactly 0 at the first outer step: its inner runs read "
                    f"{g.numel() - zero} of the examples. The batch source shuffles, and each "
                    f"inner run reads a pass of its own, so an entry is learned only at the "
                    f"outer steps whose run reads it: more slowly, and noisier, than with "
                    f"every example read in each run (steps x batch size of an epoch or "
                    f"more).{few}"), stacklevel=5)
            else:
                n = getattr(it, "n", g.numel())
                warnings.warn(ZeroHypergradientWarning(
                    f"Trainer: {zero} of the {g.numel()} entries of PerExample {it.name!r} have "
                    f"a hypergradient of exactly 0 at the first outer step: the examples no "
                    f"step of the run reads (a batch source that does not reach them, one "
                    f"that draws with replacement, or n={n} above the data's size) are not "
                    f"learned, and keep the values the search gives them. Read every example "
                    f"(an epoch or more: hypergrad.data.MiniBatches counts them up front), or "
                    f"weight only those the run reads.{few}"), stacklevel=5)

    def _step(self, value: Tensor, grad: Tensor, lam_used: Tensor) -> str | None:
        """Guard, track the best, update ``lam``; returns why the run diverged, or ``None``."""
        tr = self.tracker
        why = divergence(value, grad, tr.best, self.guards.divergence_factor)
        if why is not None:
            if NONFINITE_GRAD in why and tr.best is None:  # the training was finite: the
                # first point is a result (not "the initial hyperparameters already diverge");
                # later ones stay out, so the search can go back to a point it can step from
                tr.track(value, lam_used, None, self.outer_step, first=False)
            return why
        # the first hypergradient's checks (a zero column, per-example weights no step
        # reads) hold for a whole run; online it covers the first interval's steps only (a
        # momentum has no effect on SGD's first step: "exactly zero", and it then moved)
        first = not self.history and not self.mode.online
        if first and not tr.zero_warned:
            self._warn_unread_weights(grad)
        tr.track(value, lam_used, grad, self.outer_step, first=first)
        g, why = outer_gradient(grad, self.guards.clip_norm, self.lam.dtype,
                                value=float(value))
        if g is None:
            assert why is not None
            if TOO_LARGE in why:  # the training may have diverged: it then says so
                far = self._far_above_untrained(float(value), lam_used)
                if far is not None:
                    why = outer_gradient(grad, self.guards.clip_norm, self.lam.dtype, far)[1]
            return why
        tr.keep_grad(lam_used, g)
        if isinstance(self.outer, SearchOptimizer):
            self.outer.value = float(value)
        if not self._update(g, keep_nonfinite=True):
            return "the outer optimizer's update made the hyperparameters non-finite"
        return None

    def _update(self, g: Tensor, keep_nonfinite: bool = False) -> bool:
        """One step of the outer optimizer along ``g``, then ``lam`` projected into the bounds
        and the domains; ``False`` (and no projection, where ``keep_nonfinite``) when the step
        made ``lam`` non-finite: an outer learning rate of 1e300 stepped a log learning rate to
        -inf, which the domain's clamp turned into 0.0, and the run went on as if it had not
        diverged."""
        self.lam.grad = g
        if isinstance(self.outer, SearchOptimizer) and not self.mode.online:
            # offline, its line search runs plain inner runs; online (one run) there are none,
            # and it takes a plain step along its direction
            self._searched.append(self.lam.detach().clone())
            self.outer.step(lambda: self._plain(self.lam.detach().clone(), "line search"))
            self._say_rough()
        else:
            self.outer.step()
        self.lam.grad = None
        finite = bool(torch.isfinite(self.lam).all())
        if not finite and keep_nonfinite:
            return False
        self.bounds.project(self.lam)
        self._hold_in_domain()
        return finite

    def _domain_bounds(self) -> Bounds | None:
        """:attr:`domain`: the domains' edges as bounds on the sides a transform can cross
        (an excluded edge moved in by one step of the dtype)."""
        p = self.problem
        hps = p.hyperparams
        info = torch.finfo(p.dtype)
        pairs: dict[str, tuple[float | None, float | None]] = {}
        for name, (lo, hi, lo_x, hi_x, _) in p.hyperparameter_domains().items():
            if name not in hps.by_name:
                continue
            transform = hps.by_name[name].transform
            low: float | None = None
            high: float | None = None
            if transform == "identity" and math.isfinite(lo):
                low = (lo + info.tiny) if lo_x else lo
            if transform in ("identity", "log") and math.isfinite(hi):
                high = hi - info.eps * max(abs(hi), 1.0) / 2 if hi_x else hi
            if low is not None or high is not None:
                pairs[name] = (low, high)
        return Bounds(hps, p.dtype, pairs, api="Trainer (domains)") if pairs else None

    def _hold_in_domain(self) -> None:
        """Clamp ``lam`` into :attr:`domain`, warning once per hyperparameter that a step
        left it."""
        if self.domain is None:
            return
        raw = self.lam.detach().clone()
        self.domain.project(self.lam)
        if torch.equal(raw, self.lam):  # the usual case: nothing to describe or say
            return
        hps = self.problem.hyperparams
        before, after = hps.describe(raw), hps.describe(self.lam)
        domains = self.problem.hyperparameter_domains()
        for name in self.domain.raw:
            if before[name] == after[name] or name in self._left_domain:
                continue
            self._left_domain.add(name)
            warnings.warn(BoundsWarning(
                f"Trainer: outer step {self.outer_step} moved {name!r} to {before[name]}, "
                f"outside the domain of {domains[name][4]}; it is held at the domain's edge "
                f"({after[name]}). Give it a transform that stays inside (transform='logit' "
                f"for (0, 1), 'log' for > 0) or Guards(bounds=...) to choose the range."),
                stacklevel=3)

    def _rough_share(self) -> float | None:
        """The noise share of the outer optimizer's last model where it treated the
        hypergradients as noise (at least ``ROUGH_SHARE``), else ``None``."""
        fit = getattr(self.outer, "last_fit", None)
        return fit[1] if fit is not None and fit[1] >= ROUGH_SHARE else None

    def _say_rough(self) -> None:
        """Once: a surrogate model (:class:`~hypergrad.run.Surrogate`) that found the
        hypergradients do not describe the validation losses between its points."""
        share = self._rough_share()
        if self._rough_said or share is None:
            return
        self._rough_said = True
        self.message(f"outer step {self.outer_step}: the hypergradients do not describe the "
                     f"validation losses between the points evaluated (the surrogate model "
                     f"fits them as noise {share:g} times a slope's prior variance): it leans "
                     f"on the plain runs' losses. The loss may be rough in the hyperparameters "
                     f"at this horizon (docs/troubleshooting.md, 'Rough losses'), or the "
                     f"hypergradients wrong (a custom optimizer or method: "
                     f"hypergrad.testing.hypergradcheck)")

    # -- plain evaluations: the space-filling start and the line search ---------------------------
    def _reserve(self) -> float:
        """Seconds of the time budget kept for the end of a run that re-checks its best points:
        the final evaluation of the last point and the re-checks, a plain run each, so that
        the point returned is chosen within the budget. Without re-checks none (the final
        evaluation follows the budget, as :class:`~hypergrad.Guards` says)."""
        if self._plain_seconds is None or not self._rechecks:
            return 0.0
        return (1 + self._rechecks) * self._plain_slow(margin=1.5)

    def _plain_slow(self, margin: float = 1.0) -> float:
        """A plain run's seconds: the median of this fit's plain runs (runs at points where
        training blows up can take 10x longer, on overflows and subnormal numbers; a few of
        them do not move it), times ``margin`` (the reserve's: a run's time varies, and the
        end of the run must fit the budget). The fit's first run, which carries a fresh
        process's warm-up (0.82 s against 0.01-0.09 s after it), is left out once there are
        others."""
        runs = self._plain_recent[1:] or self._plain_recent or [self._plain_seconds or 0.0]
        recent = sorted(runs)
        return margin * recent[len(recent) // 2]

    def _timed_value(self, lam: Tensor, variant: int) -> tuple[float, float | None]:
        """The validation loss after one plain inner run at ``lam`` in the problem's
        ``variant`` (0: itself), and the held-out ``select_loss`` there (``None`` without
        one), its seconds recorded for the budget's forecasts."""
        t0 = self._now()
        with torch.no_grad(), self.problem.variant(variant):
            state = self.problem.run(lam)
            value = float(self.problem.objective(state.params, state.buffers, lam))
            sel = self._select_value(state, lam, value)
        self._plain_seconds = self._now() - t0
        self._plain_recent.append(self._plain_seconds)
        return value, sel

    def _select_value(self, state: InnerState | None, lam: Tensor,
                      value: float) -> float | None:
        """The problem's ``select_loss`` at ``state`` (offline, for a finite validation loss;
        ``inf`` where it is not finite), else ``None``."""
        if (self.problem.select_loss is None or self.mode.online or state is None
                or not math.isfinite(value)):
            return None
        sel = self.problem.select(state.params, state.buffers, lam)
        assert sel is not None
        v = float(sel)
        return v if math.isfinite(v) else math.inf

    def _note(self, lam: Tensor, value: float, sel: float | None,
              step: int | None = None) -> None:
        """Keep an evaluation for the choice by ``select_loss`` (:attr:`selections`), of outer
        step ``step`` (default: the current one)."""
        if sel is not None:
            self.selections.append({"lam": lam.detach().clone(), "val_loss": value,
                                    "select_loss": sel,
                                    "outer_step": self.outer_step if step is None else step})

    def _candidates(self) -> list[tuple[float, Tensor, int, float | None]]:
        """The points the end of the run chooses among, best first, as ``(validation loss,
        lam, outer step, select loss)``: by ``select_loss`` where the problem has one (each
        point once, its first evaluation), else the tracker's best by validation loss."""
        if not self.selections:
            return [(v, x, k, None) for v, x, k in self.tracker.top]
        out: list[tuple[float, Tensor, int, float | None]] = []
        for r in sorted(self.selections, key=lambda r: r["select_loss"]):
            if not any(torch.equal(r["lam"], x) for _, x, _, _ in out):
                out.append((r["val_loss"], r["lam"], r["outer_step"], r["select_loss"]))
        return out

    def _no_room(self, before: float = 0.0, reserve: bool = True) -> bool:
        """Whether the time budget has no room for one more plain run after ``before`` seconds
        of other work (keeping :meth:`_reserve` for the runs that end the run, unless
        ``reserve`` is False: those runs themselves, which may go past the budget by the
        reserve's length: one slow run before them, a pause or another process's burst,
        had eaten the reserve and left the point returned unchecked)."""
        budget = self.guards.time_budget
        if budget is None or self._plain_seconds is None:
            return False
        held = self._reserve() if reserve else -self._reserve()
        return self._now() - self._fit_start + before + self._plain_slow() > budget - held

    def _evaluated(self, lam: Tensor, value: float, kind: str, step: int) -> None:
        """Record a point evaluated without a hypergradient to step from in
        :attr:`evaluations`."""
        self.evaluations.append({"elapsed": self._elapsed(), "val_loss": value,
                                 "lam": lam.detach().clone(), "kind": kind, "outer_step": step,
                                 "hyperparams": self.problem.hyperparams.describe(lam)})

    def _plain(self, lam: Tensor, kind: str) -> float | None:
        """The validation loss at ``lam`` after one plain inner run (tracked as a candidate for
        the best point), or ``None`` when the time budget has no room for it (and for the
        runs that end the run: :meth:`_reserve`)."""
        if self._no_room():
            return None
        value, sel = self._timed_value(lam, 0)
        # the outer step of the point: a line search (or restart) during outer step k tries
        # points of step k + 1, after k + 1 updates (best_step; history[k + 1], where that
        # step runs, holds the one it moved to: a trial it did not take is in evaluations)
        step = self.outer_step + self._ahead
        self._note(lam, value, sel, step)
        # as best_step and the tracker count it (it said outer step 3 where best_step said 4,
        # for the same point)
        self._evaluated(lam, value, kind, step)
        if isinstance(self.outer, SearchOptimizer):  # a surrogate model keeps it
            self.outer.observe(lam, value)
        if not math.isfinite(value):
            return math.inf
        # in float64: a float32 tensor rounded the loss to 7 digits, so a plain run's point
        # tied with (or beat) a lower loss evaluated elsewhere, and best_val_loss was a number
        # no evaluation gave
        self.tracker.track(torch.tensor(value, dtype=torch.float64), lam, None, step,
                           first=False)
        return value

    def _space_filling(self, n: int, skip: int) -> list[Tensor]:
        """Points ``skip .. skip + n - 1`` of a scrambled Sobol sequence in the search box
        (seeded by the problem's seed), one dimension per hyperparameter of the kinds in
        ``search.shared_start`` (:meth:`_draw_columns`), else per entry."""
        lo, hi = self.box
        cols = self._draw_columns()
        dims = int(cols.max()) + 1
        sobol = min(dims, torch.quasirandom.SobolEngine.MAXDIM)  # 21201 at most
        engine = torch.quasirandom.SobolEngine(sobol, scramble=True, seed=self.problem.seed)
        u = engine.draw(skip + n, dtype=torch.float64)
        if dims > sobol:  # the dimensions beyond Sobol's: seeded uniform draws
            g = torch.Generator().manual_seed(self.problem.seed)
            u = torch.cat([u, torch.rand(skip + n, dims - sobol, generator=g,
                                         dtype=torch.float64)], 1)
        u = u[skip:][:, cols].to(lo)
        return [lo + ui * (hi - lo) for ui in u]

    def _draw_columns(self) -> Tensor:
        """For each raw entry, the Sobol dimension that places it in the box: the entries of a
        hyperparameter of a kind in ``search.shared_start`` share one."""
        cols: list[int] = []
        dims = 0
        for it in self.problem.hyperparams.items:
            shared = it.kind in self.search.shared_start
            n = it.base_numel if shared else 0  # at one level (not a schedule's scales)
            rest = dims + (n > 0)
            cols += [dims] * n + list(range(rest, rest + it.numel - n))
            dims = cols[-1] + 1
        return torch.tensor(cols, dtype=torch.long)

    def _start(self) -> None:
        """The space-filling start (``Offline(start=...)``): plain runs at the initial point and
        at quasi-random points of the box; tuning goes on from the best."""
        assert isinstance(self.mode, Offline)
        best = self._plain(self.lam.detach().clone(), "start")
        if best is None or self._plain_seconds is None:
            return
        n = self.mode.start_points(self.guards.time_budget, self._plain_seconds)
        pick = self.lam.detach().clone()
        ran = 0
        for x in self._space_filling(n, 0):
            v = self._plain(x, "start")
            if v is None:
                break
            ran += 1
            if v < best:
                best, pick = v, x
        self._starts_used = n
        with torch.no_grad():
            self.lam.copy_(pick)
        cut = "" if ran == n else f" of the {n} planned (the time budget left no room for more)"
        self.message(f"space-filling start: {ran} quasi-random points{cut} and the initial "
                     f"one, best validation loss {best:.4g}")

    def _leftover(self) -> None:
        """The time left when no hypergradient fits any more, spent on plain runs: a line
        search from the best point along its hypergradient where none started there yet
        (steepest descent), then quasi-random points, until the budget's end (its reserve
        kept)."""
        tr = self.tracker
        if tr.best is None:
            return
        n0 = len(self.evaluations)
        searched = any(torch.equal(tr.best[1], x) for x in self._searched)
        if tr.best_grad is not None and not searched:
            before = self.lam.detach().clone()
            with torch.no_grad():
                self.lam.copy_(tr.best[1])
            self.outer.state.clear()
            assert isinstance(self.outer, SearchOptimizer)
            self.outer.value = tr.best[0]
            self._update(tr.best_grad.clone())
            if not self.outer.improved:  # where the outer loop ended, as before
                with torch.no_grad():
                    self.lam.copy_(before)
        assert isinstance(self.outer, SearchOptimizer)
        proposing = 0.0
        while True:
            # the next proposal's time too (a surrogate model's fit over hundreds of plain
            # runs): only the plain run was counted, so the proposals ate the reserve, and
            # the re-check of the best points never ran ("room to re-check 0 of the 3")
            if self._no_room(before=proposing):
                break
            t0 = self._now()
            x = self.outer.next_point(self.lam)  # a surrogate model's, else quasi-random
            if x is None:
                x = self._space_filling(1, self._starts_used)[0]
            proposing = self._now() - t0
            if self._plain(x, "leftover") is None:
                break
            self._starts_used += 1
        if len(self.evaluations) > n0:
            self.message(f"the time left after the last hypergradient: "
                         f"{len(self.evaluations) - n0} plain runs")

    def _restart(self, why: str = "the line search stalled") -> bool:
        """After a line search found nothing better even along steepest descent (or
        :meth:`_recover`, ``why``): go on from the best of the next few quasi-random points
        (the best point stays tracked). A point whose validation loss is above the best by
        more than half the divergence margin (``(divergence_factor - 1) / 2`` of ``|best|``)
        is not taken: its hypergradient could stop the run as diverged. Returns whether
        the search moved to one."""
        pts = self._space_filling(3, self._starts_used)
        self._starts_used = self._starts_used + 3
        best, pick = math.inf, None
        for x in pts:
            v = self._plain(x, "restart")
            if v is None:
                break
            if v < best:
                best, pick = v, x
        tr, factor = self.tracker, self.guards.divergence_factor
        if pick is not None and tr.best is not None and factor is not None and (
                best > tr.best[0] + (factor - 1) / 2 * abs(tr.best[0])):
            pick = None  # a point that far above the best would stop the run as diverged
        if pick is not None:
            with torch.no_grad():
                self.lam.copy_(pick)
            self.outer.state.clear()
            self.message(f"outer step {self.outer_step}: {why}; restarted at a quasi-random "
                         f"point (validation loss {best:.4g})")
        return pick is not None

    def _recover(self, why: str, lam_used: Tensor, value: float | None = None) -> bool:
        """The default search (a :class:`~hypergrad.run.outer.SearchOptimizer`) explores:
        a restart's quasi-random point or a line search's last can sit where training is
        unstable, and give a validation loss or a hypergradient that cannot be used. That
        is not the tuning diverging: back to the best point evaluated, the outer state
        forgotten, a restart from there (:meth:`_restart`), the budget going on. Returns
        whether it did so; not at the best point itself (nothing better to go back to) nor
        after :data:`~hypergrad.run.guards.MAX_BACKTRACKS` such steps in a row, where the
        run stops as diverged. At the best point itself, measured again on other batches (a
        stream draws a pass per run) far above its first measurement, the point trains well
        in one draw only: its worse measurement is kept (:meth:`Tracker.demote
        <hypergrad.run.guards.Tracker.demote>`) and the search goes back to the next best and
        restarts from there."""
        tr = self.tracker
        if (not isinstance(self.outer, SearchOptimizer) or tr.best is None
                or self._recoveries >= MAX_BACKTRACKS):
            return False
        if torch.equal(tr.best[1], lam_used):
            first = tr.best[0]
            if value is None or len(tr.top) < 2 or self.selections:
                return False  # nothing else to go back to (or chosen by select_loss)
            if NONFINITE_GRAD in why and math.isfinite(value):
                # its loss is finite, its hypergradient not (a square root at 0): no point
                # to step from, but a result. It was "measured again on other batches" and
                # "trains well in one draw only", 25 times over, on a deterministic problem
                # (the divergence probe)
                tr.set_aside(lam_used, value)
                said = (f"outer step {self.outer_step}: at the best point (validation loss "
                        f"{value:.4g}), {why}: the search cannot step from there, and keeps it "
                        f"among the points to return; back to the next best point (outer step "
                        f"{tr.best[2]}, validation loss {tr.best[0]:.4g}), and a restart from "
                        f"there")
                cause = "no usable hypergradient at the best point"
            else:
                tr.demote(lam_used, value if math.isfinite(value) else math.inf)
                said = (f"outer step {self.outer_step}: the best point's validation loss, "
                        f"measured again on other batches, is {value:.4g} against {first:.4g} "
                        f"at first: it trains well in one draw only, and keeps its worse "
                        f"measurement; back to the next best point (outer step {tr.best[2]}, "
                        f"validation loss {tr.best[0]:.4g}), and a restart from there")
                cause = "the best point trains well in one draw only"
        else:
            said = (f"outer step {self.outer_step}: {why}, at hyperparameters "
                    f"{self.problem.hyperparams.describe(lam_used)}: back to the best point "
                    f"(outer step {tr.best[2]}, validation loss {tr.best[0]:.4g})")
            cause = "no usable hypergradient"
        self._recoveries += 1
        with torch.no_grad():
            self.lam.copy_(tr.best[1])
        self.outer.state.clear()
        self.message(said)
        self._restart(cause)
        return True

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
        if isinstance(self.outer, SearchOptimizer):  # its line search starts from the best
            self.outer.value = best[0]
        if best_grad is not None:
            self._update(best_grad.clone())
        # an optimizer without a learning rate (QuasiNewton: its line search sets the step)
        # only forgets its state
        smaller = (f"outer lr halved to {', '.join(f'{x:.3g}' for x in lrs)}" if lrs
                   else f"{type(self.outer).__name__}'s state reset")
        then = (", a step from there along its hypergradient" if best_grad is not None
                else " (no hypergradient was taken there: the next is)")
        self.message(f"outer step {self.outer_step}: {why}: back to the best "
                     f"hyperparameters (outer step {best[2]}), {smaller}{then}")

    def _fit_offline(self) -> TrainResult:
        assert isinstance(self.mode, Offline)
        budget = self.guards.time_budget
        # the forecasts of the last outer steps of this fit() call: the next is forecast by
        # their median, so that one slow step (a pause, another process's burst: 10-50x on
        # a busy 2-core machine) neither stops the descent early nor eats the re-checks' time
        forecasts: list[float] = []
        last_seconds: float | None = None
        out_of_time = self._budget_cut = False
        if self.outer_step == 0 and self.mode.start != 0 and not any(
                e["kind"] == "start" for e in self.evaluations):  # not again on a resume
            self._start()
        if self.mode.outer_steps is not None and 0 < self.mode.outer_steps < self.outer_step:
            self.message(f"resume: the run already has {self.outer_step} outer steps, more "
                         f"than outer_steps={self.mode.outer_steps}: none is added (a resume "
                         f"can only ask for more); the result is the run's so far")
        if self._over is not None:  # a resume (or a second fit()) of a run whose descent ended
            self.message(f"the run's descent ended at outer step {self.outer_step - 1} "
                         f"({_OVER[self._over][0]}): no outer step is added")
            out_of_time = self._end_descent(budget)
        while self._over is None and self.outer_step < self.mode.steps(budget):
            t0 = self._now()
            runs_before = len(self._plain_recent)
            last_seconds = statistics.median(forecasts[-3:]) if forecasts else None
            if (budget is not None and last_seconds is not None
                    and t0 - self._fit_start + last_seconds > budget - self._reserve()):
                out_of_time = self._budget_cut = True
                held = self._reserve()
                self.message(f"time_budget={budget:g} s: stopped before outer step "
                             f"{self.outer_step} ({t0 - self._fit_start:.3g} s; the next would "
                             f"take about {last_seconds:.2g} s"
                             + (f", and {held:.2g} s are kept for the re-check and the final "
                                f"run" if held > 0 else "") + ")")
                if self.search.leftover and isinstance(self.outer, SearchOptimizer):
                    self._leftover()
                break
            lam_used = self.lam.detach().clone()
            hg = self._hypergradient(lam_used)
            if self._first_point is None and math.isfinite(float(hg.objective)):
                self._first_point = (float(hg.objective), lam_used, self.outer_step)
            # a one-time compilation is not what the next outer step will cost
            once = self._say_compile()
            hg_seconds = max(self._now() - t0 - once, 0.0)
            value, grad = hg.objective, hg.grad
            if (self.tracker.best is not None and math.isfinite(float(value))
                    and not bool(torch.isfinite(grad).all())):  # a result all the same,
                # recorded where the run's other points without a hypergradient are (the
                # point returned was in no record)
                self.tracker.note_gradless(float(value), lam_used, self.outer_step)
                self._evaluated(lam_used, float(value), "hypergradient not finite",
                                self.outer_step)
            bad = worse(value, grad, self.tracker.best, self.guards.backtrack)
            best = self.tracker.best
            if (bad is not None and best is not None and torch.equal(best[1], lam_used)
                    and math.isfinite(float(value)) and bool(torch.isfinite(grad).all())):
                # at the best point itself (its loss measured again on other batches: above
                # the lucky first measurement) there is nothing to go back to: its
                # hypergradient is used, not thrown away for the same point again
                bad = None
            if bad is not None and self._backtracks >= MAX_BACKTRACKS:
                # as the docs say (past the limit the step was used, the counter reset)
                return self._diverged(
                    f"{MAX_BACKTRACKS} backtracks in a row, each outer step worse than the best "
                    f"point ({bad}), though the outer learning rate was halved each time: the "
                    f"hypergradients do not lead down from there", lam_used, value)
            backtracked = bad is not None
            why: str | None = None
            with self._next_step_points():
                if bad is not None and backtracked:
                    self._back(bad)
                else:
                    why = self._step(value, grad, lam_used)
            if why is not None and self._recover(why, lam_used, float(value)):
                forecasts.append(hg_seconds)
                continue
            if why is not None:
                return self._diverged(why, lam_used, value)
            if not backtracked:
                self._backtracks = 0
                self._recoveries = 0
            # what this outer step took (its hypergradient and line search), recorded; the
            # forecast of the next below is the budget's (the record held the forecast: 0.14 s
            # where a step of 6 line-search runs took 0.30)
            forecast = spent = max(self._now() - t0 - once, 0.0)
            ended = False
            if isinstance(self.outer, SearchOptimizer):  # its search checks the budget itself
                # the next outer step is worth taking only with room for its line search's
                # first trial: a hypergradient with no trial after it moves nothing. With the
                # search's own time per trial beside the runs (a surrogate model's proposal:
                # 4 s a step where its runs took 0.05, and the forecast said 0.045 s)
                runs = self._plain_recent[runs_before:]
                own = max(spent - hg_seconds - sum(runs), 0.0) / max(len(runs), 1)
                forecast = hg_seconds + (self._plain_slow() + own if self.search.trial_forecast
                                         else 0.0)
            forecasts.append(forecast)
            if isinstance(self.outer, SearchOptimizer):
                # stalled, and no restart point to go on from: the next hypergradient would be
                # this one again (the same point, the same run), so the descent ends here
                with self._next_step_points():
                    ended = self.outer.stalled and not self._restart()
            self._note(lam_used, float(value), self._select_value(hg.state, lam_used,
                                                                  float(value)))
            # decided before the record, so that its checkpoint holds it: a run killed after
            # it resumed with one more outer step than the straight run (the same point's
            # hypergradient again, the line search's runs again, a restart)
            if ended:
                self._over = "ended"
            elif (budget is not None and self.search.rough_plain and self.search.leftover
                  and self._rough_share() is not None):
                self._over = "rough"
            saved = self._now()
            self._record(value, grad, lam_used, hg.state, spent,
                         backtracked=backtracked, info=hg.info)
            forecasts[-1] += self._now() - saved  # its checkpoint and callbacks, every step
            if self._stopping():
                break
            if self._over is not None:
                self.message(f"outer step {self.outer_step - 1}: "
                             + ": ".join(_OVER[self._over]))
                out_of_time = self._end_descent(budget)
                break
        res = self._finish_offline()
        if self.folder is not None and not self.history and not res.diverged:
            # no outer step (outer_steps=0: a baseline, a black-box sweep's trial): a
            # checkpoint all the same, or a resume found the run's records without one and
            # refused it (every finished job of a sweep rerun with folder.resume=true)
            ck = self._checkpoint()
            if self.strategy.is_writer:
                self.folder.write_inner(ck)
        res.out_of_time = out_of_time and not res.diverged
        res.stopped = self._stop_asked or ""
        took = self._now() - self._fit_start
        if budget is not None and took > 1.1 * budget:  # said, not only measured (a budget
            # of 0.001 s took 1.3 s, and 1.5 s took 1.9 s without a word; the defaults probe)
            self.message(f"time_budget={budget:g} s: this fit took {took:.3g} s: the first "
                         f"hypergradient, and the runs that end a fit (the final evaluation, "
                         f"the re-check), run whatever the budget")
        return res

    def _end_descent(self, budget: float | None) -> bool:
        """After the descent ended (:data:`_OVER`): with a time budget, the time left goes to
        plain runs (``search.leftover``). Returns whether it did (the run is out of time)."""
        if self._over == "rough" or (budget is not None and self.search.leftover):
            self._leftover()  # plain runs until the budget's end
            return True
        return False

    def _say_compile(self) -> float:
        """Once: what ``ForwardMode(compile=None)`` measured and chose; returns the seconds of
        that one-time measurement (the compilation and the timed calls), else 0, so that the
        time budget does not predict the next outer step from them."""
        rep = getattr(self.method, "compile_report", None)
        if rep is None or self._compile_said:
            return 0.0
        self._compile_said = True
        if rep["compiled_ms"] is None:
            self.message(f"compiled products: {rep['reason']}; eager steps")
        else:
            self.message(f"compiled products: {rep['compiled_ms']:.2f} ms per step against "
                         f"eager {rep['eager_ms']:.2f} (compiled in {rep['compile_s']:.1f} s): "
                         f"{rep['chosen']} from here on")
        return float(rep["trial_s"])

    def _finish_offline(self, back_to: int | None = None) -> TrainResult:
        """Evaluate the hyperparameters after the last update (no hypergradient: one plain
        inner run), so the best evaluated point can be returned. With ``Guards(backtrack=...)``
        a last update that diverges is undone as any other (it returned the run as diverged
        where one more outer step would have backtracked): the best point is evaluated instead
        (``back_to``: its outer step)."""
        last = self.lam.detach().clone()
        with torch.no_grad():
            state = self.problem.run(last)
            value = self.problem.objective(state.params, state.buffers, last)
        why = divergence(value, None, self.tracker.best, self.guards.divergence_factor)
        best = self.tracker.best
        if (why is not None and back_to is None and self.guards.backtrack is not None
                and best is not None and math.isfinite(best[0])):
            self.message(f"after the last update, {why}: undone (Guards(backtrack="
                         f"{self.guards.backtrack})), back to the best hyperparameters (outer "
                         f"step {best[2]})")
            self._undone = last  # it moved: not a hyperparameter that "never moved"
            with torch.no_grad():
                self.lam.copy_(best[1])
            return self._finish_offline(back_to=best[2])
        if why is not None:
            return self._diverged(f"after the last update, {why}", last, value)
        hps = self.problem.hyperparams
        # no update after the last record (the descent ended on a line search that found
        # nothing better): this is that record's point, not the next step's (results.json's
        # last_step named the next step, and the plot left out the last point)
        last_step = (back_to if back_to is not None else
                     self.history[-1]["outer_step"] if self.history
                     and self.history[-1].get("hyperparams") == hps.describe(last)
                     else self.outer_step)
        self.tracker.track(value, last, None, last_step, first=False)
        seen = self.tracker.gradless_seen
        if seen:  # the search went around them: without a log, a user never learned of it
            said = (f"Trainer: {len(seen)} point(s) evaluated had a finite validation loss "
                    f"but a hypergradient that was not finite (e.g. {hps.describe(seen[0])}): "
                    f"the search "
                    f"could not step from them (they were candidates for the point returned). "
                    f"A training at the edge of stability there (its derivatives overflow: "
                    f"bound the learning rate) or a loss whose derivative is not finite there "
                    f"(sqrt or abs at 0, a log of 0, a torch.where whose other branch is not "
                    f"finite) gives that: check with hypergrad.testing.hypergradcheck at such "
                    f"a point.")
            self.message(said)
            warnings.warn(TuningWarning(said), stacklevel=4)
        with torch.no_grad():
            self._note(last, float(value), self._select_value(state, last, float(value)),
                       last_step)
        assert self.tracker.best is not None
        with self.tracker.gradless_admitted():  # results too, not points to step from
            best_val, best_lam, best_step, best_sel = self._candidates()[0]
            rechecked, pick = self._recheck()
        if pick is not None:
            best_val, best_lam, best_step = pick["val_loss"], pick["lam"], pick["outer_step"]
            best_sel = pick.get("select_loss")
        elif best_sel is not None:
            self.message(f"chose the point of outer step {best_step} by the held-out "
                         f"select_loss {best_sel:.4g} (its validation loss {best_val:.4g}; "
                         f"the lowest validation loss {self.tracker.best[0]:.4g})")
        if self.history:
            # after a space-filling start the first hypergradient's point is the start's best,
            # not the initial point (whose loss is among the start's evaluations)
            init = next((e["val_loss"] for e in self.evaluations
                         if torch.equal(e["lam"], self.initial_lam)), None)
            first = self.history[0]["val_loss"]
            start = (f"initial {first:.4g}" if init is None or init == first else
                     f"initial {init:.4g}, the descent's start {first:.4g}")
            # "best" is the point returned: chosen by select_loss or the re-check, its
            # validation loss need not be the lowest ("best 0.33, last 0.30" read as a slip)
            chosen = ("returned" if best_sel is not None or rechecked else "best")
            # one point, two losses (its runs differ: an augmenting loader, dropout): "best
            # 2.017, last 2.126" at the same outer step read as two points (the checkpoint
            # probe, 2026-12-08)
            again = (" (the same point evaluated again: its runs differ in their batches or "
                     "random draws)" if torch.equal(best_lam, last) and self.problem.varies
                     and float(value) != best_val else "")
            self.message(f"validation loss: {start}, {chosen} {best_val:.4g} (outer step "
                         f"{best_step}), last {float(value):.4g} (outer step {last_step})"
                         f"{again}")
        self._say_box_edge(best_lam)
        return TrainResult(best_lam.clone(), hps.describe(best_lam), copy.deepcopy(self.history),
                           self.method.name, state=state, last_lam=last,
                           last_values=hps.describe(last), best_step=best_step,
                           best_val_loss=best_val, last_val_loss=float(value),
                           rechecked=rechecked, best_select_loss=best_sel,
                           last_step=last_step)

    def _say_box_edge(self, lam: Tensor) -> None:
        """Say where the point returned sits on an edge of the search box that hypergrad chose
        itself (no bound given for that hyperparameter), which the default search does not
        step past: a diverging initial learning rate of 20 gave the box [0.2, 2000], and the
        run returned lr = 0.2 (its loss 0.542, where lr = 0.05 gives 0.497) without a word
        (the defaults probe). A message, not a warning: a weight decay driven to its lower
        edge (nearly none) is an answer as often as a clue."""
        if not isinstance(self.outer, SearchOptimizer) or self.outer.box is None:
            return
        given = {str(k).split("[")[0] for k in (self.guards.bounds or {})}
        lo, hi = self.box
        own_lo, own_hi = self._own_box
        x = lam.detach().to(lo)
        hps = self.problem.hyperparams
        for it in hps.items:
            # a logit's box (0.0025 to 0.9975) is nearly its domain, and per-example weights
            # driven to an edge are the search's answer (an example weighted out)
            if it.name in given or it.transform == "logit" or it.kind == "per_example":
                continue
            whole = hps.slices[it.name]  # its own entries (a schedule's scales are factors)
            sl = slice(whole.start, whole.start + it.base_numel)
            low = (x[sl] <= lo[sl]) & (lo[sl] == own_lo[sl].to(lo))
            high = (x[sl] >= hi[sl]) & (hi[sl] == own_hi[sl].to(lo))
            n_lo, n_hi = int(low.sum()), int(high.sum())
            if not n_lo + n_hi:
                continue
            side = "lower" if n_lo >= n_hi else "upper"
            edge = TRANSFORMS[it.transform][0]((lo if side == "lower" else hi)[sl][
                (low if side == "lower" else high)][:1].double())
            many = f"{n_lo + n_hi} of its {it.base_numel} entries, " if it.base_numel > 1 else ""
            self.message(
                f"the point returned has {it.name!r} on the {side} edge of the search "
                f"box hypergrad chose around its initial value ({many}at "
                f"{float(edge[0]):.4g}; {_BOX_RULE[it.transform]}), which the search does not "
                f"step past: a better value may lie beyond. Give it bounds that reach "
                f"further, Guards(bounds={{{it.name!r}: (low, high)}}) (hypergrad-run: "
                f"guards.bounds.{it.name}=[low,high], in its values), or start it nearer.")

    def _recheck(self) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Train the best points (:meth:`_candidates`) again in another batch order
        (:meth:`InnerProblem.variant <hypergrad.InnerProblem.variant>`), best first, each at
        least :data:`RECHECK_APART` of the box from the others in some coordinate, the last of
        them the point the first hypergradient was taken at (``search.recheck_first``), while the
        time budget allows. Returns them and the one whose worse loss of the two orders is
        lowest (``search.recheck_pick="mean"``: the lowest mean; the held-out ``select_loss``
        where the problem has one, else the validation loss); ``([], None)`` when fewer than
        two were re-checked (nothing to choose)."""
        budget = self.guards.time_budget
        out: list[dict[str, Any]] = []
        lo, hi = self.box
        width = (hi - lo).clamp_min(1e-12)
        picked: list[tuple[float, Tensor, int, float | None]] = []
        cands = self._candidates()
        first = None
        if self.search.recheck_first and self._first_point is not None:  # where the descent started
            v0, x0, k0 = self._first_point  # (beyond the tracker's best 32 in a long run)
            first = next((c for c in cands if torch.equal(c[1], x0)),
                         None if self.selections else (v0, x0, k0, None))
        for val, lam, step, sel in cands:
            held = first is not None and not any(torch.equal(first[1], x)
                                                 for _, x, _, _ in picked)
            if len(picked) >= self._rechecks - held:  # a place kept for the first point
                break
            if all(float(((lam - x) / width).abs().max()) >= RECHECK_APART
                   for _, x, _, _ in picked):  # a neighbour of a chosen point tells nothing new
                picked.append((val, lam, step, sel))
        if first is not None and not any(torch.equal(first[1], x) for _, x, _, _ in picked):
            picked.append(first)
        if len(picked) < 2:
            return [], None
        for val, lam, step, sel in picked:
            if self._no_room(reserve=False):
                break
            v, vs = self._timed_value(lam, 1)
            rec = {"lam": lam.clone(), "val_loss": val,
                   "variant_val_loss": v if math.isfinite(v) else math.inf, "outer_step": step,
                   "hyperparams": self.problem.hyperparams.describe(lam)}
            if sel is not None:
                rec.update(select_loss=sel, variant_select_loss=math.inf if vs is None else vs)
            out.append(rec)
        if len(out) < len(picked):  # the budget's reserve was eaten (a run's time varies)
            said = (f"Trainer: time_budget={budget:g} s left room to re-check {len(out)} of the "
                    f"{len(picked)} best points in another batch order"
                    + ("" if len(out) >= 2 else ", so none was compared: the point returned was "
                       "judged in the tuning run's batch order only, where a point that trains "
                       "well in that order alone can win")
                    + f". A time_budget a few plain runs longer (one takes about "
                      f"{self._plain_slow():.3g} s) leaves room for them.")
            self.message(said)
            warnings.warn(TuningWarning(said), stacklevel=4)
        if len(out) < 2:
            return [], None
        key = "select_loss" if "select_loss" in out[0] else "val_loss"
        def score(r: dict[str, Any]) -> float:
            return self.search.recheck_score(r[key], r[f"variant_{key}"])

        pick = min(out, key=score)
        worse = self.search.recheck_pick == "worse"
        said = ", ".join(f"{r[key]:.4g} -> {r[f'variant_{key}']:.4g}" for r in out)
        what = "held-out select_loss" if key == "select_loss" else "validation loss"
        where = " and where the descent started" if first is not None else ""
        self.message(f"re-checked {len(out)} points (the best{where}) in another batch order "
                     f"({said}); "
                     f"returned the one of outer step {pick['outer_step']} at {pick[key]:.4g} "
                     f"in the tuning's order ({'the worse' if worse else 'mean'} {what} "
                     f"{score(pick):.4g}"
                     + ("; points of one outer step are its plain runs' (outer step 0: the "
                        "space-filling start's; later: a line search's or restarts' trials)"
                        if len({r["outer_step"] for r in out}) < len(out) else "") + ")")
        return out, pick

    def _fit_online(self) -> TrainResult:
        m, p, mode = self.method, self.problem, self.mode
        assert isinstance(m, OnlineMethod) and isinstance(mode, Online)
        if self.run_state is None:
            self.run_state = m.init(p, self.lam.detach().clone())
        t0 = self._now()

        def owed() -> bool:  # the run state is at an update that has no record yet
            step = int(self.run_state.step)
            return (step > 0 and (step % mode.interval == 0 or step == p.steps)
                    and not (self.history and self.history[-1].get("inner_step") == step))

        while True:
            lam_used = self.lam.detach().clone()
            if not owed():  # (a state taken at an update, before it, does it first)
                if self.run_state.step >= p.steps:
                    break
                self.run_state = m.step(p, self.run_state, lam_used)
                self._emit("on_inner_step", int(self.run_state.step), p.steps)
                if not owed():
                    continue
            value, grad = m.hypergradient_at(p, self.run_state, lam_used)
            why = self._step(value, grad, lam_used)
            if why is not None:
                return self._diverged(why, lam_used, value)
            if mode.reset_tangents:
                self.run_state = m.truncate(self.run_state)
            self._record(value, grad, lam_used, self.run_state.state,
                         self._now() - t0, inner_step=self.run_state.step)
            t0 = self._now()
            if self._stopping():
                break
        last = self.lam.detach().clone()
        hps = self.problem.hyperparams
        last_val = self.history[-1]["val_loss"] if self.history else None
        return TrainResult(last, hps.describe(last), copy.deepcopy(self.history), m.name,
                           state=self.run_state.state, last_lam=last.clone(),
                           last_values=hps.describe(last), best_step=self.outer_step,
                           best_val_loss=last_val, last_val_loss=last_val,
                           stopped=self._stop_asked or "")

    def _diverged(self, why: str, lam_used: Tensor, value: Tensor) -> TrainResult:
        hps = self.problem.hyperparams
        bad_lam, last_val = lam_used.detach().clone(), float(value)
        if not torch.equal(self.lam, lam_used):  # the update itself went wrong
            bad_lam, last_val = self.lam.detach().clone(), math.nan
        bad = hps.describe(bad_lam)
        offline = not self.mode.online
        go_on = self.tracker.fallback(offline)[0]  # where a resume or fit() again steps from
        with self.tracker.gradless_admitted() if offline else contextlib.nullcontext():
            keep, keep_step, keep_val, kept = self.tracker.fallback(offline)
        sel: float | None = None
        if offline and self.selections:  # chosen as a finished run chooses
            keep_val, keep, keep_step, sel = self._candidates()[0]
            go_on = keep
            kept = (f"returned the evaluated point with the lowest held-out select_loss "
                    f"({sel:.4g}), of outer step {keep_step} (validation loss {keep_val:.4g})")
        if not torch.equal(go_on, keep):  # the point returned has no hypergradient
            kept += (f" (it has no finite hypergradient: a resume, or fit() again, goes on "
                     f"from {hps.describe(go_on)}, the best point with one)")
        with torch.no_grad():
            self.lam.copy_(go_on)
        # the outer steps' advice where they led there (not at the initial point, nor for a
        # hypergradient too large for the dtype, whose message gives its own)
        advice = (" Try a smaller outer learning rate, Guards(clip_norm=...), or "
                  "Guards(bounds=...) on learning rates." if self.tracker.best is not None
                  and TOO_LARGE not in why else "")
        msg = (f"stopped at outer step {self.outer_step}: {why}, with "
               f"hyperparameters {bad}. The tuning diverged; {kept}: {hps.describe(keep)}."
               f"{advice}")
        far = (self._far_above_untrained(float(value), lam_used)
               if NONFINITE_GRAD in why and math.isfinite(float(value)) else None)
        if NONFINITE_GRAD in why and far is not None:  # finite, but a diverging training
            # (reverse mode's adjoints overflowed where forward mode's tangents did not: the
            # advice blamed the method and advised method='reverse' to reverse mode itself)
            msg = (f"stopped at outer step {self.outer_step}: {why}, with hyperparameters "
                   f"{bad}: the training was finite but diverging ({far}), and the "
                   f"derivatives of such a training overflow. Make the inner training stable "
                   f"first: a smaller learning rate (Guards(bounds=...) on it), or the inner "
                   f"optimizer's clip_grad_norm. {kept[0].upper()}{kept[1:]}: "
                   f"{hps.describe(keep)}.")
        elif NONFINITE_GRAD in why:  # the training was finite: not a learning rate's doing
            other = ("" if self.method.name == "reverse"
                     else ", or try method='reverse'")
            # in a low precision, rounding alone: a float32 Adam tangent over 3000 steps grew
            # to inf where the float64 one stays below 44, and reverse mode's float32 adjoint
            # was within 3e-5; an inner training at the edge of stability has a derivative
            # beyond float32's range (1.7e48 in float64); the numerics probe, 2026-12-07
            low = ("" if self.problem.dtype == torch.float64 else
                   f"; in {self.problem.dtype}, also rounding: a tangent or adjoint can "
                   f"overflow where float64's does not (build the problem in float64: "
                   f"model.double() and float64 data), or the inner training is at the edge of "
                   f"stability, its derivative beyond {self.problem.dtype}'s range (a smaller "
                   f"learning rate)")
            msg = (f"stopped at outer step {self.outer_step}: {why}, with hyperparameters "
                   f"{bad}: the training was finite, its hypergradient was not. That comes "
                   f"from the method ({repr(self.method)}), the inner optimizer's tangent "
                   f"rule, or a loss whose derivative is not finite there (sqrt or abs at 0, a "
                   f"log of 0); compare methods with hypergrad.testing.hypergradcheck in "
                   f"float64{other}{low}. {kept[0].upper()}{kept[1:]}: "
                   f"{hps.describe(keep)}.")
            data = self.problem.non_finite_closure()
            if data:  # an inf the loss saturates (tanh) is finite there, its derivative not
                msg = (f"stopped at outer step {self.outer_step}: {why}, with hyperparameters "
                       f"{bad}: the training was finite, its hypergradient was not, and data a "
                       f"loss reads is not: {data}. A layer that saturates (tanh, a clamp) "
                       f"keeps the loss finite at an inf input, but its derivative there is "
                       f"NaN (inf x 0), in every method. Clean the data (e.g. keep = "
                       f"torch.isfinite(x).flatten(1).all(1); x, y = x[keep], y[keep]) and run "
                       f"again. {kept[0].upper()}{kept[1:]}: {hps.describe(keep)}.")
        if self.tracker.best is None and (data := self.problem.non_finite_batch()):
            # nothing ever trained finitely: a NaN in data read lazily (a stream, a callable;
            # the up-front check sees their batch 0 only) looks like a diverging learning rate
            msg = (f"stopped at outer step {self.outer_step}: {why}, and the training data is "
                   f"not finite: {data}. That is a data problem, not a learning rate; clean the "
                   f"data (e.g. keep = torch.isfinite(x).flatten(1).all(1); x, y = x[keep], "
                   f"y[keep]) and run again. Returned the initial hyperparameters: "
                   f"{hps.describe(keep)}.")
        if not math.isfinite(float(value)) and not self.mode.online:
            where = self._nonfinite_from(lam_used)
            if where:
                msg = f"{msg} {where}"
        elif NONFINITE_GRAD in why and not self.mode.online:
            where = self._tangents_nonfinite_from(lam_used)
            if where:
                msg = f"{msg} {where}"
        self.message(msg)
        if self.folder is not None:
            # on every rank (a split run gathers its columns): the checkpoint written where the
            # run diverged before its first, so the folder keeps why it stopped
            first = self._checkpoint()
            if self.strategy.is_writer:
                self.folder.mark_stopped(self.problem.device, self.lam, msg, first=first,
                                         gradless=self.tracker.state_dict()["gradless"])
        return TrainResult(keep.clone(), hps.describe(keep), copy.deepcopy(self.history),
                           self.method.name, diverged=True, message=msg, state=None,
                           last_lam=bad_lam, last_values=bad, best_step=keep_step,
                           best_val_loss=None if math.isnan(keep_val) else keep_val,
                           last_val_loss=last_val, best_select_loss=sel)

    def _nonfinite_from(self, lam: Tensor) -> str:
        """Where a plain run at ``lam`` first holds a non-finite parameter, and its training
        loss there, as a sentence ("" where none does: the validation loss itself is not
        finite). One plain run with a check per step, only where a run stopped on a
        non-finite validation loss, which names neither the training nor its step: an inf
        training loss at step 7 of 12 read as "the validation loss is nan", with the advice of
        a smaller outer learning rate (the divergence probe, 2026-12-07 evening). Not for a
        streamed source (another pass would be read: its runs are the costly ones)."""
        p = self.problem
        if p.stream is not None:
            return ""
        try:
            with torch.no_grad():
                s = p.initial_state(lam)
                for t in range(p.steps):
                    new = p.step(s, lam, t)
                    if not all(bool(torch.isfinite(v).all()) for v in new.params.values()):
                        loss = float(p.train_objective(s.params, s.buffers, lam, t,
                                                       p.batch(t))[0])
                        return (f"In a plain run at these hyperparameters the parameters are "
                                f"first non-finite after inner step {t} of {p.steps}, whose "
                                f"training loss is {loss:.4g}: the training "
                                + ("loss itself is not finite there, on that step's batch at "
                                   "these hyperparameters (a division by, or a log of, "
                                   "something that reaches 0; a non-finite value in that "
                                   "batch): fix the loss or the data there, or bound the "
                                   "hyperparameter it divides by." if not math.isfinite(loss) else
                                   "diverged there (a learning rate too large for it, "
                                   "or a gradient that overflows)."))
                    s = new
        except Exception:  # noqa: BLE001 - a diagnosis: the run already stopped on its own
            return ""
        return ""

    def _tangents_nonfinite_from(self, lam: Tensor) -> str:
        """Where forward mode's tangents at ``lam`` first hold a non-finite entry, and their
        largest entry until then, as a sentence ("" for another method or a streamed
        source, or where none does). One forward run, stepped, only where a run stopped on a
        hypergradient that was not finite at a finite validation loss: the message named no
        step (float32 SGD at lr 4: NaN, "edge of stability" among five causes; the chaos
        probe, 2026-12-08)."""
        from ..methods.forward import ForwardMode

        fm, p = self.method, self.problem
        if type(fm) is not ForwardMode or p.stream is not None:
            return ""
        try:
            with torch.no_grad():
                fs = fm.init(p, lam)
                largest = 0.0
                for t in range(p.steps):
                    fs = fm.step(p, fs, lam)
                    z = [x for x in tree_flatten(fs.tangents)[0] if isinstance(x, Tensor)]
                    if not all(bool(torch.isfinite(x).all()) for x in z):
                        return (f"Forward mode's tangents are first non-finite after inner "
                                f"step {t} of {p.steps} (their largest entry until then: "
                                f"{largest:.3g}, in {p.dtype}).")
                    largest = max([largest, *(float(x.abs().max()) for x in z if x.numel())])
        except Exception:  # noqa: BLE001 - a diagnosis: the run already stopped on its own
            return ""
        return ""

    # -- records and checkpoints -----------------------------------------------------------------
    def _record(self, value: Tensor, grad: Tensor, lam_used: Tensor, state: InnerState,
                seconds: float, inner_step: int | None = None, backtracked: bool = False,
                info: Mapping[str, Any] | None = None) -> None:
        rec: dict[str, Any] = {"outer_step": self.outer_step, "val_loss": float(value),
                               "hypergrad_norm": float(grad.detach().double().norm()),
                               "seconds": seconds,
                               "elapsed": self._elapsed(),
                               "hyperparams": self.problem.hyperparams.describe(lam_used)}
        if inner_step is not None:
            rec["inner_step"] = inner_step
        if backtracked:
            rec["backtracked"] = True
        if info:  # what an approximate method reports (ImplicitDiff: residual, iterations)
            rec["info"] = dict(info)
        if self.task.evaluate is not None and math.isfinite(rec["val_loss"]):
            rec.update(self.task.metrics(state, fields=rec, reserved=RECORD_FIELDS))
        self.history.append(rec)
        self.outer_step += 1
        if self.folder is not None:
            ck = self._checkpoint()  # on every rank: a split run's columns are gathered
            if self.strategy.is_writer:
                self.folder.write(ck, rec)
            self._mark_good(ck)  # the same state, not built again
        else:
            self._mark_good()
        self._emit_record(rec)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint: ``lam``, the outer optimizer, the history, the guards' tracker, the
        random generators, a streamed batch source's passes (:meth:`Stream.state_dict
        <hypergrad.data.Stream.state_dict>`) and, online, the method's run state (every rank
        of a split run must call it: the columns are gathered). A copy: the run going on
        changes nothing in it (it held the live history, so a dict taken at outer step 3 and
        loaded at the end doubled the records)."""
        self._run_fingerprint()
        return copy.deepcopy(self._checkpoint())

    def _mark_good(self, ck: dict[str, Any] | None = None) -> None:
        """Keep where an interrupted :meth:`fit` goes back to (the end of the last outer step,
        or the fit's start), in one process. The records (history, evaluations,
        selections, points searched from) are only ever appended to: the copy shares them.
        ``ck``: the checkpoint just written, where there is one (not built twice)."""
        if type(self.strategy) is not Strategy:
            return
        ck = (self._checkpoint(online=False) if ck is None
              else {k: v for k, v in ck.items() if k != "online"})  # (the run state: below)
        memo: dict[int, Any] = {id(x): x for rows in (self.history, self.evaluations,
                                                      self.selections, self._searched)
                                for x in rows}
        self._good = copy.deepcopy(ck, memo)
        # online: the run state itself (a method's step returns a new one, and leaves the
        # one it was given as it was)
        self._good_run = self.run_state

    def _checkpoint(self, online: bool = True) -> dict[str, Any]:
        """:meth:`state_dict` without the copy: what is written at once (``online``: with the
        online method's run state, gathered from every rank)."""
        ck: dict[str, Any] = {
            "version": CHECKPOINT_VERSION, "mode": self.mode.name,
            "outer_step": self.outer_step, "lam": self.lam.detach().clone(),
            "outer": self.outer.state_dict(), "outer_class": type(self.outer).__name__,
            "outer_given": self._outer_given,
            "method": self.method.name, "history": self.history, "backtracks": self._backtracks,
            "stopped": "", "fingerprint": self._fingerprint, "rng": rng_state(),
            **self.tracker.state_dict()}
        if self.selections:
            ck["selections"] = self.selections
        settings = getattr(self.outer, "resume_settings", None)
        if callable(settings):
            ck["outer_settings"] = settings()
        if self._over is not None:
            ck["descent_over"] = self._over
        if self._first_point is not None:
            ck["first_point"] = self._first_point
        if self.evaluations or self._starts_used or self._searched or self._recoveries:
            ck["search"] = {  # the plain runs' record and where the next restart draws
                "evaluations": self.evaluations, "starts_used": self._starts_used,
                "searched": self._searched, "recoveries": self._recoveries,
                "plain_seconds": self._plain_seconds}  # the reserve's forecast on a resume
        if online and self.run_state is not None:
            assert isinstance(self.method, OnlineMethod)
            ck["online"] = self.method.state_dict(self.problem, self.run_state)
        if self.problem.stream is not None:  # a DataLoader's passes: shuffles, worker seeds
            ck["batches"] = self.problem.stream.state_dict()
        return ck

    def load_state_dict(self, ck: dict[str, Any], path: Path | str | None = None) -> None:
        """Continue from a checkpoint (see :meth:`state_dict`), after checking it fits: the
        same problem and settings (a :class:`~hypergrad.errors.ResumeMismatchError` names what
        differs). ``path``: where it was read from, for the messages."""
        path = Path(path) if path is not None else Path("<the state given>")
        version = ck.get("version", 0)
        if not isinstance(version, int) or version > CHECKPOINT_VERSION:
            raise ResumeMismatchError(
                f"Trainer: cannot resume from {path}: it was written by a later hypergrad "
                f"(checkpoint format {version!r}; this one reads formats up to "
                f"{CHECKPOINT_VERSION}). Resume with that version (pip install -U "
                f"hypergrad-forward), or start a new run.")
        self.strategy.check_resume(ck.get("fingerprint"), path)
        check_resume(ck, path, self._run_fingerprint(), self.lam.shape[0],
                     searching=not self.mode.online and isinstance(self.outer, SearchOptimizer))
        load_outer(self.outer, ck, path, self.message)
        name = ck.get("method", self.method.name)
        if not self.mode.online and name != self.method.name:
            self.message(f"resume: the checkpoint's run used method={name}, this "
                         f"one uses {self.method.name} (the same hypergradients to rounding)")
        with torch.no_grad():
            self.lam.copy_(ck["lam"])
        if self.mode.online and ck.get("online") is not None:
            assert isinstance(self.method, OnlineMethod)
            entry = ck["online"]
            self.run_state = self.method.load_state_dict(self.problem, self.lam.detach().clone(),
                                                         entry, str(path))
            if entry["method"] != self.method.name:
                self.message(f"resume: the online run state of {entry['method']} "
                             f"carries over to {self.method.name}, whose hypergradients are "
                             f"used from here on")
        if ck.get("inner") is not None and not self.mode.online:  # written within an inner run
            self._inner = (ck["inner"], str(path))
        self._restore(ck)
        if self.folder is not None and self.strategy.is_writer:
            self.folder.rewrite_metrics(self.history)  # agrees with the checkpoint again
        budget = self.guards.time_budget
        # the budget is per fit() call: a finished run resumed (a requeued job) tunes again
        self.message(f"resumed from {path} at outer step {self.outer_step}" + (
            f"; time_budget={budget:g} s counts this invocation's time, so a run that had "
            f"ended on its budget tunes for another" if budget is not None
            and not self.mode.online else ""))
        if ck.get("stopped"):
            # online: Guards(backtrack=...) is refused, and the update undone is not taken
            # again from the same state
            change = ("a smaller outer learning rate, tighter bounds or a longer interval"
                      if self.mode.online else "Guards(backtrack=1.5), a smaller outer "
                      "learning rate or tighter bounds")
            again = ("" if self.mode.online else "with the same settings it takes the same "
                     "steps again: ")
            self.message(f"that run had stopped on a divergence; continuing from "
                         f"the hyperparameters it kept: "
                         f"{self.problem.hyperparams.describe(self.lam)} ({again}change what "
                         f"diverged, e.g. {change})")

    def _restore(self, ck: dict[str, Any]) -> None:
        """The run's state from a checkpoint (:meth:`load_state_dict`, after its checks and
        the outer optimizer's and online state's) or from the last outer step's end (an
        interrupted :meth:`fit`)."""
        with torch.no_grad():
            self.lam.copy_(ck["lam"])
        self.history = list(ck["history"])
        self._elapsed_resumed = float(ck.get("elapsed_done", 0.0))
        self.tracker.load_state_dict(ck, self.lam)
        self.selections = [dict(r, lam=r["lam"].to(self.lam)) for r in ck.get("selections", [])]
        self._backtracks = int(ck.get("backtracks", 0))
        over = ck.get("descent_over")
        self._over = over if over in _OVER else None
        self._first_point = None
        if ck.get("first_point") is not None:
            v, x, k = ck["first_point"]
            self._first_point = (float(v), x.to(self.lam), int(k))
        search = ck.get("search") or {}
        self.evaluations = [dict(e, lam=e["lam"].to(self.lam))
                            for e in search.get("evaluations", [])]
        self._starts_used = int(search.get("starts_used", 0))
        self._searched = [x.to(self.lam) for x in search.get("searched", [])]
        self._recoveries = int(search.get("recoveries", 0))
        if search.get("plain_seconds") is not None:
            self._plain_seconds = float(search["plain_seconds"])
        self.outer_step = int(ck["outer_step"])
        set_rng_state(ck["rng"])
        if self.problem.stream is not None and ck.get("batches") is not None:
            self.problem.stream.load_state_dict(ck["batches"])  # after the online run's init
