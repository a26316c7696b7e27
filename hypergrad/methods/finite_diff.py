"""Central finite differences over the same inner loop: the check every AD path is held to.

The step is scaled per hyperparameter (``eps * max(1, |lam_k|)`` in raw space), and
:meth:`FiniteDifference.estimate` also says how far to trust the result: it takes central
differences at two steps ``h`` and ``h / 2``, extrapolates (Richardson: the ``O(h^2)`` term
cancels) and reports the disagreement of the two as the estimate's error, plus the rounding
error ``~ 1e-16 |E| / h``. Where the objective is smooth at the scale of ``h`` the error estimate
is tiny and the check is sharp; where it is rough in a hyperparameter (ReLU and max-pool kinks
crossed within ``h``, as in a ResNet's loss as a function of its learning rate) the two steps
disagree, the error estimate is large, and :func:`~hypergrad.testing.hypergradcheck` reports
finite differences as unreliable for that group instead of failing on them.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..errors import PrecisionWarning, flag, is_real
from ..hyperparams import HyperParams
from ..problem import InnerProblem
from .base import HyperGradient, Method, checked

__all__ = ["FiniteDifference", "FDEstimate"]


class FDEstimate(NamedTuple):
    """A finite-difference hypergradient with its own error estimate.

    value: ``E(w_T)`` at ``lam``. grad: the extrapolated estimate of ``dE/dlam``, shape ``(K,)``.
    error: estimated absolute error per coordinate, shape ``(K,)``. step: the step ``h`` per
    coordinate (raw space).
    """

    value: Tensor
    grad: Tensor
    error: Tensor
    step: Tensor


class FiniteDifference(Method, name="finite_difference"):
    """``dE/dlam_k ~ (E(lam + h_k e_k) - E(lam - h_k e_k)) / (2 h_k)``: 2K inner runs.

    Args:
        eps: base step in raw (unconstrained) space. In float64, 1e-5 balances truncation
            (``O(h^2)``) and rounding (``O(1e-16 / h)``) errors.
        relative: scale the step with the raw value, ``h_k = eps * max(1, |lam_k|)`` (default);
            ``False`` uses ``h_k = eps`` for every coordinate. A hyperparameter without a
            transform (``transform="identity"``: the raw value is the value) whose value is
            small, ``0 < |lam_k| < 0.01``, gets ``h_k = 100 eps |lam_k|`` instead (at most 1 %
            of the value for ``eps <= 1e-4``): with ``eps`` itself, Adam's ``eps=1e-8`` was
            stepped to ``-1e-5``, a run outside its domain, and the difference was 150 % off.

    :meth:`hypergradient` takes one central difference per coordinate; :meth:`estimate` takes
    two (``h`` and ``h / 2``, 4K runs) and returns the extrapolated value with an error
    estimate. All runs of one call read the same batches: a streamed source (a DataLoader)
    reads one pass again for each (:meth:`InnerProblem.fixed_pass
    <hypergrad.InnerProblem.fixed_pass>`).
    """

    def __init__(self, eps: float = 1e-5, relative: bool = True) -> None:
        if (not is_real(eps)
                or not float(eps) > 0 or not math.isfinite(float(eps))):  # inf: a zero gradient
            raise ValueError(f"FiniteDifference: eps={eps!r} must be a finite number > 0, e.g. "
                             f"1e-5 in float64.")
        self.eps = float(eps)
        self.relative = flag("FiniteDifference", "relative", relative)
        self._warned = False  # the float32 warning, once per instance

    def steps_for(self, lam: Tensor, hyperparams: HyperParams | None = None) -> Tensor:
        """The step ``h_k`` per coordinate, shape ``(K,)``. With ``hyperparams`` (the
        problem's), identity-transformed coordinates with a small value get a step relative
        to it (see ``relative``)."""
        h = torch.full_like(lam, self.eps)
        if not self.relative:
            return h
        scale = lam.abs().clamp_min(1.0)
        if hyperparams is not None:
            ident = torch.zeros(lam.shape, dtype=torch.bool, device=lam.device)
            for item, sl in zip(hyperparams.items, hyperparams.slices.values()):
                if item.transform == "identity":
                    ident[sl] = True
            small = ident & (lam != 0) & (lam.abs() < 0.01)
            scale = torch.where(small, 100 * lam.abs(), scale)
        return h * scale

    def objective_at(self, problem: InnerProblem, lam: Tensor) -> Tensor:
        s = problem.run(lam)
        with torch.no_grad():
            return problem.objective(s.params, s.buffers, lam)

    def _central(self, problem: InnerProblem, lam: Tensor, h: Tensor,
                 value: Tensor | None = None) -> Tensor:
        """Central differences; where one side leaves the domain of the optimizer argument
        reading it (an identity weight decay starting at 0: its step to -h was refused, so
        finite differences and hypergradcheck could not run), the second-order one-sided
        difference on the other side, ``(-3 E(0) + 4 E(h) - E(2h)) / 2h`` (the same order of
        error)."""
        out = torch.zeros_like(lam)
        for k in range(lam.shape[0]):
            e = torch.zeros_like(lam)
            e[k] = h[k]
            up, down = lam + e, lam - e
            side = 0 if not problem.outside_domains(down) else 1
            if side == 0 and problem.outside_domains(up):
                side = -1
            if side == 0:
                # the step actually taken: lam_k +- h_k rounds to the dtype's grid (in float32
                # the rounding of log(0.1) +- 2.3e-5 alone put 0.4 % into 2 h)
                out[k] = (self.objective_at(problem, up)
                          - self.objective_at(problem, down)) / (up[k] - down[k])
                continue
            if value is None:
                value = self.objective_at(problem, lam)
            one, two = lam + side * e, lam + 2 * side * e
            # (two - lam)_k = 2 side h_k carries the sign of the side taken
            out[k] = (-3 * value + 4 * self.objective_at(problem, one)
                      - self.objective_at(problem, two)) / (two[k] - lam[k])
        return out

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        checked(type(self).__name__, problem, lam)
        lam = lam.detach()  # a lam that requires grad gave a hypergradient that did too,
        # keeping a graph alive (every other method returns a plain tensor)
        if lam.dtype != torch.float64 and not self._warned:
            self._warned = True
            rounding = float(torch.finfo(lam.dtype).eps) / self.eps
            warnings.warn(PrecisionWarning(
                f"FiniteDifference: a central difference of a {lam.dtype} problem carries a "
                f"rounding error of about {rounding:.0e} relative to the loss at "
                f"eps={self.eps:g} (machine epsilon / eps; measured 10 % off on a digits "
                f"MLP). For a check, train in float64 (model.double() and the data); "
                f"FiniteDifference().estimate(problem, lam) gives the error estimate."),
                stacklevel=2)
        with problem.fixed_pass():  # all 2K + 1 runs read the same batches
            state = problem.run(lam)
            with torch.no_grad():
                value = problem.objective(state.params, state.buffers, lam)
            h = self.steps_for(lam, problem.hyperparams)
            return HyperGradient(value, self._central(problem, lam, h, value), state)

    def estimate(self, problem: InnerProblem, lam: Tensor) -> FDEstimate:
        """Central differences at ``h`` and ``h / 2``, Richardson-extrapolated, with an error
        estimate per coordinate: ``|D(h/2) - D(h)|`` (the disagreement of the two steps: about
        the truncation error where the objective is smooth, large where it is rough at that
        scale) plus the rounding error ``4 eps_dtype |E| / h``."""
        checked(type(self).__name__, problem, lam)
        lam = lam.detach()
        with problem.fixed_pass():  # all 4K + 1 runs read the same batches
            state = problem.run(lam)
            with torch.no_grad():
                value = problem.objective(state.params, state.buffers, lam)
            h = self.steps_for(lam, problem.hyperparams)
            d1 = self._central(problem, lam, h, value)
            d2 = self._central(problem, lam, h / 2, value)
        rich = d2 + (d2 - d1) / 3
        rounding = 4 * torch.finfo(lam.dtype).eps * value.abs() / (h / 2)
        return FDEstimate(value, rich, (d2 - d1).abs() + rounding, h)

    def fingerprint(self) -> dict[str, Any]:
        """The step size (an approximation: a resume must keep it)."""
        return {"method": "finite_difference", "method.eps": self.eps,
                "method.relative": self.relative}

    def __repr__(self) -> str:
        return f"FiniteDifference(eps={self.eps}, relative={self.relative})"

