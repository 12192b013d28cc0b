#!/usr/bin/env python3
"""The capture-sim programs on the simulated device and on a real GPU.

For streams in {2, 4} x ops in {1000, 10000} and SEEDS seeds, runs
`cachalot capture-sim` in every reuse mode with `--backend mock` and
`--backend cuda`, and prints per config:

* on how many programs the two devices give the same peak reserved bytes
  and the same number of reused blocks. The allocator decides from the
  capture graph's terminal sets and dependencies and, for ties in best fit,
  from segment addresses: the mock models the CUDA 13 driver's placement of
  segments, but where the driver places one differently, figures may differ
  with the graph answers all the same;
* capture time per op on each device and the time ratios of `pytorch` and
  `cross_stream` to `off` (mean of per-seed ratios of best-of-N times).

Agreement criterion (exit status 1 when it fails, 0 when it holds):

* every capture-sim run succeeded, and none reports a race;
* with reuse off the two devices give the same peak reserved and reused
  blocks on every program (no graph question is asked there);
* in each (streams, ops) config, over all modes, the mock gives CUDA's
  exact peak reserved on at least --min-agree of the runs (default 0.9)
  and its exact reused-block count likewise: placement may move a few
  figures (above), not many.

Times are reported, not gated.

Needs a CUDA device. Usage:
  scripts/capture_sim_devices.py [--bin target/release/cachalot] [--seeds 5]
                                 [--timing-runs 5] [--markdown] [--save FILE]
                                 [--min-agree 0.9]
--save writes every run's JSON (one line each, with device, mode, streams,
ops and seed added).
"""
import argparse
import json
import statistics
import subprocess
import sys

MODES = ("off", "pytorch", "cross-stream")
DEVICES = ("mock", "cuda")


def run(binary, device, streams, ops, seed, mode, timing_runs):
    out = subprocess.run(
        [binary, "capture-sim", "--backend", device, "--streams", str(streams),
         "--ops", str(ops), "--seed", str(seed), "--reuse", mode, "--json",
         "--timing-runs", str(timing_runs)],
        capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        sys.exit(f"capture-sim --backend {device} failed: {out.stderr.strip()}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/cachalot")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--timing-runs", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--save")
    ap.add_argument("--min-agree", type=float, default=0.9,
                    help="least share of a config's runs whose figures must agree")
    a = ap.parse_args()
    fails = []
    saved = open(a.save, "w") if a.save else None
    agree_peak = agree_reused = total = 0
    if a.markdown:
        print("| streams | ops | runs with the same peak reserved / reused blocks "
              "| CUDA peak reserved MiB off / pytorch / cross | ns/op mock off / pytorch / cross | time ratio mock "
              "pytorch / cross | ns/op cuda off / pytorch / cross | time ratio cuda "
              "pytorch / cross |")
        print("|---|---|---|---|---|---|---|---|")
    for streams in (2, 4):
        for ops in (1000, 10000):
            res = {(d, m): [] for d in DEVICES for m in MODES}
            for seed in range(1, a.seeds + 1):
                for m in MODES:
                    for d in DEVICES:
                        r = run(a.bin, d, streams, ops, seed, m, a.timing_runs)
                        res[(d, m)].append(r)
                        if saved:
                            saved.write(json.dumps(dict(r, device=d, mode=m, streams=streams,
                                                        ops=ops, seed=seed)) + "\n")
            pairs = [(x, y) for m in MODES for x, y in zip(res[("mock", m)], res[("cuda", m)])]
            same_peak = sum(x["peak_reserved"] == y["peak_reserved"] for x, y in pairs)
            same_reused = sum(x["reused_blocks"] == y["reused_blocks"] for x, y in pairs)
            where = f"streams={streams} ops={ops}"
            races = sum(1 for k in res for r in res[k] if r.get("races"))
            if races:
                fails.append(f"{where}: {races} run(s) report races")
            off_bad = sum((x["peak_reserved"], x["reused_blocks"]) != (y["peak_reserved"], y["reused_blocks"])
                          for x, y in zip(res[("mock", "off")], res[("cuda", "off")]))
            if off_bad:
                fails.append(f"{where}: reuse off differs between the devices on {off_bad} program(s)")
            for what, n in (("peak reserved", same_peak), ("reused blocks", same_reused)):
                if n < a.min_agree * len(pairs):
                    fails.append(f"{where}: the same {what} on {n} of {len(pairs)} runs, "
                                 f"fewer than {a.min_agree:.0%}")
            agree_peak += same_peak
            agree_reused += same_reused
            total += len(pairs)
            mib = {m: statistics.mean(r["peak_reserved"] for r in res[("cuda", m)]) / 2**20
                   for m in MODES}
            t = {(d, m): statistics.mean(r["capture_ns"] / ops for r in res[(d, m)])
                 for d in DEVICES for m in MODES}
            ratio = {(d, m): statistics.mean(x["capture_ns"] / o["capture_ns"]
                                             for x, o in zip(res[(d, m)], res[(d, "off")]))
                     for d in DEVICES for m in MODES}
            cells = [
                f"{same_peak} / {same_reused} of {len(pairs)}",
                " / ".join(f"{mib[m]:.0f}" for m in MODES),
            ]
            for d in DEVICES:
                cells.append(" / ".join(f"{t[(d, m)]:.0f}" for m in MODES))
                cells.append(f"{ratio[(d, 'pytorch')]:.2f} / {ratio[(d, 'cross-stream')]:.2f}")
            if a.markdown:
                print(f"| {streams} | {ops} | " + " | ".join(cells) + " |")
            else:
                print(f"streams={streams} ops={ops} " + " ; ".join(cells))
    print(f"mock and cuda: same peak reserved on {agree_peak} of {total} runs, "
          f"same reused blocks on {agree_reused} of {total}")
    if saved:
        saved.close()
    for f in fails:
        print(f"FAIL: {f}")
    print("AGREEMENT CRITERION MET" if not fails else "AGREEMENT CRITERION FAILED")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
