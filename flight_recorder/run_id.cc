#include "tessel/flight_recorder/run_id.h"

#include <cstdlib>

#include "tessel/base/env.h"
#include "tessel/base/launch_env.h"

namespace tessel::fr {
namespace {

std::string var(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

std::string sanitize_run_id(std::string_view text) {
  std::string out(text.substr(0, kMaxRunIdBytes));
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  if (out == "." || out == "..") out = "_";
  return out;
}

std::string run_id_from_env() {
  if (auto id = env_value(EnvKnob::kFrRunId); id && !id->empty()) return sanitize_run_id(*id);
  if (const std::string id = var(launch_env::kRunId); !id.empty() && id != "none") {
    return sanitize_run_id(id);
  }
  const std::string job = var(launch_env::kSlurmJobId), step = var(launch_env::kSlurmStepId);
  if (!job.empty() && !step.empty()) return sanitize_run_id("slurm-" + job + "." + step);
  if (const std::string id = var(launch_env::kOmpiJobId); !id.empty()) {
    return sanitize_run_id("ompi-" + id);
  }
  if (const std::string ns = var(launch_env::kPmixNamespace); !ns.empty()) {
    return sanitize_run_id("pmix-" + ns);
  }
  if (!job.empty()) return sanitize_run_id("slurm-" + job);
  return "";
}

std::filesystem::path job_dump_dir(std::string_view run_id) {
  if (auto dir = env_value(EnvKnob::kFrDumpDir); dir && !dir->empty()) return *dir;
  std::filesystem::path base(std::string(env_knob_info(EnvKnob::kFrDumpDir).default_value));
  return run_id.empty() ? base : base / std::string(run_id);
}

}  // namespace tessel::fr
