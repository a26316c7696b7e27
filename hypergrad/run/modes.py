"""When the Trainer updates the hyperparameters: :class:`Offline` (a whole inner run per outer
step) or :class:`Online` (every ``interval`` inner steps of one run)."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..problem import InnerProblem

__all__ = ["Offline", "Online", "Mode", "SearchSettings"]


def _count(api: str, name: str, value: Any, low: int, auto: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < low:
        also = ' or "auto"' if auto else ""
        raise ValueError(f"{api}: {name}={value!r} must be an int >= {low}{also}.")
    return int(value)


class Mode:
    """What both modes share: ``name`` and ``online``."""

    name = "abstract"
    online = False

    def check(self, problem: InnerProblem) -> None:
        """Refuse settings that do not fit ``problem``."""

    def settings(self) -> dict[str, Any]:
        """The settings that change a run's result (in its fingerprint)."""
        return {"mode": self.name}


START_SHARE = 0.15
"""``start="auto"`` with a time budget: the share of the budget the space-filling start spends
(plain runs at quasi-random points of the box), between :data:`START_MIN` and
:data:`START_MAX` points."""
START_MIN, START_MAX = 2, 8
START_NO_BUDGET = 4
"""``start="auto"`` without a time budget: this many quasi-random points."""
STEPS_NO_BUDGET = 10
"""``outer_steps=None`` without a time budget: this many outer steps."""
RECHECK_AUTO = 3
"""``recheck="auto"``: the best points re-checked in another batch order before one is
returned (when the problem's runs can vary: :attr:`InnerProblem.varies
<hypergrad.InnerProblem.varies>`)."""

RECHECK_PICKS: dict[str, Callable[[float, float], float]] = {
    "worse": max, "mean": lambda a, b: (a + b) / 2}
"""``SearchSettings.recheck_pick``'s choices: each one's score of a re-checked point from its
losses in the two batch orders (the lowest score is returned)."""


def _kinds() -> set[str]:
    """The hyperparameter kinds (``kind`` of every class in :mod:`hypergrad.hyperparams`)."""
    from .. import hyperparams

    return {k for obj in vars(hyperparams).values() if isinstance(obj, type)
            and isinstance(k := getattr(obj, "kind", None), str) and k != "base"}


