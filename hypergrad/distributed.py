"""Scale-out over processes with ``torch.distributed``: tangent columns split across ranks, mini-
batches split across ranks, or both on a 2-D mesh (data x columns). Launched with ``torchrun``.

**Column parallel** (:func:`column_parallel`, forward mode). Each rank owns a disjoint share of
the K tangent columns and runs the identical primal trajectory (same seeds, same batches, the
same gradient computed on every rank); it carries only its own columns, so the tangents take
``K / P`` of the memory per rank. The shares are balanced by the work they carry: a column of a
:class:`~hypergrad.Schedule` window that starts late is computed for fewer steps (forward mode
skips it until it starts), so the columns are dealt out longest-first to the least loaded rank
(:func:`assign_columns`). Ranks do not talk during the inner run: the hypergradient's slices are
gathered (one all-reduce of K numbers over disjoint rows, exact) by ``hypergradient_at``, i.e.
at the end of a run and at every online update. The primal is replicated, so the speed-up is
the share of a step's time spent on the columns (the HVP and the tangent update: most of it
from K of a few on; see ``experiments/benchmarks/bench_distributed.py``).

**Data parallel** (:func:`data_parallel`, forward or reverse mode). Each rank takes a shard of
every mini-batch (``torch.tensor_split`` of every batch tensor along its first axis: sizes
differ by at most one) and its training loss is weighted by ``n_rank / N`` (``reduction=
"mean"``, for a loss that is a mean over the batch's examples; ``"sum"``: weight 1). The
gradient ``g`` and the tangent products ``G`` (forward mode) are linear in the loss, so one
all-reduce (sum) of both per step gives exactly the full batch's values, whatever the shard
sizes; the optimizer's update then runs on identical inputs on every rank. Reverse mode splits
the step's vector-Jacobian product the same way: the update's VJP (first order, replicated)
gives the gradient's cotangent ``u = (dU/dg)^T a``, each rank backpropagates ``u`` through its
shard's gradient (a double backward, as :class:`~hypergrad.stepvjp.DoubleBackward`) and one
all-reduce sums ``H u`` and ``d(grad)/d lam^T u`` over the shards. The validation objective is
computed in full on every rank.

**Both**: ``ParallelForward(ForwardMode(), data=D, columns=C)`` on ``P = D * C`` ranks; rank
``r`` has data index ``r // C`` and column index ``r % C``; the ranks of one data index split
the columns, the ranks of one column index split the batch.

Why no ``DistributedDataParallel``: DDP synchronises gradients in backward hooks that
``torch.autograd.grad`` and ``torch.func`` transforms do not fire, its all-reduce is invisible
to autograd (so second derivatives are not synchronised), and ``torch.func`` transforms fail on
DDP/FSDP-wrapped modules (pytorch/pytorch#102197, #182661; pytorch/functorch#1112). hypergrad
runs the model functionally on raw parameters anyway, so the collectives here are explicit,
on plain tensors, outside every transform.

**Launching.** ``torchrun --nproc_per_node=P script.py`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous address; :func:`init` (called by the Trainer, the CLI and the
parallel methods on first use) starts the process group from them: ``gloo`` for CPU tensors and,
where CUDA is available, ``nccl`` for CUDA tensors (``"cpu:gloo,cuda:nccl"``), each rank on
``cuda:LOCAL_RANK`` (:func:`device`). A peer that dies makes the next collective fail at once; a
peer that hangs makes it fail after ``timeout`` seconds (default :data:`DEFAULT_TIMEOUT`, or
``HYPERGRAD_DIST_TIMEOUT``): :class:`~hypergrad.errors.DistributedError`, the process exits, and
torchrun stops the other ranks. Offline column-parallel ranks meet once per outer step, so the
timeout must exceed one outer step's duration.

Data parallelism refuses models with BatchNorm running statistics and losses that draw random
numbers (dropout): a shard's batch statistics and dropout masks differ from the full batch's, so
the result would be another function than the single-process step. Column parallelism has no
such limit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.func import grad, grad_and_value, vjp
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import DistributedError, ResumeMismatchError
from .forward import ForwardMode, ForwardState
from .hvp import HVPResult, HVPStrategy, LossFn
from .method import HyperGradient, Method, OnlineMethod
from .problem import InnerProblem, InnerState, _plain
from .reverse import ReverseMode
from .stepvjp import StepVJP

__all__ = ["init", "launched", "active", "rank", "world_size", "is_writer", "device", "Mesh",
           "mesh", "assign_columns", "shard_batch", "ParallelForward", "ParallelReverse",
           "column_parallel", "data_parallel", "wrap", "DEFAULT_TIMEOUT", "TIMEOUT_ENV",
           "DistributedConf"]

DEFAULT_TIMEOUT: float = 600.0
"""Seconds a collective waits for a peer before the job fails (10 minutes)."""
TIMEOUT_ENV = "HYPERGRAD_DIST_TIMEOUT"

_STATE: dict[str, Any] = {"timeout": None, "data": None}
log = logging.getLogger("hypergrad")


# -- the process group ---------------------------------------------------------------------------
def launched() -> bool:
    """Whether this process was started by ``torchrun`` (or another launcher that sets
    ``WORLD_SIZE`` and ``RANK``) with more than one process."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ
    except ValueError:
        return False


