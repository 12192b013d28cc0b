// Shared by torch_replay.cpp and torch_threads.cpp: PyTorch's allocator
// mode (chosen through the environment before libc10_cuda starts), option
// parsing, JSON strings and errors.
//
// PyTorch picks its allocator backend when libc10_cuda is loaded (from
// PYTORCH_ALLOC_CONF, then PYTORCH_CUDA_ALLOC_CONF), so a mode cannot be
// switched inside a process: `--mode=M` sets the variables and starts the
// program again (execv of /proc/self/exe) when they do not already say M,
// and after start-up the mode PyTorch actually runs is read back and must
// be M.
#pragma once

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

namespace bench {

namespace CCA = c10::cuda::CUDACachingAllocator;

// Exit codes: 0 ok, 1 the allocator or CUDA failed, 2 bad usage or input,
// 3 PyTorch did not run the mode asked for.
[[noreturn]] inline void die(int code, const std::string& msg) {
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::exit(code);
}

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    die(1, std::string(what) + ": " + cudaGetErrorString(e));
  }
}

// The three PyTorch modes and the PYTORCH_CUDA_ALLOC_CONF that selects each.
struct Mode {
  const char* name;
  const char* conf;  // nullptr: the variable is unset
};
inline const std::vector<Mode>& modes() {
  static const std::vector<Mode> m = {
      {"default", nullptr},
      {"expandable", "expandable_segments:True"},
      {"async", "backend:cudaMallocAsync"},
  };
  return m;
}

inline const Mode* find_mode(const std::string& name) {
  for (const Mode& m : modes()) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

// The mode PyTorch runs now: its backend's name, then the parsed config.
inline std::string running_mode() {
  if (CCA::name() == "cudaMallocAsync") return "async";
  if (c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments()) {
    return "expandable";
  }
  return "default";
}

// The allocator config string as the environment gives it ("" when unset).
inline std::string alloc_conf_env() {
  for (const char* var : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}) {
    const char* v = std::getenv(var);
    if (v != nullptr) return v;
  }
  return "";
}

// Makes the process environment select `mode`; re-executes the program when
// it did not (the variables are read when libc10_cuda loads). Returns only
// when the environment already selects it.
inline void ensure_mode_env(const Mode& mode, char** argv) {
  const char* cuda = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  const char* generic = std::getenv("PYTORCH_ALLOC_CONF");
  bool ok = generic == nullptr &&
            (mode.conf == nullptr ? (cuda == nullptr || *cuda == '\0')
                                  : (cuda != nullptr && std::strcmp(cuda, mode.conf) == 0));
  if (ok) return;
  if (std::getenv("CACHALOT_BENCH_REEXEC") != nullptr) {
    die(3, std::string("--mode=") + mode.name + ": the environment still does not select it");
  }
  unsetenv("PYTORCH_ALLOC_CONF");
  if (mode.conf == nullptr) {
    unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  } else {
    setenv("PYTORCH_CUDA_ALLOC_CONF", mode.conf, 1);
  }
  setenv("CACHALOT_BENCH_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  die(1, std::string("re-executing for --mode: ") + std::strerror(errno));
}

// After start-up: PyTorch must run the mode asked for.
inline void check_running_mode(const Mode* asked) {
  if (asked == nullptr) return;
  std::string got = running_mode();
  if (got != asked->name) {
    die(3, std::string("--mode=") + asked->name + " asked for, PyTorch runs '" + got +
               "' (PYTORCH_CUDA_ALLOC_CONF='" + alloc_conf_env() + "')");
  }
}

// `--name=value` → value, or nullptr when `arg` is not that option.
inline const char* option(const char* arg, const char* name) {
  size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) == 0 && arg[n] == '=') return arg + n + 1;
  return nullptr;
}

// A decimal number in [lo, hi], else exit 2 naming the option.
inline uint64_t parse_u64(const char* s, const char* what, uint64_t lo, uint64_t hi) {
  if (s == nullptr || *s == '\0') die(2, std::string(what) + ": a number is needed");
  uint64_t v = 0;
  for (const char* p = s; *p != '\0'; ++p) {
    if (*p < '0' || *p > '9') die(2, std::string(what) + ": '" + s + "' is not a number");
    unsigned d = static_cast<unsigned>(*p - '0');
    if (v > (UINT64_MAX - d) / 10) die(2, std::string(what) + ": '" + s + "' is too large");
    v = v * 10 + d;
  }
  if (v < lo || v > hi) {
    die(2, std::string(what) + ": " + s + " is outside " + std::to_string(lo) + ".." +
               std::to_string(hi));
  }
  return v;
}

// A JSON string literal.
inline std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace bench
