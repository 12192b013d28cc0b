#!/usr/bin/env bash
# Side-by-side benchmark on a GPU machine (packed by `cargo xtask bench-cuda`):
# builds PyTorch's C++ anchors (needs PyTorch, g++ and CUDA here), then
# replays every trace through cachalot and through PyTorch's
# CUDACachingAllocator, printing JSON lines and a short table.
#
# Environment:
#   PASSES=5                 passes per trace (first = cold)
#   CACHALOT_REPLAY=...      our replay command (trace paths are appended);
#                            default: bin/cachalot replay --backend cuda --json --passes $PASSES
#   CACHALOT_THREADS=...     our multi-thread command;
#                            default: bin/cachalot threads --backend cuda
#   BENCH_BINARIES=1         also run every binary under bench/ (criterion: --bench)
#   RESULTS=results          where the JSON lines are written
#   WARMUP=1                 replay every trace once per allocator first, discarded
#   ROUNDS=3                 replay rounds (ours, then PyTorch's, per round); the
#                            table shows medians and each round's ratio
# Our commands are expected to print one JSON line per trace with the keys of
# cca_replay ("trace", "warm_ns_per_op", "peak_reserved", ...) and one per
# thread count with the keys of cca_threads ("threads", "mops_per_s").
set -u
cd "$(dirname "$0")" || exit 2
PASSES=${PASSES:-5}
RESULTS=${RESULTS:-results}
mkdir -p "$RESULTS" build
: >"$RESULTS/pytorch-replay.jsonl"; : >"$RESULTS/cachalot-replay.jsonl"
: >"$RESULTS/pytorch-threads.jsonl"; : >"$RESULTS/cachalot-threads.jsonl"
command -v nvidia-smi >/dev/null && nvidia-smi -L

if [ -f traces/synth_traces.py ] && command -v python3 >/dev/null && [ ! -f traces/hit_1mib.trace ]; then
  python3 traces/synth_traces.py traces || echo "bench.sh: synth_traces.py failed"
