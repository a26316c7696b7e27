"""The documentation's Python examples run as written and state true claims.

Every ```python block of README.md and of each docs/*.md runs: the blocks of one file in order,
in one namespace, in a fresh empty working directory (as a reader would paste them into one
interpreter). Blocks end with ``assert`` statements that state what the prose around them
claims. A block that must not run here (a torchrun script, shell commands) is written as
```bash or ```text instead. The registries of methods and optimizers are restored afterwards,
so that the examples' own registrations do not leak into other tests.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import hypergrad
import hypergrad.methods.base as method_registry
import hypergrad.optim.base as optimizer_registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
RUN_BY = {"own-model.md": ROOT / "tests" / "test_own_model.py"}
"""Pages whose blocks are files and shell commands run by a test of their own (slow: it runs
``hypergrad-run``), not by :func:`test_python_blocks_run`."""
FENCE = re.compile(r"^```python\n(.*?)^```\s*$", flags=re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def python_blocks(page: Path) -> list[str]:
    return FENCE.findall(page.read_text())


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p) and p.name not in RUN_BY],
                         ids=_id)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(method_registry, "_REGISTRY", dict(method_registry._REGISTRY))
    monkeypatch.setattr(optimizer_registry, "_FACTORIES", dict(optimizer_registry._FACTORIES))
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for i, code in enumerate(python_blocks(page)):
        exec(compile(code, f"{_id(page)} [python block {i + 1}]", "exec"), namespace)


def test_every_page_has_examples_or_is_reference() -> None:
    assert python_blocks(ROOT / "README.md")
    for name in ("guide", "methods", "extending", "troubleshooting", "distributed", "configs"):
        assert python_blocks(DOCS / f"{name}.md"), name
    for page, test in RUN_BY.items():
        assert not (DOCS / page).exists() or test.exists(), f"docs/{page}: {test} is missing"


def test_readme_is_short_and_maps_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 16_000
    for page in DOCS.glob("*.md"):
        assert f"(docs/{page.name})" in readme, f"README's map lacks docs/{page.name}"
    assert not (ROOT / "BENCHMARKS.md").exists()  # moved to docs/benchmarks.md


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but ``-`` and ``_``
    dropped, spaces as ``-`` (code fences' comment lines are not headings)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_relative_links_resolve(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{_id(page)} links to {target}, which does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{_id(page)} links to {target}: no such heading"


def test_extending_modules_work_by_import_path(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/extending.md: its modules, saved as files, are found by import path (as in a
    launcher's worker or a torchrun rank that never ran the registration)."""
    monkeypatch.setattr(method_registry, "_REGISTRY", dict(method_registry._REGISTRY))
    monkeypatch.setattr(optimizer_registry, "_FACTORIES", dict(optimizer_registry._FACTORIES))
    for code in python_blocks(DOCS / "extending.md"):
        name = re.match(r"# (\w+)\.py\n", code)
        if name:
            (tmp_path / f"{name[1]}.py").write_text(code)
            monkeypatch.delitem(sys.modules, name[1], raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    method = hypergrad.methods.create("my_methods.ForwardFD")
    assert type(method).__module__ == "my_methods" and method.name == "forward_fd"
    assert type(hypergrad.methods.create("my_methods:ForwardFD")) is type(method)
    opt = hypergrad.optim.create("my_optimizers.normalized_sgd", lr="lr")
    assert type(opt).__module__ == "my_optimizers" and opt.bound_names() == {"lr": "lr"}
    clipped = hypergrad.optim.create("my_optimizers.normalized_sgd", lr="lr", clip_grad_norm=1.0)
    assert clipped.max_norm == 1.0 and clipped.name == "NormalizedSGD"
    for module in ("my_methods", "my_optimizers"):
        sys.modules.pop(module, None)


def test_api_page_lists_every_public_name() -> None:
    api = (DOCS / "api.md").read_text()
    for name in hypergrad.__all__:
        assert f"`{name}`" in api or f"`hypergrad.{name}`" in api, name
    for sub, names in {"methods": hypergrad.methods.__all__,
                       "distributed": hypergrad.distributed.__all__,
                       "run": hypergrad.run.__all__, "optim": hypergrad.optim.__all__,
                       "errors": hypergrad.errors.__all__}.items():
        for name in names:
            assert f"`{name}`" in api, f"hypergrad.{sub}.{name}"


def test_configs_page_lists_every_option_of_the_groups_it_tables() -> None:
    """docs/configs.md's table of groups names every YAML option of the groups whose options it
    spells out (charlm and custom were missing)."""
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| `([a-z_]+)` \| (.*?) \|", (DOCS / "configs.md").read_text(), re.M)}
    root = ROOT / "configs"
    for group in ("task", "model", "hyperparams", "outer_optimizer", "mode", "experiment",
                  "debug"):
        for option in sorted(p.stem for p in (root / group).glob("*.yaml")):
            assert f"`{option}`" in rows[group], (group, option)
