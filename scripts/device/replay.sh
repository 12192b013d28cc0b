#!/usr/bin/env bash
# Trace replay on the GPU machine: host time per operation, device
# allocations and peak memory of cachalot's ways against PyTorch's own
# CUDACachingAllocator, in one run on one machine. From the repository
# root, after `cargo xtask bench-cuda` packed dist/cuda here (PyTorch, g++
# and CUDA there; no Rust, no network).
#
#   scripts/device/replay.sh
#   ROUNDS=1 WAYS="default= pytorch-expandable=placement:pytorch,expandable_segments:True" \
#     TORCH_MODES="default expandable async" scripts/device/replay.sh
#   WAYS="new= old=@dist/exp/old/cachalot" scripts/device/replay.sh   # two builds, A/B
#
# env: WAYS         cachalot's ways, space-separated NAME=CONFIG[@CLI]: CONFIG
#                   is a configuration string (empty: the default), CLI
#                   another build of the `cachalot` command (default
#                   dist/cuda/bin/cachalot), e.g. `cargo build --release -p
#                   cachalot-cli --features cuda` of an older commit, stripped
#                   (default: "default= fixed=expandable_segments:False")
#      ENV_<NAME>   environment of that way's runs, e.g. ENV_old="VAR=1"
#                   (NAME with '-' written '_')
#      TORCH_MODES  PyTorch's modes (bench/pytorch/torch_replay.cpp):
#                   default, expandable, async (default "default expandable")
#      ROUNDS       rounds (default 3); each runs every way, in an order that
#                   rotates by round (the first process of a round ran slower
#                   on the H200's host), then PyTorch's modes
#      PASSES       passes per replay (default 5): cold = pass 1, warm = the
#                   median of the others
#      BACKEND      cuda (default); mock runs the cachalot ways on the
#                   simulated device (a check of this script without a GPU)
#      DIST         the packed folder (default dist/cuda)
#      OUT          logs (default /tmp/out): replay.jsonl, memory.jsonl,
#                   table.txt
# Prints last, per trace and way, the medians over the rounds: warm ns/op
# (x PyTorch's default), cold ns/op (x PyTorch's expandable mode), device
# allocations in pass 1 / all passes, peak reserved / live peak; then each
# round's warm ratio to PyTorch's default and their median (a round's
# ratio cancels the host's drift between rounds).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=${DIST:-dist/cuda}
ROUNDS=${ROUNDS:-3}
PASSES=${PASSES:-5}
BACKEND=${BACKEND:-cuda}
WAYS=${WAYS:-default= fixed=expandable_segments:False}
TORCH_MODES=${TORCH_MODES-default expandable}
S=$(date +%s)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -n "$TORCH_MODES" ]; then
  (cd "$D" && pytorch/build.sh build >"$OUT/torch-build.txt" 2>&1) || echo "replay.sh: the PyTorch harness failed to build ($OUT/torch-build.txt)"
