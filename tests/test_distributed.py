"""Scale-out with torch.distributed (gloo, CPU, float64): two processes started the way torchrun
starts them (tests/dist_worker.py), compared with one process.

- column-parallel forward, data-parallel forward and data-parallel reverse mode equal the
  single-process hypergradient to 1e-12 on a problem with a schedule, momentum and a per-tensor
  weight decay (unequal shards: batches of 7 split 4 + 3), and every rank runs the same primal;
- an online column-parallel Trainer run whose rank 0 is killed in a checkpoint write ends with
  an error on the other rank, and resumed under two processes it ends exactly where an
  uninterrupted run ends; resumed under one process it is refused with the reason;
- a rank that hangs makes its peer fail after the timeout, not wait forever;
- ``hypergrad-run`` under torchrun: the Trainer splits the columns, rank 0 alone writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dist_worker
import pytest
import torch
from fixtures import free_port, model_problem, rank_env

import hypergrad as hg
from hypergrad import distributed as hd
from hypergrad.distributed.shard import check_data_parallel
from hypergrad.errors import ResumeMismatchError

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "dist_worker.py"


def launch(*args: str, nprocs: int = 2, timeout: float = 120.0, env: dict[str, str] | None = None,
           kill_after_first: bool = False) -> list[tuple[int | None, str, float]]:
    """Start ``nprocs`` ranks of the worker as torchrun would (its environment variables); wait
    for all (``kill_after_first``: kill the others once one has ended, as torchrun does);
    returns each rank's ``(return code, output, seconds)``."""
    port = str(free_port())
    procs = []
    t0 = time.perf_counter()
    for r in range(nprocs):
        e = {**os.environ, **rank_env(nprocs), **(env or {}), "RANK": str(r), "LOCAL_RANK": str(r),
             "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
             "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        if nprocs == 1 and env is None:  # one plain process, no launcher
            for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
                e.pop(k)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *args], cwd=ROOT, env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    ended: dict[int, float] = {}
    while len(ended) < nprocs and time.perf_counter() - t0 < timeout:
        for r, p in enumerate(procs):
            if r not in ended and p.poll() is not None:
                ended[r] = time.perf_counter() - t0
        if kill_after_first and ended:
            break
        time.sleep(0.05)
    out = []
    for r, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
        text = p.communicate()[0]
        out.append((p.returncode if r in ended else None, text, ended.get(r, float("nan"))))
    return out


def _ok(runs: list[tuple[int | None, str, float]]) -> None:
    for r, (rc, text, _) in enumerate(runs):
        assert rc == 0, f"rank {r} ended with {rc}:\n{text[-3000:]}"


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-12) -> float:
    err = float((a - b).abs().max() / b.abs().max())
    assert err <= tol, f"relative error {err:.3g} > {tol:g}"
    return err


@pytest.fixture(scope="module")
def hypergrads(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Any]:
    out = tmp_path_factory.mktemp("hypergrads")
    runs = launch("hypergrads", str(out))
    _ok(runs)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    p, q = dist_worker.mixed(), dist_worker.schedule_only()
    lam, lq = dist_worker.lam_of(p), dist_worker.lam_of(q)
    ref = {"forward": hg.ForwardMode().hypergradient(p, lam),
           "reverse": hg.ReverseMode().hypergradient(p, lam),
           "schedule": hg.ForwardMode().hypergradient(q, lq)}
    return ranks, ref


def test_column_parallel_forward_equals_one_process(hypergrads: Any) -> None:
    ranks, ref = hypergrads
    held = [set(r["columns_held"]) for r in ranks]
    assert held[0].isdisjoint(held[1]) and held[0] | held[1] == set(range(10))
    assert abs(len(held[0]) - len(held[1])) <= 2  # balanced by live steps, not by count
    for r in ranks:
        _close(r["column"], ref["forward"].grad)
        _close(r["column"], ref["reverse"].grad, 1e-10)  # and the method is right
        # the schedule-only problem: one rank's columns all start late (no column at first)
        assert min(len(x["column_schedule_held"]) for x in ranks) >= 1
        _close(r["column_schedule"], ref["schedule"].grad)
    for name, v in ranks[0]["column_state"].items():  # one primal trajectory on both ranks
        assert torch.equal(v, ranks[1]["column_state"][name])
        _close(v, ref["forward"].state.params[name])


