"""The outer loop: offline and online tuning, guards, method choice, checkpoint and resume."""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import pickle
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import Interrupt as _Interrupt
from fixtures import interrupt_after as _interrupt_after
from fixtures import lr_momentum, make_trainer

import hypergrad as hg
import hypergrad.run.callbacks
import hypergrad.run.trainer
from hypergrad import SignDescent, Trainer
from hypergrad.errors import (
    CheckpointError,
    CheckpointWarning,
    HypergradWarning,
    MemoryBudgetError,
    ResumeMismatchError,
    RunDirError,
    TuningWarning,
    ZeroHypergradientWarning,
)
from hypergrad.methods import choose_method, estimate_memory
from hypergrad.testing import digits_case

SMALL = dict(steps=8, n_train=32, batch_size=8, hidden=8, n_val=32)


def _trainer(**kw) -> Trainer:  # type: ignore[no-untyped-def]
    problem = kw.pop("problem", None) or digits_case("momentum", "schedule", **SMALL)
    return make_trainer(problem, **kw)


def test_offline_tuning_lowers_the_validation_loss() -> None:
    tr = _trainer(outer_steps=6, outer=functools.partial(torch.optim.Adam, lr=0.3))
    res = tr.fit()
    losses = [h["val_loss"] for h in res.history]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert set(res.values) == {"lr"} and len(res.values["lr"]) == 4  # 4 windows
    assert not res.diverged


def test_online_tuning_updates_every_interval_and_resets() -> None:
    problem = digits_case("momentum", "lr", **{**SMALL, "steps": 12})
    tr = _trainer(problem=problem, mode="online", interval=4, reset_tangents=True,
                  outer=functools.partial(torch.optim.SGD, lr=1.0))
    res = tr.fit()
    assert [h["inner_step"] for h in res.history] == [4, 8, 12]
    lrs = [h["hyperparams"]["lr"] for h in res.history]
    assert lrs[0] != lrs[1] != lrs[2]  # lam changed during the run
    assert tr.run_state is not None and tr.run_state.step == 12


def test_sign_descent_halves_on_flip() -> None:
    p = torch.zeros(2)
    opt = SignDescent([p], lr=1.0)
    for g in ([1.0, 1.0], [1.0, -1.0], [1.0, 1.0]):
        p.grad = torch.tensor(g)
        opt.step()
    # coordinate 0 never flips: 3 steps of 1; coordinate 1: -1, +0.5, -0.25
    assert p.tolist() == [-3.0, -0.75]


def test_sign_descent_with_a_schedule_preconditioner_steps_the_windows_together() -> None:
    from hypergrad.run.outer import schedule_smoothing

    P = schedule_smoothing(hg.HyperParams([hg.Schedule("lr", 0.1, windows=10)]).items, 0.2)
    assert P is not None
    jitter = torch.tensor([(-1.0) ** i for i in range(10)], dtype=torch.float64)
    g = 0.5 + jitter  # a positive trend under window-to-window jitter
    p = torch.zeros(10, dtype=torch.float64)
    p.grad = g.clone()
    SignDescent([p], lr=1.0).step()
    assert p.tolist() == (-torch.sign(g)).tolist()  # without it: every other window goes up
    p = torch.zeros(10, dtype=torch.float64)
    p.grad = g.clone()
    SignDescent([p], lr=1.0, precondition=P).step()
    assert p.tolist() == [-1.0] * 10  # with it: the trend, every window down
    with pytest.raises(ValueError, match=r"precondition of shape \(10, 10\) needs one"):
        SignDescent([torch.zeros(4)], precondition=P)


def test_bounds_project_in_value_space() -> None:
    tr = _trainer(outer_steps=3, bounds={"lr": [None, 0.12]},
                  outer=functools.partial(torch.optim.SGD, lr=100.0, maximize=True))
    with pytest.warns(TuningWarning, match="no outer step improved"):  # uphill on purpose
        res = tr.fit()
    assert max(res.last_values["lr"]) <= 0.12 + 1e-12
    assert res.values == res.history[0]["hyperparams"] and res.best_step == 0
    with pytest.raises(ValueError, match="bounds name 'nope' is not a hyperparameter"):
        _trainer(bounds={"nope": [0, 1]})
    with pytest.raises(ValueError, match="outside the domain of transform='log'"):
        _trainer(bounds={"lr": [-1.0, 1.0]})


def test_clip_norm_limits_the_step() -> None:
    kw = dict(outer_steps=1, outer=functools.partial(torch.optim.SGD, lr=1.0))
    a, b = _trainer(**kw), _trainer(clip_norm=1e-3, **kw)
    lam0 = a.lam.clone()
    a.fit(), b.fit()
    assert (b.lam - lam0).norm() <= 1e-3 + 1e-12 < (a.lam - lam0).norm()


