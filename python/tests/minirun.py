"""A minimal stand-in for pytest, for machines without it: runs the
test_*.py functions of this folder with the same --allocator option,
supporting what these tests use (pytest.raises with match, skip, approx,
mark.parametrize, the `cachalot` and `tmp_path` fixtures).

    python python/tests/minirun.py --allocator cachalot [-k substring] [--json out.json]

Uses the real pytest when it is importable and --no-pytest is not given.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Skipped(Exception):
    pass


class _Raises:
    def __init__(self, exc, match=None):
        self.exc, self.match, self.value = exc, match, None

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            raise AssertionError(f"DID NOT RAISE {self.exc}")
        if not issubclass(et, self.exc):
            return False
        if self.match and not re.search(self.match, str(ev)):
            raise AssertionError(f"{self.match!r} does not match {str(ev)!r}")
        self.value = ev
        return True


class _Approx:
    def __init__(self, v, rel=1e-6, abs=1e-12):
        self.v, self.rel, self.abs = v, rel, abs

    def __eq__(self, other):
        return math.isclose(other, self.v, rel_tol=self.rel, abs_tol=self.abs)


def _parametrize(names, values):
    def deco(f):
        f.__dict__.setdefault("_params", []).append((names, list(values)))
        return f
    return deco


def fake_pytest() -> types.ModuleType:
    m = types.ModuleType("pytest")
    m.raises = _Raises
    m.approx = _Approx

    def skip(msg=""):
        raise Skipped(msg)

    m.skip = skip
    m.fixture = lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda f: f))
    m.mark = types.SimpleNamespace(parametrize=_parametrize)
    return m


def cases(f):
    params = f.__dict__.get("_params", [])
    if not params:
        yield f.__name__, {}
        return
    axes = []
    for names, values in params:
        names = [n.strip() for n in names.split(",")]
        axes.append([dict(zip(names, v if len(names) > 1 else (v,))) for v in values])
    for combo in itertools.product(*axes):
        kw = {}
        for d in combo:
            kw.update(d)
        yield f"{f.__name__}[{'-'.join(str(v) for v in kw.values())}]", kw


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", default=None, choices=["native", "cachalot"])
    ap.add_argument("-k", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    if "pytest" not in sys.modules:
        sys.modules["pytest"] = fake_pytest()
    import _setup

    _setup.setup(args.allocator)
    print(_setup.describe(), flush=True)
    import torch

    results = []
    for path in sorted(HERE.glob("test_*.py")):
        mod = importlib.import_module(path.stem)
        for name in sorted(n for n in dir(mod) if n.startswith("test_")):
            f = getattr(mod, name)
            if not callable(f):
                continue
            for case, kw in cases(f):
                full = f"{path.name}::{case}"
                if args.k and args.k not in full:
                    continue
                t0 = time.perf_counter()
                status, msg = "passed", ""
                try:
                    with tempfile.TemporaryDirectory() as tmp:
                        fixtures = {"cachalot": _setup.is_cachalot(), "tmp_path": Path(tmp)}
                        argnames = f.__code__.co_varnames[: f.__code__.co_argcount]
                        call = {a: kw[a] if a in kw else fixtures[a] for a in argnames}
                        f(**call)
                except Skipped as e:
                    status, msg = "skipped", str(e)
                except Exception:  # noqa: BLE001 - report every failure
                    status, msg = "failed", traceback.format_exc()
                finally:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                dt = time.perf_counter() - t0
                print(f"{status.upper():8} {full} ({dt:.2f}s)", flush=True)
                if status == "failed":
                    print(msg, flush=True)
                results.append({"test": full, "status": status, "seconds": dt, "message": msg[-2000:]})
    counts = {s: sum(r["status"] == s for r in results) for s in ("passed", "failed", "skipped")}
    print(f"== {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
          f"({_setup.ALLOCATOR})")
    out = args.json or os.environ.get("CACHALOT_TEST_JSON")
    if out:
        Path(out).write_text(json.dumps(results, indent=1))
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
