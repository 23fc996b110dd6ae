// verifyctl: command-line client of verifyd.
//   verifyctl info | health       (info: model, limits and a CUDA server's GPU memory in GB)
//   verifyctl open --prompt 1,2,3 [--prefix_session S]
//   verifyctl verify --session S --tokens 5,6,7 --parents -1,0,-1
//   verifyctl close --session S
//   verifyctl truncate --session S --committed_len L   (roll back to the first L committed tokens)
//   verifyctl fork --session S                  (a new session sharing S's KV)
//   verifyctl demo [--drafter oracle|ngram] [--rounds R] [--depth D] [--branches B]
//   verifyctl load [--drafter oracle|ngram] --sessions N --rounds R
//   verifyctl bench [--drafter oracle|random] [--concurrency C] [--request_rate R]
//                   (--num_rounds N | --duration_s S) [--json FILE]
// Acceptance (demo, load, bench) is vLLM's mean acceptance length: 1 + accepted draft tokens /
// drafts (rounds whose tree had at least one node).
// Session options (open, demo, load): --temperature T [--top_p P] [--top_k K] [--seed S]
// (sampled verification), --top_logprobs N, --hidden_layers 0,5,9 [--include_prompt]
// [--hidden_dtype bf16|fp32].
// TLS: --tls_ca (server CA), + --tls_cert/--tls_key (mutual TLS), + --auth_token_file.
// Exit status: 0 on success, 1 on an RPC error (printed as CODE: message), 2 on bad usage
// (unknown subcommand or flag, a bad flag value: one line on stderr).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/bench.h"
#include "client/demo_drafter.h"
#include "client/verify_client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "verifyd address host:port");
ABSL_FLAG(int, timeout_s, 60, "per-call deadline in seconds");
ABSL_FLAG(std::string, prompt, "", "open: comma-separated prompt tokens");
ABSL_FLAG(int64_t, random_prompt, 0,
          "open: instead of --prompt, this many random tokens (from --seed), e.g. to measure a "
          "long prefill");
ABSL_FLAG(std::string, session, "", "verify/close/truncate/fork: session id");
ABSL_FLAG(int64_t, committed_len, 0,
          "truncate: committed length to roll back to (>= 1; TruncateSession.committed_len)");
ABSL_FLAG(int64_t, len, 0, "truncate: deprecated spelling of --committed_len");
ABSL_FLAG(std::string, prefix_session, "",
          "open: start from this session's committed tokens (shared KV), then --prompt");
ABSL_FLAG(std::string, request_id, "", "verify: request id (a retry with it is not re-applied)");
ABSL_FLAG(std::string, tokens, "", "verify: comma-separated draft tokens");
ABSL_FLAG(std::string, parents, "", "verify: comma-separated parents (-1 = the pending token)");
ABSL_FLAG(std::string, drafter, "oracle",
          "demo/load: oracle (true continuation from a shadow greedy session, mixed with "
          "random branches) or ngram (prompt lookup over the tokens so far + random branches); "
          "bench: oracle (the true continuation, decoded before the timed part) or random "
          "(seeded random trees)");
ABSL_FLAG(int, rounds, 16, "demo/load: Verify rounds per session");
ABSL_FLAG(int, sessions, 1, "demo/load: concurrent sessions");
ABSL_FLAG(int, depth, 6, "demo/load/bench: draft chain depth (bench: 0 = plain decode steps)");
ABSL_FLAG(int, branches, 2, "demo/load/bench: alternatives per depth (1 = a plain chain)");
ABSL_FLAG(double, accuracy, 0.8,
          "demo/load/bench (oracle): chance each chain token is the true one");
ABSL_FLAG(int, prompt_len, 16, "demo/load/bench: random prompt length");
ABSL_FLAG(int, concurrency, 8,
          "bench: sessions, one Verify in flight each (closed loop: all sending back to back)");
ABSL_FLAG(double, request_rate, 0,
          "bench: open loop, Verify rounds per second arriving as a Poisson process (0 or inf: "
          "closed loop)");
