// Sessions under real traffic, over loopback gRPC: retries with request ids after a cancel or
// a deadline, expected_committed_len, TruncateSession, ForkSession, OpenSession with a prefix,
// exact slot accounting and gauges, chunked prefill. The toy engine (which rejects any step
// whose context slots are not exactly the session's sequence) checks the bookkeeping; the real
// CPU engine (tiny preset) checks token equality with plain greedy decoding.
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/verify_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "server/toy_engine.h"
#include "tests/toy_server_fixture.h"
#include "tp/cpu/cpu_engine.h"

namespace verifyd::server {
namespace {

namespace v1 = ::verify::v1;
using client::DraftTree;
using client::VerifyClient;
using client::VerifyOptions;
using ::testing::HasSubstr;
using testing::StartTestServer;
using testing::TestServer;
using testing::ToyEngineOptions;

VerifyOptions Rid(const std::string& id, std::optional<int64_t> expected = std::nullopt) {
  VerifyOptions o;
  o.request_id = id;
  o.expected_committed_len = expected;
  return o;
}

// One Verify item with a request id, as the raw message a client would resend.
v1::VerifyRequest OneItem(const std::string& session, const std::string& request_id,
                          int64_t expected_len) {
  v1::VerifyRequest req;
  v1::VerifyItem* item = req.add_items();
  item->set_session_id(session);
  item->set_request_id(request_id);
  item->set_expected_committed_len(expected_len);
  return req;
}

// ---------------------------------------------------------------- retries (toy engine)

TEST(ServerSessions, CancelledCallsRetriedAtOnceAllSucceedAndApplyOnce) {
  Fixture f = Start();
  constexpr int kSessions = 16;
  std::vector<std::vector<int32_t>> prompts(kSessions);
  std::vector<std::string> ids(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    prompts[i] = {i + 1, 2 * i + 3, 7};
    auto s = f.t.client->Open(prompts[i]);
    ASSERT_TRUE(s.ok()) << s.status();
    ids[i] = s->session_id;
  }
  auto stub = v1::VerifyService::NewStub(f.t.client->channel());
  f.toy->Pause();
  const int64_t entered = f.toy->steps_entered();
  // Session 0's call starts its engine step (held by the pause); the other 15 queue.
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs(kSessions);
  std::vector<std::thread> first;
  for (int i = 0; i < kSessions; ++i) {
    ctxs[i] = std::make_unique<grpc::ClientContext>();
    first.emplace_back([&, i] {
      v1::VerifyResponse resp;
      (void)stub->Verify(ctxs[i].get(), OneItem(ids[i], absl::StrCat("r", i), 3), &resp);
    });
    if (i == 0) ASSERT_TRUE(WaitFor([&] { return f.toy->steps_entered() > entered; }));
  }
  ASSERT_TRUE(WaitFor([&] { return f.t.server->queue_depth() == kSessions - 1; }));
  for (auto& c : ctxs) c->TryCancel();
  for (auto& t : first) t.join();
  // Retried at once with the same messages, while session 0's step is still held.
  std::vector<absl::StatusOr<v1::VerifyResponse>> retries(kSessions);
  std::vector<std::thread> again;
  for (int i = 0; i < kSessions; ++i) {
    again.emplace_back([&, i] {
      v1::VerifyResponse resp;
      absl::Status st = f.t.client->VerifyRaw(OneItem(ids[i], absl::StrCat("r", i), 3), &resp);
      retries[i] = st.ok() ? absl::StatusOr<v1::VerifyResponse>(resp) : st;
    });
  }
  absl::SleepFor(absl::Milliseconds(100));
  f.toy->Resume();
  for (auto& t : again) t.join();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(retries[i].ok()) << i << ": " << retries[i].status();
    const auto truth = f.Greedy(prompts[i], 2);
    EXPECT_EQ(retries[i]->results(0).bonus_token(), truth[1]) << i;
    EXPECT_EQ(retries[i]->results(0).committed_len(), 4) << i;  // applied exactly once
    auto next = f.t.client->Verify(ids[i], DraftTree{}, Rid(absl::StrCat("n", i), 4));
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->committed_len, 5);
    EXPECT_EQ(next->bonus_token, f.Greedy(prompts[i], 3)[2]);
  }
  EXPECT_EQ(f.t.server->kv_slots_used(), kSessions * 5);
}

