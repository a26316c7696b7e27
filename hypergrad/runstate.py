"""What a Trainer's run folder holds, and when a run may continue from it.

:mod:`hypergrad.checkpoint` writes and reads files safely; this module decides what goes in
them and checks a resume:

- :func:`fingerprint`: the facts that define a run (the problem, and the Trainer's settings that
  change the result); a resume whose fingerprint differs is refused, key by key
  (:func:`check_resume`), so two runs never mix in one folder.
- :class:`RunFolder`: the lock, the refusal of a folder that already holds a run (unless the
  run resumes or overwrites it), and what is written after each outer step.
- :func:`load_outer`: the outer optimizer's state carries over; its hyperparameters (lr, ...)
  given now replace the checkpoint's.
- :func:`pack_run` / :func:`unpack_run`: the run state of any
  :class:`~hypergrad.OnlineMethod` (a NamedTuple of tensors and the step index), stored as its
  tensor leaves and restored into the structure the method itself builds at step 0, so an
  online run of ForwardMode, MARTHE or HD resumes where it stopped.
- :func:`rng_state` / :func:`set_rng_state`: torch's, Python's and numpy's generators, so a
  resumed run draws what the uninterrupted one would have.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from .checkpoint import (
    METRICS,
    TRAINER_FILES,
    RunLock,
    append_line,
    clear_run_dir,
    digest,
    dumps,
    fingerprint_diff,
    load_checkpoint,
    save_checkpoint,
    used_files,
    write_text_atomic,
)
from .choice import no_draws
from .errors import CheckpointError, CheckpointWarning, ResumeMismatchError, RunDirError
from .hyperparams import TRANSFORMS
from .method import OnlineMethod
from .problem import InnerProblem

__all__ = ["SAFE_TO_CHANGE", "fingerprint", "RunFolder", "check_resume", "load_outer",
           "pack_run", "unpack_run", "rng_state", "set_rng_state"]

SAFE_TO_CHANGE = ("outer_steps", "time_budget", "progress", "evaluate", "tensorboard",
                  "memory_budget",
                  "divergence_factor", "log", "the outer optimizer's hyperparameters (lr, ...)",
                  "the method (forward or reverse mode: the same hypergradients to rounding) "
                  "and its HVP strategy and chunking")
"""Trainer settings that may differ when a run is resumed; every other setting, and the
problem (K and layout, T, dtype, model, optimizer, initial values and state, first batch,
validation loss at the start), is in the checkpoint's fingerprint and must match. An online
run's method must keep its run state's structure (:func:`unpack_run`)."""

Log = Callable[[str], None]


def fingerprint(problem: InnerProblem, settings: Mapping[str, Any],
                extra: Mapping[str, Any]) -> dict[str, Any]:
    """What defines a run: the problem's facts, the Trainer's ``settings`` that change the result
    (``{"trainer.<name>": value}``) and ``extra`` (``hypergrad-run``: the resolved config)."""
    p, hps = problem, problem.hyperparams
    with no_draws(p), torch.no_grad():  # draws nothing from the run's generators
        s0, lam0 = p.initial_state(), p.init_raw()
        start = float(p.objective(s0.params, s0.buffers, lam0))
        first = digest(p.batch(0))
    init = {}
    for it, sl in zip(hps.items, hps.slices.values()):
        vals = TRANSFORMS[it.transform][0](lam0[sl]).tolist()
        init[it.name] = vals if len(vals) <= 16 else digest(lam0[sl])
    opt = p.optimizer
    fp: dict[str, Any] = {
        "problem.K": p.num_hyperparams,
        "problem.layout": [[it.name, it.kind, it.numel, it.transform] for it in hps.items],
        "problem.steps": p.steps,
        "problem.dtype": str(p.dtype).replace("torch.", ""),
        "problem.model": [[n, list(v.shape)] for n, v in s0.params.items()],
        "problem.optimizer": [opt.name, {k: repr(v) for k, v in sorted(opt.args.items())}],
        "problem.initial_values": init,
        "problem.initial_state": digest(s0),
        "problem.first_batch": first,
        "problem.val_loss_at_start": float(f"{start:.6g}") if math.isfinite(start) else
        repr(start),
    }
    fp.update(settings)
    fp.update(extra)
    return fp


class RunFolder:
    """A Trainer's ``run_dir``: held with ``run.lock`` while the Trainer uses it; after every
    outer step the checkpoint, then a line of ``metrics.jsonl`` (rewritten from the checkpoint
    on resume, so the two agree after a kill between them), and scalars for TensorBoard."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir)
        self.lock = RunLock(self.path).acquire()
        self.tb: Any = None

    def open(self, resume: bool, overwrite: bool, device: torch.device,
             log: Log) -> tuple[dict[str, Any], Path] | None:
        """The checkpoint to resume from (and its path), or ``None`` for a fresh run; a folder
        that holds a run is refused unless ``resume`` or ``overwrite`` (which empties it)."""
        used = used_files(self.path)
        if not used:
            if resume:
                log(f"[hypergrad] resume: no checkpoint in {self.path}, starting afresh")
            return None
        if overwrite:
            gone = clear_run_dir(self.path, TRAINER_FILES)
            log(f"[hypergrad] overwrite: removed {gone} from {self.path}")
            return None
        if not resume:
            n = 0
            if (self.path / METRICS).exists():
                n = len((self.path / METRICS).read_text().splitlines())
            raise RunDirError(
                f"Trainer: run_dir={str(self.path)!r} already holds a run ({', '.join(used)}; "
                f"{n} outer steps in {METRICS}). Pass resume=True to continue it (hypergrad-run: "
                f"trainer.resume=true), overwrite=True to discard it (trainer.overwrite=true), "
                f"or use another run_dir (hydra.run.dir=...).")
        got = load_checkpoint(self.path, device)
        if got is None:
            raise CheckpointError(
                f"Trainer: cannot resume from {self.path}: it has {', '.join(used)} but no "
                f"checkpoint. Start afresh with overwrite=True (trainer.overwrite=true).")
        return got

    def tensorboard(self) -> None:
        """Also log scalars to ``run_dir/tb``."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("Trainer: tensorboard=True needs the tensorboard package: "
                              "pip install tensorboard.") from e
        self.tb = SummaryWriter(str(self.path / "tb"))

    def write(self, ck: Mapping[str, Any], rec: Mapping[str, Any]) -> None:
        """An outer step: its checkpoint first, then its metrics line."""
        save_checkpoint(self.path, ck)
        append_line(self.path / METRICS, dumps(rec))
        if self.tb is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, rec["outer_step"])

    def rewrite_metrics(self, history: list[dict[str, Any]]) -> None:
        """``metrics.jsonl`` from ``history`` (after a resume: it agrees with the checkpoint)."""
        write_text_atomic(self.path / METRICS, "".join(dumps(rec) + "\n" for rec in history))

    def mark_stopped(self, device: torch.device, lam: Tensor, msg: str) -> None:
        """Rewrite the last checkpoint with the hyperparameters kept after a divergence (not the
        diverged ones), so a resume (e.g. with a smaller outer learning rate) starts from them."""
        got = load_checkpoint(self.path, device)
        if got is None:
            return
        ck, _ = got
        ck["lam"] = lam.detach().clone()
        ck["stopped"] = msg
        save_checkpoint(self.path, ck)


def check_resume(ck: Mapping[str, Any], path: Path, mode: str, fp: Mapping[str, Any],
                 k: int) -> None:
    """Refuse a checkpoint of another mode, another fingerprint or another K."""
    if ck.get("mode") != mode:
        raise ResumeMismatchError(
            f"Trainer: checkpoint {path} is from mode={ck.get('mode')!r}, this run is "
            f"mode={mode!r}; use another run_dir.")
    old = ck.get("fingerprint")
    if old is None:
        warnings.warn(CheckpointWarning(
            f"Trainer: checkpoint {path} was written by an older hypergrad without a "
            f"fingerprint: whether this run matches it cannot be checked."), stacklevel=4)
    else:
        diff = fingerprint_diff(old, fp)
        if diff:
            lines = "\n  ".join(diff)
            raise ResumeMismatchError(
                f"Trainer: cannot resume from {path}: this run differs from the one in the "
                f"checkpoint in what defines it (old -> new):\n  {lines}\nResume with the "
                f"original settings, or start a new run: another run_dir (hypergrad-run: "
                f"hydra.run.dir=...) or overwrite=True (trainer.overwrite=true). Settings "
                f"that may change on resume: {', '.join(SAFE_TO_CHANGE)}.")
    if ck["lam"].shape[0] != k:
        raise ResumeMismatchError(
            f"Trainer: checkpoint {path} has K={ck['lam'].shape[0]} hyperparameters, this "
            f"problem has K={k}.")


def load_outer(outer: torch.optim.Optimizer, ck: Mapping[str, Any], path: Path,
               log: Log) -> None:
    """Load the outer optimizer's state; the hyperparameters it was built with now (lr, ...)
    replace the checkpoint's, and a change is logged."""
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
    for group, new in zip(outer.param_groups, settings):
        for k, v in new.items():
            if k in group and group[k] != v:
                changed.append(f"{k} {group[k]!r} -> {v!r}")
            group[k] = v
    if changed:
        log(f"[hypergrad] resume: outer optimizer settings given now replace the "
            f"checkpoint's: {', '.join(changed)}")


