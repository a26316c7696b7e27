"""A review of the ranks (hypergrad.distributed) against one process, in float64: the defects it
found, each with the test that reproduced it. Multi-process cases start two ranks of this file
the way torchrun starts them (``python tests/test_review_distributed.py CASE OUT``).

- data parallelism refuses a BatchNorm without running statistics (``track_running_stats=False``
  normalises each shard by its own statistics: the hypergradient was 45% off, silently);
- more column ranks than columns (K = 1 on 2 ranks): the rank that holds none gathers zeros
  (it failed in ``hypergradient_at``);
- a rank that raises inside ``launch()`` shows its error (its end-of-run barrier met the other
  rank's collective and gloo aborted the process before the traceback was printed);
- ranks whose plain runs take different times decided the time budget apart (each read its own
  clock; now rank 0's).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()


def _ranks(*args: str, timeout: float = 120.0) -> list[tuple[int | None, str]]:
    """Two ranks of this file with torchrun's environment; each rank's (status, output)."""
    from fixtures import run_ranks

    return run_ranks(HERE, 2, *args, timeout=timeout)


def one_lr_problem(steps: int = 4):  # type: ignore[no-untyped-def]
    """K = 1 (a learning rate) on tests/dist_worker.py's MLP and batches of 7."""
    import dist_worker

    import hypergrad as hg

    (model, batches), val_loss = dist_worker._data()

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(batch[0]), batch[1])

    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")])
    return hg.InnerProblem(model, train_loss, hg.optim.sgd(lr="lr", momentum=0.9), hps, batches,
                           steps, val_loss)


def test_data_parallel_refuses_a_batchnorm_without_running_statistics() -> None:
    import hypergrad as hg
    from hypergrad.data import MiniBatches
    from hypergrad.distributed.shard import check_data_parallel

    g = torch.Generator().manual_seed(0)
    x, xv = (torch.randn(n, 6, generator=g, dtype=torch.float64) for n in (16, 8))
    y, yv = (torch.randint(0, 3, (n,), generator=g) for n in (16, 8))

    def problem(bn: nn.Module) -> hg.InnerProblem:
        model = nn.Sequential(nn.Linear(6, 4), bn, nn.Tanh(), nn.Linear(4, 3)).double()
        return hg.InnerProblem(
            model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
            hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, transform="log")]),
            MiniBatches(x, y, batch_size=8, seed=0), 2,
            lambda m, hp: F.cross_entropy(m(xv), yv))

    # normalised by each shard's batch statistics: another function than the whole batch's
    with pytest.raises(ValueError, match=r"BatchNorm running statistics or batch statistics "
                                         r"\(this one has \['1'\]\)"):
        check_data_parallel(problem(nn.BatchNorm1d(4, track_running_stats=False)))
    frozen = nn.BatchNorm1d(4).eval()  # fixed statistics, example by example: allowed
    check_data_parallel(problem(frozen))


class _RunAvg(nn.Module):
    """A user's running average of the batch, written out of place (hypergrad carries it as
    training state): each shard would average its own examples."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("avg", torch.zeros(4, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.avg = 0.9 * self.avg + 0.1 * x.mean(0)
        return x - self.avg


def test_data_parallel_refuses_state_forward_updates_from_the_batch() -> None:
    """Such buffers become state at the problem's probe, which data parallelism's check ran only
    after looking at the buffers: a problem not yet checked was accepted."""
    import hypergrad as hg
    from hypergrad.data import MiniBatches
    from hypergrad.distributed.shard import check_data_parallel

    g = torch.Generator().manual_seed(0)
    x, xv = (torch.randn(n, 6, generator=g, dtype=torch.float64) for n in (16, 8))
    y, yv = (torch.randint(0, 3, (n,), generator=g) for n in (16, 8))
    model = nn.Sequential(nn.Linear(6, 4), _RunAvg(), nn.Tanh(), nn.Linear(4, 3)).double()
    p = hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1)]),
                        MiniBatches(x, y, batch_size=8, seed=0), 2,
                        lambda m, hp: F.cross_entropy(m(xv), yv))
    with pytest.raises(ValueError, match=r"this one has \['1.avg'\]"):
        check_data_parallel(p)


def test_data_parallel_keeps_spectral_norm_and_equals_one_process(tmp_path: Path) -> None:
    """spectral_norm's vectors follow the weights alone (every rank updates them alike): data
    parallelism refused them as BatchNorm statistics; forward mode across the ranks keeps them
    and equals one process; reverse mode (1.5 % off when allowed) refuses them, naming forward
    mode."""
    runs = _ranks("spectral", str(tmp_path))
    for r, (rc, text) in enumerate(runs):
        assert rc == 0, f"rank {r} ended with {rc}:\n{text[-3000:]}"
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt")
        err = float((got["grad"] - got["ref"]).norm() / got["ref"].norm())
        assert err <= 1e-12, err
        assert "data_parallel(ForwardMode()) keeps them" in got["refused"], got["refused"]


def test_more_column_ranks_than_columns_equals_one_process(tmp_path: Path) -> None:
    import hypergrad as hg

    runs = _ranks("one_column", str(tmp_path))
    for r, (rc, text) in enumerate(runs):
        assert rc == 0, f"rank {r} ended with {rc}:\n{text[-3000:]}"
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert sorted(len(g["held"]) for g in got) == [0, 1]
    p = one_lr_problem()
    ref = hg.ForwardMode().hypergradient(p, p.init_raw())
    for g in got:
        assert torch.equal(g["value"], got[0]["value"])  # the guards see one value
        err = float((g["grad"] - ref.grad).abs().max() / ref.grad.abs().max())
        assert err <= 1e-12, err


def test_a_rank_that_raises_shows_its_error_and_the_other_stops(tmp_path: Path) -> None:
    (rc0, text0), (rc1, text1) = _ranks("raise", str(tmp_path))
    assert rc1 == 1 and "ValueError: rank 1's own error" in text1, text1[-3000:]
    assert rc0 == 1 and "DistributedError" in text0, text0[-3000:]


@pytest.mark.slow
def test_ranks_of_different_speed_agree_on_a_time_budget(tmp_path: Path) -> None:
    """Each rank read its own clock: with one rank slower, rank 0 took an outer step more, its
    gather met the other's end-of-run barrier and the ranks returned different points. The
    Trainer now decides by rank 0's clock (Ranks.now)."""
    runs = _ranks("budget", str(tmp_path), timeout=200.0)
    for r, (rc, text) in enumerate(runs):
        assert rc == 0, f"rank {r} ended with {rc}:\n{text[-3000:]}"
    a, b = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert a["evaluations"] == b["evaluations"] and a["history"] == b["history"]
    assert torch.equal(a["lam"], b["lam"])


