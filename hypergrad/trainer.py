"""The outer loop: tune hyperparameters by their hypergradients, offline or online.

- Offline (forward-mode HO, Franceschi et al. 2017): every outer step trains ``T`` inner steps from
  the initial state, takes ``dE/dlam`` at step ``T`` and updates ``lam`` with an outer optimizer.
- Online (RTHO, same paper): one training run; every ``interval`` inner steps ``lam`` is updated
  from the current tangents and training goes on (tangents optionally reset: truncation).

The Trainer is the only stateful object: it holds ``lam``, the outer optimizer and, online, the
inner state and tangents. Everything needed to resume is checkpointed atomically.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from .forward import ForwardMode, ForwardState
from .hvp import STRATEGIES, VmapVJP
from .hyperparams import TRANSFORMS
from .method import Method
from .problem import InnerProblem, InnerState
from .reverse import ReverseMode

__all__ = ["Trainer", "TrainResult", "SignDescent", "choose_method", "OuterOptimizerFactory"]

OuterOptimizerFactory = Callable[[list[Tensor]], torch.optim.Optimizer]
Evaluate = Callable[[InnerState], Mapping[str, float]]


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


def _state_bytes(problem: InnerProblem) -> int:
    leaves, _ = tree_flatten(problem.initial_state())
    return sum(x.numel() * x.element_size() for x in leaves)


def choose_method(problem: InnerProblem, mode: str = "offline",
                  memory_budget: float = 4 * 2**30) -> tuple[str, str]:
    """Pick ``"forward"`` or ``"reverse"`` from K, T and a memory estimate; returns the name and
    the reason in words.

    Per inner step, forward mode costs about ``1 + 2K`` gradient-equivalents with memory
    ``(K + 1) |s|``; unrolled reverse about 4 with memory ``(T + 1) |s|`` (DESIGN.md). Online
    tuning needs hypergradients during the run, which only forward mode gives.
    """
    k, t, s = problem.num_hyperparams, problem.steps, _state_bytes(problem)
    fwd_mem, rev_mem = (k + 1) * s, (t + 1) * s
    gib = 2**30
    if mode == "online":
        return "forward", "online tuning needs hypergradients during training (forward mode)"
    if rev_mem > memory_budget:
        return "forward", (f"reverse mode would store {t + 1} states = {rev_mem / gib:.2f} GiB > "
                           f"budget {memory_budget / gib:.2f} GiB; forward needs "
                           f"{fwd_mem / gib:.3f} GiB")
    if 1 + 2 * k <= 4:
        return "forward", (f"K={k}: forward costs ~{1 + 2 * k} gradients per step vs ~4 for "
                           f"reverse, and memory independent of T")
    return "reverse", (f"K={k}: forward would cost ~{1 + 2 * k} gradients per step vs ~4 for "
                       f"reverse; reverse fits: {rev_mem / gib:.3f} GiB for T={t}")


def make_method(name: str = "forward", hvp: str = "vmap_vjp", chunk_size: int | None = None,
                memory_budget_gb: float | None = None, compile: bool = False) -> Method | str:
    """A method by name (``"auto"`` is resolved by the Trainer), for configs.

    ``chunk_size`` / ``memory_budget_gb`` set the HVP strategy's chunking (default: automatic
    from :data:`hypergrad.hvp.DEFAULT_MEMORY_BUDGET`); ``compile`` runs ``VmapVJP`` through
    ``torch.compile`` (opt-in, see BENCHMARKS.md)."""
    name, hvp = getattr(name, "value", name), getattr(hvp, "value", hvp)  # config enums
    if name == "auto":
        return "auto"
    if name == "reverse":
        return ReverseMode()
    if name == "forward":
        if hvp not in STRATEGIES:
            raise ValueError(f"make_method: hvp={hvp!r}; choose one of {sorted(STRATEGIES)}.")
        if compile and hvp != "vmap_vjp":
            raise ValueError(f"make_method: compile=True needs hvp='vmap_vjp', got hvp={hvp!r}.")
        if memory_budget_gb is not None and not memory_budget_gb > 0:
            raise ValueError(f"make_method: memory_budget_gb={memory_budget_gb!r} must be > 0 "
                             f"(GiB), or null for the default.")
        cls = STRATEGIES[hvp]
        budget = None if memory_budget_gb is None else memory_budget_gb * 2**30
        if hvp == "loop":
            return ForwardMode(cls())
        if compile:
            return ForwardMode(VmapVJP(chunk_size=chunk_size, memory_budget=budget, compile=True))
        return ForwardMode(cls(chunk_size=chunk_size, memory_budget=budget))
    raise ValueError(f"make_method: name={name!r}; choose 'forward', 'reverse' or 'auto'.")


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns. ``values``: learned hyperparameters (transformed)."""

    lam: Tensor
    values: dict[str, Any]
    history: list[dict[str, Any]]
    method: str
    diverged: bool = False
    message: str = ""
    state: InnerState | None = field(default=None, repr=False)


