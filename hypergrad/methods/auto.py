"""``method="auto"``: forward, reverse or checkpointed reverse mode, chosen per problem from the
methods' own memory estimates and K (:func:`choose_method`).

Per-step time, in gradient evaluations (DESIGN.md): forward ``1 + 2K``, reverse ``4`` (a plain
step forward, a step VJP of about 3 backward), checkpointed reverse ``5`` (one more plain step
to recompute the segments). :func:`choose_method` picks among the **exact** methods only
(forward, reverse, checkpointed reverse): truncated reverse, implicit differentiation, HD and
MARTHE change the hypergradient, so they are suggested when nothing exact fits, never chosen.
"""

from __future__ import annotations

from torch import Tensor

from ..errors import MemoryBudgetError
from ..hvp import HVPStrategy, VmapVJP  # noqa: F401  (VmapVJP: the doctest)
from ..problem import InnerProblem
from .base import HyperGradient, MemoryEstimate, Method, Sizes, budget_words, gib
from .forward import ForwardMode
from .memory import budget, check_budget, options
from .reverse import ReverseMode

__all__ = ["AutoMode", "choose_method", "STEP_COST"]

STEP_COST = {"forward": None, "reverse": 4, "checkpointed": 5}
"""Gradient evaluations per inner step (forward: ``1 + 2K``); see the module docstring."""