def _linear_regression(steps: int = 200, dtype: torch.dtype = torch.float64, init: float = 0.01,
                       windows: int | None = None, scale: Any = None) -> hg.InnerProblem:
    """Least squares by GD on a learnable learning rate (a Scalar, or a Schedule of ``windows``);
    ``scale(hp["scale"])`` multiplies the loss when given (a second hyperparameter)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g, dtype=dtype)
    y = x @ torch.randn(4, generator=g, dtype=dtype)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(dtype)

    def loss(m, b, hp):  # type: ignore[no-untyped-def]
        out = ((m(b[0])[:, 0] - b[1]) ** 2).mean()
        return out if scale is None else out * (1 + scale(hp["scale"]))

    lr = (hg.Scalar("lr", init, transform="log") if windows is None else
          hg.Schedule("lr", init, windows=windows, transform="log"))
    items = [lr] if scale is None else [lr, hg.Scalar("scale", 0.5)]
    return hg.InnerProblem(model, loss, hg.optim.sgd(lr="lr"), hg.HyperParams(items),
                           [(x, y)], steps, lambda m, hp: loss(m, (x, y), hp))


def test_divergence_stops_and_keeps_last_good() -> None:
    logs: list[str] = []
    # an outer step so large that the inner learning rate passes 2/L: training overflows
    tr = _trainer(problem=_linear_regression(), outer_steps=5, log=logs.append,
                  outer=functools.partial(torch.optim.SGD, lr=3e3))
    res = tr.fit()
    assert res.diverged and "diverged" in res.message and "Try a smaller" in res.message
    assert logs and logs[-1] == "[hypergrad] " + res.message
    assert len(res.history) == 1  # outer step 0 was fine, step 1 diverged
    good = res.history[0]["hyperparams"]["lr"]
    assert res.values["lr"] == pytest.approx(good) and good == pytest.approx(0.01)
    assert "of outer step 0" in res.message


@pytest.mark.parametrize("k,t,expect", [(1, 50, "forward"), (64, 50, "reverse")])
def test_auto_method_choice(k: int, t: int, expect: str) -> None:
    kind = "lr" if k == 1 else "per_example"
    problem = digits_case("momentum", kind, **{**SMALL, "steps": t, "n_train": max(k, 8)})
    name, why = choose_method(problem)
    assert name == expect and f"K={k}" in why
    with pytest.raises(MemoryBudgetError, match="no exact method fits"):
        choose_method(problem, memory_budget=1.0)
    assert choose_method(problem, mode="online")[0] == "forward"
    logs: list[str] = []
    tr = _trainer(problem=problem, method="auto", log=logs.append)
    assert f"chose {expect}" in logs[0]
    assert isinstance(tr.method, hg.ForwardMode if expect == "forward" else hg.ReverseMode)


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_resume_equals_uninterrupted(mode: str, tmp_path: Path) -> None:
    def mk(run_dir: Path, resume: bool = False, evaluate=None) -> Trainer:  # type: ignore[no-untyped-def]
        return _trainer(
            problem=digits_case("adam", "per_tensor_wd", **{**SMALL, "steps": 12}),
            mode=mode, interval=3, outer_steps=4, run_dir=run_dir, resume=resume,
            evaluate=evaluate, outer=functools.partial(torch.optim.Adam, lr=0.1))

    full = mk(tmp_path / "full").fit()
    with pytest.raises(_Interrupt):  # dies during its 3rd update, after 2 checkpoints
        mk(tmp_path / "part", evaluate=_interrupt_after(2)).fit()
    ck = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)
    assert ck["outer_step"] == 2
    resumed = mk(tmp_path / "part", resume=True).fit()
    assert torch.equal(resumed.lam, full.lam)
    assert [h["val_loss"] for h in resumed.history] == [h["val_loss"] for h in full.history]
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["outer_step"] for x in lines] == [0, 1, 2, 3]


def test_checkpoint_loads_with_weights_only(tmp_path: Path) -> None:
    _trainer(outer_steps=1, run_dir=tmp_path).fit()
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ck["outer_step"] == 1 and ck["lam"].dtype == torch.float64


def test_tensorboard_logs_named_hyperparameters_and_the_learned_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _trainer(outer_steps=2, run_dir=tmp_path, tensorboard=True).fit()
    runs = sorted(p for p in (tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert runs
    scalars: set[str] = set()
    for path in runs:
        acc = EventAccumulator(str(path.parent))
        acc.Reload()
        scalars |= set(acc.Tags()["scalars"])
    # SMALL: 8 steps, a schedule of 4 windows (digits_case's "schedule" kind)
    assert {"val_loss", "hypergrad_norm", "hyperparams/lr[steps 0-1]",
            "hyperparams/lr[steps 6-7]"} <= scalars, scalars
    assert "outer_step" not in scalars and "hparam/learned_val_loss" in scalars
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install hypergrad-forward\[tensorboard\]"):
        hg.run.TensorBoard()


# -- issue 12: no silent wrong hyperparameters ---------------------------------------------------
class _Scaled(hg.Method):
    """Forward mode with every hypergradient entry replaced by ``entry``: finite entries whose
    squares overflow float32 (the issue's ~1e29)."""

    name = "forward"

    def __init__(self, entry: float) -> None:
        self.entry = entry

    def hypergradient(self, problem: hg.InnerProblem, lam: torch.Tensor) -> hg.HyperGradient:
        r = hg.ForwardMode().hypergradient(problem, lam)
        return hg.HyperGradient(r.objective, torch.full_like(r.grad, self.entry), r.state)


def test_a_hypergradient_whose_norm_overflows_stops_the_run() -> None:
    p = _linear_regression(20, torch.float32, windows=2)
    res = _trainer(problem=p, method=_Scaled(1e29), outer_steps=3).fit()
    # before: Adam's second moment became inf, every update 0, "diverged False"
    assert res.diverged and "too large for float32" in res.message
    assert torch.equal(res.lam, p.init_raw()) and res.best_step == 0


def test_clip_norm_is_taken_in_float64_never_multiplying_by_zero() -> None:
    p = _linear_regression(20, torch.float32, windows=2)
    tr = _trainer(problem=p, method=_Scaled(1e29), outer_steps=1, clip_norm=1.0,
                  outer=functools.partial(torch.optim.SGD, lr=0.1))
    with pytest.warns(TuningWarning):  # the fake hypergradient points uphill
        res = tr.fit()
    assert res.last_lam is not None and not res.diverged
    assert float((res.last_lam - p.init_raw()).norm()) == pytest.approx(0.1, rel=1e-5)


def test_a_huge_but_finite_validation_loss_is_divergence() -> None:
    # the case: float32, an outer Adam step so large that training explodes to a
    # validation loss ~1e25 (finite), after which the hyperparameters used to stay frozen there
    p = _linear_regression(30, torch.float32, init=0.05)
    res = _trainer(problem=p, outer_steps=4,
                   outer=functools.partial(torch.optim.Adam, lr=3.0)).fit()
    assert res.diverged and "divergence_factor=10" in res.message
    assert res.last_val_loss is not None and res.last_val_loss > 1e20
    assert res.best_val_loss == res.history[0]["val_loss"] < 0.1
    assert torch.equal(res.lam, p.init_raw())  # the best evaluated point, not the exploded one


def test_returns_the_best_evaluated_point_and_reports_the_last() -> None:
    res = _trainer(outer_steps=5,
                   outer=functools.partial(torch.optim.Adam, lr=0.3)).fit()
    vals = [h["val_loss"] for h in res.history] + [res.last_val_loss]
    best = min(range(len(vals)), key=vals.__getitem__)
    assert res.best_step == best == 4 and res.best_val_loss == vals[best]  # not the last point
    assert res.values == res.history[best]["hyperparams"]
    assert res.last_values != res.values and res.last_val_loss > res.best_val_loss


def test_divergence_factor_can_be_turned_off_and_is_validated() -> None:
    kw: Any = dict(outer_steps=2, outer=functools.partial(torch.optim.Adam, lr=3.0))
    # float64: the validation loss explodes to ~1e21, its square does not overflow
    on = _trainer(problem=_linear_regression(30, init=0.05), **kw).fit()
    off = _trainer(problem=_linear_regression(30, init=0.05), divergence_factor=None, **kw).fit()
    assert on.diverged and not off.diverged and off.history[1]["val_loss"] > 1e20
    with pytest.raises(ValueError, match="divergence_factor=0.5 must be a number > 1"):
        _trainer(divergence_factor=0.5)
    import numpy as np  # a NumPy number from a grid (np.int64(10) was refused as not > 1)

    g = hg.Guards(divergence_factor=np.int64(10), backtrack=np.float32(1.5))
    assert g.divergence_factor == 10.0 and g.backtrack == 1.5
    with pytest.raises(ValueError, match="divergence_factor=(np.True_|True) must be a number"):
        hg.Guards(divergence_factor=np.bool_(True))


@pytest.mark.parametrize("use", [
    lambda v: v.item(), lambda v: v.detach(), lambda v: 0 * v, torch.round,
    lambda v: torch.where(v > 0, 1.0, 0.0)], ids=["item", "detach", "times0", "round", "where"])
def test_an_exactly_zero_hypergradient_warns_once_naming_it(use: Any) -> None:
    p = _linear_regression(20, scale=use)
    if getattr(use(torch.tensor(0.5, requires_grad=True)), "grad_fn", None) is None:
        # cut from the graph (.item(), .detach(), a comparison): refused up front since
        # issue 23, by InnerProblem.check when the Trainer is built
        with pytest.raises(ValueError, match=r"hyperparameter 'scale' is read by train_loss "
                                             r"and val_loss, but .* cuts it from the autograd"):
            _trainer(problem=p, outer_steps=2)
        return
    tr = _trainer(problem=p, outer_steps=2)
    with pytest.warns(ZeroHypergradientWarning, match=r"\['scale'\] is exactly zero") as rec:
        res = tr.fit()
    assert sum(issubclass(w.category, ZeroHypergradientWarning) for w in rec) == 1
    assert res.values["scale"] == 0.5 and res.values["lr"] != pytest.approx(0.01)


def test_a_hyperparameter_that_never_moved_is_named_at_the_end(tmp_path: Path) -> None:
    def mk(**kw: Any) -> Trainer:
        return _trainer(problem=_linear_regression(20, scale=lambda v: 0 * v), run_dir=tmp_path,
                        **kw)

    with pytest.warns(ZeroHypergradientWarning, match="first outer step"):
        mk(outer_steps=1).fit()
    with pytest.warns(ZeroHypergradientWarning, match="'scale' never moved"):  # a new process
        mk(outer_steps=2, resume=True).fit()


def _k64(steps: int = 50) -> hg.InnerProblem:
    return digits_case("momentum", "per_example", **{**SMALL, "steps": steps, "n_train": 64})


def test_auto_picks_the_method_that_fits() -> None:
    p = _k64()  # K = 64: reverse is the small one
    fwd, rev = estimate_memory(p, "forward").total, estimate_memory(p, "reverse").total
    assert rev < fwd
    name, why = choose_method(p, memory_budget=(rev + fwd) / 2)
    # reverse is cheaper per step than forward at K = 64 and fits: forward is not counted
    assert name == "reverse" and "reverse fits (reverse needs ~" in why
    assert "forward needs" not in why
    # before: reverse over the budget meant forward, even when forward needed more; now
    # checkpointed reverse mode fits there (issue 14), and below it nothing does
    assert choose_method(p, memory_budget=rev * 0.9)[0] == "checkpointed"
    ckpt = estimate_memory(p, hg.ReverseMode(checkpoint="sqrt")).total
    with pytest.raises(MemoryBudgetError, match=r"no exact method fits.*forward .*reverse .*"
                                                r"Options: .*truncated reverse") as info:
        choose_method(p, memory_budget=ckpt * 0.9)
    # forward mode's tangents and state alone exceed that budget: no chunk size helps
    assert "chunk_size" not in str(info.value)
    q = digits_case("momentum", "lr", **{**SMALL, "steps": 400})  # K = 1, long: forward
    fwd, rev = estimate_memory(q, "forward").total, estimate_memory(q, "reverse").total
    assert fwd < rev and choose_method(q, memory_budget=(rev + fwd) / 2)[0] == "forward"


def test_forward_refuses_a_run_over_the_memory_budget_before_allocating() -> None:
    p = _k64()
    fwd = estimate_memory(p, "forward").total
    with pytest.raises(MemoryBudgetError, match=r"method=forward needs about .* > memory budget "
                                                r".*Options: .*chunk_size=1.*method='reverse'"):
        _trainer(problem=p, method="forward", memory_budget=fwd / 2)
    with pytest.raises(ValueError, match="memory_budget=-1 must be bytes > 0"):
        _trainer(memory_budget=-1)


def test_auto_keeps_the_forward_settings() -> None:
    m = hg.AutoMode(hvp=hg.hvp.VmapVJP(chunk_size=3, memory_budget=0.5 * 2**30))
    k1 = digits_case("momentum", "lr", **SMALL)  # K = 1: auto picks forward
    tr = _trainer(problem=k1, method=m)
    assert isinstance(tr.method, hg.ForwardMode) and isinstance(tr.method.hvp, hg.hvp.VmapVJP)
    assert tr.method.hvp.chunk_size == 3 and tr.method.hvp.memory_budget == 0.5 * 2**30
    tr = _trainer(problem=k1, method=hg.AutoMode(hvp=hg.hvp.ColumnLoop()))
    assert isinstance(tr.method, hg.ForwardMode) and isinstance(tr.method.hvp, hg.hvp.ColumnLoop)


def test_inverted_or_non_numeric_bounds_are_named() -> None:
    with pytest.raises(ValueError, match=r"bounds\['lr'\]=\(0.5, 0.1\) has low > high; give "
                                         r"\(low, high\) = \(0.1, 0.5\)"):
        _trainer(bounds={"lr": [0.5, 0.1]})
    with pytest.raises(ValueError, match=r"bounds\['lr'\]=\['a', 1.0\] has 'a'"):
        _trainer(bounds={"lr": ["a", 1.0]})


# -- issue 12: no lost or mixed-up runs ----------------------------------------------------------
def _mk(run_dir: Path, problem: hg.InnerProblem | None = None, lr: float = 0.1,
        outer: Any = torch.optim.Adam, **kw: Any) -> Trainer:
    problem = problem or digits_case("adam", "per_tensor_wd", **{**SMALL, "steps": 12})
    kw.setdefault("outer_steps", 2)
    return _trainer(problem=problem, run_dir=run_dir, outer=functools.partial(outer,
                                                                                        lr=lr),
                    **kw)


@pytest.mark.parametrize("change,key", [
    (dict(problem=digits_case("adam", "per_tensor_wd", **{**SMALL, "steps": 10})), "problem.steps"),
    (dict(problem=digits_case("adam", "per_tensor_wd", **{**SMALL, "steps": 12, "seed": 1})),
     "problem.first_batch"),
    (dict(problem=_linear_regression(12, init=0.02)), "problem.initial_values"),
    (dict(outer=torch.optim.SGD), "trainer.outer_optimizer"),
    (dict(clip_norm=1.0), "trainer.guards.clip_norm"),
], ids=["T", "seed", "init", "outer_optimizer", "clip_norm"])
def test_resume_refuses_a_run_that_differs(change: dict[str, Any], key: str,
                                           tmp_path: Path) -> None:
    base = {"problem": _linear_regression(12)} if key == "problem.initial_values" else {}
    _mk(tmp_path, outer_steps=1, **base).fit()
    first = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ResumeMismatchError,
                       match=rf"(?s)cannot resume .*\n  {re.escape(key)}(\[\w+\])?: .* -> "):
        _mk(tmp_path, resume=True, **{**base, **change})
    assert (tmp_path / "metrics.jsonl").read_text() == first  # nothing mixed in


