// The host half of the CUDA verify attention: Supports, variant resolution and the kAuto
// rule (from the table in variants.h), the split planner and the workspace layout. Plain
// C++: built and tested without CUDA.
#include "kernels/cuda/verify_attention/plan.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"

namespace verifyd::kernels::cuda {
namespace detail {
namespace {

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

bool Fits(const VariantInfo& v, const VerifyAttentionDeviceInfo& device) {
  return static_cast<int64_t>(v.smem_bytes) <= device.max_smem_per_block;
}

// Makespan (in key units) of items with these costs when handed out in order to `slots`
// identical workers, each taking the next item when free (how CTAs are dispatched).
double Makespan(const std::vector<double>& costs, int slots) {
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int i = 0; i < slots; ++i) free_at.push(0.0);
  double end = 0.0;
  for (double c : costs) {
    const double t = free_at.top() + c;
    free_at.pop();
    free_at.push(t);
    end = std::max(end, t);
  }
  return end;
}

}  // namespace

absl::StatusOr<VariantInfo> ResolveVariant(VerifyKernelConfig config,
                                           const VerifyAttentionDeviceInfo& device, bool kv_fp8) {
  std::string wanted;
  const char* name = nullptr;
  bool other_format = false;
  for (const VariantInfo& v : kVariantTable) {
    if (v.config != config) continue;
    if (v.kv_fp8 != kv_fp8) {
      other_format = true;
      continue;
    }
    if (name == nullptr) name = v.name;
    if (v.runs_on(device.cc_major)) {
      if (!Fits(v, device)) {
        return absl::UnimplementedError(absl::StrCat(
            "verify attention: the ", v.name, " configuration needs ", v.smem_bytes,
            " bytes of shared memory per block; the device allows ", device.max_smem_per_block));
      }
      return v;
    }
    absl::StrAppend(&wanted, wanted.empty() ? "" : " or ", v.arch);
  }
  if (name == nullptr && other_format) {
    return absl::UnimplementedError(absl::StrCat("verify attention: configuration ",
                                                 static_cast<int>(config), " has no variant for ",
                                                 kv_fp8 ? "an FP8" : "a bf16", " latent cache"));
  }
  if (name == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("verify attention: no kernel configuration ", static_cast<int>(config)));
  }
  return absl::UnimplementedError(absl::StrCat("verify attention: the ", name,
                                               " configuration needs ", wanted, ", got sm_",
                                               device.cc_major, device.cc_minor));
}

absl::StatusOr<VariantInfo> AutoVariant(const VerifyAttentionDeviceInfo& device,
                                        int64_t max_folded_rows_per_request, int64_t total_keys,
                                        bool kv_fp8, int64_t max_staged_keys) {
  const bool tiny = IsTinyDecodeBatch(max_folded_rows_per_request, total_keys);
  for (const VariantInfo& v : kVariantTable) {
    if (v.kv_fp8 != kv_fp8) continue;
    if (!v.runs_on(device.cc_major) || !Fits(v, device)) continue;
    if (v.auto_use == AutoUse::kNotTinyDecode && tiny) continue;
    if (v.auto_use == AutoUse::kManyRows &&
        !IsManyRowsBatch(max_folded_rows_per_request, total_keys)) {
      continue;
    }
    if (v.auto_use == AutoUse::kStagedFp8 &&
        (!IsStagedFp8Batch(max_folded_rows_per_request, total_keys) ||
         total_keys > max_staged_keys)) {
      continue;
    }
    return v;
  }
  // Nothing runs here: the error of the portable configuration names the reason.
  return ResolveVariant(VerifyKernelConfig::kM16, device, kv_fp8);
}

