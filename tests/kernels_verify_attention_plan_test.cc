// The CUDA verify attention's planner (kernels/cuda/verify_attention/plan.h), host only: no
// CUDA needed to build or run (label cpu). Device descriptions are filled by hand: an H200
// (sm_90, 132 SMs, 227 KB of shared memory per block) and an sm_120 part (99 KB).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/cuda/verify_attention/plan.h"
#include "kernels/cuda/verify_attention/variants.h"

namespace verifyd::kernels::cuda {
namespace {

constexpr VerifyAttentionDeviceInfo kH200{132, 9, 0, 232448, 233472};
constexpr VerifyAttentionDeviceInfo kSm120{84, 12, 0, 101376, 102400};

// A workspace of the default capacity, without device memory (the planner reads capacities).
VerifyAttentionWorkspace CapacityOnly() { return VerifyAttentionWorkspace::DefaultCapacity(0); }

// The shape of a batch with query rows `qi` (q_indptr), `heads` heads and the default latent
// widths (576 / 512).
VerifyAttentionParams ParamsOf(const std::vector<int32_t>& qi, int heads, bool kv_fp8 = false) {
  VerifyAttentionParams p;
  p.batch = static_cast<int>(qi.size()) - 1;
  p.total_rows = qi.back();
  p.num_heads = heads;
  p.kv_fp8 = kv_fp8;
  return p;
}

// The planner splits a long single request over the SMs, leaves a batch that already fills
// the device unsplit, and keeps every key covered exactly once.
TEST(VerifyAttentionPlan, CoversEveryKeyOnce) {
  const VerifyAttentionWorkspace ws = CapacityOnly();
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<int32_t> qi = {0}, ki = {0};
    std::vector<int> n, L;
    std::mt19937 rng(trial);
    const int B = trial == 0 ? 1 : (trial == 1 ? 7 : 200);
    for (int b = 0; b < B; ++b) {
      n.push_back(1 + rng() % 16);
      L.push_back(n.back() + (trial == 0 ? 185000 : static_cast<int>(rng() % 50000)));
      qi.push_back(qi.back() + n.back());
      ki.push_back(ki.back() + L.back());
    }
    const VerifyAttentionParams p = ParamsOf(qi, 8);
    auto plan = PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // Coverage: for each (request, folded row tile), the key ranges tile [0, L_b).
    std::vector<std::vector<std::pair<int, int>>> ranges(B * 64);
    for (const VerifyWorkItem& w : plan->work) {
      const int b =
          static_cast<int>(std::upper_bound(qi.begin(), qi.end(), w.q_row0) - qi.begin()) - 1;
      ASSERT_EQ(w.kv_len, L[b]);
      ranges[b * 64 + w.fold_begin / plan->rows_per_cta].push_back({w.kv_begin, w.kv_end});
    }
    for (int b = 0; b < B; ++b) {
      const int tiles = (n[b] * 8 + plan->rows_per_cta - 1) / plan->rows_per_cta;
      for (int t = 0; t < tiles; ++t) {
        auto r = ranges[b * 64 + t];
        std::sort(r.begin(), r.end());
        ASSERT_FALSE(r.empty());
        int at = 0;
        for (auto [lo, hi] : r) {
          EXPECT_EQ(lo, at);
          EXPECT_GT(hi, lo);
          at = hi;
        }
        EXPECT_EQ(at, L[b]);
      }
    }
    if (trial == 0) EXPECT_GE(plan->work.size(), 100u) << "one long request must be split";
  }
}

// The seesaw configuration: 64-row, 64-key tiles; splits start on 64-key boundaries and cover
// every key once; refused on a device that is not sm_90, naming the configuration.
TEST(VerifyAttentionPlan, SeesawPlanShape) {
  const VerifyAttentionWorkspace ws = CapacityOnly();
  std::vector<int32_t> qi = {0, 16, 32}, ki = {0, 65536 + 16, 65536 + 16 + 1000 + 16};
  const VerifyAttentionParams p = ParamsOf(qi, 16);
  VerifyPlanOptions opt;
  opt.config = VerifyKernelConfig::kS64;
  auto plan = PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws, opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config, VerifyKernelConfig::kS64);
  EXPECT_EQ(plan->rows_per_cta, 64);
  EXPECT_EQ(plan->keys_per_tile, 64);
  EXPECT_GT(plan->max_splits, 1);
  std::vector<int64_t> covered(2, 0);
  for (const VerifyWorkItem& w : plan->work) {
    EXPECT_EQ(w.kv_begin % 64, 0);
    EXPECT_EQ(w.fold_begin % 64, 0);
    const int b = w.q_row0 == 0 ? 0 : 1;
    covered[b] += w.kv_end - w.kv_begin;
  }
  // Each request has 16 * 16 = 256 folded rows = 4 row tiles, each covering every key once.
  EXPECT_EQ(covered[0], 4 * int64_t{ki[1] - ki[0]});
  EXPECT_EQ(covered[1], 4 * int64_t{ki[2] - ki[1]});
  auto refused = PlanVerifyAttention(p, qi.data(), ki.data(), kSm120, ws, opt);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find("seesaw"), std::string::npos) << refused.status();
}

// kAuto: on sm_90 the seesaw kernel except for tiny decode batches (<= 16 folded rows per
// request and <= 16k keys), the 16-row mma.sync kernel there and on every other architecture
// (2 stages within the 99 KB of sm_120).
TEST(VerifyAttentionPlan, AutoRule) {
  const VerifyAttentionWorkspace ws = CapacityOnly();
  struct Row {
    int heads, nodes, ctx;
    VerifyKernelConfig sm90;
  };
  const Row rows[] = {
      {8, 1, 1000, VerifyKernelConfig::kM16},     // 8 rows, 1k keys: tiny decode
      {16, 1, 16000, VerifyKernelConfig::kM16},   // 16 rows, <= 16k keys: tiny decode
      {16, 1, 20000, VerifyKernelConfig::kS64},   // 16 rows but > 16k keys
      {8, 4, 1000, VerifyKernelConfig::kS64},     // 32 rows per request
      {16, 16, 65536, VerifyKernelConfig::kS64},  // the verify shapes
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(testing::Message() << r.heads << " heads, " << r.nodes << " nodes, ctx " << r.ctx);
    const std::vector<int32_t> qi = {0, r.nodes}, ki = {0, r.ctx + r.nodes};
    const VerifyAttentionParams p = ParamsOf(qi, r.heads);
    auto plan90 = PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws);
    ASSERT_TRUE(plan90.ok()) << plan90.status();
    EXPECT_EQ(plan90->config, r.sm90);
    auto plan120 = PlanVerifyAttention(p, qi.data(), ki.data(), kSm120, ws);
    ASSERT_TRUE(plan120.ok()) << plan120.status();
    EXPECT_EQ(plan120->config, VerifyKernelConfig::kM16);
    EXPECT_EQ(plan120->rows_per_cta, 16);
  }
}

