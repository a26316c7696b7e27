"""SparseOperator: products, gradients and Hessian-vector products against dense references in
every AD mode, constructors, errors, and the .npz / svmlight loaders."""

from __future__ import annotations

import copy
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.datasets import dump_svmlight_file
from torch.func import grad, jacfwd, jacrev, jvp, vjp, vmap

import hypergrad.sparse
from hypergrad.sparse import SparseOperator, load_npz, load_svmlight

pytestmark = [
    # torch.func.jvp loads torch's jvp decompositions through torch.jit.script, which warns
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
    # the dense/sparse references built here trigger torch's one-time beta notice
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning"),
]

_AT = r"(?:'[^']*': )?"
"""The file's path, which the loaders' checks of the values put after their name."""
F64 = torch.float64
M, N, K = 11, 7, 3  # rows, cols, Hessian-vector products per batch


def _scipy(m: int = M, n: int = N, density: float = 0.35, seed: int = 0,
           dtype: type = np.float64) -> sp.csr_matrix:
    S = sp.random(m, n, density, format="csr", random_state=seed, dtype=dtype)
    S.data = S.data * 2 - 1  # signed values
    return S


@pytest.fixture(params=["gather", "scatter"])
def kernel(request, monkeypatch) -> str:
    """Run a test with MKL's gather kernel only, or with the threaded scipy scatter kernel for
    wide operators (A^T here) switched on at any size (it normally starts at 4M non-zeros)."""
    if request.param == "gather":
        monkeypatch.setattr(hypergrad.sparse, "_SCATTER", False)
    else:
        monkeypatch.setattr(hypergrad.sparse, "_SCATTER_MIN_NNZ", 0)
        monkeypatch.setattr(hypergrad.sparse, "_SCATTER_MIN_BYTES", 0)
    return request.param


@pytest.fixture
def problem() -> dict:
    S = _scipy()
    g = torch.Generator().manual_seed(1)
    return dict(
        S=S, op=SparseOperator.from_scipy(S), A=torch.tensor(S.toarray()),
        y=torch.randn(M, dtype=F64, generator=g), w=torch.rand(M, dtype=F64, generator=g) + 0.5,
        x=torch.randn(N, dtype=F64, generator=g), X=torch.randn(N, 2, dtype=F64, generator=g),
        V=torch.randn(K, N, dtype=F64, generator=g), VX=torch.randn(K, N, 2, dtype=F64,
                                                                     generator=g))


def _loss(A, x, y, w):
    """0.5 ||W (A x - y)||^2 + 0.3 sum softplus(A x) + 0.05 sum x^4 (x: (n,) or (n, k))."""
    z = A @ x
    r = z - (y if x.dim() == 1 else y[:, None])
    ww = w if x.dim() == 1 else w[:, None]
    return (0.5 * (ww * r).square().sum() + 0.3 * torch.nn.functional.softplus(z).sum()
            + 0.05 * x.pow(4).sum())


def _reference(A, x, y, w, V):
    """Closed-form gradient and Hessian-vector products (V: (K, *x.shape)) with dense A."""
    z = A @ x
    yy, ww = (y, w) if x.dim() == 1 else (y[:, None], w[:, None])
    s = torch.sigmoid(z)
    g = A.T @ (ww**2 * (z - yy) + 0.3 * s) + 0.2 * x**3
    d = ww**2 + 0.3 * s * (1 - s)
    HV = torch.stack([A.T @ (d * (A @ v)) + 0.6 * x**2 * v for v in V])
    return g, HV


def _hvp(mode: str, A, x, y, w, V):
    f = lambda x_: _loss(A, x_, y, w)
    if mode == "vmap_vjp":
        g, vjp_fn = vjp(grad(f), x)
        return g, vmap(vjp_fn)(V)[0]
    if mode == "fwd_over_rev":
        g = grad(f)(x)
        return g, vmap(lambda v: jvp(grad(f), (x,), (v,))[1])(V)
    xx = x.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(f(xx), xx, create_graph=True)
    if mode == "is_grads_batched":
        (HV,) = torch.autograd.grad(g, xx, V, is_grads_batched=True)
    elif mode == "loop":
        HV = torch.stack([torch.autograd.grad(g, xx, v, retain_graph=True)[0] for v in V])
    else:  # plain double backward: .backward() on <g, v> accumulates H v into x.grad
        cols = []
        for v in V:
            xx.grad = None
            (g * v).sum().backward(retain_graph=True)
            cols.append(xx.grad.clone())
        HV = torch.stack(cols)
    return g.detach(), HV.detach()


