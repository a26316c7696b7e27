"""Batched Hessian-vector products: the tangent of the gradient, all K columns at once.

Given ``f(w, b, lam) -> (L, new_b)`` (training loss and BatchNorm statistics), a strategy returns

- ``g = grad_w L`` and ``new_b`` at the primal point (computed once);
- ``G[k] = H_ww Z^w[k] + H_wb Z^b[k] + H_wlam e_k`` for every column k: the tangent of the gradient
  ``G_t = H_t Z_{t-1} + (d^2 L / dw dlam) I_K`` (Franceschi et al. 2017, eq. 11-14);
- ``Z^b_new[k]``, the tangent of ``new_b`` (only when the model has BatchNorm statistics).

Reverse-over-reverse strategies get ``G`` as the ``w`` block of the joint Hessian of ``L`` in
``(w, b, lam)`` applied to ``(Z^w, Z^b, e_k)``: symmetric, so one vector-Jacobian product of the
full gradient gives it. Strategies (all equal to rounding; the loop is the seed's baseline):

- :class:`VmapVJP` (default): ``torch.func.vmap`` over ``torch.func.vjp`` of the gradient.
- :class:`BatchedAutograd`: ``torch.autograd.grad(..., is_grads_batched=True)`` (legacy vmap).
- :class:`ForwardOverReverse`: ``vmap(jvp(grad))``.
- :class:`ColumnLoop`: one ``torch.autograd.grad`` per column.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.func import grad, jvp, vjp, vmap

__all__ = ["HVPStrategy", "VmapVJP", "BatchedAutograd", "ForwardOverReverse", "ColumnLoop",
           "STRATEGIES"]

Dict = dict[str, Tensor]
LossFn = Callable[[Dict, Dict, Tensor], tuple[Tensor, Dict]]
HVPResult = tuple[Dict, Dict, Dict, Dict]  # g, new_b, G, Zb_new


def _check_chunk(api: str, chunk_size: int | None) -> int | None:
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or chunk_size < 1):
        raise ValueError(f"{api}: chunk_size={chunk_size!r} must be None (all columns at once) "
                         f"or an int >= 1.")
    return chunk_size


def _chunks(k: int, chunk_size: int | None) -> list[slice]:
    c = k if chunk_size is None else min(chunk_size, k)
    return [slice(i, min(i + c, k)) for i in range(0, k, c)]


def _cat(parts: list[Dict]) -> Dict:
    if len(parts) == 1:
        return parts[0]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _take(d: Dict, s: slice) -> Dict:
    return {k: v[s] for k, v in d.items()}


class HVPStrategy(abc.ABC):
    """How to compute the K Hessian-vector products of one step.

    Args:
        chunk_size: columns per batched call (``None``: all K at once). Memory of a batched call
            grows with the columns it holds; results do not depend on the chunking.
    """

    name: str = "abstract"

    def __init__(self, chunk_size: int | None = None) -> None:
        self.chunk_size = _check_chunk(type(self).__name__, chunk_size)

    @abc.abstractmethod
    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        """Args: ``zp[name]`` has shape ``(K, *param.shape)``, ``zb`` likewise for buffers,
        ``eye`` is the ``(K, K)`` identity (the tangent of ``lam``).
        Returns ``(g, new_b, G, Zb_new)`` with ``G[name]`` of shape ``(K, *param.shape)``."""

    def _buffer_tangents(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict,
                         zb: Dict, eye: Tensor) -> Dict:
        # Running statistics are not a gradient, so no symmetry trick: a batched forward-mode
        # pass over the model (only for models with BatchNorm).
        if not buffers:
            return {}

        def col(zp_: Dict, zb_: Dict, e: Tensor) -> Dict:
            return jvp(lambda p, b, lm: f(p, b, lm)[1], (params, buffers, lam), (zp_, zb_, e))[1]

        return _cat([vmap(col)(_take(zp, s), _take(zb, s), eye[s])
                     for s in _chunks(eye.shape[0], self.chunk_size)])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(chunk_size={self.chunk_size})"


class VmapVJP(HVPStrategy):
    """Functional reverse-over-reverse: ``vmap(vjp_fn)`` of ``vjp(grad f)``; one gradient forward,
    one batched backward per chunk. The fastest eager strategy measured (DESIGN.md)."""

    name = "vmap_vjp"

    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        full_grad = grad(f, argnums=(0, 1, 2), has_aux=True)
        (g, _, _), vjp_fn, new_b = vjp(full_grad, params, buffers, lam, has_aux=True)

        def col(zp_: Dict, zb_: Dict, e: Tensor) -> Dict:
            return vjp_fn((zp_, zb_, e))[0]

        G = _cat([vmap(col)(_take(zp, s), _take(zb, s), eye[s])
                  for s in _chunks(eye.shape[0], self.chunk_size)])
        zb_new = self._buffer_tangents(f, params, buffers, lam, zp, zb, eye)
        return g, new_b, G, zb_new


class ForwardOverReverse(HVPStrategy):
    """``vmap(jvp(grad f))``: the tangent of the gradient directly, buffers' tangents included."""

    name = "fwd_over_rev"

    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        g_and_b = grad(f, argnums=0, has_aux=True)
        primal: tuple[Dict, Dict] | None = None
        G_parts, zb_parts = [], []
        for s in _chunks(eye.shape[0], self.chunk_size):
            def col(zp_: Dict, zb_: Dict, e: Tensor) -> Any:
                return jvp(g_and_b, (params, buffers, lam), (zp_, zb_, e))

            (g, new_b), (G, zb_new) = vmap(col, out_dims=((None, None), (0, 0)))(
                _take(zp, s), _take(zb, s), eye[s])
            primal = (g, new_b)
            G_parts.append(G)
            zb_parts.append(zb_new)
        assert primal is not None
        return primal[0], primal[1], _cat(G_parts), _cat(zb_parts) if buffers else {}