def active() -> bool:
    """Whether a process group of more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    return dist.get_rank() if active() else 0


def world_size() -> int:
    """The number of processes (1 when not distributed)."""
    return dist.get_world_size() if active() else 1


def is_writer() -> bool:
    """Whether this process writes files and logs: rank 0, or the only process."""
    return rank() == 0


def device() -> torch.device:
    """The device this rank should put its model on: ``cuda:LOCAL_RANK`` where CUDA is available
    (one GPU per rank), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _timeout(timeout: float | None) -> float:
    if timeout is None:
        env = os.environ.get(TIMEOUT_ENV)
        try:
            timeout = float(env) if env else DEFAULT_TIMEOUT
        except ValueError:
            raise ValueError(f"hypergrad.distributed: {TIMEOUT_ENV}={env!r} must be seconds, "
                             f"e.g. {TIMEOUT_ENV}=600.") from None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"hypergrad.distributed.init: timeout={timeout!r} must be seconds > 0, "
                         f"e.g. timeout=600.")
    return float(timeout)


def init(timeout: float | None = None, backend: str | None = None, *,
         data_parallel: int | None = None, init_method: str = "env://",
         rank: int | None = None, world_size: int | None = None) -> bool:
    """Start the process group from the launcher's environment (``torchrun``); returns whether
    this process is now one of several. Does nothing outside a multi-process launch, or when a
    process group is already running (yours is used as it is).

    Args:
        timeout: seconds a collective waits for a peer (default :data:`DEFAULT_TIMEOUT`, or the
            ``HYPERGRAD_DIST_TIMEOUT`` environment variable). It must exceed the time between
            two collectives: one outer step offline with column parallelism.
        backend: default ``"cpu:gloo,cuda:nccl"`` where CUDA is available, else ``"gloo"``.
        data_parallel: how many data-parallel ranks :func:`wrap` gives forward mode (the rest
            split the columns); ``None``: forward mode is column parallel over all ranks,
            reverse mode data parallel over all ranks.
        init_method, rank, world_size: as ``torch.distributed.init_process_group`` (tests start
            processes without torchrun this way).
    """
    if data_parallel is not None:
        if isinstance(data_parallel, bool) or not isinstance(data_parallel, int) \
                or data_parallel < 1:
            raise ValueError(f"hypergrad.distributed.init: data_parallel={data_parallel!r} must "
                             f"be None or an int >= 1 dividing the number of processes.")
        _STATE["data"] = data_parallel
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return dist.get_world_size() > 1
    if rank is None and not launched():
        return False
    seconds = _timeout(timeout)
    _STATE["timeout"] = seconds
    if backend is None:
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(device())
    dist.init_process_group(backend, init_method=init_method,
                            timeout=timedelta(seconds=seconds),
                            rank=-1 if rank is None else rank,
                            world_size=-1 if world_size is None else world_size)
    return dist.get_world_size() > 1


def _sync_device() -> torch.device:
    """Where the tensors of control messages live: the CPU unless the group has only NCCL."""
    return torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")


@contextlib.contextmanager
def _collective(what: str) -> Iterator[None]:
    """Turn a failed collective (a peer died, or did not arrive within the timeout) into a
    :class:`~hypergrad.errors.DistributedError` that says so."""
    try:
        yield
    except RuntimeError as err:
        if isinstance(err, DistributedError):
            raise
        t = _STATE["timeout"]
        raise DistributedError(
            f"hypergrad.distributed: rank {rank()} of {world_size()}: {what} failed: another "
            f"rank died or did not arrive within the timeout"
            f"{'' if t is None else f' ({t:g} s)'} ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}). The job "
            f"stops here; the failing rank's own error is in its output. A step slower than the "
            f"timeout needs a larger one ({TIMEOUT_ENV}=..., or init(timeout=...)).") from err


def barrier(what: str = "barrier") -> None:
    """All ranks meet (an all-reduce of one number on the CPU group, which obeys the timeout)."""
    if not active():
        return
    x = torch.zeros(1, device=_sync_device())
    with _collective(what):
        dist.all_reduce(x)


def broadcast_object(obj: Any, what: str = "broadcast") -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    box = [obj]
    with _collective(what):
        dist.broadcast_object_list(box, src=0)
    return box[0]


