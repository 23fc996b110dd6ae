// Helpers for the reliability tests (tests/rel_*_test.cc): a temporary directory, a test PKI
// made with the openssl CLI (CA, server and client certificates), TLS channels, child
// processes for the real verifyd binary, and resident-memory readings.
// Thread-safety: free functions are reentrant; a TempDir belongs to one thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tests/process_util.h"

namespace verifyd::rel {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs `cmd` through /bin/sh; Internal (with its output) unless it exits 0.
absl::Status Shell(const std::string& cmd);
absl::StatusOr<std::string> ReadFile(const std::string& path);
absl::Status WriteFile(const std::string& path, const std::string& contents);

// PEM files (paths) of a throw-away PKI, EC P-256, valid two days:
//   ca            the trusted CA
//   server        CN=localhost, SAN DNS:localhost + IP:127.0.0.1, signed by ca
//   alice, bob    client certificates (CN=alice / CN=bob, O=verifyd-test), signed by ca
//   rogue         a client certificate signed by rogue_ca (not trusted by the server)
struct TestPki {
  std::string ca_cert, server_cert, server_key;
  std::string alice_cert, alice_key, bob_cert, bob_key;
  std::string rogue_ca_cert, rogue_cert, rogue_key;
};
// Needs the `openssl` command; Unavailable when it is missing.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

// A channel to `target` over TLS trusting `ca_cert_path`; with a client certificate when
// `cert_path` is set; sending "authorization: Bearer <token>" when `token` is set.
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& target,
                                          const std::string& ca_cert_path,
                                          const std::string& cert_path = "",
                                          const std::string& key_path = "",
                                          const std::string& token = "");

// Child processes (tests/process_util.h).
using ::verifyd::test::FreePort;
using ::verifyd::test::Spawn;
using ::verifyd::test::WaitExit;

// VmRSS of `pid` (0 = this process) from /proc/<pid>/status, in KiB; -1 when unreadable.
int64_t RssKib(pid_t pid = 0);

// The value of the metric line "name value" in a Prometheus text page (its model_name label
// ignored); -1 if absent.
double Metric(const std::string& page, const std::string& name);

}  // namespace verifyd::rel