MODES = ["vmap_vjp", "is_grads_batched", "fwd_over_rev", "loop", "double_backward"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("matrix_x", [False, True], ids=["x_vector", "x_matrix"])
def test_gradient_and_hvps_match_dense(kernel, problem, mode, matrix_x):
    p = problem
    x, V = (p["X"], p["VX"]) if matrix_x else (p["x"], p["V"])
    g_ref, HV_ref = _reference(p["A"], x, p["y"], p["w"], V)
    g, HV = _hvp(mode, p["op"], x, p["y"], p["w"], V)
    g_dense, HV_dense = _hvp(mode, p["A"], x, p["y"], p["w"], V)
    torch.testing.assert_close(g_dense, g_ref)  # the reference itself is right
    torch.testing.assert_close(HV_dense, HV_ref)
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(HV, HV_ref)
    assert HV.shape == V.shape


def test_product_matches_dense(kernel, problem):
    op, A = problem["op"], problem["A"]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, dtype=F64, generator=g)
    X = torch.randn(N, 4, dtype=F64, generator=g)
    torch.testing.assert_close(op @ x, A @ x)
    torch.testing.assert_close(op.matmul(X), A @ X)
    torch.testing.assert_close(op @ X.t().contiguous().t(), A @ X)  # column-major
    torch.testing.assert_close(op @ X[:, 1], A @ X[:, 1])  # strided vector
    torch.testing.assert_close(op @ torch.ones(1, dtype=F64).expand(N), A.sum(1))  # stride 0
    xs = torch.randn(2 * N, 3, dtype=F64, generator=g)[::2, ::2]  # neither row- nor col-major
    torch.testing.assert_close(op @ xs, A @ xs)
    u, U = torch.randn(M, dtype=F64, generator=g), torch.randn(3, M, dtype=F64, generator=g)
    torch.testing.assert_close(u @ op, u @ A)
    torch.testing.assert_close(U @ op, U @ A)
    torch.testing.assert_close(op.T @ u, A.T @ u)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_scatter_kernel_matches_gather_and_is_chosen_for_wide_operators(monkeypatch, threads):
    S = _scipy(m=40, n=90, density=0.2, seed=7)  # wide: 40 x 90
    op = SparseOperator(S)
    A = torch.tensor(S.toarray())
    calls = []
    real = hypergrad.sparse._scatter_spmm
    monkeypatch.setattr(hypergrad.sparse, "_scatter_spmm",
                        lambda o, x: calls.append(o.shape) or real(o, x))
    monkeypatch.setattr(hypergrad.sparse, "_SCATTER_MIN_NNZ", 0)
    monkeypatch.setattr(hypergrad.sparse, "_SCATTER_MIN_BYTES", 90 * 8 * 2)  # x of >= 2 columns
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(8)
        x, X = torch.randn(90, dtype=F64, generator=g), torch.randn(90, 5, dtype=F64, generator=g)
        torch.testing.assert_close(op @ X, A @ X)
        torch.testing.assert_close(op @ X.t().contiguous().t(), A @ X)
        torch.testing.assert_close(vmap(lambda v: op @ v)(X.t()), (A @ X).t())
        assert calls == [(40, 90)] * 3
        parts = op._scatter_cache[1]
        assert len(parts) == threads  # one slice of the non-zeros per thread, no copies
        assert all(np.shares_memory(p[0].data, op._At.values().numpy()) for p in parts)
        assert sum(p[0].nnz for p in parts) == op.nnz
        torch.testing.assert_close(op @ x, A @ x)  # x too small to fall out of cache: gather
        u = torch.randn(40, 3, dtype=F64, generator=g)
        torch.testing.assert_close(op.T @ u, A.T @ u)  # tall: gather
        monkeypatch.setattr(hypergrad.sparse, "_SCATTER_MIN_NNZ", op.nnz + 1)
        torch.testing.assert_close(op @ X, A @ X)  # few non-zeros: gather
        assert len(calls) == 3
    finally:
        torch.set_num_threads(old_threads)


