"""When the Trainer updates the hyperparameters: :class:`Offline` (a whole inner run per outer
step) or :class:`Online` (every ``interval`` inner steps of one run)."""

from __future__ import annotations

from typing import Any

from ..problem import InnerProblem

__all__ = ["Offline", "Online", "Mode"]


def _count(api: str, name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{api}: {name}={value!r} must be an int >= {low}.")
    return value


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
            :data:`hypergrad.run.trainer.SHARED_START`); tuning descends from the best of them.
            ``"auto"``: 15% of the time budget (2 to 8 points), or 4 points without a budget.
            ``0`` (default here): start at the initial point. The Trainer's default mode
            (``mode=None``) is :meth:`Offline.default`.
        recheck: before returning, ``recheck`` distinct points evaluated (the best ones and
            the point the first hypergradient was taken at, where the descent started:
            :data:`hypergrad.run.trainer.RECHECK_FIRST`) are trained
            again in another draw of the run's randomness (another mini-batch order and other
            dropout draws: :meth:`InnerProblem.variant <hypergrad.InnerProblem.variant>`), and
            the one with the lowest mean validation loss over both runs is returned. One
            training run judges its own point: a point near the edge of stable training can
            score best at one batch order and two to ten times worse at the next (found on the
            suite's development half). The time budget keeps room for these runs. ``"auto"``:
            3 points where the problem's runs can vary (:attr:`InnerProblem.varies
            <hypergrad.InnerProblem.varies>`), else none; ``0`` (default here): return the best
            point of one run.

    Example:
        >>> Offline(outer_steps=20)
        Offline(outer_steps=20)
        >>> Offline.default()
        Offline(outer_steps=None, start='auto', recheck='auto')
    """

    name = "offline"

    def __init__(self, outer_steps: int | None = 10, start: int | str = 0,
                 recheck: int | str = 0) -> None:
        self.outer_steps = (None if outer_steps is None
                            else _count("Offline", "outer_steps", outer_steps, 0))
        if start != "auto":
            start = _count("Offline", "start", start, 0)
        self.start = start
        if recheck != "auto":
            recheck = _count("Offline", "recheck", recheck, 0)
        self.recheck = recheck

    @classmethod
    def default(cls) -> Offline:
        """The Trainer's default mode: ``Offline(outer_steps=None, start="auto",
        recheck="auto")``: the time budget (else 10 outer steps) ends it, after a
        space-filling start; the best points are re-checked in another batch order."""
        return cls(outer_steps=None, start="auto", recheck="auto")

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
        return out

    def __repr__(self) -> str:
        args = [f"outer_steps={self.outer_steps}"]
        if self.start != 0:
            args.append(f"start={self.start!r}")
        if self.recheck != 0:
            args.append(f"recheck={self.recheck!r}")
        return f"Offline({', '.join(args)})"


class Online(Mode):
    """One training run (RTHO, same paper; HD; MARTHE): every ``interval`` inner steps ``lam`` is
    updated from the hypergradient an :class:`~hypergrad.OnlineMethod` gives at that step, and
    training goes on.

    Args:
        interval: inner steps between updates (in ``[1, T]``).
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
        self.reset_tangents = bool(reset_tangents)

    def check(self, problem: InnerProblem) -> None:
        if self.interval > problem.steps:
            raise ValueError(f"Online: interval={self.interval} must be in [1, steps="
                             f"{problem.steps}] (the inner run's length).")

    def settings(self) -> dict[str, Any]:
        return {"mode": self.name, "mode.interval": self.interval,
                "mode.reset_tangents": self.reset_tangents}

    def __repr__(self) -> str:
        return f"Online(interval={self.interval}, reset_tangents={self.reset_tangents})"
