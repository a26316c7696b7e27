"""Whether a method fits in memory: :func:`available_memory`, :func:`check_memory` (the Trainer's
memory guard, before anything is allocated), :func:`options` (what to do when it does not) and
:func:`out_of_memory` (when a run runs out of memory anyway).

Each method estimates its own peak bytes (:meth:`~hypergrad.Method.estimate_memory`) from
:class:`~hypergrad.methods.Sizes`, counted from shapes: the training loss and the passes a method
runs are run once on fake tensors (:mod:`hypergrad.footprint`: shapes and dtypes, no data,
nothing allocated) while every storage an operation creates is followed until it is freed. With
``|s|`` the training state (parameters, buffers, optimizer state), ``|w|`` the parameters,
``|b|`` the model's buffers (BatchNorm statistics), K hyperparameters and T steps:

- forward mode (and :class:`~hypergrad.MARTHE`): ``(K + 1) |s| + p``, independent of T.
  ``(K + 1) |s|``: the state and its tangents (optimizer state and BatchNorm statistics
  included), held throughout. ``p``: the peak of what one step allocates. With all K columns in
  one call of the HVP strategy (its ``chunk_size``, or the most that fit its ``memory_budget``
  at the bytes a column was counted to hold), the whole step is counted in one run: the
  gradient, its retained graph, the columns' results and intermediates, then the update's
  tangent on those results as the strategy lays them out (a tangent rule writes into ``G``'s
  memory, or copies ``G`` where it shares a storage, as ``vmap``'s convolution products do:
  K ``|w|`` more on a ResNet-18). Chunked, ``p = max(h, (K + 1)(|w| + |b|) + u)``: ``h`` the
  products (two chunks counted, and the result they are written into), ``u`` what the tangent
  rule allocates beside the gradient and the K columns' ``G`` and ``Z^b``. Where the rule cannot
  be counted, the update is taken as ``(K + 1) |s| + |w|`` (``(2K + 2) |s| + |w|`` with what is
  held: SGD with momentum's). MARTHE with ``mu < 1`` holds the discounted copy ``K |s|``
  besides.
- reverse mode: ``(n + 1) |s| + v`` for the ``n`` states it holds (``min(truncate, T) + 1``;
  checkpointed: ``ceil(n / m) + m + 1``) and the adjoint, with ``v`` one step's
  vector-Jacobian product (its gradient and graph, the new state, the old state's adjoint, the
  intermediates), counted;
- :class:`~hypergrad.HD`: ``2 |s| + v``;
- :class:`~hypergrad.ImplicitDiff`: ``|s| + 6 |w| + n_L h_1``.

On every row of ``experiments/benchmarks/bench_models.py --memory`` (ResNet-18, a transformer
encoder, an LSTM; K = 4 and 16; every HVP strategy, and reverse mode) the estimate is within
0.7-1.5x of the measured peak (docs/benchmarks.md). Where the training loss cannot run on fake
tensors (``.item()``, data-dependent shapes, an operator without a fake kernel, sparse
tensors), one real forward pass counts its activations ``a`` (the only allocation before the
guard decides), and counts are replaced by factors measured on the bench_models rows: the
gradient's retained graph ``2 a`` (measured 1.9-2.4), a column ``3 a + 2 |w|`` (measured
0.24-2.9 ``a`` besides the parameters), the update ``(2K + 2) |s| + |w|``: cautious, not
honest, for such models.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from ..errors import MemoryBudgetError, is_real
from ..problem import InnerProblem
from .base import MemoryEstimate, Method, Sizes, budget_words, create, gib

__all__ = ["available_memory", "budget", "check_budget", "estimate_memory", "check_memory",
           "options", "is_out_of_memory", "out_of_memory"]


def available_memory(device: torch.device | str = "cpu") -> float:
    """Free memory of ``device`` in bytes: a CUDA device's free memory plus what torch's
    caching allocator holds reserved and unused (free to this process: the device's count left
    it out, so after a first hypergradient ``method="auto"`` could switch to a slower method or
    refuse one that fits; the CUDA review, 2026-12-07), or the machine's available RAM
    (``MemAvailable``); ``inf`` where it cannot be read."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
            return float(torch.cuda.mem_get_info(dev)[0] + max(cached, 0))
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


