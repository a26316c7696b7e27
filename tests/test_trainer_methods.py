"""The Trainer takes any Method (float64): online tuning through the OnlineMethod protocol with
ForwardMode, MARTHE and HD (MARTHE mu = 1 is the forward-mode run; HD's first update is the
one-step hypergradient computed by hand), online resume of any of them (checkpoints of the
previous version too), AutoMode picking checkpointed reverse under a small memory budget,
ImplicitDiff offline with its solver report in the history, and a clear error for a method that
cannot tune online."""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import Interrupt as _Interrupt
from fixtures import interrupt_after as _interrupt_after
from fixtures import make_trainer
from torch.func import grad

import hypergrad as hg
from hypergrad import Trainer
from hypergrad.errors import ResumeMismatchError
from hypergrad.methods import estimate_memory
from hypergrad.testing import digits_case, rel_err, ridge_diabetes_case

SMALL = dict(n_train=32, batch_size=8, hidden=8, n_val=32)


def _problem(steps: int = 12, kind: str = "lr") -> hg.InnerProblem:
    return digits_case("momentum", kind, steps=steps, **SMALL)


def _online(method: Any, problem: hg.InnerProblem | None = None, lr: float = 1.0,
            **kw: Any) -> Trainer:
    kw.setdefault("interval", 4)
    return make_trainer(problem or _problem(), method, functools.partial(torch.optim.SGD, lr=lr),
                        mode="online", **kw)


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
    return make_trainer(problem, method, functools.partial(torch.optim.Adam, lr=0.1),
                        mode="online", interval=3, run_dir=run_dir, resume=resume,
                        evaluate=evaluate, log=log)


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
    with pytest.raises(ResumeMismatchError, match=r"differs from the one in the checkpoint .*"
                                                  r"\n  method: 'hd' -> '<an exact method"):
        _resumable(hg.ForwardMode(), tmp_path / "part", resume=True)


def test_an_online_run_state_carries_over_only_where_it_fits(tmp_path: Path) -> None:
    """Forward mode's run state fits MARTHE's (the same tangents): it carries over, and that
    is said; HD keeps another state: refused, naming the method that wrote it."""
    full = _resumable("forward", tmp_path / "full").fit()
    with pytest.raises(_Interrupt):
        _resumable("forward", tmp_path / "part", evaluate=_interrupt_after(2)).fit()
    with pytest.raises(ResumeMismatchError, match=r"\n  method: '<an exact method: forward or "
                                                  r"reverse mode>' -> 'hd'"):
        _resumable("hd", tmp_path / "part", resume=True)  # refused by the fingerprint
    ck = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)
    p = digits_case("adam", "per_tensor_wd", steps=12, **SMALL)
    with pytest.raises(ResumeMismatchError, match=r"written by method='forward' .*it is a "
                                                  r"ForwardState, hd's is a HDState.*Resume with "
                                                  r"method='forward'"):
        hg.HD().load_state_dict(p, p.init_raw(), ck["online"])  # and by the run state
    logs: list[str] = []
    resumed = _resumable(hg.MARTHE(mu=1.0), tmp_path / "part", resume=True, log=logs.append)
    assert any("run state of forward carries over to marthe" in line for line in logs)
    resumed.close()
    resumed = _resumable("forward", tmp_path / "part", resume=True).fit()
    assert torch.equal(resumed.lam, full.lam)
    assert [h["val_loss"] for h in resumed.history] == [h["val_loss"] for h in full.history]


@pytest.mark.filterwarnings("ignore::hypergrad.errors.TuningWarning")  # one step: not the point
def test_auto_picks_checkpointed_reverse_under_a_small_budget_and_says_why() -> None:
    p = digits_case("momentum", "per_example", steps=50, **{**SMALL, "n_train": 64})  # K = 64
    rev = estimate_memory(p, "reverse").total
    ck = estimate_memory(p, hg.ReverseMode(checkpoint="sqrt")).total
    assert ck < rev
    logs: list[str] = []
    tr = make_trainer(p, "auto", functools.partial(torch.optim.SGD, lr=1.0), outer_steps=1,
                      memory_budget=(ck + rev) / 2, log=logs.append)
    assert isinstance(tr.method, hg.ReverseMode) and tr.method.checkpoint == "sqrt"
    assert logs[0].startswith("[hypergrad] method=auto chose checkpointed: ")
    assert "reverse mode would not fit" in logs[0] and "K=64" in logs[0]
    res = tr.fit()
    want = hg.ReverseMode().hypergradient(p, p.init_raw()).grad
    assert res.history[0]["hypergrad_norm"] == pytest.approx(float(want.norm()), rel=1e-12)
    assert res.method == "reverse"
    # an AutoMode of a larger budget of its own: the Guards' smaller one still holds (it was
    # never checked, and auto chose reverse mode over it; the memory probe, 2026-12-07)
    tr = make_trainer(p, hg.AutoMode(memory_budget=1e12), functools.partial(
        torch.optim.SGD, lr=1.0), outer_steps=1, memory_budget=(ck + rev) / 2)
    assert isinstance(tr.method, hg.ReverseMode) and tr.method.checkpoint == "sqrt"


