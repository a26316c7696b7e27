"""The ring around the engine, found by review (2026-11-27): mini-batch orders of nearby seeds,
what a resume must match, what an overwrite removes, what export and the plots write, and
inputs refused with the argument, the value and the fix."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches, split_validation
from hypergrad.errors import ResumeMismatchError, RunDirError
from hypergrad.export import learned_settings, optimizer_from_settings
from hypergrad.report import figures, write_learned
from hypergrad.tasks import digits_data


def quiet() -> list[Any]:
    return [hg.run.Log(None), hg.run.Progress(False)]


def small(seed: int = 0, select: bool = False, lr0: float = 0.05) -> hg.InnerProblem:
    data = digits_data(n_train=48, n_val=64, n_test=8, dtype=torch.float64)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Dropout(0.3),
                          nn.Linear(16, 10)).double()
    xv, yv, xs, ys = data.x_val[:32], data.y_val[:32], data.x_val[32:], data.y_val[32:]
    return hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.optim.sgd(lr="lr", momentum=0.9), hg.HyperParams([hg.Scalar("lr", lr0, "log")]),
        MiniBatches(data.x_train, data.y_train, batch_size=16), 8,
        lambda m, hp: F.cross_entropy(m(xv), yv),
        select_loss=(lambda m, hp: F.cross_entropy(m(xs), ys)) if select else None, seed=seed)


# -- mini-batch orders ---------------------------------------------------------------------------
def test_nearby_seeds_give_unrelated_batch_orders() -> None:
    """Each epoch was shuffled by seed + epoch: seed 1 read seed 0's batches one epoch later
    (50 of 50 steps), so consecutive seeds were shifted copies of one order."""
    x = torch.arange(64.0)[:, None]
    a, b = MiniBatches(x, batch_size=8, seed=0), MiniBatches(x, batch_size=8, seed=1)
    same = sum(torch.equal(b.indices(t), a.indices(t + a.per_epoch)) for t in range(50))
    assert same == 0
    assert torch.equal(a.indices(13), MiniBatches(x, batch_size=8, seed=0).indices(13))
    assert sorted(torch.cat([a.indices(t) for t in range(8, 16)]).tolist()) == list(range(64))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"seed": 1.5}, r"seed=1.5 must be an int"), ({"seed": "0"}, r"seed='0' must be an int"),
    ({"shuffle": "no"}, r"shuffle='no' must be True or False")])
def test_minibatches_refuses_a_seed_or_shuffle_of_another_type(kwargs: dict[str, Any],
                                                               match: str) -> None:
    with pytest.raises(TypeError, match=match):
        MiniBatches(torch.zeros(8, 2), batch_size=2, **kwargs)


def test_split_validation_refuses_nan_labels_and_a_float_seed() -> None:
    x = torch.randn(10, 2)
    labels = torch.tensor([0.0, 1.0, float("nan")] + [0.0] * 7)
    with pytest.raises(ValueError, match="stratify holds NaN"):
        split_validation(x, stratify=labels)
    with pytest.raises(TypeError, match=r"seed=1.5 must be an int"):
        split_validation(x, seed=1.5)  # type: ignore[arg-type]


# -- resume and overwrite ------------------------------------------------------------------------
def _fit_in(folder: Path, p: hg.InnerProblem, steps: int, resume: bool) -> hg.TrainResult:
    """Forward mode, offline for ``steps`` outer steps, in the run folder ``folder``."""
    return hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=steps),
                      folder=hg.RunFolder(folder, resume=resume), callbacks=quiet()).fit()


def _refused_then_resumed(build: Callable[[Any], hg.InnerProblem], folder: Path, same: Any,
                          other: Any, said: str) -> None:
    """One outer step of ``build(same)``; its resume as ``build(other)`` refused, naming what
    differs (``said``, a pattern), and as ``build(same)`` going on to two."""
    _fit_in(folder, build(same), 1, False)
    with pytest.raises(ResumeMismatchError, match=said):
        _fit_in(folder, build(other), 2, True)
    assert len(_fit_in(folder, build(same), 2, True).history) == 2


def test_a_resume_with_another_seed_or_select_loss_is_refused(tmp_path: Path) -> None:
    """Neither the problem's seed (dropout draws, the start's and restarts' points) nor whether
    it has a select_loss was in the fingerprint: a resume mixed two runs in one folder, or
    returned a point chosen among the first run's selections only."""
    run = tmp_path / "run"
    _fit_in(run, small(seed=0, select=True), 1, False)
    with pytest.raises(ResumeMismatchError, match=r"problem.seed: 0 -> 1"):
        _fit_in(run, small(seed=1, select=True), 2, True)
    with pytest.raises(ResumeMismatchError, match=r"problem.select_loss: True -> False"):
        _fit_in(run, small(seed=0), 2, True)
    assert len(_fit_in(run, small(seed=0, select=True), 2, True).history) == 2