def check_budget(who: str, memory_budget: Any) -> float | None:
    """``memory_budget`` checked as :class:`~hypergrad.Guards` checks it: ``None``, or bytes
    > 0 as any real number (a NumPy one too; ``inf``: no limit). 0, a negative number, NaN, a
    bool or a string (``"2GB"``) were taken as a budget every method exceeds, or failed as
    Python's bare conversion error."""
    if memory_budget is None:
        return None
    if (not is_real(memory_budget)
            or not float(memory_budget) > 0):
        raise ValueError(f"{who}: memory_budget={memory_budget!r} must be bytes > 0 (e.g. "
                         f"memory_budget=4e9), or None for the device's available memory.")
    return float(memory_budget)


def budget(problem: InnerProblem, memory_budget: float | None) -> float:
    """``memory_budget`` in bytes, or the device's available memory when ``None``."""
    room = check_budget("memory_budget", memory_budget)
    return available_memory(problem.device) if room is None else room


def estimate_memory(problem: InnerProblem, method: Method | str = "forward"
                    ) -> MemoryEstimate:
    """The peak bytes ``method`` (a :class:`~hypergrad.Method` or a registered name) needs on
    ``problem``, counted from shapes (see the module docstring): nothing the size of the state
    or of a forward pass is allocated."""
    m = create(method, "estimate_memory")
    est = m.estimate_memory(problem)
    if est is None:
        raise NotImplementedError(f"estimate_memory: {type(m).__name__} has no memory estimate "
                                  f"(its estimate_memory returns None).")
    return est


def options(problem: InnerProblem, fwd: MemoryEstimate | None, rev: MemoryEstimate | None,
            mode: str, ckpt: MemoryEstimate | None = None, chosen: str | None = None,
            failed: Method | None = None, failed_total: float | None = None,
            room: float | None = None) -> str:
    """What to do when a method does not fit, in words. ``chosen``: the method that did not
    fit (``"forward"`` or ``"reverse"``; ``"auto"``: neither fits), never suggested as the
    fix; ``failed``: that method itself (a checkpointed or truncated reverse mode is not told
    to checkpoint or truncate, a reverse kind not to drop hyperparameters, which its memory
    hardly depends on), and ``failed_total`` its estimate (another method is suggested only
    where it needs less); ``room``: the budget (fewer HVP columns are not suggested where the
    forward state and its tangents alone exceed it)."""
    from .reverse import ReverseMode

    k, t = problem.num_hyperparams, problem.steps
    checkpointed = isinstance(failed, ReverseMode) and failed.checkpoint is not None
    truncated = isinstance(failed, ReverseMode) and failed.truncate is not None
    opts = []
    if fwd is not None and k > 1 and chosen != "reverse":
        held = fwd.total - fwd.activations - fwd.intermediates  # tangents and state
        # the estimate's own count: "the old and the new tangents, 2K|s|" contradicted it
        # beside it in one message (the memory probe)
        opts.append(f"fewer hyperparameters (K={k}; the state and its K tangents hold "
                    f"{gib(held)})")
        # one column per call still needs the tangents, the state and the activations
        if fwd.columns > 1 and (room is None or held + fwd.activations < room):
            opts.append("fewer HVP columns per call: chunk_size=1 or a smaller HVP memory_budget "
                        f"(method.hvp.chunk_size / method.hvp.memory_budget in bytes; now "
                        f"{gib(fwd.intermediates)} for {fwd.columns} columns)")
    if rev is not None and mode == "offline":
        if truncated and not checkpointed and isinstance(failed, ReverseMode):
            n = failed.stored_states(t)
            fewer = ReverseMode(truncate=failed.truncate, checkpoint="sqrt").stored_states(t)
            if fewer < n:
                opts.append(f"checkpoint='sqrt' beside truncate={failed.truncate} ({fewer} "
                            f"states held instead of {n})")
        elif ckpt is None and not checkpointed:
            opts.append(f"checkpointed reverse mode, ReverseMode(checkpoint='sqrt') (method="
                        f"checkpointed: ~2 sqrt(T) states instead of T+1={t + 1})")
        elif checkpointed and isinstance(failed, ReverseMode) and failed.checkpoint != "sqrt":
            opts.append("checkpoint='sqrt' (the fewest states held at once)")
        if truncated and isinstance(failed, ReverseMode):
            opts.append(f"a smaller truncate (now {failed.truncate}: k+1 states)")
        else:
            opts.append(f"truncated reverse mode, ReverseMode(truncate=k) (method=truncated "
                        f"method.truncate=k: k+1 states, approximate for k < T={t})")
        cheaper = None if fwd is None else "reverse" if rev.total < fwd.total else "forward"
        if cheaper == "forward" and failed_total is not None and fwd is not None \
                and fwd.total >= failed_total:
            cheaper = None  # a truncated or checkpointed reverse mode needs less than forward
        if cheaper is not None and chosen not in (cheaper, "auto"):
            need = (fwd if cheaper == "forward" else rev).total  # type: ignore[union-attr]
            opts.append(f"method='{cheaper}' (~{gib(need)})")
        opts.append("ImplicitDiff() for hyperparameters of the training loss (method=implicit: "
                    "a few states, approximate, needs a converged inner problem)")
    if mode == "online":
        opts.append("HD() (method=hd: greedy one-step hypergradients, 2 states)")
    opts.append("a larger memory_budget if the machine has the memory "
                "(hypergrad-run: guards.memory_budget=<bytes>)")
    return "; ".join(opts)


