"""How forward mode gets the tangent of the optimizer's update: strategy objects.

``Z_t = dU/ds Z_{t-1} + dU/dg G_t + dU/dh dh_t/dlam`` for the update ``U`` of any
:class:`~hypergrad.optim.Optimizer`, all K columns at once. Three ways, equal to rounding (tested):

- :class:`ClosedForm`: the optimizer's own ``tangent`` (SGD, Adam, AdamW, RMSprop, Adagrad): a
  few fused multiply-adds per tensor over the K columns, no autograd.
- :class:`DiagonalJacobian`: for an ``elementwise`` optimizer, one reverse pass per output kind
  at the size of the parameters gives every coefficient of the diagonal Jacobian, then one
  multiply-add per term.
- :class:`JVP`: ``torch.func.jvp`` of ``update`` under ``vmap`` (any pure update).

:class:`AutoTangent` (the default of :class:`~hypergrad.ForwardMode`) takes the first that
applies. Each rule returns ``((params, opt_state), (Z_params, Z_opt_state))``: the primal update
always comes from the optimizer's ``update``. The hyperparameters' own term ``dU/dh dh_t/dlam``
is taken only for the columns the optimizer reads at this step (``cols``, at rows ``pos`` of the
columns computed), not for all K. ``experiments/benchmarks/bench_tangent.py`` times them.
"""

from __future__ import annotations

import abc
import copy
import weakref
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.func import jvp, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from .hyperparams import Schedule
from .optim.base import TangentContext
from .problem import InnerProblem, InnerState

__all__ = ["TangentRule", "UpdateStep", "ClosedForm", "DiagonalJacobian", "JVP", "AutoTangent"]

Result = tuple[tuple[Any, Any], tuple[Any, Any]]


class UpdateStep(NamedTuple):
    """What a tangent rule gets for the update of step ``t``.

    ``grads`` the gradient, ``state`` the :class:`~hypergrad.InnerState` before the step, ``G``
    the gradient's tangent and ``z`` the state's tangents (leading axis of the ``K'`` columns
    computed), ``cols`` the columns the optimizer reads at this step and ``pos`` their rows among
    the ``K'``, ``eye`` the identity of size K.
    """

    problem: InnerProblem
    t: int
    lam: Tensor
    grads: Any
    state: InnerState
    G: Any
    z: InnerState
    cols: list[int]
    pos: list[int]
    eye: Tensor


class TangentRule(abc.ABC):
    """How to get the update's tangent of a step: ``rule(step)`` with an :class:`UpdateStep`
    returns ``((params, opt), (Z_params, Z_opt))``, or ``None`` where the rule does not apply to
    this optimizer."""

    @abc.abstractmethod
    def __call__(self, step: UpdateStep) -> Result | None: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ClosedForm(TangentRule):
    """The optimizer's own closed-form ``tangent`` (``None`` where it has none)."""

    def __call__(self, step: UpdateStep) -> Result | None:
        problem, t, _, g, state, G, z, cols, pos, _ = step
        got = _hp_scalars(problem, t, step.lam, cols)
        if got is None:
            return None
        hp, dh = got
        opt = problem.optimizer
        new_p, new_o = opt.update(g, state.opt, state.params, hp, t)
        ctx = TangentContext(t, g, state.opt, state.params, G, z.opt, z.params, hp, dh, pos)
        tan = opt.tangent(ctx, new_p, new_o)
        return None if tan is None else ((new_p, new_o), tan)


class DiagonalJacobian(TangentRule):
    """The diagonal Jacobian of an ``elementwise`` optimizer's update (``None`` otherwise)."""

    def __call__(self, step: UpdateStep) -> Result | None:
        problem, t, lam, g, state, G, z, cols, pos, _ = step
        if not problem.optimizer.elementwise:
            return None
        return _diagonal(problem, t, lam, g, state.opt, state.params, G, z.opt, z.params, cols,
                         pos)


class JVP(TangentRule):
    """``torch.func.jvp`` of the update under ``vmap``: any pure update."""

    def __call__(self, step: UpdateStep) -> Result | None:
        return _jvp(*step)  # type: ignore[no-any-return]


class AutoTangent(TangentRule):
    """The first of ``rules`` that applies (default: closed form, diagonal Jacobian, ``jvp``)."""

    def __init__(self, rules: tuple[TangentRule, ...] | None = None) -> None:
        self.rules = rules if rules is not None else (ClosedForm(), DiagonalJacobian(), JVP())

    def __call__(self, step: UpdateStep) -> Result | None:
        for rule in self.rules:
            out = rule(step)
            if out is not None:
                return out
        return None


_HP_CACHE: weakref.WeakKeyDictionary[InnerProblem, tuple[Any, Any]] = (
    weakref.WeakKeyDictionary())


