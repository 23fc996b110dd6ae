// BuildBatchPlan (see batch_plan.h).
#include "tp/batch_plan.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"

namespace verifyd::tp {

namespace {

template <typename... Parts>
absl::Status Bad(const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// The tail slots of the batch that are inside the pool, sorted.
std::vector<int32_t> SortedTailSlots(const std::vector<StepRequest>& batch, int64_t kv_slots) {
  std::vector<int32_t> tails;
  for (const StepRequest& q : batch) {
    for (int32_t s : q.tail_slots) {
      if (s >= 0 && s < kv_slots) tails.push_back(s);
    }
  }
  std::sort(tails.begin(), tails.end());
  return tails;
}

// Every context slot must be inside the pool; returns the sorted tail slots (`tails`, sorted)
// that are also a context slot of some request. The context lists are long (32 requests x
// 185k slots = 5.9 M ids) and the tail slots few (<= 65 per request), so the context is
// scanned once against the tail slots: a 2^18-bit hashed filter of the in-range tail slots
// (32 KB, stays in L1) rejects almost every context slot with one read; a filter hit is
// confirmed in the sorted tail slots. (Marking every context slot in a pool-sized array cost
// ~45-80 ms per such step on a CI-class CPU.)
absl::StatusOr<std::vector<int32_t>> ContextTailSlots(const std::vector<StepRequest>& batch,
                                                      int64_t kv_slots,
                                                      const std::vector<int32_t>& tails) {
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
        return Bad("batch[", b, "].context_slots[", i, "] = ", s, " is outside [0, ", kv_slots,
                   ")");
      }
      if (!filter.empty() && ((filter[filter_bit(s) >> 6] >> (filter_bit(s) & 63)) & 1) &&
          std::binary_search(tails.begin(), tails.end(), s)) {
        context_tails.push_back(s);
      }
    }
  }
  std::sort(context_tails.begin(), context_tails.end());
  return context_tails;
}

// Room for the whole batch in every array of the plan; q_indptr and kv_indptr start at 0.
void ReservePlan(const std::vector<StepRequest>& batch, bool with_kv_indices, BatchPlan& p) {
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
}

// batch[b]'s per-request fields: row count and array sizes, sampling, top_logprobs,
// hidden_layers and the context limit.
absl::Status CheckRequest(const StepRequest& q, size_t b, const ModelConfig& c,
                          const EngineLimits& limits) {
  const int64_t n = static_cast<int64_t>(q.tokens.size());
  if (n < 1) return Bad("batch[", b, "].tokens is empty");
  if (n > limits.max_tail_rows) {
    return Bad("batch[", b, "].tokens: ", n, " rows exceed max_tail_rows ", limits.max_tail_rows);
  }
  if (static_cast<int64_t>(q.parents.size()) != n) {
    return Bad("batch[", b, "].parents has ", q.parents.size(), " entries, tokens has ", n);
  }
  if (static_cast<int64_t>(q.tail_slots.size()) != n) {
    return Bad("batch[", b, "].tail_slots has ", q.tail_slots.size(), " entries, tokens has ", n);
  }
  const kernels::SamplingParams& sp = q.sampling;
  if (!(sp.temperature >= 0.0f) || std::isinf(sp.temperature)) {
    return Bad("batch[", b, "].sampling.temperature = ", sp.temperature,
               " must be finite and >= 0");
  }
  if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f)) {
    return Bad("batch[", b, "].sampling.top_p = ", sp.top_p, " is outside (0, 1]");
  }
  if (sp.top_k < 0) return Bad("batch[", b, "].sampling.top_k = ", sp.top_k, " must be >= 0");
  if (q.top_logprobs < -1 || q.top_logprobs > kernels::kMaxTopLogprobs) {
    return Bad("batch[", b, "].top_logprobs = ", q.top_logprobs, " is outside [-1, ",
               kernels::kMaxTopLogprobs, "]");
  }
  for (size_t i = 0; i < q.hidden_layers.size(); ++i) {
    const int32_t l = q.hidden_layers[i];
    if (l < 0 || l >= c.num_hidden_layers) {
      return Bad("batch[", b, "].hidden_layers[", i, "] = ", l, " is outside [0, ",
                 c.num_hidden_layers, ")");
    }
    for (size_t j = 0; j < i; ++j) {
      if (q.hidden_layers[j] == l) {
        return Bad("batch[", b, "].hidden_layers[", i, "] = ", l, " is listed twice");
      }
    }
  }
  const int64_t committed = static_cast<int64_t>(q.context_slots.size());
  if (committed + n > limits.max_context) {
    return Bad("batch[", b, "]: context_slots (", committed, ") + rows (", n,
               ") exceed max_context ", limits.max_context);
  }
  return absl::OkStatus();
}