TEST(ServerSessions, RetryAfterDeadlineReturnsTheAppliedResult) {
  Fixture f = Start();
  std::vector<int32_t> truth;
  auto s = f.OpenGreedy({4, 5, 6, 7}, 6, &truth);
  ASSERT_TRUE(s.ok());
  const DraftTree tree{{truth[1], truth[2], 3}, {-1, 0, 0}};
  VerifyClient impatient(f.t.target, absl::Milliseconds(100));
  absl::Status first;
  std::thread t = StartHeldCall(
      f, [&] { first = impatient.Verify(s->session_id, tree, Rid("a", 4)).status(); });
  t.join();  // its deadline passed while the step runs: the round is still applied
  ExpectCode(first, absl::StatusCode::kDeadlineExceeded);
  f.toy->Resume();
  auto retry = f.t.client->Verify(s->session_id, tree, Rid("a", 4));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->accepted_tokens, (std::vector<int32_t>{truth[1], truth[2]}));
  EXPECT_EQ(retry->bonus_token, truth[3]);
  EXPECT_EQ(retry->committed_len, 7);
  EXPECT_EQ(f.t.server->kv_slots_used(), 7);
  // The session continues from there.
  auto next = f.t.client->Verify(s->session_id, DraftTree{}, Rid("b", 7));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->bonus_token, truth[4]);
  EXPECT_EQ(next->committed_len, 8);
}

TEST(ServerSessions, DuplicateRequestIdsApplyOnceAndTheLastEightAreKept) {
  Fixture f = Start();
  std::vector<int32_t> truth;
  auto s = f.OpenGreedy({1, 2, 3}, 16, &truth);
  ASSERT_TRUE(s.ok());
  auto a = f.t.client->Verify(s->session_id, DraftTree{}, Rid("x"));
  ASSERT_TRUE(a.ok());
  for (int k = 0; k < 3; ++k) {
    auto dup = f.t.client->Verify(s->session_id, DraftTree{}, Rid("x"));
    ASSERT_TRUE(dup.ok()) << dup.status();
    EXPECT_EQ(dup->bonus_token, a->bonus_token);
    EXPECT_EQ(dup->committed_len, 4);
  }
  // The same request id with another tree is a client error, not a retry: nothing applied.
  ExpectCode(f.t.client->Verify(s->session_id, DraftTree{{5}, {-1}}, Rid("x")).status(),
             absl::StatusCode::kInvalidArgument, "items[0].request_id");
  EXPECT_EQ(f.t.server->kv_slots_used(), 4);
  // Eight more ids: "x" falls out of the window and would run again; expected_committed_len
  // catches that (ABORTED), nothing applied.
  for (int k = 0; k < 8; ++k) {
    auto r = f.t.client->Verify(s->session_id, DraftTree{}, Rid(absl::StrCat("y", k)));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->bonus_token, truth[2 + k]);
  }
  auto y0 = f.t.client->Verify(s->session_id, DraftTree{}, Rid("y0", 12));
  ASSERT_TRUE(y0.ok()) << y0.status();
  EXPECT_EQ(y0->committed_len, 5);  // still remembered: the stored result
  ExpectCode(f.t.client->Verify(s->session_id, DraftTree{}, Rid("x", 3)).status(),
             absl::StatusCode::kAborted, "expected_committed_len");
  EXPECT_EQ(f.t.server->kv_slots_used(), 12);
  // A request id longer than 128 bytes names the field.
  ExpectCode(f.t.client->Verify(s->session_id, DraftTree{}, Rid(std::string(129, 'z'))).status(),
             absl::StatusCode::kInvalidArgument, "items[0].request_id");
}

