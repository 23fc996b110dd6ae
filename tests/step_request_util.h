// Test helper shared by the engine tests: a prefill chain StepRequest.
#pragma once

#include <cstdint>
#include <vector>

#include "tp/engine.h"

namespace verifyd::test_util {

// A prefill chunk of `tokens` as a chain (parents t - 1) on tail slots [first, first + n).
inline tp::StepRequest PrefillChain(const std::vector<int32_t>& tokens, int32_t first) {
  tp::StepRequest q;
  q.tokens = tokens;
  for (size_t t = 0; t < tokens.size(); ++t) {
    q.parents.push_back(static_cast<int32_t>(t) - 1);
    q.tail_slots.push_back(first + static_cast<int32_t>(t));
  }
  q.accept = false;
  return q;
}

}  // namespace verifyd::test_util
