"""Inner optimizers as pure updates over NamedTuple states, step for step equal to ``torch.optim``.

An optimizer is a pair of pure functions (as in optax): ``init(params) -> state`` and
``update(grads, state, params, hp, step) -> (new_params, new_state)``, over dicts of tensors.
Because ``update`` is pure and elementwise, forward mode can get its tangent rule from
``torch.func.jvp`` under ``vmap`` (any new optimizer needs nothing more). For speed, the tangents
of SGD, Adam and AdamW are also written in closed form (``hypergrad.forward``), tested equal to
``jvp``.

Each argument (``lr``, ``momentum``, ``betas``, ``weight_decay``, ``eps``, ...) is either a
constant number or the *name* of a hyperparameter, read at every step from ``hp`` (a mapping name
-> value; per-tensor hyperparameters give a dict param name -> value).

Example:
    >>> opt = sgd(lr="lr", momentum=0.9, weight_decay="wd")
    >>> sorted(opt.bound_names())
    ['lr', 'wd']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = ["Optimizer", "sgd", "adam", "adamw", "SGDState", "AdamState", "safe_sqrt"]

Params = dict[str, Tensor]
Arg = float | str


class SGDState(NamedTuple):
    """``momentum_buffer``: dict param name -> tensor (empty when momentum is the constant 0)."""

    momentum_buffer: dict[str, Tensor]


class AdamState(NamedTuple):
    """First and second moment estimates, dicts param name -> tensor."""

    exp_avg: dict[str, Tensor]
    exp_avg_sq: dict[str, Tensor]


def safe_sqrt(x: Tensor, eps_root: float = 0.0) -> Tensor:
    """``sqrt(x + eps_root)`` with a finite derivative (0) where ``x + eps_root == 0``.

    Adam's second moment is exactly 0 for a weight whose gradient has always been 0; the plain
    square root has an infinite derivative there and turns tangents into NaN (0 * inf). The
    value is unchanged, so updates still equal ``torch.optim`` bit for bit when ``eps_root=0``.
    """
    x = x + eps_root if eps_root else x
    pos = x > 0
    return torch.where(pos, torch.sqrt(torch.where(pos, x, torch.ones_like(x))),
                       torch.zeros_like(x))


def _is_zero(a: Any) -> bool:
    return not isinstance(a, str) and float(a) == 0.0


def _const_zero(a: Any) -> bool:
    """Whether ``a`` is the number 0 (a hyperparameter's tensor is never taken as zero)."""
    return isinstance(a, (int, float)) and a == 0


class Optimizer:
    """A pure optimizer. Use the constructors :func:`sgd`, :func:`adam`, :func:`adamw`."""

    def __init__(self, name: str, args: dict[str, Any]) -> None:
        self.name = name
        self.args = args
        for key, val in args.items():
            if key in ("nesterov", "eps_root"):
                continue
            vals = val if key == "betas" else (val,)
            for v in vals:
                if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                    raise TypeError(
                        f"{name}: {key}={v!r} must be a number or the name of a hyperparameter "
                        f"(a str), e.g. {key}='lr' or {key}=0.1."
                    )
        if name in ("adam", "adamw"):
            betas = args["betas"]
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise ValueError(f"{name}: betas={betas!r} must be a pair (beta1, beta2).")

    # -- binding ---------------------------------------------------------------------------------
    def bound_names(self) -> dict[str, str]:
        """Hyperparameter names this optimizer reads, mapped to the argument that reads them."""
        out = {}
        for key, val in self.args.items():
            vals = val if key == "betas" else (val,)
            for i, v in enumerate(vals):
                if isinstance(v, str):
                    out[v] = f"{key}[{i}]" if key == "betas" else key
        return out

    @staticmethod
    def _read(arg: Arg, hp: Mapping[str, Any], pname: str) -> Any:
        if not isinstance(arg, str):
            return arg
        v = hp[arg]
        return v[pname] if isinstance(v, dict) else v

    # -- the pure functions ----------------------------------------------------------------------
    def init(self, params: Params) -> NamedTuple:
        """Initial state for ``params`` (zeros, like ``torch.optim`` before its first step)."""
        if self.name == "sgd":
            if _is_zero(self.args["momentum"]):
                return SGDState({})
            return SGDState({k: torch.zeros_like(p) for k, p in params.items()})
        return AdamState({k: torch.zeros_like(p) for k, p in params.items()},
                         {k: torch.zeros_like(p) for k, p in params.items()})

    def update(self, grads: Params, state: NamedTuple, params: Params, hp: Mapping[str, Any],
               step: int) -> tuple[Params, NamedTuple]:
        """One step. ``step`` is the 0-based index of this update (Adam's ``t`` is ``step + 1``)."""
        if self.name == "sgd":
            return self._sgd(grads, state, params, hp, step)  # type: ignore[arg-type]
        return self._adam(grads, state, params, hp, step)  # type: ignore[arg-type]

    def _sgd(self, grads: Params, state: SGDState, params: Params, hp: Mapping[str, Any],
             step: int) -> tuple[Params, SGDState]:
        a = self.args
        new_p, new_buf = {}, {}
        for k, p in params.items():
            d = grads[k]
            if not _is_zero(a["weight_decay"]):
                d = d + self._read(a["weight_decay"], hp, k) * p
            if not _is_zero(a["momentum"]):
                mom = self._read(a["momentum"], hp, k)
                if step == 0:  # torch.optim.SGD starts the buffer at the first gradient
                    buf = d
                else:
                    damp = self._read(a["dampening"], hp, k)
                    # (1 - 0) * d == d exactly: no multiply for the constant 0
                    damped = d if _const_zero(damp) else (1 - damp) * d
                    buf = mom * state.momentum_buffer[k] + damped
                new_buf[k] = buf
                d = d + mom * buf if a["nesterov"] else buf
            new_p[k] = p - self._read(a["lr"], hp, k) * d
        return new_p, SGDState(new_buf)

    def _adam(self, grads: Params, state: AdamState, params: Params, hp: Mapping[str, Any],
              step: int) -> tuple[Params, AdamState]:
        a = self.args
        t = step + 1
        decoupled = self.name == "adamw"
        new_p, m_new, v_new = {}, {}, {}
        for k, p in params.items():
            g = grads[k]
            lr = self._read(a["lr"], hp, k)
            b1 = self._read(a["betas"][0], hp, k)
            b2 = self._read(a["betas"][1], hp, k)
            if not _is_zero(a["weight_decay"]):
                wd = self._read(a["weight_decay"], hp, k)
                if decoupled:
                    p = p * (1 - lr * wd)
                else:
                    g = g + wd * p
            m = state.exp_avg[k] + (1 - b1) * (g - state.exp_avg[k])  # torch uses lerp
            v = b2 * state.exp_avg_sq[k] + (1 - b2) * g * g
            bc1 = 1 - b1**t
            bc2_sqrt = (1 - b2**t) ** 0.5
            denom = safe_sqrt(v, a["eps_root"]) / bc2_sqrt + self._read(a["eps"], hp, k)
            new_p[k] = p - (lr / bc1) * (m / denom)
            m_new[k], v_new[k] = m, v
        return new_p, AdamState(m_new, v_new)

    # -- the torch.optim twin, for tests and for users who want the plain optimizer ---------------
    def to_torch(self, params: list[Tensor], hp: Mapping[str, Any] | None = None
                 ) -> torch.optim.Optimizer:
        """The equivalent ``torch.optim`` optimizer with hyperparameters read once from ``hp``."""
        hp = hp or {}

        def val(arg: Arg) -> float:
            v = hp[arg] if isinstance(arg, str) else arg
            if isinstance(v, dict):
                raise NotImplementedError(
                    f"{self.name}.to_torch: per-tensor hyperparameters need param groups; "
                    f"read them yourself."
                )
            return float(v)

        a = self.args
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=val(a["lr"]), momentum=val(a["momentum"]),
                                   dampening=val(a["dampening"]), nesterov=a["nesterov"],
                                   weight_decay=val(a["weight_decay"]))
        cls = torch.optim.AdamW if self.name == "adamw" else torch.optim.Adam
        return cls(params, lr=val(a["lr"]), betas=(val(a["betas"][0]), val(a["betas"][1])),
                   eps=val(a["eps"]), weight_decay=val(a["weight_decay"]))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.name}({args})"