// batch[b]'s rows: tokens in the vocabulary, parents[0] = -1 and parents[t] in [0, t), tail
// slots in the pool, not a context slot and not used twice in the batch (`used_tails`, the
// tail slots of the rows checked so far, gains this request's).
absl::Status CheckRows(const StepRequest& q, size_t b, const ModelConfig& c, int64_t kv_slots,
                       const std::vector<int32_t>& context_tails,
                       std::unordered_set<int32_t>& used_tails) {
  const int64_t n = static_cast<int64_t>(q.tokens.size());
  for (int64_t t = 0; t < n; ++t) {
    const int32_t tok = q.tokens[t];
    if (tok < 0 || tok >= c.vocab_size) {
      return Bad("batch[", b, "].tokens[", t, "] = ", tok, " is outside [0, vocab_size ",
                 c.vocab_size, ")");
    }
    const int32_t par = q.parents[t];
    if (t == 0 ? par != -1 : (par < 0 || par >= t)) {
      return Bad(
          "batch[", b, "].parents[", t, "] = ", par,
          t == 0 ? " (row 0 is the root: must be -1)" : absl::StrCat(" is not in [0, ", t, ")"));
    }
    const int32_t s = q.tail_slots[t];
    if (s < 0 || s >= kv_slots) {
      return Bad("batch[", b, "].tail_slots[", t, "] = ", s, " is outside [0, ", kv_slots, ")");
    }
    if (std::binary_search(context_tails.begin(), context_tails.end(), s)) {
      return Bad("batch[", b, "].tail_slots[", t, "] = ", s, " is a context slot");
    }
    if (!used_tails.insert(s).second) {
      return Bad("batch[", b, "].tail_slots[", t, "] = ", s, " is used twice in the batch");
    }
  }
  return absl::OkStatus();
}

// Appends a checked request to the plan: its rows (depth, position and ancestors-and-self
// mask), its KV indices and its q / kv index pointers.
void AppendRequest(const StepRequest& q, bool with_kv_indices, BatchPlan& p) {
  const int64_t n = static_cast<int64_t>(q.tokens.size());
  const int64_t committed = static_cast<int64_t>(q.context_slots.size());
  const int row0 = p.total_rows;
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

}  // namespace

absl::StatusOr<BatchPlan> BuildBatchPlan(const std::vector<StepRequest>& batch,
                                         const ModelConfig& c, const EngineLimits& limits,
                                         int64_t kv_slots, bool with_kv_indices) {
  if (static_cast<int64_t>(batch.size()) > limits.max_batch) {
    return Bad("batch: ", batch.size(), " requests exceed max_batch ", limits.max_batch);
  }
  // No tail slot (written by this step) may be a context slot of any request of the batch or
  // appear twice.
  const std::vector<int32_t> tails = SortedTailSlots(batch, kv_slots);
  VERIFYD_ASSIGN_OR_RETURN(const std::vector<int32_t> context_tails,
                           ContextTailSlots(batch, kv_slots, tails));
  std::unordered_set<int32_t> used_tails;  // tail slots seen so far in the batch
  used_tails.reserve(tails.size());
  BatchPlan p;
  p.batch = static_cast<int>(batch.size());
  ReservePlan(batch, with_kv_indices, p);
  for (size_t b = 0; b < batch.size(); ++b) {
    const StepRequest& q = batch[b];
    VERIFYD_RETURN_IF_ERROR(CheckRequest(q, b, c, limits));
    VERIFYD_RETURN_IF_ERROR(CheckRows(q, b, c, kv_slots, context_tails, used_tails));
    AppendRequest(q, with_kv_indices, p);
  }
  return p;
}

}  // namespace verifyd::tp
