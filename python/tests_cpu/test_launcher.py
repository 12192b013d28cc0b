"""`python -m cachalot_torch run`: argument handling, and an unchanged
script run as `python script.py` would run it (`__name__`, `sys.argv`,
`sys.path[0]`, `sys.modules["__main__"]`, exit status), with cachalot's
install replaced by a recorder (no torch, no GPU here)."""

from __future__ import annotations

import json
import tempfile
import textwrap
import unittest
from pathlib import Path

from _util import fake_torch, run_python

from cachalot_torch import _launch

# Runs _launch.main with an install that records the Launch it got in
# $RECORD (a JSON file); the words after -c are the launcher's argv.
DRIVER = textwrap.dedent("""\
    import json, os, sys
    from cachalot_torch import _launch

    def install(launch):
        with open(os.environ["RECORD"], "w") as f:
            json.dump({"config": launch.config, "mode": launch.mode, "lib": launch.lib}, f)
        if os.environ.get("FAIL_INSTALL"):
            from cachalot_torch import SetupError
            raise SetupError("no compiler: apt-get install g++")

    sys.exit(_launch.main(sys.argv[1:], install=install))
    """)

# An unchanged script: reports what it sees into $SEEN and exits with
# the status given as its first argument.
SCRIPT = textwrap.dedent("""\
    import json, os, pickle, sys
    import helper                       # a module next to the script

    class Point:                        # pickled by reference to __main__
        pass

    seen = {
        "name": __name__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "main_is_me": sys.modules["__main__"].__dict__.get("Point") is Point,
        "pickled": type(pickle.loads(pickle.dumps(Point()))).__name__,
        "helper": helper.VALUE,
    }
    with open(os.environ["SEEN"], "w") as f:
        json.dump(seen, f)
    if __name__ == "__main__":
        code = sys.argv[1]
        if code == "raise":
            raise ValueError("boom")
        sys.exit(int(code))
    """)


class ParseTest(unittest.TestCase):
    def test_options_before_the_script_and_the_rest_is_the_scripts(self):
        la = _launch.parse(["--config", "placement:pytorch", "--mode=pluggable", "-v", "train.py",
                            "--config", "x", "-m", "y", "--", "z"])
        self.assertEqual((la.target, la.is_module), ("train.py", False))
        self.assertEqual(la.args, ["--config", "x", "-m", "y", "--", "z"])
        self.assertEqual((la.config, la.mode, la.verbose), ("placement:pytorch", "pluggable", True))

    def test_module_and_double_dash(self):
        la = _launch.parse(["--lib=/x/lib.so", "-m", "pkg.train", "--lr", "3"])
        self.assertEqual((la.target, la.is_module, la.args, la.lib), ("pkg.train", True, ["--lr", "3"], "/x/lib.so"))
        la = _launch.parse(["-mpkg.train", "a"])
        self.assertEqual((la.target, la.is_module, la.args), ("pkg.train", True, ["a"]))
        la = _launch.parse(["--", "-weird-name.py", "a"])
        self.assertEqual((la.target, la.args), ("-weird-name.py", ["a"]))

    def test_bad_arguments_are_usage_errors(self):
        for argv, msg in [([], "no script"), (["--config"], "needs a value"), (["-m"], "module name"),
                          (["--frobnicate", "x.py"], "unknown option"), (["--mode", "fast", "x.py"], "--mode")]:
            with self.subTest(argv=argv):
                with self.assertRaises(_launch.UsageError) as e:
                    _launch.parse(argv)
                self.assertIn(msg, str(e.exception))
        self.assertIsNone(_launch.parse(["--help"]))


class RunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="cachalot-launch-"))
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)
        self.scripts = self.tmp / "scripts"
        self.scripts.mkdir()
        (self.scripts / "train.py").write_text(SCRIPT)
        (self.scripts / "helper.py").write_text("VALUE = 42\n")
        self.cwd = self.tmp / "elsewhere"
        self.cwd.mkdir()
        self.env = {"RECORD": str(self.tmp / "record.json"), "SEEN": str(self.tmp / "seen.json")}

    def launch(self, *argv, **env):
        return run_python(["-c", DRIVER, *argv], cwd=self.cwd, env_extra={**self.env, **env})

    def seen(self):
        return json.loads(Path(self.env["SEEN"]).read_text())

    def test_the_script_runs_as_main_with_its_arguments_and_exit_status(self):
        script = str(self.scripts / "train.py")
        p = self.launch("--config", "placement:pytorch", script, "7", "--epochs", "2")
        self.assertEqual(p.returncode, 7, p.stderr)
        self.assertEqual(json.loads(Path(self.env["RECORD"]).read_text()),
                         {"config": "placement:pytorch", "mode": None, "lib": None})
        seen = self.seen()
        self.assertEqual(seen["name"], "__main__")
        self.assertEqual(seen["argv"], [script, "7", "--epochs", "2"])
        self.assertEqual(seen["path0"], str(self.scripts))
        self.assertTrue(seen["main_is_me"])
        self.assertEqual((seen["pickled"], seen["helper"]), ("Point", 42))

    def test_exit_zero_and_an_uncaught_exception(self):
        script = str(self.scripts / "train.py")
        self.assertEqual(self.launch(script, "0").returncode, 0)
        p = self.launch(script, "raise")
        self.assertEqual(p.returncode, 1)
        self.assertIn("ValueError: boom", p.stderr)

    def test_a_module_runs_as_python_dash_m(self):
        pkg = self.cwd / "mypkg"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        (pkg / "train.py").write_text(
            "import json, os, sys\n"
            "json.dump({'name': __name__, 'argv': sys.argv[1:]}, open(os.environ['SEEN'], 'w'))\n"
            "sys.exit(3)\n")
        p = self.launch("-m", "mypkg.train", "a", "--b")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertEqual(self.seen(), {"name": "__main__", "argv": ["a", "--b"]})

    def test_a_setup_error_stops_before_the_script(self):
        p = self.launch(str(self.scripts / "train.py"), "0", FAIL_INSTALL="1")
        self.assertEqual(p.returncode, 2)
        self.assertEqual(p.stderr.strip(), "cachalot_torch: no compiler: apt-get install g++")
        self.assertFalse(Path(self.env["SEEN"]).exists())

    def test_a_missing_script_and_bad_options(self):
        p = self.launch(str(self.tmp / "nope.py"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("no such file", p.stderr)
        self.assertFalse(Path(self.env["RECORD"]).exists())
        p = self.launch("--nope", "x.py")
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage: python -m cachalot_torch run", p.stderr)

    def test_python_dash_m_cachalot_torch_run_checks_torch_first(self):
        """The real entry point (`python -m cachalot_torch run`), with a
        torch that is missing, CPU-only or of another version: one line
        naming what to install, status 2, the script never starts."""
        script = str(self.scripts / "train.py")
        cases = [
            (dict(importable=False), "pip install 'torch==2.11.*'"),
            (dict(cuda=None), "CPU-only build"),
            (dict(version="2.10.1+cu128", cuda="12.8"), "supports torch 2.11.x"),
            (dict(version="2.12.0", cuda="13.0"), "this is torch 2.12.0"),
        ]
        for i, (kw, want) in enumerate(cases):
            with self.subTest(**kw):
                root = fake_torch(self.tmp / f"torch{i}", **kw)
                p = run_python(["-m", "cachalot_torch", "run", script, "0"], cwd=self.cwd,
                               env_extra=self.env, path_first=[root])
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(want, p.stderr)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
                self.assertFalse(Path(self.env["SEEN"]).exists())


if __name__ == "__main__":
    unittest.main()
