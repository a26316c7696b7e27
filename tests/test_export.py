"""Use what you learned (issue 24.6): the learned hyperparameters as torch.optim and LambdaLR,
per-tensor values as named parameter groups, loss parameters and vectors as numbers and tensor
files, and the model trained at them as a state_dict. Plain torch trained from ``learned.yaml``
equals the library's retrain in float64."""

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
from hypergrad.export import learned_settings, optimizer_from_settings, trained_state_dict
from hypergrad.report import write_learned


def _loss(out: torch.Tensor, y: torch.Tensor, cw: Any, smooth: Any) -> torch.Tensor:
    """Class-weighted cross-entropy with label smoothing (both hyperparameters)."""
    logp = F.log_softmax(out, -1)
    picked = -logp.gather(1, y[:, None])[:, 0] * cw[y]
    return (1 - smooth) * picked.mean() - smooth * logp.mean()


def _problem(opt: str, bn: bool = False, steps: int = 12) -> tuple[hg.InnerProblem, nn.Module]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=g)
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(6, 8)]
    if bn:
        layers.append(nn.BatchNorm1d(8))
    model = nn.Sequential(*layers, nn.Tanh(), nn.Linear(8, 3)).double()
    items: list[Any] = [hg.Schedule("lr", 0.05, windows=3, transform="log"),
                        hg.PerTensor("wd", 1e-3, transform="log"),
                        hg.Array("smooth", 0.1, transform="logit"),
                        hg.Array("cw", [1.0, 1.0, 1.0], transform="log")]
    if opt == "sgd":
        items.append(hg.Scalar("mom", 0.6, transform="logit"))
        optimizer = hg.optim.sgd(lr="lr", momentum="mom", weight_decay="wd")
    elif opt == "adamw":
        items.append(hg.Scalar("b1", 0.8, transform="logit"))
        optimizer = hg.optim.adamw(lr="lr", betas=("b1", 0.99), weight_decay="wd")
    else:
        items.append(hg.Scalar("b1", 0.8, transform="logit"))
        optimizer = hg.optim.adamw_schedulefree(lr="lr", betas=("b1", 0.99), weight_decay="wd",
                                                warmup_steps=3)

    def train_loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
        xb, yb, _ = batch
        return _loss(m(xb), yb, hp["cw"], hp["smooth"])

    def val_loss(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    problem = hg.InnerProblem(model, train_loss, optimizer, hg.HyperParams(items),
                              MiniBatches(x, y, batch_size=8, seed=0), steps, val_loss)
    return problem, model


def _lam(problem: hg.InnerProblem) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return problem.init_raw() + 0.3 * torch.randn(problem.num_hyperparams, generator=g,
                                                  dtype=torch.float64)


def _plain_torch(problem: hg.InnerProblem, model: nn.Module, settings: dict[str, Any],
                 folder: Path, steps: int) -> nn.Module:
    """What a user does with learned.yaml: torch.optim, LambdaLR, and the loss's values."""
    m = copy.deepcopy(model)
    optimizer, scheduler = optimizer_from_settings(settings, m, steps)
    loss_hp = {k: (torch.load(folder / v) if isinstance(v, str) else v)
               for k, v in settings["loss"].items()}
    for t in range(steps):
        xb, yb, _ = problem.batch(t)
        optimizer.zero_grad()
        _loss(m(xb), yb, loss_hp["cw"], loss_hp["smooth"]).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    if hasattr(optimizer, "eval"):  # schedule-free: the averaged point, as the library's end
        optimizer.eval()
    return m


@pytest.mark.parametrize("opt", ["sgd", "adamw", "adamw_schedulefree"])
def test_plain_torch_from_learned_yaml_equals_the_library_retrain(opt: str,
                                                                  tmp_path: Path) -> None:
    problem, model = _problem(opt)
    lam = _lam(problem)
    state = problem.run(lam)
    files = write_learned(tmp_path, problem, lam, state)
    assert set(files) == {"learned.yaml", "learned_cw.pt", "model_learned.pt"}
    settings = yaml.safe_load((tmp_path / "learned.yaml").read_text())
    assert settings["optimizer"]["class"] == {
        "sgd": "torch.optim.SGD", "adamw": "torch.optim.AdamW",
        "adamw_schedulefree": "schedulefree.adamw_schedulefree.AdamWScheduleFree"}[opt]
    assert [g["params"] for g in settings["optimizer"]["param_groups"]] == [
        [n] for n in problem.fmodel.param_names]  # per-tensor weight decays, by name
    windows = settings["schedule"]["windows"]
    assert [w[:2] for w in windows] == [[0.0, 1 / 3], [1 / 3, 2 / 3], [2 / 3, 1.0]]
    assert settings["loss"]["smooth"] == pytest.approx(
        problem.hyperparams.describe(lam)["smooth"])
    mine = _plain_torch(problem, model, settings, tmp_path, problem.steps)
    for name, p in mine.named_parameters():
        torch.testing.assert_close(p, state.params[name], rtol=1e-12, atol=1e-14)
    saved = torch.load(tmp_path / "model_learned.pt")
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(saved)
    for name, p in fresh.named_parameters():
        assert torch.equal(p, state.params[name])


def test_trained_state_dict_holds_running_statistics_and_leaves_the_module_alone() -> None:
    problem, model = _problem("sgd", bn=True)
    before = copy.deepcopy(model.state_dict())
    state = problem.run(_lam(problem))
    sd = trained_state_dict(problem, state)
    assert set(sd) == set(model.state_dict())
    assert torch.equal(sd["1.running_mean"], state.buffers["1.running_mean"])
    assert int(sd["1.num_batches_tracked"]) == problem.steps
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])  # the user's module is not touched


