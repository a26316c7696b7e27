"""CUDA-only failures found on the first GPU run (an H100, issue 25), checked here on the CPU
through the conditions that caused them.

- cuDNN's RNN kernel reads its weights' storage: ``torch.func``'s wrapped tensors have none
  ("Cannot access storage of TensorWrapper"). No pass of a hypergradient may hand them to
  torch's own RNN kernel (they go through :mod:`hypergrad.rnn`'s cells); on the CPU torch's
  kernel would accept them, so the test watches the calls.
- TF32: a float32 problem on CUDA with TF32 convolutions or matrix products is said once
  (:class:`hypergrad.errors.PrecisionWarning`); the flags that decide it.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.overrides import _get_current_function_mode_stack

import hypergrad as hg
from hypergrad.errors import PrecisionWarning
from hypergrad.problem import tf32_flags
from hypergrad.rnn import RecurrentMode
from hypergrad.tasks.models import RNNClassifier
from hypergrad.testing import classifier_case


@pytest.mark.parametrize("method", [hg.ForwardMode(), hg.ReverseMode()], ids=["fwd", "rev"])
def test_no_wrapped_tensor_reaches_torchs_rnn_kernel(method: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    problem = classifier_case(RNNClassifier(16, 8, 10, cell="lstm"), (6, 16), 3, steps=2,
                              n=16, batch_size=8)
    real = torch._VF.lstm  # type: ignore[attr-defined]
    seen: list[bool] = []

    def watched(*args: Any, **kwargs: Any) -> Any:
        # called before torch's function modes: a call inside RecurrentMode is rerouted to the
        # cells, any other runs torch's kernel
        tensors = [args[0], *(p for p in args[2] if isinstance(p, torch.Tensor))]
        rerouted = any(isinstance(m, RecurrentMode) for m in _get_current_function_mode_stack())
        seen.append(not rerouted and any(torch._C._functorch.is_functorch_wrapped_tensor(t)
                                         for t in tensors))
        return real(*args, **kwargs)

    monkeypatch.setitem(torch._VF.__dict__, "lstm", watched)  # type: ignore[attr-defined]
    lam = problem.init_raw()
    method.estimate_memory(problem)
    g = method.hypergradient(problem, lam).grad
    assert torch.isfinite(g).all()
    assert seen, "the watch saw no call of torch's LSTM kernel: it watches nothing"
    assert not any(seen), "torch's RNN kernel got torch.func's wrapped tensors"


def test_tf32_flags_name_what_rounds_a_float32_cuda_model() -> None:
    conv, mlp = True, False  # whether the model has convolutions
    cuda = torch.device("cuda")
    b = torch.backends
    saved = b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32
    try:
        b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32 = True, False  # torch's defaults
        assert tf32_flags(torch.device("cpu"), torch.float32, conv) == []
        assert tf32_flags(cuda, torch.float64, conv) == []
        assert tf32_flags(cuda, torch.float32, mlp) == []
        assert [f.split("=")[0] for f in tf32_flags(cuda, torch.float32, conv)] == [
            "torch.backends.cudnn.allow_tf32"]
        b.cuda.matmul.allow_tf32 = True
        assert len(tf32_flags(cuda, torch.float32, mlp)) == 1
        b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32 = False, False
        assert tf32_flags(cuda, torch.float32, conv) == []
    finally:
        b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32 = saved


def test_tf32_flags_read_the_new_api_where_torch_refuses_the_legacy_flags(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once TF32 is set through ``fp32_precision`` (torch's newer API, the documented way
    off), torch may refuse to read ``allow_tf32`` ("a mix of the legacy and new APIs"): the
    check raised at the first differentiated pass of every float32 CUDA problem."""

    class Mixed:
        def __init__(self, precision: str) -> None:
            self.fp32_precision = precision

        @property
        def allow_tf32(self) -> bool:
            raise RuntimeError("you have used a mix of the legacy and new APIs")

    mlp = False  # no convolutions
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.backends.cuda, "matmul", Mixed("tf32"))
    assert tf32_flags(cuda, torch.float32, mlp) == ["torch.backends.cuda.matmul.allow_tf32=True"]
    monkeypatch.setattr(torch.backends.cuda, "matmul", Mixed("ieee"))
    assert tf32_flags(cuda, torch.float32, mlp) == []


def test_the_precision_warning_is_said_once_when_the_flags_say_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import hypergrad.problem as P

    problem = hg.testing.digits_case("momentum", "lr", steps=2, n_train=16, batch_size=8,
                                     hidden=4, n_val=16)
    monkeypatch.setattr(P, "tf32_flags", lambda *a: ["torch.backends.cudnn.allow_tf32=True"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hg.ForwardMode().hypergradient(problem, problem.init_raw())
        hg.ReverseMode().hypergradient(problem, problem.init_raw())
    said = [w for w in caught if w.category is PrecisionWarning]
    assert len(said) == 1
    assert "allow_tf32 = False" in str(said[0].message)


@pytest.mark.parametrize("kind", ["lr", "schedule", "per_tensor_wd"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_the_foreach_plain_update_is_the_per_tensor_one(monkeypatch: pytest.MonkeyPatch,
                                                        kind: str, nesterov: bool) -> None:
    """SGD's plain update on ``_foreach`` kernels (on CUDA by default, forced here on the CPU)
    gives the per-tensor update's training run to rounding (float64); a per-tensor
    hyperparameter keeps the per-tensor update."""
    import importlib

    S = importlib.import_module("hypergrad.optim.sgd")  # the package's ``sgd`` is the factory
    problem = hg.testing.digits_case("momentum", kind, steps=6, n_train=24, batch_size=8,
                                     hidden=8, n_val=16)
    opt = problem.optimizer
    opt.args["nesterov"] = nesterov
    opt.args["dampening"] = 0.0 if nesterov else 0.1
    if not isinstance(opt.args["weight_decay"], str):
        opt.args["weight_decay"] = 1e-3
    lam = problem.init_raw()
    ref = problem.run(lam)
    calls: list[int] = []
    real = S.SGD._update_foreach

    def counted(self: Any, *args: Any) -> Any:
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(S, "FOREACH_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(S.SGD, "_update_foreach", counted)
    out = problem.run(lam)
    assert bool(calls) == (kind != "per_tensor_wd")
    for k, v in ref.params.items():
        torch.testing.assert_close(out.params[k], v, rtol=1e-13, atol=1e-15)
    for k, v in ref.opt.momentum_buffer.items():
        torch.testing.assert_close(out.opt.momentum_buffer[k], v, rtol=1e-13, atol=1e-15)
    # the differentiated passes keep the per-tensor update
    calls.clear()
    hg.ForwardMode(compile=False).hypergradient(problem, lam)
    assert not calls
