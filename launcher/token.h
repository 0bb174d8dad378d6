#pragma once
// The per-job token that authenticates every rendezvous and store RPC. It is generated under
// --standalone, otherwise read from a 0600 file or TESSEL_RDZV_TOKEN, and handed to workers
// only through their environment (TESSEL_STORE_TOKEN). Never put on a command line or logged.

#include <string>
#include <string_view>

namespace tessel::launcher {

// The gRPC metadata key carrying the token is the store's kJobTokenMetadataKey (server_kit.h):
// rendezvous and the store share one server and one token.

// 32 random bytes from getrandom(2), hex-encoded. Throws IoError if the kernel refuses.
std::string generate_token();

// The token in `path`: the file must be a regular file that only its owner can read or write
// (mode 0600 or stricter); surrounding whitespace is dropped. Throws InvalidArgument naming the
// path and its mode, IoError when it cannot be read.
std::string read_token_file(const std::string& path);

// The job token for a multi-node agent: --rdzv-token-file when given, else TESSEL_RDZV_TOKEN.
// Throws InvalidArgument saying how to provide one when neither is set.
std::string load_token(const std::string& token_file);

// A job whose nodes are all on this host (its endpoint is a loopback address) needs no token
// from the user: the agent that serves the rendezvous publishes a fresh one in a file only this
// user can read, <dir>/token-<port>, and the other agents read it there. `dir` must be a
// directory owned by this user with mode 0700 (made if missing); InvalidArgument otherwise.
std::string local_token_path(const std::string& dir, int port);
void publish_local_token(const std::string& dir, int port, const std::string& token);
// The published token, or "" when there is none (yet).
std::string read_local_token(const std::string& dir, int port);
// Removes the published token if it is still `token` (a later job may have replaced it).
void withdraw_local_token(const std::string& dir, int port, const std::string& token);

// Equality in time independent of where the strings differ.
bool tokens_equal(std::string_view a, std::string_view b);

}  // namespace tessel::launcher
