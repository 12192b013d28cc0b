"""Builds the cachalot_torch wheel with setuptools-rust (see
docs/python-packaging.md for why setuptools-rust and what goes where).

    pip wheel ./python -w dist/      # from the repository root: dist/cachalot_torch-*.whl
    pip install ./python             # build and install in one step

The wheel holds the Python package, the C++ shim's source (compiled against
the user's torch on first use), and two files built or copied from the
Rust workspace one folder up:

    cachalot_torch/lib/libcachalot_capi.so    cargo build --release -p cachalot-capi (debug info stripped)
    cachalot_torch/include/cachalot.h         crates/cachalot-capi/include/cachalot.h

The library is loaded with ctypes, not imported, so it does not depend on
the Python version: the wheel is tagged py3-none-<platform>
(py3-none-linux_x86_64 here). Building needs Rust (cargo, the version in
the workspace's Cargo.toml) on top of pip; cargo honours CARGO_TARGET_DIR.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustExtension, Strip
from setuptools_rust.build import build_rust

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
CAPI = HERE.parent / "crates" / "cachalot-capi"
LIB_NAME = "libcachalot_capi.so"
#: The extension's dotted target: the library lands in cachalot_torch/lib/.
TARGET = "cachalot_torch.lib.libcachalot_capi"

if not (CAPI / "Cargo.toml").is_file():
    raise SystemExit(
        f"cachalot_torch: {CAPI / 'Cargo.toml'} not found: the package builds from a clone of the "
        "repository (pip install ./python from its root), not from a copy of python/ alone"
    )


class BuildRust(build_rust):
    """The cdylib under its own name (libcachalot_capi.so), not a Python
    extension module's name (NoBinding would call it
    libcachalot_capi.cpython-311-x86_64-linux-gnu.so): it is opened with
    ctypes by that name and serves every Python version."""

    def get_dylib_ext_path(self, ext, target_fname):
        return str(Path(super().get_dylib_ext_path(ext, target_fname)).with_name(LIB_NAME))


class BuildPy(build_py):
    """Copies the C header next to the package (cachalot_torch/include/),
    where the shim build finds it."""

    def run(self):
        super().run()
        dst = Path(self.build_lib) / "cachalot_torch" / "include"
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(CAPI / "include" / "cachalot.h", dst / "cachalot.h")


class BdistWheel(bdist_wheel):
    """py3-none-<platform>: any Python 3, one platform (the library is
    native code, loaded with ctypes)."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    rust_extensions=[
        RustExtension(
            TARGET,
            path=str(CAPI / "Cargo.toml"),
            binding=Binding.NoBinding,
            # the release profile keeps line tables (debug = 1): 28 MB
            # with them, under 3 MB without
            strip=Strip.Debug,
            py_limited_api=False,
        )
    ],
    cmdclass={"build_rust": BuildRust, "build_py": BuildPy, "bdist_wheel": BdistWheel},
)
