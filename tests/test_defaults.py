"""The Trainer's defaults (issue 27): ``Trainer(problem)`` runs method ``"auto"``, the
:class:`~hypergrad.run.outer.QuasiNewton` outer optimizer in the search box and
``Offline.default()`` (a space-filling start, then outer steps until the time budget), and each
part does what its docstring says."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fixtures import lr_momentum, unit_clock

import hypergrad as hg
from hypergrad.problem import bitwise_equal
from hypergrad.run import SearchSettings
from hypergrad.run.outer import QuasiNewton, search_box
from hypergrad.testing import digits_case

SMALL = dict(steps=8, n_train=32, batch_size=8, hidden=8, n_val=32)


def quiet() -> list[Any]:
    return [hg.run.Log(None), hg.run.Progress(False)]


def test_the_defaults_are_auto_quasi_newton_in_the_box_and_a_space_filling_start() -> None:
    p = lr_momentum()
    tr = hg.Trainer(p, guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}), callbacks=quiet())
    assert isinstance(tr.outer, QuasiNewton) and tr.mode.start == "auto"
    assert tr.mode.outer_steps is None and tr.mode.steps(None) == 10
    assert tr.mode.steps(5.0) == math.inf  # with a budget, the budget ends the run
    assert tr.method.name == "reverse"  # auto: K = 2, reverse mode fits
    lo, hi = tr.box
    assert float(lo[0]) == pytest.approx(math.log(1e-3)) and float(hi[0]) == pytest.approx(0.0)
    assert (float(lo[1]), float(hi[1])) == (-6.0, 6.0)  # momentum: logit, no bounds given
    res = tr.fit()
    starts = [e for e in res.evaluations if e["kind"] == "start"]
    assert len(starts) == 1 + hg.run.modes.START_NO_BUDGET  # the initial point and 4 more
    every = [e["val_loss"] for e in res.evaluations] + [h["val_loss"] for h in res.history]
    # the best 3 points of every evaluation, apart from each other by 2 % of the box, were
    # re-checked in another batch order, and the one whose worse run is lowest returned
    assert len(res.rechecked) == 3
    assert res.rechecked[0]["val_loss"] == pytest.approx(min(every))
    width = hi - lo
    for i, a in enumerate(res.rechecked):
        for b in res.rechecked[i + 1:]:
            assert float(((a["lam"] - b["lam"]) / width).abs().max()) >= 0.02
    vals = [r["val_loss"] for r in res.rechecked]
    assert vals == sorted(vals)
    worse = [max(r["val_loss"], r["variant_val_loss"]) for r in res.rechecked]
    pick = res.rechecked[worse.index(min(worse))]
    assert torch.equal(res.lam, pick["lam"]) and res.best_val_loss == pick["val_loss"]
    assert res.best_val_loss < starts[0]["val_loss"]  # tuning lowered E
    assert len(res.history) == 10


def test_explicit_parts_keep_their_old_behaviour() -> None:
    p = digits_case("momentum", "lr", **SMALL)
    tr = hg.Trainer(p, "forward", outer=lambda ps: torch.optim.Adam(ps, lr=0.05),
                    mode=hg.Offline(outer_steps=2), callbacks=quiet())
    res = tr.fit()
    assert res.evaluations == [] and len(res.history) == 2  # no start, no line search
    assert repr(hg.Offline()) == "Offline(outer_steps=10)"
    assert (repr(hg.Offline.default())
            == "Offline(outer_steps=None, start='auto', recheck='auto')")
    with pytest.raises(ValueError, match="start"):
        hg.Offline(start=-1)
    with pytest.raises(ValueError, match="recheck=-1"):
        hg.Offline(recheck=-1)
    with pytest.raises(ValueError, match=r"recheck=1 compares nothing: .* needs 2 or more"):
        hg.Offline(recheck=1)  # accepted, and re-checked nothing


def test_a_variant_draws_another_batch_order_and_restores_the_problem() -> None:
    p = lr_momentum()
    lam = p.init_raw()
    mb = p._batch.data
    order = [p._batch(t)[-1].tolist() for t in range(8)]

    def val() -> float:
        with torch.no_grad():
            s = p.run(lam)
            return float(p.objective(s.params, s.buffers, lam))

    v0 = val()
    with p.variant(1):
        assert p.seed != 0 and mb.seed != 0
        other = [p._batch(t)[-1].tolist() for t in range(8)]
        v1 = val()
    assert other != order and v1 != v0  # another order trains another model
    assert p.seed == 0 and mb.seed == 0 and val() == v0  # and the problem is as it was
    assert [p._batch(t)[-1].tolist() for t in range(8)] == order
    with p.variant(1):
        assert val() == v1  # a variant is itself reproducible
    with pytest.raises(ValueError, match="k=-1"), p.variant(-1):
        pass
    assert p.varies


def test_the_best_points_are_rechecked_and_the_lowest_worse_run_returned() -> None:
    """Offline(recheck=n): the best n distinct points run again in the problem's variant 1;
    the returned point has the lowest worse of the two validation losses, which may differ
    from the lowest of one run."""
    p = lr_momentum()
    res = hg.Trainer(p, guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}), callbacks=quiet(),
                     mode=hg.Offline(outer_steps=3, start=4, recheck=4)).fit()
    assert len(res.rechecked) == 4
    lams = [r["lam"] for r in res.rechecked]
    assert all(not torch.equal(a, b) for i, a in enumerate(lams) for b in lams[i + 1:])
    for r in res.rechecked:  # the variant's loss is the problem's own variant 1
        with torch.no_grad(), p.variant(1):
            s = p.run(r["lam"])
            assert r["variant_val_loss"] == float(p.objective(s.params, s.buffers, r["lam"]))
    worse = [max(r["val_loss"], r["variant_val_loss"]) for r in res.rechecked]
    assert torch.equal(res.lam, lams[worse.index(min(worse))])
    assert res.values == p.hyperparams.describe(res.lam)


def test_the_recheck_picks_by_the_worse_order_or_by_the_mean(monkeypatch: Any) -> None:
    """``SearchSettings.recheck_pick``: with the best point's other order made worse than the
    second point's loss (its mean still the lowest), ``"worse"`` (the default) returns the
    second point and ``"mean"`` the best; a wrong value is refused by name."""

    def run(variants: list[float] | None = None, **search: Any) -> Any:
        tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                        callbacks=quiet(),
                        mode=hg.Offline(outer_steps=3, start=4, recheck=3, search=search))
        if variants is not None:  # the re-check's runs in the other order, in its order
            it, real = iter(variants), tr._timed_value
            monkeypatch.setattr(tr, "_timed_value",
                                lambda lam, k: (next(it), None) if k == 1 else real(lam, k))
        return tr.fit()

    base = run()
    (a, b, c) = [r["val_loss"] for r in base.rechecked]
    assert a < b < c
    variants = [1.5 * b - 0.5 * a, b, c]  # best: worse b + (b - a) / 2 > b, mean < b
    lams = [r["lam"] for r in base.rechecked]
    worse, mean = run(variants), run(variants, recheck_pick="mean")
    assert [r["variant_val_loss"] for r in worse.rechecked] == variants
    assert torch.equal(worse.lam, lams[1]) and worse.best_val_loss == b
    assert torch.equal(mean.lam, lams[0]) and mean.best_val_loss == a
    with pytest.raises(ValueError, match=r"recheck_pick='max' must be one of \['mean', "):
        SearchSettings(recheck_pick="max")


def test_the_recheck_also_judges_the_point_the_descent_started_from(tmp_path: Any) -> None:
    """``SearchSettings.recheck_first``: the re-check compares the best points with the point
    the first hypergradient was taken at (the space-filling start's best), trained in the other
    order too, so a descent that only fits the tuning run's batch order is judged against its
    start; the point travels in the checkpoint. Off: the best points only. (One batch order
    per hypergradient: the descent this test was written for.)"""

    def run(folder: Any = None, **search: Any) -> tuple[Any, Any]:
        tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                        callbacks=quiet(), folder=folder,
                        mode=hg.Offline(outer_steps=4, start=4, recheck=3,
                                        search={"two_orders": 0, **search}))
        return tr, tr.fit()

    tr, res = run(tmp_path)
    first = res.history[0]
    every = sorted([e["val_loss"] for e in res.evaluations]
                   + [h["val_loss"] for h in res.history])
    assert first["val_loss"] > every[1]  # the descent found two better points
    assert len(res.rechecked) == 3
    start = res.rechecked[-1]  # the descent's start, re-checked last
    assert start["val_loss"] == pytest.approx(first["val_loss"])
    assert tr.problem.hyperparams.describe(start["lam"]) == first["hyperparams"]
    assert [r["val_loss"] for r in res.rechecked[:2]] == pytest.approx(every[:2])
    mean = [r["val_loss"] + r["variant_val_loss"] for r in res.rechecked]
    assert torch.equal(res.lam, res.rechecked[mean.index(min(mean))]["lam"])
    back = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                      callbacks=quiet(), folder=hg.RunFolder(tmp_path, resume=True),
                      mode=hg.Offline(outer_steps=4, start=4, recheck=3,
                                      search={"two_orders": 0}))
    assert back._first_point is not None and torch.equal(back._first_point[1], start["lam"])
    _, off = run(recheck_first=False)
    assert [r["val_loss"] for r in off.rechecked] == pytest.approx(every[:3])


def test_a_problem_whose_runs_cannot_vary_is_not_rechecked() -> None:
    """A fixed list of batches and a step without random draws: every run at a point is the
    same, so recheck="auto" spends nothing on it."""
    p = lr_momentum()
    fixed = [p._batch(t) for t in range(4)]
    q = hg.InnerProblem(p.fmodel.module, p.train_loss, p.optimizer, hg.HyperParams(
        [hg.Scalar("lr", 0.02, "log"), hg.Scalar("momentum", 0.5, "logit")]), fixed, 8,
        p.val_loss)
    tr = hg.Trainer(q, callbacks=quiet(), mode=hg.Offline(outer_steps=2, recheck="auto"))
    res = tr.fit()
    assert not q.varies and res.rechecked == []
    assert res.best_val_loss == pytest.approx(min(
        [e["val_loss"] for e in res.evaluations] + [h["val_loss"] for h in res.history]
        + [res.last_val_loss]))


def test_the_line_search_descends_a_quadratic_in_box_units() -> None:
    target = torch.tensor([0.3, -2.0, 4.0], dtype=torch.float64)
    scale = torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64)
    box = (torch.full((3,), -5.0, dtype=torch.float64), torch.full((3,), 5.0,
                                                                  dtype=torch.float64))
    x = torch.zeros(3, dtype=torch.float64)
    opt = QuasiNewton([x], box=box, min_step=0.0)  # the default's floor limits precision

    def f(v: torch.Tensor) -> float:
        return float((scale * (v - target) ** 2).sum())

    def grad(v: torch.Tensor) -> torch.Tensor:
        return 2 * scale * (v - target)

    values = [f(x)]
    for _ in range(12):
        opt.value = f(x)
        x.grad = grad(x)
        opt.step(lambda: f(x))
        values.append(f(x))
        assert values[-1] <= values[-2]  # a line search never accepts a worse point
        assert bool((x >= box[0]).all() and (x <= box[1]).all())
    assert values[-1] < 1e-3 * values[0]  # L-BFGS on a quadratic
    x = torch.zeros(3, dtype=torch.float64)
    opt = QuasiNewton([x], box=box)  # the default: no step shorter than 2% of the box
    for _ in range(8):
        before = x.clone()
        opt.value = f(x)
        x.grad = grad(x)
        opt.step(lambda: f(x))
        moved = float(((x - before) / 10).abs().max())
        assert moved == 0.0 or moved >= 0.02 - 1e-12


def test_the_box_fills_missing_bounds_around_the_initial_value() -> None:
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log"), hg.Scalar("m", 0.9, "logit"),
                          hg.Scalar("a", 0.5)])
    lam = hps.init_raw(torch.float64)
    lo, hi = search_box(hps, {"lr": (None, torch.tensor(0.0, dtype=torch.float64))}, lam)
    assert float(lo[0]) == pytest.approx(math.log(0.1) - math.log(100.0))
    assert float(hi[0]) == 0.0  # the bound given wins
    assert (float(lo[1]), float(hi[1])) == (-6.0, 6.0)
    assert (float(lo[2]), float(hi[2])) == pytest.approx((-0.5, 1.5))
    # a logit bound beyond [-6, 6] on one side: the other side reaches past it (the box was
    # [6.9, 6.9] for momentum >= 0.999, found by the hyperparameter review)
    m = torch.tensor(math.log(0.999 / 0.001), dtype=torch.float64)
    lo, hi = search_box(hps, {"m": (m, None)}, torch.tensor([lam[0], m, lam[2]]))
    assert float(lo[1]) == float(m) and float(hi[1]) == pytest.approx(float(m) + 6.0)
    lo, hi = search_box(hps, {"m": (None, -m)}, torch.tensor([lam[0], -m, lam[2]]))
    assert float(hi[1]) == -float(m) and float(lo[1]) == pytest.approx(-float(m) - 6.0)


@pytest.mark.filterwarnings("ignore::hypergrad.errors.TuningWarning")  # a loaded machine's
def test_a_time_budget_stops_the_default_search_and_the_start_takes_a_share() -> None:  # 3 s
    p = digits_case("momentum", "schedule", **{**SMALL, "steps": 12})
    t0 = time.process_time()  # CPU time: the test holds on a loaded machine too
    tr = hg.Trainer(p, guards=hg.Guards(time_budget=3.0, clock="cpu"), callbacks=quiet())
    res = tr.fit()
    took = time.process_time() - t0
    starts = [e for e in res.evaluations if e["kind"] == "start"]
    assert hg.run.modes.START_MIN + 1 <= len(starts) <= hg.run.modes.START_MAX + 1
    assert all(e["elapsed"] <= 3.0 + 0.5 for e in res.evaluations)
    assert res.out_of_time and took < 3.0 + 5.0  # the budget, then one final plain run
    # room is kept for the re-checks (how much, on a fake clock: the test below); on this
    # real one an outer step may run past its forecast and leave none
    assert len(res.rechecked) in (0, 2, hg.run.modes.RECHECK_AUTO)


def test_online_the_default_outer_is_adam_and_runs_no_plain_runs() -> None:
    """Online tuning is one run: the default outer optimizer there is Adam with lr 0.05 (the old
    default), never the line search of whole plain runs (which made HD online on a ridge
    problem of 300 steps take minutes)."""
    p = lr_momentum(steps=40)
    runs = 0
    run = p.run

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal runs
        runs += 1
        return run(*args, **kwargs)

    p.run = counted  # type: ignore[method-assign]
    tr = hg.Trainer(p, "hd", mode=hg.Online(interval=2), callbacks=quiet())
    assert isinstance(tr.outer, torch.optim.Adam) and tr.outer.defaults["lr"] == 0.05
    res = tr.fit()
    assert len(res.history) == 20 and res.evaluations == [] and runs == 0



@pytest.mark.parametrize("search", ["quasi_newton", "surrogate"])
def test_online_a_search_outer_optimizer_is_refused(search: str) -> None:
    """A search given online: a Surrogate never moved the hyperparameters (its warning blamed
    the bounds), QuasiNewton's plain steps of 15 % of the box on curvature from other inner
    states jumped to the box's edge and returned that point."""
    from hypergrad.run import Surrogate

    cls = QuasiNewton if search == "quasi_newton" else Surrogate
    with pytest.raises(ValueError, match=rf"outer optimizer {cls.__name__} searches with plain "
                                         r"inner runs.*outer=None.*SignDescent.*"
                                         r"outer_optimizer=adam or sign"):
        hg.Trainer(lr_momentum(steps=8), "forward", outer=lambda ps: cls(ps),
                   mode=hg.Online(interval=2), callbacks=quiet())


@pytest.mark.filterwarnings("ignore::hypergrad.errors.TuningWarning")  # a loaded machine's
def test_a_cpu_clock_measures_the_budget_in_process_time() -> None:  # 1 s may hold 1 step
    assert repr(hg.Guards(clock="cpu")) == "Guards(clock='cpu')"
    with pytest.raises(ValueError, match="clock"):
        hg.Guards(clock="gpu")
    p = digits_case("momentum", "lr", **SMALL)
    cpu0 = time.process_time()
    res = hg.Trainer(p, guards=hg.Guards(time_budget=1.0, clock="cpu"), callbacks=quiet()).fit()
    used = time.process_time() - cpu0
    assert res.out_of_time and max(e["elapsed"] for e in res.evaluations) <= 1.0 + 0.5
    assert used >= 0.9  # the budget was spent in this process's CPU time


@pytest.mark.parametrize("budget", [30.0, 33.0])
def test_the_time_after_the_last_hypergradient_goes_to_plain_runs_and_rechecks(
        budget: float) -> None:
    """On a clock where a plain run costs 1 and a hypergradient 5 (the suite's ratio), the
    defaults use the budget of 30 to its end: when no hypergradient fits, plain runs fill the
    time left (a line search from the best point, quasi-random points), and the end of the run
    (the final evaluation, 3 re-checks) fits too, so the point is returned within the budget."""
    p = lr_momentum()
    tr = hg.Trainer(p, guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}, time_budget=budget),
                    callbacks=quiet())
    clock = unit_clock(tr)
    res = tr.fit()
    assert clock[0] <= budget  # everything, the re-checks included, within the budget
    assert clock[0] >= budget - 3.0  # unused: under a run plus the reserve's margin (4 x 0.5)
    assert len(res.rechecked) == 3 and res.out_of_time
    last_step = max(h["elapsed"] for h in res.history)  # its line search included
    after = [e["kind"] for e in res.evaluations if e["elapsed"] > last_step]
    # every unit between the last outer step and the end of the run (the final evaluation and
    # 3 re-checks) went to plain runs
    assert len(after) == clock[0] - last_step - 4
    assert set(after) <= {"line search", "leftover"}


