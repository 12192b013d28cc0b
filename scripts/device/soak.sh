#!/usr/bin/env bash
# Real PyTorch clients through the drop-in, run long: python/client_memory.py
# with REQUESTS BERT-base inference requests of random shapes (default
# 2000) and STEPS GPT-2 small training steps (default 20), each on native
# PyTorch, native expandable segments, cachalot's default and cachalot's
# fixed segments, each in its own process; outputs compared bit for bit
# with native's, peak reserved after 60, 250, 1,000 and REQUESTS requests,
# and what empty_cache leaves at the end. From the repository root on the
# GPU machine, after `cargo xtask bench-cuda` packed dist/cuda here.
#
#   REQUESTS=1500 STEPS=15 scripts/device/soak.sh
#   WORKLOADS=bert WAYS=native-expandable,cachalot REQUESTS=5000 BERT_LIMIT=560 scripts/device/soak.sh
#
# env: WORKLOADS (default "bert gpt2"), WAYS (default all four,
#      comma-separated), BERT_LIMIT (seconds, default 380), OUT (logs,
#      default /tmp/out). Prints each workload's tables.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$(date +%s)
export PYTHONPATH=$PWD/python CUBLAS_WORKSPACE_CONFIG=:4096:8
for w in ${WORKLOADS:-bert gpt2}; do
  timeout $([ $w = bert ] && echo ${BERT_LIMIT:-380} || echo 200) python3 python/client_memory.py --lib dist/cuda/lib/libcachalot_capi.so --workloads $w \
    --ways "${WAYS:-native,native-expandable,cachalot,cachalot-fixed}" --requests "${REQUESTS:-2000}" --steps "${STEPS:-20}" --json "$OUT/client-$w.json" >"$OUT/client-$w.txt" 2>&1
  echo "$w: rc=$? after $(( $(date +%s) - S )) s"
  cat "$OUT/client-$w.txt"
done
