"""A fixed sparse linear map ``x -> A x`` that is fast to differentiate, in every AD mode.

``torch``'s own sparse tensors are slow or unsupported exactly where hyperparameter optimization
needs them: the ``sparse_csr`` backward rebuilds ``A^T`` on every call (70-117x the forward on
CPU), COO is slow in the forward, and neither works under ``torch.func`` transforms or
``is_grads_batched``. :class:`SparseOperator` stores CSR copies of both ``A`` and ``A^T`` (int32
indices whenever they fit), so that the product and its transpose are each one sparse x dense
kernel call (MKL on CPU, cuSPARSE on CUDA; on CPU a threaded scatter kernel for wide operators,
see :func:`_spmm`), and wraps the product in a custom :class:`torch.autograd.Function` with
``backward`` (itself differentiable: double backward), ``jvp`` (forward mode) and ``vmap`` (a
batch of right-hand sides is one sparse x dense-matrix product).

``A`` is a constant: no gradient flows to its values.

Shapes: ``A`` is ``(m, n)``; ``op @ x`` takes ``x`` of shape ``(n,)`` or ``(n, k)`` and returns
``(m,)`` or ``(m, k)``; ``x @ op`` takes ``(m,)`` or ``(k, m)`` and returns ``(n,)`` or ``(k, n)``.

Example::

    op = SparseOperator.from_scipy(A)            # scipy.sparse, (m, n)
    loss = 0.5 * (op @ x - y).square().sum()     # differentiable w.r.t. x
    g = torch.func.grad(lambda x: 0.5 * (op @ x - y).square().sum())(x)
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["SparseOperator", "load_npz", "load_svmlight"]

_INT32_MAX = 2**31 - 1
# transpose CPU matrices with scipy's C++ csr -> csc (tests switch it off to check the torch path
# that other devices take)
_SCIPY_TRANSPOSE = True
_FLOATS = (torch.float32, torch.float64)
# unsigned index types beyond uint8: torch has almost no kernels for them (comparisons, min)
_WIDE_UNSIGNED = tuple(getattr(torch, f"uint{b}") for b in (16, 32, 64)
                       if hasattr(torch, f"uint{b}"))


@contextlib.contextmanager
def _quiet_sparse() -> Iterator[None]:
    """Silence torch's one-time 'beta' notices for sparse CSR tensors (they are no news to a user
    of this module, and test suites run with warnings as errors)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Ss]parse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message=r".*[Ss]parse invariant checks")
        yield


# ----------------------------------------------------------------------------------------------
# argument checks


def _check_shape(api: str, shape: Any) -> tuple[int, int]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{api}: shape must be a pair of ints (rows, cols), got "
                        f"{type(shape).__name__} {shape!r}.") from None
    if len(dims) != 2:
        raise ValueError(f"{api}: shape must have 2 entries (rows, cols), got {dims!r}; "
                         f"SparseOperator represents a matrix.")
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            if isinstance(d, Tensor) and d.dim() == 0 and not d.is_floating_point():
                d = int(d)
            else:
                raise TypeError(f"{api}: shape entries must be ints, got {dims!r}.")
        if int(d) < 0:
            raise ValueError(f"{api}: shape entries must be >= 0, got {dims!r}.")
        out.append(int(d))
    return out[0], out[1]


def _resolve_dtype(api: str, source: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        if dtype not in _FLOATS:
            raise TypeError(f"{api}: dtype={dtype} is not supported; pass torch.float32 or "
                            f"torch.float64 (or None to keep the data's float type).")
        return dtype
    if source in _FLOATS:
        return source
    if source.is_complex:
        raise TypeError(f"{api}: the matrix has complex dtype {source}; SparseOperator holds "
                        f"real float32/float64 values. Split real and imaginary parts.")
    default = torch.get_default_dtype()
    return default if default in _FLOATS else torch.float32


def _resolve_index_dtype(api: str, shape: tuple[int, int], nnz: int,
                         index_dtype: torch.dtype | None) -> torch.dtype:
    m, n = shape
    fits32 = max(m, n, nnz) <= _INT32_MAX
    if index_dtype is None:
        return torch.int32 if fits32 else torch.int64
    if index_dtype == torch.int32:
        if not fits32:
            raise ValueError(
                f"{api}: index_dtype=torch.int32 cannot hold this matrix (shape {(m, n)}, "
                f"nnz={nnz}): int32 holds values up to {_INT32_MAX}. Pass "
                f"index_dtype=torch.int64, or None to choose automatically.")
        return index_dtype
    if index_dtype == torch.int64:
        return index_dtype
    raise TypeError(f"{api}: index_dtype={index_dtype} is not supported; pass torch.int32, "
                    f"torch.int64, or None (int32 whenever the sizes fit).")


def _as_1d(api: str, name: str, a: Any, *, integer: bool) -> Tensor:
    if isinstance(a, Tensor):
        t = a.detach()
    else:
        try:
            t = torch.as_tensor(np.asarray(a) if not isinstance(a, np.ndarray) else a)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{api}: {name} must be a 1-D array or tensor, got "
                            f"{type(a).__name__} ({e}).") from None
    if t.dim() != 1:
        raise ValueError(f"{api}: {name} must be 1-D, got shape {tuple(t.shape)}.")
    if integer and (t.numel() == 0 or t.dtype in _WIDE_UNSIGNED):
        # [] arrives as float64; uint64 values past int64's range wrap to negative indices,
        # which the range checks report
        t = t.long()
    if integer and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise TypeError(f"{api}: {name} must hold integers, got dtype {t.dtype}; convert with "
                        f".astype(np.int64) / .long().")
    if not integer and t.dtype == torch.bool:
        t = t.to(torch.get_default_dtype())
    return t


def _first_bad(mask: Tensor) -> int:
    return int(torch.nonzero(mask)[0, 0])


