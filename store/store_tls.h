#pragma once
// TLS for the job's store and the launcher's rendezvous service (one gRPC server serves both):
// PEM files, off unless configured. Without TLS the job's token still authenticates every call;
// TLS adds encryption and, with a CA on the server, mutual authentication by certificate.
//
//   server: cert + key (TLS); cert + key + ca (mutual TLS: clients need a certificate from ca)
//   client: ca (verify the server; empty: the system's roots); cert + key (mutual TLS)
//
// The server's certificate must name the host clients connect to (a DNS or IP subject
// alternative name), as in any TLS deployment. See docs/store.md.

#include <string>

namespace tessel {

struct TlsFiles {
  std::string cert;  // this side's certificate chain
  std::string key;   // its private key
  std::string ca;    // certificates of the other side must chain to this CA
  // A server serves TLS when it has a certificate; a client speaks TLS when it has either.
  bool server_enabled() const { return !cert.empty(); }
  bool client_enabled() const { return !cert.empty() || !ca.empty(); }
};

// TESSEL_TLS_CERT, TESSEL_TLS_KEY and TESSEL_TLS_CA (tessel-run sets them for its workers when
// it was given --rdzv-tls-* flags).
TlsFiles tls_files_from_env();

}  // namespace tessel
