"""The Trainer's outer loop, reviewed for silent wrong answers: what it returns and reports
agrees with what it evaluated (tests that failed before their fixes)."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import hypergrad as hg


def _quiet(logs: list[str] | None = None) -> list[Any]:
    return [hg.run.Log(None if logs is None else logs.append), hg.run.Progress(False)]


def _regression(steps: int = 50, select_loss: Any = None, lr: float = 0.01) -> hg.InnerProblem:
    """Least squares by full-batch GD on a learnable learning rate (float64, K = 1): the
    validation loss falls with the learning rate up to a plateau, then training diverges."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g, dtype=torch.float64)
    y = x @ torch.randn(4, generator=g, dtype=torch.float64)
    y = y + 0.1 * torch.randn(32, generator=g, dtype=torch.float64)
    xv = torch.randn(16, 4, generator=g, dtype=torch.float64)
    yv = xv.sum(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()

    def loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return ((m(b[0])[:, 0] - b[1]) ** 2).mean()

    return hg.InnerProblem(model, loss, hg.optim.sgd(lr="lr"),
                           hg.HyperParams([hg.Scalar("lr", lr, transform="log")]),
                           [(x, y)], steps, lambda m, hp: ((m(xv)[:, 0] - yv) ** 2).mean(),
                           select_loss=select_loss)


def _every_loss(res: hg.TrainResult) -> list[tuple[float, torch.Tensor | None]]:
    """Every validation loss the run measured, with its point: hypergradients, plain runs and
    the final evaluation of the last point."""
    out: list[tuple[float, torch.Tensor | None]] = [(h["val_loss"], None)
                                                    for h in res.history]  # lam: raw
    out += [(e["val_loss"], e["lam"]) for e in res.evaluations]
    assert res.last_lam is not None and res.last_val_loss is not None
    out.append((res.last_val_loss, res.last_lam))
    return out


def test_the_best_point_is_chosen_on_the_losses_as_measured_in_float64() -> None:
    """A plain run's loss was tracked as a float32 tensor: rounded to 7 digits, the line
    search's point at lr 0.33 (5.665445392113831) tied with a lower loss at lr 0.48
    (5.665445392087481), won as the first of equals, and best_val_loss was 5.665445327758789,
    a number no run gave."""
    res = hg.Trainer(_regression(), "forward", mode=hg.Offline(outer_steps=3),
                     callbacks=_quiet()).fit()
    losses = _every_loss(res)
    best = min(v for v, _ in losses)
    assert res.best_val_loss == best
    assert any(x is not None and torch.equal(x, res.lam) for v, x in losses if v == best)


@pytest.mark.parametrize("outer_steps", [1, 2, 3])
def test_best_step_is_the_outer_step_whose_point_is_returned(outer_steps: int) -> None:
    """The line search during outer step k finds the point of outer step k + 1 (after k + 1
    updates), but its plain runs were tracked as outer step k: with one outer step the run
    returned lr 0.158 as best_step 0, 'the initial hyperparameters' (0.01), and history[best_step]
    (the report's star, results.json's learned_step) was another point than the one returned."""
    res = hg.Trainer(_regression(), "forward", mode=hg.Offline(outer_steps=outer_steps),
                     callbacks=_quiet()).fit()
    assert res.best_step is not None and res.best_val_loss is not None
    assert res.best_val_loss < res.history[0]["val_loss"]  # the descent improved ...
    assert res.best_step == outer_steps  # ... and each step's line search found a better point
    where = (res.history[res.best_step] if res.best_step < len(res.history)
             else {"hyperparams": res.last_values, "val_loss": res.last_val_loss})
    assert where["hyperparams"] == res.values and where["val_loss"] == res.best_val_loss


def test_an_outer_optimizer_the_loop_cannot_drive_is_refused_with_the_fix() -> None:
    """LBFGS failed after the first hypergradient (a full inner run spent) with torch's bare
    'step() missing 1 required positional argument: closure'; an optimizer over other tensors
    than the params given never moved the hyperparameters, and the end's warning blamed the
    bounds or the step size; an optimizer instead of a factory: "'Adam' object is not
    callable"."""
    p = _regression(steps=5)

    def build(outer: Any) -> hg.Trainer:
        return hg.Trainer(p, "forward", outer, hg.Offline(outer_steps=2), callbacks=_quiet())

    with pytest.raises(NotImplementedError, match=r"outer=LBFGS needs a closure.*QuasiNewton"):
        build(functools.partial(torch.optim.LBFGS, lr=0.1))
    # online, QuasiNewton is refused too: the advice there is Adam (the bounds probe)
    with pytest.raises(NotImplementedError, match=r"outer=LBFGS needs a closure.*Online.*use "
                                                  r"Adam, the default there"):
        hg.Trainer(p, "forward", functools.partial(torch.optim.LBFGS, lr=0.1),
                   hg.Online(interval=2), callbacks=_quiet())
    with pytest.raises(ValueError, match=r"over other tensors than the params it was given"):
        build(lambda ps: torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=0.1))
    with pytest.raises(TypeError, match=r"must be a factory.*outer=functools.partial\(torch.optim"
                                        r".Adam, lr=0.05\)"):
        build(torch.optim.Adam([torch.zeros(1, requires_grad=True)]))
    with pytest.raises(TypeError, match=r"must return a torch.optim.Optimizer, got list"):
        build(lambda ps: ps)
    res = build(functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9)).fit()  # still fine
    assert res.values["lr"] != pytest.approx(0.01)


