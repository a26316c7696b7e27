"""Run folders that lose nothing (issue 23, group 5) and an initial point outside the bounds
(group 1): two runs on one folder in one process, stale and foreign locks, a refused CLI run
that leaves the folder's records (Hydra's ``.hydra/`` included) as they were, resumes that
change an approximate method's settings, a record's name taken by a folder, a folder that cannot
be written, ``~`` in a path, a full disk while appending metrics or writing a plot."""

from __future__ import annotations

import errno
import functools
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import make_trainer

import hypergrad as hg
import hypergrad.run.files as files
from hypergrad.errors import BoundsWarning, ResumeMismatchError, RunDirError
from hypergrad.testing import digits_case

SMALL = dict(steps=6, n_train=24, batch_size=8, hidden=8, n_val=32)


def _problem() -> hg.InnerProblem:
    return digits_case("momentum", "lr", **SMALL)


def test_two_runs_on_one_folder_in_one_process_are_refused(tmp_path: Path) -> None:
    first = make_trainer(_problem(), run_dir=tmp_path, outer_steps=1)
    with pytest.raises(RunDirError, match=r"in use by another run in this process \(Trainer\).*"
                                          r"trainer.close\(\)"):
        make_trainer(_problem(), run_dir=tmp_path, outer_steps=1)
    first.fit()  # the first run is not disturbed, and gives the folder back when it ends
    second = make_trainer(_problem(), run_dir=tmp_path, outer_steps=2, resume=True)
    assert second.fit().best_step is not None


def test_a_second_fit_after_another_run_wrote_the_folder_is_refused(tmp_path: Path) -> None:
    """A Trainer's second fit() took the lock back and overwrote the checkpoint another run
    had written in between (a resume of the folder), with its own older state, and appended
    outer steps recorded already: the other run's steps were lost (the folder probe)."""
    first = make_trainer(_problem(), run_dir=tmp_path, outer_steps=1)
    first.fit()
    other = make_trainer(_problem(), run_dir=tmp_path, outer_steps=3, resume=True)
    assert len(other.fit().history) == 3
    before = (tmp_path / "checkpoint.pt").read_bytes()
    with pytest.raises(RunDirError, match=r"changed since this Trainer's last fit\(\) ended .*"
                                          r"resume=True"):
        first.fit()
    assert (tmp_path / "checkpoint.pt").read_bytes() == before  # the other run's, kept
    again = make_trainer(_problem(), run_dir=tmp_path, outer_steps=4, resume=True)
    assert len(again.fit().history) == 4  # the lock was given back
    assert len(again.fit().history) == 4  # its own second fit() is not refused


