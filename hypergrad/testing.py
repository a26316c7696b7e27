"""Oracles and comparison helpers: :func:`hypergradcheck`, like ``torch.autograd.gradcheck`` for
hypergradients, and the digits problems the exactness table and the tests are built from."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .data import MiniBatches
from .errors import HypergradWarning, raised_in_hypergrad
from .hvp import STRATEGIES, HVPStrategy, VmapVJP
from .hyperparams import (
    Array,
    HyperParameter,
    HyperParams,
    PerExample,
    PerGroup,
    PerTensor,
    Scalar,
    Schedule,
)
from .methods.base import Method
from .methods.finite_diff import FiniteDifference
from .methods.forward import ForwardMode
from .methods.reverse import ReverseMode
from .optim import Optimizer, adagrad, adam, adamw, rmsprop, sgd
from .problem import InnerProblem
from .rng import keeps_rng

__all__ = ["rel_err", "group_rel_errs", "CheckReport", "HypergradcheckError", "hypergradcheck",
           "OPTIMIZERS", "KINDS", "GRID", "GridOptimizer", "grid_cases", "digits_case",
           "l2_mlp_case", "ridge_diabetes_case", "classifier_case"]

TEST_DEVICE_ENV = "HYPERGRAD_TEST_DEVICE"
"""The environment variable that gives :func:`digits_case` its default device (``cuda`` puts
the problems of the test suite's float64 exactness checks on the GPU; unset: the CPU)."""


def rel_err(a: Tensor, b: Tensor) -> float:
    """Norm-wise relative error ``||a - b|| / ||b||`` (absolute when ``b == 0``)."""
    d = float((a - b).norm())
    nb = float(b.norm())
    return d / nb if nb > 0 else d


def group_rel_errs(hyperparams: HyperParams, a: Tensor, b: Tensor,
                   floor: float = 0.0) -> dict[str, float]:
    """:func:`rel_err` per hyperparameter group (slices of ``lam``); with ``floor``, each
    group's error is relative to at least ``floor`` times the whole ``b``'s norm (a group whose
    hypergradient is nearly 0 is judged by the rounding of the whole, not by its own norm)."""
    least = floor * float(b.norm())
    out = {}
    for n, s in hyperparams.slices.items():
        d, nb = float((a[s] - b[s]).norm()), max(float(b[s].norm()), least)
        out[n] = d / nb if nb > 0 else d
    return out


class HypergradcheckError(RuntimeError):
    """Raised by :func:`hypergradcheck` when a comparison exceeds its tolerance."""


@dataclass
class CheckReport:
    """Errors per hyperparameter group: forward vs reverse, forward vs central finite
    differences, and the largest deviation of any HVP strategy from the default.

    ``fd_error`` is the finite differences' own estimated relative error per group
    (:meth:`~hypergrad.FiniteDifference.estimate`). A group whose ``fd_error`` exceeds
    ``rtol_fd`` is listed in :attr:`fd_unreliable`: finite differences cannot check it to that
    tolerance (the objective is rough in it at the step's scale, e.g. a ResNet's loss in its
    learning rate), so the report says so and holds it only to :data:`FD_SLACK` times that
    estimate (its ``fd_tolerance``). Every other group is held to ``rtol_fd``. Forward vs reverse
    and the strategies are always held to their tolerances.
    """

    fwd_vs_rev: dict[str, float]
    fwd_vs_fd: dict[str, float]
    strategies: dict[str, float]
    tolerances: dict[str, float] = field(default_factory=dict)
    grad: Tensor | None = None
    fd_error: dict[str, float] = field(default_factory=dict)
    fd_tolerance: dict[str, float] = field(default_factory=dict)
    method: str = ""
    """The method checked in forward mode's place (``hypergradcheck(method=...)``), else
    empty."""
    note: str = ""
    """Why the check says little here (chaotic training), said after the table."""

    def max(self, which: str) -> float:
        """The largest error of ``which`` (NaN if any is NaN)."""
        vals = list(getattr(self, which).values())
        return math.nan if any(v != v for v in vals) else max(vals, default=0.0)

    @property
    def fd_unreliable(self) -> list[str]:
        """Groups where finite differences are less accurate than ``rtol_fd``."""
        tol = self.tolerances.get("fwd_vs_fd", float("inf"))
        return [n for n, e in self.fd_error.items() if e > tol]

    def failures(self) -> list[str]:
        """``"which group: error > tolerance"`` for every comparison over its tolerance."""
        out = []
        for k, tol in self.tolerances.items():
            for n, e in getattr(self, k).items():
                limit = self.fd_tolerance.get(n, tol) if k == "fwd_vs_fd" else tol
                if not e <= limit:
                    out.append(f"{k} {n}: {e:.2e} > {limit:g}")
        return out

    @property
    def ok(self) -> bool:
        """Every error within its tolerance; a NaN error (a NaN hypergradient) is a failure."""
        for k, tol in self.tolerances.items():
            if k == "fwd_vs_fd" and self.fd_tolerance:
                if any(not e <= self.fd_tolerance[n] for n, e in self.fwd_vs_fd.items()):
                    return False
            elif not self.max(k) <= tol:  # max is NaN where any error is
                return False
        return True

    def __str__(self) -> str:
        own = "strategies" in self.tolerances or not self.method
        lines = ([] if not self.method else
                 [f"checked: {self.method} (its errors in the fwd_ columns)"])
        lines.append(f"{'group':<16}{'fwd_vs_rev':>12}{'fwd_vs_fd':>12}{'fd_error':>12}"
                     + (f"{'strategies':>12}" if own else ""))
        for n in self.fwd_vs_rev:
            note = "  finite differences unreliable" if n in self.fd_unreliable else ""
            lines.append(f"{n:<16}{self.fwd_vs_rev[n]:>12.2e}{self.fwd_vs_fd[n]:>12.2e}"
                         f"{self.fd_error.get(n, float('nan')):>12.2e}"
                         + (f"{self.strategies[n]:>12.2e}" if own else "") + note)
        tol = ", ".join(f"{k} <= {v:g}" for k, v in self.tolerances.items())
        failed = "" if self.ok else f" [{'; '.join(self.failures())}]"
        lines.append(f"{'ok' if self.ok else 'FAILED'}{failed} (tolerances: {tol}; groups where "
                     f"fd_error exceeds it are held to {FD_SLACK:g} x fd_error against finite "
                     f"differences; errors relative to each group's norm, at least 1e-6 of the "
                     f"whole's)")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


def _chaos_note(objective: Tensor, grad: Tensor) -> str:
    """Where the hypergradient is astronomically large against the objective (chaotic
    training: SGD at lr 2 over 600 steps gave 5.3e11 against 0.62), why the check says little
    and a failed one need not show a bug (it blamed a custom tangent): forward and reverse mode
    still agree, but rounding grows as fast as the derivative (the HVP strategies 4 % apart)
    and finite differences see another function at every step size (0.745 at eps 1e-2, 981 at
    1e-4)."""
    from .run.guards import CHAOS

    norm, scale = float(grad.norm()), max(1.0, abs(float(objective)))
    if not math.isfinite(norm) or norm <= CHAOS * scale:
        return ""
    return (f"note: the hypergradient's norm {norm:.3g} is more than {CHAOS:g} times the "
            f"objective's size ({scale:.3g}): the inner training is chaotic here (a learning "
            f"rate at or past the edge of stability, a long horizon). Rounding grows with the "
            f"derivative and finite differences see another function at every step size, so "
            f"the comparisons that fail may show no bug: check at a smaller learning rate or a "
            f"shorter horizon, where the training is stable.")


FD_SLACK = 100.0
"""Where finite differences are less accurate than ``rtol_fd`` (their own error estimate, the
disagreement of steps ``h`` and ``h / 2``), :func:`hypergradcheck` still fails a gap this many
times that estimate: it was not checked at all, and a hypergradient 50 % off (a loss reading
half a hyperparameter through ``.item()``) passed beside an estimate of 1.4e-5. The slack is
wide because the estimate can understate the error where the objective is rough at the step's
scale."""

FLOOR = 1e-6
""":func:`hypergradcheck` judges each group's error relative to its own norm, but at least this
fraction of the whole hypergradient's: a group whose hypergradient is nearly 0 (5e-8 beside
0.2) failed a correct check on rounding (an error of 1.6e-10 of its own norm)."""


def hypergradcheck(problem: InnerProblem, lam: Tensor | None = None, *,
                   strategies: Sequence[HVPStrategy] | None = None, fd_eps: float = 1e-5,
                   rtol_rev: float = 1e-8, rtol_fd: float = 1e-5, rtol_strategies: float = 1e-10,
                   raise_exception: bool = True, method: Method | None = None) -> CheckReport:
    """Check forward-mode hypergradients against reverse mode, central finite differences, and
    every HVP strategy, in float64; or, with ``method``, that method's hypergradients against
    reverse mode and finite differences.

    Every method reads the same batches: a streamed source (a DataLoader) reads one pass for all
    of them (:meth:`InnerProblem.fixed_pass <hypergrad.InnerProblem.fixed_pass>`).

    Args:
        problem: a float64 problem (``model.double()`` and float64 data).
        lam: raw hyperparameters (default ``problem.init_raw()``).
        strategies: HVP strategies to compare with the default :class:`VmapVJP` (default: all
            that can run on the problem; one that cannot, e.g. forward-over-reverse through an
            operation without a forward-mode derivative, is left out with a
            :class:`~hypergrad.errors.HypergradWarning` saying why).
        fd_eps: base finite-difference step in raw space (scaled per hyperparameter, see
            :class:`~hypergrad.FiniteDifference`); differences at ``h`` and ``h / 2`` are
            extrapolated and their disagreement is the estimate's own error.
        rtol_rev, rtol_fd, rtol_strategies: tolerances on the norm-wise relative errors (each
            group's relative to its own norm, at least :data:`FLOOR` of the whole's).
            Groups where finite differences are less accurate than ``rtol_fd`` (their own error
            estimate) are reported as unreliable (:attr:`CheckReport.fd_unreliable`) and held
            to :data:`FD_SLACK` times that estimate instead.
        raise_exception: raise :class:`HypergradcheckError` on failure (as ``gradcheck`` does).
        method: a method of your own (a :class:`~hypergrad.Method` subclass, or one of the
            library's with settings) checked in forward mode's place: the report's ``fwd_*``
            columns are its errors, and it names it. The HVP strategies are forward mode's, and
            not compared then. An approximation (a one-sided difference, implicit
            differentiation, truncation) is checked to tolerances you give it.

    Returns:
        A :class:`CheckReport`; ``print(report)`` shows the table.
    """
    if problem.dtype != torch.float64:
        raise TypeError(
            f"hypergradcheck: the problem runs in {problem.dtype}; the check needs float64 to "
            f"tell rounding from bugs: build it with model.double() and float64 data."
        )
    if method is not None and not isinstance(method, Method):
        raise TypeError(f"hypergradcheck: method={method!r} is not a hypergrad.Method; give an "
                        f"instance (MyMethod(), hypergrad.ForwardMode(...)), not its class or "
                        f"name")
    if method is not None and strategies is not None:
        raise ValueError("hypergradcheck: strategies are forward mode's HVP strategies, "
                         "compared only where it checks forward mode; with method=..., leave "
                         "strategies unset")
    lam = problem.init_raw() if lam is None else lam
    hps = problem.hyperparams
    every = strategies is None
    if strategies is None:
        strategies = ([] if method is not None else
                      [cls() for name, cls in STRATEGIES.items() if name != VmapVJP.name])
    spread = {n: 0.0 for n in hps.names}
    subject = method if method is not None else ForwardMode(VmapVJP())
    with problem.fixed_pass():  # every run of the check reads the same batches (a DataLoader)
        own = subject.hypergradient(problem, lam)
        ref = own.grad
        rev = ReverseMode().hypergradient(problem, lam).grad
        fd = FiniteDifference(fd_eps).estimate(problem, lam)
        for strat in strategies:
            try:
                other = ForwardMode(strat).hypergradient(problem, lam).grad
            except (NotImplementedError, RuntimeError) as err:  # one the problem cannot run
                # hypergrad's own refusals, and torch's errors inside a strategy the caller did
                # not choose (BatchedAutograd through GroupNorm's double backward: a shape
                # error), are left out: the check of the default method stands without them
                if not every or (isinstance(err, NotImplementedError)
                                 and not raised_in_hypergrad(err)):
                    raise
                first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                warnings.warn(f"hypergradcheck: left out the strategy {type(strat).__name__}, "
                              f"which cannot run on this problem ({type(err).__name__}: "
                              f"{first}); the default {VmapVJP.__name__} is checked against "
                              f"reverse mode and finite differences without it",
                              HypergradWarning, stacklevel=2)
                continue
            for n, e in group_rel_errs(hps, other, ref, FLOOR).items():
                spread[n] = max(spread[n], e)
    least = FLOOR * float(fd.grad.norm())
    fd_error = {n: float(fd.error[s].norm()) / max(float(fd.grad[s].norm()), least, 1e-300)
                for n, s in hps.slices.items()}
    report = CheckReport(
        group_rel_errs(hps, ref, rev, FLOOR), group_rel_errs(hps, ref, fd.grad, FLOOR), spread,
        {"fwd_vs_rev": rtol_rev, "fwd_vs_fd": rtol_fd,
         **({"strategies": rtol_strategies} if method is None else {})}, ref,
        fd_error, {n: rtol_fd if e <= rtol_fd else FD_SLACK * e for n, e in fd_error.items()},
        "" if method is None else repr(method))
    report.note = _chaos_note(own.objective, ref)
    if raise_exception and not report.ok:
        raise HypergradcheckError(f"hypergradcheck failed:\n{report}")
    return report


# -- the digits grid: every optimizer x every hyperparameter kind ---------------------------------

@dataclass(frozen=True)
class GridOptimizer:
    """A row of the exactness grid: the factory, its constant arguments (a constant weight decay
    everywhere, so the L2 paths run in every row), the initial learning rate, and how a
    ``momentum`` kind binds its hyperparameter (``None``: the optimizer has no momentum)."""

    factory: Callable[..., Optimizer]
    constants: dict[str, Any]
    lr0: float
    momentum: Callable[[Any], dict[str, Any]] | None = None
    momentum0: float = 0.5


GRID: dict[str, GridOptimizer] = {
    "sgd": GridOptimizer(sgd, {"weight_decay": 1e-3}, 0.1),
    "momentum": GridOptimizer(sgd, {"weight_decay": 1e-3}, 0.1,
                              lambda m: {"momentum": m}, 0.5),
    "nesterov": GridOptimizer(sgd, {"weight_decay": 1e-3, "nesterov": True}, 0.1,
                              lambda m: {"momentum": m}, 0.5),
    "adam": GridOptimizer(adam, {"weight_decay": 1e-3}, 0.01,
                          lambda m: {"betas": (m, 0.999)}, 0.9),
    "adamw": GridOptimizer(adamw, {"weight_decay": 1e-2}, 0.01,
                           lambda m: {"betas": (m, 0.999)}, 0.9),
    "rmsprop": GridOptimizer(rmsprop, {"weight_decay": 1e-3}, 0.01,
                             lambda m: {"momentum": m}, 0.5),
    "rmsprop_centered": GridOptimizer(rmsprop, {"weight_decay": 1e-3, "centered": True}, 0.01,
                                      lambda m: {"momentum": m}, 0.5),
    "adagrad": GridOptimizer(adagrad, {"weight_decay": 1e-3, "lr_decay": 0.01}, 0.05),
}
"""The optimizers of the exactness grid; a new optimizer adds a row."""

OPTIMIZERS = tuple(GRID)
KINDS = ("lr", "momentum", "per_tensor_wd", "per_group_wd", "schedule", "group_schedule",
         "scaled_schedule", "tuned_scales", "per_example", "loss_param")


def grid_cases() -> list[tuple[str, str]]:
    """Every (optimizer, kind) pair of the grid that applies (a momentum kind needs one)."""
    return [(o, k) for o in GRID for k in KINDS
            if not (k == "momentum" and GRID[o].momentum is None)]


def _optimizer(opt: str, kind: str) -> Optimizer:
    row = GRID[opt]
    args: dict[str, Any] = dict(row.constants)
    args["lr"] = "lr" if kind in ("lr", "schedule", "group_schedule", "scaled_schedule",
                                  "tuned_scales") else row.lr0
    if kind in ("per_tensor_wd", "per_group_wd"):
        args["weight_decay"] = "wd"
    if row.momentum is not None:
        args.update(row.momentum("mom" if kind == "momentum" else 0.9))
    return row.factory(**args)


def _hyperparameter(opt: str, kind: str, n_train: int, windows: int) -> HyperParameter:
    lr0 = GRID[opt].lr0
    if kind == "lr":
        return Scalar("lr", lr0, transform="log")
    if kind == "momentum":
        return Scalar("mom", GRID[opt].momentum0, transform="logit")
    if kind == "per_tensor_wd":
        return PerTensor("wd", 1e-2, transform="log")
    if kind == "per_group_wd":  # the first layer, the other weights; the rest at the default
        return PerGroup("wd", 1e-2, transform="log", groups={"first": r"^0\.", "rest": "weight$"},
                        default=1e-3)
    if kind == "schedule":
        return Schedule("lr", lr0, windows=windows, transform="log")
    if kind == "group_schedule":  # a schedule for the first layer, one for the rest
        return Schedule("lr", lr0, windows=windows, transform="log",
                        groups={"first": r"^0\.", "rest": ".*"})
    if kind == "scaled_schedule":  # one schedule, the first layer at half the rate
        return Schedule("lr", lr0, windows=windows, transform="log",
                        multipliers={r"^0\.": 0.5, ".*": 1.0})
    if kind == "tuned_scales":  # one schedule, a tuned factor on the first layer's rate
        return Schedule("lr", [lr0] * windows + [0.7], windows=windows, transform="log",
                        scales={"first": r"^0\."})
    if kind == "per_example":
        return PerExample("ex_w", n=n_train, init=0.5, transform="logit")
    return Array("smooth", 0.1, transform="logit")


@keeps_rng
def digits_case(opt: str, kind: str, *, steps: int = 20, n_train: int = 64, batch_size: int = 16,
                hidden: int = 16, n_val: int = 64, windows: int = 4, batchnorm: bool = False,
                val_mode: str = "eval", seed: int = 0,
                device: torch.device | str | None = None) -> InnerProblem:
    """A float64 MLP on a subset of ``load_digits`` with one hyperparameter kind and one optimizer
    (names from :data:`OPTIMIZERS` and :data:`KINDS`); a ``momentum`` kind for an optimizer
    without momentum (plain ``sgd``) raises ``NotImplementedError``.

    ``device``: where the model and the data live (default: the environment variable
    :data:`TEST_DEVICE_ENV` if set, else the CPU); the initial weights are drawn on the CPU and
    moved, so they are the same on every device."""
    from .data import MiniBatches
    from .tasks import digits_data, mlp

    if opt not in OPTIMIZERS or kind not in KINDS:
        raise ValueError(f"digits_case: opt={opt!r} must be in {OPTIMIZERS}, kind={kind!r} in "
                         f"{KINDS}.")
    if kind == "momentum" and GRID[opt].momentum is None:
        raise NotImplementedError(f"digits_case: {opt} has no momentum to tune.")
    dev = torch.device(device if device is not None
                       else os.environ.get(TEST_DEVICE_ENV) or "cpu")
    data = digits_data(n_train, n_val, 1, seed=seed, dtype=torch.float64, device=dev)
    torch.manual_seed(seed)
    model = mlp([64, hidden, 10], batchnorm=batchnorm).double().to(dev)
    hps = HyperParams([_hyperparameter(opt, kind, n_train, windows)])

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, idx = batch
        logp = F.log_softmax(m(x), dim=-1)
        nll = -logp.gather(1, y[:, None])[:, 0]
        if "smooth" in hp:  # label smoothing as a learnable loss parameter
            nll = (1 - hp["smooth"]) * nll - hp["smooth"] * logp.mean(-1)
        if "ex_w" in hp:
            return (hp["ex_w"][idx] * nll).mean()
        return nll.mean()

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(data.x_val), data.y_val)

    batches = MiniBatches(data.x_train, data.y_train, batch_size=batch_size, seed=seed)
    return InnerProblem(model, train_loss, _optimizer(opt, kind), hps, batches, steps, val_loss,
                        val_mode=val_mode, seed=seed)


