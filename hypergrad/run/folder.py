"""The run folder, one object: :class:`RunFolder` (the lock, the refusal of a folder that
already holds a run, the checkpoint and ``metrics.jsonl`` after every outer step, the resume
check). :mod:`hypergrad.run.files` writes and reads the files safely; this module decides what
goes in them and whether a run may continue from them:

- :func:`problem_fingerprint`: the facts that define a run (the problem); a resume whose
  fingerprint differs (the problem's, the Trainer parts' settings, the method's own
  :meth:`~hypergrad.Method.fingerprint`) is refused, key by key, so two runs never mix in one
  folder.
- :func:`load_outer`: the outer optimizer's state carries over; its hyperparameters (lr, ...)
  given now replace the checkpoint's.
- :func:`rng_state` / :func:`set_rng_state`: torch's, Python's and numpy's generators, so a
  resumed run draws what the uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import random
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import (
    CheckpointError,
    CheckpointWarning,
    ResumeMismatchError,
    RunDirError,
    flag,
)
from ..hyperparams import TRANSFORMS
from ..problem import InnerProblem, bitwise_equal
from .files import (
    CHECKPOINT,
    LOCK,
    METRICS,
    NOT_RECORDED,
    RECORD_FILES,
    RECORD_PATTERNS,
    SEARCH_KEYS,
    TRAINER_FILES,
    UNREADABLE,
    RunLock,
    append_line,
    clear_run_dir,
    digest,
    dumps,
    fingerprint_diff,
    json_safe,
    load_checkpoint,
    save_checkpoint,
    used_files,
    write_fix,
    write_text_atomic,
)

__all__ = ["SAFE_TO_CHANGE", "problem_fingerprint", "RunFolder", "check_resume", "load_outer",
           "rng_state", "set_rng_state"]

SAFE_TO_CHANGE = ("Offline.outer_steps", "Guards.time_budget", "Guards.clock",
                  "Guards.memory_budget", "Guards.divergence_factor", "callbacks",
                  "the task's evaluate",
                  "the outer optimizer's hyperparameters (lr, ...)",
                  "an exact method for another (forward, reverse, checkpointed reverse, auto: "
                  "the same hypergradients to rounding) and its HVP strategy and chunking")
"""Trainer settings that may differ when a run is resumed; every other setting, and the
problem (K and layout, what per-parameter values apply to, T, dtype, model, optimizer, initial
values and state, first batch, the training data where the problem holds it all
(:meth:`InnerProblem.data_tensors`), a DataLoader's settings, validation loss and training
loss (on the first batch) at the start, seed, whether it has a ``select_loss``), is in the
checkpoint's fingerprint and must match. An online run's method must keep its run state's structure
(:func:`unpack_run`)."""

Log = Callable[[str], None]

DATA_DIGESTS = 8
"""Up to this many training tensors, ``problem.data`` holds each one's :func:`digest`; more (a
list of batches), one hash of them all."""


def problem_fingerprint(problem: InnerProblem, settings: Mapping[str, Any],
                        extra: Mapping[str, Any]) -> dict[str, Any]:
    """What defines a run: the problem's facts, the Trainer's ``settings`` that change the result
    (``{"trainer.<name>": value}``) and ``extra`` (``hypergrad-run``: the resolved config)."""
    p, hps = problem, problem.hyperparams
    devices = [p.device] if p.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():  # the run's draws untouched
        s0, lam0 = p.initial_state(), p.init_raw()
        start = float(p.objective(s0.params, s0.buffers, lam0))
        first = digest(p.first_batch())
        train0, again = (float(p.train_objective(s0.params, s0.buffers, lam0, 0,
                                                 p.first_batch())[0]) for _ in range(2))
    init = {}
    for it, sl in zip(hps.items, hps.slices.values()):
        vals = TRANSFORMS[it.transform][0](lam0[sl]).tolist()
        init[it.name] = vals if len(vals) <= 16 else digest(lam0[sl])
    opt = p.optimizer
    fp: dict[str, Any] = {
        "problem.K": p.num_hyperparams,
        "problem.layout": [[it.name, it.kind, it.numel, it.transform] for it in hps.items],
        # what the values apply to: a PerTensor's params, a PerGroup's groups (same K, other
        # tensors would resume silently)
        "problem.bindings": {it.name: b for it in hps.items if (b := it.binding()) is not None},
        "problem.steps": p.steps,
        "problem.dtype": str(p.dtype).replace("torch.", ""),
        "problem.model": [[n, list(v.shape)] for n, v in s0.params.items()],
        "problem.optimizer": [opt.name, {k: repr(v) for k, v in sorted(opt.args.items())}],
        "problem.initial_values": init,
        "problem.initial_state": digest(s0),
        "problem.first_batch": first,
        "problem.val_loss_at_start": float(f"{start:.6g}") if math.isfinite(start) else
        repr(start),
        # the training loss (a label smoothing, a penalty changed) shows in neither the
        # validation loss nor the first batch
        # (randomness hypergrad does not seed, which UnseededRandomnessWarning names, gives
        # two values: not a fact of the problem then)
        "problem.train_loss_at_start": (NOT_RECORDED if train0 != again else
                                        float(f"{train0:.6g}") if math.isfinite(train0) else
                                        repr(train0)),
        "problem.seed": p.seed,  # the step's random draws, the start's and restarts' points
        "problem.select_loss": p.select_loss is not None,  # what the returned point is chosen by
    }
    if p.stream is not None:  # a DataLoader's workers, batch size, sampler: see Stream.describe
        fp["problem.batch_source"] = p.stream.describe()
        dataset = p.stream.describe_dataset()  # its code and settings: Stream.describe_dataset
        if dataset is not None:
            fp["problem.dataset"] = dataset
    data = p.data_tensors()
    if data is not None:  # all of it where it is held: the first batch missed later changes
        dig = digest(data)
        fp["problem.data"] = (dig if len(dig) <= DATA_DIGESTS else
                              hashlib.sha256(json.dumps(dig).encode()).hexdigest()[:16])
    fp.update(settings)
    # compared as JSON (a tensor value failed as "Boolean value of Tensor ... is ambiguous")
    clash = sorted(k for k in extra if k in fp and json_safe(fp[k]) != json_safe(extra[k]))
    if clash:  # a user's key replaced the library's: a T = 5 run resumed as T = 9, mixed
        raise ValueError(f"RunFolder: fingerprint keys {clash} are the library's own record of "
                         f"the problem and the Trainer; name yours otherwise (e.g. "
                         f"'task.{clash[0].split('.')[-1]}'), in Task(fingerprint=...) or "
                         f"RunFolder(fingerprint=...).")
    fp.update(extra)
    # plain JSON values only (a Path, a NumPy number of a user's fingerprint as str / float):
    # the checkpoint is read back with torch.load(weights_only=True), which refuses objects
    return json_safe(fp)  # type: ignore[no-any-return]


class RunFolder:
    """Where a run's records go, and when it may continue from them.

    Args:
        path: the folder (created if missing; ``~`` is expanded; a relative path is taken
            from the working folder when the RunFolder is made).
        resume: continue from the folder's checkpoint if there is one. The checkpoint's
            fingerprint must match this run (see :data:`SAFE_TO_CHANGE` for what may differ);
            the outer optimizer's hyperparameters given now replace the checkpoint's.
        overwrite: discard a run already in the folder (its checkpoints and metrics).
        fingerprint: extra ``{key: JSON-like value}`` that defines the run (``hypergrad-run``
            passes its resolved config), stored in the checkpoint and compared on resume.
        inner_every: also a checkpoint every this many inner steps *within* an offline outer
            step whose method the Trainer steps (forward mode, MARTHE, HD: their run state, the
            tangents included), so a hypergradient that takes hours resumes mid-run, bitwise
            equal to the uninterrupted one; ``None`` (default): after outer steps only.

    While a Trainer uses it, ``run.lock`` keeps other runs out (:meth:`open` takes it,
    :meth:`close` gives it back). After every outer step the checkpoint, then a line of
    ``metrics.jsonl`` (rewritten from the checkpoint on resume, so the two agree after a kill
    between them). A folder that already holds a run is refused unless ``resume`` or
    ``overwrite``.

    Example:
        >>> RunFolder("runs/lr", resume=True)
        RunFolder('runs/lr', resume=True)
    """

    def __init__(self, path: str | Path, resume: bool = False, overwrite: bool = False,
                 fingerprint: Mapping[str, Any] | None = None,
                 inner_every: int | None = None) -> None:
        if not isinstance(path, (str, Path)) or not str(path):
            raise TypeError(f"RunFolder: path={path!r} must be a folder path (str or Path).")
        if resume and overwrite:
            raise ValueError("RunFolder: resume=True and overwrite=True contradict each other: "
                             "resume continues the run in the folder, overwrite discards it; "
                             "pass one of them.")
        if inner_every is not None and (isinstance(inner_every, bool)
                                        or not isinstance(inner_every, numbers.Integral)
                                        or inner_every < 1):
            raise ValueError(f"RunFolder: inner_every={inner_every!r} must be an int >= 1 (inner "
                             f"steps between checkpoints within an inner run) or None.")
        self.inner_every = None if inner_every is None else int(inner_every)
        self._shown = Path(path).expanduser()
        # absolute now: a change of the working folder during the run (a notebook's %cd) put
        # the records in another folder than the lock and the check of a run already there
        self.path = self._shown.absolute()
        self.resume = flag("RunFolder", "resume", resume)
        self.overwrite = flag("RunFolder", "overwrite", overwrite)
        self.extra = dict(fingerprint or {})
        self.lock = RunLock(self.path)
        self._open = False  # a Trainer uses it (open() until close())
        # the run's records its checkpoints found loadable (files._loadable): not walked again
        self._checked: dict[int, Any] = {}
        self._left: tuple[int, int] | None | bool = False
        """The checkpoint as the lock's last release left it (:meth:`close`; its modification
        time and size, ``None`` for none), ``False`` before any release."""

    def open(self, device: torch.device, log: Log) -> tuple[dict[str, Any], Path] | None:
        """Take the lock; return the checkpoint to resume from (and its path), or ``None`` for a
        fresh run. A folder that holds a run is refused unless ``resume`` or ``overwrite``
        (which empties it)."""
        if self._open:  # one RunFolder given to two Trainers: both wrote into one folder
            raise RunDirError(
                f"Trainer: {self!r} is in use by another Trainer (it holds the folder's lock); "
                f"a folder holds one run at a time. Give each Trainer its own RunFolder (another "
                f"path), or close the other first (trainer.close()).")
        self._checked = {}
        self.lock.acquire()
        self._open = True
        try:
            return self._opened(device, log)
        except BaseException:  # refused: the lock back, so the folder can be used again
            self.close()
            raise

    def _opened(self, device: torch.device, log: Log) -> tuple[dict[str, Any], Path] | None:
        if self.lock.taken_over:
            log(f"{self.path} was locked by a run that died "
                f"({self.lock.taken_over}): its lock was taken over")
        self._check_writable()
        used = used_files(self.path, (*TRAINER_FILES, *RECORD_FILES))
        if not used:
            if self.resume:
                log(f"resume: no checkpoint in {self.path}, starting afresh")
            return None
        if self.overwrite:  # the old run's reports too: none may stay beside the new run's
            gone = clear_run_dir(self.path, (*TRAINER_FILES, *RECORD_FILES), RECORD_PATTERNS)
            log(f"overwrite: removed {gone} from {self.path}")
            return None
        if not self.resume:
            steps = ""
            if (self.path / METRICS).exists():
                # complete lines: a kill can leave half a line (a resume rewrites the file)
                n = (self.path / METRICS).read_bytes().count(b"\n")
                steps = f"; {n} outer steps in {METRICS}"
            raise RunDirError(
                f"Trainer: the run folder {str(self.path)!r} already holds a run "
                f"({', '.join(used)}{steps}). Pass RunFolder(..., "
                f"resume=True) to continue it (hypergrad-run: folder.resume=true), "
                f"overwrite=True to discard it (folder.overwrite=true), or use another folder "
                f"(hydra.run.dir=...).")
        got = load_checkpoint(self.path, device)
        if got is None:
            raise CheckpointError(
                f"Trainer: cannot resume from {self.path}: it has {', '.join(used)} but no "
                f"checkpoint. Start afresh with overwrite=True (folder.overwrite=true).")
        bad = self.path / CHECKPOINT
        if got[1].name != CHECKPOINT and bad.exists():
            # out of the next checkpoint's way: its rotation would move it over the previous
            # one, the only readable checkpoint until that write is complete
            os.replace(bad, self.path / UNREADABLE)
            log(f"the unreadable {CHECKPOINT} is kept as {UNREADABLE}")
        return got

    def _check_writable(self) -> None:
        """Refuse, before any work, a folder whose records cannot be written: a file name of a
        record taken by a folder, a folder without write permission."""
        for name in (*TRAINER_FILES, LOCK):
            if (self.path / name).is_dir():
                raise RunDirError(
                    f"Trainer: {self.path / name} is a folder, where the run writes its "
                    f"{name} file; move it away or use another run folder.")
        probe = self.path / f".tmp-probe-{os.getpid()}"
        try:
            probe.write_bytes(b"")
        except OSError as err:
            raise RunDirError(
                f"Trainer: cannot write in the run folder {self.path} ({type(err).__name__}: "
                f"{err.strerror or err}); {write_fix(err)}.") from err
        probe.unlink(missing_ok=True)

    def write(self, ck: Mapping[str, Any], rec: Mapping[str, Any]) -> None:
        """An outer step: its checkpoint first, then its metrics line."""
        save_checkpoint(self.path, ck, self._checked)
        append_line(self.path / METRICS, dumps(rec))

    def write_inner(self, ck: Mapping[str, Any]) -> None:
        """A checkpoint within an inner run (``inner_every``): no metrics line."""
        save_checkpoint(self.path, ck, self._checked)

    def rewrite_metrics(self, history: list[dict[str, Any]]) -> None:
        """``metrics.jsonl`` from ``history`` (after a resume: it agrees with the checkpoint)."""
        write_text_atomic(self.path / METRICS, "".join(dumps(rec) + "\n" for rec in history))

    def mark_stopped(self, device: torch.device, lam: Tensor, msg: str,
                     first: Mapping[str, Any] | None = None,
                     gradless: list[Any] | None = None) -> None:
        """Rewrite the last checkpoint with the hyperparameters kept after a divergence (not the
        diverged ones), so a resume (e.g. with a smaller outer learning rate) starts from them,
        with the outer optimizer's state forgotten, as a backtrack does (its moments and step
        sizes belong to the steps undone: SignDescent's kept the step of 8 that diverged, and a
        resume with lr=0.2 took it again). Where the run diverged before its first checkpoint,
        ``first`` (the Trainer's state) is written instead: the folder stayed empty, with no
        record of why the run stopped. ``gradless``: the points without a finite hypergradient
        (:attr:`Tracker.gradless <hypergrad.run.guards.Tracker.gradless>`), as of now."""
        got = load_checkpoint(self.path, device)
        if got is not None:
            ck = got[0]
        elif first is not None:
            ck = dict(first)
        else:
            return
        ck["lam"] = lam.detach().clone()
        ck["stopped"] = msg
        if gradless is not None:  # the tracker's, with the point where the run stopped: a
            # resume knew nothing of it when it was the best evaluated (no hypergradient)
            ck["gradless"] = gradless
        if isinstance(ck.get("outer"), dict) and isinstance(ck["outer"].get("state"), dict):
            ck["outer"]["state"] = {}
        save_checkpoint(self.path, ck)

    def note_elapsed(self, device: torch.device, elapsed: float) -> None:
        """Keep the run's seconds at the end of a fit (after its final evaluation, which
        comes after the last checkpoint) in that checkpoint, for a resume's clock."""
        path = self.path / CHECKPOINT
        try:
            ck = torch.load(path, map_location=device, weights_only=True)
            ck["elapsed_done"] = float(elapsed)
            # the same outer step: checkpoint.prev.pt stays the step before, for a fallback
            save_checkpoint(self.path, ck, self._checked, rotate=False)
        except Exception:  # noqa: BLE001 - a clock's nicety: the run and its records stand
            return

    def close(self) -> None:
        """Give the lock back, noting the checkpoint as it leaves it (:meth:`reacquire`)."""
        self._open = False
        if self.lock.held:
            self._left = self._checkpoint_mark()
        self.lock.release()

    def reacquire(self) -> None:
        """Take the lock again for another ``fit()`` of the Trainer that gave it back; refused
        where the checkpoint changed meanwhile: another process resumed the run between the
        two calls, and the second call overwrote its checkpoint with this Trainer's older
        state and appended steps it had already recorded (its outer steps lost; the folder
        probe, 2026-12-07 evening)."""
        self.lock.acquire()
        if self._left is not False and self._checkpoint_mark() != self._left:
            self.lock.release()
            raise RunDirError(
                f"Trainer: the run folder {self.path} changed since this Trainer's last fit() "
                f"ended (its {CHECKPOINT} was written by another run meanwhile); going on "
                f"would overwrite that run's steps with this Trainer's older state. Build a new "
                f"Trainer with RunFolder({str(self._shown)!r}, resume=True) to go on from what "
                f"the folder holds, or use another folder.")

    def _checkpoint_mark(self) -> tuple[int, int] | None:
        try:
            st = (self.path / CHECKPOINT).stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def __repr__(self) -> str:
        flags = "".join(f", {k}=True" for k in ("resume", "overwrite") if getattr(self, k))
        if self.inner_every is not None:
            flags += f", inner_every={self.inner_every}"
        return f"RunFolder({str(self._shown)!r}{flags})"


