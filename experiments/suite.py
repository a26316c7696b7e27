"""A suite of tuning problems the project never tuned on, to judge the Trainer's defaults (#27).

Seventeen small problems built through the public API from scikit-learn's bundled datasets
(``load_digits``, ``load_breast_cancer``, ``load_diabetes``, ``load_wine``; no downloads) and from
synthetic data: classification and regression; SGD, momentum, Adam and AdamW; learning-rate
schedules, per-tensor, per-feature and per-example hyperparameters, loss parameters (a class
weight, label smoothing); K from 2 to 300; label noise, class imbalance, batches from 8 to 256.
Each problem states its **search box** once (``bounds``: value-space bounds for every
hyperparameter), shared by every tuner, and its initial point (the user's first guess, inside the
box). A plain training (T <= 200 steps of a small model) takes well under a second.

**The split** (:data:`SPLIT`) was drawn once, by :data:`SPLIT_SEED`, before any default of the
Trainer was changed: within each stratum (K <= 15, K > 15) the names, sorted, are shuffled by
``random.Random(SPLIT_SEED)`` and the first half goes to ``dev``. Defaults may be tuned on
``dev`` only; ``eval`` judges them. :data:`SPLIT_HASH` is the SHA-256 of the split's canonical
JSON; ``tests/test_suite.py`` checks that the committed split is the one the seed draws.

**The budget rule** (:data:`BUDGET_PLAIN_RUNS`): every tuner gets the time of N plain
trainings of the problem (the median of timed plain runs at the problem's initial point), N the
same for every problem; ``vs_optuna.py --suite`` measures it in its process's CPU time, on one
thread.

``build(name, seed)`` gives a :class:`SuiteTask`: the ``InnerProblem`` (train split, validation
loss on the validation split), the box, and ``test(state)`` (test loss, and accuracy for
classifiers). ``seed`` sets the model's initialisation, the mini-batch order and the run seed;
the data split is fixed (``DATA_SEED``).

    python experiments/suite.py          # the table of problems and the split
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hypergrad as hg
from hypergrad.data import MiniBatches, split_validation
from hypergrad.problem import InnerState
from hypergrad.tasks import mlp

__all__ = ["SuiteProblem", "SuiteTask", "PROBLEMS", "SPLIT", "SPLIT_SEED", "SPLIT_HASH",
           "BUDGET_PLAIN_RUNS", "DATA_SEED", "LOW_K", "build", "make_split", "split_hash"]

SPLIT_SEED = 27  # the issue's number: drawn once, before any default changed
DATA_SEED = 0  # one train / validation / test split per dataset, for every seed and tuner
BUDGET_PLAIN_RUNS = 30  # every tuner's budget: the time of 30 plain trainings
LOW_K = 15  # the strata of the split: K <= 15 (where users are) and K > 15
MODEL_FACTORY = False
"""Whether every problem passes its model's builder (``InnerProblem(model_factory=...)``), so
that the Trainer's re-checks also train from other initial weights (only the Trainer reads
it). Off: on the development half, 10 seeds, it changed nothing measurable (geometric mean of
the test losses 1.003x the re-check in batch order only, 2026-11-26); ``vs_optuna --variants
reinit`` switches it on."""

SELECT_SHARE = 0.0
"""With a share > 0, the Trainer's contenders (``build(..., select=True)``) get the validation
split cut in two (:func:`hypergrad.data.split_validation`, stratified for classifiers, fixed by
:data:`DATA_SEED`): ``val_loss`` on one part drives the hypergradients, ``select_loss`` on this
share of it (held out from them) chooses the point returned; the black-box contenders still
evaluate the whole validation split, so every contender sees the same validation data. Off:
on the development half, 10 seeds, a held-out half made the defaults 1.09x worse (geometric
mean of the test losses; better on 4 of 9 problems), a held-out 30 % 1.25x worse
(2026-11-26, docs/benchmarks.md); ``vs_optuna --variants select_50 select_30`` turns it on."""

DTYPE = torch.float32
_select = False  # set by build(..., select=True) while the problem is made


@dataclass
class SuiteTask:
    """One problem at one seed: what a tuner needs (``problem``, ``bounds``) and how the
    retrained model is judged (``test(state) -> {"test_loss": ..., ["test_acc": ...]}``)."""

    problem: hg.InnerProblem
    bounds: dict[str, tuple[float, float]]
    test: Callable[[InnerState], dict[str, float]]


@dataclass(frozen=True)
class SuiteProblem:
    """A problem of the suite: ``make(seed) -> SuiteTask``, its K and what it exercises."""

    name: str
    K: int
    task: str  # "classification" or "regression"
    note: str
    make: Callable[[int], SuiteTask]


# -- data ----------------------------------------------------------------------------------------
class Split:
    """Standardised train / validation / test tensors (``x`` float, ``y`` int64 or float)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, n_train: int, n_val: int, n_test: int,
                 regression: bool, seed: int = DATA_SEED, perm: np.ndarray | None = None) -> None:
        n = len(y)
        if perm is None:
            perm = np.random.default_rng(seed).permutation(n)
        x, y = x[perm], y[perm]
        a, b, c = n_train, n_train + n_val, n_train + n_val + n_test
        assert c <= n, (c, n)
        mean, std = x[:a].mean(0), x[:a].std(0) + 1e-3
        x = (x - mean) / std
        if regression:
            y = (y - y[:a].mean()) / y[:a].std()
        xt = torch.as_tensor(x, dtype=DTYPE)
        yt = torch.as_tensor(y, dtype=DTYPE if regression else torch.int64)
        self.x_train, self.y_train = xt[:a], yt[:a].clone()
        self.x_val, self.y_val = xt[a:b], yt[a:b]
        self.x_test, self.y_test = xt[b:c], yt[b:c]
        self.d = x.shape[1]
        self.classes = 0 if regression else int(y.max()) + 1


