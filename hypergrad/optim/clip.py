"""Gradient clipping by global norm, composed before any inner optimizer, with its tangent.

``U_clip(s, g, h) = U(s, clip(g), h)`` with ``clip(g) = g * min(1, c / (||g|| + eps))``, ``||g||``
the norm over every parameter's gradient together, exactly as
``torch.nn.utils.clip_grad_norm_(model.parameters(), c)`` before ``opt.step()`` (``eps = 1e-6``
as torch's). The recipe of language models (``clip_grad_norm=1.0``).

Why here, as a wrapper around the optimizer (as ``optax.chain(clip_by_global_norm(c), adamw)``):
clipping is a map of the gradient between the backward pass and the update, so every path that
runs the update runs it. Reverse mode, its mixed-mode step VJP, HD, finite differences and the
``jvp`` tangent rule differentiate the clipped update through autograd with nothing added; a
data-parallel run clips the all-reduced gradient (its ranks sum ``g`` and ``G`` before the
update). Only forward mode's closed-form tangent needs a rule, and that rule is the clip's
alone, applied before the wrapped optimizer's own closed form (no optimizer module changes):

    s = c / (||g|| + eps)  where s <= 1 (the clip is active; at 1 as autograd takes it), else 1
    G' = s G + g (ds/dg . G),   ds/dg . G = -c (g . G) / (||g|| (||g|| + eps)^2)

per tangent column (``g . G`` summed over every parameter). Where the clip is inactive,
``G' = G``. The global norm couples all elements, so the clipped update is not elementwise:
an optimizer without a closed form gets its tangent from ``jvp``, not the diagonal Jacobian.

Build it with any factory's ``clip_grad_norm=`` (``adamw(lr="lr", clip_grad_norm=1.0)``,
``hypergrad-run inner_optimizer.clip_grad_norm=1.0``) or :func:`clip_grad_norm` around an
optimizer of your own.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..errors import is_real
from .base import Optimizer, Params, TangentContext

__all__ = ["ClipGradNorm", "clip_grad_norm", "clip_coefficient", "clip_tangent", "CLIP_EPS"]

CLIP_EPS = 1e-6
"""Added to the norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does."""


def global_norm(grads: Params) -> Tensor:
    """``||g||`` over every tensor, as ``clip_grad_norm_`` takes it (the norm of the
    per-tensor norms)."""
    norms = [torch.linalg.vector_norm(g) for g in grads.values()]
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))


def clip_coefficient(grads: Params, max_norm: float, eps: float = CLIP_EPS
                     ) -> tuple[Tensor, Tensor]:
    """``(min(1, c / (||g|| + eps)), ||g||)``, differentiable (``torch.clamp``: derivative 0
    where the clip is inactive)."""
    norm = global_norm(grads)
    return torch.clamp(max_norm / (norm + eps), max=1.0), norm


def clip_tangent(grads: Params, G: Params, max_norm: float, eps: float = CLIP_EPS,
                 branch: bool | None = None) -> tuple[Params, Params]:
    """The clipped gradient and its tangent ``(g', G')`` for all K columns of ``G`` (leading
    axis K), in closed form (see the module docstring). At the threshold itself
    (``c / (||g|| + eps) == 1``) the clip counts as active, as autograd's ``clamp`` takes it,
    so reverse mode and forward mode's ``jvp`` rule agree there too.

    ``branch``: whether to read the norm back to skip the work where the clip is inactive (both
    then come back unchanged, the same tensors). ``None``: on the CPU only, where reading is
    free; on an accelerator the read waited for the device at every step (the CUDA review), so
    there both are computed with the coefficient 1 and a zero correction where inactive (the
    same numbers)."""
    norm = global_norm(grads)
    ratio = max_norm / (norm + eps)
    if branch is None:
        branch = norm.device.type == "cpu"
    if branch and bool(ratio > 1.0):
        return grads, G
    active = ratio <= 1.0
    coef = torch.clamp(ratio, max=1.0)
    n = norm
    dot: Tensor | None = None  # (K,): g . G per column
    for k, g in grads.items():
        z = G[k]
        d = z.reshape(z.shape[0], -1) @ g.reshape(-1)
        dot = d if dot is None else dot + d
    assert dot is not None
    # ds/dg . G per column; at a zero gradient (active only for max_norm <= eps) the norm's
    # derivative is taken as 0, as autograd does (0 * -inf was NaN where reverse mode is finite)
    live = (n > 0) & active  # inactive: no correction (the clamp's derivative is 0)
    safe = torch.where(live, n, torch.ones_like(n))
    ds = torch.where(live, dot * (-max_norm / (safe * (safe + eps) ** 2)), torch.zeros_like(dot))
    new_g = {k: g * coef for k, g in grads.items()}
    new_G = {}
    for k, g in grads.items():
        z = G[k]
        out = z * coef
        out.add_(ds.reshape(-1, *([1] * g.ndim)) * g)
        new_G[k] = out
    return new_g, new_G


class ClipGradNorm(Optimizer):
    """``inner`` applied to the gradient clipped to global norm ``max_norm`` (see the module
    docstring). It reads the same hyperparameters as ``inner``; ``args`` are ``inner``'s plus
    ``clip_grad_norm`` (a fixed option, in a run folder's fingerprint)."""

    elementwise = False

    def __init__(self, inner: Optimizer, max_norm: float, eps: float = CLIP_EPS) -> None:
        if not isinstance(inner, Optimizer):
            raise TypeError(f"clip_grad_norm: wraps an optimizer of hypergrad.optim, got "
                            f"{type(inner).__name__}.")
        if isinstance(inner, ClipGradNorm):
            raise ValueError(f"clip_grad_norm: {inner!r} is already clipped; clip once.")
        if not is_real(max_norm) or not 0 < max_norm < math.inf:  # a NumPy number: a number
            tuned = (" The threshold is a constant: it cannot be a hyperparameter (tuned) "
                     "here." if isinstance(max_norm, (str, torch.Tensor)) else "")
            raise ValueError(f"clip_grad_norm={max_norm!r} must be a number > 0 (the largest "
                             f"global norm of the gradient), e.g. clip_grad_norm=1.0, or None "
                             f"for no clipping.{tuned}")
        # no Optimizer.__init__: the inner optimizer checked its own arguments
        self.inner = inner
        self.max_norm = float(max_norm)
        self.eps = float(eps)
        self.args = {**inner.args, "clip_grad_norm": self.max_norm}
        self.hyper_args = inner.hyper_args
        self.pair_args = inner.pair_args
        self.options = (*inner.options, "clip_grad_norm")
        self.stationary_args = inner.stationary_args

    @property
    def name(self) -> str:
        return self.inner.name

    def for_horizon(self, steps: int) -> Optimizer:
        inner = self.inner.for_horizon(steps)
        return self if inner is self.inner else ClipGradNorm(inner, self.max_norm, self.eps)

    def at_param(self, pname: str) -> Optimizer:
        inner = self.inner.at_param(pname)
        return self if inner is self.inner else ClipGradNorm(inner, self.max_norm, self.eps)

    def clip(self, grads: Params) -> Params:
        """``g * min(1, c / (||g|| + eps))``: ``clip_grad_norm_``'s result, differentiable."""
        coef, _ = clip_coefficient(grads, self.max_norm, self.eps)
        return {k: g * coef for k, g in grads.items()}

    def init(self, params: Params) -> NamedTuple:
        return self.inner.init(params)

    def update(self, grads: Params, state: NamedTuple, params: Params, hp: Mapping[str, Any],
               step: int) -> tuple[Params, NamedTuple]:
        return self.inner.update(self.clip(grads), state, params, hp, step)

    def tangent(self, ctx: TangentContext, new_params: Params, new_state: NamedTuple
                ) -> tuple[Params, NamedTuple] | None:
        """The clip's tangent (``G -> G'``), then ``inner``'s closed form on ``(g', G')``;
        ``None`` where ``inner`` has none (forward mode then takes ``jvp`` of :meth:`update`)."""
        g, G = clip_tangent(ctx.grads, ctx.G, self.max_norm, self.eps)
        if g is not ctx.grads:
            ctx = copy.copy(ctx)
            ctx.grads, ctx.G = g, G
        return self.inner.tangent(ctx, new_params, new_state)

    def penalty(self, params: Params, hp: Mapping[str, Any]) -> Tensor | None:
        """``inner``'s: at a fixed point of training the gradient is small and the clip
        inactive, so the stationary condition is ``inner``'s (implicit differentiation assumes
        it; it warns when ``w_T`` is not a fixed point)."""
        return self.inner.penalty(params, hp)

    def to_torch(self, params: list[Tensor], hp: Mapping[str, Any] | None = None
                 ) -> torch.optim.Optimizer:
        """``inner``'s ``torch.optim`` twin; clip with ``torch.nn.utils.clip_grad_norm_(params,
        max_norm)`` before each of its steps."""
        return self.inner.to_torch(params, hp)

    def __repr__(self) -> str:
        return f"{self.inner!r}.clip_grad_norm({self.max_norm:g})"


def clip_grad_norm(optimizer: Optimizer, max_norm: float | None) -> Optimizer:
    """``optimizer`` with its gradient clipped to global norm ``max_norm``
    (:class:`ClipGradNorm`); ``None``: ``optimizer`` itself.

    Example:
        >>> from hypergrad.optim import sgd
        >>> opt = clip_grad_norm(sgd(lr="lr", momentum=0.9), 1.0)
        >>> opt.name, opt.max_norm, sorted(opt.bound_names())
        ('sgd', 1.0, ['lr'])
    """
    return optimizer if max_norm is None else ClipGradNorm(optimizer, max_norm)
