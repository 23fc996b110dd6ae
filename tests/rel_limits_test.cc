// Limits and overload against an in-process verifyd with the toy engine (which
// fails any step whose KV bookkeeping is off): max message size, the bounded admission queue,
// the server's deadline cap, deadlines and cancellation freeing what a call held (also during
// a long prefill), max concurrent streams per connection, keepalive enforcement, and error
// messages that leak nothing internal.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/verify_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "server/toy_engine.h"
#include "tests/toy_server_fixture.h"

namespace verifyd::server {
namespace {

using client::DraftTree;
using client::VerifyClient;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ToyEngineOptions;

// Blocks the engine: the next step waits at its start until Resume (call RunBlocker first).
struct EngineBlocker {
  Fixture& f;
  std::string session;
  std::thread th;
  explicit EngineBlocker(Fixture& fx) : f(fx) {
    auto s = f.t.client->Open({7, 7, 7});
    EXPECT_TRUE(s.ok()) << s.status();
    session = s->session_id;
    th = StartHeldCall(f, [this] { EXPECT_TRUE(f.t.client->Verify(session, DraftTree{}).ok()); });
  }
  void Release() {
    f.toy->Resume();
    if (th.joinable()) th.join();
  }
  ~EngineBlocker() { Release(); }
};

TEST(RelLimits, OversizedMessageIsResourceExhaustedThenANormalCallWorks) {
  ServerOptions so;
  so.max_message_bytes = 64 << 10;
  Fixture f = Start({}, so);
  auto s = f.t.client->Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  verify::v1::VerifyRequest big;
  big.add_items()->set_session_id(std::string(100 << 10, 'x'));  // 100 KiB > 64 KiB
  verify::v1::VerifyResponse resp;
  const absl::Status st = f.t.client->VerifyRaw(big, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  auto r = f.t.client->Verify(s->session_id, DraftTree{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bonus_token, f.Greedy({1, 2, 3}, 2)[1]);
  EXPECT_EQ(f.t.server->kv_slots_used(), 4);
}

TEST(RelLimits, FullAdmissionQueueRejectsQuicklyWhileAdmittedCallsFinish) {
  ServerOptions so;
  so.max_queue = 2;
  Fixture f = Start({}, so);
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) {
    auto s = f.t.client->Open({i, i + 1});
    ASSERT_TRUE(s.ok()) << s.status();
    ids.push_back(s->session_id);
  }
  const int64_t used = f.t.server->kv_slots_used();
  EngineBlocker blocker(f);  // the engine holds one call; the queue has room for 2
  std::vector<std::thread> admitted;
  std::atomic<int> admitted_ok{0};
  for (int i = 0; i < 2; ++i) {
    admitted.emplace_back([&, i] {
      if (f.t.client->Verify(ids[i], DraftTree{}).ok()) ++admitted_ok;
    });
  }
  ASSERT_TRUE(WaitFor([&] { return f.t.server->queue_depth() == 2; }));
  for (int i = 2; i < 6; ++i) {
    const absl::Time t0 = absl::Now();
    const absl::Status st = f.t.client->Verify(ids[i], DraftTree{}).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1)) << "rejection must not wait for the engine";
  }
  blocker.Release();
  for (auto& t : admitted) t.join();
  EXPECT_EQ(admitted_ok.load(), 2);
  // Blocker + 2 admitted rounds committed one slot each; the rejected ones hold nothing.
  EXPECT_EQ(f.t.server->kv_slots_used(), used + 3 + 3);
  EXPECT_TRUE(f.t.client->Verify(ids[5], DraftTree{}).ok());
}

TEST(RelLimits, CallWithoutDeadlineIsCappedByTheServerAndFreesItsSlots) {
  ServerOptions so;
  so.max_call_deadline = absl::Milliseconds(300);
  Fixture f = Start({}, so);
  const std::vector<int32_t> prompt = {4, 5, 6};
  auto s = f.t.client->Open(prompt);
  ASSERT_TRUE(s.ok()) << s.status();
  EngineBlocker blocker(f);
  const int64_t used = f.t.server->kv_slots_used();  // blocker's tail slot included
  VerifyClient no_deadline(f.t.target, absl::ZeroDuration());
  const absl::Time t0 = absl::Now();
  const absl::Status st =
      no_deadline.Verify(s->session_id, DraftTree{{1, 2, 3}, {-1, 0, 1}}).status();
  const absl::Duration waited = absl::Now() - t0;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_GE(waited, absl::Milliseconds(250));
  EXPECT_LT(waited, absl::Seconds(3));
  // The engine is still blocked, yet the expired call holds no slot and no queue place.
  EXPECT_EQ(f.t.server->kv_slots_used(), used);
  EXPECT_EQ(f.t.server->queue_depth(), 0);
  blocker.Release();
  // The session did not move: the next round continues right after the prompt.
  auto r = f.t.client->Verify(s->session_id, DraftTree{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->committed_len, 4);
  EXPECT_EQ(r->bonus_token, f.Greedy(prompt, 2)[1]);
}

TEST(RelLimits, ClientCancelWhileQueuedFreesSlotsAtOnce) {
  Fixture f = Start();
  auto s = f.t.client->Open({9, 9});
  ASSERT_TRUE(s.ok());
  EngineBlocker blocker(f);
  const int64_t used = f.t.server->kv_slots_used();
  // A raw call we can cancel: the server must notice and drop it while the engine is busy.
  auto stub = verify::v1::VerifyService::NewStub(f.t.client->channel());
  grpc::ClientContext ctx;
  verify::v1::VerifyRequest req;
  auto* item = req.add_items();
  item->set_session_id(s->session_id);
  for (int i = 0; i < 8; ++i) {
    item->mutable_tree()->add_tokens(i);
    item->mutable_tree()->add_parents(i - 1);
  }
  verify::v1::VerifyResponse resp;
  grpc::Status result;
  std::thread call([&] { result = stub->Verify(&ctx, req, &resp); });
  ASSERT_TRUE(WaitFor([&] { return f.t.server->queue_depth() == 1; }));
  EXPECT_EQ(f.t.server->kv_slots_used(), used + 9);  // the queued call's tail slots
  ctx.TryCancel();
  call.join();
  EXPECT_EQ(result.error_code(), grpc::CANCELLED);
  EXPECT_TRUE(
      WaitFor([&] { return f.t.server->kv_slots_used() == used && f.t.server->queue_depth() == 0; },
              absl::Seconds(2)));
  blocker.Release();
  EXPECT_TRUE(f.t.client->Verify(s->session_id, DraftTree{}).ok());  // released, usable
}

TEST(RelLimits, DeadlineDuringALongPrefillStopsItAndFreesEverything) {
  ToyEngineOptions o;
  o.max_tail_rows = 5;  // prefill chunks of 5 rows: a 400-token prompt takes 80 steps
  Fixture f = Start(o);
  f.toy->set_step_delay(absl::Milliseconds(10));
  std::vector<int32_t> prompt(400);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i % 17);
  VerifyClient impatient(f.t.target, absl::Milliseconds(150));
  const absl::Status st = impatient.Open(prompt).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  const int64_t steps_at_deadline = f.toy->steps();
  EXPECT_TRUE(WaitFor(
      [&] { return f.t.server->kv_slots_used() == 0 && f.t.server->active_sessions() == 0; },
      absl::Seconds(2)));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_LT(f.toy->steps(), steps_at_deadline + 5) << "the prefill kept running";
  f.toy->set_step_delay(absl::ZeroDuration());
  auto ok = f.t.client->Open({1, 2, 3});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->next_token, f.Greedy({1, 2, 3}, 1)[0]);
}

