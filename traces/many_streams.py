#!/usr/bin/env python3
"""A many-streams trace: one block on each of N streams, all live at once.

    traces/many_streams.py OUT [--streams N] [--size BYTES] [--free]

writes OUT (a trace in the format of traces/README.md): `a i SIZE i` for
i in 0..N (stream i allocates block i and keeps it), then, with --free,
`f i` for each block (all freed at the end). Defaults: 1,000 streams (the
trace reader takes at most 1,024) of 85,983,232 B (82 MiB) each, about
80 GiB live at the peak: on a 140 GiB device it needs no more memory than
the device has, only one block's worth per stream, so what it checks is
that nothing else (address space for the streams' segments) runs out
first. Deterministic: the same arguments write the same file.
"""
import argparse
import os
import sys

MAX_STREAMS = 1024  # cachalot_core::replay's limit


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the trace file to write ('-': standard output)")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--size", type=int, default=82 << 20)
    ap.add_argument("--free", action="store_true", help="free every block at the end")
    a = ap.parse_args()
    if not 1 <= a.streams <= MAX_STREAMS:
        ap.error(f"--streams {a.streams} is outside 1..={MAX_STREAMS}")
    if not 1 <= a.size <= 1 << 40:
        ap.error(f"--size {a.size} is outside 1..=2^40")
    lines = [f"# trace many_streams: one {a.size} B block on each of {a.streams} streams"]
    lines += [f"a {i} {a.size} {i}" for i in range(a.streams)]
    if a.free:
        lines += [f"f {i}" for i in range(a.streams)]
    text = "\n".join(lines) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
