"""Adagrad as ``torch.optim.Adagrad`` (Duchi et al. 2011), with its tangent in closed form."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .base import (
    Arg,
    Optimizer,
    Params,
    TangentContext,
    factory_defaults,
    fma,
    inv_twice,
    is_zero,
    l2_tangent,
    register,
    safe_sqrt,
    torch_flags,
)
from .clip import clip_grad_norm as with_clip

__all__ = ["Adagrad", "AdagradState", "adagrad"]


class AdagradState(NamedTuple):
    """``sum``: the accumulated squared gradients, dict param name -> tensor."""

    sum: dict[str, Tensor]


class Adagrad(Optimizer):
    """``d = g + wd w``; ``S = S + d^2``; ``w -= clr d / (sqrt(S) + eps)`` with
    ``clr = lr / (1 + t lr_decay)`` at the 0-based step ``t``."""

    elementwise = True  # each entry's update reads only that entry

    hyper_args = ("lr", "lr_decay", "weight_decay", "eps")
    options = ("initial_accumulator_value",)
    domains = {"lr": "positive", "lr_decay": "nonnegative", "weight_decay": "nonnegative",
               "eps": "positive"}
    examples = {"lr": "1e-2", "lr_decay": "0.0", "weight_decay": "1e-4", "eps": "1e-10"}
    # d = g + wd w: at a fixed point d = 0, a stationary point of L + wd ||w||^2 / 2
    stationary_args = ("weight_decay",)

    def init(self, params: Params) -> AdagradState:
        v = float(self.args["initial_accumulator_value"])
        return AdagradState({k: torch.full_like(p, v) for k, p in params.items()})

    def update(self, grads: Params, state: NamedTuple, params: Params, hp: Mapping[str, Any],
               step: int) -> tuple[Params, AdagradState]:
        a, read = self.args, self.read
        assert isinstance(state, AdagradState)
        new_p, new_s = {}, {}
        for k, p in params.items():
            d = grads[k]
            if not is_zero(a["weight_decay"]):
                d = d + read(a["weight_decay"], hp, k) * p
            clr = read(a["lr"], hp, k) / (1 + step * read(a["lr_decay"], hp, k))
            s = new_s[k] = state.sum[k] + d * d
            new_p[k] = p - clr * (d / (safe_sqrt(s) + read(a["eps"], hp, k)))
        return new_p, AdagradState(new_s)

    def tangent(self, ctx: TangentContext, new_params: Params, new_state: NamedTuple
                ) -> tuple[Params, AdagradState]:
        """All columns at once, no autograd (``r = sqrt(S)``, ``den = r + eps``,
        ``q = d / den``)::

            Z_d = G + wd Z_w (+ dwd w)      Z_S = Z_S + 2 d Z_d
            Z_q = Z_d / den - q / den (Z_S / (2 r) + deps)
            Z_w' = Z_w - clr Z_q - (dlr / (1 + t decay) - lr t ddecay / (1 + t decay)^2) q
        """
        a, read, hp, c, t = self.args, self.read, ctx.hp, ctx, ctx.step
        assert isinstance(new_state, AdagradState)
        zp_new, zs_new = {}, {}
        for k in ctx.params:
            d, zd = l2_tangent(self, ctx, "weight_decay", k)
            zs = torch.addcmul(ctx.z_state.sum[k], zd, 2 * d)  # type: ignore[attr-defined]
            zs_new[k] = zs
            lr, decay, eps = read(a["lr"], hp, k), read(a["lr_decay"], hp, k), read(a["eps"], hp,
                                                                                   k)
            r = safe_sqrt(new_state.sum[k])
            den = r + eps
            q = d / den
            zden = zs * inv_twice(r)
            c.add_direct(zden, eps, torch.ones_like(r))
            zq = torch.addcmul(zd / den, zden, -q / den)
            scale = 1 + t * decay
            clr = lr / scale
            zw = fma(ctx.z_params[k], zq, -clr, inplace=False)
            c.add_term(zw, c.combine((1 / scale, c.derivative(lr)),
                                     (-lr * t / scale**2, c.derivative(decay))), q, -1.0)
            zp_new[k] = zw
        return zp_new, AdagradState(zs_new)

    def to_torch(self, params: list[Tensor], hp: Mapping[str, Any] | None = None
                 ) -> torch.optim.Optimizer:
        a, v = self.args, self._value
        return torch.optim.Adagrad(params, lr=v(a["lr"], hp), lr_decay=v(a["lr_decay"], hp),
                                   weight_decay=v(a["weight_decay"], hp), eps=v(a["eps"], hp),
                                   initial_accumulator_value=a["initial_accumulator_value"])


@register
@torch_flags
def adagrad(lr: Arg = 1e-2, lr_decay: Arg = 0.0, weight_decay: Arg = 0.0, eps: Arg = 1e-10,
            initial_accumulator_value: float = 0.0,
            clip_grad_norm: float | None = None) -> Optimizer:
    """Adagrad as ``torch.optim.Adagrad`` (same defaults): ``lr``, ``lr_decay``,
    ``weight_decay``, ``eps``, ``initial_accumulator_value`` as torch's.
    The arguments typed ``Arg`` take a number or a hyperparameter's name (``lr="lr"``).
    ``clip_grad_norm``: the gradient's global norm clipped to it before the update
    (:func:`~hypergrad.optim.clip.clip_grad_norm`); ``None``: no clipping.

    Example:
        >>> sorted(adagrad(lr="lr", weight_decay="wd").bound_names())
        ['lr', 'wd']
    """
    v = initial_accumulator_value
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        raise ValueError(f"adagrad: initial_accumulator_value={v!r} must be a number >= 0, "
                         f"e.g. initial_accumulator_value=0.0 (the default).")
    return with_clip(Adagrad(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, eps=eps,
                             initial_accumulator_value=float(initial_accumulator_value)),
                     clip_grad_norm)

Adagrad.defaults = factory_defaults(adagrad, Adagrad)