class Trainer:
    """Tune ``problem``'s hyperparameters by gradient descent on ``E``.

    Args:
        problem: the :class:`InnerProblem`.
        method: a :class:`Method` (``ForwardMode(...)``, ``ReverseMode()``), ``"forward"``,
            ``"reverse"`` or ``"auto"`` (chosen by :func:`choose_method`, reason logged).
        outer_optimizer: a factory ``params -> torch.optim.Optimizer`` over the raw
            hyperparameters, e.g. ``functools.partial(torch.optim.Adam, lr=0.05)`` or
            ``SignDescent``; default Adam with lr 0.05.
        outer_steps: offline: hyperparameter updates (each a full inner run of ``T`` steps).
        mode: ``"offline"`` or ``"online"`` (RTHO: update every ``interval`` inner steps of one
            run; ``reset_tangents`` sets ``Z = 0`` after each update, i.e. truncation).
        clip_norm: clip the hypergradient to this norm (``None``: no clipping).
        bounds: ``{name: (low, high)}`` in *value* space; ``lam`` is projected into them after
            every update (e.g. per-example weights in ``[0, 1]``, a learning rate ``<= 1``).
        run_dir: where ``metrics.jsonl`` and ``checkpoint.pt`` go (``None``: nothing written).
        resume: continue from ``run_dir/checkpoint.pt`` if it exists.
        evaluate: ``state -> {metric: float}`` logged after each outer step (e.g. test accuracy).
        progress: tqdm bars for outer and inner loops.
        tensorboard: also log scalars to ``run_dir/tb`` (needs the ``tensorboard`` package).
        memory_budget: bytes, for ``method="auto"``.
        log: where messages go (default ``print``).
    """

    def __init__(self, problem: InnerProblem, method: Method | str = "forward",
                 outer_optimizer: OuterOptimizerFactory | None = None, outer_steps: int = 10,
                 mode: str = "offline", interval: int = 10, reset_tangents: bool = False,
                 clip_norm: float | None = None,
                 bounds: Mapping[str, Sequence[float | None]] | None = None,
                 run_dir: str | os.PathLike[str] | None = None, resume: bool = False,
                 evaluate: Evaluate | None = None, progress: bool = True,
                 tensorboard: bool = False, memory_budget: float = 4 * 2**30,
                 log: Callable[[str], None] = print) -> None:
        if mode not in ("offline", "online"):
            raise ValueError(f"Trainer: mode={mode!r}; use 'offline' or 'online'.")
        if isinstance(outer_steps, bool) or not isinstance(outer_steps, int) or outer_steps < 0:
            raise ValueError(f"Trainer: outer_steps={outer_steps!r} must be an int >= 0.")
        if mode == "online" and (not isinstance(interval, int) or not
                                 1 <= interval <= problem.steps):
            raise ValueError(f"Trainer: interval={interval!r} must be an int in [1, steps="
                             f"{problem.steps}] for online tuning.")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"Trainer: clip_norm={clip_norm!r} must be > 0 or None.")
        self.problem = problem
        self.log = log
        self.mode = mode
        if method == "auto":
            name, why = choose_method(problem, mode, memory_budget)
            log(f"[hypergrad] method=auto chose {name}: {why}")
            method = ForwardMode() if name == "forward" else ReverseMode()
        elif isinstance(method, str):
            m = make_method(method)
            assert isinstance(m, Method)
            method = m
        if not isinstance(method, Method):
            raise TypeError(f"Trainer: method must be a Method or 'forward'/'reverse'/'auto', got "
                            f"{type(method).__name__}.")
        if mode == "online" and not isinstance(method, ForwardMode):
            raise NotImplementedError(
                f"Trainer: online tuning needs hypergradients during training, which only "
                f"ForwardMode gives; got {type(method).__name__}. Use method='forward'."
            )
        self.method = method
        self.outer_steps = outer_steps
        self.interval = interval
        self.reset_tangents = reset_tangents
        self.clip_norm = clip_norm
        self.bounds = self._check_bounds(bounds or {})
        self.evaluate = evaluate
        self.progress = progress
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.lam = problem.init_raw().requires_grad_(False)
        factory = outer_optimizer or (lambda ps: torch.optim.Adam(ps, lr=0.05))
        self.outer = factory([self.lam])
        if not isinstance(self.outer, torch.optim.Optimizer):
            raise TypeError("Trainer: outer_optimizer(params) must return a torch.optim.Optimizer.")
        self.history: list[dict[str, Any]] = []
        self._last_good = self.lam.detach().clone()  # last lam with a finite evaluation
        self.outer_step = 0
        self.fstate: ForwardState | None = None
        self._tb: Any = None
        if tensorboard:
            self._tb = self._tensorboard()
        if resume and self.run_dir is not None and (self.run_dir / "checkpoint.pt").exists():
            self._load(self.run_dir / "checkpoint.pt")
            log(f"[hypergrad] resumed from {self.run_dir / 'checkpoint.pt'} at outer step "
                f"{self.outer_step}")
        self._project()

    # -- guards ---------------------------------------------------------------------------------
    def _check_bounds(self, bounds: Mapping[str, Sequence[float | None]]
                      ) -> dict[str, tuple[Tensor | None, Tensor | None]]:
        hps = self.problem.hyperparams
        out = {}
        for name, lohi in bounds.items():
            if name not in hps.by_name:
                raise ValueError(f"Trainer: bounds name {name!r} is not a hyperparameter; defined "
                                 f"are {hps.names}.")
            if len(lohi) != 2:
                raise ValueError(f"Trainer: bounds[{name!r}]={lohi!r} must be (low, high).")
            item = hps.by_name[name]
            inverse, valid, domain = TRANSFORMS[item.transform][1:]
            raw: list[Tensor | None] = []
            for v in lohi:
                if v is None:
                    raw.append(None)
                    continue
                t = torch.tensor(float(v), dtype=self.problem.dtype)
                if not valid(t):
                    raise ValueError(f"Trainer: bounds[{name!r}] value {v} is outside the domain "
                                     f"of transform={item.transform!r} ({domain}).")
                raw.append(inverse(t))  # transforms are increasing: bounds map to raw bounds
            out[name] = (raw[0], raw[1])
        return out

    def _project(self) -> None:
        slices = self.problem.hyperparams.slices
        with torch.no_grad():
            for name, (lo, hi) in self.bounds.items():
                self.lam[slices[name]] = self.lam[slices[name]].clamp(lo, hi)

    def _clip(self, g: Tensor) -> Tensor:
        if self.clip_norm is None:
            return g
        n = float(g.norm())
        return g * (self.clip_norm / n) if n > self.clip_norm else g

    # -- the loops -------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Run to the end (or resume to the end); returns the learned hyperparameters."""
        self.problem.check(self.lam)
        if self.mode == "offline":
            return self._fit_offline()
        return self._fit_online()

    def _bar(self, total: int, initial: int, desc: str, leave: bool = True) -> Any:
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, leave=leave,
                    disable=not self.progress, dynamic_ncols=True)

    def _hypergradient(self, lam: Tensor) -> tuple[Tensor, Tensor, InnerState]:
        if isinstance(self.method, ForwardMode):  # stepped here for the inner progress bar
            fm = self.method
            fs = fm.init(self.problem, lam)
            with self._bar(self.problem.steps, 0, "inner", leave=False) as bar:
                for _ in range(self.problem.steps):
                    fs = fm.step(self.problem, fs, lam)
                    bar.update()
            value, grad = fm.hypergradient_at(self.problem, fs, lam)
            return value, grad, fs.state
        r = self.method.hypergradient(self.problem, lam)
        return r.objective, r.grad, r.state

    def _fit_offline(self) -> TrainResult:
        state = None
        with self._bar(self.outer_steps, self.outer_step, "outer") as bar:
            while self.outer_step < self.outer_steps:
                t0 = time.perf_counter()
                lam_used = self.lam.detach().clone()
                value, grad, state = self._hypergradient(lam_used)
                if not (torch.isfinite(value) and torch.isfinite(grad).all()):
                    return self._diverged(value, grad, state)
                self._update(grad)
                self._record(value, grad, lam_used, state, time.perf_counter() - t0)
                bar.update()
                bar.set_postfix(val=f"{float(value):.4g}")
        return self._result(state)

    def _fit_online(self) -> TrainResult:
        fm = self.method
        assert isinstance(fm, ForwardMode)
        p = self.problem
        if self.fstate is None:
            self.fstate = fm.init(p, self.lam.detach().clone())
        t0 = time.perf_counter()
        with self._bar(p.steps, self.fstate.step, "inner (online)") as bar:
            while self.fstate.step < p.steps:
                lam_used = self.lam.detach().clone()
                self.fstate = fm.step(p, self.fstate, lam_used)
                bar.update()
                if self.fstate.step % self.interval and self.fstate.step < p.steps:
                    continue
                value, grad = fm.hypergradient_at(p, self.fstate, lam_used)
                if not (torch.isfinite(value) and torch.isfinite(grad).all()):
                    return self._diverged(value, grad, self.fstate.state)
                self._update(grad)
                if self.reset_tangents:
                    z = self.fstate.tangents
                    zeros = tree_unflatten([torch.zeros_like(x) for x in tree_flatten(z)[0]],
                                           tree_flatten(z)[1])
                    self.fstate = self.fstate._replace(tangents=zeros)
                self._record(value, grad, lam_used, self.fstate.state,
                             time.perf_counter() - t0, inner_step=self.fstate.step)
                t0 = time.perf_counter()
                bar.set_postfix(val=f"{float(value):.4g}")
        return self._result(self.fstate.state)

    def _update(self, grad: Tensor) -> None:
        self.lam.grad = self._clip(grad).to(self.lam.dtype)
        self.outer.step()
        self.lam.grad = None
        self._project()

    def _diverged(self, value: Tensor, grad: Tensor, state: InnerState) -> TrainResult:
        good = self.history[-1]["outer_step"] if self.history else None
        bad = self.problem.hyperparams.describe(self.lam)
        with torch.no_grad():
            self.lam.copy_(self._last_good)
        what = (f"the validation loss is {float(value)}" if not torch.isfinite(value)
                else "the hypergradient is not finite")
        msg = (f"[hypergrad] stopped at outer step {self.outer_step}: {what}"
               f" with hyperparameters {bad}. The inner training diverged; kept the last good "
               f"hyperparameters {self.problem.hyperparams.describe(self.lam)}"
               f"{f' (of outer step {good})' if good is not None else ' (the initial ones)'}. "
               f"Try a smaller outer learning rate, clip_norm=..., or bounds=... on learning "
               f"rates.")
        self.log(msg)
        res = self._result(None)
        res.diverged, res.message = True, msg
        return res

    def _result(self, state: InnerState | None) -> TrainResult:
        lam = self.lam.detach().clone()
        name = "forward" if isinstance(self.method, ForwardMode) else self.method.name
        return TrainResult(lam, self.problem.hyperparams.describe(lam), list(self.history),
                           name, state=state)

    # -- logging and checkpoints -----------------------------------------------------------------
    def _record(self, value: Tensor, grad: Tensor, lam_used: Tensor, state: InnerState,
                seconds: float, inner_step: int | None = None) -> None:
        self._last_good = lam_used.detach().clone()
        rec: dict[str, Any] = {"outer_step": self.outer_step, "val_loss": float(value),
                               "hypergrad_norm": float(grad.norm()), "seconds": seconds,
                               "hyperparams": self.problem.hyperparams.describe(lam_used)}
        if inner_step is not None:
            rec["inner_step"] = inner_step
        if self.evaluate is not None:
            rec.update({k: float(v) for k, v in self.evaluate(state).items()})
        self.history.append(rec)
        self.outer_step += 1
        if self.run_dir is not None:
            self._save()  # checkpoint first: metrics.jsonl is rewritten from it on resume
            with open(self.run_dir / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        if self._tb is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, rec["outer_step"])

    def _tensorboard(self) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("Trainer: tensorboard=True needs the tensorboard package: "
                              "pip install tensorboard.") from e
        if self.run_dir is None:
            raise ValueError("Trainer: tensorboard=True needs a run_dir.")
        return SummaryWriter(str(self.run_dir / "tb"))

    def _save(self) -> None:
        assert self.run_dir is not None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        np_state: Any = np.random.get_state()
        ck: dict[str, Any] = {
            "version": 1, "mode": self.mode, "outer_step": self.outer_step,
            "lam": self.lam.detach().clone(), "outer": self.outer.state_dict(),
            "history": self.history, "last_good": self._last_good,
            "rng": {"torch": torch.get_rng_state(), "python": _py_rng(),
                    "numpy": torch.as_tensor(np_state[1].astype(np.int64)),
                    "numpy_pos": int(np_state[2])},
        }
        if self.fstate is not None:
            ck["inner"] = {"step": self.fstate.step,
                           "state": tree_flatten(self.fstate.state)[0],
                           "tangents": tree_flatten(self.fstate.tangents)[0]}
        path = self.run_dir / "checkpoint.pt"
        tmp = path.with_suffix(".pt.tmp")
        torch.save(ck, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # atomic: a kill leaves the old or the new checkpoint, never half

    def _load(self, path: Path) -> None:
        ck = torch.load(path, weights_only=True, map_location=self.problem.device)
        if ck.get("mode") != self.mode:
            raise ValueError(f"Trainer: checkpoint {path} is from mode={ck.get('mode')!r}, this "
                             f"run is mode={self.mode!r}; use another run_dir.")
        if tuple(ck["lam"].shape) != tuple(self.lam.shape):
            raise ValueError(f"Trainer: checkpoint {path} has K={ck['lam'].shape[0]} "
                             f"hyperparameters, this problem has K={self.lam.shape[0]}.")
        with torch.no_grad():
            self.lam.copy_(ck["lam"])
        self.outer.load_state_dict(ck["outer"])
        self.history = list(ck["history"])
        self._last_good = ck.get("last_good", ck["lam"]).to(self.lam)
        self.outer_step = int(ck["outer_step"])
        torch.set_rng_state(ck["rng"]["torch"])
        random.setstate(_py_rng_restore(ck["rng"]["python"]))
        np.random.set_state(("MT19937", ck["rng"]["numpy"].numpy().astype(np.uint32),
                             ck["rng"]["numpy_pos"], 0, 0.0))
        if "inner" in ck:
            s0 = self.problem.initial_state()
            spec = tree_flatten(s0)[1]
            state = tree_unflatten(list(ck["inner"]["state"]), spec)
            tangents = tree_unflatten(list(ck["inner"]["tangents"]), spec)
            self.fstate = ForwardState(state, tangents, int(ck["inner"]["step"]))
        if self.run_dir is not None:  # metrics.jsonl agrees with the checkpoint again
            with open(self.run_dir / "metrics.jsonl", "w") as fh:
                for rec in self.history:
                    fh.write(json.dumps(rec) + "\n")


def _py_rng() -> list[Any]:
    version, state, gauss = random.getstate()
    return [version, list(state), gauss]


def _py_rng_restore(x: list[Any]) -> tuple[Any, ...]:
    return (x[0], tuple(x[1]), x[2])

