"""The default search's own state (found by review, 2026-11-27): the hypergradient kept for the
best point is that point's, the re-check compares as many points as asked, a stalled search
with no restart point to go on from ends instead of retaking the same hypergradient, a resumed
run goes on as the uninterrupted one, and a start in more dimensions than Sobol's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import lr_momentum, unit_clock

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.run.guards import Tracker


def quiet(*extra: Any) -> list[Any]:
    return [hg.run.Log(None), hg.run.Progress(False), *extra]


def test_the_tracker_keeps_a_gradient_only_for_the_best_point() -> None:
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log")])
    a, b, c = torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([2.0])
    tr = Tracker(hps, a)
    tr.track(torch.tensor(1.0), a, None, 0, first=False)  # a plain run (a line search's)
    tr.track(torch.tensor(1.0), a, torch.tensor([0.5]), 1, first=True)  # its hypergradient
    tr.keep_grad(a, torch.tensor([0.5]))  # taken at outer step 1, the best's step is 0
    assert tr.best is not None and tr.best[2] == 0
    assert torch.equal(tr.best_grad, torch.tensor([0.5]))
    tr.keep_grad(c, torch.tensor([9.0]))  # not the best point: not kept
    assert torch.equal(tr.best_grad, torch.tensor([0.5]))
    tr.track(torch.tensor(0.5), b, None, 1, first=False)  # a plain run becomes the best
    assert tr.best_grad is None  # no hypergradient was taken there
    back = Tracker(hps, a)
    back.load_state_dict({**tr.state_dict(), "lam": a, "outer_step": 2}, a)
    assert back.best_grad is None and back.best is not None and back.best[1] == b


def test_the_best_points_gradient_is_its_own_in_a_fit() -> None:
    """Each point a hypergradient is taken at was mostly evaluated before, by the previous
    line search, so it is tracked with that step: the gradient kept for the best point was an
    older point's (and `_back` / `_leftover` stepped along it)."""
    tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                    mode=hg.Offline(outer_steps=5, start=4, recheck=0), callbacks=quiet())
    seen: list[bool] = []
    update = tr._update

    def spy(g: torch.Tensor, **kw: Any) -> bool:
        best = tr.tracker.best
        if best is not None and torch.equal(tr.lam, best[1]):
            seen.append(tr.tracker.best_grad is not None
                        and torch.equal(tr.tracker.best_grad, g))
        return update(g, **kw)

    tr._update = spy  # type: ignore[method-assign]
    tr.fit()
    assert len(seen) >= 3 and all(seen), seen


class _Uphill(hg.ReverseMode):
    """Every hypergradient points uphill: the descent never improves on its start."""

    def hypergradient(self, problem: Any, lam: torch.Tensor, **kw: Any) -> Any:
        got = super().hypergradient(problem, lam, **kw)
        return got._replace(grad=-got.grad)


