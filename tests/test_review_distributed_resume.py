"""A review of two paths of the ranks (hypergrad.distributed) no test had run, in float64 against
one process: a run killed in the middle of an inner run and resumed from its inner checkpoint
(``RunFolder(inner_every=...)``), and spectral_norm on a 2-D ``data x columns`` mesh. Both on a
2 x 2 mesh of 4 gloo processes (``Ranks(data_parallel=2)``: the gradient summed over the data
ranks, the tangent columns gathered over the column ranks of data index 0); the resume also on 2
column ranks (``Ranks()``). The ranks are started the way torchrun starts them
(``python tests/test_review_distributed_resume.py CASE RUN OUT DATA``).

Found correct (the tests keep it so): the resumed run ends where one process ends (to 1e-12),
resumes at the inner checkpoint's step, and writes each outer step's record once; a resume by
another number of processes is refused at an inner checkpoint too, naming both; the mesh keeps
spectral_norm's vectors (equal to one process to 1e-12), and data-parallel reverse mode there
refuses them.

Found wrong: data-parallel reverse mode refused spectral_norm's vectors as "BatchNorm running
statistics or batch statistics" that "each rank would normalise its shard by", advising
column_parallel(...) or GroupNorm/LayerNorm (neither applies: reverse mode splits no columns, and
the vectors follow the weights alone); it now names them and the reason, and forward mode.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad import distributed as hd
from hypergrad.errors import ResumeMismatchError

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()
KILL = (1, 3)  # (outer step, inner step): after the inner checkpoint at step 2
REFUSED = "data-parallel reverse mode cannot carry spectral_norm's vectors"


def _ranks(n: int, *args: str, timeout: float = 180.0) -> list[tuple[int | None, str]]:
    """``n`` ranks of this file with torchrun's environment; each rank's (status, output)."""
    from fixtures import run_ranks

    return run_ranks(HERE, n, *args, timeout=timeout)


def spectral_problem(steps: int = 6) -> Any:
    """tests/dist_worker.py's MLP with spectral_norm on its first layer (its vectors are state),
    batches of 7 (data-parallel shards of 4 and 3): an lr schedule of 2 windows, a momentum and
    a per-tensor weight decay (K = 7: columns 4 + 3 on the two column ranks)."""
    import dist_worker

    (_, batches), val_loss = dist_worker._data()
    torch.manual_seed(0)
    model = nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(16, 8)), nn.Tanh(),
                          nn.Linear(8, 4)).double()
    hps = hg.HyperParams([hg.Schedule("lr", 0.1, windows=2, transform="log"),
                          hg.Scalar("mom", 0.8, transform="logit"),
                          hg.PerTensor("wd", 1e-2, transform="log")])
    return hg.InnerProblem(model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           hg.optim.sgd(lr="lr", momentum="mom", weight_decay="wd"), hps,
                           batches, steps, val_loss)


def trainer(folder: Any, strategy: Any = None, callbacks: list[Any] | None = None) -> Any:
    """Offline, 2 outer steps of 6 inner steps, a checkpoint every 2 inner steps."""
    return hg.Trainer(spectral_problem(), "forward", mode=hg.Offline(outer_steps=2),
                      folder=folder, callbacks=[hg.run.Progress(False), *(callbacks or [])],
                      **({} if strategy is None else {"strategy": strategy}))


def test_data_parallel_reverse_mode_refuses_spectral_norm_for_its_own_reason() -> None:
    from hypergrad.distributed.shard import check_data_parallel

    with pytest.raises(ValueError) as err:
        check_data_parallel(spectral_problem())
    msg = str(err.value)
    assert REFUSED in msg and "once per rank" in msg, msg
    assert "data_parallel(ForwardMode()) keeps them" in msg and "method='forward'" in msg, msg
    assert "BatchNorm" not in msg and "column_parallel" not in msg, msg
    check_data_parallel(spectral_problem(), weight_state=True)  # forward mode keeps them


def _kill_and_resume(tmp_path: Path, n: int, data: int, mesh: list[int]) -> Path:
    """A Trainer run on ``n`` ranks (``Ranks(data_parallel=data)``, 0: None) killed at inner step
    3 of outer step 1 (every rank at once: a preempted job), then resumed by ``n`` ranks: it
    resumes at the inner checkpoint of step 2 and ends where one process's uninterrupted run
    ends (to 1e-12), each record written once; one process may not resume it. Returns ``out``."""
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    killed = _ranks(n, "killed", str(run), str(out), str(data))
    assert killed[0][0] == -signal.SIGKILL, killed[0][1][-3000:]
    assert all(rc not in (0, None) for rc, _ in killed), [rc for rc, _ in killed]
    ck = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ck["outer_step"] == KILL[0] and ck["inner"]["run"]["step"] == 2
    assert ck["fingerprint"]["distributed.mesh"] == mesh
    assert ck["inner"]["run"]["leaves"][-1].shape[0] == 7  # the tangents: all K columns

    # one process may not continue a mid-inner-run checkpoint of n (nor another count of ranks:
    # Ranks.check_resume, the same comparison)
    with pytest.raises(ResumeMismatchError, match=rf"written by a run of {n} processes, this "
                                                  rf"run has 1.*--nproc_per_node={n}"):
        trainer(hg.RunFolder(run, resume=True, inner_every=2), hd.Ranks())

    resumed = _ranks(n, "resume", str(run), str(out), str(data))
    for r, (rc, text) in enumerate(resumed):
        assert rc == 0, f"rank {r} ended with {rc}:\n{text[-3000:]}"
    whole = trainer(None).fit()  # one process, never killed
    for r in range(n):
        got = torch.load(out / f"resumed{r}.pt")
        assert f"data={mesh[0]}, columns={mesh[1]}" in got["method"], got["method"]
        err = float((got["lam"] - whole.lam).abs().max() / whole.lam.abs().max())
        assert err <= 1e-12, err
        assert [h["outer_step"] for h in got["history"]] == [0, 1]
        for a, b in zip(got["history"], whole.history, strict=True):
            assert abs(a["val_loss"] - b["val_loss"]) <= 1e-12 * abs(b["val_loss"])
            assert abs(a["hypergrad_norm"] - b["hypergrad_norm"]) <= 1e-12 * b["hypergrad_norm"]
        assert [e[:2] for e in got["evaluations"]] == [(e["kind"], e["outer_step"])
                                                       for e in whole.evaluations]
    msgs = torch.load(out / "resumed0.pt")["messages"]
    assert any("outer step 1: the inner run resumed at step 2 of 6" in m for m in msgs), msgs
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["outer_step"] for x in lines] == [0, 1]  # rank 0's lines, each step once
    return out


def test_mesh_resumes_mid_inner_run_as_one_process_and_keeps_spectral_norm(
        tmp_path: Path) -> None:
    """On the 2 x 2 mesh: the resume of :func:`_kill_and_resume`; forward mode's hypergradient
    with spectral_norm equals one process's and reverse mode refuses the vectors (computed by
    the same ranks before their Trainer)."""
    out = _kill_and_resume(tmp_path, 4, 2, [2, 2])
    p = spectral_problem(4)
    ref = hg.ReverseMode().hypergradient(p, p.init_raw()).grad  # one process, whole batches
    for r in range(4):
        got = torch.load(out / f"mesh{r}.pt")
        assert sorted(len(c) for c in got["held"]) == [3, 4]  # the columns split
        err = float((got["grad"] - ref).norm() / ref.norm())
        assert err <= 1e-12, err
        assert REFUSED in got["refused"], got["refused"]


def test_column_parallel_resumes_mid_inner_run_as_one_process(tmp_path: Path) -> None:
    """Two column ranks (``Ranks()``, the default split): the resume of
    :func:`_kill_and_resume`."""
    _kill_and_resume(tmp_path, 2, 0, [1, 2])


# -- the ranks ---------------------------------------------------------------------------------

class _Kill(hg.Callback):
    """SIGKILL at (outer step, inner step) ``KILL``: every rank at once, as a preempted job."""

    def on_inner_step(self, trainer: Any, step: int, total: int) -> None:
        if (trainer.outer_step, step) == KILL:
            os.kill(os.getpid(), signal.SIGKILL)


def _killed(run: Path, out: Path, data: int) -> None:
    if data:
        _mesh(out)
    trainer(hg.RunFolder(run, inner_every=2), hd.Ranks(data_parallel=data or None),
            [hg.run.Log(None), _Kill()]).fit()
    raise AssertionError("not killed")


def _mesh(out: Path) -> None:
    p = spectral_problem(4)
    mesh = hd.ParallelForward(hg.ForwardMode(), data=2, columns=2)
    grad = mesh.hypergradient(p, p.init_raw()).grad
    try:
        hd.data_parallel(hg.ReverseMode()).hypergradient(p, p.init_raw())
        refused = ""
    except ValueError as err:
        refused = str(err)
    torch.save({"grad": grad, "held": mesh.assignment(p), "refused": refused},
               out / f"mesh{hd.rank()}.pt")


def _resume(run: Path, out: Path, data: int) -> None:
    messages: list[str] = []
    tr = trainer(hg.RunFolder(run, resume=True, inner_every=2),
                 hd.Ranks(data_parallel=data or None),
                 [hg.run.Log(messages.append)])
    res = tr.fit()
    torch.save({"lam": res.lam, "method": repr(tr.method), "messages": messages,
                "history": [{k: h[k] for k in ("outer_step", "val_loss", "hypergrad_norm")}
                            for h in res.history],
                "evaluations": [(e["kind"], e["outer_step"], e["val_loss"])
                                for e in res.evaluations]},
               out / f"resumed{hd.rank()}.pt")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE.parent))
    torch.set_num_threads(1)
    case, run, out, data = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    with hd.launch(timeout=60.0):
        {"killed": _killed, "resume": _resume}[case](run, out, data)


if __name__ == "__main__":
    main()