WorkspaceLayout LayoutWorkspace(int max_work_items, int max_combine_items, int64_t max_partial_rows,
                                int max_index_tasks, int64_t max_index_entries,
                                int64_t max_staged_keys) {
  WorkspaceLayout l;
  l.work = 0;
  l.combine = AlignUp(l.work + sizeof(VerifyWorkItem) * max_work_items, 256);
  l.lse = AlignUp(l.combine + sizeof(VerifyCombineItem) * max_combine_items, 256);
  l.part_o = AlignUp(l.lse + sizeof(float) * max_partial_rows, 256);
  l.tasks = AlignUp(l.part_o + sizeof(float) * kVDim * max_partial_rows, 256);
  l.pos = AlignUp(l.tasks + sizeof(VerifyIndexTask) * max_index_tasks, 256);
  l.staged_rows = AlignUp(l.pos + sizeof(int32_t) * max_index_entries, 256);
  l.staged_ids = AlignUp(l.staged_rows + sizeof(uint16_t) * kQkDim * max_staged_keys, 256);
  l.total = AlignUp(l.staged_ids + sizeof(int32_t) * max_staged_keys, 256);
  return l;
}

VerifyAttentionPlan PlanHeader(const VerifyAttentionParams& params, const VariantInfo& variant) {
  VerifyAttentionPlan plan;
  plan.config = variant.config;
  plan.kv_fp8 = params.kv_fp8;
  plan.rows_per_cta = variant.rows;
  plan.keys_per_tile = variant.keys;
  plan.num_heads = params.num_heads;
  plan.batch = params.batch;
  plan.total_rows = params.total_rows;
  return plan;
}

bool PlanFitsWorkspace(const VerifyAttentionPlan& plan, const VerifyAttentionWorkspace& ws) {
  return static_cast<int64_t>(plan.work.size()) <= ws.max_work_items &&
         static_cast<int64_t>(plan.combine.size()) <= ws.max_combine_items &&
         plan.partial_rows <= ws.max_partial_rows &&
         static_cast<int64_t>(plan.index_tasks.size()) <= ws.max_index_tasks &&
         plan.index_entries <= ws.max_index_entries && plan.staged_keys <= ws.max_staged_keys;
}

}  // namespace detail

VerifyKernelConfig PositionalConfigFor(int cc_major, bool kv_fp8) {
  if (cc_major != 9) return VerifyKernelConfig::kM16;
  return kv_fp8 ? VerifyKernelConfig::kKm16 : VerifyKernelConfig::kS64;
}

