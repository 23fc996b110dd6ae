#include "server/testing/test_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace verifyd::server::testing {

absl::StatusOr<TestServer> StartTestServer(ServerOptions options,
                                           std::unique_ptr<tp::Engine> engine, bool metrics) {
  options.listen = "127.0.0.1:0";
  options.metrics_listen = metrics ? "127.0.0.1:0" : "";
  auto server = Server::BuildAndStart(options, std::move(engine));
  if (!server.ok()) return server.status();
  TestServer t;
  t.server = *std::move(server);
  t.target = absl::StrCat("127.0.0.1:", t.server->port());
  t.client = std::make_unique<client::VerifyClient>(t.target, absl::Seconds(60),
                                                    options.max_message_bytes * 2);
  return t;
}

absl::StatusOr<std::vector<int32_t>> GreedyViaEngine(tp::Engine* engine,
                                                     const std::vector<int32_t>& prompt, int n,
                                                     const kernels::SamplingParams& sampling) {
  const int chunk = std::max(1, std::min(64, engine->limits().max_tail_rows));
  std::vector<int32_t> seq = prompt;
  std::vector<int32_t> out;
  if (static_cast<int64_t>(prompt.size()) + n > engine->kv_slots()) {
    return absl::InvalidArgumentError("GreedyViaEngine: not enough KV slots");
  }
  int64_t done = 0;  // rows with KV written: slots [0, done)
  int32_t next = -1;
  while (done < static_cast<int64_t>(seq.size())) {
    const int64_t end = std::min<int64_t>(seq.size(), done + chunk);
    tp::StepRequest r;
    for (int64_t i = 0; i < done; ++i) r.context_slots.push_back(static_cast<int32_t>(i));
    for (int64_t i = done; i < end; ++i) {
      r.tokens.push_back(seq[i]);
      r.parents.push_back(static_cast<int32_t>(i - done - 1));
      r.tail_slots.push_back(static_cast<int32_t>(i));
    }
    r.accept = false;
    r.sampling = sampling;
    auto res = engine->Step({r});
    if (!res.ok()) return res.status();
    next = (*res)[0].predictions.back();
    done = end;
    if (done == static_cast<int64_t>(seq.size())) {
      out.push_back(next);
      if (static_cast<int>(out.size()) == n) break;
      seq.push_back(next);  // decode: the next step runs the emitted token as one row
    }
  }
  return out;
}

client::DraftTree RandomTree(const std::vector<int32_t>& truth, int64_t vocab, int max_nodes,
                             double hit, std::mt19937_64& rng) {
  client::DraftTree t;
  auto rnd = [&](int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); };
  if (rnd(8) == 0 || max_nodes == 0) return t;  // sometimes a plain decode step
  const int depth = static_cast<int>(std::min<int64_t>(1 + rnd(8), truth.size()));
  int parent = -1;
  bool on_truth = true;
  for (int d = 0; d < depth && static_cast<int>(t.tokens.size()) < max_nodes; ++d) {
    const int siblings = static_cast<int>(1 + rnd(3));
    const int path_pos = static_cast<int>(rnd(siblings));
    int path_index = -1;
    on_truth = on_truth && std::uniform_real_distribution<double>(0, 1)(rng) < hit;
    for (int s = 0; s < siblings && static_cast<int>(t.tokens.size()) < max_nodes; ++s) {
      int32_t tok = static_cast<int32_t>(rnd(vocab));
      if (s == path_pos) {
        if (on_truth) tok = truth[d];
        path_index = static_cast<int>(t.tokens.size());
      }
      t.tokens.push_back(tok);
      t.parents.push_back(parent);
    }
    if (path_index < 0) break;
    parent = path_index;
  }
  // Extra random nodes anywhere (sometimes duplicating a true token off the path).
  const int extra = static_cast<int>(rnd(4));
  for (int e = 0; e < extra && static_cast<int>(t.tokens.size()) < max_nodes; ++e) {
    const int n = static_cast<int>(t.tokens.size());
    t.parents.push_back(static_cast<int32_t>(rnd(n + 1)) - 1);
    t.tokens.push_back(rnd(2) ? static_cast<int32_t>(rnd(vocab)) : truth[rnd(truth.size())]);
  }
  return t;
}

std::vector<int32_t> ExpectedAcceptedNodes(const client::DraftTree& tree,
                                           const std::vector<int32_t>& truth_ahead) {
  std::vector<int32_t> path;
  int cur = -1;
  for (size_t d = 0; d < truth_ahead.size(); ++d) {
    int next = -1;
    for (size_t i = 0; i < tree.tokens.size(); ++i) {
      if (tree.parents[i] == cur && tree.tokens[i] == truth_ahead[d]) {
        next = static_cast<int>(i);
        break;
      }
    }
    if (next < 0) break;
    path.push_back(next);
    cur = next;
  }
  return path;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError("connect");
  }
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (::send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return absl::UnavailableError("send");
  }
  std::string resp;
  char buf[4096];
  for (;;) {
    const ssize_t k = ::recv(fd, buf, sizeof(buf), 0);
    if (k <= 0) break;
    resp.append(buf, static_cast<size_t>(k));
  }
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::UnavailableError("bad HTTP response");
  }
  if (resp.find(" 200 ") == std::string::npos || resp.find(" 200 ") > body) {
    return absl::UnavailableError(absl::StrCat("HTTP status: ", resp.substr(0, resp.find('\r'))));
  }
  return resp.substr(body + 4);
}

}  // namespace verifyd::server::testing
