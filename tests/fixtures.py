"""The small problems the tests share (float64, a few steps, seconds at most).

- :func:`digits_case` (from :mod:`hypergrad.testing`) with the sizes :data:`TINY` / :data:`SMALL`:
  an MLP on ``load_digits`` with one optimizer and one hyperparameter kind;
- :func:`mixed_problem`: a schedule beside a momentum, a per-tensor weight decay and a loss
  parameter, for any optimizer of the exactness grid;
- :func:`closed_form_problem`: the rows of :data:`CLOSED_FORM` (closed-form tangent checks);
- :func:`model_problem`: models users bring (dropout, BatchNorm, attention, RNNs, a ResNet);
- :func:`small_cnn_problem`: a convolution, for the compile path;
- :func:`one_hvp_call`: one HVP strategy call at a state with non-zero tangents;
- :func:`lr_momentum`: a learning rate and a momentum (K = 2), for the Trainer's outer loops;
- :func:`unit_clock`: a Trainer on a fake clock (a plain run 1, a hypergradient 5);
- :func:`layered_problem` and :func:`train_like_torch`: a Linear-LayerNorm-Linear model whose
  parameters differ by layer and kind (per-parameter and per-group values), and the plain torch
  loop over the same batches that its runs must equal;
- :func:`configs_block` and :func:`run_cli`: a command of docs/configs.md, run as the page gives
  it (shortened by ``debug=fast``).
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import hypergrad as hg
from hypergrad.data import MiniBatches
from hypergrad.hvp import HVPStrategy
from hypergrad.tasks.models import RNNClassifier, TransformerClassifier, resnet18
from hypergrad.testing import GRID, digits_case

TINY = dict(n_train=24, batch_size=8, hidden=8, n_val=32)
"""Sizes of :func:`digits_case` without the horizon."""
SMALL = dict(steps=6, windows=3, **TINY)
"""Sizes of :func:`digits_case` with a horizon of 6 and 3 schedule windows."""


def mixed_problem(opt: str, steps: int, windows: int, batchnorm: bool = False,
                   seed: int = 0) -> hg.InnerProblem:
    """A schedule next to other kinds: an lr schedule, a momentum (beta1) scalar except for plain
    sgd, a per-tensor weight decay and a loss parameter."""
    base = digits_case("momentum", "lr", steps=steps, batchnorm=batchnorm, seed=seed, **TINY)
    row = GRID[opt]
    items: list[Any] = [hg.Schedule("lr", row.lr0 / 2, windows=windows, transform="log")]
    args = {**row.constants, "lr": "lr", "weight_decay": "wd"}
    if row.momentum is not None:
        items.append(hg.Scalar("mom", 0.8, transform="logit"))
        args.update(row.momentum("mom"))
    items += [hg.PerTensor("wd", 1e-2, transform="log"),
              hg.Array("smooth", 0.1, transform="logit")]
    optimizer = row.factory(**args)

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        x, y, idx = batch
        logp = F.log_softmax(m(x), -1)
        return (1 - hp["smooth"]) * F.nll_loss(logp, y) - hp["smooth"] * logp.mean()

    return hg.InnerProblem(base.fmodel.module, train_loss, optimizer, hg.HyperParams(items),
                           base.batch, steps, base.val_loss)



CLOSED_FORM: dict[str, tuple[str, dict[str, Any], list[Any], float]] = {
    # name: (factory in hypergrad.optim, arguments, extra hyperparameters, initial lr)
    "sgd_plain": ("sgd", dict(lr="lr"), [], 0.05),
    "sgd_wd_const": ("sgd", dict(lr="lr", weight_decay=1e-2), [], 0.05),
    "sgd_momentum_wd": ("sgd", dict(lr="lr", momentum="mom", weight_decay="wd"),
                        [hg.Scalar("mom", 0.8, transform="logit"),
                         hg.PerTensor("wd", 1e-2, transform="log")], 0.05),
    "sgd_dampening": ("sgd", dict(lr="lr", momentum=0.9, dampening="damp", weight_decay="wd"),
                      [hg.Scalar("damp", 0.3, transform="logit"), hg.Scalar("wd", 1e-2)], 0.05),
    "sgd_dampening_const": ("sgd", dict(lr="lr", momentum="mom", dampening=0.25),
                            [hg.Scalar("mom", 0.7)], 0.05),
    "sgd_nesterov": ("sgd", dict(lr="lr", momentum="mom", nesterov=True, weight_decay="wd"),
                     [hg.Scalar("mom", 0.8, transform="logit"), hg.Scalar("wd", 1e-2)], 0.05),
    "sgd_nesterov_damp": ("sgd", dict(lr="lr", momentum="mom", nesterov=True, dampening="damp"),
                          [hg.Scalar("mom", 0.8), hg.Scalar("damp", 0.2)], 0.05),
    "adam_plain": ("adam", dict(lr="lr"), [], 0.01),
    "adam_l2_const": ("adam", dict(lr="lr", weight_decay=1e-2), [], 0.01),
    "adam_all_bound": ("adam", dict(lr="lr", betas=("b1", "b2"), eps="eps", weight_decay="wd"),
                       [hg.Scalar("b1", 0.8, transform="logit"),
                        hg.Scalar("b2", 0.99, transform="logit"),
                        hg.Scalar("eps", 1e-3, transform="log"),
                        hg.PerTensor("wd", 1e-2, transform="log")], 0.01),
    "adam_eps_root": ("adam", dict(lr="lr", betas=(0.9, "b2"), eps_root=1e-8),
                      [hg.Scalar("b2", 0.95, transform="logit")], 0.01),
    "adamw_const": ("adamw", dict(lr="lr", weight_decay=0.1), [], 0.01),
    "adamw_all_bound": ("adamw", dict(lr="lr", betas=("b1", "b2"), eps="eps",
                                      weight_decay="wd"),
                        [hg.Scalar("b1", 0.8, transform="logit"),
                         hg.Scalar("b2", 0.99, transform="logit"),
                         hg.Scalar("eps", 1e-3, transform="log"),
                         hg.Scalar("wd", 0.1, transform="log")], 0.01),
    "rmsprop_plain": ("rmsprop", dict(lr="lr"), [], 0.01),
    "rmsprop_all_bound": ("rmsprop", dict(lr="lr", alpha="alpha", eps="eps", weight_decay="wd",
                                          momentum="mom"),
                          [hg.Scalar("alpha", 0.9, transform="logit"),
                           hg.Scalar("eps", 1e-3, transform="log"),
                           hg.PerTensor("wd", 1e-2, transform="log"),
                           hg.Scalar("mom", 0.5, transform="logit")], 0.01),
    "rmsprop_centered": ("rmsprop", dict(lr="lr", alpha="alpha", centered=True, momentum=0.9,
                                         weight_decay=1e-2),
                         [hg.Scalar("alpha", 0.9, transform="logit")], 0.01),
    "rmsprop_centered_eps": ("rmsprop", dict(lr="lr", eps="eps", centered=True),
                             [hg.Scalar("eps", 1e-3, transform="log")], 0.01),
    "adagrad_plain": ("adagrad", dict(lr="lr"), [], 0.05),
    "adagrad_all_bound": ("adagrad", dict(lr="lr", lr_decay="decay", eps="eps",
                                          weight_decay="wd"),
                          [hg.Scalar("decay", 0.1, transform="log"),
                           hg.Scalar("eps", 1e-3, transform="log"),
                           hg.PerTensor("wd", 1e-2, transform="log")], 0.05),
    "adagrad_accumulator": ("adagrad", dict(lr="lr", initial_accumulator_value=0.1), [], 0.05),
}
"""Closed-form tangents checked against jvp: every argument constant or bound; a new optimizer
with a closed form adds rows."""

G_UNTOUCHED = {"adam_plain", "adam_eps_root", "adamw_const", "adamw_all_bound", "rmsprop_plain",
               "rmsprop_centered_eps", "adagrad_plain", "adagrad_accumulator"}
"""Configurations whose closed form must leave this step's ``G`` alone (no L2 decay reusing its
buffer)."""


def closed_form_problem(config: str, lr_kind: str, steps: int = 6) -> hg.InnerProblem:
    ctor, kwargs, extra, lr0 = CLOSED_FORM[config]
    base = digits_case("momentum", "lr", steps=steps, **TINY)
    lr = (hg.Schedule("lr", lr0, windows=3, transform="log") if lr_kind == "schedule"
          else hg.PerTensor("lr", lr0, transform="log"))
    opt = getattr(hg.optim, ctor)(**kwargs)
    return hg.InnerProblem(base.fmodel.module, base.train_loss, opt,
                           hg.HyperParams([lr, *extra]), base.batch, steps, base.val_loss)



class SDPABlock(nn.Module):
    """A hand-written attention layer calling F.scaled_dot_product_attention directly."""

    def __init__(self, d: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.qkv = nn.Linear(4, 3 * d)
        self.out = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, -1)).permute(2, 0, 3, 1, 4)
        h = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2 if self.training else 0.0)
        return self.out(h.transpose(1, 2).flatten(2).mean(1))


def model_for(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    if name == "dropout_bn_mlp":
        return nn.Sequential(nn.Linear(8, 12), nn.BatchNorm1d(12), nn.Tanh(), nn.Dropout(0.2),
                             nn.Linear(12, 3)), (8,)
    if name == "dropout_mlp":
        return nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Dropout(0.3), nn.Linear(12, 3)), (8,)
    if name in ("transformer", "transformer_dropout"):
        return TransformerClassifier(d_model=8, nhead=2, layers=2, dim_feedforward=12,
                                     num_classes=3, in_features=4,
                                     dropout=0.1 if name.endswith("dropout") else 0.0), (5, 4)
    if name == "sdpa":
        return SDPABlock(), (5, 4)
    if name in ("lstm", "gru"):
        return RNNClassifier(4, 6, 3, cell=name), (5, 4)
    if name in ("resnet", "resnet_eval_bn"):
        m = resnet18(num_classes=3, width=2)
        if name == "resnet_eval_bn":
            m.layer1.eval()  # frozen statistics in the first stage
        return m, (3, 16, 16)
    raise ValueError(name)


def model_problem(name: str, steps: int = 4, noise: bool = False) -> hg.InnerProblem:
    model, shape = model_for(name)
    model = model.to(torch.float64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (24,), generator=g)
    hps = hg.HyperParams([hg.Schedule("lr", 0.05, windows=2, transform="log"),
                          hg.Scalar("mom", 0.5, transform="logit"),
                          hg.Scalar("wd", 1e-3, transform="log")])

    def train_loss(m, batch, hp):  # type: ignore[no-untyped-def]
        xb, yb, _ = batch
        if noise:  # a user's own random op: input noise from torch's default generator
            xb = xb + 0.1 * torch.randn_like(xb)
        return F.cross_entropy(m(xb), yb)

    def val_loss(m, hp):  # type: ignore[no-untyped-def]
        return F.cross_entropy(m(x[:8]), y[:8])

    opt = hg.optim.sgd(lr="lr", momentum="mom", weight_decay="wd")
    return hg.InnerProblem(model, train_loss, opt,
                           hps, MiniBatches(x, y, batch_size=8), steps, val_loss)


MODELS = ["dropout_bn_mlp", "dropout_mlp", "transformer", "transformer_dropout", "sdpa", "lstm",
          "gru", "resnet", "resnet_eval_bn"]
"""The names :func:`model_problem` knows."""


def small_cnn_problem() -> hg.InnerProblem:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(2 * 4 * 4, 3)).double()
    x = torch.randn(8, 1, 4, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (8,))
    return hg.InnerProblem(
        model, lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
        hg.optim.sgd(lr="lr", momentum="mom"),
        hg.HyperParams([hg.Scalar("lr", 0.1, transform="log"),
                                                       hg.Scalar("mom", 0.9)]),
        MiniBatches(x, y, batch_size=4), 2, lambda m, hp: F.cross_entropy(m(x), y))



def one_hvp_call(problem: hg.InnerProblem, strategy: HVPStrategy) -> tuple:
    """One HVP call at a state with non-zero tangents."""
    lam = problem.init_raw()
    fm = hg.ForwardMode()
    fs = fm.run(problem, fm.init(problem, lam), lam, stop=2)
    batch = problem.batch(2)

    def f(p, b, lm):  # type: ignore[no-untyped-def]
        return problem.train_objective(p, b, lm, 2, batch)

    eye = torch.eye(lam.shape[0], dtype=lam.dtype, device=lam.device)
    s, z = fs.state, fs.tangents
    return f, s, z, lam, eye, strategy(f, s.params, s.buffers, lam, z.params, z.buffers, eye)




class Interrupt(Exception):
    """Raised by :func:`interrupt_after`'s evaluate hook: a run killed between outer steps."""


