"""Recurrent layers for the differentiated passes: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` with a
double backward linear in the sequence length.

torch runs a recurrent layer as one fused kernel (oneDNN on CPU, cuDNN on CUDA) whose backward has
no derivative, so inside ``torch.func`` transforms it falls back to a composite of per-step cells
whose outputs are joined by ``stack``. ``stack``'s backward takes one ``select`` per time step,
and the derivative of each ``select`` is a zero tensor of the whole sequence's size with one slice
filled: the second-order passes (Hessian-vector products, reverse mode's step VJP) then allocate,
zero and add ``T`` full-sequence tensors per layer, quadratic in ``T``. Profiled on the bench_models
LSTM (sequence 32, hidden 128, K = 16): ``fill_`` and full-size ``add`` were about 60 % of the
tangent step.

:class:`RecurrentMode` (entered by :func:`hypergrad.kernels.second_order` for models with a
recurrent layer) replaces those calls with the same cells written here, joined by :func:`stack`,
whose backward is ``unbind`` (and ``unbind``'s derivative is ``stack`` again): every
differentiated pass stays linear in ``T``. The cells compute what torch's do (same gate order and
formulas), so results agree with torch's to rounding; ``tests/test_models.py`` checks outputs,
gradients and second derivatives against the composite in float64.

Not rerouted (torch's own path runs, exact but quadratic): dropout between layers in training
(torch's kernel draws those masks its own way; plain and differentiated passes must draw the
same). Packed sequences (``PackedSequence``) cannot be differentiated inside ``torch.func``'s
transforms at all (torch 2.13: "Cannot access data pointer of Tensor that doesn't have
storage", with ``torch.func.grad`` alone): they are refused with a ``NotImplementedError``
naming the fix (pad the batch and mask the padded steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = ["RecurrentMode", "stack", "has_recurrent"]


class _Stack(torch.autograd.Function):
    """``torch.stack`` whose backward is ``unbind`` (torch's takes one ``select`` per input,
    whose own derivative allocates a zero tensor of the stacked size)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(dim: int, *xs: Tensor) -> Tensor:  # type: ignore[override]
        return torch.stack(xs, dim)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.dim = inputs[0]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return (None, *grad.unbind(ctx.dim))

    @staticmethod
    def jvp(ctx: Any, _dim: Any, *tangents: Tensor) -> Tensor:  # type: ignore[override]
        return torch.stack(tangents, ctx.dim)


