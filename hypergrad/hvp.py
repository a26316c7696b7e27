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

Memory. A call holds the gradient ``g``, the gradient pass's graph (retained: every column's
product differentiates it), and per column its result (``G`` and ``Z^b``, the bytes of the
parameters and buffers) and the intermediates of its vector-Jacobian product. What one column
holds does not follow the activations by one factor: on the bench_models rows it was 0.24 (a
ResNet-18's convolutions), 1.1 (a transformer) and 2.9 (an LSTM) times the activations the
forward pass saves, besides the parameters' bytes; and ``is_grads_batched`` and
``fwd_over_rev`` run convolutions' batching rules as loops, so their columns do not all
coexist. So each strategy counts its own calls on fake tensors
(:meth:`HVPStrategy.footprint`, :mod:`hypergrad.footprint`: the model's code run on tensors
without data; on those rows the count equals the bytes of the tensors the real call holds, and
is 0.91-1.0 of malloc's measured peak, the rest being scratch memory inside convolution
kernels): a call on one column and on two give the bytes of the first column and of each
further one (:meth:`HVPStrategy.column_cost`, once per parameter shapes: the memory estimate
counts them, or else the first step). The columns go through in chunks: ``chunk_size=None``
(the default) sizes them from ``memory_budget`` (default :data:`DEFAULT_MEMORY_BUDGET`, 1 GiB),
``chunk = budget // bytes per column``, split into equal chunks. An int ``chunk_size`` wins
over the budget; ``memory_budget=math.inf`` never chunks. Chunks are written into one
preallocated result as they come. Results never depend on the chunking (tested). A later chunk
can hold more than the first (``fwd_over_rev``: forward AD copies a tangent that does not start
at its storage's beginning), so a step's estimate counts two chunks
(:meth:`~hypergrad.methods.Sizes.hvp`). Where the model cannot run on fake tensors, one real
forward pass counts the activations ``a`` it saves, and a column is taken to hold
``column_memory_factor * a + 2 |w|`` (3, the largest factor measured).

``VmapVJP(compile=True)`` runs the gradient and the batched products through ``torch.compile``
(opt-in; ``method.compile=true`` in the Hydra configs). Where it traces, it is faster in steady
state (docs/benchmarks.md: the MLP 1.3-1.5x over eager at K = 4 and 16, the small CNNs up to 1.2x,
equal on the 28x28 CNN), but the first step compiles for 10-20 s. A new column count would
recompile (until dynamo's recompile limit, after which those calls run eagerly): the compiled
call pads its columns with zero columns to at most :data:`COMPILE_BUCKETS` counts, so a
schedule, whose windows' columns start one after another, compiles a few shapes. torch 2.13
traces ``vmap`` over a convolution's double backward with static shapes only; dynamo switches a
function to dynamic shapes once its input shapes change, so each compiled strategy compiles a
code object of its own (one model's recompiles do not reach another's; reuse one strategy across
runs of a model, as
:class:`~hypergrad.Trainer` does, to compile once). Where tracing fails, the strategy warns once
and runs eager (same results). Hence off by default here; ``ForwardMode()`` (``compile=None``)
turns it on for a long run when a short measurement says it pays
(:data:`hypergrad.methods.forward.AUTO_COMPILE_AFTER_S`).
"""

from __future__ import annotations

import abc
import itertools
import math
import numbers
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.func import grad, jvp, vjp, vmap

from . import footprint as _fp
from .errors import is_real

__all__ = ["HVPStrategy", "VmapVJP", "BatchedAutograd", "ForwardOverReverse", "ColumnLoop",
           "STRATEGIES", "DEFAULT_MEMORY_BUDGET"]

Dict = dict[str, Tensor]
LossFn = Callable[[Dict, Dict, Tensor], tuple[Tensor, Dict]]
HVPResult = tuple[Dict, Dict, Dict, Dict]  # g, new_b, G, Zb_new

DEFAULT_MEMORY_BUDGET: float = float(1 << 30)
"""Bytes of column intermediates one batched call may hold when ``chunk_size`` is automatic:
1 GiB. On the benchmark models it keeps K = 64 within 2 GB of extra memory at the speed of the
unchunked call (docs/benchmarks.md); raise it on a machine with memory to spare, or pass
``memory_budget=`` to a strategy."""


def _check_chunk(api: str, chunk_size: int | None) -> int | None:
    # a NumPy int (a grid's count) was refused as "must be ... an int >= 1"
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(
            chunk_size, numbers.Integral) or chunk_size < 1):
        raise ValueError(f"{api}: chunk_size={chunk_size!r} must be None (automatic, from "
                         f"memory_budget) or an int >= 1.")
    return None if chunk_size is None else int(chunk_size)


def _check_budget(api: str, budget: float | None) -> float | None:
    if budget is None:
        return None
    if not is_real(budget) or not budget > 0:  # a NumPy number too
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


def saved_bytes(f: LossFn, params: Dict, buffers: Dict, lam: Tensor, fake: bool = False) -> int:
    """Bytes of activations the forward pass of ``f`` saves for backward: distinct storages,
    not counting the inputs' own (the weights a layer saves are shared by every column of a
    batched product, the activations are not). One real forward pass, or with ``fake`` one on
    fake tensors that allocates nothing (:func:`hypergrad.footprint.saved_bytes`)."""
    return _fp.saved_bytes(f, params, buffers, lam, fake=fake)


def _tree_bytes(d: Dict) -> int:
    return sum(v.numel() * v.element_size() for v in d.values())


def _shape_key(params: Dict, buffers: Dict, lam: Tensor) -> Any:
    return (tuple((n, tuple(v.shape), v.dtype) for n, v in params.items()),
            tuple((n, tuple(v.shape)) for n, v in buffers.items()), tuple(lam.shape))


class HVPStrategy(abc.ABC):
    """How to compute the K Hessian-vector products of one step.

    Args:
        chunk_size: columns per batched call; ``None`` (default): chosen from ``memory_budget``.
            Results do not depend on the chunking.
        memory_budget: bytes the columns of one batched call may hold (``None``:
            :data:`DEFAULT_MEMORY_BUDGET`; ``math.inf``: all K columns in one call). Used only
            when ``chunk_size`` is ``None``. It bounds the columns, not the call: the gradient's
            graph and the first column come on top, and a budget below one column's bytes
            still runs one column per call (the least there is); a budget for a whole step is
            ``Guards(memory_budget=...)``, which refuses what does not fit.

    Example:
        >>> VmapVJP()                              # chunks sized from 1 GiB
        VmapVJP(chunk_size=None, memory_budget=None)
        >>> VmapVJP(memory_budget=4 * 2**30)       # more memory, fewer chunks
        VmapVJP(chunk_size=None, memory_budget=4294967296.0)
        >>> VmapVJP(chunk_size=8)                  # fixed chunks
        VmapVJP(chunk_size=8, memory_budget=None)
    """

    name: str = "abstract"
    column_memory_factor: float = 3.0
    """Where the model cannot run on fake tensors (:meth:`column_cost`): the bytes one column
    of a call is taken to hold, as a multiple of the activations one forward pass saves
    (:func:`saved_bytes`), plus twice the parameters' bytes (the column's result and its
    weights' gradients): 3, the largest measured on the bench_models rows (an LSTM's 2.9; a
    transformer's 1.1, a ResNet-18's 0.24)."""

    def __init__(self, chunk_size: int | None = None,
                 memory_budget: float | None = None) -> None:
        api = type(self).__name__
        self.chunk_size = _check_chunk(api, chunk_size)
        self.memory_budget = _check_budget(api, memory_budget)
        self._costs: dict[Any, tuple[int, int]] = {}
        self._footprints: dict[Any, int] = {}

    @abc.abstractmethod
    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        """Args: ``zp[name]`` has shape ``(K, *param.shape)``, ``zb`` likewise for buffers,
        ``eye`` has shape ``(K, len(lam))``: row k is the tangent of ``lam`` of column k (the
        identity, or rows of it when the caller skips columns).
        Returns ``(g, new_b, G, Zb_new)`` with ``G[name]`` of shape ``(K, *param.shape)``."""

    def _call(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
              eye: Tensor, chunk: int) -> HVPResult:
        """The products with ``chunk`` columns per call (a strategy that chunks overrides it;
        :meth:`footprint` counts one call of it)."""
        return self(f, params, buffers, lam, zp, zb, eye)

    def column_bytes(self, activation_bytes: float, param_bytes: float) -> float:
        """The bytes one column is taken to hold where the model cannot run on fake tensors:
        ``column_memory_factor * a + 2 |w|``."""
        return self.column_memory_factor * activation_bytes + 2 * param_bytes

    def chunk_for(self, k: int, column_bytes: float) -> int:
        """Columns per call for ``k`` columns when each holds ``column_bytes``: ``chunk_size``
        if given, else the most that fit ``memory_budget``, balanced so the chunks have equal
        sizes."""
        if self.chunk_size is not None:
            return min(self.chunk_size, k)
        budget = DEFAULT_MEMORY_BUDGET if self.memory_budget is None else self.memory_budget
        if k <= 1 or math.isinf(budget):
            return max(k, 1)
        c = int(max(1, min(k, budget // max(column_bytes, 1.0))))
        n = -(-k // c)
        return -(-k // n)

    def columns_per_call(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor,
                         k: int) -> int:
        """:meth:`chunk_for` with the bytes per column of :meth:`column_cost` (counted once per
        parameter shapes)."""
        budget = DEFAULT_MEMORY_BUDGET if self.memory_budget is None else self.memory_budget
        if self.chunk_size is not None or k <= 1 or math.isinf(budget):
            return self.chunk_for(k, 0.0)
        return self.chunk_for(k, self.column_cost(f, params, buffers, lam)[1])

    def column_cost(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor
                    ) -> tuple[int, int]:
        """``(first, each)``: the peak bytes of a call on one column (the gradient, its retained
        graph, one column's result and intermediates) and what each further column adds,
        counted on fake tensors (:meth:`footprint` of calls on one and on two columns; nothing
        is allocated), once per parameter shapes. Where the model cannot run on fake tensors,
        from the activations ``a`` one real forward pass saves: ``each = column_bytes(a, |w|)``
        and ``first = |w| + 2 a + each`` (the gradient's graph holds 1.9-2.4 ``a`` on the
        bench_models rows)."""
        key = _shape_key(params, buffers, lam)
        if key not in self._costs:
            try:
                one = self.footprint(f, params, buffers, lam, 1)
                two = self.footprint(f, params, buffers, lam, 2)
                self._costs[key] = (one, max(two - one, 1))
            except _fp.FAKE_ERRORS:
                a = saved_bytes(f, params, buffers, lam)
                w = _tree_bytes(params)
                each = int(self.column_bytes(a, w))
                self._costs[key] = (w + 2 * a + each, each)
        return self._costs[key]

    def footprint(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor,
                  columns: int, chunk: int | None = None) -> int:
        """Peak bytes of one call on ``columns`` columns, ``chunk`` per call (default: all in
        one): ``g``, ``new_b``, the columns' ``G`` and ``Z^b`` (chunked: the result the chunks
        are written into), the gradient's retained graph, the columns' intermediates; counted on
        fake tensors shaped like ``params``, ``buffers`` and ``lam`` (real or fake; nothing is
        allocated), once per shapes. Raises where the model cannot run on fake tensors."""
        chunk = columns if chunk is None else min(chunk, columns)
        key = (_shape_key(params, buffers, lam), columns, chunk)
        if key not in self._footprints:
            n = lam.shape[0]

            def build() -> tuple[Dict, Dict, Tensor]:
                zp = {k: torch.zeros((columns, *v.shape), dtype=v.dtype, device=v.device)
                      for k, v in params.items()}
                zb = {k: torch.zeros((columns, *v.shape), dtype=v.dtype, device=v.device)
                      for k, v in buffers.items()}
                eye = torch.eye(n, dtype=lam.dtype, device=lam.device)[:columns]
                return zp, zb, eye

            def run(p: Dict, b: Dict, lm: Tensor, zp: Dict, zb: Dict, eye: Tensor) -> Any:
                return self._call(f, p, b, lm, zp, zb, eye, chunk)

            self._footprints[key] = _fp.peak_bytes(run, params, buffers, lam, build=build)
        return self._footprints[key]

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

COMPILE_BUCKETS = 4
"""A compiled :class:`VmapVJP` pads its columns with zero columns up to the next multiple of
``ceil(K / COMPILE_BUCKETS)`` (capped at ``K``): at most this many column counts are compiled
per model, whichever columns are live at a step (torch.compile's recompile limit is 8)."""


def compile_bucket(k: int, n: int) -> int:
    """The column count a compiled call on ``k`` of ``n`` columns runs (see
    :data:`COMPILE_BUCKETS`)."""
    if k <= 0 or k >= n:
        return k
    q = -(-n // COMPILE_BUCKETS)
    return min(n, -(-k // q) * q)


def _padded(d: Dict, rows: int) -> Dict:
    return {k: _padded_rows(v, rows) for k, v in d.items()}


def _padded_rows(v: Tensor, rows: int) -> Tensor:
    if v.shape[0] >= rows:
        return v
    return torch.cat([v, v.new_zeros((rows - v.shape[0], *v.shape[1:]))])


class VmapVJP(HVPStrategy):
    """Functional reverse-over-reverse: ``vmap(vjp_fn)`` of ``vjp(grad f)``; one gradient forward,
    one batched backward per chunk. The fastest strategy measured on the benchmark models from
    K = 16 up (docs/benchmarks.md). A single column goes through one ``torch.autograd`` call
    instead: vmap's fixed cost buys nothing there.

    Args:
        chunk_size, memory_budget: see :class:`HVPStrategy`.
        compile: run the gradient and the batched products through ``torch.compile`` (see the
            module docstring: faster where it traces, 10-20 s to compile, eager with a
            warning where it cannot trace).
    """

    name = "vmap_vjp"

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

    def _call(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
              eye: Tensor, chunk: int) -> HVPResult:
        """The eager products (what :meth:`footprint` counts; a compiled call is counted as the
        eager one, and counting never compiles)."""
        if eye.shape[0] == 1 and not self.compile:
            return _autograd_hvp(self, f, params, buffers, lam, zp, zb, eye, batched=False)
        return _vmap_vjp(f, params, buffers, lam, zp, zb, eye, chunk)

    def _run(self, *args: Any) -> tuple[Dict, Dict, Dict, Dict]:
        if not self.compile or self._compile_failed:
            return _vmap_vjp(*args)
        f, params, buffers, lam, zp, zb, eye, chunk = args
        k = eye.shape[0]
        b = compile_bucket(k, lam.shape[0])
        if b == k:
            return self._run_compiled(*args)
        # zero columns up to the bucket: one compiled shape serves every count of live columns
        # in it (a schedule's windows start one after another; each count would recompile)
        g, new_b, G, zb_new = self._run_compiled(
            f, params, buffers, lam, _padded(zp, b), _padded(zb, b), _padded_rows(eye, b),
            b if chunk >= k else chunk)
        return g, new_b, {n: v[:k] for n, v in G.items()}, {n: v[:k] for n, v in zb_new.items()}

    def _run_compiled(self, *args: Any) -> tuple[Dict, Dict, Dict, Dict]:
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

    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        chunk = self.columns_per_call(f, params, buffers, lam, eye.shape[0])
        return self._call(f, params, buffers, lam, zp, zb, eye, chunk)

    def _call(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
              eye: Tensor, chunk: int) -> HVPResult:
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

        try:
            both = _by_chunks(chunk_of, eye.shape[0], chunk)
        except NotImplementedError as err:
            # torch: "... forward AD ..." (an aten kernel), "... forward mode AD ..." (an
            # autograd.Function without a jvp staticmethod)
            if "forward AD" not in str(err) and "forward mode AD" not in str(err):
                raise
            raise NotImplementedError(
                f"ForwardOverReverse: an operation in the step has no forward-mode derivative "
                f"in torch {torch.__version__} ({str(err).splitlines()[0]}; e.g. the fused CPU "
                f"LSTM/GRU kernel, which recurrent layers over packed sequences use, or a "
                f"custom autograd.Function without a jvp staticmethod). Use VmapVJP() (the "
                f"default) or BatchedAutograd(), which need only reverse mode.") from err
        except RuntimeError as err:
            said = str(err).splitlines()[0].rstrip(".") + "." if str(err) else ""
            if "does not have vmap support" in said or "we do not yet support" in said:
                # the step's forward pass under vmap: a custom autograd.Function without a
                # vmap rule, or an operation without a batching rule (nn.RReLU in training:
                # aten::rrelu_with_noise)
                raise NotImplementedError(
                    f"ForwardOverReverse: {said} Forward-over-reverse runs the step's forward "
                    f"pass under vmap, so every operation in it needs a batching rule (a "
                    f"custom autograd.Function: generate_vmap_rule = True or a vmap "
                    f"staticmethod). Use VmapVJP() (the default) or BatchedAutograd(), which "
                    f"vmap only the backward pass.") from err
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
                  zp: Dict, zb: Dict, eye: Tensor, batched: bool,
                  chunk: int | None = None) -> HVPResult:
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
    if not batched:
        chunk = 1
    elif chunk is None:
        chunk = strategy.columns_per_call(f, params, buffers, lam, k)

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
            if o is None:  # a parameter the training loss does not read: already (n, *shape)
                part[name] = torch.zeros((n, *v.shape), dtype=v.dtype, device=v.device)
            else:
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

    def __call__(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
                 eye: Tensor) -> HVPResult:
        return _autograd_hvp(self, f, params, buffers, lam, zp, zb, eye, self.batched)

    def _call(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor, zp: Dict, zb: Dict,
              eye: Tensor, chunk: int) -> HVPResult:
        return _autograd_hvp(self, f, params, buffers, lam, zp, zb, eye, self.batched, chunk)


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

    def columns_per_call(self, f: LossFn, params: Dict, buffers: Dict, lam: Tensor,
                         k: int) -> int:
        return 1

    def __repr__(self) -> str:
        return "ColumnLoop()"


STRATEGIES: dict[str, type[HVPStrategy]] = {
    c.name: c for c in (VmapVJP, BatchedAutograd, ForwardOverReverse, ColumnLoop)
}
