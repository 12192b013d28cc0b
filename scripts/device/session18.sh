#!/usr/bin/env bash
# Session 18 (cheaper page moves in cachalot's expandable mode; the host's
# CPU topology under issue 18's thread goal), from the repository root on
# the GPU machine, after `cargo xtask test-cuda && cargo xtask bench-cuda`
# packed dist/cuda here and main before the session (`fba08a3`) was copied
# to dist/exp/s17/ (its CUDA `cachalot` CLI and its `mlp-train`, each
# `cargo build --release`, stripped). Two calls:
#   PART=1  the CUDA test binaries (dist/cuda/run.sh), then
#           scripts/device/session17_order.sh with OLD=s17 (ROUNDS=4): new
#           and s17, default and cachalot's expandable mode, the order
#           rotating, PyTorch's default mode each round;
#   PART=2  the CPU topology (lscpu), the threads benchmark (cachalot and
#           PyTorch's C++ harness, ROUNDS rounds: threads_ceiling.sh), then
#           the same pinned to one logical CPU per physical core (taskset:
#           the same cores for both allocators; cachalot at 1 and 8
#           threads), then the cudarc workload, new and s17
#           (scripts/device/fences_ab.sh with AB=0).
# Logs in $OUT; the tables last.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$(date +%s)
if [ "${PART:-1}" = 1 ]; then
  (cd dist/cuda && CACHALOT_SANITIZER=0 timeout 170 ./run.sh) >"$OUT/cuda-tests.txt" 2>&1
  echo "tests: $(tail -n 2 "$OUT/cuda-tests.txt" | tr '\n' ' ') after $(( $(date +%s) - S )) s"
  OUT=$OUT/order OLD=s17=dist/exp/s17/cachalot ROUNDS=${ROUNDS:-4} timeout 330 \
    scripts/device/session17_order.sh >"$OUT/order.txt" 2>&1
  echo "order: rc=$? after $(( $(date +%s) - S )) s"
  cat "$OUT/order.txt"
  exit 0
fi
lscpu >"$OUT/lscpu.txt" 2>&1
lscpu -p=CPU,CORE,SOCKET,NODE >"$OUT/lscpu-p.txt" 2>&1
grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|CPU max MHz)" "$OUT/lscpu.txt"
# one logical CPU per physical core, in core order
ONE=$(grep -v '^#' "$OUT/lscpu-p.txt" | awk -F, '!seen[$4","$3","$2]++ {print $1}' | paste -sd, -)
echo "one CPU per core: $ONE"
# the threads benchmark and PyTorch's harness, alternated (threads_ceiling.sh)
OUT=$OUT/threads ROUNDS=${ROUNDS:-3} BUILDS="new=dist/cuda/bin/cachalot" timeout 200 \
  scripts/device/threads_ceiling.sh >"$OUT/threads.txt" 2>&1
echo "threads: after $(( $(date +%s) - S )) s"
# the same, every process pinned to one logical CPU per core
if [ -n "$ONE" ]; then
  OUT=$OUT/pinned ROUNDS=${ROUNDS:-3} BUILDS="new=dist/cuda/bin/cachalot" THREADS_LIST=1,8 \
    timeout 200 taskset -c "$ONE" scripts/device/threads_ceiling.sh >"$OUT/pinned.txt" 2>&1
fi
echo "pinned: after $(( $(date +%s) - S )) s"
OUT=$OUT/cudarc AB=0 RUNS=${RUNS:-2} OLD_MLP=dist/exp/s17/mlp-train timeout 200 \
  scripts/device/fences_ab.sh >"$OUT/cudarc.txt" 2>&1
echo "cudarc: rc=$? after $(( $(date +%s) - S )) s"
sed -n '/== mlp-train/,$p' "$OUT/cudarc.txt"
echo "== threads"; sed -n '/^Mops/,$p' "$OUT/threads.txt"
echo "== pinned"; sed -n '/^Mops/,$p' "$OUT/pinned.txt" 2>/dev/null
