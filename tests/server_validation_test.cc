// Request validation: every bad field gives InvalidArgument naming it; good input passes.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/validation.h"

namespace verifyd::server {
namespace {

using ::testing::HasSubstr;

ApiLimits Limits() {
  ApiLimits l;
  l.vocab_size = 100;
  l.max_draft_nodes = 4;
  l.max_context = 32;
  l.max_batch = 2;
  return l;
}

verify::v1::DraftTree Tree(std::vector<int32_t> tokens, std::vector<int32_t> parents) {
  verify::v1::DraftTree t;
  for (int32_t x : tokens) t.add_tokens(x);
  for (int32_t x : parents) t.add_parents(x);
  return t;
}

void ExpectInvalid(const absl::Status& st, const std::string& field) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(field));
}

TEST(Validation, Prompt) {
  verify::v1::OpenSessionRequest req;
  ExpectInvalid(ValidatePrompt(req, Limits()), "prompt_tokens");
  req.add_prompt_tokens(5);
  req.add_prompt_tokens(100);
  ExpectInvalid(ValidatePrompt(req, Limits()), "prompt_tokens[1]");
  req.set_prompt_tokens(1, -1);
  ExpectInvalid(ValidatePrompt(req, Limits()), "prompt_tokens[1]");
  req.set_prompt_tokens(1, 99);
  EXPECT_TRUE(ValidatePrompt(req, Limits()).ok());
  for (int i = 0; i < 29; ++i) req.add_prompt_tokens(1);  // 31 = max_context - 1
  EXPECT_TRUE(ValidatePrompt(req, Limits()).ok());
  req.add_prompt_tokens(1);
  ExpectInvalid(ValidatePrompt(req, Limits()), "prompt_tokens");
}

TEST(Validation, Tree) {
  const ApiLimits l = Limits();
  EXPECT_TRUE(ValidateTree(Tree({}, {}), l, "t").ok());
  EXPECT_TRUE(ValidateTree(Tree({1, 2, 3, 4}, {-1, 0, -1, 1}), l, "t").ok());
  ExpectInvalid(ValidateTree(Tree({1, 2}, {-1}), l, "t"), "t.parents: size");
  ExpectInvalid(ValidateTree(Tree({1, 2, 3, 4, 5}, {-1, -1, -1, -1, -1}), l, "t"), "t.tokens");
  ExpectInvalid(ValidateTree(Tree({1, 100}, {-1, 0}), l, "t"), "t.tokens[1]");
  ExpectInvalid(ValidateTree(Tree({1, -3}, {-1, 0}), l, "t"), "t.tokens[1]");
  ExpectInvalid(ValidateTree(Tree({1, 2}, {-1, 1}), l, "t"), "t.parents[1]");  // self
  ExpectInvalid(ValidateTree(Tree({1, 2}, {0, -1}), l, "t"), "t.parents[0]");  // forward
  ExpectInvalid(ValidateTree(Tree({1, 2}, {-1, 7}), l, "t"), "t.parents[1]");  // range
  ExpectInvalid(ValidateTree(Tree({1, 2}, {-2, 0}), l, "t"), "t.parents[0]");  // < -1
}

TEST(Validation, Request) {
  const ApiLimits l = Limits();
  verify::v1::VerifyRequest req;
  ExpectInvalid(ValidateVerifyRequest(req, l), "items");
  auto* a = req.add_items();
  a->set_session_id("a");
  EXPECT_TRUE(ValidateVerifyRequest(req, l).ok());
  auto* b = req.add_items();
  b->set_session_id("a");
  ExpectInvalid(ValidateVerifyRequest(req, l), "items[1].session_id");
  b->set_session_id("");
  ExpectInvalid(ValidateVerifyRequest(req, l), "items[1].session_id");
  b->set_session_id("b");
  *b->mutable_tree() = Tree({1}, {3});
  ExpectInvalid(ValidateVerifyRequest(req, l), "items[1].tree.parents[0]");
  *b->mutable_tree() = Tree({1}, {-1});
  EXPECT_TRUE(ValidateVerifyRequest(req, l).ok());
  req.add_items()->set_session_id("c");
  ExpectInvalid(ValidateVerifyRequest(req, l), "items: 3 items");
}

TEST(Validation, Context) {
  const ApiLimits l = Limits();
  EXPECT_TRUE(CheckContext(27, 4, l, "f").ok());  // 27 + 1 + 4 = 32
  ExpectInvalid(CheckContext(28, 4, l, "items[0].tree"), "items[0].tree: context");
  EXPECT_TRUE(CheckContext(31, 0, l, "f").ok());  // a decode step fills the last position
  ExpectInvalid(CheckContext(32, 0, l, "f"), "f");
}

}  // namespace
}  // namespace verifyd::server