def test_the_recheck_compares_as_many_points_as_asked() -> None:
    """With the first hypergradient's point among the best, no place is kept for it: 3 points,
    not 2."""
    tr = hg.Trainer(lr_momentum(), _Uphill(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                    mode=hg.Offline(outer_steps=1, start=2, recheck=3), callbacks=quiet())
    res = tr.fit()
    assert tr._first_point is not None
    assert torch.equal(res.rechecked[0]["lam"], tr._first_point[1])  # the best is the first
    assert len(res.rechecked) == 3


class _EpochSeeded:
    """Mini-batches as MiniBatches drew them before 2026-11-27 (each epoch shuffled by
    ``seed + epoch``): the scenario of the stalled-search tests was found in this order."""

    def __init__(self, *tensors: torch.Tensor, batch_size: int, seed: int = 0) -> None:
        self.tensors, self.batch_size, self.seed = tensors, batch_size, seed
        self.per_epoch = tensors[0].shape[0] // batch_size

    def __call__(self, t: int) -> tuple[torch.Tensor, ...]:
        epoch, i = divmod(t, self.per_epoch)
        g = torch.Generator().manual_seed(self.seed + epoch)
        perm = torch.randperm(self.tensors[0].shape[0], generator=g)
        idx = perm[i * self.batch_size:(i + 1) * self.batch_size]
        return (*(x[idx] for x in self.tensors), idx)


def _small_regression() -> hg.InnerProblem:
    torch.manual_seed(0)
    w = torch.randn(5, 1, dtype=torch.float64)
    x = torch.randn(64, 5, dtype=torch.float64)
    y = x @ w + 0.05 * torch.randn(64, 1, dtype=torch.float64)
    xv = torch.randn(64, 5, dtype=torch.float64)
    yv = xv @ w + 0.05 * torch.randn(64, 1, dtype=torch.float64)
    return hg.InnerProblem(
        torch.nn.Linear(5, 1).double(), lambda m, b, hp: ((m(b[0]) - b[1]) ** 2).mean(),
        hg.optim.sgd(lr="lr", momentum="mom"),
        hg.HyperParams([hg.Scalar("lr", 0.05, "log"), hg.Scalar("mom", 0.5, "logit")]),
        _EpochSeeded(x, y, batch_size=16), 30, lambda m, hp: ((m(xv) - yv) ** 2).mean())


def test_a_stalled_search_without_a_restart_point_ends_instead_of_repeating_itself() -> None:
    """The start's best is a minimum the line search cannot leave and every restart point is
    above it by more than half the divergence margin: the next hypergradient would be the
    same point's, the same run's, again. divergence_factor < 2 made every restart point
    refused (the margin was factor / 2 - 1 < 0): 10 identical outer steps."""
    said: list[str] = []
    tr = hg.Trainer(_small_regression(),
                    guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}, divergence_factor=1.5),
                    mode=hg.Offline(outer_steps=10, start=4, recheck=0),
                    callbacks=quiet(hg.run.Log(said.append)))
    res = tr.fit()
    restarts = [e["val_loss"] for e in res.evaluations if e["kind"] == "restart"]
    assert len(restarts) == 3 and min(restarts) > 1.25 * res.best_val_loss
    assert len(res.history) == 1  # not 10 outer steps at one point
    assert any("the descent ends here" in m for m in said)
    pairs = zip(res.history, res.history[1:], strict=False)
    assert not any(a["hyperparams"] == b["hyperparams"] for a, b in pairs)


def test_an_ended_descent_spends_the_time_left_and_says_it_ran_out_of_it() -> None:
    """With a time budget the ended descent's time goes to plain runs until the budget's end,
    and the result says it ran out of time (it said not: a CI run on a loaded machine)."""
    tr = hg.Trainer(_small_regression(),
                    guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}, divergence_factor=1.5,
                                     time_budget=40.0),
                    mode=hg.Offline(outer_steps=None, start=4, recheck=0), callbacks=quiet())
    clock = unit_clock(tr)
    res = tr.fit()
    # without re-checks the final evaluation (one plain run) follows the budget (Guards)
    assert len(res.history) == 1 and res.out_of_time and clock[0] <= 40.0 + 1.0
    assert [e["kind"] for e in res.evaluations].count("leftover") >= 5


class _Stop(hg.Callback):
    def on_outer_step(self, trainer: Any, rec: dict[str, Any]) -> None:
        raise KeyboardInterrupt("killed after the record")


def test_a_run_killed_after_its_descent_ended_resumes_to_the_same_end(tmp_path: Path) -> None:
    """The end of the descent is in the checkpoint: a run killed after the last record (its
    final evaluation and re-checks still to come) resumed with one more outer step at the same
    point, the line search's runs again and a restart (the resume probe)."""
    def trainer(folder: Any, *extra: Any, said: Any = None) -> hg.Trainer:
        return hg.Trainer(_small_regression(),
                          guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}, divergence_factor=1.5),
                          mode=hg.Offline(outer_steps=10, start=4, recheck=2), folder=folder,
                          callbacks=quiet(hg.run.Log(said), *extra))

    straight = trainer(None).fit()
    assert len(straight.history) == 1
    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path, _Stop()).fit()
    said: list[str] = []
    resumed = trainer(hg.RunFolder(tmp_path, resume=True), said=said.append).fit()
    assert len(resumed.history) == 1
    assert torch.equal(resumed.lam, straight.lam)
    assert ([(e["kind"], e["val_loss"]) for e in resumed.evaluations]
            == [(e["kind"], e["val_loss"]) for e in straight.evaluations])
    assert any("descent ended at outer step 0" in m and "no outer step is added" in m
               for m in said)


