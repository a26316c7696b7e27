"""What happens beside the Trainer's loop: messages, progress, TensorBoard, your own code.

A :class:`Callback` gets the Trainer and an event: ``on_fit_start``, ``on_inner_step`` (every
inner step the Trainer itself runs: the hypergradient's inner run offline with a method the
Trainer steps (forward mode, HD, MARTHE; reverse mode and implicit differentiation take theirs
in one call, with no such event), the run online; not the plain runs of the search),
``on_outer_step`` (a copy of the record written to ``metrics.jsonl``, after its checkpoint: a
callback observes, and one that changes ``trainer.lam`` is refused), ``on_message`` (a line
of text), ``on_fit_end`` (the :class:`~hypergrad.TrainResult`). Only the process that writes (rank 0
under torchrun) calls them. :func:`default_callbacks` gives :class:`Log` (messages to ``print``)
and :class:`Progress`; a list passed to the Trainer is added to them, and replaces the default
of its own type (``Log(None)`` silences the messages).
"""

from __future__ import annotations

import math
import numbers
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import HypergradWarning

__all__ = ["Callback", "Log", "Progress", "TensorBoard", "default_callbacks", "callbacks",
           "standard"]


class Callback:
    """Override the events you need; each gets the Trainer first. Callbacks observe the run: a
    hook that changes ``trainer.lam``, the outer optimizer's settings or state, or the
    problem's ``steps`` is refused (the step's checkpoint is written before the callbacks).
    A callback's own state is not checkpointed: rebuild it from ``trainer.history`` in
    :meth:`on_fit_start` where a resumed run must continue it (an early stopper's count)."""

    def on_fit_start(self, trainer: Any) -> None:
        """Before the first outer step of a ``fit()`` call."""

    def on_inner_step(self, trainer: Any, step: int, total: int) -> None:
        """After inner step ``step`` (1-based) of ``total``, in a hypergradient's inner run
        (or online's one run) of a method the Trainer steps itself: forward mode, MARTHE and
        HD (``hypergrad.OnlineMethod``). Reverse mode, implicit differentiation and finite
        differences take a hypergradient in one call and never call it; nor do the default
        search's plain runs, or the run of a second batch order."""

    def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
        """After an outer step, with a copy of its record (as in ``metrics.jsonl``)."""

    def on_message(self, trainer: Any, text: str) -> None:
        """A message for the user (also before :meth:`on_fit_start`: the Trainer's notes while
        it is built and starts)."""

    def on_fit_end(self, trainer: Any, result: Any) -> None:
        """When ``fit()`` returns (also after a divergence): ``result`` its
        :class:`~hypergrad.TrainResult`; ``None`` when ``fit()`` raised (the error goes on to
        the caller after every callback's ``on_fit_end``)."""


class Log(Callback):
    """Messages to ``fn`` (default ``print``; ``None``: nowhere; a file path: appended to that
    file, a line each; an open text file: written to it), each after ``prefix`` (a logger that
    names its source already, as ``hypergrad-run``'s does, takes ``prefix=""``)."""

    def __init__(self, fn: Callable[[str], Any] | str | os.PathLike[str] | Any | None = print,
                 prefix: str = "[hypergrad] ") -> None:
        if not isinstance(prefix, str):  # None failed at the first message: 'NoneType' + str
            raise TypeError(f"Log: prefix={prefix!r} must be a str ('' for none).")
        if isinstance(fn, (str, os.PathLike)):
            path = Path(fn).expanduser()
            if not path.parent.is_dir():  # failed at the first message, in the run
                raise ValueError(f"Log: the folder of {str(path)!r} does not exist; create it "
                                 f"first (Log appends lines to the file, making the file only).")

            def append(text: str) -> None:
                with path.open("a") as fh:
                    fh.write(text + "\n")

            append.__name__ = str(path)
            fn = append
        elif fn is not None and not callable(fn) and callable(getattr(fn, "write", None)):
            stream = fn

            def write(text: str) -> None:
                stream.write(text + "\n")
                stream.flush()

            write.__name__ = getattr(stream, "name", "stream")
            fn = write
        elif fn is not None and not callable(fn):  # failed at the run's last message: lost
            raise TypeError(f"Log: fn={fn!r} must be a callable taking a line (print, "
                            f"logging.info), a file path, an open text file, or None.")
        self.fn, self.prefix = fn, prefix

    def on_message(self, trainer: Any, text: str) -> None:
        if self.fn is not None:
            self.fn(self.prefix + text)

    def __repr__(self) -> str:
        return f"Log({getattr(self.fn, '__name__', self.fn)})"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _planned(trainer: Any) -> int | None:
    """The outer steps an offline run plans: ``Offline(outer_steps)``, or the default's
    count without a time budget; ``None`` when the time budget ends the run."""
    n = trainer.mode.steps(trainer.guards.time_budget)
    return None if math.isinf(n) else int(n)