def _validate_csr(api: str, crow: Tensor, col: Tensor, val: Tensor, shape: tuple[int, int],
                  *, finite: bool = True) -> None:
    """Structure checks of CSR arrays (crow: (m+1,), col and val: (nnz,))."""
    m, n = shape
    if crow.dim() != 1 or crow.numel() != m + 1:
        raise ValueError(f"{api}: the row pointer has shape {tuple(crow.shape)}, expected "
                         f"({m + 1},) for {m} rows; check shape={shape}.")
    if col.dim() != 1 or val.dim() != 1 or col.numel() != val.numel():
        raise ValueError(f"{api}: column indices (shape {tuple(col.shape)}) and values (shape "
                         f"{tuple(val.shape)}) must be 1-D of equal length.")
    nnz = col.numel()
    if int(crow[0]) != 0 or int(crow[-1]) != nnz:
        raise ValueError(f"{api}: the row pointer must start at 0 and end at nnz={nnz}, got "
                         f"{int(crow[0])} ... {int(crow[-1])}; the arrays are inconsistent.")
    if m > 0 and bool((crow[1:] < crow[:-1]).any()):
        raise ValueError(f"{api}: the row pointer decreases at row "
                         f"{_first_bad(crow[1:] < crow[:-1])}; it must be non-decreasing.")
    if nnz:
        lo, hi = int(col.min()), int(col.max())
        if lo < 0 or hi >= n:
            bad = _first_bad((col < 0) | (col >= n))
            raise ValueError(f"{api}: column index {int(col[bad])} at entry {bad} is outside "
                             f"[0, {n}) for shape {shape}; fix the indices or the shape (an "
                             f"index type too narrow for the size shows up as negative indices).")
    if finite and nnz and val.is_floating_point():
        bad_mask = ~torch.isfinite(val)
        if bool(bad_mask.any()):
            bad = _first_bad(bad_mask)
            row = int(torch.searchsorted(crow, torch.tensor(bad, dtype=crow.dtype,
                                                            device=crow.device),
                                         right=True)) - 1
            raise ValueError(f"{api}: the matrix has {int(bad_mask.sum())} non-finite value(s) "
                             f"(NaN or inf), first {float(val[bad])} at row {row}, column "
                             f"{int(col[bad])}; clean the data (drop or replace those entries) "
                             f"before building the operator.")


# ----------------------------------------------------------------------------------------------
# construction


def _csr_tensor(crow: Tensor, col: Tensor, val: Tensor, shape: tuple[int, int]) -> Tensor:
    with _quiet_sparse():
        return torch.sparse_csr_tensor(crow, col, val, shape, check_invariants=False)


def _csr_transpose(crow: Tensor, col: Tensor, val: Tensor,
                   shape: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """CSR arrays of ``A^T`` from those of ``A`` (a counting sort, O(nnz + m + n))."""
    m, n = shape
    idx = crow.dtype
    if _SCIPY_TRANSPOSE and crow.device.type == "cpu" and col.numel() > 0:
        try:
            import scipy.sparse as sp
        except ImportError:  # pragma: no cover - scipy is a dependency
            sp = None
        if sp is not None:
            # scipy's csr -> csc is a single-pass C++ counting sort: ~6x faster than argsort
            a = sp.csr_matrix((val.numpy(), col.numpy(), crow.numpy()), shape=(m, n), copy=False)
            c = a.tocsc()
            return (torch.from_numpy(c.indptr).to(idx), torch.from_numpy(c.indices).to(idx),
                    torch.from_numpy(c.data))
    counts = torch.bincount(col.long(), minlength=n)
    crow_t = torch.zeros(n + 1, dtype=torch.int64, device=col.device)
    torch.cumsum(counts, 0, out=crow_t[1:])
    rows = torch.repeat_interleave(torch.arange(m, dtype=idx, device=col.device),
                                   (crow[1:] - crow[:-1]).long())
    perm = torch.argsort(col, stable=True)
    return crow_t.to(idx), rows[perm], val[perm]


def _build(api: str, crow: Tensor, col: Tensor, val: Tensor, shape: tuple[int, int], *,
           dtype: torch.dtype | None, index_dtype: torch.dtype | None,
           device: torch.device | str | None, validate: bool,
           transposed: bool = False) -> tuple[Tensor, Tensor]:
    """The two stored CSR tensors ``(A, A^T)`` from CSR arrays of ``A`` (or of ``A^T`` when
    ``transposed``; ``shape`` is always that of ``A``)."""
    m, n = shape
    cshape = (n, m) if transposed else (m, n)
    nnz = col.numel()
    vdt = _resolve_dtype(api, val.dtype, dtype)
    idt = _resolve_index_dtype(api, shape, nnz, index_dtype)
    if validate:
        _validate_csr(api, crow, col, val, cshape)
    dev = torch.device(device) if device is not None else val.device
    # contiguous: the product kernel reads the index arrays as if they were (a strided int32
    # col, big[1::2], made op @ x 0.96 off while the gradient, through A^T, stayed right)
    crow = crow.to(device=dev, dtype=idt).contiguous()
    col = col.to(device=dev, dtype=idt).contiguous()
    cast = val.to(device=dev, dtype=vdt).contiguous()
    if validate and cast.dtype != val.dtype and cast.numel() and not bool(
            torch.isfinite(cast).all()):
        # a finite 1e39 became inf in float32 without a word (the data-files probe)
        top = float(val.detach().abs().max())
        raise ValueError(f"{api}: the matrix has values beyond {vdt}'s range (largest "
                         f"|value| {top:.4g}): they would become inf. Give dtype=torch.float64 "
                         f"(hypergrad-run: task.dtype=float64), or scale the data.")
    val = cast
    crow_t, col_t, val_t = _csr_transpose(crow, col, val, cshape)
    first = _csr_tensor(crow, col, val, cshape)
    second = _csr_tensor(crow_t, col_t, val_t, (cshape[1], cshape[0]))
    return (second, first) if transposed else (first, second)


def _parts_from_torch(api: str, A: Tensor, **kw: Any) -> tuple[Tensor, Tensor]:
    if A.dim() != 2:
        raise ValueError(f"{api}: A must be 2-D (a matrix), got shape {tuple(A.shape)}.")
    A = A.detach()
    shape = (int(A.shape[0]), int(A.shape[1]))
    layout = A.layout
    with _quiet_sparse():
        if layout == torch.strided:
            A = A.to_sparse_csr()
            layout = torch.sparse_csr
        if layout == torch.sparse_coo:
            if A.dense_dim() != 0:
                raise ValueError(f"{api}: hybrid sparse tensors (dense_dim={A.dense_dim()}) are "
                                 f"not supported; pass a plain 2-D sparse matrix.")
            A = A.coalesce()  # sorted by (row, col), duplicates summed
            rows, cols = A.indices()
            crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=A.device)
            torch.cumsum(torch.bincount(rows, minlength=shape[0]), 0, out=crow[1:])
            return _build(api, crow, cols, A.values(), shape, **kw)
        if layout == torch.sparse_csr:
            if A.values().dim() != 1:
                raise ValueError(f"{api}: hybrid/batched CSR tensors are not supported; pass a "
                                 f"plain 2-D sparse matrix.")
            return _build(api, A.crow_indices(), A.col_indices(), A.values(), shape, **kw)
        if layout == torch.sparse_csc:
            if A.values().dim() != 1:
                raise ValueError(f"{api}: hybrid/batched CSC tensors are not supported; pass a "
                                 f"plain 2-D sparse matrix.")
            return _build(api, A.ccol_indices(), A.row_indices(), A.values(), shape,
                          transposed=True, **kw)
    raise TypeError(f"{api}: layout {layout} is not supported; pass a COO, CSR or CSC tensor "
                    f"(e.g. A.to_sparse_csr()) or a dense matrix.")


