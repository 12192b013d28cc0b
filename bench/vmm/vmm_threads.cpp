// Does a virtual-memory call on one thread delay the driver calls of
// another? That decides whether moving driver work (unmapping ghosts,
// releasing recycled memory) off the allocating thread would take its cost
// off that thread's host time, or only move it (one lock in the driver).
//
//   g++ -O2 -std=c++17 vmm_threads.cpp -I$CUDA_HOME/include -lcuda -pthread -o vmm_threads && ./vmm_threads
//
// The "allocating" thread times, per call, what the engine does on its own
// thread: a map and its access of a 2 MiB page (then its unmap, timed
// apart), and a cuStreamQuery and a cuEventRecord + cuEventQuery (the
// completion checks of page moves). Each is timed alone, then while a
// second thread ("worker") runs a loop of its own create / map / access /
// unmap / release of other 2 MiB pages, and while the worker runs unmaps
// and releases only (the calls the engine could hand to it). A ratio near
// 1 means the calls do not wait on each other.
#include <cuda.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); \
  std::printf("%s failed: %s\n", #x, s_); std::exit(1); } } while (0)

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static CUcontext ctx;
static CUmemAllocationProp prop = {};
static CUmemAccessDesc acc = {};
static const size_t PAGE = 2 << 20;
static const int N = 256;

struct Times { double map_access, unmap, query, event; };

// The allocating thread's calls, N of each, us per call.
static Times allocating(CUdeviceptr va, std::vector<CUmemGenericAllocationHandle>& h, CUstream st, CUevent ev) {
  CK(cuCtxSetCurrent(ctx));
  Times t{};
  double t0 = now_us();
  for (int i = 0; i < N; i++) {
    CK(cuMemMap(va + i * PAGE, PAGE, 0, h[i], 0));
    CK(cuMemSetAccess(va + i * PAGE, PAGE, &acc, 1));
  }
  double t1 = now_us();
  for (int i = 0; i < N; i++) CK(cuMemUnmap(va + i * PAGE, PAGE));
  double t2 = now_us();
  for (int i = 0; i < 4 * N; i++) CK(cuStreamQuery(st));
  double t3 = now_us();
  for (int i = 0; i < 4 * N; i++) { CK(cuEventRecord(ev, st)); CK(cuEventQuery(ev)); }
  double t4 = now_us();
  t.map_access = (t1 - t0) / N; t.unmap = (t2 - t1) / N;
  t.query = (t3 - t2) / (4 * N); t.event = (t4 - t3) / (4 * N);
  return t;
}

// The worker, until told to stop: with `full`, cycles of its own 64
// pages (create, map, access, then unmap, release); else unmaps and
// releases, one page after the other, pages it created and mapped before
// the timing began (the calls the engine could hand to it), until they
// run out. Returns the calls made while timed.
static long worker(std::atomic<bool>& stop, std::atomic<bool>& ready, bool full) {
  CK(cuCtxSetCurrent(ctx));
  const int M = full ? 64 : 2048;
  CUdeviceptr va; CK(cuMemAddressReserve(&va, PAGE * M, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> h(M);
  auto make = [&](int i) {
    CK(cuMemCreate(&h[i], PAGE, &prop, 0));
    CK(cuMemMap(va + i * PAGE, PAGE, 0, h[i], 0));
    CK(cuMemSetAccess(va + i * PAGE, PAGE, &acc, 1));
  };
  auto drop = [&](int i) { CK(cuMemUnmap(va + i * PAGE, PAGE)); CK(cuMemRelease(h[i])); };
  long calls = 0;
  int left = 0;
  if (full) {
    ready = true;
    while (!stop) {
      for (int i = 0; i < M; i++) make(i);
      for (int i = 0; i < M; i++) drop(i);
      calls += 5 * M;
    }
  } else {
    for (int i = 0; i < M; i++) make(i);
    ready = true;
    while (!stop && left < M) { drop(left++); calls += 2; }
    if (left == M) std::printf("  (the worker ran out of pages to unmap before the timing ended)\n");
    while (left < M) drop(left++);
  }
  CK(cuMemAddressFree(va, PAGE * M));
  return calls;
}

int main() {
  CK(cuInit(0));
  CUdevice dev; CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr va; CK(cuMemAddressReserve(&va, PAGE * N, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> h(N);
  for (int i = 0; i < N; i++) CK(cuMemCreate(&h[i], PAGE, &prop, 0));
  CUstream st; CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  allocating(va, h, st, ev);  // warm-up
  std::printf("%-34s %12s %10s %14s %18s %14s\n", "allocating thread, us per call", "map+access", "unmap",
              "cuStreamQuery", "record+query event", "worker calls/s");
  for (int round = 0; round < 3; round++) {
    Times alone = allocating(va, h, st, ev);
    std::printf("%-34s %12.1f %10.1f %14.2f %18.2f %14s\n", "alone", alone.map_access, alone.unmap, alone.query,
                alone.event, "-");
    for (int full = 1; full >= 0; full--) {
      std::atomic<bool> stop{false}, ready{false};
      long calls = 0;
      double w0 = 0;
      std::thread w([&]() { calls = worker(stop, ready, full); });
      while (!ready) std::this_thread::yield();
      w0 = now_us();
      Times busy = allocating(va, h, st, ev);
      double w1 = now_us();
      stop = true;
      w.join();
      std::printf("%-34s %12.1f %10.1f %14.2f %18.2f %14.0f\n",
                  full ? "worker: create/map/access/unmap/release" : "worker: unmap/release",
                  busy.map_access, busy.unmap, busy.query, busy.event, calls / ((w1 - w0) / 1e6));
      std::printf("%-34s %12.2fx %9.2fx %13.2fx %17.2fx\n", "  ratio to alone", busy.map_access / alone.map_access,
                  busy.unmap / alone.unmap, busy.query / alone.query, busy.event / alone.event);
    }
  }
  for (int i = 0; i < N; i++) CK(cuMemRelease(h[i]));
  CK(cuMemAddressFree(va, PAGE * N));
  return 0;
}
