#include "tessel/launcher/socket_probe.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace tessel::launcher {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

bool endpoint_is_local(const std::string& endpoint) {
  const std::string host = endpoint.substr(0, endpoint.rfind(':'));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  ifaddrs* ifs = nullptr;
  bool local = false;
  if (getifaddrs(&ifs) == 0) {
    for (addrinfo* a = res; a != nullptr && !local; a = a->ai_next) {
      const auto want = reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr;
      for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want) {
          local = true;
          break;
        }
      }
    }
    freeifaddrs(ifs);
  }
  freeaddrinfo(res);
  return local;
}

bool endpoint_in_use(const std::string& endpoint) {
  const std::string host = endpoint.substr(0, endpoint.rfind(':'));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port =
      htons(static_cast<uint16_t>(std::atoi(endpoint.c_str() + endpoint.rfind(':') + 1)));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return false;  // a name: let gRPC try
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool in_use =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

}  // namespace tessel::launcher
