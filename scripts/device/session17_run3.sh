#!/usr/bin/env bash
# Session 17, third call (recycling asks an idle stream, `query_stream`),
# from the repository root on the GPU machine, after `cargo xtask
# test-cuda && cargo xtask bench-cuda` packed dist/cuda here and main
# before the session (`ab681d3`) was copied to dist/exp/s16/ (its CUDA
# `cachalot` CLI and its `mlp-train`, each `cargo build --release`,
# stripped):
#   1. the CUDA test binaries (dist/cuda/run.sh);
#   2. scripts/device/session17_order.sh (ROUNDS=4): new and s16, default
#      and cachalot's expandable mode, the order rotating, PyTorch's
#      default mode each round;
#   3. the cudarc workload, new and s16, two rounds
#      (scripts/device/fences_ab.sh with AB=0).
# Logs in $OUT; the tables last.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$(date +%s)
(cd dist/cuda && CACHALOT_SANITIZER=0 timeout 150 ./run.sh) >"$OUT/cuda-tests.txt" 2>&1
echo "tests: $(tail -n 2 "$OUT/cuda-tests.txt" | tr '\n' ' ') after $(( $(date +%s) - S )) s"
OUT=$OUT/order ROUNDS=${ROUNDS:-4} timeout 200 scripts/device/session17_order.sh >"$OUT/order.txt" 2>&1
echo "order: rc=$? after $(( $(date +%s) - S )) s"
OUT=$OUT/cudarc AB=0 RUNS=${RUNS:-2} OLD_MLP=dist/exp/s16/mlp-train timeout 200 \
  scripts/device/fences_ab.sh >"$OUT/cudarc.txt" 2>&1
echo "cudarc: rc=$? after $(( $(date +%s) - S )) s"
sed -n '/== mlp-train/,$p' "$OUT/cudarc.txt"
cat "$OUT/order.txt"
