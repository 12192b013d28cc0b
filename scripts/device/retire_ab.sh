#!/usr/bin/env bash
# One device call for session 15 (issue 21's peak, issue 15's busy-device
# memory; named for the page move without a wait it measured, which was not
# kept: docs/design-expandable.md), from the repository root on the GPU
# machine, after `cargo xtask test-cuda && cargo xtask bench-cuda` packed
# dist/cuda here. With OLD_MLP missing it runs the current build alone.
#   OLD_MLP  examples/mlp-train of the previous allocator, built with this
#            commit's example code (default dist/exp/s14/mlp-train; e.g. a
#            worktree of the older commit with examples/mlp-train copied
#            from this one, `cargo build --release -p mlp-train`, stripped)
#   ROUNDS   cudarc workload rounds (default 5); new then old in odd
#            rounds, old then new in even ones
#   TESTS=0  skips the CUDA test binaries; CLIENTS=0 skips the PyTorch clients
#   1. the CUDA test binaries (dist/cuda/run.sh);
#   2. the cudarc workload (every way, the memory pass over a whole batch
#      cycle), new and old;
#   3. the PyTorch clients (python/client_memory.py: BERT inference, GPT-2
#      training) through the drop-in, native and cachalot, both modes.
# Logs in $OUT; the tables last.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$(date +%s)
OLD_MLP=${OLD_MLP:-dist/exp/s14/mlp-train}
ROUNDS=${ROUNDS:-5}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  (cd dist/cuda && CACHALOT_SANITIZER=0 ./run.sh) >"$OUT/cuda-tests.txt" 2>&1
  echo "cuda tests: $(tail -n 1 "$OUT/cuda-tests.txt") after $(( $(date +%s) - S )) s"
fi
mk() { # $1 = folder, $2 = mlp-train binary: a dist folder without tests
  mkdir -p "$1/cudarc/bin" && cp "$2" "$1/cudarc/bin/mlp-train"
}
mk /tmp/newdist dist/cuda/cudarc/bin/mlp-train
[ -x "$OLD_MLP" ] && mk /tmp/olddist "$OLD_MLP"
WAYS=cudarc,cudarc-retain,cachalot,cachalot-expandable
one() { # $1 = new|old, $2 = round
  local d=/tmp/${1}dist
  [ "$1" = new ] && [ "$2" = 1 ] && d=dist/cuda # the example's tests once
  [ -x "$d/cudarc/bin/mlp-train" ] || return 0
  CUDARC_DIST=$d OUT=$OUT/$1-$2 timeout 120 scripts/device/cudarc_example.sh \
    --ways "$WAYS" >"$OUT/cudarc-$1-$2.txt" 2>&1
  echo "cudarc $1 round $2: rc=$? after $(( $(date +%s) - S )) s"
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then one new "$r"; one old "$r"; else one old "$r"; one new "$r"; fi
done
if [ "${CLIENTS:-1}" = 1 ]; then
  PYTHONPATH=$PWD/python CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 300 python3 python/client_memory.py \
    --lib dist/cuda/lib/libcachalot_capi.so --workloads bert,gpt2 >"$OUT/client.txt" 2>&1
  echo "clients: rc=$? after $(( $(date +%s) - S )) s"
fi
sed -n '/== tests ==/,/^$/p' "$OUT/cudarc-new-1.txt"
echo "== mlp-train: build-round way: median step ms, alloc host us/step, driver peak MiB, cachalot peak"
for f in "$OUT"/cudarc-*.txt; do
  n=$(basename "$f" .txt)
  awk -v n="${n#cudarc-}" '$1 ~ /^(cudarc|cudarc-retain|cachalot|cachalot-expandable)$/ && $2 ~ /^[0-9.]+$/ {print n, $1, $2, $5, $7, $8, $9}' "$f"
done
echo "== driver peak MiB by batch rows (memory pass)"
for f in "$OUT"/cudarc-*.txt; do
  echo "-- $(basename "$f" .txt)"
  sed -n '/^peak_MiB by rows/,/^cachalot-expandable /p' "$f"
done
if [ -f "$OUT/client.txt" ]; then grep '^|' "$OUT/client.txt"; tail -n 2 "$OUT/client.txt"; fi
echo "total: $(( $(date +%s) - S )) s"
