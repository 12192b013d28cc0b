// cachalot behind PyTorch's own allocator interface: a subclass of
// c10::cuda::CUDACachingAllocator::CUDAAllocator whose every method forwards
// to cachalot's C ABI (crates/cachalot-capi/include/cachalot.h). All
// allocator logic is in Rust; this file converts types, keeps the
// std::function objects PyTorch hands over (pool filters, OOM observers),
// and throws PyTorch's exception types. Built against the installed torch
// by cachalot_torch/_build.py (the vtable is not a stable ABI).
//
// Typed errors a user sees:
//   out of memory                    -> torch.OutOfMemoryError (PyTorch's text,
//                                       then cachalot's report)
//   a settings string cachalot refuses -> ValueError ("cachalot: ...")
//   anything else cachalot refuses   -> RuntimeError ("cachalot: <call>: <message>")
//
// Memory history (namespace hist): PyTorch's recordHistory hands over a
// recorder (CapturedTraceback::gather); as PyTorch's own allocator, the shim
// calls it outside every lock (allocation: level state and above; free and
// empty_cache: level all) and passes the result to cachalot as an opaque
// context (cachalot_context_enter/exit) that cachalot keeps with blocks,
// segments and trace entries. snapshot() hands the very shared_ptrs back,
// and PyTorch's own snapshot code symbolizes them into frames. With the
// history off the only cost is one relaxed atomic load per allocation and
// free. The profiler's memory events (namespace profile): reported on each
// allocation and free while the thread's profiler records memory.

#include <c10/core/Allocator.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/ApproximateClock.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "cachalot.h"

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::Stat;

namespace {

std::string last_error() {
  const char* m = cachalot_last_error();
  return m ? std::string(m) : std::string("unknown error");
}

// The messages of the errors the shim raises are built as one std::string
// and handed to TORCH_CHECK alone: with several arguments c10::str formats
// them through a std::ostringstream instantiated in this library, which
// crashed (SIGSEGV in ostream::_M_insert<long>) inside PyTorch's Python
// process on the GPU machine, where the string alone goes through as is.
std::string failure(int rc) {
  return "cachalot: " + last_error() + " (code " + std::to_string(rc) + ")";
}

#define CACHALOT_CHECK(call)                 \
  do {                                       \
    int rc_ = (call);                        \
    TORCH_CHECK(rc_ == CACHALOT_OK, failure(rc_)); \
  } while (0)

// ----- memory history: contexts -----
namespace hist {

// PyTorch's RecordContext while the history is on and a recorder was given
// (0: gather nothing), and the recorder.
std::atomic<int> level{0};
std::atomic<CCA::CreateContextFn> recorder{nullptr};

constexpr int kState = static_cast<int>(CCA::RecordContext::STATE);
constexpr int kAll = static_cast<int>(CCA::RecordContext::ALL);

using Ctx = std::shared_ptr<c10::GatheredContext>;

void release(void* data) { delete static_cast<Ctx*>(data); }

// The context PyTorch gathered, from a `data` pointer of a snapshot.
Ctx from_data(void* data) { return data ? *static_cast<const Ctx*>(data) : Ctx(); }

// Gathers a context when the level asks for it at `need` and makes it the
// thread's context for cachalot's calls until the scope ends. Runs the
// recorder before any cachalot call: no allocator lock is held (the
// recorder takes the GIL).
class Scope {
 public:
  explicit Scope(int need) {
    if (level.load(std::memory_order_relaxed) < need) return;
    CCA::CreateContextFn fn = recorder.load(std::memory_order_relaxed);
    if (!fn) return;
    Ctx ctx = fn();
    if (!ctx) return;
    // (cachalot owns it from here, also when the call fails)
    entered_ = cachalot_context_enter({new Ctx(std::move(ctx)), &release}) == CACHALOT_OK;
  }
  ~Scope() {
    if (entered_) cachalot_context_exit();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool entered_ = false;
};

}  // namespace hist

// ----- the profiler's memory events -----
namespace profile {

c10::Device cuda(int device) {
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
}

// After an allocation of `p`: +block size, with the device's totals.
void report_alloc(void* p) {
  int device = 0;
  uint64_t size = 0, allocated = 0, reserved = 0;
  if (!p || cachalot_block_lookup(p, &device, &size) != CACHALOT_OK) return;
  if (cachalot_memory_totals(device, &allocated, &reserved) != CACHALOT_OK) return;
  c10::reportMemoryUsageToProfiler(p, static_cast<int64_t>(size), allocated, reserved, cuda(device));
}

// A free of `p` (the block size read before), reported after it.
struct Free {
  explicit Free(void* p) : p_(p) {
    live_ = p && cachalot_block_lookup(p, &device_, &size_) == CACHALOT_OK;
  }
  void report() const {
    uint64_t allocated = 0, reserved = 0;
    if (!live_ || cachalot_memory_totals(device_, &allocated, &reserved) != CACHALOT_OK) return;
    c10::reportMemoryUsageToProfiler(p_, -static_cast<int64_t>(size_), allocated, reserved,
                                     cuda(device_));
  }

