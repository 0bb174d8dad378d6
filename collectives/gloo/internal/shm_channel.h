#pragma once
// Private: shared-memory byte channels between processes of one host, for the Gloo backend's
// pairwise exchange (gloo/internal/pairwise_exchange.h). Each process owns one segment (POSIX
// shared memory, unlinked as soon as its peers have mapped it) holding a doorbell and one
// single-producer, single-consumer ring per peer that sends to it. A sender copies its bytes —
// packing a strided view as it goes — straight into the receiver's ring, and the receiver copies
// them out: two passes over the data in all, where TCP over loopback makes three for a strided view
// (pack, kernel in, kernel out).
//
// Waiting: a process that can make no progress spins briefly, then sleeps on its doorbell (a
// futex in its own segment) which every peer rings after publishing bytes to it or freeing
// space in a ring it writes; the sleep is capped so a dead peer is noticed (PeerProcess).
//
// Thread-safety: a ring has one writer and one reader, each a single thread (the backend runs a
// group's calls one at a time). Nothing here allocates after setup.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tessel/base/clock.h"

namespace tessel::internal {

// One direction between two processes: a ring of kRingBytes with monotonically growing byte
// counts. The writer advances `head` after copying into the ring, the reader `tail` after
// copying out; head - tail is what is in the ring. Every count moves in multiples of 64 bytes.
struct alignas(64) ShmRing {
  static constexpr size_t kRingBytes = size_t{256} << 10;
  static constexpr size_t kAlign = 64;

  alignas(64) std::atomic<uint64_t> head{0};
  alignas(64) std::atomic<uint64_t> tail{0};
  // Set by the reader when the writer's call does not match its own (its call id, sequence
  // number and phase, or its byte count); the writer then stops and reports the same mismatch.
  // Read by both.
  alignas(64) std::atomic<uint32_t> fault{0};
  uint64_t fault_call = 0, fault_expected = 0, fault_sent = 0;  // the call id as sent
  alignas(64) uint8_t data[kRingBytes];
};

// The first bytes of a process's segment: identity (checked by the peers that map it) and the
// process's doorbell.
struct alignas(64) ShmHeader {
  uint64_t magic = 0;
  uint64_t nonce[2] = {0, 0};
  uint32_t rings = 0;
  alignas(64) std::atomic<uint32_t> bell{0};
  alignas(64) std::atomic<uint32_t> sleeping{0};
};

// A process's segment: its header, then `rings` rings (one per peer that sends to it, in an
// order both ends derive from the group's ranks).
class ShmSegment {
 public:
  static constexpr uint64_t kMagic = 0x7465737365'6c3161ull;  // "tessel1a"

  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  static size_t bytes_for(uint32_t rings);

  // Creates this process's segment under a fresh name, with its memory reserved (a tmpfs that
  // is full fails here, not with SIGBUS at the first write). Empty segment and *why set when
  // shared memory is unavailable.
  static ShmSegment create(uint32_t rings, std::string* why);
  // Maps a peer's segment, checking its magic, nonce and ring count. Empty and *why set when it
  // cannot be opened (another host's /dev/shm, another user) or is not the one announced.
  static ShmSegment open(const std::string& name, uint32_t rings, const uint64_t nonce[2],
                         std::string* why);

  bool valid() const { return base_ != nullptr; }
  const std::string& name() const { return name_; }
  ShmHeader& header() const { return *static_cast<ShmHeader*>(base_); }
  ShmRing& ring(uint32_t index) const;
  // Removes the name; the mappings stay. Idempotent; done by the creator once peers mapped it.
  void unlink();

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;  // created it, so unlinks a name left behind
};

// Rings `header`'s doorbell: wakes its process if it sleeps.
void ring_bell(ShmHeader& header);

// This process's side of its doorbell: call snapshot(), check for progress, then sleep(value)
// when there was none; a ring after the snapshot makes the sleep return at once.
class Doorbell {
 public:
  explicit Doorbell(ShmHeader& header) : header_(header) {}
  uint32_t snapshot();
  // Sleeps until rung or `limit` passes; clears the sleeping mark.
  void sleep(uint32_t value, Nanoseconds limit);
  // Clears the sleeping mark without sleeping (progress after the snapshot).
  void cancel() { header_.sleeping.store(0, std::memory_order_relaxed); }

 private:
  ShmHeader& header_;
};

// A peer process on this host, for noticing that it died: through a pidfd where the kernel has
// them, else by signalling pid 0. Only meaningful in the same pid namespace; `watch` is false
// otherwise and exited() never says true.
class PeerProcess {
 public:
  PeerProcess() = default;
  PeerProcess(int pid, bool watch);
  ~PeerProcess();
  PeerProcess(PeerProcess&& other) noexcept;
  PeerProcess& operator=(PeerProcess&& other) noexcept;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  bool exited() const;
  int pid() const { return pid_; }

 private:
  int pid_ = 0;
  int pidfd_ = -1;
  bool watch_ = false;
};

// Identity of this host and process for pairing peers: the kernel's boot id (same kernel, so
// possibly the same /dev/shm; the nonce check decides) and the pid namespace's inode.
std::string this_boot_id();
uint64_t this_pid_namespace();

}  // namespace tessel::internal