def interrupt_after(n: int):  # type: ignore[no-untyped-def]
    """A Trainer ``evaluate`` hook that raises :class:`Interrupt` on its ``n + 1``-th call."""
    calls = [0]

    def evaluate(state):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] > n:
            raise Interrupt
        return {}

    return evaluate


def make_trainer(problem: Any, method: Any = "forward", outer: Any = None, *,
                 outer_steps: int = 10, mode: str = "offline", interval: int = 10,
                 reset_tangents: bool = False, run_dir: Any = None, resume: bool = False,
                 overwrite: bool = False, fingerprint: Any = None, evaluate: Any = None,
                 log: Any = None, progress: bool = False, tensorboard: bool = False,
                 **guards: Any) -> hg.Trainer:
    """A Trainer from flat settings, each given to the part that owns it: ``outer_steps`` to
    :class:`~hypergrad.Offline` (``mode="online"``: ``interval`` and ``reset_tangents`` to
    :class:`~hypergrad.Online`), ``run_dir``/``resume``/``overwrite`` to a
    :class:`~hypergrad.RunFolder`, ``evaluate`` to a :class:`~hypergrad.Task`, ``log``,
    ``progress`` and ``tensorboard`` to callbacks, the rest to :class:`~hypergrad.Guards`.
    Messages are dropped unless ``log`` is given."""
    from hypergrad.run import Log, Progress, TensorBoard

    task = hg.Task(problem, evaluate=evaluate) if evaluate is not None else problem
    if outer is None:  # the outer optimizer these tests of guards, folders and resume were
        # written for (the Trainer's default before issue 27; now QuasiNewton, test_defaults.py)
        outer = functools.partial(torch.optim.Adam, lr=0.05)
    m = hg.Online(interval, reset_tangents) if mode == "online" else hg.Offline(outer_steps)
    folder = (None if run_dir is None else
              hg.RunFolder(run_dir, resume=resume, overwrite=overwrite, fingerprint=fingerprint))
    cbs: list[Any] = [Log(log), Progress(progress)]
    if tensorboard:
        cbs.append(TensorBoard())
    return hg.Trainer(task, method, outer, m, hg.Guards(**guards), folder, cbs)


