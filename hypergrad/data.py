"""Deterministic mini-batches, so every method (and a resumed run) sees the same batch at step t."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MiniBatches"]


class MiniBatches:
    """Callable ``t -> (*tensors[idx], idx)``: shuffled epochs drawn from ``seed``.

    Step ``t`` reads batch ``t % per_epoch`` of epoch ``t // per_epoch``; each epoch's permutation
    comes from ``seed + epoch``, so batches are reproducible without storing them. ``idx`` (the
    example indices, int64) lets a loss read per-example hyperparameters.

    Args:
        tensors: tensors with the same first dimension ``n``.
        batch_size: examples per batch (the last partial batch of an epoch is dropped).
        seed: seed of the shuffles; ``shuffle=False`` keeps the data order.
    """

    def __init__(self, *tensors: Tensor, batch_size: int, seed: int = 0,
                 shuffle: bool = True) -> None:
        if not tensors:
            raise ValueError("MiniBatches: give at least one tensor, e.g. MiniBatches(X, y, ...).")
        n = tensors[0].shape[0]
        for i, t in enumerate(tensors):
            if t.shape[0] != n:
                raise ValueError(
                    f"MiniBatches: tensor {i} has {t.shape[0]} rows, tensor 0 has {n}; all "
                    f"tensors need the same first dimension."
                )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size:
            raise ValueError(f"MiniBatches: batch_size={batch_size!r} must be an int >= 1.")
        if batch_size > n:
            raise ValueError(
                f"MiniBatches: batch_size={batch_size} is larger than the {n} examples; use "
                f"batch_size <= {n}."
            )
        self.tensors = tensors
        self.n = n
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.per_epoch = n // batch_size
        self._perm: tuple[int, Tensor] | None = None

    def indices(self, t: int) -> Tensor:
        epoch, i = divmod(t, self.per_epoch)
        if not self.shuffle:
            perm = torch.arange(self.n)
        elif self._perm is not None and self._perm[0] == epoch:
            perm = self._perm[1]
        else:
            g = torch.Generator().manual_seed(self.seed + epoch)
            perm = torch.randperm(self.n, generator=g)
            self._perm = (epoch, perm)
        return perm[i * self.batch_size:(i + 1) * self.batch_size]

    def __call__(self, t: int) -> tuple[Tensor, ...]:
        idx = self.indices(t)
        dev = self.tensors[0].device
        idx_d = idx.to(dev)
        return (*(x[idx_d] for x in self.tensors), idx_d)