def test_resume_takes_more_outer_steps_and_a_new_outer_lr(tmp_path: Path) -> None:
    _mk(tmp_path, outer_steps=2, lr=0.1).fit()
    logs: list[str] = []
    tr = _mk(tmp_path, outer_steps=3, lr=0.05, resume=True, log=logs.append)
    assert tr.outer.param_groups[0]["lr"] == 0.05  # before: the checkpoint's 0.1, silently
    assert any("lr 0.1 -> 0.05" in line for line in logs)
    assert len(tr.fit().history) == 3
    # fewer than the run has: nothing added, and said (it was silent)
    logs.clear()
    assert len(_mk(tmp_path, outer_steps=1, lr=0.05, resume=True,
                   log=logs.append).fit().history) == 3
    assert any("already has 3 outer steps, more than outer_steps=1: none is added" in line
               for line in logs)


@pytest.mark.parametrize("cls,key", [(torch.optim.Adam, "amsgrad"),
                                     (torch.optim.RMSprop, "centered")])
def test_a_resume_that_changes_what_the_outer_state_holds_is_refused(
        tmp_path: Path, cls: Any, key: str) -> None:
    """Adam's amsgrad switched on at a resume was taken ("amsgrad False -> True") and the
    next step failed inside torch with a bare KeyError: 'max_exp_avg_sq' (the outer-loop
    probe)."""
    _mk(tmp_path, outer=cls).fit()
    with pytest.raises(ResumeMismatchError, match=rf"{key}=False, this run gives {key}=True"):
        _mk(tmp_path, outer=functools.partial(cls, **{key: True}), outer_steps=3, resume=True)
    assert len(_mk(tmp_path, outer=cls, outer_steps=3, resume=True).fit().history) == 3


