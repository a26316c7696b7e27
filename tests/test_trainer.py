"""The outer loop: offline and online tuning, guards, method choice, checkpoint and resume."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import hypergrad as hg
from hypergrad.testing import digits_case
from hypergrad.trainer import SignDescent, Trainer, choose_method

SMALL = dict(steps=8, n_train=32, batch_size=8, hidden=8, n_val=32)


def _trainer(**kw) -> Trainer:  # type: ignore[no-untyped-def]
    problem = kw.pop("problem", None) or digits_case("momentum", "schedule", **SMALL)
    kw.setdefault("progress", False)
    kw.setdefault("log", lambda s: None)
    return Trainer(problem, **kw)


def test_offline_tuning_lowers_the_validation_loss() -> None:
    tr = _trainer(outer_steps=6, outer_optimizer=functools.partial(torch.optim.Adam, lr=0.3))
    res = tr.fit()
    losses = [h["val_loss"] for h in res.history]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert set(res.values) == {"lr"} and len(res.values["lr"]) == 4  # 4 windows
    assert not res.diverged


def test_online_tuning_updates_every_interval_and_resets() -> None:
    problem = digits_case("momentum", "lr", **{**SMALL, "steps": 12})
    tr = _trainer(problem=problem, mode="online", interval=4, reset_tangents=True,
                  outer_optimizer=functools.partial(torch.optim.SGD, lr=1.0))
    res = tr.fit()
    assert [h["inner_step"] for h in res.history] == [4, 8, 12]
    lrs = [h["hyperparams"]["lr"] for h in res.history]
    assert lrs[0] != lrs[1] != lrs[2]  # lam changed during the run
    assert tr.fstate is not None and tr.fstate.step == 12


def test_online_needs_forward_mode() -> None:
    with pytest.raises(NotImplementedError, match="only ForwardMode gives"):
        _trainer(method=hg.ReverseMode(), mode="online", interval=4)


def test_sign_descent_halves_on_flip() -> None:
    p = torch.zeros(2)
    opt = SignDescent([p], lr=1.0)
    for g in ([1.0, 1.0], [1.0, -1.0], [1.0, 1.0]):
        p.grad = torch.tensor(g)
        opt.step()
    # coordinate 0 never flips: 3 steps of 1; coordinate 1: -1, +0.5, -0.25
    assert p.tolist() == [-3.0, -0.75]


def test_bounds_project_in_value_space() -> None:
    tr = _trainer(outer_steps=3, bounds={"lr": [None, 0.12]},
                  outer_optimizer=functools.partial(torch.optim.SGD, lr=100.0, maximize=True))
    res = tr.fit()
    assert max(res.values["lr"]) <= 0.12 + 1e-12
    with pytest.raises(ValueError, match="bounds name 'nope' is not a hyperparameter"):
        _trainer(bounds={"nope": [0, 1]})
    with pytest.raises(ValueError, match="outside the domain of transform='log'"):
        _trainer(bounds={"lr": [-1.0, 1.0]})


def test_clip_norm_limits_the_step() -> None:
    kw = dict(outer_steps=1, outer_optimizer=functools.partial(torch.optim.SGD, lr=1.0))
    a, b = _trainer(**kw), _trainer(clip_norm=1e-3, **kw)
    lam0 = a.lam.clone()
    a.fit(), b.fit()
    assert (b.lam - lam0).norm() <= 1e-3 + 1e-12 < (a.lam - lam0).norm()


def _linear_regression(steps: int = 200) -> hg.InnerProblem:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g, dtype=torch.float64)
    y = x @ torch.randn(4, generator=g, dtype=torch.float64)
    model = torch.nn.Linear(4, 1).double()

    def loss(m, b, hp):  # type: ignore[no-untyped-def]
        return ((m(b[0])[:, 0] - b[1]) ** 2).mean()

    return hg.InnerProblem(model, loss, hg.sgd(lr="lr"),
                           hg.HyperParams([hg.Scalar("lr", 0.01, transform="log")]),
                           [(x, y)], steps, lambda m, hp: loss(m, (x, y), hp))


def test_divergence_stops_and_keeps_last_good() -> None:
    logs: list[str] = []
    # an outer step so large that the inner learning rate passes 2/L: training overflows
    tr = _trainer(problem=_linear_regression(), outer_steps=5, log=logs.append,
                  outer_optimizer=functools.partial(torch.optim.SGD, lr=3e3))
    res = tr.fit()
    assert res.diverged and "diverged" in res.message and "Try a smaller" in res.message
    assert logs and logs[-1] == res.message
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
    assert choose_method(problem, memory_budget=1.0)[0] == "forward"  # reverse cannot fit
    assert choose_method(problem, mode="online")[0] == "forward"
    logs: list[str] = []
    tr = _trainer(problem=problem, method="auto", log=logs.append)
    assert f"chose {expect}" in logs[0]
    assert isinstance(tr.method, hg.ForwardMode if expect == "forward" else hg.ReverseMode)


class _Interrupt(Exception):
    pass


def _interrupt_after(n: int):  # type: ignore[no-untyped-def]
    calls = [0]

    def evaluate(state):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] > n:
            raise _Interrupt
        return {}

    return evaluate


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_resume_equals_uninterrupted(mode: str, tmp_path: Path) -> None:
    def mk(run_dir: Path, resume: bool = False, evaluate=None) -> Trainer:  # type: ignore[no-untyped-def]
        return _trainer(
            problem=digits_case("adam", "per_tensor_wd", **{**SMALL, "steps": 12}),
            mode=mode, interval=3, outer_steps=4, run_dir=run_dir, resume=resume,
            evaluate=evaluate, outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1))

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


def test_tensorboard_option(tmp_path: Path) -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            _trainer(outer_steps=1, run_dir=tmp_path, tensorboard=True)
        return
    _trainer(outer_steps=1, run_dir=tmp_path, tensorboard=True).fit()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
