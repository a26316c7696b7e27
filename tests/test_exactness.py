"""Every differentiation path in float64: forward = reverse = central finite differences, and
every HVP strategy agrees, for every optimizer and every hyperparameter kind."""

from __future__ import annotations

import pytest
import torch

import hypergrad as hg
from hypergrad.tasks import ridge_closed_form_hypergradient, ridge_problem
from hypergrad.testing import digits_case, grid_cases, hypergradcheck, rel_err

SMALL = dict(steps=6, n_train=24, batch_size=8, hidden=8, n_val=32, windows=3)
CASES = grid_cases()


@pytest.mark.parametrize("opt,kind", CASES, ids=[f"{o}-{k}" for o, k in CASES])
def test_forward_reverse_fd_strategies_agree(opt: str, kind: str) -> None:
    rep = hypergradcheck(digits_case(opt, kind, **SMALL))  # raises on failure
    assert rep.max("fwd_vs_rev") <= 1e-8
    assert rep.max("fwd_vs_fd") <= 1e-5
    assert rep.max("strategies") <= 1e-10
    assert rep.grad is not None and rep.grad.abs().sum() > 0  # a real, non-trivial hypergradient


def test_plain_sgd_has_no_momentum_case() -> None:
    with pytest.raises(NotImplementedError, match="no momentum"):
        digits_case("sgd", "momentum")


@pytest.mark.parametrize("val_mode", ["eval", "train"])
@pytest.mark.parametrize("opt", ["momentum", "adam"])
def test_batchnorm_running_statistics(opt: str, val_mode: str) -> None:
    problem = digits_case(opt, "per_tensor_wd", batchnorm=True, val_mode=val_mode, **SMALL)
    hypergradcheck(problem)


def test_batchnorm_statistics_tangents_matter() -> None:
    """Dropping the running statistics' tangents (carrying them as constants) is measurably
    wrong when validating in eval mode: the check above would catch that bug."""
    problem = digits_case("momentum", "lr", batchnorm=True, val_mode="eval", **SMALL)
    lam = problem.init_raw()
    fd = hg.FiniteDifference().hypergradient(problem, lam).grad

    class NoBufferTangents(hg.hvp.VmapVJP):
        def __call__(self, f, params, buffers, lam, zp, zb, eye):  # type: ignore[no-untyped-def]
            g, new_b, G, zb_new = super().__call__(f, params, buffers, lam, zp, zb, eye)
            assert zb_new  # the running statistics had tangents to drop
            return g, new_b, G, {k: torch.zeros_like(v) for k, v in zb_new.items()}

    wrong = hg.ForwardMode(NoBufferTangents()).hypergradient(problem, lam).grad
    assert rel_err(wrong, fd) > 1e-3


def test_batchnorm_counters_and_final_buffers(f64: torch.dtype) -> None:
    problem = digits_case("momentum", "lr", batchnorm=True, **SMALL)
    lam = problem.init_raw()
    fs = hg.ForwardMode().run(problem, hg.ForwardMode().init(problem, lam), lam)
    s = problem.run(lam)
    for k in s.buffers:
        torch.testing.assert_close(fs.state.buffers[k], s.buffers[k], rtol=1e-13, atol=1e-15)
    # the module's own BatchNorm, trained by torch.optim, reaches the same running statistics
    model = problem.fmodel.module
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    model.train()
    for t in range(problem.steps):
        x, y, idx = problem.batch(t)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for k, v in s.buffers.items():
        torch.testing.assert_close(model.get_buffer(k), v, rtol=1e-12, atol=1e-14)
    for k, v in s.params.items():
        torch.testing.assert_close(model.get_parameter(k).detach(), v, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("steps", [2, 7, 40])
def test_ridge_closed_form(steps: int, f64: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=g, dtype=f64)
    w = torch.randn(6, generator=g, dtype=f64)
    y = x @ w + 0.3 * torch.randn(40, generator=g, dtype=f64)
    xv = torch.randn(30, 6, generator=g, dtype=f64)
    yv = xv @ w + 0.3 * torch.randn(30, generator=g, dtype=f64)
    problem = ridge_problem(x, y, xv, yv, l2=0.3, lr=0.2, steps=steps)
    exact = ridge_closed_form_hypergradient(x, y, xv, yv, l2=0.3, lr=0.2, steps=steps)
    lam = problem.init_raw()
    for method in (hg.ForwardMode(), hg.ReverseMode()):
        got = method.hypergradient(problem, lam).grad
        assert rel_err(got, exact) <= 1e-10, (method, got, exact)
    # and the closed form itself is right: central differences of the closed-form w_T
    assert rel_err(hg.FiniteDifference().hypergradient(problem, lam).grad, exact) <= 1e-7
