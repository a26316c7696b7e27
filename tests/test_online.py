"""Online methods (float64): MARTHE with mu = 0 equals greedy one-step HD and with mu = 1 equals
forward mode (RTHO), at every step of a run whose hyperparameters move, both driven only through
the OnlineMethod protocol; MARTHE with 0 < mu < 1 is the mu-weighted sum of truncated reverse
mode's increments."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fixtures import SMALL, lr_momentum, mixed_problem, model_problem
from torch.utils._pytree import tree_flatten

import hypergrad as hg
from hypergrad.testing import digits_case, rel_err


def _online(problem: hg.InnerProblem, methods: list[hg.OnlineMethod], interval: int = 2,
            lr: float = 0.05) -> list[list[torch.Tensor]]:
    """Drive ``methods`` side by side through init/step/hypergradient_at, updating ``lam`` (the
    same for all, from the first method's hypergradient) every ``interval`` steps, as an online
    tuner does. Returns each method's hypergradient at every step."""
    lam = problem.init_raw()
    runs: list[Any] = [m.init(problem, lam) for m in methods]
    out: list[list[torch.Tensor]] = [[] for _ in methods]
    for t in range(problem.steps):
        runs = [m.step(problem, r, lam) for m, r in zip(methods, runs)]
        assert all(r.step == t + 1 for r in runs)
        grads = [m.hypergradient_at(problem, r, lam)[1] for m, r in zip(methods, runs)]
        for o, g in zip(out, grads):
            o.append(g)
        if (t + 1) % interval == 0:
            lam = lam - lr * grads[0]
    return out


PROBLEMS = {
    "adam_mixed": lambda: mixed_problem("adam", 6, 3),
    "momentum_bn": lambda: mixed_problem("momentum", 6, 3, batchnorm=True),
    "dropout_bn": lambda: model_problem("dropout_bn_mlp", steps=5),
    "per_example": lambda: digits_case("nesterov", "per_example", **SMALL),
}


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_marthe_mu0_equals_hd_at_every_step(name: str) -> None:
    problem = PROBLEMS[name]()
    hd, marthe = _online(problem, [hg.HD(), hg.MARTHE(mu=0.0)])
    for t, (a, b) in enumerate(zip(hd, marthe)):
        assert rel_err(b, a) <= 1e-12, t


@pytest.mark.parametrize("name", ["adam_mixed", "momentum_bn"])
def test_marthe_mu1_equals_forward_mode_at_every_step(name: str) -> None:
    problem = PROBLEMS[name]()
    fwd, marthe = _online(problem, [hg.ForwardMode(), hg.MARTHE(mu=1.0)])
    for t, (a, b) in enumerate(zip(fwd, marthe)):
        assert rel_err(b, a) <= 1e-12, t


def test_marthe_is_the_discounted_sum_of_truncated_reverse_increments() -> None:
    """``Z_T = sum_s mu^(T-s) A_T..A_(s+1) B_s``: with ``R_k`` truncated reverse mode over the
    last k steps (``R_0`` the direct term), MARTHE(mu) = R_0 + sum_k mu^(k-1) (R_k - R_(k-1))."""
    problem = mixed_problem("momentum", 5, 2)
    lam = problem.init_raw()
    mu = 0.6
    r = [hg.ReverseMode(truncate=k).hypergradient(problem, lam).grad
         for k in range(1, problem.steps + 1)]
    direct = hg.HD().hypergradient_at(problem, hg.HD().init(problem, lam), lam)[1]
    want = direct + sum(mu ** (k - 1) * (r[k - 1] - (r[k - 2] if k > 1 else direct))
                        for k in range(1, problem.steps + 1))
    got = hg.MARTHE(mu=mu).hypergradient(problem, lam).grad
    assert rel_err(got, want) <= 1e-12
    assert rel_err(got, r[-1]) > 1e-3  # and not the full hypergradient


def test_limits_with_initialisation_hyperparameters() -> None:
    """With an initial-weight scale, HD's hypergradient at step 0 is the initialisation's own
    derivative, as MARTHE's Z_0."""
    base = digits_case("momentum", "lr", **SMALL)
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log"),
                          hg.InitScale("scale", 0.8, params=["2.weight"])])
    problem = hg.InnerProblem(base.fmodel.module, base.train_loss,
                              hg.optim.sgd(lr="lr", momentum=0.5),
                              hps, base.batch, 4, base.val_loss)
    lam = problem.init_raw()
    hd, m0 = hg.HD(), hg.MARTHE(0.0)
    at0 = [m.hypergradient_at(problem, m.init(problem, lam), lam)[1] for m in (hd, m0)]
    assert float(at0[0][1]) != 0.0 and rel_err(at0[0], at0[1]) <= 1e-12
    a, b = _online(problem, [hd, m0])
    for x, y in zip(a, b):
        assert rel_err(y, x) <= 1e-12
    fwd, m1 = _online(problem, [hg.ForwardMode(), hg.MARTHE(1.0)])
    for x, y in zip(fwd, m1):
        assert rel_err(y, x) <= 1e-12


