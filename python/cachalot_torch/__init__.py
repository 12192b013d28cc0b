"""cachalot as PyTorch's CUDA allocator.

    import cachalot_torch
    cachalot_torch.install()      # before anything initializes CUDA

From then on every CUDA tensor, `torch.cuda.memory_stats()` and friends,
`empty_cache`, `set_per_process_memory_fraction`, `Tensor.record_stream`,
CUDA graphs (private and shared pools), `torch.cuda.MemPool`,
`torch.compile(mode="reduce-overhead")`, `_record_memory_history` /
`_snapshot`, and `torch.OutOfMemoryError` go through cachalot.

Or, for an unchanged script, the launcher (like `python -m cProfile`):

    python -m cachalot_torch run train.py ARGS
    torchrun --nproc_per_node 8 -m cachalot_torch run train.py ARGS

Needs torch 2.11.x (a CUDA build), a C++17 compiler (g++) and the CUDA
runtime headers; each missing piece is one `SetupError` naming what to
install. `install()` loads libcachalot_capi.so (shipped in the wheel under
cachalot_torch/lib/; found as `_capi.find_library` says), builds the small
C++ shim `shim.cpp` against the installed torch on first use (plain g++, a
few seconds, cached under ~/.cache/cachalot_torch/ by torch version and
source hash; `python -m cachalot_torch build` builds it ahead), and makes
it the allocator. `install(mode="pluggable")` is the older path through
`torch.cuda.memory.CUDAPluggableAllocator` (allocations and frees only; see
docs/pytorch-pluggable.md).

The helpers here read cachalot's own figures in either mode, with torch's
names: `memory_stats`, `max_memory_reserved`, `reset_peak_memory_stats`, ...
See docs/pytorch-shim.md.
"""

from __future__ import annotations

import ctypes
import os
import warnings

from ._capi import CachalotError, find_library, load, memory_stats
from ._requirements import SUPPORTED_TORCH, SetupError
from . import _build, _capi, _requirements

__all__ = [
    "install",
    "installed_mode",
    "build_shim",
    "find_library",
    "load",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "empty_cache",
    "set_allocator_settings",
    "backend_name",
    "CachalotError",
    "SetupError",
    "SUPPORTED_TORCH",
]

#: Environment variable choosing install()'s default mode ("shim" or "pluggable").
MODE_ENV = "CACHALOT_TORCH_MODE"

_mode: str | None = None
_shim: ctypes.CDLL | None = None
_pluggable = None  # keeps the CUDAPluggableAllocator alive


def build_shim(lib_path=None, force: bool = False, verbose: bool = False) -> str:
    """Builds (or finds cached) the shim for the installed torch; its path."""
    return _build.build_shim(find_library(lib_path), force=force, verbose=verbose)


