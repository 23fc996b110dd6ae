// Security building blocks (server/security.h) over real TLS on loopback, with certificates
// made by the openssl CLI in a temporary directory: TLS, mutual TLS, bearer tokens (which
// need TLS), client identity extraction, and the separate plaintext health port.
// A stand-in VerifyService answers GetInfo with the caller's identity in `version`, so each
// test sees exactly what the server derived for that client.
#include <signal.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/verify_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/security.h"
#include "server/server.h"
#include "server/toy_engine.h"
#include "tests/rel_util.h"
#include "verify/v1/verify.grpc.pb.h"

namespace verifyd::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class IdentityEcho final : public verify::v1::VerifyService::Service {
 public:
  explicit IdentityEcho(const Security* sec) : sec_(sec) {}
  grpc::Status GetInfo(grpc::ServerContext* ctx, const verify::v1::GetInfoRequest*,
                       verify::v1::GetInfoResponse* resp) override {
    resp->set_version(ClientIdentity(*ctx, *sec_));
    return grpc::Status::OK;
  }

 private:
  const Security* sec_;
};

// An API server with `options` on 127.0.0.1:0.
struct EchoServer {
  Security sec;
  std::unique_ptr<IdentityEcho> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string target() const { return absl::StrCat("127.0.0.1:", port); }
};

std::unique_ptr<EchoServer> StartEcho(const SecurityOptions& options) {
  auto s = std::make_unique<EchoServer>();
  auto sec = BuildSecurity(options);
  EXPECT_TRUE(sec.ok()) << sec.status();
  if (!sec.ok()) return nullptr;
  s->sec = *sec;
  s->service = std::make_unique<IdentityEcho>(&s->sec);
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", s->sec.credentials, &s->port);
  b.RegisterService(s->service.get());
  s->server = b.BuildAndStart();
  EXPECT_NE(s->port, 0);
  return s;
}

// GetInfo's status and the identity the server saw.
absl::StatusOr<std::string> WhoAmI(std::shared_ptr<grpc::Channel> ch) {
  client::VerifyClient c(std::move(ch), absl::Seconds(10));
  auto info = c.GetInfo();
  if (!info.ok()) return info.status();
  return info->version();
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = rel::MakeTestPki(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *pki;
    token_file_ = dir_.File("tokens");
    ASSERT_TRUE(rel::WriteFile(token_file_,
                               "# name token\n"
                               "alice 0123456789abcdef-alice\n"
                               "bob   0123456789abcdef-bob\n")
                    .ok());
  }
  // TLS with the test PKI's server certificate.
  SecurityOptions Tls() const {
    SecurityOptions o;
    o.tls_cert_file = pki_.server_cert;
    o.tls_key_file = pki_.server_key;
    return o;
  }
  // Tls(), and a client certificate signed by the test CA required (mutual TLS).
  SecurityOptions Mtls() const {
    SecurityOptions o = Tls();
    o.tls_client_ca_file = pki_.ca_cert;
    return o;
  }

  rel::TempDir dir_;
  rel::TestPki pki_;
  std::string token_file_;
};

// Client-supplied text in log lines: a newline (or any control byte) cannot forge a line and a
// huge id is cut to kMaxLoggedBytes with its size.
TEST(LogEscapingTest, ClientTextCannotForgeOrFloodLogLines) {
  EXPECT_EQ(ForLog("session=ab"), "session=ab");
  const std::string forged = ForLog("x\n2026-12-03T00:00:00Z level=critical forged\r\"q\"");
  EXPECT_EQ(forged.find('\n'), std::string::npos);
  EXPECT_EQ(forged.find('\r'), std::string::npos);
  EXPECT_NE(forged.find("\\n2026"), std::string::npos);
  const std::string huge(4 << 20, 'z');
  const std::string cut = ForLog(huge);
  EXPECT_LT(cut.size(), kMaxLoggedBytes + 64);
  EXPECT_NE(cut.find("(4194304 bytes)"), std::string::npos);
  EXPECT_EQ(ForLog(std::string("\0\x01", 2)), "\\000\\001");
}

