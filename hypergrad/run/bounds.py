"""Bounds on hyperparameters, given in value space and applied to the raw ones by projection.

Every transform (identity, log, logit) is increasing, so a box ``[low, high]`` on the values is
the box ``[inverse(low), inverse(high)]`` on the raw coordinates, and clamping the raw
coordinates is the projection onto it. Bounds are checked once, here, against the domain of the
transform (a learning rate's bound must be > 0), so a typo fails before any training.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..hyperparams import TRANSFORMS, HyperParams, rounded_onto_edge

__all__ = ["Bounds"]


class Bounds:
    """``{name: (low, high)}`` in value space (either end may be ``None``: unbounded), for the
    hyperparameters ``hps`` in ``dtype``. One pair bounds every entry of its hyperparameter
    (each window of a schedule, each tensor of a per-tensor value). An infinite end on its own
    side (``low=-inf``, ``high=inf``, or a number that rounds to one in ``dtype``) is no bound,
    as ``None``: the search box then fills that side around the initial value.

    Example:
        >>> import hypergrad as hg
        >>> hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
        >>> b = Bounds(hps, torch.float64, {"lr": (None, 0.05)})
        >>> lam = hps.init_raw(torch.float64)
        >>> b.project(lam)
        >>> round(hps.describe(lam)["lr"], 12)
        0.05
    """

    def __init__(self, hps: HyperParams, dtype: torch.dtype,
                 bounds: Mapping[str, Sequence[float | None]] | None = None,
                 api: str = "Trainer") -> None:
        self.hps = hps
        self.raw: dict[str, tuple[Tensor | None, Tensor | None]] = {}
        for name, lohi in (bounds or {}).items():
            if name not in hps.by_name:
                raise ValueError(f"{api}: bounds name {name!r} is not a hyperparameter; defined "
                                 f"are {hps.names}.")
            if isinstance(lohi, (str, bytes)) or not isinstance(lohi, Sequence) or len(lohi) != 2:
                raise ValueError(f"{api}: bounds[{name!r}]={lohi!r} must be (low, high), "
                                 f"either may be None.")
            transform = hps.by_name[name].transform
            inverse, valid, domain = TRANSFORMS[transform][1:]
            raw: list[Tensor | None] = []
            for side, v in zip(("low", "high"), lohi):
                if v is None:
                    raw.append(None)
                    continue
                if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v:
                    per_entry = (" (one pair bounds every entry of the hyperparameter: per-entry "
                                 "bounds are not supported)"
                                 if isinstance(v, (Sequence, Tensor)) and not isinstance(v, str)
                                 else "")
                    raise ValueError(f"{api}: bounds[{name!r}]={list(lohi)!r} has {v!r}; bounds "
                                     f"are numbers (or None for no bound){per_entry}.")
                try:
                    f = float(v)
                except OverflowError:  # an int beyond float64: an infinite end
                    f = math.inf if v > 0 else -math.inf
                t = torch.tensor(f, dtype=dtype)
                if not valid(t):
                    raise ValueError(f"{api}: bounds[{name!r}] value {v} is outside the domain "
                                     f"of transform={transform!r} ({domain})"
                                     f"{rounded_onto_edge(v, dtype, valid)}; give a bound in "
                                     f"that domain, or None for no {side} bound.")
                r = inverse(t)
                if bool(torch.isinf(r)):
                    # an infinite end became an infinite edge of the search box: its start
                    # drew points at inf and NaN. On its own side it bounds nothing; on the
                    # other side it leaves no finite value in between
                    if (side == "low") == bool(r < 0):
                        raw.append(None)
                        continue
                    raise ValueError(f"{api}: bounds[{name!r}] {side}={v} is infinite in {dtype}"
                                     f", so no finite value lies inside the bounds; give a "
                                     f"finite {side} bound.")
                raw.append(r)
            lo, hi = lohi
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"{api}: bounds[{name!r}]=({lo}, {hi}) has low > high; give "
                                 f"(low, high) = ({hi}, {lo}).")
            self.raw[name] = (raw[0], raw[1])

    def project(self, lam: Tensor) -> None:
        """Clamp ``lam`` (raw, shape ``(K,)``) into the bounds, in place."""
        slices = self.hps.slices
        with torch.no_grad():
            for name, (lo, hi) in self.raw.items():  # the bounds live on the CPU: lam's device
                lam[slices[name]] = lam[slices[name]].clamp(
                    None if lo is None else lo.to(lam), None if hi is None else hi.to(lam))

    def values(self) -> dict[str, list[float | None]]:
        """The bounds in value space, as given (for fingerprints and messages)."""
        out = {}
        for name, ends in self.raw.items():
            fwd = TRANSFORMS[self.hps.by_name[name].transform][0]
            out[name] = [None if r is None else float(fwd(r)) for r in ends]
        return out
