"""Schedule-free AdamW (hypergrad.optim.schedulefree): equal to the schedulefree package's
AdamWScheduleFree step for step in float64 (train-mode parameters y during the run, eval-mode x
after the horizon's last step), and exact in every differentiation path (forward mode's jvp rule,
reverse, mixed-mode reverse, central finite differences), with warmup, decay and clipping."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.optim import AdamWScheduleFree, adamw_schedulefree
from hypergrad.tasks import digits_data, mlp
from hypergrad.testing import hypergradcheck, rel_err

schedulefree = pytest.importorskip("schedulefree")
STEPS = 12


def _loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
    x, y, _ = batch
    return F.cross_entropy(m(x), y)


def _problem(opt: hg.optim.Optimizer, hps: hg.HyperParams | None = None, steps: int = STEPS
             ) -> tuple[hg.InnerProblem, torch.nn.Module]:
    data = digits_data(n_train=64, n_val=64, dtype=torch.float64)
    torch.manual_seed(0)
    net = mlp([64, 16, 10]).double()
    ref = copy.deepcopy(net)
    hps = hps or hg.HyperParams([hg.Scalar("unused", 1.0)])
    b = MiniBatches(data.x_train, data.y_train, batch_size=16, seed=0)

    def val(m: Any, hp: Any) -> torch.Tensor:
        out = F.cross_entropy(m(data.x_val), data.y_val)
        return out * hp["unused"] if "unused" in hp else out

    return hg.InnerProblem(net, _loss, opt, hps, b, steps, val), ref


@pytest.mark.parametrize("args", [
    {"lr": 0.01},
    {"lr": 0.02, "warmup_steps": 5, "weight_decay": 0.1, "betas": (0.8, 0.99)},
    {"lr": 0.05, "warmup_steps": 3, "r": 1.0, "weight_lr_power": 1.0, "eps": 1e-6},
    {"lr": 0.02, "warmup_steps": 4, "weight_decay": 0.05, "clip_grad_norm": 0.5},
])
def test_equals_the_schedulefree_package(args: dict[str, Any]) -> None:
    """Train-mode parameters (y) after every step and eval-mode ones (x) after the last equal
    the package's in float64; the horizon comes from the problem."""
    opt = adamw_schedulefree(**args)
    problem, ref = _problem(opt)
    inner = getattr(problem.optimizer, "inner", problem.optimizer)
    assert isinstance(inner, AdamWScheduleFree) and inner.args["steps"] == STEPS
    assert getattr(opt, "inner", opt).args["steps"] is None  # the user's object is untouched
    clip = args.pop("clip_grad_norm", None)
    topt = schedulefree.AdamWScheduleFree(ref.parameters(), **args)
    topt.train()
    lam = problem.init_raw()
    state = problem.initial_state(lam)
    problem.begin_run()
    b = MiniBatches(*digits_data(n_train=64, n_val=64, dtype=torch.float64)[:2],
                    batch_size=16, seed=0)
    for t in range(STEPS):
        x, y, _ = b(t)
        topt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        topt.step()
        state = problem.run(lam, state, start=t, stop=t + 1)
        if t < STEPS - 1:
            for n, p in ref.named_parameters():
                torch.testing.assert_close(state.params[n], p, rtol=1e-12, atol=1e-14)
    topt.eval()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(state.params[n], p, rtol=1e-12, atol=1e-14)
    whole = problem.run(lam)
    for n, p in ref.named_parameters():
        torch.testing.assert_close(whole.params[n], p, rtol=1e-12, atol=1e-14)


def _tuned(clip: float | None, warmup: int) -> hg.InnerProblem:
    opt = adamw_schedulefree(lr="lr", betas=("b1", "b2"), weight_decay="wd",
                             warmup_steps=warmup, clip_grad_norm=clip)
    hps = hg.HyperParams([hg.Schedule("lr", 0.02, windows=3, transform="log"),
                          hg.Scalar("b1", 0.9, transform="logit"),
                          hg.Scalar("b2", 0.99, transform="logit"),
                          hg.PerTensor("wd", 0.05, transform="log")])
    return _problem(opt, hps, steps=10)[0]


@pytest.mark.parametrize("clip,warmup", [(None, 0), (None, 4), (0.3, 4)])
def test_hypergradients_are_exact(clip: float | None, warmup: int) -> None:
    """forward (jvp rule) = reverse = central finite differences in float64 for a learning-rate
    schedule, both betas and a per-tensor decay; mixed-mode reverse agrees."""
    problem = _tuned(clip, warmup)
    lam = problem.init_raw()
    # windows of different values: at equal ones lr_max = max(...) has a kink (see the
    # module docstring), where finite differences and autograd's half-and-half split differ
    lam[problem.hyperparams.slices["lr"]] += torch.tensor([0.0, 0.3, -0.2], dtype=lam.dtype)
    report = hypergradcheck(problem, lam, strategies=())
    assert report.ok, str(report)
    assert report.max("fwd_vs_rev") < 1e-10
    assert not report.fd_unreliable, str(report)
    fwd = hg.ForwardMode().hypergradient(problem, lam).grad
    mixed = hg.ReverseMode(step_vjp=hg.stepvjp.MixedMode()).hypergradient(problem, lam).grad
    assert rel_err(mixed, fwd) < 1e-10
    assert bool((fwd != 0).all())  # every hyperparameter acts: the check is not vacuous


