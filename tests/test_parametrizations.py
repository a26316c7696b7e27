"""Issue 23, group 2: models that change their weights or buffers in forward, or reach their
weights through a parametrization, give exact hypergradients (forward = reverse = central
finite differences in float64, every HVP strategy equal: ``hypergradcheck``) and leave the
user's module untouched, or are refused up front with an error naming the module.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations as P
from torch.nn.utils import parametrize

import hypergrad as hg
from hypergrad.testing import hypergradcheck

D = torch.float64


def _problem(model: nn.Module, steps: int = 3, val_mode: str = "eval") -> hg.InnerProblem:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=g, dtype=D)
    y = torch.randint(0, 3, (16,), generator=g)
    return hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.optim.sgd(lr="lr", momentum=0.5),
        hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")]),
        [(x[:8], y[:8]), (x[8:], y[8:])], steps, lambda m, hp: F.cross_entropy(m(x), y),
        val_mode=val_mode)


def _exact_and_untouched(model: nn.Module, **kw: Any) -> hg.InnerProblem:
    """hypergradcheck passes (raises otherwise) and the module's tensors are as before."""
    before = copy.deepcopy(model.state_dict())
    problem = _problem(model, **kw)
    rep = hypergradcheck(problem, rtol_rev=1e-8, rtol_strategies=1e-9)
    assert rep.max("fwd_vs_rev") <= 1e-8
    assert all(rep.fwd_vs_fd[n] <= rep.fd_tolerance[n] for n in rep.fwd_vs_fd)
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k, v in before.items():
        assert torch.equal(v, after[k]), f"{k} changed"
    return problem


def _mlp(first: nn.Module, width: int = 5) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(first, nn.Tanh(), nn.Linear(width, 3)).to(D)


# -- parametrizations: exact ----------------------------------------------------------------------
class _Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).transpose(-1, -2)


class _RowNorm(nn.Module):
    """The out-of-place replacement of nn.Embedding(max_norm=...) the error suggests."""

    def __init__(self, max_norm: float) -> None:
        super().__init__()
        self.max_norm = max_norm

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * (self.max_norm / w.norm(dim=1, keepdim=True)).clamp(max=1)


def _user_parametrized() -> nn.Module:
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    parametrize.register_parametrization(lin, "weight", _Symmetric())
    return nn.Sequential(lin, nn.Tanh(), nn.Linear(4, 3)).to(D)


class _Embed(nn.Module):
    def __init__(self, max_norm: float | None = None, rownorm: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 4, max_norm=max_norm)
        if rownorm:
            parametrize.register_parametrization(self.emb, "weight", _RowNorm(0.5))
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = (x.abs() * 3).long().clamp(max=9)
        return self.out(self.emb(idx).mean(1))


class _SNConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = P.spectral_norm(nn.Conv1d(1, 2, 3), n_power_iterations=2)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.conv(x[:, None, :])).mean(1).repeat(1, 2))


PARAMETRIZED: dict[str, Callable[[], nn.Module]] = {
    "spectral_norm": lambda: _mlp(P.spectral_norm(nn.Linear(4, 5))),
    "spectral_norm_conv_2_iterations": lambda: _SNConv().to(D),
    "weight_norm": lambda: _mlp(P.weight_norm(nn.Linear(4, 5))),
    "weight_norm_dim_none": lambda: _mlp(P.weight_norm(nn.Linear(4, 5), dim=None)),
    "weight_norm_dim_1": lambda: _mlp(P.weight_norm(nn.Linear(4, 5), dim=1)),
    "orthogonal": lambda: _mlp(P.orthogonal(nn.Linear(4, 4)), width=4),
    "user_parametrization": _user_parametrized,
    "embedding_rownorm": lambda: _Embed(rownorm=True).to(D),
}


@pytest.mark.parametrize("name", PARAMETRIZED)
def test_parametrized_models_are_exact_and_left_untouched(name: str) -> None:
    model = PARAMETRIZED[name]()
    problem = _exact_and_untouched(model)
    trained = [k for k in problem.fmodel.param_names if ".parametrizations." in f".{k}"]
    assert trained, "the parametrization's original tensors are what training updates"


def test_a_parametrized_model_inside_parametrize_cached_is_refused() -> None:
    """The dtypes probe (2026-12-07): inside torch.nn.utils.parametrize.cached() the weight is
    computed once from the module's own tensors, so every step read it frozen: forward,
    reverse and finite differences agreed with each other, 36 % off torch's training."""
    from torch.nn.utils import parametrize

    problem = _problem(PARAMETRIZED["user_parametrization"]())
    lam = problem.init_raw()
    with parametrize.cached(), pytest.raises(RuntimeError, match=r"inside parametrize.cached"):
        hg.ForwardMode().hypergradient(problem, lam)
    hg.ForwardMode().hypergradient(problem, lam)  # outside: runs


