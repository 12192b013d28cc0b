"""`python -m cachalot_torch [--force] [--lib PATH]`: builds the shim for
the installed torch (or finds it in the cache) and prints its path."""

import argparse

from . import _build, _capi

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--lib", default=None, help="path of libcachalot_capi.so")
ap.add_argument("--force", action="store_true", help="rebuild even when cached")
args = ap.parse_args()
print(_build.build_shim(_capi.find_library(args.lib), force=args.force, verbose=True))
