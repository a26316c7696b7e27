"""The optimizer interface: pure ``init``/``update`` over NamedTuple states (as in optax), and
beside them the optimizer's own tangent rule.

An optimizer is a small class, one module per algorithm (:mod:`~hypergrad.optim.sgd`,
:mod:`~hypergrad.optim.adam`, :mod:`~hypergrad.optim.rmsprop`, :mod:`~hypergrad.optim.adagrad`):

- ``init(params) -> state`` and ``update(grads, state, params, hp, step) -> (params, state)``:
  pure functions of dicts of tensors. Each argument (``lr``, ``momentum``, ...) is a constant
  number or the *name* of a hyperparameter, read at every step from ``hp`` with :meth:`read`.
- ``elementwise``: whether every output element depends only on the same element of each input
  (and on scalar hyperparameters). Forward mode then linearises the update by its diagonal
  Jacobian instead of ``jvp``.
- ``tangent(ctx, new_params, new_state)`` (optional): the update's tangent in closed form, all K
  columns at once, given the primal update that ``update`` computed. ``None`` (the default) lets
  forward mode derive it (:mod:`hypergrad.tangent`).
- ``stationary_args`` and ``penalty(params, hp)`` (optional): the arguments whose effect at a
  fixed point of the update is a term of the objective being minimised (an L2 weight decay
  added to the gradient: the ``weight_decay`` of SGD, Adam, RMSprop and Adagrad, not AdamW's
  decoupled one), and that term. Implicit differentiation (:class:`~hypergrad.ImplicitDiff`)
  adds it to the training loss and accepts hyperparameters bound to those arguments; every
  other optimizer hyperparameter (learning rates, momenta, schedules of them) leaves the fixed
  point unchanged.

The engine never reads an optimizer's name or private fields and takes the primal update only
from ``update``. A new optimizer is a new module: subclass :class:`Optimizer`, write ``init`` and
``update`` (and ``tangent`` if you want the speed), add a factory.
"""

from __future__ import annotations

import abc
import copy
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from ..errors import flag, is_real

__all__ = ["Optimizer", "TangentContext", "Params", "Arg", "PerParam", "safe_sqrt", "fma", "owned",
           "is_zero", "const_zero", "flag", "inv_twice", "l2_penalty", "l2_tangent", "register",
           "registered", "create", "ENTRY_POINTS"]

Params = dict[str, Tensor]


class PerParam:
    """A constant optimizer argument that differs between parameter tensors, as
    ``torch.optim``'s parameter groups hold it: ``{pattern: value}``, each parameter reading the
    value of the first regular expression that matches its name (``re.search`` on the names of
    ``model.named_parameters()``). Pass the mapping as the argument, e.g. no weight decay on
    biases::

        adamw(lr="lr", weight_decay={r"weight$": 0.1, r".*": 0.0})

    A norm layer's scale is named ``weight`` too (a LayerNorm at index 1 of a Sequential:
    ``1.weight``), so ``r"weight$"`` decays it; to leave norms out as the usual recipe does,
    put a pattern for them first (``{r"^1\\.": 0.0, r"weight$": 0.1, r".*": 0.0}``, or their
    modules' names: ``r"norm"``).

    It costs no tangent column (a hyperparameter tuned per group is a
    :class:`~hypergrad.PerGroup`). Every parameter must match a pattern (end with ``".*"`` for
    the others) and every pattern some parameter; the inner problem checks both."""

    def __init__(self, values: Mapping[str, Any], where: str = "PerParam") -> None:
        example = "e.g. {r'weight$': 0.1, r'.*': 0.0}"
        if not isinstance(values, Mapping) or not values:
            raise ValueError(f"{where}={values!r} must map regular expressions on parameter "
                             f"names to numbers, {example}.")
        self.values: dict[str, float] = {}
        self._patterns: list[tuple[re.Pattern[str], float]] = []
        for pattern, v in values.items():
            if not isinstance(pattern, str):
                raise TypeError(f"{where}: the key {pattern!r} must be a regular expression on "
                                f"parameter names (a str), {example}.")
            if not is_real(v):
                raise TypeError(f"{where}[{pattern!r}]={v!r} must be a number (a value per "
                                f"parameter is a constant; tune one with hypergrad.PerGroup), "
                                f"{example}.")
            try:
                compiled = re.compile(pattern)
            except re.error as err:
                raise ValueError(f"{where}: {pattern!r} is not a regular expression ({err}), "
                                 f"{example}.") from None
            self.values[pattern] = float(v)
            self._patterns.append((compiled, float(v)))
        self._memo: dict[str, float] = {}

    def match(self, pname: str) -> int | None:
        """The index of the first pattern that matches ``pname`` (``None``: none)."""
        return next((i for i, (p, _) in enumerate(self._patterns) if p.search(pname)), None)

    def __getitem__(self, pname: str) -> float:
        if pname not in self._memo:
            i = self.match(pname)
            if i is None:
                raise KeyError(f"parameter {pname!r} matches no pattern of {self!r}")
            self._memo[pname] = self._patterns[i][1]
        return self._memo[pname]

    def check(self, where: str, names: Sequence[str]) -> None:
        """Refuse parameters that match no pattern and patterns that match no parameter (a typo
        would set nothing)."""
        hits = {n: self.match(n) for n in names}
        missing = [n for n, i in hits.items() if i is None]
        if missing:
            raise ValueError(f"{where}={self!r}: parameters {missing} match no pattern; add one "
                             f"for them (r'.*': <value> last gives every other parameter a "
                             f"value).")
        unused = [p for i, p in enumerate(self.values) if i not in hits.values()]
        if unused:
            raise ValueError(f"{where}={self!r}: patterns {unused} match no parameter (or only "
                             f"parameters an earlier pattern took) of the model {list(names)}; "
                             f"fix or remove them (a frozen parameter is not listed; a tied one "
                             f"is listed once, under its first name).")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PerParam) and other.values == self.values

    def __hash__(self) -> int:
        return hash(tuple(self.values.items()))

    def __repr__(self) -> str:
        return repr(self.values)


