"""The run folder: checkpoints that survive a kill, fingerprints, a lock, and strict JSON.

- :func:`save_checkpoint` writes to a unique temporary file in the run folder, fsyncs it,
  keeps the current ``checkpoint.pt`` as ``checkpoint.prev.pt`` (a hard link, so that
  ``checkpoint.pt`` never disappears for a reader) and renames the new file into place, then
  fsyncs the folder. A kill at any moment leaves ``checkpoint.pt`` or
  ``checkpoint.prev.pt`` complete, so at most one outer step is lost. A full disk gives a clear
  ``OSError`` (errno ``ENOSPC``) and no temporary file is left behind.
- :func:`load_checkpoint` loads with ``weights_only=True``; an unreadable ``checkpoint.pt``
  (truncated, empty, garbage) is named in a :class:`~hypergrad.errors.CheckpointWarning` and
  the previous one is used; if neither is readable, a :class:`~hypergrad.errors.CheckpointError`
  names both files. A run that resumes from the previous one sets the unreadable file aside
  (:data:`UNREADABLE`), so its next checkpoint's rotation cannot move it over the previous one.
- A fingerprint (a flat ``{key: JSON-like value}``) describes what defines a run; resuming
  compares it with the checkpoint's (:func:`fingerprint_diff`).
- :class:`RunLock`: ``run.lock`` created with ``O_EXCL`` keeps two processes out of one folder;
  a lock left by a dead process (same host and pid namespace) is taken over, as is one whose
  process id a later process has (the holder's start is in the lock), this one included. A lock
  of another host or pid namespace (another container) is refused with how to recover.
- :func:`dumps`: JSON with NaN and infinities written as ``null`` (strict parsers reject the bare
  ``NaN`` tokens Python writes by default).

For tests only, the environment variable ``HYPERGRAD_TEST_CHECKPOINT_FAULT`` makes
:func:`save_checkpoint` kill its own process (SIGKILL) in the middle of a write:
``"step=3,kill-after-bytes=2048"`` (after that many bytes of the temporary file),
``"step=3,kill-before-rename"`` (temporary file complete, not yet renamed) or
``"step=3,kill-after-rotate"`` (the old checkpoint also ``checkpoint.prev.pt``, the new one
not yet in place); ``step`` is the checkpoint's ``outer_step``.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import json
import math
import os
import signal
import socket
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

from ..errors import CheckpointError, CheckpointWarning, RunDirError

__all__ = ["CHECKPOINT", "PREVIOUS", "UNREADABLE", "METRICS", "LOCK", "TRAINER_FILES",
           "RECORD_FILES", "RECORD_PATTERNS", "PLOTS", "save_checkpoint",
           "load_checkpoint", "fingerprint_diff", "digest", "json_safe", "dumps", "SEARCH_KEYS",
           "write_text_atomic", "write_bytes_atomic", "append_line", "RunLock", "used_files",
           "clear_run_dir", "write_fix"]

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
UNREADABLE = "checkpoint.unreadable.pt"
"""Where an unreadable ``checkpoint.pt`` goes when a run resumes from ``checkpoint.prev.pt``:
kept for a look, and out of the way of the next checkpoint's rotation (which would otherwise
move it over the readable previous one)."""
METRICS = "metrics.jsonl"
LOCK = "run.lock"
TRAINER_FILES = (CHECKPOINT, PREVIOUS, METRICS)
"""Files whose presence means a Trainer has already written a run into the folder."""
RECORD_FILES = ("results.json", "learned.yaml", "model_learned.pt")
"""A run's reports beside the Trainer's files (``hypergrad-run`` and
:func:`hypergrad.report.write_learned` write them): a folder holding one holds a run too."""
PLOTS = ("val_curve.png", "hyperparams.png", "schedule.png")
"""The plots of a run (:func:`hypergrad.report.plot_run`)."""
RECORD_PATTERNS = ("config_resolved*.yaml", UNREADABLE, *PLOTS, "learned_*.pt",
                   "tb/events.out.tfevents.*", "tb/learned/events.out.tfevents.*")
"""What else an overwrite removes: the resolved configs, an unreadable checkpoint set aside,
plots, per-variant models and TensorBoard's event files of the run it discards."""
_TMP_PREFIX = ".tmp-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's files are 0600
_FAULT_ENV = "HYPERGRAD_TEST_CHECKPOINT_FAULT"