def test_an_older_lock_of_a_live_process_is_not_answered_with_kill(tmp_path: Path) -> None:
    """A lock without a start time (an older version's) whose process id a live program now
    holds was answered "stop it (kill <pid>)": that killed an unrelated program (the folder
    probe). The advice is to check the process first."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "run.lock").write_text(f"{live.pid} {socket.gethostname()}\n")
        with pytest.raises(RunDirError, match=rf"records no start time .* check it \(ps -p "
                                              rf"{live.pid}\) before stopping it") as refused:
            make_trainer(_problem(), run_dir=tmp_path, outer_steps=1)
        assert "kill" not in str(refused.value)
    finally:
        live.kill()
        live.wait()


def test_a_stale_lock_is_taken_over_and_said(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "run.lock").write_text(f"{dead.pid} {socket.gethostname()}\n")
    logs: list[str] = []
    make_trainer(_problem(), run_dir=tmp_path, outer_steps=1, log=logs.append).fit()
    assert any(f"locked by a run that died (process {dead.pid} on" in x for x in logs), logs


def test_a_lock_of_another_host_says_how_to_recover(tmp_path: Path) -> None:
    (tmp_path / "run.lock").write_text("4242 some-other-node\n")
    with pytest.raises(RunDirError, match=r"process 4242 on some-other-node.*if process 4242 is "
                                          r"gone .*delete .*run.lock and run again"):
        make_trainer(_problem(), run_dir=tmp_path)
    assert (tmp_path / "run.lock").read_text() == "4242 some-other-node\n"


@pytest.mark.parametrize("first,change,key", [
    (hg.ReverseMode(truncate=3), hg.ReverseMode(truncate=4), "method.truncate: 3 -> 4"),
    (hg.MARTHE(mu=0.5), hg.MARTHE(mu=0.8), "method.mu: 0.5 -> 0.8"),
    (hg.HD(), hg.ForwardMode(), "method: 'hd' -> '<an exact method: forward or reverse mode>'"),
    (hg.FiniteDifference(eps=1e-5), hg.FiniteDifference(eps=1e-4), "method.eps: 1e-05 -> 0.0001"),
], ids=["truncate", "mu", "hd", "eps"])
def test_resume_refuses_changed_settings_of_an_approximate_method(
        first: hg.Method, change: hg.Method, key: str, tmp_path: Path) -> None:
    online = isinstance(first, hg.OnlineMethod) and not isinstance(first, hg.FiniteDifference)
    kw: dict[str, Any] = dict(mode="online", interval=3) if online else dict(outer_steps=1)
    make_trainer(_problem(), first, run_dir=tmp_path, **kw).fit()
    with pytest.raises(ResumeMismatchError, match=key.replace("(", r"\(").replace(")", r"\)")):
        make_trainer(_problem(), change, run_dir=tmp_path, resume=True, **kw)


def test_exact_methods_may_change_on_resume(tmp_path: Path) -> None:
    make_trainer(_problem(), "forward", run_dir=tmp_path, outer_steps=1).fit()
    for m in (hg.ReverseMode(), hg.ReverseMode(checkpoint="sqrt"), "auto"):
        tr = make_trainer(_problem(), m, run_dir=tmp_path, outer_steps=1, resume=True)
        tr.close()


def test_a_record_name_taken_by_a_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pt").mkdir()
    with pytest.raises(RunDirError, match=r"checkpoint.pt is a folder, where the run writes"):
        make_trainer(_problem(), run_dir=tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "run.lock").exists()


def test_a_folder_that_cannot_be_written_is_refused_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.write_bytes

    def denied(self: Path, data: bytes) -> int:
        if self.name.startswith(".tmp-probe-"):  # as in a folder without write permission
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", denied)
    with pytest.raises(RunDirError, match=r"cannot write in the run folder .*Permission denied"
                                          r".*chmod u\+w"):
        make_trainer(_problem(), run_dir=tmp_path)


def test_a_read_only_folder_is_refused_when_the_lock_is_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock is the first file a run writes: on a read-only file system (or a folder
    without write permission) it failed as the bare OSError of run.lock, and the refusal
    above was never reached (the crash-safety probe, chattr +i)."""
    import os

    real = os.open

    def read_only(path: Any, *args: Any, **kw: Any) -> int:
        if str(path).endswith("run.lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(os, "open", read_only)
    # no permission helps there: the advice was chmod u+w (the folder probe)
    with pytest.raises(RunDirError, match=r"cannot write in the run folder .*Read-only file "
                                          r"system\); its file system is read-only: use a "
                                          r"folder on another one"):
        make_trainer(_problem(), run_dir=tmp_path)


def test_an_interrupted_fit_says_how_to_resume_its_folder(tmp_path: Path) -> None:
    """Ctrl-C during Trainer.fit ended in a bare KeyboardInterrupt: now a note names the run
    folder and how to continue it, and resuming there goes on from the checkpoint."""
    class Stop(hg.Callback):
        def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
            if record["outer_step"] == 2:
                raise KeyboardInterrupt

    tr = make_trainer(_problem(), run_dir=tmp_path, outer_steps=6)
    tr.callbacks.append(Stop())
    with pytest.raises(KeyboardInterrupt) as got:
        tr.fit()
    said = "\n".join(getattr(got.value, "__notes__", []))
    assert (f"Trainer: interrupted with 3 outer steps done; the run folder {tmp_path} keeps "
            f"the last checkpoint and its records: continue with folder=hypergrad.RunFolder("
            f"{str(tmp_path)!r}, resume=True)") in said, said
    res = make_trainer(_problem(), run_dir=tmp_path, outer_steps=6, resume=True).fit()
    assert len(res.history) == 6


def test_a_run_diverging_at_its_first_outer_step_leaves_why_in_its_folder(
        tmp_path: Path) -> None:
    """The first outer step diverged (an inner learning rate of 1e9): the folder stayed
    empty, no record of why the run stopped (the CLI's results.json said it; the Python API's
    folder had nothing). Its checkpoint now holds the message and the point kept."""
    import warnings

    from test_trainer import _linear_regression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hg.errors.TuningWarning)
        res = make_trainer(_linear_regression(10, init=1e9), run_dir=tmp_path,
                           outer_steps=5).fit()
    assert res.diverged and res.message.startswith("stopped at outer step 0")
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ck["stopped"] == res.message and ck["outer_step"] == 0 and ck["history"] == []
    assert torch.equal(ck["lam"], res.lam)


