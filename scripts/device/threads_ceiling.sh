#!/usr/bin/env bash
# The threads benchmark against its ceiling (issue 18): CLI builds named in
# BUILDS (name=path ...; default: this checkout's dist/cuda/bin/cachalot and
# whatever of dist/exp/{budgets,nobudget,clock}/cachalot is there, the
# experimental builds of bench/experiments/README.md) and PyTorch's C++
# harness, alternated in ROUNDS rounds (OPS operations per thread) in one call, from the repository root
# on the GPU machine, after `cargo xtask bench-cuda` packed dist/cuda.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=$OUT/threads-ceiling.txt; : >"$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nproc; cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null
if [ -z "${BUILDS:-}" ]; then
  BUILDS="new=dist/cuda/bin/cachalot"
  for v in budgets nobudget clock; do [ -x dist/exp/$v/cachalot ] && BUILDS="$BUILDS $v=dist/exp/$v/cachalot"; done
fi
(cd dist/cuda && pytorch/build.sh build >/dev/null 2>&1) || echo "torch harness build failed"
T=${THREADS_LIST:-1,2,4,8,16}
for r in $(seq 1 "${ROUNDS:-3}"); do
  for b in $BUILDS; do
    echo "== ${b%%=*} r$r" >>"$L"; ${b#*=} threads --backend cuda --threads "$T" ${OPS:+--ops $OPS} >>"$L" 2>&1
  done
  echo "== torch r$r" >>"$L"; dist/cuda/build/torch_threads --mode=default >>"$L" 2>&1
done
python3 - "$L" $BUILDS <<'P'
import json, sys, statistics as st, collections
rows = collections.defaultdict(lambda: collections.defaultdict(list)); cur = None
for line in open(sys.argv[1]):
    if line.startswith("=="): cur = line.split()[1]; continue
    if line.startswith("{"):
        j = json.loads(line); rows[cur][j["threads"]].append(j.get("mops_per_s", j.get("mops")))
ts = sorted({t for v in rows.values() for t in v})
print("Mops/s, median (min-max) over rounds")
print("%-10s" % "build" + "".join("%20s" % t for t in ts))
names = [b.split("=")[0] for b in sys.argv[2:]]
for v in ["torch"] + names:
    print("%-10s" % v + "".join("%20s" % ("%.2f (%.2f-%.2f)" % (st.median(rows[v][t]), min(rows[v][t]), max(rows[v][t])) if rows[v][t] else "-") for t in ts))
for v in names:
    one = st.median(rows[v][1]) if rows[v][1] else float("nan")
    print("%-10s x own 1t: " % v + " ".join("%d:%.2f" % (t, st.median(rows[v][t]) / one) for t in ts if rows[v][t]),
          "| x torch: " + " ".join("%d:%.1f" % (t, st.median(rows[v][t]) / st.median(rows["torch"][t])) for t in ts if rows[v][t] and rows["torch"][t]))
P