def test_a_callable_source_with_a_seed_attribute_draws_other_batches_in_a_variant() -> None:
    """Any callable batch source whose draws follow an int ``seed`` (the character LM's
    windows, a user's sampler) has it moved inside ``variant``; one without a seed keeps its
    batches (and without random draws in the step, the problem cannot vary)."""
    p = lr_momentum()
    x, y = p._batch(0)[0], p._batch(0)[1]

    class Sampler:
        def __init__(self, seed: int) -> None:
            self.seed = seed

        def __call__(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
            g = torch.Generator().manual_seed(self.seed * 7919 + t)
            i = torch.randint(0, x.shape[0], (4,), generator=g)
            return x[i], y[i]

    def build(batches: Any) -> hg.InnerProblem:
        return hg.InnerProblem(p.fmodel.module, p.train_loss, p.optimizer, hg.HyperParams(
            [hg.Scalar("lr", 0.02, "log"), hg.Scalar("momentum", 0.5, "logit")]), batches, 8,
            p.val_loss, seed=3)

    q = build(Sampler(3))
    first = q._batch(0)[0]
    with q.variant(2):
        assert q._batch._fetch.seed == 3 + 2 * hg.problem.VARIANT_STRIDE
        assert not torch.equal(q._batch(0)[0], first)
    assert q.varies and q._batch._fetch.seed == 3 and torch.equal(q._batch(0)[0], first)
    fixed = build(lambda t: (x[:4], y[:4]))
    fixed.check(fixed.init_raw())
    assert not fixed.varies


def test_the_tracker_best_is_the_first_of_its_top_points_and_survives_a_checkpoint() -> None:
    """The best point is the first of the tracked points (the earlier of equal losses); an
    older checkpoint without ``top`` restores its best point as the only one."""
    from hypergrad.run.guards import Tracker

    hps = hg.HyperParams([hg.Scalar("a", 1.0)])
    tr = Tracker(hps, torch.zeros(1))
    assert tr.best is None
    for v, x, step in [(3.0, 1.0, 0), (2.0, 2.0, 1), (2.0, 3.0, 2), (5.0, 4.0, 3)]:
        tr.track(torch.tensor(v), torch.tensor([x]), None, step, first=False)
    assert tr.best is not None and tr.best[0] == 2.0 and tr.best[2] == 1
    tr.track(torch.tensor(1.0), torch.tensor([4.0]), None, 4, first=False)  # a point again
    assert tr.best[0] == 1.0 and float(tr.best[1]) == 4.0 and len(tr.top) == 4
    old = tr.state_dict()
    del old["top"]
    back = Tracker(hps, torch.zeros(1))
    back.load_state_dict({**old, "lam": torch.zeros(1), "outer_step": 5}, torch.zeros(1))
    assert back.best is not None and back.best[0] == 1.0 and back.best[2] == 4
    assert len(back.top) == 1


def _fixed_batch_problem(factory: Any) -> tuple[hg.InnerProblem, Any]:
    """``lr_momentum``'s model, losses and hyperparameters on a fixed list of batches (the
    runs vary only through the factory's initial weights)."""
    p = lr_momentum()
    fixed = [p._batch(t) for t in range(4)]
    q = hg.InnerProblem(p.fmodel.module, p.train_loss, p.optimizer, hg.HyperParams(
        [hg.Scalar("lr", 0.02, "log"), hg.Scalar("momentum", 0.5, "logit")]), fixed, 8,
        p.val_loss, model_factory=factory)
    return q, p.fmodel.module


def test_a_model_factory_makes_variants_start_from_other_initial_weights() -> None:
    """With ``model_factory``, variant k trains from the factory's model built under the
    moved seed (reproducibly), the module is untouched, the caller's random state is left as
    it was, and a problem on fixed batches then varies (and is re-checked)."""
    from hypergrad.problem import VARIANT_STRIDE
    from hypergrad.tasks import mlp

    calls: list[int] = []

    def factory() -> torch.nn.Module:
        calls.append(1)
        return mlp([64, 8, 10])  # float32: converted to the problem's float64

    q, module = _fixed_batch_problem(factory)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    lam = q.init_raw()
    w0 = q.initial_state(lam).params
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    with q.variant(2):
        w2 = q.initial_state(lam).params
        with torch.no_grad():
            v2 = float(q.objective(*q.run(lam)[:2], lam))
    assert torch.equal(torch.rand(3), expected_next)  # the caller's generator untouched
    torch.manual_seed(q.seed + 2 * VARIANT_STRIDE)
    built = mlp([64, 8, 10])
    for k, v in built.named_parameters():
        assert w2[k].dtype == torch.float64 and torch.equal(w2[k], v.detach().double())
        assert not torch.equal(w2[k], w0[k])
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())
    assert all(torch.equal(q.initial_state(lam).params[k], w0[k]) for k in w0)  # restored
    with q.variant(2), torch.no_grad():
        assert float(q.objective(*q.run(lam)[:2], lam)) == v2  # reproducible
    assert q.varies and len(calls) == 2
    res = hg.Trainer(q, callbacks=quiet(), mode=hg.Offline(outer_steps=2, recheck="auto")).fit()
    assert res.rechecked  # fixed batches, but other initial weights: re-checked


