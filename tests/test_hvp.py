"""Chunking of the batched Hessian-vector products: automatic from a memory budget, explicit, or
none; every choice gives the same result (float64). No timings are asserted here: speed is the
business of experiments/benchmarks."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pytest
import torch
from fixtures import SMALL, one_hvp_call, small_cnn_problem

import hypergrad as hg
from hypergrad.errors import UnreadParameterWarning
from hypergrad.hvp import DEFAULT_MEMORY_BUDGET, HVPStrategy, saved_bytes
from hypergrad.testing import digits_case

BATCHED = [hg.hvp.VmapVJP, hg.hvp.BatchedAutograd, hg.hvp.ForwardOverReverse]


@pytest.mark.parametrize("cls", BATCHED)
def test_budget_and_chunk_choices_give_identical_results(cls: type[HVPStrategy]) -> None:
    problem = digits_case("adam", "per_example", **{**SMALL, "steps": 4})  # K = 24
    lam = problem.init_raw()
    whole = hg.ForwardMode(cls(memory_budget=math.inf)).hypergradient(problem, lam).grad
    for strat in (cls(), cls(memory_budget=1.0), cls(memory_budget=5e5), cls(chunk_size=7)):
        got = hg.ForwardMode(strat).hypergradient(problem, lam).grad
        torch.testing.assert_close(got, whole, rtol=1e-12, atol=1e-15)


def test_hvp_outputs_equal_across_chunkings_with_batchnorm() -> None:
    problem = digits_case("momentum", "per_tensor_wd", batchnorm=True, **{**SMALL, "steps": 4})
    *_, ref = one_hvp_call(problem, hg.hvp.VmapVJP(memory_budget=math.inf))
    assert ref[3] and all(z.abs().sum() > 0 for z in ref[3].values())  # running stats' tangents
    for strat in (hg.hvp.VmapVJP(chunk_size=1), hg.hvp.VmapVJP(memory_budget=1.0),
                  hg.hvp.ForwardOverReverse(chunk_size=2), hg.hvp.BatchedAutograd(chunk_size=3),
                  hg.hvp.ColumnLoop()):
        *_, got = one_hvp_call(problem, strat)
        for a, b in zip(got, ref):  # g, new_b, G, Zb_new
            assert set(a) == set(b)
            for k in b:
                torch.testing.assert_close(a[k], b[k], rtol=1e-11, atol=1e-14)


def test_columns_per_call_follows_the_budget() -> None:
    problem = digits_case("sgd", "per_example", **{**SMALL, "steps": 4})  # K = 24
    f, s, _, lam, _, _ = one_hvp_call(problem, hg.hvp.VmapVJP())
    saved = saved_bytes(f, s.params, s.buffers, lam)
    assert saved > 0
    fallback = hg.hvp.VmapVJP().column_bytes(saved, sum(v.numel() * v.element_size()
                                                    for v in s.params.values()))
    assert fallback == hg.hvp.VmapVJP.column_memory_factor * saved + 2 * sum(
        v.numel() * v.element_size() for v in s.params.values())
    # the bytes a column holds, counted on fake tensors (issue 23.6): what chunking divides by
    first, per_col = hg.hvp.VmapVJP().column_cost(f, s.params, s.buffers, lam)
    assert 0 < per_col < first

    def chunk(**kw: float) -> int:
        return hg.hvp.VmapVJP(**kw).columns_per_call(f, s.params, s.buffers, lam, 24)  # type: ignore

    assert chunk() == 24  # a small model: the default budget holds every column
    assert chunk(memory_budget=math.inf) == 24
    assert chunk(memory_budget=1.0) == 1
    assert chunk(memory_budget=per_col * 5.5) == 5  # 5 fit: 5 chunks of 5, 5, 5, 5, 4
    assert chunk(memory_budget=per_col * 12.5) == 12
    assert chunk(memory_budget=per_col * 13.5) == 12  # 13 fit: 2 chunks, balanced 12 + 12
    assert hg.hvp.VmapVJP(chunk_size=7).columns_per_call(f, s.params, s.buffers, lam, 24) == 7
    assert hg.hvp.VmapVJP(chunk_size=70).columns_per_call(f, s.params, s.buffers, lam, 24) == 24
    assert DEFAULT_MEMORY_BUDGET == 2**30


def test_saved_bytes_leave_out_the_weights() -> None:
    """A layer saves its weight for backward, but every column of a batched product shares it:
    only activations count per column."""
    problem = digits_case("sgd", "lr", **{**SMALL, "steps": 4})
    f, s, _, lam, _, _ = one_hvp_call(problem, hg.hvp.VmapVJP())
    saved = saved_bytes(f, s.params, s.buffers, lam)
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    p = {k: v.detach().requires_grad_() for k, v in s.params.items()}
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        f(p, s.buffers, lam.detach().requires_grad_())
    weights = {v.untyped_storage().data_ptr() for v in s.params.values()}
    inputs = weights | {lam.untyped_storage().data_ptr()}
    assert weights & set(seen)  # the layers saved their weights ...
    assert saved == sum(n for ptr, n in seen.items() if ptr not in inputs) > 0  # ... not counted


def test_saved_bytes_grows_with_the_batch() -> None:
    small = digits_case("sgd", "lr", **{**SMALL, "batch_size": 4})
    large = digits_case("sgd", "lr", **{**SMALL, "batch_size": 16})
    sizes = []
    for p in (small, large):
        s, lam, batch = p.initial_state(), p.init_raw(), p.batch(0)
        sizes.append(saved_bytes(lambda a, b, c: p.train_objective(a, b, c, 0, batch),
                                 s.params, s.buffers, lam))
    assert sizes[1] > sizes[0] > 0


@pytest.mark.parametrize("bad", [0, -1.0, "1GB", True, float("nan")])
def test_bad_memory_budget_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match=r"VmapVJP: memory_budget="):
        hg.hvp.VmapVJP(memory_budget=bad)  # type: ignore[arg-type]


def test_bad_compile_flag_and_reprs() -> None:
    with pytest.raises(TypeError, match="compile"):
        hg.hvp.VmapVJP(compile="yes")  # type: ignore[arg-type]
    assert repr(hg.hvp.VmapVJP()) == "VmapVJP(chunk_size=None, memory_budget=None)"
    assert "compile=True" in repr(hg.hvp.VmapVJP(compile=True))
    assert repr(hg.hvp.ColumnLoop()) == "ColumnLoop()"
    assert repr(hg.hvp.ForwardOverReverse(memory_budget=2.0)) == (
        "ForwardOverReverse(chunk_size=None, memory_budget=2.0)")
    # the existing constructor forms keep working
    assert hg.hvp.VmapVJP(chunk_size=5).chunk_size == 5
    assert hg.hvp.BatchedAutograd(5).chunk_size == 5


def test_compiled_vmap_vjp_equals_eager() -> None:
    """The optional torch.compile path: the same hypergradient as eager (float64), chunked,
    with a Scalar and a per-example weight (no step-dependent values: one graph)."""
    problem = digits_case("momentum", "per_example", steps=3, n_train=16, batch_size=8,
                          hidden=6, n_val=16)
    lam = problem.init_raw()
    eager = hg.ForwardMode(hg.hvp.VmapVJP(chunk_size=8)).hypergradient(problem, lam).grad
    compiled = hg.ForwardMode(hg.hvp.VmapVJP(chunk_size=8, compile=True)).hypergradient(
        problem, lam)
    torch.testing.assert_close(compiled.grad, eager, rtol=1e-10, atol=1e-13)
    # ForwardMode(compile=True) is that path, keeping the strategy's chunking
    fm = hg.ForwardMode(hg.hvp.VmapVJP(chunk_size=8), compile=True)
    assert fm.hvp.compile and fm.hvp.chunk_size == 8 and "compile=True" in repr(fm)
    torch.testing.assert_close(fm.hypergradient(problem, lam).grad, eager, rtol=1e-10,
                               atol=1e-13)
    with pytest.raises(ValueError, match=r"compile=True compiles VmapVJP's batched products"):
        hg.ForwardMode(hg.hvp.ColumnLoop(), compile=True)


def test_strategy_options_are_checked() -> None:
    m = hg.ForwardMode(hg.hvp.VmapVJP(memory_budget=2**29, compile=True))
    assert m.hvp.compile and m.hvp.memory_budget == 2**29
    assert hg.hvp.ForwardOverReverse(chunk_size=3).chunk_size == 3
    with pytest.raises(ValueError, match="memory_budget=0"):
        hg.hvp.VmapVJP(memory_budget=0)
    with pytest.raises(ValueError, match="chunk_size=0"):
        hg.hvp.VmapVJP(chunk_size=0)
    # NumPy numbers (a grid's values), as Guards and check_memory take them: they were refused
    # as "must be ... a number of bytes > 0" (the memory probe)
    import numpy as np

    s = hg.hvp.VmapVJP(chunk_size=np.int64(3), memory_budget=np.float32(1e9))
    assert s.chunk_size == 3 and type(s.chunk_size) is int and s.memory_budget == 1e9
    with pytest.raises(ValueError, match="chunk_size=2.0"):
        hg.hvp.VmapVJP(chunk_size=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="hvp must be an HVPStrategy"):
        hg.ForwardMode("loop")  # type: ignore[arg-type]


def test_compiled_cnn_after_another_model_equals_eager() -> None:
    """A convolution's double backward under vmap traces with static shapes only (torch 2.13).
    Each compiled strategy gets its own code object, so an earlier strategy's recompiles (which
    make dynamo trace later calls with dynamic shapes) do not reach this one: no fallback
    warning (warnings are errors here), the eager result."""
    mlp = digits_case("momentum", "lr", steps=3, n_train=16, batch_size=8, hidden=6, n_val=16)
    # its steps recompile (the step index changes), after which dynamo traces dynamically
    hg.ForwardMode(hg.hvp.VmapVJP(compile=True)).hypergradient(mlp, mlp.init_raw())
    problem = small_cnn_problem()
    lam = problem.init_raw()
    strat = hg.hvp.VmapVJP(compile=True)
    got = hg.ForwardMode(strat).hypergradient(problem, lam).grad
    assert strat._compiled is not None and not strat._compile_failed
    want = hg.ForwardMode().hypergradient(problem, lam).grad
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_compile_failure_falls_back_to_eager_with_a_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch.compile cannot trace the model, the strategy warns once and runs eager, with
    the eager result."""
    def fails(*args: object, **kwargs: object) -> object:
        raise RuntimeError("cannot trace this")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fails)
    problem = small_cnn_problem()
    lam = problem.init_raw()
    strat = hg.hvp.VmapVJP(compile=True)
    with pytest.warns(RuntimeWarning, match=r"torch.compile failed on this model \(RuntimeError: "
                                            r"cannot trace this\)"):
        got = hg.ForwardMode(strat).hypergradient(problem, lam).grad
    assert strat._compile_failed
    want = hg.ForwardMode().hypergradient(problem, lam).grad
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_forward_over_reverse_names_the_torch_mse_loss_bug(f64: torch.dtype) -> None:
    """torch 2.13's forward-over-reverse rule of F.mse_loss(reduction='mean') writes into a zero
    tangent of the target (pytorch/pytorch#123996): a clear error with the fix, not torch's."""
    import torch.nn.functional as F

    x, y = torch.randn(16, 3, dtype=f64), torch.randn(16, dtype=f64)
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    problem = hg.InnerProblem(torch.nn.Linear(3, 1).double(),
                              lambda m, b, hp: F.mse_loss(m(b[0])[:, 0], b[1]),
                              hg.optim.sgd(lr="lr"), hps, [(x, y)], 2,
                              lambda m, hp: F.mse_loss(m(x)[:, 0], y))
    with pytest.raises(RuntimeError, match="pytorch/pytorch#123996.*VmapVJP"):
        hg.ForwardMode(hg.hvp.ForwardOverReverse()).hypergradient(problem, problem.init_raw())
    hg.ForwardMode().hypergradient(problem, problem.init_raw())  # the default works


