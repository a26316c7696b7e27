"""Users' own models found wrong by review, each checked against finite differences or refused.

- ``nn.Embedding(padding_idx=p)`` whose padding row training moves (a weight tied to an output
  layer, a non-zero row under weight decay): torch's gradient leaves out the row's lookups, so
  every method differed from finite differences (0.3-11 %); refused naming the module. A zero
  padding row read nowhere else stays exact.
- ``nn.Embedding(scale_grad_by_freq=True)``: a gradient divided by lookup counts is not the
  loss's gradient; forward and reverse mode disagreed (1e-4) and both were 0.4 % off finite
  differences. ``nn.EmbeddingBag``: torch's error from deep inside the first HVP (no derivative
  of ``_embedding_bag_backward``). Both refused at construction with the fix.
- ``nn.Embedding(sparse=True)``: the plain step crashed in the optimizer (``addcmul`` on a
  sparse gradient); it runs dense now, with the hypergradient of ``sparse=False``.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.testing import hypergradcheck


class _Tokens(nn.Module):
    """Token ids -> 3 classes through an embedding with a padding row, optionally tied."""

    def __init__(self, tie: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6, padding_idx=0)
        self.out = nn.Linear(6, 10, bias=False)
        if tie:
            self.out.weight = self.emb.weight
        self.head = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.out(torch.tanh(self.emb(x)).mean(1)))


def _token_problem(model: nn.Module, weight_decay: float = 0.0) -> hg.InnerProblem:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 10, (24, 5), generator=g)
    x[:, -1] = 0  # every sequence padded
    y = torch.randint(0, 3, (24,), generator=g)
    hps = hg.HyperParams([hg.Scalar("lr", 0.05, transform="log"),
                          hg.Scalar("mom", 0.5, transform="logit")])
    return hg.InnerProblem(
        model.double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.optim.sgd(lr="lr", momentum="mom", weight_decay=weight_decay), hps,
        [(x[i:i + 8], y[i:i + 8]) for i in (0, 8, 16)], 4,
        lambda m, hp: F.cross_entropy(m(x[:8]), y[:8]))


def test_a_padding_row_that_moves_is_refused() -> None:
    # tied: every method agreed with each other, 0.3-0.6 % off finite differences
    problem = _token_problem(_Tokens(tie=True))
    with pytest.raises(ValueError, match=r"module 'emb' is nn.Embedding\(padding_idx=0\).*"
                                         r"gradient at 'emb.weight' is non-zero"):
        problem.run(problem.init_raw())
    # a non-zero padding row (pretrained vectors) under weight decay: 8-11 % off
    model = _Tokens(tie=False)
    with torch.no_grad():
        model.emb.weight[0].normal_()
    problem = _token_problem(model, weight_decay=0.1)
    with pytest.raises(ValueError, match=r"padding row is non-zero.*padding_idx=None"):
        problem.run(problem.init_raw())


def test_a_padded_models_first_plain_run_under_no_grad_is_checked_alike() -> None:
    """The probe's padding check took its gradient under the caller's no_grad: a padded
    model's first plain run there (``problem.run`` under ``torch.no_grad()``) failed with
    torch's 'element 0 of tensors does not require grad' instead of checking."""
    problem = _token_problem(_Tokens(tie=True))
    with torch.no_grad(), pytest.raises(ValueError, match=r"gradient at 'emb.weight' is non-zero"):
        problem.run(problem.init_raw())
    problem = _token_problem(_Tokens(tie=False), weight_decay=0.1)
    with torch.no_grad():
        state = problem.run(problem.init_raw())
    assert all(bool(torch.isfinite(v).all()) for v in state.params.values())


def test_a_zero_padding_row_read_nowhere_else_is_exact() -> None:
    problem = _token_problem(_Tokens(tie=False), weight_decay=0.1)
    rep = hypergradcheck(problem, rtol_rev=1e-10)
    assert rep.max("fwd_vs_fd") <= 1e-6


class _Bag(nn.Module):
    def __init__(self, emb: nn.Module) -> None:
        super().__init__()
        self.emb = emb
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.emb(x)
        return self.head(torch.tanh(e if e.ndim == 2 else e.mean(1)))


