#!/usr/bin/env bash
# Runs the cudarc interop on the GPU machine, from the repository root,
# after `cargo xtask test-cuda` packed dist/cuda (no Rust needed here):
#
#   1. the interop tests of the CUDA backend (dist/cuda/tests/cachalot-cuda-interop*)
#      and the example's tests (dist/cuda/cudarc/tests/*), with
#      CACHALOT_REQUIRE_GPU=1 (a test that would skip fails);
#   2. the workload, dist/cuda/cudarc/bin/mlp-train: an MLP trained three
#      ways (cudarc's cuMemAllocAsync, plain cuMemAlloc/cuMemFree, cachalot);
#      it exits 1 when the three ways' losses are not bit-identical.
#
# cudarc is built with the CUDA 12.8 bindings, whose loader tries
# libcublas.so, libcublas.so.12, .11, ... and libnvrtc.so, libnvrtc.so.12,
# ... but never the CUDA 13 names (libcublas.so.13, libnvrtc.so.13). So this
# script finds the CUDA 13 libraries (ldconfig, the toolkit, the pip
# `nvidia` packages of PyTorch), links them under the unversioned names in
# a temporary folder and puts it first on LD_LIBRARY_PATH (with the
# libraries' own folders, for libcublasLt and libnvrtc-builtins).
#
#   scripts/device/cudarc_example.sh [mlp-train args...]   e.g. --steps 60
#   RUNS=3 OLD_MLP=dist/exp/old/mlp-train scripts/device/cudarc_example.sh \
#     --ways cudarc,cudarc-retain,cachalot,cachalot-expandable
#
# env: CUDARC_DIST   the packed folder (default dist/cuda)
#      RUNS          runs of the workload (default 1), each a process
#      OLD_MLP       another build of mlp-train (e.g. `cargo build --release
#                    -p mlp-train` of an older commit, stripped): run after
#                    the packed one in odd runs, before it in even ones
#      OUT           logs and the JSON lines go there when set
# Prints the result table last (with RUNS or OLD_MLP, one line per run and
# way); exits non-zero when anything failed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
dist=${CUDARC_DIST:-$root/dist/cuda}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
if [ ! -x "$dist/cudarc/bin/mlp-train" ]; then
  echo "cudarc_example.sh: $dist/cudarc/bin/mlp-train missing: run 'cargo xtask test-cuda' on the build machine first"
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L

# ---- make libcublas / libnvrtc loadable under the names cudarc tries ----
candidates() { # $1 = library base name, e.g. libcublas
  ldconfig -p 2>/dev/null | awk -v n="$1" '$1 ~ "^"n"\\.so\\.[0-9]+$" { print $NF }'
  for d in "${CUDA_HOME:-/nonexistent}"/lib64 /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib \
    /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/*/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    ls "$d/$1".so.[0-9]* 2>/dev/null
  done
  for sp in $(python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
    find "$sp/nvidia" -name "$1.so.[0-9]*" 2>/dev/null
  done
}
pick() { # the CUDA 13 (else newest) real file of $1
  local all best
  all=$(candidates "$1" | sort -u)
  best=$(echo "$all" | grep -E "/$1\.so\.13(\.|$)" | head -1)
  [ -z "$best" ] && best=$(echo "$all" | sort -V | tail -1)
  [ -n "$best" ] && readlink -f "$best"
}
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT
extra=""
for lib in libcublas libnvrtc; do
  real=$(pick "$lib")
  if [ -z "$real" ]; then
    echo "cudarc_example.sh: no $lib.so.* found (ldconfig, /usr/local/cuda*, pip nvidia packages)"
    continue
  fi
  echo "$lib: $real"
  ln -sf "$real" "$libdir/$lib.so"
  extra="$extra:$(dirname "$real")"
done
export LD_LIBRARY_PATH="$libdir$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CACHALOT_REQUIRE_GPU=1

# ---- 1. tests ----
declare -a rows
bad=0
shopt -s nullglob
for t in "$dist"/tests/cachalot-cuda-interop* "$dist"/cudarc/tests/*; do
  name=$(basename "$t")
  log="$out/$name.log"
  "$t" --test-threads=1 >"$log" 2>&1
  rc=$?
  read -r p f < <(awk '/^test result:/ { for (k = 1; k < NF; k++) { if ($(k+1) ~ /^passed/) p += $k; if ($(k+1) ~ /^failed/) f += $k } }
    END { printf "%d %d\n", p, f }' "$log")
  status=ok
  if [ "$rc" -ne 0 ]; then
    status="FAILED(rc=$rc)"
    bad=1
  elif [ "$p" -eq 0 ]; then
    status="NO TESTS PASSED"
    bad=1
  fi
  if [ "$status" != ok ]; then
    echo "---- $name: end of its log"
    tail -n 25 "$log"
  fi
  rows+=("$(printf '%-44s %6s %6s  %s' "$name" "$p" "$f" "$status")")
done

# ---- 2. the workload ----
"$dist/cudarc/bin/mlp-train" "$@" >"$out/mlp-train.log" 2>&1
wrc=$?
grep '^{' "$out/mlp-train.log" | tail -1 >"$out/mlp-train.json"
[ "$wrc" -ne 0 ] && bad=1
runs=${RUNS:-1}
old=${OLD_MLP:-}
if [ -n "$old" ] && [ ! -x "$old" ]; then echo "cudarc_example.sh: OLD_MLP=$old is not executable"; old=""; bad=1; fi
one() { # BUILD-NAME BINARY RUN
  "$2" "${@:4}" >"$out/mlp-train-$1-$3.log" 2>&1 || bad=1
}
if [ "$runs" -gt 1 ] || [ -n "$old" ]; then
  cp "$out/mlp-train.log" "$out/mlp-train-new-1.log"
  for r in $(seq 1 "$runs"); do
    if [ -n "$old" ] && [ $((r % 2)) = 0 ]; then one old "$old" "$r" "$@"; fi
    [ "$r" = 1 ] || one new "$dist/cudarc/bin/mlp-train" "$r" "$@"
    if [ -n "$old" ] && [ $((r % 2)) = 1 ]; then one old "$old" "$r" "$@"; fi
  done
fi

echo
echo "== tests =="
printf '%-44s %6s %6s  %s\n' binary passed failed status
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "== mlp-train (exit $wrc) =="
if grep -q '^losses: first' "$out/mlp-train.log"; then
  sed -n '/^losses: first/,$p' "$out/mlp-train.log" | grep -v '^{'
else
  tail -n 15 "$out/mlp-train.log"
fi
echo "json: $(cat "$out/mlp-train.json")"
if [ -f "$out/mlp-train-new-1.log" ]; then
  echo
  echo "== every run: build-run way median_ms alloc_us/step peak_MiB(drv) cachalot_peak =="
  for f in "$out"/mlp-train-*-*.log; do
    n=$(basename "$f" .log)
    awk -v n="${n#mlp-train-}" '/^way / {t = 1; next} /^peak_MiB by rows/ {t = 0}
      t && $2 ~ /^[0-9.]+$/ {print n, $1, $2, $5, $7, $8, $9}' "$f"
  done
fi
exit $bad
