// Runs the PyTorch shim (python/cachalot_torch/shim.cpp) inside the real
// libc10 / libc10_cuda of a torch tree, without a GPU (cachalot on the mock
// device, CACHALOT_TORCH_BACKEND=mock), for what PyTorch reaches through
// its own entry points beyond allocation: settings set at run time (and in
// PYTORCH_CUDA_ALLOC_CONF), a pool backed by a user's allocator,
// use_on_oom and no_split, the cache turned off and on, allocator trace
// trackers, and PyTorch's out-of-memory text. Prints "shim driver: ok".

#include "shim_driver_common.h"

#include <c10/core/AllocatorConfig.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>

using c10::CachingDeviceAllocator::TraceEntry;

// A user's allocator (as CUDAPluggableAllocator is one): addresses from a
// range of its own, every call counted. Only raw_alloc / raw_delete are
// used by a pool.
struct UserAllocator final : CCA::CUDAAllocator {
  std::mutex mu;
  std::map<uintptr_t, size_t> live;
  uintptr_t next = 0x020000000000;
  int allocs = 0, frees = 0;

  void* raw_alloc(size_t n) override {
    std::lock_guard<std::mutex> g(mu);
    uintptr_t a = next;
    next += (n + (64 << 20) - 1) / (64 << 20) * (64 << 20);
    live[a] = n;
    ++allocs;
    return reinterpret_cast<void*>(a);
  }
  void raw_delete(void* p) override {
    std::lock_guard<std::mutex> g(mu);
    TORCH_CHECK(live.erase(reinterpret_cast<uintptr_t>(p)) == 1, "not mine");
    ++frees;
  }
  [[noreturn]] static void no() { TORCH_CHECK(false, "not used by a pool"); }
  c10::DataPtr allocate(size_t) override { no(); }
  void copy_data(void*, const void*, std::size_t) const override { no(); }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override { no(); }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex) override {}
  void* raw_alloc_with_stream(size_t n, cudaStream_t) override { return raw_alloc(n); }
  void init(int) override {}
  double getMemoryFraction(c10::DeviceIndex) override { return 1.0; }
  void setMemoryFraction(double, c10::DeviceIndex) override {}
  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override { return {}; }
  void enable(bool) override {}
  bool isEnabled() const override { return true; }
  void cacheInfo(c10::DeviceIndex, size_t*) override {}
  void* getBaseAllocation(void* p, size_t*) override { return p; }
  using CCA::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr&, c10::cuda::CUDAStream) override {}
  CCA::SnapshotInfo snapshot(c10::MempoolId_t, bool) override { return {}; }
  void beginAllocateToPool(c10::DeviceIndex, c10::MempoolId_t, std::function<bool(cudaStream_t)>) override { no(); }
  void endAllocateToPool(c10::DeviceIndex, c10::MempoolId_t) override { no(); }
  void releasePool(c10::DeviceIndex, c10::MempoolId_t) override { no(); }
  CCA::ShareableHandle shareIpcHandle(void*) override { no(); }
  std::shared_ptr<void> getIpcDevPtr(std::string) override { no(); }
  void recordHistory(bool, CCA::CreateContextFn, size_t, CCA::RecordContext, bool,
                     const std::vector<std::string>&) override {}
  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver) override {}
  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker) override {}
  void enablePeerAccess(c10::DeviceIndex, c10::DeviceIndex) override {}
  cudaError_t memcpyAsync(void*, int, const void*, int, size_t, cudaStream_t, bool) override { no(); }
  std::shared_ptr<CCA::AllocatorState> getCheckpointState(c10::DeviceIndex, c10::MempoolId_t) override { no(); }
  CCA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex, std::shared_ptr<CCA::AllocatorState>) override {
    no();
  }
  std::string name() override { return "user"; }
};

static int64_t active_allocated() { return CCA::getDeviceStats(0).active_bytes[0].allocated; }