TEST(RelLimits, MaxConcurrentStreamsBoundsOneConnection) {
  ServerOptions so;
  so.max_concurrent_streams = 2;
  so.max_batch = 1;  // one call per engine step, so the second stream's call must queue
  Fixture f = Start({}, so);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto s = f.t.client->Open({i});
    ASSERT_TRUE(s.ok());
    ids.push_back(s->session_id);
  }
  f.toy->Pause();
  const int64_t entered = f.toy->steps_entered();
  std::vector<std::thread> calls;
  std::atomic<int> ok{0};
  for (int i = 0; i < 5; ++i) {
    calls.emplace_back([&, i] {
      if (f.t.client->Verify(ids[i], DraftTree{}).ok()) ++ok;
    });
  }
  ASSERT_TRUE(WaitFor([&] { return f.toy->steps_entered() > entered; }));
  ASSERT_TRUE(WaitFor([&] { return f.t.server->queue_depth() >= 1; }));
  absl::SleepFor(absl::Milliseconds(300));
  // One call in the engine + one queued = the connection's 2 streams; the other 3 wait in
  // the client's transport instead of reaching the server.
  EXPECT_EQ(f.t.server->queue_depth(), 1);
  f.toy->Resume();
  for (auto& t : calls) t.join();
  EXPECT_EQ(ok.load(), 5);
}

