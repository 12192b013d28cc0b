"""What cachalot_torch needs on the user's machine, checked with one clear
error each (`SetupError`) naming what to install:

* PyTorch 2.11.x, a CUDA build (`SUPPORTED_TORCH`): the C++ shim overrides
  torch 2.11's `c10::cuda::CUDACachingAllocator::CUDAAllocator`, whose
  vtable changes between minor versions;
* a C++17 compiler (`g++`, or `$CXX`) to build that shim on first use;
* the CUDA runtime headers (see `_build.find_cuda`);
* `libcachalot_capi.so` and `cachalot.h`, shipped inside the wheel (see
  `_capi.find_library`, `_build.find_header`).

Nothing here imports torch or initializes CUDA; the functions take what
they check as arguments so that they can be tested without torch.
"""

from __future__ import annotations

import os
import re
import shutil

#: The torch versions the shim is written against: (major, minor) pairs.
SUPPORTED_TORCH = ((2, 11),)
#: Set to 1 to try a torch version outside SUPPORTED_TORCH (the shim may
#: then fail to compile, or worse, misbehave at run time).
SKIP_VERSION_CHECK_ENV = "CACHALOT_TORCH_SKIP_VERSION_CHECK"


class SetupError(RuntimeError):
    """Something cachalot_torch needs is missing or unsupported; the
    message names what to install or set."""


class NotFound(SetupError, FileNotFoundError):
    """A file cachalot_torch needs (the library, a header) was not found."""


def one_line(e: BaseException) -> str:
    """An error for the command line: "cachalot_torch: <message>"."""
    msg = str(e)
    return msg if msg.startswith("cachalot_torch") else f"cachalot_torch: {msg}"


def supported_torch_text() -> str:
    """"2.11.x" (or "2.11.x, 2.12.x")."""
    return ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED_TORCH)


def _pin() -> str:
    """The pip requirement(s) of a supported torch: "'torch==2.11.*'"."""
    return " ".join(f"'torch=={a}.{b}.*'" for a, b in SUPPORTED_TORCH)


def _major_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_torch(version: str, cuda: str | None, hip: str | None = None,
                environ=os.environ, check_version: bool = True) -> None:
    """Raises SetupError unless the build has CUDA (`cuda`:
    torch.version.cuda; `hip`: torch.version.hip) and, with
    `check_version`, `version` (torch.__version__) is a supported minor
    version ($CACHALOT_TORCH_SKIP_VERSION_CHECK=1 skips that part)."""
    want = supported_torch_text()
    pin = _pin()
    cuda_build = (f"on Linux x86_64, pip install {pin} is a CUDA build; PyTorch's install "
                  "instructions give the command for each CUDA version")
    if hip:
        raise SetupError(
            f"cachalot_torch needs a CUDA build of PyTorch; this torch {version} is a ROCm/HIP build "
            f"(torch.version.hip={hip}). Install a CUDA build of torch {want} ({cuda_build})"
        )
    if not cuda:
        raise SetupError(
            f"cachalot_torch needs a CUDA build of PyTorch; this torch {version} has no CUDA "
            f"(torch.version.cuda is None: a CPU-only build). Install a CUDA build of torch {want} "
            f"({cuda_build})"
        )
    if not check_version or environ.get(SKIP_VERSION_CHECK_ENV, "") not in ("", "0"):
        return
    if _major_minor(version) not in SUPPORTED_TORCH:
        raise SetupError(
            f"cachalot_torch supports torch {want} (its C++ shim implements that version's "
            f"CUDAAllocator interface, which changes between minor versions); this is torch {version}. "
            f"Install a supported torch: pip install {pin} (or set {SKIP_VERSION_CHECK_ENV}=1 to try "
            "this version anyway)"
        )


def torch_or_error():
    """`import torch`, or SetupError saying how to install it."""
    try:
        import torch
    except ImportError as e:
        raise SetupError(
            f"cachalot_torch needs PyTorch {supported_torch_text()} with CUDA, which is not importable "
            f"here ({e}). Install it: pip install {_pin()}"
        ) from e
    return torch


def check_installed_torch(torch, check_version: bool = True) -> None:
    """check_torch on an imported torch module."""
    v = getattr(torch, "version", None)
    check_torch(str(torch.__version__), getattr(v, "cuda", None), getattr(v, "hip", None),
                check_version=check_version)


def find_compiler(environ=os.environ, which=shutil.which) -> str:
    """The C++ compiler that builds the shim: $CXX, else g++; its path, or
    SetupError naming what to install."""
    cxx = environ.get("CXX") or "g++"
    path = which(cxx)
    if path is None:
        where = f"$CXX={cxx!r}" if environ.get("CXX") else "'g++'"
        raise SetupError(
            f"cachalot_torch builds a small C++ shim against your torch on first use, which needs a "
            f"C++17 compiler: {where} is not on PATH. Install one (Debian/Ubuntu: apt-get install g++; "
            "Fedora/RHEL: dnf install gcc-c++; conda: conda install -c conda-forge gxx) or set CXX to "
            "a g++ or clang++"
        )
    return path