# -- problems with a known or converged answer (implicit differentiation, experiments/methods.py) --

@keeps_rng
def l2_mlp_case(steps: int = 1000, *, n_train: int = 128, hidden: int = 16, l2: float = 0.1,
                lr: float = 0.5, momentum: float = 0.9, n_val: int = 200,
                via_optimizer: bool = False, seed: int = 0) -> InnerProblem:
    """A float64 MLP (64-hidden-10, tanh) on ``n_train`` digits, trained full batch by SGD with
    heavy-ball momentum, with one L2 coefficient per parameter tensor (``PerTensor("l2")``, K = 4)
    in the training loss. The L2 makes the training loss strongly convex enough near its minimum
    that ``steps=1000`` reaches it to a relative gradient norm of ~1e-12 (500: ~1e-7), so the
    implicit hypergradient at ``w_T`` is the forward/reverse one at large ``T``.
    ``via_optimizer``: the same L2 as ``sgd(weight_decay="l2")`` instead of a loss term."""
    from .tasks import digits_data, mlp

    data = digits_data(n_train, n_val, 1, seed=seed, dtype=torch.float64)
    torch.manual_seed(seed)
    model = mlp([64, hidden, 10]).double()
    hps = HyperParams([PerTensor("l2", l2, transform="log")])

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y = batch
        ce = F.cross_entropy(m(x), y)
        if via_optimizer:
            return ce
        return ce + sum(0.5 * hp["l2"][k] * (w * w).sum() for k, w in m.params.items())

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(data.x_val), data.y_val)

    opt = sgd(lr=lr, momentum=momentum, weight_decay="l2" if via_optimizer else 0.0)
    return InnerProblem(model, train_loss, opt, hps, [(data.x_train, data.y_train)], steps,
                        val_loss, seed=seed)


