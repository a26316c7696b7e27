"""Hydra configs that instantiate the library's objects, and :func:`build`, the one place a
composed config becomes a task and a Trainer with its parts.

Every config option names its object by ``_target_`` (a class or factory of the library, or of
``torch.optim``) and extends a *schema* generated from that callable's signature by
:func:`schema`: ``_target_`` plus one field per argument, typed where OmegaConf can check the
type (numbers, strings, booleans, their ``Optional`` and lists of them), with the signature's
default. The schemas are stored in Hydra's ConfigStore as ``<group>/schema_<name>`` (the table is
:func:`targets`), and each YAML option extends one (``defaults: [schema_<name>, _self_]``). So a
misspelt key, an argument the object does not take (``windows`` on a scalar, ``compile`` on the
column loop) or a value of the wrong type fails at composition with the key named, and no schema
can drift from the code it configures. The ``method`` and ``inner_optimizer`` groups are the
registries (:func:`hypergrad.methods.registered`, :func:`hypergrad.optim.registered`): a method
or optimizer registered by name (yours included, by an entry point or an import in this
process) is an option without an edit here, as is any class named by ``_target_``.

The Trainer's parts are their own nodes: ``mode`` (a group: ``offline`` / ``online``),
``guards``, ``folder``, ``callbacks`` and ``distributed``, each a schema of its class.

Nested objects are nested groups: the HVP strategy of a forward-type method
(``method/hvp=loop``, ``method.hvp.chunk_size=4``), the linear solver of implicit
differentiation (``method/solver=neumann``), the step VJP of reverse mode
(``method/step_vjp=mixed``), the tangent rule of forward mode (``method/tangent=jvp``), and each
hyperparameter's kind, chosen per item in a ``hyperparams`` option's defaults list
(``- kind@items.lr: schedule``; the item's ``name`` is its key). Library classes never see a
``DictConfig``.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import importlib
import inspect
import os
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Optional, Union

from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate
from omegaconf import MISSING, DictConfig, OmegaConf

from .errors import ConfigError

__all__ = ["build", "register_configs", "config_fingerprint", "schema", "targets", "CONFIG_DIR",
           "SAFE_CONFIG_KEYS", "TASK_ARGS", "check_keys", "unknown_keys", "global_groups"]

CONFIG_DIR = (Path(__file__).resolve().parent / "configs"
              if (Path(__file__).resolve().parent / "configs" / "config.yaml").exists()
              else Path(__file__).resolve().parent.parent / "configs")
"""The Hydra presets: ``hypergrad/configs`` in an installed wheel, the checkout's ``configs/``
in a source tree (an editable install)."""

TASK_ARGS = ("hyperparams", "optimizer", "model")
"""A task builder's arguments that :func:`build` passes (the instantiated other groups), not
the task's config."""


# -- schemas from signatures ---------------------------------------------------------------------
_PLAIN = (int, float, bool, str)


def _conf_type(tp: Any) -> Any:
    """The OmegaConf-checkable form of an annotation, else ``Any`` (then the object checks)."""
    if tp in _PLAIN:
        return tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        # a config cannot hold a tensor: ``float | Tensor`` (torch.optim's lr) is a float there,
        # so ``outer_optimizer.lr=abc`` fails at composition, not inside torch
        args = tuple(a for a in args if not _is_tensor(a))
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            inner = _conf_type(rest[0])
            return Any if inner is Any else Optional[inner]
        if len(rest) == 1 and len(args) == 1:
            return _conf_type(rest[0])
        return Any
    if origin in (list, Sequence) and len(args) == 1 and args[0] in _PLAIN:
        return list[args[0]]  # type: ignore[valid-type]
    if origin is tuple and len(args) == 2 and args[0] in _PLAIN and args[1] is Ellipsis:
        return list[args[0]]  # type: ignore[valid-type]
    return Any


