"""Child processes of a launched script get cachalot too.

A script run by `python -m cachalot_torch run` may start more Python
processes that use CUDA: `torch.multiprocessing.spawn` (DDP without
torchrun), DataLoader workers, a `multiprocessing` pool with the "spawn" or
"forkserver" start method, `subprocess.run([sys.executable, ...])`. Each is
a fresh interpreter that would otherwise run PyTorch's own allocator. As
`ddtrace-run` does for its tracer, the launcher hands its choice down
through the environment, which those processes inherit:

* `CACHALOT_TORCH_CHILDREN`: the launch's configuration, mode and library
  (JSON);
* `PYTHONPATH` starts with the package's `_bootstrap/` folder, whose
  `sitecustomize.py` Python runs at start-up. When the variable is set, a
  finder there waits for the process's first `import torch` and asks
  `hook_spec` here for torch's spec: torch's own, with a loader that
  installs cachalot right after torch has run, before anything can
  initialize CUDA. Then it runs the `sitecustomize` it shadows, if any.

A process that never imports torch imports nothing of cachalot_torch; a
process of another Python installation (`sys.prefix`: another venv's
interpreter) is left alone. A
process started with `-E` or `-I` (which ignore the environment) runs
PyTorch's allocator, as it would ignore `PYTORCH_CUDA_ALLOC_CONF`. A child
where cachalot cannot be installed fails at its `import torch` with the
reason, as the launcher refuses to start the script: never silently on
another allocator; a child that cannot use a GPU at all (no visible
device, a CPU build of torch) runs on, as it would have natively. `python -m cachalot_torch run --no-children` leaves the
environment alone.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
from pathlib import Path

#: The environment variable the launcher sets for its child processes.
ENV = "CACHALOT_TORCH_CHILDREN"
#: The fields of `ENV`'s JSON.
_FIELDS = ("config", "mode", "lib", "prefix")
#: The folder whose sitecustomize.py arms the hook.
BOOTSTRAP = Path(__file__).resolve().parent / "_bootstrap"


def environment(config: str | None, mode: str | None, lib: str | None,
                environ: dict | None = None) -> dict:
    """The environment variables a launched script's children need (to be
    set in `os.environ` before the script starts): `ENV` and `PYTHONPATH`
    with `BOOTSTRAP` first."""
    environ = os.environ if environ is None else environ
    value = json.dumps({"config": config, "mode": mode,
                        "lib": os.path.abspath(lib) if lib else None,
                        # another Python installation (a different venv's
                        # interpreter) is left alone
                        "prefix": sys.prefix})
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(BOOTSTRAP)]
    return {ENV: value, "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), *rest])}


def settings(environ: dict | None = None) -> dict | None:
    """The launch's settings handed down in `ENV`, or None when unset.
    A value that is not the launcher's JSON is a ValueError naming it."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV)
    if not raw:
        return None
    try:
        s = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{ENV}={raw!r} is not what the launcher writes: {e}") from None
    if not isinstance(s, dict) or not all(
            isinstance(s.get(k), (str, type(None))) for k in _FIELDS):
        raise ValueError(f"{ENV}={raw!r} is not what the launcher writes")
    return {k: s.get(k) for k in _FIELDS}


def _cuda_usable() -> bool:
    import torch

    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a torch without CUDA, a broken driver: no CUDA here
        return False


def _install_now(s: dict) -> None:
    import cachalot_torch

    try:
        cachalot_torch.install(config=s["config"], mode=s["mode"], lib_path=s["lib"])
    except (cachalot_torch.SetupError, RuntimeError, ValueError) as e:
        if not _cuda_usable():
            # a process with no GPU to use (CUDA_VISIBLE_DEVICES="", a CPU
            # build of torch): it allocates nothing on a GPU, natively
            # either, and runs on as it would have
            return
        from ._requirements import one_line

        detail = one_line(e) if isinstance(e, cachalot_torch.SetupError) else str(e)
        raise ImportError(
            f"cachalot_torch: this process (pid {os.getpid()}) was started by a script run under "
            f"`python -m cachalot_torch run`, and cachalot could not be installed in it: {detail}"
        ) from e


class _Loader(importlib.abc.Loader):
    """torch's own loader, then the install."""

    def __init__(self, inner, s: dict):
        self.inner, self.s = inner, s

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        # (torch's module keeps its own loader: importlib.resources and
        # reloads see nothing of the hook)
        module.__loader__ = self.inner
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        _install_now(self.s)


def hook_spec(name: str, path=None, target=None):
    """torch's module spec as the finders on sys.meta_path give it, with a
    loader that installs cachalot (with the settings in `ENV`) once torch
    has run: what the bootstrap's finder answers for `import torch`. None
    when torch is not found (the import then fails as it would have)."""
    s = settings()
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path, target) if find else None
        if spec is not None:
            break
    else:
        return None
    if s is not None and spec.loader is not None:
        spec.loader = _Loader(spec.loader, s)
    return spec
