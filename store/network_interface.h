#pragma once
// Which local address and network interface reach a given host: what the kernel's routing
// table picks for traffic to it. tessel-run binds every worker-facing address (Gloo's, the
// MASTER_ADDR it advertises) to the interface that reaches the rendezvous endpoint, so a host
// whose name resolves to 127.0.1.1 (stock Debian) still talks to its peers on the right
// network. Needs no Gloo; compiled in every build.

#include <string>

namespace tessel {

struct NetworkRoute {
  std::string address;    // the local IP address packets to the host leave from ("10.0.0.2")
  std::string interface;  // the interface holding that address ("eth0"; "lo" for loopback)
};

// The route to `host` (a name, an IPv4 or IPv6 address; "[::1]" accepted). No packet is sent
// (a UDP socket is connected, which only consults the routing table). Throws InvalidArgument
// when the host does not resolve, IoError when no route reaches it.
NetworkRoute network_route_to(const std::string& host);

// The interface holding `address`, or "" when no interface of this host holds it.
std::string interface_with_address(const std::string& address);

// The host part of "host:port" ("[::1]:29400" -> "::1").
std::string endpoint_host(const std::string& endpoint);

}  // namespace tessel
