"""Hyperparameters: unconstrained raw values, named transforms, and the kinds users tune.

Every hyperparameter is stored *raw* (unconstrained real numbers); training reads the
*value* ``transform(raw)``. All raw numbers of a :class:`HyperParams` set are laid out in one
flat vector ``lam`` of length ``K``: that is the vector hypergradients are taken with respect to
(Franceschi et al. 2017, "Forward and Reverse Gradient-Based Hyperparameter Optimization").

Kinds (``K`` contributions in brackets):

- :class:`Scalar` [1]: one number, e.g. a learning rate or a momentum.
- :class:`PerTensor` [one per parameter tensor]: e.g. a per-layer weight decay or learning rate.
- :class:`PerGroup` [one per group]: one value shared by each group of parameter tensors
  (matched by regular expressions on their names), a constant ``default`` for the rest: one
  weight decay for the weight matrices and none on biases and norms.
- :class:`Schedule` [W]: a value per step over the horizon ``T``, piecewise constant on ``W``
  equal windows (FDS-style, Maclaurin et al. 2015; Micaelli & Storkey 2021).
- :class:`PerExample` [N]: one weight per training example (data hyper-cleaning).
- :class:`Array` [numel]: any tensor the training loss reads (an L2 coefficient, label smoothing).
- :class:`InitScale` [one per listed parameter tensor]: a scale of the initial weights,
  ``w_0 = scale * w_0(model)``.
- :class:`InitWeights` [numel of the listed tensors]: the initial weights themselves (the
  learnable initialisation of MAML-style meta-learning; reverse mode's case, K is large).

A :class:`Scalar` or a :class:`Schedule` bound to an optimizer argument may take fixed
``multipliers`` per parameter tensor (``{pattern: factor}``): one tuned value, read as
``factor * value`` by each parameter (a layer-wise learning-rate scale under a tuned schedule),
at no extra tangent column. A :class:`Schedule` may instead tune one factor per group of
tensors (``scales={name: pattern}``) [windows + groups], or be a schedule per group
(``groups={name: pattern}``) [groups x windows].

The two initialisation kinds are read by the problem's initial state
(:meth:`~hypergrad.InnerProblem.initial_state`), not by the losses or the optimizer.

Example:
    >>> hp = HyperParams([Schedule("lr", init=0.1, windows=4, transform="log"),
    ...                   Scalar("momentum", init=0.9, transform="logit")])
    >>> hp.num_raw
    5
"""

from __future__ import annotations

import copy
import math
import numbers
import operator
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .errors import is_real

__all__ = [
    "TRANSFORMS",
    "HyperParameter",
    "Scalar",
    "PerTensor",
    "PerGroup",
    "Schedule",
    "PerExample",
    "Array",
    "InitScale",
    "InitWeights",
    "HyperParams",
    "HPValues",
]

_HALF = (torch.float16, torch.bfloat16)
_HALF_WHY = ("tangents carried over T steps and Hessian-vector products keep 8 to 11 bits in "
             "half precision, so a hypergradient would be rounding noise")

# name -> (forward: raw -> value, inverse: value -> raw, domain check on values)
TRANSFORMS = {
    "identity": (lambda r: r, lambda v: v, lambda v: True, "any real value"),
    "log": (torch.exp, torch.log, lambda v: bool((v > 0).all()), "values > 0"),
    "logit": (torch.sigmoid, torch.logit, lambda v: bool(((v > 0) & (v < 1)).all()),
              "values in (0, 1)"),
}


def _holds_bool(x: Any) -> bool:
    """Whether ``x`` is a bool, or a (nested) list or tensor / array of bools: ``True`` is an
    int to Python and ``torch.as_tensor``, so it passed as a number (1.0)."""
    if isinstance(x, (bool, np.bool_)):
        return True
    if isinstance(x, Tensor):
        return x.dtype == torch.bool
    if isinstance(x, np.ndarray):
        return x.dtype == np.bool_
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        return any(_holds_bool(e) for e in x)
    return False