ABSL_FLAG(double, duration_s, 0, "bench: length of the timed part in seconds");
ABSL_FLAG(int64_t, num_rounds, 0,
          "bench: Verify rounds in the timed part, all sessions together (default 200 when "
          "--duration_s is not given either)");
ABSL_FLAG(int64_t, oracle_tokens, 0,
          "bench (oracle): tokens decoded ahead per session before the timed part (0: enough "
          "for --num_rounds; 512 with --duration_s); later rounds draft randomly");
ABSL_FLAG(std::string, json, "", "bench: also write the results as JSON to this file");
ABSL_FLAG(uint64_t, seed, 1,
          "open/demo/load: sampling seed of the sessions (with --temperature > 0); demo/load: "
          "also the seed of the random prompts and drafts");
ABSL_FLAG(double, temperature, 0,
          "open/demo/load: sampling temperature (0 = greedy); demo/load check a seeded "
          "speculative session against seeded plain decoding");
ABSL_FLAG(double, top_p, 1, "open/demo/load: top-p of sampling, in (0, 1] (1 = off)");
ABSL_FLAG(int, top_k, 0, "open/demo/load: top-k of sampling (0 = off)");
ABSL_FLAG(int, top_logprobs, -1,
          "open/demo/load: return logprobs of every emitted token with this many alternatives "
          "(0..20; -1 = no logprobs)");
ABSL_FLAG(std::string, hidden_layers, "",
          "open/demo/load: comma-separated 0-based decoder layers whose hidden states every "
          "committed token returns");
ABSL_FLAG(bool, include_prompt, false, "open: with --hidden_layers, also the prompt's");
ABSL_FLAG(std::string, hidden_dtype, "bf16", "open/demo/load: hidden states as bf16 or fp32");
ABSL_FLAG(bool, quiet, false, "demo: no per-round lines");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify verifyd's certificate: connect over TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate chain (mutual TLS; needs --tls_ca)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name to verify in the server certificate (default: the --target host)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file whose (last) line holds the bearer token ('<token>' or '<name> <token>'); "
          "needs --tls_ca");

namespace {

using verifyd::client::DemoOptions;
using verifyd::client::SessionOptions;
using verifyd::client::VerifyClient;

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "%s: %s\n", absl::StatusCodeToString(st.code()).c_str(),
               std::string(st.message()).c_str());
  return 1;
}

int Usage(const std::string& msg) {
  std::fprintf(stderr, "verifyctl: %s (verifyctl --help lists the flags)\n", msg.c_str());
  return 2;
}

int CmdInfo(VerifyClient& c) {
  auto info = c.GetInfo();
  if (!info.ok()) return Fail(info.status());
  const auto& m = info->model();
  std::printf(
      "model: %s\n  vocab_size=%lld hidden_size=%lld layers=%lld heads=%lld "
      "q_lora_rank=%lld kv_lora_rank=%lld qk_nope=%lld qk_rope=%lld v_head=%lld "
      "intermediate=%lld max_position=%lld\n",
      m.name().c_str(), (long long)m.vocab_size(), (long long)m.hidden_size(),
      (long long)m.num_hidden_layers(), (long long)m.num_attention_heads(),
      (long long)m.q_lora_rank(), (long long)m.kv_lora_rank(), (long long)m.qk_nope_head_dim(),
      (long long)m.qk_rope_head_dim(), (long long)m.v_head_dim(), (long long)m.intermediate_size(),
      (long long)m.max_position_embeddings());
  const auto& l = info->limits();
  std::printf("backend: %s  tp: %d  version: %s\n", info->backend().c_str(), info->tp_size(),
              info->version().c_str());
  std::printf("exact_lossless: %s  kv_cache: %s\n", info->exact_lossless() ? "yes" : "no",
              info->kv_cache_dtype().c_str());
  std::printf(
      "limits: max_draft_nodes=%d max_context=%lld max_batch=%d kv_slots=%lld "
      "max_sessions=%d max_prompt_tokens=%d\n",
      l.max_draft_nodes(), (long long)l.max_context(), l.max_batch(), (long long)l.kv_slots(),
      l.max_sessions(), l.max_prompt_tokens());
  if (info->has_memory()) {  // a server with device memory (CUDA): its first GPU
    const auto& mem = info->memory();
    auto gb = [](int64_t bytes) { return static_cast<double>(bytes) / 1e9; };
    std::printf(
        "memory (GB per GPU, first rank): device=%.2f weights=%.2f workspace=%.2f "
        "kv_cache=%.2f\n",
        gb(mem.device_bytes()), gb(mem.weight_bytes()), gb(mem.workspace_bytes()),
        gb(mem.kv_cache_bytes()));
    std::printf("  kv: tokens=%lld bytes_per_token=%lld\n", (long long)mem.kv_tokens(),
                (long long)mem.kv_bytes_per_token());
    std::printf("  before kv: used=%.2f (measured) planned=%.2f (weights + workspace)\n",
                gb(mem.used_before_kv_bytes()), gb(mem.planned_before_kv_bytes()));
  }
  return 0;
}

