#!/usr/bin/env bash
# The cachalot_torch wheel on a GPU machine, installed and used as a
# PyTorch user would, away from the repository:
#
#   scripts/device/wheel.sh [WHEEL]      (from the repository root)
#
# WHEEL: default, the one cachalot_torch-*.whl in carry/wheel/ (built
# elsewhere: pip wheel ./python -w carry/wheel/; docs/python-packaging.md).
# Needs python3 with a CUDA build of torch 2.11 ($PYTHON, else the first of
# python3, /opt/torch/.venv/bin/python3, python that imports torch), g++
# and the CUDA headers; no Rust, no network.
#
# 1. a fresh venv (python3 -m venv --system-site-packages: the machine's
#    torch; when python3 is itself a venv, a .pth file points the new one
#    at its site-packages) and `pip install --no-index --no-deps WHEEL`;
# 2. from a work folder outside the repository, with nothing of it on
#    sys.path: checks that cachalot_torch comes from the venv;
# 3. the one-liner: import cachalot_torch; install(); a CUDA tensor;
# 4. the drop-in suite (python/tests, copied to the work folder, so it
#    imports the installed package) against PyTorch's allocator and
#    against cachalot (placement:pytorch), and the values compared;
# 5. unchanged scripts through the launcher: train_compare.py --allocator
#    native (so the script itself never imports cachalot) for the graphed
#    MLP and GPT-2 (when transformers is installed), losses compared bit for
#    bit with a plain run; python/examples/train_tiny.py; a script's exit
#    status; and train_tiny.py under torchrun (python -m
#    torch.distributed.run, as the venv has no torchrun of its own) with
#    DDP over NCCL; python/examples/spawn_workers.py, whose workers are
#    torch.multiprocessing.spawn children: on cachalot under the launcher,
#    on PyTorch's allocator with --no-children, same results; train_tiny.py
#    --compile (inductor, whose compile workers are child processes that
#    import torch) under the launcher;
# 6. prints the table last; exit 0 when every row is ok. Every log ends in
#    $OUT/all.tgz (the shim cache left out).
#
# Logs under $OUT (a temp folder when unset). SUITE_ARGS: more pytest
# arguments for step 4 (e.g. -k "not slow").
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
OUT=${OUT:-$(mktemp -d /tmp/cachalot-wheel.XXXXXX)}
mkdir -p "$OUT"
echo "wheel check: logs in $OUT"

WHEEL=${1:-}
if [ -z "$WHEEL" ]; then
  shopt -s nullglob
  wheels=("$ROOT"/carry/wheel/cachalot_torch-*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -ne 1 ]; then
    echo "want exactly one carry/wheel/cachalot_torch-*.whl, found ${#wheels[@]} (or pass WHEEL)"
    exit 2
  fi
  WHEEL=${wheels[0]}
fi
WHEEL=$(readlink -f "$WHEEL")
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3 /opt/torch/.venv/bin/python3 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' 2>/dev/null; then PY=$c; break; fi
  done
fi
if [ -z "$PY" ]; then echo "no python with torch found (set PYTHON)"; exit 2; fi
echo "wheel: $WHEEL ($(du -h "$WHEEL" | cut -f1))"
echo "python: $("$PY" --version 2>&1), torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
echo "glibc: $(ldd --version 2>/dev/null | head -1)"
command -v nvidia-smi >/dev/null && nvidia-smi -L

declare -a rows=()
fails=0
row() { # name status detail
  rows+=("$(printf '%-44s %-6s %s' "$1" "$2" "$3")")
  [ "$2" = ok ] || fails=$((fails + 1))
  echo "== $1: $2 $3"
}

# ---- 1. the venv and the wheel
# --without-pip: Debian and Ubuntu ship ensurepip separately (python3-venv);
# pip comes from the site-packages the venv sees, or from $PY with --python.
VENV=${VENV:-/tmp/cachalot-wheel-venv}
rm -rf "$VENV"
sees="system site-packages"
if ! "$PY" -m venv --system-site-packages --without-pip "$VENV" >"$OUT/venv.log" 2>&1; then
  row "python3 -m venv --system-site-packages" FAIL "see venv.log"
  cat "$OUT/venv.log"
  printf '%s\n' "${rows[@]}"
  exit 1
