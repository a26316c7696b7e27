"""Kernels for the passes that differentiate a step's gradient (Hessian-vector products, reverse
mode's step VJP).

**Attention.** The fused ``scaled_dot_product_attention`` kernels (flash, memory-efficient, the
CPU flash kernel) have no double backward. :func:`second_order` selects the math kernel for the
passes that differentiate the gradient (Hessian-vector products, reverse mode's step VJP). Plain
training steps (finite differences, reverse mode's forward sweep, ``problem.run``) keep the fused
kernels, which are 3-4x faster on CPU at sequence length 32, unless attention applies dropout:
the kernels draw their dropout masks differently, so then every evaluation of the step uses the
math kernel (:class:`AttentionProbe` finds out on the first plain step).

**Recurrent layers.** The same passes run ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` through the cells
of :mod:`hypergrad.rnn`, whose double backward is linear in the sequence length (torch's
composite is quadratic); plain steps keep torch's fused kernels.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .rng import STATE_LOCK
from .rnn import RecurrentMode

__all__ = ["second_order", "AttentionProbe"]


@contextlib.contextmanager
def second_order(recurrent: bool = False) -> Iterator[None]:
    """Attention through the math kernel of ``scaled_dot_product_attention`` (the one with a
    double backward) inside the body; with ``recurrent`` (a model with ``nn.LSTM``, ``nn.GRU`` or
    ``nn.RNN``), those layers through :class:`hypergrad.rnn.RecurrentMode` (a double backward
    linear in the sequence length). Other ops are unaffected."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # the kernel choice is the process's: another thread's plain pass took the math kernel
    # too (1e-16 apart from a sequential run), so one thread at a time (:data:`STATE_LOCK`)
    lock = contextlib.nullcontext() if torch.compiler.is_compiling() else STATE_LOCK
    with lock, sdpa_kernel([SDPBackend.MATH]), (RecurrentMode() if recurrent
                                                else contextlib.nullcontext()):
        yield


class AttentionProbe(TorchFunctionMode):
    """Records whether the body calls attention with dropout (``F.scaled_dot_product_attention``
    with ``dropout_p > 0``, or ``F.multi_head_attention_forward`` in training with
    ``dropout_p > 0``, which ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` use).
    Used once, on a problem's first plain step: it adds Python work to every op."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = False

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
            self.dropout = self.dropout or bool(p)
        elif func is F.multi_head_attention_forward:
            bound = inspect.signature(func).bind(*args, **kwargs)
            p = bound.arguments.get("dropout_p", 0.0)
            self.dropout = self.dropout or (bool(p) and bound.arguments.get("training", True))
        return func(*args, **kwargs)