def _parts_from_scipy(api: str, S: Any, **kw: Any) -> tuple[Tensor, Tensor]:
    import scipy.sparse as sp

    if not sp.issparse(S):
        raise TypeError(f"{api}: expected a scipy.sparse matrix or array, got "
                        f"{type(S).__name__}.")
    if S.ndim != 2:
        raise ValueError(f"{api}: A must be 2-D, got shape {S.shape}.")
    if S.dtype.kind not in "biuf":
        if S.dtype.kind == "c":
            raise TypeError(f"{api}: the matrix has complex dtype {S.dtype}; SparseOperator "
                            f"holds real float32/float64 values.")
        raise TypeError(f"{api}: unsupported data dtype {S.dtype}; convert with "
                        f"A.astype(np.float32).")
    shape = (int(S.shape[0]), int(S.shape[1]))
    transposed = S.format == "csc"
    if S.format not in ("csr", "csc"):
        S = S.tocsr()
    return _build(api, torch.from_numpy(S.indptr), torch.from_numpy(S.indices),
                  torch.from_numpy(S.data), shape, transposed=transposed, **kw)


def _parts_from_coo(api: str, rows: Any, cols: Any, values: Any, shape: Any,
                    **kw: Any) -> tuple[Tensor, Tensor]:
    m, n = _check_shape(api, shape)
    r = _as_1d(api, "rows", rows, integer=True)
    c = _as_1d(api, "cols", cols, integer=True)
    v = _as_1d(api, "values", values, integer=False)
    if not (r.numel() == c.numel() == v.numel()):
        raise ValueError(f"{api}: rows, cols and values must have equal lengths, got "
                         f"{r.numel()}, {c.numel()} and {v.numel()}.")
    _resolve_index_dtype(api, (m, n), v.numel(), kw.get("index_dtype"))  # fail before work
    for name, ix, lim in (("row", r, m), ("column", c, n)):
        if ix.numel() and (int(ix.min()) < 0 or int(ix.max()) >= lim):
            bad = _first_bad((ix < 0) | (ix >= lim))
            raise ValueError(f"{api}: {name} index {int(ix[bad])} at entry {bad} is outside "
                             f"[0, {lim}) for shape {(m, n)}; fix the indices or the shape.")
    if v.is_complex():
        raise TypeError(f"{api}: values have complex dtype {v.dtype}; SparseOperator holds real "
                        f"float32/float64 values.")
    if kw.get("validate", True) and v.is_floating_point():
        bad_mask = ~torch.isfinite(v)
        if bool(bad_mask.any()):
            bad = _first_bad(bad_mask)
            raise ValueError(f"{api}: values have {int(bad_mask.sum())} non-finite entr(y/ies) "
                             f"(NaN or inf), first {float(v[bad])} at entry {bad} (row "
                             f"{int(r[bad])}, column {int(c[bad])}); clean the data first.")
    with _quiet_sparse():
        A = torch.sparse_coo_tensor(torch.stack([r.long(), c.long().to(r.device)]), v, (m, n),
                                    check_invariants=False)
    return _parts_from_torch(api, A, **kw)


def _parts_from_csr(api: str, crow: Any, col: Any, values: Any, shape: Any,
                    **kw: Any) -> tuple[Tensor, Tensor]:
    m, n = _check_shape(api, shape)
    cr = _as_1d(api, "crow", crow, integer=True)
    co = _as_1d(api, "col", col, integer=True)
    v = _as_1d(api, "values", values, integer=False)
    if v.is_complex():
        raise TypeError(f"{api}: values have complex dtype {v.dtype}; SparseOperator holds real "
                        f"float32/float64 values.")
    return _build(api, cr, co, v, (m, n), **kw)


# ----------------------------------------------------------------------------------------------
# the differentiable product


