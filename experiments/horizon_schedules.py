"""Part 2 of experiments/long_horizon.py: short-horizon bias, measured.

An FDS-style schedule (a learning rate on W equal windows, a momentum and a weight decay) over
T inner steps of SGD, tuned by contenders that each get the same budget of process CPU seconds
per tuning seed:

- ``forward``: forward-mode hypergradients over the full horizon (offline, one whole inner run
  per outer step), FDS-style sign steps (``SignDescent``, halved on a sign flip), backtracking;
- ``forward_defaults``: the same hypergradients with the Trainer's default outer loop (the
  space-filling start, the quasi-Newton line search of plain runs, the re-check in another
  batch order), in the same box;
- ``hd``, ``marthe``, ``rtho``: the greedy online methods (one run, the hyperparameters updated
  every ``interval`` inner steps from the hypergradient at that step: HD through the last step
  only, MARTHE with a discount, RTHO = forward mode online), each spending the budget on a grid
  over its hyper-learning-rate (Adam on the raw values) and the initial learning rate;
- ``recipe``: cosine decay with linear warmup (5%, final lr 0), momentum 0.9, the initial
  weight decay, its peak learning rate from a log grid;
- ``tpe``, ``random``: Optuna's TPE and random sampler over the recipe's parameters (peak lr,
  warmup, final lr, weight decay), ask/tell, one training per trial.

Each contender's result (its best point by the validation loss at the tuning seed) is trained
again from scratch on fresh seeds (new initialisation and batch order) and judged by the test
loss. The black-box tuners train with plain ``torch.optim.SGD`` (as fast as training gets: the
fairest setting for them); the hypergradient tuners run the library (``hypergrad.Trainer``).
Both train the same network from the same initialisation on the same batches.

Two problems: ``teacher`` (an MLP student of a random MLP teacher on generated data, 20% of the
training labels replaced at random, clean validation and test labels, batch 16: the gradient
noise makes the decay at the end matter) and ``nqm`` (the noisy quadratic model of Wu et al.,
ICLR 2018, where short-horizon bias is known to appear: the sanity problem).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from horizon_common import (
    Records,
    cpu,
    fit_forward,
    forward_info,
    mean_se,
    optuna_within_budget,
    ratio_se,
)
from torch import Tensor, nn

import hypergrad as hg
from hypergrad.data import MiniBatches

GREEDY = ("hd", "marthe", "rtho")
CONTENDERS = ("forward", *GREEDY, "recipe", "tpe", "random", "forward_defaults")
FORWARD = ("forward", "forward_defaults")
"""The forward-mode contenders; ``forward`` (FDS-style sign steps) is the one the summary's
ratios are for, ``forward_defaults`` (the Trainer's default outer loop, added later) gets its
own ``defaults_vs_*`` ratios."""


# -- schedules: what each contender returns
def spec_values(spec: dict[str, Any], t: int, T: int) -> dict[str, float]:
    """The hyperparameters at step ``t`` of a result: ``{"lr", "momentum", "wd"}``."""
    kind = spec["kind"]
    if kind == "windows":  # forward mode: W equal windows (Schedule's rule), scalars
        w = len(spec["lr"])
        lr = spec["lr"][min(t * w // T, w - 1)]
        return {"lr": lr, "momentum": spec["momentum"], "wd": spec["wd"]}
    if kind == "intervals":  # online: one value per interval
        i = min(t // spec["interval"], len(spec["lr"]) - 1)
        return {k: spec[k][i] for k in ("lr", "momentum", "wd")}
    if kind == "recipe":  # linear warmup, cosine to the final lr
        warm = int(round(spec["warmup"] * T))
        peak, final = spec["peak"], spec["final"]
        if t < warm:
            lr = peak * (t + 1) / warm
        else:
            lr = final + 0.5 * (peak - final) * (1 + math.cos(math.pi * (t - warm)
                                                               / max(T - warm, 1)))
        return {"lr": lr, "momentum": spec["momentum"], "wd": spec["wd"]}
    raise ValueError(f"unknown schedule kind {kind!r}")


def spec_curve(spec: dict[str, Any], T: int, points: int = 200) -> dict[str, list[float]]:
    ts = sorted({int(round(i * (T - 1) / (points - 1))) for i in range(points)})
    vals = [spec_values(spec, t, T) for t in ts]
    return {"t": ts, **{k: [v[k] for v in vals] for k in ("lr", "momentum", "wd")}}


# -- the problems
class NQM(nn.Module):
    """The noisy quadratic model: ``L(w; c) = 1/2 sum_i h_i (w_i - c_i)^2`` with ``c ~ N(0,
    diag(h))``; the risk (validation and test) is ``1/2 sum_i h_i w_i^2`` (divided by the
    replicas). ``h_i = 1 / (1 + i mod dim)``: ``replicas`` independent copies of a
    ``dim``-dimensional problem, so the risk of one run averages over them (less noise)."""

    def __init__(self, dim: int, replicas: int = 1) -> None:
        super().__init__()
        self.replicas = replicas
        self.w = nn.Parameter(torch.randn(dim * replicas))
        self.register_buffer("h", _curvatures(dim, replicas))

    def forward(self, c: Tensor) -> Tensor:
        return 0.5 * (self.h * (self.w - c) ** 2).sum() / self.replicas


def _curvatures(dim: int, replicas: int) -> Tensor:
    return 1.0 / (1 + torch.arange(dim * replicas, dtype=torch.float32) % dim)


@dataclass
class Study:
    """One problem of the schedule study: its sizes, budget and grids."""

    name: str
    T: int
    budget: float  # CPU seconds per contender and tuning seed
    windows: int = 10
    lr0: float = 0.03
    wd0: float | None = 1e-4  # None: no weight decay hyperparameter
    interval: int = 10
    hyper_lrs: tuple[float, ...] = (0.003, 0.01, 0.03, 0.1)
    init_lrs: tuple[float, ...] = (0.01, 0.03, 0.1)
    recipe_grid: tuple[float, ...] = tuple(1e-3 * 2 ** (i / 2) for i in range(21))
    marthe_mu: float = 0.95
    batch_size: int = 16
    sizes: dict[str, int] = field(default_factory=dict)
    _data: Any = None

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        b = {"lr": (1e-4, 2.0), "momentum": (0.01, 0.995)}
        if self.wd0 is not None:
            b["wd"] = (1e-6, 1e-2)
        return b

    # data and networks
    def data(self) -> Any:
        if self._data is None:
            self._data = (_teacher_data(**self.sizes) if self.name == "teacher"
                          else _nqm_data(**self.sizes))
        return self._data

    def net(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        if self.name == "nqm":
            return NQM(self.data()["dim"], self.data()["replicas"])
        d = self.data()["x"].shape[1]
        h = self.sizes.get("width", 64)
        return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                             nn.Linear(h, 10))

    def batches(self, seed: int) -> Callable[[int], Any]:
        data = self.data()
        if self.name == "nqm":
            scale = data["noise"]

            def noise(t: int) -> tuple[Tensor]:
                g = torch.Generator().manual_seed(seed * 1_000_003 + t)
                return (scale * torch.randn(scale.shape, generator=g),)

            return noise
        return MiniBatches(data["x"], data["y_train"], batch_size=self.batch_size, seed=seed,
                           shuffle=True)

    def train_loss(self, m: Any, batch: Any) -> Tensor:
        if self.name == "nqm":
            return m(batch[0])  # type: ignore[no-any-return]
        return F.cross_entropy(m(batch[0]), batch[1])

    def split_loss(self, m: Any, split: str) -> Tensor:
        if self.name == "nqm":
            d = self.data()
            w = m.params["w"] if hasattr(m, "params") else m.w
            return 0.5 * (d["h"] * w**2).sum() / d["replicas"]
        d = self.data()
        return F.cross_entropy(m(d[f"x_{split}"]), d[f"y_{split}"])

    # the library's problem (forward mode, the online methods)
    def hyperparams(self, schedule: bool, lr0: float | list[float] | None = None
                    ) -> hg.HyperParams:
        lr0 = self.lr0 if lr0 is None else lr0
        items: list[Any] = [hg.Schedule("lr", lr0, windows=self.windows, transform="log")
                            if schedule else hg.Scalar("lr", lr0, transform="log"),
                            hg.Scalar("momentum", 0.9, transform="logit")]
        if self.wd0 is not None:
            items.append(hg.Scalar("wd", self.wd0, transform="log"))
        return hg.HyperParams(items)

    def problem(self, seed: int, hps: hg.HyperParams, batches: Any = None,
                T: int | None = None) -> hg.InnerProblem:
        opt = hg.optim.sgd(lr="lr", momentum="momentum",
                           weight_decay="wd" if self.wd0 is not None else 0.0)
        return hg.InnerProblem(
            self.net(seed), lambda m, b, hp: self.train_loss(m, b), opt, hps,
            self.batches(seed) if batches is None else batches, self.T if T is None else T,
            lambda m, hp: self.split_loss(m, "val"), seed=seed)

    # plain PyTorch training at a schedule (the black-box tuners, and every retraining)
    def train(self, seed: int, spec: dict[str, Any], batch_seed: int | None = None
              ) -> dict[str, float]:
        """Validation and test loss after training ``spec`` from ``net(seed)`` on the batches of
        ``seed`` (or of ``batch_seed``: the initial weights and the batch order apart)."""
        net = self.net(seed)
        batch = self.batches(seed if batch_seed is None else batch_seed)
        v0 = spec_values(spec, 0, self.T)
        opt = torch.optim.SGD(net.parameters(), lr=v0["lr"], momentum=v0["momentum"],
                              weight_decay=v0["wd"] or 0.0)
        group = opt.param_groups[0]
        for t in range(self.T):
            v = spec_values(spec, t, self.T)
            group["lr"], group["momentum"], group["weight_decay"] = (
                v["lr"], v["momentum"], v["wd"] or 0.0)
            opt.zero_grad(set_to_none=True)
            self.train_loss(net, batch(t)).backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            out = {"val": float(self.split_loss(net, "val")),
                   "test": float(self.split_loss(net, "test"))}
        return {k: (v if math.isfinite(v) else math.inf) for k, v in out.items()}


def _teacher_data(n_train: int = 60000, n_val: int = 500, n_test: int = 5000, dim: int = 20,
                  noise: float = 0.2, width: int = 64, seed: int = 0) -> dict[str, Tensor]:
    """Inputs ~ N(0, I); labels = argmax of a random tanh MLP teacher (logits x 3); a fraction
    ``noise`` of the training labels replaced by uniformly random ones (validation and test
    labels clean)."""
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_val + n_test
    x = torch.randn(n, dim, generator=g)
    w1 = torch.randn(dim, 64, generator=g) / math.sqrt(dim)
    w2 = torch.randn(64, 10, generator=g) / math.sqrt(64)
    y = (3 * torch.tanh(x @ w1) @ w2 * math.sqrt(64) / 2).argmax(-1)
    y_train = y[:n_train].clone()
    flip = torch.rand(n_train, generator=g) < noise
    y_train[flip] = torch.randint(0, 10, (int(flip.sum()),), generator=g)
    return {"x": x[:n_train], "y_train": y_train,
            "x_val": x[n_train:n_train + n_val], "y_val": y[n_train:n_train + n_val],
            "x_test": x[n_train + n_val:], "y_test": y[n_train + n_val:]}


def _nqm_data(dim: int = 100, replicas: int = 20) -> dict[str, Any]:
    h = _curvatures(dim, replicas)
    return {"dim": dim, "replicas": replicas, "h": h, "noise": h.sqrt()}


def studies(quick: bool) -> dict[str, Study]:
    if quick:
        return {"teacher": Study("teacher", T=200, budget=6.0, windows=10,
                                 hyper_lrs=(0.01, 0.1), init_lrs=(0.03,),
                                 recipe_grid=(0.01, 0.03, 0.1),
                                 sizes={"n_train": 4000, "n_val": 200, "n_test": 500}),
                "nqm": Study("nqm", T=200, budget=3.0, windows=10, lr0=0.1, wd0=None,
                             hyper_lrs=(0.01, 0.1), init_lrs=(0.1,),
                             recipe_grid=(0.03, 0.1, 0.3), sizes={"dim": 20, "replicas": 5})}
    return {"teacher": Study("teacher", T=5000, budget=200.0),
            "nqm": Study("nqm", T=5000, budget=90.0, lr0=0.1, wd0=None,
                         init_lrs=(0.03, 0.1, 0.3),
                         recipe_grid=tuple(1e-2 * 2 ** (i / 2) for i in range(15)))}


# -- the contenders
def _quiet() -> list[Any]:
    return [hg.run.Log(None), hg.run.Progress(False)]


def _values(hps: hg.HyperParams, lam: Tensor) -> dict[str, Any]:
    return hps.describe(lam)


def tune_forward(st: Study, seed: int, defaults: bool = False,
                 mode: hg.Offline | None = None) -> dict[str, Any]:
    """Forward mode over the full horizon: FDS-style sign steps with backtracking, or
    (``defaults``) the Trainer's default outer loop in the same box (``mode`` in place of its
    default mode: a development variant's search settings)."""
    hps = st.hyperparams(schedule=True)
    p = st.problem(seed, hps)
    t0 = cpu()
    res = fit_forward(p, st.budget - (cpu() - t0), st.bounds, defaults, mode=mode)
    used = cpu() - t0
    v = _values(hps, res.lam)
    spec = {"kind": "windows", "lr": list(v["lr"]), "momentum": float(v["momentum"]),
            "wd": float(v["wd"]) if "wd" in v else 0.0}
    return {"val": res.best_val_loss, "cpu_s": used,
            "evals": len(res.history) + len(res.evaluations) + 1,
            "spec": spec, "info": forward_info(res)}


def _online_method(name: str, st: Study) -> hg.OnlineMethod:
    if name == "hd":
        return hg.HD()
    if name == "marthe":
        return hg.MARTHE(mu=st.marthe_mu)
    return hg.ForwardMode()  # rtho: forward mode online, tangents never reset


def _grid_order(n_a: int, n_b: int) -> list[tuple[int, int]]:
    """Grid points in an order that covers the grid early: a fixed permutation."""
    pts = [(i, j) for i in range(n_a) for j in range(n_b)]
    perm = torch.randperm(len(pts), generator=torch.Generator().manual_seed(26)).tolist()
    return [pts[k] for k in perm]


def tune_online(st: Study, seed: int, name: str) -> dict[str, Any]:
    t0 = cpu()
    best: dict[str, Any] | None = None
    tried = []
    last = 0.0
    for i, j in _grid_order(len(st.hyper_lrs), len(st.init_lrs)):
        if tried and cpu() - t0 + last > st.budget:
            break
        t1 = cpu()
        hyper_lr, lr0 = st.hyper_lrs[i], st.init_lrs[j]
        hps = st.hyperparams(schedule=False, lr0=lr0)
        p = st.problem(seed, hps)
        res = hg.Trainer(p, _online_method(name, st),
                         outer=functools.partial(torch.optim.Adam, lr=hyper_lr),
                         mode=hg.Online(interval=st.interval),
                         guards=hg.Guards(bounds=st.bounds, divergence_factor=None),
                         callbacks=_quiet()).fit()
        last = cpu() - t1
        hist = res.history
        val = math.inf if res.diverged or not hist else float(hist[-1]["val_loss"])
        if not math.isfinite(val):
            val = math.inf
        tried.append({"hyper_lr": hyper_lr, "lr0": lr0, "val": val, "cpu_s": last,
                      "diverged": bool(res.diverged)})
        if val < (best["val"] if best else math.inf) and hist:
            spec = {"kind": "intervals", "interval": st.interval,
                    "lr": [float(h["hyperparams"]["lr"]) for h in hist],
                    "momentum": [float(h["hyperparams"]["momentum"]) for h in hist],
                    "wd": [float(h["hyperparams"].get("wd", 0.0)) for h in hist]}
            best = {"val": val, "spec": spec, "hyper_lr": hyper_lr, "lr0": lr0}
    used = cpu() - t0
    if best is None:  # every grid point diverged: the initial point, constant
        lr0 = st.init_lrs[0]
        best = {"val": math.inf, "spec": {"kind": "windows", "lr": [lr0], "momentum": 0.9,
                                          "wd": st.wd0 or 0.0}}
    return {"val": best["val"], "cpu_s": used, "evals": len(tried), "spec": best["spec"],
            "info": {"grid": tried, "picked": {k: best.get(k) for k in ("hyper_lr", "lr0")}}}


def _recipe(st: Study, peak: float, warmup: float = 0.05, final: float = 0.0,
            wd: float | None = None) -> dict[str, Any]:
    return {"kind": "recipe", "peak": peak, "warmup": warmup, "final": final,
            "momentum": 0.9, "wd": (st.wd0 or 0.0) if wd is None else wd}


def tune_recipe(st: Study, seed: int) -> dict[str, Any]:
    t0 = cpu()
    best: tuple[float, dict[str, Any]] = (math.inf, _recipe(st, st.lr0))
    tried, last = [], 0.0
    for peak in st.recipe_grid:
        if tried and cpu() - t0 + last > st.budget:
            break
        t1 = cpu()
        spec = _recipe(st, peak)
        val = st.train(seed, spec)["val"]
        last = cpu() - t1
        tried.append({"peak": peak, "val": val})
        if val < best[0]:
            best = (val, spec)
    return {"val": best[0], "cpu_s": cpu() - t0, "evals": len(tried), "spec": best[1],
            "info": {"grid": tried}}


def tune_optuna(st: Study, seed: int, sampler_name: str) -> dict[str, Any]:
    import optuna

    sampler = (optuna.samplers.TPESampler(seed=seed) if sampler_name == "tpe"
               else optuna.samplers.RandomSampler(seed=seed))
    first = {"peak": st.lr0, "warmup": 0.05, "final_frac": 1e-3}
    if st.wd0 is not None:
        first["wd"] = st.wd0

    def evaluate(tr: Any) -> tuple[float, dict[str, Any]]:
        peak = tr.suggest_float("peak", 1e-3, 2.0, log=True)
        warm = tr.suggest_float("warmup", 0.0, 0.3)
        frac = tr.suggest_float("final_frac", 1e-4, 1.0, log=True)
        wd = tr.suggest_float("wd", 1e-6, 1e-2, log=True) if st.wd0 is not None else 0.0
        spec = _recipe(st, peak, warm, peak * frac, wd)
        return st.train(seed, spec)["val"], spec

    return optuna_within_budget(sampler, first, st.budget, evaluate, _recipe(st, st.lr0))


def tune(st: Study, seed: int, contender: str) -> dict[str, Any]:
    if contender in ("forward", "forward_defaults"):
        return tune_forward(st, seed, defaults=contender == "forward_defaults")
    if contender in GREEDY:
        return tune_online(st, seed, contender)
    if contender == "recipe":
        return tune_recipe(st, seed)
    return tune_optuna(st, seed, contender)


# -- running, resumable
def retrain_seeds(quick: bool) -> list[int]:
    return [100] if quick else [100, 101, 102]


def run(records: Records, quick: bool, seeds: list[int], log: Callable[[str], None],
        only: list[str] | None = None, contenders: list[str] | None = None) -> None:
    """Every (study, seed, contender) unit not yet in ``records``: tune, then retrain the
    result on fresh seeds; plus the constant-lr and cosine baselines that show the schedule
    matters. ``only`` (study names) / ``contenders``: only these (default all)."""
    for name, st in studies(quick).items():
        if only is not None and name not in only:
            continue
        unit = f"schedule/{name}/baselines"
        if not records.done(unit):
            records.add(unit, {"part": "schedule", "study": name, "kind": "baselines",
                               **baselines(st, retrain_seeds(quick))})
            log(f"{unit}: {records.get(unit)['summary']}")
        for seed in seeds:
            for c in CONTENDERS:
                if contenders is not None and c not in contenders:
                    continue
                unit = f"schedule/{name}/{c}/{seed}"
                if records.done(unit):
                    continue
                got = tune(st, seed, c)
                rt = [{"seed": s, **st.train(s, got["spec"])} for s in retrain_seeds(quick)]
                row = records.add(unit, {
                    "part": "schedule", "study": name, "contender": c, "seed": seed,
                    "T": st.T, "budget_cpu_s": st.budget, **got, "retrain": rt,
                    "test": mean_se([r["test"] for r in rt])[0],
                    "val_retrain": mean_se([r["val"] for r in rt])[0],
                    "curve": spec_curve(got["spec"], st.T)})
                log(f"{unit}: val {row['val']:.4f} test {row['test']:.4f} "
                    f"({row['evals']} evals, {row['cpu_s']:.0f} CPU s)")


def baselines(st: Study, seeds: list[int]) -> dict[str, Any]:
    """Test loss of constant learning rates and of the cosine recipe at the same peaks
    (momentum 0.9, the initial weight decay), on the retraining seeds: the spread that says
    the schedule matters."""
    rows = []
    for lr in st.recipe_grid[::2]:
        const = {"kind": "windows", "lr": [lr], "momentum": 0.9, "wd": st.wd0 or 0.0}
        for kind, spec in (("constant", const), ("cosine", _recipe(st, lr))):
            rt = [st.train(s, spec) for s in seeds]
            rows.append({"kind": kind, "lr": lr, "test": mean_se([r["test"] for r in rt])[0],
                         "val": mean_se([r["val"] for r in rt])[0]})
    fin = [r for r in rows if math.isfinite(r["test"])]
    const = [r for r in fin if r["kind"] == "constant"]
    cos = [r for r in fin if r["kind"] == "cosine"]
    best_c = min(const, key=lambda r: r["test"]) if const else None
    worst_c = max(const, key=lambda r: r["test"]) if const else None
    best_cos = min(cos, key=lambda r: r["test"]) if cos else None
    summary = {
        "best_constant": best_c, "worst_finite_constant": worst_c, "best_cosine": best_cos,
        "constant_spread": (worst_c["test"] / best_c["test"]) if best_c and worst_c else None,
        "cosine_vs_constant": (best_cos["test"] / best_c["test"]) if best_c and best_cos
        else None}
    return {"rows": rows, "summary": summary}


def summarize(records: Records, quick: bool) -> dict[str, Any]:
    """Per study: each contender's test loss (mean and SE over tuning seeds), val, CPU; the
    ratios forward / best greedy and forward / best other contender."""
    out: dict[str, Any] = {}
    for name, st in studies(quick).items():
        rows = records.where(part="schedule", study=name)
        by_c: dict[str, dict[int, dict[str, Any]]] = {}
        for r in rows:
            if "contender" in r:
                by_c.setdefault(r["contender"], {})[r["seed"]] = r
        seeds = sorted(set.intersection(*[set(v) for v in by_c.values()])) if by_c else []
        table = {}
        for c, per in by_c.items():
            tests = [per[s]["test"] for s in seeds if s in per]
            table[c] = {"test": mean_se(tests), "val": mean_se([per[s]["val"] for s in seeds]),
                        "cpu_s": mean_se([per[s]["cpu_s"] for s in seeds])[0],
                        "evals": mean_se([per[s]["evals"] for s in seeds])[0],
                        "seeds": len(tests)}
        res: dict[str, Any] = {"T": st.T, "budget_cpu_s": st.budget, "seeds": seeds,
                               "table": table}
        base = records.rows.get(f"schedule/{name}/baselines")
        if base:
            res["baselines"] = base["summary"]
        if "forward" in by_c and seeds:
            fwd = [by_c["forward"][s]["test"] for s in seeds]

            def best_of(names: tuple[str, ...]) -> str | None:
                got = [c for c in names if c in by_c and all(s in by_c[c] for s in seeds)]
                return min(got, key=lambda c: table[c]["test"][0]) if got else None

            g = best_of(GREEDY)
            o = best_of(tuple(c for c in CONTENDERS if c not in FORWARD))
            if g:
                res["forward_vs_greedy"] = ratio_se(fwd, [by_c[g][s]["test"] for s in seeds])
                res["best_greedy"] = g
            if o:
                res["forward_vs_best"] = ratio_se(fwd, [by_c[o][s]["test"] for s in seeds])
                res["best_other"] = o
            if "forward_defaults" in by_c and all(s in by_c["forward_defaults"] for s in seeds):
                dfl = [by_c["forward_defaults"][s]["test"] for s in seeds]
                for key, c in (("defaults_vs_greedy", g), ("defaults_vs_best", o)):
                    if c:
                        res[key] = ratio_se(dfl, [by_c[c][s]["test"] for s in seeds])
        out[name] = res
    return out


def plot(records: Records, quick: bool, path_for: Callable[[str], Any]) -> list[str]:
    """The learned schedules side by side, one figure per study (learning rate and momentum
    against the inner step; seed 0 drawn solid, the other seeds faint)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    colors = dict(zip(CONTENDERS, ("C3", "C0", "C9", "C2", "C1", "C4", "C7")))
    for name, st in studies(quick).items():
        rows = [r for r in records.where(part="schedule", study=name) if "contender" in r]
        if not rows:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        seen = set()
        for r in sorted(rows, key=lambda r: (r["contender"], r["seed"])):
            c, cv = r["contender"], r["curve"]
            first = c not in seen
            seen.add(c)
            kw = {"color": colors.get(c, "k"), "alpha": 1.0 if first else 0.35,
                  "lw": 1.6 if first else 0.8,
                  "label": f"{c} (test {r['test']:.3f})" if first else None}
            axes[0].plot(cv["t"], cv["lr"], **kw)
            axes[1].plot(cv["t"], cv["momentum"], **{**kw, "label": None})
        axes[0].set_yscale("log")
        axes[0].set_ylabel("learning rate")
        axes[1].set_ylabel("momentum")
        for ax in axes:
            ax.set_xlabel("inner step")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{name}: learned schedules, T = {st.T}, {st.budget:g} CPU s per tuner "
                     f"(first seed solid)")
        fig.tight_layout()
        path = path_for(f"schedules_{name}")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        files.append(str(path))
    return files
