#!/usr/bin/env bash
# Side-by-side benchmark on a GPU machine (packed by `cargo xtask bench-cuda`
# into dist/cuda/; needs PyTorch, g++ and CUDA there, no Rust, no network).
#
#   dist/cuda/bench.sh
#
# 1. Builds the repository's PyTorch harnesses (pytorch/, from
#    bench/pytorch/ of the repository) with pytorch/build.sh: plain g++
#    against the installed torch's headers and libc10_cuda.
# 2. Replays every trace (traces/*.trace) in ROUNDS rounds, each round:
#    cachalot (`bin/cachalot replay --backend cuda --json`), then PyTorch's
#    CUDACachingAllocator (`build/torch_replay`) in each of MODES.
# 3. The thread-scaling benchmark: `bin/cachalot threads --backend cuda` and
#    `build/torch_threads` (T = 1, 2, 4, 8, 16; each thread allocates and
#    frees on its own stream; the same workload and random numbers).
# 4. Prints the tables: speed (warm ns per op, medians over the rounds, with
#    each round's ratio), memory per mode (peak reserved over the trace's
#    live peak), PyTorch's figures now over those recorded in
#    traces/pytorch-{cca,modes}-h200.json, threads (Mops/s).
#
# Environment:
#   PASSES=5        passes per trace (the first = cold, peaks and pass-1
#                   device allocations from it; warm = median of the others)
#   ROUNDS=3        replay rounds
#   MODES="default expandable async"
#                   PyTorch's allocator modes to replay (PYTORCH_CUDA_ALLOC_CONF
#                   unset, expandable_segments:True, backend:cudaMallocAsync)
#   THREAD_MODES=default   PyTorch modes of the threads benchmark
#   WARMUP=1        replay every trace once per allocator first, discarded
#   THREADS=0       skip the threads benchmark (1: run it; default 1)
#   CACHALOT_REPLAY=... our replay command (trace paths are appended);
#                   default: bin/cachalot replay --backend cuda --json --passes $PASSES
#   CACHALOT_THREADS=... our threads command; default: bin/cachalot threads --backend cuda
#   BENCH_BINARIES=1  also run every binary under bench/ (criterion: --bench)
#   RESULTS=DIR     where the JSON is written (default $OUT/results when OUT
#                   is set, else results): cachalot-replay.jsonl,
#                   pytorch-replay.jsonl (a "mode" field per line),
#                   cachalot-threads.jsonl, pytorch-threads.jsonl,
#                   pytorch-modes.json (the shape of traces/pytorch-modes-h200.json),
#                   tables.txt
# Exit: 0, or 1 when a harness failed to build or a run failed.
set -u -o pipefail
cd "$(dirname "$0")" || exit 2
PASSES=${PASSES:-5}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-default expandable async}
THREAD_MODES=${THREAD_MODES:-default}
if [ -n "${OUT:-}" ]; then RESULTS=${RESULTS:-$OUT/results}; else RESULTS=${RESULTS:-results}; fi
mkdir -p "$RESULTS" build
for f in cachalot-replay pytorch-replay cachalot-threads pytorch-threads; do : >"$RESULTS/$f.jsonl"; done
status=0
command -v nvidia-smi >/dev/null && nvidia-smi -L

if [ -f traces/synth_traces.py ] && command -v python3 >/dev/null && [ ! -f traces/hit_1mib.trace ]; then
  python3 traces/synth_traces.py traces || echo "bench.sh: synth_traces.py failed"
