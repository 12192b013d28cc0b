"""Builds native_helpers.cpp (a user allocator for MemPool(allocator=...),
an allocator trace tracker) against the installed torch with plain g++,
as cachalot_torch builds its shim, once per process, and loads it."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "native_helpers.cpp"
_lib: ctypes.CDLL | None = None
_path: str | None = None

# TraceEntry actions (c10/core/CachingDeviceAllocator.h)
SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = 3, 4, 5, 6


def build() -> str:
    """The helper library's path (built on first use)."""
    global _path
    if _path:
        return _path
    import torch

    sys.path.insert(0, str(HERE.parent))
    from cachalot_torch import _build

    torch_dir = Path(torch.__file__).resolve().parent
    cuda_inc, cudart_dir, cudart = _build.find_cuda(torch_dir)
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    tlib = torch_dir / "lib"
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O1", "-fPIC", "-shared",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-isystem", str(torch_dir / "include"),
           "-isystem", str(cuda_inc), str(SOURCE), "-o", "OUT", "-L", str(tlib), "-L", str(cudart_dir),
           "-lc10", "-lc10_cuda", cudart, f"-Wl,-rpath,{tlib}", f"-Wl,-rpath,{cudart_dir}",
           "-Wl,--no-undefined"]
    h = hashlib.sha256(SOURCE.read_bytes() + "\0".join(cmd).encode() + torch.__version__.encode())
    folder = Path(os.environ.get("CACHALOT_TORCH_CACHE") or tempfile.gettempdir()) / "cachalot-test-helpers"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"native_helpers-{h.hexdigest()[:16]}.so"
    if not out.is_file():
        tmp = folder / f".{out.name}.{os.getpid()}"
        p = subprocess.run([str(tmp) if c == "OUT" else c for c in cmd], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"building {SOURCE.name} failed:\n{' '.join(cmd)}\n{p.stdout}{p.stderr}")
        os.replace(tmp, out)
    _path = str(out)
    return _path


def lib() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(build())
        for name in ("user_allocs", "user_frees", "user_live", "tracker_count", "tracker_count_in_pool"):
            getattr(_lib, name).restype = ctypes.c_long
        _lib.user_owns.restype = ctypes.c_int
        _lib.user_owns.argtypes = [ctypes.c_size_t]
        _lib.tracker_count.argtypes = [ctypes.c_int]
        _lib.tracker_bytes.restype = ctypes.c_longlong
        _lib.tracker_bytes.argtypes = [ctypes.c_int]
        _lib.tracker_count_in_pool.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    return _lib


def user_allocator():
    """A CUDAPluggableAllocator over the helper's user_alloc / user_free."""
    import torch

    return torch.cuda.memory.CUDAPluggableAllocator(build(), "user_alloc", "user_free")
