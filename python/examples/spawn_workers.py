"""An unchanged script whose work runs in child processes, as a DDP
script without torchrun does (`torch.multiprocessing.spawn`): each worker
allocates on the GPU and reports the allocator it runs on. Prints one line
`RESULT {"workers": [...]}` (each worker's `get_allocator_backend()`, its
checksum and its peak reserved bytes).

    python spawn_workers.py                                # workers on PyTorch's allocator
    python -m cachalot_torch run spawn_workers.py          # workers on cachalot
    python -m cachalot_torch run --no-children spawn_workers.py
"""

import json
import sys

import torch
import torch.multiprocessing as mp


def worker(rank, queue):
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * (rank + 1)
    y = (x @ x.new_ones(1 << 20)).item()
    queue.put((rank, {"backend": torch.cuda.memory.get_allocator_backend(), "sum": y,
                      "peak_reserved": torch.cuda.max_memory_reserved()}))


def main():
    nprocs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(queue,), nprocs=nprocs, join=True)
    got = dict(queue.get() for _ in range(nprocs))
    print("RESULT " + json.dumps({"parent": torch.cuda.memory.get_allocator_backend()
                                  if torch.cuda.is_initialized() else None,
                                  "workers": [got[r] for r in range(nprocs)]}), flush=True)


if __name__ == "__main__":
    main()
