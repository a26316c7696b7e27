"""Which method to run, and whether it fits in memory: :func:`choose_method` (``method="auto"``),
:func:`estimate_memory` and :func:`make_method` (methods by name).

Memory estimates, in bytes, with ``|s|`` the training state (parameters, buffers, optimizer
state), ``|w|`` the parameters and ``a`` the bytes one gradient pass saves for backward (measured
once, one forward pass), ``f`` the factor of one batched column or step VJP (6):

- forward mode (and :class:`~hypergrad.MARTHE`): ``(2K + 1) |s| + a + c * f * a``: the K tangent
  columns before and after a step, the state, one gradient's activations, and the intermediates
  of one batched call of ``c`` Hessian-vector columns (``c`` from the HVP strategy's
  ``chunk_size`` / ``memory_budget``). Independent of ``T``.
- reverse mode: ``(n + 1) |s| + a + f * a`` for the ``n = min(truncate, T)`` steps it
  backpropagates: every state of them, and one step's vector-Jacobian product. Checkpointed
  (``checkpoint=m``): ``(ceil(n / m) + m + 1) |s|`` states instead, ``~(2 sqrt(n) + 1) |s|``
  for ``"sqrt"``.
- :class:`~hypergrad.HD`: ``2 |s| + a + f * a`` (the state before the last step, one VJP).
- :class:`~hypergrad.ImplicitDiff`: ``|s| + 6 |w| + a + f * a * n_L`` (the trained state, the
  solver's vectors, the retained graph of the gradient over the ``n_L`` loss steps).

These are rough (within a factor of about 2), enough to refuse a run that cannot fit before it
allocates, and to pick the method that fits.

Per-step time, in gradient evaluations (DESIGN.md): forward ``1 + 2K``, reverse ``4`` (a plain
step forward, a step VJP of about 3 backward), checkpointed reverse ``5`` (one more plain step
to recompute the segments). :func:`choose_method` picks among the **exact** methods only
(forward, reverse, checkpointed reverse): truncated reverse, implicit differentiation, HD and
MARTHE change the hypergradient, so they are suggested when nothing exact fits, never chosen.
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
from .implicit import SOLVERS, ImplicitDiff
from .method import HyperGradient, Method
from .online import HD, MARTHE
from .problem import InnerProblem
from .reverse import ReverseMode
from .stepvjp import STEP_VJPS

__all__ = ["AutoMode", "AutoMethod", "MemoryEstimate", "available_memory", "estimate_memory",
           "choose_method", "check_memory", "make_method"]

GiB = float(2**30)


def _gib(x: float) -> str:
    """Bytes in words: GiB from 1 GiB up, MiB below."""
    return f"{x / GiB:.3g} GiB" if x >= GiB else f"{x / 2**20:.3g} MiB"


class AutoMode(Method):
    """``method="auto"``: forward, reverse or checkpointed reverse mode, chosen per problem by
    :func:`choose_method` from the memory estimates and K (the reason is returned by
    :meth:`resolve` and logged by the Trainer).

    Args:
        forward: the forward mode to use if forward is picked (its HVP strategy, chunking and
            ``compile`` kept); default ``ForwardMode()``.
        reverse: the reverse mode to use if reverse is picked; default ``ReverseMode()``.
        checkpointed: the reverse mode to use where storing every state does not fit; default
            ``ReverseMode(checkpoint="sqrt")`` with ``reverse``'s step VJP.
        memory_budget: bytes any may use (``None``: the caller's budget, else the device's
            available memory).
        hvp: short for ``forward=ForwardMode(hvp)``: the HVP strategy forward mode would use
            (so that ``method=auto`` takes the same ``method/hvp`` group and options as
            ``method=forward`` in the Hydra configs).

    Example:
        >>> AutoMode(hvp=VmapVJP(chunk_size=4)).forward.hvp
        VmapVJP(chunk_size=4, memory_budget=None)
    """

    name = "auto"

    def __init__(self, forward: ForwardMode | None = None, reverse: ReverseMode | None = None,
                 memory_budget: float | None = None,
                 checkpointed: ReverseMode | None = None, *,
                 hvp: HVPStrategy | None = None) -> None:
        if forward is not None and hvp is not None:
            raise ValueError(f"AutoMode: got forward={forward!r} and hvp={hvp!r}; pass one "
                             f"(hvp=... is short for forward=ForwardMode(hvp=...)).")
        self.forward = forward if forward is not None else ForwardMode(hvp)
        self.reverse = reverse if reverse is not None else ReverseMode()
        self.checkpointed = (checkpointed if checkpointed is not None else
                             ReverseMode(checkpoint="sqrt", step_vjp=self.reverse.step_vjp))
        self.memory_budget = memory_budget

    def resolve(self, problem: InnerProblem, mode: str = "offline",
                memory_budget: float | None = None) -> tuple[Method, str]:
        budget = self.memory_budget if self.memory_budget is not None else memory_budget
        name, why = choose_method(problem, mode, budget, self.forward, self.checkpointed)
        chosen = {"forward": self.forward, "reverse": self.reverse,
                  "checkpointed": self.checkpointed}[name]
        return chosen, f"chose {name}: {why}"

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
    intermediates: float = 0.0  # forward: of one batched call; others: of one step's VJP
    states: int = 0  # reverse: states held at once

    def __str__(self) -> str:
        held = _gib(self.total - self.activations - self.intermediates)
        if self.method in ("forward", "marthe"):
            return (f"{self.method} {_gib(self.total)} (tangents and state {held}, HVP "
                    f"intermediates {_gib(self.intermediates)} for {self.columns} columns per "
                    f"call)")
        if self.method.startswith("reverse") or self.method == "checkpointed reverse":
            return f"{self.method} {_gib(self.total)} ({self.states} stored states: {held})"
        return f"{self.method} {_gib(self.total)} (states and vectors {held})"


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


_BY_NAME: dict[str, Any] = {
    "forward": ForwardMode, "reverse": ReverseMode, "hd": HD, "marthe": MARTHE,
    "implicit": ImplicitDiff, "checkpointed": lambda: ReverseMode(checkpoint="sqrt")}


def _reverse_label(method: ReverseMode) -> str:
    if method.checkpoint is None and method.truncate is None:
        return "reverse"
    if method.truncate is None and method.checkpoint == "sqrt":
        return "checkpointed reverse"
    return repr(method).replace("ReverseMode", "reverse")


def estimate_memory(problem: InnerProblem, method: Method | str = "forward",
                    ) -> MemoryEstimate:
    """Rough bytes ``method`` needs on ``problem`` (a :class:`ForwardMode`, :class:`ReverseMode`
    (truncated or checkpointed too), :class:`~hypergrad.HD`, :class:`~hypergrad.MARTHE`,
    :class:`~hypergrad.ImplicitDiff`, or one of the names ``"forward"``, ``"reverse"``,
    ``"checkpointed"``, ``"hd"``, ``"marthe"``, ``"implicit"``); see the module docstring. One
    forward pass of the training loss (to measure its activations)."""
    if isinstance(method, str):
        if method not in _BY_NAME:
            raise ValueError(f"estimate_memory: method={method!r}; choose one of "
                             f"{sorted(_BY_NAME)} or pass a Method.")
        method = _BY_NAME[method]()
    k, t = problem.num_hyperparams, problem.steps
    s, a = _state_bytes(problem), _activation_bytes(problem)
    pb = sum(v.numel() * v.element_size() for v in problem.initial_state().params.values())
    vjp_inter = VmapVJP().column_bytes(a, pb)
    if isinstance(method, ForwardMode):
        hvp: HVPStrategy = method.hvp
        if getattr(hvp, "batched", True) and not (k == 1 and isinstance(hvp, VmapVJP)):
            cols = hvp.chunk_for(k, a, pb)
        else:
            cols = 1
        inter = cols * hvp.column_bytes(a, pb)
        label = "marthe" if isinstance(method, MARTHE) else "forward"
        return MemoryEstimate(label, (2 * k + 1) * s + a + inter, s, a, cols, inter)
    if isinstance(method, ReverseMode):
        n = method.stored_states(t)
        return MemoryEstimate(_reverse_label(method), n * s + a + vjp_inter, s, a, 0, vjp_inter,
                              n)
    if isinstance(method, HD):
        return MemoryEstimate("hd", 2 * s + a + vjp_inter, s, a, 0, vjp_inter)
    if isinstance(method, ImplicitDiff):
        n_l = 1 if method.loss_steps is None else len(method.loss_steps)
        inter = vjp_inter * n_l
        return MemoryEstimate("implicit", s + 6 * pb + a + inter, s, a, 0, inter)
    raise NotImplementedError(f"estimate_memory: no estimate for {type(method).__name__}; "
                              f"estimates exist for forward, reverse (truncated, "
                              f"checkpointed), HD, MARTHE and ImplicitDiff.")


def _budget(problem: InnerProblem, memory_budget: float | None) -> float:
    return available_memory(problem.device) if memory_budget is None else float(memory_budget)


def _options(problem: InnerProblem, fwd: MemoryEstimate | None, rev: MemoryEstimate | None,
             mode: str, ckpt: MemoryEstimate | None = None) -> str:
    k, t = problem.num_hyperparams, problem.steps
    opts = []
    if fwd is not None and k > 1:
        opts.append(f"fewer hyperparameters (K={k}; forward's tangents take "
                    f"{_gib(2 * k * fwd.state)})")
        if fwd.columns > 1:
            opts.append("fewer HVP columns per call: chunk_size=1 or a smaller HVP memory_budget "
                        f"(method.hvp.chunk_size / method.hvp.memory_budget in bytes; now "
                        f"{_gib(fwd.intermediates)} for {fwd.columns} columns)")
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
                "(hypergrad-run: trainer.memory_budget_gb)")
    return "; ".join(opts)


STEP_COST = {"forward": None, "reverse": 4, "checkpointed": 5}
"""Gradient evaluations per inner step (forward: ``1 + 2K``); see the module docstring."""


def choose_method(problem: InnerProblem, mode: str = "offline",
                  memory_budget: float | None = None,
                  forward: ForwardMode | None = None,
                  checkpointed: ReverseMode | None = None) -> tuple[str, str]:
    """Pick ``"forward"``, ``"reverse"`` or ``"checkpointed"`` (reverse mode with
    ``checkpoint="sqrt"``); returns the name and the reason in words.

    The rule: online tuning needs forward mode. Offline, the memory estimates
    (:func:`estimate_memory`, ``forward``'s HVP strategy, ``checkpointed``'s interval) are
    compared with ``memory_budget`` (bytes; ``None``: the device's available memory); a method
    that does not fit is never picked, and among those that fit the cheapest per inner step
    wins: forward ``1 + 2K`` gradients, reverse 4, checkpointed reverse 5 (ties to forward,
    whose memory does not grow with T). So checkpointed reverse is picked only where full
    reverse does not fit and forward either does not fit or costs more (K >= 3). Only exact
    methods are chosen; when none fits, :class:`~hypergrad.errors.MemoryBudgetError` gives the
    numbers and the options (truncated reverse, implicit differentiation among them).
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
    ck_method = checkpointed if checkpointed is not None else ReverseMode(checkpoint="sqrt")
    ckpt = estimate_memory(problem, ck_method)
    ests = {"forward": fwd, "reverse": rev, "checkpointed": ckpt}
    cost = {"forward": 1 + 2 * k, "reverse": 4, "checkpointed": 5}
    both = (f"forward needs ~{_gib(fwd.total)}, reverse ~{_gib(rev.total)}, checkpointed reverse "
            f"~{_gib(ckpt.total)}, budget {_gib(budget)}")
    fits = [n for n in ("forward", "reverse", "checkpointed") if ests[n].total <= budget]
    if not fits:
        raise MemoryBudgetError(
            f"method=auto: neither method fits the memory budget of {_gib(budget)}: {fwd}; "
            f"{rev}; {ckpt}. Options: {_options(problem, fwd, rev, mode, ckpt)}.")
    name = min(fits, key=lambda n: (cost[n], n != "forward"))
    label = {"forward": "forward mode", "reverse": "reverse mode",
             "checkpointed": "checkpointed reverse mode"}
    out = [label[n] for n in ("forward", "reverse") if n not in fits]
    why_fit = "; ".join(f"{x} would not fit" for x in out)
    costs = (f"K={k}: forward costs ~{1 + 2 * k} gradients per step, reverse ~4, checkpointed "
             f"reverse ~5")
    if name == "forward" and not why_fit:
        return "forward", f"{costs}, and forward's memory is independent of T ({both})"
    if name == "reverse" and not why_fit:
        return "reverse", f"{costs}; both fit ({both})"
    return name, f"{why_fit}; {costs} ({both})"


def check_memory(problem: InnerProblem, method: Method, mode: str = "offline",
                 memory_budget: float | None = None, api: str = "Trainer") -> None:
    """Raise :class:`~hypergrad.errors.MemoryBudgetError` (with the numbers and the options)
    when ``method`` would not fit ``memory_budget`` (bytes; ``None``: the device's available
    memory). Methods without an estimate (finite differences, your own) are not checked."""
    if not isinstance(method, (ForwardMode, ReverseMode, HD, ImplicitDiff)):
        return
    budget = _budget(problem, memory_budget)
    est = estimate_memory(problem, method)
    if est.total <= budget:
        return
    fwd = est if isinstance(method, ForwardMode) else estimate_memory(problem, ForwardMode())
    rev = est if est.method == "reverse" else estimate_memory(problem, ReverseMode())
    other = rev if isinstance(method, ForwardMode) else fwd
    raise MemoryBudgetError(
        f"{api}: method={est.method} needs about {est} > memory budget {_gib(budget)} "
        f"(K={problem.num_hyperparams}, T={problem.steps}, state {_gib(est.state)}); "
        f"{other.method} would need ~{_gib(other.total)}. Options: "
        f"{_options(problem, fwd, rev if mode == 'offline' else None, mode)}.")


def make_method(name: str = "forward", hvp: str = "vmap_vjp", chunk_size: int | None = None,
                memory_budget_gb: float | None = None,
                compile: bool = False, *, truncate: int | None = None,
                checkpoint: int | str | None = None, step_vjp: str = "double_backward",
                mu: float = 0.9, solver: str = "cg", maxiter: int = 100, tol: float = 1e-10,
                loss_steps: list[int] | None = None, grad_tol: float = 1e-3) -> Method:
    """A method by name (the strings ``Trainer(method="forward")`` takes, and earlier code). The
    Hydra configs no longer use it: they instantiate the method classes (``configs/method/``).

    - ``"forward"`` (with the HVP strategy ``hvp``), ``"auto"`` (an :class:`AutoMode` resolved
      by :func:`choose_method`; its forward mode keeps ``hvp``, ``chunk_size``,
      ``memory_budget_gb`` and ``compile``), ``"marthe"`` (forward mode discounted by ``mu``;
      the same HVP options).
    - ``"reverse"``: :class:`ReverseMode` with ``truncate`` (the last k steps), ``checkpoint``
      (an int, or ``"sqrt"``; a string of digits is an int) and ``step_vjp``
      (``"double_backward"`` or ``"mixed"``).
    - ``"hd"``: :class:`~hypergrad.HD`.
    - ``"implicit"``: :class:`~hypergrad.ImplicitDiff` with ``solver`` (``"cg"``,
      ``"neumann"``, ``"fixed_point"``), ``maxiter``, ``tol``, ``loss_steps`` and
      ``grad_tol``.

    ``chunk_size`` / ``memory_budget_gb`` set the HVP strategy's chunking (default: automatic
    from :data:`hypergrad.hvp.DEFAULT_MEMORY_BUDGET`); ``compile`` runs ``VmapVJP`` through
    ``torch.compile`` (opt-in, see BENCHMARKS.md).

    Example:
        >>> make_method("reverse", checkpoint="sqrt")
        ReverseMode(checkpoint='sqrt')
        >>> make_method("implicit", solver="neumann", maxiter=500).solver
        Neumann(maxiter=500, tol=1e-10, alpha=None)
    """
    names = ("forward", "reverse", "auto", "hd", "marthe", "implicit")
    if name not in names:
        raise ValueError(f"make_method: name={name!r}; choose one of {list(names)}.")
    if step_vjp not in STEP_VJPS:
        raise ValueError(f"make_method: step_vjp={step_vjp!r}; choose one of "
                         f"{sorted(STEP_VJPS)}.")
    if name == "reverse":
        if isinstance(checkpoint, str) and checkpoint.isdigit():
            checkpoint = int(checkpoint)
        return ReverseMode(truncate=truncate, checkpoint=checkpoint,
                           step_vjp=STEP_VJPS[step_vjp]())
    if name == "hd":
        return HD()
    if name == "implicit":
        if solver not in SOLVERS:
            raise ValueError(f"make_method: solver={solver!r}; choose one of {sorted(SOLVERS)}.")
        return ImplicitDiff(SOLVERS[solver](maxiter=maxiter, tol=tol), loss_steps=loss_steps,
                            grad_tol=grad_tol)
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
        strategy = cls()
    elif compile:
        strategy = VmapVJP(chunk_size=chunk_size, memory_budget=budget, compile=True)
    else:
        strategy = cls(chunk_size=chunk_size, memory_budget=budget)
    if name == "marthe":
        return MARTHE(mu, strategy)
    fm = ForwardMode(strategy)
    if name == "auto":
        return AutoMode(fm, ReverseMode(step_vjp=STEP_VJPS[step_vjp]()))
    return fm