// The variant table: each (configuration, architecture) resolves to one variant whose shared
// memory fits the device; the retired configuration values resolve to nothing.
TEST(VerifyAttentionPlan, VariantTable) {
  auto m16_90 = detail::ResolveVariant(VerifyKernelConfig::kM16, kH200);
  ASSERT_TRUE(m16_90.ok()) << m16_90.status();
  EXPECT_EQ(m16_90->stages, 5);
  EXPECT_LE(m16_90->smem_bytes, 232448u);
  auto m16_120 = detail::ResolveVariant(VerifyKernelConfig::kM16, kSm120);
  ASSERT_TRUE(m16_120.ok()) << m16_120.status();
  EXPECT_EQ(m16_120->stages, 2);
  EXPECT_LE(m16_120->smem_bytes, 101376u);
  auto s64 = detail::ResolveVariant(VerifyKernelConfig::kS64, kH200);
  ASSERT_TRUE(s64.ok()) << s64.status();
  EXPECT_EQ(s64->rows, 64);
  EXPECT_EQ(s64->keys, 64);
  for (int retired : {2, 3, 4}) {
    EXPECT_FALSE(detail::ResolveVariant(static_cast<VerifyKernelConfig>(retired), kH200).ok());
  }
  // A device whose opt-in shared memory is below what the 5-stage variant needs.
  VerifyAttentionDeviceInfo small90 = kH200;
  small90.max_smem_per_block = 101376;
  auto too_big = detail::ResolveVariant(VerifyKernelConfig::kM16, small90);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(too_big.status().message().find("shared memory"), std::string::npos);
}

// The configuration table: every name parses back to its value, the names are distinct, an
// unknown name is INVALID_ARGUMENT naming the field and listing the choices; every forced
// configuration resolves to a variant on some device (sm_90 or sm_120, either cache format).
TEST(VerifyAttentionPlan, ConfigurationTable) {
  std::set<std::string> names;
  for (const VerifyKernelConfigEntry& e : kVerifyKernelConfigs) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name;
    auto parsed = ParseVerifyKernelConfig(e.name, "--flag");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, e.config);
    EXPECT_STREQ(VerifyKernelConfigName(e.config), e.name);
    if (e.config == VerifyKernelConfig::kAuto) continue;
    bool resolves = false;
    for (const VerifyAttentionDeviceInfo& dev : {kH200, kSm120}) {
      for (bool fp8 : {false, true}) resolves |= detail::ResolveVariant(e.config, dev, fp8).ok();
    }
    EXPECT_TRUE(resolves) << e.name << " runs nowhere";
  }
  EXPECT_EQ(VerifyKernelConfigChoices(), "auto, m16, s64, km16 or s64staged");
  auto bad = ParseVerifyKernelConfig("w64", "--verify_config");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "--verify_config: 'w64' is not auto, m16, s64, km16 or s64staged");
  EXPECT_STREQ(VerifyKernelConfigName(static_cast<VerifyKernelConfig>(2)), "unknown");
}

// A plan carries the variant the planner resolved and the device it was made for (the launch
// reads them instead of querying the device a layer): the same entry ResolveVariant finds.
TEST(VerifyAttentionPlan, CarriesItsVariantAndDevice) {
  std::vector<int32_t> qi = {0, 3, 4}, ki = {0, 700, 4100};
  for (const VerifyAttentionDeviceInfo& dev : {kH200, kSm120}) {
    for (bool fp8 : {false, true}) {
      for (bool positional : {false, true}) {
        VerifyAttentionParams p = ParamsOf(qi, 8, fp8);
        p.mask_words = 1;
        std::vector<uint64_t> mask(4, 0);
        for (int r = 0; r < 4; ++r) mask[r] = (uint64_t{1} << (r < 3 ? r + 1 : 1)) - 1;
        VerifyPlanOptions opt;
        opt.positional = positional;
        opt.host_tree_mask = mask.data();
        auto plan = PlanVerifyAttention(p, qi.data(), ki.data(), dev, CapacityOnly(), opt);
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_GE(plan->variant, 0);
        ASSERT_LT(plan->variant, static_cast<int>(detail::kVariantTable.size()));
        const detail::VariantInfo& v = detail::kVariantTable[plan->variant];
        auto expect = detail::ResolveVariant(plan->config, dev, fp8);
        ASSERT_TRUE(expect.ok()) << expect.status();
        EXPECT_EQ(v.index, expect->index);
        EXPECT_EQ(v.rows, plan->rows_per_cta);
        EXPECT_EQ(plan->device_cc_major, dev.cc_major);
        EXPECT_EQ(plan->device_sms, dev.num_sms);
      }
    }
  }
}