def _settings(tp: Any) -> type | None:
    """The dataclass of settings an argument takes (``search: SearchSettings | Mapping | None``:
    ``SearchSettings``), else ``None``."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)
    found = [a for a in args if dataclasses.is_dataclass(a) and isinstance(a, type)]
    return found[0] if len(found) == 1 else None


def _settings_schema(cls: type) -> type:
    """A structured config of a settings dataclass's fields with their defaults and no
    ``_target_`` (the object gets a mapping), so that ``mode.search.two_orders=0`` composes and
    a misspelt setting fails at composition."""
    hints = typing.get_type_hints(cls)
    fields: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        default = f.default
        if isinstance(default, (tuple, list)):
            spec = field(default_factory=_copies(list(default)))
        else:
            spec = field(default=default)
        fields.append((f.name, _conf_type(hints[f.name]), spec))
    return make_dataclass(f"{cls.__name__}Conf", fields)


def _is_tensor(tp: Any) -> bool:
    import torch

    return tp is torch.Tensor


def _public_path(obj: Any) -> str:
    """The shortest importable dotted path of ``obj`` (``hypergrad.ForwardMode`` rather than
    ``hypergrad.forward.ForwardMode``), for readable ``_target_`` values."""
    module, qual = str(obj.__module__), str(obj.__qualname__)
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        mod = ".".join(parts[:i])
        try:
            if getattr(importlib.import_module(mod), qual, None) is obj:
                return f"{mod}.{qual}"
        except ImportError:  # pragma: no cover - a parent that cannot be imported alone
            continue
    return f"{module}.{qual}"


def _copies(value: Any) -> Callable[[], Any]:
    """A default factory: a fresh copy of ``value`` for every instance."""
    return lambda: copy.deepcopy(value)


def _hints(target: Callable[..., Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fn in ((target, target.__init__) if inspect.isclass(target) else (target,)):
        try:
            out.update(typing.get_type_hints(fn))
        except Exception:  # an annotation that does not evaluate: those fields take Any
            pass
    return out


def schema(target: Callable[..., Any], *, skip: Sequence[str] = (), partial: bool = False,
           defaults: dict[str, Any] | None = None) -> type:
    """A structured-config dataclass for ``target``: ``_target_`` (its public path), one field
    per argument of its signature except ``skip`` (typed by :func:`_conf_type`, defaulting to
    the signature's default, or ``defaults[name]``; required arguments are ``???``), and
    ``_partial_: true`` with ``partial`` (a factory of ``params -> optimizer``, say).

    Example:
        >>> from hypergrad.hvp import VmapVJP
        >>> [f for f in schema(VmapVJP).__dataclass_fields__]
        ['_target_', 'chunk_size', 'memory_budget', 'compile']
    """
    defaults = defaults or {}
    try:
        params = list(inspect.signature(target).parameters.values())
    except ValueError:  # a class without an __init__ of its own: no arguments
        params = []
    hints = _hints(target)
    fields: list[tuple[str, Any, Any]] = [("_target_", str, field(default=_public_path(target)))]
    if partial:
        fields.append(("_partial_", bool, field(default=True)))
    for p in params:
        if p.name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = defaults.get(p.name, p.default)
        settings = _settings(hints.get(p.name))
        if settings is not None and default is None:  # its defaults, keys set one by one
            settings_conf = _settings_schema(settings)
            fields.append((p.name, Optional[settings_conf], field(default_factory=settings_conf)))
            continue
        if default is inspect.Parameter.empty:
            default = MISSING
        if isinstance(default, (tuple, list, dict)):
            f = field(default_factory=_copies(list(default) if isinstance(default, tuple)
                                              else default))
        elif default is None or default is MISSING or isinstance(default, (*_PLAIN, enum.Enum)):
            f = field(default=default)
        else:
            raise TypeError(
                f"schema({_public_path(target)}): the default of {p.name!r} is "
                f"{type(default).__name__} {default!r}, which a config cannot hold; give it a "
                f"number, string, bool, list or None default (or pass defaults={{...}}).")
        fields.append((p.name, _conf_type(hints.get(p.name, Any)), f))
    name = f"{getattr(target, '__name__', 'Target')}Conf"
    return make_dataclass(name, fields)


def targets() -> dict[str, dict[str, tuple[Callable[..., Any], dict[str, Any]]]]:
    """``{group: {schema name: (target, schema options)}}``: what the configs can instantiate.
    Each entry is stored as ``<group>/schema_<name>`` by :func:`register_configs`."""
    import torch

    from . import hyperparams as hp
    from .distributed import Ranks
    from .hvp import STRATEGIES
    from .methods import registered as methods
    from .methods.implicit import SOLVERS
    from .optim import registered as optimizers
    from .run import Guards, Offline, Online, QuasiNewton, RunFolder, SignDescent, Surrogate
    from .run.callbacks import standard
    from .stepvjp import STEP_VJPS
    from .tangent import JVP, AutoTangent, ClosedForm, DiagonalJacobian
    from .tasks import bundled, sparse_regression

    task = {"skip": TASK_ARGS}
    item = {"defaults": {"name": "${hg.key:}"}}  # an item's name is its key under items
    outer = {"skip": ("params", "precondition"), "partial": True}  # a matrix: Python only
    outer_box = {"skip": ("params", "box", "precondition"), "partial": True}  # the Trainer's box
    return {
        "task": {
            "digits": (bundled.digits_task, task),
            "hypercleaning": (bundled.hypercleaning_task, task),
            "ridge_diabetes": (bundled.ridge_diabetes_task, task),
            "breast_cancer": (bundled.breast_cancer_task, task),
            "sparse_regression": (sparse_regression.sparse_regression_task, task)},
        "model": {"mlp": (bundled.mlp_factory, {}), "cnn": (bundled.cnn_factory, {}),
                  "linear": (bundled.linear_factory, {})},
        "hyperparams": {"hyperparams": (hp.HyperParams, {})},
        "hyperparams/kind": {
            "scalar": (hp.Scalar, item), "schedule": (hp.Schedule, item),
            "per_tensor": (hp.PerTensor, item),
            "per_group": (hp.PerGroup, {"defaults": {**item["defaults"], "groups": MISSING}}),
            "per_example": (hp.PerExample, item),
            "array": (hp.Array, item), "init_scale": (hp.InitScale, item),
            "init_weights": (hp.InitWeights, item)},
        "inner_optimizer": {n: (f, {}) for n, f in optimizers().items()},
        "outer_optimizer": {"torch_adam": (torch.optim.Adam, outer),
                            "torch_sgd": (torch.optim.SGD, outer),
                            "sign": (SignDescent, outer),
                            "quasi_newton": (QuasiNewton, outer_box),
                            "surrogate": (Surrogate, outer_box)},
        "method": {n: (c, {}) for n, c in methods().items()},
        "method/hvp": {n: (c, {}) for n, c in STRATEGIES.items()},
        "method/solver": {n: (c, {}) for n, c in SOLVERS.items()},
        "method/step_vjp": {n: (c, {}) for n, c in STEP_VJPS.items()},
        "method/tangent": {"auto": (AutoTangent, {}), "closed_form": (ClosedForm, {}),
                           "diagonal_jacobian": (DiagonalJacobian, {}), "jvp": (JVP, {})},
        "mode": {"offline": (Offline, {}), "online": (Online, {})},
        "guards": {"guards": (Guards, {})},
        "folder": {"folder": (RunFolder, {"skip": ("path", "fingerprint")})},
        "callbacks": {"callbacks": (standard, {})},
        "distributed": {"distributed": (Ranks, {})},
    }


def _parent_key(*, _parent_: Any) -> str:
    """``${hg.key:}``: the key of the node holding the field (a hyperparameter's name is its
    key under ``hyperparams.items``)."""
    return str(_parent_._key())


# -- the run ---------------------------------------------------------------------------------------
@dataclass
class ReportConf:
    plots: bool = True
    retrain: bool = True  # evaluate initial / learned / reference hyperparameters from scratch
    # ... and in this many batch orders the tuning never saw (their mean; 0: not)
    orders: int = 3
    compare_methods: bool = False  # time + peak memory of one forward and one reverse hypergrad


@dataclass
class Config:
    task: Any = MISSING
    model: Any = MISSING
    hyperparams: Any = MISSING
    inner_optimizer: Any = MISSING
    outer_optimizer: Any = MISSING
    method: Any = MISSING
    mode: Any = MISSING
    guards: Any = MISSING
    folder: Any = MISSING
    callbacks: Any = MISSING
    distributed: Any = MISSING  # used under torchrun
    report: ReportConf = field(default_factory=ReportConf)
    seed: int = 0
    name: str = "run"
    device: str = "cpu"  # the bundled tasks' device: cpu, cuda, cuda:N, auto (tasks.device_of)


GROUPS = ("task", "model", "hyperparams", "inner_optimizer", "outer_optimizer", "method", "mode",
          "guards", "folder", "callbacks", "distributed")
"""The config groups :func:`build` instantiates."""

REGISTRIES = ("method", "inner_optimizer")
"""Groups whose options include every registered name (a method or optimizer registered by an
entry point or an import is ``method=<name>`` without a YAML file)."""


def _hydra_subdir(output_dir: str) -> str | None:
    """``${hg.hydra_subdir:<run folder>}``, Hydra's ``output_subdir``: ``.hydra`` for a folder's
    first invocation, ``.hydra.2``, ``.hydra.3``, ... for later ones in the same folder (a
    resume, or one refused because the folder holds a run), so no invocation overwrites the
    record of another. Under torchrun only rank 0 records it (``None`` elsewhere: Hydra writes
    nothing), as it alone writes the run's files: every rank wrote one, so a single
    invocation left ``.hydra`` and ``.hydra.2``, read as a resume."""
    if os.environ.get("RANK", "0") != "0":
        return None
    from .run.files import next_numbered

    folder = Path(output_dir)
    if not (folder / ".hydra").exists():
        return ".hydra"
    return next_numbered(folder, ".hydra.{}").name


_PICKED_GROUPS = {"debug/for_mode", "experiment_outer"}
"""Groups that config.yaml's defaults choose from other choices, never a user."""


_GROUP_NOTES = {
    "debug": " (fast_online: with an online preset or mode=online)",
    "sweep": " (as +sweep=<option>, with the sweep-optuna extra)",
}
"""What ``--help`` says beside a group whose options need more than ``group=option``."""


def _choices() -> str:
    """``${hg.choices:}``: the groups and the options a user chooses from, for ``--help``
    (Hydra's own list, without the ``schema_*`` entries the options extend, and without the
    groups config.yaml picks itself: ``debug/for_mode``, debug=fast's part for the mode, and
    ``experiment_outer``, a preset's settings of its outer optimizer)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    loader = GlobalHydra.instance().config_loader()
    lines: list[str] = []

    def walk(parent: str) -> None:
        for g in loader.list_groups(parent):
            name = f"{parent}/{g}" if parent else g
            if name == "hydra" or name.startswith("hydra/") or name in _PICKED_GROUPS:
                continue
            opts = sorted(o for o in loader.get_group_options(name, ObjectType.CONFIG)
                          if not o.startswith("schema_"))
            if opts:
                lines.append(f"{name}: {', '.join(opts)}{_GROUP_NOTES.get(name, '')}")
            walk(name)

    walk("")
    return "\n".join(sorted(lines))


_HYDRA_KEYS = {"_target_", "_partial_", "_convert_", "_recursive_", "_args_"}


def _known(target: Any) -> set[str] | None:
    """The arguments ``target`` takes (``None``: any, it has ``**kwargs`` or no signature)."""
    try:
        obj = _import(target) if isinstance(target, str) else target
        params = inspect.signature(obj).parameters.values()
    except Exception:  # a user's module that fails while importing: build's _locate says why
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind != p.VAR_POSITIONAL}


def _import(path: str) -> Any:
    module, _, attr = path.rpartition(".")
    obj: Any = importlib.import_module(module)
    return getattr(obj, attr)


def unknown_keys(cfg: DictConfig, groups: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    """Keys of a composed config that name no setting, each with the nearest known names: a
    top-level key that is neither a field of :class:`Config` nor a config group chosen
    (``groups``: a user's own groups, ``+augment=strong``), and a key of a node with a
    ``_target_`` that its target does not take (a key added with ``+``, or a typo in a user's
    config file)."""
    import difflib

    tree = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(tree, dict)
    out: list[tuple[str, list[str]]] = []
    top = set(Config.__dataclass_fields__) | set(groups) | {"hydra"}
    valid = [k for k in _flatten({k: v for k, v in tree.items() if k in top and k != "hydra"},
                                 "", {})]
    by_leaf: dict[str, list[str]] = {}
    for path in valid:
        by_leaf.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    for key in tree:
        if key in top:
            continue
        near = difflib.get_close_matches(str(key), sorted(top), n=3, cutoff=0.6)
        leaves = list(_flatten({key: tree[key]}, "", {}))
        for leaf in leaves:  # trainer.outer_step: mode.outer_steps
            for name in difflib.get_close_matches(leaf.rsplit(".", 1)[-1], by_leaf, n=2,
                                                  cutoff=0.7):
                near += [p for p in by_leaf[name] if p not in near]
        out.append((", ".join(leaves), near[:4]))

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, dict):
            return
        if "_target_" in node:
            known = _known(node["_target_"])
            if known is not None:
                for k in node:
                    if k not in known and k not in _HYDRA_KEYS:
                        out.append((f"{prefix}{k}", [f"{prefix}{n}" for n in
                                    difflib.get_close_matches(str(k), sorted(known), n=3,
                                                              cutoff=0.5)]))
        for k, v in node.items():
            walk(v, f"{prefix}{k}.")

    for key, value in tree.items():
        if key in top and key != "hydra":
            walk(value, f"{key}.")
    report = tree.get("report")
    known_report = sorted(ReportConf.__dataclass_fields__)
    if isinstance(report, dict):  # no _target_: its fields are ReportConf's
        for k in report:
            if k not in known_report:
                out.append((f"report.{k}", [f"report.{n}" for n in difflib.get_close_matches(
                    str(k), known_report, n=3, cutoff=0.5)]))
    return out


def global_groups(config_dir: Path = CONFIG_DIR) -> set[str]:
    """The config groups whose options write at the top level (``# @package _global_``:
    ``experiment``, ``debug``, ``sweep``): a key under their name names no setting."""
    out = set()
    for d in config_dir.iterdir():
        if d.is_dir() and any(f.read_text().startswith("# @package _global_")
                              for f in d.glob("*.yaml")):
            out.add(d.name)
    return out


def check_keys(cfg: DictConfig, groups: Sequence[str] = ()) -> None:
    """Raise a :class:`~hypergrad.errors.ConfigError` naming every key that names no setting
    (:func:`unknown_keys`), with the nearest known names."""
    bad = unknown_keys(cfg, groups)
    if bad:
        by = _set_by_preset([k for k, _ in bad])

        def why(key: str, near: list[str]) -> str:
            node, _, leaf = key.rpartition(".")
            target = OmegaConf.select(cfg, f"{node}._target_", default=None) if node else None
            if key in by and target is not None:  # debug=fast's task.steps, a builder of yours
                return (f" (set by {by[key]}, but {node}._target_={target} takes no {leaf!r}: "
                        f"give it that argument, or leave {by[key]} out)")
            other = _options_taking(target, leaf, node) if target is not None else []
            if other:  # groups on a scalar: a setting of another option of its group
                return (f" (a setting of {', '.join(o for o, _ in other)}, not of "
                        f"{node}._target_={target}: choose that option, e.g. {other[0][1]})")
            return f" (did you mean {', '.join(near)}?)" if near else ""

        lines = "; ".join(f"{k!r}{why(k, near)}" for k, near in bad)
        left = _left_from_option(cfg, [k for k, _ in bad])
        if left:  # model._target_=mine over model=mlp: mlp's settings stay, mine takes none
            node, target, keys = left
            mine = _hydra_choices().get(node)
            if mine and not (CONFIG_DIR / node / f"{mine}.yaml").is_file():
                raise ConfigError(  # already a file of its own, extending a bundled option
                    f"hypergrad-run: {node}._target_={target} does not take "
                    f"{', '.join(keys)}: they are settings of the bundled {node} option that "
                    f"your {node}={mine} extends in its defaults list and whose _target_ it "
                    f"replaced. Drop that entry from your file's defaults list and give "
                    f"your builder's own settings there (docs/own-model.md).")
            raise ConfigError(
                f"hypergrad-run: {node}._target_={target} does not take {', '.join(keys)}: they "
                f"are settings of the {node} option whose _target_ it replaced, and a command "
                f"line cannot remove them. Give your {node} a config file of its own: "
                f"conf/{node}/mine.yaml holding `_target_: {target}` and its settings, then "
                f"`hypergrad-run --config-dir conf {node}=mine` (docs/own-model.md).")
        raise ConfigError(f"hypergrad-run: the config has keys that name no setting: {lines}. "
                         f"Check the spelling (hypergrad-run --help lists the groups; "
                         f"--cfg job prints the composed config).")


def _options_taking(target: Any, leaf: str, node: str) -> list[tuple[str, str]]:
    """``[(option, command)]``: the other options of the config group whose option has
    ``_target_`` ``target`` that take the argument ``leaf``, each with the override that
    chooses it for ``node`` (``hyperparams/kind@hyperparams.items.wd=per_group``)."""
    try:
        cls = _import(target) if isinstance(target, str) else target
    except Exception:  # a user's module that fails while importing: build's _locate says why
        return []
    for group, entries in targets().items():
        if not any(t is cls for t, _ in entries.values()):
            continue
        at = "" if node == group.replace("/", ".") else f"@{node}"
        return [(f"{group}={name}", f"{group}{at}={name}") for name, (t, _) in entries.items()
                if t is not cls and leaf in (_known(t) or ())]
    return []


def _set_by_preset(keys: Sequence[str]) -> dict[str, str]:
    """``{key: "debug=fast"}`` for the ``keys`` that a preset chosen in the Hydra job running
    (an option of :func:`global_groups`: ``experiment``, ``debug``, ``sweep``) sets."""
    out: dict[str, str] = {}
    choices = _hydra_choices()
    for group in sorted(global_groups()):
        option = choices.get(group)
        path = CONFIG_DIR / group / f"{option}.yaml"
        if not isinstance(option, str) or not path.is_file():
            continue
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert isinstance(tree, dict)
        flat = _flatten({k: v for k, v in tree.items() if k not in ("defaults", "hydra")}, "",
                        {})
        out.update({k: f"{group}={option}" for k in keys if k in flat})
    return out


def _left_from_option(cfg: DictConfig, keys: Sequence[str]
                      ) -> tuple[str, str, list[str]] | None:
    """``(node, its _target_, keys)`` where unknown ``keys`` are fields of the schema the node's
    option extends, whose ``_target_`` was replaced by one that does not take them."""
    for key in keys:
        node_key = key.rpartition(".")[0]
        node = OmegaConf.select(cfg, node_key) if node_key else None
        kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        fields = getattr(kind, "__dataclass_fields__", {})
        if "_target_" not in fields or node is None or (
                node._target_ == fields["_target_"].default):
            continue
        left = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == node_key]
        if all(k in fields for k in left):
            return node_key, str(node._target_), left
    return None


def _share_the_config_store() -> None:
    """Make ``copy.deepcopy`` of Hydra's ``ConfigStore`` singleton return the singleton.

    Hydra 1.3 deep-copies its config repository for every group it lists, and with it the
    ConfigStore its structured-config source holds: every schema stored here. ``--help`` lists
    about 190 groups and options, and those copies were 8 of its 13 s on a slow 2-core machine
    (5 s after). The copy is never needed: the source only reads the store, and
    ``ConfigStore.load`` copies the node it returns. Hydra's own fix (facebookresearch/hydra
    pull request 2928, after 1.3) has the source fetch the singleton instead of holding it, for
    the same reason: a copied singleton is a second store that no longer sees registrations."""
    if "__deepcopy__" not in vars(ConfigStore):
        ConfigStore.__deepcopy__ = lambda self, memo: self  # type: ignore[attr-defined]


def register_configs() -> None:
    """Store ``base_config`` and every ``<group>/schema_<name>`` of :func:`targets` (and, for
    the registries, ``<group>/<name>``), and the ``hg.key`` resolver."""
    _share_the_config_store()
    OmegaConf.register_new_resolver("hg.key", _parent_key, replace=True)
    OmegaConf.register_new_resolver("hg.hydra_subdir", _hydra_subdir, replace=True)
    OmegaConf.register_new_resolver("hg.choices", _choices, replace=True)
    cs = ConfigStore.instance()
    base = OmegaConf.structured(Config)
    OmegaConf.set_struct(base, False)  # a group of a user's config folder may add a key here;
    OmegaConf.set_struct(base.report, True)  # its settings stay closed; check_keys does the rest
    cs.store(name="base_config", node=base)
    for group, entries in targets().items():
        for name, (target, options) in entries.items():
            node = schema(target, **options)
            cs.store(group=group, name=f"schema_{name}", node=node)
            if group in REGISTRIES and not (CONFIG_DIR / group / f"{name}.yaml").exists():
                cs.store(group=group, name=name, node=node)  # a registered name is an option


SAFE_CONFIG_KEYS = (
    "name", "mode.outer_steps", "guards.time_budget", "guards.clock", "guards.memory_budget",
    "guards.divergence_factor", "folder.*", "callbacks.*", "report.*", "method.*",
    "outer_optimizer.*", "distributed.*",
)
"""Config keys that may change when a run is resumed (fnmatch patterns): how long to run, how
to report, how to compute the hypergradients (the method and its nested options: forward or
reverse mode, the HVP strategy, chunking, compile give the same ones to rounding; an
approximate method's settings are in the Trainer's own fingerprint), and the outer optimizer's
hyperparameters (the new ones replace the checkpoint's; its class, ``outer_optimizer._target_``,
may not change). Every other key is in the checkpoint's fingerprint."""
_NOT_SAFE = ("outer_optimizer._target_", "outer_optimizer._partial_")


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            _flatten(v, f"{prefix}{k}.", out)
    else:
        out[prefix[:-1]] = node
    return out


def _check_groups_given(cfg: DictConfig) -> None:
    """A config group left null (a preset of yours with a ``mode:`` line and nothing under it,
    or only another option's settings merged into it) is a
    :class:`~hypergrad.errors.ConfigError`: it replaced the option chosen, also one
    chosen on the command line (``mode=online``), and the Trainer ran its own default in its
    place without a word."""
    # (null merged with a later option's settings, debug=fast's mode.interval: a mapping
    # without the group's _target_, which every option of it has)
    empty = [g for g in GROUPS if g in cfg and (cfg[g] is None or (
        OmegaConf.is_dict(cfg[g]) and "_target_" not in cfg[g].keys()))]  # (??? is not "in")
    if not empty:
        return
    chosen = _hydra_choices()
    g = empty[0]
    if (chosen.get(g) and not (CONFIG_DIR / g / f"{chosen[g]}.yaml").is_file()
            and OmegaConf.is_dict(cfg[g]) and len(cfg[g]) and g in targets()):
        # an option file of the user's own without its schema line (a hyperparams option
        # with items and no `- schema_hyperparams` was told of a `hyperparams:` line it never
        # had; the own-config probe)
        schemas = ", ".join(f"schema_{n}" for n in targets()[g])
        raise ConfigError(
            f"hypergrad-run: {g} (chosen: {g}={chosen[g]}) holds settings "
            f"({', '.join(map(str, list(cfg[g])[:4]))}) but no _target_: an option file of "
            f"your own starts its defaults list with the schema it extends ({schemas}), "
            f"which gives the _target_, e.g. `defaults: [schema_{next(iter(targets()[g]))}, "
            f"_self_]` (configs/{g}/ holds examples; docs/configs.md).")
    said = ", ".join(f"{g} (chosen: {g}={chosen[g]})" if chosen.get(g) else g for g in empty)
    raise ConfigError(
        f"hypergrad-run: {said} {'is' if len(empty) == 1 else 'are'} null (or only settings, no "
        f"option) in the composed "
        f"config: a config file of yours has a `{empty[0]}:` line with nothing under it (or "
        f"`{empty[0]}: null`), which replaces the option chosen, and the Trainer would run its "
        f"own default instead. Remove that line, or put the settings under it "
        f"(hypergrad-run --cfg job ... shows the composed config).")


def _hydra_choices() -> dict[str, str]:
    """The Hydra job's group choices (``{}`` outside a Hydra job: the compose API)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return {str(k): str(v) for k, v in HydraConfig.get().runtime.choices.items()
            if v is not None}


def _check_resolves(cfg: DictConfig, keys: Sequence[str] | None = None) -> None:
    """Resolve every interpolation of the config's top-level ``keys`` (default: all but
    ``hydra``); one that names a key the config does not hold (``${task.n_train}`` of
    ``hyperparams=example_weights`` over a task of your own) is a
    :class:`~hypergrad.errors.ConfigError` naming both keys."""
    import re

    from omegaconf.errors import InterpolationResolutionError

    for key in cfg if keys is None else [k for k in keys if k in cfg]:
        if key == "hydra":
            continue
        try:
            node = cfg._get_node(key)
            if OmegaConf.is_config(node):
                OmegaConf.to_container(node, resolve=True)  # type: ignore[arg-type]
            else:
                cfg[key]  # noqa: B018 - resolves it
        except InterpolationResolutionError as err:
            where = str(err.full_key or key)
            tree = OmegaConf.to_container(cfg, resolve=False)
            value = _flatten(tree, "", {}).get(where, "")
            cause = str(err.msg or err).splitlines()[0]
            named = re.search(r"Interpolation key '([^']+)' not found", cause)
            add = f", or add the key it names (+{named.group(1)}=...)" if named else ""
            raise ConfigError(
                f"hypergrad-run: {where}={value} does not resolve: {cause}. Give {where} a value "
                f"of its own ({where}=...){add}.") from None


def config_fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """``{"config.<dotted key>": value}`` of the resolved config, without
    :data:`SAFE_CONFIG_KEYS`: what the checkpoint of a ``hypergrad-run`` run must match."""
    from fnmatch import fnmatchcase

    _check_resolves(cfg)
    tree = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    flat = _flatten(tree, "", {})
    for k, v in _search_defaults().items():  # as a run of before 2026-12-06 (search: null)
        if flat.get(f"mode.search.{k}", v) == v:
            flat.pop(f"mode.search.{k}", None)
    if flat.get("mode.search", 0) is None:
        del flat["mode.search"]
    return {f"config.{k}": v for k, v in flat.items()
            if k in _NOT_SAFE or not any(fnmatchcase(k, pat) for pat in SAFE_CONFIG_KEYS)}


def _search_defaults() -> dict[str, Any]:
    """``mode.search``'s settings at their defaults, as the config holds them (lists)."""
    from .run.modes import SearchSettings

    return {f.name: (list(v) if isinstance(v := getattr(SearchSettings(), f.name), tuple) else v)
            for f in dataclasses.fields(SearchSettings)}


