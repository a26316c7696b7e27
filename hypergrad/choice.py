"""Which method to run, and whether it fits in memory: :func:`choose_method` (``method="auto"``),
:func:`estimate_memory` and :func:`make_method` (methods by name, for configs).

Memory estimates, in bytes, with ``|s|`` the training state (parameters, buffers, optimizer
state) and ``a`` the bytes one gradient pass saves for backward (measured once, one forward
pass):

- forward mode: ``(2K + 1) |s| + a + c * f * a``: the K tangent columns before and after a step,
  the state, one gradient's activations, and the intermediates of one batched call of ``c``
  Hessian-vector columns (``c`` from the HVP strategy's ``chunk_size`` / ``memory_budget``,
  ``f`` its ``column_memory_factor``). Independent of ``T``.
- reverse mode: ``(T + 1) |s| + a + f * a``: every state of the run, and one step's
  vector-Jacobian product.

These are rough (within a factor of about 2), enough to refuse a run that cannot fit before it
allocates, and to pick the method that fits.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

from .errors import MemoryBudgetError
from .forward import ForwardMode
from .hvp import STRATEGIES, HVPStrategy, VmapVJP, saved_bytes
from .method import HyperGradient, Method
from .problem import InnerProblem
from .reverse import ReverseMode

__all__ = ["AutoMode", "AutoMethod", "MemoryEstimate", "available_memory", "estimate_memory",
           "choose_method", "check_memory", "make_method"]

GiB = float(2**30)


def _gib(x: float) -> str:
    """Bytes in words: GiB from 1 GiB up, MiB below."""
    return f"{x / GiB:.3g} GiB" if x >= GiB else f"{x / 2**20:.3g} MiB"


class AutoMode(Method):
    """``method="auto"``: forward or reverse mode, chosen per problem by :func:`choose_method`
    from both memory estimates and K (the reason is returned by :meth:`resolve` and logged by
    the Trainer).

    Args:
        forward: the forward mode to use if forward is picked (its HVP strategy, chunking and
            ``compile`` kept); default ``ForwardMode()``.
        reverse: the reverse mode to use if reverse is picked; default ``ReverseMode()``.
        memory_budget: bytes either may use (``None``: the caller's budget, else the device's
            available memory).
    """

    name = "auto"

    def __init__(self, forward: ForwardMode | None = None, reverse: ReverseMode | None = None,
                 memory_budget: float | None = None) -> None:
        self.forward = forward if forward is not None else ForwardMode()
        self.reverse = reverse if reverse is not None else ReverseMode()
        self.memory_budget = memory_budget

    def resolve(self, problem: InnerProblem, mode: str = "offline",
                memory_budget: float | None = None) -> tuple[Method, str]:
        budget = self.memory_budget if self.memory_budget is not None else memory_budget
        name, why = choose_method(problem, mode, budget, self.forward)
        return (self.forward if name == "forward" else self.reverse), f"chose {name}: {why}"

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        return self.resolve(problem)[0].hypergradient(problem, lam)

    def __repr__(self) -> str:
        return f"AutoMode(forward={self.forward!r}, reverse={self.reverse!r})"


AutoMethod = AutoMode
"""The earlier name of :class:`AutoMode`."""


@dataclass
class MemoryEstimate:
    """Bytes a method needs (see the module docstring): ``total`` and its parts."""

    method: str
    total: float
    state: int
    activations: int
    columns: int = 0  # forward: columns per batched HVP call
    intermediates: float = 0.0  # forward: of one batched call; reverse: of one step's VJP

    def __str__(self) -> str:
        held = _gib(self.total - self.activations - self.intermediates)
        if self.method == "forward":
            return (f"forward {_gib(self.total)} (tangents and state {held}, HVP intermediates "
                    f"{_gib(self.intermediates)} for {self.columns} columns per call)")
        return f"reverse {_gib(self.total)} (stored states {held})"


def available_memory(device: torch.device | str = "cpu") -> float:
    """Free memory of ``device`` in bytes: a CUDA device's free memory, or the machine's
    available RAM (``MemAvailable``); ``inf`` where it cannot be read."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return float(torch.cuda.mem_get_info(dev)[0])
        except Exception:  # pragma: no cover - depends on the machine
            return math.inf
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return math.inf


def _state_bytes(problem: InnerProblem) -> int:
    leaves, _ = tree_flatten(problem.initial_state())
    return sum(x.numel() * x.element_size() for x in leaves)


