"""Tables, named values and PNG plots of a tuning run (matplotlib, imported only here).

Every value is reported under its name (:func:`named_values`): a scalar as ``lr``, a schedule's
windows by their inner steps (``lr[steps 0-59]``), per-tensor values by the parameter's name
(``wd[fc1.weight]``), vectors by index (``cw[2]``). Outer steps are numbered as in
``metrics.jsonl``: outer step ``k`` evaluates the hyperparameters after ``k`` updates (0: the
initial ones); the point after the last update is outer step ``N``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .errors import HypergradWarning
from .hyperparams import HyperParams, Schedule
from .problem import InnerProblem, InnerState

__all__ = ["table", "named_values", "summary", "figures", "plot_run", "save_figure",
           "write_learned"]

MANY = 12
"""More values than this in one hyperparameter: plotted as min / mean / max, summarised in logs."""


def _cell(v: Any, width: int) -> str:
    """A value in fixed point, or in scientific notation where fixed point would not fit its
    column (a diverged run's 7.5e55 took 60 characters and ran into the next column) or would
    show no digit of it (below 1e-3 in magnitude); a row
    without the column's value (``None``) shows ``-``, a value that is no number as text."""
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, bool) or not isinstance(v, (int, float, torch.Tensor)):
        return f"{str(v):>{width}}"
    x = float(v)
    if x != 0 and abs(x) < 1e-3:  # 1.23e-5 printed as 0.0000: a regression's losses read 0
        return f"{x:>{width}.4g}"
    text = f"{x:>{width}.4f}"
    return text if len(text) <= width else f"{x:>{width}.4g}"


def table(rows: list[dict[str, Any]]) -> str:
    """Fixed-width text table of evaluation rows (first column: the hyperparameters' label);
    the columns are every row's keys (a task's ``evaluate`` may report a metric for some
    points only: ``-`` where a row has none)."""
    if not rows:
        return ""
    keys = list(dict.fromkeys(k for r in rows for k in r
                              if k not in ("hyperparameters", "best_of_grid")))
    w = max(len("hyperparameters"), *(len(r["hyperparameters"]) for r in rows)) + 2
    cw = {k: max(12, len(k) + 2) for k in keys}
    lines = [f"{'hyperparameters':<{w}}" + "".join(f"{k:>{cw[k]}}" for k in keys)]
    for r in rows:
        mark = "  <- best of grid" if r.get("best_of_grid") else ""
        lines.append(f"{r['hyperparameters']:<{w}}"
                     + "".join(_cell(r.get(k), cw[k]) for k in keys) + mark)
    return "\n".join(lines)


def named_values(hps: HyperParams, values: Mapping[str, Any], horizon: int
                 ) -> dict[str, float]:
    """``hps.named(values, horizon)`` (:meth:`hypergrad.HyperParams.named`)."""
    return hps.named(values, horizon)


def summary(hps: HyperParams, values: Mapping[str, Any], horizon: int) -> str:
    """A log line of named values, a long vector as its min / mean / max."""
    parts = []
    for it in hps.items:
        named = named_values(HyperParams([it]), {it.name: values[it.name]}, horizon)
        if len(named) > MANY:
            xs = list(named.values())
            parts.append(f"{it.name}=[{len(xs)} values: min {min(xs):.4g}, mean "
                         f"{sum(xs) / len(xs):.4g}, max {max(xs):.4g}]")
        else:
            parts.extend(f"{k}={x:.4g}" for k, x in named.items())
    return ", ".join(parts)