# -- writing -------------------------------------------------------------------------------------
def _disk_full(err: BaseException | None) -> bool:
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def _fault(step: Any) -> dict[str, str]:
    spec = os.environ.get(_FAULT_ENV)
    if not spec:
        return {}
    parts = dict(p.partition("=")[::2] for p in spec.split(","))
    if "step" in parts and str(step) != parts["step"]:
        return {}
    return parts


def _die() -> None:  # pragma: no cover - the process ends here
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


class _Writer:
    """A file object for ``torch.save`` that remembers the OSError torch turns into a
    RuntimeError, and can kill the process after ``kill_after`` bytes (fault injection)."""

    def __init__(self, fh: Any, kill_after: int | None) -> None:
        self.fh, self.kill_after, self.written = fh, kill_after, 0
        self.error: OSError | None = None

    def write(self, b: Any) -> int:
        if self.kill_after is not None and self.written + len(b) >= self.kill_after:
            self.fh.write(bytes(b)[:max(self.kill_after - self.written, 0)])
            self.fh.flush()
            os.fsync(self.fh.fileno())
            _die()
        try:
            n = self.fh.write(b)
        except OSError as e:
            self.error = e
            raise
        self.written += len(b)
        return int(n) if n is not None else len(b)

    def flush(self) -> None:
        self.fh.flush()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _no_space(path: Path, what: str, err: BaseException) -> OSError:
    return OSError(errno.ENOSPC, f"no space left on the device of {path.parent} while writing "
                   f"{what} {path.name}: free some space (or use another run folder) and resume; "
                   f"the previous files are intact and no temporary file was left "
                   f"({type(err).__name__}: {err})")


PACKED = "__hypergrad_floats__"
"""The key of a checkpoint's packed list of floats: ``{PACKED: float64 tensor}`` stands for a
flat list of :data:`PACK_MIN` or more Python floats (a record's values of thousands of
per-example weights), which :func:`load_checkpoint` gives back as the list, bit for bit."""

PACK_MIN = 64


