"""Forward mode (Franceschi et al. 2017, RTHO/forward HO): carry ``Z_t = d s_t / d lam``.

Per step, with all K columns at once:

- ``G_t = H_t Z^w_{t-1} + (d^2 L / dw dlam) I_K`` from the HVP strategy (one gradient, one batched
  call per chunk of columns);
- ``Z_t = dU/ds Z_{t-1} + dU/dg G_t + dU/dh dh_t/dlam``, the tangent of the optimizer's pure
  update: for SGD (momentum, dampening, Nesterov, weight decay) and Adam/AdamW (bias
  corrections, eps, L2 or decoupled weight decay) in closed form, a few fused multiply-adds per
  tensor over the K columns, no autograd (:func:`_sgd_tangent`, :func:`_adam_tangent`); for
  another elementwise update (or a per-element optimizer hyperparameter), by automatic
  differentiation of its diagonal Jacobian (one reverse pass per output kind at the size of the
  parameters, then one multiply-add per term); for any other update, ``torch.func.jvp`` under
  ``vmap``. All are tested equal to ``jvp``; ``experiments/benchmarks/bench_tangent.py`` times
  them;
- at any step, ``dE/dlam = sum <Z_T, dE/ds_T> + dE/dlam|direct``.

Memory is ``O(K |s|)``, independent of ``T``.

Work the step does not do, because its result is known exactly:

- columns of :class:`~hypergrad.Schedule` windows that have not started: no step so far has read
  them, so their tangents are exactly zero and this step cannot change them. They get no
  Hessian-vector product and no update tangent, and stay zero (an 8-window schedule computes
  4.5 of its 8 columns on average). A column whose tangent is not zero (a user-made state) is
  never skipped.
- ``dU/dh dh_t/dlam``, the hyperparameters' own term of the update, is taken only for the
  columns the optimizer reads at this step (its bound hyperparameters; one window of a
  schedule), not for all K. For weight decay that term is ``(d wd / d lam) * w`` and the state
  term is ``wd * Z``: both elementwise, neither through the Hessian-vector product.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.func import grad_and_value, jvp, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .hvp import HVPStrategy, VmapVJP
from .hyperparams import Schedule
from .method import HyperGradient, Method
from .optim import _const_zero, _is_zero, safe_sqrt
from .problem import InnerProblem, InnerState
from .randomness import second_order

__all__ = ["ForwardMode", "ForwardState"]


class ForwardState(NamedTuple):
    """The inner state, its tangents (each tensor with a leading axis of size K) and the index of
    the next step."""

    state: InnerState
    tangents: InnerState
    step: int


class _Plan:
    """Which raw columns a problem's step ``t`` reads, from the hyperparameters' structure.

    ``first_read[c]``: the first step that reads column ``c`` (schedule windows start late; every
    other kind is read from step 0); ``T`` for a window no step reads. ``optimizer_columns(t)``:
    the columns the optimizer's update reads at step ``t``.
    """

    def __init__(self, problem: InnerProblem) -> None:
        hps, horizon = problem.hyperparams, problem.steps
        self.k = hps.num_raw
        self.horizon = horizon
        self.first_read = [0] * self.k
        for item, sl in zip(hps.items, hps.slices.values()):
            if isinstance(item, Schedule):
                self.first_read[sl] = [_first_step(item, w, horizon)
                                       for w in range(item.windows)]
        self._opt_static: list[int] = []
        self._opt_sched: list[tuple[Schedule, int]] = []
        for name in problem.optimizer.bound_names():
            item, sl = hps.by_name[name], hps.slices[name]
            if isinstance(item, Schedule):
                self._opt_sched.append((item, sl.start))
            else:
                self._opt_static.extend(range(sl.start, sl.stop))
        self.has_late = any(f > 0 for f in self.first_read)

    def not_started(self, t: int) -> list[int]:
        """Columns no step before or at ``t`` reads."""
        if not self.has_late:
            return []
        return [c for c, f in enumerate(self.first_read) if f > t]

    def optimizer_columns(self, t: int) -> list[int]:
        cols = set(self._opt_static)
        cols.update(start + item.window(t, self.horizon) for item, start in self._opt_sched)
        return sorted(cols)


def _first_step(item: Schedule, w: int, horizon: int) -> int:
    """The first step that reads window ``w`` (``horizon`` if none does). Windows do not
    decrease with the step, so it is the first step whose window is at least ``w``."""
    t = -(-w * horizon // item.windows)  # ceil(w T / W)
    return t if t < horizon and item.window(t, horizon) == w else horizon


def _zero_columns(z: InnerState, cols: list[int]) -> bool:
    """Whether the tangent columns ``cols`` are exactly zero in every state tensor."""
    idx = None
    for v in tree_flatten(z)[0]:
        if idx is None:
            idx = torch.tensor(cols, device=v.device)
        if v.index_select(0, idx).any():
            return False
    return True


def _rows(tree: Any, idx: Tensor) -> Any:
    """Rows ``idx`` of every leaf (views when ``idx`` is a prefix ``0..n-1``)."""
    n = idx.numel()
    if n and int(idx[-1]) == n - 1:  # sorted and unique, so a prefix
        return tree_map(lambda v: v[:n], tree)
    return tree_map(lambda v: v.index_select(0, idx), tree)


def _scatter(tree: Any, idx: Tensor, k: int) -> Any:
    """Rows ``idx`` of a zero tree with leading axis ``k`` set to ``tree``."""
    n = idx.numel()
    prefix = bool(n) and int(idx[-1]) == n - 1

    def one(v: Tensor) -> Tensor:
        if prefix:
            out = v.new_empty((k, *v.shape[1:]))
            out[:n] = v
            out[n:] = 0
            return out
        return v.new_zeros((k, *v.shape[1:])).index_copy_(0, idx, v)

    return tree_map(one, tree)


def _add_rows(tree: Any, pos: list[int], rows: Any, inputs: Any) -> Any:
    """``tree[pos] += rows`` leafwise (few rows: one in-place add each); in place where the leaf
    owns its memory and is none of ``inputs`` (an update may pass a tangent through)."""
    leaves, spec = tree_flatten(tree)
    taken = {x.untyped_storage().data_ptr() for x in tree_flatten(inputs)[0]}
    out = []
    for v, r in zip(leaves, tree_flatten(rows)[0]):
        if not (v.is_contiguous() and v._base is None
                and v.untyped_storage().data_ptr() not in taken):
            v = v.clone()
        for i, p in enumerate(pos):
            v[p].add_(r[i])
        out.append(v)
    return tree_unflatten(out, spec)


_ELEMENTWISE = frozenset({"sgd", "adam", "adamw"})
"""Optimizers whose update is elementwise: every output element depends on the same element of
each input (and on scalar hyperparameters). Their tangent rule is a diagonal linear map."""


def _hp_scalars(problem: InnerProblem, t: int, lam: Tensor, cols: list[int]
                ) -> tuple[dict[str, Any], dict[int, Tensor]] | None:
    """The optimizer's hyperparameter values at step ``t`` (detached) and, for each value that
    depends on ``lam``, its derivative at the columns ``cols``: ``{id(value): d value / d
    lam[cols]}``. ``None`` when a value is not a scalar (a per-element hyperparameter): the
    caller then takes the general path."""
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


def _fma(a: Tensor, b: Tensor, s: Any, inplace: bool) -> Tensor:
    """``a + s * b`` (``s`` a number or a 0-d tensor), in ``a``'s memory when ``inplace``."""
    if isinstance(s, Tensor):
        return a.addcmul_(b, s) if inplace else torch.addcmul(a, b, s)
    return a.add_(b, alpha=s) if inplace else torch.add(a, b, alpha=s)


