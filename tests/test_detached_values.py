"""A loss that reads a value computed from the weights and cut from the autograd graph (a
stop-gradient target, a norm taken under ``torch.no_grad()``): every method differentiates it
as if that value were a constant, so they agree with each other and not with finite
differences. The problem warns (DetachedValueWarning) instead of answering silently; cuts
through integers (argmax pseudo-labels) and cut values the loss does not read do not warn."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fixtures import Cube
from torch import nn

import hypergrad as hg
from hypergrad.errors import DetachedValueWarning

Loss = Callable[..., torch.Tensor]


def _problem(train: Loss | None = None, val: Loss | None = None,
             dtype: torch.dtype = torch.float64) -> hg.InnerProblem:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)
    x, y = torch.randn(16, 4, dtype=dtype), torch.randint(0, 3, (16,))
    xv, yv = torch.randn(16, 4, dtype=dtype), torch.randint(0, 3, (16,))

    def plain(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    def plain_val(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(xv), yv)

    hps = hg.HyperParams([hg.Scalar("lr", 0.3, transform="log"), hg.Scalar("momentum", 0.5)])
    return hg.InnerProblem(m, train or plain, hg.optim.sgd(lr="lr", momentum="momentum"), hps,
                           [(x, y)], 20, (lambda m, hp: val(m, xv, yv)) if val else plain_val)


def _target(m: Any, b: Any, hp: Any) -> torch.Tensor:
    """Cross-entropy plus a stop-gradient target (as in self-distillation)."""
    out = m(b[0])
    return F.cross_entropy(out, b[1]) + 0.5 * ((out - out.detach().roll(1, 0)) ** 2).mean()


def _checked(p: hg.InnerProblem) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        p.check(p.init_raw())
    return [w for w in got if issubclass(w.category, DetachedValueWarning)]


def test_a_stop_gradient_target_warns_and_is_what_finite_differences_see() -> None:
    p = _problem(_target)
    got = _checked(p)
    assert len(got) == 1 and "train_loss's value reads .detach()" in str(got[0].message)
    lam = p.init_raw()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DetachedValueWarning)
        fwd = hg.ForwardMode().hypergradient(p, lam).grad
        rev = hg.ReverseMode().hypergradient(p, lam).grad
        fd = hg.FiniteDifference().hypergradient(p, lam).grad
    assert torch.allclose(fwd, rev, rtol=1e-10)  # the methods agree with each other ...
    assert float((fwd - fd).norm() / fd.norm()) > 0.05  # ... not with the training they tune


def test_a_norm_under_no_grad_in_the_validation_loss_warns() -> None:
    def val(m: Any, xv: torch.Tensor, yv: torch.Tensor) -> torch.Tensor:
        out = m(xv)
        with torch.no_grad():
            scale = out.norm()
        return F.cross_entropy(out / scale, yv)

    got = _checked(_problem(val=val))
    assert len(got) == 1 and "val_loss's value reads" in str(got[0].message)
    assert "under torch.no_grad()" in str(got[0].message)


def _pseudo_labels(m: Any, b: Any, hp: Any) -> torch.Tensor:
    out = m(b[0])
    return F.cross_entropy(out, out.detach().argmax(1))  # integer targets: a zero derivative


def _logged(m: Any, b: Any, hp: Any) -> torch.Tensor:
    out = m(b[0])
    _ = out.detach().abs().mean()  # read for a log, not by the loss
    return F.cross_entropy(out, b[1])


def _detached_data(m: Any, b: Any, hp: Any) -> torch.Tensor:
    return F.cross_entropy(m(b[0].detach() * 1.0), b[1])  # the data, not the weights


def _custom_function(m: Any, b: Any, hp: Any) -> torch.Tensor:  # fixtures.Cube: setup_context
    return F.cross_entropy(Cube.apply(m(b[0])), b[1])


@pytest.mark.parametrize("loss", [_pseudo_labels, _logged, _detached_data, _custom_function])
def test_cuts_the_loss_does_not_read_through_the_weights_do_not_warn(loss: Loss) -> None:
    assert _checked(_problem(loss)) == []


def test_in_float32_the_cut_warns_and_a_custom_function_does_not() -> None:
    assert len(_checked(_problem(_target, dtype=torch.float32))) == 1
    assert _checked(_problem(_custom_function, dtype=torch.float32)) == []


class _GradScale(torch.autograd.Function):
    """The identity forward, a backward scaled by ``s`` (as a gradient-reversal layer)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, s: float) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.s = inputs[1]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        return g * ctx.s, None


