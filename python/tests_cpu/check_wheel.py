"""Checks a built cachalot_torch wheel, without torch or a GPU:

    python3 python/tests_cpu/check_wheel.py dist/cachalot_torch-*.whl

1. its files: the package's modules, shim.cpp, include/cachalot.h,
   lib/libcachalot_capi.so; its tag: py3-none-<platform>, not pure;
2. installed with pip (--no-deps --no-index) into an empty folder, and
   imported from a folder outside the repository with only that folder on
   the path: the package, the library and the header come from there, and
   the library works (the mock device: cachalot's 122 statistics).

Prints one line per check and `wheel: N passed, N failed` last.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

WANT = [
    "cachalot_torch/__init__.py",
    "cachalot_torch/__main__.py",
    "cachalot_torch/_build.py",
    "cachalot_torch/_capi.py",
    "cachalot_torch/_children.py",
    "cachalot_torch/_bootstrap/sitecustomize.py",
    "cachalot_torch/_launch.py",
    "cachalot_torch/_requirements.py",
    "cachalot_torch/shim.cpp",
    "cachalot_torch/include/cachalot.h",
    "cachalot_torch/lib/libcachalot_capi.so",
]

PROBE = textwrap.dedent("""\
    import os, sys
    site = os.path.realpath(sys.argv[1])
    import cachalot_torch
    from cachalot_torch import _build
    where = {"package": os.path.dirname(cachalot_torch.__file__),
             "library": cachalot_torch.find_library(),
             "header": str(_build.find_header())}
    for what, path in where.items():
        assert os.path.realpath(path).startswith(site + os.sep), (what, path)
    assert cachalot_torch.backend_name() == "mock", cachalot_torch.backend_name()
    stats = cachalot_torch.memory_stats(0)
    assert len(stats) == 122, len(stats)
    print("ok", where["library"])
    """)


def main(wheel: str) -> int:
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)

    whl = Path(wheel)
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        info = next((n for n in names if n.endswith(".dist-info/WHEEL")), None)
        meta = z.read(info).decode() if info else ""
        so = z.getinfo("cachalot_torch/lib/libcachalot_capi.so").file_size if \
            "cachalot_torch/lib/libcachalot_capi.so" in names else 0
    missing = [n for n in WANT if n not in names]
    check("files", not missing, f"missing {missing}" if missing else f"{len(WANT)} files, library {so >> 10} KiB")
    tags = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Tag:")]
    check("tag py3-none-<platform>", len(tags) == 1 and tags[0].startswith("py3-none-")
          and whl.name.endswith(f"-{tags[0]}.whl"), ", ".join(tags) or "no Tag")
    check("not pure Python", "Root-Is-Purelib: false" in meta)

    with tempfile.TemporaryDirectory(prefix="cachalot-wheel-") as tmp:
        site, away = Path(tmp) / "site", Path(tmp) / "away"
        away.mkdir()
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                            "--disable-pip-version-check", "--root-user-action=ignore",
                            "--target", str(site), str(whl.resolve())], capture_output=True, text=True)
        check("pip install --no-deps --no-index", p.returncode == 0,
              "" if p.returncode == 0 else (p.stdout + p.stderr).strip()[-300:])
        if p.returncode == 0:
            env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "CACHALOT_BACKEND": "mock",
                   "HOME": tmp}
            p = subprocess.run([sys.executable, "-c", PROBE, str(site)], cwd=away, env=env,
                               capture_output=True, text=True)
            check("imported from the install, library loads (mock)", p.returncode == 0,
                  (p.stdout + p.stderr).strip().splitlines()[-1] if (p.stdout + p.stderr).strip() else "")
    failed = results.count(False)
    print(f"wheel: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