Arg = float | str | PerParam


def safe_sqrt(x: Tensor, eps_root: float = 0.0) -> Tensor:
    """``sqrt(x + eps_root)`` with a finite derivative (0) where ``x + eps_root <= 0``.

    A second moment is exactly 0 for a weight whose gradient has always been 0; the plain square
    root has an infinite derivative there and turns tangents into NaN (0 * inf). The value is
    unchanged, so updates still equal ``torch.optim`` bit for bit when ``eps_root=0``.
    """
    x = x + eps_root if eps_root else x
    pos = x > 0
    return torch.where(pos, torch.sqrt(torch.where(pos, x, torch.ones_like(x))),
                       torch.zeros_like(x))


def plain_update(params: Params, grads: Params) -> bool:
    """Whether an update may take its flat path: outside autograd (``torch.no_grad``, nothing
    requiring grad) and any function transform, every tensor on one device in one dtype
    (a plain run's steps; every differentiated pass takes the per-parameter path)."""
    if torch.is_grad_enabled() or torch._C._functorch.maybe_current_level() is not None:
        return False
    if len(params) < 2:
        return False
    first = next(iter(params.values()))
    return all(t.dtype == first.dtype and t.device == first.device and not t.requires_grad
               for d in (params, grads) for t in d.values())


def group_by_values(params: Params, values: Callable[[str], tuple[Any, ...]]
            ) -> list[tuple[list[str], tuple[Any, ...]]]:
    """The parameters grouped by the hyperparameter values they read (``values(name)``), in
    the parameters' order: equal values (a CPU scalar's value, a CUDA tensor's identity, so
    as not to wait for the device) give equal results, so their parameters can share each
    operation. A parameter that reads a value per element, and a 0-d one, form a group of
    their own."""
    out: dict[tuple[Any, ...], tuple[list[str], tuple[Any, ...]]] = {}
    for k in params:
        vals = values(k)
        key: tuple[Any, ...] = tuple(_value_key(v) for v in vals)
        if params[k].dim() == 0 or any(isinstance(v, Tensor) and v.dim() > 0 for v in vals):
            # alone: a value per element; a 0-d parameter (a 0-d float64 value promotes it to
            # float64, as the per-parameter update does, where a flat tensor would not)
            key = (*key, k)
        out.setdefault(key, ([], vals))[0].append(k)
    return list(out.values())


def _value_key(v: Any) -> Any:
    if not isinstance(v, Tensor):
        return (type(v), v)
    if v.dim() == 0 and v.device.type == "cpu":
        return (v.dtype, float(v))
    return id(v)


