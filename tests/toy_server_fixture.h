// A verifyd server on loopback over the toy engine (server/toy_engine.h), for the
// server, session and limits tests: the one copy of their start-up fixture.
#pragma once

#include <memory>
#include <utility>

#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "server/toy_engine.h"

namespace verifyd::server {

struct Fixture {
  testing::TestServer t;
  testing::ToyEngine* toy = nullptr;  // owned by the server
  testing::ToyEngineOptions toy_options;
};

// Metrics off unless asked for: stopping the HTTP exposer costs ~2 s.
inline Fixture Start(testing::ToyEngineOptions toy_options = {}, ServerOptions options = {},
                     bool metrics = false) {
  Fixture f;
  f.toy_options = toy_options;
  auto engine = std::make_unique<testing::ToyEngine>(toy_options);
  f.toy = engine.get();
  auto t = testing::StartTestServer(options, std::move(engine), metrics);
  EXPECT_TRUE(t.ok()) << t.status();
  if (t.ok()) f.t = *std::move(t);
  return f;
}

}  // namespace verifyd::server
