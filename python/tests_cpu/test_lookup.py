"""Where cachalot_torch finds libcachalot_capi.so and cachalot.h: the
packaged copies first, then a developer build ($CARGO_TARGET_DIR, the
repository's target/), explicit overrides alone; and errors whose advice
puts the file where the lookup then finds it."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import _util  # noqa: F401 - puts this clone's python/ on sys.path

from cachalot_torch import SetupError, _build, _capi

LIB = "libcachalot_capi.so"


def touch(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"")
    return p


class LookupTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="cachalot-lookup-")).resolve()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        # a clone: Cargo.toml, crates/cachalot-capi/, python/cachalot_torch/
        self.repo = self.tmp / "clone"
        touch(self.repo / "Cargo.toml")
        (self.repo / "crates" / "cachalot-capi" / "include").mkdir(parents=True)
        self.pkg_in_repo = self.repo / "python" / "cachalot_torch"
        self.pkg_in_repo.mkdir(parents=True)
        # an installed copy: site-packages/cachalot_torch/
        self.installed = self.tmp / "venv" / "lib" / "site-packages" / "cachalot_torch"
        self.installed.mkdir(parents=True)
        self.target = self.tmp / "cargo-target"

    def test_order_in_a_clone(self):
        env = {"CARGO_TARGET_DIR": str(self.target)}
        r, t = self.repo, self.target
        self.assertEqual(_capi.library_candidates(None, self.pkg_in_repo, env), [
            self.pkg_in_repo / "lib" / LIB,
            self.pkg_in_repo / LIB,
            t / "release" / LIB,
            r / "target" / "release" / LIB,
            r / "dist" / "cuda" / "lib" / LIB,
            t / "debug" / LIB,
            r / "target" / "debug" / LIB,
        ])
        # without CARGO_TARGET_DIR: the repository's target/
        self.assertEqual(_capi.library_candidates(None, self.pkg_in_repo, {})[2], r / "target" / "release" / LIB)

    def test_the_first_existing_wins(self):
        env = {"CARGO_TARGET_DIR": str(self.target)}
        find = lambda: _capi.find_library(None, self.pkg_in_repo, env)  # noqa: E731
        touch(self.repo / "target" / "debug" / LIB)
        self.assertEqual(find(), str(self.repo / "target" / "debug" / LIB))
        touch(self.repo / "target" / "release" / LIB)
        self.assertEqual(find(), str(self.repo / "target" / "release" / LIB))
        touch(self.target / "release" / LIB)
        self.assertEqual(find(), str(self.target / "release" / LIB))
        touch(self.pkg_in_repo / "lib" / LIB)
        self.assertEqual(find(), str(self.pkg_in_repo / "lib" / LIB))

    def test_overrides_are_used_alone(self):
        touch(self.installed / "lib" / LIB)
        other = touch(self.tmp / "other" / LIB)
        self.assertEqual(_capi.find_library(other, self.installed, {}), str(other))
        env = {"CACHALOT_CAPI_LIB": str(other)}
        self.assertEqual(_capi.find_library(None, self.installed, env), str(other))
        env = {"CACHALOT_CAPI_LIB": str(self.tmp / "missing.so")}
        with self.assertRaises(FileNotFoundError) as e:
            _capi.find_library(None, self.installed, env)
        self.assertIn("CACHALOT_CAPI_LIB", str(e.exception))

    def test_an_installed_copy_looks_only_in_itself(self):
        cands = _capi.library_candidates(None, self.installed, {"CARGO_TARGET_DIR": str(self.target)})
        self.assertEqual(cands, [self.installed / "lib" / LIB, self.installed / LIB])
        with self.assertRaises(SetupError) as e:
            _capi.find_library(None, self.installed, {})
        msg = str(e.exception)
        self.assertIn("pip install", msg)
        self.assertIn("CACHALOT_CAPI_LIB", msg)
        self.assertNotIn("cargo build", msg)
        self.assertIsInstance(e.exception, FileNotFoundError)

    def test_the_advice_in_a_clone_builds_where_the_lookup_looks(self):
        for env, built in [({"CARGO_TARGET_DIR": str(self.target)}, self.target / "release" / LIB),
                           ({}, self.repo / "target" / "release" / LIB)]:
            with self.subTest(env=env):
                with self.assertRaises(SetupError) as e:
                    _capi.find_library(None, self.pkg_in_repo, env)
                msg = str(e.exception)
                self.assertIn(f"cargo build --release -p cachalot-capi --manifest-path {self.repo / 'Cargo.toml'}", msg)
                self.assertIn(str(built.parent), msg)
                self.assertIn(f"pip install {self.repo / 'python'}", msg)
                # what `cargo build --release` makes, there: found
                touch(built)
                self.assertEqual(_capi.find_library(None, self.pkg_in_repo, env), str(built))
                built.unlink()

    def test_the_header(self):
        repo_h = touch(self.repo / "crates" / "cachalot-capi" / "include" / "cachalot.h")
        self.assertEqual(_build.find_header(self.pkg_in_repo, {}), repo_h)
        pkg_h = touch(self.pkg_in_repo / "include" / "cachalot.h")
        self.assertEqual(_build.find_header(self.pkg_in_repo, {}), pkg_h)
        with self.assertRaises(SetupError) as e:
            _build.find_header(self.installed, {})
        self.assertIn("pip install", str(e.exception))
        self.assertIn("CACHALOT_INCLUDE", str(e.exception))
        inc = touch(self.tmp / "inc" / "cachalot.h")
        self.assertEqual(_build.find_header(self.installed, {"CACHALOT_INCLUDE": str(inc.parent)}), inc)

    def test_this_clone_is_recognised(self):
        self.assertEqual(_capi.repo_root(_util.PYTHON_DIR / "cachalot_torch"), _util.REPO)
        self.assertIsNone(_capi.repo_root(self.installed))


if __name__ == "__main__":
    unittest.main()