def test_run_states_and_truncation() -> None:
    problem = digits_case("momentum", "lr", **SMALL)
    lam = problem.init_raw()
    hd = hg.HD()
    run = hd.run(problem, hd.init(problem, lam), lam, stop=3)
    assert isinstance(run, hg.methods.HDState) and run.step == 3
    leaves = tree_flatten((run.state, run.prev))[0]  # a pytree of tensors and the step index
    assert all(isinstance(x, torch.Tensor) for x in leaves) and isinstance(run.step, int)
    assert hd.truncate(run) is run  # nothing carried beyond the last step
    plain = problem.run(lam, stop=3)
    for a, b in zip(tree_flatten(run.state)[0], tree_flatten(plain)[0], strict=True):
        assert torch.equal(a, b)
    m = hg.MARTHE(0.5)
    fs = m.truncate(m.run(problem, m.init(problem, lam), lam, stop=3))
    assert not any(bool(z.any()) for z in tree_flatten(fs.tangents)[0])
    assert isinstance(hd, hg.OnlineMethod) and isinstance(m, hg.OnlineMethod)
    # the whole-run hypergradient of an online method: hypergradient_at after T steps
    r = hd.hypergradient(problem, lam)
    assert rel_err(r.grad, hg.MARTHE(0.0).hypergradient(problem, lam).grad) <= 1e-12


def test_marthe_arguments() -> None:
    assert repr(hg.MARTHE(0.25)) == "MARTHE(mu=0.25)"
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match=r"MARTHE: mu=.* must be a number in \[0, 1\]"):
            hg.MARTHE(bad)  # type: ignore[arg-type]


def test_online_tuning_refuses_initialisation_hyperparameters() -> None:
    """One online run leaves its initial weights before the first update: an InitScale moved
    online (to 2.2 from 1.0) was returned though the run trained at 1.0 throughout, and HD
    gave it exactly 0 (a ZeroHypergradientWarning blaming the losses)."""
    base = digits_case("momentum", "lr", **SMALL)
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log"),
                          hg.InitScale("scale", 0.8, params=["2.weight"])])
    problem = hg.InnerProblem(base.fmodel.module, base.train_loss,
                              hg.optim.sgd(lr="lr", momentum=0.5), hps, base.batch, 6,
                              base.val_loss)
    for method in ("forward", "hd"):
        with pytest.raises(ValueError, match=r"Online: \['scale'\] set the initial weights.*"
                                             r"mode=hg.Offline"):
            hg.Trainer(problem, method, mode=hg.Online(interval=3))
    hg.Trainer(problem, "forward", mode=hg.Offline(outer_steps=1))  # offline they are tuned


def _online_trainer(method: str, *extra: hg.Callback) -> hg.Trainer:
    from fixtures import TINY

    return hg.Trainer(digits_case("momentum", "lr", steps=10, **TINY), method,
                      mode=hg.Online(interval=3),
                      callbacks=[hg.run.Log(None), hg.run.Progress(False), *extra])


class _StopAt(hg.Callback):
    """Raise in ``on_inner_step`` at inner step ``at`` (once)."""

    def __init__(self, at: int, take: bool = False) -> None:
        self.at, self.take, self.state = at, take, None

    def on_inner_step(self, trainer: Any, step: int, total: int) -> None:
        if step == self.at and self.state is None:
            self.state = trainer.state_dict() if self.take else {}
            if not self.take:
                raise KeyboardInterrupt


