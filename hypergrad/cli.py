"""``hypergrad-run``: the Hydra application (``version_base="1.3"``).

    hypergrad-run experiment=digits_schedule
    hypergrad-run experiment=hypercleaning method=reverse
    hypergrad-run --multirun experiment=digits_schedule seed=0,1,2 hydra/launcher=joblib

Each run writes to its Hydra run directory: the resolved config (``config_resolved.yaml``; a
resumed run adds ``config_resolved.resume-<n>.yaml``), ``metrics.jsonl`` (one line per outer
step), ``checkpoint.pt`` and ``checkpoint.prev.pt`` (resume with ``folder.resume=true
hydra.run.dir=<that dir>``), ``results.json`` and PNG plots. JSON files are strict: NaN and
infinities are written as ``null``. A folder that already holds a run is refused unless
``folder.resume=true`` or ``folder.overwrite=true``.

Your own task, method or optimizer: a module in the folder you run from (or an installed
package) named by ``_target_`` (``task._target_=my_task.build``); the folder you run from is on
the import path, as for ``python -m``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, InstantiationException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from . import distributed
from .config import CONFIG_DIR, build, check_keys, global_groups, register_configs
from .errors import (
    BoundsWarning,
    CheckpointError,
    ConfigError,
    ConfigWarning,
    DistributedError,
    HypergradWarning,
    MemoryBudgetError,
    RanksMismatchError,
    ResumeMismatchError,
    RunDirError,
    TuningWarning,
    raised_in_hypergrad,
)
from .run import RunFolder
from .run.trainer import NOT_TUNED
from .task import ONLINE_ROW

if TYPE_CHECKING:
    import torch

    from .problem import InnerProblem
    from .task import Task

log = logging.getLogger("hypergrad")
register_configs()


def _prepare_run_dir(folder: RunFolder) -> None:
    """Refuse a folder that holds a run unless resuming or overwriting (Hydra's own ``.hydra/``
    and log file do not count); an overwrite's removal waits until the new run's settings
    have been built (:func:`_overwrite`)."""
    from .errors import RunDirError
    from .run.files import RECORD_FILES, TRAINER_FILES, used_files

    path = folder.path.resolve()
    sweep, job = _sweep_job() if _multirun() else (None, None)
    other_job = _earlier_job(path, sweep, job)
    if path in _SWEEP_FOLDERS or other_job is not None:
        # an earlier job of this sweep's: overwrite or resume is wrong (the set: the basic
        # launcher's jobs, one process; the marker: a joblib or cluster launcher's, each job a
        # process of its own, where job 1 deleted job 0's finished run)
        which = f"job {other_job}" if other_job is not None else "an earlier job"
        raise RunDirError(
            f"hypergrad-run: this job of the sweep would write into {folder.path}, where "
            f"{which} of the same sweep wrote its run (hydra.sweep.subdir names one folder "
            f"for both). Give each job its own folder: hydra.sweep.subdir=${{hydra.job.num}} "
            f"(the default).")
    used = used_files(folder.path, (*TRAINER_FILES, *RECORD_FILES))
    if used and folder.resume and _multirun():
        _check_resumed_job(path)
    if used and not folder.resume and not folder.overwrite:
        other = ("hydra.sweep.dir=... or hydra.sweep.subdir=..." if _multirun()
                 else "hydra.run.dir=...")
        raise RunDirError(
            f"hypergrad-run: the run folder {folder.path} already holds a run "
            f"({', '.join(used)}). Continue it with folder.resume=true, discard it with "
            f"folder.overwrite=true, or choose another folder with {other}")
    if _multirun():
        _SWEEP_FOLDERS.add(path)
        if sweep is not None:
            from .run.files import write_text_atomic

            folder.path.mkdir(parents=True, exist_ok=True)
            write_text_atomic(folder.path / SWEEP_JOB, json.dumps(
                {"sweep": sweep, "job": job, "overrides": _job_overrides()}) + "\n")


SWEEP_ID = ".hypergrad_sweep"
"""In a ``--multirun`` sweep's folder: this invocation's id, written by :class:`KeepSweepRecord`
when the sweep starts (a sweep run again into the folder writes a new one)."""

SWEEP_JOB = ".hypergrad_sweep_job"
"""In a sweep job's run folder: ``{"sweep": id, "job": number}`` of the job that ran there, so a
later job of the same sweep (in any process) is refused the folder."""


def _sweep_folder(h: Any) -> Path:
    """The sweep's folder (``hydra.sweep.dir``) from a job: a relative one is relative to the
    folder the command ran in (``hydra.runtime.cwd``), where the sweep made it, not to the job's
    working directory (with ``hydra.job.chdir=true``, its run folder: the job lines and the
    sweep id were looked for there, so no summary was written and two jobs could share a
    folder)."""
    folder = Path(str(h.sweep.dir))
    return folder if folder.is_absolute() else Path(str(h.runtime.cwd)) / folder


def _sweep_job() -> tuple[str | None, int | None]:
    """This ``--multirun`` job's sweep id (``None`` where the sweep wrote none: a config without
    :class:`KeepSweepRecord`) and job number."""
    h = HydraConfig.get()
    with contextlib.suppress(OSError):
        return (_sweep_folder(h).joinpath(SWEEP_ID).read_text().strip() or None,
                int(h.job.num))
    return None, int(h.job.num)


def _job_overrides() -> dict[str, str]:
    """This job's overrides by key (the command line's and the sweeper's values), but the
    ``folder.*`` ones (how the folder is used, not what runs in it)."""
    pairs = (str(o).partition("=") for o in HydraConfig.get().overrides.task)
    return {k.lstrip("+~"): v for k, _, v in pairs if not k.lstrip("+~").startswith("folder.")}


def _check_resumed_job(path: Path) -> None:
    """Refuse to resume a sweep job's run made with other values than this job's: a sweep run
    again proposes its own values (Optuna's sampler new ones, a changed grid other ones), and
    job N resumed folder N's run whatever it was made with: a finished run returned its old
    loss, recorded under the new values, and an interrupted one finished under them (the
    Optuna probe: trial 6 stored lr=0.0123 -> trial 3's loss at lr=0.0748)."""
    try:
        mark = json.loads((path / SWEEP_JOB).read_text())
    except (OSError, ValueError):
        return
    before = mark.get("overrides") if isinstance(mark, dict) else None
    if not isinstance(before, dict):
        return
    now = _job_overrides()
    differ = [f"{k}: {before.get(k, '<not given>')} -> {now.get(k, '<not given>')}"
              for k in sorted(set(before) | set(now))
              if before.get(k) != now.get(k) and not _may_change(k, before.get(k), now.get(k))]
    if differ:
        raise RunDirError(
            f"hypergrad-run: folder.resume=true in a sweep, but {path} holds the run of job "
            f"{mark.get('job')} made with other values than this job's ({'; '.join(differ[:4])}"
            f"{' ...' if len(differ) > 4 else ''}): resumed, its result would be recorded "
            f"under this job's values. A sweep run again proposes values of its own (an "
            f"Optuna sweeper new ones; its study continues from its storage and study_name, "
            f"not from the job folders): resume a sweep only with the same settings and "
            f"grid; otherwise run it into a new hydra.sweep.dir, or rerun the jobs afresh with "
            f"folder.overwrite=true.")


RESUME_MAY_CHANGE = ("report.", "callbacks.")
"""Overrides a sweep's job may change on a resume (:func:`_check_resumed_job`): what is
reported and logged, not what is tuned; ``mode.outer_steps`` too where it grows (the run goes
on, as a single run's resume does; the sweep probe: extending a sweep's runs was refused)."""


def _may_change(key: str, before: str | None, now: str | None) -> bool:
    """Whether a resumed sweep job's override ``key`` may go from ``before`` to ``now``."""
    if key.startswith(RESUME_MAY_CHANGE):
        return True
    if key == "mode.outer_steps" and before is not None and now is not None:
        try:
            return int(now) >= int(before)
        except ValueError:
            return False
    return False


def _earlier_job(path: Path, sweep: str | None, job: int | None) -> int | None:
    """The number of another job of sweep ``sweep`` that ran in folder ``path``, else ``None``
    (an earlier sweep's job: resumed or overwritten as ``folder.*`` says)."""
    if sweep is None:
        return None
    try:
        mark = json.loads((path / SWEEP_JOB).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(mark, dict) and mark.get("sweep") == sweep and mark.get("job") != job:
        return int(mark["job"])
    return None


_SWEEP_FOLDERS: set[Path] = set()
"""The run folders jobs of this process's ``--multirun`` sweep used (Hydra's basic launcher
runs them one after another in one process): a later job whose ``hydra.sweep.subdir`` names the
same folder is refused (with ``folder.overwrite=true`` it deleted the earlier job's run)."""


@contextlib.contextmanager
def _settings_refused() -> Any:
    """Inside, a ``ValueError`` or ``TypeError`` that hypergrad's own code raises (its checks
    of the settings: ``+guards.bounds`` naming no hyperparameter, ``folder.inner_every=0``, a
    loss refused by ``InnerProblem.check``) becomes a :class:`ConfigError`, answered as a usage
    error; one raised in a user's code keeps its traceback."""
    try:
        yield
    except USAGE_ERRORS:  # already a usage error of its own class
        raise
    except (ValueError, TypeError) as err:
        if not raised_in_hypergrad(err):
            raise
        refused = ConfigError(str(err))
        raise refused from err


def _mark_best_of_grid(rows: list[dict[str, Any]]) -> None:
    """Mark the grid row of the lowest validation loss ``best_of_grid``. A grid point that
    diverged (its loss NaN, infinite or missing) is never the best: ``min()`` over rows whose
    first loss was NaN returned that row."""
    grid = [r for r in rows if str(r["hyperparameters"]).startswith("grid ")
            and _finite(r.get("val_loss"))]
    if grid:
        min(grid, key=lambda r: float(r["val_loss"]))["best_of_grid"] = True


def _finite(v: Any) -> bool:
    """Whether ``v`` is a finite real number (``None``, NaN and infinities are not)."""
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


class KeepSweepRecord(Callback):
    """A Hydra callback (``hydra.callbacks`` in config.yaml): a sweep into a folder that holds
    an earlier sweep keeps that sweep's records, ``multirun.yaml`` as ``multirun.2.yaml``
    (``.3``, ...), the Optuna sweeper's ``optimization_results.yaml`` and
    :data:`SWEEP_SUMMARY` likewise, before the new sweep writes its own, as a run folder's
    ``.hydra`` record is kept (Hydra rewrote it, so the folder's jobs, refused or not, were
    described by the settings of the sweep that came last; Optuna's best point was replaced by
    a worse one), writes the sweep's id (:data:`SWEEP_ID`, which keeps two jobs of one sweep
    out of one folder in any launcher), and says which job folders of the earlier sweep are
    there: a job of the new sweep with the same number resumes, overwrites or is refused as
    its ``folder.*`` settings say; the others stay as they were."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        import uuid

        from .run.files import RunLock, next_numbered, write_text_atomic

        # a sweep the command line's check did not see (hydra.mode in a config file): refused
        # here, on every rank, before any rank renames the others' records as an earlier sweep's
        said = _multirun_under_torchrun(["--multirun"])
        if said is not None:
            print(said, file=sys.stderr)
            raise SystemExit(2)
        folder = Path(str(config.hydra.sweep.dir))
        # one sweep at a time in a folder: a second one started beside a running one took its
        # records for an earlier sweep's (renamed them), replaced its id, and the two mixed
        # their jobs' folders and summary lines (the folder probe, 2026-12-07 evening)
        self._lock = RunLock(folder, who="hypergrad-run --multirun", name=SWEEP_LOCK)
        try:
            self._lock.acquire()
        except RunDirError as err:
            print(f"hypergrad-run: the sweep folder {folder} is in use by another sweep; give "
                  f"this one another hydra.sweep.dir, or wait for that one to end. {err}",
                  file=sys.stderr)
            raise SystemExit(2) from None

        # the earlier sweep's records: the basic sweeper's multirun.yaml, the Optuna sweeper's
        # optimization_results.yaml (its best point, replaced without a word by a worse one),
        # the job lines of sweep_summary.jsonl (appended to: one job number twice)
        kept = []
        for name, pattern in (("multirun.yaml", "multirun.{}.yaml"),
                              ("optimization_results.yaml", "optimization_results.{}.yaml"),
                              (SWEEP_SUMMARY, "sweep_summary.{}.jsonl")):
            record = folder / name
            if record.is_file():
                to = next_numbered(folder, pattern)
                record.rename(to)
                kept.append(f"{name} as {to.name}")
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / SWEEP_ID, uuid.uuid4().hex + "\n")  # this invocation's
        if not kept:
            return
        jobs = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
        shown = ", ".join(map(str, jobs[:10])) + (", ..." if len(jobs) > 10 else "")
        log.warning(f"hypergrad-run: {folder} holds an earlier sweep: its records are kept "
                    f"({', '.join(kept)})"
                    + (f", and its job folders ({shown}) stay: a job of this sweep with the "
                       f"same number resumes, overwrites or is refused as its folder.* settings "
                       f"say, the others keep the earlier sweep's runs (a new "
                       f"hydra.sweep.dir keeps the sweeps apart)" if jobs else ""))


    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()


SWEEP_LOCK = ".hypergrad_sweep.lock"
"""In a ``--multirun`` sweep's folder while the sweep runs: its process (:class:`RunLock`)."""


def _user_frame(err: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``err``'s traceback in a user's own code: a file outside
    hypergrad, the Python installation and its installed packages (torch, Hydra), e.g. the
    ``my_models.py`` whose model a bundled task called; ``None`` when there is none."""
    import sysconfig

    here = Path(__file__).resolve().parent
    libs = {Path(p).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")
            if (p := sysconfig.get_paths().get(k))}
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        f = Path(frame.filename).resolve()
        if frame.filename.startswith("<") or here in f.parents or any(
                lib in f.parents for lib in libs):
            continue
        return frame
    return None


def _overwrite(folder: RunFolder) -> None:
    """With ``folder.overwrite=true``, once the new run's settings have been built (a run that
    is refused keeps the old one): remove the old run's files, its TensorBoard logs too."""
    from .run.files import RECORD_FILES, RECORD_PATTERNS, TRAINER_FILES, clear_run_dir

    if folder.overwrite:
        gone = clear_run_dir(folder.path, (*TRAINER_FILES, *RECORD_FILES), RECORD_PATTERNS)
        if gone:
            log.info(f"folder.overwrite=true: removed {gone} from {folder.path}")


def _write_config(cfg: DictConfig, run_dir: Path, resumed: bool) -> Path:
    """``config_resolved.yaml``; a resumed run keeps it (the original settings) and writes
    ``config_resolved.resume-<n>.yaml`` beside it."""
    from .run.files import write_text_atomic

    path = run_dir / "config_resolved.yaml"
    if resumed and path.exists():
        n = 1
        while (run_dir / f"config_resolved.resume-{n}.yaml").exists():
            n += 1
        path = run_dir / f"config_resolved.resume-{n}.yaml"
    write_text_atomic(path, OmegaConf.to_yaml(cfg, resolve=True))
    return path


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Build, tune, evaluate from scratch, report. Returns what ``results.json`` holds, and
    ``plots`` (the paths of the plots written).

    The run folder is locked (``run.lock``) for the whole run; a folder that already holds a
    run is refused unless ``folder.resume`` or ``folder.overwrite``."""
    from .config import config_fingerprint

    _check_report(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _settings_refused():
        folder = RunFolder(run_dir, resume=cfg.folder.resume, overwrite=cfg.folder.overwrite,
                           fingerprint=config_fingerprint(cfg),
                           inner_every=cfg.folder.get("inner_every"))
    if not distributed.is_writer():  # under torchrun, rank 0 locks, prepares and writes
        return _run(cfg, folder, [])
    with folder.lock, _kept_warnings() as said:
        _prepare_run_dir(folder)
        return _run(cfg, folder, said)


def _check_report(cfg: DictConfig) -> None:
    """The report's settings, before any work: report.orders=-1 was refused only after the
    tuning and the retraining, and the run's results.json, learned.yaml and model were never
    written (the report probe)."""
    report = cfg.get("report") or {}
    n = report.get("orders", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"hypergrad-run: report.orders={n!r} must be an int >= 0 (the "
                          f"batch orders the retrained points are also trained in; 0: none).")
    for key in ("retrain", "plots", "compare_methods"):
        v = report.get(key, False)
        if not isinstance(v, bool):
            raise ConfigError(f"hypergrad-run: report.{key}={v!r} must be true or false.")


@contextlib.contextmanager
def _bounds_refused_in_a_sweep() -> Iterator[None]:
    """In a ``--multirun`` job, an initial value the Trainer would move onto a bound of
    ``guards.bounds`` is refused (:class:`ConfigError`): the sweeper records the value it asked
    for, not the one trained (an Optuna study sampling lr in [100, 10000] against bounds of
    [1e-4, 1] scored every trial at 1.0 and reported its best as lr = 9062). A single run
    moves it and warns, as the Trainer does."""
    if not _multirun():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=BoundsWarning,
                                message=r"Trainer: initial values outside")
        try:
            yield
        except BoundsWarning as err:
            outside = getattr(err, "outside", None)
            what = (f"initial values outside guards.bounds: {'; '.join(outside)}"
                    if outside else str(err))
            raise ConfigError(
                f"hypergrad-run: {what}. In a sweep this job is refused (a single run would "
                f"move them onto the bounds): the sweeper would record the value it asked "
                f"for, not the one trained. Keep the swept values inside guards.bounds "
                f"(narrow the sweep's interval, or widen the bounds).") from None


@contextlib.contextmanager
def _kept_warnings() -> Iterator[list[str]]:
    """hypergrad's warnings during a run, for results.json's ``warnings``: Python writes them
    to stderr only, which cli.log and a sweep's launcher (joblib) do not keep, so a run that
    had warned (tuning did not help, a divergence, unseeded randomness) left no trace of it.
    Each is still shown as before (and seen by filters and recorders)."""
    said: list[str] = []
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def keep(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
            if issubclass(category, HypergradWarning):
                said.append(f"{category.__name__}: {message}")
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = keep
        yield said


def _run(cfg: DictConfig, folder: RunFolder, said: list[str]) -> dict[str, Any]:
    import torch
    import yaml  # type: ignore[import-untyped]

    from . import ForwardMode, ReverseMode
    from .measure import measure
    from .report import plot_run, summary, table, write_learned
    from .run.files import (
        PLOTS,
        RECORD_FILES,
        TRAINER_FILES,
        clear_run_dir,
        dumps,
        used_files,
        write_text_atomic,
    )

    run_dir = folder.path
    lost = _lost_preset_settings()
    if lost:
        warnings.warn(lost, ConfigWarning, stacklevel=1)
    with _settings_refused(), _bounds_refused_in_a_sweep():
        task, trainer = build(cfg, folder)
    if not distributed.is_writer():  # under torchrun: tune with rank 0, which alone reports
        return {"table": [], "learned_val_loss": trainer.fit().best_val_loss}
    _overwrite(folder)
    # a resume keeps the first config (also one from a checkpoint inside outer step 0); one
    # that starts afresh (killed before its first checkpoint) writes its own: the first
    # config_resolved.yaml described a run that left nothing
    resumed = bool(cfg.folder.resume) and bool(used_files(run_dir, (*TRAINER_FILES,
                                                                     *RECORD_FILES)))
    cfg_path = _write_config(cfg, run_dir, resumed=resumed)
    if resumed:  # an earlier end's reports would read as this run's if it stops before its own
        gone = clear_run_dir(run_dir, RECORD_FILES, ("learned_*.pt", *PLOTS))
        if gone:
            log.info(f"resume: removed the reports of the run's earlier end ({', '.join(gone)}); "
                     f"this run writes them again when it ends")
    p = task.problem
    # an approximate method's own settings (a truncation, a discount): results.json's
    # "method" is the family ("reverse"), which a truncated run shares with an exact one
    # (not the ranks' split of an exact method under torchrun: distributed.mesh)
    approx = {k.removeprefix("method."): v for k, v in trainer.method.fingerprint().items()
              if k != "method" and not k.startswith("distributed.")}
    # the method as it runs, with every setting (a checkpointed run says it checkpoints)
    method = repr(trainer.method)
    log.info(f"{cfg.name}: task={task.name} K={p.num_hyperparams} T={p.steps} "
             f"method={method} mode={trainer.mode!r} -> {run_dir} "
             f"(config: {cfg_path.name})")
    result, fit = measure(trainer.fit)
    rows: list[dict[str, Any]] = []
    other: dict[str, Any] = {}
    learned_state = None
    if cfg.report.retrain:
        points = {"initial": trainer.initial_lam, "learned": result.lam}
        if (result.last_lam is not None and not torch.equal(result.last_lam, result.lam)
                and result.last_val_loss is not None and math.isfinite(result.last_val_loss)
                and not trainer.mode.online):
            points["last (after the final update)"] = result.last_lam
        for label, lam in {**points, **task.references}.items():
            state = p.run(lam)
            if label == "learned":
                learned_state = state
            rows.append({"hyperparameters": label, **_row_metrics(task, p, state, lam, label)})
        if trainer.mode.online and result.state is not None:
            rows.insert(1, {"hyperparameters": ONLINE_ROW,
                            **_row_metrics(task, p, result.state, result.lam, "online run")})
        _mark_best_of_grid(rows)
        if trainer.mode.online:
            _warn_online_retrained(rows, result.state is not None)
        other = _other_orders(cfg, task, p, {**points, **task.references})
    extra: dict[str, Any] = {}
    if task.extra is not None:
        try:  # a report step: its failure must not lose the tuning's results
            extra = task.extra(result.lam)
            if not isinstance(extra, Mapping):  # ended the run after results.json
                raise TypeError(f"Task.extra returned {type(extra).__name__}, not a dict "
                                f"{{name: result}}")
        except Exception as err:
            warnings.warn(f"hypergrad-run: the task's extra report failed ({type(err).__name__}: "
                          f"{err}); results.json is written without it.", HypergradWarning,
                          stacklevel=2)
            extra = {"error": f"{type(err).__name__}: {err}"}
    compare: dict[str, Any] = {}  # after results.json is written (below)
    hps, horizon = p.hyperparams, p.steps
    last_step = (result.last_step if result.last_step is not None else trainer.outer_step
                 ) if not trainer.mode.online and not result.diverged else None
    results = {
        "name": cfg.name, "task": task.name, **({"task_fingerprint": task.fingerprint}
                                                if task.fingerprint else {}),
        "K": p.num_hyperparams, "T": p.steps,
        "method": result.method, "method_settings": approx, "mode": trainer.mode.name,
        "outer_steps": len(result.history),
        # this invocation's tuning; a resumed run's whole tuning (guards.clock) is elapsed
        "fit_seconds": fit["seconds"], "elapsed": result.elapsed,
        "fit_peak_extra_mib": fit["peak_extra_bytes"] / 2**20,
        # the learned point: the best evaluated (offline), its outer step and validation loss
        "learned": result.values, "learned_named": hps.named(result.values, horizon),
        "learned_step": result.best_step, "learned_val_loss": result.best_val_loss,
        # the held-out loss that chose it, where the problem has a select_loss (offline)
        **({"learned_select_loss": result.best_select_loss}
           if result.best_select_loss is not None else {}),
        # the default search's re-check: why the learned point is not always the lowest
        # validation loss of metrics.jsonl (each point's losses in both batch orders)
        "rechecked": [{"outer_step": r["outer_step"], "val_loss": r["val_loss"],
                       "variant_val_loss": r["variant_val_loss"],
                       **({"select_loss": r["select_loss"],
                           "variant_select_loss": r["variant_select_loss"]}
                          if "select_loss" in r else {}),
                       "values": hps.describe(r["lam"]),
                       "returned": bool(torch.equal(r["lam"], result.lam))}
                      for r in result.rechecked],
        # the search's plain runs (the space-filling start, the line search): metrics.jsonl
        # has a line per hypergradient only, and the learned point may be one of these
        "evaluations": [{"outer_step": e["outer_step"], "kind": e["kind"],
                         "val_loss": e["val_loss"], "elapsed": e["elapsed"],
                         "values": e["hyperparams"]} for e in result.evaluations],
        # where the outer optimizer ended: the point after the last update
        "last": result.last_values, "last_step": last_step,
        "last_val_loss": result.last_val_loss, "table": rows,
        # the same points trained in batch orders the tuning never saw (their mean): the
        # table's own order is the one the learned point was chosen in
        **({"table_other_orders": other} if other else {}),
        "extra": extra, "compare_methods": compare, "diverged": result.diverged,
        "message": result.message,
        # stopped before mode.outer_steps by guards.time_budget (resume to go on)
        "out_of_time": result.out_of_time,
        "stopped": result.stopped,  # a callback's Trainer.stop (its reason), else ""
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    # what this run does not write again must not stay from an earlier one (a resume with
    # report.retrain=false or report.plots=false): a model trained at other values, old plots
    clear_run_dir(run_dir, ("model_learned.pt",), ("learned_*.pt",
                                                   *(PLOTS if not cfg.report.plots else ())))
    if result.diverged and result.best_val_loss is None:
        # no point had a finite validation loss: result.lam is the start, which diverged; a
        # learned.yaml of it would hand torch.optim settings that diverge as if learned
        write_text_atomic(run_dir / "learned.yaml", yaml.safe_dump({"not_written": (
            f"nothing was learned, the run diverged from its start: {result.message}")}))
        results["learned_files"] = ["learned.yaml"]
    else:
        # the run's word that the values are not a tuned point, first in learned.yaml
        caution = next((w for w in said if w.startswith("TuningWarning: ") and (
            NOT_TUNED in w or RETRAINED_WORSE in w)), "")
        results["learned_files"] = write_learned(run_dir, p, result.lam, learned_state,
                                                 caution.removeprefix("TuningWarning: "))
    results["warnings"] = list(said)  # those of the run so far (the plots' come after)
    write_text_atomic(run_dir / "results.json", dumps(results, indent=1))
    if cfg.report.compare_methods:
        # after the results are written: forward mode's hypergradient at K = 1200 took twice
        # the tuning's time, and a run stopped during it had no results.json
        lam0 = p.init_raw()
        ref = None
        # the run's own method where it is one of the two (its settings: compile=false, an
        # HVP chunk size, a checkpointing; a fresh ForwardMode() timed its compile trial
        # into the comparison, 14.5 s against 0.04; the report probe)
        own = trainer.method
        fwd = own if type(own) is ForwardMode else ForwardMode()
        rev = (own if type(own) is ReverseMode and getattr(own, "truncate", None) is None
               else ReverseMode())
        for meth in (fwd, rev):
            def one(meth: Any = meth) -> Any:
                return meth.hypergradient(p, lam0)

            hgr, m = measure(one)
            compare[meth.name] = {"seconds": m["seconds"],
                                  "peak_extra_mib": m["peak_extra_bytes"] / 2**20}
            ref = hgr.grad if ref is None else ref
            compare[meth.name]["rel_diff_to_forward"] = float(
                (hgr.grad - ref).norm() / ref.norm().clamp_min(1e-300))
        write_text_atomic(run_dir / "results.json", dumps(results, indent=1))
    if cfg.report.plots:
        last = (None if last_step is None or result.last_val_loss is None
                or result.last_values is None
                else (last_step, result.last_val_loss, result.last_values))
        learned = (None if result.best_val_loss is None
                   else (result.best_val_loss, result.values))
        # where a run diverged: its outer step and loss (the plot dropped that point and did
        # not say the run diverged)
        stopped = ((trainer.outer_step, result.last_val_loss) if result.diverged
                   and result.last_values is not None else None)
        results["plots"] = plot_run(run_dir, hps, horizon, result.history,
                                    trainer.initial_lam, result.lam, result.best_step, last,
                                    learned, any(e["kind"] == "start"
                                                 for e in trainer.evaluations), stopped)
        # results.json was written before the plots (a run stopped while plotting keeps it):
        # once more, naming them
        write_text_atomic(run_dir / "results.json", dumps(results, indent=1))
    text = table(rows)
    if text:
        log.info("\n" + text)
    if other:
        log.info(f"the same points, the mean of {len(other['variants'])} batch orders the "
                 f"tuning never saw (variants {other['variants']} of the problem):\n"
                 + table(other["rows"]))
    for k, v in extra.items():
        log.info(f"{k}: {v['summary'] if isinstance(v, dict) and 'summary' in v else v}")
    for k, v in compare.items():
        log.info(f"{k}: {v['seconds']:.2f} s, peak extra memory {v['peak_extra_mib']:.2f} MiB, "
                 f"relative difference to forward {v['rel_diff_to_forward']:.2e}")
    so_far = (f" (the run's tuning so far: {result.elapsed:.1f} s over its invocations)"
              if resumed else "")
    log.info(f"tuning took {fit['seconds']:.1f} s{so_far}, peak extra memory "
             f"{fit['peak_extra_bytes'] / 2**20:.1f} MiB ({result.method} mode)")
    # online: the values after k updates, which the steps up to record k's inner step used,
    # or, after the last update, the run's end (a run that diverged at step 8 said "inner
    # step 40" of the point its first 4 steps used)
    at = [h.get("inner_step") for h in result.history if h.get("outer_step") == result.best_step]
    k = result.best_step
    where = ("" if k is None else
             (f" (after {k} update{'' if k == 1 else 's'}: the values of inner steps up to "
              f"{at[-1]})" if at and at[-1] is not None else
              f" (after {k} update{'' if k == 1 else 's'}, at the end: inner step {horizon})")
             if trainer.mode.online else f" (outer step {k})")
    log.info(f"learned hyperparameters{where}: {summary(hps, result.values, horizon)}")
    if result.last_values is not None and result.last_values != result.values:
        when = (f" (outer step {last_step})" if last_step is not None
                else " (where the run diverged)" if result.diverged else "")
        log.info(f"last hyperparameters{when}: {summary(hps, result.last_values, horizon)}")
    if result.diverged:
        log.warning(result.message)
    log.info(f"results: {run_dir / 'results.json'}")
    return results


ORDERS_FROM = 3
"""The first :meth:`InnerProblem.variant <hypergrad.InnerProblem.variant>` of the retrained
rows' other batch orders (``report.orders``): the tuning's re-check trains in variant 1, its
second order of each hypergradient in variant 2."""


def _other_orders(cfg: DictConfig, task: Task, p: InnerProblem,
                  points: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The retrained points trained again in ``report.orders`` batch orders the tuning never
    saw (:data:`ORDERS_FROM` on), each row the mean of their metrics: the table's own rows are
    trained in the order the learned point was chosen in, which favours it (the demo's lead
    in test loss over the best grid point was gone in other orders). ``{}`` where
    ``report.orders`` is 0 or every run at a point is the same (:attr:`InnerProblem.varies`)."""
    n = cfg.report.get("orders", 0)  # checked before any work (_check_report)
    if n == 0 or not p.varies:
        return {}
    variants = list(range(ORDERS_FROM, ORDERS_FROM + n))
    rows = []
    for label, lam in points.items():
        got: dict[str, list[float]] = {}
        for k in variants:
            with p.variant(k):
                state = p.run(lam)
                for key, v in _row_metrics(task, p, state, lam, label).items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        got.setdefault(key, []).append(float(v))
        rows.append({"hyperparameters": label,
                     **{key: sum(vs) / len(vs) for key, vs in got.items()
                        if len(vs) == len(variants)}})
    _mark_best_of_grid(rows)
    return {"variants": variants, "rows": rows}


ROW_FIELDS = ("hyperparameters", "best_of_grid", "error")
"""A table row's own fields beside its metrics: the point's label, the grid's best mark (the
printed table leaves that column out) and a failed evaluate's message."""


RETRAINED_WORSE = "the learned hyperparameters, retrained from scratch"
"""Words of hypergrad-run's warning that an online run's values retrain worse than the
initial ones, by which ``learned.yaml`` is headed with it."""


def _warn_online_retrained(rows: list[dict[str, Any]], own_state: bool) -> None:
    """Warn where an online run's learned values, retrained from scratch, train worse than
    the initial ones: the values an online run ends with suit the end of a training, not a
    whole one (HD's learning rate grown to 1.125 along a run trained from scratch to a
    validation loss of 5.6e11, and the table showed it without a word)."""
    by = {r["hyperparameters"]: r.get("val_loss") for r in rows}
    first, learned = by.get("initial"), by.get("learned")
    if (not isinstance(first, float) or not isinstance(learned, float)
            or not math.isfinite(first) or (math.isfinite(learned) and learned <= first)):
        return
    own = (f"Use the online run's own model (the {ONLINE_ROW!r} row, TrainResult.state), "
           f"tune" if own_state else "Tune")
    warnings.warn(TuningWarning(
        f"hypergrad-run: {RETRAINED_WORSE}, reach a validation loss of {learned:.4g}, "
        f"above the initial ones' {first:.4g}: online tuning moves them along one run, "
        f"and the values it ends with suit the end of a training, not a whole one (a "
        f"learning rate grown as the loss fell can diverge from step 0). {own} offline "
        f"(mode=offline) for values that train well from scratch, or bound them "
        f"(guards.bounds)."), stacklevel=2)


def _row_metrics(task: Task, p: InnerProblem, state: Any, lam: torch.Tensor,
                 label: str) -> dict[str, Any]:
    """A retrained row's metrics: the validation loss (the tuning's objective, which a sweeper
    gets for the learned row) and the task's evaluation. An evaluation's own ``val_loss`` that
    differs from the objective (a model evaluated in eval mode where the objective runs it in
    train mode; a test loss under that name) is kept as ``evaluate.val_loss`` (the sweeper was
    returned it). An evaluation that raises is reported in the row and warned about: the
    tuning's results are written all the same (it lost results.json, learned.yaml and
    model_learned.pt)."""
    import torch

    with torch.no_grad():
        val = float(p.objective(state.params, state.buffers, lam))
    try:
        row: dict[str, Any] = {"val_loss": val, **task.metrics(
            state, fields={"val_loss": val}, reserved=ROW_FIELDS)}
    except Exception as err:  # noqa: BLE001 - a report step
        warnings.warn(f"hypergrad-run: the task's evaluate failed on the {label!r} row "
                      f"({type(err).__name__}: {err}); the row is written without it.",
                      HypergradWarning, stacklevel=2)
        row = {"error": f"{type(err).__name__}: {err}", "val_loss": val}
    return row


HYDRA_OWN = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", ".hydra")
"""What Hydra writes in a job's folder before the job runs, beside its log (``<job>.log``)."""


def _shared_run_dir(run_dir: Path) -> Path:
    """Under torchrun: rank 0's run folder on every rank (Hydra names it from the clock, which
    the ranks read apart). The folder Hydra made for another rank alone is removed where it
    holds nothing but Hydra's own files (:data:`HYDRA_OWN`, its log): a rank given another
    ``hydra.run.dir`` (an earlier run's folder, or rank 0's own through another path, a link
    or another node's mount) deleted that run's records, and a resume then started afresh.
    The logs of ranks other than 0 are kept to warnings."""
    if not distributed.active():
        return run_dir
    if not distributed.is_writer():
        logging.getLogger("hypergrad").setLevel(logging.WARNING)
    shared = Path(distributed.broadcast_object(str(run_dir), "agreeing on the run folder"))
    if shared != run_dir and not distributed.is_writer():
        with contextlib.suppress(OSError):
            if shared.exists() and shared.samefile(run_dir):
                return shared
            held = sorted(q.relative_to(run_dir).as_posix() for q in run_dir.rglob("*"))
            if any(q not in HYDRA_OWN and not ("/" not in q and q.endswith(".log"))
                   for q in held):
                log.warning(f"(rank {distributed.rank()}) Hydra's run folder {run_dir} is not "
                            f"rank 0's ({shared}), where the run writes; it holds other files "
                            f"than Hydra's, so it is kept as it is (Hydra rewrote its .hydra/ "
                            f"there)")
                return shared
            for name in sorted(held, reverse=True):
                q = run_dir / name
                q.rmdir() if q.is_dir() else q.unlink()
            run_dir.rmdir()
    return shared


USAGE_ERRORS = (ConfigError, RunDirError, ResumeMismatchError, MemoryBudgetError,
                CheckpointError, RanksMismatchError)
"""What the command answers with its message alone and exit status 2 (the user's settings or
its run folder are the cause; a traceback into hypergrad's code would only hide the message)."""


def _multirun() -> bool:
    with contextlib.suppress(ValueError):  # no Hydra config: called outside a Hydra job
        return bool(HydraConfig.get().mode == RunMode.MULTIRUN)
    return False


class RefusedJob(CompactHydraException):
    """A ``--multirun`` job whose settings hypergrad refused (its message already printed):
    Hydra marks the job failed and prints this one line, where the refusal itself went up
    through Hydra's sweeper with a traceback of its frames. ``kind``: the refusal's type."""

    def __init__(self, message: str, kind: str = "ConfigError") -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:  # back from a joblib worker
        return (RefusedJob, (str(self), self.kind))


def _refuse(err: Exception) -> None:
    """Print a usage error without a traceback (to stderr, and to the run's log file, so the
    folder says why the run stopped) and exit with status 2; ``HYDRA_FULL_ERROR=1`` re-raises
    it for Hydra's full traceback. In a ``--multirun`` job it is printed and re-raised: Hydra
    marks that job failed and runs the sweep's other jobs (an exit would end the sweep, kill
    the jobs running beside it and stop an Optuna study at its first refused trial)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    msg = str(err) if str(err).startswith("hypergrad-run") else f"hypergrad-run: {err}"
    _to_log_file(msg)
    if _multirun():
        print(msg, file=sys.stderr)
        raise RefusedJob(msg, type(err).__name__) from None
    print(f"{msg}\n(HYDRA_FULL_ERROR=1 shows where it was raised)", file=sys.stderr)
    sys.exit(2)


def _to_log_file(msg: str) -> None:
    """``msg`` as an ERROR line in the run's log file (``cli.log``; not to the console, where
    the caller or Hydra says it). Under torchrun a rank other than 0 names itself: the ranks
    of one run folder share its log file, where the same refusal read as written twice."""
    if os.environ.get("RANK", "0") != "0":
        msg = f"(rank {os.environ['RANK']}) {msg}"
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, msg, (), None)
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.handle(record)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (how SLURM and Kubernetes stop a job) raised in the main thread, handled as an
    interrupt: the run folder's log says why the run stopped, the lock is released, and the
    message says how to go on (the process died with no word)."""


def _how(err: BaseException) -> str:
    """How an interrupt came: ``SIGTERM`` (:class:`_Terminated`) or ``KeyboardInterrupt``."""
    return "SIGTERM" if isinstance(err, _Terminated) else "KeyboardInterrupt"


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated("SIGTERM")


def _interrupted(err: BaseException) -> str:
    """What an interrupted run's message says: the run folder, and whether it holds a
    checkpoint to resume from (:func:`_stopped`)."""
    how = _how(err)
    if isinstance(err, _Terminated) and distributed.launched():
        # torchrun stops every rank with SIGTERM when one of them failed
        how += ", which torchrun also sends when another rank failed: see its error above"
    return _stopped(f"interrupted ({how})")


def _stopped(what: str) -> str:
    """``hypergrad-run: <what>`` and the next step: the run folder, and whether it holds a
    checkpoint to resume from (``hydra.run.dir`` named: the default folder has a time stamp,
    so the same command with ``folder.resume=true`` alone started afresh in a new folder)."""
    from .run.files import CHECKPOINT, PREVIOUS

    try:
        h = HydraConfig.get()
        run_dir = Path(h.runtime.output_dir)
    except Exception:  # noqa: BLE001 - outside a Hydra job: the folder is unknown
        return (f"hypergrad-run: {what}; continue in the same run folder with "
                f"folder.resume=true hydra.run.dir=<the run folder>")
    # a sweep's jobs go where hydra.sweep.dir says (a --multirun ignores hydra.run.dir: the
    # advice restarted every job afresh in a new folder)
    where = (f"hydra.sweep.dir={_sweep_folder(h)} (the sweep's folder: each job resumes its "
             f"own)" if _multirun() else f"hydra.run.dir={run_dir}")
    if _multirun() and "optuna" in str(h.sweeper.get("_target_", "")).lower():
        # run again, Optuna proposes new values: job N's folder holds another point's run
        return (f"hypergrad-run: {what}; an Optuna sweep's jobs' runs cannot be "
                f"resumed (refused: run again, job N may be given other values): run it again "
                f"into a new hydra.sweep.dir (its study continues where hydra.sweeper.storage "
                f"and study_name keep it, with another hydra.sweeper.sampler.seed: the same "
                f"seed draws the same first points again); {run_dir} keeps this job's records")
    if (run_dir / CHECKPOINT).exists() or (run_dir / PREVIOUS).exists():
        return (f"hypergrad-run: {what}; the run folder {run_dir} keeps the last "
                f"checkpoint and its records: continue with the same command and "
                f"folder.resume=true {where}")
    return (f"hypergrad-run: {what} before the first checkpoint: the run folder "
            f"{run_dir} holds none to resume from; run the command again ({where} reuses the "
            f"folder{'s' if _multirun() else ''})")


def _failed(err: BaseException) -> str:
    """What the run's log file says of an error raised in the run (your model, task or
    optimizer, or hypergrad's own), or of an interruption: its class, message and where it
    was raised, and the cause Hydra wraps (whose message, a missing file's name say, Hydra's
    own line leaves out)."""
    if isinstance(err, KeyboardInterrupt):
        return _interrupted(err)
    cause = err.__cause__ if isinstance(err, InstantiationException) else None
    where = traceback.extract_tb((cause or err).__traceback__)
    at = f" (raised at {where[-1].filename}:{where[-1].lineno}" if where else ""
    mine = _user_frame(cause or err)
    if at and mine is not None and mine != where[-1]:
        at += f", from your code at {mine.filename}:{mine.lineno}"
    at += ")" if at else ""
    said = f"{type(err).__name__}: {err}"
    if cause is not None:
        said += f"\ncaused by {type(cause).__name__}: {cause}"
    return f"hypergrad-run: the run failed: {said}{at}"


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def _main(cfg: DictConfig) -> float:
    try:
        return _answered_job(cfg)
    except BaseException as err:  # in a sweep, its summary says this job failed, and why
        if not isinstance(err, SystemExit):
            kind = err.kind if isinstance(err, RefusedJob) else type(err).__name__
            said = str(err).removeprefix("hypergrad-run: ") if isinstance(err, RefusedJob) \
                else str(err)
            if isinstance(err, KeyboardInterrupt):  # stopped from outside, not failed
                _sweep_line("interrupted", error=_how(err))
            else:
                _sweep_line("failed", error=f"{kind}: {said[:500]}")
        raise


def _answered_job(cfg: DictConfig) -> float:
    """:func:`_job`, its errors answered: a usage error as a message and exit status 2, a
    setting hypergrad refuses while Hydra instantiates it as one, any other error written to
    the run folder's log, an interrupt as what to do next."""
    try:
        return _job(cfg)
    except USAGE_ERRORS as err:
        _refuse(err)
        raise  # not reached: _refuse exits or re-raises
    except MissingMandatoryValue as err:  # an option's required key left unset (??? in it)
        key = getattr(err, "full_key", None) or "a required key"
        _refuse(ConfigError(
            f"hypergrad-run: {key} has no value and needs one (the option that put it there "
            f"requires it): give it on the command line, {key}=<value>, or in your config "
            f"file; docs/configs.md shows each kind's keys."))
        raise
    except InstantiationException as err:
        refused = _refused_setting(err)
        if refused is None:
            _to_log_file(_failed(err))
            if err.__cause__ is not None:  # Hydra's line shows the cause's repr only
                mine = _user_frame(err.__cause__)
                at = "" if mine is None else (f" (in your code: {mine.filename}:{mine.lineno}"
                                              f", {mine.name})")
                print(f"hypergrad-run: caused by {type(err.__cause__).__name__}: "
                      f"{err.__cause__}{at}", file=sys.stderr)
            raise
        _refuse(refused)
        raise
    except (Exception, KeyboardInterrupt) as err:  # the folder says why the run stopped
        _to_log_file(_failed(err))
        if isinstance(err, KeyboardInterrupt) and not _multirun() and os.environ.get(
                "HYDRA_FULL_ERROR") != "1":  # what to do next, not 75 lines of traceback
            print(_failed(err), file=sys.stderr)
            sys.exit(143 if isinstance(err, _Terminated) else 130)
        if isinstance(err, DistributedError) and not _multirun() and os.environ.get(
                "HYDRA_FULL_ERROR") != "1":  # the ranks' failure and what to do next, without
            # Hydra's 60 lines of traceback and with the command line's setting (the error's
            # own advice is the Python API's: the torchrun probe)
            print(f"hypergrad-run: {err} On the command line the timeout is "
                  f"distributed.timeout=<seconds>.", file=sys.stderr)
            print(_stopped("stopped (the ranks' failure above)"), file=sys.stderr)
            sys.exit(1)
        if isinstance(err, KeyboardInterrupt) and _multirun():
            # the sweep stops with Hydra's traceback, whose note was the Trainer's Python
            # advice (folder=hypergrad.RunFolder(...)): the command line's instead (the sweep
            # probe: it was in the job's cli.log only)
            notes = [n for n in getattr(err, "__notes__", [])
                     if not n.startswith("Trainer: interrupted")]
            err.__notes__ = [*notes, _failed(err)]
        raise


def _refused_setting(err: InstantiationException) -> ConfigError | None:
    """A setting hypergrad's own classes refuse while Hydra instantiates them (a ``ValueError``
    or ``TypeError`` naming the argument, its value and the fix): as a :class:`ConfigError`
    naming the config key, without Hydra's wrapping (``Error in call to target ...:
    ValueError('...')``), also when a task builder of your own called the class. Errors raised
    in your own code are left to Hydra, with their traceback."""
    cause = err.__cause__
    text = str(err)
    target = re.search(r"target '([^']+)'", text)
    # a hypergrad target's own signature or settings; not an error raised in a user's code
    # that the target called (a model of your own that a bundled task builds)
    ours = (target is not None and target.group(1).startswith("hypergrad.")
            and (cause is None or _user_frame(cause) is None))
    if not isinstance(cause, (ValueError, TypeError)) or not (
            ours or raised_in_hypergrad(cause)):
        return None
    key = re.search(r"^full_key: (\S+)", text, re.MULTILINE)
    what = target.group(1) if target else "instantiation"
    where = f"{key.group(1)} ({what})" if key else what
    refused = ConfigError(f"hypergrad-run: {where}: {cause}")
    refused.__cause__ = cause
    return refused


def _user_config_dirs(hydra_cfg: Any) -> list[Path]:
    """The config folders of the search path other than the bundled presets' (``--config-dir``,
    ``hydra.searchpath``)."""
    out = []
    for source in hydra_cfg.runtime.config_sources:
        if source.schema == "file" and Path(source.path).resolve() != CONFIG_DIR.resolve():
            out.append(Path(source.path))
    return out


def _shadowed_options(hydra_cfg: Any) -> None:
    """A chosen option that a config folder of yours holds under a bundled option's name
    (``conf/model/mlp.yaml``, ``model=mlp``) is refused: Hydra reads the bundled file first,
    and yours was never read, without a word."""
    for key, choice in hydra_cfg.runtime.choices.items():
        group = str(key).partition("@")[0]
        if not isinstance(choice, str) or group.startswith("hydra"):
            continue
        bundled = CONFIG_DIR / group / f"{choice}.yaml"
        if not bundled.is_file():
            continue
        for folder in _user_config_dirs(hydra_cfg):
            mine = folder / group / f"{choice}.yaml"
            if mine.is_file() and mine.read_bytes() != bundled.read_bytes():
                raise ConfigError(
                    f"hypergrad-run: {mine} has the name of a bundled option ({group}={choice}), "
                    f"and Hydra reads the bundled {bundled} first: yours was never read. "
                    f"Give yours a name of its own ({folder / group / (choice + '_mine.yaml')}, "
                    f"then {group}={choice}_mine).")


def _extended_presets(name: str, folders: list[Path], seen: set[str] | None = None
                      ) -> list[str]:
    """The experiment presets that experiment ``name`` (a file in one of ``folders``) extends
    through its defaults list (``- digits_schedule``, ``- /experiment: digits_schedule``),
    and theirs."""
    import yaml  # type: ignore[import-untyped]

    seen = set() if seen is None else seen
    path = next((f / "experiment" / f"{name}.yaml" for f in folders
                 if (f / "experiment" / f"{name}.yaml").is_file()), None)
    if path is None or name in seen:
        return []
    seen.add(name)
    try:
        entries = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return []
    out: list[str] = []
    for entry in entries:
        parent = None
        if isinstance(entry, str) and "/" not in entry and entry != "_self_":
            parent = entry  # a config of the same group
        elif isinstance(entry, str) and entry.startswith("/experiment/"):
            parent = entry.removeprefix("/experiment/")
        elif isinstance(entry, dict) and len(entry) == 1:
            (k, v), = entry.items()
            if str(k).split()[-1] == "/experiment" and isinstance(v, str):
                parent = v
        if parent:
            out += [parent, *_extended_presets(parent, folders, seen)]
    return out


def _lost_preset_settings() -> str | None:
    """What a preset of yours that extends a bundled one does not inherit: the bundled
    preset's settings of its outer optimizer (``experiment_outer/<preset>_<optimizer>.yaml``)
    are chosen by the experiment's name, so ``experiment=mine`` extending digits_schedule
    ran sign steps of 0.1 (sign's own) instead of the preset's 0.5, without a word."""
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    choices = hydra_cfg.runtime.choices
    name, opt = choices.get("experiment"), choices.get("outer_optimizer")
    if not isinstance(name, str) or not isinstance(opt, str):
        return None
    mine = _user_config_dirs(hydra_cfg)
    folders = [*mine, CONFIG_DIR]
    own = f"experiment_outer/{name}_{opt}.yaml"
    if any((f / own).is_file() for f in folders):
        return None
    for parent in _extended_presets(name, folders):
        theirs = CONFIG_DIR / "experiment_outer" / f"{parent}_{opt}.yaml"
        if theirs.is_file():
            where = (mine[0] if mine else Path("<your config folder>")) / own
            return (f"experiment={name} extends experiment={parent}, but not its settings of "
                    f"outer_optimizer={opt} ({theirs}), which apply by the experiment's name: "
                    f"this run uses outer_optimizer={opt}'s own. To inherit them, copy that "
                    f"file to {where}; to keep {opt}'s own and silence this, create {where} "
                    f"empty (docs/configs.md).")
    return None


def _job(cfg: DictConfig) -> float:
    from . import alloc

    alloc.tune_malloc()
    hydra_cfg = HydraConfig.get()
    top = global_groups()  # experiment, debug, sweep: their options write at the top level
    schema = {g: c for g, c in hydra_cfg.runtime.choices.items()
              if isinstance(c, str) and c.startswith("schema_")}
    if schema:  # composed, but without the option's own settings (a preset's sign step lost)
        g, c = next(iter(schema.items()))
        raise ConfigError(f"hypergrad-run: {g}={c} is the schema the {g} options extend, not "
                          f"an option; choose {g}={c.removeprefix('schema_')} (hypergrad-run "
                          f"--help lists the options).")
    check_keys(cfg, [g for g in hydra_cfg.runtime.choices if "/" not in g
                     and not g.startswith("hydra") and g not in top])
    _shadowed_options(hydra_cfg)
    sweeper = str(hydra_cfg.sweeper.get("_target_", ""))
    if not _multirun() and "optuna" in sweeper.lower():
        # +sweep=digits_schedule without --multirun ran once at the config's own values with
        # mode.outer_steps=0 and reported them as "learned" (the sweep probe)
        raise ConfigError(
            f"hypergrad-run: the sweeper is Optuna's ({sweeper}, from +sweep=... or "
            f"hydra/sweeper=optuna), which runs only with --multirun; without it this command "
            f"would run once at the config's own values (a sweep preset sets "
            f"mode.outer_steps=0: no tuning). Add --multirun.")
    direction = hydra_cfg.sweeper.get("direction") if _multirun() else None
    if OmegaConf.is_list(direction) or isinstance(direction, (list, tuple)):
        # a multi-objective study: every job trained, then Optuna failed each trial ("Return
        # value must be a list") and the sweep ended with no solution (the Optuna probe)
        wanted = list(direction)  # type: ignore[arg-type]
        raise ConfigError(
            f"hypergrad-run: hydra.sweeper.direction={wanted} asks for a study of "
            f"{len(wanted)} objectives, but each job returns one loss (the learned point's "
            f"validation loss): use hydra.sweeper.direction=minimize.")
    if direction is not None and "max" in str(direction).lower():
        # Optuna's sweeper: a diverged job's inf became the best value and its point the best
        raise ConfigError(
            f"hypergrad-run: hydra.sweeper.direction={direction}, but each job returns a loss "
            f"to minimise (the learned point's validation loss; inf for a run that diverged "
            f"at its start, which maximising would pick as the best): use "
            f"hydra.sweeper.direction=minimize.")
    out = Path(hydra_cfg.runtime.output_dir)
    tilde = [part for part in out.parts if part.startswith("~")]
    if tilde:
        _unmake(out, out.parts.index(tilde[0]))
        raise ConfigError(
            f"hypergrad-run: the run folder {out} has a part {tilde[0]!r}: '~' was not expanded "
            f"(the shell does not expand it after 'hydra.run.dir='). Give the folder as "
            f"hydra.run.dir=$HOME/... or an absolute path.")
    timeout = cfg.distributed.get("timeout") if cfg.get("distributed") else None
    with distributed.launch(timeout):  # under torchrun: the process group, ended cleanly
        run_dir = _shared_run_dir(Path(HydraConfig.get().runtime.output_dir))
        results = run(cfg, run_dir)
    value = objective(results)
    # JSON has no inf (it was written null, as if the sweeper got nothing)
    _sweep_line("done", returned=value if math.isfinite(value) else "inf",
                learned=results.get("learned"),
                learned_val_loss=results.get("learned_val_loss"),
                diverged=results.get("diverged"))
    return value


def _unmake(out: Path, part: int) -> None:
    """Remove what Hydra made of a refused run folder (its ``.hydra/`` and ``cli.log``), and the
    folders then empty up to and including ``out.parts[part]``: a refused
    ``hydra.run.dir='~/x'`` left a folder named ``~`` in the working directory, which
    ``rm -rf ~`` would mistake for the home folder (the docs probe). Nothing else is removed."""
    import shutil

    shutil.rmtree(out / ".hydra", ignore_errors=True)
    with contextlib.suppress(OSError):
        (out / "cli.log").unlink()
    top = Path(*out.parts[:part + 1])
    for d in [out, *out.parents]:
        if len(d.parts) < len(top.parts):
            break
        try:
            d.rmdir()  # only an empty folder
        except OSError:
            break


SWEEP_SUMMARY = "sweep_summary.jsonl"
"""In a ``--multirun`` sweep's folder: a line per job as it ends, whatever the launcher (the
basic one, joblib, a cluster's): its number, overrides and folder, ``status`` (``done``,
``failed`` or ``interrupted``), what it returned to the sweeper and its learned point, or its
error."""


def _sweep_line(status: str, **fields: Any) -> None:
    """Append this job's line to the sweep's :data:`SWEEP_SUMMARY` (in a ``--multirun`` job on
    rank 0; one ``write`` of an ``O_APPEND`` file, so jobs ending at once do not mix lines).
    Never fails the job: the line is a summary of records its folder keeps."""
    if not _multirun() or os.environ.get("RANK", "0") != "0":
        return
    from .run.files import dumps

    with contextlib.suppress(Exception):
        h = HydraConfig.get()
        line = dumps({"job": h.job.num, "overrides": list(h.overrides.task),
                      "folder": h.runtime.output_dir, "status": status, **fields}) + "\n"
        fd = os.open(_sweep_folder(h) / SWEEP_SUMMARY, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def objective(results: dict[str, Any]) -> float:
    """What a sweeper minimises: the retrained learned point's validation loss; without
    retraining, or from a task whose ``evaluate`` reports none, the best evaluated one (with
    ``mode.outer_steps=0``: the loss of one training at the given values). A run whose loss is
    not finite (it diverged) gives ``inf``, the worst value, never NaN: Optuna fails a trial
    that returns NaN (hydra-optuna-sweeper then stops the whole sweep) and learns nothing from
    it, while ``inf`` tells the sampler that region diverges."""
    learned = [r for r in results["table"] if r["hyperparameters"] == "learned"]
    val = learned[0].get("val_loss") if learned else None
    if val is None:
        val = results["learned_val_loss"]
    val = float(val) if val is not None else math.nan
    return val if math.isfinite(val) else math.inf


def main() -> None:
    """Console-script entry point. The folder it runs from is importable (your own task,
    method or optimizer module named by ``_target_``), as for ``python -m``."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # not a launcher's own handler
        signal.signal(signal.SIGTERM, _on_sigterm)
    said = _multirun_under_torchrun(sys.argv[1:])
    if said is not None:
        print(said, file=sys.stderr)
        raise SystemExit(2)
    try:
        _main()
    except KeyboardInterrupt as err:
        # a sweep's job interrupted (a single run exits in the job itself): Python's traceback
        # and status 1 read as a crash (a pre-empted SLURM sweep), where a single run stops
        # with its message and 130 / 143
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        notes = [n for n in getattr(err, "__notes__", []) if n.startswith("hypergrad-run:")]
        print(notes[-1] if notes else f"hypergrad-run: interrupted ({_how(err)})",
              file=sys.stderr)
        raise SystemExit(143 if isinstance(err, _Terminated) else 130) from None
    except SystemExit as err:
        if err.code == 1:  # Hydra's own failure (a composition error among them)
            said = (_preset_conflict(sys.argv[1:]) or _bare_word(sys.argv[1:])
                    or _missing_plugin(sys.argv[1:]) or _group_list(sys.argv[1:]))
            if said is not None:  # after Hydra's own lines, which name only the key
                print(said, file=sys.stderr)
        raise


def _multirun_under_torchrun(args: list[str]) -> str | None:
    """Why ``--multirun`` is refused under torchrun (``None`` where it is not asked for or
    not under torchrun): every job of the sweep starts the process group again in the same
    processes, which torchrun's rendezvous store does not answer; the second job hung for the
    group's timeout (10 minutes), and every rank wrote the sweep's own records."""
    # argparse takes any unambiguous prefix of a flag: --multi started a sweep
    asked = any(a == "-m" or (len(a) >= 3 and "--multirun".startswith(a))
                or a.replace(" ", "").replace('"', "").replace("'", "").lower()
                == "hydra.mode=multirun" for a in args)
    if not asked or not distributed.launched():
        return None
    return ("hypergrad-run: --multirun under torchrun is refused: each job would start the "
            "ranks' process group again in the same processes, which torchrun does not allow "
            "(the second job hangs). Run the sweep with a launcher whose jobs each run "
            "torchrun (docs/distributed.md, 'Many runs: Hydra launchers'), or one torchrun per "
            "run: for s in 0 1 2; do torchrun ... -m hypergrad.cli seed=$s ...; done.")


def _missing_plugin(args: list[str]) -> str | None:
    """The extra to install for a Hydra plugin the command line asks for and that is not
    installed (Hydra says only "Could not find 'hydra/launcher/joblib'"); ``None`` else."""
    import importlib.util

    wants = {"joblib": any(a.replace(" ", "") == "hydra/launcher=joblib" for a in args),
             "optuna": any(a.replace(" ", "") == "hydra/sweeper=optuna"
                           or a.lstrip("+").startswith("sweep=") for a in args)}
    plugins = {"joblib": ("hydra_plugins.hydra_joblib_launcher", "sweep"),
               "optuna": ("hydra_plugins.hydra_optuna_sweeper", "sweep-optuna")}
    for what, asked in wants.items():
        module, extra = plugins[what]
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # hydra_plugins itself absent
            found = False
        if asked and not found:
            apart = ("" if what != "optuna" else
                     " in a virtual environment of its own: the plugin pins optuna<3, which "
                     "would replace the optuna>=4 of the `compare` extra here (in a source "
                     "checkout, `make test` installs it apart, in .venv/sweep-optuna)")
            return (f"hypergrad-run: the {what} plugin of Hydra is not installed: "
                    f"pip install 'hypergrad-forward[{extra}]'{apart} (docs/configs.md).")
    return None


def _group_list(args: list[str]) -> str | None:
    """What to do with ``group=[a,b]`` (``method=[forward,reverse]``): a list of a config
    group's options is merged as one config, and Hydra says only "Merge error: ReverseModeConf
    is not a subclass of ForwardModeConf" (the sweep probe); a sweep over them is
    ``-m group=a,b``. ``None`` for any other."""
    groups = {d.name for d in CONFIG_DIR.iterdir() if d.is_dir()} & {
        "method", "inner_optimizer", "outer_optimizer", "mode", "model", "task", "experiment",
        "experiment_outer", "guards", "folder", "distributed"}  # one option each
    for a in args:
        key, _, value = a.partition("=")
        if key.lstrip("+~") in groups and value.strip().startswith("["):
            items = value.strip()[1:-1]
            return (f"hypergrad-run: {a} gives the {key.lstrip('+~')} group a list of options, "
                    f"which Hydra merges into one config; to run each of them, sweep: "
                    f"hypergrad-run --multirun {key.lstrip('+~')}={items}.")
    return None


_TAKES_VALUE = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-p",
                "--package", "-i", "--info", "-c", "--cfg", "--experimental-rerun")
"""Hydra's flags whose value is the next argument (``--cfg job``: "'job' is not an override"
was added under Hydra's own error of a bad key; the docs probe)."""


def _bare_word(args: list[str]) -> str | None:
    """What to do with a word that is no override (``hypergrad-run report``, or a preset's
    name alone): Hydra says only "missing EQUAL"; ``None`` where every argument is one."""
    words = [a for i, a in enumerate(args)
             if "=" not in a and not a.startswith(("-", "~"))
             and not (i > 0 and args[i - 1] in _TAKES_VALUE)]
    if not words:
        return None
    presets = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
    word = words[0]
    if word in presets:
        return (f"hypergrad-run: {word!r} is a preset: give it as experiment={word} (the "
                f"arguments are Hydra overrides, key=value; docs/configs.md).")
    return (f"hypergrad-run: {word!r} is not an override: the arguments are Hydra overrides, "
            f"key=value (experiment=<preset>, one of {', '.join(presets)}; docs/configs.md). "
            f"There are no subcommands: a run's results are in its folder (results.json, "
            f"learned.yaml, cli.log, metrics.jsonl).")


def _preset_conflict(args: list[str]) -> str | None:
    """What to do when an experiment preset sets a key that the option chosen beside it on
    the command line does not have (``experiment=digits_schedule mode=online``: the preset's
    ``mode.outer_steps``): Hydra's message, "Key 'outer_steps' not in 'OnlineConf'", says
    neither who set the key nor what to do. Composes the command line's overrides again (only
    after a failed run that named a preset) and explains that error; ``None`` for any other."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    if not any(a.startswith("experiment=") for a in args) or any(
            a.startswith("-") for a in args):  # --config-dir, --multirun: not re-composed here
        return None
    overrides = [a for a in args if "=" in a and not a.startswith("hydra")]
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            compose("config", overrides=overrides)
    except ConfigCompositionException as err:
        m = re.search(r"In 'experiment/([\w-]+)': ConfigKeyError.*?Key '(\w+)' not in "
                      r"'(\w+)Conf'.*?full_key: ([\w.]+)", str(err), re.S)
        if m is None:
            return None
        preset, key, _, full = m.groups()
        group = full.rpartition(".")[0]
        chosen = next((a.partition("=")[2] for a in overrides
                       if a.partition("=")[0].lstrip("+~") == group), None)
        chosen_s = f"{group}={chosen}" if chosen is not None else f"the {group} chosen"
        return (f"hypergrad-run: experiment={preset} sets {full} for its own {group} option, "
                f"and {chosen_s} has no {key!r}: a preset's settings are made for "
                f"the options it chooses. Run the preset with its own {group}, or copy "
                f"{CONFIG_DIR / 'experiment' / (preset + '.yaml')} into a config folder of "
                f"your own under a name of its own, without {full}, with the preset's "
                f"experiment_outer/{preset}_<optimizer>.yaml files as <its name>_<optimizer>"
                f".yaml, and run it with --config-dir <that folder> "
                f"experiment=<its name> (docs/configs.md)"
                + (" (experiment=online_digits is the bundled online preset)"
                   if group == "mode" and chosen == "online" else "") + ".")
    except Exception:  # noqa: BLE001 - any other failure: Hydra's message stands alone
        return None
    return None


if __name__ == "__main__":
    main()
