"""The vector-Jacobian product of one inner step, for reverse mode: strategy objects.

Step ``t`` maps ``s_t = (w, b, o)`` to ``s_{t+1} = (U_w(w, o, g, h), b', U_o(w, o, g, h))`` with
``(g, b') = (grad_w L(w, b, lam; B_t), new running statistics)`` and ``h = h_t(lam)``. Given
the adjoint ``a = (a_w, a_b, a_o)`` of ``s_{t+1}``, reverse mode needs ``a^T d s_{t+1} / d s_t``
and ``a^T d s_{t+1} / d lam`` (Franceschi et al. 2017, eq. 7-8). Two ways, equal to rounding
(tested):

- :class:`DoubleBackward` (the default): a backward pass through the graph of the step's
  gradient (reverse-over-reverse), on autograd directly where the loss draws no random numbers
  or draws them as ``torch.func`` does (checked bit for bit once), else by ``torch.func.vjp``
  of the whole step.
- :class:`MixedMode` (MixFlow-MG, Kemaev et al., ICML 2025): split the step. The update's own
  VJP (first order, elementwise) gives ``a_w``, ``a_o`` and the cotangent of the gradient
  ``u = (dU/dg)^T a``; then, by the symmetry of the joint Hessian of ``L`` in ``(w, b, lam)``,
  ``u^T d grad_w L / d(w, b, lam) = d/de grad_(w, b, lam) L(w + e u, b, lam)``: **one**
  forward-over-reverse pass ``jvp(grad L, (w, b, lam), (u, 0, 0))`` gives ``H u`` and both
  mixed partials. BatchNorm statistics get a first-order VJP of the forward pass. The
  gradient ``g`` is computed first (the update's VJP depends on it, e.g. Adam's).

Which is faster (``experiments/benchmarks/bench_stepvjp.py``, docs/benchmarks.md "Reverse mode: the
step's VJP"; 2 CPU cores, float32, batch 128): double backward on every model measured (an MLP, two
CNNs, a BatchNorm MLP; SGD and Adam): mixed mode took 1.16-2.09x its time and 0.98-1.64x its
peak memory. Mixed mode computes the gradient twice (once for ``u``, once as the primal of
``jvp``), and torch's forward-mode AD through the backward formulas costs more than the
backward of the backward here; the graph that double backward keeps is small at these sizes.
So :class:`DoubleBackward` is the default and :class:`MixedMode` an option (MixFlow-MG's
savings were measured on large models on accelerators; re-measure there).
"""

from __future__ import annotations

import abc
import warnings
from typing import Any

import torch
from torch import Tensor
from torch.func import grad, jvp, vjp
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .problem import InnerProblem, InnerState, bitwise_equal

__all__ = ["StepVJP", "DoubleBackward", "MixedMode", "STEP_VJPS"]


