#pragma once
// Probes of this host's sockets and addresses that tessel-run makes before it serves or joins a
// rendezvous: a free port to advertise, and whether an endpoint is one of this host's addresses
// and already served here. IPv4 only; no state, thread-safe.

#include <string>

namespace tessel::launcher {

// A free TCP port on this host for MASTER_PORT (torchrun's approach: bind 0, read, close); 0
// when no socket could be bound. The port may be taken again before its user binds it.
int free_port();

// True when HOST of the "host:port" endpoint names an address of one of this host's
// interfaces.
bool endpoint_is_local(const std::string& endpoint);

// True when something on this host already listens on the "host:port" endpoint (another agent
// of the job serves it): checked with a plain bind, so gRPC does not log a bind failure. False
// when HOST is a name rather than an IPv4 address (let gRPC try).
bool endpoint_in_use(const std::string& endpoint);

}  // namespace tessel::launcher
