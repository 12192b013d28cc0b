"""client_speed.py's driver (no torch needed): the per-process median
without the warm-up, the median over processes, and the checks of issue 39
(cachalot's default against native and fixed segments, its peak against
native's expandable mode, outputs identical)."""

import importlib.util
import unittest
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "client_speed", Path(__file__).resolve().parent.parent / "client_speed.py")
client_speed = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(client_speed)

MiB = 1 << 20


def run(way, ms, peak_mib, outputs="same", warm=None, workload="train"):
    # a process: `warm` slow warm-up steps, then steps of `ms` milliseconds
    steps = ([1.0] * (warm if warm is not None else client_speed.WARMUP[workload])) + [x / 1e3 for x in ms]
    return {"workload": workload, "way": way, "step_s": steps, "outputs": outputs,
            "peak_reserved": peak_mib * MiB}


class Summary(unittest.TestCase):
    def test_warm_up_steps_are_left_out_of_a_process_median(self):
        r = run("native", [10, 12, 11], 100)
        self.assertAlmostEqual(client_speed.process_median(r, client_speed.WARMUP["train"]), 0.011)

    def test_all_checks_pass_and_the_median_is_over_processes(self):
        runs = [run("native", [10, 10, 10], 300), run("native", [14, 14, 14], 300), run("native", [12] * 3, 300),
                run("native-expandable", [11] * 3, 200), run("native-expandable", [11] * 3, 210),
                run("cachalot", [9] * 3, 190), run("cachalot", [11] * 3, 190), run("cachalot", [10] * 3, 195),
                run("cachalot-fixed", [10] * 3, 300), run("cachalot-fixed", [10] * 3, 300)]
        lines, same, ok = client_speed.summarize(runs)
        self.assertTrue(same)
        self.assertTrue(ok, "\n".join(lines))
        row = next(x for x in lines if x.startswith("| train | cachalot |"))
        # median of 9, 11, 10 and its spread; x native: 10 / 12
        self.assertIn("10.00 (9.00..11.00)", row)
        self.assertIn("0.833", row)
        # the peak is the largest of the processes'
        self.assertIn("| 195 |", row)
        self.assertEqual(sum("PASS" in x for x in lines), 3)

    def test_slower_than_fixed_by_more_than_one_percent_misses(self):
        runs = [run("native", [20] * 3, 300), run("native-expandable", [20] * 3, 200),
                run("cachalot", [10.2] * 3, 190), run("cachalot-fixed", [10.0] * 3, 300)]
        lines, same, ok = client_speed.summarize(runs)
        self.assertTrue(same)
        self.assertFalse(ok)
        self.assertTrue(any("MISS" in x and "fixed segments" in x for x in lines), "\n".join(lines))
        # within 1% passes
        runs[2] = run("cachalot", [10.09] * 3, 190)
        self.assertTrue(client_speed.summarize(runs)[2])

    def test_more_memory_than_native_expandable_misses(self):
        runs = [run("native", [20] * 3, 300), run("native-expandable", [20] * 3, 200),
                run("cachalot", [10] * 3, 201)]
        lines, _, ok = client_speed.summarize(runs)
        self.assertFalse(ok)
        self.assertTrue(any("MISS peak reserved 201 MiB" in x for x in lines), "\n".join(lines))

    def test_an_output_that_differs_is_named_and_fails(self):
        runs = [run("native", [10] * 3, 300), run("cachalot", [9] * 3, 100, outputs="other")]
        lines, same, ok = client_speed.summarize(runs)
        self.assertFalse(same)
        self.assertFalse(ok)
        self.assertTrue(any(x.startswith("| train | cachalot |") and x.endswith("| NO |") for x in lines))
        self.assertIn("outputs identical to native's: NO", lines)

    def test_workloads_are_summarized_apart(self):
        runs = [run("native", [10] * 3, 300, workload="bert"), run("cachalot", [9] * 3, 100, workload="bert"),
                run("native", [50] * 3, 300, workload="generate"),
                run("cachalot", [60] * 3, 100, workload="generate")]
        lines, same, ok = client_speed.summarize(runs)
        self.assertTrue(same)
        self.assertFalse(ok)
        self.assertIn("bert: PASS median step 9.00 ms <= native's 10.00", lines)
        self.assertIn("generate: MISS median step 60.00 ms <= native's 50.00", lines)


class Child(unittest.TestCase):
    def _run(self, way, steps=0):
        import types

        seen = []

        def run(cmd, env=None, **_):
            seen.append((cmd, env))
            return types.SimpleNamespace(stdout='noise\nRESULT {"workload": "train"}\n', stderr="", returncode=0)

        mem = client_speed.child_result.__globals__["subprocess"]
        real, mem.run = mem.run, run
        try:
            args = types.SimpleNamespace(steps=steps, lib="/x/lib.so")
            r = client_speed.child("train", way, args)
        finally:
            mem.run = real
        return r, seen[0]

    def test_a_native_way_gets_pytorchs_setting_and_nothing_inherited(self):
        import os

        os.environ["CACHALOT_ALLOC_CONF"] = "expandable_segments:False"
        try:
            r, (cmd, env) = self._run(("native-expandable", "native", "expandable_segments:True"))
        finally:
            del os.environ["CACHALOT_ALLOC_CONF"]
        self.assertEqual(r, {"workload": "train", "way": "native-expandable"})
        self.assertEqual(env["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True")
        self.assertNotIn("CACHALOT_ALLOC_CONF", env)
        self.assertEqual(env["CUBLAS_WORKSPACE_CONFIG"], ":4096:8")
        self.assertNotIn("--lib", cmd)
        self.assertEqual(cmd[cmd.index("--steps") + 1], str(client_speed.STEPS["train"]))

    def test_a_cachalot_way_gets_the_library_and_its_config(self):
        _, (cmd, env) = self._run(("cachalot-fixed", "cachalot", "expandable_segments:False"), steps=7)
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", env)
        self.assertEqual(cmd[cmd.index("--lib") + 1], "/x/lib.so")
        self.assertEqual(cmd[cmd.index("--config") + 1], "expandable_segments:False")
        self.assertEqual(cmd[cmd.index("--allocator") + 1], "cachalot")
        self.assertEqual(cmd[cmd.index("--steps") + 1], "7")


class SummarizeFile(unittest.TestCase):
    def test_a_saved_run_is_summarized_with_its_exit_status(self):
        import json
        import subprocess
        import sys
        import tempfile

        runs = [run("native", [10] * 3, 300), run("cachalot", [12] * 3, 100)]
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "runs.json"
            f.write_text(json.dumps(runs))
            script = str(Path(client_speed.__file__))
            p = subprocess.run([sys.executable, script, "--summarize", str(f)], capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("train: MISS median step 12.00 ms <= native's 10.00", p.stdout)
            p = subprocess.run([sys.executable, script, "--summarize", str(f), "--strict"],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            runs[1]["outputs"] = "other"
            f.write_text(json.dumps(runs))
            p = subprocess.run([sys.executable, script, "--summarize", str(f)], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)


if __name__ == "__main__":
    unittest.main()