TEST(ServerSessions, WrongExpectedCommittedLenIsAbortedAndAppliesNothing) {
  Fixture f = Start();
  std::vector<int32_t> truth;
  auto s = f.OpenGreedy({9, 8, 7, 6, 5}, 3, &truth);
  auto other = f.t.client->Open({1});
  ASSERT_TRUE(s.ok() && other.ok());
  const int64_t used = f.t.server->kv_slots_used();
  ExpectCode(f.t.client->Verify(s->session_id, DraftTree{{1, 2}, {-1, 0}}, Rid("", 4)).status(),
             absl::StatusCode::kAborted, "items[0].expected_committed_len: 4");
  // Several items: the bad one fails the call; the good one is not applied either.
  v1::VerifyRequest req = OneItem(other->session_id, "o1", 1);
  *req.add_items() = OneItem(s->session_id, "s1", 6).items(0);
  v1::VerifyResponse resp;
  const absl::Status st = f.t.client->VerifyRaw(req, &resp);
  ExpectCode(st, absl::StatusCode::kAborted, "items[1].expected_committed_len: 6");
  EXPECT_THAT(std::string(st.message()), HasSubstr("committed_len 5"));
  EXPECT_EQ(f.t.server->kv_slots_used(), used);
  auto r = f.t.client->Verify(s->session_id, DraftTree{}, Rid("s1", 5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->committed_len, 6);
  EXPECT_EQ(r->bonus_token, truth[1]);
  auto o1 = f.t.client->Verify(other->session_id, DraftTree{}, Rid("o1", 1));
  ASSERT_TRUE(o1.ok()) << o1.status();
  EXPECT_EQ(o1->committed_len, 2);
}

// ------------------------------------------------ truncate / fork bookkeeping (toy engine)

TEST(ServerSessions, SlotsAreCountedExactlyThroughForkTruncateAndClose) {
  Fixture f = Start();
  Server& srv = *f.t.server;
  VerifyClient& c = *f.t.client;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  const auto truth = f.Greedy(prompt, 12);
  auto a = c.Open(prompt);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(srv.kv_slots_used(), 6);
  ASSERT_TRUE(c.Verify(a->session_id, DraftTree{}).ok());  // a: 7
  EXPECT_EQ(srv.kv_slots_used(), 7);
  auto b = c.Fork(a->session_id);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->committed_len, 7);
  EXPECT_EQ(b->next_token, truth[1]);
  EXPECT_EQ(srv.kv_slots_used(), 7);  // shared, no copy
  EXPECT_EQ(srv.kv_slots_shared(), 7);
  EXPECT_EQ(srv.active_sessions(), 2);
  // Each branch writes only its own new slots.
  auto ra = c.Verify(a->session_id, DraftTree{{truth[2]}, {-1}});
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(ra->committed_len, 9);
  auto rb = c.Verify(b->session_id, DraftTree{});
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->committed_len, 8);
  EXPECT_EQ(rb->bonus_token, truth[2]);
  EXPECT_EQ(srv.kv_slots_used(), 7 + 2 + 1);
  // Truncating a below the fork point frees only what a alone held.
  auto ta = c.Truncate(a->session_id, 4);
  ASSERT_TRUE(ta.ok()) << ta.status();
  EXPECT_EQ(ta->committed_len, 4);
  EXPECT_EQ(ta->next_token, prompt[4]);   // the token that followed the first 4
  EXPECT_EQ(srv.kv_slots_used(), 7 + 1);  // b's 8; a's 4 are b's first 4
  EXPECT_EQ(srv.kv_slots_shared(), 4);
  // Truncating to the current length changes nothing.
  auto same = c.Truncate(b->session_id, 8);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->next_token, rb->bonus_token);
  EXPECT_EQ(srv.kv_slots_used(), 8);
  // A prefix open shares b's committed slots and prefills only the new tokens.
  auto p = c.Open({7, 7}, b->session_id);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->committed_len, 10);
  EXPECT_EQ(srv.kv_slots_used(), 10);
  ASSERT_TRUE(c.Close(b->session_id).ok());
  EXPECT_EQ(srv.kv_slots_used(), 10);  // all still held by p (and a)
  ASSERT_TRUE(c.Close(p->session_id).ok());
  EXPECT_EQ(srv.kv_slots_used(), 4);
  auto ra2 = c.Verify(a->session_id, DraftTree{});
  ASSERT_TRUE(ra2.ok()) << ra2.status();
  EXPECT_EQ(ra2->committed_len, 5);
  EXPECT_EQ(srv.kv_slots_used(), 5);
  ASSERT_TRUE(c.Close(a->session_id).ok());
  EXPECT_EQ(srv.kv_slots_used(), 0);
  EXPECT_EQ(srv.kv_slots_shared(), 0);
  EXPECT_EQ(srv.active_sessions(), 0);
}

