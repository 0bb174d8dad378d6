#include "netns_cluster.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace tessel::launcher::testing {

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

std::string skip_reason() {
  if (geteuid() != 0) return "needs root to create network namespaces";
  if (sh("ip netns list") != 0) return "`ip netns` is not available";
  return "";
}

std::string write_token_file(const std::string& dir, const std::string& token) {
  const std::string path = dir + "/token";
  std::ofstream(path) << token << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

NetnsCluster::NetnsCluster(int nodes) {
  const std::string base = "tslt" + std::to_string(getpid()) + "-";
  switch_ = base + "sw";
  ok_ = sh("ip netns add " + switch_) == 0;
  if (ok_) made_.push_back(switch_);
  ok_ = ok_ && sh("ip -n " + switch_ + " link add br0 type bridge") == 0 &&
        sh("ip -n " + switch_ + " link set br0 up") == 0;
  for (int i = 0; i < nodes && ok_; ++i) {
    const std::string ns = base + std::to_string(i);
    ok_ = sh("ip netns add " + ns) == 0;
    if (!ok_) break;
    made_.push_back(ns);
    nodes_.push_back(ns);
    const std::string port = "p" + std::to_string(i);
    ok_ = sh("ip -n " + ns + " link add eth0 type veth peer name " + port + " netns " + switch_) ==
              0 &&
          sh("ip -n " + ns + " addr add " + addr(i) + "/24 dev eth0") == 0 &&
          sh("ip -n " + ns + " link set eth0 up") == 0 &&
          sh("ip -n " + ns + " link set lo up") == 0 &&
          sh("ip -n " + switch_ + " link set " + port + " master br0") == 0 &&
          sh("ip -n " + switch_ + " link set " + port + " up") == 0;
  }
}

NetnsCluster::~NetnsCluster() {
  for (const auto& ns : made_) {
    sh("ip netns del " + ns);
    sh("rm -rf /etc/netns/" + ns);
  }
}

void NetnsCluster::debian_hosts(int i) {
  sh("mkdir -p /etc/netns/" + ns(i));
  std::ofstream("/etc/netns/" + ns(i) + "/hosts")
      << "127.0.0.1 localhost\n127.0.1.1 node" << i << "\n";
}

void NetnsCluster::cut(int i) { sh("ip -n " + ns(i) + " link set eth0 down"); }
void NetnsCluster::reconnect(int i) { sh("ip -n " + ns(i) + " link set eth0 up"); }

}  // namespace tessel::launcher::testing
