// Rank arithmetic of tensor parallelism: which heads, vocabulary rows and MLP columns a rank
// owns. Small pure functions, tested alone (tests/tp_sharding_test.cc).
//
// Heads must divide evenly (checked by ValidateTpSize); vocabulary and intermediate slices
// may be uneven: every rank gets ceil(n / world) except the last ones, which may get fewer
// (or none).
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tp/model_config.h"

namespace verifyd::tp {

// A half-open index range [begin, begin + size).
struct ShardRange {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t end() const { return begin + size; }
  bool operator==(const ShardRange& o) const { return begin == o.begin && size == o.size; }
};

// The even split of n over world ranks (n % world == 0 required by the caller).
inline ShardRange EvenShard(int64_t n, int world, int rank) {
  const int64_t per = n / world;
  return {per * rank, per};
}

// ceil(n / world) per rank, the tail ranks possibly short or empty.
inline ShardRange CeilShard(int64_t n, int world, int rank) {
  const int64_t per = (n + world - 1) / world;
  const int64_t b = std::min<int64_t>(n, per * rank);
  const int64_t e = std::min<int64_t>(n, per * (rank + 1));
  return {b, e - b};
}

// Largest shard of CeilShard (the padded width of a vocab all-gather).
inline int64_t CeilShardMax(int64_t n, int world) { return (n + world - 1) / world; }

// Attention heads of rank r (column-parallel q_b / kv_b, row-parallel o_proj).
inline ShardRange HeadShard(int64_t num_heads, int world, int rank) {
  return EvenShard(num_heads, world, rank);
}
// LM-head vocabulary rows of rank r.
inline ShardRange VocabShard(int64_t vocab, int world, int rank) {
  return CeilShard(vocab, world, rank);
}
// MLP intermediate columns of rank r (gate/up rows, down columns).
inline ShardRange IntermediateShard(int64_t intermediate, int world, int rank) {
  return CeilShard(intermediate, world, rank);
}

// tp size must be >= 1 and divide the heads.
inline absl::Status ValidateTpSize(const ModelConfig& c, int tp) {
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("tp size ", tp, " must be >= 1"));
  if (c.num_attention_heads % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads (", c.num_attention_heads,
                                                   ") is not divisible by the tp size (", tp, ")"));
  }
  return absl::OkStatus();
}

}  // namespace verifyd::tp