class _Tanh(torch.autograd.Function):
    """tanh with its true derivative."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return g * (1 - y ** 2)


def test_a_custom_function_whose_backward_is_not_its_derivative_warns() -> None:
    """A gradient-scaling layer (identity forward, backward x 0.3): forward and reverse mode
    agreed with each other and gave the learning rate's hypergradient of the wrong sign against
    finite differences of the training that runs, with no word (its forward is a view, which
    keeps requires_grad under no_grad, so no cut was seen). A custom Function with its true
    derivative does not warn."""
    def scaled(m: Any, x: torch.Tensor) -> torch.Tensor:
        h = _GradScale.apply(m.params["0.weight"] @ x.T, 0.3).T + m.params["0.bias"]
        return torch.tanh(h) @ m.params["2.weight"].T + m.params["2.bias"]

    p = _problem(lambda m, b, hp: F.cross_entropy(scaled(m, b[0]), b[1]))
    said = [str(w.message) for w in _checked(p) if w.category is DetachedValueWarning]
    assert len(said) == 1 and ("train_loss reads the output of the custom autograd.Function "
                               "_GradScale" in said[0]), said

    def true(m: Any, x: torch.Tensor) -> torch.Tensor:
        h = _Tanh.apply(x @ m.params["0.weight"].T + m.params["0.bias"])
        return h @ m.params["2.weight"].T + m.params["2.bias"]

    p = _problem(lambda m, b, hp: F.cross_entropy(true(m, b[0]), b[1]),
                 lambda m, xv, yv: F.cross_entropy(true(m, xv), yv))
    assert not [w for w in _checked(p) if w.category is DetachedValueWarning]


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_a_float32_product_in_many_dimensions_is_judged_past_rounding(scale: float) -> None:
    """A correct sparse product (hypergrad.sparse) in float32, 20,000 weights: along a random
    unit direction its directional derivative is of rounding's size, and its backward was
    reported 18.7 % off a central difference (the sparse probe, 2026-12-08: "hypergradients
    are not those of the training that runs"). Along the gradient's own direction it agrees;
    a backward scaled x 2 is still told."""
    from hypergrad.sparse import SparseOperator

    g = torch.Generator().manual_seed(0)
    m = n = 20000
    rows, cols = (torch.randint(0, k, (200000,), generator=g) for k in (m, n))
    op = SparseOperator.from_coo(rows, cols, torch.randn(200000, generator=g), (m, n),
                                 dtype=torch.float32)
    y = torch.randn(m, generator=g)

    class Lin(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(n))

        def forward(self, a: SparseOperator) -> torch.Tensor:
            return _GradScale.apply(a @ self.w, scale)

    def loss(mf: Any, b: Any, hp: Any) -> torch.Tensor:
        return ((mf(op) - y) ** 2).mean()

    p = hg.InnerProblem(Lin(), loss, hg.optim.sgd(lr="lr"),
                        hg.HyperParams([hg.Scalar("lr", 0.01, "log")]), [None], 2,
                        lambda mf, hp: ((mf(op) - y) ** 2).mean())
    said = [str(w.message) for w in _checked(p) if w.category is DetachedValueWarning]
    if scale == 1.0:
        assert said == []
    else:
        assert len(said) == 2 and "_GradScale" in said[0], said


class _TanhFirstOrder(_Tanh):
    """tanh whose backward is its true derivative computed on a detached saved output: right
    gradients, and no second derivative through it."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return g * (1 - y.detach() ** 2)


def test_a_custom_function_whose_backward_is_not_differentiable_warns() -> None:
    """A custom tanh whose backward detaches its saved output: its gradient is exact, so the
    first-order check passed, but every method differentiates the training steps' updates,
    which needs the training loss's Hessian: forward and reverse mode agreed with each other
    (1e-16) and were both ~1e-3 off finite differences, with no word. The same Function with a
    differentiable backward (_Tanh) does not warn (above)."""
    def net(m: Any, x: torch.Tensor) -> torch.Tensor:
        h = _TanhFirstOrder.apply(x @ m.params["0.weight"].T + m.params["0.bias"])
        return h @ m.params["2.weight"].T + m.params["2.bias"]

    p = _problem(lambda m, b, hp: F.cross_entropy(net(m, b[0]), b[1]),
                 lambda m, xv, yv: F.cross_entropy(net(m, xv), yv))
    said = [str(w.message) for w in _checked(p)]
    assert len(said) == 1 and ("custom autograd.Function _TanhFirstOrder, whose backward gives "
                               "the right gradient but is not itself differentiable" in said[0])
    # what it warns about: the methods agree, finite differences do not
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DetachedValueWarning)
        r = hg.testing.hypergradcheck(p, strategies=[], raise_exception=False)
    assert max(r.fwd_vs_rev.values()) < 1e-10 and max(r.fwd_vs_fd.values()) > 1e-4, r


