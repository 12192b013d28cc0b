#!/usr/bin/env bash
# Session 20 on the GPU machine (from the repository root, after `cargo
# xtask test-cuda` and `cargo xtask bench-cuda` packed dist/cuda here): the
# default is now cachalot's low-memory mode (expandable segments with page
# recycling). Logs go to $OUT/logs-PART.tgz; the tables are printed last.
#   scripts/device/session20.sh gpu      the CUDA test binaries (run.sh, no
#                                        sanitizer), one bench.sh round
#                                        (the default against PyTorch's
#                                        default and expandable modes), the
#                                        three configs on CUDA
#                                        (expandable_cuda.sh), threads in the
#                                        default and in fixed segments
#   scripts/device/session20.sh clients  the CUDA test binaries again, threads
#                                        (default and fixed segments, two
#                                        rounds), python/client_memory.py (BERT
#                                        inference, GPT-2 training: native,
#                                        native expandable, cachalot's default,
#                                        cachalot's fixed segments)
#   scripts/device/session20.sh final    the test binaries, one bench.sh round,
#                                        the PyTorch drop-in suite
#   scripts/device/session20.sh torch    the PyTorch drop-in suite
#                                        (python/run_gpu_suite.sh; its
#                                        train_compare runs cachalot's default)
set -u
PART=${1:?gpu, clients, final or torch}
OUT=${OUT:-/tmp/out}; L=/tmp/logs-$PART; rm -rf "$L"; mkdir -p "$L" "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
S=$(date +%s)
case $PART in
  gpu)
    (cd dist/cuda && CACHALOT_SANITIZER=0 timeout ${T_TESTS:-170} ./run.sh) >"$L/run.txt" 2>&1
    echo "run.sh: rc=$? after $(( $(date +%s) - S )) s"
    cp -r dist/cuda/logs "$L/" 2>/dev/null
    (cd dist/cuda && RESULTS=$L/results ROUNDS=1 WARMUP=1 MODES="default expandable" THREADS=0 \
      timeout ${T_BENCH:-170} ./bench.sh) >"$L/bench.txt" 2>&1
    echo "bench.sh: rc=$? after $(( $(date +%s) - S )) s"
    OUT=$L/exp timeout ${T_EXP:-90} scripts/device/expandable_cuda.sh >"$L/expandable.txt" 2>&1
    echo "expandable_cuda.sh: rc=$? after $(( $(date +%s) - S )) s"
    for cfg in "" "expandable_segments:False"; do
      echo "== threads config='$cfg'" >>"$L/threads.txt"
      timeout 60 dist/cuda/bin/cachalot threads --backend cuda --threads 1,2,8,16 --config "$cfg" >>"$L/threads.txt" 2>&1
    done
    echo "threads: after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    grep -E "FAILED|panicked" "$L/run.txt" | head -20; tail -5 "$L/run.txt"
    sed -n '/^speed:/,$p' "$L/bench.txt" | head -45
    tail -22 "$L/expandable.txt" | grep -E "^(trace|gpt2|resnet|side|churn|hit)"
    grep -E "^==|mops" "$L/threads.txt" | sed -E 's/"ops":[0-9]+,//' ;;
  clients)
    (cd dist/cuda && CACHALOT_SANITIZER=0 timeout ${T_TESTS:-120} ./run.sh) >"$L/run.txt" 2>&1
    echo "run.sh: rc=$? after $(( $(date +%s) - S )) s"
    for r in 1 2; do
      for cfg in "" "expandable_segments:False"; do
        echo "== threads round $r config='$cfg'" >>"$L/threads.txt"
        timeout 60 dist/cuda/bin/cachalot threads --backend cuda --threads 1,2,8,16 --config "$cfg" >>"$L/threads.txt" 2>&1
      done
    done
    echo "threads: after $(( $(date +%s) - S )) s"
    export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 CACHALOT_TORCH_CACHE=$L/shim-cache
    export CUBLAS_WORKSPACE_CONFIG=:4096:8
    timeout ${T_CLIENTS:-330} python3 python/client_memory.py --lib dist/cuda/lib/libcachalot_capi.so \
      --workloads ${WORKLOADS:-bert,gpt2} --json "$L/clients.json" >"$L/clients.txt" 2>&1
    echo "client_memory.py: rc=$? after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    grep -E "FAILED|panicked" "$L/run.txt" | head -20; tail -3 "$L/run.txt"
    grep -E "^==|mops" "$L/threads.txt" | sed -E 's/"ops":[0-9]+,//'
    tail -14 "$L/clients.txt" ;;
  final)
    (cd dist/cuda && CACHALOT_SANITIZER=0 timeout ${T_TESTS:-120} ./run.sh) >"$L/run.txt" 2>&1
    echo "run.sh: rc=$? after $(( $(date +%s) - S )) s"
    (cd dist/cuda && RESULTS=$L/results ROUNDS=1 WARMUP=1 MODES="default expandable" THREADS=0 \
      timeout ${T_BENCH:-150} ./bench.sh) >"$L/bench.txt" 2>&1
    echo "bench.sh: rc=$? after $(( $(date +%s) - S )) s"
    export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
    OUT=$L/suite timeout ${T_TORCH:-330} python/run_gpu_suite.sh >"$L/suite.txt" 2>&1
    echo "run_gpu_suite.sh: rc=$? after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    grep -E "FAILED|panicked" "$L/run.txt" | head -20; tail -3 "$L/run.txt"
    sed -n '/^speed:/,/^PyTorch now/p' "$L/bench.txt" | head -22
    tail -24 "$L/suite.txt" ;;
  torch)
    export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
    OUT=$L timeout ${T_TORCH:-500} python/run_gpu_suite.sh >"$L/suite.txt" 2>&1
    echo "run_gpu_suite.sh: rc=$? after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    tail -45 "$L/suite.txt" ;;
esac
