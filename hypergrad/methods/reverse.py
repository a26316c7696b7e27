"""Reverse mode, the reference: store the states ``s_0..s_T`` (not the activation graph) and run
the adjoint recursion ``a_{t-1} = a_t^T d s_t / d s_{t-1}``, ``dE/dlam += a_t^T d s_t / d lam``
with one vector-Jacobian product of the step per t (Maclaurin et al. 2015; Franceschi et al.
2017, eq. 7-8). Memory ``O(T |s|)``; time about one gradient and one double-backward per step.

Two ways to spend less memory:

- **Truncation** (``truncate=k``; Shaban et al. 2019, FAR-HO, hypertorch, betty's
  ``unroll_steps``): backpropagate through the last ``k`` steps only, i.e. ``a_{T-k}`` is
  dropped instead of being carried further. Memory ``(k + 1) |s|``; biased for ``k < T``,
  equal to full reverse for ``k >= T``. It equals forward mode with its tangents reset at step
  ``T - k`` (tested).
- **Checkpointing** (``checkpoint=m`` or ``"sqrt"``; Griewank 1992, as in FAR-HO and
  hypertorch): the forward sweep keeps every ``m``-th state; the backward sweep recomputes
  each segment of ``m`` states from its checkpoint just before it needs them. Memory
  ``(ceil(n / m) + m) |s|`` for ``n`` backward steps, smallest at ``m ~ sqrt(n)``; one extra
  plain step per step of time. The recomputed states are the stored ones bit for bit (a plain
  step is deterministic and its random draws are fixed by the problem's seed and ``t``), so
  the result equals full reverse mode exactly (tested bitwise).

Initial-weight hyperparameters (:class:`~hypergrad.InitScale`, :class:`~hypergrad.InitWeights`)
add ``a_0^T d s_0 / d lam`` when the backward sweep reaches step 0.

Batches: a sequence or a callable gives step ``t`` its batch again by index. A streamed source
(a DataLoader, :class:`~hypergrad.data.Stream`) is read once, forwards: the forward sweep keeps
the batches of the ``n`` steps it will backpropagate (``InnerProblem.begin_run(keep_from=T -
n)``), beside their states, and the backward sweep and checkpointing's recomputed segments
replay them; they are dropped when the hypergradient is done. Memory ``n`` batches more (also
with checkpointing, whose states are ``O(sqrt n)``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections import deque
from typing import Any

import torch
from torch import Tensor
from torch.func import grad_and_value, vjp
from torch.utils._pytree import tree_map

from ..errors import ZeroHypergradientWarning
from ..hyperparams import Schedule
from ..problem import InnerProblem, InnerState
from ..stepvjp import DoubleBackward, StepVJP
from .base import (
    HyperGradient,
    MemoryEstimate,
    Method,
    Sizes,
    checked,
    refuse_initial_weights,
)

__all__ = ["ReverseMode"]


def _check_positive(api: str, name: str, value: Any, example: str) -> int:
    """``value`` as an int (a NumPy integer included), or a ValueError naming it."""
    if (isinstance(value, bool) or not isinstance(value, (int, numbers.Integral))
            or int(value) < 1):
        raise ValueError(f"{api}: {name}={value!r} must be None or an int >= 1, e.g. {example}.")
    return int(value)


class ReverseMode(Method, name="reverse"):
    """Reverse-mode hypergradients: exact, memory linear in the steps it backpropagates.

    Args:
        truncate: backpropagate through the last ``truncate`` steps only (``None``: all ``T``;
            ``truncate >= T`` is full reverse mode). Memory ``(k + 1) |s|``.
        checkpoint: ``None`` (store every state), an int ``m`` (store every ``m``-th state and
            recompute the segments backwards), or ``"sqrt"`` (``m = ceil(sqrt(n))`` for the
            ``n`` steps backpropagated: memory ``~2 sqrt(n) |s|``). Equal to full reverse mode
            bit for bit.
        step_vjp: how to take the step's vector-Jacobian product (default
            :class:`~hypergrad.stepvjp.DoubleBackward`; :class:`~hypergrad.stepvjp.MixedMode`
            is forward-over-reverse).
        tape: record the whole inner run on autograd's tape (every step's gradient with its
            graph) and take ``dE/dlam`` in one backward pass, instead of storing the states
            and taking each step's VJP by recomputing the step. The same hypergradient
            (tests: float64, to rounding); no step is computed twice, so on small models it
            costs 2.6-2.8 plain runs against 5.0-5.2 (docs/benchmarks.md); memory is the
            whole run's graph (``T`` steps' gradients with their graphs), so only where that
            fits. Not with ``truncate`` or ``checkpoint``, nor across data-parallel ranks.

    Example:
        >>> ReverseMode()                                # full reverse, every state stored
        ReverseMode()
        >>> ReverseMode(checkpoint="sqrt")               # O(sqrt T) states, same result
        ReverseMode(checkpoint='sqrt')
        >>> ReverseMode(truncate=20)                     # the last 20 steps only (biased)
        ReverseMode(truncate=20)
        >>> ReverseMode(tape=True)                       # one backward through the run
        ReverseMode(tape=True)
    """

    def __init__(self, truncate: int | None = None, checkpoint: int | str | None = None,
                 step_vjp: StepVJP | None = None, tape: bool = False) -> None:
        if not isinstance(tape, bool):
            raise TypeError(f"ReverseMode: tape={tape!r} must be True or False.")
        if tape and (truncate is not None or checkpoint is not None
                     or (step_vjp is not None and not isinstance(step_vjp, DoubleBackward))):
            raise ValueError("ReverseMode: tape=True records every step on autograd's tape and "
                             "takes no step VJP; drop truncate, checkpoint and step_vjp (or "
                             "drop tape for them).")
        if truncate is not None:
            truncate = _check_positive("ReverseMode", "truncate", truncate, "truncate=20 (the "
                                       "last 20 steps)")
        if checkpoint is not None and checkpoint != "sqrt":
            if isinstance(checkpoint, str):
                raise ValueError(f"ReverseMode: checkpoint={checkpoint!r}; use None (store every "
                                 f"state), an int m >= 1 (every m-th state) or 'sqrt'.")
            checkpoint = _check_positive("ReverseMode", "checkpoint", checkpoint,
                                         "checkpoint=10 or checkpoint='sqrt'")
        if step_vjp is not None and not isinstance(step_vjp, StepVJP):
            raise TypeError(f"ReverseMode: step_vjp must be a StepVJP such as DoubleBackward() "
                            f"or MixedMode(), got {type(step_vjp).__name__}.")
        self.truncate = truncate
        self.checkpoint = checkpoint
        self.step_vjp = step_vjp if step_vjp is not None else DoubleBackward()
        self.tape = tape

    def horizon(self, steps: int) -> int:
        """The number of steps backpropagated for a problem of ``steps`` steps."""
        return steps if self.truncate is None else min(self.truncate, steps)

    def segment(self, steps: int) -> int:
        """The checkpoint interval ``m`` for a problem of ``steps`` steps (``n`` when every
        state is stored)."""
        n = self.horizon(steps)
        if self.checkpoint is None:
            return n
        if self.checkpoint == "sqrt":
            return max(1, math.ceil(math.sqrt(n)))
        return min(int(self.checkpoint), n)

    def stored_states(self, steps: int) -> int:
        """The most states held at once (checkpoints and one recomputed segment, or every state
        backpropagated, plus the final one)."""
        n, m = self.horizon(steps), self.segment(steps)
        if m >= n or m == 1:  # every state stored (m = 1: each one a checkpoint)
            return n + 1
        return math.ceil(n / m) + m + 1

    def resolve(self, problem: InnerProblem, mode: str = "offline",
                memory_budget: float | None = None) -> tuple[Method, str]:
        """Itself; with ``truncate >= T``, full reverse mode with the same other settings (the
        same hypergradients): exact, so its run records no truncation and a resume may switch
        to forward mode. Truncated, it warns (the Trainer resolves its method once, when it is
        built) about schedule windows that end before the last ``truncate`` steps: their
        hypergradient is exactly 0, so tuning would never move them (a hypergradient taken
        directly is the truncated one, zeros included, as documented)."""
        if self.truncate is not None and self.truncate >= problem.steps:
            full = ReverseMode(checkpoint=self.checkpoint, step_vjp=self.step_vjp)
            return full, (f"with truncate={self.truncate} >= T = {problem.steps} steps is full "
                          f"reverse mode (exact): ran {full!r}")
        if self.truncate is not None:
            unread = _unread_windows(problem, self.truncate)
            if unread:
                T, k = problem.steps, self.truncate
                warnings.warn(ZeroHypergradientWarning(
                    f"{self!r}: the last {k} of T = {T} steps it backpropagates do not read "
                    f"{'; '.join(unread)}: their hypergradient is exactly 0 (not because the "
                    f"losses ignore them), so they would never be tuned. Use an exact method "
                    f"(ReverseMode(checkpoint='sqrt'): O(sqrt T) states, or ForwardMode()), a "
                    f"truncate that reaches them (truncate >= T - the window's first step), or "
                    f"fewer windows."), stacklevel=3)
        return self, ""

    def fingerprint(self) -> dict[str, Any]:
        """Truncated reverse mode's truncation length (a resume must keep it); full and
        checkpointed reverse mode are exact (``{}``: a resume may switch to forward mode)."""
        return {} if self.truncate is None else {"method": "reverse",
                                                 "method.truncate": self.truncate}

    def label(self) -> str:
        """``reverse``, ``checkpointed reverse``, or the repr for other settings."""
        if self.tape:
            return "reverse (tape)"
        if self.checkpoint is None and self.truncate is None:
            return "reverse"
        if self.truncate is None and self.checkpoint == "sqrt":
            return "checkpointed reverse"
        return repr(self).replace("ReverseMode", "reverse")

    def estimate_memory(self, problem: InnerProblem,
                        sizes: Sizes | None = None) -> MemoryEstimate:
        """``n |s| + max(|s| + v, o)``: the ``n`` states held at once (every state of the
        ``min(truncate, T)`` steps it backpropagates and the final one; checkpointed,
        ``ceil(n / m) + m + 1``), and the larger of the adjoint with one step's vector-Jacobian
        product ``v`` (its gradient and graph, the new state, the adjoint of the old one and the
        intermediates: :meth:`Sizes.step_vjp`, counted on fake tensors with
        :class:`~hypergrad.stepvjp.DoubleBackward`; :class:`~hypergrad.stepvjp.MixedMode`
        measured 0.98-1.64x its memory) and the validation loss's gradient ``o``
        (:meth:`Sizes.objective`). A streamed batch source: the ``n`` batches kept for the
        replay besides."""
        sz = Sizes.of(problem) if sizes is None else sizes
        if self.tape:  # every step's gradient and graph held: a step VJP's peak each, an upper
            # bound (measured 0.3-0.7x of it on an MLP, BatchNorm, attention and an LSTM;
            # 0.13-0.23x with 2000 per-example weights: a budget may refuse a tape that fits)
            total = problem.steps * sz.step_vjp() + 2 * sz.state + sz.objective()
            return MemoryEstimate(self.label(), total, sz.state, sz.activations, 0,
                                  total - 2 * sz.state - sz.activations,
                                  detail=f"the tape of {problem.steps} steps' gradients with "
                                         f"their graphs, at most")
        n = self.stored_states(problem.steps)
        kept = self.horizon(problem.steps) * sz.batch if problem.stream is not None else 0
        # the n states are held from the validation loss's gradient (which gives the adjoint)
        # on through the backward sweep: the larger of the two on top of them
        total = n * sz.state + max(sz.state + sz.step_vjp(), sz.objective()) + kept
        return MemoryEstimate(self.label(), total, sz.state, sz.activations, 0,
                              total - n * sz.state - sz.activations, n)

    def across_ranks(self, ranks: Any) -> Method:
        """Every mini-batch split across the ranks
        (:class:`hypergrad.distributed.ParallelReverse`)."""
        if self.tape:
            raise ValueError("ReverseMode(tape=True) runs on one process; across data-parallel "
                             "ranks use ReverseMode() (each rank's share of a step is taken by "
                             "its step VJP).")
        return ranks.reverse(self)

    def check(self, problem: InnerProblem) -> None:
        """Truncated reverse mode refuses initialisation hyperparameters, which its last ``k``
        of ``T > k`` steps do not reach (when it is built, not at the first hypergradient)."""
        if self.truncate is not None and self.truncate < problem.steps:
            refuse_initial_weights(problem, f"{self!r}", f"its last {self.truncate} of T = "
                                   f"{problem.steps} steps", "ReverseMode() (or truncate >= T)")

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        checked(type(self).__name__, problem, lam)
        self.check(problem)
        if self.tape:
            with problem.inner_run():
                return self._taped(problem, lam)
        T = problem.steps
        n, m = self.horizon(T), self.segment(T)
        start = T - n
        with problem.inner_run(keep_from=start):  # the window's batches kept for the replay
            return self._sweeps(problem, lam, start, n, m)

    def _sweeps(self, problem: InnerProblem, lam: Tensor, start: int, n: int,
                m: int) -> HyperGradient:
        T = problem.steps
        # forward sweep, plain steps: the steps before the backpropagated window are only run;
        # in it, keep every state, or with checkpointing the first state of each segment of m
        s = problem.initial_state(lam)
        for t in range(start):
            s = problem.step(s, lam, t)
        every = m >= n  # no recomputation: keep every state of the window
        kept: deque[InnerState] = deque()
        for t in range(start, T):
            if every or (t - start) % m == 0:
                kept.append(s)
            s = problem.step(s, lam, t)
        final = s
        (dp, db, dlam), value = grad_and_value(problem.objective, argnums=(0, 1, 2))(
            final.params, final.buffers, lam)
        adj = InnerState(dp, db, tree_map(torch.zeros_like, final.opt))
        hg = dlam
        # backward sweep, one segment at a time (the last one first)
        seg_starts = list(range(start, T)) if every else list(range(start, T, m))
        for c in reversed(seg_starts):
            stop = T if c == seg_starts[-1] else c + (1 if every else m)
            seg = [kept.pop()]
            for t in range(c, stop - 1):  # recompute s_{c+1} .. s_{stop-1}
                seg.append(problem.step(seg[-1], lam, t))
            for t in reversed(range(c, stop)):
                adj, dl = self.step_vjp(problem, seg.pop(), lam, t, adj)
                hg = hg + dl
        if start == 0 and problem.init_items:
            _, vjp_init = vjp(problem.initial_state, lam)  # type: ignore[misc]
            (dl,) = vjp_init(adj)
            hg = hg + dl
        return HyperGradient(value.detach(), hg.detach(), final)

    def _taped(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        """The whole run on autograd's tape (each step's gradient is differentiable: the
        step runs its function transforms under autograd), then one backward pass."""
        lm = lam.detach().clone().requires_grad_(True)
        with torch.enable_grad(), problem.second_order():
            s = problem.initial_state(lm)
            for t in range(problem.steps):
                s = problem.step(s, lm, t)
            value = problem.objective(s.params, s.buffers, lm)
            (hg,) = torch.autograd.grad(value, lm, allow_unused=True)
        if hg is None:  # E does not depend on lam at all: the checks warn about that
            hg = torch.zeros_like(lam)
        final = tree_map(lambda v: v.detach() if isinstance(v, Tensor) else v, s)
        return HyperGradient(value.detach(), hg.detach(), final)

    def __repr__(self) -> str:
        args = []
        if self.tape:
            args.append("tape=True")
        if self.truncate is not None:
            args.append(f"truncate={self.truncate!r}")
        if self.checkpoint is not None:
            args.append(f"checkpoint={self.checkpoint!r}")
        if repr(self.step_vjp) != repr(DoubleBackward()):
            args.append(f"step_vjp={self.step_vjp!r}")
        return f"ReverseMode({', '.join(args)})"


def _unread_windows(problem: InnerProblem, k: int) -> list[str]:
    """The schedule windows that none of the last ``k`` of the problem's ``T`` steps reads, as
    ``"lr's windows 0-1 of 3 (steps 0-5)"`` (a schedule per group: those windows of every
    group)."""
    T, out = problem.steps, []
    for it in problem.hyperparams.items:
        if not isinstance(it, Schedule):
            continue
        first = int(it.window(T - k, T))  # the steps from T - k read windows first..W-1
        if first > 0:
            which = "window 0" if first == 1 else f"windows 0-{first - 1}"
            out.append(f"{it.name}'s {which} of {it.windows} (steps 0-"
                       f"{it.first_reads(T)[first] - 1})")
    return out
