// Plain C++ greedy tree acceptance and KV commit (see kernels/tree_accept.h): the CPU
// backend's acceptance and the oracle for the CUDA version.
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/tree_accept.h"

namespace verifyd::kernels {
namespace {

// Checks pointers, row_indptr (starts at 0, every request has >= 1 row: the root) and
// parents (local row 0 has -1, local row t >= 1 has a parent in [0, t)).
absl::Status ValidateTreeAccept(const TreeAcceptParams& p) {
  if (p.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", p.batch));
  }
  const std::pair<const void*, const char*> required[] = {
      {p.row_indptr, "row_indptr"}, {p.tokens, "tokens"},
      {p.parents, "parents"},       {p.predictions, "predictions"},
      {p.accepted, "accepted"},     {p.num_accepted, "num_accepted"},
      {p.bonus, "bonus"},
  };
  for (const auto& [ptr, name] : required) {
    if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " is null"));
  }
  if (p.tail_slots != nullptr && (p.kept_slots == nullptr || p.freed_slots == nullptr)) {
    return absl::InvalidArgumentError(
        "kept_slots and freed_slots must be set when tail_slots is set");
  }
  if (p.row_indptr[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_indptr[0] must be 0, got ", p.row_indptr[0]));
  }
  for (int b = 0; b < p.batch; ++b) {
    const int32_t row0 = p.row_indptr[b];
    const int32_t n = p.row_indptr[b + 1] - row0;
    if (n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("row_indptr: request ", b, " has ", n,
                                                     " rows; it needs at least the root row"));
    }
  }
  for (int b = 0; b < p.batch; ++b) {
    const int32_t row0 = p.row_indptr[b];
    const int32_t n = p.row_indptr[b + 1] - row0;
    if (p.parents[row0] != -1) {
      return absl::InvalidArgumentError(absl::StrCat("parents[", row0, "] = ", p.parents[row0],
                                                     ": the root row of request ", b,
                                                     " must have parent -1"));
    }
    for (int32_t t = 1; t < n; ++t) {
      const int32_t parent = p.parents[row0 + t];
      if (parent < 0 || parent >= t) {
        return absl::InvalidArgumentError(absl::StrCat("parents[", row0 + t, "] = ", parent,
                                                       " (request ", b, ", local row ", t,
                                                       ") must be in [0, ", t, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TreeAcceptReference(const TreeAcceptParams& p) {
  if (absl::Status s = ValidateTreeAccept(p); !s.ok()) return s;
  std::vector<char> on_path;
  for (int b = 0; b < p.batch; ++b) {
    const int32_t row0 = p.row_indptr[b];
    const int32_t n = p.row_indptr[b + 1] - row0;
    const int32_t* parents = p.parents + row0;
    const int32_t* tokens = p.tokens + row0;
    const int32_t* predictions = p.predictions + row0;
    int32_t* accepted = p.accepted + row0;

    // Walk from the root. Children of c all have a local index > c (parents are
    // topological), so scanning t = c+1, c+2, ... finds the lowest-index matching child.
    int32_t count = 0;
    int32_t c = 0;
    for (;;) {
      int32_t next = -1;
      for (int32_t t = c + 1; t < n; ++t) {
        if (parents[t] == c && tokens[t] == predictions[c]) {
          next = t;
          break;
        }
      }
      if (next < 0) break;
      accepted[count++] = next;
      c = next;
    }
    p.num_accepted[b] = count;
    p.bonus[b] = predictions[c];

    if (p.tail_slots == nullptr) continue;
    // KV commit: root and accepted path kept (path order), the rest freed (row order).
    const int32_t* slots = p.tail_slots + row0;
    int32_t* kept = p.kept_slots + row0;
    int32_t* freed = p.freed_slots + row0;
    on_path.assign(static_cast<size_t>(n), 0);
    on_path[0] = 1;
    kept[0] = slots[0];
    for (int32_t i = 0; i < count; ++i) {
      on_path[accepted[i]] = 1;
      kept[1 + i] = slots[accepted[i]];
    }
    int32_t num_freed = 0;
    for (int32_t t = 1; t < n; ++t) {
      if (!on_path[t]) freed[num_freed++] = slots[t];
    }
  }
  return absl::OkStatus();
}

TreeAcceptResult AcceptTreeGreedy(const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& parents,
                                  const std::vector<int32_t>& predictions) {
  // Invalid input (empty, sizes differ, bad parents) gives no accepted rows and bonus -1.
  TreeAcceptResult result;
  const size_t n = tokens.size();
  if (n == 0 || parents.size() != n || predictions.size() != n) return result;
  const int32_t indptr[2] = {0, static_cast<int32_t>(n)};
  std::vector<int32_t> accepted(n);
  int32_t num_accepted = 0, bonus = -1;
  TreeAcceptParams p;
  p.batch = 1;
  p.row_indptr = indptr;
  p.tokens = tokens.data();
  p.parents = parents.data();
  p.predictions = predictions.data();
  p.accepted = accepted.data();
  p.num_accepted = &num_accepted;
  p.bonus = &bonus;
  if (!TreeAcceptReference(p).ok()) return result;
  result.accepted_rows.assign(accepted.begin(), accepted.begin() + num_accepted);
  result.bonus = bonus;
  return result;
}

}  // namespace verifyd::kernels