def flatten_group(d: Params, keys: list[str]) -> Tensor:
    """The group's tensors as one flat tensor (one parameter: the tensor itself)."""
    return d[keys[0]] if len(keys) == 1 else torch.cat([d[k].reshape(-1) for k in keys])


def unflatten_group(out: dict[str, Tensor], flat: Tensor, like: Params, keys: list[str]) -> None:
    """:func:`flatten_group`'s inverse into ``out`` (views of ``flat``, shaped as ``like``'s)."""
    if len(keys) == 1:
        out[keys[0]] = flat
        return
    shapes = [like[k].shape for k in keys]
    for k, part, shape in zip(keys, flat.split([math.prod(s) for s in shapes]), shapes,
                              strict=True):
        out[k] = part.view(shape)


def inv_twice(root: Tensor) -> Tensor:
    """``1 / (2 root)``, the derivative of :func:`safe_sqrt` at ``root**2``: 0 where ``root`` is
    0."""
    return torch.where(root > 0, 0.5 / torch.where(root > 0, root, 1.0), 0.0)


def l2_penalty(opt: Optimizer, arg: str, params: Params, hp: Mapping[str, Any]
               ) -> Tensor | None:
    """``sum_p wd_p ||w_p||^2 / 2`` for the weight decay argument ``arg`` of ``opt`` (per
    parameter where it is a per-tensor hyperparameter); ``None`` when it is the constant 0."""
    wd = opt.args[arg]
    if is_zero(wd):
        return None
    terms = [0.5 * opt.read(wd, hp, k) * (w * w).sum() for k, w in params.items()]
    return torch.stack(terms).sum() if len(terms) > 1 else terms[0]


def l2_tangent(opt: Optimizer, ctx: TangentContext, arg: str, k: str) -> tuple[Tensor, Tensor]:
    """``(d, Z_d)`` for the L2-decayed gradient ``d = g + wd w`` of parameter ``k`` (``wd`` the
    argument ``arg``; the gradient itself when it is the constant 0): ``Z_d = G + wd Z_w``, plus
    ``w`` on the rows of a bound ``wd``, written into this step's ``G``."""
    d, zd = ctx.grads[k], owned(ctx.G[k])
    if is_zero(opt.args[arg]):
        return d, zd
    w, wd = ctx.params[k], opt.read(opt.args[arg], ctx.hp, k)
    zd = fma(zd, ctx.z_params[k], wd, inplace=True)
    ctx.add_direct(zd, wd, w)
    return d + wd * w, zd


def is_zero(a: Any) -> bool:
    """Whether an argument is the constant 0 for every parameter (a hyperparameter's name
    never is)."""
    if isinstance(a, PerParam):
        return all(v == 0.0 for v in a.values.values())
    return not isinstance(a, str) and float(a) == 0.0


def const_zero(a: Any) -> bool:
    """Whether a value read at a step is the number 0 (a hyperparameter's tensor never is)."""
    return isinstance(a, (int, float)) and a == 0


def fma(a: Tensor, b: Tensor, s: Any, inplace: bool) -> Tensor:
    """``a + s * b`` (``s`` a number or a 0-d tensor), in ``a``'s memory when ``inplace``."""
    if isinstance(s, Tensor):
        return a.addcmul_(b, s) if inplace else torch.addcmul(a, b, s)
    return a.add_(b, alpha=s) if inplace else torch.add(a, b, alpha=s)


def owned(x: Tensor) -> Tensor:
    """``x`` if it may be written in place (contiguous, alone in its storage), else a copy."""
    whole = x.untyped_storage().nbytes() == x.numel() * x.element_size()
    return x if x.is_contiguous() and whole else x.clone()


