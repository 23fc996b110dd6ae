// Tests of VerifyAttentionReference (kernels/verify_attention.h) against a naive float64
// loop per (row, head), on seeded random batches: scattered slots, random trees, unused
// cache slots and outputs poisoned with NaN, float32 and bf16; batch invariance; LSE; and
// the InvalidArgument cases.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/common.h"
#include "kernels/kv_fp8.h"
#include "kernels/verify_attention.h"

namespace verifyd::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One random verify batch, host memory, every tensor stored as float (the values are
// bf16-representable when dtype is bf16) plus the typed copies the op reads.
struct Batch {
  DType dtype = DType::kFloat32;
  int heads = 0, qk_dim = 0, v_dim = 0, mask_words = 2;
  float scale = 1.f;
  int64_t kv_slots = 0;
  std::vector<int32_t> q_indptr, kv_indptr, kv_indices;
  std::vector<uint64_t> mask;  // [rows, mask_words]
  std::vector<float> q;        // [rows, heads, qk_dim]
  std::vector<float> kv;       // [kv_slots, qk_dim]; unused slots NaN
  int rows() const { return q_indptr.back(); }
  int batch() const { return static_cast<int>(q_indptr.size()) - 1; }
};

// Storage of a float vector in the op's dtype.
struct Typed {
  std::vector<float> f32;
  std::vector<bf16_bits> bf16;
  const void* data(DType t) const {
    return t == DType::kFloat32 ? static_cast<const void*>(f32.data()) : bf16.data();
  }
  void* data(DType t) {
    return t == DType::kFloat32 ? static_cast<void*>(f32.data()) : bf16.data();
  }
};

Typed ToTyped(const std::vector<float>& v, DType t) {
  Typed out;
  if (t == DType::kFloat32) {
    out.f32 = v;
  } else {
    out.bf16.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) out.bf16[i] = FloatToBf16(v[i]);
  }
  return out;
}

