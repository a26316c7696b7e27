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

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .hyperparams import TRANSFORMS, HyperParams, InitScale, Schedule
from .optim.clip import CLIP_EPS, ClipGradNorm
from .problem import InnerProblem, InnerState

__all__ = ["learned_settings", "learned_optimizer", "optimizer_from_settings", "transformed_values",
           "trained_state_dict"]

SCHEDULER = "torch.optim.lr_scheduler.LambdaLR"
INIT_WEIGHTS = "the learned initial weights of"


def transformed_values(hps: HyperParams, lam: Tensor) -> dict[str, Tensor]:
    """``{name: value}`` of every hyperparameter at ``lam`` in its own units (each transform
    applied; a schedule's windows as one vector), detached: what the learned files hold."""
    raw = hps.split(lam.detach())
    return {it.name: TRANSFORMS[it.transform][0](raw[it.name]) for it in hps.items}


def _number(v: Tensor | float) -> float:
    return float(v)


def _base_window(r: Tensor) -> int:
    """The window whose learning rate a schedule's ``LambdaLR`` factors are relative to: the
    first, where it is positive and every factor is finite against it; else the largest."""
    first = float(r[0])
    if first > 0 and all(math.isfinite(float(x) / first) for x in r):
        return 0
    return int(r.argmax()) if float(r.max()) > 0 else int(r.abs().argmax())


