#pragma once
// StoreClient: the Store (store/store.h) of a job, reached over gRPC at the address the
// launcher gives its workers (TESSEL_STORE_ADDR), authenticated by the job's token
// (TESSEL_STORE_TOKEN or TESSEL_STORE_TOKEN_FILE; never a command-line flag).
//
//   std::shared_ptr<Store> store = store_client_from_env();
//   store->set("rank0/addr", "10.0.0.5:4000");
//   std::string peer = store->get("rank1/addr", std::chrono::seconds(30));
//
// Errors: a call past its timeout throws Timeout naming the keys still missing; a server that
// cannot be reached when connecting throws CommError naming the address after bounded retries;
// a server that goes away later throws PeerLost naming the address; a refused token throws
// CommError; a request past the server's limits throws InvalidArgument naming the limit.

#include <chrono>
#include <memory>
#include <string>

#include "tessel/store/store.h"
#include "tessel/store/store_tls.h"

namespace tessel {

struct StoreClientOptions {
  std::string address;  // host:port of the StoreServer
  std::string token;    // the job's token
  TlsFiles tls;         // TLS when ca or cert is set (TESSEL_TLS_* in the worker environment)
  // Connecting: attempts up to connect_timeout in all, each waiting a little longer
  // (connect_backoff doubling, capped at max_connect_backoff) before the next.
  std::chrono::nanoseconds connect_timeout = std::chrono::seconds(60);
  std::chrono::nanoseconds connect_backoff = std::chrono::milliseconds(50);
  std::chrono::nanoseconds max_connect_backoff = std::chrono::seconds(2);
  // Non-blocking calls (set, add, check, ...) fail after this long without an answer.
  std::chrono::nanoseconds rpc_timeout = std::chrono::seconds(60);
  // Default timeout of blocking calls (Store::timeout()).
  std::chrono::nanoseconds default_timeout = std::chrono::seconds(300);
};

// Thread-safe; one gRPC channel shared by all callers. Each call blocks the calling thread.
class StoreClient final : public Store {
 public:
  // False when this build has no gRPC; the constructor then throws Unavailable.
  static bool is_available();

  // Connects (blocking, bounded by options.connect_timeout). Throws InvalidArgument for an
  // empty address or token, CommError naming the address when no connection could be made.
  explicit StoreClient(StoreClientOptions options);
  ~StoreClient() override;

  const std::string& address() const;

  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::string get(const std::string& key, Nanoseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Nanoseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Nanoseconds timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

  struct Impl;
  // For StoreServer::connect(): a client over an existing transport.
  explicit StoreClient(std::unique_ptr<Impl> impl, Nanoseconds default_timeout);

 private:
  std::unique_ptr<Impl> impl_;
};

// The job's token from TESSEL_STORE_TOKEN, else the file named by TESSEL_STORE_TOKEN_FILE.
// Throws InvalidArgument naming both variables (and `address`, for context) when neither is set.
std::string store_token_from_env(const std::string& address);

// Options from the worker environment: TESSEL_STORE_ADDR, the token from TESSEL_STORE_TOKEN or
// else the file named by TESSEL_STORE_TOKEN_FILE, and TLS from TESSEL_TLS_*. Throws
// InvalidArgument naming the variable that is missing.
StoreClientOptions store_client_options_from_env();
// A connected client for this worker (store_client_options_from_env()).
std::shared_ptr<Store> store_client_from_env();

// The token in a file (surrounding whitespace trimmed). Throws IoError naming the file,
// InvalidArgument when it is empty.
std::string read_store_token_file(const std::string& path);

}  // namespace tessel
