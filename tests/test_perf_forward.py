"""The structural savings of the forward step give the dense step's results (float64): skipped
schedule columns, the optimizer's hyperparameter term on its own columns only, and the
elementwise linearization of the update against ``jvp`` under ``vmap``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

import hypergrad as hg
from hypergrad import forward as fwd
from hypergrad.data import MiniBatches
from hypergrad.testing import GRID, OPTIMIZERS, digits_case, rel_err

SMALL = dict(n_train=24, batch_size=8, hidden=8, n_val=32)


def _mixed_problem(opt: str, steps: int, windows: int, batchnorm: bool = False,
                   seed: int = 0) -> hg.InnerProblem:
    """A schedule next to other kinds: an lr schedule, a momentum (beta1) scalar except for plain
    sgd, a per-tensor weight decay and a loss parameter."""
    base = digits_case("momentum", "lr", steps=steps, batchnorm=batchnorm, seed=seed, **SMALL)
    row = GRID[opt]
    items: list[Any] = [hg.Schedule("lr", row.lr0 / 2, windows=windows, transform="log")]
    args = {**row.constants, "lr": "lr", "weight_decay": "wd"}
    if row.momentum is not None:
        items.append(hg.Scalar("mom", 0.8, transform="logit"))
        args.update(row.momentum("mom"))
    items += [hg.PerTensor("wd", 1e-2, transform="log"),
              hg.Tensor("smooth", 0.1, transform="logit")]
    optimizer = row.factory(**args)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, idx = batch
        logp = F.log_softmax(m(x), -1)
        return (1 - hp["smooth"]) * F.nll_loss(logp, y) - hp["smooth"] * logp.mean()

    return hg.InnerProblem(base.fmodel.module, train_loss, optimizer, hg.HyperParams(items),
                           base.batch, steps, base.val_loss)


@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("steps,windows", [(6, 3), (5, 8), (7, 4)])
def test_skipping_columns_equals_dense(opt: str, steps: int, windows: int) -> None:
    problem = _mixed_problem(opt, steps, windows)
    lam = problem.init_raw()
    skip = hg.ForwardMode().hypergradient(problem, lam).grad
    dense = hg.ForwardMode(skip_zero_columns=False).hypergradient(problem, lam).grad
    torch.testing.assert_close(skip, dense, rtol=1e-12, atol=1e-15)
    rev = hg.ReverseMode().hypergradient(problem, lam).grad
    assert rel_err(skip, rev) <= 1e-9


def test_skipping_with_batchnorm_and_the_loop() -> None:
    problem = _mixed_problem("momentum", 6, 3, batchnorm=True)
    lam = problem.init_raw()
    a = hg.ForwardMode(hg.ColumnLoop()).hypergradient(problem, lam).grad
    b = hg.ForwardMode(hg.ColumnLoop(), skip_zero_columns=False).hypergradient(problem, lam).grad
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    assert rel_err(a, hg.ReverseMode().hypergradient(problem, lam).grad) <= 1e-9


def test_columns_stay_exactly_zero_until_their_window() -> None:
    problem = digits_case("nesterov", "schedule", steps=8, windows=4, **SMALL)
    lam = problem.init_raw()
    sched = problem.hyperparams.items[0]
    fm = hg.ForwardMode()
    fs = fm.init(problem, lam)
    for t in range(problem.steps):
        fs = fm.step(problem, fs, lam)
        started = {sched.window(s, problem.steps) for s in range(t + 1)}
        leaves = tree_flatten(fs.tangents)[0]
        for c in range(4):
            nonzero = any(bool(v[c].any()) for v in leaves)
            assert nonzero == (c in started), (t, c)


def test_a_non_zero_tangent_is_never_skipped() -> None:
    """A user-made state with a non-zero column of a window that has not started (for instance
    carried over from another run) is computed, not assumed zero."""
    problem = digits_case("momentum", "schedule", steps=6, windows=3, **SMALL)
    lam = problem.init_raw()
    g = torch.Generator().manual_seed(1)
    fs0 = hg.ForwardMode().init(problem, lam)
    fs0 = fs0._replace(tangents=tree_map(
        lambda v: torch.randn(v.shape, generator=g, dtype=v.dtype), fs0.tangents))
    a = hg.ForwardMode().step(problem, fs0, lam)
    b = hg.ForwardMode(skip_zero_columns=False).step(problem, fs0, lam)
    for x, y in zip(tree_flatten(a.tangents)[0], tree_flatten(b.tangents)[0]):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)


def test_plan_reads_schedule_windows() -> None:
    problem = _mixed_problem("momentum", steps=8, windows=4)  # lr: columns 0..3, mom: 4, wd: 5..
    plan = fwd._Plan(problem)
    assert plan.first_read[:4] == [0, 2, 4, 6]
    assert plan.first_read[4:] == [0] * (problem.num_hyperparams - 4)
    assert plan.not_started(3) == [2, 3]
    n_wd = len(problem.fmodel.param_names)
    assert plan.optimizer_columns(5) == [2, 4, *range(5, 5 + n_wd)]
    never = fwd._Plan(_mixed_problem("momentum", steps=3, windows=8))  # windows 8 > T = 3
    assert never.first_read[:8] == [0, 3, 1, 3, 3, 2, 3, 3]  # 3: read by no step


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_elementwise_update_tangent_equals_jvp(opt: str) -> None:
    """The diagonal linearization of the update against jvp of the update under vmap, at a
    state with random tangents, every column read by the optimizer at this step."""
    problem = _mixed_problem(opt, steps=6, windows=3)
    lam = problem.init_raw()
    fm = hg.ForwardMode()
    fs = fm.run(problem, fm.init(problem, lam), lam, stop=3)
    g = torch.Generator().manual_seed(2)
    rnd = lambda v: torch.randn(v.shape, generator=g, dtype=v.dtype)  # noqa: E731
    s, z = fs.state, tree_map(rnd, fs.tangents)
    grads = tree_map(rnd, s.params)
    G = tree_map(rnd, z.params)
    k, t = lam.shape[0], 3
    cols = fwd._Plan(problem).optimizer_columns(t)
    eye = torch.eye(k, dtype=lam.dtype)
    out = hg.DiagonalJacobian()(problem, t, lam, grads, s, G, z, cols, cols, eye)
    assert out is not None
    primal, (zp, zo) = out
    ref = hg.JVP()(problem, t, lam, grads, s, G, z, cols, cols, eye)
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
    problem = _mixed_problem("adam", steps=5, windows=2)
    lam = problem.init_raw()
    a = hg.ForwardMode().hypergradient(problem, lam).grad
    problem.optimizer.elementwise = False  # this instance only
    assert hg.DiagonalJacobian()(problem, 0, lam, *([None] * 7)) is None  # type: ignore[arg-type]
    b = hg.ForwardMode(tangent=hg.AutoTangent((hg.DiagonalJacobian(), hg.JVP()))
                       ).hypergradient(problem, lam).grad
    torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-15)


def test_constant_per_tensor_default_and_frozen_parameters() -> None:
    """A PerTensor with a constant default for some parameters, and a frozen parameter."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    model[0].bias.requires_grad_(False)
    x = torch.randn(16, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (16,))
    hps = hg.HyperParams([hg.PerTensor("wd", 1e-2, transform="log", params=["0.weight"],
                                       default=1e-3),
                          hg.Schedule("lr", 0.1, windows=3, transform="log")])
    problem = hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.sgd(lr="lr", momentum=0.9, weight_decay="wd"), hps,
        MiniBatches(x, y, batch_size=8), 6, lambda m, hp: F.cross_entropy(m(x), y))
    lam = problem.init_raw()
    a = hg.ForwardMode().hypergradient(problem, lam).grad
    b = hg.ReverseMode().hypergradient(problem, lam).grad
    assert rel_err(a, b) <= 1e-10


