// Fuzz harness: the reference kernels' host-side parameter checks (kernels/tree_accept.h,
// kernels/verify_attention.h) on hostile index arrays.
//
// Every buffer is allocated with exactly the size the params' own fields declare (so any
// read or write the checks let through beyond it is caught by AddressSanitizer), and its
// unused tail is poisoned. Byte 0 picks the kernel.
// Invariants:
//   tree acceptance: either InvalidArgument, or the result obeys the rule (each accepted
//     row's parent is the previous accepted row and its token is that row's prediction; no
//     child of the last accepted row matches; bonus = its prediction), agrees with
//     AcceptTreeGreedy, and kept + freed slots are exactly the request's tail slots;
//   verify attention: either InvalidArgument, or OK with finite outputs (rows that see no
//     key give 0 and lse = -inf).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <vector>

#include "kernels/tree_accept.h"
#include "kernels/verify_attention.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using verifyd::fuzz::ByteReader;
namespace k = verifyd::kernels;

constexpr int32_t kPoison = std::numeric_limits<int32_t>::min();

// Mostly-valid indptr: non-decreasing steps of >= min_step, sometimes broken.
std::vector<int32_t> ReadIndptr(ByteReader& in, int batch, int min_step, int max_step) {
  std::vector<int32_t> p(batch + 1, 0);
  if (in.Chance(10)) p[0] = static_cast<int32_t>(in.Range(-2, 2));
  for (int b = 0; b < batch; ++b) {
    int32_t step = static_cast<int32_t>(in.Range(min_step, max_step));
    if (in.Chance(10)) step = static_cast<int32_t>(in.Range(-3, 0));
    p[b + 1] = p[b] + step;
  }
  return p;
}

void FuzzTreeAccept(ByteReader& in) {
  const int batch = static_cast<int>(in.Range(0, 5));
  const std::vector<int32_t> indptr = ReadIndptr(in, std::max(batch, 0), 1, 12);
  const int32_t total = indptr[batch];
  const size_t alloc = total > 0 ? static_cast<size_t>(total) : 0;
  const int32_t vocab = static_cast<int32_t>(in.Range(1, 6));
  std::vector<int32_t> tokens(alloc), parents(alloc), predictions(alloc), tail(alloc);
  std::set<int32_t> tail_set;
  for (size_t r = 0; r < alloc; ++r) {
    tokens[r] = static_cast<int32_t>(in.Range(0, vocab - 1));
    predictions[r] = static_cast<int32_t>(in.Range(0, vocab - 1));
    tail[r] = static_cast<int32_t>(1000 + r);
  }
  // Parents: local, mostly valid (root -1, else an earlier local row).
  for (int b = 0; b < batch; ++b) {
    for (int32_t r = std::max(indptr[b], 0); r < indptr[b + 1] && r < total; ++r) {
      const int32_t t = r - indptr[b];
      parents[r] = t == 0 ? -1 : static_cast<int32_t>(in.Range(0, t - 1));
      if (in.Chance(6)) parents[r] = static_cast<int32_t>(in.Range(-2, t + 1));
    }
  }
  std::vector<int32_t> accepted(alloc, kPoison), kept(alloc, kPoison), freed(alloc, kPoison);
  std::vector<int32_t> num_accepted(batch, kPoison), bonus(batch, kPoison);
  k::TreeAcceptParams p;
  p.batch = batch;
  p.row_indptr = indptr.data();
  p.tokens = tokens.data();
  p.parents = parents.data();
  p.predictions = predictions.data();
  const bool with_slots = in.Bool();
  p.tail_slots = with_slots ? tail.data() : nullptr;
  p.accepted = accepted.data();
  p.num_accepted = num_accepted.data();
  p.bonus = bonus.data();
  p.kept_slots = kept.data();
  p.freed_slots = freed.data();
  const absl::Status st = k::TreeAcceptReference(p);
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  for (int b = 0; b < batch; ++b) {
    const int32_t row0 = indptr[b], n = indptr[b + 1] - indptr[b];
    FUZZ_CHECK(n >= 1);
    const int32_t na = num_accepted[b];
    FUZZ_CHECK(na >= 0 && na < n);
    std::vector<int32_t> lt(tokens.begin() + row0, tokens.begin() + row0 + n);
    std::vector<int32_t> lp(parents.begin() + row0, parents.begin() + row0 + n);
    std::vector<int32_t> lpred(predictions.begin() + row0, predictions.begin() + row0 + n);
    const k::TreeAcceptResult single = k::AcceptTreeGreedy(lt, lp, lpred);
    FUZZ_CHECK(static_cast<int32_t>(single.accepted_rows.size()) == na);
    FUZZ_CHECK(single.bonus == bonus[b]);
    int32_t prev = 0;
    for (int32_t i = 0; i < na; ++i) {
      const int32_t row = accepted[row0 + i];
      FUZZ_CHECK(row == single.accepted_rows[i]);
      FUZZ_CHECK(row >= 1 && row < n && lp[row] == prev && lt[row] == lpred[prev]);
      prev = row;
    }
    for (int32_t t = 1; t < n; ++t) FUZZ_CHECK(!(lp[t] == prev && lt[t] == lpred[prev]));
    FUZZ_CHECK(bonus[b] == lpred[prev]);
    if (with_slots) {
      std::multiset<int32_t> got(kept.begin() + row0, kept.begin() + row0 + 1 + na);
      got.insert(freed.begin() + row0, freed.begin() + row0 + (n - 1 - na));
      FUZZ_CHECK(got == std::multiset<int32_t>(tail.begin() + row0, tail.begin() + row0 + n));
      FUZZ_CHECK(kept[row0] == tail[row0]);
    }
  }
}

