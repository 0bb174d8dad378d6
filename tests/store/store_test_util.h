#pragma once
// Helpers shared by the store tests: a server on loopback and clients for it.

#include <dirent.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "tessel/store/store_client.h"
#include "tessel/store/store_server.h"

namespace tessel::testing {

inline constexpr const char* kTestToken = "test-token-0123456789";

inline StoreServerOptions loopback_server_options() {
  StoreServerOptions options;
  options.address = "127.0.0.1:0";
  options.token = kTestToken;
  return options;
}

inline StoreClientOptions client_options_for(const std::string& address,
                                             const std::string& token = kTestToken) {
  StoreClientOptions options;
  options.address = address;
  options.token = token;
  options.connect_timeout = std::chrono::seconds(10);
  return options;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Threads of this process, from /proc/self/task.
inline int thread_count() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* entry = readdir(dir)) n += entry->d_name[0] != '.';
  closedir(dir);
  return n;
}

// Polls pred every millisecond until it holds or timeout passes; returns pred's last answer.
// For conditions no one can signal (server counters), never as a substitute for a join.
template <typename Pred>
bool wait_until(Pred&& pred, std::chrono::nanoseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace tessel::testing
