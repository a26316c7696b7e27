"""A review of the run's records (run folder, checkpoints, resume, callbacks, reports): what a
kill, a corrupt file, a reused process id or a float rounded on another machine could lose or
get wrong. Each test failed before its fix."""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import hypergrad as hg
import hypergrad.run.files as files
from hypergrad.errors import CheckpointWarning, ResumeMismatchError, RunDirError
from hypergrad.run import Log, Progress
from hypergrad.testing import digits_case

SMALL = dict(steps=6, n_train=24, batch_size=8, hidden=8, n_val=32)


def _trainer(folder: Any, steps: int, *extra: hg.Callback, method: Any = "forward",
             log: Any = None) -> hg.Trainer:
    return hg.Trainer(digits_case("momentum", "lr", **SMALL), method,
                      functools.partial(torch.optim.Adam, lr=0.05), hg.Offline(steps),
                      hg.Guards(), folder, [Log(log), Progress(False), *extra])


class _Killed(BaseException):
    """What the checkpoint fault's SIGKILL is in these tests: the write stops where it is."""


def _kill(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    def die() -> None:
        raise _Killed

    monkeypatch.setenv("HYPERGRAD_TEST_CHECKPOINT_FAULT", fault)
    monkeypatch.setattr(files, "_die", die)


def test_a_resume_from_the_previous_checkpoint_survives_a_kill_in_its_first_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # checkpoint.pt unreadable: the run resumes from checkpoint.prev.pt; its next checkpoint's
    # rotation moved the unreadable file over checkpoint.prev.pt, and a kill before the new one
    # was in place left no readable checkpoint: the whole run was lost (CheckpointError)
    straight = _trainer(None, 5).fit()
    _trainer(tmp_path, 3).fit()
    (tmp_path / "checkpoint.pt").write_bytes(b"garbage")
    _kill(monkeypatch, "step=3,kill-after-rotate")
    with pytest.warns(CheckpointWarning, match="checkpoint.pt is unreadable"):
        tr = _trainer(hg.RunFolder(tmp_path, resume=True), 5)
    with pytest.raises(_Killed):
        tr.fit()
    monkeypatch.delenv("HYPERGRAD_TEST_CHECKPOINT_FAULT")
    with pytest.warns(CheckpointWarning, match="checkpoint.pt is missing"):
        res = _trainer(hg.RunFolder(tmp_path, resume=True), 5).fit()
    assert torch.equal(res.lam, straight.lam)
    assert (tmp_path / "checkpoint.unreadable.pt").read_bytes() == b"garbage"
    hg.Trainer(digits_case("momentum", "lr", **SMALL), mode=hg.Offline(1),
               folder=hg.RunFolder(tmp_path, overwrite=True), callbacks=[Log(None)]).close()
    assert not (tmp_path / "checkpoint.unreadable.pt").exists()  # an overwrite removes it


def test_a_lock_of_an_earlier_process_with_this_process_id_is_taken_over(
        tmp_path: Path) -> None:
    # a restarted container's process has the id of the one killed (pid 1 again), on the same
    # host name: its own id in the lock read as a live holder, and the refusal said to kill it
    _trainer(tmp_path, 1).fit()
    (tmp_path / "run.lock").write_text(f"{os.getpid()} {socket.gethostname()}\n")
    logs: list[str] = []
    res = _trainer(hg.RunFolder(tmp_path, resume=True), 2, log=logs.append).fit()
    assert len(res.history) == 2
    assert any(f"locked by a run that died (process {os.getpid()} on" in x for x in logs), logs
    assert not (tmp_path / "run.lock").exists()


def test_a_lock_of_another_container_with_this_process_id_is_not_taken_over(
        tmp_path: Path) -> None:
    # two containers of one host name on one folder, each process pid 1: the other's lock
    # holds this process's id, but its process lives in another pid namespace
    host = socket.gethostname()
    (tmp_path / "run.lock").write_text(f"{os.getpid()} {host} 123 pid:[1]\n")
    with pytest.raises(RunDirError, match=rf"process {os.getpid()} \(another container: pid "
                                          rf"namespace\) is gone .*delete .*run.lock"):
        _trainer(tmp_path, 1)
    assert (tmp_path / "run.lock").read_text() == f"{os.getpid()} {host} 123 pid:[1]\n"


def _start(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19]


def test_a_lock_whose_process_id_a_later_process_has_is_taken_over(tmp_path: Path) -> None:
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = _start(later.pid)
        assert started
        host = socket.gethostname()
        (tmp_path / "run.lock").write_text(f"{later.pid} {host} {started}\n")  # its own lock
        with pytest.raises(RunDirError, match=rf"in use by another run \(process {later.pid}"):
            _trainer(tmp_path, 1)
        # the lock of a killed process whose id the later one got: another start
        (tmp_path / "run.lock").write_text(f"{later.pid} {host} {int(started) - 1}\n")
        tr = _trainer(tmp_path, 1)
        assert tr.folder is not None and tr.folder.lock.taken_over.startswith(
            f"process {later.pid}")
        lock = (tmp_path / "run.lock").read_text().split()
        assert lock[:3] == [str(os.getpid()), host, _start(os.getpid())]
        tr.fit()
    finally:
        later.kill()
        later.wait()


class _NumpyInfo(hg.ReverseMode):
    """A method that reports NumPy numbers about itself (as a user's solver may)."""

    def hypergradient(self, problem: hg.InnerProblem, lam: torch.Tensor) -> Any:
        out = super().hypergradient(problem, lam)
        return out._replace(info={"cond": np.float64(3.5), "iters": np.int64(4),
                                  "ok": np.bool_(True), "eigs": np.array([1.0, 2.0])})


def test_numpy_numbers_in_a_record_leave_the_checkpoints_readable(tmp_path: Path) -> None:
    # torch.load(weights_only=True) refuses NumPy objects: every checkpoint of the run was
    # unreadable, found only on resume (CheckpointError: both files 'not a hypergrad checkpoint')
    _trainer(tmp_path, 2, method=_NumpyInfo()).fit()
    res = _trainer(hg.RunFolder(tmp_path, resume=True), 3, method=_NumpyInfo()).fit()
    assert len(res.history) == 3
    info = res.history[0]["info"]
    assert info["cond"] == 3.5 and type(info["cond"]) is float and info["ok"] is True
    assert torch.equal(info["eigs"], torch.tensor([1.0, 2.0], dtype=torch.float64))


def _tb_steps(run_dir: Path, tag: str = "val_loss") -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_tensorboard_holds_one_point_per_step_after_a_resume_that_repeats_one(
        tmp_path: Path) -> None:
    # resumed from checkpoint.prev.pt, the run repeats outer step 2: TensorBoard had two points
    # at step 2 (the killed run's and the resumed run's; with another outer lr, two values)
    pytest.importorskip("tensorboard")
    _trainer(tmp_path, 3, hg.run.TensorBoard()).fit()
    assert _tb_steps(tmp_path) == [0, 1, 2]
    (tmp_path / "checkpoint.pt").write_bytes(b"garbage")
    with pytest.warns(CheckpointWarning, match="checkpoint.pt is unreadable"):
        tr = _trainer(hg.RunFolder(tmp_path, resume=True), 4, hg.run.TensorBoard())
    tr.fit()
    assert _tb_steps(tmp_path) == [0, 1, 2, 3]
    assert _tb_steps(tmp_path, "hypergrad_norm") == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [0, -1, "64", 2.5, True])
