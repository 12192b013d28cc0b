#!/usr/bin/env python3
"""Outcome regression check for `cachalot capture-sim`.

Runs streams {2,4} x ops {1000,10000} x seeds 1..20 x modes
{off, pytorch, cross-stream} (240 runs) and records peak_reserved,
peak_allocated, reused_blocks and races for each.

Usage:
  scripts/capture_outcomes_check.py --record BASELINE.json   # write baseline
  scripts/capture_outcomes_check.py --check BASELINE.json    # diff against it
Options: --bin target/release/cachalot, --jobs N (parallel runs).
Exit status 0 when every outcome is identical and races are 0.
"""
import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

MODES = ("off", "pytorch", "cross-stream")
KEYS = ("peak_reserved", "peak_allocated", "reused_blocks", "races")


def run(binary, streams, ops, seed, mode):
    out = subprocess.run(
        [binary, "capture-sim", "--streams", str(streams), "--ops", str(ops),
         "--seed", str(seed), "--reuse", mode, "--json", "--timing-runs", "1"],
        capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": f"rc={out.returncode}: {out.stderr.strip()[-500:]}"}
    r = json.loads(lines[-1])
    return {k: r[k] for k in KEYS}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/cachalot")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--record")
    g.add_argument("--check")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    cases = [(s, n, k, m) for s in (2, 4) for n in (1000, 10000)
             for k in range(1, 21) for m in MODES]
    with ThreadPoolExecutor(a.jobs) as ex:
        results = list(ex.map(lambda c: run(a.bin, *c), cases))
    got = {f"{s}x{n}/seed{k}/{m}": r for (s, n, k, m), r in zip(cases, results)}
    if a.record:
        with open(a.record, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
        bad = [k for k, r in got.items() if "error" in r or r["races"] != 0]
        print(f"recorded {len(got)} runs to {a.record}; {len(bad)} with errors/races")
        sys.exit(1 if bad else 0)
    with open(a.check) as f:
        base = json.load(f)
    diffs = []
    for key, r in got.items():
        b = base.get(key)
        if b != r or r.get("races", 1) != 0:
            diffs.append((key, b, r))
    for key, b, r in diffs:
        print(f"DIFF {key}: baseline={b} now={r}")
    print(f"{len(got) - len(diffs)}/{len(got)} runs identical")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
