"""Running a user's ``nn.Module`` as a pure function of (parameters, buffers), BatchNorm included.

``torch.func.functional_call`` runs any module on tensors we pass in. One thing it cannot do is
BatchNorm's running statistics: the native kernel updates them *in place*, outside autograd, so
their dependence on the weights (hence on the hyperparameters) is lost, and under ``vmap`` the
in-place update fails. Validation in eval mode reads exactly those statistics: carrying them as
constants gives hypergradients 50-70% off (measured against finite differences). So while the model
runs here, each BatchNorm module computes its statistics out of place and returns the new running
statistics as outputs: they become state with tangents like any other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["FunctionalModel", "ModelFn"]


class FunctionalModel:
    """A module split into trainable parameters, tracked buffers (state) and constants.

    - ``param_names``: parameters with ``requires_grad`` (trained, tangents carried).
    - ``state_buffer_names``: running means/variances of the BatchNorm layers that training
      updates (updated by training; tangents carried). ``num_batches_tracked`` counters follow
      the step index and carry no tangent.
    - everything else (frozen parameters, other buffers, the statistics of a BatchNorm in eval
      mode) is a constant.

    Train/eval mode: training runs every submodule in the mode it had when this object was built
    (the root module itself in train mode), as Lightning does since 2.2: a BatchNorm or Dropout
    the user put in eval mode (frozen statistics, the classic fine-tuning setup) stays in eval
    mode during training. Validation in ``val_mode="eval"`` runs every module in eval mode.
    """

    def __init__(self, module: nn.Module) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"InnerProblem: model must be a torch.nn.Module, got {type(module).__name__}."
            )
        self.module = module
        params = dict(module.named_parameters())
        self.param_names = [k for k, p in params.items() if p.requires_grad]
        if not self.param_names:
            raise ValueError(
                "InnerProblem: the model has no parameter with requires_grad=True; there is "
                "nothing to train."
            )
        for k in self.param_names:
            if not params[k].dtype.is_floating_point:
                raise TypeError(
                    f"InnerProblem: parameter {k!r} has dtype {params[k].dtype}; hypergradients "
                    f"need floating parameters (model.float() or model.double())."
                )
        dtypes = {params[k].dtype for k in self.param_names}
        if len(dtypes) > 1:
            raise TypeError(
                f"InnerProblem: trainable parameters mix dtypes {sorted(map(str, dtypes))}; "
                f"convert the model to one dtype (model.double() or model.float())."
            )
        self.dtype = dtypes.pop()
        self.device = params[self.param_names[0]].device
        # the modes training runs each submodule in: the user's, the root in train mode
        self.train_modes = {name: (m.training or name == "")
                            for name, m in module.named_modules()}
        self.bn: dict[str, _BatchNorm] = {
            name: m for name, m in module.named_modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and self.train_modes[name]
        }
        self.state_buffer_names = [f"{_pre(n)}{b}" for n in self.bn
                                   for b in ("running_mean", "running_var")]
        self.counter_names = [f"{_pre(n)}num_batches_tracked" for n in self.bn]
        state_like = set(self.state_buffer_names) | set(self.counter_names)
        self.constants = {k: p.detach() for k, p in params.items() if not p.requires_grad}
        self.constants.update({k: b for k, b in module.named_buffers() if k not in state_like})
        self.counters0 = {k: int(module.get_buffer(k)) for k in self.counter_names}

    def initial_params(self) -> dict[str, Tensor]:
        return {k: self.module.get_parameter(k).detach().clone() for k in self.param_names}

    def initial_buffers(self) -> dict[str, Tensor]:
        return {k: self.module.get_buffer(k).detach().clone() for k in self.state_buffer_names}

    def bind(self, params: dict[str, Tensor], buffers: dict[str, Tensor], train: bool,
             step: int = 0, fused: bool = False) -> ModelFn:
        """The model at ``params``/``buffers``. ``fused``: BatchNorm updates (copies of) its
        running statistics with torch's fused kernel, which no transform can differentiate;
        for plain steps only."""
        return ModelFn(self, params, buffers, train, step, fused)

    def load_into(self, params: dict[str, Tensor], buffers: dict[str, Tensor], steps: int) -> None:
        """Write trained values back into the module (counters advanced by ``steps``)."""
        with torch.no_grad():
            for k, v in params.items():
                self.module.get_parameter(k).copy_(v)
            for k, v in buffers.items():
                self.module.get_buffer(k).copy_(v)
            for k, c in self.counters0.items():
                self.module.get_buffer(k).fill_(c + steps)


def _pre(name: str) -> str:
    return f"{name}." if name else ""


class ModelFn:
    """The model bound to given tensors: call it like the module. Given to the user's losses.

    Attributes:
        params: dict name -> trainable parameter tensor (read them for explicit penalties).
        buffers: dict name -> running statistics fed in.
        new_buffers: running statistics after the calls so far (train mode updates them).
    """

    def __init__(self, fm: FunctionalModel, params: dict[str, Tensor],
                 buffers: dict[str, Tensor], train: bool, step: int,
                 fused: bool = False) -> None:
        self._fm = fm
        self.params = params
        self.buffers = buffers
        self.new_buffers = dict(buffers)
        self.train = train
        self.step = step
        self.fused = fused

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fm = self._fm
        tensors = {**fm.constants, **self.params, **self.new_buffers}
        with _mode(fm.module, fm.train_modes if self.train else None), self._patched_bn():
            return functional_call(fm.module, tensors, args, kwargs, strict=False)

    @contextlib.contextmanager
    def _patched_bn(self) -> Iterator[None]:
        fm = self._fm
        for name, m in fm.bn.items():
            m.forward = _BNForward(self, m, _pre(name))  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            for m in fm.bn.values():
                del m.forward


class _BNForward:
    """Out-of-place BatchNorm: same output as ``F.batch_norm``, running statistics as outputs."""

    def __init__(self, owner: ModelFn, m: _BatchNorm, prefix: str) -> None:
        self.owner, self.m, self.prefix = owner, m, prefix

    def __call__(self, x: Tensor) -> Tensor:
        m, o, pre = self.m, self.owner, self.prefix
        m._check_input_dim(x)
        rm_key, rv_key = pre + "running_mean", pre + "running_var"
        rm, rv = o.new_buffers[rm_key], o.new_buffers[rv_key]
        if not m.training:
            shape = (1, -1) + (1,) * (x.ndim - 2)
            y = (x - rm.reshape(shape)) * torch.rsqrt(rv.reshape(shape) + m.eps)
            if m.affine:
                y = y * m.weight.reshape(shape) + m.bias.reshape(shape)
            return y
        if m.momentum is None:  # cumulative moving average, as torch does
            count = o._fm.counters0[pre + "num_batches_tracked"] + o.step + 1
            f = 1.0 / count
        else:
            f = m.momentum
        if o.fused:  # torch's kernel computes the statistics once and updates the copies
            rm, rv = rm.clone(), rv.clone()
            y = F.batch_norm(x, rm, rv, m.weight, m.bias, True, f, m.eps)
            o.new_buffers[rm_key], o.new_buffers[rv_key] = rm, rv
            return y
        y = F.batch_norm(x, None, None, m.weight, m.bias, True, 0.0, m.eps)
        dims = [0] + list(range(2, x.ndim))
        var, mean = torch.var_mean(x, dim=dims, correction=0)
        n = x.numel() // x.shape[1]
        o.new_buffers[rm_key] = (1 - f) * rm + f * mean
        o.new_buffers[rv_key] = (1 - f) * rv + f * var * (n / max(n - 1, 1))
        return y


@contextlib.contextmanager
def _mode(module: nn.Module, modes: dict[str, bool] | None) -> Iterator[None]:
    """Each submodule in its mode of ``modes`` (name -> training), or all in eval mode for
    ``None``; the modes before are restored afterwards."""
    saved = [(m, m.training) for m in module.modules()]
    for name, m in module.named_modules():
        m.training = False if modes is None else modes.get(name, True)
    try:
        yield
    finally:
        for m, t in saved:
            m.training = t