namespace detail {
namespace {

// Shared prefixes of a default plan (api.h "Shared prefixes"): the work and combine items of
// the packed requests, their partial rows numbered from 0 (the caller offsets them), and which
// requests they cover.
struct SharedPrefixPlan {
  std::vector<VerifyWorkItem> work;
  std::vector<VerifyCombineItem> combine;
  std::vector<char> member;  // [batch]: planned here
  int64_t partial_rows = 0;
  int max_splits = 0;
  int packs = 0;
  int64_t reads_saved = 0;
};

// The length of the common prefix of a[0, n) and b[0, n).
int64_t CommonPrefix(const int32_t* a, const int32_t* b, int64_t n) {
  constexpr int64_t kChunk = 256;
  int64_t i = 0;
  while (i + kChunk <= n && std::memcmp(a + i, b + i, kChunk * sizeof(int32_t)) == 0) i += kChunk;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

SharedPrefixPlan PlanSharedPrefixes(const std::vector<int>& n, const std::vector<int>& L,
                                    const int32_t* hq, const int32_t* hkv, const int32_t* idx,
                                    int H, int BM, int BN, int slots, int64_t min_split) {
  const int B = static_cast<int>(n.size());
  SharedPrefixPlan sp;
  sp.member.assign(B, 0);
  if (idx == nullptr || H >= BM) return sp;
  // Groups of adjacent requests with a common context prefix of P keys (a multiple of BN),
  // each request's rows within one tile; then packs of consecutive members (<= BM rows).
  struct Pack {
    int b0, b1;  // requests [b0, b1)
    int64_t P;
  };
  std::vector<Pack> packs;
  auto fits = [&](int b) { return n[b] > 0 && n[b] * H <= BM; };
  for (int b = 0; b < B;) {
    if (!fits(b) || L[b] - n[b] < kSharedPrefixMinKeys) {
      ++b;
      continue;
    }
    int64_t P = L[b] - n[b];
    int e = b + 1;
    for (; e < B && fits(e); ++e) {
      const int64_t cp =
          CommonPrefix(idx + hkv[b], idx + hkv[e], std::min<int64_t>(P, L[e] - n[e]));
      if (cp / BN * BN < kSharedPrefixMinKeys) break;
      P = cp;
    }
    P = P / BN * BN;
    if (e - b < 2) {
      ++b;
      continue;
    }
    for (int m = b; m < e;) {
      int rows = 0, m1 = m;
      while (m1 < e && rows + n[m1] * H <= BM) rows += n[m1++] * H;
      if (m1 - m >= 2) packs.push_back({m, m1, P});
      m = m1;
    }
    b = e;
  }
  if (packs.empty()) return sp;
  // One split length for every pack's prefix and every member's own keys: the prefix reads
  // spread over about one wave of CTAs.
  int64_t work = 0;
  for (const Pack& k : packs) work += k.P;
  const int64_t len = std::max<int64_t>(min_split, CeilDiv(CeilDiv(work, slots), BN) * BN);
  for (const Pack& k : packs) {
    const int p = static_cast<int>(CeilDiv(k.P, len));
    int max_own = 0;
    for (int b = k.b0; b < k.b1; ++b) {
      max_own = std::max<int>(max_own, static_cast<int>(CeilDiv(L[b] - k.P, len)));
    }
    if (p + max_own > kMaxCombineSplits) continue;  // planned as usual
    const int64_t base = sp.partial_rows;
    const int nodes = hq[k.b1] - hq[k.b0];
    VerifyWorkItem w{};
    for (int i = 0; i < p; ++i) {  // the prefix: every row of the pack, nothing masked
      w.q_row0 = hq[k.b0];
      w.num_nodes = nodes;
      w.kv_off = hkv[k.b0];
      w.kv_begin = static_cast<int32_t>(i * len);
      w.kv_end = static_cast<int32_t>(std::min<int64_t>(k.P, (i + 1) * len));
      w.kv_len = w.kv_end + w.num_nodes;
      w.fold_begin = 0;
      w.partial_row = static_cast<int32_t>(base + static_cast<int64_t>(i) * BM);
      sp.work.push_back(w);
    }
    for (int b = k.b0; b < k.b1; ++b) {  // each request's own keys, then its combine
      const int64_t o = static_cast<int64_t>(hq[b] - hq[k.b0]) * H;
      const int own = static_cast<int>(CeilDiv(L[b] - k.P, len));
      for (int j = 0; j < own; ++j) {
        w.q_row0 = hq[b];
        w.num_nodes = n[b];
        w.kv_off = hkv[b];
        w.kv_len = L[b];
        w.kv_begin = static_cast<int32_t>(k.P + j * len);
        w.kv_end = static_cast<int32_t>(std::min<int64_t>(L[b], k.P + (j + 1) * len));
        w.fold_begin = 0;
        w.partial_row = static_cast<int32_t>(base + static_cast<int64_t>(p + j) * BM + o);
        sp.work.push_back(w);
      }
      VerifyCombineItem c{};
      c.out_row0 = hq[b] * H;
      c.num_rows = n[b] * H;
      c.num_splits = p + own;
      c.partial_row0 = static_cast<int32_t>(base + o);
      sp.combine.push_back(c);
      sp.member[b] = 1;
      sp.max_splits = std::max(sp.max_splits, p + own);
    }
    sp.partial_rows += static_cast<int64_t>(p + max_own) * BM;
    sp.reads_saved += (k.b1 - k.b0 - 1) * k.P;
    ++sp.packs;
  }
  return sp;
}

}  // namespace
}  // namespace detail

VerifyAttentionWorkspace VerifyAttentionWorkspace::DefaultCapacity(int64_t max_staged_keys) {
  VerifyAttentionWorkspace ws;
  ws.max_work_items = 65536;
  ws.max_combine_items = 16384;
  ws.max_partial_rows = 32768;
  ws.max_index_tasks = 16384;
  ws.max_index_entries = int64_t{1} << 20;
  ws.max_staged_keys = max_staged_keys;
  return ws;
}

VerifyAttentionWorkspace VerifyAttentionWorkspace::PositionalCapacity(int64_t max_rows,
                                                                      int64_t local_heads,
                                                                      int max_splits,
                                                                      int64_t max_partial_rows) {
  const int64_t head_tiles = (local_heads + 15) / 16;
  VerifyAttentionWorkspace ws;
  ws.max_work_items =
      static_cast<int>(std::max<int64_t>(65536, max_rows * head_tiles * max_splits));
  ws.max_combine_items = static_cast<int>(std::max<int64_t>(16384, max_rows * head_tiles));
  ws.max_partial_rows = max_partial_rows;
  ws.max_index_tasks = static_cast<int>(std::max<int64_t>(16384, 3 * max_rows));
  ws.max_index_entries = int64_t{1} << 24;
  return ws;
}

size_t VerifyAttentionWorkspace::CapacityBytes() const {
  return BytesFor(max_work_items, max_combine_items, max_partial_rows, max_index_tasks,
                  max_index_entries, max_staged_keys);
}

size_t VerifyAttentionWorkspace::BytesFor(int max_work_items, int max_combine_items,
                                          int64_t max_partial_rows, int max_index_tasks,
                                          int64_t max_index_entries, int64_t max_staged_keys) {
  return detail::LayoutWorkspace(max_work_items, max_combine_items, max_partial_rows,
                                 max_index_tasks, max_index_entries, max_staged_keys)
      .total;
}

absl::Status SupportsVerifyAttentionCuda(const VerifyAttentionParams& p,
                                         const VerifyAttentionDeviceInfo& device) {
  if (p.batch < 0) return absl::InvalidArgumentError("verify attention: batch < 0");
  if (p.total_rows < 0) return absl::InvalidArgumentError("verify attention: total_rows < 0");
  if (p.num_heads < 1) return absl::InvalidArgumentError("verify attention: num_heads < 1");
  if (p.dtype != DType::kBFloat16) {
    return absl::UnimplementedError(absl::StrCat("verify attention (CUDA): dtype ",
                                                 std::string(DTypeName(p.dtype)),
                                                 " unsupported (bfloat16 only)"));
  }
  if (p.qk_dim != detail::kQkDim) {
    return absl::UnimplementedError(
        absl::StrCat("verify attention (CUDA): qk_dim ", p.qk_dim, " unsupported (576 only)"));
  }
  if (p.v_dim != detail::kVDim) {
    return absl::UnimplementedError(
        absl::StrCat("verify attention (CUDA): v_dim ", p.v_dim, " unsupported (512 only)"));
  }
  if (p.mask_words < 1 || p.mask_words > kMaxTailRows / 64) {
    return absl::UnimplementedError(absl::StrCat("verify attention (CUDA): mask_words ",
                                                 p.mask_words, " unsupported (1..",
                                                 kMaxTailRows / 64, ")"));
  }
  if (device.cc_major < 8) {
    return absl::UnimplementedError(
        absl::StrCat("verify attention (CUDA): needs sm_80 or newer, device is sm_",
                     device.cc_major, device.cc_minor));
  }

  // Every supported device runs the 16-row configuration (of either cache format).
  return detail::ResolveVariant(VerifyKernelConfig::kM16, device, p.kv_fp8).status();
}

namespace detail {
namespace {

// The batch's rows and keys per request from the host index copies, validated.
struct BatchShape {
  std::vector<int> n, L;  // rows, visible keys (context + tree) per request
  int max_rows = 0;       // most rows x heads of one request
  int64_t total_keys = 0;
};

absl::StatusOr<BatchShape> ReadBatchShape(const VerifyAttentionParams& params, const int32_t* hq,
                                          const int32_t* hkv) {
  const int B = params.batch;
  const int H = params.num_heads;
  BatchShape shape;
  std::vector<int>& n = shape.n;
  std::vector<int>& L = shape.L;
  n.resize(B);
  L.resize(B);
  int max_rows = 0;
  if (B > 0 && (hq[0] != 0 || hkv[0] != 0)) {
    return absl::InvalidArgumentError("verify plan: q_indptr[0] and kv_indptr[0] must be 0");
  }
  for (int b = 0; b < B; ++b) {
    n[b] = hq[b + 1] - hq[b];
    L[b] = hkv[b + 1] - hkv[b];
    if (n[b] < 0) return absl::InvalidArgumentError(absl::StrCat("q_indptr decreases at ", b));
    if (L[b] < n[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_indptr: request ", b, " has ", L[b], " slots < ", n[b], " rows"));
    }
    if (n[b] > 64 * params.mask_words) {
      return absl::InvalidArgumentError(
          absl::StrCat("q_indptr: request ", b, " has ", n[b], " rows > 64 * mask_words"));
    }
    max_rows = std::max<int64_t>(max_rows, static_cast<int64_t>(n[b]) * H);
  }
  if (B > 0 && hq[B] != params.total_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_indptr[batch] = ", hq[B], " != total_rows ", params.total_rows));
  }

  int64_t total_keys = 0;
  for (int b = 0; b < B; ++b) total_keys += L[b];
  shape.max_rows = max_rows;
  shape.total_keys = total_keys;
  return shape;
}

// Candidate split lengths for the makespan search (the search below).
std::vector<int64_t> SplitCandidates(const std::vector<int>& tiles, const std::vector<int>& L,
                                     int slots, int BN, int64_t min_split) {
  const int B = static_cast<int>(L.size());
  // Candidate split lengths: the keys one slot would stream if the work filled 1, 2, 3, ...
  // waves exactly (the makespan below adds the per-split overhead), plus no split at all.
  double total_tile_keys = 0.0;
  for (int b = 0; b < B; ++b) total_tile_keys += static_cast<double>(tiles[b]) * L[b];
  std::vector<int64_t> candidates = {std::numeric_limits<int32_t>::max()};
  for (double waves : {0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0}) {
    const double target = total_tile_keys / (waves * slots);
    candidates.push_back(
        std::max<int64_t>(min_split, detail::CeilDiv(static_cast<int64_t>(target), BN) * BN));
  }
  // When there are fewer row tiles than CTA slots, how many ways the longest request is
  // split decides how many SMs work: also try every split count of it up to two waves
  // (the wave targets above can miss the one that fills the SMs, e.g. 16 row tiles x 8
  // splits = 128 CTAs where they gave 7 x 16 = 112).
  int64_t all_tiles = 0;
  int max_len = 0;
  for (int b = 0; b < B; ++b) {
    all_tiles += tiles[b];
    max_len = std::max(max_len, L[b]);
  }
  if (all_tiles < slots) {
    const int64_t max_s = std::min<int64_t>(2 * slots / std::max<int64_t>(1, all_tiles) + 1,
                                            detail::CeilDiv(max_len, BN));
    for (int64_t s = 2; s <= max_s; ++s) {
      candidates.push_back(
          std::max<int64_t>(min_split, detail::CeilDiv(detail::CeilDiv(max_len, s), BN) * BN));
    }
  }
  return candidates;
}

// The split count of every request that gives the shortest makespan on `slots` CTA slots
// within the workspace room left (items, partial rows, combine items); empty when none fits.
std::vector<int> ChooseSplits(const std::vector<int64_t>& candidates, const std::vector<int>& tiles,
                              const std::vector<int>& L, int slots, int BM, int BN, double ov,
                              const VerifyPlanOptions& options, int64_t room_items,
                              int64_t room_partial, int64_t room_combine) {
  const int B = static_cast<int>(L.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> best_splits;
  std::vector<int> splits(B);
  std::vector<double> costs;
  for (int64_t chunk : candidates) {
    int64_t items = 0, partial = 0, combine = 0;
    costs.clear();
    for (int b = 0; b < B; ++b) {
      if (tiles[b] == 0) {
        splits[b] = 0;
        continue;
      }
      int64_t s = std::max<int64_t>(1, detail::CeilDiv(L[b], chunk));
      s = std::min<int64_t>(s, detail::CeilDiv(L[b], BN));
      if (options.max_splits > 0) s = std::min<int64_t>(s, options.max_splits);
      s = std::min<int64_t>(s, detail::kMaxCombineSplits);
      const int64_t len = detail::CeilDiv(detail::CeilDiv(L[b], s), BN) * BN;
      s = detail::CeilDiv(L[b], len);
      splits[b] = static_cast<int>(s);
      items += s * tiles[b];
      if (s > 1) {
        partial += s * tiles[b] * BM;
        combine += tiles[b];
      }
      for (int64_t i = 0; i < s; ++i) {
        const double c = std::min<int64_t>(len, L[b] - i * len) + ov;
        for (int t = 0; t < tiles[b]; ++t) costs.push_back(c);
      }
    }
    if (items > room_items || partial > room_partial || combine > room_combine) continue;
    std::stable_sort(costs.begin(), costs.end(), std::greater<double>());
    const double m = detail::Makespan(costs, slots) * (1.0 + 1e-6 * static_cast<double>(items));
    if (m < best) {
      best = m;
      best_splits = splits;
    }
  }
  return best_splits;
}

// The plan's work list and combine items: per request, split, row tile, then the shared-prefix
// packs' items; longest first.
void BuildWorkList(const std::vector<int>& best_splits, const std::vector<int>& tiles,
                   const std::vector<int>& n, const std::vector<int>& L, const int32_t* hq,
                   const int32_t* hkv, int H, int BM, int BN, const SharedPrefixPlan* shared,
                   VerifyAttentionPlan& plan) {
  const int B = static_cast<int>(L.size());
  const bool use_shared = shared != nullptr;
  // Work list: per request, split, row tile; then longest first (stable: the row tiles of
  // one key range stay adjacent, so they run together and share the KV tile in L2).
  int64_t partial_cursor = 0;
  struct Keyed {
    int32_t len;
    VerifyWorkItem item;
  };
  std::vector<Keyed> keyed;
  for (int b = 0; b < B; ++b) {
    const int s = best_splits[b];
    if (s == 0) continue;
    const int64_t len = detail::CeilDiv(detail::CeilDiv(L[b], s), BN) * BN;
    plan.max_splits = std::max(plan.max_splits, s);
    for (int t = 0; t < tiles[b]; ++t) {
      int32_t prow = -1;
      if (s > 1) {
        prow = static_cast<int32_t>(partial_cursor);
        VerifyCombineItem ci{};
        ci.out_row0 = hq[b] * H + t * BM;
        ci.num_rows =
            static_cast<int32_t>(std::min<int64_t>(BM, static_cast<int64_t>(n[b]) * H - t * BM));
        ci.num_splits = s;
        ci.partial_row0 = prow;
        plan.combine.push_back(ci);
        partial_cursor += static_cast<int64_t>(s) * BM;
      }
      for (int i = 0; i < s; ++i) {
        VerifyWorkItem w{};
        w.q_row0 = hq[b];
        w.num_nodes = n[b];
        w.kv_off = hkv[b];
        w.kv_len = L[b];
        w.fold_begin = t * BM;
        w.kv_begin = static_cast<int32_t>(i * len);
        w.kv_end = static_cast<int32_t>(std::min<int64_t>(L[b], (i + 1) * len));
        w.partial_row = s > 1 ? prow + i * BM : -1;
        keyed.push_back({w.kv_end - w.kv_begin, w});
      }
    }
  }
  // The shared-prefix items, their partial rows after the others'.
  if (use_shared) {
    for (VerifyWorkItem w : shared->work) {
      w.partial_row += static_cast<int32_t>(partial_cursor);
      keyed.push_back({w.kv_end - w.kv_begin, w});
    }
    for (VerifyCombineItem c : shared->combine) {
      c.partial_row0 += static_cast<int32_t>(partial_cursor);
      plan.combine.push_back(c);
    }
    partial_cursor += shared->partial_rows;
    plan.max_splits = std::max(plan.max_splits, shared->max_splits);
    plan.shared_packs = shared->packs;
    plan.shared_reads_saved = shared->reads_saved;
  }
  // Row tiles of the same key range are adjacent; sort by key count only.
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const Keyed& a, const Keyed& b) { return a.len > b.len; });
  plan.work.reserve(keyed.size());
  for (const Keyed& k : keyed) plan.work.push_back(k.item);
  plan.partial_rows = partial_cursor;
}

}  // namespace
}  // namespace detail

namespace {

// PlanVerifyAttention before its variant and device are stamped on the plan.
absl::StatusOr<VerifyAttentionPlan> PlanWorkLists(const VerifyAttentionParams& params,
                                                  const int32_t* hq, const int32_t* hkv,
                                                  const VerifyAttentionDeviceInfo& device,
                                                  const VerifyAttentionWorkspace& ws,
                                                  const VerifyPlanOptions& options) {
  VERIFYD_RETURN_IF_ERROR(SupportsVerifyAttentionCuda(params, device));
  const int B = params.batch;
  const int H = params.num_heads;
  if (B > 0 && (hq == nullptr || hkv == nullptr)) {
    return absl::InvalidArgumentError("verify plan: q_indptr / kv_indptr host copies are null");
  }
  VERIFYD_ASSIGN_OR_RETURN(const detail::BatchShape shape, detail::ReadBatchShape(params, hq, hkv));
  const std::vector<int>& n = shape.n;
  const std::vector<int>& L = shape.L;
  const int max_rows = shape.max_rows;
  const int64_t total_keys = shape.total_keys;
  if (options.positional) {
    // The configuration depends on the device only (never on the batch).
    VERIFYD_ASSIGN_OR_RETURN(
        const detail::VariantInfo variant,
        detail::ResolveVariant(options.config == VerifyKernelConfig::kAuto
                                   ? PositionalConfigFor(device.cc_major, params.kv_fp8)
                                   : options.config,
                               device, params.kv_fp8));
    if (variant.staged) {
      return absl::UnimplementedError(
          "verify plan: positional plans do not stage keys (kS64Staged)");
    }
    return detail::PlanPositional(params, hq, hkv, variant, device, ws, options);
  }
  VERIFYD_ASSIGN_OR_RETURN(
      const detail::VariantInfo variant,
      options.config == VerifyKernelConfig::kAuto
          ? detail::AutoVariant(device, max_rows, total_keys, params.kv_fp8, ws.max_staged_keys)
          : detail::ResolveVariant(options.config, device, params.kv_fp8));
  if (variant.staged && total_keys > ws.max_staged_keys) {
    return absl::ResourceExhaustedError(absl::StrCat("verify plan: kS64Staged stages ", total_keys,
                                                     " keys; the workspace's staging area holds ",
                                                     ws.max_staged_keys));
  }
  const int BM = variant.rows;
  const int BN = variant.keys;

  VerifyAttentionPlan plan = PlanHeader(params, variant);
  // Staged plans read every key from its own staged row (the shared-prefix packing would
  // only save reads of the staged copies, after staging each copy).
  if (variant.staged) plan.staged_keys = total_keys;
  const int32_t* host_kv_indices = variant.staged ? nullptr : options.host_kv_indices;

  // CTAs resident at once: one per SM for most variants (> 96 KB of shared memory,
  // registers capped for one block), two for the sm_90 FP8 one (variants.h).
  const int64_t fit_per_sm =
      device.max_smem_per_sm / (static_cast<int64_t>(variant.smem_bytes) + 1024);
  const int slots = std::max<int>(1, device.num_sms * static_cast<int>(std::clamp<int64_t>(
                                                          fit_per_sm, 1, variant.ctas_per_sm)));
  const double ov = options.split_overhead_keys;

  // Requests that share a prefix are planned apart (their items join the list below); the
  // workspace left is what the split search may use.
  const detail::SharedPrefixPlan shared =
      detail::PlanSharedPrefixes(n, L, hq, hkv, host_kv_indices, H, BM, BN, slots,
                                 static_cast<int64_t>(std::max(1, options.min_split_tiles)) * BN);
  const bool use_shared = shared.packs > 0 &&
                          static_cast<int64_t>(shared.work.size()) <= ws.max_work_items &&
                          shared.partial_rows <= ws.max_partial_rows &&
                          static_cast<int64_t>(shared.combine.size()) <= ws.max_combine_items;
  const int64_t room_items =
      ws.max_work_items - (use_shared ? static_cast<int64_t>(shared.work.size()) : 0);
  const int64_t room_partial = ws.max_partial_rows - (use_shared ? shared.partial_rows : 0);
  const int64_t room_combine =
      ws.max_combine_items - (use_shared ? static_cast<int64_t>(shared.combine.size()) : 0);

  std::vector<int> tiles(B);
  double total_cost = 0.0;
  for (int b = 0; b < B; ++b) {
    tiles[b] = use_shared && shared.member[b]
                   ? 0
                   : static_cast<int>(detail::CeilDiv(static_cast<int64_t>(n[b]) * H, BM));
    total_cost += tiles[b] * (L[b] + ov);
  }
  if (total_cost == 0.0 && !use_shared) return plan;

  const int64_t min_split = static_cast<int64_t>(std::max(1, options.min_split_tiles)) * BN;
  const std::vector<int64_t> candidates = detail::SplitCandidates(tiles, L, slots, BN, min_split);
  std::vector<int> best_splits = detail::ChooseSplits(
      candidates, tiles, L, slots, BM, BN, ov, options, room_items, room_partial, room_combine);
  if (best_splits.empty() && total_cost == 0.0) best_splits.assign(B, 0);  // all shared
  if (best_splits.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("verify plan: batch needs more than the workspace holds (", ws.max_work_items,
                     " work items, ", ws.max_partial_rows, " partial rows)"));
  }

  detail::BuildWorkList(best_splits, tiles, n, L, hq, hkv, H, BM, BN,
                        use_shared ? &shared : nullptr, plan);
  return plan;
}

}  // namespace

absl::StatusOr<VerifyAttentionPlan> PlanVerifyAttention(const VerifyAttentionParams& params,
                                                        const int32_t* hq, const int32_t* hkv,
                                                        const VerifyAttentionDeviceInfo& device,
                                                        const VerifyAttentionWorkspace& ws,
                                                        const VerifyPlanOptions& options) {
  VERIFYD_ASSIGN_OR_RETURN(VerifyAttentionPlan plan,
                           PlanWorkLists(params, hq, hkv, device, ws, options));
  for (const detail::VariantInfo& v : detail::kVariantTable) {
    if (v.config == plan.config && v.kv_fp8 == plan.kv_fp8 && v.runs_on(device.cc_major)) {
      plan.variant = v.index;
      break;
    }
  }
  if (plan.variant < 0) {
    return absl::InternalError("verify plan: no variant of the chosen configuration here");
  }
  plan.device_cc_major = device.cc_major;
  plan.device_sms = device.num_sms;
  return plan;
}

}  // namespace verifyd::kernels::cuda
