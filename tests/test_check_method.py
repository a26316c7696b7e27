"""hypergradcheck(method=...): a method of one's own checked against reverse mode and finite
differences (it always checked the library's forward mode, so a custom method 1 % off, or
with one column's sign flipped, had no check but a hand-written comparison)."""

from __future__ import annotations

from typing import Any

import pytest
from torch import Tensor

import hypergrad as hg
from hypergrad.testing import HypergradcheckError, digits_case, hypergradcheck

SMALL = dict(steps=4, n_train=16, batch_size=8, hidden=6, n_val=16)


class _Bent(hg.Method):
    """Forward mode's hypergradient, scaled and with one column's sign flipped as asked."""

    def __init__(self, scale: float = 1.0, flip: int | None = None) -> None:
        self.scale, self.flip = scale, flip

    def hypergradient(self, problem: hg.InnerProblem, lam: Tensor) -> hg.HyperGradient:
        h = hg.ForwardMode().hypergradient(problem, lam)
        grad = h.grad * self.scale
        if self.flip is not None:
            grad[self.flip] = -grad[self.flip]
        return hg.HyperGradient(h.objective, grad, h.state)

    def __repr__(self) -> str:
        return f"_Bent(scale={self.scale}, flip={self.flip})"


@pytest.fixture(scope="module")
def problem() -> hg.InnerProblem:
    return digits_case("momentum", "per_tensor_wd", **SMALL)


def test_a_correct_method_passes_and_is_named(problem: hg.InnerProblem) -> None:
    report = hypergradcheck(problem, method=_Bent())
    assert report.ok and report.method == "_Bent(scale=1.0, flip=None)"
    assert "strategies" not in report.tolerances  # forward mode's own HVPs are not compared
    text = str(report)
    assert text.startswith("checked: _Bent(scale=1.0, flip=None)")
    assert "strategies" not in text.splitlines()[1]


@pytest.mark.parametrize("bent", [_Bent(scale=1.01), _Bent(flip=2)])
def test_a_wrong_method_fails(problem: hg.InnerProblem, bent: _Bent) -> None:
    with pytest.raises(HypergradcheckError, match=r"(?s)checked: _Bent.*FAILED \[fwd_vs_rev"):
        hypergradcheck(problem, method=bent)
    report = hypergradcheck(problem, method=bent, raise_exception=False)
    assert report.max("fwd_vs_rev") > 1e-3 and report.max("fwd_vs_fd") > 1e-3


def test_an_approximation_is_checked_to_the_tolerance_given(problem: hg.InnerProblem) -> None:
    """A method 1e-5 off (a one-sided difference's order of error) fails the exact
    tolerances and passes looser ones, as a user of an approximate method sets them."""
    rough = _Bent(scale=1 + 1e-5)
    assert not hypergradcheck(problem, method=rough, raise_exception=False).ok
    assert hypergradcheck(problem, method=rough, rtol_rev=1e-3, rtol_fd=1e-3).ok


def test_method_given_as_a_class_or_with_strategies_is_refused(
        problem: hg.InnerProblem) -> None:
    with pytest.raises(TypeError, match=r"method=<class .*_Bent'> is not a hypergrad.Method; "
                                        r"give an instance"):
        hypergradcheck(problem, method=_Bent)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"with method=\.\.\., leave strategies unset"):
        hypergradcheck(problem, method=_Bent(), strategies=[hg.hvp.VmapVJP()])


def test_a_check_on_chaotic_training_says_so() -> None:
    """SGD in its chaotic range (the double well w**4/4 - w**2/2 at lr 1.5, 100 steps):
    forward and reverse mode agree, rounding and finite differences do not, and a failed
    check read as a bug in a custom tangent (the chaos probe, 2026-12-08: the HVP strategies
    4 % apart on a digits MLP at lr 2, T = 600)."""
    import torch

    class Well(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([0.3], dtype=torch.float64))

    def train_loss(m: Any, batch: Any, hp: Any) -> Tensor:
        w = m.params["w"].sum()
        return w ** 4 / 4 - w ** 2 / 2

    def check(lr: float) -> Any:
        p = hg.InnerProblem(Well(), train_loss, hg.optim.sgd(lr="lr"),
                            hg.HyperParams([hg.Scalar("lr", init=lr, transform="log")]),
                            [None], steps=100,
                            val_loss=lambda m, hp: (m.params["w"].sum() - 1.0) ** 2 + 1.0)
        return hypergradcheck(p, raise_exception=False)

    chaotic = check(1.5)  # |dE/dlam| 2.7e23 against 1.08
    assert chaotic.note.startswith("note: the hypergradient's norm ")
    assert "training is chaotic here" in chaotic.note and chaotic.note in str(chaotic)
    assert check(0.3).note == ""
