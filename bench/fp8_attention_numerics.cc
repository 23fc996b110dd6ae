// What a verify attention kernel's own arithmetic adds to the error of the FP8 latent KV cache
// (kernels/kv_fp8.h), for the arithmetic of the kernels that read it and of a candidate design,
// emulated on the CPU at Kimi-K2's dimensions (kv_lora 512 in four 128-column scale groups,
// rope 64, softmax scale 1/sqrt(192)). The baseline is float64 attention over the same stored
// bytes (the dequantized rows), so the format's own error is not counted; kv_fp8_accuracy
// measures that one.
//
// Every variant walks the keys in 64-key tiles as the kernels do: S of the tile, its own
// maximum, P = exp(S - max), a partial output and row sum per tile, merged exactly at the end
// (the kernels' running rescale does the same up to float rounding). Variants:
//   bf16_dequant   the 16-row mma.sync FP8 path: keys dequantized and rounded to bf16, Q in
//                  bf16, P in bf16 (float accumulation)
//   km16           the keys-on-M kernel: codes exact (f16 operands), Q's 512 columns in f16 times
//                  a power of two per row, rope bf16; P_g = P x scale_g x 2^c in f16, c per tile
//   q_e4m3_row     e4m3 Q (one float scale per row and head; rope bf16), P float: the Q K^T
//                  error alone
//   q_e4m3_group   e4m3 Q with a scale per 128-column group, P float
//   p_e4m3         Q float, P_g = P x scale_g x 2^c_g in e4m3 (c_g per tile and group, the
//                  largest value of the tile's group just under 448): the P V error alone
//   e4m3_both      q_e4m3_group and p_e4m3 together: e4m3 tensor-core math for both products
//   q_e4m3x2 / p_e4m3x2 / e4m3x2_both
//                  the same with each operand split into two e4m3 terms, hi = e4m3(x) and
//                  lo = e4m3(x - hi) with its own scale (Q: a float scale per group; P: 2^5),
//                  i.e. two e4m3 products per product: the bf16 rate, on the landed codes
//   f16_tile       each landed tile dequantized once into f16 (code x f16(scale x 2^-e), e per
//                  64-key tile so that the tile's largest value fits, rope too), Q in f16 times
//                  a power of two per row, P in f16 times 2^c per tile: one accumulator for S,
//                  no per-group state (the tile's 2^e folds into S and P V)
// Row sums use the unrounded P (float) in every variant. Reported per (row, head): rel-L2 of
// the output against the float64 baseline and |LSE| error, mean and max.
//
// Inputs: random latent rows (i.i.d. channels, or channels with log-normal gains: outlier
// channels as real caches have), Q ~ N(0, sigma^2) for sigma 1 (flat attention over long
// contexts, the hardest case for P's rounding) and 4 (peaked).
// A benchmark: prints a table and writes JSON (--json); it asserts nothing.
//   fp8_attention_numerics [--contexts=1024,16384] [--heads=16] [--rows=2] [--json=FILE]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "kernels/common.h"
#include "kernels/kv_fp8.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, contexts, "1024,16384", "context lengths (keys per row)");
ABSL_FLAG(int, heads, 16, "heads per row");
ABSL_FLAG(int, rows, 2, "query rows");
ABSL_FLAG(std::string, json, "", "write the results as JSON here");

namespace {

using namespace verifyd;
using kernels::Fp8E4m3FromFloat;
using kernels::Fp8E4m3ToFloat;
using kernels::RoundToBf16;

constexpr int kKvl = 512, kRope = 64, kLat = kKvl + kRope, kGroup = 128, kGroups = kKvl / kGroup;
constexpr int kTile = 64;
const float kSoftmaxScale = 1.0f / std::sqrt(192.0f);

// Round to the nearest IEEE half (ties to even, subnormals below 2^-14; callers keep values
// under 65504).
float RoundToF16(float x) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(std::fabs(x), &e);                   // |x| = f * 2^e, f in [0.5, 1)
  const int quantum = std::max(e - 1, -14) - 10;  // 11 significant bits, or the subnormal step
  return std::ldexp(std::nearbyint(std::ldexp(x, -quantum)), quantum);
}

float RoundToE4m3(float x) { return Fp8E4m3ToFloat(Fp8E4m3FromFloat(x)); }

