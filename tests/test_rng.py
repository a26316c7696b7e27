"""Randomness is part of the step's contract: every evaluation of step t draws from a generator
state fixed by (run seed, t); the caller's generator is left alone; a user's own noise in the
loss is differentiated consistently; a loss that draws nothing takes torch's fused kernels in
plain steps; attention with dropout is detected once."""

from __future__ import annotations

import torch
from fixtures import model_problem, tiny_lm

import hypergrad as hg
from hypergrad.rng import step_seed
from hypergrad.testing import hypergradcheck, rel_err


def test_user_noise_in_the_loss_draws_per_step_and_agrees() -> None:
    problem = model_problem("dropout_mlp", noise=True)
    rep = hypergradcheck(problem, strategies=[hg.hvp.ColumnLoop()])
    assert rep.max("fwd_vs_rev") <= 1e-10 and not rep.fd_unreliable


def test_step_draws_leave_the_callers_generator_alone() -> None:
    problem = model_problem("dropout_mlp")
    lam = problem.init_raw()
    torch.manual_seed(123)
    hg.ForwardMode().hypergradient(problem, lam)
    problem.run(lam)
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), after)


def test_another_run_seed_draws_other_masks() -> None:
    a, b = model_problem("dropout_mlp"), model_problem("dropout_mlp")
    b.seed = 7
    lam = a.init_raw()
    ga, gb = (hg.ForwardMode().hypergradient(p, lam).grad for p in (a, b))
    assert rel_err(ga, gb) > 1e-3


def test_plain_steps_of_a_model_without_draws_use_eager_autograd() -> None:
    problem = model_problem("lstm")
    lam = problem.init_raw()
    problem.run(lam)
    assert problem.draws is False  # so plain steps take torch.autograd.grad (fused kernels)




def test_step_seeds_differ_across_steps_and_runs() -> None:
    seeds = {step_seed(s, t) for s in range(4) for t in range(-1, 50)}
    assert len(seeds) == 4 * 51 and all(0 <= x < 2**63 for x in seeds)


def test_attention_dropout_is_found_on_the_first_plain_step() -> None:
    """Plain steps of a loss that draws go through torch.func; attention with dropout then takes
    the math kernel in them too (the kernels draw different masks). A loss that draws nothing
    takes eager autograd and the fused kernels."""
    with_dropout, mlp_dropout = model_problem("transformer_dropout"), model_problem("dropout_mlp")
    for p, expect in ((with_dropout, True), (mlp_dropout, False)):
        p.run(p.init_raw(), stop=1)
        assert p.draws is True and p.attention_dropout is expect
    without = model_problem("transformer")
    without.run(without.init_raw(), stop=1)
    assert without.draws is False


def test_plain_steps_that_draw_take_eager_autograd_where_it_draws_the_same() -> None:
    """A loss that draws: the first plain step compares eager autograd with torch.func; where
    they agree bit for bit (dropout of a tensor in logical order) later plain steps take eager
    autograd and the run is the torch.func run bit for bit; where they do not
    (nn.TransformerEncoderLayer drops out a transposed tensor), plain steps stay on
    torch.func."""
    mlp = model_problem("dropout_mlp")
    lam = mlp.init_raw()
    mlp.run(lam, stop=2)
    assert mlp.draws is True and mlp.eager_draws is True
    eager = mlp.run(lam)
    mlp.eager_draws = False  # torch.func at every step
    func = mlp.run(lam)
    for got, want in zip((eager.params, *eager.opt), (func.params, *func.opt), strict=True):
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in got)
    transformer = model_problem("transformer_dropout")
    transformer.run(transformer.init_raw(), stop=2)
    assert transformer.draws is True and transformer.eager_draws is False


def _late_dropout(warm: int, until: int = 5) -> hg.InnerProblem:
    """Dropout of a transposed tensor (memory order is not logical order), switched on from
    step ``warm`` to ``until`` by a flag in the batch (an augmentation warm-up)."""
    import torch.nn.functional as F

    from hypergrad.tasks import digits_data

    data = digits_data(n_train=64, n_val=50, dtype=torch.float64)

    class Source:
        seed = 0

        def __call__(self, t: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
            i = torch.arange(16) + 16 * (t % 4)
            return data.x_train[i], data.y_train[i], warm <= t < until

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, on = batch
        return F.cross_entropy(m(F.dropout(x.t(), 0.3).t() if on else x), y)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 10)).double()
    return hg.InnerProblem(
        model, train_loss, hg.optim.sgd(lr="lr", momentum=0.9), hg.HyperParams(
            [hg.Scalar("lr", 0.1, "log")]), Source(), 5,
        lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))


def test_draws_that_start_after_step_0_are_the_same_in_every_method_and_run() -> None:
    """Dropout switched on at step 1: its first plain run drew step 1's masks by eager
    autograd (memory order), every later one by torch.func (logical order), so the first two
    runs differed (1.94386, 1.94542); and the eager-or-torch.func check, made at step 0 (no
    draws: equal), sent later plain steps to eager masks the differentiated passes never
    drew: forward mode 2.1e-3 from reverse mode, finite differences 6.5e-3 (the randomness
    probe, 2026-12-07)."""
    p = _late_dropout(1)
    lam = p.init_raw()
    first, second = p.run(lam), p.run(lam)
    assert all(torch.equal(first.params[k], second.params[k]) for k in first.params)
    q = _late_dropout(1)  # forward mode first: draws learned inside torch.func
    fwd = hg.ForwardMode().hypergradient(q, lam).grad
    rev = hg.ReverseMode().hypergradient(q, lam).grad
    fd = hg.FiniteDifference().estimate(q, lam)
    assert q.eager_draws is False
    assert rel_err(fwd, rev) < 1e-12 and rel_err(fwd, fd.grad) < 1e-8


def test_a_problems_first_plain_run_repeats_bit_for_bit() -> None:
    """The first plain step finds out whether attention draws dropout masks in the math
    kernel; where it does not, the step is computed again in the fused kernels every later
    plain step runs, so the first run at lam is every later run at lam, to the last bit."""
    p = tiny_lm("float32", steps=6).problem
    lam = p.init_raw()
    first, second = p.run(lam), p.run(lam)
    assert p.attention_dropout is False and p.eager_draws is True
    assert all(torch.equal(first.params[k], second.params[k]) for k in first.params)
