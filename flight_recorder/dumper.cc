#include "tessel/flight_recorder/dumper.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <charconv>
#include <csignal>
#include <cstring>

#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/flight_recorder/internal/dump_format.h"
#include "tessel/flight_recorder/run_id.h"

namespace tessel::fr {
namespace {

constexpr std::array<int, 4> kFatalSignals = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE};

// State the signal handlers read. Written only by start()/stop() of the owning Dumper, before
// the handlers are installed and after they are removed.
std::atomic<Dumper*> g_owner{nullptr};
std::atomic<int> g_wake_fd{-1};
std::atomic<int> g_signals_pending{0};
std::atomic<const FlightRecorder*> g_fatal_recorder{nullptr};
std::atomic_flag g_in_fatal = ATOMIC_FLAG_INIT;
char g_fatal_tmp_path[4096];
char g_fatal_final_path[4096];
char g_fatal_buffer[1 << 16];
struct sigaction g_old_dump_action;
struct sigaction g_old_fatal_actions[kFatalSignals.size()];
int g_dump_signal = 0;

void wake_dumper() noexcept {
  const int fd = g_wake_fd.load(std::memory_order_acquire);
  if (fd >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);  // a full pipe already wakes it
  }
}

void on_dump_signal(int) {
  const int saved_errno = errno;
  g_signals_pending.fetch_add(1, std::memory_order_relaxed);
  wake_dumper();
  errno = saved_errno;
}

void on_fatal_signal(int sig) {
  if (!g_in_fatal.test_and_set()) {
    const FlightRecorder* recorder = g_fatal_recorder.load(std::memory_order_acquire);
    if (recorder != nullptr) {
      // "signal NN", formatted by hand: no allocation, no locale, no stdio.
      char reason[16] = "signal ";
      int n = 7;
      if (sig >= 10) reason[n++] = static_cast<char>('0' + sig / 10 % 10);
      reason[n++] = static_cast<char>('0' + sig % 10);
      reason[n] = '\0';
      internal::write_dump_file(*recorder, DumpTrigger::kFatalSignal, recorder->process_info().rank,
                                reason, g_fatal_tmp_path, g_fatal_final_path, g_fatal_buffer,
                                sizeof(g_fatal_buffer));
    }
  }
  // Give the signal back to whoever had it before (default: die, with a core where enabled).
  for (size_t i = 0; i < kFatalSignals.size(); ++i) {
    if (kFatalSignals[i] == sig) ::sigaction(sig, &g_old_fatal_actions[i], nullptr);
  }
  ::raise(sig);
}

bool copy_path(char* out, size_t size, const std::string& path) {
  if (path.size() + 1 > size) return false;
  std::memcpy(out, path.c_str(), path.size() + 1);
  return true;
}

}  // namespace

int parse_signal(std::string_view text) {
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper.empty() || upper == "0" || upper == "NONE" || upper == "OFF") return 0;
  if (upper.rfind("SIG", 0) == 0) upper = upper.substr(3);
  static constexpr std::pair<std::string_view, int> kNames[] = {
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP}, {"QUIT", SIGQUIT},
      {"TERM", SIGTERM}, {"INT", SIGINT},   {"PWR", SIGPWR}, {"WINCH", SIGWINCH},
  };
  for (const auto& [name, number] : kNames) {
    if (upper == name) return number;
  }
  int number = 0;
  const auto [end, ec] = std::from_chars(upper.data(), upper.data() + upper.size(), number);
  TESSEL_CHECK(ec == std::errc() && end == upper.data() + upper.size() && number > 0 &&
                   number < NSIG && number != SIGKILL && number != SIGSTOP,
               InvalidArgument,
               "'{}' is not a usable dump signal; expected SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT, "
               "SIGTERM, SIGINT, SIGPWR, SIGWINCH, a number below {} (not 9 or 19), or 'none'",
               text, NSIG);
  return number;
}