def _bound(item: Any) -> hg.InnerProblem:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (32,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           hg.optim.sgd(lr=0.1, weight_decay="wd"), hg.HyperParams([item]),
                           MiniBatches(x, y, batch_size=8, seed=0), 6,
                           lambda m, hp: F.cross_entropy(m(x), y))


@pytest.mark.parametrize("kind", ["per_tensor", "per_group"])
def test_a_resume_whose_values_apply_to_other_parameters_is_refused(kind: str,
                                                                    tmp_path: Path) -> None:
    """The same K, kind and initial value, applied to another tensor: the layout, the initial
    state and the validation loss at the start are all the same, and the resume went on
    silently with the first run's values moved onto the other tensor."""
    def item(first: str) -> Any:
        if kind == "per_tensor":
            return hg.PerTensor("wd", 1e-3, "log", params=[f"{first}.weight"], default=0.0)
        return hg.PerGroup("wd", 1e-3, "log", groups={"w": rf"^{first}\.weight"}, default=0.0)

    # the entry that differs is named: problem.bindings[wd][params]: ['0.weight'] -> ...
    _refused_then_resumed(lambda first: _bound(item(first)), tmp_path / "run", "0", "2",
                          r"problem.bindings\[wd\]\S*: \['0.weight'\] -> \['2.weight'\]")


def test_a_resume_with_another_training_loss_is_refused(tmp_path: Path) -> None:
    """A label smoothing added to the training loss changes neither the validation loss nor
    the first batch, and the resume went on silently, the history mixing two problems."""
    def build(smoothing: float) -> hg.InnerProblem:
        p = _bound(hg.Scalar("wd", 1e-3, "log"))
        p.train_loss = lambda m, b, hp: F.cross_entropy(m(b[0]), b[1],
                                                        label_smoothing=smoothing)
        return p

    _refused_then_resumed(build, tmp_path / "run", 0.0, 0.3,
                          r"problem.train_loss_at_start: [\d.]+ -> ")


def _xy() -> tuple[torch.Tensor, torch.Tensor]:
    """32 examples of 5 features in 3 classes (seeded)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(32, 5, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (32,), generator=g))


def _lr_problem(data: Any, x: torch.Tensor, y: torch.Tensor) -> hg.InnerProblem:
    """A small classifier (seeded) tuning its learning rate over 4 steps of ``data``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                           data, 4, lambda m, hp: F.cross_entropy(m(x), y))


def test_a_resume_with_other_dataloader_settings_is_refused(tmp_path: Path) -> None:
    """The workers probe (2026-12-07): a run resumed with num_workers=3 where it ran with 2
    read other augmented batches from batch 2 on (worker k augments batches k, k + n, ...)
    while the first batch, the one the fingerprint read, was the same: it went on silently."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _xy()

    def build(drop_last: bool) -> hg.InnerProblem:
        return _lr_problem(DataLoader(TensorDataset(x, y), batch_size=6, shuffle=True,
                                      drop_last=drop_last), x, y)

    # the first 4 batches are the same: only the settings differ
    _refused_then_resumed(build, tmp_path / "run", False, True,
                          r"problem.batch_source\S*drop_last\S*: False -> True")


@pytest.mark.parametrize("source", ["minibatches", "list", "dataloader", "subset", "concat"])
def test_a_resume_with_other_data_past_the_first_batch_is_refused(tmp_path: Path,
                                                                  source: str) -> None:
    """Data changed past the first batch (the one the fingerprint read) resumed without a
    word, and ranks holding such data summed into a hypergradient 2 % off (the distributed
    probe, 2026-12-07 evening): data held in memory is digested whole, a Subset or
    ConcatDataset of TensorDatasets too (the usual split: not digested until 2026-12-08)."""
    from torch.utils.data import ConcatDataset, DataLoader, Subset, TensorDataset

    from hypergrad.data import MiniBatches

    x, y = _xy()

    def build(shift: float) -> hg.InnerProblem:
        xs = x.clone()
        xs[31] += shift  # past the first batch in every order here
        data: Any = {"minibatches": lambda: MiniBatches(xs, y, batch_size=8, shuffle=False),
                     "list": lambda: [(xs[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)],
                     "dataloader": lambda: DataLoader(TensorDataset(xs, y), batch_size=8),
                     "subset": lambda: DataLoader(Subset(TensorDataset(xs, y), range(32)),
                                                  batch_size=8),
                     "concat": lambda: DataLoader(ConcatDataset(
                         [TensorDataset(xs[:16], y[:16]), TensorDataset(xs[16:], y[16:])]),
                         batch_size=8)}[source]()
        return _lr_problem(data, x, y)

    _refused_then_resumed(build, tmp_path / "run", 0.0, 1.0, r"problem.data\S*: ")


class _Noisy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Examples with an augmentation: noise of a scale, then a function of its own."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, scale: float, augment: Any) -> None:
        self.x, self.y, self.scale, self.augment = x, y, scale, augment

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.augment(self.x[i] + self.scale * torch.randn(self.x.shape[1:],
                                                                 dtype=self.x.dtype)), self.y[i]


@pytest.mark.parametrize("change", ["scale", "augment"])
def test_a_resume_with_another_augmentation_is_refused(tmp_path: Path, change: str) -> None:
    """An augmentation changed between a run and its resume (a clamp added, another noise
    scale) that the first batch did not show was taken, and the run mixed the two (lam
    -2.2137 against the straight run's -2.2221; the online probe, 2026-12-07 evening)."""
    from torch.utils.data import DataLoader

    x, y = _xy()
    def same(v: torch.Tensor) -> torch.Tensor:
        return v

    def clamped(v: torch.Tensor) -> torch.Tensor:  # changes no value here: its code differs
        return v.clamp(-30, 30)

    def build(other: bool) -> hg.InnerProblem:
        scale = 0.2 if other and change == "scale" else 0.1
        augment = clamped if other and change == "augment" else same
        return _lr_problem(DataLoader(_Noisy(x, y, scale, augment), batch_size=8,
                                      shuffle=True), x, y)

    _refused_then_resumed(build, tmp_path / "run", False, True,
                          rf"problem.dataset\S*attr.{change}\S*: ")


def test_a_training_loss_with_randomness_hypergrad_does_not_seed_still_resumes(
        tmp_path: Path) -> None:
    """NumPy noise in the loss (warned of as UnseededRandomnessWarning) gives another training
    loss at every call: it is then not in the fingerprint, so a resume is not refused for it."""
    rng = np.random.default_rng(0)

    def fit(steps: int, resume: bool) -> hg.TrainResult:
        p = _bound(hg.Scalar("wd", 1e-3, "log"))
        p.train_loss = lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]) * float(
            1 + 0.01 * rng.standard_normal())
        return hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=steps),
                          folder=hg.RunFolder(tmp_path / "run", resume=resume),
                          callbacks=quiet()).fit()

    with pytest.warns(hg.errors.UnseededRandomnessWarning):
        fit(1, False)
    ck = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ck["fingerprint"]["problem.train_loss_at_start"] == "<not recorded>"
    with pytest.warns(hg.errors.UnseededRandomnessWarning):
        assert len(fit(2, True).history) == 2