@pytest.mark.parametrize("method", ["forward", "hd"])
@pytest.mark.parametrize("at", [3, 10])
def test_online_fit_again_after_an_interrupt_at_an_update_step_is_the_straight_run(
        method: str, at: int) -> None:
    """Stopped after an update step's inner step but before its update (Ctrl-C in the
    progress bar's on_inner_step, or in the validation gradient), fit() again went on from
    the next step: that update was skipped without a word (the online probe)."""
    straight = _online_trainer(method).fit()
    tr = _online_trainer(method, _StopAt(at))
    with pytest.raises(KeyboardInterrupt) as got:
        tr.fit()
    assert any("fit() again goes on" in n for n in got.value.__notes__)
    again = tr.fit()
    assert [h["inner_step"] for h in again.history] == [3, 6, 9, 10]
    assert torch.equal(again.lam, straight.lam)


@pytest.mark.parametrize("at", [3, 9])
def test_an_online_state_taken_at_an_update_step_does_that_update_first(at: int) -> None:
    """A state_dict taken in on_inner_step at an update step, before its update, loaded into
    a fresh Trainer, skipped that update (the online probe)."""
    straight = _online_trainer("forward").fit()
    taker = _StopAt(at, take=True)
    _online_trainer("forward", taker).fit()
    fresh = _online_trainer("forward")
    assert taker.state is not None
    fresh.load_state_dict(taker.state, "in memory")  # type: ignore[arg-type]
    res = fresh.fit()
    assert [h["inner_step"] for h in res.history] == [3, 6, 9, 10]
    assert torch.equal(res.lam, straight.lam)


def test_an_online_run_whose_training_blows_up_says_so() -> None:
    """lr 1000: validation losses of 963-1327 against the untrained model's 2.4, returned as
    learned without a word (the offline check was skipped online; the divergence guard
    compares with the best seen, itself blown up; the online probe, 2026-12-07)."""
    import functools

    tr = hg.Trainer(lr_momentum(12, lr=1e3), "forward",
                    outer=functools.partial(torch.optim.Adam, lr=0.2), mode=hg.Online(interval=4),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    with pytest.warns(hg.errors.TuningWarning, match=r"the online run's training \(with the "
                                                     r"hyperparameters returned\) ends at a "
                                                     r"validation loss of"):
        res = tr.fit()
    assert not res.diverged and res.best_val_loss is not None and res.best_val_loss > 100


def test_online_first_update_does_not_call_a_momentum_unlearnable() -> None:
    """At interval 1 the first hypergradient of a momentum is exactly zero (it has no effect
    on SGD's first step): the first-step check said it 'will not move', and it moved from 0.5
    to 0.86 (pytest turns that warning into an error)."""
    res = hg.Trainer(lr_momentum(12, lr=0.1), "forward", mode=hg.Online(interval=1),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    assert res.values["momentum"] > 0.6


def test_an_outer_step_to_infinity_is_divergence_not_the_domain_edge() -> None:
    """An outer lr of inf stepped an identity-transformed learning rate to -inf; the domain's
    clamp (sgd's lr >= 0) made it 0.0 and the run returned lr=0 as learned, diverged=False
    (the implicit/online probe, 2026-12-07)."""
    import functools

    class Point(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))

        def forward(self, x: Any) -> torch.Tensor:
            return self.w

    a = torch.tensor([1.0, -2.0], dtype=torch.float64)
    problem = hg.InnerProblem(
        Point(), lambda m, batch, hp: 0.5 * ((m(None) - a) ** 2 * torch.tensor([1.0, 4.0])).sum(),
        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1)]), [None], 10,
        lambda m, hp: 0.5 * ((m(None) - 0.5) ** 2).sum())
    res = hg.Trainer(problem, "hd", outer=functools.partial(torch.optim.SGD, lr=math.inf),
                     mode=hg.Online(interval=1),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    assert res.diverged and "non-finite" in (res.message or "")
    assert res.values["lr"] == pytest.approx(0.1)
