// Transport security and client identity for verifyd's gRPC API.
//
//   - TLS: the server presents --tls_cert / --tls_key (PEM). Without them the API is
//     plaintext (loopback, or behind a TLS-terminating proxy).
//   - Mutual TLS: with --tls_client_ca (PEM bundle) every client must present a certificate
//     signed by one of those CAs; the handshake fails otherwise.
//   - Bearer token: with --auth_token_file every call must carry
//     "authorization: Bearer <token>" naming one of the file's tokens, else UNAUTHENTICATED.
//     A token needs TLS (it would travel in clear text otherwise): BuildSecurity refuses a
//     token file without a certificate.
//   - Client identity: the token's name when token auth is on, else the mTLS peer
//     certificate's subject, else "" (anonymous: no binding). Sessions are bound to it so one
//     client cannot use another's session (server/session_manager.h).
//   - Health for probes on its own port, without TLS or auth (HealthServer), so a kubelet or
//     load balancer can probe without credentials; it serves only grpc.health.v1.Health.
//
// Token file: one token per line, "<name> <token>" or just "<token>" (name "token<line>");
// blank lines and lines starting with '#' are skipped; tokens must be >= 16 characters.
//
// Thread-safety: BuildSecurity is a pure function; a TokenAuthenticator is immutable after
// construction and safe from any thread; HealthServer methods are safe from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/server_credentials.h"

namespace grpc {
class Server;
class ServerContext;
class Service;
}  // namespace grpc

namespace verifyd::server {

struct SecurityOptions {
  std::string tls_cert_file;       // PEM certificate chain; "" = plaintext API
  std::string tls_key_file;        // PEM private key of tls_cert_file
  std::string tls_client_ca_file;  // PEM CA bundle; set = mutual TLS (client cert required)
  std::string auth_token_file;     // token file (see above); set = bearer token required
};

// Checks bearer tokens against a fixed set (constant-time per comparison).
class TokenAuthenticator {
 public:
  // Parses a token file's contents. InvalidArgument (line number, never the token) for a
  // malformed line, a short or duplicate token, or an empty file.
  static absl::StatusOr<std::shared_ptr<TokenAuthenticator>> FromFileContents(
      const std::string& contents);

  // The identity ("token:<name>") for "Bearer <token>", or "" when not accepted.
  std::string IdentityForAuthorization(const std::string& header_value) const;
  size_t size() const { return tokens_.size(); }

 private:
  std::vector<std::pair<std::string, std::string>> tokens_;  // (name, token)
};

// gRPC hook that rejects calls without a valid bearer token (UNAUTHENTICATED, a fixed
// message that says nothing about the tokens).
class TokenAuthMetadataProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthMetadataProcessor(std::shared_ptr<const TokenAuthenticator> auth)
      : auth_(std::move(auth)) {}
  bool IsBlocking() const override { return false; }  // a hash-free table scan: cheap
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  std::shared_ptr<const TokenAuthenticator> auth_;
};

struct Security {
  std::shared_ptr<grpc::ServerCredentials> credentials;  // for the API port
  std::shared_ptr<const TokenAuthenticator> tokens;      // null when token auth is off
  bool tls = false;
  bool mutual_tls = false;
  // True when calls carry an identity and sessions must be bound to it.
  bool identities() const { return mutual_tls || tokens != nullptr; }
  std::string Describe() const;  // "plaintext" | "tls" | "mtls" (+ "+token"), for logs
};

// Reads the PEM and token files and builds the API credentials. Errors (InvalidArgument,
// naming the flag): key without cert or the reverse, client CA or token without TLS,
// unreadable or empty files, malformed token file.
absl::StatusOr<Security> BuildSecurity(const SecurityOptions& options);

// The calling client's identity (see the header comment): "token:<name>", "x509:<subject>"
// or "" when the call carries none.
std::string ClientIdentity(const grpc::ServerContext& ctx, const Security& security);

// A separate gRPC server that serves only grpc.health.v1.Health, plaintext and without
// auth. Its status follows SetServing().
class HealthServer {
 public:
  // Unavailable when `listen` cannot be bound. Port 0 picks a free port.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& listen);
  ~HealthServer();
  void SetServing(bool serving);
  void Shutdown();  // idempotent
  int port() const { return port_; }

 private:
  HealthServer() = default;
  std::unique_ptr<grpc::Service> placeholder_;  // see security.cc
  absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  int port_ = 0;
};

// Client-supplied text (session ids, error messages that quote them) as it goes into a log
// line: control characters, quotes and backslashes escaped (a newline in an id cannot forge a
// line), and at most kMaxLoggedBytes of it, then "...(N bytes)" (a 4 MiB id does not write
// 4 MiB a call).
inline constexpr size_t kMaxLoggedBytes = 256;
std::string ForLog(absl::string_view text);

}  // namespace verifyd::server