fi
shopt -s nullglob
TRACES=(traces/*.trace)
echo "bench.sh: ${#TRACES[@]} traces"

tag() { sed -u "s/^{/{\"impl\":\"$1\",/"; }

# --- PyTorch's harnesses -----------------------------------------------------
if [ -x pytorch/build.sh ]; then
  pytorch/build.sh build || { echo "bench.sh: building the PyTorch harnesses failed"; status=1; }
else
  echo "bench.sh: pytorch/build.sh missing (not packed by cargo xtask bench-cuda?)"; status=1
fi

OURS_REPLAY=${CACHALOT_REPLAY:-"bin/cachalot replay --backend cuda --json --passes $PASSES"}
OURS_THREADS=${CACHALOT_THREADS:-"bin/cachalot threads --backend cuda"}
have_ours() { [ -x bin/cachalot ] || [ -n "${CACHALOT_REPLAY:-}" ]; }
have_ours || echo "bench.sh: bin/cachalot missing; our runs skipped"

# --- replay ------------------------------------------------------------------
# Warm-up, discarded: on a freshly started machine the first process to run
# measures the machine's warm-up too (we saw 1.6x on the first replay).
if [ ${#TRACES[@]} -gt 0 ] && [ "${WARMUP:-1}" = 1 ]; then
  have_ours && $OURS_REPLAY "${TRACES[@]}" >/dev/null 2>&1
  [ -x build/torch_replay ] && build/torch_replay --passes=2 "${TRACES[@]}" >/dev/null 2>&1
fi
# ROUNDS rounds, each ours then PyTorch's: a machine's speed drifts over a
# minute, so the table compares medians over the rounds and shows each
# round's ratio.
if [ ${#TRACES[@]} -gt 0 ]; then
  for round in $(seq 1 "$ROUNDS"); do
    echo "bench.sh: replay round $round of $ROUNDS"
    if have_ours; then
      $OURS_REPLAY "${TRACES[@]}" | grep --line-buffered '^{' | tag cachalot | tee -a "$RESULTS/cachalot-replay.jsonl" \
        || { echo "bench.sh: our replay failed"; status=1; }
    fi
    if [ -x build/torch_replay ]; then
      for m in $MODES; do
          build/torch_replay --passes="$PASSES" --mode="$m" "${TRACES[@]}" | tag pytorch | tee -a "$RESULTS/pytorch-replay.jsonl" \
          || { echo "bench.sh: torch_replay --mode=$m failed"; status=1; }
        done
    fi
  done
fi

# --- threads -----------------------------------------------------------------
if [ "${THREADS:-1}" = 1 ]; then
  if [ -x bin/cachalot ] || [ -n "${CACHALOT_THREADS:-}" ]; then
    $OURS_THREADS | grep --line-buffered '^{' | tag cachalot | tee -a "$RESULTS/cachalot-threads.jsonl" \
      || { echo "bench.sh: our threads benchmark failed"; status=1; }
  fi
  if [ -x build/torch_threads ]; then
    for m in $THREAD_MODES; do
      build/torch_threads --mode="$m" | tag pytorch | tee -a "$RESULTS/pytorch-threads.jsonl" \
        || { echo "bench.sh: torch_threads --mode=$m failed"; status=1; }
    done
  fi
fi

# --- bench binaries ----------------------------------------------------------
if [ "${BENCH_BINARIES:-0}" = 1 ]; then
  for b in bench/*; do
    echo "== $b"; "$b" --bench 2>&1 | tail -n 40
  done
fi

# --- tables ------------------------------------------------------------------
python3 - "$RESULTS" <<'PY' | tee "$RESULTS/tables.txt" || echo "bench.sh: python3 unavailable, no table"
import json, os, statistics, sys
d = sys.argv[1]
def rows(name):
    out = []
    try:
        for line in open(os.path.join(d, name)):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    return out
def trace_name(j):
    k = os.path.basename(str(j.get("trace", "")))
    return k[:-6] if k.endswith(".trace") else k
def group(rs, key):
    g = {}
    for j in rs:
        g.setdefault(key(j), []).append(j)
    return g
def med(rs, f):
    v = [r[f] for r in rs if r.get(f) is not None]
    return statistics.median(v) if v else None
def mib(v): return "-" if v is None else "%.1f" % (v / 2**20)
def num(v, f="%.1f"): return "-" if v is None else f % v

ours = group(rows("cachalot-replay.jsonl"), trace_name)
torch_all = rows("pytorch-replay.jsonl")
by_mode = {m: group([j for j in torch_all if j.get("mode") == m], trace_name)
           for m in ["default", "expandable", "async"]}
torch = by_mode["default"]
if ours or torch:
    print("\nspeed: warm host ns per op, medians over the rounds (PyTorch default mode)")
    print("%-22s %10s %10s %7s %15s %13s %13s %11s" % ("trace", "ours ns/op", "torch", "ratio", "round ratios", "ours peakMiB", "torch peakMiB", "allocs o/t"))
    for t in sorted(set(ours) | set(torch)):
        o, p = ours.get(t, []), torch.get(t, [])
        ow, pw = med(o, "warm_ns_per_op"), med(p, "warm_ns_per_op")
        rr = [a["warm_ns_per_op"] / b["warm_ns_per_op"] for a, b in zip(o, p) if b.get("warm_ns_per_op")]
        rounds = "%.2f-%.2f" % (min(rr), max(rr)) if rr else "-"
        ra = "%.2fx" % (ow / pw) if ow and pw else "-"
        al = "%s/%s" % (o[-1].get("device_allocs_all", "-") if o else "-", p[-1].get("device_allocs_all", "-") if p else "-")
        print("%-22s %10s %10s %7s %15s %13s %13s %11s" % (t, num(ow), num(pw), ra, rounds,
              mib(med(o, "peak_reserved")), mib(med(p, "peak_reserved")), al))

# memory per mode: peak reserved / live peak (live peak: from torch_replay,
# a property of the trace)
live = {t: rs[0]["live_peak"] for g in by_mode.values() for t, rs in g.items() if rs and rs[0].get("live_peak")}
modes_json = {}
if live:
    print("\nmemory: peak reserved / live peak of the trace (pass 1); warm ns per op in brackets")
    print("%-22s %14s %18s %18s %18s" % ("trace", "ours", "torch default", "torch expandable", "torch async"))
    for t in sorted(live):
        cells, entry = [], {"live_peak": live[t]}
        o = ours.get(t, [])
        cells.append("-" if not o else "%.4f [%s]" % (med(o, "peak_reserved") / live[t], num(med(o, "warm_ns_per_op"))))
        for m in ["default", "expandable", "async"]:
            rs = by_mode[m].get(t, [])
            if rs:
                ratio = med(rs, "peak_reserved") / live[t]
                entry["%s_reserved_over_live" % m] = round(ratio, 4)
                entry["%s_warm_ns" % m] = round(med(rs, "warm_ns_per_op"), 1)
                cells.append("%.4f [%s]" % (ratio, num(med(rs, "warm_ns_per_op"))))
            else:
                cells.append("-")
        modes_json[t] = entry
        print("%-22s %14s %18s %18s %18s" % tuple([t] + cells))
    with open(os.path.join(d, "pytorch-modes.json"), "w") as f:
        json.dump({"what": "bench.sh: PyTorch's CUDACachingAllocator (bench/pytorch/torch_replay.cpp) in three modes; "
                           "*_reserved_over_live = peak reserved on pass 1 / the trace's live peak; *_warm_ns = median "
                           "over the rounds of the warm host ns per op (compare only within one run)",
                   "traces": modes_json}, f, indent=1)

# PyTorch now against the figures recorded in traces/ (the same machine kind
# gives the same bytes: they are the algorithm's, not the clock's)
def load_json(path):
    try:
        return json.load(open(path)).get("traces", {})
    except (OSError, ValueError):
        return {}
rec_cca, rec_modes = load_json("traces/pytorch-cca-h200.json"), load_json("traces/pytorch-modes-h200.json")
if torch and (rec_cca or rec_modes):
    print("\nPyTorch now / recorded in traces/pytorch-{cca,modes}-h200.json (1.0000 = the same)")
    print("%-22s %16s %16s %16s %16s" % ("trace", "peak reserved", "device allocs", "expandable", "async"))
    for t in sorted(torch):
        r, m = rec_cca.get(t, {}), rec_modes.get(t, {})
        def rel(now, then):
            return "%.4f" % (now / then) if now is not None and then else "-"
        cells = [rel(med(torch[t], "peak_reserved"), r.get("peak_reserved")),
                 "%s/%s" % (torch[t][-1].get("device_allocs_all", "-"), r.get("device_allocs_all", "-"))]
        for mode in ["expandable", "async"]:
            e = modes_json.get(t, {}).get("%s_reserved_over_live" % mode)
            cells.append(rel(e, m.get("%s_reserved_over_live" % mode)))
        print("%-22s %16s %16s %16s %16s" % tuple([t] + cells))

ot = group(rows("cachalot-threads.jsonl"), lambda j: j.get("threads"))
pt_all = rows("pytorch-threads.jsonl")
tmodes = sorted({j.get("mode", "default") for j in pt_all})
pt = {m: group([j for j in pt_all if j.get("mode", "default") == m], lambda j: j.get("threads")) for m in tmodes}
if ot or pt_all:
    print("\nthreads: Mops/s (each thread allocates and frees on its own stream)")
    print("%-8s %14s" % ("threads", "ours") + "".join(" %16s" % ("torch " + m) for m in tmodes) + "   ours/torch default")
    for t in sorted(set(ot) | {k for g in pt.values() for k in g}, key=int):
        o = med(ot.get(t, []), "mops_per_s")
        cells = [med(pt[m].get(t, []), "mops_per_s") for m in tmodes]
        pd = med(pt.get("default", {}).get(t, []), "mops_per_s")
        print("%-8s %14s" % (t, num(o, "%.3f")) + "".join(" %16s" % num(c, "%.3f") for c in cells)
              + "   %s" % ("%.2fx" % (o / pd) if o and pd else "-"))
PY
exit $status