def test_data_parallel_forward_equals_one_process(hypergrads: Any) -> None:
    ranks, ref = hypergrads
    for r in ranks:
        _close(r["data_forward"], ref["forward"].grad)
    for name, v in ranks[0]["data_forward_state"].items():
        assert torch.equal(v, ranks[1]["data_forward_state"][name])
        _close(v, ref["forward"].state.params[name])


def test_data_parallel_reverse_equals_one_process(hypergrads: Any) -> None:
    ranks, ref = hypergrads
    for r in ranks:
        _close(r["data_reverse"], ref["reverse"].grad)
        _close(r["data_reverse"], ref["forward"].grad)
        _close(r["data_reverse_ckpt"], ref["reverse"].grad)
    assert torch.equal(ranks[0]["data_reverse"], ranks[1]["data_reverse"])


def test_a_killed_rank_ends_the_job_and_resume_equals_an_uninterrupted_run(
        tmp_path: Path) -> None:
    cut, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    # an uninterrupted run, then one whose rank 0 dies writing its checkpoint of outer step 2
    runs = launch("train", str(cut), str(out),
                  env={"HYPERGRAD_TEST_CHECKPOINT_FAULT": "step=2,kill-before-rename"})
    (rc0, text0, _), (rc1, text1, _) = runs
    assert rc0 == -9, text0[-2000:]
    assert rc1 not in (0, None), text1[-2000:]  # the other rank stopped with an error
    assert "DistributedError" in text1 and "another rank died" in text1, text1[-2000:]
    assert not (out / "rank1.pt").exists()
    # resumed by two processes: exactly the uninterrupted run's result
    _ok(launch("train", str(cut), str(out), "--resume"))
    for r in range(2):
        whole, res = torch.load(out / f"whole{r}.pt"), torch.load(out / f"rank{r}.pt")
        assert "ParallelForward" in whole["method"] and whole["held"] < 10  # columns split
        assert torch.equal(res["lam"], whole["lam"]), (res["lam"], whole["lam"])
        assert res["history"] == whole["history"]
    assert len((cut / "metrics.jsonl").read_text().splitlines()) == 4  # rank 0's lines only
    # by one process (this one): refused, with the reason and the fix
    with pytest.raises(ResumeMismatchError, match="written by a run of 2 processes, this run "
                                                   "has 1.*--nproc_per_node=2"):
        hg.Trainer(dist_worker.mixed(steps=8), "forward", mode=hg.Online(interval=2),
                   folder=hg.RunFolder(cut, resume=True), callbacks=[hg.run.Log(None)])


def test_a_hanging_rank_ends_the_job_after_the_timeout(tmp_path: Path) -> None:
    runs = launch("hang", str(tmp_path), timeout=60, kill_after_first=True)
    (rc0, text0, t0), (rc1, _, _) = runs
    assert rc0 == 1, text0[-2000:]
    assert rc1 is None  # still hanging when rank 0 gave up (the launcher then ends it)
    waited, msg = (tmp_path / "rank0.txt").read_text().split("\n", 1)
    assert 2.5 <= float(waited) < 20, waited
    assert "did not arrive within the timeout (3 s)" in msg


@pytest.mark.parametrize("what", ["data", "steps"])
def test_ranks_holding_different_problems_are_refused_on_every_rank(what: str,
                                                                      tmp_path: Path) -> None:
    """A rank given other data summed its columns' rows into rank 0's: a hypergradient of
    neither problem, without an error (another T: the same, or a bare gloo abort in data
    parallel). Every rank now refuses, naming the rank and what differs."""
    _ok(launch("mismatch", str(tmp_path), what))
    said = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    differs = {"data": "problem.data", "steps": "problem.steps: 6 -> 7"}[what]
    for r in range(2):
        for name in ("column", "reverse"):
            assert "the processes hold different problems" in said[r][name], (r, name)
            assert f"rank 1: {differs}" in said[r][name], said[r][name]


@pytest.mark.parametrize("what", ["lam", "pass"])
def test_ranks_called_at_other_points_or_passes_are_refused_on_every_rank(
        what: str, tmp_path: Path) -> None:
    """Rank 1 given lam + 0.05: column parallel returned a hypergradient 2e-3 off, data
    parallel reverse mode a different vector on each rank; rank 0 alone running a plain run
    of a shuffled DataLoader problem: the ranks' sum mixed two passes, 0.37-11x off, silently
    (the distributed probe). The problems' comparison runs once and saw neither."""
    _ok(launch("mismatch", str(tmp_path), what))
    said = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    differs = {"lam": "lam: ", "pass": "batch source passes begun: 1 -> 0"}[what]
    for r in range(2):
        for name in ("column", "reverse"):
            assert "the processes hold different arguments" in said[r][name], said[r][name]
            assert f"rank 1: {differs}" in said[r][name], said[r][name]


