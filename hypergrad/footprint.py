"""Bytes from shapes: what a computation would hold at its peak, counted on fake tensors.

:func:`peak_bytes` runs a function on tensors that have shapes, dtypes and devices but no data
(``torch._subclasses.fake_tensor.FakeTensorMode``: nothing is allocated, no arithmetic is done)
under a dispatch mode, :class:`LiveBytes`, that follows every storage an operation creates until
it is freed. The largest sum alive at once is the peak extra memory the same function needs on
real tensors: the weights a layer saves for backward, the activations, the retained graph of a
differentiable gradient, what a ``vmap``'d vector-Jacobian product holds per column, the
fallback loops some batching rules take, in the order the real run frees them. Views and
in-place results add nothing (they share a storage that exists). On the bench_models rows
(ResNet-18, a transformer encoder, an LSTM; every HVP strategy, 1 to 8 columns per call) the
counted peak of a Hessian-vector call was 0.91-1.03 of the peak of malloc's bytes in use
measured on the real call (``hypergrad.measure.measure``); what it cannot see is the scratch
memory inside a kernel (oneDNN's convolution workspaces).

:func:`saved_bytes` counts what one pass saves for backward the same way.

A function that cannot run on fake tensors (data-dependent control flow: ``.item()``,
``nonzero``, a boolean mask's shape, ``torch.equal``; an operator without a fake kernel; a
sparse layout) raises; the callers (:class:`~hypergrad.methods.Sizes`,
:meth:`~hypergrad.hvp.HVPStrategy.column_cost`) then count on one real pass instead.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["LiveBytes", "fake_mode", "like", "mark", "peak_bytes", "saved_bytes", "storage_key",
           "FAKE_ERRORS"]

FAKE_ERRORS = (Exception,)
"""What a function that cannot run on fake tensors raises: torch's own
(``DataDependentOutputException``, ``DynamicOutputShapeException``,
``UnsupportedFakeTensorException``, a meta kernel's ``NotImplementedError`` or
``RuntimeError``) and whatever the user's code does with a tensor without data (numpy,
``float()``), so any exception: the caller counts on a real pass instead, which raises a real
error again where there is one."""


def storage_key(x: Tensor) -> int:
    """An id of ``x``'s storage, equal for every view of it (real and fake tensors)."""
    return int(x.untyped_storage()._cdata)


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages the operations in its body create, while they live:
    ``live`` now, ``peak`` the most at once. An operation whose result aliases an input (a view,
    an in-place or ``out=`` operation) creates none."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.marks: dict[str, int] = {}
        self._refs: dict[int, weakref.ref[Any]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out
        for x in tree_flatten(out)[0]:
            if isinstance(x, Tensor) and x.layout == torch.strided:
                self._add(x)
        return out

    def _add(self, x: Tensor) -> None:
        st = x.untyped_storage()
        key = int(st._cdata)
        if key in self._refs:
            return
        n = int(st.nbytes())

        def freed(_: Any, key: int = key, n: int = n) -> None:
            self.live -= n
            self._refs.pop(key, None)

        self._refs[key] = weakref.ref(st, freed)
        self.live += n
        self.peak = max(self.peak, self.live)


def mark(label: str) -> None:
    """Inside a count (:func:`peak_bytes`): record the peak so far under ``label`` (the peak of
    a phase of the function, e.g. a step's Hessian-vector products before its update); nothing
    outside one."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for m in _get_current_dispatch_mode_stack():
        if isinstance(m, LiveBytes):
            m.marks[label] = m.peak


@contextmanager
def fake_mode() -> Iterator[Any]:
    """A ``FakeTensorMode`` in which real tensors the code closes over (data, constants) are
    read as fake ones; yields the mode."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode

    # an operator that cannot run on fake tensors (gather with uint8 labels) is caught by the
    # caller, who counts on a real pass; torch logged each such failure as an ERROR traceback
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            yield mode
    finally:
        log.setLevel(level)


def like(x: Any) -> Any:
    """Inside :func:`fake_mode`: a tensor without data shaped like ``x`` (real or fake), with
    its dtype and device, not requiring grad; anything else as it is."""
    if not isinstance(x, Tensor):
        return x
    return torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)


def peak_bytes(run: Callable[..., Any], *inputs: Any,
               build: Callable[[], tuple[Any, ...]] | None = None,
               marks: dict[str, int] | None = None) -> int:
    """The peak bytes that ``run(*args)`` would allocate, counted on fake tensors: ``args`` are
    ``inputs`` (trees) with every tensor replaced by one :func:`like` it, then what ``build()``
    returns (made inside the fake mode: tangents, identity rows); neither is counted, as they
    exist before the call. ``marks``: filled with the peaks ``run`` recorded with :func:`mark`.
    Raises where the code cannot run on fake tensors (:data:`FAKE_ERRORS`)."""
    with fake_mode():
        args = tree_map(like, inputs)
        if build is not None:
            args = (*args, *build())
        del inputs
        with LiveBytes() as live:
            out = run(*args)
            del out
    if marks is not None:
        marks.update(live.marks)
    return live.peak


def _unused(packed: Any) -> Any:
    raise RuntimeError("hypergrad.footprint.saved_bytes: its graph is for counting only")


def saved_bytes(f: Callable[..., Any], params: dict[str, Tensor], buffers: dict[str, Tensor],
                lam: Tensor, fake: bool = True) -> int:
    """Bytes of the tensors the forward pass of ``f(params, buffers, lam)`` saves for backward:
    distinct storages, not counting the inputs' own (the weights a layer saves are shared by
    every column of a batched product, the activations are not). ``fake``: counted on fake
    tensors (nothing allocated; raises where the code cannot run fake), else on one real
    pass."""
    seen: dict[int, int] = {}
    inputs: set[int] = set()

    held: list[Tensor] = []  # alive for the pass (a freed storage's key is reused)

    def pack(x: Tensor) -> None:
        # the graph keeps nothing (it is never run backward): returning ``x`` tied a tensor
        # an op saves of its own output (tanh, log_softmax) into a cycle through its grad_fn
        # that Python's collector cannot see, so every Trainer built left ~10 tensors alive
        # (a real pass: its whole forward graph, 25 MB per fit of a 512-wide MLP)
        held.append(x)
        if x.layout == torch.strided:
            key = storage_key(x)
            if key not in inputs:
                seen[key] = int(x.untyped_storage().nbytes())

    def run(p: dict[str, Tensor], b: dict[str, Tensor], lm: Tensor) -> None:
        p = {k: v.detach().requires_grad_() for k, v in p.items()}
        b = {k: v.detach().requires_grad_() for k, v in b.items()}
        lm = lm.detach().requires_grad_()
        inputs.update(storage_key(x) for x in (*p.values(), *b.values(), lm))
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, _unused):
            f(p, b, lm)
        held.clear()

    if fake:
        with fake_mode():
            run(*tree_map(like, (params, buffers, lam)))
    else:
        run(params, buffers, lam)
    return sum(seen.values())
