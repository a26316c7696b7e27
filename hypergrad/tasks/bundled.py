"""Tasks on bundled data (scikit-learn's digits, diabetes, breast cancer): the builders of the
``task`` config group.

Each builder takes the parts a config chooses (hyperparameters, inner optimizer, a model factory)
and returns a :class:`~hypergrad.Task`: the problem, ``evaluate(state) -> metrics``, named
reference points in hyperparameter space (baselines to compare against) and task-specific extra
results.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import MiniBatches
from ..errors import HypergradWarning, is_real
from ..hyperparams import Array, HyperParams, PerExample, Scalar, Schedule
from ..optim import SGD, Optimizer
from ..problem import InnerProblem, InnerState
from ..rng import keeps_rng
from ..task import Task
from .digits import digits_cnn, digits_data, mlp
from .ridge import ridge_closed_form_hypergradient

__all__ = ["mlp_factory", "linear_factory", "cnn_factory", "digits_task",
           "hypercleaning_task", "ridge_diabetes_task", "breast_cancer_task", "dtype_of",
           "user_file"]

ModelFactory = Callable[[int, int], nn.Module]


def _data_seed(seed: int, data_seed: int | None) -> int:
    """The seed of a task's data split: ``data_seed``, or the run's ``seed`` when it is None."""
    return seed if data_seed is None else int(data_seed)


def _check_split(api: str, n_train: int, n_val: int, n: int) -> None:
    """Train, validation and test (the rest) each need an example: an empty split's metrics are
    NaN."""
    if min(n_train, n_val) < 1 or n_train + n_val >= n:
        raise ValueError(f"{api}: n_train={n_train}, n_val={n_val} must be >= 1 and sum to less "
                         f"than {n} (the dataset's size), leaving the test split an example.")


def _check_batch(api: str, batch_size: int, n_train: int) -> None:
    """A mini-batch is drawn from the training split: it cannot hold more than ``n_train``."""
    if not 1 <= batch_size <= n_train:
        raise ValueError(f"{api}: batch_size={batch_size} with n_train={n_train} training "
                         f"examples; use 1 <= batch_size <= n_train (hypergrad-run: "
                         f"task.batch_size=<b> or task.n_train=<n>).")


def dtype_of(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "float64": torch.float64}
    if name not in table:
        raise ValueError(f"dtype={name!r}; use 'float32' or 'float64'.")
    return table[name]


def user_file(path: str | os.PathLike[str], api: str, fix: str) -> Path:
    """``path`` (``~`` expanded) where it names a file; else a ``ValueError`` (``hypergrad-run``
    answers it as a refused setting: a ``FileNotFoundError`` was a traceback) saying what is
    there and, for a relative path, the folder it was read from (with ``hydra.job.chdir=true``,
    the run folder), then ``fix``."""
    p = Path(path).expanduser()
    if not p.is_file():
        where = "" if p.is_absolute() else f" (relative to {os.getcwd()})"
        raise ValueError(f"{api}: {'a folder' if p.is_dir() else 'no file'} at {p}{where}; "
                         f"{fix}.")
    return p


def device_of(spec: str | torch.device | None) -> torch.device:
    """The device a bundled task builds on: ``"cpu"`` (default), ``"cuda"`` (this rank's GPU:
    :func:`hypergrad.distributed.device`, ``cuda:LOCAL_RANK``), ``"cuda:N"``, or ``"auto"`` (the
    GPU where CUDA is available, else the CPU). ``hypergrad-run device=cuda`` passes it on."""
    if spec is None:
        return torch.device("cpu")
    if isinstance(spec, torch.device):
        return spec
    name = str(spec)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={spec!r} but torch.cuda.is_available() is False (torch "
                         f"{torch.__version__}); use device=cpu, or device=auto for the GPU "
                         f"where there is one.")
    if name == "cuda":
        from ..distributed import device as rank_device

        return rank_device()
    try:
        return torch.device(name)
    except RuntimeError:
        raise ValueError(f"device={spec!r}; use 'cpu', 'cuda', 'cuda:N' or 'auto'.") from None


def mlp_factory(hidden: Sequence[int] = (64,), activation: str = "tanh",
                batchnorm: bool = False) -> ModelFactory:
    """``(in, out) -> MLP`` with the given hidden sizes (``activation``: tanh, relu, gelu)."""
    acts = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}
    if activation not in acts:
        raise ValueError(f"mlp_factory: activation={activation!r}; choose from {sorted(acts)}.")
    return lambda i, o: mlp([i, *hidden, o], acts[activation], batchnorm)


def cnn_factory(channels: Sequence[int] = (8, 16), activation: str = "relu") -> ModelFactory:
    """``(64, out) -> digits_cnn``: a small CNN over the 8x8 digit images (``problem=digits``)."""
    acts = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}
    if activation not in acts:
        raise ValueError(f"cnn_factory: activation={activation!r}; choose from {sorted(acts)}.")

    def make(i: int, o: int) -> nn.Module:
        if i != 64:
            raise ValueError(f"cnn_factory: the CNN reads 8x8 images (64 inputs), got {i} inputs; "
                             f"use it with problem=digits.")
        return digits_cnn(channels, o, acts[activation])

    return make


def linear_factory(bias: bool = True) -> ModelFactory:
    """``(in, out) -> nn.Linear``: softmax / logistic / linear regression."""
    return lambda i, o: nn.Linear(i, o, bias=bias)


def _classifier_eval(problem: InnerProblem, splits: dict[str, tuple[Tensor, Tensor]],
                     binary: bool = False) -> Callable[[InnerState], dict[str, float]]:
    def evaluate(state: InnerState) -> dict[str, float]:
        m = problem.fmodel.bind(state.params, state.buffers, train=False, step=problem.steps)
        out: dict[str, float] = {}
        with torch.no_grad():
            for name, (x, y) in splits.items():
                logits = m(x)
                if binary:
                    logits = logits[:, 0]
                    loss = F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype))
                    acc = ((logits > 0).long() == y).double().mean()
                else:
                    loss = F.cross_entropy(logits, y)
                    acc = (logits.argmax(-1) == y).double().mean()
                out[f"{name}_loss"] = float(loss)
                out[f"{name}_acc"] = float(acc)
        return out

    return evaluate


def lam_with(problem: InnerProblem, lam: Tensor, name: str, value: Any) -> Tensor:
    """``lam`` with hyperparameter ``name`` set to ``value`` (in value space)."""
    from ..hyperparams import TRANSFORMS

    item = problem.hyperparams.by_name[name]
    s = problem.hyperparams.slices[name]
    v = torch.as_tensor(value, dtype=lam.dtype).expand(item.shape()).reshape(-1)
    out = lam.clone()
    out[s] = TRANSFORMS[item.transform][1](v)
    return out


def _grid(problem: InnerProblem, grid: dict[str, Sequence[float]] | None,
          api: str = "digits_task") -> dict[str, Tensor]:
    """The references ``grid {name}={v}``: ``lam`` at its initial value with ``name`` set to
    each ``v``. A value that is not a number is refused (a bare number was iterated over, and
    ``True`` read as 1.0), and so is one outside the transform's domain (its reference was NaN,
    ranked best of the grid)."""
    from ..hyperparams import TRANSFORMS, rounded_onto_edge

    refs: dict[str, Tensor] = {}
    for name, values in (grid or {}).items():
        if name not in problem.hyperparams.by_name:
            raise ValueError(f"grid: {name!r} is not a hyperparameter; defined are "
                             f"{problem.hyperparams.names}.")
        eg = ([values] if is_real(values)
              else [0.01, 0.1])
        fix = (f"give a list of numbers, the values of {name!r} to compare: "
               f"grid={{{name!r}: {eg}}} (hypergrad-run: task.grid.{name}="
               f"[{','.join(map(str, eg))}])")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(f"{api}: grid[{name!r}]={values!r} is not a list; {fix}.")
        lam0 = problem.init_raw()
        transform = problem.hyperparams.by_name[name].transform
        _, _, valid, domain = TRANSFORMS[transform]
        for v in values:
            if not is_real(v):
                raise ValueError(f"{api}: grid[{name!r}]={list(values)!r} has {v!r} "
                                 f"({type(v).__name__}), not a number; {fix}.")
            t = torch.tensor(float(v), dtype=lam0.dtype)
            if not bool(torch.isfinite(t)) or not valid(t):
                raise ValueError(f"{api}: grid[{name!r}] value {v!r} is outside the domain of "
                                 f"transform={transform!r} of {name!r} ({domain})"
                                 f"{rounded_onto_edge(v, lam0.dtype, valid)}; give values in "
                                 f"that domain.")
            refs[f"grid {name}={v:g}"] = lam_with(problem, lam0, name, v)
    return refs


def _build_model(api: str, model: ModelFactory, n_in: int, n_out: int, device: Any,
                 dtype: torch.dtype) -> nn.Module:
    """``model(n_in, n_out)`` on ``device`` in ``dtype``. A built module where a factory is
    due (hypergrad-run's model group without ``_partial_: true``) failed with "forward() takes
    2 positional arguments but 3 were given", and a factory returning no module with "'str'
    object has no attribute 'to'" (the own-config probe): both are named, with the fix."""
    if isinstance(model, nn.Module):
        raise TypeError(
            f"{api}: model is a built {type(model).__name__}, where the task takes a factory "
            f"it calls as model({n_in}, {n_out}) (inputs, outputs). hypergrad-run: give the "
            f"model group's file _partial_: true (docs/own-model.md); in Python, pass the class "
            f"or a function (n_in, n_out) -> nn.Module.")
    net = model(n_in, n_out)
    if not isinstance(net, nn.Module):
        f = getattr(model, "func", model)  # a functools.partial: the function it calls
        name = f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"
        raise TypeError(
            f"{api}: the model factory {name}, called as model({n_in}, {n_out}), returned a "
            f"{type(net).__name__}, not a torch.nn.Module. hypergrad-run: the model group's "
            f"_target_ must build the module (a class, or a function returning one) "
            f"(docs/own-model.md).")
    return net.to(device=device, dtype=dtype)


def _check_outputs(api: str, net: nn.Module, x: Tensor, n_out: int) -> None:
    """The model built as ``model(n_in, n_out)`` gives one row of ``n_out`` outputs per
    example (a model of your own with another last layer, or one that squeezes or adds a
    dimension, failed later inside a loss with an indexing error naming neither). One forward
    of two examples in eval mode (no dropout draw, no BatchNorm statistics moved); every
    submodule's mode restored."""
    modes = [(m, m.training) for m in net.modules()]
    net.eval()
    try:
        with torch.no_grad():
            out = net(x[:2])
    finally:
        for m, was in modes:
            m.training = was
    want = (min(2, x.shape[0]), n_out)
    got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
    if got != want:
        raise ValueError(
            f"{api}: the model ({type(net).__name__}, built as model({x.shape[1]}, {n_out})) "
            f"returns {got} for {want[0]} examples; the task needs shape {want}: {n_out} "
            f"output{'s' if n_out > 1 else ''} per example. Make the model's last layer give "
            f"n_out={n_out} values (e.g. nn.Linear(hidden, n_out)) and return them as a "
            f"(batch, {n_out}) tensor.")


@keeps_rng
def digits_task(hyperparams: HyperParams, optimizer: Optimizer, model: ModelFactory,
                steps: int = 300, n_train: int = 1000, n_val: int = 400, batch_size: int = 64,
                seed: int = 0, dtype: str = "float32", val_mode: str = "eval",
                grid: dict[str, Sequence[float]] | None = None,
                data_seed: int | None = None, device: str = "cpu") -> Task:
    """Classification of ``load_digits`` (an MLP, or a CNN over the 8x8 images) with mini-batch
    training; E = validation CE.

    ``seed`` fixes the model's initialisation and the mini-batch order; ``data_seed`` the
    train/validation/test split (``None``: ``seed``, so a run changes both). The training loss
    reads ``hp["smooth"]`` (label smoothing) when that hyperparameter exists. ``device``:
    :func:`device_of`.
    """
    dt, dev = dtype_of(dtype), device_of(device)
    smooth = hyperparams.by_name.get("smooth")
    if smooth is not None and smooth.transform != "logit":
        warnings.warn(
            f"digits_task: the label smoothing 'smooth' has transform={smooth.transform!r}: "
            f"tuning can move it out of [0, 1), where the loss is no longer label smoothing "
            f"(below 0 it is unbounded below, and the 'learned' value only scales the "
            f"gradient). Give it transform='logit' (hypergrad-run: "
            f"hyperparams.items.smooth.transform=logit), or bound it (guards.bounds).",
            HypergradWarning, stacklevel=2)
    data = digits_data(n_train, n_val, None, seed=_data_seed(seed, data_seed), dtype=dt,
                       device=dev)
    torch.manual_seed(seed)
    net = _build_model("digits_task", model, 64, 10, dev, dt)
    _check_outputs("digits_task", net, data.x_train, 10)

    def train_loss(m: Any, batch: Any, hp: Any) -> Tensor:
        x, y, _ = batch
        logp = F.log_softmax(m(x), dim=-1)
        nll = -logp.gather(1, y[:, None])[:, 0]
        if "smooth" in hp:
            nll = (1 - hp["smooth"]) * nll - hp["smooth"] * logp.mean(-1)
        return nll.mean()

    def val_loss(m: Any, hp: Any) -> Tensor:
        return F.cross_entropy(m(data.x_val), data.y_val)

    _check_batch("digits_task", batch_size, n_train)
    batches = MiniBatches(data.x_train, data.y_train, batch_size=batch_size, seed=seed)
    problem = InnerProblem(net, train_loss, optimizer, hyperparams, batches, steps, val_loss,
                           val_mode=val_mode, seed=seed)
    ev = _classifier_eval(problem, {"val": (data.x_val, data.y_val),
                                    "test": (data.x_test, data.y_test)})
    return Task(problem, ev, _grid(problem, grid), name="digits")


@keeps_rng
def hypercleaning_task(hyperparams: HyperParams, optimizer: Optimizer, model: ModelFactory,
                       steps: int = 100, n_train: int = 500, n_val: int = 200,
                       flip_fraction: float = 0.5, seed: int = 0, dtype: str = "float32",
                       weights: str = "weights", threshold: float = 0.5,
                       data_seed: int | None = None, device: str = "cpu") -> Task:
    """Data hyper-cleaning (Franceschi et al. 2017, sec. 5.1) on ``load_digits``.

    Softmax regression trained full-batch on ``n_train`` examples of which ``flip_fraction`` have
    their label replaced by a random *wrong* class; one weight per training example
    (hyperparameter ``weights``, kept in [0, 1] by the Trainer's bounds); E = CE on clean
    validation data. References: the noisy baseline (all weights 1) and the oracle (weights 1 on
    clean examples, 0 on flipped ones). ``extra`` reports precision/recall/F1 of flagging
    examples with a learned weight below ``threshold`` as flipped. ``seed`` fixes the model's
    initialisation; ``data_seed`` the split and which labels flip (``None``: ``seed``).
    """
    if not 0 < flip_fraction < 1:
        raise ValueError(f"hypercleaning_task: flip_fraction={flip_fraction} must be in (0, 1).")
    dt, dev = dtype_of(dtype), device_of(device)
    ds = _data_seed(seed, data_seed)
    data = digits_data(n_train, n_val, None, seed=ds, dtype=dt, device=dev)
    rng = np.random.default_rng(ds + 1)
    flipped = np.zeros(n_train, dtype=bool)
    flipped[rng.choice(n_train, int(round(flip_fraction * n_train)), replace=False)] = True
    y_noisy = data.y_train.clone()
    shift = torch.as_tensor(rng.integers(1, 10, size=n_train), device=dev)
    mask = torch.as_tensor(flipped, device=dev)
    y_noisy[mask] = (y_noisy + shift)[mask] % 10
    torch.manual_seed(seed)
    net = _build_model("hypercleaning_task", model, 64, 10, dev, dt)
    _check_outputs("hypercleaning_task", net, data.x_train, 10)
    idx_all = torch.arange(n_train, device=dev)

    def train_loss(m: Any, batch: Any, hp: Any) -> Tensor:
        x, y, idx = batch
        ce = F.cross_entropy(m(x), y, reduction="none")
        return (hp[weights][idx] * ce).mean()

    def val_loss(m: Any, hp: Any) -> Tensor:
        return F.cross_entropy(m(data.x_val), data.y_val)

    item = hyperparams.by_name.get(weights)
    if item is None or not isinstance(item, PerExample):
        raise ValueError(f"hypercleaning_task: weights={weights!r} must name a per_example "
                         f"hyperparameter; defined are {hyperparams.names}.")
    if item.n != n_train:
        raise ValueError(f"hypercleaning_task: the per_example hyperparameter {weights!r} has "
                         f"n={item.n} but n_train={n_train}: one weight per training example "
                         f"(hypergrad-run: 'hyperparams.items.{weights}.n=${{task.n_train}}').")
    problem = InnerProblem(net, train_loss, optimizer, hyperparams,
                           [(data.x_train, y_noisy, idx_all)], steps, val_loss, seed=seed)
    clean = torch.as_tensor(~flipped, dtype=dt, device=dev)
    # the other hyperparameters (a learning rate tuned beside the weights) at their initial
    # values: a learned row could beat the "oracle" by its learning rate alone, unlabelled
    others = "" if hyperparams.names == [weights] else "; the rest initial"
    refs = {f"baseline (noisy, weights 1{others})": lam_with(problem, problem.init_raw(),
                                                              weights, 1.0),
            f"oracle (clean examples only{others})": lam_with(problem, problem.init_raw(),
                                                               weights, clean)}

    def extra(lam: Tensor) -> dict[str, Any]:
        w = problem.hyperparams.values(lam)[weights]
        pred = (w < threshold).cpu().numpy()
        tp, flagged, n_flipped = int((pred & flipped).sum()), int(pred.sum()), int(flipped.sum())
        # nothing flagged: precision is undefined (0 / 0), not 0 (it read as every flag wrong);
        # no flipped label: recall is undefined too
        prec = tp / flagged if flagged else None
        rec = tp / n_flipped if n_flipped else None
        f1 = (2 * prec * rec / (prec + rec) if prec and rec else
              0.0 if prec is not None and rec is not None else None)

        def said(v: float | None) -> str:
            return "undefined" if v is None else f"{v:.3f}"

        return {"flip_detection": {
            "precision": prec, "recall": rec, "f1": f1, "threshold": threshold,
            "n_flipped": n_flipped, "n_flagged": flagged,
            "summary": f"flagging weight < {threshold} as flipped: {flagged} flagged, precision "
                       f"{said(prec)}, recall {said(rec)}, F1 {said(f1)} ({n_flipped} flipped "
                       f"labels)"}}

    ev = _classifier_eval(problem, {"val": (data.x_val, data.y_val),
                                    "test": (data.x_test, data.y_test)})
    return Task(problem, ev, refs, extra, name="hypercleaning")


def _standardized(x: np.ndarray, n_train: int) -> np.ndarray:
    mu, sd = x[:n_train].mean(0), x[:n_train].std(0) + 1e-12
    return (x - mu) / sd


def _check_l2(api: str, hyperparams: HyperParams, l2_name: str, n_features: int) -> bool:
    """The L2 coefficient the training loss reads, ``hp[l2_name]``: a hyperparameter of one
    value (a scalar, a schedule), or an array of one value per feature, shape
    ``(n_features,)``. Whether it is per feature. A per-feature array of another size crashed
    inside the loss (size 15 vs 30), or was summed into a training loss of that shape."""
    item = hyperparams.by_name.get(l2_name)
    if item is None:
        raise ValueError(f"{api}: l2_name={l2_name!r} is not a hyperparameter; defined are "
                         f"{hyperparams.names}; the training loss reads the L2 coefficient "
                         f"hp[{l2_name!r}]: add it (hypergrad-run: hyperparams=l2 for one "
                         f"coefficient, or hyperparams=l2_per_feature "
                         f"hyperparams.items.l2.shape=[{n_features}] for one per feature), or "
                         f"name another with l2_name=...")
    if isinstance(item, (Scalar, Schedule)):
        return False
    shape = item.shape() if isinstance(item, Array) else None
    if shape is None or shape not in ((), (1,), (n_features,)):
        what = (f"has shape {shape}" if shape is not None
                else f"is a {item.kind} hyperparameter")
        raise ValueError(f"{api}: hyperparameter {l2_name!r} {what}, but the data has "
                         f"{n_features} features: the L2 coefficient is one number or one per "
                         f"feature, shape ({n_features},); use "
                         f"Array({l2_name!r}, init, shape=({n_features},)) (hypergrad-run: "
                         f"hyperparams.items.{l2_name}.shape=[{n_features}]), or one "
                         f"coefficient (hypergrad-run: hyperparams=l2).")
    return shape == (n_features,) and n_features > 1


def ridge_diabetes_task(hyperparams: HyperParams, optimizer: Optimizer, model: ModelFactory,
                        steps: int = 3000, n_train: int = 250, n_val: int = 100,
                        seed: int = 0, dtype: str = "float64", l2_name: str = "l2",
                        device: str = "cpu") -> Task:
    """Ridge regression on ``load_diabetes`` (standardized), full-batch GD, L2 coefficient
    learned. ``extra`` compares the hypergradient after the long inner run with the closed-form
    implicit one (the limit T -> infinity) at the learned L2."""
    from sklearn.datasets import load_diabetes

    dt, dev = dtype_of(dtype), device_of(device)
    x, y = load_diabetes(return_X_y=True)
    _check_split("ridge_diabetes_task", n_train, n_val, len(y))
    perm = np.random.default_rng(seed).permutation(len(y))
    x, y = _standardized(x[perm], n_train), y[perm]
    y = (y - y[:n_train].mean()) / y[:n_train].std()
    xt, yt = torch.as_tensor(x, dtype=dt, device=dev), torch.as_tensor(y, dtype=dt, device=dev)
    xtr, ytr = xt[:n_train], yt[:n_train]
    xv, yv = xt[n_train:n_train + n_val], yt[n_train:n_train + n_val]
    xte, yte = xt[n_train + n_val:], yt[n_train + n_val:]
    per_feature = _check_l2("ridge_diabetes_task", hyperparams, l2_name, x.shape[1])
    net = _build_model("ridge_diabetes_task", model, x.shape[1], 1, dev, dt)
    _check_outputs("ridge_diabetes_task", net, xtr, 1)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()

    def train_loss(m: Any, batch: Any, hp: Any) -> Tensor:
        xb, yb = batch
        r = m(xb)[:, 0] - yb
        if per_feature:  # one coefficient per feature: weight is (1, n_features)
            w = m.params["weight"]
            return 0.5 * (r * r).mean() + 0.5 * (hp[l2_name] * w * w).sum()
        return 0.5 * (r * r).mean() + 0.5 * hp[l2_name] * (m.params["weight"] ** 2).sum()

    def val_loss(m: Any, hp: Any) -> Tensor:
        r = m(xv)[:, 0] - yv
        return 0.5 * (r * r).mean()

    problem = InnerProblem(net, train_loss, optimizer, hyperparams, [(xtr, ytr)], steps,
                           val_loss, seed=seed)

    def evaluate(state: InnerState) -> dict[str, float]:
        m = problem.fmodel.bind(state.params, state.buffers, train=False)
        with torch.no_grad():
            return {"val_mse": float(((m(xv)[:, 0] - yv) ** 2).mean()),
                    "test_mse": float(((m(xte)[:, 0] - yte) ** 2).mean())}

    why_not = _ridge_closed_form_unavailable(problem, optimizer, l2_name)
    if why_not:
        warnings.warn(f"ridge_diabetes_task: {why_not}; the closed-form check of the "
                      f"hypergradient is skipped (the tuning runs and its results are written).",
                      HypergradWarning, stacklevel=2)

    def extra(lam: Tensor) -> dict[str, Any]:
        from ..methods.forward import ForwardMode

        if why_not:
            return {"closed_form": {"skipped": why_not,
                                    "summary": f"closed-form check skipped: {why_not}"}}
        l2 = float(problem.hyperparams.values(lam)[l2_name])
        lr = optimizer.args["lr"]
        got = ForwardMode().hypergradient(problem, lam).grad
        implicit = ridge_closed_form_hypergradient(xtr, ytr, xv, yv, l2, float(lr), None)
        finite_t = ridge_closed_form_hypergradient(xtr, ytr, xv, yv, l2, float(lr), steps)
        rel = float((got - implicit).norm() / implicit.norm())
        rel_t = float((got - finite_t).norm() / finite_t.norm())
        return {"closed_form": {"l2": l2, "forward_hypergradient": float(got[0]),
                                "implicit_hypergradient": float(implicit[0]),
                                "rel_diff_implicit": rel, "rel_diff_finite_T": rel_t,
                                "summary": f"hypergradient at l2={l2:.4g} after T={steps}: "
                                           f"forward {float(got[0]):.6e}; closed form at the "
                                           f"same T {float(finite_t[0]):.6e} (relative "
                                           f"difference {rel_t:.2e}: the exactness check); "
                                           f"closed form as T -> infinity (implicit) "
                                           f"{float(implicit[0]):.6e} (relative difference "
                                           f"{rel:.2e}: how far T steps are from converged)"}}

    return Task(problem, evaluate, {}, extra, name="ridge_diabetes")


def _ridge_closed_form_unavailable(problem: InnerProblem, optimizer: Optimizer,
                                   l2_name: str) -> str:
    """Why the closed-form ridge hypergradient does not apply to this set-up ("" if it does):
    it is for plain full-batch GD with a constant learning rate, no bias, L2 the only
    hyperparameter."""
    a = optimizer.args
    if "bias" in problem.fmodel.param_names:
        return "the closed form assumes no bias (use model=linear_nobias)"
    if not isinstance(optimizer, SGD) or a.get("nesterov") or any(
            not isinstance(a.get(k, 0.0), (int, float)) or a.get(k, 0.0) != 0
            for k in ("momentum", "weight_decay", "dampening")):
        return (f"the closed form is for plain gradient descent, not {optimizer!r} (use "
                f"inner_optimizer=sgd)")
    if isinstance(a["lr"], str):
        return "the closed form needs a constant learning rate (inner_optimizer.lr=<number>)"
    if problem.hyperparams.names != [l2_name]:
        return f"the closed form has one hyperparameter, {l2_name!r}"
    if problem.hyperparams.by_name[l2_name].numel != 1:
        return f"the closed form is for one L2 coefficient, not one per feature ({l2_name!r})"
    return ""


@keeps_rng
def breast_cancer_task(hyperparams: HyperParams, optimizer: Optimizer, model: ModelFactory,
                       steps: int = 200, n_train: int = 300, n_val: int = 130, seed: int = 0,
                       dtype: str = "float32", l2_name: str = "l2",
                       batch_size: int | None = None, data_seed: int | None = None,
                       device: str = "cpu") -> Task:
    """Logistic regression on ``load_breast_cancer`` (30 standardized features) with one L2
    coefficient per feature (``hp[l2_name]`` of shape (30,), penalty on the weight only).
    ``seed`` fixes the initialisation (and mini-batch order); ``data_seed`` the split (``None``:
    ``seed``)."""
    from sklearn.datasets import load_breast_cancer

    dt, dev = dtype_of(dtype), device_of(device)
    x, y = load_breast_cancer(return_X_y=True)
    _check_split("breast_cancer_task", n_train, n_val, len(y))
    perm = np.random.default_rng(_data_seed(seed, data_seed)).permutation(len(y))
    x, y = _standardized(x[perm], n_train), y[perm]
    xt = torch.as_tensor(x, dtype=dt, device=dev)
    yt = torch.as_tensor(y, dtype=torch.int64, device=dev)
    xtr, ytr = xt[:n_train], yt[:n_train]
    xv, yv = xt[n_train:n_train + n_val], yt[n_train:n_train + n_val]
    xte, yte = xt[n_train + n_val:], yt[n_train + n_val:]
    _check_l2("breast_cancer_task", hyperparams, l2_name, x.shape[1])
    torch.manual_seed(seed)
    net = _build_model("breast_cancer_task", model, x.shape[1], 1, dev, dt)
    _check_outputs("breast_cancer_task", net, xtr, 1)

    def train_loss(m: Any, batch: Any, hp: Any) -> Tensor:
        xb, yb = batch[0], batch[1]
        bce = F.binary_cross_entropy_with_logits(m(xb)[:, 0], yb.to(xb.dtype))
        w = m.params["weight"][0]
        return bce + 0.5 * (hp[l2_name] * w * w).sum()

    def val_loss(m: Any, hp: Any) -> Tensor:
        return F.binary_cross_entropy_with_logits(m(xv)[:, 0], yv.to(xv.dtype))

    if batch_size is not None:
        _check_batch("breast_cancer_task", batch_size, n_train)
    batches: Any = ([(xtr, ytr)] if batch_size is None else
                    MiniBatches(xtr, ytr, batch_size=batch_size, seed=seed))
    problem = InnerProblem(net, train_loss, optimizer, hyperparams, batches, steps, val_loss,
                           seed=seed)
    ev = _classifier_eval(problem, {"val": (xv, yv), "test": (xte, yte)}, binary=True)
    return Task(problem, ev, name="breast_cancer_l2")
