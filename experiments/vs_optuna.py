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

``--suite`` (issue 27) runs instead the problems of ``experiments/suite.py`` (never tuned on:
a development and an evaluation half) with the Trainer's **defaults**
(``Trainer(problem, guards=Guards(bounds=box, time_budget=B, clock="cpu"))``, nothing else
chosen; the clock only says how the budget is measured) against
Optuna's TPE, TPE with the Hyperband pruner over inner steps, random search and CMA-ES, and the
ablation (the same defaults with the hypergradient replaced by a zeroth-order estimate,
:class:`tuners.ZerothOrder`). Every contender gets the same box (the problem's), the same
budget rule (the time of ``suite.BUDGET_PLAIN_RUNS`` plain trainings of the problem), the
same seeds; every contender runs in this one process on one thread and budgets are measured in
its CPU time (``time.process_time``, :data:`CLOCK`), which other processes' load does not
inflate (on a quiet machine, the wall clock); its best-on-validation point is retrained with
fresh seeds and judged on test.
Writes ``experiments/results/vs_optuna_suite.json`` (``--quick``: ``outputs/``) and a PNG of
anytime curves per half; the last line is ``vs_optuna_suite eval_win_rate=<a>
eval_worst_ratio=<b> ablation_win_rate=<c> problems=<n> seeds=<s>``.

    python experiments/vs_optuna.py --suite           # 17 problems, 3 seeds (~25 min)
    python experiments/vs_optuna.py --suite --quick   # 2 problems, 1 seed, tiny budgets

More seeds in pieces: ``--first-seed 10 --seeds 10`` runs tuning seeds 10-19; ``--half none
--seeds 20 --join A.json B.json ...`` joins runs over disjoint seeds, seed by seed; ``--replace
C.json ...`` puts reruns of some contenders (``--tuners hypergrad ablation``, after a default
changed) in place of theirs. The committed summary: the halves' seeds 0-9 and 10-19 (four
files), hypergrad's and the ablation's columns replaced by the two-orders reruns (four more).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
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
from tuners import (  # noqa: E402
    REPORTS,
    Run,
    SearchSpace,
    ZerothOrder,
    plain_steps,
    run_optuna,
    run_trainer,
    sampler,
)

from hypergrad.alloc import tune_malloc  # noqa: E402
from hypergrad.config import CONFIG_DIR, build, register_configs  # noqa: E402
from hypergrad.errors import HypergradWarning  # noqa: E402
from hypergrad.run.files import dumps  # noqa: E402

TUNERS = ("hypergrad", "tpe", "random")
DATA_SEED = 0  # one split for every seed and tuner: seeds change initialisation and batches
RETRAIN_SEED0 = 1000  # retraining seeds: 1000, 1001, ... (never tuning seeds)
SUITE_RETRAIN = list(range(RETRAIN_SEED0, RETRAIN_SEED0 + 3))
"""The suite's retraining seeds (``--suite``'s default ``--retrain-seeds 3``)."""


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
            best, idx = run.chosen()
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


def _same_size(flag: str, path: str, protocol: dict[str, Any], quick: bool) -> None:
    """Refuse an earlier run of the other size: --join of two --quick pieces wrote the
    committed file's name, labelled "quick": false (the experiment scripts probe)."""
    was = bool(protocol.get("quick", False))
    if was != quick:
        raise SystemExit(f"{flag} {path}: a {'--quick' if was else 'full'} run's, and this "
                         f"run is {'--quick' if quick else 'full'}: combine runs of one size")


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
    # an IndexError at the first seed, or after all the tuning at the first retraining seed,
    # and a budget's Hydra error that named time_budget, not --budget-scale
    for flag, v in (("--seeds", args.seeds), ("--retrain-seeds", args.retrain_seeds)):
        if v is not None and v < 1:
            ap.error(f"{flag} {v}: must be an int >= 1")
    if not (math.isfinite(args.budget_scale) and args.budget_scale > 0):
        ap.error(f"--budget-scale {args.budget_scale}: must be a finite number > 0")
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




# -- the suite (issue 27) ---------------------------------------------------------------------
SUITE_TUNERS = ("hypergrad", "ablation", "tpe", "tpe_hyperband", "random", "cmaes")
CONTENDERS = ("tpe", "tpe_hyperband", "random", "cmaes")  # eval_worst_ratio's "best contender"
QUICK_PROBLEMS = ("digits_sgd_lr_wd", "digits_adam_schedule")
# --suite --quick's budget: the start (3 plain runs) and one reverse-mode hypergradient
# (~10 plain runs here) with room for a slower hypergradient on a busy machine
QUICK_PLAIN_RUNS = 20
CHECKPOINTS = (0.125, 0.25, 0.5, 1.0)  # anytime test losses at these shares of the budget
# --join warns where a problem's pieces measured budgets further apart than this (max / min):
# pieces of 2026-11-29 run side by side agreed within 1.07x, those of 2026-12-07 (one
# process at a time, tests now and then on the other core) differed by up to 1.49x
BUDGET_SPREAD = 1.15


