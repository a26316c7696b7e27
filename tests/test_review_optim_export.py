"""Review of the inner optimizers and of the export (hypergrad.optim, hypergrad.export): plain
torch.optim built from the learned settings follows hypergrad's own inner run in float64 where the
run clipped its gradients, started from learned initial scales or trained tied weights; what
torch.optim cannot hold is refused with a reason, never a bare torch error; options that are not
booleans are refused; and the optimizers equal torch.optim on settings the grid of
tests/test_optim.py leaves out (betas near 1 or 0, a tiny or large eps, alpha = 0, a large
lr_decay)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.export import (
    learned_optimizer,
    learned_settings,
    optimizer_from_settings,
    trained_state_dict,
)
from hypergrad.report import write_learned

F64 = torch.float64


def _problem(opt: hg.optim.Optimizer, items: list[Any], model: nn.Module | None = None,
             steps: int = 7) -> tuple[hg.InnerProblem, nn.Module]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=g, dtype=F64)
    y = torch.randint(0, 3, (40,), generator=g)
    torch.manual_seed(0)
    if model is None:
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()

    def train_loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(batch[0]), batch[1])

    problem = hg.InnerProblem(model, train_loss, opt, hg.HyperParams(items),
                              MiniBatches(x, y, batch_size=8, seed=0), steps,
                              lambda m, hp: F.cross_entropy(m(x), y))
    return problem, model


def _lam(problem: hg.InnerProblem) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return problem.init_raw() + 0.3 * torch.randn(problem.num_hyperparams, generator=g,
                                                  dtype=F64)


def _train(problem: hg.InnerProblem, net: nn.Module, opt: Any, sched: Any = None) -> None:
    """The problem's T steps in plain torch: its batches, cross-entropy, ``opt`` and ``sched``."""
    for t in range(problem.steps):
        x, y, _ = problem.batch(t)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


def _plain_torch(problem: hg.InnerProblem, model: nn.Module, settings: dict[str, Any]
                 ) -> nn.Module:
    """What a user does with the settings: a fresh copy, torch.optim, LambdaLR, no extras."""
    net = copy.deepcopy(model)
    opt, sched = optimizer_from_settings(settings, net)
    _train(problem, net, opt, sched)
    if hasattr(opt, "eval"):  # schedule-free: the averaged point, as hypergrad's last step
        opt.eval()
    return net


def _assert_same(net: nn.Module, state: hg.InnerState) -> None:
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), state.params[name], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("opt", ["sgd", "adam", "adamw_schedulefree"])
def test_clipping_is_exported_and_plain_torch_follows_the_run(opt: str, tmp_path: Path) -> None:
    """learned_settings dropped clip_grad_norm: plain torch from learned.yaml ran unclipped,
    1.6e-2 away from hypergrad's run (Adam, clip 0.05) without a word. Now the settings hold it
    and the optimizer clips before each step (a step pre-hook)."""
    factory = {"sgd": lambda: hg.optim.sgd(lr="lr", momentum=0.9, clip_grad_norm=0.05),
               "adam": lambda: hg.optim.adam(lr="lr", clip_grad_norm=0.05),
               "adamw_schedulefree": lambda: hg.optim.adamw_schedulefree(
                   lr="lr", warmup_steps=2, clip_grad_norm=0.05)}[opt]
    problem, model = _problem(factory(), [hg.Schedule("lr", 0.02, windows=3, transform="log")])
    lam = _lam(problem)
    state = problem.run(lam)
    write_learned(tmp_path, problem, lam, None)
    text = (tmp_path / "learned.yaml").read_text()
    settings = yaml.safe_load(text)
    assert settings["clip_grad_norm"] == 0.05
    _assert_same(_plain_torch(problem, model, settings), state)
    # the guide's way for a CLI user gave 0.2064 against the run's 0.1989: eval() was only in
    # optimizer_from_settings' docstring (the callbacks and records probe, 2026-12-07)
    said = "call optimizer.eval() before evaluating or saving the model" in text
    assert said == (opt == "adamw_schedulefree")


