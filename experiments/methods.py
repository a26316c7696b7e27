"""Every hypergradient method on the same problems: error against the reference, time, peak memory.

Problems (float64):

- ``digits``: an MLP (64-128-10, tanh) on 512 ``load_digits`` examples, mini-batches of 32, SGD
  with a 4-window learning-rate schedule, a momentum and a per-tensor weight decay (K = 9),
  T steps. Reference: full reverse mode. Implicit differentiation does not apply (optimizer
  hyperparameters) and says so.
- ``ridge``: ridge regression on ``load_diabetes`` by full-batch gradient descent, ``log l2``
  (K = 1). Reference: the closed-form hypergradient at convergence.
- ``l2_mlp``: an MLP (64-16-10) on 128 digits, full batch, heavy-ball SGD, one L2 coefficient
  per parameter tensor in the loss (K = 4), trained to convergence. Reference: full reverse.

For each method: the norm-wise relative error against the reference, wall time and peak memory
(the largest growth of malloc's bytes in use during the call, sampled every 2 ms:
:func:`hypergrad.measure.measure`). Times on a shared machine vary; compare within a problem.
The last line gives the checks of issue 14: truncated reverse with k = T against full reverse
(a), checkpointed against full reverse (b), implicit differentiation (CG) on ridge against the
closed form (c), on the converged L2 MLP against forward mode (d), and MARTHE's limits (mu = 0
against HD, mu = 1 against forward mode, the larger) (e).

    python experiments/methods.py            # ~2-4 min on 2 cores
    python experiments/methods.py --quick    # smaller horizons, for tests (~30 s)
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import hypergrad as hg  # noqa: E402
from hypergrad.alloc import tune_malloc  # noqa: E402
from hypergrad.measure import measure  # noqa: E402
from hypergrad.testing import digits_case, l2_mlp_case, rel_err, ridge_diabetes_case  # noqa: E402


def digits_problem(steps: int, hidden: int = 128) -> hg.InnerProblem:
    base = digits_case("momentum", "lr", steps=steps, n_train=512, batch_size=32, hidden=hidden,
                       n_val=256)
    hps = hg.HyperParams([hg.Schedule("lr", 0.1, windows=4, transform="log"),
                          hg.Scalar("mom", 0.5, transform="logit"),
                          hg.PerTensor("wd", 1e-3, transform="log")])
    return hg.InnerProblem(base.fmodel.module, base.train_loss,
                           hg.optim.sgd(lr="lr", momentum="mom", weight_decay="wd"), hps,
                           base.batch,
                           steps, base.val_loss)


def run(method: hg.Method, problem: hg.InnerProblem) -> tuple[hg.HyperGradient, dict[str, Any]]:
    lam = problem.init_raw()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res, m = measure(lambda: method.hypergradient(problem, lam))
    m["warnings"] = [type(w.message).__name__ for w in caught]
    return res, m


def row(problem: str, label: str, res: hg.HyperGradient | None, m: dict[str, Any] | None,
        ref: torch.Tensor | None, ref_name: str, note: str = "") -> dict[str, Any]:
    info = res.info if res is not None else None
    if info:
        note = (note + " " if note else "") + (
            f"{info['solver']}: {info['iterations']} it, residual {info['residual']:.1e}")
    if m and m.get("warnings"):
        note = (note + " " if note else "") + "warned: " + ",".join(sorted(set(m["warnings"])))
    return {"problem": problem, "method": label,
            "error": None if res is None or ref is None else rel_err(res.grad, ref),
            "reference": ref_name,
            "seconds": None if m is None else m["seconds"],
            "peak_mib": None if m is None else m["peak_extra_bytes"] / 2**20, "note": note}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller horizons (for tests)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    tune_malloc()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_dig, t_ridge, t_mlp = (24, 500, 500) if args.quick else (200, 2000, 1000)
    rows: list[dict[str, Any]] = []
    checks: dict[str, float] = {}

    # -- digits: optimizer hyperparameters; reference full reverse ------------------------------
    p = digits_problem(t_dig, 32 if args.quick else 128)
    warm = digits_problem(4, 8)  # load the code paths before anything is timed (4 windows)
    for method in (hg.ForwardMode(), hg.ReverseMode(),
                   hg.ReverseMode(step_vjp=hg.stepvjp.MixedMode())):
        method.hypergradient(warm, warm.init_raw())
    ref, mref = run(hg.ReverseMode(), p)
    name = f"digits T={t_dig} K={p.num_hyperparams}"
    rows.append(row(name, "reverse (reference)", ref, mref, ref.grad, "reverse"))
    methods: list[tuple[str, hg.Method]] = [
        ("forward", hg.ForwardMode()),
        (f"reverse truncate={t_dig} (k=T)", hg.ReverseMode(truncate=t_dig)),
        ("reverse checkpoint=sqrt", hg.ReverseMode(checkpoint="sqrt")),
        ("reverse step_vjp=mixed", hg.ReverseMode(step_vjp=hg.stepvjp.MixedMode())),
        (f"reverse truncate={t_dig // 4}", hg.ReverseMode(truncate=t_dig // 4)),
        ("MARTHE mu=1 (RTHO)", hg.MARTHE(1.0)),
        ("MARTHE mu=0.9", hg.MARTHE(0.9)),
        ("MARTHE mu=0", hg.MARTHE(0.0)),
        ("HD", hg.HD()),
    ]
    got: dict[str, hg.HyperGradient] = {}
    for label, method in methods:
        res, m = run(method, p)
        got[label] = res
        rows.append(row(name, label, res, m, ref.grad, "reverse"))
    try:
        hg.ImplicitDiff().check(p)
    except ValueError as err:
        rows.append(row(name, "implicit", None, None, None, "-",
                        "refused: " + str(err).split(". ")[0].split(": ", 1)[1]))
    checks["truncated_full"] = rel_err(got[f"reverse truncate={t_dig} (k=T)"].grad, ref.grad)
    checks["checkpointed"] = rel_err(got["reverse checkpoint=sqrt"].grad, ref.grad)
    checks["marthe_limits"] = max(rel_err(got["MARTHE mu=0"].grad, got["HD"].grad),
                                  rel_err(got["MARTHE mu=1 (RTHO)"].grad, got["forward"].grad))

    # -- ridge: loss hyperparameter, closed form at convergence ---------------------------------
    p, closed = ridge_diabetes_case(t_ridge)
    name = f"ridge T={t_ridge} K=1"
    solvers: list[tuple[str, hg.Method]] = [
        ("implicit CG", hg.ImplicitDiff(hg.methods.CG(tol=1e-12))),
        ("implicit Neumann", hg.ImplicitDiff(hg.methods.Neumann(maxiter=3000, tol=1e-10))),
        ("implicit FixedPoint", hg.ImplicitDiff(hg.methods.FixedPoint(maxiter=3000, tol=1e-10))),
        ("implicit FixedPoint momentum=0.9",
         hg.ImplicitDiff(hg.methods.FixedPoint(maxiter=3000, tol=1e-10, momentum=0.9))),
        ("forward", hg.ForwardMode()),
        ("reverse", hg.ReverseMode()),
        ("reverse checkpoint=sqrt", hg.ReverseMode(checkpoint="sqrt")),
    ]
    for label, method in solvers:
        res, m = run(method, p)
        rows.append(row(name, label, res, m, closed, "closed form"))
        if label == "implicit CG":
            checks["implicit_closed_form"] = rel_err(res.grad, closed)

    # -- converged L2 MLP: implicit against forward ---------------------------------------------
    p = l2_mlp_case(t_mlp)
    name = f"l2_mlp T={t_mlp} K=4"
    ref, mref = run(hg.ReverseMode(), p)
    rows.append(row(name, "reverse (reference)", ref, mref, ref.grad, "reverse"))
    for label, method in [("forward", hg.ForwardMode()),
                          ("reverse checkpoint=sqrt", hg.ReverseMode(checkpoint="sqrt")),
                          ("implicit CG", hg.ImplicitDiff(hg.methods.CG(maxiter=300))),
                          ("implicit Neumann",
                           hg.ImplicitDiff(hg.methods.Neumann(maxiter=3000, tol=1e-8))),
                          ("HD", hg.HD())]:
        res, m = run(method, p)
        got[name + label] = res
        rows.append(row(name, label, res, m, ref.grad, "reverse"))
    checks["implicit_vs_forward"] = rel_err(got[name + "implicit CG"].grad,
                                            got[name + "forward"].grad)

    print(table(rows))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float64")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "checks": checks,
                                               "quick": args.quick}, indent=1))
    print(f"methods truncated_full={checks['truncated_full']:.2e} "
          f"checkpointed={checks['checkpointed']:.2e} "
          f"implicit_closed_form={checks['implicit_closed_form']:.2e} "
          f"implicit_vs_forward={checks['implicit_vs_forward']:.2e} "
          f"marthe_limits={checks['marthe_limits']:.2e}")


def table(rows: list[dict[str, Any]]) -> str:
    fmt: dict[str, Callable[[Any], str]] = {
        "error": lambda v: "-" if v is None else f"{v:.2e}",
        "seconds": lambda v: "-" if v is None else f"{v:.2f}",
        "peak_mib": lambda v: "-" if v is None else f"{v:.1f}"}
    cols = ["problem", "method", "error", "reference", "seconds", "peak_mib", "note"]
    cells = [[fmt.get(c, str)(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(  # noqa: E731
        v.ljust(w) if i in (0, 1, 3, 6) else v.rjust(w)
        for i, (v, w) in enumerate(zip(vals, widths))).rstrip()
    return "\n".join([line(cols), *(line(c) for c in cells)])


if __name__ == "__main__":
    main()