class Progress(Callback):
    """tqdm bars for the outer and inner loops when stderr is a terminal; otherwise one message
    per outer step, so log files get no escape codes. ``enabled=False``: neither."""

    def __init__(self, enabled: bool = True) -> None:
        if not isinstance(enabled, (bool, int)):
            # Progress("no") was enabled: bool("no") is True
            raise TypeError(f"Progress: enabled={enabled!r} must be True or False.")
        self.enabled = bool(enabled)
        self._outer: Any = None
        self._inner: Any = None

    def _bar(self, total: int | None, initial: int, desc: str, leave: bool) -> Any:
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, leave=leave, dynamic_ncols=True)

    def on_fit_start(self, trainer: Any) -> None:
        self.tty = self.enabled and _isatty(sys.stderr)
        if not self.tty:
            return
        if trainer.mode.online:
            self._inner = self._bar(trainer.problem.steps, trainer.inner_step,
                                    f"inner (online, {trainer.method.name})", True)
        else:
            self._outer = self._bar(_planned(trainer), trainer.outer_step, "outer", True)

    def on_inner_step(self, trainer: Any, step: int, total: int) -> None:
        if not self.tty:
            return
        if self._inner is None:
            self._inner = self._bar(total, step - 1, "inner", False)
        self._inner.update()
        if step == total and not trainer.mode.online:
            self._inner.close()
            self._inner = None

    def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
        if self.tty:
            bar = self._inner if trainer.mode.online else self._outer
            if bar is not None:
                if not trainer.mode.online:
                    bar.update()
                bar.set_postfix(val=f"{record['val_loss']:.4g}")
            return
        if not self.enabled:
            return
        if trainer.mode.online:
            where = f"inner step {record['inner_step']}/{trainer.problem.steps}"
        else:
            planned = _planned(trainer)
            where = (f"outer step {record['outer_step']}/{planned}" if planned is not None
                     else f"outer step {record['outer_step']} (until the time budget)")
        trainer.message(f"{where}: val_loss {record['val_loss']:.4g}, "
                        f"|dE/dlam| {record['hypergrad_norm']:.3g}, {record['seconds']:.1f} s")

    def on_fit_end(self, trainer: Any, result: Any) -> None:
        for bar in (self._inner, self._outer):
            if bar is not None:
                bar.close()
        self._inner = self._outer = None

    def __repr__(self) -> str:
        return f"Progress(enabled={self.enabled})"