@pytest.mark.parametrize("strategy", [hg.hvp.VmapVJP, hg.hvp.BatchedAutograd,
                                      hg.hvp.ForwardOverReverse])
def test_chunking_does_not_change_results(strategy: type[HVPStrategy]) -> None:
    problem = digits_case("adam", "per_example", **SMALL)  # K = 24
    lam = problem.init_raw()
    whole = hg.ForwardMode(strategy()).hypergradient(problem, lam).grad
    for chunk in (1, 5, 24, 100):
        part = hg.ForwardMode(strategy(chunk_size=chunk)).hypergradient(problem, lam).grad
        torch.testing.assert_close(part, whole, rtol=1e-12, atol=1e-15)


def test_loop_baseline_equals_batched() -> None:
    problem = digits_case("nesterov", "schedule", **SMALL)
    lam = problem.init_raw()
    a = hg.ForwardMode(hg.hvp.ColumnLoop()).hypergradient(problem, lam).grad
    b = hg.ForwardMode(hg.hvp.VmapVJP()).hypergradient(problem, lam).grad
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


class _UnusedLayer(torch.nn.Module):
    """A model with a layer the training loss never reads (an unused head)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.extra = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


def _unused_layer_problem(model: torch.nn.Module, optimizer: hg.optim.Optimizer,
                          hps: hg.HyperParams, n: int, steps: int) -> hg.InnerProblem:
    """Cross-entropy on ``n`` random examples of 6 features and 3 classes, batches of 8."""
    import torch.nn.functional as F

    from hypergrad.data import MiniBatches

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)
    return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]), optimizer,
                           hps, MiniBatches(x, y, batch_size=8, seed=0), steps,
                           lambda m, hp: F.cross_entropy(m(x), y))


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("k", [1, 2])
def test_a_parameter_the_loss_never_reads_gets_a_zero_product_of_its_shape(
        opt: str, k: int) -> None:
    """The per-column path (ColumnLoop at every K, VmapVJP at K = 1) gave such a parameter a
    product of shape (K, 1, *shape): AdamW's tangent failed ('output with shape [1, 3, 6]
    doesn't match the broadcast shape [1, 1, 3, 6]'), SGD's broadcast it on."""
    from hypergrad.testing import hypergradcheck

    names = ["lr", "wd"][:k]
    factory = hg.optim.sgd if opt == "sgd" else hg.optim.adamw
    torch.manual_seed(0)
    p = _unused_layer_problem(
        _UnusedLayer().double(), factory(lr="lr", weight_decay="wd" if k == 2 else 0.1),
        hg.HyperParams([hg.Scalar(n, 0.05, transform="log") for n in names]), 40, 4)
    with pytest.warns(UnreadParameterWarning, match="'extra.weight', 'extra.bias'"):
        hypergradcheck(p)  # every strategy against reverse mode and finite differences