fi
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  # $PY is itself a venv (torch in its site-packages, which a venv made
  # from it does not see): point the new venv at them with a .pth file
  vsite=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' >"$vsite/torch_env.pth"
  sees="$PY's site-packages (torch_env.pth)"
fi
if "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  PIP=("$VENV/bin/python" -m pip)
else
  PIP=("$PY" -m pip --python "$VENV/bin/python")
fi
if "$VENV/bin/python" -c 'import torch' >>"$OUT/venv.log" 2>&1 &&
  "${PIP[@]}" install --no-index --no-deps "$WHEEL" >"$OUT/pip.log" 2>&1; then
  row "venv + pip install --no-index --no-deps" ok "$(grep -m1 'Successfully installed' "$OUT/pip.log"); torch from $sees"
else
  row "venv + pip install --no-index --no-deps" FAIL "see venv.log, pip.log"
  cat "$OUT/venv.log" "$OUT/pip.log"
  printf '%s\n' "${rows[@]}"
  exit 1
fi
VPY=$VENV/bin/python

# ---- 2. away from the repository
WORK=$(mktemp -d /tmp/cachalot-wheel-work.XXXXXX)
cp -r "$ROOT/python/tests" "$WORK/tests"
cp "$ROOT/python/train_compare.py" "$ROOT/python/examples/train_tiny.py" \
  "$ROOT/python/examples/spawn_workers.py" "$WORK/"
printf 'import sys, torch\nx = torch.ones(1, device="cuda")\nsys.exit(3)\n' >"$WORK/exit3.py"
cd "$WORK" || exit 2
unset PYTHONPATH CACHALOT_CAPI_LIB CACHALOT_INCLUDE CACHALOT_ALLOC_CONF CACHALOT_TORCH_MODE
export CACHALOT_TORCH_CACHE=$OUT/shim-cache PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8

if "$VPY" - "$ROOT" "$VENV" >"$OUT/where.log" 2>&1 <<'EOF'
import os, sys
root, venv = (os.path.realpath(p) for p in sys.argv[1:3])
import cachalot_torch
pkg = os.path.realpath(os.path.dirname(cachalot_torch.__file__))
lib = cachalot_torch.find_library()
print("package", pkg)
print("library", lib)
print("header", cachalot_torch._build.find_header())
assert pkg.startswith(venv + os.sep), f"{pkg} is not in the venv {venv}"
assert lib == os.path.join(pkg, "lib", "libcachalot_capi.so"), lib
inside = lambda p: p == root or p.startswith(root + os.sep)
assert not inside(pkg) and not inside(os.path.realpath(lib)), (pkg, lib)
assert not any(inside(os.path.realpath(p or ".")) for p in sys.path), sys.path
EOF
then
  row "imported from the venv, repo not on sys.path" ok "$(grep '^package' "$OUT/where.log" | cut -d' ' -f2-)"
else
  row "imported from the venv, repo not on sys.path" FAIL "$(tail -1 "$OUT/where.log")"
fi

# ---- 3. the one-liner (first install(): builds the shim)
t0=$(date +%s)
if timeout 300 "$VPY" -c "import cachalot_torch; cachalot_torch.install(); import torch; torch.ones(1, device='cuda'); \
assert torch.cuda.memory.get_allocator_backend() == 'cachalot'; print('backend', torch.cuda.memory.get_allocator_backend(), 'reserved', torch.cuda.memory_reserved())" \
  >"$OUT/oneliner.log" 2>&1; then
  row "install(); torch.ones(1, device='cuda')" ok "$(tail -1 "$OUT/oneliner.log") (first call $(($(date +%s) - t0)) s, shim built)"
else
  row "install(); torch.ones(1, device='cuda')" FAIL "$(tail -1 "$OUT/oneliner.log")"
fi