def test_the_line_search_does_not_train_the_same_point_again_at_a_bound() -> None:
    """The initial learning rate on its upper bound, the hypergradient pointing above it: every
    trial of the line search (and of its retry) was projected back onto the initial point and
    trained it again, 8 plain runs of one point before the search could stall and restart."""
    p = _regression()
    tr = hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=1),
                    guards=hg.Guards(bounds={"lr": (1e-4, 0.01)}), callbacks=_quiet())
    res = tr.fit()
    assert res.history[0]["hyperparams"]["lr"] == pytest.approx(0.01)
    at_start = [e for e in res.evaluations if e["kind"] == "line search"
                and torch.equal(e["lam"], tr.initial_lam)]
    assert at_start == []
    assert [e["kind"] for e in res.evaluations] == ["restart"] * 3  # stalled at once


def test_after_a_divergence_the_point_returned_is_still_chosen_by_the_select_loss() -> None:
    """With a held-out select_loss the result is the evaluated point with the lowest one; a run
    that stopped as diverged fell back to the lowest validation loss instead (lr 0.39 where
    lr 0.57 had the lower select_loss) and best_select_loss was None, without a word."""
    g = torch.Generator().manual_seed(5)
    xs = torch.randn(16, 4, generator=g, dtype=torch.float64)
    ys = xs.sum(1) + 2 * xs[:, 0]
    p = _regression(select_loss=lambda m, hp: ((m(xs)[:, 0] - ys) ** 2).mean())
    tr = hg.Trainer(p, "forward", functools.partial(torch.optim.SGD, lr=2.0, momentum=0.5),
                    hg.Offline(outer_steps=6), callbacks=_quiet())
    res = tr.fit()
    assert res.diverged
    chosen = min(tr.selections, key=lambda r: r["select_loss"])
    assert res.best_select_loss == chosen["select_loss"]
    assert torch.equal(res.lam, chosen["lam"]) and res.best_step == chosen["outer_step"]
    assert res.best_val_loss == chosen["val_loss"] > min(r["val_loss"] for r in tr.selections)
    assert "lowest held-out select_loss" in res.message