// A step's requests that share a prefix (forks of one session) are batched side by side,
// whatever order the call listed them in (the CUDA verify attention reads a shared prefix
// once for adjacent requests), and every item still gets its own result, in request order.
TEST(ServerSessions, ForksAreBatchedSideBySide) {
  Fixture f = Start();
  VerifyClient& c = *f.t.client;
  const std::vector<int32_t> pa = {1, 2, 3, 4, 5}, pb = {9, 8, 7};
  auto a = c.Open(pa);
  auto b = c.Open(pb);
  ASSERT_TRUE(a.ok() && b.ok());
  auto a1 = c.Fork(a->session_id);
  auto a2 = c.Fork(a->session_id);
  ASSERT_TRUE(a1.ok() && a2.ok());
  v1::VerifyRequest req;
  const std::vector<std::string> ids = {a1->session_id, b->session_id, a2->session_id,
                                        a->session_id};
  for (const std::string& id : ids) req.add_items()->set_session_id(id);
  v1::VerifyResponse resp;
  const absl::Status st = c.VerifyRaw(req, &resp);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(resp.results_size(), 4);
  const auto ta = f.Greedy(pa, 2), tb = f.Greedy(pb, 2);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(resp.results(i).session_id(), ids[i]);
    EXPECT_EQ(resp.results(i).bonus_token(), i == 1 ? tb[1] : ta[1]) << i;
  }
  // The engine saw a's three branches next to each other (the same first context slot).
  const std::vector<int32_t> order = f.toy->last_first_context_slots();
  ASSERT_EQ(order.size(), 4u);
  int runs = 1;
  for (size_t k = 1; k < order.size(); ++k) runs += order[k] != order[k - 1];
  EXPECT_EQ(runs, 2) << "forks split apart in the batch";
}

TEST(ServerSessions, TruncateAndForkBadInputNameTheField) {
  ServerOptions so;
  so.max_sessions = 2;
  Fixture f = Start({}, so);
  VerifyClient& c = *f.t.client;
  auto s = c.Open({1, 2, 3});
  ASSERT_TRUE(s.ok());
  ExpectCode(c.Truncate("", 1).status(), absl::StatusCode::kInvalidArgument, "session_id");
  ExpectCode(c.Truncate("nope", 1).status(), absl::StatusCode::kNotFound, "session_id");
  ExpectCode(c.Truncate(s->session_id, 0).status(), absl::StatusCode::kInvalidArgument,
             "committed_len: 0");
  ExpectCode(c.Truncate(s->session_id, -5).status(), absl::StatusCode::kInvalidArgument,
             "committed_len");
  ExpectCode(c.Truncate(s->session_id, 4).status(), absl::StatusCode::kInvalidArgument,
             "committed_len: 4 exceeds the session's committed_len 3");
  ExpectCode(c.Fork("").status(), absl::StatusCode::kInvalidArgument, "session_id");
  ExpectCode(c.Fork("nope").status(), absl::StatusCode::kNotFound, "session_id");
  ExpectCode(c.Open({1}, "nope").status(), absl::StatusCode::kNotFound, "prefix_session_id");
  const int64_t max_prompt = f.toy_options.max_context - 1;
  ExpectCode(c.Open(std::vector<int32_t>(max_prompt - 2, 1), s->session_id).status(),
             absl::StatusCode::kInvalidArgument, "prompt_tokens: prefix length 3");
  auto b = c.Fork(s->session_id);
  ASSERT_TRUE(b.ok());
  ExpectCode(c.Fork(s->session_id).status(), absl::StatusCode::kResourceExhausted, "session");
  ExpectCode(c.Open({1}, s->session_id).status(), absl::StatusCode::kResourceExhausted, "session");
  EXPECT_EQ(f.t.server->kv_slots_used(), 3);  // nothing leaked by the failures
  ASSERT_TRUE(c.Close(s->session_id).ok());
  ASSERT_TRUE(c.Close(b->session_id).ok());
  EXPECT_EQ(f.t.server->kv_slots_used(), 0);
  ExpectCode(c.Truncate(s->session_id, 1).status(), absl::StatusCode::kNotFound, "session_id");
}