def test_a_checkpoint_without_the_new_keys_still_resumes(tmp_path: Path) -> None:
    """Checkpoints written before the seed and select_loss were recorded resume (those keys are
    not compared when absent)."""
    from hypergrad.run.files import fingerprint_diff

    new = {"problem.K": 1, "problem.seed": 3, "problem.select_loss": False,
           "problem.bindings": {"wd": {"params": ["w"]}}, "problem.train_loss_at_start": 1.5,
           "problem.batch_source": {"class": "torch.utils.data.dataloader.DataLoader"}}
    assert fingerprint_diff({"problem.K": 1}, new) == []
    assert fingerprint_diff({"problem.K": 1, "problem.seed": 2}, new) == [
        "problem.seed: 2 -> 3"]


def test_a_fingerprint_with_a_path_or_a_numpy_number_resumes(tmp_path: Path) -> None:
    """Such a value was pickled into every checkpoint, which torch.load(weights_only=True)
    refuses: the run could never be resumed."""
    extra = {"data": Path("my_data.npz"), "grid_max": np.float64(0.5), "n": np.int64(3)}
    for resume, steps in ((False, 1), (True, 2)):
        res = hg.Trainer(small(), "forward", mode=hg.Offline(outer_steps=steps),
                         folder=hg.RunFolder(tmp_path / "run", resume=resume,
                                             fingerprint=extra), callbacks=quiet()).fit()
    assert len(res.history) == 2


def test_an_overwrite_from_python_removes_the_old_runs_reports(tmp_path: Path) -> None:
    """RunFolder(overwrite=True) removed the checkpoints and metrics only: the old run's
    learned.yaml, model, plots, results.json and TensorBoard events stayed beside the new
    run's; a folder holding only results.json was not refused."""
    d = tmp_path / "run"
    p = small()
    res = hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=1), folder=d,
                     callbacks=quiet()).fit()
    write_learned(d, p, res.lam, res.state)
    assert (d / "model_learned.pt").exists()
    (d / "results.json").write_text("{}")
    (d / "val_curve.png").write_bytes(b"old")
    (d / "tb").mkdir()
    (d / "tb" / "events.out.tfevents.1.host").write_bytes(b"old")
    hg.Trainer(small(lr0=0.01), "forward", mode=hg.Offline(outer_steps=1),
               folder=hg.RunFolder(d, overwrite=True), callbacks=quiet()).fit()
    assert sorted(f.name for f in d.iterdir() if f.is_file()) == ["checkpoint.pt",
                                                                  "metrics.jsonl"]
    assert not list((d / "tb").iterdir())
    e = tmp_path / "reports_only"
    e.mkdir()
    (e / "results.json").write_text("{}")
    with pytest.raises(RunDirError, match=r"already holds a run \(results.json\)\. Pass"):
        hg.Trainer(small(), "forward", mode=hg.Offline(outer_steps=1), folder=e,
                   callbacks=quiet())