def test_tensorboard_refuses_a_bad_max_values(bad: Any) -> None:
    """max_values="64" was taken as 64, 2.5 as 2, and 0 summarised every scalar as a min,
    mean and max of one value (the callbacks probe)."""
    pytest.importorskip("tensorboard")
    with pytest.raises(ValueError, match=r"TensorBoard: max_values=.* must be an int >= 1"):
        hg.run.TensorBoard(max_values=bad)
    assert hg.run.TensorBoard(max_values=np.int64(8)).max_values == 8


@pytest.mark.parametrize("units,refused", [(1, False), (3, True)])
def test_a_fingerprint_rounded_either_way_on_another_machine_resumes(
        tmp_path: Path, units: int, refused: bool) -> None:
    # val_loss_at_start is stored to 6 significant digits: on a machine whose last bits of the
    # loss differ (threads, another GPU) it may round the other way, one unit in the 6th digit,
    # and the resume was refused ('problem.val_loss_at_start: 2.36228 -> 2.36227')
    _trainer(tmp_path, 2).fit()
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    fp = ck["fingerprint"]
    start = fp["problem.val_loss_at_start"]
    fp["problem.val_loss_at_start"] = float(f"{start + units * 1e-5:.6g}")
    init = fp["problem.initial_values"]
    init["lr"] = [v * (1 + 1e-15) for v in init["lr"]]  # exp(log(x)) in another library
    torch.save(ck, tmp_path / "checkpoint.pt")
    if refused:
        with pytest.raises(ResumeMismatchError, match=r"problem.val_loss_at_start: [\d.]+ -> "):
            _trainer(hg.RunFolder(tmp_path, resume=True), 3)
    else:
        assert len(_trainer(hg.RunFolder(tmp_path, resume=True), 3).fit().history) == 3
    assert files.fingerprint_diff({"x": [2.34568, "a"]}, {"x": [2.34567, "a"]}) == []
    assert files.fingerprint_diff({"x": 0.5, "n": 3}, {"x": 0.8, "n": 4}) == ["n: 3 -> 4",
                                                                            "x: 0.5 -> 0.8"]