# -- the mesh ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mesh:
    """``data x columns`` ranks. ``data_index`` / ``column_index``: this rank's coordinates;
    ``column_group``: the ranks of this data index (they split the columns), ``data_group``: the
    ranks of this column index (they split the batch); ``None`` where that side has size 1."""

    data: int
    columns: int
    data_index: int
    column_index: int
    column_group: Any
    data_group: Any

    @property
    def size(self) -> int:
        return self.data * self.columns


_MESHES: dict[tuple[int, int], Mesh] = {}


def mesh(data: int | None = None, columns: int | None = None) -> Mesh:
    """The ``data x columns`` mesh over all ranks (one given: the other is the quotient; none:
    all ranks split the columns). Every rank must ask for the same meshes in the same order
    (the groups are created collectively, once per shape)."""
    init()
    p = world_size()
    for name, v in (("data", data), ("columns", columns)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"hypergrad.distributed.mesh: {name}={v!r} must be None or an int "
                             f">= 1.")
    if data is None and columns is None:
        data = 1
    if data is None:
        assert columns is not None
        data = p // columns if p % columns == 0 else -1
    if columns is None:
        columns = p // data if p % data == 0 else -1
    if data < 1 or columns < 1 or data * columns != p:
        raise ValueError(
            f"hypergrad.distributed.mesh: data={data if data > 0 else '?'} x columns="
            f"{columns if columns > 0 else '?'} ranks does not match the {p} processes of this "
            f"job; choose sizes whose product is {p} (torchrun --nproc_per_node sets it).")
    key = (data, columns)
    if key not in _MESHES:
        r = rank()
        col_group: Any = None
        data_group: Any = None
        if columns > 1:
            if data == 1:
                col_group = dist.group.WORLD
            else:
                for d in range(data):  # every rank creates every group, in the same order
                    g = dist.new_group([d * columns + j for j in range(columns)])
                    if d == r // columns:
                        col_group = g
        if data > 1:
            if columns == 1:
                data_group = dist.group.WORLD
            else:
                for c in range(columns):
                    g = dist.new_group([i * columns + c for i in range(data)])
                    if c == r % columns:
                        data_group = g
        _MESHES[key] = Mesh(data, columns, r // columns, r % columns, col_group, data_group)
    return _MESHES[key]


# -- collectives on trees ----------------------------------------------------------------------
def _sum_(tensors: list[Tensor], group: Any, what: str) -> list[Tensor]:
    """The elementwise sums over ``group`` of ``tensors`` (one all-reduce of one flat buffer per
    dtype; new tensors, the inputs are left alone)."""
    if group is None or not tensors:
        return tensors
    out: list[Tensor] = list(tensors)
    by_dtype: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, x in enumerate(tensors):
        by_dtype.setdefault((x.dtype, x.device), []).append(i)
    for idx in by_dtype.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in idx])
        with _collective(what):
            dist.all_reduce(flat, group=group)
        start = 0
        for i in idx:
            n = tensors[i].numel()
            out[i] = flat[start:start + n].view(tensors[i].shape)
            start += n
    return out


def _sum_tree(tree: Any, group: Any, what: str) -> Any:
    leaves, spec = tree_flatten(tree)
    return tree_unflatten(_sum_(leaves, group, what), spec)


# -- columns -------------------------------------------------------------------------------------
def assign_columns(costs: Sequence[float], parts: int) -> list[list[int]]:
    """Deal the columns (``costs[c]``: the work column ``c`` carries) to ``parts`` ranks,
    longest first, each to the least loaded rank (then the one with fewest columns): the
    classic LPT rule, within 4/3 of the best possible makespan. Returns each rank's columns,
    sorted. Deterministic, so every rank computes the same assignment."""
    owned: list[list[int]] = [[] for _ in range(parts)]
    loads = [0.0] * parts
    for c in sorted(range(len(costs)), key=lambda c: (-costs[c], c)):
        r = min(range(parts), key=lambda r: (loads[r], len(owned[r]), r))
        owned[r].append(c)
        loads[r] += costs[c]
    return [sorted(o) for o in owned]


def column_costs(problem: InnerProblem, skip_zero_columns: bool = True) -> list[float]:
    """Steps at which each column is computed: ``T`` minus the first step that reads it where
    forward mode skips columns that have not started (schedule windows), else ``T``."""
    from .forward import _Plan

    plan = _Plan(problem)
    if not skip_zero_columns:
        return [float(problem.steps)] * plan.k
    return [float(problem.steps - f) for f in plan.first_read]


