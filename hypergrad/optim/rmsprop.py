"""RMSprop as ``torch.optim.RMSprop`` (Hinton's lecture 6e; momentum and the centered variant of
Graves 2013), with its tangent in closed form."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .base import (
    Arg,
    Optimizer,
    Params,
    TangentContext,
    factory_defaults,
    flag,
    fma,
    inv_twice,
    is_zero,
    l2_tangent,
    register,
    safe_sqrt,
    torch_flags,
)
from .clip import clip_grad_norm as with_clip

__all__ = ["RMSprop", "RMSpropState", "rmsprop"]


class RMSpropState(NamedTuple):
    """``square_avg`` always; ``momentum_buffer`` when momentum is not the constant 0;
    ``grad_avg`` when centered (empty dicts otherwise)."""

    square_avg: dict[str, Tensor]
    momentum_buffer: dict[str, Tensor]
    grad_avg: dict[str, Tensor]


class RMSprop(Optimizer):
    """``d = g + wd w``; ``v = alpha v + (1 - alpha) d^2``; centered: ``a = lerp(a, d, 1 - alpha)``
    and ``r = sqrt(v - a^2)``, else ``r = sqrt(v)``; ``den = r + eps``; with momentum
    ``buf = mom buf + d / den``, ``w -= lr buf``, else ``w -= lr d / den``."""

    elementwise = True  # each entry's update reads only that entry

    hyper_args = ("lr", "alpha", "eps", "weight_decay", "momentum")
    options = ("centered",)
    domains = {"lr": "positive", "alpha": "unit", "eps": "positive",
               "weight_decay": "nonnegative", "momentum": "unit"}
    examples = {"lr": "1e-2", "alpha": "0.99", "eps": "1e-8", "weight_decay": "1e-4",
                "momentum": "0.9"}
    # d = g + wd w: at a fixed point d = 0, a stationary point of L + wd ||w||^2 / 2
    stationary_args = ("weight_decay",)

    def init(self, params: Params) -> RMSpropState:
        z = lambda: {k: torch.zeros_like(p) for k, p in params.items()}  # noqa: E731
        return RMSpropState(z(), {} if is_zero(self.args["momentum"]) else z(),
                            z() if self.args["centered"] else {})

    def _den(self, v: Tensor, avg: Tensor | None, eps: Any) -> tuple[Tensor, Tensor]:
        """``(r, r + eps)`` with ``r`` the (centered) root of the second moment."""
        r = safe_sqrt(v if avg is None else v - avg * avg)
        return r, r + eps

    def update(self, grads: Params, state: NamedTuple, params: Params, hp: Mapping[str, Any],
               step: int) -> tuple[Params, RMSpropState]:
        a, read = self.args, self.read
        assert isinstance(state, RMSpropState)
        new_p: Params = {}
        sq, buf, gavg = {}, {}, {}
        for k, p in params.items():
            d = grads[k]
            if not is_zero(a["weight_decay"]):
                d = d + read(a["weight_decay"], hp, k) * p
            alpha = read(a["alpha"], hp, k)
            v = alpha * state.square_avg[k] + (1 - alpha) * d * d
            sq[k] = v
            avg = None
            if a["centered"]:
                avg = gavg[k] = torch.lerp(state.grad_avg[k], d, 1 - alpha)
            _, den = self._den(v, avg, read(a["eps"], hp, k))
            lr = read(a["lr"], hp, k)
            if not is_zero(a["momentum"]):
                b = buf[k] = read(a["momentum"], hp, k) * state.momentum_buffer[k] + d / den
                new_p[k] = p - lr * b
            else:
                new_p[k] = p - lr * (d / den)
        return new_p, RMSpropState(sq, buf, gavg)

    def tangent(self, ctx: TangentContext, new_params: Params, new_state: NamedTuple
                ) -> tuple[Params, RMSpropState]:
        """All columns at once, no autograd::

            Z_d = G + wd Z_w (+ dwd w)          Z_v = alpha Z_v + 2 (1 - alpha) d Z_d
                                                      (+ dalpha (v_prev - d^2))
            centered: Z_a = lerp(Z_a, Z_d, 1 - alpha) (+ dalpha (a_prev - d)),
                      Z_r = (Z_v - 2 a Z_a) / (2 r);  else Z_r = Z_v / (2 r)
            Z_q = Z_d / den - d / den^2 (Z_r + deps)          (q = d / den)
            momentum: Z_buf = mom Z_buf + Z_q (+ dmom buf_prev), Z_w' = Z_w - lr Z_buf (- dlr buf)
            else:     Z_w' = Z_w - lr Z_q (- dlr q)

        (``1 / (2 r)`` taken as 0 where ``r = 0``)."""
        a, read, hp, c = self.args, self.read, ctx.hp, ctx
        assert isinstance(new_state, RMSpropState)
        st, zst = ctx.state, ctx.z_state
        has_mom = not is_zero(a["momentum"])
        zp_new, zsq, zbuf, zgavg = {}, {}, {}, {}
        for k in ctx.params:
            d, zd = l2_tangent(self, ctx, "weight_decay", k)
            alpha, eps = read(a["alpha"], hp, k), read(a["eps"], hp, k)
            v_prev = st.square_avg[k]  # type: ignore[attr-defined]
            zv = zst.square_avg[k] * alpha  # type: ignore[attr-defined]
            zv.addcmul_(zd, 2 * (1 - alpha) * d)
            c.add_direct(zv, alpha, partial(torch.addcmul, v_prev, d, d, value=-1))
            zsq[k] = zv
            avg = None
            if a["centered"]:
                avg, a_prev = new_state.grad_avg[k], st.grad_avg[k]  # type: ignore[attr-defined]
                za = torch.lerp(zst.grad_avg[k], zd, 1 - alpha)  # type: ignore[attr-defined]
                c.add_direct(za, alpha, partial(torch.sub, a_prev, d))
                zgavg[k] = za
                zr = torch.addcmul(zv, za, -2 * avg)
            else:
                zr = zv
            r, den = self._den(new_state.square_avg[k], avg, eps)
            zr = zr * inv_twice(r)
            c.add_direct(zr, eps, torch.ones_like(r))  # den = r + eps
            q = d / den
            zq = torch.addcmul(zd / den, zr, -q / den)  # Z_d / den - d / den^2 Z_den
            lr = read(a["lr"], hp, k)
            if has_mom:
                mom = read(a["momentum"], hp, k)
                zb = fma(zq, zst.momentum_buffer[k], mom, inplace=True)  # type: ignore[attr-defined]
                c.add_direct(zb, mom, st.momentum_buffer[k])  # type: ignore[attr-defined]
                zbuf[k] = zb
                zw = fma(ctx.z_params[k], zb, -lr, inplace=False)
                c.add_direct(zw, lr, new_state.momentum_buffer[k], -1.0)
            else:
                zw = fma(ctx.z_params[k], zq, -lr, inplace=False)
                c.add_direct(zw, lr, q, -1.0)
            zp_new[k] = zw
        return zp_new, RMSpropState(zsq, zbuf, zgavg)

    def to_torch(self, params: list[Tensor], hp: Mapping[str, Any] | None = None
                 ) -> torch.optim.Optimizer:
        a, v = self.args, self._value
        return torch.optim.RMSprop(params, lr=v(a["lr"], hp), alpha=v(a["alpha"], hp),
                                   eps=v(a["eps"], hp), weight_decay=v(a["weight_decay"], hp),
                                   momentum=v(a["momentum"], hp), centered=a["centered"])


@register
@torch_flags
def rmsprop(lr: Arg = 1e-2, alpha: Arg = 0.99, eps: Arg = 1e-8, weight_decay: Arg = 0.0,
            momentum: Arg = 0.0, centered: bool = False,
            clip_grad_norm: float | None = None) -> Optimizer:
    """RMSprop as ``torch.optim.RMSprop`` (same defaults): ``lr``, ``alpha``, ``eps``,
    ``weight_decay``, ``momentum``, ``centered`` as torch's.
    The arguments typed ``Arg`` take a number or a hyperparameter's name (``lr="lr"``).
    ``clip_grad_norm``: the gradient's global norm clipped to it before the update
    (:func:`~hypergrad.optim.clip.clip_grad_norm`); ``None``: no clipping.

    Example:
        >>> sorted(rmsprop(lr="lr", alpha="alpha", momentum=0.9).bound_names())
        ['alpha', 'lr']
    """
    return with_clip(RMSprop(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                             momentum=momentum, centered=flag("rmsprop", "centered", centered)),
                     clip_grad_norm)

RMSprop.defaults = factory_defaults(rmsprop, RMSprop)