def test_ranks_built_with_other_run_settings_refuse_together(tmp_path: Path) -> None:
    """A rank given another outer learning rate went its own way: rank 0's result was a
    hypergradient sum at two points, with exit status 0 (the distributed probe)."""
    _ok(launch("settings", str(tmp_path)))
    said = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in range(2):
        assert "the processes hold different run settings" in said[r]["lr"], said[r]
        assert "rank 1: trainer.outer_given[0][lr]: 0.05 -> 0.1" in said[r]["lr"], said[r]
        assert "rank 1: trainer.mode.outer_steps: 2 -> 3" in said[r]["steps"], said[r]


def test_a_stop_asked_by_a_callback_on_rank_0_ends_every_rank(tmp_path: Path) -> None:
    """Only rank 0 calls callbacks: a stop decided there alone would end its loop and leave
    the other ranks waiting in the next step's collectives."""
    _ok(launch("stop", str(tmp_path)))
    for r in range(2):
        assert torch.load(tmp_path / f"rank{r}.pt") == {"steps": 2, "stopped": "enough"}


def test_a_rank_not_given_resume_follows_rank_0s_resumed_run(tmp_path: Path) -> None:
    """Only rank 0 was given resume=True: rank 1 started afresh beside the resumed rank 0,
    which wrote a wrong record before the run failed (the distributed probe)."""
    run = tmp_path / "run"
    _ok(launch("follow", str(run), str(tmp_path)))
    first = torch.load(tmp_path / "rank0.pt")
    _ok(launch("follow", str(run), str(tmp_path), "--resume"))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0]["history"][:2] == first["history"] and len(ranks[0]["history"]) == 3
    assert ranks[1]["history"] == ranks[0]["history"]
    assert torch.equal(ranks[1]["lam"], ranks[0]["lam"])


def test_one_process_runs_the_parallel_methods_as_the_plain_ones() -> None:
    p = dist_worker.mixed()
    lam = dist_worker.lam_of(p)
    ref = hg.ForwardMode().hypergradient(p, lam).grad
    assert torch.equal(hd.column_parallel().hypergradient(p, lam).grad, ref)
    ranks = hd.Ranks()
    assert torch.equal(ranks.setup(hg.ForwardMode()).hypergradient(p, lam).grad, ref)
    assert hd.world_size() == 1 and hd.is_writer() and ranks.fingerprint(hg.ForwardMode()) == {}


def test_a_launched_rank_above_0_is_no_writer_before_the_group_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Trainer(strategy=Ranks()) outside launch() picks its callbacks before the strategy
    starts the group: every rank took itself for rank 0 and ran the user's callbacks (a file
    written once per rank; the distributed probe)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert not hd.active() and not hd.is_writer() and not hd.Ranks().is_writer
    monkeypatch.setenv("RANK", "0")
    assert hd.is_writer() and hd.Ranks().is_writer


def test_columns_are_dealt_by_the_steps_they_are_computed() -> None:
    # 8 windows over 8 steps: window w is computed for 8 - w steps
    costs = [8.0 - w for w in range(8)]
    shares = hd.assign_columns(costs, 2)
    assert sorted(shares[0] + shares[1]) == list(range(8))
    loads = [sum(costs[c] for c in s) for s in shares]
    assert loads == [18.0, 18.0]
    assert hd.assign_columns([1.0] * 5, 3) == [[0, 3], [1, 4], [2]]


def test_batches_split_along_the_example_axis() -> None:
    x, y, idx = torch.arange(14.0).reshape(7, 2), torch.arange(7), torch.arange(7)
    (xs, ys, ids), m, n = hd.shard_batch((x, y, idx), 1, 2)
    assert (m, n) == (3, 7) and ids.tolist() == [4, 5, 6] and torch.equal(xs, x[4:])
    with pytest.raises(ValueError, match="first axes of sizes"):
        hd.shard_batch((x, y[:3]), 0, 2)
    with pytest.raises(ValueError, match="cannot be split over 2"):
        hd.shard_batch((x[:1],), 0, 2)


