"""Forward mode: the work it skips gives the dense step's results (schedule columns that have not
started, the optimizer's hyperparameter term on its own columns only), hypergradients at any
step, the objective's direct term, frozen parameters and per-tensor defaults (float64)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fixtures import SMALL, TINY, mixed_problem
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.methods import forward as fwd
from hypergrad.testing import OPTIMIZERS, digits_case, rel_err


@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("steps,windows", [(6, 3), (5, 8), (7, 4)])
def test_skipping_columns_equals_dense(opt: str, steps: int, windows: int) -> None:
    problem = mixed_problem(opt, steps, windows)
    lam = problem.init_raw()
    if windows > steps:  # windows no step reads: refused up front since issue 23
        with pytest.raises(ValueError, match=r"windows=8 but steps=5: windows \[2, 5, 7\] are "
                                             r"read by no step"):
            hg.ForwardMode().hypergradient(problem, lam)
        return
    skip = hg.ForwardMode().hypergradient(problem, lam).grad
    dense = hg.ForwardMode(skip_zero_columns=False).hypergradient(problem, lam).grad
    torch.testing.assert_close(skip, dense, rtol=1e-12, atol=1e-15)
    rev = hg.ReverseMode().hypergradient(problem, lam).grad
    assert rel_err(skip, rev) <= 1e-9


def test_skipping_with_batchnorm_and_the_loop() -> None:
    problem = mixed_problem("momentum", 6, 3, batchnorm=True)
    lam = problem.init_raw()
    a = hg.ForwardMode(hg.hvp.ColumnLoop()).hypergradient(problem, lam).grad
    dense = hg.ForwardMode(hg.hvp.ColumnLoop(), skip_zero_columns=False)
    b = dense.hypergradient(problem, lam).grad
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    assert rel_err(a, hg.ReverseMode().hypergradient(problem, lam).grad) <= 1e-9


def test_columns_stay_exactly_zero_until_their_window() -> None:
    problem = digits_case("nesterov", "schedule", steps=8, windows=4, **TINY)
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
    problem = digits_case("momentum", "schedule", steps=6, windows=3, **TINY)
    lam = problem.init_raw()
    g = torch.Generator().manual_seed(1)
    fs0 = hg.ForwardMode().init(problem, lam)
    fs0 = fs0._replace(tangents=tree_map(
        lambda v: torch.randn(v.shape, generator=g, dtype=v.dtype).to(v), fs0.tangents))
    a = hg.ForwardMode().step(problem, fs0, lam)
    b = hg.ForwardMode(skip_zero_columns=False).step(problem, fs0, lam)
    for x, y in zip(tree_flatten(a.tangents)[0], tree_flatten(b.tangents)[0]):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)


def test_a_tangent_row_set_in_place_after_a_step_is_not_taken_as_zero() -> None:
    """The state a step returned, a row of a window not yet started then set in place: the
    next step trusted its memo of zero rows (the same tensors) and overwrote the row with
    zeros (the intermediate-steps probe: 0.0 where a copy of the same state gave 1.02)."""
    problem = digits_case("momentum", "schedule", steps=6, windows=3, **TINY)
    lam = problem.init_raw()
    m = hg.ForwardMode()
    fs = m.step(problem, m.init(problem, lam), lam)  # window 2 starts at step 4

    def set_row(state: Any) -> None:
        for v in state.tangents.params.values():
            v[2].fill_(1e-3)

    copied = fs._replace(tangents=tree_map(torch.clone, fs.tangents))
    set_row(fs)
    set_row(copied)
    a = m.step(problem, fs, lam)
    b = hg.ForwardMode(skip_zero_columns=False).step(problem, copied, lam)
    assert float(a.tangents.params["0.weight"][2].abs().sum()) > 0
    for x, y in zip(tree_flatten(a.tangents)[0], tree_flatten(b.tangents)[0]):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)


def test_a_step_past_the_horizon_is_refused() -> None:
    """ForwardMode.step (and HD's, MARTHE's) at step T went on: the schedule read its last
    window again and schedule-free AdamW trained from its averaged point, and the
    hypergradients of that other run were returned without a word (run(stop=T + 1) was
    refused)."""
    problem = digits_case("momentum", "schedule", steps=3, windows=3, **TINY)
    lam = problem.init_raw()
    for m in (hg.ForwardMode(), hg.MARTHE(0.9), hg.HD()):
        run = m.run(problem, m.init(problem, lam), lam)
        assert run.step == 3
        with pytest.raises(ValueError, match=r"step: the run is at step 3, the end of the "
                                             r"problem's horizon T = 3"):
            m.step(problem, run, lam)


def test_plan_reads_schedule_windows() -> None:
    problem = mixed_problem("momentum", steps=8, windows=4)  # lr: columns 0..3, mom: 4, wd: 5..
    plan = fwd.ColumnPlan(problem)
    assert plan.first_read[:4] == [0, 2, 4, 6]
    assert plan.first_read[4:] == [0] * (problem.num_hyperparams - 4)
    assert plan.not_started(3) == [2, 3]
    n_wd = len(problem.fmodel.param_names)
    assert plan.optimizer_columns(5) == [2, 4, *range(5, 5 + n_wd)]
    never = fwd.ColumnPlan(mixed_problem("momentum", steps=3, windows=8))  # windows 8 > T = 3
    assert never.first_read[:8] == [0, 3, 1, 3, 3, 2, 3, 3]  # 3: read by no step


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
        hg.optim.sgd(lr="lr", momentum=0.9, weight_decay="wd"), hps,
        MiniBatches(x, y, batch_size=8), 6, lambda m, hp: F.cross_entropy(m(x), y))
    lam = problem.init_raw()
    a = hg.ForwardMode().hypergradient(problem, lam).grad
    b = hg.ReverseMode().hypergradient(problem, lam).grad
    assert rel_err(a, b) <= 1e-10


def test_hypergradient_at_any_step() -> None:
    """Forward mode's hypergradient after t steps equals reverse mode over a horizon of t."""
    long = digits_case("momentum", "per_tensor_wd", **{**SMALL, "steps": 9})
    short = digits_case("momentum", "per_tensor_wd", **{**SMALL, "steps": 4})
    lam = long.init_raw()
    fm = hg.ForwardMode()
    fs = fm.run(long, fm.init(long, lam), lam, stop=4)
    assert fs.step == 4
    value, grad = fm.hypergradient_at(long, fs, lam)
    ref = hg.ReverseMode().hypergradient(short, lam)
    assert rel_err(grad, ref.grad) <= 1e-12
    torch.testing.assert_close(value, ref.objective, rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match=r"stop=13 must be a step in 0..T = 9"):
        fm.run(long, fm.init(long, lam), lam, stop=13)  # went on with the last window's values
    with pytest.raises(ValueError, match=r"stop=2 is before the run's step 4"):
        fm.run(long, fs, lam, stop=2)
    assert fm.run(long, fm.init(long, lam), lam, stop=np.int64(4)).step == 4


