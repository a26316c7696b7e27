"""Schedule-free AdamW (Defazio et al., "The Road Less Scheduled", NeurIPS 2024) as the
``schedulefree`` package's ``AdamWScheduleFree``, step for step, with exact hypergradients.

The package keeps three sequences: ``z`` (the base AdamW-like iterate), ``x`` (a weighted
average of the ``z``) and the point the gradient is taken at, ``y = (1 - b1) z + b1 x``, which
is what the model's parameters hold while training (``opt.train()``); ``opt.eval()`` swaps them
to ``x``, the point to evaluate. Per step ``k`` (0-based), for each tensor::

    lr_k   = lr * min(1, (k + 1) / warmup_steps)
    lr_max = max(lr_max, lr_k);  w_k = (k + 1)^r lr_max^weight_lr_power;  c = w_k / sum_i<=k w_i
    v      = b2 v + (1 - b2) g^2;   d = g / (sqrt(v / (1 - b2^(k+1))) + eps) + wd y
    y'     = (1 - c) y + c z + lr_k (b1 (1 - c) - 1) d;   z' = z - lr_k d

Here the parameters are ``y``, the state ``(z, v, sum w, lr_max)``, and the **last step of the
inner problem's horizon returns** ``x = y + (1 - 1/b1)(z - y)`` (``opt.eval()``), so the
validation loss, the hypergradient and ``problem.run``'s result are taken at ``x``, as a user of
the package evaluates. The optimizer learns the horizon from the :class:`~hypergrad.InnerProblem`
it is given to (:meth:`Optimizer.for_horizon`); used on its own (``steps=None``) it never swaps.
Online (``hg.Online``), the updates before the horizon's last take the validation loss and its
hypergradient at ``y``, where the parameters are during training (the package's train mode);
only the last, at step ``T``, at ``x``.

Every argument but ``warmup_steps``, ``r`` and ``weight_lr_power`` can be a hyperparameter
(a schedule of ``lr`` multiplies the warmup, as setting the package's group ``lr`` per step does;
``lr_max`` and the averaging weights follow it, and the hypergradient flows through them).
Forward mode uses the closed-form tangent (:meth:`AdamWScheduleFree.tangent`: equal to ``jvp``
of the update to rounding, and 2.5x cheaper on the long-horizon study's language model, where a
hypergradient of K = 17 costs 11 plain runs instead of 29); reverse mode differentiates the
update by autograd. ``max`` at a tie is differentiated as ``torch.maximum`` does, half to each side.
Within one window of a schedule (or a constant ``lr`` after warmup) both sides are the same
hyperparameter and the derivative is exact; where two *different* windows hold the same value
(a schedule's constant initial value) ``lr_max`` has a kink in them: each step at the tie gives
half of its derivative to each side, so an earlier window's share halves at every later step
of the tie, and one window's hypergradient there is neither one-sided derivative nor their mean
(which central finite differences of that window see). Their sum over the tied windows, the
derivative of moving them together, is exact; the tests check exactness off the kink and along
the tie.
"""

from __future__ import annotations

import copy
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
    inv_twice,
    is_zero,
    register,
    safe_sqrt,
    torch_flags,
)
from .clip import clip_grad_norm as with_clip

__all__ = ["AdamWScheduleFree", "ScheduleFreeState", "adamw_schedulefree"]


def _nonzero(wsum: Tensor) -> Tensor:
    """The averaging weights' sum, 1 where it is 0: no step has had a learning rate above 0, so
    every weight is 0 and ``c = w / sum`` is 0 (the ``schedulefree`` package's
    ``weight / weight_sum if weight_sum != 0 else 0``; 0 / 0 gave NaN weights)."""
    return torch.where(wsum != 0, wsum, torch.ones_like(wsum))


class ScheduleFreeState(NamedTuple):
    """``z``, the second moments, and per tensor the running sum of the averaging weights and
    the largest learning rate so far (0-d tensors; the package keeps them per param group)."""

    z: dict[str, Tensor]
    exp_avg_sq: dict[str, Tensor]
    weight_sum: dict[str, Tensor]
    lr_max: dict[str, Tensor]


