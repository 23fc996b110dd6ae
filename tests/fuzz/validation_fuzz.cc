// Fuzz harness: request validation (server/validation.h) against an independent oracle.
//
// Input byte 0 picks the mode:
//   even: the rest is a binary VerifyRequest / OpenSessionRequest (exercises the protobuf
//         parser on hostile bytes as the server sees them);
//   odd:  the rest builds a structured request (limits, items, trees whose parents are
//         mostly valid) so the checks past the first field are reached.
// Invariants: validation never crashes; it accepts exactly the requests the oracle accepts;
// a rejection is InvalidArgument (Unimplemented for draft_probs) whose message starts with
// the offending field; an accepted
// tree is one greedy tree acceptance can walk (every accepted row's parent is the previous
// accepted row, tokens match predictions); CheckContext matches its formula.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "kernels/tree_accept.h"
#include "server/validation.h"
#include "tests/fuzz/fuzz_input.h"
#include "verify/v1/verify.pb.h"

namespace {

namespace v1 = ::verify::v1;
using verifyd::fuzz::ByteReader;
using verifyd::server::ApiLimits;

bool OracleTree(const v1::DraftTree& t, const ApiLimits& l) {
  if (t.tokens_size() != t.parents_size()) return false;
  if (t.tokens_size() > l.max_draft_nodes) return false;
  for (int i = 0; i < t.tokens_size(); ++i) {
    if (t.tokens(i) < 0 || t.tokens(i) >= l.vocab_size) return false;
    if (t.parents(i) < -1 || t.parents(i) >= i) return false;
  }
  return true;
}

bool OracleVerify(const v1::VerifyRequest& r, const ApiLimits& l) {
  if (r.items_size() < 1 || r.items_size() > l.max_batch) return false;
  std::set<std::string> ids;
  for (const auto& it : r.items()) {
    if (it.session_id().empty() || !ids.insert(it.session_id()).second) return false;
    if (!OracleTree(it.tree(), l)) return false;
    if (it.draft_probs_size() > 0) return false;  // Unimplemented (no rejection sampling)
  }
  return true;
}

bool OraclePrompt(const v1::OpenSessionRequest& r, const ApiLimits& l) {
  const int64_t n = r.prompt_tokens_size();
  if (n < 1 || n > l.max_context - 1) return false;
  for (int32_t t : r.prompt_tokens()) {
    if (t < 0 || t >= l.vocab_size) return false;
  }
  return true;
}

void CheckRejection(const absl::Status& st, const char* field_prefix) {
  FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument ||
             (st.code() == absl::StatusCode::kUnimplemented &&
              absl::StrContains(st.message(), ".draft_probs: ")));
  FUZZ_CHECK(absl::StartsWith(st.message(), field_prefix));
}

// An accepted tree must be walkable by greedy acceptance, with a path that obeys the rule.
void CheckAcceptable(const v1::DraftTree& t, ByteReader& in, const ApiLimits& l) {
  const int n = t.tokens_size();
  // Engine rows: [pending, node 0 .. node n-1]; node i -> row i + 1.
  std::vector<int32_t> tokens(n + 1), parents(n + 1), predictions(n + 1);
  tokens[0] = 0;
  parents[0] = -1;
  for (int i = 0; i < n; ++i) {
    tokens[i + 1] = t.tokens(i);
    parents[i + 1] = t.parents(i) + 1;
  }
  for (int r = 0; r <= n; ++r) {
    // Often predict a child's token, so paths get long.
    predictions[r] = in.Bool() && r + 1 <= n ? tokens[in.Range(1, n)]
                                             : static_cast<int32_t>(in.Range(0, l.vocab_size - 1));
  }
  const verifyd::kernels::TreeAcceptResult res =
      verifyd::kernels::AcceptTreeGreedy(tokens, parents, predictions);
  int32_t prev = 0;
  for (int32_t row : res.accepted_rows) {
    FUZZ_CHECK(row >= 1 && row <= n);
    FUZZ_CHECK(parents[row] == prev);
    FUZZ_CHECK(tokens[row] == predictions[prev]);
    prev = row;
  }
  FUZZ_CHECK(res.bonus == predictions[prev]);
  // No child of the last accepted row matches (acceptance stopped for a reason).
  for (int r = 1; r <= n; ++r) FUZZ_CHECK(!(parents[r] == prev && tokens[r] == predictions[prev]));
}

