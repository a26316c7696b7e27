"""Seed 001 reproduction: a custom convolution ``autograd.Function`` whose backward calls
``torch.nn.grad.conv2d_input`` / ``conv2d_weight``, against the built-in convolution backward, at
stride 1 and 2; the cost of a convolutional Hessian-vector product per column, in plain SGD
steps; and how much faster per FLOP oneDNN runs a convolution at the stacked shapes of a batched
step than at the per-column loop's (the ceiling of what batching gains in the convolutions).
All timed side by side in one process.

    python experiments/benchmarks/bench_conv.py          # full run
    python experiments/benchmarks/bench_conv.py --quick  # < 2 min
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

import hypergrad as hg  # noqa: E402


class NNGradConv2d(torch.autograd.Function):
    """The seed's ``op_Conv2D``: forward ``F.conv2d``, backward ``torch.nn.grad``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor, stride: int,  # type: ignore[override]
                padding: int) -> Tensor:
        ctx.save_for_backward(x, w, b)
        ctx.stride, ctx.padding = stride, padding
        return F.conv2d(x, w, b, stride, padding)

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> Any:  # type: ignore[override]
        x, w, b = ctx.saved_tensors
        gx = torch.nn.grad.conv2d_input(x.shape, w, gy, ctx.stride, ctx.padding)
        gw = torch.nn.grad.conv2d_weight(x, w.shape, gy, ctx.stride, ctx.padding)
        return gx, gw, gy.sum((0, 2, 3)), None, None


def conv_backward_times(shape: tuple[int, ...], cout: int, stride: int, padding: int,
                        repeats: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, requires_grad=True)
    w = (0.1 * torch.randn(cout, shape[1], 3, 3, generator=g)).requires_grad_()
    b = torch.zeros(cout, requires_grad=True)
    res: dict[str, Any] = {"input": "x".join(map(str, shape)), "cout": cout, "stride": stride}
    for name, fwd in (("builtin", lambda: F.conv2d(x, w, b, stride, padding)),
                      ("nn_grad", lambda: NNGradConv2d.apply(x, w, b, stride, padding))):
        res[f"{name}_fwd_ms"] = 1e3 * C.median_time(fwd, repeats, 2, min_seconds=0.2)
        y = fwd()
        gy = torch.randn_like(y)
        bwd = lambda y=y, gy=gy: torch.autograd.grad(y, (x, w, b), gy,  # noqa: E731
                                                     retain_graph=True)
        res[f"{name}_bwd_ms"] = 1e3 * C.median_time(bwd, repeats, 2, min_seconds=0.2)
    y1 = F.conv2d(x, w, b, stride, padding)
    y2 = NNGradConv2d.apply(x, w, b, stride, padding)
    gy = torch.randn_like(y1)
    g1 = torch.autograd.grad(y1, (x, w, b), gy)
    g2 = torch.autograd.grad(y2, (x, w, b), gy)
    res["max_rel_diff"] = max(hg.testing.rel_err(a, c) for a, c in zip(g2, g1))
    res["bwd_ratio"] = res["nn_grad_bwd_ms"] / res["builtin_bwd_ms"]
    res["builtin_bwd_over_fwd"] = res["builtin_bwd_ms"] / res["builtin_fwd_ms"]
    return res


def hvp_per_column(model: str, k: int, repeats: int) -> dict[str, Any]:
    """Cost of one Hessian-vector column of a CNN, in plain SGD steps: FLOPs (the floor), and
    time with the default batched strategy and with the per-column loop."""
    p = C.make_problem(model, k)
    lam = p.init_raw()
    fm = hg.ForwardMode()
    fs = fm.run(p, fm.init(p, lam), lam, stop=2)  # non-zero tangents
    s, z = fs.state, fs.tangents
    batch = p.batch(2)
    f = lambda pp, bb, lm: p.train_objective(pp, bb, lm, 2, batch)  # noqa: E731
    eye = torch.eye(k)
    plain = C.plain_stepper(p, lam)
    gradient = lambda: torch.func.grad(f, has_aux=True)(s.params, s.buffers, lam)  # noqa: E731
    t_plain = C.median_time(plain, 20, 3, min_seconds=0.5)
    t_grad = C.median_time(gradient, 20, 3, min_seconds=0.5)
    fl_plain = C.count_flops(plain)
    res: dict[str, Any] = {"model": model, "k": k, "plain_ms": 1e3 * t_plain}
    for name in ("vmap_vjp", "loop"):
        strat = C.make_strategy(name)
        call = lambda strat=strat: strat(f, s.params, s.buffers, lam,  # noqa: E731
                                         z.params, z.buffers, eye)
        t = C.median_time(call, repeats, 1)
        fl = C.count_flops(call) - C.count_flops(gradient)
        res[f"{name}_steps_per_col"] = (t - t_grad) / k / t_plain
        res["flop_steps_per_col"] = fl / k / fl_plain
    return res


