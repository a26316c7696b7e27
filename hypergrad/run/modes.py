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


class Offline(Mode):
    """Forward-mode HO (Franceschi et al. 2017): every outer step trains ``T`` inner steps from
    the initial state, takes ``dE/dlam`` at step ``T`` (any :class:`~hypergrad.Method`) and
    updates ``lam`` with the outer optimizer.

    Args:
        outer_steps: hyperparameter updates (each a full inner run of ``T`` steps). A resumed
            run may ask for more.

    Example:
        >>> Offline(outer_steps=20)
        Offline(outer_steps=20)
    """

    name = "offline"

    def __init__(self, outer_steps: int = 10) -> None:
        self.outer_steps = _count("Offline", "outer_steps", outer_steps, 0)

    def __repr__(self) -> str:
        return f"Offline(outer_steps={self.outer_steps})"


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