def test_data_parallel_refuses_a_loss_that_is_not_the_sum_of_its_shards() -> None:
    """Checked on the first mini-batch, each shard computed on this rank: a sequence-first RNN
    batch (the split cut time: 6 % off one process), a penalty with reduction='sum' (counted
    once per rank: 16 %), a summed loss given reduction='mean'; a mean plus a penalty passes."""
    import torch.nn.functional as F
    from torch import nn

    from hypergrad.data import MiniBatches
    from hypergrad.distributed.shard import check_decomposes

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 5, generator=g, dtype=torch.float64), torch.randn(16, 1,
                                                                             generator=g,
                                                                             dtype=torch.float64)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log"), hg.Scalar("l2", 1e-2, "log")])

    def problem(loss: Any, model: Any = net, data: Any = None) -> hg.InnerProblem:
        return hg.InnerProblem(model, loss, hg.optim.sgd(lr="lr"), hps,
                               data or MiniBatches(x, y, batch_size=8), 3,
                               lambda m, hp: m.params[next(iter(m.params))].sum() * 0 + hp["l2"])

    def penalty(m: Any) -> torch.Tensor:
        return sum(w.pow(2).sum() for w in m.parameters())

    mean_plus = problem(lambda m, b, hp: F.mse_loss(m(b[0]), b[1]) + hp["l2"] * penalty(m))
    check_decomposes(mean_plus, 2, "mean")
    summed = problem(lambda m, b, hp: F.mse_loss(m(b[0]), b[1], reduction="sum")
                     + hp["l2"] * penalty(m))
    with pytest.raises(ValueError, match=r"each weighted by 1 \(reduction='sum'\).*penalty"):
        check_decomposes(summed, 2, "sum")
    with pytest.raises(ValueError, match=r"each weighted by its share of the examples"):
        check_decomposes(summed, 2, "mean")

    class SequenceFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.head = nn.RNN(3, 4), nn.Linear(4, 1)  # batch_first=False

        def forward(self, s: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(s)[0])

    seq = torch.randn(6, 8, 3, generator=g, dtype=torch.float64)  # (time, examples, features)
    target = torch.randn(6, 8, 1, generator=g, dtype=torch.float64)
    rnn = problem(lambda m, b, hp: F.mse_loss(m(b[0]), b[1]) + hp["l2"] * penalty(m),
                  SequenceFirst().double(), [(seq, target)])
    with pytest.raises(ValueError, match=r"an RNN with batch_first=False, splits time"):
        check_decomposes(rnn, 2, "mean")

    # a mean normalised by per-example weights is the plain mean where they are all 1 (the
    # initial point): it passed, and data parallelism gave hypergradients 16 % off one
    # process's (the distributed probe, 2026-12-07); checked at a moved point too
    w = hg.HyperParams([hg.Scalar("lr", 0.1, "log"), hg.PerExample("w", 1.0, n=16)])

    def weighted(norm: str) -> hg.InnerProblem:
        def loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
            wi = hp["w"][b[2]]
            each = F.mse_loss(m(b[0]), b[1], reduction="none")[:, 0]
            return (wi * each).sum() / (wi.sum() if norm == "weights" else len(wi))

        return hg.InnerProblem(net, loss, hg.optim.sgd(lr="lr"), w,
                               MiniBatches(x, y, batch_size=8), 3,
                               lambda m, hp: F.mse_loss(m(x), y))

    check_decomposes(weighted("size"), 2, "mean")
    with pytest.raises(ValueError, match=r"at hyperparameters moved from the initial ones.*"
                                         r"\(w \* l\).sum\(\) / w.sum\(\), .* does not split"):
        check_decomposes(weighted("weights"), 2, "mean")


@pytest.mark.parametrize("source", ["dataloader", "list"])
def test_data_parallel_checks_later_batches_for_padding(source: str) -> None:
    """cross_entropy's ignore_index divides by the labels it counts: the batch size on a batch
    without padding. Padding in later batches only passed the first batch's check, and the
    data-parallel hypergradient was 56 % off one process's (the distributed probe)."""
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from hypergrad.distributed.shard import check_decomposes

    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (32,), generator=g)
    y[[8, 9, 10, 16, 17, 18, 19]] = -100  # the first batch (rows 0-7) has none
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    hps = hg.HyperParams([hg.Scalar("lr", 0.1, "log")])
    data: Any = (DataLoader(TensorDataset(x, y), batch_size=8) if source == "dataloader" else
                 [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)])

    def problem(loss: Any) -> hg.InnerProblem:
        return hg.InnerProblem(net, loss, hg.optim.sgd(lr="lr"), hps, data, 4,
                               lambda m, hp: F.cross_entropy(m(x), y.clamp(min=0)))

    padded = problem(lambda m, b, hp: F.cross_entropy(m(b[0]), b[1], ignore_index=-100))
    with pytest.raises(ValueError, match=r"on the mini-batch of step 1 .*ignore_index"):
        check_decomposes(padded, 2, "mean")
    per_example = problem(lambda m, b, hp: F.cross_entropy(
        m(b[0]), b[1], ignore_index=-100, reduction="sum") / len(b[1]))
    check_decomposes(per_example, 2, "mean")


