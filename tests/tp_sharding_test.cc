// Rank arithmetic: ranges tile [0, n) in rank order; weight shards reassemble the full
// tensors (q_b rows, o_proj columns, gate/up rows, down columns, lm_head rows, kv_b per head).
#include <random>

#include "gtest/gtest.h"
#include "tp/cpu/cpu_forward.h"
#include "tp/presets.h"
#include "tp/sharding.h"

namespace verifyd::tp {
namespace {

TEST(Sharding, RangesTileInRankOrder) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 9);
    const int64_t n = rng() % 1000;
    int64_t next = 0;
    for (int r = 0; r < world; ++r) {
      const ShardRange s = CeilShard(n, world, r);
      EXPECT_EQ(s.begin, next);
      EXPECT_GE(s.size, 0);
      EXPECT_LE(s.size, CeilShardMax(n, world));
      next = s.end();
    }
    EXPECT_EQ(next, n) << "world " << world << " n " << n;
    EXPECT_EQ(VocabShard(n, world, world - 1), CeilShard(n, world, world - 1));
    EXPECT_EQ(IntermediateShard(n, world, 0), CeilShard(n, world, 0));
    const int64_t heads = world * (1 + rng() % 8);
    next = 0;
    for (int r = 0; r < world; ++r) {
      const ShardRange s = HeadShard(heads, world, r);
      EXPECT_EQ(s.begin, next);
      EXPECT_EQ(s.size, heads / world);
      next = s.end();
    }
    EXPECT_EQ(next, heads);
  }
}

TEST(Sharding, UnevenVocab) {
  // 10 over 4: 3, 3, 3, 1.
  EXPECT_EQ(VocabShard(10, 4, 0), (ShardRange{0, 3}));
  EXPECT_EQ(VocabShard(10, 4, 2), (ShardRange{6, 3}));
  EXPECT_EQ(VocabShard(10, 4, 3), (ShardRange{9, 1}));
  // 2 over 4: the last two ranks own nothing.
  EXPECT_EQ(VocabShard(2, 4, 3).size, 0);
}

TEST(Sharding, WeightShardsReassemble) {
  ModelConfig c = *PresetConfig("tiny", 1);
  c.vocab_size = 509;         // uneven vocab slices
  c.intermediate_size = 250;  // uneven MLP slices
  ModelWeights w = *GenerateRandomWeights(c, 11);
  const int64_t hid = c.hidden_size, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const int64_t v = c.v_head_dim, kvl = c.kv_lora_rank;
  for (int world : {1, 2, 4, 8}) {
    const HostTensor& qb = *w.Find("model.layers.0.self_attn.q_b_proj.weight");
    const HostTensor& o = *w.Find("model.layers.0.self_attn.o_proj.weight");
    const HostTensor& down = *w.Find("model.layers.0.mlp.down_proj.weight");
    const HostTensor& gate = *w.Find("model.layers.0.mlp.gate_proj.weight");
    const HostTensor& head = *w.Find("lm_head.weight");
    const HostTensor& kvb = *w.Find("model.layers.0.self_attn.kv_b_proj.weight");
    for (int r = 0; r < world; ++r) {
      absl::StatusOr<RankWeights> s = ShardWeights(w, world, r);
      ASSERT_TRUE(s.ok()) << s.status();
      const RankWeights::Layer& L = s->layers[0];
      const ShardRange hs = HeadShard(c.num_attention_heads, world, r);
      ASSERT_EQ(L.q_b.size(), static_cast<size_t>(hs.size * qk * c.q_lora_rank));
      for (size_t i = 0; i < L.q_b.size(); ++i) {
        ASSERT_EQ(L.q_b[i], qb.data[hs.begin * qk * c.q_lora_rank + i]);
      }
      for (int64_t row = 0; row < hid; ++row) {
        for (int64_t col = 0; col < hs.size * v; ++col) {
          ASSERT_EQ(L.o_proj[row * hs.size * v + col],
                    o.data[row * c.num_attention_heads * v + hs.begin * v + col]);
        }
      }
      for (int64_t h = 0; h < hs.size; ++h) {
        const int64_t gh = hs.begin + h;
        for (int64_t d = 0; d < nope; ++d) {
          for (int64_t j = 0; j < kvl; ++j) {
            ASSERT_EQ(L.w_uk_t[(h * kvl + j) * nope + d],
                      kvb.data[(gh * (nope + v) + d) * kvl + j]);
          }
        }
        for (int64_t i = 0; i < v; ++i) {
          for (int64_t j = 0; j < kvl; ++j) {
            ASSERT_EQ(L.w_uv[(h * v + i) * kvl + j],
                      kvb.data[(gh * (nope + v) + nope + i) * kvl + j]);
          }
        }
      }
      const ShardRange is = IntermediateShard(c.intermediate_size, world, r);
      for (int64_t i = 0; i < is.size * hid; ++i)
        ASSERT_EQ(L.gate[i], gate.data[is.begin * hid + i]);
      for (int64_t row = 0; row < hid; ++row) {
        for (int64_t col = 0; col < is.size; ++col) {
          ASSERT_EQ(L.down[row * is.size + col],
                    down.data[row * c.intermediate_size + is.begin + col]);
        }
      }
      const ShardRange vs = VocabShard(c.vocab_size, world, r);
      EXPECT_EQ(s->vocab, vs);
      ASSERT_EQ(s->lm_head.size(), static_cast<size_t>(vs.size * hid));
      for (int64_t i = 0; i < vs.size * hid; ++i)
        ASSERT_EQ(s->lm_head[i], head.data[vs.begin * hid + i]);
    }
  }
  EXPECT_EQ(ShardWeights(w, 3, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace verifyd::tp