@cache
def _sklearn(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    x, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    return np.asarray(x, dtype=np.float64), np.asarray(y)


def _flip(y: Tensor, fraction: float, classes: int, seed: int = DATA_SEED) -> Tensor:
    """``y`` with ``fraction`` of its labels moved to another class (fixed by ``seed``)."""
    g = np.random.default_rng(seed + 1)
    y = y.clone()
    n = len(y)
    idx = g.choice(n, int(round(fraction * n)), replace=False)
    shift = g.integers(1, classes, size=len(idx))
    y[idx] = (y[idx] + torch.as_tensor(shift)) % classes
    return y


def _imbalanced_perm(y: np.ndarray, minority: int, keep: float, n_train: int) -> np.ndarray:
    """A permutation whose first ``n_train`` rows keep only a ``keep`` share of the class
    ``minority`` (the training split is imbalanced; validation and test are not)."""
    g = np.random.default_rng(DATA_SEED)
    perm = g.permutation(len(y))
    minor = [i for i in perm if y[i] == minority]
    major = [i for i in perm if y[i] != minority]
    n_min = int(round(keep * n_train * len(minor) / len(y)))
    train = minor[:n_min] + major[:n_train - n_min]
    g.shuffle(train)
    rest = [i for i in perm if i not in set(train)]
    return np.asarray(train + rest)


def _synthetic_regression(n: int, d: int, relevant: int, noise: float,
                          nonlinear: bool) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(1234 + d)
    x = g.normal(size=(n, d))
    w = np.zeros(d)
    w[:relevant] = g.normal(size=relevant) * 2.0
    y = x @ w
    if nonlinear:
        y = y + 2.0 * np.sin(1.5 * x[:, 0]) * x[:, 1] + np.abs(x[:, 2])
    return x, y + noise * g.normal(size=n)


def _synthetic_classes(n: int, d: int, classes: int, sep: float) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(4321 + d)
    centers = g.normal(size=(classes, d)) * sep
    y = g.integers(0, classes, size=n)
    x = centers[y] + g.normal(size=(n, d))
    x[:, : d // 2] += 0.5 * np.tanh(x[:, d // 2:]) ** 2  # a little nonlinearity
    return x, y


# -- models and losses ---------------------------------------------------------------------------
def _mlp(sizes: list[int], bn: bool = False, act: type[nn.Module] = nn.Tanh) -> nn.Module:
    return mlp(sizes, activation=act, batchnorm=bn)


def _test_fn(problem: hg.InnerProblem, data: Split) -> Callable[[InnerState], dict[str, float]]:
    def test(state: InnerState) -> dict[str, float]:
        with torch.no_grad():
            out = problem.model(state)(data.x_test)
        if data.classes == 0:
            return {"test_loss": float(F.mse_loss(out.squeeze(-1), data.y_test))}
        return {"test_loss": float(F.cross_entropy(out, data.y_test)),
                "test_acc": float((out.argmax(-1) == data.y_test).float().mean())}
    return test


def _loss_on(x: Tensor, y: Tensor, regression: bool) -> Callable[[Any, Any], Tensor]:
    if regression:
        return lambda m, hp: F.mse_loss(m(x).squeeze(-1), y)
    return lambda m, hp: F.cross_entropy(m(x), y)


def _val_fns(data: Split) -> tuple[Callable[[Any, Any], Tensor],
                                   Callable[[Any, Any], Tensor] | None]:
    """``(val_loss, select_loss)``: the whole validation split and no select loss, or, while
    :func:`build` makes a problem for the Trainer (``select=True``, :data:`SELECT_SHARE` > 0),
    the two parts of the split."""
    regression = data.classes == 0
    if not (_select and SELECT_SHARE > 0):
        return _loss_on(data.x_val, data.y_val, regression), None
    (xv, yv), (xs, ys) = split_validation(data.x_val, data.y_val, share=SELECT_SHARE,
                                          seed=DATA_SEED,
                                          stratify=None if regression else data.y_val)
    return _loss_on(xv, yv, regression), _loss_on(xs, ys, regression)


def _task(seed: int, data: Split, model: Callable[[], nn.Module], hps: list[Any], opt: Any,
          loss: Callable[[Any, Any, Any], Tensor], steps: int, batch: int,
          bounds: dict[str, tuple[float, float]], y_train: Tensor | None = None) -> SuiteTask:
    torch.manual_seed(seed)
    net = model()
    y = data.y_train if y_train is None else y_train
    val_loss, select_loss = _val_fns(data)
    problem = hg.InnerProblem(net, loss, opt, hg.HyperParams(hps),
                              MiniBatches(data.x_train, y, batch_size=batch, seed=seed),
                              steps, val_loss, seed=seed,
                              model_factory=model if MODEL_FACTORY else None,
                              select_loss=select_loss)
    return SuiteTask(problem, bounds, _test_fn(problem, data))


def _ce(m: Any, b: Any, hp: Any) -> Tensor:
    return F.cross_entropy(m(b[0]), b[1])


def _weighted_ce(m: Any, b: Any, hp: Any) -> Tensor:
    """Cross-entropy with one weight per training example (``hp["weights"]``, indexed by the
    batch's example indices), summed and divided by the batch size."""
    x, y, idx = b
    w = hp["weights"][idx]
    return (w * F.cross_entropy(m(x), y, reduction="none")).sum() / len(idx)


def _mse(m: Any, b: Any, hp: Any) -> Tensor:
    return F.mse_loss(m(b[0]).squeeze(-1), b[1])


# -- the problems --------------------------------------------------------------------------------
@cache
def _digits(n_train: int = 600, n_val: int = 300, n_test: int = 400) -> Split:
    x, y = _sklearn("digits")
    return Split(x, y, n_train, n_val, n_test, regression=False)


@cache
def _wine() -> Split:
    x, y = _sklearn("wine")
    return Split(x, y, 90, 44, 44, regression=False)


@cache
def _cancer(n_train: int = 250) -> Split:
    x, y = _sklearn("breast_cancer")
    return Split(x, y, n_train, 150, 169, regression=False)


@cache
def _diabetes() -> Split:
    x, y = _sklearn("diabetes")
    return Split(x, y, 240, 100, 102, regression=True)


def digits_sgd_lr_wd(seed: int) -> SuiteTask:
    """MLP 64-32-10, plain SGD: a learning rate and one weight decay (K = 2)."""
    d = _digits()
    return _task(seed, d, lambda: _mlp([64, 32, 10]),
                 [hg.Scalar("lr", 0.05, "log"), hg.Scalar("wd", 1e-3, "log")],
                 hg.optim.sgd(lr="lr", weight_decay="wd"), _ce, 150, 64,
                 {"lr": (1e-3, 3.0), "wd": (1e-6, 1e-1)})


def wine_adam_small_batch(seed: int) -> SuiteTask:
    """MLP 13-16-3 on 90 wine examples, Adam with batches of 8: lr, beta1, L2 (K = 3)."""
    d = _wine()
    return _task(seed, d, lambda: _mlp([13, 16, 3]),
                 [hg.Scalar("lr", 1e-3, "log"), hg.Scalar("beta1", 0.9, "logit"),
                  hg.Scalar("wd", 1e-4, "log")],
                 hg.optim.adam(lr="lr", betas=("beta1", 0.999), weight_decay="wd"), _ce, 100, 8,
                 {"lr": (1e-4, 0.3), "beta1": (0.5, 0.99), "wd": (1e-6, 1e-1)})


def diabetes_momentum(seed: int) -> SuiteTask:
    """Regression, MLP 10-32-1, SGD with momentum: lr, momentum, weight decay (K = 3)."""
    d = _diabetes()
    return _task(seed, d, lambda: _mlp([10, 32, 1]),
                 [hg.Scalar("lr", 0.01, "log"), hg.Scalar("momentum", 0.5, "logit"),
                  hg.Scalar("wd", 1e-4, "log")],
                 hg.optim.sgd(lr="lr", momentum="momentum", weight_decay="wd"), _mse, 150, 32,
                 {"lr": (1e-4, 0.5), "momentum": (0.01, 0.99), "wd": (1e-6, 1.0)})


def cancer_imbalanced_class_weight(seed: int) -> SuiteTask:
    """Logistic regression on breast cancer, the malignant class cut to a fifth of its share in
    training (not in validation or test): lr, the malignant class's loss weight, L2 (K = 3)."""
    x, y = _sklearn("breast_cancer")
    d = Split(x, y, 200, 150, 169, regression=False,
              perm=_imbalanced_perm(y, minority=0, keep=0.2, n_train=200))

    def loss(m: Any, b: Any, hp: Any) -> Tensor:
        w = torch.where(b[1] == 0, hp["class_weight"], 1.0)  # class 0: malignant
        return (w * F.cross_entropy(m(b[0]), b[1], reduction="none")).sum() / w.sum()

    return _task(seed, d, lambda: nn.Linear(30, 2),
                 [hg.Scalar("lr", 0.1, "log"), hg.Scalar("class_weight", 1.0, "log"),
                  hg.Scalar("wd", 1e-3, "log")],
                 hg.optim.sgd(lr="lr", momentum=0.9, weight_decay="wd"), loss, 100, 32,
                 {"lr": (1e-3, 3.0), "class_weight": (0.1, 30.0), "wd": (1e-6, 1.0)})


def digits_adam_schedule(seed: int) -> SuiteTask:
    """MLP 64-32-10, Adam with a 4-window learning-rate schedule and a weight decay (K = 5)."""
    d = _digits()
    return _task(seed, d, lambda: _mlp([64, 32, 10]),
                 [hg.Schedule("lr", 1e-3, windows=4, transform="log"),
                  hg.Scalar("wd", 1e-4, "log")],
                 hg.optim.adam(lr="lr", weight_decay="wd"), _ce, 120, 32,
                 {"lr": (1e-5, 0.1), "wd": (1e-7, 1e-1)})


def synth_regression_schedule(seed: int) -> SuiteTask:
    """Synthetic nonlinear regression (20 features), MLP 20-32-1 with momentum: a 3-window lr
    schedule, the momentum and a weight decay per parameter tensor (K = 8)."""
    x, y = _synthetic_regression(900, 20, 6, 0.5, nonlinear=True)
    d = _cached("synth_reg", lambda: Split(x, y, 300, 200, 400, regression=True))
    return _task(seed, d, lambda: _mlp([20, 32, 1]),
                 [hg.Schedule("lr", 0.01, windows=3, transform="log"),
                  hg.Scalar("momentum", 0.9, "logit"), hg.PerTensor("wd", 1e-4, transform="log")],
                 hg.optim.sgd(lr="lr", momentum="momentum", weight_decay="wd"), _mse, 150, 32,
                 {"lr": (1e-4, 0.3), "momentum": (0.01, 0.99), "wd": (1e-6, 1.0)})


def digits_noisy_bn_adam(seed: int) -> SuiteTask:
    """A third of the training labels flipped, MLP 64-32-10 with BatchNorm, Adam: lr, weight
    decay, label smoothing (K = 3)."""
    d = _digits()
    y_noisy = _flip(d.y_train, 0.3, 10)

    def loss(m: Any, b: Any, hp: Any) -> Tensor:
        logp = F.log_softmax(m(b[0]), -1)
        s = hp["smoothing"]
        return (1 - s) * F.nll_loss(logp, b[1]) - s * logp.mean(-1).mean()

    return _task(seed, d, lambda: _mlp([64, 32, 10], bn=True),
                 [hg.Scalar("lr", 1e-3, "log"), hg.Scalar("wd", 1e-4, "log"),
                  hg.Scalar("smoothing", 0.05, "logit")],
                 hg.optim.adam(lr="lr", weight_decay="wd"), loss, 100, 32,
                 {"lr": (1e-4, 0.1), "wd": (1e-6, 1e-1), "smoothing": (0.001, 0.5)},
                 y_train=y_noisy)


def synth_classes_large_batch_adamw(seed: int) -> SuiteTask:
    """Synthetic 4-class data (20 features), MLP 20-32-4, AdamW with batches of 256: lr, weight
    decay, beta1, beta2 (K = 4)."""
    x, y = _synthetic_classes(1800, 20, 4, 0.6)
    d = _cached("synth_cls", lambda: Split(x, y, 1024, 300, 400, regression=False))
    return _task(seed, d, lambda: _mlp([20, 32, 4]),
                 [hg.Scalar("lr", 1e-3, "log"), hg.Scalar("wd", 1e-2, "log"),
                  hg.Scalar("beta1", 0.9, "logit"), hg.Scalar("beta2", 0.999, "logit")],
                 hg.optim.adamw(lr="lr", betas=("beta1", "beta2"), weight_decay="wd"), _ce,
                 80, 256,
                 {"lr": (1e-4, 0.3), "wd": (1e-5, 1.0), "beta1": (0.5, 0.99),
                  "beta2": (0.9, 0.9999)})


def wine_per_tensor_lr(seed: int) -> SuiteTask:
    """MLP 13-16-3 on wine with momentum: one learning rate per parameter tensor and the
    momentum (K = 5)."""
    d = _wine()
    return _task(seed, d, lambda: _mlp([13, 16, 3]),
                 [hg.PerTensor("lr", 0.01, transform="log"), hg.Scalar("momentum", 0.5, "logit")],
                 hg.optim.sgd(lr="lr", momentum="momentum"), _ce, 100, 16,
                 {"lr": (1e-4, 1.0), "momentum": (0.01, 0.99)})


def cancer_mlp_schedule(seed: int) -> SuiteTask:
    """MLP 30-16-2 on breast cancer, SGD with momentum: a 5-window lr schedule, the momentum and
    a weight decay per parameter tensor (K = 10)."""
    d = _cancer()
    return _task(seed, d, lambda: _mlp([30, 16, 2]),
                 [hg.Schedule("lr", 0.01, windows=5, transform="log"),
                  hg.Scalar("momentum", 0.5, "logit"), hg.PerTensor("wd", 1e-3, transform="log")],
                 hg.optim.sgd(lr="lr", momentum="momentum", weight_decay="wd"), _ce, 150, 32,
                 {"lr": (1e-4, 1.0), "momentum": (0.01, 0.99), "wd": (1e-6, 1.0)})


def diabetes_adamw_k14(seed: int) -> SuiteTask:
    """Regression, MLP 10-16-16-1, AdamW with batches of 16: a 6-window lr schedule, a weight
    decay per parameter tensor (6), beta1 and beta2 (K = 14)."""
    d = _diabetes()
    return _task(seed, d, lambda: _mlp([10, 16, 16, 1]),
                 [hg.Schedule("lr", 1e-3, windows=6, transform="log"),
                  hg.PerTensor("wd", 1e-2, transform="log"),
                  hg.Scalar("beta1", 0.9, "logit"), hg.Scalar("beta2", 0.999, "logit")],
                 hg.optim.adamw(lr="lr", betas=("beta1", "beta2"), weight_decay="wd"), _mse,
                 100, 16,
                 {"lr": (1e-5, 0.1), "wd": (1e-5, 10.0), "beta1": (0.5, 0.99),
                  "beta2": (0.9, 0.9999)})


def cancer_per_feature_l2_adam(seed: int) -> SuiteTask:
    """Logistic regression on 80 breast-cancer examples, Adam: one L2 per feature (K = 30)."""
    d = _cancer(80)

    def loss(m: Any, b: Any, hp: Any) -> Tensor:
        return F.cross_entropy(m(b[0]), b[1]) + (m.params["weight"] ** 2 * hp["l2"]).sum()

    return _task(seed, d, lambda: nn.Linear(30, 2),
                 [hg.Array("l2", 1e-3, shape=(30,), transform="log")],
                 hg.optim.adam(lr=0.05), loss, 100, 16, {"l2": (1e-6, 1.0)})


def synth_sparse_per_feature_l2(seed: int) -> SuiteTask:
    """Linear regression, 50 features of which 5 matter, 80 training examples, SGD with
    momentum: one L2 per feature (K = 50)."""
    x, y = _synthetic_regression(580, 50, 5, 1.0, nonlinear=False)
    d = _cached("synth_sparse", lambda: Split(x, y, 80, 100, 400, regression=True))

    def loss(m: Any, b: Any, hp: Any) -> Tensor:
        return _mse(m, b, hp) + (m.params["weight"] ** 2 * hp["l2"]).sum()

    return _task(seed, d, lambda: nn.Linear(50, 1),
                 [hg.Array("l2", 1e-2, shape=(50,), transform="log")],
                 hg.optim.sgd(lr=0.02, momentum=0.9), loss, 150, 16, {"l2": (1e-5, 10.0)})


def digits_per_pixel_l2(seed: int) -> SuiteTask:
    """Softmax regression on 300 digits, Adam: one L2 per input pixel (K = 64)."""
    d = _digits(300, 300, 400)

    def loss(m: Any, b: Any, hp: Any) -> Tensor:
        return _ce(m, b, hp) + (m.params["weight"] ** 2 * hp["l2"]).sum()

    return _task(seed, d, lambda: nn.Linear(64, 10),
                 [hg.Array("l2", 1e-3, shape=(64,), transform="log")],
                 hg.optim.adam(lr=0.03), loss, 100, 32, {"l2": (1e-6, 1.0)})


def digits_hypercleaning(seed: int) -> SuiteTask:
    """Data hyper-cleaning on 200 digits, 40% of the labels flipped, softmax regression with SGD:
    one weight per training example in [0, 1] (K = 200)."""
    d = _digits(200, 300, 400)
    y_noisy = _flip(d.y_train, 0.4, 10)

    return _task(seed, d, lambda: nn.Linear(64, 10),
                 [hg.PerExample("weights", 0.5, n=200, transform="logit")],
                 hg.optim.sgd(lr=0.3), _weighted_ce, 100, 50, {"weights": (0.001, 0.999)},
                 y_train=y_noisy)


def wine_per_example_imbalanced(seed: int) -> SuiteTask:
    """Wine with class 1 cut to a fifth of its share in training and a fifth of the labels
    flipped, MLP 13-8-3 with momentum: one weight per training example (K = 90)."""
    x, y = _sklearn("wine")
    d = Split(x, y, 90, 44, 44, regression=False,
              perm=_imbalanced_perm(y, minority=1, keep=0.2, n_train=90))
    y_noisy = _flip(d.y_train, 0.2, 3)

    return _task(seed, d, lambda: _mlp([13, 8, 3]),
                 [hg.PerExample("weights", 0.5, n=90, transform="logit")],
                 hg.optim.sgd(lr=0.05, momentum=0.9), _weighted_ce, 100, 15,
                 {"weights": (0.001, 0.999)}, y_train=y_noisy)


def synth_per_example_noise_adam(seed: int) -> SuiteTask:
    """Synthetic 3-class data, 30% of 300 training labels flipped, MLP 10-16-3, Adam: one weight
    per training example (K = 300)."""
    x, y = _synthetic_classes(1000, 10, 3, 0.8)
    d = _cached("synth_noise", lambda: Split(x, y, 300, 300, 400, regression=False))
    y_noisy = _flip(d.y_train, 0.3, 3)

    return _task(seed, d, lambda: _mlp([10, 16, 3]),
                 [hg.PerExample("weights", 0.5, n=300, transform="logit")],
                 hg.optim.adam(lr=0.01), _weighted_ce, 100, 30, {"weights": (0.001, 0.999)},
                 y_train=y_noisy)


_CACHE: dict[str, Split] = {}


def _cached(key: str, make: Callable[[], Split]) -> Split:
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def _p(fn: Callable[[int], SuiteTask], K: int, task: str, note: str) -> SuiteProblem:
    return SuiteProblem(fn.__name__, K, task, note, fn)


PROBLEMS: dict[str, SuiteProblem] = {p.name: p for p in [
    _p(digits_sgd_lr_wd, 2, "classification", "SGD; lr, wd"),
    _p(wine_adam_small_batch, 3, "classification", "Adam, batch 8; lr, beta1, L2"),
    _p(diabetes_momentum, 3, "regression", "momentum; lr, momentum, wd"),
    _p(cancer_imbalanced_class_weight, 3, "classification",
       "class imbalance; lr, class weight (loss), L2"),
    _p(digits_adam_schedule, 5, "classification", "Adam; 4-window lr schedule, wd"),
    _p(synth_regression_schedule, 8, "regression",
       "synthetic; momentum; 3-window schedule, momentum, per-tensor wd"),
    _p(digits_noisy_bn_adam, 3, "classification",
       "30% label noise, BatchNorm, Adam; lr, wd, label smoothing"),
    _p(synth_classes_large_batch_adamw, 4, "classification",
       "synthetic, batch 256, AdamW; lr, wd, beta1, beta2"),
    _p(wine_per_tensor_lr, 5, "classification", "momentum; per-tensor lr, momentum"),
    _p(cancer_mlp_schedule, 10, "classification",
       "momentum; 5-window schedule, momentum, per-tensor wd"),
    _p(diabetes_adamw_k14, 14, "regression",
       "AdamW, batch 16; 6-window schedule, per-tensor wd, beta1, beta2"),
    _p(cancer_per_feature_l2_adam, 30, "classification", "Adam; per-feature L2"),
    _p(synth_sparse_per_feature_l2, 50, "regression", "synthetic sparse; per-feature L2"),
    _p(digits_per_pixel_l2, 64, "classification", "Adam; per-pixel L2"),
    _p(digits_hypercleaning, 200, "classification", "40% label noise; per-example weights"),
    _p(wine_per_example_imbalanced, 90, "classification",
       "imbalance + 20% label noise, momentum; per-example weights"),
    _p(synth_per_example_noise_adam, 300, "classification",
       "synthetic, 30% label noise, Adam; per-example weights"),
]}


def build(name: str, seed: int, select: bool = False) -> SuiteTask:
    """Problem ``name`` at tuning (or retraining) seed ``seed``; ``select``: for the Trainer,
    with its validation split cut in two (:data:`SELECT_SHARE`)."""
    global _select
    _select = select
    try:
        task = PROBLEMS[name].make(seed)
    finally:
        _select = False
    k = task.problem.num_hyperparams
    if k != PROBLEMS[name].K:
        raise RuntimeError(f"suite: {name} has K = {k}, listed as {PROBLEMS[name].K}")
    missing = set(task.problem.hyperparams.names) - set(task.bounds)
    if missing:
        raise RuntimeError(f"suite: {name} states no bounds for {sorted(missing)}")
    return task


def make_split(seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """The development / evaluation split drawn by ``seed``, stratified by K <= LOW_K."""
    rng = random.Random(seed)
    dev: list[str] = []
    ev: list[str] = []
    for low in (True, False):
        names = sorted(n for n, p in PROBLEMS.items() if (p.K <= LOW_K) == low)
        rng.shuffle(names)
        half = math.ceil(len(names) / 2) if low else len(names) // 2
        dev += sorted(names[:half])
        ev += sorted(names[half:])
    return {"dev": sorted(dev), "eval": sorted(ev)}


def split_hash(split: dict[str, list[str]]) -> str:
    """SHA-256 of the split's canonical JSON."""
    return hashlib.sha256(json.dumps(split, sort_keys=True).encode()).hexdigest()


SPLIT: dict[str, list[str]] = {  # make_split(SPLIT_SEED), committed before any default changed
    "dev": ["cancer_imbalanced_class_weight", "cancer_per_feature_l2_adam", "diabetes_adamw_k14",
            "diabetes_momentum", "digits_hypercleaning", "digits_noisy_bn_adam",
            "digits_sgd_lr_wd", "synth_sparse_per_feature_l2", "wine_adam_small_batch"],
    "eval": ["cancer_mlp_schedule", "digits_adam_schedule", "digits_per_pixel_l2",
             "synth_classes_large_batch_adamw", "synth_per_example_noise_adam",
             "synth_regression_schedule", "wine_per_example_imbalanced", "wine_per_tensor_lr"],
}
SPLIT_HASH = "a791dd6bd2017d6c7acfe24334d05b34fa46199321be4f2d247665ecb4630777"


def main() -> None:
    print(f"{'problem':<34}{'K':>4}  {'half':<5} {'kind':<15} note")
    half = {n: h for h, ns in SPLIT.items() for n in ns}
    for name, p in PROBLEMS.items():
        print(f"{name:<34}{p.K:>4}  {half.get(name, '?'):<5} {p.task:<15} {p.note}")
    print(f"split seed {SPLIT_SEED}, hash {SPLIT_HASH}")


if __name__ == "__main__":
    main()