def test_the_surrogate_does_not_spend_plain_runs_on_points_it_evaluated() -> None:
    """Where the loss falls toward the box's edge, the surrogate's local candidates clamped
    onto the edge were the point evaluated there, and expected improvement chose it again: 6
    of 12 plain runs trained the initial point (on its bound) once more, for the same loss."""
    tr = hg.Trainer(_regression(), "forward", functools.partial(hg.run.Surrogate),
                    hg.Offline(outer_steps=4), hg.Guards(bounds={"lr": (1e-4, 0.01)}),
                    callbacks=_quiet())
    res = tr.fit()
    seen = [tr.initial_lam] + [e["lam"] for e in res.evaluations]
    assert len(res.evaluations) >= 8
    assert all(not torch.equal(x, y) for i, x in enumerate(seen) for y in seen[:i])


def test_a_divergence_stop_at_a_best_of_zero_or_below_says_the_factor_has_no_scale() -> None:
    """A log-likelihood-like objective is defined up to an additive constant. Shifted to +10
    the run took its 12 outer steps; shifted so that its best was -0.004, the margin
    9 * |best| = 0.037 stopped it as 'diverged' at the next step's 0.84 (a=1.68, on its way to
    1.06), and the message said only 'exceeds divergence_factor=10 times the best'."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g, dtype=torch.float64)
    y = x.sum(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()

    def fit(c: float) -> hg.TrainResult:
        def val(m: Any, hp: Any) -> torch.Tensor:
            return 1e-3 * ((m(x)[:, 0] - y) ** 2).mean() + 2 * (hp["a"] - 1) ** 2 + c

        p = hg.InnerProblem(model, lambda m, b, hp: ((m(b[0])[:, 0] - b[1]) ** 2).mean(),
                            hg.optim.sgd(lr=0.05), hg.HyperParams([hg.Scalar("a", 0.0)]),
                            [(x, y)], 10, val)
        return hg.Trainer(p, "forward", functools.partial(torch.optim.SGD, lr=0.2, momentum=0.9),
                          hg.Offline(outer_steps=12), callbacks=_quiet()).fit()

    assert not fit(10.0).diverged
    near_zero = fit(-0.085)
    assert near_zero.diverged and len(near_zero.history) == 2
    assert "gives the factor no scale" in near_zero.message
    assert "Guards(divergence_factor=None)" in near_zero.message


def test_a_divergence_stop_between_losses_near_zero_says_they_may_be_rounding() -> None:
    """A noise-free fit: the validation loss went from 2.1e-19 to 3.3e-16 (both rounding), and
    the run stopped as diverged with only the advice of a smaller outer learning rate (the
    objectives probe)."""
    from hypergrad.run.guards import divergence

    lam = torch.zeros(1)
    why = divergence(torch.tensor(3.3e-16), None, (2.1e-19, lam, 0), 10.0)
    assert why is not None and "both losses are near 0" in why
    assert "Guards(divergence_factor=None)" in why
    why = divergence(torch.tensor(3.3), None, (0.2, lam, 0), 10.0)  # a real rise: no hint
    assert why is not None and "near 0" not in why


def test_a_second_fit_counts_the_first_calls_end_in_elapsed() -> None:
    """TrainResult.elapsed is the run's seconds over every fit() call; a second fit() of the
    same Trainer went on from the first call's last record, so the first call's end (its final
    evaluation) was dropped: 11 s, then 11 s again after one more second (a fake clock)."""
    from fixtures import unit_clock

    tr = hg.Trainer(_regression(steps=5), "reverse",
                    functools.partial(torch.optim.Adam, lr=0.1), hg.Offline(outer_steps=2),
                    callbacks=_quiet())
    clock = unit_clock(tr)  # a hypergradient 5 s, a plain run 1 s
    first = tr.fit()
    assert first.elapsed == clock[0] == 11.0  # two hypergradients, the final evaluation
    second = tr.fit()  # no outer step left: the final evaluation again
    assert second.elapsed == clock[0] == 12.0


def test_a_resumed_run_counts_the_last_fits_end_in_elapsed(tmp_path: Path) -> None:
    """The same across a resume in a new Trainer: it went on from the checkpoint's last record,
    so the run's elapsed went down, 0.1085 s and then 0.1052 s (the callbacks and records
    probe, 2026-12-07). The fit's end is now kept in the checkpoint."""
    from fixtures import unit_clock

    def fit() -> hg.TrainResult:
        tr = hg.Trainer(_regression(steps=5), "reverse",
                        functools.partial(torch.optim.Adam, lr=0.1), hg.Offline(outer_steps=2),
                        callbacks=_quiet(), folder=hg.run.RunFolder(tmp_path, resume=True))
        unit_clock(tr)
        return tr.fit()

    assert fit().elapsed == 11.0  # two hypergradients, the final evaluation
    assert fit().elapsed == 12.0  # no outer step left: the final evaluation again