def _hp_scalars(problem: InnerProblem, t: int, lam: Tensor, cols: list[int]
                ) -> tuple[dict[str, Any], dict[int, Tensor]] | None:
    """The optimizer's hyperparameter values at step ``t`` (detached) and, for each value that
    depends on ``lam``, its derivative at the columns ``cols``: ``{id(value): d value / d
    lam[cols]}``. ``None`` when a value is not a scalar (a per-element hyperparameter): the
    caller then takes the general path.

    Within an inner run ``lam`` is one tensor and the values change only with a schedule's
    window: the last result is kept per problem and reused while the run, ``lam`` (the same
    tensor, not modified in place), the columns and every schedule's window are the same."""
    hps = problem.hyperparams
    windows = tuple(it.window(t, problem.steps) for it in hps.items if isinstance(it, Schedule))
    key = (id(lam), lam._version, problem.run_count, tuple(cols), windows)
    hit = _HP_CACHE.get(problem)
    if hit is not None and hit[0][0] == key and hit[0][1]() is lam:
        return hit[1]  # type: ignore[no-any-return]
    out = _hp_scalars_at(problem, t, lam, cols)
    _HP_CACHE[problem] = ((key, weakref.ref(lam)), out)
    return out


def _hp_scalars_at(problem: InnerProblem, t: int, lam: Tensor, cols: list[int]
                   ) -> tuple[dict[str, Any], dict[int, Tensor]] | None:
    with torch.enable_grad():
        lam_l = lam.detach().requires_grad_(bool(cols))
        vals = problem.hyperparams.values(lam_l, t, problem.steps)
        hp: dict[str, Any] = {}
        dh: dict[int, Tensor] = {}
        idx = torch.tensor(cols, device=lam.device) if cols else None
        for name in problem.optimizer.bound_names():
            v = vals[name]
            out: dict[str, Any] = {}
            for key, sc in (v.items() if isinstance(v, dict) else [("", v)]):
                if isinstance(sc, Tensor):
                    if sc.numel() != 1:
                        return None
                    d = sc.detach().reshape(())
                    if idx is not None and sc.requires_grad:
                        (grad,) = torch.autograd.grad(sc.reshape(()), lam_l, retain_graph=True)
                        dh[id(d)] = grad.index_select(0, idx)
                    sc = d
                out[key] = sc
            if isinstance(v, dict):  # keep its class (a PerTensor's default for the others)
                per = copy.copy(v)
                per.update(out)
                hp[name] = per
            else:
                hp[name] = out[""]
    return hp, dh



