"""method=auto and the memory estimates know the methods of issue 14: checkpointed reverse mode
is chosen where full reverse does not fit and forward does not or costs more; truncated reverse,
implicit differentiation and HD are offered as options, never chosen; make_method builds every
method by name (for configs)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fixtures import SMALL

import hypergrad as hg
from hypergrad.errors import MemoryBudgetError
from hypergrad.methods import (
    AutoMode,
    check_memory,
    choose_method,
    create,
    estimate_memory,
    registered,
)
from hypergrad.testing import digits_case


def _problem(kind: str = "per_example", steps: int = 100, n_train: int = 64) -> hg.InnerProblem:
    return digits_case("momentum", kind, **{**SMALL, "steps": steps, "n_train": n_train})


def test_estimates_of_every_method() -> None:
    p = _problem("lr", steps=100)
    est = {name: estimate_memory(p, name) for name in
           ("forward", "reverse", "hd", "marthe", "implicit")}
    est["checkpointed"] = estimate_memory(p, hg.ReverseMode(checkpoint="sqrt"))
    s = est["reverse"].state
    assert est["reverse"].states == 101 and est["checkpointed"].states == 10 + 10 + 1
    assert est["checkpointed"].total < est["reverse"].total / 4
    # MARTHE's discounted tangents mu Z are a copy beside Z (mu = 0.9 by default)
    assert est["marthe"].total == est["forward"].total + p.num_hyperparams * s
    assert estimate_memory(p, hg.MARTHE(mu=1.0)).total == est["forward"].total
    assert est["hd"].total - est["hd"].intermediates - est["hd"].activations == 2 * s
    assert est["implicit"].total < est["checkpointed"].total
    trunc = estimate_memory(p, hg.ReverseMode(truncate=10))
    assert trunc.states == 11 and trunc.method == "reverse(truncate=10)"
    assert str(est["checkpointed"]).startswith("checkpointed reverse ")
    assert "21 stored states" in str(est["checkpointed"])
    with pytest.raises(ValueError, match=r"method='bogus' is not a registered method"):
        estimate_memory(p, "bogus")
    with pytest.raises(ValueError, match=r"method='checkpointed' is a hypergrad-run option.*"
                                         r"hypergrad.ReverseMode\(checkpoint=\"sqrt\"\)"):
        estimate_memory(p, "checkpointed")  # methods.md names the two side by side
    with pytest.raises(NotImplementedError, match="FiniteDifference has no memory estimate"):
        estimate_memory(p, hg.FiniteDifference())


def test_checkpointed_where_reverse_does_not_fit() -> None:
    p = _problem()  # K = 64, T = 100: forward is the largest
    fwd, rev, ck = (estimate_memory(p, n).total
                    for n in ("forward", "reverse", hg.ReverseMode(checkpoint="sqrt")))
    assert ck < rev < fwd
    name, why = choose_method(p, memory_budget=(ck + rev) / 2)
    assert name == "checkpointed"
    # counted cheapest first: reverse (does not fit), then checkpointed (fits); forward, the
    # costliest per step at K = 64, is not counted
    assert why.startswith("reverse mode would not fit; K=64")
    assert "forward" not in why.split("(")[-1]
    method, why = AutoMode().resolve(p, memory_budget=(ck + rev) / 2)
    assert isinstance(method, hg.ReverseMode) and method.checkpoint == "sqrt"
    assert why.startswith("chose checkpointed: ")
    assert choose_method(p, memory_budget=rev * 1.01)[0] == "reverse"  # fits: cheaper


def test_auto_estimates_the_reverse_mode_it_was_given() -> None:
    """AutoMode(reverse=ReverseMode(tape=True)) holds every step's graph: its own estimate (not
    plain reverse mode's) decides whether it fits."""
    p = _problem()
    tape = hg.ReverseMode(tape=True)
    rev, tp = estimate_memory(p, "reverse").total, estimate_memory(p, tape).total
    assert rev < tp
    budget = rev * 1.01  # plain reverse would fit, the tape does not
    method, why = AutoMode(reverse=tape).resolve(p, memory_budget=budget)
    assert method.estimate_memory(p).total <= budget
    assert why.startswith("chose checkpointed: ") and "reverse mode would not fit" in why
    assert AutoMode(reverse=tape).resolve(p, memory_budget=tp * 1.01)[0] is tape
    assert choose_method(p, memory_budget=budget, reverse=tape)[0] == "checkpointed"