def _suite_task(name: str, seed: int, select: bool = False) -> Any:
    import suite

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypergradWarning)
        return suite.build(name, seed, select=select)


CLOCK = time.process_time
"""What every suite budget measures: this process's CPU time (the comparison runs on one
thread, ``torch.set_num_threads(1)``), which other processes' load does not inflate; on a
quiet machine it equals the wall clock."""


def _median_seconds(fn: Any, repeats: int) -> float:
    """Median CPU seconds (:data:`CLOCK`) of ``repeats`` calls of ``fn``, after a warm-up one."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        ts.append(CLOCK() - t0)
    return statistics.median(ts)


def _plain_seconds(name: str, repeats: int = 5) -> float:
    """Median CPU seconds of a plain training at the initial point (after a warm-up run)."""
    task = _suite_task(name, 0)
    p, lam = task.problem, task.problem.init_raw()
    with torch.no_grad():
        return _median_seconds(lambda: p.run(lam), repeats)


def _hypergradient_seconds(name: str, repeats: int = 3) -> float:
    """Median CPU seconds of one reverse-mode hypergradient (the method the defaults pick on
    every suite problem) at the initial point, after a warm-up one: with the plain run's, what
    a hypergradient costs in the budget's units (its ratio moves with either's speed)."""
    import hypergrad as hg

    task = _suite_task(name, 0)
    p, lam = task.problem, task.problem.init_raw()
    method = hg.ReverseMode()
    return _median_seconds(lambda: method.hypergradient(p, lam), repeats)


def _variants() -> dict[str, Any]:
    """Settings weighed on the development half (``--variants``): Trainer arguments other
    than the defaults. Each runs as contender ``hg_<name>``."""
    import functools

    import hypergrad as hg
    from hypergrad.run.outer import QuasiNewton
    from hypergrad.run.surrogate import Surrogate

    def qn(**kw: Any) -> Any:
        return lambda trainer_box: functools.partial(QuasiNewton, box=trainer_box, **kw)

    return {
        "old_defaults": dict(method="forward", outer=functools.partial(torch.optim.Adam,
                                                                       lr=0.05),
                             mode=hg.Offline(outer_steps=10)),
        "old_unlimited": dict(method="forward", outer=functools.partial(torch.optim.Adam,
                                                                        lr=0.05),
                              mode=hg.Offline(outer_steps=None)),
        "presets": dict(outer=functools.partial(hg.SignDescent, lr=0.5),
                        mode=hg.Offline(outer_steps=None), backtrack=1.5),
        "presets_start": dict(outer=functools.partial(hg.SignDescent, lr=0.5), backtrack=1.5),
        "adam_start": dict(outer=functools.partial(torch.optim.Adam, lr=0.05)),
        "no_start": dict(mode=hg.Offline(outer_steps=None)),
        "start_8": dict(mode=hg.Offline(outer_steps=None, start=8)),
        "step_0.3": dict(box_outer=qn(step=0.3)),
        "step_0.08": dict(box_outer=qn(step=0.08)),
        "no_expand": dict(box_outer=qn(expand=0)),
        "no_memory": dict(box_outer=qn(memory=0)),
        "surrogate": dict(box_outer=lambda box: functools.partial(Surrogate, box=box)),
        "no_surrogate": dict(box_outer=qn()),
        "surrogate_t6": dict(box_outer=lambda box: functools.partial(Surrogate, box=box,
                                                                      trials=6)),
        "exact_gradients": dict(outer=functools.partial(Surrogate, grad_noise=(0.0,))),
        "surrogate_tape": dict(box_outer=lambda box: functools.partial(Surrogate, box=box),
                               method=hg.ReverseMode(tape=True)),
        "forward": dict(method="forward"),
        "no_leftover": dict(search={"leftover": False}),
        "no_rough_plain": dict(search={"rough_plain": False}),
        "no_trial_forecast": dict(search={"trial_forecast": False}),
        "no_recheck_first": dict(search={"recheck_first": False}),
        "independent_start": dict(search={"shared_start": ()}),
        "shared_start_all": dict(search={"shared_start": ("schedule", "per_example", "per_tensor",
                                                           "array")}),
        "no_smooth": dict(search={"smooth_schedule": None}),
        "smooth_0.3": dict(search={"smooth_schedule": 0.3}),
        "smooth_0.1": dict(search={"smooth_schedule": 0.1}),
        "reinit": dict(suite_patch={"MODEL_FACTORY": True}),
        "tape": dict(method=hg.ReverseMode(tape=True)),
        "select_50": dict(suite_patch={"SELECT_SHARE": 0.5}),
        "select_30": dict(suite_patch={"SELECT_SHARE": 0.3}),
        "one_order": dict(search={"two_orders": 0}),
        # the development-half probe before two orders became the default (K <= 100): every K
        "two_orders": dict(search={"two_orders": 10 ** 6}),
    }


@contextlib.contextmanager
def _settings(module: Any, values: dict[str, Any]) -> Iterator[None]:
    """Inside, ``module``'s attributes set to ``values`` (a variant's settings, for one run);
    restored after."""
    saved = {k: getattr(module, k) for k in values}
    try:
        for k, v in values.items():
            setattr(module, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def suite_run(tuner: str, name: str, seed: int, budget: float) -> Run:
    """One contender on problem ``name`` at tuning seed ``seed`` within ``budget`` seconds."""
    import suite

    import hypergrad as hg

    kw: dict[str, Any] = dict(_variants()[tuner[3:]]) if tuner.startswith("hg_") else {}
    trainer_like = tuner in ("hypergrad", "ablation") or tuner.startswith("hg_")
    with _settings(suite, kw.pop("suite_patch", {})):  # the problem's construction
        task = _suite_task(name, seed, select=trainer_like)
    p = task.problem
    space = SearchSpace.from_problem(p.hyperparams, task.bounds, dtype=p.dtype)
    if trainer_like:
        if tuner == "ablation":
            kw["method"] = ZerothOrder(space, seed=seed)
        backtrack = kw.pop("backtrack", None)
        box_outer = kw.pop("box_outer", None)
        if "search" in kw:  # the default mode with other search settings
            kw["mode"] = hg.Offline.default(search=kw.pop("search"))
        trainer = hg.Trainer(p, guards=hg.Guards(bounds=task.bounds, time_budget=budget,
                                                 backtrack=backtrack, clock="cpu"),
                             callbacks=[hg.run.Log(None), hg.run.Progress(False)], **kw)
        if box_outer is not None:
            trainer.outer = box_outer(trainer.box)([trainer.lam])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HypergradWarning)
            return run_trainer(trainer, space, tuner, seed, budget, clock=CLOCK)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = p.init_raw()
    pruner = (optuna.pruners.HyperbandPruner(min_resource=1, max_resource=p.steps,
                                             reduction_factor=3)
              if tuner == "tpe_hyperband" else None)
    return run_optuna(p, space, budget, sampler(tuner, seed, space, start), tuner, seed,
                      start=start, pruner=pruner, clock=CLOCK)


def _test_at(name: str, lam: torch.Tensor, seeds: list[int]) -> list[dict[str, float]]:
    out = []
    for s in seeds:
        task = _suite_task(name, s)
        with torch.no_grad():
            out.append(task.test(task.problem.run(lam)))
    return out


def suite_problem(name: str, seeds: list[int], retrain: list[int], n_plain: int,
                  tuners: tuple[str, ...], log: Any = print) -> dict[str, Any]:
    """Every contender on one problem: budgets, runs, retrained test losses, anytime tests."""
    import suite

    plain = _plain_seconds(name)
    budget = n_plain * plain
    cost = _hypergradient_seconds(name) / plain
    K = suite.PROBLEMS[name].K
    log(f"\n== {name} (K={K}, plain run {plain:.3f} s, budget {budget:.2f} s = {n_plain} plain "
        f"runs; a hypergradient {cost:.2f} plain runs)")
    out: dict[str, Any] = {"K": K, "plain_run_s": plain, "budget_s": budget,
                           "hypergradient_plain_runs": cost,
                           "note": suite.PROBLEMS[name].note, "tuners": {}}
    per: dict[str, list[dict[str, Any]]] = {t: [] for t in tuners}
    for i, seed in enumerate(seeds):
        order = tuners[i % len(tuners):] + tuners[:i % len(tuners)]  # rotated
        for tuner in order:
            probe = C.others_busy()
            run = suite_run(tuner, name, seed, budget)
            other = probe()
            best, pick = run.answer()  # the Trainer's re-checked point, else the best
            tests = _test_at(name, pick, retrain)
            anytime = []
            for share in CHECKPOINTS:  # the test loss of the incumbent, same-seed model
                b, j = run.best(share * budget)
                anytime.append(None if j < 0 else
                               _test_at(name, run.lams[j], [seed])[0]["test_loss"])
            rec = {"seed": seed, "val_at_budget": best, "evals": len(run.within()),
                   "hypergradients": len([j for j in run.info.get("hypergradients", [])
                                          if run.times[j] <= budget]),
                   "seconds": run.seconds, "other_cpu_s": round(other, 2),
                   "test_loss": statistics.fmean(t["test_loss"] for t in tests),
                   "test_acc": (statistics.fmean(t["test_acc"] for t in tests)
                                if "test_acc" in tests[0] else None),
                   "anytime_test": anytime,
                   "curve": {"t": run.times, "val": run.losses},
                   "info": {k: v for k, v in run.info.items() if k != "hypergradients"}}
            per[tuner].append(rec)
            log(f"  seed {seed} {tuner:<14}{rec['evals']:>4} evals, best val {best:.4f}, "
                f"test {rec['test_loss']:.4f}")
    for tuner in tuners:
        out["tuners"][tuner] = _tuner_summary(per[tuner])
    return out


def _tuner_summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's per-seed records of one problem and their statistics."""
    return {"test_loss": _stats([r["test_loss"] for r in rs]),
            "val_at_budget": _stats([r["val_at_budget"] for r in rs]),
            "evals": _stats([r["evals"] for r in rs]),
            "anytime_test": [_stats([r["anytime_test"][k] for r in rs])["mean"]
                             for k in range(len(CHECKPOINTS))],
            "seeds": rs}


