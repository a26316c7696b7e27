"""Adam and AdamW as ``torch.optim.Adam`` / ``torch.optim.AdamW`` (Kingma & Ba 2015; Loshchilov &
Hutter 2019), with their tangent in closed form."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .base import (
    Arg,
    Optimizer,
    Params,
    TangentContext,
    factory_defaults,
    flatten_group,
    fma,
    group_by_values,
    inv_twice,
    is_zero,
    owned,
    plain_update,
    register,
    safe_sqrt,
    torch_flags,
    unflatten_group,
)
from .clip import clip_grad_norm as with_clip

__all__ = ["Adam", "AdamW", "AdamState", "adam", "adamw"]


class AdamState(NamedTuple):
    """First and second moment estimates, dicts param name -> tensor."""

    exp_avg: dict[str, Tensor]
    exp_avg_sq: dict[str, Tensor]


class Adam(Optimizer):
    """``d = g + wd w`` (L2; :class:`AdamW` decays ``w <- (1 - lr wd) w`` instead),
    ``m = m + (1 - b1)(d - m)``, ``v = b2 v + (1 - b2) d^2``,
    ``w' = w - (lr / c1) m / (sqrt(v) / c2 + eps)`` with ``c1 = 1 - b1^n``,
    ``c2 = sqrt(1 - b2^n)``, ``n = t + 1``. The square root is :func:`safe_sqrt` (finite
    tangents where a second moment is 0); ``eps_root`` is added under it (optax's guard)."""

    elementwise = True  # each entry's update reads only that entry

    hyper_args = ("lr", "eps", "weight_decay")
    pair_args = ("betas",)
    options = ("eps_root",)
    domains = {"lr": "positive", "betas": "unit", "eps": "positive",
               "weight_decay": "nonnegative"}
    examples = {"lr": "1e-3", "betas": "(0.9, 0.999)", "eps": "1e-8", "weight_decay": "1e-2"}
    decoupled = False
    stationary_args: tuple[str, ...] = ("weight_decay",)

    def init(self, params: Params) -> AdamState:
        return AdamState({k: torch.zeros_like(p) for k, p in params.items()},
                         {k: torch.zeros_like(p) for k, p in params.items()})

    def update(self, grads: Params, state: NamedTuple, params: Params, hp: Mapping[str, Any],
               step: int) -> tuple[Params, AdamState]:
        """Per parameter; in a plain run (outside autograd and function transforms:
        :func:`~hypergrad.optim.base.plain_update`) the parameters that read the same
        hyperparameter values are concatenated into one flat tensor per group, so that a step
        costs a few operations per group instead of a dozen per parameter: the same operations
        on the same scalars in the same order, so the result is the same bit for bit
        (tested)."""
        a, read = self.args, self.read
        assert isinstance(state, AdamState)
        n = step + 1
        has_wd = not is_zero(a["weight_decay"])

        def values(k: str) -> tuple[Any, ...]:
            return (read(a["lr"], hp, k), read(a["betas"][0], hp, k), read(a["betas"][1], hp, k),
                    read(a["weight_decay"], hp, k) if has_wd else None, read(a["eps"], hp, k))

        plain = plain_update(params, grads)
        groups = (group_by_values(params, values) if plain
                  else [([k], values(k)) for k in params])
        new_p: dict[str, Tensor] = {}
        m_new: dict[str, Tensor] = {}
        v_new: dict[str, Tensor] = {}
        for keys, (lr, b1, b2, wd, eps) in groups:
            p, g = flatten_group(params, keys), flatten_group(grads, keys)
            m0, v0 = flatten_group(state.exp_avg, keys), flatten_group(state.exp_avg_sq, keys)
            if has_wd:
                if self.decoupled:
                    p = p * (1 - lr * wd)
                else:
                    g = g + wd * p
            m = m0 + (1 - b1) * (g - m0)  # torch uses lerp
            v = b2 * v0 + (1 - b2) * g * g
            bc1 = 1 - b1**n
            bc2_sqrt = (1 - b2**n) ** 0.5
            denom = safe_sqrt(v, a["eps_root"]) / bc2_sqrt + eps
            unflatten_group(new_p, p - (lr / bc1) * (m / denom), params, keys)
            unflatten_group(m_new, m, params, keys)
            unflatten_group(v_new, v, params, keys)
        if not plain:
            return new_p, AdamState(m_new, v_new)
        order = list(params)  # the parameters' order, as the per-parameter update keeps it
        return ({k: new_p[k] for k in order}, AdamState({k: m_new[k] for k in order},
                                                        {k: v_new[k] for k in order}))

    def tangent(self, ctx: TangentContext, new_params: Params, new_state: NamedTuple
                ) -> tuple[Params, AdamState]:
        """All columns at once, no autograd (``s = sqrt(v)``, ``den = s / c2 + eps``)::

            Z_d = G + wd Z_w                         Z_m = lerp(Z_m, Z_d, 1 - b1)
            Z_v = b2 Z_v + 2 (1 - b2) d Z_d          Z_w' = Z_w - (lr / c1) / den Z_m
                                                            + (lr / c1) m / den^2 / (2 s c2) Z_v

        (``1 / (2 s)`` taken as 0 where ``s = 0``, as :func:`safe_sqrt` does), plus the
        hyperparameters' own terms (``lr``, ``b1``, ``b2`` through the bias corrections too,
        ``eps``, ``wd``) on the rows of the columns the optimizer reads. Per tensor: six
        multiply-adds over the K columns."""
        a, read, hp, c = self.args, self.read, ctx.hp, ctx
        assert isinstance(new_state, AdamState)
        n = ctx.step + 1
        has_wd = not is_zero(a["weight_decay"])
        new_zp, new_zm, new_zv = {}, {}, {}
        for k, w in ctx.params.items():
            d, zd, zw = ctx.grads[k], ctx.G[k], ctx.z_params[k]
            lr, b1, b2 = read(a["lr"], hp, k), read(a["betas"][0], hp, k), read(a["betas"][1],
                                                                                 hp, k)
            eps = read(a["eps"], hp, k)
            dlr, db1, db2 = c.derivative(lr), c.derivative(b1), c.derivative(b2)
            if has_wd:
                wd = read(a["weight_decay"], hp, k)
                if self.decoupled:
                    zw = zw * (1 - lr * wd)
                    c.add_term(zw, c.combine((-wd, dlr), (-lr, c.derivative(wd))), w)
                else:
                    zd = fma(owned(zd), zw, wd, inplace=True)
                    c.add_direct(zd, wd, w)
                    d = d + wd * w
            m_prev, v_prev = ctx.state.exp_avg[k], ctx.state.exp_avg_sq[k]  # type: ignore[attr-defined]
            m, v = new_state.exp_avg[k], new_state.exp_avg_sq[k]
            zm = torch.lerp(ctx.z_state.exp_avg[k], zd, 1 - b1)  # type: ignore[attr-defined]
            c.add_term(zm, db1, lambda: m_prev - d)
            zv = ctx.z_state.exp_avg_sq[k] * b2  # type: ignore[attr-defined]
            zv.addcmul_(zd, 2 * (1 - b2) * d)
            c.add_term(zv, db2, lambda: v_prev - d * d)
            c1 = 1 - b1**n
            c2 = (1 - b2**n) ** 0.5
            root = safe_sqrt(v, a["eps_root"])
            den = root / c2 + eps
            ratio = m / den
            step_den = (lr / c1) * ratio / den  # d w' / d den
            zn = torch.addcmul(zw, zm, -(lr / c1) / den)
            zn.addcmul_(zv, step_den * inv_twice(root) / c2)
            dc1 = c.combine((-n * b1 ** (n - 1), db1))  # d c1
            dc2 = c.combine((-0.5 * n * b2 ** (n - 1) / c2, db2))  # d c2
            c.add_term(zn, c.combine((-1 / c1, dlr), (lr / c1**2, dc1)), ratio)
            c.add_direct(zn, eps, step_den)
            c.add_term(zn, dc2, lambda: -step_den * root / c2**2)
            new_zp[k], new_zm[k], new_zv[k] = zn, zm, zv
        return new_zp, AdamState(new_zm, new_zv)

    def to_torch(self, params: list[Tensor], hp: Mapping[str, Any] | None = None
                 ) -> torch.optim.Optimizer:
        a, v = self.args, self._value
        if a["eps_root"]:  # exported without it, the run was another (8e-2 off in 10 steps)
            raise NotImplementedError(
                f"{self.name}.to_torch: eps_root={a['eps_root']:g} (added under the square "
                f"root) has no torch.optim twin: torch.optim."
                f"{'AdamW' if self.decoupled else 'Adam'} adds eps outside it only. Tune with "
                f"eps_root=0 (the default) to train the result in torch.optim.")
        cls = torch.optim.AdamW if self.decoupled else torch.optim.Adam
        return cls(params, lr=v(a["lr"], hp), betas=(v(a["betas"][0], hp), v(a["betas"][1], hp)),
                   eps=v(a["eps"], hp), weight_decay=v(a["weight_decay"], hp))


class AdamW(Adam):
    """Adam with decoupled weight decay: ``w <- (1 - lr wd) w`` before the Adam step."""

    decoupled = True
    stationary_args = ()


@register
@torch_flags
def adam(lr: Arg = 1e-3, betas: tuple[Arg, Arg] = (0.9, 0.999), eps: Arg = 1e-8,
         weight_decay: Arg = 0.0, eps_root: float = 0.0,
         clip_grad_norm: float | None = None, amsgrad: bool = False) -> Optimizer:
    """Adam as ``torch.optim.Adam`` (Kingma & Ba 2015), L2 weight decay added to the gradient.

    ``eps_root`` is added under the square root (optax's guard); the square root itself is
    :func:`safe_sqrt`, so tangents stay finite when a second moment is exactly 0.
    ``amsgrad=True`` is refused (named, rather than Python's "unexpected keyword").
    ``lr``, ``betas``, ``eps``, ``weight_decay``: as ``torch.optim.Adam``'s (the same
    defaults).
    The arguments typed ``Arg`` take a number or a hyperparameter's name (``lr="lr"``).
    ``clip_grad_norm``: the gradient's global norm clipped to it before the update
    (:func:`~hypergrad.optim.clip.clip_grad_norm`); ``None``: no clipping.
    """
    _no_amsgrad("adam", amsgrad)
    return with_clip(Adam(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                          eps_root=_eps_root("adam", eps_root)), clip_grad_norm)


@register
@torch_flags
def adamw(lr: Arg = 1e-3, betas: tuple[Arg, Arg] = (0.9, 0.999), eps: Arg = 1e-8,
          weight_decay: Arg = 1e-2, eps_root: float = 0.0,
          clip_grad_norm: float | None = None, amsgrad: bool = False) -> Optimizer:
    """AdamW as ``torch.optim.AdamW`` (Loshchilov & Hutter 2019): ``w *= 1 - lr * wd`` first.
    ``amsgrad=True`` is refused. ``lr``, ``betas``, ``eps``, ``weight_decay``: as
    ``torch.optim.AdamW``'s (the same defaults); ``eps_root``: as :func:`adam`'s.
    The arguments typed ``Arg`` take a number or a hyperparameter's name (``lr="lr"``).
    ``clip_grad_norm``: the gradient's global norm clipped to it before the update
    (:func:`~hypergrad.optim.clip.clip_grad_norm`); ``None``: no clipping.
    """
    _no_amsgrad("adamw", amsgrad)
    return with_clip(AdamW(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                           eps_root=_eps_root("adamw", eps_root)), clip_grad_norm)


def _no_amsgrad(api: str, amsgrad: Any) -> None:
    """``amsgrad`` is taken only as False: AMSGrad's running maximum of the second moments has
    no derivative where two are equal, and is not implemented here."""
    # off as torch reads it: False, 0, None, np.False_ (0 was refused "use amsgrad=False")
    if amsgrad is not None and (not isinstance(amsgrad, (bool, int, np.bool_, np.integer))
                                or bool(amsgrad)):
        raise NotImplementedError(f"{api}: amsgrad={amsgrad!r} is not supported (AMSGrad's "
                                  f"running maximum of the second moments is not implemented "
                                  f"here); use amsgrad=False, or tune eps and betas[1] instead.")


def _eps_root(api: str, eps_root: Any) -> float:
    """``eps_root`` is a fixed option (no hyperparameter): a finite number >= 0."""
    if isinstance(eps_root, bool) or not isinstance(eps_root, (int, float)) or not (
            0 <= eps_root < math.inf):
        raise ValueError(f"{api}: eps_root={eps_root!r} must be a number >= 0, e.g. "
                         f"eps_root=1e-8 (or 0.0, the default).")
    return float(eps_root)

Adam.defaults = factory_defaults(adam, Adam)
AdamW.defaults = factory_defaults(adamw, AdamW)