def test_a_restart_point_within_half_the_divergence_margin_is_taken() -> None:
    """The restart's margin is half the divergence margin, (factor - 1) / 2: a point 1.2x
    the best is taken at factor 1.5 (it was refused at any factor below 2)."""
    tr = hg.Trainer(lr_momentum(), guards=hg.Guards(divergence_factor=1.5),
                    mode=hg.Offline(outer_steps=1, start=0, recheck=0), callbacks=quiet())
    tr.tracker.track(torch.tensor(1.0), tr.lam.clone(), None, 0, first=False)
    values = iter([1.2, 1.3, 1.4])
    tr._plain = lambda lam, kind: next(values)  # type: ignore[method-assign]
    assert tr._restart()
    values = iter([1.3, 1.4, 1.5])
    assert not tr._restart()


class _FlipOnce(hg.ReverseMode):
    """The 4th hypergradient points uphill: that line search stalls and a restart follows."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def hypergradient(self, problem: Any, lam: torch.Tensor, **kw: Any) -> Any:
        got = super().hypergradient(problem, lam, **kw)
        self.calls += 1
        return got._replace(grad=-got.grad) if self.calls == 4 else got


class _Kill(hg.Callback):
    def on_outer_step(self, trainer: Any, rec: dict[str, Any]) -> None:
        if rec["outer_step"] == 1:
            raise KeyboardInterrupt("killed")


def test_a_resumed_default_search_goes_on_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """The plain runs' record, the quasi-random points used, the points line searches started
    from and the recoveries travel in the checkpoint: resumed, a restart drew the start's
    points again and the result differed."""
    def make(folder: Any = None, *extra: Any) -> hg.Trainer:
        return hg.Trainer(lr_momentum(), _FlipOnce(),
                          guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                          mode=hg.Offline(outer_steps=5, start=4, recheck=0,
                                          search={"two_orders": 0}),  # a call per outer step
                          folder=folder, callbacks=quiet(*extra))

    whole = make()
    res_whole = whole.fit()
    assert any(e["kind"] == "restart" for e in res_whole.evaluations)
    killed = make(tmp_path, _Kill())
    try:
        killed.fit()
    except KeyboardInterrupt:
        pass
    again = make(hg.RunFolder(tmp_path, resume=True))
    again.method.calls = 2  # type: ignore[attr-defined]  # the killed run took 2
    res = again.fit()
    assert torch.equal(res.lam, res_whole.lam)
    assert res.best_val_loss == res_whole.best_val_loss
    assert [(e["kind"], e["lam"].tolist()) for e in res.evaluations] == [
        (e["kind"], e["lam"].tolist()) for e in res_whole.evaluations]


def test_a_resumed_search_of_two_batch_orders_goes_on_as_the_uninterrupted_one(
        tmp_path: Path) -> None:
    """The default search averages each hypergradient over two batch orders (variant 2 of the
    problem): the variant's draws leave the problem's own as they were, so a run killed after
    an outer step and resumed ends where the uninterrupted one does."""
    def make(folder: Any = None, *extra: Any) -> hg.Trainer:
        return hg.Trainer(lr_momentum(), "reverse", guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                          mode=hg.Offline(outer_steps=4, start=3, recheck=2), folder=folder,
                          callbacks=quiet(*extra))

    whole = make()
    assert whole._two_orders()
    res_whole = whole.fit()
    killed = make(tmp_path, _Kill())
    with pytest.raises(KeyboardInterrupt):
        killed.fit()
    res = make(hg.RunFolder(tmp_path, resume=True)).fit()
    assert torch.equal(res.lam, res_whole.lam)
    assert [h["hypergrad_norm"] for h in res.history] == [
        h["hypergrad_norm"] for h in res_whole.history]
    assert [(e["kind"], e["lam"].tolist()) for e in res.evaluations] == [
        (e["kind"], e["lam"].tolist()) for e in res_whole.evaluations]


def test_a_start_in_more_dimensions_than_sobols() -> None:
    """Per-entry quasi-random points in K > 21201 dimensions (SobolEngine's most): the
    dimensions beyond are seeded uniform draws (it was SobolEngine's ValueError)."""
    k = torch.quasirandom.SobolEngine.MAXDIM + 99
    torch.manual_seed(0)
    x, y = torch.randn(8, k, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    p = hg.InnerProblem(
        torch.nn.Linear(k, 1, bias=False).double(),
        lambda m, b, hp: ((m(b[0]) - b[1]) ** 2).mean() + (hp["l2"] * m.params["weight"][0]
                                                           ** 2).sum(),
        hg.optim.sgd(lr=0.1),
        hg.HyperParams([hg.Array("l2", torch.full((k,), 1e-3), transform="log")]),
        MiniBatches(x, y, batch_size=4), 2, lambda m, hp: ((m(x) - y) ** 2).mean())
    tr = hg.Trainer(p, callbacks=quiet())
    a, b = tr._space_filling(3, 0), tr._space_filling(2, 1)
    lo, hi = tr.box
    assert all(bool(((lo <= u) & (u <= hi)).all()) for u in a)
    assert torch.equal(a[1], b[0]) and torch.equal(a[2], b[1])  # point i is point i
    assert not torch.equal(a[0], a[1])
    with pytest.raises(TypeError, match=r"shape='log' is a string; give the transform by name"):
        hg.Array("l2", torch.zeros(3), "log")  # type: ignore[arg-type]


class _KillInner(hg.Callback):
    """Stops the run inside the first outer step's inner run, after an inner checkpoint."""

    def on_inner_step(self, trainer: Any, step: int, steps: int) -> None:
        if trainer.outer_step == 0 and step == 6:
            raise KeyboardInterrupt("killed")


def test_a_resume_inside_the_first_outer_step_does_not_run_the_start_again(
        tmp_path: Path) -> None:
    """A checkpoint written inside outer step 0's inner run (RunFolder(inner_every=...)) holds
    the start's runs: resumed, the start ran again from the point it had chosen."""
    def make(folder: Any, *extra: Any) -> hg.Trainer:
        return hg.Trainer(lr_momentum(), hg.ForwardMode(),
                          guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                          mode=hg.Offline(outer_steps=2, start=3, recheck=0), folder=folder,
                          callbacks=quiet(*extra))

    whole = make(None).fit()
    try:
        make(hg.RunFolder(tmp_path, inner_every=2), _KillInner()).fit()
    except KeyboardInterrupt:
        pass
    res = make(hg.RunFolder(tmp_path, resume=True, inner_every=2)).fit()
    kinds = [e["kind"] for e in res.evaluations]
    assert kinds.count("start") == 4  # the initial point and 3, once
    assert kinds == [e["kind"] for e in whole.evaluations]
    assert torch.equal(res.lam, whole.lam)


def test_a_hypergradient_is_taken_only_with_room_for_its_line_search() -> None:
    """Each plain run costs 1 and each hypergradient 5 (the fake clock): the last outer step
    of a budget must leave room for its line search's first trial. The forecast was the
    hypergradient's seconds alone, so a budget that just held one took it and could not try
    a step along it (the time spent for nothing)."""
    for budget in range(15, 40):  # 23, 30 and 39 ended on a hypergradient with no trial
        tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)},
                                                        time_budget=float(budget)),
                        mode=hg.Offline(outer_steps=None, start=2, recheck=0),
                        callbacks=quiet())
        unit_clock(tr)
        res = tr.fit()
        assert res.history
        for rec in res.history:  # every hypergradient has a line-search trial after it
            k = rec["outer_step"]  # its trials are the points of step k + 1 (best_step's count)
            assert any(e["kind"] == "line search" and e["outer_step"] == k + 1
                       for e in res.evaluations), (budget, k)