def test_spectral_norm_vectors_are_state_and_its_values_are_torchs() -> None:
    model = _mlp(P.spectral_norm(nn.Linear(4, 5)))
    problem = _problem(model)
    names = {"0.parametrizations.weight.0._u", "0.parametrizations.weight.0._v"}
    assert names <= set(problem.initial_state().buffers)
    # the loss of the first step (train mode: one power iteration) is torch's own
    ref = copy.deepcopy(model).train()
    x, y = problem.batch(0)
    s = problem.initial_state()
    ours, new_b = problem.train_objective(s.params, s.buffers, problem.init_raw(), 0, (x, y))
    theirs = F.cross_entropy(ref(x), y)
    torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=0)
    for k in names:  # the vectors after the power iteration too
        torch.testing.assert_close(new_b[k], ref.get_buffer(k), rtol=1e-14, atol=0)
    final = problem.run(problem.init_raw())
    assert not torch.equal(final.buffers["0.parametrizations.weight.0._u"],
                           model.get_buffer("0.parametrizations.weight.0._u"))


@pytest.mark.parametrize(("iterations", "tol"), [(1, 1e-6), (30, 1e-14)])
def test_spectral_norm_gradient_differs_from_torchs_only_by_the_unconverged_term(
        iterations: int, tol: float) -> None:
    """The power iteration is differentiated (torch stops it): the training gradient differs
    from torch's by a term that vanishes as the iteration converges."""
    torch.manual_seed(0)
    model = _mlp(P.spectral_norm(nn.Linear(4, 5), n_power_iterations=iterations))
    problem = _problem(model)
    x, y = problem.batch(0)
    s = problem.initial_state()
    ours = torch.func.grad(lambda w: problem.train_objective(
        w, s.buffers, problem.init_raw(), 0, (x, y))[0])(s.params)
    ref = copy.deepcopy(model).train()
    F.cross_entropy(ref(x), y).backward()
    for k, p in ref.named_parameters():
        assert p.grad is not None
        assert float((ours[k] - p.grad).norm() / p.grad.norm()) <= tol, k


def test_weight_norm_computes_torchs_weight() -> None:
    model = nn.Sequential(P.weight_norm(nn.Conv1d(2, 3, 3), dim=1)).to(D)
    problem = hg.InnerProblem(model, lambda m, b, hp: m(b).square().mean(), hg.optim.sgd(lr="lr"),
                              hg.HyperParams([hg.Scalar("lr", 0.1)]),
                              [torch.randn(4, 2, 6, dtype=D)], 2, lambda m, hp: m.params[
                                  "0.parametrizations.weight.original0"].sum())
    s = problem.initial_state()
    x = torch.randn(4, 2, 6, dtype=D)
    ours = problem.fmodel.bind(s.params, s.buffers, True)(x)
    torch.testing.assert_close(ours, model(x), rtol=1e-14, atol=1e-15)


