"""How forward mode gets the optimizer update's tangent: every rule (closed form, diagonal
Jacobian, jvp) gives the same tangents, and the closed forms equal jvp of the update at random
tangents, argument by argument (float64)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import torch
from fixtures import CLOSED_FORM, closed_form_problem, mixed_problem
from torch.utils._pytree import tree_flatten, tree_map

import hypergrad as hg
from hypergrad.methods import forward as fwd
from hypergrad.tangent import UpdateStep
from hypergrad.testing import OPTIMIZERS, rel_err

G_UNTOUCHED = {"adam_plain", "adam_eps_root", "adamw_const", "adamw_all_bound", "rmsprop_plain",
               "rmsprop_centered_eps", "adagrad_plain", "adagrad_accumulator"}
"""Configurations whose closed form must leave this step's ``G`` alone (no L2 decay reusing its
buffer)."""


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_elementwise_update_tangent_equals_jvp(opt: str) -> None:
    """The diagonal linearization of the update against jvp of the update under vmap, at a
    state with random tangents, every column read by the optimizer at this step."""
    problem = mixed_problem(opt, steps=6, windows=3)
    lam = problem.init_raw()
    fm = hg.ForwardMode()
    fs = fm.run(problem, fm.init(problem, lam), lam, stop=3)
    g = torch.Generator().manual_seed(2)
    rnd = lambda v: torch.randn(v.shape, generator=g, dtype=v.dtype)  # noqa: E731
    s, z = fs.state, tree_map(rnd, fs.tangents)
    grads = tree_map(rnd, s.params)
    G = tree_map(rnd, z.params)
    k, t = lam.shape[0], 3
    cols = fwd.ColumnPlan(problem).optimizer_columns(t)
    eye = torch.eye(k, dtype=lam.dtype)
    step = UpdateStep(problem, t, lam, grads, s, G, z, cols, cols, eye)
    out = hg.tangent.DiagonalJacobian()(step)
    assert out is not None
    primal, (zp, zo) = out
    ref = hg.tangent.JVP()(UpdateStep(problem, t, lam, grads, s, G, z, cols, cols, eye))
    assert ref is not None
    _, (zp2, zo2) = ref
    for x, y in zip(tree_flatten((zp, zo))[0], tree_flatten((zp2, zo2))[0]):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)
    # the primal update from the same pass is problem.update's, bit for bit
    for x, y in zip(tree_flatten(primal)[0],
                    tree_flatten(problem.update(grads, s.opt, s.params, lam, t))[0]):
        assert torch.equal(x, y)


def test_non_elementwise_fallback_is_the_same() -> None:
    """An optimizer that is not elementwise gets no diagonal Jacobian: jvp instead."""
    problem = mixed_problem("adam", steps=5, windows=2)
    lam = problem.init_raw()
    a = hg.ForwardMode().hypergradient(problem, lam).grad
    problem.optimizer.elementwise = False  # this instance only
    assert hg.tangent.DiagonalJacobian()(
        UpdateStep(problem, 0, lam, *([None] * 7))) is None  # type: ignore[arg-type]
    rules = (hg.tangent.DiagonalJacobian(), hg.tangent.JVP())
    b = hg.ForwardMode(tangent=hg.tangent.AutoTangent(rules)
                       ).hypergradient(problem, lam).grad
    torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-15)


def _closed_form_equals_jvp(problem: hg.InnerProblem, t: int, seed: int,
                            atol: float, zero_grad_row: bool = False) -> tuple[Any, Any]:
    """A closed-form update tangent against jvp of the update under vmap, at step ``t`` with
    random tangents and gradients: tangents equal (and finite), the update bit for bit
    ``problem.update``'s, the caller's tangents left alone. Returns ``(G, G before the call)``."""
    lam = problem.init_raw()
    fm = hg.ForwardMode()
    fs = fm.run(problem, fm.init(problem, lam), lam, stop=t)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda v: torch.randn(v.shape, generator=g, dtype=v.dtype)  # noqa: E731
    s, z = fs.state, tree_map(rnd, fs.tangents)
    grads = tree_map(rnd, s.params)
    if zero_grad_row:  # Adam: the second moment stays 0 there at t = 0 (safe_sqrt)
        grads[next(iter(grads))][0] = 0.0
    G = tree_map(rnd, z.params)
    cols = fwd.ColumnPlan(problem).optimizer_columns(t)
    assert cols
    eye = torch.eye(lam.shape[0], dtype=lam.dtype)
    ref = hg.tangent.JVP()(UpdateStep(problem, t, lam, grads, s, tree_map(torch.clone, G), z,
                                      cols, cols, eye))
    assert ref is not None
    _, (zp2, zo2) = ref
    z_before, G_before = tree_map(torch.clone, z), tree_map(torch.clone, G)
    out = hg.tangent.ClosedForm()(UpdateStep(problem, t, lam, grads, s, G, z, cols, cols, eye))
    assert out is not None
    primal, (zp, zo) = out
    for x, y in zip(tree_flatten((zp, zo))[0], tree_flatten((zp2, zo2))[0], strict=True):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, rtol=1e-12, atol=atol)
    want = problem.update(grads, s.opt, s.params, lam, t)
    for x, y in zip(tree_flatten(primal)[0], tree_flatten(want)[0], strict=True):
        assert torch.equal(x, y)
    for x, y in zip(tree_flatten(z)[0], tree_flatten(z_before)[0]):  # inputs left alone
        assert torch.equal(x, y)
    return G, G_before


@pytest.mark.parametrize("lr_kind", ["schedule", "per_tensor"])
@pytest.mark.parametrize("config", sorted(CLOSED_FORM))
@pytest.mark.parametrize("t", [0, 3])
def test_closed_form_tangent_equals_jvp(config: str, lr_kind: str, t: int) -> None:
    """Each optimizer's closed-form tangent (every argument constant or bound, SGD's dampening,
    Nesterov and first buffer, Adam's bias corrections, a zero second moment at t = 0) against
    jvp of the update under vmap, with random tangents; the caller's tangents left alone."""
    G, G_before = _closed_form_equals_jvp(closed_form_problem(config, lr_kind), t, seed=4,
                                          atol=1e-13, zero_grad_row=True)
    if config in G_UNTOUCHED:
        for x, y in zip(tree_flatten(G)[0], tree_flatten(G_before)[0]):
            assert torch.equal(x, y)


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_closed_form_used_and_general_paths_equal(opt: str) -> None:
    """Whole runs: the closed form (the default's first choice, used at every step), the
    diagonal-Jacobian path and jvp give one result, equal to reverse mode."""
    problem = mixed_problem(opt, steps=6, windows=3)
    lam = problem.init_raw()
    calls = []
    real = problem.optimizer.tangent
    problem.optimizer.tangent = (  # type: ignore[method-assign]
        lambda *a: calls.append(1) or real(*a))  # type: ignore[func-returns-value]
    a = hg.ForwardMode().hypergradient(problem, lam).grad
    assert len(calls) == problem.steps
    b = hg.ForwardMode(tangent=hg.tangent.DiagonalJacobian()).hypergradient(problem, lam).grad
    c = hg.ForwardMode(tangent=hg.tangent.JVP()).hypergradient(problem, lam).grad
    torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-15)
    torch.testing.assert_close(a, c, rtol=1e-11, atol=1e-15)
    assert rel_err(a, hg.ReverseMode().hypergradient(problem, lam).grad) <= 1e-9


