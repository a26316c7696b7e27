"""A tuned hyperparameter read by an inner-optimizer argument with a domain (a momentum in
[0, 1), an eps > 0): as a constant a value outside was refused, as a hyperparameter it ran
without a word (an eps of 0 gave NaN hypergradients, an RMSprop alpha of 1 a hypergradient of
exactly 0, and an identity momentum tuned by sign steps was returned at 1.2 as the best point:
the numeric-extremes probe). The problem refuses such a value; the Trainer holds every point
it tries inside the domain, and warns when a step leaves it."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.errors import BoundsWarning


def _problem(items: list[hg.HyperParameter], opt: hg.optim.Optimizer) -> hg.InnerProblem:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x, y = torch.randn(32, 4, dtype=torch.float64), torch.randint(0, 3, (32,))
    return hg.InnerProblem(m, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]), opt,
                           hg.HyperParams(items), [(x[:16], y[:16]), (x[16:], y[16:])], 8,
                           lambda m, hp: F.cross_entropy(m(x), y))


@pytest.mark.parametrize(("item", "opt", "match"), [
    (hg.Scalar("eps", 0.0), hg.optim.adam(lr=0.01, eps="eps"),
     r"'eps' is 0.0, read as adam's eps \(> 0\).*transform='log'"),
    (hg.Scalar("b2", 1.0), hg.optim.adam(lr=0.01, betas=(0.9, "b2")),
     r"'b2' is 1.0, read as adam's betas\[1\] \(in \[0, 1\)\).*transform='logit'"),
    (hg.Scalar("a", 1.0), hg.optim.rmsprop(lr=0.01, alpha="a"),
     r"'a' is 1.0, read as rmsprop's alpha"),
    (hg.Schedule("lr", [0.1, -0.1], windows=2), hg.optim.sgd(lr="lr"),
     r"'lr' is -0.1, read as sgd's lr \(>= 0\)"),
])
def test_a_value_outside_the_arguments_domain_is_refused(
        item: hg.HyperParameter, opt: hg.optim.Optimizer, match: str) -> None:
    p = _problem([item], opt)
    with pytest.raises(ValueError, match=match):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_the_trainer_holds_an_identity_momentum_inside_its_domain() -> None:
    p = _problem([hg.Scalar("mom", 0.6)], hg.optim.sgd(lr=0.1, momentum="mom"))
    trainer = hg.Trainer(p, outer=functools.partial(hg.SignDescent, lr=0.5),
                         mode=hg.Offline(outer_steps=3),
                         callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    # the search box too: init +- 1 reached -0.4 and 1.6
    assert 0.0 <= float(trainer.box[0][0]) and float(trainer.box[1][0]) < 1.0
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        res = trainer.fit()
    said = [str(w.message) for w in got if issubclass(w.category, BoundsWarning)]
    assert len(said) == 1, said
    assert ("outer step 0 moved 'mom' to 1.1, outside the domain of sgd's momentum (in [0, "
            "1)); it is held at the domain's edge") in said[0]
    for rec in res.history:
        assert 0.0 <= rec["hyperparams"]["mom"] < 1.0
    assert 0.0 <= res.values["mom"] < 1.0


def test_a_transform_that_stays_inside_gets_no_domain_bounds() -> None:
    p = _problem([hg.Scalar("mom", 0.9, transform="logit"), hg.Scalar("lr", 0.1, "log")],
                 hg.optim.sgd(lr="lr", momentum="mom"))
    assert hg.Trainer(p, callbacks=[hg.run.Log(None)]).domain is None


def test_a_learning_rate_window_of_zero_stays_allowed() -> None:
    """A warm-up from 0, a group held frozen: a tuned learning rate of 0 trains nothing and is
    no mistake (as a constant, lr=0 is refused)."""
    p = _problem([hg.Schedule("lr", [0.0, 0.1], windows=2)], hg.optim.sgd(lr="lr"))
    hg.ForwardMode().hypergradient(p, p.init_raw())
