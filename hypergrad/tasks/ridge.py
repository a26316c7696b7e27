"""Ridge regression by full-batch gradient descent: a problem with a closed-form hypergradient.

Inner loss ``L(w) = ||X w - y||^2 / (2n) + l2 ||w||^2 / 2``, GD with step ``lr`` from ``w_0 = 0``;
validation ``E(w) = ||X_v w - y_v||^2 / (2m)``; hyperparameter ``l2`` with a log transform.
With ``M = X^T X / n + l2 I = V diag(s) V^T`` and ``b = X^T y / n``, after T steps
``w_T = V diag(f(s)) V^T b``, ``f(s) = (1 - (1 - lr s)^T) / s``; ``l2`` shifts every ``s``, so
``dw_T/dl2 = V diag(f'(s)) V^T b``. ``T = None`` is the limit ``f(s) = 1/s`` (the implicit,
converged hypergradient).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..hyperparams import HyperParams, Scalar
from ..optim import sgd
from ..problem import InnerProblem

__all__ = ["ridge_problem", "ridge_closed_form_hypergradient"]


def ridge_problem(x: Tensor, y: Tensor, x_val: Tensor, y_val: Tensor, l2: float, lr: float,
                  steps: int) -> InnerProblem:
    """The inner problem above; ``lam`` is ``[log l2]``."""
    model = nn.Linear(x.shape[1], 1, bias=False).to(dtype=x.dtype, device=x.device)
    with torch.no_grad():
        model.weight.zero_()

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        xb, yb = batch
        r = m(xb)[:, 0] - yb
        return 0.5 * (r * r).mean() + 0.5 * hp["l2"] * (m.params["weight"] ** 2).sum()

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        r = m(x_val)[:, 0] - y_val
        return 0.5 * (r * r).mean()

    hps = HyperParams([Scalar("l2", init=l2, transform="log")])
    return InnerProblem(model, train_loss, sgd(lr=lr), hps, [(x, y)], steps, val_loss)


def ridge_closed_form_hypergradient(x: Tensor, y: Tensor, x_val: Tensor, y_val: Tensor,
                                    l2: float, lr: float, steps: int | None) -> Tensor:
    """``dE/d log(l2)`` after ``steps`` GD steps (``None``: at convergence), shape ``(1,)``."""
    n, m = x.shape[0], x_val.shape[0]
    a = x.T @ x / n
    b = x.T @ y / n
    s0, v = torch.linalg.eigh(a)
    s = s0 + l2
    vb = v.T @ b
    if steps is None:
        f, df = 1 / s, -1 / s**2
    else:
        q = 1 - lr * s
        f = (1 - q**steps) / s
        df = (steps * lr * q ** (steps - 1) * s - (1 - q**steps)) / s**2
    w = v @ (f * vb)
    dw = v @ (df * vb)
    dE_dw = x_val.T @ (x_val @ w - y_val) / m
    return (l2 * dE_dw @ dw).reshape(1)
