#!/usr/bin/env bash
# The PyTorch drop-in on a GPU machine, from the repository root:
#
#   python/run_gpu_suite.sh
#
# Needs: torch (2.11 tested), g++, and the C ABI library built elsewhere and
# carried in dist/: dist/cuda/lib/libcachalot_capi.so (`cargo xtask
# test-cuda` packs it; or set CACHALOT_CAPI_LIB). No Rust, no network.
#
# 1. builds the C++ shim against the installed torch (fresh cache under $OUT)
# 2. runs python/tests against the native allocator and against cachalot
#    (CACHALOT_ALLOC_CONF=placement:pytorch), each in its own process
#    (pytest when installed, else python/tests/minirun.py)
# 3. the host-cost microbenchmark (native / shim / pluggable, alternating)
# 4. a short train_compare.py (GPT-2, ResNet-50, a CUDA-graphed MLP; 3 steps)
# 5. prints the result table last. Logs and JSON under $OUT (a temp folder
#    when unset). Exit 0 when everything passed.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$(mktemp -d /tmp/cachalot-suite.XXXXXX)}
mkdir -p "$OUT"
echo "cachalot suite: logs in $OUT"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3 /opt/torch/.venv/bin/python3 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' 2>/dev/null; then PY=$c; break; fi
  done
fi
if [ -z "$PY" ]; then echo "no python with torch found (set PYTHON)"; exit 2; fi
export CACHALOT_CAPI_LIB=${CACHALOT_CAPI_LIB:-$ROOT/dist/cuda/lib/libcachalot_capi.so}
if [ ! -f "$CACHALOT_CAPI_LIB" ]; then echo "missing $CACHALOT_CAPI_LIB (cargo xtask test-cuda packs it)"; exit 2; fi
export CACHALOT_TORCH_CACHE=$OUT/shim-cache
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

# 1. the shim
t0=$(date +%s%N)
if (cd python && "$PY" -m cachalot_torch build) >"$OUT/build.log" 2>&1; then
  t1=$(date +%s%N)
  printf 'built in %d ms with %s (torch %s): %s\n' "$(( (t1 - t0) / 1000000 ))" \
    "$(${CXX:-g++} --version | head -1)" "$("$PY" -c 'import torch;print(torch.__version__)')" \
    "$(tail -1 "$OUT/build.log")" >"$OUT/build.txt"
else
  echo "FAILED (see build.log)" >"$OUT/build.txt"
  cat "$OUT/build.log"
fi
cat "$OUT/build.txt"

# 2. the conformance suite, once per allocator
if "$PY" -c 'import pytest' 2>/dev/null; then RUNNER=pytest; else RUNNER=minirun; fi
for a in native cachalot; do
  echo "== tests: $a ($RUNNER)"
  rm -f "$OUT/results-$a.json"
  conf=""
  [ "$a" = cachalot ] && conf="placement:pytorch"
  if [ $RUNNER = pytest ]; then
    CACHALOT_ALLOC_CONF=$conf CACHALOT_TEST_JSON=$OUT/tests-$a.json CACHALOT_TEST_RESULTS=$OUT/results-$a.json \
      timeout 200 "$PY" -m pytest python/tests -q -p no:cacheprovider --allocator $a \
      >"$OUT/tests-$a.log" 2>&1
  else
    CACHALOT_ALLOC_CONF=$conf CACHALOT_TEST_JSON=$OUT/tests-$a.json CACHALOT_TEST_RESULTS=$OUT/results-$a.json \
      timeout 200 "$PY" python/tests/minirun.py --allocator $a >"$OUT/tests-$a.log" 2>&1
  fi
  echo "   exit $?: $(tail -1 "$OUT/tests-$a.log")"
done

# 3. host cost
echo "== host-cost microbenchmark"
timeout 150 "$PY" python/bench_host.py --reps 5 --iters 10000 --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
echo "   exit $?"

# 4. training
echo "== train_compare (3 steps)"
# (step time is not judged on 3 steps: --max-ratio 1.5 only catches gross
# regressions; `train_compare.py --pairs 5 --steps 12` is the timing run)
CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 210 "$PY" python/train_compare.py --steps 3 --max-ratio 1.5 \
  --models gpt2,resnet50,graphed --lib "$CACHALOT_CAPI_LIB" --json "$OUT/train.json" >"$OUT/train.log" 2>&1
echo "   exit $?"

# 5. the table
"$PY" python/tests/summarize.py "$OUT"
