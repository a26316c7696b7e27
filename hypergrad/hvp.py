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

Memory. A batched call holds intermediates for every column it processes: about
``column_memory_factor`` (6 for :class:`VmapVJP`) times the activations the gradient pass saves
for backward, plus twice the parameters' bytes, per column (:meth:`HVPStrategy.column_bytes`;
the weights a layer saves are shared by all columns and not counted per column: on ResNet-18 at
32x32 they are 43 of the 57 MiB saved). Unchunked K = 64 on a small 28x28 CNN needs several GB.
So the columns go through in chunks. ``chunk_size=None`` (the default) sizes them from
``memory_budget`` (default :data:`DEFAULT_MEMORY_BUDGET`, 1 GiB): the activations one forward
pass saves are measured once per parameter shapes, with
``torch.autograd.graph.saved_tensors_hooks``, and ``chunk = budget // column_bytes``, split into
equal chunks. An int ``chunk_size`` wins over the budget; ``memory_budget=math.inf`` never
chunks. Chunks are written into one preallocated result as they come. Results never depend on
the chunking (tested). At K = 64 on the 28x28 benchmark CNN the default (8 columns per call)
holds 1.0-1.9 GiB and runs faster than the unchunked call, which holds 6.6 GiB (BENCHMARKS.md).

