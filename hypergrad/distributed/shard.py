"""Data parallelism's view of a problem: each rank's shard of every mini-batch.

Each rank takes a shard of every mini-batch (``torch.tensor_split`` of every batch tensor along
its first axis: sizes differ by at most one) and its training loss is weighted by ``n_rank / N``
(``reduction="mean"``, for a loss that is a mean over the batch's examples; ``"sum"``: weight 1).
The gradient and the tangent products are linear in the loss, so one all-reduce (sum) gives
exactly the full batch's values, whatever the shard sizes.

Data parallelism refuses models with a BatchNorm that trains (running statistics or not) and
losses that draw random numbers (dropout): a shard's batch statistics and dropout masks differ
from the full batch's, so the result would be another function than the single-process step.
"""

from __future__ import annotations

import itertools
import math
import weakref
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..data import partial_last_batch
from ..problem import InnerProblem, InnerState, is_plain
from .mesh import Mesh, all_sum_tree

__all__ = ["shard_batch", "ShardedProblem", "Shards", "check_reduction", "check_decomposes"]


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
                         f"examples or fewer data-parallel ranks (a DataLoader's last partial "
                         f"batch of an epoch: give it drop_last=True).")
    out = [x.tensor_split(parts, dim=0)[index] if isinstance(x, Tensor) and x.ndim >= 1 else x
           for x in leaves]
    m = next(x.shape[0] for x in out if isinstance(x, Tensor) and x.ndim >= 1)
    return tree_unflatten(out, spec), m, n


def weighted_shard(batch: Any, index: int, parts: int, reduction: str) -> tuple[Any, float]:
    """Shard ``index`` of ``parts`` of a mini-batch (:func:`shard_batch`) and the weight of its
    training loss in the whole batch's: its share of the examples (``reduction="mean"``) or 1
    (``"sum"``)."""
    shard, m, n = shard_batch(batch, index, parts)
    return shard, (m / n if reduction == "mean" else 1.0)


def check_reduction(api: str, reduction: str) -> str:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"{api}: reduction={reduction!r}; use 'mean' (the training loss is a "
                         f"mean over the batch's examples) or 'sum' (a sum over them).")
    return reduction


def check_decomposes(problem: InnerProblem, parts: int, reduction: str) -> None:
    """Refuse a training loss that is not the weighted sum of its shards' losses, on the first
    mini-batch and up to :data:`DECOMPOSE_STEPS` later ones (:meth:`InnerProblem.later_batches
    <hypergrad.InnerProblem.later_batches>`), at the initial point (each rank computes every
    shard: no collective): a batch whose first axis is not its examples (a sequence-first RNN
    batch: each rank got half of the time steps, 6 % off one process), a penalty under
    ``reduction="sum"`` (counted once per rank: 16 % off) or a loss of the other reduction were
    summed into another hypergradient without an error. Checked at the initial point and at one
    moved from it (seeded): a mean weighted by per-example weights and normalised by their sum,
    ``(w * l).sum() / w.sum()``, is the plain mean where every weight is 1, and passed, while
    its data-parallel hypergradient was 16 % off one process's (the distributed probe,
    2026-12-07). Later batches: ``cross_entropy``'s ``ignore_index`` divides by the labels it
    counts, which is the batch size on a batch without padding; padding in later batches only
    passed the first batch's check and the hypergradient was 56 % off (the probe of
    2026-12-07, evening)."""
    lam0 = problem.init_raw()
    s0 = problem.initial_state(lam0)
    moved = lam0 + 0.3 * torch.randn(lam0.shape, generator=torch.Generator().manual_seed(0),
                                     dtype=torch.float64).to(lam0)
    batches = itertools.chain([(0, problem.first_batch())],
                              problem.later_batches(DECOMPOSE_STEPS))
    for t, batch in batches:
        for at, lam in (("at the initial hyperparameters", lam0),
                        ("at hyperparameters moved from the initial ones", moved)):
            with torch.no_grad():
                whole = float(problem.train_objective(s0.params, s0.buffers, lam, t, batch)[0])
                pieces = 0.0
                for i in range(parts):
                    shard, weight = weighted_shard(batch, i, parts, reduction)
                    loss = float(problem.train_objective(s0.params, s0.buffers, lam, t,
                                                         shard)[0])
                    pieces += loss * weight
            if not (math.isfinite(whole) and math.isfinite(pieces)):
                continue  # a point outside what the loss takes (a square root of a moved value)
            _refuse_undecomposed(whole, pieces, parts, reduction, t, at, problem.dtype)