def ridge_diabetes_case(steps: int = 2000, l2: float = 0.1, n_train: int = 250,
                        n_val: int = 100, seed: int = 0) -> tuple[InnerProblem, Tensor]:
    """Ridge regression on standardized ``load_diabetes`` by full-batch gradient descent with the
    learning rate ``2 / (lambda_max + lambda_min)`` of the training loss's Hessian (contraction
    0.955 per step), from ``w_0 = 0``; returns the problem (K = 1, ``log l2``) and the
    closed-form hypergradient at convergence (:func:`~hypergrad.tasks.ridge_closed_form_
    hypergradient` with ``steps=None``), which the problem reaches to ~1e-14 at 2000 steps."""
    import numpy as np
    from sklearn.datasets import load_diabetes

    from .tasks import ridge_closed_form_hypergradient, ridge_problem

    x, y = load_diabetes(return_X_y=True)
    perm = np.random.default_rng(seed).permutation(len(y))
    x, y = x[perm], y[perm]
    x = (x - x[:n_train].mean(0)) / x[:n_train].std(0)
    y = (y - y[:n_train].mean()) / y[:n_train].std()
    xt, yt = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    xtr, ytr = xt[:n_train], yt[:n_train]
    xv, yv = xt[n_train:n_train + n_val], yt[n_train:n_train + n_val]
    ev = torch.linalg.eigvalsh(xtr.T @ xtr / n_train)
    lr = 2.0 / (float(ev[-1]) + float(ev[0]) + 2 * l2)
    problem = ridge_problem(xtr, ytr, xv, yv, l2, lr, steps)
    return problem, ridge_closed_form_hypergradient(xtr, ytr, xv, yv, l2, lr, None)


