// Host cost of the CUDA driver's virtual-memory calls, per call, on the
// GPU machine: what an expandable segment pays per page. Also answers two
// questions of design: can a 2 MiB slice of a larger physical allocation be
// mapped on its own (cuMemMap with an offset), and can a sub-range of one
// mapping be unmapped (cuMemUnmap of part of what one cuMemMap mapped)?
//
//   g++ -O2 -std=c++17 vmm_cost.cpp -I$CUDA_HOME/include -lcuda -o vmm_cost && ./vmm_cost
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); \
  std::printf("%s failed: %s\n", #x, s_); std::exit(1); } } while (0)

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
  CK(cuInit(0));
  CUdevice dev; CK(cuDeviceGet(&dev, 0));
  CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc acc = {};
  acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const size_t MB = 1 << 20;
  std::printf("%-10s %6s %10s %10s %10s %10s %10s  (us per call)\n", "page", "n", "create", "map", "access", "unmap", "release");
  for (size_t page : {2 * MB, 20 * MB, 64 * MB, 512 * MB}) {
    int n = page >= 512 * MB ? 16 : page >= 64 * MB ? 64 : 256;
    CUdeviceptr va; CK(cuMemAddressReserve(&va, page * n, 0, 0, 0));
    std::vector<CUmemGenericAllocationHandle> h(n);
    double t0 = now_us();
    for (int i = 0; i < n; i++) CK(cuMemCreate(&h[i], page, &prop, 0));
    double t1 = now_us();
    for (int i = 0; i < n; i++) CK(cuMemMap(va + i * page, page, 0, h[i], 0));
    double t2 = now_us();
    for (int i = 0; i < n; i++) CK(cuMemSetAccess(va + i * page, page, &acc, 1));
    double t3 = now_us();
    for (int i = 0; i < n; i++) CK(cuMemUnmap(va + i * page, page));
    double t4 = now_us();
    // remap the same handles (the handle-transfer path: no create/release)
    double t5 = now_us();
    for (int i = 0; i < n; i++) CK(cuMemMap(va + i * page, page, 0, h[(i + 1) % n], 0));
    CK(cuMemSetAccess(va, page * n, &acc, 1));
    double t6 = now_us();
    for (int i = 0; i < n; i++) CK(cuMemUnmap(va + i * page, page));
    double t7 = now_us();
    for (int i = 0; i < n; i++) CK(cuMemRelease(h[i]));
    double t8 = now_us();
    std::printf("%-7zuMiB %6d %10.1f %10.1f %10.1f %10.1f %10.1f  remap+1 access: %.1f/page\n", page / MB, n,
                (t1 - t0) / n, (t2 - t1) / n, (t3 - t2) / n, (t4 - t3) / n, (t8 - t7) / n, (t6 - t5) / n);
    CK(cuMemAddressFree(va, page * n));
  }
  // slices of one 64 MiB allocation, each 2 MiB mapped on its own (offset)
  {
    size_t big = 64 * MB, page = 2 * MB; int n = (int)(big / page);
    CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, big, &prop, 0));
    CUdeviceptr va; CK(cuMemAddressReserve(&va, big * 2, 0, 0, 0));
    double t0 = now_us();
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < n && r == CUDA_SUCCESS; i++) r = cuMemMap(va + (n - 1 - i) * page, page, i * page, h, 0);
    double t1 = now_us();
    const char* s; cuGetErrorString(r, &s);
    std::printf("2 MiB slices of one 64 MiB allocation, mapped one by one with an offset: %s (%.1f us per map)\n", s, (t1 - t0) / n);
    if (r == CUDA_SUCCESS) {
      CK(cuMemSetAccess(va, big, &acc, 1));
      CK(cuMemsetD8(va, 7, big));
      CK(cuCtxSynchronize());
      for (int i = 0; i < n; i++) CK(cuMemUnmap(va + i * page, page));
    }
    // one mapping of the whole 64 MiB, then unmapping a 2 MiB sub-range of it
    CK(cuMemMap(va, big, 0, h, 0));
    CUresult u = cuMemUnmap(va + page, page);
    cuGetErrorString(u, &s);
    std::printf("cuMemUnmap of 2 MiB inside one 64 MiB mapping: %s\n", s);
    if (u == CUDA_SUCCESS) {
      cuMemUnmap(va, page);
      cuMemUnmap(va + 2 * page, big - 2 * page);
    } else {
      CK(cuMemUnmap(va, big));
    }
    CK(cuMemRelease(h));
    CK(cuMemAddressFree(va, big * 2));
  }
  // a stream sync of an idle stream (what recycling pays per stream)
  {
    CUstream st; CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    double t0 = now_us();
    for (int i = 0; i < 1000; i++) { CK(cuEventRecord(ev, st)); CK(cuEventSynchronize(ev)); }
    double t1 = now_us();
    std::printf("event record + synchronize on an idle stream: %.2f us\n", (t1 - t0) / 1000);
  }
  return 0;
}