class AutoMode(Method, name="auto"):
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
            available memory; with a caller's budget too, the smaller).
        hvp: short for ``forward=ForwardMode(hvp)``: the HVP strategy forward mode would use
            (so that ``method=auto`` takes the same ``method/hvp`` group and options as
            ``method=forward`` in the Hydra configs).

    Example:
        >>> AutoMode(hvp=VmapVJP(chunk_size=4)).forward.hvp
        VmapVJP(chunk_size=4, memory_budget=None)
    """

    def __init__(self, forward: ForwardMode | None = None, reverse: ReverseMode | None = None,
                 memory_budget: float | None = None,
                 checkpointed: ReverseMode | None = None, *,
                 hvp: HVPStrategy | None = None) -> None:
        if forward is not None and hvp is not None:
            raise ValueError(f"AutoMode: got forward={forward!r} and hvp={hvp!r}; pass one "
                             f"(hvp=... is short for forward=ForwardMode(hvp=...)).")
        for arg, m, cls in (("forward", forward, ForwardMode), ("reverse", reverse, ReverseMode),
                            ("checkpointed", checkpointed, ReverseMode)):
            if m is None:
                continue
            if not isinstance(m, cls):
                raise TypeError(f"AutoMode: {arg}={m!r} must be a {cls.__name__}(...).")
            if m.fingerprint():  # only the exact methods' is empty (a resume may switch)
                raise ValueError(
                    f"AutoMode: {arg}={m!r} is not exact ({m.fingerprint()}); AutoMode picks "
                    f"among exact methods only, which agree to rounding. Pass method={m!r} "
                    f"to the Trainer directly to use it (hypergrad-run: method=truncated "
                    f"for a truncated reverse mode, with its own options under method.*).")
        memory_budget = check_budget("AutoMode", memory_budget)
        self.forward = forward if forward is not None else ForwardMode(hvp)
        self.reverse = reverse if reverse is not None else ReverseMode()
        self.checkpointed = (checkpointed if checkpointed is not None else
                             ReverseMode(checkpoint="sqrt", step_vjp=self.reverse.step_vjp))
        self.memory_budget = memory_budget

    def resolve(self, problem: InnerProblem, mode: str = "offline",
                memory_budget: float | None = None) -> tuple[Method, str]:
        # both given: the smaller (a Guards(memory_budget=1000) beside AutoMode's 1e12 was
        # never checked, the Trainer trusting auto's pick to fit; the memory probe)
        mb = (memory_budget if self.memory_budget is None else self.memory_budget
              if memory_budget is None else min(self.memory_budget, memory_budget))
        name, why = choose_method(problem, mode, mb, self.forward, self.checkpointed,
                                  self.reverse)
        chosen = {"forward": self.forward, "reverse": self.reverse,
                  "checkpointed": self.checkpointed}[name]
        return chosen, f"chose {name}: {why}"

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        """The chosen method's hypergradient; its ``info`` says which method and why
        (``{"auto": "chose forward: ..."}``: called directly, the choice was said nowhere)."""
        method, why = self.resolve(problem)
        out = method.hypergradient(problem, lam)
        return out._replace(info={**(out.info or {}), "auto": why})

    def estimate_memory(self, problem: InnerProblem,
                        sizes: Sizes | None = None) -> MemoryEstimate | None:
        """The estimate of the method it would pick (within the available memory)."""
        return self.resolve(problem, memory_budget=self.memory_budget)[0].estimate_memory(
            problem, sizes)

    def __repr__(self) -> str:
        return f"AutoMode(forward={self.forward!r}, reverse={self.reverse!r})"



def choose_method(problem: InnerProblem, mode: str = "offline",
                  memory_budget: float | None = None,
                  forward: ForwardMode | None = None,
                  checkpointed: ReverseMode | None = None,
                  reverse: ReverseMode | None = None) -> tuple[str, str]:
    """Pick ``"forward"``, ``"reverse"`` or ``"checkpointed"`` (reverse mode with
    ``checkpoint="sqrt"``); returns the name and the reason in words.

    The rule: online tuning needs forward mode. Offline, the memory estimates
    (:func:`estimate_memory`: ``forward``'s HVP strategy, ``reverse``'s and ``checkpointed``'s
    own settings, e.g. ``ReverseMode(tape=True)``'s every graph held) are
    compared with ``memory_budget`` (bytes; ``None``: the device's available memory); a method
    that does not fit is never picked, and among those that fit the cheapest per inner step
    wins: forward ``1 + 2K`` gradients, reverse 4, checkpointed reverse 5 (ties to forward,
    whose memory does not grow with T). So checkpointed reverse is picked only where full
    reverse does not fit and forward either does not fit or costs more (K >= 3). The estimates
    are counted in that order and the first that fits is picked: the others are not counted
    (a count on fake tensors costs about two plain runs of a small model; reasons name only
    the methods counted). Only exact methods are chosen; when none fits,
    :class:`~hypergrad.errors.MemoryBudgetError` gives the numbers and the options (truncated
    reverse, implicit differentiation among them).
    """
    k = problem.num_hyperparams
    room = budget(problem, check_budget("choose_method", memory_budget))
    sizes = Sizes.of(problem)
    reverse_mode = reverse if reverse is not None else ReverseMode()
    methods: dict[str, ForwardMode | ReverseMode] = {
        "forward": forward if forward is not None else ForwardMode(),
        "reverse": reverse_mode,
        "checkpointed": (checkpointed if checkpointed is not None
                         else ReverseMode(checkpoint="sqrt"))}
    if mode == "online":
        fwd = methods["forward"].estimate_memory(problem, sizes)
        if fwd.total > room:
            raise MemoryBudgetError(
                f"method=auto: online tuning needs forward mode, which needs about {fwd} > "
                f"memory budget {budget_words(room)}. Options: "
                f"{options(problem, fwd, None, mode, room=room)}.")
        return "forward", "online tuning needs hypergradients during training (forward mode)"
    # a reverse mode given checkpoints of its own (method.reverse.checkpoint=sqrt) recomputes
    # the states as the checkpointed one does: its cost and name said plain reverse mode's
    own_ckpt = reverse_mode.segment(problem.steps) < reverse_mode.horizon(problem.steps)
    cost = {"forward": 1 + 2 * k, "reverse": 5 if own_ckpt else 4, "checkpointed": 5}
    # counted cheapest first, until one fits: a count on fake tensors costs a few plain runs of
    # a small model, and a method that costs more per step than one that fits is never picked
    ests: dict[str, MemoryEstimate] = {}
    name = None
    for n in sorted(methods, key=lambda n: (cost[n], n != "forward")):
        ests[n] = methods[n].estimate_memory(problem, sizes)
        if ests[n].total <= room:
            name = n
            break
    if name is None:
        fwd, rev, ckpt = (ests[n] for n in ("forward", "reverse", "checkpointed"))
        raise MemoryBudgetError(
            f"method=auto: no exact method fits the memory budget of {budget_words(room)}: "
            f"{fwd}; {rev}; {ckpt}. Options: "
            f"{options(problem, fwd, rev, mode, ckpt, chosen='auto', room=room)}.")
    words = {"forward": "forward",
             "reverse": "reverse (checkpointed as given)" if own_ckpt else "reverse",
             "checkpointed": "checkpointed reverse"}
    counted = [n for n in ("forward", "reverse", "checkpointed") if n in ests]
    needs = ", ".join(f"{words[n]}{' needs' if i == 0 else ''} ~{gib(ests[n].total)}"
                      for i, n in enumerate(counted))
    both = f"{needs}, budget {gib(room)}"
    why_fit = "; ".join(f"{words[n]} mode would not fit" for n in ("forward", "reverse")
                        if n in ests and n != name)
    costs = (f"K={k}: forward costs ~{1 + 2 * k} gradients per step, {words['reverse']} "
             f"~{cost['reverse']}, checkpointed reverse ~5")
    if name == "forward" and not why_fit:
        return "forward", f"{costs}, and forward's memory is independent of T ({both})"
    if name == "reverse" and not why_fit:
        return "reverse", f"{costs}; reverse fits ({both})"
    return name, f"{why_fit}; {costs} ({both})"