def test_a_zero_hypergradient_sends_the_default_search_elsewhere_not_round_again() -> None:
    """The initial point on a plateau of the validation loss (a penalty flat below 0.5): every
    hypergradient exactly zero, and QuasiNewton returned without stalling, so the Trainer took
    the same hypergradient at the same point 5 times (a whole budget spent so) and then advised
    'Try a smaller outer learning rate'. A zero hypergradient now stalls the search: it
    restarts at quasi-random points."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g, dtype=torch.float64)
    y = x.sum(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()

    def val(m: Any, hp: Any) -> torch.Tensor:
        return 0 * ((m(x)[:, 0] - y) ** 2).mean() + torch.relu(hp["a"] - 0.5) ** 2

    p = hg.InnerProblem(model, lambda m, b, hp: ((m(b[0])[:, 0] - b[1]) ** 2).mean(),
                        hg.optim.sgd(lr=0.05), hg.HyperParams([hg.Scalar("a", 0.0)]),
                        [(x, y)], 5, val)
    with pytest.warns(hg.errors.ZeroHypergradientWarning, match="exactly zero"):
        res = hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=3),
                         callbacks=_quiet()).fit()
    points = [h["hyperparams"]["a"] for h in res.history]
    assert len(set(points)) == len(points) == 3  # each hypergradient at another point
    assert {e["kind"] for e in res.evaluations} == {"restart"}


def _noisy_stream_problem() -> hg.InnerProblem:
    """Least squares on noisy labels by SGD on batches of 2, reshuffled at every inner run: a
    point's validation loss differs from one measurement to the next."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, dtype=torch.float64, generator=g)
    y = x.sum(1) + 3.0 * torch.randn(256, dtype=torch.float64, generator=g)
    xv = torch.randn(64, 4, dtype=torch.float64, generator=g)
    yv = xv.sum(1)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=2,
                                         shuffle=True)
    return hg.InnerProblem(torch.nn.Linear(4, 1).double(),
                           lambda m, b, hp: ((m(b[0])[:, 0] - b[1]) ** 2).mean(),
                           hg.optim.sgd(lr="lr"),
                           hg.HyperParams([hg.Scalar("lr", 0.01, transform="log")]), loader, 20,
                           lambda m, hp: ((m(xv)[:, 0] - yv) ** 2).mean())


def test_backtracking_at_the_best_point_itself_uses_its_hypergradient() -> None:
    """With Guards(backtrack) on batches redrawn per run, the best point's loss measured again
    is above its lucky first measurement: the Trainer went 'back' to that same point and took
    its hypergradient again, 10 times in a row (outer steps 2-11 all at lr 0.0208), before
    the search went on. There is nothing to go back to: the hypergradient is used."""
    res = hg.Trainer(_noisy_stream_problem(), "forward", mode=hg.Offline(outer_steps=20),
                     guards=hg.Guards(backtrack=1.0), callbacks=_quiet()).fit()
    points = [h["hyperparams"]["lr"] for h in res.history]
    assert len(points) >= 3
    assert all(a != b for a, b in zip(points, points[1:])), points


