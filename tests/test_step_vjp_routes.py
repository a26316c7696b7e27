"""DoubleBackward's two routes to a step's vector-Jacobian product: on autograd directly (a loss
that draws no random numbers, or one that draws the same numbers on both routes: dropout, a
user's own noise) and by ``torch.func.vjp`` of the whole step (a loss that draws otherwise).
Both give the same adjoint of the previous state and the same ``a^T d s_{t+1} / d lam``, for
every state layout the library has: BatchNorm's statistics and its integer count, Adam's and
schedule-free AdamW's state, per-example weights, a schedule with tuned scales, attention and
recurrent layers (their second-order kernels)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fixtures import layered_model, layered_problem, model_problem
from torch.utils._pytree import tree_flatten, tree_map

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.stepvjp import DoubleBackward
from hypergrad.testing import digits_case

SMALL = dict(steps=6, n_train=24, batch_size=8, hidden=8, n_val=32, windows=3)

CASES: dict[str, Any] = {
    "adam_bn": lambda: digits_case("adam", "per_tensor_wd", batchnorm=True, **SMALL),
    "rmsprop_centered_schedule": lambda: digits_case("rmsprop_centered", "schedule", **SMALL),
    "momentum_per_example": lambda: digits_case("momentum", "per_example", **SMALL),
    "adamw_tuned_scales": lambda: digits_case("adamw", "tuned_scales", **SMALL),
    "schedulefree_clipped": lambda: layered_problem(
        hg.optim.adamw_schedulefree(lr="lr", warmup_steps=2, clip_grad_norm=0.5),
        [hg.Scalar("lr", 0.02, "log")], steps=6),
    "transformer": lambda: model_problem("transformer"),
    "lstm": lambda: model_problem("lstm"),
}


def _state_and_adjoint(problem: hg.InnerProblem, t: int) -> tuple[Any, Any, torch.Tensor]:
    """The state before step ``t`` and a random adjoint of the state after it."""
    lam = problem.init_raw()
    problem.check(lam)
    s = problem.initial_state(lam)
    for i in range(t):
        s = problem.step(s, lam, i)
    g = torch.Generator().manual_seed(t)
    adj = tree_map(lambda v: torch.randn(v.shape, generator=g, dtype=v.dtype)
                   if v.is_floating_point() else torch.zeros_like(v), problem.step(s, lam, t))
    return s, adj, lam


def _both(problem: hg.InnerProblem, t: int, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[tuple[Any, torch.Tensor], tuple[Any, torch.Tensor], list[int]]:
    state, adj, lam = _state_and_adjoint(problem, t)
    calls: list[int] = []
    direct = DoubleBackward._direct

    def spy(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return direct(*a, **k)

    monkeypatch.setattr(DoubleBackward, "_direct", staticmethod(spy))
    assert problem.draws is False
    got = DoubleBackward()(problem, state, lam, t, adj)
    ref = DoubleBackward(direct=False)(problem, state, lam, t, adj)  # torch.func.vjp
    return got, ref, calls


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_direct_route_equals_torch_func_s(name: str, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    (adj, dlam), (ref_adj, ref_dlam), calls = _both(CASES[name](), 2, monkeypatch)
    assert calls == [1]  # the direct route ran once, the reference did not
    torch.testing.assert_close(dlam, ref_dlam, rtol=1e-12, atol=1e-15)
    assert ref_dlam.abs().sum() > 0
    leaves, spec = tree_flatten(adj)
    ref_leaves, ref_spec = tree_flatten(ref_adj)
    assert spec == ref_spec
    for a, b in zip(leaves, ref_leaves):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_reverse_mode_takes_it_and_still_equals_forward_mode() -> None:
    p = digits_case("adam", "per_tensor_wd", batchnorm=True, **SMALL)
    lam = p.init_raw()
    rev = hg.ReverseMode().hypergradient(p, lam).grad
    fwd = hg.ForwardMode().hypergradient(p, lam).grad
    assert hg.testing.rel_err(rev, fwd) < 1e-12


def test_a_drawing_loss_takes_the_direct_route_where_it_draws_as_torch_func(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout and a user's own noise, whose plain steps draw as ``torch.func`` does: the
    first step VJP is taken both ways, and where the two agree bit for bit every later one
    takes the direct route; reverse mode equals its ``torch.func`` route bit for bit and
    forward mode to rounding."""
    calls: list[int] = []
    func = DoubleBackward._func

    def spy(*a: Any) -> Any:
        calls.append(1)
        return func(*a)

    monkeypatch.setattr(DoubleBackward, "_func", staticmethod(spy))
    for p in (model_problem("dropout_mlp"), model_problem("lstm", noise=True)):
        lam = p.init_raw()
        calls.clear()
        first = hg.ReverseMode().hypergradient(p, lam).grad
        assert p.draws is True and p.eager_draws is True and p.direct_draws is True
        assert calls == [1]  # the first step VJP only, to compare
        calls.clear()
        again = hg.ReverseMode().hypergradient(p, lam).grad
        assert calls == []
        ref = hg.ReverseMode(step_vjp=DoubleBackward(direct=False)).hypergradient(p, lam).grad
        assert torch.equal(first, ref) and torch.equal(again, ref)
        assert hg.testing.rel_err(again, hg.ForwardMode().hypergradient(p, lam).grad) < 1e-10


