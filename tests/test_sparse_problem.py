"""The weighted sparse least-squares task: exact hypergradients through the sparse operator, and
a user's matrix loaded from disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from fixtures import sparse_hps, sparse_task

import hypergrad as hg
from hypergrad.tasks.sparse_regression import generate_sparse_regression, sparse_regression_task
from hypergrad.testing import hypergradcheck


def _task(**kw):  # type: ignore[no-untyped-def]
    args = dict(steps=6, m=120, m_val=40, n=30, density=0.1, groups=4, corrupted=1,
                feature_groups=3, mask_fraction=0.2, dtype="float64")
    args.update(kw)
    return sparse_task(hg.optim.sgd(lr=0.5, momentum=0.5), **args)


def test_forward_reverse_fd_and_strategies_agree() -> None:
    rep = hypergradcheck(_task().problem)
    assert rep.max("fwd_vs_rev") <= 1e-10 and rep.max("fwd_vs_fd") <= 1e-6


def test_the_task_builds_on_the_device_asked_for() -> None:
    """``device``: the operators, targets, model and hyperparameters on it, exact there
    (``$HYPERGRAD_TEST_DEVICE``: cuda in experiments/benchmarks/cuda_tests.sh, else the CPU;
    ``"auto"`` is the CPU without CUDA)."""
    import os

    from hypergrad.tasks.bundled import device_of

    dev = device_of(os.environ.get("HYPERGRAD_TEST_DEVICE", "auto"))
    task = _task(device=str(dev))
    p = task.problem
    assert p.device.type == dev.type and p.init_raw().device.type == dev.type
    rep = hypergradcheck(p)
    assert rep.max("fwd_vs_rev") <= 1e-10 and rep.max("fwd_vs_fd") <= 1e-6
    state = p.run(p.init_raw())
    assert state.params["x"].device.type == dev.type
    assert set(task.evaluate(state)) == {"val_mse", "train_mse_clean_groups"}
    assert task.extra(p.init_raw())["residual_weights"]["corrupted_groups"] == [0]


def test_adam_inner_optimizer() -> None:
    task = sparse_regression_task(sparse_hps(), hg.optim.adam(lr=0.05), steps=5, m=100,
                                  m_val=30, n=20, density=0.1, groups=4, corrupted=1,
                                  feature_groups=3, dtype="float64")
    hypergradcheck(task.problem)


def test_generator_scaling() -> None:
    op, y, x = generate_sparse_regression(4000, 200, 0.05, noise=0.0, seed=1,
                                          dtype=torch.float64)
    gram = (op.to_dense().T @ op.to_dense()) / 4000
    assert abs(float(gram.diagonal().mean()) - 1) < 0.1  # A^T A / m ~ I
    assert abs(float(y.var()) - 1) < 0.2


def test_loads_user_matrix_from_npz_and_svmlight(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a = sp.random(60, 12, density=0.3, format="csr", random_state=1)
    y = a @ rng.standard_normal(12)
    sp.save_npz(tmp_path / "A.npz", a)
    np.save(tmp_path / "A_y.npy", y)
    task = sparse_regression_task(sparse_hps(2, 2), hg.optim.sgd(lr=0.3), steps=4, groups=2,
                                  feature_groups=2, dtype="float64",
                                  data_path=str(tmp_path / "A.npz"), val_fraction=0.25)
    assert task.problem.fmodel.module.op.shape == (45, 12)
    hypergradcheck(task.problem)
    from sklearn.datasets import dump_svmlight_file

    dump_svmlight_file(a, y, str(tmp_path / "a.svm"))
    task = sparse_regression_task(sparse_hps(2, 2), hg.optim.sgd(lr=0.3), steps=4, groups=2,
                                  feature_groups=2, dtype="float64",
                                  data_path=str(tmp_path / "a.svm"))
    assert task.problem.fmodel.module.op.shape[0] == 48


def test_missing_targets_file(tmp_path: Path) -> None:
    sp.save_npz(tmp_path / "B.npz", sp.random(10, 4, density=0.5, format="csr"))
    with pytest.raises(ValueError, match=r"B_y.npy"):
        sparse_regression_task(sparse_hps(2, 2), hg.optim.sgd(lr=0.3),
                               data_path=str(tmp_path / "B.npz"), groups=2, feature_groups=2)
    with pytest.raises(ValueError, match=r"corrupted=4 must be in \[0, groups=4\)"):
        _task(corrupted=4)


def test_a_file_whose_validation_rows_are_empty_is_refused(tmp_path: Path) -> None:
    """The last val_fraction of a file's rows with labels only: the validation loss read no
    weight, every hypergradient was 0, and the run reported its start as learned after a
    generic zero-hypergradient warning (the sparse probe, 2026-12-08)."""
    a = sp.random(40, 12, density=0.3, format="lil", random_state=1)
    a[32:] = 0
    a = a.tocsr()
    a.eliminate_zeros()
    sp.save_npz(tmp_path / "A.npz", a)
    np.save(tmp_path / "A_y.npy", np.arange(40.0))
    with pytest.raises(ValueError, match=r"the 8 validation rows of .*A\.npz \(its last "
                                         r"val_fraction=0\.2 of rows, in the file's order\) have "
                                         r"no non-zero feature"):
        sparse_regression_task(sparse_hps(2, 2), hg.optim.sgd(lr=0.3), steps=4, groups=2,
                               feature_groups=2, dtype="float64",
                               data_path=str(tmp_path / "A.npz"), val_fraction=0.2)