std::vector<float> FromTyped(const Typed& v, DType t) {
  if (t == DType::kFloat32) return v.f32;
  std::vector<float> out(v.bf16.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = Bf16ToFloat(v.bf16[i]);
  return out;
}

// Random tree of n rows: row 0 the root (pending token), row t >= 1 a child of a random
// earlier row. Mask row t = t's ancestors and t itself.
void AddTreeMask(int n, int mask_words, std::mt19937& rng, std::vector<uint64_t>& mask) {
  std::vector<int> parent(n, -1);
  for (int t = 1; t < n; ++t) parent[t] = std::uniform_int_distribution<int>(0, t - 1)(rng);
  for (int t = 0; t < n; ++t) {
    std::vector<uint64_t> row(mask_words, 0);
    for (int a = t; a >= 0; a = parent[a]) row[a / 64] |= uint64_t{1} << (a % 64);
    mask.insert(mask.end(), row.begin(), row.end());
  }
}

// ctx_len[b] context slots and n_rows[b] tail rows per request; every slot drawn at random
// without replacement from a pool twice as large as needed; unused slots are NaN.
Batch MakeBatch(const std::vector<int>& ctx_len, const std::vector<int>& n_rows, int heads,
                int qk_dim, int v_dim, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.dtype = dtype;
  b.heads = heads;
  b.qk_dim = qk_dim;
  b.v_dim = v_dim;
  b.scale = 1.0f / std::sqrt(static_cast<float>(qk_dim)) * 3.0f;  // peaky softmax
  int64_t used = 0;
  for (size_t i = 0; i < ctx_len.size(); ++i) used += ctx_len[i] + n_rows[i];
  b.kv_slots = 2 * used + 5;
  std::vector<int32_t> pool(static_cast<size_t>(b.kv_slots));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  b.q_indptr = {0};
  b.kv_indptr = {0};
  size_t next = 0;
  for (size_t i = 0; i < ctx_len.size(); ++i) {
    for (int j = 0; j < ctx_len[i] + n_rows[i]; ++j) b.kv_indices.push_back(pool[next++]);
    b.q_indptr.push_back(b.q_indptr.back() + n_rows[i]);
    b.kv_indptr.push_back(b.kv_indptr.back() + ctx_len[i] + n_rows[i]);
    AddTreeMask(n_rows[i], b.mask_words, rng, b.mask);
  }
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto rnd = [&] {
    const float v = dist(rng);
    return dtype == DType::kBFloat16 ? RoundToBf16(v) : v;
  };
  b.q.resize(static_cast<size_t>(b.rows()) * heads * qk_dim);
  for (auto& v : b.q) v = rnd();
  b.kv.assign(static_cast<size_t>(b.kv_slots) * qk_dim, kNaN);
  for (int32_t s : b.kv_indices)
    for (int d = 0; d < qk_dim; ++d) b.kv[static_cast<size_t>(s) * qk_dim + d] = rnd();
  return b;
}

// The op's output for a batch, from NaN-filled buffers.
struct Result {
  absl::Status status;
  std::vector<float> out;  // [rows, heads, v_dim] as float
  std::vector<float> lse;  // [rows, heads]
};

// kv_fp8: the cache is these FP8-format rows (kernels/kv_fp8.h) instead of b.kv.
Result RunOp(const Batch& b, bool with_lse = true, const std::vector<uint8_t>* kv_fp8 = nullptr) {
  const Typed q = ToTyped(b.q, b.dtype);
  const Typed kv = ToTyped(b.kv, b.dtype);
  Typed out =
      ToTyped(std::vector<float>(static_cast<size_t>(b.rows()) * b.heads * b.v_dim, kNaN), b.dtype);
  Result r;
  r.lse.assign(static_cast<size_t>(b.rows()) * b.heads, kNaN);
  VerifyAttentionParams p;
  p.batch = b.batch();
  p.total_rows = b.rows();
  p.num_heads = b.heads;
  p.qk_dim = b.qk_dim;
  p.v_dim = b.v_dim;
  p.softmax_scale = b.scale;
  p.dtype = b.dtype;
  p.q = q.data(b.dtype);
  p.kv = kv_fp8 != nullptr ? static_cast<const void*>(kv_fp8->data()) : kv.data(b.dtype);
  p.kv_fp8 = kv_fp8 != nullptr;
  p.kv_slots = b.kv_slots;
  p.q_indptr = b.q_indptr.data();
  p.kv_indptr = b.kv_indptr.data();
  p.kv_indices = b.kv_indices.data();
  p.tree_mask = b.mask.data();
  p.mask_words = b.mask_words;
  p.out = out.data(b.dtype);
  p.lse = with_lse ? r.lse.data() : nullptr;
  r.status = VerifyAttentionReference(p);
  r.out = FromTyped(out, b.dtype);
  return r;
}

// Naive float64 attention per (row, head): straight from the header's definition.
void Naive(const Batch& b, std::vector<double>& out, std::vector<double>& lse) {
  const int H = b.heads, D = b.qk_dim, V = b.v_dim;
  out.assign(static_cast<size_t>(b.rows()) * H * V, 0.0);
  lse.assign(static_cast<size_t>(b.rows()) * H, -INFINITY);
  for (int req = 0; req < b.batch(); ++req) {
    const int r0 = b.q_indptr[req], n = b.q_indptr[req + 1] - r0;
    const int k0 = b.kv_indptr[req], len = b.kv_indptr[req + 1] - k0, ctx = len - n;
    for (int t = 0; t < n; ++t) {
      const int r = r0 + t;
      for (int h = 0; h < H; ++h) {
        std::vector<double> s;
        std::vector<int32_t> slot;
        for (int j = 0; j < len; ++j) {
          if (j >= ctx) {
            const int tj = j - ctx;
            if (!((b.mask[r * b.mask_words + tj / 64] >> (tj % 64)) & 1)) continue;
          }
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += double{b.q[(static_cast<size_t>(r) * H + h) * D + d]} *
                   b.kv[static_cast<size_t>(b.kv_indices[k0 + j]) * D + d];
          s.push_back(dot * b.scale);
          slot.push_back(b.kv_indices[k0 + j]);
        }
        if (s.empty()) continue;
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double x : s) sum += std::exp(x - m);
        for (size_t j = 0; j < s.size(); ++j) {
          const double w = std::exp(s[j] - m) / sum;
          for (int d = 0; d < V; ++d)
            out[(static_cast<size_t>(r) * H + h) * V + d] +=
                w * b.kv[static_cast<size_t>(slot[j]) * D + d];
        }
        lse[static_cast<size_t>(r) * H + h] = m + std::log(sum);
      }
    }
  }
}

