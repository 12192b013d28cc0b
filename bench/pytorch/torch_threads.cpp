// The multi-thread benchmark of `cachalot threads` (cachalot_core::replay::
// threads_bench), run against PyTorch's own C++ caching allocator
// (c10::cuda::CUDACachingAllocator): the same workload, the same random
// numbers, the same timing, so the two print comparable lines in one run.
//
// For each thread count T: T new non-blocking streams and an emptied cache
// (cachalot opens a fresh allocator per T); each thread t owns stream t and
// 64 slots; an operation draws a slot (splitmix64 % 64) and frees it when
// occupied, else fills it with 512 << (splitmix64 % 12) bytes; at the end a
// thread frees what it still holds. A warm-up of 20,000 operations per
// thread fills the caches, then OPS operations per thread are timed, from
// before the threads start until all have joined. One JSON line per T:
//   {"threads":T,"ops":T*OPS,"mops_per_s":...,"mode":...,"alloc_conf":...}
//
// usage: torch_threads [--threads=1,2,4,8,16] [--ops=200000]
//                      [--mode=default|expandable|async]
// Exit: 0 ok, 1 allocator/CUDA failure, 2 bad usage, 3 wrong mode.
#include "bench_common.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace {

using bench::die;
namespace CCA = c10::cuda::CUDACachingAllocator;

constexpr uint64_t kWarmupOps = 20000;
constexpr uint64_t kMaxThreads = 256;  // cachalot::MAX_BENCH_THREADS
constexpr uint64_t kMaxOps = 1000000000;

// splitmix64, seeded as cachalot's bench seeds thread t.
struct SplitMix {
  uint64_t state;
  explicit SplitMix(size_t t) : state(0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(t) + 1)) {}
  uint64_t next() {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

// One thread's work; the first error (a c10::Error from the allocator) is
// kept in `error` and ends this thread's loop.
void work(size_t t, uint64_t ops, cudaStream_t stream, std::mutex& mu, std::string& error) {
  try {
    bench::cuda_check(cudaSetDevice(0), "cudaSetDevice");
    SplitMix rng(t);
    void* live[64] = {};
    for (uint64_t i = 0; i < ops; i++) {
      size_t k = static_cast<size_t>(rng.next() % 64);
      if (live[k] != nullptr) {
        CCA::raw_delete(live[k]);
        live[k] = nullptr;
      } else {
        live[k] = CCA::raw_alloc_with_stream(size_t{512} << (rng.next() % 12), stream);
      }
    }
    for (void* p : live) {
      if (p != nullptr) CCA::raw_delete(p);
    }
  } catch (const c10::Error& e) {
    std::lock_guard<std::mutex> g(mu);
    if (error.empty()) error = e.what_without_backtrace();
  }
}

// Runs `ops` operations on each of the threads; exits on an allocator error.
void run(const std::vector<cudaStream_t>& streams, uint64_t ops) {
  std::mutex mu;
  std::string error;
  std::vector<std::thread> threads;
  threads.reserve(streams.size());
  for (size_t t = 0; t < streams.size(); t++) {
    threads.emplace_back(work, t, ops, streams[t], std::ref(mu), std::ref(error));
  }
  for (std::thread& th : threads) th.join();
  if (!error.empty()) die(1, "allocator error: " + error);
}

std::vector<uint64_t> parse_list(const char* s) {
  std::vector<uint64_t> out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      out.push_back(bench::parse_u64(cur.c_str(), "--threads", 1, kMaxThreads));
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> counts = {1, 2, 4, 8, 16};
  uint64_t ops = 200000;
  const bench::Mode* mode = nullptr;
  for (int a = 1; a < argc; a++) {
    const char* arg = argv[a];
    if (const char* v = bench::option(arg, "--threads")) {
      counts = parse_list(v);
    } else if (const char* v = bench::option(arg, "--ops")) {
      ops = bench::parse_u64(v, "--ops", 1, kMaxOps);
    } else if (const char* v = bench::option(arg, "--mode")) {
      mode = bench::find_mode(v);
      if (mode == nullptr) die(2, std::string("--mode: '") + v + "' (want default, expandable or async)");
    } else if (std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0) {
      std::printf("usage: %s [--threads=1,2,4,8,16] [--ops=200000] [--mode=M]\n", argv[0]);
      return 0;
    } else {
      die(2, std::string("unknown argument ") + arg);
    }
  }
  if (mode != nullptr) bench::ensure_mode_env(*mode, argv);
  int count = 0;
  bench::cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < 1) die(1, "no CUDA device");
  bench::cuda_check(cudaSetDevice(0), "cudaSetDevice");
  CCA::init(c10::cuda::device_count());
  bench::check_running_mode(mode);
  const std::string running = bench::running_mode();
  const std::string conf = bench::alloc_conf_env();

  for (uint64_t n : counts) {
    std::vector<cudaStream_t> streams(n, nullptr);
    for (cudaStream_t& s : streams) {
      bench::cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                        "cudaStreamCreateWithFlags");
    }
    try {
      CCA::emptyCache();
    } catch (const c10::Error& e) {
      die(1, std::string("emptyCache: ") + e.what_without_backtrace());
    }
    run(streams, kWarmupOps);
    auto t0 = std::chrono::steady_clock::now();
    run(streams, ops);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t total = ops * n;
    std::printf("{\"threads\":%llu,\"ops\":%llu,\"mops_per_s\":%.3f,\"mode\":%s,\"alloc_conf\":%s}\n",
                static_cast<unsigned long long>(n), static_cast<unsigned long long>(total),
                static_cast<double>(total) / secs / 1e6, bench::json_str(running).c_str(),
                bench::json_str(conf).c_str());
    std::fflush(stdout);
    try {
      CCA::emptyCache();
    } catch (const c10::Error& e) {
      die(1, std::string("emptyCache: ") + e.what_without_backtrace());
    }
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
  }
  return 0;
}
