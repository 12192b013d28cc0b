"""The command line of cachalot_torch:

    python -m cachalot_torch run [options] script.py [args...]
        runs an unchanged script with cachalot as PyTorch's CUDA allocator
        (see _launch.py; also under torchrun: torchrun ... -m cachalot_torch run ...)
    python -m cachalot_torch build [--force] [--lib PATH]
        builds the C++ shim for the installed torch (or finds it in the
        cache) and prints its path; `python -m cachalot_torch [--force]
        [--lib PATH]` does the same
"""

from __future__ import annotations

import argparse
import sys


def build_main(argv: list[str]) -> int:
    """`build`: the shim's path on stdout; a setup problem is one line on
    stderr and exit status 2."""
    from . import _build, _capi
    from ._requirements import SetupError, one_line

    ap = argparse.ArgumentParser(prog="python -m cachalot_torch build",
                                 description="Builds the C++ shim for the installed torch (or finds "
                                 "it in the cache) and prints its path.")
    ap.add_argument("--lib", default=None, help="path of libcachalot_capi.so")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    args = ap.parse_args(argv)
    try:
        print(_build.build_shim(_capi.find_library(args.lib), force=args.force, verbose=True))
    except SetupError as e:
        print(one_line(e), file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "run":
        from . import _launch

        return _launch.main(argv[1:])
    if argv and argv[0] == "build":
        return build_main(argv[1:])
    if argv and argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    if argv and not argv[0].startswith("-"):
        print(f"cachalot_torch: unknown command {argv[0]!r}\n\n{__doc__.strip()}", file=sys.stderr)
        return 2
    return build_main(argv)


if __name__ == "__main__":
    sys.exit(main())