def test_data_parallel_refuses_up_front_a_last_batch_smaller_than_the_ranks() -> None:
    """29 examples in batches of 7 (drop_last=False) over 2 ranks: the last batch of 1 was
    refused at step 4 of 6, after the steps before it, without naming drop_last."""
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from hypergrad.distributed.shard import ShardedProblem

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 3, generator=g, dtype=torch.float64), torch.randn(30, 1,
                                                                             generator=g,
                                                                             dtype=torch.float64)

    def problem(n: int, steps: int, drop_last: bool = False) -> hg.InnerProblem:
        torch.manual_seed(0)
        return hg.InnerProblem(nn.Linear(3, 1).double(),
                               lambda m, b, hp: F.mse_loss(m(b[0]), b[1]), hg.optim.sgd(lr="lr"),
                               hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                               DataLoader(TensorDataset(x[:n], y[:n]), batch_size=7,
                                          drop_last=drop_last), steps,
                               lambda m, hp: F.mse_loss(m(x), y))

    with pytest.raises(ValueError, match=r"last batch of an epoch holds 1 of its 29 examples "
                                         r"\(batch_size=7\), which step 4 reads.*drop_last=True"):
        ShardedProblem(problem(29, 6), 0, 2, None)
    for p in (problem(29, 4), problem(29, 6, drop_last=True), problem(30, 6)):
        ShardedProblem(p, 0, 2, None)  # not reached, dropped, or 2 examples: accepted


def test_data_parallel_refuses_batchnorm_and_dropout() -> None:
    from hypergrad.testing import digits_case

    bn = digits_case("momentum", "lr", steps=2, n_train=16, batch_size=8, hidden=4,
                     batchnorm=True)
    with pytest.raises(ValueError, match="BatchNorm running statistics"):
        check_data_parallel(bn)
    with pytest.raises(ValueError, match="draws no random numbers"):
        check_data_parallel(model_problem("dropout_mlp"))
    with pytest.raises(TypeError, match="must be a ForwardMode"):
        hd.ParallelForward(hg.ReverseMode())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not match the 1 processes"):
        hd.mesh(data=2)


@pytest.mark.slow
def test_the_cli_under_torchrun_splits_the_columns_and_rank_0_writes(tmp_path: Path) -> None:
    env = {**os.environ, **rank_env(2), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "hypergrad.cli", "experiment=digits_schedule", "debug=fast",
         "report.retrain=false", "report.plots=false", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "method=ParallelForward" in out.stdout + out.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["outer_steps"] == 2 and res["method"] == "forward"
    assert res["method_settings"] == {}  # exact: not the ranks' split (distributed.mesh)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2  # once, by rank 0
    # Hydra's record of the invocation once too (each rank wrote one: .hydra and .hydra.2)
    assert sorted(p.name for p in tmp_path.glob(".hydra*")) == [".hydra"]
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ck["fingerprint"]["distributed.world_size"] == 2
    assert ck["fingerprint"]["distributed.mesh"] == [1, 2]


def _cli_ranks(tmp_path: Path, rank1: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``hypergrad-run`` of a one-step ``digits_schedule`` under the real torchrun, 2 ranks,
    rank 1 given the override ``rank1`` too."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("import os, sys\n"
                       "if os.environ['RANK'] == '1':\n"
                       "    sys.argv.append(os.environ['RANK1_ARG'])\n"
                       "from hypergrad.cli import main\nmain()\n")
    env = {**os.environ, **rank_env(2), "OMP_NUM_THREADS": "1", "RANK1_ARG": rank1,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(wrapper), "experiment=digits_schedule", "debug=fast", "mode.outer_steps=1",
         "report.retrain=false", "report.plots=false", *args], capture_output=True, text=True,
        cwd=ROOT, env=env, timeout=300)


