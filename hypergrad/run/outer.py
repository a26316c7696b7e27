"""Outer optimizers: what updates the raw hyperparameters from their hypergradients.

Any ``torch.optim.Optimizer`` works (the Trainer takes a factory ``params -> optimizer``, e.g.
``functools.partial(torch.optim.Adam, lr=0.05)``); this module adds the ones made for
hypergradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["SignDescent", "OuterOptimizerFactory", "default_outer", "shrink_lr"]

OuterOptimizerFactory = Callable[[list[Tensor]], torch.optim.Optimizer]


class SignDescent(torch.optim.Optimizer):
    """Sign steps with per-coordinate halving on a sign flip (FDS-style; Micaelli & Storkey 2021).

    ``lam -= step * sign(g)``; where ``sign(g)`` differs from the previous one, ``step *= factor``.
    Robust to the scale of hypergradients, which varies by orders of magnitude between kinds.
    """

    def __init__(self, params: Any, lr: float = 0.1, factor: float = 0.5) -> None:
        if not lr > 0 or not 0 < factor <= 1:
            raise ValueError(f"SignDescent: lr={lr!r} must be > 0 and factor={factor!r} in (0, 1].")
        super().__init__(params, dict(lr=lr, factor=factor))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step_size"] = torch.full_like(p, group["lr"])
                    st["prev_sign"] = torch.zeros_like(p)
                s = torch.sign(p.grad)
                flip = s * st["prev_sign"] < 0
                st["step_size"][flip] *= group["factor"]
                p.sub_(st["step_size"] * s)
                st["prev_sign"].copy_(s)


def default_outer(params: list[Tensor]) -> torch.optim.Optimizer:
    """The Trainer's default outer optimizer: Adam with lr 0.05 (on raw hyperparameters, whose
    scale the transforms make comparable)."""
    return torch.optim.Adam(params, lr=0.05)


def shrink_lr(optimizer: torch.optim.Optimizer, factor: float = 0.5) -> list[float]:
    """Multiply every group's learning rate by ``factor`` and forget the optimizer's state (its
    moments and step sizes belong to the steps being undone): a restart with smaller steps, for
    backtracking. Returns the new learning rates."""
    lrs = []
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = group["lr"] * factor
            lrs.append(group["lr"])
    optimizer.state.clear()
    return lrs
