"""The shape of the package, as issue 22 fixed it, checked on every run: the public surface
(``hypergrad.__all__`` at most 35 names, none shadowing a torch name), the Trainer's constructor
(at most 8 parameters, no ``**kwargs``), no private name imported from another hypergrad module,
no distribution hooks in the Trainer's module, and no import that runs up the floors."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import torch

import hypergrad as hg

PKG = Path(hg.__file__).resolve().parent


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PKG.parent)), ast.parse(p.read_text()))
            for p in sorted(PKG.rglob("*.py"))]


def _module_name(rel: str) -> str:
    return rel[:-3].replace("/", ".").removesuffix(".__init__")


def _absolute(rel: str, node: ast.ImportFrom) -> str:
    """The absolute module ``node`` imports from, inside ``rel``."""
    if not node.level:
        return node.module or ""
    parts = _module_name(rel).split(".")
    base = parts if rel.endswith("__init__.py") else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def test_the_public_surface_is_small_and_shadows_no_torch_name() -> None:
    assert len(hg.__all__) <= 35, hg.__all__
    assert len(set(hg.__all__)) == len(hg.__all__)
    shadows = {n for n in hg.__all__
               if hasattr(torch, n) and not inspect.ismodule(getattr(hg, n))}
    assert not shadows, f"{shadows} shadow torch's names"  # hypergrad.Tensor once did
    for name in hg.__all__:
        assert getattr(hg, name) is not None


def test_the_trainer_takes_at_most_eight_parameters_and_no_kwargs() -> None:
    params = list(inspect.signature(hg.Trainer.__init__).parameters.values())[1:]
    assert len(params) <= 8, [p.name for p in params]
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params)
    assert "_dist" not in (PKG / "run" / "trainer.py").read_text()


def test_no_private_name_crosses_modules() -> None:
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(rel, node)
                if source.startswith("hypergrad") and source != _module_name(rel):
                    found += [f"{rel}: from {source} import {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "\n".join(found)


RING = ("hypergrad.run", "hypergrad.distributed", "hypergrad.cli", "hypergrad.config")


def _in_ring(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in RING)


def test_the_engine_imports_nothing_of_the_ring_at_module_level() -> None:
    """The engine (hyperparameters, problem, HVPs, optimizers, methods, tasks, export, report)
    works without the run layer, distribution, the CLI or the configs: none of its modules pulls
    them in when imported (a deferred import inside a function is a choice made at run time)."""
    found = []
    for rel, tree in _modules():
        me = _module_name(rel)
        if _in_ring(me) or me == "hypergrad":
            continue
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and _in_ring(_absolute(rel, node)):
                found.append(f"{rel}: from {_absolute(rel, node)} import ...")
            if isinstance(node, ast.Import):
                found += [f"{rel}: import {a.name}" for a in node.names if _in_ring(a.name)]
    assert not found, "\n".join(found)
