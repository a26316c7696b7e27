"""Methods across ranks: forward mode with its tangent columns split, mini-batches split, or both
on a ``data x columns`` mesh; reverse mode with mini-batches split.

**Column parallel** (forward mode). Each rank owns a disjoint share of the K tangent columns
and runs the identical primal trajectory (same seeds, same batches, the same gradient computed
on every rank); it carries only its own columns (``ForwardMode.step(..., columns=...)``), so the
tangents take ``K / P`` of the memory per rank. The shares are balanced by the work they carry:
a column of a :class:`~hypergrad.Schedule` window that starts late is computed for fewer steps
(forward mode skips it until it starts), so the columns are dealt out longest-first to the least
loaded rank (:func:`~hypergrad.distributed.mesh.assign_columns`). Ranks do not talk during the
inner run: the hypergradient's slices are gathered (one all-reduce of K numbers over disjoint
rows, exact) by ``hypergradient_at``. The primal is replicated, so the speed-up is the share of
a step's time spent on the columns (``experiments/benchmarks/bench_distributed.py``).

**Data parallel** (forward or reverse mode; :mod:`hypergrad.distributed.shard`). The gradient
``g`` and the tangent products ``G`` are linear in the loss, so one all-reduce (sum) of both per
step gives exactly the full batch's values; the optimizer's update then runs on identical
inputs on every rank. Reverse mode splits the step's vector-Jacobian product the same way: the
update's VJP (first order, replicated) gives the gradient's cotangent ``u = (dU/dg)^T a``, each
rank backpropagates ``u`` through its shard's gradient (a double backward) and one all-reduce
sums ``H u`` and ``d(grad)/d lam^T u`` over the shards. The validation objective is computed in
full on every rank.

**Both**: ``ParallelForward(ForwardMode(), data=D, columns=C)`` on ``P = D * C`` ranks; rank
``r`` has data index ``r // C`` and column index ``r % C``.

Why no ``DistributedDataParallel``: DDP synchronises gradients in backward hooks that
``torch.autograd.grad`` and ``torch.func`` transforms do not fire, its all-reduce is invisible
to autograd (so second derivatives are not synchronised), and ``torch.func`` transforms fail on
DDP/FSDP-wrapped modules (pytorch/pytorch#102197, #182661; pytorch/functorch#1112). hypergrad
runs the model functionally on raw parameters anyway, so the collectives here are explicit,
on plain tensors, outside every transform.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.func import grad, vjp
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import RanksMismatchError, ResumeMismatchError
from ..hvp import HVPResult, HVPStrategy, LossFn
from ..methods.base import HyperGradient, MemoryEstimate, Method, OnlineMethod, Sizes
from ..methods.forward import ColumnPlan, ForwardMode, ForwardState
from ..methods.reverse import ReverseMode
from ..problem import InnerProblem, InnerState
from ..stepvjp import StepVJP
from .mesh import all_sum, all_sum_tree, assign_columns, mesh
from .process import collective, gather_objects, rank, world_size
from .shard import Shards, check_reduction

__all__ = ["ParallelForward", "ParallelReverse", "SummedHVP", "DataParallelVJP",
           "column_parallel", "data_parallel"]


_AGREED: weakref.WeakSet[InnerProblem] = weakref.WeakSet()
"""The problems every rank was found to hold the same of (:func:`check_same_problem`)."""


def check_same_problem(problem: InnerProblem, who: str) -> None:
    """Refuse ranks that hold different problems (other data, T, seed, model or initial
    values): each rank computes its own share of the columns or of the batch, so their sum
    would mix the problems into a hypergradient of none of them, without an error. Compared
    once per problem, on every rank at once (all raise together: none is left waiting in a
    collective): the facts a resume compares (:func:`~hypergrad.run.folder.problem_fingerprint`),
    gathered from every rank."""
    if world_size() == 1 or problem in _AGREED:
        return
    from ..run.folder import problem_fingerprint

    check_same_facts(problem_fingerprint(problem, {}, {}), who, "problems",
                     "Every rank must build the same problem (the same data and batches, T, "
                     "seed, model and initial values): each computes its share of the "
                     "hypergradient of that one problem (its columns, or its part of each "
                     "mini-batch). A DistributedSampler gives each rank other batches: give "
                     "every rank the whole DataLoader (data_parallel splits each mini-batch "
                     "itself).")
    _AGREED.add(problem)


def check_same_call(problem: InnerProblem, lam: Tensor, who: str) -> None:
    """Refuse ranks called with different ``lam`` or at different passes of a streamed batch
    source, at every hypergradient (one gather of a few numbers): the problem's comparison
    (:func:`check_same_problem`) runs once and sees neither, and a rank that ran one extra
    plain run (a log on rank 0 only) read the next shuffled pass, so the ranks' sum mixed two
    passes (0.37 to 11x off, silently; the distributed probe), as a rank given another point
    mixed two points (data parallel reverse mode returned a different vector on each rank)."""
    if world_size() == 1:
        return
    raw = lam.detach().to("cpu", torch.float64).contiguous()
    facts: dict[str, Any] = {
        "lam": f"{list(raw.shape)} {hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]}"}
    if problem.stream is not None:
        facts["batch source passes begun"] = problem.stream.passes
        facts["batch source's fixed pass"] = problem.stream.fixed_seed
    check_same_facts(
        facts, who, "arguments",
        "Every rank must call the method with the same lam (broadcast it from rank 0: "
        "torch.distributed.broadcast(lam, 0)) and read the same passes of a streamed batch "
        "source: run anything that reads the problem (problem.run, a hypergradient, a log of "
        "the validation loss) on every rank, not on rank 0 only.")


def check_same_facts(facts: dict[str, Any], who: str, what: str, fix: str) -> None:
    """Refuse ranks whose ``facts`` (a fingerprint: plain values) differ, on every rank at
    once (all raise together: none is left waiting in a collective), naming each rank's
    differing keys (rank 0's value -> theirs) and ``fix``."""
    from ..run.files import fingerprint_diff

    everyone = gather_objects(facts, f"comparing the ranks' {what}")
    differ = [(r, d) for r, fp in enumerate(everyone) if (d := fingerprint_diff(everyone[0], fp))]
    if differ:
        shown = "\n  ".join(f"rank {r}: {', '.join(d[:3])}{' ...' if len(d) > 3 else ''}"
                            for r, d in differ[:4])
        raise RanksMismatchError(
            f"{who}: the processes hold different {what} (rank 0's value -> theirs):\n  "
            f"{shown}\n{fix}")


class SummedHVP(HVPStrategy):
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
            g, G = all_sum_tree((g, G), self.group, "the gradient and its tangents")
        return g, new_b, G, zb_new

    def columns_per_call(self, f: LossFn, params: dict[str, Tensor], buffers: dict[str, Tensor],
                         lam: Tensor, k: int) -> int:
        return self.inner.columns_per_call(f, params, buffers, lam, k)

    def column_bytes(self, activation_bytes: float, param_bytes: float) -> float:
        return self.inner.column_bytes(activation_bytes, param_bytes)

    def __repr__(self) -> str:
        return repr(self.inner)


class ParallelForward(OnlineMethod):
    """A forward-type method (:class:`~hypergrad.ForwardMode`, :class:`~hypergrad.MARTHE`) over
    a ``data x columns`` mesh of ranks (see the module docstring).

    Args:
        forward: the method to run (its HVP strategy, tangent rule, column skipping, discount);
            default ``ForwardMode()``.
        data: ranks that split each mini-batch; columns: ranks that split the K tangent columns;
            ``data * columns`` must be the number of processes (one may be left ``None``; both
            ``None``: all ranks split the columns).
        reduction: ``"mean"`` (default): the training loss is a mean over the batch's examples,
            each rank's weighted by its share; ``"sum"``: a sum over them.

    Outside a multi-process launch it runs ``forward`` on one rank that holds every column.

    Example:
        >>> # torchrun --nproc_per_node=4 tune.py
        >>> method = ParallelForward(ForwardMode(), data=2, columns=2)  # doctest: +SKIP
        >>> hg = method.hypergradient(problem, problem.init_raw())       # doctest: +SKIP
    """

    def __init__(self, forward: ForwardMode | None = None, *, data: int | None = None,
                 columns: int | None = None, reduction: str = "mean") -> None:
        forward = ForwardMode() if forward is None else forward
        if not isinstance(forward, ForwardMode):
            raise TypeError(f"ParallelForward: forward must be a ForwardMode (or MARTHE), got "
                            f"{type(forward).__name__}.")
        self.base = forward
        self.name = forward.name
        self.mesh = mesh(data, columns)
        self.reduction = check_reduction("ParallelForward", reduction)
        self.runner = forward.with_hvp(SummedHVP(forward.hvp, self.mesh.data_group))
        self._shards = Shards(self.mesh, self.reduction, weight_state=True)
        self._assignments: weakref.WeakKeyDictionary[InnerProblem, list[list[int]]] = (
            weakref.WeakKeyDictionary())

    # -- columns ---------------------------------------------------------------------------------
    def assignment(self, problem: InnerProblem) -> list[list[int]]:
        """The columns of each column index (rank ``r`` holds ``assignment[r % columns]``)."""
        got = self._assignments.get(problem)
        if got is None or sum(map(len, got)) != problem.num_hyperparams:
            costs = ColumnPlan(problem).costs(self.base.skip_zero_columns)
            got = self._assignments[problem] = assign_columns(costs, self.mesh.columns)
        return got

    def columns(self, problem: InnerProblem) -> list[int] | None:
        """The columns this rank holds, in the order of its tangents' rows (``None``: all)."""
        if self.mesh.columns == 1:
            return None
        return self.assignment(problem)[self.mesh.column_index]

    # -- the online protocol ---------------------------------------------------------------------
    def init(self, problem: InnerProblem, lam: Tensor,
             state: InnerState | None = None) -> ForwardState:
        check_same_problem(problem, "ParallelForward")
        check_same_call(problem, lam, "ParallelForward")
        return self.runner.init(problem, lam, state, columns=self.columns(problem))

    def step(self, problem: InnerProblem, fs: ForwardState, lam: Tensor) -> ForwardState:
        return self.runner.step(self._shards(problem), fs, lam, columns=self.columns(problem))

    def hypergradient_at(self, problem: InnerProblem, fs: ForwardState,
                         lam: Tensor) -> tuple[Tensor, Tensor]:
        """``(E, dE/dlam)``: each rank's rows for its columns, gathered (one all-reduce over
        disjoint rows: exact)."""
        held = self.columns(problem)
        if held == []:  # more column ranks than columns: this rank holds none, its rows are 0
            s = fs.state
            value = problem.objective(s.params, s.buffers, lam).detach()
            hg = torch.zeros_like(lam)
        else:
            value, hg = self.runner.hypergradient_at(problem, fs, lam, columns=held)
        if held is not None:
            (hg,) = all_sum([hg], self.mesh.column_group, "gathering the hypergradient")
        return value, hg

    def truncate(self, fs: ForwardState) -> ForwardState:
        return self.runner.truncate(fs)

    def resolve(self, problem: InnerProblem, mode: str = "offline",
                memory_budget: float | None = None) -> tuple[Method, str]:
        return self, ""

    def estimate_memory(self, problem: InnerProblem,
                        sizes: Sizes | None = None) -> MemoryEstimate | None:
        return self.base.estimate_memory(problem, sizes)

    def fingerprint(self) -> dict[str, Any]:
        return {**self.base.fingerprint(), "distributed.mesh": [self.mesh.data,
                                                                self.mesh.columns]}

    def across_ranks(self, ranks: Any) -> Method:
        return self

    # -- checkpoints: all K columns, as one process would write them ------------------------------
    def state_dict(self, problem: InnerProblem, run: Any) -> dict[str, Any]:
        """The run with its tangent rows gathered into all K columns on rank 0 (every rank
        must call it), so a checkpoint reads like one of a single process."""
        spec = tree_flatten(run.tangents)[1]
        full = run._replace(tangents=tree_unflatten(self._gather(problem, run), spec))
        return self.base.state_dict(problem, full)

    def load_state_dict(self, problem: InnerProblem, lam: Tensor, entry: dict[str, Any],
                        where: str = "the checkpoint") -> ForwardState:
        """This rank's rows of a checkpoint's K columns."""
        run = self.base.load_state_dict(problem, lam, entry, where)
        held = self.columns(problem)
        if held is None:
            return run
        leaves, spec = tree_flatten(run.tangents)
        k = problem.num_hyperparams
        if leaves and leaves[0].shape[0] != k:
            raise ResumeMismatchError(
                f"ParallelForward: the checkpoint's tangents have {leaves[0].shape[0]} columns, "
                f"the problem has K={k}; it was not written by a run of this problem.")
        mine = [v[held].clone() for v in leaves]
        return run._replace(tangents=tree_unflatten(mine, spec))

    def _gather(self, problem: InnerProblem, fs: ForwardState) -> list[Tensor]:
        leaves = tree_flatten(fs.tangents)[0]
        held = self.columns(problem)
        if held is None or self.mesh.data_index != 0:
            return leaves
        k = problem.num_hyperparams
        idx = torch.tensor(held, dtype=torch.long, device=leaves[0].device if leaves else None)
        out = []
        for v in leaves:
            full = v.new_zeros((k, *v.shape[1:])).index_copy_(0, idx, v)
            with collective("gathering the tangents for a checkpoint"):
                dist.reduce(full, dst=0, group=self.mesh.column_group)
            out.append(full if rank() == 0 else v)
        return out

    def __repr__(self) -> str:
        return (f"ParallelForward({self.base!r}, data={self.mesh.data}, "
                f"columns={self.mesh.columns})")


class DataParallelVJP(StepVJP):
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
            g = all_sum_tree(g_own, self.group, f"the gradient of step {t}")
            _, vjp_u = vjp(update, w, o, g, lam)  # type: ignore[misc]
            a_w, a_o, u, a_lam = vjp_u((adj.params, adj.opt))
            hu_w, hu_lam = all_sum_tree(vjp_g(u), self.group,
                                        f"the vector-Jacobian product of step {t}")
        return InnerState({k: a_w[k] + hu_w[k] for k in w}, {}, a_o), a_lam + hu_lam


class ParallelReverse(ReverseMode):
    """Reverse mode with each mini-batch split across ``data`` ranks (all of them by default;
    see the module docstring). Its truncation and checkpointing are ``reverse``'s; the step's VJP
    is split as described there (``reverse.step_vjp`` is not used). ``reduction``: how the
    training loss combines a batch's examples, as :class:`ParallelForward`'s (``"mean"``, the
    default, or ``"sum"``)."""

    def __init__(self, reverse: ReverseMode | None = None, *, data: int | None = None,
                 reduction: str = "mean") -> None:
        reverse = ReverseMode() if reverse is None else reverse
        if type(reverse) is not ReverseMode:
            raise TypeError(f"ParallelReverse: reverse must be a ReverseMode, got "
                            f"{type(reverse).__name__}.")
        m = mesh(data, 1 if data is None else None)
        if m.columns != 1:
            raise ValueError(f"ParallelReverse: data={data} ranks, but the job has "
                             f"{world_size()} processes; reverse mode has no columns to split: "
                             f"data must be the number of processes.")
        super().__init__(truncate=reverse.truncate, checkpoint=reverse.checkpoint,
                         step_vjp=DataParallelVJP(m.data_group))
        self.mesh = m
        self.reduction = check_reduction("ParallelReverse", reduction)
        self.base = reverse
        self._shards = Shards(self.mesh, self.reduction)

    def hypergradient(self, problem: InnerProblem, lam: Tensor) -> HyperGradient:
        check_same_problem(problem, "ParallelReverse")
        check_same_call(problem, lam, "ParallelReverse")
        if self.mesh.data == 1:
            return self.base.hypergradient(problem, lam)
        return super().hypergradient(self._shards(problem), lam)

    def fingerprint(self) -> dict[str, Any]:
        return {**self.base.fingerprint(), "distributed.mesh": [self.mesh.data, 1]}

    def across_ranks(self, ranks: Any) -> Method:
        return self

    def __repr__(self) -> str:
        return f"ParallelReverse({self.base!r}, data={self.mesh.data})"


def column_parallel(forward: ForwardMode | None = None) -> ParallelForward:
    """Forward mode with the K tangent columns split across all ranks."""
    return ParallelForward(forward, data=1)


def data_parallel(method: ForwardMode | ReverseMode | None = None,
                  reduction: str = "mean") -> ParallelForward | ParallelReverse:
    """Forward (default) or reverse mode with every mini-batch split across all ranks."""
    if method is None or isinstance(method, ForwardMode):
        return ParallelForward(method, columns=1, reduction=reduction)
    if type(method) is ReverseMode:
        return ParallelReverse(method, reduction=reduction)
    raise TypeError(f"data_parallel: method must be a ForwardMode or a ReverseMode, got "
                    f"{type(method).__name__}.")