def learned_settings(problem: InnerProblem, lam: Tensor) -> dict[str, Any]:
    """What ``learned.yaml`` holds: the optimizer (``class``, ``defaults``, one
    ``param_groups`` entry per parameter with its per-tensor values), the schedule (``windows``
    as ``[start, end, factor]`` fractions of training; ``None`` without one), the loss's own
    hyperparameters (``loss``: numbers, or the name of a tensor file for vectors; a schedule
    among them is described in ``loss_schedules``: its file, windows and the window step ``t``
    reads) and ``steps`` (the horizon they were learned on); where they apply,
    ``clip_grad_norm`` (the optimizer clipped its gradient to that global norm) and ``init``
    (learned initial values: ``{name: {param: scale}}`` of an :class:`~hypergrad.InitScale`, a
    sentence for an :class:`~hypergrad.InitWeights`). See the module docstring for what a
    schedule assumes. What ``torch.optim`` cannot hold raises ``NotImplementedError`` with the
    reason."""
    hps, opt = problem.hyperparams, problem.optimizer
    hps.check_raw(lam, "learned_settings")
    problem._check_finite_lam(lam)  # a NaN lam was written as lr: nan, and torch took it
    values = transformed_values(hps, lam)
    bound = opt.bound_names()  # hyperparameter name -> argument
    scheduled = [n for n in bound if isinstance(hps.by_name[n], Schedule)]
    if any(bound[n] != "lr" for n in scheduled):
        not_lr = [f"{n} ({bound[n]})" for n in scheduled if bound[n] != "lr"]
        raise NotImplementedError(
            f"learned_settings: schedules of {not_lr}: the scheduler exported here (LambdaLR) "
            f"sets the learning rate only (torch's OneCycleLR and CyclicLR cycle momentum on "
            f"their own fixed shapes, not learned windows); read the learned windows from "
            f"results.json and set them in your own loop.")
    hp0 = problem.hyperparams.values(lam.detach(), 0, problem.steps)
    schedule: dict[str, Any] | None = None
    if scheduled:
        item = hps.by_name[scheduled[0]]
        assert isinstance(item, Schedule)
        w = item.windows
        # one row, or one per group (a schedule's tuned scales, after its windows, are read
        # per parameter by at_window below, as multipliers are)
        rows = values[item.name][:item.base_numel].reshape(-1, w)
        # the factors are relative to the optimizer's lr: the first window's, unless it is not
        # a positive base every factor is finite against (a warm-up from 0 gave 0 / 0 = NaN, one
        # from 1e-310 factors of inf and a NaN model; torch.optim refuses a negative lr), where
        # the largest window's is; every parameter group's lr is what it reads in that window
        # (its multiplier times the base)
        firsts = [_base_window(r) for r in rows]
        factors = [[float(r[i]) / float(r[f]) if float(r[f]) else 1.0 for i in range(w)]
                   for r, f in zip(rows, firsts)]
        for r, f, row in zip(rows, firsts, factors):
            if not all(math.isfinite(x) for x in row):
                raise NotImplementedError(
                    f"learned_settings: schedule {item.name!r}'s windows "
                    f"{[float(x) for x in r]} have no base LambdaLR's factors are finite "
                    f"against (window {f}'s {float(r[f]):.3g}); the learned values are in "
                    f"results.json.")
        if item.groups is None:
            hp0[item.name] = item.at_window(hps.split(lam.detach())[item.name], firsts[0])
            schedule = {"class": SCHEDULER, "windows": [
                [i / w, (i + 1) / w, factors[0][i]] for i in range(w)]}
        else:  # a schedule per group: each parameter's own factors (the others: constant)
            assert item.assignment is not None
            hp0[item.name] = item.grouped_value(
                {p: rows[g, firsts[g]] for p, g in item.assignment.items()})
            schedule = {"class": SCHEDULER,
                        "windows": [[i / w, (i + 1) / w, 1.0] for i in range(w)],
                        "factors": {p: list(factors[g]) for p, g in item.assignment.items()}}
    names = list(problem.fmodel.param_names)
    groups, torch_cls, defaults = [], None, None
    for name in names:
        # the optimizer's own hyperparameters (an InitScale's dict covers only its
        # parameters, and initial weights are not the optimizer's)
        hp_p = {k: (v[name] if isinstance(v, dict) else v) for k, v in hp0.items()
                if k in bound}
        try:
            single = opt.at_param(name).to_torch([torch.zeros(1)], hp_p)
        except ValueError as err:  # torch.optim refuses the values (a negative weight decay)
            got = ", ".join(f"{bound[k]}={float(v):.6g}" for k, v in hp_p.items())
            raise NotImplementedError(
                f"learned_settings: torch.optim cannot hold what {opt!r} learned for parameter "
                f"{name!r} ({got}): {err}. A hyperparameter with transform='identity' can leave "
                f"the range torch.optim accepts: give it transform='log' (or 'logit'); the "
                f"learned values are in results.json.") from err
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
    # values per parameter (a PerTensor, a PerGroup, multipliers): every group is written
    per_tensor = {n for n in bound if hps.by_name[n].binding() is not None}
    loss: dict[str, Any] = {}
    loss_schedules: dict[str, Any] = {}  # those of loss's that are schedules
    for it in hps.items:
        if it.name in bound or it.initializes:
            continue
        v = values[it.name]
        loss[it.name] = float(v) if v.numel() == 1 else f"learned_{it.name}.pt"
        if isinstance(it, Schedule) and it.windows > 1:  # not a vector per feature
            loss_schedules[it.name] = {
                "file": loss[it.name], "windows": it.windows,
                **({"groups": list(it.groups)} if it.groups is not None else {}),
                "reads": (f"step t of a run of N steps reads window t * {it.windows} // N: "
                          f"windows are fractions of training (the file holds "
                          f"{'a row of windows per group, in order' if it.groups else 'them'}"
                          f"{', then the tuned scales' if it.scales else ''})")}
    out: dict[str, Any] = {
        "optimizer": {"class": (f"torch.optim.{cls.__name__}"
                                if getattr(torch.optim, cls.__name__, None) is cls
                                else f"{cls.__module__}.{cls.__qualname__}"),
                      "defaults": dict(defaults),
                      "param_groups": [g for g in groups if len(g) > 1 or per_tensor]},
        "schedule": schedule,
        "loss": loss,
        **({"loss_schedules": loss_schedules} if loss_schedules else {}),
        "steps": problem.steps,
        # the trained parameters they were learned for, checked by optimizer_from_settings (a
        # model with other parameters put them in a group of its own, silently)
        "params": {n: list(problem.fmodel.module.get_parameter(n).shape) for n in names},
    }
    if isinstance(opt, ClipGradNorm):
        if opt.eps != CLIP_EPS:
            raise NotImplementedError(
                f"learned_settings: {opt!r} adds eps={opt.eps:g} to the gradient's norm; "
                f"torch.nn.utils.clip_grad_norm_ adds {CLIP_EPS:g}: build the clip with "
                f"clip_grad_norm(optimizer, max_norm) to export it.")
        out["clip_grad_norm"] = opt.max_norm
    init = _learned_init(hps, values)
    if init:
        out["init"] = init
        # what the initial weights were: a model given twice (scaled twice: s^2 w_0) or
        # given trained is refused, not rescaled in silence; every parameter but the ones an
        # InitWeights replaces (a trained model was taken for an InitWeights, its other
        # tensors trained: the export probe)
        module = problem.fmodel.module
        replaced = {p for it in hps.items if it.initializes and not isinstance(it, InitScale)
                    for p in getattr(it, "params", None) or []}
        out["init_norms"] = {p: _norm(module.get_parameter(p)) for p in names
                             if p not in replaced}
    return out