# -- export --------------------------------------------------------------------------------------
def _mlp_problem(items: list[Any], opt: Any, steps: int = 8) -> hg.InnerProblem:
    torch.manual_seed(0)
    x, y = torch.randn(32, 4, dtype=torch.float64), torch.randint(0, 3, (32,))
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]), opt,
                           hg.HyperParams(items), MiniBatches(x, y, batch_size=8), steps,
                           lambda m, hp: F.cross_entropy(m(x), y))


@pytest.mark.parametrize("init", ["scale", "weights"])
def test_export_with_initial_weights_of_some_parameters(init: str, tmp_path: Path) -> None:
    """An InitScale / InitWeights over some parameters made learned_settings raise KeyError
    (every hyperparameter's dict was read at every parameter), so write_learned, and the CLI
    report before results.json, failed."""
    item = (hg.InitScale("s", 1.0, "log", params=["0.weight"]) if init == "scale" else
            hg.InitWeights("w0", params=["2.weight"]))
    p = _mlp_problem([hg.Scalar("lr", 0.1, "log"), item], hg.optim.sgd(lr="lr"))
    assert write_learned(tmp_path, p, p.init_raw(), None) == ["learned.yaml"]
    assert learned_settings(p, p.init_raw())["optimizer"]["defaults"]["lr"] == pytest.approx(0.1)


@pytest.mark.parametrize("first", [0.0, 1e-310])
def test_export_of_a_schedule_warming_up_from_zero_trains_as_hypergrad_did(first: float
                                                                           ) -> None:
    """Factors relative to a first window of 0 were 0/0 and x/0: learned.yaml held NaN and inf
    and torch trained with lr = NaN; a first window of 1e-310 gave factors of inf (a NaN model,
    without a word). (A negative window, which trains uphill, is refused by the problem: see
    tests/test_optimizer_domains.py.)"""
    p = _mlp_problem([hg.Schedule("lr", init=torch.tensor([first, 0.05, 0.1, 0.1],
                                                          dtype=torch.float64), windows=4,
                                  transform="identity")],
                     hg.optim.sgd(lr="lr", momentum=0.5))
    lam = p.init_raw()
    settings = learned_settings(p, lam)
    assert settings["optimizer"]["defaults"]["lr"] == pytest.approx(0.1)
    assert [w[2] for w in settings["schedule"]["windows"]] == pytest.approx(
        [first / 0.1, 0.5, 1, 1], abs=1e-300)
    ours = p.run(lam).params  # first: the problem starts from the module's weights
    model = p.fmodel.module
    opt, sched = optimizer_from_settings(settings, model)
    for t in range(p.steps):
        xb, yb, _ = p.batch(t)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        sched.step()
    for name, w in model.named_parameters():
        assert torch.allclose(w, ours[name], atol=1e-12), name


@pytest.mark.parametrize("schedule", [True, False])
@pytest.mark.parametrize("steps", [0, -8, 2.9, True])
def test_optimizer_from_settings_refuses_steps_that_are_no_count(steps: Any,
                                                                 schedule: bool) -> None:
    """Without a schedule, steps=0 was taken without a word (the export probe)."""
    lr = (hg.Schedule("lr", 0.1, windows=2, transform="log") if schedule else
          hg.Scalar("lr", 0.1, transform="log"))
    p = _mlp_problem([lr], hg.optim.sgd(lr="lr"))
    settings = learned_settings(p, p.init_raw())
    with pytest.raises(ValueError, match=r"steps=.* must be an int >= 1"):
        optimizer_from_settings(settings, p.fmodel.module, steps=steps)


def test_optimizer_from_settings_takes_numpy_steps_and_refuses_unread_windows() -> None:
    """steps=np.int64(6) was refused (a Schedule takes NumPy ints), and steps=2 with 3 windows
    silently skipped one (InnerProblem refuses windows no step reads)."""
    import copy

    p = _mlp_problem([hg.Schedule("lr", torch.tensor([0.1, 0.05, 0.02], dtype=torch.float64),
                                  windows=3, transform="log")], hg.optim.sgd(lr="lr"))
    settings = learned_settings(p, p.init_raw())
    opt, sched = optimizer_from_settings(settings, copy.deepcopy(p.fmodel.module),
                                         steps=np.int64(6))
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()  # no gradients: nothing moves
        sched.step()
    assert lrs == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.02, 0.02])
    with pytest.raises(ValueError, match=r"steps=2 is fewer than the schedule's 3 windows: "
                                         r"windows \[2\] would never be read"):
        optimizer_from_settings(settings, copy.deepcopy(p.fmodel.module), steps=2)


