// ThreadSanitizer annotations for Debian's prebuilt Abseil (scripts/sanitizers.sh, TSan only).
//
// Debian's libabsl_synchronization is not built with -fsanitize=thread, so ThreadSanitizer
// cannot see absl::Mutex, CondVar or Notification synchronize anything and reports every
// access they protect as a race. This file, linked into each TSan executable, interposes
// their out-of-line members: each wrapper calls the library's own function (found with
// dlsym(RTLD_NEXT)) and tells TSan what it did through the public annotation interface
// (<sanitizer/tsan_interface.h>), as Abseil itself does when built with TSan. Accesses made
// inside the library calls (lock internals, Condition functions evaluated while waiting) are
// ignored by TSan between the pre/post annotations. Waits (Await, CondVar::Wait) are told as
// unlock + lock of the mutex. The destructor is left alone: TSan drops a heap mutex's state
// when its memory is freed. Assumes Abseil 20220623's layout of Notification
// ({Mutex mutex_; std::atomic<bool> notified_yet_;}), checked below.
//
// Not part of any normal build. Thread-safety: the wrappers are as thread-safe as Abseil.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

#define VERIFYD_STR2(x) #x
#define VERIFYD_STR(x) VERIFYD_STR2(x)

namespace {

// The library's definition of a member: "_ZN" / "_ZNK" + "4absl" + inline namespace + rest.
template <typename F>
F Real(const char* prefix, const char* rest) {
  const char* ns = VERIFYD_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name =
      std::string(prefix) + "4absl" + std::to_string(std::strlen(ns)) + ns + rest;
  void* p = dlsym(RTLD_NEXT, name.c_str());
  if (p == nullptr) {
    std::fprintf(stderr, "absl_tsan_shim: %s not found\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<F>(p);
}

// Library members call each other (CondVar::WaitWithTimeout -> WaitWithDeadline,
// Notification::Notify -> Mutex::Lock); those inner calls resolve to these wrappers too. Only
// the outermost call on a thread is annotated; inner ones go straight to the library.
thread_local int g_depth = 0;
struct Nest {
  const bool outer;
  Nest() : outer(g_depth++ == 0) {}
  ~Nest() { --g_depth; }
};

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;
constexpr unsigned kTryFailed = __tsan_mutex_try_lock_failed;

// A wait that releases `mu` and holds it again on return, as TSan sees it.
template <typename Fn>
auto AsUnlockThenLock(void* mu, Fn fn) {
  __tsan_mutex_pre_unlock(mu, 0);
  auto r = fn();
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return r;
}

const void* NotifiedFlag(const absl::Notification* n) {
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}
static_assert(sizeof(absl::Notification) >= sizeof(absl::Mutex) + sizeof(std::atomic<bool>),
              "unexpected absl::Notification layout");

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex4LockEv");
  Nest nest;
  if (!nest.outer) return real(this);
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex6UnlockEv");
  Nest nest;
  if (!nest.outer) return real(this);
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex10ReaderLockEv");
  Nest nest;
  if (!nest.outer) return real(this);
  __tsan_mutex_pre_lock(this, kRead);
  real(this);
  __tsan_mutex_post_lock(this, kRead, 0);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex12ReaderUnlockEv");
  Nest nest;
  if (!nest.outer) return real(this);
  __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  __tsan_mutex_post_unlock(this, kRead);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN", "5Mutex7TryLockEv");
  Nest nest;
  if (!nest.outer) return real(this);
  __tsan_mutex_pre_lock(this, kTry);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this, kTry | (ok ? 0 : kTryFailed), 0);
  return ok;
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN", "5Mutex13ReaderTryLockEv");
  Nest nest;
  if (!nest.outer) return real(this);
  __tsan_mutex_pre_lock(this, kRead | kTry);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this, kRead | kTry | (ok ? 0 : kTryFailed), 0);
  return ok;
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex8LockWhenERKNS0_9ConditionE");
  Nest nest;
  if (!nest.outer) return real(this, cond);
  __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Nest nest;
  if (!nest.outer) return real(this, cond);
  __tsan_mutex_pre_lock(this, kRead);
  real(this, cond);
  __tsan_mutex_post_lock(this, kRead, 0);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN", "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Nest nest;
  if (!nest.outer) return real(this, cond, timeout);
  __tsan_mutex_pre_lock(this, 0);
  const bool r = real(this, cond, timeout);
  __tsan_mutex_post_lock(this, 0, 0);
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN", "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Nest nest;
  if (!nest.outer) return real(this, cond, deadline);
  __tsan_mutex_pre_lock(this, 0);
  const bool r = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, 0, 0);
  return r;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN", "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Nest nest;
  if (!nest.outer) return real(this, cond, timeout);
  __tsan_mutex_pre_lock(this, kRead);
  const bool r = real(this, cond, timeout);
  __tsan_mutex_post_lock(this, kRead, 0);
  return r;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN", "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Nest nest;
  if (!nest.outer) return real(this, cond, deadline);
  __tsan_mutex_pre_lock(this, kRead);
  const bool r = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, kRead, 0);
  return r;
}

void Mutex::Await(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN", "5Mutex5AwaitERKNS0_9ConditionE");
  Nest nest;
  if (!nest.outer) return real(this, cond);
  AsUnlockThenLock(this, [&] {
    real(this, cond);
    return 0;
  });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN", "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Nest nest;
  if (!nest.outer) return real(this, cond, timeout);
  return AsUnlockThenLock(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN", "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Nest nest;
  if (!nest.outer) return real(this, cond, deadline);
  return AsUnlockThenLock(this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("_ZN", "7CondVar4WaitEPNS0_5MutexE");
  Nest nest;
  if (!nest.outer) return real(this, mu);
  AsUnlockThenLock(mu, [&] {
    real(this, mu);
    return 0;
  });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "_ZN", "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Nest nest;
  if (!nest.outer) return real(this, mu, timeout);
  return AsUnlockThenLock(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "_ZN", "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Nest nest;
  if (!nest.outer) return real(this, mu, deadline);
  return AsUnlockThenLock(mu, [&] { return real(this, mu, deadline); });
}

void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>("_ZN", "12Notification6NotifyEv");
  Nest nest;
  if (!nest.outer) return real(this);
  __tsan_release(const_cast<void*>(NotifiedFlag(this)));
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real =
      Real<void (*)(const Notification*)>("_ZNK", "12Notification19WaitForNotificationEv");
  Nest nest;
  if (!nest.outer) return real(this);
  real(this);
  __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      "_ZNK", "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  Nest nest;
  if (!nest.outer) return real(this, timeout);
  const bool r = real(this, timeout);
  if (r) __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, absl::Time)>(
      "_ZNK", "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  Nest nest;
  if (!nest.outer) return real(this, deadline);
  const bool r = real(this, deadline);
  if (r) __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