def test_after_a_divergence_the_checkpoint_holds_the_kept_values(tmp_path: Path) -> None:
    res = _trainer(problem=_linear_regression(), outer_steps=5, run_dir=tmp_path,
                   outer=functools.partial(torch.optim.SGD, lr=3e3)).fit()
    assert res.diverged
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.equal(ck["lam"], res.lam) and "diverged" in ck["stopped"]
    logs: list[str] = []
    tr = _trainer(problem=_linear_regression(), outer_steps=3, run_dir=tmp_path, resume=True,
                  outer=functools.partial(torch.optim.SGD, lr=1.0), log=logs.append)
    assert torch.equal(tr.lam, res.lam) and tr.outer.param_groups[0]["lr"] == 1.0
    assert any("stopped on a divergence" in line for line in logs)
    tr.close()


def test_a_resume_after_a_divergence_takes_the_smaller_sign_steps(tmp_path: Path) -> None:
    """SignDescent keeps its step sizes in its state: the checkpoint kept the step of 8 that
    diverged, and a resume with lr=0.2 (logged as replacing it) took that step again and
    diverged the same way. The state of the undone step is forgotten, as a backtrack does; a
    resume that changes lr rescales the step sizes of a run that did not diverge."""
    from hypergrad.run import SignDescent

    res = _trainer(problem=_linear_regression(), outer_steps=3, run_dir=tmp_path,
                   outer=functools.partial(SignDescent, lr=8.0)).fit()
    assert res.diverged
    kept = res.lam.clone()
    tr = _trainer(problem=_linear_regression(), outer_steps=3, run_dir=tmp_path, resume=True,
                  outer=functools.partial(SignDescent, lr=0.2), log=lambda _: None)
    again = tr.fit()
    assert not again.diverged
    assert float((tr.lam - kept).abs().max()) <= 2 * 0.2 + 1e-12  # two steps of 0.2 at most
    # a run that did not diverge, resumed with a smaller lr: its step sizes scale with it
    other = tmp_path / "other"
    _trainer(problem=_linear_regression(), outer_steps=2, run_dir=other,
             outer=functools.partial(SignDescent, lr=0.1)).fit()
    tr2 = _trainer(problem=_linear_regression(), outer_steps=3, run_dir=other, resume=True,
                   outer=functools.partial(SignDescent, lr=0.01), log=lambda _: None)
    tr2.fit()
    sizes = next(iter(tr2.outer.state.values()))["step_size"]
    assert 0 < float(sizes.max()) <= 0.01 + 1e-15


def test_sign_descent_step_sizes_follow_a_new_lr() -> None:
    """The step sizes live in SignDescent's state: a new param_groups lr (a scheduler, a
    resume) was never used by them."""
    from hypergrad.run import SignDescent

    x = torch.zeros(3, requires_grad=True)
    opt = SignDescent([x], lr=0.1)
    for lr, moved in ((0.1, 0.1), (0.01, 0.01), (0.04, 0.04)):
        opt.param_groups[0]["lr"] = lr
        before = x.detach().clone()
        x.grad = torch.ones(3)  # the same sign: no halving
        opt.step()
        assert torch.allclose(before - x.detach(), torch.full((3,), moved)), (lr, before - x)
    # a state saved without its lr (a checkpoint from before): the saved group's lr counts
    saved = opt.state_dict()
    del saved["state"][0]["lr"]
    again = SignDescent([x], lr=0.04)
    again.load_state_dict(saved)
    again.param_groups[0]["lr"] = 0.02  # what a resume with lr=0.02 sets
    before = x.detach().clone()
    x.grad = torch.ones(3)
    again.step()
    assert torch.allclose(before - x.detach(), torch.full((3,), 0.02))


def test_backtrack_undoes_a_last_update_that_diverges() -> None:
    """With Guards(backtrack=1.5) and one outer step, the update to lr = 298 reached the final
    evaluation, which returned the run as diverged (no state, the checkpoint marked stopped),
    where with two outer steps the same update was backtracked."""
    from hypergrad.run import SignDescent

    msgs: list[str] = []
    with pytest.warns(hg.errors.TuningWarning, match="no outer step improved"):
        res = make_trainer(digits_case("momentum", "lr", **SMALL), method="forward",
                           outer=functools.partial(SignDescent, lr=8.0), outer_steps=1,
                           backtrack=1.5, log=msgs.append).fit()
    assert not res.diverged and res.state is not None
    assert res.last_lam is not None and torch.equal(res.last_lam, res.lam)
    assert res.last_step == 0 and res.last_val_loss == pytest.approx(res.best_val_loss)
    assert any("after the last update" in m and "undone (Guards(backtrack=1.5))" in m
               for m in msgs)


def test_divergence_messages_give_only_advice_that_applies() -> None:
    """A float64 hypergradient too large for float64 was told to run in float64 and to try a
    smaller outer learning rate, right after "the training did not diverge"; an initial point
    that already diverges was told to try a smaller outer learning rate too."""
    big = _linear_regression(steps=20)
    val = big.val_loss
    big.val_loss = lambda m, hp: 1e300 * val(m, hp)  # type: ignore[method-assign,assignment]
    res = _trainer(problem=big, outer_steps=2,
                   outer=functools.partial(torch.optim.Adam, lr=0.3)).fit()
    assert res.diverged and "too large for float64" in res.message
    assert "run the problem in float64" not in res.message
    assert "smaller outer learning rate" not in res.message
    wild = _linear_regression(steps=60, init=1e6)
    res = _trainer(problem=wild, outer_steps=2,
                   outer=functools.partial(torch.optim.Adam, lr=0.3)).fit()
    assert res.diverged and "the initial hyperparameters already diverge" in res.message
    assert "smaller outer learning rate" not in res.message
    # a hypergradient too large because the training itself diverges (a finite but huge loss)
    # was said to come from a training that "did not diverge"
    huge = _linear_regression(steps=20, init=1e6)
    with pytest.warns(TuningWarning, match="inner training diverges"):
        res = _trainer(problem=huge, outer_steps=2,
                       outer=functools.partial(torch.optim.Adam, lr=0.3)).fit()
    assert res.diverged and "too large for float64" in res.message
    assert "did not diverge" not in res.message
    assert re.search(r"the inner training diverges, to a validation loss of \S+, above 10 "
                     r"times the untrained model's .*clip_grad_norm=1\.0", res.message)


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes({"truncate": data[:len(data) // 2], "empty": b"", "garbage": b"\x00junk" * 50,
                      "pickle": pickle.dumps({1, 2})}[how])


@pytest.mark.parametrize("how", ["truncate", "empty", "garbage", "pickle"])
def test_an_unreadable_checkpoint_falls_back_to_the_previous_one(how: str,
                                                                 tmp_path: Path) -> None:
    full = _mk(tmp_path / "full", outer_steps=3).fit()
    _mk(tmp_path / "run", outer_steps=2).fit()
    _damage(tmp_path / "run" / "checkpoint.pt", how)
    with pytest.warns(CheckpointWarning, match=r"checkpoint\.pt is unreadable: .*previous "
                                               r"checkpoint .*outer step 1") as rec:
        tr = _mk(tmp_path / "run", outer_steps=3, resume=True)
    said = str(rec[0].message)
    assert "weights_only" not in said
    # a checkpoint cut in half read as "OSError: [Errno 22] Invalid argument"
    assert "Errno" not in said and "Invalid argument" not in said, said
    assert {"truncate": "truncated or corrupted", "empty": "empty or truncated",
            "pickle": "not a hypergrad checkpoint"}.get(how, "") in said
    assert tr.outer_step == 1
    assert torch.equal(tr.fit().lam, full.lam)  # the lost step was computed again, identically


def test_no_readable_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    _mk(tmp_path, outer_steps=2).fit()
    _damage(tmp_path / "checkpoint.pt", "pickle")
    _damage(tmp_path / "checkpoint.prev.pt", "empty")
    with pytest.raises(CheckpointError) as info:
        _mk(tmp_path, resume=True)
    msg = str(info.value)
    assert "checkpoint.pt is unreadable" in msg and "checkpoint.prev.pt is unreadable" in msg
    assert "weights_only" not in msg and "overwrite=True" in msg


def test_a_full_disk_is_a_clear_error_and_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _mk(tmp_path, outer_steps=1).fit()
    tr = _mk(tmp_path, outer_steps=2, resume=True)

    def full_disk(obj: Any, f: Any, *a: Any, **k: Any) -> None:
        fh = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="no space left .* checkpoint checkpoint.pt") as info:
        tr.fit()
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "metrics.jsonl"]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["outer_step"] == 1


