"""bench_host.py's driver (no torch needed): the CPU the measurement
processes are pinned to, and the paired difference to native."""

import importlib.util
import os
import unittest
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "bench_host", Path(__file__).resolve().parent.parent / "bench_host.py")
bench_host = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench_host)


class PinCpu(unittest.TestCase):
    @unittest.skipUnless(hasattr(os, "sched_getaffinity"), "no sched_getaffinity on this platform")
    def test_auto_is_a_cpu_this_process_may_use(self):
        cpu = bench_host.pin_cpu("auto")
        self.assertIn(cpu, os.sched_getaffinity(0))
        self.assertEqual(cpu, max(os.sched_getaffinity(0)))

    def test_none_leaves_the_scheduler_alone(self):
        self.assertIsNone(bench_host.pin_cpu("none"))

    @unittest.skipUnless(hasattr(os, "sched_getaffinity"), "no sched_getaffinity on this platform")
    def test_a_cpu_outside_the_affinity_is_refused_by_name(self):
        outside = max(os.sched_getaffinity(0)) + 1
        with self.assertRaises(SystemExit) as e:
            bench_host.pin_cpu(str(outside))
        self.assertIn(f"--cpu {outside}", str(e.exception))
        with self.assertRaises(SystemExit) as e:
            bench_host.pin_cpu("fast")
        self.assertIn("not a number", str(e.exception))


class Child(unittest.TestCase):
    def _cmd(self, cpu, envs=None):
        seen = []

        class Done:
            stdout, stderr, returncode = 'RESULT {"mode": "native"}\n', "", 0

        def run(cmd, **kw):
            seen.append(cmd)
            if envs is not None:
                envs.append(kw.get("env"))
            return Done()

        real = bench_host.subprocess.run
        bench_host.subprocess.run = run
        try:
            self.assertEqual(bench_host.run_child("native", 10, cpu), {"mode": "native"})
        finally:
            bench_host.subprocess.run = real
        return seen[0]

    def test_the_child_gets_the_drivers_cpu(self):
        cmd = self._cmd(3)
        self.assertEqual(cmd[cmd.index("--cpu") + 1], "3")

    def test_every_child_hashes_strings_alike(self):
        envs = []
        self._cmd(3, envs)
        self.assertEqual(envs[0]["PYTHONHASHSEED"], "0")

    def test_no_pinning_reaches_the_child_too(self):
        # (the child's own default would pin it)
        cmd = self._cmd(None)
        self.assertEqual(cmd[cmd.index("--cpu") + 1], "none")


class Paired(unittest.TestCase):
    def test_the_difference_is_taken_within_each_repetition(self):
        # the base drew one slow process (4,000 ns) and the mode two: the
        # medians of each side differ by 2,000 ns, the paired differences
        # are 100, 100 and 2,100
        shim = [{"c": 2100}, {"c": 4100}, {"c": 4100}]
        native = [{"c": 2000}, {"c": 4000}, {"c": 2000}]
        self.assertEqual(bench_host.paired(shim, native, "c"), 100)


if __name__ == "__main__":
    unittest.main()


class InProcess(unittest.TestCase):
    def test_the_historys_cost_is_relative_to_its_own_process(self):
        # one fast process and two slow ones (2x): the relative cost is the
        # same 10% in each, whatever state the process drew
        runs = [{"c": 2200, "c:off": 2000}, {"c": 4400, "c:off": 4000},
                {"c": 4400, "c:off": 4000}]
        self.assertAlmostEqual(bench_host.in_process(runs, "c"), 0.10)

    def test_decomposed_takes_the_off_difference_and_both_costs(self):
        runs = {
            "native": [{"c": 2000}, {"c": 4000}, {"c": 2000}],
            "shim": [{"c": 1900}, {"c": 3900}, {"c": 3800}],
            "native:python": [{"c": 6000, "c:off": 2000}, {"c": 12000, "c:off": 4000},
                              {"c": 6000, "c:off": 2000}],
            "shim:python": [{"c": 11400, "c:off": 3800}, {"c": 5700, "c:off": 1900},
                            {"c": 11400, "c:off": 3800}],
        }
        d, mine, theirs = bench_host.decomposed(runs, "shim:python", "native:python", "shim",
                                                "native", "c")
        # paired off differences -100, -100, +1,800: median -100; both
        # sides cost 200% (the medians of the raw figures, 11,400 against
        # 6,000, would have called the shim 90% dearer)
        self.assertEqual(d, -100)
        self.assertAlmostEqual(mine, 2.0)
        self.assertAlmostEqual(theirs, 2.0)
