#pragma once
// Logging with a rank prefix and per-component levels, set by TESSEL_LOGS (in the spirit of
// PyTorch's TORCH_LOGS):
//
//   TESSEL_LOGS="collectives=debug,+launcher,-tensor"
//
// `name=level` sets a level (trace, debug, info, warn, error, off); `+name` means debug,
// `-name` means error, a bare `name` means info; `all` names every component. Unset
// components log at warn. Each line is written with one write(2), so lines from threads and
// processes sharing a terminal never interleave:
//
//   [W 20:47:40.123 rank 3 collectives] all_reduce seq 42 on group dp timed out after 30s
//
// Thread-safe. Example:
//   log_info(LogComponent::kMesh, "created {} groups", n);

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace tessel {

// One per top-level folder.
enum class LogComponent : uint8_t {
  kBase,
  kTensor,
  kKernels,
  kNn,
  kFlightRecorder,
  kCollectives,
  kMesh,
  kParallel,
  kLauncher,
  kCount,
};
enum class LogLevel : uint8_t { kTrace, kDebug, kInfo, kWarn, kError, kOff };

inline constexpr size_t kLogComponentCount = static_cast<size_t>(LogComponent::kCount);
using LogLevels = std::array<LogLevel, kLogComponentCount>;

std::string_view log_component_name(LogComponent component);  // "flight_recorder"
std::string_view log_level_name(LogLevel level);              // "warn"

// Parses a TESSEL_LOGS spec into levels (starting from warn everywhere). Pure. Throws
// InvalidArgument naming the bad item and listing the valid components or levels.
LogLevels parse_log_spec(std::string_view spec);

// Reads TESSEL_LOGS and applies it. Throws InvalidArgument on a bad spec. Entry points (tools,
// the launcher, init_process_group) call it so a typo stops the program with a clear message;
// without it the first log call applies the variable and reports a bad spec on stderr once.
void init_logging();
// Applies a spec directly (tests, programs that take it from a flag). Throws as above.
void configure_logging(std::string_view spec);
void set_log_levels(const LogLevels& levels);
LogLevel log_level(LogComponent component);

// The rank shown in every line; -1 hides it. Unset, it is read from the RANK variable.
void set_log_rank(int rank);

// Replaces where finished lines go (default: stderr). Returns the previous sink. For tests and
// for the launcher's log multiplexer; the sink is called under a lock, one whole line at a time.
using LogSink = std::function<void(LogLevel, std::string_view line)>;
LogSink set_log_sink(LogSink sink);

namespace internal {
extern std::atomic<uint8_t> g_log_levels[kLogComponentCount];
extern std::atomic<bool> g_log_initialized;
void init_logging_lazily() noexcept;
void log_write(LogComponent component, LogLevel level, std::string_view message) noexcept;
}  // namespace internal

// Cheap check: one relaxed atomic load once initialised.
inline bool log_enabled(LogComponent component, LogLevel level) {
  if (!internal::g_log_initialized.load(std::memory_order_acquire)) internal::init_logging_lazily();
  return static_cast<uint8_t>(level) >=
         internal::g_log_levels[static_cast<size_t>(component)].load(std::memory_order_relaxed);
}

template <typename... Args>
void log(LogComponent component, LogLevel level, fmt::format_string<Args...> format,
         Args&&... args) {
  if (!log_enabled(component, level)) return;
  internal::log_write(component, level, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void log_trace(LogComponent c, fmt::format_string<Args...> f, Args&&... args) {
  log(c, LogLevel::kTrace, f, std::forward<Args>(args)...);
}
template <typename... Args>
void log_debug(LogComponent c, fmt::format_string<Args...> f, Args&&... args) {
  log(c, LogLevel::kDebug, f, std::forward<Args>(args)...);
}
template <typename... Args>
void log_info(LogComponent c, fmt::format_string<Args...> f, Args&&... args) {
  log(c, LogLevel::kInfo, f, std::forward<Args>(args)...);
}
template <typename... Args>
void log_warn(LogComponent c, fmt::format_string<Args...> f, Args&&... args) {
  log(c, LogLevel::kWarn, f, std::forward<Args>(args)...);
}
template <typename... Args>
void log_error(LogComponent c, fmt::format_string<Args...> f, Args&&... args) {
  log(c, LogLevel::kError, f, std::forward<Args>(args)...);
}

}  // namespace tessel