def test_implicit_diff_offline_records_its_solver_report(tmp_path: Path) -> None:
    problem, closed = ridge_diabetes_case(800)
    tr = make_trainer(problem, hg.ImplicitDiff(hg.methods.CG(tol=1e-12)),
                      functools.partial(torch.optim.SGD, lr=0.5), outer_steps=2,
                      run_dir=tmp_path)
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
                             rf"method='forward', 'marthe' or 'hd', or mode=Offline\(\)"):
        _online(method)


def test_methods_by_name_and_auto_online() -> None:
    assert isinstance(_online("auto").method, hg.ForwardMode)  # online: forward mode
    assert isinstance(_online("hd").method, hg.HD)
    m = _online("marthe").method
    assert isinstance(m, hg.MARTHE) and m.mu == 0.9
    with pytest.raises(ValueError, match=r"method='rtho' is not a registered method; registered "
                                         r"are \['auto', 'finite_difference', 'forward', .*'hd', "
                                         r"'implicit', 'marthe', 'reverse'\]"):
        _online("rtho")
    with pytest.raises(TypeError, match="method must be a Method or a name"):
        _online(42)


class _OwnMethod(hg.Method):
    """A method of one's own returning what ``bend`` makes of forward mode's result."""

    def __init__(self, bend: Any) -> None:
        self.bend = bend

    def hypergradient(self, problem: hg.InnerProblem, lam: torch.Tensor) -> Any:
        return self.bend(hg.ForwardMode().hypergradient(problem, lam))


@pytest.mark.parametrize("bend,error,match", [
    (lambda h: h._replace(grad=torch.cat([h.grad, h.grad])), ValueError,
     r"method _OwnMethod returned grad of shape \(2,\) and dtype torch.float64; _OwnMethod."
     r"hypergradient must return HyperGradient\(objective, grad, state\) with grad of lam's "
     r"shape \(1,\)"),
    (lambda h: h._replace(grad=h.grad.sum()), ValueError, r"returned grad of shape \(\)"),
    (lambda h: h._replace(grad=None), ValueError, r"returned grad=NoneType"),
    (lambda h: (h.objective, h.grad), TypeError, r"method _OwnMethod returned tuple"),
    # state=None was taken, and left the point out of select_loss's choice (the extending probe)
    (lambda h: h._replace(state=None), TypeError,
     r"returned state=NoneType; .* state the InnerState its inner run ended in"),
])
def test_what_a_method_of_ones_own_returns_is_checked(bend: Any, error: type,
                                                      match: str) -> None:
    """A wrong shape failed inside torch ("attempting to assign a gradient of size '[2]'..."),
    a 0-d grad in the guards (IndexError), a tuple as "'tuple' object has no attribute
    'grad'", none of them naming the method."""
    p = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=8, n_val=32)
    with pytest.raises(error, match=match):
        hg.Trainer(p, method=_OwnMethod(bend), mode=hg.Offline(outer_steps=2),
                   callbacks=[]).fit()


class _NaNReverse(hg.ReverseMode):
    """Reverse mode whose adjoints overflowed: a NaN hypergradient beside a finite loss."""

    def hypergradient(self, problem: hg.InnerProblem, lam: torch.Tensor) -> Any:
        h = super().hypergradient(problem, lam)
        return h._replace(grad=torch.full_like(h.grad, math.nan))


def test_reverse_modes_overflow_in_a_diverging_training_is_blamed_on_the_training() -> None:
    """SGD with momentum at lr 1000: the training stays finite (a validation loss of 1e254)
    and reverse mode's adjoints overflowed to NaN where forward mode's tangents did not. The
    message blamed the method and advised method='reverse' to reverse mode itself (the
    numerics probe)."""
    import torch.nn.functional as F
    from torch import nn

    g = torch.Generator().manual_seed(0)
    x, xv = (10 * torch.randn(n, 5, generator=g, dtype=torch.float64) for n in (24, 16))
    y, yv = (torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (24, 16))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    p = hg.InnerProblem(model, lambda m, b, hp: F.mse_loss(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr", momentum=0.9),
                        hg.HyperParams([hg.Scalar("lr", 1e3, "log")]),
                        [(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)], 40,
                        lambda m, hp: F.mse_loss(m(xv), yv))
    with pytest.warns(hg.errors.TuningWarning):
        res = hg.Trainer(p, method=_NaNReverse(), callbacks=[],
                         mode=hg.Offline(outer_steps=2, start=0, recheck=0)).fit()
    assert res.diverged
    assert "the training was finite but diverging (a validation loss of" in res.message
    assert "try method='reverse'" not in res.message and "from the method" not in res.message
    stable = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=8, n_val=32)
    res = hg.Trainer(stable, method=_NaNReverse(), mode=hg.Offline(outer_steps=2),
                     callbacks=[]).fit()
    assert "from the method (ReverseMode())" in res.message, res.message
    assert "try method='reverse'" not in res.message