// FP8 latent cache: the 16-row configuration has an FP8 variant per architecture (two CTAs
// per SM on sm_90, one within the 99 KB of sm_120); the keys-on-M configuration is FP8-only and
// sm_90-only; the seesaw has none. kAuto and positional plans pick keys-on-M on sm_90 and the
// 16-row one elsewhere, and the plan remembers the format.
TEST(VerifyAttentionPlan, Fp8CacheVariants) {
  auto fp8_90 = detail::ResolveVariant(VerifyKernelConfig::kM16, kH200, /*kv_fp8=*/true);
  ASSERT_TRUE(fp8_90.ok()) << fp8_90.status();
  EXPECT_TRUE(fp8_90->kv_fp8);
  EXPECT_EQ(fp8_90->stages, 2);
  EXPECT_EQ(fp8_90->ctas_per_sm, 2);
  EXPECT_LE(2 * (fp8_90->smem_bytes + 1024), 233472u);
  auto fp8_120 = detail::ResolveVariant(VerifyKernelConfig::kM16, kSm120, true);
  ASSERT_TRUE(fp8_120.ok()) << fp8_120.status();
  EXPECT_TRUE(fp8_120->kv_fp8);
  EXPECT_EQ(fp8_120->stages, 2);
  EXPECT_LE(fp8_120->smem_bytes, 101376u);
  EXPECT_FALSE(detail::ResolveVariant(VerifyKernelConfig::kM16, kH200)->kv_fp8);
  // kS64 with an FP8 cache: the seesaw FP8 variant on sm_90 (64 rows, 64-key tiles), none
  // elsewhere (the error names the format).
  auto s64 = detail::ResolveVariant(VerifyKernelConfig::kS64, kH200, true);
  ASSERT_TRUE(s64.ok()) << s64.status();
  EXPECT_TRUE(s64->kv_fp8);
  EXPECT_EQ(s64->rows, 64);
  EXPECT_EQ(s64->keys, 64);
  EXPECT_LE(s64->smem_bytes, 227u * 1024);
  auto s64_120 = detail::ResolveVariant(VerifyKernelConfig::kS64, kSm120, true);
  EXPECT_EQ(s64_120.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s64_120.status().message().find("FP8"), std::string::npos) << s64_120.status();
  EXPECT_EQ(PositionalConfigFor(9, true), VerifyKernelConfig::kKm16);
  EXPECT_EQ(PositionalConfigFor(12, true), VerifyKernelConfig::kM16);
  auto km16 = detail::ResolveVariant(VerifyKernelConfig::kKm16, kH200, true);
  ASSERT_TRUE(km16.ok()) << km16.status();
  EXPECT_EQ(km16->rows, 16);
  EXPECT_EQ(km16->keys, 64);
  EXPECT_EQ(detail::ResolveVariant(VerifyKernelConfig::kKm16, kH200).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(detail::ResolveVariant(VerifyKernelConfig::kKm16, kSm120, true).status().code(),
            absl::StatusCode::kUnimplemented);

  const VerifyAttentionWorkspace ws = CapacityOnly();
  const std::vector<int32_t> qi = {0, 16}, ki = {0, 65536 + 16};
  const VerifyAttentionParams p = ParamsOf(qi, 16, /*kv_fp8=*/true);
  for (const VerifyAttentionDeviceInfo& device : {kH200, kSm120}) {
    auto plan = PlanVerifyAttention(p, qi.data(), ki.data(), device, ws);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // 16 nodes x 16 heads = 256 rows over 65k keys (IsManyRowsBatch): the seesaw FP8 variant on
    // sm_90.
    EXPECT_EQ(plan->config,
              device.cc_major == 9 ? VerifyKernelConfig::kS64 : VerifyKernelConfig::kM16);
    EXPECT_TRUE(plan->kv_fp8);
    // Four 64-row tiles (16 on sm_120) over 65k keys: split over every CTA slot (one per SM).
    EXPECT_GT(static_cast<int>(plan->work.size()), device.num_sms / 2) << device.cc_major;
    EXPECT_LE(static_cast<int>(plan->work.size()), device.num_sms);
  }
  VerifyPlanOptions forced;
  forced.config = VerifyKernelConfig::kS64;
  auto forced_s64 = PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws, forced);
  ASSERT_TRUE(forced_s64.ok()) << forced_s64.status();
  EXPECT_EQ(forced_s64->config, VerifyKernelConfig::kS64);
  EXPECT_TRUE(forced_s64->kv_fp8);
  EXPECT_EQ(PlanVerifyAttention(p, qi.data(), ki.data(), kSm120, ws, forced).status().code(),
            absl::StatusCode::kUnimplemented);

  // kAuto on sm_90 below IsManyRowsBatch: the keys-on-M kernel (8 heads x 16 nodes = 128 rows
  // over 16k keys; 16 heads x 1 decode node over 65k keys).
  const std::vector<int32_t> ki16s = {0, 16384 + 16}, qi1 = {0, 1}, ki1 = {0, 65537};
  VerifyAttentionParams fewer = p;
  fewer.num_heads = 8;
  auto short_plan = PlanVerifyAttention(fewer, qi.data(), ki16s.data(), kH200, ws);
  ASSERT_TRUE(short_plan.ok()) << short_plan.status();
  EXPECT_EQ(short_plan->config, VerifyKernelConfig::kKm16);
  VerifyAttentionParams decode = p;
  decode.total_rows = 1;
  auto decode_plan = PlanVerifyAttention(decode, qi1.data(), ki1.data(), kH200, ws);
  ASSERT_TRUE(decode_plan.ok()) << decode_plan.status();
  EXPECT_EQ(decode_plan->config, VerifyKernelConfig::kKm16);
  EXPECT_TRUE(detail::IsManyRowsBatch(128, 32768));
  EXPECT_TRUE(detail::IsManyRowsBatch(64, 65536));
  EXPECT_FALSE(detail::IsManyRowsBatch(63, 1 << 20));
  EXPECT_FALSE(detail::IsManyRowsBatch(16, 1 << 23));  // batched decode: km16
  EXPECT_FALSE(detail::IsManyRowsBatch(256, 16383));
  EXPECT_TRUE(detail::IsManyRowsBatch(1088, 4096));
}