def test_transpose_swaps_stored_copies(problem):
    op = problem["op"]
    t = op.T
    assert t.shape == (N, M) and t.nnz == op.nnz
    assert t.to_sparse_csr() is op._At and t._At is op._A  # swapped, not rebuilt
    assert t.T is op
    torch.testing.assert_close(t.to_dense(), problem["A"].T)


def test_constructors_agree(problem):
    S, A = problem["S"], problem["A"]
    coo = S.tocoo()
    rows = np.concatenate([coo.row, coo.row[:3]])  # duplicates are summed
    cols = np.concatenate([coo.col, coo.col[:3]])
    vals = np.concatenate([coo.data, np.ones(3)])
    A_dup = A.clone()
    for r, c in zip(coo.row[:3], coo.col[:3], strict=True):
        A_dup[r, c] += 1
    cases = {
        "scipy_csr": (SparseOperator.from_scipy(S), A),
        "scipy_csc": (SparseOperator.from_scipy(S.tocsc()), A),
        "scipy_coo": (SparseOperator(S.tocoo()), A),
        "scipy_array": (SparseOperator(sp.csr_array(S)), A),
        "torch_dense": (SparseOperator.from_torch(A), A),
        "torch_csr": (SparseOperator(A.to_sparse_csr()), A),
        "torch_csc": (SparseOperator.from_torch(A.to_sparse_csc()), A),
        "torch_coo_dups": (SparseOperator.from_torch(torch.sparse_coo_tensor(
            torch.tensor(np.stack([rows, cols])), torch.tensor(vals), (M, N))), A_dup),
        "from_coo_dups": (SparseOperator.from_coo(rows, cols, vals, (M, N)), A_dup),
        "from_coo_torch": (SparseOperator.from_coo(torch.tensor(coo.row), torch.tensor(coo.col),
                                                   torch.tensor(coo.data), (M, N)), A),
        "from_csr": (SparseOperator.from_csr(S.indptr, S.indices, S.data, S.shape), A),
        "copy": (SparseOperator(problem["op"]), A),
    }
    x = torch.randn(N, dtype=F64)
    for name, (op, ref) in cases.items():
        assert op.shape == (M, N), name
        assert op.dtype == F64 and op.index_dtype == torch.int32, name
        torch.testing.assert_close(op.to_dense(), ref, msg=name)
        torch.testing.assert_close(op.T.to_dense(), ref.T, msg=name)
        torch.testing.assert_close(op @ x, ref @ x, msg=name)
    assert cases["scipy_csr"][0].nnz == S.nnz
    assert SparseOperator(S, index_dtype=torch.int64).index_dtype == torch.int64
    assert SparseOperator.from_scipy(S.astype(np.int64)).dtype == torch.get_default_dtype()


def test_torch_transpose_path_matches_scipy(monkeypatch):
    """Off the CPU the transpose is built with torch ops (argsort); check that path here."""
    S = _scipy(m=30, n=17, density=0.3, seed=5)
    ref = SparseOperator(S)
    monkeypatch.setattr(hypergrad.sparse, "_SCIPY_TRANSPOSE", False)
    op = SparseOperator(S)
    for a, b in ((op.T, ref.T), (op, ref)):
        ca, cb = a.to_sparse_csr(), b.to_sparse_csr()
        assert torch.equal(ca.crow_indices(), cb.crow_indices())
        assert torch.equal(ca.col_indices(), cb.col_indices())
        assert torch.equal(ca.values(), cb.values())
        assert ca.crow_indices().dtype == torch.int32


def test_pickle_deepcopy_and_torch_save(problem, tmp_path):
    op = problem["op"]
    for other in (copy.deepcopy(op), pickle.loads(pickle.dumps(op))):
        torch.testing.assert_close(other.to_dense(), problem["A"])
        torch.testing.assert_close(other.T.to_dense(), problem["A"].T)
    assert copy.deepcopy(op).to_sparse_csr().values().data_ptr() != \
        op.to_sparse_csr().values().data_ptr()
    torch.save(op.T, tmp_path / "op.pt")
    loaded = torch.load(tmp_path / "op.pt", weights_only=False)
    torch.testing.assert_close(loaded @ problem["y"], problem["A"].T @ problem["y"])


