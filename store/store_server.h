#pragma once
// StoreServer: serves a job's Store over gRPC, for rendezvous and backend bootstrap. One per
// job, hosted by the launcher (or by a test, or by rank 0 of a single-node job).
//
//   StoreServerOptions options;
//   options.address = "127.0.0.1:0";            // port 0: a free port, see address()
//   options.token = read_store_token_file(path); // empty: a fresh random token, see token()
//   StoreServer server(options);
//   // workers: TESSEL_STORE_ADDR=server.address(), TESSEL_STORE_TOKEN=server.token()
//   std::shared_ptr<Store> local = server.connect();  // in-process client, no socket
//
// Blocking calls (get, multi_get, wait) never hold a server thread: they are parked in the
// server's table until their keys are set, their timeout passes, or the server stops.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tessel/store/store.h"
#include "tessel/store/store_tls.h"

namespace tessel {

// Limits protect the server (and the job) from a runaway client; a call past one is refused
// with an error naming the limit and its value.
struct StoreLimits {
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = size_t{16} << 20;     // 16 MiB
  size_t max_keys = size_t{1} << 20;             // keys held at once
  size_t max_keys_per_call = 65536;              // keys in one multi_get / multi_set / wait / check
  size_t max_waiters = 65536;                    // blocking calls parked at once
  size_t max_request_bytes = size_t{256} << 20;  // one request on the wire (e.g. a multi_set)
  // Connections that have not yet made a call with the token (whose calls are refused on their
  // headers, bodies unread): at most this many from one address, and in all. Past a limit the
  // oldest such connection of that address is closed once it had a second to authenticate,
  // else the new one is refused. Connections that authenticated are never limited.
  size_t max_unauthenticated_connections_per_peer = 64;
  size_t max_unauthenticated_connections = 1024;
};

struct StoreServerOptions {
  // host:port to listen on, exactly ("127.0.0.1:0", "10.0.0.5:29500", "[::1]:0"). Port 0 picks
  // a free port. Empty: no socket at all (in-process only: connect() is the way in). Never
  // defaults to all interfaces; "0.0.0.0:port" must be asked for.
  std::string address = "127.0.0.1:0";
  // The job's shared secret, sent by every client. Empty: the server makes a random one.
  std::string token;
  StoreLimits limits;
  // TLS (cert + key; + ca for mutual TLS). Off when cert is empty.
  TlsFiles tls;
  // How long stop() lets in-flight calls finish before cancelling them.
  std::chrono::nanoseconds shutdown_grace = std::chrono::seconds(1);
};

// Counters for monitoring and tests; a consistent snapshot.
struct StoreServerStats {
  size_t keys = 0;                         // keys held
  size_t waiters = 0;                      // blocking calls parked
  size_t connections = 0;                  // open now
  size_t unauthenticated_connections = 0;  // open now, no call with the token yet
  size_t refused_connections = 0;          // closed at once or later to stay within limits
};

// Thread-safe. Owns the gRPC server and its table of keys. Starts serving in the constructor;
// stop() (or the destructor) fails parked calls with an error saying the server stopped and
// shuts the server down within options.shutdown_grace.
class StoreServer {
 public:
  // False when this build has no gRPC; the constructor then throws Unavailable.
  static bool is_available();

  // Throws InvalidArgument for a malformed address or empty-but-required value, IoError when
  // the address cannot be bound (naming it), Unavailable without gRPC.
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // The address clients use: the host as given and the bound port ("127.0.0.1:41235"); empty
  // for an in-process-only server.
  const std::string& address() const;
  int port() const;
  const std::string& token() const;
  const StoreLimits& limits() const;
  StoreServerStats stats() const;

  // A client in this process over gRPC's in-process transport (no socket, same auth and
  // limits). The client must not be used after stop(); calls then throw PeerLost.
  std::shared_ptr<Store> connect(Nanoseconds default_timeout = std::chrono::seconds(300));

  // Fails parked calls with PeerLost-mapped errors and shuts down. Idempotent; blocks at most
  // about options.shutdown_grace.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A random 256-bit token as 64 hex characters, from the system's random source. Throws IoError.
std::string generate_store_token();

}  // namespace tessel