def test_a_backtrack_searches_from_the_best_points_loss(monkeypatch: Any) -> None:
    """After a backtrack the default search's line search started from the best point but
    compared its trials with the loss of the point backtracked from (1.97 against the best's
    0.50): any trial below that, worse than the best, was accepted as an improvement."""
    seen: list[tuple[float, float]] = []
    search = hg.run.QuasiNewton._search
    back = hg.Trainer._back

    def logged_back(self: Any, why: str) -> None:
        seen.append((math.nan, self.tracker.best[0]))
        back(self, why)

    def logged_search(self: Any, *args: Any) -> Any:
        if seen and math.isnan(seen[-1][0]):
            seen[-1] = (args[4], seen[-1][1])  # the reference value of the search after it
        return search(self, *args)

    monkeypatch.setattr(hg.Trainer, "_back", logged_back)
    monkeypatch.setattr(hg.run.QuasiNewton, "_search", logged_search)
    hg.Trainer(_noisy_stream_problem(), "forward", mode=hg.Offline(outer_steps=20),
               guards=hg.Guards(backtrack=1.0), callbacks=_quiet()).fit()
    searched = [(v, b) for v, b in seen if not math.isnan(v)]
    assert searched
    assert all(v == b for v, b in searched), searched


class _StopAt(hg.Callback):
    """Early stopping: asks the Trainer to stop at outer step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_outer_step(self, trainer: hg.Trainer, record: dict[str, Any]) -> None:
        if record["outer_step"] == self.at:
            trainer.stop(f"no gain at step {self.at}")


@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
def test_a_callback_stops_the_fit_and_the_next_goes_on(tmp_path: Path, online: bool) -> None:
    """No callback could end a run cleanly: raising stopped it with no TrainResult
    (``trainer.result`` None, ``on_fit_end(None)``; the callbacks probe, 2026-12-07).
    Trainer.stop ends the fit after the outer step with a result, and a resume goes on to the
    run a straight fit gives."""
    mode = (hg.Online(interval=10) if online else hg.Offline(outer_steps=4))

    def trainer(*extra: hg.Callback, folder: Path | None = None) -> hg.Trainer:
        return hg.Trainer(_regression(steps=40), "forward",
                          functools.partial(torch.optim.Adam, lr=0.05), mode,
                          callbacks=[*extra, *_quiet()],
                          folder=None if folder is None else hg.run.RunFolder(folder,
                                                                              resume=True))

    straight = trainer().fit()
    stopped = trainer(_StopAt(1), folder=tmp_path).fit()
    assert stopped.stopped == "no gain at step 1" and not stopped.diverged
    assert len(stopped.history) == 2 and "stopped='no gain at step 1'" in repr(stopped)
    if online:  # the one run stopped at its second update, not trained to the end
        assert stopped.state is not None and stopped.history[-1]["inner_step"] == 20
    else:
        assert stopped.best_val_loss is not None and stopped.state is not None
    went_on = trainer(folder=tmp_path).fit()
    assert went_on.stopped == "" and len(went_on.history) == len(straight.history)
    assert torch.equal(went_on.lam, straight.lam)
    with pytest.raises(TypeError, match=r"Trainer.stop: reason=3 must be a non-empty str"):
        trainer().stop(3)  # type: ignore[arg-type]


def test_a_point_on_an_edge_of_the_box_hypergrad_chose_is_named() -> None:
    """The default search does not step past the box it fills around an initial value where
    no bound is given (init / 100 to init * 100 for a log transform): a diverging initial
    learning rate of 20 returned lr = 0.2, the box's edge, where 0.05 was better, without a
    word (the defaults probe, 2026-12-07). A bound of one's own that the point reaches is the
    user's choice: nothing said."""
    logs: list[str] = []
    res = hg.Trainer(_regression(lr=1e-5), callbacks=_quiet(logs)).fit()  # box [1e-7, 1e-3]
    assert res.values["lr"] == pytest.approx(1e-3)  # the loss falls all the way up
    said = [m for m in logs if "edge of the search box" in m]
    assert said == [
        "[hypergrad] the point returned has 'lr' on the upper edge of the search box hypergrad "
        "chose around its initial value (at 0.001; the box spans init / 100 to init * 100), "
        "which the search does not step past: a better value may lie beyond. Give it bounds "
        "that reach further, Guards(bounds={'lr': (low, high)}) (hypergrad-run: "
        "guards.bounds.lr=[low,high], in its values), or start it nearer."], logs
    logs.clear()
    res = hg.Trainer(_regression(lr=1e-5), guards=hg.Guards(bounds={"lr": (1e-7, 1e-3)}),
                     callbacks=_quiet(logs)).fit()
    assert res.values["lr"] == pytest.approx(1e-3)
    assert not [m for m in logs if "edge of the search box" in m]


