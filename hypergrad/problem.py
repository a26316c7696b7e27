"""The inner problem: T steps of ordinary training, written as one pure step function.

``s_t = step(s_{t-1}, lam, t)`` with ``s = (params, buffers, opt)`` (a :class:`InnerState`).
Forward mode, reverse mode and finite differences all run this same function, so their agreement
is a real test of the differentiation.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import numbers
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from .errors import (
    ConfigWarning,
    DetachedValueWarning,
    PrecisionWarning,
    UnreadParameterWarning,
    UnseededRandomnessWarning,
    ZeroHypergradientWarning,
    raised_in_hypergrad,
)
from .hyperparams import TRANSFORMS, HPValues, HyperParams, Schedule
from .kernels import AttentionProbe, second_order
from .model import FunctionalModel, ModelFn, ModelProbe, describe_module, find_writers
from .optim import Optimizer
from .optim.base import DOMAIN_ENDS, DOMAINS, PerParam
from .rng import VALIDATION_STEP, step_rng, step_seed
from .rnn import RecurrentMode, has_recurrent

if TYPE_CHECKING:
    from .data import Stream

__all__ = ["InnerState", "InnerProblem", "TrainLoss", "ValLoss", "is_plain"]

_BATCH_DRAWS = -9_000_001
"""The stream of a callable batch source's draws from torch's default generators, apart from
the steps' streams (:mod:`hypergrad.rng`)."""

VARIANT_STRIDE = 1_000_003
"""How far :meth:`InnerProblem.variant` moves the seeds (a prime, past any epoch count, so a
variant's shuffles share no epoch with the problem's own)."""

TrainLoss = Callable[[ModelFn, Any, HPValues], Tensor]
ValLoss = Callable[[ModelFn, HPValues], Tensor]


class InnerState(NamedTuple):
    """The training state ``s``: every tensor here carries a tangent in forward mode.

    params: dict name -> tensor; buffers: BatchNorm running statistics; opt: the optimizer state.
    """

    params: dict[str, Tensor]
    buffers: dict[str, Tensor]
    opt: NamedTuple