def test_a_folder_given_with_a_tilde_is_the_home_folder() -> None:
    folder = hg.RunFolder("~/hypergrad-runs/x")
    assert folder.path == Path.home() / "hypergrad-runs" / "x"


def test_a_full_disk_while_appending_metrics_leaves_no_half_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "metrics.jsonl"
    files.append_line(path, '{"outer_step": 0}')
    before = path.read_bytes()
    real = os.write

    def half(fd: int, data: bytes) -> int:
        return real(fd, data[: len(data) // 2])  # the device fills up mid-line

    monkeypatch.setattr(files.os, "write", half)
    with pytest.raises(OSError, match="no space left on the device .*metrics.jsonl") as info:
        files.append_line(path, '{"outer_step": 1, "val_loss": 0.5}')
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == before  # the earlier lines intact, no half line


def test_a_full_disk_while_writing_a_plot_keeps_the_earlier_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hypergrad import report

    fig = plt.figure()
    png = tmp_path / "val_curve.png"
    report.save_figure(fig, png)
    good = png.read_bytes()
    assert good[:4] == b"\x89PNG"
    real = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="no space left on the device .*val_curve.png"):
        report.save_figure(fig, png)
    monkeypatch.setattr(files.os, "fsync", real)
    plt.close(fig)
    assert png.read_bytes() == good and not list(tmp_path.glob(".tmp-*"))


@pytest.mark.filterwarnings("ignore::hypergrad.errors.TuningWarning")  # lr=0: it never moves
def test_an_initial_value_outside_the_bounds_is_moved_and_said(tmp_path: Path) -> None:
    p = _problem()  # lr starts at 0.1 (digits_case)
    init = p.hyperparams.describe(p.init_raw())["lr"]
    # (moved inside by rounding steps: 0.0499999..., not 0.05000000000000001 above the bound)
    with pytest.warns(BoundsWarning, match=rf"lr={init} -> 0.0(5|49999).* \(bounds \[None, "
                                           rf"0.05"):
        tr = make_trainer(p, bounds={"lr": (None, 0.05)}, outer_steps=1,
                          outer=functools.partial(torch.optim.SGD, lr=0.0))
    assert p.hyperparams.describe(tr.initial_lam)["lr"] == pytest.approx(0.05)
    res = tr.fit()
    assert res.history[0]["hyperparams"]["lr"] == pytest.approx(0.05)


@pytest.mark.slow
def test_a_refused_cli_run_leaves_the_folder_records_as_they_were(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "hypergrad.cli", "experiment=ridge_diabetes", "debug=fast",
           "report.plots=false", "report.retrain=false", f"hydra.run.dir={tmp_path}"]
    assert subprocess.run(cli, env=env, capture_output=True, timeout=300).returncode == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
              and p.suffix != ".log"}
    out = subprocess.run(cli + ["seed=1"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "already holds a run" in out.stderr
    for p, data in before.items():
        assert p.read_bytes() == data, p  # .hydra/ included
    assert (tmp_path / ".hydra.2" / "overrides.yaml").read_text().count("seed=1") == 1


@pytest.mark.slow
def test_a_tilde_left_in_the_cli_run_folder_is_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "hypergrad.cli", "debug=fast",
                          "hydra.run.dir='~/hypergrad-test-run'"], cwd=tmp_path,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode != 0
    assert "'~' was not expanded" in out.stderr and "$HOME" in out.stderr
    # and the folder Hydra made is gone: a folder named '~' is one `rm -rf ~` away from the
    # home folder (the docs probe, 2026-12-07); one holding anything else stays
    assert not (tmp_path / "~").exists(), list(tmp_path.rglob("*"))
    (tmp_path / "~" / "mine").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "hypergrad.cli", "debug=fast",
                    "hydra.run.dir='~/hypergrad-test-run'"], cwd=tmp_path,
                   env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                   timeout=300)
    assert sorted(p.name for p in (tmp_path / "~").iterdir()) == ["mine"]


