"""Models users bring: dropout, BatchNorm (train and eval mode), attention, LSTM/GRU, ResNets.

Every model (float64, small sizes): forward vs reverse to 1e-8, two forward runs identical,
forward vs finite differences within the check's reported tolerance, every HVP strategy equal.
Also: eval-mode submodules trained as torch.optim trains them, an online run of a model with
dropout and BatchNorm. The step's randomness itself: test_rng.py.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from fixtures import MODELS, make_trainer, model_problem
from torch import nn

import hypergrad as hg
from hypergrad.testing import hypergradcheck


@pytest.mark.parametrize("name", MODELS)
def test_model_forward_reverse_fd_and_strategies_agree(name: str) -> None:
    problem = model_problem(name)
    lam = problem.init_raw()
    rep = hypergradcheck(problem, lam, rtol_rev=1e-8, rtol_strategies=1e-9)  # raises on failure
    assert rep.max("fwd_vs_rev") <= 1e-8
    assert all(rep.fwd_vs_fd[n] <= rep.fd_tolerance[n] for n in rep.fwd_vs_fd)
    again = hg.ForwardMode().hypergradient(problem, lam).grad
    assert rep.grad is not None and torch.equal(again, rep.grad)  # repeatable, bit for bit
    if name.startswith("dropout") or name in ("transformer_dropout", "sdpa"):
        assert problem.draws is True
    else:
        assert problem.draws is False


def test_online_trainer_runs_a_dropout_batchnorm_model() -> None:
    problem = model_problem("dropout_bn_mlp", steps=8)
    res = make_trainer(problem, mode="online", interval=4,
                       outer=functools.partial(torch.optim.SGD, lr=0.1)).fit()
    assert len(res.history) == 2 and not res.diverged


def test_eval_mode_batchnorm_trains_as_torch_optim_trains_it() -> None:
    """A BatchNorm the user put in eval mode keeps its statistics frozen during training: the
    trajectory equals torch.optim.SGD on the module with that submodule in eval mode."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).to(torch.float64)
    with torch.no_grad():  # statistics the frozen layer must keep
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model[1].eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 3, 6, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (16,), generator=g)
    batches = [(x[:8], y[:8]), (x[8:], y[8:])]
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    problem = hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.optim.sgd(lr="lr", momentum=0.9, weight_decay=1e-3), hps, batches, 6,
        lambda m, hp: F.cross_entropy(m(x), y))
    final = problem.run(problem.init_raw())

    ref = copy.deepcopy(model)
    ref.train()
    ref[1].eval()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for t in range(6):
        xb, yb = batches[t % 2]
        opt.zero_grad()
        F.cross_entropy(ref(xb), yb).backward()
        opt.step()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(final.params[name], p.detach(), rtol=1e-12, atol=1e-14)
    # the frozen layer's statistics are constants, the other layer's are trained state
    assert set(final.buffers) == {"4.running_mean", "4.running_var"}
    torch.testing.assert_close(final.buffers["4.running_mean"], ref[4].running_mean)
    assert torch.equal(model[1].running_mean, ref[1].running_mean)  # untouched
    assert not model[1].training and model[4].training  # the user's modes are left as they were