def test_a_used_run_dir_is_refused_unless_resume_or_overwrite(tmp_path: Path) -> None:
    _mk(tmp_path, outer_steps=2).fit()
    with pytest.raises(RunDirError, match=r"already holds a run .*resume=True.*overwrite=True"):
        _mk(tmp_path, outer_steps=2)
    with pytest.raises(ValueError, match="resume=True and overwrite=True contradict"):
        _mk(tmp_path, resume=True, overwrite=True)
    _mk(tmp_path, outer_steps=1, overwrite=True).fit()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["outer_step"] for x in lines] == [0]


def test_the_run_lock_keeps_a_second_process_out(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "run.lock").write_text(f"{holder.pid} {socket.gethostname()}\n")
        with pytest.raises(RunDirError, match=rf"in use by another run \(process {holder.pid}"):
            _mk(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    tr = _mk(tmp_path, outer_steps=1)  # its holder is dead: a stale lock, taken over
    assert (tmp_path / "run.lock").read_text().split()[0] == str(os.getpid())
    tr.fit()
    assert not (tmp_path / "run.lock").exists()


def test_metrics_write_nan_as_null(tmp_path: Path) -> None:
    with pytest.warns(HypergradWarning, match=r"evaluate returned test_acc=nan"):
        _trainer(outer_steps=1, run_dir=tmp_path,
                 evaluate=lambda s: {"test_acc": float("nan")}).fit()
    line = (tmp_path / "metrics.jsonl").read_text().splitlines()[0]
    rec = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))
    assert rec["test_acc"] is None


def test_progress_in_a_log_file_has_no_escape_codes(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hypergrad.run.callbacks, "_isatty", lambda stream: False)
    logs: list[str] = []
    _trainer(outer_steps=2, progress=True, log=logs.append).fit()
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    assert any("outer step 1/2: val_loss" in line for line in logs)


def test_online_divergence_keeps_the_last_good_values_in_the_checkpoint(tmp_path: Path) -> None:
    # online, "best" is measured on a moving inner state: the last good values are kept
    tr = _trainer(problem=_linear_regression(40), mode="online", interval=10, run_dir=tmp_path,
                  outer=functools.partial(torch.optim.SGD, lr=3e3))
    res = tr.fit()
    assert res.diverged and "kept the last good hyperparameters" in res.message
    assert res.values == res.history[-1]["hyperparams"] and bool(torch.isfinite(res.lam).all())
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.equal(ck["lam"], res.lam) and ck["stopped"]


