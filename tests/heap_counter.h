// Heap accounting for the bounded-memory tests: every operator new of the test binary is
// counted (size kept in a 16-byte prefix), with a resettable high-water mark: g_heap_now is the
// heap in use, g_heap_peak its maximum since a test last stored into it.
//
// This header replaces the global operator new / delete, which must be defined in exactly one
// translation unit of a program: include it from exactly one source file of a test binary (the
// test's own .cc), never from another header or a second source of the same binary. The
// definitions are deliberately not inline (a replacement allocation function may not be).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace {
std::atomic<int64_t> g_heap_now{0};
std::atomic<int64_t> g_heap_peak{0};
}  // namespace

void* operator new(size_t n) {
  void* p = std::malloc(n + 16);
  if (p == nullptr) throw std::bad_alloc();
  *static_cast<size_t*>(p) = n;
  const int64_t now = g_heap_now.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
  int64_t peak = g_heap_peak.load();
  while (now > peak && !g_heap_peak.compare_exchange_weak(peak, now)) {
  }
  return static_cast<char*>(p) + 16;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  char* base = static_cast<char*>(p) - 16;
  g_heap_now.fetch_sub(static_cast<int64_t>(*reinterpret_cast<size_t*>(base)));
  std::free(base);
}
void operator delete(void* p, size_t) noexcept { operator delete(p); }