``VmapVJP(compile=True)`` runs the gradient and the batched products through ``torch.compile``
(opt-in; ``method.compile=true`` in the Hydra configs). Where it traces, it is faster in steady
state (BENCHMARKS.md: the MLP 1.3-1.5x over eager at K = 4 and 16, the small CNNs up to 1.2x,
equal on the 28x28 CNN), but the first step compiles for 10-20 s, a new column count or a
step-dependent hyperparameter value (a schedule window) recompiles until dynamo's recompile
limit, after which those calls run eagerly. torch 2.13 traces ``vmap`` over a convolution's
double backward with static shapes only; dynamo switches a function to dynamic shapes once its
input shapes change, so each compiled strategy compiles a code object of its own (one model's
recompiles do not reach another's; reuse one strategy across runs of a model, as
:class:`~hypergrad.Trainer` does, to compile once). Where tracing fails, the strategy warns once
and runs eager (same results). Hence off by default.
"""

from __future__ import annotations

import abc
import itertools
import math
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.func import grad, jvp, vjp, vmap

__all__ = ["HVPStrategy", "VmapVJP", "BatchedAutograd", "ForwardOverReverse", "ColumnLoop",
           "STRATEGIES", "DEFAULT_MEMORY_BUDGET"]

Dict = dict[str, Tensor]
LossFn = Callable[[Dict, Dict, Tensor], tuple[Tensor, Dict]]
HVPResult = tuple[Dict, Dict, Dict, Dict]  # g, new_b, G, Zb_new

DEFAULT_MEMORY_BUDGET: float = float(1 << 30)
"""Bytes of column intermediates one batched call may hold when ``chunk_size`` is automatic:
1 GiB. On the benchmark models it keeps K = 64 within 2 GB of extra memory at the speed of the
unchunked call (BENCHMARKS.md); raise it on a machine with memory to spare, or pass
``memory_budget=`` to a strategy."""


def _check_chunk(api: str, chunk_size: int | None) -> int | None:
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or chunk_size < 1):
        raise ValueError(f"{api}: chunk_size={chunk_size!r} must be None (automatic, from "
                         f"memory_budget) or an int >= 1.")
    return chunk_size


def _check_budget(api: str, budget: float | None) -> float | None:
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise ValueError(f"{api}: memory_budget={budget!r} must be None (the default, "
                         f"{int(DEFAULT_MEMORY_BUDGET)} bytes), a number of bytes > 0, or "
                         f"math.inf (never chunk), e.g. memory_budget=4 * 2**30.")
    return float(budget)


def _chunks(k: int, chunk_size: int | None) -> list[slice]:
    c = k if chunk_size is None else max(1, min(chunk_size, k))
    return [slice(i, min(i + c, k)) for i in range(0, k, c)]


def _by_chunks(fn: Callable[[slice], Dict], k: int, chunk: int) -> Dict:
    """``fn(s)`` for the chunks ``s`` of ``range(k)``, written into one preallocated result as
    they come (a list of parts then ``torch.cat`` would hold the result twice)."""
    slices = _chunks(k, chunk)
    first = fn(slices[0])
    if len(slices) == 1:
        return first
    out = {name: v.new_empty((k, *v.shape[1:])) for name, v in first.items()}
    for name, v in first.items():
        out[name][slices[0]] = v
    del first
    for s in slices[1:]:
        for name, v in fn(s).items():
            out[name][s] = v
    return out


def _take(d: Dict, s: slice) -> Dict:
    return {k: v[s] for k, v in d.items()}


def saved_bytes(f: LossFn, params: Dict, buffers: Dict, lam: Tensor) -> int:
    """Bytes of activations the forward pass of ``f`` saves for backward: distinct storages,
    not counting the inputs' own (the weights a layer saves are shared by every column of a
    batched product, the activations are not). One forward pass."""
    seen: dict[tuple[int, int], int] = {}
    inputs = {x.untyped_storage().data_ptr()
              for x in (*params.values(), *buffers.values(), lam)}

    def pack(x: Tensor) -> Tensor:
        if x.layout == torch.strided and x.device.type != "meta":
            key = (x.untyped_storage().data_ptr(), x.untyped_storage().nbytes())
            if key[0] not in inputs:
                seen[key] = key[1]
        return x

    p = {k: v.detach().requires_grad_() for k, v in params.items()}
    b = {k: v.detach().requires_grad_() for k, v in buffers.items()}
    lm = lam.detach().requires_grad_()
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        f(p, b, lm)
    return sum(seen.values())


def _tree_bytes(d: Dict) -> int:
    return sum(v.numel() * v.element_size() for v in d.values())


class HVPStrategy(abc.ABC):
    """How to compute the K Hessian-vector products of one step.

    Args:
        chunk_size: columns per batched call; ``None`` (default): chosen from ``memory_budget``.
            Results do not depend on the chunking.
        memory_budget: bytes the columns of one batched call may hold (``None``:
            :data:`DEFAULT_MEMORY_BUDGET`; ``math.inf``: all K columns in one call). Used only
            when ``chunk_size`` is ``None``.

    Example:
        >>> VmapVJP()                              # chunks sized from 1 GiB
        VmapVJP(chunk_size=None, memory_budget=None)
        >>> VmapVJP(memory_budget=4 * 2**30)       # more memory, fewer chunks
        VmapVJP(chunk_size=None, memory_budget=4294967296.0)
        >>> VmapVJP(chunk_size=8)                  # fixed chunks
        VmapVJP(chunk_size=8, memory_budget=None)
    """

    name: str = "abstract"
    column_memory_factor: float = 6.0
    """Bytes one batched column holds, as a multiple of the activations the gradient pass saves
    for backward (:func:`saved_bytes`; measured 3-3.5 on the benchmark CNNs, doubled for
    safety), plus twice the parameters' bytes (the column's Hessian-vector product and one
    intermediate of that size): :meth:`column_bytes`."""

    def __init__(self, chunk_size: int | None = None,
                 memory_budget: float | None = None) -> None:
        api = type(self).__name__
        self.chunk_size = _check_chunk(api, chunk_size)
        self.memory_budget = _check_budget(api, memory_budget)
        self._saved: dict[Any, int] = {}

    @abc.abstractmethod
    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        """Args: ``zp[name]`` has shape ``(K, *param.shape)``, ``zb`` likewise for buffers,
        ``eye`` has shape ``(K, len(lam))``: row k is the tangent of ``lam`` of column k (the
        identity, or rows of it when the caller skips columns).
        Returns ``(g, new_b, G, Zb_new)`` with ``G[name]`` of shape ``(K, *param.shape)``."""

    def column_bytes(self, activation_bytes: float, param_bytes: float) -> float:
        """Estimated bytes one column of a batched call holds."""
        return self.column_memory_factor * activation_bytes + 2 * param_bytes

    def chunk_for(self, k: int, activation_bytes: float, param_bytes: float) -> int:
        """Columns per batched call for ``k`` columns: ``chunk_size`` if given, else the most
        that fit ``memory_budget``, balanced so the chunks have equal sizes."""
        if self.chunk_size is not None:
            return min(self.chunk_size, k)
        budget = DEFAULT_MEMORY_BUDGET if self.memory_budget is None else self.memory_budget
        if k <= 1 or math.isinf(budget):
            return max(k, 1)
        per_column = max(self.column_bytes(activation_bytes, param_bytes), 1.0)
        c = int(max(1, min(k, budget // per_column)))
        n = -(-k // c)
        return -(-k // n)

    def columns_per_call(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor,
                         k: int) -> int:
        """:meth:`chunk_for` with the activations measured once per parameter shapes."""
        if self.chunk_size is not None or k <= 1:
            return self.chunk_for(k, 0.0, 0.0)
        key = (tuple((n, tuple(v.shape), v.dtype) for n, v in params.items()),
               tuple((n, tuple(v.shape)) for n, v in buffers.items()), tuple(lam.shape))
        if key not in self._saved:
            self._saved[key] = saved_bytes(f, params, buffers, lam)
        return self.chunk_for(k, self._saved[key], _tree_bytes(params))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(chunk_size={self.chunk_size}, "
                f"memory_budget={self.memory_budget})")


def _probed(f: LossFn) -> Callable[[Dict, Dict, Tensor, Dict], tuple[Tensor, Dict]]:
    """``f`` with probes on its new buffers: ``L' = L + sum_b <s_b, new_b(p, b, lam)>``.

    At ``s = 0``, ``L'`` has the value and the gradient of ``L``, and ``d/ds (grad L' . z) =
    J_new_b z``: the ``s`` block of the Hessian product ``H_{L'} (z, 0)`` is the buffers' tangent
    (BatchNorm's running statistics), so the reverse-over-reverse strategies get it from the
    products they compute anyway, without a forward-mode pass over the model of its own."""
    def probed(p: Dict, b: Dict, lm: Tensor, s: Dict) -> tuple[Tensor, Dict]:
        loss, nb = f(p, b, lm)
        for k, v in s.items():
            loss = loss + (v * nb[k]).sum()
        return loss, nb
    return probed


def _vmap_vjp(f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
              eye: Tensor, chunk: int) -> tuple[Dict, Dict, Dict, Dict]:
    """``(g, new_b, G, Zb_new)``; the buffers' tangents from the same products (:func:`_probed`)."""
    probes = {k: torch.zeros_like(buffers[k]) for k in zb}
    full_grad = grad(_probed(f), argnums=(0, 1, 2, 3), has_aux=True)
    out: Any = vjp(full_grad, params, buffers, lam, probes, has_aux=True)
    (g, _, _, _), vjp_fn, new_b = out

    def col(zp_: Dict, zb_: Dict, e: Tensor) -> tuple[Dict, Dict]:
        res = vjp_fn((zp_, zb_, e, probes))  # probes: a zero cotangent of the right shapes
        return res[0], res[3]

    # randomness="same": every column sees the primal's random draws (the step's contract; a
    # vjp_fn replays saved masks, but a model may draw in its backward too)
    both = _by_chunks(lambda s: _pair(vmap(col, randomness="same")(_take(zp, s), _take(zb, s),
                                                                      eye[s])),
                      eye.shape[0], chunk)
    G = {k[2:]: v for k, v in both.items() if k.startswith("P\0")}
    zb_new = {k[2:]: v for k, v in both.items() if k.startswith("B\0")}
    return g, new_b, G, zb_new


def _pair(gz: tuple[Dict, Dict]) -> Dict:
    return {**{"P\0" + k: v for k, v in gz[0].items()},
            **{"B\0" + k: v for k, v in gz[1].items()}}


_COMPILED_IDS = itertools.count()


class VmapVJP(HVPStrategy):
    """Functional reverse-over-reverse: ``vmap(vjp_fn)`` of ``vjp(grad f)``; one gradient forward,
    one batched backward per chunk. The fastest strategy measured on the benchmark models from
    K = 16 up (BENCHMARKS.md). A single column goes through one ``torch.autograd`` call instead:
    vmap's fixed cost buys nothing there.

    Args:
        chunk_size, memory_budget: see :class:`HVPStrategy`.
        compile: run the gradient and the batched products through ``torch.compile`` (see the
            module docstring: faster where it traces, 10-20 s to compile, eager with a
            warning where it cannot trace).
    """

    name = "vmap_vjp"
    column_memory_factor = 6.0

    def __init__(self, chunk_size: int | None = None, memory_budget: float | None = None,
                 compile: bool = False) -> None:
        super().__init__(chunk_size, memory_budget)
        if not isinstance(compile, bool):
            raise TypeError(f"VmapVJP: compile={compile!r} must be True or False.")
        self.compile = compile
        self._compiled: Callable[..., tuple[Dict, Dict, Dict, Dict]] | None = None
        self._compile_failed = False

    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        if eye.shape[0] == 1 and not self.compile:  # the same products, without vmap's cost
            return _autograd_hvp(self, f, params, buffers, lam, zp, zb, eye, batched=False)
        chunk = self.columns_per_call(f, params, buffers, lam, eye.shape[0])
        return self._run(f, params, buffers, lam, zp, zb, eye, chunk)

    def _run(self, *args: Any) -> tuple[Dict, Dict, Dict, Dict]:
        if not self.compile or self._compile_failed:
            return _vmap_vjp(*args)
        if self._compiled is None:
            # a code object of its own, under a name of its own: dynamo keeps its cache and
            # its record of which inputs changed shape (automatic dynamic shapes, keyed by
            # file, line and name) per function, so one strategy's recompiles never turn
            # another model's trace dynamic (a convolution's double backward under vmap does
            # not trace with dynamic shapes in torch 2.13)
            name = f"_vmap_vjp_{next(_COMPILED_IDS)}"
            own = types.FunctionType(_vmap_vjp.__code__.replace(co_name=name, co_qualname=name),
                                     _vmap_vjp.__globals__, name)
            self._compiled = torch.compile(own)
        try:
            return self._compiled(*args)
        except Exception as err:  # torch.compile cannot trace this model: eager from now on
            self._compile_failed = True
            warnings.warn(f"VmapVJP(compile=True): torch.compile failed on this model "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:200]}); running "
                          f"eager from now on (same results).", RuntimeWarning, stacklevel=3)
            return _vmap_vjp(*args)

    def __repr__(self) -> str:
        extra = ", compile=True" if self.compile else ""
        return (f"VmapVJP(chunk_size={self.chunk_size}, memory_budget={self.memory_budget}"
                f"{extra})")