def test_a_schedule_the_loss_reads_is_described_in_learned_yaml(tmp_path: Path) -> None:
    """An L2 coefficient per window was written as a bare vector file, like a per-feature
    Array, with nothing saying that step t reads window t * W // T (the guide said
    learned.yaml says so)."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 4, dtype=torch.float64), torch.randint(0, 3, (32,))
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    p = hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]) + hp["l2"] * sum(
            (w ** 2).sum() for w in m.parameters()),
        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log"),
                                               hg.Schedule("l2", [1e-2, 1e-3, 1e-4], "log",
                                                           windows=3),
                                               hg.Array("cw", [1.0, 2.0], transform="log")]),
        MiniBatches(x, y, batch_size=8), 9, lambda m, hp: F.cross_entropy(m(x), y))
    files = write_learned(tmp_path, p, p.init_raw(), None)
    assert files == ["learned.yaml", "learned_l2.pt", "learned_cw.pt"]
    import yaml

    settings = yaml.safe_load((tmp_path / "learned.yaml").read_text())
    assert settings["loss"] == {"l2": "learned_l2.pt", "cw": "learned_cw.pt"}
    described = settings["loss_schedules"]
    assert list(described) == ["l2"]  # not the vector per class
    assert described["l2"]["windows"] == 3 and described["l2"]["file"] == "learned_l2.pt"
    assert "reads window t * 3 // N" in described["l2"]["reads"]
    assert torch.load(tmp_path / "learned_l2.pt").tolist() == pytest.approx([1e-2, 1e-3, 1e-4])


# -- reports -------------------------------------------------------------------------------------
def test_the_plots_mark_the_returned_point_not_the_history_entry() -> None:
    """The returned point is often a line search's, evaluated during outer step k: the star was
    drawn at history[k]'s validation loss and the dashed line at its hyperparameters."""
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log")])
    history = [{"outer_step": k, "val_loss": v, "hyperparams": {"lr": lr}}
               for k, v, lr in ((0, 2.0, 0.1), (1, 1.5, 0.2), (2, 1.4, 0.3))]
    lam = torch.tensor([0.0])
    figs = figures(hps, 8, history, lam, lam, best_step=1, learned=(1.2, {"lr": 0.25}))
    try:
        star = [ln for ln in figs["val_curve.png"].axes[0].get_lines()
                if str(ln.get_label()).startswith("learned")]
        assert [float(v) for v in star[0].get_ydata()] == [1.2]
        marks = [ln for ln in figs["hyperparams.png"].axes[0].get_lines()
                 if ln.get_marker() == "*"]
        assert [float(v) for v in marks[0].get_ydata()] == [0.25]
    finally:
        import matplotlib.pyplot as plt

        for f in figs.values():
            plt.close(f)


def test_the_plots_say_what_the_records_say() -> None:
    """The reports probe: a diverged run's plot dropped the point where it diverged and did
    not say so; online, each value was drawn one interval late and the learned (final) one
    not at all; a last point that is the learned one was drawn as another; a descent over
    decades was squashed on a linear axis; past 10 lines two shared a colour and a dash."""
    import matplotlib.pyplot as plt

    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log")])
    lam = torch.tensor([0.0])

    def lines(fig: Any) -> dict[str, Any]:
        return {str(ln.get_label()): ln for ln in fig.axes[0].get_lines()}

    history = [{"outer_step": k, "val_loss": v, "hyperparams": {"lr": lr}}
               for k, v, lr in ((0, 2.0, 0.1), (1, 0.05, 0.2))]
    figs = figures(hps, 8, history, lam, lam, best_step=1, learned=(0.05, {"lr": 0.2}),
                   last=(2, 0.05, {"lr": 0.2}), diverged=(3, 40.0))
    try:
        val = figs["val_curve.png"].axes[0]
        got = lines(figs["val_curve.png"])
        assert [float(v) for v in got["diverged (outer step 3)"].get_ydata()] == [40.0]
        assert "diverged at outer step 3" in val.get_title()
        assert "after the last update (the learned point again)" in got
        assert val.get_yscale() == "log"  # 0.05 to 40
    finally:
        for f in figs.values():
            plt.close(f)
    online = [{"outer_step": k, "inner_step": 10 * (k + 1), "val_loss": 1.0 - 0.1 * k,
               "hyperparams": {"lr": lr}} for k, lr in ((0, 0.1), (1, 0.2))]
    final = hps.init_raw().clone().fill_(math.log(0.3))
    figs = figures(hps, 20, online, lam, final, best_step=2)
    try:
        (curve,) = figs["hyperparams.png"].axes[0].get_lines()
        assert [float(v) for v in curve.get_xdata()] == [0.0, 10.0, 20.0]
        assert [float(v) for v in curve.get_ydata()] == pytest.approx([0.1, 0.2, 0.3])
        assert figs["val_curve.png"].axes[0].get_yscale() == "linear"
    finally:
        for f in figs.values():
            plt.close(f)
    twelve = hg.HyperParams([hg.Schedule("lr", 0.1, windows=12)])
    hist = [{"outer_step": 0, "val_loss": 1.0, "hyperparams": twelve.describe(twelve.init_raw())}]
    figs = figures(twelve, 24, hist, twelve.init_raw(), twelve.init_raw())
    try:
        drawn = figs["hyperparams.png"].axes[0].get_lines()
        styles = [(ln.get_color(), ln.get_linestyle()) for ln in drawn]
        assert len(drawn) == 12 and len(set(styles)) == 12
    finally:
        for f in figs.values():
            plt.close(f)


