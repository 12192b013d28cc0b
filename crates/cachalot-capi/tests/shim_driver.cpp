// Runs the PyTorch shim (python/cachalot_torch/shim.cpp) inside the real
// libc10 / libc10_cuda of a torch tree, without a GPU: cachalot on the mock
// device (CACHALOT_TORCH_BACKEND=mock), and the three CUDA runtime calls
// the exercised paths make (the current device, the device count, the
// stream priority range) answered by this program (shim_driver_common.h:
// it exports them, so they take precedence over libcudart's).
// Every call goes through torch's own entry points
// (c10::cuda::CUDACachingAllocator::*, c10::GetAllocator), i.e. through the
// vtable of the torch version it was built against. Prints "shim driver: ok".

#include "shim_driver_common.h"

#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

// Pool checkpoints as cudagraph trees use them: save, let the outputs die
// and allocate more in the pool, restore; the checkpoint's blocks come back
// at their addresses as DataPtrs with the allocator's deleter.
static void checkpoints() {
  c10::MempoolId_t pool{0, 4545};
  CCA::createOrIncrefPool(0, pool);
  auto alloc_in_pool = [&](size_t n) {
    CCA::beginAllocateToPool(0, pool, [](cudaStream_t) { return true; });
    void* p = CCA::raw_alloc(n);
    CCA::endAllocateToPool(0, pool);
    CCA::releasePool(0, pool);
    return p;
  };
  void* a = alloc_in_pool(512);
  void* b = alloc_in_pool(512);
  void* c = alloc_in_pool(3 << 20);
  CCA::raw_delete(b);
  auto state = CCA::getCheckpointState(0, pool);
  CHECK(state != nullptr);
  auto before = CCA::snapshot(pool, false).segments;
  CCA::raw_delete(a);
  void* later = alloc_in_pool(4096);
  CHECK(CCA::checkPoolLiveAllocations(0, pool, {c, later}));
  auto delta = CCA::setCheckpointPoolState(0, state);
  std::unordered_set<void*> freed(delta.ptrs_freed.begin(), delta.ptrs_freed.end());
  CHECK(freed == (std::unordered_set<void*>{c, later}));
  std::unordered_set<void*> made;
  for (auto& d : delta.dataptrs_allocd) {
    made.insert(d.get());
    CHECK(d.get_context() == d.get());
    CHECK(d.get_deleter() == CCA::get()->raw_deleter());
    CHECK(d.device() == c10::Device(c10::DeviceType::CUDA, 0));
  }
  CHECK(made == (std::unordered_set<void*>{a, c}));
  CHECK(CCA::checkPoolLiveAllocations(0, pool, {a, c}));
  auto after = CCA::snapshot(pool, false).segments;
  CHECK(after.size() >= before.size());
  for (const auto& bs : before) {
    bool found = false;
    for (const auto& as : after) {
      if (as.address != bs.address) continue;
      found = true;
      CHECK(as.total_size == bs.total_size && as.allocated_size == bs.allocated_size);
      CHECK(as.blocks.size() == bs.blocks.size());
      for (size_t i = 0; i < bs.blocks.size() && i < as.blocks.size(); ++i) {
        CHECK(as.blocks[i].size == bs.blocks[i].size);
        CHECK(as.blocks[i].allocated == bs.blocks[i].allocated);
      }
    }
    CHECK(found);
  }
  // the binding gives the DataPtr of `a` to a storage and releases `c`'s
  // context: dropping the first frees it, `c` waits for raw_delete
  {
    c10::DataPtr keep;
    for (auto& d : delta.dataptrs_allocd) {
      if (d.get() == a) {
        keep = std::move(d);
      } else {
        d.release_context();
      }
    }
    delta.dataptrs_allocd.clear();
    CHECK(CCA::checkPoolLiveAllocations(0, pool, {a, c}));
  }
  CHECK(CCA::checkPoolLiveAllocations(0, pool, {c}));
  CCA::raw_delete(c);
  CHECK(CCA::checkPoolLiveAllocations(0, pool, {}));
  // a state cachalot did not make, and a pool that is gone
  struct Foreign : CCA::AllocatorState {};
  CHECK(throws<c10::Error>(
      [&] { CCA::setCheckpointPoolState(0, std::make_shared<Foreign>()); }, "not a checkpoint"));
  CHECK(throws<c10::Error>([&] { CCA::getCheckpointState(0, {0, 999998}); }, "mempool"));
  CCA::releasePool(0, pool);
  CHECK(throws<c10::Error>([&] { CCA::setCheckpointPoolState(0, state); }, "mempool"));
  CCA::emptyCache();
  CHECK(CCA::snapshot(pool, false).segments.empty());
}

