"""Typed Hydra config schemas and :func:`build`, the one place configs become objects.

Every YAML option under ``configs/<group>/`` extends one of the dataclasses here (registered in
Hydra's ConfigStore as ``<group>/schema_<name>``), so a misspelt key or a value of the wrong type
fails at composition with the key named. Library classes never see a ``DictConfig``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate
from omegaconf import MISSING, DictConfig, OmegaConf

from .distributed import DistributedConf
from .hyperparams import (
    HyperParameter,
    HyperParams,
    PerExample,
    PerTensor,
    Scalar,
    Schedule,
    Tensor_,
)

__all__ = ["build", "make_hyperparams", "register_configs", "config_fingerprint", "CONFIG_DIR",
           "SAFE_CONFIG_KEYS"]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


# -- hyperparameters ---------------------------------------------------------------------------
class Kind(enum.Enum):
    scalar = "scalar"
    per_tensor = "per_tensor"
    schedule = "schedule"
    per_example = "per_example"
    tensor = "tensor"


@dataclass
class HPSpec:
    kind: Kind = Kind.scalar
    init: Any = MISSING  # a number, or a list for schedules / tensors
    transform: str = "identity"
    windows: int = 1  # schedule
    params: Optional[list[str]] = None  # per_tensor: None = every trainable tensor
    default: Optional[float] = None  # per_tensor: value of unlisted tensors
    n: int = 0  # per_example: number of training examples
    shape: Optional[list[int]] = None  # tensor


@dataclass
class HyperParamsConf:
    _target_: str = "hypergrad.config.make_hyperparams"
    items: dict[str, HPSpec] = field(default_factory=dict)


def make_hyperparams(items: dict[str, Any]) -> HyperParams:
    """``{name: {kind, init, transform, ...}}`` -> :class:`HyperParams`."""
    out: list[HyperParameter] = []
    for name, spec in items.items():
        kind = spec["kind"].value if isinstance(spec["kind"], Kind) else str(spec["kind"])
        common = dict(name=name, init=spec["init"], transform=spec.get("transform", "identity"))
        if kind == "scalar":
            out.append(Scalar(**common))
        elif kind == "schedule":
            out.append(Schedule(**common, windows=int(spec["windows"])))
        elif kind == "per_tensor":
            out.append(PerTensor(**common, params=spec.get("params"), default=spec.get("default")))
        elif kind == "per_example":
            out.append(PerExample(**common, n=int(spec["n"])))
        elif kind == "tensor":
            out.append(Tensor_(name, spec["init"], spec.get("shape"), common["transform"]))
        else:
            raise ValueError(f"make_hyperparams: {name}.kind={kind!r} is not a kind; choose from "
                             f"{[k.value for k in Kind]}.")
    return HyperParams(out)


# -- models, optimizers, methods -----------------------------------------------------------------
@dataclass
class MLPConf:
    _target_: str = "hypergrad.problems.tasks.mlp_factory"
    hidden: list[int] = field(default_factory=lambda: [64])
    activation: str = "tanh"
    batchnorm: bool = False


@dataclass
class CNNConf:
    _target_: str = "hypergrad.problems.tasks.cnn_factory"
    channels: list[int] = field(default_factory=lambda: [8, 16])
    activation: str = "relu"


@dataclass
class LinearConf:
    _target_: str = "hypergrad.problems.tasks.linear_factory"
    bias: bool = True


@dataclass
class SGDConf:
    _target_: str = "hypergrad.optim.sgd"
    lr: Any = "lr"  # a number, or the name of a hyperparameter
    momentum: Any = 0.0
    dampening: Any = 0.0
    nesterov: bool = False
    weight_decay: Any = 0.0


@dataclass
class AdamConf:
    _target_: str = "hypergrad.optim.adam"
    lr: Any = "lr"
    betas: list[Any] = field(default_factory=lambda: [0.9, 0.999])
    eps: Any = 1e-8
    weight_decay: Any = 0.0
    eps_root: float = 0.0


@dataclass
class AdamWConf(AdamConf):
    _target_: str = "hypergrad.optim.adamw"
    weight_decay: Any = 1e-2


@dataclass
class TorchOuterConf:
    _target_: str = "torch.optim.Adam"
    _partial_: bool = True
    lr: float = 0.05


@dataclass
class SignOuterConf:
    _target_: str = "hypergrad.outer.SignDescent"
    _partial_: bool = True
    lr: float = 0.1
    factor: float = 0.5


class MethodName(enum.Enum):
    forward = "forward"
    reverse = "reverse"
    auto = "auto"


class HVPName(enum.Enum):
    vmap_vjp = "vmap_vjp"
    is_grads_batched = "is_grads_batched"
    fwd_over_rev = "fwd_over_rev"
    loop = "loop"


@dataclass
class MethodConf:
    _target_: str = "hypergrad.choice.make_method"
    name: MethodName = MethodName.forward
    hvp: HVPName = HVPName.vmap_vjp
    chunk_size: Optional[int] = None
    memory_budget_gb: Optional[float] = None
    compile: bool = False


# -- problems ------------------------------------------------------------------------------------
@dataclass
class DigitsConf:
    _target_: str = "hypergrad.problems.tasks.digits_task"
    steps: int = 300
    n_train: int = 1000
    n_val: int = 400
    batch_size: int = 64
    seed: int = "${seed}"  # type: ignore[assignment]
    dtype: str = "float32"
    val_mode: str = "eval"
    grid: dict[str, list[float]] = field(default_factory=dict)
    data_seed: Optional[int] = None  # the split; None: seed (init and batch order)


@dataclass
class HypercleaningConf:
    _target_: str = "hypergrad.problems.tasks.hypercleaning_task"
    steps: int = 100
    n_train: int = 500
    n_val: int = 200
    flip_fraction: float = 0.5
    seed: int = "${seed}"  # type: ignore[assignment]
    dtype: str = "float32"
    weights: str = "weights"
    threshold: float = 0.5
    data_seed: Optional[int] = None  # the split and the flipped labels; None: seed


@dataclass
class RidgeDiabetesConf:
    _target_: str = "hypergrad.problems.tasks.ridge_diabetes_task"
    steps: int = 3000
    n_train: int = 250
    n_val: int = 100
    seed: int = "${seed}"  # type: ignore[assignment]
    dtype: str = "float64"
    l2_name: str = "l2"


@dataclass
class BreastCancerConf:
    _target_: str = "hypergrad.problems.tasks.breast_cancer_task"
    steps: int = 200
    n_train: int = 300
    n_val: int = 130
    seed: int = "${seed}"  # type: ignore[assignment]
    dtype: str = "float32"
    l2_name: str = "l2"
    batch_size: Optional[int] = None
    data_seed: Optional[int] = None  # the split; None: seed (initialisation)


@dataclass
class SparseRegressionConf:
    _target_: str = "hypergrad.problems.sparse_regression.sparse_regression_task"
    steps: int = 100
    m: int = 20000
    m_val: int = 4000
    n: int = 2000
    density: float = 0.005
    groups: int = 10
    corrupted: int = 3
    feature_groups: int = 4
    mask_fraction: float = 0.0
    corruption: float = 3.0
    seed: int = "${seed}"  # type: ignore[assignment]
    dtype: str = "float32"
    weights: str = "res_w"
    l2: str = "l2"
    data_path: Optional[str] = None
    val_fraction: float = 0.2


# -- the run ---------------------------------------------------------------------------------------
class Mode(enum.Enum):
    offline = "offline"
    online = "online"


@dataclass
class TrainerConf:
    mode: Mode = Mode.offline
    outer_steps: int = 10
    time_budget: Optional[float] = None  # offline: seconds for the outer steps; None: no limit
    backtrack: Optional[float] = None  # offline: a step above backtrack x best: back, lr / 2
    interval: int = 10
    reset_tangents: bool = False
    clip_norm: Optional[float] = None
    bounds: dict[str, list[Optional[float]]] = field(default_factory=dict)
    resume: bool = False  # continue the run in hydra.run.dir (its fingerprint must match)
    overwrite: bool = False  # discard a run already in hydra.run.dir
    progress: bool = True
    tensorboard: bool = False
    memory_budget_gb: Optional[float] = None  # None: the device's available memory
    divergence_factor: Optional[float] = 10.0  # val loss > factor x best seen: divergence


@dataclass
class ReportConf:
    plots: bool = True
    retrain: bool = True  # evaluate initial / learned / reference hyperparameters from scratch
    compare_methods: bool = False  # time + peak memory of one forward and one reverse hypergrad


@dataclass
class Config:
    problem: Any = MISSING
    model: Any = MISSING
    hyperparams: Any = MISSING
    inner_optimizer: Any = MISSING
    outer_optimizer: Any = MISSING
    method: Any = MISSING
    trainer: TrainerConf = field(default_factory=TrainerConf)
    report: ReportConf = field(default_factory=ReportConf)
    distributed: DistributedConf = field(default_factory=DistributedConf)  # under torchrun
    seed: int = 0
    name: str = "run"


SCHEMAS: dict[str, dict[str, type]] = {
    "problem": {"digits": DigitsConf, "hypercleaning": HypercleaningConf,
                "ridge_diabetes": RidgeDiabetesConf, "breast_cancer": BreastCancerConf,
                "sparse_regression": SparseRegressionConf},
    "model": {"mlp": MLPConf, "linear": LinearConf, "cnn": CNNConf},
    "hyperparams": {"hyperparams": HyperParamsConf},
    "inner_optimizer": {"sgd": SGDConf, "adam": AdamConf, "adamw": AdamWConf},
    "outer_optimizer": {"torch": TorchOuterConf, "sign": SignOuterConf},
    "method": {"method": MethodConf},
}


def register_configs() -> None:
    """Store the schemas: ``base_config`` and ``<group>/schema_<name>``."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, schemas in SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=group, name=f"schema_{name}", node=node)