# -- data shards ---------------------------------------------------------------------------------
def shard_batch(batch: Any, index: int, parts: int) -> tuple[Any, int, int]:
    """Shard ``index`` of ``parts`` of a mini-batch: every tensor with a first axis is split
    along it by ``torch.tensor_split`` (contiguous pieces, sizes differing by at most one);
    other leaves are kept. Returns ``(shard, examples in it, examples in the batch)``."""
    leaves, spec = tree_flatten(batch)
    sizes = {x.shape[0] for x in leaves if isinstance(x, Tensor) and x.ndim >= 1}
    if not sizes:
        raise ValueError("hypergrad.distributed: a data-parallel mini-batch needs tensors with a "
                         "first (example) axis to split; this one has none.")
    if len(sizes) > 1:
        raise ValueError(f"hypergrad.distributed: the tensors of a mini-batch have first axes of "
                         f"sizes {sorted(sizes)}; data parallelism splits them along that axis, "
                         f"so they must have one size (the number of examples).")
    n = sizes.pop()
    if n < parts:
        raise ValueError(f"hypergrad.distributed: a mini-batch of {n} examples cannot be split "
                         f"over {parts} data-parallel ranks; use batches of at least {parts} "
                         f"examples or fewer data-parallel ranks.")
    out = [x.tensor_split(parts, dim=0)[index] if isinstance(x, Tensor) and x.ndim >= 1 else x
           for x in leaves]
    m = next(x.shape[0] for x in out if isinstance(x, Tensor) and x.ndim >= 1)
    return tree_unflatten(out, spec), m, n


class _Shard(InnerProblem):
    """A data-parallel rank's view of a problem: its shard of every batch, the training loss
    weighted by the shard's share of the batch, and (plain steps) the gradient summed over the
    data group. Shares everything else with the problem (built without ``__init__``)."""

    _source: InnerProblem
    _index: int
    _parts: int
    _group: Any
    _reduction: str
    _weights: dict[int, float]

    @classmethod
    def of(cls, problem: InnerProblem, index: int, parts: int, group: Any,
           reduction: str) -> _Shard:
        view = cls.__new__(cls)
        view.__dict__.update(problem.__dict__)
        view._source, view._index, view._parts = problem, index, parts
        view._group, view._reduction, view._weights = group, reduction, {}
        return view

    def batch(self, t: int) -> Any:
        shard, m, n = shard_batch(InnerProblem.batch(self, t), self._index, self._parts)
        self._weights[t] = m / n if self._reduction == "mean" else 1.0
        return shard

    def train_objective(self, params: dict[str, Tensor], buffers: dict[str, Tensor],
                        lam: Tensor, t: int, batch: Any, fused: bool = False
                        ) -> tuple[Tensor, dict[str, Tensor]]:
        loss, new_b = super().train_objective(params, buffers, lam, t, batch, fused)
        if t not in self._weights:
            self.batch(t)
        w = self._weights[t]
        return (loss if w == 1.0 else loss * w), new_b

    def step(self, state: InnerState, lam: Tensor, t: int) -> InnerState:
        """A plain step with the gradient summed over the data group. Under a function
        transform the all-reduce would be invisible to it: reverse mode differentiates the step
        by :class:`_DataParallelVJP` instead."""
        if not _plain(state, lam):
            raise RuntimeError(
                "hypergrad.distributed: a data-parallel step cannot run under a function "
                "transform or autograd (its all-reduce is invisible to them); use "
                "data_parallel(ReverseMode()) or data_parallel(ForwardMode()).")
        batch = self.batch(t)
        if self.draws is False:
            g, new_b = self._eager_grad(state.params, state.buffers, lam, t, batch)
        else:
            g, new_b = torch.func.grad(self.train_objective, has_aux=True)(
                state.params, state.buffers, lam, t, batch)
        g = _sum_tree(g, self._group, f"the gradient of step {t}")
        with torch.no_grad():
            params, opt = self.update(g, state.opt, state.params, lam, t)
        return InnerState(params, new_b, opt)


def _check_data_parallel(problem: InnerProblem) -> None:
    if problem.fmodel.initial_buffers():
        raise ValueError(
            f"hypergrad.distributed: data parallelism needs a model without BatchNorm running "
            f"statistics (this one has {sorted(problem.fmodel.initial_buffers())}): each rank "
            f"would normalise its shard by the shard's own batch statistics, another function "
            f"than the single-process step. Use column_parallel(...), or GroupNorm/LayerNorm.")
    if problem.draws is None:
        problem.check(problem.init_raw())
    if problem.draws:
        raise ValueError(
            "hypergrad.distributed: data parallelism needs a training loss that draws no random "
            "numbers (dropout, noise): a shard draws other masks than the full batch, so the "
            "result would be another function than the single-process step. Use "
            "column_parallel(...) (every rank draws the full batch's masks).")


