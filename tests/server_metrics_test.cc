// server/metrics.h on its own: the model_name label on every verifyd_ series, and every
// (method, code) series of verifyd_requests_total at zero before the first call.
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/metrics.h"

namespace verifyd::server {
namespace {

std::string Exposition(const Metrics& m) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, m.registry()->Collect());
  return out.str();
}

// The sample lines (no comments) of the verifyd_ families.
std::vector<std::string> Samples(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "verifyd_")) out.emplace_back(line);
  }
  return out;
}

TEST(Metrics, EverySeriesCarriesTheModelName) {
  Metrics m(/*tp_size=*/2, "1.2.3", "cpu", "kimi-k2");
  m.ObserveTree({1, 1, 2}, 1);
  m.ObservePrefill(0.001, 0.002, 0.003, 7, false);
  m.CountRequest("Verify", "OK");
  const std::vector<std::string> samples = Samples(Exposition(m));
  ASSERT_GT(samples.size(), 200u);
  for (const std::string& s : samples) {
    EXPECT_THAT(s, ::testing::HasSubstr("model_name=\"kimi-k2\"")) << s;
  }
}

TEST(Metrics, NoModelNameNoLabel) {
  Metrics m(1, "1.2.3", "cpu");
  EXPECT_THAT(Exposition(m), ::testing::Not(::testing::HasSubstr("model_name")));
}

TEST(Metrics, EveryRequestSeriesExistsAtZero) {
  Metrics m(1, "1.2.3", "cpu", "m");
  int zero = 0;
  for (const std::string& s : Samples(Exposition(m))) {
    if (absl::StartsWith(s, "verifyd_requests_total{") && absl::EndsWith(s, "} 0")) ++zero;
  }
  EXPECT_EQ(zero, 7 * 17);  // the 7 RPCs x the 17 gRPC codes
  const std::string text = Exposition(m);
  for (const char* method : {"GetInfo", "OpenSession", "Verify", "VerifyStream", "CloseSession",
                             "TruncateSession", "ForkSession"}) {
    // prometheus-cpp prints the constant label first.
    const std::string series = absl::StrCat(
        "verifyd_requests_total{model_name=\"m\",code=\"RESOURCE_EXHAUSTED\",method=\"", method,
        "\"} 0");
    EXPECT_TRUE(absl::StrContains(text, series)) << series;
  }
}

}  // namespace
}  // namespace verifyd::server
