"""scikit-learn's bundled ``load_digits`` (1797 8x8 images, 10 classes) as tensors, MLPs and a
small CNN over the images."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["DataSplit", "digits_data", "mlp", "digits_cnn"]


class DataSplit(NamedTuple):
    """Train / validation / test tensors: ``x`` of shape ``(n, 64)``, ``y`` int64 of ``(n,)``."""

    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor


def digits_data(n_train: int = 1000, n_val: int = 400, n_test: int | None = None, seed: int = 0,
                dtype: torch.dtype = torch.float32,
                device: torch.device | str | None = None) -> DataSplit:
    """Shuffled, standardized (with train statistics) splits of ``load_digits``.

    ``n_test=None`` takes every remaining example.
    """
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    n = len(y)
    if n_test is None:
        n_test = n - n_train - n_val
    if min(n_train, n_val, n_test) < 1 or n_train + n_val + n_test > n:
        raise ValueError(
            f"digits_data: n_train={n_train}, n_val={n_val}, n_test={n_test} must be >= 1 and "
            f"sum to at most {n} (the size of load_digits)."
        )
    perm = np.random.default_rng(seed).permutation(n)
    x, y = x[perm], y[perm]
    mean = x[:n_train].mean(0)
    std = x[:n_train].std(0) + 1.0  # +1: many border pixels are constant
    x = (x - mean) / std
    xt = torch.as_tensor(x, dtype=dtype, device=device)
    yt = torch.as_tensor(y, dtype=torch.int64, device=device)
    a, b, c = n_train, n_train + n_val, n_train + n_val + n_test
    return DataSplit(xt[:a], yt[:a], xt[a:b], yt[a:b], xt[b:c], yt[b:c])


def mlp(sizes: Sequence[int], activation: type[nn.Module] = nn.Tanh,
        batchnorm: bool = False) -> nn.Sequential:
    """``Linear -> [BatchNorm1d] -> activation`` blocks, then a final ``Linear``.

    With ``batchnorm=True`` the hidden Linear layers have no bias: BatchNorm removes it, and a
    bias whose gradient is rounding noise makes Adam's normalised updates ill-conditioned.
    """
    if len(sizes) < 2:
        raise ValueError(f"mlp: sizes={list(sizes)} needs at least an input and an output size.")
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 2):
        layers.append(nn.Linear(sizes[i], sizes[i + 1], bias=not batchnorm))
        if batchnorm:
            layers.append(nn.BatchNorm1d(sizes[i + 1]))
        layers.append(activation())
    layers.append(nn.Linear(sizes[-2], sizes[-1]))
    return nn.Sequential(*layers)


def digits_cnn(channels: Sequence[int] = (8, 16), num_classes: int = 10,
               activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """A small CNN over ``load_digits``' flattened 8x8 images (input ``(n, 64)``):
    ``conv3x3(1 -> c1) -> act -> conv3x3 stride 2 (c1 -> c2) -> act -> Linear(c2 * 4 * 4, 10)``.
    Six parameter tensors (a weight and a bias per layer), so a per-layer weight decay has six
    values."""
    if len(channels) != 2 or min(channels) < 1:
        raise ValueError(f"digits_cnn: channels={list(channels)} must be two ints >= 1.")
    c1, c2 = (int(c) for c in channels)
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, c1, 3, padding=1), activation(),
        nn.Conv2d(c1, c2, 3, stride=2, padding=1), activation(),
        nn.Flatten(), nn.Linear(c2 * 4 * 4, num_classes))