class ForwardOverReverse(HVPStrategy):
    """``vmap(jvp(grad f))``: the tangent of the gradient directly, buffers' tangents included.
    ``jvp`` recomputes the gradient with every call, so each chunk repeats it."""

    name = "fwd_over_rev"
    column_memory_factor = 8.0

    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        g_and_b = grad(f, argnums=0, has_aux=True)
        primal: list[tuple[Dict, Dict]] = []
        # nested out_dims work at runtime; torch's annotation says a flat tuple
        dims: Any = ((None, None), (0, 0))

        def col(zp_: Dict, zb_: Dict, e: Tensor) -> Any:
            return jvp(g_and_b, (params, buffers, lam), (zp_, zb_, e))

        def chunk_of(s: slice) -> Dict:
            (g, new_b), (G, zb_new) = vmap(col, out_dims=dims, randomness="same")(
                _take(zp, s), _take(zb, s), eye[s])
            primal[:] = [(g, new_b)]
            return {**{"G\0" + k: v for k, v in G.items()},
                    **{"B\0" + k: v for k, v in zb_new.items()}}

        chunk = self.columns_per_call(f, params, buffers, lam, eye.shape[0])
        try:
            both = _by_chunks(chunk_of, eye.shape[0], chunk)
        except NotImplementedError as err:
            if "forward AD" not in str(err):
                raise
            raise NotImplementedError(
                f"ForwardOverReverse: an operation in the step has no forward-mode derivative "
                f"in torch {torch.__version__} ({str(err).splitlines()[0]}; e.g. the fused CPU "
                f"LSTM/GRU kernel, which recurrent layers over packed sequences use). Use "
                f"VmapVJP() (the default) or IsGradsBatched(), which need only "
                f"reverse mode.") from err
        except RuntimeError as err:
            if "ZeroTensors are immutable" not in str(err):
                raise
            raise RuntimeError(
                "ForwardOverReverse: torch's forward-over-reverse rule of a loss in the step "
                "writes into a zero tangent (pytorch/pytorch#123996: F.mse_loss with "
                "reduction='mean' and a target without tangent, open in torch 2.13). Use "
                "VmapVJP() (the default), or write the loss out, e.g. "
                "((pred - target) ** 2).mean().") from err
        G = {k[2:]: v for k, v in both.items() if k[0] == "G"}
        zb_new = {k[2:]: v for k, v in both.items() if k[0] == "B"}
        return primal[0][0], primal[0][1], G, zb_new


