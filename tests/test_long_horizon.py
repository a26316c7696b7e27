"""What long horizons need (issue 26): a checkpoint within an inner run (RunFolder(inner_every=N),
resumed mid-run bitwise equal), the character-level LM task and its preset, and
experiments/long_horizon.py --quick end to end."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hypergrad as hg
from hypergrad.tasks import digits_data, mlp

ROOT = Path(__file__).resolve().parents[1]


class _Stop(Exception):
    pass


class _KillAt(hg.Callback):
    """Raises at inner step ``step`` of outer step ``outer`` (a kill between two inner steps)."""

    def __init__(self, outer: int, step: int) -> None:
        self.outer, self.step = outer, step

    def on_inner_step(self, trainer: Any, step: int, total: int) -> None:
        if trainer.outer_step == self.outer and step == self.step:
            raise _Stop


def _problem(method_steps: int = 10) -> hg.InnerProblem:
    """A float64 MLP on digits read from a shuffling DataLoader (one pass per inner run), with a
    3-window lr schedule and a momentum."""
    data = digits_data(n_train=96, n_val=64, dtype=torch.float64)
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(data.x_train, data.y_train), batch_size=16, shuffle=True)
    return hg.InnerProblem(
        mlp([64, 16, 10]).double(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.optim.sgd(lr="lr", momentum="mom", clip_grad_norm=1.0),
        hg.HyperParams([hg.Schedule("lr", 0.1, windows=3, transform="log"),
                        hg.Scalar("mom", 0.5, transform="logit")]),
        loader, method_steps, lambda m, hp: F.cross_entropy(m(data.x_val), data.y_val))


def _trainer(problem: hg.InnerProblem, folder: Any, method: Any = "forward",
             callbacks: list[Any] | None = None) -> hg.Trainer:
    return hg.Trainer(problem, method, outer=functools.partial(hg.SignDescent, lr=0.3),
                      mode=hg.Offline(outer_steps=3), folder=folder,
                      callbacks=[hg.run.Log(None), hg.run.Progress(False), *(callbacks or [])])


@pytest.mark.parametrize("method", ["forward", "marthe"])
def test_inner_checkpoint_resumes_mid_run_bitwise(tmp_path: Path, method: Any) -> None:
    """A run killed between inner steps 7 and 8 of outer step 1, with a checkpoint every 3 inner
    steps, resumes at inner step 6 of that outer step and ends bitwise equal to the run never
    killed: the same hyperparameters, validation losses and hypergradient norms."""
    m = hg.MARTHE(mu=0.9) if method == "marthe" else method
    straight = _trainer(_problem(), None, m).fit()
    folder = tmp_path / "run"
    with pytest.raises(_Stop):
        _trainer(_problem(), hg.RunFolder(folder, inner_every=3), m,
                 [_KillAt(outer=1, step=7)]).fit()
    ck = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert ck["outer_step"] == 1 and ck["inner"]["run"]["step"] == 6
    messages: list[str] = []
    resumed = hg.Trainer(
        _problem(), m, outer=functools.partial(hg.SignDescent, lr=0.3),
        mode=hg.Offline(outer_steps=3), folder=hg.RunFolder(folder, resume=True, inner_every=3),
        callbacks=[hg.run.Log(messages.append), hg.run.Progress(False)]).fit()
    assert any("inner run resumed at step 6 of 10" in x for x in messages), messages
    assert torch.equal(resumed.lam, straight.lam)
    assert torch.equal(resumed.last_lam, straight.last_lam)
    for a, b in zip(resumed.history, straight.history, strict=True):
        assert a["val_loss"] == b["val_loss"] and a["hypergrad_norm"] == b["hypergrad_norm"]
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["outer_step"] for x in lines] == [0, 1, 2]


def test_inner_checkpoint_ignored_at_another_point(tmp_path: Path) -> None:
    """An inner checkpoint applies only to its own outer step and lam; inner_every is checked."""
    with pytest.raises(ValueError, match="inner_every"):
        hg.RunFolder(tmp_path, inner_every=0)
    assert "inner_every=5" in repr(hg.RunFolder(tmp_path, inner_every=5))
