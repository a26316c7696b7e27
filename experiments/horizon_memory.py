"""Part 1 of experiments/long_horizon.py: memory and time against the horizon T, and the
hypergradient's signal-to-noise against T.

- **Memory and time**: one model whose tangent is large (an MLP 1024-1024-1024-10, D = 2.1M
  parameters, SGD with momentum; K = 12: a 10-window learning-rate schedule, the momentum, the
  weight decay; forward mode's tangents of the parameters alone take D x K x 4 bytes = 101 MB,
  of the whole state 202 MB), mini-batches of 16 from a ``torch.utils.data.DataLoader`` over
  generated data (read lazily, one pass per inner run: :class:`hypergrad.data.Stream`). Per
  method and T: the peak memory above the process's baseline during one hypergradient
  (:func:`hypergrad.measure.measure`: the growth of malloc's bytes in use) and its process
  CPU seconds. Reverse mode runs where the memory guard lets it
  (:func:`hypergrad.methods.memory.check_memory` with the machine's available memory); where it
  refuses, the estimate and the refusal are recorded. Forward mode runs through the Trainer with
  ``RunFolder(inner_every=...)``: its run state is checkpointed every N inner steps, so a
  killed run resumes mid-run (and the record says where it resumed).
- **Where the time goes**: ``torch.profiler`` over forward-mode steps of that model.
- **Signal-to-noise**: forward-mode hypergradients at the initial point of the schedule study's
  ``teacher`` problem, one per pass of a shuffling DataLoader (a new mini-batch order each), at
  several T: per hyperparameter the mean over passes divided by the standard deviation, and the
  share of passes whose sign agrees with the mean's.
"""

from __future__ import annotations

import functools
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from horizon_common import Records, cpu, mean_se
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hypergrad as hg
from hypergrad.errors import MemoryBudgetError
from hypergrad.measure import measure
from hypergrad.methods.memory import check_memory

METHODS = ("reverse", "truncated", "checkpointed", "forward")


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"d_in": 32, "width": 64, "n": 512, "batch": 16, "Ts": [20, 50, 100],
                "truncate": 10, "inner_every": 40, "snr_Ts": [50, 100], "snr_passes": 3}
    return {"d_in": 1024, "width": 1024, "n": 4096, "batch": 16,
            "Ts": [100, 250, 500, 2000, 10000], "truncate": 100, "inner_every": 1000,
            "snr_Ts": [500, 1000, 2000, 5000, 10000], "snr_passes": 6}


