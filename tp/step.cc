// The backend-independent parts of an engine step (see step.h).
#include "tp/step.h"

#include <algorithm>
#include <numeric>

namespace verifyd::tp {

std::vector<size_t> SharedPrefixOrder(const std::vector<StepRequest>& batch) {
  std::vector<size_t> order(batch.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto first_slot = [&](size_t k) {
    return batch[k].context_slots.empty() ? int64_t{-1} : int64_t{batch[k].context_slots[0]};
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return first_slot(a) < first_slot(b); });
  return order;
}

HiddenCapturePlan PlanHiddenCaptures(const std::vector<StepRequest>& batch, const BatchPlan& plan,
                                     const ModelConfig& config) {
  HiddenCapturePlan hp;
  hp.base.assign(batch.size(), 0);
  const int64_t hid = config.hidden_size;
  for (size_t b = 0; b < batch.size(); ++b) {
    const StepRequest& q = batch[b];
    if (q.hidden_layers.empty()) continue;
    const int32_t row0 = plan.q_indptr[b], n = plan.q_indptr[b + 1] - row0;
    if (hp.by_layer.empty()) hp.by_layer.resize(config.num_hidden_layers);
    const int64_t nl = static_cast<int64_t>(q.hidden_layers.size());
    hp.base[b] = hp.floats;
    for (int64_t li = 0; li < nl; ++li) {
      hp.by_layer[q.hidden_layers[li]].push_back({row0, n, hp.floats + li * hid, nl * hid});
    }
    hp.floats += int64_t{n} * nl * hid;
  }
  return hp;
}

std::vector<StepResult> AssembleStepResults(const std::vector<StepRequest>& batch,
                                            const BatchPlan& plan, const int32_t* predictions,
                                            const StepAcceptance& acceptance, const float* hidden,
                                            const std::vector<int64_t>& hidden_base,
                                            int64_t hidden_size) {
  std::vector<StepResult> results(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const StepRequest& q = batch[b];
    const int32_t row0 = plan.q_indptr[b], n = plan.q_indptr[b + 1] - row0;
    StepResult& res = results[b];
    res.predictions.assign(predictions + row0, predictions + row0 + n);
    const int64_t per_row = static_cast<int64_t>(q.hidden_layers.size()) * hidden_size;
    const float* h = per_row > 0 ? hidden + hidden_base[b] : nullptr;
    if (!q.accept) {
      // Prefill chunk: every row is committed; bonus = the prediction after the last row.
      res.bonus = res.predictions.back();
      res.kept_slots = q.tail_slots;
      if (h != nullptr) res.hidden.assign(h, h + int64_t{n} * per_row);
      continue;
    }
    const int32_t na = acceptance.num_accepted[b];
    res.accepted_rows.assign(acceptance.accepted + row0, acceptance.accepted + row0 + na);
    res.bonus = acceptance.bonus[b];
    res.kept_slots.assign(acceptance.kept + row0, acceptance.kept + row0 + 1 + na);
    res.freed_slots.assign(acceptance.freed + row0, acceptance.freed + row0 + (n - 1 - na));
    if (h != nullptr) {
      // The committed rows: the root, then the accepted path.
      res.hidden.reserve(static_cast<size_t>((1 + na) * per_row));
      res.hidden.assign(h, h + per_row);
      for (int32_t r : res.accepted_rows) {
        res.hidden.insert(res.hidden.end(), h + r * per_row, h + (r + 1) * per_row);
      }
    }
  }
  return results;
}

}  // namespace verifyd::tp