@pytest.mark.parametrize("emb, match", [
    (nn.Embedding(10, 6, scale_grad_by_freq=True), r"Embedding\(scale_grad_by_freq=True\)"),
    (nn.EmbeddingBag(10, 6, mode="sum"), r"nn.EmbeddingBag.*emb\(x\).sum\(1\)"),
])
def test_embeddings_whose_gradient_cannot_be_differentiated_are_refused(
        emb: nn.Module, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _token_problem(_Bag(emb))
    emb.weight.requires_grad_(False)  # frozen: nothing to differentiate through it
    _token_problem(_Bag(emb))


def test_a_sparse_embedding_trains_as_a_dense_one() -> None:
    torch.manual_seed(0)
    dense = _Bag(nn.Embedding(10, 6))
    sparse = _Bag(nn.Embedding(10, 6, sparse=True))
    sparse.load_state_dict(dense.state_dict())
    a, b = _token_problem(dense), _token_problem(sparse)
    lam = a.init_raw()
    torch.testing.assert_close(b.run(lam).params, a.run(lam).params, rtol=1e-13, atol=1e-15)
    rep = hypergradcheck(b, rtol_rev=1e-10)
    assert rep.grad is not None
    torch.testing.assert_close(rep.grad, hg.ForwardMode().hypergradient(a, lam).grad,
                               rtol=1e-12, atol=0)
    assert sparse.emb.sparse  # the module is left as it was


def test_instance_norm_with_running_statistics_names_its_own_fix() -> None:
    """InstanceNorm(track_running_stats=True) updates its statistics under no_grad: refused (as
    any such buffer), with the fix that fits a built-in module; without them it runs."""
    def problem(track: bool, val_mode: str = "eval") -> hg.InnerProblem:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv1d(2, 3, 3), nn.InstanceNorm1d(3, track_running_stats=track),
                          nn.Flatten(), nn.Linear(18, 2)).double()
        x, y = torch.randn(8, 2, 8, dtype=torch.float64), torch.randint(0, 2, (8,))

        def loss(m: nn.Module, b: Any, hp: Any) -> torch.Tensor:
            return F.cross_entropy(m(b[0]), b[1])

        return hg.InnerProblem(m, loss, hg.optim.sgd(lr="lr"),
                               hg.HyperParams([hg.Scalar("lr", 0.1)]), [(x, y)], 3,
                               lambda m, hp: loss(m, (x, y), hp), val_mode=val_mode)

    # validated in train mode, no loss reads the statistics: forward and reverse mode failed
    # as torch's "'native_batch_norm' is not differentiable with respect to argument
    # 'running_mean'" (the module zoo probe)
    for val_mode in ("eval", "train"):
        p = problem(True, val_mode)
        with pytest.raises(ValueError, match=r"InstanceNorm1d.*Build it with "
                                             r"track_running_stats=False"):
            hg.ForwardMode().hypergradient(p, p.init_raw())
    q = problem(False)
    q.check(q.init_raw())
    assert torch.isfinite(hg.ForwardMode().hypergradient(q, q.init_raw()).grad).all()


def _twice_bn(momentum: float | None) -> tuple[hg.InnerProblem, nn.Module, Any, Any]:
    """A BatchNorm MLP whose training loss calls the model twice per step (two views of the
    batch), and an untouched copy for plain torch."""
    torch.manual_seed(0)
    x = torch.randn(32, 4, dtype=torch.float64)
    y = torch.randint(0, 4, (32,))
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, momentum=momentum), nn.Tanh(),
                        nn.Linear(8, 4)).double()
    ref = copy.deepcopy(net)

    def train_loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1]) + F.cross_entropy(m(2 * b[0] + 1), b[1])

    p = hg.InnerProblem(net, train_loss, hg.optim.sgd(lr="lr"),
                        hg.HyperParams([hg.Scalar("lr", 0.3)]), [(x, y)], 5,
                        lambda m, hp: F.cross_entropy(m(x), y))
    return p, ref, train_loss, (x, y)


def test_a_loss_calling_a_batchnorm_model_twice_per_step_trains_as_torch_does() -> None:
    """The check compared each call's running statistics with the module's own, so the second
    call's (the first call's update) read as a write of the forward: refused with 'the
    forward of the model writes 1.running_mean, state that hypergrad updates itself', which it
    does not. Now the statistics follow torch's two updates per step exactly."""
    p, ref, train_loss, batch = _twice_bn(0.1)
    state = p.run(p.init_raw())
    opt = torch.optim.SGD(ref.parameters(), lr=0.3)
    for _ in range(5):
        opt.zero_grad()
        train_loss(ref, batch, None).backward()
        opt.step()
    assert torch.equal(state.buffers["1.running_mean"], ref[1].running_mean)
    assert torch.allclose(state.params["0.weight"].detach(), ref[0].weight.detach(),
                          rtol=0, atol=1e-14)
    hypergradcheck(p)