def lr_momentum(steps: int = 8, lr: float = 0.02) -> hg.InnerProblem:
    """A float64 MLP on 32 digits, SGD: a learning rate (log, starting at ``lr``) and a
    momentum (logit), K = 2."""
    from hypergrad.tasks import digits_data, mlp

    torch.manual_seed(0)
    data = digits_data(n_train=32, n_val=32, n_test=32, dtype=torch.float64)

    def loss(m: Any, b: Any, hp: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    return hg.InnerProblem(
        mlp([64, 8, 10]).double(), loss, hg.optim.sgd(lr="lr", momentum="momentum"),
        hg.HyperParams([hg.Scalar("lr", lr, "log"), hg.Scalar("momentum", 0.5, "logit")]),
        MiniBatches(data.x_train, data.y_train, batch_size=8), steps,
        lambda m, hp: torch.nn.functional.cross_entropy(m(data.x_val), data.y_val))


def unit_clock(trainer: hg.Trainer, plain: float = 1.0, hypergradient: float = 5.0
               ) -> list[float]:
    """Put ``trainer`` on a fake clock where each plain inner run of its problem costs
    ``plain`` and each hypergradient ``hypergradient`` (the suite's ratio); returns the clock
    (a one-element list) the Trainer's budget now reads."""
    clock = [0.0]
    p, m = trainer.problem, trainer.method
    run, grad = p.run, m.hypergradient

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        clock[0] += plain
        return run(*args, **kwargs)

    def timed_hypergradient(*args: Any, **kwargs: Any) -> Any:
        clock[0] += hypergradient
        return grad(*args, **kwargs)

    p.run = timed_run  # type: ignore[method-assign]
    m.hypergradient = timed_hypergradient  # type: ignore[method-assign]
    trainer._now = lambda: clock[0]  # type: ignore[method-assign]
    return clock


def rank_env(nprocs: int) -> dict[str, str]:
    """Environment for ``nprocs`` ranks started on this machine: on the CPU (gloo, the tests'
    problems there too) unless it has a GPU for every rank (NCCL takes one rank per GPU)."""
    if torch.cuda.device_count() >= nprocs:
        return {}
    return {"CUDA_VISIBLE_DEVICES": "", "HYPERGRAD_TEST_DEVICE": "cpu"}



def free_port() -> int:
    """A free TCP port on this machine (for a process group's MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(script: Path, n: int, *args: str, timeout: float = 120.0
              ) -> list[tuple[int | None, str]]:
    """``n`` ranks of ``script`` (``python script *args``) with torchrun's environment; waits
    up to ``timeout`` seconds (then kills what still runs); each rank's (status, output)."""
    port, procs = str(free_port()), []
    root = Path(__file__).resolve().parents[1]
    for r in range(n):
        env = {**os.environ, **rank_env(n), "RANK": str(r), "LOCAL_RANK": str(r),
               "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen([sys.executable, str(script), *args], cwd=root, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    t0 = time.perf_counter()
    while any(p.poll() is None for p in procs) and time.perf_counter() - t0 < timeout:
        time.sleep(0.05)
    out = []
    for p in procs:
        rc = p.poll()
        if rc is None:
            p.kill()
        out.append((rc, p.communicate()[0]))
    return out


class Cube(torch.autograd.Function):
    """``x ** 3`` as a custom autograd Function written for torch.func (``setup_context``, a
    vmap rule, a jvp): its forward runs under no_grad, its output is connected."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * x * x

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x * x * g

    @staticmethod
    def jvp(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x * x * t


def sparse_hps(groups: int = 4, fgroups: int = 3) -> hg.HyperParams:
    """The sparse regression task's hyperparameters: a weight per residual group, an L2 per
    feature group."""
    return hg.HyperParams([hg.Array("res_w", 0.5, shape=(groups,), transform="logit"),
                           hg.Array("l2", 1e-2, shape=(fgroups,), transform="log")])


def sparse_task(optimizer: Any, **args: Any) -> Any:
    """``sparse_regression_task`` with :func:`sparse_hps` shaped by its ``groups`` and
    ``feature_groups``."""
    from hypergrad.tasks.sparse_regression import sparse_regression_task

    return sparse_regression_task(sparse_hps(args["groups"], args["feature_groups"]),
                                  optimizer, **args)


def layered_model() -> nn.Module:
    """``Linear(5, 7) - LayerNorm - Tanh - Linear(7, 3)`` in float64, seeded: parameters
    ``0.*``, ``1.*`` (the norm's), ``3.*``, weights and biases."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.Tanh(), nn.Linear(7, 3)).double()


def layered_problem(optimizer: hg.optim.Optimizer, hps: Any, steps: int = 10
                    ) -> hg.InnerProblem:
    """Cross-entropy on 48 generated examples, batches of 12, :func:`layered_model`; ``hps`` a
    HyperParams or a list of items."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (48,), generator=g)
    if not isinstance(hps, hg.HyperParams):
        hps = hg.HyperParams(hps)
    return hg.InnerProblem(layered_model(), lambda m, b, hp: F.cross_entropy(m(b[0]), b[1]),
                           optimizer, hps, MiniBatches(x, y, batch_size=12, seed=0), steps,
                           lambda m, hp: F.cross_entropy(m(x), y))


def train_like_torch(problem: hg.InnerProblem, model: nn.Module, optimizer: Any,
                     scheduler: Any = None) -> nn.Module:
    """The plain torch loop over ``problem``'s batches (cross-entropy, ``zero_grad``,
    ``backward``, ``step``, the scheduler's step), the problem's ``steps`` times."""
    for t in range(problem.steps):
        xb, yb, *_ = problem.batch(t)
        optimizer.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return model


def assert_trained_as(model: nn.Module, state: Any) -> None:
    """``model``'s parameters equal the run's ``state`` (float64: 1e-12)."""
    for n, w in model.named_parameters():
        torch.testing.assert_close(w, state.params[n], rtol=1e-12, atol=1e-14)


CONFIGS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "configs.md"


def configs_block(needle: str, lang: str = "bash") -> str:
    """The first fenced ``lang`` block of docs/configs.md that holds ``needle``."""
    import re

    page = CONFIGS_PAGE.read_text()
    return next(b for b in re.findall(rf"```{lang}\n(.*?)```", page, re.S) if needle in b)


def run_cli(command: str, run_dir: Path, cwd: Path | None = None) -> None:
    """Run a ``hypergrad-run ...`` line of the docs (continuation lines joined) with
    ``debug=fast`` into ``run_dir``; it must exit 0."""
    import shlex

    args = shlex.split(command.replace("\\\n", " "))
    assert args[0] == "hypergrad-run", command
    out = subprocess.run([sys.executable, "-m", "hypergrad.cli", *args[1:], "debug=fast",
                          f"hydra.run.dir={run_dir}"], capture_output=True, text=True,
                         timeout=600, cwd=cwd or run_dir)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def tiny_lm(dtype: str = "float64", steps: int = 4, clip: float | None = 1.0) -> Any:
    """A character LM task small enough for a test: d_model 8, two heads, dropout 0.1, AdamW
    clipped at ``clip`` over a 2-window schedule, a weight decay per layer group and the
    betas."""
    from hypergrad.tasks.charlm import LAYER_GROUPS, PerGroup, charlm_task, transformer_factory

    hps = hg.HyperParams([hg.Schedule("lr", 3e-3, windows=2, transform="log"),
                          PerGroup("wd", 0.01, "log", groups=LAYER_GROUPS),
                          hg.Scalar("b1", 0.9, transform="logit"),
                          hg.Scalar("b2", 0.99, transform="logit")])
    opt = hg.optim.adamw(lr="lr", betas=("b1", "b2"), weight_decay="wd", clip_grad_norm=clip)
    return charlm_task(hps, opt, transformer_factory(d_model=8, n_heads=2, dropout=0.1),
                       steps=steps, batch_size=2, context=8, train_chars=20_000,
                       val_chars=2_000, test_chars=2_000, val_windows=4, eval_windows=8,
                       dtype=dtype)