def test_a_bad_model_factory_is_refused_with_the_fix() -> None:
    q, module = _fixed_batch_problem(None)
    assert not q.varies
    with pytest.raises(TypeError, match="must be a callable that builds the model again"):
        _fixed_batch_problem(module)
    from hypergrad.tasks import mlp

    q, _ = _fixed_batch_problem(lambda: mlp([64, 9, 10]))
    with pytest.raises(ValueError, match="model_factory's model has shape"), q.variant(1):
        pass
    q, _ = _fixed_batch_problem(lambda: "not a model")
    with pytest.raises(TypeError, match="returned str"), q.variant(1):
        pass


def test_a_model_factory_with_batchnorm_gives_its_running_statistics_too() -> None:
    """A factory's model with BatchNorm: the variant's initial weights and running statistics
    are the factory's, and a plain run trains from them."""
    from hypergrad.data import MiniBatches
    from hypergrad.tasks import digits_data

    data = digits_data(n_train=32, n_val=32, n_test=32, dtype=torch.float64)

    def build() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.BatchNorm1d(8),
                                   torch.nn.Tanh(), torch.nn.Linear(8, 10)).double()

    torch.manual_seed(0)
    net = build()
    with torch.no_grad():
        net[1].running_mean.fill_(0.5)  # the problem's own statistics differ from a fresh one
    p = hg.InnerProblem(net, lambda m, b, hp: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.05, "log")]),
                        MiniBatches(data.x_train, data.y_train, batch_size=8), 4,
                        lambda m, hp: torch.nn.functional.cross_entropy(m(data.x_val),
                                                                        data.y_val),
                        model_factory=build)
    lam = p.init_raw()
    s0 = p.initial_state(lam)
    with p.variant(1):
        s1 = p.initial_state(lam)
        with torch.no_grad():
            v1 = float(p.objective(*p.run(lam)[:2], lam))
    assert torch.equal(s0.buffers["1.running_mean"], torch.full((8,), 0.5, dtype=torch.float64))
    assert torch.equal(s1.buffers["1.running_mean"], torch.zeros(8, dtype=torch.float64))
    assert not torch.equal(s1.params["0.weight"], s0.params["0.weight"])
    assert math.isfinite(v1)


