"""The setup checks: a supported CUDA build of torch, a C++ compiler, the
CUDA runtime headers; each missing piece is one SetupError naming what to
install, also through `python -m cachalot_torch build` (with fake torch
packages: no torch, compiler or GPU is needed here)."""

from __future__ import annotations

import re
import shutil
import tempfile
import unittest
from pathlib import Path

from _util import REPO, fake_torch, run_python

from cachalot_torch import SUPPORTED_TORCH, SetupError, _build, _requirements


class TorchVersionTest(unittest.TestCase):
    def test_supported(self):
        self.assertEqual(SUPPORTED_TORCH, ((2, 11),))
        for v in ("2.11.0", "2.11.0+cu130", "2.11.3+cu128", "2.11.0a0+git1234"):
            _requirements.check_torch(v, "13.0", environ={})

    def test_unsupported_versions_name_the_supported_one(self):
        for v in ("2.10.1+cu128", "2.12.0", "1.13.1", "garbage"):
            with self.subTest(v=v), self.assertRaises(SetupError) as e:
                _requirements.check_torch(v, "12.8", environ={})
            msg = str(e.exception)
            self.assertIn("supports torch 2.11.x", msg)
            self.assertIn(f"this is torch {v}", msg)
            self.assertIn("pip install 'torch==2.11.*'", msg)
        # the escape hatch, and pluggable mode, skip the version (not CUDA)
        _requirements.check_torch("2.12.0", "13.0", environ={_requirements.SKIP_VERSION_CHECK_ENV: "1"})
        _requirements.check_torch("2.9.0", "12.8", environ={}, check_version=False)

    def test_a_torch_without_cuda(self):
        with self.assertRaises(SetupError) as e:
            _requirements.check_torch("2.11.0+cpu", None, environ={}, check_version=False)
        self.assertIn("CPU-only build", str(e.exception))
        with self.assertRaises(SetupError) as e:
            _requirements.check_torch("2.11.0+rocm7.0", None, "7.0", environ={})
        self.assertIn("ROCm/HIP build", str(e.exception))


class CompilerTest(unittest.TestCase):
    def test_found(self):
        self.assertEqual(_requirements.find_compiler({}, lambda p: f"/usr/bin/{p}"), "/usr/bin/g++")
        self.assertEqual(_requirements.find_compiler({"CXX": "clang++"}, lambda p: f"/opt/{p}"), "/opt/clang++")

    def test_missing_names_what_to_install(self):
        with self.assertRaises(SetupError) as e:
            _requirements.find_compiler({}, lambda p: None)
        msg = str(e.exception)
        self.assertIn("'g++' is not on PATH", msg)
        self.assertIn("apt-get install g++", msg)
        with self.assertRaises(SetupError) as e:
            _requirements.find_compiler({"CXX": "/opt/nope/g++"}, lambda p: None)
        self.assertIn("$CXX='/opt/nope/g++'", str(e.exception))


class BuildCommandTest(unittest.TestCase):
    """`python -m cachalot_torch build` with a fake torch 2.11 (cu13)."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="cachalot-build-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.root = fake_torch(self.tmp / "site")
        self.lib = self.tmp / "libcachalot_capi.so"
        self.lib.write_bytes(b"")
        self.cuda = self.tmp / "cuda"
        self.env = {"CACHALOT_TORCH_CACHE": str(self.tmp / "cache"), "CUDA_HOME": str(self.cuda),
                    "CUDA_PATH": ""}

    def build(self, **env):
        return run_python(["-m", "cachalot_torch", "build", "--lib", str(self.lib)], cwd=self.tmp,
                          env_extra={**self.env, **env}, path_first=[self.root])

    def test_missing_cuda_headers_name_the_wheels_of_torchs_cuda(self):
        if Path("/usr/local/cuda/include/crt/host_config.h").is_file():
            self.skipTest("this machine has /usr/local/cuda, which the build also looks at")
        p = self.build()
        self.assertEqual(p.returncode, 2, p.stderr)
        msg = p.stderr.strip()
        self.assertEqual(len(msg.splitlines()), 1, msg)
        self.assertIn("pip install 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-crt==13.0.*'", msg)
        self.assertIn("nvidia/cu13/include", msg)
        self.assertIn("CUDA_HOME", msg)

    def test_a_missing_compiler_is_named_after_the_headers_are_found(self):
        (self.cuda / "include" / "crt").mkdir(parents=True)
        (self.cuda / "include" / "cuda_runtime_api.h").write_text("")
        (self.cuda / "include" / "crt" / "host_config.h").write_text("")
        (self.cuda / "lib64").mkdir()
        (self.cuda / "lib64" / "libcudart.so.13").write_bytes(b"")
        p = self.build(CXX=str(self.tmp / "no-such-g++"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("C++17 compiler", p.stderr)
        self.assertIn("apt-get install g++", p.stderr)
        self.assertNotIn("Traceback", p.stderr)

    def test_an_unsupported_torch_stops_the_build(self):
        root = fake_torch(self.tmp / "site-2.10", version="2.10.0+cu128", cuda="12.8")
        p = run_python(["-m", "cachalot_torch", "build", "--lib", str(self.lib)], cwd=self.tmp,
                       env_extra=self.env, path_first=[root])
        self.assertEqual(p.returncode, 2)
        self.assertIn("supports torch 2.11.x", p.stderr)

    def test_the_header_message_of_the_build_command(self):
        msg = _build.cuda_headers_message([Path("/x")], None)
        self.assertIn("nvidia-cuda-runtime nvidia-cuda-crt", msg)


class VersionTest(unittest.TestCase):
    def test_the_package_has_the_workspaces_version(self):
        cargo = (REPO / "Cargo.toml").read_text()
        ws = re.search(r'\[workspace\.package\][^\[]*?\nversion\s*=\s*"([^"]+)"', cargo).group(1)
        py = re.search(r'\nversion\s*=\s*"([^"]+)"', (REPO / "python" / "pyproject.toml").read_text()).group(1)
        self.assertEqual(py, ws)


if __name__ == "__main__":
    unittest.main()
