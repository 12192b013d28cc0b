// Replays allocation traces (format: traces/README.md) through PyTorch's own
// C++ caching allocator, c10::cuda::CUDACachingAllocator from libc10_cuda,
// with no Python in the loop, and prints one JSON line per trace with the
// fields of `cachalot replay --json` (same names, same measurement), so the
// two can be compared line by line in one run:
//
//   trace, ops, cold_ns_per_op (pass 1), warm_ns_per_op (median of passes
//   2..N), peak_reserved, peak_allocated, device_allocs_cold (pass 1),
//   device_allocs_all, alloc_retries (all passes)
//
// plus mode (default | expandable | async, as PyTorch runs it), alloc_conf
// (the environment's config string), passes, streams and live_peak (the
// largest sum of live requested bytes: the trace's own need, independent
// of any allocator).
//
// Per trace: empty the cache, reset peak and accumulated stats, then run
// the passes; a pass runs every operation (trace stream 0 on the default
// stream, every further trace stream on a stream of its own, as cachalot's
// replay does) and then frees the blocks still live, in id order.
//
// usage: torch_replay [--passes=N] [--mode=default|expandable|async] TRACE...
//        torch_replay --parse-only TRACE...   (no GPU: reads the traces and
//        prints trace, ops, streams, ids and live_peak)
// Exit: 0 ok, 1 allocator/CUDA failure, 2 bad usage or trace, 3 wrong mode.
#include "bench_common.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <unordered_map>

namespace {

using bench::die;
namespace CCA = c10::cuda::CUDACachingAllocator;

// The limits of cachalot's trace reader (cachalot_core::replay::TraceLimits).
constexpr size_t kMaxOps = size_t{1} << 27;
constexpr size_t kMaxStreams = 1024;
constexpr size_t kMaxLineBytes = 65536;

struct Op {
  bool alloc;
  uint32_t id;      // dense, in ascending order of the trace's ids
  uint32_t stream;  // dense, in ascending order of the trace's streams
  uint64_t size;
};

struct Trace {
  std::vector<Op> ops;
  size_t num_ids = 0;
  size_t num_streams = 0;
  uint64_t live_peak = 0;
};

// Ranks each value of `first_seen` (dense by first appearance) in ascending
// order of the values.
std::vector<uint32_t> rank_order(const std::vector<uint64_t>& first_seen) {
  std::vector<uint32_t> idx(first_seen.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = static_cast<uint32_t>(i);
  std::sort(idx.begin(), idx.end(),
            [&](uint32_t a, uint32_t b) { return first_seen[a] < first_seen[b]; });
  std::vector<uint32_t> rank(first_seen.size());
  for (size_t r = 0; r < idx.size(); r++) rank[idx[r]] = static_cast<uint32_t>(r);
  return rank;
}

// One unsigned decimal field of a trace line, else exit 2 naming the line.
uint64_t field(const std::string& path, size_t line, const char*& p, const char* what) {
  while (*p == ' ' || *p == '\t') p++;
  if (*p < '0' || *p > '9') {
    die(2, path + ":" + std::to_string(line) + ": " + what + " missing or not a number");
  }
  uint64_t v = 0;
  while (*p >= '0' && *p <= '9') {
    unsigned d = static_cast<unsigned>(*p - '0');
    if (v > (UINT64_MAX - d) / 10) {
      die(2, path + ":" + std::to_string(line) + ": " + what + " is larger than 2^64-1");
    }
    v = v * 10 + d;
    p++;
  }
  if (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\r') {
    die(2, path + ":" + std::to_string(line) + ": " + what + " is not a number");
  }
  return v;
}

// Reads a trace with the rules of cachalot's reader: '#' comments and blank
// lines skipped; each id allocated once; a free names a live id; at least
// one operation; the limits above.
Trace load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die(2, path + ": cannot open");
  Trace t;
  std::unordered_map<uint64_t, uint32_t> ids, streams;
  std::vector<uint64_t> id_values, stream_values;
  std::vector<bool> live;
  std::vector<uint64_t> size_of;
  uint64_t live_bytes = 0;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    line_no++;
    std::string where = path + ":" + std::to_string(line_no);
    if (line.size() > kMaxLineBytes) die(2, where + ": line longer than 65536 bytes");
    const char* p = line.c_str();
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (*p == '\0' || *p == '#') continue;
    if (t.ops.size() >= kMaxOps) die(2, where + ": more than 2^27 operations");
    char kind = *p++;
    if ((kind != 'a' && kind != 'f') || (*p != ' ' && *p != '\t')) {
      die(2, where + ": unknown operation (want 'a ID SIZE STREAM' or 'f ID')");
    }
    Op op{};
    op.alloc = kind == 'a';
    uint64_t id = field(path, line_no, p, "id");
    if (op.alloc) {
      op.size = field(path, line_no, p, "size");
      uint64_t stream = field(path, line_no, p, "stream");
      if (ids.count(id)) die(2, where + ": id " + std::to_string(id) + " allocated twice");
      op.id = static_cast<uint32_t>(id_values.size());
      ids.emplace(id, op.id);
      id_values.push_back(id);
      live.push_back(true);
      size_of.push_back(op.size);
      auto s = streams.find(stream);
      if (s == streams.end()) {
        if (stream_values.size() >= kMaxStreams) die(2, where + ": more than 1024 streams");
        s = streams.emplace(stream, static_cast<uint32_t>(stream_values.size())).first;
        stream_values.push_back(stream);
      }
      op.stream = s->second;
      live_bytes += op.size;
      t.live_peak = std::max(t.live_peak, live_bytes);
    } else {
      auto it = ids.find(id);
      if (it == ids.end()) die(2, where + ": free of id " + std::to_string(id) + ", never allocated");
      if (!live[it->second]) die(2, where + ": id " + std::to_string(id) + " freed twice");
      op.id = it->second;
      live[op.id] = false;
      live_bytes -= size_of[op.id];
    }
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (*p != '\0') die(2, where + ": trailing field");
    t.ops.push_back(op);
  }
  if (t.ops.empty()) die(2, path + ": no operation");
  std::vector<uint32_t> id_rank = rank_order(id_values);
  std::vector<uint32_t> stream_rank = rank_order(stream_values);
  for (Op& op : t.ops) {
    op.id = id_rank[op.id];
    if (op.alloc) op.stream = stream_rank[op.stream];
  }
  t.num_ids = id_values.size();
  t.num_streams = std::max<size_t>(stream_values.size(), 1);
  return t;
}