def test_quasi_random_points_draw_one_level_per_schedule_and_example_weights() -> None:
    """The space-filling start, restarts and the leftover time place every window of a
    schedule (and every example's weight) at one quasi-random level of the box: a constant
    schedule; scalars and per-tensor entries each at their own. With
    ``SearchSettings(shared_start=())`` every entry draws its own."""
    from fixtures import mixed_problem

    p = mixed_problem("momentum", steps=6, windows=4)
    sl = p.hyperparams.slices
    tr = hg.Trainer(p, guards=hg.Guards(bounds={"lr": (1e-3, 1.0), "wd": (1e-5, 1e-1)}),
                    callbacks=quiet(), mode=hg.Offline(outer_steps=1, start=6))
    lo, hi = tr.box
    pts = tr._space_filling(6, 0)
    assert torch.equal(torch.stack(pts), torch.stack(tr._space_filling(8, 0)[:6]))
    assert torch.equal(pts[3], tr._space_filling(3, 3)[0])  # skip: the sequence goes on
    for x in pts:
        assert bool(((x >= lo) & (x <= hi)).all())
        u = (x - lo) / (hi - lo)
        assert float(u[sl["lr"]].max() - u[sl["lr"]].min()) < 1e-12  # one level
        assert float(u[sl["wd"]].max() - u[sl["wd"]].min()) > 1e-3  # per tensor
    levels = torch.stack([(x - lo) / (hi - lo) for x in pts])
    assert len({round(float(v), 9) for v in levels[:, sl["lr"].start]}) == 6  # 6 levels
    res = tr.fit()  # the start runs at these points
    starts = [e["lam"] for e in res.evaluations if e["kind"] == "start"][1:]
    assert len(starts) == 6 and all(torch.equal(a, b) for a, b in zip(starts, pts))

    own = hg.Trainer(p, guards=hg.Guards(bounds={"lr": (1e-3, 1.0), "wd": (1e-5, 1e-1)}),
                     callbacks=quiet(), mode=hg.Offline(outer_steps=1, start=6,
                                                        search={"shared_start": []}))
    u = (own._space_filling(1, 0)[0] - lo) / (hi - lo)
    assert float(u[sl["lr"]].max() - u[sl["lr"]].min()) > 1e-3  # per entry again

    q = digits_case("sgd", "per_example", **SMALL)
    x = hg.Trainer(q, guards=hg.Guards(bounds={"ex_w": (0.05, 0.95)}),
                   callbacks=quiet())._space_filling(2, 0)
    assert all(float(v.max() - v.min()) < 1e-12 for v in x) and float(x[0][0] - x[1][0]) != 0


def test_schedule_smoothing_couples_the_windows_of_each_schedule_only() -> None:
    from hypergrad.run.outer import schedule_smoothing

    items = [hg.Scalar("m", 0.5, "logit"), hg.Schedule("lr", 0.1, windows=10),
             hg.Schedule("wd", 0.1, windows=2), hg.PerTensor("x", 0.1)]
    hp = hg.HyperParams(items[:3])
    sparse = schedule_smoothing(hp.items, 0.2)
    assert sparse is not None and sparse.shape == (13, 13) and sparse.is_sparse
    p = sparse.to_dense()
    assert torch.allclose(p, p.T)
    eig = torch.linalg.eigvalsh(p)
    assert float(eig.min()) > 0 and abs(float(eig.max()) - 1.0) < 1e-12  # SPD, top 1
    block = p[1:11, 1:11]
    assert float(block[0, 1]) > float(block[0, 3]) > float(block[0, 9]) > 0  # neighbours most
    off = p.clone()
    off[1:11, 1:11] = torch.eye(10, dtype=p.dtype)
    assert torch.equal(off, torch.eye(13, dtype=p.dtype))  # scalar, 2 windows: untouched
    # a smooth change of the schedule keeps most of its size, window-to-window jitter does not
    ramp = torch.linspace(-1, 1, 10, dtype=p.dtype)
    jitter = torch.tensor([(-1.0) ** i for i in range(10)], dtype=p.dtype)
    assert float((block @ ramp).norm()) > 0.5 * float(ramp.norm())
    assert float((block @ jitter).norm()) < 0.1 * float(jitter.norm())
    assert schedule_smoothing(hp.items, None) is None
    assert schedule_smoothing(hg.HyperParams([items[0], items[2]]).items, 0.2) is None