// Relative L2 / max-abs comparison with the float64 result; NaN/Inf positions must match
// (the expected output has none).
void ExpectClose(const Batch& b, const Result& got, const std::string& what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  std::vector<double> out, lse;
  Naive(b, out, lse);
  // float32: accumulation error only; bf16: the output is rounded to bf16 (2^-9 relative).
  const double tol_rel_l2 = b.dtype == DType::kFloat32 ? 2e-6 : 4e-3;
  const double tol_abs = b.dtype == DType::kFloat32 ? 1e-5 : 8e-3;
  double err2 = 0, ref2 = 0, max_abs = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.out[i])) << what << ": non-finite output at " << i;
    const double e = got.out[i] - out[i];
    err2 += e * e;
    ref2 += out[i] * out[i];
    max_abs = std::max(max_abs, std::abs(e));
  }
  const double rel_l2 = std::sqrt(err2 / std::max(ref2, 1e-300));
  EXPECT_LE(rel_l2, tol_rel_l2) << what;
  EXPECT_LE(max_abs, tol_abs) << what;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse[i])) {
      EXPECT_TRUE(std::isinf(got.lse[i]) && got.lse[i] < 0) << what << " lse " << i;
    } else {
      EXPECT_NEAR(got.lse[i], lse[i], 1e-5 * (1 + std::abs(lse[i]))) << what << " lse " << i;
    }
  }
}

struct Case {
  std::vector<int> ctx, rows;
  int heads, qk_dim, v_dim;
};

const Case kCases[] = {
    {{0}, {1}, 1, 8, 8},                              // decode, no context
    {{5}, {1}, 2, 13, 9},                             // odd widths
    {{37, 0, 100}, {3, 7, 1}, 3, 40, 32},             // mixed lengths
    {{64, 9}, {65, 2}, 4, 24, 16},                    // 65 rows: second mask word
    {{250, 1, 31, 80}, {16, 4, 1, 33}, 8, 576, 512},  // the real latent widths
    {{300}, {128}, 1, 16, 8},                         // kMaxTailRows
    {{12, 5, 3}, {2, 0, 1}, 2, 16, 16},               // a request with no rows
};

void SweepDtype(DType dtype) {
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    const Batch b = MakeBatch(c.ctx, c.rows, c.heads, c.qk_dim, c.v_dim, dtype, ++seed);
    ExpectClose(b, RunOp(b), std::string(DTypeName(dtype)) + " case seed " + std::to_string(seed));
  }
}

TEST(VerifyAttentionReference, MatchesFloat64Float32) { SweepDtype(DType::kFloat32); }
TEST(VerifyAttentionReference, MatchesFloat64Bf16) { SweepDtype(DType::kBFloat16); }

// The FP8 latent cache: each listed slot's row stored in the format (unlisted slots all 0xFF:
// NaN codes and scales), checked against the float64 attention over the dequantized rows.
TEST(VerifyAttentionReference, Fp8CacheIsTheDequantizedRows) {
  uint32_t seed = 300;
  for (const Case& c : kCases) {
    if (c.qk_dim == c.v_dim) continue;  // the format has a rope part
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      Batch b = MakeBatch(c.ctx, c.rows, c.heads, c.qk_dim, c.v_dim, dtype, ++seed);
      const int D = b.qk_dim, V = b.v_dim;
      const int64_t rb = KvFp8RowBytes(V, D - V, kKvFp8Group);
      std::vector<uint8_t> bytes(static_cast<size_t>(b.kv_slots * rb), 0xFF);
      for (int32_t slot : b.kv_indices) {
        float* row = b.kv.data() + static_cast<size_t>(slot) * D;
        KvFp8EncodeRow(row, V, D - V, kKvFp8Group, bytes.data() + slot * rb);
        KvFp8DecodeRow(bytes.data() + slot * rb, V, D - V, kKvFp8Group, row);
      }
      const Result r = RunOp(b, true, &bytes);
      ExpectClose(b, r, "fp8 cache seed " + std::to_string(seed));
    }
  }
}

TEST(VerifyAttentionReference, WithoutLseSameOutput) {
  const Batch b = MakeBatch({20, 3}, {4, 2}, 2, 32, 24, DType::kFloat32, 7);
  const Result with = RunOp(b, true), without = RunOp(b, false);
  ASSERT_TRUE(without.status.ok());
  ASSERT_EQ(0, std::memcmp(with.out.data(), without.out.data(), with.out.size() * 4));
  for (float v : without.lse) EXPECT_TRUE(std::isnan(v));  // lse untouched when null
}

TEST(VerifyAttentionReference, RowSeeingNoKeyGivesZeroAndMinusInfLse) {
  // No context, a mask row with no bits: out = 0, lse = -inf. The other row sees itself.
  Batch b = MakeBatch({0}, {2}, 2, 16, 8, DType::kFloat32, 3);
  b.mask = {0, 0, 0b10, 0};  // row 0 sees nothing, row 1 sees tail row 1
  const Result r = RunOp(b);
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (int i = 0; i < 2 * 8; ++i) EXPECT_EQ(r.out[i], 0.f) << i;
  EXPECT_EQ(r.lse[0], -INFINITY);
  EXPECT_EQ(r.lse[1], -INFINITY);
  ExpectClose(b, r, "no-key row");
}