def test_a_resumed_run_keeps_room_for_its_rechecks_before_its_first_plain_run(
        tmp_path: Path) -> None:
    """The reserve for the end of the run (the final evaluation and the re-checks) is
    forecast from the plain runs' seconds, which were not in the checkpoint: a resumed run
    counted no reserve until its first plain run and could take a hypergradient that left no
    room for the re-checks."""
    def trainer(resume: bool, steps: int | None) -> hg.Trainer:
        tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)},
                                                        time_budget=1e9),
                        mode=hg.Offline(outer_steps=steps, start=2, recheck=2),
                        folder=hg.RunFolder(tmp_path / "run", resume=resume),
                        callbacks=quiet())
        unit_clock(tr)
        return tr

    trainer(False, 2).fit()
    back = trainer(True, 4)
    assert back._plain_seconds == 1.0  # the checkpoint's forecast
    back._rechecks = 2  # as fit() sets it
    assert back._reserve() == (1 + 2) * 1.5 * 1.0


def test_evaluations_and_rechecked_points_carry_their_values() -> None:
    """TrainResult.evaluations and rechecked held only raw lam: a user applied the transforms
    to read the points the search tried; each now has 'hyperparams' as in history."""
    import hypergrad as hg
    from hypergrad.testing import digits_case

    p = digits_case("momentum", "schedule", steps=6, n_train=24, batch_size=8, hidden=4,
                    n_val=16)
    res = hg.Trainer(p, mode=hg.Offline(outer_steps=2, start=2, recheck=2),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    assert res.evaluations and res.rechecked
    for e in [*res.evaluations, *res.rechecked]:
        assert e["hyperparams"] == p.hyperparams.describe(e["lam"])


def test_an_evaluation_and_best_step_count_its_outer_step_alike() -> None:
    """The same point was 'line search' at outer_step 3 in evaluations and best_step 4 (the
    callbacks probe): an evaluation's outer_step is now best_step's count."""
    tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                    mode=hg.Offline(outer_steps=4, start=2, recheck=0), callbacks=quiet())
    res = tr.fit()
    best = [e for e in res.evaluations if e["val_loss"] == res.best_val_loss]
    if best:  # the best point was a plain run's: its step is best_step
        assert best[0]["outer_step"] == res.best_step
    for e in res.evaluations:
        if e["kind"] == "line search":
            assert 1 <= e["outer_step"] <= len(res.history)