def _spmm(op: SparseOperator, x: Tensor) -> Tensor:
    """Raw ``A @ x`` (no autograd) for dense ``x`` of shape (n,) or (n, k), with the faster of
    two kernels:

    - gather (default): the CSR kernel of ``torch.mv`` / ``torch.sparse.mm`` on ``A`` (MKL on
      CPU, cuSPARSE on CUDA, threaded); every non-zero reads a row of ``x``;
    - scatter (CPU, wide ``A`` with n > m, nnz >= ``_SCATTER_MIN_NNZ`` and ``x`` of at least
      ``_SCATTER_MIN_BYTES``): the stored CSR of ``A^T`` read as CSC of ``A``, each non-zero
      adding into a row of the (smaller) output; scipy's C++ kernel, one slice of the non-zeros
      per thread.

    Gathering reads rows of ``x`` (n x k) at random, scattering updates rows of the output
    (m x k), so scattering wins when ``n > m`` and ``x`` falls out of cache: for the seed's
    ``A^T`` (210,000 x 850,000, 178.5M non-zeros, float32, 2 threads) and 8 columns the scatter
    product took 0.30-0.45 s against MKL's 0.85-0.95 s; in the other direction gathering was
    faster (0.06 s vs 0.55 s at 35.7M non-zeros, 8 columns)."""
    if _is_legacy_batched(x):
        return _legacy_batched_spmm(op, x)
    A = op._A
    m = A.shape[0]
    if A._nnz() == 0 or x.numel() == 0:
        return x.new_zeros((m, *x.shape[1:]))
    if _use_scatter(op, x):
        return _scatter_spmm(op, x)
    with _quiet_sparse():
        if x.dim() == 1:
            return torch.mv(A, x if x.is_contiguous() else x.contiguous())
        if not (x.is_contiguous() or x.t().is_contiguous()):
            x = x.contiguous()  # the kernels take row- or column-major dense operands
        return torch.sparse.mm(A, x)


# the scatter kernel (see _spmm); tests lower the thresholds or switch it off
_SCATTER = True
_SCATTER_MIN_NNZ = 1 << 22
# gathering holds up while the gathered array (n x k values) sits in cache. Measured on a
# 2-core EPYC (1 MiB L2 per core, 32 MiB L3), 7M-178M non-zeros: MKL was as fast or up to 1.7x
# faster at 0.6-6.5 MiB (one exception: 1.2x slower on the seed's 3.2 MiB vector), the scatter
# kernel 1.1-3x faster at 10-26 MiB (the seed's 8 columns: 2-2.5x)
_SCATTER_MIN_BYTES = 8 << 20
_POOL: tuple[int, Any, int] | None = None  # (workers, ThreadPoolExecutor, pid)


def _use_scatter(op: SparseOperator, x: Tensor) -> bool:
    A = op._A
    k = x.shape[1] if x.dim() == 2 else 1
    return (_SCATTER and A.device.type == "cpu" and A.shape[1] > A.shape[0]
            and A._nnz() >= _SCATTER_MIN_NNZ
            and A.shape[1] * k * x.element_size() >= _SCATTER_MIN_BYTES
            and _scipy_sparse() is not None)


def _scipy_sparse() -> Any:
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - scipy is a dependency
        return None
    return sp


def _scatter_parts(op: SparseOperator, nthreads: int) -> list[tuple[Any, int, int]]:
    """``A`` as CSC slices of about equal nnz, one per thread: ``(csc (m, j1 - j0), j0, j1)``.
    Views of the stored CSR of ``A^T`` (only the column pointers are copied); cached."""
    cache = op._scatter_cache
    if cache is not None and cache[0] == nthreads:
        return cache[1]
    sp = _scipy_sparse()
    At = op._At  # CSR (n, m) == CSC of A
    ptr = At.crow_indices().numpy()
    idx = At.col_indices().numpy()
    val = At.values().numpy()
    n, m = At.shape
    nnz = idx.shape[0]
    bounds = np.searchsorted(ptr, [nnz * t // nthreads for t in range(nthreads)] + [nnz])
    bounds[0], bounds[-1] = 0, n
    parts = []
    for j0, j1 in zip(bounds[:-1], bounds[1:], strict=True):
        if j1 <= j0:
            continue
        s, e = int(ptr[j0]), int(ptr[j1])
        # set the arrays after construction: the constructor would copy slices smaller than
        # half of their base array (scipy's prune), which is every slice but one
        sub = sp.csc_matrix((m, int(j1 - j0)), dtype=val.dtype)
        sub.data, sub.indices, sub.indptr = val[s:e], idx[s:e], ptr[j0:j1 + 1] - ptr[j0]
        parts.append((sub, int(j0), int(j1)))
    op._scatter_cache = (nthreads, parts)
    return parts


def _scatter_spmm(op: SparseOperator, x: Tensor) -> Tensor:
    global _POOL
    nthreads = max(1, torch.get_num_threads())
    parts = _scatter_parts(op, nthreads)
    xn = x.detach().contiguous().numpy()  # scipy wants row-major
    if len(parts) == 1:
        sub, j0, j1 = parts[0]
        return torch.from_numpy(np.asarray(sub @ xn[j0:j1]))
    if _POOL is None or _POOL[0] < len(parts) or _POOL[2] != os.getpid():  # new after fork
        from concurrent.futures import ThreadPoolExecutor

        _POOL = (len(parts), ThreadPoolExecutor(max_workers=len(parts),
                                                thread_name_prefix="hypergrad-spmm"),
                 os.getpid())
    # scipy's kernels release the GIL, so the slices run in parallel
    outs = list(_POOL[1].map(lambda p: p[0] @ xn[p[1]:p[2]], parts))
    out = np.asarray(outs[0])
    for o in outs[1:]:
        out += o
    return torch.from_numpy(out)


def _is_legacy_batched(x: Tensor) -> bool:
    f = getattr(torch._C._functorch, "is_legacy_batchedtensor", None)
    return bool(f is not None and f(x))


def _legacy_batched_spmm(op: SparseOperator, x: Tensor) -> Tensor:
    """``A @ x`` for a tensor batched by torch's legacy vmap, which
    ``torch.autograd.grad(..., is_grads_batched=True)`` runs on: its batching rules for
    ``mv``/``mm`` expand ``A``, which sparse tensors cannot do. Peel the batch dimension off
    (innermost level first), do one sparse x dense-matrix product, and put it back."""
    top = torch._C._vmapmode_increment_nesting() - 1  # the innermost active legacy level
    torch._C._vmapmode_decrement_nesting()
    for level in range(top, 0, -1):
        try:
            # batch_size=-1 is rejected (expand into a new leading dim) unless x is batched at
            # this level, which makes this call a membership test as well
            phys = torch._remove_batch_dim(x, level, -1, 0)
        except RuntimeError:
            continue
        # the result goes back batch-first in memory: forward-mode AD restrides tangents with
        # as_strided, which legacy vmap refuses for inner batch dimensions
        b = phys.shape[0]
        if phys.dim() == 2:  # (B, n) -> (n, B)
            out = _spmm(op, phys.t())  # (m, B), possibly still batched at outer levels
            return torch._add_batch_dim(out.t().contiguous(), 0, level)
        n, k = phys.shape[1], phys.shape[2]  # (B, n, k) -> (n, B*k)
        out = _spmm(op, phys.movedim(0, 1).reshape(n, b * k))
        out = out.reshape(out.shape[0], b, k).movedim(1, 0).contiguous()
        return torch._add_batch_dim(out, 0, level)
    raise RuntimeError("SparseOperator: could not find the vmap level of a batched input; "
                       "please report this with your torch version.")  # pragma: no cover


class _SparseMatmul(torch.autograd.Function):
    """``y = A x`` with ``A`` constant. backward, jvp and vmap all re-enter this Function (with
    ``A^T`` for backward), so every composition of AD transforms stays on the sparse kernels."""

    @staticmethod
    def forward(x: Tensor, op: SparseOperator) -> Tensor:  # type: ignore[override]
        return _spmm(op, x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.op = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return _SparseMatmul.apply(grad_out, ctx.op.T), None

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor, _op_t: Any) -> Tensor:  # type: ignore[override]
        return _SparseMatmul.apply(x_t, ctx.op)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, None], x: Tensor,
             op: SparseOperator) -> tuple[Tensor, int | None]:
        bdim = in_dims[0]
        if bdim is None:
            return _SparseMatmul.apply(x, op), None
        if x.dim() == 2:
            # a batch of vectors: (n, B) right-hand sides, one sparse x dense-matrix product
            return _SparseMatmul.apply(x.movedim(bdim, 1), op), 1
        # a batch of (n, k) matrices -> (n, B*k)
        xb = x.movedim(bdim, 1)
        n, b, k = xb.shape
        out = _SparseMatmul.apply(xb.reshape(n, b * k), op)
        return out.reshape(out.shape[0], b, k), 1