TEST(VerifyAttentionReference, MaskedTailSlotIsNeverRead) {
  // Tail row 2 is visible to no row (not even itself): poison its cache row with NaN; every
  // output must stay finite and match the naive result.
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Batch b = MakeBatch({10}, {3}, 2, 16, 8, dtype, 5);
    b.mask = {0b001, 0, 0b011, 0, 0b001, 0};
    const int32_t poisoned = b.kv_indices[10 + 2];
    for (int d = 0; d < b.qk_dim; ++d) b.kv[static_cast<size_t>(poisoned) * b.qk_dim + d] = kNaN;
    ExpectClose(b, RunOp(b), "masked slot");
  }
}

TEST(VerifyAttentionReference, NaNInVisibleKeyPropagates) {
  // A NaN in a visible key's value columns must show up in the output (not be hidden).
  Batch b = MakeBatch({6}, {1}, 1, 16, 8, DType::kFloat32, 9);
  b.kv[static_cast<size_t>(b.kv_indices[2]) * b.qk_dim + 3] = kNaN;
  const Result r = RunOp(b);
  ASSERT_TRUE(r.status.ok());
  EXPECT_TRUE(std::isnan(r.out[3]));
}

TEST(VerifyAttentionReference, BatchInvariant) {
  // Each request's rows are bit-identical whether run alone or in a batch (in either order),
  // for both dtypes; the batch is large enough to be split over threads.
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const std::vector<int> ctx = {700, 3, 150, 0}, rows = {9, 1, 17, 5};
    const Batch all = MakeBatch(ctx, rows, 4, 64, 48, dtype, 77);
    const Result full = RunOp(all);
    ASSERT_TRUE(full.status.ok()) << full.status;
    // Batches made of one request each, and the batch in reverse order.
    std::vector<Batch> parts;
    for (int req = 0; req < all.batch(); ++req) {
      Batch one = all;
      const int r0 = all.q_indptr[req], r1 = all.q_indptr[req + 1];
      one.q_indptr = {0, r1 - r0};
      one.kv_indptr = {0, all.kv_indptr[req + 1] - all.kv_indptr[req]};
      one.kv_indices.assign(all.kv_indices.begin() + all.kv_indptr[req],
                            all.kv_indices.begin() + all.kv_indptr[req + 1]);
      one.mask.assign(all.mask.begin() + r0 * all.mask_words,
                      all.mask.begin() + r1 * all.mask_words);
      one.q.assign(all.q.begin() + static_cast<size_t>(r0) * all.heads * all.qk_dim,
                   all.q.begin() + static_cast<size_t>(r1) * all.heads * all.qk_dim);
      const Result alone = RunOp(one);
      ASSERT_TRUE(alone.status.ok()) << alone.status;
      const size_t o0 = static_cast<size_t>(r0) * all.heads * all.v_dim;
      ASSERT_EQ(
          0, std::memcmp(alone.out.data(), full.out.data() + o0, alone.out.size() * sizeof(float)))
          << DTypeName(dtype) << " request " << req << " differs alone vs in batch";
      ASSERT_EQ(0, std::memcmp(alone.lse.data(), full.lse.data() + r0 * all.heads,
                               alone.lse.size() * sizeof(float)));
      parts.push_back(std::move(one));
    }
    // Reverse order batch: concatenate the parts from last to first.
    Batch rev = all;
    rev.q_indptr = {0};
    rev.kv_indptr = {0};
    rev.kv_indices.clear();
    rev.mask.clear();
    rev.q.clear();
    for (int req = all.batch() - 1; req >= 0; --req) {
      const Batch& one = parts[req];
      rev.q_indptr.push_back(rev.q_indptr.back() + one.q_indptr[1]);
      rev.kv_indptr.push_back(rev.kv_indptr.back() + one.kv_indptr[1]);
      rev.kv_indices.insert(rev.kv_indices.end(), one.kv_indices.begin(), one.kv_indices.end());
      rev.mask.insert(rev.mask.end(), one.mask.begin(), one.mask.end());
      rev.q.insert(rev.q.end(), one.q.begin(), one.q.end());
    }
    const Result reversed = RunOp(rev);
    ASSERT_TRUE(reversed.status.ok());
    for (int req = 0; req < all.batch(); ++req) {
      const int rr = all.batch() - 1 - req;  // position in the reversed batch
      const size_t n =
          static_cast<size_t>(all.q_indptr[req + 1] - all.q_indptr[req]) * all.heads * all.v_dim;
      ASSERT_EQ(0, std::memcmp(reversed.out.data() +
                                   static_cast<size_t>(rev.q_indptr[rr]) * all.heads * all.v_dim,
                               full.out.data() +
                                   static_cast<size_t>(all.q_indptr[req]) * all.heads * all.v_dim,
                               n * sizeof(float)))
          << "request " << req << " differs in the reversed batch";
    }
  }
}