def test_from_csr_shares_numpy_memory():
    S = _scipy(dtype=np.float32)
    op = SparseOperator.from_csr(S.indptr, S.indices, S.data, S.shape)
    assert op.to_sparse_csr().values().data_ptr() == S.data.ctypes.data
    assert op.to_sparse_csr().col_indices().data_ptr() == S.indices.ctypes.data


@pytest.mark.parametrize("shape", [(4,), (4, 2)], ids=["vector", "matrix"])
def test_gradcheck_and_gradgradcheck(kernel, shape):
    op = SparseOperator(_scipy(m=5, n=4, density=0.5, seed=2))
    x = torch.randn(*shape, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: op @ v, (x,), check_forward_ad=True,
                                    check_batched_grad=True, check_batched_forward_grad=True)
    assert torch.autograd.gradgradcheck(lambda v: (op @ v).sin(), (x,), check_fwd_over_rev=True,
                                        check_batched_grad=True)
    assert torch.autograd.gradcheck(lambda v: v @ op.T, (x.detach().t().requires_grad_(),),
                                    check_batched_grad=True)


def test_vmap_in_dims_and_jacobians(kernel, problem):
    op, A = problem["op"], problem["A"]
    g = torch.Generator().manual_seed(4)
    B = torch.randn(N, 5, 2, dtype=F64, generator=g)
    expected = torch.stack([A @ B[:, b, :] for b in range(5)])  # per-sample x: (N, 2)
    for bdim, Bd in ((0, B.permute(1, 0, 2)), (1, B), (2, B.permute(0, 2, 1))):
        torch.testing.assert_close(vmap(lambda v: op @ v, in_dims=bdim)(Bd), expected)
    torch.testing.assert_close(vmap(lambda v: op @ v, in_dims=1)(B[:, :, 0]), (A @ B[:, :, 0]).T)
    torch.testing.assert_close(vmap(vmap(lambda v: op @ v))(B.permute(1, 2, 0)),
                               (A @ B.reshape(N, 10)).reshape(M, 5, 2).permute(1, 2, 0))
    torch.testing.assert_close(vmap(lambda v: op @ v, in_dims=2, out_dims=1)(B),
                               torch.stack([A @ B[..., i] for i in range(2)], 1))
    x = problem["x"]
    torch.testing.assert_close(jacrev(lambda v: op @ v)(x), A)
    torch.testing.assert_close(jacfwd(lambda v: op @ v)(x), A)
    h = torch.func.hessian(lambda v: _loss(op, v, problem["y"], problem["w"]))(x)
    h_ref = torch.func.hessian(lambda v: _loss(A, v, problem["y"], problem["w"]))(x)
    torch.testing.assert_close(h, h_ref)


def test_forward_mode_dual_tensors(kernel, problem):
    op, A = problem["op"], problem["A"]
    x, v = problem["x"], problem["V"][0]
    fwAD = torch.autograd.forward_ad
    with fwAD.dual_level():
        out = op @ fwAD.make_dual(x, v)
        primal, tangent = fwAD.unpack_dual(out)
    torch.testing.assert_close(primal, A @ x)
    torch.testing.assert_close(tangent, A @ v)


def test_float32_smoke(kernel):
    S = _scipy(m=40, n=25, dtype=np.float32)
    op = SparseOperator(S)
    A = torch.tensor(S.toarray())
    assert op.dtype == torch.float32 and op.index_dtype == torch.int32
    x, y = torch.randn(25), torch.randn(40)
    torch.testing.assert_close(op @ x, A @ x)
    f = lambda v, B: 0.5 * (B @ v - y).square().sum()
    g, vjp_fn = vjp(grad(lambda v: f(v, op)), x)
    V = torch.randn(8, 25)
    HV = vmap(vjp_fn)(V)[0]
    assert g.dtype == HV.dtype == torch.float32
    torch.testing.assert_close(g, A.T @ (A @ x - y), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(HV, (A.T @ (A @ V.T)).T, rtol=1e-4, atol=1e-4)
    op64 = op.to(dtype=F64)
    assert op64.dtype == F64 and op.to(dtype=torch.float32) is op
    torch.testing.assert_close(op64 @ x.double(), A.double() @ x.double())


def test_empty_matrix_product_and_grad():
    op = SparseOperator.from_coo([], [], [], (4, 3), dtype=F64)
    assert op.nnz == 0
    x = torch.randn(3, dtype=F64, requires_grad=True)
    out = op @ x
    assert out.shape == (4,) and not out.any()
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros(3, dtype=F64))
    assert (op @ torch.randn(3, 2, dtype=F64)).shape == (4, 2)