def _unused_head_run(weight_decay: float, freeze: bool) -> tuple[list[str], dict, dict]:
    """SGD on :class:`_UnusedLayer`: the names of the warnings a plain run gives (under
    no_grad, as the Trainer's: the probe takes its gradient all the same), and the unused
    head's weights after 3 steps and before (torch.optim leaves them as they were)."""
    import warnings

    torch.manual_seed(0)
    model = _UnusedLayer().double()
    if freeze:
        model.extra.requires_grad_(False)
    reference = {k: v.detach().clone() for k, v in model.extra.named_parameters()}
    p = _unused_layer_problem(model, hg.optim.sgd(lr="lr", weight_decay=weight_decay),
                              hg.HyperParams([hg.Scalar("lr", 0.1)]), 24, 3)
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():  # as a plain run
        warnings.simplefilter("always")
        state = p.run(p.init_raw())
    trained = {k[len("extra."):]: v for k, v in {**state.params, **p.fmodel.constants}.items()
               if k.startswith("extra.")}
    return [w.category.__name__ for w in seen], trained, reference


@pytest.mark.parametrize("weight_decay,freeze,warned", [(0.1, False, True), (0.0, False, False),
                                                        (0.1, True, False)])
def test_a_parameter_the_loss_never_reads_is_named_when_weight_decay_moves_it(
        weight_decay: float, freeze: bool, warned: bool) -> None:
    """torch.optim skips a parameter whose .grad is None; hypergrad updates it with a zero
    gradient, so weight decay shrinks it: silent before, now a warning naming the parameters
    and the fix (freezing them, after which the head stays as torch leaves it)."""
    seen, trained, start = _unused_head_run(weight_decay, freeze)
    assert ("UnreadParameterWarning" in seen) == warned
    moved = not torch.equal(trained["weight"], start["weight"])
    assert moved == (weight_decay > 0 and not freeze)


