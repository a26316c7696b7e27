"""Batch sources: deterministic mini-batches by step (:class:`MiniBatches`), and a DataLoader
read lazily, one pass per inner run (:class:`Stream`).

A :class:`MiniBatches` (or any sequence or callable ``t -> batch``) gives step ``t`` the same
batch in every run: nothing is stored and every method reads it by index.

A :class:`Stream` wraps an iterable that starts a fresh pass on each ``iter()`` (a
``torch.utils.data.DataLoader``): each inner run reads its own pass lazily, batch ``t`` when step
``t`` needs it, so shuffling and random augmentation are redrawn per inner run and a method that
does not replay steps holds one batch at a time (memory independent of T). Every pass is fixed
by a seed (see :class:`Stream`), so a pass can be read again bit for bit: by finite differences
and checks (:meth:`Stream.fixed`), and by a resumed run (:meth:`Stream.state_dict`).

:func:`split_validation` splits a validation set in two: one part for ``val_loss`` (the
hypergradients fit it), one held out for ``select_loss`` (the Trainer chooses its result on it).
"""

from __future__ import annotations

import contextlib
import math
import operator
import random
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

from .errors import HypergradWarning, UnseededRandomnessWarning
from .rng import step_seed

__all__ = ["MiniBatches", "Stream", "split_validation"]


def partial_last_batch(source: Any) -> tuple[int, int, int] | None:
    """``(examples of an epoch, batch_size, the last batch's size)`` of a DataLoader that keeps
    a partial last batch (``drop_last=False``, a ``batch_size``, and ``len(sampler)`` not a
    multiple of it); ``None`` for any other source."""
    try:
        n = len(source.sampler)  # the examples of an epoch (a subset sampler's too)
    except (AttributeError, TypeError):
        return None
    bs = getattr(source, "batch_size", None)
    if (not isinstance(bs, int) or getattr(source, "drop_last", True)
            or getattr(source, "batch_sampler", None) is None or n % bs == 0):
        return None
    return n, bs, n % bs


def _check_tensors(who: str, tensors: tuple[Any, ...]) -> None:
    """Refuse what is not a tensor with at least one dimension, naming it and the fix (a tuple
    of tensors passed as one argument, a NumPy array, a scalar)."""
    example = f"{who}(x, y, ...)"
    if not tensors:
        raise TypeError(f"{who}: give at least one tensor, e.g. {example}.")
    for i, t in enumerate(tensors):
        if isinstance(t, Tensor) and t.ndim >= 1:
            continue
        if isinstance(t, (tuple, list)):
            fix = (f"pass the tensors as separate arguments, {example} (or {who}(*pair, ...))"
                   if t and all(isinstance(u, Tensor) for u in t)
                   else "give torch tensors, one per argument")
        elif isinstance(t, np.ndarray):
            fix = "convert it with torch.as_tensor(a) (and the dtype the model uses)"
        elif isinstance(t, Tensor):
            fix = "give a tensor with one row per example (its first dimension)"
        else:
            fix = "give torch tensors with one row per example"
        shape = f" of shape {tuple(t.shape)}" if isinstance(t, Tensor) else ""
        raise TypeError(f"{who}: argument {i} is {type(t).__name__}{shape}, not a tensor with "
                        f"one row per example: {fix}.")
    devices = [t.device for t in tensors]
    if len(set(devices)) > 1:  # a batch would mix devices; indexing fails on some
        where = ", ".join(f"argument {i} on {d}" for i, d in enumerate(devices))
        raise ValueError(f"{who}: the tensors are on different devices ({where}); move them to "
                         f"the device the model trains on first, e.g. {who}(x.to(dev), "
                         f"y.to(dev), ...).")


def _int_seed(api: str, seed: Any) -> int:
    """``seed`` as a Python int (NumPy integers too); a float, str or bool is refused."""
    try:
        if not isinstance(seed, bool):
            return operator.index(seed)
    except TypeError:
        pass
    raise TypeError(f"{api}: seed={seed!r} must be an int (e.g. seed=0).")


