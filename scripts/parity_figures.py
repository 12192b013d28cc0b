#!/usr/bin/env python3
"""Memory/count parity check for `cachalot replay` on the mock backend.

The baseline in the repository: scripts/parity_baseline.json (48 cases),
    python3 scripts/parity_figures.py --check scripts/parity_baseline.json --bin BIN

For every trace (the three files in traces/ plus the synthetic hit_1mib,
churn_1stream and churn_4streams) and every allocator config in CONFIGS it runs

    BIN replay --backend mock --json --stats --passes 3 --config CFG TRACE

and records the figures that must not change under a behaviour-preserving
refactor:
  * "replay": every field of the --json line except the trace name and the
    timing fields (anything in ns/us/ms, e.g. cold_ns_per_op, warm_ns_per_op):
    ops, peak_reserved, peak_allocated, device_allocs_cold, device_allocs_all,
    alloc_retries, ...;
  * "stats": the final memory_stats() (PyTorch's 122 keys: allocation, segment,
    active/inactive split, reserved/allocated/requested bytes, num_device_alloc,
    num_ooms, ...), the "memory_stats" object --stats adds to the line. --no-stats leaves it out (and the flag off).

Usage (from the repo root):
  scripts/parity_figures.py --record OUT.json        # write the figures
  scripts/parity_figures.py --check BASELINE.json    # compare against them
Options: --bin PATH (default target/release/cachalot), --jobs N (default 2),
         --no-stats.
--check exits 1 and prints a table of every differing figure (and of missing
or extra cases) when anything differs, 0 when all figures are identical.
Runs use a scrubbed environment (only PATH), so $CACHALOT_ALLOC_CONF,
$PYTORCH_CUDA_ALLOC_CONF or $CACHALOT_BACKEND cannot change the result.
"""
import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = ("traces/gpt2_train.trace", "traces/resnet50_train.trace",
          "traces/side_stream_pipeline.trace",
          "hit_1mib", "churn_1stream", "churn_4streams")
CONFIGS = (# the default: cachalot's expandable mode on the mock (it has
           # virtual memory), the same figures as "expandable_segments:True"
           "",
           "placement:pytorch",
           # fixed segments with cachalot's placement
           "expandable_segments:False",
           "idle_stream_reuse:True,expandable_segments:False",
           "placement:pytorch,idle_stream_reuse:True",
           "max_split_size_mb:256,garbage_collection_threshold:0.8,"
           "per_process_memory_fraction:0.9,expandable_segments:False",
           # PyTorch 2.11's expandable mode, and cachalot's (page recycling)
           "placement:pytorch,expandable_segments:True",
           "expandable_segments:True")
PASSES = 3
# Timing fields: host time, not memory or counts; they vary run to run.
TIMING = re.compile(r"(^|_)(ns|us|ms|sec|secs|seconds|time|elapsed)(_|$)")
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def run(binary, trace, cfg, stats):
    path = os.path.join(REPO, trace) if trace.startswith("traces/") else trace
    cmd = [binary, "replay", "--backend", "mock", "--json", "--passes",
           str(PASSES), "--config", cfg, path]
    if stats:
        cmd.insert(-1, "--stats")
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if out.returncode != 0:
        return {"error": f"rc={out.returncode}: {out.stderr.strip()[-500:]}"}
    rec = {}
    for line in out.stdout.splitlines():
        if not line.startswith("{"):
            continue
        obj = json.loads(line)
        if "memory_stats" in obj:   # --stats: inside the replay line
            rec["stats"] = obj.pop("memory_stats")
        if "trace" in obj:   # the replay line
            rec["replay"] = {k: v for k, v in obj.items()
                             if k != "trace" and not TIMING.search(k)}
    if "replay" not in rec or (stats and "stats" not in rec):
        return {"error": f"unexpected output: {out.stdout[-500:]!r}"}
    return rec


def flatten(rec):
    """{"replay": {...}, "stats": {...}} -> {"replay.ops": .., "stats.x": ..}"""
    if "error" in rec:
        return {"error": rec["error"]}
    return {f"{part}.{k}": v for part, d in rec.items() for k, v in d.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/cachalot")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--record", metavar="OUT.json")
    g.add_argument("--check", metavar="BASELINE.json")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-stats", action="store_true",
                    help="leave out --stats (the memory_stats() figures)")
    a = ap.parse_args()
    binary = os.path.abspath(a.bin)
    cases = [(t, c) for t in TRACES for c in CONFIGS]
    with ThreadPoolExecutor(a.jobs) as ex:
        results = list(ex.map(lambda tc: run(binary, *tc, not a.no_stats),
                              cases))
    got = {f"{os.path.basename(t).removesuffix('.trace')} [{c or 'default'}]": r
           for (t, c), r in zip(cases, results)}
    errors = [k for k, r in got.items() if "error" in r]
    for k in errors:
        print(f"ERROR {k}: {got[k]['error']}", file=sys.stderr)

    if a.record:
        with open(a.record, "w") as f:
            json.dump({"bin": a.bin, "passes": PASSES, "cases": got}, f,
                      indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded {len(got)} cases to {a.record}; {len(errors)} errors")
        sys.exit(1 if errors else 0)

    with open(a.check) as f:
        base = json.load(f)["cases"]
    rows = []  # (case, figure, baseline, now)
    for case in sorted(set(base) | set(got)):
        if case not in got:
            rows.append((case, "*", "present", "missing"))
            continue
        if case not in base:
            rows.append((case, "*", "missing", "present"))
            continue
        b, n = flatten(base[case]), flatten(got[case])
        for k in sorted(set(b) | set(n)):
            if b.get(k, "-") != n.get(k, "-"):
                rows.append((case, k, b.get(k, "-"), n.get(k, "-")))
    if rows:
        w = [max(len(str(r[i])) for r in rows + [("case", "figure",
             "baseline", "now")]) for i in range(4)]
        hdr = ("case", "figure", "baseline", "now")
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
        for r in rows:
            print("  ".join(str(x).ljust(w[i]) for i, x in enumerate(r)))
    same = sum(1 for c in got if c in base and
               flatten(base[c]) == flatten(got[c]))
    print(f"{same}/{len(set(base) | set(got))} cases identical, "
          f"{len(rows)} differing figures")
    sys.exit(1 if rows or errors else 0)


if __name__ == "__main__":
    main()
