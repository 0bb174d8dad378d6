#include "tessel/collectives/gloo/internal/shm_channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

namespace tessel::internal {
namespace {

constexpr size_t kHeaderBytes = 4096;
static_assert(sizeof(ShmHeader) <= kHeaderBytes);
static_assert(ShmRing::kRingBytes % ShmRing::kAlign == 0);

std::string errno_text(int e) { return std::strerror(e); }

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is in memory shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

uint64_t random_u64() {
  static thread_local std::mt19937_64 engine{std::random_device{}()};
  return engine();
}

// Names are /tessel-a2a-<pid namespace>-<pid>-<random>: a segment is unlinked as soon as its
// peers have mapped it, so a name outlives its process only when that process died during the
// set-up. Each creation sweeps such names of this pid namespace whose process is gone.
std::string name_prefix() { return fmt::format("tessel-a2a-{:x}-", this_pid_namespace()); }

void sweep_stale_names() {
  const std::string prefix = name_prefix();
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::shm_unlink(("/" + name).c_str());
    }
  }
  ::closedir(dir);
}

}  // namespace

size_t ShmSegment::bytes_for(uint32_t rings) {
  return kHeaderBytes + static_cast<size_t>(rings) * sizeof(ShmRing);
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (owner_) ::shm_unlink(name_.c_str());
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    if (owner_) ::shm_unlink(name_.c_str());
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

ShmSegment ShmSegment::create(uint32_t rings, std::string* why) {
  sweep_stale_names();
  ShmSegment s;
  s.bytes_ = bytes_for(rings);
  s.name_ = fmt::format("/{}{}-{:016x}", name_prefix(), ::getpid(), random_u64());
  const int fd = ::shm_open(s.name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    *why = fmt::format("shm_open {}: {}", s.name_, errno_text(errno));
    return {};
  }
  s.owner_ = true;  // from here on the destructor unlinks the name
  // Reserve the memory now: a full tmpfs then fails here rather than raising SIGBUS later.
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(s.bytes_)); e != 0) {
    *why = fmt::format("reserving {} bytes of shared memory: {}", s.bytes_, errno_text(e));
    ::close(fd);
    return {};
  }
  void* base = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = fmt::format("mmap of {}: {}", s.name_, errno_text(map_errno));
    return {};
  }
  s.base_ = base;
  auto* header = new (base) ShmHeader();
  header->nonce[0] = random_u64();
  header->nonce[1] = random_u64();
  header->rings = rings;
  for (uint32_t i = 0; i < rings; ++i) {
    new (&s.ring(i)) ShmRing;  // counters zero; the data bytes stay as they are
  }
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, uint32_t rings, const uint64_t nonce[2],
                            std::string* why) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    *why = fmt::format("shm_open {}: {}", name, errno_text(errno));
    return {};
  }
  struct stat st {};
  const size_t bytes = bytes_for(rings);
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    *why = fmt::format("{} is not the segment announced ({} bytes, expected {})", name,
                       static_cast<long long>(st.st_size), bytes);
    ::close(fd);
    return {};
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = fmt::format("mmap of {}: {}", name, errno_text(map_errno));
    return {};
  }
  ShmSegment s;
  s.base_ = base;
  s.bytes_ = bytes;
  s.name_ = name;
  const ShmHeader& h = s.header();
  if (h.magic != kMagic || h.nonce[0] != nonce[0] || h.nonce[1] != nonce[1] || h.rings != rings) {
    *why = fmt::format("{} is not the segment announced (another host's or process's)", name);
    return {};
  }
  return s;
}

ShmRing& ShmSegment::ring(uint32_t index) const {
  return *reinterpret_cast<ShmRing*>(static_cast<uint8_t*>(base_) + kHeaderBytes +
                                     static_cast<size_t>(index) * sizeof(ShmRing));
}

void ShmSegment::unlink() {
  if (owner_) ::shm_unlink(name_.c_str());
  owner_ = false;
}

void ring_bell(ShmHeader& header) {
  // Only a sleeper costs a write to the shared line and a system call. The fence pairs with the
  // one in snapshot(): either the sleeper's check sees what the caller published just before,
  // or the caller sees its mark here.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header.sleeping.load(std::memory_order_relaxed) != 0) {
    header.bell.fetch_add(1, std::memory_order_seq_cst);
    futex(&header.bell, FUTEX_WAKE, 1, nullptr);
  }
}

uint32_t Doorbell::snapshot() {
  // Marked sleeping before the snapshot: a peer that publishes after our check either sees the
  // mark and rings (changing the bell, so the sleep returns at once or is woken), or published
  // early enough for the check to see it.
  header_.sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return header_.bell.load(std::memory_order_acquire);
}

void Doorbell::sleep(uint32_t value, Nanoseconds limit) {
  const auto ns = std::max<int64_t>(1000, limit.count());
  const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  futex(&header_.bell, FUTEX_WAIT, value, &ts);
  header_.sleeping.store(0, std::memory_order_relaxed);
}

PeerProcess::PeerProcess(int pid, bool watch) : pid_(pid), watch_(watch) {
  if (!watch_) return;
#ifdef SYS_pidfd_open
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
}

PeerProcess::~PeerProcess() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

PeerProcess::PeerProcess(PeerProcess&& other) noexcept { *this = std::move(other); }

PeerProcess& PeerProcess::operator=(PeerProcess&& other) noexcept {
  if (this != &other) {
    if (pidfd_ >= 0) ::close(pidfd_);
    pid_ = other.pid_;
    watch_ = other.watch_;
    pidfd_ = std::exchange(other.pidfd_, -1);
  }
  return *this;
}

bool PeerProcess::exited() const {
  if (!watch_) return false;
  if (pidfd_ >= 0) {
    // A pidfd is readable once the process has terminated (a zombie counts).
    pollfd p{pidfd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP)) != 0;
  }
  return ::kill(pid_, 0) != 0 && errno == ESRCH;
}

std::string this_boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

uint64_t this_pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return (static_cast<uint64_t>(st.st_dev) << 32) ^ static_cast<uint64_t>(st.st_ino);
}

}  // namespace tessel::internal