def _hp_derivative(dh: dict[int, Tensor], coef: Any) -> Tensor | None:
    """``d coef / d lam`` at the columns read, from :func:`_hp_scalars`' ``dh`` (``None``: a
    constant)."""
    return dh.get(id(coef)) if isinstance(coef, Tensor) else None


def _add_direct(z: Tensor, pos: list[int], d: Tensor | None, x: Tensor | Callable[[], Tensor],
                sign: float = 1.0) -> None:
    """A hyperparameter's own term of a closed-form tangent: ``z[pos_j] += sign * d[j] x`` for
    the columns read; nothing when ``d`` is ``None``. ``x`` may be a callable, evaluated only
    then (the step does not pay for terms of constant hyperparameters)."""
    if d is None:
        return
    xv = x() if callable(x) else x
    for j, r in enumerate(pos):
        z[r].addcmul_(xv, sign * d[j])


def _sgd_tangent(problem: InnerProblem, t: int, lam: Tensor, g: Any, opt: Any, params: Any,
                 G: Any, zo: Any, zp: Any, cols: list[int], pos: list[int]
                 ) -> tuple[tuple[Any, Any], tuple[Any, Any]] | None:
    """SGD's update and its tangent in closed form, all columns at once (no autograd), the
    weight-decay term included, as ``((params, opt), (Z_params, Z_opt))``. With
    ``d = g + wd w``, ``buf = mom buf + (1 - damp) d`` (``d`` at step 0), ``s = d + mom buf``
    (Nesterov) or ``buf``, ``w' = w - lr s``::

        Z_d = G + wd Z_w (+ dwd w)        Z_buf = mom Z_buf + (1 - damp) Z_d (+ dmom buf - ddamp d)
        Z_s = Z_d + mom Z_buf (+ dmom buf')   Z_w' = Z_w - lr Z_s (- dlr s)

    the bracketed terms only on the rows of the columns the optimizer reads (``pos``). Three
    fused multiply-adds over the K columns for momentum with weight decay, written into ``G``'s
    memory where the result is new (``G`` belongs to this step). Tested equal to ``jvp`` of
    :meth:`Optimizer.update` under ``vmap``; the update itself comes from the same operations
    as :meth:`Optimizer.update`'s, bit for bit (tested). ``None`` when a hyperparameter is not a
    scalar."""
    got = _hp_scalars(problem, t, lam, cols)
    if got is None:
        return None
    hp, dh = got
    a = problem.optimizer.args
    read = problem.optimizer._read

    def direct(z: Tensor, coef: Any, x: Tensor, sign: float = 1.0) -> None:
        """``z[pos_j] += sign * (d coef / d lam_j) x`` for the columns read."""
        _add_direct(z, pos, _hp_derivative(dh, coef), x, sign)

    has_wd, has_mom = not _is_zero(a["weight_decay"]), not _is_zero(a["momentum"])
    new_w, new_buf, new_zp, new_zb = {}, {}, {}, {}
    for k, w in params.items():
        zd = _owned(G[k])  # this step's own tensor: updated in place
        d = g[k]
        if has_wd:
            wd = read(a["weight_decay"], hp, k)
            zd = _fma(zd, zp[k], wd, inplace=True)
            direct(zd, wd, w)
            d = d + wd * w
        s_primal, zs = d, zd
        if has_mom:
            mom = read(a["momentum"], hp, k)
            if t == 0:
                buf, zbuf = d, zd
            else:
                damp = read(a["dampening"], hp, k)
                b_prev = opt.momentum_buffer[k]
                nest = a["nesterov"]
                zd_scaled = zd if not isinstance(damp, Tensor) and _is_zero(damp) else (
                    zd.mul_(1 - damp) if not nest else zd * (1 - damp))
                zbuf = _fma(zd_scaled, zo.momentum_buffer[k], mom,
                            inplace=not nest or zd_scaled is not zd)
                buf = mom * b_prev + (d if _const_zero(damp) else (1 - damp) * d)
                direct(zbuf, mom, b_prev)
                direct(zbuf, damp, d, -1.0)
            new_buf[k], new_zb[k] = buf, zbuf
            if a["nesterov"]:
                s_primal = d + mom * buf
                zs = _fma(zd if zbuf is not zd else zd.clone(), zbuf, mom, inplace=True)
                direct(zs, mom, buf)
            else:
                s_primal, zs = buf, zbuf
        lr = read(a["lr"], hp, k)
        zw = _fma(zp[k], zs, -lr, inplace=False)
        direct(zw, lr, s_primal, -1.0)
        new_w[k], new_zp[k] = w - lr * s_primal, zw
    return (new_w, type(opt)(new_buf)), (new_zp, type(opt)(new_zb))


