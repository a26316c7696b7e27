"""``hypergrad-run``: the Hydra application (``version_base="1.3"``).

    hypergrad-run experiment=digits_schedule
    hypergrad-run experiment=hypercleaning method=reverse
    hypergrad-run --multirun experiment=digits_schedule seed=0,1,2 hydra/launcher=joblib

Each run writes to its Hydra run directory: the resolved config, ``metrics.jsonl`` (one line per
outer step), ``checkpoint.pt`` (resume with ``trainer.resume=true hydra.run.dir=<that dir>``),
``results.json`` and PNG plots.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .config import CONFIG_DIR, build, register_configs

log = logging.getLogger("hypergrad")
register_configs()


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Build, tune, evaluate from scratch, report. Returns what ``results.json`` holds."""
    import torch

    from . import ForwardMode, ReverseMode
    from .measure import measure
    from .report import plot_run, table

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    task, trainer = build(cfg, run_dir)
    p = task.problem
    log.info(f"{cfg.name}: task={task.name} K={p.num_hyperparams} T={p.steps} "
             f"method={type(trainer.method).__name__} mode={trainer.mode} "
             f"outer_steps={trainer.outer_steps} -> {run_dir}")
    result, fit = measure(trainer.fit)
    rows: list[dict[str, Any]] = []
    if cfg.report.retrain:
        lam0 = p.init_raw()
        for label, lam in {"initial": lam0, "learned": result.lam, **task.references}.items():
            rows.append({"hyperparameters": label, **task.evaluate(p.run(lam))})
        if trainer.mode == "online" and result.state is not None:
            rows.insert(1, {"hyperparameters": "online run (its own final state)",
                            **task.evaluate(result.state)})
        grid = [r for r in rows if r["hyperparameters"].startswith("grid ")]
        key = "val_loss" if grid and "val_loss" in grid[0] else None
        if grid and key:
            best = min(grid, key=lambda r: r[key])
            best["best_of_grid"] = True
    extra = task.extra(result.lam) if task.extra is not None else {}
    compare = {}
    if cfg.report.compare_methods:
        lam0 = p.init_raw()
        ref = None
        for meth in (ForwardMode(), ReverseMode()):
            def one(meth: Any = meth) -> Any:
                return meth.hypergradient(p, lam0)

            hgr, m = measure(one)
            compare[meth.name] = {"seconds": m["seconds"],
                                  "peak_extra_mib": m["peak_extra_bytes"] / 2**20}
            ref = hgr.grad if ref is None else ref
            compare[meth.name]["rel_diff_to_forward"] = float(
                (hgr.grad - ref).norm() / ref.norm().clamp_min(1e-300))
    results = {
        "name": cfg.name, "task": task.name, "K": p.num_hyperparams, "T": p.steps,
        "method": result.method, "mode": trainer.mode, "outer_steps": len(result.history),
        "fit_seconds": fit["seconds"], "fit_peak_extra_mib": fit["peak_extra_bytes"] / 2**20,
        "learned": result.values, "table": rows,
        "extra": extra, "compare_methods": compare, "diverged": result.diverged,
        "message": result.message, "final_val_loss": result.history[-1]["val_loss"]
        if result.history else None,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=1, default=float))
    if cfg.report.plots:
        results["plots"] = plot_run(run_dir, p.hyperparams, p.steps, result.history,
                                    p.init_raw(), result.lam)
    text = table(rows)
    if text:
        log.info("\n" + text)
    for k, v in extra.items():
        log.info(f"{k}: {v['summary'] if isinstance(v, dict) and 'summary' in v else v}")
    for k, v in compare.items():
        log.info(f"{k}: {v['seconds']:.2f} s, peak extra memory {v['peak_extra_mib']:.2f} MiB, "
                 f"relative difference to forward {v['rel_diff_to_forward']:.2e}")
    log.info(f"tuning took {fit['seconds']:.1f} s, peak extra memory "
             f"{fit['peak_extra_bytes'] / 2**20:.1f} MiB ({result.method} mode)")
    log.info(f"results: {run_dir / 'results.json'}")
    return results


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def _main(cfg: DictConfig) -> float:
    from . import alloc

    alloc.tune_malloc()
    results = run(cfg, Path(HydraConfig.get().runtime.output_dir))
    learned = [r for r in results["table"] if r["hyperparameters"] == "learned"]
    val = learned[0].get("val_loss") if learned else results["final_val_loss"]
    return float(val) if val is not None else math.nan  # for sweepers


def main() -> None:
    """Console-script entry point."""
    _main()


if __name__ == "__main__":
    main()
