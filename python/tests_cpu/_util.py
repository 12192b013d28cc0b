"""Shared helpers of the CPU tests: the package under test (this clone's
python/cachalot_torch), subprocesses of the current interpreter, and fake
torch packages (so that the setup checks run without torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parent.parent
REPO = PYTHON_DIR.parent
if str(PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(PYTHON_DIR))


def run_python(args, cwd=None, env_extra=None, path_first=(), timeout=120):
    """Runs this interpreter with `args`, this clone's python/ on
    PYTHONPATH after `path_first`; returns the CompletedProcess (text)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHALOT_", "PYTORCH_CUDA_ALLOC_CONF"))}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path_first), str(PYTHON_DIR)])
    env.update(env_extra or {})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def fake_torch(root: Path, version: str = "2.11.0+cu130", cuda: str | None = "13.0",
               hip: str | None = None, importable: bool = True, devices: int = 1) -> Path:
    """Writes a package `torch` under `root` (put `root` first on the
    path) that reports `version`, `cuda` and `hip` like torch does and
    `devices` visible devices (`torch.cuda.is_available()`), or fails to
    import when not `importable`; returns `root`."""
    pkg = root / "torch"
    pkg.mkdir(parents=True, exist_ok=True)
    if not importable:
        (pkg / "__init__.py").write_text('raise ImportError("torch is hidden for this test")\n')
        return root
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""\
        import types
        __version__ = {version!r}
        version = types.SimpleNamespace(cuda={cuda!r}, hip={hip!r}, git_version="0" * 40)
        _C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)

        class _Cuda:
            @staticmethod
            def is_initialized():
                return False

            @staticmethod
            def is_available():
                return {devices} > 0

        cuda = _Cuda()
        """))
    return root