def big_problem(T: int, sz: dict[str, Any]) -> hg.InnerProblem:
    """The MLP on generated data from a DataLoader (see the module docstring)."""
    g = torch.Generator().manual_seed(0)
    n, d = sz["n"], sz["d_in"]
    x = torch.randn(n, d, generator=g)
    teacher = torch.randn(d, 10, generator=g)
    y = (x @ teacher + 2.0 * torch.randn(n, 10, generator=g)).argmax(-1)
    n_val = n // 8
    loader = DataLoader(TensorDataset(x[n_val:], y[n_val:]), batch_size=sz["batch"],
                        shuffle=True, drop_last=True)
    torch.manual_seed(0)
    w = sz["width"]
    net = nn.Sequential(nn.Linear(d, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
    hps = hg.HyperParams([hg.Schedule("lr", 0.01, windows=10, transform="log"),
                          hg.Scalar("momentum", 0.9, transform="logit"),
                          hg.Scalar("wd", 1e-4, transform="log")])
    xv, yv = x[:n_val], y[:n_val]
    return hg.InnerProblem(net, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           hg.optim.sgd(lr="lr", momentum="momentum", weight_decay="wd"), hps,
                           loader, T, lambda m, hp: F.cross_entropy(m(xv), yv))


def _method(name: str, sz: dict[str, Any]) -> hg.Method:
    if name == "forward":
        return hg.ForwardMode()
    if name == "reverse":
        return hg.ReverseMode()
    if name == "checkpointed":
        return hg.ReverseMode(checkpoint="sqrt")
    return hg.ReverseMode(truncate=sz["truncate"])


class _Done(Exception):
    """Raised by :class:`_Clock` once the hypergradient of outer step 0 is taken."""


class _Clock(hg.Callback):
    """CPU seconds from the start of fit to the first outer step's record (the hypergradient),
    the inner step a resumed run started from, then stop the fit."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.seconds = math.nan
        self.resumed_at = 0
        self.record: dict[str, Any] = {}

    def on_fit_start(self, trainer: Any) -> None:
        self.t0 = cpu()

    def on_message(self, trainer: Any, text: str) -> None:
        m = re.search(r"inner run resumed at step (\d+)", text)
        if m:
            self.resumed_at = int(m.group(1))

    def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
        self.seconds = cpu() - self.t0
        self.record = dict(record)
        raise _Done


def forward_through_trainer(problem: hg.InnerProblem, folder: Path, every: int
                            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One forward-mode hypergradient by the Trainer (one outer step), its run state
    checkpointed every ``every`` inner steps in ``folder`` and resumed from there when the
    folder holds a checkpoint within that inner run."""
    ck = folder / "checkpoint.pt"
    if ck.exists():  # an outer step already finished (killed before its record): measure again
        got = torch.load(ck, weights_only=True, map_location="cpu")
        if int(got.get("outer_step", 0)) >= 1:
            shutil.rmtree(folder)
    clock = _Clock()

    def fit() -> None:  # the Trainer built inside: a resumed run's checkpoint counts too
        trainer = hg.Trainer(problem, hg.ForwardMode(),
                             outer=functools.partial(torch.optim.SGD, lr=0.0),
                             mode=hg.Offline(outer_steps=1),
                             folder=hg.RunFolder(folder, resume=True, inner_every=every),
                             callbacks=[hg.run.Log(None), hg.run.Progress(False), clock])
        try:
            trainer.fit()
        except _Done:
            pass

    _, m = measure(fit)
    steps_run = problem.steps - clock.resumed_at
    return m, {"cpu_s_run": clock.seconds, "resumed_at": clock.resumed_at,
               "steps_run": steps_run, "val_loss": clock.record.get("val_loss"),
               "hypergrad_norm": clock.record.get("hypergrad_norm")}


_WARM: set[str] = set()


def measure_unit(method: str, T: int, sz: dict[str, Any], work: Path) -> dict[str, Any]:
    m = _method(method, sz)
    if method not in _WARM:  # one-off allocations (caches, plans) out of the measurement
        small = big_problem(10, sz)
        m.hypergradient(small, small.init_raw())
        _WARM.add(method)
    problem = big_problem(T, sz)
    lam = problem.init_raw()
    est = m.estimate_memory(problem)
    row: dict[str, Any] = {"part": "horizon", "method": method, "T": T,
                           "K": problem.num_hyperparams,
                           "D": sum(p.numel() for p in problem.fmodel.initial_params().values()),
                           "estimate_bytes": None if est is None else est.total,
                           "estimate": None if est is None else str(est)}
    try:
        check_memory(problem, m, "offline", None)
    except MemoryBudgetError as err:
        row.update(refused=True, message=str(err))
        return row
    if method == "forward":
        mem, info = forward_through_trainer(problem, work / f"forward_T{T}", sz["inner_every"])
        per_step = info["cpu_s_run"] / max(info["steps_run"], 1)
        row.update(peak_bytes=mem["peak_extra_bytes"], cpu_s=per_step * T,
                   cpu_s_per_step=per_step, **info)
        return row
    t0 = cpu()
    hgr, mem = measure(lambda: m.hypergradient(problem, lam))
    secs = cpu() - t0
    row.update(peak_bytes=mem["peak_extra_bytes"], cpu_s=secs, cpu_s_per_step=secs / T,
               val_loss=float(hgr.objective), hypergrad_norm=float(hgr.grad.norm()))
    return row


def profile(sz: dict[str, Any], steps: int = 3) -> dict[str, Any]:
    """``torch.profiler``: the operators that take a forward-mode step's CPU time (all K
    columns live: the last window), the top 12 by self time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    T = 40
    problem = big_problem(T, sz)
    fm = hg.ForwardMode()
    lam = problem.init_raw()
    run = fm.init(problem, lam)
    while run.step < T - steps:  # to the last window: every column computed
        run = fm.step(problem, run, lam)
    t0 = cpu()
    with prof(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            run = fm.step(problem, run, lam)
    secs = (cpu() - t0) / steps
    rows = []
    total = sum(e.self_cpu_time_total for e in p.key_averages())
    for e in sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]:
        rows.append({"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
                     "share": e.self_cpu_time_total / total, "calls_per_step": e.count / steps})
    return {"cpu_s_per_step": secs, "top": rows}


def snr_unit(T: int, passes: int, quick: bool) -> dict[str, Any]:
    """Forward-mode hypergradients at the teacher problem's initial point over ``passes``
    passes of a shuffling DataLoader (one mini-batch order each)."""
    from horizon_schedules import studies

    st = studies(quick)["teacher"]
    data = st.data()
    loader = DataLoader(TensorDataset(data["x"], data["y_train"]), batch_size=st.batch_size,
                        shuffle=True, drop_last=True)
    hps = st.hyperparams(schedule=True)
    problem = st.problem(0, hps, batches=loader, T=T)
    lam = problem.init_raw()
    grads = []
    t0 = cpu()
    for _ in range(passes):
        grads.append(hg.ForwardMode().hypergradient(problem, lam).grad.double())
    secs = cpu() - t0
    G = torch.stack(grads)
    mean, std = G.mean(0), G.std(0)
    snr = (mean.abs() / std.clamp_min(1e-30)).tolist()
    agree = (torch.sign(G) == torch.sign(mean)).double().mean(0).tolist()
    cos = []
    for i in range(passes):
        for j in range(i + 1, passes):
            cos.append(float(F.cosine_similarity(G[i], G[j], dim=0)))
    names = [f"lr[{w}]" for w in range(st.windows)] + [n for n in hps.names if n != "lr"]
    return {"part": "snr", "T": T, "passes": passes, "names": names, "mean": mean.tolist(),
            "std": std.tolist(), "snr": snr, "sign_agreement": agree,
            "snr_median": float(torch.tensor(snr).median()),
            "sign_agreement_mean": float(torch.tensor(agree).mean()),
            "pairwise_cosine": mean_se(cos)[0], "cpu_s": secs}


def run(records: Records, quick: bool, work: Path, log: Callable[[str], None]) -> None:
    sz = sizes(quick)
    for method in METHODS:
        for T in sz["Ts"]:
            unit = f"horizon/{method}/{T}"
            if records.done(unit):
                continue
            row = records.add(unit, measure_unit(method, T, sz, work))
            if row.get("refused"):
                log(f"{unit}: refused by the memory guard (estimate "
                    f"{row['estimate_bytes'] / 2**30:.1f} GiB)")
            else:
                log(f"{unit}: peak {row['peak_bytes'] / 2**20:.0f} MiB, "
                    f"{row['cpu_s']:.1f} CPU s")
    if not records.done("horizon/profile"):
        records.add("horizon/profile", {"part": "profile", **profile(sz)})
    for T in sz["snr_Ts"]:
        unit = f"snr/{T}"
        if not records.done(unit):
            row = records.add(unit, snr_unit(T, sz["snr_passes"], quick))
            log(f"{unit}: median SNR {row['snr_median']:.2f}, sign agreement "
                f"{row['sign_agreement_mean']:.2f}")


def summarize(records: Records) -> dict[str, Any]:
    rows = records.where(part="horizon")
    fwd = sorted((r for r in rows if r["method"] == "forward" and not r.get("refused")),
                 key=lambda r: r["T"])
    out: dict[str, Any] = {"rows": sorted(rows, key=lambda r: (r["method"], r["T"]))}
    if len(fwd) >= 2:
        out["T_min"], out["T_max"] = fwd[0]["T"], fwd[-1]["T"]
        out["mem_ratio_forward"] = fwd[-1]["peak_bytes"] / fwd[0]["peak_bytes"]
    rev = sorted((r for r in rows if r["method"] == "reverse" and not r.get("refused")),
                 key=lambda r: r["T"])
    if len(rev) >= 2:
        out["mem_ratio_reverse"] = rev[-1]["peak_bytes"] / rev[0]["peak_bytes"]
        out["reverse_T"] = [rev[0]["T"], rev[-1]["T"]]
    prof = records.rows.get("horizon/profile")
    if prof:
        out["profile"] = {k: prof[k] for k in ("cpu_s_per_step", "top")}
    snr = sorted(records.where(part="snr"), key=lambda r: r["T"])
    out["snr"] = [{k: r[k] for k in ("T", "passes", "snr_median", "sign_agreement_mean",
                                      "pairwise_cosine", "names", "snr", "sign_agreement")}
                  for r in snr]
    return out


def plot(records: Records, path: Path) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = records.where(part="horizon")
    if not rows:
        return None
    snr = sorted(records.where(part="snr"), key=lambda r: r["T"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"forward": "C3", "reverse": "C0", "checkpointed": "C2", "truncated": "C1"}
    for method in METHODS:
        got = sorted((r for r in rows if r["method"] == method), key=lambda r: r["T"])
        ok = [r for r in got if not r.get("refused")]
        bad = [r for r in got if r.get("refused")]
        c = colors[method]
        if ok:
            axes[0].plot([r["T"] for r in ok], [r["peak_bytes"] / 2**20 for r in ok], "o-",
                         color=c, label=method)
            axes[1].plot([r["T"] for r in ok], [r["cpu_s"] for r in ok], "o-", color=c,
                         label=method)
        if bad:
            axes[0].plot([r["T"] for r in bad], [r["estimate_bytes"] / 2**20 for r in bad],
                         "x--", color=c, ms=9,
                         label=f"{method}: estimate, refused by the memory guard")
    for ax in axes[:2]:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("horizon T (inner steps)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("peak memory above baseline (MiB)")
    axes[1].set_ylabel("CPU seconds per hypergradient")
    if snr:
        axes[2].plot([r["T"] for r in snr], [r["snr_median"] for r in snr], "o-", color="C3",
                     label="median |mean| / std over passes")
        axes[2].plot([r["T"] for r in snr], [r["sign_agreement_mean"] for r in snr], "s-",
                     color="C0", label="sign agreement with the mean")
        axes[2].set_xscale("log")
        axes[2].set_xlabel("horizon T (inner steps)")
        axes[2].legend(fontsize=7)
        axes[2].set_title("teacher problem: hypergradient over mini-batch orders")
    k = rows[0].get("K")
    d = rows[0].get("D")
    fig.suptitle(f"MLP D = {d / 1e6:.1f}M, K = {k} (tangent D x K = {d * k * 4 / 1e6:.0f} MB in "
                 f"float32), batches from a DataLoader; one thread")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
