#!/usr/bin/env bash
# The PyTorch drop-in on the GPU machine, from the repository root: the
# shim built against the machine's torch, the repository's suite
# (python/tests) against native PyTorch and cachalot in one run,
# PyTorch's own allocator tests when present: dist/pt_tests/ with
# PyTorch's test/test_cuda.py and the runner run_with_allocator.py (one
# test per process, either allocator, JSON results), and the host cost per
# allocation.
#
# Before (on the build machine, no GPU needed):
#   cargo build --release -p cachalot-capi
#   mkdir -p carry && cp target/release/libcachalot_capi.so carry/ && strip --strip-debug carry/libcachalot_capi.so
# and carry `carry` (and `dist/pt_tests` for part pt) with the device call.
#
# Parameters (environment):
#   PARTS     what to run, in order (default "suite pt"; add host for the host cost):
#               suite  python/tests once per allocator (cachalot in each of CONFIGS)
#               pt     PyTorch's tests from dist/pt_tests/ (native, then cachalot in each of CONFIGS)
#               host   python/bench_host.py: host ns per torch.empty + del, native
#                      and cachalot, history off and with stacks="python" (HOST_MODES)
#   CONFIGS   cachalot configurations, space-separated; "default" = none
#             (default "default placement:pytorch")
#   LIB       libcachalot_capi.so (default carry/libcachalot_capi.so)
#   TESTS     -k for the suite (default: all): a pytest expression, e.g.
#             "cudagraph_trees or ipc"; a substring when pytest is missing
#   SUITE_TIMEOUT  seconds per suite run (default 400)
#   PT_K      space-separated filters for PyTorch's tests, any matching
#             (e.g. "TestCudaMallocAsync TestFXMemoryProfiler"; default: all 80)
#   PT_GPUS   --gpus of the runner (default 0,0,0,0: four at a time on one GPU)
#   PT_TOGETHER=1  native and every configuration of part pt at once (each
#             with PT_GPUS: 0,0,0,0 and two configurations are twelve tests
#             at a time), instead of one after the other (on the H200 one
#             run of 80 at eight at a time takes about 190 s)
#   HOST_MODES, HOST_REPS, HOST_ITERS   bench_host.py's --modes, --reps, --iters
#             (default native,shim,native:python,shim:python; 5; 10000)
#   OUT       logs and JSON (a temp folder when unset)
# Prints one table last (also $OUT/table.txt; every log in $OUT/all.tgz):
# per part and allocator, passed / failed / errors / skipped, every test
# whose outcome differs from native's, the suite's recorded values compared
# across allocators, and the host-cost table.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$(mktemp -d /tmp/dropin.XXXXXX)}
mkdir -p "$OUT"
PARTS=${PARTS:-suite pt}
CONFIGS=${CONFIGS:-default placement:pytorch}
LIB=${LIB:-$ROOT/carry/libcachalot_capi.so}
PT_GPUS=${PT_GPUS:-0,0,0,0}
S=$(date +%s)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3 /opt/torch/.venv/bin/python3 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' 2>/dev/null; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "no python with torch (set PYTHON)"; exit 2; }
[ -f "$LIB" ] || { echo "missing $LIB (see the header of $0)"; exit 2; }
export CACHALOT_CAPI_LIB=$LIB
# (kept between calls on a warm machine: dist/ is ignored)
export CACHALOT_TORCH_CACHE=${CACHALOT_TORCH_CACHE:-$ROOT/dist/shim-cache}
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
echo "torch $("$PY" -c 'import torch;print(torch.__version__)'), logs in $OUT"

# the shim, built once (each test process finds it in the cache)
if (cd python && "$PY" -m cachalot_torch) >"$OUT/build.log" 2>&1; then
  echo "shim: $(tail -1 "$OUT/build.log")"
else
  echo "shim build FAILED:"; tail -30 "$OUT/build.log"; exit 1
fi

conf_of() { [ "$1" = default ] && echo "" || echo "$1"; }
name_of() { [ "$1" = default ] && echo cachalot || echo "cachalot-${1//[^A-Za-z0-9]/_}"; }

