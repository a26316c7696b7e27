"""Found by moving a plain-PyTorch training script to hypergrad and back, and by running it in
other precisions (2026-12-06): each test fails without its fix."""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.errors import PrecisionWarning
from hypergrad.tasks import digits_data, mlp

DATA = digits_data(n_train=32, n_val=32, dtype=torch.float64)


def _loss(m: object, b: tuple, hp: object) -> torch.Tensor:
    return F.cross_entropy(m(b[0]), b[1])  # type: ignore[operator]


def _val(m: object, hp: object) -> torch.Tensor:
    return F.cross_entropy(m(DATA.x_val), DATA.y_val)  # type: ignore[operator]


def _problem(model: nn.Module, *items: hg.HyperParameter, opt: object = None,
             steps: int = 4) -> hg.InnerProblem:
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log"), *items])
    return hg.InnerProblem(model, _loss, opt or hg.optim.sgd(lr="lr"), hps,
                           MiniBatches(DATA.x_train, DATA.y_train, batch_size=8), steps,
                           val_loss=_val)


def test_training_the_problems_own_module_afterwards_is_refused() -> None:
    """The problem reads its initial weights from the module at every run: training the module
    (or loading weights into it) afterwards moved every later run's start (validation loss
    1.23 -> 0.74) with no word."""
    torch.manual_seed(0)
    model = mlp([64, 8, 10]).double()
    p = _problem(model)
    p.run(p.init_raw())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    F.cross_entropy(model(DATA.x_train), DATA.y_train).backward()
    opt.step()
    with pytest.raises(ValueError, match=r"the model's '0.weight' was written in place \(trained, "
                                         r"rescaled or loaded\) after the problem was built.*"
                                         r"copy.deepcopy\(model\)"):
        p.run(p.init_raw())
    # what needs no initial weights still works (the learned settings, for that trained model)
    assert hg.export.learned_settings(p, p.init_raw())["params"]["0.weight"] == [8, 64]
    torch.manual_seed(0)
    kept = mlp([64, 8, 10]).double()
    q = _problem(copy.deepcopy(kept))  # as the message says: the problem's own copy
    before = q.run(q.init_raw()).params
    with torch.no_grad():
        for w in kept.parameters():
            w.mul_(2.0)
    after = q.run(q.init_raw()).params
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_writes_through_data_are_seen_by_the_model_and_the_hyperparameters() -> None:
    """``.data`` writes keep a tensor's version counter, which the checks read: a hand-written
    loop's ``p.data -= lr * p.grad`` on the problem's module made the next run start from the
    trained weights, and ``lam.data -= ...`` between runs left the steps' kept values (plain and
    forward mode) at the old point (the reuse probe, 2026-12-07)."""
    torch.manual_seed(0)
    model = mlp([64, 8, 10]).double()
    p = _problem(model)
    p.run(p.init_raw())
    model[2].bias.data.mul_(0.5)
    with pytest.raises(ValueError, match=r"the model's '2.bias' was written in place"):
        p.run(p.init_raw())
    torch.manual_seed(0)
    p = _problem(mlp([64, 8, 10]).double())
    lam = p.init_raw()
    first = p.run(lam).params["0.weight"]
    ref = hg.ForwardMode().hypergradient(p, lam)
    lam.data.fill_(math.log(0.5))
    fresh = lam.clone()
    assert not torch.equal(p.run(lam).params["0.weight"], first)
    assert torch.equal(p.run(lam).params["0.weight"], p.run(fresh).params["0.weight"])
    got, want = (hg.ForwardMode().hypergradient(p, x) for x in (lam, fresh))
    assert float(got.objective) == float(want.objective) != float(ref.objective)
    torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0)


