"""Review of the bundled tasks and the hyperparameter kinds: a grid that is not a list of
numbers, a bool where a number is expected, and an L2 coefficient whose shape does not fit the
data's features; each used to crash with a traceback or run on a silently wrong value."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import hypergrad as hg
from hypergrad.errors import HypergradWarning
from hypergrad.tasks import bundled


def _digits(grid: object) -> hg.Task:
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    return bundled.digits_task(hps, hg.optim.sgd(lr="lr"), bundled.linear_factory(), steps=2,
                               n_train=100, n_val=50, grid=grid)  # type: ignore[arg-type]


@pytest.mark.parametrize("grid,match", [
    # a bare number used to fail with Python's "'float' object is not iterable"
    ({"lr": 0.1}, r"digits_task: grid\['lr'\]=0.1 is not a list; give a list of numbers.*"
                  r"task.grid.lr=\[0.1\]"),
    # True used to be read as lr = 1.0
    ({"lr": [True]}, r"digits_task: grid\['lr'\]=\[True\] has True \(bool\), not a number; "
                     r"give a list of numbers"),
    (OmegaConf.create({"lr": [0.1, True]}), r"has True \(bool\), not a number"),
    ({"lr": ["abc"]}, r"has 'abc' \(str\), not a number"),
    # outside the log transform's domain: its reference was NaN, ranked best of the grid
    ({"lr": [-1.0]}, r"grid\['lr'\] value -1.0 is outside the domain of transform='log'"),
])
def test_grid_values_must_be_a_list_of_numbers(grid: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _digits(grid)


def test_grid_of_numbers_gives_references() -> None:
    task = _digits(OmegaConf.create({"lr": [0.01, 1]}))
    assert sorted(task.references) == ["grid lr=0.01", "grid lr=1"]
    lam = task.references["grid lr=1"]
    assert float(task.problem.hyperparams.values(lam)["lr"]) == pytest.approx(1.0)


@pytest.mark.parametrize("make", [
    lambda init: hg.Scalar("lr", init, transform="log"),
    lambda init: hg.Schedule("lr", init, windows=2),
    lambda init: hg.Array("l2", init, shape=(2,)),
    lambda init: hg.Array("l2", init),
    lambda init: hg.PerExample("w", init, n=3),
    lambda init: hg.InitScale("s", init, params=["weight"]),
    lambda init: hg.InitWeights("w0", params=["weight"], init=init),
])
@pytest.mark.parametrize("init", [True, [0.1, True], torch.tensor([True, False]),
                                  np.array([True]), np.bool_(False),
                                  OmegaConf.create({"x": [1.0, True]}).x])
def test_init_refuses_bools(make: object, init: object) -> None:
    # True is an int to Python and torch.as_tensor: init=True was read as 1.0
    with pytest.raises(TypeError, match=r"init=.* (is a bool|holds bools) \(read as 1.0 or "
                                        r"0.0\); init must be a number"):
        make(init)  # type: ignore[operator]


def test_init_numbers_still_accepted() -> None:
    for init in (1, 0.5, [1, 2], np.float32(0.5), np.arange(2) + 1, torch.ones(2)):
        hg.Array("x", init)


def _l2_task(builder: str, item: hg.HyperParameter, **kw: object) -> hg.Task:
    hps = hg.HyperParams([item])
    return getattr(bundled, builder)(hps, hg.optim.sgd(lr=0.1), bundled.linear_factory(False),
                                     steps=2, **kw)


@pytest.mark.parametrize("builder,shape,n", [("breast_cancer_task", 15, 30),
                                             ("ridge_diabetes_task", 30, 10)])
def test_per_feature_l2_of_another_size_is_refused(builder: str, shape: int, n: int) -> None:
    # breast cancer crashed in the loss (size 15 vs 30); diabetes said "train_loss returned a
    # tensor of shape (30,)"
    with pytest.raises(ValueError, match=rf"{builder}: hyperparameter 'l2' has shape "
                                         rf"\({shape},\), but the data has {n} features.*"
                                         rf"hyperparams.items.l2.shape=\[{n}\]"):
        _l2_task(builder, hg.Array("l2", 0.01, shape=(shape,), transform="log"))


def test_l2_of_another_kind_or_missing_is_refused() -> None:
    with pytest.raises(ValueError, match=r"breast_cancer_task: hyperparameter 'l2' is a "
                                         r"per_example hyperparameter, but the data has 30"):
        _l2_task("breast_cancer_task", hg.PerExample("l2", 0.01, n=30))
    with pytest.raises(ValueError, match=r"breast_cancer_task: l2_name='l2' is not a "
                                         r"hyperparameter; defined are \['lr'\]"):
        _l2_task("breast_cancer_task", hg.Scalar("lr", 0.01))


def test_per_feature_l2_of_the_right_size_trains() -> None:
    task = _l2_task("breast_cancer_task", hg.Array("l2", 0.01, shape=(30,), transform="log"))
    assert task.problem.hyperparams.num_raw == 30
    # diabetes: one coefficient per feature now trains; the closed-form check (one
    # coefficient) is skipped, with a warning
    with pytest.warns(HypergradWarning, match="one L2 coefficient, not one per feature"):
        task = _l2_task("ridge_diabetes_task", hg.Array("l2", 0.01, shape=(10,),
                                                        transform="log"))
    lam = task.problem.init_raw()
    g = hg.ForwardMode().hypergradient(task.problem, lam).grad
    assert g.shape == (10,) and bool(torch.isfinite(g).all())
    assert "skipped" in task.extra(lam)["closed_form"]  # type: ignore[misc]


def _builders() -> dict[str, object]:
    from fixtures import tiny_lm

    from hypergrad.testing import digits_case, l2_mlp_case

    lr = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    mlp = bundled.mlp_factory((8,))
    return {
        "digits_task": lambda: bundled.digits_task(lr, hg.optim.sgd(lr="lr"), mlp, steps=2),
        "hypercleaning_task": lambda: bundled.hypercleaning_task(
            hg.HyperParams([hg.PerExample("weights", 0.5, n=100, transform="logit")]),
            hg.optim.sgd(lr=0.1), mlp, steps=2, n_train=100, n_val=50),
        "breast_cancer_task": lambda: bundled.breast_cancer_task(
            hg.HyperParams([hg.Scalar("l2", 0.01, transform="log")]),
            hg.optim.sgd(lr=0.1), bundled.linear_factory(), steps=2),
        "charlm_task": lambda: tiny_lm(steps=2),
        "digits_case": lambda: digits_case("sgd", "lr", steps=2),
        "l2_mlp_case": lambda: l2_mlp_case(steps=2),
    }


@pytest.mark.parametrize("name", ["digits_task", "hypercleaning_task", "breast_cancer_task",
                                  "charlm_task", "digits_case", "l2_mlp_case"])
def test_a_builder_leaves_the_callers_random_stream_where_it_was(name: str) -> None:
    """Each seeded torch's global generator for its model's initial weights and left it so:
    after torch.manual_seed(42) and a task built, the user drew the task seed's numbers (the
    global-state probe)."""
    build = _builders()[name]
    torch.manual_seed(42)
    expected = torch.rand(3)
    torch.manual_seed(42)
    build()  # type: ignore[operator]
    assert torch.equal(torch.rand(3), expected)


def test_hypercleaning_references_say_the_other_hyperparameters_stay_initial() -> None:
    """The baseline and oracle rows set the weights alone: with a learning rate tuned beside
    them, a learned row beat the "oracle" by its learning rate, the labels silent about it."""
    mlp = bundled.mlp_factory([16])
    weights = hg.PerExample("weights", 0.5, n=100, transform="logit")
    alone = bundled.hypercleaning_task(hg.HyperParams([weights]), hg.optim.sgd(lr=0.1), mlp,
                                       steps=2, n_train=100, n_val=50)
    assert sorted(alone.references) == ["baseline (noisy, weights 1)",
                                        "oracle (clean examples only)"]
    both = bundled.hypercleaning_task(hg.HyperParams([weights, hg.Scalar("lr", 0.1, "log")]),
                                      hg.optim.sgd(lr="lr"), mlp, steps=2, n_train=100,
                                      n_val=50)
    assert sorted(both.references) == ["baseline (noisy, weights 1; the rest initial)",
                                       "oracle (clean examples only; the rest initial)"]


def test_hypercleaning_flags_nothing_with_precision_undefined_not_zero() -> None:
    """Every weight above the threshold flags no example: precision is 0 / 0, and it was
    reported as 0 (every flag wrong) with F1 0; the oracle's weights flag every flipped label
    and nothing else."""
    mlp = bundled.mlp_factory([16])
    task = bundled.hypercleaning_task(
        hg.HyperParams([hg.PerExample("weights", 0.9, n=100, transform="logit")]),
        hg.optim.sgd(lr=0.1), mlp, steps=2, n_train=100, n_val=50)
    assert task.extra is not None
    none = task.extra(task.problem.init_raw())["flip_detection"]
    assert none["precision"] is None and none["recall"] == 0.0 and none["f1"] is None
    assert none["n_flagged"] == 0 and none["n_flipped"] == 50
    assert "0 flagged, precision undefined, recall 0.000, F1 undefined" in none["summary"]
    oracle = task.extra(task.references["oracle (clean examples only)"])["flip_detection"]
    assert (oracle["precision"], oracle["recall"], oracle["f1"]) == (1.0, 1.0, 1.0)
    assert oracle["n_flagged"] == 50


def _not_a_module(n_in: int, n_out: int) -> str:
    return "a string"


@pytest.mark.parametrize("model,match", [
    # hypergrad-run's model group without _partial_: true built the module itself, and the
    # task's call of it failed with "forward() takes 2 positional arguments but 3 were given"
    (torch.nn.Linear(64, 10), r"^digits_task: model is a built Linear, where the task takes a "
                              r"factory it calls as model\(64, 10\).*_partial_: true"),
    # failed with "'str' object has no attribute 'to'"
    (_not_a_module, r"^digits_task: the model factory .*\._not_a_module, called as "
                    r"model\(64, 10\), returned a str, not a torch.nn.Module"),
])
def test_a_model_factory_that_gives_no_module_is_named(model: object, match: str) -> None:
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    with pytest.raises(TypeError, match=match):
        bundled.digits_task(hps, hg.optim.sgd(lr="lr"), model, steps=2,  # type: ignore[arg-type]
                            n_train=100, n_val=50)
