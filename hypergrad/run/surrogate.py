"""A surrogate model of the validation loss that uses the hypergradients (issue 27).

:class:`Surrogate` is an outer optimizer for the offline Trainer at small K: a Gaussian process
over the search box fitted to every evaluation's validation loss **and to every hypergradient**
(gradient observations: one hypergradient tells the model K slopes where a black-box tuner sees
one value), whose expected improvement chooses the plain runs between hypergradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .outer import SearchOptimizer

__all__ = ["Surrogate", "GradientGP", "GRAD_NOISE", "ROUGH_SHARE", "MAX_ROWS", "MAX_VALUES"]

LENGTHSCALES = (0.05, 0.1, 0.2, 0.4, 0.8)
"""Isotropic length scales (in units of the box) the model chooses among, by marginal
likelihood."""

GRAD_NOISE = (0.0, 0.1, 1.0, 10.0, 100.0, 10_000.0)
"""The gradient observations' noise variances the model chooses among (with the length scale,
by marginal likelihood), each a share of the kernel's prior variance of a slope at that length
scale: 0 takes the hypergradients as the slopes of the function the values sample; a larger
share lets the values speak where the hypergradients do not describe them. Where the validation
loss is rough in the hyperparameters at the scale of the box (a long unrolled run: the
long-horizon language model's hypergradients are a hundred times its slope over a tenth of a
factor, ``experiments/lm_roughness.py``), exact hypergradients describe ripples the values
between points do not show, and a model bound to them forgets the values."""

MAX_ROWS = 512
"""The most rows (a value each, K per hypergradient) of the model's kernel matrix: a model of
every observation grew by K rows per outer step and cost O((steps K)^3) per proposal (30
factorisations of it, three proposals a step): 7.5 s per outer step at K = 64 after 25 steps,
where a step's runs took 0.1 s. Past it, the hypergradients of the points with the lowest
losses are kept (at least one)."""

MAX_VALUES = 256
"""The most values the model is fitted to: past it, the half with the lowest losses and the
most recent others."""

ROUGH_SHARE = 100.0
"""A chosen gradient noise share from which the Trainer says, once, that the hypergradients do
not describe the losses between the points."""


class GradientGP:
    """A Gaussian process with a squared-exponential kernel on ``[0, 1]^K`` conditioned on values
    ``f(u_i)`` and on gradients ``df/du`` at some of the points (float64). ``fit`` chooses the
    length scale among :data:`LENGTHSCALES` by the marginal likelihood; ``predict`` gives the
    posterior mean and standard deviation of ``f`` (in the values' units)."""

    def __init__(self, noise: float = 1e-4, grad_noise: tuple[float, ...] = GRAD_NOISE
                 ) -> None:
        if not grad_noise or any(not r >= 0 for r in grad_noise):
            raise ValueError(f"GradientGP: grad_noise={grad_noise!r} must be shares >= 0 of "
                             f"the slope's prior variance, at least one, e.g. (0.0, 1.0).")
        self.noise = noise
        self.grad_noise = tuple(float(r) for r in grad_noise)

    def _blocks(self, a: Tensor, b: Tensor, ell: float, ga: Tensor, gb: Tensor) -> Tensor:
        """The joint covariance of ``[f(a), df/du(a[ga])]`` and ``[f(b), df/du(b[gb])]``."""
        lam = 1.0 / ell ** 2
        r = a[:, None, :] - b[None, :, :]  # (n, m, K)
        k = torch.exp(-0.5 * lam * r.pow(2).sum(-1))  # (n, m)
        K = a.shape[1]
        # cov(f(a), d f(b) / d b_j) = k lam r_j ; cov(d f(a)/d a_i, f(b)) = -k lam r_i
        # (the rows and columns of the gradients alone: the whole (n, m, K) product, then cut,
        # was most of a proposal's time against many candidates)
        fg = (k[:, gb, None] * lam * r[:, gb, :]).reshape(len(a), -1)
        gf = (-k[ga, :, None] * lam * r[ga, :, :]).permute(0, 2, 1).reshape(-1, len(b))
        rr = r[ga][:, gb]  # (na, nb, K)
        gg = k[ga][:, gb][:, :, None, None] * (
            lam * torch.eye(K, dtype=a.dtype)[None, None] - lam ** 2 * rr[..., :, None]
            * rr[..., None, :])  # (na, nb, K, K)
        gg = gg.permute(0, 2, 1, 3).reshape(len(ga) * K, len(gb) * K)
        top = torch.cat([k, fg], 1)
        bottom = torch.cat([gf, gg], 1)
        return torch.cat([top, bottom], 0)

    def fit(self, u: Tensor, f: Tensor, grad_idx: Tensor, grads: Tensor) -> GradientGP:
        """Condition on values ``f`` at ``u`` (``inf``: a diverged run, modelled as the worst
        value) and gradients ``grads`` at ``u[grad_idx]``. The model is of ``log(f - min f +
        delta)`` (``delta`` the values' median above their minimum): the losses of
        points where training blows up are orders of magnitude above the rest and would
        flatten a model of ``f`` itself; the gradients are transformed by the chain rule.
        The length scale (:data:`LENGTHSCALES`) and the gradients' noise (``grad_noise``) are
        chosen together by the marginal likelihood (``ell``, ``grad_share``)."""
        self.u, self.gi = u, grad_idx
        finite = f[torch.isfinite(f)]
        low = float(finite.min()) if len(finite) else 0.0
        worst = float(finite.max()) if len(finite) else 0.0
        f = torch.where(torch.isfinite(f), f, torch.full_like(f, worst))
        self.shift = low - max(float(finite.median()) - low, 1e-12) if len(finite) \
            else -1.0
        w = torch.log(f - self.shift)
        gw = grads / (f[grad_idx] - self.shift)[:, None]
        self.mean = float(w.mean())
        self.scale = float(w.std()) if len(w) > 1 else 1.0
        if not self.scale > 0:
            self.scale = 1.0
        fy = (w - self.mean) / self.scale
        gy = (gw / self.scale).reshape(-1)
        y = torch.cat([fy, gy])
        best: tuple[float, Any] | None = None
        n = len(u)
        shares = self.grad_noise if len(grad_idx) else self.grad_noise[:1]
        for ell in LENGTHSCALES:
            C0 = self._blocks(u, u, ell, grad_idx, grad_idx)
            for share in shares:
                jitter = torch.full((len(C0),), self.noise, dtype=C0.dtype)
                jitter[n:] += share / ell ** 2  # a slope's prior variance is 1 / ell^2
                L, info = torch.linalg.cholesky_ex(C0 + torch.diag(jitter))
                if int(info) != 0:
                    continue
                alpha = torch.cholesky_solve(y[:, None], L)[:, 0]
                nll = 0.5 * float(y @ alpha) + float(torch.log(torch.diagonal(L)).sum())
                if best is None or nll < best[0]:
                    best = (nll, (ell, share, L, alpha))
        if best is None:
            raise RuntimeError("GradientGP: no length scale gave a positive definite kernel")
        self.ell, self.grad_share, self.L, self.alpha = best[1]
        return self

    def warp(self, f: float) -> float:
        """A loss in the model's units (``log(f - shift)``, before standardising)."""
        return math.log(f - self.shift)

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior mean and standard deviation at ``x`` in the model's units (see
        :meth:`warp`)."""
        empty = torch.zeros(0, dtype=torch.long)
        Ks = self._blocks(x, self.u, self.ell, empty, self.gi)  # (m, n + ng K)
        mu = Ks @ self.alpha
        v = torch.cholesky_solve(Ks.T, self.L)
        var = (1.0 - (Ks * v.T).sum(1)).clamp_min(1e-12)
        return self.mean + self.scale * mu, self.scale * var.sqrt()


def _key(x: Tensor) -> bytes:
    """A point's float64 coordinates as bytes, equal exactly where the points are (``+ 0.0``
    makes -0.0 into 0.0)."""
    return (x.detach().double().contiguous() + 0.0).numpy().tobytes()


def expected_improvement(mu: Tensor, sd: Tensor, best: float) -> Tensor:
    z = (best - mu) / sd
    normal = torch.distributions.Normal(0.0, 1.0)
    return (best - mu) * normal.cdf(z) + sd * torch.exp(normal.log_prob(z))


class Surrogate(SearchOptimizer):
    """The outer optimizer of a surrogate model: at every outer step, the hypergradient at the
    current point joins a :class:`GradientGP` of the validation loss over the box (with every
    plain run the Trainer made: start, earlier trials, restarts), and ``trials`` plain runs go
    to the points of highest expected improvement (among quasi-random points of the box and
    perturbations of the best points); the next hypergradient is taken at the best point
    evaluated that has none yet. Works in the search ``box`` (the Trainer gives it its own
    when ``box`` is not given) and calls the Trainer's plain runs; the Trainer calls
    :meth:`observe` for every plain run, so the start's points and the restarts join the
    model. The Trainer's offline default for 16 <= K <= 100
    (:data:`~hypergrad.run.outer.SURROGATE_K`); elsewhere ``outer=functools.partial(Surrogate)``.

    Args:
        box: ``(low, high)`` raw-coordinate tensors of the search box (the Trainer's
            :attr:`~hypergrad.Trainer.box`, from ``Guards(bounds=...)``, where not given).
        trials: plain runs per outer step, at the points of highest expected improvement.
        candidates: the points scored per proposal (quasi-random in the box, and
            perturbations of the best points).
        seed: the candidate generator's seed (``None``: the Trainer seeds it with the
            problem's seed).
        grad_noise: the shares of gradient noise the model chooses among
            (:data:`GRAD_NOISE`; ``(0.0,)`` takes the hypergradients as exact slopes).

    Example:
        >>> trainer = Trainer(problem, outer=functools.partial(Surrogate),
        ...                   guards=Guards(bounds={"lr": (1e-3, 1.0)},
        ...                                 time_budget=30))  # doctest: +SKIP
    """

    def __init__(self, params: Any, box: tuple[Tensor, Tensor] | None = None, trials: int = 3,
                 candidates: int = 512, seed: int | None = None,
                 grad_noise: tuple[float, ...] = GRAD_NOISE) -> None:
        if trials < 1 or candidates < 1:
            raise ValueError(f"Surrogate: trials={trials!r} and candidates={candidates!r} must "
                             f"be >= 1.")
        GradientGP(grad_noise=grad_noise)  # checked here, not at the first proposal
        super().__init__(params, dict(trials=trials, candidates=candidates), box=box)
        self.n_trials, self.candidates = trials, candidates
        self.grad_noise = tuple(grad_noise)
        """The gradients' noise shares the model chooses among (:data:`GRAD_NOISE`; ``(0.0,)``:
        the hypergradients taken as exact slopes, the default before 2026-11-29)."""
        self.seed = seed
        """The candidate generator's seed; ``None``: the Trainer seeds it with the problem's
        seed (as its quasi-random start), so that every training seed draws its own points
        (standalone: 0)."""
        self.gen = torch.Generator().manual_seed(0 if seed is None else seed)
        self.xs: list[Tensor] = []  # points in box units
        self.last_fit: tuple[float, float] | None = None
        """The last model's ``(length scale, gradient noise share)``: a share of 100 or more
        says the hypergradients did not describe the losses between the points."""
        self.fs: list[float] = []
        self.grads: dict[int, Tensor] = {}  # index -> gradient in box units

    def resume_settings(self) -> dict[str, Any]:
        """The seed and the gradients' noise shares (see
        :meth:`SearchOptimizer.resume_settings`)."""
        return {"seed": self.seed, "grad_noise": self.grad_noise}

    def seed_with(self, seed: int) -> None:
        """Seed the candidate generator (the Trainer's call where ``seed`` was not given)."""
        self.seed = int(seed)
        self.gen.manual_seed(self.seed)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state and the model's observations (points, losses, gradients)
        and candidate generator, so that a resumed run goes on with the same model."""
        sd = super().state_dict()
        sd["surrogate"] = {"xs": [x.clone() for x in self.xs], "fs": list(self.fs),
                           "grads": {i: g.clone() for i, g in self.grads.items()},
                           "gen": self.gen.get_state()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd = dict(state_dict)
        extra = sd.pop("surrogate", None)
        super().load_state_dict(sd)
        if extra is not None:  # the model lives on the CPU (a checkpoint loaded to CUDA)
            self.xs = [x.detach().cpu().clone() for x in extra["xs"]]
            self.fs = [float(f) for f in extra["fs"]]
            self.grads = {int(i): g.detach().cpu().clone() for i, g in extra["grads"].items()}
            self.gen.set_state(extra["gen"].cpu())

    def _unit(self, x: Tensor) -> Tensor:
        if self.box is None:
            raise ValueError("Surrogate: it needs the search box; the Trainer gives it its box "
                             "(outer=functools.partial(Surrogate)), or pass box=(low, high).")
        lo, hi = self.box
        # the model and its candidates on the CPU, whatever the problem's device (a box and
        # points on CUDA met its CPU-made tensors: a device mismatch at the first fit)
        x, lo, hi = x.detach().double().cpu(), lo.double().cpu(), hi.double().cpu()
        return (x - lo) / (hi - lo).clamp_min(1e-12)

    def _raw(self, u: Tensor, like: Tensor) -> Tensor:
        lo, hi = self.box  # type: ignore[misc]
        lo, hi = lo.double().cpu(), hi.double().cpu()
        return (lo + u.cpu() * (hi - lo)).to(like)

    def observe(self, x: Tensor, value: float, grad: Tensor | None = None) -> None:
        """One evaluation: the validation loss at raw ``x`` (and its hypergradient)."""
        u = self._unit(x)
        v = value if math.isfinite(value) else math.inf
        for i, xu in enumerate(self.xs):
            if torch.equal(xu, u):  # evaluated there already: the same loss (one seed)
                if grad is not None and i not in self.grads:
                    self.grads[i] = self._grad_unit(grad)
                return
        self.xs.append(u)
        self.fs.append(v)
        if grad is not None:
            self.grads[len(self.xs) - 1] = self._grad_unit(grad)

    def _grad_unit(self, g: Tensor) -> Tensor:
        lo, hi = self.box  # type: ignore[misc]
        return g.detach().double().cpu() * (hi - lo).double().cpu()

    def _candidates(self) -> Tensor:
        K = self.xs[0].numel()
        n = self.candidates
        sobol = torch.quasirandom.SobolEngine(K, scramble=True,
                                              seed=int(torch.randint(0, 2**31 - 1, (1,),
                                                                     generator=self.gen)))
        glob = sobol.draw(n, dtype=torch.float64)
        order = sorted(range(len(self.fs)), key=self.fs.__getitem__)[:5]
        centres = torch.stack([self.xs[i] for i in order])
        pick = torch.randint(0, len(centres), (n,), generator=self.gen)
        scale = torch.tensor([0.02, 0.05, 0.15], dtype=torch.float64)[
            torch.randint(0, 3, (n,), generator=self.gen)]
        local = centres[pick] + scale[:, None] * torch.randn(n, K, generator=self.gen,
                                                               dtype=torch.float64)
        return torch.cat([glob, local.clamp(0.0, 1.0)])

    def _kept(self) -> tuple[list[int], list[int]]:
        """The observations the model is fitted to: the points whose values it takes and,
        among them, those whose hypergradients it takes, in the order observed (all of them
        within :data:`MAX_VALUES` and :data:`MAX_ROWS`)."""
        n, K = len(self.xs), self.xs[0].numel()
        by_loss = sorted(range(n), key=self.fs.__getitem__)
        points = list(range(n))
        if n > MAX_VALUES:
            keep = set(by_loss[:MAX_VALUES // 2])
            for i in reversed(range(n)):  # the most recent others
                if len(keep) >= MAX_VALUES:
                    break
                keep.add(i)
            points = sorted(keep)
        grads = sorted(i for i in points if i in self.grads)
        if len(points) + K * len(grads) > MAX_ROWS:
            room = max((MAX_ROWS - len(points)) // K, 1)
            kept = set(points)
            grads = sorted([i for i in by_loss if i in self.grads and i in kept][:room])
        return points, grads

    def propose(self) -> Tensor:
        """The candidate of highest expected improvement (box units)."""
        points, grads = self._kept()
        where = {i: j for j, i in enumerate(points)}
        u = torch.stack([self.xs[i] for i in points])
        f = torch.tensor([self.fs[i] for i in points], dtype=torch.float64)
        gi = torch.tensor([where[i] for i in grads], dtype=torch.long)
        g = (torch.stack([self.grads[i] for i in grads]) if grads
             else torch.zeros(0, u.shape[1], dtype=torch.float64))
        gp = GradientGP(grad_noise=self.grad_noise).fit(u, f, gi, g)
        self.last_fit = (gp.ell, gp.grad_share)
        cand = self._candidates()
        # not a point evaluated already (a local candidate clamped onto the box's edge): one
        # training seed gives it the same loss again, a plain run spent for nothing
        # (by their bytes: comparing every candidate with every point took candidates x
        # points x K booleans, 100 MB per proposal after 400 points at K = 64)
        seen = {_key(x) for x in self.xs}
        new = torch.tensor([_key(c) not in seen for c in cand])
        cand = cand[new] if bool(new.any()) else cand
        mu, sd = gp.predict(cand)
        ei = expected_improvement(mu, sd, gp.warp(float(f[torch.isfinite(f)].min())))
        return cand[int(torch.argmax(ei))]

    def next_point(self, like: Tensor) -> Tensor | None:
        """The next point worth a plain run (:meth:`propose`), in raw coordinates like
        ``like`` (the Trainer's leftover time goes to these)."""
        return self._project(self._raw(self.propose(), like))

    @torch.no_grad()
    def step(self, closure: Callable[[], float | None] | None = None  # type: ignore[override]
             ) -> None:
        group = self.param_groups[0]
        (p,) = [q for q in group["params"] if q.grad is not None] or [None]
        if p is None:
            return
        self.trials, self.improved, self.stalled = 0, False, False
        x0 = p.detach().clone()
        value = self.value
        if value is not None:
            self.observe(x0, value, p.grad)
        if closure is None or value is None:
            return
        for _ in range(self.n_trials):
            u = self.propose()
            p.copy_(self._project(self._raw(u, p)))
            self.trials += 1
            if closure() is None:  # out of time (the Trainer observed the run otherwise)
                break
        # the next hypergradient: at the best point evaluated that has none yet
        free = [i for i in range(len(self.xs)) if i not in self.grads
                and math.isfinite(self.fs[i])]
        if not free:
            p.copy_(x0)
            self.stalled = True
            return
        i = min(free, key=self.fs.__getitem__)
        p.copy_(self._project(self._raw(self.xs[i], p)))
        self.improved = self.fs[i] < value
        if self.improved:
            self.value = self.fs[i]