def test_the_report_table_shows_every_rows_metrics() -> None:
    # the columns were the first row's keys: a metric the task's evaluate gave for the learned
    # point only was dropped without a word, one only the first row had raised KeyError (after
    # results.json, before the table and the learned values were logged), None a TypeError
    from hypergrad.report import table

    text = table([{"hyperparameters": "initial", "val_loss": 2.0, "f1": 0.25},
                  {"hyperparameters": "learned", "val_loss": 1.5, "test_acc": 0.875},
                  {"hyperparameters": "last", "val_loss": None}])
    head, initial, learned, last = text.splitlines()
    assert head.split() == ["hyperparameters", "val_loss", "f1", "test_acc"]
    assert initial.split() == ["initial", "2.0000", "0.2500", "-"]
    assert learned.split() == ["learned", "1.5000", "-", "0.8750"]
    assert last.split() == ["last", "-", "-", "-"]


def test_a_half_line_of_metrics_is_not_counted_and_a_resume_rewrites_it(tmp_path: Path) -> None:
    _trainer(tmp_path, 2).fit()
    metrics = tmp_path / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole + whole.splitlines()[-1][:30])  # a kill in the middle of a line
    with pytest.raises(RunDirError, match=r"; 2 outer steps in metrics.jsonl"):  # said 3
        _trainer(tmp_path, 3)
    res = _trainer(hg.RunFolder(tmp_path, resume=True), 3).fit()
    assert [json.loads(x) for x in metrics.read_text().splitlines()] == json.loads(
        files.dumps(res.history))


def test_two_processes_taking_over_one_stale_lock_do_not_both_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # both read the dead process's lock; the other process moved it away and made its own;
    # this one then moved the other's live lock away (deleted it) and took the folder too
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / "run.lock"
    lock.write_text(f"{dead.pid} {socket.gethostname()}\n")
    other = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from hypergrad.run.files import RunLock\n"
        "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)"),
        str(tmp_path)], stdout=subprocess.PIPE, text=True)
    alive = files._alive

    def between_look_and_move(pid: int) -> bool:  # the other process takes over right here
        if pid == dead.pid and other.stdout is not None:
            assert other.stdout.readline() == "held\n"
        return alive(pid)

    monkeypatch.setattr(files, "_alive", between_look_and_move)
    try:
        with pytest.raises(RunDirError, match=rf"in use by another run \(process {other.pid}"):
            files.RunLock(tmp_path).acquire()
        assert lock.read_text().split()[0] == str(other.pid)  # its lock is in place
    finally:
        other.kill()
        other.communicate()


