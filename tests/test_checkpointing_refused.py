"""Activation checkpointing (``torch.utils.checkpoint``) inside the model: torch.func's
transforms, which every exact method uses for a step's derivatives, cannot run through it
(saved-tensor hooks; with ``use_reentrant=True`` an autograd.Function without
``setup_context``). It passed the problem's check and failed at the first hypergradient with
torch's message alone; now the check refuses it naming the cause and the fix. The same for a
custom autograd.Function without ``setup_context``; one with it stays exact."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fixtures import Cube
from torch import nn
from torch.utils.checkpoint import checkpoint

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.testing import hypergradcheck


class _OldCube(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class _CubeNoJvp(torch.autograd.Function):
    """Cube without a jvp staticmethod: reverse mode only."""

    generate_vmap_rule = True
    forward = Cube.forward
    setup_context = Cube.setup_context
    backward = Cube.backward


class _CubeNoVmap(torch.autograd.Function):
    """Cube without a vmap rule."""

    forward = Cube.forward
    setup_context = Cube.setup_context
    backward = Cube.backward
    jvp = Cube.jvp


class _Net(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a = nn.Sequential(nn.Linear(5, 8), nn.Tanh())
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "plain":
            return self.b(self.a(x))
        if self.how in ("old_function", "function", "no_jvp", "no_vmap"):
            cube = {"old_function": _OldCube, "function": Cube, "no_jvp": _CubeNoJvp,
                    "no_vmap": _CubeNoVmap}[self.how]
            return self.b(cube.apply(self.a(x)))
        if self.how == "reentrant_inner":  # its input requires grad: autograd.grad refuses
            return self.b(checkpoint(self.a[1], self.a[0](x), use_reentrant=True))
        return self.b(checkpoint(self.a, x, use_reentrant=self.how == "reentrant"))


def _problem(how: str) -> hg.InnerProblem:
    torch.manual_seed(0)
    x = torch.randn(32, 5, dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    return hg.InnerProblem(_Net(how).double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                           MiniBatches(x, y, batch_size=16, seed=0), 4,
                           lambda m, hp: F.cross_entropy(m(x), y))


@pytest.mark.parametrize("how", ["hooks", "reentrant", "reentrant_inner", "old_function"])
def test_activation_checkpointing_is_refused_at_the_check(how: str) -> None:
    """``reentrant_inner`` (a checkpointed block inside the model) failed in the model probe
    as torch's 'use_reentrant=True ... incompatible with .grad()', whose advice
    (use_reentrant=False) hypergrad refuses too."""
    p = _problem(how)
    # torch's reentrant checkpoint warns that no input requires grad (its own remark)
    with pytest.warns(UserWarning) if how.startswith("reentrant") else contextlib.nullcontext():
        with pytest.raises(ValueError, match=r"torch.utils.checkpoint.*FiniteDifference runs"):
            p.check(p.init_raw())


@pytest.mark.parametrize("how", ["plain", "function"])
def test_without_it_the_same_model_is_exact(how: str) -> None:
    assert hypergradcheck(_problem(how)).ok



@pytest.mark.parametrize(("how", "why"), [
    ("no_jvp", "without a jvp staticmethod"),
    ("no_vmap", "custom autograd.Function: generate_vmap_rule = True or a vmap staticmethod")])
def test_a_strategy_a_custom_function_cannot_run_is_named_and_left_out_of_the_check(
        how: str, why: str) -> None:
    """Forward-over-reverse through a custom Function without a jvp (or a vmap rule) failed
    as torch's bare error (a string match missed torch's 'forward mode AD'), and
    hypergradcheck's default 'every strategy' crashed on it instead of checking the others."""
    p = _problem(how)
    with pytest.raises(NotImplementedError, match=f"ForwardOverReverse: .*{why}"):
        hypergradcheck(p, strategies=[hg.hvp.ForwardOverReverse()])
    with pytest.warns(hg.errors.HypergradWarning, match="left out the strategy "
                                                        "ForwardOverReverse"):
        report = hypergradcheck(p)
    assert report.ok and set(report.strategies) == {"lr"}


def test_an_operation_without_a_batching_rule_is_named_and_left_out_of_the_check() -> None:
    """nn.RReLU in training (aten::rrelu_with_noise has no batching rule): the default
    strategy runs, ForwardOverReverse (which vmaps the forward pass) failed as torch's bare
    'vmap: we do not yet support', and hypergradcheck crashed on it."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.RReLU(), nn.Linear(8, 3)).double()
    x, y = torch.randn(16, 4, dtype=torch.float64), torch.randint(0, 3, (16,))
    p = hg.InnerProblem(m, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        [(x, y)], 5, lambda m, hp: F.cross_entropy(m(x), y))
    with pytest.raises(NotImplementedError, match=r"ForwardOverReverse: vmap: we do not yet "
                                                  r"support aten::rrelu_with_noise.*batching"):
        hg.ForwardMode(hg.hvp.ForwardOverReverse()).hypergradient(p, p.init_raw())
    with pytest.warns(hg.errors.HypergradWarning, match="left out the strategy "
                                                        "ForwardOverReverse"):
        assert hypergradcheck(p).ok


def test_a_strategy_torch_fails_inside_is_left_out_of_the_default_check() -> None:
    """BatchedAutograd through GroupNorm's double backward fails with torch's shape error, and
    ForwardOverReverse through F.mse_loss with its RuntimeError: hypergradcheck's default
    'every strategy' lost the whole check (the architectures probe); a strategy chosen by the
    caller still raises."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 8), nn.GroupNorm(2, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    x, y = torch.randn(16, 6, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)
    p = hg.InnerProblem(m, lambda m, b, hp: F.mse_loss(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr", momentum=0.9),
                        hg.HyperParams([hg.Scalar("lr", 0.05, "log")]), [(x, y)], 4,
                        lambda m, hp: F.mse_loss(m(x), y))
    with pytest.raises(RuntimeError):
        hypergradcheck(p, strategies=[hg.hvp.BatchedAutograd()])
    with pytest.warns(hg.errors.HypergradWarning) as got:
        report = hypergradcheck(p)
    said = " | ".join(str(w.message) for w in got)
    for strategy in ("BatchedAutograd", "ForwardOverReverse"):
        assert (f"left out the strategy {strategy}, which cannot run on this problem "
                f"(RuntimeError: ") in said, said
    assert report.ok and report.fwd_vs_fd["lr"] < 1e-6, str(report)