 private:
  void* p_;
  bool live_ = false;
  int device_ = 0;
  uint64_t size_ = 0;
};

void report_oom(c10::DeviceIndex device, size_t size) {
  if (!c10::memoryProfilingEnabled()) return;
  uint64_t allocated = 0, reserved = 0;
  if (cachalot_memory_totals(device, &allocated, &reserved) != CACHALOT_OK) return;
  c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), allocated, reserved, cuda(device));
}

}  // namespace profile

// A free with the history gathering frees' contexts or the profiler on.
int delete_observed(void* ptr) {
  const bool profiling = c10::memoryProfilingEnabled();
  std::optional<profile::Free> ev;
  if (profiling) ev.emplace(ptr);
  int rc;
  {
    hist::Scope scope(hist::kAll);
    rc = cachalot_raw_delete(ptr, -1);
  }
  if (rc == CACHALOT_OK && ev) ev->report();
  return rc;
}

// Every free: the deleter of every tensor and raw_delete.
inline int delete_entry(void* ptr) {
  if (C10_UNLIKELY(hist::level.load(std::memory_order_relaxed) >= hist::kAll ||
                   c10::memoryProfilingEnabled())) {
    return delete_observed(ptr);
  }
  return cachalot_raw_delete(ptr, -1);
}

void delete_fn(void* ptr) {
  int rc = delete_entry(ptr);
  if (rc != CACHALOT_OK) {
    // a deleter cannot throw
    std::fprintf(stderr, "cachalot: %s\n", last_error().c_str());
  }
}

cachalot_stream_t raw(cudaStream_t s) {
  return reinterpret_cast<cachalot_stream_t>(s);
}

void fill(Stat& d, const cachalot_stat_t& s) {
  d.current = s.current;
  d.peak = s.peak;
  d.allocated = s.allocated;
  d.freed = s.freed;
}

void fill3(c10::CachingDeviceAllocator::StatArray& d, const cachalot_stat_t* s) {
  for (size_t i = 0; i < 3; ++i) fill(d[i], s[i]);
}

// ----- a pool backed by a user's allocator (MemPool(allocator=...)) -----
// cachalot calls these with its device lock held, on the allocating thread
// (PyTorch's CUDAPluggableAllocator reads the current device and stream);
// the context keeps the user's allocator alive until the pool is deleted.
using UserAllocator = std::shared_ptr<CCA::CUDAAllocator>;

void copy_err(char* err, size_t len, const char* m) {
  if (err && len) std::snprintf(err, len, "%s", m);
}

int source_alloc(void* ctx, size_t size, uint64_t* addr, char* err, size_t errlen) {
  try {
    *addr = reinterpret_cast<uint64_t>((*static_cast<UserAllocator*>(ctx))->raw_alloc(size));
    return 0;
  } catch (const std::exception& e) {
    copy_err(err, errlen, e.what());
    return 1;
  }
}

int source_free(void* ctx, uint64_t addr, size_t, char* err, size_t errlen) {
  try {
    (*static_cast<UserAllocator*>(ctx))->raw_delete(reinterpret_cast<void*>(addr));
    return 0;
  } catch (const std::exception& e) {
    copy_err(err, errlen, e.what());
    return 1;
  }
}

void source_release(void* ctx) { delete static_cast<UserAllocator*>(ctx); }

// ----- allocator trace trackers (NCCL's buffer registration) -----
// cachalot calls on_segment for every segment event of every device, with
// its device lock held; each tracker PyTorch attached gets a TraceEntry.
std::mutex g_trackers_mu;
std::vector<CCA::AllocatorTraceTracker> g_trackers;

void on_segment(void*, const cachalot_segment_event_t* e) {
  using c10::CachingDeviceAllocator::TraceEntry;
  std::vector<CCA::AllocatorTraceTracker> ts;
  {
    std::lock_guard<std::mutex> g(g_trackers_mu);
    ts = g_trackers;
  }
  c10::approx_time_t now = c10::getApproximateTime();
  TraceEntry te(static_cast<TraceEntry::Action>(e->action), static_cast<c10::DeviceIndex>(e->device),
                e->addr, e->size, reinterpret_cast<void*>(e->stream), {e->pool_hi, e->pool_lo}, now);
  for (auto& t : ts) {
    try {
      t(te);
    } catch (const std::exception& ex) {
      // a callback under cachalot's lock cannot throw through it
      std::fprintf(stderr, "cachalot: an allocator trace tracker threw: %s\n", ex.what());
    }
  }
}