// kS64Staged (FP8 cache): kAuto takes it on sm_90 for requests of >= 256 folded rows when the
// batch's keys fit the workspace's staging area, never without one, below the rule, for a
// bf16 cache or in positional plans; forced, it needs the room (RESOURCE_EXHAUSTED naming the
// counts), the FP8 format and sm_90. Its plan is the bf16 seesaw's (64 x 64 tiles) over every
// key of the batch, shared prefixes unpacked.
TEST(VerifyAttentionPlan, StagedFp8Plans) {
  VerifyAttentionWorkspace ws = CapacityOnly();
  ws.max_staged_keys = 262144;
  const int32_t keys = 65536 + 16;
  const std::vector<int32_t> qi = {0, 16, 32}, ki = {0, keys, 2 * keys};
  const VerifyAttentionParams p = ParamsOf(qi, 16, /*kv_fp8=*/true);  // 256 rows a request
  auto plan = PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config, VerifyKernelConfig::kS64Staged);
  EXPECT_TRUE(plan->kv_fp8);
  EXPECT_EQ(plan->staged_keys, 2 * keys);
  EXPECT_EQ(plan->rows_per_cta, 64);
  EXPECT_EQ(plan->keys_per_tile, 64);
  EXPECT_STREQ(VerifyKernelConfigName(plan->config), "s64staged");
  // Every (row tile, key) once, as in any default plan.
  std::vector<int> seen(2 * keys * 4, 0);
  for (const VerifyWorkItem& w : plan->work) {
    for (int k = w.kv_begin; k < w.kv_end; ++k) ++seen[(w.kv_off + k) * 4 + w.fold_begin / 64];
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<int64_t>(seen.size()));
  // Shared prefixes are not packed (every request reads its own staged rows).
  std::vector<int32_t> lists(2 * keys);
  for (int32_t i = 0; i < keys; ++i) lists[i] = lists[keys + i] = i;
  VerifyPlanOptions share;
  share.host_kv_indices = lists.data();
  auto shared = PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws, share);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->config, VerifyKernelConfig::kS64Staged);
  EXPECT_EQ(shared->shared_packs, 0);

  // Not taken: no room, fewer rows (128 a request), a bf16 cache, sm_120, positional.
  VerifyAttentionWorkspace small = ws;
  small.max_staged_keys = 2 * keys - 1;
  EXPECT_EQ(PlanVerifyAttention(p, qi.data(), ki.data(), kH200, small)->config,
            VerifyKernelConfig::kS64);
  VerifyAttentionParams fewer = p;
  fewer.num_heads = 8;
  EXPECT_EQ(PlanVerifyAttention(fewer, qi.data(), ki.data(), kH200, ws)->config,
            VerifyKernelConfig::kS64);
  VerifyAttentionParams bf16 = p;
  bf16.kv_fp8 = false;
  auto bf16_plan = PlanVerifyAttention(bf16, qi.data(), ki.data(), kH200, ws);
  EXPECT_EQ(bf16_plan->config, VerifyKernelConfig::kS64);
  EXPECT_EQ(bf16_plan->staged_keys, 0);
  EXPECT_EQ(PlanVerifyAttention(p, qi.data(), ki.data(), kSm120, ws)->config,
            VerifyKernelConfig::kM16);
  std::vector<uint64_t> mask(static_cast<size_t>(32) * p.mask_words, 0);  // chains
  for (int r = 0; r < 32; ++r) mask[r * p.mask_words] = (2ull << (r % 16)) - 1;
  VerifyPlanOptions positional;
  positional.positional = true;
  positional.host_tree_mask = mask.data();
  EXPECT_EQ(PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws, positional)->config,
            VerifyKernelConfig::kKm16);

  // Forced.
  VerifyPlanOptions forced;
  forced.config = VerifyKernelConfig::kS64Staged;
  auto f = PlanVerifyAttention(fewer, qi.data(), ki.data(), kH200, ws, forced);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->config, VerifyKernelConfig::kS64Staged);
  auto no_room = PlanVerifyAttention(p, qi.data(), ki.data(), kH200, small, forced);
  EXPECT_EQ(no_room.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(no_room.status().message().find("131104"), std::string::npos) << no_room.status();
  EXPECT_EQ(PlanVerifyAttention(bf16, qi.data(), ki.data(), kH200, ws, forced).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(PlanVerifyAttention(p, qi.data(), ki.data(), kSm120, ws, forced).status().code(),
            absl::StatusCode::kUnimplemented);
  positional.config = VerifyKernelConfig::kS64Staged;
  EXPECT_EQ(PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws, positional).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(detail::IsStagedFp8Batch(256, 4096));
  EXPECT_FALSE(detail::IsStagedFp8Batch(255, 1 << 20));
  EXPECT_FALSE(detail::IsStagedFp8Batch(1024, 1023));
}

TEST(VerifyAttentionPlan, WorkspaceLayout) {
  const detail::WorkspaceLayout l = detail::LayoutWorkspace(65536, 16384, 32768);
  EXPECT_EQ(l.work, 0u);
  EXPECT_GE(l.combine, 65536u * sizeof(VerifyWorkItem));
  EXPECT_GE(l.lse, l.combine + 16384u * sizeof(VerifyCombineItem));
  EXPECT_GE(l.part_o, l.lse + 32768u * 4);
  EXPECT_GE(l.total, l.part_o + 32768u * 512 * 4);
  for (size_t off : {l.combine, l.lse, l.part_o, l.total}) EXPECT_EQ(off % 256, 0u);
  EXPECT_EQ(VerifyAttentionWorkspace::BytesFor(65536, 16384, 32768), l.total);
  // The staging area: bf16 rows [keys][576], then their int32 identity slot ids.
  const detail::WorkspaceLayout st = detail::LayoutWorkspace(65536, 16384, 32768, 0, 0, 1000);
  EXPECT_GE(st.staged_rows, st.pos);
  EXPECT_GE(st.staged_ids, st.staged_rows + 1000u * 576 * 2);
  EXPECT_GE(st.total, st.staged_ids + 1000u * 4);
  EXPECT_EQ(st.staged_rows % 256, 0u);
  EXPECT_EQ(st.staged_ids % 256, 0u);
  EXPECT_EQ(VerifyAttentionWorkspace::BytesFor(65536, 16384, 32768, 0, 0, 1000), st.total);
}

// Malformed index arrays and workspaces that are too small are refused, naming the problem.
TEST(VerifyAttentionPlan, RefusesBadInputs) {
  VerifyAttentionWorkspace ws = CapacityOnly();
  const std::vector<int32_t> qi = {0, 4}, short_kv = {0, 3}, ki = {0, 100000};
  VerifyAttentionParams p = ParamsOf(qi, 8);
  EXPECT_EQ(PlanVerifyAttention(p, qi.data(), short_kv.data(), kH200, ws).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> many = {0, 129};
  p.total_rows = 129;
  EXPECT_EQ(PlanVerifyAttention(p, many.data(), ki.data(), kH200, ws).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.total_rows = 4;
  ws.max_work_items = 1;
  ws.max_partial_rows = 0;
  ws.max_combine_items = 0;
  auto fits = PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws);
  ASSERT_TRUE(fits.ok()) << fits.status();  // unsplit: one work item
  EXPECT_EQ(fits->work.size(), 1u);
  ws.max_work_items = 0;
  EXPECT_EQ(PlanVerifyAttention(p, qi.data(), ki.data(), kH200, ws).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(VerifyAttentionPlan, SupportsNamesTheField) {
  VerifyAttentionParams p = ParamsOf({0, 1}, 8);
  EXPECT_TRUE(SupportsVerifyAttentionCuda(p, kH200).ok());
  p.dtype = DType::kFloat32;
  EXPECT_NE(SupportsVerifyAttentionCuda(p, kH200).message().find("dtype"), std::string::npos);
  p.dtype = DType::kBFloat16;
  p.qk_dim = 192;
  EXPECT_NE(SupportsVerifyAttentionCuda(p, kH200).message().find("qk_dim"), std::string::npos);
  p.qk_dim = 576;
  p.v_dim = 128;
  EXPECT_NE(SupportsVerifyAttentionCuda(p, kH200).message().find("v_dim"), std::string::npos);
  p.v_dim = 512;
  p.mask_words = 3;
  EXPECT_NE(SupportsVerifyAttentionCuda(p, kH200).message().find("mask_words"), std::string::npos);
  p.mask_words = 2;
  EXPECT_TRUE(SupportsVerifyAttentionCuda(p, kSm120).ok());
  const VerifyAttentionDeviceInfo old{80, 7, 5, 65536, 65536};
  EXPECT_EQ(SupportsVerifyAttentionCuda(p, old).code(), absl::StatusCode::kUnimplemented);
}

// ---- Positional plans (the batch-invariant mode) -----------------------------------------

// A batch of random draft trees (parent uniform in [0, t)) with these context lengths over
// scattered slots; masks hold ancestors and self.
struct TreeBatch {
  std::vector<int32_t> qi = {0}, ki = {0}, idx;
  std::vector<uint64_t> mask;                 // [rows, 2]
  std::vector<std::vector<int32_t>> visible;  // per row: its visible slots in position order
};

TreeBatch MakeTrees(const std::vector<int>& nodes, const std::vector<int>& ctx, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TreeBatch t;
  for (size_t b = 0; b < nodes.size(); ++b) {
    const int r0 = t.qi.back();
    const int k0 = t.ki.back();
    for (int i = 0; i < ctx[b] + nodes[b]; ++i) t.idx.push_back(static_cast<int32_t>(rng() >> 40));
    for (int i = 0; i < nodes[b]; ++i) {
      uint64_t m[2] = {0, 0};
      if (i > 0) {
        const int parent = static_cast<int>(rng() % i);
        m[0] = t.mask[2 * (r0 + parent)];
        m[1] = t.mask[2 * (r0 + parent) + 1];
      }
      m[i / 64] |= 1ull << (i % 64);
      t.mask.push_back(m[0]);
      t.mask.push_back(m[1]);
      std::vector<int32_t> vis(t.idx.begin() + k0, t.idx.begin() + k0 + ctx[b]);
      for (int j = 0; j <= i; ++j) {
        if ((m[j / 64] >> (j % 64)) & 1) vis.push_back(t.idx[k0 + ctx[b] + j]);
      }
      t.visible.push_back(vis);
    }
    t.qi.push_back(r0 + nodes[b]);
    t.ki.push_back(k0 + ctx[b] + nodes[b]);
  }
  return t;
}

VerifyAttentionParams ParamsOf(const TreeBatch& t, int heads) { return ParamsOf(t.qi, heads); }

// What the kernels read and write, simulated on the host from the plan: per pass the index
// lists (as the GPU builds them), then per work item the rows it holds, the slots it streams
// and where each row's result goes; then the combine items. Returns, per (row, head), the
// slots of its splits in order and their lengths; fails the test when a work item would mask
// a key before its range's end, when a partial row is written twice or merged from the wrong
// row or split, or when an output row is not produced exactly once.
struct Walk {
  std::vector<std::vector<int32_t>> slots;  // [row * heads + head]
  std::vector<std::vector<int>> splits;     // lengths of its splits, in order
};

Walk Simulate(const VerifyAttentionPlan& plan, const TreeBatch& t, int heads) {
  const int bm = plan.rows_per_cta;
  const size_t out_rows = static_cast<size_t>(plan.total_rows) * heads;
  Walk walk;
  walk.slots.resize(out_rows);
  walk.splits.resize(out_rows);
  std::vector<int> produced(out_rows, 0);
  std::vector<VerifyPass> passes = plan.passes;
  if (passes.empty()) {
    passes.push_back({0, static_cast<int32_t>(plan.work.size()), 0,
                      static_cast<int32_t>(plan.combine.size()), 0,
                      static_cast<int32_t>(plan.index_tasks.size())});
  }
  for (const VerifyPass& ps : passes) {
    std::vector<int32_t> lists(static_cast<size_t>(plan.index_entries) + 1, -7);
    for (int i = ps.task_begin; i < ps.task_begin + ps.task_count; ++i) {
      const VerifyIndexTask& k = plan.index_tasks[i];
      std::vector<int> vis;
      for (int j = 0; j < k.num_nodes; ++j) {
        if ((t.mask[2 * k.mask_row + j / 64] >> (j % 64)) & 1) vis.push_back(j);
      }
      for (int key = k.begin; key < k.end; ++key) {
        EXPECT_LT(key - k.ctx, static_cast<int>(vis.size()));
        lists.at(k.dst + key - k.begin) =
            key < k.ctx ? t.idx[k.src + key] : t.idx[k.src + k.ctx + vis.at(key - k.ctx)];
      }
    }
    // partial row -> (output row, its first split number, splits it holds: > 1 when a split
    // group starting at key 0 folded its splits into split 0's rows)
    struct Partial {
      int64_t out = -1;
      int split = -1;
      int count = 0;
    };
    std::vector<Partial> partial(static_cast<size_t>(plan.partial_rows));
    for (int i = ps.work_begin; i < ps.work_begin + ps.work_count; ++i) {
      const VerifyWorkItem& w = plan.work[i];
      const int rows = std::min(bm, w.num_nodes * heads - w.fold_begin);
      EXPECT_GT(rows, 0);
      EXPECT_GE(w.kv_len - w.num_nodes, w.kv_end) << "keys before the range's end are masked";
      EXPECT_EQ(w.kv_begin % 64, 0);
      // A split group (split_keys > 0) is its splits, one after another, split j written to
      // partial rows partial_row + j * bm, or, when the group starts at key 0, every split
      // folded into partial rows partial_row (what the kernel does).
      std::vector<std::pair<int, int>> ranges;  // [begin, end) of each split of the item
      if (w.split_keys > 0) {
        EXPECT_EQ(w.split_keys % 128, 0);
        EXPECT_GE(w.partial_row, 0);
        for (int b = w.kv_begin; b < w.kv_end; b += w.split_keys) {
          ranges.push_back({b, std::min(w.kv_end, b + w.split_keys)});
        }
        EXPECT_GT(ranges.size(), 1u);
      } else {
        ranges.push_back({w.kv_begin, w.kv_end});
      }
      for (size_t j = 0; j < ranges.size(); ++j) {
        std::vector<int32_t> keys;
        for (int key = ranges[j].first; key < ranges[j].second; ++key) {
          keys.push_back(w.kv_off >= 0 ? t.idx[w.kv_off + key] : lists.at(-w.kv_off - 1 + key));
        }
        const bool folds = w.split_keys > 0 && w.kv_begin == 0;
        const int64_t prow = w.partial_row + static_cast<int64_t>(folds ? 0 : j) * bm;
        for (int r = 0; r < rows; ++r) {
          const int64_t out = static_cast<int64_t>(w.q_row0) * heads + w.fold_begin + r;
          auto& seq = walk.slots[out];
          seq.insert(seq.end(), keys.begin(), keys.end());
          walk.splits[out].push_back(ranges[j].second - ranges[j].first);
          if (w.partial_row < 0) {
            ++produced[out];
          } else if (folds && j > 0) {
            Partial& p = partial.at(prow + r);
            EXPECT_EQ(p.out, out) << "partial row " << prow + r << " folded into another row";
            EXPECT_EQ(p.split + p.count, static_cast<int>(walk.splits[out].size()) - 1);
            ++p.count;
          } else {
            Partial& p = partial.at(prow + r);
            EXPECT_EQ(p.out, -1) << "partial row " << prow + r << " written twice";
            p = {out, static_cast<int>(walk.splits[out].size()) - 1, 1};
          }
        }
      }
    }
    for (int i = ps.combine_begin; i < ps.combine_begin + ps.combine_count; ++i) {
      const VerifyCombineItem& c = plan.combine[i];
      for (int r = 0; r < c.num_rows; ++r) {
        ++produced[c.out_row0 + r];
        // The fold continues after the splits folded into split 0's rows.
        for (int sp = 0; sp < c.num_splits; sp = sp == 0 ? std::max(1, c.folded_splits) : sp + 1) {
          const Partial& p = partial.at(c.partial_row0 + static_cast<int64_t>(sp) * bm + r);
          EXPECT_EQ(p.out, c.out_row0 + r) << "combine item " << i << " split " << sp;
          EXPECT_EQ(p.split, sp) << "combine item " << i << " split " << sp;
          EXPECT_EQ(p.count, sp == 0 ? std::max(1, c.folded_splits) : 1)
              << "combine item " << i << " split " << sp;
        }
        EXPECT_EQ(static_cast<int>(walk.splits[c.out_row0 + r].size()), c.num_splits);
      }
    }
  }
  for (size_t r = 0; r < out_rows; ++r) EXPECT_EQ(produced[r], 1) << "output row " << r;
  return walk;
}

// Splits depend on the visible key count alone: one up to kPositionalChunkKeys, then up to
// kPositionalMaxSplits, 128-key multiples (whole tile pairs: split groups).
TEST(VerifyAttentionPlan, PositionalSplitKeys) {
  EXPECT_EQ(PositionalSplitKeys(1), 128);
  EXPECT_EQ(PositionalSplitKeys(kPositionalChunkKeys), kPositionalChunkKeys);
  EXPECT_EQ(PositionalSplitKeys(513), 640);      // one split of 513 -> 640
  EXPECT_EQ(PositionalSplitKeys(1025), 640);     // two splits of 513 -> 640
  EXPECT_EQ(PositionalSplitKeys(185000), 5888);  // 32 splits of 5782 -> 5888
  EXPECT_EQ(PositionalSplitKeys(8192, {1024, 4}), 2048);
  EXPECT_EQ(PositionalSplitKeys(3000, {1024, 4}), 1024);
  for (int64_t n : {1, 63, 64, 65, 511, 512, 513, 4097, 65536, 65537, 185000, 1 << 20}) {
    const int64_t len = PositionalSplitKeys(n);
    EXPECT_EQ(len % 128, 0) << n;
    const int64_t splits = (n + len - 1) / len;
    EXPECT_LE(splits, kPositionalMaxSplits) << n;
    EXPECT_LE(splits, std::max<int64_t>(1, (n + kPositionalChunkKeys - 1) / kPositionalChunkKeys))
        << n;
  }
  EXPECT_EQ(PositionalConfigFor(9), VerifyKernelConfig::kS64);
  EXPECT_EQ(PositionalConfigFor(12), VerifyKernelConfig::kM16);
}

// Every (node, head tile) streams exactly its visible slots (context, then its ancestors and
// itself) in position order, and in the same splits as the same position decoded as a
// one-row chain in another batch; the configuration comes from the device; the tree mask is
// required.
TEST(VerifyAttentionPlan, PositionalPlanWalksVisibleKeys) {
  const VerifyAttentionWorkspace ws = CapacityOnly();
  for (const bool shared : {false, true}) {
    for (const auto& [device, heads] :
         std::vector<std::pair<VerifyAttentionDeviceInfo, int>>{{kH200, 8},
                                                                {kH200, 16},
                                                                {kH200, 40},
                                                                {kH200, 64},
                                                                {kH200, 128},
                                                                {kSm120, 8},
                                                                {kSm120, 40}}) {
      SCOPED_TRACE(testing::Message() << heads << " heads, sm_" << device.cc_major
                                      << (shared ? ", shared context" : ""));
      // 32,765 + depth crosses 32,768, where the shared split length changes (1,024 -> 1,152).
      const std::vector<int> nodes = {1, 17, 65, 3, 9, 17}, ctx = {5000, 100, 7000, 0, 4090, 32765};
      const TreeBatch t = MakeTrees(nodes, ctx, 7 + heads);
      const VerifyAttentionParams p = ParamsOf(t, heads);
      VerifyPlanOptions opt;
      opt.positional = true;
      opt.positional_shared_context = shared;
      opt.host_tree_mask = t.mask.data();
      auto plan = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), device, ws, opt);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->config, PositionalConfigFor(device.cc_major));
      EXPECT_TRUE(plan->positional);
      const Walk walk = Simulate(*plan, t, heads);
      for (int r = 0; r < p.total_rows; ++r) {
        // The same position as a chain: context = ctx + ancestors, one tail row (itself).
        TreeBatch chain;
        chain.qi = {0, 1};
        chain.ki = {0, static_cast<int32_t>(t.visible[r].size())};
        chain.idx = t.visible[r];
        chain.mask = {1, 0};
        VerifyPlanOptions copt = opt;
        copt.host_tree_mask = chain.mask.data();
        auto cplan = PlanVerifyAttention(ParamsOf(chain, heads), chain.qi.data(), chain.ki.data(),
                                         device, ws, copt);
        ASSERT_TRUE(cplan.ok()) << cplan.status();
        const Walk cwalk = Simulate(*cplan, chain, heads);
        for (int h = 0; h < heads; ++h) {
          const size_t f = static_cast<size_t>(r) * heads + h;
          ASSERT_EQ(walk.slots[f], t.visible[r]) << "row " << r << " head " << h;
          ASSERT_EQ(walk.splits[f], cwalk.splits[h]) << "row " << r << " head " << h;
          ASSERT_EQ(cwalk.slots[h], t.visible[r]) << "row " << r << " head " << h;
        }
      }
      if (shared && device.cc_major == 9 && heads == 8) {
        // The point of sharing: a 64-row CTA holds 8 nodes, so the context is read by far
        // fewer work items than one per node.
        // (One split per work item in both: split groups would shrink either.)
        VerifyPlanOptions ungrouped = opt;
        ungrouped.positional_split_group = 0;
        auto sharing = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), device, ws, ungrouped);
        VerifyPlanOptions per_node = ungrouped;
        per_node.positional_shared_context = false;
        auto plain = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), device, ws, per_node);
        ASSERT_TRUE(sharing.ok());
        ASSERT_TRUE(plain.ok());
        EXPECT_LT(sharing->work.size() * 2, plain->work.size());
      }
      VerifyPlanOptions no_mask = opt;
      no_mask.host_tree_mask = nullptr;
      auto refused = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), device, ws, no_mask);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(refused.status().message().find("host_tree_mask"), std::string::npos);
    }
  }
}

