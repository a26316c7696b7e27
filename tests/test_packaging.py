"""The declared Python range is the one that is checked: ``requires-python``'s floor is the
version ruff and mypy target, the README's, and the interpreter CI prefers. The built wheel: a
user who installs ``hypergrad-forward`` (not an editable checkout) runs ``hypergrad-run``,
whose Hydra presets must ship inside the package (the packaging probe: the wheel had no
configs/, and every hypergrad-run command failed with "Primary config directory not
found")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_python_floor_is_declared_once_and_checked() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floor = re.fullmatch(r">=(\d+)\.(\d+)", meta["project"]["requires-python"])
    assert floor, meta["project"]["requires-python"]
    major, minor = int(floor[1]), int(floor[2])
    assert meta["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert meta["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    assert f"Python >= {major}.{minor}" in (ROOT / "README.md").read_text()
    assert f"python{major}.{minor}" in (ROOT / ".ci" / "run").read_text()
    assert sys.version_info >= (major, minor)



@pytest.mark.slow
def test_the_wheel_ships_the_configs_and_runs_hypergrad_run_from_elsewhere(
        tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:  # pyproject's build requirement
        pytest.skip(f"setuptools {setuptools.__version__} < 77 cannot build this pyproject")
    dist, target, away = tmp_path / "dist", tmp_path / "site", tmp_path / "away"
    away.mkdir()
    pip = [sys.executable, "-m", "pip"]
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, src, ignore=lambda d, names: [
        n for n in names if Path(d) == ROOT and n not in ("pyproject.toml", "README.md",
                                                          "LICENSE", "hypergrad", "configs")])
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("hypergrad_forward-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.removeprefix("hypergrad/configs/") for n in names
               if n.startswith("hypergrad/configs/") and n.endswith(".yaml")}
    assert shipped == {p.relative_to(ROOT / "configs").as_posix()
                       for p in (ROOT / "configs").rglob("*.yaml")}
    assert "hypergrad/py.typed" in names
    # pyproject lists the packages by hand (the presets are mapped into one): none left out
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "hypergrad").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert not any(n.startswith(("tests/", "experiments/", "docs/")) for n in names)
    subprocess.run([*pip, "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import hypergrad, hypergrad.config as c; "
                               "print(hypergrad.__file__); print(c.CONFIG_DIR)"],
        capture_output=True, text=True, cwd=away, env=env, timeout=120, check=True)
    module, configs = where.stdout.split()
    assert Path(module).is_relative_to(target) and Path(configs) == target / "hypergrad" / "configs"
    out = subprocess.run([sys.executable, "-m", "hypergrad.cli", "experiment=digits_schedule",
                          "debug=fast", "report.plots=false", "report.retrain=false",
                          f"hydra.run.dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, cwd=away, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / "results.json").exists()


def test_the_sdist_holds_what_its_tests_run() -> None:
    """The sdist left out experiments/, which 12 test files and the Makefile run: its own
    tests failed to collect (No module named 'suite', 'vs_optuna') and `make test` stopped at
    ruff (the packaging probe, 2026-12-07). The committed results (45 MB) stay out."""
    import tarfile
    import tempfile

    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77 or not (ROOT / ".git").exists():
        pytest.skip("needs setuptools >= 77 and a git checkout (its file list)")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for f in files:
            if (ROOT / f).is_file():
                (src / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / f, src / f)
        subprocess.run([sys.executable, "-c", "from setuptools import build_meta; "
                                              "build_meta.build_sdist('dist')"],
                       cwd=src, check=True, capture_output=True, timeout=300)
        (sdist,) = (src / "dist").glob("hypergrad_forward-*.tar.gz")
        with tarfile.open(sdist) as tar:
            names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    scripts = {f for f in files if f.startswith("experiments/") and f.endswith(".py")}
    assert scripts and scripts <= names, sorted(scripts - names)[:5]
    assert {f for f in files if f.startswith("tests/") and f.endswith(".py")} <= names
    assert "Makefile" in names and ".ci/run" in names
    # the results stay out but the plots the docs link to: the sdist's link test failed on
    # them (the wheel probe, 2026-12-07 evening)
    linked = {m for f in files if f.startswith("docs/") and f.endswith(".md")
              for m in re.findall(r"\.\./(experiments/results/[^)\s]+)", (ROOT / f).read_text())}
    assert linked and {n for n in names if n.startswith("experiments/results/")} == linked