@pytest.mark.parametrize("folder", [False, True])
@pytest.mark.parametrize("at", [2, 9, 16])
def test_fit_again_after_an_interrupt_within_an_outer_step_goes_on_as_the_run(
        at: int, folder: bool, tmp_path: Path) -> None:
    """Ctrl-C within a line search (or the start) left the Trainer there: a second fit() took
    the next hypergradient at a trial point, with the quasi-Newton memory half updated, and
    ended elsewhere than the run not interrupted (the resume probe). It now goes back to the
    outer step's start. (at: the plain run interrupted, within the start, the first and a
    later line search.)"""
    def trainer(where: Any = None) -> hg.Trainer:
        return hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                          mode=hg.Offline(outer_steps=4, start=4, recheck=2),
                          folder=where, callbacks=quiet())

    straight = trainer().fit()
    tr = trainer(tmp_path if folder else None)  # with a folder: the snapshot is its checkpoint
    run, calls = tr.problem.run, [0]

    def interrupted(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == at:
            raise KeyboardInterrupt
        return run(*args, **kw)

    tr.problem.run = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt) as got:
        tr.fit()
    assert any("fit() again goes on" in n for n in got.value.__notes__)
    tr.problem.run = run  # type: ignore[method-assign]
    again = tr.fit()
    assert torch.equal(again.lam, straight.lam) and again.best_step == straight.best_step
    assert [h["val_loss"] for h in again.history] == [h["val_loss"] for h in straight.history]
    assert ([(e["kind"], e["val_loss"]) for e in again.evaluations]
            == [(e["kind"], e["val_loss"]) for e in straight.evaluations])


def test_state_dict_is_a_copy_the_run_does_not_change() -> None:
    """It held the live history and evaluations: a dict taken at outer step 1 and loaded
    after the run's end doubled the records (the resume probe)."""
    class Take(hg.Callback):
        sd: dict[str, Any] = {}

        def on_outer_step(self, trainer: Any, rec: dict[str, Any]) -> None:
            if rec["outer_step"] == 1:
                Take.sd = trainer.state_dict()

    hg.Trainer(lr_momentum(), mode=hg.Offline(outer_steps=4, start=4, recheck=0),
               callbacks=quiet(Take())).fit()
    assert Take.sd["outer_step"] == 2 and len(Take.sd["history"]) == 2
    assert all(e["outer_step"] <= 2 for e in Take.sd["search"]["evaluations"])


def test_a_resume_given_other_outer_settings_outside_the_groups_says_so(
        tmp_path: Path) -> None:
    """Surrogate(seed=..., grad_noise=...) and a preconditioner changed on a resume were taken
    (or, the seed, ignored) without a word: the resumed run matched neither setting's run."""
    import functools

    def trainer(steps: int, folder: Any, said: Any = None, **kw: Any) -> hg.Trainer:
        return hg.Trainer(lr_momentum(), outer=functools.partial(hg.run.Surrogate, **kw),
                          mode=hg.Offline(outer_steps=steps, start=3, recheck=0),
                          folder=folder, callbacks=quiet(hg.run.Log(said)))

    trainer(2, tmp_path).fit()
    said: list[str] = []
    trainer(3, hg.RunFolder(tmp_path, resume=True), said.append, seed=5,
            grad_noise=(0.0,)).fit()
    changed = [m for m in said if "resume: outer optimizer settings" in m]
    assert len(changed) == 1 and "grad_noise" in changed[0] and "-> (0.0,)" in changed[0]
    assert "seed 0 -> 5 (not used" in changed[0]