class TangentContext:
    """What a closed-form tangent rule gets for step ``t``: the primal inputs, their tangents
    (leading axis of ``K'`` columns), and the hyperparameters' values with their derivatives.

    Attributes:
        step: ``t``. grads, state, params: the update's primal inputs.
        G: tangent of the gradient, ``G[name]`` of shape ``(K', *param.shape)`` (this step's
            own tensors: a rule may write into them). z_state, z_params: tangents of the
            optimizer state and parameters (the caller's: never written).
        hp: hyperparameter values at step ``t`` (detached 0-d tensors, dicts per parameter).
        rows: the rows of the ``K'`` columns that the optimizer's hyperparameters occupy.
    """

    def __init__(self, step: int, grads: Params, state: NamedTuple, params: Params, G: Params,
                 z_state: NamedTuple, z_params: Params, hp: Mapping[str, Any],
                 derivatives: Mapping[int, Tensor], rows: Sequence[int]) -> None:
        self.step, self.grads, self.state, self.params = step, grads, state, params
        self.G, self.z_state, self.z_params = G, z_state, z_params
        self.hp = hp
        self._d = derivatives
        self.rows = list(rows)

    def derivative(self, value: Any) -> Tensor | None:
        """``d value / d lam`` at the columns read (shape ``(len(rows),)``) for a value from
        :attr:`hp`; ``None`` for a constant."""
        return self._d.get(id(value)) if isinstance(value, Tensor) else None

    def add_direct(self, z: Tensor, value: Any, x: Tensor | Callable[[], Tensor],
                   sign: float = 1.0) -> None:
        """A hyperparameter's own term: ``z[rows[j]] += sign * (d value / d lam_j) * x`` for the
        columns read; nothing for a constant. ``x`` may be a callable, evaluated only when
        needed (a step does not pay for the terms of constant hyperparameters)."""
        d = self.derivative(value)
        self.add_term(z, d, x, sign)

    def add_term(self, z: Tensor, d: Tensor | None, x: Tensor | Callable[[], Tensor],
                 sign: float = 1.0) -> None:
        """``z[rows[j]] += sign * d[j] * x`` (``d`` a derivative vector, or ``None``: nothing).

        On the CPU the rows whose ``d[j]`` is 0 are skipped (and ``x`` is not evaluated when
        every one is): a schedule's value reads one or two of its windows at a step and a
        per-group value its group's column, so most of a step's entries are 0 (6-7 of 8 on
        the tests' small language model). Elsewhere every row is added: reading ``d`` would
        wait for a device, break a compiled graph, or find no values (a memory count's fake
        tensors, which then count every row's term: at most what the step holds)."""
        if d is None:
            return
        if d.device.type == "cpu" and not is_fake(d) and not torch.compiler.is_compiling():
            live = [j for j, v in enumerate(d.tolist()) if v != 0]
            if not live:
                return
        else:
            live = list(range(len(self.rows)))
        xv = x() if callable(x) else x
        for j in live:
            z[self.rows[j]].addcmul_(xv, d[j], value=sign)

    def combine(self, *terms: tuple[Any, Tensor | None]) -> Tensor | None:
        """``sum c * d`` over the ``(c, d)`` whose derivative ``d`` is not ``None``."""
        out = [c * d for c, d in terms if d is not None]
        return None if not out else out[0] if len(out) == 1 else torch.stack(out).sum(0)


DOMAINS: dict[str, tuple[Callable[[float], bool], str]] = {
    "positive": (lambda v: 0 < v < math.inf, "> 0"),
    "nonnegative": (lambda v: 0 <= v < math.inf, ">= 0"),
    "unit": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "open_unit": (lambda v: 0 < v < 1, "in (0, 1)"),
}
"""The domains of optimizer constants: name -> (test, words). NaN and inf pass none."""

DOMAIN_ENDS: dict[str, tuple[float, float, bool, bool]] = {
    "positive": (0.0, math.inf, True, False),
    "nonnegative": (0.0, math.inf, False, False),
    "unit": (0.0, 1.0, False, True),
    "open_unit": (0.0, 1.0, True, True),
}
"""Each domain of :data:`DOMAINS` as ``(low, high, low excluded, high excluded)``: the
Trainer holds a tuned hyperparameter inside the domain of the argument reading it."""


def _check_constant(api: str, where: str, value: Any, domain: str, example: str,
                    key: str) -> None:
    """A constant argument (not a hyperparameter's name) must lie in its domain: a negative
    learning rate trains uphill, a momentum of 1 never forgets, NaN poisons every step."""
    if isinstance(value, str):
        return
    if isinstance(value, PerParam):
        for pattern, v in value.values.items():
            _check_constant(api, f"{where}[{pattern!r}]", v, domain, example, key)
        return
    test, words = DOMAINS[domain]
    if not test(float(value)):
        fix = f", e.g. {key}={example}" if example else ""
        raise ValueError(f"{api}: {where}={value!r} must be a number {words} (or the name of a "
                         f"hyperparameter){fix}.")


