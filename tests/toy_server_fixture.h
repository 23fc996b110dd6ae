// A verifyd server on loopback over the toy engine (server/toy_engine.h), for the
// server, session and limits tests: the one copy of their start-up fixture, of holding a call
// inside the paused engine, of polling for a condition and of checking a status code; and the
// toy engine reporting device memory, for GetInfo's memory field.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/verify_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "server/toy_engine.h"

namespace verifyd::server {

struct Fixture {
  testing::TestServer t;
  testing::ToyEngine* toy = nullptr;  // owned by the server
  testing::ToyEngineOptions toy_options;

  // The toy model's greedy continuation of `prompt` (n tokens, the first the pending token
  // after the prompt).
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) const {
    return testing::ToyEngine::Greedy(toy_options, prompt, n);
  }

  // Opens a session on `prompt` through the server's client; `truth` gets Greedy(prompt, n).
  absl::StatusOr<client::OpenResult> OpenGreedy(const std::vector<int32_t>& prompt, int n,
                                                std::vector<int32_t>* truth) {
    *truth = Greedy(prompt, n);
    return t.client->Open(prompt);
  }
};

// Metrics off unless asked for: stopping the HTTP exposer costs ~2 s.
inline Fixture Start(testing::ToyEngineOptions toy_options = {}, ServerOptions options = {},
                     bool metrics = false) {
  Fixture f;
  f.toy_options = toy_options;
  auto engine = std::make_unique<testing::ToyEngine>(toy_options);
  f.toy = engine.get();
  auto t = testing::StartTestServer(options, std::move(engine), metrics);
  EXPECT_TRUE(t.ok()) << t.status();
  if (t.ok()) f.t = *std::move(t);
  return f;
}

// Waits until `pred` holds (polling), up to `timeout`.
template <typename Pred>
bool WaitFor(Pred pred, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return pred();
}

// Pauses the toy engine and runs `call` on a new thread, returning once the engine step
// `call` starts has entered the engine, where it stays until f.toy->Resume().
template <typename Call>
std::thread StartHeldCall(Fixture& f, Call call) {
  f.toy->Pause();
  const int64_t entered = f.toy->steps_entered();
  std::thread t(std::move(call));
  EXPECT_TRUE(WaitFor([&] { return f.toy->steps_entered() > entered; }))
      << "the call's step never entered the engine";
  return t;
}

// `st` has `code`, and its message contains `substr` when one is given.
inline void ExpectCode(const absl::Status& st, absl::StatusCode code,
                       const std::string& substr = "") {
  EXPECT_EQ(st.code(), code) << st;
  if (!substr.empty()) EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr(substr)) << st;
}

// The toy engine reporting the device memory it is given (tp::Engine::memory()), as the CUDA
// engine does.
class ToyEngineWithMemory : public testing::ToyEngine {
 public:
  explicit ToyEngineWithMemory(tp::EngineMemory memory)
      : ToyEngine(testing::ToyEngineOptions{}), memory_(memory) {}
  tp::EngineMemory memory() const override { return memory_; }

 private:
  const tp::EngineMemory memory_;
};

// One GPU's memory of a large model: every field distinct (a field read in another's place
// shows), the large ones beyond 2^32. In GB: device 150.02, weights 130.20, workspace 8.50,
// KV pool 4.61 (65,536 tokens of 70,272 bytes), in use before the KV pool 139.91 measured and
// 138.70 planned (weights + workspace).
inline tp::EngineMemory ExampleMemory() {
  tp::EngineMemory m;
  m.device_bytes = 150'020'000'000;
  m.weight_bytes = 130'204'000'001;
  m.workspace_bytes = 8'496'000'002;
  m.kv_bytes_per_token = 70'272;
  m.kv_tokens = 65'536;
  m.kv_cache_bytes = m.kv_bytes_per_token * m.kv_tokens;
  m.used_before_kv_bytes = 139'910'000'003;
  m.planned_before_kv_bytes = m.weight_bytes + m.workspace_bytes;
  return m;
}

}  // namespace verifyd::server