def test_schedule_smoothing_builds_no_matrix_when_nothing_is_coupled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing to couple it built a K x K identity all the same: 1.95 GB for 16000
    per-example weights on every Trainer built (the per-example probe)."""
    from hypergrad.run.outer import schedule_smoothing

    def no_eye(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("a K x K identity was built")

    weights = hg.HyperParams([hg.PerExample("w", 1.0, n=16000),
                              hg.Schedule("wd", 0.1, windows=2)])
    monkeypatch.setattr(torch, "eye", no_eye)
    assert schedule_smoothing(weights.items, 0.2) is None
    assert schedule_smoothing(weights.items, None) is None


def test_a_schedule_beside_thousands_of_weights_keeps_its_coupling_sparse(
        tmp_path: Any) -> None:
    """A learning-rate schedule beside per-example weights: the preconditioner was a dense
    K x K matrix, the Trainer's largest object and written into every checkpoint (69 MiB at
    K = 3005, 2 GB at K = 16000). It holds the blocks and the diagonal now, the same matrix;
    a resume compares it (a dense one was compared as a tensor, a sparse one must be too)."""
    from hypergrad.data import MiniBatches
    from hypergrad.run.outer import schedule_smoothing

    big = hg.HyperParams([hg.PerExample("w", 1.0, n=16000), hg.Schedule("lr", 0.1, windows=10)])
    p = schedule_smoothing(big.items, 0.2)
    assert p is not None and p.is_sparse and p.shape == (16010, 16010)
    assert p._nnz() == 16000 + 100
    small = hg.HyperParams([hg.PerExample("w", 1.0, n=5), hg.Schedule("lr", 0.1, windows=10)])
    dense = schedule_smoothing(small.items, 0.2)
    assert dense is not None
    want = torch.eye(15, dtype=torch.float64)
    want[5:, 5:] = schedule_smoothing(small.items[1:], 0.2).to_dense()  # type: ignore[union-attr]
    assert torch.equal(dense.to_dense(), want)

    n = 3000
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,),
                                                                              generator=g)

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return (hp["w"][b[2]] * F.cross_entropy(m(b[0]), b[1], reduction="none")).mean()

    def problem() -> hg.InnerProblem:
        torch.manual_seed(0)
        return hg.InnerProblem(
            torch.nn.Linear(4, 3).double(), tl, hg.optim.sgd(lr="lr"),
            hg.HyperParams([hg.PerExample("w", 0.5, n=n, transform="logit"),
                            hg.Schedule("lr", 0.1, windows=3, transform="log")]),
            MiniBatches(x, y, batch_size=1000, seed=0), 3,
            lambda m, hp: F.cross_entropy(m(x[:200]), y[:200]))

    log: list[str] = []

    def trainer(steps: int, resume: bool = False) -> hg.Trainer:
        return hg.Trainer(problem(), method="reverse", callbacks=quiet() + [hg.run.Log(log.append)],
                          folder=hg.run.RunFolder(tmp_path / "run", resume=resume),
                          mode=hg.Offline(outer_steps=steps, start=0))

    tr = trainer(1)
    assert isinstance(tr.outer, QuasiNewton) and tr.outer.precondition is not None
    assert tr.outer.precondition.is_sparse
    tr.fit()
    ck = tmp_path / "run" / "checkpoint.pt"
    assert ck.stat().st_size < 2_000_000  # the dense matrix alone: 72 MB
    again = trainer(2, resume=True)
    again.fit()
    assert again.outer_step == 2 and any("resumed from" in line for line in log)
    assert not any("settings given now replace" in line for line in log), log  # the same
    # a checkpoint of the version before (2026-12-06) holds the matrix dense: the same one
    from hypergrad.run.files import load_checkpoint, save_checkpoint

    got = load_checkpoint(tmp_path / "run")
    assert got is not None
    ck = got[0]
    ck["outer_settings"]["precondition"] = ck["outer_settings"]["precondition"].to_dense()
    save_checkpoint(tmp_path / "run", ck)
    log.clear()
    trainer(3, resume=True).fit()
    assert any("resumed from" in line for line in log)
    assert not any("another tensor given" in line for line in log), log
    assert not any("another tensor given" in line for line in log)


def test_a_preconditioned_line_search_descends_along_the_smoothed_gradient() -> None:
    from hypergrad.run.outer import schedule_smoothing

    n = 8
    p = schedule_smoothing(hg.HyperParams([hg.Schedule("lr", 0.1, windows=n)]).items, 0.2)
    assert p is not None  # sparse, as the Trainer gives it (the tests below: its product)
    box = (torch.full((n,), -5.0, dtype=torch.float64), torch.full((n,), 5.0,
                                                                  dtype=torch.float64))
    target = torch.linspace(1.0, -1.0, n, dtype=torch.float64)
    x = torch.zeros(n, dtype=torch.float64)
    x0 = x.clone()
    opt = QuasiNewton([x], box=box, min_step=0.0, precondition=p)

    def f(v: torch.Tensor) -> float:
        return float(((v - target) ** 2).sum())

    g = 2 * (x - target) + 0.5 * torch.tensor([(-1.0) ** i for i in range(n)],
                                              dtype=torch.float64)  # a jittery gradient
    opt.value = f(x)
    x.grad = g.clone()
    opt.step(None)  # no closure: one step of the first (steepest) direction
    d = x / 10  # box units
    expect = -(p @ (g * 10))
    assert torch.allclose(d / d.norm(), expect / expect.norm(), atol=1e-12)
    smooth = -(p @ (2 * (x0 - target) * 10))  # the direction without the jitter

    def cos(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(a @ b / a.norm() / b.norm())

    assert cos(-g, 2 * (target - x0)) < 0.95 < 0.999 < cos(d, smooth)  # the jitter is gone
    x.zero_()
    opt = QuasiNewton([x], box=box, min_step=0.0, precondition=p)
    values = [f(x)]
    for _ in range(15):
        opt.value = f(x)
        x.grad = 2 * (x - target)
        opt.step(lambda: f(x))
        values.append(f(x))
        assert values[-1] <= values[-2]
    assert values[-1] < 1e-3 * values[0]  # L-BFGS with H0 = gamma P still converges


def test_the_default_quasi_newton_couples_schedule_windows_only_where_there_are_some() -> None:
    from hypergrad.run.outer import schedule_smoothing

    sched = digits_case("momentum", "schedule", windows=5, **SMALL)
    tr = hg.Trainer(sched, callbacks=quiet())
    assert isinstance(tr.outer, QuasiNewton) and tr.outer.precondition is not None
    want = schedule_smoothing(sched.hyperparams.items, 0.2)
    assert want is not None and bitwise_equal(tr.outer.precondition, want)
    assert SearchSettings().smooth_schedule == 0.2 and tr.search == SearchSettings()
    wider = hg.Trainer(sched, callbacks=quiet(), mode=hg.Offline.default(
        search=SearchSettings(smooth_schedule=0.4)))
    assert bitwise_equal(wider.outer.precondition,  # type: ignore[attr-defined]
                         schedule_smoothing(sched.hyperparams.items, 0.4))
    assert not bitwise_equal(wider.outer.precondition, want)  # type: ignore[attr-defined]
    from hypergrad.run.files import digest  # what the ranks compare: the entries tell apart
    assert digest(wider.outer.precondition) != digest(want)  # type: ignore[attr-defined]
    plain = hg.Trainer(lr_momentum(), callbacks=quiet())  # scalars: nothing to couple
    assert isinstance(plain.outer, QuasiNewton) and plain.outer.precondition is None
    off = hg.Trainer(sched, callbacks=quiet(),
                     mode=hg.Offline.default(search={"smooth_schedule": None}))
    assert isinstance(off.outer, QuasiNewton) and off.outer.precondition is None
    with pytest.raises(ValueError, match=r"precondition of shape \(5, 5\) needs one"):
        QuasiNewton([torch.zeros(3)], precondition=torch.eye(5))


def test_a_users_quasi_newton_gets_the_defaults_coupling_unless_it_brings_its_own() -> None:
    """``outer=functools.partial(QuasiNewton, ...)`` (and Hydra's ``outer_optimizer=
    quasi_newton``) is the default spelled out: the Trainer fills the schedule coupling as it
    fills the box; a matrix given (the identity: no coupling) is kept."""
    import functools

    from hypergrad.run.outer import schedule_smoothing

    sched = digits_case("momentum", "schedule", windows=5, **SMALL)
    want = schedule_smoothing(sched.hyperparams.items, SearchSettings().smooth_schedule)
    tr = hg.Trainer(sched, outer=functools.partial(QuasiNewton, step=0.3), callbacks=quiet())
    assert isinstance(tr.outer, QuasiNewton) and tr.outer.defaults["step"] == 0.3
    assert want is not None and bitwise_equal(tr.outer.precondition, want)
    k = sched.init_raw().numel()
    eye = torch.eye(k, dtype=torch.float64)
    own = hg.Trainer(sched, outer=functools.partial(QuasiNewton, precondition=eye),
                     callbacks=quiet())
    assert own.outer.precondition is eye  # type: ignore[attr-defined]


def test_the_defaults_without_a_time_budget_repeat_exactly() -> None:
    """No clock decides anything without a time budget (the start's points, the outer steps
    and the re-check are counts): two runs of the same problem and seed return the same point
    through the same evaluations, which is how docs/guide.md says to get a run that repeats."""
    def run() -> hg.TrainResult:
        p = digits_case("momentum", "schedule", **SMALL)  # batches drawn: re-checks run
        return hg.Trainer(p, guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                          callbacks=quiet()).fit()

    a, b = run(), run()
    assert a.rechecked and len(a.evaluations) > 4 and len(a.history) > 1
    assert torch.equal(a.lam, b.lam) and a.best_val_loss == b.best_val_loss
    assert [e["kind"] for e in a.evaluations] == [e["kind"] for e in b.evaluations]
    assert all(torch.equal(x["lam"], y["lam"]) for x, y in zip(a.evaluations, b.evaluations))
    assert [h["val_loss"] for h in a.history] == [h["val_loss"] for h in b.history]


def test_a_point_without_a_usable_hypergradient_sends_the_search_back_to_its_best(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart's quasi-random point where training is unstable (here: a learning rate above
    0.5, whose hypergradient is not finite) is not the tuning diverging: the default search
    goes back to its best point and restarts from there, the run goes on to its outer steps
    and re-checks; at the best point itself it still stops as diverged. The point's finite
    validation loss is a result all the same (returned where it is the lowest evaluated)."""
    calls: list[float] = []

    class Unstable(hg.ReverseMode):
        def hypergradient(self, problem: Any, lam: torch.Tensor) -> Any:
            got = super().hypergradient(problem, lam)
            lr = float(problem.hyperparams.describe(lam)["lr"])
            calls.append(lr)
            if lr > 0.5:  # an unstable region: the hypergradient is not finite
                return got._replace(grad=torch.full_like(got.grad, math.inf))
            if len(calls) == 1:  # uphill: the first line search stalls
                return got._replace(grad=-got.grad)
            return got

    said: list[str] = []
    p = lr_momentum()
    tr = hg.Trainer(p, Unstable(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                    mode=hg.Offline(outer_steps=4, start=0, recheck=2,
                                    search={"two_orders": 0}),  # one call per outer step
                    callbacks=[hg.run.Log(said.append), hg.run.Progress(False)])
    real = tr._restart
    hps = p.hyperparams

    def restart(why: str = "the line search stalled") -> bool:
        if len(calls) == 1:  # the first restart lands in the unstable region
            with torch.no_grad():  # raw: log lr, logit momentum
                tr.lam.copy_(torch.tensor([math.log(0.9), 0.0], dtype=tr.lam.dtype))
            tr.outer.state.clear()
            return True
        return real(why)

    monkeypatch.setattr(tr, "_restart", restart)
    with pytest.warns(hg.errors.TuningWarning, match=r"1 point\(s\) evaluated had a finite "
                                                     r"validation loss but a hypergradient"):
        res = tr.fit()  # said at the end: a run without a log never learned of it
    assert calls[1] == pytest.approx(0.9) and not res.diverged
    assert any("back to the best point" in m and "entries are not finite" in m for m in said)
    assert len(res.history) == 4 and len(res.rechecked) == 2
    # the point without a hypergradient is among the results (it was left out: 1.788 returned
    # where 1.684 had been evaluated, and the re-check in another order gave it 1.695), and
    # in the records
    assert float(hps.describe(res.lam)["lr"]) == pytest.approx(0.9)
    assert res.best_val_loss == min(e["val_loss"] for e in res.evaluations)
    assert [e["kind"] for e in res.evaluations].count("hypergradient not finite") == 1

    at_best = hg.Trainer(lr_momentum(), Unstable(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                         mode=hg.Offline(outer_steps=2, start=0), callbacks=quiet())
    with torch.no_grad():
        at_best.lam.copy_(torch.tensor([math.log(0.9), 0.0], dtype=at_best.lam.dtype))
    calls.clear()
    calls.append(0.0)  # no uphill step: the first hypergradient is at the unstable point
    assert at_best.fit().diverged  # nothing evaluated better to go back to


def test_search_settings_are_checked_and_enter_the_runs_fingerprint(tmp_path: Any) -> None:
    """``Offline(search=...)``: each setting checked (naming it and the fix); a changed one is
    in the mode's settings (every one, at the defaults too, since 2026-12-07: older
    checkpoints, which recorded the changed ones only, resume), so a run resumed with another
    search is refused, naming the key."""
    with pytest.raises(ValueError, match=r"shared_start names unknown kinds \['window'\]"):
        SearchSettings(shared_start=("window",))
    with pytest.raises(TypeError, match="shared_start='schedule' must be a list"):
        SearchSettings(shared_start="schedule")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="smooth_schedule=0 must be a positive share"):
        SearchSettings(smooth_schedule=0)
    with pytest.raises(TypeError, match="leftover=1 must be True or False"):
        SearchSettings(leftover=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown settings \['recheck_frist'\]"):
        hg.Offline(search={"recheck_frist": False})
    defaults = {f"mode.search.{k}": list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(SearchSettings()).items()}
    assert hg.Offline.default().settings() == {"mode": "offline", "mode.start": "auto",
                                               "mode.recheck": "auto", **defaults}
    mode = hg.Offline(outer_steps=2, search={"shared_start": ["schedule"],
                                             "trial_forecast": False})
    assert mode.search == SearchSettings(shared_start=("schedule",), trial_forecast=False)
    assert mode.settings()["mode.search.shared_start"] == ["schedule"]
    assert mode.settings()["mode.search.trial_forecast"] is False
    assert repr(mode) == ("Offline(outer_steps=2, search=SearchSettings(trial_forecast=False, "
                          "shared_start=('schedule',)))")

    def trainer(resume: bool, **search: Any) -> Any:
        return hg.Trainer(lr_momentum(), callbacks=quiet(),
                          folder=hg.RunFolder(tmp_path, resume=resume),
                          mode=hg.Offline(outer_steps=1, search=search))

    trainer(False, recheck_first=False).fit()
    with pytest.raises(Exception, match="mode.search.recheck_first"):
        trainer(True)
    assert trainer(True, recheck_first=False).outer_step == 1


def test_search_settings_from_a_hydra_config() -> None:
    """``hypergrad-run mode.search={...}`` or ``mode.search.<setting>=...``: the settings
    become the mode's; an unknown setting is refused by name at composition (one by one, the
    form a user writes first, failed: 'Key two_orders is not in struct'). The settings at their
    defaults fingerprint as a run of before, whose config held ``search: null``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException, InstantiationException
    from hydra.utils import instantiate

    from hypergrad.config import CONFIG_DIR, config_fingerprint, register_configs

    register_configs()

    def config(*overrides: str) -> Any:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose("config", overrides=list(overrides))

    def mode(*overrides: str) -> Any:
        return instantiate(config(*overrides).mode)

    got = mode("mode.search={smooth_schedule:null,shared_start:[schedule]}")
    assert got.search == SearchSettings(smooth_schedule=None, shared_start=("schedule",))
    assert mode("mode.search={recheck_pick:mean}").search == SearchSettings(recheck_pick="mean")
    assert mode("mode.search.two_orders=0", "mode.search.smooth_schedule=null").search == \
        SearchSettings(two_orders=0, smooth_schedule=None)
    assert mode().search == mode("mode.search=null").search == SearchSettings()
    with pytest.raises(InstantiationException, match="recheck_pick='best' must be one of"):
        mode("mode.search={recheck_pick:best}")
    with pytest.raises(ConfigCompositionException, match="Could not override 'mode.search'"):
        config("mode.search={bogus:1}")
    with pytest.raises(ConfigCompositionException, match="override 'mode.search.two_order'") \
            as typo:
        config("mode.search.two_order=0")
    assert "Key 'two_order' not in 'SearchSettingsConf'" in str(typo.value.__cause__)
    fp = config_fingerprint(config())
    assert not any(k.startswith("config.mode.search") for k in fp)
    assert config_fingerprint(config("mode.search=null")) == fp
    assert config_fingerprint(config("mode.search.two_orders=0"))[
        "config.mode.search.two_orders"] == 0


def test_a_budget_too_short_to_tune_warns() -> None:
    """A time budget that holds one hypergradient at most and returns the initial point says
    so (only ``TrainResult.out_of_time`` did)."""
    p = lr_momentum()
    with pytest.warns(hg.errors.TuningWarning, match=r"time_budget=0.0001 s ended tuning "
                                                     r"after 1 hypergradient"):
        res = hg.Trainer(p, guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}, time_budget=1e-4),
                         callbacks=quiet()).fit()
    assert res.out_of_time and torch.equal(res.lam, p.init_raw())


def _hypergradients(tr: hg.Trainer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each outer step's point and the hypergradient the Trainer's search used there."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = tr._hypergradient

    def spy(lam: torch.Tensor) -> Any:
        got = real(lam)
        seen.append((lam.clone(), got.grad.clone()))
        return got

    tr._hypergradient = spy  # type: ignore[method-assign]
    return seen


def test_the_search_averages_each_hypergradient_over_two_batch_orders() -> None:
    """``SearchSettings.two_orders``: at K <= 100, where runs vary, each hypergradient of the
    offline search is the mean of the problem's batch order's and variant 2's (the value the
    problem's own); above the bound, with ``two_orders=0``, where every run is the same, or
    with an outer optimizer that is no SearchOptimizer (the presets' Adam, SignDescent), one
    order."""
    def fit(p: hg.InnerProblem, **search: Any) -> tuple[hg.Trainer, list[Any], list[str]]:
        said: list[str] = []
        tr = hg.Trainer(p, "reverse", guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                        mode=hg.Offline(outer_steps=2, search=search),
                        callbacks=[hg.run.Log(said.append), hg.run.Progress(False)])
        seen = _hypergradients(tr)
        tr.fit()
        return tr, seen, said

    p = lr_momentum(steps=4)
    assert p.varies
    m = hg.ReverseMode()
    tr, seen, said = fit(p)
    assert len(seen) == 2 and any("mean of two batch orders'" in s and "one order: "
                                  "Offline.default(search={'two_orders': 0})" in s for s in said)
    for lam, grad in seen:
        own = m.hypergradient(p, lam)
        with p.variant(2):
            other = m.hypergradient(p, lam).grad
        assert not torch.allclose(own.grad, other)
        torch.testing.assert_close(grad, (own.grad + other) / 2, rtol=1e-12, atol=0)
    for search in ({"two_orders": 0}, {"two_orders": 1}):  # K = 2 above the bound
        _, seen, said = fit(lr_momentum(steps=4), **search)
        assert not any("batch orders" in s for s in said)
        for lam, grad in seen:
            torch.testing.assert_close(grad, m.hypergradient(p, lam).grad, rtol=1e-12, atol=0)
    adam = hg.Trainer(lr_momentum(steps=4), "reverse", outer=torch.optim.Adam,
                      mode=hg.Offline(outer_steps=2), callbacks=quiet())  # a preset's outer
    seen = _hypergradients(adam)
    adam.fit()
    assert seen and not adam._two_orders()
    for lam, grad in seen:
        torch.testing.assert_close(grad, m.hypergradient(p, lam).grad, rtol=1e-12, atol=0)
    fixed = lr_momentum(steps=4)
    fixed._seeded_source().shuffle = False  # the same batches every run: nothing to average
    assert not fixed.varies
    _, seen, said = fit(fixed)
    assert seen and not any("batch orders" in s for s in said)
    for bad, err in ((-1, ValueError), (True, TypeError), (1.5, TypeError), ("100", TypeError)):
        with pytest.raises(err, match=rf"two_orders={bad!r} must be an int >= 0: the largest K "
                                      rf".*Offline.default\(search="):
            SearchSettings(two_orders=bad)  # type: ignore[arg-type]
    assert SearchSettings(two_orders=np.int64(50)).two_orders == 50  # an integer of numpy's


def test_a_best_point_that_trains_well_in_one_draw_only_is_not_a_divergence() -> None:
    """A stream draws a pass per run, so the hypergradient's run at the best point measures it
    again on other batches; far above its first measurement (a point that trained well in
    one draw only), the run stopped as diverged and returned that very point. Now the point
    keeps its worse measurement, the search goes back to the next best and goes on."""
    said: list[str] = []
    hit: list[torch.Tensor] = []

    class OtherDraw(hg.ReverseMode):
        def hypergradient(self, problem: Any, lam: torch.Tensor) -> Any:
            got = super().hypergradient(problem, lam)
            best = tr.tracker.best
            if not hit and tr.history and best is not None and torch.equal(best[1], lam):
                hit.append(lam.clone())  # this draw: 20 times the first measurement
                return got._replace(objective=torch.full_like(got.objective, 20 * best[0]))
            return got

    tr = hg.Trainer(lr_momentum(), OtherDraw(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                    mode=hg.Offline(outer_steps=5, start=3, recheck=2,
                                    search={"two_orders": 0}),
                    callbacks=[hg.run.Log(said.append), hg.run.Progress(False)])
    res = tr.fit()
    assert hit and not res.diverged and len(res.history) == 5
    assert any("measured again on other batches" in s and "trains well in one draw only" in s
               for s in said)
    kept = {tuple(x.tolist()): v for v, x, _ in tr.tracker.top}
    assert kept.get(tuple(hit[0].tolist()), math.inf) > 10 * tr.tracker.best[0]
    assert not torch.equal(res.lam, hit[0])


def test_a_recheck_the_budget_has_no_room_for_is_said() -> None:
    """The reserve kept for the re-checks can be eaten (a plain run's time varies: at 10 ms
    a run, jitter is the whole reserve), and the re-check was skipped without a word: the
    point returned judged in one batch order only. Now the Trainer says so."""
    tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)},
                                                    time_budget=30.0), callbacks=quiet())
    unit_clock(tr)
    tr._reserve = lambda: 0.0  # type: ignore[method-assign]  # leftover runs fill the budget
    with pytest.warns(hg.errors.TuningWarning, match=r"time_budget=30 s left room to re-check "
                                                     r"0 of the 3 best points in another batch "
                                                     r"order, so none was compared"):
        res = tr.fit()
    assert res.rechecked == []


def test_the_leftover_runs_count_their_proposals_so_the_recheck_keeps_its_room() -> None:
    """The leftover plain runs counted only the plain run against the budget, not the
    surrogate's proposal before it (a fit over hundreds of points): the proposals ate the
    reserve, and the documented default search re-checked 0 of its 3 best points at every
    budget tried (configs.md's recipe, debug=fast, 8 and 15 s)."""
    tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)},
                                                    time_budget=60.0), callbacks=quiet())
    clock = unit_clock(tr)
    propose = tr.outer.next_point

    def slow_proposal(*args: Any, **kwargs: Any) -> Any:
        clock[0] += 5.0  # most of the reserve (4 plain runs x 1.5 here)
        return propose(*args, **kwargs)

    tr.outer.next_point = slow_proposal  # type: ignore[method-assign]
    res = tr.fit()  # warnings are errors: "left room to re-check 0 of the 3" would fail it
    assert len(res.rechecked) >= 2
    assert any(e["kind"] == "leftover" for e in res.evaluations)