class Optimizer(abc.ABC):
    """A pure optimizer (see the module docstring). Subclasses list their hyperparameter-capable
    arguments in ``hyper_args`` (``betas``-like pairs in ``pair_args``) and their fixed options
    (booleans, ``eps_root``) in ``options``."""

    hyper_args: tuple[str, ...] = ()
    pair_args: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    domains: ClassVar[dict[str, str]] = {}
    """The valid values of each argument (:data:`DOMAINS` names them: ``"positive"``,
    ``"nonnegative"``, ``"unit"`` for [0, 1), ``"open_unit"`` for (0, 1)): a constant is
    checked here, a hyperparameter's values by the problem and the Trainer
    (:meth:`hyperparameter_domains`)."""
    examples: ClassVar[dict[str, str]] = {}
    """A valid value of each argument, for messages (``lr="0.1"``)."""
    elementwise: bool = False
    """Whether each entry of the update's output depends only on the same entry of its inputs
    (the gradient, the parameter, the state): then forward mode takes its tangent from the
    diagonal Jacobian, cheaper than ``jvp``. False by default, where ``jvp`` is right for any
    update: an update that is not elementwise (a norm, a mean over a tensor) but says it is
    gets wrong hypergradients with no word (the built-in elementwise optimizers say True)."""
    stationary_args: tuple[str, ...] = ()
    """Arguments whose effect at a fixed point of the update is :meth:`penalty`'s term."""
    defaults: ClassVar[dict[str, Any]] = {}
    """Values of the arguments not given, as the factory's (:func:`factory_defaults`): the
    built-in classes have their factories' (torch.optim's), so ``SGD(lr="lr", momentum=0.9)``
    and a subclass of it build as ``sgd(...)`` does (it failed at the first update with a bare
    ``KeyError: 'dampening'``: the callbacks probe). A class of one's own without them gets
    exactly the arguments given."""

    def __init__(self, **args: Any) -> None:
        api = self.name  # the factory users call: sgd, adam, ...
        # the given order first (a repr reads as the call), then the defaults not given
        self.args: dict[str, Any] = {**args, **{k: v for k, v in self.defaults.items()
                                                if k not in args}}
        if self.defaults:
            missing = [k for k in (*self.hyper_args, *self.pair_args) if k not in self.args]
            if missing:
                raise TypeError(f"{api}: missing argument{'s' if len(missing) > 1 else ''} "
                                f"{missing}, e.g. {missing[0]}="
                                f"{self.examples.get(missing[0], '0.1')}.")
        for key, val in self.args.items():
            if key in self.options:
                if isinstance(val, Mapping):  # it failed mid-run ("Tensor + dict")
                    raise ValueError(
                        f"{api}: {key}={val!r} is a per-parameter mapping, but {key!r} is one "
                        f"of its fixed settings (options = {tuple(self.options)}), read as one "
                        f"value for every parameter; a {{pattern: value}} mapping is for the "
                        f"arguments that may be tuned ({tuple(self.hyper_args)}).")
                continue
            if key not in self.hyper_args and key not in self.pair_args:
                raise TypeError(f"{api}: unexpected argument {key!r}; arguments are "
                                f"{[*self.hyper_args, *self.pair_args, *self.options]}.")
            vals = val if key in self.pair_args else (val,)
            if key in self.pair_args and (not isinstance(val, (tuple, list)) or len(val) != 2):
                raise ValueError(f"{api}: {key}={val!r} must be a pair, e.g. (0.9, 0.999).")
            for i, v in enumerate(vals):
                where = f"{key}[{i}]" if key in self.pair_args else key
                if isinstance(v, Mapping) and not isinstance(v, PerParam):
                    v = PerParam(v, f"{api}: {where}")
                    if key in self.pair_args:
                        self.args[key] = tuple(v if j == i else x for j, x in enumerate(val))
                        val = self.args[key]
                    else:
                        self.args[key] = v
                if is_real(v) and not isinstance(v, (int, float)):
                    v = float(v)  # a NumPy number (from a grid): np.float32(0.1) was refused
                    if key in self.pair_args:
                        self.args[key] = tuple(v if j == i else x for j, x in enumerate(val))
                        val = self.args[key]
                    else:
                        self.args[key] = v
                if not isinstance(v, (str, int, float, PerParam)) or isinstance(v, bool):
                    # a pair's entry named as such, with a pair as the example (betas[0] was
                    # told "e.g. betas='lr' or betas=0.1")
                    eg = (f"e.g. {key}=(0.9, 'b2')" if key in self.pair_args else
                          f"e.g. {key}='lr' or {key}=0.1")
                    raise TypeError(
                        f"{api}: {where}={v!r} must be a number or the name of a "
                        f"hyperparameter (a str), {eg}, or a value per parameter "
                        f"({{pattern: number}})."
                    )
        for key in self.pair_args:
            self.args[key] = tuple(self.args[key])
        for key, val in self.args.items():
            if key in self.domains:
                vals = val if key in self.pair_args else (val,)
                for i, v in enumerate(vals):
                    where = f"{key}[{i}]" if key in self.pair_args else key
                    _check_constant(api, where, v, self.domains[key],
                                    self.examples.get(key, ""), key)

    @property
    def name(self) -> str:
        """For messages and reprs only: the built-ins' factory name (``sgd``), an optimizer of
        one's own by its class's name (``NormalizedSGD``, not ``normalizedsgd``)."""
        cls = type(self)
        return cls.__name__.lower() if cls.__module__.startswith("hypergrad.") else cls.__name__

    # -- binding ---------------------------------------------------------------------------------
    def _entries(self) -> Iterator[tuple[str, Any]]:
        """``(argument, value)`` of every argument but the options, a pair's entries apart
        (``betas[0]``, ``betas[1]``)."""
        for key, val in self.args.items():
            if key in self.options:
                continue
            if key in self.pair_args:
                yield from ((f"{key}[{i}]", v) for i, v in enumerate(val))
            else:
                yield key, val

    def bound_names(self) -> dict[str, str]:
        """Hyperparameter names this optimizer reads, mapped to the argument that reads them."""
        return {v: arg for arg, v in self._entries() if isinstance(v, str)}

    def hyperparameter_domains(self) -> dict[str, list[tuple[str, str]]]:
        """Each hyperparameter name this optimizer reads -> the ``(argument, domain)`` pairs
        (:data:`DOMAINS`) of the arguments that read it: a constant is checked against its
        domain when the optimizer is made, a hyperparameter's values by the problem (its
        initial value) and the Trainer (every point it tries). A learning rate may be 0 there
        (a group held frozen, a warm-up from 0: a window tuned to 0 trains nothing), which as a
        constant is refused as a likely mistake; below 0 it trains uphill."""
        out: dict[str, list[tuple[str, str]]] = {}
        for arg, v in self._entries():
            domain = self.domains.get(arg.split("[")[0])
            if arg == "lr" and domain == "positive":
                domain = "nonnegative"
            if isinstance(v, str) and domain is not None:
                out.setdefault(v, []).append((arg, domain))
        return out

    def per_param(self) -> dict[str, PerParam]:
        """The arguments with a constant per parameter (:class:`PerParam`), by argument
        (``betas[0]`` for a pair's entry)."""
        return {arg: v for arg, v in self._entries() if isinstance(v, PerParam)}

    def at_param(self, pname: str) -> Optimizer:
        """This optimizer with every :class:`PerParam` argument set to ``pname``'s value
        (``self`` when there is none): what one ``torch.optim`` parameter group holds."""
        if not self.per_param():
            return self

        def one(v: Any) -> Any:
            return v[pname] if isinstance(v, PerParam) else v

        out = copy.copy(self)
        out.args = {k: (v if k in self.options else tuple(one(x) for x in v)
                        if k in self.pair_args else one(v)) for k, v in self.args.items()}
        return out

    @staticmethod
    def read(arg: Arg, hp: Mapping[str, Any], pname: str) -> Any:
        """The value of argument ``arg`` for parameter ``pname``: the constant (a
        :class:`PerParam`'s value for ``pname``), or the hyperparameter's value (a per-tensor
        hyperparameter's entry for ``pname``)."""
        if isinstance(arg, PerParam):
            return arg[pname]
        if not isinstance(arg, str):
            return arg
        v = hp[arg]
        return v[pname] if isinstance(v, dict) else v

    def for_horizon(self, steps: int) -> Optimizer:
        """This optimizer for an inner problem of ``steps`` updates (the problem calls it). Most
        updates do not depend on the horizon: ``self``. One whose last update differs (schedule-
        free AdamW returns its averaged point there) returns a copy that knows ``steps``."""
        return self

    # -- the pure functions ----------------------------------------------------------------------
    @abc.abstractmethod
    def init(self, params: Params) -> NamedTuple:
        """Initial state for ``params`` (as ``torch.optim`` before its first step)."""

    @abc.abstractmethod
    def update(self, grads: Params, state: NamedTuple, params: Params, hp: Mapping[str, Any],
               step: int) -> tuple[Params, NamedTuple]:
        """One step. ``step`` is the 0-based index of this update."""

    def tangent(self, ctx: TangentContext, new_params: Params, new_state: NamedTuple
                ) -> tuple[Params, NamedTuple] | None:
        """The update's tangent in closed form, ``(Z_params, Z_state)`` with a leading axis of
        ``K'`` columns, given the update's result; ``None``: no closed form (forward mode then
        derives the tangent)."""
        return None

    def penalty(self, params: Params, hp: Mapping[str, Any]) -> Tensor | None:
        """The term the update adds to the objective it minimises, as a function of the
        parameters (``None``: nothing). A fixed point of the update is a stationary point of
        ``L_train + penalty``. By default the L2 term ``sum wd ||w||^2 / 2`` of each of
        :attr:`stationary_args` (weight decays added to the gradient: SGD, Adam, RMSprop,
        Adagrad); override for another kind of term."""
        terms = [t for arg in self.stationary_args
                 if (t := l2_penalty(self, arg, params, hp)) is not None]
        if not terms:
            return None
        return terms[0] if len(terms) == 1 else torch.stack(terms).sum()

    def to_torch(self, params: list[Tensor], hp: Mapping[str, Any] | None = None
                 ) -> torch.optim.Optimizer:
        """The equivalent ``torch.optim`` optimizer with hyperparameters read once from ``hp``."""
        raise NotImplementedError(f"{type(self).__name__}.to_torch: no torch.optim twin.")

    def _value(self, arg: Arg, hp: Mapping[str, Any] | None) -> float:
        """A constant, or a scalar hyperparameter read from ``hp`` (for :meth:`to_torch`)."""
        if isinstance(arg, PerParam):
            raise NotImplementedError(
                f"{type(self).__name__}.to_torch: {arg!r} is a value per parameter, which "
                f"needs a parameter group each: build it with at_param(name) per parameter "
                f"(hypergrad.export.learned_optimizer does).")
        v = (hp or {})[arg] if isinstance(arg, str) else arg
        if isinstance(v, dict):
            raise NotImplementedError(
                f"{type(self).__name__}.to_torch: per-tensor hyperparameters need param "
                f"groups; read them yourself."
            )
        return float(v)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.name}({args})"


