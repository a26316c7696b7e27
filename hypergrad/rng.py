"""Randomness and fused kernels as part of the step's contract.

**Random draws.** Forward mode, reverse mode, every HVP strategy and every finite-difference run
evaluate the step function ``s_t = step(s_{t-1}, lam, t)`` a different number of times (reverse
mode re-runs it inside ``vjp``; a batched strategy runs the gradient once and the tangent pass
under ``vmap``). If each evaluation drew new dropout masks, they would differentiate different
functions and disagree (measured before this module: forward vs reverse 29-36% apart on a
dropout MLP, two forward runs 13-22% apart). So every evaluation of step ``t`` runs inside
:func:`step_rng`: torch's default generators (CPU and the model's CUDA device) are set to a state
fixed by ``(run seed, t)`` and restored afterwards, and ``vmap`` runs with ``randomness="same"``,
so all K tangent columns see the draws of the primal. The step is then a deterministic function:
forward = reverse = finite differences hold for models with dropout, runs are repeatable, and the
caller's own random stream is left exactly where it was.

What a user's own random ops get: anything drawn from torch's default generator inside
``train_loss`` (``nn.Dropout``, ``torch.rand``/``randn`` noise, random augmentation written with
torch ops) draws from step ``t``'s stream: the same numbers in every method and evaluation of
that step, different numbers at different steps, and a different sequence for another run seed.
Draws from another source (Python's ``random``, NumPy, a ``torch.Generator`` of your own) are not
controlled: they make the step function change between evaluations and the methods disagree
(the problem's probe warns: :class:`~hypergrad.errors.UnseededRandomnessWarning`). Draw such
randomness outside the step (e.g. in the batch source, which every method reads the same way)
or use torch's default generator.

The kernels of the passes that differentiate the gradient are :mod:`hypergrad.kernels`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

__all__ = ["step_seed", "step_rng", "keeps_rng", "STATE_LOCK", "VALIDATION_STEP"]

_MASK64 = (1 << 64) - 1

VALIDATION_STEP = -1
"""The stream index of the validation objective (a loss evaluated in train mode may draw)."""


STATE_LOCK = threading.RLock()
"""Held while hypergrad sets torch's process-wide state for a pass (the default generators
of :func:`step_rng`, the attention fast-path flag and the module patches of a model call):
one thread at a time. Two runs in two threads drew each other's dropout masks (hypergradients
3-20 % off a sequential run, silently) and left the fast path off for the process; with the
lock the passes of concurrent runs take turns, and each is bitwise a sequential run."""

_F = TypeVar("_F", bound=Callable[..., Any])


def keeps_rng(fn: _F) -> _F:
    """``fn`` run with the caller's random state restored after it (torch's default CPU
    generator and every CUDA device's): a builder that seeds torch's generator for its model's
    initial weights (``torch.manual_seed(seed)``) leaves the user's stream where it was (the
    bundled tasks and ``hypergrad.testing``'s cases reset it: after ``torch.manual_seed(42)``
    and a task built, the user drew the task seed's numbers)."""
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with STATE_LOCK, torch.random.fork_rng(devices=cuda):  # two builders in two threads
            return fn(*args, **kwargs)

    return wrapped  # type: ignore[return-value]


def step_seed(seed: int, t: int) -> int:
    """A 63-bit seed for step ``t`` of a run with seed ``seed`` (splitmix64 of both), so nearby
    seeds and steps give unrelated streams."""
    z = (seed * 0x9E3779B97F4A7C15 + (t + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class _StepRNG:
    """What :func:`step_rng` yields: ``drew()`` says whether the body drew random numbers."""

    def __init__(self, gens: list[torch.Generator], seeded: list[Tensor]) -> None:
        self._gens, self._seeded = gens, seeded

    def drew(self) -> bool:
        return any(not torch.equal(g.get_state(), s) for g, s in zip(self._gens, self._seeded))


def _faking() -> bool:
    """Whether a ``FakeTensorMode`` is active (tensors without data)."""
    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


@contextlib.contextmanager
def step_rng(seed: int, t: int, device: torch.device, watch: bool = False
             ) -> Iterator[_StepRNG | None]:
    """Run the body with torch's default generator(s) at the state of step ``t`` of run ``seed``,
    then restore the caller's state. Seeds the CPU generator and, for a CUDA model, its
    device's generator. With ``watch``, yields an object whose ``drew()`` tells whether the
    body drew random numbers (else ``None``)."""
    s = step_seed(seed, t)
    gens = [torch.random.default_generator]
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        gens.append(torch.cuda.default_generators[idx])
    with STATE_LOCK:  # the generators are the process's: another thread's run would reseed them
        saved = [g.get_state() for g in gens]  # cheaper than fork_rng (a few microseconds)
        for g in gens:
            g.manual_seed(s)
        try:
            # not on fake tensors (a memory count, :mod:`hypergrad.footprint`): random ops on
            # tensors without data draw nothing, so it cannot tell; a real evaluation finds out
            yield (_StepRNG(gens, [g.get_state() for g in gens]) if watch and not _faking()
                   else None)
        finally:
            for g, st in zip(gens, saved):
                g.set_state(st)