# -- issue 10: tuning at a wall-clock budget -----------------------------------------------------
class _Clock:
    """A stand-in for the Trainer's ``time`` module: seconds pass only when a step says so (a
    shared machine makes real step times too uneven for a test)."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class _Slow(hg.Method):
    """Forward mode whose hypergradients take ``seconds`` on ``clock``."""

    name = "forward"

    def __init__(self, clock: _Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def hypergradient(self, problem: hg.InnerProblem, lam: torch.Tensor) -> hg.HyperGradient:
        self.clock.now += self.seconds
        return hg.ForwardMode().hypergradient(problem, lam)


def test_time_budget_stops_before_an_outer_step_that_would_not_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(hypergrad.run.trainer, "time", clock)
    logs: list[str] = []
    # steps of 0.5 s: the second is expected to end at 1.0 s, the third at 1.5 s > 1.3
    res = _trainer(method=_Slow(clock, 0.5), outer_steps=50, time_budget=1.3, log=logs.append,
                   run_dir=tmp_path).fit()
    assert len(res.history) == 2 and res.out_of_time and not res.diverged
    assert [h["elapsed"] for h in res.history] == [0.5, 1.0]
    assert any("time_budget=1.3 s: stopped before outer step 2" in line for line in logs)
    assert res.last_val_loss is not None  # the point after the last update is still evaluated
    # the budget may change on resume (like outer_steps): each fit() call has its own clock
    more = _trainer(method=_Slow(clock, 0.5), outer_steps=3, time_budget=5.0, run_dir=tmp_path,
                    resume=True).fit()
    assert len(more.history) == 3 and not more.out_of_time
    # but the records' clock is the run's: they go on from the checkpoint's 1.0 s (they
    # restarted at 0 before, so a resumed run's metrics.jsonl went back in time)
    assert [h["elapsed"] for h in more.history] == [0.5, 1.0, 1.5]
    assert res.elapsed == 1.0 and more.elapsed == 1.5


def test_time_budget_is_validated_and_offline_only() -> None:
    assert not _trainer(outer_steps=1).fit().out_of_time
    for bad in (0, -1.0, float("inf"), True, "5"):
        with pytest.raises(ValueError, match="time_budget=.* must be seconds > 0"):
            _trainer(time_budget=bad)
    with pytest.raises(NotImplementedError, match=r"Guards\(time_budget=..., backtrack=...\) "
                                                   r"are for offline.*Given: time_budget=1.0;"):
        _trainer(mode="online", interval=4, time_budget=1.0)
    with pytest.raises(ValueError, match=r"interval=50 must be in \[1, steps=.*mode.interval"):
        _trainer(mode="online", interval=50)
    with pytest.raises(NotImplementedError, match=r"Guards\(time_budget=..., backtrack=...\) "
                                                   r"are for offline"):
        _trainer(mode="online", interval=4, backtrack=2.0)
    for bad in (0.5, True, float("nan"), "2"):
        with pytest.raises(ValueError, match="backtrack=.* must be a number >= 1"):
            _trainer(backtrack=bad)


def test_backtrack_returns_to_the_best_point_with_half_the_outer_lr() -> None:
    # the divergence test's set-up: an outer SGD step so large that training overflows
    logs: list[str] = []
    tr = _trainer(problem=_linear_regression(), outer_steps=6, log=logs.append, backtrack=1.5,
                  outer=functools.partial(torch.optim.SGD, lr=3e3))
    res = tr.fit()
    assert not res.diverged and len(res.history) == 6  # before: stopped at outer step 1
    flags = [bool(h.get("backtracked")) for h in res.history]
    assert flags[0] is False and flags[1] is True
    assert any("back to the best hyperparameters (outer step 0), outer lr halved to 1.5e+03"
               in line for line in logs)
    # a backtracked step restarts from the best point with half the step along its known
    # hypergradient (no evaluation spent on the best point again)
    lr0 = math.log(res.history[0]["hyperparams"]["lr"])
    lr1 = math.log(res.history[1]["hyperparams"]["lr"])
    lr2 = math.log(res.history[2]["hyperparams"]["lr"])
    assert lr2 - lr0 == pytest.approx((lr1 - lr0) / 2, rel=1e-6)
    assert tr.outer.param_groups[0]["lr"] < 3e3
    assert res.best_val_loss is not None and res.best_val_loss <= res.history[0]["val_loss"]


def test_backtrack_says_what_it_did_to_an_outer_optimizer_without_a_learning_rate() -> None:
    """QuasiNewton has no learning rate (its line search sets the step): a backtrack resets its
    state and says so, instead of an empty "outer lr halved to"."""

    class Jump(torch.optim.Optimizer):
        def __init__(self, params: Any) -> None:
            super().__init__(params, {})

        def step(self, closure: Any = None) -> None:
            for group in self.param_groups:
                for p in group["params"]:
                    p.data.add_(20.0)  # the learning rate times e^20: training overflows

    logs: list[str] = []
    tr = _trainer(problem=_linear_regression(), outer_steps=2, log=logs.append, backtrack=1.5,
                  outer=Jump)
    with pytest.warns(hg.errors.TuningWarning, match="no outer step improved"):
        tr.fit()  # the last jump is undone at the final evaluation too
    said = [line for line in logs if "back to the best hyperparameters" in line]
    assert said and "Jump's state reset" in said[0] and "halved to ," not in said[0], logs


def test_a_point_whose_inner_training_diverges_is_not_returned_silently() -> None:
    """Inner lr = 5 on a full-batch ridge problem: every point's training diverges (validation
    losses of 1e44-1e46, finite), the guards compare each with the best seen, so the run
    returned a 'best' of 2.6e44 without a word."""
    from hypergrad.tasks.ridge import ridge_problem

    g = torch.Generator().manual_seed(0)
    x, xv = (torch.randn(n, 5, generator=g, dtype=torch.float64) for n in (40, 20))
    w = torch.randn(5, generator=g, dtype=torch.float64)
    for lr, diverges in ((0.05, False), (5.0, True)):
        p = ridge_problem(x, x @ w, xv, xv @ w, l2=0.1, lr=lr, steps=30)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            res = hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=3)).fit()
        said = [str(s.message) for s in seen if "inner training diverges" in str(s.message)]
        assert bool(said) == diverges, (lr, said)
        if diverges:
            assert res.best_val_loss is not None and res.best_val_loss > 1e40
            assert "smaller learning rate" in said[0] and "untrained model's" in said[0]


def test_an_outer_optimizer_refusing_its_settings_is_named_with_the_fix() -> None:
    """torch.optim's bare "Invalid learning rate: -0.1" named neither the Trainer's argument
    nor hypergrad-run's key."""
    with pytest.raises(ValueError, match=r"Trainer: the outer optimizer refused its settings: "
                                         r"Invalid learning rate: -0.1 .*outer_optimizer\.\*"):
        hg.Trainer(lr_momentum(), outer=functools.partial(torch.optim.Adam, lr=-0.1),
                   callbacks=[hg.run.Log(None), hg.run.Progress(False)])


class _Down(torch.optim.Optimizer):
    """Lowers every raw hyperparameter by ``lr`` at each step, whatever the hypergradient: each
    step is worse than the best point (a user's broken outer optimizer)."""

    def __init__(self, params: Any, lr: float = 0.5) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for g in self.param_groups:
            for q in g["params"]:
                q.sub_(g["lr"])


def test_ten_backtracks_in_a_row_stop_the_run_as_diverged_as_the_docs_say() -> None:
    """Past MAX_BACKTRACKS the bad step was used, the counter reset and backtracking went on
    (14 in 16 steps, diverged=False); the docs say the run stops as diverged."""
    from hypergrad.run.guards import MAX_BACKTRACKS
    from hypergrad.testing import digits_case

    p = digits_case("momentum", "schedule", steps=6, n_train=24, batch_size=8, hidden=4,
                    n_val=16)
    res = hg.Trainer(p, method="forward", outer=_Down, mode=hg.Offline(outer_steps=16),
                     guards=hg.Guards(backtrack=1.0),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    assert res.diverged and f"{MAX_BACKTRACKS} backtracks in a row" in res.message
    assert [bool(h.get("backtracked")) for h in res.history] == [False] + [True] * MAX_BACKTRACKS
    assert res.best_step == 0


def test_log_takes_a_path_or_a_file_and_a_bad_outer_or_log_is_named(tmp_path: Path) -> None:
    """Log('tuning.log') ran every outer step and then lost the finished run at its last
    message ('str' object is not callable); outer='adam' failed as 'str' object is not
    callable."""
    import io

    from hypergrad.testing import digits_case

    p = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=4, n_val=16)
    stream = io.StringIO()
    res = hg.Trainer(p, mode=hg.Offline(outer_steps=1),
                     callbacks=[hg.run.Log(tmp_path / "tuning.log"), hg.run.Log(stream),
                                hg.run.Progress(False)]).fit()
    lines = (tmp_path / "tuning.log").read_text().splitlines()
    assert lines and lines == stream.getvalue().splitlines() and res.best_val_loss > 0
    assert lines[-1].startswith("[hypergrad] ")
    with pytest.raises(TypeError, match=r"Log: fn=3 must be a callable taking a line"):
        hg.run.Log(3)
    with pytest.raises(TypeError, match=r"Trainer: outer='adam' must be a factory params -> "
                                        r"optimizer"):
        hg.Trainer(p, outer="adam")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Trainer: outer=<function Adam.step.*failed when "
                                        r"called with the parameters \[lam\]"):
        hg.Trainer(p, outer=torch.optim.Adam.step)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"SparseAdam takes sparse gradients only"):
        hg.Trainer(p, outer=torch.optim.SparseAdam)