TEST(ServerSessions, TruncateWaitsForTheCallInFlight) {
  Fixture f = Start();
  std::vector<int32_t> truth;
  auto s = f.OpenGreedy({3, 3, 3}, 4, &truth);
  ASSERT_TRUE(s.ok());
  std::thread t =
      StartHeldCall(f, [&] { EXPECT_TRUE(f.t.client->Verify(s->session_id, DraftTree{}).ok()); });
  absl::StatusOr<client::OpenResult> tr;
  std::atomic<bool> done{false};
  std::thread u([&] {
    tr = f.t.client->Truncate(s->session_id, 4);  // valid only once the verify applied
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(done.load());
  f.toy->Resume();
  t.join();
  u.join();
  ASSERT_TRUE(tr.ok()) << tr.status();
  EXPECT_EQ(tr->committed_len, 4);
  EXPECT_EQ(tr->next_token, truth[1]);
}

TEST(ServerSessions, GaugesAreExactRightAfterEachChange) {
  ServerOptions so;
  so.housekeeping_period = absl::Hours(1);  // nothing refreshes the gauges behind our back
  Fixture f = Start({}, so, /*metrics=*/true);
  auto gauge = [&](const std::string& series) -> double {
    auto body = testing::HttpGet(f.t.server->metrics_port(), "/metrics");
    if (!body.ok()) return -2;
    for (absl::string_view line : absl::StrSplit(*body, '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        return std::stod(std::string(line.substr(series.size() + 1)));
      }
    }
    return -1;
  };
  VerifyClient& c = *f.t.client;
  auto a = c.Open({1, 2, 3, 4});
  auto b = c.Open({5, 6});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(gauge("verifyd_kv_slots_used"), 6);
  EXPECT_EQ(gauge("verifyd_active_sessions"), 2);
  auto k = c.Fork(a->session_id);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(gauge("verifyd_kv_slots_used"), 6);
  EXPECT_EQ(gauge("verifyd_active_sessions"), 3);
  ASSERT_TRUE(c.Verify(k->session_id, DraftTree{{1, 2}, {-1, 0}}).ok());
  EXPECT_EQ(gauge("verifyd_kv_slots_used"), static_cast<double>(f.t.server->kv_slots_used()));
  ASSERT_TRUE(c.Truncate(k->session_id, 2).ok());
  EXPECT_EQ(gauge("verifyd_kv_slots_used"), 6);
  ASSERT_TRUE(c.Close(a->session_id).ok());
  EXPECT_EQ(gauge("verifyd_kv_slots_used"), 4);  // k holds 2 of a's, b holds 2
  EXPECT_EQ(gauge("verifyd_active_sessions"), 2);
  ASSERT_TRUE(c.Close(b->session_id).ok());
  ASSERT_TRUE(c.Close(k->session_id).ok());
  EXPECT_EQ(gauge("verifyd_kv_slots_used"), 0);
  EXPECT_EQ(gauge("verifyd_active_sessions"), 0);
}

// A session opened on another thread on a long prompt (n tokens), the toy engine taking 5 ms a
// step: a chunked prefill that runs while the test makes other calls.
struct LongOpen {
  Fixture& f;
  std::vector<int32_t> prompt;
  int64_t steps0 = 0;  // the engine's steps before the open
  std::atomic<bool> opened{false};
  absl::StatusOr<client::OpenResult> big;
  std::thread t;

  LongOpen(Fixture& fx, int n) : f(fx), prompt(n) {
    f.toy->set_step_delay(absl::Milliseconds(5));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7) % 97);
    steps0 = f.toy->steps();
    t = std::thread([this] {
      big = f.t.client->Open(prompt);
      opened = true;
    });
  }
  ~LongOpen() {
    if (t.joinable()) t.join();
  }
  // Waits for the open, which must have succeeded with the toy model's pending token.
  void Finish() {
    t.join();
    ASSERT_TRUE(big.ok()) << big.status();
    EXPECT_EQ(big->next_token, f.Greedy(prompt, 1)[0]);
  }
};

