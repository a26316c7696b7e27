"""Each pure optimizer equals torch.optim step for step in float64."""

from __future__ import annotations

import pytest
import torch
from torch.func import jvp

import hypergrad as hg
from hypergrad.optim import safe_sqrt

GRID = [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.05, weight_decay=0.01)),
    ("sgd", dict(lr=0.1, momentum=0.9)),
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=1e-3)),
    ("sgd", dict(lr=0.1, momentum=0.8, nesterov=True)),
    ("sgd", dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.05)),
    ("adam", dict(lr=0.01)),
    ("adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)),
    ("adamw", dict(lr=0.01)),
    ("adamw", dict(lr=0.02, betas=(0.5, 0.9), eps=1e-7, weight_decay=0.1)),
    ("rmsprop", dict(lr=0.01)),
    ("rmsprop", dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.9)),
    ("rmsprop", dict(lr=0.01, centered=True, momentum=0.5)),
    ("rmsprop", dict(lr=0.02, alpha=0.8, centered=True, weight_decay=0.1)),
    ("adagrad", dict(lr=0.1)),
    ("adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.01, eps=1e-6,
                     initial_accumulator_value=0.1)),
]


def _pure(name: str, kw: dict) -> hg.optim.Optimizer:
    return getattr(hg.optim, name)(**kw)  # type: ignore[no-any-return]


EDGE_GRID = [  # settings at the edges of their ranges (the optimizer review, 2026-11-27)
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=0.9)),
    ("sgd", dict(lr=0.1, momentum=0.99, nesterov=True, weight_decay=0.3)),
    ("adam", dict(lr=0.01, betas=(0.0, 0.0))),
    ("adam", dict(lr=0.01, betas=(0.9999, 0.99999), eps=1e-16)),
    ("adam", dict(lr=0.5, betas=(0.5, 0.5), eps=10.0, weight_decay=0.9)),
    ("adamw", dict(lr=0.01, betas=(0.99999, 0.999999), eps=1e-300, weight_decay=0.0)),
    ("rmsprop", dict(lr=0.01, alpha=0.0)),
    ("rmsprop", dict(lr=0.01, alpha=0.3, centered=True, momentum=0.9, eps=1e-3)),
    ("rmsprop", dict(lr=0.01, alpha=0.999999, centered=True, eps=1e-16)),
    ("adagrad", dict(lr=0.1, lr_decay=10.0, eps=1e-300)),
    ("adagrad", dict(lr=0.1, initial_accumulator_value=5.0, weight_decay=0.5)),
]


@pytest.mark.parametrize("name,kw,edge", [(n, kw, False) for n, kw in GRID]
                         + [(n, kw, True) for n, kw in EDGE_GRID],
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(GRID)]
                         + [f"edge-{n}-{i}" for i, (n, _) in enumerate(EDGE_GRID)])
def test_matches_torch_optim(name: str, kw: dict, edge: bool, f64: torch.dtype) -> None:
    """Step for step; at the edge settings also gradients over five orders of magnitude, zero
    gradients two steps in a row and a 0-d parameter."""
    shapes = {"a": (3, 4), "b": (4,), **({"c": ()} if edge else {})}
    params = {k: torch.randn(s, dtype=f64) for k, s in shapes.items()}
    tparams = [params[k].clone().requires_grad_() for k in shapes]
    pure = _pure(name, kw)
    topt = pure.to_torch(tparams)
    state = pure.init(params)
    for step in range(15 if edge else 12):
        scale = 10.0 ** (step % 5 - 2) if edge else 1.0
        grads = {k: torch.randn(s, dtype=f64) * scale for k, s in shapes.items()}
        if step == 3 or (edge and step == 4):  # a zero gradient, as for a dead unit
            grads["b"] = torch.zeros_like(grads["b"])
        for p, k in zip(tparams, shapes):
            p.grad = grads[k].clone()
        topt.step()
        params, state = pure.update(grads, state, params, {}, step)
        for p, k in zip(tparams, shapes):
            torch.testing.assert_close(params[k], p.detach(), rtol=1e-12 if edge else 1e-13,
                                       atol=1e-15)


