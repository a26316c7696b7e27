"""Gradient clipping by global norm (hypergrad.optim.clip): equal to torch's clip_grad_norm_ +
torch.optim step for step, and exact in every differentiation path (forward's closed form,
forward's jvp rule, reverse, mixed-mode reverse, central finite differences), with the clip
active, inactive, and active at some steps only."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import jvp

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.optim import ClipGradNorm, clip_grad_norm
from hypergrad.optim.clip import CLIP_EPS, clip_coefficient, clip_tangent, global_norm
from hypergrad.tasks import digits_data, mlp
from hypergrad.testing import hypergradcheck, rel_err

FACTORIES: dict[str, tuple[Any, dict[str, Any]]] = {
    "sgd": (hg.optim.sgd, {"lr": 0.3}),
    "momentum": (hg.optim.sgd, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
    "nesterov": (hg.optim.sgd, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    "adam": (hg.optim.adam, {"lr": 0.01, "weight_decay": 1e-3}),
    "adamw": (hg.optim.adamw, {"lr": 0.01, "weight_decay": 0.1}),
    "rmsprop": (hg.optim.rmsprop, {"lr": 0.01, "momentum": 0.5}),
    "adagrad": (hg.optim.adagrad, {"lr": 0.05}),
}


def _data() -> Any:
    return digits_data(n_train=64, n_val=64, dtype=torch.float64)


def _loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
    x, y, _ = batch
    return F.cross_entropy(m(x), y)


def _norms(steps: int = 12) -> list[float]:
    """The gradient norms of a plain run (to place a clip between them)."""
    data = _data()
    torch.manual_seed(0)
    net = mlp([64, 16, 10]).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    b = MiniBatches(data.x_train, data.y_train, batch_size=16, seed=0)
    out = []
    for t in range(steps):
        x, y, _ = b(t)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        out.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), 1e9)))
        opt.step()
    return out


@pytest.mark.parametrize("name", list(FACTORIES))
@pytest.mark.parametrize("max_norm", [0.05, 0.5, 1e6])
def test_equals_torch_clip_grad_norm(name: str, max_norm: float) -> None:
    """problem.run with clip_grad_norm=c is torch.nn.utils.clip_grad_norm_(params, c) +
    torch.optim's step, step for step in float64 (always active, mixed, never active)."""
    factory, args = FACTORIES[name]
    data = _data()
    torch.manual_seed(0)
    net = mlp([64, 16, 10]).double()
    ref = copy.deepcopy(net)
    opt = factory(**args, clip_grad_norm=max_norm)
    assert isinstance(opt, ClipGradNorm) and opt.name == factory(**args).name
    steps = 12
    b = MiniBatches(data.x_train, data.y_train, batch_size=16, seed=0)
    problem = hg.InnerProblem(net, _loss, opt, hg.HyperParams([hg.Scalar("unused", 1.0)]), b,
                              steps, lambda m, hp: hp["unused"] * F.cross_entropy(
                                  m(data.x_val), data.y_val))
    state = problem.run(problem.init_raw())
    topt = opt.to_torch(list(ref.parameters()))
    active = 0
    for t in range(steps):
        x, y, _ = b(t)
        topt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        n = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
        active += bool(n > max_norm)
        topt.step()
    for k, p in ref.named_parameters():
        assert torch.allclose(state.params[k], p.detach(), rtol=1e-12, atol=1e-13), k
    if max_norm == 1e6:
        assert active == 0
    elif max_norm == 0.05:
        assert active == steps


def _at_threshold(g: dict[str, torch.Tensor]) -> float:
    """The ``c`` with ``c / (||g|| + eps) == 1`` exactly, as torch computes it: the clip's one
    point where the two sides' derivatives differ (autograd's clamp takes the active one)."""
    n = global_norm(g) + CLIP_EPS
    c = float(n)
    for _ in range(20):
        r = float(c / n)
        if r == 1.0:
            return c
        c = math.nextafter(c, math.inf if r < 1 else -math.inf)
    raise AssertionError("no float c gives c / (||g|| + eps) == 1")


