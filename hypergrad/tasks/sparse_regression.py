"""Weighted sparse least squares (seed 000): ``min_x`` of a masked, group-weighted residual.

Inner loss, with ``A`` a fixed sparse ``(m, n)`` matrix held by :class:`~hypergrad.sparse.
SparseOperator` (forward and backward both sparse products with precomputed CSR copies)::

    L(x) = 1/2 * mean_i( mask_i * w[g(i)] * (A x - y)_i^2 ) + 1/2 * sum_j l2[f(j)] * x_j^2

``mask`` is the user's fixed 0/1 (or real) residual weighting (the seed's ``RF_mask``), ``w`` one
learnable weight per residual group, ``l2`` one learnable coefficient per feature group.
Validation: ``E = 1/2 mean((A_val x - y_val)^2)`` on held-out rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..hyperparams import HyperParams
from ..optim import Optimizer
from ..problem import InnerProblem, InnerState
from ..sparse import SparseOperator, load_npz, load_svmlight
from ..task import Task
from .bundled import device_of, dtype_of, user_file

__all__ = ["SparseLinear", "generate_sparse_regression", "sparse_regression_task"]


class SparseLinear(nn.Module):
    """``x -> A x`` with the coefficients ``x`` (shape ``(n,)``) as the trainable parameter."""

    def __init__(self, op: SparseOperator) -> None:
        super().__init__()
        self.op = op
        self.x = nn.Parameter(torch.zeros(op.shape[1], dtype=op.dtype, device=op.device))

    def forward(self, op: SparseOperator | None = None) -> Tensor:
        return (self.op if op is None else op) @ self.x


def generate_sparse_regression(m: int, n: int, density: float, noise: float = 0.1,
                               seed: int = 0, dtype: torch.dtype = torch.float32
                               ) -> tuple[SparseOperator, Tensor, Tensor]:
    """A reproducible problem: sparse ``A`` (``m x n``, about ``density * m * n`` non-zeros with
    N(0, 1/density) values, so ``A^T A / m ~ I``), ``x*`` ~ N(0, 1/n) (so ``A x*`` has unit
    variance), ``y = A x* + noise * N(0, 1)``. Returns ``(A, y, x*)``."""
    api = "generate_sparse_regression"
    for name, size in (("m", m), ("n", n)):
        _check_size(api, name, size)
    _check_real(api, "density", density)
    if not 0 < density <= 1:  # NaN too
        raise ValueError(f"{api}: density={density} must be in (0, 1]: the expected share of "
                         f"non-zero entries of A (e.g. 0.005); 0 makes A zero and every "
                         f"hypergradient zero.")
    rng = np.random.default_rng(seed)
    nnz = int(round(m * n * density))
    rows = rng.integers(0, m, nnz)
    cols = rng.integers(0, n, nnz)
    vals = rng.standard_normal(nnz) / np.sqrt(density)
    op = SparseOperator.from_coo(rows, cols, vals, (m, n), dtype=dtype)
    x_true = torch.as_tensor(rng.standard_normal(n) / np.sqrt(n), dtype=dtype)
    y = op @ x_true + noise * torch.as_tensor(rng.standard_normal(m), dtype=dtype)
    return op, y, x_true


def sparse_regression_task(hyperparams: HyperParams, optimizer: Optimizer, model: Any = None,
                           steps: int = 100, m: int = 20000, m_val: int = 4000, n: int = 2000,
                           density: float = 0.005, groups: int = 10, corrupted: int = 3,
                           feature_groups: int = 4, mask_fraction: float = 0.0,
                           corruption: float = 3.0, seed: int = 0,
                           dtype: str = "float32", weights: str = "res_w", l2: str = "l2",
                           data_path: str | None = None, val_fraction: float = 0.2,
                           zero_based: bool | None = None, device: str = "cpu") -> Task:
    """Learn residual-group weights (``hp[weights]``, shape ``(groups,)``) and feature-group L2
    coefficients (``hp[l2]``, shape ``(feature_groups,)``) of a weighted sparse least squares.

    The matrix is generated (``m + m_val`` rows; the first ``corrupted`` residual groups of
    the training rows get N(0, corruption^2) noise added to y) or, with ``data_path``, loaded
    from a scipy ``.npz`` (targets in a sibling ``<name>_y.npy``) or an svmlight file; then the
    last ``val_fraction`` of rows are validation (in the file's order, not shuffled) and
    nothing is marked corrupted. ``zero_based``: whether an svmlight file's feature indices
    start at 0 (``None``: scikit-learn's guess, which takes a file whose column 0 is empty as
    one-based and shifts its columns by one).
    ``mask_fraction`` (in ``[0, 1)``) of training residuals get mask 0 (the seed's ``RF_mask``).
    Every group must hold something: ``groups`` <= the training rows, ``feature_groups`` <= the
    columns (an empty group's hypergradient is zero: refused). ``model`` is
    unused (the model is :class:`SparseLinear`). ``device``: where the operators, targets and
    the model live (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"``: :func:`~hypergrad.tasks.
    bundled.device_of`); the data is generated or loaded on the CPU and moved there.
    """
    dt = dtype_of(dtype)
    dev = device_of(device)
    if data_path is None and not 0 <= corrupted < groups:
        raise ValueError(f"sparse_regression_task: corrupted={corrupted} must be in "
                         f"[0, groups={groups}).")
    if data_path is None and min(m, m_val) < 1:
        raise ValueError(f"sparse_regression_task: m={m} training and m_val={m_val} validation "
                         f"rows; each needs at least one.")
    if data_path is None:
        for name, size in (("m", m), ("m_val", m_val), ("n", n)):
            _check_size("sparse_regression_task", name, size)
    _check_real("sparse_regression_task", "mask_fraction", mask_fraction)
    if not 0 <= mask_fraction < 1:
        raise ValueError(f"sparse_regression_task: mask_fraction={mask_fraction} must be in "
                         f"[0, 1): the share of training residuals masked out (1 masks them all: "
                         f"the data term vanishes and every hypergradient is zero).")
    if data_path is None:
        op_all, y_all, _ = generate_sparse_regression(m + m_val, n, density, seed=seed, dtype=dt)
        m_tr = m
    else:
        _check_real("sparse_regression_task", "val_fraction", val_fraction)
        if not 0 <= val_fraction <= 1:  # NaN too
            raise ValueError(f"sparse_regression_task: val_fraction={val_fraction} must be "
                             f"inside (0, 1): the share of the rows of {data_path} held out "
                             f"for validation (e.g. 0.2).")
        op_all, y_all, data_digest = _load(data_path, dt, zero_based)
        m_tr = int(round(op_all.shape[0] * (1 - val_fraction)))
        corrupted = 0
        if op_all.shape[0] == 0:
            raise ValueError(f"sparse_regression_task: {data_path} has no rows; give a file "
                             f"with at least two (one training, one validation).")
        if not 1 <= m_tr < op_all.shape[0]:  # an empty split's loss is NaN
            raise ValueError(f"sparse_regression_task: val_fraction={val_fraction} of the "
                             f"{op_all.shape[0]} rows of {data_path} leaves {m_tr} training "
                             f"and {op_all.shape[0] - m_tr} validation rows; each needs at "
                             f"least one (a val_fraction further inside (0, 1), more rows).")
    # group g holds the rows (features) i with i * groups // size == g: none once groups > size
    for arg, count, size, what in (("groups", groups, m_tr, "training rows"),
                                   ("feature_groups", feature_groups, op_all.shape[1],
                                    "features")):
        if count > size:
            empty = sorted(set(range(count)) - set((np.arange(size) * count // size).tolist()))
            raise ValueError(f"sparse_regression_task: {arg}={count} for {size} {what}: groups "
                             f"{empty[:8]}{' ...' if len(empty) > 8 else ''} would hold none, "
                             f"so their hypergradients stay zero and tuning would report their "
                             f"initial values as learned. Use {arg} <= {size} (and the "
                             f"hyperparameter's shape with it), or more {what}.")
    for name, size, arg in ((weights, groups, "groups"), (l2, feature_groups, "feature_groups")):
        item = hyperparams.by_name.get(name)
        if item is None or item.shape() != (size,):
            got = "is not defined" if item is None else f"has shape {item.shape()}"
            raise ValueError(f"sparse_regression_task: the hyperparameter {name!r} {got} but "
                             f"{arg}={size}: one value per group (hypergrad-run: "
                             f"hyperparams.items.{name}.shape=[${{task.{arg}}}]); defined are "
                             f"{hyperparams.names}.")
    rows_csr = op_all.to_sparse_csr()
    _check_feature_groups(rows_csr, m_tr, feature_groups, data_path)
    crow = rows_csr.crow_indices()
    if data_path is not None and bool((rows_csr.values()[int(crow[m_tr]):] == 0).all()):
        # the validation loss then reads no weight: every hypergradient is exactly zero, and
        # the run ended "learned (outer step 0)" after a generic zero-hypergradient warning
        # (the sparse probe, 2026-12-08)
        raise ValueError(f"sparse_regression_task: the {op_all.shape[0] - m_tr} validation "
                         f"rows of {data_path} (its last val_fraction={val_fraction} of rows, in "
                         f"the file's order) have no non-zero feature, so the validation loss "
                         f"reads no weight and every hypergradient is exactly zero. Put rows "
                         f"with features last, or shuffle the file's rows.")
    a_tr = SparseOperator(_row_slice(rows_csr, 0, m_tr), device=dev)
    a_val = SparseOperator(_row_slice(rows_csr, m_tr, op_all.shape[0]), device=dev)
    y_tr, y_val = y_all[:m_tr].clone(), y_all[m_tr:].to(dev)
    rng = np.random.default_rng(seed + 7)
    group = torch.as_tensor(np.arange(m_tr) * groups // m_tr)
    bad = (group < corrupted).to(dt)
    y_tr = y_tr + corruption * bad * torch.as_tensor(rng.standard_normal(m_tr), dtype=dt)
    mask = torch.as_tensor(rng.random(m_tr) >= mask_fraction, dtype=dt)
    n_feat = a_tr.shape[1]
    fgroup = torch.as_tensor(np.arange(n_feat) * feature_groups // n_feat)
    y_tr, group, bad, mask, fgroup = (v.to(dev) for v in (y_tr, group, bad, mask, fgroup))
    net = SparseLinear(a_tr)

    def train_loss(mdl: Any, batch: Any, hp: Any) -> Tensor:
        r = mdl() - y_tr
        w = hp[weights][group]
        data_term = 0.5 * (mask * w * r * r).mean()
        x = mdl.params["x"]
        return data_term + 0.5 * (hp[l2][fgroup] * x * x).sum()

    def val_loss(mdl: Any, hp: Any) -> Tensor:
        r = mdl(a_val) - y_val
        return 0.5 * (r * r).mean()

    problem = InnerProblem(net, train_loss, optimizer, hyperparams, [None], steps, val_loss,
                           seed=seed)

    def evaluate(state: InnerState) -> dict[str, float]:
        x = state.params["x"]
        with torch.no_grad():
            return {"val_mse": float(((a_val @ x - y_val) ** 2).mean()),
                    "train_mse_clean_groups": float(
                        (((a_tr @ x - y_tr) ** 2) * (1 - bad)).sum() / (1 - bad).sum())}

    def extra(lam: Tensor) -> dict[str, Any]:
        w = problem.hyperparams.values(lam)[weights].detach().cpu()
        bad_g = list(range(corrupted))
        clean_g = [g for g in range(groups) if g not in bad_g]
        out: dict[str, Any] = {"weights": w.tolist(), "corrupted_groups": bad_g}
        if bad_g:
            mb, mc = float(w[bad_g].mean()), float(w[clean_g].mean())
            out.update(mean_weight_corrupted=mb, mean_weight_clean=mc,
                       max_weight_corrupted=float(w[bad_g].max()),
                       min_weight_clean=float(w[clean_g].min()))
            out["summary"] = (f"mean learned weight of corrupted residual groups {bad_g}: "
                              f"{mb:.3f}, of clean groups: {mc:.3f} (all corrupted below all "
                              f"clean: {float(w[bad_g].max()) < float(w[clean_g].min())})")
        return {"residual_weights": out}

    refs = {}
    if corrupted:
        from .bundled import lam_with

        clean_w = (torch.arange(groups, device=dev) >= corrupted).to(dt)
        refs["oracle (corrupted groups weight 0)"] = lam_with(
            problem, problem.init_raw(), weights, clean_w.clamp_min(1e-3))
    # the file's bytes: the run starts at zero coefficients, so its losses at the start read
    # only y, and a resume after an edit of the matrix went on with the old run's records
    # (the data-files probe)
    return Task(problem, evaluate, refs, extra, name="sparse_regression",
                fingerprint={} if data_path is None else {"task.data_digest": data_digest})


def _check_size(api: str, name: str, size: Any) -> None:
    ok_type = isinstance(size, (int, np.integer)) and not isinstance(size, bool)
    if not ok_type or size < 1:
        raise (ValueError if ok_type else TypeError)(
            f"{api}: {name}={size!r} must be an int >= 1 (a number of rows or columns of A).")


def _check_real(api: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{api}: {name} must be a number, got {type(value).__name__} "
                        f"{value!r}.")


def _row_slice(a: Tensor, start: int, stop: int) -> Tensor:
    """Rows ``start:stop`` of a CSR tensor, as CSR."""
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    lo, hi = int(crow[start]), int(crow[stop])
    return torch.sparse_csr_tensor(crow[start:stop + 1] - lo, col[lo:hi], val[lo:hi],
                                   (stop - start, a.shape[1]), check_invariants=False)


def _check_feature_groups(rows_csr: Tensor, m_tr: int, feature_groups: int,
                          data_path: str | None) -> None:
    """Every feature group must have a non-zero entry in the training rows: the weights of an
    empty one start at 0 and only their penalty moves them, so its L2 coefficient's
    hypergradient is exactly zero and tuning would report its initial value as learned."""
    n = rows_csr.shape[1]
    cols = rows_csr.col_indices()[:int(rows_csr.crow_indices()[m_tr])]
    vals = rows_csr.values()[:cols.numel()]
    used = torch.zeros(n, dtype=torch.bool)
    used[cols[vals != 0].cpu()] = True
    group = torch.as_tensor(np.arange(n) * feature_groups // n)
    filled = torch.zeros(feature_groups, dtype=torch.bool).index_put_(
        (group[used],), torch.tensor(True))
    empty = (~filled).nonzero()[:, 0].tolist()
    if empty:
        g = empty[0]
        lo, hi = (int(i) for i in (group == g).nonzero()[[0, -1], 0])
        where = data_path if data_path is not None else "the generated matrix"
        raise ValueError(f"sparse_regression_task: feature groups {empty[:8]}"
                         f"{' ...' if len(empty) > 8 else ''} of feature_groups={feature_groups} "
                         f"have no non-zero entry in the training rows of {where} (group {g}: "
                         f"columns {lo}..{hi}), so their L2 hypergradients stay zero and tuning "
                         f"would report their initial values as learned. Drop the empty columns, "
                         f"or use fewer feature_groups (and the hyperparameter's shape with it).")


def _load(path: str, dtype: torch.dtype, zero_based: bool | None = None
          ) -> tuple[SparseOperator, Tensor, str]:
    """``(A, y, digest)``: the matrix, the targets and a hash of the file(s) read."""
    p = user_file(path, f"sparse_regression_task: data_path={path!r}",
                  "give a scipy .npz (scipy.sparse.save_npz) or an svmlight file")
    if p.suffix.lower() == ".npy":
        raise ValueError(f"sparse_regression_task: data_path={path!r} is a dense numpy .npy; "
                         f"give the matrix as a scipy .npz (scipy.sparse.save_npz(path, "
                         f"scipy.sparse.csr_matrix(X))) with its targets in <name>_y.npy, or an "
                         f"svmlight file.")
    if p.suffix.lower() == ".npz":
        op = load_npz(p, dtype=dtype)
        y_path = p.with_name(p.stem + "_y.npy")
        if not y_path.exists():
            raise ValueError(f"sparse_regression_task: targets for {p} are expected in "
                             f"{y_path} (numpy .npy of shape ({op.shape[0]},)).")
        try:
            arr = np.load(y_path)
        except ValueError as err:  # an object array (pandas) needs pickle, which is refused
            raise ValueError(f"sparse_regression_task: {y_path} could not be read without "
                             f"pickle ({err}): it holds objects (an array from pandas?); save "
                             f"numbers: np.save(path, np.asarray(y, dtype=float)).") from None
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"sparse_regression_task: {y_path} holds {arr.dtype} targets; "
                             f"save numbers: np.save(path, y.astype(float)).")
        y = torch.as_tensor(arr, dtype=dtype)
        if y.shape != (op.shape[0],):
            raise ValueError(f"sparse_regression_task: {y_path} has shape {tuple(y.shape)}, "
                             f"expected ({op.shape[0]},) (one target per row of A).")
        _check_finite(y, y_path, arr)
        return op, y, _file_digest(p, y_path)
    op, y = load_svmlight(p, dtype=dtype, zero_based="auto" if zero_based is None else zero_based)
    y = torch.as_tensor(y, dtype=dtype)
    _check_finite(y, p)
    return op, y, _file_digest(p)


def _file_digest(*paths: Any) -> str:
    """A short hash of the files' bytes (a run folder's fingerprint: an edited file is
    another problem)."""
    import hashlib

    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def _check_finite(y: Tensor, path: Any, raw: Any = None) -> None:
    """Targets read from disk must be finite: one NaN makes every loss and hypergradient NaN.
    ``raw``: the values as the file holds them, where a finite one beyond the dtype's range
    became inf (it was told to "remove or impute" a value the file has finite)."""
    bad = ~torch.isfinite(y)
    if bool(bad.any()):
        rows = bad.nonzero()[:, 0]
        if raw is not None and bool(np.isfinite(np.asarray(raw)[rows.cpu().numpy()]).all()):
            raise ValueError(
                f"sparse_regression_task: {path} has {int(bad.sum())} targets beyond "
                f"{y.dtype}'s range (first at rows {rows[:5].tolist()}: "
                f"{float(np.asarray(raw)[int(rows[0])]):.4g}), which would become inf: use "
                f"task.dtype=float64, or scale the targets.")
        raise ValueError(f"sparse_regression_task: {path} has {int(bad.sum())} non-finite "
                         f"targets (NaN or inf), first at rows {rows[:5].tolist()}; remove or "
                         f"impute those rows before loading.")