def test_hyperparameter_bound_arguments_match_constants(f64: torch.dtype) -> None:
    params = {"w": torch.randn(5, dtype=f64)}
    grads = {"w": torch.randn(5, dtype=f64)}
    const = hg.optim.adam(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)
    bound = hg.optim.adam(lr="lr", betas=("b1", 0.99), weight_decay="wd")
    hp = {"lr": torch.tensor(0.01, dtype=f64), "b1": torch.tensor(0.8, dtype=f64),
          "wd": {"w": torch.tensor(0.1, dtype=f64)}}
    p1, _ = const.update(grads, const.init(params), params, {}, 0)
    p2, _ = bound.update(grads, bound.init(params), params, hp, 0)
    torch.testing.assert_close(p1, p2, rtol=0, atol=0)
    assert bound.bound_names() == {"lr": "lr", "b1": "betas[0]", "wd": "weight_decay"}


def test_safe_sqrt_value_and_finite_tangent(f64: torch.dtype) -> None:
    x = torch.tensor([0.0, 4.0], dtype=f64)
    val, tan = jvp(safe_sqrt, (x,), (torch.ones_like(x),))
    assert val.tolist() == [0.0, 2.0]
    assert tan.tolist() == [0.0, 0.25]
    naive = jvp(torch.sqrt, (x,), (torch.ones_like(x),))[1]
    assert not torch.isfinite(naive[0])  # the guard is needed


def test_adam_tangent_finite_with_zero_second_moment(f64: torch.dtype) -> None:
    opt = hg.optim.adam(lr="lr")
    params = {"w": torch.ones(3, dtype=f64)}
    grads = {"w": torch.tensor([0.0, 1.0, -2.0], dtype=f64)}

    def upd(lr: torch.Tensor) -> torch.Tensor:
        return opt.update(grads, opt.init(params), params, {"lr": lr}, 0)[0]["w"]

    _, tan = jvp(upd, (torch.tensor(0.1, dtype=f64),), (torch.tensor(1.0, dtype=f64),))
    assert torch.isfinite(tan).all()


