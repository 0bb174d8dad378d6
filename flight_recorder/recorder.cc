#include "tessel/flight_recorder/recorder.h"

#include <execinfo.h>
#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <new>
#include <sstream>

#include "tessel/base/clock.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/flight_recorder/record_text.h"

namespace tessel::fr {

std::string_view op_name(OpType op) {
  switch (op) {
    case OpType::kAllReduce:
      return "all_reduce";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kAllGather:
      return "all_gather";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kAllToAll:
      return "all_to_all";
    case OpType::kSend:
      return "send";
    case OpType::kRecv:
      return "recv";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kUserEvent:
      return "user_event";
    case OpType::kSplit:
      return "split";
    case OpType::kReduce:
      return "reduce";
    case OpType::kGather:
      return "gather";
    case OpType::kScatter:
      return "scatter";
    case OpType::kUserSpan:
      return "user_span";
  }
  return "unknown";
}

std::string_view reduce_op_text(std::optional<ReduceOp> op) {
  return op ? reduce_op_name(*op) : std::string_view("none");
}

std::string_view state_name(EntryState state) {
  switch (state) {
    case EntryState::kScheduled:
      return "scheduled";
    case EntryState::kStarted:
      return "started";
    case EntryState::kCompleted:
      return "completed";
    case EntryState::kFailed:
      return "failed";
  }
  return "unknown";
}

TensorMeta TensorMeta::make(std::string_view dtype, std::initializer_list<int64_t> shape) {
  return make(dtype, shape.begin(), static_cast<int>(shape.size()));
}

TensorMeta TensorMeta::make(std::string_view dtype, const int64_t* shape, int ndim) {
  TensorMeta m;
  const size_t n = std::min(dtype.size(), sizeof(m.dtype) - 1);
  if (n > 0) std::memcpy(m.dtype, dtype.data(), n);
  m.numel = 1;
  for (int i = 0; i < ndim; ++i) m.numel *= shape[i];
  // Keep the leading dims; fold any beyond kMaxDims into the last kept one.
  m.ndim = static_cast<uint8_t>(std::min(ndim, kMaxDims));
  for (int i = 0; i < m.ndim; ++i) m.shape[i] = shape[i];
  for (int i = kMaxDims; i < ndim; ++i) m.shape[kMaxDims - 1] *= shape[i];
  return m;
}

namespace {

uint32_t this_thread_id() noexcept {
  // initial-exec: a plain %fs-relative load, not a __tls_get_addr call, on the recording path.
  static thread_local uint32_t tid __attribute__((tls_model("initial-exec"))) = 0;
  if (tid == 0) tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  return tid;
}

// The calling thread's ThreadScope, read by every record.
struct ThreadTag {
  char purpose[kMaxPurpose];
  int64_t step;
};
ThreadTag& this_thread_tag() noexcept {
  static thread_local ThreadTag tag __attribute__((tls_model("initial-exec"))) = {{}, -1};
  return tag;
}

// The calling thread's ScopedRecordText (record_text.h), read by every record without text.
char* this_thread_record_text() noexcept {
  static thread_local char text[kMaxRecordText] __attribute__((tls_model("initial-exec"))) = {};
  return text;
}

enum : uint8_t { kTicksAreNanoseconds = 0, kTicksAreCycles = 1 };

}  // namespace

static_assert(sizeof(Entry::text) == kMaxRecordText, "record_text.h sizes the entry's text");

ScopedRecordText::ScopedRecordText(std::string_view text) noexcept {
  char* current = this_thread_record_text();
  std::memcpy(previous_, current, kMaxRecordText);
  const size_t n = std::min(text.size(), kMaxRecordText - 1);
  std::memset(current, 0, kMaxRecordText);
  if (n > 0) std::memcpy(current, text.data(), n);
}

ScopedRecordText::~ScopedRecordText() {
  std::memcpy(this_thread_record_text(), previous_, kMaxRecordText);
}

std::string_view record_text() noexcept {
  const char* text = this_thread_record_text();
  return std::string_view(text, strnlen(text, kMaxRecordText));
}

ThreadScope::ThreadScope(std::string_view purpose, int64_t step) noexcept {
  ThreadTag& tag = this_thread_tag();
  std::memcpy(previous_purpose_, tag.purpose, kMaxPurpose);
  previous_step_ = tag.step;
  const size_t n = std::min(purpose.size(), kMaxPurpose - 1);
  std::memset(tag.purpose, 0, kMaxPurpose);
  if (n > 0) std::memcpy(tag.purpose, purpose.data(), n);
  tag.step = step;
}

ThreadScope::~ThreadScope() {
  ThreadTag& tag = this_thread_tag();
  std::memcpy(tag.purpose, previous_purpose_, kMaxPurpose);
  tag.step = previous_step_;
}

std::string_view thread_purpose() noexcept {
  const ThreadTag& tag = this_thread_tag();
  return std::string_view(tag.purpose, strnlen(tag.purpose, kMaxPurpose));
}

// What a slot stores: an Entry without its stack (stacks live in their own array, present only
// when they are captured), with times in recorder ticks. Kept small: five cache lines a slot.
struct FlightRecorder::Record {
  uint64_t record_id;
  uint64_t group_id;
  uint64_t seq;
  uint64_t p2p_seq;
  int64_t enqueued, started, completed;  // ticks; 0 = not yet
  int64_t step;
  int32_t peer;
  int32_t root;
  uint32_t coalesced_id;
  uint32_t coalesced_index;
  uint32_t callsite_id;
  uint32_t thread_id;
  OpType op;
  std::optional<ReduceOp> reduce_op;
  EntryState state;
  uint8_t stack_depth;
  TensorMeta input, output;
  char text[sizeof(Entry::text)];
  char purpose[kMaxPurpose];
};

struct FlightRecorder::StackFrames {
  uintptr_t frames[kMaxStackFrames];
};

// A slot is guarded by a sequence number: even = stable, odd = a writer holds it. Writers take
// it with a compare-exchange (held for a few stores, so contention is a brief spin at most);
// readers copy and retry when the number moved.
struct alignas(64) FlightRecorder::Slot {
  std::atomic<uint64_t> version{0};
  Record record{};