// ---- Invalid arguments: InvalidArgument naming the field; the output is not written. ----

void ExpectInvalid(const Batch& b, const std::string& field) {
  const Result r = RunOp(b);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << field << ": " << r.status;
  EXPECT_NE(std::string(r.status.message()).find(field), std::string::npos)
      << "message does not name " << field << ": " << r.status.message();
  for (float v : r.out) ASSERT_TRUE(std::isnan(v)) << field << ": output written on error";
}

TEST(VerifyAttentionReference, RejectsBadIndices) {
  const Batch good = MakeBatch({8, 4}, {3, 2}, 2, 16, 8, DType::kFloat32, 11);
  ASSERT_TRUE(RunOp(good).status.ok());
  {
    Batch b = good;
    b.kv_indices[5] = static_cast<int32_t>(b.kv_slots);  // one past the end
    ExpectInvalid(b, "kv_indices[5]");
  }
  {
    Batch b = good;
    b.kv_indices[0] = -1;
    ExpectInvalid(b, "kv_indices[0]");
  }
  {
    Batch b = good;
    b.q_indptr = {0, 4, 3};  // decreasing (and total rows mismatch)
    ExpectInvalid(b, "q_indptr");
  }
  {
    Batch b = good;
    b.q_indptr[0] = 1;
    ExpectInvalid(b, "q_indptr[0]");
  }
  {
    Batch b = good;
    b.kv_indptr = {0, 2, 17};  // request 0: 2 slots for 3 rows
    b.kv_indices.resize(17);
    ExpectInvalid(b, "kv_indptr");
  }
  {
    Batch b = good;
    b.kv_indptr = {0, 12, 10};  // decreasing
    ExpectInvalid(b, "kv_indptr");
  }
  {
    Batch b = good;
    b.kv_indptr[0] = 1;
    ExpectInvalid(b, "kv_indptr[0]");
  }
  {
    Batch b = good;
    b.mask_words = 3;
    ExpectInvalid(b, "mask_words");
  }
  {
    Batch b = good;
    b.v_dim = b.qk_dim + 1;
    ExpectInvalid(b, "v_dim");
  }
  {
    Batch b = good;
    b.heads = 0;
    ExpectInvalid(b, "num_heads");
  }
}

TEST(VerifyAttentionReference, RejectsTooManyRowsForMask) {
  // 65 rows with one mask word (64 bits).
  Batch b = MakeBatch({4}, {65}, 1, 8, 8, DType::kFloat32, 13);
  std::vector<uint64_t> one_word;
  for (size_t i = 0; i < b.mask.size(); i += 2) one_word.push_back(b.mask[i]);
  b.mask = one_word;
  b.mask_words = 1;
  ExpectInvalid(b, "q_indptr");
}

TEST(ValidateVerifyAttentionParams, NamesNullAndScalarFields) {
  VerifyAttentionParams p;
  EXPECT_NE(ValidateVerifyAttentionParams(p).message().find("batch"), std::string::npos);
  p.batch = 1;
  p.total_rows = 1;
  p.num_heads = 8;
  const float dummy = 0;
  const int32_t idx[2] = {0, 1};
  const uint64_t mask[2] = {1, 0};
  float out[512];
  p.q = p.kv = &dummy;
  p.kv_slots = 1;
  p.q_indptr = p.kv_indptr = p.kv_indices = idx;
  p.tree_mask = mask;
  p.out = out;
  EXPECT_TRUE(ValidateVerifyAttentionParams(p).ok());
  auto expect_field = [](VerifyAttentionParams bad, const char* field) {
    const absl::Status s = ValidateVerifyAttentionParams(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(std::string(s.message()).find(field), std::string::npos) << s.message();
  };
  VerifyAttentionParams bad = p;
  bad.tree_mask = nullptr;
  expect_field(bad, "tree_mask");
  bad = p;
  bad.out = nullptr;
  expect_field(bad, "out");
  bad = p;
  bad.kv = nullptr;
  expect_field(bad, "kv");
  bad = p;
  bad.dtype = static_cast<DType>(7);
  expect_field(bad, "dtype");
  bad = p;
  bad.softmax_scale = std::numeric_limits<float>::infinity();
  expect_field(bad, "softmax_scale");
  bad = p;
  bad.kv_slots = -1;
  expect_field(bad, "kv_slots");
}

}  // namespace
}  // namespace verifyd::kernels
