#!/usr/bin/env bash
# One device call: the cudarc workload with and without completion fences
# (issue 21), then issue 18's figures (scripts/device/trace_ab.sh), from the
# repository root on the GPU machine, after `cargo xtask test-cuda && cargo
# xtask bench-cuda` packed dist/cuda here.
#   OLD_MLP  an older examples/mlp-train binary (default dist/exp/old/mlp-train,
#            e.g. `cargo build --release -p mlp-train` of an older commit,
#            stripped); skipped when missing
#   RUNS     cudarc rounds, new then old in each (default 3)
#   AB=0     skips trace_ab.sh
# Logs in $OUT; the tables last.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$(date +%s)
OLD_MLP=${OLD_MLP:-dist/exp/old/mlp-train}
mk() { # $1 = folder, $2 = mlp-train binary: a dist folder without tests
  mkdir -p "$1/cudarc/bin" && cp "$2" "$1/cudarc/bin/mlp-train"
}
mk /tmp/newdist dist/cuda/cudarc/bin/mlp-train
[ -x "$OLD_MLP" ] && mk /tmp/olddist "$OLD_MLP"
for r in $(seq 1 "${RUNS:-3}"); do
  if [ "$r" = 1 ]; then d=dist/cuda; else d=/tmp/newdist; fi
  CUDARC_DIST=$d OUT=$OUT/new-$r timeout 120 scripts/device/cudarc_example.sh \
    --ways cudarc,cachalot,cachalot-expandable >"$OUT/cudarc-new-$r.txt" 2>&1
  echo "cudarc new round $r: rc=$? after $(( $(date +%s) - S )) s"
  if [ -x "$OLD_MLP" ]; then
    CUDARC_DIST=/tmp/olddist OUT=$OUT/old-$r timeout 60 scripts/device/cudarc_example.sh \
      --ways cudarc,cachalot,cachalot-expandable >"$OUT/cudarc-old-$r.txt" 2>&1
    echo "cudarc old round $r: rc=$? after $(( $(date +%s) - S )) s"
  fi
done
if [ "${AB:-1}" = 1 ]; then
  OUT=$OUT/ab ROUNDS=${ROUNDS:-3} timeout ${T_AB:-420} scripts/device/trace_ab.sh >"$OUT/trace_ab.txt" 2>&1
  echo "trace_ab.sh: rc=$? after $(( $(date +%s) - S )) s"
fi
sed -n '/== tests ==/,/^$/p' "$OUT/cudarc-new-1.txt"
echo "== mlp-train: way, median step ms, alloc host us/step, peak MiB (driver), cachalot peak"
for f in "$OUT"/cudarc-new-*.txt "$OUT"/cudarc-old-*.txt; do
  [ -f "$f" ] || continue
  echo "-- $(basename "$f" .txt)"
  awk '$1 ~ /^(cudarc|cachalot|cachalot-expandable)$/ && $2 ~ /^[0-9.]+$/ {print $1, $2, $5, $7, $8, $9}' "$f"
done
if [ -f "$OUT/trace_ab.txt" ]; then tail -n 45 "$OUT/trace_ab.txt"; fi
