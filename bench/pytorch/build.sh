#!/usr/bin/env bash
# Builds the PyTorch harnesses (torch_replay, torch_threads) with plain g++
# against the installed PyTorch's C++ headers and libc10_cuda: no cmake, no
# network. Used by bench.sh on the GPU machine; runs anywhere the headers are.
#
# usage: bench/pytorch/build.sh [OUTDIR]          (default: ./build)
# Environment (all optional):
#   TORCH_DIR   the torch package folder (holding include/ and lib/);
#               default: python3 -c 'import torch' tells
#   TORCH_CXX11_ABI  0 or 1; default: torch._C._GLIBCXX_USE_CXX11_ABI, else 1
#   CUDA_HOME   a CUDA toolkit (include/cuda_runtime_api.h, lib64/libcudart.so*);
#               default: the nvidia wheel beside torch, then /usr/local/cuda
#   CXX         the compiler (default g++)
#   SYNTAX_ONLY=1  check the sources only (-fsyntax-only), link nothing
# Exit: 0 built, 3 PyTorch or CUDA headers not found, 1 a compile failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-build}
mkdir -p "$out" || exit 1
CXX=${CXX:-g++}

T=${TORCH_DIR:-$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))' 2>/dev/null)}
if [ -z "$T" ] || [ ! -f "$T/include/c10/cuda/CUDACachingAllocator.h" ]; then
  echo "build.sh: PyTorch's C++ headers not found (no torch for python3; set TORCH_DIR)"
  exit 3
fi
ABI=${TORCH_CXX11_ABI:-$(python3 -c 'import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)}
ABI=${ABI:-1}

# CUDA runtime headers (cuda_runtime_api.h, and crt/host_config.h, which
# cuda_runtime.h includes: in a toolkit, or the nvidia-cuda-crt wheel) and
# library: the wheels PyTorch itself loads first (site-packages/nvidia/cu13
# for cu13 builds, nvidia/cuda_runtime for cu12), then a toolkit.
rt_inc=""; crt_inc=""; cudart=""
for d in "$T/../nvidia/cu13" "$T/../nvidia/cuda_runtime" ${CUDA_HOME:+"$CUDA_HOME"} /usr/local/cuda; do
  [ -z "$rt_inc" ] && [ -f "$d/include/cuda_runtime_api.h" ] && rt_inc=$d/include
  [ -z "$crt_inc" ] && [ -f "$d/include/crt/host_config.h" ] && crt_inc=$d/include
  if [ -z "$cudart" ]; then
    for l in "$d"/lib/libcudart.so* "$d"/lib64/libcudart.so*; do
      case $l in *\**) ;; *.a) ;; *) [ -f "$l" ] && cudart=$l && break ;; esac
    done
  fi
done
if [ -z "$rt_inc" ] || [ -z "$crt_inc" ]; then
  echo "build.sh: CUDA headers not found (cuda_runtime_api.h: ${rt_inc:-missing}, crt/host_config.h: ${crt_inc:-missing}; looked beside torch, in \$CUDA_HOME and /usr/local/cuda)"
  exit 3
fi
cuda_inc=(-isystem "$rt_inc")
[ "$crt_inc" != "$rt_inc" ] && cuda_inc+=(-isystem "$crt_inc")

flags=(-O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI="$ABI" -Wall -Wextra -Wno-unused-parameter
       -I"$here" -isystem "$T/include" "${cuda_inc[@]}")
echo "build.sh: torch $T (ABI $ABI), CUDA headers $rt_inc $crt_inc, cudart ${cudart:-none}"
rc=0
for n in torch_replay torch_threads; do
  if [ "${SYNTAX_ONLY:-0}" = 1 ]; then
    "$CXX" "${flags[@]}" -fsyntax-only "$here/$n.cpp" || rc=1
    continue
  fi
  if [ -z "$cudart" ]; then
    echo "build.sh: libcudart.so not found (beside torch, in \$CUDA_HOME or /usr/local/cuda)"
    exit 3
  fi
  "$CXX" "${flags[@]}" "$here/$n.cpp" -pthread \
    -L"$T/lib" -Wl,--no-as-needed -lc10_cuda -lc10 -Wl,--as-needed "$cudart" \
    -Wl,-rpath,"$T/lib" -Wl,-rpath,"$(dirname "$cudart")" -o "$out/$n" || rc=1
done
[ $rc = 0 ] && echo "build.sh: built $([ "${SYNTAX_ONLY:-0}" = 1 ] && echo '(syntax only)') torch_replay torch_threads into $out"
exit $rc
