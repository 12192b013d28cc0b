#!/usr/bin/env python3
"""Open a cachalot snapshot pickle with PyTorch's own memory viewer.

Usage (on a machine with torch installed, e.g. the GPU machine):

    cargo run --release -p cachalot-cli -- replay traces/gpt2_train.trace \
        --passes 1 --snapshot /tmp/gpt2.pickle
    python3 crates/cachalot/scripts/check_memory_viz.py /tmp/gpt2.pickle [OUTDIR]

It loads the snapshot, renders it with torch.cuda._memory_viz (trace_plot,
trace_plot with segments, segment_plot: HTML pages that embed the pickle and
load MemoryViz.js; segsum and trace: text reports; segments/memory: the
flamegraph input lines, without downloading flamegraph.pl), writes each to
OUTDIR (default: next to the snapshot) and prints the sizes. Any exception is
a failure (exit 1).

--viz-module PATH loads _memory_viz.py from a file instead of importing torch
(the module needs nothing from torch for these functions).
"""

import argparse
import importlib.util
import os
import pickle
import sys


def load_viz(path):
    if path is None:
        from torch.cuda import _memory_viz  # noqa: PLC0415

        return _memory_viz
    spec = importlib.util.spec_from_file_location("_memory_viz", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_structure(data):
    """The keys of torch.cuda.memory._snapshot() (PyTorch 2.11)."""
    assert set(data) >= {"segments", "device_traces", "allocator_settings"}, sorted(data)
    for seg in data["segments"]:
        for key in ("device", "address", "total_size", "allocated_size", "active_size",
                    "requested_size", "stream", "segment_type", "segment_pool_id",
                    "is_expandable", "frames", "blocks"):
            assert key in seg, key
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"], seg["address"]
        for b in seg["blocks"]:
            assert b["requested_size"] <= b["size"], b
    for trace in data["device_traces"]:
        for e in trace:
            assert "action" in e and "size" in e and "stream" in e and "frames" in e, e


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", help="snapshot pickle written by cachalot")
    ap.add_argument("outdir", nargs="?", help="where to write the renderings")
    ap.add_argument("--viz-module", help="path of a _memory_viz.py to use instead of torch's")
    args = ap.parse_args()

    with open(args.snapshot, "rb") as f:
        data = pickle.load(f)
    check_structure(data)
    nseg = len(data["segments"])
    nent = sum(len(t) for t in data["device_traces"])
    print(f"loaded {args.snapshot}: {nseg} segments, {nent} trace entries, "
          f"{len(data['device_traces'])} device(s)")

    viz = load_viz(args.viz_module)
    outdir = args.outdir or os.path.dirname(os.path.abspath(args.snapshot))
    os.makedirs(outdir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.snapshot))[0]
    identity = lambda lines: lines  # noqa: E731  (skip flamegraph.pl)

    renderings = {
        "trace_plot.html": lambda: viz.trace_plot(data),
        "trace_plot_segments.html": lambda: viz.trace_plot(data, plot_segments=True),
        "segment_plot.html": lambda: viz.segment_plot(data),
        "segsum.txt": lambda: viz.segsum(data),
        "trace.txt": lambda: viz.trace(data),
        "segments.folded": lambda: viz.segments(data, format_flamegraph=identity),
        "memory.folded": lambda: viz.memory(data, format_flamegraph=identity),
    }
    failed = 0
    for name, render in renderings.items():
        path = os.path.join(outdir, f"{stem}.{name}")
        try:
            text = render()
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            continue
        with open(path, "w") as f:
            f.write(text)
        print(f"ok   {name}: {len(text)} characters -> {path}")
    if failed:
        print(f"{failed} rendering(s) failed")
        return 1
    print("all renderings succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