# -- the run state of an online method -----------------------------------------------------------
_BY_CLASS = {"ForwardMode": "method='forward'", "MARTHE": "method='marthe'", "HD": "method='hd'"}


def pack_run(method: OnlineMethod, run: Any) -> dict[str, Any]:
    """``run`` (a NamedTuple of tensors with ``step``) as plain checkpoint fields."""
    leaves = [x for x in tree_flatten(run)[0] if isinstance(x, Tensor)]
    return {"method": type(method).__name__, "run": type(run).__name__,
            "step": int(run.step), "leaves": leaves}


def unpack_run(ck: Mapping[str, Any], method: OnlineMethod, problem: InnerProblem,
               lam: Tensor, path: Path, log: Log) -> Any:
    """The online run state stored in ``ck``, in the structure of ``method.init(problem, lam)``;
    ``None`` when ``ck`` has none. Checkpoints of version 2 (forward mode's ``"inner"``: state
    and tangents) read as ForwardMode's. A run state that does not fit ``method``'s (another
    kind of state, other tensors) is refused; one written by another method class that fits
    (ForwardMode and MARTHE) carries over, and that is logged."""
    entry = ck.get("online")
    if entry is None and "inner" in ck:
        old = ck["inner"]
        entry = {"method": "ForwardMode", "run": "ForwardState", "step": old["step"],
                 "leaves": [x for x in [*old["state"], *old["tangents"]]
                            if isinstance(x, Tensor)]}
    if entry is None:
        return None
    with no_draws(problem):
        template = method.init(problem, lam)
    leaves, spec = tree_flatten(template)
    slots = [i for i, x in enumerate(leaves) if isinstance(x, Tensor)]
    stored = list(entry["leaves"])
    why, mine = "", type(method).__name__
    if type(template).__name__ != entry["run"]:
        why = f"it is a {entry['run']}, {mine}'s is a {type(template).__name__}"
    elif len(slots) != len(stored):
        why = f"it has {len(stored)} tensors, {mine}'s {len(slots)}"
    else:
        for i, x in zip(slots, stored):
            if leaves[i].shape != x.shape or leaves[i].dtype != x.dtype:
                why = (f"a tensor of shape {list(x.shape)} ({x.dtype}) where {mine} keeps "
                       f"{list(leaves[i].shape)} ({leaves[i].dtype})")
                break
    if why:
        hint = _BY_CLASS.get(entry["method"], f"{entry['method']}()")
        raise ResumeMismatchError(
            f"Trainer: cannot resume the online run in {path} with {mine}: its run state was "
            f"written by {entry['method']} and does not fit ({why}). Resume with the original "
            f"method ({hint}), or start a new run: another run_dir (hypergrad-run: "
            f"hydra.run.dir=...) or overwrite=True (trainer.overwrite=true).")
    if entry["method"] != mine:
        log(f"[hypergrad] resume: the online run state of {entry['method']} carries over to "
            f"{mine}, whose hypergradients are used from here on")
    for i, x in zip(slots, stored):
        leaves[i] = x.to(leaves[i].device)
    return tree_unflatten(leaves, spec)._replace(step=int(entry["step"]))


# -- random generators ---------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """torch's, Python's and numpy's global generator states, as checkpoint fields."""
    np_state: Any = np.random.get_state()
    version, state, gauss = random.getstate()
    return {"torch": torch.get_rng_state(), "python": [version, list(state), gauss],
            "numpy": torch.as_tensor(np_state[1].astype(np.int64)),
            "numpy_pos": int(np_state[2])}


def set_rng_state(rng: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(rng["torch"])
    py = rng["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np.random.set_state(("MT19937", rng["numpy"].numpy().astype(np.uint32), rng["numpy_pos"],
                         0, 0.0))