DumperOptions DumperOptions::from_env(std::string_view run_id) {
  DumperOptions o;
  o.dir = job_dump_dir(run_id);
  try {
    o.dump_signal = parse_signal(env_string(EnvKnob::kFrDumpSignal));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("TESSEL_FR_DUMP_SIGNAL: {}", e.message()));
  }
  o.dump_on_fatal = env_bool(EnvKnob::kFrDumpOnFatal);
  return o;
}

std::string store_dump_request_key(int64_t n) {
  return fmt::format("tessel/fr/dump_request/{}", n);
}

std::string store_ready_key(int rank) { return fmt::format("tessel/fr/ready/{}", rank); }
std::string store_failure_key(int rank) { return fmt::format("tessel/fr/failure/{}", rank); }
std::string store_final_dump_key(int rank) { return fmt::format("tessel/fr/final/{}", rank); }

std::string encode_store_failure(int64_t wall_time_us, std::string_view reason) {
  return fmt::format("{} {}", wall_time_us, reason);
}

std::pair<int64_t, std::string> decode_store_failure(std::string_view value) {
  const size_t space = value.find(' ');
  int64_t us = 0;
  const auto [end, ec] =
      std::from_chars(value.data(), value.data() + std::min(space, value.size()), us);
  TESSEL_CHECK(ec == std::errc() && space != std::string_view::npos, InvalidArgument,
               "collective failure record '{}' is not '<wall_time_us> <reason>'", value);
  return {us, std::string(value.substr(space + 1))};
}

std::string store_dump_key(int64_t n, int rank) {
  return fmt::format("tessel/fr/dump/{}/{}", n, rank);
}

std::string encode_store_dump_request(int initiator, std::string_view reason) {
  return fmt::format("{} {}", initiator, reason);
}

DumpRequest decode_store_dump_request(std::string_view value) {
  DumpRequest r;
  r.trigger = DumpTrigger::kStoreRequest;
  const size_t space = value.find(' ');
  const std::string_view number = value.substr(0, space);
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), r.initiator);
  TESSEL_CHECK(!number.empty() && ec == std::errc() && end == number.data() + number.size() &&
                   r.initiator >= -1,
               InvalidArgument,
               "flight-recorder dump request '{}' is malformed; expected '<initiator rank> "
               "<reason>'",
               value);
  if (space != std::string_view::npos) r.reason = std::string(value.substr(space + 1));
  return r;
}

Dumper::Dumper(FlightRecorder& recorder, DumperOptions options)
    : recorder_(recorder), options_(std::move(options)) {}

Dumper::~Dumper() { stop(); }

void Dumper::start() {
  MutexLock lock(mutex_);
  if (running_) return;
  Dumper* expected = nullptr;
  TESSEL_CHECK(g_owner.compare_exchange_strong(expected, this), InvalidArgument,
               "another flight-recorder Dumper is already started in this process; stop it "
               "first (one Dumper owns the dump signals)");
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    const int err = errno;
    g_owner.store(nullptr);
    throw_system_error("flight-recorder dumper: pipe2", err);
  }
  wake_read_ = UniqueFd(fds[0]);
  wake_write_ = UniqueFd(fds[1]);
  g_wake_fd.store(wake_write_.get(), std::memory_order_release);
  stopping_ = false;
  running_ = true;
  install_signal_handlers();
  thread_ = std::thread([this] { run(); });
}

void Dumper::stop() {
  {
    MutexLock lock(mutex_);
    if (!running_) return;
    stopping_ = true;
  }
  restore_signal_handlers();
  wake_dumper();
  thread_.join();
  MutexLock lock(mutex_);
  running_ = false;
  g_wake_fd.store(-1, std::memory_order_release);
  wake_read_.reset();
  wake_write_.reset();
  g_owner.store(nullptr);
}

