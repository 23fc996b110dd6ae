#include "tests/rel_util.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpcpp/security/credentials.h"

namespace verifyd::rel {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base && *base ? base : "/tmp", "/verifyd_rel_XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::Status Shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("popen failed: ", cmd));
  char buf[4096];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, k);
  const int status = ::pclose(p);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("command failed (status ", status, "): ", cmd, "\n", out));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

namespace {

// Key + certificate signed by `ca` (or self-signed CA when ca is empty).
absl::Status MakeCert(const std::string& dir, const std::string& name, const std::string& subj,
                      const std::string& ca, const std::string& ext) {
  const std::string key = absl::StrCat(dir, "/", name, ".key");
  const std::string crt = absl::StrCat(dir, "/", name, ".pem");
  if (ca.empty()) {
    return Shell(absl::StrCat(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2",
        " -keyout ", key, " -out ", crt, " -subj '", subj, "'",
        " -addext basicConstraints=critical,CA:TRUE -addext "
        "keyUsage=critical,keyCertSign,cRLSign"));
  }
  const std::string csr = absl::StrCat(dir, "/", name, ".csr");
  const std::string extfile = absl::StrCat(dir, "/", name, ".ext");
  if (auto st = WriteFile(extfile, ext); !st.ok()) return st;
  if (auto st = Shell(absl::StrCat(
          "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", key,
          " -out ", csr, " -subj '", subj, "'"));
      !st.ok()) {
    return st;
  }
  return Shell(absl::StrCat("openssl x509 -req -days 2 -in ", csr, " -CA ", dir, "/", ca,
                            ".pem -CAkey ", dir, "/", ca, ".key -CAcreateserial -out ", crt,
                            " -extfile ", extfile));
}

}  // namespace

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  if (!Shell("openssl version").ok()) {
    return absl::UnavailableError("the openssl command is not installed");
  }
  const std::string server_ext =
      "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
      "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  const std::string client_ext =
      "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n";
  struct Item {
    const char* name;
    const char* subj;
    const char* ca;
    const std::string* ext;
  };
  const std::string none;
  const Item items[] = {
      {"ca", "/CN=verifyd test CA", "", &none},
      {"rogue_ca", "/CN=rogue CA", "", &none},
      {"server", "/CN=localhost", "ca", &server_ext},
      {"alice", "/O=verifyd-test/CN=alice", "ca", &client_ext},
      {"bob", "/O=verifyd-test/CN=bob", "ca", &client_ext},
      {"rogue", "/O=verifyd-test/CN=alice", "rogue_ca", &client_ext},
  };
  for (const Item& it : items) {
    if (auto st = MakeCert(dir, it.name, it.subj, it.ca, *it.ext); !st.ok()) return st;
  }
  auto f = [&](const char* n, const char* ext) { return absl::StrCat(dir, "/", n, ext); };
  TestPki p;
  p.ca_cert = f("ca", ".pem");
  p.server_cert = f("server", ".pem");
  p.server_key = f("server", ".key");
  p.alice_cert = f("alice", ".pem");
  p.alice_key = f("alice", ".key");
  p.bob_cert = f("bob", ".pem");
  p.bob_key = f("bob", ".key");
  p.rogue_ca_cert = f("rogue_ca", ".pem");
  p.rogue_cert = f("rogue", ".pem");
  p.rogue_key = f("rogue", ".key");
  return p;
}

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& target,
                                          const std::string& ca_cert_path,
                                          const std::string& cert_path, const std::string& key_path,
                                          const std::string& token) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadFile(ca_cert_path).value_or("");
  if (!cert_path.empty()) {
    o.pem_cert_chain = ReadFile(cert_path).value_or("");
    o.pem_private_key = ReadFile(key_path).value_or("");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(o);
  if (!token.empty()) {
    creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(token));
  }
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  // A fresh connection per channel: tests compare what different clients may do.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, creds, args);
}

int64_t RssKib(pid_t pid) {
  const std::string path =
      pid == 0 ? std::string("/proc/self/status") : absl::StrCat("/proc/", pid, "/status");
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "VmRSS:")) {
      v = absl::StripAsciiWhitespace(v);
      absl::ConsumeSuffix(&v, "kB");
      int64_t kib = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kib)) return kib;
    }
  }
  return -1;
}

double Metric(const std::string& page, const std::string& name) {
  return test::MetricValue(page, name);
}

}  // namespace verifyd::rel