enum class Variant {
  kBf16Dequant,
  kKm16,
  kQE4m3Row,
  kQE4m3Group,
  kPE4m3,
  kE4m3Both,
  kQE4m3x2,
  kPE4m3x2,
  kE4m3x2Both,
  kF16Tile
};
// Every variant with its name (the table's and the JSON's), in the order they are reported.
const struct {
  Variant variant;
  const char* name;
} kVariants[] = {
    {Variant::kBf16Dequant, "bf16_dequant"},
    {Variant::kKm16, "km16"},
    {Variant::kQE4m3Row, "q_e4m3_row"},
    {Variant::kQE4m3Group, "q_e4m3_group"},
    {Variant::kPE4m3, "p_e4m3"},
    {Variant::kE4m3Both, "e4m3_both"},
    {Variant::kQE4m3x2, "q_e4m3x2"},
    {Variant::kPE4m3x2, "p_e4m3x2"},
    {Variant::kE4m3x2Both, "e4m3x2_both"},
    {Variant::kF16Tile, "f16_tile"},
};

// The stored cache: codes as floats (exact e4m3 values), scales per (key, group), rope bf16.
struct Cache {
  int64_t keys = 0;
  std::vector<float> code;   // [keys][512]
  std::vector<float> scale;  // [keys][4]
  std::vector<float> rope;   // [keys][64]
  float Deq(int64_t k, int j) const { return code[k * kKvl + j] * scale[k * kGroups + j / kGroup]; }
};

Cache MakeCache(int64_t keys, bool outliers, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> gain(kLat, 1.f);
  if (outliers) {
    std::lognormal_distribution<float> ln(0.f, 1.f);
    for (int c = 0; c < kKvl; ++c) gain[c] = ln(rng);
  }
  Cache c;
  c.keys = keys;
  c.code.resize(keys * kKvl);
  c.scale.resize(keys * kGroups);
  c.rope.resize(keys * kRope);
  std::vector<float> row(kLat), deq(kLat);
  std::vector<uint8_t> bytes(kernels::KvFp8RowBytes(kKvl, kRope, kGroup));
  for (int64_t k = 0; k < keys; ++k) {
    for (int j = 0; j < kLat; ++j) row[j] = nd(rng) * gain[j];
    kernels::KvFp8EncodeRow(row.data(), kKvl, kRope, kGroup, bytes.data());
    kernels::KvFp8DecodeRow(bytes.data(), kKvl, kRope, kGroup, deq.data());
    for (int g = 0; g < kGroups; ++g) {
      float s = 0.0f;
      std::memcpy(&s, bytes.data() + kernels::KvFp8ScaleOffset(kKvl) + 4 * g, 4);
      c.scale[k * kGroups + g] = s;
    }
    for (int j = 0; j < kKvl; ++j) c.code[k * kKvl + j] = Fp8E4m3ToFloat(bytes[j]);
    for (int j = 0; j < kRope; ++j) c.rope[k * kRope + j] = deq[kKvl + j];
  }
  return c;
}

// float64 attention of one query over the stored rows: output [512] and LSE (natural log,
// of the scaled scores).
void Baseline(const Cache& c, const std::vector<float>& q, std::vector<double>* out, double* lse) {
  std::vector<double> s(c.keys);
  double m = -INFINITY;
  for (int64_t k = 0; k < c.keys; ++k) {
    double d = 0;
    for (int j = 0; j < kKvl; ++j) d += static_cast<double>(q[j]) * c.Deq(k, j);
    for (int j = 0; j < kRope; ++j) d += static_cast<double>(q[kKvl + j]) * c.rope[k * kRope + j];
    s[k] = d * kSoftmaxScale;
    m = std::max(m, s[k]);
  }
  out->assign(kKvl, 0.0);
  double l = 0;
  for (int64_t k = 0; k < c.keys; ++k) {
    const double p = std::exp(s[k] - m);
    l += p;
    for (int j = 0; j < kKvl; ++j) (*out)[j] += p * c.Deq(k, j);
  }
  for (double& x : *out) x /= l;
  *lse = m + std::log(l);
}