@pytest.mark.parametrize("branch", [None, False])
def test_clip_tangent_is_jvp_of_the_clip(branch: bool | None) -> None:
    """The closed form G' = s G + g (ds/dg . G) is the jvp of g -> clip(g), column by column,
    where the clip is active; G unchanged where it is not. ``branch=False`` is the form an
    accelerator takes (no read of the norm: the CUDA review found one sync per step)."""
    torch.manual_seed(0)
    g = {"a": torch.randn(3, 4, dtype=torch.float64), "b": torch.randn(5, dtype=torch.float64)}
    G = {"a": torch.randn(6, 3, 4, dtype=torch.float64),
         "b": torch.randn(6, 5, dtype=torch.float64)}
    n = float(global_norm(g))
    for c in (0.3 * n, 2 * n, _at_threshold(g)):
        new_g, new_G = clip_tangent(g, G, c, branch=branch)

        def clip(gg: dict[str, torch.Tensor], c: float = c) -> dict[str, torch.Tensor]:
            coef, _ = clip_coefficient(gg, c)
            return {k: v * coef for k, v in gg.items()}

        for j in range(6):
            val, tan = jvp(clip, (g,), ({k: v[j] for k, v in G.items()},))
            for k in g:
                assert torch.allclose(new_g[k], val[k], rtol=1e-14, atol=0)
                assert torch.allclose(new_G[k][j], tan[k], rtol=1e-12, atol=1e-14)
        if c == 2 * n:
            if branch is None:  # on the CPU the inactive clip is skipped
                assert new_G is G and new_g is g
        else:
            assert float(global_norm(new_g)) == pytest.approx(c, rel=1e-5)


def _problem(opt_name: str, max_norm: float | None, steps: int = 10) -> hg.InnerProblem:
    """A float64 MLP with a 3-window lr schedule, a momentum (or Adam's beta1) and per-tensor
    weight decays, clipped at ``max_norm``."""
    data = _data()
    torch.manual_seed(0)
    net = mlp([64, 12, 10]).double()
    if opt_name == "momentum":
        opt = hg.optim.sgd(lr="lr", momentum="mom", weight_decay="wd",
                           clip_grad_norm=max_norm)
        lr0 = 0.1
    elif opt_name == "adam":
        opt = hg.optim.adam(lr="lr", betas=("mom", 0.999), weight_decay="wd",
                            clip_grad_norm=max_norm)
        lr0 = 0.01
    else:
        opt = hg.optim.adamw(lr="lr", betas=("mom", 0.99), weight_decay="wd",
                             clip_grad_norm=max_norm)
        lr0 = 0.01
    hps = hg.HyperParams([hg.Schedule("lr", lr0, windows=3, transform="log"),
                          hg.Scalar("mom", 0.8, transform="logit"),
                          hg.PerTensor("wd", 1e-2, transform="log")])
    b = MiniBatches(data.x_train, data.y_train, batch_size=16, seed=0)
    return hg.InnerProblem(net, _loss, opt, hps, b, steps,
                           lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))