# ---- 4. the drop-in suite from the installed package
if "$VPY" -c 'import pytest' 2>/dev/null; then RUNNER=pytest; else RUNNER=minirun; fi
for a in native cachalot; do
  conf=""
  [ "$a" = cachalot ] && conf="placement:pytorch"
  rm -f "$OUT/results-$a.json" "$OUT/where-$a.txt"
  export CACHALOT_ALLOC_CONF=$conf CACHALOT_TEST_JSON=$OUT/tests-$a.json \
    CACHALOT_TEST_RESULTS=$OUT/results-$a.json CACHALOT_TEST_WHERE=$OUT/where-$a.txt
  if [ $RUNNER = pytest ]; then
    # shellcheck disable=SC2086
    timeout 300 "$VPY" -m pytest tests -q -rfE -p no:cacheprovider --allocator $a ${SUITE_ARGS:-} >"$OUT/tests-$a.log" 2>&1
  else
    timeout 300 "$VPY" tests/minirun.py --allocator $a >"$OUT/tests-$a.log" 2>&1
  fi
  rc=$?
  counts=$("$VPY" -c "
import json, sys
rs = json.load(open(sys.argv[1]))
c = {s: sum(r['status'] == s for r in rs) for s in ('passed', 'failed', 'skipped')}
print(c['passed'], c['failed'], c['skipped'])" "$OUT/tests-$a.json" 2>/dev/null || echo "0 0 0")
  read -r p f s <<<"$counts"
  unset CACHALOT_ALLOC_CONF CACHALOT_TEST_JSON CACHALOT_TEST_RESULTS CACHALOT_TEST_WHERE
  where=$(grep -o 'allocator: cachalot (package [^,]*' "$OUT/where-$a.txt" 2>/dev/null | sed 's/.*package //')
  detail="$RUNNER: $p passed, $f failed, $s skipped${where:+; package $where}"
  if [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] && [ "$p" -gt 0 ] &&
    { [ "$a" = native ] || [[ $where == "$VENV"* ]]; }; then
    row "drop-in suite: $a" ok "$detail"
  else
    row "drop-in suite: $a" FAIL "exit $rc, $detail"
    grep -E '^(FAILED|ERROR)' "$OUT/tests-$a.log" | cut -c1-300
    tail -3 "$OUT/tests-$a.log"
  fi
done
if same=$("$VPY" -c "
import json, os, sys
if not all(os.path.isfile(p) for p in sys.argv[1:3]):
    print('no values recorded (a run crashed?)'); sys.exit(1)
n, c = (json.load(open(p)) for p in sys.argv[1:3])
diff = sorted(k for k in set(n) | set(c) if n.get(k) != c.get(k))
print(f'{len(n)} values, differing: {diff}' if diff else f'{len(n)} values identical')
sys.exit(1 if diff or not n else 0)" "$OUT/results-native.json" "$OUT/results-cachalot.json" 2>&1); then
  row "drop-in suite: values native vs cachalot" ok "$same"
else
  row "drop-in suite: values native vs cachalot" FAIL "$same"
fi

# ---- 5. unchanged scripts through the launcher
result() { grep '^RESULT ' "$1" | tail -1 | cut -d' ' -f2-; }
compare() { # name native.log cachalot.log strict
  "$VPY" - "$2" "$3" "$4" <<'EOF'
import json, sys
def res(p):
    lines = [l for l in open(p) if l.startswith("RESULT ")]
    return json.loads(lines[-1][7:]) if lines else None
n, c, strict = res(sys.argv[1]), res(sys.argv[2]), sys.argv[3] == "1"
if not n or not c:
    print("no RESULT line"); sys.exit(1)
same = n["losses"] == c["losses"]
msg = (f"backend {n['backend']} -> {c['backend']}; {len(c['losses'])} losses "
       f"{'identical' if same else 'DIFFER'}; peak reserved {n['peak_reserved'] >> 20} -> {c['peak_reserved'] >> 20} MiB")
print(msg)
ok = n["backend"] == "native" and c["backend"] == "cachalot" and (same or not strict)
sys.exit(0 if ok else 1)
EOF
}
judge() { # name label rc: the launcher's run ($OUT/name-launcher.log, exit rc) against the native one
  local detail
  if detail=$(compare "$1" "$OUT/$1-native.log" "$OUT/$1-launcher.log" 0) && [ "$3" -eq 0 ]; then
    row "$2" ok "$detail"
  else
    row "$2" FAIL "exit $3; $detail"
    tail -15 "$OUT/$1-launcher.log"
  fi
}
models=(graphed)
"$VPY" -c 'import transformers' 2>/dev/null && models+=(gpt2)
for m in "${models[@]}"; do
  timeout 300 "$VPY" train_compare.py --run "$m" --allocator native --steps 3 >"$OUT/train-$m-native.log" 2>&1
  timeout 300 "$VPY" -m cachalot_torch run train_compare.py --run "$m" --allocator native --steps 3 \
    >"$OUT/train-$m-launcher.log" 2>&1
  rc=$?
  if detail=$(compare "$m" "$OUT/train-$m-native.log" "$OUT/train-$m-launcher.log" 1) && [ $rc -eq 0 ]; then
    row "run train_compare.py --run $m" ok "$detail"
  else
    row "run train_compare.py --run $m" FAIL "exit $rc; $detail"
    tail -5 "$OUT/train-$m-launcher.log"
  fi
done

timeout 300 "$VPY" train_tiny.py --steps 30 >"$OUT/tiny-native.log" 2>&1
timeout 300 "$VPY" -m cachalot_torch run --config expandable_segments:True train_tiny.py --steps 30 >"$OUT/tiny-launcher.log" 2>&1
judge tiny "run --config ... train_tiny.py" $?

timeout 120 "$VPY" -m cachalot_torch run exit3.py >"$OUT/exit3.log" 2>&1
rc=$?
if [ $rc -eq 3 ]; then row "run exit3.py: exit status" ok "3"; else row "run exit3.py: exit status" FAIL "$rc (want 3)"; fi

timeout 300 "$VPY" -m torch.distributed.run --nproc_per_node 1 train_tiny.py --steps 30 >"$OUT/ddp-native.log" 2>&1
timeout 300 "$VPY" -m torch.distributed.run --nproc_per_node 1 -m cachalot_torch run train_tiny.py --steps 30 \
  >"$OUT/ddp-launcher.log" 2>&1
rc=$?
if detail=$(compare ddp "$OUT/ddp-native.log" "$OUT/ddp-launcher.log" 0) && [ $rc -eq 0 ] &&
  grep -q '"world_size": 1' "$OUT/ddp-launcher.log"; then
  row "torchrun -m cachalot_torch run (DDP, NCCL)" ok "$detail"
else
  row "torchrun -m cachalot_torch run (DDP, NCCL)" FAIL "exit $rc; $detail"
  tail -15 "$OUT/ddp-launcher.log"
fi

timeout 300 "$VPY" train_tiny.py --steps 10 --compile >"$OUT/compile-native.log" 2>&1
timeout 300 "$VPY" -m cachalot_torch run train_tiny.py --steps 10 --compile >"$OUT/compile-launcher.log" 2>&1
judge compile "run train_tiny.py --compile (inductor)" $?

spawned() { # log: the workers' backends, or nothing
  grep '^RESULT ' "$1" | tail -1 | cut -d' ' -f2- |
    "$VPY" -c 'import json, sys; r = json.load(sys.stdin); print(",".join(w["backend"] for w in r["workers"]), *sorted({w["sum"] for w in r["workers"]}))' 2>/dev/null
}
timeout 300 "$VPY" spawn_workers.py >"$OUT/spawn-native.log" 2>&1
timeout 300 "$VPY" -m cachalot_torch run spawn_workers.py >"$OUT/spawn-launcher.log" 2>&1
rc=$?
timeout 300 "$VPY" -m cachalot_torch run --no-children spawn_workers.py >"$OUT/spawn-no-children.log" 2>&1
rc2=$?
n=$(spawned "$OUT/spawn-native.log"); c=$(spawned "$OUT/spawn-launcher.log"); nc=$(spawned "$OUT/spawn-no-children.log")
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ "${c%% *}" = "cachalot,cachalot" ] && [ "${nc%% *}" = "native,native" ] &&
  [ "${n#* }" = "${c#* }" ] && [ -n "$n" ]; then
  row "run spawn_workers.py (mp.spawn children)" ok "workers $c; --no-children $nc"
else
  row "run spawn_workers.py (mp.spawn children)" FAIL "exit $rc/$rc2; native [$n] launcher [$c] --no-children [$nc]"
  tail -15 "$OUT/spawn-launcher.log"
fi

cd "$ROOT" || true
rm -rf "$WORK"
echo
echo "================ cachalot_torch wheel: results ================"
printf '%-44s %-6s %s\n' check status detail
printf '%s\n' "${rows[@]}"
if [ "$fails" -eq 0 ]; then echo "WHEEL OK"; else echo "WHEEL: $fails check(s) failed"; fi
# what comes back from a GPU call is a few files: every log in one archive
# (the shim cache left out)
(cd "$OUT" && ls -A | grep -v -x -e all.tgz -e shim-cache | tar czf all.tgz --remove-files -T - 2>/dev/null; true)
[ "$fails" -eq 0 ]