class _AutogradHVP(HVPStrategy):
    """Reverse-over-reverse with ``torch.autograd``: a ``create_graph`` gradient, then either
    batched (``is_grads_batched``) or one call per column."""

    batched = True

    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        p = {k: v.detach().requires_grad_() for k, v in params.items()}
        b = {k: v.detach().requires_grad_() for k, v in buffers.items()}
        lm = lam.detach().requires_grad_()
        with torch.enable_grad():
            loss, new_b = f(p, b, lm)
            inputs = [*p.values(), *b.values(), lm]
            grads = torch.autograd.grad(loss, inputs, create_graph=True, allow_unused=True)
        cots = [*zp.values(), *zb.values(), eye]
        # outputs that do not depend on the inputs contribute nothing to the Hessian product
        pairs = [(gr, c) for gr, c in zip(grads, cots) if gr is not None and gr.requires_grad]
        k = eye.shape[0]
        chunk = self.chunk_size if self.batched else 1
        Gs: list[Dict] = []
        for s in _chunks(k, chunk):
            n = s.stop - s.start
            if pairs:
                outs = torch.autograd.grad(
                    [gr for gr, _ in pairs], list(p.values()),
                    grad_outputs=[c[s] if self.batched else c[s.start] for _, c in pairs],
                    retain_graph=True, allow_unused=True, is_grads_batched=self.batched)
            else:
                outs = (None,) * len(p)
            part = {}
            for (name, v), o in zip(p.items(), outs):
                if o is None:
                    o = torch.zeros((n, *v.shape), dtype=v.dtype, device=v.device)
                part[name] = o.detach() if self.batched else o.detach().unsqueeze(0)
            Gs.append(part)
        g = {name: (gr.detach() if gr is not None else torch.zeros_like(v))
             for (name, v), gr in zip(p.items(), grads)}
        new_b = {name: v.detach() for name, v in new_b.items()}
        zb_new = self._buffer_tangents(f, params, buffers, lam, zp, zb, eye)
        return g, new_b, _cat(Gs), zb_new


class BatchedAutograd(_AutogradHVP):
    """``torch.autograd.grad(..., is_grads_batched=True)``. Runs on the legacy vmap, which falls
    back to a per-column loop for some ops (``tanh_backward``, ``convolution_backward``, ...)."""

    name = "is_grads_batched"
    batched = True


class ColumnLoop(_AutogradHVP):
    """The baseline of seed 002: a Python loop, one ``torch.autograd.grad`` per column."""

    name = "loop"
    batched = False

    def __init__(self) -> None:
        super().__init__(chunk_size=None)


STRATEGIES: dict[str, type[HVPStrategy]] = {
    c.name: c for c in (VmapVJP, BatchedAutograd, ForwardOverReverse, ColumnLoop)
}