# -- the ranks ---------------------------------------------------------------------------------

def _one_column(out: Path) -> None:
    from hypergrad import distributed as hd

    p = one_lr_problem()
    method = hd.column_parallel()
    lam = p.init_raw()
    hg_ = method.hypergradient(p, lam)
    torch.save({"held": method.columns(p), "value": hg_.objective, "grad": hg_.grad},
               out / f"rank{hd.rank()}.pt")


def _raise(out: Path) -> None:
    from hypergrad import distributed as hd
    from hypergrad.distributed.mesh import all_sum

    if hd.rank() == 1:
        raise ValueError("rank 1's own error")
    all_sum([torch.ones(3, dtype=torch.float64)], torch.distributed.group.WORLD, "a sum")


def _budget(out: Path) -> None:
    import dist_worker

    import hypergrad as hg
    from hypergrad import distributed as hd

    p = dist_worker.mixed(steps=6)
    loss, slow = p.train_loss, hd.rank() == 1

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        if slow:  # a slower node
            time.sleep(0.02)
        return loss(m, batch, hp)

    p.train_loss = train_loss
    res = hg.Trainer(p, "forward", mode=hg.Offline(outer_steps=30, start=4),
                     guards=hg.Guards(time_budget=2.0), strategy=hd.Ranks(),
                     callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    torch.save({"lam": res.lam, "history": [h["val_loss"] for h in res.history],
                "evaluations": [e["val_loss"] for e in res.evaluations]},
               out / f"rank{hd.rank()}.pt")


def _spectral(out: Path) -> None:
    import dist_worker

    import hypergrad as hg
    from hypergrad import distributed as hd

    (model, batches), val_loss = dist_worker._data()
    torch.manual_seed(0)
    model = nn.Sequential(torch.nn.utils.parametrizations.spectral_norm(nn.Linear(16, 8)),
                          nn.Tanh(), nn.Linear(8, 4)).double()
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, transform="log"),
                          hg.PerTensor("wd", 1e-2, transform="log")])
    p = hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                        hg.optim.sgd(lr="lr", momentum=0.9, weight_decay="wd"), hps, batches, 4,
                        val_loss)
    got = hd.data_parallel(hg.ForwardMode()).hypergradient(p, p.init_raw())
    try:  # reverse mode's summed adjoints would count the vectors' part once per rank
        hd.data_parallel(hg.ReverseMode()).hypergradient(p, p.init_raw())
        refused = ""
    except ValueError as err:
        refused = str(err)
    ref = hg.ReverseMode().hypergradient(p, p.init_raw())  # one process, the whole batches
    torch.save({"grad": got.grad, "ref": ref.grad, "refused": refused},
               out / f"rank{hd.rank()}.pt")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    from hypergrad import distributed as hd

    case, out = sys.argv[1], Path(sys.argv[2])
    with hd.launch(timeout=30.0):
        {"one_column": _one_column, "raise": _raise, "budget": _budget,
         "spectral": _spectral}[case](out)


if __name__ == "__main__":
    main()
