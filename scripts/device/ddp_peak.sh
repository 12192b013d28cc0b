#!/usr/bin/env bash
# Peak memory of python/examples/train_tiny.py, plain and under torchrun
# with DDP (one rank, NCCL), on native PyTorch (default and expandable
# segments) and through the drop-in in three configurations (default,
# placement:pytorch, expandable_segments:False): peak reserved, peak
# allocated and the segments held at the end. From the repository root on
# the GPU machine:
#
#   scripts/device/ddp_peak.sh
#
# env: LIB    the C library (default carry/libcachalot_capi.so, else
#             dist/cuda/lib/libcachalot_capi.so)
#      STEPS  training steps (default 30)
#      OUT    logs (default /tmp/out): one log per run, ddp.txt (the table)
# Measured on the H200: about 110 s for the ten runs.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIB=${LIB:-carry/libcachalot_capi.so}
[ -f "$LIB" ] || LIB=dist/cuda/lib/libcachalot_capi.so
[ -f "$LIB" ] || { echo "ddp_peak.sh: no libcachalot_capi.so (carry/ or dist/cuda/lib/)"; exit 2; }
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3 /opt/torch/.venv/bin/python3 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' 2>/dev/null; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "ddp_peak.sh: no python with torch (set PYTHON)"; exit 2; }
export CACHALOT_CAPI_LIB=$(realpath "$LIB") PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
export CACHALOT_TORCH_CACHE=${CACHALOT_TORCH_CACHE:-$PWD/dist/shim-cache}
(cd python && "$PY" -m cachalot_torch) >"$OUT/build.log" 2>&1 || { echo "ddp_peak.sh: the shim failed to build ($OUT/build.log)"; exit 2; }
T=python/examples/train_tiny.py
S=$(date +%s)
res() { # log: one line of figures, or the log's tail
  grep '^RESULT ' "$1" | tail -1 | cut -d' ' -f2- | "$PY" -c 'import json, sys
r = json.load(sys.stdin)
segs = [(s[0] >> 20, s[1] >> 20, s[2]) for s in r["segments"]][:8]
print(r["backend"], "reserved", r["peak_reserved"] >> 20, "MiB allocated", r["peak_allocated"] >> 20,
      "MiB; segments at the end (MiB, allocated MiB, stream):", segs)' 2>/dev/null || echo "FAILED: $(tail -3 "$1" | tr '\n' ' ')"
}
: >"$OUT/ddp.txt"
for ddp in 0 1; do
  L=("$PY"); [ $ddp = 1 ] && L=("$PY" -m torch.distributed.run --nproc_per_node 1)
  timeout 150 "${L[@]}" $T --steps "${STEPS:-30}" --segments >"$OUT/native-$ddp.log" 2>&1
  echo "ddp=$ddp native: $(res "$OUT/native-$ddp.log")" | tee -a "$OUT/ddp.txt"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 "${L[@]}" $T --steps "${STEPS:-30}" --segments \
    >"$OUT/native-expandable-$ddp.log" 2>&1
  echo "ddp=$ddp native expandable: $(res "$OUT/native-expandable-$ddp.log")" | tee -a "$OUT/ddp.txt"
  for cfg in default placement:pytorch expandable_segments:False; do
    c=(); [ "$cfg" != default ] && c=(--config "$cfg")
    log="$OUT/cachalot-${cfg%%:*}-$ddp.log"
    timeout 150 "${L[@]}" -m cachalot_torch run "${c[@]}" $T --steps "${STEPS:-30}" --segments >"$log" 2>&1
    echo "ddp=$ddp cachalot $cfg: $(res "$log")" | tee -a "$OUT/ddp.txt"
  done
done
echo "ddp_peak.sh: $(( $(date +%s) - S )) s"