def test_the_start_says_how_many_points_it_ran() -> None:
    """A budget with no room for the planned quasi-random points: the message said "2
    quasi-random points and the initial one" where only the initial one ran."""
    said: list[str] = []
    tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}, time_budget=3.0),
                    callbacks=[hg.run.Log(said.append), hg.run.Progress(False)])
    unit_clock(tr)
    with pytest.warns(hg.errors.TuningWarning):
        res = tr.fit()
    assert [e["kind"] for e in res.evaluations].count("start") == 1
    assert any("space-filling start: 0 quasi-random points of the 2 planned (the time budget "
               "left no room for more) and the initial one" in s for s in said), said


def test_forward_mode_averages_the_two_orders_as_reverse_mode_does() -> None:
    """Forward mode, a stepped method, took the problem's order alone while the log said each
    hypergradient was the mean of two (a resume that swapped reverse for forward, documented
    safe, ran another search; method='auto' picks forward at K = 1, and the long-horizon
    study's forward_defaults ran one order). Both now average, to rounding alike."""
    from hypergrad.testing import digits_case

    out = {}
    for m in ("reverse", "forward"):
        said: list[str] = []
        p = digits_case("momentum", "schedule", steps=6, n_train=24, batch_size=8, hidden=4,
                        n_val=16)
        out[m] = hg.Trainer(p, method=m, mode=hg.Offline(outer_steps=3),
                            callbacks=[hg.run.Log(said.append), hg.run.Progress(False)]).fit()
        assert any("two batch orders" in s for s in said), said
    assert (out["reverse"].history[0]["hypergrad_norm"]
            == pytest.approx(out["forward"].history[0]["hypergrad_norm"], rel=1e-10))
    torch.testing.assert_close(out["reverse"].lam, out["forward"].lam, rtol=1e-8, atol=1e-10)