def test_the_schedule_stretches_over_a_longer_run() -> None:
    problem, model = _problem("sgd")
    settings = learned_settings(problem, _lam(problem))
    optimizer, scheduler = optimizer_from_settings(settings, copy.deepcopy(model), steps=30)
    lrs = []
    for _ in range(30):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    base = lrs[0]
    factors = [w[2] for w in settings["schedule"]["windows"]]
    assert lrs[9] == pytest.approx(base * factors[0]) and lrs[10] == pytest.approx(
        base * factors[1]) and lrs[29] == pytest.approx(base * factors[2])


@pytest.mark.filterwarnings("ignore::hypergrad.errors.TuningWarning")
def test_the_result_gives_its_optimizer() -> None:
    problem, model = _problem("sgd")
    res = hg.Trainer(problem, mode=hg.Offline(outer_steps=1),
                     callbacks=[hg.run.Log(None)]).fit()
    optimizer, scheduler = res.learned_optimizer(copy.deepcopy(model))
    assert isinstance(optimizer, torch.optim.SGD) and scheduler is not None
    lr = problem.hyperparams.describe(res.lam)["lr"][0]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(lr)


def test_a_schedule_of_another_argument_is_named() -> None:
    problem, _ = _problem("sgd")
    hps = hg.HyperParams([hg.Scalar("lr", 0.05, transform="log"),
                          hg.Schedule("mom", 0.5, windows=2, transform="logit")])
    p = hg.InnerProblem(problem.fmodel.module, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr", momentum="mom"), hps, problem.batch, 4,
                        problem.val_loss)
    with pytest.raises(NotImplementedError, match=r"schedules of \['mom \(momentum\)'\]"):
        learned_settings(p, p.init_raw())


def test_learned_optimizer_takes_model_parameters_as_an_iterable() -> None:
    """``learned_optimizer(problem, lam, model.parameters())`` named the tensors '0', '1', ...
    and refused them as "not the trained parameters" (params has ['0', ...]); by position, as
    optimizer_from_settings reads an iterable, unless the settings name parameters (the reuse
    probe, 2026-12-07)."""
    from hypergrad.export import learned_optimizer
    from hypergrad.tasks import mlp
    from hypergrad.testing import digits_case

    small = dict(steps=4, n_train=24, batch_size=8, hidden=8, n_val=32)
    p = digits_case("momentum", "lr", **small)
    model = mlp([64, 8, 10]).double()
    opt, _ = learned_optimizer(p, p.init_raw(), model.parameters())
    assert [len(g["params"]) for g in opt.param_groups] == [4]
    per_tensor = digits_case("momentum", "per_tensor_wd", **small)
    # refused, and why: an iterable has no names to place per-tensor groups by (it said
    # "the groups name [...], which params does not have"; the per-layer probe)
    with pytest.raises(ValueError, match=r"learned parameter groups differ between parameters "
                                         r"\(they name .*\), and params is an iterable of "
                                         r"tensors, which has no names to place them by; pass "
                                         r"the model, or \{n: p for n, p in "
                                         r"model.named_parameters\(\) if p.requires_grad\}"):
        learned_optimizer(per_tensor, per_tensor.init_raw(), model.parameters())
    # a list missing tensors trained only those it held, and another model's parameters were
    # taken: an iterable is compared with the learned parameters' count and shapes (the
    # export probe, 2026-12-07 evening)
    with pytest.raises(ValueError, match=r"params holds 2 tensors .* learned for 4 trainable"):
        learned_optimizer(p, p.init_raw(), list(model.parameters())[:2])
    with pytest.raises(ValueError, match=r"shapes \[\[2\], \[2, 7\]\], but the settings"):
        learned_optimizer(p, p.init_raw(), torch.nn.Linear(7, 2).parameters())