def classifier_case(model: torch.nn.Module, shape: tuple[int, ...], k: int, *, steps: int = 3,
                    n: int = 64, batch_size: int = 32,
                    device: torch.device | str | None = None) -> InnerProblem:
    """A 10-class ``model`` on ``n`` random inputs of ``shape`` (drawn on the CPU from seed 0,
    then moved to ``device``: the same numbers on every device), trained by SGD with momentum
    0.9 and weight decay 5e-4 in mini-batches of ``batch_size``; K = the learning rate and
    ``k - 1`` example-group weights of the loss (example ``i`` in group ``i mod (k - 1)``), so
    every column is live at every step. The benchmark models' problem
    (``experiments/benchmarks/bench_models.py``) and the memory estimates' tests."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn((n, *shape), generator=g).to(device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    groups = max(k - 1, 1)
    items: list[HyperParameter] = [Scalar("lr", 0.05, transform="log")]
    if k > 1:
        items.append(Array("gw", 0.5, shape=(k - 1,), transform="logit"))

    def train_loss(m: Any, b: Any, hp: Any) -> Tensor:
        xb, yb, idx = b
        nll = F.cross_entropy(m(xb), yb, reduction="none")
        return (hp["gw"][idx % groups] * nll).mean() if "gw" in hp else nll.mean()

    def val_loss(m: Any, hp: Any) -> Tensor:
        return F.cross_entropy(m(x[:batch_size]), y[:batch_size])

    return InnerProblem(model, train_loss, sgd(lr="lr", momentum=0.9, weight_decay=5e-4),
                        HyperParams(items), MiniBatches(x, y, batch_size=batch_size), steps,
                        val_loss)
