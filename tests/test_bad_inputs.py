"""Bad input as users give it (the bad-input probe of the public API): each was accepted with
the wrong meaning, or failed deep inside as Python's or torch's bare error. Each is now
refused naming the argument, the value and the fix."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import hypergrad as hg
from hypergrad.export import optimizer_from_settings
from hypergrad.testing import digits_case


@pytest.fixture(scope="module")
def problem() -> hg.InnerProblem:
    return digits_case("sgd", "lr", steps=2)


@pytest.mark.parametrize(("make", "match"), [
    # bool("no") is True: overwrite="no" threw the run in the folder away
    (lambda d: hg.RunFolder(d, overwrite="no"), r"RunFolder: overwrite='no' must be True or "
                                                r"False"),
    (lambda d: hg.RunFolder(d, resume="no"), r"RunFolder: resume='no' must be True or False"),
    (lambda d: hg.FiniteDifference(relative="no"), r"relative='no' must be True or False"),
    (lambda d: hg.ForwardMode(skip_zero_columns="no"), r"skip_zero_columns='no' must be"),
    (lambda d: hg.ImplicitDiff(warm_start="no"), r"warm_start='no' must be True or False"),
])
def test_a_string_for_a_flag_is_refused(tmp_path: Path, make: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        make(tmp_path)


def test_numpy_counts_and_flags_are_taken(problem: hg.InnerProblem, tmp_path: Path) -> None:
    assert hg.RunFolder(tmp_path, inner_every=np.int64(2), resume=np.bool_(True)).inner_every == 2
    p = hg.InnerProblem(problem.fmodel.module, problem.train_loss, problem.optimizer,
                        problem.hyperparams, [problem.batch(0)], np.int64(2), problem.val_loss)
    assert p.steps == 2 and type(p.steps) is int


def test_the_problem_argument_is_checked_by_every_method(problem: hg.InnerProblem) -> None:
    lam = problem.init_raw()
    for method in (hg.ForwardMode(), hg.ReverseMode(), hg.FiniteDifference()):
        with pytest.raises(TypeError, match="problem must be an InnerProblem, got Task: give "
                                            "task.problem"):
            method.hypergradient(hg.Task(problem), lam)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"the arguments are swapped"):
            method.hypergradient(lam, problem)  # type: ignore[arg-type]


@pytest.mark.parametrize(("train", "val", "match"), [
    (lambda m, b: 0, None, r"train_loss is called as train_loss\(model, batch, hp\), and "
                           r"yours, <lambda>\(m, b\), cannot take that"),
    (None, lambda m: 0, r"val_loss is called as val_loss\(model, hp\)"),
    (None, lambda m, hp, x: 0, r"missing a required argument: 'x'"),
])
def test_a_loss_of_the_wrong_arity_is_refused_when_built(problem: hg.InnerProblem, train: Any,
                                                         val: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        hg.InnerProblem(problem.fmodel.module, train or problem.train_loss, problem.optimizer,
                        problem.hyperparams, [problem.batch(0)], 2, val or problem.val_loss)


def test_a_misspelt_callback_hook_is_warned_about(problem: hg.InnerProblem) -> None:
    class Mine(hg.Callback):
        def on_outer_stepp(self, trainer: Any, record: Any) -> None:
            pass

    with pytest.warns(hg.errors.HypergradWarning, match=r"callback Mine defines "
                                                        r"\['on_outer_stepp'\], which no run "
                                                        r"calls"):
        hg.Trainer(problem, callbacks=[Mine(), hg.run.Log(None)])


@pytest.mark.parametrize(("kw", "match"), [
    ({"lr": "0.1"}, r"lr='0.1' must be a number > 0"), ({"lr": True}, r"lr=True must be"),
    ({"factor": "0.5"}, r"factor='0.5' must be a number in \(0, 1\]"),
    ({"precondition": [1.0]}, r"precondition must be a K x K tensor or None, got list")])
def test_sign_descent_settings_are_checked(kw: dict[str, Any], match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        hg.SignDescent([torch.zeros(1, requires_grad=True)], **kw)


def test_messages_name_the_fix(problem: hg.InnerProblem, tmp_path: Path) -> None:
    quiet = [hg.run.Log(None), hg.run.Progress(False)]
    with pytest.raises(TypeError, match=r"functools.partial\(hypergrad.SignDescent, lr=0.05\)"):
        hg.Trainer(problem, outer=hg.SignDescent([torch.zeros(1, requires_grad=True)]),
                   callbacks=quiet)
    with pytest.raises(TypeError, match=r"callbacks='progress' must be a list of Callback"):
        hg.Trainer(problem, callbacks="progress")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"a string always names a hyperparameter: for the "
                                         r"constant, give the number, lr=0.1"):
        hg.InnerProblem(problem.fmodel.module, problem.train_loss, hg.optim.sgd(lr="0.1"),
                        hg.HyperParams([hg.Scalar("x", 1.0)]), [problem.batch(0)], 2,
                        problem.val_loss)
    with pytest.raises(TypeError, match=r"settings='learned.yaml' is a path; pass its "
                                        r"contents: yaml.safe_load"):
        optimizer_from_settings("learned.yaml", problem.fmodel.module)  # type: ignore[arg-type]
    settings = {"optimizer": {"class": "torch.optim.SGD", "defaults": {"lr": 0.1},
                              "param_groups": []}}
    with pytest.raises(TypeError, match=r"params=.* must be the model \(an nn.Module\)"):
        # problem.model (a method), not the module: "'method' object is not iterable"
        optimizer_from_settings(settings, problem.run)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"strictly between 0 and 1 under 'logit'"):
        hg.HyperParams([hg.Scalar("m", 1.0, transform="logit")]).init_raw()
    with pytest.raises(TypeError, match=r"HyperParams: items=Scalar.* must be a list"):
        hg.HyperParams(hg.Scalar("lr", 0.1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Log: prefix=None must be a str"):
        hg.run.Log(print, prefix=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"the folder of .* does not exist"):
        hg.run.Log(tmp_path / "nope" / "x.log")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        functools.partial(hg.SignDescent, lr=0.2)  # the right form is quiet


def test_a_model_or_data_on_the_meta_device_is_refused_naming_it() -> None:
    """The dtypes probe (2026-12-07): both failed as torch's "Tensor.item() cannot be called on
    meta tensors", raised deep in the hyperparameters or the checks."""
    import torch.nn.functional as F

    from hypergrad.data import MiniBatches

    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))

    def build(model: torch.nn.Module, xt: torch.Tensor) -> hg.InnerProblem:
        return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                               hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1)]),
                               MiniBatches(xt, y.to(xt.device), batch_size=4), 2,
                               lambda m, hp: F.cross_entropy(m(x), y))

    with pytest.raises(ValueError, match=r"model's parameters \['weight', 'bias'\] are on the "
                                         r"meta device.*to_empty"):
        build(torch.nn.Linear(4, 3, device="meta", dtype=torch.float64), x)
    p = build(torch.nn.Linear(4, 3).double(), x.to("meta"))
    with pytest.raises(ValueError, match=r"training data's MiniBatches tensor 0 \(shape \(8, 4\)\) "
                                         r"is on the meta device"):
        p.check(p.init_raw())
