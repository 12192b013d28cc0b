#!/usr/bin/env bash
# The tests that need the GPU, on the GPU machine, from the repository root
# after `cargo xtask test-cuda && cargo xtask bench-cuda` packed dist/cuda
# here:
#
#   scripts/device/tests.sh
#   PARTS="cuda dropin" SANITIZER=1 scripts/device/tests.sh
#
#   cuda    the CUDA test binaries (dist/cuda/run.sh: CACHALOT_REQUIRE_GPU=1,
#           so a test that would skip fails; with SANITIZER=1 also under
#           compute-sanitizer memcheck);
#   mixed   the mixed test three times (8 threads on 8 streams, a janitor
#           calling empty_cache and memory_stats every millisecond, exact
#           stats checked at the end) and its throughput;
#   dropin  the PyTorch drop-in (python/run_gpu_suite.sh: the conformance
#           suite against native PyTorch and cachalot, the host cost per
#           torch.empty, a short training comparison);
#   cudarc  the cudarc interop tests and workload (cudarc_example.sh).
#
# env: PARTS (default "cuda mixed dropin cudarc"), SANITIZER (default 0),
#      OUT (default /tmp/out). Prints each part's summary last; exits 1 when
#      a part failed.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$(date +%s); bad=0
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for part in ${PARTS:-cuda mixed dropin cudarc}; do
  case $part in
    cuda)
      (cd dist/cuda && CACHALOT_SANITIZER=${SANITIZER:-0} timeout ${T_CUDA:-400} ./run.sh) >"$OUT/cuda-tests.txt" 2>&1
      rc=$?; [ $rc = 0 ] || bad=1
      echo "== cuda: rc=$rc after $(( $(date +%s) - S )) s"
      grep -E "FAILED|panicked" "$OUT/cuda-tests.txt" | head -20; tail -n 3 "$OUT/cuda-tests.txt" ;;
    mixed)
      echo "== mixed"
      for i in 1 2 3; do
        timeout 120 dist/cuda/tests/cachalot-conformance-shards --nocapture eight_streams 2>&1 | grep '^mixed:' || bad=1
      done | tee "$OUT/mixed.txt" ;;
    dropin)
      OUT=$OUT/dropin timeout ${T_DROPIN:-500} python/run_gpu_suite.sh >"$OUT/dropin.txt" 2>&1
      rc=$?; [ $rc = 0 ] || bad=1
      echo "== dropin: rc=$rc after $(( $(date +%s) - S )) s"
      sed -n '/===== cachalot PyTorch drop-in: results/,$p' "$OUT/dropin.txt" | tail -n 45 ;;
    cudarc)
      OUT=$OUT/cudarc timeout ${T_CUDARC:-200} scripts/device/cudarc_example.sh >"$OUT/cudarc.txt" 2>&1
      rc=$?; [ $rc = 0 ] || bad=1
      echo "== cudarc: rc=$rc after $(( $(date +%s) - S )) s"
      sed -n '/^== tests ==/,$p' "$OUT/cudarc.txt" | grep -v '^json:' ;;
    *) echo "tests.sh: unknown part $part (cuda, mixed, dropin, cudarc)"; bad=1 ;;
  esac
done
exit $bad
