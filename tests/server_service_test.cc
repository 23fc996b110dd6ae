// VerifyService over loopback gRPC against an in-process server with the toy engine (which
// rejects any step whose context slots are not exactly the session's sequence, so KV
// bookkeeping errors fail loudly): GetInfo, bad input, slot accounting, exhaustion, TTL,
// batching, queue limits, engine failures, VerifyStream, health, metrics, drain.
#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "client/verify_client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "server/toy_engine.h"
#include "tests/toy_server_fixture.h"

namespace verifyd::server {
namespace {

using client::DraftTree;
using client::HealthStatus;
using client::VerifyClient;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ToyEngine;
using testing::ToyEngineOptions;

std::vector<int32_t> RandomPrompt(int n, int64_t vocab, std::mt19937_64& rng) {
  std::vector<int32_t> p(n);
  for (auto& x : p) x = static_cast<int32_t>(rng() % vocab);
  return p;
}

// A good request after a bad one: a decode step on a fresh session succeeds and matches the
// toy model's greedy continuation.
void ExpectServesGoodRequest(Fixture& f) {
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  auto truth = f.Greedy(prompt, 2);
  auto open = f.t.client->Open(prompt);
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ(open->next_token, truth[0]);
  auto r = f.t.client->Verify(open->session_id, DraftTree{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bonus_token, truth[1]);
  EXPECT_EQ(r->committed_len, 6);
  ASSERT_TRUE(f.t.client->Close(open->session_id).ok());
}

TEST(ServerService, GetInfoReportsEngineAndLimits) {
  ToyEngineOptions o;
  o.tp_size = 2;
  o.kv_slots = 777;
  o.max_tail_rows = 33;
  o.max_context = 999;
  ServerOptions so;
  so.max_batch = 16;
  Fixture f = Start(o, so);
  auto info = f.t.client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model().name(), "toy");
  EXPECT_EQ(info->model().vocab_size(), o.vocab_size);
  EXPECT_EQ(info->tp_size(), 2);
  EXPECT_EQ(info->backend(), "toy");
  EXPECT_EQ(info->limits().max_draft_nodes(), 32);
  EXPECT_EQ(info->limits().max_context(), 999);
  EXPECT_EQ(info->limits().max_batch(), 16);
  EXPECT_EQ(info->limits().kv_slots(), 777);
  EXPECT_TRUE(info->exact_lossless());
  EXPECT_EQ(info->kv_cache_dtype(), "none");
}

// exact_lossless reports the engine's batch invariance (a CUDA engine without
// --batch_invariant reports false).
TEST(ServerService, GetInfoReportsWhetherLosslessIsExact) {
  ToyEngineOptions o;
  o.batch_invariant = false;
  Fixture f = Start(o, ServerOptions{});
  auto info = f.t.client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->exact_lossless());
}

absl::StatusOr<verify::v1::GetInfoResponse> InfoWithMemory(const tp::EngineMemory& memory) {
  auto t = testing::StartTestServer(ServerOptions{}, std::make_unique<ToyEngineWithMemory>(memory),
                                    /*metrics=*/false);
  if (!t.ok()) return t.status();
  return t->client->GetInfo();
}

// GetInfoResponse.memory carries every field of the engine's memory.
TEST(ServerService, GetInfoReportsTheEnginesDeviceMemory) {
  const tp::EngineMemory m = ExampleMemory();
  auto info = InfoWithMemory(m);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->has_memory());
  const auto& got = info->memory();
  EXPECT_EQ(got.device_bytes(), m.device_bytes);
  EXPECT_EQ(got.weight_bytes(), m.weight_bytes);
  EXPECT_EQ(got.workspace_bytes(), m.workspace_bytes);
  EXPECT_EQ(got.kv_cache_bytes(), m.kv_cache_bytes);
  EXPECT_EQ(got.kv_bytes_per_token(), m.kv_bytes_per_token);
  EXPECT_EQ(got.kv_tokens(), m.kv_tokens);
  EXPECT_EQ(got.used_before_kv_bytes(), m.used_before_kv_bytes);
  EXPECT_EQ(got.planned_before_kv_bytes(), m.planned_before_kv_bytes);
}

// Without device memory (device_bytes 0: the CPU and toy engines) the field stays unset, even
// when other parts are nonzero.
TEST(ServerService, GetInfoLeavesMemoryUnsetWithoutDeviceMemory) {
  Fixture f = Start();
  auto info = f.t.client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->has_memory());
  tp::EngineMemory m;
  m.weight_bytes = 1000;
  m.kv_tokens = 16;
  auto partial = InfoWithMemory(m);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_FALSE(partial->has_memory());
}

