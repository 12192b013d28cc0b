"""Builds the C++ shim (shim.cpp) against the installed torch with plain
g++, cached by torch version + source hash. The vtable of PyTorch's
CUDAAllocator is not a stable ABI, so the shim is always built against the
torch it runs with, never shipped prebuilt.

    python -m cachalot_torch build      # build (or find cached) and print the path

Cache: $CACHALOT_TORCH_CACHE, else $XDG_CACHE_HOME/cachalot_torch, else
~/.cache/cachalot_torch; one folder per torch version and git revision,
one file per hash of (shim.cpp, cachalot.h, the capi library's path, the
command line). Nothing here initializes CUDA.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from . import _capi, _requirements
from ._requirements import NotFound, SetupError

HERE = Path(__file__).resolve().parent
SHIM_SOURCE = HERE / "shim.cpp"
SHIM_NAME = "libcachalot_torch_shim.so"


def cache_root() -> Path:
    if os.environ.get("CACHALOT_TORCH_CACHE"):
        return Path(os.environ["CACHALOT_TORCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cachalot_torch"


def header_candidates(package_dir: Path = HERE, environ=os.environ) -> list[Path]:
    """Where find_header looks: $CACHALOT_INCLUDE/cachalot.h alone when
    set; else the header the wheel ships (`cachalot_torch/include/`), then
    the repository's (crates/cachalot-capi/include/) in a clone."""
    if environ.get("CACHALOT_INCLUDE"):
        return [Path(environ["CACHALOT_INCLUDE"]) / "cachalot.h"]
    cands = [package_dir / "include" / "cachalot.h"]
    root = _capi.repo_root(package_dir)
    if root is not None:
        cands.append(root / "crates" / "cachalot-capi" / "include" / "cachalot.h")
    return cands


def find_header(package_dir: Path = HERE, environ=os.environ) -> Path:
    """cachalot.h (see header_candidates); NotFound saying what fixes it."""
    cands = header_candidates(package_dir, environ)
    for c in cands:
        if c.is_file():
            return c
    looked = ", ".join(map(str, cands))
    if environ.get("CACHALOT_INCLUDE"):
        fix = "point $CACHALOT_INCLUDE at the folder holding cachalot.h, or unset it"
    else:
        fix = ("this copy of cachalot_torch has no bundled header: install the package, which ships "
               "it (pip install cachalot_torch-*.whl, or pip install ./python from a clone), or set "
               "CACHALOT_INCLUDE to a folder holding cachalot.h")
    raise NotFound(f"cachalot.h not found (looked at: {looked}); {fix}")