def test_a_resume_keeps_the_learning_rate_a_backtrack_halved(tmp_path: Path) -> None:
    """The outer learning rate the run halved on a backtrack was put back to the one given on a
    resume with the same settings ('lr 30.0 -> 60.0'), and the resumed run differed from an
    uninterrupted one; a learning rate given anew still replaces it."""
    from hypergrad.testing import digits_case

    p = digits_case("momentum", "schedule", steps=6, n_train=24, batch_size=8, hidden=4,
                    n_val=16)
    outer = functools.partial(torch.optim.SGD, lr=60.0)
    quiet = [hg.run.Log(None), hg.run.Progress(False)]
    said: list[str] = []

    class Said(hg.Callback):
        def on_message(self, trainer: Any, text: str) -> None:
            said.append(text)

    def run(steps: int, folder: Any = None, lr: float = 60.0) -> hg.TrainResult:
        return hg.Trainer(p, method="forward", outer=functools.partial(torch.optim.SGD, lr=lr),
                          mode=hg.Offline(outer_steps=steps), guards=hg.Guards(backtrack=1.5),
                          folder=folder, callbacks=[*quiet, Said()]).fit()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuningWarning)
        straight = run(8)
        first = run(4, tmp_path / "a")
        resumed = run(8, hg.RunFolder(tmp_path / "a", resume=True))
    assert any(h.get("backtracked") for h in first.history), "the case needs a backtrack"
    assert not [s for s in said if "replace the checkpoint's" in s], said
    assert torch.equal(straight.last_lam, resumed.last_lam)
    assert [h["val_loss"] for h in straight.history] == [h["val_loss"] for h in resumed.history]
    assert outer.keywords["lr"] == 60.0
    said.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuningWarning)
        run(9, hg.RunFolder(tmp_path / "a", resume=True), lr=10.0)
    assert [s for s in said if "lr 15.0 -> 10.0" in s], said


def test_online_divergence_returns_the_last_good_point_with_its_own_loss() -> None:
    """Online, after a divergence the last good hyperparameters were returned with the best
    point's validation loss (2.03, measured at lr 2.0) beside lr 9.0, whose loss was 5.36."""
    from hypergrad.testing import digits_case

    p = digits_case("momentum", "schedule", steps=6, n_train=24, batch_size=8, hidden=4,
                    n_val=16)
    res = hg.Trainer(p, method="forward", outer=functools.partial(_Down, lr=-1.5),
                     mode=hg.Online(interval=1),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    assert res.diverged
    at = [h for h in res.history if h["outer_step"] == res.best_step]
    assert len(at) == 1 and at[0]["val_loss"] == res.best_val_loss
    assert at[0]["hyperparams"] == p.hyperparams.describe(res.lam)


def test_the_last_point_keeps_the_step_it_was_recorded_at() -> None:
    """Where no update followed the last record (the default search's descent ending on a line
    search that found nothing better; here an outer learning rate of 0), the final evaluation
    is that record's point: results.json's last_step named the next outer step."""
    from hypergrad.testing import digits_case

    p = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=4, n_val=16)
    said: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuningWarning)
        res = hg.Trainer(p, outer=functools.partial(torch.optim.SGD, lr=0.0),
                         mode=hg.Offline(outer_steps=3),
                         callbacks=[hg.run.Log(said.append), hg.run.Progress(False)]).fit()
    assert res.last_step == res.history[-1]["outer_step"] == 2
    assert res.last_val_loss == res.history[-1]["val_loss"]
    assert any("(outer step 2)" in s and s.startswith("[hypergrad] validation loss") for s in said)
    moved = hg.Trainer(p, mode=hg.Offline(outer_steps=2),
                       callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    assert moved.last_step == 2 and moved.history[-1]["outer_step"] == 1


def test_callbacks_see_a_built_trainer_and_their_subclasses_replace_the_defaults() -> None:
    """on_message ran while the Trainer was half built (reading outer_step raised
    AttributeError at method='auto''s message); a subclass of Log or Progress left the default
    beside it (every progress line twice); one callback not in a list failed as 'not
    iterable'."""
    from hypergrad.run import Log, Progress

    seen: list[tuple[int, int]] = []

    class Steps(hg.Callback):
        def on_message(self, trainer: Trainer, text: str) -> None:
            seen.append((trainer.outer_step, len(trainer.history)))

    class MyLog(Log):
        pass

    class MyProgress(Progress):
        pass

    tr = hg.Trainer(_linear_regression(steps=10), "auto", mode=hg.Offline(outer_steps=1),
                    callbacks=[Steps(), MyLog(None), MyProgress(False)])
    assert seen and seen[0] == (0, 0)  # method='auto' said what it chose, while building
    kinds = [type(c) for c in tr.callbacks]
    assert Log not in kinds and Progress not in kinds and {MyLog, MyProgress} <= set(kinds)
    with pytest.raises(TypeError, match=r"callbacks=.* must be a list of Callback objects, "
                                        r"e\.g\. callbacks=\["):
        hg.Trainer(_linear_regression(steps=10), callbacks=Log(None))  # type: ignore[arg-type]
    # the result's records are its own: editing them left the next checkpoint's changed
    res = tr.fit()
    res.history[0]["val_loss"] = -1.0
    assert tr.history[0]["val_loss"] != -1.0


def test_progress_refuses_a_string() -> None:
    """Progress("no") was enabled (bool("no") is True)."""
    from hypergrad.run import Progress

    with pytest.raises(TypeError, match=r"Progress: enabled='no' must be True or False"):
        Progress("no")  # type: ignore[arg-type]
    assert Progress(0).enabled is False


def test_a_results_repr_is_short_at_high_k() -> None:
    """repr(TrainResult) printed every record's K values: 140 KB at K = 300 after 20 outer
    steps, a notebook cell flooded (the long-runs probe)."""
    many = {"w": [0.5] * 300}
    res = hg.TrainResult(torch.zeros(300), many, [{"outer_step": k, "hyperparams": many}
                                                  for k in range(20)], "forward",
                         best_step=3, best_val_loss=0.25, last_values={"w": [0.25] * 300})
    text = repr(res)
    assert len(text) < 600, len(text)
    assert "values={'w': '<300 values>'}" in text and "history=<20 records>" in text
    assert "best_val_loss=0.25" in text
    small = hg.TrainResult(torch.zeros(2), {"lr": 0.1, "m": [0.5, 0.6]}, [], "reverse")
    assert "values={'lr': 0.1, 'm': [0.5, 0.6]}" in repr(small)


def test_a_state_is_checked_against_the_problem_also_without_a_folder(tmp_path: Path) -> None:
    """A Trainer without a folder had an empty fingerprint: another problem's state_dict was
    loaded without a word, and its best loss returned as this problem's (the reuse probe,
    2026-12-07)."""

    def trainer(opt: str, steps: int = 2, run_dir: Any = None) -> hg.Trainer:
        return make_trainer(digits_case(opt, "lr", **{**SMALL, "steps": 6}), method="forward",
                            outer=functools.partial(SignDescent, lr=0.3), outer_steps=steps,
                            run_dir=run_dir)

    first = trainer("momentum")
    first.fit()
    state = first.state_dict()
    assert state["fingerprint"]["problem.optimizer"][0] == "sgd"
    with pytest.raises(hg.errors.ResumeMismatchError, match=r"problem\.optimizer"):
        trainer("adam", 3).load_state_dict(state)
    same = trainer("momentum", 3)
    same.load_state_dict(state, "state.pt")  # a str path is a label
    assert same.outer_step == 2 and len(same.history) == len(first.history)
    # a folder's state into a Trainer without one: the same run
    folder = trainer("momentum", run_dir=tmp_path / "run")
    folder.fit()
    trainer("momentum", 3).load_state_dict(folder.state_dict())
    # a state of a Trainer without a folder written before its fingerprint was kept
    state["fingerprint"] = {}
    with pytest.warns(hg.errors.CheckpointWarning, match="cannot be checked"):
        trainer("momentum", 3).load_state_dict(state)


def test_an_interrupt_before_the_first_step_leaves_the_folder_free(tmp_path: Path) -> None:
    """A KeyboardInterrupt from a callback's on_message at fit()'s first message (the two
    batch orders') kept the run folder locked for the rest of the process ("in use by another
    run in this process") and had no note (the repeated-resume probe, 2026-12-07)."""

    class _Stop(hg.Callback):
        def on_message(self, trainer: Any, text: str) -> None:
            if "two batch orders" in text:
                raise KeyboardInterrupt

    def trainer(*extra: hg.Callback) -> hg.Trainer:
        return hg.Trainer(digits_case("momentum", "per_example", **{**SMALL, "steps": 6}),
                          mode=hg.Offline(outer_steps=1, start="auto", recheck="auto"),
                          folder=hg.RunFolder(tmp_path / "run", resume=True),
                          callbacks=[hg.run.Log(None), hg.run.Progress(False), *extra])

    with pytest.raises(KeyboardInterrupt) as got:
        trainer(_Stop()).fit()
    assert "holds no checkpoint yet" in " ".join(got.value.__notes__)
    assert trainer().fit().history  # the folder is free: no "in use by another run"


def test_a_resume_under_a_time_budget_says_the_budget_starts_again(tmp_path: Path) -> None:
    """A finished run resumed with its time budget (a requeued job) tuned for a whole new
    budget, and said only "resumed from ..." (the repeated-resume probe, 2026-12-07)."""
    def trainer(log: list[str]) -> hg.Trainer:
        return hg.Trainer(digits_case("momentum", "lr", **{**SMALL, "steps": 6}),
                          guards=hg.Guards(time_budget=2.0),
                          folder=hg.RunFolder(tmp_path / "run", resume=True),
                          callbacks=[hg.run.Log(log.append), hg.run.Progress(False)])

    first: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hg.errors.TuningWarning)  # a budget this short
        trainer(first).fit()
        log: list[str] = []
        trainer(log).fit()
    assert any("time_budget=2 s counts this invocation's time, so a run that had ended on "
               "its budget tunes for another" in line for line in log), log


