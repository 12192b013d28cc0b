#!/usr/bin/env bash
# One device call for session 21 (issue 15, items 3 and 4: the trade
# between page moves and speed), from the repository root on the GPU
# machine, after `cargo xtask bench-cuda` packed dist/cuda here and the
# no-moves build was put in dist/exp/nomoves/cachalot:
#   git worktree add /tmp/exp HEAD && cd /tmp/exp
#   git apply /path/to/bench/experiments/no-moves.patch
#   cargo build --release -p cachalot-cli --features cuda
#   strip target/release/cachalot && cp target/release/cachalot /path/to/repo/dist/exp/nomoves/
# ROUNDS rounds (default 3) of the trace replay, 5 passes each, in this
# order: cachalot's default, the default with no page moves
# (CACHALOT_EXP_NO_MOVES=1 in the patched build: no lending, no
# recycling), fixed segments (`expandable_segments:False`), PyTorch's
# default and expandable modes (bench/pytorch/torch_replay.cpp). Then one
# pass of each cachalot build with --stats for peak reserved / live peak.
# Prints medians: warm ns/op (ratio to PyTorch's default), cold ns/op
# (ratio to PyTorch's expandable mode), device allocations first pass /
# all passes, peak reserved / live peak. Logs in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROUNDS=${ROUNDS:-3}
NM=${NM:-dist/exp/nomoves/cachalot}
S=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd dist/cuda && pytorch/build.sh build >"$OUT/torch-build.txt" 2>&1) || echo "torch harness build failed"
[ -f dist/cuda/traces/hit_1mib.trace ] || python3 dist/cuda/traces/synth_traces.py dist/cuda/traces
TR=(dist/cuda/traces/*.trace)
R=$OUT/replay.jsonl; : >"$R"
tag() { sed -u "s/^{/{\"build\":\"$1\",/"; }
run() { # NAME ENV BIN [ARGS...]
  local name=$1 env=$2 bin=$3; shift 3
  env $env timeout 150 "$bin" replay --backend cuda --json "$@" "${TR[@]}" 2>/dev/null | grep '^{' | tag "$name"
}
dist/cuda/bin/cachalot replay --backend cuda --json --passes 2 "${TR[@]}" >/dev/null 2>&1
for r in $(seq 1 "$ROUNDS"); do
  run default "X=1" dist/cuda/bin/cachalot --passes 5 >>"$R"
  run no-moves "CACHALOT_EXP_NO_MOVES=1" "$NM" --passes 5 >>"$R"
  run fixed "X=1" dist/cuda/bin/cachalot --passes 5 --config expandable_segments:False >>"$R"
  for m in default expandable; do
    timeout 150 dist/cuda/build/torch_replay --passes=5 --mode=$m "${TR[@]}" 2>/dev/null \
      | grep '^{' | tag "torch-$m" >>"$R"
  done
  echo "round $r: $(( $(date +%s) - S )) s"
done
M=$OUT/memory.jsonl; : >"$M"
run default "X=1" dist/cuda/bin/cachalot --passes 1 --stats >>"$M"
run no-moves "CACHALOT_EXP_NO_MOVES=1" "$NM" --passes 1 --stats >>"$M"
run fixed "X=1" dist/cuda/bin/cachalot --passes 1 --stats --config expandable_segments:False >>"$M"
echo "replay: $(( $(date +%s) - S )) s"
python3 - "$R" "$M" <<'P' | tee "$OUT/table.txt"
import json, sys, os, statistics as st, collections
w = collections.defaultdict(list); c = collections.defaultdict(list); calls = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    k = (j["build"], os.path.basename(j["trace"]).removesuffix(".trace"))
    w[k].append(j["warm_ns_per_op"]); c[k].append(j["cold_ns_per_op"])
    if "device_allocs_all" in j:
        calls[k] = "%d/%d" % (j["device_allocs_cold"], j["device_allocs_all"])
mem = {}
for line in open(sys.argv[2]):
    j = json.loads(line)
    k = (j["build"], os.path.basename(j["trace"]).removesuffix(".trace"))
    live = j.get("memory_stats", {}).get("requested_bytes.all.peak")
    if live:
        mem[k] = j["peak_reserved"] / live
med = lambda d, k: st.median(d[k]) if d.get(k) else float("nan")
traces = sorted({t for (b, t) in w if b == "torch-default"})
print("warm ns/op (x PyTorch default) | cold ns/op (x PyTorch expandable) | device allocs pass 1/all | peak reserved / live peak")
print("%-22s %-18s %9s %7s %9s %7s %11s %8s" % ("trace", "build", "warm", "", "cold", "", "allocs", "memory"))
for t in traces:
    tw, tc = med(w, ("torch-default", t)), med(c, ("torch-expandable", t))
    for b in ["torch-default", "torch-expandable", "default", "no-moves", "fixed"]:
        k = (b, t)
        if k not in w: continue
        m = mem.get(k)
        print("%-22s %-18s %9.1f %6.2fx %9.1f %6.2fx %11s %8s" % (t, b, med(w, k), med(w, k) / tw, med(c, k),
              med(c, k) / tc, calls.get(k, ""), "%.4f" % m if m else ""))
P
