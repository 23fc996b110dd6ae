// Sampling, logprobs, hidden states and per-session stats over loopback gRPC with the real CPU
// engine (tiny preset): every new OpenSession / Verify field is validated with a message
// naming it; the prompt's and each round's hidden states equal the engine's own (float32
// exactly, bf16 rounded to nearest even) for exactly the committed tokens, on Verify and
// VerifyStream; logprobs come one per emitted token; a response that would exceed
// --max_message_bytes is RESOURCE_EXHAUSTED before anything is applied while the server keeps
// serving; stats and the new metrics count rounds, drafts and prompts.
#include <random>

#include "gtest/gtest.h"
#include "kernels/common.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "tests/step_request_util.h"
#include "tp/cpu/cpu_engine.h"

namespace verifyd::server {
namespace {

namespace v1 = ::verify::v1;

constexpr uint64_t kSeed = 1234;

std::unique_ptr<tp::CpuEngine> TinyEngine() {
  tp::EngineOptions o;
  o.model = "tiny";
  o.seed = kSeed;
  o.kv_slots = 4096;
  o.limits.max_batch = 16;
  auto e = tp::CpuEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

struct Fixture {
  testing::TestServer t;
  std::unique_ptr<v1::VerifyService::Stub> stub;
  std::unique_ptr<tp::CpuEngine> reference;  // same weights, driven directly

  absl::Status Open(const v1::OpenSessionRequest& req, v1::OpenSessionResponse* resp) {
    grpc::ClientContext ctx;
    return client::FromGrpcStatus(stub->OpenSession(&ctx, req, resp));
  }
};

std::unique_ptr<Fixture> Start(int max_message_bytes = 16 << 20) {
  auto f = std::make_unique<Fixture>();
  ServerOptions o;
  o.max_message_bytes = max_message_bytes;
  auto t = testing::StartTestServer(o, TinyEngine(), /*metrics=*/true);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  f->t = *std::move(t);
  f->stub = v1::VerifyService::NewStub(f->t.client->channel());
  f->reference = TinyEngine();
  return f;
}

v1::OpenSessionRequest OpenRequest(const std::vector<int32_t>& prompt) {
  v1::OpenSessionRequest r;
  r.mutable_prompt_tokens()->Add(prompt.begin(), prompt.end());
  return r;
}

// The raw Verify message of one item, `tree` for `session` (as VerifyStream sends it).
v1::VerifyRequest OneItem(const std::string& session, const client::DraftTree& tree) {
  v1::VerifyRequest req;
  v1::VerifyItem* it = req.add_items();
  it->set_session_id(session);
  it->mutable_tree()->mutable_tokens()->Add(tree.tokens.begin(), tree.tokens.end());
  it->mutable_tree()->mutable_parents()->Add(tree.parents.begin(), tree.parents.end());
  return req;
}

void ExpectError(const absl::Status& st, absl::StatusCode code, const std::string& field) {
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_EQ(st.message().rfind(field, 0), 0u)
      << "message should start with '" << field << "': " << st.message();
}

TEST(ServerSampling, InvalidOptionsNameTheField) {
  auto f = Start();
  ASSERT_NE(f, nullptr);
  v1::OpenSessionResponse resp;
  const auto bad = absl::StatusCode::kInvalidArgument;
  {
    auto r = OpenRequest({1, 2});
    r.mutable_sampling()->set_temperature(-0.5f);
    ExpectError(f->Open(r, &resp), bad, "sampling.temperature");
    r.mutable_sampling()->set_temperature(std::nanf(""));
    ExpectError(f->Open(r, &resp), bad, "sampling.temperature");
    r.mutable_sampling()->set_temperature(INFINITY);
    ExpectError(f->Open(r, &resp), bad, "sampling.temperature");
  }
  for (float top_p : {0.0f, -0.1f, 1.5f, std::nanf("")}) {
    auto r = OpenRequest({1, 2});
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(top_p);
    ExpectError(f->Open(r, &resp), bad, "sampling.top_p");
  }
  {
    auto r = OpenRequest({1, 2});
    r.mutable_sampling()->set_top_k(-1);
    ExpectError(f->Open(r, &resp), bad, "sampling.top_k");
  }
  for (int n : {-1, 21}) {
    auto r = OpenRequest({1, 2});
    r.set_top_logprobs(n);
    ExpectError(f->Open(r, &resp), bad, "top_logprobs");
  }
  {
    auto r = OpenRequest({1, 2});
    r.mutable_hidden_states()->set_include_prompt(true);
    ExpectError(f->Open(r, &resp), bad, "hidden_states.layers");
    r.mutable_hidden_states()->add_layers(0);
    r.mutable_hidden_states()->add_layers(2);  // tiny has 2 layers
    ExpectError(f->Open(r, &resp), bad, "hidden_states.layers[1]");
    r.mutable_hidden_states()->set_layers(1, 0);
    ExpectError(f->Open(r, &resp), bad, "hidden_states.layers[1]");
    r.mutable_hidden_states()->set_layers(1, -1);
    ExpectError(f->Open(r, &resp), bad, "hidden_states.layers[1]");
    r.mutable_hidden_states()->set_layers(1, 1);
    r.mutable_hidden_states()->set_dtype(static_cast<v1::HiddenDtype>(7));
    ExpectError(f->Open(r, &resp), bad, "hidden_states.dtype");
  }
  EXPECT_EQ(f->t.server->active_sessions(), 0);
  EXPECT_EQ(f->t.server->kv_slots_used(), 0);
  // draft_probs: not implemented, named.
  auto s = f->t.client->Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  v1::VerifyRequest vr;
  v1::VerifyItem* item = vr.add_items();
  item->set_session_id(s->session_id);
  item->mutable_tree()->add_tokens(5);
  item->mutable_tree()->add_parents(-1);
  item->add_draft_probs(0.5f);
  v1::VerifyResponse vresp;
  ExpectError(f->t.client->VerifyRaw(vr, &vresp), absl::StatusCode::kUnimplemented,
              "items[0].draft_probs");
  // Nothing was applied.
  auto ok = f->t.client->Verify(s->session_id, {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->committed_len, 4);
}

// The engine's own prefill of `prompt` with the given hidden layers (float32 rows).
std::vector<float> EngineHidden(tp::CpuEngine& e, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& layers, int32_t first_slot) {
  tp::StepRequest q = test_util::PrefillChain(prompt, first_slot);
  q.hidden_layers = layers;
  auto r = e.Step({q});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? (*r)[0].hidden : std::vector<float>{};
}

TEST(ServerSampling, HiddenStatesAndLogprobsOfCommittedTokens) {
  auto f = Start();
  ASSERT_NE(f, nullptr);
  const int64_t H = 128;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  for (const bool fp32 : {true, false}) {
    SCOPED_TRACE(fp32 ? "fp32" : "bf16");
    client::SessionOptions o;
    o.temperature = 0.9f;
    o.seed = 11;
    o.top_logprobs = 3;
    o.hidden_layers = {1, 0};
    o.include_prompt = true;
    o.hidden_fp32 = fp32;
    auto s = f->t.client->Open(prompt, "", o);
    ASSERT_TRUE(s.ok()) << s.status();
    // The prompt's hidden states: the engine's own rows, layers in the order asked.
    const v1::HiddenStates& ph = s->hidden_states;
    EXPECT_EQ(ph.num_tokens(), static_cast<int>(prompt.size()));
    EXPECT_EQ(ph.hidden_size(), H);
    EXPECT_EQ(std::vector<int32_t>(ph.layers().begin(), ph.layers().end()), o.hidden_layers);
    EXPECT_EQ(ph.dtype(), fp32 ? v1::HIDDEN_DTYPE_FP32 : v1::HIDDEN_DTYPE_BF16);
    auto got = client::DecodeHiddenStates(ph);
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<float> want = EngineHidden(*f->reference, prompt, o.hidden_layers, 0);
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const float w = fp32 ? want[i] : kernels::RoundToBf16(want[i]);
      ASSERT_EQ((*got)[i], w) << "value " << i;
    }
    ASSERT_EQ(s->logprobs.size(), 1u);
    EXPECT_EQ(s->logprobs[0].token(), s->next_token);
    EXPECT_EQ(s->logprobs[0].top_tokens_size(), 3);
    EXPECT_LE(s->logprobs[0].logprob(), 0.0f);

    // Rounds: hidden states of the committed tokens (old pending + accepted), logprobs of the
    // emitted ones (accepted + bonus), over Verify and VerifyStream.
    std::vector<int32_t> history = prompt;
    history.push_back(s->next_token);
    auto stream = f->t.client->OpenStream();
    std::mt19937_64 rng(5);
    int64_t drafts = 0, accepted = 0;
    for (int round = 0; round < 6; ++round) {
      // A chain that often holds the true continuation (from the reference engine, seeded).
      kernels::SamplingParams sp;
      sp.temperature = o.temperature;
      sp.seed = o.seed;
      auto truth = testing::GreedyViaEngine(f->reference.get(), history, 4, sp);
      ASSERT_TRUE(truth.ok()) << truth.status();
      client::DraftTree tree;
      for (int d = 0; d < 3; ++d) {
        tree.tokens.push_back(rng() % 4 == 0 ? static_cast<int32_t>(rng() % 512) : (*truth)[d]);
        tree.parents.push_back(d - 1);
      }
      client::VerifyOutcome out;
      if (round % 2 == 0) {
        auto r = f->t.client->Verify(s->session_id, tree);
        ASSERT_TRUE(r.ok()) << r.status();
        out = *r;
      } else {
        auto r = stream->RoundTrip(OneItem(s->session_id, tree));
        ASSERT_TRUE(r.ok()) << r.status();
        const v1::VerifyResult& x = r->results(0);
        out.accepted_tokens.assign(x.accepted_tokens().begin(), x.accepted_tokens().end());
        out.bonus_token = x.bonus_token();
        out.logprobs.assign(x.logprobs().begin(), x.logprobs().end());
        out.hidden_states = x.hidden_states();
        out.stats = x.stats();
      }
      const size_t k = out.accepted_tokens.size();
      drafts += 3;
      accepted += static_cast<int64_t>(k);
      // Emitted tokens = the seeded plain continuation.
      for (size_t j = 0; j < k; ++j) ASSERT_EQ(out.accepted_tokens[j], (*truth)[j]);
      ASSERT_EQ(out.bonus_token, (*truth)[k]);
      ASSERT_EQ(out.logprobs.size(), k + 1);
      for (size_t j = 0; j < k; ++j) EXPECT_EQ(out.logprobs[j].token(), out.accepted_tokens[j]);
      EXPECT_EQ(out.logprobs[k].token(), out.bonus_token);
      // Committed now: the old pending token and the accepted ones. Their hidden states are
      // those of a plain prefill of the whole history at their positions.
      ASSERT_EQ(out.hidden_states.num_tokens(), static_cast<int>(k + 1));
      auto hs = client::DecodeHiddenStates(out.hidden_states);
      ASSERT_TRUE(hs.ok()) << hs.status();
      std::vector<int32_t> seq = history;
      seq.insert(seq.end(), out.accepted_tokens.begin(), out.accepted_tokens.end());
      const std::vector<float> all = EngineHidden(*f->reference, seq, o.hidden_layers, 0);
      const size_t first = history.size() - 1;  // the old pending token's position
      for (size_t i = 0; i < hs->size(); ++i) {
        const float w = all[first * 2 * H + i];
        ASSERT_NEAR((*hs)[i], fp32 ? w : kernels::RoundToBf16(w), 1e-4f + 1e-5f * std::abs(w))
            << "round " << round << " value " << i;
      }
      EXPECT_EQ(out.stats.rounds(), round + 1);
      EXPECT_EQ(out.stats.draft_tokens(), drafts);
      EXPECT_EQ(out.stats.accepted_tokens(), accepted);
      int64_t by_depth = 0;
      for (int64_t v : out.stats.accepted_by_depth()) by_depth += v;
      EXPECT_EQ(by_depth, accepted);
      history = seq;
      history.push_back(out.bonus_token);
    }
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_GT(accepted, 0);
    EXPECT_TRUE(f->t.client->Close(s->session_id).ok());
  }
}

// A retried request id returns the stored tokens, logprobs and stats (no hidden states).
TEST(ServerSampling, RetryReturnsStoredLogprobsAndStats) {
  auto f = Start();
  ASSERT_NE(f, nullptr);
  client::SessionOptions o;
  o.top_logprobs = 2;
  o.hidden_layers = {0};
  auto s = f->t.client->Open({7, 7, 7}, "", o);
  ASSERT_TRUE(s.ok()) << s.status();
  client::VerifyOptions vo;
  vo.request_id = "r1";
  auto a = f->t.client->Verify(s->session_id, {{1, 2}, {-1, 0}}, vo);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = f->t.client->Verify(s->session_id, {{1, 2}, {-1, 0}}, vo);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->bonus_token, b->bonus_token);
  ASSERT_EQ(a->logprobs.size(), b->logprobs.size());
  for (size_t i = 0; i < a->logprobs.size(); ++i) {
    EXPECT_EQ(a->logprobs[i].SerializeAsString(), b->logprobs[i].SerializeAsString());
  }
  EXPECT_EQ(a->stats.SerializeAsString(), b->stats.SerializeAsString());
  EXPECT_EQ(a->stats.rounds(), 1);
  EXPECT_EQ(a->hidden_states.num_tokens(), 1 + static_cast<int>(a->accepted_tokens.size()));
  EXPECT_EQ(b->hidden_states.num_tokens(), 0);
}

// Hidden states larger than --max_message_bytes: RESOURCE_EXHAUSTED naming size and limit,
// refused before anything runs (the session stays where it was), while other sessions and
// smaller rounds of the same session go on.
TEST(ServerSampling, TooLargeHiddenStatesAreResourceExhausted) {
  constexpr int kLimit = 64 << 10;  // 64 KiB: fp32, 2 layers x 128 = 1 KiB per token
  auto f = Start(kLimit);
  ASSERT_NE(f, nullptr);
  client::SessionOptions o;
  o.hidden_layers = {0, 1};
  o.hidden_fp32 = true;
  o.include_prompt = true;
  std::vector<int32_t> long_prompt(100, 3);
  auto refused = f->t.client->Open(long_prompt, "", o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("hidden_states.include_prompt"), std::string::npos);
  EXPECT_NE(refused.status().message().find(std::to_string(kLimit)), std::string::npos);
  EXPECT_EQ(f->t.server->active_sessions(), 0);

  auto s = f->t.client->Open({1, 2, 3}, "", o);
  ASSERT_TRUE(s.ok()) << s.status();
  auto other = f->t.client->Open({4, 5, 6});
  ASSERT_TRUE(other.ok()) << other.status();
  client::DraftTree deep;
  for (int d = 0; d < 64; ++d) {
    deep.tokens.push_back(d);
    deep.parents.push_back(d - 1);
  }
  auto big = f->t.client->Verify(s->session_id, deep);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("items[0]"), std::string::npos) << big.status();
  EXPECT_NE(big.status().message().find("--max_message_bytes " + std::to_string(kLimit)),
            std::string::npos)
      << big.status();
  // The same over VerifyStream ends that stream with the status.
  auto stream = f->t.client->OpenStream();
  auto sr = stream->RoundTrip(OneItem(s->session_id, deep));
  ASSERT_FALSE(sr.ok());
  EXPECT_EQ(sr.status().code(), absl::StatusCode::kResourceExhausted);
  // Other sessions are served; the refused session is where it was and takes small rounds.
  auto r_other = f->t.client->Verify(other->session_id, {});
  ASSERT_TRUE(r_other.ok()) << r_other.status();
  auto small = f->t.client->Verify(s->session_id, {{9}, {-1}});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->committed_len, 4 + static_cast<int64_t>(small->accepted_tokens.size()));
  EXPECT_EQ(small->stats.rounds(), 1);
}

TEST(ServerSampling, MetricsCountPromptsDraftsAndModes) {
  auto f = Start();
  ASSERT_NE(f, nullptr);
  client::SessionOptions hot;
  hot.temperature = 1.0f;
  hot.seed = 3;
  auto a = f->t.client->Open({1, 2, 3, 4}, "", hot);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = f->t.client->Open({5, 6});
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(f->t.client->Verify(a->session_id, {{1, 2}, {-1, 0}}).ok());
  ASSERT_TRUE(f->t.client->Verify(a->session_id, {}).ok());
  ASSERT_TRUE(f->t.client->Verify(b->session_id, {{1}, {-1}}).ok());
  auto text = testing::HttpGet(f->t.server->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  for (const char* line :
       {"verifyd_prompt_tokens_total 6", "verifyd_drafts_total 2",
        "verifyd_rounds_total{mode=\"sampled\"} 2", "verifyd_rounds_total{mode=\"greedy\"} 1",
        "verifyd_sessions_opened_total{mode=\"sampled\"} 1",
        "verifyd_sessions_opened_total{mode=\"greedy\"} 1",
        "verifyd_prefill_latency_seconds_count{stage=\"total\"} 2"}) {
    EXPECT_NE(text->find(line), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace verifyd::server