def check_memory(problem: InnerProblem, method: Method, mode: str = "offline",
                 memory_budget: float | None = None, api: str = "check_memory"
                 ) -> MemoryEstimate | None:
    """Raise :class:`~hypergrad.errors.MemoryBudgetError` (with the numbers and the options)
    when ``method`` would not fit ``memory_budget`` (bytes; ``None``: the device's available
    memory); else return its estimate. Methods without an estimate (finite differences, your
    own) are not checked: ``None``."""
    check_budget(api, memory_budget)
    sizes = Sizes.of(problem)
    est = method.estimate_memory(problem, sizes)
    if est is None:
        return None
    room = budget(problem, memory_budget)
    if est.total <= room:
        return est
    from .forward import ForwardMode
    from .reverse import ReverseMode

    fwd = (est if isinstance(method, ForwardMode)
           else ForwardMode().estimate_memory(problem, sizes))
    rev = ReverseMode().estimate_memory(problem, sizes)
    other = rev if est.columns else fwd
    family = "forward" if est.columns else "reverse"
    opts = options(problem, fwd, rev if mode == "offline" else None, mode, chosen=family,
                   failed=method, failed_total=est.total, room=room)
    raise MemoryBudgetError(
        f"{api}: method={est.method} needs about {str(est).removeprefix(est.method + ' ')} > "
        f"memory budget {budget_words(room)} (K={problem.num_hyperparams}, T={problem.steps}, "
        f"state {gib(est.state)}); {other.method} would need ~{gib(other.total)}. Options: {opts}.")


_OOM_TEXT = ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory",
             "out of memory", "not enough memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation failure: ``torch.OutOfMemoryError`` (CUDA and other
    accelerators), CPU's ``RuntimeError`` from ``DefaultCPUAllocator``, Python's
    ``MemoryError``."""
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(err, RuntimeError) and any(t in str(err) for t in _OOM_TEXT)


def out_of_memory(problem: InnerProblem, method: Method, mode: str,
                  memory_budget: float | None, err: BaseException, where: str = "",
                  api: str = "Trainer", folder: bool = False) -> MemoryBudgetError | None:
    """The :class:`~hypergrad.errors.MemoryBudgetError` to raise for ``err`` (``None`` where
    ``err`` is no allocation failure): what ran out (the allocator's own line, with what was
    asked), the method's estimate against the budget, and the options. Drops ``err``'s
    traceback, so the step's tensors it holds are freed once the new error is handled.
    ``folder``: the run has a run folder (its records are intact: say that it resumes)."""
    if not is_out_of_memory(err):
        return None
    asked = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
    err.__traceback__ = None
    room = budget(problem, memory_budget)
    try:
        est = method.estimate_memory(problem)
    except Exception:  # noqa: BLE001 - the estimate is a courtesy here
        est = None
    if est is None:
        said = f"{type(method).__name__} has no memory estimate"
        fwd = rev = None
    else:
        said = (f"the estimate was {est}, the budget {gib(room)}: "
                + ("the estimate was short, or other processes took the memory" if est.total
                   <= room else "the estimate was over the budget"))
        from .forward import ForwardMode
        from .reverse import ReverseMode

        fwd = est if est.columns else ForwardMode().estimate_memory(problem)
        rev = ReverseMode().estimate_memory(problem) if mode == "offline" else None
    chosen = None if est is None else "forward" if est.columns else "reverse"
    opts = options(problem, fwd, rev, mode, chosen=chosen, failed=method,
                   failed_total=None if est is None else est.total)
    return MemoryBudgetError(
        f"{api}: out of memory{' ' + where if where else ''} with method={method.name} "
        f"(K={problem.num_hyperparams}, T={problem.steps}): {asked}. {said[0].upper()}"
        f"{said[1:]}. Options: {opts}."
        + (" The run folder keeps every completed outer step (resume=True continues from "
           "there)." if folder else ""))