// CUDA IPC in PyTorch's wire format: version 2, type 'c' and the segment's
// 64-byte handle for fixed segments (the parity configuration), the
// allocation's offset in its segment; bad pointers and handles as errors.
static void ipc() {
  void* a = CCA::raw_alloc(4096);
  void* b = CCA::raw_alloc(4096);
  auto ha = CCA::shareIpcHandle(a);
  auto hb = CCA::shareIpcHandle(b);
  CHECK(ha.handle.size() == 66 && ha.handle[0] == 2 && ha.handle[1] == 'c');
  CHECK(ha.handle == hb.handle);  // one segment
  CHECK(hb.offset - ha.offset == static_cast<char*>(b) - static_cast<char*>(a));
  // this very process cannot open its own handle (as CUDA)
  CHECK(throws<c10::Error>([&] { CCA::getIpcDevPtr(ha.handle); }, "this very process"));
  CCA::raw_delete(a);
  CCA::raw_delete(b);
  CHECK(throws<c10::Error>([&] { CCA::shareIpcHandle(a); }, "not a live allocation"));
  CHECK(throws<c10::Error>([&] { CCA::shareIpcHandle(reinterpret_cast<void*>(0x1234)); },
                           "invalid device pointer"));
  CHECK(throws<c10::Error>([&] { CCA::getIpcDevPtr("x"); }, "too short"));
  CHECK(throws<c10::Error>([&] { CCA::getIpcDevPtr(std::string("\x03" "c", 2)); }, "future version"));
  CHECK(throws<c10::Error>([&] { CCA::getIpcDevPtr(std::string("\x02" "q", 2)); }, "ill-formed"));
}

// A context the recorder hands out (PyTorch's is a CapturedTraceback): a
// number, and a count of the live ones.
static std::atomic<int> live_contexts{0};
static std::atomic<int> next_context{1};
struct TestContext : c10::GatheredContext {
  int id = next_context++;
  TestContext() { ++live_contexts; }
  ~TestContext() override { --live_contexts; }
};
static std::atomic<int> recorder_calls{0};
static std::shared_ptr<c10::GatheredContext> test_recorder() {
  ++recorder_calls;
  return std::make_shared<TestContext>();
}
static int id_of(const std::shared_ptr<c10::GatheredContext>& c) {
  auto* t = dynamic_cast<TestContext*>(c.get());
  return t ? t->id : 0;
}

// The profiler's memory reporter (what torch.profiler installs per thread).
struct Reporter : c10::MemoryReportingInfoBase {
  struct Event {
    void* ptr;
    int64_t size;
    size_t allocated, reserved;
  };
  std::vector<Event> events;
  int ooms = 0;
  void reportMemoryUsage(void* ptr, int64_t size, size_t allocated, size_t reserved, c10::Device) override {
    events.push_back({ptr, size, allocated, reserved});
  }
  void reportOutOfMemory(int64_t, size_t, size_t, c10::Device) override { ++ooms; }
  bool memoryProfilingEnabled() const override { return true; }
};

static void history_checks();

