"""Chooses the allocator of this test process: PyTorch's native one or
cachalot through the shim, installed before anything initializes CUDA.
The suite runs once per allocator, each in its own process (as PyTorch
runs its own suite under `backend:cudaMallocAsync`):

    python -m pytest python/tests --allocator native
    python -m pytest python/tests --allocator cachalot

(or CACHALOT_TEST_ALLOCATOR=native|cachalot). Tests that assert numbers of
PyTorch's placement (segment sizes, reuse order) expect cachalot's parity
configuration: the runner sets CACHALOT_ALLOC_CONF=placement:pytorch.
CACHALOT_TEST_RESULTS names a JSON file where tests record values (model
outputs) that the runner compares across the two processes;
CACHALOT_TEST_WHERE a file that gets `describe()` (where cachalot_torch
and its library were loaded from).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = "CACHALOT_TEST_ALLOCATOR"
ALLOCATOR = None


def setup(allocator: str | None = None) -> str:
    global ALLOCATOR
    if ALLOCATOR is not None:
        return ALLOCATOR
    allocator = allocator or os.environ.get(ENV, "native")
    if allocator not in ("native", "cachalot"):
        raise SystemExit(f"unknown allocator {allocator!r} (native or cachalot)")
    os.environ[ENV] = allocator
    import torch

    if allocator == "cachalot":
        # this clone's package; a copy of the suite outside the clone
        # imports the installed one (scripts/device/wheel.sh)
        if (HERE.parent / "cachalot_torch").is_dir():
            sys.path.insert(0, str(HERE.parent))
        import cachalot_torch

        cachalot_torch.install()
        assert torch.cuda.memory.get_allocator_backend() == "cachalot"
    ALLOCATOR = allocator
    if os.environ.get("CACHALOT_TEST_WHERE"):
        Path(os.environ["CACHALOT_TEST_WHERE"]).write_text(describe() + "\n")
    return allocator


def describe() -> str:
    """The allocator under test, and for cachalot where its package and
    library were loaded from."""
    if ALLOCATOR != "cachalot":
        return f"allocator: {ALLOCATOR}"
    import cachalot_torch

    return (f"allocator: cachalot (package {Path(cachalot_torch.__file__).parent}, "
            f"library {cachalot_torch._capi.loaded_path()})")


def is_cachalot() -> bool:
    return setup() == "cachalot"


def record_result(name: str, value) -> None:
    """Stores `value` under `name` for the cross-allocator comparison."""
    path = os.environ.get("CACHALOT_TEST_RESULTS")
    if not path:
        return
    p = Path(path)
    data = json.loads(p.read_text()) if p.is_file() else {}
    data[name] = value
    p.write_text(json.dumps(data, indent=1, sort_keys=True))


def set_reuse(value: str) -> None:
    """graph_capture_record_stream_reuse for the allocator under test."""
    import torch

    if is_cachalot():
        import cachalot_torch

        cachalot_torch.set_allocator_settings(f"graph_capture_record_stream_reuse:{value}")
    else:
        torch.cuda.memory._set_allocator_settings(f"graph_capture_record_stream_reuse:{value}")
