#include "tessel/store/internal/server_auth.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "tessel/base/error.h"
#include "tessel/store/server_kit.h"

namespace tessel {
namespace internal {
namespace {

std::string read_pem(const std::string& path, const char* what) {
  std::ifstream in(path);
  TESSEL_CHECK(in.good(), IoError, "cannot read the TLS {} file '{}'", what, path);
  std::stringstream text;
  text << in.rdbuf();
  TESSEL_CHECK(!text.str().empty(), IoError, "the TLS {} file '{}' is empty", what, path);
  return text.str();
}

bool slice_equals(const grpc_slice& slice, const char* text) {
  const size_t n = std::strlen(text);
  return GRPC_SLICE_LENGTH(slice) == n && std::memcmp(GRPC_SLICE_START_PTR(slice), text, n) == 0;
}

// The processor gRPC's server auth filter calls with each call's headers (on the transport's
// thread; it answers at once, so no call ever waits on it).
void check_token(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                 grpc_process_auth_metadata_done_cb done, void* user_data) {
  const std::string& token = *static_cast<const std::string*>(state);
  bool ok = false;
  for (size_t i = 0; i < num_md && !ok; ++i) {
    if (slice_equals(md[i].key, kRendezvousTokenKey) || slice_equals(md[i].key, kStoreTokenKey)) {
      ok = token_matches(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
                         GRPC_SLICE_LENGTH(md[i].value), token);
    }
  }
  if (ok) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
         "missing or wrong job token (x-tessel-token / tessel-store-token)");
  }
}

// gRPC's C++ ServerCredentials over core credentials that carry our processor. (The C++
// insecure credentials take no processor; the core ones do.)
class TokenServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit TokenServerCredentials(grpc_server_credentials* core) : core_(core) {}
  ~TokenServerCredentials() override { grpc_server_credentials_release(core_); }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    throw InvalidArgument("tessel's server credentials check the job token themselves");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), core_);
  }

  grpc_server_credentials* core_;
};

}  // namespace

bool token_matches(const char* given, size_t given_size, const std::string& expected) {
  size_t diff = given_size ^ expected.size();
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given_size ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

std::shared_ptr<grpc::ServerCredentials> token_server_credentials(const std::string& token,
                                                                  const TlsFiles& tls) {
  TESSEL_CHECK(!token.empty(), InvalidArgument, "a tessel server needs a non-empty job token");
  grpc_server_credentials* core = nullptr;
  if (tls.server_enabled()) {
    TESSEL_CHECK(!tls.key.empty(), InvalidArgument,
                 "TLS certificate '{}' given without its private key (TESSEL_TLS_KEY or "
                 "--rdzv-tls-key)",
                 tls.cert);
    const std::string cert = read_pem(tls.cert, "certificate");
    const std::string key = read_pem(tls.key, "key");
    const std::string ca = tls.ca.empty() ? std::string() : read_pem(tls.ca, "CA");
    grpc_ssl_pem_key_cert_pair pair{key.c_str(), cert.c_str()};
    core = grpc_ssl_server_credentials_create_ex(
        ca.empty() ? nullptr : ca.c_str(), &pair, 1,
        ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                   : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
        nullptr);
    TESSEL_CHECK(core != nullptr, InvalidArgument,
                 "gRPC refused the TLS certificate '{}' and key '{}'", tls.cert, tls.key);
  } else {
    core = grpc_insecure_server_credentials_create();
  }
  grpc_server_credentials_set_auth_metadata_processor(
      core, grpc_auth_metadata_processor{
                check_token, [](void* state) { delete static_cast<std::string*>(state); },
                new std::string(token)});
  return std::make_shared<TokenServerCredentials>(core);
}

}  // namespace internal

std::shared_ptr<grpc::ChannelCredentials> client_channel_credentials(const TlsFiles& tls) {
  if (!tls.client_enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  if (!tls.ca.empty()) options.pem_root_certs = internal::read_pem(tls.ca, "CA");
  if (!tls.cert.empty()) {
    TESSEL_CHECK(!tls.key.empty(), InvalidArgument,
                 "TLS client certificate '{}' given without its private key", tls.cert);
    options.pem_cert_chain = internal::read_pem(tls.cert, "certificate");
    options.pem_private_key = internal::read_pem(tls.key, "key");
  }
  return grpc::SslCredentials(options);
}

}  // namespace tessel
