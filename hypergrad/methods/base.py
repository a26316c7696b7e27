"""What every way of differentiating is, and the one registry of them by name.

A method is one object that owns its behaviour:

- its **name**: ``class MyMethod(Method, name="mine")`` registers it, so ``Trainer(method="mine")``
  and ``hypergrad-run method=mine`` build it (:func:`create`). Outside the process that defined
  it (a Hydra launcher's worker, a torchrun rank), a method is found by its import path
  (``"my_pkg.my_module.MyMethod"`` or ``"my_pkg.my_module:MyMethod"``; Hydra configs name it by
  ``_target_``) or by an entry point of the group ``hypergrad.methods`` of an installed package,
  so no registration rests on an import that only the parent process made.
- ``hypergradient(problem, lam)``: ``dE/dlam`` after ``problem.steps`` inner steps.
- ``resolve(problem, mode, memory_budget)``: the method that actually runs (itself, or the one
  :class:`~hypergrad.AutoMode` picks) and why.
- ``estimate_memory(problem, sizes)``: the bytes it needs (``None``: no estimate), asked by the
  auto choice and by the Trainer's memory guard before anything is allocated.
- ``fingerprint()``: the settings a resume must match (``{}`` for the exact methods, whose
  hypergradients agree to rounding; an approximate method's truncation length, discount, solver).
- ``across_ranks(ranks)``: the method a multi-process run uses (:mod:`hypergrad.distributed`);
  by default it refuses, naming itself.

:class:`OnlineMethod` adds what online tuning needs (RTHO): ``init`` a run, ``step`` it, the
``hypergradient_at`` any step, ``truncate``, and ``state_dict`` / ``load_state_dict`` of a run for
checkpoints. Its run state is a NamedTuple of tensors with at least ``state`` (the
:class:`~hypergrad.InnerState`) and ``step`` (the index of the next inner step).
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import math
import numbers
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import ResumeMismatchError
from ..footprint import FAKE_ERRORS, fake_mode, like, peak_bytes, saved_bytes
from ..hvp import HVPStrategy, VmapVJP
from ..optim.base import same_definition
from ..problem import InnerProblem, InnerState

__all__ = ["Method", "OnlineMethod", "HyperGradient", "MemoryEstimate", "Sizes", "register",
           "registered", "create", "ENTRY_POINTS", "gib"]

ENTRY_POINTS = "hypergrad.methods"
"""The entry-point group under which installed packages declare methods by name."""

_REGISTRY: dict[str, type[Method]] = {}


def within_horizon(who: str, problem: InnerProblem, t: int) -> None:
    """Refuse a step at ``t >= T``: past the problem's horizon a schedule reads its last window
    again and schedule-free AdamW's last step has handed out its averaged point, so the
    hypergradients that follow are of another run than the one defined (they were returned
    without a word)."""
    if not isinstance(t, numbers.Integral) or isinstance(t, bool) or t < 0:
        raise TypeError(f"{who}.step: the run's step must be an int >= 0, got {t!r} "
                        f"({type(t).__name__}); it counts the steps taken since init().")
    if t >= problem.steps:
        raise ValueError(
            f"{who}.step: the run is at step {t}, the end of the problem's horizon T = "
            f"{problem.steps}; a step past it is not part of the run the hyperparameters "
            f"define (a schedule's windows cover steps 0..T-1 only). For a longer run, build "
            f"the problem with more steps.")


def checked(who: str, problem: Any, lam: Any) -> None:
    """``problem.check(lam)``, after the arguments' types: a :class:`~hypergrad.Task` or the
    arguments swapped failed as ``'Task' object has no attribute 'check'``."""
    if not isinstance(problem, InnerProblem):
        hint = (" (the arguments are swapped: hypergradient(problem, lam))"
                if isinstance(lam, InnerProblem) else
                ": give task.problem" if hasattr(problem, "problem") else "")
        raise TypeError(f"{who}: problem must be an InnerProblem, got "
                        f"{type(problem).__name__}{hint}.")
    problem.check(lam)


def run_fingerprint(method: Method) -> dict[str, Any]:
    """What a resume compares of ``method``: its :meth:`~Method.fingerprint`, and for a
    method of one's own its class (a subclass of the same settings resumed a run as another
    method) and, where it keeps the default fingerprint, its attributes that are plain
    numbers, strings or bools (a finite-difference step changed 1e-4 -> 1e-2 was resumed
    silently: the default ``{}`` reads "an exact method, which a resume may switch"; the
    extending probe)."""
    fp = dict(method.fingerprint())
    cls = type(method)
    if _built_in(cls):
        return fp
    own: dict[str, Any] = {"method.class": f"{cls.__module__}.{cls.__qualname__}"}
    if cls.fingerprint is Method.fingerprint:
        own.update({f"method.{k}": v for k, v in sorted(_plain_settings(method).items())})
    return {**own, **fp}


def _built_in(cls: type) -> bool:
    """Whether ``cls`` is one of hypergrad's own (not a method of one's own)."""
    return cls.__module__.partition(".")[0] == "hypergrad"


def _plain_settings(method: Method) -> dict[str, Any]:
    """``method``'s public attributes that are plain values (None, bools, numbers, strings):
    the settings of a method of one's own, for its repr and its resume fingerprint."""
    return {k: v for k, v in vars(method).items()
            if not k.startswith("_") and (v is None or isinstance(v, (bool, int, float, str)))}