def test_a_relative_run_folder_stays_where_it_was_when_the_working_folder_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a notebook makes the Trainer, then %cd elsewhere and fit(): the lock stayed in the first
    # folder (and the process could not use it again), the records went to the second,
    # unchecked for a run already there
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    tr = _trainer("run", 2)
    assert repr(tr.folder) == "RunFolder('run')"
    monkeypatch.chdir(second)
    tr.fit()
    assert sorted(p.name for p in (first / "run").iterdir()) == [
        "checkpoint.prev.pt", "checkpoint.pt", "metrics.jsonl"]
    assert not list(second.iterdir())
    monkeypatch.chdir(first)
    assert len(_trainer(hg.RunFolder("run", resume=True), 3).fit().history) == 3


def test_one_run_folder_given_to_two_trainers_is_refused(tmp_path: Path) -> None:
    # the second Trainer's open() found the lock held (by the same RunFolder object: a no-op)
    # and the folder still empty: both ran, metrics.jsonl held outer steps 0, 1, 0, 1, 2
    folder = hg.RunFolder(tmp_path)
    first = _trainer(folder, 2)
    with pytest.raises(RunDirError, match=r"in use by another Trainer.*its own RunFolder"):
        _trainer(folder, 3)
    first.fit()
    steps = [json.loads(x)["outer_step"] for x in (tmp_path / "metrics.jsonl").read_text()
             .splitlines()]
    assert steps == [0, 1]
    assert len(_trainer(hg.RunFolder(tmp_path, resume=True), 3).fit().history) == 3