def _check_task(cfg: DictConfig, task: Any) -> None:
    """Warn where the run's ``seed`` or ``device`` did not reach the task's problem (a builder
    that does not take them, or does not pass them on): the step's random draws, the Trainer's
    quasi-random start and its Surrogate's candidates would follow another seed; the run would
    go on another device than the one asked for."""
    import warnings

    import torch

    from .errors import HypergradWarning
    from .tasks.bundled import device_of

    problem = getattr(task, "problem", None)
    seed, got = cfg.seed, getattr(problem, "seed", None)
    if isinstance(got, int) and got != seed:
        warnings.warn(
            f"seed={seed} but the task's InnerProblem has seed={got}: the step's random draws "
            f"(dropout), the Trainer's quasi-random start and its Surrogate's candidates follow "
            f"{got}. Have the task builder take `seed` (task.seed=${{seed}} in its config) and "
            f"pass it on: InnerProblem(..., seed=seed).", HypergradWarning, stacklevel=3)
    device, on = cfg.get("device", "cpu"), getattr(problem, "device", None)
    if isinstance(on, torch.device) and on.type != device_of(device).type:
        warnings.warn(
            f"device={device} but the task built its problem on {on}: its builder does not take "
            f"`device` (task.device=${{device}} in its config) or does not move the model and "
            f"data there.", HypergradWarning, stacklevel=3)