TEST(ServerSessions, LongPrefillIsChunkedAndOtherSessionsKeepVerifying) {
  ToyEngineOptions o;
  o.max_context = 4096;
  ServerOptions so;
  so.prefill_chunk = 16;
  Fixture f = Start(o, so);
  auto other = f.t.client->Open({1, 2});
  ASSERT_TRUE(other.ok());
  LongOpen big(f, 640);  // 40 chunks
  int rounds_during = 0;
  while (!big.opened.load()) {
    ASSERT_TRUE(f.t.client->Verify(other->session_id, DraftTree{}).ok());
    if (!big.opened.load()) ++rounds_during;
  }
  big.Finish();
  EXPECT_GE(f.toy->steps() - big.steps0, 40);
  EXPECT_GE(rounds_during, 5) << "verify rounds waited for the whole prefill";
}

// A Verify call with max_batch items does not wait for a long prefill that holds a batch
// place: the prefill sits out one step (never two in a row) and the call runs.
TEST(ServerSessions, FullBatchVerifyDoesNotWaitForLongPrefill) {
  constexpr int kN = 4;
  ToyEngineOptions o;
  o.max_context = 4096;
  ServerOptions so;
  so.max_batch = kN;
  so.prefill_chunk = 16;
  Fixture f = Start(o, so);
  std::vector<std::string> ids;
  for (int i = 0; i < kN; ++i) {
    auto s = f.t.client->Open({1, 2, i});
    ASSERT_TRUE(s.ok()) << s.status();
    ids.push_back(s->session_id);
  }
  LongOpen big(f, 1280);                                                   // 80 chunks: >= 400 ms
  ASSERT_TRUE(WaitFor([&] { return f.toy->steps() - big.steps0 >= 3; }));  // the prefill runs
  int calls_during = 0;
  for (int r = 0; r < 3; ++r) {
    auto v = f.t.client->VerifyMany(ids, std::vector<DraftTree>(kN));
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_EQ(v->size(), static_cast<size_t>(kN));
    if (!big.opened.load()) ++calls_during;
  }
  big.Finish();
  EXPECT_EQ(calls_during, 3) << "a full-batch Verify waited for the whole prefill";
  EXPECT_LE(f.toy->max_batch_seen(), kN);
}

// ------------------------------------------------------ token equality (real CPU engine)

constexpr uint64_t kSeed = 77;

absl::StatusOr<std::unique_ptr<tp::Engine>> TinyEngine() {
  tp::EngineOptions o;
  o.model = "tiny";
  o.seed = kSeed;
  o.tp = 1;
  o.kv_slots = 2048;
  o.limits.max_batch = 16;
  return tp::CreateCpuEngine(o);
}

struct Tiny {
  std::unique_ptr<tp::Engine> reference;
  TestServer t;
  int64_t vocab = 0;
};

Tiny StartTiny(ServerOptions so = {}) {
  Tiny x;
  auto ref = TinyEngine();
  auto eng = TinyEngine();
  EXPECT_TRUE(ref.ok() && eng.ok());
  x.reference = *std::move(ref);
  x.vocab = (*eng)->config().vocab_size;
  auto t = StartTestServer(so, *std::move(eng), /*metrics=*/false);
  EXPECT_TRUE(t.ok()) << t.status();
  x.t = *std::move(t);
  return x;
}

std::vector<int32_t> Prompt(int n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& v : p) v = static_cast<int32_t>(rng() % vocab);
  return p;
}

// Runs `rounds` Verify rounds with random trees on `session`, appending the collected tokens
// to *out; out[k] is expected to be truth[k] (the trees are drafted from truth).
void Collect(VerifyClient& c, const std::string& session, const std::vector<int32_t>& truth,
             int64_t vocab, int rounds, uint64_t seed, std::vector<int32_t>* out) {
  std::mt19937_64 rng(seed);
  for (int r = 0; r < rounds; ++r) {
    std::vector<int32_t> ahead(truth.begin() + static_cast<int64_t>(out->size()), truth.end());
    const DraftTree tree = testing::RandomTree(ahead, vocab, 6, 0.7, rng);
    auto v = c.Verify(session, tree);
    ASSERT_TRUE(v.ok()) << v.status();
    out->insert(out->end(), v->accepted_tokens.begin(), v->accepted_tokens.end());
    out->push_back(v->bonus_token);
  }
}

