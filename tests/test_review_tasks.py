"""The bundled tasks and the loaders of user files: inputs that used to give NaN metrics, a
silently altered corpus, or an error that did not name its cause."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import hypergrad as hg


def _charlm(path: Path, context: int) -> hg.Task:
    from hypergrad.tasks.charlm import charlm_task, transformer_factory

    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    return charlm_task(hps, hg.optim.sgd(lr="lr"), transformer_factory(16, 1, 2), steps=2,
                       context=context, corpus="file", text_file=str(path))


def test_text_corpus_refuses_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    from hypergrad.tasks.charlm import text_corpus

    f = tmp_path / "fr.txt"
    f.write_text("Été, à, ç, è: la raison ne connaît point. " * 100, encoding="latin-1")
    # every accented letter used to become the one character U+FFFD, silently
    with pytest.raises(ValueError, match=r"fr.txt is not UTF-8 .*byte 0.*iconv"):
        text_corpus(f)


def test_charlm_text_too_short_for_one_validation_window(tmp_path: Path) -> None:
    f = tmp_path / "small.txt"
    f.write_text("hello world, this is text. " * 45)  # 1215 characters, validation 60
    # used to fail at InnerProblem's check with "val_loss is nan ... Fix the loss or the data"
    with pytest.raises(ValueError, match=r"charlm_task: the validation text .* has 60 "
                                         r"characters, fewer than context \+ 1 = 65 .*at least "
                                         r"1300 characters for context=64"):
        _charlm(f, context=64)
    assert _charlm(f, context=32).problem.steps == 2  # 60 characters: one window of 32


def test_charlm_text_file_without_corpus_file_is_refused(tmp_path: Path) -> None:
    """task.text_file=<path> without task.corpus=file read the standard library, and the
    report read as the file's (the charlm probe)."""
    from hypergrad.tasks.charlm import charlm_task, transformer_factory

    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    with pytest.raises(ValueError, match=r"text_file='.*a.txt' with corpus='stdlib', which reads "
                                         r"the standard library.*task.corpus=file"):
        charlm_task(hps, hg.optim.sgd(lr="lr"), transformer_factory(16, 1, 2), steps=2,
                    text_file=str(tmp_path / "a.txt"))


@pytest.mark.parametrize("builder,n_train,n_val", [("ridge_diabetes_task", 300, 142),
                                                   ("breast_cancer_task", 450, 119),
                                                   ("breast_cancer_task", 300, 0)])
def test_bundled_split_sizes_leave_every_split_an_example(builder: str, n_train: int,
                                                          n_val: int) -> None:
    from hypergrad.tasks import bundled

    hps = hg.HyperParams([hg.Scalar("l2", 0.01, transform="log")])
    # n_train + n_val = the dataset's size used to give test_mse / test_loss NaN silently
    with pytest.raises(ValueError, match=rf"n_train={n_train}, n_val={n_val}"):
        getattr(bundled, builder)(hps, hg.optim.sgd(lr=0.1), bundled.linear_factory(False),
                                  steps=2, n_train=n_train, n_val=n_val)


@pytest.mark.parametrize("builder,batch_size", [("digits_task", 64), ("breast_cancer_task", 5),
                                                ("digits_task", 0)])
def test_bundled_batch_larger_than_the_training_split_names_both_keys(builder: str,
                                                                      batch_size: int) -> None:
    from hypergrad.tasks import bundled

    hps = hg.HyperParams([hg.Scalar("l2", 0.01, transform="log")])
    model = bundled.mlp_factory((8,)) if builder == "digits_task" else bundled.linear_factory(False)
    # used to name MiniBatches' own batch_size only, not the task's key that sized the split
    with pytest.raises(ValueError, match=rf"{builder}: batch_size={batch_size} with n_train=4 "
                                         r".*task.batch_size=<b> or task.n_train=<n>"):
        getattr(bundled, builder)(hps, hg.optim.sgd(lr=0.1), model, steps=2, n_train=4,
                                  batch_size=batch_size)


def _sparse_hps(groups: int = 2, fgroups: int = 2) -> hg.HyperParams:
    return hg.HyperParams([hg.Array("res_w", 0.5, shape=(groups,), transform="logit"),
                           hg.Array("l2", 1e-3, shape=(fgroups,), transform="log")])


def _save(tmp_path: Path, rows: int, y: np.ndarray | None = None) -> str:
    a = sp.random(rows, 8, density=0.3, format="csr", random_state=0) if rows else \
        sp.csr_matrix((0, 8))
    sp.save_npz(tmp_path / "a.npz", a)
    np.save(tmp_path / "a_y.npy", np.ones(rows) if y is None else y)
    return str(tmp_path / "a.npz")


@pytest.mark.parametrize("rows,val_fraction,n_tr", [(40, 0.0, 40), (40, 0.01, 40),
                                                    (40, 1.0, 0)])