# ----------------------------------------------------------------------------------------------
# errors


def test_matmul_errors(problem):
    op = problem["op"]
    with pytest.raises(ValueError, match=r"^SparseOperator\.matmul: x has shape \(5,\), "
                                         r"expected \(7,\) or \(7, k\)"):
        op @ torch.zeros(5, dtype=F64)
    with pytest.raises(ValueError, match=r"SparseOperator\.matmul: x has shape \(7, 2, 2\)"):
        op @ torch.zeros(N, 2, 2, dtype=F64)
    with pytest.raises(TypeError, match=r"SparseOperator\.matmul: x has dtype torch\.float32, "
                                        r"but the operator holds torch\.float64; convert"):
        op @ torch.zeros(N)
    with pytest.raises(TypeError, match=r"SparseOperator\.matmul: x must be a torch\.Tensor, "
                                        r"got ndarray"):
        op.matmul(np.zeros(N))
    with pytest.raises(TypeError, match=r"SparseOperator\.matmul: x has layout torch\.sparse"):
        op @ torch.zeros(N, 1, dtype=F64).to_sparse()
    with pytest.raises(ValueError, match=r"^SparseOperator\.rmatmul: x has shape \(2, 7\), "
                                         r"expected \(11,\) or \(k, 11\)"):
        torch.zeros(2, N, dtype=F64) @ op


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"^SparseOperator\.from_coo: row index 5 at entry 1 is "
                                         r"outside \[0, 5\)"):
        SparseOperator.from_coo([0, 5], [0, 1], [1.0, 2.0], (5, 3))
    with pytest.raises(ValueError, match=r"from_coo: column index -1 at entry 0"):
        SparseOperator.from_coo([0], [-1], [1.0], (5, 3))
    with pytest.raises(ValueError, match=r"from_coo: rows, cols and values must have equal "
                                         r"lengths, got 2, 1 and 1"):
        SparseOperator.from_coo([0, 1], [0], [1.0], (5, 3))
    with pytest.raises(TypeError, match=r"from_coo: rows must hold integers, got dtype "
                                        r"torch\.float64"):
        SparseOperator.from_coo([0.0], [0], [1.0], (5, 3))
    with pytest.raises(ValueError, match=r"from_coo: values have 1 non-finite entr.*nan at "
                                         r"entry 1 \(row 2, column 0\)"):
        SparseOperator.from_coo([0, 2], [1, 0], [1.0, float("nan")], (5, 3))
    with pytest.raises(ValueError, match=r"from_coo: index_dtype=torch\.int32 cannot hold this "
                                         r"matrix \(shape \(3, 2147483653\)"):
        SparseOperator.from_coo([0], [2**31 + 1], [1.0], (3, 2**31 + 5), index_dtype=torch.int32)
    with pytest.raises(ValueError, match=r"from_coo: shape must have 2 entries"):
        SparseOperator.from_coo([0], [0], [1.0], (5,))
    with pytest.raises(ValueError, match=r"from_csr: the row pointer has shape \(3,\), expected "
                                         r"\(4,\) for 3 rows"):
        SparseOperator.from_csr([0, 1, 2], [0, 1], [1.0, 2.0], (3, 2))
    with pytest.raises(ValueError, match=r"from_csr: the row pointer decreases at row 1"):
        SparseOperator.from_csr([0, 2, 1, 2], [0, 1], [1.0, 2.0], (3, 2))
    with pytest.raises(ValueError, match=r"from_csr: column index 7 at entry 1 is outside"):
        SparseOperator.from_csr([0, 1, 2, 2], [0, 7], [1.0, 2.0], (3, 2))
    S = _scipy()
    S.data[4] = np.inf
    with pytest.raises(ValueError, match=r"from_scipy: the matrix has 1 non-finite value\(s\) "
                                         r"\(NaN or inf\), first inf at row \d+, column \d+"):
        SparseOperator.from_scipy(S)
    assert SparseOperator.from_scipy(S, validate=False).nnz == S.nnz
    with pytest.raises(TypeError, match=r"^SparseOperator: A must be a torch sparse tensor"):
        SparseOperator([[1.0]])
    with pytest.raises(TypeError, match=r"from_scipy: expected a scipy\.sparse matrix"):
        SparseOperator.from_scipy(np.eye(3))
    with pytest.raises(TypeError, match=r"from_scipy: the matrix has complex dtype"):
        SparseOperator.from_scipy(sp.eye(3, dtype=np.complex128, format="csr"))
    with pytest.raises(TypeError, match=r"SparseOperator: dtype=torch\.float16 is not "
                                        r"supported; pass torch\.float32 or torch\.float64"):
        SparseOperator(sp.eye(3, format="csr"), dtype=torch.float16)
    with pytest.raises(TypeError, match=r"index_dtype=torch\.int16 is not supported"):
        SparseOperator(sp.eye(3, format="csr"), index_dtype=torch.int16)
    with pytest.raises(ValueError, match=r"from_torch: A must be 2-D"):
        SparseOperator.from_torch(torch.zeros(2, 2, 2))


