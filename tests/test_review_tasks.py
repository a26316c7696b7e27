"""The bundled tasks and the loaders of user files: inputs that used to give NaN metrics, a
silently altered corpus, or an error that did not name its cause."""

from __future__ import annotations

from pathlib import Path

import pytest

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
                                         r"characters, fewer than context \+ 1 = 65"):
        _charlm(f, context=64)
    assert _charlm(f, context=32).problem.steps == 2  # 60 characters: one window of 32


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