class MiniBatches:
    """Callable ``t -> (*tensors[idx], idx)``: shuffled epochs drawn from ``seed``.

    Step ``t`` reads batch ``t % per_epoch`` of epoch ``t // per_epoch``; each epoch's permutation
    comes from a hash of ``(seed, epoch)`` (:func:`hypergrad.rng.step_seed`), so batches are
    reproducible without storing them, and nearby seeds give unrelated orders (before
    2026-11-27 the epoch's seed was ``seed + epoch``: seed ``s + 1`` read seed ``s``'s batches
    one epoch later). ``idx`` (the
    example indices, int64) lets a loss read per-example hyperparameters.

    Args:
        tensors: tensors with the same first dimension ``n``.
        batch_size: examples per batch (the last partial batch of an epoch is dropped).
        seed: seed of the shuffles; ``shuffle=False`` keeps the data order.
    """

    def __init__(self, *tensors: Tensor, batch_size: int, seed: int = 0,
                 shuffle: bool = True) -> None:
        _check_tensors("MiniBatches", tensors)
        n = tensors[0].shape[0]
        for i, t in enumerate(tensors):
            if t.shape[0] != n:
                raise ValueError(
                    f"MiniBatches: tensor {i} has {t.shape[0]} rows, tensor 0 has {n}; all "
                    f"tensors need the same first dimension."
                )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size:
            raise ValueError(f"MiniBatches: batch_size={batch_size!r} must be an int >= 1.")
        if n == 0:  # else: 'batch_size=25 is larger than the 0 examples; use batch_size <= 0'
            raise ValueError(
                f"MiniBatches: the training data has 0 examples (tensor 0 has shape "
                f"{tuple(tensors[0].shape)}): an empty file, or a split that left no rows for "
                f"training.")
        if batch_size > n:
            raise ValueError(
                f"MiniBatches: batch_size={batch_size} is larger than the {n} examples; use "
                f"batch_size <= {n}."
            )
        seed = _int_seed("MiniBatches", seed)
        if not isinstance(shuffle, bool):
            raise TypeError(f"MiniBatches: shuffle={shuffle!r} must be True or False.")
        self.tensors = tensors
        self.n = n
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.per_epoch = n // batch_size
        if not shuffle and n % batch_size:  # shuffled, each epoch drops others
            warnings.warn(
                f"MiniBatches: {n} examples in batches of {batch_size} without shuffling: the "
                f"last partial batch is dropped in every epoch, so examples "
                f"{n - n % batch_size}-{n - 1} are never read (a per-example weight of theirs "
                f"gets a hypergradient of 0). Use a batch size that divides {n}, or "
                f"shuffle=True.", UserWarning, stacklevel=2)
        self._perm: tuple[tuple[int, int], Tensor] | None = None

    def indices(self, t: int) -> Tensor:
        epoch, i = divmod(t, self.per_epoch)
        if not self.shuffle:
            perm = torch.arange(self.n)
        elif self._perm is not None and self._perm[0] == (self.seed, epoch):
            perm = self._perm[1]
        else:  # the cache follows the seed too: a seed set afterwards draws its own orders
            g = torch.Generator().manual_seed(step_seed(self.seed, _SHUFFLES - epoch))
            perm = torch.randperm(self.n, generator=g)
            self._perm = ((self.seed, epoch), perm)
        return perm[i * self.batch_size:(i + 1) * self.batch_size]

    def read_counts(self, steps: Iterable[int]) -> Tensor:
        """How many times each example is read by the steps ``steps``: ``(n,)`` int64 (for
        per-example weights that no step reads, and objectives that are not whole epochs)."""
        idx = [self.indices(t) for t in steps]
        if not idx:
            return torch.zeros(self.n, dtype=torch.long)
        return torch.bincount(torch.cat(idx), minlength=self.n)

    def __call__(self, t: int) -> tuple[Tensor, ...]:
        idx = self.indices(t)
        dev = self.tensors[0].device
        idx_d = idx.to(dev)
        return (*(x[idx_d] for x in self.tensors), idx_d)


_SHUFFLES = -5_000_001  # the stream of MiniBatches' epoch seeds, apart from the steps' streams
_PASSES = -7_000_001  # the stream of pass seeds, apart from the steps' streams (hypergrad.rng)
_PROBE = -1  # the pass the checks read (first_batch), never a run's
_PROBE_OTHER = -2  # a second such pass: do passes of other seeds differ (Stream.varies)


_SAMPLED = 4096
"""How many entries of a tensor :func:`batch_fingerprint` weights by position."""


def batch_fingerprint(batch: Any) -> tuple[Any, ...] | None:
    """A summary of a mini-batch that tells two reads of it apart: each tensor's shape, dtype,
    sum (accumulated in float64, no copy of the tensor) and a position-weighted sum of at most
    :data:`_SAMPLED` evenly spaced entries (an order of examples changed); other leaves as they
    are. ``None`` where it cannot be taken (tensors without data). Taken once per pass of a
    stream: its memory stays small for a batch of images (a float64 copy and a ramp of a
    224x224 batch of 256 were 0.9 GB, on every pass)."""
    out: list[Any] = []
    try:
        for x in tree_flatten(batch)[0]:
            if not isinstance(x, Tensor):
                out.append(x if isinstance(x, (int, float, str, bool, type(None))) else
                           type(x).__name__)
                continue
            v = x.detach()
            if v.is_complex():
                v = torch.view_as_real(v)
            if v.dtype == torch.bool:
                v = v.to(torch.uint8)
            v = v.flatten()
            n = v.numel()
            k = min(n, _SAMPLED)  # evenly spaced, in integers: float32 positions round past
            at = torch.arange(k, device=v.device) * max(n - 1, 0) // max(k - 1, 1)  # 2**24
            sample = v[at].double()
            ramp = torch.arange(1, sample.numel() + 1, dtype=sample.dtype, device=v.device)
            out.append((tuple(x.shape), x.dtype, float(v.nansum(dtype=torch.float64)),
                        float((sample * ramp).nansum())))
    except Exception:  # noqa: BLE001 - fake or meta tensors: nothing to compare
        return None
    return tuple(out)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """The body with torch's CPU generator, Python's ``random`` and NumPy's global generator
    seeded by ``seed``; the caller's states restored afterwards."""
    cpu = torch.random.default_generator
    saved = cpu.get_state()
    py = random.getstate()
    npy = np.random.get_state()
    cpu.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    try:
        yield
    finally:
        cpu.set_state(saved)
        random.setstate(py)
        np.random.set_state(npy)