def test_after_a_space_filling_start_outer_step_0_is_not_called_initial() -> None:
    """After a space-filling start, outer step 0 is the start's best point; the x axis said
    "0: initial" (the callbacks probe)."""
    import matplotlib.pyplot as plt

    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log")])
    history = [{"outer_step": k, "val_loss": v, "hyperparams": {"lr": lr}}
               for k, v, lr in ((0, 2.0, 0.3), (1, 1.5, 0.2))]
    lam = torch.tensor([0.0])
    for started, label in ((True, "outer step (0: the space-filling start's best point)"),
                           (False, "outer step (0: initial)")):
        figs = figures(hps, 8, history, lam, lam, best_step=1, started=started)
        try:
            assert figs["val_curve.png"].axes[0].get_xlabel() == label
            assert figs["hyperparams.png"].axes[-1].get_xlabel() == label
        finally:
            for f in figs.values():
                plt.close(f)


def test_schedule_windows_no_step_reads_keep_their_own_labels() -> None:
    """More windows than steps: the windows no step reads got labels like 'steps 1-0' twice,
    and one window's value was dropped from summaries, results.json and the plots."""
    hps = hg.HyperParams([hg.Schedule("lr", 0.1, windows=3)])
    named = hps.named({"lr": [0.1, 0.2, 0.3]}, 1)
    assert list(named.values()) == pytest.approx([0.1, 0.2, 0.3])
    assert list(named) == ["lr[steps 0-0]", "lr[window 1: no step]", "lr[window 2: no step]"]


def test_progress_under_the_default_mode_names_the_planned_steps() -> None:
    said: list[str] = []
    p = small()
    hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=None, start=0, recheck=0),
               callbacks=[hg.run.Log(said.append), hg.run.Progress(True)]).fit()
    steps = [m for m in said if "outer step 0/" in m]
    assert steps and "/None" not in steps[0] and "outer step 0/10" in steps[0]


def test_the_closing_message_tells_the_initial_point_from_the_descents_start() -> None:
    """After a space-filling start the first hypergradient's point (the start's best) was
    called the initial one."""
    said: list[str] = []
    tr = hg.Trainer(small(), "forward", mode=hg.Offline(outer_steps=2, start=4, recheck=0),
                    callbacks=[hg.run.Log(said.append), hg.run.Progress(False)])
    res = tr.fit()
    init = [e["val_loss"] for e in res.evaluations if torch.equal(e["lam"], tr.initial_lam)]
    first = res.history[0]["val_loss"]
    assert init and init[0] != first  # the start found a better point than the initial one
    last = [m for m in said if "validation loss: initial" in m][-1]
    assert f"initial {init[0]:.4g}, the descent's start {first:.4g}," in last


# -- inputs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2.7,), (0,), (-1,), (True,), 3])
def test_array_refuses_a_shape_that_is_no_tuple_of_positive_ints(shape: Any) -> None:
    with pytest.raises(ValueError, match=r"shape=.* must be a tuple of ints >= 1"):
        hg.Array("a", 0.1, shape)


def test_shapes_and_seeds_as_other_integer_types_are_taken() -> None:
    from omegaconf import OmegaConf

    assert hg.Array("l2", 0.1, OmegaConf.create({"s": [30]}).s).shape() == (30,)
    assert hg.Array("a", 0.1, (np.int64(3), 2)).shape() == (3, 2)
    x = torch.arange(16.0)[:, None]
    assert torch.equal(MiniBatches(x, batch_size=4, seed=np.int64(3)).indices(5),
                       MiniBatches(x, batch_size=4, seed=3).indices(5))


def test_counts_given_as_bools_and_params_as_one_string_are_refused() -> None:
    with pytest.raises(ValueError, match=r"windows=True must be an int"):
        hg.Schedule("lr", 0.1, windows=True)
    with pytest.raises(ValueError, match=r"n=True must be the number"):
        hg.PerExample("w", 1.0, n=True)
    with pytest.raises(TypeError,
                       match=r"params='0.weight' must be a list .*params=\['0.weight'\]"):
        hg.PerTensor("wd", 1e-3, "log", params="0.weight")