# ----------------------------------------------------------------------------------------------
# the operator


class SparseOperator:
    """A fixed sparse matrix ``A`` of shape ``(m, n)`` as a differentiable linear map.

    Stores CSR copies of ``A`` and ``A^T`` (int32 indices when ``nnz``, ``m`` and ``n`` fit in
    int32, else int64) with float32 or float64 values on one device. ``op @ x`` is
    differentiable with respect to ``x`` (not ``A``) under plain autograd (double backward
    included), ``torch.autograd.grad(..., is_grads_batched=True)``, forward-mode AD and the
    ``torch.func`` transforms (``grad``, ``vjp``, ``jvp``, ``vmap`` and their compositions).

    Args:
        A: a torch sparse tensor (COO, CSR or CSC), a dense 2-D tensor, a ``scipy.sparse`` matrix
            or array, or another :class:`SparseOperator`.
        dtype: ``torch.float32`` or ``torch.float64``; ``None`` keeps the data's float type
            (other types become ``torch.get_default_dtype()``).
        index_dtype: ``torch.int32``, ``torch.int64`` or ``None`` (int32 whenever it fits).
        device: where to store the operator (default: where ``A`` is).
        validate: check the index structure and that all values are finite (one O(nnz) pass).
            ``validate=False`` is for arrays known to be valid: an index out of range then
            corrupts memory (the transpose and the kernels write and read by it).

    The operator may share memory with its inputs (e.g. numpy arrays given to
    :meth:`from_csr`); do not modify them in place afterwards. Duplicate entries are summed.
    """

    __slots__ = ("_A", "_At", "_transpose", "_scatter_cache", "__weakref__")

    def __init__(self, A: Any, *, dtype: torch.dtype | None = None,
                 index_dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                 validate: bool = True) -> None:
        kw: dict[str, Any] = dict(dtype=dtype, index_dtype=index_dtype, device=device,
                                  validate=validate)
        api = "SparseOperator"
        if isinstance(A, SparseOperator):
            parts = A.to(device=device, dtype=dtype)
            if index_dtype is not None and index_dtype != parts.index_dtype:
                parts = SparseOperator.from_torch(parts._A, **kw)
            self._set(parts._A, parts._At)
            return
        if isinstance(A, Tensor):
            self._set(*_parts_from_torch(api, A, **kw))
            return
        if _is_scipy_sparse(A):
            self._set(*_parts_from_scipy(api, A, **kw))
            return
        raise TypeError(f"{api}: A must be a torch sparse tensor (COO, CSR or CSC), a dense 2-D "
                        f"tensor or a scipy.sparse matrix, got {type(A).__name__}. For index "
                        f"arrays use SparseOperator.from_coo(rows, cols, values, shape) or "
                        f"SparseOperator.from_csr(crow, col, values, shape).")

    def _set(self, A: Tensor, At: Tensor) -> None:
        self._A = A
        self._At = At
        self._transpose: SparseOperator | None = None
        self._scatter_cache: tuple[int, list[Any]] | None = None

    @classmethod
    def _wrap(cls, A: Tensor, At: Tensor) -> SparseOperator:
        obj = cls.__new__(cls)
        obj._set(A, At)
        return obj

    # pickling / deepcopy / torch.save: sparse CSR tensors have no storage to copy, so the
    # state is their dense index and value arrays
    def __getstate__(self) -> dict[str, Any]:
        return {k: (M.crow_indices(), M.col_indices(), M.values(), tuple(M.shape))
                for k, M in (("A", self._A), ("At", self._At))}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._set(_csr_tensor(*state["A"]), _csr_tensor(*state["At"]))

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def from_torch(cls, A: Tensor, *, dtype: torch.dtype | None = None,
                   index_dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None,
                   validate: bool = True) -> SparseOperator:
        """From a torch tensor ``A`` of shape ``(m, n)``: sparse COO (coalesced here), CSR, CSC,
        or dense. ``A`` is detached: the operator is a constant."""
        if not isinstance(A, Tensor):
            raise TypeError(f"SparseOperator.from_torch: A must be a torch.Tensor, got "
                            f"{type(A).__name__}; use SparseOperator.from_scipy for scipy "
                            f"matrices.")
        return cls._wrap(*_parts_from_torch("SparseOperator.from_torch", A, dtype=dtype,
                                            index_dtype=index_dtype, device=device,
                                            validate=validate))

    @classmethod
    def from_scipy(cls, A: Any, *, dtype: torch.dtype | None = None,
                   index_dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None,
                   validate: bool = True) -> SparseOperator:
        """From a ``scipy.sparse`` matrix or array of shape ``(m, n)`` (any format; CSR and CSC
        are used without conversion)."""
        return cls._wrap(*_parts_from_scipy("SparseOperator.from_scipy", A, dtype=dtype,
                                            index_dtype=index_dtype, device=device,
                                            validate=validate))

    @classmethod
    def from_coo(cls, rows: Any, cols: Any, values: Any, shape: Sequence[int], *,
                 dtype: torch.dtype | None = None, index_dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None,
                 validate: bool = True) -> SparseOperator:
        """From coordinates: ``A[rows[i], cols[i]] += values[i]``; ``rows``, ``cols``,
        ``values`` are 1-D arrays or tensors of length ``nnz``, ``shape = (m, n)``. Duplicates
        are summed."""
        return cls._wrap(*_parts_from_coo("SparseOperator.from_coo", rows, cols, values, shape,
                                          dtype=dtype, index_dtype=index_dtype, device=device,
                                          validate=validate))

    @classmethod
    def from_csr(cls, crow: Any, col: Any, values: Any, shape: Sequence[int], *,
                 dtype: torch.dtype | None = None, index_dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None,
                 validate: bool = True) -> SparseOperator:
        """From CSR arrays: ``crow`` (m+1,) row pointer, ``col`` (nnz,) column indices,
        ``values`` (nnz,), ``shape = (m, n)``. Arrays already of the stored types are used
        without a copy (numpy arrays included), so this is the memory-lean way in."""
        return cls._wrap(*_parts_from_csr("SparseOperator.from_csr", crow, col, values, shape,
                                          dtype=dtype, index_dtype=index_dtype, device=device,
                                          validate=validate))

    # -- properties --------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        """``(m, n)``."""
        return (int(self._A.shape[0]), int(self._A.shape[1]))

    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        return int(self._A._nnz())

    @property
    def dtype(self) -> torch.dtype:
        return self._A.dtype

    @property
    def index_dtype(self) -> torch.dtype:
        return self._A.crow_indices().dtype

    @property
    def device(self) -> torch.device:
        return self._A.device

    @property
    def nbytes(self) -> int:
        """Bytes held by both stored CSR copies."""
        return sum(t.numel() * t.element_size() for M in (self._A, self._At)
                   for t in (M.crow_indices(), M.col_indices(), M.values()))

    @property
    def T(self) -> SparseOperator:
        """The transposed operator ``A^T`` (n, m): the two stored copies swapped, no copy."""
        if self._transpose is None:
            t = SparseOperator._wrap(self._At, self._A)
            t._transpose = self
            self._transpose = t
        return self._transpose

    # -- products ----------------------------------------------------------------------------

    def _check_x(self, api: str, x: Any, n: int, axis: int, expected: str) -> None:
        if isinstance(x, SparseOperator):  # op @ op: no conversion helps
            raise TypeError(f"{api}: x is another SparseOperator; a product of two sparse "
                            f"operators is not supported: apply them one after the other to a "
                            f"dense tensor, (op1 @ (op2 @ x)).")
        if not isinstance(x, Tensor):
            raise TypeError(f"{api}: x must be a torch.Tensor, got {type(x).__name__}; convert "
                            f"with torch.as_tensor(x, dtype={self.dtype}).")
        if x.layout != torch.strided:
            raise TypeError(f"{api}: x has layout {x.layout}; pass a dense tensor "
                            f"(x.to_dense()).")
        if x.dim() not in (1, 2) or x.shape[axis if x.dim() == 2 else 0] != n:
            raise ValueError(f"{api}: x has shape {tuple(x.shape)}, expected {expected}.")
        if x.dtype != self.dtype:
            other = f" or use op.to(dtype={x.dtype})" if x.dtype in _FLOATS else ""
            raise TypeError(f"{api}: x has dtype {x.dtype}, but the operator holds {self.dtype}; "
                            f"convert with x.to({self.dtype}){other}.")
        if x.device != self.device:
            raise ValueError(f"{api}: x is on {x.device} but the operator is on {self.device}; "
                             f"move one of them (x.to(op.device) or op.to(x.device)).")

    def matmul(self, x: Tensor) -> Tensor:
        """``A @ x``: ``x`` of shape ``(n,)`` -> ``(m,)``, or ``(n, k)`` -> ``(m, k)``.
        Differentiable with respect to ``x`` in every autograd / ``torch.func`` mode."""
        m, n = self.shape
        self._check_x("SparseOperator.matmul", x, n, 0,
                      f"({n},) or ({n}, k) (one right-hand side per column)")
        return _SparseMatmul.apply(x, self)

    def rmatmul(self, x: Tensor) -> Tensor:
        """``x @ A``: ``x`` of shape ``(m,)`` -> ``(n,)``, or ``(k, m)`` -> ``(k, n)``."""
        m, n = self.shape
        self._check_x("SparseOperator.rmatmul", x, m, 1,
                      f"({m},) or (k, {m}) (one left-hand side per row)")
        if x.dim() == 1:
            return _SparseMatmul.apply(x, self.T)
        return _SparseMatmul.apply(x.t(), self.T).t()

    __array_ufunc__ = None  # numpy @ op: numpy hands it to __rmatmul__ (its own error read
    # "matmul: Input operand 1 does not have enough dimensions")

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)

    def __rmatmul__(self, x: Tensor) -> Tensor:
        return self.rmatmul(x)

    # -- conversions -------------------------------------------------------------------------

    def to(self, device: torch.device | str | None = None,
           dtype: torch.dtype | None = None) -> SparseOperator:
        """A copy on ``device`` and/or with float ``dtype`` (``self`` if nothing changes)."""
        if dtype is not None and dtype not in _FLOATS:
            raise TypeError(f"SparseOperator.to: dtype={dtype} is not supported; pass "
                            f"torch.float32 or torch.float64.")
        dev = torch.device(device) if device is not None else self.device
        dt = dtype if dtype is not None else self.dtype
        if dev == self.device and dt == self.dtype:
            return self

        def move(M: Tensor) -> Tensor:
            return _csr_tensor(M.crow_indices().to(dev), M.col_indices().to(dev),
                               M.values().to(device=dev, dtype=dt), (M.shape[0], M.shape[1]))

        return SparseOperator._wrap(move(self._A), move(self._At))

    def to_sparse_csr(self) -> Tensor:
        """The stored CSR tensor of ``A`` (shared, not a copy)."""
        return self._A

    def to_dense(self) -> Tensor:
        """``A`` as a dense ``(m, n)`` tensor (small matrices only)."""
        with _quiet_sparse():
            return self._A.to_dense()

    def __repr__(self) -> str:
        m, n = self.shape
        return (f"SparseOperator(shape=({m}, {n}), nnz={self.nnz}, dtype={self.dtype}, "
                f"index_dtype={self.index_dtype}, device={self.device})")