def test_learned_initial_scales_are_not_written_into_the_problems_own_module() -> None:
    """learned_optimizer(problem, lam, model) with an InitScale scaled the weights it was given
    in place: given the problem's own module, the problem's initial weights halved, and every
    later run applied the scale twice."""
    torch.manual_seed(0)
    model = mlp([64, 8, 10]).double()
    p = _problem(model, hg.InitScale("init", 0.5, "log", params=["0.weight"]))
    w0 = model[0].weight.detach().clone()
    with pytest.raises(ValueError, match=r"params are the problem's own module "
                                         r"\(\['0.weight'\]\).*copy.deepcopy\(model\)"):
        hg.export.learned_optimizer(p, p.init_raw(), model)
    assert torch.equal(model[0].weight, w0)
    twin = copy.deepcopy(model)
    hg.export.learned_optimizer(p, p.init_raw(), twin)
    assert torch.allclose(twin[0].weight, 0.5 * w0)


def test_the_torch_optimizer_hint_says_when_its_groups_differ() -> None:
    """AdamW with a decayed and an undecayed group: the hint read the first group only
    (weight_decay=0.05, which decays the biases too; 0.0 with the groups the other way)."""
    torch.manual_seed(0)
    model = mlp([64, 8, 10]).double()
    decay = [w for n, w in model.named_parameters() if n.endswith("weight")]
    rest = [w for n, w in model.named_parameters() if not n.endswith("weight")]
    topt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                              {"params": rest, "weight_decay": 0.0}], lr=0.01)
    with pytest.raises(TypeError) as info:
        _problem(model, opt=topt)
    text = str(info.value)
    assert "weight_decay={pattern: value, ...}" in text and "weight_decay=0.05" not in text
    assert "2 parameter groups differ in weight_decay 0.05 / 0.0" in text and "PerGroup" in text
    same = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    with pytest.raises(TypeError, match=r"hypergrad.optim.adamw\(lr='lr', weight_decay=0.05\)"):
        _problem(model, opt=same)


def test_export_is_an_attribute_of_the_package() -> None:
    assert hg.export.learned_optimizer is not None  # AttributeError before `import ...export`


def test_a_schedule_init_outside_its_transform_names_the_entries() -> None:
    """A warm-up from 0 under 'log' printed the whole list of 41 values, not which was bad."""
    hps = hg.HyperParams([hg.Schedule("lr", [0.0] + [0.1] * 40, "log", windows=41)])
    with pytest.raises(ValueError, match=r"init=\[0.0, 0.1, 0.1, ... \(41 values\)\] is outside "
                                         r"the domain of transform='log' \(values > 0\) "
                                         r"\(entries \[0\] = 0\)"):
        hps.init_raw(torch.float64)


def test_hypergradients_under_autocast_warn() -> None:
    """bfloat16 autocast around the call made forward mode 1e-3 to 5e-2 off float64 (2e-7
    without), with no word; TF32 (10 bits) already warned."""
    torch.manual_seed(0)
    p32 = hg.InnerProblem(mlp([64, 8, 10]).float(), _loss, hg.optim.sgd(lr="lr"),
                          hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                          MiniBatches(DATA.x_train.float(), DATA.y_train, batch_size=8), 3,
                          val_loss=lambda m, hp: F.cross_entropy(m(DATA.x_val.float()),
                                                                 DATA.y_val))
    with pytest.warns(PrecisionWarning, match=r"torch.autocast\('cpu', dtype=bfloat16\)"), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        hg.ForwardMode().hypergradient(p32, p32.init_raw())
    # autocast is a setting of the call: a problem whose first hypergradient ran outside it was
    # not checked again (3-5 % off float64 later under autocast, without a word)
    p = hg.InnerProblem(mlp([64, 8, 10]).float(), _loss, hg.optim.sgd(lr="lr"),
                        hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        MiniBatches(DATA.x_train.float(), DATA.y_train, batch_size=8), 3,
                        val_loss=lambda m, hp: F.cross_entropy(m(DATA.x_val.float()), DATA.y_val))
    hg.ReverseMode().hypergradient(p, p.init_raw())
    with pytest.warns(PrecisionWarning, match=r"dtype=float16"), \
            torch.autocast("cpu", dtype=torch.float16):
        hg.ReverseMode().hypergradient(p, p.init_raw())
    with pytest.warns(PrecisionWarning, match=r"dtype=bfloat16"), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        hg.ReverseMode().hypergradient(p, p.init_raw())
    with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("error")  # said once per setting
        hg.ReverseMode().hypergradient(p, p.init_raw())