def test_an_explicit_rule_that_does_not_apply_is_an_error() -> None:
    problem = mixed_problem("adam", steps=3, windows=2)
    problem.optimizer.elementwise = False  # this instance only
    with pytest.raises(ValueError, match="DiagonalJacobian.*does not apply.*AutoTangent"):
        hg.ForwardMode(tangent=hg.tangent.DiagonalJacobian()).hypergradient(
            problem, problem.init_raw())
    with pytest.raises(TypeError, match="tangent must be a TangentRule"):
        hg.ForwardMode(tangent="jvp")  # type: ignore[arg-type]


def test_a_terms_zero_derivatives_add_nothing_and_skip_its_value() -> None:
    """``TangentContext.add_term``: ``z[rows[j]] += sign * d[j] * x``, the rows whose ``d[j]``
    is 0 left as they were (a schedule reads one window per step) and ``x`` not evaluated when
    all are; a NaN derivative still reaches its row."""
    from hypergrad.optim.base import TangentContext

    c = TangentContext(0, {}, (), {}, {}, (), {}, {}, {}, rows=[1, 2, 4])  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 3, dtype=torch.float64, generator=g)
    x = torch.randn(3, dtype=torch.float64, generator=g)
    calls: list[int] = []

    def value() -> torch.Tensor:
        calls.append(1)
        return x

    before = z.clone()
    c.add_term(z, torch.zeros(3, dtype=torch.float64), value)
    assert calls == [] and torch.equal(z, before)
    d = torch.tensor([0.0, 0.5, 0.0], dtype=torch.float64)
    c.add_term(z, d, value, sign=-1.0)
    want = before.clone()
    want[2] -= 0.5 * x
    assert calls == [1] and torch.equal(z, want)
    c.add_term(z, torch.tensor([float("nan"), 0.0, 0.0], dtype=torch.float64), x)
    assert torch.isnan(z[1]).all() and torch.equal(z[[0, 2, 3, 4]], want[[0, 2, 3, 4]])