def _is_scipy_sparse(A: Any) -> bool:
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover
        return False
    return bool(sp.issparse(A))


# ----------------------------------------------------------------------------------------------
# loaders


def load_npz(path: str | os.PathLike[str], *, dtype: torch.dtype | None = None,
             index_dtype: torch.dtype | None = None,
             device: torch.device | str | None = None) -> SparseOperator:
    """A :class:`SparseOperator` from a ``scipy.sparse.save_npz`` file (CSR, CSC or COO; other
    scipy formats are converted). ``dtype=None`` keeps the file's float type;
    ``index_dtype``: the indices' integer type (``None``: int32 where the matrix fits, else
    int64); ``device``: where the operator's tensors go (``None``: the CPU).

    Raises ValueError for files that are not scipy sparse ``.npz``, arrays of inconsistent
    shapes, index types too narrow for the matrix size, out-of-range indices or non-finite values.
    """
    api = "load_npz"
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise FileNotFoundError(f"{api}: no file at {p!r}.")
    try:
        npz = np.load(p, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"{api}: {p!r} is not a readable .npz file ({e}); save the matrix with "
                         f"scipy.sparse.save_npz(path, A).") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise ValueError(f"{api}: {p!r} holds a single array, not a scipy.sparse .npz; save the "
                         f"matrix with scipy.sparse.save_npz(path, A).")
    kw: dict[str, Any] = dict(dtype=dtype, index_dtype=index_dtype, device=device, validate=True)
    try:
        with npz:
            return _npz_members(api, p, npz, kw)
    except (KeyError, EOFError, OSError, AttributeError, zipfile.BadZipFile) as e:
        # a member read later (a bad CRC, an empty or missing member, a format that is no
        # string) came out raw, without the ValueError the docstring promises (the sparse probe)
        raise ValueError(f"{api}: {p!r} is not a readable scipy.sparse .npz ({type(e).__name__}: "
                         f"{e}); save the matrix with scipy.sparse.save_npz(path, A).") from None
    except ValueError as e:
        if str(e).startswith(api):
            if p in str(e) or repr(p) in str(e):
                raise
            raise _naming_file(api, p, e) from None
        raise ValueError(f"{api}: {p!r} is not a readable scipy.sparse .npz ({e}); save the "
                         f"matrix with scipy.sparse.save_npz(path, A).") from None


