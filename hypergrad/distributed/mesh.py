"""The ``data x columns`` mesh of ranks, sums over its groups, and how columns are dealt out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from .process import ON_DESTROY, collective, init, rank, world_size

__all__ = ["Mesh", "mesh", "all_sum", "all_sum_tree", "assign_columns"]


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
ON_DESTROY.append(_MESHES.clear)


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


def all_sum(tensors: list[Tensor], group: Any, what: str) -> list[Tensor]:
    """The elementwise sums over ``group`` of ``tensors`` (one all-reduce of one flat buffer per
    dtype and device; new tensors, the inputs are left alone). ``group=None``: the inputs."""
    if group is None or not tensors:
        return tensors
    out: list[Tensor] = list(tensors)
    by_dtype: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, x in enumerate(tensors):
        by_dtype.setdefault((x.dtype, x.device), []).append(i)
    for idx in by_dtype.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in idx])
        with collective(what):
            dist.all_reduce(flat, group=group)
        start = 0
        for i in idx:
            n = tensors[i].numel()
            out[i] = flat[start:start + n].view(tensors[i].shape)
            start += n
    return out


def all_sum_tree(tree: Any, group: Any, what: str) -> Any:
    """:func:`all_sum` of every tensor of a pytree."""
    leaves, spec = tree_flatten(tree)
    return tree_unflatten(all_sum(leaves, group, what), spec)


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
