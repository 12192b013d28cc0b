#!/usr/bin/env bash
# Step time of real PyTorch clients with random shapes (issue 39, item 3):
# python/client_speed.py runs BERT inference, GPT-2 generation and a
# Llama-style training loop on PyTorch's default and expandable modes and
# cachalot's default and fixed segments, one process per run, alternating,
# and prints the median step per allocator with its spread, the peaks and
# the checks. From the repository root on the GPU machine:
#
#   scripts/device/clients.sh
#   WORKLOADS=generate,train REPS=3 LIMIT=560 scripts/device/clients.sh
#
# env: LIB        the C library (default carry/libcachalot_capi.so, else
#                 dist/cuda/lib/libcachalot_capi.so)
#      WORKLOADS  comma-separated (default bert,generate,train)
#      REPS       processes per allocator and workload (default 2)
#      LIMIT      seconds for the whole run (default 540); the JSON is written
#                 after every process, so a run cut short still prints the
#                 table of what it measured
#      OUT        logs (default /tmp/out): client-speed.json, client-speed.txt
# Measured on the H200: BERT about 75 s per repetition of the four
# allocators, GPT-2 generation about 100 s.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIB=${LIB:-carry/libcachalot_capi.so}
[ -f "$LIB" ] || LIB=dist/cuda/lib/libcachalot_capi.so
[ -f "$LIB" ] || { echo "clients.sh: no libcachalot_capi.so (carry/ or dist/cuda/lib/)"; exit 2; }
LIB=$(realpath "$LIB")
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3 /opt/torch/.venv/bin/python3 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch, transformers' 2>/dev/null; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "clients.sh: no python with torch and transformers (set PYTHON)"; exit 2; }
export PYTHONPATH=$PWD/python CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
export CACHALOT_TORCH_CACHE=${CACHALOT_TORCH_CACHE:-$PWD/dist/shim-cache}
S=$(date +%s)
J=$OUT/client-speed.json
timeout "${LIMIT:-540}" "$PY" python/client_speed.py --lib "$LIB" --workloads "${WORKLOADS:-bert,generate,train}" \
  --reps "${REPS:-2}" --json "$J" >"$OUT/client-speed.txt" 2>&1
rc=$?
echo "client_speed: exit $rc after $(( $(date +%s) - S )) s"
grep '^client_speed:' "$OUT/client-speed.txt"
[ -s "$J" ] && "$PY" python/client_speed.py --summarize "$J" | tee "$OUT/client-speed-table.txt"