for part in $PARTS; do
  case $part in
  suite)
    if "$PY" -c 'import pytest' 2>/dev/null; then RUNNER=pytest; else RUNNER=minirun; fi
    runs="native"
    for c in $CONFIGS; do runs="$runs $c"; done
    for r in $runs; do
      if [ "$r" = native ]; then a=native; n=native; conf=""; else a=cachalot; n=$(name_of "$r"); conf=$(conf_of "$r"); fi
      echo "== suite: $n ($RUNNER) $(( $(date +%s) - S )) s"
      rm -f "$OUT/suite-results-$n.json"
      k=()
      [ -n "${TESTS:-}" ] && k=(-k "$TESTS")
      if [ $RUNNER = pytest ]; then
        CACHALOT_ALLOC_CONF=$conf CACHALOT_TEST_JSON=$OUT/suite-$n.json CACHALOT_TEST_RESULTS=$OUT/suite-results-$n.json \
          timeout ${SUITE_TIMEOUT:-400} "$PY" -m pytest python/tests -q -p no:cacheprovider --allocator $a "${k[@]}" \
          >"$OUT/suite-$n.log" 2>&1
      else
        CACHALOT_ALLOC_CONF=$conf CACHALOT_TEST_JSON=$OUT/suite-$n.json CACHALOT_TEST_RESULTS=$OUT/suite-results-$n.json \
          timeout ${SUITE_TIMEOUT:-400} "$PY" python/tests/minirun.py --allocator $a "${k[@]}" --json "$OUT/suite-$n.json" \
          >"$OUT/suite-$n.log" 2>&1
      fi
      echo "   exit $?: $(tail -1 "$OUT/suite-$n.log")"
    done
    ;;
  pt)
    if [ ! -f dist/pt_tests/test_cuda.py ]; then
      echo "== pt: dist/pt_tests/test_cuda.py missing (carry dist/pt_tests): skipped"
      continue
    fi
    k=()
    for f in ${PT_K:-}; do k+=(-k "$f"); done
    runs="native"
    for c in $CONFIGS; do runs="$runs $c"; done
    pt_run() {
      local r=$1 n conf cargs
      if [ "$r" = native ]; then
        n=native
        (cd dist/pt_tests && timeout 290 "$PY" run_with_allocator.py --alloc native --gpus "$PT_GPUS" \
          --timeout 240 --log-dir "$OUT/pt-logs" --results "$OUT/pt-native.json" "${k[@]}") >"$OUT/pt-native.log" 2>&1
      else
        n=$(name_of "$r"); conf=$(conf_of "$r")
        cargs=()
        [ -n "$conf" ] && cargs=(--config "$conf")
        (cd dist/pt_tests && timeout 290 "$PY" run_with_allocator.py --alloc cachalot --py "$ROOT/python" \
          --lib "$LIB" "${cargs[@]}" --gpus "$PT_GPUS" --timeout 240 --log-dir "$OUT/pt-logs-$n" \
          --results "$OUT/pt-$n.json" "${k[@]}") >"$OUT/pt-$n.log" 2>&1
      fi
      echo "   pt $r: exit $?: $(grep -E 'passed|failed' "$OUT/pt-$n.log" | tail -1)"
    }
    if [ "${PT_TOGETHER:-0}" = 1 ]; then
      echo "== pt: $runs, together, $(( $(date +%s) - S )) s"
      for r in $runs; do pt_run "$r" & done
      wait
    else
      for r in $runs; do
        echo "== pt: $r $(( $(date +%s) - S )) s"
        pt_run "$r"
      done
    fi
    ;;
  host)
    echo "== host: $(( $(date +%s) - S )) s"
    timeout 280 "$PY" python/bench_host.py --modes "${HOST_MODES:-native,shim,native:python,shim:python}" \
      --reps "${HOST_REPS:-5}" --iters "${HOST_ITERS:-10000}" --json "$OUT/host.json" >"$OUT/host.log" 2>&1
    echo "   exit $?"
    ;;
  *) echo "unknown part $part" ;;
  esac
done
"$PY" - "$OUT" <<'P' | tee "$OUT/table.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(p):
    try:
        return json.loads(p.read_text())
    except Exception:
        return None
print("\n================ drop-in: results ================")
for part, pat in (("suite", "suite-*.json"), ("pt", "pt-*.json")):
    files = sorted(p for p in out.glob(pat) if "results" not in p.name)
    if not files:
        continue
    runs = {}
    for f in files:
        d = load(f)
        if d is None:
            continue
        rows = d if isinstance(d, list) else d.get("results", d.get("tests", []))
        if isinstance(rows, dict):
            rows = [{"test": k, "status": v if isinstance(v, str) else v.get("status")} for k, v in rows.items()]
        name = f.stem.split("-", 1)[1]
        runs[name] = {r.get("test") or r.get("id"): (r.get("status") or r.get("outcome") or "?") for r in rows}
    print(f"\n{part}: | run | passed | failed | errors | skipped |")
    for name, res in runs.items():
        vals = list(res.values())
        c = lambda *ks: sum(v in ks for v in vals)
        print(f"{part}: | {name} | {c('passed', 'pass', 'ok')} | {c('failed', 'fail')} | {c('error')} | {c('skipped', 'skip')} |")
    base = runs.get("native", {})
    for name, res in runs.items():
        if name == "native":
            continue
        diff = sorted(t for t in set(base) | set(res) if base.get(t) != res.get(t))
        for t in diff:
            print(f"{part}: differs {name}: {t}: native {base.get(t, '-')}, {name} {res.get(t, '-')}")
vals = {}
for f in sorted(out.glob("suite-results-*.json")):
    vals[f.stem.removeprefix("suite-results-")] = load(f) or {}
if vals:
    keys = sorted(set().union(*vals.values()))
    print("\nsuite values (compared across allocators):")
    for k in keys:
        seen = {n: v.get(k) for n, v in vals.items()}
        same = len({json.dumps(x, sort_keys=True) for x in seen.values()}) == 1
        print(f"  {k}: {'same' if same else 'DIFFERENT ' + json.dumps(seen)[:200]}")
host = out / "host.log"
if host.is_file():
    print("\nhost cost (ns per torch.empty + del; each mode against native with the same history setting):")
    for line in host.read_text().splitlines():
        if line.startswith("|") or "history recorded" in line or "taken apart" in line:
            print(line)
P
# what comes back is at most 8 files: the table, and everything else in one archive
(cd "$OUT" && ls -A | grep -v -x -e table.txt -e all.tgz | tar czf all.tgz --remove-files -T - 2>/dev/null; true)
echo "dropin.sh: $(( $(date +%s) - S )) s (logs: all.tgz)"