def test_a_fit_far_over_its_time_budget_says_so() -> None:
    """The first hypergradient and the runs that end a fit run whatever the budget: a budget
    of 0.001 s took 1.3 s, and 1.5 s took 1.9 s, and only the records' elapsed said so (the
    defaults probe, 2026-12-07)."""
    from fixtures import unit_clock

    logs: list[str] = []
    tr = hg.Trainer(_regression(), guards=hg.Guards(time_budget=3.0), callbacks=_quiet(logs))
    unit_clock(tr)  # a plain run 1 s, a hypergradient 5 s: the first alone is over
    tr.fit()
    said = [m for m in logs if "this fit took" in m]
    assert len(said) == 1 and said[0].startswith(
        "[hypergrad] time_budget=3 s: this fit took "), logs
    logs.clear()
    tr = hg.Trainer(_regression(), guards=hg.Guards(time_budget=60.0), callbacks=_quiet(logs))
    unit_clock(tr)
    tr.fit()
    assert not [m for m in logs if "this fit took" in m], logs


def _kinked(steps: int = 20) -> hg.InnerProblem:
    """Least squares by GD whose validation loss adds 0.05 sqrt(lr - 0.2) above lr = 0.2:
    finite everywhere, its hypergradient NaN below 0.2 (torch.where's other branch: the
    derivative of sqrt at a negative argument), and lower there."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 5, generator=g, dtype=torch.float64)
    w = torch.randn(5, 1, generator=g, dtype=torch.float64)
    y = x @ w + 0.1 * torch.randn(40, 1, generator=g, dtype=torch.float64)
    xv = torch.randn(40, 5, generator=g, dtype=torch.float64)
    yv = xv @ w + 0.1 * torch.randn(40, 1, generator=g, dtype=torch.float64)
    model = torch.nn.Linear(5, 1, bias=False).double()
    torch.nn.init.zeros_(model.weight)

    def val(m: Any, hp: Any) -> torch.Tensor:
        d = hp["lr"] - 0.2
        return ((m(xv) - yv) ** 2).mean() + 0.05 * torch.where(d > 0, torch.sqrt(d),
                                                                torch.zeros_like(d))

    return hg.InnerProblem(model, lambda m, b, hp: ((m(b[0]) - b[1]) ** 2).mean(),
                           hg.optim.sgd(lr="lr"),
                           hg.HyperParams([hg.Scalar("lr", 0.35, transform="log")]),
                           [(x, y)], steps, val)


@pytest.mark.parametrize("how", ["adam", "backtrack", "default"])
def test_a_point_with_a_finite_loss_and_no_hypergradient_is_still_a_result(how: str) -> None:
    """A point whose hypergradient was not finite at a finite validation loss was left out of
    the points to return: Adam stopped there and returned the point before it (0.0290 where
    0.0204 had been evaluated), backtracking returned 0.0205 where 0.0196 had been; the
    default search said 25 times that the best point "trains well in one draw only" on a
    deterministic problem (the divergence probe, 2026-12-07 evening)."""
    import warnings

    p = _kinked()
    kw: dict[str, Any] = {
        "adam": dict(outer=functools.partial(torch.optim.Adam, lr=0.3),
                     mode=hg.Offline(outer_steps=12)),
        "backtrack": dict(outer=functools.partial(torch.optim.Adam, lr=0.3),
                          mode=hg.Offline(outer_steps=12), guards=hg.Guards(backtrack=1.5)),
        "default": {}}[how]
    logs: list[str] = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        res = hg.Trainer(p, "forward", callbacks=_quiet(logs), **kw).fit()
    seen = [v for v, _ in _every_loss(res) if v is not None and math.isfinite(v)]
    assert res.best_val_loss is not None
    assert res.best_val_loss == pytest.approx(min(seen), rel=1e-12)
    with torch.no_grad():
        s = p.run(res.lam)
        assert float(p.objective(s.params, s.buffers, res.lam)) == pytest.approx(
            res.best_val_loss, rel=1e-12)
    assert res.values["lr"] < 0.2  # where the loss is lower and the hypergradient NaN
    if how == "adam":  # stopped at the first NaN hypergradient: that point is the result
        assert res.diverged and res.best_step == len(res.history)
    else:
        assert any(issubclass(w.category, hg.errors.TuningWarning)
                   and "finite validation loss but a hypergradient that was not finite"
                   in str(w.message) for w in said)
    assert not any("trains well in one draw only" in m for m in logs)


def test_a_non_finite_training_loss_at_a_later_step_is_named_with_its_step() -> None:
    """An inf training loss at inner step 7 of 20 only was reported as "the validation loss is
    nan", with the advice of a smaller outer learning rate, naming neither the training nor
    its step (the divergence probe)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 5, generator=g, dtype=torch.float64)
    y = x @ torch.randn(5, 1, generator=g, dtype=torch.float64)
    model = torch.nn.Linear(5, 1, bias=False).double()
    torch.nn.init.zeros_(model.weight)

    def loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        mse = ((m(b[0]) - b[1]) ** 2).mean()
        return mse + mse / torch.relu(0.3 - hp["lr"]) if b[2] == 7 else mse

    p = hg.InnerProblem(model, loss, hg.optim.sgd(lr="lr"),
                        hg.HyperParams([hg.Scalar("lr", 0.4, transform="log")]),
                        lambda t: (x, y, int(t)), 20, lambda m, hp: ((m(x) - y) ** 2).mean())
    res = hg.Trainer(p, "forward", outer=functools.partial(torch.optim.Adam, lr=0.5),
                     mode=hg.Offline(outer_steps=3), callbacks=_quiet()).fit()
    assert res.diverged
    assert ("the parameters are first non-finite after inner step 7 of 20, whose training "
            "loss is inf: the training loss itself is not finite there") in res.message