def _generators(source: Any) -> list[torch.Generator]:
    """The generators a DataLoader's iteration draws from besides the global one: its own
    ``generator`` (the sampler's shuffle, the workers' base seed) and its sampler's."""
    found: list[torch.Generator] = []
    sampler = getattr(source, "sampler", None)
    batch_sampler = getattr(source, "batch_sampler", None)
    for g in (getattr(source, "generator", None), getattr(sampler, "generator", None),
              getattr(getattr(batch_sampler, "sampler", None), "generator", None)):
        if isinstance(g, torch.Generator) and not any(g is h for h in found):
            found.append(g)
    return found


def _why_empty(source: Any) -> str:
    """Why a DataLoader yields nothing, where its settings say (else ``""``)."""
    try:
        n = len(source.dataset)
    except (AttributeError, TypeError):
        return ""
    if n == 0:
        return " The DataLoader's dataset has 0 examples."
    bs = getattr(source, "batch_size", None)
    if getattr(source, "drop_last", False) and isinstance(bs, int) and bs > n:
        return (f" The DataLoader has drop_last=True and batch_size={bs}, but its dataset has "
                f"{n} examples, so its only batch is dropped: use batch_size <= {n} or "
                f"drop_last=False.")
    return ""


def _epoch_samplers(source: Any) -> list[Any]:
    """The samplers of a DataLoader that shuffle by an epoch set from outside
    (``set_epoch``, as ``DistributedSampler``): without it, every pass has one order."""
    found: list[Any] = []
    for smp in (getattr(source, "sampler", None),
                getattr(getattr(source, "batch_sampler", None), "sampler", None)):
        if callable(getattr(smp, "set_epoch", None)) and not any(smp is f for f in found):
            found.append(smp)
    return found


class _Pass:
    """One pass over a stream's source: its seed, the iterator, the index of the next batch
    it yields, the last batch read and the batches kept (steps ``>= keep_from``)."""

    def __init__(self, stream: Stream, seed: int, keep_from: int | None = None) -> None:
        self.stream, self.seed, self.keep_from = stream, seed, keep_from
        self.it: Iterator[Any] | None = None
        self.pos = 0  # the step of the next batch the iterator yields
        self.epoch = 0  # how many times the source ran out in this pass
        self.in_epoch = 0
        self.last: tuple[int, Any] | None = None
        self.kept: dict[int, Any] = {}

    def get(self, t: int) -> Any:
        if t in self.kept:
            return self.kept[t]
        if self.last is not None and self.last[0] == t:
            return self.last[1]
        if t < self.pos:  # read again from the start: the same seed gives the same batches
            self.close()
            self.pos, self.epoch, self.last = 0, 0, None
            self.stream.replays += 1
        while self.pos <= t:
            b = self._next()
            if self.pos == 0:
                self.stream._check_repeat(self.seed, b)
            if self.keep_from is not None and self.pos >= self.keep_from:
                self.kept[self.pos] = b
            self.last = (self.pos, b)
            self.pos += 1
        assert self.last is not None
        return self.last[1]

    def _next(self) -> Any:
        src = self.stream.source
        while True:
            if self.it is None:
                s = step_seed(self.seed, -(self.epoch + 2))
                with _seeded(s):
                    for g in _generators(src):
                        g.manual_seed(s ^ 0x5DEECE66D)
                    for sampler in _epoch_samplers(src):  # DistributedSampler: seed + epoch
                        sampler.set_epoch(s & 0x7FFFFFFF)
                    self.it = iter(src)
                self.stream._check_fresh(self.it)
                self.in_epoch = 0
            try:
                with _seeded(step_seed(self.seed, self.pos)):
                    b = next(self.it)
            except StopIteration:
                self.it = None
                if self.in_epoch == 0:
                    raise self._empty() from None
                self.epoch += 1
                continue
            self.in_epoch += 1
            self.stream.reads += 1
            self.stream._watch_batch(b)
            return b

    def _empty(self) -> ValueError:
        if self.pos == 0 and self.stream.reads == 0:
            return ValueError(f"InnerProblem: batches yielded no mini-batch; give at least "
                              f"one.{_why_empty(self.stream.source)}")
        return ValueError(
            f"InnerProblem: batches ran out after {self.pos} mini-batches of this pass and "
            f"iterating it again gave none ({type(self.stream.source).__name__} is used up "
            f"after one pass). Every inner run reads its batches from a fresh iter(): pass a "
            f"list of batches, a callable t -> batch (e.g. hypergrad.data.MiniBatches), or an "
            f"iterable that starts a new pass on each iter() (a DataLoader).")

    def close(self) -> None:
        self.it = None  # a DataLoader's iterator shuts its workers down when collected