// The variant's arithmetic: products in double over the values the variant rounds to (tensor
// cores accumulate exactly enough for this comparison), softmax in float.
void Emulate(Variant v, const Cache& c, const std::vector<float>& q, std::vector<double>* out,
             double* lse) {
  // Q as the variant holds it: value[j] = qv[j] * qscale[group of j] (rope: qr).
  std::vector<float> qv(kKvl), qr(kRope);
  float qscale[kGroups] = {1, 1, 1, 1};
  const bool q_split = v == Variant::kQE4m3x2 || v == Variant::kE4m3x2Both;
  const bool p_split = v == Variant::kPE4m3x2 || v == Variant::kE4m3x2Both;
  const bool q_e4m3 =
      v == Variant::kQE4m3Row || v == Variant::kQE4m3Group || v == Variant::kE4m3Both || q_split;
  if (v == Variant::kBf16Dequant) {
    for (int j = 0; j < kKvl; ++j) qv[j] = RoundToBf16(q[j]);
  } else if (v == Variant::kKm16 || v == Variant::kF16Tile) {
    float amax = 0;
    for (int j = 0; j < kKvl; ++j) amax = std::max(amax, std::fabs(q[j]));
    int e = 0;
    std::frexp(amax, &e);  // amax < 2^e: scale the row so that its largest is ~2^14 in f16
    const float p2 = std::ldexp(1.0f, 14 - e);
    for (int j = 0; j < kKvl; ++j) qv[j] = RoundToF16(q[j] * p2);
    for (float& s : qscale) s = 1.0f / p2;
  } else if (q_e4m3) {
    const bool per_group = v != Variant::kQE4m3Row;
    for (int g = 0; g < kGroups; ++g) {
      const int b = per_group ? g * kGroup : 0, e = per_group ? b + kGroup : kKvl;
      float amax = 0;
      for (int j = b; j < e; ++j) amax = std::max(amax, std::fabs(q[j]));
      qscale[g] = std::max(amax, 1e-30f) / kernels::kE4m3Max;
    }
    for (int j = 0; j < kKvl; ++j) qv[j] = RoundToE4m3(q[j] / qscale[j / kGroup]);
    if (q_split) {  // + lo = e4m3(residual / s_lo) * s_lo, s_lo per group (a second product)
      for (int g = 0; g < kGroups; ++g) {
        float rmax = 0;
        for (int j = g * kGroup; j < (g + 1) * kGroup; ++j) {
          rmax = std::max(rmax, std::fabs(q[j] / qscale[g] - qv[j]));
        }
        const float s_lo = std::max(rmax, 1e-30f) / kernels::kE4m3Max;
        for (int j = g * kGroup; j < (g + 1) * kGroup; ++j) {
          qv[j] += RoundToE4m3((q[j] / qscale[g] - qv[j]) / s_lo) * s_lo;
        }
      }
    }
  } else {
    qv.assign(q.begin(), q.begin() + kKvl);
  }
  for (int j = 0; j < kRope; ++j) {  // the rope columns stay bf16 (p_e4m3: Q all float)
    qr[j] = v == Variant::kPE4m3 || v == Variant::kPE4m3x2 ? q[kKvl + j] : RoundToBf16(q[kKvl + j]);
  }
  const bool bf16_keys = v == Variant::kBf16Dequant;

  // f16_tile: Q's rope columns share the row's power of two (one accumulator).
  std::vector<float> qr16(kRope), ktile(v == Variant::kF16Tile ? kTile * kLat : 0);
  for (int j = 0; j < kRope; ++j) qr16[j] = RoundToF16(q[kKvl + j] / qscale[0]);
  int tile_shift = 0;
  std::vector<double> acc(kKvl, 0.0);
  double m_all = -INFINITY, l_all = 0;
  std::vector<float> s(kTile), p(kTile);
  std::vector<double> o(kKvl);
  for (int64_t t0 = 0; t0 < c.keys; t0 += kTile) {
    const int n = static_cast<int>(std::min<int64_t>(kTile, c.keys - t0));
    float m = -INFINITY;
    if (v == Variant::kF16Tile) {  // the tile in f16, shifted by 2^-e so that it fits
      float amax = 0;
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < kKvl; ++j) amax = std::max(amax, std::fabs(c.Deq(t0 + i, j)));
        for (int j = 0; j < kRope; ++j)
          amax = std::max(amax, std::fabs(c.rope[(t0 + i) * kRope + j]));
      }
      int e = 0;
      std::frexp(std::max(amax, 1e-30f), &e);  // amax < 2^e; the tile's largest in [2^14, 2^15)
      tile_shift = 15 - e;
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < kKvl; ++j) {
          const float sc =
              RoundToF16(std::ldexp(c.scale[(t0 + i) * kGroups + j / kGroup], tile_shift));
          ktile[i * kLat + j] = RoundToF16(c.code[(t0 + i) * kKvl + j] * sc);
        }
        for (int j = 0; j < kRope; ++j) {
          ktile[i * kLat + kKvl + j] =
              RoundToF16(std::ldexp(c.rope[(t0 + i) * kRope + j], tile_shift));
        }
      }
    }
    for (int i = 0; i < n && v == Variant::kF16Tile; ++i) {
      double d = 0;
      for (int j = 0; j < kKvl; ++j) d += static_cast<double>(qv[j]) * ktile[i * kLat + j];
      for (int j = 0; j < kRope; ++j)
        d += static_cast<double>(qr16[j]) * ktile[i * kLat + kKvl + j];
      s[i] = static_cast<float>(std::ldexp(d * qscale[0], -tile_shift)) * kSoftmaxScale;
      m = std::max(m, s[i]);
    }
    for (int i = 0; i < n && v != Variant::kF16Tile; ++i) {
      const int64_t k = t0 + i;
      double d = 0;
      for (int g = 0; g < kGroups; ++g) {
        double dg = 0;
        for (int j = g * kGroup; j < (g + 1) * kGroup; ++j) {
          const double kv = bf16_keys ? RoundToBf16(c.Deq(k, j)) : c.code[k * kKvl + j];
          dg += static_cast<double>(qv[j]) * kv;
        }
        d += bf16_keys ? dg : dg * c.scale[k * kGroups + g] * qscale[g];
      }
      for (int j = 0; j < kRope; ++j) d += static_cast<double>(qr[j]) * c.rope[k * kRope + j];
      s[i] = static_cast<float>(d) * kSoftmaxScale;
      m = std::max(m, s[i]);
    }
    float l = 0;
    for (int i = 0; i < n; ++i) {
      p[i] = std::exp(s[i] - m);
      l += p[i];
    }
    std::fill(o.begin(), o.end(), 0.0);
    if (v == Variant::kF16Tile) {  // P x 2^c in f16 (largest in [2^14, 2^15)) times the f16 V
      float mx = 0;
      for (int i = 0; i < n; ++i) mx = std::max(mx, p[i]);
      int e = 0;
      std::frexp(mx, &e);
      const int cexp = 15 - e;
      for (int i = 0; i < n; ++i) {
        const double r =
            std::ldexp(static_cast<double>(RoundToF16(std::ldexp(p[i], cexp))), -cexp - tile_shift);
        for (int j = 0; j < kKvl; ++j) o[j] += r * ktile[i * kLat + j];
      }
    } else if (v == Variant::kBf16Dequant) {
      for (int i = 0; i < n; ++i) {
        const double pb = RoundToBf16(p[i]);
        for (int j = 0; j < kKvl; ++j) o[j] += pb * RoundToBf16(c.Deq(t0 + i, j));
      }
    } else if (v == Variant::kKm16 || v == Variant::kPE4m3 || v == Variant::kE4m3Both || p_split) {
      // P_g = P x scale_g x 2^c, rounded (f16 or e4m3), times the exact codes; 2^-c after.
      const bool e4m3 = v != Variant::kKm16;
      for (int g = 0; g < kGroups; ++g) {
        float mx = 0;
        for (int i = 0; i < n; ++i) mx = std::max(mx, p[i] * c.scale[(t0 + i) * kGroups + g]);
        if (mx == 0) continue;
        int e = 0;
        std::frexp(mx, &e);                    // mx < 2^e
        const int cexp = (e4m3 ? 8 : 15) - e;  // largest value in [2^7, 2^8) or [2^14, 2^15)
        for (int i = 0; i < n; ++i) {
          const float pg = std::ldexp(p[i] * c.scale[(t0 + i) * kGroups + g], cexp);
          double r = e4m3 ? RoundToE4m3(pg) : RoundToF16(pg);
          if (p_split) r += std::ldexp(RoundToE4m3(std::ldexp(pg - static_cast<float>(r), 5)), -5);
          r = std::ldexp(r, -cexp);
          for (int j = g * kGroup; j < (g + 1) * kGroup; ++j)
            o[j] += r * c.code[(t0 + i) * kKvl + j];
        }
      }
    } else {
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < kKvl; ++j) o[j] += static_cast<double>(p[i]) * c.Deq(t0 + i, j);
      }
    }
    // Merge the tile exactly.
    const double m_new = std::max<double>(m_all, m);
    const double a = std::exp(m_all - m_new), b = std::exp(m - m_new);
    for (int j = 0; j < kKvl; ++j) acc[j] = acc[j] * a + o[j] * b;
    l_all = l_all * a + l * b;
    m_all = m_new;
  }
  out->resize(kKvl);
  for (int j = 0; j < kKvl; ++j) (*out)[j] = acc[j] / l_all;
  *lse = m_all + std::log(l_all);
}