def test_learned_yaml_without_the_schedulefree_package_keeps_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """inner_optimizer=adamw_schedulefree without the lm extra: the export's ImportError came
    after the tuning, and results.json, learned.yaml and the model were never written (the
    packaging probe, 2026-12-07). learned.yaml now says why it holds no optimizer."""
    import sys

    problem, _ = _problem(hg.optim.adamw_schedulefree(lr="lr", warmup_steps=2),
                          [hg.Schedule("lr", 0.02, windows=3, transform="log")])
    monkeypatch.setitem(sys.modules, "schedulefree", None)  # import schedulefree fails
    # said in the YAML only, under "torch.optim cannot hold what hypergrad learned" (the wheel
    # probe, 2026-12-07 evening): a warning, which results.json records, and the right header
    with pytest.warns(hg.errors.HypergradWarning, match=r"learned.yaml is not written: .*"
                                                        r"pip install schedulefree"):
        files = write_learned(tmp_path, problem, _lam(problem), None)
    text = (tmp_path / "learned.yaml").read_text()
    settings = yaml.safe_load(text)
    assert "learned.yaml" in files and "pip install schedulefree" in settings["not_written"]
    assert text.startswith("# Not written: a package it needs is not installed")


def test_an_unclipped_optimizer_has_no_clip() -> None:
    problem, _ = _problem(hg.optim.adam(lr="lr"), [hg.Scalar("lr", 0.01, transform="log")])
    assert "clip_grad_norm" not in learned_settings(problem, problem.init_raw())


def test_learned_initial_scales_are_exported() -> None:
    """learned_settings skipped InitScale: plain torch started from the model's own weights,
    not the learned scale * w_0, and ended 6.6e-2 away from hypergrad's run. Now the settings
    hold the scales (``init``) and optimizer_from_settings applies them to the named
    parameters."""
    problem, model = _problem(hg.optim.sgd(lr="lr"), [
        hg.Scalar("lr", 0.1, transform="log"), hg.InitScale("init", 1.0)])
    lam = _lam(problem)
    state = problem.run(lam)
    settings = learned_settings(problem, lam)
    scales = settings["init"]["init"]
    assert set(scales) == set(problem.fmodel.param_names)
    assert scales["0.weight"] == pytest.approx(float(
        problem.hyperparams.values(lam)["init"]["0.weight"]))
    _assert_same(_plain_torch(problem, model, settings), state)
    with pytest.raises(ValueError, match="initial values.*by name; pass the model"):
        optimizer_from_settings(settings, list(copy.deepcopy(model).parameters()))


def test_learned_initial_weights_are_named_and_loaded_in_process(tmp_path: Path) -> None:
    """An InitWeights was skipped without a word: plain torch started from the module's own
    weights. Now the settings name it, optimizer_from_settings refuses settings it cannot
    follow (with the way out), and learned_optimizer, which holds the problem, loads them."""
    problem, model = _problem(hg.optim.sgd(lr="lr"), [
        hg.Scalar("lr", 0.1, transform="log"), hg.InitWeights("w0", params=["2.bias"])])
    lam = _lam(problem)
    state = problem.run(lam)
    settings = learned_settings(problem, lam)
    assert "2.bias" in settings["init"]["w0"]
    write_learned(tmp_path, problem, lam, None)
    on_disk = yaml.safe_load((tmp_path / "learned.yaml").read_text())
    assert on_disk["init"] == settings["init"]
    with pytest.raises(ValueError, match=r"initial weights were learned too \(\['w0'\]") as info:
        optimizer_from_settings(on_disk, copy.deepcopy(model))
    # the advice drops the learned weights only (it said: the settings without 'init', which
    # also dropped a learned InitScale of the same run)
    assert "if k not in ['w0']" in str(info.value) and "initial scales stay" in str(info.value)
    net = copy.deepcopy(model)
    opt, _ = learned_optimizer(problem, lam, net)
    _train(problem, net, opt)
    _assert_same(net, state)