def test_a_step_vjp_that_draws_otherwise_or_an_own_step_goes_through_torch_func(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the direct route's first step VJP differs from ``torch.func``'s in any bit, every
    step VJP goes through ``torch.func``; so do a loss whose plain steps draw otherwise
    (``nn.TransformerEncoderLayer`` drops out a transposed tensor) and a problem class with its
    own ``step``. Reverse mode still equals forward mode."""
    p = model_problem("dropout_mlp")
    lam = p.init_raw()
    ref = hg.ReverseMode(step_vjp=DoubleBackward(direct=False)).hypergradient(p, lam).grad
    direct = DoubleBackward._direct

    def off(*a: Any, **k: Any) -> Any:  # a direct route one rounding step away
        got = direct(*a, **k)
        return None if got is None else (got[0], torch.nextafter(got[1], got[1] + 1))

    monkeypatch.setattr(DoubleBackward, "_direct", staticmethod(off))
    got = hg.ReverseMode().hypergradient(p, lam).grad
    assert p.direct_draws is False and torch.equal(got, ref)

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("the direct route ran")

    monkeypatch.setattr(DoubleBackward, "_direct", staticmethod(refuse))
    t = model_problem("transformer_dropout")
    lam = t.init_raw()
    rev = hg.ReverseMode().hypergradient(t, lam).grad
    assert t.draws is True and t.eager_draws is False and t.direct_draws is None
    assert hg.testing.rel_err(rev, hg.ForwardMode().hypergradient(t, lam).grad) < 1e-10

    class Own(hg.InnerProblem):
        def step(self, state: Any, lam: torch.Tensor, t: int) -> Any:
            return super().step(state, lam, t)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (24,), generator=g)
    own = Own(layered_model(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
              hg.optim.sgd(lr="lr", momentum=0.9), hg.HyperParams([hg.Scalar("lr", 0.05, "log")]),
              MiniBatches(x, y, batch_size=8, seed=0), 6, lambda m, hp: F.cross_entropy(m(x), y))
    lam = own.init_raw()
    torch.testing.assert_close(hg.ReverseMode().hypergradient(own, lam).grad,
                               hg.ForwardMode().hypergradient(own, lam).grad,
                               rtol=1e-10, atol=1e-14)


def test_the_option_is_checked_and_shown() -> None:
    assert repr(hg.ReverseMode(step_vjp=DoubleBackward(direct=False))) == (
        "ReverseMode(step_vjp=DoubleBackward(direct=False))")
    assert repr(hg.ReverseMode(step_vjp=DoubleBackward())) == "ReverseMode()"
    with pytest.raises(TypeError, match=r"DoubleBackward: direct='no' must be True"):
        DoubleBackward(direct="no")  # type: ignore[arg-type]