def test_chaotic_inner_training_is_named_in_the_end_warning() -> None:
    """The numerics probe (2026-12-07): SGD in its chaotic range (here the double well
    w**4/4 - w**2/2 at lr 1.7, 100 steps) gives float64 hypergradients of 1e29, every number
    finite and exact, and the end-of-run warning said only "try another outer learning rate"."""

    class Well(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([0.3], dtype=torch.float64))

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        w = m.params["w"].sum()
        return w ** 4 / 4 - w ** 2 / 2

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return (m.params["w"].sum() - 1.0) ** 2 + 1.0

    def fit(lr: float) -> hg.TrainResult:
        p = hg.InnerProblem(Well(), train_loss, hg.optim.sgd(lr="lr"),
                            hg.HyperParams([hg.Scalar("lr", init=lr, transform="log")]),
                            [None], steps=100, val_loss=val_loss)
        return hg.Trainer(p, method="forward", mode=hg.Offline(outer_steps=3),
                          outer=functools.partial(hg.SignDescent, lr=0.05)).fit()

    with pytest.warns(hg.errors.TuningWarning, match=r"last hyperparameters are worse .* The "
                      r"hypergradient.s norm reached [0-9.]+e\+\d+ .* training is chaotic"):
        res = fit(1.7)
    assert max(h["hypergrad_norm"] for h in res.history) > 1e28

    # a run that improved all the same (the default search: its line search rejects the wild
    # steps) was told nothing: the chaos probe, 2026-12-08 (norms 5.3e11, 0.62 -> 0.41)
    def search(lr: float) -> tuple[hg.TrainResult, list[str]]:
        p = hg.InnerProblem(Well(), train_loss, hg.optim.sgd(lr="lr"),
                            hg.HyperParams([hg.Scalar("lr", init=lr, transform="log")]),
                            [None], steps=100, val_loss=val_loss)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            out = hg.Trainer(p, method="forward", mode=hg.Offline(outer_steps=3)).fit()
        return out, [str(w.message) for w in said
                     if issubclass(w.category, hg.errors.TuningWarning)]

    res, said = search(1.7)
    told = [m for m in said if "training is chaotic" in m]
    assert len(told) == 1 and told[0].startswith(
        "Trainer: the hypergradients were not informative (the search's plain runs")
    assert "short-horizon bias" in told[0] and "outer=None" in told[0]
    with warnings.catch_warnings(record=True) as calm:  # a stable lr: no word
        warnings.simplefilter("always")
        fit(0.1)
    assert not any("training is chaotic" in str(w.message) for w in calm)


def test_a_hypergradient_not_finite_names_the_step_its_tangents_overflow() -> None:
    """Float32 SGD at the edge of stability: forward mode's tangents overflow to NaN at a
    finite validation loss, and the stop listed five causes and named no step (the chaos
    probe, 2026-12-08). It names the inner step where the tangents first are not finite."""

    class Well(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([0.3]))

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        w = m.params["w"].sum()
        return w ** 4 / 4 - w ** 2 / 2

    p = hg.InnerProblem(Well(), train_loss, hg.optim.sgd(lr="lr"),
                        hg.HyperParams([hg.Scalar("lr", init=1.9, transform="log")]), [None],
                        steps=200,
                        val_loss=lambda m, hp: (m.params["w"].sum() - 1.0) ** 2 + 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = hg.Trainer(p, method="forward", mode=hg.Offline(outer_steps=2),
                         outer=functools.partial(torch.optim.Adam, lr=0.1)).fit()
    assert res.diverged and "hypergradient entries are not finite" in res.message
    found = re.search(r"Forward mode's tangents are first non-finite after inner step (\d+) of "
                      r"200 \(their largest entry until then: ([0-9.e+]+), in torch.float32\)",
                      res.message)
    assert found is not None, res.message
    assert 0 < int(found.group(1)) < 200 and float(found.group(2)) > 1e30


def test_an_outer_learning_rate_of_0_is_named_when_nothing_moved() -> None:
    """lr=0 for the outer optimizer: the warning blamed bounds (none given) or small steps (the
    outer-loop probe)."""
    from hypergrad.testing import digits_case

    p = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=4, n_val=16)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        hg.Trainer(p, outer=functools.partial(torch.optim.SGD, lr=0.0),
                   mode=hg.Offline(outer_steps=2),
                   callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    assert any(re.search(r"'lr' never moved from its initial value 0.1\d* \(the outer "
                         r"optimizer's learning rate is 0\)", str(w.message)) for w in said)


def test_a_per_step_callback_under_a_one_call_method_is_warned_about() -> None:
    """A user's on_inner_step (a logger, a kill switch) never ran under reverse mode, without
    a word (the checkpoint probe, 2026-12-08)."""
    from hypergrad.testing import digits_case

    class PerStep(hg.run.Callback):
        def __init__(self) -> None:
            self.steps = 0

        def on_inner_step(self, trainer: Any, step: int, total: int) -> None:
            self.steps += 1

    p = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=4, n_val=16)
    for method, warned in (("reverse", True), ("forward", False)):
        cb = PerStep()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            hg.Trainer(p, method, mode=hg.Offline(outer_steps=1),
                       callbacks=[cb, hg.run.Log(None), hg.run.Progress(False)]).fit()
        told = [str(w.message) for w in said if "PerStep define(s) on_inner_step" in
                str(w.message)]
        assert len(told) == int(warned), told
        assert (cb.steps == 0) is warned
