#pragma once
// The Gloo backend: CPU tensors over TCP, bootstrapped through the job's Store. broadcast,
// barrier and (between hosts) all_reduce and all_gather are Gloo's own collectives; all_to_all,
// and all_gather, reduce_scatter and all_reduce where ranks share a host, run on a pairwise
// exchange through shared memory with the ranks on this host and TCP with the rest
// (internal/pairwise_exchange.h); reduce_scatter between hosts runs recursive halving or a ring
// over Gloo's point-to-point buffers (internal/reduce_scatter.h). bf16/f16 reductions use
// tessel's reduce functions (f32 accumulation per step). Gloo headers stay inside the backend's
// .cc files; a build without Gloo compiles a stub whose gloo_is_available() is false and whose
// factory throws Unavailable.

#include <memory>
#include <string>

#include "tessel/collectives/process_group.h"
#include "tessel/store/store.h"

namespace tessel {

struct GlooOptions {
  // Address to bind and advertise: a host name or IP ("127.0.0.1" for one-host jobs). Empty:
  // TESSEL_GLOO_IFACE when set (tessel-run sets it to the interface that reaches the job's
  // rendezvous), else the local address that reaches TESSEL_STORE_ADDR, else this host's name.
  std::string hostname = {};
  // Network interface to bind instead of a host name ("eth0"); wins over hostname.
  std::string iface = {};
  ProcessGroupOptions group = {};  // name, id and default timeout (also the connect timeout)
  // Between hosts, reduce_scatter runs recursive halving (log2 n steps, scratch as large as
  // the input) on power-of-two groups for inputs up to this size, a ring (n - 1 steps, three
  // chunks of scratch) otherwise. Sub-groups made by split inherit it.
  size_t halving_max_bytes = size_t{8} << 20;
  // On one host, reduce_scatter and all_reduce hold the peers' pieces of this rank's chunk in
  // scratch of about this size, exchanging larger chunks in rounds (at most 255, so a chunk
  // over 255 times this takes a larger scratch). Every rank must pass the same value.
  size_t exchange_scratch_bytes = size_t{64} << 20;
  // all_to_all, all_gather, reduce_scatter and all_reduce move data through shared memory
  // between ranks on one host (a pair uses it when both enable it and each can map the other's
  // segment; TCP otherwise).
  // TESSEL_GLOO_SHM=0 turns it off too. Sub-groups made by split inherit both fields.
  bool shared_memory = true;
  // Ranks whose host_id is equal are taken to share a host (empty: the kernel's boot id, so
  // ranks on one machine, whatever their network namespace). A pairing is still checked by
  // mapping the peer's segment. For tests that stand in several hosts on one.
  std::string host_id = {};
  // Ranks of the job on this host (0: not known; init_process_group passes the launcher's
  // LOCAL_WORLD_SIZE). With more ranks than CPUs, a rank waiting on shared memory yields its CPU
  // instead of spinning. Sub-groups made by split inherit it.
  int local_world_size = 0;
};

// The backend's factory, named as every backend's is: gloo::create_process_group,
// nccl::create_process_group, mpi::create_world, threads::create_world,
// fake::create_process_group (each with is_available() where the build may lack it).
namespace gloo {

// True when this build has the Gloo backend.
bool is_available();

// Connects `size` ranks (collective: every rank calls it with the same store and options).
// Sets SIGPIPE to ignored when it still has its default action, so a peer that died is an error
// (PeerLost/CommError) rather than a silent death of this rank.
// Keys live under "gloo/<group id>/" in `store`. Throws Unavailable without Gloo, Timeout when
// peers do not appear within options.group.timeout, CommError when the transport fails.
std::shared_ptr<ProcessGroup> create_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                   GlooOptions options = {});

}  // namespace gloo

}  // namespace tessel