int main() {
  CHECK(CCA::get()->name() == "native");
  char err[1024] = {0};
  int rc = cachalot_torch_install("placement:pytorch", err, sizeof err);
  if (rc != 0) {
    std::printf("install failed: %d %s\n", rc, err);
    return 1;
  }
  CHECK(cachalot_torch_installed() == 1);
  CHECK(cachalot_torch_install(nullptr, err, sizeof err) == 0);  // again: no-op
  CHECK(CCA::get()->name() == "cachalot");
  // both install routes: the atomic and the c10 registry
  CHECK(c10::GetAllocator(c10::DeviceType::CUDA) == CCA::get());
  CHECK(c10::getDeviceAllocator(c10::DeviceType::CUDA) == CCA::get());
  CHECK(!CCA::get()->initialized());
  CCA::init(1);
  CHECK(CCA::get()->initialized());

  // allocation, stats, free
  void* p = CCA::raw_alloc_with_stream(1000, nullptr);
  CHECK(p != nullptr);
  auto st = CCA::getDeviceStats(0);
  CHECK(st.allocated_bytes[0].current == 1024);
  CHECK(st.requested_bytes[0].current == 1000);
  CHECK(st.allocation[1].current == 1);  // small pool
  CHECK(st.segment[0].current == 1);
  CHECK(st.reserved_bytes[0].current == 2 << 20);
  CHECK(st.max_split_size == -1);
  CHECK(c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(0).allocated_bytes[0].current == 1024);
  void* q = CCA::raw_alloc(5 << 20);
  size_t largest = 1;
  CCA::cacheInfo(0, &largest);
  CHECK(largest == 15u << 20);  // the rest of q's 20 MiB segment
  size_t base_size = 0;
  CHECK(CCA::getBaseAllocation(q, &base_size) == q && base_size == size_t(5) << 20);
  CHECK(throws<c10::Error>([&] { CCA::getBaseAllocation(reinterpret_cast<void*>(0x1234), &base_size); },
                           "invalid device pointer"));
  CCA::raw_delete(q);
  CCA::raw_delete(p);
  CHECK(throws<c10::Error>([&] { CCA::raw_delete(p); }, "double free"));
  CHECK(throws<c10::Error>([&] { CCA::raw_delete(reinterpret_cast<void*>(0x1234)); }, "invalid device pointer"));
  CHECK(CCA::getDeviceStats(0).allocated_bytes[0].current == 0);
  CCA::resetPeakStats(0);
  CHECK(CCA::getDeviceStats(0).allocated_bytes[0].peak == 0);
  CCA::resetAccumulatedStats(0);
  CHECK(CCA::getDeviceStats(0).num_device_alloc == 0);
  CCA::emptyCache();
  CHECK(CCA::getDeviceStats(0).reserved_bytes[0].current == 0);
  auto info = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getMemoryInfo(0);
  CHECK(info.second > 0 && info.first <= info.second);

  // the allocator interface (DataPtr, deleter)
  c10::Allocator* a = c10::GetAllocator(c10::DeviceType::CUDA);
  {
    c10::DataPtr d = a->allocate(4096);
    CHECK(d.get() != nullptr && d.get() == d.get_context());
    CHECK(d.get_deleter() == a->raw_deleter());
    CHECK(d.device().type() == c10::DeviceType::CUDA);
    CHECK(CCA::getDeviceStats(0).allocated_bytes[0].current == 4096);
  }
  CHECK(CCA::getDeviceStats(0).allocated_bytes[0].current == 0);

  // out of memory: the typed error with cachalot's report; observers first
  int observed = 0;
  CCA::attachOutOfMemoryObserver([&](int64_t dev, size_t size, size_t, size_t) {
    if (dev == 0 && size >= (size_t(1) << 50)) ++observed;
  });
  CHECK(throws<c10::OutOfMemoryError>([&] { CCA::raw_alloc(size_t(1) << 50); }, "CUDA out of memory. Tried to allocate"));
  CHECK(throws<c10::OutOfMemoryError>([&] { CCA::raw_alloc(size_t(1) << 50); }, "Largest free block"));
  CHECK(observed == 2);
  CHECK(CCA::getDeviceStats(0).num_ooms == 2);

  // memory fraction
  CCA::setMemoryFraction(0.25, 0);
  CHECK(CCA::getMemoryFraction(0) == 0.25);
  CHECK(throws<c10::Error>([&] { CCA::setMemoryFraction(1.5, 0); }, "outside"));
  CHECK(CCA::getMemoryFraction(0) == 0.25);
  CCA::setMemoryFraction(1.0, 0);

  // MemPool-style pool: create, route with a context filter, counts, release
  c10::MempoolId_t pool{0, 4242};
  CCA::createOrIncrefPool(0, pool);
  CHECK(CCA::getPoolUseCount(0, pool) == 1);
  CCA::beginAllocateToPool(0, pool, [](cudaStream_t) { return true; });
  CHECK(CCA::getPoolUseCount(0, pool) == 2);
  CHECK(throws<c10::Error>([&] { CCA::beginAllocateToPool(0, pool, [](cudaStream_t) { return true; }); },
                           "already recording"));
  void* in_pool = CCA::raw_alloc(3 << 20);
  CCA::endAllocateToPool(0, pool);
  CCA::releasePool(0, pool);
  CHECK(CCA::getPoolUseCount(0, pool) == 1);
  void* outside = CCA::raw_alloc(3 << 20);
  auto snap = CCA::snapshot(pool, true);
  CHECK(snap.segments.size() == 1);
  CHECK(snap.segments.size() == 1 && snap.segments[0].owner_private_pool_id == pool);
  CHECK(snap.segments.size() == 1 && snap.segments[0].address == reinterpret_cast<size_t>(in_pool));
  CHECK(CCA::checkPoolLiveAllocations(0, pool, {in_pool}));
  CHECK(!CCA::checkPoolLiveAllocations(0, pool, {}));
  CHECK(!CCA::checkPoolLiveAllocations(0, pool, {in_pool, outside}));
  CHECK(throws<c10::Error>([&] { CCA::checkPoolLiveAllocations(0, {0, 999999}, {}); }, "no mempool"));
  CCA::raw_delete(in_pool);
  CCA::raw_delete(outside);
  CCA::releasePool(0, pool);
  CHECK(CCA::getPoolUseCount(0, pool) == 0);
  CHECK(throws<c10::Error>([&] { CCA::releasePool(0, pool); }, "mempool"));
  CCA::emptyCache();
  CHECK(CCA::snapshot(pool, false).segments.empty());

  // a capture-kind registration (filter false before the capture begins)
  c10::MempoolId_t gpool{0, 4343};
  CCA::beginAllocateToPool(0, gpool, [](cudaStream_t) { return false; });
  CHECK(CCA::getPoolUseCount(0, gpool) == 1);
  CCA::endAllocateToPool(0, gpool);
  CHECK(throws<c10::Error>([&] { CCA::endAllocateToPool(0, gpool); }, "not currently recording"));
  CCA::releasePool(0, gpool);

  // history and snapshot
  CHECK(throws<c10::Error>([&] { CCA::recordHistory(true, nullptr, 1000, CCA::RecordContext::ALL, true, {}); },
                           "context recorder"));
  CCA::recordHistory(true, nullptr, 1000, CCA::RecordContext::NEVER, true, {});
  CHECK(CCA::isHistoryEnabled());
  void* h = CCA::raw_alloc(700);
  CCA::raw_delete(h);
  auto full = CCA::snapshot({0, 0}, true);
  CHECK(full.device_traces.size() == 1);
  bool saw_alloc = false, saw_free = false;
  for (const auto& te : full.device_traces[0]) {
    if (te.action_ == c10::CachingDeviceAllocator::TraceEntry::ALLOC && te.addr_ == reinterpret_cast<size_t>(h))
      saw_alloc = true;
    if (te.action_ == c10::CachingDeviceAllocator::TraceEntry::FREE_COMPLETED) saw_free = true;
  }
  CHECK(saw_alloc && saw_free);
  CHECK(full.config_metadata.roundup_power2_divisions.size() == 16);
  CHECK(full.config_metadata.last_allocator_settings.find("placement:pytorch") != std::string::npos);
  for (const auto& seg : full.segments) {
    size_t sum = 0;
    for (const auto& b : seg.blocks) sum += b.size;
    CHECK(sum == seg.total_size);
  }
  CCA::recordHistory(false, nullptr, 0, CCA::RecordContext::NEVER, false, {});
  CHECK(!CCA::isHistoryEnabled());
  history_checks();

  // the cache is on; use_on_oom turned off for a pool that is gone: nothing to do
  CHECK(CCA::isEnabled());
  CCA::setUseOnOOM(0, {0, 1}, false);

  checkpoints();
  ipc();

  if (failures == 0) std::printf("shim driver: ok\n");
  return failures == 0 ? 0 : 1;
}