// ----- settings set from Python -----
// torch.cuda.memory._set_allocator_settings (torch._C._accelerator_
// setAllocatorSettings) parses into PyTorch's config singletons and calls
// one device parser hook. Chained after PyTorch's own, ours forwards every
// string PyTorch accepted to cachalot at once; the keys only cachalot
// knows are registered with PyTorch's parsers so that they pass there
// (in PYTORCH_CUDA_ALLOC_CONF too).
void forward_settings(const std::string& env) {
  if (cachalot_set_config(env.c_str()) != CACHALOT_OK) {
    TORCH_CHECK_VALUE(false, "cachalot: " + last_error());
  }
}

void install_settings_hook() {
  using c10::CachingAllocator::AcceleratorAllocatorConfig;
  static std::once_flag once;
  std::call_once(once, [] {
    std::unordered_set<std::string> mine;
    const auto& known = AcceleratorAllocatorConfig::getKeys();
    const char* keys = cachalot_config_keys();
    std::string all = keys ? keys : "";
    size_t at = 0;
    while (at <= all.size()) {
      size_t comma = all.find(',', at);
      if (comma == std::string::npos) comma = all.size();
      std::string k = all.substr(at, comma - at);
      if (!k.empty() && known.count(k) == 0) mine.insert(k);
      at = comma + 1;
    }
    auto prev = AcceleratorAllocatorConfig::getConfigParserHook();
    AcceleratorAllocatorConfig::registerDeviceConfigParserHook(
        [prev](const std::string& env) {
          if (prev) prev(env);
          forward_settings(env);
        },
        mine);
    // PyTorch parses PYTORCH_CUDA_ALLOC_CONF on first use of each config:
    // now, while the allocator is still PyTorch's (its `backend:` check
    // compares with the current allocator's name)
    (void)c10::CachingAllocator::getAllocatorSettings();
    (void)c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::release_lock_on_cudamalloc();
  });
}

// What _snapshot()["allocator_settings"] shows: cachalot's configuration
// (devices in use or not), and PyTorch's for the pinned keys (they
// configure PyTorch's host allocator, which cachalot does not replace).
void fill_settings(CCA::AllocatorConfigInfo& c) {
  c10::DeviceIndex device = 0;
  (void)c10::cuda::GetDevice(&device);
  cachalot_config_info_t k;
  CACHALOT_CHECK(cachalot_current_config(device, &k));
  c.garbage_collection_threshold = k.garbage_collection_threshold;
  c.max_split_size = static_cast<size_t>(k.max_split_size);
  c.expandable_segments = k.expandable_segments != 0;
  c.release_lock_on_malloc = k.release_lock_on_malloc != 0;
  c.graph_capture_record_stream_reuse = k.graph_capture_record_stream_reuse != 0;
  c.last_allocator_settings = k.last_config ? k.last_config : "";
  c.roundup_power2_divisions.assign(k.roundup_power2_divisions, k.roundup_power2_divisions + 16);
  c.pinned_num_register_threads = CCA::CUDAAllocatorConfig::pinned_num_register_threads();
  c.pinned_use_host_register = CCA::CUDAAllocatorConfig::pinned_use_cuda_host_register();
}

// A use_mem_pool-style pool context: PyTorch's filter, evaluated here at
// each allocation (see crates/cachalot-capi/src/drop_in.rs, "Pools").
struct PoolContext {
  c10::DeviceIndex device;
  c10::MempoolId_t id;
  std::function<bool(cudaStream_t)> filter;
};

// ----- pool checkpoints (cudagraph trees) -----
// getCheckpointState's value: cachalot's checkpoint of a private pool (the
// layout of every segment, crates/cachalot-core/src/engine/checkpoint.rs).
// cudagraph trees keep it after every recording and hand it back to
// setCheckpointPoolState when the path through the tree diverges.
struct CachalotCheckpointState final : CCA::AllocatorState {
  explicit CachalotCheckpointState(cachalot_checkpoint_t* h) : handle(h) {}
  ~CachalotCheckpointState() override { cachalot_checkpoint_free(handle); }
  CachalotCheckpointState(const CachalotCheckpointState&) = delete;
  CachalotCheckpointState& operator=(const CachalotCheckpointState&) = delete;
  cachalot_checkpoint_t* handle;
};