def _own_optimizer_problem(opt: Any, *items: hg.HyperParameter, steps: int = 3
                           ) -> hg.InnerProblem:
    """A float64 digits MLP trained by ``opt`` (an optimizer of one's own) with ``items``
    (default: a log-scale ``lr``)."""
    import torch.nn.functional as F

    from hypergrad.data import MiniBatches
    from hypergrad.tasks import digits_data, mlp

    data = digits_data(n_train=32, n_val=32, dtype=torch.float64)
    torch.manual_seed(0)
    return hg.InnerProblem(
        mlp([64, 8, 10]).double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]), opt,
        hg.HyperParams(list(items) or [hg.Scalar("lr", 0.3, transform="log")]),
        MiniBatches(data.x_train, data.y_train, batch_size=8), steps=steps,
        val_loss=lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))


class _NormState(NamedTuple):
    """:class:`_NormalizedSGD` keeps nothing between steps."""


class _NormalizedSGD(hg.optim.Optimizer):
    """A user's optimizer that does not say whether it is elementwise (it is not: the norm
    couples a tensor's entries) and has no closed-form tangent."""

    hyper_args = ("lr",)

    def init(self, params: dict) -> _NormState:
        return _NormState()

    def update(self, grads: dict, state: _NormState, params: dict, hp: Any, step: int
               ) -> tuple[dict, _NormState]:
        return {k: w - self.read(self.args["lr"], hp, k) * grads[k] / (grads[k].norm() + 1e-8)
                for k, w in params.items()}, state


def test_an_optimizer_that_does_not_say_it_is_elementwise_gets_the_jvp_tangent() -> None:
    """``elementwise`` was True by default: a user's normalized SGD that left it out got the
    diagonal Jacobian's tangent, and forward mode's hypergradient was 10 % off reverse mode's
    with no word. The default is False (jvp, right for any update); the built-in elementwise
    optimizers say True."""
    p = _own_optimizer_problem(_NormalizedSGD(lr="lr"),
                               hg.PerTensor("lr", init=0.3, transform="log"), steps=6)
    assert not p.optimizer.elementwise
    lam = p.init_raw()
    rev = hg.ReverseMode().hypergradient(p, lam).grad
    assert rel_err(hg.ForwardMode().hypergradient(p, lam).grad, rev) < 1e-12
    p.optimizer.elementwise = True  # what the default was: the diagonal Jacobian is wrong here
    assert rel_err(hg.ForwardMode().hypergradient(p, lam).grad, rev) > 1e-2
    for name in ("sgd", "adam", "adamw", "rmsprop", "adagrad"):
        assert hg.optim.create(name, lr=0.1).elementwise, name
    assert not hg.optim.create("adamw_schedulefree", lr=0.1).elementwise


def test_an_optimizer_of_ones_own_is_named_as_written_and_created_by_a_colon_path() -> None:
    """Its messages and repr said ``_normalizedsgd``; ``optim.create("module:factory")`` (as
    methods take) was "not a registered optimizer"."""
    opt = _NormalizedSGD(lr=0.1)
    assert repr(opt).startswith("_NormalizedSGD(") and opt.name == "_NormalizedSGD"
    with pytest.raises(TypeError, match=r"^_NormalizedSGD: unexpected argument 'momentum'"):
        _NormalizedSGD(lr=0.1, momentum=0.9)
    assert hg.optim.create("sgd", lr=0.1).name == "sgd"
    assert type(hg.optim.create("hypergrad.optim.sgd:sgd", lr=0.1)).__name__ == "SGD"


@pytest.mark.parametrize("bend,match", [
    (lambda new: {k: v.reshape(-1) for k, v in new.items()},
     r"_Bent.update returned '0.weight' of shape \(512,\) and dtype torch.float64; the "
     r"parameter has shape \(8, 64\)"),
    (lambda new: dict(list(new.items())[1:]), r"_Bent.update returned parameters \['0.bias', "
                                              r"'2.bias', '2.weight'\], expected the model's"),
    (lambda new: {k: v.float() for k, v in new.items()}, r"dtype torch.float32; the parameter "
                                                         r"has shape \(8, 64\) and dtype "
                                                         r"torch.float64"),
])
def test_what_an_optimizer_of_ones_own_returns_is_checked(bend: Any, match: str) -> None:
    """A wrong shape, a missing parameter or another dtype failed deep inside torch ("Mismatch
    in shape: grad_output[0]...", a pytree error) without naming the optimizer."""

    class _Bent(_NormalizedSGD):
        def update(self, grads: dict, state: _NormState, params: dict, hp: Any, step: int
                   ) -> tuple[dict, _NormState]:
            new, st = super().update(grads, state, params, hp, step)
            return bend(new), st

    p = _own_optimizer_problem(_Bent(lr="lr"))
    with pytest.raises(ValueError, match=match):
        hg.Trainer(p, method="forward", mode=hg.Offline(outer_steps=1), callbacks=[])


