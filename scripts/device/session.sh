#!/usr/bin/env bash
# One device call of a session, from the repository root on the GPU machine,
# after `cargo xtask test-cuda` and `cargo xtask bench-cuda` packed dist/cuda
# here. Logs are tarred into $OUT/logs-PART.tgz (the device tool brings back
# at most 8 files); the summary tables are printed last.
#   scripts/device/session.sh timing    bench.sh (ours vs PyTorch's C++ in three
#                                       modes, threads), the expandable configs
#                                       on CUDA, the cudarc example
#   scripts/device/session.sh tests     the CUDA test binaries (dist/cuda/run.sh)
#   scripts/device/session.sh torch     the PyTorch drop-in suite (python/run_gpu_suite.sh)
#   scripts/device/session.sh train     train_compare.py's timing run (alternating processes)
#   scripts/device/session.sh ab        A/B against an older CLI in dist/old/cachalot:
#                                       threads (CUDA and mock) and the expandable
#                                       configs, bench.sh's speed and memory tables
#                                       (one round), the cudarc example
#   scripts/device/session.sh final     the CUDA test binaries, one bench.sh round
#                                       (speed, memory, threads vs PyTorch), the
#                                       expandable configs, threads of dist/old/cachalot,
#                                       the cudarc example
#   scripts/device/session.sh clients   python/client_memory.py (BERT inference,
#                                       GPT-2 training on four allocators), the
#                                       expandable configs on CUDA, the cudarc example
set -u
PART=${1:?timing, tests or torch}
OUT=${OUT:-/tmp/out}; L=/tmp/logs-$PART; rm -rf "$L"; mkdir -p "$L" "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
S=$(date +%s)
case $PART in
  timing)
    (cd dist/cuda && RESULTS=$L/results ROUNDS=${ROUNDS:-2} timeout ${T_BENCH:-330} ./bench.sh) >"$L/bench.txt" 2>&1
    echo "bench.sh: rc=$? after $(( $(date +%s) - S )) s"
    OUT=$L timeout ${T_EXP:-150} scripts/device/expandable_cuda.sh >"$L/expandable.txt" 2>&1
    echo "expandable_cuda.sh: rc=$? after $(( $(date +%s) - S )) s"
    OUT=$L timeout ${T_RUST:-100} scripts/device/cudarc_example.sh >"$L/cudarc.txt" 2>&1
    echo "cudarc_example.sh: rc=$? after $(( $(date +%s) - S )) s"
    # cachalot's configs on the same workload (CACHALOT_ALLOC_CONF)
    for c in roundup_power2_divisions:4 placement:pytorch max_split_size_mb:64; do
      CACHALOT_ALLOC_CONF=$c OUT=$L/cudarc-$c timeout 60 scripts/device/cudarc_example.sh --ways cudarc,cachalot,cachalot-expandable \
        >"$L/cudarc-$c.txt" 2>&1
      echo "== mlp-train with CACHALOT_ALLOC_CONF=$c (rc=$?)" >>"$L/cudarc-configs.txt"
      grep -E "^(way|cudarc|cachalot) " "$L/cudarc-$c.txt" >>"$L/cudarc-configs.txt"
    done
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    sed -n '/^speed:/,$p' "$L/bench.txt" | head -70
    tail -22 "$L/expandable.txt"
    tail -28 "$L/cudarc.txt" | grep -v '^json:'
    cat "$L/cudarc-configs.txt" ;;
  ab)
    N=dist/cuda/bin/cachalot; O=dist/old/cachalot
    T=${THREADS_LIST:-1,2,4,8,16}
    for r in 1 2; do
      for b in cuda mock; do
        echo "== new $b round $r" >>"$L/threads.txt"; $N threads --backend $b --threads $T >>"$L/threads.txt" 2>&1
        if [ -x $O ]; then echo "== old $b round $r" >>"$L/threads.txt"; $O threads --backend $b --threads $T >>"$L/threads.txt" 2>&1; fi
      done
    done
    echo "threads: after $(( $(date +%s) - S )) s"
    (cd dist/cuda && RESULTS=$L/results ROUNDS=1 WARMUP=0 MODES="default expandable" timeout ${T_BENCH:-240} ./bench.sh) >"$L/bench.txt" 2>&1
    echo "bench.sh: rc=$? after $(( $(date +%s) - S )) s"
    OUT=$L/new timeout ${T_EXP:-100} scripts/device/expandable_cuda.sh >"$L/expandable-new.txt" 2>&1
    echo "expandable new: rc=$? after $(( $(date +%s) - S )) s"
    if [ -x $O ]; then
      mkdir -p /tmp/oldd/bin && cp $O /tmp/oldd/bin/cachalot && ln -sfn "$PWD/dist/cuda/traces" /tmp/oldd/traces
      OUT=$L/old timeout ${T_EXP:-100} scripts/device/expandable_cuda.sh /tmp/oldd >"$L/expandable-old.txt" 2>&1
      echo "expandable old: rc=$? after $(( $(date +%s) - S )) s"
    fi
    OUT=$L/rust timeout ${T_RUST:-100} scripts/device/cudarc_example.sh --ways cudarc,cachalot,cachalot-expandable >"$L/cudarc.txt" 2>&1
    echo "cudarc_example.sh: rc=$? after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    sed -n '/^speed:/,$p' "$L/bench.txt" | head -60
    for f in new old; do echo "== expandable $f"; tail -20 "$L/expandable-$f.txt" 2>/dev/null | grep -E "^(trace|gpt2|resnet|side|churn|hit)"; done
    tail -14 "$L/cudarc.txt" | grep -v '^json:'
    grep -E "^==|mops" "$L/threads.txt" | sed -E 's/"ops":[0-9]+,//' ;;
  final)
    (cd dist/cuda && CACHALOT_SANITIZER=0 timeout ${T_TESTS:-200} ./run.sh) >"$L/run.txt" 2>&1
    echo "run.sh: rc=$? after $(( $(date +%s) - S )) s"
    cp -r dist/cuda/logs "$L/" 2>/dev/null
    (cd dist/cuda && RESULTS=$L/results ROUNDS=1 WARMUP=1 MODES="default expandable" timeout ${T_BENCH:-170} ./bench.sh) >"$L/bench.txt" 2>&1
    echo "bench.sh: rc=$? after $(( $(date +%s) - S )) s"
    OUT=$L/exp timeout ${T_EXP:-70} scripts/device/expandable_cuda.sh >"$L/expandable.txt" 2>&1
    echo "expandable_cuda.sh: rc=$? after $(( $(date +%s) - S )) s"
    for r in 1 2; do
      echo "== new round $r" >>"$L/threads.txt"; dist/cuda/bin/cachalot threads --backend cuda >>"$L/threads.txt" 2>&1
      if [ -x dist/old/cachalot ]; then echo "== old round $r" >>"$L/threads.txt"; dist/old/cachalot threads --backend cuda >>"$L/threads.txt" 2>&1; fi
    done
    OUT=$L/rust timeout ${T_RUST:-60} scripts/device/cudarc_example.sh --ways cudarc,cachalot,cachalot-expandable >"$L/cudarc.txt" 2>&1
    echo "cudarc_example.sh: rc=$? after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    grep -E "FAILED|panicked" "$L/run.txt" | head -20; tail -4 "$L/run.txt"
    sed -n '/^speed:/,$p' "$L/bench.txt" | head -40
    tail -20 "$L/expandable.txt" | grep -E "^(trace|gpt2|resnet|side|churn|hit)"
    grep -E "^==|mops" "$L/threads.txt" | sed -E 's/"ops":[0-9]+,//'
    tail -6 "$L/cudarc.txt" | grep -v '^json:' ;;
  clients)
    export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 CACHALOT_TORCH_CACHE=$L/shim-cache
    timeout ${T_CLIENTS:-330} python3 python/client_memory.py --lib dist/cuda/lib/libcachalot_capi.so \
      --workloads ${WORKLOADS:-bert,gpt2} --json "$L/clients.json" >"$L/clients.txt" 2>&1
    echo "client_memory.py: rc=$? after $(( $(date +%s) - S )) s"
    OUT=$L/exp timeout ${T_EXP:-100} scripts/device/expandable_cuda.sh >"$L/expandable.txt" 2>&1
    echo "expandable_cuda.sh: rc=$? after $(( $(date +%s) - S )) s"
    OUT=$L/rust timeout ${T_RUST:-100} scripts/device/cudarc_example.sh --ways cudarc,cachalot,cachalot-expandable >"$L/cudarc.txt" 2>&1
    echo "cudarc_example.sh: rc=$? after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    tail -14 "$L/clients.txt"
    tail -20 "$L/expandable.txt" | grep -E "^(trace|gpt2|resnet|side|churn|hit)"
    tail -14 "$L/cudarc.txt" | grep -v '^json:' ;;
  tests)
    (cd dist/cuda && CACHALOT_SANITIZER=${CACHALOT_SANITIZER:-0} timeout ${T_TESTS:-520} ./run.sh) >"$L/run.txt" 2>&1
    echo "run.sh: rc=$? after $(( $(date +%s) - S )) s"
    cp -r dist/cuda/logs "$L/" 2>/dev/null
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    grep -E "FAILED|panicked|failed" "$L/run.txt" | head -30
    tail -40 "$L/run.txt" ;;
  torch)
    CU=${CUDA_HOME:-/usr/local/cuda}
    g++ -O2 -std=c++17 bench/vmm/vmm_cost.cpp -I"$CU/include" -L"$CU/lib64/stubs" -lcuda -o /tmp/vmm_cost \
      && timeout 60 /tmp/vmm_cost >"$L/vmm_cost.txt" 2>&1; cat "$L/vmm_cost.txt"
    OUT=$L timeout ${T_TORCH:-540} python/run_gpu_suite.sh >"$L/suite.txt" 2>&1
    echo "run_gpu_suite.sh: rc=$? after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    tail -90 "$L/suite.txt" ;;
  train)
    # step time: alternating native / cachalot processes, PAIRS pairs, median and spread
    export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
    export CACHALOT_TORCH_CACHE=$L/shim-cache
    timeout ${T_TRAIN:-520} python3 python/train_compare.py --pairs ${PAIRS:-5} --steps ${STEPS:-10} \
      --models ${MODELS:-gpt2,resnet50} --lib dist/cuda/lib/libcachalot_capi.so --json "$L/train.json" >"$L/train.txt" 2>&1
    echo "train_compare.py: rc=$? after $(( $(date +%s) - S )) s"
    tar czf "$OUT/logs-$PART.tgz" -C /tmp "logs-$PART"
    tail -30 "$L/train.txt" ;;
esac