fi
shopt -s nullglob
TRACES=(traces/*.trace)
echo "bench.sh: ${#TRACES[@]} traces"

tag() { sed -u "s/^{/{\"impl\":\"$1\",/"; }

# --- PyTorch's anchors -------------------------------------------------------
T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))' 2>/dev/null)
CUDA=${CUDA_HOME:-/usr/local/cuda}
build_anchor() { # name [extra flags]
  local n=$1; shift
  g++ -O2 -std=c++17 "anchor/$n.cpp" -I"$T/include" -I"$CUDA/include" \
    -L"$T/lib" -Wl,--no-as-needed -ltorch_cuda -ltorch_cpu -ltorch -lc10_cuda -lc10 \
    -Wl,--as-needed -L"$CUDA/lib64" -lcudart \
    -Wl,-rpath,"$T/lib" -Wl,-rpath,"$CUDA/lib64" "$@" -o "build/$n"
}
if [ -z "$T" ]; then
  echo "bench.sh: PyTorch not found; PyTorch anchors skipped"
else
  for n in cca_replay cca_threads; do
    if [ -f "anchor/$n.cpp" ]; then
      extra=(); [ "$n" = cca_threads ] && extra=(-pthread)
      build_anchor "$n" "${extra[@]}" || echo "bench.sh: building $n failed"
    fi
  done
fi

# --- replay ------------------------------------------------------------------
OURS_REPLAY=${CACHALOT_REPLAY:-"bin/cachalot replay --backend cuda --json --passes $PASSES"}
OURS_THREADS=${CACHALOT_THREADS:-"bin/cachalot threads --backend cuda"}
# Warm-up, discarded: on a freshly started machine the first process to run
# measures the machine's warm-up too (we saw 1.6x on the first replay), so
# both allocators replay every trace once before anything is measured.
if [ ${#TRACES[@]} -gt 0 ] && [ "${WARMUP:-1}" = 1 ]; then
  { [ -x bin/cachalot ] || [ -n "${CACHALOT_REPLAY:-}" ]; } && $OURS_REPLAY "${TRACES[@]}" >/dev/null 2>&1
  [ -x build/cca_replay ] && build/cca_replay --passes=2 "${TRACES[@]}" >/dev/null 2>&1
fi
# ROUNDS rounds, each ours then PyTorch's: a machine's speed drifts over a
# minute (PyTorch's own figure moved 1.5-2.2x between back-to-back runs), so
# the table compares medians over the rounds and shows each round's ratio.
ROUNDS=${ROUNDS:-3}
if [ ${#TRACES[@]} -gt 0 ]; then
  for round in $(seq 1 "$ROUNDS"); do
    echo "bench.sh: replay round $round of $ROUNDS"
    if [ -x bin/cachalot ] || [ -n "${CACHALOT_REPLAY:-}" ]; then
      $OURS_REPLAY "${TRACES[@]}" | grep --line-buffered '^{' | tag cachalot | tee -a "$RESULTS/cachalot-replay.jsonl"
    else
      echo "bench.sh: bin/cachalot missing; our replay skipped"
    fi
    if [ -x build/cca_replay ]; then
      build/cca_replay --passes="$PASSES" "${TRACES[@]}" | grep --line-buffered '^{' | tag pytorch | tee -a "$RESULTS/pytorch-replay.jsonl"
    fi
  done
fi

# --- threads -----------------------------------------------------------------
if [ -x bin/cachalot ] || [ -n "${CACHALOT_THREADS:-}" ]; then
  $OURS_THREADS | grep --line-buffered '^{' | tag cachalot | tee "$RESULTS/cachalot-threads.jsonl"
fi
if [ -x build/cca_threads ]; then
  build/cca_threads | grep --line-buffered '^{' | tag pytorch | tee "$RESULTS/pytorch-threads.jsonl"
fi

# --- bench binaries ----------------------------------------------------------
if [ "${BENCH_BINARIES:-0}" = 1 ]; then
  for b in bench/*; do
    echo "== $b"; "$b" --bench 2>&1 | tail -n 40
  done
fi

# --- table -------------------------------------------------------------------
python3 - "$RESULTS" <<'PY' || echo "bench.sh: python3 unavailable, no table"
import json, os, statistics, sys
d = sys.argv[1]
def load(name, key):
    """key -> every JSON line with that key, in file order (one per round)."""
    out = {}
    try:
        for line in open(os.path.join(d, name)):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            k = j.get(key)
            if k is not None:
                k = os.path.basename(str(k))
                out.setdefault(k[:-6] if k.endswith(".trace") else k, []).append(j)
    except OSError:
        pass
    return out
ours, torch = load("cachalot-replay.jsonl", "trace"), load("pytorch-replay.jsonl", "trace")
def med(rows, f):
    v = [r[f] for r in rows if r.get(f) is not None]
    return statistics.median(v) if v else None
def mib(v): return "-" if v is None else "%.1f" % (v / 2**20)
def num(v, f="%.1f"): return "-" if v is None else f % v
if ours or torch:
    print("\n%-22s %10s %10s %7s %15s %13s %13s %11s" % ("trace", "ours ns/op", "torch", "ratio", "round ratios", "ours peakMiB", "torch peakMiB", "allocs o/t"))
    for t in sorted(set(ours) | set(torch)):
        o, p = ours.get(t, []), torch.get(t, [])
        ow, pw = med(o, "warm_ns_per_op"), med(p, "warm_ns_per_op")
        rr = [a["warm_ns_per_op"] / b["warm_ns_per_op"] for a, b in zip(o, p) if b.get("warm_ns_per_op")]
        rounds = "%.2f-%.2f" % (min(rr), max(rr)) if rr else "-"
        ra = "%.2fx" % (ow / pw) if ow and pw else "-"
        orr, prr = med(o, "peak_reserved"), med(p, "peak_reserved")
        al = "%s/%s" % (o[-1].get("device_allocs_all", "-") if o else "-", p[-1].get("device_allocs_all", "-") if p else "-")
        print("%-22s %10s %10s %7s %15s %13s %13s %11s" % (t, num(ow), num(pw), ra, rounds, mib(orr), mib(prr), al))
ot, pt = load("cachalot-threads.jsonl", "threads"), load("pytorch-threads.jsonl", "threads")
if ot or pt:
    print("\n%-8s %14s %14s" % ("threads", "ours Mops/s", "torch Mops/s"))
    for t in sorted(set(ot) | set(pt), key=int):
        print("%-8s %14s %14s" % (t, num(med(ot.get(t, []), "mops_per_s"), "%.3f"), num(med(pt.get(t, []), "mops_per_s"), "%.3f")))
PY