int main() {
  // cachalot's own key in PyTorch's variable: PyTorch's parser accepts it
  // once the shim registers it, and cachalot honours it
  setenv("PYTORCH_CUDA_ALLOC_CONF", "placement:pytorch,max_split_size_mb:100", 1);
  char err[1024] = {0};
  int rc = cachalot_torch_install(nullptr, err, sizeof err);
  if (rc != 0) {
    std::printf("install failed: %d %s\n", rc, err);
    return 1;
  }
  CHECK(CCA::get()->name() == "cachalot");
  CHECK(c10::CachingAllocator::getAllocatorSettings() == "placement:pytorch,max_split_size_mb:100");
  CCA::init(1);
  {
    auto m = CCA::snapshot({0, 0}, false).config_metadata;
    CHECK(m.max_split_size == size_t(100) << 20);
    CHECK(m.last_allocator_settings.find("placement:pytorch") != std::string::npos);
  }

  // ----- settings set at run time reach cachalot at once -----
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:4");
  {
    auto m = CCA::snapshot({0, 0}, false).config_metadata;
    CHECK(m.last_allocator_settings == "roundup_power2_divisions:4");
    CHECK(m.max_split_size == SIZE_MAX);  // every parse resets it
    CHECK(m.roundup_power2_divisions.size() == 16 && m.roundup_power2_divisions[6] == 4);
  }
  int64_t before = active_allocated();
  void* r = CCA::raw_alloc(84u << 20);  // 84 MiB: 64 MiB + 1 quarter of 64 MiB, rounded up
  CHECK(active_allocated() - before == int64_t(96) << 20);
  CCA::raw_delete(r);
  c10::CachingAllocator::setAllocatorSettings("");
  before = active_allocated();
  r = CCA::raw_alloc(84u << 20);
  CHECK(active_allocated() - before == int64_t(84) << 20);
  CCA::raw_delete(r);
  // PyTorch's keys: the pinned ones stay PyTorch's (its host allocator),
  // the lock release and capture reuse reach cachalot
  CHECK(!CCA::snapshot({0, 0}, false).config_metadata.release_lock_on_malloc);
  c10::CachingAllocator::setAllocatorSettings(
      "pinned_num_register_threads:8,release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True");
  {
    auto m = CCA::snapshot({0, 0}, false).config_metadata;
    CHECK(m.pinned_num_register_threads == 8);
    CHECK(m.graph_capture_record_stream_reuse);
    CHECK(m.release_lock_on_malloc);
  }
  c10::CachingAllocator::setAllocatorSettings("release_lock_on_cudamalloc:False");
  CHECK(!CCA::snapshot({0, 0}, false).config_metadata.release_lock_on_malloc);
  // bad values: PyTorch's parser refuses first; a value only cachalot
  // checks is a ValueError from cachalot
  CHECK(throws<c10::ValueError>([] { c10::CachingAllocator::setAllocatorSettings("foo:1"); }, "Unrecognized key"));
  CHECK(throws<c10::ValueError>(
      [] { c10::CachingAllocator::setAllocatorSettings("garbage_collection_threshold:1.2"); }, "threshold"));
  CHECK(throws<c10::ValueError>([] { c10::CachingAllocator::setAllocatorSettings("placement:nowhere"); },
                                "cachalot"));
  c10::CachingAllocator::setAllocatorSettings("graph_capture_record_stream_reuse:False");
  CHECK(!CCA::snapshot({0, 0}, false).config_metadata.graph_capture_record_stream_reuse);

  // ----- the cache off and on -----
  CHECK(CCA::isEnabled());
  CCA::enable(false);
  CHECK(!CCA::isEnabled());
  int64_t req = CCA::getDeviceStats(0).requested_bytes[0].allocated;
  void* u = CCA::raw_alloc(1 << 20);
  CHECK(u != nullptr);
  CHECK(CCA::getDeviceStats(0).requested_bytes[0].allocated == req);
  CCA::raw_delete(u);
  {
    c10::DataPtr d = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(4096);
    CHECK(d.get() != nullptr && CCA::getDeviceStats(0).requested_bytes[0].allocated == req);
  }
  CCA::enable(true);
  CHECK(CCA::isEnabled());
  u = CCA::raw_alloc(1 << 20);
  CHECK(CCA::getDeviceStats(0).requested_bytes[0].allocated == req + (1 << 20));
  CCA::raw_delete(u);

  // ----- trackers see every segment event -----
  std::mutex ev_mu;
  std::vector<TraceEntry> events;
  CCA::attachAllocatorTraceTracker([&](const TraceEntry& te) {
    std::lock_guard<std::mutex> g(ev_mu);
    events.push_back(te);
  });
  c10::CachingAllocator::setAllocatorSettings("expandable_segments:False");
  CCA::emptyCache();
  events.clear();
  void* big = CCA::raw_alloc(30u << 20);
  CCA::raw_delete(big);
  CCA::emptyCache();
  {
    std::lock_guard<std::mutex> g(ev_mu);
    CHECK(events.size() == 2);
    CHECK(events.size() == 2 && events[0].action_ == TraceEntry::SEGMENT_ALLOC &&
          events[0].addr_ == reinterpret_cast<size_t>(big) && events[0].size_ == size_t(30) << 20 &&
          events[0].device_ == 0 && events[0].mempool_ == c10::MempoolId_t(0, 0));
    CHECK(events.size() == 2 && events[1].action_ == TraceEntry::SEGMENT_FREE &&
          events[1].addr_ == reinterpret_cast<size_t>(big));
    events.clear();
  }

  // ----- a pool backed by a user's allocator -----
  auto user = std::make_shared<UserAllocator>();
  c10::MempoolId_t pool{0, 7001};
  CCA::createOrIncrefPool(0, pool, user);
  CHECK(user.use_count() == 2);  // the pool holds it
  auto same_thread = [tid = std::this_thread::get_id()](cudaStream_t) {
    return std::this_thread::get_id() == tid;
  };
  CCA::beginAllocateToPool(0, pool, same_thread);
  CHECK(CCA::getPoolUseCount(0, pool) == 2);
  void* p1 = CCA::raw_alloc(1 << 20);
  void* p2 = CCA::raw_alloc(1 << 20);
  void* p3 = CCA::raw_alloc(1 << 20);
  // another thread's allocation meanwhile goes to the default pools
  void* other = nullptr;
  std::thread([&] { other = CCA::raw_alloc(1 << 20); }).join();
  CCA::endAllocateToPool(0, pool);
  CCA::releasePool(0, pool);
  CHECK(user->allocs == 2);  // 2 MiB small segments: two blocks in the first
  auto ps = CCA::snapshot(pool, false).segments;
  CHECK(ps.size() == 2);
  for (const auto& s : ps) {
    CHECK(s.address >= 0x020000000000 && s.owner_private_pool_id == pool && !s.is_expandable);
  }
  CHECK(reinterpret_cast<uintptr_t>(other) < 0x020000000000 || reinterpret_cast<uintptr_t>(other) >= 0x030000000000);
  {
    std::lock_guard<std::mutex> g(ev_mu);
    int in_pool = 0;
    for (const auto& te : events) in_pool += te.mempool_ == pool && te.action_ == TraceEntry::SEGMENT_ALLOC;
    CHECK(in_pool == 2);
  }
  CCA::raw_delete(other);
  // the pool let go while its blocks live (MemPool deleted first)
  CCA::setUseOnOOM(0, pool, false);
  CCA::releasePool(0, pool);
  CCA::emptyCache(pool);
  CHECK(user->frees == 0);
  CCA::raw_delete(p1);
  CCA::raw_delete(p2);
  CCA::raw_delete(p3);
  CCA::emptyCache();
  CHECK(user->frees == 2 && user->live.empty());
  CHECK(user.use_count() == 1);  // released with the pool
  CHECK(throws<c10::Error>([&] { CCA::createOrIncrefPool(0, {0, 0}, user); }, "reserved"));

  // ----- no_split and use_on_oom -----
  c10::MempoolId_t whole{0, 7002};
  CCA::createOrIncrefPool(0, whole);
  CCA::setNoSplit(0, whole);
  CCA::beginAllocateToPool(0, whole, same_thread);
  void* w1 = CCA::raw_alloc(4 << 20);
  void* w2 = CCA::raw_alloc(4 << 20);
  CCA::endAllocateToPool(0, whole);
  CCA::releasePool(0, whole);
  auto ws = CCA::snapshot(whole, false).segments;
  CHECK(ws.size() == 2);
  for (const auto& s : ws) CHECK(s.blocks.size() == 1 && s.total_size == size_t(20) << 20);
  CCA::raw_delete(w1);
  CCA::raw_delete(w2);
  CCA::setUseOnOOM(0, whole, true);
  CCA::setUseOnOOM(0, whole, false);
  CCA::releasePool(0, whole);
  CHECK(throws<c10::Error>([&] { CCA::setNoSplit(0, {0, 424242}); }, "mempool"));
  CCA::setUseOnOOM(0, {0, 424242}, false);  // gone already: nothing to do

  // ----- out of memory: PyTorch's text first -----
  CHECK(throws<c10::OutOfMemoryError>(
      [] { CCA::raw_alloc(size_t(1) << 50); },
      "CUDA out of memory. Tried to allocate 1048576.00 GiB. GPU 0 has a total capacity of "));
  CHECK(throws<c10::OutOfMemoryError>([] { CCA::raw_alloc(size_t(1) << 50); }, "\ncachalot: "));
  CHECK(throws<c10::OutOfMemoryError>([] { CCA::raw_alloc(size_t(1) << 61); },
                                      "CUDA out of memory. Tried to allocate more than 1EB memory."));

  if (failures == 0) std::printf("shim driver: ok\n");
  return failures == 0 ? 0 : 1;
}
