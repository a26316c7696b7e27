"""A loss that draws randomness hypergrad does not seed per step (NumPy, Python's ``random``, a
``torch.Generator`` of its own) is another function at every evaluation: forward mode, reverse
mode and finite differences evaluate a step a different number of times, so they differentiate
different functions and disagree (8 % apart here) without a word. The problem warns at its
probe (UnseededRandomnessWarning); torch's default generator (seeded per step: noise with
``torch.randn``, ``nn.Dropout``) does not warn and stays exact."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.errors import UnseededRandomnessWarning


def _problem(train_noise: Any = None, val_noise: Any = None, dropout: float = 0.0
             ) -> hg.InnerProblem:
    torch.manual_seed(0)
    x = torch.randn(64, 5, dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    xv = torch.randn(32, 5, dtype=torch.float64)
    yv = (xv[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Dropout(dropout),
                          nn.Linear(8, 2)).double()

    def train_loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
        xb, yb, _ = batch
        return F.cross_entropy(m(xb if train_noise is None else xb + train_noise(xb)), yb)

    def val_loss(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(xv if val_noise is None else xv + val_noise(xv)), yv)

    return hg.InnerProblem(model, train_loss, hg.optim.sgd(lr="lr"),
                           hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                           MiniBatches(x, y, batch_size=16, seed=0), 20, val_loss)


def test_numpy_noise_in_the_training_loss_warns_and_is_why_the_methods_disagree() -> None:
    rng = np.random.default_rng(0)
    p = _problem(train_noise=lambda x: 0.3 * torch.from_numpy(rng.normal(size=x.shape)))
    with pytest.warns(UnseededRandomnessWarning, match="train_loss gave .* NumPy"):
        p.check(p.init_raw())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnseededRandomnessWarning)
        fwd = hg.ForwardMode().hypergradient(p, p.init_raw()).grad
        rev = hg.ReverseMode().hypergradient(p, p.init_raw()).grad
    assert float((fwd - rev).abs().max()) > 0.01 * float(rev.abs().max())  # what it warns of


def test_a_generator_of_its_own_or_pythons_random_in_the_validation_loss_warns() -> None:
    gen = torch.Generator().manual_seed(1)
    p = _problem(val_noise=lambda x: 0.3 * torch.randn(x.shape, generator=gen,
                                                       dtype=x.dtype))
    with pytest.warns(UnseededRandomnessWarning, match="val_loss gave"):
        p.check(p.init_raw())
    q = _problem(train_noise=lambda x: 0.3 * random.gauss(0.0, 1.0) * torch.ones_like(x))
    with pytest.warns(UnseededRandomnessWarning, match="train_loss gave"):
        q.check(q.init_raw())


def test_torchs_default_generator_is_seeded_per_step_and_stays_exact() -> None:
    p = _problem(train_noise=lambda x: 0.3 * torch.randn_like(x), dropout=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnseededRandomnessWarning)
        p.check(p.init_raw())
        fwd = hg.ForwardMode().hypergradient(p, p.init_raw()).grad
        rev = hg.ReverseMode().hypergradient(p, p.init_raw()).grad
    torch.testing.assert_close(fwd, rev, rtol=1e-10, atol=1e-14)