class TensorBoard(Callback):
    """TensorBoard logs in ``<run folder>/tb`` (needs a run folder and the ``tensorboard``
    package: ``pip install hypergrad-forward[tensorboard]``): per outer step (the x axis), the
    validation loss, the hypergradient's norm, the seconds, the task's metrics and every
    hyperparameter's value under its name (``hyperparams/lr[steps 0-59]``, per tensor by the
    parameter's name; a vector of more than ``max_values`` values as its min, mean and max);
    at the end, the learned point in the HParams view with its validation loss. A resumed run
    hides the points of the run before it from its first repeated step on (``purge_step``)."""

    def __init__(self, max_values: int = 64) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # depends on the environment
            raise ImportError("TensorBoard needs the tensorboard package: pip install "
                              "tensorboard (or pip install hypergrad-forward[tensorboard]).") from e
        if (isinstance(max_values, bool) or not isinstance(max_values, numbers.Integral)
                or max_values < 1):
            raise ValueError(f"TensorBoard: max_values={max_values!r} must be an int >= 1 (a "
                             f"vector of more values is logged as its min, mean and max), e.g. "
                             f"TensorBoard(max_values=64).")
        self._writer_class: Any = SummaryWriter
        self.max_values: int = int(max_values)
        self.writer: Any = None

    def on_fit_start(self, trainer: Any) -> None:
        if trainer.folder is None:
            raise ValueError("TensorBoard: the Trainer has no run folder to write to; pass "
                             "folder=RunFolder(...).")
        # a resumed run repeats what its checkpoint did not hold (after checkpoint.prev.pt, an
        # outer step): TensorBoard drops the killed run's points from the next one on
        last = trainer.history[-1] if trainer.history else None
        purge = 0 if last is None else int(last.get("inner_step", last["outer_step"])) + 1
        _after_earlier_files(trainer.folder.path / "tb")
        self.writer = self._writer_class(str(trainer.folder.path / "tb"), purge_step=purge)

    def _named(self, trainer: Any, values: dict[str, Any]) -> dict[str, float]:
        from ..hyperparams import HyperParams

        hps, out = trainer.problem.hyperparams, {}
        for it in hps.items:
            named = HyperParams([it]).named({it.name: values[it.name]}, trainer.problem.steps)
            if len(named) > self.max_values:
                xs = list(named.values())
                named = {f"{it.name}/min": min(xs), f"{it.name}/mean": sum(xs) / len(xs),
                         f"{it.name}/max": max(xs)}
            out.update(named)
        return out

    def on_outer_step(self, trainer: Any, record: dict[str, Any]) -> None:
        if self.writer is None:
            return
        step = record["inner_step"] if "inner_step" in record else record["outer_step"]
        for k, v in record.items():
            if (k not in ("outer_step", "inner_step", "elapsed") and isinstance(v, (int, float))
                    and not isinstance(v, bool)):
                self.writer.add_scalar(k, v, step)
        for name, v in self._named(trainer, record["hyperparams"]).items():
            self.writer.add_scalar(f"hyperparams/{name}", v, step)
        # on disk with the step's checkpoint: a run killed later lost this step's queued
        # scalars for good (the resume purges from the next step on)
        self.writer.flush()

    def on_fit_end(self, trainer: Any, result: Any) -> None:
        if self.writer is None:
            return
        if result is not None and result.best_val_loss is not None:
            # the run's one result: a resumed or extended run's earlier entry stayed beside it
            shutil.rmtree(Path(self.writer.log_dir) / "learned", ignore_errors=True)
            self.writer.add_hparams(self._named(trainer, result.values),
                                    {"hparam/learned_val_loss": result.best_val_loss},
                                    run_name="learned")
        self.writer.close()
        self.writer = None


def _after_earlier_files(folder: Path) -> None:
    """Wait until the clock's second is past every TensorBoard event file's in ``folder`` (at
    most a second): the files are read in name order, and a name holds the second and a
    counter, so a run resumed in the same process and second (counter 11 after 9) was read
    first, and the earlier file's steps then purged the resumed run's."""
    stamps = []
    for f in folder.glob("events.out.tfevents.*"):
        try:
            stamps.append(int(f.name.split(".")[3]))
        except (IndexError, ValueError):
            continue
    if stamps:
        wait = max(stamps) + 1 - time.time()
        if 0 < wait <= 1.0:
            time.sleep(wait + 0.01)


def default_callbacks() -> list[Callback]:
    """``[Log(), Progress()]``."""
    return [Log(), Progress()]


def callbacks(given: Iterable[Callback] | None) -> list[Callback]:
    """The defaults, each replaced by a given callback of its own type (a subclass too: a
    ``class MyLog(Log)`` left the default ``Log`` printing beside it), then the given ones."""
    if isinstance(given, (Callback, str)):  # 'Log' object is not iterable; a str's letters
        raise TypeError(f"Trainer: callbacks={given!r} must be a list of Callback objects, "
                        f"e.g. callbacks=[hypergrad.run.Log(None)]"
                        + (f" or callbacks=[{given!r}]." if isinstance(given, Callback) else "."))
    extra = list(given or [])
    hooks = {n for n in vars(Callback) if n.startswith("on_")}
    for cb in extra:
        if not isinstance(cb, Callback):
            raise TypeError(f"Trainer: callbacks must be Callback objects (Log, Progress, "
                            f"TensorBoard, or a subclass of hypergrad.Callback), got "
                            f"{type(cb).__name__} {cb!r}.")
        stray = sorted(n for klass in type(cb).__mro__ if klass is not object
                       for n in vars(klass) if n.startswith("on_") and n not in hooks)
        if stray:  # a misspelt hook is never called, without a word
            warnings.warn(HypergradWarning(
                f"Trainer: callback {type(cb).__name__} defines {stray}, which no run calls: "
                f"the hooks are {sorted(hooks)}; rename it to one of them (or drop the 'on_' "
                f"prefix of a helper)."), stacklevel=3)
    kept = [d for d in default_callbacks() if not any(isinstance(c, type(d)) for c in extra)]
    return kept + extra


def standard(progress: bool = True, tensorboard: bool = False) -> list[Callback]:
    """The callbacks ``hypergrad-run`` chooses from its config (``callbacks.progress``,
    ``callbacks.tensorboard``)."""
    out: list[Callback] = [Progress(progress)]
    if tensorboard:
        out.append(TensorBoard())
    return out