def _mlp32(val_autocast: bool = False, dtype: torch.dtype = torch.float32) -> hg.InnerProblem:
    torch.manual_seed(0)

    def val_loss(m: Callable[[torch.Tensor], torch.Tensor], hp: object) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=val_autocast):
            return (m(DATA.x_val.to(dtype)) ** 2).mean()

    return hg.InnerProblem(mlp([64, 8, 10]).to(dtype), _loss, hg.optim.sgd(lr="lr"),
                           hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                           MiniBatches(DATA.x_train.to(dtype), DATA.y_train, batch_size=8), 3,
                           val_loss=val_loss)


def test_finite_differences_a_low_precision_loss_and_float64_under_autocast() -> None:
    """(the precision probe, 2026-12-07) FiniteDifference under bfloat16 autocast was 19x off
    with only the float32 rounding warning: its plain runs never entered the check. A val_loss
    under autocast inside it returned a bfloat16 objective, accepted without a word. A float64
    model under autocast (which never casts float64) was warned of, and exact."""

    p = _mlp32()
    with warnings.catch_warnings(record=True) as said, \
            torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("always")
        hg.FiniteDifference(eps=1e-2).hypergradient(p, p.init_raw())
    assert any(w.category is PrecisionWarning and "dtype=bfloat16" in str(w.message)
               for w in said), [str(w.message) for w in said]
    q = _mlp32(val_autocast=True)
    with pytest.warns(PrecisionWarning, match=r"val_loss returned a bfloat16 scalar for a "
                                              r"float32 model"):
        q.check(q.init_raw())
    d = _mlp32(dtype=torch.float64)
    ref = hg.ForwardMode().hypergradient(d, d.init_raw()).grad
    with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("error")
        assert torch.equal(hg.ForwardMode().hypergradient(d, d.init_raw()).grad, ref)


def test_inference_mode_is_refused_with_the_fix() -> None:
    """A call inside torch.inference_mode(), lam or the model made there, all failed deep in
    hypergrad with torch's "Inference tensors do not track version counter" (the precision
    probe, 2026-12-07); torch.no_grad() around a call works."""
    p = _mlp32(dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"called inside torch.inference_mode\(\).*call it "
                                           r"outside; torch.no_grad\(\) around a call is fine"):
        with torch.inference_mode():
            hg.ForwardMode().hypergradient(p, p.init_raw())
    with torch.inference_mode():
        lam = p.init_raw()
    with pytest.raises(RuntimeError, match=r"lam was made inside torch.inference_mode\(\)"):
        hg.ReverseMode().hypergradient(p, lam)
    with torch.inference_mode():
        model = mlp([64, 8, 10]).double()
    with pytest.raises(RuntimeError, match=r"the model's '0.weight' \(and 3 more\) was made "
                                           r"inside torch.inference_mode\(\)"):
        hg.InnerProblem(model, _loss, hg.optim.sgd(lr="lr"),
                        hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        MiniBatches(DATA.x_train, DATA.y_train, batch_size=8), 3,
                        val_loss=lambda m, hp: (m(DATA.x_val) ** 2).mean())
    with torch.no_grad():
        got = hg.ForwardMode().hypergradient(p, p.init_raw()).grad
    assert torch.equal(got, hg.ForwardMode().hypergradient(p, p.init_raw()).grad)


