#pragma once
// The flight-recorder files of one job on this node, as tessel-run keeps them apart from every
// other job's: the run id, the folder its workers dump into, the folder of their ring files
// (rings survive SIGKILL), the recovery of a dead worker's ring into a dump, and the removal of
// the rings once the job succeeded.
//
//   JobRecorderFiles files = job_recorder_files(o.rdzv_id, store.get());
//   env: "TESSEL_FR_RUN_ID=" + files.run_id, "TESSEL_FR_RING_DIR=" + files.ring_dir
//   ...a worker died without a dump:  recover_worker_ring(files, rank, pid, reason)
//   ...the job succeeded:              remove_worker_rings(files, ranks, pids)
//
// Thread-compatible: free functions over their arguments and the file system.

#include <optional>
#include <string>
#include <vector>

namespace tessel {
class Store;
}

namespace tessel::launcher {

struct JobRecorderFiles {
  std::string run_id;    // sanitized (flight_recorder/run_id.h): a file name
  std::string dump_dir;  // fr::job_dump_dir(run_id): TESSEL_FR_DUMP_DIR, else /tmp/tessel_fr/<id>
  std::string ring_dir;  // TESSEL_FR_RING_DIR when set, else <dump_dir>/rings
  bool per_job_dump_dir = false;  // dump_dir is the default per-job folder (not the user's)
};

// The job's run id: TESSEL_FR_RUN_ID when set, else `rdzv_id` unless it is "none" (torchrun's
// default), else one agent's generated "job-<hex>" shared through the job's `store` (first
// writer wins; every agent of the job reads the same), else a local one (logged). Never throws.
JobRecorderFiles job_recorder_files(const std::string& rdzv_id, Store* store);

// The dump of a worker (`rank`, `pid`) that died without one, recovered from its ring file
// (<ring_dir>/tessel_fr_<run id>_rank<R>.ring) and written to <dump_dir>/tessel_fr_rank<R>.json
// with trigger "recovered" and `reason` ("signal 9 (...)": the analyzer reads the rank as dead
// with the state its ring holds). Returns the dump's text; nullopt when there is no ring, or
// the ring is not this process's (another pid, rank or run id: a ring never stands for another
// process). Never throws (a ring that cannot be read is logged).
std::optional<std::string> recover_worker_ring(const JobRecorderFiles& files, int rank, int pid,
                                               const std::string& reason);

// Removes the ring files of these ranks and of these pids (rings of workers that never learnt
// their rank), then the ring folder and the per-job dump folder when they are left empty (a
// TESSEL_FR_DUMP_DIR of the user's stays). Never throws.
void remove_worker_rings(const JobRecorderFiles& files, const std::vector<int>& ranks,
                         const std::vector<int>& pids);

}  // namespace tessel::launcher
