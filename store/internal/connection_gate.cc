#include "tessel/store/internal/connection_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"

namespace tessel::internal {
namespace {

constexpr uint64_t kListenTag = ~uint64_t{0};
constexpr uint64_t kWakeTag = ~uint64_t{0} - 1;
constexpr auto kSweepEvery = std::chrono::milliseconds(500);

// "host:port" of a socket address, as gRPC prints peers ("[::1]:5000" for IPv6).
std::string host_of(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, text, sizeof(text));
    return text;
  }
  inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, text, sizeof(text));
  return std::string("[") + text + "]";
}

int port_of(const sockaddr_storage& addr) {
  return ntohs(addr.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(addr).sin_port
                                         : reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
}

// gRPC's peer string ("ipv4:10.0.0.2:5000", "ipv6:%5B::1%5D:5000") as "10.0.0.2:5000".
std::string peer_key(std::string_view peer) {
  const size_t colon = peer.find(':');
  if (colon == std::string_view::npos) return std::string(peer);
  std::string out;
  for (size_t i = colon + 1; i < peer.size(); ++i) {
    if (peer[i] == '%' && i + 2 < peer.size()) {
      out.push_back(static_cast<char>(std::stoi(std::string(peer.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(peer[i]);
    }
  }
  return out;
}

size_t default_max_connections() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 65536;
  // Two descriptors per connection (gRPC's and ours), and room for everything else.
  const size_t fds = static_cast<size_t>(limit.rlim_cur);
  return fds > 256 ? (fds - 128) / 2 : 64;
}

}  // namespace

struct ConnectionGate::Connection {
  int dup_fd = -1;
  std::string key;   // "host:port" of the peer
  std::string host;  // the peer's address
  SteadyClock::time_point accepted_at;
  bool authenticated = false;
};

ConnectionGate::ConnectionGate(const std::string& address, ConnectionLimits limits)
    : limits_(limits) {
  if (limits_.max_connections == 0) limits_.max_connections = default_max_connections();
  const size_t colon = address.rfind(':');
  TESSEL_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size(),
               InvalidArgument, "server address '{}' is not host:port (e.g. 127.0.0.1:0)", address);
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  TESSEL_CHECK(rc == 0, IoError, "cannot listen on '{}': the host does not resolve ({})", address,
               gai_strerror(rc));
  int error = 0;
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 4096) != 0) {
      error = errno;
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  TESSEL_CHECK(listen_fd_ >= 0, IoError, "cannot listen on '{}': {}", address,
               std::strerror(error));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = port_of(bound);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) throw_system_error("epoll/eventfd for " + address, errno);
  epoll_event listen_event{.events = EPOLLIN, .data = {.u64 = kListenTag}};
  epoll_event wake_event{.events = EPOLLIN, .data = {.u64 = kWakeTag}};
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &listen_event);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake_event);
}

ConnectionGate::~ConnectionGate() {
  stop();
  for (auto& [fd, c] : by_fd_) ::close(fd);
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void ConnectionGate::attach(grpc::ServerBuilder& builder,
                            std::shared_ptr<grpc::ServerCredentials> credentials) {
  acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      std::move(credentials));
}

void ConnectionGate::start() {
  TESSEL_CHECK(acceptor_ != nullptr, InvalidArgument, "ConnectionGate::start before attach");
  thread_ = std::thread([this] { run(); });
}