def test_a_run_that_stops_at_a_point_without_a_hypergradient_resumes_from_one_with_it(
        tmp_path: Path) -> None:
    """The point returned may have no finite hypergradient (a result all the same); the
    checkpoint, where a resume steps from, holds the best point with one: from the other the
    resumed run stopped again at once."""
    p = _kinked()
    res = hg.Trainer(p, "forward", outer=functools.partial(torch.optim.Adam, lr=0.3),
                     mode=hg.Offline(outer_steps=12), folder=hg.RunFolder(tmp_path),
                     callbacks=_quiet()).fit()
    assert res.diverged and res.values["lr"] < 0.2
    assert "it has no finite hypergradient: a resume, or fit() again, goes on from" in res.message
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert float(p.hyperparams.describe(ck["lam"])["lr"]) > 0.2  # one with a hypergradient
    again = hg.Trainer(p, "forward", outer=functools.partial(torch.optim.Adam, lr=0.01),
                       mode=hg.Offline(outer_steps=4), folder=hg.RunFolder(tmp_path, resume=True),
                       callbacks=_quiet())
    more = again.fit()
    assert len(more.history) > len(res.history)  # it stepped on (it stopped at once before)
    assert more.best_val_loss is not None and more.best_val_loss <= res.best_val_loss + 1e-12