class _NoState(NamedTuple):
    """:class:`_L2SGD` keeps nothing between steps."""


class _L2SGD(hg.optim.Optimizer):
    """A user's SGD whose L2 decay is named ``l2`` (not ``weight_decay``)."""

    hyper_args = ("lr", "l2")
    elementwise = True

    def init(self, params: dict) -> _NoState:
        return _NoState()

    def update(self, grads: dict, state: _NoState, params: dict, hp: Any, step: int
               ) -> tuple[dict, _NoState]:
        lr, l2 = self.args["lr"], self.args["l2"]
        return {k: w - self.read(lr, hp, k) * (grads[k] + self.read(l2, hp, k) * w)
                for k, w in params.items()}, state


@pytest.mark.parametrize("case,warned", [("l2_by_another_name", True),
                                         ("no_decay_on_the_head", False),
                                         ("decay_after_a_zero_warmup", True)])
def test_the_unread_parameter_check_reads_the_update_not_argument_names(
        case: str, warned: bool) -> None:
    """The check runs one update with zero gradients: a decay under another name is found
    (the name check missed it), a PerGroup that gives the unread head no decay is not warned
    about (the name check warned: weight_decay was a hyperparameter's name), and a learning
    rate that starts at 0 still shows the decay at the later steps."""
    import warnings

    torch.manual_seed(0)
    model = _UnusedLayer().double()
    start = model.extra.weight.detach().clone()
    if case == "l2_by_another_name":
        opt: hg.optim.Optimizer = _L2SGD(lr="lr", l2=0.1)
        hps = hg.HyperParams([hg.Scalar("lr", 0.1)])
    elif case == "no_decay_on_the_head":
        opt = hg.optim.adamw(lr=0.05, weight_decay="wd")
        hps = hg.HyperParams([hg.PerGroup("wd", 0.1, "log", groups={"used": r"^a\."},
                                          default=0.0)])
    else:
        opt = hg.optim.sgd(lr="lr", weight_decay=0.1)
        hps = hg.HyperParams([hg.Schedule("lr", [0.0, 0.1], windows=2)])
    p = _unused_layer_problem(model, opt, hps, 24, 4)
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always")
        state = p.run(p.init_raw())
    names = [str(w.message) for w in seen if w.category is UnreadParameterWarning]
    assert bool(names) == warned, names
    if warned:
        assert "'extra.weight', 'extra.bias'" in names[0] and "requires_grad_(False)" in names[0]
    assert (not torch.equal(state.params["extra.weight"], start)) == warned  # what it says