def _warn_unsharded(loader: Any, workers: Any) -> None:
    """Warn where a DataLoader's workers each read a whole ``IterableDataset``: every worker
    iterates its own copy, so with ``n`` workers each example comes ``n`` times a pass, unless
    the dataset splits its stream by ``torch.utils.data.get_worker_info()`` (in ``__iter__``
    or a ``worker_init_fn``). PyTorch says nothing, and the hypergradients were of a problem
    with every batch doubled (the DataLoader probe)."""
    from torch.utils.data import IterableDataset

    ds = getattr(loader, "dataset", None)
    if (not isinstance(ds, IterableDataset) or not isinstance(workers, int) or workers < 2
            or getattr(loader, "worker_init_fn", None) is not None):
        return
    names: set[str] = set()
    codes = [code for klass in type(ds).__mro__ if not klass.__module__.startswith("torch")
             for attr in vars(klass).values()
             if (code := getattr(getattr(attr, "__func__", attr), "__code__", None))]
    while codes:  # the methods' names, and those of the functions in them
        code = codes.pop()
        names |= set(code.co_names)
        codes += [c for c in code.co_consts if hasattr(c, "co_names")]
    if "get_worker_info" in names:
        return
    warnings.warn(
        f"InnerProblem: the DataLoader reads the IterableDataset {type(ds).__name__} with "
        f"num_workers={workers}, and its code never calls torch.utils.data.get_worker_info(): "
        f"each worker iterates its own copy of the stream, so every example comes "
        f"{workers} times a pass (PyTorch does not warn). Split the stream by worker in "
        f"__iter__ (info = get_worker_info(); take every info.num_workers-th item from "
        f"info.id), or in a worker_init_fn, or use num_workers=0 or 1.",
        HypergradWarning, stacklevel=_outside_level())


def _outside_level() -> int:
    """The ``stacklevel`` of its caller's ``warnings.warn`` that names the first frame outside
    hypergrad (the user's line: an InnerProblem built there, or a Stream)."""
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__)) + os.sep  # hypergrad/
    frame: Any = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame, level = frame.f_back, level + 1
    return level