def _loadable(obj: Any, checked: dict[int, Any] | None = None, item: bool = False) -> Any:
    """``obj`` with NumPy numbers and arrays as Python numbers and tensors: ``torch.load`` with
    ``weights_only=True`` refuses them, so one in a record (a method's ``info``) made every
    checkpoint of the run unreadable. A flat list of :data:`PACK_MIN` or more floats is packed
    into a float64 tensor (:data:`PACKED`): pickled float by float, the records' values of
    16000 per-example weights made a checkpoint take 1.3 s after 40 outer steps, 82 % of the
    run. Containers are copied only where something changed.
    ``checked``: the records (dicts with an ``outer_step`` in a list: the history, the
    evaluations, which are only appended to) already converted by an earlier checkpoint of the
    run, by identity, with what they became, not walked again (every checkpoint walked the
    whole history: 130 ms a save after 200 outer steps at K = 300, where the first took 7)."""
    if isinstance(obj, Tensor) or type(obj) in (float, int, str, bool) or obj is None:
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, dict):
        if item and checked is not None:
            hit = checked.get(id(obj))
            if hit is not None and hit[0] is obj:
                return hit[1]
        new = {k: _loadable(v, checked) for k, v in obj.items()}
        out = obj
        if not all(new[k] is v for k, v in obj.items()):
            out = obj.copy()
            out.update(new)
        if item and checked is not None and "outer_step" in obj:
            checked[id(obj)] = (obj, out)  # held: its id is not reused while it is known
        return out
    if isinstance(obj, (list, tuple)):
        if (type(obj) is list and len(obj) >= PACK_MIN
                and all(type(v) is float for v in obj)):
            return {PACKED: torch.tensor(obj, dtype=torch.float64)}
        items = [_loadable(v, checked, item=True) for v in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _unpacked(obj: Any) -> Any:
    """:func:`_loadable`'s packed lists of floats as the lists again (the rest as it is)."""
    if isinstance(obj, dict):
        if len(obj) == 1 and PACKED in obj and isinstance(obj[PACKED], Tensor):
            return obj[PACKED].tolist()
        new = {k: _unpacked(v) for k, v in obj.items()}
        if all(new[k] is v for k, v in obj.items()):
            return obj
        out = obj.copy()
        out.update(new)
        return out
    if isinstance(obj, (list, tuple)):
        items = [_unpacked(v) for v in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return items if isinstance(obj, list) else tuple(items)
    return obj


def next_numbered(folder: Path, name: str) -> Path:
    """``folder / name.format(n)`` for the smallest ``n >= 2`` not taken: where a record that
    must not be overwritten goes (``.hydra.{}``, ``multirun.{}.yaml``)."""
    n = 2
    while (folder / name.format(n)).exists():
        n += 1
    return folder / name.format(n)


def save_checkpoint(run_dir: Path, ck: Mapping[str, Any],
                    checked: dict[int, Any] | None = None, rotate: bool = True) -> Path:
    """Write ``ck`` to ``run_dir/checkpoint.pt`` safely against kills (see the module
    docstring); the previous checkpoint becomes ``checkpoint.prev.pt`` (not where ``rotate``
    is false: the same outer step written again). Returns the path.
    ``checked``: the run's records already found loadable (:func:`_loadable`), kept by the
    caller from one checkpoint to the next."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path, prev = run_dir / CHECKPOINT, run_dir / PREVIOUS
    fault = _fault(ck.get("outer_step"))
    kill_after = int(fault["kill-after-bytes"]) if "kill-after-bytes" in fault else None
    fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX + "checkpoint-", suffix=".pt",
                                    dir=run_dir)
    tmp = Path(tmp_name)
    writer: _Writer | None = None
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _MODE)
            writer = _Writer(fh, kill_after)
            torch.save(_loadable(dict(ck), checked), writer)  # type: ignore[arg-type]
            fh.flush()
            os.fsync(fh.fileno())
        if "kill-before-rename" in fault:
            _die()
        if rotate and path.exists():
            _keep_previous(path, prev)
        if "kill-after-rotate" in fault:
            _die()
        os.replace(tmp, path)
        _fsync_dir(run_dir)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        cause = writer.error if writer is not None and writer.error is not None else err
        if _disk_full(cause):
            raise _no_space(path, "the checkpoint", cause) from err
        raise
    return path


def _keep_previous(path: Path, prev: Path) -> None:
    """``path`` becomes ``prev`` too: a hard link, so that ``path`` never disappears while the
    next file is renamed over it (a reader polling the folder, or a copy taken mid-run, found
    no checkpoint.pt in that moment: 3 of 150 copies); a rename where the file system has no
    hard links."""
    try:
        prev.unlink(missing_ok=True)
        os.link(path, prev)
    except OSError:
        os.replace(path, prev)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (readers see the old or
    the new file, never half); a full disk gives a clear ``OSError`` and no temporary file."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """:func:`write_text_atomic` for bytes (a PNG, say)."""
    fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX + path.name + "-", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _MODE)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if _disk_full(err):
            raise _no_space(path, "", err) from err
        raise


def append_line(path: Path, line: str) -> None:
    """Append one line (``metrics.jsonl``) in one write; a write that fails (a full disk)
    leaves the file as it was (no half line) and gives a clear ``OSError``."""
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, _MODE)
    try:
        size = os.fstat(fd).st_size
        try:
            n = os.write(fd, data)
            if n != len(data):  # a short write: the device is full
                raise OSError(errno.ENOSPC, "short write")
        except OSError as err:
            os.ftruncate(fd, size)
            if _disk_full(err):
                raise _no_space(path, "", err) from err
            raise
    finally:
        os.close(fd)


# -- reading -------------------------------------------------------------------------------------
def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if isinstance(err, EOFError) or (isinstance(err, OSError) and not text):
        return "the file is empty or truncated"
    if "weights_only" in str(err) or "Unpickl" in type(err).__name__:
        return "it is not a hypergrad checkpoint (garbage, or a pickle of other objects)"
    if "zip archive" in str(err) or "central directory" in str(err):
        return "the file is truncated or corrupted (not a complete zip archive)"
    if isinstance(err, OSError) and err.errno == errno.EINVAL:
        # torch.load seeking past the end of a checkpoint cut in half: "[Errno 22] Invalid
        # argument", which says nothing of the file
        return "the file is truncated or corrupted (a read past its end)"
    if isinstance(err, (KeyError, IndexError, ValueError, RuntimeError)):
        return f"the file is corrupted or not a checkpoint ({type(err).__name__}: {text[:120]})"
    return f"{type(err).__name__}: {text[:200]}"


def _read(path: Path, map_location: Any) -> dict[str, Any]:
    with warnings.catch_warnings():  # torch's own warnings about odd pickles: we give a reason
        warnings.simplefilter("ignore")
        ck = torch.load(path, weights_only=True, map_location=map_location)
    if not isinstance(ck, dict) or not {"outer_step", "lam", "history"} <= set(ck):
        raise ValueError("no hypergrad checkpoint fields (outer_step, lam, history)")
    return _unpacked(ck)  # type: ignore[no-any-return]


def load_checkpoint(run_dir: Path | str, map_location: Any = None, api: str = "Trainer"
                    ) -> tuple[dict[str, Any], Path] | None:
    """The newest readable checkpoint of ``run_dir`` and its path, ``(checkpoint, path)``;
    ``None`` when the folder has no checkpoint file at all. Falls back to
    ``checkpoint.prev.pt`` (with a :class:`CheckpointWarning` naming the unreadable file);
    raises :class:`CheckpointError` when files exist but none is readable."""
    run_dir = Path(run_dir)
    problems: list[str] = []
    found = False
    for path in (run_dir / CHECKPOINT, run_dir / PREVIOUS):
        if not path.exists():
            problems.append(f"{path} is missing")
            continue
        found = True
        try:
            ck = _read(path, map_location)
        except Exception as err:  # any failure to read means: not usable
            problems.append(f"{path} is unreadable: {_reason(err)}")
            continue
        if path.name == PREVIOUS:
            why = (f"{problems[0]} (the run was stopped while replacing it with the next "
                   f"outer step's, whose metrics line was not written yet)"
                   if problems[0].endswith("is missing") else problems[0])
            inner = ck.get("inner")
            where = (f"outer step {ck['outer_step']}, inner step {inner['run']['step']}: a "
                     f"checkpoint within its inner run"
                     if isinstance(inner, dict) and isinstance(inner.get("run"), dict)
                     and "step" in inner["run"] else f"outer step {ck['outer_step']}")
            warnings.warn(CheckpointWarning(
                f"{api}: {why}; resuming from the previous checkpoint {path} ({where}): at "
                f"most one outer step is computed again."), stacklevel=3)
        return ck, path
    if not found:
        return None
    raise CheckpointError(
        f"{api}: cannot resume from {run_dir}: no readable checkpoint "
        f"({'; '.join(problems)}). Start the run afresh with overwrite=True (hypergrad-run: "
        f"folder.overwrite=true) or use another run folder.")


# -- fingerprints --------------------------------------------------------------------------------
def _sig(x: float) -> float:
    """``x`` to 6 significant digits: equal on machines whose last bits of a sum differ."""
    return float(f"{x:.6g}") if math.isfinite(x) else x


def digest(tree: Any) -> list[Any]:
    """A compact summary of every tensor in ``tree``: shape, dtype and three sums (of the
    values, of their absolute values, of the absolute differences of neighbours: a reordering
    shows), accumulated in float64 on the tensor's device, to 6 significant digits. It tells
    data or initial weights apart (another seed, another file) without storing them."""
    out: list[Any] = []
    for x in tree_flatten(tree)[0]:
        if not isinstance(x, Tensor):
            out.append(repr(x)[:80])
            continue
        if x.layout == torch.sparse_coo:  # a preconditioner: its entries tell it apart
            c = x.detach().coalesce()
            out.append([list(x.shape), str(x.dtype).replace("torch.", ""), str(x.layout),
                        *digest([c.indices(), c.values()])])
            continue
        if x.layout != torch.strided or x.is_sparse:
            out.append([list(x.shape), str(x.dtype).replace("torch.", ""), str(x.layout)])
            continue
        v = x.detach().reshape(-1)
        if v.dtype == torch.bool or v.is_complex():
            v = v.to(torch.float64) if v.dtype == torch.bool else torch.view_as_real(v).reshape(-1)
        out.append([list(x.shape), str(x.dtype).replace("torch.", ""),
                    *(_sig(t) for t in _sums(v))])
    return out


DIGEST_CHUNK = 1 << 24
"""Entries :func:`digest` reduces at a time: its absolute values and differences are made a
chunk at a time, not as copies of the whole tensor (the training data of a problem, digested
whole since 2026-12-07, can be most of a device's memory)."""


def _sums(v: Tensor) -> tuple[float, float, float]:
    """The sum, the sum of absolute values and of absolute differences of neighbours of the
    flat ``v``, in float64, a chunk at a time."""
    f64, n = torch.float64, v.numel()
    total = absolute = steps = 0.0
    for i in range(0, max(n, 1), DIGEST_CHUNK):
        c = v[i:i + DIGEST_CHUNK]
        total += float(c.sum(dtype=f64))
        absolute += float(c.abs().sum(dtype=f64))
        e = v[i:i + DIGEST_CHUNK + 1]  # one past the chunk: the difference across its end
        steps += float((e[1:] - e[:-1]).abs().sum(dtype=f64))
    return total, absolute, steps


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


NOT_RECORDED = "<not recorded>"
ADDED_KEYS: dict[str, Any] = {"config.device": "cpu", "config.task.device": "cpu",
                              "problem.seed": NOT_RECORDED, "problem.select_loss": NOT_RECORDED,
                              "problem.bindings": NOT_RECORDED,
                              "problem.train_loss_at_start": NOT_RECORDED,
                              "problem.batch_source": NOT_RECORDED,
                              "problem.data": NOT_RECORDED,
                              "problem.dataset": NOT_RECORDED}
"""Fingerprint keys added in a later version, with the value that means what a checkpoint
written before them did: absent there, that value here is no change (a run started before
``device=`` existed resumes on the CPU; on a GPU it is refused, naming the key);
:data:`NOT_RECORDED`: what it was cannot be known, so it is not compared (the problem's seed
and ``select_loss``, in the fingerprint since 2026-11-27; what per-parameter values apply to,
since 2026-11-28; the training loss at the start, since 2026-12-06; a DataLoader's settings,
since 2026-12-07; the training data held in memory and a DataLoader's Dataset, since
2026-12-07 evening)."""


SEARCH_KEYS = "trainer.mode.search."
"""The default search's settings: a checkpoint before 2026-12-07 recorded only those that
differed from the defaults of its version, so one absent there was that version's default,
which may not be this one's: not compared (a resumed run says which it goes on with)."""


ABSENT_MEANS: dict[str, Any] = {"method": "<an exact method: forward or reverse mode>",
                                "trainer.mode.start": 0, "trainer.mode.recheck": 0}
"""What a fingerprint key's absence means, for the resume message: the exact methods record
no ``method`` key (one may resume the other), so a run of forward mode resumed with HD read
``method: '<absent>' -> 'hd'``; the offline mode records ``start`` and ``recheck`` only where
they are not 0 (``trainer.mode.start: '<absent>' -> 2``)."""


def fingerprint_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"key: old -> new"`` for every key whose value differs (missing keys count, except a
    key of :data:`ADDED_KEYS` at its earlier meaning; numbers differ by more than the rounding
    of :func:`_sig`, see :func:`_same`)."""
    out = []
    for key in sorted(set(old) | set(new)):
        missing = ABSENT_MEANS.get(key, "<absent>")
        absent = ADDED_KEYS.get(key, missing)
        if key not in old and (absent == NOT_RECORDED or key.startswith(SEARCH_KEYS)):
            continue
        # as plain JSON, as fingerprints are stored since 2026-11-27 (an earlier checkpoint's
        # inf or NumPy number compares equal to what it is stored as now)
        a = json_safe(_plain(old.get(key, absent)))
        b = json_safe(_plain(new.get(key, missing)))
        if key.startswith("config.") and _unset(a) and _unset(b):
            # a config key at null is one not given: a setting added later at its default of
            # null (multipliers, groups), or one a later version leaves out at null
            # (mode.search), refused every folder written before them ("'<absent>' -> None")
            continue
        out.extend(_differing(key, a, b))
    return out


def _unset(v: Any) -> bool:
    return v is None or (isinstance(v, str) and v == "<absent>")


def _differing(key: str, a: Any, b: Any) -> list[str]:
    """The lines of :func:`fingerprint_diff` for one key: a dict (or a list of one length)
    by its entries that differ, so that the one that differs is shown (a dict of initial
    values was cut at 60 characters before it, and both sides read alike)."""
    if _same(a, b):
        return []
    parts: list[tuple[Any, Any, Any]] = []
    if isinstance(a, dict) and isinstance(b, dict):
        parts = [(k, a.get(k, "<absent>"), b.get(k, "<absent>"))
                 for k in sorted(set(a) | set(b), key=str)]
    elif (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
          and (len(a) > 1 or isinstance(a[0], (dict, list)))):
        parts = list(zip(range(len(a)), a, b))
    if not parts:
        return [f"{key}: {_short(a)} -> {_short(b)}"]
    lines = [line for k, x, y in parts for line in _differing(f"{key}[{k}]", x, y)]
    if len(lines) <= 3:
        return lines
    return [f"{key}: {len(lines)} entries differ ({lines[0]}, ...)"]


def _same(a: Any, b: Any) -> bool:
    """``a == b`` of plain JSON values, numbers that are not both ints equal to one unit in the
    6th significant digit: a loss or a sum of the fingerprint rounded to 6 digits (:func:`_sig`)
    on two machines whose last bits differ (threads, another GPU) rounds either way."""
    num = (int, float)
    if (isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool)
            and not isinstance(b, bool) and not (isinstance(a, int) and isinstance(b, int))):
        big = max(abs(a), abs(b))
        return a == b or abs(a - b) <= 1.000001 * 10.0 ** (math.floor(math.log10(big)) - 5)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# -- JSON ----------------------------------------------------------------------------------------
def json_safe(obj: Any) -> Any:
    """``obj`` with NaN and infinities replaced by ``None`` (JSON ``null``), tensors and numpy
    numbers turned into Python numbers and lists."""
    if isinstance(obj, float):  # numpy.float64 is one: as a plain float
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        # sorted: str() of a set of strings follows the process's hash seed, and a resume in
        # another process was refused for the same set in another order (the Task probe)
        return sorted((json_safe(v) for v in obj), key=repr)
    if isinstance(obj, Tensor):
        return json_safe(obj.detach().cpu().tolist())
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays and scalars
        return json_safe(obj.tolist())
    if hasattr(obj, "value"):  # enums
        return json_safe(obj.value)
    return str(obj)


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON (``allow_nan=False``) of :func:`json_safe` ``(obj)``."""
    return json.dumps(json_safe(obj), allow_nan=False, **kw)


# -- the run folder ------------------------------------------------------------------------------
def used_files(run_dir: Path, names: Iterable[str] = TRAINER_FILES) -> list[str]:
    """Which of ``names`` exist in ``run_dir`` (an empty ``metrics.jsonl`` does not count)."""
    out = []
    for name in names:
        p = run_dir / name
        if p.exists() and not (name == METRICS and p.stat().st_size == 0):
            out.append(name)
    return out


def clear_run_dir(run_dir: Path, names: Iterable[str] = TRAINER_FILES,
                  patterns: Iterable[str] = ()) -> list[str]:
    """Remove ``names`` and files matching ``patterns`` from ``run_dir``; returns what went."""
    gone = []
    for name in names:
        p = run_dir / name
        if p.is_file():
            p.unlink()
            gone.append(name)
    for pattern in patterns:
        for p in sorted(run_dir.glob(pattern)):
            if p.is_file():
                p.unlink()
                gone.append(p.name)
    return gone


_HELD: dict[str, RunLock] = {}
"""The locks this process holds, by lock file: each belongs to one run (one RunLock object)."""


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, from ``/proc``; empty where
    unknown): a process id reused by a later process shows by another start."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[19]
    except (OSError, IndexError):
        return ""


def _pid_space() -> str:
    """This process's pid namespace (``pid:[4026531836]``; ``-`` where unknown): two containers
    may share a host name and a folder, and their process ids mean nothing to each other."""
    try:
        return os.readlink("/proc/self/ns/pid").replace(" ", "")
    except OSError:
        return "-"


class _Owner(NamedTuple):
    pid: int | None
    host: str
    age: float  # seconds since the lock was written
    start: str  # when the process started ("" where not recorded: earlier locks)
    space: str  # its pid namespace ("" where not recorded)
    text: str

    def here(self) -> bool:
        """On this host, in this pid namespace (or not recorded): its pid is one of ours."""
        return (self.host == socket.gethostname()
                and self.space in ("", "-", _pid_space()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's live process
        return True
    try:  # a zombie (killed, not yet reaped) holds nothing
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def write_fix(err: OSError) -> str:
    """What to do about a folder that cannot be written: on a read-only file system no
    permission helps (the advice was chmod u+w)."""
    if err.errno == errno.EROFS:
        return "its file system is read-only: use a folder on another one"
    return "give it write permission (chmod u+w) or use another folder"


class RunLock:
    """``run_dir/run.lock`` (pid and host inside) for the lifetime of a run. The lock belongs to
    the run that took it (this object; acquiring it again is a no-op): another run asking for
    the same folder, in another process or in this one, gets a :class:`RunDirError`. A lock
    whose process is dead (same host; a process of the lock's id but another start, or this
    process, which holds no such lock, is a later one) is taken over, and :attr:`taken_over`
    says whose it was; temporary files a killed writer left are removed then."""

    def __init__(self, run_dir: str | os.PathLike[str], who: str = "Trainer",
                 name: str = LOCK) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / name  # another name: a sweep's folder (hypergrad-run -m)
        self.who = who
        self._held = False
        self.taken_over: str = ""
        """After :meth:`acquire`: ``"process <pid> on <host>"`` when a stale lock was taken
        over, else empty."""

    @property
    def key(self) -> str:
        return str(self.path.resolve())

    @property
    def held(self) -> bool:
        return self._held

    def acquire(self) -> RunLock:
        if self._held:
            return self
        key = self.key
        if key in _HELD:
            raise RunDirError(
                f"{self.who}: run folder {self.run_dir} is in use by another run in this process "
                f"({_HELD[key].who}); a folder holds one run at a time. Let that run finish (or "
                f"close it: trainer.close()), or use another folder.")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file where the folder (or a folder above it) should be
            what = ("is a file, not a folder" if self.run_dir.is_file() else
                    f"cannot be made ({type(err).__name__}: {err.strerror or err})")
            raise RunDirError(
                f"{self.who}: the run folder {str(self.run_dir)!r} {what}; the run writes its "
                f"records there. Move the file away or name another folder.") from err
        me = (f"{os.getpid()} {socket.gethostname()} {_started(os.getpid()) or '-'} "
              f"{_pid_space()}\n")
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._take_over_stale():
                    raise self._busy() from None
                continue
            except OSError as err:  # a read-only folder: the lock is the first file written
                raise RunDirError(
                    f"{self.who}: cannot write in the run folder {self.run_dir} "
                    f"({type(err).__name__}: {err.strerror or err}); "
                    f"{write_fix(err)}.") from err
            with os.fdopen(fd, "w") as fh:
                fh.write(me)
            _HELD[key] = self
            self._held = True
            for p in self.run_dir.glob(_TMP_PREFIX + "*"):  # left by a killed writer
                p.unlink(missing_ok=True)
            return self
        raise self._busy()

    def _owner(self) -> _Owner:
        try:
            raw = self.path.read_text()
            age = time.time() - self.path.stat().st_mtime
        except OSError:
            return _Owner(None, "", 0.0, "", "", "")
        text = raw.split() + [""] * 4
        pid = int(text[0]) if text[0].isdigit() else None
        return _Owner(pid, text[1], age, text[2].strip("-"), text[3], raw)

    def _take_over_stale(self) -> bool:
        owner = self._owner()
        pid, host, start, raw = owner.pid, owner.host, owner.start, owner.text
        if pid is None:
            if owner.age < 10:  # being written by its owner right now
                return False
        elif not owner.here():  # another host or container: whether it lives cannot be seen
            return False
        elif (pid != os.getpid() and _alive(pid)
              and (not start or _started(pid) in ("", start))):
            # held by a live process: not this one (it holds no lock on the folder, acquire
            # checked: one before it with the same id left it), nor a later process that got a
            # dead holder's id (another start)
            return False
        stale = self.path.with_name(f"{self.path.name}.stale-{os.getpid()}")
        try:
            os.replace(self.path, stale)
        except FileNotFoundError:
            return True  # someone else removed it: try again
        try:
            moved = stale.read_text()
        except OSError:  # pragma: no cover - removed by hand in between
            moved = raw
        if moved != raw:  # another process took the stale lock over between the look and the
            # move: this moved its live lock; back in place (unless a third took the folder)
            try:
                os.link(stale, self.path)
            except OSError:  # pragma: no cover
                pass
            stale.unlink(missing_ok=True)
            return True  # try again: refused now
        stale.unlink(missing_ok=True)
        self.taken_over = (f"process {pid} on {host}" if pid is not None else
                           "an unreadable lock file")
        return True

    def _busy(self) -> RunDirError:
        owner = self._owner()
        pid, host = owner.pid, owner.host
        if pid is None:  # empty or unreadable: a lock another run is writing this moment
            return RunDirError(
                f"{self.who}: run folder {self.run_dir} is being locked by another run (its "
                f"lock file {self.path} is empty or unreadable, as while it is written); run "
                f"again in a moment: an unreadable lock older than a few seconds is taken "
                f"over. Or use another folder (hypergrad-run: hydra.run.dir=...).")
        here = owner.here()
        space = "" if host != socket.gethostname() else " (another container: pid namespace)"
        how = (f"if process {pid}{space} is gone (e.g. a node or container that died), delete "
               f"{self.path} and run again" if not here else
               f"wait for it to finish, or stop it (kill {pid}); a lock left by a process that "
               f"has died is taken over by the next run. If this folder is a copy of a running "
               f"run's folder, its run.lock came with the copy: delete it")
        if here and not owner.start:  # an older lock: whether pid is still its run is unknown
            how = (f"the lock records no start time (an older version wrote it), so process "
                   f"{pid} may be another program that got the run's process id: check it "
                   f"(ps -p {pid}) before stopping it, and if it is not a hypergrad run, delete "
                   f"{self.path} and run again. If this folder is a copy of a running run's "
                   f"folder, its run.lock came with the copy: delete it")
        return RunDirError(
            f"{self.who}: run folder {self.run_dir} is in use by another run (process {pid} on "
            f"{host or 'an unknown host'}, lock file {self.path}): {how}. Or use another folder "
            f"(hypergrad-run: hydra.run.dir=...; in a --multirun sweep, each job its own "
            f"hydra.sweep.subdir, such as the default ${{hydra.job.num}}).")

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        key = self.key
        if _HELD.get(key) is self:
            del _HELD[key]
        owner = self._owner()
        if owner.pid == os.getpid() and owner.here():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


@atexit.register
def _release_all() -> None:  # locks of Trainers never fitted, at interpreter exit
    for key in list(_HELD):
        p = Path(key)
        try:
            if p.read_text().split()[0] == str(os.getpid()):
                p.unlink()
        except (OSError, IndexError):
            pass
    _HELD.clear()
