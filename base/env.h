#pragma once
// The one registry of tessel's environment variables ("knobs"). Every variable tessel reads is
// declared in env.cc with its name, default and a one-line description; nothing else calls
// getenv for a TESSEL_ setting. Knobs are for operations and debugging; what users configure
// goes in options structs.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tessel {

// One entry per variable. Add a knob here and in the table in env.cc (and regenerate
// docs/environment.md with `tessel-info --knobs-markdown`; a test checks the two agree).
enum class EnvKnob {
  kLogs,            // TESSEL_LOGS
  kLogTimestamps,   // TESSEL_LOG_TIMESTAMPS
  kFrEnable,        // TESSEL_FR_ENABLE
  kFrCapacity,      // TESSEL_FR_CAPACITY
  kFrDumpDir,       // TESSEL_FR_DUMP_DIR
  kFrDumpSignal,    // TESSEL_FR_DUMP_SIGNAL
  kFrDumpOnFatal,   // TESSEL_FR_DUMP_ON_FATAL
  kFrStack,         // TESSEL_FR_STACK
  kFrTsc,           // TESSEL_FR_TSC
  kFrRingDir,       // TESSEL_FR_RING_DIR
  kFrRunId,         // TESSEL_FR_RUN_ID
  kNumThreads,      // TESSEL_NUM_THREADS
  kPgTimeout,       // TESSEL_PG_TIMEOUT
  kPgBackend,       // TESSEL_PG_BACKEND
  kWatchdogPolicy,  // TESSEL_WATCHDOG_POLICY
  kStoreAddr,       // TESSEL_STORE_ADDR
  kStoreToken,      // TESSEL_STORE_TOKEN
  kStoreTokenFile,  // TESSEL_STORE_TOKEN_FILE
  kStoreDir,        // TESSEL_STORE_DIR
  kGlooIface,       // TESSEL_GLOO_IFACE
  kGlooShm,         // TESSEL_GLOO_SHM
  kNcclSplitShare,  // TESSEL_NCCL_SPLIT_SHARE
  kRdzvToken,       // TESSEL_RDZV_TOKEN
  kTlsCert,         // TESSEL_TLS_CERT
  kTlsKey,          // TESSEL_TLS_KEY
  kTlsCa,           // TESSEL_TLS_CA
  kPython,          // TESSEL_PYTHON
  kCount,
};

struct EnvKnobInfo {
  EnvKnob knob;
  std::string_view name;           // "TESSEL_LOGS"
  std::string_view default_value;  // the value used when unset
  std::string_view description;    // one line
  bool secret = false;             // a credential: its value is never logged or printed
};

// All knobs, in declaration order. Thread-safe (immutable).
std::span<const EnvKnobInfo> env_knobs();
const EnvKnobInfo& env_knob_info(EnvKnob knob);

// The variable's value, or nullopt when unset. Reads the process environment each call.
std::optional<std::string> env_value(EnvKnob knob);
// The value, or the knob's default when unset or empty.
std::string env_string(EnvKnob knob);
// Typed reads of env_string(). Each throws InvalidArgument naming the variable and its value
// when the text does not parse.
int64_t env_int(EnvKnob knob);
bool env_bool(EnvKnob knob);                          // 1/0, true/false, yes/no, on/off (any case)
std::chrono::nanoseconds env_duration(EnvKnob knob);  // as parse_duration()

// The registry as a Markdown table (name | default | description), for docs and --help.
std::string env_knobs_markdown();
// The registry as plain aligned text, with each knob's current value where it is set.
std::string env_knobs_text();

// Logs, once per process at info level (component base), every knob that is set. Thread-safe.
void log_env_knobs_once();

// Parses a boolean the way env_bool does; nullopt when it is not one of the accepted words.
std::optional<bool> parse_bool(std::string_view text);

}  // namespace tessel