class AdamWScheduleFree(Optimizer):
    """See the module docstring. ``steps``: the inner horizon T (set by the problem), whose
    last update returns the averaged point ``x``."""

    hyper_args = ("lr", "eps", "weight_decay")
    pair_args = ("betas",)
    options = ("warmup_steps", "r", "weight_lr_power", "steps")
    # betas[0] = 0 would divide by 0 in the last step's average (1 - 1 / b1)
    domains = {"lr": "positive", "betas": "open_unit", "eps": "positive",
               "weight_decay": "nonnegative"}
    examples = {"lr": "0.0025", "betas": "(0.9, 0.999)", "eps": "1e-8", "weight_decay": "0.0"}
    elementwise = False  # 0-d state entries beside per-element ones: no diagonal Jacobian
    stationary_args = ()

    def __init__(self, **args: Any) -> None:
        super().__init__(**args)
        for key in ("warmup_steps", "steps"):
            v = self.args[key]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"adamw_schedulefree: {key}={v!r} must be an int >= 0 "
                                 f"(a number of inner steps), e.g. {key}=100.")
        for key in ("r", "weight_lr_power"):
            v = self.args[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError(f"adamw_schedulefree: {key}={v!r} must be a number, e.g. "
                                 f"r=0.0, weight_lr_power=2.0 (the package's defaults).")

    @property
    def name(self) -> str:
        return "adamw_schedulefree"

    def for_horizon(self, steps: int) -> AdamWScheduleFree:
        """This optimizer with the horizon ``steps`` (its last update returns ``x``)."""
        if self.args["steps"] == steps:
            return self
        out = copy.copy(self)
        out.args = {**self.args, "steps": steps}
        return out

    def _at(self, step: int) -> tuple[int, float, bool]:
        """``(n, s, last)`` of update ``step``: its count ``n = step + 1``, the warmup factor
        ``s = min(1, n / warmup_steps)`` and whether it is the horizon's last update."""
        n, warm = step + 1, self.args["warmup_steps"]
        return n, (n / warm if n <= warm and warm > 0 else 1.0), n == self.args["steps"]

    def init(self, params: Params) -> ScheduleFreeState:
        def scalar(p: Tensor, v: float) -> Tensor:
            return torch.full((), v, dtype=p.dtype, device=p.device)

        return ScheduleFreeState({k: p.clone() for k, p in params.items()},
                                 {k: torch.zeros_like(p) for k, p in params.items()},
                                 {k: scalar(p, 0.0) for k, p in params.items()},
                                 {k: scalar(p, -1.0) for k, p in params.items()})

    def update(self, grads: Params, state: NamedTuple, params: Params, hp: Mapping[str, Any],
               step: int) -> tuple[Params, ScheduleFreeState]:
        a, read = self.args, self.read
        assert isinstance(state, ScheduleFreeState)
        n, sched, last = self._at(step)
        new_p, z_new, v_new, ws_new, lm_new = {}, {}, {}, {}, {}
        for k, y in params.items():
            g = grads[k]
            lr = read(a["lr"], hp, k) * sched
            b1, b2 = read(a["betas"][0], hp, k), read(a["betas"][1], hp, k)
            lr_max = torch.maximum(state.lr_max[k], torch.as_tensor(lr, dtype=y.dtype,
                                                                    device=y.device))
            weight = n ** a["r"] * lr_max ** a["weight_lr_power"]
            wsum = state.weight_sum[k] + weight
            c = weight / _nonzero(wsum)  # 0 while every weight is (a learning rate of 0 so far)
            v = b2 * state.exp_avg_sq[k] + (1 - b2) * g * g
            d = g / (safe_sqrt(v / (1 - b2**n)) + read(a["eps"], hp, k))  # finite at v = 0
            wd = read(a["weight_decay"], hp, k)
            if not is_zero(a["weight_decay"]):
                d = d + wd * y
            z = state.z[k]
            y_new = torch.lerp(y, z, c) + lr * (b1 * (1 - c) - 1) * d
            z_new[k] = z - lr * d
            new_p[k] = y_new + (1 - 1 / b1) * (z_new[k] - y_new) if last else y_new
            v_new[k], ws_new[k], lm_new[k] = v, wsum, lr_max
        return new_p, ScheduleFreeState(z_new, v_new, ws_new, lm_new)

    def tangent(self, ctx: TangentContext, new_params: Params, new_state: NamedTuple
                ) -> tuple[Params, ScheduleFreeState]:
        """All columns at once, no autograd (``s`` the warmup factor, ``q = v' / (1 - b2^n)``,
        ``den = sqrt(q) + eps``, ``d = g / den + wd y``, ``a = b1 (1 - c) - 1``)::

            Z_lm' = Z_lm or d(lr s) (whichever is larger; half each at a tie, as torch.maximum)
            Z_w   = n^r p lm'^(p-1) Z_lm'     Z_ws' = Z_ws + Z_w
            Z_c   = Z_w / ws' - w Z_ws' / ws'^2
            Z_v'  = b2 Z_v + 2 (1 - b2) g G   Z_d = G / den - g / den^2 Z_den + wd Z_y
            Z_y'  = (1 - c) Z_y + c Z_z + a lr s Z_d + ((z - y) - lr s b1 d) Z_c
            Z_z'  = Z_z - lr s Z_d
            Z_x   = Z_y' + (1 - 1/b1)(Z_z' - Z_y')   (at the horizon's last step)

        plus the hyperparameters' own terms (``lr``, ``b1``, ``b2`` through the bias correction,
        ``eps``, ``wd``) on the rows of the columns the optimizer reads. ``Z_lm``, ``Z_ws`` and
        ``Z_c`` are one number per column (the tensor's scalars)."""
        a, read, hp, c = self.args, self.read, ctx.hp, ctx
        assert isinstance(new_state, ScheduleFreeState)
        st, zs = ctx.state, ctx.z_state
        assert isinstance(st, ScheduleFreeState) and isinstance(zs, ScheduleFreeState)
        n, sched, last = self._at(ctx.step)
        r, pw = a["r"], a["weight_lr_power"]
        new_zp, new_zz, new_zv, new_zws, new_zlm = {}, {}, {}, {}, {}
        for k, y in ctx.params.items():
            g, G, zy = ctx.grads[k], ctx.G[k], ctx.z_params[k]
            cols = (zy.shape[0],) + (1,) * y.ndim  # a number per column, over the tensor

            lr0 = read(a["lr"], hp, k)
            lr = lr0 * sched
            b1, b2 = read(a["betas"][0], hp, k), read(a["betas"][1], hp, k)
            eps, wd = read(a["eps"], hp, k), read(a["weight_decay"], hp, k)
            dlr = c.combine((sched, c.derivative(lr0)))  # d(lr s)
            db1, db2 = c.derivative(b1), c.derivative(b2)
            # the largest learning rate so far: torch.maximum's derivative, half each at a tie
            lm_prev = st.lr_max[k]
            tie = (lm_prev == lr).to(y.dtype)
            keep = (lm_prev > lr).to(y.dtype) + 0.5 * tie
            z_lm = zs.lr_max[k] * keep  # type: ignore[attr-defined]
            c.add_term(z_lm, dlr, (lr > lm_prev).to(y.dtype) + 0.5 * tie)
            lm = new_state.lr_max[k]
            w = n**r * lm**pw
            z_w = z_lm * (n**r * pw * lm ** (pw - 1))
            ws = new_state.weight_sum[k]
            z_ws = zs.weight_sum[k] + z_w  # type: ignore[attr-defined]
            ws = _nonzero(ws)
            cc = w / ws
            z_c = z_w / ws - z_ws * (w / ws**2)
            # the normalised step d and its tangent
            v_prev, v = st.exp_avg_sq[k], new_state.exp_avg_sq[k]
            z_v = zs.exp_avg_sq[k] * b2  # type: ignore[attr-defined]
            z_v.addcmul_(G, 2 * (1 - b2) * g)
            c.add_term(z_v, db2, lambda: v_prev - g * g)
            bc = 1 - b2**n
            root = safe_sqrt(v / bc)
            den = root + eps
            z_root = z_v * (inv_twice(root) / bc)
            c.add_term(z_root, c.combine((n * b2 ** (n - 1), db2)),
                       lambda: inv_twice(root) * v / bc**2)  # through d(bc) = -n b2^(n-1) db2
            z_d = G / den
            z_d.addcmul_(z_root, -g / den**2)
            c.add_direct(z_d, eps, lambda: -g / den**2)
            d = g / den
            if not is_zero(a["weight_decay"]):
                z_d.add_(zy * wd)
                c.add_direct(z_d, wd, y)
                d = d + wd * y
            z = st.z[k]
            coef = b1 * (1 - cc) - 1
            zyn = zy * (1 - cc)
            zyn.add_(zs.z[k] * cc)  # type: ignore[attr-defined]
            zyn.addcmul_(z_d, lr * coef)
            zyn.add_(z_c.reshape(cols) * ((z - y) - (lr * b1) * d))
            c.add_term(zyn, c.combine((coef, dlr), (lr * (1 - cc), db1)), d)
            zzn = zs.z[k] - z_d * lr  # type: ignore[attr-defined]
            c.add_term(zzn, dlr, d, sign=-1.0)
            if last:
                y_new = torch.lerp(y, z, cc) + lr * coef * d
                z_new = new_state.z[k]
                zx = zyn + (1 - 1 / b1) * (zzn - zyn)
                c.add_term(zx, db1, lambda: (z_new - y_new) / b1**2)
                zyn = zx
            new_zp[k], new_zz[k], new_zv[k], new_zws[k], new_zlm[k] = zyn, zzn, z_v, z_ws, z_lm
        return new_zp, ScheduleFreeState(new_zz, new_zv, new_zws, new_zlm)

    def to_torch(self, params: list[Tensor], hp: Mapping[str, Any] | None = None
                 ) -> torch.optim.Optimizer:
        """``schedulefree.AdamWScheduleFree`` (``pip install schedulefree``) in train mode; call
        its ``eval()`` before evaluating, as the horizon's last update here does."""
        try:
            import schedulefree  # type: ignore[import-untyped]
        except ImportError as err:  # pragma: no cover - the lm extra installs it
            raise ImportError("adamw_schedulefree.to_torch needs the schedulefree package: "
                              "pip install schedulefree (or hypergrad-forward[lm]).") from err
        a, v = self.args, self._value
        opt = schedulefree.AdamWScheduleFree(
            params, lr=v(a["lr"], hp), betas=(v(a["betas"][0], hp), v(a["betas"][1], hp)),
            eps=v(a["eps"], hp), weight_decay=v(a["weight_decay"], hp),
            warmup_steps=a["warmup_steps"], r=a["r"], weight_lr_power=a["weight_lr_power"])
        opt.train()
        return opt


@register
@torch_flags
def adamw_schedulefree(lr: Arg = 0.0025, betas: tuple[Arg, Arg] = (0.9, 0.999), eps: Arg = 1e-8,
                       weight_decay: Arg = 0.0, warmup_steps: int = 0, r: float = 0.0,
                       weight_lr_power: float = 2.0,
                       clip_grad_norm: float | None = None) -> Optimizer:
    """Schedule-free AdamW as ``schedulefree.AdamWScheduleFree`` (its defaults); the inner
    problem's last step returns the averaged point ``x`` (``opt.eval()``), where the validation
    loss is taken. ``lr``, ``betas``, ``eps``, ``weight_decay`` take numbers or hyperparameter
    names; ``warmup_steps``, ``r`` and ``weight_lr_power`` are fixed options.
    ``clip_grad_norm``: the gradient's global norm clipped to it before the update
    (:func:`~hypergrad.optim.clip.clip_grad_norm`); ``None``: no clipping.
    """
    return with_clip(AdamWScheduleFree(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                       warmup_steps=warmup_steps, r=r,
                                       weight_lr_power=weight_lr_power, steps=None),
                     clip_grad_norm)

AdamWScheduleFree.defaults = {**factory_defaults(adamw_schedulefree, AdamWScheduleFree),
                               "steps": None}  # the horizon, set by the problem