void Dumper::install_signal_handlers() {
  if (options_.dump_signal != 0) {
    struct sigaction action = {};
    action.sa_handler = on_dump_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(options_.dump_signal, &action, &g_old_dump_action);
    g_dump_signal = options_.dump_signal;
  }
  if (options_.dump_on_fatal) {
    // Paths are formatted now: the handler may not allocate.
    const ProcessInfo& p = recorder_.process_info();
    const auto final_path = options_.dir / dump_file_name(p.rank, p.pid);
    const auto tmp_path =
        options_.dir / fmt::format(".{}.tmp.fatal.{}", final_path.filename().string(), p.pid);
    std::error_code ec;
    std::filesystem::create_directories(options_.dir, ec);
    if (ec || !copy_path(g_fatal_final_path, sizeof(g_fatal_final_path), final_path.string()) ||
        !copy_path(g_fatal_tmp_path, sizeof(g_fatal_tmp_path), tmp_path.string())) {
      log_warn(LogComponent::kFlightRecorder,
               "fatal-signal dumps disabled: cannot use dump directory '{}' ({})",
               options_.dir.string(), ec ? ec.message() : "path too long");
      return;
    }
    g_fatal_recorder.store(&recorder_, std::memory_order_release);
    for (size_t i = 0; i < kFatalSignals.size(); ++i) {
      struct sigaction action = {};
      action.sa_handler = on_fatal_signal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESETHAND | SA_NODEFER;
      ::sigaction(kFatalSignals[i], &action, &g_old_fatal_actions[i]);
    }
  }
}

void Dumper::restore_signal_handlers() {
  if (g_dump_signal != 0) {
    ::sigaction(g_dump_signal, &g_old_dump_action, nullptr);
    g_dump_signal = 0;
  }
  if (g_fatal_recorder.exchange(nullptr) != nullptr) {
    for (size_t i = 0; i < kFatalSignals.size(); ++i) {
      ::sigaction(kFatalSignals[i], &g_old_fatal_actions[i], nullptr);
    }
  }
}

void Dumper::request_dump(DumpRequest request) {
  {
    MutexLock lock(mutex_);
    if (running_ && !stopping_) {
      queue_.push_back(std::move(request));
      wake_dumper();
      return;
    }
  }
  write_one(request);
}

std::filesystem::path Dumper::dump_now(const DumpRequest& request) {
  auto path = write_dump(recorder_, request, options_.dir);
  MutexLock lock(mutex_);
  ++written_;
  written_cv_.notify_all();
  return path;
}

void Dumper::write_one(const DumpRequest& request) {
  try {
    const auto path = dump_now(request);
    log_info(LogComponent::kFlightRecorder, "wrote flight-recorder dump {} (trigger {})",
             path.string(), trigger_name(request.trigger));
  } catch (const Error& e) {
    log_warn(LogComponent::kFlightRecorder, "flight-recorder dump failed: {}", e.message());
    MutexLock lock(mutex_);
    last_error_ = e.message();
  }
}

void Dumper::run() {
  for (;;) {
    pollfd pfd = {wake_read_.get(), POLLIN, 0};
    ::poll(&pfd, 1, /*timeout ms=*/200);
    char drain[64];
    while (::read(wake_read_.get(), drain, sizeof(drain)) > 0) {
    }
    if (g_signals_pending.exchange(0) > 0) {
      MutexLock lock(mutex_);
      queue_.push_back({DumpTrigger::kSignal, -1, fmt::format("signal {}", options_.dump_signal)});
    }
    std::optional<DumpRequest> request;
    {
      MutexLock lock(mutex_);
      if (!queue_.empty()) {
        // Requests that piled up while the last dump was written are one event: one dump.
        request = std::move(queue_.front());
        queue_.clear();
      } else if (stopping_) {
        return;
      }
    }
    if (request) write_one(*request);
  }
}

uint64_t Dumper::dumps_written() const {
  MutexLock lock(mutex_);
  return written_;
}

bool Dumper::wait_for_dumps(uint64_t count, std::chrono::nanoseconds timeout) const {
  MutexLock lock(mutex_);
  const auto done = [&]() TESSEL_REQUIRES(mutex_) { return written_ >= count; };
  return written_cv_.wait_for(lock, timeout, done);
}

std::string Dumper::last_error() const {
  MutexLock lock(mutex_);
  return last_error_;
}

}  // namespace tessel::fr
