"""A method defined outside the package, selected by name where runs happen: in the workers of a
2-job joblib multirun of ``hypergrad-run`` and on 2 torchrun ranks, where no import done in a
parent process can have registered it. The user's package declares it by an entry point
(``hypergrad.methods``); the method changes the hypergradient (it discounts the tangents), so
the result shows that the user's code ran, not forward mode's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fixtures import rank_env

import hypergrad as hg

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

USER_MODULE = '''
"""A user's method: forward mode whose tangents are halved before every step."""
from torch.utils._pytree import tree_map

import hypergrad as hg


class Halved(hg.ForwardMode, name="halved_forward"):
    def step(self, problem, fs, lam, *, columns=None):
        fs = fs._replace(tangents=tree_map(lambda z: 0.5 * z, fs.tangents))
        return super().step(problem, fs, lam, columns=columns)
'''

TORCHRUN_SCRIPT = '''
import sys, torch
import hypergrad as hg
from hypergrad.testing import digits_case

problem = digits_case("momentum", "schedule", steps=8, n_train=32, batch_size=8, hidden=8,
                      n_val=32, windows=4)
with hg.distributed.launch():
    trainer = hg.Trainer(problem, method="halved_forward", mode=hg.Offline(outer_steps=2),
                         callbacks=[hg.run.Progress(False)], strategy=hg.distributed.Ranks())
    res = trainer.fit()
    torch.save({"method": repr(trainer.method), "lam": res.lam,
                "grads": [h["hypergrad_norm"] for h in res.history]},
               f"{sys.argv[1]}/rank{hg.distributed.rank()}.pt")
'''


@pytest.fixture(scope="module")
def user_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the user's module and the metadata of an installed package that
    declares it as an entry point (what ``pip install`` of a package with
    ``[project.entry-points."hypergrad.methods"] halved_forward = "user_methods:Halved"``
    leaves in site-packages)."""
    site = tmp_path_factory.mktemp("site")
    (site / "user_methods.py").write_text(textwrap.dedent(USER_MODULE))
    info = site / "user_methods-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: user-methods\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hypergrad.methods]\n"
                                           "halved_forward = user_methods:Halved\n")
    return site


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, **rank_env(2), "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1",
            "PYTHONPATH": os.pathsep.join([str(site), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")])}


def test_a_user_method_by_name_in_a_joblib_multirun(user_package: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hypergrad.cli", "--multirun", "experiment=ridge_diabetes",
         "debug=fast", "seed=0,1", "method=halved_forward", "hydra/launcher=joblib",
         "hydra.launcher.n_jobs=2", "report.plots=false", "report.retrain=false",
         f"hydra.sweep.dir={tmp_path}"],
        capture_output=True, text=True, env=_env(user_package), cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = sorted(tmp_path.glob("*/results.json"))
    assert len(results) == 2
    for path in results:
        res = json.loads(path.read_text())
        assert res["method"] == "halved_forward"
        cfg = (path.parent / "config_resolved.yaml").read_text()
        assert "_target_: user_methods.Halved" in cfg
    # the worker ran the user's method: its first hypergradient is not forward mode's
    first = json.loads((tmp_path / "0" / "metrics.jsonl").read_text().splitlines()[0])
    forward = subprocess.run(
        [sys.executable, "-m", "hypergrad.cli", "experiment=ridge_diabetes", "debug=fast",
         "seed=0", "report.plots=false", "report.retrain=false",
         f"hydra.run.dir={tmp_path / 'forward'}"],
        capture_output=True, text=True, env=_env(user_package), cwd=tmp_path, timeout=600)
    assert forward.returncode == 0, forward.stderr[-3000:]
    ref = json.loads((tmp_path / "forward" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-12)  # same point
    assert first["hypergrad_norm"] < 0.9 * ref["hypergrad_norm"]  # another hypergradient


@pytest.mark.usefixtures("isolated_registries")
def test_a_user_method_by_name_on_two_torchrun_ranks(user_package: Path, tmp_path: Path) -> None:
    script = tmp_path / "tune.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT))
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script), str(tmp_path)],
        capture_output=True, text=True, env=_env(user_package), cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for r in ranks:
        assert r["method"].startswith("ParallelForward(Halved(") and "columns=2" in r["method"]
    assert torch.equal(ranks[0]["lam"], ranks[1]["lam"])
    # one process, the same user method: the same tuning (columns split exactly)
    sys.path.insert(0, str(user_package))
    try:
        import user_methods  # noqa: F401  (registers halved_forward here too)

        from hypergrad.testing import digits_case

        # on the ranks' device (the CPU unless there is a GPU per rank: fixtures.rank_env)
        device = rank_env(2).get("HYPERGRAD_TEST_DEVICE")
        problem = digits_case("momentum", "schedule", steps=8, n_train=32, batch_size=8,
                              hidden=8, n_val=32, windows=4, device=device)
        one = hg.Trainer(problem, method="halved_forward", mode=hg.Offline(outer_steps=2),
                         callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
        plain = hg.Trainer(problem, method="forward", mode=hg.Offline(outer_steps=2),
                           callbacks=[hg.run.Log(None), hg.run.Progress(False)]).fit()
    finally:
        sys.path.remove(str(user_package))
    torch.testing.assert_close(ranks[0]["lam"], one.lam, rtol=1e-12, atol=1e-14)
    assert ranks[0]["grads"] == pytest.approx([h["hypergrad_norm"] for h in one.history],
                                              rel=1e-10)
    assert not torch.equal(one.lam, plain.lam)


def test_every_registered_method_name_runs_in_the_trainer(tmp_path: Path) -> None:
    """``Trainer(method=<name>)`` takes every registered name (issue 24.8: ``'implicit'`` was
    refused while other names were accepted); online-only methods run online."""
    from hypergrad.methods import OnlineMethod, registered
    from hypergrad.testing import ridge_diabetes_case

    problem, _ = ridge_diabetes_case(300)  # near the optimum, as implicit needs
    for name, cls in registered().items():
        online = issubclass(cls, OnlineMethod) and name != "forward"
        mode = hg.Online(interval=150) if online else hg.Offline(outer_steps=1)
        res = hg.Trainer(problem, name, mode=mode,
                         folder=hg.RunFolder(tmp_path / name), callbacks=[]).fit()
        assert res.method == name or (name == "auto" and res.method in registered()), name
        assert torch.isfinite(torch.tensor(res.history[0]["val_loss"])), name
        assert (tmp_path / name / "metrics.jsonl").is_file(), name
