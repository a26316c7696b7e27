"""What a hypergradient costs against a plain run, with two (or more) versions of the code.

The suite's budgets (experiments/suite.py) are counted in plain runs, so a change that speeds
up plain runs more than hypergradients leaves the defaults fewer hypergradients per budget.
This extracts each git revision's tree (``git archive``) into a temporary folder and, in a
fresh process per revision (alternating, ``--rounds`` times), times on the suite's problems a
plain run and a reverse-mode hypergradient (the method the defaults pick there) at the initial
point: CPU seconds on one thread, median of ``--repeats`` after a warm-up. Each revision's
numbers are the medians over the rounds.

    python experiments/benchmarks/bench_code_versions.py                    # 2efeebb vs HEAD
    python experiments/benchmarks/bench_code_versions.py --code A B --problems wine_per_tensor_lr
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

# the suite's headline of 2026-11-29 (two batch orders) ran with this code
BEFORE = "2efeebb"
PROBLEMS = ("cancer_mlp_schedule", "wine_per_tensor_lr", "synth_regression_schedule",
            "diabetes_momentum", "digits_adam_schedule")

# runs in the revision's own tree: only what every version since 2026-11-26 has
CHILD = r'''
import json, statistics, sys, time, warnings
src, names, repeats = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
sys.path[:0] = [src, src + "/experiments"]
import torch
torch.set_num_threads(1)
import hypergrad as hg
import suite
out = {}
for name in names:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        task = suite.build(name, 0)
    p, lam = task.problem, task.problem.init_raw()
    method = hg.ReverseMode()
    with torch.no_grad():
        p.run(lam)
    method.hypergradient(p, lam)
    plain, hyper = [], []
    for _ in range(repeats):
        t0 = time.process_time()
        with torch.no_grad():
            p.run(lam)
        plain.append(time.process_time() - t0)
        t0 = time.process_time()
        method.hypergradient(p, lam)
        hyper.append(time.process_time() - t0)
    out[name] = {"plain_s": statistics.median(plain), "hypergradient_s": statistics.median(hyper)}
print(json.dumps(out))
'''


def extract(rev: str, into: Path) -> str:
    """The tree of git revision ``rev`` under ``into``; returns its full hash."""
    full = subprocess.run(["git", "-C", str(C.ROOT), "rev-parse", "--verify", rev + "^{commit}"],
                          capture_output=True, text=True)
    if full.returncode:
        raise SystemExit(f"--code {rev!r} is not a commit of {C.ROOT}: {full.stderr.strip()}")
    into.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(C.ROOT), "archive", full.stdout.strip()],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return full.stdout.strip()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", nargs="+", default=[BEFORE, "HEAD"], help="git revisions")
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="JSON path (default: results/)")
    ap.add_argument("--no-wait", action="store_true",
                    help="do not wait for a quiet CPU before each process")
    args = ap.parse_args(argv)
    if args.no_wait:
        C.no_wait()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    got: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {rev: (extract(rev, Path(tmp) / str(i)), Path(tmp) / str(i))
                 for i, rev in enumerate(args.code)}
        for _ in range(args.rounds):
            for rev, (_, tree) in trees.items():
                C.wait_quiet(max_wait=600)
                run = subprocess.run([sys.executable, "-c", CHILD, str(tree),
                                      ",".join(args.problems), str(args.repeats)],
                                     capture_output=True, text=True, env=env, cwd=tmp)
                if run.returncode:
                    raise SystemExit(f"{rev}: {run.stderr.strip()[-2000:]}")
                for name, r in json.loads(run.stdout.strip().splitlines()[-1]).items():
                    got.setdefault(rev, {}).setdefault(name, []).append(r)
    rows, res = [], {}
    for rev, probs in got.items():
        res[rev] = {"commit": trees[rev][0], "problems": {}}
        for name, rs in probs.items():
            plain = statistics.median(r["plain_s"] for r in rs)
            hyper = statistics.median(r["hypergradient_s"] for r in rs)
            res[rev]["problems"][name] = {"plain_s": plain, "hypergradient_s": hyper,
                                          "plain_runs": hyper / plain}
            rows.append({"code": rev, "problem": name, "plain": plain * 1e3,
                         "hyper": hyper * 1e3, "ratio": hyper / plain})
        res[rev]["median_plain_runs"] = statistics.median(
            r["plain_runs"] for r in res[rev]["problems"].values())
    print(C.table(rows, [("code", "code", "s"), ("problem", "problem", "s"),
                         ("plain", "plain run (ms)", ".1f"), ("hyper", "hypergradient (ms)", ".1f"),
                         ("ratio", "in plain runs", ".2f")]))
    payload = {"machine": C.machine(), "rounds": args.rounds, "repeats": args.repeats,
               "code": res}
    line = "code_versions " + " ".join(f"{rev}={r['median_plain_runs']:.2f}"
                                       for rev, r in res.items())
    C.finish("bench_code_versions", payload, args.out, line)
    return payload


if __name__ == "__main__":
    main()
