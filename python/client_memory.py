"""Real PyTorch clients on four allocators, for peak reserved memory (issue 15,
item 6): native default, native `expandable_segments:True`, cachalot's
default (its low-memory mode: expandable segments with page recycling) and
cachalot's fixed segments (`expandable_segments:False`), each in its own
process, with the same outputs required.

Workloads (random weights, fixed seeds, no downloads):
- `bert`: BERT-base inference (transformers `BertModel(BertConfig())`, eval,
  no grad, fp32, deterministic algorithms) on REQUESTS requests of random
  batch size (1..48) and sequence length (16..512); the output of every
  request is summed in float64 on the GPU and the sums are compared bit
  for bit.
- `gpt2`: GPT-2 small training steps, as `train_compare.py --run gpt2`
  (bf16 autocast, AdamW); the losses are compared bit for bit.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 python/client_memory.py \\
        --lib dist/cuda/lib/libcachalot_capi.so [--workloads bert,gpt2]

One run (what the driver starts) prints `RESULT {json}`:

    python3 python/client_memory.py --run bert --allocator cachalot \\
        --config expandable_segments:False --lib ...

The driver prints a table (peak reserved MiB, peak allocated MiB, device
allocations, the workload's wall time (synchronized; model set-up
excluded for `bert`), whether the outputs equal native's) and exits 1 when cachalot's
default reserves more than native expandable at its peak, an output
differs, or a cachalot run leaves more than 64 MiB reserved beyond its
allocated bytes after `empty_cache` at the end. A bert run also records its
peak reserved after 60, 250, 1,000, 3,000, 5,000 and 10,000 requests and at its
last (`--requests 3000`: a soak; the table shows whether memory creeps).
`--ways native-expandable,cachalot` runs only those (the outputs are then
compared with the first way's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CUBLAS_CONF = ":4096:8"
# (name, allocator, config): the config is PyTorch's for native, cachalot's for cachalot
WAYS = (
    ("native", "native", None),
    ("native-expandable", "native", "expandable_segments:True"),
    ("cachalot", "cachalot", None),
    ("cachalot-fixed", "cachalot", "expandable_segments:False"),
)


# request counts at which a bert run records its peak reserved so far (the
# soak's trajectory: memory that creeps up over a long run shows here)
CHECKPOINTS = (60, 250, 1000, 3000, 5000, 10000)


def run_bert(torch, requests: int, clock: dict, trajectory: list) -> list[str]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    m = BertModel(BertConfig()).to("cuda").eval()
    rng = random.Random(1234)
    sums = []
    torch.cuda.synchronize()
    clock["start"] = time.perf_counter()
    with torch.no_grad():
        for i in range(requests):
            b, s = rng.randint(1, 48), rng.randint(16, 512)
            ids = torch.randint(0, 30522, (b, s), generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
            out = m(input_ids=ids.to("cuda")).last_hidden_state
            sums.append(float(out.double().sum().item()).hex())
            del out, ids
            if i + 1 in CHECKPOINTS or i + 1 == requests:
                st = torch.cuda.memory_stats(0)
                trajectory.append((i + 1, st["reserved_bytes.all.peak"], st.get("num_device_alloc")))
    return sums


def run_one(workload: str, allocator: str, config: str | None, lib: str | None, requests: int,
            steps: int) -> dict:
    torch = prepare_torch(allocator, config, lib)
    clock = {"start": time.perf_counter()}
    trajectory: list = []
    if workload == "bert":
        outputs = run_bert(torch, requests, clock, trajectory)
    elif workload == "gpt2":
        sys.path.insert(0, str(HERE))
        import train_compare

        # train_compare installs cachalot itself only when asked; here it is installed already
        r = train_compare.run_one("gpt2", "native", steps, None, None)
        outputs = r["losses"]
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - clock["start"]
    st = torch.cuda.memory_stats(0)
    # everything the workload made is garbage now: what empty_cache leaves
    # reserved beyond what is still allocated (cuBLAS workspaces) is what a
    # long run would leak
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_stats(0)
    return {
        "workload": workload,
        "allocator": allocator,
        "config": config,
        "backend": torch.cuda.memory.get_allocator_backend(),
        "outputs": outputs,
        "peak_reserved": st["reserved_bytes.all.peak"],
        "peak_allocated": st["allocated_bytes.all.peak"],
        "num_device_alloc": st.get("num_device_alloc"),
        "seconds": seconds,
        "trajectory": trajectory,
        "reserved_after_empty_cache": after["reserved_bytes.all.current"],
        "allocated_after_empty_cache": after["allocated_bytes.all.current"],
    }


def prepare_torch(allocator: str, config: str | None, lib: str | None):
    """torch in a run's process: on cachalot (installed with `config` from
    `lib`) or PyTorch's own allocator, with deterministic algorithms, so
    that every allocator gives the same outputs; returns the module."""
    import torch

    if allocator == "cachalot":
        sys.path.insert(0, str(HERE))
        import cachalot_torch

        cachalot_torch.install(config=config, lib_path=lib)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def child_result(script: Path, run_args: list[str], allocator: str, config: str | None,
                 lib: str) -> tuple[dict | None, subprocess.CompletedProcess]:
    """Runs `script --run ...` (`run_args`) on `allocator` in a process of
    its own: no allocator setting inherited, PyTorch's `config` in its
    environment or cachalot's on the command line; its `RESULT` (None when
    it printed none) and the process."""
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=CUBLAS_CONF)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CACHALOT_ALLOC_CONF"):
        env.pop(k, None)
    cmd = [sys.executable, str(script), *run_args, "--allocator", allocator]
    if allocator == "native" and config:
        env["PYTORCH_CUDA_ALLOC_CONF"] = config
    if allocator == "cachalot":
        cmd += ["--lib", lib] + (["--config", config] if config else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:]), p
    return None, p


def child(workload: str, allocator: str, config: str | None, args) -> dict:
    r, p = child_result(Path(__file__).resolve(),
                        ["--run", workload, "--requests", str(args.requests), "--steps", str(args.steps)],
                        allocator, config, args.lib)
    if r is None:
        raise SystemExit(f"{workload}/{allocator}/{config}: no result (rc {p.returncode})\n{p.stderr[-3000:]}")
    return r


# what empty_cache may leave reserved beyond the allocated bytes once a
# workload ends: the unused rest of the pages or segments that hold live
# blocks (cuBLAS workspaces), a few per stream and pool
KEEP_AFTER_EMPTY_CACHE = 64 << 20


def drive(args) -> int:
    ok, rows, results = True, [], []
    ways = [x for x in WAYS if x[0] in args.ways.split(",")]
    for w in args.workloads.split(","):
        runs = {name: dict(child(w, alloc, conf, args), way=name) for name, alloc, conf in ways}
        results += list(runs.values())
        # the reference outputs: native's, else the first way's
        ref = runs.get("native", next(iter(runs.values())))["outputs"]
        for name, r in runs.items():
            same = r["outputs"] == ref
            ok &= same
            rows.append((w, name, r["peak_reserved"] / 2**20, r["peak_allocated"] / 2**20,
                         r["num_device_alloc"], r["seconds"], same))
        if ("cachalot" in runs and "native-expandable" in runs
                and runs["cachalot"]["peak_reserved"] > runs["native-expandable"]["peak_reserved"]):
            ok = False
        for name, r in runs.items():
            left = r["reserved_after_empty_cache"] - r["allocated_after_empty_cache"]
            if r["allocator"] == "cachalot" and left > KEEP_AFTER_EMPTY_CACHE:
                print(f"{w} {name}: {left:,} B cached after empty_cache")
                ok = False
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("| workload | allocator | peak reserved MiB | peak allocated MiB | device allocs | time s | outputs = native |")
    print("|---|---|---|---|---|---|---|")
    for w, name, pr, pa, nd, secs, same in rows:
        print(f"| {w} | {name} | {pr:,.0f} | {pa:,.0f} | {nd} | {secs:.2f} | {'yes' if same else 'NO'} |")
    print("\n| workload | allocator | reserved / allocated after empty_cache, MiB |")
    print("|---|---|---|")
    for r in results:
        print(f"| {r['workload']} | {r['way']} | {r['reserved_after_empty_cache'] / 2**20:,.1f} / "
              f"{r['allocated_after_empty_cache'] / 2**20:,.1f} |")
    traj = [r for r in results if r["trajectory"]]
    if traj:
        points = [n for n, _, _ in traj[0]["trajectory"]]
        print("\npeak reserved MiB (device allocations) after N requests")
        print("| workload | allocator | " + " | ".join(str(n) for n in points) + " |")
        print("|---|---|" + "---|" * len(points))
        for r in traj:
            cells = " | ".join(f"{pr / 2**20:,.0f} ({nd})" for _, pr, nd in r["trajectory"])
            print(f"| {r['workload']} | {r['way']} | {cells} |")
    print("\nALL CHECKS PASSED" if ok else "\nSOME CHECK FAILED")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", choices=("bert", "gpt2"), help="one run (child mode)")
    ap.add_argument("--allocator", choices=("native", "cachalot"), default="native")
    ap.add_argument("--config", default=None)
    ap.add_argument("--lib", default="dist/cuda/lib/libcachalot_capi.so")
    ap.add_argument("--workloads", default="bert,gpt2")
    ap.add_argument("--ways", default=",".join(w[0] for w in WAYS),
                    help="which of " + ", ".join(w[0] for w in WAYS) + " to run (default: all)")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    unknown = set(args.ways.split(",")) - {w[0] for w in WAYS}
    if unknown:
        ap.error(f"unknown ways {sorted(unknown)}")
    if args.run:
        r = run_one(args.run, args.allocator, args.config, args.lib, args.requests, args.steps)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
