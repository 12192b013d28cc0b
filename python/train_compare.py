"""Train GPT-2 small and ResNet-50 on PyTorch's native allocator and on
cachalot (through the C++ shim, `cachalot_torch.install()`; `--mode
pluggable` for the older CUDAPluggableAllocator path), each run in its own
process, and
compare: losses bit-identical at every step, cachalot's peak reserved <=
native's, median step time within 2% of native (--max-ratio 1.02). Both
the driver and the --pairs timing mode exit 1 when a check fails.

Driver (the default): for each model runs native, native, cachalot in
separate processes (the two native runs show first that the training is
bit-reproducible), prints a table and exits 1 when a check fails:

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 python/train_compare.py \
        --lib target/release/libcachalot_capi.so [--steps 3] [--models gpt2,resnet50]

One run (what the driver starts): prints one line `RESULT {json}`:

    python3 python/train_compare.py --run gpt2 --allocator cachalot --lib ...

The model `graphed` is a CUDA-graphed training step: a 6-layer MLP
(2048 wide) through torch.cuda.make_graphed_callables, AdamW outside the
graph; its result also has the bytes of the graph's private pools
("graph_pool_bytes", from the snapshot), which cachalot must keep <= native's.

Models: GPT-2 small (transformers GPT2Config defaults: 12 layers, 768 wide,
random init, eager attention), batch 8 x 512 tokens; ResNet-50 (torchvision,
random init), batch 64 x 3 x 224 x 224, 1000 classes. Both: fixed seeds, bf16
autocast, AdamW (lr 1e-4), torch.use_deterministic_algorithms(True),
CUBLAS_WORKSPACE_CONFIG=:4096:8, cuDNN benchmark off. Data are random
tensors made on the CPU from a fixed seed (no downloads).

Step time: torch.cuda.synchronize() before and after each step (zero_grad,
forward, backward, optimizer step), wall clock in between; the reported
figure is the median over steps 2..N (step 1 carries the allocator's cold
start, cuBLAS/cuDNN handle creation and lazy module loading, and is shown
separately).
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

HERE = Path(__file__).resolve().parent
MODELS = ("gpt2", "resnet50", "graphed")
CUBLAS_CONF = ":4096:8"


# ----------------------------------------------------------------- one run


def _mean_pool_class():
    import torch

    class MeanPool(torch.nn.Module):
        def forward(self, x):
            return x.mean((2, 3), keepdim=True)

    return MeanPool


def build(model: str, torch):
    """(module, make_batch, loss_fn) on the CPU, from seed 0."""
    torch.manual_seed(0)
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        try:
            cfg = GPT2Config(n_positions=1024, attn_implementation="eager")
        except TypeError:
            cfg = GPT2Config(n_positions=1024)
            cfg._attn_implementation = "eager"
        m = GPT2LMHeadModel(cfg)
        g = torch.Generator().manual_seed(1)
        batches = [
            torch.randint(0, cfg.vocab_size, (8, 512), generator=g) for _ in range(4)
        ]

        def loss_fn(m, batch):
            return m(input_ids=batch, labels=batch).loss

        return m, batches, loss_fn
    if model == "resnet50":
        import torchvision

        MeanPool = _mean_pool_class()
        m = torchvision.models.resnet50(weights=None)
        # AdaptiveAvgPool2d((1, 1)) as the mean it computes (PyTorch itself
        # lowers a 1x1 adaptive pool to mean); this keeps the deterministic
        # mode from rejecting adaptive_avg_pool2d_backward on any version.
        m.avgpool = MeanPool()
        g = torch.Generator().manual_seed(1)
        batches = [
            (torch.randn(64, 3, 224, 224, generator=g), torch.randint(0, 1000, (64,), generator=g))
            for _ in range(4)
        ]

        def loss_fn(m, batch):
            x, y = batch
            return torch.nn.functional.cross_entropy(m(x), y)

        return m, batches, loss_fn
    if model == "graphed":
        layers = []
        for _ in range(6):
            layers += [torch.nn.Linear(2048, 2048), torch.nn.GELU()]
        m = torch.nn.Sequential(*layers, torch.nn.Linear(2048, 1))
        g = torch.Generator().manual_seed(1)
        batches = [torch.randn(256, 2048, generator=g) for _ in range(4)]

        def loss_fn(m, batch):
            return m(batch).float().pow(2).mean()

        return m, batches, loss_fn
    raise SystemExit(f"unknown model {model!r} (expected one of {', '.join(MODELS)})")


def graph_pool_bytes(torch) -> int:
    """Bytes of the segments of private pools (CUDA graphs), from the snapshot."""
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))


def run_one(model: str, allocator: str, steps: int, lib: str | None, config: str | None,
            mode: str = "shim") -> dict:
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") != CUBLAS_CONF:
        raise SystemExit(f"set CUBLAS_WORKSPACE_CONFIG={CUBLAS_CONF} before starting Python")
    import torch

    if allocator == "cachalot":
        sys.path.insert(0, str(HERE))
        import cachalot_torch

        cachalot_torch.install(config=config, mode=mode, lib_path=lib)
    elif allocator != "native":
        raise SystemExit(f"unknown allocator {allocator!r}")

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    m, batches, loss_fn = build(model, torch)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    m = m.to(dev)
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    if model == "graphed":
        # forward and backward of the whole MLP captured once (bf16 autocast
        # is not used for the graphed model: fp32 throughout)
        sample = batches[0].to(dev).requires_grad_(False)
        m = torch.cuda.make_graphed_callables(m, (sample,))

    def to_dev(b):
        return tuple(t.to(dev) for t in b) if isinstance(b, tuple) else b.to(dev)

    losses, times = [], []
    for i in range(steps):
        batch = to_dev(batches[i % len(batches)])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=model != "graphed"):
            loss = loss_fn(m, batch)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach().float().item()))
        del batch, loss

    if allocator == "native" or mode == "shim":
        # in shim mode torch's own figures are cachalot's
        st = torch.cuda.memory_stats(dev)
        backend = torch.cuda.memory.get_allocator_backend()
    else:
        st = cachalot_torch.memory_stats(0)
        backend = "cachalot-pluggable:" + cachalot_torch.backend_name()
    return {
        "model": model,
        "allocator": allocator,
        "backend": backend,
        "torch": torch.__version__,
        "attn": getattr(getattr(m, "config", None), "_attn_implementation", None),
        "gpu": torch.cuda.get_device_name(dev),
        "steps": steps,
        "losses": [x.hex() for x in losses],
        "step_s": times,
        "peak_reserved": st["reserved_bytes.all.peak"],
        "peak_allocated": st["allocated_bytes.all.peak"],
        "num_device_alloc": st.get("num_device_alloc"),
        "num_alloc_retries": st.get("num_alloc_retries"),
        "graph_pool_bytes": graph_pool_bytes(torch) if mode == "shim" or allocator == "native" else None,
    }


# ------------------------------------------------------------------- smoke


def smoke(lib: str | None) -> int:
    """cachalot under PyTorch on a real GPU: a matmul on the default stream,
    a tensor allocated on a side stream (a raw cudaStream_t cachalot has not
    seen: adopted with wrap_stream), record_stream through ctypes, bad frees
    (errors, not crashes), empty_cache. Prints SMOKE OK."""
    import ctypes

    import torch

    sys.path.insert(0, str(HERE))
    import cachalot_torch

    cachalot_torch.install(mode="pluggable", lib_path=lib)
    c = cachalot_torch.load()
    x = torch.randn(1024, 1024, device="cuda")
    y = x @ x
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        z = torch.ones(4 << 20, device="cuda") * 2
    torch.cuda.current_stream().wait_stream(side)
    rc = c.cachalot_record_stream(z.data_ptr(), 0, None)
    assert rc == 0, c.cachalot_last_error()
    total = float((y.sum() + z.sum()).item())
    del z
    c.cachalot_set_error_logging(0)
    c.cachalot_free(ctypes.c_void_p(0x1234), 8, 0, None)
    bad_ptr = c.cachalot_last_error_code()
    c.cachalot_free(ctypes.c_void_p(x.data_ptr()), 8, 5, None)
    bad_dev = c.cachalot_last_error_code()
    assert (bad_ptr, bad_dev) == (4, 1), (bad_ptr, bad_dev)
    torch.cuda.synchronize()
    st = cachalot_torch.memory_stats(0)
    cachalot_torch.empty_cache()
    st2 = cachalot_torch.memory_stats(0)
    print(f"smoke: backend={cachalot_torch.backend_name()} sum={total:.1f} "
          f"reserved={st['reserved_bytes.all.current']:,} -> {st2['reserved_bytes.all.current']:,} "
          f"after empty_cache, device allocs={st2['num_device_alloc']}, frees={st2['num_device_free']}, "
          f"bad ptr -> {bad_ptr}, bad device -> {bad_dev}")
    print("SMOKE OK")
    return 0


# ------------------------------------------------------------------ driver


def child(model: str, allocator: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run", model,
           "--allocator", allocator, "--steps", str(args.steps)]
    if args.lib:
        cmd += ["--lib", args.lib]
    if args.config:
        cmd += ["--config", args.config]
    cmd += ["--mode", args.mode]
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=CUBLAS_CONF, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            r["process_s"] = wall
            return r
    sys.stderr.write(p.stdout[-4000:] + p.stderr[-8000:])
    raise RuntimeError(f"{model}/{allocator}: no RESULT (exit {p.returncode})")


def median_after_first(times):
    rest = times[1:] or times
    return statistics.median(rest)


def drive(args) -> int:
    models = [m for m in args.models.split(",") if m]
    ok = True
    rows, results, graph_rows = [], [], []
    for model in models:
        runs = [child(model, a, args) for a in ("native", "native", "cachalot")]
        results += runs
        n1, n2, ca = runs
        same_native = n1["losses"] == n2["losses"]
        same_cachalot = n1["losses"] == ca["losses"]
        peak_ok = ca["peak_reserved"] <= min(n1["peak_reserved"], n2["peak_reserved"])
        native_t = statistics.mean([median_after_first(n1["step_s"]), median_after_first(n2["step_s"])])
        ca_t = median_after_first(ca["step_s"])
        ratio = ca_t / native_t
        time_ok = ratio <= args.max_ratio
        ok &= same_native and same_cachalot and peak_ok and time_ok
        print(f"\n== {model}: {n1['gpu']}, torch {n1['torch']}, {args.steps} steps")
        print(f"{'step':>4}  {'native #1':<24} {'native #2':<24} {'cachalot':<24}")
        for i in range(args.steps):
            print(f"{i + 1:>4}  {n1['losses'][i]:<24} {n2['losses'][i]:<24} {ca['losses'][i]:<24}")
        print(f"{'':>4}  {'peak reserved B':<18} {'peak alloc B':<14} {'dev allocs':>10} "
              f"{'step1 ms':>9} {'median 2..N ms':>15}")
        for r in runs:
            print(f"{r['allocator']:>8}  {r['peak_reserved']:<18,} {r['peak_allocated']:<14,} "
                  f"{r['num_device_alloc']!s:>10} {r['step_s'][0] * 1e3:>9.2f} "
                  f"{median_after_first(r['step_s']) * 1e3:>15.3f}")
        rows.append((model, same_native, same_cachalot, n1["peak_reserved"], n2["peak_reserved"],
                     ca["peak_reserved"], peak_ok, native_t, ca_t, ratio, time_ok))
        if ca.get("graph_pool_bytes") is not None and n1.get("graph_pool_bytes") is not None:
            gp_ok = ca["graph_pool_bytes"] <= n1["graph_pool_bytes"]
            ok &= gp_ok
            graph_rows.append((model, n1["graph_pool_bytes"], ca["graph_pool_bytes"], gp_ok))

    print("\n| model | native==native | cachalot==native | peak reserved native | peak reserved cachalot "
          "| cachalot<=native | median step native (mean of 2 runs) | median step cachalot | ratio "
          f"| within {args.max_ratio - 1:.0%} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (model, sn, sc, p1, p2, pc, pok, nt, ct, ratio, tok) in rows:
        print(f"| {model} | {'yes' if sn else 'NO'} | {'yes' if sc else 'NO'} | {p1:,} / {p2:,} | {pc:,} "
              f"| {'yes' if pok else 'NO'} | {nt * 1e3:.3f} ms | {ct * 1e3:.3f} ms | {ratio:.4f} "
              f"| {'yes' if tok else 'NO'} |")
    if graph_rows:
        print("\n| model | graph-pool bytes native | graph-pool bytes cachalot | cachalot<=native |")
        print("|---|---|---|---|")
        for (model, gn, gc, gok) in graph_rows:
            print(f"| {model} | {gn:,} | {gc:,} | {'yes' if gok else 'NO'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\nALL CHECKS PASSED" if ok else "\nSOME CHECK FAILED")
    return 0 if ok else 1


def drive_pairs(args) -> int:
    """Timing with less process-to-process noise: `--pairs K` alternates
    native and cachalot processes K times per model (N C N C ...), checks
    every run's losses against the first native run, and compares the median
    over processes of each process's median step time (steps 2..N).
    Criterion, per model (exit 1 when one fails): losses identical in every
    run, cachalot's peak reserved <= native's, and the ratio of the medians
    of medians cachalot / native <= --max-ratio (default 1.02)."""
    models = [m for m in args.models.split(",") if m]
    ok = True
    print(f"\n| model | runs (alternating) | losses identical | peak reserved native / cachalot "
          f"| per-process median step, native (ms) | same, cachalot (ms) | median of medians native / cachalot "
          f"| ratio | within {args.max_ratio - 1:.0%} |")
    print("|---|---|---|---|---|---|---|---|---|")
    results = []
    for model in models:
        runs = []
        for _ in range(args.pairs):
            runs += [child(model, "native", args), child(model, "cachalot", args)]
        results += runs
        ref = runs[0]["losses"]
        same = all(r["losses"] == ref for r in runs)
        nat = [median_after_first(r["step_s"]) * 1e3 for r in runs if r["allocator"] == "native"]
        cac = [median_after_first(r["step_s"]) * 1e3 for r in runs if r["allocator"] == "cachalot"]
        pn = max(r["peak_reserved"] for r in runs if r["allocator"] == "native")
        pc = max(r["peak_reserved"] for r in runs if r["allocator"] == "cachalot")
        mn, mc = statistics.median(nat), statistics.median(cac)
        time_ok = mc / mn <= args.max_ratio
        ok &= same and pc <= pn and time_ok
        print(f"| {model} | {len(runs)} x {args.steps} steps | {'yes' if same else 'NO'} | {pn:,} / {pc:,} "
              f"| {' '.join(f'{t:.1f}' for t in nat)} | {' '.join(f'{t:.1f}' for t in cac)} "
              f"| {mn:.2f} / {mc:.2f} | {mc / mn:.4f} | {'yes' if time_ok else 'NO'} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\nALL CHECKS PASSED" if ok else "\nSOME CHECK FAILED")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", choices=MODELS, help="one run of this model (child mode)")
    ap.add_argument("--smoke", action="store_true", help="a quick check of cachalot under PyTorch")
    ap.add_argument("--allocator", choices=("native", "cachalot"), default="native")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--lib", default=None, help="path of libcachalot_capi.so")
    ap.add_argument("--config", default=None, help="cachalot config string")
    ap.add_argument("--mode", choices=("shim", "pluggable"), default="shim",
                    help="how cachalot is installed (default: the C++ shim)")
    ap.add_argument("--json", default=None, help="driver: write all runs' results here")
    ap.add_argument("--pairs", type=int, default=0,
                    help="timing mode: K alternating native/cachalot process pairs per model")
    ap.add_argument("--max-ratio", type=float, default=1.02,
                    help="largest accepted median step time cachalot / native (both modes)")
    args = ap.parse_args()
    if args.smoke:
        return smoke(args.lib)
    if args.run:
        r = run_one(args.run, args.allocator, args.steps, args.lib, args.config, args.mode)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    if args.pairs > 0:
        return drive_pairs(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