# -- the registry --------------------------------------------------------------------------------
ENTRY_POINTS = "hypergrad.optimizers"
"""The entry-point group under which installed packages declare optimizer factories by name."""

Factory = Callable[..., Optimizer]
_FACTORIES: dict[str, Factory] = {}


def same_definition(old: Any, new: Any) -> bool:
    """Whether ``new`` is ``old`` defined again: the same qualified name in the same module (a
    reloaded module), or in a script run as ``__main__`` and imported by its name too. Only
    the qualified name was compared: a user's ``class ForwardMode(Method, name="forward")``
    or ``def sgd`` replaced the built-in with no word, and two modules' ``Mine`` the other."""
    if old.__qualname__ != new.__qualname__:
        return False
    mains = ("__main__", "__mp_main__")
    return (old.__module__ == new.__module__ or old.__module__ in mains
            or new.__module__ in mains)


def register(factory: Factory | None = None, *, name: str | None = None) -> Any:
    """Register an optimizer factory (a function ``(**arguments) -> Optimizer``, e.g.
    :func:`~hypergrad.optim.sgd`) under ``name`` (default: the function's name), so that
    :func:`create` and ``hypergrad-run inner_optimizer=<name>`` build it. Use as ``@register``
    or ``@register(name="mine")``."""
    def add(f: Factory) -> Factory:
        key = str(name or getattr(f, "__name__", ""))
        if not key.isidentifier():
            raise ValueError(f"optim.register: name {key!r} must be an identifier.")
        old = _FACTORIES.get(key)
        if old is not None and not same_definition(old, f):
            raise ValueError(f"optim.register: name {key!r} is taken by {old.__module__}."
                             f"{old.__qualname__}; choose another name for "
                             f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', f)}, "
                             f"e.g. @register(name='my_{key}').")
        _FACTORIES[key] = f
        return f

    return add if factory is None else add(factory)