// Split groups (seesaw only): several context splits of a head tile in one work item change
// which CTA computes a split, never a row's keys, split boundaries or merge order; the auto
// choice groups only when the batch has far more split items than SMs; other kernels and an
// explicit 0 keep one split per item.
TEST(VerifyAttentionPlan, PositionalSplitGroupsKeepEveryRowsSplits) {
  const VerifyAttentionWorkspace ws = CapacityOnly();
  const std::vector<int> nodes = {9, 17, 1, 33, 5, 1}, ctx = {20000, 6000, 65000, 3000, 40000, 900};
  const TreeBatch t = MakeTrees(nodes, ctx, 11);
  for (const bool shared : {false, true}) {
    for (const int heads : {16, 64, 128}) {
      SCOPED_TRACE(testing::Message() << heads << " heads" << (shared ? ", shared" : ""));
      const VerifyAttentionParams p = ParamsOf(t, heads);
      VerifyPlanOptions opt;
      opt.positional = true;
      opt.positional_shared_context = shared;
      opt.host_tree_mask = t.mask.data();
      opt.positional_split_group = 0;
      auto plain = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kH200, ws, opt);
      ASSERT_TRUE(plain.ok()) << plain.status();
      for (const int g : {2, 5, 1000}) {
        opt.positional_split_group = g;
        auto grouped = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kH200, ws, opt);
        ASSERT_TRUE(grouped.ok()) << grouped.status();
        EXPECT_LT(grouped->work.size(), plain->work.size()) << g;
        int groups = 0;
        for (const VerifyWorkItem& w : grouped->work) groups += w.split_keys > 0;
        EXPECT_GT(groups, 0) << g;
        // The groups that start at key 0 fold: their combine items continue after them (all
        // of a row's context splits with a group of 1,000).
        int folded = 0;
        for (const VerifyCombineItem& c : grouped->combine) {
          folded += c.folded_splits > 1;
          EXPECT_LE(c.folded_splits, std::min(g, c.num_splits));
        }
        for (const VerifyCombineItem& c : plain->combine) EXPECT_EQ(c.folded_splits, 0);
        EXPECT_GT(folded, 0) << g;
        const Walk a = Simulate(*plain, t, heads), b = Simulate(*grouped, t, heads);
        EXPECT_EQ(a.slots, b.slots) << g;
        EXPECT_EQ(a.splits, b.splits) << g;
        EXPECT_EQ(grouped->combine.size(), plain->combine.size()) << g;
      }
      // Auto: this batch at 16+ heads has several times 2 x 132 split items at 64+ heads.
      opt.positional_split_group = -1;
      auto autod = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kH200, ws, opt);
      ASSERT_TRUE(autod.ok());
      const Walk a = Simulate(*plain, t, heads), c = Simulate(*autod, t, heads);
      EXPECT_EQ(a.splits, c.splits);
      // Not on the 16-row kernel (sm_120): no split groups there.
      opt.positional_split_group = 4;
      auto m16 = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kSm120, ws, opt);
      ASSERT_TRUE(m16.ok());
      for (const VerifyWorkItem& w : m16->work) EXPECT_EQ(w.split_keys, 0);
    }
  }
  // One decode row at 4,096 keys: a few split items, far fewer than the SMs: never grouped.
  const TreeBatch one = MakeTrees({1}, {4095}, 5);
  VerifyPlanOptions opt;
  opt.positional = true;
  opt.host_tree_mask = one.mask.data();
  auto plan = PlanVerifyAttention(ParamsOf(one, 64), one.qi.data(), one.ki.data(), kH200, ws, opt);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(static_cast<int64_t>(plan->work.size()), 4096 / PositionalSplitKeys(4096));
  for (const VerifyWorkItem& w : plan->work) EXPECT_EQ(w.split_keys, 0);
}

