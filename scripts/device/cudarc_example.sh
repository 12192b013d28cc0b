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
#
# env: CUDARC_DIST   the packed folder (default dist/cuda)
#      OUT           logs and the JSON line go there when set
# Prints the result table last; exits non-zero when anything failed.
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
exit $bad
