"""Child processes of a launched script (`_children.py`, the bootstrap's
sitecustomize.py): the launcher hands its settings down through the
environment, a child installs cachalot at its first `import torch` with
those settings (here a fake torch: the install gets as far as loading the
library the launch named, and fails there with the reason), a child
without the variable imports nothing of cachalot_torch, the shadowed
sitecustomize still runs, and `--no-children` hands nothing down."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

from _util import fake_torch, run_python

from cachalot_torch import _children

# A child: says it started, imports torch, says what it sees.
CHILD = textwrap.dedent("""\
    import json, sys
    print("started", flush=True)
    import torch
    print(json.dumps({"torch": torch.__version__,
                      "cachalot_imported": "cachalot_torch" in sys.modules,
                      "loader": type(torch.__loader__).__name__}), flush=True)
    """)


class EnvironmentTest(unittest.TestCase):
    def test_settings_round_trip_and_bootstrap_first_once(self):
        env = _children.environment("placement:pytorch", "shim", "lib.so",
                                    {"PYTHONPATH": os.pathsep.join(["/a", str(_children.BOOTSTRAP), "/b"])})
        self.assertEqual(env["PYTHONPATH"].split(os.pathsep), [str(_children.BOOTSTRAP), "/a", "/b"])
        s = _children.settings(env)
        self.assertEqual(s, {"config": "placement:pytorch", "mode": "shim", "lib": os.path.abspath("lib.so"),
                             "prefix": sys.prefix})
        self.assertIsNone(_children.settings({}))

    def test_a_foreign_value_is_refused_with_its_text(self):
        for raw in ["not json", "[1, 2]", '{"config": 3}']:
            with self.subTest(raw=raw), self.assertRaisesRegex(ValueError, "CACHALOT_TORCH_CHILDREN"):
                _children.settings({_children.ENV: raw})


class ChildTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        fake_torch(self.root / "site")
        (self.root / "child.py").write_text(CHILD)

    def tearDown(self):
        self.tmp.cleanup()

    def child(self, env, extra_path=()):
        # as the launcher leaves it: the bootstrap first, then the rest
        path = env.pop("PYTHONPATH", "").split(os.pathsep) if "PYTHONPATH" in env else []
        return run_python([str(self.root / "child.py")], env_extra=env,
                          path_first=[*[p for p in path if p], *extra_path, self.root / "site"])

    def test_a_child_installs_at_its_import_of_torch_with_the_launchs_settings(self):
        missing = self.root / "nowhere" / "libcachalot_capi.so"
        r = self.child(_children.environment("placement:pytorch", "shim", str(missing), {}))
        self.assertIn("started", r.stdout)            # the script ran up to its import
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("ImportError", r.stderr)
        self.assertIn("could not be installed", r.stderr)
        self.assertIn(str(missing), r.stderr)         # the launch's library, handed down

    def test_a_child_with_no_gpu_runs_on(self):
        # (CUDA_VISIBLE_DEVICES="": the install fails, and nothing needs it)
        fake_torch(self.root / "site", devices=0)
        r = self.child(_children.environment(None, None, str(self.root / "nowhere.so"), {}))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout.splitlines()[-1])["torch"], "2.11.0+cu130")

    def test_another_python_installation_is_left_alone(self):
        env = _children.environment(None, None, str(self.root / "nowhere.so"), {})
        s = json.loads(env[_children.ENV])
        s["prefix"] = str(self.root / "another-venv")
        env[_children.ENV] = json.dumps(s)
        r = self.child(env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(json.loads(r.stdout.splitlines()[-1])["cachalot_imported"])

    def test_without_the_variable_nothing_happens(self):
        r = self.child({"PYTHONPATH": str(_children.BOOTSTRAP)})
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = json.loads(r.stdout.splitlines()[-1])
        self.assertEqual(seen["torch"], "2.11.0+cu130")
        self.assertFalse(seen["cachalot_imported"])

    def test_the_shadowed_sitecustomize_still_runs(self):
        other = self.root / "other"
        other.mkdir()
        marker = self.root / "marker"
        (other / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
        env = _children.environment(None, None, None, {})
        r = run_python(["-c", "import sys; print(sys.modules['sitecustomize'].__file__)"],
                       env_extra=env, path_first=[*env.pop("PYTHONPATH").split(os.pathsep), other])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(marker.read_text(), "ran")
        self.assertEqual(Path(r.stdout.strip()).parent, other)


# Runs the launcher with a recording install; the script starts a child.
DRIVER = textwrap.dedent("""\
    import sys
    from cachalot_torch import _launch
    sys.exit(_launch.main(sys.argv[1:], install=lambda launch: None))
    """)

SCRIPT = textwrap.dedent("""\
    import subprocess, sys
    r = subprocess.run([sys.executable, sys.argv[1]], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    sys.exit(r.returncode)
    """)


class LauncherTest(unittest.TestCase):
    def test_the_launcher_hands_its_settings_to_the_scripts_children(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            fake_torch(root / "site")
            (root / "child.py").write_text(CHILD)
            (root / "script.py").write_text(SCRIPT)
            (root / "driver.py").write_text(DRIVER)
            missing = root / "nowhere.so"
            base = ["--config", "placement:pytorch", "--lib", str(missing)]
            r = run_python([str(root / "driver.py"), *base, str(root / "script.py"), str(root / "child.py")],
                           path_first=[root / "site"])
            self.assertIn("started", r.stdout)
            self.assertIn(str(missing), r.stderr)     # the child tried, with the launch's library
            self.assertNotEqual(r.returncode, 0)
            r = run_python([str(root / "driver.py"), "--no-children", *base, str(root / "script.py"),
                            str(root / "child.py")], path_first=[root / "site"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(json.loads(r.stdout.splitlines()[-1])["cachalot_imported"])


if __name__ == "__main__":
    unittest.main()
