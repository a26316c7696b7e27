"""Bad input fails early with a message naming the argument, what came, and the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.testing import digits_case, hypergradcheck


def _problem(hps: list[Any] | None = None, opt: hg.optim.Optimizer | None = None,
             steps: int = 3, train_loss: Any = None, val_loss: Any = None,
             dtype: torch.dtype = torch.float64) -> hg.InnerProblem:
    model = nn.Linear(4, 3).to(dtype)
    x, y = torch.randn(8, 4, dtype=dtype), torch.randint(0, 3, (8,))

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    def vl(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    return hg.InnerProblem(model, train_loss or tl, opt or hg.sgd(lr="lr"),
                           hg.HyperParams(hps or [hg.Scalar("lr", 0.1, transform="log")]),
                           [(x, y)], steps, val_loss or vl)


def test_k_zero() -> None:
    with pytest.raises(ValueError, match=r"K = 0"):
        hg.HyperParams([])


def test_t_zero() -> None:
    with pytest.raises(ValueError, match=r"steps=0 must be an int >= 1"):
        _problem(steps=0)


def test_unknown_name_in_optimizer() -> None:
    with pytest.raises(ValueError, match=r"lr='lrr' names no hyperparameter; defined are \['lr'\]"):
        _problem(opt=hg.sgd(lr="lrr"))


def test_unknown_name_in_loss() -> None:
    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1]) * hp["scale"]

    p = _problem(train_loss=tl)
    with pytest.raises(KeyError, match=r"unknown hyperparameter 'scale'; defined are \['lr'\]"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_bound_to_nothing() -> None:
    p = _problem(hps=[hg.Scalar("lr", 0.1, transform="log"), hg.Scalar("unused", 1.0)])
    with pytest.raises(ValueError, match=r"\['unused'\] are bound to nothing"):
        hg.ReverseMode().hypergradient(p, p.init_raw())


def test_loss_not_scalar() -> None:
    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1], reduction="none")

    p = _problem(train_loss=tl)
    with pytest.raises(ValueError, match=r"train_loss returned a tensor of shape \(8,\).*mean"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_loss_not_tensor() -> None:
    p = _problem(val_loss=lambda m, hp: 1.0)
    with pytest.raises(TypeError, match="val_loss returned float"):
        hg.ForwardMode().hypergradient(p, p.init_raw())


def test_lam_wrong_shape_and_dtype() -> None:
    p = _problem()
    with pytest.raises(ValueError, match=r"lam has shape \(2,\), expected \(1,\)"):
        hg.ForwardMode().hypergradient(p, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="lam has dtype torch.int64"):
        hg.ForwardMode().hypergradient(p, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"lam has dtype torch.float32 but the model is "):
        hg.ForwardMode().hypergradient(p, torch.zeros(1, dtype=torch.float32))


def test_non_float_dtype() -> None:
    with pytest.raises(TypeError, match="not a floating dtype"):
        hg.HyperParams([hg.Scalar("lr", 0.1)]).init_raw(torch.int32)
    model = nn.Linear(2, 2).double()
    model.weight.data = model.weight.data.half()
    with pytest.raises(TypeError, match="mix dtypes"):
        hg.InnerProblem(model, lambda m, b, hp: 0, hg.sgd(lr=0.1),
                        hg.HyperParams([hg.Scalar("x", 1.0)]), [0], 1, lambda m, hp: 0)


def test_shape_mismatches() -> None:
    with pytest.raises(ValueError, match=r"init has shape \(2,\), expected a number or shape"):
        hg.HyperParams([hg.Tensor("t", [1.0, 2.0], shape=(3,))]).init_raw()
    with pytest.raises(ValueError, match=r"params \['nope'\] are not trainable parameters"):
        _problem(hps=[hg.Scalar("lr", 0.1), hg.PerTensor("wd", 0.1, params=["nope"])])
    with pytest.raises(ValueError, match=r"parameters \['bias'\] have no value.*default="):
        _problem(hps=[hg.Scalar("lr", 0.1), hg.PerTensor("wd", 0.1, params=["weight"])])


def test_optimizer_bound_to_per_example() -> None:
    with pytest.raises(ValueError, match=r"lr is bound to 'w' of kind per_example"):
        _problem(hps=[hg.PerExample("w", n=8, init=1.0)], opt=hg.sgd(lr="w"))


def test_transform_and_domain() -> None:
    with pytest.raises(ValueError, match=r"unknown transform='exp'"):
        hg.Scalar("lr", 0.1, transform="exp")
    with pytest.raises(ValueError, match=r"outside the domain of transform='log' \(values > 0\)"):
        hg.HyperParams([hg.Scalar("lr", -0.1, transform="log")]).init_raw()
    with pytest.raises(ValueError, match=r"name='my lr' must be a Python identifier"):
        hg.Scalar("my lr", 0.1)
    with pytest.raises(ValueError, match=r"names \['lr'\] are used more than once"):
        hg.HyperParams([hg.Scalar("lr", 0.1), hg.Scalar("lr", 0.2)])


def test_bad_optimizer_arguments() -> None:
    with pytest.raises(TypeError, match=r"sgd: lr=\[0.1\] must be a number or the name"):
        hg.sgd(lr=[0.1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nesterov=True needs a momentum"):
        hg.sgd(lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas=.* must be a pair"):
        hg.adam(betas=(0.9,))  # type: ignore[arg-type]


def test_bad_strategy_arguments() -> None:
    with pytest.raises(ValueError, match=r"VmapVJP: chunk_size=0 must be None"):
        hg.VmapVJP(chunk_size=0)
    with pytest.raises(TypeError, match="hvp must be an HVPStrategy"):
        hg.ForwardMode(hvp="vmap")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps=0 must be > 0"):
        hg.FiniteDifference(eps=0)


def test_hypergradcheck_needs_float64() -> None:
    p = _problem(dtype=torch.float32)
    with pytest.raises(TypeError, match="hypergradcheck: the problem runs in torch.float32"):
        hypergradcheck(p)


def test_model_without_trainable_parameters() -> None:
    model = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter with requires_grad=True"):
        hg.InnerProblem(model, lambda m, b, hp: 0, hg.sgd(lr=0.1),
                        hg.HyperParams([hg.Scalar("x", 1.0)]), [0], 1, lambda m, hp: 0)


def test_schedule_and_per_example_arguments() -> None:
    with pytest.raises(ValueError, match="windows=0 must be an int >= 1"):
        hg.Schedule("lr", 0.1, windows=0)
    with pytest.raises(ValueError, match="n=0 must be the number of training examples"):
        hg.PerExample("w", 1.0, n=0)


def test_digits_case_bad_names() -> None:
    with pytest.raises(ValueError, match="opt='rmsprop' must be in"):
        digits_case("rmsprop", "lr")