def _locate(key: str, target: str) -> Any:
    """Where the ``_target_`` of the node ``key`` (``task``, ``model``, ...) does not resolve,
    say why (Hydra's own message, "Error locating target", hides the cause): no part of it is
    an importable module, its module fails while importing (its own error), or a name is
    missing (the nearest there). As Hydra does, the longest importable prefix is the module
    and the rest attributes (``pkg.module.Class.method``)."""
    import difflib

    parts = target.split(".")
    module, n = None, 0
    for n in range(len(parts) - 1, 0, -1):  # the longest importable prefix
        name = ".".join(parts[:n])
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError as err:
            if err.name is not None and (name == err.name or name.startswith(err.name + ".")):
                continue  # this prefix is no module: a shorter one may be
            raise ConfigError(f"{key}._target_={target}: importing {name} failed: "
                             f"{err}") from err
        except Exception as err:  # the user's module fails while importing: its own error
            raise ConfigError(f"{key}._target_={target}: importing {name} failed: "
                             f"{type(err).__name__}: {err}") from err
    if module is None:
        raise ConfigError(
            f"{key}._target_={target}: no module {parts[0]!r} is importable from "
            f"{Path.cwd()}: run hypergrad-run from the folder that holds {parts[0]}.py (it is "
            f"importable), or install the package; a target is module.function.")
    obj: Any = module
    for k, attr in enumerate(parts[n:]):
        if not hasattr(obj, attr):
            where = ".".join(parts[:n + k])
            names = [m for m in dir(obj) if not m.startswith("_") and callable(getattr(obj, m))]
            near = difflib.get_close_matches(attr, names, n=3)
            hint = f"; did you mean {' or '.join(repr(m) for m in near)}?" if near else ""
            shown = ", ".join(sorted(names)[:12]) + (", ..." if len(names) > 12 else "")
            raise ConfigError(f"{key}._target_={target}: {where} has no {attr!r}{hint} (its "
                             f"callables: {shown or 'none'}).")
        obj = getattr(obj, attr)
    return obj