def test_a_checkpoint_from_before_device_existed_resumes_on_the_cpu() -> None:
    """``device=`` joined the config later: a checkpoint without it matches ``device=cpu`` (what
    every run was on before), and is refused on another device, naming the key."""
    from hypergrad.run.files import fingerprint_diff

    old = {"config.seed": 0, "config.task.steps": 12}
    new = {**old, "config.device": "cpu", "config.task.device": "cpu"}
    assert fingerprint_diff(old, new) == []
    gpu = {**old, "config.device": "cuda", "config.task.device": "cuda"}
    assert fingerprint_diff(old, gpu) == ["config.device: 'cpu' -> 'cuda'",
                                          "config.task.device: 'cpu' -> 'cuda'"]
    assert fingerprint_diff(old, {**old, "config.seed": 1}) == ["config.seed: 0 -> 1"]
    assert fingerprint_diff({}, {"config.other": 1}) == ["config.other: '<absent>' -> 1"]


def test_a_file_where_the_run_folder_should_be_is_refused_with_the_fix(tmp_path: Path) -> None:
    """A file at the folder's path (or above it) was a bare FileExistsError / NotADirectoryError
    from mkdir; now a RunDirError names it and the fix, before any work."""
    taken = tmp_path / "runs"
    taken.write_text("")
    with pytest.raises(RunDirError, match=r"run folder '.*runs' is a file, not a folder.*"
                                          r"Move the file away"):
        make_trainer(_problem(), run_dir=taken, outer_steps=1)
    with pytest.raises(RunDirError, match=r"run folder '.*runs/a' cannot be made "
                                          r"\((NotADirectoryError|FileExistsError)"):
        make_trainer(_problem(), run_dir=taken / "a", outer_steps=1)
    assert taken.read_text() == ""  # untouched


def test_long_lists_of_values_are_packed_in_a_checkpoint_and_read_back_bit_for_bit(
        tmp_path: Path) -> None:
    """A record's values of thousands of per-example weights were pickled float by float:
    at K = 16010 the checkpoints took 24.6 s of a 30 s run (40 outer steps; the last 1.3 s).
    They are a float64 tensor in the file now, and the same list of floats once loaded."""
    import struct

    odd = [0.1 * i for i in range(100)] + [float("nan"), -0.0, float("inf"), 5e-324]
    ck = {"outer_step": 1, "lam": torch.zeros(3), "history": [
        {"outer_step": 0, "hyperparams": {"w": odd, "lr": 0.1, "few": [1.0, 2.0],
                                          "mixed": [1] + [1.0] * 100}}]}
    files.save_checkpoint(tmp_path, ck)
    raw = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert set(raw["history"][0]["hyperparams"]["w"]) == {files.PACKED}
    got = files.load_checkpoint(tmp_path)
    assert got is not None
    back = got[0]["history"][0]["hyperparams"]
    assert type(back["w"]) is list and all(type(v) is float for v in back["w"])
    assert [struct.pack("<d", v) for v in back["w"]] == [struct.pack("<d", v) for v in odd]
    assert back["few"] == [1.0, 2.0] and back["mixed"] == [1] + [1.0] * 100
    assert type(back["mixed"][0]) is int and back["lr"] == 0.1
    # a folder given as a str, as configs.md's reading recipe writes it (it was a TypeError)
    again = files.load_checkpoint(str(tmp_path))
    assert again is not None and again[1] == tmp_path / "checkpoint.pt"