// A batch whose partial outputs or index lists exceed the workspace runs in passes (per-node
// and shared-context plans): every pass fits, each pass's partial rows are written once and
// merged by its own combine items (Simulate), the passes cover the lists in order, and every
// row still streams its visible slots in the same splits.
TEST(VerifyAttentionPlan, PositionalPasses) {
  const std::vector<int> nodes = {65, 65, 9}, ctx = {60000, 9000, 130000};
  const TreeBatch t = MakeTrees(nodes, ctx, 3);
  const VerifyAttentionParams p = ParamsOf(t, 16);
  VerifyPlanOptions opt;
  opt.positional = true;
  opt.host_tree_mask = t.mask.data();
  VerifyAttentionWorkspace big = CapacityOnly();
  big.max_work_items = 1 << 20;
  big.max_combine_items = 1 << 16;
  big.max_partial_rows = int64_t{1} << 24;
  big.max_index_tasks = 1 << 16;
  big.max_index_entries = int64_t{1} << 24;
  for (const int mode : {0, 1, 2, 3}) {
    const bool small_partials = mode % 2 == 0;
    opt.positional_shared_context = mode >= 2;
    VerifyAttentionWorkspace small = big;
    if (small_partials) {
      small.max_partial_rows = 5000;
    } else {
      small.max_index_entries = 30000;
    }
    auto one = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kH200, big, opt);
    auto many = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kH200, small, opt);
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE(many.ok()) << many.status();
    EXPECT_TRUE(one->passes.empty());
    ASSERT_GT(many->passes.size(), 2u);
    EXPECT_LE(many->partial_rows, small.max_partial_rows);
    EXPECT_LE(many->index_entries, small.max_index_entries);
    const Walk a = Simulate(*one, t, 16), b = Simulate(*many, t, 16);
    EXPECT_EQ(a.slots, b.slots);
    EXPECT_EQ(a.splits, b.splits);
    int32_t work_at = 0, combine_at = 0, task_at = 0;
    for (const VerifyPass& ps : many->passes) {
      EXPECT_EQ(ps.work_begin, work_at);
      EXPECT_EQ(ps.combine_begin, combine_at);
      EXPECT_EQ(ps.task_begin, task_at);
      work_at += ps.work_count;
      combine_at += ps.combine_count;
      task_at += ps.task_count;
    }
    EXPECT_EQ(work_at, static_cast<int32_t>(many->work.size()));
    EXPECT_EQ(combine_at, static_cast<int32_t>(many->combine.size()));
    EXPECT_EQ(task_at, static_cast<int32_t>(many->index_tasks.size()));
  }
  // One node that cannot fit at all: RESOURCE_EXHAUSTED.
  VerifyAttentionWorkspace tiny = big;
  tiny.max_partial_rows = 100;
  EXPECT_EQ(PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kH200, tiny, opt).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Forks: request b's slot list begins with the first prefix[b] context slots of request 0
