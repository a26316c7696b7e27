"""The tangent step against a JAX peer: the same models, data, hyperparameters and update in both,
timed in alternated processes with the same threads.

The unit is **one forward-mode tangent step** after warm-up (and compilation): the gradient of
the training loss, the K Hessian-vector products (all columns of the tangent), and SGD's update
(momentum 0.9, weight decay 5e-4) with its tangent. K hyperparameters: the learning rate (log)
and K - 1 example-group weights of the loss (logit), so every column is live at every step.
Float32, batch 64 (the transformer: 16 sequences of 32), inputs and initial weights drawn once
with numpy and given to both.

- torch: the library's own step, ``hypergrad.ForwardMode().step`` on an ``InnerProblem`` (what
  ``ForwardMode`` and the ``Trainer`` run), as a long run has it: ``ForwardMode()`` decides after
  30 s of eager steps whether compiled products pay (``compile=None``); the child sets that
  threshold to 0 (``HYPERGRAD_AUTO_COMPILE_AFTER_S``), so the decision is made in the warm-up
  and the timed steps run what it chose (the table's ``chose`` column; the warm-up seconds
  include the measurement and the compilation). ``--compile eager``: ``ForwardMode(compile=
  False)``; ``--compile true``: ``ForwardMode(compile=True)``; ``--compile hvp``:
  ``ForwardMode(VmapVJP(compile=True))``.
- JAX: the idiomatic peer, ``jax.jit`` of one step written as ``vmap`` over the columns of
  ``jax.jvp`` of ``jax.grad`` of the loss (forward-over-reverse), the update and its tangent in
  closed form, the state and tangent buffers donated (``donate_argnums``) so XLA updates them in
  place. A JAX user would run a whole inner run under ``lax.scan`` (one dispatch for T steps);
  per step that removes only the dispatch cost (~10-30 us here), which the table reports as
  ``jax scan`` for the MLP rows.

Rows: ``mlp`` (digits-sized 64-64-10, tanh), ``wide_mlp`` (64-512-512-10, tanh), ``cnn``
(hypergrad.tasks' digits CNN: conv 3x3 1->8, conv 3x3 stride 2 8->16, linear), ``block`` (one
pre-LayerNorm transformer block: causal attention with 4 heads, d_model 64, feed-forward 256,
GELU, mean-pooled to a linear head), each at K = 16 and 64. Each side runs in its own process
(JAX and torch never share one), ``--rounds`` times alternated, each process timing ``--steps``
steps after warm-up; a row's ratio is the median over rounds of torch/JAX medians.

    python experiments/benchmarks/bench_vs_jax.py            # full table
    python experiments/benchmarks/bench_vs_jax.py --quick    # the worst row only (MLP, K = 16)

Needs the ``peers`` extra (``pip install -e ".[peers]"``: JAX on the CPU). The last line:
``vs_jax max_ratio=<worst torch/JAX> rows=<n> threads=<t>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BATCH = 64
SEQ, NSEQ, DMODEL, HEADS, FF = 32, 16, 64, 4, 256
MOM, WD, LR0, GW0 = 0.9, 5e-4, 0.05, 0.5
ROWS = [("mlp", 16), ("mlp", 64), ("wide_mlp", 16), ("wide_mlp", 64), ("cnn", 16), ("cnn", 64),
        ("block", 16), ("block", 64)]


# -- the shared definition: data and initial weights (numpy) --------------------------------------
def spec(model: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Initial weights ``{name: array}`` (torch's layouts and names), inputs and labels."""
    rng = np.random.default_rng(0)

    def lin(fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
        b = 1 / np.sqrt(fan_in)
        return (rng.uniform(-b, b, (fan_out, fan_in)).astype(np.float32),
                rng.uniform(-b, b, (fan_out,)).astype(np.float32))

    w: dict[str, np.ndarray] = {}
    if model in ("mlp", "wide_mlp"):
        sizes = [64, 64, 10] if model == "mlp" else [64, 512, 512, 10]
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            w[f"{2 * i}.weight"], w[f"{2 * i}.bias"] = lin(a, b)
        x = rng.normal(size=(4 * BATCH, 64)).astype(np.float32)
    elif model == "cnn":
        for name, (cin, cout) in (("1", (1, 8)), ("3", (8, 16))):
            b = 1 / np.sqrt(cin * 9)
            w[f"{name}.weight"] = rng.uniform(-b, b, (cout, cin, 3, 3)).astype(np.float32)
            w[f"{name}.bias"] = rng.uniform(-b, b, (cout,)).astype(np.float32)
        w["6.weight"], w["6.bias"] = lin(16 * 4 * 4, 10)
        x = rng.normal(size=(4 * BATCH, 64)).astype(np.float32)
    elif model == "block":
        w["ln1.weight"] = np.ones(DMODEL, np.float32)
        w["ln1.bias"] = np.zeros(DMODEL, np.float32)
        w["qkv.weight"], w["qkv.bias"] = lin(DMODEL, 3 * DMODEL)
        w["proj.weight"], w["proj.bias"] = lin(DMODEL, DMODEL)
        w["ln2.weight"] = np.ones(DMODEL, np.float32)
        w["ln2.bias"] = np.zeros(DMODEL, np.float32)
        w["ff1.weight"], w["ff1.bias"] = lin(DMODEL, FF)
        w["ff2.weight"], w["ff2.bias"] = lin(FF, DMODEL)
        w["head.weight"], w["head.bias"] = lin(DMODEL, 10)
        x = rng.normal(size=(4 * NSEQ, SEQ, DMODEL)).astype(np.float32)
    else:
        raise ValueError(f"bench_vs_jax: unknown model {model!r}")
    y = rng.integers(0, 10, size=x.shape[0]).astype(np.int64)
    return w, x, y


def batch_rows(model: str, t: int) -> slice:
    n = NSEQ if model == "block" else BATCH
    i = t % 4
    return slice(i * n, (i + 1) * n)


# -- torch -----------------------------------------------------------------------------------------
def torch_net(model: str) -> Any:
    """The torch model of a row, with the shared initial weights."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(DMODEL), nn.LayerNorm(DMODEL)
            self.qkv, self.proj = nn.Linear(DMODEL, 3 * DMODEL), nn.Linear(DMODEL, DMODEL)
            self.ff1, self.ff2 = nn.Linear(DMODEL, FF), nn.Linear(FF, DMODEL)
            self.head = nn.Linear(DMODEL, 10)
            self.register_buffer("mask", torch.triu(torch.full((SEQ, SEQ), float("-inf")), 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            q, kk, v = self.qkv(self.ln1(x)).split(d, -1)
            q, kk, v = (z.reshape(b, s, HEADS, d // HEADS).transpose(1, 2) for z in (q, kk, v))
            att = torch.softmax(q @ kk.transpose(-1, -2) / (d // HEADS) ** 0.5 + self.mask, -1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
            x = x + self.ff2(F.gelu(self.ff1(self.ln2(x))))
            return self.head(x.mean(1))

    if model in ("mlp", "wide_mlp"):
        sizes = [64, 64, 10] if model == "mlp" else [64, 512, 512, 10]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.Tanh()]
        net: nn.Module = nn.Sequential(*layers[:-1])
    elif model == "cnn":
        from hypergrad.tasks.digits import digits_cnn

        net = digits_cnn((8, 16), 10)
    else:
        net = Block()
    net.load_state_dict({**net.state_dict(),
                         **{n: torch.from_numpy(a) for n, a in spec(model)[0].items()}})
    return net


def torch_child(model: str, k: int, steps: int, threads: int, compile_mode: str | None
                ) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F

    import hypergrad as hg
    from hypergrad.alloc import tune_malloc

    tune_malloc()
    torch.set_num_threads(threads)
    w0, x_np, y_np = spec(model)

    net = torch_net(model)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    groups = k - 1

    def batches(t: int) -> Any:
        r = batch_rows(model, t)
        idx = torch.arange(r.start, r.stop)
        return x[r], y[r], idx

    def train_loss(m: Any, batch: Any, hp: Any) -> torch.Tensor:
        xb, yb, idx = batch
        nll = F.cross_entropy(m(xb), yb, reduction="none")
        return (hp["gw"][idx % groups] * nll).mean()

    def val_loss(m: Any, hp: Any) -> torch.Tensor:
        return F.cross_entropy(m(x[:16]), y[:16])

    hps = hg.HyperParams([hg.Scalar("lr", LR0, transform="log"),
                          hg.Array("gw", GW0, shape=(groups,), transform="logit")])
    problem = hg.InnerProblem(net, train_loss, hg.optim.sgd(lr="lr", momentum=MOM,
                                                            weight_decay=WD),
                              hps, batches, 1_000_000, val_loss)
    lam = problem.init_raw()
    if compile_mode == "hvp":  # the compiled HVP call only (VmapVJP(compile=True))
        method = hg.ForwardMode(hg.hvp.VmapVJP(compile=True))
    elif compile_mode is None:  # the default, deciding at its first step (see the docstring)
        import hypergrad.methods.forward as fwd

        fwd.AUTO_COMPILE_AFTER_S = 0.0
        method = hg.ForwardMode()
    elif compile_mode == "eager":
        method = hg.ForwardMode(compile=False)
    elif compile_mode.lower() in ("true", "1", "yes"):  # the documented ForwardMode(compile=True)
        method = hg.ForwardMode(compile=True)
    else:
        raise SystemExit(f"bench_vs_jax: --compile={compile_mode!r}: give eager, true or hvp")
    t0 = time.perf_counter()
    fs = method.init(problem, lam)
    fs = method.step(problem, fs, lam)  # step 0 (the momentum buffer starts), then warm-up
    for _ in range(3):
        fs = method.step(problem, fs, lam)
    warm = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        s = time.perf_counter()
        fs = method.step(problem, fs, lam)
        times.append(time.perf_counter() - s)
    z = fs.tangents.params
    rep = method.compile_report
    chose = ("compiled" if getattr(method.hvp, "compile", False) else "eager")
    return {"median_ms": 1e3 * statistics.median(times), "warmup_s": warm,
            "check": float(sum(v.double().abs().sum() for v in z.values())),
            "chose": chose, "compile_report": rep}


# -- JAX -------------------------------------------------------------------------------------------
def jax_net(model: str) -> Any:
    """The JAX twin of :func:`torch_net`: ``net(weights, inputs) -> logits``."""
    import jax
    import jax.numpy as jnp

    def net(w: dict[str, Any], xb: Any) -> Any:
        if model in ("mlp", "wide_mlp"):
            n = len(w) // 2
            h = xb
            for i in range(n):
                h = h @ w[f"{2 * i}.weight"].T + w[f"{2 * i}.bias"]
                if i < n - 1:
                    h = jnp.tanh(h)
            return h
        if model == "cnn":
            h = xb.reshape(-1, 1, 8, 8)
            dn = ("NCHW", "OIHW", "NCHW")
            h = jax.lax.conv_general_dilated(h, w["1.weight"], (1, 1), ((1, 1), (1, 1)),
                                             dimension_numbers=dn)
            h = jax.nn.relu(h + w["1.bias"][None, :, None, None])
            h = jax.lax.conv_general_dilated(h, w["3.weight"], (2, 2), ((1, 1), (1, 1)),
                                             dimension_numbers=dn)
            h = jax.nn.relu(h + w["3.bias"][None, :, None, None])
            return h.reshape(h.shape[0], -1) @ w["6.weight"].T + w["6.bias"]

        def ln(z: Any, g: Any, b: Any) -> Any:
            mu = z.mean(-1, keepdims=True)
            var = ((z - mu) ** 2).mean(-1, keepdims=True)
            return (z - mu) / jnp.sqrt(var + 1e-5) * g + b

        b_, s, d = xb.shape
        qkv = ln(xb, w["ln1.weight"], w["ln1.bias"]) @ w["qkv.weight"].T + w["qkv.bias"]
        q, kk, v = jnp.split(qkv, 3, -1)
        q, kk, v = (z.reshape(b_, s, HEADS, d // HEADS).transpose(0, 2, 1, 3)
                    for z in (q, kk, v))
        mask = jnp.triu(jnp.full((s, s), -jnp.inf), 1)
        att = jax.nn.softmax(q @ kk.transpose(0, 1, 3, 2) / (d // HEADS) ** 0.5 + mask, -1)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(b_, s, d)
        h = xb + o @ w["proj.weight"].T + w["proj.bias"]
        f = jax.nn.gelu(ln(h, w["ln2.weight"], w["ln2.bias"]) @ w["ff1.weight"].T
                        + w["ff1.bias"], approximate=False)
        h = h + f @ w["ff2.weight"].T + w["ff2.bias"]
        return h.mean(1) @ w["head.weight"].T + w["head.bias"]

    return net


def jax_child(model: str, k: int, steps: int, threads: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    w0, x_np, y_np = spec(model)
    x, y = jnp.asarray(x_np), jnp.asarray(y_np)
    groups = k - 1

    net = jax_net(model)

    def loss(w: Any, lam: Any, xb: Any, yb: Any, idx: Any) -> Any:
        logp = jax.nn.log_softmax(net(w, xb), -1)
        nll = -jnp.take_along_axis(logp, yb[:, None], 1)[:, 0]
        return (jax.nn.sigmoid(lam[1:])[idx % groups] * nll).mean()

    grad = jax.grad(loss)
    eye = jnp.eye(k, dtype=jnp.float32)

    def step(w: Any, m: Any, zw: Any, zm: Any, lam: Any, xb: Any, yb: Any, idx: Any) -> Any:
        g = grad(w, lam, xb, yb, idx)

        def col(z: Any, e: Any) -> Any:
            return jax.jvp(lambda w_, l_: grad(w_, l_, xb, yb, idx), (w, lam), (z, e))[1]

        gz = jax.vmap(col)(zw, eye)
        lr = jnp.exp(lam[0])
        dlr = lr * eye[:, 0]
        out_w, out_m, out_zw, out_zm = {}, {}, {}, {}
        for n in w:
            d = g[n] + WD * w[n]
            zd = gz[n] + WD * zw[n]
            mn = MOM * m[n] + d
            zmn = MOM * zm[n] + zd
            out_m[n], out_zm[n] = mn, zmn
            out_w[n] = w[n] - lr * mn
            out_zw[n] = zw[n] - lr * zmn - dlr.reshape((k,) + (1,) * mn.ndim) * mn
        return out_w, out_m, out_zw, out_zm

    jstep = jax.jit(step, donate_argnums=(0, 1, 2, 3))
    w = {n: jnp.asarray(a) for n, a in w0.items()}
    m = {n: jnp.zeros_like(a) for n, a in w.items()}
    zw = {n: jnp.zeros((k, *a.shape), a.dtype) for n, a in w.items()}
    zm = {n: jnp.zeros((k, *a.shape), a.dtype) for n, a in w.items()}
    lam = jnp.concatenate([jnp.log(jnp.asarray([LR0], jnp.float32)),
                           jnp.full((groups,), np.log(GW0 / (1 - GW0)), jnp.float32)])
    data = []
    for t in range(4):
        r = batch_rows(model, t)
        data.append((x[r], y[r], jnp.arange(r.start, r.stop)))
    t0 = time.perf_counter()
    for t in range(4):  # compile and warm up
        w, m, zw, zm = jstep(w, m, zw, zm, lam, *data[t % 4])
    jax.block_until_ready(zw)
    warm = time.perf_counter() - t0
    times = []
    for t in range(steps):
        s = time.perf_counter()
        w, m, zw, zm = jstep(w, m, zw, zm, lam, *data[t % 4])
        jax.block_until_ready(zw)
        times.append(time.perf_counter() - s)
    out = {"median_ms": 1e3 * statistics.median(times), "warmup_s": warm,
           "check": float(sum(jnp.abs(v).sum() for v in zw.values()))}
    if model == "mlp":  # what a JAX user would write for a whole run: lax.scan over the steps
        xs = tuple(jnp.stack([data[t % 4][i] for t in range(steps)]) for i in range(3))

        def run(carry: Any, inp: Any) -> Any:
            return step(*carry, lam, *inp), None

        scan = jax.jit(lambda c, xs_: jax.lax.scan(run, c, xs_)[0])
        jax.block_until_ready(scan((w, m, zw, zm), xs))
        reps = []
        for _ in range(3):
            s = time.perf_counter()
            jax.block_until_ready(scan((w, m, zw, zm), xs))
            reps.append((time.perf_counter() - s) / steps)
        out["scan_ms"] = 1e3 * statistics.median(reps)
    return out


# -- the parent: alternated processes -------------------------------------------------------------
def run_child(side: str, model: str, k: int, steps: int, threads: int,
              compile_mode: str | None) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": str(threads),
           "XLA_FLAGS": (f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
                         f"intra_op_parallelism_threads={threads}"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, __file__, "--child", side, "--model", model, "--k", str(k),
           "--steps", str(steps), "--threads", str(threads)]
    if compile_mode:
        cmd += ["--compile", compile_mode]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"bench_vs_jax: the {side} child of {model} K={k} failed:\n"
                           f"{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the worst row only: MLP, K = 16")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", nargs="*", default=None, help="e.g. mlp:16 cnn:64")
    ap.add_argument("--compile", default=None, help="torch side: ForwardMode(compile=...)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        steps = args.steps or 40
        res = (torch_child(args.model, args.k, steps, args.threads, args.compile)
               if args.child == "torch" else jax_child(args.model, args.k, steps, args.threads))
        print(json.dumps(res))
        return
    rows = ([tuple(r.split(":")) for r in args.rows] if args.rows else
            [("mlp", 16)] if args.quick else ROWS)
    rounds = args.rounds or (3 if args.quick else 3)
    steps = args.steps or (40 if args.quick else 30)
    results = []
    side = {None: "ForwardMode() (its choice after measuring)", "eager": "ForwardMode(compile="
            "False)", "hvp": "ForwardMode(VmapVJP(compile=True))"}.get(
        args.compile, f"ForwardMode(compile={args.compile!r})")
    print(f"# one forward-mode tangent step, float32, {args.threads} threads, torch side {side}"
          f", {rounds} alternated rounds of {steps} steps (medians)")
    head = (f"{'model':<10}{'K':>4}{'torch ms':>10}{'jax ms':>9}{'torch/jax':>10}"
            f"{'jax scan ms':>12}{'torch warm s':>13}{'jax warm s':>11}  chose")
    print(head)
    for model, k in rows:
        k = int(k)
        pairs = []
        for _ in range(rounds):
            tr = run_child("torch", model, k, steps, args.threads, args.compile)
            jr = run_child("jax", model, k, steps, args.threads, None)
            pairs.append((tr, jr))
        ratio = statistics.median(t["median_ms"] / j["median_ms"] for t, j in pairs)
        row = {"model": model, "K": k,
               "torch_ms": statistics.median(t["median_ms"] for t, _ in pairs),
               "jax_ms": statistics.median(j["median_ms"] for _, j in pairs),
               "ratio": ratio,
               "ratios": [t["median_ms"] / j["median_ms"] for t, j in pairs],
               "jax_scan_ms": (statistics.median(j["scan_ms"] for _, j in pairs)
                               if "scan_ms" in pairs[0][1] else None),
               "torch_warmup_s": statistics.median(t["warmup_s"] for t, _ in pairs),
               "jax_warmup_s": statistics.median(j["warmup_s"] for _, j in pairs),
               "torch_chose": [t.get("chose") for t, _ in pairs],
               "compile_reports": [t.get("compile_report") for t, _ in pairs],
               "check_rel_diff": abs(pairs[0][0]["check"] - pairs[0][1]["check"])
               / max(abs(pairs[0][1]["check"]), 1e-30)}
        results.append(row)
        scan = f"{row['jax_scan_ms']:12.3f}" if row["jax_scan_ms"] is not None else f"{'':>12}"
        print(f"{model:<10}{k:>4}{row['torch_ms']:10.3f}{row['jax_ms']:9.3f}{ratio:10.2f}{scan}"
              f"{row['torch_warmup_s']:13.1f}{row['jax_warmup_s']:11.1f}  "
              f"{'/'.join(str(c) for c in row['torch_chose'])}", flush=True)
    worst = max(r["ratio"] for r in results)
    out = {"quick": args.quick, "threads": args.threads, "rounds": rounds, "steps": steps,
           "compile": args.compile, "rows": results,
           "summary": {"max_ratio": worst, "rows": len(results)}}
    path = Path(args.json) if args.json else HERE / "results" / (
        "bench_vs_jax_quick.json" if args.quick else "bench_vs_jax.json")
    path.write_text(json.dumps(out, indent=1))
    print(f"# JSON: {path}")
    print(f"vs_jax max_ratio={worst:.2f} rows={len(results)} threads={args.threads}")


if __name__ == "__main__":
    main()