def test_a_bound_or_init_that_rounds_onto_the_domains_edge_says_so() -> None:
    p = _mlp_problem([hg.Scalar("mom", 0.5, "logit")], hg.optim.sgd(lr=0.1, momentum="mom"))
    p32 = hg.InnerProblem(p.fmodel.module.float(), p.train_loss, p.optimizer, p.hyperparams,
                          MiniBatches(torch.randn(32, 4), torch.randint(0, 3, (32,)),
                                      batch_size=8), 4, lambda m, hp: m(torch.ones(1, 4)).sum())
    with pytest.raises(ValueError, match=r"which rounds to 1.0 in torch.float32"):
        hg.Trainer(p32, guards=hg.Guards(bounds={"mom": (None, 0.99999999)}))
    with pytest.raises(ValueError, match=r"init=0.99999999 .* rounds to 1.0 in torch.float32"):
        hg.Scalar("mom", 0.99999999, "logit").init_raw(torch.float32)


def test_integer_features_are_named_with_the_fix() -> None:
    x = torch.randint(0, 5, (16, 4))
    y = torch.randint(0, 3, (16,))
    model = nn.Linear(4, 3).double()
    p = hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                        MiniBatches(x, y, batch_size=8), 2,
                        lambda m, hp: m(torch.ones(1, 4, dtype=torch.float64)).sum())
    with pytest.raises(TypeError, match=r"tensor 0 of mini-batch 0 is torch.int64 .* Convert "
                                        r"the data to the model's dtype: x.double\(\)"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hg.ForwardMode().hypergradient(p, p.init_raw())


def test_results_json_round_trip_of_numpy_values() -> None:
    from hypergrad.run.files import dumps

    out = json.loads(dumps({"a": np.float64(0.5), "b": np.int64(2), "c": Path("x")}))
    assert out == {"a": 0.5, "b": 2, "c": "x"}


class _Rewrites(hg.Callback):
    """A user's callback that edits the record it logs."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
        self.seen.append(record["val_loss"])
        record["val_loss"] = 0.0
        record["hyperparams"]["lr"] = -1.0


def test_a_callback_that_edits_its_record_changes_no_history(tmp_path: Path) -> None:
    """Callbacks got the very dict the history held: one that rewrote it changed the result's
    history, the next callback's record and the checkpoints written after it."""
    def fit(*extra: Any, folder: Any = None) -> hg.TrainResult:
        return hg.Trainer(small(), hg.ForwardMode(), mode=hg.Offline(outer_steps=3),
                          folder=folder, callbacks=[*quiet(), *extra]).fit()

    plain = fit()
    first, second = _Rewrites(), _Rewrites()
    edited = fit(first, second, folder=hg.RunFolder(tmp_path / "run"))
    want = [h["val_loss"] for h in plain.history]
    assert [h["val_loss"] for h in edited.history] == want
    assert [h["hyperparams"] for h in edited.history] == [h["hyperparams"] for h in plain.history]
    assert first.seen == want and second.seen == want
    kept = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert [h["val_loss"] for h in kept["history"]] == want


def test_a_tasks_metrics_never_overwrite_the_records_own_fields(tmp_path: Path) -> None:
    """``Task(evaluate=...)`` metrics join each outer step's record: a test loss reported as
    ``val_loss`` overwrote the record's validation loss (history and metrics.jsonl), and
    ``outer_step`` its step numbers. A clashing metric is now kept as ``evaluate.<name>`` with
    one warning, the record's value unchanged; one that agrees with the record (a classifier's
    evaluation of the validation split, as the bundled tasks report) is left out; a bad return
    is named."""
    from hypergrad.errors import HypergradWarning

    def run(evaluate: Any, folder: Path | None = None) -> hg.TrainResult:
        return hg.Trainer(hg.Task(small(), evaluate=evaluate, name="mine"), "forward",
                          mode=hg.Offline(outer_steps=2), folder=folder,
                          callbacks=quiet()).fit()

    plain = run(None)
    with pytest.warns(HypergradWarning, match=r"Task 'mine': evaluate returned (val_loss|"
                                              r"outer_step|inner_step)=.*kept as") as rec:
        clash = run(lambda s: {"val_loss": 1.5, "outer_step": 100, "inner_step": 3,
                               "test_acc": 0.9}, tmp_path / "clash")
    said = [str(w.message) for w in rec]
    assert len(said) == 3  # once each, not once per outer step
    assert any(x.startswith("Task 'mine': evaluate returned val_loss=1.5, a name the record "
                            "uses for its own field (the record's: ") and
               "kept as 'evaluate.val_loss'" in x for x in said)
    assert [h["val_loss"] for h in clash.history] == [h["val_loss"] for h in plain.history]
    assert [h["outer_step"] for h in clash.history] == [0, 1]
    assert "inner_step" not in clash.history[0]
    assert all(h["evaluate.val_loss"] == 1.5 and h["evaluate.outer_step"] == 100
               and h["evaluate.inner_step"] == 3 and h["test_acc"] == 0.9 for h in clash.history)
    lines = [json.loads(x) for x in (tmp_path / "clash" / "metrics.jsonl").read_text().splitlines()]
    assert [x["val_loss"] for x in lines] == [h["val_loss"] for h in plain.history]
    with pytest.raises(TypeError, match=r"evaluate returned float 0.5; it must return a mapping"):
        run(lambda s: 0.5)
    with pytest.raises(TypeError, match=r"evaluate returned acc='high'; a metric must be a "
                                        r"number"):
        run(lambda s: {"acc": "high"})
    # agreeing with the record: left out, the record's own value kept, no warning
    ref = small()

    def agrees(state: Any) -> dict[str, Any]:  # the validation loss, computed here again
        v = ref.objective(state.params, state.buffers, ref.init_raw())
        return {"val_loss": v.detach(), "test_acc": 0.75}

    r = run(agrees, tmp_path / "run")
    assert [h["val_loss"] for h in r.history] == [h["val_loss"] for h in plain.history]
    assert all(h["test_acc"] == 0.75 and "evaluate.val_loss" not in h for h in r.history)


def test_a_nan_metric_equal_to_the_records_nan_is_the_records_own() -> None:
    """A diverged run's val_loss is NaN in the record and in a bundled task's evaluate: NaN
    never equals itself, so it was kept as evaluate.val_loss beside it (a duplicate column)
    with a warning to rename a metric the user never wrote (the report probe)."""
    import warnings

    p = small()
    task = hg.Task(p, evaluate=lambda s: {"val_loss": math.nan, "test_acc": 0.5}, name="mine")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = task.metrics(p.initial_state(p.init_raw()), fields={"val_loss": math.nan})
    assert got == {"test_acc": 0.5}


def test_the_closing_message_calls_a_rechecked_point_returned_not_best() -> None:
    """With a re-check (or a select_loss) the point returned need not have the lowest
    validation loss: the message read "best 0.3317 (outer step 3), last 0.3045"."""
    said: list[str] = []
    tr = hg.Trainer(small(), "forward", mode=hg.Offline(outer_steps=3, start=0, recheck=2),
                    callbacks=[hg.run.Log(said.append), hg.run.Progress(False)])
    res = tr.fit()
    last = [m for m in said if "validation loss: initial" in m][-1]
    assert res.rechecked and ", returned " in last and ", best " not in last


def test_a_val_loss_in_eval_mode_beside_a_train_mode_objective_is_explained() -> None:
    """With val_mode='train' the bundled tasks' evaluate (the model in eval mode) reports
    another val_loss than the record's, and the warning advised renaming a metric the user
    never wrote (the reports probe, 2026-12-07)."""
    from hypergrad.errors import HypergradWarning

    problem = small()
    problem.val_mode = "train"
    task = hg.Task(problem, evaluate=lambda s: {"val_loss": 2.0}, name="bn")
    with pytest.warns(HypergradWarning, match=r"val_mode='train'.*Both are kept") as rec:
        assert task.metrics(None, fields={"val_loss": 1.0}) == {  # type: ignore[arg-type]
            "evaluate.val_loss": 2.0}
    assert "Rename" not in str(rec[0].message)


class _Flips(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Digits flipped at random and noised, drawn in __getitem__."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.x[i].view(8, 8)
        if torch.rand(()) < 0.5:
            img = img.flip(1)
        return img.reshape(64) + 0.05 * torch.randn(64, dtype=img.dtype), self.y[i]


def test_the_closing_message_says_one_point_evaluated_twice_is_one_point() -> None:
    """An augmenting, shuffling DataLoader and dropout: the final evaluation of the point
    returned gave another loss than its first ("best 2.017 (outer step 3), last 2.126 (outer
    step 3)"), which read as two points (the checkpoint probe, 2026-12-08)."""
    from torch.utils.data import DataLoader

    data = digits_data(n_train=96, n_val=100, n_test=8, dtype=torch.float64)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3),
                          nn.Linear(16, 10)).double()
    p = hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.optim.sgd(lr="lr", momentum="mom", weight_decay="wd"),
        hg.HyperParams([hg.Scalar("lr", 0.1, "log"), hg.Scalar("mom", 0.5, "logit"),
                        hg.PerGroup("wd", 1e-3, "log", groups={"w": r"weight$"}, default=0.0)]),
        DataLoader(_Flips(data.x_train, data.y_train), batch_size=16, shuffle=True), 13,
        lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val), seed=0)
    said: list[str] = []
    res = hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=3),
                     callbacks=[hg.run.Log(said.append), hg.run.Progress(False)]).fit()
    assert torch.equal(res.lam, res.last_lam) and res.best_val_loss != res.last_val_loss
    last = [m for m in said if "validation loss: initial" in m][-1]
    assert last.endswith("(the same point evaluated again: its runs differ in their batches "
                         "or random draws)"), last