CLOSED_FORM: dict[str, tuple[str, dict[str, Any], list[Any], float]] = {
    # name: (factory in hypergrad.optim, arguments, extra hyperparameters, initial lr)
    "sgd_plain": ("sgd", dict(lr="lr"), [], 0.05),
    "sgd_wd_const": ("sgd", dict(lr="lr", weight_decay=1e-2), [], 0.05),
    "sgd_momentum_wd": ("sgd", dict(lr="lr", momentum="mom", weight_decay="wd"),
                        [hg.Scalar("mom", 0.8, transform="logit"),
                         hg.PerTensor("wd", 1e-2, transform="log")], 0.05),
    "sgd_dampening": ("sgd", dict(lr="lr", momentum=0.9, dampening="damp", weight_decay="wd"),
                      [hg.Scalar("damp", 0.3, transform="logit"), hg.Scalar("wd", 1e-2)], 0.05),
    "sgd_dampening_const": ("sgd", dict(lr="lr", momentum="mom", dampening=0.25),
                            [hg.Scalar("mom", 0.7)], 0.05),
    "sgd_nesterov": ("sgd", dict(lr="lr", momentum="mom", nesterov=True, weight_decay="wd"),
                     [hg.Scalar("mom", 0.8, transform="logit"), hg.Scalar("wd", 1e-2)], 0.05),
    "sgd_nesterov_damp": ("sgd", dict(lr="lr", momentum="mom", nesterov=True, dampening="damp"),
                          [hg.Scalar("mom", 0.8), hg.Scalar("damp", 0.2)], 0.05),
    "adam_plain": ("adam", dict(lr="lr"), [], 0.01),
    "adam_l2_const": ("adam", dict(lr="lr", weight_decay=1e-2), [], 0.01),
    "adam_all_bound": ("adam", dict(lr="lr", betas=("b1", "b2"), eps="eps", weight_decay="wd"),
                       [hg.Scalar("b1", 0.8, transform="logit"),
                        hg.Scalar("b2", 0.99, transform="logit"),
                        hg.Scalar("eps", 1e-3, transform="log"),
                        hg.PerTensor("wd", 1e-2, transform="log")], 0.01),
    "adam_eps_root": ("adam", dict(lr="lr", betas=(0.9, "b2"), eps_root=1e-8),
                      [hg.Scalar("b2", 0.95, transform="logit")], 0.01),
    "adamw_const": ("adamw", dict(lr="lr", weight_decay=0.1), [], 0.01),
    "adamw_all_bound": ("adamw", dict(lr="lr", betas=("b1", "b2"), eps="eps",
                                      weight_decay="wd"),
                        [hg.Scalar("b1", 0.8, transform="logit"),
                         hg.Scalar("b2", 0.99, transform="logit"),
                         hg.Scalar("eps", 1e-3, transform="log"),
                         hg.Scalar("wd", 0.1, transform="log")], 0.01),
}
"""Closed-form tangents checked against jvp: every argument constant or bound; a new optimizer
with a closed form adds rows."""