def _check_init(api: str, init: Any) -> None:
    """``init`` must be a number, a (nested) list of numbers or a floating/integer tensor (not
    a bool: ``init=True`` was read as 1.0)."""
    if _holds_bool(init):
        what = "is a bool" if isinstance(init, (bool, np.bool_)) else "holds bools"
        raise TypeError(
            f"{api}: init={init!r} {what} (read as 1.0 or 0.0); init must be a number, a "
            f"list of numbers or a tensor, in value space (after the transform), e.g. init=0.1."
        )
    bad = isinstance(init, (str, bytes)) or init is None
    if not bad:
        try:
            torch.as_tensor(init, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            bad = True
    if bad:
        env = ""
        if isinstance(init, str):
            try:
                float(init)
                env = (" (a number as a string: ${oc.env:NAME} in a config gives one, "
                       "${oc.decode:${oc.env:NAME}} parses it)")
            except ValueError:
                pass
        raise TypeError(
            f"{api}: init={init!r} ({type(init).__name__}) must be a number, a list of numbers "
            f"or a tensor, in value space (after the transform), e.g. init=0.1{env}."
        )


def _check_transform(api: str, transform: str) -> None:
    if transform not in TRANSFORMS:
        raise ValueError(
            f"{api}: unknown transform={transform!r}; choose one of {sorted(TRANSFORMS)}, "
            f"e.g. transform='log' for a learning rate, transform='logit' for a momentum."
        )


def rounded_onto_edge(value: Any, dtype: torch.dtype, valid: Any) -> str:
    """``", which rounds to 1.0 in float32"`` when ``value`` is inside the transform's domain
    in float64 but not once rounded to ``dtype`` (0.99999999 for ``logit`` in float32, 1e-50
    for ``log``), else ``""``: the message then says why a value in the domain is refused."""
    try:
        exact = torch.as_tensor(value, dtype=torch.float64)
        if dtype == torch.float64 or not bool(valid(exact)):
            return ""
        got = torch.as_tensor(value, dtype=dtype)
        if got.numel() != 1:
            return f", some of whose entries round onto the domain's edge in {dtype}"
        return f", which rounds to {got.item()} in {dtype}"
    except (TypeError, ValueError, RuntimeError):
        return ""


@dataclass
class HyperParameter:
    """Base of all kinds. ``init`` is given in *value* space (after the transform)."""

    name: str
    init: float | Sequence[float] | Tensor
    transform: str = "identity"

    kind: str = field(init=False, default="base")
    initializes = False
    """Whether the kind sets the initial state (read by ``InnerProblem.initial_state``)."""

    def __post_init__(self) -> None:
        api = f"{type(self).__name__}({self.name!r})"
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(
                f"{type(self).__name__}: name={self.name!r} must be a Python identifier such as "
                f"'lr' or 'weight_decay'."
            )
        _check_transform(api, self.transform)
        _check_init(api, self.init)

    # -- shape / raw layout ------------------------------------------------------------------
    def shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def numel(self) -> int:
        return math.prod(self.shape())

    def init_raw(self, dtype: torch.dtype, device: torch.device | str | None = None) -> Tensor:
        """The raw (unconstrained) initial value, shape :meth:`shape`."""
        api = f"{type(self).__name__}({self.name!r})"
        # detached: an init read off a tensor that requires grad (a model's weight) would
        # otherwise put that tensor's graph into lam, which must be a leaf
        init = self.init.detach() if isinstance(self.init, Tensor) else self.init
        v = self._expand_init(torch.as_tensor(init, dtype=dtype, device=device))
        if v.ndim == 0:
            v = v.expand(self.shape()).clone()
        if tuple(v.shape) != self.shape():
            # the windows chosen first: give that many values (the hint only said to change
            # windows to fit the init: the kinds probe)
            hint = (f" (a value per window: {self.windows} of them, or one for every "
                    f"window; for {v.shape[0]} windows, Schedule({self.name!r}, init=..., "
                    f"windows={v.shape[0]}))" if isinstance(self, Schedule) and v.ndim == 1
                    and self.groups is None and self.scales is None else "")
            if isinstance(self, Schedule) and self.groups is not None:
                hint = (f" ({self.windows} values, one per window, that every group starts "
                        f"from, or a row of them per group)")
            if isinstance(self, Schedule) and self.scales is not None:
                hint = (f" ({self.windows} values, one per window, the scales starting at 1, "
                        f"or {self.numel}: the windows, then a scale per group of "
                        f"{list(self.scales)})")
            if isinstance(self, PerTensor) and self.params is not None:
                hint = (f" (one value per tuned parameter, in this order: "
                        f"{_short_init(list(self.params))}; or a dict by name, "
                        f"init={{name: value}})")
            raise ValueError(
                f"{api}: init has shape {tuple(v.shape)}, expected a number or shape "
                f"{self.shape()}{hint}."
            )
        _, inverse, valid, domain = TRANSFORMS[self.transform]
        if not torch.isfinite(v).all() or not valid(v):
            where = ""
            if v.numel() > 1:  # which entries (a warm-up from 0 under "log": the first)
                flat = v.reshape(-1)
                bad = [i for i in range(flat.numel()) if not (bool(torch.isfinite(flat[i]))
                                                               and valid(flat[i:i + 1]))]
                shown = ", ".join(f"[{i}] = {float(flat[i]):g}" for i in bad[:4])
                where = f" (entries {shown}{', ...' if len(bad) > 4 else ''})"
            raise ValueError(
                f"{api}: init={_short_init(self.init)} is outside the domain of transform="
                f"{self.transform!r} ({domain}){where}"
                f"{rounded_onto_edge(self.init, dtype, valid)}; pass an init in that domain"
                + (" (a warm-up from 0 under 'log': start at a small positive value)"
                   if self.transform == "log" else " (strictly between 0 and 1 under 'logit', "
                   "e.g. 0.999 for 1)" if self.transform == "logit" else "")
                + " or another transform."
            )
        return inverse(v)

    def _expand_init(self, v: Tensor) -> Tensor:
        """An init of another shape that this kind spreads to its own (as is: none; a number
        is spread to every entry after this)."""
        return v

    @property
    def base_numel(self) -> int:
        """How many leading raw entries are the hyperparameter's values proper: what a bound
        by its name (``Guards(bounds={"lr": ...})``), the search box filled around its initial
        value and the start's shared level apply to. The rest (a schedule's tuned ``scales``)
        are factors with a box, bounds (``"lr[group]"``) and start draws of their own."""
        return self.numel

    def value(self, raw: Tensor, step: int | None, horizon: int) -> Any:
        """Map this hyperparameter's raw slice to what training reads at ``step``."""
        return TRANSFORMS[self.transform][0](raw)

    def first_reads(self, horizon: int) -> list[int]:
        """For each raw entry (flattened), the first inner step that reads it (``horizon``:
        none does). Every entry is read from step 0 but a schedule's later windows."""
        return [0] * self.numel

    def read_at(self, step: int, horizon: int) -> list[int] | None:
        """The raw entries (flattened offsets) that inner step ``step`` reads; ``None``: all."""
        return None

    def bind(self, param_names: Sequence[str],
             params: Mapping[str, Tensor] | None = None) -> HyperParameter:
        """This hyperparameter resolved against a model's trainable parameters (names, and
        their initial values where a kind needs them); most kinds need nothing."""
        return self

    def entry_names(self) -> list[str]:
        """The names of its raw entries where each has one (a :class:`PerTensor`'s or
        :class:`InitScale`'s parameters, a :class:`PerGroup`'s groups), in raw order; ``[]``
        for the kinds named by index (an :class:`InitWeights`' entries are elements of its
        tensors). Logs, results and ``Guards(bounds={"wd[decay]": ...})`` use them."""
        params = getattr(self, "params", None)
        if params is None or isinstance(params, str):
            return []
        return [str(p) for p in params]

    def entry_labels(self) -> list[str]:
        """The labels :meth:`entries_of` takes (beside an entry's index): :meth:`entry_names`,
        or a grouped schedule's groups."""
        return self.entry_names()

    def entries_of(self, label: str) -> list[int] | None:
        """The raw entries (flattened offsets) that ``label`` names: an entry's name
        (:meth:`entry_names`), or a group's whole row of a grouped schedule; ``None``: none."""
        names = self.entry_names()
        return [names.index(label)] if label in names else None

    def binding(self) -> Any:
        """What its raw values apply to, as plain data (``None``: nothing beyond its shape):
        the parameter names of a per-tensor kind, a group's parameters, the default of the
        others. A run's fingerprint holds it, so that a resumed run whose values would apply
        to other parameters (same K, other ``params``) is refused."""
        params = getattr(self, "params", None)
        if params is None:
            return None
        out: dict[str, Any] = {"params": list(params)}
        default = getattr(self, "default", None)
        if default is not None:
            out["default"] = default
        return out


class _Multiplied:
    """What :class:`Scalar` and :class:`Schedule` share: fixed ``multipliers`` per parameter
    tensor, ``{pattern: factor}`` (the first regular expression that ``re.search`` finds in a
    parameter's name wins; ``".*"`` last for the others). Parameter ``p`` reads
    ``factor(p) * value``: one tuned number (or window) and a fixed ratio between layers, as a
    layer-wise learning-rate decay keeps it. Training then reads a ``dict`` parameter name ->
    value (as for a :class:`PerGroup`); the raw values, their bounds, the reports and ``K``
    are the unmultiplied value's."""

    name: str
    multipliers: Mapping[str, float] | None
    per_param: dict[str, float] | None
    """Parameter name -> factor, set by :meth:`bind`."""

    def _check_multipliers(self) -> None:
        if self.multipliers is None:
            return
        from .optim.base import PerParam

        api = f"{type(self).__name__}({self.name!r})"
        const = PerParam(self.multipliers, where=f"{api}: multipliers")
        bad = {k: v for k, v in const.values.items() if not math.isfinite(v) or v < 0}
        if bad:  # a negative factor of a learning rate was gradient ascent, without a word
            raise ValueError(f"{api}: multipliers {bad} must be finite numbers >= 0 (a "
                             f"parameter reads factor * value; 0 freezes it), e.g. "
                             f"multipliers={{r'^0\\.': 0.1, r'.*': 1.0}}.")
        self.multipliers = dict(const.values)

    def bind(self, param_names: Sequence[str],
             params: Mapping[str, Tensor] | None = None) -> Any:
        if self.multipliers is None:
            return self
        from .optim.base import PerParam

        api = f"{type(self).__name__}({self.name!r})"
        const = PerParam(self.multipliers, where=f"{api}: multipliers")
        const.check(f"{api}: multipliers", param_names)
        out = copy.copy(self)
        out.per_param = {n: const[n] for n in param_names}
        return out

    def binding(self) -> Any:
        """``{"multipliers": {...}}`` (a run's fingerprint holds them), ``None`` without."""
        return None if self.multipliers is None else {"multipliers": dict(self.multipliers)}

    def _multiply(self, v: Tensor) -> Any:
        """``v`` as each parameter reads it: ``{param: factor * v}`` (one tensor per distinct
        factor) with multipliers, ``v`` itself without."""
        if self.multipliers is None:
            return v
        if self.per_param is None:
            raise ValueError(f"{type(self).__name__}({self.name!r}) has multipliers but is not "
                             f"bound to a model yet: build an InnerProblem with it (which binds "
                             f"them to the model's parameters).")
        by_factor = {m: v * m for m in set(self.per_param.values())}
        return _PerTensorValue({p: by_factor[m] for p, m in self.per_param.items()}, None)


@dataclass
class Scalar(_Multiplied, HyperParameter):
    """One number. ``Scalar("lr", init=0.1, transform="log")``.

    ``multipliers={pattern: factor}`` (optional): each parameter tensor reads ``factor *
    value``, the first pattern that matches its name giving its factor (see
    :class:`Schedule`); the value stays one tuned number (K = 1)."""

    multipliers: Mapping[str, float] | None = None
    kind: str = field(init=False, default="scalar")
    per_param: dict[str, float] | None = field(init=False, default=None, repr=False,
                                               compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_multipliers()

    def shape(self) -> tuple[int, ...]:
        return ()

    def value(self, raw: Tensor, step: int | None, horizon: int) -> Any:
        return self._multiply(TRANSFORMS[self.transform][0](raw))


@dataclass
class Array(HyperParameter):
    """Any tensor of hyperparameters the training loss reads, of a given ``shape``.

    ``Array("l2", init=1e-3, shape=(30,), transform="log")`` gives one L2 coefficient per
    feature; the loss receives a tensor of shape ``(30,)``.
    """

    shape_: tuple[int, ...] = ()
    kind: str = field(init=False, default="array")

    def __init__(self, name: str, init: float | Sequence[float] | Tensor,
                 shape: Sequence[int] | None = None, transform: str = "identity") -> None:
        if isinstance(shape, str):  # Array("l2", init, "log"): the third argument is shape
            raise TypeError(f"Array({name!r}): shape={shape!r} is a string; give the transform "
                            f"by name, transform={shape!r}, and shape as a tuple of ints "
                            f"(or leave it out: the init's shape).")
        if shape is None:
            _check_init(f"Array({name!r})", init)
            shape = tuple(torch.as_tensor(init).shape)
        try:  # any sequence of integers (a list, a ListConfig, NumPy ints)
            dims: tuple[int, ...] | None = tuple(operator.index(d) for d in shape)
        except TypeError:
            dims = None
        if (dims is None or any(isinstance(d, bool) for d in shape)
                or not all(d >= 1 for d in dims)):
            raise ValueError(f"Array({name!r}): shape={shape!r} must be a tuple of ints >= 1 "
                             f"(e.g. shape=(30,)), or left out for the init's shape.")
        self.name, self.init, self.transform = name, init, transform
        self.shape_ = tuple(int(s) for s in dims)
        self.kind = "array"
        self.__post_init__()

    def shape(self) -> tuple[int, ...]:
        return self.shape_


@dataclass
class Schedule(_Multiplied, HyperParameter):
    """A per-step value over the horizon ``T``: ``windows`` equal windows, one value each.

    Step ``t`` (0-based) of a horizon ``T`` reads window ``t * windows // T``. Inside the loss
    (``step=None``) the whole vector of ``windows`` values is given.

    ``groups={name: pattern}`` (optional, for an optimizer argument): a schedule per group of
    parameter tensors (a per-layer learning-rate schedule, as Maclaurin et al. 2015 learned
    them), K = ``len(groups) * windows``, the raw values laid out group by group
    (``lr[g * windows + w]``). Each parameter takes the first group whose regular expression
    (``re.search``) matches its name, as in :class:`PerGroup`; those that match none read the
    constant ``default`` (required when some do). ``init`` is a number, ``windows`` values
    (every group starts from them) or one row per group. Training reads ``{param: value}``.

    ``multipliers={pattern: factor}`` (optional, for an optimizer argument): each parameter
    tensor reads ``factor * value``, the first regular expression (``re.search``) matching its
    name giving its factor; every parameter must match one (``".*"`` last for the rest) and
    every pattern some parameter. One tuned schedule with fixed ratios between layers (a
    layer-wise learning-rate decay, or 0 to freeze the embeddings), K = ``windows``::

        Schedule("lr", 0.1, "log", windows=10,
                 multipliers={r"^embed": 0.1, r"^head": 1.0, r".*": 0.5})

    Training then reads ``{param: value}`` (per window inside the loss).

    ``scales={name: pattern}`` (optional, for an optimizer argument, ``transform="log"``): one
    tuned schedule and a tuned factor per group of parameter tensors, matched as ``groups``
    are: a parameter of group ``g`` reads ``scale[g] * value`` (a per-layer learning rate
    under a shared learning-rate schedule, as FDS shares hyperparameters over steps and
    layers), those of no group the schedule itself. K = ``windows + len(scales)``, against
    ``len(groups) * windows`` for a schedule per group; the raw values are the windows, then
    the log of each scale (``lr[windows + g]``). The scales start at 1 (``init``: a number or
    the windows' values; or all K values, the scales' last). ``Guards(bounds={"lr": ...})``
    bounds the windows, ``"lr[group]"`` a group's scale (whose search box is otherwise 1/100
    to 100)::

        Schedule("lr", 0.1, "log", windows=10,
                 scales={"embed": r"^embed", "body": r"^blocks", "head": r"^head"})

    When every parameter is in a group, one direction of the K changes nothing (every scale up
    by a factor, every window down by it); it costs nothing but is never tuned.
    """

    windows: int = 1
    multipliers: Mapping[str, float] | None = None
    groups: Mapping[str, str] | None = None
    default: float | None = None
    scales: Mapping[str, str] | None = None
    kind: str = field(init=False, default="schedule")
    per_param: dict[str, float] | None = field(init=False, default=None, repr=False,
                                               compare=False)
    assignment: dict[str, int] | None = field(init=False, default=None, repr=False,
                                              compare=False)
    """With ``groups`` or ``scales``: parameter name -> group index, set by :meth:`bind` (with
    ``scales``, ``-1`` for a parameter of no group)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        api = f"Schedule({self.name!r})"
        if (isinstance(self.windows, bool) or not isinstance(self.windows, numbers.Integral)
                or int(self.windows) < 1):
            raise ValueError(f"{api}: windows={self.windows!r} must be an int >= 1.")
        self.windows = int(self.windows)  # a NumPy int of a grid
        if self.groups is not None:
            self.groups = _check_groups(api, self.groups)
            if self.multipliers is not None:
                raise ValueError(f"{api}: takes groups (a schedule per group) or multipliers "
                                 f"(one schedule, fixed ratios), not both.")
            self.default = _check_default(api, self.default, "that match no group",
                                          "every trainable parameter matches a group")
        elif self.default is not None:
            raise ValueError(f"{api}: default={self.default!r} is the value of the parameters "
                             f"that match no group; it needs groups={{name: pattern}} (with "
                             f"scales, the parameters of no group read the schedule itself).")
        if self.scales is not None:
            self.scales = _check_groups(f"{api}: scales", self.scales)
            other = ("groups (a schedule per group)" if self.groups is not None else
                     "multipliers (fixed factors)" if self.multipliers is not None else None)
            if other is not None:
                raise ValueError(f"{api}: takes scales (one schedule, a tuned factor per "
                                 f"group) or {other}, not both.")
            if self.transform != "log":
                raise ValueError(f"{api}: scales multiply the schedule by tuned positive "
                                 f"factors, which needs transform='log' (got "
                                 f"{self.transform!r}): the windows and the scales are then "
                                 f"added in log space.")
        self._check_multipliers()

    def shape(self) -> tuple[int, ...]:
        if self.groups is not None:
            return (len(self.groups), self.windows)
        if self.scales is not None:
            return (self.windows + len(self.scales),)
        return (self.windows,)

    @property
    def base_numel(self) -> int:
        return self.windows if self.scales is not None else self.numel

    def _expand_init(self, v: Tensor) -> Tensor:
        if self.groups is not None and tuple(v.shape) == (self.windows,):
            return v.expand(self.shape()).clone()  # every group starts from the same windows
        if self.scales is not None and v.ndim <= 1 and v.numel() in (1, self.windows) \
                and tuple(v.shape) != self.shape():
            # the windows' values, the scales at 1
            return torch.cat([v.reshape(-1).expand(self.windows),
                              v.new_ones(len(self.scales))])
        return v

    def bind(self, param_names: Sequence[str],
             params: Mapping[str, Tensor] | None = None) -> Any:
        if self.groups is None and self.scales is None:
            return super().bind(param_names, params)
        out = copy.copy(self)
        api = f"Schedule({self.name!r})"
        if self.scales is not None:  # the parameters of no group read the schedule itself
            found = _assign_groups(f"{api}: scales", self.scales, 1.0, param_names)
            out.assignment = {n: found.get(n, -1) for n in param_names}
        else:
            assert self.groups is not None
            out.assignment = _assign_groups(api, self.groups, self.default, param_names)
        return out

    def binding(self) -> Any:
        if self.scales is not None:
            bound = (None if self.assignment is None else
                     {n: g for n, g in self.assignment.items() if g >= 0})
            return {"scales": _group_binding(self.scales, None, bound)}
        if self.groups is None:
            return super().binding()
        return _group_binding(self.groups, self.default, self.assignment)

    def entry_labels(self) -> list[str]:
        return list(self.groups if self.groups is not None else self.scales or [])

    def entries_of(self, label: str) -> list[int] | None:
        if self.scales is not None and label in self.scales:
            return [self.windows + list(self.scales).index(label)]
        if self.groups is None or label not in self.groups:
            return None
        g = list(self.groups).index(label)
        return list(range(g * self.windows, (g + 1) * self.windows))

    def window(self, step: int, horizon: int) -> int:
        """The window step ``step`` of ``horizon`` reads (a step past the horizon: the last)."""
        if isinstance(step, int) and step < 0:  # -1 would read the last window, as Python does
            raise ValueError(f"Schedule({self.name!r}): step={step} must be >= 0 (the 0-based "
                             f"inner step).")
        # sym_min, not min: under torch.compile the step is a symbolic int, and min() guarded
        # on each window's index (a recompile per window: past dynamo's limit of 8, eager)
        return torch.sym_min(step * self.windows // horizon, self.windows - 1)

    def steps(self, horizon: int) -> list[tuple[int, int]]:
        """The inner steps ``(first, last)`` each window covers over ``horizon``."""
        starts = [next((t for t in range(horizon) if self.window(t, horizon) >= w), horizon)
                  for w in range(self.windows)]
        return [(a, b - 1) for a, b in zip(starts, [*starts[1:], horizon])]

    def first_reads(self, horizon: int) -> list[int]:
        first = [_first_step(self, w, horizon) for w in range(self.windows)]
        if self.scales is not None:  # every step reads the scales
            return first + [0] * len(self.scales)
        return first * (len(self.groups) if self.groups is not None else 1)

    def read_at(self, step: int, horizon: int) -> list[int] | None:
        w = self.window(step, horizon)
        if self.scales is not None:
            return [w, *range(self.windows, self.numel)]
        return [g * self.windows + w for g in range(len(self.groups or [None]))]

    def value(self, raw: Tensor, step: int | None, horizon: int) -> Any:
        f = TRANSFORMS[self.transform][0]
        if step is None:
            if self.scales is not None:  # every window, scaled per parameter
                return self._scaled(f(raw[:self.windows]), f(raw[self.windows:]))
            return self._grouped(f(raw)) if self.groups is not None else self._multiply(f(raw))
        return self.at_window(raw, self.window(step, horizon))

    def at_window(self, raw: Tensor, w: int) -> Any:
        """What a step in window ``w`` reads (:meth:`value` at such a step)."""
        f = TRANSFORMS[self.transform][0]
        if self.scales is not None:
            return self._scaled(f(raw[w]), f(raw[self.windows:]))
        v = f(raw.select(-1, w))
        return self._grouped(v) if self.groups is not None else self._multiply(v)

    def _scaled(self, v: Tensor, scale: Tensor) -> Any:
        """``{param: scale[its group] * v}`` (one tensor per group), ``v`` for the parameters
        of no group."""
        if self.assignment is None:
            raise ValueError(f"Schedule({self.name!r}) has scales but is not bound to a model "
                             f"yet: build an InnerProblem with it (which binds them to the "
                             f"model's parameters).")
        by_group = [v * s for s in scale.unbind(0)]
        return _PerTensorValue({p: v if g < 0 else by_group[g]
                                for p, g in self.assignment.items()}, None)

    def _grouped(self, v: Tensor) -> Any:
        """``{param: v[its group]}`` (one tensor per group), the default for the others."""
        if self.assignment is None:
            raise ValueError(f"Schedule({self.name!r}) has groups but is not bound to a model "
                             f"yet: build an InnerProblem with it (which binds them to the "
                             f"model's parameters).")
        rows = list(v.unbind(0))
        return self.grouped_value({p: rows[g] for p, g in self.assignment.items()})

    def grouped_value(self, values: Mapping[str, Tensor]) -> Any:
        """``{param: value}`` as training reads it: the parameters of no group read
        ``default``."""
        return _PerTensorValue(values, self.default)


def _first_step(item: Schedule, w: int, horizon: int) -> int:
    """The first step that reads window ``w`` of ``item`` (``horizon`` if none does). Windows
    do not decrease with the step, so it is the first step whose window is at least ``w``."""
    t = -(-w * horizon // item.windows)  # ceil(w T / W)
    return t if t < horizon and item.window(t, horizon) == w else horizon



def _short_init(init: Any) -> str:
    """An init for a message: its repr, or its first values and its length when long."""
    text = repr(init)
    if len(text) <= 80:
        return text
    try:
        seq = list(init)
    except TypeError:
        return text[:77] + "..."
    return f"[{', '.join(repr(x) for x in seq[:3])}, ... ({len(seq)} values)]"

@dataclass
class PerExample(HyperParameter):
    """One value per training example (``n`` of them): the loss indexes it with batch indices.
    ``init``: the initial value in value space (after the transform), a number for every
    entry or one per entry; ``transform``: ``"identity"``, ``"log"`` (positive values) or
    ``"logit"`` (values in (0, 1)).
    """

    n: int = 0
    kind: str = field(init=False, default="per_example")

    def __post_init__(self) -> None:
        super().__post_init__()
        if (isinstance(self.n, bool) or not isinstance(self.n, numbers.Integral)
                or int(self.n) < 1):
            given = ("n is not given: it" if self.n == 0 and not isinstance(self.n, bool)
                     else f"n={self.n!r}")
            raise ValueError(
                f"PerExample({self.name!r}): {given} must be the number of training "
                f"examples (an int >= 1; hypergrad-run: 'hyperparams.items.{self.name}.n="
                f"${{task.n_train}}' with a task that has n_train)."
            )
        self.n = int(self.n)  # len(dataset) of a NumPy-backed set

    def shape(self) -> tuple[int, ...]:
        return (self.n,)


@dataclass
class PerTensor(HyperParameter):
    """One value per model parameter tensor (per-layer weight decay, per-layer learning rate).

    ``params`` lists the parameter names (as in ``model.named_parameters()``) that get their own
    value; ``None`` means every trainable parameter, resolved when the problem is built. Parameters
    left out read the constant ``default`` (required when ``params`` is a strict subset).
    Training reads a ``dict`` parameter name -> scalar tensor.
    ``init``: the initial value in value space (after the transform): a number for every
    entry, a list of one per entry in the order of ``params`` (with ``params=None``, the order
    of ``model.named_parameters()``), or a ``dict`` parameter name -> number that names every
    entry (``{"fc1.weight": 1e-4, "fc1.bias": 0.0}``: no order to get wrong); ``transform``:
    ``"identity"``, ``"log"`` (positive values) or ``"logit"`` (values in (0, 1)).
    """

    params: Sequence[str] | None = None
    default: float | None = None
    kind: str = field(init=False, default="per_tensor")

    def __post_init__(self) -> None:
        api = f"PerTensor({self.name!r})"
        named = _check_named_init(api, self.init) if isinstance(self.init, Mapping) else None
        if named is not None:
            self.init = 0.0  # the checks below; the values take their places once names are
            # known (here, or when the problem binds params=None to the model)
        super().__post_init__()
        _check_params(api, self.params)
        self.default = _check_default(api, self.default)
        if named is not None:
            # a dict until bind() knows the names (shape() refuses to be read before)
            self.init = named if self.params is None else _place_named_init(  # type: ignore
                api, named, self.params)

    def shape(self) -> tuple[int, ...]:
        if self.params is None:
            raise ValueError(
                f"PerTensor({self.name!r}): parameter names are not bound yet; build an "
                f"InnerProblem with it (which binds params=None to the model: its bound copy is "
                f"problem.hyperparams, yours stays unbound) or pass params=[...]."
            )
        return (len(self.params),)

    def bind(self, param_names: Sequence[str],
             params: Mapping[str, Tensor] | None = None) -> PerTensor:
        names = list(param_names)
        if self.params is None:
            return PerTensor(self.name, self.init, self.transform, names, self.default)
        _bind_names(f"PerTensor({self.name!r})", self.params, names)
        if len(self.params) < len(names) and self.default is None:
            missing = [p for p in names if p not in self.params]
            raise ValueError(
                f"PerTensor({self.name!r}): parameters {missing} have no value; list them in "
                f"params=... or pass default=<constant> for them."
            )
        return self

    def value(self, raw: Tensor, step: int | None, horizon: int) -> Any:
        v = TRANSFORMS[self.transform][0](raw)
        assert self.params is not None
        return _PerTensorValue({p: v[i] for i, p in enumerate(self.params)}, self.default)


class _PerTensorValue(dict):
    """``dict`` parameter name -> value, with the constant ``default`` for the others."""

    def __init__(self, values: Mapping[str, Tensor], default: float | None) -> None:
        super().__init__(values)
        self.default = default

    def __missing__(self, key: str) -> float:
        if self.default is None:
            raise KeyError(key)
        return self.default

    def get(self, key: str, fallback: Any = None) -> Any:  # type: ignore[override]
        """As ``[key]``: a parameter not listed reads the default (``dict.get`` skips
        ``__missing__``, so ``hp["wd"].get(name, 0.0)`` in a loss read 0.0 where the optimizer
        read the default); ``fallback`` only without a default."""
        if key in self or self.default is None:
            return super().get(key, fallback)
        return self.default


@dataclass
class PerGroup(HyperParameter):
    """One value per *group* of parameter tensors: ``groups`` maps a group's name to a regular
    expression (``re.search``) on parameter names (as in ``model.named_parameters()``), and each
    parameter takes the first group whose pattern matches. A parameter that matches none reads
    the constant ``default`` (required when some do). Training reads a ``dict`` parameter name
    -> value, as for :class:`PerTensor`, so an optimizer argument bound to it takes per-parameter
    values (what ``torch.optim``'s parameter groups hold).

    The usual recipe, one tuned weight decay for the weights and none on biases (K = 1)::

        PerGroup("wd", 0.01, "log", groups={"decay": r"weight$"}, default=0.0)

    A norm layer's scale is named ``weight`` too (``1.weight`` of a LayerNorm in a
    Sequential): to leave norms undecayed, match the other weights by their layers' names
    (``r"(fc|conv|proj)\\w*\\.weight$"``), or put the norms in a group of their own.

    Every group must match at least one parameter (a typo in a pattern would tune nothing).
    ``init``: the initial value in value space (after the transform), a number for every
    group or one per group; ``transform``: ``"identity"``, ``"log"`` (positive values) or
    ``"logit"`` (values in (0, 1)).
    """

    groups: Mapping[str, str] = field(default_factory=dict)
    default: float | None = None
    kind: str = field(init=False, default="per_group")
    assignment: dict[str, int] | None = field(init=False, default=None, repr=False)
    """Parameter name -> group index, set by :meth:`bind` (the parameters that read the
    default are not in it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        api = f"PerGroup({self.name!r})"
        self.groups = _check_groups(api, self.groups)
        self.default = _check_default(api, self.default, "that match no group",
                                      "every trainable parameter matches a group")

    def shape(self) -> tuple[int, ...]:
        return (len(self.groups),)

    def bind(self, param_names: Sequence[str],
             params: Mapping[str, Tensor] | None = None) -> PerGroup:
        out = PerGroup(self.name, self.init, self.transform, dict(self.groups), self.default)
        out.assignment = _assign_groups(f"PerGroup({self.name!r})", self.groups, self.default,
                                        param_names)
        return out

    def entry_names(self) -> list[str]:
        return list(self.groups)

    def binding(self) -> Any:
        """``{"groups": [[name, [params...]], ...] in raw order, "default": ...}`` (bound),
        the patterns while not bound."""
        return _group_binding(self.groups, self.default, self.assignment)

    def value(self, raw: Tensor, step: int | None, horizon: int) -> Any:
        if self.assignment is None:
            raise ValueError(f"PerGroup({self.name!r}) is not bound to a model yet: build an "
                             f"InnerProblem with it (which binds it to the model's parameters).")
        v = TRANSFORMS[self.transform][0](raw)
        return _PerTensorValue({p: v[i] for p, i in self.assignment.items()}, self.default)


def _check_groups(api: str, groups: Any) -> dict[str, str]:
    """``groups``: a non-empty mapping group name -> regular expression on parameter names."""
    example = "e.g. groups={'decay': r'weight$'}"
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Mapping):
        raise TypeError(f"{api}: groups={groups!r} must map group names to regular "
                        f"expressions on parameter names, {example}.")
    if not groups:
        raise ValueError(f"{api}: groups is empty, so it would tune nothing; map at least "
                         f"one group name to a regular expression on parameter names, "
                         f"{example}.")
    out = {}
    for g, pattern in groups.items():
        if not isinstance(g, str) or not isinstance(pattern, str):
            raise TypeError(f"{api}: groups entry {g!r}: {pattern!r} must map a group name "
                            f"(a string) to a regular expression (a string), {example}.")
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"{api}: the pattern {pattern!r} of group {g!r} is not a "
                             f"regular expression ({err}); {example}.") from None
        out[g] = pattern
    return out


def _assign_groups(api: str, groups: Mapping[str, str], default: float | None,
                   param_names: Sequence[str]) -> dict[str, int]:
    """Parameter name -> index of the first group whose pattern matches it (those that match
    none read ``default``, which must then be given); every group must match a parameter."""
    pats = [re.compile(p) for p in groups.values()]
    assignment, missing = {}, []
    for n in param_names:
        hit = next((i for i, p in enumerate(pats) if p.search(n)), None)
        if hit is None:
            missing.append(n)
        else:
            assignment[n] = hit
    if missing and default is None:
        raise ValueError(f"{api}: parameters {missing} match no group of "
                         f"{dict(groups)}; add a pattern for them, or pass "
                         f"default=<constant> (e.g. default=0.0) for the parameters that "
                         f"match none.")
    empty = [g for i, g in enumerate(groups) if i not in assignment.values()]
    if empty:
        won = {g: sorted(n for n, i in assignment.items() if i != k and
                         re.search(groups[g], n))
               for k, g in enumerate(groups) if g in empty}
        why = "".join(f"; {g!r} matches only {ns}, taken by an earlier group"
                      for g, ns in won.items() if ns)
        raise ValueError(f"{api}: groups {empty} match no parameter of the model "
                         f"{list(param_names)}{why}; fix or remove their patterns (only "
                         f"trainable parameters are listed: a frozen one, requires_grad=False, "
                         f"is never updated, so no hyperparameter of training reaches it; a "
                         f"tied one is listed once, under its first name).")
    return assignment


def _group_binding(groups: Mapping[str, str], default: float | None,
                   assignment: Mapping[str, int] | None) -> Any:
    """A grouped kind's binding: ``{"groups": [[name, [params...]], ...] in raw order,
    "default": ...}`` when bound, the patterns while not."""
    if assignment is None:
        return {"patterns": dict(groups), "default": default}
    return {"groups": [[g, sorted(n for n, j in assignment.items() if j == i)]
                       for i, g in enumerate(groups)], "default": default}


def _check_named_init(api: str, init: Mapping[Any, Any]) -> dict[str, Any]:
    """``init={name: number}`` of a per-tensor kind: names as keys, a number each."""
    named = dict(init)
    if not named:
        raise ValueError(f"{api}: init={{}} names no parameter; give a value per tuned "
                         f"parameter by name, or one number for all.")
    keys = [k for k in named if not isinstance(k, str)]
    if keys:
        raise TypeError(f"{api}: init={named!r} has keys {keys} that are not parameter names "
                        f"(strings, as in model.named_parameters()).")
    for k, v in named.items():
        _check_init(f"{api}: init[{k!r}]", v)
        if torch.as_tensor(v, dtype=torch.float64).ndim != 0:
            raise ValueError(f"{api}: init[{k!r}]={_short_init(v)} must be one number (the "
                             f"tensor's value), not a list or a tensor.")
    return named


def _place_named_init(api: str, named: Mapping[str, Any], params: Sequence[str]) -> list[Any]:
    """``init={name: number}`` as the list in the order of ``params``; every entry named."""
    unknown = [k for k in named if k not in params]
    missing = [p for p in params if p not in named]
    if unknown or missing:
        what = "; ".join(x for x in (
            f"names {unknown}, which are not tuned (not among the model's trainable "
            f"parameters: a frozen one, requires_grad=False, is never trained)" if unknown
            else "",
            f"gives no value for {missing}" if missing else "") if x)
        only = [k for k in named if k in params]
        fix = (f"; or, to tune only those it names, pass params={only} too (the others then "
               f"read default=<constant>)" if missing and only else "")
        raise ValueError(f"{api}: init {what}; the tuned parameters are {list(params)}: name "
                         f"each of them once, or give one number for all{fix}.")
    return [named[p] for p in params]


def _check_params(api: str, params: Any) -> None:
    """``params`` is ``None`` (every trainable parameter) or a non-empty list of names: an empty
    list would tune nothing (its kind adds no raw value, and an optimizer argument bound to it
    would read only the default), a string would be read letter by letter."""
    if isinstance(params, str) or (params is not None and not all(
            isinstance(p, str) for p in params)):
        raise TypeError(f"{api}: params={params!r} must be a list of parameter names "
                        f"(params=[{params!r}] for one), or None for every trainable parameter.")
    if params is not None and len(params) == 0:
        raise ValueError(f"{api}: params=[] lists no parameter, so it would tune nothing; list "
                         f"at least one parameter name, or pass params=None for every trainable "
                         f"parameter.")


def _check_default(api: str, default: Any, rest: str = "not in params",
                   everyone: str = "params lists every trainable parameter") -> float | None:
    """``PerTensor(default=...)``, ``PerGroup(default=...)``: ``None`` or a finite number (a
    0-d tensor is read as one), the value the other parameters (``rest``) read (a NaN would
    make every loss NaN)."""
    if default is None:
        return None
    if isinstance(default, Tensor) and default.numel() == 1 and default.dtype != torch.bool:
        default = default.item()
    what = (f"the constant value of the parameters {rest}, e.g. default=0.0 (or None when "
            f"{everyone})")
    if not is_real(default):
        raise TypeError(f"{api}: default={default!r} ({type(default).__name__}) must be a "
                        f"number, {what}.")
    if not math.isfinite(float(default)):
        raise ValueError(f"{api}: default={default!r} must be a finite number, {what}.")
    return float(default)


def _bind_names(api: str, listed: Sequence[str] | None, param_names: Sequence[str]
                ) -> list[str]:
    """``listed`` checked against the model's trainable parameters (``None``: all of them)."""
    names = list(param_names)
    if listed is None:
        return names
    unknown = [p for p in listed if p not in names]
    if unknown:
        raise ValueError(f"{api}: params {unknown} are not trainable parameters of the model; "
                         f"choose from {names} (a frozen parameter or a buffer is not trained; "
                         f"a tied parameter is listed once, under its first name in "
                         f"model.named_parameters()).")
    if len(set(listed)) != len(listed):
        raise ValueError(f"{api}: params={list(listed)} has repeats.")
    return list(listed)


@dataclass
class InitScale(HyperParameter):
    """A scale of the initial weights, one per listed parameter tensor (a per-layer
    initialisation scale): training starts from ``w_0[p] = scale[p] * w_0(model)[p]``.

    ``params``: parameter names (as in ``model.named_parameters()``); ``None``: every trainable
    parameter whose initial weights are not all zero (a zero-initialised bias, as BatchNorm's
    and LayerNorm's, scales to itself), resolved when the problem is built; a listed tensor
    that starts at zero is refused. Unlisted parameters start unscaled. Forward
    mode starts from ``Z_0 = d s_0 / d lam`` (``w_0(model)[p]`` in column ``p``), reverse mode
    adds ``a_0^T d s_0 / d lam``.

    Example:
        >>> InitScale("init", 1.0, params=["0.weight", "2.weight"]).shape()
        (2,)
    """

    init: float | Sequence[float] | Tensor = 1.0
    transform: str = "log"
    params: Sequence[str] | None = None
    kind: str = field(init=False, default="init_scale")
    initializes = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_params(f"InitScale({self.name!r})", self.params)

    def shape(self) -> tuple[int, ...]:
        if self.params is None:
            raise ValueError(
                f"InitScale({self.name!r}): parameter names are not bound yet; build an "
                f"InnerProblem with it (which binds params=None to the model) or pass "
                f"params=[...]."
            )
        return (len(self.params),)

    def bind(self, param_names: Sequence[str],
             params: Mapping[str, Tensor] | None = None) -> InitScale:
        names = _bind_names(f"InitScale({self.name!r})", self.params, param_names)
        if params is not None:
            zero = [p for p in names if p in params and not bool(params[p].any())]
            if zero and self.params is not None:
                raise ValueError(
                    f"InitScale({self.name!r}): params {zero} start at exactly zero, and a "
                    f"scale of zeros is zeros: its hypergradient would be exactly 0 and it "
                    f"would never move. Remove them from params, or give them non-zero "
                    f"initial weights (InitWeights tunes a tensor's initial values).")
            names = [p for p in names if p not in zero]  # params=None: the scalable ones
            if not names:
                raise ValueError(
                    f"InitScale({self.name!r}): every trainable parameter starts at exactly "
                    f"zero, so there is nothing to scale; use InitWeights.")
        return InitScale(self.name, self.init, self.transform, names)

    def value(self, raw: Tensor, step: int | None, horizon: int) -> Any:
        v = TRANSFORMS[self.transform][0](raw)
        assert self.params is not None
        return {p: v[i] for i, p in enumerate(self.params)}

    def apply_init(self, params: dict[str, Tensor], value: Mapping[str, Tensor]
                   ) -> dict[str, Tensor]:
        """``params`` with the listed tensors scaled: ``value[p] * params[p]``."""
        return {k: value[k] * v if k in value else v for k, v in params.items()}


class InitWeights(HyperParameter):
    """The initial weights themselves as hyperparameters: ``w_0[p] = lam[p]`` for the listed
    tensors (a learnable initialisation, as in MAML / FAR-HO / higher). ``K`` is their number of
    elements, so reverse mode is the method for it (forward mode carries K tangent columns).

    Args:
        name: the hyperparameter's name.
        params: parameter names; ``None``: every trainable parameter.
        init: the initial values, flat, in the order of ``params`` (``None``: the model's own
            initial values, read when the problem is built).
        transform: ``"identity"`` (default) or another named transform.

    Example:
        >>> InitWeights("w0", params=["2.bias"]).kind
        'init_weights'
    """

    kind = "init_weights"
    initializes = True

    def __init__(self, name: str, params: Sequence[str] | None = None,
                 init: float | Sequence[float] | Tensor | None = None,
                 transform: str = "identity") -> None:
        self.name, self.transform = name, transform
        _check_params(f"InitWeights({name!r})", params)
        self.params = None if params is None else list(params)
        self.init = 0.0 if init is None else init  # validated now, replaced when bound
        self._init_given = init is not None
        self.shapes: dict[str, tuple[int, ...]] | None = None
        self.__post_init__()

    def __repr__(self) -> str:
        return (f"InitWeights(name={self.name!r}, params={self.params!r}, "
                f"transform={self.transform!r})")

    __eq__ = object.__eq__  # the dataclass comparison would compare tensors elementwise
    __hash__ = object.__hash__

    def entry_names(self) -> list[str]:
        return []  # its entries are the elements of its tensors

    def shape(self) -> tuple[int, ...]:
        if self.shapes is None:
            raise ValueError(
                f"InitWeights({self.name!r}): not bound to a model yet; build an InnerProblem "
                f"with it (which reads the parameters' shapes and initial values)."
            )
        return (sum(math.prod(s) for s in self.shapes.values()),)

    def bind(self, param_names: Sequence[str],
             params: Mapping[str, Tensor] | None = None) -> InitWeights:
        api = f"InitWeights({self.name!r})"
        names = _bind_names(api, self.params, param_names)
        if params is None:
            raise ValueError(f"{api}: binding needs the model's initial parameters; build an "
                             f"InnerProblem with it.")
        out = InitWeights(self.name, names, self.init if self._init_given else None,
                          self.transform)
        out.shapes = {p: tuple(params[p].shape) for p in names}
        if not self._init_given:
            out.init = torch.cat([params[p].detach().reshape(-1).to(torch.float64).cpu()
                                  for p in names])
            out._init_given = True
            _, _, valid, domain = TRANSFORMS[self.transform]
            if not valid(out.init):  # the message said "init=tensor(...)", given by no one
                raise ValueError(
                    f"{api}: no init was given, so it starts from the model's own initial "
                    f"weights of {names}, which lie outside the domain of transform="
                    f"{self.transform!r} ({domain}; they range over "
                    f"[{float(out.init.min()):.3g}, {float(out.init.max()):.3g}]). Use "
                    f"transform='identity' (the default for weights), or give an init in "
                    f"that domain.")
        return out

    def value(self, raw: Tensor, step: int | None, horizon: int) -> Any:
        v = TRANSFORMS[self.transform][0](raw)
        assert self.shapes is not None
        out, start = {}, 0
        for p, shp in self.shapes.items():
            n = math.prod(shp)
            out[p] = v[start:start + n].reshape(shp)
            start += n
        return out

    def apply_init(self, params: dict[str, Tensor], value: Mapping[str, Tensor]
                   ) -> dict[str, Tensor]:
        """``params`` with the listed tensors replaced by ``value[p]``."""
        return {k: value[k].to(v.dtype) if k in value else v for k, v in params.items()}


def _check_step(step: Any, horizon: Any, schedules: Sequence[Schedule]) -> None:
    """A step read with a schedule names its horizon, and both are in range: without the
    horizon every step read the last window (the old default horizon of 1), and a negative
    step read the last window too (Python's negative index)."""
    # only plain ints are compared: under torch.compile a step may be traced as a symbolic int
    ints = (numbers.Integral, torch.SymInt)
    if isinstance(step, bool) or not isinstance(step, ints) or (
            isinstance(step, numbers.Integral) and step < 0):
        raise ValueError(f"HyperParams.values: step={step!r} must be an int >= 0 (the 0-based "
                         f"inner step), or None for the whole schedules.")
    if isinstance(horizon, bool) or (horizon is not None and not isinstance(horizon, ints)) or (
            isinstance(horizon, numbers.Integral) and horizon < 1):
        raise ValueError(f"HyperParams.values: horizon={horizon!r} must be an int >= 1, the "
                         f"number of inner steps T (problem.steps).")
    if horizon is None and schedules:
        names = [it.name for it in schedules]
        raise ValueError(f"HyperParams.values: step={step} without horizon; the schedules "
                         f"{names} read window step * windows // horizon, so pass the horizon: "
                         f"values(lam, step={step}, horizon=problem.steps).")


class HPValues(Mapping[str, Any]):
    """Read-only mapping name -> value given to losses; it remembers which names were read, so
    a hyperparameter bound to nothing can be reported, and it names the choices on a typo."""

    def __init__(self, values: dict[str, Any], where: str) -> None:
        self._values = values
        self._where = where
        self.accessed: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            raise KeyError(
                f"{self._where}: unknown hyperparameter {key!r}; defined are "
                f"{sorted(self._values)}. Add it to HyperParams or fix the name."
            )
        self.accessed.add(key)
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class HyperParams:
    """An ordered set of hyperparameters laid out in one flat raw vector ``lam`` of length ``K``.

    Args:
        items: the hyperparameters, a sequence or a mapping ``{name: hyperparameter}`` (each
            key its item's name; the form the Hydra configs instantiate); names must be unique.

    ``slices[name]`` is the slice of ``lam`` holding ``name``; :meth:`values` maps ``lam``
    (shape ``(K,)``) to what training reads at a step.

    Example:
        >>> HyperParams({"lr": Scalar("lr", 0.1, transform="log")}).names
        ['lr']
    """

    def __init__(self, items: Sequence[HyperParameter] | Mapping[str, HyperParameter]) -> None:
        if isinstance(items, HyperParams):  # 'HyperParams' object is not iterable
            raise TypeError("HyperParams: items is a HyperParams already; pass it as it is, or "
                            "HyperParams([*hps.items, ...]) to add items.")
        if isinstance(items, HyperParameter) or items is None or isinstance(items, str):
            # 'Scalar' object is not iterable
            raise TypeError(f"HyperParams: items={items!r} must be a list of hyperparameters, "
                            f"e.g. HyperParams([Scalar('lr', 0.1, transform='log')]).")
        if isinstance(items, Mapping):
            for key, it in items.items():
                if getattr(it, "name", key) != key:
                    raise ValueError(
                        f"HyperParams: the item under key {key!r} is named {it.name!r}; a "
                        f"mapping's keys must be the items' names (rename one of them).")
            items = list(items.values())
        items = list(items)
        if not items:
            raise ValueError(
                "HyperParams: got no hyperparameters (K = 0), so there is nothing to "
                "differentiate; pass at least one, e.g. HyperParams([Scalar('lr', 0.1, "
                "transform='log')])."
            )
        for it in items:
            if not isinstance(it, HyperParameter):
                raise TypeError(
                    f"HyperParams: expected hypergrad hyperparameters (Scalar, PerTensor, "
                    f"Schedule, PerExample, Array, ...), got {type(it).__name__}: {it!r}."
                )
        names = [it.name for it in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"HyperParams: names {dup} are used more than once; rename them.")
        self.items: list[HyperParameter] = items
        self.by_name = {it.name: it for it in items}

    def bind(self, param_names: Sequence[str],
             params: Mapping[str, Tensor] | None = None) -> HyperParams:
        """Resolve parameter lists (:class:`PerTensor`, :class:`InitScale`) and initial values
        (:class:`InitWeights`) against a model's trainable parameters.

        A parameter tensor may be set by one initialisation kind only: they apply in order, so
        an :class:`InitWeights` after an :class:`InitScale` of the same tensor would discard the
        scale (its hypergradient exactly 0, its value reported as learned), and two kinds on one
        tensor tune one number twice."""
        bound = HyperParams([it.bind(param_names, params) for it in self.items])
        owner: dict[str, str] = {}
        for it in bound.init_items:
            for p in getattr(it, "params", None) or []:
                if p in owner:
                    raise ValueError(
                        f"HyperParams: parameter {p!r} is set by two initialisation "
                        f"hyperparameters, {owner[p]!r} and {it.name!r}; they apply in order, so "
                        f"the later one overrides or rescales the earlier (an InitWeights after "
                        f"an InitScale discards the scale: its hypergradient is 0). List each "
                        f"parameter in one of them: params=[...].")
                owner[p] = it.name
        return bound

    @property
    def init_items(self) -> list[HyperParameter]:
        """The kinds that set the initial state (:class:`InitScale`, :class:`InitWeights`)."""
        return [it for it in self.items if it.initializes]

    def apply_init(self, params: dict[str, Tensor], lam: Tensor) -> dict[str, Tensor]:
        """The initial parameters at ``lam``: ``params`` (the model's) with every
        initialisation kind applied in order. Differentiable in ``lam``."""
        items = self.init_items
        if not items:
            return params
        raw = self.split(lam)
        out = dict(params)
        for it in items:
            out = it.apply_init(out, it.value(raw[it.name], None, 1))  # type: ignore[attr-defined]
        return out

    @property
    def names(self) -> list[str]:
        return [it.name for it in self.items]

    @property
    def slices(self) -> dict[str, slice]:
        out, start = {}, 0
        for it in self.items:
            out[it.name] = slice(start, start + it.numel)
            start += it.numel
        return out

    @property
    def num_raw(self) -> int:
        """``K``, the number of raw scalars."""
        return sum(it.numel for it in self.items)

    def init_raw(self, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> Tensor:
        """The initial raw vector ``lam``, shape ``(K,)``."""
        if not dtype.is_floating_point:
            raise TypeError(
                f"HyperParams.init_raw: dtype={dtype} is not a floating dtype; hypergradients "
                f"need float32 or float64."
            )
        if dtype in _HALF:
            raise TypeError(
                f"HyperParams.init_raw: dtype={dtype}; hypergradients need float32 or float64 "
                f"({_HALF_WHY}). Use init_raw(torch.float32) or problem.init_raw()."
            )
        return torch.cat([it.init_raw(dtype, device).reshape(-1) for it in self.items])

    def split(self, lam: Tensor) -> dict[str, Tensor]:
        """Raw slices by name, each reshaped to its hyperparameter's shape."""
        self.check_raw(lam)
        return {it.name: lam[s].reshape(it.shape())
                for it, s in zip(self.items, self.slices.values())}

    def check_raw(self, lam: Tensor, api: str = "HyperParams") -> None:
        if not isinstance(lam, Tensor):
            raise TypeError(f"{api}: lam must be a torch.Tensor of shape (K,), got "
                            f"{type(lam).__name__}.")
        if tuple(lam.shape) != (self.num_raw,):
            raise ValueError(
                f"{api}: lam has shape {tuple(lam.shape)}, expected ({self.num_raw},) = K raw "
                f"values for {self.names}; start from hyperparams.init_raw()."
            )
        if not lam.dtype.is_floating_point:
            raise TypeError(f"{api}: lam has dtype {lam.dtype}; use a floating dtype.")
        if lam.dtype in _HALF:
            raise TypeError(f"{api}: lam has dtype {lam.dtype}; hypergradients need float32 or "
                            f"float64 ({_HALF_WHY}): lam.float(), or start from "
                            f"problem.init_raw().")

    def step_key(self, step: int, horizon: int) -> tuple[int, ...] | None:
        """What :meth:`values` at ``step`` depends on besides ``lam``: each schedule's window
        (the library's other kinds read no step); ``None`` where a kind of the user's own may
        read the step in its own way."""
        key = []
        for it in self.items:
            if type(it).__module__ != __name__:
                return None
            if isinstance(it, Schedule):
                key.append(int(it.window(step, horizon)))
        return tuple(key)

    def values(self, lam: Tensor, step: int | None = None, horizon: int | None = None
               ) -> dict[str, Any]:
        """What training reads: name -> transformed value at ``step`` of ``horizon``.

        Scalars and schedules give 0-d tensors (the whole schedule when ``step`` is None),
        per-tensor kinds a ``dict`` param name -> 0-d tensor, the others tensors. A schedule's
        value at a step depends on the horizon (step ``t`` reads window
        ``t * windows // horizon``), so a ``step`` needs its ``horizon`` (``problem.steps``)
        where a :class:`Schedule` is present.

        Example:
            >>> hp = HyperParams([Schedule("lr", [0.1, 0.2], windows=2)])
            >>> float(hp.values(hp.init_raw(torch.float64), step=3, horizon=4)["lr"])
            0.2
        """
        return self.values_from(self.split(lam), step, horizon)

    def values_from(self, raw: Mapping[str, Tensor], step: int | None = None,
                    horizon: int | None = None) -> dict[str, Any]:
        """:meth:`values` from the raw slices by name (each of its hyperparameter's shape):
        ``InnerProblem.check`` gives each group a leaf of its own, to see which losses'
        autograd graphs reach which group."""
        if step is not None:
            _check_step(step, horizon, [it for it in self.items if isinstance(it, Schedule)])
        return {it.name: it.value(raw[it.name], step, 1 if horizon is None else horizon)
                for it in self.items}

    def named(self, values: Mapping[str, Any], horizon: int) -> dict[str, float]:
        """``{label: value}`` of described values (:meth:`describe`, or a Trainer record's
        ``hyperparams``), every entry named: a scalar as ``lr``, a schedule's windows by their
        inner steps (``lr[steps 0-59]``) and its scales by their groups (``lr[head]``),
        per-tensor values by the parameter's name (``wd[fc1.weight]``), per-group values by the
        group's name (``wd[decay]``), vectors by index (``cw[2]``)."""
        out: dict[str, float] = {}
        for it in self.items:
            # float64: a record's values are Python floats (float64); the default dtype
            # rounded them to float32 digits, and 1e-50 to 0
            flat = [float(x) for x in torch.as_tensor(values[it.name], dtype=torch.float64)
                    .reshape(-1).tolist()]
            params = it.entry_names()
            if isinstance(it, Schedule):
                groups = [f"{g}, " for g in it.groups] if it.groups is not None else [""]
                for gi, g in enumerate(groups):
                    row = flat[gi * it.windows:(gi + 1) * it.windows]
                    for w, ((a, b), x) in enumerate(zip(it.steps(horizon), row)):
                        # a window no step reads (more windows than steps): by its index, so
                        # that no two windows share a label (one's value was dropped)
                        span = f"steps {a}-{b}" if a <= b else f"window {w}: no step"
                        out[f"{it.name}[{g}{span}]"] = x
                for g, x in zip(it.scales or [], flat[it.windows:]):  # tuned factors
                    out[f"{it.name}[{g}]"] = x
            elif len(params) == len(flat) > 0:
                for name, x in zip(params, flat):
                    out[f"{it.name}[{name}]"] = x
            elif len(flat) == 1:
                out[it.name] = flat[0]
            else:
                for i, x in enumerate(flat):
                    out[f"{it.name}[{i}]"] = x
        return out

    def describe(self, lam: Tensor) -> dict[str, list[float] | float]:
        """Plain-Python transformed values (for logs and JSON)."""
        out: dict[str, list[float] | float] = {}
        for it in self.items:
            raw = self.split(lam.detach())[it.name]
            v = TRANSFORMS[it.transform][0](raw)
            out[it.name] = v.tolist()
        return out

    def __repr__(self) -> str:
        return f"HyperParams({self.items!r})"