void ConnectionGate::stop() {
  {
    MutexLock lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void ConnectionGate::authenticated(std::string_view peer) {
  const std::string key = peer_key(peer);
  MutexLock lock(mutex_);
  auto it = by_peer_.find(key);
  if (it == by_peer_.end() || it->second->authenticated) return;
  it->second->authenticated = true;
  --peers_[it->second->host].unauthenticated;
  --stats_.unauthenticated;
}

ConnectionGateStats ConnectionGate::stats() const {
  MutexLock lock(mutex_);
  return stats_;
}

void ConnectionGate::run() {
  auto next_sweep = SteadyClock::now() + kSweepEvery;
  for (;;) {
    epoll_event events[64];
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next_sweep - SteadyClock::now());
    const int n =
        epoll_wait(epoll_fd_, events, 64, static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (n < 0 && errno != EINTR) {
      log_error(LogComponent::kCollectives, "connection gate: epoll_wait: {}",
                std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) return;
      if (tag == kListenTag) {
        accept_ready();
      } else {
        MutexLock lock(mutex_);
        drop_locked(static_cast<int>(tag), false);  // it closed (either side)
      }
    }
    if (SteadyClock::now() >= next_sweep) {
      MutexLock lock(mutex_);
      sweep_locked();
      next_sweep = SteadyClock::now() + kSweepEvery;
    }
  }
}

void ConnectionGate::accept_ready() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        log_warn(LogComponent::kCollectives, "connection gate: accept: {}", std::strerror(errno));
      }
      return;
    }
    const std::string host = host_of(addr);
    const std::string key = host + ":" + std::to_string(port_of(addr));
    int dup_fd = -1;
    {
      MutexLock lock(mutex_);
      if (!make_room_locked(host)) {
        ++stats_.refused;
        ::close(fd);
        continue;
      }
      dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (dup_fd < 0) {
        ++stats_.refused;
        ::close(fd);
        continue;
      }
      auto c = std::make_unique<Connection>();
      c->dup_fd = dup_fd;
      c->key = key;
      c->host = host;
      c->accepted_at = SteadyClock::now();
      by_peer_[key] = c.get();
      by_fd_[dup_fd] = std::move(c);
      ++peers_[host].unauthenticated;
      ++stats_.unauthenticated;
      ++stats_.connections;
      ++stats_.accepted;
    }
    // Our duplicate tells us when the connection closes (gRPC shuts the socket down first).
    epoll_event ev{.events = EPOLLRDHUP, .data = {.u64 = static_cast<uint64_t>(dup_fd)}};
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, dup_fd, &ev);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters params;
    params.listener_fd = listen_fd_;
    params.fd = fd;
    acceptor_->HandleNewConnection(&params);  // gRPC owns fd from here
  }
}

// Room for one more connection from `host`: within every limit, or after closing the oldest
// unauthenticated connection of that host once it had eviction_age to authenticate.
bool ConnectionGate::make_room_locked(const std::string& host) {
  const bool over = stats_.connections >= limits_.max_connections ||
                    stats_.unauthenticated >= limits_.max_unauthenticated ||
                    peers_[host].unauthenticated >= limits_.max_unauthenticated_per_peer;
  if (!over) return true;
  Connection* oldest = nullptr;
  for (auto& [fd, c] : by_fd_) {
    if (c->authenticated) continue;
    if (peers_[host].unauthenticated >= limits_.max_unauthenticated_per_peer && c->host != host) {
      continue;
    }
    if (oldest == nullptr || c->accepted_at < oldest->accepted_at) oldest = c.get();
  }
  if (oldest == nullptr || SteadyClock::now() - oldest->accepted_at < limits_.eviction_age) {
    return false;
  }
  ++stats_.evicted;
  drop_locked(oldest->dup_fd, true);
  return stats_.connections < limits_.max_connections;
}

void ConnectionGate::sweep_locked() {
  const auto now = SteadyClock::now();
  std::vector<int> expired;
  for (auto& [fd, c] : by_fd_) {
    if (!c->authenticated && now - c->accepted_at > limits_.auth_timeout) expired.push_back(fd);
  }
  for (int fd : expired) {
    ++stats_.evicted;
    drop_locked(fd, true);
  }
}

// Forgets a connection and closes our descriptor; with shut_down, ends the connection itself
// (gRPC sees it end and drops it).
void ConnectionGate::drop_locked(int dup_fd, bool shut_down) {
  auto it = by_fd_.find(dup_fd);
  if (it == by_fd_.end()) return;
  Connection& c = *it->second;
  if (shut_down) shutdown(dup_fd, SHUT_RDWR);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, dup_fd, nullptr);
  if (auto p = by_peer_.find(c.key); p != by_peer_.end() && p->second == &c) by_peer_.erase(p);
  if (!c.authenticated) {
    --peers_[c.host].unauthenticated;
    --stats_.unauthenticated;
  }
  if (peers_[c.host].unauthenticated == 0) peers_.erase(c.host);
  --stats_.connections;
  by_fd_.erase(it);
  ::close(dup_fd);
}

}  // namespace tessel::internal