G_UNTOUCHED = {"adam_plain", "adam_eps_root", "adamw_const", "adamw_all_bound"}
"""Configurations whose closed form must leave this step's ``G`` alone (no L2 decay reusing its
buffer)."""


def _closed_form_problem(config: str, lr_kind: str, steps: int = 6) -> hg.InnerProblem:
    ctor, kwargs, extra, lr0 = CLOSED_FORM[config]
    base = digits_case("momentum", "lr", steps=steps, **SMALL)
    lr = (hg.Schedule("lr", lr0, windows=3, transform="log") if lr_kind == "schedule"
          else hg.PerTensor("lr", lr0, transform="log"))
    opt = getattr(hg.optim, ctor)(**kwargs)
    return hg.InnerProblem(base.fmodel.module, base.train_loss, opt,
                           hg.HyperParams([lr, *extra]), base.batch, steps, base.val_loss)


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
    cols = fwd._Plan(problem).optimizer_columns(t)
    assert cols
    eye = torch.eye(lam.shape[0], dtype=lam.dtype)
    ref = hg.JVP()(problem, t, lam, grads, s, tree_map(torch.clone, G), z, cols, cols, eye)
    assert ref is not None
    _, (zp2, zo2) = ref
    z_before, G_before = tree_map(torch.clone, z), tree_map(torch.clone, G)
    out = hg.ClosedForm()(problem, t, lam, grads, s, G, z, cols, cols, eye)
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
    G, G_before = _closed_form_equals_jvp(_closed_form_problem(config, lr_kind), t, seed=4,
                                          atol=1e-13, zero_grad_row=True)
    if config in G_UNTOUCHED:
        for x, y in zip(tree_flatten(G)[0], tree_flatten(G_before)[0]):
            assert torch.equal(x, y)


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_closed_form_used_and_general_paths_equal(opt: str) -> None:
    """Whole runs: the closed form (the default's first choice, used at every step), the
    diagonal-Jacobian path and jvp give one result, equal to reverse mode."""
    problem = _mixed_problem(opt, steps=6, windows=3)
    lam = problem.init_raw()
    calls = []
    real = problem.optimizer.tangent
    problem.optimizer.tangent = (  # type: ignore[method-assign]
        lambda *a: calls.append(1) or real(*a))  # type: ignore[func-returns-value]
    a = hg.ForwardMode().hypergradient(problem, lam).grad
    assert len(calls) == problem.steps
    b = hg.ForwardMode(tangent=hg.DiagonalJacobian()).hypergradient(problem, lam).grad
    c = hg.ForwardMode(tangent=hg.JVP()).hypergradient(problem, lam).grad
    torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-15)
    torch.testing.assert_close(a, c, rtol=1e-11, atol=1e-15)
    assert rel_err(a, hg.ReverseMode().hypergradient(problem, lam).grad) <= 1e-9
