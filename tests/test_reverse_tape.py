"""``ReverseMode(tape=True)``: the whole inner run on autograd's tape and one backward pass.
The same hypergradient as reverse mode's stored-states sweep and forward mode (float64, every
optimizer and hyperparameter kind of the grid, BatchNorm, dropout, clipping, an
initialisation hyperparameter), the same final state and validation loss; refused with the
options it cannot combine with."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import hypergrad as hg
from hypergrad.testing import digits_case, grid_cases, rel_err

CASES = grid_cases()


def _agree(problem: hg.InnerProblem, tol: float = 1e-11) -> None:
    lam = problem.init_raw()
    tape = hg.ReverseMode(tape=True).hypergradient(problem, lam)
    rev = hg.ReverseMode().hypergradient(problem, lam)
    fwd = hg.ForwardMode().hypergradient(problem, lam)
    assert float(tape.grad.norm()) > 0
    assert rel_err(tape.grad, rev.grad) < tol and rel_err(tape.grad, fwd.grad) < tol
    assert float(tape.objective) == pytest.approx(float(rev.objective), rel=1e-12)
    for k, v in rev.state.params.items():
        assert not tape.state.params[k].requires_grad
        torch.testing.assert_close(tape.state.params[k], v, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("opt", "kind"), CASES)
def test_the_tape_agrees_with_reverse_and_forward_mode(opt: str, kind: str) -> None:
    _agree(digits_case(opt, kind, steps=6, n_train=24, batch_size=8, hidden=8, n_val=32))


def test_batchnorm_running_statistics_on_the_tape() -> None:
    _agree(digits_case("momentum", "per_tensor_wd", steps=6, n_train=24, batch_size=8,
                       hidden=8, n_val=32, batchnorm=True))


def test_dropout_clipping_and_an_initialisation_scale_on_the_tape() -> None:
    from hypergrad.data import MiniBatches
    from hypergrad.tasks import digits_data

    torch.manual_seed(0)
    data = digits_data(n_train=32, n_val=32, n_test=32, dtype=torch.float64)
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                              torch.nn.Linear(16, 10)).double()
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log"), hg.Scalar("wd", 1e-2, "log"),
                          hg.InitScale("s", 1.0, transform="log")])

    def loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    p = hg.InnerProblem(net, loss, hg.optim.adamw(lr="lr", weight_decay="wd",
                                                  clip_grad_norm=0.5), hps,
                        MiniBatches(data.x_train, data.y_train, batch_size=8), 6,
                        lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val), seed=3)
    _agree(p)


def test_the_tape_is_refused_where_it_cannot_apply() -> None:
    for kw in ({"truncate": 3}, {"checkpoint": "sqrt"}, {"step_vjp": hg.stepvjp.MixedMode()}):
        with pytest.raises(ValueError, match="drop truncate, checkpoint and step_vjp"):
            hg.ReverseMode(tape=True, **kw)
    with pytest.raises(TypeError, match="tape=1 must be True or False"):
        hg.ReverseMode(tape=1)  # type: ignore[arg-type]
    m = hg.ReverseMode(tape=True)
    assert repr(m) == "ReverseMode(tape=True)" and m.label() == "reverse (tape)"
    with pytest.raises(ValueError, match="runs on one process"):
        m.across_ranks(object())


def test_the_trainer_runs_on_the_tape_and_its_estimate_bounds_the_run() -> None:
    p = digits_case("sgd", "lr", steps=6, n_train=24, batch_size=8, hidden=8, n_val=32)
    m = hg.ReverseMode(tape=True)
    est = m.estimate_memory(p)
    assert est.total > hg.ReverseMode().estimate_memory(p).total  # the graph of every step
    res = hg.Trainer(p, m, outer=torch.optim.SGD, mode=hg.Offline(outer_steps=2),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    ref = hg.Trainer(p, hg.ReverseMode(), outer=torch.optim.SGD,
                     mode=hg.Offline(outer_steps=2),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    torch.testing.assert_close(res.lam, ref.lam, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["transformer_dropout", "sdpa", "lstm", "resnet"])
def test_models_users_bring_on_the_tape(name: str) -> None:
    """Attention (math kernel for the double backward), an LSTM (through hypergrad.rnn), a
    ResNet with BatchNorm: the tape records their steps under the problem's second-order
    kernels, and agrees with both other methods."""
    from fixtures import model_problem

    _agree(model_problem(name), tol=1e-9)