std::shared_ptr<CCA::AllocatorState> checkpoint_pool(c10::DeviceIndex device,
                                                     c10::MempoolId_t id) {
  cachalot_checkpoint_t* h = nullptr;
  CACHALOT_CHECK(cachalot_pool_checkpoint(device, id.first, id.second, &h));
  return std::make_shared<CachalotCheckpointState>(h);
}

// The restore: the blocks the pool had allocated are freed (ptrs_freed),
// the checkpoint's allocated blocks are allocated again at their addresses
// and come back as DataPtrs whose deleter is the allocator's own
// (raw_deleter(), context = the address), so that the binding can hand
// them to the storages cudagraph trees rebuilt, or release their context
// for a later raw_delete.
CCA::CheckpointDelta restore_pool(c10::DeviceIndex device,
                                  const std::shared_ptr<CCA::AllocatorState>& state,
                                  c10::DeleterFnPtr deleter) {
  auto* s = dynamic_cast<CachalotCheckpointState*>(state.get());
  TORCH_CHECK(s != nullptr,
              "cachalot: setCheckpointPoolState: the state is not a checkpoint cachalot made");
  cachalot_checkpoint_delta_t* raw_delta = nullptr;
  CACHALOT_CHECK(cachalot_pool_restore(device, s->handle, &raw_delta));
  std::unique_ptr<cachalot_checkpoint_delta_t, void (*)(cachalot_checkpoint_delta_t*)> d(
      raw_delta, &cachalot_checkpoint_delta_free);
  CCA::CheckpointDelta out;
  out.ptrs_freed.assign(d->freed, d->freed + d->num_freed);
  out.dataptrs_allocd.reserve(d->num_allocated);
  for (size_t i = 0; i < d->num_allocated; ++i) {
    void* p = d->allocated[i];
    out.dataptrs_allocd.emplace_back(p, p, deleter, c10::Device(c10::DeviceType::CUDA, device));
  }
  return out;
}

// ----- CUDA IPC (torch.multiprocessing) -----
// PyTorch 2.11's wire format, written and read by cachalot
// (crates/cachalot-capi/src/ipc.rs), so that the other process may run
// either allocator.
CCA::ShareableHandle share_ipc(void* ptr) {
  std::string h(256, '\0');
  size_t len = 0;
  uint64_t offset = 0;
  auto share = [&] {
    return cachalot_ipc_share(ptr, -1, reinterpret_cast<uint8_t*>(h.data()), h.size(), &len,
                              &offset);
  };
  int rc = share();
  if (rc == CACHALOT_ERR_INVALID_ARGUMENT && len > h.size()) {
    h.resize(len);
    rc = share();
  }
  CACHALOT_CHECK(rc);
  h.resize(len);
  return {static_cast<ptrdiff_t>(offset), std::move(h)};
}

// The mapping of another process's handle, shared by every storage made
// from it; the last owner unmaps it (cachalot counts the users of each
// handle in this process, as CUDA opens a handle once per process).
std::shared_ptr<void> open_ipc(c10::DeviceIndex device, const std::string& handle) {
  void* p = nullptr;
  CACHALOT_CHECK(cachalot_ipc_open(device, reinterpret_cast<const uint8_t*>(handle.data()),
                                   handle.size(), &p));
  return std::shared_ptr<void>(p, [device](void* q) {
    if (cachalot_ipc_close(device, q) != CACHALOT_OK) {
      std::fprintf(stderr, "cachalot: %s\n", last_error().c_str());  // a deleter cannot throw
    }
  });
}

// PyTorch's FreeCudaMemoryCallbacksRegistry ("cuda_ipc_collect": blocks
// another process held, freed once it let go), run before an out of memory
// is final, as PyTorch's allocator does; true when one freed something.
bool run_free_memory_callbacks() {
  bool freed = false;
  for (const auto& name : c10::FreeCudaMemoryCallbacksRegistry()->Keys()) {
    freed |= c10::FreeCudaMemoryCallbacksRegistry()->Create(name)->Execute();
  }
  return freed;
}

class CachalotAllocator final : public CCA::CUDAAllocator {
 public:
  using CCA::CUDAAllocator::recordStream;