// (a shared prefix; 0: its own slots throughout), then its own context and tail slots.
TreeBatch MakeForks(const std::vector<int>& nodes, const std::vector<int>& ctx,
                    const std::vector<int>& prefix, uint64_t seed) {
  TreeBatch t = MakeTrees(nodes, ctx, seed);
  for (size_t b = 1; b < nodes.size(); ++b) {
    for (int k = 0; k < prefix[b]; ++k) t.idx[t.ki[b] + k] = t.idx[k];
  }
  // Rebuild the visible lists from the new slots.
  for (size_t b = 0; b < nodes.size(); ++b) {
    for (int i = 0; i < nodes[b]; ++i) {
      const int row = t.qi[b] + i;
      std::vector<int32_t> vis(t.idx.begin() + t.ki[b], t.idx.begin() + t.ki[b] + ctx[b]);
      for (int j = 0; j < nodes[b]; ++j) {
        if ((t.mask[2 * row + j / 64] >> (j % 64)) & 1) vis.push_back(t.idx[t.ki[b] + ctx[b] + j]);
      }
      t.visible[row] = vis;
    }
  }
  return t;
}

// What a default plan's kernels read, simulated as the kernels mask: a work item's key k of a
// row is a tail key (k >= kv_len - num_nodes) read only if the row's mask has bit k - (kv_len -
// num_nodes). Per output row and head, the slots it saw, its splits in merge order (by partial
// row: the combine's split s of local row i is partial row partial_row0 + s * rows_per_cta +
// i). Fails the test when a partial row is written twice or merged from the wrong row or
// split, or an output row is not produced exactly once.
std::vector<std::vector<int32_t>> SimulateMasked(const VerifyAttentionPlan& plan,
                                                 const TreeBatch& t, int heads) {
  const int bm = plan.rows_per_cta;
  const size_t out_rows = static_cast<size_t>(plan.total_rows) * heads;
  // Per output row: (partial row or -1, the slots of that split).
  std::vector<std::vector<std::pair<int64_t, std::vector<int32_t>>>> parts(out_rows);
  std::vector<int> produced(out_rows, 0);
  std::vector<int64_t> writer(static_cast<size_t>(plan.partial_rows), -1);
  for (const VerifyWorkItem& w : plan.work) {
    const int rows = std::min(bm, w.num_nodes * heads - w.fold_begin);
    EXPECT_GT(rows, 0);
    EXPECT_LE(w.kv_end, w.kv_len);
    for (int r = 0; r < rows; ++r) {
      const int node = (w.fold_begin + r) / heads;
      const int64_t row = w.q_row0 + node;
      const int64_t out = static_cast<int64_t>(w.q_row0) * heads + w.fold_begin + r;
      const int tail0 = w.kv_len - w.num_nodes;
      std::vector<int32_t> keys;
      for (int k = w.kv_begin; k < w.kv_end; ++k) {
        if (k >= tail0) {
          const int j = k - tail0;
          if (!((t.mask[2 * row + j / 64] >> (j % 64)) & 1)) continue;
        }
        keys.push_back(t.idx.at(w.kv_off + k));
      }
      if (w.partial_row < 0) {
        ++produced[out];
        parts[out].push_back({-1, keys});
      } else {
        const int64_t pr = w.partial_row + r;
        EXPECT_EQ(writer.at(pr), -1) << "partial row " << pr << " written twice";
        writer.at(pr) = out;
        parts[out].push_back({pr, keys});
      }
    }
  }
  for (size_t i = 0; i < plan.combine.size(); ++i) {
    const VerifyCombineItem& c = plan.combine[i];
    EXPECT_LE(c.num_rows, bm);
    for (int r = 0; r < c.num_rows; ++r) {
      ++produced[c.out_row0 + r];
      auto& ps = parts[c.out_row0 + r];
      std::sort(ps.begin(), ps.end());
      EXPECT_EQ(static_cast<int>(ps.size()), c.num_splits);
      for (int sp = 0; sp < c.num_splits && sp < static_cast<int>(ps.size()); ++sp) {
        const int64_t pr = c.partial_row0 + static_cast<int64_t>(sp) * bm + r;
        EXPECT_EQ(writer.at(pr), c.out_row0 + r) << "combine item " << i << " split " << sp;
        EXPECT_EQ(ps[sp].first, pr) << "combine item " << i << " split " << sp;
      }
    }
  }
  std::vector<std::vector<int32_t>> seen(out_rows);
  for (size_t r = 0; r < out_rows; ++r) {
    EXPECT_EQ(produced[r], 1) << "output row " << r;
    for (const auto& [pr, keys] : parts[r]) seen[r].insert(seen[r].end(), keys.begin(), keys.end());
  }
  return seen;
}

