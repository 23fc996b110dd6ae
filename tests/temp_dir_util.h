// Test helper shared by the checkpoint and weight tests: a fresh directory for a test's files.
// Thread-safety: reentrant.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

namespace verifyd::test_util {

// Creates <system temp dir>/<prefix><tag>_<pid>_<random> and returns its path; the caller
// removes it.
inline std::string MakeTempDir(const std::string& prefix, const std::string& tag) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() / (prefix + tag + "_" + std::to_string(getpid()) +
                                                "_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace verifyd::test_util