@pytest.mark.parametrize("opt_name", ["momentum", "adam", "adamw"])
@pytest.mark.parametrize("where", ["active", "mixed", "inactive"])
def test_hypergradcheck_with_clipping(opt_name: str, where: str) -> None:
    """forward (closed form) = reverse = central finite differences = every HVP strategy, in
    float64, with the clip active at every step, at some steps, or at none; and the jvp tangent
    rule and mixed-mode reverse agree too."""
    norms = _norms(10)
    c = {"active": 0.2 * min(norms), "inactive": 10 * max(norms),
         "mixed": sorted(norms)[len(norms) // 2] * 1.01}[where]
    problem = _problem(opt_name, c)
    lam = problem.init_raw()
    report = hypergradcheck(problem, lam, strategies=())  # HVPs do not see the clip
    assert report.ok, str(report)
    assert report.max("fwd_vs_rev") < 1e-10
    assert not report.fd_unreliable, str(report)
    fwd = hg.ForwardMode().hypergradient(problem, lam).grad
    by_jvp = hg.ForwardMode(tangent=hg.tangent.JVP()).hypergradient(problem, lam).grad
    mixed = hg.ReverseMode(step_vjp=hg.stepvjp.MixedMode()).hypergradient(problem, lam).grad
    assert rel_err(by_jvp, fwd) < 1e-10 and rel_err(mixed, fwd) < 1e-10
    unclipped = hg.ForwardMode().hypergradient(_problem(opt_name, None), lam).grad
    if where == "inactive":
        assert torch.equal(fwd, unclipped)
    else:  # the clip changes the hypergradient: the check above is not vacuous
        assert rel_err(fwd, unclipped) > 1e-3


def test_online_and_hd_with_clipping() -> None:
    """HD and MARTHE run the clipped step: MARTHE(mu=1) = forward mode, MARTHE(mu=0) = HD."""
    problem = _problem("momentum", 0.5 * min(_norms(6)), steps=6)
    lam = problem.init_raw()
    fwd = hg.ForwardMode().hypergradient(problem, lam).grad
    m1 = hg.MARTHE(mu=1.0).hypergradient(problem, lam).grad
    m0 = hg.MARTHE(mu=0.0).hypergradient(problem, lam).grad
    hd = hg.HD().hypergradient(problem, lam).grad
    assert rel_err(m1, fwd) < 1e-12 and rel_err(m0, hd) < 1e-10


def test_clip_arguments() -> None:
    opt = hg.optim.adamw(lr="lr", clip_grad_norm=1.0)
    assert opt.bound_names() == {"lr": "lr"} and opt.args["clip_grad_norm"] == 1.0
    assert not opt.elementwise and "clip_grad_norm" in opt.options
    assert "clip_grad_norm(1)" in repr(opt)
    assert hg.optim.create("sgd", lr=0.1, clip_grad_norm=None).__class__ is hg.optim.SGD
    for bad in (0.0, -1.0, float("inf"), float("nan"), True, "1.0", np.bool_(True),
                np.float32(-1.0)):
        with pytest.raises(ValueError, match="clip_grad_norm"):
            hg.optim.sgd(lr=0.1, clip_grad_norm=bad)
    # a NumPy number is a number (np.float32(1.0) was refused as not one; the clipping probe)
    for good in (np.float32(1.0), np.int64(2)):
        assert hg.optim.sgd(lr=0.1, clip_grad_norm=good).max_norm == float(good)
    with pytest.raises(ValueError, match="The threshold is a constant: it cannot be a "
                                         "hyperparameter"):  # a name, as lr takes one
        hg.optim.sgd(lr=0.1, clip_grad_norm="c")
    with pytest.raises(ValueError, match="already clipped"):
        clip_grad_norm(opt, 2.0)
    assert clip_grad_norm(hg.optim.sgd(lr=0.1), None).__class__ is hg.optim.SGD


def test_clip_in_config() -> None:
    """hypergrad-run inner_optimizer.clip_grad_norm=1.0 builds a clipped optimizer."""
    from hydra import compose, initialize_config_dir

    from hypergrad.config import CONFIG_DIR, build, register_configs

    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["inner_optimizer=adamw",
                                           "inner_optimizer.clip_grad_norm=1.0",
                                           "task.steps=3", "mode.outer_steps=1"])
    task, trainer = build(cfg)
    assert isinstance(task.problem.optimizer, ClipGradNorm)
    assert task.problem.optimizer.max_norm == 1.0


def test_a_tiny_clip_at_a_zero_gradient_has_a_finite_tangent() -> None:
    """clip_grad_norm <= the clip's eps (1e-6) is active at a zero gradient, where the tangent
    was 0 * -inf = NaN (forward mode NaN, reverse mode and finite differences finite)."""
    from torch import nn

    torch.manual_seed(0)
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    batches = [(x[:3], y[:3], 1.0), (x[3:], y[3:], 0.0)]  # odd steps: a gradient of exactly 0

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return b[2] * ((m(b[0]) - b[1]) ** 2).mean()

    p = hg.InnerProblem(nn.Linear(3, 2).double(), tl, hg.optim.adam(lr="lr", clip_grad_norm=1e-7),
                        hg.HyperParams([hg.Scalar("lr", 0.05, "log")]), batches, 5,
                        lambda m, hp: ((m(x) - y) ** 2).mean())
    lam = p.init_raw()
    fwd = hg.ForwardMode().hypergradient(p, lam).grad
    rev = hg.ReverseMode().hypergradient(p, lam).grad
    fd = hg.FiniteDifference().hypergradient(p, lam).grad
    assert torch.isfinite(fwd).all() and torch.allclose(fwd, rev, rtol=1e-10)
    assert torch.allclose(fwd, fd, rtol=1e-6)
