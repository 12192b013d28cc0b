"""`python -m cachalot_torch run [options] script.py [args...]` (or
`-m module [args...]`): runs an unchanged script with cachalot installed as
PyTorch's CUDA allocator before the script starts, as `python -m cProfile`
runs one under the profiler. Under torchrun each worker runs it:

    torchrun --nproc_per_node 8 -m cachalot_torch run train.py --lr 3e-4

The script sees what `python script.py args` would give it: `__name__ ==
"__main__"`, `sys.argv[1:] == args` (`sys.argv[0]`: the script's path),
its own folder first on `sys.path`, `sys.modules["__main__"]` its module
(pickling its classes works); its exit status is the launcher's
(`sys.exit(n)`: n; an uncaught exception: 1, with its traceback). Configuration: `--config` (cachalot's configuration string,
e.g. `placement:pytorch`), else $CACHALOT_ALLOC_CONF, else
$PYTORCH_CUDA_ALLOC_CONF (read by the library); `--mode` or
$CACHALOT_TORCH_MODE. A setup problem (no torch 2.11, no compiler, no CUDA
headers) is one line on stderr naming what to install, and exit status 2;
so is a configuration cachalot refuses; the script does not start.

The Python processes the script starts (torch.multiprocessing.spawn,
DataLoader workers, subprocesses of sys.executable) run cachalot too, with
the same settings, installed when each first imports torch
(`_children.py`); `--no-children` leaves them on PyTorch's allocator.
"""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import dataclass, field

USAGE = """\
usage: python -m cachalot_torch run [--config CONF] [--mode shim|pluggable] [--lib PATH]
                                    [--no-children] [--verbose] (script.py | -m module) [args ...]

Runs the script (or module) with cachalot installed as PyTorch's CUDA
allocator before it starts; the script is unchanged and sees the arguments
after its name. Under torchrun: torchrun ... -m cachalot_torch run script.py ...

options:
  --config CONF   cachalot's configuration string (PyTorch's grammar plus
                  cachalot's keys, e.g. placement:pytorch); default:
                  $CACHALOT_ALLOC_CONF, else $PYTORCH_CUDA_ALLOC_CONF
  --mode MODE     shim (default; $CACHALOT_TORCH_MODE) or pluggable
  --lib PATH      libcachalot_capi.so to use (default: the installed one)
  --no-children   the Python processes the script starts keep PyTorch's
                  allocator (by default they run cachalot with these
                  settings, installed when they import torch)
  --verbose       print what is installed before the script starts
  -m MODULE       run a module (as python -m MODULE)
  --              end of options: the next word is the script
"""


class UsageError(Exception):
    """Bad launcher arguments (exit status 2, with the usage)."""


@dataclass
class Launch:
    """What `run` was asked to do."""

    target: str
    is_module: bool = False
    args: list[str] = field(default_factory=list)
    config: str | None = None
    mode: str | None = None
    lib: str | None = None
    verbose: bool = False
    children: bool = True


_VALUED = {"--config": "config", "--mode": "mode", "--lib": "lib"}


def parse(argv: list[str]) -> Launch | None:
    """The launch `argv` (the words after `run`) asks for; None for
    --help. Options come before the script; everything after the script
    (or module) name is the script's, untouched."""
    opts: dict = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            return None
        if a == "--":
            i += 1
            break
        if a == "--verbose" or a == "-v":
            opts["verbose"] = True
            i += 1
            continue
        if a == "--no-children":
            opts["children"] = False
            i += 1
            continue
        if a == "-m" or (a.startswith("-m") and len(a) > 2 and not a.startswith("--")):
            name = a[2:] if len(a) > 2 else (argv[i + 1] if i + 1 < len(argv) else None)
            if not name:
                raise UsageError("-m needs a module name")
            rest = argv[i + (1 if len(a) > 2 else 2):]
            return Launch(target=name, is_module=True, args=rest, **opts)
        key, eq, val = a.partition("=")
        if key in _VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{key} needs a value")
                val = argv[i + 1]
                i += 1
            opts[_VALUED[key]] = val
            i += 1
            continue
        if a.startswith("-"):
            raise UsageError(f"unknown option {a!r} (the launcher's options come before the script)")
        break
    if i >= len(argv):
        raise UsageError("no script given")
    if opts.get("mode") not in (None, "shim", "pluggable"):
        raise UsageError(f"--mode must be shim or pluggable, not {opts['mode']!r}")
    return Launch(target=argv[i], args=argv[i + 1:], **opts)


def _default_install(launch: Launch) -> None:
    import cachalot_torch

    cachalot_torch.install(config=launch.config, mode=launch.mode, lib_path=launch.lib,
                           verbose=launch.verbose)
    if launch.verbose:
        print(f"cachalot_torch: installed (mode {cachalot_torch.installed_mode()}, library "
              f"{cachalot_torch._capi.loaded_path()}, package {os.path.dirname(cachalot_torch.__file__)})",
              file=sys.stderr, flush=True)


def main(argv: list[str], install=None) -> int:
    """The `run` command: parses `argv`, installs cachalot (`install`,
    called with the Launch; default: cachalot_torch.install) and runs the
    script in this process. Returns the exit status for a launcher error;
    the script's own exit (SystemExit, or an uncaught exception)
    propagates unchanged."""
    from ._requirements import SetupError, one_line

    try:
        launch = parse(argv)
    except UsageError as e:
        print(f"cachalot_torch run: {e}\n\n{USAGE}", file=sys.stderr, end="")
        return 2
    if launch is None:
        print(USAGE, end="")
        return 0
    if not launch.is_module and not os.path.exists(launch.target):
        print(f"cachalot_torch run: {launch.target}: no such file", file=sys.stderr)
        return 2
    try:
        (install or _default_install)(launch)
    except SetupError as e:
        print(one_line(e), file=sys.stderr)
        return 2
    except (RuntimeError, ValueError) as e:  # e.g. a configuration cachalot refuses
        print(f"cachalot_torch run: cachalot could not be installed, the script did not start: {e}",
              file=sys.stderr)
        return 2
    if launch.children:
        from . import _children

        os.environ.update(_children.environment(launch.config, launch.mode, launch.lib))
    if launch.is_module:
        # as `python -m module`: sys.path[0] stays the current folder
        sys.argv[:] = [launch.target, *launch.args]  # runpy sets argv[0] to the module's file
        runpy.run_module(launch.target, run_name="__main__", alter_sys=True)
    else:
        path = os.path.abspath(launch.target)
        # as `python script.py`: the script's folder first on sys.path, in
        # place of this launcher's (the current folder, for python -m)
        if sys.path and sys.path[0] in ("", os.getcwd()):
            sys.path[0] = os.path.dirname(path)
        else:
            sys.path.insert(0, os.path.dirname(path))
        sys.argv[:] = [launch.target, *launch.args]
        runpy.run_path(path, run_name="__main__")
    return 0