  uint64_t lock() noexcept {
    uint64_t v = version.load(std::memory_order_relaxed);
    for (;;) {
      if ((v & 1) == 0 && version.compare_exchange_weak(v, v + 1, std::memory_order_acquire,
                                                        std::memory_order_relaxed)) {
        std::atomic_thread_fence(std::memory_order_release);
        return v;
      }
      v = version.load(std::memory_order_relaxed);
    }
  }
  void unlock(uint64_t v) noexcept { version.store(v + 2, std::memory_order_release); }
};

// Fixed layout, shared by heap rings and ring files:
//   [Header][Slot x capacity][StackFrames x capacity, when stacks are captured]
//   [DropCounter x kMaxTrackedGroups][group text, ring files only]
// The group text is one line per registration: "<id>\t<name>\t<rank>,<rank>,...\n".
struct FlightRecorder::Header {
  static constexpr char kMagic[8] = {'T', 'S', 'L', 'F', 'R', 'R', 'N', 'G'};
  // Version 3 added the user_span op, version 4 the run id in the process info (a larger
  // header), version 5 the entry's thread purpose (a larger record): older files are refused.
  static constexpr uint32_t kVersion = 5;
  static constexpr uint32_t kOldestVersion = 5;
  char magic[8];
  uint32_t version;
  uint32_t slot_size;
  uint64_t capacity;
  uint64_t group_bytes;  // size of the group text area
  uint8_t capture_stack;
  uint8_t tick_kind;   // kTicksAreNanoseconds or kTicksAreCycles
  CycleAnchor anchor;  // cycles: the counter and the raw clock before the first record
  std::atomic<uint64_t> next_id{1};
  std::atomic<int64_t> step{-1};
  std::atomic<uint64_t> group_used{0};
  ProcessInfo process;
};

namespace {

constexpr size_t kRingFileGroupBytes = 1 << 20;

constexpr size_t round_up(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

struct FlightRecorder::Storage {
  std::byte* base = nullptr;
  size_t size = 0;
  bool mapped = false;
  size_t slots_offset = 0, stacks_offset = 0, drops_offset = 0, groups_offset = 0;

  Storage(size_t capacity, size_t group_bytes, bool stacks) {
    slots_offset = round_up(sizeof(Header));
    stacks_offset = round_up(slots_offset + capacity * sizeof(Slot));
    drops_offset = round_up(stacks_offset + (stacks ? capacity * sizeof(StackFrames) : 0));
    groups_offset = round_up(drops_offset + kMaxTrackedGroups * sizeof(DropCounter));
    size = groups_offset + group_bytes;
  }
  ~Storage() {
    if (base == nullptr) return;
    if (mapped) {
      ::munmap(base, size);
    } else {
      ::operator delete (base, std::align_val_t{64});
    }
  }
  Header* header() const { return reinterpret_cast<Header*>(base); }
  Slot* slots() const { return reinterpret_cast<Slot*>(base + slots_offset); }
  StackFrames* stacks() const { return reinterpret_cast<StackFrames*>(base + stacks_offset); }
  DropCounter* drops() const { return reinterpret_cast<DropCounter*>(base + drops_offset); }
  char* group_text() const { return reinterpret_cast<char*>(base + groups_offset); }
};

FlightRecorder::FlightRecorder(RecorderOptions options)
    : capacity_(options.capacity),
      mask_((options.capacity & (options.capacity - 1)) == 0 ? options.capacity - 1 : 0),
      capture_stack_(options.capture_stack),
      cycles_(options.clock == nullptr && options.use_cycle_clock && CycleClock::usable()),
      clock_(options.clock),
      wall_clock_(options.wall_clock) {
  TESSEL_CHECK(options.capacity > 0, InvalidArgument,
               "flight recorder capacity must be at least 1 entry, got 0");
  const bool file = !options.ring_file.empty();
  storage_ = std::make_unique<Storage>(capacity_, file ? kRingFileGroupBytes : 0, capture_stack_);
  if (file) {
    const int fd = ::open(options.ring_file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw_system_error(fmt::format("flight recorder ring file '{}'", options.ring_file), errno);
    }
    void* base = MAP_FAILED;
    int err = 0;
    if (::ftruncate(fd, static_cast<off_t>(storage_->size)) != 0) {
      err = errno;
    } else {
      base = ::mmap(nullptr, storage_->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) err = errno;
    }
    ::close(fd);
    if (err != 0) {
      throw_system_error(fmt::format("flight recorder ring file '{}'", options.ring_file), err);
    }
    storage_->base = static_cast<std::byte*>(base);
    storage_->mapped = true;
    ring_path_ = options.ring_file;
  } else {
    storage_->base = static_cast<std::byte*>(::operator new (storage_->size, std::align_val_t{64}));
  }
  header_ = new (storage_->base) Header();
  std::memcpy(header_->magic, Header::kMagic, sizeof(Header::kMagic));
  header_->version = Header::kVersion;
  header_->slot_size = sizeof(Slot);
  header_->capacity = capacity_;
  header_->group_bytes = file ? kRingFileGroupBytes : 0;
  header_->capture_stack = capture_stack_ ? 1 : 0;
  header_->tick_kind = cycles_ ? kTicksAreCycles : kTicksAreNanoseconds;
  if (cycles_) header_->anchor = CycleClock::anchor();
  header_->process.pid = static_cast<int>(::getpid());
  slots_ = storage_->slots();
  for (size_t i = 0; i < capacity_; ++i) new (&slots_[i]) Slot();
  stacks_ = capture_stack_ ? storage_->stacks() : nullptr;
  if (stacks_ != nullptr) {
    for (size_t i = 0; i < capacity_; ++i) new (&stacks_[i]) StackFrames();
  }
  drops_ = storage_->drops();
  for (size_t i = 0; i < kMaxTrackedGroups; ++i) new (&drops_[i]) DropCounter();
}

FlightRecorder::FlightRecorder(std::unique_ptr<Storage> storage, bool capture_stack)
    : capacity_(storage->header()->capacity),
      mask_((capacity_ & (capacity_ - 1)) == 0 ? capacity_ - 1 : 0),
      capture_stack_(capture_stack),
      cycles_(storage->header()->tick_kind == kTicksAreCycles),
      clock_(nullptr),
      wall_clock_(nullptr),
      storage_(std::move(storage)),
      header_(storage_->header()),
      slots_(storage_->slots()),
      stacks_(capture_stack ? storage_->stacks() : nullptr),
      drops_(storage_->drops()),
      enabled_(false) {}

std::unique_ptr<FlightRecorder> FlightRecorder::recover(const std::string& ring_file) {
  const int fd = ::open(ring_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_system_error(fmt::format("cannot open ring file '{}'", ring_file), errno);
  struct stat st = {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const size_t file_size = stat_ok ? static_cast<size_t>(st.st_size) : 0;
  alignas(Header) unsigned char raw[sizeof(Header)] = {};
  const Header& probe = *reinterpret_cast<const Header*>(raw);
  const bool header_ok = file_size >= sizeof(Header) &&
                         ::pread(fd, raw, sizeof(Header), 0) == sizeof(Header) &&
                         std::memcmp(probe.magic, Header::kMagic, sizeof(probe.magic)) == 0;
  if (!header_ok) {
    ::close(fd);
    throw InvalidArgument(fmt::format(
        "'{}' is not a flight-recorder ring file (too short or wrong magic)", ring_file));
  }
  auto storage =
      std::make_unique<Storage>(probe.capacity, probe.group_bytes, probe.capture_stack != 0);
  const bool layout_ok = probe.version >= Header::kOldestVersion &&
                         probe.version <= Header::kVersion && probe.slot_size == sizeof(Slot) &&
                         probe.capacity > 0 && probe.capacity < (1ull << 32) &&
                         probe.tick_kind <= kTicksAreCycles && probe.group_bytes <= (1ull << 30) &&
                         storage->size == file_size;
  if (!layout_ok) {
    ::close(fd);
    throw InvalidArgument(fmt::format(
        "ring file '{}': version {}, slot size {}, capacity {}, {} bytes; this build reads "
        "versions {} to {} with {}-byte slots and a file size matching the capacity",
        ring_file, probe.version, probe.slot_size, probe.capacity, file_size,
        Header::kOldestVersion, Header::kVersion, sizeof(Slot)));
  }
  // A private copy-on-write mapping: reading never changes the file.
  void* base = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) throw_system_error(fmt::format("cannot map '{}'", ring_file), err);
  storage->base = static_cast<std::byte*>(base);
  storage->mapped = true;
  const Header* h = storage->header();
  const std::string text(storage->group_text(),
                         std::min<uint64_t>(h->group_used.load(), h->group_bytes));
  std::unique_ptr<FlightRecorder> r(new FlightRecorder(std::move(storage), probe.capture_stack));
  // Re-register the groups from their text lines (malformed lines are skipped).
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t tab1 = line.find('\t'), tab2 = line.find('\t', tab1 + 1);
    if (tab1 == std::string::npos || tab2 == std::string::npos) continue;
    GroupInfo g;
    g.id = std::strtoull(line.substr(0, tab1).c_str(), nullptr, 10);
    g.name = line.substr(tab1 + 1, tab2 - tab1 - 1);
    std::istringstream ranks(line.substr(tab2 + 1));
    for (std::string rank; std::getline(ranks, rank, ',');) {
      if (!rank.empty()) g.ranks.push_back(std::atoi(rank.c_str()));
    }
    r->register_group(g.id, std::move(g.name), std::move(g.ranks));
  }
  return r;
}

FlightRecorder::~FlightRecorder() {
  const GroupNode* n = groups_head_.load(std::memory_order_acquire);
  while (n != nullptr) {
    const GroupNode* next = n->next;
    delete n;
    n = next;
  }
}

int64_t FlightRecorder::monotonic_ns_() noexcept { return monotonic_ns(); }

int64_t FlightRecorder::wall_now_us() const noexcept {
  return wall_clock_ != nullptr ? wall_clock_() : wall_time_us();
}

FlightRecorder& FlightRecorder::global() {
  static FlightRecorder* recorder = [] {
    const int64_t capacity = env_int(EnvKnob::kFrCapacity);
    TESSEL_CHECK(capacity > 0, InvalidArgument, "TESSEL_FR_CAPACITY={} must be positive", capacity);
    RecorderOptions options;
    options.capacity = static_cast<size_t>(capacity);
    options.capture_stack = env_bool(EnvKnob::kFrStack);
    options.use_cycle_clock = env_bool(EnvKnob::kFrTsc);
    const std::string ring_dir = env_string(EnvKnob::kFrRingDir);
    if (!ring_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(ring_dir, ec);
      TESSEL_CHECK(!ec, IoError, "TESSEL_FR_RING_DIR='{}': cannot create it: {}", ring_dir,
                   ec.message());
      options.ring_file =
          (std::filesystem::path(ring_dir) / ring_file_name("", -1, ::getpid())).string();
    }
    auto* r = new FlightRecorder(options);
    r->name_ring_ = !options.ring_file.empty();
    r->set_enabled(env_bool(EnvKnob::kFrEnable));
    return r;
  }();
  return *recorder;
}

void FlightRecorder::set_process_info(int rank, int world_size) {
  TESSEL_CHECK(rank >= 0 && world_size > 0 && rank < world_size, InvalidArgument,
               "flight recorder process info: rank {} is not in a world of size {}", rank,
               world_size);
  ProcessInfo& p = header_->process;
  p.rank = rank;
  p.world_size = world_size;
  p.pid = static_cast<int>(::getpid());
  char host[sizeof(p.hostname)] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  std::memcpy(p.hostname, host, sizeof(host));
  std::lock_guard lock(groups_mutex_);
  name_ring_file();
}

void FlightRecorder::set_run_id(std::string_view run_id) {
  ProcessInfo& p = header_->process;
  char id[sizeof(p.run_id)] = {};
  std::memcpy(id, run_id.data(), std::min(run_id.size(), sizeof(id) - 1));
  std::memcpy(p.run_id, id, sizeof(id));
  std::lock_guard lock(groups_mutex_);
  name_ring_file();
}

std::string FlightRecorder::ring_file() const {
  std::lock_guard lock(groups_mutex_);
  return ring_path_;
}

void FlightRecorder::name_ring_file() {
  const ProcessInfo& p = header_->process;
  if (!name_ring_ || ring_path_.empty() || p.rank < 0) return;
  const std::filesystem::path from = ring_path_;
  const auto to = from.parent_path() / ring_file_name(p.run_id, p.rank, p.pid);
  if (to == from) return;
  // The mapping stays valid across a rename; a failure only leaves the old name.
  if (::rename(from.c_str(), to.c_str()) != 0) {
    log_warn(LogComponent::kFlightRecorder, "cannot rename ring file '{}' to '{}': {}",
             from.string(), to.string(), std::strerror(errno));
    return;
  }
  ring_path_ = to.string();
}

std::string ring_file_name(std::string_view run_id, int rank, int pid) {
  if (rank < 0) return fmt::format("tessel_fr_{}.ring", pid);
  if (run_id.empty()) return fmt::format("tessel_fr_rank{}.ring", rank);
  return fmt::format("tessel_fr_{}_rank{}.ring", run_id, rank);
}

const ProcessInfo& FlightRecorder::process_info() const noexcept { return header_->process; }

void FlightRecorder::set_step(int64_t step) noexcept {
  step_thread_.store(this_thread_id(), std::memory_order_relaxed);
  header_->step.store(step, std::memory_order_relaxed);
}

int64_t FlightRecorder::step() const noexcept {
  return header_->step.load(std::memory_order_relaxed);
}

uint64_t FlightRecorder::recorded() const {
  return header_->next_id.load(std::memory_order_acquire) - 1;
}

void FlightRecorder::append_group_to_file(const GroupInfo& group) {
  if (header_->group_bytes == 0) return;
  std::string name = group.name;
  std::replace_if(
      name.begin(), name.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
  std::string line = fmt::format("{}\t{}\t{}\n", group.id, name, fmt::join(group.ranks, ","));
  const uint64_t used = header_->group_used.load(std::memory_order_relaxed);
  if (used + line.size() > header_->group_bytes) {
    log_warn(LogComponent::kFlightRecorder,
             "ring file group area full: group {} '{}' will be missing from recovered dumps",
             group.id, group.name);
    return;
  }
  std::memcpy(storage_->group_text() + used, line.data(), line.size());
  header_->group_used.store(used + line.size(), std::memory_order_release);
}

void FlightRecorder::register_group(uint64_t id, std::string name, std::vector<int> ranks) {
  std::lock_guard lock(groups_mutex_);
  auto* node = new GroupNode{GroupInfo{id, std::move(name), std::move(ranks)},
                             groups_head_.load(std::memory_order_relaxed)};
  append_group_to_file(node->info);
  groups_head_.store(node, std::memory_order_release);
}

std::vector<GroupInfo> FlightRecorder::groups() const {
  std::vector<GroupInfo> out;
  for_each_group([&](const GroupInfo& g) { out.push_back(g); });
  std::reverse(out.begin(), out.end());  // registration order
  return out;
}

void FlightRecorder::note_dropped(const Record& old) noexcept {
  // Open addressing over a fixed table; a full table loses the count (documented limit).
  const size_t start = static_cast<size_t>(old.group_id * 0x9E3779B97F4A7C15ull >> 54);
  for (size_t probe = 0; probe < kMaxTrackedGroups; ++probe) {
    DropCounter& c = drops_[(start + probe) % kMaxTrackedGroups];
    uint8_t state = c.state.load(std::memory_order_acquire);
    if (state == 0) {
      uint8_t expected = 0;
      if (c.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        c.group_id = old.group_id;
        c.state.store(2, std::memory_order_release);
        state = 2;
      } else {
        state = expected;
      }
    }
    while (state == 1) state = c.state.load(std::memory_order_acquire);
    if (c.group_id != old.group_id) continue;
    // The count is informational (racing overwriters may lose an increment); a plain
    // load/store keeps a locked instruction off the recording path.
    c.dropped.store(c.dropped.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const bool collective = old.op != OpType::kSend && old.op != OpType::kRecv &&
                            old.op != OpType::kUserEvent && old.op != OpType::kUserSpan;
    if (collective) {
      uint64_t cur = c.last_dropped_seq.load(std::memory_order_relaxed);
      while (old.seq > cur &&
             !c.last_dropped_seq.compare_exchange_weak(cur, old.seq, std::memory_order_relaxed)) {
      }
    }
    return;
  }
}

std::vector<GroupDrops> FlightRecorder::dropped() const {
  std::vector<GroupDrops> out;
  for_each_dropped([&](const GroupDrops& d) { out.push_back(d); });
  std::sort(out.begin(), out.end(),
            [](const GroupDrops& a, const GroupDrops& b) { return a.group_id < b.group_id; });
  return out;
}

uint64_t FlightRecorder::record(const RecordArgs& args) noexcept { return record_(args, false); }

uint64_t FlightRecorder::record_started(const RecordArgs& args) noexcept {
  return record_(args, true);
}

uint64_t FlightRecorder::record_(const RecordArgs& args, bool started) noexcept {
  if (!enabled()) return 0;
  const uint64_t id = header_->next_id.fetch_add(1, std::memory_order_acq_rel);
  const size_t index = slot_index(id);
  Slot& slot = slots_[index];
  const uint64_t v = slot.lock();
  Record& r = slot.record;
  if (r.record_id != 0) note_dropped(r);
  const int64_t now = ticks();
  r.record_id = id;
  r.group_id = args.group_id;
  r.seq = args.seq;
  r.p2p_seq = args.p2p_seq;
  r.enqueued = now;
  r.started = started ? now : 0;
  r.completed = 0;
  // The training step belongs to the thread that set it; a scoped thread carries its own.
  const uint32_t tid = this_thread_id();
  const ThreadTag& tag = this_thread_tag();
  std::memcpy(r.purpose, tag.purpose, kMaxPurpose);
  if (tag.purpose[0] != '\0') {
    r.step = tag.step;
  } else {
    r.step = tid == step_thread_.load(std::memory_order_relaxed) ? step() : -1;
  }
  r.peer = args.peer;
  r.root = args.root;
  r.coalesced_id = args.coalesced_id;
  r.coalesced_index = args.coalesced_index;
  r.callsite_id = args.callsite_id;
  r.thread_id = tid;
  r.op = args.op;
  r.reduce_op = args.reduce_op;
  r.state = started ? EntryState::kStarted : EntryState::kScheduled;
  r.input = args.input;
  r.output = args.output;
  // Without text of its own, the calling thread's ScopedRecordText names the operation.
  const std::string_view text = args.text.empty() ? record_text() : args.text;
  const size_t n = std::min(text.size(), sizeof(r.text) - 1);
  if (n > 0) std::memcpy(r.text, text.data(), n);
  r.text[n] = '\0';
  r.stack_depth = 0;
  if (stacks_ != nullptr) {
    void* frames[kMaxStackFrames + 1];
    const int depth = ::backtrace(frames, kMaxStackFrames + 1);
    // Frame 0 is record_() itself.
    r.stack_depth = static_cast<uint8_t>(depth > 1 ? depth - 1 : 0);
    for (int i = 1; i < depth; ++i) {
      stacks_[index].frames[i - 1] = reinterpret_cast<uintptr_t>(frames[i]);
    }
  }
  slot.unlock(v);
  // The next record writes the next slot: fetch its lines now, while the operation runs, so that
  // record does not wait on memory (the ring is larger than the caches).
  const char* next = reinterpret_cast<const char*>(&slots_[slot_index(id + 1)]);
  for (size_t line = 0; line < sizeof(Slot); line += 64) __builtin_prefetch(next + line, 1, 3);
  return id;
}

uint64_t FlightRecorder::record_event(std::string_view text) noexcept {
  RecordArgs args;
  args.op = OpType::kUserEvent;
  args.text = text;
  const uint64_t id = record_started(args);
  completed(id);
  return id;
}

uint64_t FlightRecorder::begin_span(std::string_view text) noexcept {
  RecordArgs args;
  args.op = OpType::kUserSpan;
  args.text = text;
  return record_started(args);
}

void FlightRecorder::set_state(uint64_t record_id, EntryState state) noexcept {
  if (record_id == 0) return;
  Slot& slot = slots_[slot_index(record_id)];
  const uint64_t v = slot.lock();
  Record& r = slot.record;
  if (r.record_id == record_id) {
    const int64_t now = ticks();
    r.state = state;
    if (state == EntryState::kStarted) {
      r.started = now;
    } else {
      if (r.started == 0) r.started = now;
      r.completed = now;
    }
  }
  slot.unlock(v);
}

void FlightRecorder::started(uint64_t record_id) noexcept {
  set_state(record_id, EntryState::kStarted);
}
void FlightRecorder::completed(uint64_t record_id) noexcept {
  set_state(record_id, EntryState::kCompleted);
}
void FlightRecorder::failed(uint64_t record_id) noexcept {
  set_state(record_id, EntryState::kFailed);
}

void FlightRecorder::completed(uint64_t record_id, Nanoseconds device_time) noexcept {
  if (record_id == 0) return;
  // Now, and the duration in ticks: with cycle ticks, at the counter's rate measured against the
  // raw clock since the anchor (the rate TickConverter reads them back at).
  int64_t now = 0;
  int64_t span = std::max<int64_t>(device_time.count(), 0);
  if (clock_ == nullptr && cycles_) {
    const CycleAnchor at = CycleClock::anchor();
    const CycleAnchor& start = header_->anchor;
    now = at.tick;
    if (at.raw_ns > start.raw_ns) {
      span = static_cast<int64_t>(static_cast<__int128>(span) * (at.tick - start.tick) /
                                  (at.raw_ns - start.raw_ns));
    }
  } else {
    now = ticks();
  }
  Slot& slot = slots_[slot_index(record_id)];
  const uint64_t v = slot.lock();
  Record& r = slot.record;
  if (r.record_id == record_id) {
    r.state = EntryState::kCompleted;
    r.completed = now;
    r.started = std::max(r.enqueued, now - span);
  }
  slot.unlock(v);
}

TimeBase FlightRecorder::time_base() const noexcept {
  return cycles_ ? TimeBase(header_->anchor) : TimeBase(now_ns());
}

bool FlightRecorder::read_entry(uint64_t record_id, Entry& out,
                                const TimeBase& base) const noexcept {
  if (record_id == 0) return false;
  const size_t index = slot_index(record_id);
  const Slot& slot = slots_[index];
  Record r;
  StackFrames stack;
  // A writer holds a slot for a few stores; give up on it after a bounded number of tries.
  for (int attempt = 0; attempt < 10000; ++attempt) {
    const uint64_t v1 = slot.version.load(std::memory_order_acquire);
    if (v1 & 1) continue;
    std::memcpy(static_cast<void*>(&r), &slot.record, sizeof(Record));
    if (stacks_ != nullptr) std::memcpy(&stack, &stacks_[index], sizeof(StackFrames));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.version.load(std::memory_order_relaxed) != v1) continue;
    if (r.record_id != record_id) return false;
    out.record_id = r.record_id;
    out.group_id = r.group_id;
    out.seq = r.seq;
    out.peer = r.peer;
    out.p2p_seq = r.p2p_seq;
    out.op = r.op;
    out.reduce_op = r.reduce_op;
    out.state = r.state;
    out.root = r.root;
    out.coalesced_id = r.coalesced_id;
    out.coalesced_index = r.coalesced_index;
    out.callsite_id = r.callsite_id;
    out.step = r.step;
    out.input = r.input;
    out.output = r.output;
    out.enqueued_ns = base.to_ns(r.enqueued);
    out.started_ns = base.to_ns(r.started);
    out.completed_ns = base.to_ns(r.completed);
    out.thread_id = r.thread_id;
    std::memcpy(out.text, r.text, sizeof(out.text));
    std::memcpy(out.purpose, r.purpose, sizeof(out.purpose));
    out.stack_depth = stacks_ != nullptr ? std::min<uint8_t>(r.stack_depth, kMaxStackFrames) : 0;
    for (int i = 0; i < kMaxStackFrames; ++i) {
      out.stack[i] = i < out.stack_depth ? stack.frames[i] : 0;
    }
    return true;
  }
  return false;
}

std::vector<Entry> FlightRecorder::snapshot() const {
  const uint64_t newest = recorded();
  const uint64_t oldest = newest >= capacity_ ? newest - capacity_ + 1 : 1;
  std::vector<Entry> out;
  out.reserve(newest - oldest + 1);
  const TimeBase base = time_base();
  Entry copy;
  for (uint64_t id = oldest; id <= newest; ++id) {
    if (read_entry(id, copy, base)) out.push_back(copy);
  }
  return out;
}

}  // namespace tessel::fr