def kernel_speeds(repeats: int) -> list[dict[str, Any]]:
    """How fast oneDNN runs cnn28's second convolution (16 -> 32 channels, 3x3, 28x28) at the
    shapes a per-column loop uses (batch 128) and at the stacked shapes a batched step of 8
    columns uses (batch 8 x 128, or 8 x 32 output channels), NCHW and channels-last: GFLOP/s and
    the share of a float32 matmul measured in the same run. The ceiling on what batching the
    columns can gain per FLOP in the convolutions."""
    g = torch.Generator().manual_seed(0)
    peak = C.matmul_peak()
    cl = torch.channels_last

    def conv(n: int, cout: int, layout: torch.memory_format,
             backward: bool) -> tuple[Any, float]:
        x = torch.randn(n, 16, 28, 28, generator=g).contiguous(memory_format=layout)
        w = torch.randn(cout, 16, 3, 3, generator=g).contiguous(memory_format=layout)
        flops = 2.0 * n * 28 * 28 * cout * 16 * 9
        if not backward:
            return (lambda: F.conv2d(x, w, padding=1)), flops
        gy = torch.randn(n, cout, 28, 28, generator=g).contiguous(memory_format=layout)
        return (lambda: torch.ops.aten.convolution_backward(
            gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
            [True, True, False])), 2 * flops

    cases = {
        ("forward", "batch 128 (loop)", "NCHW"): (128, 32, torch.contiguous_format, False),
        ("forward", "batch 8 x 128 (stacked inputs)", "NCHW"): (1024, 32,
                                                                torch.contiguous_format, False),
        ("forward", "batch 8 x 128 (stacked inputs)", "channels-last"): (1024, 32, cl, False),
        ("forward", "8 x 32 out channels (stacked weights)", "NCHW"): (
            128, 256, torch.contiguous_format, False),
        ("backward", "batch 128 (loop)", "NCHW"): (128, 32, torch.contiguous_format, True),
        ("backward", "batch 8 x 128 (stacked inputs)", "NCHW"): (1024, 32,
                                                                 torch.contiguous_format, True),
        ("backward", "batch 8 x 128 (stacked inputs)", "channels-last"): (1024, 32, cl, True),
    }
    calls, flops = {}, {}
    for key, args in cases.items():
        calls[key], flops[key] = conv(*args)
    times = C.interleaved_times(calls, repeats, 2, min_seconds=0.2)
    rows = []
    for (kind, shape, layout), t in times.items():
        base = times[(kind, "batch 128 (loop)", "NCHW")] / flops[(kind, "batch 128 (loop)",
                                                                  "NCHW")]
        rows.append({"kind": kind, "shape": shape, "layout": layout, "ms": 1e3 * t,
                     "gflops": flops[(kind, shape, layout)] / t / 1e9,
                     "peak_share": flops[(kind, shape, layout)] / t / 1e9 / peak,
                     "per_flop_vs_loop": base / (t / flops[(kind, shape, layout)])})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tuned = C.setup()
    mach = C.machine()
    C.print_machine(mach)
    print(f"# malloc tuned: {tuned}")
    repeats = 5 if args.quick else 15
    C.wait_quiet()

    shapes = [((32, 32, 3, 3), 32, 0, "seed 001's example")]
    shapes.append(((128, 16, 28, 28), 32, 1, "cnn28's second conv"))
    if not args.quick:
        shapes.append(((64, 64, 32, 32), 64, 1, "64 channels, 32x32"))
    crows = []
    for shape, cout, padding, what in shapes:
        for stride in (1, 2):
            r = conv_backward_times(shape, cout, stride, padding, repeats)
            r["what"] = what
            crows.append(r)
            print(C.table([r], CCOLS).splitlines()[1], flush=True)
    print("\n## custom Function with torch.nn.grad backward against the built-in backward")
    print(C.table(crows, CCOLS))

    hrows = [hvp_per_column(m, 16 if not args.quick else 4, 5 if args.quick else 7)
             for m in (("cnn28", "cnn28s2") if not args.quick else ("cnn8",))]
    print("\n## Hessian-vector product per column, in plain SGD steps")
    print(C.table(hrows, HCOLS))
    krows = kernel_speeds(repeats)
    print("\n## cnn28's second convolution: loop shapes against stacked (batched) shapes")
    print(C.table(krows, KCOLS))
    worst_bwd = max(r["bwd_ratio"] for r in crows if r["what"] != "seed 001's example")
    worst_hvp = max(r["vmap_vjp_steps_per_col"] for r in hrows)
    worst_flop = max(r["flop_steps_per_col"] for r in hrows)
    line = (f"nn_grad_vs_builtin_bwd max={worst_bwd:.2f} hvp_per_column max={worst_hvp:.2f} "
            f"SGD steps (FLOPs {worst_flop:.2f})")
    C.finish("bench_conv", {"machine": mach, "conv_backward": crows, "hvp": hrows,
                            "kernels": krows, "quick": args.quick}, args.json, line)


CCOLS = [("what", "case", ""), ("input", "input", ""), ("cout", "Cout", "d"),
         ("stride", "stride", "d"), ("builtin_fwd_ms", "fwd ms", ".3f"),
         ("builtin_bwd_ms", "bwd ms", ".3f"), ("nn_grad_bwd_ms", "nn.grad bwd ms", ".3f"),
         ("bwd_ratio", "nn.grad/builtin", ".2f"), ("builtin_bwd_over_fwd", "bwd/fwd", ".2f"),
         ("max_rel_diff", "rel diff", ".1e")]
KCOLS = [("kind", "pass", ""), ("shape", "shape", ""), ("layout", "layout", ""),
         ("ms", "ms", ".1f"), ("gflops", "GFLOP/s", ".0f"), ("peak_share", "peak", ".2f"),
         ("per_flop_vs_loop", "per FLOP vs loop shape", ".2f")]
HCOLS = [("model", "model", ""), ("k", "K", "d"), ("plain_ms", "SGD step ms", ".1f"),
         ("flop_steps_per_col", "FLOPs/col", ".2f"),
         ("vmap_vjp_steps_per_col", "time/col batched", ".2f"),
         ("loop_steps_per_col", "time/col loop", ".2f")]


if __name__ == "__main__":
    main()