DECOMPOSE_STEPS = 8
"""How many mini-batches after the first :func:`check_decomposes` reads."""


def _refuse_undecomposed(whole: float, pieces: float, parts: int, reduction: str, t: int,
                         at: str, dtype: torch.dtype) -> None:
    tol = 1e3 * torch.finfo(dtype).eps * max(abs(whole), abs(pieces), 1e-30)
    if not abs(whole - pieces) <= tol:
        weights = "its share of the examples" if reduction == "mean" else "1"
        which = "the first mini-batch" if t == 0 else f"the mini-batch of step {t}"
        raise ValueError(
            f"hypergrad.distributed: on {which} {at}, the training loss is "
            f"{whole:.6g}, "
            f"but the sum of its {parts} data-parallel shards' losses, each weighted by "
            f"{weights} (reduction={reduction!r}), is {pieces:.6g}: data parallelism would "
            f"compute another hypergradient than one process. Data parallelism splits every "
            f"batch tensor along its first axis. Check that axis: it must be the "
            f"examples (a sequence-first batch, an RNN with batch_first=False, splits time: "
            f"put the examples first); that the reduction is the loss's (a mean over the "
            f"examples: 'mean'; a sum: 'sum'); and with 'sum', every term must be a sum over "
            f"the examples (a penalty would count once per rank: write the loss as a mean plus "
            f"the penalty, with reduction='mean'); a mean normalised by weights summed over "
            f"the batch (w * l).sum() / w.sum(), or over the labels it counts "
            f"(cross_entropy's ignore_index on padding, a masked mean), does not split by "
            f"examples: divide by the batch size instead (e.g. cross_entropy(..., "
            f"reduction='sum', ignore_index=...) / len(batch)). Or use "
            f"column_parallel(...), which does not split the batches.")


def _check_last_batch(problem: InnerProblem, parts: int) -> None:
    """Refuse up front a DataLoader whose last partial batch of an epoch, which the run
    reaches, has fewer examples than ranks: it was refused at that step, after the steps
    before it (29 examples in batches of 7 over 2 ranks: at step 4 of 6; the distributed
    probe)."""
    found = (None if problem.stream is None else
             partial_last_batch(problem.stream.source))
    if found is None:
        return
    n, bs, last = found
    if n > bs and last < parts and problem.steps > n // bs:
        raise ValueError(
            f"hypergrad.distributed: the DataLoader's last batch of an epoch holds {last} of "
            f"its {n} examples (batch_size={bs}), which step {n // bs} reads, and a batch "
            f"cannot be split over {parts} data-parallel ranks with fewer examples than ranks. "
            f"Give the DataLoader drop_last=True, or a batch size that divides {n}.")


class ShardedProblem(InnerProblem):
    """A data-parallel rank's view of ``source``: the same model, hyperparameters, optimizer,
    horizon, validation loss and seed; its shard of every batch, the training loss weighted by
    the shard's share of the batch, and (plain steps) the gradient summed over ``group``.

    Its batches are ``(shard, weight)`` pairs; ``source``'s ``train_loss`` sees the shard.
    """

    def __init__(self, source: InnerProblem, index: int, parts: int, group: Any,
                 reduction: str = "mean", weight_state: bool = False) -> None:
        check_data_parallel(source, weight_state)
        _check_last_batch(source, parts)  # before check_decomposes reads that batch
        check_decomposes(source, parts, reduction)

        def batches(t: int) -> tuple[Any, float]:
            return weighted_shard(source.batch(t), index, parts, reduction)

        def train_loss(model: Any, batch: tuple[Any, float], hp: Any) -> Tensor:
            shard, weight = batch
            loss = source.train_loss(model, shard, hp)
            return loss if weight == 1.0 else loss * weight

        super().__init__(source.fmodel.module, train_loss, source.optimizer, source.hyperparams,
                         batches, source.steps, source.val_loss, source.val_mode, source.seed)
        self.source = source
        self.group = group

    @property
    def stream(self) -> Any:
        """The source's stream: a rank's inner runs begin the source's passes (every rank
        the same ones), and its shard of each batch is cut from them."""
        return self.source.stream

    def step(self, state: InnerState, lam: Tensor, t: int) -> InnerState:
        """A plain step with the gradient summed over the data group. Under a function
        transform the all-reduce would be invisible to it: reverse mode differentiates the step
        by :class:`~hypergrad.distributed.parallel.DataParallelVJP` instead."""
        if not is_plain(state, lam):
            raise RuntimeError(
                "hypergrad.distributed: a data-parallel step cannot run under a function "
                "transform or autograd (its all-reduce is invisible to them); use "
                "data_parallel(ReverseMode()) or data_parallel(ForwardMode()).")
        g, new_b = self.gradient(state, lam, t)
        g = all_sum_tree(g, self.group, f"the gradient of step {t}")
        with torch.no_grad():
            params, opt = self.update(g, state.opt, state.params, lam, t)
        return InnerState(params, new_b, opt)


