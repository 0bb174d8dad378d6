#include "tessel/base/logging.h"

#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <mutex>

#include "tessel/base/clock.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/launch_env.h"

namespace tessel {
namespace internal {
std::atomic<uint8_t> g_log_levels[kLogComponentCount];
std::atomic<bool> g_log_initialized{false};
}  // namespace internal

namespace {

constexpr std::array<std::string_view, kLogComponentCount> kComponentNames = {
    "base",        "tensor", "kernels",  "nn",      "flight_recorder",
    "collectives", "mesh",   "parallel", "launcher"};
constexpr std::array<std::string_view, 6> kLevelNames = {"trace", "debug", "info",
                                                         "warn",  "error", "off"};
constexpr LogLevel kDefaultLevel = LogLevel::kWarn;

std::mutex g_mutex;  // guards the sink, the rank and initialisation
LogSink g_sink;      // empty: stderr
int g_rank = -2;     // -2: not decided yet; -1: hidden
bool g_timestamps = true;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string valid_components() {
  std::string out;
  for (auto name : kComponentNames) out += fmt::format("{}, ", name);
  return out + "all";
}

LogLevel parse_level(std::string_view text, std::string_view item) {
  if (text == "warning") return LogLevel::kWarn;
  for (size_t i = 0; i < kLevelNames.size(); ++i) {
    if (kLevelNames[i] == text) return static_cast<LogLevel>(i);
  }
  throw InvalidArgument(fmt::format(
      "TESSEL_LOGS item '{}': unknown level '{}'; valid levels: trace, debug, info, warn, "
      "error, off",
      item, text));
}

void write_stderr(std::string_view line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to report a failing stderr
    done += static_cast<size_t>(n);
  }
}

int rank_from_environment() {
  const char* text = std::getenv(launch_env::kRank);  // leniently: logs start before init
  if (text == nullptr) return -1;
  int rank = -1;
  const std::string_view s(text);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), rank);
  return (ec == std::errc() && end == s.data() + s.size() && rank >= 0) ? rank : -1;
}

}  // namespace

std::string_view log_component_name(LogComponent component) {
  const auto i = static_cast<size_t>(component);
  return i < kComponentNames.size() ? kComponentNames[i] : "unknown";
}

std::string_view log_level_name(LogLevel level) {
  const auto i = static_cast<size_t>(level);
  return i < kLevelNames.size() ? kLevelNames[i] : "unknown";
}

LogLevels parse_log_spec(std::string_view spec) {
  LogLevels levels;
  levels.fill(kDefaultLevel);
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view item = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (item.empty()) continue;

    std::string_view name = item;
    LogLevel level = LogLevel::kInfo;
    if (const size_t eq = item.find('='); eq != std::string_view::npos) {
      name = trim(item.substr(0, eq));
      level = parse_level(trim(item.substr(eq + 1)), item);
    } else if (item.front() == '+') {
      name = trim(item.substr(1));
      level = LogLevel::kDebug;
    } else if (item.front() == '-') {
      name = trim(item.substr(1));
      level = LogLevel::kError;
    }

    if (name == "all") {
      levels.fill(level);
      continue;
    }
    bool found = false;
    for (size_t i = 0; i < kComponentNames.size(); ++i) {
      if (kComponentNames[i] == name) {
        levels[i] = level;
        found = true;
      }
    }
    TESSEL_CHECK(found, InvalidArgument,
                 "TESSEL_LOGS item '{}': unknown component '{}'; valid components: {}", item, name,
                 valid_components());
  }
  return levels;
}

void set_log_levels(const LogLevels& levels) {
  for (size_t i = 0; i < kLogComponentCount; ++i) {
    internal::g_log_levels[i].store(static_cast<uint8_t>(levels[i]), std::memory_order_relaxed);
  }
  internal::g_log_initialized.store(true, std::memory_order_release);
}

void configure_logging(std::string_view spec) { set_log_levels(parse_log_spec(spec)); }

void init_logging() {
  const LogLevels levels = parse_log_spec(env_string(EnvKnob::kLogs));
  const bool timestamps = env_bool(EnvKnob::kLogTimestamps);
  {
    std::lock_guard lock(g_mutex);
    g_timestamps = timestamps;
  }
  set_log_levels(levels);
}

LogLevel log_level(LogComponent component) {
  if (!internal::g_log_initialized.load(std::memory_order_acquire)) internal::init_logging_lazily();
  return static_cast<LogLevel>(
      internal::g_log_levels[static_cast<size_t>(component)].load(std::memory_order_relaxed));
}

void set_log_rank(int rank) {
  std::lock_guard lock(g_mutex);
  g_rank = rank < 0 ? -1 : rank;
}

LogSink set_log_sink(LogSink sink) {
  std::lock_guard lock(g_mutex);
  std::swap(g_sink, sink);
  return sink;
}

namespace internal {

void init_logging_lazily() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    if (g_log_initialized.load(std::memory_order_acquire)) return;
    try {
      init_logging();
    } catch (const Error& e) {
      LogLevels defaults;
      defaults.fill(kDefaultLevel);
      set_log_levels(defaults);
      write_stderr(fmt::format("[E tessel base] {} (using default log levels)\n", e.what()));
    }
  });
}

void log_write(LogComponent component, LogLevel level, std::string_view message) noexcept {
  try {
    std::lock_guard lock(g_mutex);
    if (g_rank == -2) g_rank = rank_from_environment();
    std::string line = "[";
    line += static_cast<char>(std::toupper(log_level_name(level)[0]));
    if (g_timestamps) {
      const int64_t us = wall_time_us();
      const time_t seconds = static_cast<time_t>(us / 1'000'000);
      tm local;
      localtime_r(&seconds, &local);
      line += fmt::format(" {:02}:{:02}:{:02}.{:03}", local.tm_hour, local.tm_min, local.tm_sec,
                          (us / 1000) % 1000);
    }
    if (g_rank >= 0) line += fmt::format(" rank {}", g_rank);
    line += fmt::format(" {}] ", log_component_name(component));
    line += message;
    line += '\n';
    if (g_sink) {
      g_sink(level, line);
    } else {
      write_stderr(line);
    }
  } catch (...) {
    // Logging must never take the program down; a line that cannot be built is dropped.
  }
}

}  // namespace internal
}  // namespace tessel
