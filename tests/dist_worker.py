"""One rank of the multi-process tests (tests/test_distributed.py starts two of these with the
environment torchrun would give them: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

    python tests/dist_worker.py hypergrads OUT         # every parallel method's hypergradient
    python tests/dist_worker.py train RUN_DIR OUT [--resume]   # online Trainer runs
    python tests/dist_worker.py hang OUT               # rank 1 stops answering

Rank ``r`` writes ``OUT/rank<r>.pt`` (or ``.txt``). Importing this module does nothing (pytest
imports it for doctests).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def _data() -> tuple[Any, Any]:
    """An MLP 16-8-4 on random data (float64; no data set to load: a rank starts in seconds) and
    its mini-batches of 7 examples (data-parallel shards of 4 and 3: unequal), validation loss."""
    from torch import nn

    from hypergrad.data import MiniBatches

    g = torch.Generator().manual_seed(0)
    x, xv = (torch.randn(n, 16, generator=g, dtype=torch.float64) for n in (28, 32))
    y, yv = (torch.randint(0, 4, (n,), generator=g) for n in (28, 32))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)).double()

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(xv), yv)

    return (model, MiniBatches(x, y, batch_size=7, seed=0)), val_loss


def mixed(steps: int = 6, windows: int = 4) -> Any:
    """SGD with a learnable momentum, an lr schedule (windows starting late), a per-tensor weight
    decay and a label-smoothing loss parameter."""
    import hypergrad as hg

    (model, batches), val_loss = _data()
    items: list[Any] = [hg.Schedule("lr", 0.1, windows=windows, transform="log"),
                        hg.Scalar("mom", 0.8, transform="logit"),
                        hg.PerTensor("wd", 1e-2, transform="log"),
                        hg.Array("smooth", 0.1, transform="logit")]
    opt = hg.optim.sgd(lr="lr", momentum="mom", weight_decay="wd")

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, idx = batch
        logp = F.log_softmax(m(x), -1)
        return (1 - hp["smooth"]) * F.nll_loss(logp, y) - hp["smooth"] * logp.mean()

    return hg.InnerProblem(model, train_loss, opt, hg.HyperParams(items), batches, steps,
                           val_loss)


def schedule_only(steps: int = 6) -> Any:
    """Only an lr schedule of 4 windows: on 2 ranks, one rank's columns all start late, so it
    has no column to compute at the first steps."""
    import hypergrad as hg

    (model, batches), val_loss = _data()

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(batch[0]), batch[1])

    hps = hg.HyperParams([hg.Schedule("lr", 0.1, windows=4, transform="log")])
    return hg.InnerProblem(model, train_loss, hg.optim.sgd(lr="lr", momentum=0.9), hps, batches,
                           steps, val_loss)


def streamed(steps: int = 4) -> Any:
    """The MLP trained on a shuffled DataLoader (a streamed batch source: a pass per run)."""
    import hypergrad as hg

    (model, batches), val_loss = _data()
    x, y = batches.tensors[:2]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=7,
                                         shuffle=True)
    return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           hg.optim.sgd(lr="lr"), hg.HyperParams([hg.Scalar("lr", 0.1, "log")]),
                           loader, steps, val_loss)


def lam_of(problem: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return problem.init_raw() + 0.2 * torch.randn(problem.num_hyperparams, generator=g,
                                                  dtype=torch.float64)


def hypergrads(out: Path) -> None:
    import hypergrad as hg
    from hypergrad import distributed as hd

    p, q = mixed(), schedule_only()
    lam, lq = lam_of(p), lam_of(q)
    col = hd.column_parallel()
    res: dict[str, Any] = {}
    r = col.hypergradient(p, lam)
    res["column"], res["column_state"] = r.grad, r.state.params
    res["columns_held"] = col.columns(p)
    res["column_schedule"] = col.hypergradient(q, lq).grad
    res["column_schedule_held"] = col.columns(q)
    r = hd.data_parallel(hg.ForwardMode()).hypergradient(p, lam)
    res["data_forward"], res["data_forward_state"] = r.grad, r.state.params
    r = hd.data_parallel(hg.ReverseMode()).hypergradient(p, lam)
    res["data_reverse"], res["data_reverse_state"] = r.grad, r.state.params
    r = hd.data_parallel(hg.ReverseMode(checkpoint=2)).hypergradient(p, lam)
    res["data_reverse_ckpt"] = r.grad
    torch.save(res, out / f"rank{hd.rank()}.pt")


def train(run_dir: Path, out: Path, resume: bool) -> None:
    """Without ``--resume``: an online Trainer run without a run folder (the uninterrupted
    result, ``whole<r>.pt``), then the same run writing to ``run_dir`` (the test kills rank 0 in
    its second checkpoint). With ``--resume``: that run resumed (``rank<r>.pt``)."""
    import hypergrad as hg
    from hypergrad import distributed as hd

    def fit(folder: Path | None, name: str) -> None:
        trainer = hg.Trainer(mixed(steps=8), "forward", mode=hg.Online(interval=2),
                             folder=None if folder is None else hg.RunFolder(folder,
                                                                             resume=resume),
                             callbacks=[hg.run.Progress(False)], strategy=hd.Ranks())
        res = trainer.fit()
        assert trainer.run_state is not None
        torch.save({"lam": res.lam, "history": [h["val_loss"] for h in res.history],
                    "method": repr(trainer.method),
                    "held": len(next(iter(trainer.run_state.tangents.params.values())))},
                   out / f"{name}{hd.rank()}.pt")

    if not resume:
        fit(None, "whole")
    fit(run_dir, "rank")


def hang(out: Path) -> None:
    from hypergrad import distributed as hd
    from hypergrad.errors import DistributedError

    hd.barrier("the first meeting")
    # now that both ranks are up (a short timeout from the start would also bound their start),
    # collectives wait 3 s for a peer
    from hypergrad.distributed.process import set_timeout

    set_timeout(3.0)
    if hd.rank() == 1:
        time.sleep(120)  # alive but silent: the test's launcher kills it
    t0 = time.perf_counter()
    try:
        hd.barrier("the second meeting")
    except DistributedError as err:
        (out / "rank0.txt").write_text(f"{time.perf_counter() - t0:.1f}\n{err}")
        raise


def mismatch(out: Path, what: str) -> None:
    """Rank 1 builds another problem (its data shifted, or one step more): each parallel
    method refuses on every rank (none left waiting), naming what differs."""
    import hypergrad as hg
    from hypergrad import distributed as hd

    p = streamed() if what == "pass" else mixed(
        steps=7 if what == "steps" and hd.rank() == 1 else 6)
    if what == "data" and hd.rank() == 1:
        mb = p._batch.data  # its MiniBatches
        mb.tensors = (mb.tensors[0] + 1.0, *mb.tensors[1:])
    lam = lam_of(p) + (0.05 if what == "lam" and hd.rank() == 1 else 0.0)
    if what == "pass" and hd.rank() == 0:
        p.run(lam)  # a plain run on rank 0 only (a log): it reads the next shuffled pass
    said = {}
    for name, method in (("column", hd.column_parallel()),
                         ("reverse", hd.data_parallel(hg.ReverseMode()))):
        try:
            method.hypergradient(p, lam)
            said[name] = "ran"
        except ValueError as err:
            said[name] = str(err)
    torch.save(said, out / f"rank{hd.rank()}.pt")


def settings(out: Path) -> None:
    """Rank 1 builds its Trainer with another outer learning rate: every rank refuses,
    naming it (each rank stepped its own outer optimizer: rank 0 summed hypergradients taken
    at rank 1's other points, and the run ended with exit status 0)."""
    import functools

    import hypergrad as hg
    from hypergrad import distributed as hd

    said = {}
    one = hd.rank() == 1
    # another outer learning rate; another step count (rank 1 aborted in a collective with 3
    # steps beside rank 0's 4, and with 5 after rank 0 had written a finished run)
    for what, lr, steps in (("lr", 0.1 if one else 0.05, 2), ("steps", 0.05, 3 if one else 2)):
        try:
            hg.Trainer(mixed(), "forward", functools.partial(torch.optim.Adam, lr=lr),
                       hg.Offline(outer_steps=steps), callbacks=[hg.run.Progress(False)],
                       strategy=hd.Ranks())
            said[what] = "built"
        except ValueError as err:
            said[what] = str(err)
    torch.save(said, out / f"rank{hd.rank()}.pt")


def follow(run_dir: Path, out: Path, resume: bool) -> None:
    """An offline run of 2 outer steps in ``run_dir``; with ``--resume``, 3, where only rank 0
    is given resume=True: rank 1 follows rank 0's resumed run (it started afresh beside it)."""
    import functools

    import hypergrad as hg
    from hypergrad import distributed as hd

    trainer = hg.Trainer(mixed(), "forward", functools.partial(torch.optim.Adam, lr=0.05),
                         hg.Offline(outer_steps=3 if resume else 2),
                         folder=hg.RunFolder(run_dir, resume=resume and hd.rank() == 0),
                         callbacks=[hg.run.Progress(False)], strategy=hd.Ranks())
    res = trainer.fit()
    torch.save({"lam": res.lam, "history": [h["val_loss"] for h in res.history]},
               out / f"rank{hd.rank()}.pt")


def stop(out: Path) -> None:
    """An offline run whose callback (called on rank 0 alone) stops it after outer step 1:
    every rank ends there, with rank 0's reason (``rank<r>.pt``)."""
    import hypergrad as hg
    from hypergrad import distributed as hd

    class StopAt(hg.Callback):
        def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
            if record["outer_step"] == 1:
                trainer.stop("enough")

    trainer = hg.Trainer(mixed(steps=4), "forward", mode=hg.Offline(outer_steps=4),
                         callbacks=[StopAt(), hg.run.Progress(False)], strategy=hd.Ranks())
    res = trainer.fit()
    torch.save({"steps": len(res.history), "stopped": res.stopped}, out / f"rank{hd.rank()}.pt")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    from hypergrad import distributed as hd

    case, args = sys.argv[1], sys.argv[2:]
    with hd.launch(timeout=60.0):
        if case == "hypergrads":
            hypergrads(Path(args[0]))
        elif case == "train":
            train(Path(args[0]), Path(args[1]), "--resume" in args)
        elif case == "hang":
            hang(Path(args[0]))
        elif case == "mismatch":
            mismatch(Path(args[0]), args[1])
        elif case == "settings":
            settings(Path(args[0]))
        elif case == "stop":
            stop(Path(args[0]))
        elif case == "follow":
            follow(Path(args[0]), Path(args[1]), "--resume" in args)
        else:
            raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    main()