SAFE_CONFIG_KEYS = (
    "name", "trainer.outer_steps", "trainer.time_budget", "trainer.progress", "trainer.resume",
    "trainer.overwrite", "trainer.tensorboard", "trainer.memory_budget_gb",
    "trainer.divergence_factor", "report.*", "method.*", "outer_optimizer.*", "distributed.*",
)
"""Config keys that may change when a run is resumed (fnmatch patterns): how long to run, how
to report, how to compute the same hypergradients (forward or reverse mode, the HVP strategy,
chunking, compile: equal to rounding; offline only, online needs forward mode), and the outer
optimizer's hyperparameters
(the new ones replace the checkpoint's; its class, ``outer_optimizer._target_``, may not
change). Every other key is in the checkpoint's fingerprint."""
_NOT_SAFE = ("outer_optimizer._target_", "outer_optimizer._partial_")


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            _flatten(v, f"{prefix}{k}.", out)
    else:
        out[prefix[:-1]] = node
    return out


def config_fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """``{"config.<dotted key>": value}`` of the resolved config, without
    :data:`SAFE_CONFIG_KEYS`: what the checkpoint of a ``hypergrad-run`` run must match."""
    from fnmatch import fnmatchcase

    tree = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    flat = _flatten(tree, "", {})
    return {f"config.{k}": v for k, v in flat.items()
            if k in _NOT_SAFE or not any(fnmatchcase(k, pat) for pat in SAFE_CONFIG_KEYS)}


