"""ctypes access to libcachalot_capi.so: finding and loading it, and
cachalot's own statistics (the same in both install modes)."""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

LIB_NAME = "libcachalot_capi.so"
#: Environment variable naming the library file.
LIB_ENV = "CACHALOT_CAPI_LIB"

_lib: ctypes.CDLL | None = None
_lib_path: str | None = None


class CachalotError(RuntimeError):
    """A cachalot C function failed; `code` is its CACHALOT_ERR_* code."""

    def __init__(self, code: int, message: str):
        super().__init__(f"cachalot error {code}: {message}")
        self.code = code


def _candidates(lib_path) -> list[Path]:
    here = Path(__file__).resolve().parent
    repo = here.parent.parent
    if lib_path is not None:
        return [Path(lib_path)]
    if os.environ.get(LIB_ENV):
        return [Path(os.environ[LIB_ENV])]
    return [
        here / LIB_NAME,
        repo / "dist" / "cuda" / "lib" / LIB_NAME,
        repo / "target" / "release" / LIB_NAME,
        repo / "target" / "debug" / LIB_NAME,
    ]


def find_library(lib_path: str | os.PathLike | None = None) -> str:
    """The absolute path of libcachalot_capi.so: `lib_path`, else
    $CACHALOT_CAPI_LIB, else next to this package, else the repository's
    dist/cuda/lib, target/release or target/debug."""
    cands = _candidates(lib_path)
    for c in cands:
        if c.is_file():
            return str(c.resolve())
    raise FileNotFoundError(
        f"{LIB_NAME} not found (looked at: {', '.join(map(str, cands))}); "
        "build it with `cargo build --release -p cachalot-capi`"
    )


def load(lib_path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Loads the library (once, RTLD_GLOBAL) and declares the C signatures."""
    global _lib, _lib_path
    if _lib is not None:
        if lib_path is not None and find_library(lib_path) != _lib_path:
            raise RuntimeError(f"cachalot is already loaded from {_lib_path}")
        return _lib
    path = find_library(lib_path)
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
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
        "cachalot_reset_accumulated_stats": (c_int, [c_int]),
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


def loaded_path() -> str | None:
    """Where the library was loaded from (None before `load`)."""
    return _lib_path


def check(rc: int) -> None:
    """Raises CachalotError for a non-zero status code."""
    if rc != 0:
        msg = load().cachalot_last_error()
        raise CachalotError(rc, msg.decode(errors="replace") if msg else "unknown error")


def device_index(device) -> int:
    """An int device index from None (current device), an int, a
    torch.device or a "cuda:N" string."""
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
    p = lib.cachalot_memory_stats_json(device_index(device))
    if not p:
        check(lib.cachalot_last_error_code() or 1)
    try:
        return json.loads(ctypes.string_at(p).decode())
    finally:
        lib.cachalot_string_free(p)
