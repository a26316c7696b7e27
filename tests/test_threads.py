"""Two runs in two threads of one process: hypergrad sets torch's process-wide state for each
pass (the default generators seeded per step, the attention fast-path flag, the attention
kernel). Threads drew each other's dropout masks (hypergradients 3-20 % off a sequential run,
without a word), left the fast path off for the process and the caller's generator moved (the
concurrency probe). The passes now take turns (hypergrad.rng.STATE_LOCK): each run is bitwise
a sequential one."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(2, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.2,
                                              batch_first=True)
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(self.inp(x.view(x.shape[0], 8, 2))).mean(1))


def _problem(kind: str, seed: int) -> hg.InnerProblem:
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(48, 16, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (48,), generator=g)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = (nn.Sequential(nn.Linear(16, 12), nn.Tanh(), nn.Dropout(0.3), nn.Linear(12, 4))
                 if kind == "dropout" else _Attn()).double()
    return hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.optim.sgd(lr="lr", momentum="momentum"),
        hg.HyperParams([hg.Scalar("lr", 0.1, transform="log"),
                        hg.Scalar("momentum", 0.5, transform="logit")]),
        MiniBatches(x, y, batch_size=16, seed=seed), 10,
        lambda m, hp: F.cross_entropy(m(x[:16]), y[:16]), val_mode="train", seed=seed)


@pytest.fixture
def interleaved() -> Iterator[None]:
    """Threads switched every 10 microseconds: the interleaving a busy process has."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("kind", ["dropout", "attention"])
def test_two_runs_in_two_threads_are_each_a_sequential_run(kind: str,
                                                           interleaved: None) -> None:
    # built here: a model's initial weights drawn in two threads at once would race in torch
    # itself (torch.manual_seed and nn.Linear's init share the process's generator)
    def grad(p: hg.InnerProblem) -> torch.Tensor:
        return hg.ForwardMode().hypergradient(p, p.init_raw()).grad

    alone = [grad(_problem(kind, 0)), grad(_problem(kind, 1))]
    torch.manual_seed(7)
    mine = torch.random.get_rng_state()
    fastpath = torch.backends.mha.get_fastpath_enabled()
    for _ in range(3):
        problems = [_problem(kind, 0), _problem(kind, 1)]
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(grad, problems))
        assert all(torch.equal(a, b) for a, b in zip(alone, both)), (alone, both)
    assert torch.equal(torch.random.get_rng_state(), mine)  # the caller's stream stayed
    assert torch.backends.mha.get_fastpath_enabled() == fastpath


def _train_loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
    return F.cross_entropy(m(b[0]), b[1])


class _ValLoss:
    """A validation loss that pickles (a closure does not)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __call__(self, m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(self.x), self.y)


def test_methods_and_trainers_go_to_worker_processes() -> None:
    """ForwardMode (and a Trainer holding one) failed to pickle for a multiprocessing or
    joblib worker: "cannot pickle 'weakref.ReferenceType' object" (its per-problem caches);
    a Trainer that pickled lost its search's box (torch's optimizers pickle their groups and
    state only) and failed in the worker."""
    import functools
    import pickle

    p = _problem("dropout", 0)
    fm = hg.ForwardMode()
    first = fm.hypergradient(p, p.init_raw()).grad  # with its caches filled
    again = pickle.loads(pickle.dumps(fm)).hypergradient(p, p.init_raw()).grad
    assert torch.equal(first, again)
    pickle.loads(pickle.dumps(hg.ImplicitDiff()))

    def trainer(outer: Any) -> hg.Trainer:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(32, 16, generator=g, dtype=torch.float64)
        y = torch.randint(0, 4, (32,), generator=g)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)).double()
        q = hg.InnerProblem(model, _train_loss, hg.optim.sgd(lr="lr"),
                            hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")]),
                            MiniBatches(x, y, batch_size=16, seed=0), 4, _ValLoss(x, y))
        return hg.Trainer(q, outer=outer, mode=hg.Offline(outer_steps=2),
                          callbacks=[hg.run.Log(None), hg.run.Progress(False)])

    for outer in (None, functools.partial(hg.SignDescent, lr=0.2)):  # the search, sign steps
        sent = pickle.loads(pickle.dumps(trainer(outer)))
        assert sent.fit().values == trainer(outer).fit().values
