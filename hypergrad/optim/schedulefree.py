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

Every argument but ``warmup_steps``, ``r`` and ``weight_lr_power`` can be a hyperparameter
(a schedule of ``lr`` multiplies the warmup, as setting the package's group ``lr`` per step does;
``lr_max`` and the averaging weights follow it, and the hypergradient flows through them). No
closed-form tangent: forward mode takes ``jvp`` of :meth:`update`; reverse mode differentiates it
by autograd. ``max`` at a tie is differentiated as ``torch.maximum`` does, half to each side.
Within one window of a schedule (or a constant ``lr`` after warmup) both sides are the same
hyperparameter and the derivative is exact; where two *different* windows hold the same value
(a schedule's constant initial value) ``lr_max`` has a kink in them, and the hypergradient is
that half-and-half one-sided average (central finite differences see the mean of the two
one-sided derivatives instead; the tests check exactness off the kink).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .base import Arg, Optimizer, Params, register, safe_sqrt
from .clip import clip_grad_norm as with_clip

__all__ = ["AdamWScheduleFree", "ScheduleFreeState", "adamw_schedulefree"]


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
    domains = {"lr": "positive", "betas": "unit", "eps": "positive",
               "weight_decay": "nonnegative"}
    examples = {"lr": "0.0025", "betas": "(0.9, 0.999)", "eps": "1e-8", "weight_decay": "0.0"}
    elementwise = False  # 0-d state entries beside per-element ones: the jvp rule
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
        n = step + 1
        warm = a["warmup_steps"]
        sched = n / warm if n <= warm and warm > 0 else 1.0
        last = a["steps"] is not None and n == a["steps"]
        new_p, z_new, v_new, ws_new, lm_new = {}, {}, {}, {}, {}
        for k, y in params.items():
            g = grads[k]
            lr = read(a["lr"], hp, k) * sched
            b1, b2 = read(a["betas"][0], hp, k), read(a["betas"][1], hp, k)
            lr_max = torch.maximum(state.lr_max[k], torch.as_tensor(lr, dtype=y.dtype,
                                                                    device=y.device))
            weight = n ** a["r"] * lr_max ** a["weight_lr_power"]
            wsum = state.weight_sum[k] + weight
            c = weight / wsum
            v = b2 * state.exp_avg_sq[k] + (1 - b2) * g * g
            d = g / (safe_sqrt(v / (1 - b2**n)) + read(a["eps"], hp, k))  # finite at v = 0
            wd = read(a["weight_decay"], hp, k)
            if not (isinstance(wd, (int, float)) and wd == 0):
                d = d + wd * y
            z = state.z[k]
            y_new = torch.lerp(y, z, c) + lr * (b1 * (1 - c) - 1) * d
            z_new[k] = z - lr * d
            new_p[k] = y_new + (1 - 1 / b1) * (z_new[k] - y_new) if last else y_new
            v_new[k], ws_new[k], lm_new[k] = v, wsum, lr_max
        return new_p, ScheduleFreeState(z_new, v_new, ws_new, lm_new)

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
def adamw_schedulefree(lr: Arg = 0.0025, betas: tuple[Arg, Arg] = (0.9, 0.999), eps: Arg = 1e-8,
                       weight_decay: Arg = 0.0, warmup_steps: int = 0, r: float = 0.0,
                       weight_lr_power: float = 2.0,
                       clip_grad_norm: float | None = None) -> Optimizer:
    """Schedule-free AdamW as ``schedulefree.AdamWScheduleFree`` (its defaults); the inner
    problem's last step returns the averaged point ``x`` (``opt.eval()``), where the validation
    loss is taken. ``warmup_steps``, ``r`` and ``weight_lr_power`` are fixed options."""
    return with_clip(AdamWScheduleFree(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                       warmup_steps=warmup_steps, r=r,
                                       weight_lr_power=weight_lr_power, steps=None),
                     clip_grad_norm)