TEST(ServerService, BuildAndStartReportsBadOptionsAndBusyPorts) {
  ServerOptions bad;
  bad.max_batch = 0;
  auto st = Server::BuildAndStart(bad, std::make_unique<ToyEngine>(ToyEngineOptions{}));
  ExpectCode(st.status(), absl::StatusCode::kInvalidArgument, "max_batch");
  ExpectCode(Server::BuildAndStart({}, nullptr).status(), absl::StatusCode::kInvalidArgument,
             "engine");

  Fixture f = Start({}, {}, /*metrics=*/true);
  ServerOptions same_port;
  same_port.listen = absl::StrCat("127.0.0.1:", f.t.server->port());
  same_port.metrics_listen = "";
  ExpectCode(
      Server::BuildAndStart(same_port, std::make_unique<ToyEngine>(ToyEngineOptions{})).status(),
      absl::StatusCode::kUnavailable, "listen");
  ServerOptions same_metrics;
  same_metrics.listen = "127.0.0.1:0";
  same_metrics.metrics_listen = absl::StrCat("127.0.0.1:", f.t.server->metrics_port());
  ExpectCode(
      Server::BuildAndStart(same_metrics, std::make_unique<ToyEngine>(ToyEngineOptions{})).status(),
      absl::StatusCode::kUnavailable, "metrics_listen");
  ExpectServesGoodRequest(f);
}

// One ServerReflectionInfo exchange asking for the service list (raw wire format:
// ServerReflectionRequest.list_services = field 7, string). Returns the status and the
// response bytes.
std::pair<grpc::Status, std::string> ListServicesByReflection(const std::string& target) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto next = [&] { return cq.Next(&tag, &ok) && ok; };
  call->StartCall(reinterpret_cast<void*>(1));
  std::string out;
  grpc::Status status;
  if (next()) {
    const std::string req("\x3a\x00", 2);  // list_services: ""
    grpc::Slice slice(req);
    grpc::ByteBuffer buf(&slice, 1);
    call->Write(buf, reinterpret_cast<void*>(2));
    if (next()) {
      grpc::ByteBuffer resp;
      call->Read(&resp, reinterpret_cast<void*>(3));
      if (next()) {
        std::vector<grpc::Slice> slices;
        (void)resp.Dump(&slices);
        for (const auto& sl : slices)
          out.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
    }
    call->WritesDone(reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
  }
  call->Finish(&status, reinterpret_cast<void*>(5));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(5)) {
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return {status, out};
}

TEST(ServerService, ReflectionOnlyWithTheFlag) {
  for (bool on : {false, true, false}) {
    ServerOptions so;
    so.reflection = on;
    Fixture f = Start({}, so);
    auto [status, out] = ListServicesByReflection(f.t.target);
    if (on) {
      EXPECT_TRUE(status.ok()) << status.error_message();
      EXPECT_THAT(out, HasSubstr("verify.v1.VerifyService"));
      EXPECT_THAT(out, HasSubstr("grpc.health.v1.Health"));
    } else {
      EXPECT_EQ(status.error_code(), grpc::UNIMPLEMENTED) << status.error_message();
    }
  }
}

TEST(ServerService, HealthIsServing) {
  Fixture f = Start();
  auto h = f.t.client->Health();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, HealthStatus::kServing);
}

