"""Whether a method fits in memory: :func:`available_memory`, :func:`check_memory` (the Trainer's
memory guard, before anything is allocated) and :func:`options` (what to do when it does not).

Each method estimates its own bytes (:meth:`~hypergrad.Method.estimate_memory`), from
:class:`~hypergrad.methods.Sizes` measured once per problem: ``|s|`` the training state, ``|w|`` the
parameters and ``a`` the bytes one gradient pass saves for backward, with ``f`` the factor of
one batched column or step VJP (6):

- forward mode (and :class:`~hypergrad.MARTHE`): ``(2K + 1) |s| + a + c * f * a``, independent
  of ``T``;
- reverse mode: ``(n + 1) |s| + a + f * a`` for the ``n`` steps it backpropagates (checkpointed:
  ``(ceil(n / m) + m + 1) |s|`` states instead);
- :class:`~hypergrad.HD`: ``2 |s| + a + f * a``;
- :class:`~hypergrad.ImplicitDiff`: ``|s| + 6 |w| + a + f * a * n_L``.

These are rough (within a factor of about 2), enough to refuse a run that cannot fit before it
allocates, and to pick the method that fits.
"""

from __future__ import annotations

import math
import os

import torch

from ..errors import MemoryBudgetError
from ..problem import InnerProblem
from .base import MemoryEstimate, Method, Sizes, create, gib

__all__ = ["available_memory", "budget", "estimate_memory", "check_memory", "options"]


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


def budget(problem: InnerProblem, memory_budget: float | None) -> float:
    """``memory_budget`` in bytes, or the device's available memory when ``None``."""
    return available_memory(problem.device) if memory_budget is None else float(memory_budget)


def estimate_memory(problem: InnerProblem, method: Method | str = "forward"
                    ) -> MemoryEstimate:
    """Rough bytes ``method`` (a :class:`~hypergrad.Method` or a registered name) needs on
    ``problem``; see the module docstring. One forward pass of the training loss (to measure
    its activations)."""
    m = create(method, "estimate_memory")
    est = m.estimate_memory(problem)
    if est is None:
        raise NotImplementedError(f"estimate_memory: {type(m).__name__} has no memory estimate "
                                  f"(its estimate_memory returns None).")
    return est


def options(problem: InnerProblem, fwd: MemoryEstimate | None, rev: MemoryEstimate | None,
            mode: str, ckpt: MemoryEstimate | None = None) -> str:
    """What to do when a method does not fit, in words."""
    k, t = problem.num_hyperparams, problem.steps
    opts = []
    if fwd is not None and k > 1:
        opts.append(f"fewer hyperparameters (K={k}; forward's tangents take "
                    f"{gib(2 * k * fwd.state)})")
        if fwd.columns > 1:
            opts.append("fewer HVP columns per call: chunk_size=1 or a smaller HVP memory_budget "
                        f"(method.hvp.chunk_size / method.hvp.memory_budget in bytes; now "
                        f"{gib(fwd.intermediates)} for {fwd.columns} columns)")
    if rev is not None and mode == "offline":
        if ckpt is None:
            opts.append(f"checkpointed reverse mode, ReverseMode(checkpoint='sqrt') (method="
                        f"checkpointed: ~2 sqrt(T) states instead of T+1={t + 1})")
        opts.append(f"truncated reverse mode, ReverseMode(truncate=k) (method=truncated "
                    f"method.truncate=k: k+1 states, approximate for k < T={t})")
        if fwd is not None:
            opts.append("method='reverse'" if rev.total < fwd.total else "method='forward'")
        opts.append("ImplicitDiff() for hyperparameters of the training loss (method=implicit: "
                    "a few states, approximate, needs a converged inner problem)")
    if mode == "online":
        opts.append("HD() (method=hd: greedy one-step hypergradients, 2 states)")
    opts.append("a larger memory_budget if the machine has the memory "
                "(hypergrad-run: guards.memory_budget=<bytes>)")
    return "; ".join(opts)


def check_memory(problem: InnerProblem, method: Method, mode: str = "offline",
                 memory_budget: float | None = None, api: str = "Trainer") -> None:
    """Raise :class:`~hypergrad.errors.MemoryBudgetError` (with the numbers and the options)
    when ``method`` would not fit ``memory_budget`` (bytes; ``None``: the device's available
    memory). Methods without an estimate (finite differences, your own) are not checked."""
    sizes = Sizes.of(problem)
    est = method.estimate_memory(problem, sizes)
    if est is None:
        return
    room = budget(problem, memory_budget)
    if est.total <= room:
        return
    from .forward import ForwardMode
    from .reverse import ReverseMode

    fwd = ForwardMode().estimate_memory(problem, sizes)
    rev = ReverseMode().estimate_memory(problem, sizes)
    other = rev if est.columns else fwd
    raise MemoryBudgetError(
        f"{api}: method={est.method} needs about {est} > memory budget {gib(room)} "
        f"(K={problem.num_hyperparams}, T={problem.steps}, state {gib(est.state)}); "
        f"{other.method} would need ~{gib(other.total)}. Options: "
        f"{options(problem, fwd, rev if mode == 'offline' else None, mode)}.")