# ----------------------------------------------------------------------------------------------
# loaders


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_load_npz_roundtrip(tmp_path, fmt, dtype):
    S = _scipy(dtype=dtype).asformat(fmt)
    path = tmp_path / "A.npz"
    sp.save_npz(path, S)
    op = load_npz(path)
    assert op.shape == S.shape and op.nnz == S.nnz
    assert op.dtype == (torch.float32 if dtype == np.float32 else F64)
    torch.testing.assert_close(op.to_dense(), torch.tensor(S.toarray()))
    assert load_npz(str(path), dtype=F64).dtype == F64


def _save_raw_csr(path, *, data, indices, indptr, shape):
    np.savez(path, format=b"csr", shape=np.array(shape), data=data, indices=indices,
             indptr=indptr)


def test_load_npz_errors(tmp_path):
    S = _scipy()
    good = dict(data=S.data, indices=S.indices, indptr=S.indptr, shape=S.shape)
    p = tmp_path / "bad.npz"
    with pytest.raises(FileNotFoundError, match=r"^load_npz: no file at"):
        load_npz(tmp_path / "missing.npz")
    np.savez(p, a=np.zeros(3))
    with pytest.raises(ValueError, match=r"^load_npz: .* is not a scipy\.sparse \.npz \(it holds "
                                         r"\['a'\]\)"):
        load_npz(p)
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}.* is not a readable \.npz file"):
        load_npz(tmp_path / "text.npz")
    _save_raw_csr(p, **{**good, "indptr": S.indptr[:-1]})
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}indptr has shape \({M},\), expected "
                                         rf"\({M + 1},\)"):
        load_npz(p)
    _save_raw_csr(p, **{**good, "indices": S.indices[:-1]})
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}indices have shape .* but data has"):
        load_npz(p)
    _save_raw_csr(p, **{**good, "shape": (M, N, 2)})
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}.* stores shape \[11, 7, 2\]; a 2-D"):
        load_npz(p)
    data = S.data.copy()
    data[2] = np.nan
    _save_raw_csr(p, **{**good, "data": data})
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}the matrix has 1 non-finite value\(s\) "
                                         r"\(NaN or inf\), first nan"):
        load_npz(p)
    # int16 column indices cannot address 40000 columns (they wrapped when saved)
    _save_raw_csr(p, data=np.ones(2), indices=np.array([5, 39999]).astype(np.int16),
                  indptr=np.array([0, 1, 2]), shape=(2, 40000))
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}column indices are stored as int16, "
                                         r"which holds values up to 32767, but the matrix has "
                                         r"40000 columns"):
        load_npz(p)
    _save_raw_csr(p, **{**good, "indices": S.indices + N})
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}column index \d+ at entry 0 is outside"):
        load_npz(p)
    _save_raw_csr(p, data=np.ones(1), indices=np.array([2**31 + 1]), indptr=np.array([0, 1, 1]),
                  shape=(2, 2**31 + 5))
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}index_dtype=torch\.int32 cannot hold"):
        load_npz(p, index_dtype=torch.int32)


