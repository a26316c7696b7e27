"""hypergrad against Optuna (TPE) and random search at an equal wall-clock budget.

For each problem (an experiment preset, bundled data) three tuners get the same budget ``B``
seconds on this machine, one run at a time (each after the machine is quiet, contention
recorded), over the same search space (the preset's hyperparameters in the raw coordinates the
Trainer optimizes, each in a box: the preset's bounds, else ``init +- log(100)`` for log
transforms, ``[-6, 6]`` for logit, ``init +- 1`` for identity):

- hypergrad: the preset's method and outer optimizer (``hypergrad.Trainer``), projected into
  the box, stopped by ``guards.time_budget``;
- TPE: ``optuna.samplers.TPESampler(seed)``, ask/tell, one full inner training per trial;
- random: ``optuna.samplers.RandomSampler(seed)``.

Optuna starts from the preset's initial point (enqueued), as hypergrad does. Seed ``s`` sets the
model's initialisation, the mini-batch order and the sampler's seed; the data split is the same
for all (``task.data_seed``). A tuner's result is the best validation loss among the points it
evaluated within ``B``; those hyperparameters are retrained from scratch with fresh seeds and
judged on the test split. Budgets are also given in gradient-equivalents (plain inner steps; a
hypergradient counts as its measured time over a plain run's).

    python experiments/vs_optuna.py            # the full run (~40 min on 2 cores)
    python experiments/vs_optuna.py --quick    # 2 seeds, shorter budgets (< 10 min)

Writes the JSON (``experiments/results/vs_optuna.json``; with --quick,
``outputs/vs_optuna_quick/``) and one PNG of anytime curves per problem beside it; prints the
table; the last line is ``vs_optuna wins=<w>/<n> seeds=<s>``.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "experiments", ROOT / "experiments" / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _common as C  # noqa: E402  (wait_quiet, others_busy, interleaved_times)
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from tuners import Run, SearchSpace, plain_steps, run_optuna, run_trainer  # noqa: E402

from hypergrad.alloc import tune_malloc  # noqa: E402
from hypergrad.config import CONFIG_DIR, build, register_configs  # noqa: E402
from hypergrad.errors import HypergradWarning  # noqa: E402
from hypergrad.run.files import dumps  # noqa: E402

TUNERS = ("hypergrad", "tpe", "random")
DATA_SEED = 0  # one split for every seed and tuner: seeds change initialisation and batches
RETRAIN_SEED0 = 1000  # retraining seeds: 1000, 1001, ... (never tuning seeds)


@dataclass(frozen=True)
class Problem:
    """An experiment preset and its budget (seconds, full run and --quick)."""

    preset: str
    budget: float
    quick_budget: float
    overrides: tuple[str, ...] = ()
    note: str = ""


PROBLEMS: dict[str, Problem] = {
    "digits_schedule": Problem("digits_schedule", 30.0, 10.0,
                               note="MLP, lr schedule (5) + momentum + per-tensor wd (4)"),
    "breast_cancer_l2": Problem("breast_cancer_l2", 10.0, 4.0,
                                note="logistic regression, one L2 per feature"),
    "cnn_digits": Problem("cnn_digits", 40.0, 12.0,
                          note="CNN, lr schedule (5) + momentum + per-tensor wd (6)"),
    "hypercleaning": Problem("hypercleaning", 15.0, 5.0,
                             note="softmax regression, one weight per training example"),
}


@dataclass
class Settings:
    seeds: list[int]
    retrain_seeds: list[int]
    budget_scale: float
    quick: bool
    max_wait: float
    retry_contended: int
    overrides: list[str] = field(default_factory=list)


def compose_cfg(problem: Problem, seed: int, extra: list[str]) -> DictConfig:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[
            f"experiment={problem.preset}", f"seed={seed}", f"task.data_seed={DATA_SEED}",
            "callbacks.progress=false",
            *problem.overrides, *extra])


def _quiet_build(cfg: DictConfig) -> tuple[Any, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypergradWarning)
        return build(cfg)


def hypergrad_run(problem: Problem, seed: int, space: SearchSpace, budget: float,
                  extra: list[str]) -> Run:
    cfg = compose_cfg(problem, seed, extra)
    cfg.guards.bounds = {k: [lo, hi] for k, (lo, hi) in space.value_bounds.items()}
    cfg.guards.time_budget = budget
    cfg.mode.outer_steps = 10**6  # the budget stops it
    task, trainer = _quiet_build(cfg)
    trainer.task.evaluate = None  # the samplers compute only the validation loss: so does it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypergradWarning)
        return run_trainer(trainer, space, "hypergrad", seed, budget)


def optuna_run(tuner: str, problem: Problem, seed: int, space: SearchSpace, budget: float,
               extra: list[str]) -> Run:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = compose_cfg(problem, seed, extra)
    task, _ = _quiet_build(cfg)
    p = task.problem
    sampler = (optuna.samplers.TPESampler(seed=seed) if tuner == "tpe"
               else optuna.samplers.RandomSampler(seed=seed))
    return run_optuna(p, space, budget, sampler, tuner, seed, start=p.init_raw())


def timed(fn: Any, st: Settings) -> tuple[Run, dict[str, Any]]:
    """Run ``fn()`` after the machine is quiet; a run during which other processes used more
    than a tenth of a core is run again (``retry_contended`` times) after waiting."""
    log: dict[str, Any] = {"waited_s": 0.0, "contended_runs": 0, "other_cpu_s": []}
    for attempt in range(st.retry_contended + 1):
        log["waited_s"] += C.wait_quiet(max_wait=st.max_wait)
        probe = C.others_busy()
        run = fn()
        other = probe()
        log["other_cpu_s"].append(round(other, 2))
        contended = C._contended(other, run.seconds, 0.1)
        log["contended"] = contended
        if contended:
            log["contended_runs"] += 1
            if attempt < st.retry_contended:
                continue
        break
    return run, log


def measure_costs(problem: Problem, st: Settings) -> dict[str, Any]:
    """Seconds of one plain inner run and of one hypergradient by the preset's method (median
    of 3, interleaved, contended calls repeated after a wait, unless ``max_wait`` is 0 or the run
    is ``--quick``, which must end in minutes on a busy machine), after
    one warm-up call of each (which also warms this process up for the timed runs)."""
    cfg = compose_cfg(problem, 0, st.overrides)
    task, trainer = _quiet_build(cfg)
    p, lam = task.problem, task.problem.init_raw()
    method = trainer.method
    C.wait_quiet(max_wait=st.max_wait)
    ts = C.interleaved_times({"plain": lambda: p.run(lam),
                              "hypergradient": lambda: method.hypergradient(p, lam)}, repeats=3,
                             max_other=0.1 if st.max_wait > 0 and not st.quick else math.inf)
    return {"plain_run_s": ts["plain"], "hypergradient_s": ts["hypergradient"],
            "ratio": ts["hypergradient"] / ts["plain"], "steps": p.steps,
            "plain_step_ms": 1e3 * ts["plain"] / p.steps, "method": method.name,
            "K": p.num_hyperparams}


def retrain(problem: Problem, lam: torch.Tensor, seeds: list[int], extra: list[str],
            cache: dict[int, Any]) -> list[dict[str, float]]:
    """The selected hyperparameters trained from scratch with each fresh seed (new
    initialisation and batch order, the same data): validation and test metrics."""
    out = []
    for s in seeds:
        if s not in cache:
            cache[s] = _quiet_build(compose_cfg(problem, s, extra))[0]
        task = cache[s]
        with torch.no_grad():
            out.append(task.evaluate(task.problem.run(lam)))
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": math.nan, "std": math.nan}
    if not all(math.isfinite(x) for x in xs):  # a tuner that finished nothing within B: inf
        return {"mean": statistics.fmean(xs), "std": math.nan}
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def compare(name: str, problem: Problem, st: Settings) -> dict[str, Any]:
    budget = (problem.quick_budget if st.quick else problem.budget) * st.budget_scale
    extra = list(st.overrides)
    cfg0 = compose_cfg(problem, st.seeds[0], extra)
    task0, _ = _quiet_build(cfg0)
    p0 = task0.problem
    bounds = (OmegaConf.to_container(cfg0.guards.bounds, resolve=True)
              if cfg0.guards.bounds is not None else {})
    space = SearchSpace.from_problem(p0.hyperparams, bounds)  # type: ignore[arg-type]
    costs = measure_costs(problem, st)
    print(f"\n== {name} (K={space.dim}, T={costs['steps']}, budget {budget:g} s): plain run "
          f"{costs['plain_run_s']:.3f} s, one hypergradient ({costs['method']}) "
          f"{costs['hypergradient_s']:.3f} s = {costs['ratio']:.2f} plain runs", flush=True)
    runs: dict[str, list[Run]] = {t: [] for t in TUNERS}
    logs: dict[str, list[dict[str, Any]]] = {t: [] for t in TUNERS}
    for i, seed in enumerate(st.seeds):
        order = TUNERS[i % 3:] + TUNERS[:i % 3]  # rotated: no tuner always runs first
        for tuner in order:
            if tuner == "hypergrad":
                fn = lambda: hypergrad_run(problem, seed, space, budget, extra)  # noqa: E731
            else:
                fn = (lambda tuner=tuner: optuna_run(tuner, problem, seed, space, budget,
                                                     extra))
            run, log = timed(fn, st)
            runs[tuner].append(run)
            logs[tuner].append(log)
            best, _ = run.best()
            print(f"  seed {seed} {tuner:<9} {len(run.within()):>4} evals in {budget:g} s, "
                  f"best val {best:.4f}{'  (contended)' if log['contended'] else ''}",
                  flush=True)
    cache: dict[int, Any] = {}
    steps, ratio = costs["steps"], costs["ratio"]
    plain_step_s = costs["plain_run_s"] / steps
    tuners: dict[str, Any] = {}
    for tuner in TUNERS:
        per_seed = []
        for run, log in zip(runs[tuner], logs[tuner]):
            best, idx = run.best()
            # nothing finished within the budget: the tuner's answer is its starting point
            pick = run.lams[idx] if idx >= 0 else run.lams[0]
            metrics = retrain(problem, pick, st.retrain_seeds, extra, cache)
            mean = {k: statistics.fmean(m[k] for m in metrics) for k in metrics[0]}
            per_seed.append({
                "seed": run.seed, "val_at_budget": best, "evals": len(run.within()),
                "evals_all": len(run.times), "seconds": run.seconds,
                "grad_equivalents": plain_steps(run, steps, ratio),
                "best_index": idx, "best_time": run.times[idx] if idx >= 0 else None,
                "retrain": mean, "retrain_runs": metrics,
                "values": p0.hyperparams.describe(pick) if space.dim <= 64 else None,
                "curve": {"t": run.times, "val": run.losses}, **run.info, **log})
        keys = list(per_seed[0]["retrain"])
        tuners[tuner] = {
            "val_at_budget": _stats([s["val_at_budget"] for s in per_seed]),
            "evals": _stats([s["evals"] for s in per_seed]),
            "grad_equivalents": _stats([s["grad_equivalents"] for s in per_seed]),
            "retrain": {k: _stats([s["retrain"][k] for s in per_seed]) for k in keys},
            "contended_runs": sum(s["contended_runs"] for s in per_seed),
            "contended_kept": sum(bool(s["contended"]) for s in per_seed),
            "seeds": per_seed}
    hg = tuners["hypergrad"]["val_at_budget"]["mean"]
    win = all(hg < tuners[t]["val_at_budget"]["mean"] for t in TUNERS if t != "hypergrad")
    return {"preset": problem.preset, "note": problem.note, "K": space.dim, "T": steps,
            "budget_s": budget, "budget_grad_equivalents": budget / plain_step_s,
            "costs": costs, "space": {"names": space.names if space.dim <= 64 else None,
                                      "low": space.low.tolist() if space.dim <= 64 else None,
                                      "high": space.high.tolist() if space.dim <= 64 else None,
                                      "value_bounds": space.value_bounds},
            "hypergrad_wins": win, "tuners": tuners}


def plot(name: str, res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget = res["budget_s"]
    grid = [budget * i / 400 for i in range(401)]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {"hypergrad": "C3", "tpe": "C0", "random": "C2"}
    drawn = 0
    for tuner, tr in res["tuners"].items():
        curves = []
        for s in tr["seeds"]:
            run = Run(tuner, s["seed"], budget, s["curve"]["t"],
                      [math.inf if v is None else v for v in s["curve"]["val"]])
            curves.append(run.curve(grid))
        xs, mean, lo, hi = [], [], [], []
        for j, g in enumerate(grid):
            col = [c[j] for c in curves]
            if all(math.isfinite(v) for v in col):
                xs.append(g)
                mean.append(statistics.fmean(col))
                lo.append(min(col))
                hi.append(max(col))
        if not xs:
            continue
        label = (f"{tuner}: {tr['val_at_budget']['mean']:.4f} ({tr['evals']['mean']:.0f} "
                 f"{'outer steps' if tuner == 'hypergrad' else 'trials'})")
        ax.plot(xs, mean, color=colors[tuner], label=label)
        ax.fill_between(xs, lo, hi, color=colors[tuner], alpha=0.15, lw=0)
        drawn += 1
    if drawn:
        ax.set_yscale("log")
        ax.legend()
    ax.set_xlabel("wall clock (s)")
    ax.set_ylabel("best validation loss so far")
    n = len(next(iter(res["tuners"].values()))["seeds"])
    ax.set_title(f"{name} (K = {res['K']}): mean and min-max over {n} seeds")
    ax.set_xlim(0, budget)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pm(s: dict[str, float], fmt: str = ".4f") -> str:
    return f"{s['mean']:{fmt}} ± {s['std']:{fmt}}"


def table(results: dict[str, Any]) -> str:
    head = (f"{'problem':<17}{'K':>4}{'B (s)':>7}{'B (grad-eq)':>12}  {'tuner':<10}"
            f"{'evals':>7}{'grad-eq':>9}  {'val loss at B':>17}  {'test loss (retrained)':>21}"
            f"  {'test acc':>8}")
    lines = [head, "-" * len(head)]
    for name, res in results.items():
        for j, (tuner, tr) in enumerate(res["tuners"].items()):
            first = j == 0
            acc = tr["retrain"].get("test_acc")
            tl = tr["retrain"].get("test_loss") or tr["retrain"].get("test_mse")
            lines.append(
                (f"{name:<17}{res['K']:>4}{res['budget_s']:>7.0f}"
                 f"{res['budget_grad_equivalents']:>12.0f}  " if first else " " * 42)
                + f"{tuner:<10}{tr['evals']['mean']:>7.1f}{tr['grad_equivalents']['mean']:>9.0f}"
                + f"  {_pm(tr['val_at_budget']):>17}  {_pm(tl) if tl else '-':>21}"
                + f"  {acc['mean'] if acc else math.nan:>8.4f}"
                + ("  <- best" if min(res["tuners"], key=lambda t: res["tuners"][t]
                                      ["val_at_budget"]["mean"]) == tuner else ""))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds, shorter budgets (< 10 min)")
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    ap.add_argument("--seeds", type=int, default=None, help="tuning seeds (default 5; quick 2)")
    ap.add_argument("--retrain-seeds", type=int, default=None,
                    help="fresh seeds per selected point (default 5; quick 2)")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply every budget")
    ap.add_argument("--max-wait", type=float, default=None,
                    help="seconds to wait for a quiet machine before a run (default 600; "
                         "quick 10)")
    ap.add_argument("--retry-contended", type=int, default=None,
                    help="run a contended run again (after waiting) up to this many times "
                         "(default 1; quick 0)")
    ap.add_argument("--out", default=None, help="folder for the JSON and PNGs")
    ap.add_argument("--override", action="append", default=[],
                    help="an extra Hydra override for every run (e.g. outer_optimizer.lr=0.3)")
    args = ap.parse_args()
    n_seeds = args.seeds if args.seeds is not None else (2 if args.quick else 5)
    n_retrain = (args.retrain_seeds if args.retrain_seeds is not None
                 else (2 if args.quick else 5))
    st = Settings(seeds=list(range(n_seeds)),
                  retrain_seeds=list(range(RETRAIN_SEED0, RETRAIN_SEED0 + n_retrain)),
                  budget_scale=args.budget_scale, quick=args.quick,
                  max_wait=args.max_wait if args.max_wait is not None else
                  (10.0 if args.quick else 600.0),
                  retry_contended=args.retry_contended if args.retry_contended is not None
                  else (0 if args.quick else 1), overrides=args.override)
    out = Path(args.out) if args.out else (ROOT / "outputs" / "vs_optuna_quick" if args.quick
                                           else ROOT / "experiments" / "results")
    out.mkdir(parents=True, exist_ok=True)
    tune_malloc()
    register_configs()
    import optuna

    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    for name in args.problems:
        results[name] = compare(name, PROBLEMS[name], st)
        png = out / f"vs_optuna_{name}.png"
        plot(name, results[name], png)
        results[name]["png"] = png.name
    wins = sum(bool(r["hypergrad_wins"]) for r in results.values())
    payload = {
        "summary": {"wins": wins, "problems": len(results), "seeds": n_seeds},
        "protocol": {
            "tuners": {"hypergrad": "the preset's method and outer optimizer (hypergrad.Trainer, "
                                    "time_budget=B, bounds = the search box)",
                       "tpe": "optuna.samplers.TPESampler(seed=s), ask/tell",
                       "random": "optuna.samplers.RandomSampler(seed=s), ask/tell"},
            "objective": "validation loss E(w_T) after one full inner run (T steps)",
            "result": "best validation loss among the points evaluated within B seconds",
            "start": "Optuna's first trial is the preset's initial point (hypergrad's first)",
            "space": "raw coordinates; preset bounds, else init +- log(100) (log), [-6, 6] "
                     "(logit), init +- 1 (identity)",
            "seeds": st.seeds, "retrain_seeds": st.retrain_seeds, "data_seed": DATA_SEED,
            "quick": st.quick, "budget_scale": st.budget_scale, "overrides": st.overrides,
            "contention": f"wait_quiet(max_wait={st.max_wait:g}) before each run; a run "
                          f"during which other processes used > 0.1 core is run again up to "
                          f"{st.retry_contended} times; counts per tuner (contended_runs: all "
                          f"runs that saw contention, contended_kept: results kept from one)",
        },
        "machine": C.machine(), "optuna": optuna.__version__,
        "python": platform.python_version(), "seconds": time.perf_counter() - t0,
        "problems": results,
    }
    path = out / ("vs_optuna.json" if not args.quick else "vs_optuna_quick.json")
    path.write_text(dumps(payload, indent=1))  # strict JSON: inf/NaN as null
    print()
    print(table(results))
    print(f"\n# {len(st.seeds)} tuning seeds, {len(st.retrain_seeds)} retraining seeds each; "
          f"{payload['seconds'] / 60:.1f} min; JSON: {path}")
    print(f"vs_optuna wins={wins}/{len(results)} seeds={n_seeds}")


if __name__ == "__main__":
    main()
