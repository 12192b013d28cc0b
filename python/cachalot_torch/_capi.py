"""ctypes access to libcachalot_capi.so: finding and loading it, and
cachalot's own statistics (the same in both install modes)."""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

from ._requirements import NotFound, SetupError

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


#: The folder of this package; the wheel puts the library in lib/ and the
#: header in include/ beside this file.
HERE = Path(__file__).resolve().parent


def repo_root(package_dir: Path = HERE) -> Path | None:
    """The repository this package folder sits in (a clone's `python/`
    folder), or None for an installed copy."""
    root = package_dir.parent.parent
    if (root / "Cargo.toml").is_file() and (root / "crates" / "cachalot-capi").is_dir():
        return root
    return None


def library_candidates(lib_path=None, package_dir: Path = HERE, environ=os.environ) -> list[Path]:
    """Where find_library looks, in order: `lib_path` alone when given;
    else $CACHALOT_CAPI_LIB alone when set; else the library the wheel
    ships (`cachalot_torch/lib/`), then, in a clone of the repository, a
    developer build: $CARGO_TARGET_DIR/release (relative to the current
    folder, as cargo reads it), the repository's target/release, the
    `cargo xtask test-cuda` pack (dist/cuda/lib), $CARGO_TARGET_DIR/debug
    and target/debug."""
    if lib_path is not None:
        return [Path(lib_path)]
    if environ.get(LIB_ENV):
        return [Path(environ[LIB_ENV])]
    cands = [package_dir / "lib" / LIB_NAME, package_dir / LIB_NAME]
    root = repo_root(package_dir)
    if root is None:
        return cands
    target_env = environ.get("CARGO_TARGET_DIR")
    target = Path(target_env).resolve() if target_env else None
    if target is not None:
        cands.append(target / "release" / LIB_NAME)
    cands += [root / "target" / "release" / LIB_NAME, root / "dist" / "cuda" / "lib" / LIB_NAME]
    if target is not None:
        cands.append(target / "debug" / LIB_NAME)
    cands.append(root / "target" / "debug" / LIB_NAME)
    return list(dict.fromkeys(cands))


def not_found_message(cands: list[Path], lib_path=None, package_dir: Path = HERE,
                      environ=os.environ) -> str:
    """Why the library was not found and what fixes it."""
    looked = ", ".join(map(str, cands))
    if lib_path is not None:
        return f"{LIB_NAME} not found at {lib_path} (the lib_path given)"
    if environ.get(LIB_ENV):
        return (f"{LIB_NAME} not found at {environ[LIB_ENV]} (${LIB_ENV}); unset {LIB_ENV} to use "
                "the library installed with the package")
    root = repo_root(package_dir)
    if root is None:
        return (
            f"{LIB_NAME} not found (looked at: {looked}): this copy of cachalot_torch has no bundled "
            "library. Install the package, which ships it: pip install cachalot_torch-*.whl, or "
            "pip install ./python from a clone of the repository (needs Rust); or set "
            f"{LIB_ENV}=/path/to/{LIB_NAME}"
        )
    target = environ.get("CARGO_TARGET_DIR")
    where = (f"$CARGO_TARGET_DIR/release ({Path(target).resolve() / 'release'})" if target
             else str(root / "target" / "release"))
    return (
        f"{LIB_NAME} not found (looked at: {looked}). Build it: cargo build --release -p cachalot-capi "
        f"--manifest-path {root / 'Cargo.toml'} (cargo puts it in {where}, where this lookup "
        f"finds it); or install the package: pip install {root / 'python'}; or set "
        f"{LIB_ENV}=/path/to/{LIB_NAME}"
    )


def find_library(lib_path: str | os.PathLike | None = None, package_dir: Path = HERE,
                 environ=os.environ) -> str:
    """The absolute path of libcachalot_capi.so: the first of
    library_candidates that exists; NotFound (a SetupError and a
    FileNotFoundError), saying what fixes it, when there is none."""
    cands = library_candidates(lib_path, package_dir, environ)
    for c in cands:
        if c.is_file():
            return str(c.resolve())
    raise NotFound(not_found_message(cands, lib_path, package_dir, environ))


def load(lib_path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Loads the library (once, RTLD_GLOBAL) and declares the C signatures."""
    global _lib, _lib_path
    if _lib is not None:
        if lib_path is not None and find_library(lib_path) != _lib_path:
            raise RuntimeError(f"cachalot is already loaded from {_lib_path}")
        return _lib
    path = find_library(lib_path)
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        if "GLIBC" in str(e):
            raise SetupError(
                f"{path} was built for a newer C library than this machine's ({e}). Build the "
                "package here instead, against this machine's glibc: pip install ./python from a "
                "clone of the repository (needs Rust)"
            ) from e
        raise
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