class StepVJP(abc.ABC):
    """How reverse mode takes the vector-Jacobian product of step ``t``.

    ``__call__(problem, state, lam, t, adj) -> (adj_prev, dlam)``: ``state`` is ``s_t`` (the
    step's input), ``adj`` the adjoint of ``s_{t+1}`` (an :class:`~hypergrad.InnerState` of
    tensors shaped like the state); returns the adjoint of ``s_t`` and ``a^T d s_{t+1} / d lam``
    of shape ``(K,)``.
    """

    name: str = "abstract"

    @abc.abstractmethod
    def __call__(self, problem: InnerProblem, state: InnerState, lam: Tensor, t: int,
                 adj: InnerState) -> tuple[InnerState, Tensor]: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class DoubleBackward(StepVJP):
    """Reverse-over-reverse: the graph of the step's gradient is built, then differentiated
    backwards.

    Where the loss draws no random numbers (``problem.draws is False``: no dropout) both passes
    run on autograd directly: the gradient by ``torch.autograd.grad(..., create_graph=True)``,
    the update on it, then one ``torch.autograd.grad`` of the new state with the adjoint. Where
    it draws, ``torch.func.vjp`` of the whole step (:meth:`~hypergrad.InnerProblem.step`), so
    that its random draws are laid out as in every other differentiated pass (see
    :meth:`~hypergrad.InnerProblem.gradient`), unless its plain steps draw the same numbers
    eagerly (:attr:`~hypergrad.InnerProblem.eager_draws`) and the first step VJP, taken both
    ways, agrees bit for bit (:attr:`~hypergrad.InnerProblem.direct_draws`): then the later
    ones take the direct route too (a reverse hypergradient of the char LM of
    :mod:`hypergrad.tasks.charlm` in 0.83-0.90x the time, ``bench_tape.py --lm``).
    ``torch.func.vjp`` also serves a problem class that overrides ``step`` or its gradient.
    Both routes compute the same operations (bitwise equal on the suite's problems, tested to
    rounding); the direct one skips ``torch.func``'s wrappers, whose Python
    took a third of a small model's step VJP (docs/benchmarks.md, "Reverse mode on autograd's
    tape"). ``direct=False`` always takes ``torch.func.vjp`` (the route before 2026-11-28).

    Example:
        >>> DoubleBackward(), DoubleBackward(direct=False)
        (DoubleBackward(), DoubleBackward(direct=False))
    """

    name = "double_backward"

    def __init__(self, direct: bool = True) -> None:
        if not isinstance(direct, bool):
            raise TypeError(f"DoubleBackward: direct={direct!r} must be True (autograd directly "
                            f"where the loss draws nothing) or False (torch.func.vjp always).")
        self.direct = direct

    def __repr__(self) -> str:
        return "DoubleBackward()" if self.direct else "DoubleBackward(direct=False)"

    def __call__(self, problem: InnerProblem, state: InnerState, lam: Tensor, t: int,
                 adj: InnerState) -> tuple[InnerState, Tensor]:
        if self.direct and _plain_step(problem) and (
                problem.draws is False
                or (problem.draws and problem.eager_draws and problem.direct_draws is not False)):
            drew = problem.draws
            got = self._direct(problem, state, lam, t, adj)
            if got is not None and drew is False and problem.draws:
                # this step drew, the first to (draws that start after step 0): in the
                # differentiated passes' order, as in every later evaluation
                return self._func(problem, state, lam, t, adj)
            if got is not None:
                if problem.draws and problem.direct_draws is None:
                    # a loss that draws: the first step VJP is also taken by torch.func.vjp;
                    # the direct route is kept where the two agree bit for bit
                    ref = self._func(problem, state, lam, t, adj)
                    if problem.step_drew:  # else decided at a step that draws
                        problem.direct_draws = bitwise_equal(got, ref)
                    return ref
                return got
        return self._func(problem, state, lam, t, adj)

    @staticmethod
    def _func(problem: InnerProblem, state: InnerState, lam: Tensor, t: int,
              adj: InnerState) -> tuple[InnerState, Tensor]:
        """The step's VJP by ``torch.func.vjp`` of :meth:`~hypergrad.InnerProblem.step`."""
        def step(s: Any, lm: Tensor) -> Any:
            return problem.step(s, lm, t)

        with problem.second_order():  # the step's VJP differentiates its gradient
            _, vjp_fn = vjp(step, state, lam)  # type: ignore[misc]
            adj_prev, dlam = vjp_fn(adj)
        return adj_prev, dlam

    @staticmethod
    def _direct(problem: InnerProblem, state: InnerState, lam: Tensor, t: int,
                adj: InnerState, batch: Any = None) -> tuple[InnerState, Tensor] | None:
        """The step's VJP on autograd, without function transforms (``None``: the new state is
        not laid out as the adjoint, which ``torch.func.vjp`` then checks and explains);
        ``batch``: step ``t``'s (default ``problem.batch(t)``; the memory count's own)."""
        leaves, spec = tree_flatten(state)
        ins = [v.detach().requires_grad_() if isinstance(v, Tensor) and v.is_floating_point()
               else v for v in leaves]
        lm = lam.detach().requires_grad_()
        with torch.enable_grad(), problem.second_order():
            s = tree_unflatten(ins, spec)
            loss, new_b = problem.train_objective(s.params, s.buffers, lm, t,
                                                  problem.batch(t) if batch is None else batch)
            w = list(s.params.values())
            gw = torch.autograd.grad(loss, w, create_graph=True, allow_unused=True)
            g = {k: torch.zeros_like(v) if d is None else d
                 for (k, v), d in zip(s.params.items(), gw)}
            params, opt = problem.update(g, s.opt, s.params, lm, t)
            outs, out_spec = tree_flatten(InnerState(params, new_b, opt))
            cots, adj_spec = tree_flatten(adj)
            if out_spec != adj_spec:
                return None
            pairs = [(o, a) for o, a in zip(outs, cots)
                     if isinstance(o, Tensor) and o.requires_grad]
            wrt = [x for x in ins if isinstance(x, Tensor) and x.requires_grad]
            got = (torch.autograd.grad([o for o, _ in pairs], [*wrt, lm], [a for _, a in pairs],
                                       allow_unused=True) if pairs else [None] * (len(wrt) + 1))
        it = iter(got[:-1])
        prev = []
        for x in ins:
            if isinstance(x, Tensor) and x.requires_grad:
                d = next(it)
                prev.append(torch.zeros_like(x) if d is None else d)
            else:  # an integer buffer (BatchNorm's count) has no adjoint
                prev.append(torch.zeros_like(x) if isinstance(x, Tensor) else x)
        dlam = torch.zeros_like(lam) if got[-1] is None else got[-1]
        return tree_unflatten(prev, spec), dlam