def test_load_svmlight_roundtrip(tmp_path):
    S = _scipy()
    y = np.arange(M, dtype=np.float64) - 3.5
    path = tmp_path / "data.svm"
    dump_svmlight_file(S, y, str(path), zero_based=True)
    op, t = load_svmlight(path, n_features=N, zero_based=True)
    assert op.shape == (M, N) and op.dtype == t.dtype == torch.get_default_dtype()
    torch.testing.assert_close(op.to_dense().double(), torch.tensor(S.toarray()),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(t.double(), torch.tensor(y))
    op2, _ = load_svmlight(path, n_features=N + 4, dtype=F64, zero_based=True)
    assert op2.shape == (M, N + 4) and op2.dtype == F64


def test_load_svmlight_errors(tmp_path):
    p = tmp_path / "data.svm"
    p.write_text("1 0:1.5 4:2\n-1 2:3\n")
    with pytest.raises(ValueError, match=r"^load_svmlight: could not read .*n_features"):
        load_svmlight(p, n_features=3, zero_based=True)
    with pytest.raises(ValueError, match=rf"load_svmlight: {_AT}n_features=0 must be >= 1"):
        load_svmlight(p, n_features=0)
    with pytest.raises(TypeError, match=rf"load_svmlight: {_AT}n_features must be an int or None"):
        load_svmlight(p, n_features="5")
    with pytest.raises(ValueError, match=rf"load_svmlight: {_AT}index_dtype=torch\.int32 "
                                         r"cannot hold"):
        load_svmlight(p, n_features=2**31 + 5, index_dtype=torch.int32, zero_based=True)
    p.write_text("1 0:1.5 4:nan\n-1 2:3\n")
    with pytest.raises(ValueError, match=rf"load_svmlight: {_AT}the matrix has 1 non-finite "
                                         r"value\(s\) \(NaN or inf\), first nan at row 0, "
                                         r"column 4"):
        load_svmlight(p, zero_based=True)
    p.write_text("1 0:1.5\ninf 2:3\n")
    with pytest.raises(ValueError, match=rf"load_svmlight: {_AT}target of sample 1 is inf"):
        load_svmlight(p, zero_based=True)
    p.write_text("this is not svmlight\n")
    with pytest.raises(ValueError, match=rf"load_svmlight: {_AT}could not read"):
        load_svmlight(p)
    with pytest.raises(FileNotFoundError, match=rf"load_svmlight: {_AT}no file at"):
        load_svmlight(tmp_path / "missing.svm")


def test_strided_int32_index_arrays_give_the_right_product() -> None:
    """from_csr with a strided int32 crow or col (big[1::2]), or scipy holding such indices
    (copy=False): op @ x was up to 0.96 off (3.7 for a matrix) while to_dense and the gradient,
    through A^T, were right (the sparse probe, 2026-12-07)."""
    a = sp.random(6, 5, density=0.5, random_state=7, format="csr")
    dense = torch.tensor(a.toarray())

    def strided(t: torch.Tensor) -> torch.Tensor:
        big = torch.zeros(2 * t.numel(), dtype=t.dtype)
        big[1::2] = t
        return big[1::2]

    crow, col = torch.tensor(a.indptr).int(), torch.tensor(a.indices).int()
    val = torch.tensor(a.data)
    x, xs = torch.randn(5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    for args in ((strided(crow), col, val), (crow, strided(col), val)):
        op = SparseOperator.from_csr(*args, (6, 5))
        torch.testing.assert_close(op @ x, dense @ x, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(op @ xs, dense @ xs, rtol=1e-12, atol=1e-12)
    big = np.zeros(2 * a.indices.size, np.int32)
    big[1::2] = a.indices
    b = sp.csr_matrix((a.data, big[1::2], a.indptr), shape=a.shape, copy=False)
    torch.testing.assert_close(SparseOperator(b) @ x, dense @ x, rtol=1e-12, atol=1e-12)


def test_a_damaged_npz_is_a_value_error_naming_the_file(tmp_path: Path) -> None:
    """Only np.load was guarded: a flipped byte (bad CRC), an empty member, a missing indptr
    came out raw (zipfile.BadZipFile, EOFError, KeyError), not the ValueError the docstring
    promises; a float shape was truncated (the sparse probe, 2026-12-07)."""
    a = sp.random(6, 5, density=0.5, random_state=7, format="csr")
    good = tmp_path / "a.npz"
    sp.save_npz(good, a, compressed=False)
    raw = bytearray(good.read_bytes())
    i = raw.index(a.data.tobytes()[:8])  # a byte of the data member: its CRC fails
    raw[i] ^= 0xFF
    bad = tmp_path / "crc.npz"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=rf"load_npz: {_AT}.*crc.npz' is not a readable "
                                         r"scipy.sparse \.npz \(BadZipFile"):
        load_npz(bad)
    np.savez(tmp_path / "no_indptr.npz", format=np.array(b"csr"), shape=np.array([6, 5]),
             data=a.data, indices=a.indices)
    with pytest.raises(ValueError, match=r"not a readable scipy.sparse \.npz \(KeyError"):
        load_npz(tmp_path / "no_indptr.npz")
    np.savez(tmp_path / "float_shape.npz", format=np.array(b"csr"),
             shape=np.array([9.7, 6.2]), data=a.data, indices=a.indices, indptr=a.indptr)
    with pytest.raises(ValueError, match=r"stores shape \[9.7, 6.2\]; a 2-D matrix \(rows, "
                                         r"cols\) of ints"):
        load_npz(tmp_path / "float_shape.npz")


def test_loader_messages_name_the_file_and_the_fix(tmp_path):
    """The sparse probe (2026-12-08): a NaN "at row 0, column 3" of no file; a zero-based file
    read one-based ("Invalid index 0 ... Check the file is in svmlight format"); a multilabel
    file ("could not convert string to float: b'0,1'", its own message never reached); an
    .npz without its suffix (read as text: "b'PK\\x03\\x04...'"); a value beyond float32 with
    the Python fix only; sklearn's messages ending in '..'."""
    p = tmp_path / "nan.svm"
    p.write_text("1 0:1.5 4:nan\n-1 2:3\n")
    with pytest.raises(ValueError, match=rf"^load_svmlight: '{re.escape(str(p))}': the matrix "
                                         r"has 1 non-finite"):
        load_svmlight(p, zero_based=True)
    zb = tmp_path / "zb.svm"
    zb.write_text("1 0:1.5 4:2\n-1 2:3\n")
    with pytest.raises(ValueError, match=r"Invalid index 0 in SVMlight/LibSVM data file\. Its "
                                         r"feature indices start at 0: pass zero_based=True "
                                         r"\(hypergrad-run: task\.zero_based=true\)\.$"):
        load_svmlight(zb, zero_based=False)
    ml = tmp_path / "ml.svm"
    ml.write_text("0,1 1:1.5\n2 2:3\n")
    with pytest.raises(ValueError, match=r"multilabel file.*not supported"):
        load_svmlight(ml)
    S = _scipy()
    npz = tmp_path / "data.npz"
    sp.save_npz(npz, S)
    hidden = tmp_path / "data.bin"
    hidden.write_bytes(npz.read_bytes())
    with pytest.raises(ValueError, match=r"'.*data\.bin' is a zip archive \(a scipy \.npz\?\), "
                                         r"not an svmlight text file: read it with load_npz"):
        load_svmlight(hidden)
    big = tmp_path / "big.svm"
    big.write_text("1 1:1e39\n")
    with pytest.raises(ValueError, match=r"Give dtype=torch\.float64 \(hypergrad-run: "
                                         r"task\.dtype=float64\)"):
        load_svmlight(big, dtype=torch.float32)
    bad = S.copy()
    bad.data[0] = np.inf
    inf = tmp_path / "inf.npz"
    sp.save_npz(inf, bad)
    with pytest.raises(ValueError, match=rf"^load_npz: '{re.escape(str(inf))}': the matrix has 1 "):
        load_npz(inf)