// Shared prefixes: forks of one context (decode rows and draft trees, own context after the
// prefix, unrelated requests between groups) are packed when the heads leave room in a row
// tile; every row still sees exactly its visible keys in order; 64 heads, no host kv indices
// or a prefix below kSharedPrefixMinKeys plan as before.
TEST(VerifyAttentionPlan, SharedPrefixesReadOnceAndCoverEveryKey) {
  const VerifyAttentionWorkspace ws = CapacityOnly();
  struct Trial {
    std::vector<int> nodes, ctx, prefix;
    int heads;
    int want_packs;  // -1: any > 0
  };
  std::vector<Trial> trials;
  {
    Trial t{{}, {}, {}, 8, 4};  // 32 decode forks of a 65,536-key context
    for (int b = 0; b < 32; ++b) {
      t.nodes.push_back(1);
      t.ctx.push_back(65536);
      t.prefix.push_back(b == 0 ? 0 : 65536);
    }
    trials.push_back(t);
  }
  {
    Trial t{{}, {}, {}, 16, -1};  // trees, own context after a 20,000-key prefix, strangers
    std::mt19937 rng(5);
    for (int b = 0; b < 24; ++b) {
      const bool stranger = b % 7 == 3;
      t.nodes.push_back(1 + static_cast<int>(rng() % 3));
      t.ctx.push_back(20000 + static_cast<int>(rng() % 3000));
      t.prefix.push_back(b == 0 || stranger ? 0 : 20000);
    }
    trials.push_back(t);
  }
  trials.push_back({{1, 1, 1, 1}, {30000, 30000, 30000, 30000}, {0, 30000, 30000, 30000}, 64, 0});
  trials.push_back({{1, 1, 1}, {30000, 30000, 30000}, {0, 500, 500}, 8, 0});  // too short
  for (size_t i = 0; i < trials.size(); ++i) {
    SCOPED_TRACE(i);
    const Trial& tr = trials[i];
    const TreeBatch t = MakeForks(tr.nodes, tr.ctx, tr.prefix, 11 + i);
    const VerifyAttentionParams p = ParamsOf(t, tr.heads);
    VerifyPlanOptions opt;
    opt.host_kv_indices = t.idx.data();
    auto plan = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kH200, ws, opt);
    ASSERT_TRUE(plan.ok()) << plan.status();
    if (tr.want_packs >= 0) {
      EXPECT_EQ(plan->shared_packs, tr.want_packs);
    } else {
      EXPECT_GT(plan->shared_packs, 0);
    }
    const std::vector<std::vector<int32_t>> seen = SimulateMasked(*plan, t, tr.heads);
    for (int64_t r = 0; r < p.total_rows; ++r) {
      for (int h = 0; h < tr.heads; ++h) {
        ASSERT_EQ(seen[r * tr.heads + h], t.visible[r]) << "row " << r << " head " << h;
      }
    }
    // Without the host indices: no sharing, the same keys.
    opt.host_kv_indices = nullptr;
    auto plain = PlanVerifyAttention(p, t.qi.data(), t.ki.data(), kH200, ws, opt);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ(plain->shared_packs, 0);
    EXPECT_EQ(SimulateMasked(*plain, t, tr.heads), seen);
    if (i == 0) {
      // 4 packs of 8 forks: each reads the 65,536-key prefix once instead of 8 times.
      EXPECT_EQ(plan->shared_reads_saved, int64_t{28} * 65536);
      std::printf("32 forks x 65,536 keys, 8 heads: %zu work items (%zu without sharing)\n",
                  plan->work.size(), plain->work.size());
    }
  }
}

}  // namespace
}  // namespace verifyd::kernels::cuda