def test_half_precision_data_is_told_to_convert_the_data_only() -> None:
    """A float32 model with bfloat16 data was told "the model, model.to(torch.bfloat16), or the
    data": the library refuses a bfloat16 model."""
    torch.manual_seed(0)
    model = mlp([64, 8, 10]).float()
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log")])
    p = hg.InnerProblem(model, _loss, hg.optim.sgd(lr="lr"), hps,
                        [(DATA.x_train.bfloat16(), DATA.y_train)], 2,
                        val_loss=lambda m, hp: F.cross_entropy(m(DATA.x_val.float()),
                                                               DATA.y_val))
    with pytest.raises(TypeError) as info:
        hg.ForwardMode().hypergradient(p, p.init_raw())
    assert "x.float()" in str(info.value) and "model.to(torch.bfloat16)" not in str(info.value)


def test_uint8_labels_log_no_error_traceback() -> None:
    """The memory count on fake tensors fails on gather with uint8 labels and falls back to a
    real pass, as designed; torch logged each failure as a 16-line ERROR traceback."""
    torch.manual_seed(0)
    y8 = DATA.y_val.to(torch.uint8)
    p = hg.InnerProblem(mlp([64, 8, 10]).double(), _loss, hg.optim.sgd(lr="lr"),
                        hg.HyperParams([hg.Schedule("lr", 0.1, "log", windows=2)]),
                        MiniBatches(DATA.x_train, DATA.y_train.to(torch.uint8), batch_size=8),
                        3, val_loss=lambda m, hp: F.cross_entropy(m(DATA.x_val), y8))
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    log = logging.getLogger("torch._subclasses.fake_tensor")  # torch's own handler prints it
    keep = Keep(logging.ERROR)
    log.addHandler(keep)
    try:
        for _ in range(2):
            hg.ForwardMode().hypergradient(p, p.init_raw())
    finally:
        log.removeHandler(keep)
    assert not seen, [r.getMessage()[:200] for r in seen]


def test_a_hypergradient_too_large_for_float32_names_the_fixes_that_help() -> None:
    """A validation loss x 1e20 in float32: the run stopped as diverged, advising a smaller
    outer learning rate or bounds, which cannot help; the training had not diverged."""
    from hypergrad.run.guards import outer_gradient

    g, why = outer_gradient(torch.tensor([5e19, 1.0]), None, torch.float32)
    assert g is None and why is not None
    assert "the training did not diverge" in why and "Guards(clip_norm=...)" in why
    assert "float64" in why
    g, why = outer_gradient(torch.tensor([5e19, 1.0]), 1.0, torch.float32)
    assert why is None and g is not None and float(g.norm()) == pytest.approx(1.0)
    # the loss itself that large: the same advice; against a loss of 0.5, chaotic training,
    # which neither a clip nor float64 helps (they were advised; the chaos probe, 2026-12-08)
    big = outer_gradient(torch.tensor([5e19, 1.0]), None, torch.float32, value=3e20)[1]
    assert big is not None and "Guards(clip_norm=...)" in big
    chaos = outer_gradient(torch.tensor([5e19, 1.0]), None, torch.float32, value=0.5)[1]
    assert chaos is not None and "against a validation loss of 0.5: the inner training is " \
        "chaotic there" in chaos
    assert "Guards(clip_norm=...)" not in chaos and "outer=None" in chaos


def test_amsgrad_is_refused_by_name() -> None:
    """adamw(amsgrad=True) gave Python's bare "unexpected keyword argument"."""
    for factory in (hg.optim.adam, hg.optim.adamw):
        with pytest.raises(NotImplementedError, match=r"amsgrad=True is not supported"):
            factory(lr=0.1, amsgrad=True)
        assert factory(lr=0.1, amsgrad=False).name in ("adam", "adamw")


def test_init_weights_under_log_read_from_the_model_say_so() -> None:
    """InitWeights(transform='log') without an init starts from the model's weights (some
    negative): the message quoted "init=tensor([0.4391, -0.0833, ...])", which no one gave,
    and advised "a warm-up from 0"."""
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"InitWeights\('w'\): no init was given, so it starts "
                                         r"from the model's own initial weights of \['0.weight'\], "
                                         r"which lie outside the domain of transform='log'"):
        _problem(mlp([64, 8, 10]).double(), hg.InitWeights("w", params=["0.weight"],
                                                            transform="log"))
