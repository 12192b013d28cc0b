#!/usr/bin/env bash
# On the GPU machine, from the repository root, after `cargo xtask bench-cuda`
# here (dist/cuda/bin/cachalot, dist/cuda/traces): replays every trace on the
# CUDA backend in cachalot's configs (fixed segments with steady
# placement; PyTorch's expandable mode; cachalot's expandable mode with page
# recycling, the default) and prints peak reserved / live peak, device allocations
# (first pass / all passes) and cold / warm host ns per op.
#   scripts/device/expandable_cuda.sh [DIST]     (DIST default dist/cuda)
set -u -o pipefail
D=${1:-dist/cuda}
PASSES=${PASSES:-5}
mkdir -p "${OUT:-/tmp}"; R=${OUT:-/tmp}/expandable-cuda.jsonl; : >"$R"
[ -f "$D/traces/hit_1mib.trace" ] || python3 "$D/traces/synth_traces.py" "$D/traces"
for cfg in "expandable_segments:False" "placement:pytorch,expandable_segments:True" "expandable_segments:True"; do
  "$D/bin/cachalot" replay --backend cuda --json --passes "$PASSES" --config "$cfg" "$D"/traces/*.trace \
    | grep '^{' | sed "s/^{/{\"config\":\"$cfg\",/" | tee -a "$R" || echo "replay with $cfg failed"
done
python3 - "$R" "$D/traces/pytorch-modes-h200.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
live = {k: v["live_peak"] for k, v in json.load(open(sys.argv[2]))["traces"].items()}
print("\nCUDA backend, %s: peak reserved / live peak, device allocs (pass 1 / all), cold / warm ns per op" % "H200")
print("%-22s %-44s %8s %13s %9s %9s" % ("trace", "config", "ratio", "dev allocs", "cold ns", "warm ns"))
for r in rows:
    t = r["trace"].split("/")[-1].replace(".trace", "")
    print("%-22s %-44s %8.4f %13s %9.1f %9.1f" % (t, r["config"], r["peak_reserved"] / live.get(t, r["peak_reserved"]),
          "%d/%d" % (r["device_allocs_cold"], r["device_allocs_all"]), r["cold_ns_per_op"], r["warm_ns_per_op"]))
PY
