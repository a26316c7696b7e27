"""A loss that reads the trainable parameters of the module given to the problem (an L2 penalty
over ``model.parameters()`` of a module it closed over) reads their initial values: hypergrad
trains copies, so the penalty neither trained the model nor had a hypergradient (exactly 0,
silently). The problem refuses it at its probe, naming the parameters and ``m.params``; frozen
parameters (constants either way), the weights read from the model argument, and a copy of the
initial weights (an anchor) pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches


def _problem(penalty: Any, val_extra: Any = None, freeze_first: bool = False
             ) -> tuple[hg.InnerProblem, nn.Module]:
    torch.manual_seed(0)
    x = torch.randn(64, 5, dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    xv = torch.randn(32, 5, dtype=torch.float64)
    yv = (xv[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    if freeze_first:
        model[0].requires_grad_(False)

    def train_loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
        xb, yb, _ = batch
        return F.cross_entropy(m(xb), yb) + hp["wd"] * penalty(m, model)

    def val_loss(m: Any, hp: Any) -> torch.Tensor:
        out = F.cross_entropy(m(xv), yv)
        return out if val_extra is None else out + val_extra(model)

    p = hg.InnerProblem(model, train_loss, hg.optim.sgd(lr=0.1),
                        hg.HyperParams([hg.Scalar("wd", 0.01, "log")]),
                        MiniBatches(x, y, batch_size=16, seed=0), 10, val_loss)
    return p, model


def test_a_penalty_over_the_given_modules_parameters_is_refused() -> None:
    p, _ = _problem(lambda m, model: sum(w.pow(2).sum() for w in model.parameters()))
    with pytest.raises(ValueError, match=r"train_loss reads the trainable parameters "
                                         r"\['0.weight', '0.bias', '2.weight', '2.bias'\].*"
                                         r"m.params"):
        p.check(p.init_raw())


def test_the_validation_loss_reading_one_of_them_is_refused_by_name() -> None:
    p, _ = _problem(lambda m, model: sum(w.pow(2).sum() for w in m.params.values()),
                    val_extra=lambda model: 0.0 * model[2].weight.sum())
    with pytest.raises(ValueError, match=r"val_loss reads the trainable parameters "
                                         r"\['2.weight'\]"):
        p.check(p.init_raw())


def test_the_models_own_weights_frozen_ones_and_an_anchor_pass_and_are_exact() -> None:
    p, _ = _problem(lambda m, model: sum(w.pow(2).sum() for w in m.params.values()))
    fwd = hg.ForwardMode().hypergradient(p, p.init_raw()).grad
    rev = hg.ReverseMode().hypergradient(p, p.init_raw()).grad
    assert float(fwd.abs().max()) > 0
    torch.testing.assert_close(fwd, rev, rtol=1e-10, atol=1e-14)
    frozen, _ = _problem(lambda m, model: model[0].weight.pow(2).sum()
                         + m.params["2.weight"].pow(2).sum(), freeze_first=True)
    frozen.check(frozen.init_raw())  # a frozen parameter is a constant either way
    anchors: dict[str, torch.Tensor] = {}

    def to_anchor(m: Any, model: nn.Module) -> torch.Tensor:
        if not anchors:  # copied once, as docs say
            anchors.update({k: v.detach().clone() for k, v in model.named_parameters()})
        return sum((m.params[k] - anchors[k]).pow(2).sum() for k in anchors)  # type: ignore[return-value]

    q, _ = _problem(to_anchor)
    q.check(q.init_raw())


def test_a_forward_reading_a_parameter_through_a_kept_reference_is_refused() -> None:
    """A reference kept outside the registered parameters (a list attribute) is not replaced
    by the functional call: forward read the initial weight at every step."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 2)
            self.kept = [self.a.weight]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.tanh(self.a(x)) @ self.kept[0])

    torch.manual_seed(0)
    x = torch.randn(32, 5, dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    p = hg.InnerProblem(Net().double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        MiniBatches(x, y, batch_size=16, seed=0), 4,
                        lambda m, hp: F.cross_entropy(m(x), y))
    with pytest.raises(ValueError, match=r"\['a.weight'\].*a list or dict attribute"):
        p.check(p.init_raw())


def test_a_refusal_is_raised_again_by_a_second_check() -> None:
    """The probe runs once per problem: a second ``check`` (a notebook's retry) refuses
    again instead of going on without the probe."""
    p, _ = _problem(lambda m, model: sum(w.pow(2).sum() for w in model.parameters()))
    for _ in range(2):
        with pytest.raises(ValueError, match="reads the trainable parameters"):
            p.check(p.init_raw())
    with pytest.raises(ValueError, match="reads the trainable parameters"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_a_submodule_reached_through_the_model_argument_says_what_to_do() -> None:
    """``m[2](h)`` or ``m.head(h)`` in a loss: the argument is the model bound to the step's
    tensors, so the attribute is not there. The error was ``'ModelFn' object has no attribute
    'head'``; it now names the submodule, says to call the model whole and lists its
    parameters in ``m.params``."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(5, 8)
            self.head = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.tanh(self.body(x)))

    torch.manual_seed(0)
    x = torch.randn(32, 5, dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    p = hg.InnerProblem(Net().double(),
                        lambda m, b, hp: F.cross_entropy(m.head(torch.tanh(m.body(b[0]))), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        MiniBatches(x, y, batch_size=16, seed=0), 4,
                        lambda m, hp: F.cross_entropy(m(x), y))
    with pytest.raises(AttributeError, match=r"your model's submodule 'head' cannot be reached.*"
                                             r"m\(x\).*m.params \('head.weight', 'head.bias'\)"):
        p.run(p.init_raw())


@pytest.mark.parametrize("freeze_first", [False, True])
def test_a_penalty_over_the_model_arguments_parameters_is_the_one_over_m_params(
        freeze_first: bool) -> None:
    """``m.parameters()`` in a loss (an L2 penalty written as for an ``nn.Module``) failed with
    ``'ModelFn' object has no attribute 'parameters'``. It gives the trainable parameters at the
    step's values (so the penalty trains the model and has its hypergradient) and the frozen
    ones as constants, in the module's order."""
    usual, _ = _problem(lambda m, model: sum(w.pow(2).sum() for w in m.parameters()),
                        freeze_first=freeze_first)
    params, model = _problem(lambda m, model: sum(w.pow(2).sum() for w in m.params.values()),
                             freeze_first=freeze_first)
    lam = usual.init_raw()
    got, want = (hg.ReverseMode().hypergradient(q, lam).grad for q in (usual, params))
    frozen = sum(w.pow(2).sum() for w in model[0].parameters()) if freeze_first else 0.0
    assert torch.isfinite(got).all() and got.abs().max() > 0
    if not freeze_first:
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    else:  # a constant more in the loss: the same gradients, the same hypergradient
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)
        assert float(frozen) > 0
    seen: list[str] = []

    def record(m: Any, batch: Any, hp: Any) -> torch.Tensor:
        seen[:] = [k for k, _ in m.named_parameters()]
        return F.cross_entropy(m(batch[0]), batch[1]) + 0.0 * hp["wd"]

    record_p, model = _problem(lambda m, model: 0.0, freeze_first=freeze_first)
    record_p.train_loss = record
    record_p.run(record_p.init_raw())
    assert seen == [k for k, _ in model.named_parameters()]


def test_reading_only_the_parameters_dtype_and_device_passes() -> None:
    """x.to(next(model.parameters()).dtype) reads no values: it was refused as reading the
    trainable parameters themselves (the probe's .dtype counted as a read)."""
    def meta(m: Any, model: nn.Module) -> torch.Tensor:
        w = next(model.parameters())
        assert w.shape[0] == 8 and w.dim() == 2 and w.numel() == 40
        one = torch.ones((), dtype=w.dtype, device=w.device)
        return one * sum(v.pow(2).sum() for v in m.params.values())

    p, _ = _problem(meta)
    p.check(p.init_raw())
    lam = p.init_raw()
    assert torch.allclose(hg.ForwardMode().hypergradient(p, lam).grad,
                          hg.ReverseMode().hypergradient(p, lam).grad, rtol=1e-12)
