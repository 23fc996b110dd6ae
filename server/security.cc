#include "server/security.h"

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/auth_context.h"
#include "verify/v1/verify.grpc.pb.h"

namespace verifyd::server {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr char kBearerPrefix[] = "Bearer ";

// Whole-file read; InvalidArgument naming the flag (operators read these at start-up).
absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' is empty"));
  }
  return ss.str();
}

// Equal length and bytes, in time that depends only on the lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<TokenAuthenticator>> TokenAuthenticator::FromFileContents(
    const std::string& contents) {
  auto auth = std::shared_ptr<TokenAuthenticator>(new TokenAuthenticator());
  absl::flat_hash_set<std::string> names, tokens;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    std::string name, token;
    if (fields.size() == 1) {
      name = absl::StrCat("token", line_no);
      token = std::string(fields[0]);
    } else if (fields.size() == 2) {
      name = std::string(fields[0]);
      token = std::string(fields[1]);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("auth_token_file: line ", line_no,
                                                     ": expected '<name> <token>' or '<token>'"));
    }
    if (token.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat("auth_token_file: line ", line_no,
                                                     ": token shorter than ", kMinTokenLength,
                                                     " characters"));
    }
    if (!names.insert(name).second || !tokens.insert(token).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth_token_file: line ", line_no, ": duplicate name or token"));
    }
    auth->tokens_.emplace_back(std::move(name), std::move(token));
  }
  if (auth->tokens_.empty()) {
    return absl::InvalidArgumentError("auth_token_file: no tokens in the file");
  }
  return auth;
}

std::string TokenAuthenticator::IdentityForAuthorization(const std::string& header_value) const {
  absl::string_view v = header_value;
  if (!absl::ConsumePrefix(&v, kBearerPrefix)) return "";
  // Every entry is compared, so the time does not reveal which token (if any) matched.
  const std::string* match = nullptr;
  for (const auto& [name, token] : tokens_) {
    if (ConstantTimeEquals(v, token)) match = &name;
  }
  return match ? absl::StrCat("token:", *match) : "";
}

grpc::Status TokenAuthMetadataProcessor::Process(const InputMetadata& auth_metadata,
                                                 grpc::AuthContext*, OutputMetadata*,
                                                 OutputMetadata*) {
  auto it = auth_metadata.find("authorization");
  if (it != auth_metadata.end() &&
      !auth_->IdentityForAuthorization(std::string(it->second.data(), it->second.size())).empty()) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or invalid bearer token (authorization: Bearer <token>)");
}

std::string Security::Describe() const {
  std::string s = mutual_tls ? "mtls" : (tls ? "tls" : "plaintext");
  if (tokens) absl::StrAppend(&s, "+token");
  return s;
}

absl::StatusOr<Security> BuildSecurity(const SecurityOptions& o) {
  Security sec;
  const bool has_cert = !o.tls_cert_file.empty();
  const bool has_key = !o.tls_key_file.empty();
  if (has_cert != has_key) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key: give both (the certificate chain and its private key) or "
        "neither");
  }
  sec.tls = has_cert;
  if (!o.tls_client_ca_file.empty() && !sec.tls) {
    return absl::InvalidArgumentError(
        "--tls_client_ca: mutual TLS needs the server's own certificate too (--tls_cert, "
        "--tls_key)");
  }
  if (!o.auth_token_file.empty() && !sec.tls) {
    return absl::InvalidArgumentError(
        "--auth_token_file: bearer tokens need TLS (--tls_cert, --tls_key); over plaintext "
        "anyone on the network path could read and replay them");
  }
  if (!sec.tls) {
    sec.credentials = grpc::InsecureServerCredentials();
    return sec;
  }
  auto cert = ReadFile(o.tls_cert_file, "--tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(o.tls_key_file, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.tls_client_ca_file.empty()) {
    auto ca = ReadFile(o.tls_client_ca_file, "--tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    sec.mutual_tls = true;
  } else {
    ssl.client_certificate_request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  }
  sec.credentials = grpc::SslServerCredentials(ssl);
  if (!sec.credentials) return absl::InvalidArgumentError("--tls_cert/--tls_key: rejected");
  if (!o.auth_token_file.empty()) {
    auto contents = ReadFile(o.auth_token_file, "--auth_token_file");
    if (!contents.ok()) return contents.status();
    auto tokens = TokenAuthenticator::FromFileContents(*contents);
    if (!tokens.ok()) return tokens.status();
    sec.tokens = *std::move(tokens);
    sec.credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthMetadataProcessor>(sec.tokens));
  }
  return sec;
}

std::string ClientIdentity(const grpc::ServerContext& ctx, const Security& security) {
  if (security.tokens) {
    // The metadata processor already accepted the call; re-derive the name per call (the
    // auth context is shared by every call of a connection, so it is not the place for a
    // per-call identity).
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    if (it == md.end()) return "";
    return security.tokens->IdentityForAuthorization(
        std::string(it->second.data(), it->second.size()));
  }
  if (security.mutual_tls) {
    std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    if (!auth) return "";
    std::vector<grpc::string_ref> subject =
        auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME);
    if (!subject.empty()) {
      return absl::StrCat("x509:", std::string(subject[0].data(), subject[0].size()));
    }
    std::vector<grpc::string_ref> cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    if (!cn.empty()) return absl::StrCat("x509:CN=", std::string(cn[0].data(), cn[0].size()));
    return "";
  }
  return "";
}

namespace {
// Every method UNIMPLEMENTED: registered only so the health server has a synchronous service
// (gRPC 1.51 attaches its default health service to one, and refuses a server without any).
class NoVerifyService final : public verify::v1::VerifyService::Service {};
}  // namespace

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& listen) {
  std::unique_ptr<HealthServer> h(new HealthServer());
  h->placeholder_ = std::make_unique<NoVerifyService>();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.RegisterService(h->placeholder_.get());
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &h->port_);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(4096);  // health requests are a service name
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || h->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("health_listen: cannot listen on ", listen));
  }
  server->GetHealthCheckService()->SetServingStatus(false);
  absl::MutexLock lock(&h->mu_);
  h->server_ = std::move(server);
  return h;
}

HealthServer::~HealthServer() { Shutdown(); }

void HealthServer::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (server_) server_->GetHealthCheckService()->SetServingStatus(serving);
}

void HealthServer::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (!server_) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  server_.reset();
}

std::string ForLog(absl::string_view text) {
  if (text.size() <= kMaxLoggedBytes) return absl::CEscape(text);
  return absl::StrCat(absl::CEscape(text.substr(0, kMaxLoggedBytes)), "...(", text.size(),
                      " bytes)");
}

}  // namespace verifyd::server
