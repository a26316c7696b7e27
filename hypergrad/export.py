"""Use what you learned: the learned hyperparameters as a ``torch.optim`` optimizer (per-tensor
values as named parameter groups), a learning-rate schedule as ``LambdaLR``, loss parameters and
per-example or per-feature values as numbers and tensors, and the model trained at them as a
``state_dict``.

- :func:`learned_optimizer`: ``(optimizer, scheduler)`` for your own parameters
  (:meth:`hypergrad.TrainResult.learned_optimizer` calls it with the result's point).
- :func:`learned_settings`: the same as plain data (what ``learned.yaml`` holds), with
  :func:`optimizer_from_settings` to build it back.
- :func:`trained_state_dict`: a trained :class:`~hypergrad.InnerState` as the module's
  ``state_dict`` (``model_learned.pt``).
- :func:`hypergrad.report.write_learned` writes them into a run folder (``learned.yaml``,
  ``model_learned.pt``, ``learned_<name>.pt``; ``hypergrad-run`` calls it).

**What a schedule assumes.** A :class:`~hypergrad.Schedule` of ``W`` windows over the ``T`` steps
it was learned on is written as windows that are fractions of training: window ``w`` covers
``[w / W, (w + 1) / W)`` of the run. Training for ``T' != T`` steps stretches them (step ``t``
reads window ``t * W // T'``): that assumes the learned shape, not the absolute step counts, is
what carries over (as with a cosine schedule set by its length). Everything else (the batch
size, the data, the model) is assumed to be the one tuned on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .hyperparams import TRANSFORMS, HyperParams, PerTensor, Schedule
from .problem import InnerProblem, InnerState

__all__ = ["learned_settings", "learned_optimizer", "optimizer_from_settings", "transformed_values",
           "trained_state_dict"]

SCHEDULER = "torch.optim.lr_scheduler.LambdaLR"


def transformed_values(hps: HyperParams, lam: Tensor) -> dict[str, Tensor]:
    """``{name: value}`` of every hyperparameter at ``lam`` in its own units (each transform
    applied; a schedule's windows as one vector), detached: what the learned files hold."""
    raw = hps.split(lam.detach())
    return {it.name: TRANSFORMS[it.transform][0](raw[it.name]) for it in hps.items}


def _number(v: Tensor | float) -> float:
    return float(v)


def learned_settings(problem: InnerProblem, lam: Tensor) -> dict[str, Any]:
    """What ``learned.yaml`` holds: the optimizer (``class``, ``defaults``, one
    ``param_groups`` entry per parameter with its per-tensor values), the schedule (``windows``
    as ``[start, end, factor]`` fractions of training; ``None`` without one), the loss's own
    hyperparameters (``loss``: numbers, or the name of a tensor file for vectors) and
    ``steps`` (the horizon they were learned on). See the module docstring for what a schedule
    assumes."""
    hps, opt = problem.hyperparams, problem.optimizer
    values = transformed_values(hps, lam)
    bound = opt.bound_names()  # hyperparameter name -> argument
    scheduled = [n for n in bound if isinstance(hps.by_name[n], Schedule)]
    if any(bound[n] != "lr" for n in scheduled):
        not_lr = [f"{n} ({bound[n]})" for n in scheduled if bound[n] != "lr"]
        raise NotImplementedError(
            f"learned_settings: schedules of {not_lr}: torch.optim's schedulers set the "
            f"learning rate only; read the learned windows from results.json instead.")
    hp0 = problem.hyperparams.values(lam.detach(), 0, problem.steps)
    names = list(problem.fmodel.param_names)
    groups, torch_cls, defaults = [], None, None
    for name in names:
        # the optimizer's own hyperparameters (an InitScale's dict covers only its
        # parameters, and initial weights are not the optimizer's)
        hp_p = {k: (v[name] if isinstance(v, dict) else v) for k, v in hp0.items()
                if k in bound}
        single = opt.to_torch([torch.zeros(1)], hp_p)
        group = {k: (tuple(float(x) for x in v) if isinstance(v, tuple) else
                     _number(v) if isinstance(v, Tensor) else v)
                 for k, v in single.param_groups[0].items()
                 if k not in ("params", "initial_lr") and v is not None}
        if torch_cls is None:
            torch_cls, defaults = type(single), group
        groups.append({"params": [name], **{k: v for k, v in group.items()
                                            if defaults is not None and v != defaults.get(k)}})
    assert torch_cls is not None and defaults is not None
    cls: type = torch_cls
    import inspect

    sig = inspect.signature(torch_cls).parameters
    defaults = {k: v for k, v in defaults.items()  # the optimizer's settings, not torch's flags
                if k in sig and (k == "lr" or sig[k].default != v)}
    groups = [{k: v for k, v in g.items() if k == "params" or k in sig} for g in groups]
    schedule = None
    if scheduled:
        item = hps.by_name[scheduled[0]]
        assert isinstance(item, Schedule)
        lrs = values[item.name].reshape(-1)
        w = item.windows
        # the factors are relative to the optimizer's lr: the first window's, unless it is 0
        # (a warm-up from 0), where the largest window's is the base (0 / 0 gave NaN)
        base = float(lrs[0]) if float(lrs[0]) != 0 else float(lrs.abs().max())
        if base != float(lrs[0]):
            defaults["lr"] = base
        schedule = {"class": SCHEDULER, "windows": [
            [i / w, (i + 1) / w, float(lrs[i]) / base if base else 1.0] for i in range(w)]}
    per_tensor = {n for n in bound if isinstance(hps.by_name[n], PerTensor)}
    loss: dict[str, Any] = {}
    for it in hps.items:
        if it.name in bound or it.initializes:
            continue
        v = values[it.name]
        loss[it.name] = float(v) if v.numel() == 1 else f"learned_{it.name}.pt"
    return {
        "optimizer": {"class": (f"torch.optim.{cls.__name__}"
                                if getattr(torch.optim, cls.__name__, None) is cls
                                else f"{cls.__module__}.{cls.__qualname__}"),
                      "defaults": dict(defaults),
                      "param_groups": [g for g in groups if len(g) > 1 or per_tensor]},
        "schedule": schedule,
        "loss": loss,
        "steps": problem.steps,
    }


def _import(path: str) -> Any:
    import importlib

    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def optimizer_from_settings(settings: Mapping[str, Any],
                            params: Mapping[str, Tensor] | nn.Module | Iterable[Tensor],
                            steps: int | None = None
                            ) -> tuple[torch.optim.Optimizer, Any]:
    """``(optimizer, scheduler)`` from :func:`learned_settings`' dict (or ``learned.yaml``
    loaded): ``params`` by name (a module, or ``{name: tensor}``; a plain iterable works when
    there are no per-tensor groups), the schedule stretched over ``steps`` (default: the
    horizon it was learned on). Call ``scheduler.step()`` after every ``optimizer.step()``;
    ``scheduler`` is ``None`` without a schedule. A schedule-free optimizer (one with
    ``train()`` / ``eval()``, ``adamw_schedulefree``'s twin) comes back in train mode: call its
    ``eval()`` before evaluating or saving the model, as hypergrad's last step did."""
    o = settings["optimizer"]
    named: dict[str, Tensor]
    if isinstance(params, nn.Module):
        named = {k: p for k, p in params.named_parameters() if p.requires_grad}
    elif isinstance(params, Mapping):
        named = dict(params)
    else:
        named = {str(i): p for i, p in enumerate(params)}
    in_groups = {n for g in o["param_groups"] for n in g["params"]}
    missing = sorted(in_groups - set(named))
    if missing:
        raise ValueError(f"optimizer_from_settings: the learned parameter groups name "
                         f"{missing}, which params does not have; pass the model (or "
                         f"{{name: tensor}}) the hyperparameters were learned for.")
    groups = [{**{k: (tuple(v) if k == "betas" else v) for k, v in g.items()},
               "params": [named[n] for n in g["params"]]} for g in o["param_groups"]]
    rest = [p for n, p in named.items() if n not in in_groups]
    if rest:
        groups.append({"params": rest})
    defaults = {k: (tuple(v) if k == "betas" else v) for k, v in o["defaults"].items()}
    optimizer = _import(o["class"])(groups, **defaults)
    if callable(getattr(optimizer, "train", None)):  # schedule-free: steps need train mode
        optimizer.train()
    sched = settings.get("schedule")
    if not sched:
        return optimizer, None
    total = settings["steps"] if steps is None else steps
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"optimizer_from_settings: steps={total!r} must be an int >= 1 (the "
                         f"training steps the schedule is stretched over), or None for the "
                         f"horizon it was learned on ({settings['steps']}).")
    factors = [float(w[2]) for w in sched["windows"]]
    n = len(factors)

    def factor(t: int) -> float:
        return factors[min(t * n // total, n - 1)]

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def learned_optimizer(problem: InnerProblem, lam: Tensor,
                      params: Mapping[str, Tensor] | nn.Module | Iterable[Tensor],
                      steps: int | None = None) -> tuple[torch.optim.Optimizer, Any]:
    """``(optimizer, scheduler)`` of ``torch.optim`` at the hyperparameters ``lam`` (raw) of
    ``problem``, for ``params`` (see :func:`optimizer_from_settings`)."""
    return optimizer_from_settings(learned_settings(problem, lam), params, steps)


def trained_state_dict(problem: InnerProblem, state: InnerState) -> dict[str, Tensor]:
    """The module's ``state_dict`` with the trained parameters and running statistics of
    ``state`` (counters advanced by the horizon), the user's module left as it is."""
    fm = problem.fmodel
    out: dict[str, Tensor] = {}
    for key, value in fm.module.state_dict().items():
        if key in state.params:
            out[key] = state.params[key].detach().clone()
        elif key in state.buffers:
            out[key] = state.buffers[key].detach().clone()
        elif key in fm.counters0:
            out[key] = torch.tensor(fm.counters0[key] + problem.steps, dtype=value.dtype)
        else:
            out[key] = value.detach().clone()
    return out