TEST(SecurityOptionsTest, RefusesTokenWithoutTls) {
  rel::TempDir dir;
  ASSERT_TRUE(rel::WriteFile(dir.File("t"), "0123456789abcdef0\n").ok());
  SecurityOptions o;
  o.auth_token_file = dir.File("t");
  auto sec = BuildSecurity(o);
  ASSERT_EQ(sec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sec.status().message(), HasSubstr("--auth_token_file"));
  EXPECT_THAT(sec.status().message(), HasSubstr("need TLS"));
}

TEST(SecurityOptionsTest, RefusesHalfConfiguredTls) {
  SecurityOptions cert_only;
  cert_only.tls_cert_file = "/nonexistent/cert.pem";
  EXPECT_THAT(BuildSecurity(cert_only).status().message(), HasSubstr("--tls_key"));
  SecurityOptions ca_only;
  ca_only.tls_client_ca_file = "/nonexistent/ca.pem";
  EXPECT_THAT(BuildSecurity(ca_only).status().message(), HasSubstr("--tls_client_ca"));
  SecurityOptions missing;
  missing.tls_cert_file = "/nonexistent/cert.pem";
  missing.tls_key_file = "/nonexistent/key.pem";
  auto st = BuildSecurity(missing).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("--tls_cert: cannot read"));
}

TEST(SecurityOptionsTest, PlaintextByDefault) {
  auto sec = BuildSecurity(SecurityOptions{});
  ASSERT_TRUE(sec.ok());
  EXPECT_FALSE(sec->tls);
  EXPECT_FALSE(sec->identities());
  EXPECT_EQ(sec->Describe(), "plaintext");
}

TEST(TokenAuthenticatorTest, ParsesAndMatches) {
  auto a = TokenAuthenticator::FromFileContents(
      "\n# comment\nalice aaaaaaaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbbbbbbb\n");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->size(), 2u);
  EXPECT_EQ((*a)->IdentityForAuthorization("Bearer aaaaaaaaaaaaaaaaaaaa"), "token:alice");
  EXPECT_EQ((*a)->IdentityForAuthorization("Bearer bbbbbbbbbbbbbbbbbbbb"), "token:token4");
  EXPECT_EQ((*a)->IdentityForAuthorization("Bearer aaaaaaaaaaaaaaaaaaa"), "");    // prefix
  EXPECT_EQ((*a)->IdentityForAuthorization("Bearer aaaaaaaaaaaaaaaaaaaaa"), "");  // longer
  EXPECT_EQ((*a)->IdentityForAuthorization("aaaaaaaaaaaaaaaaaaaa"), "");          // no scheme
  EXPECT_EQ((*a)->IdentityForAuthorization("Basic aaaaaaaaaaaaaaaaaaaa"), "");
  EXPECT_EQ((*a)->IdentityForAuthorization(""), "");
}

TEST(TokenAuthenticatorTest, RejectsBadFilesWithoutEchoingTokens) {
  const std::string secret = "shortsecret";
  auto short_token = TokenAuthenticator::FromFileContents("x " + secret + "\n");
  ASSERT_FALSE(short_token.ok());
  EXPECT_THAT(short_token.status().message(), HasSubstr("line 1"));
  EXPECT_THAT(short_token.status().message(), Not(HasSubstr(secret)));
  EXPECT_FALSE(TokenAuthenticator::FromFileContents("a 0123456789abcdef\nb 0123456789abcdef\n")
                   .ok());  // duplicate token
  EXPECT_FALSE(TokenAuthenticator::FromFileContents("a b c\n").ok());
  EXPECT_FALSE(TokenAuthenticator::FromFileContents("# only a comment\n").ok());
}