def test_a_resumed_run_of_many_weights_has_the_records_of_a_run_straight_through(
        tmp_path: Path) -> None:
    import torch.nn.functional as F

    from hypergrad.data import MiniBatches

    n = 120
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)

    def tl(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return (hp["w"][b[2]] * F.cross_entropy(m(b[0]), b[1], reduction="none")).mean()

    def trainer(folder: Path, steps: int, resume: bool = False) -> hg.Trainer:
        torch.manual_seed(0)
        p = hg.InnerProblem(torch.nn.Linear(4, 3).double(), tl, hg.optim.sgd(lr=0.1),
                            hg.HyperParams([hg.PerExample("w", 0.5, n=n, transform="logit")]),
                            MiniBatches(x, y, batch_size=40, seed=0), 3,
                            lambda m, hp: F.cross_entropy(m(x[:50]), y[:50]))
        return hg.Trainer(p, method="reverse", callbacks=[hg.run.Log(None)],
                          folder=hg.run.RunFolder(folder, resume=resume),
                          mode=hg.Offline(outer_steps=steps, start=0))

    straight = trainer(tmp_path / "a", 3).fit()
    trainer(tmp_path / "b", 2).fit()
    resumed = trainer(tmp_path / "b", 3, resume=True).fit()
    assert len(straight.history) == 3

    def untimed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in ("seconds", "elapsed")} for r in records]

    assert untimed(resumed.history) == untimed(straight.history)
    assert torch.equal(resumed.lam, straight.lam)
    assert [e["hyperparams"] for e in resumed.evaluations] == [
        e["hyperparams"] for e in straight.evaluations]
    raw = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert set(raw["history"][-1]["hyperparams"]["w"]) == {files.PACKED}


def test_a_checkpoint_of_a_later_format_is_refused_naming_both(tmp_path: Path) -> None:
    """A later version's checkpoint (another layout of its records: packed lists of values
    since format 5) was read as if it were this one's; refused now, with what to do."""
    from hypergrad.run.trainer import CHECKPOINT_VERSION

    make_trainer(_problem(), run_dir=tmp_path, outer_steps=1).fit()
    got = files.load_checkpoint(tmp_path)
    assert got is not None and got[0]["version"] == CHECKPOINT_VERSION
    got[0]["version"] = CHECKPOINT_VERSION + 1
    files.save_checkpoint(tmp_path, got[0])
    with pytest.raises(ResumeMismatchError, match=rf"written by a later hypergrad \(checkpoint "
                                                  rf"format {CHECKPOINT_VERSION + 1}; this one "
                                                  rf"reads formats up to {CHECKPOINT_VERSION}\)"):
        make_trainer(_problem(), run_dir=tmp_path, outer_steps=2, resume=True).fit()


def test_a_digest_of_a_large_tensor_holds_no_copy_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training data is digested whole into the fingerprint since 2026-12-07: the
    absolute values and the differences of neighbours were each a copy of the whole tensor (a
    dataset of most of a GPU's memory ran out of it at the start). A chunk at a time now, with
    the same digest."""
    from hypergrad.measure import measure

    x = torch.randn(8 * 2**20, dtype=torch.float64)  # 64 MiB
    whole = files.digest([x])
    monkeypatch.setattr(files, "DIGEST_CHUNK", 2**18)
    got, m = measure(lambda: files.digest([x]), interval=0.0005)
    assert got == whole
    assert m["peak_extra_bytes"] < 16 * 2**20, m["peak_extra_bytes"] / 2**20