def _autograd_hvp(strategy: HVPStrategy, f: LossFn, params: Dict, buffers: Dict, lam: Tensor,
                  zp: Dict, zb: Dict, eye: Tensor, batched: bool) -> HVPResult:
    """Reverse-over-reverse with ``torch.autograd``: a differentiable gradient, then either
    batched calls (``is_grads_batched``, chunked) or one call per column.

    The gradient is ``torch.func.grad`` of ``f`` at eager leaves that require grad (the same
    graph as ``autograd.grad(..., create_graph=True)``), so that random ops in ``f`` draw as
    in every other evaluation of the step (:mod:`hypergrad.rng`)."""
    p = {k: v.detach().requires_grad_() for k, v in params.items()}
    b = {k: v.detach().requires_grad_() for k, v in buffers.items()}
    lm = lam.detach().requires_grad_()
    probes = {k: torch.zeros_like(buffers[k]).requires_grad_() for k in zb}  # see _probed
    with torch.enable_grad():
        (gp, gb, glam, _), new_b = grad(_probed(f), argnums=(0, 1, 2, 3), has_aux=True)(
            p, b, lm, probes)
        grads: tuple[Tensor | None, ...] = (*gp.values(), *gb.values(), glam)
    cots = [*zp.values(), *zb.values(), eye]
    # outputs that do not depend on the inputs contribute nothing to the Hessian product
    pairs = [(gr, c) for gr, c in zip(grads, cots) if gr is not None and gr.requires_grad]
    k = eye.shape[0]
    chunk = strategy.columns_per_call(f, params, buffers, lam, k) if batched else 1

    wrt = {**{"P\0" + k: v for k, v in p.items()}, **{"B\0" + k: v for k, v in probes.items()}}

    def chunk_of(s: slice) -> Dict:
        n = s.stop - s.start
        outs: tuple[Tensor | None, ...] = (None,) * len(wrt)
        if pairs:
            outs = torch.autograd.grad(
                [gr for gr, _ in pairs], list(wrt.values()),
                grad_outputs=[c[s] if batched else c[s.start] for _, c in pairs],
                retain_graph=True, allow_unused=True, is_grads_batched=batched)
        part = {}
        for (name, v), o in zip(wrt.items(), outs):
            if o is None:
                o = torch.zeros((n, *v.shape), dtype=v.dtype, device=v.device)
            part[name] = o.detach() if batched else o.detach().unsqueeze(0)
        return part

    both = _by_chunks(chunk_of, k, chunk)
    g = {name: (gr.detach() if gr is not None else torch.zeros_like(v))
         for (name, v), gr in zip(p.items(), grads)}
    new_b = {name: v.detach() for name, v in new_b.items()}
    return (g, new_b, {n[2:]: v for n, v in both.items() if n.startswith("P\0")},
            {n[2:]: v for n, v in both.items() if n.startswith("B\0")})


class _AutogradHVP(HVPStrategy):
    """Reverse-over-reverse with ``torch.autograd``: a ``create_graph`` gradient, then either
    batched (``is_grads_batched``) or one call per column."""

    batched = True
    column_memory_factor = 5.0

    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        return _autograd_hvp(self, f, params, buffers, lam, zp, zb, eye, self.batched)


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

    def __repr__(self) -> str:
        return "ColumnLoop()"


STRATEGIES: dict[str, type[HVPStrategy]] = {
    c.name: c for c in (VmapVJP, BatchedAutograd, ForwardOverReverse, ColumnLoop)
}