class _Views:
    """Each problem's data-parallel view, made once."""

    def __init__(self, m: Mesh, reduction: str) -> None:
        self.mesh, self.reduction = m, reduction
        self._views: weakref.WeakKeyDictionary[InnerProblem, InnerProblem] = (
            weakref.WeakKeyDictionary())

    def __call__(self, problem: InnerProblem) -> InnerProblem:
        if self.mesh.data == 1 or isinstance(problem, _Shard):
            return problem
        view = self._views.get(problem)
        if view is None:
            _check_data_parallel(problem)
            view = self._views[problem] = _Shard.of(problem, self.mesh.data_index,
                                                    self.mesh.data, self.mesh.data_group,
                                                    self.reduction)
        return view


def _check_reduction(api: str, reduction: str) -> str:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"{api}: reduction={reduction!r}; use 'mean' (the training loss is a "
                         f"mean over the batch's examples) or 'sum' (a sum over them).")
    return reduction


# -- forward mode --------------------------------------------------------------------------------
class _SummedHVP(HVPStrategy):
    """A strategy whose gradient and products are summed over the data group (each rank's loss
    is already weighted by its share), and that takes a step with no column at all (a rank whose
    columns have not started): the gradient alone, as the strategies compute it."""

    def __init__(self, inner: HVPStrategy, group: Any) -> None:
        super().__init__(inner.chunk_size, inner.memory_budget)
        self.inner, self.group = inner, group
        self.name = inner.name
        self.column_memory_factor = inner.column_memory_factor

    def __call__(self, f: LossFn, params: dict[str, Tensor], buffers: dict[str, Tensor],
                 lam: Tensor, zp: dict[str, Tensor], zb: dict[str, Tensor],
                 eye: Tensor) -> HVPResult:
        if eye.shape[0] == 0:
            (g, _, _), new_b = grad(f, argnums=(0, 1, 2), has_aux=True)(params, buffers, lam)
            G = {k: v.new_empty((0, *v.shape)) for k, v in params.items()}
            zb_new = {k: v.new_empty((0, *v.shape)) for k, v in new_b.items()} if buffers else {}
        else:
            g, new_b, G, zb_new = self.inner(f, params, buffers, lam, zp, zb, eye)
        if self.group is not None:
            g, G = _sum_tree((g, G), self.group, "the gradient and its tangents")
        return g, new_b, G, zb_new

    def columns_per_call(self, f: LossFn, params: dict[str, Tensor], buffers: dict[str, Tensor],
                         lam: Tensor, k: int) -> int:
        return self.inner.columns_per_call(f, params, buffers, lam, k)

    def column_bytes(self, activation_bytes: float, param_bytes: float) -> float:
        return self.inner.column_bytes(activation_bytes, param_bytes)

    def __repr__(self) -> str:
        return repr(self.inner)


