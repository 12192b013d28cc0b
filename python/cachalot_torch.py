"""Use cachalot as PyTorch's CUDA allocator, and read its statistics.

    import cachalot_torch
    cachalot_torch.install()            # before the first CUDA allocation
    ...                                 # train as usual
    print(cachalot_torch.peak_reserved())
    print(cachalot_torch.memory_stats()["num_device_alloc"])

`install` loads libcachalot_capi.so (built by `cargo build --release -p
cachalot-capi`) through `torch.cuda.memory.CUDAPluggableAllocator` and makes it
the current allocator with `torch.cuda.memory.change_current_allocator`.
PyTorch's pluggable interface forwards only allocations and frees, so
`torch.cuda.memory_stats()` and friends raise for a pluggable allocator: read
cachalot's own statistics (the same 122 keys) with `memory_stats()` here, and
release its cache with `empty_cache()` here (`torch.cuda.empty_cache()` is a
no-op for a pluggable allocator). See docs/pytorch-pluggable.md.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

__all__ = [
    "find_library",
    "load",
    "install",
    "memory_stats",
    "peak_reserved",
    "empty_cache",
    "reset_peak_stats",
    "backend_name",
    "CachalotError",
]

LIB_NAME = "libcachalot_capi.so"
#: Environment variable naming the library file.
LIB_ENV = "CACHALOT_CAPI_LIB"

_lib: ctypes.CDLL | None = None
_lib_path: str | None = None
_allocator = None  # keeps the CUDAPluggableAllocator alive


class CachalotError(RuntimeError):
    """A cachalot C function failed; `code` is its CACHALOT_ERR_* code."""

    def __init__(self, code: int, message: str):
        super().__init__(f"cachalot error {code}: {message}")
        self.code = code


def find_library(lib_path: str | os.PathLike | None = None) -> str:
    """The absolute path of libcachalot_capi.so: `lib_path`, else
    $CACHALOT_CAPI_LIB, else next to this file, else the repository's
    target/release or target/debug."""
    here = Path(__file__).resolve().parent
    candidates = []
    if lib_path is not None:
        candidates.append(Path(lib_path))
    elif os.environ.get(LIB_ENV):
        candidates.append(Path(os.environ[LIB_ENV]))
    else:
        candidates += [
            here / LIB_NAME,
            here.parent / "target" / "release" / LIB_NAME,
            here.parent / "target" / "debug" / LIB_NAME,
        ]
    for c in candidates:
        if c.is_file():
            return str(c.resolve())
    raise FileNotFoundError(
        f"{LIB_NAME} not found (looked at: {', '.join(map(str, candidates))}); "
        "build it with `cargo build --release -p cachalot-capi`"
    )


def load(lib_path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Loads the library (once) and declares the C signatures."""
    global _lib, _lib_path
    if _lib is not None:
        if lib_path is not None and find_library(lib_path) != _lib_path:
            raise RuntimeError(f"cachalot is already loaded from {_lib_path}")
        return _lib
    path = find_library(lib_path)
    lib = ctypes.CDLL(path)
    c_int, c_char_p, c_void_p = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
    sigs = {
        "cachalot_init": (c_int, [c_char_p]),
        "cachalot_backend_name": (c_char_p, []),
        "cachalot_device_count": (c_int, []),
        "cachalot_malloc": (c_void_p, [ctypes.c_ssize_t, c_int, c_void_p]),
        "cachalot_free": (None, [c_void_p, ctypes.c_ssize_t, c_int, c_void_p]),
        "cachalot_record_stream": (c_int, [c_void_p, c_int, c_void_p]),
        "cachalot_empty_cache": (c_int, [c_int]),
        "cachalot_reset_peak_stats": (c_int, [c_int]),
        # c_void_p, not c_char_p: the string must be released by cachalot.
        "cachalot_memory_stats_json": (c_void_p, [c_int]),
        "cachalot_string_free": (None, [c_void_p]),
        "cachalot_set_config": (c_int, [c_char_p]),
        "cachalot_set_error_logging": (None, [c_int]),
        "cachalot_last_error_code": (c_int, []),
        "cachalot_last_error": (c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _lib, _lib_path = lib, path
    return lib


def _check(rc: int) -> None:
    if rc != 0:
        msg = _lib.cachalot_last_error()
        raise CachalotError(rc, msg.decode(errors="replace") if msg else "unknown error")


def install(lib_path: str | os.PathLike | None = None, config: str | None = None):
    """Makes cachalot PyTorch's CUDA allocator. Call it before anything
    allocates CUDA memory (PyTorch refuses to swap an allocator in use).
    `config` is an allocator configuration string with PyTorch's grammar
    (e.g. "max_split_size_mb:256"); CACHALOT_ALLOC_CONF and
    PYTORCH_CUDA_ALLOC_CONF apply first. Returns the CUDAPluggableAllocator."""
    global _allocator
    import torch

    lib = load(lib_path)
    _check(lib.cachalot_init(b"cuda"))
    if config:
        _check(lib.cachalot_set_config(config.encode()))
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        _lib_path, "cachalot_malloc", "cachalot_free"
    )
    torch.cuda.memory.change_current_allocator(alloc)
    _allocator = alloc
    return alloc


def _device(device) -> int:
    if device is None:
        try:
            import torch

            return torch.cuda.current_device()
        except Exception:  # noqa: BLE001 - no torch / no CUDA: device 0
            return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)  # torch.device
    if index is None and isinstance(device, str):
        index = int(device.split(":")[1]) if ":" in device else 0
    return 0 if index is None else int(index)


def memory_stats(device=None) -> dict:
    """cachalot's flat statistics of `device` (None: the current device):
    PyTorch's 122 keys of torch.cuda.memory_stats(), as a dict of ints."""
    lib = load()
    p = lib.cachalot_memory_stats_json(_device(device))
    if not p:
        _check(lib.cachalot_last_error_code() or 1)
    try:
        return json.loads(ctypes.string_at(p).decode())
    finally:
        lib.cachalot_string_free(p)


def peak_reserved(device=None) -> int:
    """Peak reserved bytes of `device` ("reserved_bytes.all.peak")."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def empty_cache(device: int = -1) -> None:
    """Releases cachalot's unused cached memory (-1: on every device)."""
    _check(load().cachalot_empty_cache(device))


def reset_peak_stats(device: int = -1) -> None:
    """Peak statistics := current values (-1: on every device)."""
    _check(load().cachalot_reset_peak_stats(device))


def backend_name() -> str:
    """The backend cachalot runs on ("cuda", "mock", ...)."""
    name = load().cachalot_backend_name()
    if name is None:
        _check(load().cachalot_last_error_code() or 1)
    return name.decode()