def test_a_non_finite_hypergradient_of_a_finite_training_is_not_blamed_on_the_values() -> None:
    """A method returning NaN where training was finite: the run said "the initial
    hyperparameters already diverge ... start from values that train without diverging (a
    smaller learning rate)" beside the finite validation loss it had measured, and kept no
    point."""
    p = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=8, n_val=32)
    nan = _OwnMethod(lambda h: h._replace(grad=torch.full_like(h.grad, math.nan)))
    res = hg.Trainer(p, method=nan, mode=hg.Offline(outer_steps=2), callbacks=[]).fit()
    assert res.diverged and res.best_step == 0 and res.best_val_loss is not None
    with torch.no_grad():
        s = p.run(p.init_raw())
        assert res.best_val_loss == float(p.objective(s.params, s.buffers, p.init_raw()))
    assert "hypergradient entries are not finite at a finite validation loss" in res.message
    assert "the training was finite, its hypergradient was not" in res.message
    assert "from the method (_OwnMethod())" in res.message and "already diverge" not in res.message
    assert "also rounding" not in res.message  # float64
    # in float32, rounding too: a float32 Adam tangent grew to inf over 3000 steps where the
    # float64 one stays below 44 (the numerics probe, 2026-12-07)
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    torch.manual_seed(0)
    p32 = hg.InnerProblem(torch.nn.Linear(4, 3), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                          hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                          [(x, y)], 3, lambda m, hp: F.cross_entropy(m(x), y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float32 rounding of the checks
        res = hg.Trainer(p32, method=nan, mode=hg.Offline(outer_steps=2), callbacks=[]).fit()
    assert "; in torch.float32, also rounding: a tangent or adjoint can overflow" in res.message


class _PlainFD(hg.Method):
    """A method of one's own with a step and no fingerprint of its own (one-sided
    differences)."""

    def __init__(self, h: float = 1e-4) -> None:
        self.h = h

    def hypergradient(self, problem: hg.InnerProblem, lam: torch.Tensor) -> Any:
        def value(at: torch.Tensor) -> Any:
            with torch.no_grad():
                s = problem.run(at)
                return problem.objective(s.params, s.buffers, at), s

        v, s = value(lam)
        g = torch.stack([(value(lam + self.h * e)[0] - v) / self.h
                         for e in torch.eye(lam.shape[0], dtype=lam.dtype)])
        return hg.HyperGradient(v, g, s)


class _OtherFD(_PlainFD):
    pass


def test_a_method_of_ones_own_is_resumed_only_as_itself_with_its_settings(
        tmp_path: Path) -> None:
    """Its fingerprint defaults to {} ("an exact method, which a resume may switch"): a step
    changed 1e-4 -> 1e-2 was resumed silently, and a subclass of the same settings resumed the
    run as another method (the extending probe)."""
    p = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=8, n_val=32)

    def trainer(method: hg.Method, **kw: Any) -> Trainer:
        return Trainer(p, method=method, mode=hg.Offline(outer_steps=1), callbacks=[],
                       folder=hg.RunFolder(tmp_path, **kw))

    trainer(_PlainFD()).fit()
    with pytest.raises(ResumeMismatchError, match=r"method.h: 0.0001 -> 0.01"):
        trainer(_PlainFD(h=1e-2), resume=True)
    with pytest.raises(ResumeMismatchError, match=r"method.class: .*_PlainFD' -> .*_OtherFD'"):
        trainer(_OtherFD(), resume=True)
    trainer(_PlainFD(), resume=True)  # the same method and step: resumed


def test_a_memory_budget_a_method_cannot_be_checked_against_is_said() -> None:
    """A method without a memory estimate dropped Guards(memory_budget=...) without a word
    (the extending probe)."""
    p = digits_case("momentum", "lr", steps=4, n_train=24, batch_size=8, hidden=8, n_val=32)
    with pytest.warns(hg.errors.ConfigWarning, match=r"Guards\(memory_budget=1e\+09\) is not "
                                                     r"checked: .* has no memory estimate"):
        Trainer(p, method=_PlainFD(), guards=hg.Guards(memory_budget=1e9), callbacks=[])


def test_a_method_of_ones_own_is_named_by_its_class_and_settings() -> None:
    """The run log showed method=<my_methods.ForwardFD object at 0x...> (the extending
    probe)."""
    assert repr(_PlainFD(h=0.01)) == "_PlainFD(h=0.01)"