class _CountState(NamedTuple):
    m: Any
    count: Any


@pytest.mark.parametrize("elementwise,count,match", [
    (False, torch.zeros((), dtype=torch.int64),
     r"_Counting.init gives a state whose field 'count' holds dtype torch.int64; forward mode "
     r"carries a tangent .* the `step` argument update receives"),
    (True, torch.zeros((), dtype=torch.float64),
     r"_Counting says elementwise = True, .* field 'count' is Tensor"),
])
def test_an_optimizer_state_without_tangents_is_named(elementwise: bool, count: torch.Tensor,
                                                      match: str) -> None:
    """A step counter in the state (torch.optim's habit) failed in torch's jvp ("Expected
    primal to be floating point") or, elementwise, with "'Tensor' object has no attribute
    'items'" (the reuse probe, 2026-12-07)."""

    class _Counting(hg.optim.Optimizer):
        hyper_args = ("lr",)

        def init(self, params: dict) -> _CountState:
            return _CountState({k: torch.zeros_like(w) for k, w in params.items()}, count)

        def update(self, grads: dict, state: _CountState, params: dict, hp: Any, step: int
                   ) -> tuple[dict, _CountState]:
            lr = self.read(self.args["lr"], hp, "")
            m = {k: 0.9 * state.m[k] + grads[k] for k in params}
            return {k: w - lr * m[k] for k, w in params.items()}, _CountState(m, state.count + 1)

    _Counting.elementwise = elementwise
    p = _own_optimizer_problem(_Counting(lr="lr"))
    with pytest.raises(TypeError, match=match):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_the_memory_estimate_of_an_optimizer_of_ones_own_warns_nothing() -> None:
    """The generic (jvp) tangent read data pointers of fake tensors in estimate_memory: a
    torch UserWarning ("Accessing the data pointer of FakeTensor is deprecated"), an error
    under -W error (the reuse probe, 2026-12-07)."""
    import warnings

    from hypergrad.methods import estimate_memory

    p = _own_optimizer_problem(_NormalizedSGD(lr="lr"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        est = estimate_memory(p, "forward")
    assert est.total > 0
    assert not [w for w in seen if "FakeTensor" in str(w.message)], [str(w.message) for w in seen]


def test_a_hyperparameter_given_to_a_fixed_setting_says_where_to_declare_it() -> None:
    """An argument listed in ``options`` and given a hyperparameter's name was told to do
    what it did (``e.g. Mis(..., momentum='mom')``)."""

    class _Mis(_NormalizedSGD):
        options = ("momentum",)

    p = _own_optimizer_problem(_Mis(lr="lr", momentum="mom"), hg.Scalar("lr", 0.3, "log"),
                               hg.Scalar("mom", 0.5, "logit"))
    with pytest.raises(ValueError, match=r"'momentum' is one of its fixed settings \(options = "
                                         r"\('momentum',\)\).*move 'momentum' to hyper_args"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_an_update_that_writes_its_state_in_place_is_named() -> None:
    """torch.optim's habit, ``buf.mul_(momentum).add_(g)``, failed with torch's "a leaf
    Variable that requires grad is being used in an in-place operation" in reverse mode and
    "captured Tensor" errors in forward mode (the reuse probe, 2026-12-07)."""

    class _InPlace(hg.optim.Optimizer):
        hyper_args = ("lr",)

        def init(self, params: dict) -> _CountState:
            return _CountState({k: torch.zeros_like(w) for k, w in params.items()},
                               torch.zeros(()))

        def update(self, grads: dict, state: _CountState, params: dict, hp: Any, step: int
                   ) -> tuple[dict, _CountState]:
            lr = self.read(self.args["lr"], hp, "")
            for k in params:
                state.m[k].mul_(0.9).add_(grads[k])
            return {k: w - lr * state.m[k] for k, w in params.items()}, state

    p = _own_optimizer_problem(_InPlace(lr="lr"))
    for method in (hg.ForwardMode(), hg.ReverseMode()):
        with pytest.raises(TypeError, match=r"_InPlace.update writes its inputs in place"):
            method.hypergradient(p, p.init_raw())
