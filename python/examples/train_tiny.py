"""A plain PyTorch training script with no cachalot in it: a small MLP on
random data (fixed seeds), AdamW, bf16 autocast; data-parallel (DDP over
NCCL) when started by torchrun. It is the unchanged script the launcher
runs:

    python python/examples/train_tiny.py --steps 50                 # PyTorch's allocator
    python -m cachalot_torch run python/examples/train_tiny.py --compile   # inductor's workers too
    python -m cachalot_torch run python/examples/train_tiny.py --steps 50
    torchrun --nproc_per_node 2 -m cachalot_torch run python/examples/train_tiny.py --steps 50

Prints the loss every 10 steps and, from rank 0, a last line
`RESULT {json}`: the losses (as float.hex, for exact comparison), the
allocator backend torch reports, peak reserved bytes and the world size.
"""

from __future__ import annotations

import argparse
import json
import os

import torch


def segments(dev) -> list:
    """The segments of the memory snapshot: total size, allocated bytes,
    stream and pool of each, largest first."""
    out = []
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", 0) != dev.index:
            continue
        out.append([seg["total_size"], seg["allocated_size"], seg["stream"],
                    str(seg.get("segment_pool_id", ""))])
    return sorted(out, reverse=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (inductor; its compile workers are child processes)")
    ap.add_argument("--segments", action="store_true",
                    help="list the segments held at the end (size, stream, pool) in the result")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    if world > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        torch.distributed.init_process_group("nccl", device_id=dev)

    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(
        torch.nn.Linear(w, 4 * w), torch.nn.GELU(), torch.nn.Linear(4 * w, w), torch.nn.GELU(),
        torch.nn.Linear(w, 10),
    ).to(dev)
    if torch.distributed.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt_model = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    losses = []
    for step in range(args.steps):
        x = torch.randn(args.batch, w, generator=g).to(dev, non_blocking=True)
        y = torch.randint(0, 10, (args.batch,), generator=g).to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(opt_model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().float().item()))
        if rank == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1}: loss {losses[-1]:.4f}", flush=True)

    if rank == 0:
        print("RESULT " + json.dumps({
            "backend": torch.cuda.memory.get_allocator_backend(),
            "world_size": world,
            "steps": args.steps,
            "losses": [v.hex() for v in losses],
            "peak_reserved": torch.cuda.max_memory_reserved(dev),
            "peak_allocated": torch.cuda.max_memory_allocated(dev),
            "segments": segments(dev) if args.segments else None,
        }), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
