"""Implicit differentiation: hypergradients from the implicit function theorem at an approximate
inner optimum (Bengio 2000; Pedregosa 2016; Lorraine et al. 2020; as in hypertorch, torchopt's
``custom_root``, betty and jaxopt).

If ``w*(lam)`` is a stationary point of a fixed training objective, ``grad_w L(w*, lam) = 0``,
then ``dw*/dlam = -H^{-1} d^2 L / dw dlam`` with ``H = d^2 L / dw^2``, and

    dE/dlam = dE/dlam|direct - (d^2 L / dlam dw) v,   where   H v = grad_w E(w*).

:class:`ImplicitDiff` trains the problem's ``T`` steps (plain), takes ``w_T`` for ``w*``,
solves ``H v = grad_w E`` with a :class:`LinearSolver` on Hessian-vector products (functional
reverse-over-reverse: ``vjp`` of the gradient, one column at a time; the same ``vjp`` gives the
mixed term ``(d^2 L / dlam dw) v``), and reports the solver's residual and iterations.

**Which training objective.** The theorem needs the stationary point of *one* function. Here it
is ``L(w, lam) = mean over the steps t in loss_steps of train_loss(w; B_t) + penalty(w)``, with
the running statistics at ``b_T``, and ``penalty`` the term the optimizer itself adds to the
gradient (the L2 ``weight_decay`` of :func:`~hypergrad.optim.sgd` and
:func:`~hypergrad.optim.adam`; not AdamW's decoupled decay) with its hyperparameters at the last
step. The default ``loss_steps=None`` takes the last step's batch: exact for full-batch training
(every step the same batch); for mini-batch training pass the steps of one whole epoch (the last:
``range(T - T % n - n, T - T % n)`` for ``n`` batches per epoch; ``range(T - n, T)`` spans two
shuffled epochs when ``n`` does not divide ``T``, reading some examples twice and some never,
which :meth:`ImplicitDiff.at_state` warns about) so the objective is the whole training loss
(each Hessian-vector product then costs one pass over those batches).

**What it applies to.** Hyperparameters of the training loss (read as ``hp[...]`` in
``train_loss``: L2 coefficients, per-example weights, loss parameters), an L2 ``weight_decay``
of the optimizer, and anything the validation loss reads (the direct term). Not to the
optimizer's other hyperparameters (learning rates, momenta, their schedules): the optimum does
not depend on how the optimizer reached it, so the theorem says nothing about them (their
hypergradient through training is what forward and reverse mode compute); likewise for the
initial weights (:class:`~hypergrad.InitScale`, :class:`~hypergrad.InitWeights`).
:meth:`ImplicitDiff.hypergradient` raises a ``ValueError`` naming them.

**Convergence.** An unconverged inner solve makes implicit hypergradients wrong, with sign flips
(ridge after 5 steps: the opposite sign of the converged hypergradient; tests/test_implicit.py).
The stationarity of ``w_T`` is measured as ``r = ||grad_w L(w_T)|| / ||grad_w L(w_0)||``; above
``grad_tol`` (default 1e-3) a :class:`~hypergrad.errors.InnerNotConvergedWarning` says so. Why
1e-3: on ridge (``load_diabetes``) and on the L2 MLP of the tests the implicit hypergradient's
relative error was 3-5 times ``r`` (ridge: ``r`` = 8.7e-4 gave 4.1e-3, 8.6e-5 gave 4.1e-4; the
MLP: 1.7e-4 gave 4.6e-4). The factor grows with the Hessian's condition number (the same MLP
with half the L2: ``r`` = 3.8e-5 and 1% error, a factor of 250; a ridge regression of condition
number 910 after 1000 steps of gradient descent: ``r`` = 2.5e-4, no warning, and 47 % off the
optimum's hypergradient: the gradient norm is dominated by the stiff directions and blind to
the slow ones, where ``w_T`` is still far from the optimum), so the warning is a necessary
check, not a guarantee: lower ``grad_tol`` where accuracy matters, or compare with forward or
reverse mode once. A solver that stops above its tolerance gives a
:class:`~hypergrad.errors.SolverNotConvergedWarning`.
"""

from __future__ import annotations

import abc
import math
import numbers
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import grad, grad_and_value, vjp
from torch.utils._pytree import tree_flatten

from ..errors import InnerNotConvergedWarning, SolverNotConvergedWarning, flag, is_real
from ..hvp import VmapVJP
from ..optim.base import is_zero
from ..problem import InnerProblem, InnerState
from .base import HyperGradient, MemoryEstimate, Method, Sizes, checked

__all__ = ["LinearSolver", "CG", "Neumann", "FixedPoint", "ImplicitDiff", "SOLVERS"]

HVP = Callable[[Tensor], Tensor]


