"""Reference models of the kinds users train, written here so tests and benchmarks need no
download and no torchvision (whose PyPI wheel pinned to torch 2.13.0 is a CUDA build that does
not import beside the CPU torch).

- :func:`resnet18`: torchvision's ResNet-18 layout (BasicBlocks ``[2, 2, 2, 2]``, widths
  64-128-256-512, BatchNorm after every convolution, 1x1 strided downsample shortcuts, 7x7 stem
  with max pooling), same parameter shapes; ``width`` scales the channels for small tests.
- :class:`TransformerClassifier`: ``nn.TransformerEncoder`` (``batch_first``) over embedded
  tokens or projected features, mean-pooled, then a linear head.
- :class:`RNNClassifier`: ``nn.LSTM`` or ``nn.GRU`` over a sequence, the last output to a linear
  head; optionally an ``nn.Embedding`` in front.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["BasicBlock", "ResNet", "resnet18", "TransformerClassifier", "RNNClassifier"]


class BasicBlock(nn.Module):
    """``conv3x3 -> BN -> ReLU -> conv3x3 -> BN``, plus the (downsampled) input, then ReLU."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet with BasicBlocks (``layers`` blocks per stage)."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 10,
                 width: int = 64, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages: list[nn.Module] = []
        inplanes = width
        for i, n in enumerate(layers):
            planes = width * 2**i
            blocks = [BasicBlock(inplanes, planes, 1 if i == 0 else 2)]
            blocks += [BasicBlock(planes, planes) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 10, width: int = 64, in_channels: int = 3) -> ResNet:
    """ResNet-18 (11.2 M parameters at ``width=64`` and 10 classes), as torchvision's."""
    return ResNet((2, 2, 2, 2), num_classes, width, in_channels)


class TransformerClassifier(nn.Module):
    """Tokens (``vocab`` given) or feature vectors (``in_features`` given) -> ``d_model`` ->
    ``nn.TransformerEncoder`` (``layers`` x ``nn.TransformerEncoderLayer``, GELU, batch first)
    -> mean over the sequence -> ``LayerNorm`` -> linear head. Attention runs through
    ``F.scaled_dot_product_attention``."""

    def __init__(self, d_model: int = 64, nhead: int = 4, layers: int = 2,
                 dim_feedforward: int = 128, num_classes: int = 10, dropout: float = 0.0,
                 vocab: int | None = None, in_features: int | None = None,
                 max_len: int = 512) -> None:
        super().__init__()
        if (vocab is None) == (in_features is None):
            raise ValueError("TransformerClassifier: give exactly one of vocab= (token ids) or "
                             "in_features= (feature vectors).")
        self.embed: nn.Module = (nn.Embedding(vocab, d_model) if vocab is not None
                                 else nn.Linear(in_features or 1, d_model))
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout,
                                           activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        if h.shape[1] > self.pos.shape[0]:
            raise ValueError(f"TransformerClassifier: sequences of length {h.shape[1]} are "
                             f"longer than max_len={self.pos.shape[0]}; build it with "
                             f"max_len={h.shape[1]} or more.")
        h = h + self.pos[: h.shape[1]]
        return self.head(self.norm(self.encoder(h).mean(1)))


class RNNClassifier(nn.Module):
    """``nn.LSTM`` (``cell="lstm"``) or ``nn.GRU`` over a sequence (batch first); the last
    output to a linear head. ``vocab`` puts an ``nn.Embedding`` in front."""

    def __init__(self, in_features: int = 16, hidden: int = 128, num_classes: int = 10,
                 cell: str = "lstm", layers: int = 1, vocab: int | None = None) -> None:
        super().__init__()
        if cell not in ("lstm", "gru"):
            raise ValueError(f"RNNClassifier: cell={cell!r}; use 'lstm' or 'gru'.")
        self.embed = nn.Embedding(vocab, in_features) if vocab is not None else None
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(in_features, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if self.embed is not None:
            x = self.embed(x)
        out, _ = self.rnn(x)
        return self.head(out[:, -1])
