#!/usr/bin/env bash
# One device call for session 17 (the shared mirror with an owner, issue
# 18), from the repository root on the GPU machine, after `cargo xtask
# test-cuda && cargo xtask bench-cuda` packed dist/cuda here and main
# before the session (`ab681d3`, `cargo build --release -p cachalot-cli
# --features cuda`, stripped) was copied to dist/exp/s16/cachalot:
#   1. scripts/device/trace_ab.sh with BUILDS="s16=dist/exp/s16/cachalot"
#      (the CUDA tests, the mixed test, the threads table, the trace replay
#      in the default configuration against PyTorch's default mode);
#   2. scripts/device/expandable_ab.sh with OLD=dist/exp/s16, TESTS=0
#      (both expandable modes, old and new, against PyTorch's modes).
# Logs in $OUT/trace_ab and $OUT/expandable_ab; the tables last.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/trace_ab" "$OUT/expandable_ab"
S=$(date +%s)
OUT=$OUT/trace_ab BUILDS="s16=dist/exp/s16/cachalot" ROUNDS=${ROUNDS:-3} \
  timeout 330 scripts/device/trace_ab.sh >"$OUT/trace_ab/summary.txt" 2>&1
echo "trace_ab: rc=$? after $(( $(date +%s) - S )) s"
OUT=$OUT/expandable_ab OLD=dist/exp/s16 TESTS=0 ROUNDS=${EXP_ROUNDS:-2} \
  timeout 200 scripts/device/expandable_ab.sh >"$OUT/expandable_ab/summary.txt" 2>&1
echo "expandable_ab: rc=$? after $(( $(date +%s) - S )) s"
grep -E "side_stream|churn_4|hit_1mib|gpt2" "$OUT/expandable_ab/summary.txt" | grep -v torch | head -20
cat "$OUT/trace_ab/summary.txt" | tail -n 40