def _plain_runs(protocol: dict[str, Any], default: int) -> int:
    """The budget rule of an earlier ``--suite`` run's JSON: its plain runs (read from the
    budget's words in a JSON written before ``plain_runs`` was; ``default`` where neither
    says)."""
    if "plain_runs" in protocol:
        return int(protocol["plain_runs"])
    import re

    m = re.search(r"the time of (\d+) plain", str(protocol.get("budget", "")))
    return int(m.group(1)) if m else default


def join_seeds(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The problems of several ``--suite`` runs (path -> its JSON) over disjoint tuning seeds,
    joined seed by seed: each problem's contenders (those every run has) with the union of
    the runs' per-seed records, statistics recomputed; ``budget_s`` the runs' mean, each in
    ``budgets_s`` (each run times its own plain runs: the same rule, the same machine)."""
    out: dict[str, dict[str, Any]] = {}
    names = [n for r in runs.values() for n in r["problems"]]
    for name in dict.fromkeys(names):
        parts = {p: r["problems"][name] for p, r in runs.items() if name in r["problems"]}
        tuners = [t for t in next(iter(parts.values()))["tuners"]
                  if all(t in q["tuners"] for q in parts.values())]
        every = dict.fromkeys(t for q in parts.values() for t in q["tuners"])
        dropped = [t for t in every if t not in tuners]
        if dropped:  # they were left out without a word (a run of fewer contenders joined)
            short = [p for p, q in parts.items() if not set(dropped) <= set(q["tuners"])]
            print(f"--join: {name}: contenders {dropped} are not in every joined run "
                  f"({', '.join(short)} lacks some): left out of the joined table", flush=True)
        if not tuners:
            raise SystemExit(f"--join: {name}: no contender is in every joined run")
        seen: dict[int, str] = {}
        for path, q in parts.items():
            for r in q["tuners"][tuners[0]]["seeds"]:
                if r["seed"] in seen:
                    raise SystemExit(f"--join: {name} has tuning seed {r['seed']} in both "
                                     f"{seen[r['seed']]} and {path}; join runs of disjoint "
                                     f"seeds (--first-seed)")
                seen[r["seed"]] = path
        first = next(iter(parts.values()))
        budgets = [q["budget_s"] for q in parts.values()]
        spread = max(budgets) / min(budgets)
        if spread > BUDGET_SPREAD:  # the pieces' tuners had budgets this far apart
            print(f"--join: {name}: the joined runs measured budgets "
                  f"{', '.join(f'{b:.2f}' for b in budgets)} s ({spread:.2f}x apart, over "
                  f"{BUDGET_SPREAD}x): the machine's load differed between them; rerun the "
                  f"pieces on a machine as loaded in each (nothing else running, or both "
                  f"halves side by side)", flush=True)
        costs = [q["hypergradient_plain_runs"] for q in parts.values()
                 if "hypergradient_plain_runs" in q]  # runs before 2026-12-07 lack it
        out[name] = {**first, "budget_s": statistics.fmean(budgets), "budgets_s": budgets,
                     "budget_spread": spread,
                     "hypergradient_plain_runs": statistics.fmean(costs) if costs else None,
                     "plain_run_s": statistics.fmean(q["plain_run_s"] for q in parts.values()),
                     "tuners": {t: _tuner_summary(sorted(
                         (r for q in parts.values() for r in q["tuners"][t]["seeds"]),
                         key=lambda r: r["seed"])) for t in tuners}}
    return out


def replace_tuners(results: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]
                   ) -> dict[str, dict[str, Any]]:
    """``results`` with the contenders of ``new`` (joined runs of some contenders: hypergrad
    and its ablation after a default changed) in place of theirs, problem by problem; the
    other contenders' records are kept. Each replaced contender must cover the same tuning
    seeds; ``replaced`` lists them, ``replaced_budgets_s`` the new runs' budgets (each run
    times its own plain runs)."""
    out = {n: {**r, "tuners": dict(r["tuners"])} for n, r in results.items()}
    for name, r in new.items():
        if name not in out:
            raise SystemExit(f"--replace: {name} is in no joined run; replace contenders of "
                             f"problems the runs to --join have")
        for t, col in r["tuners"].items():
            if t not in out[name]["tuners"]:
                raise SystemExit(f"--replace: {name} has no contender {t!r} to replace")
            was = sorted(x["seed"] for x in out[name]["tuners"][t]["seeds"])
            got = sorted(x["seed"] for x in col["seeds"])
            if got != was:
                raise SystemExit(f"--replace: {name}'s {t} covers tuning seeds {got}, the "
                                 f"joined runs {was}")
            out[name]["tuners"][t] = col
        out[name]["replaced"] = sorted(r["tuners"])
        out[name]["replaced_budgets_s"] = r["budgets_s"]
    kept = [n for n in out if n not in new]
    if kept:  # only the JSON's "replaced": null said so
        print(f"--replace: {kept} are in no replacing run: their contenders' columns stay the "
              f"joined runs'", flush=True)
    return out


def paired(results: dict[str, Any], name: str, a: str, b: str) -> dict[str, Any] | None:
    """Contender ``a`` against ``b`` on problem ``name``, tuning seed by tuning seed (the same
    seed: the same initial weights and batch order): the mean of ``log(test a / test b)``, its
    standard error over the seeds, and the seeds where ``a`` is lower and higher. Which
    differences of the means stand out of the seeds' noise (``|mean| > 2 se``)."""
    tuners = results[name]["tuners"]
    if a not in tuners or b not in tuners:
        return None
    tb = {r["seed"]: r["test_loss"] for r in tuners[b]["seeds"]}
    d = [math.log(r["test_loss"] / tb[r["seed"]]) for r in tuners[a]["seeds"]
         if r["seed"] in tb and r["test_loss"] > 0 and tb[r["seed"]] > 0]
    if not d:
        return None
    from horizon_common import mean_se

    m, se = mean_se(d)
    return {"log_ratio": m, "se": None if math.isnan(se) else se,  # one seed: null in the JSON
            "seeds": len(d), "lower": sum(x < 0 for x in d), "higher": sum(x > 0 for x in d)}


