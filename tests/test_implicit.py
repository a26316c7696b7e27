"""Implicit differentiation (float64): ridge on load_diabetes equals the closed form, an
L2-regularised MLP trained to convergence equals forward mode at large T, every solver reports
its residual and iterations, the optimizer's L2 weight decay is the same loss term, and what the
implicit function theorem does not cover (optimizer and initialisation hyperparameters, an
unconverged inner problem) is refused or warned about."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from fixtures import SMALL

import hypergrad as hg
from hypergrad.errors import InnerNotConvergedWarning, SolverNotConvergedWarning
from hypergrad.testing import digits_case, l2_mlp_case, rel_err, ridge_diabetes_case


@pytest.fixture(scope="module")
def ridge() -> tuple[hg.InnerProblem, torch.Tensor]:
    return ridge_diabetes_case(2000)


def test_ridge_equals_the_closed_form(ridge: tuple[hg.InnerProblem, torch.Tensor]) -> None:
    problem, closed = ridge
    r = hg.ImplicitDiff(hg.methods.CG(tol=1e-12)).hypergradient(problem, problem.init_raw())
    assert rel_err(r.grad, closed) <= 1e-8
    assert r.info is not None and r.info["converged"] and r.info["residual"] <= 1e-12
    assert r.info["iterations"] <= 11  # 10 features: CG is exact in 10 steps
    assert r.info["grad_norm_ratio"] < 1e-12
    objective, grad, state, info = r  # HyperGradient's fields, info last
    assert torch.equal(grad, r.grad) and info is r.info and objective.ndim == 0


@pytest.mark.parametrize("solver", [hg.methods.Neumann(maxiter=3000, tol=1e-11),
                                    hg.methods.FixedPoint(maxiter=3000, tol=1e-11),
                                    hg.methods.FixedPoint(maxiter=3000, tol=1e-11, momentum=0.9)],
                         ids=["neumann", "fixed_point", "fixed_point_momentum"])
def test_ridge_every_solver(ridge: tuple[hg.InnerProblem, torch.Tensor],
                            solver: hg.methods.LinearSolver) -> None:
    problem, closed = ridge
    r = hg.ImplicitDiff(solver).hypergradient(problem, problem.init_raw())
    assert r.info is not None
    assert r.info["converged"] and r.info["residual"] <= 1e-11
    assert r.info["alpha"] == pytest.approx(1 / r.info["lambda_max"])
    assert r.info["hvps"] == r.info["iterations"] + 20 + 1 + (solver.name == "fixed_point")
    assert rel_err(r.grad, closed) <= 1e-8


def test_neumann_and_fixed_point_take_the_same_iterates(ridge: tuple[hg.InnerProblem,
                                                                      torch.Tensor]) -> None:
    problem, _ = ridge
    with pytest.warns(SolverNotConvergedWarning):
        a = hg.ImplicitDiff(hg.methods.Neumann(maxiter=50)).hypergradient(problem,
                                                                          problem.init_raw())
    with pytest.warns(SolverNotConvergedWarning):
        b = hg.ImplicitDiff(hg.methods.FixedPoint(maxiter=50)).hypergradient(problem,
                                                                             problem.init_raw())
    assert a.info is not None and b.info is not None
    assert a.info["residual"] == pytest.approx(b.info["residual"], rel=1e-8)
    assert rel_err(a.grad, b.grad) <= 1e-10


def test_l2_mlp_trained_to_convergence_agrees_with_forward_mode() -> None:
    problem = l2_mlp_case(500)
    lam = problem.init_raw()
    imp = hg.ImplicitDiff(hg.methods.CG(maxiter=300)).hypergradient(problem, lam)
    fwd = hg.ForwardMode().hypergradient(problem, lam)
    assert imp.info is not None and imp.info["converged"]
    assert rel_err(imp.grad, fwd.grad) <= 1e-3
    assert torch.equal(imp.objective, fwd.objective)


def test_optimizer_weight_decay_is_the_same_l2_term() -> None:
    """sgd(weight_decay="l2") has the same fixed point as the L2 term in the loss: accepted,
    with the same hypergradient."""
    loss_l2, opt_l2 = l2_mlp_case(300), l2_mlp_case(300, via_optimizer=True)
    lam = loss_l2.init_raw()
    a = hg.ImplicitDiff(hg.methods.CG(maxiter=300)).hypergradient(loss_l2, lam)
    b = hg.ImplicitDiff(hg.methods.CG(maxiter=300)).hypergradient(opt_l2, lam)
    assert rel_err(b.grad, a.grad) <= 1e-6
    assert rel_err(b.grad, hg.ForwardMode().hypergradient(opt_l2, lam).grad) <= 1e-3


def test_unconverged_inner_problem_warns_and_can_flip_the_sign(
        ridge: tuple[hg.InnerProblem, torch.Tensor]) -> None:
    _, closed = ridge
    short, _ = ridge_diabetes_case(5)
    with pytest.warns(InnerNotConvergedWarning, match=r"not near a stationary point.*grad_tol"):
        r = hg.ImplicitDiff().hypergradient(short, short.init_raw())
    assert r.info is not None and r.info["grad_norm_ratio"] > 0.5
    assert float(r.grad[0]) * float(closed[0]) < 0  # the wrong sign


def test_solver_that_stops_early_warns_with_its_residual(
        ridge: tuple[hg.InnerProblem, torch.Tensor]) -> None:
    problem, _ = ridge
    with pytest.warns(SolverNotConvergedWarning, match=r"CG\(maxiter=2.*stopped at relative "
                                                       r"residual .* after 2 iterations"):
        r = hg.ImplicitDiff(hg.methods.CG(maxiter=2)).hypergradient(problem, problem.init_raw())
    assert r.info is not None and not r.info["converged"] and r.info["iterations"] == 2


def test_warm_start_reuses_the_last_solution(ridge: tuple[hg.InnerProblem,
                                                          torch.Tensor]) -> None:
    problem, _ = ridge
    lam = problem.init_raw()
    m = hg.ImplicitDiff(hg.methods.CG(tol=1e-12), warm_start=True)
    first = m.hypergradient(problem, lam)
    again = m.hypergradient(problem, lam)
    assert first.info is not None and again.info is not None
    assert again.info["iterations"] < first.info["iterations"]
    assert rel_err(again.grad, first.grad) <= 1e-10


def test_cg_on_a_known_system_and_its_breakdown() -> None:
    a = torch.tensor([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    x, info = hg.methods.CG(tol=1e-14).solve(lambda v: a @ v, b)
    torch.testing.assert_close(x, torch.linalg.solve(a, b), rtol=1e-13, atol=0)
    assert info["iterations"] == 3 and info["hvps"] == 4 and info["converged"]
    _, info = hg.methods.CG().solve(lambda v: -v, b)
    assert "non-positive curvature" in info["breakdown"] and not info["converged"]
    assert not info["breakdown_rounding"]
    # a real negative curvature after positive ones is no rounding either
    _, info = hg.methods.CG().solve(lambda v: torch.tensor([1.0, -0.01, 1.0]) * v, b.float())
    assert "breakdown" in info and not info["breakdown_rounding"]
    # a singular H (a zero curvature, as softmax's shift of all biases) with b in its range, in
    # float32: rounding brings in the null direction, and a breakdown there is at rounding level
    # (3 of these 5 break down on the machines measured)
    broke = 0
    for seed in range(5):
        q, _ = torch.linalg.qr(torch.randn(6, 6, generator=torch.Generator().manual_seed(seed),
                                           dtype=torch.float64))
        h = ((q * torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2, 0.0], dtype=torch.float64)) @ q.T).float()
        _, info = hg.methods.CG().solve(lambda v: h @ v, q[:, :5].sum(1).float())  # noqa: B023
        if "breakdown" in info:
            broke += 1
            assert info["breakdown_rounding"], info
    assert broke


def test_optimizer_hyperparameters_are_refused_with_their_names() -> None:
    problem = digits_case("momentum", "momentum", **SMALL)  # sgd(lr=0.1, momentum="mom")
    with pytest.raises(ValueError, match=r"hyperparameters \['mom'\] are read by the optimizer "
                                         r"\(sgd\(momentum='mom'\)\).*ForwardMode\(\)"):
        hg.ImplicitDiff().hypergradient(problem, problem.init_raw())
    sched = digits_case("sgd", "schedule", **SMALL)
    with pytest.raises(ValueError, match=r"\['lr'\] are read by the optimizer"):
        hg.ImplicitDiff().hypergradient(sched, sched.init_raw())
    adamw = digits_case("adamw", "per_tensor_wd", **SMALL)  # decoupled decay: no loss term
    with pytest.raises(ValueError, match=r"\['wd'\] are read by the optimizer \(adamw\("):
        hg.ImplicitDiff().hypergradient(adamw, adamw.init_raw())


def test_initialisation_hyperparameters_and_batchnorm_are_refused() -> None:
    base = digits_case("sgd", "loss_param", **SMALL)
    init = hg.InnerProblem(base.fmodel.module, base.train_loss, base.optimizer,
                           hg.HyperParams([hg.InitScale("scale", 1.0)]), base.batch, 4,
                           base.val_loss)
    with pytest.raises(ValueError, match=r"\['scale'\] set the initial weights"):
        hg.ImplicitDiff().hypergradient(init, init.init_raw())
    bn = digits_case("sgd", "loss_param", batchnorm=True, **SMALL)
    with pytest.raises(NotImplementedError, match="BatchNorm running statistics"):
        hg.ImplicitDiff().hypergradient(bn, bn.init_raw())


def test_loss_steps_average_the_batches() -> None:
    """With mini-batches, loss_steps makes the objective the mean over those steps' batches;
    a loss parameter of the training loss is accepted (warning: not converged here)."""
    problem = digits_case("sgd", "loss_param", **SMALL)
    lam = problem.init_raw()
    m = hg.ImplicitDiff(hg.methods.CG(maxiter=5), loss_steps=range(3, 6), grad_tol=1e9)
    loss = m.objective(problem, problem.run(lam).buffers)
    s = problem.run(lam)
    want = sum(problem.train_objective(s.params, s.buffers, lam, t, problem.batch(t))[0]
               for t in (3, 4, 5)) / 3
    want = want + sum(0.5e-3 * (w * w).sum() for w in s.params.values())  # sgd's constant L2
    torch.testing.assert_close(loss(s.params, lam), want, rtol=1e-14, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverNotConvergedWarning)
        r = m.hypergradient(problem, lam)
    assert torch.isfinite(r.grad).all()
    with pytest.raises(ValueError, match="loss_steps reach step 9 but the problem has steps=6"):
        hg.ImplicitDiff(loss_steps=[9]).hypergradient(problem, lam)


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="solver must be a LinearSolver"):
        hg.ImplicitDiff("cg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"loss_steps=\[\] must be None"):
        hg.ImplicitDiff(loss_steps=[])
    with pytest.raises(ValueError, match="maxiter=0 must be an int >= 1"):
        hg.methods.CG(maxiter=0)
    with pytest.raises(ValueError, match="alpha=-1 must be None"):
        hg.methods.Neumann(alpha=-1)
    with pytest.raises(ValueError, match=r"momentum=1.0 must be in \[0, 1\)"):
        hg.methods.FixedPoint(momentum=1.0)


def test_val_loss_hyperparameters_get_their_direct_term() -> None:
    """A hyperparameter only the validation loss reads: implicit = direct term = forward."""
    base = l2_mlp_case(300)
    hps = hg.HyperParams([hg.PerTensor("l2", 0.1, transform="log"), hg.Scalar("t", 1.5)])

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return base.val_loss(m, hp) * hp["t"] + F.softplus(hp["t"])

    problem = hg.InnerProblem(base.fmodel.module, base.train_loss, base.optimizer, hps,
                              base.batch, 300, val_loss)
    lam = problem.init_raw()
    imp = hg.ImplicitDiff(hg.methods.CG(maxiter=300)).hypergradient(problem, lam)
    assert rel_err(imp.grad, hg.ForwardMode().hypergradient(problem, lam).grad) <= 1e-3


def test_per_example_weights_of_a_converged_softmax_regression() -> None:
    """Data hyper-cleaning's hyperparameters (one weight per example, K = 64) on an
    L2-regularised softmax regression trained to convergence: implicit = reverse mode."""
    from torch import nn

    from hypergrad.tasks import digits_data

    data = digits_data(64, 100, 1, seed=0, dtype=torch.float64)
    torch.manual_seed(0)
    idx = torch.arange(64)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, i = batch
        ce = F.cross_entropy(m(x), y, reduction="none")
        return (hp["w"][i] * ce).mean() + 0.05 * (m.params["weight"] ** 2).sum()

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(data.x_val), data.y_val)

    problem = hg.InnerProblem(
        nn.Linear(64, 10).double(), train_loss, hg.optim.sgd(lr=0.5, momentum=0.9),
        hg.HyperParams([hg.PerExample("w", 0.8, n=64, transform="logit")]),
        [(data.x_train, data.y_train, idx)], 400, val_loss)
    lam = problem.init_raw()
    imp = hg.ImplicitDiff().hypergradient(problem, lam)
    rev = hg.ReverseMode(checkpoint="sqrt").hypergradient(problem, lam)
    assert imp.info is not None and imp.info["converged"]
    assert rel_err(imp.grad, rev.grad) <= 1e-6


@pytest.mark.parametrize("solver", [hg.methods.Neumann, hg.methods.FixedPoint])
def test_a_step_too_large_for_the_hessian_is_named_not_blamed_on_maxiter(solver: type) -> None:
    """Neumann / FixedPoint with alpha above 2 / lambda_max diverge (here -5.7e24 against a
    closed form of 9e-4); the warning said to raise maxiter, which diverges further. It now
    names the bound from this Hessian and the fix."""
    p, _ = ridge_diabetes_case(2000)
    with pytest.warns(SolverNotConvergedWarning, match=r"the residual grew: alpha=1 is too large "
                                                       r"for this Hessian, whose largest "
                                                       r"eigenvalue is about 4\.\d+.*alpha < 2 "
                                                       r"/ lambda_max = 0\.4\d+\. Give "
                                                       r"alpha=None"):
        hg.ImplicitDiff(solver(maxiter=50, alpha=1.0)).hypergradient(p, p.init_raw())
    with warnings.catch_warnings():  # a converging alpha says nothing of the kind
        warnings.simplefilter("error", SolverNotConvergedWarning)
        hg.ImplicitDiff(solver(maxiter=3000, alpha=0.3, tol=1e-8)).hypergradient(p, p.init_raw())


def test_a_singular_hessian_with_no_solution_is_refused_not_returned() -> None:
    """Over-parameterised least squares (30 weights, 10 examples, no L2): the Hessian is
    singular and grad_w E has a part in its null space, so H v = grad_w E has no solution. CG
    returned -3.9e17 (the exact hypergradient: 0.27), its later steps along zero curvature, with
    a warning telling to use CG() and train in float64; it now refuses, naming the singular
    Hessian and the fixes."""
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(10, 30, generator=gen, dtype=torch.float64),
            torch.randn(10, generator=gen, dtype=torch.float64))
    xv, yv = (torch.randn(40, 30, generator=gen, dtype=torch.float64),
              torch.randn(40, generator=gen, dtype=torch.float64))
    model = torch.nn.Linear(30, 1, bias=False).double()
    torch.nn.init.zeros_(model.weight)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        return 0.5 * (m(batch[0])[:, 0] - batch[1] - hp["shift"]).pow(2).mean()

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return 0.5 * (m(xv)[:, 0] - yv).pow(2).mean()

    lmax = float(torch.linalg.eigvalsh(x.T @ x / 10)[-1])
    problem = hg.InnerProblem(model, train_loss, hg.optim.sgd(lr=1 / lmax),
                              hg.HyperParams([hg.Scalar("shift", 0.3)]), [(x, y)], 300, val_loss)
    lam = problem.init_raw()
    exact = hg.ReverseMode().hypergradient(problem, lam).grad
    assert abs(float(exact[0]) - 0.27) < 0.01
    with pytest.raises(ValueError, match=r"CG\(maxiter=100, tol=1e-10\) stopped after \d+ "
                                         r"iterations on curvature .* the Hessian of the training "
                                         r"loss is singular .*Add an L2 term"):
        hg.ImplicitDiff().hypergradient(problem, lam)
    # with an L2 term it is defined, and CG's warning never tells to use CG() or float64
    l2 = hg.InnerProblem(model, train_loss, hg.optim.sgd(lr=1 / (lmax + 0.1), weight_decay=0.1),
                         hg.HyperParams([hg.Scalar("shift", 0.3)]), [(x, y)], 300, val_loss)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        r = hg.ImplicitDiff(hg.methods.CG(maxiter=2)).hypergradient(l2, lam)
    text = [str(w.message) for w in said if w.category is SolverNotConvergedWarning]
    assert len(text) == 1 and "Raise maxiter, or check" in text[0], text
    assert "use CG()" not in text[0] and "float64" not in text[0]
    converged = hg.ImplicitDiff(hg.methods.CG(tol=1e-12)).hypergradient(l2, lam)
    assert rel_err(converged.grad, hg.ReverseMode().hypergradient(l2, lam).grad) < 1e-3
    assert r.info is not None and not r.info["converged"]


def test_loss_steps_that_are_not_whole_epochs_are_named() -> None:
    """loss_steps=range(T - n, T), as the docs said, with T = 42 and n = 4 shuffled batches per
    epoch spans two epochs: 11 of the 64 examples read twice and 11 never, their per-example
    hypergradients exactly 0, with no word. The warning now names the last whole epoch."""
    from hypergrad.data import MiniBatches
    from hypergrad.tasks import digits_data

    data = digits_data(64, 64, 1, seed=0, dtype=torch.float64)
    torch.manual_seed(0)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, i = batch
        return (hp["w"][i] * F.cross_entropy(m(x), y, reduction="none")).mean()

    problem = hg.InnerProblem(
        torch.nn.Linear(64, 10).double(), train_loss, hg.optim.sgd(lr=0.5, weight_decay=0.05),
        hg.HyperParams([hg.PerExample("w", 0.8, n=64, transform="logit")]),
        MiniBatches(data.x_train, data.y_train, batch_size=16, seed=3), 42,
        lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))
    lam = problem.init_raw()

    def told(steps: range) -> tuple[list[str], torch.Tensor]:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            r = hg.ImplicitDiff(loss_steps=steps, grad_tol=1e9).hypergradient(problem, lam)
        return [str(w.message) for w in said if w.category is InnerNotConvergedWarning], r.grad

    said, g = told(range(38, 42))
    assert len(said) == 1, said
    assert ("loss_steps=range(38, 42) are not whole epochs of the 4 batches per epoch" in said[0]
            and "e.g. loss_steps=range(36, 40), the last whole epoch" in said[0]), said
    never = int(said[0].split(" of 64 never")[0].rsplit("(", 1)[1])
    assert never > 0 and int((g == 0).sum()) == never
    said, g = told(range(36, 40))
    assert said == [] and int((g == 0).sum()) == 0
    said, _ = told(range(32, 40))  # two whole epochs
    assert said == []


def test_loss_steps_that_are_not_whole_passes_of_batches_in_order_are_named() -> None:
    """MiniBatches(shuffle=False) with 3 batches per epoch and loss_steps of 8 steps: some
    examples counted 3 times, others twice, and no word (the coverage check returned early for
    any unshuffled source); only "train longer", which cannot mend the objective (the implicit
    probe, 2026-12-07). Any 3 steps in a row are one whole pass."""
    from hypergrad.data import MiniBatches
    from hypergrad.tasks import digits_data

    data = digits_data(48, 48, 1, seed=0, dtype=torch.float64)
    torch.manual_seed(0)
    problem = hg.InnerProblem(
        torch.nn.Linear(64, 10).double(),
        lambda m, batch, hp: F.cross_entropy(m(batch[0]), batch[1]),
        hg.optim.sgd(lr=0.5, weight_decay="wd"), hg.HyperParams([hg.Scalar("wd", 0.05)]),
        MiniBatches(data.x_train, data.y_train, batch_size=16, shuffle=False), 40,
        lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))
    lam = problem.init_raw()

    def told(steps: range) -> list[str]:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            hg.ImplicitDiff(loss_steps=steps, grad_tol=1e9).hypergradient(problem, lam)
        return [str(w.message) for w in said if w.category is InnerNotConvergedWarning]

    said = told(range(32, 40))
    assert len(said) == 1, said
    assert ("loss_steps=range(32, 40) are not whole passes of the 3 batches per epoch "
            "(MiniBatches reads them in order), so they read the training examples from 2 to 3 "
            "times" in said[0] and "e.g. loss_steps=range(37, 40), the last whole pass"
            in said[0]), said
    assert told(range(34, 40)) == [] and told(range(35, 38)) == []


@pytest.mark.parametrize("shuffle,drop_last,steps,expect", [
    (True, False, range(7, 12), "loss_steps=range(7, 12) are not whole epochs of the "
                                "DataLoader's 5 batches per epoch (its sampler shuffles each "
                                "epoch)"),
    (True, False, range(5, 10), None),
    (True, False, range(0, 10), None),
    (False, False, range(7, 12), None),  # in order: any 5 steps in a row are one pass
    (False, False, range(6, 12), "are not whole epochs of the DataLoader's 5 batches per epoch "
                                 "(read in order)"),
    (True, True, range(4, 8), "the DataLoader drops 2 of its 22 examples from every epoch"),
])
def test_loss_steps_over_a_dataloader_are_judged_as_epochs(
        shuffle: bool, drop_last: bool, steps: range, expect: str | None) -> None:
    """The implicit probe (2026-12-07): a shuffled DataLoader of 5 batches per epoch and
    loss_steps=range(T - 5, T) across two epochs: the 5 examples never read got per-example
    hypergradients of exactly 0 where reverse mode had up to 1.3e-4, with no word (only a
    MiniBatches source was checked); drop_last=True left each epoch's dropped examples out."""
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(22, 3, generator=g, dtype=torch.float64), torch.randn(22, generator=g,
                                                                             dtype=torch.float64)
    loader = DataLoader(TensorDataset(x, y, torch.arange(22)), batch_size=5, shuffle=shuffle,
                        drop_last=drop_last)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        xb, yb, i = batch
        return (hp["w"][i] * (m(xb).squeeze(-1) - yb) ** 2).mean()

    torch.manual_seed(0)
    problem = hg.InnerProblem(
        torch.nn.Linear(3, 1).double(), train_loss, hg.optim.sgd(lr=0.1, weight_decay=0.05),
        hg.HyperParams([hg.PerExample("w", 0.8, n=22, transform="logit")]), loader, 12,
        lambda m, hp: (m(x).squeeze(-1) - y).pow(2).mean())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        hg.ImplicitDiff(loss_steps=steps, grad_tol=1e9).hypergradient(problem,
                                                                      problem.init_raw())
    got = [str(w.message) for w in said if w.category is InnerNotConvergedWarning]
    if expect is None:
        assert got == []
    else:
        assert len(got) == 1 and expect in got[0], got