int CmdHealth(VerifyClient& c) {
  auto h = c.Health();
  if (!h.ok()) return Fail(h.status());
  static const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  std::printf("%s\n", kNames[static_cast<int>(*h)]);
  return *h == verifyd::client::HealthStatus::kServing ? 0 : 1;
}

// The session options of the flags (InvalidArgument naming a bad flag).
absl::StatusOr<SessionOptions> SessionOptionsFromFlags() {
  SessionOptions o;
  o.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  if (absl::GetFlag(FLAGS_top_p) != 1.0) o.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  o.top_k = absl::GetFlag(FLAGS_top_k);
  if (o.temperature > 0) o.seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_top_logprobs) >= 0) o.top_logprobs = absl::GetFlag(FLAGS_top_logprobs);
  auto layers =
      verifyd::client::ParseIntList(absl::GetFlag(FLAGS_hidden_layers), "--hidden_layers");
  if (!layers.ok()) return layers.status();
  o.hidden_layers = *layers;
  o.include_prompt = absl::GetFlag(FLAGS_include_prompt);
  const std::string dtype = absl::GetFlag(FLAGS_hidden_dtype);
  if (dtype != "bf16" && dtype != "fp32") {
    return absl::InvalidArgumentError("--hidden_dtype: bf16 or fp32");
  }
  o.hidden_fp32 = dtype == "fp32";
  return o;
}

void PrintLogprobs(const std::vector<verify::v1::TokenLogprobs>& logprobs) {
  for (const auto& lp : logprobs) {
    std::string top;
    for (int k = 0; k < lp.top_tokens_size(); ++k) {
      absl::StrAppend(&top, k ? " " : "", lp.top_tokens(k), ":", lp.top_logprobs(k));
    }
    std::printf("logprob: token=%d logprob=%.6f top=[%s]\n", lp.token(), lp.logprob(), top.c_str());
  }
}

void PrintHidden(const verify::v1::HiddenStates& h) {
  if (h.layers_size() == 0) return;
  std::printf("hidden_states: tokens=%d layers=[%s] hidden_size=%d dtype=%s bytes=%zu\n",
              h.num_tokens(), absl::StrJoin(h.layers(), ",").c_str(), h.hidden_size(),
              h.dtype() == verify::v1::HIDDEN_DTYPE_FP32 ? "fp32" : "bf16", h.data().size());
}

int CmdOpen(VerifyClient& c) {
  auto prompt = verifyd::client::ParseIntList(absl::GetFlag(FLAGS_prompt), "--prompt");
  if (!prompt.ok()) return Usage(std::string(prompt.status().message()));
  if (const int64_t n = absl::GetFlag(FLAGS_random_prompt); n > 0) {
    auto info = c.GetInfo();
    if (!info.ok()) return Fail(info.status());
    std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
    std::uniform_int_distribution<int64_t> tok(0, info->model().vocab_size() - 1);
    prompt->clear();
    for (int64_t i = 0; i < n; ++i) prompt->push_back(static_cast<int32_t>(tok(rng)));
  }
  auto options = SessionOptionsFromFlags();
  if (!options.ok()) return Usage(std::string(options.status().message()));
  const absl::Time t0 = absl::Now();
  auto r = c.Open(*prompt, absl::GetFlag(FLAGS_prefix_session), *options);
  if (!r.ok()) return Fail(r.status());
  std::printf("session_id: %s\nnext_token: %d\ncommitted_len: %lld\nopen_seconds: %.3f\n",
              r->session_id.c_str(), r->next_token, (long long)r->committed_len,
              absl::ToDoubleSeconds(absl::Now() - t0));
  PrintLogprobs(r->logprobs);
  PrintHidden(r->hidden_states);
  return 0;
}