TEST(ServerService, BadInputGivesStatedStatusAndServerKeepsServing) {
  ToyEngineOptions o;
  o.max_context = 128;
  ServerOptions so;
  so.max_batch = 4;
  so.max_message_bytes = 4096;
  Fixture f = Start(o, so);
  VerifyClient& c = *f.t.client;
  const int64_t V = o.vocab_size;

  // A session that must stay untouched by every bad call.
  auto keep = c.Open({7, 8, 9});
  ASSERT_TRUE(keep.ok());
  const int64_t used_before = f.t.server->kv_slots_used();

  // OpenSession.
  ExpectCode(c.Open({}).status(), absl::StatusCode::kInvalidArgument, "prompt_tokens");
  ExpectServesGoodRequest(f);
  ExpectCode(c.Open({1, static_cast<int32_t>(V)}).status(), absl::StatusCode::kInvalidArgument,
             "prompt_tokens[1]");
  ExpectServesGoodRequest(f);
  ExpectCode(c.Open({-5}).status(), absl::StatusCode::kInvalidArgument, "prompt_tokens[0]");
  ExpectServesGoodRequest(f);
  ExpectCode(c.Open(std::vector<int32_t>(128, 1)).status(), absl::StatusCode::kInvalidArgument,
             "prompt_tokens");
  ExpectServesGoodRequest(f);
  // Over the message size limit (4 KiB): rejected by gRPC before any handler.
  ExpectCode(c.Open(std::vector<int32_t>(6000, 100)).status(),
             absl::StatusCode::kResourceExhausted);
  ExpectServesGoodRequest(f);

  // Verify: sessions.
  ExpectCode(c.Verify("no-such-session", DraftTree{}).status(), absl::StatusCode::kNotFound,
             "items[0].session_id");
  ExpectServesGoodRequest(f);
  auto closed = c.Open({1, 2});
  ASSERT_TRUE(closed.ok());
  ASSERT_TRUE(c.Close(closed->session_id).ok());
  ExpectCode(c.Verify(closed->session_id, DraftTree{}).status(), absl::StatusCode::kNotFound,
             "session_id");
  ExpectCode(c.Close(closed->session_id), absl::StatusCode::kNotFound, "session_id");
  ExpectCode(c.Close(""), absl::StatusCode::kInvalidArgument, "session_id");
  ExpectCode(c.Verify("", DraftTree{}).status(), absl::StatusCode::kInvalidArgument,
             "items[0].session_id");
  ExpectServesGoodRequest(f);

  // Verify: trees.
  const std::string s = keep->session_id;
  struct Case {
    DraftTree tree;
    std::string field;
  };
  std::vector<Case> cases = {
      {{{1, 2}, {-1}}, "items[0].tree.parents: size"},
      {{{1, 2, 3}, {-1, 5, 0}}, "items[0].tree.parents[1]"},  // out of range
      {{{1, 2, 3}, {-1, 1, 0}}, "items[0].tree.parents[1]"},  // self: not topological
      {{{1, 2, 3}, {-1, 2, 0}}, "items[0].tree.parents[1]"},  // forward reference
      {{{1, 2}, {-3, 0}}, "items[0].tree.parents[0]"},        // below -1
      {{{1, 2, static_cast<int32_t>(V)}, {-1, 0, 1}}, "items[0].tree.tokens[2]"},
      {{{1, -1}, {-1, 0}}, "items[0].tree.tokens[1]"},
      {{std::vector<int32_t>(65, 1), std::vector<int32_t>(65, -1)}, "items[0].tree.tokens"},
  };
  for (const Case& k : cases) {
    ExpectCode(c.Verify(s, k.tree).status(), absl::StatusCode::kInvalidArgument, k.field);
    ExpectServesGoodRequest(f);
  }
  // Context over the limit: 100 + 1 + 30 > 128.
  auto longs = c.Open(std::vector<int32_t>(100, 3));
  ASSERT_TRUE(longs.ok()) << longs.status();
  ExpectCode(c.Verify(longs->session_id,
                      DraftTree{std::vector<int32_t>(30, 1), std::vector<int32_t>(30, -1)})
                 .status(),
             absl::StatusCode::kInvalidArgument, "items[0].tree: context");
  ExpectServesGoodRequest(f);
  ASSERT_TRUE(c.Close(longs->session_id).ok());

  // The same session twice, too many items, and an unknown session after a good one.
  ExpectCode(c.VerifyMany({s, s}, {DraftTree{}, DraftTree{}}).status(),
             absl::StatusCode::kInvalidArgument, "items[1].session_id");
  ExpectCode(c.VerifyMany({s, "a", "b", "c", "d"}, std::vector<DraftTree>(5)).status(),
             absl::StatusCode::kInvalidArgument, "items");
  ExpectCode(c.VerifyMany({s, "nope"}, {DraftTree{}, DraftTree{}}).status(),
             absl::StatusCode::kNotFound, "items[1].session_id");
  verify::v1::VerifyRequest empty;
  verify::v1::VerifyResponse resp;
  ExpectCode(c.VerifyRaw(empty, &resp), absl::StatusCode::kInvalidArgument, "items");
  ExpectServesGoodRequest(f);

  // The kept session was untouched by all of the above: same slots, and it continues
  // exactly on the greedy sequence.
  EXPECT_EQ(f.t.server->kv_slots_used(), used_before);
  auto truth = f.Greedy({7, 8, 9}, 3);
  auto r = c.Verify(s, DraftTree{{truth[1]}, {-1}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->accepted_tokens, std::vector<int32_t>{truth[1]});
  EXPECT_EQ(r->bonus_token, truth[2]);
  EXPECT_EQ(r->committed_len, 5);
  ASSERT_TRUE(c.Close(s).ok());
  EXPECT_EQ(f.t.server->kv_slots_used(), 0);
}

TEST(ServerService, CallOnABusySessionWaitsForItNotRunTwiceAtOnce) {
  Fixture f = Start();
  auto s = f.t.client->Open({1, 2, 3});
  ASSERT_TRUE(s.ok());
  absl::Status first;
  std::thread t =
      StartHeldCall(f, [&] { first = f.t.client->Verify(s->session_id, DraftTree{}).status(); });
  // A second call waits for the first (bounded by its own deadline), applying nothing.
  VerifyClient impatient(f.t.target, absl::Milliseconds(150));
  ExpectCode(impatient.Verify(s->session_id, DraftTree{}).status(),
             absl::StatusCode::kDeadlineExceeded);
  // A patient one runs after the first has finished.
  absl::StatusOr<client::VerifyOutcome> second;
  std::thread t2([&] { second = f.t.client->Verify(s->session_id, DraftTree{}); });
  // The held step counts as a stall for the watchdog once it outlives the limit.
  EXPECT_TRUE(f.t.server->engine_progressing(absl::Seconds(60)));
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(f.t.server->engine_progressing(absl::Milliseconds(10)));
  f.toy->Resume();
  t.join();
  t2.join();
  EXPECT_TRUE(first.ok()) << first;
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->committed_len, 5);
  auto r = f.t.client->Verify(s->session_id, DraftTree{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->committed_len, 6);
}

TEST(ServerService, CallCancelledWhileQueuedChangesNothing) {
  Fixture f = Start();
  auto x = f.t.client->Open({1, 2});
  const std::vector<int32_t> py = {3, 4, 5};
  auto y = f.t.client->Open(py);
  ASSERT_TRUE(x.ok() && y.ok());
  const int64_t used = f.t.server->kv_slots_used();
  std::thread tx =
      StartHeldCall(f, [&] { EXPECT_TRUE(f.t.client->Verify(x->session_id, DraftTree{}).ok()); });
  VerifyClient impatient(f.t.target, absl::Milliseconds(100));
  ExpectCode(impatient.Verify(y->session_id, DraftTree{{1, 2}, {-1, 0}}).status(),
             absl::StatusCode::kDeadlineExceeded);
  absl::SleepFor(absl::Milliseconds(50));
  f.toy->Resume();
  tx.join();
  // y did not move (x did: + 1 slot); its next round continues from the prompt.
  const auto truth = f.Greedy(py, 2);
  auto r = f.t.client->Verify(y->session_id, DraftTree{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->committed_len, 4);
  EXPECT_EQ(r->bonus_token, truth[1]);
  EXPECT_EQ(f.t.server->kv_slots_used(), used + 2);
}

TEST(ServerService, ManyCyclesLeaveEverySlotFree) {
  ToyEngineOptions o;
  o.kv_slots = 512;
  Fixture f = Start(o);
  std::mt19937_64 rng(7);
  for (int cycle = 0; cycle < 40; ++cycle) {
    const auto prompt = RandomPrompt(1 + static_cast<int>(rng() % 90), o.vocab_size, rng);
    auto truth = f.Greedy(prompt, 64);
    auto s = f.t.client->Open(prompt);
    ASSERT_TRUE(s.ok()) << s.status();
    size_t have = 1;
    const int rounds = static_cast<int>(rng() % 5);
    for (int r = 0; r < rounds; ++r) {
      std::vector<int32_t> ahead(truth.begin() + have, truth.end());
      auto tree = testing::RandomTree(ahead, o.vocab_size, 20, 0.7, rng);
      auto res = f.t.client->Verify(s->session_id, tree);
      ASSERT_TRUE(res.ok()) << res.status();
      have += res->accepted_tokens.size() + 1;
    }
    EXPECT_EQ(f.t.server->kv_slots_used(),
              static_cast<int64_t>(prompt.size() + have - 1));  // pending has no KV yet
    ASSERT_TRUE(f.t.client->Close(s->session_id).ok());
    ASSERT_EQ(f.t.server->kv_slots_used(), 0) << "cycle " << cycle;
  }
  EXPECT_EQ(f.t.server->active_sessions(), 0);
}

TEST(ServerService, PoolExhaustionIsResourceExhaustedAndOthersUnaffected) {
  ToyEngineOptions o;
  o.kv_slots = 64;
  Fixture f = Start(o);
  VerifyClient& c = *f.t.client;
  const std::vector<int32_t> pa = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  auto a = c.Open(pa);
  ASSERT_TRUE(a.ok());
  ExpectCode(c.Open(std::vector<int32_t>(60, 1)).status(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(f.t.server->kv_slots_used(), 10);
  // B takes most of the rest; a tree too large for what is left fails without effect.
  auto b = c.Open(std::vector<int32_t>(40, 2));
  ASSERT_TRUE(b.ok());
  ExpectCode(
      c.Verify(a->session_id, DraftTree{std::vector<int32_t>(20, 1), std::vector<int32_t>(20, -1)})
          .status(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(f.t.server->kv_slots_used(), 50);
  // A and B keep decoding correctly in one call.
  auto truth_a = f.Greedy(pa, 3);
  auto rs =
      c.VerifyMany({a->session_id, b->session_id}, {DraftTree{{truth_a[1]}, {-1}}, DraftTree{}});
  ASSERT_TRUE(rs.ok()) << rs.status();
  EXPECT_EQ((*rs)[0].accepted_tokens, std::vector<int32_t>{truth_a[1]});
  EXPECT_EQ((*rs)[0].bonus_token, truth_a[2]);
  ASSERT_TRUE(c.Close(b->session_id).ok());
  ASSERT_TRUE(c.Close(a->session_id).ok());
  EXPECT_EQ(f.t.server->kv_slots_used(), 0);
  ExpectServesGoodRequest(f);
}

TEST(ServerService, SessionTableLimit) {
  ServerOptions so;
  so.max_sessions = 2;
  Fixture f = Start({}, so);
  auto a = f.t.client->Open({1});
  auto b = f.t.client->Open({2});
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectCode(f.t.client->Open({3}).status(), absl::StatusCode::kResourceExhausted, "session");
  ASSERT_TRUE(f.t.client->Close(a->session_id).ok());
  EXPECT_TRUE(f.t.client->Open({3}).ok());
}

TEST(ServerService, IdleSessionsExpireAndFreeSlots) {
  ServerOptions so;
  so.session_ttl = absl::Milliseconds(200);
  so.housekeeping_period = absl::Milliseconds(20);
  Fixture f = Start({}, so);
  auto s = f.t.client->Open({1, 2, 3, 4});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(f.t.server->kv_slots_used(), 4);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (f.t.server->kv_slots_used() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(f.t.server->kv_slots_used(), 0);
  EXPECT_EQ(f.t.server->active_sessions(), 0);
  ExpectCode(f.t.client->Verify(s->session_id, DraftTree{}).status(), absl::StatusCode::kNotFound);
}

TEST(ServerService, ActiveSessionIsNotExpired) {
  ServerOptions so;
  so.session_ttl = absl::Milliseconds(300);
  so.housekeeping_period = absl::Milliseconds(20);
  Fixture f = Start({}, so);
  auto s = f.t.client->Open({1, 2, 3});
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 10; ++i) {  // 10 x 100 ms, each call restarting the idle clock
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(f.t.client->Verify(s->session_id, DraftTree{}).ok()) << i;
  }
}

TEST(ServerService, ConcurrentRequestsAreBatchedIntoOneStep) {
  Fixture f = Start();
  constexpr int kSessions = 8;
  std::vector<std::string> ids;
  for (int i = 0; i < kSessions; ++i) {
    auto s = f.t.client->Open({i + 1, 2, 3});
    ASSERT_TRUE(s.ok());
    ids.push_back(s->session_id);
  }
  // Hold the engine in one step while all 8 requests arrive; they must then share a step.
  std::thread opener = StartHeldCall(f, [&] { ASSERT_TRUE(f.t.client->Open({5, 5}).ok()); });
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      if (f.t.client->Verify(ids[i], DraftTree{}).ok()) ++ok;
    });
  }
  // Let all 8 reach the queue.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (f.t.server->queue_depth() < kSessions && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(f.t.server->queue_depth(), kSessions);
  f.toy->Resume();
  for (auto& t : threads) t.join();
  opener.join();
  EXPECT_EQ(ok.load(), kSessions);
  EXPECT_EQ(f.toy->max_batch_seen(), kSessions);
}

TEST(ServerService, QueueFullIsResourceExhausted) {
  ServerOptions so;
  so.max_queue = 1;
  so.max_batch = 1;
  Fixture f = Start({}, so);
  auto a = f.t.client->Open({1});
  auto b = f.t.client->Open({2});
  auto c = f.t.client->Open({3});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  absl::Status sa, sb;
  std::thread ta =
      StartHeldCall(f, [&] { sa = f.t.client->Verify(a->session_id, DraftTree{}).status(); });
  std::thread tb([&] { sb = f.t.client->Verify(b->session_id, DraftTree{}).status(); });
  // b is queued (the engine holds a); c finds the queue full.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (f.t.server->queue_depth() < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(f.t.server->queue_depth(), 1);
  ExpectCode(f.t.client->Verify(c->session_id, DraftTree{}).status(),
             absl::StatusCode::kResourceExhausted, "queue");
  EXPECT_EQ(f.t.server->queue_depth(), 1);
  f.toy->Resume();
  ta.join();
  tb.join();
  EXPECT_TRUE(sa.ok()) << sa;
  EXPECT_TRUE(sb.ok()) << sb;
  EXPECT_TRUE(f.t.client->Verify(c->session_id, DraftTree{}).ok());
}

TEST(ServerService, FailedEngineStepLeaksNoSlotAndSessionContinues) {
  Fixture f = Start();
  std::vector<int32_t> truth;
  auto s = f.OpenGreedy({4, 4, 2}, 8, &truth);
  ASSERT_TRUE(s.ok());
  const int64_t used = f.t.server->kv_slots_used();
  f.toy->FailNextStep(absl::InternalError("injected step failure"));
  auto bad = f.t.client->Verify(s->session_id, DraftTree{{truth[1], 7}, {-1, 0}});
  ExpectCode(bad.status(), absl::StatusCode::kInternal, "internal error");
  EXPECT_THAT(std::string(bad.status().message()), ::testing::Not(HasSubstr("injected")));
  EXPECT_EQ(f.t.server->kv_slots_used(), used);
  auto r = f.t.client->Verify(s->session_id, DraftTree{{truth[1], truth[2]}, {-1, 0}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->accepted_tokens, (std::vector<int32_t>{truth[1], truth[2]}));
  EXPECT_EQ(r->bonus_token, truth[3]);
  // A failed prefill leaves no session and no slot behind.
  f.toy->FailNextStep(absl::InternalError("injected"));
  ExpectCode(f.t.client->Open(std::vector<int32_t>(100, 1)).status(), absl::StatusCode::kInternal);
  EXPECT_EQ(f.t.server->active_sessions(), 1);
  EXPECT_EQ(f.t.server->kv_slots_used(), used + 3);
  EXPECT_FALSE(f.t.server->engine_failed());
}

TEST(ServerService, EngineFailureMakesServerUnavailableAndNotServing) {
  std::atomic<int> failures{0};
  ServerOptions so;
  so.on_engine_failure = [&] { ++failures; };
  Fixture f = Start({}, so);
  auto s = f.t.client->Open({1, 2});
  ASSERT_TRUE(s.ok());
  f.toy->FailPermanently();
  ExpectCode(f.t.client->Verify(s->session_id, DraftTree{}).status(),
             absl::StatusCode::kUnavailable);
  EXPECT_EQ(failures.load(), 1);
  EXPECT_TRUE(f.t.server->engine_failed());
  auto h = f.t.client->Health();
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, HealthStatus::kNotServing);
  ExpectCode(f.t.client->Verify(s->session_id, DraftTree{}).status(),
             absl::StatusCode::kUnavailable);
  ExpectCode(f.t.client->Open({3}).status(), absl::StatusCode::kUnavailable);
}

TEST(ServerService, LosslessWithConcurrentSessionsOverLoopback) {
  ToyEngineOptions o;
  o.seed = 99;
  Fixture f = Start(o);
  constexpr int kSessions = 6;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(1000 + i);
      const auto prompt = RandomPrompt(1 + static_cast<int>(rng() % 150), o.vocab_size, rng);
      const auto truth = f.Greedy(prompt, 120);
      auto s = f.t.client->Open(prompt);
      if (!s.ok()) return void(errors[i] = s.status().ToString());
      std::vector<int32_t> got = {s->next_token};
      while (got.size() < 48) {
        std::vector<int32_t> ahead(truth.begin() + got.size(), truth.end());
        auto tree = testing::RandomTree(ahead, o.vocab_size, 64, 0.8, rng);
        auto r = f.t.client->Verify(s->session_id, tree);
        if (!r.ok()) return void(errors[i] = r.status().ToString());
        // Exactly the path greedy acceptance must take in the client's tree.
        if (r->accepted_nodes != testing::ExpectedAcceptedNodes(tree, ahead)) {
          return void(errors[i] = "accepted nodes differ from the greedy walk");
        }
        for (size_t k = 0; k < r->accepted_nodes.size(); ++k) {
          if (tree.tokens[r->accepted_nodes[k]] != r->accepted_tokens[k]) {
            return void(errors[i] = "accepted tokens are not the accepted nodes' tokens");
          }
        }
        got.insert(got.end(), r->accepted_tokens.begin(), r->accepted_tokens.end());
        got.push_back(r->bonus_token);
        if (r->committed_len != static_cast<int64_t>(prompt.size() + got.size() - 1)) {
          return void(errors[i] = "committed_len mismatch");
        }
      }
      if (!std::equal(got.begin(), got.end(), truth.begin())) errors[i] = "not lossless";
      if (auto st = f.t.client->Close(s->session_id); !st.ok()) errors[i] = st.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(errors[i], "") << "session " << i;
  EXPECT_EQ(f.t.server->kv_slots_used(), 0);
}

TEST(ServerService, VerifyStreamRoundTripsAndEndsWithTheErrorStatus) {
  Fixture f = Start();
  std::vector<int32_t> truth;
  auto s = f.OpenGreedy({11, 12, 13}, 16, &truth);
  ASSERT_TRUE(s.ok());
  auto stream = f.t.client->OpenStream();
  size_t have = 1;
  for (int round = 0; round < 4; ++round) {
    verify::v1::VerifyRequest req;
    auto* item = req.add_items();
    item->set_session_id(s->session_id);
    item->mutable_tree()->add_tokens(truth[have]);
    item->mutable_tree()->add_parents(-1);
    item->mutable_tree()->add_tokens(truth[have + 1]);
    item->mutable_tree()->add_parents(0);
    auto resp = stream->RoundTrip(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->results_size(), 1);
    EXPECT_EQ(resp->results(0).accepted_nodes_size(), 2);
    EXPECT_EQ(resp->results(0).bonus_token(), truth[have + 2]);
    have += 3;
  }
  verify::v1::VerifyRequest bad;
  bad.add_items()->set_session_id("unknown");
  auto resp = stream->RoundTrip(bad);
  ExpectCode(resp.status(), absl::StatusCode::kNotFound, "items[0].session_id");
  // A new stream works after the failed one.
  auto stream2 = f.t.client->OpenStream();
  verify::v1::VerifyRequest req;
  req.add_items()->set_session_id(s->session_id);
  auto ok = stream2->RoundTrip(req);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->results(0).bonus_token(), truth[have]);
  EXPECT_TRUE(stream2->Finish().ok());
}

// A raw bidi call of VerifyStream: messages as bytes, so a test can send what does not parse.
std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> RawStream(
    const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx) {
  return std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(),
          grpc::internal::RpcMethod("/verify.v1.VerifyService/VerifyStream",
                                    grpc::internal::RpcMethod::BIDI_STREAMING),
          ctx));
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Serialized(const verify::v1::VerifyRequest& req) { return req.SerializeAsString(); }

// A stream message that does not parse as a VerifyRequest ends the stream with
// INVALID_ARGUMENT naming it (gRPC's typed Read() reports it like the client's half-close: the
// stream used to end OK, silently dropping the valid messages after it). Messages before it
// are answered; a new stream works.
TEST(ServerService, MalformedVerifyStreamMessageIsInvalidArgument) {
  Fixture f = Start();
  auto s = f.t.client->Open({11, 12, 13});
  ASSERT_TRUE(s.ok()) << s.status();
  auto channel = grpc::CreateChannel(f.t.target, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = RawStream(channel, &ctx);
  verify::v1::VerifyRequest good;
  good.add_items()->set_session_id(s->session_id);
  ASSERT_TRUE(stream->Write(Bytes(Serialized(good))));
  grpc::ByteBuffer reply;
  ASSERT_TRUE(stream->Read(&reply));
  // Field 1 (items), length-delimited, with a length running past the message's end.
  ASSERT_TRUE(stream->Write(Bytes(std::string("\x0a\x7f\x01", 3))));
  (void)stream->Write(Bytes(Serialized(good)));
  (void)stream->WritesDone();
  while (stream->Read(&reply)) {
  }
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("VerifyStream message 1 (0-based) does not parse"));
  // The session took one round only (the valid message after the bad one was not run).
  auto stream2 = f.t.client->OpenStream();
  auto ok = stream2->RoundTrip(good);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->results(0).committed_len(), 5);
  EXPECT_TRUE(stream2->Finish().ok());
}