def test_direct_term_of_the_objective() -> None:
    """A validation objective that reads the hyperparameters itself (here a penalty on the label
    smoothing) gets the direct term dE/dlam."""
    base = digits_case("adam", "loss_param", **SMALL)
    inner_val = base.val_loss

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return inner_val(m, hp) + 3.0 * hp["smooth"] ** 2

    problem = hg.InnerProblem(base.fmodel.module, base.train_loss, base.optimizer,
                              base.hyperparams, base.batch, base.steps, val_loss)
    lam = problem.init_raw()
    fwd = hg.ForwardMode().hypergradient(problem, lam).grad
    fd = hg.FiniteDifference().hypergradient(problem, lam).grad
    without = hg.ForwardMode().hypergradient(base, lam).grad
    assert rel_err(fwd, fd) <= 1e-6
    assert rel_err(without, fd) > 1e-2  # the direct term is not negligible here


def test_a_run_state_of_another_problem_is_refused_by_name() -> None:
    """A K = 37 state stepped with a K = 3 problem read its tangents as 3 rows, silently, and
    the other way round failed as torch's IndexError or a reshape error (the any-step
    probe)."""
    from fixtures import lr_momentum

    p3 = lr_momentum(steps=4)
    fwd = hg.ForwardMode()
    lam = p3.init_raw()
    run = fwd.init(p3, lam)
    wide = run._replace(tangents=tree_map(lambda v: torch.cat([v, v]), run.tangents))
    with pytest.raises(ValueError, match=r"ForwardMode.step: the run state's tangents have "
                                         rf"\[{2 * lam.shape[0]}\] rows but this problem has "
                                         rf"K = {lam.shape[0]} hyperparameters"):
        fwd.step(p3, wide, lam)
    with pytest.raises(ValueError, match=r"ForwardMode.hypergradient_at: the run state's "
                                         r"tangents"):
        fwd.hypergradient_at(p3, wide, lam)
    renamed = run._replace(state=run.state._replace(
        params={f"x.{k}": v for k, v in run.state.params.items()}))
    with pytest.raises(ValueError, match=r"the run state's parameters are not this problem's"):
        fwd.step(p3, renamed, lam)