int CmdVerify(VerifyClient& c) {
  verifyd::client::DraftTree tree;
  auto tokens = verifyd::client::ParseIntList(absl::GetFlag(FLAGS_tokens), "--tokens");
  if (!tokens.ok()) return Usage(std::string(tokens.status().message()));
  auto parents = verifyd::client::ParseIntList(absl::GetFlag(FLAGS_parents), "--parents");
  if (!parents.ok()) return Usage(std::string(parents.status().message()));
  tree.tokens = *tokens;
  tree.parents = *parents;
  verifyd::client::VerifyOptions options;
  options.request_id = absl::GetFlag(FLAGS_request_id);
  auto r = c.Verify(absl::GetFlag(FLAGS_session), tree, options);
  if (!r.ok()) return Fail(r.status());
  std::printf(
      "accepted_nodes: [%s]\naccepted_tokens: [%s]\nbonus_token: %d\n"
      "committed_len: %lld\n",
      absl::StrJoin(r->accepted_nodes, ",").c_str(), absl::StrJoin(r->accepted_tokens, ",").c_str(),
      r->bonus_token, (long long)r->committed_len);
  PrintLogprobs(r->logprobs);
  PrintHidden(r->hidden_states);
  std::printf("stats: rounds=%lld draft_tokens=%lld accepted_tokens=%lld accepted_by_depth=[%s]\n",
              (long long)r->stats.rounds(), (long long)r->stats.draft_tokens(),
              (long long)r->stats.accepted_tokens(),
              absl::StrJoin(r->stats.accepted_by_depth(), ",").c_str());
  return 0;
}

int CmdClose(VerifyClient& c) {
  if (auto st = c.Close(absl::GetFlag(FLAGS_session)); !st.ok()) return Fail(st);
  std::printf("closed\n");
  return 0;
}

int CmdTruncate(VerifyClient& c) {
  const int64_t len = absl::GetFlag(FLAGS_committed_len) != 0 ? absl::GetFlag(FLAGS_committed_len)
                                                              : absl::GetFlag(FLAGS_len);
  auto r = c.Truncate(absl::GetFlag(FLAGS_session), len);
  if (!r.ok()) return Fail(r.status());
  std::printf("next_token: %d\ncommitted_len: %lld\n", r->next_token, (long long)r->committed_len);
  return 0;
}

int CmdFork(VerifyClient& c) {
  auto r = c.Fork(absl::GetFlag(FLAGS_session));
  if (!r.ok()) return Fail(r.status());
  std::printf("session_id: %s\nnext_token: %d\ncommitted_len: %lld\n", r->session_id.c_str(),
              r->next_token, (long long)r->committed_len);
  return 0;
}