# -- forward writes buffers: state, exact ---------------------------------------------------------
class _Counter(nn.Module):
    """Counts its training calls in an integer buffer and remembers a flag in a bool one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("seen", torch.zeros((), dtype=torch.bool))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.count += 1
            self.seen.fill_(True)
        return self.lin(x)


class _Running(nn.Module):
    """A running mean of the layer's output, read in eval mode: updated in place with
    autograd on (``inplace``), by assignment, under ``torch.no_grad()`` or with ``.detach()``;
    of the input (``of_input``) it does not depend on the weights."""

    def __init__(self, how: str = "inplace", of_input: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)
        self.register_buffer("running_mean", torch.zeros(3))
        self.how, self.of_input = how, of_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if not self.training:
            return y - self.running_mean
        z = x[:, :3] if self.of_input else y
        if self.how == "inplace":
            self.running_mean.mul_(0.9).add_(0.1 * z.mean(0))
        elif self.how == "assign":
            self.running_mean = 0.9 * self.running_mean + 0.1 * z.mean(0)
        elif self.how == "no_grad":
            with torch.no_grad():
                self.running_mean.mul_(0.9).add_(0.1 * z.mean(0))
        else:  # detach
            self.running_mean = 0.9 * self.running_mean + 0.1 * z.mean(0).detach()
        return y - y.mean(0)


def test_integer_and_boolean_buffers_written_in_forward_are_carried() -> None:
    model = _Counter().to(D)
    problem = _exact_and_untouched(model)
    final = problem.run(problem.init_raw())
    assert float(final.buffers["count"]) == 3 and float(final.buffers["seen"]) == 1
    assert int(model.count) == 0 and not bool(model.seen)


@pytest.mark.parametrize("how", ["inplace", "assign"])
def test_float_buffers_written_and_read_are_state_with_tangents(how: str) -> None:
    model = _Running(how).to(D)
    problem = _exact_and_untouched(model)
    final = problem.run(problem.init_raw())
    # the running mean accumulates over the steps (before: an assignment was lost each call)
    assert float(final.buffers["running_mean"].abs().sum()) > 0
    assert float(model.running_mean.abs().sum()) == 0


def test_a_buffer_of_the_inputs_updated_under_no_grad_is_exact() -> None:
    _exact_and_untouched(_Running("no_grad", of_input=True).to(D))


@pytest.mark.parametrize("how", ["no_grad", "detach"])
def test_a_buffer_cut_from_the_weights_and_read_is_refused(how: str) -> None:
    model = _Running(how).to(D)
    before = copy.deepcopy(model.state_dict())
    p = _problem(model)
    with pytest.raises(ValueError, match=r"the forward of the model \(_Running\) updates its "
                                         r"buffer 'running_mean' from values that depend on "
                                         r"the weights .*self\.running_mean = \(1 - m\)"):
        p.check(p.init_raw())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_buffer_that_changes_shape_is_refused() -> None:
    class Cache(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.register_buffer("last", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            self.last = y.detach()
            return y

    p = _problem(nn.Sequential(Cache()).to(D))
    with pytest.raises(ValueError, match=r"module '0' \(Cache\) replaces its buffer '0.last' "
                                         r"\(torch.float64, shape \(3,\)\) by one of "
                                         r"torch.float64, shape \(\d+, 3\)"):
        p.check(p.init_raw())


def test_complex_buffers_and_parameters_are_refused_with_a_fix_that_applies() -> None:
    """The dtypes probe (2026-12-07): a complex buffer written in forward was told it was
    replaced "by one of torch.complex128, shape (3,)", its own dtype and shape; a complex
    parameter was told model.double(), which leaves it complex."""

    class Phase(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3).to(D)  # .to(D) on the module casts the buffer to real
            self.register_buffer("z", torch.zeros(3, dtype=torch.complex128))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.z = self.z * 0.5 + 1j
            return self.lin(x) + self.z.real

    p = _problem(nn.Sequential(Phase()))
    with pytest.raises(ValueError, match=r"writes its complex buffer '0.z' \(torch.complex128\); "
                                         r".*torch.view_as_real"):
        p.check(p.init_raw())

    class Rotor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3, dtype=torch.complex128))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x[:, :3] * self.w).real

    with pytest.raises(TypeError, match=r"parameter 'w' has dtype torch.complex128; .*two real "
                                        r"ones"):
        _problem(Rotor())


# -- forward writes weights: refused, naming the module -------------------------------------------
class _Clamped(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "data":
            self.lin.weight.data.clamp_(-0.3, 0.3)
        else:
            with torch.no_grad():
                self.lin.weight.clamp_(-0.3, 0.3)
        return self.lin(x)


class _ClampingLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.weight.clamp_(-0.3, 0.3)
        return super().forward(x)


@pytest.mark.parametrize("how", ["data", "no_grad"])
def test_weights_clamped_in_place_in_forward_are_refused(how: str) -> None:
    model = _Clamped(how).to(D)
    before = copy.deepcopy(model.state_dict())
    p = _problem(model)
    with pytest.raises(ValueError, match=r"the forward of the model \(_Clamped\) writes the "
                                         r"parameter 'lin.weight' in place.*"
                                         r"w = self.lin.weight.clamp\(-1, 1\).*parametrization"):
        p.check(p.init_raw())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_the_submodule_that_clamps_is_named() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), _ClampingLinear(4, 3)).to(D)
    p = _problem(model)
    with pytest.raises(ValueError, match=r"the forward of module '2' \(_ClampingLinear\) writes "
                                         r"the parameter '2.weight' in place.*self.weight"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_embedding_max_norm_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"module 'emb' is Embedding\(max_norm=1.0\), which "
                                         r"renormalises the rows .*RowNorm"):
        _problem(_Embed(max_norm=1.0).to(D))


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
@pytest.mark.parametrize("kind", ["spectral_norm", "weight_norm"])
def test_the_hook_based_normalisations_are_refused(kind: str) -> None:
    model = _mlp(getattr(torch.nn.utils, kind)(nn.Linear(4, 5)))
    with pytest.raises(ValueError, match=rf"module '0' \(Linear\) uses the hook-based "
                                         rf"torch.nn.utils.{kind}.*parametrizations.{kind}"):
        _problem(model)


def test_batchnorm_counters_keep_working() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5, momentum=None), nn.Tanh(),
                          nn.Linear(5, 3)).to(D)
    problem = _exact_and_untouched(model)
    assert problem.fmodel.generic == {}
    assert set(problem.initial_state().buffers) == {"1.running_mean", "1.running_var"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_are_refused(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=rf"the model's parameters are {dtype}; hypergradients "
                                        rf"need float32 or float64.*model.float\(\)"):
        _problem(nn.Linear(4, 3).to(dtype))