def _check_int(api: str, name: str, v: Any, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < low:
        raise ValueError(f"{api}: {name}={v!r} must be an int >= {low}.")
    return int(v)


def _check_pos(api: str, name: str, v: Any, allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    if (not is_real(v) or not float(v) > 0
            or math.isinf(float(v))):
        none = "None (automatic) or " if allow_none else ""
        raise ValueError(f"{api}: {name}={v!r} must be {none}a finite number > 0.")
    return float(v)


class LinearSolver(abc.ABC):
    """Solves ``H x = b`` for a symmetric ``H`` given as a Hessian-vector product on flat
    vectors, reporting what it did.

    Args:
        maxiter: at most this many iterations (one Hessian-vector product each).
        tol: stop when the residual ``||H x - b|| / ||b||`` is at most ``tol``.

    :meth:`solve` returns ``x`` and an ``info`` dict: ``solver``, ``iterations``, ``hvps``
    (every Hessian-vector product, including the step-size estimate and the final residual
    check), ``residual`` (the true relative residual of ``x``, from one more product),
    ``converged`` (``residual <= tol``).
    """

    name = "abstract"

    def __init__(self, maxiter: int = 100, tol: float = 1e-10) -> None:
        api = type(self).__name__
        self.maxiter = _check_int(api, "maxiter", maxiter)
        tol_ = _check_pos(api, "tol", tol)
        assert tol_ is not None
        self.tol = tol_

    def solve(self, hvp: HVP, b: Tensor, x0: Tensor | None = None) -> tuple[Tensor, dict[str, Any]]:
        """``x ~ H^{-1} b`` (flat vectors of shape ``(D,)``) and the ``info`` dict."""
        count = [0]

        def counted(v: Tensor) -> Tensor:
            count[0] += 1
            return hvp(v)

        bn = float(b.norm())
        if not bn > 0:
            # H x = 0 is solved by 0: a validation loss flat in the weights (one that reads only
            # the hyperparameters) made the stepped solvers' power iteration start from the zero
            # vector and refuse the problem as "not at a minimum"
            return torch.zeros_like(b), {"solver": self.name, "iterations": 0, "hvps": 0,
                                         "residual": 0.0, "converged": True}
        x, info = self._solve(counted, b, x0)
        res = float((counted(x) - b).norm()) / bn if bn > 0 else float((counted(x)).norm())
        info = {"solver": self.name, **info, "hvps": count[0], "residual": res,
                "converged": res <= self.tol}
        return x, info

    @abc.abstractmethod
    def _solve(self, hvp: HVP, b: Tensor, x0: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}(maxiter={self.maxiter}, tol={self.tol:g})"


class CG(LinearSolver):
    """Conjugate gradients (Hestenes & Stiefel 1952): exact in at most ``D`` iterations for a
    positive definite ``H``, the error shrinking by ``(sqrt(k) - 1) / (sqrt(k) + 1)`` per
    iteration for condition number ``k``. A non-positive curvature ``p^T H p <= 0`` (``H`` not
    positive definite: ``w_T`` is no minimum) stops it, with ``info["breakdown"]`` set and
    ``info["breakdown_rounding"]`` true when that curvature is within the dtype's rounding of zero
    (below ``1e3 eps`` times the largest curvature seen: ``H`` singular in some direction, which
    the dtype cannot resolve, rather than indefinite).
    Warm starts from ``x0``.

    Example:
        >>> H = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
        >>> x, info = CG(tol=1e-12).solve(lambda v: H @ v, torch.ones(2, dtype=torch.float64))
        >>> info["iterations"], info["converged"]
        (2, True)
    """

    name = "cg"

    def _solve(self, hvp: HVP, b: Tensor, x0: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        x = torch.zeros_like(b) if x0 is None else x0.clone()
        r = b - hvp(x) if x0 is not None else b.clone()
        p = r.clone()
        rs = torch.dot(r, r)
        target = (self.tol * float(b.norm())) ** 2
        it, breakdown, rounding, lam = 0, "", False, 0.0
        eps = torch.finfo(b.dtype).eps
        # the iterate of the smallest residual: where b has a part H cannot reach (a singular H),
        # the residual stops falling at that part and the later steps, along directions of
        # vanishing curvature, only grow x (measured: 0.63 of |b|, then 4.96e4)
        best = (float(rs), x.clone(), 0)
        while it < self.maxiter and float(rs) > target:
            hp = hvp(p)
            php, pp = torch.dot(p, hp), float(torch.dot(p, p))
            if not float(php) > 10 * eps * lam * pp:
                # a curvature within rounding of zero against the largest seen is no curvature
                # the dtype resolves: a step along it (a = rs / php) would be enormous (a
                # singular H of an over-parameterised least squares, float64: p^T H p / |p|^2 =
                # 1.6e-30 against 5.8 put 4e17 into the hypergradient)
                breakdown = (f"non-positive curvature p^T H p = {float(php):.3g}"
                             if not float(php) > 0 else
                             f"curvature p^T H p / |p|^2 = {float(php) / pp:.3g}, within "
                             f"rounding of zero against the largest seen ({lam:.3g})")
                # within rounding of zero against the largest curvature seen (H singular in a
                # direction, e.g. softmax's shift of all biases; measured in float32: -4.9e-9
                # against eps * 0.25 * |p|^2 = 1.4e-7, the hypergradient equal to float64's)
                rounding = bool(abs(float(php)) <= 1e3 * eps * lam * pp)
                break
            lam = max(lam, float(php) / pp)
            a = rs / php
            x.add_(p, alpha=float(a))
            r.sub_(hp, alpha=float(a))
            rs_new = torch.dot(r, r)
            p = r + (rs_new / rs) * p
            rs = rs_new
            it += 1
            if float(rs) < best[0]:
                best = (float(rs), x.clone(), it)
        info: dict[str, Any] = {"iterations": it}
        if breakdown and best[0] < float(rs):  # else the last iterate (CG's least A-norm error)
            x = best[1]
            info["returned_iterate"] = best[2]
        if breakdown:
            info["breakdown"] = breakdown
            info["breakdown_rounding"] = rounding
        return x, info


def _power_alpha(hvp: HVP, b: Tensor, iters: int) -> tuple[float, float]:
    """``(alpha, lambda_max)``: ``lambda_max`` from ``iters`` power iterations started at ``b``,
    ``alpha = 1 / lambda_max`` (power iteration approaches ``lambda_max`` from below, so
    ``alpha * lambda_max`` stays below 2, where the iteration converges)."""
    v = b / b.norm().clamp_min(torch.finfo(b.dtype).tiny)
    lam_max = 0.0
    for _ in range(iters):
        hv = hvp(v)
        lam_max = float(torch.dot(v, hv))
        n = hv.norm()
        if not float(n) > 0:
            break
        v = hv / n
    if not lam_max > 0:
        raise ValueError(f"the Hessian's largest eigenvalue estimate is {lam_max:.3g} <= 0: the "
                         f"inner problem is not at a minimum; give alpha= explicitly or use CG.")
    return 1.0 / lam_max, lam_max


class _Stepped(LinearSolver):
    """A solver with a step size ``alpha``: ``None`` estimates ``1 / lambda_max(H)`` by
    ``power_iters`` power iterations."""

    def __init__(self, maxiter: int = 100, tol: float = 1e-10, alpha: float | None = None,
                 power_iters: int = 20) -> None:
        super().__init__(maxiter, tol)
        api = type(self).__name__
        self.alpha = _check_pos(api, "alpha", alpha, allow_none=True)
        self.power_iters = _check_int(api, "power_iters", power_iters)

    def _alpha(self, hvp: HVP, b: Tensor) -> tuple[float, dict[str, Any]]:
        if self.alpha is not None:
            return self.alpha, {"alpha": self.alpha}
        try:
            alpha, lam_max = _power_alpha(hvp, b, self.power_iters)
        except ValueError as err:
            raise ValueError(f"{type(self).__name__}(alpha=None): {err}") from None
        return alpha, {"alpha": alpha, "lambda_max": lam_max}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(maxiter={self.maxiter}, tol={self.tol:g}, "
                f"alpha={self.alpha})")


class Neumann(_Stepped):
    """The truncated Neumann series ``x_n = alpha sum_{i<n} (I - alpha H)^i b`` (Lorraine et al.
    2020, eq. 6): converges for ``0 < alpha < 2 / lambda_max`` with positive definite ``H``, the
    error shrinking by ``1 - alpha lambda_min`` per term. Its remainder ``(I - alpha H)^n b`` is
    the residual, so it stops at ``tol`` without extra products. Always starts from 0.

    Args:
        maxiter, tol: as :class:`LinearSolver` (``maxiter`` terms at most).
        alpha: the step; ``None`` (default): ``1 / lambda_max`` from ``power_iters`` power
            iterations.
    """

    name = "neumann"

    def _solve(self, hvp: HVP, b: Tensor, x0: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        alpha, info = self._alpha(hvp, b)
        p = b.clone()
        x = torch.zeros_like(b)
        target = self.tol * float(b.norm())
        n = 0
        while n < self.maxiter:
            x.add_(p, alpha=alpha)
            p = p - alpha * hvp(p)
            n += 1
            if float(p.norm()) <= target:
                break
        return x, {**info, "iterations": n}


class FixedPoint(_Stepped):
    """Fixed-point iteration ``x <- x - alpha (H x - b) + momentum (x - x_prev)``: the
    fixed point of one gradient-descent step on ``x^T H x / 2 - b^T x`` (hypertorch's
    ``fixed_point`` with a gradient-descent map), with optional heavy-ball momentum. From
    ``x0 = 0`` and ``momentum = 0`` its iterates are the Neumann series' partial sums (equal in
    exact arithmetic); unlike the series it warm-starts from ``x0`` and takes momentum
    (``alpha = 4 / (sqrt(L) + sqrt(mu))^2`` and ``momentum = ((sqrt(k) - 1) / (sqrt(k) + 1))^2``
    give the ``sqrt(k)`` rate of CG for eigenvalues in ``[mu, L]``, ``k = L / mu``).

    Args:
        maxiter, tol: as :class:`LinearSolver`.
        alpha: the step; ``None``: ``1 / lambda_max`` by power iteration.
        momentum: heavy-ball momentum in ``[0, 1)`` (default 0).
    """

    name = "fixed_point"

    def __init__(self, maxiter: int = 100, tol: float = 1e-10, alpha: float | None = None,
                 momentum: float = 0.0, power_iters: int = 20) -> None:
        super().__init__(maxiter, tol, alpha, power_iters)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not (
                0 <= momentum < 1):
            raise ValueError(f"FixedPoint: momentum={momentum!r} must be in [0, 1).")
        self.momentum = float(momentum)

    def _solve(self, hvp: HVP, b: Tensor, x0: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        alpha, info = self._alpha(hvp, b)
        x = torch.zeros_like(b) if x0 is None else x0.clone()
        prev = x
        target = self.tol * float(b.norm())
        n = 0
        while n < self.maxiter:
            r = hvp(x) - b
            if float(r.norm()) <= target:
                break
            new = x - alpha * r
            if self.momentum:
                new = new + self.momentum * (x - prev)
            prev, x = x, new
            n += 1
        return x, {**info, "iterations": n}

    def __repr__(self) -> str:
        return (f"FixedPoint(maxiter={self.maxiter}, tol={self.tol:g}, alpha={self.alpha}, "
                f"momentum={self.momentum})")


SOLVERS: dict[str, type[LinearSolver]] = {CG.name: CG, Neumann.name: Neumann,
                                          FixedPoint.name: FixedPoint}
"""The solvers by name (for configs)."""


def _batches_change(problem: InnerProblem) -> bool:
    """Whether the last two steps read different mini-batches (a stream: a loader's batches,
    taken to change; a sequence or a callable: compared)."""
    if problem.steps < 2:
        return False
    if problem.stream is not None:
        return True
    a, b = (tree_flatten(problem.batch(t))[0] for t in (problem.steps - 2, problem.steps - 1))

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, Tensor) or isinstance(y, Tensor):
            return (isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape == y.shape
                    and bool(torch.equal(x, y)))
        return bool(x is y or x == y)

    return len(a) != len(b) or not all(same(x, y) for x, y in zip(a, b))


def _no_optimum(problem: InnerProblem) -> str:
    """Why training longer may not bring the weights to a stationary point of the implicit
    objective, where the problem shows it: a training loss that draws random numbers
    (dropout), or normalization layers (scale-invariant weights under weight decay). Measured
    on a digits MLP at T = 2000: the gradient's norm stayed at 0.22-0.61 of its start with
    them (0.016 without), and the advice to train longer was all the warning said."""
    why = []
    if problem.draws:
        why.append("the training loss draws random numbers (dropout): the objective here is "
                   "one draw of it, at whose stationary point training never sits")
    norms = sorted({type(m).__name__ for m in problem.fmodel.module.modules()
                    if isinstance(m, (nn.modules.batchnorm._NormBase, nn.LayerNorm,
                                      nn.GroupNorm))})
    if norms:
        why.append(f"the model normalizes ({', '.join(norms)}): the weights before a "
                   f"normalization are scale-invariant, and under weight decay on them the "
                   f"training objective has no stationary point (their norm shrinks for "
                   f"ever)")
    if not why:
        return ""
    return (" Training longer may not help here: " + "; ".join(why) + "; the implicit "
            "hypergradient then approximates at best, and forward or reverse mode is exact.")


def _epoch(problem: InnerProblem) -> int | None:
    """The batches per epoch of a :class:`~hypergrad.data.MiniBatches` source or of a
    DataLoader (:func:`_loader_epoch`), else None."""
    from ..data import MiniBatches

    data = problem._batch.data
    if isinstance(data, MiniBatches):
        return data.per_epoch
    loader = _loader_epoch(problem)
    return None if loader is None else loader[0]


def _loader_epoch(problem: InnerProblem) -> tuple[int, bool, int, int] | None:
    """``(batches per epoch, shuffled, examples per epoch, examples each epoch drops)`` of a
    DataLoader source (a stream restarts its ``iter()`` when it runs out, so epoch ``e`` is
    steps ``e n .. e n + n - 1``); None for another source, or one that does not say."""
    from torch.utils.data import SequentialSampler

    source = getattr(problem.stream, "source", None)
    sampler = getattr(source, "sampler", None)
    if source is None or sampler is None:
        return None
    try:
        n, examples = len(source), len(sampler)
    except TypeError:  # an IterableDataset's loader has no length
        return None
    bs = getattr(source, "batch_size", None)
    dropped = examples % bs if getattr(source, "drop_last", False) and isinstance(bs, int) else 0
    return (n, not isinstance(sampler, SequentialSampler), examples, dropped) if n > 0 else None


def _last_epoch(problem: InnerProblem, n: int) -> str:
    """The steps of the last whole epoch of ``n`` batches, as a ``range`` to give."""
    end = problem.steps // n * n
    return f"range({end - n}, {end})" if end >= n else f"range(0, {n}) (T >= {n})"


def _last_n(problem: InnerProblem, n: int) -> str:
    """The last ``n`` steps, as a ``range`` to give (a pass over batches read in order)."""
    t = problem.steps
    return f"range({t - n}, {t})" if t >= n else f"range(0, {n}) (T >= {n})"


def uneven_coverage(problem: InnerProblem, steps: Sequence[int]) -> str | None:
    """Why the mini-batches of ``steps`` are not whole epochs of a
    :class:`~hypergrad.data.MiniBatches` source shuffled per epoch (``range(T - n, T)`` with
    ``T`` no multiple of the ``n`` batches per epoch spans two epochs: some examples twice,
    some never), so the objective is not the training loss; ``None`` when they are, or when
    the source does not say."""
    if problem.stream is not None:
        return _uneven_loader(problem, steps)
    n = _epoch(problem)
    if n is None:
        return None
    data = problem._batch.data
    given = set(steps)
    if data.shuffle:
        epochs = {t // n for t in given}
        if all(e * n + i in given for e in epochs for i in range(n)):
            return None
        counts = data.read_counts(sorted(given))
        what, order = "whole epochs", "MiniBatches shuffles each epoch"
    else:  # in order: any n steps in a row read each example once (8 steps of 3 batches did not)
        counts = data.read_counts(sorted(given))
        if int(counts.min()) == int(counts.max()):
            return None
        what, order = "whole passes", "MiniBatches reads them in order"
    return (f"loss_steps={_steps_repr(steps)} are not {what} of the {n} batches per "
            f"epoch ({order}), so they read the training examples "
            f"from {int(counts.min())} to {int(counts.max())} times ({int((counts == 0).sum())} "
            f"of {data.n} never): the objective is not the training loss, and a per-example "
            f"weight of an example never read gets a hypergradient of 0. Give whole epochs, "
            f"e.g. loss_steps={_last_epoch(problem, n) if data.shuffle else _last_n(problem, n)}"
            f", the last whole {'epoch' if data.shuffle else 'pass'}")


def _uneven_loader(problem: InnerProblem, steps: Sequence[int]) -> str | None:
    """:func:`uneven_coverage` for a DataLoader: its batches carry no example indices to count,
    so the steps are judged by position (the implicit probe: ``range(T - 5, T)`` over two
    shuffled epochs of 5 batches, and per-example weights of the 5 examples never read got
    exactly 0 where reverse mode had up to 1.3e-4, with no word; a MiniBatches source was
    warned)."""
    loader = _loader_epoch(problem)
    if loader is None:
        return None
    n, shuffled, examples, dropped = loader
    given = set(steps)
    if shuffled:
        epochs = {t // n for t in given}
        whole = all(e * n + i in given for e in epochs for i in range(n))
    else:  # in order: each batch position read equally often is whole passes
        per = [sum(1 for t in given if t % n == i) for i in range(n)]
        whole = min(per) == max(per)
    fix = _last_epoch(problem, n) if shuffled else _last_n(problem, n)
    order = "its sampler shuffles each epoch" if shuffled else "read in order"
    if not whole:
        return (f"loss_steps={_steps_repr(steps)} are not whole epochs of the DataLoader's "
                f"{n} batches per epoch ({order}), so they read some "
                f"training examples more often than others, some perhaps never: the objective "
                f"is not the training loss, and a per-example weight of an example never read "
                f"gets a hypergradient of 0. Give whole epochs, e.g. loss_steps={fix}, the "
                f"last whole {'epoch' if shuffled else 'pass'}")
    if dropped and shuffled:
        return (f"the DataLoader drops {dropped} of its {examples} examples from every epoch "
                f"(drop_last=True, shuffled), other ones each epoch: loss_steps="
                f"{_steps_repr(steps)} leave out the ones their epochs dropped, whose "
                f"per-example weights get a hypergradient of 0, though training read them. "
                f"Use drop_last=False, or a batch size that divides {examples}")
    return None


def _steps_repr(steps: Sequence[int]) -> str:
    s = list(steps)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"range({s[0]}, {s[-1] + 1})"
    return repr(s)


def _flat(d: dict[str, Tensor]) -> Tensor:
    return torch.cat([v.reshape(-1) for v in d.values()])


def _unflat(x: Tensor, like: dict[str, Tensor]) -> dict[str, Tensor]:
    out, i = {}, 0
    for k, v in like.items():
        out[k] = x[i:i + v.numel()].reshape(v.shape)
        i += v.numel()
    return out


class ImplicitDiff(Method, name="implicit"):
    """Implicit-differentiation hypergradients at the state after ``T`` plain steps (see the
    module docstring for the objective, what it applies to, and the checks).

    Args:
        solver: a :class:`LinearSolver` for ``H v = grad_w E`` (default ``CG()``).
        loss_steps: the steps whose mini-batches define the training objective (default: the
            last step). Full-batch problems need nothing else.
        grad_tol: warn (:class:`~hypergrad.errors.InnerNotConvergedWarning`) when
            ``||grad_w L(w_T)|| / ||grad_w L(w_0)||`` exceeds it.
        warm_start: start the solver from the previous call's solution on the same problem
            (CG and FixedPoint; outer loops whose ``lam`` moves little converge in fewer
            iterations).

    The result's ``info`` holds the solver's report (``residual``, ``iterations``, ``hvps``,
    ``converged``; ``alpha`` for the stepped solvers), ``grad_norm`` and ``grad_norm_ratio``.

    Example:
        >>> m = ImplicitDiff(CG(maxiter=50, tol=1e-10))
        >>> r = m.hypergradient(problem, problem.init_raw())  # doctest: +SKIP
        >>> r.grad, r.info["residual"], r.info["iterations"]  # doctest: +SKIP
    """

    def __init__(self, solver: LinearSolver | None = None, *,
                 loss_steps: Sequence[int] | None = None, grad_tol: float = 1e-3,
                 warm_start: bool = False) -> None:
        if solver is not None and not isinstance(solver, LinearSolver):
            raise TypeError(f"ImplicitDiff: solver must be a LinearSolver such as CG(), "
                            f"Neumann() or FixedPoint(), got {type(solver).__name__}.")
        if loss_steps is not None:
            steps = (list(loss_steps) if isinstance(loss_steps, Iterable)
                     and not isinstance(loss_steps, (str, bytes)) else [])  # 3: not iterable
            if not steps or any(isinstance(t, bool) or not isinstance(t, numbers.Integral)
                                or t < 0 for t in steps):
                raise ValueError(f"ImplicitDiff: loss_steps={loss_steps!r} must be None (the "
                                 f"last step) or a non-empty sequence of step indices >= 0, "
                                 f"e.g. range(T - 10, T).")
            loss_steps = [int(t) for t in steps]
        tol = _check_pos("ImplicitDiff", "grad_tol", grad_tol)
        assert tol is not None
        self.solver = solver if solver is not None else CG()
        self.loss_steps = loss_steps
        self.grad_tol = tol
        self.warm_start = flag("ImplicitDiff", "warm_start", warm_start)
        self._last: weakref.WeakKeyDictionary[InnerProblem, Tensor] = (
            weakref.WeakKeyDictionary())
        self._told: weakref.WeakSet[InnerProblem] = weakref.WeakSet()  # uneven_coverage

    def __getstate__(self) -> dict[str, Any]:
        """Without the per-problem warm starts and notes (weak references, which do not
        pickle): the method can be sent to a worker process."""
        state = dict(self.__dict__)
        state["_last"] = state["_told"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._last = weakref.WeakKeyDictionary()
        self._told = weakref.WeakSet()

    def check(self, problem: InnerProblem) -> None:
        """Raise where the implicit function theorem does not apply to ``problem``'s
        hyperparameters or model (see the module docstring); the Trainer asks before any
        training."""
        hps, opt = problem.hyperparams, problem.optimizer
        bound = opt.bound_names()
        not_loss = {n: a for n, a in bound.items() if a not in opt.stationary_args}
        if not_loss:
            args = ", ".join(f"{a}={n!r}" for n, a in not_loss.items())
            raise ValueError(
                f"ImplicitDiff: hyperparameters {sorted(not_loss)} are read by the optimizer "
                f"({opt.name}({args})). At a stationary point of the training loss the solution "
                f"does not depend on how the optimizer reached it, so the implicit function "
                f"theorem says nothing about learning rates, momenta or their schedules. Use "
                f"ForwardMode() or ReverseMode() (method='forward' / 'reverse') for them; "
                f"ImplicitDiff takes hyperparameters of the training loss (hp[...] in "
                f"train_loss) and an L2 weight_decay of sgd, adam, rmsprop or adagrad.")
        wd = opt.args.get("weight_decay")  # a constant (a bound one was refused above)
        if "weight_decay" not in opt.stationary_args and wd is not None and not is_zero(wd):
            raise ValueError(
                f"ImplicitDiff: {opt.name}(weight_decay={wd!r}) decays the weights apart from "
                f"the gradient (decoupled), so its fixed points are no stationary points of "
                f"the training loss and the implicit function theorem gives a wrong "
                f"hypergradient. Use an L2 decay added to the gradient (sgd, adam, rmsprop "
                f"or adagrad with weight_decay=...), or ForwardMode() / ReverseMode().")
        init = [it.name for it in hps.init_items]
        if init:
            raise ValueError(
                f"ImplicitDiff: hyperparameters {init} set the initial weights; a stationary "
                f"point does not depend on where training started (locally), so the implicit "
                f"function theorem gives nothing for them. Use ReverseMode() or ForwardMode().")
        if problem.fmodel.state_buffer_names and problem.val_mode == "eval":
            raise NotImplementedError(
                "ImplicitDiff: the model has BatchNorm running statistics that the validation "
                "loss reads (val_mode='eval'); they are no part of the stationarity condition. "
                "Use ForwardMode() or ReverseMode(), val_mode='train', or BatchNorm in eval "
                "mode (frozen statistics).")
        if self.loss_steps is not None and max(self.loss_steps) >= problem.steps:
            raise ValueError(f"ImplicitDiff: loss_steps reach step {max(self.loss_steps)} but "
                             f"the problem has steps={problem.steps}; use steps < "
                             f"{problem.steps}.")

    check_applicable = check  # its name before Method.check (2026-11-28)

    def objective(self, problem: InnerProblem, buffers: dict[str, Tensor]
                  ) -> Callable[[dict[str, Tensor], Tensor], Tensor]:
        """The training objective ``L(w, lam)`` whose stationary point the theorem is about:
        the mean training loss over ``loss_steps`` (running statistics at ``buffers``) plus
        the optimizer's penalty at the last step."""
        steps = self.loss_steps if self.loss_steps is not None else [problem.steps - 1]
        last = problem.steps - 1
        batches = {t: problem.batch(t) for t in steps}  # read once (a stream's run's batches)

        def loss(w: dict[str, Tensor], lm: Tensor) -> Tensor:
            total: Tensor | None = None
            for t in steps:
                lt = problem.train_objective(w, buffers, lm, t, batches[t])[0]
                total = lt if total is None else total + lt
            assert total is not None
            out = total / len(steps)
            pen = problem.optimizer.penalty(
                w, problem.hyperparams.values(lm, last, problem.steps))
            return out if pen is None else out + pen

        return loss

    def _diverging_fix(self, hvp: HVP, rhs: Tensor, info: dict[str, Any]) -> str | None:
        """For a stepped solver given an ``alpha`` whose residual grew past the right-hand
        side's (relative residual > 1: the iteration diverges), the fix with this Hessian's
        bound on ``alpha`` (``2 / lambda_max``, by power iteration): raising ``maxiter``, the
        usual advice, would only make it worse."""
        solver = self.solver
        if (not isinstance(solver, _Stepped) or solver.alpha is None
                or not info["residual"] > 1):
            return None
        try:
            _, lam_max = _power_alpha(hvp, rhs, solver.power_iters)
        except ValueError:
            return None
        return (f"the residual grew: alpha={solver.alpha:g} is too large for this Hessian, "
                f"whose largest eigenvalue is about {lam_max:.3g} ({solver.power_iters} power "
                f"iterations): {type(solver).__name__} converges only for alpha < 2 / lambda_max "
                f"= {2 / lam_max:.3g}. Give alpha=None (1 / lambda_max, estimated) or a smaller "
                f"alpha, or use CG(); more iterations would diverge further.")

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        """Train ``T`` plain steps, then :meth:`at_state`."""
        checked(type(self).__name__, problem, lam)
        self.check(problem)
        return self.at_state(problem, problem.run(lam), lam)

    def at_state(self, problem: InnerProblem, state: InnerState, lam: Tensor) -> HyperGradient:
        """The implicit hypergradient at ``state`` (taken as the inner optimum), e.g. a state
        you trained yourself. ``dE/dlam|direct - (d^2 L / dlam dw) H^{-1} grad_w E``."""
        checked(type(self).__name__, problem, lam)
        self.check(problem)
        w, b = state.params, state.buffers
        if self.loss_steps is not None and problem not in self._told:
            self._told.add(problem)
            why = uneven_coverage(problem, self.loss_steps)
            if why:
                warnings.warn(f"ImplicitDiff: {why}.", InnerNotConvergedWarning, stacklevel=2)
        loss = self.objective(problem, b)
        (dEw, _, dElam), value = grad_and_value(problem.objective, argnums=(0, 1, 2))(w, b, lam)
        with problem.second_order():
            gw, vjp_fn = vjp(lambda p, lm: grad(loss)(p, lm), w, lam)  # type: ignore[misc]
            w0 = problem.initial_state(lam).params
            g0 = grad(loss)(w0, lam)
        gn, gn0 = float(_flat(gw).norm()), float(_flat(g0).norm())
        ratio = gn / gn0 if gn0 > 0 else (0.0 if gn == 0 else math.inf)
        if ratio > self.grad_tol:
            batches = ""
            if self.loss_steps is None and _batches_change(problem):
                n = _epoch(problem)
                steps = (_last_epoch(problem, n) if n is not None else
                         f"range(T - T % n - n, T - T % n) with T = {problem.steps} and n "
                         f"batches per epoch")
                batches = (f" The training objective is the last step's mini-batch only "
                           f"(loss_steps=None) and the batches change from step to step: for "
                           f"mini-batch training give the steps of one whole epoch, e.g. "
                           f"ImplicitDiff(loss_steps={steps}), the last one.")
            warnings.warn(
                f"ImplicitDiff: the inner problem is not near a stationary point: "
                f"||grad_w L(w_T)|| = {gn:.3g} is {ratio:.3g} of its value at w_0 ({gn0:.3g}), "
                f"above grad_tol={self.grad_tol:g}. Implicit hypergradients assume an optimum "
                f"and can be wrong, even in sign.{batches}{_no_optimum(problem)} Train longer "
                f"(more steps, a larger learning rate), or use ForwardMode() / ReverseMode(), "
                f"which differentiate the steps actually run.", InnerNotConvergedWarning,
                stacklevel=2)

        def hvp(v: Tensor) -> Tensor:
            with problem.second_order():
                return _flat(vjp_fn(_unflat(v, w))[0])

        rhs = _flat(dEw).detach()
        x0 = self._last.get(problem) if self.warm_start else None
        if x0 is not None and x0.shape != rhs.shape:
            x0 = None
        v, info = self.solver.solve(hvp, rhs, x0)
        if self.warm_start:
            self._last[problem] = v.detach()
        if not info["converged"]:
            # a stepped solver on a singular Hessian keeps the right-hand side's part in the
            # null space as its residual, whatever maxiter: CG names that case
            other = ("" if isinstance(self.solver, CG) else
                     ", use CG() (it tells a singular or indefinite Hessian, where more "
                     "terms cannot help)")
            fix = (self._diverging_fix(hvp, rhs, info) or
                   f"Raise maxiter{other}, or check that the inner problem converged."
                   if "breakdown" not in info else
                   f"{info['breakdown']}: the Hessian of the training loss at w_T is not "
                   f"positive definite, so w_T is no minimum (a saddle, or not converged) and "
                   f"H v = grad_w E has no meaningful solution there. Train to a minimum (more "
                   f"steps, an L2 term), or use ForwardMode() / ReverseMode().")
            floor = 1e3 * torch.finfo(rhs.dtype).eps
            # a tol above the residual reached, rounded up to a power of ten
            res = info["residual"]
            up = 10 ** math.ceil(math.log10(2 * res)) if 0 < res < math.inf else 1e-5
            tol = f"{type(self.solver).__name__}(tol={up:g})"
            eps = torch.finfo(rhs.dtype).eps
            f64 = "" if rhs.dtype == torch.float64 else ", or train in float64"
            singular = info.get("breakdown_rounding") and res > math.sqrt(eps)
            if singular:
                # an over-parameterised least squares without L2 (float64): CG's later steps
                # along zero curvature put 4e17 into a hypergradient of 0.27
                fix = (f"{info['breakdown']}, which is zero at {rhs.dtype}'s rounding level, "
                       f"with {res:.3g} of grad_w E left: the Hessian of the training loss is "
                       f"singular (no curvature in some directions: more parameters than the "
                       f"loss constrains, e.g. more than training examples, and no L2 term) and "
                       f"grad_w E has a part there, so H v = grad_w E has no solution and this "
                       f"hypergradient is not the implicit one. Add an L2 term on every "
                       f"parameter (a penalty in train_loss or the optimizer's weight_decay), "
                       f"or use ForwardMode() / ReverseMode(), which differentiate the steps "
                       f"actually run.")
                if res > max(1e-2, math.sqrt(eps)):  # not rounding in any dtype: no answer
                    raise ValueError(f"ImplicitDiff: {self.solver!r} stopped after "
                                     f"{info['iterations']} iterations on {fix}")
            elif info.get("breakdown_rounding"):
                # measured in float32 (digits, a linear softmax model): CG stopped at 1.4e-4,
                # the hypergradient equal to float64's to 4 digits
                fix = (f"{info['breakdown']}, which is zero at {rhs.dtype}'s rounding level "
                       f"(the Hessian is singular in some direction, e.g. a shift of all of "
                       f"softmax's biases, and {rhs.dtype} cannot resolve it): the solve is as "
                       f"accurate as {rhs.dtype} allows. Give a tol above that residual for a "
                       f"{rhs.dtype} problem, e.g. {tol}, or an L2 term on every parameter{f64}.")
            elif "breakdown" not in info and info["residual"] <= floor:
                # measured: float32 CG stopped at 3.6e-7 with the hypergradient 2e-7 off float64
                fix = (f"that is {rhs.dtype}'s rounding level (below {floor:.1g}): the solve is "
                       f"as accurate as {rhs.dtype} allows. Give a tol above it for a "
                       f"{rhs.dtype} problem, e.g. {tol}{f64}.")
            warnings.warn(
                f"ImplicitDiff: {self.solver!r} stopped at relative residual "
                f"{info['residual']:.3g} > tol={self.solver.tol:g} after {info['iterations']} "
                f"iterations; {fix}", SolverNotConvergedWarning, stacklevel=2)
        with problem.second_order():
            cross = vjp_fn(_unflat(v, w))[1]
        info.update(grad_norm=gn, grad_norm_ratio=ratio)
        return HyperGradient(value.detach(), (dElam - cross).detach(), state, info)

    def fingerprint(self) -> dict[str, Any]:
        """The solver and the training objective (an approximation: a resume must keep them)."""
        return {"method": "implicit", "method.solver": repr(self.solver),
                "method.loss_steps": self.loss_steps}

    def estimate_memory(self, problem: InnerProblem,
                        sizes: Sizes | None = None) -> MemoryEstimate:
        """``|s| + 6 |w| + n_L h``: the trained state, the solver's vectors, and for each of the
        ``n_L`` loss steps the retained graph of its gradient with one Hessian-vector product
        (``h``: :class:`~hypergrad.hvp.VmapVJP`'s call on one column, counted on fake tensors:
        :meth:`Sizes.hvp`), or the validation loss's gradient where it is larger
        (:meth:`Sizes.objective`)."""
        sz = Sizes.of(problem) if sizes is None else sizes
        n_l = 1 if self.loss_steps is None else len(self.loss_steps)
        held = sz.state + 6 * sz.params
        total = held + max(sz.hvp(VmapVJP(), 1)[1] * n_l, sz.objective())
        return MemoryEstimate(self.name, total, sz.state, sz.activations, 0,
                              total - held - sz.activations)

    def __repr__(self) -> str:
        return (f"ImplicitDiff(solver={self.solver!r}, loss_steps={self.loss_steps!r}, "
                f"grad_tol={self.grad_tol:g})")
