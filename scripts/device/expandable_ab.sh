#!/usr/bin/env bash
# One device call for session 12 (expandable segments on the fast path,
# issue 15 item 4 and issue 21), from the repository root on the GPU
# machine, after `cargo xtask test-cuda && cargo xtask bench-cuda` packed
# dist/cuda here. OLD=DIR holds an older build to compare (DIR/cachalot,
# a CUDA CLI, and DIR/mlp-train; default dist/exp/s11), e.g. the
# dist/cuda/bin/cachalot and dist/cuda/cudarc/bin/mlp-train of an older
# commit's `cargo xtask bench-cuda`, copied there before rebuilding.
#   1. the CUDA test binaries (dist/cuda/run.sh; TESTS=0 skips them);
#   2. the trace replay in both expandable modes, ROUNDS rounds (default
#      3), each: old and new in `expandable_segments:True` (cachalot's) and
#      `placement:pytorch,expandable_segments:True` (PyTorch's), new in
#      the default, then PyTorch's default and expandable modes
#      (bench/pytorch/torch_replay.cpp); warm = median of passes 2-5;
#   3. the cudarc workload, new and old, RUNS rounds (default 2;
#      scripts/device/fences_ab.sh with AB=0).
# Prints median warm and cold ns/op per trace and config, with ratios to
# PyTorch's default (warm) and expandable (cold) modes. Logs in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
OLD=${OLD:-dist/exp/s11}
ROUNDS=${ROUNDS:-3}
S=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd dist/cuda && pytorch/build.sh build >/dev/null 2>&1) || echo "torch harness build failed"
if [ "${TESTS:-1}" = 1 ]; then
  (cd dist/cuda && CACHALOT_SANITIZER=0 ./run.sh) >"$OUT/cuda-tests.txt" 2>&1
  tail -n 2 "$OUT/cuda-tests.txt"
fi
echo "tests: $(( $(date +%s) - S )) s"
[ -f dist/cuda/traces/hit_1mib.trace ] || python3 dist/cuda/traces/synth_traces.py dist/cuda/traces
TR=(dist/cuda/traces/*.trace)
R=$OUT/replay.jsonl; : >"$R"
tag() { sed -u "s/^{/{\"build\":\"$1\",\"config\":\"$2\",/"; }
CA="expandable_segments:True"
PT="placement:pytorch,expandable_segments:True"
dist/cuda/bin/cachalot replay --backend cuda --json --passes 2 "${TR[@]}" >/dev/null 2>&1
for r in $(seq 1 "$ROUNDS"); do
  for cfg in "$CA" "$PT"; do
    for b in "new=dist/cuda/bin/cachalot" "old=$OLD/cachalot"; do
      [ -x "${b#*=}" ] || continue
      timeout 120 "${b#*=}" replay --backend cuda --json --passes 5 --config "$cfg" "${TR[@]}" 2>/dev/null \
        | grep '^{' | tag "${b%%=*}" "$cfg" >>"$R"
    done
  done
  timeout 120 dist/cuda/bin/cachalot replay --backend cuda --json --passes 5 "${TR[@]}" 2>/dev/null \
    | grep '^{' | tag new default >>"$R"
  for m in default expandable; do
    timeout 120 dist/cuda/build/torch_replay --passes=5 --mode=$m "${TR[@]}" 2>/dev/null \
      | grep '^{' | tag torch "$m" >>"$R"
  done
done
echo "replay: $(( $(date +%s) - S )) s"
if [ -x "$OLD/mlp-train" ]; then
  OUT=$OUT/cudarc AB=0 RUNS=${RUNS:-2} OLD_MLP=$OLD/mlp-train timeout 300 scripts/device/fences_ab.sh \
    >"$OUT/cudarc.txt" 2>&1
  echo "cudarc: rc=$? after $(( $(date +%s) - S )) s"
  sed -n '/== mlp-train/,$p' "$OUT/cudarc.txt"
fi
python3 - "$R" <<'P'
import json, sys, os, statistics as st, collections
w = collections.defaultdict(list)
c = collections.defaultdict(list)
calls = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    t = os.path.basename(j["trace"]).removesuffix(".trace")
    k = (j["build"], j["config"], t)
    w[k].append(j["warm_ns_per_op"]); c[k].append(j["cold_ns_per_op"])
    if "device_allocs_all" in j:
        calls[k] = "%d/%d" % (j["device_allocs_cold"], j["device_allocs_all"])
traces = sorted({k[2] for k in w if k[0] == "torch"})
rows = sorted({(b, cfg) for (b, cfg, _) in w if b != "torch"})
med = lambda d, k: st.median(d[k]) if d.get(k) else float("nan")
print("\nwarm ns/op (ratio to PyTorch default) | cold ns/op (ratio to PyTorch expandable), medians over rounds")
print("%-22s %-46s %18s %20s %10s" % ("trace", "build / config", "warm", "cold", "dev allocs"))
for t in traces:
    tw, tc = med(w, ("torch", "default", t)), med(c, ("torch", "expandable", t))
    print("%-22s %-46s %9.1f %8s %10.1f %9s" % (t, "torch / default", tw, "", med(c, ("torch", "default", t)), ""))
    print("%-22s %-46s %9.1f %8s %10.1f %9s" % (t, "torch / expandable", med(w, ("torch", "expandable", t)), "", tc, ""))
    for b, cfg in rows:
        k = (b, cfg, t)
        if k not in w: continue
        print("%-22s %-46s %9.1f %7.3fx %10.1f %8.2fx %10s" % (t, b + " / " + cfg, med(w, k), med(w, k) / tw,
              med(c, k), med(c, k) / tc, calls.get(k, "")))
P
