#!/usr/bin/env bash
# Session 17, second call: the builds' order rotated each round (the first
# build of a round runs slower on the H200 host), ROUNDS rounds of: new and
# s16 (main before the session, dist/exp/s16/cachalot) in cachalot's
# expandable mode and in the default configuration, then PyTorch's default
# mode; every trace of dist/cuda/traces, 5 passes. Prints per trace and
# configuration each build's warm ns/op per round and the median ratio
# to PyTorch's default mode. OLD=name=path names the older build (default
# s16=dist/exp/s16/cachalot; session 18: OLD=s17=dist/exp/s17/cachalot).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROUNDS=${ROUNDS:-4}
[ -f dist/cuda/traces/hit_1mib.trace ] || python3 dist/cuda/traces/synth_traces.py dist/cuda/traces
(cd dist/cuda && pytorch/build.sh build >/dev/null 2>&1) || echo "torch harness build failed"
TR=(dist/cuda/traces/*.trace)
R=$OUT/order.jsonl; : >"$R"
tag() { sed -u "s/^{/{\"build\":\"$1\",\"config\":\"$2\",\"round\":$3,/"; }
OLD=${OLD:-s16=dist/exp/s16/cachalot}
BL=("new=dist/cuda/bin/cachalot" "$OLD")
dist/cuda/bin/cachalot replay --backend cuda --json --passes 2 "${TR[@]}" >/dev/null 2>&1
for r in $(seq 1 "$ROUNDS"); do
  for i in 0 1; do
    b=${BL[$(( (i + r) % 2 ))]}
    for cfg in default expandable_segments:True; do
      c=(); [ "$cfg" = default ] || c=(--config "$cfg")
      timeout 100 "${b#*=}" replay --backend cuda --json --passes 5 "${c[@]}" "${TR[@]}" 2>/dev/null \
        | grep '^{' | tag "${b%%=*}" "$cfg" "$r" >>"$R"
    done
  done
  timeout 100 dist/cuda/build/torch_replay --passes=5 --mode=default "${TR[@]}" 2>/dev/null \
    | grep '^{' | tag torch default "$r" >>"$R"
done
python3 - "$R" "${OLD%%=*}" <<'P'
import json, sys, os, statistics as st, collections
w = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    j = json.loads(line)
    t = os.path.basename(j["trace"]).removesuffix(".trace")
    w[(j["build"], j["config"], t)][j["round"]] = j["warm_ns_per_op"]
traces = sorted({k[2] for k in w if k[0] == "torch"})
print("warm ns/op per round (first build of the round marked *), median ratio to PyTorch default")
for cfg in ["default", "expandable_segments:True"]:
    for t in traces:
        base = w[("torch", "default", t)]
        for b in ["new", sys.argv[2]]:
            d = w.get((b, cfg, t), {})
            rs = sorted(d)
            ratios = [d[r] / base[r] for r in rs if r in base]
            first = lambda r: (b == "new") == (r % 2 == 0)
            vals = " ".join("%.1f%s" % (d[r], "*" if first(r) else "") for r in rs)
            print("%-26s %-22s %-4s %s  -> %.3fx" % (cfg[:26], t, b, vals, st.median(ratios) if ratios else float("nan")))
P
