"""Part 3 of experiments/long_horizon.py: a character-level transformer language model
(:mod:`hypergrad.tasks.charlm`: 2 layers, causal attention, LayerNorm, dropout) on the running
interpreter's standard library, trained by AdamW with gradients clipped at global norm 1.0 for
T inner steps. Contenders, each with the same budget of process CPU seconds per tuning seed:

- ``forward_defaults``: forward-mode hypergradients over the full horizon of a learning-rate
  schedule on W equal windows (the first window is the learned warmup), a weight decay per
  layer group (the embeddings, the attention matrices, the MLP matrices, the head, the
  LayerNorms and biases) and AdamW's two betas, with the Trainer's default outer loop
  (``Trainer(problem, ForwardMode(), guards=Guards(bounds=box, time_budget=B))``: the
  space-filling start, the quasi-Newton line search of plain runs, the re-check in another
  batch order); the summary's ``lm_forward_vs_recipe`` is this contender's;
- ``forward``: the same hyperparameters with FDS-style sign steps (0.5) and backtracking, one
  hypergradient per outer step (the presets' outer loop; this study's first forward contender);
- ``recipe``: the standard recipe, AdamW's defaults (betas 0.9 / 0.999, weight decay 0.01),
  cosine decay to 0 after a linear warmup of 5% of T, the peak learning rate from a log grid;
- ``schedulefree``: schedule-free AdamW (Defazio et al. 2024, ``schedulefree.AdamWScheduleFree``,
  its defaults and a 5% warmup), its learning rate from the same grid;
- ``tpe``: Optuna's TPE over the recipe's parameters (peak lr, warmup, final lr, weight decay);
- ``forward_scales``: ``forward_defaults`` with one more freedom, a tuned factor of the
  learning rate per layer group under the one schedule (``Schedule(..., scales=LAYER_GROUPS)``:
  K = 22 instead of 17), each factor in :data:`SCALE_BOX`; ``tpe_scales``: TPE over the
  recipe's parameters and the same factors in the same box (the black-box counterpart);
  ``forward_scales_sign``: the same hyperparameters as ``forward_scales`` with ``forward``'s
  sign steps (at this horizon the hypergradient's signs mostly agree with the loss's slope over
  a step, its magnitudes do not: ``experiments/lm_roughness.py``);
- ``forward_schedulefree``: hypergradients on top of the strongest baseline: the
  ``schedulefree`` contender's grid first (inside the budget), then forward mode through
  schedule-free AdamW itself (:func:`hypergrad.optim.adamw_schedulefree`, validation at its
  averaged point) from the grid's best learning rate: W learning-rate windows (multiplying the
  same 5% warmup), the weight decay per layer group and both betas, with the Trainer's default
  outer loop but no space-filling start (the grid was the start).

Results are retrained from scratch on fresh seeds (initialisation, batches, dropout) and judged
by the test split's bits per character. Black-box contenders and retraining run plain PyTorch
(``torch.optim.AdamW`` with parameter groups, ``clip_grad_norm_``); forward mode runs the
library on the same network, initialisation and batches (its dropout masks come from the
library's per-step generator, so the two differ in their draws only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
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

import hypergrad as hg
from hypergrad.tasks.charlm import charlm_task, layer_groups

CONTENDERS = ("forward", "recipe", "schedulefree", "tpe", "forward_defaults",
              "forward_schedulefree", "forward_scales", "tpe_scales", "forward_scales_sign")
FORWARD = "forward_defaults"
"""The contender ``lm_forward_vs_recipe`` is computed for (chosen before its results: the
library's defaults are what a user runs). ``forward_schedulefree`` (added 2026-11-26, before
any of its results) has its own ratio, ``lm_forward_schedulefree_vs_recipe``; so does
``forward_scales`` (added 2026-11-28, before any of its results; ``lm_forward_scales_vs_recipe``,
and ``lm_forward_scales_vs_tpe_scales`` against TPE over the same learning-rate factors), and
``forward_scales_sign`` (added 2026-11-28 after forward_scales' and tpe_scales' results and
``experiments/lm_roughness.py``'s, before any of its own; ``lm_forward_scales_sign_vs_recipe``)."""
SCALE_BOX = (0.1, 10.0)
"""The search box of each layer group's learning-rate factor (``forward_scales``, ``tpe_scales``:
the same for both)."""


@dataclass
class LMStudy:
    T: int
    budget: float
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    context: int = 32
    batch_size: int = 8
    windows: int = 10
    lr0: float = 3e-3
    train_chars: int = 1_000_000
    val_windows: int = 64
    eval_windows: int = 1024
    grid: tuple[float, ...] = tuple(1e-4 * 2**i for i in range(10))
    _tasks: Any = None

    def task(self, seed: int, hps: hg.HyperParams | None = None) -> hg.Task:
        """The library's task at ``seed`` (the same corpus split for every seed)."""
        hps = hps if hps is not None else self.hyperparams()
        opt = hg.optim.adamw(lr="lr", betas=("b1", "b2"), weight_decay="wd",
                             clip_grad_norm=1.0)
        return charlm_task(hps, opt, _factory(self), steps=self.T, batch_size=self.batch_size,
                           context=self.context, seed=seed, data_seed=0,
                           train_chars=self.train_chars, val_chars=100_000,
                           test_chars=200_000, val_windows=self.val_windows,
                           eval_windows=self.eval_windows)

    def sf_task(self, seed: int, lr: float) -> tuple[hg.Task, hg.HyperParams]:
        """The library's task with schedule-free AdamW (the ``schedulefree`` contender's
        defaults: betas 0.9 / 0.999, weight decay 0.01, 5% warmup) from learning rate ``lr``."""
        hps = hg.HyperParams([hg.Schedule("lr", lr, windows=self.windows, transform="log"),
                              hg.PerGroup("wd", 0.01, "log", groups=self.groups()),
                              hg.Scalar("b1", 0.9, transform="logit"),
                              hg.Scalar("b2", 0.999, transform="logit")])
        opt = hg.optim.adamw_schedulefree(lr="lr", betas=("b1", "b2"), weight_decay="wd",
                                          warmup_steps=int(0.05 * self.T), clip_grad_norm=1.0)
        return charlm_task(hps, opt, _factory(self), steps=self.T, batch_size=self.batch_size,
                           context=self.context, seed=seed, data_seed=0,
                           train_chars=self.train_chars, val_chars=100_000,
                           test_chars=200_000, val_windows=self.val_windows,
                           eval_windows=self.eval_windows), hps

    def groups(self) -> dict[str, str]:
        return layer_groups()

    def hyperparams(self, scales: bool = False) -> hg.HyperParams:
        """The forward contenders' hyperparameters (``scales``: a learning-rate factor per
        layer group too, ``forward_scales``)."""
        return hg.HyperParams([hg.Schedule("lr", self.lr0, windows=self.windows,
                                           transform="log",
                                           scales=self.groups() if scales else None),
                               hg.PerGroup("wd", 0.01, "log", groups=self.groups()),
                               hg.Scalar("b1", 0.9, transform="logit"),
                               hg.Scalar("b2", 0.999, transform="logit")])

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        return {"lr": (1e-5, 0.1), "wd": (1e-5, 1.0), "b1": (0.5, 0.99), "b2": (0.9, 0.9999)}

    @property
    def scale_bounds(self) -> dict[str, tuple[float, float]]:
        """:attr:`bounds` and each layer group's learning-rate factor's (``lr[group]``)."""
        return {**self.bounds, **{f"lr[{g}]": SCALE_BOX for g in self.groups()}}


def _factory(st: LMStudy) -> Any:
    from hypergrad.tasks.charlm import transformer_factory

    return transformer_factory(d_model=st.d_model, n_layers=st.n_layers, n_heads=st.n_heads,
                               dropout=0.1)


def lm_study(quick: bool) -> LMStudy:
    if quick:
        return LMStudy(T=30, budget=8.0, d_model=16, context=16, batch_size=4, windows=4,
                       train_chars=50_000, val_windows=16, eval_windows=64,
                       grid=(1e-3, 3e-3, 1e-2))
    return LMStudy(T=1000, budget=480.0)


# -- schedules
def lm_values(spec: dict[str, Any], t: int, T: int) -> dict[str, Any]:
    """``{"lr", "b1", "b2", "wd": {group: value}, "lr_scale": {group: factor}}`` at step ``t``
    of a result (of ``sf_windows``: the learning rate that the schedule-free optimizer's warmup
    multiplies); a layer group's learning rate is ``lr * lr_scale[group]`` (``lr_scale`` is
    empty unless the spec tunes a factor per layer group: ``forward_scales``)."""
    scale = dict(spec.get("lr_scale", {}))
    if spec["kind"] in ("windows", "sf_windows"):
        w = len(spec["lr"])
        return {"lr": spec["lr"][min(t * w // T, w - 1)], "b1": spec["b1"], "b2": spec["b2"],
                "wd": spec["wd"], "lr_scale": scale}
    warm = int(round(spec["warmup"] * T))
    peak, final = spec["peak"], spec["final"]
    done = (t - warm) / max(T - warm, 1)  # of the decay (experiments/lm_shapes.py's shapes too)
    lr = (peak * (t + 1) / warm if t < warm else
          final + (peak - final) * (1 - done) if spec["kind"] == "recipe_linear" else
          peak if spec["kind"] == "recipe_constant" else
          final + 0.5 * (peak - final) * (1 + math.cos(math.pi * done)))
    return {"lr": lr, "b1": spec["b1"], "b2": spec["b2"], "wd": spec["wd"], "lr_scale": scale}


def _recipe(st: LMStudy, peak: float, warmup: float = 0.05, final: float = 0.0,
            wd: float = 0.01) -> dict[str, Any]:
    return {"kind": "recipe", "peak": peak, "warmup": warmup, "final": final, "b1": 0.9,
            "b2": 0.999, "wd": {g: wd for g in st.groups()}}


# -- plain PyTorch training
def _param_groups(task: hg.Task) -> dict[str, list[str]]:
    item = task.problem.hyperparams.by_name["wd"]
    assert isinstance(item, hg.PerGroup) and item.assignment is not None
    names = list(item.groups)
    out: dict[str, list[str]] = {g: [] for g in names}
    for p, i in item.assignment.items():
        out[names[i]].append(p)
    return out


def train_torch(st: LMStudy, seed: int, spec: dict[str, Any] | None = None,
                schedulefree_lr: float | None = None, tasks: dict[int, hg.Task] | None = None,
                evaluate: bool = True) -> dict[str, float]:
    """Train the task's network at ``seed`` with plain PyTorch at a schedule (``spec``), or
    with schedule-free AdamW at ``schedulefree_lr``; returns the tuning objective ``val``
    (nats per character on the validation windows of ``E``) and ``val_bpc`` / ``test_bpc``
    (``evaluate=False``: the training alone, nothing returned: a benchmark's plain run)."""
    tasks = tasks if tasks is not None else {}
    if seed not in tasks:
        tasks[seed] = st.task(seed)
    task = tasks[seed]
    p = task.problem
    net = p.fmodel.module
    init = p.fmodel.initial_params()
    import copy

    net = copy.deepcopy(net)
    with torch.no_grad():
        for n, q in net.named_parameters():
            q.copy_(init[n])
    net.train()
    named = dict(net.named_parameters())
    groups = _param_groups(task)
    unknown = sorted(set(spec.get("lr_scale", {}) if spec is not None else {}) - set(groups))
    if unknown:
        raise ValueError(f"train_torch: lr_scale names {unknown}, which are not layer groups "
                         f"of the model; use {sorted(groups)}")
    T = st.T
    torch.manual_seed(seed + 7919)  # dropout draws
    sf = schedulefree_lr is not None or (spec is not None and spec["kind"] == "sf_windows")
    if sf:
        import schedulefree

        v0 = (lm_values(spec, 0, T) if spec is not None else
              {"lr": schedulefree_lr, "b1": 0.9, "b2": 0.999, "wd": dict.fromkeys(groups, 0.01)})
        opt: Any = schedulefree.AdamWScheduleFree(
            [{"params": [named[n] for n in ps], "name": g, "weight_decay": v0["wd"][g]}
             for g, ps in groups.items()],
            lr=v0["lr"], betas=(v0["b1"], v0["b2"]), warmup_steps=int(0.05 * T))
        opt.train()
    else:
        assert spec is not None
        v0 = lm_values(spec, 0, T)
        opt = torch.optim.AdamW(
            [{"params": [named[n] for n in ps], "name": g, "weight_decay": v0["wd"][g],
              "lr": v0["lr"] * v0["lr_scale"].get(g, 1.0)}
             for g, ps in groups.items()], lr=v0["lr"], betas=(v0["b1"], v0["b2"]))
    params = list(net.parameters())
    for t in range(T):
        if spec is not None:
            v = lm_values(spec, t, T)
            for grp in opt.param_groups:
                grp["lr"] = v["lr"] * v["lr_scale"].get(grp["name"], 1.0)
                grp["betas"] = (v["b1"], v["b2"])
                grp["weight_decay"] = v["wd"][grp["name"]]
        x, y = p.batch(t)
        logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    if not evaluate:
        return {}
    if sf:
        opt.eval()  # the averaged weights
    net.eval()
    state = hg.InnerState({n: q.detach() for n, q in net.named_parameters()}, {}, p.optimizer
                          .init({}))
    with torch.no_grad():
        val = float(p.objective(state.params, state.buffers, p.init_raw()))
    ev = task.evaluate(state) if math.isfinite(val) else {"val_bpc": math.inf,
                                                           "test_bpc": math.inf}
    return {"val": val if math.isfinite(val) else math.inf, **ev}


# -- the contenders
def windows_spec(st: LMStudy, v: dict[str, Any], scales: bool = False) -> dict[str, Any]:
    """The spec (:func:`lm_values`) of the forward contenders' values ``v``
    (``HyperParams.describe``); ``scales``: the schedule's entries are its windows, then the
    layer groups' learning-rate factors (``lr_scale``)."""
    groups = list(st.groups())
    lr = list(v["lr"])
    spec = {"kind": "windows", "lr": lr[:st.windows], "b1": float(v["b1"]),
            "b2": float(v["b2"]), "wd": dict(zip(groups, v["wd"], strict=True))}
    if scales:
        spec["lr_scale"] = dict(zip(groups, lr[st.windows:], strict=True))
    elif len(lr) != st.windows:
        raise ValueError(f"windows_spec: {len(lr)} learning-rate entries for {st.windows} "
                         "windows; pass scales=True for a schedule with scales")
    return spec


def tune_forward(st: LMStudy, seed: int, defaults: bool = False,
                 mode: hg.Offline | None = None, scales: bool = False) -> dict[str, Any]:
    """Forward mode over the full horizon: the presets' sign steps (``defaults=False``) or the
    Trainer's default outer loop (``mode`` in place of its default mode: a development
    variant's search settings, ``experiments/start_dev.py --task charlm``); ``scales``: a
    learning-rate factor per layer group too (``forward_scales``)."""
    t0 = cpu()
    hps = st.hyperparams(scales)
    task = st.task(seed, hps)
    res = fit_forward(task.problem, st.budget - (cpu() - t0),
                      st.scale_bounds if scales else st.bounds, defaults, mode=mode)
    used = cpu() - t0
    spec = windows_spec(st, hps.describe(res.lam), scales)
    return {"val": res.best_val_loss, "cpu_s": used,
            "evals": len(res.history) + len(res.evaluations) + 1, "spec": spec,
            "info": forward_info(res)}


def tune_forward_schedulefree(st: LMStudy, seed: int, tasks: dict[int, hg.Task]
                              ) -> dict[str, Any]:
    """The schedule-free grid, then forward mode through schedule-free AdamW from its best
    learning rate with what is left of the budget (the module docstring)."""
    t0 = cpu()
    grid = tune_grid(st, seed, True, tasks)
    lr = grid["spec"]["lr"]
    task, hps = st.sf_task(seed, lr)
    res = fit_forward(task.problem, st.budget - (cpu() - t0), st.bounds, True,
                      mode=hg.Offline(outer_steps=None, start=0, recheck="auto"))
    v = hps.describe(res.lam)
    spec = {"kind": "sf_windows", "lr": list(v["lr"]), "b1": float(v["b1"]),
            "b2": float(v["b2"]), "wd": dict(zip(list(st.groups()), v["wd"]))}
    info = {"grid": grid["info"]["grid"], "grid_lr": lr, **forward_info(res)}
    return {"val": res.best_val_loss, "cpu_s": cpu() - t0,
            "evals": grid["evals"] + len(res.history) + len(res.evaluations) + 1,
            "spec": spec, "info": info}


def tune_grid(st: LMStudy, seed: int, schedulefree: bool, tasks: dict[int, hg.Task]
              ) -> dict[str, Any]:
    t0 = cpu()
    best: tuple[float, Any] = (math.inf, st.grid[0])
    tried, last = [], 0.0
    for lr in _grid_order(st.grid):
        if tried and cpu() - t0 + last > st.budget:
            break
        t1 = cpu()
        got = (train_torch(st, seed, schedulefree_lr=lr, tasks=tasks) if schedulefree
               else train_torch(st, seed, _recipe(st, lr), tasks=tasks))
        last = cpu() - t1
        tried.append({"lr": lr, "val": got["val"]})
        if got["val"] < best[0]:
            best = (got["val"], lr)
    spec = ({"kind": "schedulefree", "lr": best[1]} if schedulefree else _recipe(st, best[1]))
    return {"val": best[0], "cpu_s": cpu() - t0, "evals": len(tried), "spec": spec,
            "info": {"grid": tried}}


def _grid_order(grid: tuple[float, ...]) -> list[float]:
    """The grid from its middle outwards (a truncated grid still covers the likely peak)."""
    mid = len(grid) // 2
    order = [mid]
    for k in range(1, len(grid)):
        for i in (mid - k, mid + k):
            if 0 <= i < len(grid):
                order.append(i)
    return [grid[i] for i in order]


def tune_tpe(st: LMStudy, seed: int, tasks: dict[int, hg.Task], scales: bool = False
             ) -> dict[str, Any]:
    """Optuna's TPE over the recipe's parameters (``scales``: and a learning-rate factor per
    layer group in :data:`SCALE_BOX`, ``tpe_scales``), the first trial at the recipe's
    defaults."""
    import optuna

    groups = list(st.groups()) if scales else []

    def evaluate(tr: Any) -> tuple[float, dict[str, Any]]:
        peak = tr.suggest_float("peak", 1e-4, 0.1, log=True)
        warm = tr.suggest_float("warmup", 0.0, 0.3)
        frac = tr.suggest_float("final_frac", 1e-3, 1.0, log=True)
        wd = tr.suggest_float("wd", 1e-5, 1.0, log=True)
        spec = _recipe(st, peak, warm, peak * frac, wd)
        if groups:
            spec["lr_scale"] = {g: tr.suggest_float(f"scale_{g}", *SCALE_BOX, log=True)
                                for g in groups}
        return train_torch(st, seed, spec, tasks=tasks)["val"], spec

    first: dict[str, float] = {"peak": st.lr0, "warmup": 0.05, "final_frac": 1e-3, "wd": 0.01,
                               **{f"scale_{g}": 1.0 for g in groups}}
    return optuna_within_budget(optuna.samplers.TPESampler(seed=seed), first, st.budget,
                                evaluate, _recipe(st, st.lr0))


def retrain(st: LMStudy, spec: dict[str, Any], seeds: list[int],
            tasks: dict[int, hg.Task]) -> list[dict[str, Any]]:
    out = []
    for s in seeds:
        if spec["kind"] == "schedulefree":
            got = train_torch(st, s, schedulefree_lr=spec["lr"], tasks=tasks)
        else:
            got = train_torch(st, s, spec, tasks=tasks)
        out.append({"seed": s, **got})
    return out


def curve(spec: dict[str, Any], T: int, points: int = 200) -> dict[str, list[float]]:
    if spec["kind"] == "schedulefree":
        return {"t": [0, T - 1], "lr": [spec["lr"], spec["lr"]]}
    ts = sorted({int(round(i * (T - 1) / (points - 1))) for i in range(points)})
    return {"t": ts, "lr": [lm_values(spec, t, T)["lr"] for t in ts]}


def run(records: Records, quick: bool, seeds: list[int], log: Callable[[str], None],
        contenders: list[str] | None = None) -> None:
    """Every contender (or only ``contenders``) at every seed, each unit recorded when done
    and skipped when already recorded."""
    st = lm_study(quick)
    rseeds = [100] if quick else [100, 101, 102]
    tasks: dict[int, hg.Task] = {}
    for seed in seeds:
        for c in CONTENDERS:
            unit = f"lm/{c}/{seed}"
            if (contenders is not None and c not in contenders) or records.done(unit):
                continue
            if c in ("forward", "forward_defaults", "forward_scales", "forward_scales_sign"):
                got = tune_forward(st, seed, defaults=c in ("forward_defaults", "forward_scales"),
                                   scales=c.startswith("forward_scales"))
            elif c in ("tpe", "tpe_scales"):
                got = tune_tpe(st, seed, tasks, scales=c == "tpe_scales")
            elif c == "forward_schedulefree":
                got = tune_forward_schedulefree(st, seed, tasks)
            else:
                got = tune_grid(st, seed, c == "schedulefree", tasks)
            rt = retrain(st, got["spec"], rseeds, tasks)
            row = records.add(unit, {
                "part": "lm", "contender": c, "seed": seed, "T": st.T,
                "budget_cpu_s": st.budget, **got, "retrain": rt,
                "test_bpc": mean_se([r["test_bpc"] for r in rt])[0],
                "val_bpc": mean_se([r["val_bpc"] for r in rt])[0],
                "curve": curve(got["spec"], st.T)})
            log(f"{unit}: val {row['val']:.4f} nats, retrained test {row['test_bpc']:.4f} "
                f"bits/char ({row['evals']} evals, {row['cpu_s']:.0f} CPU s)")


def summarize(records: Records, quick: bool) -> dict[str, Any]:
    st = lm_study(quick)
    rows = records.where(part="lm")
    by_c: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        by_c.setdefault(r["contender"], {})[r["seed"]] = r
    seeds = sorted(set.intersection(*[set(v) for v in by_c.values()])) if by_c else []
    table = {c: {"test_bpc": mean_se([per[s]["test_bpc"] for s in seeds]),
                 "val_bpc": mean_se([per[s]["val_bpc"] for s in seeds]),
                 "cpu_s": mean_se([per[s]["cpu_s"] for s in seeds])[0],
                 "evals": mean_se([per[s]["evals"] for s in seeds])[0]}
             for c, per in by_c.items()}
    out: dict[str, Any] = {"T": st.T, "budget_cpu_s": st.budget, "seeds": seeds,
                           "table": table,
                           "model": {"d_model": st.d_model, "n_layers": st.n_layers,
                                     "n_heads": st.n_heads, "context": st.context,
                                     "batch_size": st.batch_size, "windows": st.windows}}
    if FORWARD in by_c and seeds:
        fwd = [by_c[FORWARD][s]["test_bpc"] for s in seeds]
        others = [c for c in ("recipe", "schedulefree") if c in by_c
                  and all(s in by_c[c] for s in seeds)]
        if others:
            ref = min(others, key=lambda c: table[c]["test_bpc"][0])
            out["lm_forward_vs_recipe"] = ratio_se(fwd, [by_c[ref][s]["test_bpc"]
                                                         for s in seeds])
            out["reference"] = ref
        if "tpe" in by_c and all(s in by_c["tpe"] for s in seeds):
            out["lm_forward_vs_tpe"] = ratio_se(fwd, [by_c["tpe"][s]["test_bpc"] for s in seeds])
    if "forward_schedulefree" in by_c and "reference" in out and all(
            s in by_c["forward_schedulefree"] for s in seeds):
        out["lm_forward_schedulefree_vs_recipe"] = ratio_se(
            [by_c["forward_schedulefree"][s]["test_bpc"] for s in seeds],
            [by_c[out["reference"]][s]["test_bpc"] for s in seeds])
    if "forward_scales" in by_c and "reference" in out and all(
            s in by_c["forward_scales"] for s in seeds):
        fs = [by_c["forward_scales"][s]["test_bpc"] for s in seeds]
        out["lm_forward_scales_vs_recipe"] = ratio_se(
            fs, [by_c[out["reference"]][s]["test_bpc"] for s in seeds])
        if "tpe_scales" in by_c and all(s in by_c["tpe_scales"] for s in seeds):
            out["lm_forward_scales_vs_tpe_scales"] = ratio_se(
                fs, [by_c["tpe_scales"][s]["test_bpc"] for s in seeds])
    if "forward_scales_sign" in by_c and "reference" in out and all(
            s in by_c["forward_scales_sign"] for s in seeds):
        out["lm_forward_scales_sign_vs_recipe"] = ratio_se(
            [by_c["forward_scales_sign"][s]["test_bpc"] for s in seeds],
            [by_c[out["reference"]][s]["test_bpc"] for s in seeds])
    if "forward" in by_c and "reference" in out:  # the sign-step contender, for comparison
        out["lm_forward_sign_vs_recipe"] = ratio_se(
            [by_c["forward"][s]["test_bpc"] for s in seeds],
            [by_c[out["reference"]][s]["test_bpc"] for s in seeds])
    return out


def plot(records: Records, quick: bool, path: Any) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = records.where(part="lm")
    if not rows:
        return None
    st = lm_study(quick)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"forward": "C3", "recipe": "C1", "schedulefree": "C2", "tpe": "C4",
              "forward_defaults": "C5", "forward_schedulefree": "C0", "forward_scales": "C6",
              "tpe_scales": "C7", "forward_scales_sign": "C8"}
    seen = set()
    for r in sorted(rows, key=lambda r: (r["contender"], r["seed"])):
        c = r["contender"]
        first = c not in seen
        seen.add(c)
        ax.plot(r["curve"]["t"], r["curve"]["lr"], color=colors.get(c, "k"),
                alpha=1.0 if first else 0.35, lw=1.6 if first else 0.8,
                label=f"{c} (test {r['test_bpc']:.3f} bits/char)" if first else None)
    ax.set_yscale("log")
    ax.set_xlabel("inner step")
    ax.set_ylabel("learning rate (schedule-free: its base lr)")
    ax.legend(fontsize=7)
    ax.set_title(f"char LM on the standard library: learned schedules, T = {st.T}, "
                 f"{st.budget:g} CPU s per tuner", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