@pytest.mark.slow
def test_ranks_of_the_cli_given_other_problems_are_refused_as_a_usage_error(
        tmp_path: Path) -> None:
    """Rank 1 given another seed: the refusal came as a ValueError with Hydra's traceback,
    where one of another run setting is a usage error's message (the CLI probe)."""
    out = _cli_ranks(tmp_path, "seed=1", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode != 0
    assert "the processes hold different problems" in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr.split("the processes hold different problems")[0]
    assert "exitcode  : 2" in out.stderr  # torchrun's report of the ranks' status


@pytest.mark.slow
def test_a_rank_given_another_run_folder_under_torchrun_deletes_no_run(tmp_path: Path) -> None:
    """Rank 1 given another ``hydra.run.dir`` (an earlier run's folder; or rank 0's through a
    link, another node's mount) removed everything in it: a finished run's records, or on a
    resume the run's own checkpoint, which then started afresh (the CLI probe). A folder that
    holds only what Hydra wrote for rank 1 is still removed."""
    victim, fresh = tmp_path / "earlier", tmp_path / "fresh"
    victim.mkdir()
    for name in ("results.json", "metrics.jsonl"):
        (victim / name).write_text("{}\n")
    for i, other in enumerate((victim, fresh)):
        run = tmp_path / f"run{i}"
        out = _cli_ranks(tmp_path, f"hydra.run.dir={other}", f"hydra.run.dir={run}")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert (run / "results.json").exists()
    assert {p.name for p in victim.iterdir()} - {".hydra", "cli.log"} == {
        "metrics.jsonl", "results.json"}
    assert (victim / "results.json").read_text() == "{}\n"
    assert not fresh.exists()  # Hydra's own files alone: removed


def test_a_sweep_under_torchrun_is_refused_before_it_starts(tmp_path: Path) -> None:
    """``--multirun`` under torchrun: the second job started the process group again in the
    same processes and hung for the group's timeout; every rank wrote the sweep's records
    (the CLI probe). Refused up front, on each rank, with what to run instead."""
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for flag in ("--multirun", "-m", "hydra.mode=MULTIRUN", "--multi"):  # argparse's prefix
        out = subprocess.run([sys.executable, "-m", "hypergrad.cli", flag, "seed=0,1",
                              f"hydra.sweep.dir={tmp_path / 'sweep'}"], capture_output=True,
                             text=True, cwd=ROOT, env=env, timeout=120)
        assert out.returncode == 2, out.stderr[-2000:]
        assert "--multirun under torchrun is refused" in out.stderr
        assert "Many runs: Hydra launchers" in out.stderr
    assert not (tmp_path / "sweep").exists()
    assert "## Many runs: Hydra launchers" in (ROOT / "docs" / "distributed.md").read_text()


def test_a_sweep_set_in_a_config_file_is_refused_under_torchrun_before_records_move(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """hydra.mode set in a config file passes the command line's check: the sweep's callback
    refuses it, before a rank renames another's multirun.yaml as an earlier sweep's (the
    torchrun probe: each rank took the other's record for an earlier sweep)."""
    from omegaconf import OmegaConf

    from hypergrad.cli import KeepSweepRecord

    (tmp_path / "multirun.yaml").write_text("this sweep's\n")
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as ended:
        KeepSweepRecord().on_multirun_start(cfg)
    assert ended.value.code == 2
    assert "--multirun under torchrun is refused" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multirun.yaml"]


def test_the_docs_torchrun_example_ends_with_status_0_on_every_rank(tmp_path: Path) -> None:
    """docs/distributed.md's ``tune.py`` under the real torchrun, twice in a row: every rank exits
    0 (torchrun's own status is non-zero if any rank fails or aborts at interpreter exit, which
    3 of 10 data-parallel runs did before ``distributed.launch`` destroyed the group and collected
    it) and rank 0 prints forward = reverse to rounding."""
    import re

    page = (ROOT / "docs" / "distributed.md").read_text()
    script = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "tune.py" in b)
    (tmp_path / "tune.py").write_text(script)
    env = {**os.environ, **rank_env(2), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                              f"--master_port={free_port()}", "tune.py"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert float(out.stdout.strip().splitlines()[-1]) < 1e-12


def test_a_rank_without_a_gpu_of_its_own_is_refused_naming_both_fixes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks on a one-GPU node: ``cuda:1`` does not exist (NCCL takes one rank per GPU);
    the launch is refused before CUDA's "invalid device ordinal" (found on an H100)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert hd.device() == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=1 but this node has 1 CUDA device.*"
                                           r"--nproc_per_node=1.*CUDA_VISIBLE_DEVICES=''"):
        hd.device()