TEST_F(SecurityTest, TlsServesTlsClientsAndRejectsPlaintextAndUntrusted) {
  SecurityOptions o = Tls();
  auto s = StartEcho(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->sec.Describe(), "tls");
  auto ok = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "");  // TLS alone carries no client identity

  auto plain = WhoAmI(grpc::CreateChannel(s->target(), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable) << plain.status();
  // A client that trusts another CA refuses the server's certificate.
  auto wrong_ca = WhoAmI(rel::TlsChannel(s->target(), pki_.rogue_ca_cert));
  EXPECT_EQ(wrong_ca.status().code(), absl::StatusCode::kUnavailable) << wrong_ca.status();
}

TEST_F(SecurityTest, MutualTlsRequiresATrustedClientCertAndNamesTheClient) {
  SecurityOptions o = Mtls();
  auto s = StartEcho(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->sec.Describe(), "mtls");
  EXPECT_TRUE(s->sec.identities());

  auto no_cert = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert));
  EXPECT_EQ(no_cert.status().code(), absl::StatusCode::kUnavailable) << no_cert.status();
  // Same subject as alice, but signed by an untrusted CA.
  auto rogue = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert, pki_.rogue_cert, pki_.rogue_key));
  EXPECT_EQ(rogue.status().code(), absl::StatusCode::kUnavailable) << rogue.status();

  auto alice = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert, pki_.alice_cert, pki_.alice_key));
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto bob = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert, pki_.bob_cert, pki_.bob_key));
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_THAT(*alice, HasSubstr("x509:"));
  EXPECT_THAT(*alice, HasSubstr("CN=alice"));
  EXPECT_THAT(*bob, HasSubstr("CN=bob"));
  EXPECT_NE(*alice, *bob);
}

TEST_F(SecurityTest, BearerTokenOverTlsIsRequiredAndNamesTheClient) {
  SecurityOptions o = Tls();
  o.auth_token_file = token_file_;
  auto s = StartEcho(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->sec.Describe(), "tls+token");

  auto none = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated) << none.status();
  auto wrong = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert, "", "", "0123456789abcdef-eve"));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated) << wrong.status();
  EXPECT_THAT(wrong.status().message(), Not(HasSubstr("alice")));

  auto alice = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert, "", "", "0123456789abcdef-alice"));
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(*alice, "token:alice");
  auto bob = WhoAmI(rel::TlsChannel(s->target(), pki_.ca_cert, "", "", "0123456789abcdef-bob"));
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(*bob, "token:bob");
}

TEST_F(SecurityTest, HealthPortIsPlaintextWithoutAuthAndFollowsServing) {
  auto h = HealthServer::Start("127.0.0.1:0");
  ASSERT_TRUE(h.ok()) << h.status();
  client::VerifyClient probe(absl::StrCat("127.0.0.1:", (*h)->port()), absl::Seconds(10));
  auto st = probe.Health();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(*st, client::HealthStatus::kNotServing);
  (*h)->SetServing(true);
  st = probe.Health();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(*st, client::HealthStatus::kServing);
  // It serves nothing but health.
  EXPECT_EQ(probe.GetInfo().status().code(), absl::StatusCode::kUnimplemented);
  (*h)->SetServing(false);
  st = probe.Health();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(*st, client::HealthStatus::kNotServing);
  (*h)->Shutdown();
  (*h)->Shutdown();  // idempotent
}