  // ----- c10::Allocator -----
  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    void* p = nullptr;
    if (size != 0) {
      p = alloc_entry(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
    }
    return {p, p, &delete_fn, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_fn; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ----- c10::DeviceAllocator -----
  bool initialized() override { return initialized_.load(); }
  void emptyCache(c10::MempoolId_t id) override {
    // a private pool's free segments go when its last use is released
    // (releasePool); (0,0) empties every device, as PyTorch does
    if (id.first == 0 && id.second == 0) {
      hist::Scope scope(hist::kAll);  // (segment_free entries carry it)
      CACHALOT_CHECK(cachalot_empty_cache(-1));
    }
  }
  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    cachalot_device_stats_t s;
    CACHALOT_CHECK(cachalot_get_stats(device, &s, sizeof(s)));
    DeviceStats d;
    fill3(d.allocation, s.allocation);
    fill3(d.segment, s.segment);
    fill3(d.active, s.active);
    fill3(d.inactive_split, s.inactive_split);
    fill3(d.allocated_bytes, s.allocated_bytes);
    fill3(d.reserved_bytes, s.reserved_bytes);
    fill3(d.active_bytes, s.active_bytes);
    fill3(d.inactive_split_bytes, s.inactive_split_bytes);
    fill3(d.requested_bytes, s.requested_bytes);
    fill(d.oversize_allocations, s.oversize_allocations);
    fill(d.oversize_segments, s.oversize_segments);
    d.num_alloc_retries = s.num_alloc_retries;
    d.num_ooms = s.num_ooms;
    d.num_sync_all_streams = s.num_sync_all_streams;
    d.num_device_alloc = s.num_device_alloc;
    d.num_device_free = s.num_device_free;
    d.max_split_size = s.max_split_size;
    return d;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    CACHALOT_CHECK(cachalot_reset_accumulated_stats(device));
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    CACHALOT_CHECK(cachalot_reset_peak_stats(device));
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    size_t free = 0, total = 0;
    CACHALOT_CHECK(cachalot_mem_get_info(device, &free, &total));
    return {free, total};
  }

  // ----- CUDAAllocator -----
  void* raw_alloc(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return alloc_entry(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) return nullptr;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return alloc_entry(nbytes, device, stream);
  }
  void raw_delete(void* ptr) override { CACHALOT_CHECK(delete_entry(ptr)); }
  void init(int /*device_count*/) override { initialized_.store(true); }
  double getMemoryFraction(c10::DeviceIndex device) override {
    double f = 1.0;
    CACHALOT_CHECK(cachalot_get_memory_fraction(device, &f));
    return f;
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    CACHALOT_CHECK(cachalot_set_memory_fraction(device, fraction));
  }
  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return {};
  }
  void enable(bool value) override { CACHALOT_CHECK(cachalot_caching_enable(value ? 1 : 0)); }
  bool isEnabled() const override {
    int on = 1;
    CACHALOT_CHECK(cachalot_caching_enabled(&on));
    return on != 0;
  }
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    CACHALOT_CHECK(cachalot_cache_info(device, largestBlock));
  }
  // (legacy IPC helper) the block itself is the unit cachalot shares: its
  // start and size; an unknown pointer is PyTorch's error
  void* getBaseAllocation(void* ptr, size_t* size) override {
    int device = 0;
    uint64_t bytes = 0;
    TORCH_CHECK(cachalot_block_lookup(ptr, &device, &bytes) == CACHALOT_OK,
                "invalid device pointer: " + std::to_string(reinterpret_cast<uintptr_t>(ptr)));
    if (size) *size = static_cast<size_t>(bytes);
    return ptr;
  }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get() || ptr.get_deleter() != &delete_fn) return;  // not ours (or empty)
    CACHALOT_CHECK(cachalot_record_stream(ptr.get(), stream.device_index(), raw(stream.stream())));
  }
  CCA::SnapshotInfo snapshot(c10::MempoolId_t id, bool include_traces) override;

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    {
      // as PyTorch: one registration per pool at a time
      std::lock_guard<std::mutex> g(ctx_mu_);
      for (const auto& c : contexts_) {
        TORCH_CHECK(!(c.device == device && c.id == id),
                    "cachalot: beginAllocateToPool: already recording to mempool (" +
                        std::to_string(id.first) + ", " + std::to_string(id.second) + ")");
      }
    }
    cudaStream_t cur = c10::cuda::getCurrentCUDAStream(device).stream();
    if (!filter(cur)) {
      // a graph capture's filter (true only once the stream captures)
      CACHALOT_CHECK(cachalot_pool_begin(device, id.first, id.second, raw(cur)));
      return;
    }
    // a context's filter (same thread, or always): cachalot routes what the
    // filter accepts, checked at each allocation
    CACHALOT_CHECK(cachalot_pool_create_or_incref(device, id.first, id.second));
    std::lock_guard<std::mutex> g(ctx_mu_);
    contexts_.push_back({device, id, std::move(filter)});
    n_contexts_.store(contexts_.size());
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    {
      std::lock_guard<std::mutex> g(ctx_mu_);
      for (auto it = contexts_.rbegin(); it != contexts_.rend(); ++it) {
        if (it->device == device && it->id == id) {
          contexts_.erase(std::next(it).base());
          n_contexts_.store(contexts_.size());
          return;
        }
      }
    }
    CACHALOT_CHECK(cachalot_pool_end(device, id.first, id.second));
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    CACHALOT_CHECK(cachalot_pool_release(device, id.first, id.second));
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) override {
    int n = 0;
    CACHALOT_CHECK(cachalot_pool_use_count(device, id.first, id.second, &n));
    return n;
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<CCA::CUDAAllocator> allocator) override {
    if (!allocator) {
      CACHALOT_CHECK(cachalot_pool_create_or_incref(device, id.first, id.second));
      return;
    }
    // every segment of the pool from the user's allocator; cachalot
    // releases the context (and with it the allocator) when the pool goes
    auto* ctx = new UserAllocator(std::move(allocator));
    CACHALOT_CHECK(cachalot_pool_create_with_source(device, id.first, id.second, &source_alloc,
                                                    &source_free, &source_release, ctx));
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) override {
    CACHALOT_CHECK(cachalot_pool_set_use_on_oom(device, id.first, id.second, use_on_oom ? 1 : 0));
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) override {
    CACHALOT_CHECK(cachalot_pool_set_no_split(device, id.first, id.second));
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    std::vector<const void*> v(expected.begin(), expected.end());
    int ok = 0;
    CACHALOT_CHECK(cachalot_pool_check_live(device, id.first, id.second, v.data(), v.size(), &ok));
    return ok != 0;
  }
  CCA::ShareableHandle shareIpcHandle(void* ptr) override { return share_ipc(ptr); }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    return open_ipc(current_device(), handle);
  }
  bool isHistoryEnabled() override {
    int on = 0;
    CACHALOT_CHECK(cachalot_history_enabled(current_device(), &on));
    return on != 0;
  }
  void recordHistory(bool enabled, CCA::CreateContextFn context_recorder, size_t max_entries,
                     CCA::RecordContext when, bool clear,
                     const std::vector<std::string>& skip_actions) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override;
  void pushCompileContext(std::string& md) override;
  void popCompileContext() override;
  void setUserMetadata(const std::string& metadata) override;
  std::string getUserMetadata() override;
  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(obs_mu_);
    observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
    bool first = false;
    {
      std::lock_guard<std::mutex> g(g_trackers_mu);
      first = g_trackers.empty();
      g_trackers.push_back(std::move(tracker));
    }
    if (first) CACHALOT_CHECK(cachalot_attach_segment_tracker(&on_segment, nullptr));
  }
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
  }
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                          size_t count, cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dstDevice == srcDevice) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }
  std::shared_ptr<CCA::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override {
    return checkpoint_pool(device, id);
  }
  CCA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<CCA::AllocatorState> pps) override {
    return restore_pool(device, pps, &delete_fn);
  }
  std::string name() override { return "cachalot"; }

 private:
  static c10::DeviceIndex current_device() {
    c10::DeviceIndex d = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&d));
    return d;
  }

  void* alloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    void* p = nullptr;
    int rc;
    const PoolContext* ctx = nullptr;
    c10::MempoolId_t pool{0, 0};
    if (n_contexts_.load(std::memory_order_relaxed) != 0) {
      std::lock_guard<std::mutex> g(ctx_mu_);
      for (auto it = contexts_.rbegin(); it != contexts_.rend(); ++it) {
        if (it->device == device && it->filter(stream)) {
          ctx = &*it;
          pool = it->id;
          break;
        }
      }
    }
    auto attempt = [&] {
      return ctx ? cachalot_alloc_in_pool(size, device, raw(stream), pool.first, pool.second, &p)
                 : cachalot_alloc(size, device, raw(stream), &p);
    };
    rc = attempt();
    if (rc == CACHALOT_ERR_OUT_OF_MEMORY && run_free_memory_callbacks()) rc = attempt();
    if (rc == CACHALOT_OK) return p;
    std::string msg = last_error();
    if (rc == CACHALOT_ERR_OUT_OF_MEMORY || rc == CACHALOT_ERR_NEVER_FITS) {
      profile::report_oom(device, size);
      notify_oom(device, size);
      // drop the "cachalot_alloc: " prefix: PyTorch's text comes first,
      // then cachalot's report
      auto colon = msg.find(": ");
      if (colon != std::string::npos) msg = msg.substr(colon + 2);
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    }
    TORCH_CHECK(false, "cachalot: " + msg + " (code " + std::to_string(rc) + ")");
  }

  // Every allocation: with the history gathering, under a context scope;
  // the profiler's event after it.
  void* alloc_entry(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    void* p;
    if (C10_UNLIKELY(hist::level.load(std::memory_order_relaxed) != 0)) {
      hist::Scope scope(hist::kState);
      p = alloc_on(size, device, stream);
    } else {
      p = alloc_on(size, device, stream);
    }
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) profile::report_alloc(p);
    return p;
  }

  void notify_oom(c10::DeviceIndex device, size_t size) {
    std::vector<CCA::OutOfMemoryObserver> obs;
    {
      std::lock_guard<std::mutex> g(obs_mu_);
      obs = observers_;
    }
    if (obs.empty()) return;
    size_t free = 0, total = 0;
    double fraction = 1.0;
    (void)cachalot_mem_get_info(device, &free, &total);
    (void)cachalot_get_memory_fraction(device, &fraction);
    size_t allowed = fraction < 1.0 ? static_cast<size_t>(fraction * total) : total;
    for (auto& o : obs) o(device, size, allowed, free);
  }

  std::atomic<bool> initialized_{false};
  std::mutex ctx_mu_;
  std::vector<PoolContext> contexts_;
  std::atomic<size_t> n_contexts_{0};
  std::mutex obs_mu_;
  std::vector<CCA::OutOfMemoryObserver> observers_;
};