def gib(x: float) -> str:
    """Bytes in words: GiB from 1 GiB up, MiB below (no limit for ``inf``)."""
    if math.isinf(x):
        return "no limit (inf)"
    return f"{x / 2**30:.3g} GiB" if x >= 2**30 else f"{x / 2**20:.3g} MiB"


def budget_words(room: float) -> str:
    """A memory budget in words, with the likely unit mistake named where it is 1 KiB or less
    (``memory_budget=2.0`` meant as GiB: every method is refused for a 2-byte budget)."""
    if room > 2**10:
        return gib(room)
    return (f"{gib(room)} ({room:g} bytes: memory_budget is in bytes; {room:g} GiB would be "
            f"memory_budget={room * 2**30:.4g})")


class HyperGradient(NamedTuple):
    """Result of a hypergradient computation.

    objective: ``E(w_T, lam)``, 0-d. grad: ``dE/dlam``, shape ``(K,)`` (raw, unconstrained space).
    state: the inner state at step ``T``. info: what an approximate method reports about
    itself (:class:`~hypergrad.ImplicitDiff`: the solver's residual and iterations); ``None``
    for the others.
    """

    objective: Tensor
    grad: Tensor
    state: InnerState
    info: dict[str, Any] | None = None


@dataclass
class Sizes:
    """What memory estimates are made of, counted once per problem from shapes: ``state`` the
    bytes of the training state (parameters, buffers, optimizer state), ``params`` of the
    parameters, ``buffers`` of the model's state buffers (BatchNorm's running statistics),
    ``activations`` the bytes one gradient pass saves for backward (its forward pass as the
    second-order passes run it: attention's math kernel, :mod:`hypergrad.rnn`'s recurrent
    cells), ``batch`` the bytes of one mini-batch.

    ``counted``: ``"shapes"`` where the training loss ran on fake tensors
    (:mod:`hypergrad.footprint`: nothing is allocated, however large the model and the batch);
    then :meth:`count` and :meth:`hvp` count what a method's passes hold the same way.
    ``"a real pass"`` where it cannot (data-dependent Python control flow on tensors:
    ``.item()``, ``nonzero``, a boolean mask; an operator without a fake kernel; sparse
    tensors): one real forward pass counted the activations, and the estimates use the factors
    of :mod:`hypergrad.methods.memory` instead of counts."""

    state: int
    params: int
    activations: int
    batch: int = 0
    buffers: int = 0
    counted: str = "shapes"
    problem: InnerProblem | None = field(default=None, repr=False, compare=False)
    spec: tuple[InnerState, Tensor, Any] | None = field(default=None, repr=False,
                                                        compare=False)
    """The initial state and ``lam`` as fake tensors (shapes only), and mini-batch 0."""
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, problem: InnerProblem) -> Sizes:
        batch = problem.first_batch()
        nbytes = sum(x.numel() * x.element_size() for x in tree_flatten(batch)[0]
                     if isinstance(x, Tensor))

        def loss(p: Any, b: Any, lm: Any) -> Any:
            return problem.train_objective(p, b, lm, 0, batch)

        try:
            with counting(problem):
                raw = problem.init_raw()  # K numbers
                with fake_mode():  # the initial state's shapes, without its memory
                    fm = problem.fmodel
                    params = {k: like(fm.module.get_parameter(k)) for k in fm.param_names}
                    buffers = {k: like(v) for k, v in fm.initial_buffers().items()}
                    s = InnerState(params, buffers, problem.optimizer.init(params))
                    lam = like(raw)
                with problem.second_order():
                    act = saved_bytes(loss, s.params, s.buffers, lam, fake=True)
            counted = "shapes"
        except FAKE_ERRORS:  # the model cannot run on fake tensors: one real pass
            with torch.random.fork_rng(devices=[problem.device]
                                       if problem.device.type == "cuda" else []):
                s = problem.initial_state()
                lam = problem.init_raw()
                with problem.second_order():
                    act = saved_bytes(loss, s.params, s.buffers, lam, fake=False)
            counted = "a real pass"
        state = _nbytes(tree_flatten(s)[0])
        out = cls(state, _nbytes(s.params.values()), act, nbytes, _nbytes(s.buffers.values()),
                  counted, problem)
        if counted == "shapes":
            out.spec = (s, lam, batch)
        return out

    def count(self, run: Any, *inputs: Any, build: Any = None,
              marks: dict[str, int] | None = None) -> int | None:
        """Peak bytes of ``run(*inputs, *build())`` counted on fake tensors
        (:func:`hypergrad.footprint.peak_bytes`, in the problem's second-order kernels; ``marks``
        gets the peaks of its phases), or ``None`` where the sizes came from a real pass or
        ``run`` cannot run on fake tensors."""
        if self.counted != "shapes" or self.problem is None:
            return None
        try:
            with counting(self.problem), self.problem.second_order():
                return peak_bytes(run, *inputs, build=build, marks=marks)
        except FAKE_ERRORS:
            return None

    def loss(self) -> Any:
        """The training loss at step 0 on mini-batch 0, ``f(params, buffers, lam)``, as the
        HVP strategies take it (``None`` where the sizes came from a real pass)."""
        if self.spec is None or self.problem is None:
            return None
        problem, batch = self.problem, self.spec[2]

        def loss(p: Any, b: Any, lm: Any) -> Any:
            return problem.train_objective(p, b, lm, 0, batch)

        return loss

    def columns(self, strategy: HVPStrategy, k: int) -> int:
        """The columns per call ``strategy`` takes for ``k`` columns, as in training
        (:meth:`~hypergrad.hvp.HVPStrategy.columns_per_call`: its ``chunk_size``, or the most
        that fit its ``memory_budget`` at the bytes a column was counted to hold); from a real
        pass's activations ``a``, at ``column_bytes(a, |w|)`` per column."""
        loss = self.loss()
        if loss is not None and self.spec is not None and self.problem is not None:
            s, lam, _ = self.spec
            try:
                with counting(self.problem), self.problem.second_order():
                    return strategy.columns_per_call(loss, s.params, s.buffers, lam, k)
            except FAKE_ERRORS:
                pass
        if not getattr(strategy, "batched", True):  # ColumnLoop
            return 1
        return strategy.chunk_for(k, strategy.column_bytes(self.activations, self.params))

    def hvp(self, strategy: HVPStrategy, k: int) -> tuple[int, int]:
        """``(c, bytes)``: the columns per call ``strategy`` takes for ``k`` columns
        (:meth:`columns`) and the peak bytes of its products on all ``k`` columns as a step
        makes them (the gradient, its retained graph, the columns' results and intermediates;
        chunked, the result the chunks are written into), counted on fake tensors
        (:meth:`~hypergrad.hvp.HVPStrategy.footprint`): chunked, the first two chunks (a
        later chunk can hold more than the first: ``fwd_over_rev`` copies tangents that do not
        start at the beginning of their storage) and the rest of the result, ``(k - 2c)(|w| +
        |b|)``. From a real pass's activations ``a``: ``|w| + |b| + 2 a + c *
        column_bytes(a, |w|)`` (the retained graph measured 1.9-2.4 ``a`` on the bench_models
        rows), and the chunks' result ``k (|w| + |b|)`` besides."""
        c = self.columns(strategy, k)
        wb = self.params + self.buffers
        loss = self.loss()
        if loss is not None and self.spec is not None and self.problem is not None:
            s, lam, _ = self.spec
            n = k if c >= k else min(k, 2 * c)
            try:
                with counting(self.problem), self.problem.second_order():
                    got = strategy.footprint(loss, s.params, s.buffers, lam, n, c)
                return c, got + (k - n) * wb
            except FAKE_ERRORS:
                pass
        each = strategy.column_bytes(self.activations, self.params)
        return c, int(wb + 2 * self.activations + c * each + (k * wb if c < k else 0))

    def memo(self, key: Any, make: Any) -> Any:
        """``make()``, once per ``key`` for these sizes (the counts a method's estimate makes:
        every estimate of a problem shares them)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def objective(self) -> float:
        """Peak bytes of the validation objective's gradient ``dE/d(w_T, b_T, lam)`` beyond the
        state (the validation pass's graph and the gradient: every exact method takes it once
        per hypergradient, and a validation set larger than a mini-batch can make it a run's
        peak: 36 MiB on a 1500-example set where a step's peak was 5 MiB). Counted on fake
        tensors; where it cannot be, from one real validation pass: ``|w| + |b|`` for the
        gradient and the tensors the pass saves for backward."""
        from torch.func import grad_and_value

        problem = self.problem
        if problem is None:
            return 0.0
        if self.spec is not None:
            s, lam, _ = self.spec

            def run(st: InnerState, lm: Tensor) -> Any:
                return grad_and_value(problem.objective, argnums=(0, 1, 2))(
                    st.params, st.buffers, lm)

            got = self.memo("objective", lambda: self.count(run, s, lam))
            if got is not None:
                return got

        def real() -> float:
            with torch.random.fork_rng(devices=[problem.device]
                                       if problem.device.type == "cuda" else []):
                st, lm = problem.initial_state(), problem.init_raw()
                try:
                    act = saved_bytes(problem.objective, st.params, st.buffers, lm, fake=False)
                except FAKE_ERRORS:
                    return 0.0
            return float(self.params + self.buffers + act)

        return self.memo("objective_real", real)

    def step_vjp(self) -> float:
        """Peak bytes of one step's vector-Jacobian product beyond its inputs (the state and the
        adjoint): the step's gradient with its graph, the new state, the adjoint of the old one
        and the intermediates (:class:`~hypergrad.stepvjp.DoubleBackward`, counted on fake
        tensors, at step 1: an optimizer's first step can be a special case, as SGD's momentum
        buffer, which starts at the gradient). From a real pass's activations ``a``: ``2 |s| + 2 a
        + column_bytes(a, |w|)`` (the adjoint and the new state, the graph, one column)."""
        if self.spec is not None and self.problem is not None:
            (s, lam, batch), problem = self.spec, self.problem
            t = 1 if problem.steps > 1 else 0

            def step(st: InnerState, lm: Tensor) -> InnerState:
                g, nb = torch.func.grad(problem.train_objective, has_aux=True)(
                    st.params, st.buffers, lm, t, batch)
                params, opt = problem.update(g, st.opt, st.params, lm, t)
                return InnerState(params, nb, opt)

            def run(st: InnerState, lm: Tensor, adj: InnerState) -> Any:
                from ..stepvjp import DoubleBackward, direct_route

                if direct_route(problem):  # the route the real step VJP takes
                    got = DoubleBackward._direct(problem, st, lm, t, adj, batch)
                    if got is not None:
                        return got
                out: Any = torch.func.vjp(step, st, lm)  # (value, vjp_fn)
                return out[1](adj)

            got = self.memo("step_vjp", lambda: self.count(run, s, lam, s))
            if got is not None:
                return got
        return 2 * self.state + 2 * self.activations + VmapVJP().column_bytes(
            self.activations, self.params)


def counting(problem: InnerProblem) -> contextlib.AbstractContextManager[None]:
    """The context of a count on fake tensors: what the problem learns from a real evaluation
    (whether its loss draws random numbers, and how plain steps may draw them) is kept as it
    was, and the random streams too."""
    return _Counting(problem)


class _Counting:
    def __init__(self, problem: InnerProblem) -> None:
        self.problem = problem

    def __enter__(self) -> None:
        self.draws = self.problem.draws
        self.eager_draws = self.problem.eager_draws
        self.rng = torch.random.get_rng_state()

    def __exit__(self, *exc: Any) -> None:
        self.problem.draws = self.draws
        self.problem.eager_draws = self.eager_draws
        torch.random.set_rng_state(self.rng)


def _nbytes(xs: Any) -> int:
    return sum(x.numel() * x.element_size() for x in xs if isinstance(x, Tensor))


@dataclass
class MemoryEstimate:
    """Bytes a method needs at its peak: ``total`` = what it holds through the run (``states``
    stored states of ``state`` bytes for the reverse kinds; the state and its K tangents for the
    forward kinds) + ``activations`` + ``intermediates`` (the rest of its peak: the passes of
    one step). ``columns``: Hessian-vector columns per call, for the forward kinds. ``detail``:
    what the peak is made of, in words."""

    method: str
    total: float
    state: int
    activations: int
    columns: int = 0
    intermediates: float = 0.0
    states: int = 0
    detail: str = ""

    def __str__(self) -> str:
        held = gib(self.total - self.activations - self.intermediates)
        more = f"; {self.detail}" if self.detail else ""
        if self.columns:
            return (f"{self.method} {gib(self.total)} (tangents and state {held}, "
                    f"intermediates {gib(self.intermediates)}, {self.columns} HVP columns per "
                    f"call{more})")
        if self.states:
            return (f"{self.method} {gib(self.total)} ({self.states} stored states: {held}"
                    f"{more})")
        return f"{self.method} {gib(self.total)} (states and vectors {held}{more})"


class Method(abc.ABC):
    """How to differentiate the inner training with respect to ``lam``. All methods run the
    problem's one step function, so their agreement is a real test.

    A subclass registers itself by name with ``class MyMethod(Method, name="mine")``; see the
    module docstring for everything a method owns.
    """

    name: str = "abstract"

    def __init_subclass__(cls, name: str | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if name is not None:
            register(cls, name)

    @abc.abstractmethod
    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        """Train ``problem.steps`` inner steps at ``lam`` and return ``dE/dlam``."""

    def resolve(self, problem: InnerProblem, mode: str = "offline",
                memory_budget: float | None = None) -> tuple[Method, str]:
        """The method that runs ``problem`` in ``mode`` (``"offline"`` or ``"online"``) and why
        (empty: it was given). A concrete method is itself."""
        return self, ""

    def check(self, problem: InnerProblem) -> None:
        """Raise (naming the fix) when this method cannot differentiate ``problem`` at all, so
        that the :class:`~hypergrad.Trainer` refuses it before any training; nothing by
        default."""
        return None

    def estimate_memory(self, problem: InnerProblem,
                        sizes: Sizes | None = None) -> MemoryEstimate | None:
        """Rough bytes this method needs on ``problem`` (within a factor of about 2); ``None``
        when it has no estimate (then no memory check applies)."""
        return None

    def __repr__(self) -> str:
        """The class and its plain settings (a method of one's own was logged as ``<... object
        at 0x...>``); the built-in methods write their own."""
        plain = ", ".join(f"{k}={v!r}" for k, v in _plain_settings(self).items())
        return f"{type(self).__name__}({plain})"

    def fingerprint(self) -> dict[str, Any]:
        """The settings a resume must match (``{}`` for an exact method). A method of one's
        own (defined outside hypergrad) is also matched by its class, and where it does not
        override this, by its plain settings (:func:`run_fingerprint`)."""
        return {}

    def across_ranks(self, ranks: Any) -> Method:
        """The method a multi-process run uses (``ranks``: the run's
        :class:`~hypergrad.distributed.Ranks`). By default a method does not run across
        processes."""
        raise NotImplementedError(
            f"{type(self).__name__} does not run across processes; under torchrun use "
            f"method='forward' (its columns split) or 'reverse' (its batches split), or run one "
            f"process"
            + ("; a method of one's own runs across processes where it overrides "
               "across_ranks(ranks) (docs/extending.md)."
               if not _built_in(type(self)) else "."))


class OnlineMethod(Method):
    """A method that gives hypergradients during one run (online tuning)."""

    reaches_initial_weights = True
    """Whether the hypergradient at step ``T >= 1`` depends on the initial weights (a method
    whose carried derivatives are cut at every step, HD, gives exact zeros for
    :class:`~hypergrad.InitScale` and :class:`~hypergrad.InitWeights`: refused offline)."""

    @abc.abstractmethod
    def init(self, problem: InnerProblem, lam: Tensor, state: InnerState | None = None) -> Any:
        """The run state at step 0 (from ``state``, default the problem's initial state). A
        new inner run: call ``problem.begin_run()`` (a streamed batch source begins a fresh
        pass)."""

    @abc.abstractmethod
    def step(self, problem: InnerProblem, run: Any, lam: Tensor) -> Any:
        """One inner step of the run."""

    @abc.abstractmethod
    def hypergradient_at(self, problem: InnerProblem, run: Any,
                         lam: Tensor) -> tuple[Tensor, Tensor]:
        """``(E, dE/dlam)`` at the run's current step."""

    @abc.abstractmethod
    def truncate(self, run: Any) -> Any:
        """The run with its carried derivative information reset (truncation)."""

    def run(self, problem: InnerProblem, run: Any, lam: Tensor, stop: int | None = None) -> Any:
        """Steps until ``stop`` (default: the horizon ``T``)."""
        if stop is not None and (isinstance(stop, bool) or not isinstance(stop, numbers.Integral)
                                 or not 0 <= stop <= problem.steps):
            raise ValueError(
                f"{type(self).__name__}.run: stop={stop!r} must be a step in 0..T = "
                f"{problem.steps} (the problem's horizon; a schedule's windows cover those "
                f"steps only). For a longer run, build the problem with more steps.")
        if stop is not None and stop < run.step:
            raise ValueError(f"{type(self).__name__}.run: stop={stop} is before the run's "
                             f"step {run.step}; a run goes forward only.")
        for _ in range(run.step, problem.steps if stop is None else stop):
            run = self.step(problem, run, lam)
        return run

    def check(self, problem: InnerProblem) -> None:
        """A method whose hypergradient does not reach the initial weights (HD's one step)
        refuses initialisation hyperparameters, when it is built."""
        if not self.reaches_initial_weights and problem.steps > 0:
            refuse_initial_weights(problem, f"{self!r}", "its one-step hypergradient",
                                   "ForwardMode() or ReverseMode()")

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        # the method's own check: MARTHE's refusal of initialisation hyperparameters was
        # skipped here, and mu=0.5 gave -0.0037 for an exact -0.238 (the kinds probe)
        self.check(problem)
        r = self.run(problem, self.init(problem, lam), lam)
        value, grad = self.hypergradient_at(problem, r, lam)
        return HyperGradient(value, grad, r.state)

    def state_dict(self, problem: InnerProblem, run: Any) -> dict[str, Any]:
        """``run`` as checkpoint fields: its tensor leaves, its type and step, and the method
        that wrote it. Every rank of a multi-process run calls it (a split method gathers)."""
        leaves = [x for x in tree_flatten(run)[0] if isinstance(x, Tensor)]
        return {"method": self.name, "run": type(run).__name__, "step": int(run.step),
                "leaves": leaves}

    def load_state_dict(self, problem: InnerProblem, lam: Tensor, entry: dict[str, Any],
                        where: str = "the checkpoint") -> Any:
        """The run state stored by :meth:`state_dict`, in the structure of ``init(problem,
        lam)``. A run state that does not fit (another kind of state, other tensors) is refused
        with the fix; one written by another method whose state fits (forward mode and MARTHE)
        carries over."""
        with torch.random.fork_rng(devices=[problem.device]
                                   if problem.device.type == "cuda" else []):
            template = self.init(problem, lam)
        leaves, spec = tree_flatten(template)
        slots = [i for i, x in enumerate(leaves) if isinstance(x, Tensor)]
        stored = list(entry["leaves"])
        why = ""
        if type(template).__name__ != entry["run"]:
            why = f"it is a {entry['run']}, {self.name}'s is a {type(template).__name__}"
        elif len(slots) != len(stored):
            why = f"it has {len(stored)} tensors, {self.name}'s {len(slots)}"
        else:
            for i, x in zip(slots, stored):
                if leaves[i].shape != x.shape or leaves[i].dtype != x.dtype:
                    why = (f"a tensor of shape {list(x.shape)} ({x.dtype}) where {self.name} "
                           f"keeps {list(leaves[i].shape)} ({leaves[i].dtype})")
                    break
        if why:
            raise ResumeMismatchError(
                f"Trainer: cannot resume the online run in {where} with method={self.name!r}: "
                f"its run state was written by method={entry['method']!r} and does not fit "
                f"({why}). Resume with method={entry['method']!r}, or start a new run.")
        for i, x in zip(slots, stored):
            leaves[i] = x.to(leaves[i].device)
        return tree_unflatten(leaves, spec)._replace(step=int(entry["step"]))


# -- the registry --------------------------------------------------------------------------------
def register(cls: type[Method], name: str) -> type[Method]:
    """Register ``cls`` under ``name`` (``class C(Method, name=...)`` calls this). A name is
    taken once; the same class registered again (a reloaded module) replaces itself."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"Method name {name!r} must be an identifier, e.g. name='my_method'.")
    old = _REGISTRY.get(name)
    if old is not None and not same_definition(old, cls):
        raise ValueError(f"Method name {name!r} is taken by {old.__module__}."
                         f"{old.__qualname__}; choose another name for {cls.__module__}."
                         f"{cls.__qualname__}.")
    cls.name = name
    _REGISTRY[name] = cls
    return cls


def registered() -> dict[str, type[Method]]:
    """``{name: class}`` of the methods registered in this process (the package's own, those
    of imported user modules, and the installed entry points of :data:`ENTRY_POINTS`)."""
    for ep in metadata.entry_points(group=ENTRY_POINTS):
        if ep.name not in _REGISTRY:
            _load_entry_point(ep)
    return dict(_REGISTRY)


def _load_entry_point(ep: Any) -> None:
    cls = ep.load()
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"entry point {ep.name} = {ep.value} of {ENTRY_POINTS} is not a Method "
                        f"subclass.")
    if ep.name not in _REGISTRY:
        register(cls, ep.name)


def _by_path(path: str) -> type[Method]:
    module, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"method={path!r}: cannot import it ({type(err).__name__}: {err}). "
                         f"Give a registered name ({sorted(registered())}) or an importable "
                         f"path such as 'my_module.MyMethod' (run from the folder that holds "
                         f"my_module.py, or install your package).") from err
    if not (isinstance(obj, type) and issubclass(obj, Method)):
        raise TypeError(f"method={path!r} is {type(obj).__name__} {obj!r}, not a Method "
                        f"subclass.")
    return obj


def create(spec: str | Method, api: str = "Trainer") -> Method:
    """A method from ``spec``: a :class:`Method` as it is, a registered name (built with its
    defaults), or an import path (``"pkg.module.Class"`` / ``"pkg.module:Class"``)."""
    if isinstance(spec, Method):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"{api}: method must be a Method or a name, got {type(spec).__name__} "
                        f"{spec!r}.")
    if spec not in _REGISTRY:
        for ep in metadata.entry_points(group=ENTRY_POINTS, name=spec):
            _load_entry_point(ep)
    if spec in _REGISTRY:
        return _REGISTRY[spec]()
    if "." in spec or ":" in spec:
        return _by_path(spec)()
    alias = {"checkpointed": 'ReverseMode(checkpoint="sqrt")',
             "truncated": "ReverseMode(truncate=k)"}.get(spec)
    if alias is not None:  # hypergrad-run's method options (configs/method/) of ReverseMode
        raise ValueError(f"{api}: method={spec!r} is a hypergrad-run option, not a registered "
                         f"method; in Python pass method=hypergrad.{alias}.")
    raise ValueError(f"{api}: method={spec!r} is not a registered method; registered are "
                     f"{sorted(registered())}. A method of your own registers with "
                     f"`class MyMethod(hypergrad.Method, name='mine')`, or give its import path "
                     f"('my_module.MyMethod').")


def refuse_initial_weights(problem: InnerProblem, method: str, reach: str, fix: str) -> None:
    """Refuse a problem with initialisation hyperparameters (:class:`~hypergrad.InitScale`,
    :class:`~hypergrad.InitWeights`) for a method whose hypergradient cannot reach the initial
    weights (``reach``: what it differentiates): theirs would be exactly 0, which the Trainer
    could only blame on the losses."""
    init = [h.name for h in problem.hyperparams.init_items]
    if init:
        raise ValueError(
            f"{method}: {init} set the initial weights, which {reach} does not reach: their "
            f"hypergradient would be exactly 0 (not because the losses ignore them). Use {fix} "
            f"for them, or drop them from the hyperparameters.")