def stack(xs: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``torch.stack(xs, dim)`` with a backward (``unbind``) whose derivative is linear in
    ``len(xs)``."""
    return _Stack.apply(dim, *xs)  # type: ignore[no-any-return]


def has_recurrent(model: nn.Module) -> bool:
    """Whether ``model`` contains an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN``."""
    return any(isinstance(m, nn.RNNBase) for m in model.modules())


class Weights(NamedTuple):
    """One direction of one layer (``w_hr``: the LSTM's projection, ``proj_size > 0``)."""

    w_ih: Tensor
    w_hh: Tensor
    b_ih: Tensor | None
    b_hh: Tensor | None
    w_hr: Tensor | None


Cell = Callable[[Tensor, tuple[Tensor, ...], Weights], tuple[Tensor, ...]]


def _lstm_cell(xw: Tensor, state: tuple[Tensor, ...], w: Weights) -> tuple[Tensor, ...]:
    h, c = state
    i, f, g, o = (xw + F.linear(h, w.w_hh, w.b_hh)).chunk(4, 1)  # torch's gate order
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    if w.w_hr is not None:
        h = F.linear(h, w.w_hr)
    return h, c


def _gru_cell(xw: Tensor, state: tuple[Tensor, ...], w: Weights) -> tuple[Tensor, ...]:
    (h,) = state
    xr, xz, xn = xw.chunk(3, 1)  # torch's gate order: reset, update, new
    hr, hz, hn = F.linear(h, w.w_hh, w.b_hh).chunk(3, 1)
    r = torch.sigmoid(xr + hr)
    z = torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (n + z * (h - n),)


def _rnn_cell(act: Callable[[Tensor], Tensor]) -> Cell:
    def cell(xw: Tensor, state: tuple[Tensor, ...], w: Weights) -> tuple[Tensor, ...]:
        (h,) = state
        return (act(xw + F.linear(h, w.w_hh, w.b_hh)),)
    return cell


def _layer(cell: Cell, xs: Tensor, state: tuple[Tensor, ...], w: Weights,
           reverse: bool) -> tuple[list[Tensor], tuple[Tensor, ...]]:
    """One direction of one layer over ``xs`` (time first): the input projection of all steps
    in one matmul, then the cells; returns the per-step outputs (in time order) and the final
    state."""
    xw = F.linear(xs, w.w_ih, w.b_ih).unbind(0)
    out: list[Tensor] = []
    for t in (reversed(range(len(xw))) if reverse else range(len(xw))):
        state = cell(xw[t], state, w)
        out.append(state[0])
    return (out[::-1] if reverse else out), state


def _run(cell: Cell, n_state: int, x: Tensor, hx: Sequence[Tensor], params: Sequence[Tensor],
         has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool
         ) -> tuple[Tensor, ...]:
    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs)
    xs = x.transpose(0, 1) if batch_first else x
    finals: list[list[Tensor]] = [[] for _ in range(n_state)]
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            idx = layer * dirs + d
            p = list(params[idx * per:(idx + 1) * per])
            w = Weights(p[0], p[1], p[2] if has_biases else None, p[3] if has_biases else None,
                        p[-1] if per == (5 if has_biases else 3) else None)
            state = tuple(h[idx] for h in hx)
            out, state = _layer(cell, xs, state, w, reverse=d == 1)
            outs.append(out)
            for k in range(n_state):
                finals[k].append(state[k])
        steps = ([torch.cat(pair, -1) for pair in zip(*outs)] if dirs == 2 else outs[0])
        xs = stack(steps, 0)
    y = xs.transpose(0, 1) if batch_first else xs
    return (y, *(stack(f, 0) for f in finals))


_CELLS: dict[Any, tuple[Cell, int]] = {
    torch._VF.lstm: (_lstm_cell, 2),  # type: ignore[attr-defined]
    torch._VF.gru: (_gru_cell, 1),  # type: ignore[attr-defined]
    torch._VF.rnn_tanh: (_rnn_cell(torch.tanh), 1),  # type: ignore[attr-defined]
    torch._VF.rnn_relu: (_rnn_cell(torch.relu), 1),  # type: ignore[attr-defined]
}


def _reroute(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, ...] | None:
    """The layer through this module's cells, or ``None`` where torch's own path must run."""
    if kwargs or len(args) != 9:
        return None
    cell, n_state = _CELLS[func]
    x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
    if not isinstance(x, Tensor) or not isinstance(params, (list, tuple)):
        return None  # a packed sequence: (data, batch_sizes, hx, params, ...)
    if n_state == 1:
        if not isinstance(hx, Tensor):
            return None
        hx = (hx,)
    elif not (isinstance(hx, (list, tuple)) and len(hx) == 2):
        return None
    if dropout and train and num_layers > 1:
        return None  # torch's kernel draws the masks between layers
    return _run(cell, n_state, x, hx, params, bool(has_biases), int(num_layers),
                bool(bidirectional), bool(batch_first))


def _packed(args: tuple[Any, ...]) -> bool:
    """Whether a recurrent kernel's arguments are a packed sequence's: ``(data, batch_sizes,
    hx, params, ...)``, ``batch_sizes`` an integer tensor."""
    return (len(args) >= 4 and isinstance(args[1], Tensor)
            and not args[1].is_floating_point())


class RecurrentMode(TorchFunctionMode):
    """Inside: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` run through this module's cells (see the
    module docstring); every other call is untouched."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _CELLS:
            out = _reroute(func, tuple(args), kwargs)
            if out is not None:
                return out
            if _packed(tuple(args)):
                try:
                    return func(*args, **kwargs)
                except RuntimeError as err:  # torch.func cannot run the packed kernel
                    raise NotImplementedError(
                        f"hypergrad: a recurrent layer ({getattr(func, '__name__', func)}) "
                        f"given a PackedSequence cannot be differentiated inside torch.func's "
                        f"transforms, which every method but FiniteDifference uses (torch "
                        f"{torch.__version__}: {str(err).splitlines()[0][:120]}). Pad the "
                        f"batch instead (nn.utils.rnn.pad_sequence, batch_first=True) and mask "
                        f"the padded steps in the loss (e.g. cross_entropy's ignore_index), or "
                        f"use FiniteDifference().") from err
        return func(*args, **kwargs)
