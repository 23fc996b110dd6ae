// Internal to kernels/reference: split a range of independent work items over a few
// std::threads. Used only where every item is computed by the same code whatever the split,
// so threading never changes a result (batch invariance).
// Thread-safe: each call owns its threads and joins them before returning.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace verifyd::kernels::ref::internal {

// Most threads one reference op starts: at most 4 by default (the CPU backend already runs
// one engine thread per TP rank), never more than the hardware's. VERIFYD_REF_THREADS=N (an
// integer in 1..1024, read once; anything else is reported on stderr and ignored) raises or
// lowers that cap, e.g. for the GPU tests, whose C++ reference of long contexts is most of
// their run time on a many-core GPU host. The thread count never changes a result (see above).
inline int MaxOpThreads() {
  static const int threads = [] {
    unsigned cap = 4;
    const char* env = std::getenv("VERIFYD_REF_THREADS");
    if (env != nullptr && *env != '\0') {  // set and not empty
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (end != env && *end == '\0' && v > 0 && v <= 1024) {
        cap = static_cast<unsigned>(v);
      } else {
        std::fprintf(stderr, "VERIFYD_REF_THREADS=%s ignored: not an integer in 1..1024\n", env);
      }
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return static_cast<int>(std::clamp<unsigned>(hw == 0 ? 1u : hw, 1u, cap));
  }();
  return threads;
}

// Calls fn(begin, end) over contiguous chunks covering [0, count), each a multiple of
// `granule` items except the last. Runs inline when `threads` <= 1 or there is one chunk.
template <typename Fn>
void ParallelChunks(int64_t count, int64_t granule, int threads, const Fn& fn) {
  if (count <= 0) return;
  const int64_t granules = (count + granule - 1) / granule;
  const int64_t parts = std::min<int64_t>(std::max(threads, 1), granules);
  if (parts <= 1) {
    fn(int64_t{0}, count);
    return;
  }
  const int64_t per = (granules + parts - 1) / parts * granule;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(parts - 1));
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t b = p * per, e = std::min(count, b + per);
    if (b < e) pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(int64_t{0}, std::min(count, per));  // chunk 0 on the calling thread
  for (auto& t : pool) t.join();
}

}  // namespace verifyd::kernels::ref::internal
