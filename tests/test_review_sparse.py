"""Review of the sparse inner problems (``hypergrad.sparse``, the weighted sparse least-squares
task): arguments of ``sparse_regression_task`` / ``generate_sparse_regression`` that built a
problem whose hypergradients are zero by construction, or failed with numpy's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from fixtures import sparse_hps, sparse_task

import hypergrad as hg
from hypergrad.tasks.sparse_regression import generate_sparse_regression, sparse_regression_task


def _task(**kw):  # type: ignore[no-untyped-def]
    args = dict(steps=2, m=40, m_val=10, n=12, density=0.2, groups=4, corrupted=1,
                feature_groups=3, mask_fraction=0.0, dtype="float64")
    args.update(kw)
    return sparse_task(hg.optim.sgd(lr=0.1), **args)


def test_groups_without_rows_or_features_are_refused(tmp_path: Path) -> None:
    """More residual groups than training rows (or feature groups than columns) left groups
    with nothing in them: their hypergradients were exactly 0 (m=8, groups=10: the weights of
    groups 4 and 9), and tuning reported their untouched values as learned."""
    with pytest.raises(ValueError, match=r"groups=10 .*8 training rows.*\[4, 9\].*groups <= 8"):
        _task(m=8, groups=10)
    with pytest.raises(ValueError, match=r"feature_groups=8 .*5 features.*feature_groups <= 5"):
        _task(n=5, feature_groups=8)
    a = sp.random(6, 4, density=0.5, format="csr", random_state=0)
    sp.save_npz(tmp_path / "A.npz", a)
    np.save(tmp_path / "A_y.npy", np.ones(6))
    with pytest.raises(ValueError, match=r"groups=4 .*3 training rows"):
        sparse_regression_task(sparse_hps(4, 2), hg.optim.sgd(lr=0.1), groups=4, feature_groups=2,
                               data_path=str(tmp_path / "A.npz"), val_fraction=0.5)
    # as many groups as rows (and features) is fine: one each
    task = _task(m=8, groups=8, n=5, feature_groups=5)
    assert task.problem.num_hyperparams == 13


@pytest.mark.parametrize("density", [-0.1, 0.0, 1.5, float("nan")])
def test_density_outside_0_1_is_refused(density: float) -> None:
    """-0.1 failed with numpy's 'negative dimensions are not allowed'; 0 built A = 0 (every
    hypergradient 0); 1.5 drew 1.5 m n entries (duplicates summed, values scaled wrongly)."""
    with pytest.raises(ValueError, match=r"density=.* must be in \(0, 1\]"):
        generate_sparse_regression(20, 5, density)
    with pytest.raises(ValueError, match=r"density="):
        _task(density=density)


@pytest.mark.parametrize("kw", [dict(n=0), dict(m=0), dict(m=1.5)])
def test_generator_sizes(kw: dict) -> None:
    args = dict(m=20, n=5, density=0.5)
    args.update(kw)
    name = next(iter(kw))
    with pytest.raises((ValueError, TypeError), match=rf"{name}={kw[name]} must be an int >= 1"):
        generate_sparse_regression(**args)
    if name == "n":  # n=0 built a problem with no coefficients: every hypergradient 0
        with pytest.raises(ValueError, match=r"n=0 must be an int >= 1"):
            _task(n=0)


@pytest.mark.parametrize("frac", [1.0, 1.5, -0.2])
def test_mask_fraction_outside_0_1_is_refused(frac: float) -> None:
    """mask_fraction=1 masked every training residual: the data term vanished and every
    hypergradient was exactly 0; a negative value silently meant 0."""
    with pytest.raises(ValueError, match=rf"mask_fraction={frac} must be in \[0, 1\)"):
        _task(mask_fraction=frac)


@pytest.mark.parametrize("frac,err,match", [
    (float("nan"), ValueError, r"val_fraction=nan must be inside \(0, 1\)"),
    (-0.5, ValueError, r"val_fraction=-0.5 must be inside \(0, 1\)"),
    ("0.2", TypeError, r"val_fraction must be a number, got str '0.2'")])
def test_val_fraction_not_a_fraction(tmp_path: Path, frac: object, err: type,
                                     match: str) -> None:
    """NaN failed with Python's 'cannot convert float NaN to integer', a string with
    "unsupported operand type(s) for -: 'int' and 'str'": neither named val_fraction."""
    sp.save_npz(tmp_path / "a.npz", sp.random(40, 8, density=0.3, format="csr", random_state=0))
    np.save(tmp_path / "a_y.npy", np.ones(40))
    with pytest.raises(err, match=match):
        sparse_regression_task(sparse_hps(2, 2), hg.optim.sgd(lr=0.1), groups=2, feature_groups=2,
                               data_path=str(tmp_path / "a.npz"), val_fraction=frac)


@pytest.mark.parametrize("kw", [dict(density="0.1"), dict(mask_fraction=None)])
def test_fractions_must_be_numbers(kw: dict) -> None:
    """A string density failed with "'<' not supported between instances of 'int' and 'str'"."""
    name = next(iter(kw))
    with pytest.raises(TypeError, match=rf"{name} must be a number, got"):
        _task(**kw)


@pytest.mark.parametrize("dt", [np.uint16, np.uint32, np.uint64])
def test_unsigned_index_arrays(dt: type) -> None:
    """numpy uint16/32/64 index arrays failed with torch's '"min_all" not implemented for
    'UInt32'' (from_coo) or '"lt_cpu" not implemented' (from_csr)."""
    import torch

    from hypergrad.sparse import SparseOperator

    dense = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]], dtype=torch.float64)
    vals = np.array([1.0, 2.0, 3.0])
    op = SparseOperator.from_coo(np.array([0, 1, 1], dt), np.array([1, 0, 2], dt), vals, (2, 3))
    assert torch.equal(op.to_dense(), dense)
    op = SparseOperator.from_csr(np.array([0, 1, 3], dt), np.array([1, 0, 2], dt), vals, (2, 3))
    assert torch.equal(op.to_dense(), dense) and torch.equal(op.T.to_dense(), dense.T)
    if dt is np.uint64:  # past int64's range: reported as out of range, not wrapped silently
        with pytest.raises(ValueError, match=r"row index -1 at entry 0 is outside \[0, 2\)"):
            SparseOperator.from_coo(np.array([2**64 - 1], dt), np.array([0], dt), [1.0], (2, 3))


