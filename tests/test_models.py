"""Models users bring: dropout, BatchNorm (train and eval mode), attention, LSTM/GRU, ResNets.

Every model (float64, small sizes): forward vs reverse to 1e-8, two forward runs identical,
forward vs finite differences within the check's reported tolerance, every HVP strategy equal.
Also: the step's random draws leave the caller's generator alone, a user's own noise in the loss,
eval-mode submodules trained as torch.optim trains them, attention with and without dropout.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.problems.models import RNNClassifier, TransformerClassifier, resnet18
from hypergrad.testing import hypergradcheck, rel_err

DT = torch.float64


class _SDPABlock(nn.Module):
    """A hand-written attention layer calling F.scaled_dot_product_attention directly."""

    def __init__(self, d: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.qkv = nn.Linear(4, 3 * d)
        self.out = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, -1)).permute(2, 0, 3, 1, 4)
        h = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2 if self.training else 0.0)
        return self.out(h.transpose(1, 2).flatten(2).mean(1))


def _model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    if name == "dropout_bn_mlp":
        return nn.Sequential(nn.Linear(8, 12), nn.BatchNorm1d(12), nn.Tanh(), nn.Dropout(0.2),
                             nn.Linear(12, 3)), (8,)
    if name == "dropout_mlp":
        return nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Dropout(0.3), nn.Linear(12, 3)), (8,)
    if name in ("transformer", "transformer_dropout"):
        return TransformerClassifier(d_model=8, nhead=2, layers=2, dim_feedforward=12,
                                     num_classes=3, in_features=4,
                                     dropout=0.1 if name.endswith("dropout") else 0.0), (5, 4)
    if name == "sdpa":
        return _SDPABlock(), (5, 4)
    if name in ("lstm", "gru"):
        return RNNClassifier(4, 6, 3, cell=name), (5, 4)
    if name in ("resnet", "resnet_eval_bn"):
        m = resnet18(num_classes=3, width=2)
        if name == "resnet_eval_bn":
            m.layer1.eval()  # frozen statistics in the first stage
        return m, (3, 16, 16)
    raise ValueError(name)


def _problem(name: str, steps: int = 4, noise: bool = False) -> hg.InnerProblem:
    model, shape = _model(name)
    model = model.to(DT)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, *shape, generator=g, dtype=DT)
    y = torch.randint(0, 3, (24,), generator=g)
    hps = hg.HyperParams([hg.Schedule("lr", 0.05, windows=2, transform="log"),
                          hg.Scalar("mom", 0.5, transform="logit"),
                          hg.Scalar("wd", 1e-3, transform="log")])

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        xb, yb, _ = batch
        if noise:  # a user's own random op: input noise from torch's default generator
            xb = xb + 0.1 * torch.randn_like(xb)
        return F.cross_entropy(m(xb), yb)

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(x[:8]), y[:8])

    return hg.InnerProblem(model, train_loss, hg.sgd(lr="lr", momentum="mom", weight_decay="wd"),
                           hps, MiniBatches(x, y, batch_size=8), steps, val_loss)


MODELS = ["dropout_bn_mlp", "dropout_mlp", "transformer", "transformer_dropout", "sdpa", "lstm",
          "gru", "resnet", "resnet_eval_bn"]


@pytest.mark.parametrize("name", MODELS)
def test_model_forward_reverse_fd_and_strategies_agree(name: str) -> None:
    problem = _problem(name)
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


def test_user_noise_in_the_loss_draws_per_step_and_agrees() -> None:
    problem = _problem("dropout_mlp", noise=True)
    rep = hypergradcheck(problem, strategies=[hg.ColumnLoop()])
    assert rep.max("fwd_vs_rev") <= 1e-10 and not rep.fd_unreliable


def test_step_draws_leave_the_callers_generator_alone() -> None:
    problem = _problem("dropout_mlp")
    lam = problem.init_raw()
    torch.manual_seed(123)
    hg.ForwardMode().hypergradient(problem, lam)
    problem.run(lam)
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), after)


def test_another_run_seed_draws_other_masks() -> None:
    a, b = _problem("dropout_mlp"), _problem("dropout_mlp")
    b.seed = 7
    lam = a.init_raw()
    ga, gb = (hg.ForwardMode().hypergradient(p, lam).grad for p in (a, b))
    assert rel_err(ga, gb) > 1e-3


def test_plain_steps_of_a_model_without_draws_use_eager_autograd() -> None:
    problem = _problem("lstm")
    lam = problem.init_raw()
    problem.run(lam)
    assert problem.draws is False  # so plain steps take torch.autograd.grad (fused kernels)


def test_online_trainer_runs_a_dropout_batchnorm_model() -> None:
    problem = _problem("dropout_bn_mlp", steps=8)
    res = hg.Trainer(problem, mode="online", interval=4, progress=False, log=lambda s: None,
                     outer_optimizer=functools.partial(torch.optim.SGD, lr=0.1)).fit()
    assert len(res.history) == 2 and not res.diverged


def test_eval_mode_batchnorm_trains_as_torch_optim_trains_it() -> None:
    """A BatchNorm the user put in eval mode keeps its statistics frozen during training: the
    trajectory equals torch.optim.SGD on the module with that submodule in eval mode."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).to(DT)
    with torch.no_grad():  # statistics the frozen layer must keep
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model[1].eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 3, 6, 6, generator=g, dtype=DT)
    y = torch.randint(0, 3, (16,), generator=g)
    batches = [(x[:8], y[:8]), (x[8:], y[8:])]
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    problem = hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.sgd(lr="lr", momentum=0.9, weight_decay=1e-3), hps, batches, 6,
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
