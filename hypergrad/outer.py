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

__all__ = ["SignDescent", "OuterOptimizerFactory"]

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