// Contexts gathered as PyTorch's allocator gathers them, handed back by
// snapshot(); skip_actions; compile context, user metadata, annotations;
// the profiler's memory events.
static void history_checks() {
  using TE = c10::CachingDeviceAllocator::TraceEntry;
  CCA::emptyCache();
  // level all: allocations, frees and empty_cache gather
  CCA::recordHistory(true, &test_recorder, 1000, CCA::RecordContext::ALL, true, {});
  recorder_calls = 0;
  void* a = CCA::raw_alloc(3000);
  CHECK(recorder_calls == 1);
  int a_id = next_context - 1;
  {
    auto snap = CCA::snapshot({0, 0}, true);
    bool block = false, seg = false, entry = false;
    for (const auto& s : snap.segments) {
      size_t at = s.address;
      for (const auto& b : s.blocks) {
        if (at == reinterpret_cast<size_t>(a) && b.allocated) block = id_of(b.context_when_allocated) == a_id;
        at += b.size;
      }
      if (s.address <= reinterpret_cast<size_t>(a) && reinterpret_cast<size_t>(a) < s.address + s.total_size)
        // as PyTorch's: the split gave the segment's start to a new block,
        // without the segment's context
        seg = !s.context_when_allocated;
    }
    for (const auto& te : snap.device_traces[0]) {
      if (te.action_ == TE::ALLOC && te.addr_ == reinterpret_cast<size_t>(a)) {
        entry = id_of(te.context_) == a_id && te.size_ == 3000 && te.compile_context_ == "N/A";
      }
    }
    CHECK(block && seg && entry);
  }
  CCA::raw_delete(a);
  CHECK(recorder_calls == 2);
  int f_id = next_context - 1;
  CCA::emptyCache();
  CHECK(recorder_calls == 3);
  int e_id = next_context - 1;
  {
    auto snap = CCA::snapshot({0, 0}, true);
    int free_ctx = 0, seg_free_ctx = 0;
    for (const auto& te : snap.device_traces[0]) {
      if (te.action_ == TE::FREE_REQUESTED && te.addr_ == reinterpret_cast<size_t>(a)) free_ctx = id_of(te.context_);
      if (te.action_ == TE::SEGMENT_FREE || te.action_ == TE::SEGMENT_UNMAP) seg_free_ctx = id_of(te.context_);
    }
    CHECK(free_ctx == f_id);
    CHECK(seg_free_ctx == e_id);
    // the snapshot's own entry comes after it
    CHECK(!snap.device_traces[0].empty() && snap.device_traces[0].back().action_ != TE::SNAPSHOT);
  }
  // level state: allocations gather, frees do not, entries carry none
  CCA::recordHistory(true, &test_recorder, 1, CCA::RecordContext::STATE, true, {});
  recorder_calls = 0;
  void* b = CCA::raw_alloc(5000);
  CCA::raw_delete(b);
  CHECK(recorder_calls == 1);
  // skip_actions; an unknown one is refused and changes nothing
  CCA::recordHistory(true, &test_recorder, 1000, CCA::RecordContext::ALL, true, {"alloc", "free_requested"});
  CHECK(throws<c10::Error>([&] { CCA::recordHistory(true, &test_recorder, 1000, CCA::RecordContext::ALL, true, {"nope"}); },
                           "Unknown TraceEntry action: nope"));
  // compile context and user metadata, per thread
  std::string region = "Torch-Compiled Region: 0/0";
  CCA::pushCompileContext(region);
  CCA::setUserMetadata("metadata test");
  CHECK(CCA::getUserMetadata() == "metadata test");
  CCA::recordAnnotation({{"name", "fwd"}, {"stage", "START"}});
  void* c = CCA::raw_alloc(7000);
  CCA::popCompileContext();
  CCA::raw_delete(c);
  CCA::setUserMetadata("");
  {
    auto snap = CCA::snapshot({0, 0}, true);
    bool alloc = false, freed = false, completed = false;
    for (const auto& te : snap.device_traces[0]) {
      alloc |= te.action_ == TE::ALLOC;
      freed |= te.action_ == TE::FREE_REQUESTED;
      if (te.action_ == TE::FREE_COMPLETED && te.addr_ == reinterpret_cast<size_t>(c)) {
        completed = te.user_metadata_ == "metadata test" && te.compile_context_ == "N/A";
      }
    }
    CHECK(!alloc && !freed && completed);
    CHECK(snap.external_annotations.size() == 1 &&
          snap.external_annotations[0].metadata_.at("stage") == "START");
  }
  // without traces: no device list
  CHECK(CCA::snapshot({0, 0}, false).device_traces.empty());
  // off: every context released
  CCA::recordHistory(false, nullptr, 0, CCA::RecordContext::NEVER, false, {});
  CHECK(live_contexts == 0);

  // the profiler's memory events: +size and -size with the totals
  {
    auto reporter = std::make_shared<Reporter>();
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, reporter);
    void* p = CCA::raw_alloc(1000);
    { c10::DataPtr d = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(4096); }
    CCA::raw_delete(p);
    CHECK(throws<c10::OutOfMemoryError>([&] { CCA::raw_alloc(size_t(1) << 50); }, "out of memory"));
    CHECK(reporter->events.size() == 4);
    if (reporter->events.size() == 4) {
      const auto& e = reporter->events;
      CHECK(e[0].ptr == p && e[0].size == 1024 && e[0].allocated == 1024);
      CHECK(e[1].size == 4096 && e[1].allocated == 1024 + 4096);
      CHECK(e[2].ptr == e[1].ptr && e[2].size == -4096 && e[2].allocated == 1024);
      CHECK(e[3].ptr == p && e[3].size == -1024 && e[3].allocated == 0);
      CHECK(e[0].reserved >= e[0].allocated);
    }
    CHECK(reporter->ooms == 1);
  }
}