class _Tied(nn.Module):
    """Two layers sharing one weight (as an output layer tied to an embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.b(torch.tanh(self.a(x)))))


def test_tied_weights_state_dict_holds_the_trained_weight() -> None:
    """trained_state_dict wrote the shared weight's second name ('b.weight') with the initial
    value: load_state_dict then put the untrained weight back (4.4e-3 off the run)."""
    torch.manual_seed(0)
    model = _Tied().double()
    problem, _ = _problem(hg.optim.sgd(lr="lr", momentum=0.9),
                          [hg.PerTensor("lr", 0.1, transform="log")], model=model)
    lam = _lam(problem)
    state = problem.run(lam)
    sd = trained_state_dict(problem, state)
    assert torch.equal(sd["b.weight"], state.params["a.weight"])
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(sd)
    for name, p in fresh.named_parameters():
        assert torch.equal(p, state.params[name])
    _assert_same(_plain_torch(problem, model, learned_settings(problem, lam)), state)


def test_what_torch_optim_refuses_is_not_implemented(tmp_path: Path) -> None:
    """torch.optim's own ValueError escaped learned_settings (so write_learned, at the end of a
    hypergrad-run, raised after the tuning): Nesterov with dampening, and a weight decay that an
    identity transform let go negative."""
    problem, _ = _problem(hg.optim.sgd(lr="lr", momentum=0.9, dampening=0.1, nesterov=True),
                          [hg.Scalar("lr", 0.1, transform="log")])
    with pytest.raises(NotImplementedError, match="nesterov=True with dampening=0.1"):
        learned_settings(problem, problem.init_raw())
    assert write_learned(tmp_path, problem, problem.init_raw(), None) == ["learned.yaml"]
    assert "dampening" in yaml.safe_load((tmp_path / "learned.yaml").read_text())["not_written"]
    problem, _ = _problem(hg.optim.sgd(lr=0.1, weight_decay="wd"), [hg.Scalar("wd", 1e-3)])
    lam = torch.tensor([-0.01], dtype=F64)
    with pytest.raises(NotImplementedError, match=r"weight_decay=-0.01.*transform='log'"):
        learned_settings(problem, lam)


@pytest.mark.parametrize("factory,key", [(hg.optim.rmsprop, "centered"),
                                         (hg.optim.sgd, "nesterov")])
@pytest.mark.parametrize("value", ["false", None, 2])
def test_boolean_options_take_booleans(factory: Any, key: str, value: Any) -> None:
    """centered='false' built a centered RMSprop (bool('false') is True)."""
    with pytest.raises(TypeError, match=f"{key}={value!r} must be True or False"):
        factory(lr=0.1, momentum=0.9, **{key: value})


def test_learned_optimizer_in_process_matches_the_yaml() -> None:
    """learned_optimizer (in process) and optimizer_from_settings (from learned.yaml) give the same
    clipped, scaled training."""
    problem, model = _problem(hg.optim.adam(lr="lr", weight_decay="wd", clip_grad_norm=0.1), [
        hg.Scalar("lr", 0.01, transform="log"), hg.PerTensor("wd", 1e-2, transform="log"),
        hg.InitScale("init", 1.0, params=["0.weight"])])
    lam = _lam(problem)
    state = problem.run(lam)
    net = copy.deepcopy(model)
    opt, sched = learned_optimizer(problem, lam, net)
    assert sched is None
    _train(problem, net, opt)
    _assert_same(net, state)


def test_learned_scales_are_not_applied_to_weights_scaled_already_or_trained() -> None:
    """A second call on the same copy scaled it again (s^2 w_0), a trained model was rescaled,
    and the problem's own module given as its state_dict (other tensor objects, the same
    storage) passed the refusal and was scaled in place (the init probe)."""
    problem, model = _problem(hg.optim.sgd(lr="lr"), [
        hg.Scalar("lr", 0.1, transform="log"), hg.InitScale("init", 1.0, params=["0.weight"])])
    lam = _lam(problem)
    w0 = model[0].weight.detach().clone()
    settings = yaml.safe_load(yaml.safe_dump(learned_settings(problem, lam)))
    net = copy.deepcopy(model)
    optimizer_from_settings(settings, net)
    with pytest.raises(ValueError, match=r"0.weight is not at the initial weights .*scaled "
                                         r"already"):
        optimizer_from_settings(settings, net)
    with pytest.raises(ValueError, match=r"not at the initial weights"):
        learned_optimizer(problem, lam, net)
    with pytest.raises(ValueError, match=r"the problem's own module"):
        learned_optimizer(problem, lam, model.state_dict())
    assert torch.equal(model[0].weight, w0)  # the problem's start untouched
    fresh = copy.deepcopy(model)
    learned_optimizer(problem, lam, fresh)  # a fresh copy at its initial weights is taken
    other = {k: v for k, v in settings.items() if k != "init_norms"}
    optimizer_from_settings(other, net)  # without the record: the user's choice


@pytest.mark.parametrize("item", [hg.InitWeights("init", params=["0.weight"]),
                                  hg.InitScale("init", 1.0, params=["0.weight"])],
                         ids=["InitWeights", "InitScale"])
def test_a_trained_model_is_refused_whatever_the_learned_init(item: Any) -> None:
    """The export probe (2026-12-07): with InitWeights, learned_optimizer took a trained copy
    (only the listed tensor was replaced; the others started trained), and with InitScale the
    tensors it does not list were never checked; the docs promised a trained model is
    refused."""
    problem, model = _problem(hg.optim.sgd(lr="lr"), [hg.Scalar("lr", 0.1, transform="log"),
                                                      item])
    lam = _lam(problem)
    net = copy.deepcopy(model)
    with torch.no_grad():
        net[2].weight.add_(0.01)  # a tensor the learned init does not list, moved
    with pytest.raises(ValueError, match=r"learned_optimizer: 2.weight is not at the initial "
                                         r"weights the learned ones apply to"):
        learned_optimizer(problem, lam, net)
    learned_optimizer(problem, lam, copy.deepcopy(model))  # a fresh copy is taken


def test_what_the_export_dropped_or_took_silently_is_refused(tmp_path: Path) -> None:
    """Found by a user's probe (2026-12-06): Adam's eps_root was left out of the torch.optim
    twin (8e-2 off in 10 steps); a NaN lam was written as lr: nan; a model with parameters the
    problem never had put them in a group of their own; a not_written learned.yaml gave a bare
    KeyError 'optimizer'."""
    p, model = _problem(hg.optim.adam(lr="lr", eps_root=1e-4), [hg.Scalar("lr", 1e-2)])
    with pytest.raises(NotImplementedError, match=r"eps_root=0.0001 .*no torch.optim twin.*"
                                                  r"eps_root=0"):
        learned_settings(p, p.init_raw())
    write_learned(tmp_path, p, p.init_raw(), None)
    text = (tmp_path / "learned.yaml").read_text()
    assert text.startswith("# Not written") and "eps_root" in text
    with pytest.raises(ValueError, match=r"these settings were not written: .*eps_root"):
        optimizer_from_settings(yaml.safe_load(text), copy.deepcopy(model))
    with pytest.raises(ValueError, match=r"settings has no 'optimizer'"):
        optimizer_from_settings({"steps": 5}, copy.deepcopy(model))

    p, model = _problem(hg.optim.sgd(lr="lr", weight_decay="wd"),
                        [hg.Scalar("lr", 0.1, "log"), hg.PerTensor("wd", 1e-3, "log")])
    with pytest.raises(ValueError, match=r"lam is NaN at lr"):
        learned_settings(p, p.init_raw() * float("nan"))
    settings = learned_settings(p, _lam(p))
    assert settings["params"] == {"0.weight": [8, 6], "0.bias": [8], "2.weight": [3, 8],
                                  "2.bias": [3]}
    optimizer_from_settings(settings, copy.deepcopy(model))  # the model it was learned for
    bigger = nn.Sequential(copy.deepcopy(model), nn.Linear(3, 3)).double()
    with pytest.raises(ValueError, match=r"params are not the trained parameters the settings "
                                         r"were learned for \(params has \['1.bias', "):
        optimizer_from_settings(settings, dict(copy.deepcopy(model).named_parameters(),
                                               **dict(bigger[1].named_parameters(prefix="1"))))
    wider = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3)).double()
    with pytest.raises(ValueError, match=r"shapes differ: 0.weight \[9, 6\] \(learned for "
                                         r"\[8, 6\]\)"):
        optimizer_from_settings(settings, wider)
    old = {k: v for k, v in settings.items() if k != "params"}  # written before the check
    optimizer_from_settings(old, copy.deepcopy(model))
