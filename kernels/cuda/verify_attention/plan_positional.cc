// The positional (batch-invariant) plans of the CUDA verify attention: a row's keys, split
// boundaries and merge order depend on the row alone (api.h VerifyPlanOptions::positional).
// Plain C++ (with plan.cc, the planner): built and tested without CUDA.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/verify_attention/plan.h"
#include "kernels/status.h"

namespace verifyd::kernels::cuda {

int64_t PositionalSplitKeys(int64_t n, const PositionalSplitRule& rule) {
  constexpr int64_t kAlign = 128;  // whole tile pairs of the seesaw kernel (split groups)
  if (n <= 0) return kAlign;
  const int64_t splits = std::min<int64_t>(detail::CeilDiv(n, std::max(1, rule.chunk_keys)),
                                           std::max(1, rule.max_splits));
  return detail::CeilDiv(detail::CeilDiv(n, splits), kAlign) * kAlign;
}

int64_t PositionalSharedSplitKeys(int64_t n, const PositionalSplitRule& rule) {
  const int64_t rounded =
      std::max<int64_t>(1, detail::CeilDiv(n, kPositionalSharedRound)) * kPositionalSharedRound;
  return PositionalSplitKeys(rounded, rule);
}

namespace detail {
namespace {

// What both positional planners share: the checks, the plan's header, the pass bookkeeping
// (partial rows and index entries handed out per pass; a unit of work is never split across
// passes), the visible key count of a node, index tasks, and the final capacity check.
struct PositionalBuilder {
  const VerifyAttentionParams& params;
  const VerifyAttentionWorkspace& ws;
  const VerifyPlanOptions& options;
  VerifyAttentionPlan plan;
  VerifyPass pass;
  int64_t pass_partial = 0, pass_entries = 0;

  PositionalBuilder(const VerifyAttentionParams& p, const VariantInfo& variant,
                    const VerifyAttentionWorkspace& w, const VerifyPlanOptions& o)
      : params(p), ws(w), options(o), plan(PlanHeader(p, variant)) {
    plan.positional = true;
  }

  absl::Status Check() const {
    if (64 % plan.keys_per_tile != 0) {
      return absl::InternalError("verify plan: positional splits need key tiles dividing 64");
    }
    if (params.total_rows > 0 && options.host_tree_mask == nullptr) {
      return absl::InvalidArgumentError(
          "verify plan: host_tree_mask is required by positional plans");
    }
    return absl::OkStatus();
  }

  // Visible keys of row `row` of a request with n_b rows and ctx context keys.
  int Visible(int row, int n_b, int ctx) const {
    const uint64_t* m = options.host_tree_mask + static_cast<int64_t>(row) * params.mask_words;
    int tail = 0;
    for (int j = 0; j < n_b; ++j) tail += static_cast<int>((m[j / 64] >> (j % 64)) & 1u);
    return ctx + tail;
  }

  void ClosePass() {
    pass.work_count = static_cast<int32_t>(plan.work.size()) - pass.work_begin;
    pass.combine_count = static_cast<int32_t>(plan.combine.size()) - pass.combine_begin;
    pass.task_count = static_cast<int32_t>(plan.index_tasks.size()) - pass.task_begin;
    if (pass.work_count > 0) plan.passes.push_back(pass);
    plan.partial_rows = std::max(plan.partial_rows, pass_partial);
    plan.index_entries = std::max(plan.index_entries, pass_entries);
    pass = VerifyPass{};
    pass.work_begin = static_cast<int32_t>(plan.work.size());
    pass.combine_begin = static_cast<int32_t>(plan.combine.size());
    pass.task_begin = static_cast<int32_t>(plan.index_tasks.size());
    pass_partial = 0;
    pass_entries = 0;
  }

  // Makes room in the current pass (or a new one) for a unit of work.
  absl::Status Reserve(int64_t need_partial, int64_t need_entries) {
    if (need_partial > ws.max_partial_rows || need_entries > ws.max_index_entries) {
      return absl::ResourceExhaustedError(
          absl::StrCat("verify plan: one node needs ", need_partial, " partial rows and ",
                       need_entries, " index entries; the workspace holds ", ws.max_partial_rows,
                       " and ", ws.max_index_entries));
    }
    if (pass_partial + need_partial > ws.max_partial_rows ||
        pass_entries + need_entries > ws.max_index_entries) {
      ClosePass();
    }
    return absl::OkStatus();
  }

  // An index list for keys [begin, end) of row `row` (request b); returns the work item's
  // kv_off for it (the list's first entry, encoded as < 0).
  int32_t AddList(int b, int row, int n_b, int ctx, int64_t begin, int64_t end,
                  const int32_t* hkv) {
    VerifyIndexTask task{};
    task.dst = static_cast<int32_t>(pass_entries);
    task.src = hkv[b];
    task.ctx = ctx;
    task.mask_row = row;
    task.num_nodes = n_b;
    task.begin = static_cast<int32_t>(begin);
    task.end = static_cast<int32_t>(end);
    plan.index_tasks.push_back(task);
    const int32_t kv_off = -static_cast<int32_t>(pass_entries) - 1;
    pass_entries += end - begin;
    return kv_off;
  }