CCA::SnapshotInfo CachalotAllocator::snapshot(c10::MempoolId_t id, bool include_traces) {
  using c10::CachingDeviceAllocator::AnnotationEntry;
  using c10::CachingDeviceAllocator::BlockInfo;
  using c10::CachingDeviceAllocator::SegmentInfo;
  using c10::CachingDeviceAllocator::TraceEntry;
  CCA::SnapshotInfo out;
  int n = cachalot_device_count();
  TORCH_CHECK(n >= 0, "cachalot: " + last_error());
  // one list per device with traces; none without (as PyTorch)
  if (include_traces) out.device_traces.resize(n);
  for (int d = 0; d < n; ++d) {
    cachalot_snapshot_t* s = nullptr;
    CACHALOT_CHECK(cachalot_snapshot(d, id.first, id.second, include_traces ? 1 : 0, &s));
    if (!s) continue;  // device not in use
    // released on every path (the context pointers are valid until then)
    std::unique_ptr<cachalot_snapshot_t, void (*)(cachalot_snapshot_t*)> own(s, &cachalot_snapshot_free);
    for (size_t i = 0; i < s->num_segments; ++i) {
      const cachalot_segment_t& g = s->segments[i];
      SegmentInfo seg;
      seg.device = static_cast<c10::DeviceIndex>(g.device);
      seg.address = g.address;
      seg.total_size = g.total_size;
      seg.requested_size = g.requested_size;
      seg.allocated_size = g.allocated_size;
      seg.active_size = g.active_size;
      seg.stream = reinterpret_cast<void*>(g.stream);
      seg.is_large = g.is_small == 0;
      seg.is_expandable = g.is_expandable != 0;
      seg.owner_private_pool_id = {g.pool_hi, g.pool_lo};
      seg.context_when_allocated = hist::from_data(g.context);
      for (uint64_t b = g.first_block; b < g.first_block + g.num_blocks && b < s->num_blocks; ++b) {
        const cachalot_block_t& k = s->blocks[b];
        BlockInfo bi;
        bi.size = k.size;
        bi.requested_size = k.requested_size;
        bi.allocated = k.state == 0;
        bi.active = k.state != 2;
        bi.context_when_allocated = hist::from_data(k.context);
        seg.blocks.push_back(std::move(bi));
      }
      out.segments.push_back(std::move(seg));
    }
    if (include_traces) {
      for (size_t i = 0; i < s->num_traces; ++i) {
        const cachalot_trace_t& t = s->traces[i];
        TraceEntry te(static_cast<TraceEntry::Action>(t.action), static_cast<c10::DeviceIndex>(d),
                      t.addr, t.size, reinterpret_cast<void*>(t.stream), {0, 0}, 0,
                      hist::from_data(t.context),
                      t.compile_context ? t.compile_context : "N/A",
                      t.user_metadata ? t.user_metadata : "");
        te.time_.t_ = static_cast<c10::time_t>(t.time_us);
        out.device_traces[d].push_back(std::move(te));
      }
      for (size_t i = 0; i < s->num_annotations; ++i) {
        const cachalot_annotation_t& a = s->annotations[i];
        AnnotationEntry ae(static_cast<c10::DeviceIndex>(a.device), 0);
        for (size_t j = 0; j < a.num_pairs; ++j) ae.recordUserMetadata(a.keys[j], a.values[j]);
        ae.time_.t_ = static_cast<c10::time_t>(a.time_us);
        out.external_annotations.push_back(std::move(ae));
      }
    }
  }
  fill_settings(out.config_metadata);
  return out;
}