std::vector<int64_t> Ints(const std::string& s) {
  return bench::ParseIntList(s, bench::ListEntries::kPositive);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int heads = std::max(1, absl::GetFlag(FLAGS_heads));
  const int rows = std::max(1, absl::GetFlag(FLAGS_rows));
  nlohmann::json results = nlohmann::json::array();
  std::printf(
      "error added by the kernel arithmetic, against float64 attention over the same FP8 "
      "bytes (%d rows x %d heads per case)\n",
      rows, heads);
  std::printf(
      "| context | channels | Q sigma | variant | out rel-L2 mean | max | LSE abs mean | "
      "max |\n|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(20261202);
  for (const int64_t ctx : Ints(absl::GetFlag(FLAGS_contexts))) {
    for (const bool outliers : {false, true}) {
      const Cache cache = MakeCache(ctx, outliers, rng);
      for (const float sigma : {1.0f, 4.0f}) {
        std::normal_distribution<float> nd(0.f, sigma);
        std::vector<std::vector<float>> qs(static_cast<size_t>(rows) * heads,
                                           std::vector<float>(kLat));
        for (auto& q : qs) {
          for (float& x : q) x = nd(rng);
        }
        std::vector<std::vector<double>> ref_out(qs.size());
        std::vector<double> ref_lse(qs.size());
        for (size_t i = 0; i < qs.size(); ++i) Baseline(cache, qs[i], &ref_out[i], &ref_lse[i]);
        for (const auto& [v, name] : kVariants) {
          double rel_sum = 0, rel_max = 0, lse_sum = 0, lse_max = 0;
          for (size_t i = 0; i < qs.size(); ++i) {
            std::vector<double> out;
            double lse = 0;
            Emulate(v, cache, qs[i], &out, &lse);
            double num = 0, den = 0;
            for (int j = 0; j < kKvl; ++j) {
              num += (out[j] - ref_out[i][j]) * (out[j] - ref_out[i][j]);
              den += ref_out[i][j] * ref_out[i][j];
            }
            const double rel = std::sqrt(num / std::max(den, 1e-300));
            const double dl = std::fabs(lse - ref_lse[i]);
            rel_sum += rel;
            rel_max = std::max(rel_max, rel);
            lse_sum += dl;
            lse_max = std::max(lse_max, dl);
          }
          const double n = static_cast<double>(qs.size());
          const char* channels = outliers ? "log-normal gains" : "iid";
          std::printf("| %lld | %s | %.0f | %s | %.2e | %.2e | %.2e | %.2e |\n",
                      static_cast<long long>(ctx), channels, sigma, name, rel_sum / n, rel_max,
                      lse_sum / n, lse_max);
          std::fflush(stdout);
          results.push_back({{"context", ctx},
                             {"channels", channels},
                             {"q_sigma", sigma},
                             {"variant", name},
                             {"out_rel_l2_mean", rel_sum / n},
                             {"out_rel_l2_max", rel_max},
                             {"lse_abs_mean", lse_sum / n},
                             {"lse_abs_max", lse_max}});
        }
      }
    }
  }
  const std::string path = absl::GetFlag(FLAGS_json);
  if (!path.empty()) {
    nlohmann::json j;
    j["bench"] = "fp8_attention_numerics";
    j["meta"] = {{"heads", heads},
                 {"rows", rows},
                 {"kv_lora", kKvl},
                 {"rope", kRope},
                 {"group", kGroup},
                 {"tile", kTile},
                 {"softmax_scale", kSoftmaxScale}};
    j["results"] = results;
    std::ofstream(path) << j.dump(1) << "\n";
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}