def no_draws(problem: InnerProblem) -> Any:
    """A context in which the problem may draw random numbers (dropout, a random batch) without
    moving the global generators the run itself draws from."""
    dev = problem.device
    return torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else [])


def _activation_bytes(problem: InnerProblem) -> int:
    with no_draws(problem):
        s = problem.initial_state()
        lam = problem.init_raw()
        batch = problem.batch(0)

        def loss(p: Any, b: Any, lm: Any) -> Any:
            return problem.train_objective(p, b, lm, 0, batch)

        return saved_bytes(loss, s.params, s.buffers, lam)


def estimate_memory(problem: InnerProblem, method: Method | str = "forward",
                    ) -> MemoryEstimate:
    """Rough bytes ``method`` (a :class:`ForwardMode`, :class:`ReverseMode`, ``"forward"`` or
    ``"reverse"``) needs on ``problem``; see the module docstring. One forward pass of the
    training loss (to measure its activations)."""
    if isinstance(method, str):
        method = ForwardMode() if method == "forward" else ReverseMode()
    k, t = problem.num_hyperparams, problem.steps
    s, a = _state_bytes(problem), _activation_bytes(problem)
    pb = sum(v.numel() * v.element_size() for v in problem.initial_state().params.values())
    if isinstance(method, ForwardMode):
        hvp: HVPStrategy = method.hvp
        if getattr(hvp, "batched", True) and not (k == 1 and isinstance(hvp, VmapVJP)):
            cols = hvp.chunk_for(k, a, pb)
        else:
            cols = 1
        inter = cols * hvp.column_bytes(a, pb)
        return MemoryEstimate("forward", (2 * k + 1) * s + a + inter, s, a, cols, inter)
    inter = VmapVJP().column_bytes(a, pb)
    return MemoryEstimate("reverse", (t + 1) * s + a + inter, s, a, 0, inter)


def _budget(problem: InnerProblem, memory_budget: float | None) -> float:
    return available_memory(problem.device) if memory_budget is None else float(memory_budget)


def _options(problem: InnerProblem, fwd: MemoryEstimate | None, rev: MemoryEstimate | None,
             mode: str) -> str:
    k, t = problem.num_hyperparams, problem.steps
    opts = []
    if fwd is not None and k > 1:
        opts.append(f"fewer hyperparameters (K={k}; forward's tangents take "
                    f"{_gib(2 * k * fwd.state)})")
        if fwd.columns > 1:
            opts.append("fewer HVP columns per call: chunk_size=1 or a smaller HVP memory_budget "
                        f"(method.chunk_size / method.memory_budget_gb; now "
                        f"{_gib(fwd.intermediates)} for {fwd.columns} columns)")
    if rev is not None and mode == "offline":
        opts.append(f"a shorter horizon (T={t}) for reverse mode, which stores T+1 states "
                    f"(checkpointed reverse mode does not exist yet)")
        if fwd is not None:
            opts.append("method='reverse'" if rev.total < fwd.total else "method='forward'")
    opts.append("a larger memory_budget if the machine has the memory "
                "(hypergrad-run: trainer.memory_budget_gb)")
    return "; ".join(opts)


def choose_method(problem: InnerProblem, mode: str = "offline",
                  memory_budget: float | None = None,
                  forward: ForwardMode | None = None) -> tuple[str, str]:
    """Pick ``"forward"`` or ``"reverse"``; returns the name and the reason in words.

    Both memory estimates (:func:`estimate_memory`, ``forward``'s HVP strategy) are compared
    with ``memory_budget`` (bytes; ``None``: the device's available memory). Online tuning needs
    forward mode. Offline, a method that does not fit is never picked; when both fit, the
    cheaper per inner step is: forward costs about ``1 + 2K`` gradients per step, reverse
    about 4 (DESIGN.md). When neither fits, :class:`~hypergrad.errors.MemoryBudgetError` gives
    both numbers and the options.
    """
    k = problem.num_hyperparams
    budget = _budget(problem, memory_budget)
    fwd = estimate_memory(problem, forward if forward is not None else ForwardMode())
    if mode == "online":
        if fwd.total > budget:
            raise MemoryBudgetError(
                f"method=auto: online tuning needs forward mode, which needs about {fwd} > "
                f"memory budget {_gib(budget)}. Options: {_options(problem, fwd, None, mode)}.")
        return "forward", "online tuning needs hypergradients during training (forward mode)"
    rev = estimate_memory(problem, ReverseMode())
    both = f"forward needs ~{_gib(fwd.total)}, reverse ~{_gib(rev.total)}, budget {_gib(budget)}"
    fits_f, fits_r = fwd.total <= budget, rev.total <= budget
    if not fits_f and not fits_r:
        raise MemoryBudgetError(
            f"method=auto: neither method fits the memory budget of {_gib(budget)}: {fwd}; "
            f"{rev}. Options: {_options(problem, fwd, rev, mode)}.")
    if not fits_r:
        return "forward", f"reverse mode would not fit ({both})"
    if not fits_f:
        return "reverse", f"forward mode would not fit ({both})"
    if 1 + 2 * k <= 4:
        return "forward", (f"K={k}: forward costs ~{1 + 2 * k} gradients per step vs ~4 for "
                           f"reverse, and memory independent of T ({both})")
    return "reverse", (f"K={k}: forward would cost ~{1 + 2 * k} gradients per step vs ~4 for "
                       f"reverse; both fit ({both})")