@dataclass(frozen=True)
class SearchSettings:
    """The default search's settings that are not the mode's counts (``Offline(search=...)``).
    Each default was weighed on the suite's development half or the long-horizon study's
    development seeds (docs/benchmarks_history.md); change one to compare, not to tune a
    problem.

    Args:
        recheck_first: the re-check (``Offline(recheck=...)``) always compares the point the
            first hypergradient was taken at (where the descent started: the space-filling
            start's best, or the initial point) with the best points found after it, so that a
            descent whose points fit the tuning run's batch order is judged against its start in
            another order. ``False``: the best points only.
        leftover: with a :class:`~hypergrad.run.outer.SearchOptimizer` (the defaults) and a
            time budget, spend the time left when no hypergradient fits any more on plain
            runs: a line search from the best point along its hypergradient where none started
            there yet, then quasi-random points.
        trial_forecast: forecast an outer step as its hypergradient and one plain run: the next
            hypergradient is taken only with room for its line search's first trial after it
            (without, a budget that just held one ended on a hypergradient nothing was tried
            along; weighed neutral on results: 1.001x and 0.9995x, 83 of 90 seeds identical).
        shared_start: the hyperparameter kinds whose entries quasi-random points (the
            space-filling start, restarts, the leftover time) place at one level of the box:
            every window of a :class:`~hypergrad.Schedule` (a constant schedule) and every
            example's weight of a :class:`~hypergrad.PerExample` (a uniform weighting); every
            other entry draws its own. Drawn per window, nearly every point is a jagged
            schedule, and drawn per example a random weighting of the training set; the descent
            from the best point moves the entries apart. Per-feature and per-tensor penalties
            keep their own draws: which entries to penalise is what they tune. Measured (shared
            / per entry, mean test loss): the long-horizon teacher schedule (10 windows, T =
            1000, development seeds 10-15, ``experiments/start_dev.py``) 0.774 / 0.799, better
            at 5 of 6 seeds; the suite's development half, 10 seeds: digits_hypercleaning 1.645
            / 1.729, diabetes_adamw_k14 0.538 / 0.532 (within its noise); per-feature penalties
            shared too lost (cancer_per_feature_l2_adam 0.079 / 0.065,
            synth_sparse_per_feature_l2 0.161 / 0.140).
        smooth_schedule: the default :class:`~hypergrad.run.outer.QuasiNewton`'s coupling of a
            schedule's windows: the length scale of
            :func:`~hypergrad.run.outer.schedule_smoothing`'s kernel as a share of the windows
            (0.2: two windows of a 10-window schedule); ``None``: every window on its own.
            Measured with the defaults, coupled / not (mean test loss): the teacher schedule at
            T = 5000, development seeds 10-12, 0.693 / 0.706, better at every seed (length 0.3:
            0.695); at T = 1000, seeds 10-15, 0.771 / 0.774; diabetes_adamw_k14 (10 seeds)
            0.537 / 0.539.

        recheck_pick: how the re-check (``Offline(recheck=...)``) chooses among the points it
            trained in both batch orders. ``"worse"``: the point whose worse loss of the two
            is lowest (a point that trains well in one order only is not returned over one
            that trains alike in both). ``"mean"``: the lowest mean of the two (the default
            until 2026-11-29). Measured on the suite, the same searches judged both ways (every
            re-checked point retrained at the retrain seeds; ``experiments/recheck_pick.py``,
            10 seeds): test losses 0.998x on the development half (0.984x in a first run) and
            0.957x on the evaluation half; 19 of 170 runs return another point, lower at 13.
            Most swaps are between near neighbours (0.95x-1.10x); the large gains are the rare
            point that trains well in one order only (wine_per_tensor_lr at tuning seed 6:
            validation 0.011 in its order, 0.168 in the other, test 0.49; returned instead:
            0.096 / 0.105, test 0.071). That seed, the evaluation half's worst, prompted the
            rule, so its gain there is not independent evidence; the development half's is,
            and so are the ablation's searches (``--tuner ablation``, chosen after): 0.989x
            and 0.997x, 19 of 170 runs changed, lower at 12.
        rough_plain: with a :class:`~hypergrad.run.Surrogate` and a time budget, once its model
            treats the hypergradients as noise (they contradict the plain runs' losses: a loss
            rough in the hyperparameters, docs/troubleshooting.md, "Rough losses"), the time
            left goes to plain runs at its proposals instead of more hypergradients, each of
            which costs several plain runs and no longer moves the model. Measured on the
            long-horizon language model (docs/benchmarks.md); the suite's problems never
            trigger it.

        two_orders: the largest K at which each hypergradient of the offline search with a
            :class:`~hypergrad.run.outer.SearchOptimizer` (the default outer optimizers,
            ``QuasiNewton`` and ``Surrogate``; not Adam or ``SignDescent``, whose presets
            were weighed with one order) is the mean of two: in the problem's batch order and
            in another
            (:meth:`InnerProblem.variant <hypergrad.InnerProblem.variant>` ``2``; the re-check
            uses ``1``), the value staying the problem's own. A point that trains well in one
            order only has hypergradients that disagree in that order's direction and agree
            in the expected loss's; the cost is a second hypergradient per outer step. Only
            where the problem's runs vary (:attr:`InnerProblem.varies
            <hypergrad.InnerProblem.varies>`); ``0``: one order always. Measured on the
            suite's development half (20 seeds, ``--variants two_orders`` against the one
            order): geometric mean of the test losses 0.976x, cancer_per_feature_l2_adam
            (K = 30) 0.917x beyond two standard errors, digits_hypercleaning (K = 200) 1.008x
            beyond two standard errors, the rest within their noise; the bound of 100 (the
            surrogate model's largest K, :data:`~hypergrad.run.outer.SURROGATE_K`) was chosen
            after that run to leave K = 200 out. On the evaluation half, then: 1.005x against
            the one-order run at the same seeds, every problem within two standard errors
            (docs/benchmarks.md). Until 2026-12-06 forward mode (a stepped method) took one
            order while the log said two; every exact method averages now, so the long-horizon
            study (whose forward contenders run ``ForwardMode()``) has not measured it yet.

    Example:
        >>> SearchSettings(recheck_first=False)
        SearchSettings(recheck_first=False)
        >>> Offline(outer_steps=None, start="auto", search={"smooth_schedule": None})
        Offline(outer_steps=None, start='auto', search=SearchSettings(smooth_schedule=None))
    """

    recheck_first: bool = True
    leftover: bool = True
    trial_forecast: bool = True
    shared_start: tuple[str, ...] = ("schedule", "per_example")
    smooth_schedule: float | None = 0.2
    rough_plain: bool = True
    recheck_pick: str = "worse"
    two_orders: int = 100

    def __post_init__(self) -> None:
        for name in ("recheck_first", "leftover", "trial_forecast", "rough_plain"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"SearchSettings: {name}={getattr(self, name)!r} must be True or "
                                f"False.")
        if self.recheck_pick not in RECHECK_PICKS:
            raise ValueError(f"SearchSettings: recheck_pick={self.recheck_pick!r} must be one of "
                             f"{sorted(RECHECK_PICKS)} ('worse': the lowest worse loss of the "
                             f"two batch orders, 'mean': the lowest mean).")
        t = self.two_orders
        what = ("the largest K whose hypergradients average two batch orders (0: one order "
                "always), e.g. Offline.default(search={'two_orders': 0})")
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"SearchSettings: two_orders={t!r} must be an int >= 0: {what}.")
        if t < 0:
            raise ValueError(f"SearchSettings: two_orders={t!r} must be an int >= 0: {what}.")
        object.__setattr__(self, "two_orders", int(t))
        shared = self.shared_start
        if isinstance(shared, str) or not all(isinstance(k, str) for k in shared):
            raise TypeError(f"SearchSettings: shared_start={shared!r} must be a list of "
                            f"hyperparameter kinds, e.g. ['schedule', 'per_example'].")
        unknown = sorted(set(shared) - _kinds())
        if unknown:
            raise ValueError(f"SearchSettings: shared_start names unknown kinds {unknown}; the "
                             f"kinds are {sorted(_kinds())}.")
        object.__setattr__(self, "shared_start", tuple(shared))
        s = self.smooth_schedule
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float))
                              or not s > 0 or s == float("inf")):
            raise ValueError(f"SearchSettings: smooth_schedule={s!r} must be a positive share "
                             f"of the windows (0.2: two of ten) or None (windows uncoupled).")

    @classmethod
    def of(cls, value: SearchSettings | Mapping[str, Any] | None) -> SearchSettings:
        """``value`` as settings: ``None`` the defaults, a mapping of fields (a config's)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(map(str, value)) - names)
            if unknown:
                raise ValueError(f"Offline: search has unknown settings {unknown}; the settings "
                                 f"are {sorted(names)}.")
            return cls(**{str(k): v for k, v in value.items()})
        raise TypeError(f"Offline: search={value!r} must be a SearchSettings, a mapping of its "
                        f"fields, or None (the defaults).")

    def recheck_score(self, a: float, b: float) -> float:
        """The score by which the re-check ranks a point from its losses ``a`` and ``b`` in the
        two batch orders (:attr:`recheck_pick`; the lowest is returned)."""
        return RECHECK_PICKS[self.recheck_pick](a, b)

    def changed(self) -> dict[str, Any]:
        """The settings that differ from the defaults (lists for tuples: JSON-like)."""
        base = SearchSettings()
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(base, f.name)}

    def __repr__(self) -> str:
        return (f"SearchSettings("
                f"{', '.join(f'{k}={getattr(self, k)!r}' for k in self.changed())})")


class Offline(Mode):
    """Forward-mode HO (Franceschi et al. 2017): every outer step trains ``T`` inner steps from
    the initial state, takes ``dE/dlam`` at step ``T`` (any :class:`~hypergrad.Method`) and
    updates ``lam`` with the outer optimizer.

    Args:
        outer_steps: hyperparameter updates (each a full inner run of ``T`` steps). A resumed
            run may ask for more. ``None``: until ``Guards(time_budget=...)`` ends the run, or
            10 without a budget.
        start: a space-filling start: before the first hypergradient, plain inner runs (no
            hypergradient: about a fifth of the cost) at the initial point and at ``start``
            quasi-random points of the search box (a scrambled Sobol sequence seeded by the
            problem's seed; a schedule's windows at one level:
            ``search.shared_start``); tuning descends from the best of them.
            ``"auto"``: 15% of the time budget (2 to 8 points), or 4 points without a budget.
            ``0`` (default here): start at the initial point. The Trainer's default mode
            (``mode=None``) is :meth:`Offline.default`.
        recheck: before returning, ``recheck`` (0, or 2 or more) distinct points evaluated (the
            best ones and
            the point the first hypergradient was taken at, where the descent started:
            ``search.recheck_first``) are trained
            again in another draw of the run's randomness (another mini-batch order and other
            dropout draws: :meth:`InnerProblem.variant <hypergrad.InnerProblem.variant>`), and
            the one whose worse validation loss of the two runs is lowest is returned
            (``search.recheck_pick``). One
            training run judges its own point: a point near the edge of stable training can
            score best at one batch order and two to ten times worse at the next (found on the
            suite's development half). The time budget keeps room for these runs. ``"auto"``:
            3 points where the problem's runs can vary (:attr:`InnerProblem.varies
            <hypergrad.InnerProblem.varies>`), else none; ``0`` (default here): return the best
            point of one run.
        search: the default search's other settings (:class:`SearchSettings`, or a mapping of
            its fields; ``None``: the defaults), for comparisons; in the run's fingerprint.

    Example:
        >>> Offline(outer_steps=20)
        Offline(outer_steps=20)
        >>> Offline.default()
        Offline(outer_steps=None, start='auto', recheck='auto')
    """

    name = "offline"

    def __init__(self, outer_steps: int | None = 10, start: int | str = 0,
                 recheck: int | str = 0,
                 search: SearchSettings | Mapping[str, Any] | None = None) -> None:
        self.outer_steps = (None if outer_steps is None
                            else _count("Offline", "outer_steps", outer_steps, 0))
        if start != "auto":
            start = _count("Offline", "start", start, 0, auto=True)
        self.start = start
        if recheck != "auto":
            recheck = _count("Offline", "recheck", recheck, 0, auto=True)
            if recheck == 1:  # it ran without a word and re-checked nothing
                raise ValueError("Offline: recheck=1 compares nothing: the re-check chooses "
                                 "among the points it trains again, so it needs 2 or more "
                                 "(\"auto\": 3 where the problem's runs vary); give 0 for "
                                 "none.")
        self.recheck = recheck
        self.search = SearchSettings.of(search)

    @classmethod
    def default(cls, search: SearchSettings | Mapping[str, Any] | None = None) -> Offline:
        """The Trainer's default mode: ``Offline(outer_steps=None, start="auto",
        recheck="auto")``: the time budget (else 10 outer steps) ends it, after a
        space-filling start; the best points are re-checked in another batch order.
        ``search``: other search settings (:class:`SearchSettings`), for comparisons."""
        return cls(outer_steps=None, start="auto", recheck="auto", search=search)

    def recheck_points(self, problem: InnerProblem) -> int:
        """How many of the best points to re-check before returning one (0: none)."""
        if self.recheck == "auto":
            return RECHECK_AUTO if problem.varies else 0
        return int(self.recheck)

    def steps(self, time_budget: float | None) -> float:
        """How many outer steps to run (``inf``: until the time budget ends the run)."""
        if self.outer_steps is not None:
            return self.outer_steps
        return float("inf") if time_budget is not None else STEPS_NO_BUDGET

    def start_points(self, time_budget: float | None, plain_seconds: float) -> int:
        """How many quasi-random points the start evaluates (``plain_seconds``: one plain
        run's time)."""
        if self.start != "auto":
            return int(self.start)
        if time_budget is None:
            return START_NO_BUDGET
        n = round(START_SHARE * time_budget / max(plain_seconds, 1e-9))
        return max(START_MIN, min(START_MAX, n))

    def settings(self) -> dict[str, Any]:
        out = super().settings()
        if self.start != 0:
            out["mode.start"] = self.start
        if self.recheck != 0:
            out["mode.recheck"] = self.recheck
        # every setting, at its default too (since 2026-12-07): a checkpoint that recorded only
        # the changed ones resumed under a later version's new default without a word (a run
        # begun with one batch order per hypergradient went on with two)
        for f in dataclasses.fields(self.search):
            v = getattr(self.search, f.name)
            out[f"mode.search.{f.name}"] = list(v) if isinstance(v, tuple) else v
        return out

    def __repr__(self) -> str:
        args = [f"outer_steps={self.outer_steps}"]
        if self.start != 0:
            args.append(f"start={self.start!r}")
        if self.recheck != 0:
            args.append(f"recheck={self.recheck!r}")
        if self.search.changed():
            args.append(f"search={self.search!r}")
        return f"Offline({', '.join(args)})"


class Online(Mode):
    """One training run (RTHO, same paper; HD; MARTHE): every ``interval`` inner steps ``lam`` is
    updated from the hypergradient an :class:`~hypergrad.OnlineMethod` gives at that step, and
    training goes on.

    Args:
        interval: inner steps between updates (in ``[1, T]``); one more update follows the
            last step where ``interval`` does not divide ``T`` (5 with ``T = 12``: after steps
            5, 10 and 12).
        reset_tangents: truncate after each update (``method.truncate``: for forward mode and
            MARTHE ``Z = 0``), so each hypergradient sees only the last ``interval`` steps.

    Example:
        >>> Online(interval=5)
        Online(interval=5, reset_tangents=False)
    """

    name = "online"
    online = True

    def __init__(self, interval: int = 10, reset_tangents: bool = False) -> None:
        self.interval = _count("Online", "interval", interval, 1)
        if not isinstance(reset_tangents, int) or reset_tangents not in (0, 1):
            # bool("false") is True: a string would truncate where the caller said not to
            raise TypeError(f"Online: reset_tangents={reset_tangents!r} must be True or False.")
        self.reset_tangents = bool(reset_tangents)

    def check(self, problem: InnerProblem) -> None:
        if self.interval > problem.steps:
            raise ValueError(f"Online: interval={self.interval} must be in [1, steps="
                             f"{problem.steps}] (the inner run's length): update the "
                             f"hyperparameters at least once per run, or train longer "
                             f"(hypergrad-run: mode.interval, task.steps).")
        init = [h.name for h in problem.hyperparams.init_items]
        if init:  # the run left its initial weights before the first update
            raise ValueError(
                f"Online: {init} set the initial weights, which one online run has left behind "
                f"at its first update: their updates would never reach the run (the run "
                f"trained from the initial values, the values returned were never trained "
                f"with; HD's hypergradient for them is exactly 0). Tune them offline "
                f"(mode=hg.Offline(...)), or drop them from the online run's hyperparameters.")

    def settings(self) -> dict[str, Any]:
        return {"mode": self.name, "mode.interval": self.interval,
                "mode.reset_tangents": self.reset_tangents}

    def __repr__(self) -> str:
        return f"Online(interval={self.interval}, reset_tangents={self.reset_tangents})"
