#!/usr/bin/env bash
# One device call for issue 18 (threads and the hit path), from the
# repository root on the GPU machine, after `cargo xtask test-cuda &&
# cargo xtask bench-cuda` packed dist/cuda here. Optional older CLIs to
# compare, as BUILDS="name=path ..." (e.g. a release build of an older
# commit, `cargo build --release -p cachalot-cli --features cuda`, copied
# to dist/exp/NAME/cachalot); this checkout's CLI is "new".
#   1. the CUDA test binaries (dist/cuda/run.sh; TESTS=0 skips them);
#   2. the threads benchmark of every build against PyTorch's C++
#      (scripts/device/threads_ceiling.sh, ROUNDS rounds of OPS ops;
#      THREADS=0 skips it);
#   3. the trace replay (dist/cuda/traces/*.trace, warm = median of passes
#      2-5): ROUNDS rounds, each every build (the order rotating by round)
#      then PyTorch's default mode
#      (bench/pytorch/torch_replay.cpp), after a discarded warm-up
#      (REPLAY=0 skips it).
# Prints per trace the median warm ns/op over the rounds and each build's
# ratio to PyTorch, and the median ratio over the traces; then each round's
# ratio (the rounds paired) and their median. Logs in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROUNDS=${ROUNDS:-3}
BUILDS="new=dist/cuda/bin/cachalot ${BUILDS:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd dist/cuda && pytorch/build.sh build >/dev/null 2>&1) || echo "torch harness build failed"
S=$(date +%s)
if [ "${TESTS:-1}" = 1 ]; then
  (cd dist/cuda && CACHALOT_SANITIZER=0 ./run.sh) >"$OUT/cuda-tests.txt" 2>&1
  tail -n 2 "$OUT/cuda-tests.txt"
  # the mixed test (8 threads, a janitor every millisecond), its throughput
  for i in 1 2 3; do
    dist/cuda/tests/cachalot-conformance-shards --nocapture eight_streams 2>&1 | grep '^mixed:'
  done | tee "$OUT/mixed.txt"
fi
echo "tests: $(( $(date +%s) - S )) s"
if [ "${THREADS:-1}" = 1 ]; then
  BUILDS="$BUILDS" ROUNDS=$ROUNDS OPS=${OPS:-600000} scripts/device/threads_ceiling.sh >"$OUT/threads-table.txt" 2>&1
else
  : >"$OUT/threads-table.txt"
fi
echo "threads: $(( $(date +%s) - S )) s"
if [ "${REPLAY:-1}" != 1 ]; then tail -n 8 "$OUT/threads-table.txt"; exit 0; fi
# (the synthetic traces as files, as bench.sh makes them)
[ -f dist/cuda/traces/hit_1mib.trace ] || python3 dist/cuda/traces/synth_traces.py dist/cuda/traces
TR=(dist/cuda/traces/*.trace)
R=$OUT/replay.jsonl; : >"$R"
tag() { sed -u "s/^{/{\"build\":\"$1\",/"; }
dist/cuda/bin/cachalot replay --backend cuda --json --passes 2 "${TR[@]}" >/dev/null 2>&1
dist/cuda/build/torch_replay --passes=2 --mode=default "${TR[@]}" >/dev/null 2>&1
# (the builds' order rotates by round: on the H200 host the first build of
# a round ran slower, whichever it was, session 13 runs 3 and 4)
read -r -a BL <<<"$BUILDS"
for r in $(seq 1 "$ROUNDS"); do
  for i in $(seq 0 $(( ${#BL[@]} - 1 ))); do
    b=${BL[$(( (i + r - 1) % ${#BL[@]} ))]}
    ${b#*=} replay --backend cuda --json --passes 5 "${TR[@]}" 2>/dev/null | grep '^{' | tag "${b%%=*}" >>"$R"
  done
  dist/cuda/build/torch_replay --passes=5 --mode=default "${TR[@]}" 2>/dev/null | grep '^{' | tag torch >>"$R"
done
echo "replay: $(( $(date +%s) - S )) s"
cat "$OUT/threads-table.txt" | tail -n 8
python3 - "$R" $BUILDS <<'P'
import json, sys, os, statistics as st, collections
w = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    j = json.loads(line)
    t = os.path.basename(j["trace"]).removesuffix(".trace")
    w[j["build"]][t].append(j["warm_ns_per_op"])
names = [b.split("=")[0] for b in sys.argv[2:]]
traces = sorted(w["torch"])
print("warm ns/op, median over rounds (ratio to PyTorch default)")
print("%-22s %9s" % ("trace", "torch") + "".join("%18s" % n for n in names))
ratios = collections.defaultdict(list)
for t in traces:
    base = st.median(w["torch"][t])
    row = "%-22s %9.1f" % (t, base)
    for n in names:
        if w[n][t]:
            m = st.median(w[n][t]); ratios[n].append(m / base)
            row += "%18s" % ("%.1f (%.3fx)" % (m, m / base))
        else:
            row += "%18s" % "-"
    print(row)
print("%-32s" % "median ratio" + "".join("%18s" % ("%.3fx" % st.median(ratios[n]) if ratios[n] else "-") for n in names))
# the rounds paired: each round runs every build, then PyTorch, back to
# back, so a round's ratio cancels the host's drift between rounds
print("ratio to PyTorch per round (in round order), median over rounds")
paired = collections.defaultdict(list)
for t in traces:
    row = "%-22s" % t
    for n in names:
        r = [a / b for a, b in zip(w[n][t], w["torch"][t])]
        if r:
            paired[n].append(st.median(r))
            row += "  %s: %s (%.3fx)" % (n, " ".join("%.3f" % x for x in r), st.median(r))
    print(row)
print("%-22s" % "median over traces" + "".join("  %s: %.3fx" % (n, st.median(paired[n])) for n in names if paired[n]))
P