// ----- memory history (torch.cuda.memory._record_memory_history) -----

void CachalotAllocator::recordHistory(bool enabled, CCA::CreateContextFn context_recorder,
                                      size_t max_entries, CCA::RecordContext when, bool clear,
                                      const std::vector<std::string>& skip_actions) {
  TORCH_CHECK(when == CCA::RecordContext::NEVER || context_recorder,
              "cachalot: recordHistory: a context recorder is needed to record contexts");
  std::vector<const char*> names;
  names.reserve(skip_actions.size());
  for (const auto& a : skip_actions) names.push_back(a.c_str());
  const int level = enabled ? static_cast<int>(when) : 0;
  // every device, as PyTorch (cachalot checks the names first: an unknown
  // action changes nothing)
  CACHALOT_CHECK(cachalot_history_configure(-1, enabled ? 1 : 0, max_entries, level, clear ? 1 : 0,
                                            names.data(), names.size()));
  hist::recorder.store(enabled ? context_recorder : nullptr, std::memory_order_relaxed);
  hist::level.store(enabled && context_recorder ? level : 0, std::memory_order_relaxed);
}

void CachalotAllocator::recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) {
  std::vector<const char*> keys, values;
  keys.reserve(md.size());
  values.reserve(md.size());
  for (const auto& kv : md) {
    keys.push_back(kv.first.c_str());
    values.push_back(kv.second.c_str());
  }
  CACHALOT_CHECK(cachalot_history_record_annotation(current_device(), keys.data(), values.data(),
                                                    md.size()));
}

