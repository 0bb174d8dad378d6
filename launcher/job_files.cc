#include "tessel/launcher/job_files.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/flight_recorder/run_id.h"
#include "tessel/launcher/token.h"
#include "tessel/store/store.h"

namespace tessel::launcher {
namespace {

constexpr std::string_view kRunIdKey = "tessel/run/fr_run_id";

std::string shared_run_id(Store* store) {
  const std::string own = "job-" + generate_token().substr(0, 16);
  if (store == nullptr) {
    log_warn(LogComponent::kLauncher,
             "no job store: flight-recorder run id '{}' is this node's own (pass --rdzv-id to "
             "name the job on every node)",
             own);
    return own;
  }
  try {
    return store->compare_set(std::string(kRunIdKey), "", own);
  } catch (const Error& e) {
    log_warn(LogComponent::kLauncher, "flight-recorder run id not shared ({}); using '{}'",
             e.message(), own);
    return own;
  }
}

// The whole file (a dump the launcher just wrote); throws IoError naming it.
std::string read_whole_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_system_error(fmt::format("open '{}'", path.string()), errno);
  std::ostringstream text;
  text << in.rdbuf();
  TESSEL_CHECK(!in.bad(), IoError, "cannot read '{}'", path.string());
  return std::move(text).str();
}

}  // namespace

JobRecorderFiles job_recorder_files(const std::string& rdzv_id, Store* store) {
  JobRecorderFiles f;
  if (auto id = env_value(EnvKnob::kFrRunId); id && !id->empty()) {
    f.run_id = fr::sanitize_run_id(*id);
  } else if (!rdzv_id.empty() && rdzv_id != "none") {
    f.run_id = fr::sanitize_run_id(rdzv_id);
  } else {
    f.run_id = fr::sanitize_run_id(shared_run_id(store));
  }
  f.dump_dir = fr::job_dump_dir(f.run_id).string();
  const auto user_dir = env_value(EnvKnob::kFrDumpDir);
  f.per_job_dump_dir = !user_dir || user_dir->empty();
  const auto ring = env_value(EnvKnob::kFrRingDir);
  f.ring_dir =
      ring && !ring->empty() ? *ring : (std::filesystem::path(f.dump_dir) / "rings").string();
  return f;
}

std::optional<std::string> recover_worker_ring(const JobRecorderFiles& files, int rank, int pid,
                                               const std::string& reason) {
  const std::filesystem::path ring =
      std::filesystem::path(files.ring_dir) / fr::ring_file_name(files.run_id, rank, pid);
  std::error_code ec;
  if (files.ring_dir.empty() || !std::filesystem::exists(ring, ec)) return std::nullopt;
  try {
    const auto recorder = fr::FlightRecorder::recover(ring.string());
    const fr::ProcessInfo& p = recorder->process_info();
    // The ring left by an earlier worker of this rank (an earlier round) is not this one's.
    if (p.pid != pid || p.rank != rank || files.run_id != p.run_id) {
      log_info(LogComponent::kLauncher,
               "ring {} is pid {}'s (rank {}, run id '{}'), not the dead worker's (pid {}, rank "
               "{}): not used",
               ring.string(), p.pid, p.rank, p.run_id, pid, rank);
      return std::nullopt;
    }
    const auto path =
        fr::write_dump(*recorder, {fr::DumpTrigger::kRecovered, rank, reason}, files.dump_dir);
    log_info(LogComponent::kLauncher,
             "rank {} (pid {}) left no dump: recovered its ring {} into {}", rank, pid,
             ring.string(), path.string());
    return read_whole_file(path);
  } catch (const Error& e) {
    log_warn(LogComponent::kLauncher, "rank {}: cannot recover ring {}: {}", rank, ring.string(),
             e.message());
    return std::nullopt;
  }
}

void remove_worker_rings(const JobRecorderFiles& files, const std::vector<int>& ranks,
                         const std::vector<int>& pids) {
  if (files.ring_dir.empty()) return;
  const std::filesystem::path dir = files.ring_dir;
  std::error_code ec;
  for (int rank : ranks)
    std::filesystem::remove(dir / fr::ring_file_name(files.run_id, rank, 0), ec);
  for (int pid : pids) std::filesystem::remove(dir / fr::ring_file_name("", -1, pid), ec);
  // Folders go only when empty (another node's rings, or dumps, keep them).
  std::filesystem::remove(dir, ec);
  if (files.per_job_dump_dir) std::filesystem::remove(files.dump_dir, ec);
}

}  // namespace tessel::launcher