void FuzzVerifyAttention(ByteReader& in) {
  k::VerifyAttentionParams p;
  p.batch = static_cast<int>(in.Range(-1, 4));
  p.num_heads = static_cast<int>(in.Range(0, 3));
  p.qk_dim = static_cast<int>(in.Range(0, 6));
  p.v_dim = static_cast<int>(in.Range(0, 6));
  p.dtype = in.Bool() ? k::DType::kFloat32 : k::DType::kBFloat16;
  if (in.Chance(8)) p.dtype = static_cast<k::DType>(in.Range(2, 5));
  p.mask_words = static_cast<int>(in.Range(0, 3));
  p.kv_slots = in.Range(-1, 16);
  p.softmax_scale = in.Chance(8) ? std::numeric_limits<float>::quiet_NaN() : 0.5f;
  const int batch = std::max(p.batch, 0);
  std::vector<int32_t> q_indptr = ReadIndptr(in, batch, 0, 5);
  std::vector<int32_t> kv_indptr = ReadIndptr(in, batch, 0, 9);
  p.total_rows = in.Chance(16) ? static_cast<int>(in.Range(-1, 20)) : q_indptr[batch];
  // Buffers sized by the declared fields (clamped at 0 for negative declarations).
  const size_t rows = std::max(p.total_rows, 0);
  const size_t heads = std::max(p.num_heads, 0);
  const size_t qk = std::max(p.qk_dim, 0), v = std::max(p.v_dim, 0);
  const size_t elem = p.dtype == k::DType::kFloat32 ? 4 : 2;
  const size_t nslots = static_cast<size_t>(std::max<int64_t>(p.kv_slots, 0));
  const size_t nidx = std::max(kv_indptr[batch], 0);
  std::vector<uint8_t> q(rows * heads * qk * elem), kv(nslots * qk * elem);
  std::vector<uint8_t> out(rows * heads * v * elem, 0xFF);
  std::vector<float> lse(rows * heads, std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> kv_indices(nidx);
  std::vector<uint64_t> mask(rows * static_cast<size_t>(std::max(p.mask_words, 0)));
  // Small finite values: bf16 0x3F80 = 1.0, float 1.0f; varied by the input.
  for (size_t i = 0; i + elem <= q.size(); i += elem) q[i + elem - 1] = in.Bool() ? 0x3F : 0xBF;
  for (size_t i = 0; i + elem <= kv.size(); i += elem) kv[i + elem - 1] = in.Bool() ? 0x3F : 0x3E;
  for (auto& s : kv_indices)
    s = static_cast<int32_t>(in.Chance(8) ? in.Range(-2, 40)
                                          : in.Range(0, std::max<int64_t>(p.kv_slots - 1, 0)));
  for (auto& m : mask) m = (static_cast<uint64_t>(in.U32()) << 32) | in.U32();
  p.q = q.empty() && in.Chance(32) ? nullptr : q.data();
  p.kv = kv.data();
  p.q_indptr = q_indptr.data();
  p.kv_indptr = kv_indptr.data();
  p.kv_indices = kv_indices.data();
  p.tree_mask = mask.data();
  p.out = out.data();
  p.lse = in.Bool() ? lse.data() : nullptr;
  const absl::Status st = k::VerifyAttentionReference(p);
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  FUZZ_CHECK(q_indptr[batch] == p.total_rows);
  if (p.dtype == k::DType::kFloat32) {
    const float* o = reinterpret_cast<const float*>(out.data());
    for (size_t i = 0; i < rows * heads * v; ++i) FUZZ_CHECK(std::isfinite(o[i]));
  }
  if (p.lse) {
    for (float x : lse) FUZZ_CHECK(!std::isnan(x));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  if (in.Byte() & 1) {
    FuzzVerifyAttention(in);
  } else {
    FuzzTreeAccept(in);
  }
  return 0;
}