def test_a_records_seconds_are_what_its_outer_step_took() -> None:
    """The record's seconds held the budget's forecast of the next step (a hypergradient and
    one line-search trial: 0.14 s where a step of 6 line-search runs took 0.30), printed by
    Progress and written to metrics.jsonl as the step's time."""
    tr = hg.Trainer(lr_momentum(), mode=hg.Offline(outer_steps=3, start=0, recheck=0),
                    callbacks=quiet())
    unit_clock(tr, plain=1.0, hypergradient=5.0)
    res = tr.fit()
    elapsed = [0.0] + [h["elapsed"] for h in res.history]
    took = [b - a for a, b in zip(elapsed, elapsed[1:])]
    assert [h["seconds"] for h in res.history] == pytest.approx(took)
    assert max(took) > 6.0  # a step with more than one line-search trial: not the forecast


def _spiking_clock(tr: hg.Trainer, costs: list[float]) -> list[float]:
    """:func:`unit_clock` (a plain run 1) whose hypergradients cost ``costs`` in turn (then
    5 each)."""
    clock = unit_clock(tr, plain=1.0, hypergradient=0.0)
    grad, left = tr.method.hypergradient, list(costs)

    def spiking(*args: Any, **kwargs: Any) -> Any:
        clock[0] += left.pop(0) if left else 5.0
        return grad(*args, **kwargs)

    tr.method.hypergradient = spiking  # type: ignore[method-assign]
    return clock