def check_memory(problem: InnerProblem, method: Method, mode: str = "offline",
                 memory_budget: float | None = None, api: str = "Trainer") -> None:
    """Raise :class:`~hypergrad.errors.MemoryBudgetError` (with the numbers and the options)
    when ``method`` (forward or reverse mode) would not fit ``memory_budget`` (bytes; ``None``:
    the device's available memory). Other methods are not checked."""
    if not isinstance(method, (ForwardMode, ReverseMode)):
        return
    budget = _budget(problem, memory_budget)
    est = estimate_memory(problem, method)
    if est.total <= budget:
        return
    other = estimate_memory(problem, ReverseMode() if est.method == "forward" else ForwardMode())
    fwd, rev = (est, other) if est.method == "forward" else (other, est)
    raise MemoryBudgetError(
        f"{api}: method={est.method} needs about {est} > memory budget {_gib(budget)} "
        f"(K={problem.num_hyperparams}, T={problem.steps}, state {_gib(est.state)}); "
        f"{other.method} would need ~{_gib(other.total)}. Options: "
        f"{_options(problem, fwd, rev if mode == 'offline' else None, mode)}.")


def make_method(name: str = "forward", hvp: str = "vmap_vjp", chunk_size: int | None = None,
                memory_budget_gb: float | None = None,
                compile: bool = False) -> Method:
    """A method by name, for configs: ``"forward"`` (with the HVP strategy ``hvp``), ``"reverse"``
    or ``"auto"`` (an :class:`AutoMethod` the Trainer resolves with :func:`choose_method`; its
    forward mode keeps ``hvp``, ``chunk_size``, ``memory_budget_gb`` and ``compile``).

    ``chunk_size`` / ``memory_budget_gb`` set the HVP strategy's chunking (default: automatic
    from :data:`hypergrad.hvp.DEFAULT_MEMORY_BUDGET`); ``compile`` runs ``VmapVJP`` through
    ``torch.compile`` (opt-in, see BENCHMARKS.md)."""
    name, hvp = getattr(name, "value", name), getattr(hvp, "value", hvp)  # config enums
    if name == "reverse":
        return ReverseMode()
    if name not in ("forward", "auto"):
        raise ValueError(f"make_method: name={name!r}; choose 'forward', 'reverse' or 'auto'.")
    if hvp not in STRATEGIES:
        raise ValueError(f"make_method: hvp={hvp!r}; choose one of {sorted(STRATEGIES)}.")
    if compile and hvp != "vmap_vjp":
        raise ValueError(f"make_method: compile=True needs hvp='vmap_vjp', got hvp={hvp!r}.")
    if memory_budget_gb is not None and not memory_budget_gb > 0:
        raise ValueError(f"make_method: memory_budget_gb={memory_budget_gb!r} must be > 0 "
                         f"(GiB), or null for the default.")
    cls = STRATEGIES[hvp]
    budget = None if memory_budget_gb is None else memory_budget_gb * GiB
    if hvp == "loop":
        fm = ForwardMode(cls())
    elif compile:
        fm = ForwardMode(VmapVJP(chunk_size=chunk_size, memory_budget=budget, compile=True))
    else:
        fm = ForwardMode(cls(chunk_size=chunk_size, memory_budget=budget))
    return AutoMode(fm) if name == "auto" else fm
