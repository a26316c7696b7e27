"""Bounds on hyperparameters, given in value space and applied to the raw ones by projection.

Every transform (identity, log, logit) is increasing, so a box ``[low, high]`` on the values is
the box ``[inverse(low), inverse(high)]`` on the raw coordinates, and clamping the raw
coordinates is the projection onto it. Bounds are checked once, here, against the domain of the
transform (a learning rate's bound must be > 0), so a typo fails before any training.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import is_real
from ..hyperparams import TRANSFORMS, HyperParams, Schedule, rounded_onto_edge

__all__ = ["Bounds"]


class Bounds:
    """``{name: (low, high)}`` in value space (either end may be ``None``: unbounded), for the
    hyperparameters ``hps`` in ``dtype``. One pair bounds every entry of its hyperparameter
    (each window of a schedule, each tensor of a per-tensor value; not a schedule's tuned
    ``scales``, which are factors: ``"lr[group]"`` bounds one); ``"name[entry]"`` bounds
    one entry (by its index, ``"lr[0]"`` for a schedule's first window, or by its name,
    ``"wd[decay]"`` for a PerGroup's group, ``"wd[fc.weight]"`` for a PerTensor's parameter;
    ``"lr[out]"`` bounds every window of group ``out`` of a schedule per group), in place of
    the hyperparameter's pair; an entry's end ``None`` keeps the pair's end on that side
    (``{"lr": (1e-4, 1), "lr[0]": (None, 0.05)}``: window 0 in ``[1e-4, 0.05]``). An end
    that is infinite in the raw coordinates on its own side (``low=-inf`` or ``high=inf`` of
    an identity hyperparameter, ``high=inf`` of a log one, or a number that rounds to one in
    ``dtype``) is no bound, as ``None``: the search box then fills that side around the
    initial value. A log or logit hyperparameter's low end is ``None``
    for none (``-inf`` and ``0`` lie outside its transform's domain and are refused). An end may
    be a number, a NumPy number or a one-element tensor; a pair, a tuple or a sequence of two.

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
                 api: str = "Trainer", horizon: int | None = None) -> None:
        self.hps = hps
        self.horizon = horizon
        """The inner steps (to read a schedule's window by the label outputs name it by,
        ``'lr[steps 40-59]'``; ``None``: by index only)."""
        self.raw: dict[str, tuple[Tensor | None, Tensor | None]] = {}
        """Raw bounds of whole hyperparameters, by name."""
        self.entries: dict[str, dict[int, tuple[Tensor | None, Tensor | None]]] = {}
        """Raw bounds of single entries: name -> {index: (low, high)}."""
        self._keys: dict[str, tuple[str, list[int] | None, tuple[Tensor | None, Tensor | None]]]
        self._keys = {}  # as given -> (name, indices, its raw pair)
        self._shown: dict[str, tuple[Tensor | None, Tensor | None]] = {}  # _raw_pair's exact
        named: dict[tuple[str, tuple[int, ...]], str] = {}
        for key, lohi in (bounds or {}).items():
            name, indices = self._target(key, api)
            if indices is not None:
                # one entry by two names ('wd[0]' and 'wd[0.weight]', 'lr[0]' and
                # 'lr[steps 0-4]'): the later pair won without a word, and the run's
                # fingerprint listed both as if both applied (the bounds probe)
                same = named.setdefault((name, tuple(indices)), key)
                if same != key:
                    raise ValueError(f"{api}: bounds[{same!r}] and bounds[{key!r}] name the same "
                                     f"entries of {name!r}; give one of them.")
            plain: list[Tensor | None] = []
            pair = self._raw_pair(key, hps.by_name[name].transform, lohi, dtype, api, plain)
            self._shown[key] = (plain[0], plain[1])
            if indices is None:
                self.raw[name] = pair
            self._keys[key] = (name, indices, pair)
        # the entries, in the order given (a later key's replace an earlier's); an entry's end
        # None keeps its hyperparameter's end on that side: '"lr[0]": (None, 0.05)' beside
        # '"lr": (1e-4, 1)' caps window 0 (it dropped its floor of 1e-4 too, and the search box
        # filled that side around the initial value). self._keys keeps each pair as given
        for key, (name, indices, pair) in self._keys.items():
            whole = self.raw.get(name)
            if indices is None:
                continue
            if whole is None or None not in pair:
                self.entries.setdefault(name, {}).update({i: pair for i in indices})
                continue
            kept = (whole[0] if pair[0] is None else pair[0],
                    whole[1] if pair[1] is None else pair[1])
            if kept[0] is not None and kept[1] is not None and bool(kept[0] > kept[1]):
                fwd = TRANSFORMS[hps.by_name[name].transform][0]

                def shown(ends: tuple[Tensor | None, Tensor | None]) -> str:
                    return ", ".join("None" if r is None else f"{float(fwd(r)):.6g}"
                                     for r in ends)

                side = "low" if pair[0] is None else "high"
                raise ValueError(
                    f"{api}: bounds[{key!r}]=({shown(pair)}) keeps the {side} end of "
                    f"bounds[{name!r}]=({shown(whole)}) (an end None keeps it), which leaves "
                    f"no value between; give both ends of {key!r}.")
            self.entries.setdefault(name, {}).update({i: kept for i in indices})

    def _target(self, key: str, api: str) -> tuple[str, list[int] | None]:
        """``(name, None)`` for a hyperparameter's name, ``(name, [index])`` for one entry,
        ``(name, [indices])`` for a grouped schedule's group (its row of windows)."""
        hps = self.hps
        if key in hps.by_name:
            return key, None
        m = re.fullmatch(r"(\w+)\[(.+)\]", str(key))
        if m is None or m.group(1) not in hps.by_name:
            raise ValueError(f"{api}: bounds name {key!r} is not a hyperparameter; defined are "
                             f"{hps.names} (one entry of one: 'name[index]', or "
                             f"'name[group]' / 'name[parameter]' for a per-group or "
                             f"per-tensor one).")
        name, label = m.groups()
        item = hps.by_name[name]
        found = item.entries_of(label)
        if found is not None:
            return name, found
        if label.isdigit() and int(label) < item.numel:
            return name, [int(label)]
        at = self._named_entry(item, label)
        if at is not None:
            return name, [at]
        labels = item.entry_labels()
        named = f" or one of {labels}" if labels else ""
        if isinstance(item, Schedule) and self.horizon is not None:
            spans = [f"steps {a}-{b}" for a, b in item.steps(self.horizon)[:2]]
            named += f", or a window by its steps as the outputs name it ({', '.join(spans)}, ...)"
        raise ValueError(f"{api}: bounds name {key!r}: {name!r} has no entry {label!r}; its "
                         f"entries are the indices 0-{item.numel - 1}{named}.")

    def _named_entry(self, item: Any, label: str) -> int | None:
        """The entry that ``label`` names as the outputs do (results.json's ``learned_named``,
        the log): a schedule's window by its steps (``'steps 40-59'``, ``'early, steps
        0-9'``) or an array's entry by its indices (``'1, 2'``); ``None``: no such entry."""
        if isinstance(item, Schedule) and self.horizon is not None:
            groups = [f"{g}, " for g in item.groups] if item.groups is not None else [""]
            for gi, g in enumerate(groups):
                for w, (a, b) in enumerate(item.steps(self.horizon)):
                    span = f"steps {a}-{b}" if a <= b else f"window {w}: no step"
                    if label == f"{g}{span}":
                        return gi * item.windows + w
            return None
        shape = item.shape()
        parts = label.split(",")
        if len(shape) == len(parts) > 1 and all(x.strip().isdigit() for x in parts):
            idx = tuple(int(x) for x in parts)
            if all(i < n for i, n in zip(idx, shape)):
                return int(np.ravel_multi_index(idx, shape))
        return None

    @staticmethod
    def _raw_pair(name: str, transform: str, lohi: Sequence[float | None], dtype: torch.dtype,
                  api: str, exact: list[Tensor | None] | None = None
                  ) -> tuple[Tensor | None, Tensor | None]:
        """``(low, high)`` of key ``name`` in raw coordinates, checked, each end moved inside
        by rounding steps where its value lay outside; ``exact`` (given): the ends as the
        plain inverse transform gives them, which the fingerprint and messages show (a run
        written before the ends moved resumes)."""
        if callable(getattr(lohi, "tolist", None)) and not isinstance(lohi, (str, bytes)):
            lohi = lohi.tolist()  # type: ignore[attr-defined]  # a NumPy array, a tensor
        if isinstance(lohi, (str, bytes)) or not isinstance(lohi, Sequence) or len(lohi) != 2:
            raise ValueError(f"{api}: bounds[{name!r}]={lohi!r} must be a pair (low, high), "
                             f"either may be None, e.g. (1e-4, 1.0).")
        forward, inverse, valid, domain = TRANSFORMS[transform]
        raw: list[Tensor | None] = []
        plain: list[Tensor | None] = []
        for side, v in zip(("low", "high"), lohi):
            if v is None:
                raw.append(None)
                plain.append(None)
                continue
            if isinstance(v, Tensor) and v.numel() == 1:
                v = v.item()
            if not is_real(v) or v != v:
                per_entry = (f" (one pair bounds every entry of the hyperparameter; bound one "
                             f"entry with its own key, e.g. '{name}[0]': (low, high))"
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
                    plain.append(None)
                    continue
                raise ValueError(f"{api}: bounds[{name!r}] {side}={v} is infinite in {dtype}"
                                 f", so no finite value lies inside the bounds; give a "
                                 f"finite {side} bound.")
            # the round trip value -> raw -> value can land a rounding step outside (a logit
            # bound of 0.45 held values at 0.44999999999999996): move the raw end inwards
            # until its value lies inside
            # (a step that doubles: sigmoid's slope of 1/4 needs several rounding steps of r)
            step = torch.nextafter(r, torch.tensor(math.inf if side == "low" else -math.inf,
                                                   dtype=dtype)) - r
            for _ in range(64):
                got = forward(r)
                if (bool(got >= t) if side == "low" else bool(got <= t)):
                    break
                r, step = r + step, 2 * step
            raw.append(r)
            plain.append(inverse(t))
        if raw[0] is not None and raw[1] is not None and bool(raw[0] > raw[1]):
            raw[0], raw[1] = plain[0], plain[1]  # low == high: the ends moved past each other
        if exact is not None:
            exact.extend(plain)
        lo, hi = lohi
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"{api}: bounds[{name!r}]=({lo}, {hi}) has low > high; give "
                             f"(low, high) = ({hi}, {lo}).")
        return raw[0], raw[1]

    def project(self, lam: Tensor) -> None:
        """Clamp ``lam`` (raw, shape ``(K,)``) into the bounds, in place (an entry's own bounds
        after its hyperparameter's: they replace them)."""
        slices = self.hps.slices

        def clamp(x: Tensor, lo: Tensor | None, hi: Tensor | None) -> Tensor:
            # the bounds live on the CPU: lam's device
            return x.clamp(None if lo is None else lo.to(lam), None if hi is None else hi.to(lam))

        with torch.no_grad():
            for name, (lo, hi) in self.raw.items():
                # the hyperparameter's own entries (a schedule's windows, not its scales), but
                # not those with bounds of their own: clamped to both, an entry bounded above
                # the pair was held at the pair's high end (the search box had it apart)
                start = slices[name].start
                mine = self.entries.get(name, {})
                idx = [start + i for i in range(self.hps.by_name[name].base_numel)
                       if i not in mine]
                if idx:
                    at = torch.tensor(idx, device=lam.device)
                    lam[at] = clamp(lam[at], lo, hi)
            for name, entries in self.entries.items():
                start = slices[name].start
                for i, (lo, hi) in entries.items():
                    lam[start + i] = clamp(lam[start + i], lo, hi)

    def values(self) -> dict[str, list[float | None]]:
        """The bounds in value space, by the keys given (for fingerprints and messages)."""
        out = {}
        for key, (name, _, _) in self._keys.items():
            fwd = TRANSFORMS[self.hps.by_name[name].transform][0]
            out[key] = [None if r is None else float(fwd(r)) for r in self._shown[key]]
        return out

    def of(self, name: str) -> dict[str, list[float | None]]:
        """:meth:`values` of the keys that bound hyperparameter ``name`` (for messages)."""
        values = self.values()
        return {k: values[k] for k, (n, *_) in self._keys.items() if n == name}
