"""Forward mode (Franceschi et al. 2017, RTHO/forward HO): carry ``Z_t = d s_t / d lam``.

Per step, with all K columns at once:

- ``G_t = H_t Z^w_{t-1} + (d^2 L / dw dlam) I_K`` from the HVP strategy (one gradient, one batched
  call per chunk of columns);
- ``Z_t = dU/ds Z_{t-1} + dU/dg G_t + dU/dh dh_t/dlam``, the tangent of the optimizer's pure
  update, by a :class:`~hypergrad.tangent.TangentRule` (default: the optimizer's own closed
  form, else its diagonal Jacobian, else ``jvp`` under ``vmap``; :mod:`hypergrad.tangent`);
- at any step, ``dE/dlam = sum <Z_T, dE/ds_T> + dE/dlam|direct``.

Memory is ``O(K |s|)``, independent of ``T``.

Work the step does not do, because its result is known exactly:

- columns of :class:`~hypergrad.Schedule` windows that have not started: no step so far has read
  them, so their tangents are exactly zero and this step cannot change them. They get no
  Hessian-vector product and no update tangent, and stay zero (an 8-window schedule computes
  4.5 of its 8 columns on average). A column whose tangent is not zero (a user-made state) is
  never skipped.
- ``dU/dh dh_t/dlam``, the hyperparameters' own term of the update, is taken only for the
  columns the optimizer reads at this step (its bound hyperparameters; one window of a
  schedule), not for all K. For weight decay that term is ``(d wd / d lam) * w`` and the state
  term is ``wd * Z``: both elementwise, neither through the Hessian-vector product.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.func import grad_and_value, jvp, vmap
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import flag
from ..footprint import mark as _fp_mark
from ..hvp import HVPStrategy, VmapVJP
from ..hyperparams import HyperParameter
from ..problem import InnerProblem, InnerState
from ..tangent import AutoTangent, TangentRule, UpdateStep
from .base import MemoryEstimate, OnlineMethod, Sizes, checked, gib, within_horizon

__all__ = ["ForwardMode", "ForwardState", "ColumnPlan", "initial_tangents"]


class ForwardState(NamedTuple):
    """The inner state, its tangents (each tensor with a leading axis of size K) and the index of
    the next step."""

    state: InnerState
    tangents: InnerState
    step: int


class ColumnPlan:
    """Which raw columns a problem's step ``t`` reads, from the hyperparameters' structure.

    ``first_read[c]``: the first step that reads column ``c`` (schedule windows start late; every
    other kind is read from step 0); ``T`` for a window no step reads. ``optimizer_columns(t)``:
    the columns the optimizer's update reads at step ``t``.
    """

    def __init__(self, problem: InnerProblem) -> None:
        hps, horizon = problem.hyperparams, problem.steps
        self.k = hps.num_raw
        self.horizon = horizon
        self.first_read = [0] * self.k
        for item, sl in zip(hps.items, hps.slices.values()):
            self.first_read[sl] = item.first_reads(horizon)
        self._opt_static: list[int] = []
        self._opt_by_step: list[tuple[HyperParameter, int]] = []  # read in part, by step
        for name in problem.optimizer.bound_names():
            item, sl = hps.by_name[name], hps.slices[name]
            if item.read_at(0, horizon) is None:
                self._opt_static.extend(range(sl.start, sl.stop))
            else:
                self._opt_by_step.append((item, sl.start))
        self.has_late = any(f > 0 for f in self.first_read)

    def not_started(self, t: int) -> list[int]:
        """Columns no step before or at ``t`` reads."""
        if not self.has_late:
            return []
        return [c for c, f in enumerate(self.first_read) if f > t]

    def costs(self, skip_zero_columns: bool = True) -> list[float]:
        """Steps at which each column is computed: ``T`` minus the first step that reads it
        where forward mode skips columns that have not started (schedule windows), else
        ``T`` (the work a column-parallel rank carries per column)."""
        if not skip_zero_columns:
            return [float(self.horizon)] * self.k
        return [float(self.horizon - f) for f in self.first_read]

    def optimizer_columns(self, t: int) -> list[int]:
        cols = set(self._opt_static)
        for item, start in self._opt_by_step:
            cols.update(start + c for c in item.read_at(t, self.horizon) or [])
        return sorted(cols)


def _zero_columns(z: InnerState, cols: list[int]) -> bool:
    """Whether the tangent columns ``cols`` are exactly zero in every state tensor."""
    idx = None
    for v in tree_flatten(z)[0]:
        if idx is None:
            idx = torch.tensor(cols, device=v.device)
        if v.index_select(0, idx).any():
            return False
    return True


def _map(f: Callable[[Tensor], Tensor], tree: Any, consume: bool = False) -> Any:
    """``tree_map`` over a tangent state (NamedTuples, dicts, lists and tuples of tensors),
    without the generic pytree's bookkeeping: it runs on every row gather and scatter of a
    step, where torch's ``tree_map`` took a fifth of a small model's step. ``consume``: each
    dict's and list's entries are replaced in place as it goes, so a leaf is freed once mapped
    (where nothing else holds it): ``tree``'s dicts and lists are the caller's to give up."""
    if isinstance(tree, Tensor):
        return f(tree)
    if isinstance(tree, (dict, list)) and consume:
        for key in (list(tree) if isinstance(tree, dict) else range(len(tree))):
            tree[key] = _map(f, tree[key], True)
        return tree
    if isinstance(tree, dict):
        return {k: _map(f, v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        items = [_map(f, v, consume) for v in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else tuple(items)
    if isinstance(tree, list):
        return [_map(f, v) for v in tree]
    return tree_map(f, tree)  # anything else: the generic path


def _versions(tree: Any) -> tuple[int, ...]:
    """The in-place versions of a tangent state's tensors (``Tensor._version``): an edit of
    one in place since the last step changes them."""
    return tuple(x._version for x in tree_flatten(tree)[0] if isinstance(x, Tensor))


def _first_leaf(tree: Any) -> Tensor | None:
    """The first tensor of a tangent state (depth first, in order), or ``None``: its identity
    tells a step whether it gets back the state the last step returned."""
    if isinstance(tree, Tensor):
        return tree
    items = tree.values() if isinstance(tree, dict) else tree
    if isinstance(items, (tuple, list)) or isinstance(tree, dict):
        for v in items:
            leaf = _first_leaf(v)
            if leaf is not None:
                return leaf
    return None


def _rows(tree: Any, idx: Tensor, prefix: bool) -> Any:
    """Rows ``idx`` of every leaf (views where ``prefix``: ``idx`` is ``0..n-1``, which the
    caller knows without reading ``idx`` back from its device)."""
    n = idx.numel()
    if prefix:
        return _map(lambda v: v[:n], tree)
    return _map(lambda v: v.index_select(0, idx), tree)


def _scatter(tree: Any, idx: Tensor, k: int, prefix: bool) -> Any:
    """Rows ``idx`` of a zero tree with leading axis ``k`` set to ``tree``, whose dicts and
    lists it takes over: each leaf of ``n`` rows is freed once its ``k`` rows are made (all of
    them held until the end had put a step's peak 1.3-1.7x above its estimate). ``prefix``: as
    :func:`_rows`'s."""
    n = idx.numel()

    def one(v: Tensor) -> Tensor:
        if prefix:
            out = v.new_empty((k, *v.shape[1:]))
            out[:n] = v
            out[n:] = 0
            return out
        return v.new_zeros((k, *v.shape[1:])).index_copy_(0, idx, v)

    return _map(one, tree, consume=True)


AUTO_COMPILE_AFTER_S = float(os.environ.get("HYPERGRAD_AUTO_COMPILE_AFTER_S", "30"))
"""Seconds of eager steps after which ``ForwardMode(compile=None)`` measures whether compiling
the products pays (a compilation takes 5-40 s; a run that has already stepped this long is
likely long enough to repay it). The environment variable ``HYPERGRAD_AUTO_COMPILE_AFTER_S``
sets it for a process (``inf``: never)."""


class _AutoCompile:
    """``ForwardMode(compile=None)``'s measurement: eager steps until their seconds reach
    ``after_s`` (read from :data:`AUTO_COMPILE_AFTER_S` when created); then, within one step,
    the products of that step's inputs eager 4 times and compiled 4 times (the first of each
    untimed: warm-up, compilation), synchronized on CUDA; the compiled strategy kept if its
    median is at least 10 % below eager's. The same inputs for both: a schedule's columns start
    over the run, so steps apart would not compare. The compiled products pad their columns to
    at most :data:`~hypergrad.hvp.COMPILE_BUCKETS` counts, so the columns that start later
    compile a few shapes, not one per count."""

    REPEATS = 3

    def __init__(self) -> None:
        self.after_s = AUTO_COMPILE_AFTER_S
        self.spent = 0.0
        self.report: dict[str, Any] | None = None

    def step(self, fm: ForwardMode, problem: InnerProblem, fs: ForwardState, lam: Tensor,
             columns: Sequence[int] | None) -> ForwardState:
        if self.spent < self.after_s:
            t0 = time.perf_counter()
            out = fm._step(problem, fs, lam, columns)
            self.spent += time.perf_counter() - t0
            return out
        eager = fm.hvp
        assert isinstance(eager, VmapVJP)
        trial = _Trial(eager, VmapVJP(eager.chunk_size, eager.memory_budget, compile=True),
                       lam.device, self.REPEATS)
        fm.hvp = trial  # type: ignore[assignment]
        t0 = time.perf_counter()
        try:
            out = fm._step(problem, fs, lam, columns)
        finally:
            fm.hvp = eager
        trial_s = time.perf_counter() - t0
        keep = trial.compiled_s is not None and trial.compiled_s <= 0.9 * trial.eager_s
        if keep:
            fm.hvp = trial.compiled
        self.report = {
            "eager_ms": 1e3 * trial.eager_s,
            "compiled_ms": None if trial.compiled_s is None else 1e3 * trial.compiled_s,
            "compile_s": trial.compile_s, "after_s": self.spent,
            # the measuring step's seconds beyond a step: not a cost of the steps to come
            "trial_s": max(trial_s - (trial.compiled_s or trial.eager_s), 0.0),
            "chosen": "compiled" if keep else "eager",
            "reason": trial.failed or ("at least 10 % faster" if keep
                                       else "not 10 % faster than eager")}
        return out


def _check_tangent_shapes(problem: InnerProblem, before: dict[str, Tensor],
                          after: dict[str, Tensor], before_opt: Any, after_opt: Any) -> None:
    """Refuse parameter tangents a tangent rule returned in another shape or dtype than it was
    given (rows x the parameter's shape), and an optimizer-state tangent of another type than
    the state's: an inner optimizer's own closed form that got them wrong was blamed on the
    caller's run state at the next step, or failed in torch ("addmv input tensors must have
    the same dtype", "unhashable type: 'dict'", "'tuple' object has no attribute 'm'": the
    extending probes)."""
    rule = f"ForwardMode: the tangent rule of {problem.optimizer!r}"
    if not isinstance(after, Mapping) or type(after_opt) is not type(before_opt):
        raise TypeError(
            f"{rule} returned ({type(after).__name__}, {type(after_opt).__name__}) where it was "
            f"given ({type(before).__name__}, {type(before_opt).__name__}): its tangent() must "
            f"return (parameter tangents {{name: tensor}}, the optimizer state's tangent as "
            f"the same NamedTuple as the state, e.g. type(ctx.z_state)(...)) "
            f"(docs/extending.md).")
    if set(after) != set(before):
        missing, extra = sorted(set(before) - set(after))[:3], sorted(set(after) - set(before))[:3]
        raise ValueError(
            f"ForwardMode: the tangent rule of {problem.optimizer!r} returned parameter "
            f"tangents for other parameters (missing: {missing}; not parameters: {extra}): its "
            f"tangent() must return one tangent per parameter it was given (docs/extending.md).")
    for k, z in before.items():
        if after[k].shape != z.shape:
            raise ValueError(
                f"ForwardMode: the tangent rule of {problem.optimizer!r} returned the tangent of "
                f"{k!r} with shape {tuple(after[k].shape)}, where it was given {tuple(z.shape)} "
                f"(tangent rows x the parameter's shape): its tangent() must keep each "
                f"tangent's shape (docs/extending.md).")
        if after[k].dtype != z.dtype:
            raise TypeError(
                f"{rule} returned the tangent of {k!r} in {after[k].dtype}, where it was given "
                f"{z.dtype}: its tangent() must keep each tangent's dtype (a .float() or a "
                f"float32 constant tensor in a float64 problem; docs/extending.md).")


def _check_run(who: str, problem: InnerProblem, fs: ForwardState, lam: Tensor,
               columns: Sequence[int] | None) -> None:
    """Refuse a run state made for another problem: other parameters, or tangent rows for
    another number of hyperparameters (a K = 3 state stepped with a K = 37 problem failed as
    an IndexError, the other way round it was read as 3 rows, silently)."""
    want = set(problem.fmodel.param_names)
    if fs.state.params.keys() != want:
        names = set(fs.state.params)
        extra, missing = sorted(names - want)[:3], sorted(want - names)[:3]
        raise ValueError(
            f"{who}: the run state's parameters are not this problem's (not in the problem: "
            f"{extra}; missing: {missing}): pass the state that init() made for this problem.")
    k = lam.shape[0] if columns is None else len(columns)
    # every tangent has the rows init() gave them: the parameters' first one tells (a whole
    # tree_flatten per step cost 20 us)
    first = next(iter(fs.tangents.params.values()), None)
    rows = None if first is None else int(first.shape[0])
    if rows is not None and rows != k:
        raise ValueError(
            f"{who}: the run state's tangents have [{rows}] rows but this problem has "
            f"K = {k} {'columns here' if columns is not None else 'hyperparameters'}: a state "
            f"made by init() for another problem (or other columns). Pass the state that "
            f"init() made for this problem and lam.")


class _Trial:
    """Stands in for the products of one step: runs ``eager`` and ``compiled`` on its inputs,
    times both, and returns eager's result."""

    def __init__(self, eager: VmapVJP, compiled: VmapVJP, device: torch.device,
                 repeats: int) -> None:
        self.eager, self.compiled, self.device, self.repeats = eager, compiled, device, repeats
        self.eager_s = 0.0
        self.compiled_s: float | None = None
        self.compile_s = 0.0
        self.failed = ""

    def _timed(self, fn: Any, *args: Any) -> tuple[Any, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        out = fn(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return out, time.perf_counter() - t0

    def __call__(self, *args: Any) -> Any:
        result, _ = self._timed(self.eager, *args)  # warm: the column costs, caches
        times = [self._timed(self.eager, *args)[1] for _ in range(self.repeats)]
        self.eager_s = statistics.median(times)
        f, params, buffers, lam, _, _, eye = args
        if self.eager.columns_per_call(f, params, buffers, lam, eye.shape[0]) < eye.shape[0]:
            # each chunk's slice of the columns would compile on its own
            self.failed = "not tried: the products run in chunks (the memory budget)"
            return result
        with warnings.catch_warnings():  # a model it cannot trace: eager, said in the report
            warnings.simplefilter("ignore")
            _, self.compile_s = self._timed(self.compiled, *args)
        if self.compiled._compile_failed:
            self.failed = "torch.compile cannot trace this model"
            return result
        times = [self._timed(self.compiled, *args)[1] for _ in range(self.repeats)]
        self.compiled_s = statistics.median(times)
        return result


def initial_tangents(problem: InnerProblem, lam: Tensor, columns: Sequence[int] | None = None
                     ) -> tuple[InnerState, InnerState]:
    """``s_0`` at ``lam`` and ``Z_0 = d s_0 / d lam``, every tensor with a leading axis of size K
    (``jvp`` of :meth:`~hypergrad.InnerProblem.initial_state` under ``vmap`` over the identity).
    ``columns``: only these columns, in this order (a rank's share in column-parallel runs,
    :mod:`hypergrad.distributed`).
    """
    eye = torch.eye(lam.shape[0], dtype=lam.dtype, device=lam.device)
    if columns is not None:
        eye = eye[list(columns)]
    s0 = problem.initial_state(lam)
    z0 = vmap(lambda e: jvp(problem.initial_state, (lam,), (e,))[1])(eye)
    return s0, z0


class ForwardMode(OnlineMethod, name="forward"):
    """Forward-mode hypergradients.

    Args:
        hvp: how to compute the K Hessian-vector products of a step (default :class:`VmapVJP`,
            chunked from its memory budget).
        tangent: how to get the tangent of the optimizer's update (default
            :class:`~hypergrad.tangent.AutoTangent`: the optimizer's closed form, else its
            diagonal Jacobian, else ``jvp``; :mod:`hypergrad.tangent`).
        skip_zero_columns: skip the columns of schedule windows that have not started (exactly
            zero; see the module docstring). ``False`` computes all K columns at every step
            (the dense reference; results are equal).
        compile: run the gradient and the K batched Hessian-vector products of every step
            through ``torch.compile`` (``VmapVJP(compile=True)``): 2-3x faster steps on small
            models, where eager dispatch dominates, after 5-20 s of compilation, so it pays on
            long runs (docs/benchmarks.md, "against JAX"); same results to rounding. ``None``
            (the default; with a :class:`VmapVJP` strategy): decided by measurement, once this
            object has spent :data:`AUTO_COMPILE_AFTER_S` seconds in eager steps (a run long enough
            to repay a compilation): one step's products are timed eager and compiled on the
            same inputs, and the compiled path kept if it is at least 10 % faster, else eager
            for good; not tried where the products run in chunks (each chunk's shape would
            compile anew; columns that start later are padded to a few counts,
            :data:`hypergrad.hvp.COMPILE_BUCKETS`) (:attr:`compile_report` says what was
            measured; the
            compilation's seconds are spent in the run, so a time budget counts them).
            ``False``: never compile.

    Example:
        >>> fm = ForwardMode()
        >>> hg = fm.hypergradient(problem, problem.init_raw())  # doctest: +SKIP
        >>> # or step by step, with the hypergradient available at any step:
        >>> fs = fm.init(problem, lam); fs = fm.step(problem, fs, lam)  # doctest: +SKIP
        >>> E, dE = fm.hypergradient_at(problem, fs, lam)  # doctest: +SKIP
    """

    def __init__(self, hvp: HVPStrategy | None = None, *, tangent: TangentRule | None = None,
                 skip_zero_columns: bool = True, compile: bool | None = None) -> None:
        if hvp is not None and not isinstance(hvp, HVPStrategy):
            raise TypeError(f"ForwardMode: hvp must be an HVPStrategy such as VmapVJP(), got "
                            f"{type(hvp).__name__}.")
        if compile is not None and not isinstance(compile, bool):
            raise TypeError(f"ForwardMode: compile={compile!r} must be True, False or None "
                            f"(decide by measurement on long runs).")
        if compile is False and isinstance(hvp, VmapVJP) and hvp.compile:
            raise ValueError(f"ForwardMode: compile=False (never compile) with hvp={hvp!r}, "
                             f"which compiles; drop one: compile=False with hvp=VmapVJP() "
                             f"(eager), or compile=True.")
        if compile:
            if hvp is None:
                hvp = VmapVJP(compile=True)
            elif isinstance(hvp, VmapVJP):
                hvp = VmapVJP(hvp.chunk_size, hvp.memory_budget, compile=True)
            else:
                raise ValueError(f"ForwardMode: compile=True compiles VmapVJP's batched products "
                                 f"(the default strategy); got hvp={hvp!r}. Drop compile, or "
                                 f"use hvp=VmapVJP(...).")
        self.compile = compile
        if tangent is not None and not isinstance(tangent, TangentRule):
            raise TypeError(f"ForwardMode: tangent must be a TangentRule such as AutoTangent(), "
                            f"ClosedForm(), DiagonalJacobian() or JVP(), got "
                            f"{type(tangent).__name__}.")
        self.hvp = hvp if hvp is not None else VmapVJP()
        # None: decide by measurement, for VmapVJP (the only strategy that compiles)
        self._auto = (_AutoCompile() if compile is None and isinstance(self.hvp, VmapVJP)
                      and not self.hvp.compile else None)
        self.tangent = tangent if tangent is not None else AutoTangent()
        self.skip_zero_columns = flag("ForwardMode", "skip_zero_columns", skip_zero_columns)
        self._plans: weakref.WeakKeyDictionary[InnerProblem, ColumnPlan] = (
            weakref.WeakKeyDictionary())
        self._zero_memo: tuple[weakref.ref[Tensor], frozenset[int], tuple[int, ...]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Without the per-problem caches (weak references, which do not pickle): a
        ``ForwardMode()`` or a Trainer sent to a worker process (multiprocessing, joblib) failed
        with "cannot pickle 'weakref.ReferenceType' object"."""
        state = dict(self.__dict__)
        state["_plans"] = None
        state["_zero_memo"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._plans = weakref.WeakKeyDictionary()

    def _plan(self, problem: InnerProblem) -> ColumnPlan:
        plan = self._plans.get(problem)
        if plan is None or plan.k != problem.num_hyperparams or plan.horizon != problem.steps:
            plan = self._plans[problem] = ColumnPlan(problem)
        return plan

    def init(self, problem: InnerProblem, lam: Tensor, state: InnerState | None = None, *,
             columns: Sequence[int] | None = None) -> ForwardState:
        """Start at ``state`` with zero tangents, ``Z_0 = 0``; by default at the initial state
        for ``lam``, with ``Z_0 = d s_0 / d lam`` (non-zero for initialisation
        hyperparameters: :class:`~hypergrad.InitScale`, :class:`~hypergrad.InitWeights`).
        ``columns``: carry only these tangent columns (indices into ``lam``, in the order of the
        tangents' rows; ``None``: all K), as a column-parallel rank does. A new inner run:
        a streamed batch source begins a fresh pass (:meth:`InnerProblem.begin_run
        <hypergrad.InnerProblem.begin_run>`), of which a step holds only its own batch.

        The run starts at step 0 whatever ``state`` is (the schedules' window 0, batch 0): a
        state from ``problem.run(lam, stop=t)`` starts a new run there, it does not continue
        the one at step t. To continue from step t with the tangents reset there (a horizon
        truncated at t), ``forward.init(problem, lam, state)._replace(step=t)`` (a sequence or
        callable batch source: batches are read by step)."""
        checked(type(self).__name__, problem, lam)
        problem.begin_run()
        if state is None and problem.init_items:
            return ForwardState(*initial_tangents(problem, lam, columns), 0)
        s = problem.initial_state(lam) if state is None else state
        k = problem.num_hyperparams if columns is None else len(columns)
        z = tree_map(lambda v: torch.zeros((k, *v.shape), dtype=v.dtype, device=v.device), s)
        return ForwardState(s, z, 0)

    @property
    def compile_report(self) -> dict[str, Any] | None:
        """With ``compile=None``: what the measurement found, once it has run (``eager_ms``,
        ``compiled_ms`` per step's products, ``compile_s``, ``trial_s``: the measuring step's
        seconds beyond one step, ``chosen``: ``"compiled"`` or ``"eager"``, ``reason``);
        ``None`` before, or with ``compile`` given."""
        return None if self._auto is None else self._auto.report

    def step(self, problem: InnerProblem, fs: ForwardState, lam: Tensor, *,
             columns: Sequence[int] | None = None) -> ForwardState:
        """One inner step of the state and of its tangent columns: all K, or ``columns``
        (indices into ``lam``, in the order of the tangents' rows, as :meth:`init` made them).
        With ``columns`` the HVP strategy may get no column at all at a step (a rank whose
        columns have not started), and must still return the gradient."""
        within_horizon(type(self).__name__, problem, fs.step)
        _check_run(f"{type(self).__name__}.step", problem, fs, lam, columns)
        auto = self._auto
        if auto is None or auto.report is not None:
            return self._step(problem, fs, lam, columns)
        return auto.step(self, problem, fs, lam, columns)

    def _step(self, problem: InnerProblem, fs: ForwardState, lam: Tensor,
              columns: Sequence[int] | None) -> ForwardState:
        t = fs.step
        s, z = fs.state, fs.tangents
        batch = problem.batch(t)
        k = lam.shape[0]
        plan = self._plan(problem)
        eye = torch.eye(k, dtype=lam.dtype, device=lam.device)
        cols_held = list(range(k)) if columns is None else list(columns)
        n = len(cols_held)

        # rows whose tangent is zero and that this step cannot change: not computed
        live: Tensor | None = None
        # the live rows as a host list beside the tensor: reading them back (tolist, int of
        # the last) synced a CUDA device several times a step (the CUDA review, 2026-12-07)
        live_list: list[int] = []
        if self.skip_zero_columns:
            late = set(plan.not_started(t))
            rows = [i for i, c in enumerate(cols_held) if c in late]
            if rows and (self._known_zero(z, rows) or _zero_columns(z, rows)):
                dead_rows = set(rows)
                live_list = [i for i in range(n) if i not in dead_rows]
                live = torch.tensor(live_list, dtype=torch.long, device=lam.device)
        live_cols = cols_held if live is None else [cols_held[i] for i in live_list]
        prefix = bool(live_list) and live_list[-1] == len(live_list) - 1
        if live is not None:
            z_in = _rows(z, live, prefix)
        else:
            z_in = z
        if columns is None and live is None:
            eye_in = eye
        else:
            eye_in = eye.index_select(0, torch.tensor(live_cols, dtype=torch.long,
                                                      device=lam.device))

        def loss(p: Any, b: Any, lm: Tensor) -> Any:
            return problem.train_objective(p, b, lm, t, batch)

        with problem.second_order():  # attention and RNNs through kernels with a double backward
            g, new_b, G, zb = self.hvp(loss, s.params, s.buffers, lam, z_in.params,
                                       z_in.buffers, eye_in)

        cols = plan.optimizer_columns(t)
        pos = cols
        if columns is not None or live is not None:  # rows of the optimizer's columns computed
            pos_of = {c: i for i, c in enumerate(live_cols)}
            cols = [c for c in cols if c in pos_of]
            pos = [pos_of[c] for c in cols]
        out = self.tangent(UpdateStep(problem, t, lam, g, s, G, z_in, cols, pos, eye))
        if out is None:
            raise ValueError(f"ForwardMode(tangent={self.tangent!r}): that rule does not apply "
                             f"to {problem.optimizer!r}; use AutoTangent() (the default).")
        (params, opt), (zp, zo) = out
        _check_tangent_shapes(problem, z_in.params, zp, z_in.opt, zo)
        tangents = InnerState(zp, zb, zo)
        if live is not None:
            # the live rows' copy and the products freed before the rows are scattered into
            # K: the step's peak stays the one its estimate counts (it was 1.3-1.7x above)
            del out, G, z_in, zp, zb, zo
            tangents = _scatter(tangents, live, n, prefix)
            dead = frozenset(range(n)) - frozenset(live_list)
            leaf = _first_leaf(tangents)
            self._zero_memo = (None if leaf is None else
                               (weakref.ref(leaf), dead, _versions(tangents)))
        return ForwardState(InnerState(params, new_b, opt), tangents, t + 1)

    def _known_zero(self, z: InnerState, cols: list[int]) -> bool:
        """Whether ``z`` is the tangent state the last step returned with the rows ``cols`` left
        at zero, not edited in place since (then the check over the tensors is not needed; a
        row a user set in place was taken as zero and overwritten)."""
        if self._zero_memo is None:
            return False
        ref, dead, versions = self._zero_memo
        first = _first_leaf(z)
        return (first is not None and ref() is first and dead.issuperset(cols)
                and _versions(z) == versions)

    def estimate_memory(self, problem: InnerProblem,
                        sizes: Sizes | None = None) -> MemoryEstimate:
        """The peak of one step, independent of ``T``: the state and its K tangents, ``(K + 1)
        |s|``, held throughout, and the peak of what the step allocates
        (:mod:`hypergrad.methods.memory`), counted on fake tensors (:mod:`hypergrad.footprint`):

        - all K columns in one HVP call (the strategy's ``chunk_size`` / ``memory_budget``
          allow it): the whole step, its products then its update's tangent, counted as one
          run, so that the update sees the products' results as the strategy lays them out
          (a tangent rule writes into ``G``'s memory where it can, and copies it where ``G`` is
          not alone in its storage: ``vmap``'s convolution products);
        - chunked (``c < K`` columns per call): the larger of the products (:meth:`Sizes.hvp`:
          two chunks and the result they are written into) and the update: the gradient, the
          K columns' ``G`` and ``Z^b`` (``(K + 1)(|w| + |b|)``), and what the tangent rule
          allocates beside them.

        Where the rule cannot be counted, the update is taken as ``(K + 1) |s| + |w|`` (SGD with
        momentum's, measured); where the model cannot run on fake tensors, the products come
        from one real pass's activations (:meth:`Sizes.hvp`).
        """
        sz = Sizes.of(problem) if sizes is None else sizes
        k, hvp = problem.num_hyperparams, self.hvp
        state, w, b = sz.state, sz.params, sz.buffers
        held = (k + 1) * state + self._extra_held(k, state)
        cols = sz.columns(hvp, k)
        whole = self._count_step(problem, sz, k, cols) if cols >= k else None
        if whole is not None:
            call, peak = whole
            update = peak if peak > call else 0
        else:
            cols, call = sz.hvp(hvp, k)
            new = self._count_update(problem, sz, k)
            update = (w + b) * (k + 1) + new if new is not None else (k + 1) * state + w
            peak = max(call, update)
        objective = sz.objective()
        total = held + max(peak, objective)
        # the K x K identity each step builds for the products' directions: left out, an
        # estimate of 708 MiB at K = 50,000 per-example weights stood for a step that needs
        # 9.3 GiB for it alone in float32 (3.4x measured at K = 16,000; the scale probe)
        eye = k * k * torch.empty((), dtype=problem.dtype).element_size()
        total += eye
        plan = self._plan(problem)
        if self.skip_zero_columns and plan.has_late:
            # a step that skips columns scatters the computed rows into K leaf by leaf: one
            # leaf's computed rows beside its K (at most K rows of the largest parameter)
            fm = problem.fmodel
            total += k * max(fm.module.get_parameter(n).numel()
                             * fm.module.get_parameter(n).element_size() for n in fm.param_names)
            if plan.first_read != sorted(plan.first_read):
                # the live rows are not the first ones (a schedule declared before a
                # hyperparameter read from step 0): they are copied, not viewed (_rows), about
                # K rows of the parameters more (the estimate was 0.83-0.86 of the measured
                # peak, and 68 MiB apart between two orders of the same items; the memory probe)
                total += k * w
        phase = "the Hessian-vector products" if call >= update else "the update"
        detail = (f"a step's peak: {phase} (HVP call {gib(call)}"
                  + (f", update {gib(update)}" if update else "")
                  + ("" if sz.counted == "shapes" else ", from one real pass") + ")")
        if objective > peak:
            detail = (f"the validation loss's gradient ({gib(objective)}), above {detail}")
        if eye > 0.1 * total:
            detail += f"; the K x K identity of the products' directions {gib(eye)}"
        return MemoryEstimate(self.name, total, state, sz.activations, cols,
                              max(total - held - sz.activations, 0), 0, detail)

    def _extra_held(self, k: int, state: int) -> float:
        """Bytes a step holds besides the state and its tangents (MARTHE: the discounted copy)."""
        return 0.0

    def _update_args(self, problem: InnerProblem, sz: Sizes, k: int) -> Any:
        """What a count of the update's tangent takes: ``(t, the optimizer's columns, a builder
        of K zero columns shaped like a tensor)``."""
        t = 1 if problem.steps > 1 else 0  # the first step's update is a special case of SGD's
        cols = self._plan(problem).optimizer_columns(t)

        def zeros(v: Tensor) -> Tensor:
            return torch.zeros((k, *v.shape), dtype=v.dtype, device=v.device)

        return t, cols, zeros

    def _count_update(self, problem: InnerProblem, sz: Sizes, k: int) -> int | None:
        """What the tangent rule allocates at a step, beside the gradient, ``G`` (contiguous, as
        the chunks' result is) and ``Z^b``, counted on fake tensors."""
        if sz.spec is None:
            return None
        s, lam, _ = sz.spec
        t, cols, zeros = self._update_args(problem, sz, k)

        def build() -> tuple[Any, InnerState, Tensor]:
            return ({n: zeros(v) for n, v in s.params.items()}, tree_map(zeros, s),
                    torch.eye(k, dtype=lam.dtype, device=lam.device))

        def run(g: Any, st: InnerState, lm: Tensor, G: Any, z: InnerState, eye: Tensor) -> Any:
            return self.tangent(UpdateStep(problem, t, lm, g, st, G, z, cols, cols, eye))

        return sz.memo(("update", self.tangent, k),
                       lambda: sz.count(run, s.params, s, lam, build=build))

    def _count_step(self, problem: InnerProblem, sz: Sizes, k: int,
                    cols: int) -> tuple[int, int] | None:
        """``(products, step)``: the peak bytes of a step's products on all K columns in calls
        of ``cols``, and of the whole step (the products, then the update's tangent on their
        results), counted in one run on fake tensors beside the state and its tangents."""
        loss = sz.loss()
        if sz.spec is None or loss is None:
            return None
        s, lam, _ = sz.spec
        t, opt_cols, zeros = self._update_args(problem, sz, k)
        hvp = self.hvp

        def build() -> tuple[InnerState, Tensor]:
            return tree_map(zeros, s), torch.eye(k, dtype=lam.dtype, device=lam.device)

        def run(st: InnerState, lm: Tensor, z: InnerState, eye: Tensor) -> Any:
            # new_b and Z^b stay alive through the update, as in the step
            g, new_b, G, zb = hvp._call(loss, st.params, st.buffers, lm, z.params, z.buffers,
                                        eye, cols)
            _fp_mark("products")
            return self.tangent(UpdateStep(problem, t, lm, g, st, G, z, opt_cols, opt_cols,
                                           eye))

        def count() -> tuple[int, int] | None:
            marks: dict[str, int] = {}
            peak = sz.count(run, s, lam, build=build, marks=marks)
            return None if peak is None else (marks.get("products", peak), peak)

        return sz.memo(("step", hvp, self.tangent, k, cols), count)

    def across_ranks(self, ranks: Any) -> Any:
        """Columns split across the ranks, or mini-batches, or both
        (:class:`hypergrad.distributed.ParallelForward`). ``compile=None`` stays eager there:
        ranks that measured apart could decide apart, and a rank compiling for seconds would
        hold the others at a collective."""
        fm = self
        if self._auto is not None:
            fm = copy.copy(self)
            fm._auto = None
        return ranks.forward(fm)

    def with_hvp(self, hvp: HVPStrategy) -> ForwardMode:
        """This method with another HVP strategy (the rest shared)."""
        out = copy.copy(self)
        out.hvp = hvp
        out._auto = None  # a strategy given is kept
        out._plans = weakref.WeakKeyDictionary()
        out._zero_memo = None
        return out

    def hypergradient_at(self, problem: InnerProblem, fs: ForwardState, lam: Tensor, *,
                         columns: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        """``(E, dE/dlam)`` at the current step: ``Z^T grad_s E + dE/dlam|direct``. With
        ``columns`` (a state made with them), the rows of those columns, zero elsewhere."""
        _check_run(f"{type(self).__name__}.hypergradient_at", problem, fs, lam, columns)
        s, z = fs.state, fs.tangents
        (dp, db, direct), value = grad_and_value(problem.objective, argnums=(0, 1, 2))(
            s.params, s.buffers, lam)
        idx = None
        if columns is None:
            hg = direct.clone()
        else:
            idx = torch.tensor(list(columns), dtype=torch.long, device=lam.device)
            hg = direct.index_select(0, idx)
        for zs, ds in ((z.params, dp), (z.buffers, db)):
            for name, d in ds.items():
                hg = hg + zs[name].reshape(hg.shape[0], -1) @ d.reshape(-1)
        if idx is not None:
            hg = torch.zeros_like(direct).index_copy_(0, idx, hg)
        return value.detach(), hg.detach()

    def truncate(self, fs: ForwardState) -> ForwardState:
        """Tangents reset to zero (RTHO's truncation): later hypergradients see only the steps
        from here on."""
        return fs._replace(tangents=tree_map(torch.zeros_like, fs.tangents))

    def __repr__(self) -> str:
        extra = {True: ", compile=True", False: ", compile=False", None: ""}[self.compile]
        return f"{type(self).__name__}(hvp={self.hvp!r}, tangent={self.tangent!r}{extra})"
