// BuildBatchPlan (see batch_plan.h).
#include "tp/batch_plan.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace verifyd::tp {

absl::StatusOr<BatchPlan> BuildBatchPlan(const std::vector<StepRequest>& batch,
                                         const ModelConfig& c, const EngineLimits& limits,
                                         int64_t kv_slots, bool with_kv_indices) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (static_cast<int64_t>(batch.size()) > limits.max_batch) {
    return bad("batch: ", batch.size(), " requests exceed max_batch ", limits.max_batch);
  }
  // Every context slot must be inside the pool, and no tail slot (written by this step) may
  // be a context slot of any request of the batch or appear twice. The context lists are
  // long (32 requests x 185k slots = 5.9 M ids) and the tail slots few (<= 65 per request),
  // so the context is scanned once against the tail slots: a 2^18-bit hashed filter of the
  // in-range tail slots (32 KB, stays in L1) rejects almost every context slot with one read;
  // a filter hit is confirmed in the sorted tail slots. (Marking every context slot in a
  // pool-sized array cost ~45-80 ms per such step on a CI-class CPU.)
  std::vector<int32_t> tails;  // in-range tail slots of the batch, sorted
  for (const StepRequest& q : batch) {
    for (int32_t s : q.tail_slots) {
      if (s >= 0 && s < kv_slots) tails.push_back(s);
    }
  }
  std::sort(tails.begin(), tails.end());
  constexpr int kFilterBits = 18;
  auto filter_bit = [](int32_t s) {
    return static_cast<uint32_t>(static_cast<uint32_t>(s) * 2654435761u) >> (32 - kFilterBits);
  };
  std::vector<uint64_t> filter(tails.empty() ? 0 : (size_t{1} << kFilterBits) / 64, 0);
  for (int32_t s : tails) filter[filter_bit(s) >> 6] |= uint64_t{1} << (filter_bit(s) & 63);
  std::vector<int32_t> context_tails;  // tail slots that are also context slots
  for (size_t b = 0; b < batch.size(); ++b) {
    const std::vector<int32_t>& cs = batch[b].context_slots;
    for (size_t i = 0; i < cs.size(); ++i) {
      const int32_t s = cs[i];
      if (s < 0 || s >= kv_slots) {
        return bad("batch[", b, "].context_slots[", i, "] = ", s, " is outside [0, ", kv_slots,
                   ")");
      }
      if (!filter.empty() && ((filter[filter_bit(s) >> 6] >> (filter_bit(s) & 63)) & 1) &&
          std::binary_search(tails.begin(), tails.end(), s)) {
        context_tails.push_back(s);
      }
    }
  }
  std::sort(context_tails.begin(), context_tails.end());
  std::unordered_set<int32_t> used_tails;  // tail slots seen so far in the batch
  used_tails.reserve(tails.size());
  BatchPlan p;
  p.batch = static_cast<int>(batch.size());
  size_t total_slots = 0, total_rows = 0;
  for (const StepRequest& q : batch) {
    total_slots += q.context_slots.size() + q.tail_slots.size();
    total_rows += q.tokens.size();
  }
  if (with_kv_indices) p.kv_indices.reserve(total_slots);
  p.tokens.reserve(total_rows);
  p.parents.reserve(total_rows);
  p.positions.reserve(total_rows);
  p.tail_slots.reserve(total_rows);
  p.tree_mask.reserve(total_rows * kMaskWords);
  p.q_indptr.push_back(0);
  p.kv_indptr.push_back(0);
  for (size_t b = 0; b < batch.size(); ++b) {
    const StepRequest& q = batch[b];
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    if (n < 1) return bad("batch[", b, "].tokens is empty");
    if (n > limits.max_tail_rows) {
      return bad("batch[", b, "].tokens: ", n, " rows exceed max_tail_rows ", limits.max_tail_rows);
    }
    if (static_cast<int64_t>(q.parents.size()) != n) {
      return bad("batch[", b, "].parents has ", q.parents.size(), " entries, tokens has ", n);
    }
    if (static_cast<int64_t>(q.tail_slots.size()) != n) {
      return bad("batch[", b, "].tail_slots has ", q.tail_slots.size(), " entries, tokens has ", n);
    }
    const kernels::SamplingParams& sp = q.sampling;
    if (!(sp.temperature >= 0.0f) || std::isinf(sp.temperature)) {
      return bad("batch[", b, "].sampling.temperature = ", sp.temperature,
                 " must be finite and >= 0");
    }
    if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f)) {
      return bad("batch[", b, "].sampling.top_p = ", sp.top_p, " is outside (0, 1]");
    }
    if (sp.top_k < 0) return bad("batch[", b, "].sampling.top_k = ", sp.top_k, " must be >= 0");
    if (q.top_logprobs < -1 || q.top_logprobs > kernels::kMaxTopLogprobs) {
      return bad("batch[", b, "].top_logprobs = ", q.top_logprobs, " is outside [-1, ",
                 kernels::kMaxTopLogprobs, "]");
    }
    for (size_t i = 0; i < q.hidden_layers.size(); ++i) {
      const int32_t l = q.hidden_layers[i];
      if (l < 0 || l >= c.num_hidden_layers) {
        return bad("batch[", b, "].hidden_layers[", i, "] = ", l, " is outside [0, ",
                   c.num_hidden_layers, ")");
      }
      for (size_t j = 0; j < i; ++j) {
        if (q.hidden_layers[j] == l) {
          return bad("batch[", b, "].hidden_layers[", i, "] = ", l, " is listed twice");
        }
      }
    }
    const int64_t committed = static_cast<int64_t>(q.context_slots.size());
    if (committed + n > limits.max_context) {
      return bad("batch[", b, "]: context_slots (", committed, ") + rows (", n,
                 ") exceed max_context ", limits.max_context);
    }
    const int row0 = p.total_rows;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t tok = q.tokens[t];
      if (tok < 0 || tok >= c.vocab_size) {
        return bad("batch[", b, "].tokens[", t, "] = ", tok, " is outside [0, vocab_size ",
                   c.vocab_size, ")");
      }
      const int32_t par = q.parents[t];
      if (t == 0 ? par != -1 : (par < 0 || par >= t)) {
        return bad(
            "batch[", b, "].parents[", t, "] = ", par,
            t == 0 ? " (row 0 is the root: must be -1)" : absl::StrCat(" is not in [0, ", t, ")"));
      }
      const int32_t s = q.tail_slots[t];
      if (s < 0 || s >= kv_slots) {
        return bad("batch[", b, "].tail_slots[", t, "] = ", s, " is outside [0, ", kv_slots, ")");
      }
      if (std::binary_search(context_tails.begin(), context_tails.end(), s)) {
        return bad("batch[", b, "].tail_slots[", t, "] = ", s, " is a context slot");
      }
      if (!used_tails.insert(s).second) {
        return bad("batch[", b, "].tail_slots[", t, "] = ", s, " is used twice in the batch");
      }
    }
    // Rows: depth, position and ancestors-and-self mask.
    std::vector<int32_t> depth(n, 0);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t par = q.parents[t];
      depth[t] = t == 0 ? 0 : depth[par] + 1;
      p.tokens.push_back(q.tokens[t]);
      p.parents.push_back(par);
      p.positions.push_back(static_cast<int32_t>(committed + depth[t]));
      p.tail_slots.push_back(q.tail_slots[t]);
      uint64_t m[kMaskWords] = {0, 0};
      if (t > 0) {
        for (int w = 0; w < kMaskWords; ++w) m[w] = p.tree_mask[(row0 + par) * kMaskWords + w];
      }
      m[t / 64] |= uint64_t{1} << (t % 64);
      for (int w = 0; w < kMaskWords; ++w) p.tree_mask.push_back(m[w]);
    }
    if (with_kv_indices) {
      p.kv_indices.insert(p.kv_indices.end(), q.context_slots.begin(), q.context_slots.end());
      p.kv_indices.insert(p.kv_indices.end(), q.tail_slots.begin(), q.tail_slots.end());
    }
    p.total_rows += static_cast<int>(n);
    p.q_indptr.push_back(p.total_rows);
    p.kv_indptr.push_back(static_cast<int32_t>(p.kv_indptr.back() + committed + n));
  }
  return p;
}

}  // namespace verifyd::tp