def direct_route(problem: InnerProblem) -> bool:
    """Whether a memory count of :class:`DoubleBackward` counts its direct route: the
    problem's own step and a loss not known to draw random numbers (before any real evaluation
    ``draws`` is ``None``, and the count takes the direct route, which holds a few percent
    more), or one whose step VJPs were found to draw the same numbers on both routes
    (:attr:`~hypergrad.InnerProblem.direct_draws`)."""
    return _plain_step(problem) and (problem.draws is not True
                                     or bool(problem.eager_draws and problem.direct_draws))


def _plain_step(problem: InnerProblem) -> bool:
    """Whether the problem's step is :class:`~hypergrad.InnerProblem`'s own (its gradient of
    ``train_objective``, then ``update``), which :meth:`DoubleBackward._direct` rebuilds."""
    cls = type(problem)
    return cls.step is InnerProblem.step and cls._gradient is InnerProblem._gradient


class MixedMode(StepVJP):
    """Forward-over-reverse for the step's second-order term (MixFlow-MG): the update's VJP
    gives ``u = (dU/dg)^T a``, then one ``jvp`` of the full gradient in the direction
    ``(u, 0, 0)`` gives ``H_ww u``, ``H_bw u`` and ``H_lam,w u`` together (see the module
    docstring). The result equals :class:`DoubleBackward`'s to rounding.

    torch 2.13's forward-over-reverse rule of ``F.mse_loss(reduction='mean')`` with a target
    that has no tangent writes into a zero tensor (pytorch/pytorch#123996); where a step hits it,
    this strategy warns once and takes that step's VJP by :class:`DoubleBackward` (same result).
    """

    name = "mixed"

    def __init__(self) -> None:
        self._fell_back = False

    def __call__(self, problem: InnerProblem, state: InnerState, lam: Tensor, t: int,
                 adj: InnerState) -> tuple[InnerState, Tensor]:
        try:
            return self._mixed(problem, state, lam, t, adj)
        except RuntimeError as err:
            if "ZeroTensors are immutable" not in str(err):
                raise
            if not self._fell_back:
                self._fell_back = True
                warnings.warn(
                    "MixedMode: torch's forward-over-reverse rule of a loss in the step writes "
                    "into a zero tangent (pytorch/pytorch#123996: F.mse_loss with "
                    "reduction='mean' and a target without tangent, open in torch 2.13); these "
                    "steps' VJPs are taken by DoubleBackward (same result). Write the loss out, "
                    "e.g. ((pred - target) ** 2).mean(), to use mixed mode.",
                    RuntimeWarning, stacklevel=3)
            return DoubleBackward()(problem, state, lam, t, adj)

    def _mixed(self, problem: InnerProblem, state: InnerState, lam: Tensor, t: int,
               adj: InnerState) -> tuple[InnerState, Tensor]:
        batch = problem.batch(t)
        w, b, o = state

        def f(p: Any, bf: Any, lm: Tensor) -> Any:
            return problem.train_objective(p, bf, lm, t, batch)

        def loss(p: Any, bf: Any, lm: Tensor) -> Tensor:
            return f(p, bf, lm)[0]  # type: ignore[no-any-return]

        with problem.second_order():
            # the gradient, and the first-order VJP of the running statistics
            if b:
                (_, new_b), vjp_f = vjp(f, w, b, lam)  # type: ignore[misc]
                one = torch.ones((), dtype=lam.dtype, device=lam.device)
                zero_b = tree_map(torch.zeros_like, new_b)
                g = vjp_f((one, zero_b))[0]
                bn_w, bn_b, bn_lam = vjp_f((torch.zeros_like(one), adj.buffers))
            else:
                g = grad(loss)(w, b, lam)
            # the update's VJP: a_w, a_o and the gradient's cotangent u

            def update(p: Any, opt: Any, gr: Any, lm: Tensor) -> Any:
                return problem.update(gr, opt, p, lm, t)

            _, vjp_u = vjp(update, w, o, g, lam)  # type: ignore[misc]
            a_w, a_o, u, a_lam = vjp_u((adj.params, adj.opt))
            # H u and the mixed partials, one forward-over-reverse pass
            full = grad(loss, argnums=(0, 1, 2))
            _, (hu_w, hu_b, hu_lam) = jvp(full, (w, b, lam),  # type: ignore[misc]
                                          (u, tree_map(torch.zeros_like, b),
                                           torch.zeros_like(lam)))
        pw = {k: a_w[k] + hu_w[k] for k in w}
        pb = {k: hu_b[k] for k in b}
        dlam = a_lam + hu_lam
        if b:
            pw = {k: pw[k] + bn_w[k] for k in w}
            pb = {k: pb[k] + bn_b[k] for k in b}
            dlam = dlam + bn_lam
        return InnerState(pw, pb, a_o), dlam


STEP_VJPS: dict[str, type[StepVJP]] = {DoubleBackward.name: DoubleBackward,
                                       MixedMode.name: MixedMode}
"""The step-VJP strategies by name (for configs)."""
