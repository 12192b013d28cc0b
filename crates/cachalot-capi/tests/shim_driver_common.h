// What every shim driver (shim_driver*.cpp, each a program of its own, run
// by shim_build.rs) shares: the shim's install entry points, the CUDA
// runtime calls the exercised paths make (answered here, exported by the
// driver, so they take precedence over libcudart's), and the checks.
// Included once per driver: it defines functions and a counter.

#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <exception>

extern "C" int cachalot_torch_install(const char*, char*, size_t);
extern "C" int cachalot_torch_installed();

// the CUDA runtime as far as these paths need it: one device, device 0
extern "C" cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
extern "C" cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}

namespace CCA = c10::cuda::CUDACachingAllocator;

// failed checks so far: each prints its line, the driver exits 1 if any
static int failures = 0;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::printf("FAILED line %d: %s\n", __LINE__, #cond);          \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

// whether f throws an E whose message holds needle (says what it got if not)
template <class E, class F>
static bool throws(F f, const char* needle) {
  try {
    f();
  } catch (const E& e) {
    if (std::strstr(e.what(), needle)) return true;
    std::printf("wrong message: %s\n", e.what());
    return false;
  } catch (const std::exception& e) {
    std::printf("wrong exception type: %s\n", e.what());
    return false;
  }
  std::printf("no exception (wanted one with '%s')\n", needle);
  return false;
}