struct Report {
  double cold_ns = 0, warm_ns = 0;
  int64_t peak_reserved = 0, peak_allocated = 0, allocs_cold = 0, allocs_all = 0, retries = 0;
};

Report replay(const Trace& t, int passes, const std::vector<cudaStream_t>& streams) {
  std::vector<void*> ptr(t.num_ids, nullptr);
  CCA::emptyCache();
  CCA::resetPeakStats(0);
  CCA::resetAccumulatedStats(0);
  Report r;
  std::vector<double> warm;
  for (int pass = 0; pass < passes; pass++) {
    auto t0 = std::chrono::steady_clock::now();
    for (const Op& op : t.ops) {
      if (op.alloc) {
        ptr[op.id] = CCA::raw_alloc_with_stream(op.size, streams[op.stream]);
      } else if (ptr[op.id] != nullptr) {
        CCA::raw_delete(ptr[op.id]);
        ptr[op.id] = nullptr;
      }
    }
    for (void*& q : ptr) {
      if (q != nullptr) {
        CCA::raw_delete(q);
        q = nullptr;
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    double per = std::chrono::duration<double, std::nano>(t1 - t0).count() /
                 static_cast<double>(t.ops.size());
    if (pass == 0) {
      auto s = CCA::getDeviceStats(0);
      r.cold_ns = per;
      r.peak_reserved = s.reserved_bytes[0].peak;
      r.peak_allocated = s.allocated_bytes[0].peak;
      r.allocs_cold = s.num_device_alloc;
    } else {
      warm.push_back(per);
    }
  }
  std::sort(warm.begin(), warm.end());
  r.warm_ns = warm.empty() ? r.cold_ns : warm[warm.size() / 2];
  auto s = CCA::getDeviceStats(0);
  r.allocs_all = s.num_device_alloc;
  r.retries = s.num_alloc_retries;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int passes = 5;
  bool parse_only = false;
  const bench::Mode* mode = nullptr;
  std::vector<std::string> paths;
  for (int a = 1; a < argc; a++) {
    const char* arg = argv[a];
    if (const char* v = bench::option(arg, "--passes")) {
      passes = static_cast<int>(bench::parse_u64(v, "--passes", 1, 1000));
    } else if (const char* v = bench::option(arg, "--mode")) {
      mode = bench::find_mode(v);
      if (mode == nullptr) die(2, std::string("--mode: '") + v + "' (want default, expandable or async)");
    } else if (std::strcmp(arg, "--parse-only") == 0) {
      parse_only = true;
    } else if (std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0) {
      std::printf("usage: %s [--passes=N] [--mode=default|expandable|async] TRACE...\n"
                  "       %s --parse-only TRACE...\n",
                  argv[0], argv[0]);
      return 0;
    } else if (arg[0] == '-' && arg[1] == '-') {
      die(2, std::string("unknown option ") + arg);
    } else {
      paths.push_back(arg);
    }
  }
  if (paths.empty()) die(2, "usage: torch_replay [--passes=N] [--mode=M] TRACE...");
  if (mode != nullptr) bench::ensure_mode_env(*mode, argv);
  // every trace is read before any replay: a bad one fails at once
  std::vector<Trace> traces;
  traces.reserve(paths.size());
  for (const std::string& p : paths) traces.push_back(load(p));
  if (parse_only) {
    for (size_t i = 0; i < traces.size(); i++) {
      std::printf("{\"trace\":%s,\"ops\":%zu,\"streams\":%zu,\"ids\":%zu,\"live_peak\":%llu}\n",
                  bench::json_str(paths[i]).c_str(), traces[i].ops.size(), traces[i].num_streams,
                  traces[i].num_ids, static_cast<unsigned long long>(traces[i].live_peak));
    }
    return 0;
  }

  int count = 0;
  bench::cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < 1) die(1, "no CUDA device");
  bench::cuda_check(cudaSetDevice(0), "cudaSetDevice");
  CCA::init(c10::cuda::device_count());
  bench::check_running_mode(mode);
  const std::string running = bench::running_mode();
  const std::string conf = bench::alloc_conf_env();

  size_t most_streams = 1;
  for (const Trace& t : traces) most_streams = std::max(most_streams, t.num_streams);
  std::vector<cudaStream_t> streams(most_streams, nullptr);  // [0]: the default stream
  for (size_t i = 1; i < streams.size(); i++) {
    bench::cuda_check(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
  }
  for (size_t i = 0; i < traces.size(); i++) {
    const Trace& t = traces[i];
    Report r;
    try {
      r = replay(t, passes, streams);
    } catch (const c10::Error& e) {
      die(1, paths[i] + ": " + e.what_without_backtrace());
    }
    std::printf(
        "{\"trace\":%s,\"ops\":%zu,\"cold_ns_per_op\":%.1f,\"warm_ns_per_op\":%.1f,"
        "\"peak_reserved\":%lld,\"peak_allocated\":%lld,\"device_allocs_cold\":%lld,"
        "\"device_allocs_all\":%lld,\"alloc_retries\":%lld,\"mode\":%s,\"alloc_conf\":%s,"
        "\"passes\":%d,\"streams\":%zu,\"live_peak\":%llu}\n",
        bench::json_str(paths[i]).c_str(), t.ops.size(), r.cold_ns, r.warm_ns,
        static_cast<long long>(r.peak_reserved), static_cast<long long>(r.peak_allocated),
        static_cast<long long>(r.allocs_cold), static_cast<long long>(r.allocs_all),
        static_cast<long long>(r.retries), bench::json_str(running).c_str(),
        bench::json_str(conf).c_str(), passes, t.num_streams,
        static_cast<unsigned long long>(t.live_peak));
    std::fflush(stdout);
  }
  CCA::emptyCache();
  for (size_t i = 1; i < streams.size(); i++) cudaStreamDestroy(streams[i]);
  return 0;
}
