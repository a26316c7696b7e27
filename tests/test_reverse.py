"""Unrolled reverse mode, the reference: its final state is plain training's, its objective the
validation loss there, and it agrees with forward mode at every horizon (float64). Truncated
reverse mode with k >= T is full reverse, with k < T forward mode reset at T - k; checkpointed
reverse mode is full reverse bit for bit with memory O(sqrt T); the mixed-mode step VJP equals
double backward."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fixtures import SMALL, mixed_problem, model_problem, small_cnn_problem
from torch.utils._pytree import tree_flatten

import hypergrad as hg
from hypergrad.testing import digits_case, rel_err


@pytest.mark.parametrize("opt,kind", [("nesterov", "schedule"), ("adamw", "per_tensor_wd")])
def test_final_state_and_objective_are_plain_trainings(opt: str, kind: str) -> None:
    problem = digits_case(opt, kind, **SMALL)
    lam = problem.init_raw()
    res = hg.ReverseMode().hypergradient(problem, lam)
    plain = problem.run(lam)
    for a, b in zip(tree_flatten(res.state)[0], tree_flatten(plain)[0], strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        value = problem.objective(plain.params, plain.buffers, lam)
    assert torch.equal(res.objective, value)


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_agrees_with_forward_at_every_horizon(steps: int) -> None:
    # horizons under an epoch read some examples at no step (said, and exactly 0 in both)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hg.errors.ZeroHypergradientWarning)
        problem = digits_case("momentum", "per_example", **{**SMALL, "steps": steps})
        problem.check(problem.init_raw())
    lam = problem.init_raw()
    rev = hg.ReverseMode().hypergradient(problem, lam).grad
    assert rel_err(rev, hg.ForwardMode().hypergradient(problem, lam).grad) <= 1e-12


def test_reverse_replays_the_steps_random_draws() -> None:
    """Reverse mode re-runs each step inside its VJP: with dropout, the same masks as the
    forward sweep (else the two would differentiate different functions)."""
    problem = model_problem("dropout_mlp")
    lam = problem.init_raw()
    a, b = (hg.ReverseMode().hypergradient(problem, lam).grad for _ in range(2))
    assert torch.equal(a, b)
    assert rel_err(a, hg.ForwardMode().hypergradient(problem, lam).grad) <= 1e-12


# -- truncated and checkpointed reverse mode, the step's VJP (issue 14) ---------------------------

@pytest.mark.parametrize("truncate", [6, 7, 100])
def test_truncated_with_k_at_least_T_is_full_reverse(truncate: int) -> None:
    problem = mixed_problem("momentum", 6, 3)
    lam = problem.init_raw()
    full = hg.ReverseMode().hypergradient(problem, lam).grad
    got = hg.ReverseMode(truncate=truncate).hypergradient(problem, lam).grad
    assert rel_err(got, full) <= 1e-12
    assert torch.equal(got, full)  # the same computation


@pytest.mark.parametrize("k", [1, 3])
def test_truncated_equals_forward_mode_reset_at_T_minus_k(k: int) -> None:
    """Truncation drops the adjoint before step T - k: the same as forward mode whose tangents
    are reset (RTHO's truncation) at step T - k."""
    problem = mixed_problem("adam", 6, 3)
    lam = problem.init_raw()
    fm = hg.ForwardMode()
    fs = fm.truncate(fm.run(problem, fm.init(problem, lam), lam, stop=problem.steps - k))
    _, want = fm.hypergradient_at(problem, fm.run(problem, fs, lam), lam)
    got = hg.ReverseMode(truncate=k).hypergradient(problem, lam).grad
    assert rel_err(got, want) <= 1e-12
    assert rel_err(got, hg.ReverseMode().hypergradient(problem, lam).grad) > 1e-3


@pytest.mark.parametrize("checkpoint,truncate", [(1, None), (2, None), (4, None), ("sqrt", None),
                                                 (100, None), (2, 5), ("sqrt", 4)])
def test_checkpointed_equals_full_reverse_bitwise(checkpoint: int | str,
                                                  truncate: int | None) -> None:
    """Recomputed segments are the stored states bit for bit, so the hypergradient is too."""
    problem = mixed_problem("nesterov", 7, 3)
    lam = problem.init_raw()
    ref = hg.ReverseMode(truncate=truncate).hypergradient(problem, lam)
    got = hg.ReverseMode(checkpoint=checkpoint, truncate=truncate).hypergradient(problem, lam)
    assert torch.equal(got.grad, ref.grad) and torch.equal(got.objective, ref.objective)
    for a, b in zip(tree_flatten(got.state)[0], tree_flatten(ref.state)[0], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["dropout_bn_mlp", "transformer_dropout"])
def test_checkpointed_recomputes_random_draws_and_batchnorm(name: str) -> None:
    problem = model_problem(name, steps=5)
    lam = problem.init_raw()
    full = hg.ReverseMode().hypergradient(problem, lam).grad
    assert torch.equal(hg.ReverseMode(checkpoint=2).hypergradient(problem, lam).grad, full)


def test_checkpointed_memory_grows_like_sqrt_T() -> None:
    """Peak memory (malloc's bytes in use, sampled) of T = 400 against T = 100: full reverse
    stores T + 1 states (4x), checkpointed reverse ~2 sqrt(T) (2x); measured 3.8x and 1.9x."""
    from hypergrad.measure import measure

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: one thread keeps the run short
    try:
        peaks = {}
        for steps in (100, 400):
            # hidden 64, momentum: a state of 77 KB, much more than one step's intermediates
            problem = digits_case("momentum", "lr", steps=steps, n_train=64, batch_size=8,
                                  hidden=64, n_val=32)
            lam = problem.init_raw()
            hg.ReverseMode().hypergradient(digits_case("momentum", "lr", steps=2, n_train=64,
                                                       batch_size=8, hidden=64, n_val=32), lam)
            for method in (hg.ReverseMode(), hg.ReverseMode(checkpoint="sqrt")):
                _, info = measure(lambda m=method, p=problem: m.hypergradient(p, lam))
                peaks[repr(method), steps] = info["peak_extra_bytes"]
    finally:
        torch.set_num_threads(threads)
    full = peaks["ReverseMode()", 400] / peaks["ReverseMode()", 100]
    ckpt = (peaks["ReverseMode(checkpoint='sqrt')", 400]
            / peaks["ReverseMode(checkpoint='sqrt')", 100])
    assert full >= 3.0, peaks
    assert ckpt <= 2.5, peaks
    assert peaks["ReverseMode(checkpoint='sqrt')", 400] * 4 < peaks["ReverseMode()", 400]


@pytest.mark.parametrize("make", [
    lambda: mixed_problem("adam", 5, 2),
    lambda: mixed_problem("momentum", 5, 2, batchnorm=True),
    lambda: model_problem("dropout_bn_mlp"),
    lambda: small_cnn_problem(),
], ids=["adam_mlp", "batchnorm", "dropout_bn", "cnn"])
def test_mixed_mode_step_vjp_equals_double_backward(make: Any) -> None:
    problem = make()
    lam = problem.init_raw()
    ref = hg.ReverseMode().hypergradient(problem, lam).grad
    got = hg.ReverseMode(step_vjp=hg.stepvjp.MixedMode()).hypergradient(problem, lam).grad
    assert rel_err(got, ref) <= 1e-12


def test_mixed_mode_falls_back_on_torch_mse_loss_bug() -> None:
    """F.mse_loss(reduction='mean') fails under forward-over-reverse (pytorch#123996, on the
    CPU and on CUDA: an H200 with torch 2.11): mixed mode warns once and takes those steps' VJPs
    by double backward; forward = reverse."""
    base = digits_case("momentum", "lr", **SMALL)
    device = base.init_raw().device
    onehot = torch.eye(10, dtype=torch.float64, device=device)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, _ = batch
        return F.mse_loss(m(x), onehot[y])

    problem = hg.InnerProblem(base.fmodel.module, train_loss, base.optimizer, base.hyperparams,
                              base.batch, base.steps, base.val_loss)
    lam = problem.init_raw()
    with pytest.warns(RuntimeWarning, match="pytorch#123996"):
        got = hg.ReverseMode(step_vjp=hg.stepvjp.MixedMode()).hypergradient(problem, lam).grad
    assert rel_err(got, hg.ReverseMode().hypergradient(problem, lam).grad) <= 1e-12


def test_reverse_mode_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"truncate=0 must be None or an int >= 1"):
        hg.ReverseMode(truncate=0)
    with pytest.raises(ValueError, match=r"checkpoint='log'; use None .*'sqrt'"):
        hg.ReverseMode(checkpoint="log")
    with pytest.raises(ValueError, match=r"checkpoint=2.5 must be None or an int"):
        hg.ReverseMode(checkpoint=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step_vjp must be a StepVJP"):
        hg.ReverseMode(step_vjp="mixed")  # type: ignore[arg-type]
    m = hg.ReverseMode(checkpoint="sqrt", truncate=50)
    assert (m.horizon(400), m.segment(400), m.stored_states(400)) == (50, 8, 7 + 8 + 1)
    assert hg.ReverseMode().stored_states(10) == 11


def test_reverse_mode_takes_numpy_integers() -> None:
    import numpy as np

    m = hg.ReverseMode(truncate=np.int64(3), checkpoint=np.int32(2))
    assert (m.truncate, m.checkpoint) == (3, 2) and type(m.truncate) is int
    # numpy 2 prints np.int64(0), numpy 1 prints 0 (pyproject: numpy>=1.24)
    with pytest.raises(ValueError,
                       match=r"truncate=(np.int64\(0\)|0) must be None or an int >= 1"):
        hg.ReverseMode(truncate=np.int64(0))


def test_truncate_at_or_past_the_horizon_runs_as_exact_reverse_mode() -> None:
    """truncate >= T is full reverse mode (documented), but its run was recorded as truncated:
    a resume with ForwardMode() was refused (method.truncate: 7 -> '<absent>') and
    results.json called it approximate."""
    p = digits_case("momentum", "lr", **{**SMALL, "steps": 7})
    messages: list[str] = []

    class Said(hg.run.callbacks.Callback):
        def on_message(self, trainer: Any, text: str) -> None:
            messages.append(text)

    tr = hg.Trainer(p, method=hg.ReverseMode(truncate=7, checkpoint=2), callbacks=[])
    tr2 = hg.Trainer(p, method=hg.ReverseMode(truncate=50), callbacks=[Said()])
    for t in (tr, tr2):
        assert type(t.method) is hg.ReverseMode and t.method.truncate is None
        assert t.method.fingerprint() == {}
    assert tr.method.checkpoint == 2
    assert any("with truncate=50 >= T = 7 steps is full reverse mode (exact): ran "
               "ReverseMode()" in m for m in messages), messages
    lam = p.init_raw()
    assert torch.equal(tr.method.hypergradient(p, lam).grad,
                       hg.ReverseMode(truncate=7).hypergradient(p, lam).grad)


def test_truncated_reverse_warns_of_schedule_windows_it_never_reaches() -> None:
    """With a 3-window schedule over T = 9 and truncate=2, the first two windows' hypergradient
    is exactly 0 and tuning never moved them, with no word (initial weights are refused for
    the same reason)."""
    p = digits_case("sgd", "schedule", **{**SMALL, "steps": 9, "windows": 3})
    with pytest.warns(hg.errors.ZeroHypergradientWarning,
                      match=r"ReverseMode\(truncate=2\): the last 2 of T = 9 steps it "
                            r"backpropagates do not read lr's windows 0-1 of 3 \(steps 0-5\): "
                            r"their hypergradient is exactly 0"):
        hg.Trainer(p, method=hg.ReverseMode(truncate=2), callbacks=[])
    g = hg.ReverseMode(truncate=2).hypergradient(p, p.init_raw()).grad  # the claim holds
    assert torch.equal(g[:2], torch.zeros(2, dtype=g.dtype)) and bool(g[2] != 0)
    with pytest.warns(hg.errors.ZeroHypergradientWarning, match=r"lr's window 0 of 3 "
                                                                r"\(steps 0-2\)"):
        hg.Trainer(p, method=hg.ReverseMode(truncate=4), callbacks=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hg.Trainer(p, method=hg.ReverseMode(truncate=7), callbacks=[])  # reaches step 2
        hg.Trainer(digits_case("sgd", "lr", **{**SMALL, "steps": 9}),
                   method=hg.ReverseMode(truncate=2), callbacks=[])  # no schedule