def sgd(lr: Arg, momentum: Arg = 0.0, dampening: Arg = 0.0, nesterov: bool = False,
        weight_decay: Arg = 0.0) -> Optimizer:
    """SGD as ``torch.optim.SGD`` (momentum, dampening, Nesterov, L2 weight decay).

    ``buf_0 = g_0``; ``buf_t = momentum * buf_{t-1} + (1 - dampening) * g_t``;
    ``w -= lr * (g + momentum * buf if nesterov else buf)``.
    """
    if nesterov and _is_zero(momentum):
        raise ValueError("sgd: nesterov=True needs a momentum (a number > 0 or a hyperparameter).")
    return Optimizer("sgd", dict(lr=lr, momentum=momentum, dampening=dampening,
                                 nesterov=bool(nesterov), weight_decay=weight_decay))


def adam(lr: Arg = 1e-3, betas: tuple[Arg, Arg] = (0.9, 0.999), eps: Arg = 1e-8,
         weight_decay: Arg = 0.0, eps_root: float = 0.0) -> Optimizer:
    """Adam as ``torch.optim.Adam`` (Kingma & Ba 2015), L2 weight decay added to the gradient.

    ``eps_root`` is added under the square root (optax's guard); the square root itself is
    :func:`safe_sqrt`, so tangents stay finite when a second moment is exactly 0.
    """
    return Optimizer("adam", dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                  eps_root=float(eps_root)))


def adamw(lr: Arg = 1e-3, betas: tuple[Arg, Arg] = (0.9, 0.999), eps: Arg = 1e-8,
          weight_decay: Arg = 1e-2, eps_root: float = 0.0) -> Optimizer:
    """AdamW as ``torch.optim.AdamW`` (Loshchilov & Hutter 2019): ``w *= 1 - lr * wd`` first."""
    return Optimizer("adamw", dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                   eps_root=float(eps_root)))