fi
[ -f "$D/traces/hit_1mib.trace" ] || python3 "$D/traces/synth_traces.py" "$D/traces"
TR=("$D"/traces/*.trace)
R=$OUT/replay.jsonl; M=$OUT/memory.jsonl; : >"$R"; : >"$M"
tag() { sed -u "s/^{/{\"way\":\"$1\",\"round\":$2,/"; }
read -r -a WL <<<"$WAYS"
way() { # WAY ROUND EXTRA-ARGS...: one replay of every trace, JSON lines tagged
  local spec=$1 r=$2; shift 2
  local name=${spec%%=*} rest=${spec#*=} cli=$D/bin/cachalot
  case $rest in *@*) cli=${rest#*@}; rest=${rest%%@*} ;; esac
  local envv=ENV_${name//-/_} c=()
  [ -n "$rest" ] && c=(--config "$rest")
  env ${!envv:-} timeout 200 "$cli" replay --backend "$BACKEND" --json "${c[@]}" "$@" "${TR[@]}" 2>>"$OUT/errors.txt" \
    | grep '^{' | tag "$name" "$r"
}
# a discarded warm-up of each allocator (the first process on a fresh
# machine measures the machine's warm-up too)
way "${WL[0]}" 0 --passes 2 >/dev/null
for m in $TORCH_MODES; do "$D/build/torch_replay" --passes=2 --mode="$m" "${TR[@]}" >/dev/null 2>&1; break; done
for r in $(seq 1 "$ROUNDS"); do
  n=${#WL[@]}
  for i in $(seq 0 $((n - 1))); do way "${WL[$(( (i + r - 1) % n ))]}" "$r" --passes "$PASSES" >>"$R"; done
  for m in $TORCH_MODES; do
    timeout 200 "$D/build/torch_replay" --passes="$PASSES" --mode="$m" "${TR[@]}" 2>>"$OUT/errors.txt" \
      | grep '^{' | tag "torch-$m" "$r" >>"$R"
  done
  echo "round $r: $(( $(date +%s) - S )) s"
done
for w in "${WL[@]}"; do way "$w" 0 --passes 1 --stats >>"$M"; done
echo "replay: $(( $(date +%s) - S )) s"
python3 - "$R" "$M" "${WL[@]}" <<'P' | tee "$OUT/table.txt"
import json, sys, os, statistics as st, collections
warm, cold, rounds = collections.defaultdict(list), collections.defaultdict(list), collections.defaultdict(dict)
calls, live, mem = {}, {}, {}
name = lambda j: os.path.basename(j["trace"]).removesuffix(".trace")
for line in open(sys.argv[1]):
    j = json.loads(line); k = (j["way"], name(j))
    warm[k].append(j["warm_ns_per_op"]); cold[k].append(j["cold_ns_per_op"])
    rounds[k][j["round"]] = j["warm_ns_per_op"]
    calls[k] = "%d/%d" % (j["device_allocs_cold"], j["device_allocs_all"])
    if j.get("live_peak"):
        live[k[1]] = j["live_peak"]; mem[k] = j["peak_reserved"] / j["live_peak"]
for line in open(sys.argv[2]):
    j = json.loads(line); k = (j["way"], name(j))
    peak = j.get("memory_stats", {}).get("requested_bytes.all.peak") or live.get(k[1])
    if peak: mem[k] = j["peak_reserved"] / peak
ways = ["torch-" + m for m in ("default", "expandable", "async")] + [w.split("=")[0] for w in sys.argv[3:]]
traces = sorted({t for (_, t) in warm})
med = lambda d, k: st.median(d[k]) if d.get(k) else float("nan")
x = lambda a, b: "%6.2fx" % (a / b) if b == b and b else "       "
print("warm ns/op (x PyTorch default) | cold ns/op (x PyTorch expandable) | device allocs pass 1/all | peak reserved / live peak")
print("%-22s %-20s %9s %7s %9s %7s %11s %8s" % ("trace", "way", "warm", "", "cold", "", "allocs", "memory"))
for t in traces:
    tw, tc = med(warm, ("torch-default", t)), med(cold, ("torch-expandable", t))
    for w in ways:
        k = (w, t)
        if k not in warm: continue
        print("%-22s %-20s %9.1f %s %9.1f %s %11s %8s" % (t, w, med(warm, k), x(med(warm, k), tw), med(cold, k),
              x(med(cold, k), tc), calls.get(k, ""), "%.4f" % mem[k] if k in mem else ""))
if not any(k[0] == "torch-default" for k in warm):
    sys.exit(0)
print("\nwarm ratio to PyTorch's default, per round (in round order), and its median")
per = collections.defaultdict(list)
for t in traces:
    base = rounds[("torch-default", t)]
    for w in ways[3:]:
        d = rounds.get((w, t), {})
        r = [d[i] / base[i] for i in sorted(d) if i in base]
        if r:
            per[w].append(st.median(r))
            print("%-22s %-20s %s  -> %.3fx" % (t, w, " ".join("%.3f" % v for v in r), st.median(r)))
print("median over traces: " + ", ".join("%s %.3fx" % (w, st.median(v)) for w, v in per.items()))
P