def test_the_second_trainers_refusal_leaves_the_first_its_lock(tmp_path: Path) -> None:
    # the refusal above closed the folder in the second Trainer's clean-up, which released the
    # lock the first Trainer held: another process could take the folder before its fit()
    folder = hg.RunFolder(tmp_path)
    _trainer(folder, 2)
    with pytest.raises(RunDirError, match=r"in use by another Trainer"):
        _trainer(folder, 3)
    assert folder.lock.held
    other = subprocess.run(
        [sys.executable, "-c", "import sys, hypergrad as hg; from hypergrad.run.folder import "
         "RunLock; RunLock(__import__('pathlib').Path(sys.argv[1])).acquire()", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert other.returncode != 0 and "RunDirError" in other.stderr, other.stderr


def test_a_failing_callback_keeps_no_record_from_the_others_nor_hides_the_error(
        tmp_path: Path) -> None:
    # A raising at outer step 1 stopped B from getting it (TensorBoard never had that step, not
    # even after a resume), and B's on_fit_end raising on the way out replaced A's error
    class A(hg.Callback):
        def on_outer_step(self, trainer: Any, rec: dict[str, Any]) -> None:
            if rec["outer_step"] == 1:
                raise RuntimeError("A failed")

    class B(hg.Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def on_outer_step(self, trainer: Any, rec: dict[str, Any]) -> None:
            self.steps.append(rec["outer_step"])

        def on_fit_end(self, trainer: Any, result: Any) -> None:
            raise ValueError("B cleanup failed")

    b = B()
    with pytest.raises(RuntimeError, match="A failed") as got:
        _trainer(tmp_path, 3, A(), b).fit()
    assert b.steps == [0, 1]
    assert any("B.on_fit_end raised ValueError: B cleanup failed" in n
               for n in getattr(got.value, "__notes__", []))


def test_a_callback_failing_at_fit_end_loses_no_result(tmp_path: Path) -> None:
    # the fit had finished (records and checkpoint written), but the TrainResult was lost
    class Closing(hg.Callback):
        def on_fit_end(self, trainer: Any, result: Any) -> None:
            raise OSError("disk full")

    trainer = _trainer(tmp_path, 2, Closing())
    assert trainer.result is None
    with pytest.raises(OSError, match="disk full") as got:
        trainer.fit()
    assert any("trainer.result" in n for n in getattr(got.value, "__notes__", []))
    res = trainer.result
    assert res is not None and len(res.history) == 2
    assert torch.equal(res.lam, trainer.lam)


def test_a_mismatch_in_a_dict_or_list_names_the_entry_that_differs() -> None:
    """The whole dict was shown, cut at 60 characters before the entry that differed: both
    sides read alike (initial values of 'lr' and 'mom', 'mom' differing; the distributed
    probe)."""
    from hypergrad.run import files

    old = {"problem.initial_values": {"lr": [0.10000000000000002, 0.1, 0.1], "mom": [0.8]}}
    new = {"problem.initial_values": {"lr": [0.10000000000000002, 0.1, 0.1], "mom": [0.7]}}
    assert files.fingerprint_diff(old, new) == ["problem.initial_values[mom]: [0.8] -> [0.7]"]
    many = files.fingerprint_diff({"w": list(range(50))}, {"w": list(range(1, 51))})
    assert many == ["w: 50 entries differ (w[0]: 0 -> 1, ...)"]


def test_a_mode_setting_at_its_default_is_shown_as_its_value_in_a_resume_message() -> None:
    """The offline mode records start and recheck only where they are not 0: a resume that
    set start=2 read ``trainer.mode.start: '<absent>' -> 2``."""
    from hypergrad.run import files

    assert files.fingerprint_diff({"mode": "offline"}, {"mode": "offline",
                                                         "trainer.mode.start": 2}) == [
        "trainer.mode.start: 0 -> 2"]
    assert files.fingerprint_diff({"trainer.mode.recheck": 3}, {}) == [
        "trainer.mode.recheck: 3 -> 0"]


def test_ranks_check_their_reduction_when_built() -> None:
    """hypergrad-run distributed.reduction=avg ran without a word outside torchrun (checked
    only under torchrun, in the sharded method)."""
    from hypergrad.distributed import Ranks

    with pytest.raises(ValueError, match=r"Ranks: reduction='avg'; use 'mean'"):
        Ranks(reduction="avg")
    assert Ranks(reduction="sum").reduction == "sum"


def test_tensorboard_has_each_step_on_disk_before_the_next(tmp_path: Path) -> None:
    """TensorBoard's writer queued the scalars and flushed by count or every 120 s: a run
    killed after outer step 5's checkpoint had val_loss@5 but none of its hyperparameter
    scalars, and the resume (purging from step 6 on) never wrote them (the callbacks probe)."""
    pytest.importorskip("tensorboard")
    seen: list[list[int]] = []

    class Look(hg.Callback):  # after TensorBoard's own hook, as the probe's killer was
        def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
            seen.append(_tb_steps(tmp_path, "hyperparams/lr"))

    _trainer(tmp_path, 3, hg.run.TensorBoard(), Look()).fit()
    assert seen == [[0], [0, 1], [0, 1, 2]]


def test_a_callback_that_moves_lam_is_refused(tmp_path: Path) -> None:
    """A callback setting trainer.lam in on_outer_step: the step's checkpoint was written
    before it, so a run killed and resumed went on from the point before the change and ended
    elsewhere than the straight run (lr 0.158, 0.501 against 0.261, 0.378), without a word."""
    class Nudge(hg.Callback):
        def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
            with torch.no_grad():
                trainer.lam.add_(0.1)

    tr = _trainer(tmp_path, 3, Nudge())
    with pytest.raises(RuntimeError, match=r"callback Nudge.on_outer_step changed trainer.lam "
                                           r"\(restored\)"):
        tr.fit()
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.equal(ck["lam"], tr.lam)  # the checkpoint and the Trainer agree


@pytest.mark.parametrize("how", ["rebind", "inner_step", "outer_state", "steps", "fit_start",
                                 "data_fit_start", "data_inner_step", "message", "fit_end"])
def test_a_callback_that_changes_what_the_run_steps_with_is_refused(tmp_path: Path,
                                                                    how: str) -> None:
    """The callbacks probe (2026-12-07): trainer.lam rebound to a copy froze tuning (the outer
    optimizer stepped the old tensor) without a word; lam moved in on_inner_step or
    on_fit_start, the outer optimizer's state cleared, and the problem's steps changed were
    all taken, and a resumed run ended elsewhere than the straight one. And (2026-12-08):
    lam changed through .data (no version counter sees it) in on_fit_start or on_inner_step
    ran to the end at other learning rates; in on_fit_end it steered the next fit() where a
    resume would not go; in on_message the refusal named another callback."""
    class Meddle(hg.Callback):
        def on_fit_start(self, trainer: Any) -> None:
            if how == "fit_start":
                with torch.no_grad():
                    trainer.lam.add_(0.1)
            elif how == "data_fit_start":
                trainer.lam.data.fill_(-1.0)

        def on_inner_step(self, trainer: Any, step: int, steps: int) -> None:
            if how == "inner_step" and step == 2:
                with torch.no_grad():
                    trainer.lam.add_(0.1)
            elif how == "data_inner_step" and step == 2:
                trainer.lam.data.sub_(0.3)

        def on_message(self, trainer: Any, text: str) -> None:
            if how == "message" and trainer.history:
                with torch.no_grad():
                    trainer.lam.sub_(0.3)

        def on_fit_end(self, trainer: Any, result: Any) -> None:
            if how == "fit_end":
                trainer.lam.data.add_(0.5)

        def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
            if how == "rebind":
                trainer.lam = trainer.lam.detach().clone()
            elif how == "outer_state":
                trainer.outer.state.clear()
            elif how == "steps":
                trainer.problem.steps = 3

    said = {"rebind": r"on_outer_step rebound trainer.lam to another tensor \(restored\)",
            "inner_step": r"on_inner_step changed trainer.lam \(restored\)",
            "fit_start": r"on_fit_start changed trainer.lam \(restored\)",
            "data_fit_start": r"on_fit_start changed trainer.lam \(restored\)",
            "data_inner_step": r"on_inner_step changed trainer.lam \(restored\)",
            "message": r"on_message changed trainer.lam \(restored\)",
            "fit_end": r"on_fit_end changed trainer.lam \(restored\)",
            "outer_state": r"on_outer_step changed the outer optimizer's state",
            "steps": r"on_outer_step changed the problem's steps \d+ -> 3 \(restored\)"}[how]
    tr = _trainer(tmp_path, 3, Meddle())
    lam, start = tr.lam, tr.lam.detach().clone()
    with pytest.raises(RuntimeError, match=r"callback Meddle\." + said):
        tr.fit()
    assert tr.lam is lam
    if how in ("inner_step", "fit_start", "data_fit_start", "data_inner_step"):
        assert torch.equal(tr.lam, start)  # before the first outer step: restored to start


def test_a_callback_that_steps_an_outer_lr_scheduler_is_refused(tmp_path: Path) -> None:
    """An ExponentialLR on the outer Adam, stepped in on_outer_step: the step's checkpoint was
    written before it, so a resumed run went on at the lr before the change (0.1 where the
    straight run had 0.05) and ended elsewhere (lr 0.1607 against 0.1473), without a word
    (the bounds probe, 2026-12-07)."""
    class Decay(hg.Callback):
        def on_fit_start(self, trainer: Any) -> None:
            self.sched = torch.optim.lr_scheduler.ExponentialLR(trainer.outer, gamma=0.5)

        def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
            self.sched.step()

    tr = _trainer(tmp_path, 3, Decay())
    with pytest.raises(RuntimeError, match=r"callback Decay.on_outer_step changed the outer "
                                           r"optimizer's lr 0.05 -> 0.025 \(restored\)"):
        tr.fit()
    assert tr.outer.param_groups[0]["lr"] == 0.05


def test_tensorboard_files_of_a_run_resumed_in_the_same_second_read_in_order(
        tmp_path: Path) -> None:
    """TensorBoard reads event files in name order (the second, then a counter as text): a
    run resumed in the same process and second wrote ``...9`` then ``...11``, the resumed
    run's file was read first, and the earlier one's steps purged its steps (the records
    probe). The resumed run's file now starts in a later second; and the learned entry is
    the run's one (an extended run kept the earlier one beside it)."""
    pytest.importorskip("tensorboard")
    tb = tmp_path / "tb"
    tb.mkdir()
    now = int(time.time())
    (tb / f"events.out.tfevents.{now}.host.1.9").write_bytes(b"")
    _trainer(tmp_path, 1, hg.run.TensorBoard()).fit()
    stamps = [int(f.name.split(".")[3]) for f in tb.glob("events.out.tfevents.*")]
    assert len(stamps) == 2 and max(stamps) > now
    (tb / f"events.out.tfevents.{now}.host.1.9").unlink()
    _trainer(hg.RunFolder(tmp_path, resume=True), 2, hg.run.TensorBoard()).fit()
    assert _tb_steps(tmp_path) == [0, 1]
    assert len(list((tb / "learned").glob("events.out.tfevents.*"))) == 1


def test_an_empty_lock_is_refused_as_one_being_written_and_a_live_lock_names_a_copy(
        tmp_path: Path) -> None:
    """An empty lock (another run's, written this moment) was refused as held by 'process
    None on an unknown host'; a copy of a running run's folder carries its lock, and the
    refusal told the user to kill the healthy original (the live-reading probe)."""
    lock = tmp_path / "run.lock"
    lock.write_text("")
    with pytest.raises(RunDirError, match=r"is being locked by another run \(its lock file "
                                          r".* is empty or unreadable"):
        files.RunLock(tmp_path).acquire()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(f"{live.pid} {socket.gethostname()}\n")
        os.utime(lock, (time.time() - 60, time.time() - 60))
        with pytest.raises(RunDirError, match=r"If this folder is a copy of a running run's "
                                              r"folder, its run.lock came with the copy"):
            files.RunLock(tmp_path).acquire()
    finally:
        live.kill()
        live.communicate()


def test_a_checkpoint_walks_only_the_records_added_since_the_last_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every checkpoint walked the whole history for NumPy values: 130 ms a save after 200
    outer steps at K = 300, 7 ms at the first (the long-runs probe). Records found loadable
    are known by identity; a new one is still converted."""
    values = [0.5, 0.25]
    history: list[dict[str, Any]] = [{"outer_step": 0, "hyperparams": {"w": values}}]
    walked = []
    loadable = files._loadable

    def spy(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if obj is values:
            walked.append(1)
        return loadable(obj, *args, **kwargs)

    monkeypatch.setattr(files, "_loadable", spy)
    checked: dict[int, Any] = {}
    files.save_checkpoint(tmp_path, {"outer_step": 1, "history": history}, checked)
    history.append({"outer_step": 1, "val_loss": np.float64(0.5)})
    files.save_checkpoint(tmp_path, {"outer_step": 2, "history": history}, checked)
    assert len(walked) == 1  # the first record once, not again
    back = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert back["history"][1]["val_loss"] == 0.5 and type(back["history"][1]["val_loss"]) is float
    files.save_checkpoint(tmp_path, {"outer_step": 2, "history": history})  # no memory: walked
    assert len(walked) == 2