def suite_summary(results: dict[str, Any], split: dict[str, list[str]],
                  seeds: int) -> dict[str, Any]:
    """Win rates per half (hypergrad's mean test loss below TPE's), the worst ratio to the
    best Optuna contender on the evaluation half, and the ablation's win rate."""
    def mean(name: str, tuner: str) -> float:
        return float(results[name]["tuners"][tuner]["test_loss"]["mean"])

    out: dict[str, Any] = {"problems": len(results), "seeds": seeds}
    for half in ("dev", "eval"):
        names = [n for n in split[half] if n in results]
        if not names or "tpe" not in results[names[0]]["tuners"]:
            out[f"{half}_win_rate"] = None
            continue
        wins = [n for n in names if mean(n, "hypergrad") < mean(n, "tpe")]
        out[f"{half}_win_rate"] = len(wins) / len(names)
        out[f"{half}_problems"] = len(names)
        ratios = {n: mean(n, "hypergrad") / min(mean(n, t) for t in CONTENDERS
                                               if t in results[n]["tuners"])
                  for n in names}
        out[f"{half}_ratios"] = ratios
        out[f"{half}_worst_ratio"] = max(ratios.values())
        # the same yardstick for every contender (its mean over the best of the Optuna
        # contenders' other than itself): what the seeds' noise and a minimum over several
        # contenders give a tuner that is no better or worse than the rest
        ran = [t for t in ("hypergrad", *CONTENDERS) if t in results[names[0]]["tuners"]]
        out[f"{half}_worst_ratio_by_tuner"] = {
            t: max(mean(n, t) / min(mean(n, o) for o in ran if o not in (t, "hypergrad"))
                   for n in names)
            for t in ran if any(o not in (t, "hypergrad") for o in ran)}
        if "ablation" in results[names[0]]["tuners"]:
            out[f"{half}_ablation_win_rate"] = (
                sum(mean(n, "hypergrad") < mean(n, "ablation") for n in names) / len(names))
        # the same comparisons seed by seed (log ratios): which stand out of the noise
        out[f"{half}_paired"] = {n: {f"vs_{t}": paired(results, n, "hypergrad", t)
                                     for t in ("tpe", "ablation")} for n in names}
    out["ablation_win_rate"] = out.get("eval_ablation_win_rate")
    # joined runs: how far apart their budgets were (1.0 for one run; see BUDGET_SPREAD)
    out["max_budget_spread"] = max((r.get("budget_spread", 1.0) for r in results.values()),
                                   default=None)
    return out