TEST(ServerSessionsTiny, TruncateThenContinueEqualsAFreshSessionOnTheSameTokens) {
  Tiny x = StartTiny();
  VerifyClient& c = *x.t.client;
  const std::vector<int32_t> prompt = Prompt(12, x.vocab, 1);
  auto truth = testing::GreedyViaEngine(x.reference.get(), prompt, 48);
  ASSERT_TRUE(truth.ok()) << truth.status();
  auto s = c.Open(prompt);
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> got = {s->next_token};
  Collect(c, s->session_id, *truth, x.vocab, 5, 11, &got);
  ASSERT_EQ(got, std::vector<int32_t>(truth->begin(), truth->begin() + got.size()));
  std::vector<int32_t> history = prompt;  // committed tokens + pending
  history.insert(history.end(), got.begin(), got.end());

  // (1) Back to a point after the prompt: the pending token is the greedy one there.
  const int64_t l1 = static_cast<int64_t>(prompt.size()) + 2;
  auto t1 = c.Truncate(s->session_id, l1);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ(t1->next_token, history[l1]);
  auto fresh1 = c.Open(std::vector<int32_t>(history.begin(), history.begin() + l1));
  ASSERT_TRUE(fresh1.ok());
  EXPECT_EQ(fresh1->next_token, t1->next_token);
  std::vector<int32_t> expect(truth->begin() + 2, truth->end());
  std::vector<int32_t> got_a = {t1->next_token}, got_b = {fresh1->next_token};
  Collect(c, s->session_id, expect, x.vocab, 4, 21, &got_a);
  Collect(c, fresh1->session_id, expect, x.vocab, 4, 22, &got_b);
  const size_t n = std::min(got_a.size(), got_b.size());
  ASSERT_GT(n, 4u);
  EXPECT_EQ(std::vector<int32_t>(got_a.begin(), got_a.begin() + n),
            std::vector<int32_t>(got_b.begin(), got_b.begin() + n));
  EXPECT_EQ(std::vector<int32_t>(got_a.begin(), got_a.begin() + n),
            std::vector<int32_t>(expect.begin(), expect.begin() + n));

  // (2) Back into the prompt: the pending token is the prompt token there, and the session
  // continues as a fresh session opened on the first l2 + 1 prompt tokens.
  const int64_t l2 = 5;
  auto t2 = c.Truncate(s->session_id, l2);
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t2->next_token, prompt[l2]);
  const std::vector<int32_t> p2(prompt.begin(), prompt.begin() + l2 + 1);
  auto truth2 = testing::GreedyViaEngine(x.reference.get(), p2, 40);
  ASSERT_TRUE(truth2.ok());
  auto fresh2 = c.Open(p2);
  ASSERT_TRUE(fresh2.ok());
  EXPECT_EQ(fresh2->next_token, (*truth2)[0]);
  std::vector<int32_t> got2;
  Collect(c, s->session_id, *truth2, x.vocab, 5, 31, &got2);
  EXPECT_EQ(got2, std::vector<int32_t>(truth2->begin(), truth2->begin() + got2.size()));
  for (const auto& id : {s->session_id, fresh1->session_id, fresh2->session_id}) {
    ASSERT_TRUE(c.Close(id).ok());
  }
  EXPECT_EQ(x.t.server->kv_slots_used(), 0);
}