def _locate_targets(cfg: DictConfig) -> None:
    """:func:`_locate` every ``_target_`` of the config (a model, a hyperparameter kind, a
    method of a user's own as well as the task), before anything is built; and refuse a
    ``_partial_`` node's ``???`` over an argument with a default (:func:`_partial_missing`)."""
    tree = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(tree, dict)

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str) and target != "???" and "${" not in target:
                obj = _locate(key, target)
                if node.get("_partial_") is True:
                    _partial_missing(key, node, obj)
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}.{i}")

    walk({k: v for k, v in tree.items() if k != "hydra"}, "")


def _partial_missing(key: str, node: dict[str, Any], target: Any) -> None:
    """Refuse ``k: ???`` in a ``_partial_: true`` node where the target's argument ``k`` has a
    default: Hydra leaves a missing value out of a partial, so the call used the default
    (``model.width: ???`` trained at width 16 while config.yaml recorded ``???``; the
    own-config probe). An argument without a default is the caller's to give (a model
    factory's sizes) and is left alone."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin or class without a signature to read
        return
    for k, v in node.items():
        p = params.get(str(k))
        if v == "???" and p is not None and p.default is not inspect.Parameter.empty:
            raise ConfigError(
                f"{key}.{k} is ??? (no value) in a _partial_: true node: Hydra leaves a missing "
                f"value out of a partial, and the call would use {node['_target_']}'s default "
                f"{k}={p.default!r} while config.yaml records ???. Give it a value "
                f"({key}.{k}=...), or remove the line to use the default.")


def _check_items(cfg: DictConfig) -> None:
    """Every item under ``hyperparams.items`` names its kind (a ``_target_``, from the option's
    defaults list); one without reached ``HyperParams`` as a plain dict, refused without the
    item's name or the fix."""
    items = OmegaConf.select(cfg, "hyperparams.items", default=None)
    if not isinstance(items, DictConfig):
        return
    kinds = sorted(targets()["hyperparams/kind"])
    for key in items:
        name, node = str(key), items._get_node(key)
        if isinstance(node, DictConfig) and "_target_" not in node:
            raise ConfigError(
                f"hyperparams.items.{name} has no kind: choose one in the hyperparams option's "
                f"defaults list, `- kind@items.{name}: scalar` (kinds: {', '.join(kinds)}), or on "
                f"the command line, +hyperparams/kind@hyperparams.items.{name}=scalar "
                f"(docs/configs.md#hyperparameters-in-a-config).")


