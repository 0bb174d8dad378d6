#pragma once
// Credentials of tessel's gRPC servers and clients: the job token checked on every call's
// headers, before its body is read, and optional TLS (store/store_tls.h). Internal to
// store/internal and the launcher.
//
// A call is checked by gRPC's server authentication filter as soon as its headers arrive: a
// call without the token, or with another, ends there with UNAUTHENTICATED. Its message is
// never requested, so a stranger's 250 MiB request costs the server at most one HTTP/2 flow-
// control window (64 KiB) before the stream is reset. Either metadata key is accepted:
// kTokenKeys.

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "tessel/store/store_tls.h"

namespace tessel::internal {

// Metadata keys that may carry the job's token (the launcher's and the store's clients).
// The job token's metadata keys: the co-hosted services' (server_kit.h) and the Store's own.
inline constexpr const char* kRendezvousTokenKey = "x-tessel-token";
inline constexpr const char* kStoreTokenKey = "tessel-store-token";

// Server credentials checking `token` on every call; TLS when tls.server_enabled(). Throws
// IoError naming a TLS file that cannot be read, InvalidArgument for an empty token or a
// certificate without a key.
std::shared_ptr<grpc::ServerCredentials> token_server_credentials(const std::string& token,
                                                                  const TlsFiles& tls);

// Channel credentials for a client: TLS when tls.client_enabled(), else insecure (the token
// goes in each call's metadata). Throws IoError naming a file that cannot be read.
// Constant-time comparison (in the length of `expected`).
bool token_matches(const char* given, size_t given_size, const std::string& expected);

}  // namespace tessel::internal