// The tree and prompt flags demo, load and bench share (InvalidArgument naming a bad one).
absl::Status CheckDraftFlags() {
  if (absl::GetFlag(FLAGS_depth) < 0) return absl::InvalidArgumentError("--depth: must be >= 0");
  if (absl::GetFlag(FLAGS_branches) < 1) {
    return absl::InvalidArgumentError("--branches: must be >= 1");
  }
  const double accuracy = absl::GetFlag(FLAGS_accuracy);
  if (!(accuracy >= 0 && accuracy <= 1)) {
    return absl::InvalidArgumentError("--accuracy: must be in [0, 1]");
  }
  if (absl::GetFlag(FLAGS_prompt_len) < 1) {
    return absl::InvalidArgumentError("--prompt_len: must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<DemoOptions> DemoOptionsFromFlags() {
  DemoOptions o;
  const std::string drafter = absl::GetFlag(FLAGS_drafter);
  if (drafter != "oracle" && drafter != "ngram") {
    return absl::InvalidArgumentError("--drafter: oracle or ngram");
  }
  if (auto st = CheckDraftFlags(); !st.ok()) return st;
  if (absl::GetFlag(FLAGS_rounds) < 1) return absl::InvalidArgumentError("--rounds: must be >= 1");
  auto session = SessionOptionsFromFlags();
  if (!session.ok()) return session.status();
  o.session = *session;
  o.oracle = drafter == "oracle";
  o.rounds = absl::GetFlag(FLAGS_rounds);
  o.depth = absl::GetFlag(FLAGS_depth);
  o.branches = absl::GetFlag(FLAGS_branches);
  o.accuracy = absl::GetFlag(FLAGS_accuracy);
  o.prompt_len = absl::GetFlag(FLAGS_prompt_len);
  o.seed = absl::GetFlag(FLAGS_seed);
  return o;
}

int CmdDemo(VerifyClient& c) {
  auto options = DemoOptionsFromFlags();
  if (!options.ok()) return Usage(std::string(options.status().message()));
  DemoOptions o = *options;
  const std::string drafter = absl::GetFlag(FLAGS_drafter);
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  o.on_round = [quiet](const verifyd::client::RoundReport& r) {
    if (quiet) return;
    std::printf(
        "round %3d: drafted %2d nodes (depth %d), accepted %d [%s] + bonus %d, "
        "%.2f ms\n",
        r.round, r.nodes, r.depth, r.accepted, absl::StrJoin(r.accepted_tokens, ",").c_str(),
        r.bonus, r.latency_ms);
  };
  auto report = verifyd::client::RunDemo(c, o);
  if (!report.ok()) return Fail(report.status());
  std::printf(
      "demo: drafter=%s rounds=%d tokens=%lld mean_acceptance_length=%.3f "
      "tokens_per_round=%.3f tokens_per_second=%.1f verify_seconds=%.3f%s%s\n",
      drafter.c_str(), report->rounds, (long long)report->tokens, report->mean_acceptance_length,
      report->tokens_per_round, report->tokens_per_second, report->verify_seconds,
      o.oracle ? (report->lossless ? " lossless=yes" : " lossless=NO") : "",
      o.oracle && o.session.sampled() ? " (vs seeded plain decoding)" : "");
  return o.oracle && !report->lossless ? 1 : 0;
}

int CmdLoad(VerifyClient& c) {
  auto options = DemoOptionsFromFlags();
  if (!options.ok()) return Usage(std::string(options.status().message()));
  DemoOptions o = *options;
  const int n = absl::GetFlag(FLAGS_sessions);
  if (n < 1) return Usage("--sessions: must be >= 1");
  auto report = verifyd::client::RunLoad(c, o, n);
  if (!report.ok()) return Fail(report.status());
  std::printf(
      "load: drafter=%s sessions=%d rounds=%d calls=%lld errors=%lld tokens=%lld "
      "wall_s=%.3f tokens_per_second=%.1f calls_per_second=%.1f "
      "mean_acceptance_length=%.3f latency_ms p50=%.2f p90=%.2f p99=%.2f max=%.2f\n",
      absl::GetFlag(FLAGS_drafter).c_str(), n, o.rounds, (long long)report->calls,
      (long long)report->errors, (long long)report->tokens, report->wall_s,
      report->tokens_per_second, report->calls_per_second, report->mean_acceptance_length,
      report->p50_ms, report->p90_ms, report->p99_ms, report->max_ms);
  if (o.oracle) {
    std::printf(
        "  oracle: shadow_calls=%lld (plain decode steps, not counted above) "
        "lossless_mismatches=%lld%s\n",
        (long long)report->shadow_calls, (long long)report->lossless_mismatches,
        report->lossless_mismatches == 0 ? " lossless=yes" : " lossless=NO");
  }
  for (const auto& [code, count] : report->errors_by_code) {
    std::printf("  errors %s: %lld\n", code.c_str(), (long long)count);
  }
  return report->errors == 0 && report->lossless_mismatches == 0 ? 0 : 1;
}

absl::StatusOr<verifyd::client::BenchOptions> BenchOptionsFromFlags() {
  verifyd::client::BenchOptions o;
  if (auto st = CheckDraftFlags(); !st.ok()) return st;
  o.drafter = absl::GetFlag(FLAGS_drafter);
  if (o.drafter != "oracle" && o.drafter != "random") {
    return absl::InvalidArgumentError("--drafter: bench takes oracle or random");
  }
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  if (o.concurrency < 1) return absl::InvalidArgumentError("--concurrency: must be >= 1");
  o.request_rate = absl::GetFlag(FLAGS_request_rate);
  if (!(o.request_rate >= 0)) {
    return absl::InvalidArgumentError("--request_rate: must be >= 0 (0 or inf: closed loop)");
  }
  o.duration_s = absl::GetFlag(FLAGS_duration_s);
  o.num_rounds = absl::GetFlag(FLAGS_num_rounds);
  if (!(o.duration_s >= 0) || std::isinf(o.duration_s)) {
    return absl::InvalidArgumentError("--duration_s: must be a number of seconds > 0");
  }
  if (o.num_rounds < 0) return absl::InvalidArgumentError("--num_rounds: must be > 0");
  if (o.duration_s > 0 && o.num_rounds > 0) {
    return absl::InvalidArgumentError("--duration_s and --num_rounds: give one, not both");
  }
  if (o.duration_s == 0 && o.num_rounds == 0) o.num_rounds = 200;
  o.oracle_tokens = absl::GetFlag(FLAGS_oracle_tokens);
  if (o.oracle_tokens < 0) return absl::InvalidArgumentError("--oracle_tokens: must be >= 0");
  o.depth = absl::GetFlag(FLAGS_depth);
  o.branches = absl::GetFlag(FLAGS_branches);
  o.accuracy = absl::GetFlag(FLAGS_accuracy);
  o.prompt_len = absl::GetFlag(FLAGS_prompt_len);
  o.seed = absl::GetFlag(FLAGS_seed);
  auto session = SessionOptionsFromFlags();
  if (!session.ok()) return session.status();
  o.session = *session;
  return o;
}

int CmdBench(VerifyClient& c) {
  auto options = BenchOptionsFromFlags();
  if (!options.ok()) return Usage(std::string(options.status().message()));
  const std::string json_path = absl::GetFlag(FLAGS_json);
  std::ofstream json;
  if (!json_path.empty()) {
    json.open(json_path);
    if (!json) return Usage(absl::StrCat("--json: cannot write ", json_path));
  }
  auto report = verifyd::client::RunBench(c, *options);
  if (!report.ok()) return Fail(report.status());
  std::fputs(verifyd::client::BenchTable(*options, *report).c_str(), stdout);
  if (json.is_open()) {
    json << verifyd::client::BenchJson(*options, *report, absl::GetFlag(FLAGS_target));
    json.close();
    if (!json) return Fail(absl::InternalError(absl::StrCat("--json: writing ", json_path)));
  }
  for (const auto& [code, count] : report->errors_by_code) {
    std::fprintf(stderr, "bench: %lld Verify rounds failed with %s\n", (long long)count,
                 code.c_str());
  }
  return report->errors == 0 ? 0 : 1;
}

// Every command-line flag is one of verifyctl's with a value of its type (checked before
// Abseil parses them, which would exit 1): nullopt, or the usage error.
std::optional<std::string> CheckFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // the subcommand
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && eq == absl::string_view::npos) {
      flag = absl::FindCommandLineFlag(name.substr(2));  // --noflag for a bool
      if (flag != nullptr && !flag->IsOfType<bool>()) flag = nullptr;
      if (flag != nullptr) continue;
    }
    // Abseil's own flags (help, flagfile, ...) are not in the registry: it parses them.
    static const char* kAbseil[] = {"help",     "helpfull",  "helpshort",  "helppackage",
                                    "helpon",   "helpmatch", "version",    "only_check_args",
                                    "flagfile", "fromenv",   "tryfromenv", "undefok"};
    if (flag == nullptr &&
        std::find(std::begin(kAbseil), std::end(kAbseil), name) != std::end(kAbseil)) {
      continue;
    }
    if (flag == nullptr) return absl::StrCat("unknown flag --", name);
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::StrCat("--", name, ": missing value");
    }
    // ParseFrom sets the flag; Abseil's parse below sets it again to the same value.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::StrCat("--", name, ": bad value '", value, "': ", error);
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The channel the flags ask for: plaintext (nullptr: VerifyClient's default), or TLS with an
// optional client certificate and bearer token.
absl::StatusOr<std::shared_ptr<grpc::Channel>> SecureChannel() {
  const std::string ca = absl::GetFlag(FLAGS_tls_ca);
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const std::string token_file = absl::GetFlag(FLAGS_auth_token_file);
  if (ca.empty()) {
    if (!cert.empty() || !key.empty() || !token_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_cert, --tls_key and --auth_token_file need --tls_ca (TLS)");
    }
    return std::shared_ptr<grpc::Channel>();
  }
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key: give both or neither");
  }
  grpc::SslCredentialsOptions ssl;
  auto ca_pem = ReadFile(ca, "tls_ca");
  if (!ca_pem.ok()) return ca_pem.status();
  ssl.pem_root_certs = *ca_pem;
  if (!cert.empty()) {
    auto c = ReadFile(cert, "tls_cert");
    if (!c.ok()) return c.status();
    auto k = ReadFile(key, "tls_key");
    if (!k.ok()) return k.status();
    ssl.pem_cert_chain = *c;
    ssl.pem_private_key = *k;
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
  if (!token_file.empty()) {
    auto contents = ReadFile(token_file, "auth_token_file");
    if (!contents.ok()) return contents.status();
    std::string token;
    for (absl::string_view line : absl::StrSplit(*contents, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line[0] == '#') continue;
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      token = std::string(f.back());
    }
    if (token.empty()) return absl::InvalidArgumentError("--auth_token_file: no token");
    creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(token));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(16 << 20);
  if (!absl::GetFlag(FLAGS_tls_server_name).empty()) {
    args.SetSslTargetNameOverride(absl::GetFlag(FLAGS_tls_server_name));
  }
  return grpc::CreateCustomChannel(absl::GetFlag(FLAGS_target), creds, args);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "verifyctl <info|health|open|verify|close|truncate|fork|demo|load|bench> [flags]: "
      "client of verifyd");
  // --help lists verifyctl's flags (not only those of a file named like the program), no build
  // directories in file names, and exits 0 (Abseil's internal parse entry point: its public one
  // exits 1 after help; an unknown flag still exits 1).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view f) { return absl::StrContains(f, "client/"); };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.normalize_filename = [](absl::string_view f) {
    const size_t at = f.rfind("client/");
    return std::string(at == absl::string_view::npos ? f : f.substr(at));
  };
  absl::SetFlagsUsageConfig(usage);
  if (auto error = CheckFlags(argc, argv)) return Usage(*error);
  std::vector<char*> args = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) >= 0) {
    return 0;
  }
  if (args.size() != 2) {
    return Usage(args.size() < 2 ? "no subcommand"
                                 : absl::StrCat("one subcommand expected, got '", args[1], "', '",
                                                args[2], "'"));
  }
  const std::string cmd = args[1];
  static const char* kCommands[] = {"info",     "health", "open", "verify", "close",
                                    "truncate", "fork",   "demo", "load",   "bench"};
  if (std::find(std::begin(kCommands), std::end(kCommands), cmd) == std::end(kCommands)) {
    return Usage(absl::StrCat("unknown subcommand '", cmd, "'"));
  }
  auto channel = SecureChannel();
  if (!channel.ok()) return Usage(std::string(channel.status().message()));
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  VerifyClient client = *channel ? VerifyClient(*channel, timeout)
                                 : VerifyClient(absl::GetFlag(FLAGS_target), timeout);
  if (cmd == "info") return CmdInfo(client);
  if (cmd == "health") return CmdHealth(client);
  if (cmd == "open") return CmdOpen(client);
  if (cmd == "verify") return CmdVerify(client);
  if (cmd == "close") return CmdClose(client);
  if (cmd == "truncate") return CmdTruncate(client);
  if (cmd == "fork") return CmdFork(client);
  if (cmd == "demo") return CmdDemo(client);
  if (cmd == "load") return CmdLoad(client);
  return CmdBench(client);
}