def _chosen_groups() -> list[str] | None:
    """The config groups chosen in the Hydra job running (a user's own, ``+augment=strong``,
    included) whose options write under their own name; ``None`` outside a Hydra job (the
    compose API)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    top = global_groups()
    return [g for g in HydraConfig.get().runtime.choices
            if "/" not in g and not g.startswith("hydra") and g not in top]


def build(cfg: DictConfig, folder: Any = None, log: Callable[[str], Any] | None = None,
          groups: Sequence[str] | None = None) -> tuple[Any, Any]:
    """Instantiate a composed config: returns ``(task, trainer)``. ``folder``: the run folder
    (a :class:`~hypergrad.RunFolder`, or a path that ``cfg.folder`` and the config's
    fingerprint complete; ``None``: nothing written); ``log``: where the Trainer's messages go
    (default: the ``hypergrad`` logger). A key that names no setting (``+trainer.outer_steps=5``,
    ``+report.plot=false``) is refused (:func:`check_keys`), as ``hypergrad-run`` refuses it;
    ``groups``: config groups of your own chosen in ``cfg`` (their keys are yours; default:
    those the Hydra job running chose, none with the compose API)."""
    import logging

    import torch

    from .problem import InnerProblem
    from .run import Log, RunFolder, Trainer
    from .task import Task

    if cfg.seed < 0:  # numpy's generators (the data split, the batch order) take none
        raise ConfigError(f"seed={cfg.seed}: a seed must be an int >= 0; pass seed=0, 1, ...")
    _check_resolves(cfg, [*GROUPS, "seed", "device"])  # what is built here
    _check_groups_given(cfg)
    _locate_targets(cfg)
    chosen = _chosen_groups() if groups is None else list(groups)
    try:
        check_keys(cfg, chosen or ())
    except ConfigError as err:
        if chosen is None:  # the compose API: a group of the user's own is not known here
            raise ConfigError(f"{err} A config group of your own: build(cfg, "
                              f"groups=['<its name>']).") from None
        raise
    torch.manual_seed(cfg.seed)
    _check_items(cfg)
    hps = instantiate(cfg.hyperparams, _convert_="all")
    opt = instantiate(cfg.inner_optimizer, _convert_="all")
    model = instantiate(cfg.model, _convert_="all")
    if OmegaConf.is_missing(cfg.task, "_target_"):
        raise ConfigError(
            "task._target_ is not set: task=custom runs a task builder of your own, named on "
            "the command line, e.g. `hypergrad-run task=custom task._target_=my_task.build "
            "+task.data=my_data.npz` (the folder you run from is importable; the builder's "
            "contract: docs/own-model.md).")
    task = instantiate(cfg.task, hyperparams=hps, optimizer=opt, model=model, _convert_="all")
    if isinstance(task, InnerProblem):  # a bare problem: no metrics beyond its val_loss
        task = Task(task)
    if not isinstance(task, Task):
        raise ConfigError(
            f"task._target_={cfg.task._target_} returned {type(task).__name__} "
            f"{str(task)[:80]}; a task builder returns a hypergrad.Task(problem, evaluate=...) "
            f"(or an InnerProblem): docs/own-model.md.")
    _check_task(cfg, task)
    method = instantiate(cfg.method, _convert_="all")
    outer = instantiate(cfg.outer_optimizer, _convert_="all")
    mode = instantiate(cfg.mode, _convert_="all")
    guards = instantiate(cfg.guards, _convert_="all")
    callbacks = instantiate(cfg.callbacks, _convert_="all")
    strategy = instantiate(cfg.distributed, _convert_="all")
    if folder is not None and not isinstance(folder, RunFolder):
        folder = RunFolder(folder, resume=cfg.folder.resume, overwrite=cfg.folder.overwrite,
                           fingerprint=config_fingerprint(cfg),
                           inner_every=cfg.folder.get("inner_every"))
    say = log if log is not None else logging.getLogger("hypergrad").info
    try:
        trainer = Trainer(task, method, outer, mode, guards, folder,
                          [Log(say, prefix=""), *callbacks], strategy)
    except NotImplementedError as err:  # settings the Trainer cannot run together (an online
        tb = err.__traceback__  # mode with reverse mode): hypergrad-run's usage error
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        here = Path(__file__).resolve().parent
        if tb is None or here not in Path(tb.tb_frame.f_code.co_filename).resolve().parents:
            raise  # from a user's own code
        raise ConfigError(f"hypergrad-run: mode={mode.name} method="
                          f"{getattr(method, 'name', type(method).__name__)}: "
                          f"{err}") from err
    return task, trainer