  absl::StatusOr<VerifyAttentionPlan> Finish() {
    ClosePass();
    if (static_cast<int64_t>(plan.work.size()) > ws.max_work_items ||
        static_cast<int64_t>(plan.combine.size()) > ws.max_combine_items ||
        static_cast<int64_t>(plan.index_tasks.size()) > ws.max_index_tasks) {
      return absl::ResourceExhaustedError(
          absl::StrCat("verify plan: the positional plan needs ", plan.work.size(), " work items, ",
                       plan.combine.size(), " combine items and ", plan.index_tasks.size(),
                       " index tasks; the workspace holds ", ws.max_work_items, ", ",
                       ws.max_combine_items, " and ", ws.max_index_tasks));
    }
    if (plan.passes.size() == 1) plan.passes.clear();  // one pass: the plain layout
    return std::move(plan);
  }
};

}  // namespace

// Positional plans. Every work item holds the rows of whole nodes (num_nodes = the last
// node + 1 makes the kernels' row count end there, and kv_len = kv_end + num_nodes puts the
// whole range before the "tail": nothing is masked but the range's end). Units of work: one
// node and its head tiles; or, for shared-context plans (positional_shared_context) when the
// rows per CTA are a multiple of the head count (H < BM), runs of up to BM / H consecutive
// nodes of a request with the same split length, one tile of rows. Splits [0, i0) of a unit
// (i0 = ctx / len) lie wholly in the context: one work item per tile reads them for all the
// unit's nodes from the request's own slot list. Splits [i0, S_t) of node t reach its tail:
// per node, through an index list built on the GPU (VerifyIndexTask). A node's split s (of
// S_t) is in partial row base + s * BM + (its row within the tile), whoever wrote it, and one
// combine item per node (per head tile) merges its S_t splits by the left fold of fold.cuh,
// continuing after the splits the first split group folded already (the group starting at
// key 0; folded_splits). A row's keys, split boundaries (PositionalSplitKeys, or
// PositionalSharedSplitKeys) and merge order (splits 0, 1, ... left to right) depend on the
// row alone: a CTA's other rows never enter its arithmetic. Partial rows and index entries are
// handed out in passes that fit the workspace; a unit's work is never split across passes.
// (The head tiles of one split are adjacent, so they stream the same keys together.)
absl::StatusOr<VerifyAttentionPlan> PlanPositional(const VerifyAttentionParams& params,
                                                   const int32_t* hq, const int32_t* hkv,
                                                   const VariantInfo& variant,
                                                   const VerifyAttentionDeviceInfo& device,
                                                   const VerifyAttentionWorkspace& ws,
                                                   const VerifyPlanOptions& options) {
  PositionalBuilder pb(params, variant, ws, options);
  VERIFYD_RETURN_IF_ERROR(pb.Check());
  VerifyAttentionPlan& plan = pb.plan;
  const int B = params.batch;
  const int H = params.num_heads;
  const int BM = variant.rows;
  const bool shared = options.positional_shared_context;
  const bool group = shared && H < BM && BM % H == 0;
  const int head_tiles = group ? 1 : static_cast<int>(CeilDiv(H, BM));
  // Every node's visible key count, split length and split count (per request, flattened).
  std::vector<int> all_visible(params.total_rows), all_splits(params.total_rows);
  std::vector<int64_t> all_lens(params.total_rows);
  int64_t items = 0;    // work items with one split per item
  int64_t partial = 0;  // partial rows the whole plan writes (passes hand them out)
  for (int b = 0; b < B; ++b) {
    const int n_b = hq[b + 1] - hq[b];
    const int ctx = (hkv[b + 1] - hkv[b]) - n_b;
    for (int t = 0; t < n_b; ++t) {
      const int r = hq[b] + t;
      all_visible[r] = pb.Visible(r, n_b, ctx);
      all_lens[r] = shared ? PositionalSharedSplitKeys(all_visible[r], options.positional_split)
                           : PositionalSplitKeys(all_visible[r], options.positional_split);
      all_splits[r] = static_cast<int>(std::max<int64_t>(1, CeilDiv(all_visible[r], all_lens[r])));
      plan.max_splits = std::max(plan.max_splits, all_splits[r]);
      items += static_cast<int64_t>(all_splits[r]) * head_tiles;
      if (all_splits[r] > 1) partial += static_cast<int64_t>(all_splits[r]) * head_tiles * BM;
    }
  }
  // Split groups: a function of the batch, which changes no bits (api.h).
  int split_group = 1;
  if (variant.split_groups) {
    if (options.positional_split_group > 1) {
      split_group = options.positional_split_group;
    } else if (options.positional_split_group < 0 && device.num_sms > 0) {
      // The work items of one pass (a plan larger than the workspace's partial rows runs in
      // passes, one launch each), grouped down to about kPositionalGroupWaves per SM.
      const int64_t passes =
          ws.max_partial_rows > 0 ? std::max<int64_t>(1, CeilDiv(partial, ws.max_partial_rows)) : 1;
      split_group = static_cast<int>(std::max<int64_t>(
          1, items / passes / (static_cast<int64_t>(kPositionalGroupWaves) * device.num_sms)));
    }
  }
  for (int b = 0; b < B; ++b) {
    const int n_b = hq[b + 1] - hq[b];
    const int ctx = (hkv[b + 1] - hkv[b]) - n_b;
    // This request's nodes.
    const int* visible = all_visible.data() + hq[b];
    const int* splits = all_splits.data() + hq[b];
    const int64_t* lens = all_lens.data() + hq[b];
    for (int t0 = 0; t0 < n_b;) {
      int t1 = t0 + 1;  // the unit: nodes [t0, t1)
      if (group) {
        while (t1 < n_b && (t1 - t0) * H < BM && lens[t1] == lens[t0]) ++t1;
      }
      const int64_t len = lens[t0];
      const int i0 = static_cast<int>(ctx / len);
      int max_s = 0;
      int64_t need_entries = 0;
      for (int t = t0; t < t1; ++t) {
        max_s = std::max(max_s, splits[t]);
        for (int i = i0; i < splits[t]; ++i) {
          const int64_t end = std::min<int64_t>(visible[t], (i + 1) * len);
          if (end > ctx) need_entries += end - i * len;
        }
      }
      const int64_t need_partial = max_s > 1 ? static_cast<int64_t>(max_s) * head_tiles * BM : 0;
      VERIFYD_RETURN_IF_ERROR(pb.Reserve(need_partial, need_entries));
      // Tile k of the unit: its first folded row and its partial block.
      auto fold_of = [&](int k) { return t0 * H + k * BM; };
      auto base_of = [&](int k) { return pb.pass_partial + static_cast<int64_t>(k) * max_s * BM; };
      VerifyWorkItem w{};
      w.q_row0 = hq[b];
      // Splits [0, i0): the context only, one work item per tile for all the unit's nodes
      // (runs of up to split_group splits per item when the kernel takes split groups and the
      // split length is whole tile pairs).
      const int group_of = len % 128 == 0 ? split_group : 1;
      // The first group starts at key 0: the kernel folds its splits (api.h, split_keys).
      const int folded = std::min(i0, group_of) > 1 ? std::min(i0, group_of) : 0;
      for (int i = 0; i < i0; i += group_of) {
        const int i1 = std::min(i0, i + group_of);
        for (int k = 0; k < head_tiles; ++k) {
          w.num_nodes = t1;  // rows: up to the unit's last node
          w.kv_off = hkv[b];
          w.kv_begin = static_cast<int32_t>(i * len);
          w.kv_end = static_cast<int32_t>(i1 * len);
          w.kv_len = w.kv_end + w.num_nodes;
          w.fold_begin = fold_of(k);
          w.partial_row = static_cast<int32_t>(base_of(k) + i * BM);
          w.split_keys = i1 - i > 1 ? static_cast<int32_t>(len) : 0;
          plan.work.push_back(w);
        }
      }
      w.split_keys = 0;
      // Splits [i0, S_t): node by node.
      for (int t = t0; t < t1; ++t) {
        for (int i = i0; i < splits[t]; ++i) {
          const int64_t begin = i * len;
          const int64_t end = std::min<int64_t>(visible[t], (i + 1) * len);
          w.num_nodes = t + 1;  // rows: this node's
          if (end > ctx) {
            w.kv_off = pb.AddList(b, hq[b] + t, n_b, ctx, begin, end, hkv);
            w.kv_begin = 0;
            w.kv_end = static_cast<int32_t>(end - begin);
          } else {  // a row that sees no tail key
            w.kv_off = hkv[b];
            w.kv_begin = static_cast<int32_t>(begin);
            w.kv_end = static_cast<int32_t>(end);
          }
          w.kv_len = w.kv_end + w.num_nodes;
          for (int k = 0; k < head_tiles; ++k) {
            const int row_in_tile = group ? (t - t0) * H : 0;
            w.fold_begin = group ? t * H : fold_of(k);
            w.partial_row =
                splits[t] > 1 ? static_cast<int32_t>(base_of(k) + i * BM + row_in_tile) : -1;
            plan.work.push_back(w);
          }
        }
        if (splits[t] > 1) {
          for (int k = 0; k < head_tiles; ++k) {
            VerifyCombineItem ci{};
            ci.out_row0 = (hq[b] + t) * H + (group ? 0 : k * BM);
            ci.num_rows = group ? H : std::min(BM, H - k * BM);
            ci.num_splits = splits[t];
            ci.partial_row0 = static_cast<int32_t>(base_of(k) + (group ? (t - t0) * H : 0));
            ci.folded_splits = folded;
            plan.combine.push_back(ci);
          }
        }
      }
      pb.pass_partial += need_partial;
      t0 = t1;
    }
  }
  return pb.Finish();
}

}  // namespace detail
}  // namespace verifyd::kernels::cuda