def test_a_cumulative_batchnorm_called_twice_per_step_is_refused() -> None:
    """momentum=None averages over batches counted per step (torch counts per call): twice
    per step its running statistics were 0.11 off torch's after 5 steps, silently."""
    p, _, _, _ = _twice_bn(None)
    with pytest.raises(ValueError, match=r"BatchNorm '1' with momentum=None .* runs 2 times in "
                                         r"one training step.*torch.cat the inputs"):
        p.run(p.init_raw())


class _PaddedEncoder(nn.Module):
    """A TransformerEncoder (nested tensors on, torch's default) over a padded batch, pooled
    over every position, padded ones included."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
        pad[::2, -2:] = True
        return self.head(self.enc(self.inp(x), src_key_padding_mask=pad).mean(1))


def test_attention_fast_path_does_not_give_a_point_a_second_validation_loss() -> None:
    """Eager in eval mode without autograd (finite differences, the Trainer's plain runs,
    evaluate), torch's encoder fast path zeroed the padded positions; under torch.func it
    cannot: one point had validation losses 0.685 and 0.724, finite differences were 13 % off
    forward mode, and the Trainer dropped an improving step (the RNN/attention probe)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 5, 3, generator=g, dtype=torch.float64)
    y = (x.sum((1, 2)) > 0).long()
    torch.manual_seed(0)
    p = hg.InnerProblem(_PaddedEncoder().double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr", momentum=0.5),
                        hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        hg.data.MiniBatches(x, y, batch_size=8, seed=0), 3,
                        lambda m, hp: F.cross_entropy(m(x[:8]), y[:8]), seed=0)
    lam = p.init_raw()
    fw = hg.ForwardMode().hypergradient(p, lam)
    fd = hg.FiniteDifference().hypergradient(p, lam)
    assert float(fd.objective) == pytest.approx(float(fw.objective), rel=1e-12)
    assert hg.testing.rel_err(fw.grad, fd.grad) < 1e-6
    with torch.no_grad():
        assert float(F.cross_entropy(p.model(fw.state)(x[:8]), y[:8])) == pytest.approx(
            float(fw.objective), rel=1e-12)
    assert torch.backends.mha.get_fastpath_enabled()  # the user's setting is restored


def _scripted(obj: Any) -> Any:
    with warnings.catch_warnings():  # torch.jit.script is deprecated in recent torch
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(obj)


def _small_problem(model: nn.Module) -> hg.InnerProblem:
    x = torch.randn(16, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (16,))
    return hg.InnerProblem(model.double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                           [(x, y)], 3, lambda m, hp: F.cross_entropy(m(x), y))


_ACT = None


def test_torchscript_in_the_model_is_refused_by_name() -> None:
    """Under torch.func, TorchScript code's second derivatives come out as zero: forward mode
    was 2-3 % off finite differences without a word (scripted submodule or function; the whole
    model scripted failed as torch's 'get_parameter is not supported') (the module zoo probe)."""
    global _ACT
    act = _scripted(lambda_free_tanh)
    _ACT = act

    class Local(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.o = nn.Linear(4, 6), nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.o(act(self.a(x)))

    class Global(Local):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.o(_ACT(self.a(x)))  # type: ignore[misc]

    sub = nn.Sequential(_scripted(nn.Sequential(nn.Linear(4, 6), nn.Tanh())), nn.Linear(6, 3))
    for model, match in (
            (sub, r"module '0' is a TorchScript module"),
            (_scripted(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))),
             r"the model is a TorchScript module"),
            (Local(), r"calls the TorchScript function 'act'"),
            (Global(), r"calls the TorchScript function '_ACT'")):
        with pytest.raises(ValueError, match=match + r".*second derivatives come out as zero"):
            _small_problem(model)


def lambda_free_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 1.5


def test_gradient_hooks_are_warned_about_and_module_backward_hooks_refused() -> None:
    """A parameter's gradient hook (x3) never ran: training differed from torch's with it,
    without a word; a module's full backward hook got the activation-checkpointing message
    (the module zoo probe)."""
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    model[0].weight.register_hook(lambda g: g * 3)
    with pytest.warns(hg.errors.HypergradWarning, match=r"\['0.weight'\] have gradient hooks"):
        _small_problem(model)
    other = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    other[2].register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(ValueError, match=r"module '2' \(Linear\) has a module backward hook"):
        _small_problem(other)


