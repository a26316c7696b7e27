"""How exact a float32 hypergradient is, against the float64 one of the same problem, on the CPU
or a GPU (where TF32 may round matrix products and convolutions to 10-bit mantissas).

    python experiments/benchmarks/bench_precision.py                 # CPU
    python experiments/benchmarks/bench_precision.py --device cuda   # GPU: TF32 off and on

For ``_common``'s mlp and cnn28 (K = 16: the learning rate and 15 example-group weights, SGD with
momentum and weight decay, T = 50 steps, batch 128): the hypergradient in float64 (forward mode;
reverse mode agrees to ~1e-15, tests/test_exactness.py) and in float32 by forward and by reverse
mode, their relative errors (2-norm) against float64 and against each other. On CUDA, once with
``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` both False and
once both True (torch's defaults: matmul False, cuDNN True, are also recorded and restored).
Last line: ``precision device=<d> worst_fp32_vs_fp64=<e> worst_tf32_vs_fp64=<e or n/a>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (str(HERE), str(HERE.parents[1])):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _common as C  # noqa: E402
import torch  # noqa: E402

import hypergrad as hg  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def rows(model: str, k: int, steps: int, dev: torch.device, tf32: bool | None
         ) -> dict[str, Any]:
    kw: dict[str, Any] = {"steps": steps, "device": dev, "data_dtype": torch.float64}
    p64 = C.make_problem(model, k, dtype=torch.float64, **kw)
    g64 = hg.ForwardMode().hypergradient(p64, p64.init_raw()).grad
    p32 = C.make_problem(model, k, dtype=torch.float32, **kw)
    lam = p32.init_raw()
    g_f = hg.ForwardMode().hypergradient(p32, lam).grad
    g_r = hg.ReverseMode().hypergradient(p32, lam).grad
    return {"model": model, "k": k, "T": steps, "tf32": tf32,
            "fwd32_vs_64": rel(g_f, g64), "rev32_vs_64": rel(g_r, g64),
            "fwd32_vs_rev32": rel(g_f, g_r), "norm64": float(g64.norm())}


COLS = [("model", "model", ""), ("k", "K", "d"), ("T", "T", "d"), ("tf32", "TF32", ""),
        ("fwd32_vs_64", "fwd32 vs 64", ".1e"), ("rev32_vs_64", "rev32 vs 64", ".1e"),
        ("fwd32_vs_rev32", "fwd32 vs rev32", ".1e")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", nargs="*", default=["mlp", "cnn28"])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = C.use_device(args.device)
    out: list[dict[str, Any]] = []
    settings: list[bool | None] = [None]
    defaults: dict[str, Any] = {}
    if dev.type == "cuda":
        b = torch.backends
        defaults = {"matmul.allow_tf32": b.cuda.matmul.allow_tf32,
                    "cudnn.allow_tf32": b.cudnn.allow_tf32}
        settings = [False, True]
    for tf32 in settings:
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        for m in args.models:
            r = rows(m, args.k, args.steps, dev, tf32)
            out.append(r)
            print(C.table([r], COLS).splitlines()[1], flush=True)
    if defaults:
        torch.backends.cuda.matmul.allow_tf32 = defaults["matmul.allow_tf32"]
        torch.backends.cudnn.allow_tf32 = defaults["cudnn.allow_tf32"]
    print()
    print(C.table(out, COLS))

    def worst(sel: list[dict[str, Any]]) -> str:
        if not sel:
            return "n/a"
        return f"{max(max(r['fwd32_vs_64'], r['rev32_vs_64']) for r in sel):.1e}"

    plain = [r for r in out if not r["tf32"]]
    tf = [r for r in out if r["tf32"]]
    line = (f"precision device={dev.type} worst_fp32_vs_fp64={worst(plain)} "
            f"worst_tf32_vs_fp64={worst(tf)}")
    payload = {"machine": C.machine(dev), "torch_defaults": defaults, "rows": out, "line": line}
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=1))
    print(line)


if __name__ == "__main__":
    main()
