// Do the driver's virtual-memory calls wait for the GPU? Each call is timed
// on the host twice: with the GPU idle, and while a kernel that touches none
// of the pages involved spins for SPIN_MS on another stream. A call that
// waits for the device takes about the kernel's remaining time when busy.
// This decides whether page recycling can hide behind work in flight
// (completion fences, docs/design-expandable.md) or must avoid moving pages.
//
//   nvcc -O2 -std=c++17 vmm_busy.cu -lcuda -o vmm_busy && ./vmm_busy
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); \
  std::printf("%s failed: %s\n", #x, s_); std::exit(1); } } while (0)

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__global__ void spin(long long cycles, int* flag) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  *flag = 1;
}

int main() {
  const double SPIN_MS = 20.0;
  CK(cuInit(0));
  cudaSetDevice(0);
  cudaFree(0);  // the runtime's primary context, current
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  long long cycles = (long long)(SPIN_MS * clock_khz);
  cudaStream_t work;
  cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking);
  int* flag;
  cudaMalloc(&flag, sizeof(int));

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const size_t PAGE = 2 << 20;
  const int N = 8;
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, PAGE * N * 2, 0, 0, 0));
  CUmemGenericAllocationHandle h[N];
  for (int i = 0; i < N; i++) CK(cuMemCreate(&h[i], PAGE, &prop, 0));
  for (int i = 0; i < N; i++) CK(cuMemMap(va + i * PAGE, PAGE, 0, h[i], 0));
  CK(cuMemSetAccess(va, PAGE * N, &acc, 1));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

  std::printf("%-26s %12s %12s  (us per call; busy = a %.0f ms kernel running on another stream)\n",
              "call", "idle", "busy", SPIN_MS);
  for (int round = 0; round < 2; round++) {
    double t[2][5];
    for (int busy = 0; busy < 2; busy++) {
      cudaDeviceSynchronize();
      if (busy) {
        spin<<<1, 1, 0, work>>>(cycles, flag);
        // let it start
        double s = now_us();
        while (now_us() - s < 500) {
        }
      }
      double a = now_us();
      CK(cuMemUnmap(va, PAGE));  // one 2 MiB page, untouched by the kernel
      double b = now_us();
      CK(cuMemMap(va + N * PAGE, PAGE, 0, h[0], 0));  // the handle elsewhere
      double c = now_us();
      CK(cuMemSetAccess(va + N * PAGE, PAGE, &acc, 1));
      double d = now_us();
      CK(cuEventRecord(ev, (CUstream)work));
      CUresult q = cuEventQuery(ev);
      double e = now_us();
      CK(cuMemUnmap(va + N * PAGE, PAGE));
      CK(cuMemMap(va, PAGE, 0, h[0], 0));
      CK(cuMemSetAccess(va, PAGE, &acc, 1));
      double f = now_us();
      t[busy][0] = b - a;
      t[busy][1] = c - b;
      t[busy][2] = d - c;
      t[busy][3] = e - d;
      t[busy][4] = f - e;
      if (busy && q == CUDA_SUCCESS) std::printf("  (the kernel had ended before the event query)\n");
    }
    const char* names[5] = {"cuMemUnmap", "cuMemMap", "cuMemSetAccess", "cuEventRecord+Query",
                            "unmap+map+access (back)"};
    for (int k = 0; k < 5; k++) std::printf("%-26s %12.1f %12.1f%s\n", names[k], t[0][k], t[1][k], round ? "" : "  (warm-up)");
  }
  cudaDeviceSynchronize();
  return 0;
}