class InnerProblem:
    """T inner training steps and the validation objective ``E`` they are judged by.

    Args:
        model: any ``nn.Module``; its trainable parameters and BatchNorm running statistics are
            the training state, run functionally (the module itself is never modified).
        train_loss: ``train_loss(model, batch, hp) -> scalar``. ``model`` is callable like the
            module (``model(x)``) and exposes ``model.params``; ``hp`` maps hyperparameter names
            to values at the current step (per-tensor kinds: dict param name -> value).
        optimizer: a pure optimizer from :mod:`hypergrad.optim`, arguments constant or bound to
            hyperparameter names.
        hyperparams: the :class:`~hypergrad.HyperParams` to differentiate.
        batches: the mini-batch of each step: a sequence (step ``t`` reads ``batches[t % len]``)
            or a callable ``t -> batch`` (:class:`~hypergrad.data.MiniBatches`, or yours: it
            runs with torch's default generator seeded by ``(seed, t)``), the same batch
            at step ``t`` in every run; or an iterable that starts a fresh pass on each
            ``iter()`` (a ``torch.utils.data.DataLoader``, wrapped in a
            :class:`~hypergrad.data.Stream`): read lazily, one pass per inner run
            (:meth:`begin_run`), so shuffling and augmentation are redrawn per run and forward
            mode holds one batch at a time. A one-shot iterator (a generator) is refused.
        steps: ``T``, the number of inner steps (>= 1).
        val_loss: ``val_loss(model, hp) -> scalar``, the objective ``E(w_T, lam)``; close over
            the validation data. ``hp`` gives whole schedules.
        val_mode: ``"eval"`` (default) or ``"train"``: the module mode while ``val_loss`` runs.
            Training runs each submodule in the mode it had when the problem was built (a
            BatchNorm or Dropout put in eval mode stays in eval mode; the root module trains).
        seed: the run seed of random draws in the step (dropout, noise from torch's default
            generator): every evaluation of step ``t``, in every method, HVP strategy and
            finite-difference run, draws from a generator state fixed by ``(seed, t)``
            (:mod:`hypergrad.rng`), so the step is a deterministic function and all
            methods differentiate the same one. The caller's generator state is left untouched.
        model_factory: builds the model again, e.g. ``lambda: Net()`` (the same architecture;
            called under ``torch.manual_seed``, its random initialisation is what differs).
            With it, :meth:`variant` also starts training from other initial weights, as a
            retraining at another seed would, so the Trainer's re-checks of its best points
            also see how each trains from another initialisation (on the suite's development
            half this changed nothing measurable: docs/benchmarks.md). Without it, variants
            keep the model's initial weights.
        select_loss: ``select_loss(model, hp) -> scalar`` like ``val_loss``, on held-out
            validation data that ``val_loss`` does not use. Never differentiated: the
            Trainer (offline) evaluates it after every inner run and returns the point with
            the lowest ``select_loss`` instead of the lowest ``val_loss``, which the
            hypergradients fit (:func:`~hypergrad.data.split_validation` splits one
            validation set in two).

    Example:
        >>> problem = InnerProblem(model, train_loss, sgd(lr="lr"), HyperParams([...]),
        ...                        batches, steps=50, val_loss=val_loss)  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, train_loss: TrainLoss, optimizer: Optimizer,
                 hyperparams: HyperParams, batches: Sequence[Any] | Callable[[int], Any]
                 | Iterable[Any], steps: int, val_loss: ValLoss, val_mode: str = "eval",
                 seed: int = 0, model_factory: Callable[[], nn.Module] | None = None,
                 select_loss: ValLoss | None = None) -> None:
        count: Any = steps
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
            raise ValueError(
                f"InnerProblem: steps={steps!r} must be an int >= 1 (the horizon T); with T = 0 "
                f"the hyperparameters influence nothing."
            )
        if not isinstance(hyperparams, HyperParams):
            raise TypeError(
                f"InnerProblem: hyperparams must be a HyperParams, got "
                f"{type(hyperparams).__name__}; wrap them: HyperParams([...])."
            )
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"InnerProblem: optimizer must come from hypergrad.optim (sgd, adam, adamw, "
                f"rmsprop, adagrad, adamw_schedulefree), got "
                f"{_torch_optimizer_hint(optimizer, hyperparams)}."
            )
        if val_mode not in ("eval", "train"):
            raise ValueError(f"InnerProblem: val_mode={val_mode!r}; use 'eval' or 'train'.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"InnerProblem: seed={seed!r} must be an int (the run seed of the "
                            f"step's random draws), e.g. seed=0.")
        if not callable(train_loss) or not callable(val_loss):
            raise TypeError("InnerProblem: train_loss and val_loss must be callables.")
        if select_loss is not None and not callable(select_loss):
            raise TypeError(f"InnerProblem: select_loss={select_loss!r} must be a callable "
                            f"like val_loss, select_loss(model, hp) -> scalar, on validation "
                            f"data that val_loss does not use (or None).")
        for which, fn, args in (("train_loss", train_loss, "model, batch, hp"),
                                ("val_loss", val_loss, "model, hp"),
                                ("select_loss", select_loss, "model, hp")):
            _check_arity(which, fn, args)
        if model_factory is not None and (not callable(model_factory)
                                          or isinstance(model_factory, nn.Module)):
            raise TypeError(f"InnerProblem: model_factory={model_factory!r} must be a callable "
                            f"that builds the model again, e.g. model_factory=lambda: Net() "
                            f"(not a model).")
        self.model_factory = model_factory
        if isinstance(model, nn.Module):
            _refuse_inference(None, model)
        self.fmodel = FunctionalModel(model)
        _refuse_eval_model(model)
        self.recurrent = has_recurrent(model)
        """Whether the model has an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` (its differentiated
        passes then run them through :mod:`hypergrad.rnn`)."""
        self._has_conv: bool | None = None
        self._precision_seen: set[tuple[tuple[str, ...], str | None]] = set()
        """The TF32 flags and autocast dtypes differentiated passes ran with (each warned
        about once)."""
        self._near_one_warned: set[str] = set()
        """The hyperparameters warned about as within rounding of 1 (:meth:`_warn_near_one`)."""
        self.hyperparams = hyperparams.bind(self.fmodel.param_names,
                                            self.fmodel.initial_params())
        self.optimizer = optimizer.for_horizon(steps)  # schedule-free: x at the last step
        _warn_tied_patterns(self.fmodel.module, self.fmodel.param_names, self.hyperparams,
                            self.optimizer)
        self.train_loss = train_loss
        self.val_loss = val_loss
        self.select_loss = select_loss
        self.val_mode = val_mode
        self.seed = seed
        self.steps = int(steps)  # a NumPy integer (from a grid) as Python's
        self._batch = _batch_source(batches, seed)
        self._batch.per_example = [(it.name, it.shape()[0]) for it in self.hyperparams.items
                                   if it.kind == "per_example"]
        if self._batch.stream is not None:
            _refuse_single_example_batch(self._batch.stream.source, self.fmodel)
        self._check_binding()
        self._checked_dtype: torch.dtype | None = None
        self._data_checked = False
        self.attention_dropout: bool | None = None
        """Whether attention draws dropout masks (found on the first plain step; then every
        evaluation of a step runs the math kernel, whose masks all methods share)."""
        self._hp_memo: tuple[Tensor, tuple[int, int], tuple[int, ...], dict[str, Any]] | None
        self._hp_memo = None
        """The last plain step's hyperparameter values (:meth:`_step_values`)."""
        self.run_count = 0
        """How many inner runs have started (:meth:`initial_state`): values kept for a run's
        steps are kept for that run only (a ``lam`` written through ``.data`` between runs
        keeps its version counter, and the next run trained at the values before)."""
        self.draws: bool | None = None
        """Whether the training loss draws random numbers (known after its first evaluation;
        once ``True``, it stays ``True``)."""
        self.eager_draws: bool | None = None
        """For a loss that draws: whether plain steps may take eager autograd, which draws the
        same numbers as ``torch.func`` for this loss (found on its first plain step that draws
        by computing the gradient both ways: bitwise equal gradients and running statistics,
        or ``False``)."""
        self.direct_draws: bool | None = None
        """For a loss that draws, with :attr:`eager_draws`: whether the step's VJP on autograd
        directly (:class:`~hypergrad.stepvjp.DoubleBackward`'s direct route) equals
        ``torch.func.vjp``'s bit for bit (found on its first step VJP that draws by computing
        it both ways; the later ones take the direct route where they agree)."""
        self.step_drew: bool | None = None
        """Whether the last evaluation of the training loss drew random numbers, while that is
        watched (until :attr:`eager_draws` and :attr:`direct_draws` are known): a step that
        draws nothing agrees both ways whatever the loss draws at other steps, so it decides
        neither (a dropout switched on at step 1 was judged at step 0, and the later plain
        steps drew other masks than the differentiated passes: 2e-3 between methods)."""

    # -- basic facts ------------------------------------------------------------------------------
    @property
    def num_hyperparams(self) -> int:
        """``K``."""
        return self.hyperparams.num_raw

    @property
    def dtype(self) -> torch.dtype:
        return self.fmodel.dtype

    @property
    def device(self) -> torch.device:
        return self.fmodel.device

    def init_raw(self) -> Tensor:
        """Initial raw hyperparameters ``lam``, shape ``(K,)``, in the model's dtype/device."""
        return self.hyperparams.init_raw(self.dtype, self.device)

    def batch(self, t: int) -> Any:
        """The mini-batch of step ``t`` (of the current inner run's pass, for a
        :class:`~hypergrad.data.Stream`). A callable of your own runs with torch's default
        generators at a state fixed by ``(seed, t)`` (a stream of its own, apart from the
        step's draws; the caller's state restored), so a source that samples with
        ``torch.randint`` gives step ``t`` one batch in every evaluation and method."""
        if not self._batch.own:
            return self._batch(t)
        with step_rng(step_seed(self.seed, _BATCH_DRAWS), t, self.device,
                      watch=not self._batch.draws) as rng:
            b = self._batch(t)
            if rng is not None and rng.drew():
                self._batch.draws = True
        return b

    # -- inner runs and their batches --------------------------------------------------------------
    @property
    def stream(self) -> Stream | None:
        """The :class:`~hypergrad.data.Stream` the batches come from (a DataLoader), or
        ``None`` for a sequence or a callable (random access by step, nothing per run)."""
        return self._batch.stream

    def data_tensors(self) -> list[Tensor] | None:
        """The training data's tensors where the problem holds them all: a
        :class:`~hypergrad.data.MiniBatches`' tensors, a sequence's batches, a DataLoader over a
        ``TensorDataset``; ``None`` for a callable of one's own or another dataset. What a run
        folder's fingerprint and the ranks' comparison digest: the first batch alone let a
        change in the later batches through (a rank holding other data past batch 0 summed
        into a hypergradient 2 % off, without an error; the distributed probe)."""
        data = self._batch.data
        if data is None and self._batch.stream is not None:
            data = _dataset_tensors(getattr(self._batch.stream.source, "dataset", None))
        elif data is not None and hasattr(data, "tensors"):  # a MiniBatches
            data = data.tensors
        if data is None:
            return None
        return [x for x in tree_flatten(data)[0] if isinstance(x, Tensor)]

    @property
    def counts_reads(self) -> bool:
        """Whether the batch source counts up front which examples the run reads (a
        :class:`~hypergrad.data.MiniBatches`: the problem then warns about per-example weights
        no step reads when it checks its data)."""
        return callable(getattr(getattr(self._batch, "data", None), "read_counts", None))

    def begin_run(self, keep_from: int | None = None) -> None:
        """An inner run starts (every method calls this at the start of one: an online
        method's ``init``, reverse mode, :meth:`run` from step 0): a streamed source begins a
        fresh pass (:meth:`Stream.begin_pass <hypergrad.data.Stream.begin_pass>`), read as the
        steps ask. ``keep_from``: keep the batches of the steps ``>= keep_from`` for a replay
        (reverse mode), until :meth:`release_batches`; by default only the last one read is
        kept. Nothing to do for a sequence or a callable."""
        if self.stream is not None:
            self.stream.begin_pass(keep_from)

    def release_batches(self) -> None:
        """Drop the batches the current inner run kept for a replay (:meth:`begin_run`)."""
        if self.stream is not None:
            self.stream.release()

    @contextlib.contextmanager
    def inner_run(self, keep_from: int | None = None) -> Iterator[None]:
        """:meth:`begin_run` on entry, :meth:`release_batches` on exit."""
        self.begin_run(keep_from)
        try:
            yield
        finally:
            self.release_batches()

    def fixed_pass(self, seed: int | None = None) -> contextlib.AbstractContextManager[Any]:
        """Inside, every inner run reads the same batches: a streamed source reads the same
        pass again from its start (``seed``, or the next pass drawn once; nested, the outer
        one), as finite differences and :func:`~hypergrad.testing.hypergradcheck` need. Yields
        the pass's seed (``None`` for a sequence or a callable, whose batches never change)."""
        if self.stream is None:
            return contextlib.nullcontext()
        return self.stream.fixed(seed)

    @property
    def varies(self) -> bool:
        """Whether :meth:`variant` changes a run: the batches are drawn (a shuffling
        :class:`~hypergrad.data.MiniBatches`, or a stream whose passes of other seeds read
        other batches, :meth:`Stream.varies <hypergrad.data.Stream.varies>`: a shuffling or
        augmenting ``DataLoader``) or the step draws random numbers (dropout). ``False`` for a
        fixed sequence of batches (a ``DataLoader`` with ``shuffle=False`` over fixed
        examples too) and a deterministic step: every run at the same point is the same."""
        from .data import MiniBatches

        src = self._seeded_source()
        return (bool(self.draws) or self._batch.draws
                or (self._batch.stream is not None and self._batch.stream.varies())
                or self.model_factory is not None
                or (src is not None and (not isinstance(src, MiniBatches) or src.shuffle)))

    def _seeded_source(self) -> Any:
        """The callable batch source whose draws follow an int attribute ``seed``
        (:class:`~hypergrad.data.MiniBatches`, the character LM's batches, or yours), or
        ``None`` (a sequence, a stream, a callable without one)."""
        src = self._batch.data if self._batch.data is not None else self._batch._fetch
        seed = getattr(src, "seed", None)
        if isinstance(seed, bool) or not isinstance(seed, int) or isinstance(src, Sequence):
            return None
        return src

    @contextlib.contextmanager
    def variant(self, k: int) -> Iterator[None]:
        """Inside, plain runs see the ``k``-th other draw of the run's randomness: other
        mini-batches from a callable source whose draws follow an int attribute ``seed``
        (:class:`~hypergrad.data.MiniBatches`' shuffles, the character LM's windows, or
        yours: the seed moved by ``k * VARIANT_STRIDE``) and other random draws in the step
        (the run seed moved the same way); a stream draws a fresh pass per run anyway; with a
        ``model_factory``, other initial weights (the factory's model built under the moved
        seed). The data stays. ``k = 0``: the problem itself. The Trainer
        re-checks its best points in a variant before it returns one
        (``Offline(recheck=...)``): a point that only one batch order trains well is not the
        one to return."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"InnerProblem.variant: k={k!r} must be an int >= 0.")
        src = self._seeded_source()
        seed, src_seed = self.seed, (src.seed if src is not None else None)

        def move(to: int) -> None:
            src.seed = to
            if hasattr(src, "_perm"):  # MiniBatches' cached permutation of an epoch
                src._perm = None

        fresh = self._fresh_weights(seed + k * VARIANT_STRIDE) if k else None
        try:
            if k:
                self.seed = seed + k * VARIANT_STRIDE
                if src_seed is not None:
                    move(src_seed + k * VARIANT_STRIDE)
                self.fmodel.fresh = fresh
            yield
        finally:
            self.seed = seed
            self.fmodel.fresh = None
            if src_seed is not None and src.seed != src_seed:
                move(src_seed)

    def _fresh_weights(self, seed: int) -> dict[str, Tensor] | None:
        """The ``model_factory``'s initial weights under ``seed`` (``None`` without a
        factory); the caller's random state is left as it was."""
        if self.model_factory is None:
            return None
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            other = self.model_factory()
        if not isinstance(other, nn.Module):
            raise TypeError(f"InnerProblem: model_factory() returned "
                            f"{type(other).__name__}; it must return the model (an nn.Module).")
        return self.fmodel.fresh_from(other, "InnerProblem")

    def non_finite_batch(self) -> str:
        """Where one pass of the training data first holds a NaN or inf (``"tensor 0 of
        mini-batch 37 (shape (16, 64)) has 1 NaN entry ..."``), else ``""``: reads the ``T``
        batches of a pass (a stream: a fresh one), so meant for explaining a failure, not for
        every run. The up-front check (:meth:`check`) sees all of a sequence or a
        :class:`~hypergrad.data.MiniBatches` but only batch 0 of a stream or a callable."""
        with torch.no_grad(), self.inner_run():
            for t in range(self.steps):
                leaves, _ = tree_flatten(self.batch(t))
                for i, x in enumerate(leaves):
                    bad = _non_finite(x)
                    if bad:
                        return f"tensor {i} of mini-batch {t} (shape {tuple(x.shape)}) has {bad}"
        return ""

    def non_finite_closure(self) -> str:
        """Where a tensor the losses close over (the validation data, a held-out set; best
        effort, as :func:`_closure_tensors` finds them) holds a NaN or inf (``"val_loss's
        x_val (shape (200, 64)) has 1 inf entry ..."``), else ``""``: for explaining a
        non-finite hypergradient at a finite loss."""
        losses = [("train_loss", self.train_loss), ("val_loss", self.val_loss),
                  ("select_loss", self.select_loss)]
        for name, fn in losses:
            if fn is None:
                continue
            for label, x in _closure_tensors(fn, name):
                bad = _non_finite(x)
                if bad:
                    return f"{label} (shape {tuple(x.shape)}) has {bad}"
        return ""

    def first_batch(self) -> Any:
        """Mini-batch 0 as the checks see it: ``batch(0)`` of a sequence or a callable; of a
        stream, batch 0 of a pass with a fixed seed of its own (the same whatever runs have
        read, for the checks, memory estimates and a run folder's fingerprint)."""
        stream = self._batch.stream
        return self._batch.checked(stream.first_batch(), 0) if stream else self.batch(0)

    def second_order(self) -> contextlib.AbstractContextManager[None]:
        """The context of the passes that differentiate this problem's gradient (HVPs, step
        VJPs): attention through the math kernel, recurrent layers through
        :mod:`hypergrad.rnn` (:func:`hypergrad.kernels.second_order`)."""
        self._check_precision()
        return second_order(self.recurrent)

    def _check_precision(self) -> None:
        """Warn where a differentiated pass runs with TF32 or under ``torch.autocast``: both are
        settings of the call, not of the problem, so every pass is checked (only the first was:
        hypergradients taken under autocast after one outside it were 3-5 % off without a word),
        and each setting is warned about once per problem."""
        kind = self.device.type
        if self._has_conv is None:  # the model's modules, walked once
            self._has_conv = any(isinstance(m, nn.modules.conv._ConvNd)
                                 for m in self.fmodel.module.modules())
        flags = tuple(tf32_flags(self.device, self.dtype, self._has_conv))
        # autocast never casts float64 (a float64 model under it was warned of, and exact)
        low = (str(torch.get_autocast_dtype(kind)).replace("torch.", "")
               if torch.is_autocast_enabled(kind) and self.dtype != torch.float64 else None)
        if (flags, low) in self._precision_seen:
            return
        self._precision_seen.add((flags, low))
        if flags:
            warnings.warn(PrecisionWarning(
                f"InnerProblem: hypergradients of this float32 model on {self.device} run "
                f"with TF32 ({', '.join(flags)}): products round to a 10-bit mantissa. "
                f"Measured on an H100 (a CNN, 50 steps): 2-3e-2 relative error against "
                f"float64 with TF32, 2-4e-3 without. Fix: set "
                f"torch.backends.cudnn.allow_tf32 = False and "
                f"torch.backends.cuda.matmul.allow_tf32 = False before training (or use "
                f"float64); to accept it, filter hypergrad.errors.PrecisionWarning."),
                stacklevel=4)
        if low is not None:
            warnings.warn(PrecisionWarning(
                f"InnerProblem: hypergradients run under torch.autocast({kind!r}, "
                f"dtype={low}): its products round to {low}'s 8 to 11 bits, and the "
                f"tangents carried over the steps with them (measured: a digits MLP 64-16-10 "
                f"with momentum, forward mode against float64 under bfloat16 autocast: "
                f"1.1e-3 relative error over 5 steps, 5.3e-2 over 30; 2e-7 in float32). Take "
                f"hypergradients outside autocast (and not inside the losses); to accept it, "
                f"filter hypergrad.errors.PrecisionWarning."),
                stacklevel=4)

    def cells(self) -> contextlib.AbstractContextManager[None]:
        """Recurrent layers through :mod:`hypergrad.rnn`'s cells (nothing else changed), for the
        first-order passes under ``torch.func``: cuDNN's RNN kernel reads its weights' storage,
        which ``torch.func``'s wrapped tensors do not have (on CPU, torch's kernel would do)."""
        return RecurrentMode() if self.recurrent else contextlib.nullcontext()

    @property
    def init_items(self) -> list[Any]:
        """The hyperparameters that set the initial state (:class:`~hypergrad.InitScale`,
        :class:`~hypergrad.InitWeights`); empty for most problems."""
        return self.hyperparams.init_items

    def initial_state(self, lam: Tensor | None = None) -> InnerState:
        """The state ``s_0`` training at ``lam`` starts from: the model's weights with the
        initialisation hyperparameters applied (differentiable in ``lam``). Without ``lam``,
        the model's own weights as they are (the base that :class:`~hypergrad.InitScale`
        scales); the two are equal for problems without initialisation hyperparameters."""
        if not self.fmodel.probed:  # the state's buffers are known after the probe pass
            self._probe_model(self.init_raw() if lam is None else lam)
        self.run_count += 1  # a run starts here
        params = self.fmodel.initial_params()
        if lam is not None and self.init_items:
            params = self.hyperparams.apply_init(params, lam)
        return InnerState(params, self.fmodel.initial_buffers(), self.optimizer.init(params))

    def model(self, state: InnerState, train: bool = False) -> ModelFn:
        """The network at a trained ``state`` (its parameters and running statistics), callable
        like the module: ``problem.model(state)(x)``; in eval mode unless ``train``. For an
        ``evaluate`` of a :class:`~hypergrad.Task`. The module itself is not modified."""
        return self.fmodel.bind(state.params, state.buffers, train=train, step=self.steps)

    # -- the pure functions every method differentiates --------------------------------------------
    def train_objective(self, params: dict[str, Tensor], buffers: dict[str, Tensor], lam: Tensor,
                        t: int, batch: Any, fused: bool = False
                        ) -> tuple[Tensor, dict[str, Tensor]]:
        """``L_train(w, b, lam; B_t)`` and the running statistics after the forward pass, with
        step ``t``'s random draws. ``fused``: running statistics from torch's fused BatchNorm
        kernel (plain steps: not differentiable with respect to the weights)."""
        hp = HPValues(self._step_values(lam, t), "train_loss")
        model = self.fmodel.bind(params, buffers, train=True, step=t, fused=fused)
        if self.draws is False and torch.compiler.is_compiling():  # nothing to seed; untraceable
            return self.train_loss(model, batch, hp), model.new_buffers
        watch = (not self.draws or self.eager_draws is None
                 or bool(self.eager_draws and self.direct_draws is None))
        with step_rng(self.seed, t, self.device, watch=watch) as rng:
            try:
                loss = self.train_loss(model, batch, hp)
            except (IndexError, ValueError, RuntimeError) as err:  # a later batch's data
                if not raised_in_hypergrad(err):
                    err.add_note(f"hypergrad: raised by train_loss at inner step {t}, on "
                                 f"{_describe_batch(batch, t)} (the problem's check runs "
                                 f"mini-batch 0 only).")
                raise
            if rng is not None:
                self.step_drew = rng.drew()
                self.draws = bool(self.draws) or self.step_drew
        return loss, model.new_buffers

    def update(self, grads: dict[str, Tensor], opt: NamedTuple, params: dict[str, Tensor],
               lam: Tensor, t: int) -> tuple[dict[str, Tensor], NamedTuple]:
        """The optimizer update ``U`` with the hyperparameters of step ``t``."""
        hp = self._step_values(lam, t)
        return self.optimizer.update(grads, opt, params, hp, t)

    def _step_values(self, lam: Tensor, t: int) -> dict[str, Any]:
        """The hyperparameters' values at step ``t``. Outside every transform, for a ``lam``
        nothing differentiates, those of the last step asked are kept while ``lam`` and each
        schedule's window stay the same (a plain run computed them twice a step for the same
        values: 15 % of a small MLP's plain step)."""
        hps = self.hyperparams
        if (type(lam) is not Tensor or lam.requires_grad
                or torch._C._functorch.peek_interpreter_stack() is not None
                or torch.compiler.is_compiling()):
            return hps.values(lam, t, self.steps)
        key = hps.step_key(t, self.steps)
        memo = self._hp_memo
        if (key is not None and memo is not None and memo[0] is lam
                and memo[1] == (lam._version, self.run_count) and memo[2] == key):
            return memo[3]
        values = hps.values(lam, t, self.steps)
        if key is not None:
            self._hp_memo = (lam, (lam._version, self.run_count), key, values)
        return values

    def step(self, state: InnerState, lam: Tensor, t: int) -> InnerState:
        """One inner step: ``g = grad_w L_train`` (:meth:`gradient`), then
        ``s_t = U(s_{t-1}, g, h_t)``."""
        plain = is_plain(state, lam)
        g, new_buffers = self._gradient(state, lam, t, plain)
        if plain:
            with torch.no_grad():
                params, opt = self.update(g, state.opt, state.params, lam, t)
        else:
            params, opt = self.update(g, state.opt, state.params, lam, t)
        return InnerState(params, new_buffers, opt)

    def gradient(self, state: InnerState, lam: Tensor, t: int
                 ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """``grad_w L_train(w_{t-1}, lam; B_t)`` and the running statistics after the forward
        pass.

        The gradient comes from ``torch.func.grad``, except in plain training (no function
        transform, nothing requiring grad: :func:`is_plain`) of a problem whose loss draws no
        random numbers: there ``torch.autograd.grad`` runs torch's fused backward kernels (an
        LSTM's backward is 4.5x faster than under ``torch.func.grad``, which must keep it
        differentiable). Both give the same gradient to rounding. A loss that draws (dropout)
        goes through ``torch.func``: eager random ops lay their draws out in the input's memory
        order, ``torch.func`` in logical order (dropout of a transposed tensor, as in
        ``nn.TransformerEncoderLayer``, gets other masks), so every evaluation of the step runs
        the way the differentiated passes do. Its first plain step is also computed by eager
        autograd in the same kernels; where the two agree bit for bit (gradient and running
        statistics: every random op's input in logical order, as in most models), the later
        plain steps take eager autograd (:attr:`eager_draws`; the char LM's plain run 1.3x
        faster, ``experiments/benchmarks/bench_plain_lm.py``)."""
        return self._gradient(state, lam, t, is_plain(state, lam))

    def _gradient(self, state: InnerState, lam: Tensor, t: int, plain: bool
                  ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        batch = self.batch(t)
        if plain and self.draws is False:
            got = self._eager_grad(state.params, state.buffers, lam, t, batch)
            if not self.draws:
                return got
            # this step drew, the first to (a dropout switched on after step 0): eager
            # autograd laid its draws out in memory order, torch.func in logical order, so the
            # first run differed from every later one and from the differentiated passes
            # (2e-3 between methods); taken again below as every later evaluation takes it
        # attention: the differentiated passes run the math kernel (a double backward); plain
        # steps keep the fused kernels unless attention draws dropout masks (the kernels draw
        # them differently); the first plain step finds out, with the math kernel
        probe = AttentionProbe() if plain and self.attention_dropout is None else None
        kernel = (self.cells if plain and self.attention_dropout is False
                  else self.second_order)
        if plain and self.eager_draws:
            with kernel():
                return self._eager_grad(state.params, state.buffers, lam, t, batch, fused=False)
        with kernel(), probe or contextlib.nullcontext():
            g, new_buffers = torch.func.grad(self.train_objective, has_aux=True)(
                state.params, state.buffers, lam, t, batch)
        if probe is not None:
            self.attention_dropout = probe.dropout
            if not probe.dropout:  # again in the fused kernels later plain steps run, so that a
                # problem's first plain run repeats bit for bit (the math kernel rounds otherwise)
                return self._gradient(state, lam, t, plain)
        elif plain and self.draws and self.eager_draws is None:
            # the same step by eager autograd, in the same kernels: where it draws the same
            # numbers (inputs of random ops in logical order), the rest of the plain steps
            # skip torch.func's wrappers (a quarter of the char LM's plain step)
            with kernel():
                eg, eb = self._eager_grad(state.params, state.buffers, lam, t, batch, fused=False)
            if self.step_drew:  # else decided at a step that draws
                self.eager_draws = bitwise_equal((g, new_buffers), (eg, eb))
        return g, new_buffers

    def _detect_draws(self, lam: Tensor) -> None:
        """Evaluate the training loss once at step 0 to learn whether it draws random numbers
        (:attr:`draws`), before any transform traces it."""
        s = self.initial_state()
        with torch.no_grad():
            self.train_objective(s.params, s.buffers, lam, 0, self.first_batch())

    def _eager_grad(self, params: dict[str, Tensor], buffers: dict[str, Tensor], lam: Tensor,
                    t: int, batch: Any, fused: bool = True
                    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        with torch.enable_grad():
            p = {k: v.detach().requires_grad_() for k, v in params.items()}
            loss, new_b = self.train_objective(p, buffers, lam, t, batch, fused=fused)
            grads = torch.autograd.grad(loss, list(p.values()), allow_unused=True)
        g = {k: (gr if gr is not None else torch.zeros_like(v))
             for (k, v), gr in zip(p.items(), grads)}
        return g, {k: v.detach() for k, v in new_b.items()}

    def objective(self, params: dict[str, Tensor], buffers: dict[str, Tensor],
                  lam: Tensor) -> Tensor:
        """The validation objective ``E(w_T, b_T, lam)`` (random draws from a stream of its
        own, for a ``val_loss`` evaluated in train mode)."""
        hp = HPValues(self.hyperparams.values(lam, None, self.steps), "val_loss")
        model = self.fmodel.bind(params, buffers, train=self.val_mode == "train",
                                 step=self.steps)
        transformed = torch._C._functorch.maybe_current_level() is not None
        with step_rng(self.seed, VALIDATION_STEP, self.device), (
                self.cells() if transformed else contextlib.nullcontext()):
            return self.val_loss(model, hp)

    def select(self, params: dict[str, Tensor], buffers: dict[str, Tensor],
               lam: Tensor) -> Tensor | None:
        """The held-out ``select_loss(w_T, b_T, lam)`` (never differentiated), or ``None``
        without one. It draws from the validation's stream, as :meth:`objective` does."""
        if self.select_loss is None:
            return None
        hp = HPValues(self.hyperparams.values(lam, None, self.steps), "select_loss")
        model = self.fmodel.bind(params, buffers, train=self.val_mode == "train",
                                 step=self.steps)
        with torch.no_grad(), step_rng(self.seed, VALIDATION_STEP, self.device):
            return self.select_loss(model, hp)

    def run(self, lam: Tensor, state: InnerState | None = None, start: int = 0,
            stop: int | None = None) -> InnerState:
        """Plain training from ``state`` (default: the initial one at ``lam``) over steps
        ``start..stop-1``. From ``start=0`` it is a new inner run (:meth:`begin_run`); from a
        later step it continues the current one."""
        end = self.steps if stop is None else stop
        for arg, v in (("start", start), ("stop", end)):
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise TypeError(f"InnerProblem.run: {arg} must be an int step, got {v!r} "
                                f"({type(v).__name__}).")
        if not 0 <= start <= end <= self.steps:
            raise ValueError(
                f"InnerProblem.run: start={start}, stop={end} must satisfy 0 <= start <= stop <= "
                f"steps={self.steps}: the problem's run is {self.steps} steps (its schedules' "
                f"windows are spread over them; a step past the last would reuse the last "
                f"window). For a longer run build the problem with more steps; for a shorter "
                f"horizon, stop < steps.")
        self.check(lam)
        if start == 0:  # a new inner run (a stream begins a fresh pass); later: this one goes on
            self.begin_run()
        s = self.initial_state(lam) if state is None else state
        with torch.no_grad():
            for t in range(int(start), int(end)):
                s = self.step(s, lam, t)
        return s

    # -- validation -------------------------------------------------------------------------------
    def _check_binding(self) -> None:
        hps = self.hyperparams
        for arg, const in self.optimizer.per_param().items():
            const.check(f"InnerProblem: optimizer argument {arg}", self.fmodel.param_names)
        bound = self.optimizer.bound_names()
        for item in hps.items:
            if getattr(item, "multipliers", None) is not None and item.name not in bound:
                raise ValueError(
                    f"InnerProblem: {type(item).__name__}({item.name!r}) has multipliers per "
                    f"parameter tensor but no optimizer argument reads it (they scale what each "
                    f"parameter's update reads); bind it to one, e.g. lr={item.name!r}, or drop "
                    f"multipliers (a loss reads one value: multiply it there).")
        for name, arg in bound.items():
            if name not in hps.by_name:
                raise ValueError(
                    f"InnerProblem: optimizer argument {arg}={name!r} names no hyperparameter; "
                    f"defined are {hps.names}. Fix the name or add it to HyperParams"
                    + (f" (a string always names a hyperparameter: for the constant, give the "
                       f"number, {arg.split('[')[0]}={name})" if _is_number(name) else "")
                    + "."
                )
            item = hps.by_name[name]
            if item.initializes:
                raise ValueError(
                    f"InnerProblem: optimizer argument {arg} is bound to {name!r} of kind "
                    f"{item.kind}, which sets the initial weights; bind optimizer arguments to a "
                    f"Scalar, a Schedule, a PerTensor, a PerGroup or a 0-d Tensor."
                )
            if item.kind in ("per_example",) or (item.kind == "array" and item.shape() != ()):
                raise ValueError(
                    f"InnerProblem: optimizer argument {arg} is bound to {name!r} of kind "
                    f"{item.kind} with shape {item.shape()}; optimizer arguments take a Scalar, "
                    f"a Schedule, a PerTensor, a PerGroup or a 0-d Tensor."
                )

    def _check_finite_lam(self, lam: Tensor) -> None:
        """Refuse a NaN raw hyperparameter, naming it: every method would return a NaN
        hypergradient without a word. An infinity is a value at its transform's edge (a logit
        weight of exactly 0 or 1: the sparse-regression task's reference points) and is run.
        Skipped for tensors that cannot be read (fake tensors of the memory estimates,
        functorch's wrappers, a compiled graph)."""
        if (type(lam) is not Tensor and type(lam) is not torch.nn.Parameter) \
                or torch._C._functorch.is_functorch_wrapped_tensor(lam) \
                or torch.compiler.is_compiling():
            return
        finite = ~torch.isnan(lam.detach())
        if bool(finite.all()):
            return
        hps = self.hyperparams
        bad = [f"{name}[{i}]" if s.stop - s.start > 1 else name
               for name, s in hps.slices.items()
               for i in range(s.stop - s.start) if not bool(finite[s.start + i])]
        raise ValueError(
            f"InnerProblem: lam is NaN at {', '.join(bad[:5])}"
            f"{f' and {len(bad) - 5} more' if len(bad) > 5 else ''} (raw, untransformed "
            f"values: {lam.detach()[~finite][:5].tolist()}); every hypergradient there would be "
            f"NaN. Start from problem.init_raw() (each hyperparameter's init, which must lie "
            f"inside its transform's range: > 0 for log, in [0, 1] for logit) and keep every "
            f"entry a number.")

    def hyperparameter_domains(self) -> dict[str, tuple[float, float, bool, bool, str]]:
        """Each hyperparameter that an inner-optimizer argument with a domain reads (a
        momentum in [0, 1), an eps > 0) -> ``(low, high, low excluded, high excluded, the
        arguments in words)``, the intersection where several read it. A constant outside its
        domain is refused when the optimizer is made; a hyperparameter could leave it (an
        identity-transformed momentum tuned to 1.2 was returned as the best point)."""
        out: dict[str, tuple[float, float, bool, bool, str]] = {}
        opt = self.optimizer
        for name, reads in opt.hyperparameter_domains().items():
            lo, hi, lo_x, hi_x = -math.inf, math.inf, False, False
            for _, d in reads:
                a, b, ax, bx = DOMAIN_ENDS[d]
                if a > lo or (a == lo and ax):
                    lo, lo_x = a, ax
                if b < hi or (b == hi and bx):
                    hi, hi_x = b, bx
            words = " and ".join(f"{opt.name}'s {arg} ({DOMAINS[d][1]})" for arg, d in reads)
            out[name] = (lo, hi, lo_x, hi_x, words)
        return out

    def _domain_values(self, lam: Tensor) -> Iterator[tuple[str, list[float], list[float],
                                                              float, str]]:
        """``(name, values, those outside, high end, the arguments in words)`` of each
        hyperparameter of :meth:`hyperparameter_domains` at ``lam``."""
        hps = self.hyperparams
        for name, (lo, hi, lo_x, hi_x, words) in self.hyperparameter_domains().items():
            if name not in hps.by_name:
                continue
            it = hps.by_name[name]
            raw = lam.detach()[hps.slices[name]][:it.base_numel].double()
            vals = TRANSFORMS[it.transform][0](raw).tolist()
            bad = [v for v in vals if not ((lo < v if lo_x else lo <= v)
                                           and (v < hi if hi_x else v <= hi))]
            yield name, vals, bad, hi, words

    def outside_domains(self, lam: Tensor) -> list[str]:
        """The hyperparameters whose values at ``lam`` are outside the domain of an optimizer
        argument reading them, where a run is refused (:meth:`hyperparameter_domains`):
        finite differences step to the side inside."""
        return [name for name, _, bad, _, _ in self._domain_values(lam) if bad]

    def _check_domains(self, lam: Tensor) -> None:
        """Refuse hyperparameter values outside the domain of the optimizer argument reading
        them (:meth:`hyperparameter_domains`): a momentum of 1 never forgets, an eps of 0 gave
        NaN losses and hypergradients, an RMSprop alpha of 1 a hypergradient of exactly 0,
        each without a word (as constants they are refused)."""
        if (type(lam) is not Tensor and type(lam) is not torch.nn.Parameter) \
                or torch._C._functorch.is_functorch_wrapped_tensor(lam) \
                or torch.compiler.is_compiling():
            return
        for name, vals, bad, hi, words in self._domain_values(lam):
            if not bad:
                self._warn_near_one(name, vals, hi, words)
                continue
            fix = ("transform='logit' (values in (0, 1))" if hi == 1 else
                   "transform='log' (values > 0)")
            raise ValueError(
                f"InnerProblem: hyperparameter {name!r} is {bad[0]!r}"
                f"{f' (and {len(bad) - 1} more entries)' if len(bad) > 1 else ''}, read as "
                f"{words}: outside that domain training is not what the argument means (a "
                f"momentum of 1 never forgets; an eps of 0 gave NaN hypergradients). Give it "
                f"a value inside, and {fix} or Guards(bounds=...) to keep it there while "
                f"tuning (the Trainer holds it inside the domain, with a warning when a step "
                f"leaves it).")

    def _warn_near_one(self, name: str, vals: list[float], hi: float, words: str) -> None:
        """Warn (:class:`~hypergrad.errors.PrecisionWarning`, once per hyperparameter) where a
        value read as a momentum or beta (domain up to 1) is within 100 rounding units of 1 in
        the problem's dtype: the update's ``1 - beta`` and its derivative are then rounding
        (Adam's beta2 = 0.9999999 in float32: a hypergradient of -7e-9 where float64 gives
        +1e-10, forward and reverse mode 35 % apart, silently; the numerics probe)."""
        if hi != 1 or self.dtype == torch.float64 or name in self._near_one_warned:
            return
        eps = torch.finfo(self.dtype).eps
        close = [v for v in vals if 1 - v < 100 * eps]
        if not close:
            return
        self._near_one_warned.add(name)
        warnings.warn(PrecisionWarning(
            f"InnerProblem: hyperparameter {name!r} is {close[0]!r}, read as {words}: 1 - "
            f"{name} = {1 - close[0]:.3g} is within 100 rounding units of {self.dtype} (eps "
            f"{eps:.3g}), so the update's 1 - {name} and its derivative are rounding: "
            f"hypergradients in {self.dtype} can have the wrong sign (Adam's beta2 = "
            f"0.9999999 in float32 gave -7e-9 where float64 gives +1e-10). Build the problem "
            f"in float64 (model.double() and float64 data), or keep the value further from 1 "
            f"(Guards(bounds=...))."), stacklevel=5)

    def check(self, lam: Tensor) -> None:
        """Validate ``lam`` and run the losses once at step 0, before anything costly: scalar
        float losses; finite data, weights and losses (a NaN is named as a data problem, not
        left to look like a diverging learning rate); the model's forward writes nothing that
        cannot be differentiated (:meth:`_probe_model`); every hyperparameter can act: read
        by something, connected to a loss's autograd graph, every schedule window read by a
        step. Cheap after the first call for a dtype."""
        _refuse_inference(lam)
        self.hyperparams.check_raw(lam, "InnerProblem")
        if lam.dtype != self.dtype:
            raise TypeError(
                f"InnerProblem: lam has dtype {lam.dtype} but the model is {self.dtype}; use "
                f"problem.init_raw() or lam.to({self.dtype})."
            )
        self._check_finite_lam(lam)
        self._check_domains(lam)
        # every method's entry, finite differences too (their plain runs under autocast were
        # 19x off, warned of as float32 rounding alone)
        self._check_precision()
        if self._checked_dtype == lam.dtype:
            return
        self._check_data()
        self._probe_model(lam)
        with step_rng(self.seed, 0, self.device):
            loss, hp, reach, weights_t, cuts_t = self._probe_loss("train_loss", lam)
            _check_scalar("train_loss", loss, self.dtype)
            val, hpv, reach_v, weights_v, cuts_v = self._probe_loss("val_loss", lam)
            _check_scalar("val_loss", val, self.dtype)
        self._check_finite_losses(loss, val, lam)
        for which, reaches in (("train_loss", weights_t), ("val_loss", weights_v)):
            if not reaches:
                raise ValueError(_cut_from_weights(which))
        if self.select_loss is not None:
            sel = self.select(*self.initial_state(lam)[:2], lam)
            _check_scalar("select_loss", sel, self.dtype)
            assert sel is not None  # a select_loss gives a value
            if not bool(torch.isfinite(sel.detach()).all()):
                where = next((f": {d} (shape {tuple(x.shape)}) has {b}" for d, x in
                              _closure_tensors(self.select_loss, "select_loss")
                              if (b := _non_finite(x))), "")
                raise ValueError(
                    f"InnerProblem: select_loss is {float(sel)} at the initial weights (they "
                    f"are finite){where}. The Trainer returns the point with the lowest "
                    f"select_loss, and a non-finite one ranks no point: fix the held-out data "
                    f"(e.g. keep = torch.isfinite(x).flatten(1).all(1)) or the loss first.")
        if self.draws is None:
            self._detect_draws(lam)
        bound = set(self.optimizer.bound_names()) | {it.name for it in self.init_items}
        used = hp.accessed | hpv.accessed | bound
        unused = [n for n in self.hyperparams.names if n not in used]
        if unused:  # a loss term on some batches only: read at a later step
            later, reach_later = self._read_later(lam, unused)
            hp.accessed |= later
            reach |= reach_later
            used |= later
            unused = [n for n in unused if n not in later]
        if unused:
            raise ValueError(_unbound_message(unused, self.optimizer))
        cut = [n for n in self.hyperparams.names
               if n not in bound and n not in reach | reach_v]
        if cut:
            raise ValueError(self._cut_message(cut, lam, hp.accessed, hpv.accessed))
        self._warn_partial_cuts(lam, {"train_loss": cuts_t, "val_loss": cuts_v})
        # what val_loss's graph reaches, not what it looked up: a val_loss that read hp["lr"]
        # and used nothing of it let windows no step reads through, "learned" by the
        # schedule's smoothing (the kinds probe)
        self._check_windows(hp.accessed, reach_v)
        self._check_own_update(lam)
        self._checked_dtype = lam.dtype

    # -- the checks' parts ------------------------------------------------------------------------
    def _call(self, which: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A loss called by a check: torch's dtype error of a model and data in different
        dtypes becomes one that names both and the fix; so does a training loss that unpacks
        a :class:`~hypergrad.data.MiniBatches` batch without its example indices, and a torch
        function given a differentiated tensor where it takes a number or has no derivative."""
        try:
            return fn(*args)
        except TypeError as err:
            _no_derivative(which, err)
            raise
        except (ValueError, RuntimeError, IndexError) as err:
            self._translate(which, err)
            _no_derivative(which, err)
            self._note_shapes(which, err)
            raise

    def _note_shapes(self, which: str, err: BaseException) -> None:
        """A note on an error a loss raised at its first call (a shape, a target's dtype or
        range): the data's and the model's shapes, where the model and the data most often
        disagree (``mat1 and mat2 shapes cannot be multiplied (25x8 and 6x16)``)."""
        if raised_in_hypergrad(err):
            return  # its own message says what it is

        data = [f"{d}: {_shape_dtype(x)}" for d, x in self._data_tensors(which)[:4]]
        params = [f"{k} {tuple(v.shape)}" for k, v in
                  list(self.fmodel.module.named_parameters())[:3]]
        if "Expected more than 1 value per channel" in str(err):  # torch's BatchNorm
            err.add_note(
                f"hypergrad: a BatchNorm layer in training mode got one example per channel "
                f"({which}'s batch: {'; '.join(data[:2])}): its batch statistics need at least "
                f"two. Use batch_size >= 2 (a DataLoader whose last batch has one example: "
                f"drop_last=True).")
            return
        err.add_note(
            f"hypergrad: raised by {which} at its first call (InnerProblem's check); "
            f"{'; '.join(data) or 'no data tensors found'}; the model's first parameters: "
            f"{', '.join(params)}. Check that the data's features and labels fit the model "
            f"(number of features, label dtype and range).")

    def _translate(self, which: str, err: BaseException) -> None:
        """Raise what ``err`` means where it is a known mistake (see :meth:`_call`)."""
        if isinstance(err, ValueError):
            from .data import MiniBatches

            unpack = _UNPACK.match(str(err))
            if (which != "train_loss" or unpack is None
                    or not isinstance(self._batch.data, MiniBatches)):
                return
            n = len(self._batch.data.tensors)
            names = ", ".join(["x", "y", "z"][:n] if n <= 3 else [f"x{i}" for i in range(n)])
            raise ValueError(
                f"InnerProblem: train_loss unpacks the mini-batch into {unpack[1]} values "
                f"({str(err)}), but a MiniBatches batch is its {n} tensor"
                f"{'s' if n > 1 else ''} and then the example indices: {n + 1} values. Unpack "
                f"them too, e.g. {names}, idx = batch (or {names}, _ = batch)."
            ) from err
        if isinstance(err, RuntimeError):
            if not _DTYPE_ERROR.search(str(err)):
                return
            found = _other_dtype(self._data_tensors(which), self.dtype, str(err))
            if found is None:
                return
            desc, x = found
            to_data = f"x{_TO.get(self.dtype, f'.to({self.dtype})')}"
            fix = (f"Convert the data to the model's dtype: {to_data}"
                   if not (x.dtype.is_floating_point or x.dtype.is_complex)
                   or x.dtype in (torch.float16, torch.bfloat16) else
                   f"Convert one side: the model, model{_TO.get(x.dtype, f'.to({x.dtype})')}, "
                   f"or the data, {to_data}")
            raise TypeError(
                f"InnerProblem: the model is {self.dtype} but {desc} is {x.dtype} (shape "
                f"{tuple(x.shape)}), and torch cannot mix them in {which} "
                f"({str(err).splitlines()[0]}). {fix}."
            ) from err

    def _data_tensors(self, which: str) -> list[tuple[str, Tensor]]:
        """The tensors a loss reads besides the model: mini-batch 0 and what ``train_loss``
        closes over, or what ``val_loss`` closes over (best effort, for messages)."""
        if which == "train_loss":
            leaves, _ = tree_flatten(self.first_batch())
            out = [(f"tensor {i} of mini-batch 0", x) for i, x in enumerate(leaves)
                   if isinstance(x, Tensor)]
            return out + _closure_tensors(self.train_loss, "train_loss")
        return _closure_tensors(self.val_loss, "val_loss")

    def _check_data(self) -> None:
        """Once per problem: the per-example hyperparameters against the data, then every
        training tensor finite (mini-batch 0; all data of a MiniBatches or a sequence of
        batches), and the model's initial weights and buffers finite."""
        if self._data_checked:
            return
        batch0 = self.first_batch()
        src = self._batch
        _check_per_example(self.hyperparams, batch0, getattr(src, "n_examples", None))
        data: list[tuple[str, Tensor]] = []
        whole = getattr(src, "data", None)
        _warn_unread_examples(self.hyperparams, whole, self.steps)
        if whole is not None and hasattr(whole, "tensors"):  # a MiniBatches: all its tensors
            data = [(f"MiniBatches tensor {i}", x) for i, x in enumerate(whole.tensors)]
        elif isinstance(whole, Sequence):
            for j, b in enumerate(whole):
                leaves, _ = tree_flatten(b)
                data += [(f"tensor {i} of mini-batch {j}", x) for i, x in enumerate(leaves)
                         if isinstance(x, Tensor)]
        else:
            leaves, _ = tree_flatten(batch0)
            data = [(f"tensor {i} of mini-batch 0", x) for i, x in enumerate(leaves)
                    if isinstance(x, Tensor)]
        for desc, x in data:
            if x.is_meta:  # failed as torch's "Tensor.item() cannot be called on meta tensors"
                raise ValueError(
                    f"InnerProblem: the training data's {desc} (shape {tuple(x.shape)}) is on "
                    f"the meta device, which holds no values: move it to the model's device "
                    f"({self.device}) with x.to('{self.device}'), or build it there.")
            bad = _non_finite(x)
            if bad:
                raise ValueError(
                    f"InnerProblem: the training data has non-finite values: {desc} (shape "
                    f"{tuple(x.shape)}) has {bad}. A NaN or inf input makes the losses and "
                    f"every hypergradient NaN, which would look like a diverging learning "
                    f"rate. Clean the data before building the problem, e.g. keep = "
                    f"torch.isfinite(x).flatten(1).all(1); x, y = x[keep], y[keep] (or "
                    f"x = torch.nan_to_num(x); a -inf additive mask: pass a boolean mask)."
                )
        fm = self.fmodel
        for k in fm.param_names:
            bad = _non_finite(fm.module.get_parameter(k))
            if bad:
                raise ValueError(
                    f"InnerProblem: the model's initial parameter {k!r} has {bad}; training "
                    f"from it gives NaN everywhere. Re-initialise the model (e.g. "
                    f"module.reset_parameters()) or load finite weights."
                )
        state = set(fm.state_buffer_names)
        for k, b in fm.module.named_buffers():
            # a constant buffer may hold infinities on purpose (a causal mask of -inf added to
            # attention scores); a NaN, or an infinity in state training updates, is a fault
            bad = _non_finite(b) if k in state else _non_finite(b, nan_only=True)
            if bad:
                raise ValueError(
                    f"InnerProblem: the model's buffer {k!r} has {bad} at the start; reset it "
                    f"(e.g. BatchNorm: module.reset_running_stats())."
                )
        self._data_checked = True

    def _probe_model(self, lam: Tensor) -> None:
        """Once per problem: run the losses with a :class:`~hypergrad.model.ModelProbe` to find
        what the model's forward writes. Weights written in place are refused naming the
        module; buffers it writes become state (:meth:`FunctionalModel.track`), unless their
        update cuts a dependence on the weights that a loss reads (``torch.no_grad()``), or
        changes their shape. The user's module is left as it was."""
        fm = self.fmodel
        if fm.probed:
            if fm.refused is not None:
                raise fm.refused
            return
        self._check_data()
        lam = lam.detach()
        snapshot = {k: v.detach().clone() for k, v in _tensors_of(fm.module).items()}
        attrs = _numbers_of(fm.module)
        probe = ModelProbe(fm)
        leaves = {k: v.requires_grad_() for k, v in fm.initial_params().items()}
        # one batch for the probe and the in-place check: a source that gives a new tensor at
        # each call (MiniBatches indexes its data) hid a write (x.div_(2)) from the check, and
        # forward mode then failed with torch's 'mutate a captured Tensor'
        first = self.first_batch()

        def run_train(params: dict[str, Tensor], pr: ModelProbe) -> Any:
            with torch.enable_grad(), step_rng(self.seed, 0, self.device), _quiet():
                p = {k: v.clone() for k, v in params.items()}
                hp = HPValues(self.hyperparams.values(lam, 0, self.steps), "train_loss")
                model = ModelFn(fm, p, fm.initial_buffers(), True, 0, probe=pr)
                return self._call("train_loss", self.train_loss, model, first, hp)

        def run_val(pr: ModelProbe) -> Any:
            with torch.no_grad(), step_rng(self.seed, VALIDATION_STEP, self.device), _quiet():
                hpv = HPValues(self.hyperparams.values(lam, None, self.steps), "val_loss")
                model = ModelFn(fm, {k: v.detach().clone() for k, v in leaves.items()},
                                fm.initial_buffers(), self.val_mode == "train", self.steps,
                                probe=pr)
                return self._call("val_loss", self.val_loss, model, hpv)

        batch0 = [(x, x._version, x.detach().clone()) for x in tree_flatten(first)[0]
                  if isinstance(x, Tensor) and not x.is_inference()]
        try:
            loss = run_train(leaves, probe)
            run_val(probe)
        finally:
            changed = _restore(fm.module, snapshot)
            written = _restore_batch(batch0)
            counted = _restore_numbers(fm.module, attrs)
        if written:
            i, x = written
            raise ValueError(
                f"InnerProblem: train_loss writes the mini-batch in place (tensor {i} of "
                f"mini-batch 0, shape {tuple(x.shape)}; restored now), e.g. x.div_(255) or "
                f"x[...] = ...: each evaluation of a step (every method evaluates a step "
                f"several times, and so do the checks) would see data the one before changed, "
                f"plain runs would change your data set run after run, and torch.func's "
                f"transforms refuse it ('attempted to call in-place operation ... that would "
                f"mutate a captured Tensor'). Transform the batch out of place: x = x / 255.")
        if counted:
            owner, name, before, after = counted[0]
            raise ValueError(
                f"InnerProblem: running the model changed the Python attribute "
                f"{name!r} of {describe_module(fm, owner)} ({_said(before)} -> {_said(after)}; "
                f"restored now): state kept outside its parameters and buffers, which training "
                f"can neither carry nor "
                f"differentiate, and which every method, running forward a different number "
                f"of times, would see at other values (forward and reverse mode disagreed). "
                f"Register it as a buffer (self.register_buffer(...)) and update it out of "
                f"place, or keep forward free of such writes."
                + (f" Others changed: {[f'{m}.{a}' if m else a for m, a, _, _ in counted[1:]]}."
                   if counted[1:] else ""))
        try:
            grads = _grads_of(loss, leaves)
        except RuntimeError as err:  # checkpoint(use_reentrant=True) fails in autograd.grad
            refusal = _transform_refusal(err)
            if refusal is None:
                raise
            raise refusal from err
        if fm.padded:
            fm.check_padding(leaves, grads)
        if changed:
            raise ValueError(
                f"InnerProblem: running the model changed its own tensors {changed} (restored "
                f"now): its forward writes tensors it reaches outside the parameters and "
                f"buffers that a functional call passes in (e.g. a reference kept in an "
                f"attribute), which training could neither carry nor differentiate. Write "
                f"nothing in forward, or register the tensor as a buffer."
            )
        writes = probe.writes
        weights = [k for k in writes if k in fm.param_names
                   or (k in fm.constants and k in dict(fm.module.named_parameters()))]
        if weights:
            who = find_writers(fm, lambda: run_train(leaves, ModelProbe(fm)), weights)
            k = weights[0]
            mod = who.get(k, "")
            attr = k[len(mod) + 1:] if mod and k.startswith(mod + ".") else k
            raise ValueError(
                f"InnerProblem: the forward of {describe_module(fm, mod)} writes the "
                f"parameter {k!r} in place (e.g. self.{attr}.data.clamp_(...), or an in-place "
                f"op under torch.no_grad()); that change is no part of the optimizer's "
                f"update, so no method can differentiate it (finite differences would "
                f"disagree). Constrain it out of place: w = self.{attr}.clamp(-1, 1) in "
                f"forward and use w (e.g. F.linear(x, w, bias)), or register a "
                f"parametrization (torch.nn.utils.parametrize.register_parametrization), which "
                f"hypergrad differentiates exactly."
                + (f" Other parameters written: {weights[1:]}." if weights[1:] else "")
            )
        track: dict[str, torch.dtype] = {}
        for k, new in writes.items():
            old = _lookup_tensor(fm.module, k)
            if k in fm.state_buffer_names or old is None:
                who = find_writers(fm, lambda: run_train(leaves, ModelProbe(fm)), [k])
                raise ValueError(
                    f"InnerProblem: the forward of {describe_module(fm, who.get(k, ''))} "
                    f"writes {k!r}, state that hypergrad updates itself (BatchNorm running "
                    f"statistics, spectral_norm's vectors); leave it to the module that owns "
                    f"it."
                )
            if new.shape != old.shape or new.dtype != old.dtype or old.is_complex():
                who = find_writers(fm, lambda: run_train(leaves, ModelProbe(fm)), [k])
                # a complex buffer of the same shape and dtype was told it was replaced "by
                # one of" the same (the dtypes probe): say what is wrong with it
                what = (f"writes its complex buffer {k!r} ({old.dtype})"
                        if new.shape == old.shape and new.dtype == old.dtype else
                        f"replaces its buffer {k!r} ({old.dtype}, shape {tuple(old.shape)}) by "
                        f"one of {new.dtype}, shape {tuple(new.shape)}")
                raise ValueError(
                    f"InnerProblem: the forward of {describe_module(fm, who.get(k, ''))} "
                    f"{what}; hypergrad carries the buffers forward updates as training state "
                    f"of a fixed shape and a real dtype. Keep its shape and a real dtype (a "
                    f"complex value as two real buffers, or torch.view_as_real), or keep a "
                    f"cache that does not depend on the weights in a plain attribute."
                )
            owner = k.rpartition(".")[0]
            norm = fm.module.get_submodule(owner) if owner else fm.module
            if (isinstance(norm, nn.modules.instancenorm._InstanceNorm)
                    and k in probe.train_writes and old.dtype.is_floating_point):
                # torch's kernel writes them in place: with tangents, forward and reverse mode
                # failed as torch's "'native_batch_norm' is not differentiable with respect to
                # argument 'running_mean'" (validation in train mode, which reads none of them)
                raise ValueError(
                    f"InnerProblem: {describe_module(fm, owner)} is {type(norm).__name__}("
                    f"track_running_stats=True) in training: torch's kernel updates its running "
                    f"statistics in place, which no method can carry with their derivatives. "
                    f"Build it with track_running_stats=False (each example is then normalised "
                    f"by its own statistics in training and evaluation alike), or use "
                    f"nn.BatchNorm1d/2d, whose running statistics hypergrad carries exactly.")
            if (old.dtype.is_floating_point and k in probe.train_writes
                    and not _reaches(new, leaves)
                    and self._depends_on_weights(k, leaves, run_train)
                    and self._read_by_a_loss(k, old, leaves, run_train, run_val)):
                who = find_writers(fm, lambda: run_train(leaves, ModelProbe(fm)), [k])
                leaf = k.rpartition(".")[2]
                owner = k.rpartition(".")[0]
                fix = (f"Write the update out of place without no_grad or detach (hypergrad runs "
                       f"forward functionally and keeps no graph across steps), e.g. self.{leaf} "
                       f"= (1 - m) * self.{leaf} + m * mean (a recurrent hidden state: "
                       f"self.{leaf} = hn without .detach(), which is truncated BPTT exactly), "
                       f"or use nn.BatchNorm1d/2d, whose "
                       f"statistics hypergrad carries exactly. Where forward also reads the "
                       f"updated buffer in training, that update then enters the training "
                       f"gradient, which torch's detached update leaves out: the training "
                       f"differs slightly from the module's under torch.optim.")
                if isinstance(fm.module.get_submodule(owner) if owner else fm.module,
                              nn.modules.instancenorm._InstanceNorm):
                    fix = ("Build it with track_running_stats=False (each example is then "
                           "normalised by its own statistics in training and evaluation "
                           "alike), or use nn.BatchNorm1d/2d, whose running statistics "
                           "hypergrad carries exactly.")
                raise ValueError(
                    f"InnerProblem: the forward of {describe_module(fm, who.get(k, ''))} "
                    f"updates its buffer {k!r} from values that depend on the weights without "
                    f"autograd (under torch.no_grad(), or through .detach() / .data), and a "
                    f"loss reads it: how the hyperparameters move it is lost, so every "
                    f"hypergradient through it would be wrong (finite differences would "
                    f"disagree). {fix}"
                )
            track[k] = old.dtype
        fm.track(track)
        fm.probed = True
        try:
            self._check_module_reads(lam)
            self._check_transforms(lam)
        except ValueError as err:  # kept: a second check() refuses again
            fm.refused = err
            raise
        self._warn_unseeded(lam)
        self._warn_detached(lam)
        self._warn_unread(grads, lam)

    def _check_own_update(self, lam: Tensor) -> None:
        """An inner optimizer of one's own (not hypergrad's): its ``update`` must return
        ``(new_params, new_state)``, the parameters by the same names, shapes and dtype, the
        state of the structure ``init`` gave. A wrong one failed deep inside torch ("Mismatch
        in shape: grad_output[0]...", a pytree error) without naming the optimizer."""
        opt = self.optimizer
        if type(opt).__module__.startswith("hypergrad."):
            return
        name = type(opt).__name__
        with torch.no_grad():
            state = self.initial_state(lam)
        inputs = [x for x in tree_flatten((state.params, state.opt))[0] if isinstance(x, Tensor)]
        versions = [x._version for x in inputs]
        params, opt_state, (got,) = self._zero_gradient_updates(lam, [0], state)
        if any(x._version != v for x, v in zip(inputs, versions)):
            raise TypeError(
                f"InnerProblem: {name}.update writes its inputs in place (the state or the "
                f"parameters: torch.optim's buf.mul_(...).add_(g) habit), which the "
                f"differentiation through it cannot follow (torch's 'a leaf Variable that "
                f"requires grad is being used in an in-place operation'); compute new tensors "
                f"and return them, e.g. buf = momentum * state.buf[k] + g "
                f"(docs/extending.md).")
        self._check_own_state(name, opt_state, params)
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], Mapping)):
            raise TypeError(f"InnerProblem: {name}.update returned {type(got).__name__}; it "
                            f"must return (new_params, new_state): a dict of the parameters "
                            f"by name and the state as init gave it (docs/extending.md).")
        new, new_state = got
        if set(new) != set(params):
            raise ValueError(f"InnerProblem: {name}.update returned parameters "
                             f"{sorted(new)[:6]}, expected the model's {sorted(params)[:6]} "
                             f"(every trainable parameter, by name).")
        for k, v in params.items():
            w = new[k]
            if not isinstance(w, Tensor) or w.shape != v.shape or w.dtype != v.dtype:
                what = (f"shape {tuple(w.shape)} and dtype {w.dtype}" if isinstance(w, Tensor)
                        else type(w).__name__)
                raise ValueError(f"InnerProblem: {name}.update returned {k!r} of {what}; the "
                                 f"parameter has shape {tuple(v.shape)} and dtype {v.dtype}.")
        if tree_flatten(new_state)[1] != tree_flatten(opt_state)[1]:
            raise ValueError(f"InnerProblem: {name}.update returned a state of another structure "
                             f"than init's ({type(new_state).__name__} against "
                             f"{type(opt_state).__name__}); it must return the state as init "
                             f"built it, its entries updated.")

    def _check_own_state(self, name: str, state: Any, params: Mapping[str, Tensor]) -> None:
        """The state ``init`` gives: forward mode carries a tangent for each of its tensors,
        so they are floating point (a step counter failed in torch's jvp, "Expected primal to
        be floating point"), and where the optimizer says ``elementwise = True`` each field
        is a dict by parameter name (a tensor field failed with "'Tensor' object has no
        attribute 'items'")."""
        fields = getattr(state, "_fields", None)
        for f in fields or ():
            v = getattr(state, f)
            leaves = tree_flatten(v)[0]
            bad = [x for x in leaves if not (isinstance(x, Tensor) and x.is_floating_point())]
            if bad:
                x = bad[0]
                what = f"dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
                raise TypeError(
                    f"InnerProblem: {name}.init gives a state whose field {f!r} holds {what}; "
                    f"forward mode carries a tangent for every state tensor, so each must be a "
                    f"floating-point tensor (the parameters' dtype). A step counter is the "
                    f"`step` argument update receives (the inner step, from 0), not state "
                    f"(docs/extending.md).")
            if getattr(self.optimizer, "elementwise", False) and not (
                    isinstance(v, Mapping) and set(v) <= set(params)):
                raise TypeError(
                    f"InnerProblem: {name} says elementwise = True, whose tangent reads each "
                    f"state field as a dict parameter name -> tensor, and its state's field "
                    f"{f!r} is {type(v).__name__}"
                    f"{'' if not isinstance(v, Mapping) else f' with keys {sorted(v)[:4]}'}: "
                    f"keep one entry per parameter, by name, or set elementwise = False.")

    def _zero_gradient_updates(self, lam: Tensor, steps: Sequence[int],
                               state: InnerState | None = None
                               ) -> tuple[dict[str, Tensor], Any, list[Any]]:
        """The initial parameters, the optimizer's initial state, and what one update with zero
        gradients from them returns at each of ``steps`` (the checks of the update; ``state``:
        the initial state, if made already)."""
        with torch.no_grad():
            state = self.initial_state(lam) if state is None else state
            params = {k: v.detach() for k, v in state.params.items()}
            zeros = {k: torch.zeros_like(v) for k, v in params.items()}
            return params, state.opt, [self.update(zeros, state.opt, params, lam, t)
                                       for t in steps]

    def _warn_unread(self, grads: dict[str, Tensor | None], lam: Tensor) -> None:
        """Warn (:class:`~hypergrad.errors.UnreadParameterWarning`) when the training loss on
        the first mini-batch reads no trainable parameter of some name and the inner optimizer
        moves that parameter with a zero gradient (a weight decay, under any name): it then
        moves at every step here and stays as it is under ``torch.optim`` (which skips a
        parameter whose ``.grad`` is ``None``). Checked by the mechanism, not by argument
        names: one update with zero gradients from the initial state, at the first, middle and
        last steps' hyperparameter values (a learning rate warmed up from 0 does not move
        anything at step 0)."""
        unread = [k for k, g in grads.items() if g is None]
        if not unread:
            return
        params, _, got = self._zero_gradient_updates(
            lam, sorted({0, self.steps // 2, self.steps - 1}))
        after = [g[0] for g in got]
        moved = [k for k in unread if any(not torch.equal(a[k], params[k]) for a in after)]
        if not moved:
            return
        wd = getattr(self.optimizer, "args", {}).get("weight_decay")
        how = (f"the inner optimizer (weight_decay={wd!r}) moves them with a zero gradient"
               if wd is not None else "the inner optimizer moves them with a zero gradient "
               "(a weight decay under another name, say)")
        first = moved[0]
        warnings.warn(
            f"InnerProblem: train_loss reads none of the trainable parameters {moved} (on the "
            f"first mini-batch), and {how}: hypergrad updates every parameter, with a zero "
            f"gradient for these, so they move (toward 0 under a decay) at every step, where "
            f"torch.optim skips a parameter whose .grad is None and leaves it as it was. "
            f"Hypergradients are exact for hypergrad's update; to train as torch does, freeze "
            f"them before building the problem (model.get_parameter({first!r})"
            f".requires_grad_(False): they become constants), give them no decay (a "
            f"PerGroup(..., default=0.0) whose groups leave them out), or drop them from the "
            f"model.", UnreadParameterWarning, stacklevel=4)

    def _loss_at_start(self, which: str, params: dict[str, Tensor], mode: Any = None, *,
                       lam: Tensor | None = None, raw: dict[str, Tensor] | None = None) -> Any:
        """``which`` (``"train_loss"`` on the first batch at step 0, or ``"val_loss"``) at
        ``params`` and the initial buffers, under its step's random stream (and ``mode``, a
        torch function mode, if given); the hyperparameters from ``lam``, or from ``raw``, the
        raw values by group (a group a leaf of its own)."""
        fm = self.fmodel
        train = which == "train_loss"
        step = 0 if train else None
        with (torch.enable_grad(), step_rng(self.seed, 0 if train else VALIDATION_STEP,
                                            self.device), _quiet(),
              mode if mode is not None else contextlib.nullcontext()):
            hps = self.hyperparams
            if raw is None:
                assert lam is not None, "lam or raw"
                hp = HPValues(hps.values(lam, step, self.steps), which)
            else:
                hp = HPValues(hps.values_from(raw, step, self.steps), which)
            model = ModelFn(fm, params, fm.initial_buffers(), train or self.val_mode == "train",
                            0 if train else self.steps)
            return (self.train_loss(model, self.first_batch(), hp) if train
                    else self.val_loss(model, hp))

    def _check_module_reads(self, lam: Tensor) -> None:
        """Refuse a loss that reads the trainable parameters of the module given to the problem
        (``model.parameters()`` of a module the loss closed over) instead of the model it
        receives: hypergrad trains copies, so those are the initial values, constants to every
        method: a weight penalty on them neither trains nor has a hypergradient (exactly 0,
        silently, before this check)."""
        fm = self.fmodel
        named: dict[str, Tensor] = dict(fm.module.named_parameters())
        own = {id(named[k]): (named[k], k) for k in fm.param_names if k in named}
        if not own:
            return
        params = {k: v.detach().clone() for k, v in fm.initial_params().items()}
        for which in ("train_loss", "val_loss"):
            finder = _OwnParameterReads(own)
            try:
                with torch.no_grad():
                    self._loss_at_start(which, params, finder, lam=lam.detach())
            except Exception:  # noqa: BLE001 - the losses' own checks report their errors
                continue
            if not finder.read:
                continue
            raise ValueError(
                f"InnerProblem: {which} reads the trainable parameters {finder.read} of the "
                f"module given to InnerProblem themselves, not the copies hypergrad trains: a "
                f"loss that closed over the module (model.parameters(), model.<layer>.weight) "
                f"or a forward that keeps a reference outside the registered parameters (in a "
                f"list or dict attribute) reads their initial values, constants to every "
                f"method, so a penalty on them neither trains the model nor has a "
                f"hypergradient (exactly 0). Read the trained weights from the model argument, "
                f"m.params (name -> tensor), e.g. sum(w.pow(2).sum() for w in "
                f"m.params.values()), and in forward as attributes (self.<layer>.weight), which "
                f"the functional call replaces; to anchor to the initial weights on purpose, "
                f"copy them once outside the loss (w0 = {{k: v.detach().clone() for k, v in "
                f"model.named_parameters()}}).")

    def _check_transforms(self, lam: Tensor) -> None:
        """Refuse, before anything costly, a training loss that torch.func's transforms cannot
        differentiate (every exact method takes the step's derivatives with them): activation
        checkpointing (``torch.utils.checkpoint``: saved-tensor hooks, or a reentrant
        autograd.Function without ``setup_context``), which otherwise failed at the first
        hypergradient with torch's own message. One ``torch.func.grad`` of the training loss
        at the initial weights; its other errors are left to the methods."""
        params = {k: v.detach().clone() for k, v in self.fmodel.initial_params().items()}
        lam = lam.detach()
        try:
            with self.cells():  # recurrent layers as the methods' passes run them
                torch.func.grad(lambda p: self._loss_at_start("train_loss", p, lam=lam))(params)
        except Exception as err:  # noqa: BLE001 - any other error is the losses' checks' to say
            refusal = _transform_refusal(err)
            if refusal is not None:
                raise refusal from err

    def _warn_unseeded(self, lam: Tensor) -> None:
        """Warn (:class:`~hypergrad.errors.UnseededRandomnessWarning`) when a loss evaluated twice
        at the initial weights, the same batch and step gives two values: it draws randomness
        that :func:`~hypergrad.rng.step_rng` does not fix (NumPy, Python's ``random``, a
        generator of its own), so each method's evaluations of a step see other draws and the
        methods differentiate different functions (forward and reverse mode 8 % apart on a small
        MLP with NumPy input noise, measured). Likewise a callable batch source whose step 0,
        middle or last step, read twice, gives two batches (a source whose NumPy noise began
        at step 2 passed the check of step 0 alone). The losses are checked at step 0, by
        :data:`UNSEEDED_CALLS` calls: a draw made only at later steps, or rarely, can pass."""
        losses = ["train_loss", "val_loss"]
        if self._batch.own:
            from .data import batch_fingerprint

            for t in sorted({0, self.steps // 2, self.steps - 1}):
                first, again = (batch_fingerprint(self.batch(t)) for _ in range(2))
                if first is not None and again is not None and first != again:
                    break
            else:
                first = again = None
            if first != again:
                if t == 0:
                    losses.remove("train_loss")  # its two values would differ for that reason
                warnings.warn(
                    f"InnerProblem: batches gave two mini-batches for step {t} when read twice: "
                    "the callable draws randomness that hypergrad does not seed per step "
                    "(Python's random, NumPy, a generator of its own; torch's default "
                    "generator is seeded per step), or keeps state that reading changes. "
                    "Every method reads a step's batch a different number of times (reverse "
                    "mode again on its way back), so they would differentiate different "
                    "functions. Draw with torch's default generator (torch.randint without "
                    "generator=), or from a torch.Generator seeded by t, e.g. "
                    "torch.Generator().manual_seed(seed * 1_000_003 + t); or use "
                    "hypergrad.data.MiniBatches.", UnseededRandomnessWarning, stacklevel=4)
        fm = self.fmodel
        lam = lam.detach()
        params = {k: v.detach().clone() for k, v in fm.initial_params().items()}
        tol = {torch.float64: 1e-9, torch.float32: 1e-5}.get(fm.dtype, 1e-2)
        for which in losses:
            try:
                with torch.no_grad():  # four calls: a per-batch coin flip (a random flip of
                    # the input) gave two equal values in half the runs of two calls
                    vals = [float(self._loss_at_start(which, params, lam=lam))
                            for _ in range(UNSEEDED_CALLS)]
            except Exception:  # noqa: BLE001 - the losses' own checks report their errors
                continue
            a = vals[0]
            b = next((v for v in vals[1:] if abs(v - a) > tol * max(abs(a), abs(v), 1e-30)),
                     a)
            if not all(math.isfinite(v) for v in vals) or b == a:
                continue
            warnings.warn(
                f"InnerProblem: {which} gave {a:.10g} and then {b:.10g} at the same weights, "
                f"batch and step: it draws randomness that hypergrad does not seed per step "
                f"(Python's random, NumPy, a torch.Generator of your own; torch's default "
                f"generator is seeded per step, hypergrad.rng), or reads state that changes "
                f"from call to call (a counter, a cache). Every method evaluates a step a "
                f"different number of times, so forward mode, reverse mode and finite "
                f"differences would differentiate different functions (8 % apart on a small "
                f"MLP with NumPy input noise, measured), and no run repeats. Draw it with "
                f"torch's default generator (torch.rand / torch.randn without generator=, "
                f"nn.Dropout), or in the batch source, which every method reads alike; make "
                f"a loss's state a function of the step t (the batch source's, or a "
                f"hyperparameter) rather than of how often it was called.",
                UnseededRandomnessWarning, stacklevel=4)

    def _warn_detached(self, lam: Tensor) -> None:
        """Warn (:class:`~hypergrad.errors.DetachedValueWarning`) when a loss's value reads a
        value computed from the weights and cut from the autograd graph (a stop-gradient target,
        ``x / x.norm().detach()``): no method's derivative sees how it moves. A pass of each
        loss at the initial weights (the training loss on the first batch) follows the cuts
        (:class:`_DetachFinder`); where one reaches the loss's value, a central difference of
        the loss along a random direction confirms that its gradient misses something (a custom
        ``autograd.Function``, whose forward runs under no_grad, passes it)."""
        fm = self.fmodel
        lam = lam.detach()
        for which in ("train_loss", "val_loss"):
            train = which == "train_loss"
            loss = functools.partial(self._loss_at_start, which, lam=lam)
            params = {k: v.detach().clone().requires_grad_() for k, v in
                      fm.initial_params().items()}
            finder = _DetachFinder(params.values())
            try:
                how = finder.cut_of(loss(params, finder))
                if how is None and not finder.custom:
                    continue
                off = _directional_mismatch(loss, params)
            except Exception:  # noqa: BLE001 - the losses' own checks report their errors
                continue
            if off < (1e-4 if fm.dtype == torch.float64 else 1e-2):
                if how is None and train:  # its backward may still not be differentiable
                    self._warn_custom_second_order(loss, params, finder.custom)
                continue
            if how is None:  # a custom autograd.Function's backward is not its derivative
                functions = ", ".join(finder.custom)
                warnings.warn(
                    f"InnerProblem: {which} reads the output of the custom autograd.Function "
                    f"{functions}, and its gradient is {off:.1%} off a central difference "
                    f"along a random direction at the initial weights: the Function's backward "
                    f"is not the derivative of its forward (a gradient reversal or scaling "
                    f"layer, a straight-through estimator). Training uses that backward as its "
                    f"gradient, but every method (forward, reverse, implicit, online) also "
                    f"takes it as the Jacobian of the forward when it differentiates the "
                    f"training steps and the validation loss, so hypergradients are not those "
                    f"of the training that runs (a gradient-scaling layer: the learning rate's "
                    f"of the wrong sign, measured); only FiniteDifference sees the difference. "
                    f"Measure how far with hypergrad.testing.hypergradcheck(problem, "
                    f"raise_exception=False), or silence this with warnings.filterwarnings("
                    f"'ignore', category=hypergrad.errors.DetachedValueWarning).",
                    DetachedValueWarning, stacklevel=4)
                continue
            if finder.custom:  # the cut may be inside one: its forward runs under no_grad
                how = (f"{how} (or the custom autograd.Function {', '.join(finder.custom)}, "
                       f"whose forward runs under torch.no_grad() and whose backward is not its "
                       f"forward's derivative)")
            what = ("training as if that value were a constant: the derivative of each step's "
                    "update misses how it moves" if train else
                    "the validation loss as if that value were a constant: its gradient misses "
                    "how it moves")
            # torch.func's transforms and autograd treat a cut through .data differently:
            # forward and reverse mode then differ from each other too (6.4e-4, measured)
            data = (" Through .data, forward and reverse mode also differ from each other "
                    "(torch.func's transforms and autograd treat that cut differently): use "
                    ".detach(), which every method treats alike." if ".data" in how else "")
            warnings.warn(
                f"InnerProblem: {which}'s value reads {how} of a value computed from the "
                f"model's weights (its gradient is {off:.1%} off a central difference along a "
                f"random direction at the initial weights). Every method (forward, reverse, "
                f"implicit, online) differentiates {what} with the weights, so hypergradients "
                f"are off by that part; only FiniteDifference sees it (22 % off on a small MLP "
                f"with a stop-gradient target, measured).{data} If the value should be "
                f"differentiated, drop the cut; if it is a stop-gradient on purpose, read the "
                f"hypergradients as approximate and measure how far with "
                f"hypergrad.testing.hypergradcheck(problem, raise_exception=False) (finite "
                f"differences beside the methods, in float64), or silence this with "
                f"warnings.filterwarnings('ignore', category=hypergrad.errors."
                f"DetachedValueWarning).", DetachedValueWarning, stacklevel=4)

    def _warn_custom_second_order(self, loss: Callable[[dict[str, Tensor]], Any],
                                  params: dict[str, Tensor], custom: Sequence[str]) -> None:
        """Warn (:class:`~hypergrad.errors.DetachedValueWarning`) when the training loss
        reads a custom ``autograd.Function`` whose backward is right but not itself
        differentiable (it detaches a saved tensor, runs under no_grad or in NumPy): every
        method differentiates each training step's update, so it needs the loss's Hessian, and
        the part through that backward comes out as zero (forward and reverse mode agreed to
        1e-16 and were both 8e-3 off finite differences, silently, before this check)."""
        try:
            off = _hessian_mismatch(loss, params)
        except Exception:  # noqa: BLE001 - the losses' own checks report their errors
            return
        if off < (1e-4 if self.fmodel.dtype == torch.float64 else 5e-2):
            return
        warnings.warn(
            f"InnerProblem: train_loss reads the custom autograd.Function "
            f"{', '.join(custom)}, whose backward gives the right gradient but is not itself "
            f"differentiable: a Hessian-vector product of the training loss is {off:.1%} off a "
            f"central difference of its gradient at the initial weights (a backward that "
            f"detaches a saved tensor, runs under torch.no_grad() or in NumPy). Every method "
            f"(forward, reverse, implicit, online) differentiates each training step's "
            f"update, which needs that second derivative, so hypergradients miss the part "
            f"through the Function (forward and reverse mode still agree with each other); "
            f"only FiniteDifference sees it. Write the backward with differentiable torch "
            f"operations on the saved tensors (no .detach()), or measure how far with "
            f"hypergrad.testing.hypergradcheck(problem, raise_exception=False).",
            DetachedValueWarning, stacklevel=5)

    def _depends_on_weights(self, k: str, leaves: dict[str, Tensor],
                            run_train: Callable[[dict[str, Tensor], ModelProbe], Any]) -> bool:
        """Whether the value forward leaves in buffer ``k`` changes with the weights: the
        probe pass again at perturbed weights (the same random draws)."""
        fm = self.fmodel
        a, b = ModelProbe(fm), ModelProbe(fm)
        with torch.no_grad():
            run_train({n: v.detach() for n, v in leaves.items()}, a)
            shifted = {n: _nudged(v) for n, v in leaves.items()}
            run_train(shifted, b)
        x, y = a.writes.get(k), b.writes.get(k)
        return x is not None and y is not None and not torch.equal(x.detach(), y.detach())

    def _read_by_a_loss(self, k: str, old: Tensor, leaves: dict[str, Tensor],
                        run_train: Callable[[dict[str, Tensor], ModelProbe], Any],
                        run_val: Callable[[ModelProbe], Any]) -> bool:
        """Whether a loss changes when buffer ``k`` starts from another value."""
        fm = self.fmodel
        shifted = {k: _nudged(old)}
        with torch.no_grad():
            base = (run_train(leaves, ModelProbe(fm)), run_val(ModelProbe(fm)))
            moved = (run_train(leaves, ModelProbe(fm, shifted)),
                     run_val(ModelProbe(fm, shifted)))
        return any(isinstance(a, Tensor) and isinstance(b, Tensor)
                   and not torch.equal(a.detach(), b.detach()) for a, b in zip(base, moved))

    def later_batches(self, count: int) -> Iterator[tuple[int, Any]]:
        """Up to ``count`` later steps ``t >= 1`` and their mini-batches, read lazily, as the
        checks see them: a stream's first steps, of the checks' own pass (apart from every
        run's, like :meth:`first_batch`); else steps spread over the run. What a check of a
        loss on more than the first batch reads (a term, or padding, in some batches only)."""
        T = self.steps
        stream = self._batch.stream
        if stream is not None:
            for t, b in stream.probe_batches(min(T, count + 1)):
                yield t, self._batch.checked(b, t)
            return
        steps = sorted({1 + (T - 2) * i // max(count - 1, 1) for i in range(count)}
                       & set(range(1, T)))
        for t in steps:
            yield t, self.batch(t)

    def _read_later(self, lam: Tensor, names: list[str]) -> tuple[set[str], set[str]]:
        """What ``train_loss`` reads (and its graph reaches) at later steps, at the initial
        weights, until every one of ``names`` is read: a term switched on for some batches
        only (odd batches, noisy examples) was refused as read by nothing when step 0's batch
        did not switch it on. Up to :data:`LATER_STEPS` steps spread over the run (a stream's
        first ones, of the checks' own pass); a term no step of them reads is refused."""
        read: set[str] = set()
        reach: set[str] = set()
        for t, batch in self.later_batches(LATER_STEPS):
            with step_rng(self.seed, t, self.device):
                _, hp, r, _, _ = self._probe_loss("train_loss", lam, t, batch)
            read |= hp.accessed
            reach |= r
            if read >= set(names):
                break
        return read, reach

    def _probe_loss(self, which: str, lam: Tensor, step: int = 0, batch: Any = None
                    ) -> tuple[Any, HPValues, set[str], bool, dict[str, str]]:
        """One loss at the initial state, each hyperparameter group and each weight a leaf of
        its own: the loss, what it read, the groups its autograd graph reaches, whether it
        reaches a weight (or the model has none), and the operations that cut a group's values
        from the graph on the way (group -> the first). ``train_loss`` at step 0 on the first
        batch, or at ``step`` on ``batch``."""
        hps = self.hyperparams
        leaves = {n: v.detach().clone().requires_grad_() for n, v in hps.split(lam).items()}
        s = self.initial_state()
        # the weights as leaves of their own (sharing storage: the probe writes nothing)
        weights = {k: v.detach().requires_grad_() for k, v in s.params.items()}
        train = which == "train_loss"
        at = step if train else None
        if batch is None and train:
            batch = self.first_batch()
        with torch.enable_grad(), _quiet():
            values = hps.values_from(leaves, at, self.steps)
            hp = HPValues(values, which)
            model = self.fmodel.bind(weights, s.buffers, train or self.val_mode == "train",
                                     step if train else self.steps)
            finder = _CutFinder(values)
            try:
                with finder:
                    out = (self._call(which, self.train_loss, model, batch, hp)
                           if train else self._call(which, self.val_loss, model, hp))
            except (RuntimeError, TypeError) as err:
                cuts = self._find_cuts(which, lam)
                if cuts:
                    name, how = next(iter(cuts.items()))
                    raise ValueError(
                        f"InnerProblem: {which} passes hyperparameter {name!r} to {how}, "
                        f"which fails on a tensor that hypergrad differentiates ("
                        f"{str(err).splitlines()[0]}). Keep hp[{name!r}] a tensor in torch "
                        f"operations (no .item(), float(), .detach(), torch.no_grad() or "
                        f"numpy on it)."
                    ) from err
                raise
        if finder.samplers:
            name, how = next(iter(finder.samplers.items()))
            raise ValueError(
                f"InnerProblem: {which} passes hyperparameter {name!r} to {how}, whose "
                f"derivative in its parameters torch defines as zero: every method would give "
                f"{name!r} a hypergradient of exactly 0 through it, where the training's slope "
                f"(finite differences of the same draws) is not. Draw standard noise and scale "
                f"it, as mean + std * torch.randn_like(x).")
        ids = _reachable(out)
        reaches_w = not weights or any(id(w) in ids for w in weights.values())
        if isinstance(out, Tensor):
            out = out.detach()  # the graph's work is done; the checks read the value
        return (out, hp, {n for n, v in leaves.items() if id(v) in ids}, reaches_w,
                dict(finder.cuts))

    def _warn_partial_cuts(self, lam: Tensor, cuts: dict[str, dict[str, str]]) -> None:
        """Warn (:class:`~hypergrad.errors.DetachedValueWarning`) when a loss reads a
        hyperparameter both as a tensor (or it is bound to an optimizer argument) and through
        an operation that cuts it from the autograd graph, and the cut value feeds the loss
        (``wd * l2 + wd.item() * l1``): every method differentiates the loss as if that value
        were a constant, so the hypergradient misses that part (half of it, silently, before
        this check; a group cut everywhere is refused by :meth:`check`). A cut value that only
        steers a branch or is logged changes nothing near the point: a central difference of
        the loss in the group's raw values along a random direction tells them apart."""
        raw = self.hyperparams.split(lam.detach())
        weights = self.fmodel.initial_params()
        for which, found in cuts.items():
            for name, how in found.items():
                def loss(leaf: dict[str, Tensor], which: str = which,
                         name: str = name) -> Any:
                    return self._loss_at_start(which, weights, raw={**raw, name: leaf[name]})

                try:
                    off = _directional_mismatch(
                        loss, {name: raw[name].clone().requires_grad_()})
                except Exception:  # noqa: BLE001 - the losses' own checks report their errors
                    continue
                if off < (1e-4 if self.dtype == torch.float64 else 1e-2):
                    continue
                what = ("each training step's update" if which == "train_loss"
                        else "the validation loss")
                warnings.warn(
                    f"InnerProblem: {which} reads hyperparameter {name!r} through {how}, which "
                    f"cuts it from the autograd graph, and that value feeds the loss: the "
                    f"loss's derivative in {name!r} is {off:.1%} off a central difference at "
                    f"the initial point. Every method (forward, reverse, implicit, online) "
                    f"differentiates {what} as if that value were a constant, so {name!r}'s "
                    f"hypergradient misses that part; only FiniteDifference sees it. Use "
                    f"hp[{name!r}] as a tensor in torch operations (no .item(), float(), "
                    f".detach(), torch.tensor(...), torch.no_grad() or numpy on it), or "
                    f"measure how far with hypergrad.testing.hypergradcheck(problem, "
                    f"raise_exception=False).", DetachedValueWarning, stacklevel=4)

    def _find_cuts(self, which: str, lam: Tensor) -> dict[str, str]:
        """The first operation that cut each hyperparameter group from the graph in one run
        of ``which`` (for messages): ``.item()``, ``float()``, ``.detach()``, ``.data``,
        numpy, an operation under ``torch.no_grad()``, or one without a derivative."""
        hps = self.hyperparams
        leaves = {n: v.detach().clone().requires_grad_() for n, v in hps.split(lam).items()}
        s = self.initial_state()
        train = which == "train_loss"
        with (torch.enable_grad(), _quiet(), step_rng(self.seed, 0, self.device)):
            values = hps.values_from(leaves, 0 if train else None, self.steps)
            finder = _CutFinder(values)
            hp = HPValues(values, which)
            model = self.fmodel.bind(s.params, s.buffers, train or self.val_mode == "train",
                                     0 if train else self.steps)
            with contextlib.suppress(Exception), finder:
                if train:
                    self.train_loss(model, self.first_batch(), hp)
                else:
                    self.val_loss(model, hp)
        return finder.cuts

    def _cut_message(self, cut: list[str], lam: Tensor, train_read: set[str],
                     val_read: set[str]) -> str:
        found: dict[str, str] = {}
        for which, read in (("train_loss", train_read), ("val_loss", val_read)):
            if any(n in read for n in cut):
                for n, how in self._find_cuts(which, lam).items():
                    found.setdefault(n, f"{how} in {which}")
        name = cut[0]
        where = " and ".join(w for w, r in (("train_loss", train_read), ("val_loss", val_read))
                             if name in r)
        how = found.get(name, "one of .item(), float(), .detach(), .data, torch.no_grad() or "
                              "numpy (the usual causes)")
        more = f" Also cut: {cut[1:]}." if cut[1:] else ""
        if how.startswith("a comparison"):
            more = (f" For min() or max() against a number, torch.clamp(hp[{name!r}], max=...) "
                    f"keeps the derivative where the hyperparameter is the one returned.{more}")
        return (
            f"InnerProblem: hyperparameter {name!r} is read by {where}, but {how} cuts it from "
            f"the autograd graph, so its hypergradient is structurally zero and tuning would "
            f"never move it. Use hp[{name!r}] as a tensor in torch operations "
            f"(no .item(), float(), .detach(), torch.no_grad() or numpy on it), bind it to an "
            f"optimizer argument, or remove it.{more}"
        )

    def _check_finite_losses(self, loss: Tensor, val: Tensor, lam: Tensor) -> None:
        """A NaN or inf loss at the initial (finite) weights is a data or loss problem: name
        the tensor the loss closes over that holds it, when there is one."""
        for which, out in (("train_loss", loss), ("val_loss", val)):
            if bool(torch.isfinite(out.detach()).all()):
                continue
            where = "step 0" if which == "train_loss" else "the initial weights"
            for desc, x in self._data_tensors(which):
                bad = _non_finite(x)
                if bad:
                    raise ValueError(
                        f"InnerProblem: {which} is {float(out)} at {where} (the weights are "
                        f"finite): {desc} (shape {tuple(x.shape)}) has {bad}. That is a data "
                        f"problem, not a learning rate: clean it before building the problem, "
                        f"e.g. keep = torch.isfinite(x).flatten(1).all(1); x, y = x[keep], "
                        f"y[keep] (or x = torch.nan_to_num(x))."
                    )
            raise ValueError(
                f"InnerProblem: {which} is {float(out)} at {where}, with finite weights"
                f"{' and a finite mini-batch 0' if which == 'train_loss' else ''} and "
                f"hyperparameters {self.hyperparams.describe(lam)}: the loss itself or data it "
                f"loads produces it (log(0), 0/0, a hyperparameter outside the loss's domain, "
                f"a mean over an empty split: a validation set or mini-batch of 0 examples); "
                f"no tensor it closes over holds a NaN or inf. Fix the loss or the data first."
            )

    def _check_windows(self, train_read: set[str], val_read: set[str]) -> None:
        """A :class:`~hypergrad.Schedule` with more windows than steps has windows no step
        reads: their hypergradients stay zero and tuning would report them as learned.
        (A schedule that ``val_loss`` reads whole may use every window.)"""
        stepwise = set(self.optimizer.bound_names()) | train_read
        T = self.steps
        for it in self.hyperparams.items:
            if not isinstance(it, Schedule) or it.windows <= T:
                continue
            if it.name not in stepwise or it.name in val_read:
                continue
            read = {it.window(t, T) for t in range(T)}
            unread = [w for w in range(it.windows) if w not in read]
            raise ValueError(
                f"InnerProblem: Schedule({it.name!r}) has windows={it.windows} but steps={T}: "
                f"windows {unread} are read by no step (step t reads window "
                f"t * {it.windows} // {T}), so their hypergradients stay zero and tuning would "
                f"report them as learned. Use windows <= steps, e.g. Schedule({it.name!r}, "
                f"..., windows={T}), or more steps."
            )


def _refuse_single_example_batch(source: Any, fm: FunctionalModel) -> None:
    """Refuse a DataLoader whose last batch of an epoch holds one example for a model with a
    BatchNorm that normalises by batch statistics: torch's BatchNorm fails on it at the end
    of the first epoch, after a whole epoch of work ('Expected more than 1 value per channel
    when training')."""
    from .data import partial_last_batch

    last = partial_last_batch(source)
    if last is None or last[2] != 1 or last[0] == 1:
        return
    n, bs, _ = last
    bn = [k for k, m in fm.module.named_modules()
          if isinstance(m, nn.modules.batchnorm._BatchNorm)
          and (fm.train_modes[k] or not m.track_running_stats)]  # batch statistics
    if not bn:
        return
    name = bn[0]
    raise ValueError(
        f"InnerProblem: the DataLoader's last batch of every epoch holds 1 example ({n} "
        f"examples, batch_size={bs}, drop_last=False), and the model's BatchNorm {name!r} "
        f"trains on batch statistics, which one example does not have: torch fails there "
        f"('Expected more than 1 value per channel when training') at the end of the first "
        f"epoch. Use drop_last=True, or another batch_size.")


def _mode_dependent(m: nn.Module) -> bool:
    """Whether ``m`` computes something else in train mode than in eval mode (torch's layers:
    dropout, normalisation with running statistics)."""
    if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
        return bool(m.track_running_stats)
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return bool(m.p > 0)
    if isinstance(m, nn.MultiheadAttention):
        return bool(m.dropout > 0)
    if isinstance(m, nn.RNNBase):
        return bool(m.dropout > 0 and m.num_layers > 1)
    return False


def _refuse_eval_model(model: nn.Module) -> None:
    """Refuse a model given entirely in eval mode (``model.eval()`` after evaluating it) that
    has dropout or running statistics: training keeps each submodule's mode, so it would train
    with dropout off and the statistics frozen, without a word."""
    if model.training or any(m.training for m in model.modules()):
        return
    found = [name for name, m in model.named_modules() if _mode_dependent(m)]
    if not found:
        return
    kinds = sorted({type(model.get_submodule(n)).__name__ for n in found})
    raise ValueError(
        f"InnerProblem: the model is in eval mode (model.training=False, every submodule too) "
        f"and has {', '.join(kinds)} ({found[0]!r}{' and more' if found[1:] else ''}). "
        f"Training runs each submodule in the mode it had when the problem was built, so it "
        f"would train with dropout off and BatchNorm statistics frozen, unlike a torch loop "
        f"that calls model.train(). Call model.train() before building the problem; to freeze "
        f"some layers on purpose, put only those in eval mode (e.g. model.bn.eval()), or "
        f"model.eval(); model.training = True to keep every submodule in eval mode.")


def _refuse_inference(lam: Any, model: nn.Module | None = None) -> None:
    """Refuse ``torch.inference_mode`` and its tensors, which torch cannot train or
    differentiate: a call inside it, ``lam`` or the model made inside it, all failed deep in
    hypergrad with torch's "Inference tensors do not track version counter" (the precision
    probe). ``torch.no_grad()`` around a call works."""
    fix = "; torch.no_grad() around a call is fine (hypergrad turns on what it differentiates)"
    if torch.is_inference_mode_enabled():
        raise RuntimeError(f"InnerProblem: called inside torch.inference_mode(), whose tensors "
                           f"cannot be trained or differentiated: call it outside{fix}.")
    if isinstance(lam, Tensor) and lam.is_inference():
        raise RuntimeError(f"InnerProblem: lam was made inside torch.inference_mode() (an "
                           f"inference tensor, which cannot be differentiated): make it "
                           f"outside, or pass lam.clone() taken outside inference_mode{fix}.")
    if model is not None:
        made = [n for n, t in [*model.named_parameters(), *model.named_buffers()]
                if not isinstance(t, (nn.parameter.UninitializedParameter,  # lazy: refused
                                      nn.parameter.UninitializedBuffer))
                and t.is_inference()]
        if made:
            raise RuntimeError(
                f"InnerProblem: the model's {made[0]!r}"
                f"{f' (and {len(made) - 1} more)' if len(made) > 1 else ''} was made inside "
                f"torch.inference_mode() (an inference tensor, which cannot be trained): "
                f"build the model outside it, or build a new one outside and load this one's "
                f"weights into it: new.load_state_dict(model.state_dict()){fix}.")


def _check_scalar(name: str, loss: Any, dtype: torch.dtype) -> None:
    if not isinstance(loss, Tensor):
        raise TypeError(f"InnerProblem: {name} returned {type(loss).__name__}; return a scalar "
                        f"tensor.")
    if loss.numel() != 1 or loss.ndim > 1:
        raise ValueError(
            f"InnerProblem: {name} returned a tensor of shape {tuple(loss.shape)}; it must be a "
            f"scalar: reduce it, e.g. loss.mean()."
        )
    if loss.ndim and name != "select_loss":  # select_loss is never differentiated
        raise ValueError(
            f"InnerProblem: {name} returned a tensor of shape {tuple(loss.shape)}; it must be a "
            f"0-d scalar: torch.func.grad, which every method differentiates it with, takes no "
            f"other shape. Return loss.squeeze() (or loss.sum())."
        )
    if not loss.dtype.is_floating_point:
        raise TypeError(f"InnerProblem: {name} returned dtype {loss.dtype}; return a float loss.")
    if torch.finfo(loss.dtype).bits < torch.finfo(dtype).bits:
        # an autocast inside the loss: an 8-bit objective the Trainer ranked points by and
        # tested for divergence on, without a word (the precision probe)
        warnings.warn(PrecisionWarning(
            f"InnerProblem: {name} returned a {str(loss.dtype).replace('torch.', '')} scalar "
            f"for a {str(dtype).replace('torch.', '')} model: it is computed in lower "
            f"precision (torch.autocast inside the loss, or .half()), and its value and "
            f"gradients round to about {float(torch.finfo(loss.dtype).eps):.0e} relative (the "
            f"Trainer ranks points and detects divergence by it). Compute the losses in the "
            f"model's dtype (no autocast inside them)."), stacklevel=5)


def _dataset_size(source: Any) -> int | None:
    """The number of examples of a DataLoader's data set (``len(loader.dataset)``), else
    ``None``: what a :class:`~hypergrad.PerExample`'s ``n`` must equal (its weights are indexed
    by the data set's example indices)."""
    dataset = getattr(source, "dataset", None)
    try:
        return len(dataset) if dataset is not None else None
    except TypeError:  # an IterableDataset without a length
        return None


def _batch_source(batches: Any, seed: int) -> _Batches:
    """Random access by step for a sequence or a callable; a :class:`~hypergrad.data.Stream`
    (one lazy pass per inner run) for any other iterable; a one-shot iterator refused."""
    from .data import MiniBatches, Stream

    if isinstance(batches, Stream):
        if batches.seed is None:
            batches.seed = seed
        return _Batches(batches.batch, _dataset_size(batches.source), stream=batches)
    _refuse_data_as_batches(batches)
    if inspect.isgeneratorfunction(batches):  # callable, so it was read as t -> batch
        name = getattr(batches, "__name__", "it")
        raise ValueError(
            f"InnerProblem: batches is a generator function ({name}): a callable is read as "
            f"t -> the mini-batch of step t, and {name}(t) returns a one-shot generator, not a "
            f"batch. Pass a list of batches, hypergrad.data.MiniBatches, a DataLoader, or an "
            f"object whose __iter__ returns {name}() (a fresh pass on each iter()).")
    if callable(batches) and not isinstance(batches, (Sequence, Tensor)):
        mb = isinstance(batches, MiniBatches)
        return _Batches(batches, getattr(batches, "n", None) if mb else None,
                        batches if mb else None, own=not mb)
    if isinstance(batches, Sequence) and not isinstance(batches, (str, bytes)):
        if len(batches) == 0:
            raise ValueError("InnerProblem: batches is empty; give at least one mini-batch.")
        return _Batches(lambda t: batches[t % len(batches)], data=batches)
    if isinstance(batches, Iterable):
        stream = Stream(batches, seed)
        return _Batches(stream.batch, _dataset_size(batches), stream=stream)
    dataset = hasattr(batches, "__getitem__") and hasattr(batches, "__len__")
    raise TypeError(
        f"InnerProblem: batches must be a sequence, a callable t -> batch or an iterable, got "
        f"{type(batches).__name__}"
        + (f": a data set of examples, not of mini-batches; wrap it in a "
           f"torch.utils.data.DataLoader({type(batches).__name__.lower()}, batch_size=..., "
           f"shuffle=True)." if dataset else ".")
    )


_MAKE_BATCHES = ("hypergrad.data.MiniBatches(x, y, batch_size=...) (shuffled mini-batches, the "
                 "example indices last), [(x, y)] (the whole data set at every step), or a "
                 "DataLoader")


def _refuse_data_as_batches(batches: Any) -> None:
    """Refuse the data set itself given as ``batches``, which would be read as one mini-batch
    per step without an error: a tuple or list of tensors of one data set (``(x, y)``: step 0
    would train on ``x`` alone, step 1 on ``y``), a dict (its keys would be the batches), or
    a file name (its characters would)."""
    if isinstance(batches, (str, bytes, os.PathLike)):
        raise TypeError(
            f"InnerProblem: batches is {type(batches).__name__} {str(batches)!r}: a file name "
            f"is not read (a string would be read one character per step). Load the data "
            f"first (e.g. d = numpy.load(path); x = torch.as_tensor(d['x'])) and pass "
            f"{_MAKE_BATCHES}.")
    if isinstance(batches, (Tensor, np.ndarray)):  # else a stream of its rows, one a step
        kind = "tensor" if isinstance(batches, Tensor) else "array"
        raise TypeError(
            f"InnerProblem: batches is a {kind} of shape {tuple(batches.shape)}: iterating it "
            f"gives one row per step, each a batch of one example without its batch axis. Pass "
            f"[x] (or [(x, y)]) for the whole data at every step, or "
            f"hypergrad.data.MiniBatches(x, y, batch_size=...) for shuffled mini-batches.")
    if isinstance(batches, Mapping):
        keys = list(batches)[:4]
        raise TypeError(
            f"InnerProblem: batches is a {type(batches).__name__} with keys {keys}: iterating "
            f"it gives its keys, not mini-batches. A dict is one mini-batch: pass [batch] for "
            f"the same batch at every step, a list of dict batches, or a callable t -> batch.")
    if (isinstance(batches, (tuple, list)) and len(batches) >= 2
            and all(isinstance(b, (Tensor, np.ndarray)) and b.ndim >= 1 for b in batches)):
        rows = {b.shape[0] for b in batches}
        kinds = {(str(b.dtype), b.ndim) for b in batches}
        if len(rows) == 1 and len(kinds) > 1:
            desc = ", ".join(f"{str(b.dtype).replace('torch.', '')} {tuple(b.shape)}"
                             for b in batches[:4])
            arrays = any(isinstance(b, np.ndarray) for b in batches)
            raise TypeError(
                f"InnerProblem: batches is a {type(batches).__name__} of {len(batches)} "
                f"{'arrays' if arrays else 'tensors'} with {rows.pop()} rows each but other "
                f"dtypes or dimensions ({desc}): the columns of one data set, e.g. (x, y). A "
                f"sequence holds one mini-batch per step (step t reads batches[t % len]), so "
                f"step 0 would train on {'array' if arrays else 'tensor'} 0 alone and step 1 "
                f"on {'array' if arrays else 'tensor'} 1. Pass {_MAKE_BATCHES}"
                + (" (NumPy arrays converted first: torch.as_tensor(a))." if arrays else "."))


def bitwise_equal(a: Any, b: Any) -> bool:
    """Whether two trees of tensors (dicts, tuples, an :class:`InnerState`) have the same
    structure and, leaf by leaf, the same dtype, layout, shape and bits (a sparse COO tensor's
    entries; ``False`` for tensors without data: a count on fake tensors)."""
    xs, sa = tree_flatten(a)
    ys, sb = tree_flatten(b)

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, Tensor) or isinstance(y, Tensor):
            if not (isinstance(x, Tensor) and isinstance(y, Tensor) and x.dtype == y.dtype
                    and x.shape == y.shape):
                return False
            if x.layout != y.layout:  # a matrix stored dense by an earlier version
                return ({x.layout, y.layout} == {torch.strided, torch.sparse_coo}
                        and torch.equal(x.to_dense(), y.to_dense()))
            if x.layout == torch.sparse_coo:  # torch.equal has no sparse kernel
                x, y = x.coalesce(), y.coalesce()
                return (torch.equal(x.indices(), y.indices())
                        and torch.equal(x.values(), y.values()))
            return torch.equal(x, y)
        return bool(x == y)

    try:
        return sa == sb and all(same(x, y) for x, y in zip(xs, ys))
    except (RuntimeError, NotImplementedError):  # tensors without data (a count on fakes)
        return False


def is_plain(state: InnerState, lam: Tensor) -> bool:
    """Whether a step runs outside function transforms and autograd: nothing to differentiate
    through, so the gradient may come from ``torch.autograd.grad`` and fused kernels."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    if lam.requires_grad:
        return False
    # the dicts directly (tree_flatten of the state was a tenth of a small model's plain step)
    for part in (state.params, state.buffers):
        if any(x.requires_grad for x in part.values() if isinstance(x, Tensor)):
            return False
    return not any(isinstance(x, Tensor) and x.requires_grad
                   for x in tree_flatten(state.opt)[0])


class _Batches:
    """The batch of step ``t``, checked: a mini-batch with no examples (a tensor whose first
    dimension is 0, anywhere in a tuple, list or dict) is an error here, not a NaN loss later
    (NaN BatchNorm statistics, and NaN * 0 poisons the tangents). ``n_examples``: the number of
    training examples when the source knows it (:class:`~hypergrad.data.MiniBatches`).
    ``data``: all the batches (a sequence) or the :class:`~hypergrad.data.MiniBatches`, where
    known, for the check that every training tensor is finite. ``stream``: the
    :class:`~hypergrad.data.Stream` of an iterable source."""

    def __init__(self, fetch: Callable[[int], Any], n_examples: int | None = None,
                 data: Any = None, stream: Stream | None = None, own: bool = False) -> None:
        self._fetch = fetch
        self.n_examples = n_examples
        self.data = data
        self.stream = stream
        self.own = own
        """A callable of the user's (not a MiniBatches): read under seeded generators
        (:meth:`InnerProblem.batch`)."""
        self.draws = False
        """Whether that callable was seen drawing from torch's default generator."""
        self.per_example: list[tuple[str, int]] = []
        """``(name, n)`` of each :class:`PerExample`: the example indices of every batch not
        from a MiniBatches (whose indices are its own) are checked against ``n``, where they
        are on the CPU (on a GPU the check would wait for the device at every step)."""

    def __call__(self, t: int) -> Any:
        return self.checked(self._fetch(t), t)

    def checked(self, batch: Any, t: int) -> Any:
        if isinstance(batch, Iterator) and not isinstance(batch, Tensor):
            raise TypeError(
                f"InnerProblem: the mini-batch of step {t} is a {type(batch).__name__}, an "
                f"iterator: a callable batches must return step t's mini-batch itself (e.g. a "
                f"tuple (x, y)), not a generator of them; for a source to iterate, pass an "
                f"object whose __iter__ starts a fresh pass (a DataLoader).")
        leaves, _ = tree_flatten(batch)
        for i, x in enumerate(leaves):
            if isinstance(x, Tensor) and x.ndim >= 1 and x.shape[0] == 0:
                raise ValueError(
                    f"InnerProblem: the mini-batch of step {t} is empty: its tensor {i} has "
                    f"shape {tuple(x.shape)} (0 examples); the loss of an empty batch is NaN. "
                    f"Give every step at least one example (e.g. MiniBatches drops the last "
                    f"partial batch; check a batch_size or a filter that leaves nothing)."
                )
        if self.per_example and t > 0 and not hasattr(self.data, "tensors"):
            idx = _batch_indices(batch)
            if idx is not None and idx.device.type == "cpu":
                for name, n in self.per_example:
                    _check_example_indices(name, n, idx, t, self.n_examples)
        return batch


def _warn_unread_examples(hyperparams: HyperParams, source: Any, steps: int) -> None:
    """Where a :class:`~hypergrad.data.MiniBatches` feeds a :class:`PerExample`, warn when
    some examples are read by no step of the run: their weights get a hypergradient of exactly
    0 at every point, and keep whatever value the search gives them (the default start draws
    every weight at one level), so a learned weight file held 816 of 1200 values that said
    nothing, beside the others."""
    from .hyperparams import PerExample

    items = [it for it in hyperparams.items if isinstance(it, PerExample)]
    if not items or not callable(getattr(source, "read_counts", None)):
        return  # other sources: the Trainer names the zeros at its first hypergradient
    n = int(source.n)
    unread = int((source.read_counts(range(steps)) == 0).sum())
    if not unread:
        return
    per = int(getattr(source, "batch_size", 0)) or 1
    names = ", ".join(repr(it.name) for it in items)
    warnings.warn(ZeroHypergradientWarning(
        f"InnerProblem: {unread} of the {n} training examples are read by no step of the run "
        f"({steps} steps of {per}), so their entries of PerExample {names} get a hypergradient "
        f"of exactly 0 and are not learned: the values tuning leaves them (the search's, not "
        f"the data's) say nothing about them. Train for at least an epoch (steps >= "
        f"{-(-n // per)}), or weight only the examples the run reads."), stacklevel=4)


def _check_per_example(hyperparams: HyperParams, batch: Any, n_examples: int | None) -> None:
    """A :class:`PerExample` must have one value per training example: compare its ``n`` with
    the data's size when known, and with the example indices of the first batch (the last
    element of a tuple batch, as :class:`~hypergrad.data.MiniBatches` gives)."""
    from .hyperparams import PerExample

    items = [it for it in hyperparams.items if isinstance(it, PerExample)]
    if not items:
        return
    last = _index_candidate(batch)
    if (isinstance(last, Tensor) and not last.dtype.is_floating_point
            and last.dtype != torch.bool and last.ndim == 2 and last.shape[-1] == 1):
        # hp[name][idx] is then (B, 1), and times a (B,) loss it broadcasts to (B, B): every
        # weight scaled the whole batch's mean, a hypergradient 86 % off, without a word (a
        # Dataset returning torch.tensor([i]); the per-example probe, 2026-12-08)
        raise ValueError(
            f"InnerProblem: PerExample({items[0].name!r}): the first mini-batch's example "
            f"indices have shape {tuple(last.shape)}, not (batch,): hp[{items[0].name!r}][idx] "
            f"is then a column, and times a per-example loss of shape (batch,) it broadcasts to "
            f"(batch, batch), every weight scaling the whole batch's loss. Give each example's "
            f"index as an int or a 0-d tensor in __getitem__ (the DataLoader stacks them to "
            f"(batch,)), or flatten it (idx.view(-1)) before the DataLoader yields it.")
    idx = _batch_indices(batch)
    for it in items:
        if n_examples is not None and it.n != n_examples:
            raise ValueError(
                f"InnerProblem: PerExample({it.name!r}) has n={it.n}, but the training data has "
                f"{n_examples} examples; PerExample needs one value per training example: "
                f"n={n_examples}."
            )
        if idx is not None:
            _check_example_indices(it.name, it.n, idx, 0, n_examples)


INDEX_KEYS = ("idx", "index", "indices", "example_index", "example_indices")
"""The keys of a dict batch (a ``collate_fn`` of one's own) read as its example indices."""


def _index_candidate(batch: Any) -> Any:
    """Where a batch holds its example indices: the last element of a tuple batch, as
    :class:`~hypergrad.data.MiniBatches` gives, or a dict batch's entry under one of
    :data:`INDEX_KEYS` (a dict batch's negative index read another example's weight
    silently); else ``None``."""
    if isinstance(batch, (tuple, list)) and batch:
        return batch[-1]
    if isinstance(batch, Mapping):
        return next((batch[k] for k in INDEX_KEYS if k in batch), None)
    return None


def _batch_indices(batch: Any) -> Tensor | None:
    """The example indices of a batch (a 1-D integer tensor where
    :func:`_index_candidate` looks), or ``None``."""
    found = _index_candidate(batch)
    if isinstance(found, Tensor) and not found.dtype.is_floating_point \
            and found.dtype != torch.bool and found.ndim == 1:
        return found
    return None


def _check_example_indices(name: str, n: int, idx: Tensor, t: int,
                           n_examples: int | None) -> None:
    """A :class:`PerExample` ``name`` of ``n`` values against the example indices ``idx`` of
    the mini-batch of step ``t``: an index outside ``[0, n)`` is an error naming the step (a
    negative one reads another example's weight without an error; one past the end failed as
    torch's bare IndexError at that step)."""
    if not idx.numel():
        return
    which = ("the first mini-batch's example indices" if t == 0
             else f"the example indices of the mini-batch of step {t}")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0:
        raise ValueError(
            f"InnerProblem: PerExample({name!r}): {which} "
            f"include {lo}; a negative index reads weight n + index (Python's "
            f"indexing), another example's, without an error. Give each example its index "
            f"in [0, {n}) (the last element of a tuple batch, as MiniBatches does, or a "
            f"dict batch's 'idx'), and leave "
            f"padding out of the batch.")
    if hi >= n:
        subset = (" A Subset or random_split keeps the full data set's indices: renumber "
                  "them 0..len(subset)-1 in the data set, or sample the full data set with "
                  "a SubsetRandomSampler (n = the full set's size)."
                  if n_examples is not None and n == n_examples else "")
        where = "the first mini-batch" if t == 0 else f"the mini-batch of step {t}"
        raise ValueError(
            f"InnerProblem: PerExample({name!r}) has n={n}, but {where} "
            f"indexes example {hi}; n must be the number of training examples "
            f"(> every example index).{subset}"
        )


_ALIASES = {"momentum": "momentum", "mom": "momentum", "wd": "weight_decay",
            "weight_decay": "weight_decay", "lr": "lr", "dampening": "dampening", "eps": "eps",
            "beta1": "beta1"}


def _warn_tied_patterns(module: nn.Module, names: Sequence[str], hps: HyperParams,
                        optimizer: Optimizer) -> None:
    """Warn (:class:`~hypergrad.errors.ConfigWarning`) where a parameter-name pattern matches
    the other name of a tied tensor (``head.weight = emb.weight``) and that tensor, listed once
    under its first name, reads another pattern's value: ``multipliers={"^head[.]": 0.1, ...}``
    gave ``head.bias`` 0.1 and the shared weight the other value, without a word (the pattern
    matched ``head.bias``, so it was not refused as matching nothing; the per-layer probe)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}  # another name of a tied tensor -> the name it is listed by
    for n, t in module.named_parameters(remove_duplicate=False):
        if id(t) in first:
            aliases[n] = first[id(t)]
        else:
            first[id(t)] = n
    listed = set(names)
    aliases = {a: c for a, c in aliases.items() if c in listed and a not in listed}
    if not aliases:
        return
    sets: list[tuple[str, list[str]]] = []
    for it in hps.items:
        for attr in ("multipliers", "groups", "scales"):
            m = getattr(it, attr, None)
            if m:
                pats = list(m) if attr == "multipliers" else list(m.values())
                sets.append((f"{type(it).__name__}({it.name!r}).{attr}", pats))
    for arg, v in optimizer.args.items():
        # a pair's entries too (betas=({pattern: value}, 0.999) was not looked at)
        pair = isinstance(v, tuple)
        for e, x in enumerate(v if pair else (v,)):
            if isinstance(x, PerParam):
                entry = f"{arg}[{e}]" if pair else arg
                sets.append((f"{optimizer.name}'s {entry}", list(x.values)))

    def hit(pats: list[str], name: str) -> int | None:
        return next((i for i, p in enumerate(pats) if re.search(p, name)), None)

    for where, pats in sets:
        for alias, name in aliases.items():
            i, j = hit(pats, alias), hit(pats, name)
            if i is None or (j is not None and j <= i):  # the name listed is matched first
                continue
            other = "no pattern (the default)" if j is None else f"the pattern {pats[j]!r}"
            warnings.warn(ConfigWarning(
                f"InnerProblem: {where}: the pattern {pats[i]!r} matches {alias!r}, another "
                f"name of the tied parameter {name!r}, which is listed once, under its first "
                f"name, and so reads {other}: the tied tensor takes that one value. Name it "
                f"{name!r} in the pattern (e.g. r'^{re.escape(name)}$' first) to give it this "
                f"value, or untie the weights."), stacklevel=3)


def _unbound_message(unused: list[str], optimizer: Optimizer) -> str:
    hyper = getattr(optimizer, "hyper_args", ())
    fixed = [(a, v) for a, v in optimizer.args.items()
             if isinstance(v, str) and v in unused and a not in hyper]
    if fixed:  # an optimizer of one's own that lists the argument among its fixed settings
        a, v = fixed[0]
        return (f"InnerProblem: hyperparameter {v!r} is given as {optimizer.name}'s {a}={v!r}, "
                f"but {a!r} is one of its fixed settings (options = {tuple(optimizer.options)}), "
                f"not of those a hyperparameter may set (hyper_args = {tuple(hyper)}): move "
                f"{a!r} to hyper_args and read it with self.read(self.args[{a!r}], hp, name) "
                f"(docs/extending.md).")
    options = set(getattr(optimizer, "options", ()))  # fixed settings: never bound
    args = [a for a in optimizer.args if a not in ("nesterov", "eps_root") and a not in options]
    examples = []
    for name in unused:
        arg = name if name in args else _ALIASES.get(name, "")
        if arg in ("momentum", "beta1") and "betas" in args:
            examples.append(f"betas=({name!r}, 0.999)")
        elif arg in args:
            examples.append(f"{arg}={name!r}")
    if examples:
        how = f"e.g. {optimizer.name}(..., {', '.join(examples)})"
    else:
        how = f"one of {optimizer.name}'s arguments {args} set to its name"
    return (
        f"InnerProblem: hyperparameters {unused} are bound to nothing: no optimizer argument "
        f"names them and neither train_loss (at step 0 and up to {LATER_STEPS} later steps) nor "
        f"val_loss reads them (hp[...]). Bind each to what "
        f"it should set: an optimizer argument, {how} (hypergrad-run: "
        f"inner_optimizer.<argument>=<name>), or read it in a loss as hp[{unused[0]!r}] at "
        f"every call (a value read once and cached, in an attribute or a closure, is not "
        f"read by this check's calls, nor differentiated); or remove it."
    )


# -- helpers of the checks ------------------------------------------------------------------------
_UNPACK = re.compile(r"too many values to unpack \(expected (\d+)")
_NUMBER_ARG = re.compile(r"(\w+)\(\): argument '(\w+)' (?:\(position \d+\) )?must be "
                         r"(?:float|Number|int|double|Scalar), not Tensor")
_NOT_DIFFERENTIABLE = re.compile(r"function '(\w+)' is not differentiable with respect to "
                                 r"argument '(\w+)'")
_WRITTEN_OUT = {
    ("cross_entropy_loss", "label_smoothing"):
        "(1 - s) * F.cross_entropy(out, y) - s * F.log_softmax(out, 1).mean(1).mean()",
    ("dropout", "p"):
        "none: a dropout mask's draws do not move smoothly with p, so p has no "
        "hypergradient; Gaussian dropout, x * (1 + s * torch.randn_like(x)), has one in s",
    ("scaled_dot_product_attention", "dropout_p"):
        "none: a dropout mask's draws do not move smoothly with dropout_p, so it has no "
        "hypergradient; Gaussian noise on the attention weights, attn * (1 + s * "
        "torch.randn_like(attn)) with attn = softmax(q @ k.transpose(-2, -1) * scale), has one "
        "in s",
    ("leaky_relu", "negative_slope"): "torch.where(x >= 0, x, slope * x)",
    ("elu", "alpha"): "torch.where(x > 0, x, alpha * torch.expm1(x))",
    ("softplus", "beta"): "F.softplus(beta * x) / beta",
    ("huber_loss", "delta"):
        "d = pred - target; torch.where(d.abs() < delta, 0.5 * d ** 2, "
        "delta * (d.abs() - 0.5 * delta)).mean()",
    ("smooth_l1_loss", "beta"):
        "d = pred - target; torch.where(d.abs() < beta, 0.5 * d ** 2 / beta, "
        "d.abs() - 0.5 * beta).mean()",
    ("margin_ranking_loss", "margin"): "torch.relu(margin - t * (x1 - x2)).mean()",
    ("nll_loss_forward", "weight"):
        "w = hp['class_weights'][y]; (w * F.cross_entropy(out, y, reduction='none')).sum() "
        "/ w.sum()",
    ("binary_cross_entropy_with_logits", "pos_weight"):
        "-(pos_weight * t * F.logsigmoid(z) + (1 - t) * F.logsigmoid(-z)).mean()",
    ("binary_cross_entropy", "weight"):
        "(w * F.binary_cross_entropy(p, t, reduction='none')).mean()",
}
"""How to write out a torch function's argument that takes no differentiated tensor (torch
refuses one: a number, or no derivative), keyed by the function and argument torch's message
names."""


def _no_derivative(which: str, err: BaseException) -> None:
    """Raise what a torch function's refusal of a differentiated tensor as one of its arguments
    means (a hyperparameter given where torch takes a Python number, or where its kernel has no
    derivative: ``F.cross_entropy(label_smoothing=hp["s"])``, ``weight=hp["w"]``), with the
    operation written out; nothing for other errors."""
    text = str(err)
    number = _NUMBER_ARG.search(text) if isinstance(err, TypeError) else None
    none = _NOT_DIFFERENTIABLE.search(text) if isinstance(err, RuntimeError) else None
    found = number or none
    if found is None:
        return
    fn, arg = found[1], found[2]
    why = ("takes a Python number there (float(hp[...]) would cut the hyperparameter from the "
           "autograd graph: refused, as no method could differentiate it)" if number else
           "has no derivative in it")
    written = _WRITTEN_OUT.get((fn, arg))
    fix = (f"Write the operation out with torch operations on the tensor: {written}" if written
           and not written.startswith("none") else
           f"There is no way to differentiate it: {written[6:]}" if written else
           "Write the operation out with torch operations on the tensor (e.g. compute the loss "
           "with reduction='none' and weight it yourself)")
    raise ValueError(
        f"InnerProblem: {which} gives torch's {fn} a tensor that hypergrad differentiates (a "
        f"hyperparameter, or a value computed from one or from the model's weights) as its "
        f"argument {arg!r}, and torch {why} ({text.splitlines()[0]}). {fix}."
    ) from err
_DTYPE_ERROR = re.compile(r"dtype|scalar type|type \(\w+\) and|Double|Float|Half|BFloat16")
_TO = {torch.float32: ".float()", torch.float64: ".double()"}


_INT_NAMES = {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
              torch.uint8: "Byte", torch.int8: "Char", torch.bool: "Bool"}


def _other_dtype(tensors: list[tuple[str, Tensor]], dtype: torch.dtype, err: str = ""
                 ) -> tuple[str, Tensor] | None:
    """The tensor whose dtype a dtype error of torch's was about: a floating one other than
    the model's, else (the error naming an integer type: features read as integers) an
    integer tensor of two or more dimensions (class labels are one-dimensional)."""
    for desc, x in tensors:
        if (x.dtype.is_floating_point or x.dtype.is_complex) and x.dtype != dtype:
            return desc, x
    for desc, x in tensors:
        name = _INT_NAMES.get(x.dtype)
        if name is not None and x.ndim >= 2 and re.search(rf"\b{name}\b", err):
            return desc, x
    return None


def _is_number(text: str) -> bool:
    """Whether ``text`` reads as a number ("0.1", "1e-3"): a constant given as a string."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_arity(which: str, fn: Any, args: str) -> None:
    """Refuse a loss that cannot be called with its arguments (``train_loss(model, batch,
    hp)``, ``val_loss(model, hp)``): a ``lambda m, b:`` failed at the first call as Python's
    "takes 2 positional arguments but 3 were given". Skipped where the signature cannot be
    read (a builtin)."""
    if fn is None:
        return
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*(None,) * (args.count(",") + 1))
    except TypeError as err:
        raise TypeError(f"InnerProblem: {which} is called as {which}({args}), and yours, "
                        f"{getattr(fn, '__name__', type(fn).__name__)}{sig}, cannot take that "
                        f"({err}); give it those {args.count(',') + 1} arguments (an argument "
                        f"it does not need can be named _).") from None


def _shape_dtype(x: Tensor) -> str:
    """``"(16, 64) float64"``: a tensor's shape and dtype, for messages."""
    return f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}"


def _describe_batch(batch: Any, t: int) -> str:
    """``"mini-batch 3: tensor 0 (16, 64) float64, tensor 1 (16,) int64 in [0, 10]"``: the
    shapes and dtypes of a batch's tensors, and the range of its integer ones (labels)."""
    parts = []
    for i, x in enumerate(tree_flatten(batch)[0][:4]):
        if not isinstance(x, Tensor):
            continue
        what = f"tensor {i} {_shape_dtype(x)}"
        if not x.dtype.is_floating_point and x.numel() and x.dtype != torch.bool:
            try:
                what += f" in [{int(x.min())}, {int(x.max())}]"
            except Exception:  # noqa: BLE001 - a tensor that cannot be read here
                pass
        parts.append(what)
    return f"mini-batch {t}: {', '.join(parts) or 'no tensors'}"


def _non_finite(x: Any, nan_only: bool = False) -> str:
    """``"3 NaN and 1 inf entries (the first at index (2, 0))"``, or ``""`` when finite (with
    ``nan_only``: when it has no NaN)."""
    if not isinstance(x, Tensor) or not (x.dtype.is_floating_point or x.dtype.is_complex):
        return ""
    x = x.detach()
    bad = torch.isnan(x) if nan_only else ~torch.isfinite(x)
    n = int(bad.sum())
    if not n:
        return ""
    nan = int(torch.isnan(x).sum())
    first = tuple(int(i) for i in bad.nonzero()[0]) if x.ndim else ()
    at = f" (the first at index {first})" if first else ""
    return f"{nan} NaN and {n - nan} inf entr{'y' if n == 1 else 'ies'}{at}"


def _closure_tensors(fn: Any, name: str, depth: int = 0) -> list[tuple[str, Tensor]]:
    """Tensors a loss closes over, best effort, for messages: closure cells and the globals
    it names, the arguments of a ``functools.partial``, and the tensor attributes of a bound
    method's object or a callable object."""
    out: list[tuple[str, Tensor]] = []
    if depth > 2:
        return out

    def add(label: str, value: Any) -> None:
        if isinstance(value, Tensor):
            out.append((label, value))
        elif isinstance(value, (tuple, list, dict)):
            leaves, _ = tree_flatten(value)
            out.extend((f"{label}[{i}]", v) for i, v in enumerate(leaves)
                       if isinstance(v, Tensor))

    if isinstance(fn, functools.partial):
        for i, a in enumerate(fn.args):
            add(f"argument {i} of the partial {name}", a)
        for k, a in fn.keywords.items():
            add(f"{name}'s argument {k!r}", a)
        return out + _closure_tensors(fn.func, name, depth + 1)
    owner = getattr(fn, "__self__", None)
    if owner is None and not inspect.isfunction(fn) and not inspect.ismethod(fn):
        owner = fn  # a callable object
    if owner is not None and hasattr(owner, "__dict__"):
        for k, v in vars(owner).items():
            add(f"{type(owner).__name__}.{k}", v)
    func = getattr(fn, "__func__", fn)
    if inspect.isfunction(func):
        try:
            cv = inspect.getclosurevars(func)
        except (TypeError, ValueError):
            return out
        for k, v in {**cv.nonlocals, **cv.globals}.items():
            add(f"{k!r} (which {name} closes over)", v)
    return out


_TORCH_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "RMSprop": "rmsprop",
                     "Adagrad": "adagrad"}


def _torch_optimizer_hint(optimizer: Any, hyperparams: Any) -> str:
    """What was given instead of a ``hypergrad.optim`` optimizer; for a ``torch.optim``
    optimizer (an instance, or its class) or its name, the ``hypergrad.optim`` call that
    trains the same way, its settings carried over and ``lr`` named after a hyperparameter
    ``'lr'`` where there is one."""
    cls = optimizer if isinstance(optimizer, type) else type(optimizer)
    torch_opt = cls.__module__.startswith("torch.optim")
    name = (optimizer.lower() if isinstance(optimizer, str)
            else _TORCH_OPTIMIZERS.get(cls.__name__) if torch_opt else None)
    if isinstance(optimizer, str):
        got = repr(optimizer)
    elif torch_opt:
        got = f"{'the class ' if isinstance(optimizer, type) else ''}torch.optim.{cls.__name__}"
    else:
        got = cls.__name__
    if name is None or name not in _TORCH_OPTIMIZERS.values():
        return got
    names = getattr(hyperparams, "names", [])
    args = {"lr": "'lr'" if "lr" in names else "..."}
    groups = getattr(optimizer, "param_groups", None)
    if groups:  # an instance: carry its settings over
        import inspect

        from . import optim

        # the factory's arguments, each where the torch optimizer's setting is not its
        # default (the factories keep torch.optim's defaults)
        differ = []  # settings its parameter groups set apart (no decay on biases, ...)
        for k, arg in inspect.signature(getattr(optim, name)).parameters.items():
            vals = [g.get(k) for g in groups]
            if k != "lr" and len({repr(x) for x in vals}) > 1:
                differ.append(f"{k} {' / '.join(repr(x) for x in vals)}")
                args[k] = "{pattern: value, ...}"
                continue
            v = vals[0] if k != "lr" else None
            if v is not None and v != arg.default:
                args[k] = repr(tuple(v) if isinstance(v, list) else v)
        if "lr" not in names:
            lrs = {repr(g.get("lr")) for g in groups}
            if len(lrs) > 1:
                differ.append(f"lr {' / '.join(repr(g.get('lr')) for g in groups)}")
            args["lr"] = ("{pattern: value, ...}" if len(lrs) > 1
                          else repr(groups[0].get("lr")))
        if differ:
            call = ", ".join(f"{k}={v}" for k, v in args.items())
            return (f"{got}: use hypergrad.optim.{name}({call}): its {len(groups)} parameter "
                    f"groups differ in {'; '.join(differ)}, which hypergrad takes per parameter, "
                    f"as a value per parameter-name pattern ({{r'bias$': 0.0, r'.*': 0.01}}: "
                    f"the first match wins, and every parameter must match one) or as a "
                    f"PerGroup hyperparameter to tune (docs/guide.md); the other arguments "
                    f"constants or the names of hyperparameters to tune")
    call = ", ".join(f"{k}={v}" for k, v in args.items())
    return (f"{got}: use hypergrad.optim.{name}({call}) (its arguments constants or the names "
            f"of hyperparameters to tune; the model's parameters come from the problem)")


def _cut_from_weights(which: str) -> str:
    """The message for a loss whose autograd graph reaches none of the model's weights."""
    if which == "val_loss":
        effect = ("every hypergradient would be exactly zero (the validation loss would not "
                  "see what training does) and tuning could not move the hyperparameters")
    else:
        effect = ("its gradient would be exactly zero, so the inner optimizer would not train "
                  "the model")
    return (f"InnerProblem: {which} does not depend on the model's weights: it does not call "
            f"the model, or its value is cut from the network's output (torch.no_grad(), "
            f".detach(), .item(), float() or numpy on it), so {effect}. Return the loss as a "
            f"tensor computed from the model's output with autograd on (a penalty on the "
            f"hyperparameters may be added to it); hypergrad itself turns gradients off where "
            f"none are needed.")


def _reachable(out: Any) -> set[int]:
    """The ids of the leaf tensors the autograd graph of ``out`` reaches (structural: an
    operation whose derivative is numerically zero still connects)."""
    if not isinstance(out, Tensor) or out.grad_fn is None:
        return set()
    seen: set[Any] = set()
    found: set[int] = set()
    todo: list[Any] = [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)
        if isinstance(var, Tensor):
            found.add(id(var))
        todo.extend(n for n, _ in node.next_functions)
    return found


def _nudged(x: Tensor) -> Tensor:
    """``x`` moved by about 1e-3 of its size, by a different amount in each entry (a uniform
    shift can be invisible, e.g. to a softmax)."""
    x = x.detach()
    ramp = torch.linspace(1.0, 2.0, x.numel(), dtype=x.dtype, device=x.device).reshape(x.shape)
    return x + 1e-3 * (x.abs() + 1e-3) * ramp


def _transform_refusal(err: Exception) -> ValueError | None:
    """The refusal of a training loss that torch.func's transforms (and autograd.grad)
    cannot differentiate through, if ``err`` is torch's error for one (activation
    checkpointing, a custom autograd.Function without ``setup_context``), else ``None``."""
    said = str(err)
    if not any(s in said for s in ("saved tensor hooks", "setup_context", "use_reentrant=True")):
        return None
    reentrant = (" (torch's advice, use_reentrant=False, runs saved-tensor hooks, which "
                 "torch.func cannot differentiate through either)"
                 if "use_reentrant=True" in said else "")
    return ValueError(
        f"InnerProblem: train_loss runs code that torch.func's transforms cannot "
        f"differentiate through, and every exact method (forward, reverse, implicit, "
        f"online) takes each step's derivatives with them. Torch says: "
        f"{said.splitlines()[0]}{reentrant} The usual cause is activation checkpointing "
        f"(torch.utils.checkpoint.checkpoint: saved-tensor hooks, or with "
        f"use_reentrant=True an autograd.Function without setup_context): run the model "
        f"without it while tuning (forward mode keeps no activations across steps: its "
        f"memory is the tangent, parameters x K; hypergrad.methods.estimate_memory("
        f"problem, method) gives each method's), or give your own autograd.Function a "
        f"setup_context staticmethod (torch's 'Extending torch.func with "
        f"autograd.Function'). FiniteDifference runs, approximately.")


def _grads_of(loss: Any, leaves: dict[str, Tensor]) -> dict[str, Tensor | None]:
    """The gradient of a probe pass's ``loss`` at ``leaves`` (empty where it has none)."""
    if not isinstance(loss, Tensor) or not loss.requires_grad or loss.numel() != 1:
        return {}
    with torch.enable_grad():  # the probe may run under the caller's no_grad (a plain run)
        grads = torch.autograd.grad(loss.sum(), list(leaves.values()), allow_unused=True)
    return dict(zip(leaves, grads))


def _reaches(x: Tensor, leaves: dict[str, Tensor]) -> bool:
    ids = _reachable(x)
    return any(id(v) in ids for v in leaves.values())


def _dataset_tensors(ds: Any, depth: int = 0) -> list[Tensor] | None:
    """A dataset's tensors where it holds them all: a ``TensorDataset`` (or any with
    ``tensors``), a ``Subset`` of one (with its indices) and a ``ConcatDataset`` of such (a
    DataLoader over ``Subset(TensorDataset(...), idx)``, the usual split, was not digested: a
    resume with another row in it went on); else ``None``."""
    from torch.utils.data import ConcatDataset, Subset

    if ds is None or depth > 8:
        return None
    if isinstance(getattr(ds, "tensors", None), (tuple, list)):
        return [x for x in ds.tensors if isinstance(x, Tensor)]
    if isinstance(ds, Subset):
        inner = _dataset_tensors(ds.dataset, depth + 1)
        return None if inner is None else [*inner, torch.as_tensor(list(ds.indices))]
    if isinstance(ds, ConcatDataset):
        parts = [_dataset_tensors(d, depth + 1) for d in ds.datasets]
        return None if any(x is None for x in parts) else [x for q in parts for x in q or ()]
    return None


def _tensors_of(module: nn.Module) -> dict[str, Tensor]:
    return {**dict(module.named_parameters(remove_duplicate=False)),
            **dict(module.named_buffers(remove_duplicate=False))}


def _lookup_tensor(module: nn.Module, name: str) -> Tensor | None:
    owner, _, leaf = name.rpartition(".")
    x = getattr(module.get_submodule(owner) if owner else module, leaf, None)
    return x if isinstance(x, Tensor) else None


def _numbers_of(module: nn.Module) -> dict[tuple[str, str], Any]:
    """The Python numbers, bools, ``None``s and plain tensors (neither parameters nor buffers)
    a module and its submodules hold as public attributes (``training`` aside): what a
    forward that keeps state outside its parameters and buffers changes (a running average
    kept in ``self.avg``: forward mode failed inside torch's vmap with "INTERNAL ASSERT
    FAILED ... please report a bug to PyTorch", the Trainer on a fake tensor the memory
    estimate had left there)."""
    return {(name, k): v for name, m in module.named_modules() for k, v in vars(m).items()
            if not k.startswith("_") and k != "training"
            and (v is None or isinstance(v, (bool, int, float, complex, Tensor)))}


def _said(v: Any) -> str:
    """An attribute's value in a message: a tensor by its kind, shape and dtype."""
    if isinstance(v, Tensor):
        return f"a tensor of shape {tuple(v.shape)}, {v.dtype}"
    return repr(v)


def _restore_numbers(module: nn.Module, snapshot: dict[tuple[str, str], Any]
                     ) -> list[tuple[str, str, Any, Any]]:
    """Put back the values of :func:`_numbers_of` that changed (a tensor: replaced by another
    object); returns ``(module, attribute, before, after)`` of each."""
    changed = []
    for (name, k), v in snapshot.items():
        m = module.get_submodule(name)
        now = getattr(m, k, v)
        if now is not v and (isinstance(now, Tensor) or isinstance(v, Tensor)
                             or now is None or v is None or now != v):
            changed.append((name, k, v, now))
            setattr(m, k, v)
    return changed


def _restore(module: nn.Module, snapshot: dict[str, Tensor]) -> list[str]:
    """Put back every tensor of ``module`` that differs from ``snapshot``; their names."""
    changed = []
    now = _tensors_of(module)
    with torch.no_grad():
        for k, old in snapshot.items():
            x = now.get(k)
            if x is None:
                continue
            if x.shape != old.shape or not torch.equal(x.detach(), old):
                changed.append(k)
                if x.shape == old.shape:
                    x.copy_(old)
    return changed


def _restore_batch(batch: list[tuple[Tensor, int, Tensor]]) -> tuple[int, Tensor] | None:
    """Put back every tensor of a batch whose version counter moved since ``(tensor, version,
    copy)`` was taken; the index and tensor of the first, or ``None``."""
    first = None
    with torch.no_grad():
        for i, (x, version, copy) in enumerate(batch):
            if x._version != version:
                first = first or (i, x)
                x.copy_(copy)
    return first


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The checks run the losses with leaves that require grad: a loss that converts a tensor
    to a Python number would warn about it there (and nowhere else)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True")
        warnings.filterwarnings("ignore", message="To copy construct from a tensor")
        yield


_CUTTERS = {
    "item": ".item()", "__float__": "float()", "__int__": "int()", "__bool__": "bool()",
    "tolist": ".tolist()", "numpy": ".numpy()", "__array__": "numpy", "detach": ".detach()",
    "detach_": ".detach_()", "tensor": "torch.tensor(...)", "new_tensor": ".new_tensor(...)",
    ".data": ".data",
}


_COMPARISONS = frozenset({"gt", "lt", "ge", "le", "eq", "ne", "greater", "less",
                          "greater_equal", "less_equal", "not_equal"})
"""Torch functions that compare: a hyperparameter cut by one was read in a branch."""


def _op_name(func: Any) -> str:
    """A torch function's name as :data:`_CUTTERS` keys it (a property by its attribute:
    ``.data``)."""
    fname = getattr(func, "__name__", "")
    if fname == "__get__":
        fname = "." + getattr(getattr(func, "__self__", None), "__name__", "?")
    return str(fname)


_SAMPLERS = {"normal": "torch.normal", "normal_": "Tensor.normal_"}
"""Continuous random samplers whose derivative in their parameters torch defines as zero: a
hyperparameter passed to one (a noise scale as ``torch.normal``'s std) got a hypergradient of
exactly 0 through it, where finite differences of the same draws see the slope. (A discrete
sample, ``torch.bernoulli``'s mask, has a zero slope almost everywhere in the same draws too.)"""


LATER_STEPS = 32
"""How many later steps :meth:`InnerProblem._read_later` reads ``train_loss`` at, looking for a
hyperparameter step 0 did not read (a term on some batches only), before calling it unread."""

UNSEEDED_CALLS = 4
"""How many times :meth:`InnerProblem._warn_unseeded` evaluates each loss at the same weights,
batch and step: a draw that changes the loss half the time (a random flip) escapes 1 in 8."""


class _CutFinder(TorchFunctionMode):
    """Follows the tensors derived from each hyperparameter group through one run of a loss
    and records, per group, the first operation that cut them from the autograd graph, and
    (``samplers``) the first random sampler whose derivative in its parameters torch takes
    as zero."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__()
        self.tags: dict[int, tuple[Tensor, frozenset[str]]] = {}
        self.cuts: dict[str, str] = {}
        self.samplers: dict[str, str] = {}
        for name, v in values.items():
            leaves, _ = tree_flatten(v)
            for x in leaves:
                if isinstance(x, Tensor):
                    self.tags[id(x)] = (x, frozenset({name}))

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, Tensor)]
        groups: set[str] = set()
        for x in inputs:
            tag = self.tags.get(id(x))
            if tag is not None and tag[0] is x:
                groups |= tag[1]
        fname = _op_name(func)
        if groups and fname in _CUTTERS:
            self._cut(groups, _CUTTERS[fname])
        if groups and fname in _SAMPLERS:
            for g in groups:
                self.samplers.setdefault(g, _SAMPLERS[fname])
        out = func(*args, **kwargs)
        if not groups:
            return out
        outs = [x for x in tree_flatten(out)[0] if isinstance(x, Tensor)]
        if not torch.is_grad_enabled() and fname not in _CUTTERS:
            self._cut(groups, f"torch.no_grad() (around {fname})")
        elif (outs and any(x.requires_grad for x in inputs)
              and not any(x.requires_grad for x in outs) and fname not in _CUTTERS):
            self._cut(groups, f"a comparison ({fname}: a Python if, min() or max() against a "
                              f"number, a torch.where condition; it has no derivative)"
                      if fname in _COMPARISONS else f"{fname} (it has no derivative)")
        for x in outs:
            if x.requires_grad:
                self.tags[id(x)] = (x, frozenset(groups))
        return out

    def _cut(self, groups: set[str], how: str) -> None:
        for g in groups:
            self.cuts.setdefault(g, how)


def _directional_mismatch(loss: Callable[[dict[str, Tensor]], Any],
                          params: dict[str, Tensor], along_gradient: bool = False) -> float:
    """``|D - g.v| / max(|D|, |g.v|)``: autograd's directional derivative ``g.v`` of
    ``loss`` at ``params`` against the central difference ``D`` along a random unit direction
    ``v`` (a fixed generator; step 1e-5 in float64, 1e-2 otherwise). Outside float64, where
    that mismatches, the smaller of it and the mismatch along the gradient's own direction
    (``along_gradient``): there ``g.v = |g|``, the largest a unit direction gives, so the
    difference's rounding weighs least, while a gradient that is not the loss's derivative
    still disagrees (``D = g_true.g / |g|``). A random direction in 50,000 dimensions gave a
    float32 directional derivative of rounding's size, and a correct sparse product's backward
    was reported 18.7 % off (the sparse probe, 2026-12-08)."""
    off = _mismatch_along(loss, params, along_gradient)
    if (not along_gradient and off >= 1e-2
            and next(iter(params.values())).dtype != torch.float64):
        off = min(off, _mismatch_along(loss, params, True))
    return off


def _mismatch_along(loss: Callable[[dict[str, Tensor]], Any], params: dict[str, Tensor],
                    along_gradient: bool) -> float:
    """:func:`_directional_mismatch` along one direction: a random one, or the gradient's."""
    value = loss(params)
    grads = (torch.autograd.grad(value, list(params.values()), allow_unused=True)
             if value.requires_grad else (None,) * len(params))  # no path: a zero gradient
    if along_gradient:
        d = {k: (g if g is not None else torch.zeros_like(params[k])).detach()
             for k, g in zip(params, grads)}
    else:
        gen = torch.Generator().manual_seed(0)
        d = {k: torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x) for k, x in
             params.items()}
    norm = float(sum(float(t.double().pow(2).sum()) for t in d.values())) ** 0.5
    if norm == 0:  # no gradient to go along: the random direction's mismatch stands
        return math.inf
    v = {k: t / norm for k, t in d.items()}
    gv = sum(float((g.double() * v[k].double()).sum()) for k, g in zip(params, grads)
             if g is not None)
    h = 1e-5 if next(iter(params.values())).dtype == torch.float64 else 1e-2
    with torch.no_grad():
        up = float(loss({k: x.detach() + h * v[k] for k, x in params.items()}))
        down = float(loss({k: x.detach() - h * v[k] for k, x in params.items()}))
    fd = (up - down) / (2 * h)
    return abs(fd - gv) / max(abs(fd), abs(gv), 1e-12)


def _hessian_mismatch(loss: Callable[[dict[str, Tensor]], Any],
                      params: dict[str, Tensor]) -> float:
    """``|D - u.Hv| / max(|D|, |u.Hv|, 1e-6 |g|)``: autograd's Hessian-vector product of
    ``loss`` at ``params`` (double backward) along random unit directions ``u`` and ``v``
    against ``D``, the central difference of ``u.g`` along ``v`` (a fixed generator; step
    1e-5 in float64, 1e-2 otherwise)."""
    gen = torch.Generator().manual_seed(1)

    def unit() -> dict[str, Tensor]:
        d = {k: torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x)
             for k, x in params.items()}
        norm = float(sum(float(t.double().pow(2).sum()) for t in d.values())) ** 0.5
        return {k: t / norm for k, t in d.items()}

    u, v = unit(), unit()
    names = list(params)

    def ug(at: dict[str, Tensor], create_graph: bool) -> tuple[Tensor | float, float]:
        gs = torch.autograd.grad(loss(at), [at[k] for k in names], allow_unused=True,
                                 create_graph=create_graph)
        dot: Tensor | float = sum(((g * u[k]).sum() for k, g in zip(names, gs)
                                   if g is not None), 0.0)
        norm = float(sum(float(g.detach().double().pow(2).sum()) for g in gs
                         if g is not None)) ** 0.5
        return dot, norm

    dot, gnorm = ug(params, True)
    hv = 0.0
    if isinstance(dot, Tensor) and dot.requires_grad:
        hs = torch.autograd.grad(dot, [params[k] for k in names], allow_unused=True)
        hv = sum(float((h.double() * v[k].double()).sum()) for k, h in zip(names, hs)
                 if h is not None)
    h = 1e-5 if next(iter(params.values())).dtype == torch.float64 else 1e-2

    def shifted(sign: float) -> float:
        at = {k: (x.detach() + sign * h * v[k]).requires_grad_() for k, x in params.items()}
        return float(ug(at, False)[0])

    fd = (shifted(1.0) - shifted(-1.0)) / (2 * h)
    return abs(fd - hv) / max(abs(fd), abs(hv), 1e-6 * gnorm, 1e-12)


_METADATA = frozenset({".dtype", ".device", ".shape", ".ndim", ".layout", ".is_cuda",
                       ".is_sparse", ".is_meta", ".requires_grad", ".names", "size", "dim",
                       "numel", "nelement", "element_size", "is_floating_point", "is_complex",
                       "get_device", "stride", "is_contiguous", "data_ptr", "__len__"})
"""Operations that read a tensor's metadata, not its values."""


class _OwnParameterReads(TorchFunctionMode):
    """Records the names of the given tensors (``{id: (tensor, name)}``: a module's own
    parameters) that an operation reads, in the order first read."""

    def __init__(self, own: dict[int, tuple[Tensor, str]]) -> None:
        super().__init__()
        self.own = own
        self.read: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _op_name(func) in _METADATA:  # x.to(next(net.parameters()).dtype): no values read
            return func(*args, **kwargs)
        for x in tree_flatten((args, kwargs))[0]:
            got = self.own.get(id(x)) if isinstance(x, Tensor) else None
            if got is not None and got[0] is x and got[1] not in self.read:
                self.read.append(got[1])
        return func(*args, **kwargs)


class _DetachFinder(TorchFunctionMode):
    """Follows the floating tensors computed from the weights through one run of a loss: a value
    cut from the autograd graph (``.detach()``, ``.data``, an operation under
    ``torch.no_grad()``) and every floating tensor computed from it are marked with the first
    cut. Integer and boolean results (``argmax``, comparisons) are not followed: they are
    piecewise constant in the weights, so a derivative through them is zero anyway. Values
    leaving torch (``.item()``, ``float()``) cannot be followed and are not reported."""

    def __init__(self, leaves: Iterable[Tensor]) -> None:
        super().__init__()
        self.live: dict[int, Tensor] = {id(x): x for x in leaves}
        self.cut: dict[int, tuple[Tensor, str, bool]] = {}
        """id -> (the tensor, the first cut upstream, whether it is that cut's own output)"""
        self.custom: list[str] = []
        """The custom ``autograd.Function`` classes whose outputs were read: their backward
        is whatever their author wrote, which may not be the forward's derivative (a gradient
        reversal or scaling layer, a straight-through estimator)."""

    def _cut_of(self, x: Tensor) -> str | None:
        got = self.cut.get(id(x))
        if got is None or got[0] is not x:
            return None
        # a cut's own output that requires grad by now was returned by a custom
        # autograd.Function, whose forward runs under no_grad: it is connected after all
        return None if got[2] and x.requires_grad else got[1]

    def _note_custom(self, x: Tensor) -> None:
        """Record a custom ``autograd.Function`` that computed ``x``."""
        if x.requires_grad and isinstance(x.grad_fn, torch.autograd.function.BackwardCFunction):
            name = type(x.grad_fn).__name__.removesuffix("Backward")
            if name not in self.custom:
                self.custom.append(name)

    def cut_of(self, x: Any) -> str | None:
        """The first cut a loss value ``x`` reads that the loss's gradient misses (``None``:
        none; also where the value does not depend on the weights at all, which the losses'
        own checks refuse)."""
        if not isinstance(x, Tensor) or not x.requires_grad:
            return None
        return self._cut_of(x)

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, Tensor)]
        out = func(*args, **kwargs)
        for x in inputs:
            self._note_custom(x)
        fname = _op_name(func)
        upstream = next((c for c in map(self._cut_of, inputs) if c is not None), None)
        live = any(self.live.get(id(x)) is x for x in inputs)
        if upstream is None and not live:
            return out
        for x in tree_flatten(out)[0]:
            if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
                continue
            if upstream is not None:
                self.cut[id(x)] = (x, upstream, False)
            elif fname in ("detach", "detach_", ".data"):
                self.cut[id(x)] = (x, _CUTTERS[fname], True)
            elif x.requires_grad:
                self.live[id(x)] = x
            elif not torch.is_grad_enabled():
                self.cut[id(x)] = (x, f"{fname} under torch.no_grad()", True)
        return out


def tf32_flags(device: torch.device, dtype: torch.dtype, has_conv: bool) -> list[str]:
    """The TF32 settings that round a float32 model's products on ``device`` (CUDA only):
    ``torch.backends.cuda.matmul.allow_tf32``, and ``torch.backends.cudnn.allow_tf32`` when the
    model has convolutions (``has_conv``; cuDNN's other float32 kernels do not use it)."""
    if device.type != "cuda" or dtype != torch.float32:
        return []
    out = []
    if _tf32_on("cuda.matmul", torch.backends.cuda.matmul):
        out.append("torch.backends.cuda.matmul.allow_tf32=True")
    if has_conv and _tf32_on("cudnn.conv", torch.backends.cudnn):
        out.append("torch.backends.cudnn.allow_tf32=True, torch's default, for its "
                   "convolutions")
    return out


def _tf32_on(where: str, legacy: Any) -> bool:
    """Whether TF32 rounds float32 products at ``where``: the legacy flag ``allow_tf32``, which
    torch refuses to read (RuntimeError: "a mix of the legacy and new APIs") once TF32 was
    set through the newer ``fp32_precision`` settings (``torch.backends.fp32_precision =
    "ieee"``, the documented way off); then the new setting's value."""
    try:
        return bool(legacy.allow_tf32)
    except RuntimeError:
        node: Any = torch.backends
        for part in where.split("."):
            node = getattr(node, part, None)
        return getattr(node, "fp32_precision", "ieee") == "tf32"