// Server::Start opens every listener before there is an engine: health NOT_SERVING on the API
// and health ports, every call (VerifyStream included) UNAVAILABLE "model loading", /metrics
// with the load gauges only; AttachEngine then serves. A bad engine leaves it loading.
TEST(ServerStartup, ListenersAnswerBeforeTheEngineIsAttached) {
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.metrics_listen = "127.0.0.1:0";
  so.health_listen = "127.0.0.1:0";
  auto server = Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  Server& srv = **server;
  client::VerifyClient api(absl::StrCat("127.0.0.1:", srv.port()), absl::Seconds(5));
  client::VerifyClient probe(absl::StrCat("127.0.0.1:", srv.health_port()), absl::Seconds(5));
  EXPECT_EQ(api.Health().value_or(client::HealthStatus::kUnknown),
            client::HealthStatus::kNotServing);
  EXPECT_EQ(probe.Health().value_or(client::HealthStatus::kUnknown),
            client::HealthStatus::kNotServing);
  ExpectCode(api.GetInfo().status(), absl::StatusCode::kUnavailable, "model loading");
  ExpectCode(api.Open({1, 2}).status(), absl::StatusCode::kUnavailable, "model loading");
  ExpectCode(api.Verify("s", DraftTree{}).status(), absl::StatusCode::kUnavailable,
             "model loading");
  ExpectCode(api.Close("s"), absl::StatusCode::kUnavailable, "model loading");
  verify::v1::VerifyRequest req;
  req.add_items()->set_session_id("s");
  ExpectCode(api.OpenStream()->RoundTrip(req).status(), absl::StatusCode::kUnavailable,
             "model loading");
  std::string page = testing::HttpGet(srv.metrics_port(), "/metrics").value_or("");
  EXPECT_THAT(page, HasSubstr("verifyd_model_loaded 0"));
  EXPECT_THAT(page, Not(HasSubstr("verifyd_active_sessions")));
  EXPECT_FALSE(srv.engine_attached());
  EXPECT_TRUE(srv.engine_progressing(absl::ZeroDuration()));  // loading is not a stall
  EXPECT_EQ(srv.kv_slots_used(), 0);

  ExpectCode(srv.AttachEngine(nullptr), absl::StatusCode::kInvalidArgument, "engine");
  ExpectCode(api.GetInfo().status(), absl::StatusCode::kUnavailable, "model loading");

  ASSERT_TRUE(srv.AttachEngine(std::make_unique<ToyEngine>(ToyEngineOptions{})).ok());
  EXPECT_EQ(api.Health().value_or(client::HealthStatus::kUnknown), client::HealthStatus::kServing);
  EXPECT_EQ(probe.Health().value_or(client::HealthStatus::kUnknown),
            client::HealthStatus::kServing);
  auto s = api.Open({1, 2});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(api.Verify(s->session_id, DraftTree{}).ok());
  page = testing::HttpGet(srv.metrics_port(), "/metrics").value_or("");
  EXPECT_THAT(page, HasSubstr("verifyd_model_loaded 1"));
  EXPECT_THAT(page, HasSubstr("verifyd_active_sessions 1"));
  ExpectCode(srv.AttachEngine(std::make_unique<ToyEngine>(ToyEngineOptions{})),
             absl::StatusCode::kFailedPrecondition, "engine");
  // A stall (judged by the caller) turns health NOT_SERVING, and back.
  srv.SetStalled(true);
  EXPECT_EQ(probe.Health().value_or(client::HealthStatus::kUnknown),
            client::HealthStatus::kNotServing);
  EXPECT_TRUE(api.Verify(s->session_id, DraftTree{}).ok());
  srv.SetStalled(false);
  EXPECT_EQ(probe.Health().value_or(client::HealthStatus::kUnknown),
            client::HealthStatus::kServing);
  srv.Shutdown(absl::Seconds(5));
}