@pytest.mark.parametrize("bug,error,match", [
    ("rows", ValueError, r"returned the tangent of .* with shape \(1, .*where it was given \(2, "),
    ("float32", TypeError, r"returned the tangent of '.*' in torch.float32, where it was given "
                           r"torch.float64: its tangent\(\) must keep each tangent's dtype"),
    ("tuple", TypeError, r"returned \(dict, tuple\) where it was given \(dict, Empty\): its "
                         r"tangent\(\) must return \(parameter tangents"),
    ("swapped", TypeError, r"returned \(Empty, dict\) where it was given \(dict, Empty\)"),
])
def test_a_closed_form_tangent_of_another_shape_is_named(bug: str, error: type,
                                                          match: str) -> None:
    """An inner optimizer's own tangent() that returned tangents of another shape was blamed
    on the caller's run state at the next step ("a state made by init() for another
    problem"), or failed in torch (the extending probe); another dtype failed in torch
    ("addmv input tensors must have the same dtype"), the state's tangent as a plain tuple in
    the user's own code a step later, the pair swapped as "unhashable type: 'dict'" (the
    extending probe, 2026-12-07)."""
    from typing import NamedTuple

    class Empty(NamedTuple):
        pass

    class Rows(hg.optim.Optimizer):
        hyper_args = ("lr",)
        options = ()

        def init(self, params: Any) -> Any:
            return Empty()

        def update(self, grads: Any, state: Any, params: Any, hp: Any, step: int) -> Any:
            return {k: w - self.read(self.args["lr"], hp, k) * grads[k]
                    for k, w in params.items()}, state

        def tangent(self, ctx: Any, new_params: Any, new_state: Any) -> Any:
            z = {k: z[:1] if bug == "rows" else z.float() if bug == "float32" else z
                 for k, z in ctx.z_params.items()}
            return {"tuple": (z, ()), "swapped": (Empty(), z)}.get(bug, (z, Empty()))

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,))
    torch.manual_seed(0)
    p = hg.InnerProblem(nn.Linear(4, 3).double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        Rows(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log"),
                                                       hg.Scalar("s", 0.5)]),
                        [(x, y)], 3, lambda m, hp: F.cross_entropy(m(x), y) * (1 + hp["s"]))
    with pytest.raises(error, match=r"ForwardMode: the tangent rule of .* " + match):
        hg.ForwardMode(tangent=hg.tangent.ClosedForm()).hypergradient(p, p.init_raw())


def test_a_per_parameter_mapping_on_a_fixed_setting_is_refused_when_built() -> None:
    """It was accepted and failed mid-run with torch's "unsupported operand type(s) for +:
    'Tensor' and 'dict'" (the extending probe)."""

    class Eps(hg.optim.Optimizer):
        hyper_args = ("lr",)
        options = ("eps",)

        def init(self, params: Any) -> Any:
            return ()

        def update(self, grads: Any, state: Any, params: Any, hp: Any, step: int) -> Any:
            return params, state

    with pytest.raises(ValueError, match=r"eps=.* is a per-parameter mapping, but 'eps' is one "
                                         r"of its fixed settings"):
        Eps(lr=0.1, eps={r"bias$": 1.0, r".*": 1e-8})


def test_skipping_columns_reads_nothing_back_from_the_device_per_step() -> None:
    """The rows skipped while a schedule's windows have not started were read back from the
    device (``live.tolist()`` twice and ``int(idx[-1])`` twice a step): on CUDA each is a
    sync (the CUDA review, 2026-12-07). Counted here on the CPU by where they are called."""
    import sys

    from torch.overrides import TorchFunctionMode

    class Reads(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            name = getattr(func, "__name__", "")
            if name in ("tolist", "__int__", "item", "__index__") and sys._getframe(
                    1).f_code.co_filename.endswith("forward.py"):
                self.n += 1
            return func(*args, **(kwargs or {}))

    problem = mixed_problem("sgd", 6, 3)
    lam = problem.init_raw()
    fwd = hg.ForwardMode()
    fwd.hypergradient(problem, lam)  # warm: the one-time checks
    reads = Reads()
    with reads:
        got = fwd.hypergradient(problem, lam).grad
    assert reads.n == 0
    dense = hg.ForwardMode(skip_zero_columns=False).hypergradient(problem, lam).grad
    torch.testing.assert_close(got, dense, rtol=1e-12, atol=1e-15)