TEST(HealthServerTest, BusyPortIsUnavailable) {
  auto a = HealthServer::Start("127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  auto b = HealthServer::Start(absl::StrCat("127.0.0.1:", (*a)->port()));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
}

// --- The security options wired into the real server --------------------------------------

std::unique_ptr<Server> StartServer(const SecurityOptions& sec, const std::string& health = "") {
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.metrics_listen = "";
  so.security = sec;
  so.health_listen = health;
  auto s =
      Server::BuildAndStart(so, std::make_unique<testing::ToyEngine>(testing::ToyEngineOptions{}));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// Alice's session is invisible to Bob: every call with its id answers exactly as for an id
// that does not exist, and Alice's session is unharmed.
void ExpectSessionsBound(client::VerifyClient& alice, client::VerifyClient& bob) {
  auto s = alice.Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Status unknown = bob.Verify(std::string(32, 'f'), {}).status();
  ASSERT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob.Verify(s->session_id, {}).status(), unknown);
  const absl::Status close_unknown = bob.Close(std::string(32, 'f'));
  EXPECT_EQ(close_unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob.Close(s->session_id), close_unknown);
  auto stream = bob.OpenStream();
  verify::v1::VerifyRequest req;
  req.add_items()->set_session_id(s->session_id);
  EXPECT_EQ(stream->RoundTrip(req).status().code(), absl::StatusCode::kNotFound);
  // Truncate, fork and prefix opens: the same as for an unknown id.
  const std::string nobody(32, 'f');
  const absl::Status truncate_unknown = bob.Truncate(nobody, 1).status();
  EXPECT_EQ(truncate_unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob.Truncate(s->session_id, 1).status(), truncate_unknown);
  const absl::Status fork_unknown = bob.Fork(nobody).status();
  EXPECT_EQ(fork_unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob.Fork(s->session_id).status(), fork_unknown);
  const absl::Status prefix_unknown = bob.Open({1}, nobody).status();
  EXPECT_EQ(prefix_unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob.Open({1}, s->session_id).status(), prefix_unknown);
  // Alice's fork is bound to Alice too.
  auto fork = alice.Fork(s->session_id);
  ASSERT_TRUE(fork.ok()) << fork.status();
  EXPECT_EQ(bob.Verify(fork->session_id, {}).status(), unknown);
  EXPECT_TRUE(alice.Close(fork->session_id).ok());
  // Alice still owns it, unchanged (one prefill, no round yet).
  auto r = alice.Verify(s->session_id, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->committed_len, 4);
  EXPECT_TRUE(alice.Close(s->session_id).ok());
}

TEST_F(SecurityTest, ServerBindsSessionsToTheMtlsClient) {
  SecurityOptions o = Mtls();
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  const std::string target = absl::StrCat("127.0.0.1:", server->port());
  client::VerifyClient alice(
      rel::TlsChannel(target, pki_.ca_cert, pki_.alice_cert, pki_.alice_key));
  client::VerifyClient bob(rel::TlsChannel(target, pki_.ca_cert, pki_.bob_cert, pki_.bob_key));
  ExpectSessionsBound(alice, bob);
  EXPECT_EQ(server->kv_slots_used(), 0);
}

TEST_F(SecurityTest, ServerBindsSessionsToTheTokenAndHealthPortNeedsNoAuth) {
  SecurityOptions o = Tls();
  o.auth_token_file = token_file_;
  auto server = StartServer(o, "127.0.0.1:0");
  ASSERT_TRUE(server);
  const std::string target = absl::StrCat("127.0.0.1:", server->port());
  client::VerifyClient alice(
      rel::TlsChannel(target, pki_.ca_cert, "", "", "0123456789abcdef-alice"));
  client::VerifyClient bob(rel::TlsChannel(target, pki_.ca_cert, "", "", "0123456789abcdef-bob"));
  ExpectSessionsBound(alice, bob);
  client::VerifyClient anonymous(rel::TlsChannel(target, pki_.ca_cert));
  EXPECT_EQ(anonymous.Open({1}).status().code(), absl::StatusCode::kUnauthenticated);
  // Probes: plaintext, no token, on the health port.
  client::VerifyClient probe(absl::StrCat("127.0.0.1:", server->health_port()), absl::Seconds(5));
  EXPECT_EQ(probe.Health().value_or(client::HealthStatus::kUnknown),
            client::HealthStatus::kServing);
  server->Shutdown(absl::ZeroDuration());
  EXPECT_FALSE(probe.Health().ok() && *probe.Health() == client::HealthStatus::kServing);
}

TEST_F(SecurityTest, ServerWithoutIdentitiesKeepsAnonymousSessions) {
  auto server = StartServer(SecurityOptions{});
  ASSERT_TRUE(server);
  client::VerifyClient a(absl::StrCat("127.0.0.1:", server->port()));
  client::VerifyClient b(absl::StrCat("127.0.0.1:", server->port()));
  auto s = a.Open({1, 2});
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(b.Verify(s->session_id, {}).ok());  // no identities: the id is the capability
}

TEST_F(SecurityTest, VerifydRefusesATokenWithoutTls) {
  const std::string log = dir_.File("verifyd.log");
  const pid_t pid = rel::Spawn({VERIFYD_BINARY, "--backend=toy", "--listen=127.0.0.1:0",
                                "--metrics_listen=", "--auth_token_file=" + token_file_},
                               log);
  EXPECT_EQ(rel::WaitExit(pid, absl::Seconds(30)), 2);
  const std::string out = rel::ReadFile(log).value_or("");
  EXPECT_THAT(out, HasSubstr("--auth_token_file: bearer tokens need TLS"));
  EXPECT_THAT(out, Not(HasSubstr("0123456789abcdef")));
}

TEST_F(SecurityTest, VerifydServesMutualTlsAndPlaintextHealth) {
  const int port = rel::FreePort(), health = rel::FreePort();
  const std::string log = dir_.File("verifyd.log");
  const pid_t pid =
      rel::Spawn({VERIFYD_BINARY, "--backend=toy", absl::StrCat("--listen=127.0.0.1:", port),
                  absl::StrCat("--health_listen=127.0.0.1:", health),
                  "--metrics_listen=", "--tls_cert=" + pki_.server_cert,
                  "--tls_key=" + pki_.server_key, "--tls_client_ca=" + pki_.ca_cert},
                 log);
  client::VerifyClient probe(absl::StrCat("127.0.0.1:", health), absl::Seconds(5));
  bool serving = false;
  for (int i = 0; i < 200 && !serving; ++i) {
    serving =
        probe.Health().value_or(client::HealthStatus::kUnknown) == client::HealthStatus::kServing;
    if (!serving) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(serving) << rel::ReadFile(log).value_or("");
  const std::string target = absl::StrCat("127.0.0.1:", port);
  client::VerifyClient alice(
      rel::TlsChannel(target, pki_.ca_cert, pki_.alice_cert, pki_.alice_key));
  EXPECT_TRUE(alice.Open({1, 2}).ok());
  client::VerifyClient plain(target, absl::Seconds(5));
  EXPECT_EQ(plain.GetInfo().status().code(), absl::StatusCode::kUnavailable);
  ::kill(pid, SIGTERM);
  EXPECT_EQ(rel::WaitExit(pid, absl::Seconds(30)), 0) << rel::ReadFile(log).value_or("");
}

TEST_F(SecurityTest, VerifyctlSpeaksMutualTlsAndTokens) {
  SecurityOptions o = Mtls();
  o.auth_token_file = token_file_;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  const std::string target = absl::StrCat("--target=127.0.0.1:", server->port());
  const std::string client_token = dir_.File("client_token");
  ASSERT_TRUE(rel::WriteFile(client_token, "alice 0123456789abcdef-alice\n").ok());
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {VERIFYCTL_BINARY, "info", target, "--timeout_s=10",
                                     "--tls_server_name=localhost"};
    args.insert(args.end(), extra.begin(), extra.end());
    return rel::WaitExit(rel::Spawn(args, dir_.File("verifyctl.log")), absl::Seconds(30));
  };
  const std::vector<std::string> tls = {"--tls_ca=" + pki_.ca_cert, "--tls_cert=" + pki_.alice_cert,
                                        "--tls_key=" + pki_.alice_key};
  std::vector<std::string> full = tls;
  full.push_back("--auth_token_file=" + client_token);
  EXPECT_EQ(run(full), 0) << rel::ReadFile(dir_.File("verifyctl.log")).value_or("");
  EXPECT_EQ(run(tls), 1);                                // no token: UNAUTHENTICATED
  EXPECT_EQ(run({"--tls_ca=" + pki_.ca_cert}), 1);       // no client certificate
  EXPECT_EQ(run({"--tls_cert=" + pki_.alice_cert}), 2);  // bad usage: cert without CA
}

}  // namespace
}  // namespace verifyd::server
