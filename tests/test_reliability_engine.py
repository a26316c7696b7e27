"""Issue 23, the engine half: no silent wrong result on common models and inputs.

Each case ends in a correct result or a clear error raised up front (at construction or in
``InnerProblem.check``), naming the argument, the value and the fix. Models that change their
weights or buffers in forward: test_parametrizations.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import hypergrad as hg
from hypergrad.optim import adagrad, rmsprop

# -- group 3: inner optimizer constants -----------------------------------------------------------
NAN = math.nan
BAD_CONSTANTS = [
    # (factory, argument, bad value, the words of the message)
    (hg.sgd, "lr", -0.1, "> 0"), (hg.sgd, "lr", 0.0, "> 0"), (hg.sgd, "lr", NAN, "> 0"),
    (hg.sgd, "lr", math.inf, "> 0"),
    (hg.sgd, "momentum", 1.0, r"in \[0, 1\)"), (hg.sgd, "momentum", -0.5, r"in \[0, 1\)"),
    (hg.sgd, "momentum", NAN, r"in \[0, 1\)"),
    (hg.sgd, "dampening", 1.5, r"in \[0, 1\)"), (hg.sgd, "weight_decay", -1e-4, ">= 0"),
    (hg.sgd, "weight_decay", NAN, ">= 0"),
    (hg.adam, "lr", -1e-3, "> 0"), (hg.adam, "eps", 0.0, "> 0"), (hg.adam, "eps", -1e-8, "> 0"),
    (hg.adam, "weight_decay", -0.1, ">= 0"),
    (hg.adamw, "lr", 0, "> 0"), (hg.adamw, "eps", NAN, "> 0"),
    (hg.adamw, "weight_decay", -1, ">= 0"),
    (rmsprop, "lr", -1e-2, "> 0"), (rmsprop, "alpha", 1.0, r"in \[0, 1\)"),
    (rmsprop, "alpha", -0.1, r"in \[0, 1\)"), (rmsprop, "eps", 0.0, "> 0"),
    (rmsprop, "momentum", 1.2, r"in \[0, 1\)"), (rmsprop, "weight_decay", -1.0, ">= 0"),
    (adagrad, "lr", -1.0, "> 0"), (adagrad, "lr_decay", -0.1, ">= 0"),
    (adagrad, "eps", 0.0, "> 0"), (adagrad, "weight_decay", NAN, ">= 0"),
]


@pytest.mark.parametrize(("factory", "arg", "bad", "words"), BAD_CONSTANTS,
                         ids=[f"{f.__name__}-{a}={b}" for f, a, b, _ in BAD_CONSTANTS])
def test_a_bad_optimizer_constant_is_refused_at_construction(factory: Any, arg: str, bad: float,
                                                              words: str) -> None:
    api = factory.__name__
    kw: dict[str, Any] = {"lr": 0.1} if arg != "lr" else {}
    with pytest.raises(ValueError, match=rf"^{api}: {arg}={bad!r} must be a number {words} \(or "
                                         rf"the name of a hyperparameter\), e.g. {arg}="):
        factory(**kw, **{arg: bad})


def test_the_message_of_a_negative_learning_rate() -> None:
    with pytest.raises(ValueError) as info:
        hg.sgd(lr=-0.1)
    assert str(info.value) == ("sgd: lr=-0.1 must be a number > 0 (or the name of a "
                               "hyperparameter), e.g. lr=0.1.")


@pytest.mark.parametrize("betas", [(1.0, 0.999), (0.9, 1.0), (-0.1, 0.9), (0.9, NAN)])
def test_adam_betas_must_lie_in_the_unit_interval(betas: tuple[float, float]) -> None:
    i = 0 if not 0 <= betas[0] < 1 else 1
    for factory in (hg.adam, hg.adamw):
        with pytest.raises(ValueError, match=rf"{factory.__name__}: betas\[{i}\]=.* must be a "
                                             rf"number in \[0, 1\).*e.g. betas=\(0.9, 0.999\)"):
            factory(betas=betas)


def test_options_are_checked_too() -> None:
    with pytest.raises(ValueError, match=r"adam: eps_root=-1e-08 must be a number >= 0"):
        hg.adam(eps_root=-1e-8)
    with pytest.raises(ValueError, match=r"adagrad: initial_accumulator_value=nan must be"):
        adagrad(initial_accumulator_value=NAN)


def test_valid_constants_and_hyperparameter_names_pass() -> None:
    hg.sgd(lr=1, momentum=0.0, dampening=0.0, weight_decay=0)  # ints, edges of the domains
    hg.sgd(lr="lr", momentum="mom", dampening="damp", weight_decay="wd")  # names: not checked
    hg.adam(lr="lr", betas=(0.0, "b2"), eps=1e-12, weight_decay=0.0)
    hg.adamw(betas=("b1", 0.5))
    rmsprop(alpha=0.0, momentum=0.99, centered=True)
    adagrad(lr_decay=0.0, initial_accumulator_value=0.1)