TEST(ServerSessionsTiny, ForkedBranchesEachEqualTheirOwnGreedyRun) {
  Tiny x = StartTiny();
  VerifyClient& c = *x.t.client;
  const std::vector<int32_t> prompt = Prompt(10, x.vocab, 2);
  auto truth = testing::GreedyViaEngine(x.reference.get(), prompt, 60);
  ASSERT_TRUE(truth.ok());
  auto a = c.Open(prompt);
  ASSERT_TRUE(a.ok());
  std::vector<int32_t> got_a = {a->next_token};
  Collect(c, a->session_id, *truth, x.vocab, 3, 41, &got_a);
  auto b = c.Fork(a->session_id);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->next_token, got_a.back());
  // Branch b goes back into the prompt: its own greedy run from there.
  const int64_t lb = 6;
  ASSERT_TRUE(c.Truncate(b->session_id, lb).ok());
  const std::vector<int32_t> pb(prompt.begin(), prompt.begin() + lb + 1);
  auto truth_b = testing::GreedyViaEngine(x.reference.get(), pb, 40);
  ASSERT_TRUE(truth_b.ok());
  // Branch c: a's committed tokens plus new prompt tokens, on a's shared prefix.
  std::vector<int32_t> pc = prompt;
  pc.insert(pc.end(), got_a.begin(), got_a.end() - 1);  // a's committed tokens
  const std::vector<int32_t> extra = {3, 1, 4};
  pc.insert(pc.end(), extra.begin(), extra.end());
  auto truth_c = testing::GreedyViaEngine(x.reference.get(), pc, 40);
  ASSERT_TRUE(truth_c.ok());
  auto cc = c.Open(extra, a->session_id);
  ASSERT_TRUE(cc.ok()) << cc.status();
  EXPECT_EQ(cc->committed_len, static_cast<int64_t>(pc.size()));
  EXPECT_EQ(cc->next_token, (*truth_c)[0]);
  std::vector<int32_t> got_b, got_c = {cc->next_token};
  // Interleaved rounds: no branch's writes may disturb another's shared prefix.
  for (int r = 0; r < 4; ++r) {
    Collect(c, a->session_id, *truth, x.vocab, 1, 50 + r, &got_a);
    Collect(c, b->session_id, *truth_b, x.vocab, 1, 60 + r, &got_b);
    Collect(c, cc->session_id, *truth_c, x.vocab, 1, 70 + r, &got_c);
  }
  EXPECT_EQ(got_a, std::vector<int32_t>(truth->begin(), truth->begin() + got_a.size()));
  EXPECT_EQ(got_b, std::vector<int32_t>(truth_b->begin(), truth_b->begin() + got_b.size()));
  EXPECT_EQ(got_c, std::vector<int32_t>(truth_c->begin(), truth_c->begin() + got_c.size()));
  for (const auto& id : {a->session_id, b->session_id, cc->session_id}) {
    ASSERT_TRUE(c.Close(id).ok());
  }
  EXPECT_EQ(x.t.server->kv_slots_used(), 0);
  EXPECT_EQ(x.t.server->active_sessions(), 0);
}

TEST(ServerSessionsTiny, ChunkedPrefillGivesTheSameTokensAsOneStep) {
  ServerOptions chunked;
  chunked.prefill_chunk = 7;
  Tiny x = StartTiny(chunked);
  Tiny y = StartTiny();  // default 512: capped by the engine's row limit, one step here
  const int64_t rows = x.reference->limits().max_tail_rows;
  // Several prompts (the tiny model's greedy token often depends on the last few tokens
  // only): 9 chunks of 7 rows vs one step each.
  for (uint64_t seed = 3; seed < 11; ++seed) {
    const std::vector<int32_t> prompt =
        Prompt(static_cast<int>(std::min<int64_t>(60, rows)), x.vocab, seed);
    auto sx = x.t.client->Open(prompt);
    auto sy = y.t.client->Open(prompt);
    ASSERT_TRUE(sx.ok() && sy.ok());
    EXPECT_EQ(sx->next_token, sy->next_token) << seed;
    auto truth = testing::GreedyViaEngine(x.reference.get(), prompt, 24);
    ASSERT_TRUE(truth.ok());
    EXPECT_EQ(sx->next_token, (*truth)[0]) << seed;
    std::vector<int32_t> gx = {sx->next_token}, gy = {sy->next_token};
    Collect(*x.t.client, sx->session_id, *truth, x.vocab, 3, seed, &gx);
    Collect(*y.t.client, sy->session_id, *truth, y.vocab, 3, seed, &gy);
    EXPECT_EQ(gx, gy) << seed;
    EXPECT_EQ(gx, std::vector<int32_t>(truth->begin(), truth->begin() + gx.size())) << seed;
    ASSERT_TRUE(x.t.client->Close(sx->session_id).ok());
    ASSERT_TRUE(y.t.client->Close(sy->session_id).ok());
  }
}

}  // namespace
}  // namespace verifyd::server