def _norm(t: Tensor) -> float:
    return float(t.detach().double().norm())


def _check_initial(named: Mapping[str, Tensor], norms: Mapping[str, Any] | None,
                   api: str, drop: str) -> None:
    """Refuse parameters that are not the initial weights the learned initial values were
    learned at (their norms, ``norms``: the scaled ones and, since 2026-12-07, every other one
    not replaced by an :class:`~hypergrad.InitWeights`; ``None``: settings written before
    2026-12-06, not checked)."""
    for p, was in (norms or {}).items():
        if p not in named:
            continue
        now = _norm(named[p])
        if abs(now - float(was)) > 1e-6 * max(abs(float(was)), 1e-30):
            raise ValueError(
                f"{api}: {p} is not at the initial weights the learned ones apply to "
                f"(norm {now:.6g}; learned at {float(was):.6g}): scaled already (a second "
                f"call on the same model), trained, or initialised otherwise. Pass a fresh "
                f"copy of the model at its initial weights (copy.deepcopy before any "
                f"training); to scale other initial weights anyway, {drop}.")


def _learned_init(hps: HyperParams, values: Mapping[str, Tensor]) -> dict[str, Any]:
    """``{name: {param: scale}}`` of the :class:`~hypergrad.InitScale` hyperparameters (the
    initial weights training started from are ``scale * w_0``); an
    :class:`~hypergrad.InitWeights` (the initial weights themselves, too many numbers for the
    settings) as a sentence saying where they are."""
    out: dict[str, Any] = {}
    for it in hps.items:
        if not it.initializes:
            continue
        params = list(getattr(it, "params", None) or [])
        if isinstance(it, InitScale):
            v = values[it.name].reshape(-1)
            out[it.name] = {p: float(v[i]) for i, p in enumerate(params)}
        else:
            out[it.name] = (f"{INIT_WEIGHTS} {params} ({type(it).__name__}): not held here; "
                            f"TrainResult.learned_optimizer(model) loads them, "
                            f"problem.initial_state(lam).params holds them, and a "
                            f"hypergrad-run folder's results.json has them flattened under "
                            f"learned[{it.name!r}]")
    return out


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
    ``eval()`` before evaluating or saving the model, as hypergrad's last step did.

    What hypergrad's run did beyond the optimizer's step comes with it, so that plain training
    follows the same trajectory: a ``clip_grad_norm`` (the optimizer was clipped) becomes a step
    pre-hook that clips the gradients of the optimizer's parameters with
    ``torch.nn.utils.clip_grad_norm_`` before every step (do not clip them again); learned
    initial scales (``init``, from :class:`~hypergrad.InitScale`) multiply the named parameters
    of ``params`` **in place** here, as training started from ``scale * w_0``: pass the model
    at its initial weights (a fresh copy), once."""
    if "not_written" in settings:
        raise ValueError(f"optimizer_from_settings: these settings were not written: "
                         f"{settings['not_written']}")
    if isinstance(settings, (str, os.PathLike)):  # its keys were the path's characters
        raise TypeError(f"optimizer_from_settings: settings={str(settings)!r} is a path; pass "
                        f"its contents: yaml.safe_load(open({str(settings)!r})), or "
                        f"learned_settings(problem, lam).")
    if "optimizer" not in settings:
        raise ValueError(f"optimizer_from_settings: settings has no 'optimizer' (its keys: "
                         f"{sorted(settings)}); pass learned_settings(problem, lam) or "
                         f"learned.yaml loaded with yaml.safe_load.")
    o = settings["optimizer"]
    init = settings.get("init") or {}
    named = _named(params, "optimizer_from_settings", init)
    if isinstance(params, (Mapping, nn.Module)):  # by name (an iterable: by position)
        _check_params(settings.get("params"), named)
    else:
        _check_positions(settings.get("params"), named)
    weights = sorted(k for k, v in init.items() if isinstance(v, str))
    if weights:
        raise ValueError(
            f"optimizer_from_settings: the initial weights were learned too ({weights}: "
            f"{init[weights[0]]}); start your model from them and pass the settings without "
            f"those entries ({{**settings, 'init': {{k: v for k, v in settings['init'].items() "
            f"if k not in {weights!r}}}}}: the learned initial scales stay and are applied), or "
            f"use TrainResult.learned_optimizer(model), which loads them.")
    _check_initial(named, settings.get("init_norms") if init else None,
                   "optimizer_from_settings", "pass the settings without 'init_norms'")
    _scale_initial_weights(init, named)
    in_groups = {n for g in o["param_groups"] for n in g["params"]}
    missing = sorted(in_groups - set(named))
    if missing and not isinstance(params, (Mapping, nn.Module)):
        # a list of tensors has no names: told "params does not have" the names it lacks
        raise ValueError(f"optimizer_from_settings: the learned parameter groups differ "
                         f"between parameters (they name {missing[:4]}), and params is an "
                         f"iterable of tensors, which has no names to place them by; pass the "
                         f"model, or {{n: p for n, p in model.named_parameters() if "
                         f"p.requires_grad}}.")
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
    clip = settings.get("clip_grad_norm")
    if clip is not None:
        _clip_before_each_step(optimizer, float(clip))
    sched = settings.get("schedule")
    total = settings.get("steps") if steps is None else steps
    if (sched or steps is not None) and (isinstance(total, bool) or not isinstance(
            total, numbers.Integral) or total < 1):  # without a schedule too: it was ignored
        raise ValueError(f"optimizer_from_settings: steps={total!r} must be an int >= 1 (the "
                         f"training steps the schedule is stretched over), or None for the "
                         f"horizon it was learned on ({settings.get('steps', 'not in settings')}"
                         f").")
    if not sched:
        return optimizer, None
    total = int(total)  # type: ignore[arg-type]  # a NumPy int, checked above
    shared = [float(w[2]) for w in sched["windows"]]
    if total < len(shared):  # as InnerProblem refuses windows no step reads
        unread = sorted(set(range(len(shared))) - {t * len(shared) // total
                                                   for t in range(total)})
        raise ValueError(f"optimizer_from_settings: steps={total} is fewer than the schedule's "
                         f"{len(shared)} windows: windows {unread} would never be read; train "
                         f"for at least {len(shared)} steps (learned on "
                         f"{settings.get('steps', 'not in settings')}).")
    own = sched.get("factors") or {}  # a schedule per group: by parameter name

    def stretched(factors: list[float]) -> Any:
        n = len(factors)
        return lambda t: factors[min(t * n // total, n - 1)]

    if not own:
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, stretched(shared))
    names = [g["params"] for g in o["param_groups"]] + ([[n for n in named if n not in
                                                           in_groups]] if rest else [])
    lambdas = []
    for group in names:
        kinds = {tuple(own.get(n, shared)) for n in group}
        if len(kinds) > 1:
            raise ValueError(f"optimizer_from_settings: parameter group {group} holds "
                             f"parameters with different schedules ({sorted(kinds)}); give "
                             f"each its own group, as learned_settings writes them.")
        lambdas.append(stretched(list(kinds.pop())))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)


def _named(params: Mapping[str, Tensor] | nn.Module | Iterable[Tensor], api: str,
           init: Mapping[str, Any]) -> dict[str, Tensor]:
    """``params`` by name (the trainable parameters of a module; an iterable by position,
    refused where learned initial values must find their parameters by name)."""
    if isinstance(params, nn.Module):
        return {k: p for k, p in params.named_parameters() if p.requires_grad}
    if isinstance(params, Mapping):
        return dict(params)
    if init:
        raise ValueError(
            f"{api}: the learned hyperparameters include initial values ({sorted(init)}), "
            f"applied to parameters by name; pass the model (or {{name: tensor}}), not an "
            f"iterable of tensors.")
    try:
        out = {str(i): p for i, p in enumerate(params)}
    except TypeError:  # 'method' object is not iterable (problem.model, not called)
        out = {}
    if not out or not all(isinstance(p, Tensor) for p in out.values()):
        raise TypeError(f"{api}: params={params!r:.80} must be the model (an nn.Module), "
                        f"{{name: tensor}}, or an iterable of its parameter tensors, e.g. "
                        f"{api}(settings, model).")
    return out


def _check_params(learned: Mapping[str, Any] | None, named: Mapping[str, Tensor]) -> None:
    """Refuse ``params`` that are not the trained parameters the settings were learned for
    (``learned``: their shapes by name; absent in settings written before 2026-12-06)."""
    if learned is None:
        return
    extra = sorted(set(named) - set(learned))
    missing = sorted(set(learned) - set(named))
    shapes = [n for n in named if n in learned and list(named[n].shape) != list(learned[n])]
    if extra or missing or shapes:
        said = "; ".join(s for s in (
            f"params has {extra}, which were not trained when they were learned (frozen "
            f"ones, requires_grad=False, are left out of a model passed as a module)" if extra
            else "", f"params lacks {missing}" if missing else "",
            "shapes differ: " + ", ".join(f"{n} {list(named[n].shape)} (learned for "
                                         f"{list(learned[n])})" for n in shapes[:5])
            if shapes else "") if s)
        raise ValueError(
            f"optimizer_from_settings: params are not the trained parameters the settings were "
            f"learned for ({said}). Learned hyperparameters belong to the model, data and "
            f"horizon they were tuned on: pass that model (its trainable parameters), or "
            f"{{name: tensor}} of exactly those, and tune again for another model.")


def _check_positions(learned: Mapping[str, Any] | None, named: Mapping[str, Tensor]) -> None:
    """Refuse an iterable of tensors that cannot be the trained parameters the settings were
    learned for: another count, or other shapes (compared as a multiset: the settings' order
    is by name once written to YAML). A list missing tensors trained only those it held, and
    another model's parameters were taken (the export probe)."""
    if learned is None:
        return
    want = sorted(tuple(v) for v in learned.values())
    got = sorted(tuple(t.shape) for t in named.values())
    if want != got:
        raise ValueError(
            f"optimizer_from_settings: params holds {len(got)} tensors of shapes "
            f"{[list(s) for s in got][:6]}, but the settings were learned for {len(want)} "
            f"trainable parameters of shapes {[list(s) for s in want][:6]}: pass the model "
            f"they were learned for (all of its trainable parameters), or {{name: tensor}} of "
            f"exactly those.")