@pytest.mark.parametrize("solver", [hg.methods.CG(), hg.methods.Neumann(),
                                    hg.methods.FixedPoint()], ids=lambda s: type(s).__name__)
def test_a_validation_loss_flat_in_the_weights_is_solved_by_every_solver(
        solver: hg.methods.LinearSolver) -> None:
    """grad_w E = 0 (a validation loss that reads only the hyperparameter): Neumann and
    FixedPoint started their power iteration from the zero vector and refused the problem as
    "not at a minimum"; CG and forward mode gave the hypergradient (the implicit probe,
    2026-12-07)."""
    torch.manual_seed(0)
    x, y = torch.randn(50, 5, dtype=torch.float64), torch.randn(50, dtype=torch.float64)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        r = m(batch[0])[:, 0] - batch[1]
        return 0.5 * (r * r).mean() + 0.5 * hp["l2"] * (m.params["weight"] ** 2).sum()

    problem = hg.InnerProblem(
        torch.nn.Linear(5, 1, bias=False).double(), train_loss, hg.optim.sgd(lr=0.3),
        hg.HyperParams([hg.Scalar("l2", 0.1)]), [(x, y)], 300,
        lambda m, hp: (hp["l2"] - 1.0) ** 2 + 0.0 * m.params["weight"].sum())
    lam = problem.init_raw()
    r = hg.ImplicitDiff(solver).hypergradient(problem, lam)
    assert r.info is not None and r.info["converged"]
    assert torch.allclose(r.grad, torch.tensor([-1.8], dtype=torch.float64), rtol=1e-12)
    assert torch.allclose(r.grad, hg.ForwardMode().hypergradient(problem, lam).grad, rtol=1e-12)


def test_numpy_numbers_are_accepted_and_an_infinite_step_refused() -> None:
    """np.int64(50) was refused as 'must be an int >= 1' (a count from a NumPy grid); eps=inf
    gave a zero hypergradient without a word."""
    import numpy as np

    assert hg.methods.CG(maxiter=np.int64(50)).maxiter == 50
    assert type(hg.methods.CG(maxiter=np.int64(50)).maxiter) is int
    assert hg.ImplicitDiff(loss_steps=np.arange(3)).loss_steps == [0, 1, 2]
    assert hg.Online(interval=np.int64(5)).interval == 5
    assert hg.Offline(outer_steps=np.int32(3)).outer_steps == 3
    assert hg.MARTHE(mu=np.float32(0.5)).mu == 0.5
    assert type(hg.Schedule("lr", 0.1, windows=np.int64(4)).windows) is int
    assert type(hg.PerExample("w", 1.0, n=np.int64(5)).n) is int
    with pytest.raises(ValueError, match=r"eps=inf must be a finite number > 0"):
        hg.FiniteDifference(eps=float("inf"))
    with pytest.raises(ValueError, match=r"maxiter=np.int64\(0\) must be an int >= 1"):
        hg.methods.CG(maxiter=np.int64(0))