def check_resume(ck: Mapping[str, Any], path: Path, fp: Mapping[str, Any], k: int,
                 searching: bool = False) -> None:
    """Refuse a checkpoint of another fingerprint or another K, in at most ten lines: the
    differing keys (old -> new) and where the original run's settings are. ``searching``: the
    run uses the default search's settings (a :class:`~hypergrad.run.outer.SearchOptimizer`
    offline): a checkpoint that did not record them all is said."""
    old = ck.get("fingerprint")
    if not old:  # None: before fingerprints; {}: a Trainer without a folder before 2026-12-07
        warnings.warn(CheckpointWarning(
            f"Trainer: checkpoint {path} was written by an older hypergrad without a "
            f"fingerprint: whether this run matches it cannot be checked."), stacklevel=4)
        old = None
    else:
        diff = fingerprint_diff(old, fp)
        if diff:
            shown = diff[:6] + ([f"... and {len(diff) - 6} more"] if len(diff) > 6 else [])
            lines = "\n  ".join(shown)
            folder = path.parent
            # config_resolved.yaml is the run's own (rewritten by an overwrite's new run);
            # .hydra/ is the folder's first invocation's, which an overwrite discarded
            resolved = folder / "config_resolved.yaml"
            where = (f"The original run's settings: {resolved} (each invocation's command "
                     f"line: .hydra*/overrides.yaml). " if path.is_file() and resolved.exists()
                     else "")  # (a state given in memory has no folder)
            raise ResumeMismatchError(
                f"Trainer: cannot resume from {path}: this run differs from the one in the "
                f"checkpoint (old -> new):\n  {lines}\n{where}Resume with the original "
                f"settings, or start a new run: another folder (hydra.run.dir=...) or "
                f"overwrite=True (folder.overwrite=true); docs/troubleshooting.md lists what may "
                f"change on resume.")
    unknown = [key.removeprefix(SEARCH_KEYS) for key in fp
               if key.startswith(SEARCH_KEYS) and old is not None and key not in old]
    if unknown and searching:
        now = ", ".join(f"{key}={fp[SEARCH_KEYS + key]!r}" for key in unknown)
        warnings.warn(CheckpointWarning(
            f"Trainer: checkpoint {path} was written by an earlier hypergrad, which recorded "
            f"only the search settings it changed: the run goes on with this version's "
            f"{now}, which may not be those it began with (before 2026-11-29: one batch "
            f"order per hypergradient, two_orders=0; the re-check by the mean, "
            f"recheck_pick='mean'; rough_plain=False). Offline.default(search={{...}}) "
            f"sets them (hypergrad-run: mode.search.<name>=...)."), stacklevel=4)
    if ck["lam"].shape[0] != k:
        raise ResumeMismatchError(
            f"Trainer: checkpoint {path} has K={ck['lam'].shape[0]} hyperparameters, this "
            f"problem has K={k}.")