def figures(hps: HyperParams, horizon: int, history: list[dict[str, Any]], lam0: torch.Tensor,
            lam: torch.Tensor, best_step: int | None = None,
            last: tuple[int, float, Mapping[str, Any]] | None = None,
            learned: tuple[float, Mapping[str, Any]] | None = None,
            started: bool = False,
            diverged: tuple[int, float | None] | None = None) -> dict[str, Any]:
    """The figures :func:`plot_run` writes, by file name (matplotlib figures: close them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out: dict[str, Any] = {}
    online = bool(history) and "inner_step" in history[0]
    if online:
        last = None
    xlabel = ("inner step (online updates)" if online else
              "outer step (0: the space-filling start's best point)" if started else
              "outer step (0: initial)")
    points = [(h["inner_step"] if online else h["outer_step"], h["val_loss"], h["hyperparams"])
              for h in history]
    if last is not None:
        points.append(last)
    x = [pt[0] for pt in points]
    if online and history:
        # each record's values were used over the interval before its inner step: drawn from
        # its start (they sat one interval late), and the values after the last update (the
        # learned ones) at its end (they were not drawn)
        starts = [0, *(h["inner_step"] for h in history[:-1])]
        hp_x = [*starts, history[-1]["inner_step"]]
        hp_points = [*(pt[2] for pt in points), hps.describe(lam)]
    else:
        hp_x, hp_points = x, [pt[2] for pt in points]
    if history:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ys = [pt[1] for pt in points]
        ax.plot(x, ys, marker="o", ms=3, color="C0", label="validation loss")
        back = [(xi, y) for xi, y, h in zip(x, ys, history) if h.get("backtracked")]
        if back:
            ax.plot(*zip(*back), "x", color="C3", ms=8, mew=2,
                    label="backtracked (not used: back to the best point)")
        if last is not None and last[0] != best_step:
            again = learned is not None and dict(last[2]) == dict(learned[1])
            ax.plot([last[0]], [last[1]], "s", color="C2", ms=6,
                    label="after the last update" + (" (the learned point again)"
                                                     if again else ""))
        if diverged is not None:
            at, v = diverged
            if v is not None and math.isfinite(v):
                ax.plot([at], [v], "X", color="C3", ms=10, label=f"diverged (outer step {at})")
                ys = [*ys, v]
            ax.set_title(f"validation objective while tuning: diverged at outer step {at}",
                         fontsize=9)
        if best_step is not None and not online:
            # the returned point is often a line search's, evaluated during outer step k, not
            # history[k]: its own validation loss
            vals = {pt[0]: pt[1] for pt in points}
            y = learned[0] if learned is not None else vals.get(best_step)
            if y is not None:
                ax.plot([best_step], [y], "*", color="C1", ms=16,
                        label=f"learned (outer step {best_step})", zorder=5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss E")
        if diverged is None:
            ax.set_title("validation objective while tuning")
        shown = [y for y in ys if y is not None and math.isfinite(y)]
        if shown and min(shown) > 0 and max(shown) / min(shown) > 20:  # a descent not squashed
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out["val_curve.png"] = fig

        names = hps.names
        fig, axes = plt.subplots(len(names), 1, figsize=(6.5, 2.4 * len(names) + 0.6),
                                 squeeze=False)
        for ax, name in zip(axes[:, 0], names):
            one = HyperParams([hps.by_name[name]])
            named = [named_values(one, {name: pt[name]}, horizon) for pt in hp_points]
            labels = list(named[0])
            if len(labels) <= MANY:
                for j, label in enumerate(labels):
                    # past 10 lines the colours repeat: another dash (two lines shared one
                    # colour, the learned star's among them)
                    ax.plot(hp_x, [n[label] for n in named], marker=".", ms=3, label=label,
                            color=f"C{j % 10}", ls=("-", "--", ":")[j // 10 % 3])
                ax.legend(fontsize=6, ncol=2 if len(labels) > 4 else 1, loc="best")
            else:
                # NumPy arrays: matplotlib 3.6.0's fill_between failed on torch tensors
                t = torch.tensor([list(n.values()) for n in named], dtype=torch.float64).numpy()
                ax.plot(hp_x, t.mean(1), label=f"mean of {len(labels)}")
                ax.fill_between(hp_x, t.min(1), t.max(1), alpha=0.3, label="min - max")
                ax.legend(fontsize=6)
            vs = [v for n in named for v in n.values()]
            if best_step is not None and not online:
                ax.axvline(best_step, color="C1", lw=0.8, ls="--")
                if learned is not None and name in learned[1]:
                    mine = named_values(one, {name: learned[1][name]}, horizon)
                    if len(mine) <= MANY:
                        ax.plot([best_step] * len(mine), list(mine.values()), "*",
                                color="C1", ms=9, zorder=5)
                        vs += list(mine.values())
            ax.set_ylabel(name)
            if min(vs) > 0 and max(vs) / min(vs) > 20:
                ax.set_yscale("log")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel(xlabel)
        title = "hyperparameter trajectories"
        if best_step is not None and not online:
            title += f" (dashed: the learned point, outer step {best_step})"
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        out["hyperparams.png"] = fig

    scheds = [it for it in hps.items if isinstance(it, Schedule)]
    if scheds:
        fig, axes = plt.subplots(1, len(scheds), figsize=(6 * len(scheds), 3.6), squeeze=False)
        for ax, it in zip(axes[0], scheds):
            steps = list(range(horizon + 1))
            groups = list(it.groups) if it.groups is not None else [""]
            for label, vec, style in (("initial", lam0, "--"), ("learned", lam, "-")):
                # the tuned windows (before any multipliers), a row per group
                rows = torch.as_tensor(hps.describe(vec)[it.name])[:it.base_numel].reshape(
                    len(groups), -1)
                for gi, (g, v) in enumerate(zip(groups, rows)):
                    ys = [float(v[it.window(min(t, horizon - 1), horizon)]) for t in steps]
                    name = f"{label} {g}" if g else label
                    ax.step(steps, ys, where="post", ls=style, lw=2, label=name,
                            color=f"C{gi}" if g else None)
            ax.set_xlabel("inner step")
            ax.set_ylabel(it.name)
            title = f"{it.name}: {it.windows} windows over T = {horizon} steps"
            if it.scales is not None:  # the learned factors per group
                got = hps.describe(lam)[it.name]
                assert isinstance(got, list)
                title += "\nlearned scales " + ", ".join(
                    f"{g} {v:.3g}" for g, v in zip(it.scales, got[it.windows:]))
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        out["schedule.png"] = fig
    return out


def plot_run(run_dir: Path, hps: HyperParams, horizon: int, history: list[dict[str, Any]],
             lam0: torch.Tensor, lam: torch.Tensor, best_step: int | None = None,
             last: tuple[int, float, Mapping[str, Any]] | None = None,
             learned: tuple[float, Mapping[str, Any]] | None = None,
             started: bool = False,
             diverged: tuple[int, float | None] | None = None) -> list[str]:
    """Write ``val_curve.png`` (validation loss per outer step, the learned point and the
    backtracked steps marked), ``hyperparams.png`` (each hyperparameter's trajectory, by name)
    and, for schedules, ``schedule.png`` (the learned schedule as a step function over the
    inner steps beside the initial one) into ``run_dir``; returns the file names.
    ``best_step``: the learned point's outer step; ``last``: ``(outer step, validation loss,
    values)`` of the point after the last update; ``learned``: ``(validation loss, values)``
    of the learned point (``TrainResult.best_val_loss`` and ``values``), marked with a star
    (without it, the history's entry of ``best_step``, which a line search's point is not).
    ``started``: a space-filling start ran, so outer step 0 is its best point, not the
    initial one. ``diverged``: ``(outer step, validation loss or None)`` where the run
    diverged, marked and named in the title. Online, each record's values are drawn from the
    inner step their interval began at, and the learned values (``lam``) at the end."""
    import matplotlib.pyplot as plt

    written = []
    for name, fig in figures(hps, horizon, history, lam0, lam, best_step, last,
                             learned, started, diverged).items():
        try:
            save_figure(fig, run_dir / name)
        finally:
            plt.close(fig)
        written.append(name)
    return written


def save_figure(fig: Any, path: Path) -> None:
    """``fig`` as a PNG written atomically (never a 0-byte or half file on a full disk)."""
    import io

    from .run.files import write_bytes_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes_atomic(path, buf.getvalue())


def write_learned(folder: Path, problem: InnerProblem, lam: torch.Tensor,
                  state: InnerState | None, caution: str = "") -> list[str]:
    """``learned.yaml`` (:func:`hypergrad.export.learned_settings`, or the reason it cannot be
    written), ``learned_<name>.pt`` for vector-valued loss hyperparameters, and
    ``model_learned.pt`` (:func:`hypergrad.export.trained_state_dict` of ``state``: the model
    retrained at ``lam``) in ``folder``, each written atomically. Returns the file names.
    ``caution``: why the values are not a tuned point (the run's warning), said first in
    ``learned.yaml``'s header (it called values whose training diverges "what hypergrad
    learned", a warning on stderr the only other word)."""
    import io

    import yaml  # type: ignore[import-untyped]

    from .export import learned_settings, trained_state_dict, transformed_values
    from .run.files import write_bytes_atomic, write_text_atomic

    files: list[str] = []
    try:
        settings: dict[str, Any] = learned_settings(problem, lam)
    except (NotImplementedError, ImportError) as err:
        # ImportError: schedule-free AdamW's torch twin without the schedulefree package; the
        # error came after the tuning, and results.json and the model were never written
        settings = {"not_written": str(err)}
        if isinstance(err, ImportError):  # said in the YAML only, under another reason
            warnings.warn(f"learned.yaml is not written: {err}", HypergradWarning, stacklevel=2)
    missing = ("# Not written: a package it needs is not installed (the reason below); the "
               "learned values are in results.json.\n")
    head = ("# What hypergrad learned, for your own training: hypergrad.export."
            "optimizer_from_settings(yaml.safe_load(open('learned.yaml')), model) gives the "
            "torch.optim optimizer and LambdaLR (docs/guide.md). Schedule windows are fractions "
            "of training (see 'assumes').\n" if "not_written" not in settings else
            missing if "pip install" in settings["not_written"] else
            "# Not written: torch.optim cannot hold what hypergrad learned (the reason below); "
            "the learned values are in results.json.\n")
    if caution:
        import textwrap

        head = head.replace("# What hypergrad learned,", "# The values hypergrad returned,")
        head = textwrap.fill("Caution, not a tuned point: " + " ".join(caution.split()),
                             96, initial_indent="# ", subsequent_indent="# ") + "\n" + head
    cls = str((settings.get("optimizer") or {}).get("class", ""))
    if "schedulefree" in cls.lower().replace("_", ""):
        # following the guide gave 0.2064 against the run's 0.1989: the optimizer comes back
        # in train mode, and only its docstring said to call eval()
        head += ("# Schedule-free: the optimizer comes back in train mode; call "
                 "optimizer.eval() before evaluating or saving the model, as hypergrad's "
                 "last step did.\n")
    if settings.get("schedule"):
        settings["schedule"]["assumes"] = (
            "windows are fractions of the run: training for another number of steps stretches "
            "them; the batch size, data and model are the ones tuned on")
    write_text_atomic(folder / "learned.yaml", head + yaml.safe_dump(settings, sort_keys=False,
                                                                default_flow_style=None))
    files.append("learned.yaml")
    values = transformed_values(problem.hyperparams, lam)
    for name, ref in settings.get("loss", {}).items():
        if isinstance(ref, str):
            buf = io.BytesIO()
            torch.save(values[name].detach().cpu(), buf)
            write_bytes_atomic(folder / ref, buf.getvalue())
            files.append(ref)
    if state is not None:
        buf = io.BytesIO()
        # on the CPU: a model trained on a GPU loads where there is none (own-model.md loads
        # it without map_location)
        torch.save({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                    for k, v in trained_state_dict(problem, state).items()}, buf)
        write_bytes_atomic(folder / "model_learned.pt", buf.getvalue())
        files.append("model_learned.pt")
    return files