def test_sparse_regression_split_leaves_rows_on_both_sides(tmp_path: Path, rows: int,
                                                           val_fraction: float,
                                                           n_tr: int) -> None:
    from hypergrad.tasks.sparse_regression import sparse_regression_task

    path = _save(tmp_path, rows)
    # used to fail at InnerProblem's check with "train_loss / val_loss is nan"
    with pytest.raises(ValueError, match=rf"val_fraction={val_fraction} .* {n_tr} training "
                                         rf"and {rows - n_tr} validation rows"):
        sparse_regression_task(_sparse_hps(), hg.optim.sgd(lr=0.1), data_path=path,
                               val_fraction=val_fraction, groups=2, feature_groups=2)


def test_sparse_regression_string_targets(tmp_path: Path) -> None:
    from hypergrad.tasks.sparse_regression import sparse_regression_task

    path = _save(tmp_path, 40, np.array(["1.0"] * 40))
    with pytest.raises(ValueError, match=r"a_y.npy holds <U3 targets"):
        sparse_regression_task(_sparse_hps(), hg.optim.sgd(lr=0.1), data_path=path,
                               groups=2, feature_groups=2)


def test_sparse_regression_hyperparameter_shapes_match_groups(tmp_path: Path) -> None:
    from hypergrad.tasks.sparse_regression import sparse_regression_task

    path = _save(tmp_path, 40)
    # used to be "IndexError: index 2 is out of bounds for dimension 0 with size 2" in the loss
    with pytest.raises(ValueError, match=r"'res_w' has shape \(2,\) but groups=5"):
        sparse_regression_task(_sparse_hps(2, 2), hg.optim.sgd(lr=0.1), data_path=path,
                               groups=5, feature_groups=2)
    with pytest.raises(ValueError, match=r"'l2' has shape \(2,\) but feature_groups=3"):
        sparse_regression_task(_sparse_hps(2, 2), hg.optim.sgd(lr=0.1), data_path=path,
                               groups=2, feature_groups=3)


def test_sparse_regression_generated_without_validation_rows() -> None:
    from hypergrad.tasks.sparse_regression import sparse_regression_task

    with pytest.raises(ValueError, match=r"m=100 training and m_val=0 validation rows"):
        sparse_regression_task(_sparse_hps(4, 2), hg.optim.sgd(lr=0.1), m=100, m_val=0, n=20,
                               groups=4, corrupted=1, feature_groups=2)


def test_stdlib_corpus_of_few_files_leaves_no_split_empty(tmp_path: Path) -> None:
    from hypergrad.tasks.charlm import stdlib_corpus

    for i in range(5):
        (tmp_path / f"m{i}.py").write_text(f"def f(x):\n    return x * {i}\n" * 50)
    # 5 files at fractions (0.8, 0.1, 0.1) used to give 4 / 0 / 1 files: an empty validation text
    with pytest.raises(ValueError, match=r"of the 5 .py files under .* leave \['val'\] without"):
        stdlib_corpus(root=tmp_path)
    c = stdlib_corpus(root=tmp_path, fractions=(0.6, 0.2, 0.2))
    assert [len(c.files[k]) for k in ("train", "val", "test")] == [3, 1, 1]


def test_transformer_classifier_sequence_longer_than_max_len() -> None:
    import torch

    from hypergrad.tasks.models import TransformerClassifier

    m = TransformerClassifier(d_model=8, nhead=2, layers=1, dim_feedforward=8, vocab=10,
                              max_len=32)
    # used to be "The size of tensor a (40) must match the size of tensor b (32)"
    with pytest.raises(ValueError, match=r"length 40 are longer than max_len=32; .*max_len=40"):
        m(torch.zeros(2, 40, dtype=torch.long))
    assert m(torch.zeros(2, 32, dtype=torch.long)).shape == (2, 10)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16"])
def test_text_corpus_refuses_utf16(tmp_path: Path, encoding: str) -> None:
    """UTF-16 text of ASCII characters without a byte-order mark is valid UTF-8 with a NUL after
    every character: it loaded silently (half the training characters NUL)."""
    from hypergrad.tasks.charlm import text_corpus

    f = tmp_path / "u16.txt"
    f.write_bytes(("the quick brown fox. " * 200).encode(encoding))
    with pytest.raises(ValueError, match=r"UTF-16.*iconv -f utf-16 -t utf-8"):
        text_corpus(f)


def _sparse(path: str, **kw: object) -> hg.Task:
    from hypergrad.tasks.sparse_regression import sparse_regression_task

    args: dict[str, object] = dict(groups=2, feature_groups=2, steps=2, dtype="float64")
    args.update(kw)
    return sparse_regression_task(_sparse_hps(2, int(args["feature_groups"])),  # type: ignore
                                  hg.optim.sgd(lr=0.1), data_path=path, **args)