def _naming_file(api: str, p: str, err: ValueError) -> ValueError:
    """``err``, one of the checks of the values (which name no file: a NaN "at row 0, column
    3" of which file?), with the file's path after ``api``."""
    return ValueError(f"{api}: {p!r}: " + str(err).removeprefix(f"{api}: "))


def _npz_members(api: str, p: str, npz: Any, kw: dict[str, Any]) -> SparseOperator:
    """:func:`load_npz`'s reading of the archive's members."""
    keys = set(npz.files)
    if "format" not in keys or "shape" not in keys:
        raise ValueError(f"{api}: {p!r} is not a scipy.sparse .npz (it holds "
                         f"{sorted(keys)}); save the matrix with "
                         f"scipy.sparse.save_npz(path, A).")
    fmt = npz["format"].item()
    fmt = fmt.decode("ascii") if isinstance(fmt, bytes) else str(fmt)
    shape_arr = npz["shape"]
    if shape_arr.ndim != 1 or shape_arr.size != 2 or shape_arr.dtype.kind not in "iu":
        # (a float shape [9.7, 6.2] was truncated to (9, 6))
        raise ValueError(f"{api}: {p!r} stores shape {shape_arr.tolist()}; a 2-D matrix "
                         f"(rows, cols) of ints is required.")
    shape = _check_shape(api, [int(s) for s in shape_arr])
    if fmt not in ("csr", "csc", "coo"):
        import scipy.sparse as sp

        return SparseOperator._wrap(*_parts_from_scipy(api, sp.load_npz(p), **kw))
    data = npz["data"]
    if data.ndim != 1:
        raise ValueError(f"{api}: data has shape {data.shape}, expected 1-D (nnz,).")
    _check_data_dtype(api, data)
    nnz = data.shape[0]
    if fmt in ("csr", "csc"):
        indices, indptr = npz["indices"], npz["indptr"]
        major, minor = (shape[0], shape[1]) if fmt == "csr" else (shape[1], shape[0])
        what = "column" if fmt == "csr" else "row"
        _check_index_array(api, f"{what} indices", indices, minor - 1,
                           f"the matrix has {minor} {what}s")
        _check_index_array(api, "indptr", indptr, nnz, f"nnz={nnz}")
        if indices.shape != (nnz,):
            raise ValueError(f"{api}: indices have shape {indices.shape} but data has "
                             f"{nnz} entries; the file is inconsistent.")
        if indptr.shape != (major + 1,):
            raise ValueError(f"{api}: indptr has shape {indptr.shape}, expected "
                             f"({major + 1},) for shape {shape} in {fmt} format; the file is "
                             f"inconsistent.")
        return SparseOperator._wrap(*_build(
            api, torch.from_numpy(indptr.astype(np.int64, copy=False)),
            torch.from_numpy(indices.astype(np.int64, copy=False)),
            torch.from_numpy(data), shape, transposed=(fmt == "csc"), **kw))
    if "coords" in keys:
        coords = npz["coords"]
        if coords.ndim != 2 or coords.shape[0] != 2:
            raise ValueError(f"{api}: coords have shape {coords.shape}, expected (2, nnz).")
        row, col = coords[0], coords[1]
    else:
        row, col = npz["row"], npz["col"]
    _check_index_array(api, "row indices", row, shape[0] - 1,
                       f"the matrix has {shape[0]} rows")
    _check_index_array(api, "column indices", col, shape[1] - 1,
                       f"the matrix has {shape[1]} columns")
    if row.shape != (nnz,) or col.shape != (nnz,):
        raise ValueError(f"{api}: row/col indices have shapes {row.shape}/{col.shape} but "
                         f"data has {nnz} entries; the file is inconsistent.")
    return SparseOperator._wrap(*_parts_from_coo(
        api, row.astype(np.int64, copy=False), col.astype(np.int64, copy=False),
        data, shape, **kw))