ApiLimits ReadLimits(ByteReader& in) {
  ApiLimits l;
  l.vocab_size = in.Range(1, 300);
  l.max_draft_nodes = static_cast<int>(in.Range(0, 70));
  l.max_context = in.Range(0, 4096);
  l.max_batch = static_cast<int>(in.Range(1, 8));
  return l;
}

int32_t ReadToken(ByteReader& in, const ApiLimits& l) {
  if (in.Chance(8)) return static_cast<int32_t>(in.U32());  // anything, negative included
  return static_cast<int32_t>(in.Range(0, l.vocab_size - 1 + (in.Chance(16) ? 2 : 0)));
}

void BuildStructured(ByteReader& in, const ApiLimits& l, v1::VerifyRequest* req,
                     v1::OpenSessionRequest* open) {
  const int items = static_cast<int>(in.Range(0, l.max_batch + 1));
  for (int i = 0; i < items; ++i) {
    v1::VerifyItem* it = req->add_items();
    if (!in.Chance(6)) {
      it->set_session_id(in.Chance(20)
                             ? std::string("dup")
                             : "s" + std::to_string(i) + std::string(in.Range(0, 3), 'x'));
    }
    const int n = static_cast<int>(in.Range(0, l.max_draft_nodes + 1));
    for (int k = 0; k < n; ++k) {
      it->mutable_tree()->add_tokens(ReadToken(in, l));
      int32_t p;
      if (in.Chance(8)) {
        p = static_cast<int32_t>(in.U32());
      } else if (in.Chance(8)) {
        p = static_cast<int32_t>(in.Range(-2, k + 1));
      } else {
        p = static_cast<int32_t>(in.Range(-1, k - 1));
      }
      if (!in.Chance(3)) it->mutable_tree()->add_parents(p);
    }
  }
  const int prompt = static_cast<int>(in.Range(0, 64));
  for (int k = 0; k < prompt; ++k) open->add_prompt_tokens(ReadToken(in, l));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const bool structured = in.Byte() & 1;
  const ApiLimits limits = ReadLimits(in);
  v1::VerifyRequest req;
  v1::OpenSessionRequest open;
  if (structured) {
    BuildStructured(in, limits, &req, &open);
  } else {
    const size_t rest = in.remaining();
    const uint8_t* p = data + (size - rest);
    // The same bytes as both message types: whatever parses is validated.
    if (!req.ParseFromArray(p, static_cast<int>(rest))) req.Clear();
    if (!open.ParseFromArray(p, static_cast<int>(rest))) open.Clear();
  }

  const absl::Status vst = verifyd::server::ValidateVerifyRequest(req, limits);
  FUZZ_CHECK(vst.ok() == OracleVerify(req, limits));
  if (!vst.ok()) {
    CheckRejection(vst, "items");
  } else {
    for (const auto& it : req.items()) CheckAcceptable(it.tree(), in, limits);
  }
  const absl::Status pst = verifyd::server::ValidatePrompt(open, limits);
  FUZZ_CHECK(pst.ok() == OraclePrompt(open, limits));
  if (!pst.ok()) CheckRejection(pst, "prompt_tokens");

  // CheckContext over realistic committed lengths (a session's context never exceeds
  // max_context, so values stay far from overflow).
  const int64_t committed = in.Range(0, limits.max_context + 2);
  const int nodes = static_cast<int>(in.Range(0, limits.max_draft_nodes));
  const absl::Status cst = verifyd::server::CheckContext(committed, nodes, limits, "items[0].tree");
  FUZZ_CHECK(cst.ok() == (committed + 1 + nodes <= limits.max_context));
  if (!cst.ok()) CheckRejection(cst, "items[0].tree");
  return 0;
}