def suite_table(results: dict[str, Any], split: dict[str, list[str]]) -> str:
    tuners = list(next(iter(results.values()))["tuners"])
    head = f"{'problem':<32}{'half':<5}{'K':>4}{'B (s)':>7}  " + "".join(
        f"{t:>15}" for t in tuners) + "  win"
    lines = [head, "-" * len(head)]
    for half in ("dev", "eval"):
        for name in split[half]:
            if name not in results:
                continue
            r = results[name]
            means = {t: r["tuners"][t]["test_loss"]["mean"] for t in tuners}
            best = min(means, key=lambda t: means[t])
            cells = "".join(f"{means[t]:>14.4f}{'*' if t == best else ' '}" for t in tuners)
            win = ("yes" if "tpe" in means and means["hypergrad"] < means["tpe"] else "no")
            lines.append(f"{name:<32}{half:<5}{r['K']:>4}{r['budget_s']:>7.1f}  {cells}  {win}")
    return "\n".join(lines)


def paired_table(summary: dict[str, Any]) -> str:
    """The summary's paired comparisons: per problem, ``log(hypergrad / other)`` mean +- its
    standard error over the tuning seeds, and the seeds hypergrad is lower / higher on; ``*``
    where the mean is more than two standard errors from 0."""
    def cell(x: dict[str, Any] | None) -> str:
        if x is None:
            return f"{'-':>24}"
        if x["se"] is None:  # one seed
            return f"{x['log_ratio']:>+8.3f}{'':>10} {x['lower']:>2}/{x['higher']:<2}"
        mark = "*" if abs(x["log_ratio"]) > 2 * x["se"] else " "
        return f"{x['log_ratio']:>+8.3f} +- {x['se']:.3f}{mark} {x['lower']:>2}/{x['higher']:<2}"

    head = (f"{'problem (paired by seed)':<32}{'half':<5}{'log(hg / TPE)  lower/higher':>28}"
            f"{'log(hg / ablation)':>26}")
    lines = [head, "-" * len(head)]
    for half in ("dev", "eval"):
        for name, r in (summary.get(f"{half}_paired") or {}).items():
            lines.append(f"{name:<32}{half:<5}    {cell(r['vs_tpe'])}  {cell(r['vs_ablation'])}")
    return "\n".join(lines)