def _check_data_dtype(api: str, data: np.ndarray) -> None:
    if data.dtype.kind not in "biuf":
        raise TypeError(f"{api}: data has dtype {data.dtype}; SparseOperator holds real "
                        f"float32/float64 values.")


def _check_index_array(api: str, name: str, a: np.ndarray, needed: int, why: str) -> None:
    if a.ndim != 1:
        raise ValueError(f"{api}: {name} have shape {a.shape}, expected 1-D.")
    if a.dtype.kind not in "iu":
        raise ValueError(f"{api}: {name} are stored as {a.dtype}, not integers; the file is "
                         f"not a valid sparse matrix.")
    if needed > np.iinfo(a.dtype).max:
        raise ValueError(f"{api}: {name} are stored as {a.dtype}, which holds values up to "
                         f"{np.iinfo(a.dtype).max}, but {why}; the indices have overflowed. "
                         f"Re-save with a wider index type (e.g. int64 index arrays before "
                         f"scipy.sparse.save_npz).")


def load_svmlight(path: str | os.PathLike[str], n_features: int | None = None, *,
                  dtype: torch.dtype | None = None, index_dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None,
                  zero_based: bool | str = "auto") -> tuple[SparseOperator, Tensor]:
    """Read an svmlight / libsvm file with ``sklearn.datasets.load_svmlight_file``.

    Returns ``(op, y)``: the design matrix as a :class:`SparseOperator` of shape
    ``(n_samples, n_features)`` and the targets ``y`` of shape ``(n_samples,)``, both in
    ``dtype`` (default ``torch.get_default_dtype()``). ``n_features=None`` infers the width from
    the file. ``index_dtype`` and ``device`` as :func:`load_npz`'s; ``zero_based``: whether the
    file's feature indices start at 0 (``"auto"``: scikit-learn's guess from the file).
    Raises ValueError for unparsable files, a too small ``n_features`` and non-finite
    features or targets.
    """
    api = "load_svmlight"
    if n_features is not None and (isinstance(n_features, bool)
                                   or not isinstance(n_features, (int, np.integer))):
        raise TypeError(f"{api}: n_features must be an int or None, got "
                        f"{type(n_features).__name__} {n_features!r}.")
    if n_features is not None and n_features < 1:
        raise ValueError(f"{api}: n_features={n_features} must be >= 1 (or None to infer it).")
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise FileNotFoundError(f"{api}: no file at {p!r}.")
    from sklearn.datasets import load_svmlight_file

    with open(p, "rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":  # a zip archive: read as text, it failed on b'PK\x03\x04...'
        raise ValueError(f"{api}: {p!r} is a zip archive (a scipy .npz?), not an svmlight "
                         f"text file: read it with load_npz (hypergrad-run reads a "
                         f"data_path ending in .npz so: rename it).")
    try:
        X, y = load_svmlight_file(p, n_features=n_features, dtype=np.float64,
                                  zero_based=zero_based)
    except ValueError as e:
        said = str(e).rstrip(".")
        if "n_features" in said:
            hint = " Pass a larger n_features, or None to infer it."
        elif "Invalid index 0" in said:  # a zero-based file read as one-based
            hint = (" Its feature indices start at 0: pass zero_based=True (hypergrad-run: "
                    "task.zero_based=true).")
        elif re.search(r"could not convert string to float: b'[^']*,", said):
            hint = (" Its labels are lists (a multilabel file, '0,1 idx:value ...'): "
                    "multilabel files are not supported; give one target per line.")
        else:
            hint = " Check the file is in svmlight/libsvm format ('label idx:value ...')."
        raise ValueError(f"{api}: could not read {p!r}: {said}.{hint}") from None
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise ValueError(f"{api}: targets have shape {y.shape} for {X.shape[0]} samples; "
                         f"multilabel files are not supported.")
    if not np.isfinite(y).all():
        bad = int(np.flatnonzero(~np.isfinite(y))[0])
        raise ValueError(f"{api}: target of sample {bad} is {y[bad]} (non-finite); clean the "
                         f"file's labels first.")
    dt = dtype if dtype is not None else _resolve_dtype(api, torch.float16, None)
    try:
        op = SparseOperator._wrap(*_parts_from_scipy(api, X, dtype=dt, index_dtype=index_dtype,
                                                     device=device, validate=True))
    except ValueError as e:
        raise _naming_file(api, p, e) from None
    return op, torch.as_tensor(y, dtype=dt, device=op.device)
