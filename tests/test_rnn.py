"""hypergrad.rnn: recurrent layers for the differentiated passes.

The rerouted layers must compute what torch's composite computes (outputs, gradients, batched
Hessian-vector products, forward-over-reverse) in float64, for every layer option; the layouts
torch must keep (packed sequences, dropout between layers) must not be rerouted; and the second
derivative must not differentiate one ``select`` per time step (the quadratic cost this module
removes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from fixtures import model_problem
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vjp, vmap
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils._python_dispatch import TorchDispatchMode

import hypergrad.rnn as rnn
from hypergrad.rnn import RecurrentMode, has_recurrent, stack

LAYERS: dict[str, Callable[[], nn.Module]] = {
    "lstm": lambda: nn.LSTM(5, 7, batch_first=True),
    "lstm_2layer_bidirectional": lambda: nn.LSTM(5, 7, num_layers=2, bidirectional=True),
    "lstm_proj_nobias": lambda: nn.LSTM(5, 7, proj_size=3, bias=False, batch_first=True),
    "gru_2layer": lambda: nn.GRU(5, 7, num_layers=2, batch_first=True),
    "gru_bidirectional_nobias": lambda: nn.GRU(5, 7, bidirectional=True, bias=False),
    "rnn_relu_2layer": lambda: nn.RNN(5, 7, nonlinearity="relu", num_layers=2),
    "rnn_tanh_eval_dropout": lambda: nn.RNN(5, 7, num_layers=2, dropout=0.5).eval(),
}


def _loss(m: nn.Module, x: Tensor) -> Callable[[dict[str, Tensor]], Tensor]:
    def f(p: dict[str, Tensor]) -> Tensor:
        out, hidden = functional_call(m, p, (x,))
        hs = hidden if isinstance(hidden, tuple) else (hidden,)
        return out.sin().sum() + sum((h ** 2).sum() for h in hs)
    return f


def _hvp(f: Callable[[Any], Tensor], p: Any, v: Any) -> Any:
    return vjp(grad(f), p)[1](v)[0]


def _close(a: dict[str, Tensor], b: dict[str, Tensor], tol: float) -> float:
    err = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert err <= tol, err
    return err


class _Counting(RecurrentMode):
    def __init__(self) -> None:
        super().__init__()
        self.rerouted = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func in rnn._CELLS and rnn._reroute(func, tuple(args), kwargs or {}) is not None:
            self.rerouted += 1
        return super().__torch_function__(func, types, args, kwargs)


@pytest.mark.parametrize("name", list(LAYERS))
def test_rerouted_layers_equal_torch_to_rounding(name: str) -> None:
    torch.manual_seed(0)
    m = LAYERS[name]().double()
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    p = {k: v.detach() for k, v in m.named_parameters()}
    f = _loss(m, x)
    v = {k: torch.randn_like(t) for k, t in p.items()}
    vs = {k: torch.stack([t, -2 * t, torch.randn_like(t)]) for k, t in v.items()}
    ref = (f(p), grad(f)(p), vmap(lambda u: _hvp(f, p, u))(vs))
    mode = _Counting()
    with mode:
        got = (f(p), grad(f)(p), vmap(lambda u: _hvp(f, p, u))(vs))
        fwd_over_rev = jvp(grad(f), (p,), (v,))[1]
    assert mode.rerouted > 0  # the layer ran through hypergrad.rnn, not torch
    assert float((got[0] - ref[0]).abs()) <= 1e-12
    _close(got[1], ref[1], 1e-12)
    _close(got[2], ref[2], 1e-11)
    _close(fwd_over_rev, {k: t[0] for k, t in ref[2].items()}, 1e-11)


def test_packed_sequences_and_dropout_between_layers_keep_torch_path() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    packed = pack_padded_sequence(x, torch.tensor([6, 4, 2]), batch_first=True)
    cases = [(nn.LSTM(5, 7, batch_first=True).double(), packed),
             (nn.GRU(5, 7, num_layers=2, dropout=0.3, batch_first=True).double().train(), x)]
    for m, inp in cases:
        mode = _Counting()
        with mode:
            m(inp)
        assert mode.rerouted == 0


class _CountSelectBackward(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func.overloadpacket is torch.ops.aten.select_backward:
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rerouted", [False, True])
def test_second_derivative_differentiates_no_select_per_step(rerouted: bool) -> None:
    torch.manual_seed(0)
    m = nn.LSTM(5, 7, batch_first=True).double()
    x = torch.randn(2, 12, 5, dtype=torch.float64)
    p = {k: v.detach() for k, v in m.named_parameters()}

    def f(q: dict[str, Tensor]) -> Tensor:
        return functional_call(m, q, (x,))[0].sin().sum()  # every step's output is used

    v = {k: torch.randn_like(t) for k, t in p.items()}
    count = _CountSelectBackward()
    with (RecurrentMode() if rerouted else torch.enable_grad()), count:
        _hvp(f, p, v)
    if rerouted:
        assert count.n == 0
    else:  # torch's composite: one zero-filled full-sequence tensor per step
        assert count.n >= x.shape[1]


def test_stack_is_torch_stack_with_both_derivatives() -> None:
    xs = [torch.randn(3, 2, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    for dim in (0, 1, -1):
        assert torch.equal(stack(xs, dim), torch.stack(xs, dim))
        assert torch.autograd.gradcheck(lambda *a, d=dim: stack(list(a), d), xs)
        assert torch.autograd.gradgradcheck(lambda *a, d=dim: stack(list(a), d), xs)
        ts = [torch.randn(3, 2, dtype=torch.float64) for _ in xs]
        out = jvp(lambda *a, d=dim: stack(list(a), d), tuple(x.detach() for x in xs), tuple(ts))
        assert torch.equal(out[1], torch.stack(ts, dim))


def test_problems_with_recurrent_layers_enter_the_mode() -> None:
    assert has_recurrent(nn.Sequential(nn.Linear(2, 2), nn.GRU(2, 2)))
    assert not has_recurrent(nn.Sequential(nn.Linear(2, 2)))
    assert model_problem("lstm").recurrent and not model_problem("resnet").recurrent


def test_a_packed_sequence_is_refused_with_the_fix() -> None:
    """A packed LSTM failed inside torch.func with torch's 'Cannot access data pointer of
    Tensor that doesn't have storage' (the guide said packed sequences kept torch's path); it
    is now a NotImplementedError naming PackedSequence and padding. Plain training runs."""
    import torch.nn.functional as F

    import hypergrad as hg

    torch.manual_seed(0)
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    lengths = torch.tensor([6, 4, 2])
    y = torch.tensor([0, 1, 0])

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.out = nn.LSTM(5, 7, batch_first=True), nn.Linear(7, 2)

        def forward(self, xb: Tensor) -> Tensor:
            _, (h, _) = self.rnn(pack_padded_sequence(xb, lengths, batch_first=True))
            return self.out(h[-1])

    p = hg.InnerProblem(Net().double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        [(x, y)], 3, lambda m, hp: F.cross_entropy(m(x), y))
    p.run(p.init_raw())  # no transform: torch's kernel
    with pytest.raises(NotImplementedError, match=r"recurrent layer \(lstm\) given a "
                                                  r"PackedSequence .*Pad the batch"):
        hg.ReverseMode().hypergradient(p, p.init_raw())


def test_a_hidden_state_carried_across_steps_in_a_buffer_written_in_every_mode() -> None:
    """A stateful language model (truncated BPTT) writing self.h = hn in every forward, eval
    too: the validation pass's write (under no_grad) replaced the training pass's in the
    probe, and the model was refused as updating its buffer "without autograd" (the
    stateful-models probe, 2026-12-07). Exact against reverse mode and finite differences."""
    import torch.nn.functional as F

    import hypergrad as hg
    from hypergrad.testing import hypergradcheck

    V, H, B = 7, 5, 3
    g = torch.Generator().manual_seed(0)
    xs = torch.randint(0, V, (4, B, 9), generator=g)
    xv = torch.randint(0, V, (B, 9), generator=g)

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.rnn = nn.Embedding(V, H), nn.GRU(H, H, batch_first=True)
            self.head = nn.Linear(H, V)
            self.register_buffer("h", torch.zeros(1, B, H))

        def forward(self, x: Tensor) -> Tensor:
            out, hn = self.rnn(self.emb(x), self.h)
            self.h = hn  # no detach: hypergrad keeps no graph across steps
            return self.head(out)

    torch.manual_seed(0)
    problem = hg.InnerProblem(
        LM().double(), lambda m, b, hp: F.cross_entropy(m(b[:, :-1]).reshape(-1, V),
                                                          b[:, 1:].reshape(-1)),
        hg.optim.sgd(lr="lr", weight_decay="wd"),
        hg.HyperParams([hg.Scalar("lr", 0.5, "log"), hg.Scalar("wd", 1e-3, "log")]),
        list(xs), 6, lambda m, hp: F.cross_entropy(m(xv[:, :-1]).reshape(-1, V),
                                                    xv[:, 1:].reshape(-1)))
    report = hypergradcheck(problem, strategies=[])
    assert report.max("fwd_vs_rev") <= 1e-10
