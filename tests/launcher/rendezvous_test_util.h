#pragma once
// Test helper for rendezvous server tests: joins many agents' requests at once.

#include <future>
#include <string>
#include <vector>

#include "tessel/launcher/rendezvous_client.h"

namespace tessel::launcher::testing {

inline constexpr char kRendezvousTestToken[] = "test-token-123";

// Joins every request concurrently (one client each, the test token) and returns the responses
// in order.
inline std::vector<proto::JoinResponse> join_all(const std::string& address,
                                                 const std::vector<proto::JoinRequest>& requests) {
  std::vector<std::future<proto::JoinResponse>> futures;
  for (const auto& req : requests) {
    futures.push_back(std::async(std::launch::async, [&address, req] {
      RendezvousClient client(address, kRendezvousTestToken);
      return client.join(req, std::chrono::seconds(10));
    }));
  }
  std::vector<proto::JoinResponse> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

}  // namespace tessel::launcher::testing
