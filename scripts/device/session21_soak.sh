#!/usr/bin/env bash
# A longer run of the real clients (session 21): python/client_memory.py
# with REQUESTS BERT requests (default 2000) and STEPS GPT-2 training
# steps (default 20), each on native, native expandable, cachalot's default
# and cachalot's fixed segments; peak reserved after 60, 250, 1,000 and
# REQUESTS requests, and what empty_cache leaves at the end. From the
# repository root on the GPU machine, after `cargo xtask bench-cuda`
# packed dist/cuda here. WORKLOADS (default "bert gpt2"), WAYS (default all
# four, comma-separated) and BERT_LIMIT (seconds, default 380) narrow it:
#   WORKLOADS=bert WAYS=native-expandable,cachalot REQUESTS=5000 BERT_LIMIT=560
# Logs in $OUT.
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
