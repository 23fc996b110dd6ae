// A tiny reader that turns a fuzzer's byte string into bounded integers for the harnesses in
// tests/fuzz/ (libFuzzer's FuzzedDataProvider is clang-only; the replay build uses GCC).
// Once the bytes run out every read returns the low end of its range, so each input maps to
// exactly one finite sequence of operations.
// Thread-safety: one reader per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

// Aborts (a crash libFuzzer records) when a harness invariant does not hold.
#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

namespace verifyd::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  bool empty() const { return p_ == end_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

  uint8_t Byte() { return p_ == end_ ? 0 : *p_++; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | Byte();
    return v;
  }
  // Uniform-ish in [lo, hi] (hi >= lo); one byte when the range fits in a byte.
  int64_t Range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const uint64_t raw = span <= 256 ? Byte() : U32();
    return lo + static_cast<int64_t>(raw % span);
  }
  bool Bool() { return Byte() & 1; }
  // True with probability ~ num / 256.
  bool Chance(int num) { return Byte() < num; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace verifyd::fuzz