// The server-wide thread bound: idle VerifyStreams from many connections each hold a server
// thread; beyond --max_threads a new call gets RESOURCE_EXHAUSTED (not one more thread), and
// once the streams close the server serves again.
TEST(RelLimits, IdleStreamsBeyondTheThreadBoundAreResourceExhausted) {
  ServerOptions so;
  so.max_threads = 12;
  Fixture f = Start({}, so);
  constexpr int kStreams = 40;
  struct Open {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<verify::v1::VerifyService::Stub> stub;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<verify::v1::VerifyRequest, verify::v1::VerifyResponse>>
        stream;
  };
  std::vector<std::unique_ptr<Open>> open;
  for (int i = 0; i < kStreams; ++i) {
    auto o = std::make_unique<Open>();
    grpc::ChannelArguments args;
    args.SetInt("verifyd.test.connection", i);  // a connection of its own
    o->channel = grpc::CreateCustomChannel(f.t.target, grpc::InsecureChannelCredentials(), args);
    o->stub = verify::v1::VerifyService::NewStub(o->channel);
    o->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    o->stream = o->stub->VerifyStream(&o->ctx);
    open.push_back(std::move(o));
  }
  absl::SleepFor(absl::Seconds(1));
  // The streams the server turned away have ended: their status is RESOURCE_EXHAUSTED.
  int exhausted = 0, other = 0;
  for (auto& o : open) {
    o->stream->WritesDone();
  }
  for (auto& o : open) {
    verify::v1::VerifyResponse r;
    while (o->stream->Read(&r)) {
    }
    const grpc::Status st = o->stream->Finish();
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
    } else if (!st.ok()) {
      ++other;
    }
  }
  EXPECT_GT(exhausted, 0) << "no stream was turned away with " << kStreams << " open";
  EXPECT_EQ(other, 0);
  // Every stream is closed now: a normal call works.
  auto s = f.t.client->Open({1, 2, 3});
  EXPECT_TRUE(s.ok()) << s.status();
}

TEST(RelLimits, ClientPingingTooOftenIsSentAway) {
  ServerOptions so;
  so.min_client_ping_interval = absl::Seconds(10);
  Fixture f = Start({}, so);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 100);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto ch = grpc::CreateCustomChannel(f.t.target, grpc::InsecureChannelCredentials(), args);
  VerifyClient c(ch, absl::Seconds(5));
  ASSERT_TRUE(c.GetInfo().ok());
  ASSERT_EQ(ch->GetState(false), GRPC_CHANNEL_READY);
  // The server answers the third early ping with GOAWAY (too_many_pings): the connection
  // leaves READY.
  EXPECT_TRUE(WaitFor([&] { return ch->GetState(false) != GRPC_CHANNEL_READY; }, absl::Seconds(5)));
  // A well-behaved client is unaffected.
  EXPECT_TRUE(f.t.client->GetInfo().ok());
}

// One call with a 200 KB metadata header fails alone (RESOURCE_EXHAUSTED), not the
// connection: a VerifyStream open on the same channel keeps working, and so does the channel.
TEST(RelLimits, HugeMetadataFailsOnlyItsOwnCall) {
  Fixture f = Start();
  auto s = f.t.client->Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  auto stream = f.t.client->OpenStream();
  verify::v1::VerifyRequest req;
  req.add_items()->set_session_id(s->session_id);
  ASSERT_TRUE(stream->RoundTrip(req).ok());
  // The same channel (the client's), one call with a huge header.
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-padding", std::string(200 * 1024, 'a'));
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  verify::v1::GetInfoRequest info_req;
  verify::v1::GetInfoResponse info;
  auto stub = verify::v1::VerifyService::NewStub(f.t.client->channel());
  const grpc::Status big = stub->GetInfo(&ctx, info_req, &info);
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << big.error_message();
  auto again = stream->RoundTrip(req);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(f.t.client->GetInfo().ok());
}

TEST(RelLimits, ErrorMessagesLeakNoInternals) {
  Fixture f = Start();
  auto s = f.t.client->Open({1, 2});
  ASSERT_TRUE(s.ok());
  f.toy->FailNextStep(absl::InternalError("/opt/verifyd/secret.cc:42 slot 17 state=0xdead"));
  const absl::Status st = f.t.client->Verify(s->session_id, DraftTree{}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(st.message()), HasSubstr("internal error (request id"));
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr("/opt")));
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr("slot 17")));
  // Unknown and closed sessions are indistinguishable.
  auto c = f.t.client->Open({3});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(f.t.client->Close(c->session_id).ok());
  const absl::Status unknown = f.t.client->Verify(std::string(32, '0'), DraftTree{}).status();
  const absl::Status closed = f.t.client->Verify(c->session_id, DraftTree{}).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown, closed);
  EXPECT_TRUE(f.t.client->Verify(s->session_id, DraftTree{}).ok());
}

}  // namespace
}  // namespace verifyd::server