@pytest.mark.parametrize("name,kw", [(n, kw) for n, kw in GRID + EDGE_GRID
                                     if n in ("adam", "adamw")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_flat_update_of_a_plain_run_is_the_per_parameter_one_bit_for_bit(
        name: str, kw: dict, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside autograd (a plain run) Adam and AdamW update the parameters that read the same
    hyperparameter values as one flat tensor: bit for bit the per-parameter update that every
    differentiated pass runs, with the hyperparameters constants, 0-d float64 values shared by
    several tensors or one tensor's own, a value per element, a 0-d parameter, a gradient
    that stays 0 (a zero second moment) and clipping."""
    import importlib

    adam_module = importlib.import_module("hypergrad.optim.adam")  # (the attribute: a factory)
    flat_calls: list[int] = []
    grouping = adam_module.group_by_values

    def counted(*args: object) -> object:  # the flat path groups; the other does not
        flat_calls.append(1)
        return grouping(*args)

    monkeypatch.setattr(adam_module, "group_by_values", counted)
    shapes = {"a": (3, 4), "b": (4,), "c": (), "d": (2, 3), "e": (5,)}
    f64 = torch.float64
    bound = {**kw, "lr": "lr", "weight_decay": "wd"}
    hp = {"lr": torch.tensor(kw["lr"], dtype=f64),
          "wd": {"a": torch.tensor(0.1, dtype=f64), "b": torch.tensor(0.1, dtype=f64),
                 "c": torch.tensor(0.01, dtype=f64), "d": torch.full((2, 3), 0.2, dtype=dtype),
                 "e": torch.tensor(0.1, dtype=f64)}}
    for opt, values in [(_pure(name, kw), {}), (_pure(name, bound), hp),
                        (hg.optim.clip_grad_norm(_pure(name, bound), 0.5), hp)]:
        calls = len(flat_calls)
        gen = torch.Generator().manual_seed(0)
        params = {k: torch.randn(s, generator=gen, dtype=f64).to(dtype)
                  for k, s in shapes.items()}
        flat, loop = (params, opt.init(params)), (params, opt.init(params))
        for step in range(8):
            grads = {k: torch.randn(s, generator=gen, dtype=f64).to(dtype) * 10.0 ** (step % 3)
                     for k, s in shapes.items()}
            grads["b"] = torch.zeros_like(grads["b"])
            with torch.no_grad():
                flat = opt.update(grads, flat[1], flat[0], values, step)
            with torch.enable_grad():  # the per-parameter path
                loop = opt.update(grads, loop[1], loop[0], values, step)
            for x, y in zip([*flat[0].values(), *flat[1].exp_avg.values(),
                             *flat[1].exp_avg_sq.values()],
                            [*loop[0].values(), *loop[1].exp_avg.values(),
                             *loop[1].exp_avg_sq.values()], strict=True):
                assert x.shape == y.shape and x.dtype == y.dtype
                torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True,
                                           msg=f"{opt} at step {step}")
        # every no_grad update, none of the others; in float32 the 0-d float64 values promote
        # the 0-d parameter to float64 after the first (both paths), and mixed dtypes go the
        # per-parameter way
        took = len(flat_calls) - calls
        assert took == 8 if (dtype == f64 or not values) else took == 1


def test_the_flat_update_groups_parameters_by_the_values_they_read() -> None:
    from hypergrad.optim.base import group_by_values

    params = {k: torch.zeros(2) for k in "abcde"}
    f64 = torch.float64
    same = torch.tensor(0.1, dtype=f64)
    params["f"] = torch.tensor(1.0)
    vals = {"a": (same,), "b": (torch.tensor(0.1, dtype=f64),), "c": (0.1,),
            "d": (torch.full((2,), 0.1),), "e": (torch.tensor(0.2, dtype=f64),), "f": (same,)}
    got = [keys for keys, _ in group_by_values(params, lambda k: vals[k])]
    assert got == [["a", "b"], ["c"], ["d"], ["e"], ["f"]]


def test_numpy_numbers_falsy_flags_and_a_pair_entry_are_read_as_torch_reads_them() -> None:
    """The optimizers probe (2026-12-07): lr=np.float32(0.1) was refused as no number (only a
    float subclass passed); adam(amsgrad=0), amsgrad=None and np.False_ were refused although
    torch reads them as off; a bad betas entry was named as betas, with examples no pair
    takes."""
    import numpy as np

    assert hg.optim.sgd(lr=np.float32(0.5), momentum=np.int64(0)).args["lr"] == 0.5
    assert hg.optim.adam(lr="lr", betas=(np.float32(0.5), 0.99)).args["betas"] == (0.5, 0.99)
    for off in (False, 0, None, np.False_):
        hg.optim.adam(lr="lr", amsgrad=off)
        hg.optim.adamw(lr="lr", amsgrad=off)
    for on in (True, 1, np.True_, "no"):
        with pytest.raises(NotImplementedError, match=r"amsgrad=.* is not supported"):
            hg.optim.adam(lr="lr", amsgrad=on)
    with pytest.raises(TypeError, match=r"^adam: betas\[0\]=tensor\(0.9000\) must be a number "
                                        r"or the name of a hyperparameter \(a str\), e.g. "
                                        r"betas=\(0.9, 'b2'\), or a value per parameter"):
        hg.optim.adam(lr="lr", betas=(torch.tensor(0.9), 0.99))


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "rmsprop", "adagrad",
                                  "adamw_schedulefree"])
def test_torch_optim_switches_are_taken_at_torchs_defaults_and_named_otherwise(name: str) -> None:
    """A torch.optim call copied over (``foreach=None, maximize=False``) was refused by Python
    as "got an unexpected keyword argument 'foreach'"; now torch's defaults are taken, and True
    is refused naming the switch and what to do instead."""
    import inspect

    factory = getattr(hg.optim, name)
    off = {"foreach": None, "fused": None, "capturable": False, "differentiable": True,
           "maximize": False}
    assert hg.optim.create(name, lr=0.1, **off).args["lr"] == 0.1
    assert "fused" not in inspect.signature(factory).parameters  # the signature is the factory's
    with pytest.raises(ValueError, match=rf"^{name}: fused=True is a torch.optim switch "
                                         r"hypergrad does not take; drop the argument"):
        factory(lr=0.1, fused=True)
    with pytest.raises(ValueError, match=r"maximize=True .* negate the objective instead"):
        factory(lr=0.1, maximize=True)
    with pytest.raises(TypeError, match=r"foreach='yes' must be True or False"):
        factory(lr=0.1, foreach="yes")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        factory(lr=0.1, bogus=1)


def test_adams_decoupled_weight_decay_switch_points_to_adamw() -> None:
    """torch.optim.Adam's decoupled_weight_decay (torch >= 2.6) gave Python's bare
    "unexpected keyword argument" (the optimizer probe, 2026-12-08): False, as a copied call
    writes it, is taken; True points to adamw."""
    assert hg.optim.adam(lr=0.1, decoupled_weight_decay=False).args["lr"] == 0.1
    with pytest.raises(ValueError, match=r"^adam: decoupled_weight_decay=True is "
                                         r"torch.optim.Adam's switch to AdamW; use "
                                         r"hypergrad.optim.adamw"):
        hg.optim.adam(lr=0.1, decoupled_weight_decay=True)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'decoupled_weight_decay'"):
        hg.optim.sgd(lr=0.1, decoupled_weight_decay=True)  # Adam's only


@pytest.mark.parametrize("foreach", [False, True])
def test_sgd_keeps_no_reference_to_the_callers_gradient(foreach: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.optim.SGD starts its momentum buffer at a copy of the first gradient; the pure
    update kept the caller's tensor, so zeroing the gradient in place zeroed the momentum."""
    import importlib

    sgd_module = importlib.import_module("hypergrad.optim.sgd")  # the module, not the factory
    if foreach:  # the _foreach path (CUDA's) on the CPU
        monkeypatch.setattr(sgd_module, "FOREACH_DEVICES", ("cpu",))
    opt = hg.optim.sgd(lr=0.1, momentum=0.9)
    params = {"w": torch.randn(4, dtype=torch.float64), "b": torch.randn(2, dtype=torch.float64)}
    grads = {k: torch.ones_like(v) for k, v in params.items()}
    _, state = opt.update(grads, opt.init(params), params, {}, 0)
    for g in grads.values():
        g.zero_()
    assert all(bool((b == 1).all()) for b in state.momentum_buffer.values())


def test_the_classes_take_their_factories_defaults() -> None:
    """The callbacks probe (2026-12-07): hg.optim.SGD(lr="lr", momentum=0.9), a public class
    and the natural base of a tangent of one's own, built, then failed at the first update
    with a bare KeyError: 'dampening'."""
    import inspect

    for cls, factory in [(hg.optim.SGD, hg.optim.sgd), (hg.optim.Adam, hg.optim.adam),
                         (hg.optim.AdamW, hg.optim.adamw), (hg.optim.RMSprop, hg.optim.rmsprop),
                         (hg.optim.Adagrad, hg.optim.adagrad),
                         (hg.optim.AdamWScheduleFree, hg.optim.adamw_schedulefree)]:
        made = factory(lr=0.1)
        assert cls(lr=0.1).args == made.args, cls  # the same settings as the factory's
        for k, p in inspect.signature(factory).parameters.items():
            if k in cls.defaults:
                assert cls.defaults[k] == p.default

    class Mine(hg.optim.SGD):  # a subclass of one's own, as extending.md's
        pass

    assert Mine(lr="lr", momentum=0.9).args["dampening"] == 0.0
    with pytest.raises(TypeError, match=r"^sgd: missing argument \['lr'\], e.g. lr=0.1"):
        hg.optim.SGD(momentum=0.9)