class Stream:
    """A re-iterable batch source (a ``torch.utils.data.DataLoader``) read lazily, one pass per
    inner run. :class:`~hypergrad.InnerProblem` wraps any such ``batches`` in one; make it
    yourself to choose the seed.

    - **Lazily, per inner run.** :meth:`begin_pass` (called by
      :meth:`InnerProblem.begin_run <hypergrad.InnerProblem.begin_run>`, which every method
      and :meth:`InnerProblem.run <hypergrad.InnerProblem.run>` call when an inner run starts)
      starts a fresh pass: ``iter(source)``, iterated again when it runs out before T. Step ``t``
      reads batch ``t`` of the current pass when it asks for it. The last batch read is kept, so
      every evaluation of step ``t`` (a gradient and its Hessian-vector products) sees the same
      batch; a method that replays steps backwards asks the pass to keep the batches of those
      steps (``keep_from``) and drops them at the end (:meth:`release`). A step before the last
      one read and not kept is read again from the start of the same pass (the same batches).
    - **Every pass fixed by a seed.** Pass ``i`` has the seed :meth:`pass_seed` ``(i)``,
      drawn from ``seed`` with :func:`hypergrad.rng.step_seed` (a hash). Starting an epoch of
      a pass seeds the generators its ``iter()`` draws from: the source's own ``generator``
      and its sampler's (the shuffle, and the workers' base seed that a DataLoader draws from
      it per iterator), and torch's global
      CPU generator (the sampler's and the base seed's source when no generator is given);
      a sampler's epoch (``set_epoch``, as ``DistributedSampler``, whose shuffle follows it) is
      set from the same seed; reading each batch runs under torch's, Python's and NumPy's
      global generators seeded from the pass and the step (augmentation in the main process,
      ``num_workers=0``). Workers
      seed themselves from the base seed (``base_seed + worker_id``; then ``worker_init_fn``).
      The caller's global generator states are restored after each read. So a pass is a
      deterministic function of its seed, and the stream's random state is its seed and pass
      count: :meth:`state_dict`, which the :class:`~hypergrad.Trainer` puts in its checkpoints.
    - **Fixed passes.** Inside :meth:`fixed`, every run reads the same pass again (finite
      differences, :func:`~hypergrad.testing.hypergradcheck`).

    Args:
        batches: an iterable that starts a fresh pass on each ``iter()``: a ``DataLoader``
            (``persistent_workers=False``: persistent workers carry their random state from pass
            to pass), or your own class whose ``__iter__`` returns a new generator. A one-shot
            iterator (a generator) is refused.
        seed: the seed of the passes; ``None``: the problem's ``seed``.

    Attributes:
        passes: passes begun (the index of the next). reads: batches read from the source.
        replays: passes read again from their start to reach an earlier step.
    """

    def __init__(self, batches: Iterable[Any], seed: int | None = None) -> None:
        if isinstance(batches, Iterator):
            raise ValueError(
                f"InnerProblem: batches is a one-shot iterator ({type(batches).__name__}): it "
                f"can be read once, but every inner run (each hypergradient, each "
                f"finite-difference run, a resumed run) reads its batches from the start of a "
                f"fresh pass. Pass a list of batches, a callable t -> batch (e.g. "
                f"hypergrad.data.MiniBatches), or an iterable that starts a new pass on each "
                f"iter(): a torch DataLoader, or a class whose __iter__ returns a new "
                f"generator.")
        if not isinstance(batches, Iterable):
            raise TypeError(f"Stream: batches must be an iterable such as a DataLoader, got "
                            f"{type(batches).__name__}.")
        if getattr(batches, "persistent_workers", False):
            raise ValueError(
                "Stream: the DataLoader has persistent_workers=True: its workers keep their "
                "random state from one pass to the next, so a pass could not be read again "
                "(finite differences, a resumed run) with the same augmentation. Use "
                "persistent_workers=False (each inner run starts its workers, seeded from the "
                "pass).")
        workers: Any = getattr(batches, "num_workers", 0)
        if getattr(batches, "in_order", True) is False and workers:
            raise ValueError("Stream: the DataLoader has in_order=False: its batches come in "
                             "the order its workers finish them, which no seed fixes. Use "
                             "in_order=True (the default).")
        _warn_unsharded(batches, workers)
        if seed is not None:
            seed = _int_seed("Stream", seed)
        self.source = batches
        self.seed: int | None = seed
        self.passes = 0
        self.reads = 0
        self.replays = 0
        self._current: _Pass | None = None
        self._fixed: int | None = None
        self._first: list[Any] = []
        self._varies: bool | None = None  # passes of other seeds differ (varies())
        self._last_iter: Callable[[], Any] | None = None  # a weak reference
        self._zero: tuple[int, tuple[Any, ...] | None] | None = None
        """The seed of the last pass that read its batch 0, and that batch's
        :func:`batch_fingerprint` (:meth:`_check_repeat`)."""
        self._warned = False
        self._watch: list[tuple[Callable[[], Any], int, int]] = []
        """The tensors of the last batch read (weak references), with their version counters
        then (:meth:`_watch_batch`)."""

    def _watch_batch(self, batch: Any) -> None:
        """Refuse a source whose last batch changed in place while the next one was read (or
        since: a loss that writes it), then watch ``batch``'s tensors: a loader that reuses
        its buffers overwrote every batch kept for a replay (reverse mode's, the checks')."""
        for ref, version, i in self._watch:
            x = ref()
            if x is None or x._version == version:
                continue
            raise ValueError(
                f"InnerProblem: a mini-batch read from batches ({type(self.source).__name__}) "
                f"changed in place after it was read (its tensor {i}, shape {tuple(x.shape)}): "
                f"the source writes the next batch into the same tensors (preallocated "
                f"buffers), or train_loss writes the batch in place (e.g. x.div_(255)). The "
                f"batches kept for the steps that are evaluated again (reverse mode's way back, "
                f"the checks) then hold other data, and the hypergradient is wrong without an "
                f"error (reverse mode -0.0232 against forward 0.0085 on a small problem, "
                f"measured). Yield new tensors for every batch (e.g. yield x.clone(), "
                f"y.clone()), and transform a batch out of place in train_loss (x = x / 255).")
        watch: list[tuple[Callable[[], Any], int, int]] = []
        for i, x in enumerate(tree_flatten(batch)[0]):
            if isinstance(x, Tensor):
                try:
                    watch.append((weakref.ref(x), x._version, i))
                except (TypeError, RuntimeError):  # inference tensors keep no version
                    continue
        self._watch = watch

    def _check_repeat(self, seed: int, batch: Any) -> None:
        """Batch 0 of a pass read again from its seed (a fixed pass, a replay, the checks'
        pass) must be the batch read before: warn once where it is not (the source draws
        randomness that the pass's seed does not fix)."""
        fp = batch_fingerprint(batch)
        if self._zero is None or self._zero[0] != seed:
            self._zero = (seed, fp)
            return
        if fp is None or self._zero[1] is None or fp == self._zero[1] or self._warned:
            return
        self._warned = True
        warnings.warn(
            f"InnerProblem: batches ({type(self.source).__name__}) gave another mini-batch 0 "
            f"when a pass was read again from its seed: the source draws randomness that "
            f"hypergrad does not seed per pass (a numpy.random.default_rng, random.Random or "
            f"torch.Generator of its own, or state that reading changes). Finite differences "
            f"and hypergrad.testing.hypergradcheck read one pass again for every run, so they "
            f"compare runs on other batches (forward 63 % off reverse on a fixed pass of a small "
            f"problem with NumPy augmentation, measured), and a resumed run does not repeat. "
            f"Draw augmentation from torch's, NumPy's or Python's global generator (np.random."
            f"normal, random.random, torch.randn without generator=), which every pass seeds. "
            f"A sampler of your own that shuffles with a NumPy or Python generator of its own: "
            f"shuffle with a torch.Generator held as its `generator` attribute (a pass seeds "
            f"the DataLoader's and its sampler's `generator`), or DataLoader(shuffle=True).",
            UnseededRandomnessWarning, stacklevel=2)

    def _check_fresh(self, it: Any) -> None:
        """Refuse a source whose ``iter()`` returned the iterator of an earlier pass again (its
        ``__iter__`` returns a stored iterator): each pass would go on where the last one
        stopped, so no pass could be read again and the methods would see other batches."""
        if self._last_iter is not None and self._last_iter() is it:
            raise ValueError(
                f"InnerProblem: iter(batches) returned the same {type(it).__name__} twice: "
                f"{type(self.source).__name__}.__iter__ returns a stored iterator, so every "
                f"inner run would go on where the last one stopped instead of reading a pass "
                f"from its start, and forward mode, reverse mode and finite differences would "
                f"see other batches (70 % apart on a small problem, measured). Make __iter__ "
                f"start a new pass each call (a generator function: def __iter__(self): yield "
                f"from ...), or pass a list of batches or a callable t -> batch (e.g. "
                f"hypergrad.data.MiniBatches).")
        try:
            self._last_iter = weakref.ref(it)
        except TypeError:  # no weak references to it: nothing to compare
            self._last_iter = None

    def _seed(self) -> int:
        return 0 if self.seed is None else self.seed

    def pass_seed(self, i: int) -> int:
        """The seed of pass ``i``."""
        return step_seed(step_seed(self._seed(), _PASSES), i)

    def begin_pass(self, keep_from: int | None = None) -> int:
        """Start a new pass (inside :meth:`fixed`: the fixed one again, from its start); keep
        the batches of steps ``>= keep_from`` (``None``: only the last one read). Returns the
        pass's seed. Nothing is read until a step asks."""
        if self._current is not None:
            self._current.close()
        if self._fixed is not None:
            seed = self._fixed
        else:
            seed = self.pass_seed(self.passes)
            self.passes += 1
        self._current = _Pass(self, seed, keep_from)
        return seed

    def release(self) -> None:
        """Drop the kept batches of the current pass (the last one read stays)."""
        if self._current is not None:
            self._current.kept = {}
            self._current.keep_from = None

    @property
    def fixed_seed(self) -> int | None:
        """The seed of the pass every pass begun repeats (inside :meth:`fixed`), else None."""
        return self._fixed

    @contextlib.contextmanager
    def fixed(self, seed: int | None = None) -> Iterator[int]:
        """Inside, every pass begun is the same pass, read from its start: ``seed``, or the
        next pass of the sequence (drawn once); nested, the outer one. Yields its seed."""
        prior = self._fixed
        if seed is None:
            if prior is not None:
                seed = prior
            else:
                seed = self.pass_seed(self.passes)
                self.passes += 1
        self._fixed = seed
        try:
            yield seed
        finally:
            self._fixed = prior

    def batch(self, t: int) -> Any:
        """Batch ``t`` of the current pass (before any pass has begun: of the checks' pass)."""
        if self._current is None:
            self._current = _Pass(self, self.pass_seed(_PROBE))
        return self._current.get(t)

    def first_batch(self) -> Any:
        """Batch 0 of a pass of its own with a fixed seed, the same whatever runs have read:
        what the checks and a run folder's fingerprint look at. Read once and kept."""
        if not self._first:
            probe = _Pass(self, self.pass_seed(_PROBE))
            self._first.append(probe.get(0))
            probe.close()
            # read again from its seed: a source drawing randomness no pass seeds (a
            # torch.Generator held by the Dataset) is warned of here, where only a fixed pass
            # or a replay read one again, which an offline forward-mode Trainer never does:
            # its resumed run differed from the straight one without a word (the workers probe)
            again = _Pass(self, self.pass_seed(_PROBE))
            again.get(0)
            again.close()
        return self._first[0]

    def probe_batches(self, steps: int) -> Iterator[tuple[int, Any]]:
        """Steps ``1 .. steps - 1`` and their batches, of a pass like :meth:`first_batch`'s (the
        checks' own, apart from every run's): what a check of later steps reads."""
        probe = _Pass(self, self.pass_seed(_PROBE))
        try:
            for t in range(1, steps):
                yield t, probe.get(t)
        finally:
            probe.close()

    def varies(self) -> bool:
        """Whether passes of other seeds read other batches: batch 0 of a second probe pass
        against :meth:`first_batch`'s (a shuffle or augmentation changes it; a ``DataLoader``
        with ``shuffle=False`` and no random transform reads the same data every pass, so
        runs in other batch orders, :meth:`InnerProblem.variant
        <hypergrad.InnerProblem.variant>`, would be the same run). Judged once and kept;
        ``True`` where batches cannot be compared (fake tensors)."""
        if self._varies is None:
            first = batch_fingerprint(self.first_batch())
            probe = _Pass(self, self.pass_seed(_PROBE_OTHER))
            other = batch_fingerprint(probe.get(0))
            probe.close()
            self._varies = first is None or other is None or first != other
        return self._varies

    def state_dict(self) -> dict[str, Any]:
        """The random state of the passes: the seed, the passes begun and the current pass's
        seed (a checkpoint field: plain ints)."""
        cur = self._current
        return {"seed": self.seed, "passes": self.passes,
                "current": None if cur is None or cur.seed == self.pass_seed(_PROBE)
                else cur.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next pass is the one that came next there, and
        the current pass is read again from its start as far as a step asks (a resumed online
        run continues the pass it was in)."""
        if self._current is not None:
            self._current.close()
        self.passes = int(state["passes"])
        cur = state.get("current")
        self._current = None if cur is None else _Pass(self, int(cur))

    def describe(self) -> dict[str, Any]:
        """What the source's settings are, for a run folder's fingerprint: the class, and a
        DataLoader's batch size, ``drop_last``, workers, sampler, examples and the functions
        it calls. A resumed run read with 3 workers where it was run with 2 trained on other
        augmented batches from batch 2 on (worker k augments batches k, k + n, ...), and the
        first batch, the one the fingerprint reads, was the same (the workers probe)."""
        src = self.source
        out: dict[str, Any] = {"class": f"{type(src).__module__}.{type(src).__qualname__}"}
        for key in ("batch_size", "drop_last", "num_workers"):
            if hasattr(src, key):
                out[key] = getattr(src, key)
        sampler = getattr(src, "sampler", None)
        if sampler is not None:
            out["sampler"] = type(sampler).__qualname__
            try:
                out["examples"] = len(sampler)
            except TypeError:
                pass
        for key in ("worker_init_fn", "collate_fn"):
            fn = getattr(src, key, None)
            if fn is not None:
                out[key] = getattr(fn, "__qualname__", type(fn).__qualname__)
        return out

    def describe_dataset(self) -> dict[str, Any] | None:
        """What a DataLoader's Dataset is beyond the first batch, for a run folder's
        fingerprint: its class, the code of its own ``__getitem__`` / ``__iter__`` and of the
        functions it holds, its plain settings (numbers, strings) and a summary of its tensors
        (shape, dtype, sum). An augmentation changed between a run and its resume (a clamp
        added, a noise scale) that the first batch did not show went on silently, the run
        mixing the two (the online probe, 2026-12-07 evening). ``None`` without a dataset."""
        ds = getattr(self.source, "dataset", None)
        if ds is None:
            return None
        cls = type(ds)
        out: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}"}
        for name in ("__getitem__", "__iter__"):
            fn = getattr(cls, name, None)
            if fn is not None and not getattr(fn, "__module__", "").startswith("torch."):
                out[name] = _code_digest(fn)
        for k, v in sorted(getattr(ds, "__dict__", {}).items()):
            if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 200):
                out[f"attr.{k}"] = v
            elif isinstance(v, Tensor) and v.layout == torch.strided and not v.is_complex():
                out[f"attr.{k}"] = [list(v.shape), str(v.dtype).replace("torch.", ""),
                                    float(f"{float(v.detach().sum(dtype=torch.float64)):.6g}")]
            elif callable(v) and hasattr(v, "__code__"):  # a function or lambda it calls
                out[f"attr.{k}"] = _code_digest(v)
        return out

    def __repr__(self) -> str:
        return f"Stream({type(self.source).__name__}, seed={self.seed})"


def _code_digest(fn: Any) -> str:
    """A short hash of a function's source (its bytecode where the source cannot be read):
    the same function in another process hashes the same (no addresses)."""
    import hashlib
    import inspect

    try:
        text = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = code.co_code if code is not None else getattr(fn, "__qualname__", "").encode()
    return hashlib.sha256(text).hexdigest()[:16]


def split_validation(*tensors: Tensor, share: float = 0.5, seed: int = 0,
                     stratify: Tensor | None = None) -> tuple[tuple[Tensor, ...],
                                                               tuple[Tensor, ...]]:
    """Split validation tensors (the same rows in each) into ``(fit, held_out)``: ``fit`` for
    ``InnerProblem(val_loss=...)``, ``held_out`` (a ``share`` of the rows) for
    ``select_loss``. Rows are drawn by ``seed``; ``round(share * rows)`` are held out. With
    ``stratify`` (class labels, one per row) each class is split in that proportion, rounded
    so that the classes add up to the total (largest remainder: a class of 3 rows at share 0.5
    gives 1 or 2); a class of one row is refused, as it could be in one part only.

    Example:
        >>> (xv, yv), (xs, ys) = split_validation(x_val, y_val)           # doctest: +SKIP
        >>> val_loss = lambda m, hp: F.cross_entropy(m(xv), yv)           # doctest: +SKIP
        >>> select_loss = lambda m, hp: F.cross_entropy(m(xs), ys)        # doctest: +SKIP
    """
    _check_tensors("split_validation", tensors)
    n = tensors[0].shape[0]
    if any(x.shape[0] != n for x in tensors):
        raise ValueError(f"split_validation: the tensors have {[x.shape[0] for x in tensors]} "
                         f"rows; they must have the same number (one per example).")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise ValueError(f"split_validation: share={share!r} must be in (0, 1), the share of "
                         f"rows held out, e.g. share=0.5.")
    if n < 2:
        raise ValueError(f"split_validation: {n} row; at least 2 are needed to split.")
    if stratify is not None and (not isinstance(stratify, Tensor) or stratify.ndim != 1
                                 or stratify.shape[0] != n):
        raise ValueError(f"split_validation: stratify must be a 1-d tensor of {n} labels (one "
                         f"per row), e.g. stratify=y_val.")
    if (stratify is not None and stratify.is_floating_point()
            and not bool(torch.isfinite(stratify).all())):
        raise ValueError("split_validation: stratify holds NaN or infinite labels (their rows "
                         "would never be held out); give every row a finite class label.")
    seed = _int_seed("split_validation", seed)
    g = torch.Generator().manual_seed(seed)
    total = int(math.floor(share * n + 0.5))  # rows held out, rounded half up
    if stratify is None:
        groups, take = [torch.arange(n)], [total]
    else:
        labels, counts = stratify.cpu().unique(return_counts=True)
        if int(counts.min()) < 2:
            c = labels[int(counts.argmin())].item()
            kind = (" (a float label per row, as a regression's targets, makes each distinct "
                    "value a class: give stratify=None)" if stratify.is_floating_point() else "")
            raise ValueError(
                f"split_validation: stratify's class {c!r} has 1 row{kind}: it can be in one "
                f"part only, so the other part would lack the class. Merge the rare classes "
                f"into one label, or split without stratify (stratify=None).")
        groups = [torch.nonzero(stratify.cpu() == c).flatten() for c in labels]
        # largest remainder: each class's share * rows rounded so that they add up to the
        # total (each class rounded on its own held out 20 of 30 rows of 10 classes of 3 at
        # share 0.5, and none of 40 rows in 20 classes of 2 at share 0.2: the split probe)
        quota = [share * len(idx) for idx in groups]
        take = [int(math.floor(q)) for q in quota]
        tie = torch.randperm(len(groups), generator=g).tolist()
        order = sorted(range(len(groups)), key=lambda i: (-(quota[i] - take[i]), tie[i]))
        for i in order[:total - sum(take)]:
            take[i] += 1
    held: list[Tensor] = []
    for idx, k in zip(groups, take):
        idx = idx[torch.randperm(len(idx), generator=g)]
        held.append(idx[:k])
    out = torch.cat(held)
    if len(out) in (0, n):
        raise ValueError(f"split_validation: share={share} of {n} rows leaves one part empty; "
                         f"give more rows or a share nearer 0.5.")
    mask = torch.zeros(n, dtype=torch.bool)
    mask[out] = True
    keep, held_out = torch.nonzero(~mask).flatten(), torch.nonzero(mask).flatten()
    return (tuple(x[keep.to(x.device)] for x in tensors),
            tuple(x[held_out.to(x.device)] for x in tensors))