# -- a hyperparameter read both as a tensor and through a cut ------------------------------------
def _with_wd(train: Loss, val: Loss | None = None) -> hg.InnerProblem:
    """``_problem``'s model and data, and an L2 coefficient ``wd`` the losses read."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x, y = torch.randn(16, 4, dtype=torch.float64), torch.randint(0, 3, (16,))
    xv, yv = torch.randn(16, 4, dtype=torch.float64), torch.randint(0, 3, (16,))
    hps = hg.HyperParams([hg.Scalar("lr", 0.3, transform="log"),
                          hg.Scalar("wd", 0.05, transform="log")])
    return hg.InnerProblem(m, train, hg.optim.sgd(lr="lr"), hps, [(x, y)], 20,
                           (lambda m, hp: val(m, hp, xv, yv)) if val
                           else (lambda m, hp: F.cross_entropy(m(xv), yv)))


def _l2(m: Any) -> torch.Tensor:
    return sum((w ** 2).sum() for w in m.parameters())  # type: ignore[return-value]


def _half_item(m: Any, b: Any, hp: Any) -> torch.Tensor:
    wd = hp["wd"]
    return F.cross_entropy(m(b[0]), b[1]) + 0.5 * wd * _l2(m) + 0.5 * wd.item() * _l2(m)


def test_a_hyperparameter_partly_read_through_item_warns_and_is_what_fd_sees() -> None:
    p = _with_wd(_half_item)
    got = _checked(p)
    assert len(got) == 1, [str(w.message) for w in got]
    assert ("train_loss reads hyperparameter 'wd' through .item(), which cuts it from the "
            "autograd graph, and that value feeds the loss") in str(got[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DetachedValueWarning)
        r = hg.testing.hypergradcheck(p, strategies=[], raise_exception=False)
    assert r.fwd_vs_rev["wd"] < 1e-10 and r.fwd_vs_fd["wd"] > 0.1, r  # what it warns about


def test_a_hyperparameter_partly_detached_in_the_validation_loss_warns() -> None:
    def val(m: Any, hp: Any, xv: torch.Tensor, yv: torch.Tensor) -> torch.Tensor:
        wd = hp["wd"]
        return F.cross_entropy(m(xv), yv) + wd * _l2(m) + wd.detach() ** 2

    def train(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1]) + hp["wd"] * _l2(m)

    got = _checked(_with_wd(train, val))
    assert len(got) == 1 and "val_loss reads hyperparameter 'wd' through .detach()" in str(
        got[0].message)


def test_an_optimizer_argument_read_through_a_cut_that_feeds_the_loss_warns() -> None:
    def train(m: Any, b: Any, hp: Any) -> torch.Tensor:  # lr is bound to SGD, and read here
        return (F.cross_entropy(m(b[0]), b[1]) + hp["wd"] * _l2(m)
                + float(hp["lr"]) * _l2(m))

    got = _checked(_with_wd(train))
    assert len(got) == 1 and "hyperparameter 'lr' through float()" in str(got[0].message)


def _branch(m: Any, b: Any, hp: Any) -> torch.Tensor:
    loss = F.cross_entropy(m(b[0]), b[1])
    if hp["wd"] > 0.01:  # a branch: the cut value steers, it does not feed the loss
        loss = loss + hp["wd"] * _l2(m)
    return loss


def _logged_hp(m: Any, b: Any, hp: Any) -> torch.Tensor:
    _ = (hp["wd"].item(), hp["lr"].item())  # read for a log
    return F.cross_entropy(m(b[0]), b[1]) + hp["wd"] * _l2(m)


@pytest.mark.parametrize("loss", [_branch, _logged_hp])
def test_a_hyperparameter_cut_where_the_loss_does_not_read_it_does_not_warn(loss: Loss) -> None:
    assert _checked(_with_wd(loss)) == []