// Shut down before an engine came: no thread to join, the listeners close.
TEST(ServerStartup, ShutdownWhileLoading) {
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.metrics_listen = "";
  auto server = Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Shutdown(absl::Seconds(1));
  ExpectCode((*server)->AttachEngine(std::make_unique<ToyEngine>(ToyEngineOptions{})),
             absl::StatusCode::kFailedPrecondition, "shut down");
}

TEST(ServerService, MetricsEndpointServesEveryMetric) {
  ToyEngineOptions o;
  o.tp_size = 2;
  Fixture f = Start(o, {}, /*metrics=*/true);
  ASSERT_GT(f.t.server->metrics_port(), 0);
  std::vector<int32_t> truth;
  auto s = f.OpenGreedy({1, 2, 3}, 8, &truth);
  ASSERT_TRUE(s.ok());
  // Two accepted tokens at depths 1 and 2, one draft node at depth 3 rejected.
  auto r = f.t.client->Verify(
      s->session_id,
      DraftTree{{truth[1], truth[2], static_cast<int32_t>((truth[3] + 1) % o.vocab_size)},
                {-1, 0, 1}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->accepted_tokens.size(), 2u);
  (void)f.t.client->Verify("nope", DraftTree{});
  auto body = testing::HttpGet(f.t.server->metrics_port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  const std::vector<std::string> names = {"verifyd_verify_latency_seconds",
                                          "verifyd_engine_step_seconds",
                                          "verifyd_engine_rank_step_seconds",
                                          "verifyd_draft_tokens_total",
                                          "verifyd_accepted_tokens_total",
                                          "verifyd_emitted_tokens_total",
                                          "verifyd_accepted_tokens_by_depth_total",
                                          "verifyd_draft_depth_reached_total",
                                          "verifyd_accept_length",
                                          "verifyd_batch_size",
                                          "verifyd_active_sessions",
                                          "verifyd_kv_slots_used",
                                          "verifyd_kv_slots_capacity",
                                          "verifyd_queue_depth",
                                          "verifyd_tokens_per_second",
                                          "verifyd_requests_total",
                                          "verifyd_build_info"};
  for (const auto& n : names) {
    EXPECT_THAT(*body, HasSubstr("# HELP " + n + " ")) << n;
    EXPECT_THAT(*body, HasSubstr("# TYPE " + n + " ")) << n;
  }
  // Values that must have moved exactly.
  auto value = [&](const std::string& series) -> double {
    for (absl::string_view line : absl::StrSplit(*body, '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        return std::stod(std::string(line.substr(series.size() + 1)));
      }
    }
    return -1;
  };
  EXPECT_EQ(value("verifyd_draft_tokens_total"), 3);
  EXPECT_EQ(value("verifyd_accepted_tokens_total"), 2);
  EXPECT_EQ(value("verifyd_emitted_tokens_total"), 3);
  EXPECT_EQ(value("verifyd_accepted_tokens_by_depth_total{depth=\"1\"}"), 1);
  EXPECT_EQ(value("verifyd_accepted_tokens_by_depth_total{depth=\"2\"}"), 1);
  EXPECT_EQ(value("verifyd_accepted_tokens_by_depth_total{depth=\"3\"}"), 0);
  EXPECT_EQ(value("verifyd_draft_depth_reached_total{depth=\"3\"}"), 1);
  EXPECT_EQ(value("verifyd_draft_depth_reached_total{depth=\"4\"}"), 0);
  EXPECT_EQ(value("verifyd_requests_total{code=\"OK\",method=\"Verify\"}"), 1);
  EXPECT_EQ(value("verifyd_requests_total{code=\"NOT_FOUND\",method=\"Verify\"}"), 1);
  EXPECT_EQ(value("verifyd_requests_total{code=\"OK\",method=\"OpenSession\"}"), 1);
  EXPECT_EQ(value("verifyd_requests_total{code=\"UNAVAILABLE\",method=\"VerifyStream\"}"), 0);
  // Every RPC's series exist at zero before its first call.
  EXPECT_EQ(value("verifyd_requests_total{code=\"OK\",method=\"TruncateSession\"}"), 0);
  EXPECT_EQ(value("verifyd_requests_total{code=\"NOT_FOUND\",method=\"ForkSession\"}"), 0);
  EXPECT_EQ(
      value(absl::StrCat("verifyd_build_info{backend=\"toy\",version=\"", VERIFYD_VERSION, "\"}")),
      1);
  EXPECT_EQ(value("verifyd_verify_latency_seconds_count{stage=\"total\"}"), 1);
  EXPECT_EQ(value("verifyd_verify_latency_seconds_count{stage=\"queue\"}"), 1);
  EXPECT_EQ(value("verifyd_engine_rank_step_seconds_count{rank=\"1\"}"), 2);  // open + verify
  EXPECT_EQ(value("verifyd_accept_length_count"), 1);
  EXPECT_EQ(value("verifyd_kv_slots_capacity"), static_cast<double>(o.kv_slots));
  // No per-session label anywhere.
  EXPECT_THAT(*body, ::testing::Not(HasSubstr(s->session_id)));
}

TEST(ServerService, ShutdownDrainsInFlightRequests) {
  Fixture f = Start();
  auto s = f.t.client->Open({1, 2, 3});
  ASSERT_TRUE(s.ok());
  absl::Status in_flight;
  std::thread t = StartHeldCall(
      f, [&] { in_flight = f.t.client->Verify(s->session_id, DraftTree{}).status(); });
  absl::Notification shut;
  std::thread stopper([&] {
    f.t.server->Shutdown(absl::Seconds(10));
    shut.Notify();
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(shut.HasBeenNotified());  // waiting for the in-flight request
  f.toy->Resume();
  t.join();
  stopper.join();
  EXPECT_TRUE(in_flight.ok()) << in_flight;
}

}  // namespace
}  // namespace verifyd::server