def build(cfg: DictConfig, run_dir: str | Path | None = None) -> tuple[Any, Any]:
    """Instantiate a composed config: returns ``(task, trainer)``."""
    import logging

    import torch

    from .trainer import Trainer

    torch.manual_seed(cfg.seed)
    hps = instantiate(cfg.hyperparams, _convert_="all")
    opt = instantiate(cfg.inner_optimizer, _convert_="all")
    model = instantiate(cfg.model, _convert_="all")
    task = instantiate(cfg.problem, hyperparams=hps, optimizer=opt, model=model, _convert_="all")
    method = instantiate(cfg.method, _convert_="all")
    outer = instantiate(cfg.outer_optimizer, _convert_="all")
    tc = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(tc, dict)
    mode = tc.pop("mode")
    trainer = Trainer(
        task.problem, method, outer, outer_steps=tc["outer_steps"],
        mode=mode.value if isinstance(mode, enum.Enum) else mode,
        interval=tc["interval"], reset_tangents=tc["reset_tangents"],
        clip_norm=tc["clip_norm"], bounds=tc["bounds"], run_dir=run_dir, resume=tc["resume"],
        evaluate=task.evaluate, progress=tc["progress"], tensorboard=tc["tensorboard"],
        memory_budget=None if tc["memory_budget_gb"] is None else tc["memory_budget_gb"] * 2**30,
        log=logging.getLogger("hypergrad").info, divergence_factor=tc["divergence_factor"],
        overwrite=tc["overwrite"], fingerprint=config_fingerprint(cfg) if run_dir else None,
        time_budget=tc["time_budget"], backtrack=tc["backtrack"])
    return task, trainer