def _loaded_cudart() -> Path | None:
    """The libcudart torch has loaded (from /proc/self/maps), if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1] if line.strip() else ""
                if "/libcudart.so" in p:
                    return Path(p)
    except OSError:
        pass
    return None


def cuda_headers_message(looked: list[Path], cuda_version: str | None) -> str:
    """What to install when the CUDA runtime headers are missing
    (`cuda_version`: torch.version.cuda, e.g. "13.0")."""
    mm = ".".join((cuda_version or "").split(".")[:2])
    major = mm.split(".")[0] if mm else ""
    pins = (f"'nvidia-cuda-runtime=={mm}.*' 'nvidia-cuda-crt=={mm}.*'" if mm
            else "nvidia-cuda-runtime nvidia-cuda-crt (the CUDA version of your torch)")
    return (
        "cachalot_torch builds its C++ shim against the CUDA runtime headers (cuda_runtime_api.h and "
        f"crt/host_config.h), which were not found (looked at: {', '.join(map(str, looked))}). "
        f"Install them: pip install {pins} (they land in site-packages/nvidia/cu{major or 'NN'}/include, "
        "where this build looks), or install the CUDA toolkit"
        f"{' ' + mm if mm else ''} and set CUDA_HOME to it"
    )


def find_cuda(torch_dir: Path, cuda_version: str | None = None) -> tuple[Path, Path, str]:
    """(include dir, cudart library dir, -l argument) for CUDA, preferring
    the cudart torch uses; NotFound naming what to install. `cuda_version`
    (torch.version.cuda) picks the nvidia/cuNN wheel folder and the
    advice."""
    site = torch_dir.parent
    inc_cands = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            inc_cands.append(Path(os.environ[env]) / "include")
    major = (cuda_version or "").split(".")[0]
    inc_cands += [Path("/usr/local/cuda/include")]
    if major.isdigit():
        inc_cands.append(site / "nvidia" / f"cu{major}" / "include")
    inc_cands += [
        site / "nvidia" / "cu13" / "include",
        site / "nvidia" / "cuda_runtime" / "include",
    ]
    inc_cands = list(dict.fromkeys(inc_cands))
    inc = next(
        (c for c in inc_cands if (c / "cuda_runtime_api.h").is_file() and (c / "crt" / "host_config.h").is_file()),
        None,
    )
    if inc is None:
        raise NotFound(cuda_headers_message(inc_cands, cuda_version))
    lib = _loaded_cudart()
    if lib is None:
        for d in [site / "nvidia" / "cu13" / "lib", site / "nvidia" / "cuda_runtime" / "lib",
                  inc.parent / "lib64", Path("/usr/local/cuda/lib64")]:
            hits = sorted(d.glob("libcudart.so*")) if d.is_dir() else []
            if hits:
                lib = hits[0]
                break
    if lib is None:
        raise NotFound(
            "libcudart.so not found (torch has not loaded one, and none is in site-packages/nvidia or "
            "$CUDA_HOME/lib64): install a CUDA build of torch, which brings it, or set CUDA_HOME"
        )
    return inc, lib.parent, f"-l:{lib.name}"


def build_command(capi_lib: str, out: str, torch_dir: Path | None = None,
                  cxx11_abi: bool | None = None) -> list[str]:
    """The g++ command line that builds the shim into `out`."""
    import torch

    if torch_dir is None:
        torch_dir = Path(torch.__file__).resolve().parent
    if cxx11_abi is None:
        cxx11_abi = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cuda_inc, cudart_dir, cudart = find_cuda(torch_dir, getattr(torch.version, "cuda", None))
    cxx = os.environ.get("CXX") or "g++"
    tlib = torch_dir / "lib"
    return [
        cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-DNDEBUG",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}",
        "-isystem", str(torch_dir / "include"),
        "-isystem", str(cuda_inc),
        "-I", str(find_header().parent),
        str(SHIM_SOURCE), "-o", out,
        "-L", str(tlib), "-L", str(cudart_dir),
        "-lc10", "-lc10_cuda", cudart, str(Path(capi_lib).resolve()),
        f"-Wl,-rpath,{tlib}", f"-Wl,-rpath,{cudart_dir}", "-Wl,--no-undefined",
    ]


def shim_path(capi_lib: str) -> tuple[Path, list[str]]:
    """Where the shim for this torch and library lives in the cache (built
    or not), and the command that builds it."""
    torch = _requirements.torch_or_error()
    version = torch.__version__
    git = getattr(torch.version, "git_version", "unknown") or "unknown"
    cmd = build_command(capi_lib, "OUT")
    h = hashlib.sha256()
    for part in (SHIM_SOURCE.read_bytes(), find_header().read_bytes(), version.encode(), git.encode(),
                 "\0".join(cmd).encode()):
        h.update(part)
        h.update(b"\0")
    folder = cache_root() / f"torch-{version}-{git[:12]}" / h.hexdigest()[:16]
    return folder / SHIM_NAME, cmd


def build_shim(capi_lib: str, force: bool = False, verbose: bool = False) -> str:
    """The path of the shim built for the installed torch and `capi_lib`
    (building it, under a file lock, unless cached). SetupError, naming
    what to install, for an unsupported torch, a missing compiler or
    missing CUDA headers."""
    _requirements.check_installed_torch(_requirements.torch_or_error())
    path, cmd = shim_path(capi_lib)
    if path.is_file() and not force:
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file() and not force:
            return str(path)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            out = os.path.join(tmp, SHIM_NAME)
            cmd = [out if c == "OUT" else c for c in cmd]
            _requirements.find_compiler()
            if verbose:
                print("cachalot_torch: building the shim:", " ".join(cmd), flush=True)
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise SetupError(
                    f"cachalot_torch: building the shim failed (exit {p.returncode}). It is written "
                    f"for torch {_requirements.supported_torch_text()} and needs a C++17 compiler "
                    f"and the CUDA runtime headers of your torch's CUDA.\n"
                    f"{' '.join(cmd)}\n{p.stdout}{p.stderr}"
                )
            os.replace(out, path)
    return str(path)