class ParallelForward(ForwardMode):
    """Forward mode over a ``data x columns`` mesh of ranks (see the module docstring).

    Args:
        forward: the :class:`~hypergrad.ForwardMode` to run (its HVP strategy, tangent rule and
            column skipping); default ``ForwardMode()``.
        data: ranks that split each mini-batch; columns: ranks that split the K tangent columns;
            ``data * columns`` must be the number of processes (one may be left ``None``; both
            ``None``: all ranks split the columns).
        reduction: ``"mean"`` (default): the training loss is a mean over the batch's examples,
            each rank's weighted by its share; ``"sum"``: a sum over them.

    Outside a multi-process launch it is ``forward`` itself (one rank holds every column).

    Example:
        >>> # torchrun --nproc_per_node=4 tune.py
        >>> method = ParallelForward(ForwardMode(), data=2, columns=2)  # doctest: +SKIP
        >>> hg = method.hypergradient(problem, problem.init_raw())       # doctest: +SKIP
    """

    name = "forward"

    def __init__(self, forward: ForwardMode | None = None, *, data: int | None = None,
                 columns: int | None = None, reduction: str = "mean") -> None:
        forward = ForwardMode() if forward is None else forward
        if type(forward) is not ForwardMode:
            raise TypeError(f"ParallelForward: forward must be a ForwardMode, got "
                            f"{type(forward).__name__} (its own step is not split across ranks).")
        self.mesh = mesh(data, columns)
        self.reduction = _check_reduction("ParallelForward", reduction)
        super().__init__(_SummedHVP(forward.hvp, self.mesh.data_group), tangent=forward.tangent,
                         skip_zero_columns=forward.skip_zero_columns)
        self.base = forward
        self._views = _Views(self.mesh, self.reduction)
        self._shares: weakref.WeakKeyDictionary[InnerProblem, list[list[int]]] = (
            weakref.WeakKeyDictionary())

    def assignment(self, problem: InnerProblem) -> list[list[int]]:
        """The columns of each column index (rank ``r`` holds ``assignment[r % columns]``)."""
        key = problem._source if isinstance(problem, _Shard) else problem
        got = self._shares.get(key)
        if got is None or sum(map(len, got)) != problem.num_hyperparams:
            got = self._shares[key] = assign_columns(
                column_costs(key, self.skip_zero_columns), self.mesh.columns)
        return got

    def columns(self, problem: InnerProblem) -> list[int]:
        """The columns this rank holds, in the order of its tangents' rows."""
        return self.assignment(problem)[self.mesh.column_index]

    def _held(self, problem: InnerProblem) -> list[int] | None:
        return None if self.mesh.columns == 1 else self.columns(problem)

    def init(self, problem: InnerProblem, lam: Tensor,
             state: InnerState | None = None) -> ForwardState:
        return self._init(problem, lam, state, self._held(problem))

    def step(self, problem: InnerProblem, fs: ForwardState, lam: Tensor) -> ForwardState:
        return self._step(self._views(problem), fs, lam, self._held(problem))

    def hypergradient_at(self, problem: InnerProblem, fs: ForwardState,
                         lam: Tensor) -> tuple[Tensor, Tensor]:
        """``(E, dE/dlam)``: each rank's rows ``Z^T grad_s E + dE/dlam|direct`` for its columns,
        gathered (one all-reduce over disjoint rows: exact)."""
        held = self._held(problem)
        if held is None:
            return super().hypergradient_at(problem, fs, lam)
        s, z = fs.state, fs.tangents
        (dp, db, direct), value = grad_and_value(problem.objective, argnums=(0, 1, 2))(
            s.params, s.buffers, lam)
        idx = torch.tensor(held, dtype=torch.long, device=lam.device)
        part = direct.index_select(0, idx)
        for zs, ds in ((z.params, dp), (z.buffers, db)):
            for name, d in ds.items():
                part = part + zs[name].reshape(len(held), -1) @ d.reshape(-1)
        full = torch.zeros_like(direct).index_copy_(0, idx, part.detach())
        (full,) = _sum_([full], self.mesh.column_group, "gathering the hypergradient")
        return value.detach(), full

    def gather_tangents(self, problem: InnerProblem, fs: ForwardState) -> list[Tensor]:
        """All K tangent columns (the leaves of ``fs.tangents``, each ``(K, ...)``) on rank 0,
        for a checkpoint; other ranks get their own rows back. Every rank must call it."""
        leaves = tree_flatten(fs.tangents)[0]
        held = self._held(problem)
        if held is None or self.mesh.data_index != 0:
            return leaves
        k = problem.num_hyperparams
        idx = torch.tensor(held, dtype=torch.long, device=leaves[0].device if leaves else None)
        out = []
        for v in leaves:
            full = v.new_zeros((k, *v.shape[1:])).index_copy_(0, idx, v)
            with _collective("gathering the tangents for a checkpoint"):
                dist.reduce(full, dst=0, group=self.mesh.column_group)
            out.append(full if rank() == 0 else v)
        return out

    def local_tangents(self, problem: InnerProblem, leaves: list[Tensor]) -> list[Tensor]:
        """This rank's rows of checkpointed tangents (all K columns)."""
        held = self._held(problem)
        if held is None:
            return leaves
        k = problem.num_hyperparams
        if leaves and leaves[0].shape[0] != k:
            raise ResumeMismatchError(
                f"ParallelForward: the checkpoint's tangents have {leaves[0].shape[0]} columns, "
                f"the problem has K={k}; it was not written by a run of this problem.")
        return [v[held].clone() for v in leaves]

    def __repr__(self) -> str:
        return (f"ParallelForward({self.base!r}, data={self.mesh.data}, "
                f"columns={self.mesh.columns})")


# -- reverse mode --------------------------------------------------------------------------------
class _DataParallelVJP(StepVJP):
    """The step's VJP with the gradient summed over the data group (see the module docstring):
    the update's VJP replicated, the double backward of each shard's gradient summed."""

    name = "data_parallel"

    def __init__(self, group: Any) -> None:
        self.group = group

    def __call__(self, problem: InnerProblem, state: InnerState, lam: Tensor, t: int,
                 adj: InnerState) -> tuple[InnerState, Tensor]:
        batch = problem.batch(t)
        w, b, o = state

        def gradient(p: Any, lm: Tensor) -> Any:
            return grad(lambda p_, l_: problem.train_objective(p_, b, l_, t, batch)[0])(p, lm)

        def update(p: Any, opt: Any, g_: Any, lm: Tensor) -> Any:
            return problem.update(g_, opt, p, lm, t)

        with problem.second_order():
            g_own, vjp_g = vjp(gradient, w, lam)  # type: ignore[misc]
            g = _sum_tree(g_own, self.group, f"the gradient of step {t}")
            _, vjp_u = vjp(update, w, o, g, lam)  # type: ignore[misc]
            a_w, a_o, u, a_lam = vjp_u((adj.params, adj.opt))
            hu_w, hu_lam = _sum_tree(vjp_g(u), self.group,
                                     f"the vector-Jacobian product of step {t}")
        return InnerState({k: a_w[k] + hu_w[k] for k in w}, {}, a_o), a_lam + hu_lam


