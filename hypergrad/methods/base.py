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
import importlib
from dataclasses import dataclass
from importlib import metadata
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import ResumeMismatchError
from ..hvp import VmapVJP, saved_bytes
from ..problem import InnerProblem, InnerState

__all__ = ["Method", "OnlineMethod", "HyperGradient", "MemoryEstimate", "Sizes", "register",
           "registered", "create", "ENTRY_POINTS", "gib"]

ENTRY_POINTS = "hypergrad.methods"
"""The entry-point group under which installed packages declare methods by name."""

_REGISTRY: dict[str, type[Method]] = {}


def gib(x: float) -> str:
    """Bytes in words: GiB from 1 GiB up, MiB below."""
    return f"{x / 2**30:.3g} GiB" if x >= 2**30 else f"{x / 2**20:.3g} MiB"


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
    """What memory estimates are made of, measured once per problem: ``state`` the bytes of the
    training state (parameters, buffers, optimizer state), ``params`` of the parameters, and
    ``activations`` the bytes one gradient pass saves for backward (one forward pass),
    ``batch`` the bytes of one mini-batch."""

    state: int
    params: int
    activations: int
    batch: int = 0

    @classmethod
    def of(cls, problem: InnerProblem) -> Sizes:
        with torch.random.fork_rng(devices=[problem.device]
                                   if problem.device.type == "cuda" else []):
            s = problem.initial_state()
            lam = problem.init_raw()
            batch = problem.first_batch()

            def loss(p: Any, b: Any, lm: Any) -> Any:
                return problem.train_objective(p, b, lm, 0, batch)

            act = saved_bytes(loss, s.params, s.buffers, lam)
        state = sum(x.numel() * x.element_size() for x in tree_flatten(s)[0])
        params = sum(v.numel() * v.element_size() for v in s.params.values())
        nbytes = sum(x.numel() * x.element_size() for x in tree_flatten(batch)[0]
                     if isinstance(x, Tensor))
        return cls(state, params, act, nbytes)

    def vjp_intermediates(self) -> float:
        """Bytes one step's vector-Jacobian product holds (as one batched HVP column)."""
        return VmapVJP().column_bytes(self.activations, self.params)


@dataclass
class MemoryEstimate:
    """Bytes a method needs: ``total`` and its parts (``states`` held at once, for the reverse
    kinds; ``columns`` per batched HVP call, for the forward kinds)."""

    method: str
    total: float
    state: int
    activations: int
    columns: int = 0
    intermediates: float = 0.0
    states: int = 0

    def __str__(self) -> str:
        held = gib(self.total - self.activations - self.intermediates)
        if self.columns:
            return (f"{self.method} {gib(self.total)} (tangents and state {held}, HVP "
                    f"intermediates {gib(self.intermediates)} for {self.columns} columns per "
                    f"call)")
        if self.states:
            return f"{self.method} {gib(self.total)} ({self.states} stored states: {held})"
        return f"{self.method} {gib(self.total)} (states and vectors {held})"


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

    def estimate_memory(self, problem: InnerProblem,
                        sizes: Sizes | None = None) -> MemoryEstimate | None:
        """Rough bytes this method needs on ``problem`` (within a factor of about 2); ``None``
        when it has no estimate (then no memory check applies)."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        """The settings a resume must match (``{}`` for an exact method)."""
        return {}

    def across_ranks(self, ranks: Any) -> Method:
        """The method a multi-process run uses (``ranks``: the run's
        :class:`~hypergrad.distributed.Ranks`). By default a method does not run across
        processes."""
        raise NotImplementedError(
            f"{type(self).__name__} does not run across processes; under torchrun use "
            f"method='forward' (its columns split) or 'reverse' (its batches split), or run one "
            f"process.")


class OnlineMethod(Method):
    """A method that gives hypergradients during one run (online tuning)."""

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
        for _ in range(run.step, problem.steps if stop is None else stop):
            run = self.step(problem, run, lam)
        return run

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
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
    if old is not None and old.__qualname__ != cls.__qualname__:
        raise ValueError(f"Method name {name!r} is taken by {old.__module__}."
                         f"{old.__qualname__}; choose another name for {cls.__qualname__}.")
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
    raise ValueError(f"{api}: method={spec!r} is not a registered method; registered are "
                     f"{sorted(registered())}. A method of your own registers with "
                     f"`class MyMethod(hypergrad.Method, name='mine')`, or give its import path "
                     f"('my_module.MyMethod').")

