"""Runs the CPU tests of cachalot_torch (no torch, no GPU needed) and
prints `python: N passed, N failed, N skipped` last; exit 1 on a failure
or when no test ran.

    python3 python/tests_cpu/run.py [-v]
"""

import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    sys.path.insert(0, str(HERE))
    suite = unittest.defaultTestLoader.discover(str(HERE), pattern="test_*.py", top_level_dir=str(HERE))
    verbosity = 2 if "-v" in sys.argv[1:] else 1
    result = unittest.TextTestRunner(verbosity=verbosity).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    for test, why in result.skipped:
        print(f"skipped: {test.id()}: {why}")
    passed = result.testsRun - failed - skipped
    print(f"python: {passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