def _diagonal(problem: InnerProblem, t: int, lam: Tensor, g: Any, opt: Any,
              params: Any, G: Any, zo: Any, zp: Any, cols: list[int],
              pos: list[int]) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The update and its tangent for an elementwise optimizer, all columns at once:
    ``((params, opt), (Z_params, Z_opt))``.

    ``U`` maps each element independently, so its Jacobian is diagonal per input tensor: one
    reverse pass with a cotangent of ones per output kind (new parameters, each optimizer buffer)
    gives every coefficient ``c = dU_out / d in`` (a tensor of the parameter's shape, no K axis),
    for the hyperparameter values too, which are fed in per element. Then
    ``Z_out = sum_in c * Z_in`` (one multiply-add over the K columns per term) and, for the
    columns the optimizer reads at this step, ``+ c_h * dh/dlam``. Equal to ``jvp`` of ``U`` under
    ``vmap`` to rounding (tested), without its per-operation overhead (about 10 ms per step for a
    6-tensor model, more than a plain SGD step). The weight-decay tangent is two such terms:
    ``wd * Z`` inside ``c = dU/dw`` and ``(d wd / d lam) * w`` from ``c_wd``, elementwise, on
    ``wd``'s own columns only, never through the Hessian-vector product.
    """
    fields = list(opt._fields)
    ncol = next(iter(G.values())).shape[0]
    with torch.enable_grad():
        lam_l = lam.detach().requires_grad_(bool(cols))
        vals = problem.hyperparams.values(lam_l, t, problem.steps)
        hp: dict[str, Any] = dict(vals)
        h_leaves: list[tuple[str, Tensor, Tensor]] = []  # (param name, leaf, value it copies)
        for name in problem.optimizer.bound_names():
            v = vals[name]
            per: dict[str, Any] = {}
            for pname, p in params.items():
                sc = v[pname] if isinstance(v, dict) else v
                if isinstance(sc, Tensor):  # read per element, so its coefficient is a tensor
                    per[pname] = sc.detach().expand(p.shape).clone().requires_grad_()
                    h_leaves.append((pname, per[pname], sc))
                else:  # a PerTensor's constant default
                    per[pname] = sc
            hp[name] = per

        def leaf(v: Tensor) -> Tensor:
            return v.detach().requires_grad_()

        gl = {k: leaf(v) for k, v in g.items()}
        pl = {k: leaf(v) for k, v in params.items()}
        ol = type(opt)(*[{k: leaf(v) for k, v in getattr(opt, f).items()} for f in fields])
        new_p, new_o = problem.optimizer.update(gl, ol, pl, hp, t)
        # every input tensor with the tangent it carries: (param name, leaf, tangent)
        ins = [(n, gl[n], G[n]) for n in gl] + [(n, pl[n], zp[n]) for n in pl]
        ins += [(n, x, getattr(zo, f)[n]) for f in fields for n, x in getattr(ol, f).items()]
        dh: dict[int, Tensor] = {}  # id(value) -> dvalue/dlam at the columns read
        if cols:
            idx = torch.tensor(cols, device=lam.device)
            for _, _, sc in h_leaves:
                if sc.requires_grad and id(sc) not in dh:
                    (d,) = torch.autograd.grad(sc, lam_l, retain_graph=True)
                    dh[id(sc)] = d.index_select(0, idx)
        all_leaves = [x for _, x, _ in ins] + [x for _, x, _ in h_leaves]
        results = []
        for out in [new_p, *[getattr(new_o, f) for f in fields]]:
            names = [n for n, y in out.items() if y.requires_grad]
            res = {n: y.new_zeros((ncol, *y.shape)) for n, y in out.items()
                   if not y.requires_grad}  # a constant output: zero tangent
            if names:
                cs = torch.autograd.grad([out[n] for n in names], all_leaves,
                                         [torch.ones_like(out[n]) for n in names],
                                         retain_graph=True, allow_unused=True)
                for (n, _, z), c in zip(ins, cs):
                    if c is None:
                        continue
                    if n in res:
                        res[n].addcmul_(z, c)
                    else:
                        res[n] = z * c
                for n in names:
                    if n not in res:  # depends on the hyperparameters only
                        res[n] = out[n].new_zeros((ncol, *out[n].shape))
                for (n, _, sc), c in zip(h_leaves, cs[len(ins):]):
                    if c is not None and id(sc) in dh:
                        for j, r in enumerate(pos):
                            res[n][r].add_(c * dh[id(sc)][j])
            results.append({n: res[n].detach() for n in out})
    # the primal update comes out of the same pass (the values equal problem.update's bit for
    # bit: the same elementwise operations, with the scalars broadcast)
    primal = ({n: v.detach() for n, v in new_p.items()},
              type(opt)(*[{n: v.detach() for n, v in getattr(new_o, f).items()} for f in fields]))
    return primal, (results[0], type(opt)(*results[1:]))


def _jvp(problem: InnerProblem, t: int, lam: Tensor, g: Any, s: InnerState, G: Any,
         z_in: InnerState, cols: list[int], pos: list[int], eye: Tensor) -> Any:
    """The update's tangent by ``jvp`` under ``vmap`` (any pure update): the state term with
    the hyperparameters held fixed, then their own term for the columns read at step t."""
    def update_state(g_: Any, opt: Any, p: Any) -> Any:
        return problem.update(g_, opt, p, lam, t)

    def column(zg: Any, zo: Any, zp: Any) -> Any:
        return jvp(update_state, (g, s.opt, s.params), (zg, zo, zp))

    (params, opt), (zp, zo) = vmap(column, out_dims=(None, 0))(  # type: ignore[arg-type]
        G, z_in.opt, z_in.params)
    if cols:
        idx = torch.tensor(cols, device=lam.device)

        def update_hp(lm: Tensor) -> Any:
            return problem.update(g, s.opt, s.params, lm, t)

        direct = vmap(lambda e: jvp(update_hp, (lam,), (e,))[1])(eye.index_select(0, idx))
        zp, zo = _add_rows((zp, zo), pos, direct, (G, z_in))
    return (params, opt), (zp, zo)


def _add_rows(tree: Any, pos: list[int], rows: Any, inputs: Any) -> Any:
    """``tree[pos] += rows`` leafwise (few rows: one in-place add each); in place where the leaf
    owns its memory and is none of ``inputs`` (an update may pass a tangent through)."""
    leaves, spec = tree_flatten(tree)
    # under a FakeTensorMode (estimate_memory) a data pointer is deprecated (a UserWarning,
    # an error under -W error): a copy there allocates nothing
    taken = {x.untyped_storage().data_ptr() for x in tree_flatten(inputs)[0] if not is_fake(x)}
    out = []
    for v, r in zip(leaves, tree_flatten(rows)[0]):
        if is_fake(v) or not (v.is_contiguous() and v._base is None
                              and v.untyped_storage().data_ptr() not in taken):
            v = v.clone()
        for i, p in enumerate(pos):
            v[p].add_(r[i])
        out.append(v)
    return tree_unflatten(out, spec)