def test_matmul_dtype_message_offers_only_supported_fixes() -> None:
    """An integer x was told to 'use op.to(dtype=torch.int64)', which op.to refuses."""
    import torch

    from hypergrad.sparse import SparseOperator

    op = SparseOperator.from_coo([0], [1], [1.0], (2, 3), dtype=torch.float64)
    with pytest.raises(TypeError, match=r"x\.to\(torch\.float64\)\.$"):
        op @ torch.zeros(3, dtype=torch.long)
    with pytest.raises(TypeError, match=r"or use op\.to\(dtype=torch\.float32\)"):
        op @ torch.zeros(3, dtype=torch.float32)


def test_numpy_and_operator_operands_are_named() -> None:
    """np.ones(3) @ op raised numpy's 'Input operand 1 does not have enough dimensions'; op @ op
    was told to convert with torch.as_tensor."""
    import torch

    from hypergrad.sparse import SparseOperator

    op = SparseOperator(torch.eye(3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"rmatmul: x must be a torch.Tensor, got ndarray"):
        np.ones(3) @ op
    with pytest.raises(TypeError, match=r"x is another SparseOperator"):
        op @ op


def test_a_data_file_is_fingerprinted_and_float32_overflow_is_named(tmp_path: Path) -> None:
    """The data-files probe (2026-12-07): a resume after scaling the matrix's rows went on
    (the run starts at zero coefficients, so its start-of-run losses read only y), mixing
    records of two problems; a finite 1e39 became inf in float32 and was told to "remove or
    impute" a value the file has finite."""
    a = sp.random(10, 4, density=0.5, format="csr", random_state=0)
    sp.save_npz(tmp_path / "A.npz", a)
    np.save(tmp_path / "A_y.npy", np.arange(10.0))

    def digest() -> Any:
        task = sparse_regression_task(sparse_hps(2, 2), hg.optim.sgd(lr=0.1), groups=2,
                                      feature_groups=2, data_path=str(tmp_path / "A.npz"),
                                      dtype="float64")
        return task.fingerprint["task.data_digest"]

    first = digest()
    assert digest() == first
    sp.save_npz(tmp_path / "A.npz", a * 2.0)  # y unchanged
    assert digest() != first
    np.save(tmp_path / "A_y.npy", np.array([1e39] + [1.0] * 9))
    with pytest.raises(ValueError, match=r"1 targets beyond torch.float32's range .*1e\+39.*"
                                         r"task.dtype=float64"):
        sparse_regression_task(sparse_hps(2, 2), hg.optim.sgd(lr=0.1), groups=2,
                               feature_groups=2, data_path=str(tmp_path / "A.npz"),
                               dtype="float32")
    from hypergrad.sparse import load_npz

    big = a.copy()
    big.data[0] = 1e39
    sp.save_npz(tmp_path / "B.npz", big)
    with pytest.raises(ValueError, match=r"values beyond torch.float32's range \(largest "
                                         r"\|value\| 1e\+39\).*dtype=torch.float64"):
        load_npz(tmp_path / "B.npz", dtype=torch.float32)