def install(config: str | None = None, mode: str | None = None, lib_path=None, verbose: bool = False):
    """Makes cachalot PyTorch's CUDA allocator. Call it before anything
    initializes CUDA (PyTorch cannot swap an allocator in use; a later call
    raises RuntimeError). `config`: an allocator configuration string with
    PyTorch's grammar plus cachalot's keys (e.g. "placement:pytorch");
    CACHALOT_ALLOC_CONF, then PYTORCH_CUDA_ALLOC_CONF, apply first. `mode`:
    "shim" (default; $CACHALOT_TORCH_MODE overrides the default) or
    "pluggable". Installing again in the same mode is a no-op.

    Raises SetupError, naming what to install, when torch is missing, is
    not a CUDA build or (shim mode) not a supported version
    (SUPPORTED_TORCH: 2.11.x), or when the shim cannot be built (no C++
    compiler, no CUDA runtime headers)."""
    global _mode, _shim, _pluggable
    mode = mode or os.environ.get(MODE_ENV) or "shim"
    if mode not in ("shim", "pluggable"):
        raise ValueError(f"mode must be 'shim' or 'pluggable', not {mode!r}")
    torch = _requirements.torch_or_error()
    # the shim needs torch 2.11's allocator interface; CUDAPluggableAllocator
    # (pluggable mode) is stable across versions and only needs CUDA
    _requirements.check_installed_torch(torch, check_version=mode == "shim")

    if config is not None and lib_path is None and str(config).endswith(".so"):
        # the old signature was install(lib_path, config=None)
        warnings.warn("cachalot_torch.install(lib_path) is deprecated; use install(lib_path=...)",
                      DeprecationWarning, stacklevel=2)
        config, lib_path = None, config
    if _mode is not None:
        if _mode != mode:
            raise RuntimeError(f"cachalot is already installed in mode {_mode!r}")
        if config:
            set_allocator_settings(config)
        return
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "cachalot_torch.install() must run before CUDA initializes (the first CUDA tensor, "
            "torch.cuda.init(), get_device_properties, ...): PyTorch cannot swap an allocator in use"
        )
    lib = load(lib_path)
    if mode == "pluggable":
        _capi.check(lib.cachalot_init(b"cuda"))
        if config:
            _capi.check(lib.cachalot_set_config(config.encode()))
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            _capi.loaded_path(), "cachalot_malloc", "cachalot_free"
        )
        torch.cuda.memory.change_current_allocator(alloc)
        _pluggable, _mode = alloc, mode
        return
    path = _build.build_shim(_capi.loaded_path(), verbose=verbose)
    shim = ctypes.CDLL(path)
    shim.cachalot_torch_install.restype = ctypes.c_int
    shim.cachalot_torch_install.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    err = ctypes.create_string_buffer(4096)
    rc = shim.cachalot_torch_install(config.encode() if config else None, err, len(err))
    if rc != 0:
        raise RuntimeError(f"cachalot_torch.install(): {err.value.decode(errors='replace')}")
    _shim, _mode = shim, mode


def installed_mode() -> str | None:
    """"shim", "pluggable", or None when not installed."""
    return _mode


def memory_allocated(device=None) -> int:
    """cachalot's "allocated_bytes.all.current"."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """cachalot's "allocated_bytes.all.peak"."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """cachalot's "reserved_bytes.all.current"."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    """cachalot's "reserved_bytes.all.peak" (torch.cuda.max_memory_reserved)."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def _all(device) -> int:
    return -1 if device is None else _capi.device_index(device)


def reset_peak_memory_stats(device=None) -> None:
    """Peaks := current values (None: every device)."""
    _capi.check(load().cachalot_reset_peak_stats(_all(device)))


def reset_accumulated_memory_stats(device=None) -> None:
    """Cumulative counters := 0 (None: every device)."""
    _capi.check(load().cachalot_reset_accumulated_stats(_all(device)))


def empty_cache(device=None) -> None:
    """Releases cachalot's unused cached memory (None: every device). In
    shim mode torch.cuda.empty_cache() does the same."""
    _capi.check(load().cachalot_empty_cache(_all(device)))


def set_allocator_settings(config: str) -> None:
    """Applies a configuration string now (every device, and devices used
    later). In shim mode torch.cuda.memory._set_allocator_settings reaches
    cachalot too (after PyTorch's own parser has checked the string)."""
    _capi.check(load().cachalot_set_config(config.encode()))


def backend_name() -> str:
    """The backend cachalot runs on ("cuda", "mock", ...)."""
    name = load().cachalot_backend_name()
    if name is None:
        _capi.check(load().cachalot_last_error_code() or 1)
    return name.decode()


def peak_reserved(device=None) -> int:
    """Deprecated: use max_memory_reserved."""
    warnings.warn("cachalot_torch.peak_reserved is deprecated; use max_memory_reserved",
                  DeprecationWarning, stacklevel=2)
    return max_memory_reserved(device)


def reset_peak_stats(device=None) -> None:
    """Deprecated: use reset_peak_memory_stats."""
    warnings.warn("cachalot_torch.reset_peak_stats is deprecated; use reset_peak_memory_stats",
                  DeprecationWarning, stacklevel=2)
    reset_peak_memory_stats(device)
