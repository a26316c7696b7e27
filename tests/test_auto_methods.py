"""method=auto and the memory estimates know the methods of issue 14: checkpointed reverse mode
is chosen where full reverse does not fit and forward does not or costs more; truncated reverse,
implicit differentiation and HD are offered as options, never chosen; make_method builds every
method by name (for configs)."""

from __future__ import annotations

import pytest
from problems import SMALL

import hypergrad as hg
from hypergrad.choice import AutoMode, check_memory, choose_method, estimate_memory, make_method
from hypergrad.errors import MemoryBudgetError
from hypergrad.testing import digits_case


def _problem(kind: str = "per_example", steps: int = 100, n_train: int = 64) -> hg.InnerProblem:
    return digits_case("momentum", kind, **{**SMALL, "steps": steps, "n_train": n_train})


def test_estimates_of_every_method() -> None:
    p = _problem("lr", steps=100)
    est = {name: estimate_memory(p, name) for name in
           ("forward", "reverse", "checkpointed", "hd", "marthe", "implicit")}
    s = est["reverse"].state
    assert est["reverse"].states == 101 and est["checkpointed"].states == 10 + 10 + 1
    assert est["checkpointed"].total < est["reverse"].total / 4
    assert est["marthe"].total == est["forward"].total
    assert est["hd"].total - est["hd"].intermediates - est["hd"].activations == 2 * s
    assert est["implicit"].total < est["checkpointed"].total
    trunc = estimate_memory(p, hg.ReverseMode(truncate=10))
    assert trunc.states == 11 and trunc.method == "reverse(truncate=10)"
    assert str(est["checkpointed"]).startswith("checkpointed reverse ")
    assert "21 stored states" in str(est["checkpointed"])
    with pytest.raises(ValueError, match=r"method='bogus'; choose one of"):
        estimate_memory(p, "bogus")
    with pytest.raises(NotImplementedError, match="no estimate for FiniteDifference"):
        estimate_memory(p, hg.FiniteDifference())


def test_checkpointed_where_reverse_does_not_fit() -> None:
    p = _problem()  # K = 64, T = 100: forward is the largest
    fwd, rev, ck = (estimate_memory(p, n).total for n in ("forward", "reverse", "checkpointed"))
    assert ck < rev < fwd
    name, why = choose_method(p, memory_budget=(ck + rev) / 2)
    assert name == "checkpointed"
    assert "forward mode would not fit; reverse mode would not fit" in why and "K=64" in why
    method, why = AutoMode().resolve(p, memory_budget=(ck + rev) / 2)
    assert isinstance(method, hg.ReverseMode) and method.checkpoint == "sqrt"
    assert why.startswith("chose checkpointed: ")
    assert choose_method(p, memory_budget=rev * 1.01)[0] == "reverse"  # fits: cheaper


def test_forward_wins_ties_and_cheap_k() -> None:
    """K = 2: forward costs 5 gradients per step, as checkpointed reverse: forward is kept."""
    p = _problem("per_tensor_wd", steps=400)  # K = 4 parameter tensors
    k2 = hg.InnerProblem(p.fmodel.module, p.train_loss, hg.sgd(lr="lr", momentum="m"),
                         hg.HyperParams([hg.Scalar("m", 0.5), hg.Scalar("lr", 0.1)]),
                         p.batch, 400, p.val_loss)
    fwd, rev = estimate_memory(k2, "forward").total, estimate_memory(k2, "reverse").total
    assert fwd < rev
    assert choose_method(k2, memory_budget=(fwd + rev) / 2)[0] == "forward"
    f4, r4 = estimate_memory(p, "forward").total, estimate_memory(p, "reverse").total
    budget = max(f4, estimate_memory(p, "checkpointed").total) * 1.01
    assert budget < r4 and choose_method(p, memory_budget=budget)[0] == "checkpointed"


def test_nothing_fits_names_the_approximate_options() -> None:
    p = _problem()
    with pytest.raises(MemoryBudgetError, match=r"neither method fits .*checkpointed reverse .*"
                                                r"Options: .*truncated reverse mode, "
                                                r"ReverseMode\(truncate=k\).*ImplicitDiff\(\)"):
        choose_method(p, memory_budget=1.0)
    with pytest.raises(MemoryBudgetError, match=r"online tuning needs forward mode.*HD\(\)"):
        choose_method(p, mode="online", memory_budget=1.0)


def test_check_memory_covers_the_new_methods() -> None:
    p = _problem("lr", steps=100)
    ck = estimate_memory(p, "checkpointed").total
    with pytest.raises(MemoryBudgetError, match=r"method=checkpointed reverse needs about"):
        check_memory(p, hg.ReverseMode(checkpoint="sqrt"), memory_budget=ck / 2)
    check_memory(p, hg.ReverseMode(checkpoint="sqrt"), memory_budget=ck * 1.01)
    with pytest.raises(MemoryBudgetError, match=r"method=hd needs about"):
        check_memory(p, hg.HD(), memory_budget=1.0)


def test_make_method_builds_every_method() -> None:
    r = make_method("reverse", truncate=20, checkpoint="5", step_vjp="mixed")
    assert isinstance(r, hg.ReverseMode) and (r.truncate, r.checkpoint) == (20, 5)
    assert isinstance(r.step_vjp, hg.MixedMode)
    assert make_method("reverse", checkpoint="sqrt").checkpoint == "sqrt"  # type: ignore[attr-defined]
    assert isinstance(make_method("hd"), hg.HD)
    m = make_method("marthe", mu=0.5, chunk_size=2)
    assert isinstance(m, hg.MARTHE) and m.mu == 0.5 and m.hvp.chunk_size == 2
    i = make_method("implicit", solver="fixed_point", maxiter=7, tol=1e-6, loss_steps=[3, 4],
                    grad_tol=1e-2)
    assert isinstance(i, hg.ImplicitDiff) and isinstance(i.solver, hg.FixedPoint)
    assert (i.solver.maxiter, i.solver.tol, i.loss_steps, i.grad_tol) == (7, 1e-6, [3, 4], 1e-2)
    a = make_method("auto", step_vjp="mixed")
    assert isinstance(a, AutoMode) and isinstance(a.checkpointed.step_vjp, hg.MixedMode)
    with pytest.raises(ValueError, match=r"name='rtho'; choose one of \['forward', 'reverse', "
                                         r"'auto', 'hd', 'marthe', 'implicit'\]"):
        make_method("rtho")
    with pytest.raises(ValueError, match=r"solver='lu'; choose one of"):
        make_method("implicit", solver="lu")
    with pytest.raises(ValueError, match=r"step_vjp='fast'; choose one of"):
        make_method("reverse", step_vjp="fast")


def test_auto_mode_takes_the_hvp_strategy_of_its_forward_mode() -> None:
    auto = AutoMode(hvp=hg.ColumnLoop())
    assert isinstance(auto.forward, hg.ForwardMode) and isinstance(auto.forward.hvp, hg.ColumnLoop)
    assert isinstance(AutoMode().forward.hvp, hg.VmapVJP)
    with pytest.raises(ValueError, match="pass one"):
        AutoMode(forward=hg.ForwardMode(), hvp=hg.ColumnLoop())