def test_sparse_regression_refuses_a_feature_group_without_entries(tmp_path: Path) -> None:
    """A feature group whose columns hold no non-zero in the training rows: its L2
    hypergradient is exactly zero, and its initial value was reported as learned."""
    a = sp.random(60, 30, density=0.3, format="lil", random_state=0)
    a[:, 20:] = 0
    sp.save_npz(tmp_path / "e.npz", a.tocsr())
    np.save(tmp_path / "e_y.npy", np.ones(60))
    with pytest.raises(ValueError, match=r"feature groups \[2\] of feature_groups=3 have no "
                                         r"non-zero entry .*\(group 2: columns 20..29\)"):
        _sparse(str(tmp_path / "e.npz"), feature_groups=3)
    assert _sparse(str(tmp_path / "e.npz"), feature_groups=2).problem.steps == 2  # 0-14, 15-29


def test_sparse_regression_file_names_and_targets(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader: any case of .npz, ~ expanded, a missing file or a dense .npy or object
    targets named (with the fix), an empty file, and zero_based passed to the svmlight reader."""
    a = sp.random(40, 8, density=0.4, format="csr", random_state=0)
    with open(tmp_path / "UP.NPZ", "wb") as fh:  # save_npz appends .npz to a name without it
        sp.save_npz(fh, a)
    np.save(tmp_path / "UP_y.npy", np.ones(40))
    assert _sparse(str(tmp_path / "UP.NPZ")).problem.steps == 2  # was read as svmlight
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _sparse("~/UP.NPZ").problem.steps == 2  # was "no file at '~/UP.NPZ'"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"data_path='nope.npz': no file at nope.npz "
                                         r"\(relative to .*\); give a scipy .npz"):
        _sparse("nope.npz")  # was a FileNotFoundError, which hypergrad-run did not answer
    np.save(tmp_path / "dense.npy", a.toarray())
    with pytest.raises(ValueError, match=r"is a dense numpy .npy; .*scipy.sparse.save_npz"):
        _sparse("dense.npy")  # was "load_svmlight: could not convert string to float"
    sp.save_npz(tmp_path / "o.npz", a)
    np.save(tmp_path / "o_y.npy", np.array([1.0] * 39 + [None], dtype=object),
            allow_pickle=True)
    with pytest.raises(ValueError, match=r"o_y.npy could not be read without pickle .*holds "
                                         r"objects .*np.asarray\(y, dtype=float\)"):
        _sparse("o.npz")
    (tmp_path / "empty.svm").write_text("")
    with pytest.raises(ValueError, match=r"empty.svm has no rows"):
        _sparse("empty.svm")
    # column 0 empty in a zero-based file: scikit-learn's guess takes it as one-based
    b = a.tolil()
    b[:, 0] = 0
    from sklearn.datasets import dump_svmlight_file

    dump_svmlight_file(b.tocsr(), np.ones(40), str(tmp_path / "z.svm"), zero_based=True)
    assert _sparse("z.svm").problem.fmodel.module.op.shape[1] == 7  # shifted by one
    assert _sparse("z.svm", zero_based=True).problem.fmodel.module.op.shape[1] == 8


def test_charlm_warns_about_validation_text_unseen_in_training(tmp_path: Path) -> None:
    """Validation and test characters the training text lacks are one unknown id: a file
    whose last tenth is in another script was tuned on without a word (val_bpc == test_bpc
    exactly, the model predicting "unknown")."""
    f = tmp_path / "mixed.txt"
    f.write_text("the quick brown fox jumps. " * 90 + "ΑΒΓΔΕΖΗΘ ικλμν ξοπρσ. " * 12)
    with pytest.warns(hg.errors.HypergradWarning, match=r"never occur in its training text "
                                                        r"\(e.g. '.*Α.*'\)") as said:
        _charlm(f, context=16)
    # said at the caller's line (it was hypergrad/rng.py's, the wrapper keeping the RNG)
    assert {w.filename for w in said} == {__file__}
    import warnings

    g = tmp_path / "same.txt"
    g.write_text("the quick brown fox jumps. " * 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _charlm(g, context=16)
    with pytest.raises(ValueError, match=r"text_corpus: no file at .*nope.txt"):
        _charlm(tmp_path / "nope.txt", context=16)


def test_task_metrics_warn_about_a_non_finite_metric_of_a_finite_model() -> None:
    """An evaluate whose test split is empty returns NaN: it went into the table and
    results.json without a word. A diverged run's NaN metrics are not warned about again."""
    import math
    import warnings

    from fixtures import lr_momentum

    p = lr_momentum(steps=2)
    state = p.initial_state()
    task = hg.Task(p, evaluate=lambda s: {"test_loss": float("nan"), "acc": 1.0})
    with pytest.warns(hg.errors.HypergradWarning, match=r"evaluate returned test_loss=nan for a "
                                                        r"model whose losses are finite"):
        got = task.metrics(state, fields={"val_loss": 0.3})
    assert math.isnan(got["test_loss"]) and got["acc"] == 1.0
    fresh = hg.Task(p, evaluate=lambda s: {"test_loss": float("nan")})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task.metrics(state, fields={"val_loss": 0.3})  # said once
        fresh.metrics(state, fields={"val_loss": float("nan")})