def suite_plot(results: dict[str, Any], split: dict[str, list[str]], path: Path,
               half: str) -> None:
    """Anytime curves of one half: mean test loss of the incumbent (best on validation so
    far) at 1/8, 1/4, 1/2 and all of the budget, relative to TPE's at the budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in split[half] if n in results]
    if not names:
        return
    cols = 3
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    colors = {"hypergrad": "C3", "ablation": "C1", "tpe": "C0", "tpe_hyperband": "C9",
              "random": "C2", "cmaes": "C4"}
    for ax, name in zip(axes.flat, names):
        r = results[name]
        ref = r["tuners"].get("tpe", next(iter(r["tuners"].values())))["test_loss"]["mean"]
        xs = [c * r["budget_s"] for c in CHECKPOINTS]
        for tuner, tr in r["tuners"].items():
            ys = [None if v is None or not math.isfinite(v) else v / ref
                  for v in tr["anytime_test"]]
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, color=colors.get(tuner), label=tuner)
        ax.set_title(f"{name} (K={r['K']})", fontsize=9)
        ax.set_xlabel("CPU seconds", fontsize=8)
        ax.set_ylabel("test loss / TPE's at B", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"suite, {half} half: test loss of the best-on-validation point so far "
                 f"(mean over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def suite_main(argv: list[str] | None = None) -> dict[str, Any]:
    import optuna
    import suite

    ap = argparse.ArgumentParser(description="vs_optuna --suite (issue 27)")
    ap.add_argument("--suite", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help=f"{len(QUICK_PROBLEMS)} problems, 1 seed, 1 retraining seed, budgets "
                         f"of {QUICK_PLAIN_RUNS} plain runs (room for the start and a "
                         f"hypergradient, also on a loaded machine)")
    ap.add_argument("--problems", nargs="+", default=None, choices=list(suite.PROBLEMS))
    ap.add_argument("--half", choices=("dev", "eval", "both", "none"), default="both")
    ap.add_argument("--seeds", type=int, default=None, help="tuning seeds (default 3)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the first tuning seed (default 0): --first-seed 10 --seeds 10 runs "
                         "seeds 10-19, to --join with a run of seeds 0-9")
    ap.add_argument("--retrain-seeds", type=int, default=None, help="default 3")
    ap.add_argument("--plain-runs", type=int, default=None,
                    help=f"the budget in plain runs (default {suite.BUDGET_PLAIN_RUNS})")
    ap.add_argument("--tuners", nargs="+", default=list(SUITE_TUNERS),
                    choices=list(SUITE_TUNERS))
    ap.add_argument("--variants", nargs="+", default=[], choices=list(_variants()),
                    help="also run these settings of the Trainer (dev-half evidence)")
    ap.add_argument("--out", default=None, help="folder for the JSON and PNGs")
    ap.add_argument("--name", default="vs_optuna_suite", help="the JSON's file stem")
    ap.add_argument("--merge", nargs="+", default=[],
                    help="JSONs of earlier --suite runs (the same code, seeds and budget "
                         "rule) whose problems not run now join the table and the summary "
                         "(with --half none: only merge)")
    ap.add_argument("--join", nargs="+", default=[],
                    help="JSONs of earlier --suite runs over disjoint tuning seeds (the same "
                         "code, retraining seeds and budget rule), joined seed by seed; only "
                         "with --half none (nothing run); --seeds and --first-seed name the "
                         "union")
    ap.add_argument("--replace", nargs="+", default=[],
                    help="JSONs of --suite runs of some contenders only (--tuners hypergrad "
                         "ablation, after a default changed), over the same tuning seeds as "
                         "--join's union: their contenders' columns replace the joined ones; "
                         "only with --join")
    args = ap.parse_args(argv)
    for flag, v in (("--seeds", args.seeds), ("--retrain-seeds", args.retrain_seeds),
                    ("--plain-runs", args.plain_runs)):
        if v is not None and v < 1:  # --seeds -1 wrote a table of NaN; --retrain-seeds 0
            # failed after the whole run; --plain-runs 0 became the default
            raise SystemExit(f"vs_optuna --suite: {flag} {v} must be >= 1")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise SystemExit(f"vs_optuna --suite: --out {args.out} is a file; give a folder")
    if args.replace and not args.join:
        raise SystemExit("vs_optuna --suite: --replace replaces contenders of a --join; give "
                         "the runs to join too")
    if args.first_seed < 0:
        raise SystemExit(f"vs_optuna --suite: --first-seed {args.first_seed} must be >= 0")
    if args.join and (args.half != "none" or args.problems or args.quick or args.merge):
        raise SystemExit("vs_optuna --suite: --join only joins earlier runs: give it with "
                         "--half none and without --problems, --quick or --merge")
    torch.set_num_threads(1)  # every contender on one core: the other absorbs contention
    import torch._inductor.config as inductor

    # ForwardMode() compiles its products in long runs: in this process, so the CPU-time
    # budget counts the compilation (worker processes' seconds would escape it)
    inductor.compile_threads = 1
    if args.problems:
        names = args.problems
    elif args.quick:
        names = list(QUICK_PROBLEMS)
    else:
        names = [n for h in ("dev", "eval") if args.half in (h, "both") for n in suite.SPLIT[h]]
    n_seeds = args.seeds if args.seeds is not None else (1 if args.quick else 3)
    n_retrain = args.retrain_seeds if args.retrain_seeds is not None else (
        1 if args.quick else len(SUITE_RETRAIN))
    n_plain = (args.plain_runs if args.plain_runs is not None else
               QUICK_PLAIN_RUNS if args.quick else suite.BUDGET_PLAIN_RUNS)
    seeds = list(range(args.first_seed, args.first_seed + n_seeds))
    retrain = list(range(RETRAIN_SEED0, RETRAIN_SEED0 + n_retrain))
    out = Path(args.out) if args.out else (ROOT / "outputs" / "vs_optuna_suite_quick"
                                           if args.quick else ROOT / "experiments" / "results")
    out.mkdir(parents=True, exist_ok=True)
    tune_malloc()
    t0 = time.perf_counter()
    tuners = tuple(args.tuners) + tuple(f"hg_{v}" for v in args.variants)
    results = {n: suite_problem(n, seeds, retrain, n_plain, tuners) for n in names}
    merged: dict[str, list[str]] = {}
    seconds = {"this run": 0.0}
    # the size of the result: --quick's, or that of the runs --join joins (one size: the
    # joined --quick pieces were written under the committed result's name, "quick": false)
    quick = args.quick

    def load(paths: list[str], flag: str) -> dict[str, dict[str, Any]]:
        """Earlier runs' JSONs (path -> JSON), each of this run's retraining seeds; their
        seconds join the wall clock. --join's runs set the result's size (one size)."""
        import json

        nonlocal quick
        runs = {p: json.loads(Path(p).read_text()) for p in paths}
        if flag == "--join":
            sizes = {p: bool(r["protocol"].get("quick", False)) for p, r in runs.items()}
            if len(set(sizes.values())) > 1:
                each = ", ".join(f"{p}: {'quick' if q else 'full'}" for p, q in sizes.items())
                raise SystemExit(f"--join: runs of two sizes ({each}); join runs of one size")
            quick = next(iter(sizes.values()))
        for p, r in runs.items():
            _same_size(flag, p, r["protocol"], quick)
            if r["protocol"]["retrain_seeds"] != retrain:
                raise SystemExit(f"{flag} {p}: its retraining seeds "
                                 f"{r['protocol']['retrain_seeds']} are not this run's {retrain}")
            # the budget rule: the joined table was labelled with this command line's (30
            # plain runs) over runs of 14, and never compared
            if _plain_runs(r["protocol"], n_plain) != n_plain:
                raise SystemExit(f"{flag} {p}: its budget is "
                                 f"{_plain_runs(r['protocol'], n_plain)} plain runs, this "
                                 f"run's {n_plain} (--plain-runs)")
            seconds[p] = r["seconds"]
        return runs

    if args.join:
        runs = load(args.join, "--join")
        results = join_seeds(runs)
        for n, r in results.items():
            got = sorted(x["seed"] for x in next(iter(r["tuners"].values()))["seeds"])
            if got != seeds:
                raise SystemExit(f"--join: {n}'s joined tuning seeds {got} are not "
                                 f"{seeds} (--first-seed {args.first_seed} --seeds {n_seeds})")
        merged = {p: sorted(r["problems"]) for p, r in runs.items()}
    if args.replace:
        new = load(args.replace, "--replace")
        results = replace_tuners(results, join_seeds(new))
        merged.update({p: sorted(r["problems"]) for p, r in new.items()})
    for earlier_path in args.merge:
        import json

        earlier = json.loads(Path(earlier_path).read_text())
        proto = earlier["protocol"]
        _same_size("--merge", earlier_path, proto, quick)
        if proto["seeds"] != seeds or proto["retrain_seeds"] != retrain:
            raise SystemExit(f"--merge {earlier_path}: its seeds {proto['seeds']} / "
                             f"{proto['retrain_seeds']} are not this run's {seeds} / {retrain}")
        merged[earlier_path] = []
        seconds[earlier_path] = earlier["seconds"]
        if _plain_runs(proto, n_plain) != n_plain:
            raise SystemExit(f"--merge {earlier_path}: its budget is "
                             f"{_plain_runs(proto, n_plain)} plain runs, this run's {n_plain} "
                             f"(--plain-runs)")
        for n, r in earlier["problems"].items():
            if n not in results and set(tuners) <= set(r["tuners"]):
                results[n] = {**r, "tuners": {t: r["tuners"][t] for t in tuners}}
                merged[earlier_path].append(n)
            elif n not in results:  # it was dropped without a word
                print(f"--merge {earlier_path}: {n} lacks contenders "
                      f"{sorted(set(tuners) - set(r['tuners']))} of this run: not merged",
                      flush=True)
    results = {n: results[n] for h in ("dev", "eval") for n in suite.SPLIT[h] if n in results}
    if not results:
        raise SystemExit("vs_optuna --suite: no problems run or merged")
    summary = suite_summary(results, suite.SPLIT, n_seeds)
    payload = {
        "summary": summary,
        "split": {**suite.SPLIT, "seed": suite.SPLIT_SEED, "hash": suite.SPLIT_HASH},
        "protocol": {
            "plain_runs": n_plain,
            "budget": f"the time of {n_plain} plain trainings of each problem (median of "
                      f"5 timed plain runs at its initial point), the same for every contender; "
                      f"measured in this process's CPU time (time.process_time), one thread",
            "tuners": {
                "hypergrad": "hypergrad.Trainer(problem, guards=Guards(bounds=box, "
                             "time_budget=B, clock='cpu')): the Trainer's defaults, nothing "
                             "else chosen",
                "ablation": "the same defaults with method=tuners.ZerothOrder (the "
                            "hypergradient replaced by a two-run SPSA estimate, averaged over "
                            "two batch orders where the defaults average hypergradients: "
                            "SearchSettings.two_orders)",
                "tpe": "optuna.samplers.TPESampler(seed)",
                "tpe_hyperband": "TPESampler(seed) + HyperbandPruner(min_resource=1, "
                                 "max_resource=T, reduction_factor=3), validation loss "
                                 f"reported every T/{REPORTS} inner steps",
                "random": "optuna.samplers.RandomSampler(seed)",
                "cmaes": "optuna.samplers.CmaEsSampler(seed) (its defaults: the box's "
                         "centre, sigma0 = box / 6)"},
            "space": "each problem's box (suite.py), raw coordinates; every Optuna "
                     "contender's first trial is the problem's initial point",
            "result": "the best validation loss among the points evaluated within B; that "
                      "point retrained with fresh seeds, mean test loss",
            "anytime": "test loss (tuning seed's model) of the incumbent at "
                       f"{list(CHECKPOINTS)} of B",
            "seeds": seeds, "retrain_seeds": retrain, "threads": 1, "quick": quick,
            "merged_from": merged or None},
        "machine": C.machine(), "optuna": optuna.__version__,
        "python": platform.python_version(), "seconds": time.perf_counter() - t0,
        "wall_seconds": {**seconds, "this run": time.perf_counter() - t0},
        "problems": results,
    }
    path = out / f"{args.name}{'_quick' if quick else ''}.json"
    path.write_text(dumps(payload, indent=1))
    for half in ("dev", "eval"):
        if any(n in results for n in suite.SPLIT[half]):
            suite_plot(results, suite.SPLIT, out / f"{args.name}_{half}.png", half)
    print()
    print(suite_table(results, suite.SPLIT))
    print(f"\n# {n_seeds} tuning seeds x {n_retrain} retraining seeds, budget {n_plain} plain "
          f"runs; {sum(payload['wall_seconds'].values()) / 60:.1f} min (merged runs "
          f"included); JSON: {path}")
    print(paired_table(summary))
    for half in ("dev", "eval"):
        if summary.get(f"{half}_win_rate") is not None:
            print(f"# {half}: win rate vs TPE {summary[f'{half}_win_rate']:.2f}, worst ratio "
                  f"{summary[f'{half}_worst_ratio']:.3f}, ablation win rate "
                  f"{summary.get(f'{half}_ablation_win_rate')}")
            by = summary.get(f"{half}_worst_ratio_by_tuner") or {}
            if by:
                print("#   the same worst ratio for each (over the best of the other Optuna "
                      "contenders): " + ", ".join(f"{t} {v:.3f}" for t, v in by.items()))

    def f(x: Any) -> str:  # 4 digits: a worst ratio of 1.054 is not the target's 1.05
        return "nan" if x is None else f"{x:.4g}"

    print(f"vs_optuna_suite eval_win_rate={f(summary.get('eval_win_rate'))} "
          f"eval_worst_ratio={f(summary.get('eval_worst_ratio'))} "
          f"ablation_win_rate={f(summary.get('ablation_win_rate'))} "
          f"problems={summary['problems']} seeds={n_seeds}")
    return payload


if __name__ == "__main__":
    if "--suite" in sys.argv[1:]:
        suite_main()
    else:
        main()
