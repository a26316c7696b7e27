"""SGD as ``torch.optim.SGD`` (momentum, dampening, Nesterov, L2 weight decay), with its
tangent in closed form."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .base import (
    Arg,
    Optimizer,
    Params,
    PerParam,
    TangentContext,
    const_zero,
    factory_defaults,
    flag,
    fma,
    is_zero,
    owned,
    register,
    torch_flags,
)
from .clip import clip_grad_norm as with_clip

__all__ = ["SGD", "SGDState", "sgd"]

FOREACH_DEVICES: tuple[str, ...] = ("cuda",)
"""Devices on which plain training (no autograd, no function transform) updates all parameter
tensors at once with ``torch._foreach_*`` kernels, as ``torch.optim.SGD`` does: on a GPU the
per-tensor update launched 2-3 kernels per tensor (a ResNet-18's plain step: 519 launches
against torch's 285). The differentiated passes keep the per-tensor update; the two agree to
rounding (a multiply and an add where the per-tensor one may fuse them)."""


def _plain_foreach(params: Params, values: list[Any]) -> bool:
    """Whether this update may run on ``_foreach`` kernels: plain training, every tensor on one
    device of :data:`FOREACH_DEVICES`, every hyperparameter one value for all tensors."""
    if torch.is_grad_enabled() or torch._C._functorch.maybe_current_level() is not None:
        return False
    devices = {p.device for p in params.values()}
    if len(devices) != 1 or next(iter(devices)).type not in FOREACH_DEVICES:
        return False
    return not any(isinstance(v, (dict, PerParam)) for v in values)


def _axpy(xs: list[Tensor], ys: list[Tensor], s: Any) -> list[Tensor]:
    """``[x + s * y]`` in new tensors (``s`` a number or a 0-d tensor)."""
    if isinstance(s, Tensor):
        out = torch._foreach_mul(ys, s)
        torch._foreach_add_(out, xs)
        return list(out)
    return list(torch._foreach_add(xs, ys, alpha=s))


class SGDState(NamedTuple):
    """``momentum_buffer``: dict param name -> tensor (empty when momentum is the constant 0)."""

    momentum_buffer: dict[str, Tensor]


class SGD(Optimizer):
    """``d = g + wd w``; ``buf_0 = d_0``, ``buf_t = mom buf_{t-1} + (1 - damp) d_t``;
    ``w -= lr (d + mom buf if nesterov else buf)`` (or ``lr d`` without momentum)."""

    elementwise = True  # each entry's update reads only that entry

    hyper_args = ("lr", "momentum", "dampening", "weight_decay")
    options = ("nesterov",)
    domains = {"lr": "positive", "momentum": "unit", "dampening": "unit",
               "weight_decay": "nonnegative"}
    examples = {"lr": "0.1", "momentum": "0.9", "dampening": "0.0", "weight_decay": "1e-4"}
    stationary_args = ("weight_decay",)

    def init(self, params: Params) -> SGDState:
        if is_zero(self.args["momentum"]):
            return SGDState({})
        return SGDState({k: torch.zeros_like(p) for k, p in params.items()})

    def update(self, grads: Params, state: NamedTuple, params: Params, hp: Mapping[str, Any],
               step: int) -> tuple[Params, SGDState]:
        a, read = self.args, self.read
        assert isinstance(state, SGDState)
        vals = {n: hp[a[n]] if isinstance(a[n], str) else a[n]
                for n in ("lr", "momentum", "dampening", "weight_decay")}
        if _plain_foreach(params, list(vals.values())):
            return self._update_foreach(grads, state, params, vals, step)
        new_p, new_buf = {}, {}
        # each line one fused pass over the tensor (a + s * b), as torch.optim.SGD's own
        # add(..., alpha=...): on a ResNet a pass costs as much as a convolution layer
        for k, p in params.items():
            d = grads[k]
            if not is_zero(a["weight_decay"]):
                d = fma(d, p, read(a["weight_decay"], hp, k), inplace=False)
            if not is_zero(a["momentum"]):
                mom = read(a["momentum"], hp, k)
                if step == 0:  # torch.optim.SGD starts the buffer at the first gradient,
                    # a copy: the caller's gradient itself was the state, and zeroing it in
                    # place zeroed the momentum (the optimizers probe)
                    buf = d.clone() if d is grads[k] else d
                else:
                    damp = read(a["dampening"], hp, k)
                    # (1 - 0) * d == d exactly: no multiply for the constant 0
                    damped = d if const_zero(damp) else (1 - damp) * d
                    buf = fma(damped, state.momentum_buffer[k], mom, inplace=False)
                new_buf[k] = buf
                d = fma(d, buf, mom, inplace=False) if a["nesterov"] else buf
            new_p[k] = fma(p, d, -read(a["lr"], hp, k), inplace=False)
        return new_p, SGDState(new_buf)

    def _update_foreach(self, grads: Params, state: SGDState, params: Params,
                        v: dict[str, Any], step: int) -> tuple[Params, SGDState]:
        """:meth:`update` on ``_foreach`` kernels (:data:`FOREACH_DEVICES`)."""
        a = self.args
        names = list(params)
        p = [params[k] for k in names]
        d = [grads[k] for k in names]
        if not is_zero(a["weight_decay"]):
            d = _axpy(d, p, v["weight_decay"])
        new_buf: dict[str, Tensor] = {}
        if not is_zero(a["momentum"]):
            mom = v["momentum"]
            if step == 0:
                buf = [x.clone() if x is g else x for x, g in zip(d, (grads[k] for k in names))]
            else:
                damp = v["dampening"]
                damped = d if const_zero(damp) else list(torch._foreach_mul(d, 1 - damp))
                buf = _axpy(damped, [state.momentum_buffer[k] for k in names], mom)
            new_buf = dict(zip(names, buf))
            d = _axpy(d, buf, mom) if a["nesterov"] else buf
        lr = v["lr"]
        new_p = _axpy(p, d, -lr)
        return dict(zip(names, new_p)), SGDState(new_buf)

    def tangent(self, ctx: TangentContext, new_params: Params, new_state: NamedTuple
                ) -> tuple[Params, SGDState]:
        """All columns at once, no autograd. With ``d = g + wd w`` and ``s`` the step direction::

            Z_d = G + wd Z_w (+ dwd w)        Z_buf = mom Z_buf + (1 - damp) Z_d
                                                       (+ dmom buf - ddamp d)
            Z_s = Z_d + mom Z_buf (+ dmom buf')   (Nesterov; else Z_s = Z_buf, or Z_d)
            Z_w' = Z_w - lr Z_s (- dlr s)

        the bracketed terms on the rows of the columns the optimizer reads. Three fused
        multiply-adds over the K columns for momentum with weight decay, written into ``G``'s
        memory where the result is new."""
        a, read, hp, t = self.args, self.read, ctx.hp, ctx.step
        assert isinstance(new_state, SGDState)
        has_wd, has_mom = not is_zero(a["weight_decay"]), not is_zero(a["momentum"])
        new_zp, new_zb = {}, {}
        for k, w in ctx.params.items():
            g = ctx.grads[k]
            zd = owned(ctx.G[k])  # this step's own tensor: updated in place
            wd = read(a["weight_decay"], hp, k) if has_wd else 0.0
            if has_wd:
                zd = fma(zd, ctx.z_params[k], wd, inplace=True)
                ctx.add_direct(zd, wd, w)

            # the primal terms, computed only when a hyperparameter's own term needs them (the
            # closures are used within this iteration)
            d: Callable[[], Tensor] = (lambda: g + wd * w) if has_wd else (lambda: g)
            zs, s_primal = zd, d
            if has_mom:
                mom = read(a["momentum"], hp, k)
                buf = new_state.momentum_buffer[k]
                nest = a["nesterov"]
                if t == 0:
                    zbuf = zd
                else:
                    damp = read(a["dampening"], hp, k)
                    zd_scaled = zd if const_zero(damp) else (
                        zd.mul_(1 - damp) if not nest else zd * (1 - damp))
                    zbuf = fma(zd_scaled, ctx.z_state.momentum_buffer[k], mom,  # type: ignore[attr-defined]
                               inplace=not nest or zd_scaled is not zd)
                    ctx.add_direct(zbuf, mom, ctx.state.momentum_buffer[k])  # type: ignore[attr-defined]
                    ctx.add_direct(zbuf, damp, d, -1.0)
                new_zb[k] = zbuf
                if nest:
                    s_primal = lambda: d() + mom * buf  # noqa: E731
                    zs = fma(zd if zbuf is not zd else zd.clone(), zbuf, mom, inplace=True)
                    ctx.add_direct(zs, mom, buf)
                else:
                    zs, s_primal = zbuf, (lambda: buf)
            lr = read(a["lr"], hp, k)
            zw = fma(ctx.z_params[k], zs, -lr, inplace=False)
            ctx.add_direct(zw, lr, s_primal, -1.0)
            new_zp[k] = zw
        return new_zp, SGDState(new_zb)

    def to_torch(self, params: list[Tensor], hp: Mapping[str, Any] | None = None
                 ) -> torch.optim.Optimizer:
        a, v = self.args, self._value
        dampening = v(a["dampening"], hp)
        if a["nesterov"] and dampening != 0:
            raise NotImplementedError(
                f"sgd.to_torch: nesterov=True with dampening={a['dampening']!r} "
                f"(= {dampening:g}) has no torch.optim twin: torch.optim.SGD refuses Nesterov "
                f"momentum with dampening. Tune with dampening=0 to train the result in "
                f"torch.optim.SGD.")
        return torch.optim.SGD(params, lr=v(a["lr"], hp), momentum=v(a["momentum"], hp),
                               dampening=dampening, nesterov=a["nesterov"],
                               weight_decay=v(a["weight_decay"], hp))


@register
@torch_flags
def sgd(lr: Arg, momentum: Arg = 0.0, dampening: Arg = 0.0, nesterov: bool = False,
        weight_decay: Arg = 0.0, clip_grad_norm: float | None = None) -> Optimizer:
    """SGD as ``torch.optim.SGD`` (momentum, dampening, Nesterov, L2 weight decay).

    ``buf_0 = g_0``; ``buf_t = momentum * buf_{t-1} + (1 - dampening) * g_t``;
    ``w -= lr * (g + momentum * buf if nesterov else buf)``.
    The arguments typed ``Arg`` take a number or a hyperparameter's name (``lr="lr"``).
    ``clip_grad_norm``: the gradient's global norm clipped to it before the update
    (:func:`~hypergrad.optim.clip.clip_grad_norm`); ``None``: no clipping.

    Example:
        >>> opt = sgd(lr="lr", momentum=0.9, weight_decay="wd")
        >>> sorted(opt.bound_names())
        ['lr', 'wd']
    """
    nesterov = flag("sgd", "nesterov", nesterov)
    if nesterov and is_zero(momentum):
        raise ValueError("sgd: nesterov=True needs a momentum (a number > 0 or a hyperparameter).")
    return with_clip(SGD(lr=lr, momentum=momentum, dampening=dampening,
                         nesterov=bool(nesterov), weight_decay=weight_decay), clip_grad_norm)

SGD.defaults = factory_defaults(sgd, SGD)