class _Counter(nn.Module):
    """Keeps a running mean in a Python float (train mode) that eval mode subtracts."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.mu = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if self.training:
            self.mu = 0.9 * self.mu + 0.1 * float(h.mean())
        return h - self.mu


def test_state_kept_in_a_python_attribute_is_refused_by_name() -> None:
    """A float running mean (or a call counter) in a Python attribute: each method runs
    forward a different number of times, so forward and reverse mode reported other
    objectives (1.09862 / 1.09879) and disagreed by 2.7e-3, without a word (the module zoo
    probe)."""
    model = _Counter()
    with pytest.raises(ValueError, match=r"changed the Python attribute 'mu' of the model "
                                         r"\(_Counter\) \(0.0 -> .*restored now\).*buffer"):
        hg.ForwardMode().hypergradient(p := _small_problem(model), p.init_raw())
    assert model.mu == 0.0


class _TensorState(nn.Module):
    """Keeps a running mean of its outputs in a plain tensor attribute (not a buffer)."""

    def __init__(self, start: torch.Tensor | None) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.avg = start
        self.scale = torch.ones(3)  # a constant tensor attribute, never reassigned: fine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x) * self.scale
        m = h.mean(0).detach()
        self.avg = m if self.avg is None else 0.5 * self.avg + 0.5 * m
        return h - self.avg


@pytest.mark.parametrize("start", [None, torch.zeros(3)])
def test_state_kept_in_a_plain_tensor_attribute_is_refused_by_name(
        start: torch.Tensor | None) -> None:
    """A running mean reassigned to ``self.avg`` in forward: forward mode failed inside
    torch's vmap with "INTERNAL ASSERT FAILED ... please report a bug to PyTorch", and
    hypergrad-run on a fake tensor its memory estimate had left in the attribute (the
    own-model probe, 2026-12-08)."""
    model = _TensorState(start)
    with pytest.raises(ValueError, match=r"changed the Python attribute 'avg' of the model "
                                         r"\(_TensorState\) \((None|a tensor of shape \(3,\), "
                                         r"torch.float\d+) -> a tensor of shape \(3,\), "
                                         r"torch.float\d+; restored now\).*register_buffer"):
        hg.ForwardMode().hypergradient(p := _small_problem(model), p.init_raw())
    assert model.avg is start


class _DataNorm(nn.Module):
    def __init__(self, cut: str) -> None:
        super().__init__()
        self.a, self.o, self.cut = nn.Linear(4, 6), nn.Linear(6, 3), cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.a.weight
        n = w.data.norm() if self.cut == "data" else w.detach().norm()
        return self.o(torch.tanh(F.linear(x, w / n, self.a.bias)))


def test_the_data_warning_says_forward_and_reverse_mode_differ_through_data() -> None:
    """The warning said every method treats a value read through .data as a constant; through
    .data forward and reverse mode differ from each other (6.4e-4), through .detach() they
    agree (the module zoo probe)."""
    apart = {}
    for cut in ("data", "detach"):
        torch.manual_seed(3)
        p = _small_problem(_DataNorm(cut))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            p.check(p.init_raw())
        said = " ".join(str(w.message) for w in seen
                        if issubclass(w.category, hg.errors.DetachedValueWarning))
        assert ("forward and reverse mode also differ" in said) == (cut == "data"), said
        lam = p.init_raw()
        apart[cut] = hg.testing.rel_err(hg.ForwardMode().hypergradient(p, lam).grad,
                                        hg.ReverseMode().hypergradient(p, lam).grad)
    assert apart["detach"] < 1e-12 < 1e-6 < apart["data"], apart


class _Twice(nn.Module):
    """One block (Linear, BatchNorm) applied twice, and a layer tied to the block's weight;
    ``alias``: the block registered under two names (a ModuleList of one shared block), else
    once and called twice."""

    def __init__(self, alias: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.alias = alias
        self.inp, self.head = nn.Linear(4, 6), nn.Linear(6, 3)
        blk = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
        self.back = nn.Linear(6, 6, bias=False)
        self.back.weight = blk[0].weight  # tied across two module objects
        if alias:
            self.layers = nn.ModuleList([blk, blk])
        else:
            self.blk = blk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        for b in (self.layers if self.alias else (self.blk, self.blk)):
            h = torch.tanh(b(h))
        return self.head(torch.tanh(self.back(h)))


def test_a_submodule_registered_under_two_names_trains_as_one_and_stays_the_users() -> None:
    """A shared block registered twice (``nn.ModuleList([blk, blk])``): torch's functional
    call swapped its tensors twice and left the user's module holding plain tensors instead of
    its parameters, and the problem then blamed the user ('l1.weight was replaced after the
    problem was built'). It now gives exactly the hypergradient of the same block registered
    once, tied weights and BatchNorm included, and leaves the module as it was."""
    got = []
    for alias in (True, False):
        m = _Twice(alias).double()
        x, y = torch.randn(16, 4, dtype=torch.float64), torch.randint(0, 3, (16,))
        p = hg.InnerProblem(m, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                            hg.optim.sgd(lr="lr", weight_decay="wd"),
                            hg.HyperParams([hg.Scalar("lr", 0.1, "log"),
                                            hg.Scalar("wd", 0.01, "log")]),
                            [(x[:8], y[:8]), (x[8:], y[8:])], 4,
                            lambda m, hp: F.cross_entropy(m(x), y))
        r = hg.ForwardMode().hypergradient(p, p.init_raw())
        got.append(torch.cat([r.objective.reshape(1), r.grad]))
        if alias:
            blk = m.layers[0]
            assert m.layers[1] is blk and type(blk[0].weight) is nn.Parameter
            assert m.back.weight is blk[0].weight and int(blk[1].num_batches_tracked) == 0
            assert hypergradcheck(p, raise_exception=False).ok
    torch.testing.assert_close(got[0], got[1], rtol=1e-12, atol=1e-15)


def test_freezing_a_layer_after_the_problem_is_built_is_refused_by_name() -> None:
    """``model[0].requires_grad_(False)`` after ``InnerProblem(model, ...)`` was ignored: the
    problem fixed its trainable parameters when built, and that layer went on training."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    p = _small_problem(m)
    p.run(p.init_raw())
    m[0].requires_grad_(False)
    with pytest.raises(ValueError, match=r"parameters \['0.bias', '0.weight'\] set to "
                                         r"requires_grad=False after the problem was built"):
        p.run(p.init_raw())
    m[0].requires_grad_(True)
    p.run(p.init_raw())  # as built again: runs


def test_a_channels_last_model_gets_forward_mode_hypergradients() -> None:
    """``model.to(memory_format=torch.channels_last)`` (the usual setting for a CNN on a GPU)
    failed in every batched product with torch's "NYI: querying is_contiguous inside of vmap"
    (the CNN probe); the weights are now copied in the default layout."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
                          nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(4 * 2 * 2, 3)).double()
    model = model.to(memory_format=torch.channels_last)
    assert not model[3].weight.is_contiguous()
    x = torch.randn(8, 1, 5, 5, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    y = torch.randint(0, 3, (8,))
    p = hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr", momentum="mom"),
                        hg.HyperParams([hg.Scalar("lr", 0.1, "log"),
                                        hg.Scalar("mom", 0.5, "logit")]),
                        [(x, y)], 3, lambda m, hp: F.cross_entropy(m(x), y))
    lam = p.init_raw()
    fwd = hg.ForwardMode().hypergradient(p, lam).grad
    rev = hg.ReverseMode().hypergradient(p, lam).grad
    assert hg.testing.rel_err(fwd, rev) < 1e-12
    # the module keeps its layout
    assert model[3].weight.is_contiguous(memory_format=torch.channels_last)


def test_a_lazy_module_not_called_yet_is_refused_and_runs_once_called() -> None:
    """nn.LazyLinear before its first call failed inside hypergrad with torch's
    'Attempted to use an uninitialized parameter in <method 'detach'>' (the architectures
    probe)."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 4, dtype=torch.float64), torch.randint(0, 3, (16,))
    model = nn.Sequential(nn.LazyLinear(8), nn.Tanh(), nn.Linear(8, 3)).double()

    def build() -> hg.InnerProblem:
        return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                               hg.optim.sgd(lr="lr"),
                               hg.HyperParams([hg.Scalar("lr", 0.1, "log")]), [(x, y)], 3,
                               lambda m, hp: F.cross_entropy(m(x), y))

    with pytest.raises(ValueError, match=r"the model's '0.weight' \(LazyLinear '0'\) is a lazy "
                                         r"module's parameter .* 2 such tensors\). Call the "
                                         r"model once on a batch"):
        build()
    model(x[:2])
    p = build()
    g = hg.ForwardMode().hypergradient(p, p.init_raw()).grad
    assert torch.allclose(g, hg.ReverseMode().hypergradient(p, p.init_raw()).grad, rtol=1e-10)