void CachalotAllocator::pushCompileContext(std::string& md) {
  CACHALOT_CHECK(cachalot_history_push_compile_context(md.c_str()));
}

void CachalotAllocator::popCompileContext() { cachalot_history_pop_compile_context(); }

void CachalotAllocator::setUserMetadata(const std::string& metadata) {
  CACHALOT_CHECK(cachalot_history_set_user_metadata(metadata.c_str()));
}

std::string CachalotAllocator::getUserMetadata() { return cachalot_history_user_metadata(); }

CachalotAllocator* g_allocator = nullptr;  // never destroyed: tensors may outlive static destructors

void copy_msg(char* err, size_t len, const std::string& m) {
  if (!err || len == 0) return;
  std::snprintf(err, len, "%s", m.c_str());
}

}  // namespace

// Makes cachalot PyTorch's CUDA allocator: both the atomic every
// torch.cuda call goes through and the c10 registry torch.accelerator
// reads. Must run before CUDA initializes. 0 = installed (or already), 1 =
// the current allocator is already initialized, 2 = cachalot refused
// (message in err).
extern "C" int cachalot_torch_install(const char* config, char* err, size_t errlen) {
  try {
    auto* cur = CCA::allocator.load();
    if (g_allocator && cur == g_allocator) return 0;
    if (cur && cur->initialized()) {
      copy_msg(err, errlen,
               "the CUDA allocator is already initialized: call cachalot_torch.install() "
               "before anything initializes CUDA (the first CUDA tensor, torch.cuda.init(), "
               "get_device_properties, ...)");
      return 1;
    }
    // CACHALOT_TORCH_BACKEND=mock: the mock device, for tests without a GPU.
    // Chosen, not set up: the driver is first touched when PyTorch first
    // uses CUDA, as natively (import torch, a fork before CUDA, a process
    // with no GPU stay as they are)
    const char* backend = std::getenv("CACHALOT_TORCH_BACKEND");
    if (cachalot_select(backend && *backend ? backend : "cuda") != CACHALOT_OK) {
      copy_msg(err, errlen, last_error());
      return 2;
    }
    if (config && *config && cachalot_set_config(config) != CACHALOT_OK) {
      copy_msg(err, errlen, last_error());
      return 2;
    }
    install_settings_hook();
    if (!g_allocator) g_allocator = new CachalotAllocator();
    CCA::allocator.store(g_allocator);
    c10::SetAllocator(c10::DeviceType::CUDA, g_allocator, /*priority=*/0);
    return 0;
  } catch (const std::exception& e) {
    copy_msg(err, errlen, e.what());
    return 2;
  }
}

// 1 when cachalot is the current allocator.
extern "C" int cachalot_torch_installed() {
  return g_allocator && CCA::allocator.load() == g_allocator ? 1 : 0;
}