def check_data_parallel(problem: InnerProblem, weight_state: bool = False) -> None:
    """Refuse what data parallelism would change: BatchNorm statistics (and other state forward
    updates from the batch), random draws. ``weight_state``: keep spectral_norm's vectors,
    which follow the weights alone (data-parallel forward mode carries them exactly; reverse
    mode's summed adjoints do not: 1.5 % off one process, measured); without it they are
    refused for that reason, naming forward mode."""
    fm = problem.fmodel
    if problem.draws is None:  # the probe: random draws, and the buffers forward updates
        problem.check(problem.init_raw())
    # a BatchNorm that trains normalises by its batch's statistics, running statistics or not
    # (track_running_stats=False has none); one the user put in eval mode uses fixed ones.
    # spectral_norm's vectors follow the weights alone: every rank updates them alike
    batch_norms = sorted(name for name, m in fm.module.named_modules()
                         if isinstance(m, _BatchNorm) and fm.train_modes[name])
    weights_only = set(fm.sn_buffer_names) if weight_state else set()
    state = sorted(set(fm.initial_buffers()) - weights_only)
    if state and not batch_norms and set(state) <= set(fm.sn_buffer_names):
        # not batch statistics: every rank updates them alike, but reverse mode's summed
        # adjoints would count their part once per rank
        raise ValueError(
            f"hypergrad.distributed: data-parallel reverse mode cannot carry spectral_norm's "
            f"vectors ({state}): they follow the weights alone, but its adjoints, summed over "
            f"the ranks, would count their part once per rank (another hypergradient than one "
            f"process's). Use forward mode: data_parallel(ForwardMode()) keeps them, exact to "
            f"1e-12 (a Trainer under Ranks(): method='forward'); or reverse mode in one "
            f"process.")
    if state or batch_norms:
        raise ValueError(
            f"hypergrad.distributed: data parallelism needs a model without BatchNorm running "
            f"statistics or batch statistics (this one has "
            f"{batch_norms or sorted(set(fm.initial_buffers()) - weights_only)}): each rank "
            f"would normalise its shard by the shard's own batch statistics (or update such "
            f"state from its shard), another function than the single-process step. Use "
            f"column_parallel(...), or GroupNorm/LayerNorm"
            + (" (spectral_norm's vectors: data_parallel(ForwardMode()) keeps them)."
               if fm.sn and not weight_state else "."))
    if problem.draws:
        raise ValueError(
            "hypergrad.distributed: data parallelism needs a training loss that draws no random "
            "numbers (dropout, noise): a shard draws other masks than the full batch, so the "
            "result would be another function than the single-process step. Use "
            "column_parallel(...) (every rank draws the full batch's masks).")


class Shards:
    """Each problem's data-parallel view on this rank, made once."""

    def __init__(self, m: Mesh, reduction: str, weight_state: bool = False) -> None:
        self.mesh, self.reduction, self.weight_state = m, reduction, weight_state
        self._views: weakref.WeakKeyDictionary[InnerProblem, InnerProblem] = (
            weakref.WeakKeyDictionary())

    def __call__(self, problem: InnerProblem) -> InnerProblem:
        if self.mesh.data == 1 or isinstance(problem, ShardedProblem):
            return problem
        view = self._views.get(problem)
        if view is None:
            view = self._views[problem] = ShardedProblem(
                problem, self.mesh.data_index, self.mesh.data, self.mesh.data_group,
                self.reduction, self.weight_state)
        return view
