"""Tables and PNG plots of a tuning run (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .hyperparams import HyperParams, Schedule

__all__ = ["table", "plot_run"]


def table(rows: list[dict[str, Any]]) -> str:
    """Fixed-width text table of evaluation rows (first column: the hyperparameters' label)."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if k not in ("hyperparameters", "best_of_grid")]
    w = max(len("hyperparameters"), *(len(r["hyperparameters"]) for r in rows)) + 2
    cw = {k: max(12, len(k) + 2) for k in keys}
    lines = [f"{'hyperparameters':<{w}}" + "".join(f"{k:>{cw[k]}}" for k in keys)]
    for r in rows:
        mark = "  <- best of grid" if r.get("best_of_grid") else ""
        lines.append(f"{r['hyperparameters']:<{w}}"
                     + "".join(f"{r[k]:>{cw[k]}.4f}" for k in keys) + mark)
    return "\n".join(lines)


def plot_run(run_dir: Path, hps: HyperParams, horizon: int, history: list[dict[str, Any]],
             lam0: torch.Tensor, lam: torch.Tensor) -> list[str]:
    """Write ``val_curve.png``, ``hyperparams.png`` and (for schedules) ``schedule.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    if history:
        x = [h.get("inner_step", h["outer_step"] + 1) for h in history]
        xlabel = "inner step" if "inner_step" in history[0] else "outer step"
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot(x, [h["val_loss"] for h in history], marker="o", ms=3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss")
        ax.set_title("validation objective while tuning")
        fig.tight_layout()
        _save(fig, run_dir / "val_curve.png")
        plt.close(fig)
        files.append("val_curve.png")

        names = hps.names
        fig, axes = plt.subplots(len(names), 1, figsize=(5, 2.2 * len(names)), squeeze=False)
        for ax, name in zip(axes[:, 0], names):
            traj = [h["hyperparams"][name] for h in history]
            flat = [t if isinstance(t, list) else [t] for t in traj]
            n = len(flat[0])
            if n <= 10:
                for j in range(n):
                    ax.plot(x, [f[j] for f in flat], label=f"{name}[{j}]" if n > 1 else name)
                if n > 1:
                    ax.legend(fontsize=6, ncol=2)
            else:
                t = torch.tensor(flat)
                ax.plot(x, t.mean(1), label="mean")
                ax.fill_between(x, t.min(1).values, t.max(1).values, alpha=0.3, label="min-max")
                ax.legend(fontsize=6)
            ax.set_ylabel(name)
            if all(v > 0 for f in flat for v in f):
                ax.set_yscale("log")
        axes[-1, 0].set_xlabel(xlabel)
        fig.suptitle("hyperparameter trajectories", fontsize=9)
        fig.tight_layout()
        _save(fig, run_dir / "hyperparams.png")
        plt.close(fig)
        files.append("hyperparams.png")

    scheds = [it for it in hps.items if isinstance(it, Schedule)]
    if scheds:
        fig, axes = plt.subplots(1, len(scheds), figsize=(5 * len(scheds), 3.2), squeeze=False)
        for ax, it in zip(axes[0], scheds):
            steps = list(range(horizon))
            for label, vec in (("initial", lam0), ("learned", lam)):
                v = hps.values(vec.detach(), None, horizon)[it.name]
                ax.step(steps, [float(v[it.window(t, horizon)]) for t in steps], where="post",
                        label=label)
            ax.set_xlabel("inner step")
            ax.set_ylabel(it.name)
            ax.set_title(f"{it.name} schedule ({it.windows} windows)")
            ax.legend()
        fig.tight_layout()
        _save(fig, run_dir / "schedule.png")
        plt.close(fig)
        files.append("schedule.png")
    return files


def _save(fig: Any, path: Path) -> None:
    """``fig`` as a PNG written atomically (never a 0-byte or half file on a full disk)."""
    import io

    from .run.files import write_bytes_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes_atomic(path, buf.getvalue())