def _scale_initial_weights(init: Mapping[str, Mapping[str, float]],
                           named: Mapping[str, Tensor]) -> None:
    """``w *= scale`` in place for each learned initial scale, by parameter name, in the
    order hypergrad applied them."""
    for hp_name, per_param in init.items():
        missing = sorted(set(per_param) - set(named))
        if missing:
            raise ValueError(f"optimizer_from_settings: the learned initial scales {hp_name!r} "
                             f"name parameters {missing}, which params does not have; pass "
                             f"the model the hyperparameters were learned for.")
    with torch.no_grad():
        for per_param in init.values():
            for p, v in per_param.items():
                named[p].mul_(float(v))


def _clip_before_each_step(optimizer: torch.optim.Optimizer, max_norm: float) -> None:
    """Clip the gradients of ``optimizer``'s parameters to the global norm ``max_norm`` before
    each of its steps, as hypergrad's clipped optimizer (:mod:`hypergrad.optim.clip`) did."""
    def clip(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        if grads:
            torch.nn.utils.clip_grad_norm_(grads, max_norm)

    optimizer.register_step_pre_hook(clip)


def learned_optimizer(problem: InnerProblem, lam: Tensor,
                      params: Mapping[str, Tensor] | nn.Module | Iterable[Tensor],
                      steps: int | None = None) -> tuple[torch.optim.Optimizer, Any]:
    """``(optimizer, scheduler)`` of ``torch.optim`` at the hyperparameters ``lam`` (raw) of
    ``problem``, for ``params`` (see :func:`optimizer_from_settings`). Learned initial values
    are applied to the named parameters in place, in the problem's order: an
    :class:`~hypergrad.InitScale` multiplies them, an :class:`~hypergrad.InitWeights` is copied
    into them (pass the model at its initial weights, once). ``steps``: the scheduler's length
    in steps (default: the problem's ``T``; see :func:`optimizer_from_settings`)."""
    settings = learned_settings(problem, lam)
    init = settings.pop("init", None) or {}
    norms = settings.pop("init_norms", None)
    named = _named(params, "learned_optimizer", init)
    if init:
        missing = sorted({p for it in problem.hyperparams.init_items
                          for p in getattr(it, "params", None) or []} - set(named))
        if missing:
            raise ValueError(f"learned_optimizer: the learned initial values name parameters "
                             f"{missing}, which params does not have; pass the model the "
                             f"hyperparameters were learned for.")
        # by storage: the module's state_dict() or {n: p.data} are other tensor objects
        own = {t.untyped_storage().data_ptr() for t in problem.fmodel.module.parameters()}
        at = problem.hyperparams.values(lam.detach())
        written = sorted(p for it in problem.hyperparams.init_items for p in at[it.name]
                         if p in named and named[p].untyped_storage().data_ptr() in own)
        if written:  # scaled in place, they would move the problem's own start
            raise ValueError(f"learned_optimizer: params are the problem's own module "
                             f"({written}): the learned initial values would be written into "
                             f"the weights every run of the problem starts from. Pass a copy "
                             f"at its initial weights: copy.deepcopy(model).")
        _check_initial(named, norms, "learned_optimizer",
                       "scale them yourself: w.mul_(scale) with result.values' scales")
        values = problem.hyperparams.values(lam.detach())
        with torch.no_grad():
            for it in problem.hyperparams.init_items:
                for p, v in values[it.name].items():
                    if isinstance(it, InitScale):
                        named[p].mul_(v)
                    else:
                        named[p].copy_(v)
    # an iterable (model.parameters()) stays one: by position, as optimizer_from_settings
    # reads it (as {'0': ...} it was refused for names the settings do not have)
    by_name = isinstance(params, (Mapping, nn.Module))
    return optimizer_from_settings(settings, named if by_name else list(named.values()), steps)


def trained_state_dict(problem: InnerProblem, state: InnerState) -> dict[str, Tensor]:
    """The module's ``state_dict`` with the trained parameters and running statistics of
    ``state`` (counters advanced by the horizon), the user's module left as it is."""
    fm = problem.fmodel
    # a tensor shared under several names (tied weights: an output layer reading the
    # embedding's) is trained under its first name; its other names in the state_dict are the
    # same tensor, and load_state_dict would write the last one read over it
    first: dict[int, str] = {}
    alias: dict[str, str] = {}
    for key, t in [*fm.module.named_parameters(remove_duplicate=False),
                   *fm.module.named_buffers(remove_duplicate=False)]:
        alias[key] = first.setdefault(id(t), key)
    out: dict[str, Tensor] = {}
    for name, value in fm.module.state_dict().items():
        key = alias.get(name, name)
        if key in state.params:
            out[name] = state.params[key].detach().clone()
        elif key in state.buffers:
            out[name] = state.buffers[key].detach().clone()
        elif key in fm.counters0:
            # on the module's device (a CUDA model's counter came back on the CPU)
            out[name] = torch.tensor(fm.counters0[key] + problem.steps, dtype=value.dtype,
                                     device=value.device)
        else:
            out[name] = value.detach().clone()
    return out