STATE_SHAPING = ("amsgrad", "centered")
"""Outer optimizer settings that decide what state torch keeps (Adam's ``max_exp_avg_sq``,
RMSprop's ``grad_avg``): switched on or off, a resume is refused."""


def load_outer(outer: torch.optim.Optimizer, ck: Mapping[str, Any], path: Path,
               log: Log) -> None:
    """Load the outer optimizer's state; the hyperparameters it was built with now (lr, ...)
    replace the checkpoint's where they differ from those it was built with then
    (``outer_given``), and a change is logged. One given alike keeps the checkpoint's value: a
    learning rate the run halved on a backtrack stays halved (it was put back, and the resumed
    run differed from an uninterrupted one)."""
    name = type(outer).__name__
    cls = ck.get("outer_class", name)
    if cls != name:
        raise ResumeMismatchError(
            f"Trainer: checkpoint {path} was written with outer optimizer {cls}, this run "
            f"uses {name}; its state cannot carry over. Resume with {cls}, or start a new run.")
    settings = [{k: v for k, v in g.items() if k != "params"} for g in outer.param_groups]
    try:
        outer.load_state_dict(ck["outer"])
    except (KeyError, ValueError, IndexError, TypeError, RuntimeError) as e:
        raise ResumeMismatchError(
            f"Trainer: the outer optimizer state in {path} does not fit {name} "
            f"({type(e).__name__}: {e}); resume with the outer optimizer of the original run, "
            f"or start a new run.") from e
    changed = []
    then = ck.get("outer_given") or []
    for i, (group, new) in enumerate(zip(outer.param_groups, settings)):
        given = then[i] if i < len(then) else {}
        for k, v in new.items():
            if k in given and bitwise_equal(given[k], v):
                continue  # not changed since: the run's own value (a halved lr) carries over
            if k in group and not bitwise_equal(group[k], v):
                if k in STATE_SHAPING and bool(v) != bool(group[k]):
                    # the saved state has no slot for it: torch's next step failed with a
                    # bare KeyError: 'max_exp_avg_sq' (the outer-loop probe)
                    raise ResumeMismatchError(
                        f"Trainer: checkpoint {path} was written with the outer optimizer's "
                        f"{k}={group[k]!r}, this run gives {k}={v!r}: {name} keeps other state "
                        f"with it, so the saved state cannot carry over. Resume with "
                        f"{k}={group[k]!r}, or start a new run.")
                changed.append(f"{k} {group[k]!r} -> {v!r}")
            group[k] = v
    now = getattr(outer, "resume_settings", None)
    was = ck.get("outer_settings")
    if callable(now) and isinstance(was, Mapping):
        for k, v in now().items():
            if k not in was or bitwise_equal(was[k], v):
                continue
            if k == "seed":
                changed.append(f"seed {was[k]!r} -> {v!r} (not used: the checkpoint's "
                               f"candidate generator goes on; a seed starts a run)")
            elif isinstance(v, Tensor) or isinstance(was[k], Tensor):
                changed.append(f"{k} (another tensor given)")
            else:
                changed.append(f"{k} {was[k]!r} -> {v!r}")
    if changed:
        log(f"resume: outer optimizer settings given now replace the "
            f"checkpoint's: {', '.join(changed)}")


# -- random generators ---------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """torch's, Python's and numpy's global generator states, as checkpoint fields."""
    np_state: Any = np.random.get_state()
    version, state, gauss = random.getstate()
    out: dict[str, Any] = {"torch": torch.get_rng_state(),
                           "python": [version, list(state), gauss],
                           "numpy": torch.as_tensor(np_state[1].astype(np.int64)),
                           "numpy_pos": int(np_state[2])}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()  # dropout on a GPU draws from these
    return out


def set_rng_state(rng: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned. The states go back as CPU byte tensors, whatever
    ``map_location`` the checkpoint was read with (torch's setters accept nothing else)."""
    torch.set_rng_state(rng["torch"].cpu().to(torch.uint8))
    cuda = rng.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu().to(torch.uint8) for s in cuda])
    py = rng["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np.random.set_state(("MT19937", rng["numpy"].cpu().numpy().astype(np.uint32), rng["numpy_pos"],
                         0, 0.0))
