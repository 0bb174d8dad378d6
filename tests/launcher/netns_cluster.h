#pragma once
// Test helper: nodes as network namespaces. Each node is a namespace with one veth into a
// private "switch" namespace holding a bridge, on 10.77.1.0/24 (node i is 10.77.1.<i+1>).
// Nothing is created in the root namespace but /etc/netns/<namespace>/hosts (debian_hosts);
// everything is deleted when the cluster goes. Needs root and `ip netns` (skip_reason says
// why not).

#include <string>
#include <vector>

namespace tessel::launcher::testing {

// Runs CMD with sh, its output discarded; returns system()'s status.
int sh(const std::string& cmd);
// Why namespace tests cannot run here ("" when they can).
std::string skip_reason();
// DIR/token holding TOKEN, mode 0600.
std::string write_token_file(const std::string& dir, const std::string& token);

// Three (or more) namespaces as nodes joined by a bridge in another. RAII: the destructor
// deletes every namespace it made (which deletes their veths).
class NetnsCluster {
 public:
  explicit NetnsCluster(int nodes);
  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  // As on a stock Debian host: node i's host name is "node<i>" and maps to 127.0.1.1 in its
  // /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts).
  void debian_hosts(int i);
  bool ok() const { return ok_; }
  const std::string& ns(int i) const { return nodes_[static_cast<size_t>(i)]; }
  static std::string addr(int i) { return "10.77.1." + std::to_string(i + 1); }
  // Takes node i off the network (its link goes down), and back.
  void cut(int i);
  void reconnect(int i);

 private:
  std::string switch_;
  std::vector<std::string> nodes_, made_;
  bool ok_ = false;
};

}  // namespace tessel::launcher::testing