def test_compile_false_with_a_compiling_strategy_is_refused() -> None:
    """compile=False ("never compile") with VmapVJP(compile=True) compiled anyway, while the
    repr and the log said compile=False."""
    with pytest.raises(ValueError, match=r"compile=False \(never compile\) with "
                                         r"hvp=VmapVJP\(.*compile=True\), which compiles"):
        hg.ForwardMode(hg.hvp.VmapVJP(compile=True), compile=False)
    assert "compile=True" in repr(hg.MARTHE(compile=True))
    assert repr(hg.MARTHE()) == "MARTHE(mu=0.9)"


def test_compiled_batchnorm_model_equals_eager_without_falling_back() -> None:
    """hypergrad's BatchNorm handling patched the module's forward and restored it with
    `del m.forward`, which dynamo cannot trace: every model with BatchNorm ran eager under
    compile=True, warning "'BatchNorm1d' object has no attribute 'forward'"."""
    problem = digits_case("momentum", "lr", steps=2, n_train=16, batch_size=8, hidden=6,
                          n_val=16, batchnorm=True)
    lam = problem.init_raw()
    strat = hg.hvp.VmapVJP(compile=True)
    got = hg.ForwardMode(strat).hypergradient(problem, lam).grad  # warnings are errors here
    assert strat._compiled is not None and not strat._compile_failed
    want = hg.ForwardMode().hypergradient(problem, lam).grad
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