def test_forward_wins_ties_and_cheap_k() -> None:
    """K = 2: forward costs 5 gradients per step, as checkpointed reverse: forward is kept."""
    p = _problem("per_tensor_wd", steps=400)  # K = 4 parameter tensors
    k2 = hg.InnerProblem(p.fmodel.module, p.train_loss, hg.optim.sgd(lr="lr", momentum="m"),
                         hg.HyperParams([hg.Scalar("m", 0.5), hg.Scalar("lr", 0.1)]),
                         p.batch, 400, p.val_loss)
    fwd, rev = estimate_memory(k2, "forward").total, estimate_memory(k2, "reverse").total
    assert fwd < rev
    assert choose_method(k2, memory_budget=(fwd + rev) / 2)[0] == "forward"
    f4, r4 = estimate_memory(p, "forward").total, estimate_memory(p, "reverse").total
    budget = max(f4, estimate_memory(p, hg.ReverseMode(checkpoint="sqrt")).total) * 1.01
    assert budget < r4 and choose_method(p, memory_budget=budget)[0] == "checkpointed"


def test_the_choice_counts_cheapest_first_and_equals_the_rule_over_all_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Estimates are counted in the order of their cost per step and the first that fits is
    picked: the same method as the rule over all three counts at every budget, with the costlier
    ones never counted (a count on fake tensors costs about two plain runs of a small model)."""
    p4 = _problem("per_tensor_wd", steps=400)
    k2 = hg.InnerProblem(p4.fmodel.module, p4.train_loss, hg.optim.sgd(lr="lr", momentum="m"),
                         hg.HyperParams([hg.Scalar("m", 0.5), hg.Scalar("lr", 0.1)]),
                         p4.batch, 400, p4.val_loss)  # K = 2: forward ties checkpointed
    for p in (_problem(), p4, k2):  # K = 64, 4, 2
        k = p.num_hyperparams
        ests = {n: estimate_memory(p, m).total for n, m in (
            ("forward", "forward"), ("reverse", "reverse"),
            ("checkpointed", hg.ReverseMode(checkpoint="sqrt")))}
        cost = {"forward": 1 + 2 * k, "reverse": 4, "checkpointed": 5}
        for room in sorted(ests.values()):
            for b in (room * 0.99, room * 1.01):
                fits = [n for n in ests if ests[n] <= b]
                if not fits:
                    with pytest.raises(MemoryBudgetError, match="no exact method fits"):
                        choose_method(p, memory_budget=b)
                    continue
                assert choose_method(p, memory_budget=b)[0] == min(
                    fits, key=lambda n: (cost[n], n != "forward"))

    def refuse(*a: object, **kw: object) -> None:
        raise AssertionError("forward mode's memory was counted")

    p = _problem()
    monkeypatch.setattr(hg.ForwardMode, "estimate_memory", refuse)
    name, why = choose_method(p)  # K = 64: reverse fits, forward costs 129 gradients a step
    assert name == "reverse" and why.endswith(")") and "forward needs" not in why


def test_a_reverse_mode_given_checkpoints_is_costed_and_named_as_such() -> None:
    """method=auto method.reverse.checkpoint=sqrt said "chose reverse ... reverse ~4" where the
    method it ran recomputes the states (~5 gradients a step; the methods probe)."""
    p = _problem()
    name, why = choose_method(p)
    assert name == "reverse" and "reverse ~4" in why
    name, why = choose_method(p, reverse=hg.ReverseMode(checkpoint="sqrt"))
    assert name == "reverse" and "reverse (checkpointed as given) ~5" in why, why
    assert "reverse ~4" not in why


def test_nothing_fits_names_the_approximate_options() -> None:
    p = _problem()
    with pytest.raises(MemoryBudgetError, match=r"no exact method fits .*checkpointed reverse .*"
                                                r"Options: .*truncated reverse mode, "
                                                r"ReverseMode\(truncate=k\).*ImplicitDiff\(\)"):
        choose_method(p, memory_budget=1.0)
    with pytest.raises(MemoryBudgetError, match=r"online tuning needs forward mode.*HD\(\)"):
        choose_method(p, mode="online", memory_budget=1.0)


def test_check_memory_covers_the_new_methods() -> None:
    p = _problem("lr", steps=100)
    ck = estimate_memory(p, hg.ReverseMode(checkpoint="sqrt")).total
    with pytest.raises(MemoryBudgetError, match=r"method=checkpointed reverse needs about"):
        check_memory(p, hg.ReverseMode(checkpoint="sqrt"), memory_budget=ck / 2)
    check_memory(p, hg.ReverseMode(checkpoint="sqrt"), memory_budget=ck * 1.01)
    with pytest.raises(MemoryBudgetError, match=r"method=hd needs about"):
        check_memory(p, hg.HD(), memory_budget=1.0)


def test_every_registered_method_is_built_by_its_name() -> None:
    names = registered()
    assert {"forward", "reverse", "auto", "hd", "marthe", "implicit",
            "finite_difference"} <= set(names)
    for name, cls in names.items():
        m = create(name)
        assert type(m) is cls and m.name == name
    assert isinstance(create("hypergrad.methods.reverse.ReverseMode"), hg.ReverseMode)
    assert isinstance(create("hypergrad.methods.online:HD"), hg.HD)
    with pytest.raises(ValueError, match=r"method='rtho' is not a registered method"):
        create("rtho")
    with pytest.raises(ValueError, match=r"method='no_such_module.Method': cannot import it"):
        create("no_such_module.Method")
    with pytest.raises(TypeError, match=r"method='hypergrad.problem.InnerProblem' is type"):
        create("hypergrad.problem.InnerProblem")


@pytest.mark.usefixtures("isolated_registries")
def test_a_method_name_is_taken_once() -> None:
    with pytest.raises(ValueError, match=r"Method name 'forward' is taken by "
                                         r"hypergrad.methods.forward.ForwardMode"):
        class Other(hg.ForwardMode, name="forward"):
            pass
    with pytest.raises(ValueError, match=r"must be an identifier"):
        class Bad(hg.ForwardMode, name="not a name"):
            pass
    # only the qualified name was compared: a class of the built-in's name replaced it, and
    # two modules' classes of one name each other, with no word
    with pytest.raises(ValueError, match=r"Method name 'forward' is taken by "
                                         r"hypergrad.methods.forward.ForwardMode; choose "
                                         r"another name for my_methods.ForwardMode"):
        type("ForwardMode", (hg.Method,), {"__module__": "my_methods",
                                           "__qualname__": "ForwardMode",
                                           "hypergradient": lambda self, p, lam: None},
             name="forward")
    mine = type("Mine", (hg.Method,), {"__module__": "pkg_a", "__qualname__": "Mine",
                                       "hypergradient": lambda self, p, lam: None}, name="mine")
    with pytest.raises(ValueError, match=r"'mine' is taken by pkg_a.Mine; choose another name "
                                         r"for pkg_b.Mine"):
        type("Mine", (hg.Method,), {"__module__": "pkg_b", "__qualname__": "Mine",
                                    "hypergradient": lambda self, p, lam: None}, name="mine")
    again = type("Mine", (hg.Method,), {"__module__": "pkg_a", "__qualname__": "Mine",
                                        "hypergradient": lambda self, p, lam: None}, name="mine")
    assert hg.methods.registered()["mine"] is again is not mine  # a reloaded module replaces
    assert type(create("forward")) is hg.ForwardMode


@pytest.mark.usefixtures("isolated_registries")
def test_an_optimizer_name_is_taken_once() -> None:
    def sgd(lr: float = 0.1) -> Any:
        return hg.optim.create("adam", lr=lr)

    sgd.__module__ = "my_optimizers"
    with pytest.raises(ValueError, match=r"optim.register: name 'sgd' is taken by "
                                         r"hypergrad.optim.sgd.sgd; choose another name for "
                                         r"my_optimizers.*sgd, e.g. @register\(name='my_sgd'\)"):
        hg.optim.register(sgd)
    assert type(hg.optim.create("sgd", lr=0.1)).__name__ == "SGD"


def test_auto_mode_takes_the_hvp_strategy_of_its_forward_mode() -> None:
    auto = AutoMode(hvp=hg.hvp.ColumnLoop())
    assert isinstance(auto.forward, hg.ForwardMode)
    assert isinstance(auto.forward.hvp, hg.hvp.ColumnLoop)
    assert isinstance(AutoMode().forward.hvp, hg.hvp.VmapVJP)
    with pytest.raises(ValueError, match="pass one"):
        AutoMode(forward=hg.ForwardMode(), hvp=hg.hvp.ColumnLoop())


def test_auto_mode_called_directly_says_what_it_chose() -> None:
    """AutoMode().hypergradient returned info=None: which method ran was said nowhere (only
    the Trainer logs its choice; the memory probe)."""
    p = digits_case("momentum", "per_tensor_wd", steps=4, hidden=8)
    got = hg.AutoMode().hypergradient(p, p.init_raw())
    assert got.info is not None and got.info["auto"].startswith("chose reverse: ")
    ref = hg.ReverseMode().hypergradient(p, p.init_raw())
    assert torch.equal(got.grad, ref.grad)
