// What several benchmark programs under bench/ share (host only, header-only): their
// comma-separated integer list flags ("--rows=1,8,64").
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace verifyd::bench {

// Which entries of a list flag ParseIntList keeps.
enum class ListEntries {
  kParsed,          // every entry that parses as an integer; the others are dropped
  kPositive,        // entries that parse and are > 0; the others are dropped
  kPositiveOrExit,  // entries that parse and are > 0; any other: "bad list entry '<entry>'" on
                    // stderr and exit status 2
};

// The integers of a comma-separated list, in order; empty entries are skipped.
template <typename T = int64_t>
std::vector<T> ParseIntList(absl::string_view s, ListEntries keep) {
  std::vector<T> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    T v = 0;
    if (absl::SimpleAtoi(part, &v) && (keep == ListEntries::kParsed || v > 0)) {
      out.push_back(v);
    } else if (keep == ListEntries::kPositiveOrExit) {
      std::fprintf(stderr, "bad list entry '%s'\n", std::string(part).c_str());
      std::exit(2);
    }
  }
  return out;
}

}  // namespace verifyd::bench
