// Helpers the conformance tests load with ctypes (built by _native.py
// against the installed torch, like the shim): a user's allocator for
// torch.cuda.MemPool(allocator=CUDAPluggableAllocator(...)), with counters,
// and an allocator trace tracker (the hook ProcessGroupNCCL attaches)
// counting segment events.

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace {

std::mutex g_mu;
std::map<uintptr_t, size_t> g_live;  // the user allocator's live blocks
long g_allocs = 0, g_frees = 0;

std::mutex t_mu;
bool t_attached = false;
struct Count {
  long n = 0;
  long long bytes = 0;
};
std::map<int, Count> t_all;                                       // by action
std::map<std::pair<int, std::pair<uint64_t, uint64_t>>, Count> t_pool;  // by (action, pool)

}  // namespace

extern "C" {

// ----- a user's allocator (CUDAPluggableAllocator's signatures) -----

void* user_alloc(size_t size, int device, cudaStream_t stream) {
  (void)device;
  (void)stream;
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  std::lock_guard<std::mutex> g(g_mu);
  g_live[reinterpret_cast<uintptr_t>(p)] = size;
  ++g_allocs;
  return p;
}

void user_free(void* p, size_t size, int device, cudaStream_t stream) {
  (void)size;
  (void)device;
  (void)stream;
  (void)cudaFree(p);
  std::lock_guard<std::mutex> g(g_mu);
  g_live.erase(reinterpret_cast<uintptr_t>(p));
  ++g_frees;
}

long user_allocs() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_allocs;
}

long user_frees() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_frees;
}

long user_live() {
  std::lock_guard<std::mutex> g(g_mu);
  return static_cast<long>(g_live.size());
}

// 1 when `addr` lies inside a block the user allocator handed out and
// still holds.
int user_owns(uintptr_t addr) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_live.upper_bound(addr);
  if (it == g_live.begin()) return 0;
  --it;
  return addr < it->first + it->second ? 1 : 0;
}

// ----- an allocator trace tracker -----

// Attaches the tracker once (the device must be initialized: PyTorch's own
// allocator attaches it to the devices it has).
void tracker_attach() {
  std::lock_guard<std::mutex> g(t_mu);
  if (t_attached) return;
  t_attached = true;
  c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(
      [](const c10::CachingDeviceAllocator::TraceEntry& te) {
        std::lock_guard<std::mutex> g(t_mu);
        auto& a = t_all[te.action_];
        a.n += 1;
        a.bytes += static_cast<long long>(te.size_);
        auto& p = t_pool[{te.action_, {te.mempool_.first, te.mempool_.second}}];
        p.n += 1;
        p.bytes += static_cast<long long>(te.size_);
      });
}

void tracker_reset() {
  std::lock_guard<std::mutex> g(t_mu);
  t_all.clear();
  t_pool.clear();
}

long tracker_count(int action) {
  std::lock_guard<std::mutex> g(t_mu);
  return t_all[action].n;
}

long long tracker_bytes(int action) {
  std::lock_guard<std::mutex> g(t_mu);
  return t_all[action].bytes;
}

long tracker_count_in_pool(int action, uint64_t id0, uint64_t id1) {
  std::lock_guard<std::mutex> g(t_mu);
  return t_pool[{action, {id0, id1}}].n;
}

}  // extern "C"