def factory_defaults(factory: Factory, cls: type[Optimizer]) -> dict[str, Any]:
    """The defaults of ``factory``'s arguments that ``cls`` takes (its :attr:`Optimizer.args`):
    what :attr:`Optimizer.defaults` of a built-in class is."""
    import inspect

    keys = {*cls.hyper_args, *cls.pair_args, *cls.options}
    return {k: p.default for k, p in inspect.signature(factory).parameters.items()
            if k in keys and p.default is not inspect.Parameter.empty}


TORCH_FLAGS = ("foreach", "fused", "capturable", "differentiable", "maximize")
"""``torch.optim``'s switches that its optimizers take and hypergrad's factories do not: the
kernel choices (``foreach``, ``fused``, ``capturable``), ``differentiable`` (every update here
is) and ``maximize``. A factory wrapped by :func:`torch_flags` takes them at torch's defaults
(None or False, as a copied ``torch.optim`` call or config writes them) and says what to do
instead of True, where Python said only "unexpected keyword argument 'fused'"."""


def torch_flags(factory: Factory) -> Factory:
    """``factory`` taking :data:`TORCH_FLAGS` at torch's defaults (its signature unchanged)."""
    import functools

    @functools.wraps(factory)
    def made(*args: Any, **kwargs: Any) -> Optimizer:
        api = factory.__name__
        if api == "adam" and "decoupled_weight_decay" in kwargs:
            # torch.optim.Adam's switch to AdamW (torch >= 2.6): "unexpected keyword argument"
            # (the optimizer probe, 2026-12-08)
            val = kwargs.pop("decoupled_weight_decay")
            if flag(api, "decoupled_weight_decay", val):
                raise ValueError(f"adam: decoupled_weight_decay={val!r} is torch.optim.Adam's "
                                 f"switch to AdamW; use hypergrad.optim.adamw(...) (the same "
                                 f"arguments; hypergrad-run: inner_optimizer=adamw).")
        for key in TORCH_FLAGS:
            if key not in kwargs:
                continue
            val = kwargs.pop(key)
            if val is None or (key == "differentiable" and val is True):
                continue  # differentiable=True is what every update here is
            if not flag(api, key, val):
                continue
            fix = ("negate the objective instead (train_loss and val_loss return what to "
                   "minimise)" if key == "maximize" else
                   "drop the argument: hypergrad chooses its own kernels (foreach ones for plain "
                   "training on one device), the same numbers either way")
            raise ValueError(f"{api}: {key}={val!r} is a torch.optim switch hypergrad does not "
                             f"take; {fix}.")
        return factory(*args, **kwargs)

    return made


def registered() -> dict[str, Factory]:
    """``{name: factory}`` of the optimizers registered in this process and of the installed
    entry points of :data:`ENTRY_POINTS`."""
    from importlib import metadata

    for ep in metadata.entry_points(group=ENTRY_POINTS):
        if ep.name not in _FACTORIES:
            register(ep.load(), name=ep.name)
    return dict(_FACTORIES)


def create(name: str, **args: Any) -> Optimizer:
    """The optimizer ``name`` (registered, or an import path ``"pkg.module.factory"`` or
    ``"pkg.module:factory"``, as methods take) built with ``args``: ``create("sgd", lr="lr",
    momentum=0.9)``."""
    factories = registered() if name not in _FACTORIES else _FACTORIES
    if name in factories:
        return factories[name](**args)
    if "." in name or ":" in name:
        import importlib

        module, _, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
        try:
            return getattr(importlib.import_module(module), attr)(**args)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as err:
            raise ValueError(f"optim.create: cannot import {name!r} ({err}).") from err
    raise ValueError(f"optim.create: {name!r} is not a registered optimizer; registered are "
                     f"{sorted(factories)}. Register yours with @hypergrad.optim.register.")