def _owned(x: Tensor) -> Tensor:
    """``x`` if it may be written in place (contiguous, alone in its storage), else a copy."""
    whole = x.untyped_storage().nbytes() == x.numel() * x.element_size()
    return x if x.is_contiguous() and whole else x.clone()


def _elementwise_tangent(problem: InnerProblem, t: int, lam: Tensor, g: Any, opt: Any,
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


def _adam_tangent(problem: InnerProblem, t: int, lam: Tensor, g: Any, opt: Any, params: Any,
                  G: Any, zo: Any, zp: Any, cols: list[int], pos: list[int]
                  ) -> tuple[tuple[Any, Any], tuple[Any, Any]] | None:
    """Adam's and AdamW's update and its tangent in closed form, all columns at once (no
    autograd), as ``((params, opt), (Z_params, Z_opt))``. With ``d = g + wd w`` (Adam's L2) or
    ``w <- (1 - lr wd) w`` first (AdamW), ``m = m + (1 - b1)(d - m)``,
    ``v = b2 v + (1 - b2) d^2``, ``s = sqrt(v)``, ``den = s / c2 + eps`` (``c2 = sqrt(1 - b2^n)``,
    ``c1 = 1 - b1^n``, ``n = t + 1``), ``w' = w - (lr / c1) m / den``::

        Z_d = G + wd Z_w                         Z_m = lerp(Z_m, Z_d, 1 - b1)
        Z_v = b2 Z_v + 2 (1 - b2) d Z_d          Z_w' = Z_w - (lr / c1) / den Z_m
                                                        + (lr / c1) m / den^2 / (2 s c2) Z_v

    (``1 / (2 s)`` taken as 0 where ``s = 0``, as :func:`~hypergrad.optim.safe_sqrt` does), plus
    the hyperparameters' own terms (``lr``, ``b1``, ``b2`` through the bias corrections too,
    ``eps``, ``wd``) on the rows of the columns the optimizer reads (``pos``). Per tensor: six
    multiply-adds over the K columns. Tested equal to ``jvp`` of :meth:`Optimizer.update` under
    ``vmap``; the update is :meth:`Optimizer.update`'s, bit for bit (tested). ``None`` when a
    hyperparameter is not a scalar."""
    got = _hp_scalars(problem, t, lam, cols)
    if got is None:
        return None
    hp, dh = got
    a = problem.optimizer.args
    read = problem.optimizer._read
    n = t + 1
    decoupled = problem.optimizer.name == "adamw"
    has_wd = not _is_zero(a["weight_decay"])

    def dv(coef: Any) -> Tensor | None:
        return _hp_derivative(dh, coef)

    def lin(*terms: tuple[Any, Tensor | None]) -> Tensor | None:
        """``sum c * dv`` over the terms whose ``dv`` is not ``None``."""
        out = [c * d for c, d in terms if d is not None]
        return None if not out else out[0] if len(out) == 1 else torch.stack(out).sum(0)

    def direct(z: Tensor, d: Tensor | None, x: Tensor | Callable[[], Tensor]) -> None:
        _add_direct(z, pos, d, x)

    new_p, new_m, new_v, new_zp, new_zm, new_zv = {}, {}, {}, {}, {}, {}
    for k, w in params.items():
        d, zd, zw = g[k], G[k], zp[k]
        lr, b1, b2 = read(a["lr"], hp, k), read(a["betas"][0], hp, k), read(a["betas"][1], hp, k)
        eps = read(a["eps"], hp, k)
        dlr, db1, db2 = dv(lr), dv(b1), dv(b2)
        if has_wd:
            wd = read(a["weight_decay"], hp, k)
            if decoupled:
                zw = zw * (1 - lr * wd)
                direct(zw, lin((-wd, dlr), (-lr, dv(wd))), w)
                w = w * (1 - lr * wd)
            else:
                zd = _fma(_owned(zd), zw, wd, inplace=True)
                direct(zd, dv(wd), w)
                d = d + wd * w
        m_prev, v_prev = opt.exp_avg[k], opt.exp_avg_sq[k]
        m = m_prev + (1 - b1) * (d - m_prev)
        v = b2 * v_prev + (1 - b2) * d * d
        zm = torch.lerp(zo.exp_avg[k], zd, 1 - b1)
        direct(zm, db1, lambda: m_prev - d)
        zv = zo.exp_avg_sq[k] * b2
        zv.addcmul_(zd, 2 * (1 - b2) * d)
        direct(zv, db2, lambda: v_prev - d * d)
        c1 = 1 - b1**n
        c2 = (1 - b2**n) ** 0.5
        root = safe_sqrt(v, a["eps_root"])
        den = root / c2 + eps
        ratio = m / den
        new_p[k] = w - (lr / c1) * ratio
        # the tangent of w - (lr / c1) m / den
        step_den = (lr / c1) * ratio / den  # d w' / d den
        inv2s = torch.where(root > 0, 0.5 / torch.where(root > 0, root, 1.0), 0.0)
        zn = torch.addcmul(zw, zm, -(lr / c1) / den)
        zn.addcmul_(zv, step_den * inv2s / c2)
        dc1 = lin((-n * b1 ** (n - 1), db1))  # d c1
        dc2 = lin((-0.5 * n * b2 ** (n - 1) / c2, db2))  # d c2
        direct(zn, lin((-1 / c1, dlr), (lr / c1**2, dc1)), ratio)
        direct(zn, dv(eps), step_den)
        direct(zn, dc2, lambda: -step_den * root / c2**2)
        new_m[k], new_v[k], new_zp[k], new_zm[k], new_zv[k] = m, v, zn, zm, zv
    return (new_p, type(opt)(new_m, new_v)), (new_zp, type(opt)(new_zm, new_zv))


_CLOSED_FORM = {"sgd": _sgd_tangent, "adam": _adam_tangent, "adamw": _adam_tangent}
"""Optimizers with a closed-form tangent (tried first; ``None`` falls back to the general
elementwise path)."""


class ForwardMode(Method):
    """Forward-mode hypergradients.

    Args:
        hvp: how to compute the K Hessian-vector products of a step (default :class:`VmapVJP`,
            chunked from its memory budget).
        skip_zero_columns: skip the columns of schedule windows that have not started (exactly
            zero; see the module docstring). ``False`` computes all K columns at every step
            (the dense reference; results are equal).

    Example:
        >>> fm = ForwardMode()
        >>> hg = fm.hypergradient(problem, problem.init_raw())  # doctest: +SKIP
        >>> # or step by step, with the hypergradient available at any step:
        >>> fs = fm.init(problem, lam); fs = fm.step(problem, fs, lam)  # doctest: +SKIP
        >>> E, dE = fm.hypergradient_at(problem, fs, lam)  # doctest: +SKIP
    """

    name = "forward"

    def __init__(self, hvp: HVPStrategy | None = None, *, skip_zero_columns: bool = True) -> None:
        if hvp is not None and not isinstance(hvp, HVPStrategy):
            raise TypeError(f"ForwardMode: hvp must be an HVPStrategy such as VmapVJP(), got "
                            f"{type(hvp).__name__}.")
        self.hvp = hvp if hvp is not None else VmapVJP()
        self.skip_zero_columns = bool(skip_zero_columns)
        self._plans: weakref.WeakKeyDictionary[InnerProblem, _Plan] = (
            weakref.WeakKeyDictionary())
        self._zero_memo: tuple[weakref.ref[Tensor], frozenset[int]] | None = None

    def _plan(self, problem: InnerProblem) -> _Plan:
        plan = self._plans.get(problem)
        if plan is None or plan.k != problem.num_hyperparams or plan.horizon != problem.steps:
            plan = self._plans[problem] = _Plan(problem)
        return plan

    def init(self, problem: InnerProblem, lam: Tensor,
             state: InnerState | None = None) -> ForwardState:
        """Start at ``state`` (default: the initial state) with zero tangents, ``Z_0 = 0``."""
        problem.check(lam)
        s = problem.initial_state() if state is None else state
        k = problem.num_hyperparams
        z = tree_map(lambda v: torch.zeros((k, *v.shape), dtype=v.dtype, device=v.device), s)
        return ForwardState(s, z, 0)

    def step(self, problem: InnerProblem, fs: ForwardState, lam: Tensor) -> ForwardState:
        """One inner step of the state and of all K tangent columns."""
        t = fs.step
        s, z = fs.state, fs.tangents
        batch = problem.batch(t)
        k = lam.shape[0]
        plan = self._plan(problem)
        eye = torch.eye(k, dtype=lam.dtype, device=lam.device)

        # columns whose tangent is zero and that this step cannot change: not computed
        live: Tensor | None = None
        if self.skip_zero_columns:
            late = plan.not_started(t)
            if late and (self._known_zero(z, late) or _zero_columns(z, late)):
                late_set = set(late)
                live = torch.tensor([c for c in range(k) if c not in late_set],
                                    device=lam.device)
        if live is not None:
            z_in, eye_in = _rows(z, live), eye.index_select(0, live)
        else:
            z_in, eye_in = z, eye

        def loss(p: Any, b: Any, lm: Tensor) -> Any:
            return problem.train_objective(p, b, lm, t, batch)

        with second_order():  # attention through a kernel with a double backward
            g, new_b, G, zb = self.hvp(loss, s.params, s.buffers, lam, z_in.params,
                                       z_in.buffers, eye_in)

        cols = plan.optimizer_columns(t)
        pos = cols
        if live is not None:  # positions of the optimizer's columns among the live ones
            pos_of = {int(c): i for i, c in enumerate(live.tolist())}
            pos = [pos_of[c] for c in cols]
        closed = None
        if problem.optimizer.name in _CLOSED_FORM:
            closed = _CLOSED_FORM[problem.optimizer.name](
                problem, t, lam, g, s.opt, s.params, G, z_in.opt, z_in.params, cols, pos)
        if closed is not None:
            (params, opt), (zp, zo) = closed
        elif problem.optimizer.name in _ELEMENTWISE:
            (params, opt), (zp, zo) = _elementwise_tangent(
                problem, t, lam, g, s.opt, s.params, G, z_in.opt, z_in.params, cols, pos)
        else:
            params, opt, zp, zo = self._jvp_tangent(problem, t, lam, g, s, G, z_in, cols, pos,
                                                   eye)
        tangents = InnerState(zp, zb, zo)
        if live is not None:
            tangents = _scatter(tangents, live, k)
            dead = frozenset(range(k)) - frozenset(live.tolist())
            self._zero_memo = (weakref.ref(tree_flatten(tangents)[0][0]), dead)
        return ForwardState(InnerState(params, new_b, opt), tangents, t + 1)

    def _known_zero(self, z: InnerState, cols: list[int]) -> bool:
        """Whether ``z`` is the tangent state the last step returned with ``cols`` left at zero
        (then the check over the tensors is not needed)."""
        if self._zero_memo is None:
            return False
        ref, dead = self._zero_memo
        first = tree_flatten(z)[0]
        return bool(first) and ref() is first[0] and dead.issuperset(cols)

    @staticmethod
    def _jvp_tangent(problem: InnerProblem, t: int, lam: Tensor, g: Any, s: InnerState, G: Any,
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
        return params, opt, zp, zo

    def run(self, problem: InnerProblem, fs: ForwardState, lam: Tensor,
            stop: int | None = None) -> ForwardState:
        """Steps until ``stop`` (default: the horizon ``T``)."""
        for _ in range(fs.step, problem.steps if stop is None else stop):
            fs = self.step(problem, fs, lam)
        return fs

    @staticmethod
    def hypergradient_at(problem: InnerProblem, fs: ForwardState,
                         lam: Tensor) -> tuple[Tensor, Tensor]:
        """``(E, dE/dlam)`` at the current step: ``Z^T grad_s E + dE/dlam|direct``."""
        s, z = fs.state, fs.tangents
        (dp, db, direct), value = grad_and_value(problem.objective, argnums=(0, 1, 2))(
            s.params, s.buffers, lam)
        hg = direct.clone()
        for zs, ds in ((z.params, dp), (z.buffers, db)):
            for name, d in ds.items():
                hg = hg + zs[name].reshape(hg.shape[0], -1) @ d.reshape(-1)
        return value.detach(), hg.detach()

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        fs = self.run(problem, self.init(problem, lam), lam)
        value, hg = self.hypergradient_at(problem, fs, lam)
        return HyperGradient(value, hg, fs.state)

    def __repr__(self) -> str:
        return f"ForwardMode(hvp={self.hvp!r})"