class ParallelReverse(ReverseMode):
    """Reverse mode with each mini-batch split across ``data`` ranks (all of them by default;
    see the module docstring). Its truncation and checkpointing are ``reverse``'s; the step's VJP
    is split as described there (``reverse.step_vjp`` is not used)."""

    name = "reverse"

    def __init__(self, reverse: ReverseMode | None = None, *, data: int | None = None,
                 reduction: str = "mean") -> None:
        reverse = ReverseMode() if reverse is None else reverse
        if type(reverse) is not ReverseMode:
            raise TypeError(f"ParallelReverse: reverse must be a ReverseMode, got "
                            f"{type(reverse).__name__}.")
        self.mesh = mesh(data, 1 if data is None else None)
        if self.mesh.columns != 1:
            raise ValueError(f"ParallelReverse: data={data} ranks, but the job has "
                             f"{world_size()} processes; reverse mode has no columns to split: "
                             f"data must be the number of processes.")
        self.reduction = _check_reduction("ParallelReverse", reduction)
        super().__init__(truncate=reverse.truncate, checkpoint=reverse.checkpoint,
                         step_vjp=_DataParallelVJP(self.mesh.data_group))
        self.base = reverse
        self._views = _Views(self.mesh, self.reduction)

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        if self.mesh.data == 1:
            return self.base.hypergradient(problem, lam)
        return super().hypergradient(self._views(problem), lam)

    def __repr__(self) -> str:
        return f"ParallelReverse({self.base!r}, data={self.mesh.data})"


# -- factories and the Trainer's hooks -----------------------------------------------------------
def column_parallel(forward: ForwardMode | None = None) -> ParallelForward:
    """Forward mode with the K tangent columns split across all ranks."""
    return ParallelForward(forward, data=1)


def data_parallel(method: ForwardMode | ReverseMode | None = None,
                  reduction: str = "mean") -> ParallelForward | ParallelReverse:
    """Forward (default) or reverse mode with every mini-batch split across all ranks."""
    if method is None or type(method) is ForwardMode:
        return ParallelForward(method, columns=1, reduction=reduction)
    if type(method) is ReverseMode:
        return ParallelReverse(method, reduction=reduction)
    raise TypeError(f"data_parallel: method must be a ForwardMode or a ReverseMode, got "
                    f"{type(method).__name__}.")


def wrap(method: Method) -> Method:
    """The method a Trainer runs under a multi-process launch: forward mode column parallel
    (or ``init(data_parallel=D)``'s mesh), reverse mode data parallel; a parallel method as it
    is. Outside a launch, ``method`` itself."""
    if not init() or isinstance(method, (ParallelForward, ParallelReverse)):
        return method
    if type(method) is ForwardMode:
        return ParallelForward(method, data=_STATE["data"])
    if type(method) is ReverseMode:
        return ParallelReverse(method)
    raise NotImplementedError(
        f"hypergrad.distributed: {type(method).__name__} does not run across processes; under "
        f"torchrun use forward mode (its columns split) or reverse mode (its batches split), "
        f"or run one process.")


def fingerprint(method: Method) -> dict[str, Any]:
    """What a checkpoint of a multi-process run records about its layout (nothing for one
    process, so single-process checkpoints are unchanged)."""
    if not active():
        return {}
    m = getattr(method, "mesh", None)
    out: dict[str, Any] = {"distributed.world_size": world_size()}
    if isinstance(m, Mesh):
        out["distributed.mesh"] = [m.data, m.columns]
    return out


def check_resume(old: dict[str, Any] | None, path: Path | str) -> None:
    """Refuse a checkpoint written under another number of processes, with the fix."""
    if old is None:
        return
    was, now = int(old.get("distributed.world_size", 1)), world_size()
    if was != now:
        how = (f"torchrun --nproc_per_node={was} ..." if was > 1 else
               "one process (no torchrun)")
        raise ResumeMismatchError(
            f"Trainer: cannot resume from {path}: it was written by a run of {was} "
            f"process{'es' if was > 1 else ''}, this run has {now}. A run resumes under the "
            f"world size it started with: relaunch with {how}, or start a new run (another "
            f"run_dir, or overwrite=True).")


