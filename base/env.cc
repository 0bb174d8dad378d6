#include "tessel/base/env.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <mutex>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"

namespace tessel {
namespace {

constexpr std::array<EnvKnobInfo, static_cast<size_t>(EnvKnob::kCount)> kKnobs = {{
    {EnvKnob::kLogs, "TESSEL_LOGS", "",
     "per-component log levels, e.g. 'collectives=debug,+launcher' (see docs/logging.md)"},
    {EnvKnob::kLogTimestamps, "TESSEL_LOG_TIMESTAMPS", "1",
     "prefix log lines with the wall-clock time (0 to omit, for diffable logs)"},
    {EnvKnob::kFrEnable, "TESSEL_FR_ENABLE", "1",
     "record collectives in the flight recorder (0 turns recording off)"},
    {EnvKnob::kFrCapacity, "TESSEL_FR_CAPACITY", "4096",
     "entries the flight recorder keeps per process; older ones are overwritten"},
    {EnvKnob::kFrDumpDir, "TESSEL_FR_DUMP_DIR", "/tmp/tessel_fr",
     "directory where flight-recorder dumps are written (tessel_fr_rank<R>.json); unset, "
     "each job writes into <default>/<run id>"},
    {EnvKnob::kFrDumpSignal, "TESSEL_FR_DUMP_SIGNAL", "SIGUSR1",
     "signal that makes a process dump its flight recorder (name or number; 'none' disables)"},
    {EnvKnob::kFrDumpOnFatal, "TESSEL_FR_DUMP_ON_FATAL", "1",
     "dump the flight recorder on SIGSEGV, SIGABRT, SIGBUS and SIGFPE before dying"},
    {EnvKnob::kFrStack, "TESSEL_FR_STACK", "0",
     "capture a call stack with every flight-recorder entry (costs a few microseconds each)"},
    {EnvKnob::kFrTsc, "TESSEL_FR_TSC", "1",
     "timestamp flight-recorder entries with the invariant TSC where the kernel uses it "
     "(0: clock_gettime)"},
    {EnvKnob::kFrRingDir, "TESSEL_FR_RING_DIR", "",
     "keep the flight-recorder ring in a memory-mapped file here so it survives SIGKILL"},
    {EnvKnob::kFrRunId, "TESSEL_FR_RUN_ID", "",
     "the job's run id in flight-recorder dumps and file names (default: the launcher's; "
     "tessel-run sets it)"},
    {EnvKnob::kNumThreads, "TESSEL_NUM_THREADS", "0",
     "threads for CPU tensor ops and GEMM (0 = OMP_NUM_THREADS if set, else one per hardware "
     "core); set_num_threads overrides"},
    {EnvKnob::kPgTimeout, "TESSEL_PG_TIMEOUT", "5m",
     "default timeout of a process group's collectives (e.g. '30s')"},
    {EnvKnob::kPgBackend, "TESSEL_PG_BACKEND", "auto",
     "backend init_process_group uses: auto, gloo, mpi, nccl, threads (world of 1) or fake"},
    {EnvKnob::kWatchdogPolicy, "TESSEL_WATCHDOG_POLICY", "raise",
     "what a timed-out collective does: raise, abort_communicator or abort_process"},
    {EnvKnob::kStoreAddr, "TESSEL_STORE_ADDR", "",
     "host:port of the job's store server (set by the launcher for every worker)"},
    {EnvKnob::kStoreToken, "TESSEL_STORE_TOKEN", "",
     "the job's store token (set by the launcher; never pass it on a command line)", true},
    {EnvKnob::kStoreTokenFile, "TESSEL_STORE_TOKEN_FILE", "",
     "a file holding the store token, read when TESSEL_STORE_TOKEN is unset"},
    {EnvKnob::kStoreDir, "TESSEL_STORE_DIR", "",
     "shared directory used as the job's store (FileStore) when no store server is given"},
    {EnvKnob::kGlooIface, "TESSEL_GLOO_IFACE", "",
     "network interface Gloo binds (default: the one that reaches the job's store; tessel-run "
     "sets it for its workers)"},
    {EnvKnob::kGlooShm, "TESSEL_GLOO_SHM", "1",
     "Gloo's all_to_all, all_gather, reduce_scatter and all_reduce move data through shared "
     "memory between ranks on one host (0: TCP only)"},
    {EnvKnob::kNcclSplitShare, "TESSEL_NCCL_SPLIT_SHARE", "0",
     "NCCL groups made by split share the parent's resources (less memory; 1 to enable)"},
    {EnvKnob::kRdzvToken, "TESSEL_RDZV_TOKEN", "",
     "tessel-run's job token for multi-node rendezvous (or --rdzv-token-file)", true},
    {EnvKnob::kTlsCert, "TESSEL_TLS_CERT", "",
     "PEM certificate: the store/rendezvous server's (turns TLS on), or a client's for mutual TLS"},
    {EnvKnob::kTlsKey, "TESSEL_TLS_KEY", "", "PEM private key of TESSEL_TLS_CERT"},
    {EnvKnob::kTlsCa, "TESSEL_TLS_CA", "",
     "PEM CA: clients verify the server with it; a server given one requires client certificates"},
    {EnvKnob::kPython, "TESSEL_PYTHON", "python3",
     "interpreter tessel-run runs .py programs, -m modules and --run-path scripts with"},
}};

// The table must list every enum value, in order; checked once at compile time.
constexpr bool knobs_in_order() {
  for (size_t i = 0; i < kKnobs.size(); ++i) {
    if (static_cast<size_t>(kKnobs[i].knob) != i) return false;
  }
  return true;
}
static_assert(knobs_in_order(), "kKnobs must list EnvKnob values in declaration order");

}  // namespace

std::span<const EnvKnobInfo> env_knobs() { return kKnobs; }

const EnvKnobInfo& env_knob_info(EnvKnob knob) {
  const auto i = static_cast<size_t>(knob);
  TESSEL_CHECK(i < kKnobs.size(), InvalidArgument, "unknown environment knob {}", i);
  return kKnobs[i];
}

std::optional<std::string> env_value(EnvKnob knob) {
  const std::string name(env_knob_info(knob).name);
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string env_string(EnvKnob knob) {
  auto value = env_value(knob);
  if (!value || value->empty()) return std::string(env_knob_info(knob).default_value);
  return *value;
}

int64_t env_int(EnvKnob knob) {
  const std::string text = env_string(knob);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TESSEL_CHECK(ec == std::errc() && end == text.data() + text.size(), InvalidArgument,
               "{}='{}' is not an integer", env_knob_info(knob).name, text);
  return value;
}

std::optional<bool> parse_bool(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

bool env_bool(EnvKnob knob) {
  const std::string text = env_string(knob);
  const auto value = parse_bool(text);
  TESSEL_CHECK(value.has_value(), InvalidArgument,
               "{}='{}' is not a boolean; expected 1/0, true/false, yes/no or on/off",
               env_knob_info(knob).name, text);
  return *value;
}

std::chrono::nanoseconds env_duration(EnvKnob knob) {
  const std::string text = env_string(knob);
  try {
    return parse_duration(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {}", env_knob_info(knob).name, e.message()));
  }
}

std::string env_knobs_markdown() {
  std::string out = "| variable | default | description |\n|---|---|---|\n";
  for (const auto& k : kKnobs) {
    out += fmt::format("| `{}` | {} | {} |\n", k.name,
                       k.default_value.empty() ? "(unset)" : fmt::format("`{}`", k.default_value),
                       k.description);
  }
  return out;
}

std::string env_knobs_text() {
  size_t width = 0;
  for (const auto& k : kKnobs) width = std::max(width, k.name.size());
  std::string out;
  for (const auto& k : kKnobs) {
    const auto value = env_value(k.knob);
    const std::string shown = !value     ? ""
                              : k.secret ? std::string(", set (value hidden)")
                                         : fmt::format(", set to '{}'", *value);
    out += fmt::format("  {:<{}}  default '{}'{}\n      {}\n", k.name, width, k.default_value,
                       shown, k.description);
  }
  return out;
}

void log_env_knobs_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const auto& k : kKnobs) {
      if (auto value = env_value(k.knob)) {
        log_info(LogComponent::kBase, "{}={}", k.name, k.secret ? "(hidden)" : *value);
      }
    }
  });
}

}  // namespace tessel