def test_at_tied_windows_their_sum_is_exact() -> None:
    """At a schedule's constant start (every window the same value: the kink of lr_max), one
    window's hypergradient is no one-sided derivative, but the sum over the windows, the
    derivative of moving them together, equals central finite differences along (1, 1, 1)."""
    problem = _tuned(None, 4)
    lam = problem.init_raw()
    sl = problem.hyperparams.slices["lr"]

    def val(at: torch.Tensor) -> float:
        s = problem.run(at)
        return float(problem.objective(s.params, s.buffers, at))

    fwd = hg.ForwardMode().hypergradient(problem, lam).grad
    rev = hg.ReverseMode().hypergradient(problem, lam).grad
    assert rel_err(rev, fwd) < 1e-10
    d = torch.zeros_like(lam)
    d[sl] = 1.0
    h = 1e-5
    fd = (val(lam + h * d) - val(lam - h * d)) / (2 * h)
    assert float(fwd[sl].sum()) == pytest.approx(float(fd), rel=1e-6)
    one = torch.zeros_like(lam)
    one[sl.start] = 1.0  # one window alone: the kink, not its derivative
    fd0 = (val(lam + h * one) - val(lam - h * one)) / (2 * h)
    assert float(fwd[sl.start]) != pytest.approx(float(fd0), rel=1e-3)


def test_the_last_step_returns_the_average() -> None:
    """x differs from y (the check above would not see a missing swap otherwise), and a
    problem of another horizon swaps at its own last step."""
    problem, _ = _problem(adamw_schedulefree(lr=0.02))
    s = problem.run(problem.init_raw(), stop=STEPS - 1)
    opt = problem.optimizer
    assert isinstance(opt, AdamWScheduleFree)
    unswapped = opt.for_horizon(STEPS + 1)
    grads = {k: torch.zeros_like(v) for k, v in s.params.items()}
    y, _ = unswapped.update(grads, s.opt, s.params, {}, STEPS - 1)
    x, _ = opt.update(grads, s.opt, s.params, {}, STEPS - 1)
    assert all(not torch.equal(x[k], y[k]) for k in x)
    short, _ = _problem(adamw_schedulefree(lr=0.02), steps=5)
    assert short.optimizer.args["steps"] == 5


def test_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match=r"warmup_steps=-1 must be an int >= 0"):
        adamw_schedulefree(warmup_steps=-1)
    with pytest.raises(ValueError, match=r"warmup_steps=2.5 must be an int"):
        adamw_schedulefree(warmup_steps=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"weight_lr_power='2' must be a number"):
        adamw_schedulefree(weight_lr_power="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"betas\[0\]"):
        adamw_schedulefree(betas=(1.5, 0.999))


@pytest.mark.parametrize("clip,warmup,tie", [(None, 0, True), (None, 4, False), (0.3, 4, True),
                                             (None, 20, False)])
def test_the_closed_form_tangent_equals_the_jvp_rule(clip: float | None, warmup: int,
                                                    tie: bool) -> None:
    """The closed form (the default) and jvp of the update agree to rounding, at a point
    where windows tie (the max's half-and-half) and where they do not, with the warmup over
    part of the run or all of it; and the closed form is the one that runs."""
    problem = _tuned(clip, warmup)
    lam = problem.init_raw()
    if not tie:
        lam[problem.hyperparams.slices["lr"]] += torch.tensor([0.0, 0.3, -0.2],
                                                               dtype=lam.dtype)
    closed = hg.tangent.ClosedForm()(_first_step(problem, lam))
    assert closed is not None  # the optimizer has a closed form
    fwd = hg.ForwardMode().hypergradient(problem, lam).grad
    by_jvp = hg.ForwardMode(tangent=hg.tangent.JVP()).hypergradient(problem, lam).grad
    assert rel_err(fwd, by_jvp) < 1e-12
    assert rel_err(fwd, hg.ReverseMode().hypergradient(problem, lam).grad) < 1e-12


def _first_step(problem: hg.InnerProblem, lam: torch.Tensor) -> Any:
    """An UpdateStep of step 0 with random tangents (what a tangent rule gets)."""
    from hypergrad.tangent import UpdateStep

    K = problem.num_hyperparams
    state = problem.initial_state(lam)
    g = torch.Generator().manual_seed(0)
    rand = lambda t: torch.randn((K, *t.shape), generator=g, dtype=t.dtype)  # noqa: E731
    z = hg.InnerState({k: rand(v) for k, v in state.params.items()}, {},
                      type(state.opt)(*[{k: rand(v) for k, v in d.items()} for d in state.opt]))
    grads = {k: torch.randn(v.shape, generator=g, dtype=v.dtype)
             for k, v in state.params.items()}
    G = {k: rand(v) for k, v in state.params.items()}
    return UpdateStep(problem, 0, lam, grads, state, G, z, list(range(K)), list(range(K)),
                      torch.eye(K, dtype=lam.dtype))