def open_run_dir(trainer: Any, resume: bool, overwrite: bool) -> None:
    """Rank 0 opens the run folder (refuses, clears or loads, as one process does); the other
    ranks then load the same checkpoint, read-only (the folder must be one all ranks see)."""
    from .checkpoint import load_checkpoint

    if is_writer():
        trainer._open_run_dir(resume, overwrite)
    barrier("waiting for rank 0 to open the run folder")
    if not is_writer() and resume:
        got = load_checkpoint(trainer.run_dir, trainer.problem.device)
        if got is not None:
            trainer._load(*got)


def gather_tangents(method: Method, problem: InnerProblem, fs: ForwardState) -> list[Tensor]:
    """The tangents a checkpoint stores: all K columns (gathered on rank 0 when split)."""
    if isinstance(method, ParallelForward):
        return method.gather_tangents(problem, fs)
    return tree_flatten(fs.tangents)[0]


def local_tangents(method: Method, problem: InnerProblem, leaves: list[Tensor]) -> list[Tensor]:
    """This rank's share of checkpointed tangents."""
    if isinstance(method, ParallelForward):
        return method.local_tangents(problem, leaves)
    return leaves


def trainer_io(log_fn: Callable[[str], None], progress: bool, tensorboard: bool
               ) -> tuple[Callable[[str], None], bool, bool]:
    """A Trainer's log, progress bars and TensorBoard: as given on rank 0 (starting the
    process group under a launch), off on the other ranks (one copy of everything)."""
    init()
    if is_writer():
        return log_fn, progress, tensorboard
    return (lambda _msg: None), False, False


# -- the CLI ---------------------------------------------------------------------------------------
@dataclass
class DistributedConf:
    """The ``distributed`` group of ``hypergrad-run``'s config (used under ``torchrun`` only).

    timeout: seconds a collective waits for a peer (``None``: ``HYPERGRAD_DIST_TIMEOUT`` or
    :data:`DEFAULT_TIMEOUT`). data_parallel: data-parallel ranks of forward mode (the others
    split the columns; ``None``: all split the columns); reverse mode splits the batch over all.
    """

    timeout: Any = None
    data_parallel: Any = None


def setup_cli(conf: Any, run_dir: Path) -> Path:
    """``hypergrad-run`` under torchrun: start the process group, keep the logs of ranks other
    than 0 to warnings, and use rank 0's run folder on every rank (Hydra names it from the
    clock, which the ranks read apart). Returns the run folder."""
    timeout = getattr(conf, "timeout", None) if conf is not None else None
    data = getattr(conf, "data_parallel", None) if conf is not None else None
    if not init(timeout, data_parallel=data):
        return run_dir
    if not is_writer():
        logging.getLogger("hypergrad").setLevel(logging.WARNING)
    shared = Path(broadcast_object(str(run_dir), "agreeing on the run folder"))
    if shared != run_dir and not is_writer():
        with contextlib.suppress(OSError):  # the folder Hydra made for this rank alone
            for p in sorted(run_dir.rglob("*"), reverse=True):
                p.rmdir() if p.is_dir() else p.unlink()
            run_dir.rmdir()
    return shared


# -- the Trainer's checkpoints of an online run --------------------------------------------------
def checkpoint_method(method: OnlineMethod) -> OnlineMethod:
    """The method whose run state a checkpoint holds: a :class:`ParallelForward`'s own
    ForwardMode (all K columns), so a checkpoint reads like one of a single process."""
    return method.base if isinstance(method, ParallelForward) else method


def full_run(method: Method, problem: InnerProblem, run: Any) -> Any:
    """``run`` with a :class:`ParallelForward`'s tangent rows gathered into all K columns (on
    rank 0; every rank must call it); any other run as it is."""
    if not isinstance(method, ParallelForward) or not isinstance(run, ForwardState):
        return run
    spec = tree_flatten(run.tangents)[1]
    return run._replace(tangents=tree_unflatten(method.gather_tangents(problem, run), spec))


def local_run(method: Method, problem: InnerProblem, run: Any) -> Any:
    """The inverse of :func:`full_run` on resume: this rank's rows of a checkpoint's columns."""
    if not isinstance(method, ParallelForward) or not isinstance(run, ForwardState):
        return run
    leaves, spec = tree_flatten(run.tangents)
    return run._replace(tangents=tree_unflatten(method.local_tangents(problem, leaves), spec))


def follow_run_dir(run_dir: Path | None, resume: bool, device: torch.device) -> Any:
    """After rank 0 opened the run folder: the other ranks load the same checkpoint (read-only;
    the folder must be one all ranks see). ``None`` on rank 0, outside a launch, or when there
    is nothing to resume."""
    if not active():
        return None
    barrier("waiting for rank 0 to open the run folder")
    if is_writer() or not resume or run_dir is None:
        return None
    from .checkpoint import load_checkpoint

    return load_checkpoint(run_dir, device)
