"""The Trainer takes any Method (float64): online tuning through the OnlineMethod protocol with
ForwardMode, MARTHE and HD (MARTHE mu = 1 is the forward-mode run; HD's first update is the
one-step hypergradient computed by hand), online resume of any of them (checkpoints of the
previous version too), AutoMode picking checkpointed reverse under a small memory budget,
ImplicitDiff offline with its solver report in the history, and a clear error for a method that
cannot tune online."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from problems import Interrupt as _Interrupt
from problems import interrupt_after as _interrupt_after
from torch.func import grad
from torch.utils._pytree import tree_flatten

import hypergrad as hg
from hypergrad.choice import estimate_memory
from hypergrad.errors import ResumeMismatchError
from hypergrad.testing import digits_case, rel_err, ridge_diabetes_case
from hypergrad.trainer import Trainer

SMALL = dict(n_train=32, batch_size=8, hidden=8, n_val=32)


def _problem(steps: int = 12, kind: str = "lr") -> hg.InnerProblem:
    return digits_case("momentum", kind, steps=steps, **SMALL)


def _online(method: Any, problem: hg.InnerProblem | None = None, lr: float = 1.0,
            **kw: Any) -> Trainer:
    kw.setdefault("interval", 4)
    return Trainer(problem or _problem(), method, functools.partial(torch.optim.SGD, lr=lr),
                   mode="online", progress=False, log=lambda s: None, **kw)


@pytest.mark.parametrize("method", ["hd", "marthe", hg.HD(), hg.MARTHE(mu=0.5)],
                         ids=["hd", "marthe", "HD()", "MARTHE(0.5)"])
def test_online_tuning_with_hd_and_marthe(method: Any) -> None:
    tr = _online(method)
    want = method if isinstance(method, str) else method.name
    assert tr.method.name == want and isinstance(tr.method, hg.OnlineMethod)
    res = tr.fit()
    assert res.method == want and [h["inner_step"] for h in res.history] == [4, 8, 12]
    lrs = [h["hyperparams"]["lr"] for h in res.history]
    assert lrs[0] != lrs[1] != lrs[2] and all(h["hypergrad_norm"] > 0 for h in res.history)
    assert tr.run_state.step == 12 and res.state is tr.run_state.state


@pytest.mark.parametrize("reset", [False, True], ids=["rtho", "truncated"])
def test_marthe_mu1_online_run_equals_the_forward_mode_run(reset: bool) -> None:
    runs = {name: _online(m, interval=3, reset_tangents=reset).fit()
            for name, m in [("forward", hg.ForwardMode()), ("mu1", hg.MARTHE(mu=1.0)),
                            ("mu05", hg.MARTHE(mu=0.5))]}
    fwd, mu1 = runs["forward"], runs["mu1"]
    assert len(fwd.history) == len(mu1.history) == 4
    for a, b in zip(fwd.history, mu1.history):
        assert abs(a["hypergrad_norm"] - b["hypergrad_norm"]) <= 1e-12 * a["hypergrad_norm"]
        assert abs(a["val_loss"] - b["val_loss"]) <= 1e-12 * a["val_loss"]
    assert rel_err(mu1.lam, fwd.lam) <= 1e-12
    assert rel_err(runs["mu05"].lam, fwd.lam) > 1e-6  # the comparison can tell methods apart


def test_hd_online_first_update_is_the_one_step_hypergradient() -> None:
    """By hand: train 2 plain steps at lam0, then differentiate E after the 3rd step with
    respect to lam through that step only (torch.func.grad, not HD's VJP); SGD's first update
    is lam0 - lr * that."""
    problem, lr = _problem(), 2.0
    lam0 = problem.init_raw()
    s2 = problem.run(lam0, stop=2)

    def after_one_step(lm: torch.Tensor) -> torch.Tensor:
        s = problem.step(s2, lm, 2)
        return problem.objective(s.params, s.buffers, lm)

    h = grad(after_one_step)(lam0)
    res = _online(hg.HD(), problem, lr=lr, interval=3).fit()
    assert res.history[0]["inner_step"] == 3
    assert res.history[0]["hypergrad_norm"] == pytest.approx(float(h.norm()), rel=1e-12)
    want = problem.hyperparams.describe(lam0 - lr * h)["lr"]
    assert res.history[1]["hyperparams"]["lr"] == pytest.approx(want, rel=1e-12)
    assert res.history[1]["hyperparams"]["lr"] != pytest.approx(res.history[0]["hyperparams"]
                                                                ["lr"], rel=1e-6)


def _resumable(method: Any, run_dir: Path, resume: bool = False, evaluate: Any = None,
               log: Any = None) -> Trainer:
    problem = digits_case("adam", "per_tensor_wd", steps=12, **SMALL)
    return Trainer(problem, method, functools.partial(torch.optim.Adam, lr=0.1), mode="online",
                   interval=3, run_dir=run_dir, resume=resume, evaluate=evaluate,
                   progress=False, log=log or (lambda s: None))


def test_hd_online_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    full = _resumable(hg.HD(), tmp_path / "full").fit()
    with pytest.raises(_Interrupt):  # dies during its 3rd update, after 2 checkpoints
        _resumable(hg.HD(), tmp_path / "part", evaluate=_interrupt_after(2)).fit()
    ck = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)
    assert ck["outer_step"] == 2 and ck["online"]["run"] == "HDState"
    assert ck["online"]["step"] == 6
    resumed = _resumable(hg.HD(), tmp_path / "part", resume=True).fit()
    assert torch.equal(resumed.lam, full.lam)
    assert [h["val_loss"] for h in resumed.history] == [h["val_loss"] for h in full.history]
    assert [h["hypergrad_norm"] for h in resumed.history] == [h["hypergrad_norm"]
                                                             for h in full.history]
    # another method whose run state does not fit: refused, naming the one that fits
    with pytest.raises(ResumeMismatchError, match=r"cannot resume the online run .* with "
                                                  r"ForwardMode: its run state was written by "
                                                  r"HD .*HDState.*method='hd'"):
        _resumable(hg.ForwardMode(), tmp_path / "part", resume=True)


def test_an_online_checkpoint_of_version_2_still_resumes(tmp_path: Path) -> None:
    """Checkpoints written before the OnlineMethod protocol kept forward mode's state and
    tangents under "inner"; they resume as ForwardMode's run state, and a method whose run
    state is another is refused."""
    full = _resumable("forward", tmp_path / "full").fit()
    with pytest.raises(_Interrupt):
        _resumable("forward", tmp_path / "part", evaluate=_interrupt_after(2)).fit()
    path = tmp_path / "part" / "checkpoint.pt"
    ck = torch.load(path, weights_only=True)
    online = ck.pop("online")
    n = len(tree_flatten(digits_case("adam", "per_tensor_wd", steps=12, **SMALL)
                         .initial_state())[0])
    ck["version"] = 2
    ck["inner"] = {"step": online["step"], "state": online["leaves"][:n],
                   "tangents": online["leaves"][n:]}
    torch.save(ck, path)
    with pytest.raises(ResumeMismatchError, match=r"written by ForwardMode .*it is a "
                                                  r"ForwardState, HD's is a HDState"):
        _resumable("hd", tmp_path / "part", resume=True)
    logs: list[str] = []
    resumed = _resumable(hg.MARTHE(mu=1.0), tmp_path / "part", resume=True, log=logs.append)
    assert any("run state of ForwardMode carries over to MARTHE" in line for line in logs)
    resumed.close()
    resumed = _resumable("forward", tmp_path / "part", resume=True).fit()
    assert torch.equal(resumed.lam, full.lam)
    assert [h["val_loss"] for h in resumed.history] == [h["val_loss"] for h in full.history]


@pytest.mark.filterwarnings("ignore::hypergrad.errors.TuningWarning")  # one step: not the point
def test_auto_picks_checkpointed_reverse_under_a_small_budget_and_says_why() -> None:
    p = digits_case("momentum", "per_example", steps=50, **{**SMALL, "n_train": 64})  # K = 64
    rev, ck = estimate_memory(p, "reverse").total, estimate_memory(p, "checkpointed").total
    assert ck < rev
    logs: list[str] = []
    tr = Trainer(p, "auto", functools.partial(torch.optim.SGD, lr=1.0), outer_steps=1,
                 memory_budget=(ck + rev) / 2, progress=False, log=logs.append)
    assert isinstance(tr.method, hg.ReverseMode) and tr.method.checkpoint == "sqrt"
    assert logs[0].startswith("[hypergrad] method=auto chose checkpointed: ")
    assert "reverse mode would not fit" in logs[0] and "K=64" in logs[0]
    res = tr.fit()
    want = hg.ReverseMode().hypergradient(p, p.init_raw()).grad
    assert res.history[0]["hypergrad_norm"] == pytest.approx(float(want.norm()), rel=1e-12)
    assert res.method == "reverse"


def test_implicit_diff_offline_records_its_solver_report(tmp_path: Path) -> None:
    problem, closed = ridge_diabetes_case(800)
    tr = Trainer(problem, hg.ImplicitDiff(hg.CG(tol=1e-12)),
                 functools.partial(torch.optim.SGD, lr=0.5), outer_steps=2, run_dir=tmp_path,
                 progress=False, log=lambda s: None)
    res = tr.fit()
    assert res.method == "implicit" and not res.diverged
    first = res.history[0]
    assert first["hypergrad_norm"] == pytest.approx(float(closed.norm()), rel=1e-8)
    for rec in res.history:
        info = rec["info"]
        assert info["solver"] == "cg" and info["converged"] and info["residual"] <= 1e-12
        assert 1 <= info["iterations"] <= 11
    line = (tmp_path / "metrics.jsonl").read_text().splitlines()[0]
    assert '"info": {' in line and '"residual": ' in line


@pytest.mark.parametrize("method", [hg.ReverseMode(), hg.ReverseMode(checkpoint="sqrt"),
                                    hg.ImplicitDiff(), hg.FiniteDifference(), "reverse"],
                         ids=["reverse", "checkpointed", "implicit", "fd", "'reverse'"])
def test_a_method_that_cannot_tune_online_is_a_clear_error(method: Any) -> None:
    name = "ReverseMode" if isinstance(method, str) else type(method).__name__
    with pytest.raises(NotImplementedError,
                       match=rf"online tuning needs .* OnlineMethod \(ForwardMode, MARTHE or "
                             rf"HD\); {name} gives one only after a whole run. Use "
                             rf"method='forward', 'marthe' or 'hd' .*or mode='offline'"):
        _online(method)


def test_methods_by_name_and_auto_online() -> None:
    assert isinstance(_online("auto").method, hg.ForwardMode)  # online: forward mode
    assert isinstance(_online("hd").method, hg.HD)
    m = _online("marthe").method
    assert isinstance(m, hg.MARTHE) and m.mu == 0.9
    with pytest.raises(ValueError, match=r"method='rtho'; use one of \['forward', 'reverse', "
                                         r"'auto', 'hd', 'marthe'\]"):
        _online("rtho")
    with pytest.raises(TypeError, match="method must be a Method or one of"):
        _online(42)
