// The C++ reference of sampled token selection and logprobs (the definition is in
// kernels/sampling.h): the CPU backend's implementation and the oracle of the CUDA kernel
// (kernels/cuda/sampling/sampling.h). One row of full-vocabulary logits at a time, so a row's
// result never depends on other rows (batch-invariant).
//
// Thread-safety: pure functions over caller-owned buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sampling.h"

namespace verifyd::kernels::ref {

// Which tokens survive top-k then top-p for `p` (greedy params keep every non-NaN token).
// keep[vocab]: 1 = kept.
void SamplingKeptSet(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::vector<uint8_t>* keep);

// The distribution a sampled draw follows: softmax of the scaled logits over the kept set,
// 0 elsewhere ([vocab], double). Greedy params: 1 on the argmax.
std::vector<double> SamplingDistribution(const float* logits, int64_t vocab,
                                         const SamplingParams& p);

// The token drawn for absolute position `position` (the row at position - 1 predicts it):
// Gumbel-max over the kept set when p.sampled(), else the argmax (lowest id on ties). -1 when
// every logit is NaN.
int32_t SampleToken(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position);

struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0;
  std::vector<int32_t> top_tokens;  // best first (z descending, lower id on ties)
  std::vector<float> top_logprobs;
};

// Logprob of `token` and the best `top_n` (0..kMaxTopLogprobs) tokens: log-softmax of
// logits / temperature over the whole vocabulary (raw logits when `sampled` is false).
TokenLogprobs ComputeLogprobs(const float* logits, int64_t vocab, float temperature, bool sampled,
                              int32_t token, int top_n);

}  // namespace verifyd::kernels::ref