def test_one_slow_outer_step_does_not_end_the_descent() -> None:
    """The next outer step was forecast as long as the last: one slow step (a pause, another
    process's burst: 10-50x on a busy 2-core machine) stopped the descent with most of the
    budget left (the time budget probe); the median of the last three forecasts it now."""
    def trainer() -> hg.Trainer:
        return hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)},
                                                          time_budget=140.0),
                          mode=hg.Offline(outer_steps=None, start=0, recheck=2),
                          outer=functools.partial(hg.run.QuasiNewton, step=0.05),
                          callbacks=quiet())

    steady = trainer()
    _spiking_clock(steady, [])
    spiked = trainer()
    _spiking_clock(spiked, [5.0, 5.0, 5.0, 60.0])  # two orders: outer step 1 is slow
    n_steady, n_spiked = len(steady.fit().history), len(spiked.fit().history)
    assert n_steady >= 8 and n_spiked >= 5  # it stopped after 2


def test_a_slow_run_before_the_re_checks_does_not_leave_the_point_unchecked() -> None:
    """The last plain run before the end took 5x its time and ate the reserve kept for the
    re-checks: none ran, and the run warned (the guide's example, 3 of 5 runs on a busy
    machine). They may now run past the budget by the reserve's length."""
    tr = hg.Trainer(lr_momentum(), guards=hg.Guards(bounds={"lr": (1e-3, 1.0)},
                                                    time_budget=140.0),
                    mode=hg.Offline(outer_steps=None, start=0, recheck=2),
                    outer=functools.partial(hg.run.QuasiNewton, step=0.05), callbacks=quiet())
    clock = unit_clock(tr, plain=0.0, hypergradient=5.0)
    run = tr.problem.run

    def slow_at_the_end(*args: Any, **kwargs: Any) -> Any:
        clock[0] += 5.0 if 133.0 <= clock[0] < 134.6 else 1.0
        return run(*args, **kwargs)

    tr.problem.run = slow_at_the_end  # type: ignore[method-assign]
    res = tr.fit()
    assert len(res.rechecked) == 2
    assert 140.0 < clock[0] <= 140.0 + 3 * 1.5 + 1.0  # past the budget by the reserve at most


def test_a_checkpoint_of_an_earlier_version_says_which_search_settings_it_goes_on_with(
        tmp_path: Any) -> None:
    """Checkpoints recorded only the search settings that differed from their version's
    defaults: a run begun before two_orders existed (one batch order per hypergradient) went
    on with two after an upgrade without a word, and giving two_orders=0 to continue as it
    began was refused ('<absent>' -> 0; the version-skew probe). Every setting is recorded
    now; an earlier checkpoint's missing ones are not compared, and said."""
    from hypergrad.errors import CheckpointWarning, ResumeMismatchError
    from hypergrad.run.files import load_checkpoint, save_checkpoint

    def trainer(steps: int, resume: bool, **search: Any) -> Any:
        return hg.Trainer(lr_momentum(), callbacks=quiet(),
                          folder=hg.RunFolder(tmp_path, resume=resume),
                          mode=hg.Offline(outer_steps=steps, search=search))

    trainer(1, False).fit()
    got = load_checkpoint(tmp_path)
    assert got is not None
    ck = got[0]
    recorded = {k: v for k, v in ck["fingerprint"].items() if k.startswith("trainer.mode.search.")}
    assert recorded["trainer.mode.search.two_orders"] == 100 and len(recorded) == 8
    with pytest.raises(ResumeMismatchError, match=r"two_orders: 100 -> 0"):
        trainer(2, True, two_orders=0)  # recorded now: a change is refused
    for k in recorded:  # as a checkpoint of 2026-12-06 holds them at the defaults
        del ck["fingerprint"][k]
    save_checkpoint(tmp_path, ck)
    with pytest.warns(CheckpointWarning, match=r"recorded only the search settings it changed: "
                                               r"the run goes on with .*two_orders=100"):
        assert trainer(2, True).fit() is not None
    save_checkpoint(tmp_path, ck)
    with pytest.warns(CheckpointWarning, match="two_orders=0"):
        assert trainer(2, True, two_orders=0).outer_step == 1  # as it began: not refused
