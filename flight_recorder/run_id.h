#pragma once
// The job's run id: what tells one job's flight-recorder dumps and ring files from another's.
// Every dump records it ("run_id"), the default dump folder is named by it
// (/tmp/tessel_fr/<run id>/), ring files carry it, and `tessel-trace analyze` refuses a folder
// whose dumps name different run ids.
//
//   const std::string id = run_id_from_env();   // "" when no launcher gave one
//   recorder.set_run_id(id.empty() ? "pid-123-node07" : id);
//
// Thread-safe: free functions; they read the process environment.

#include <filesystem>
#include <string>
#include <string_view>

namespace tessel::fr {

inline constexpr size_t kMaxRunIdBytes = 63;

// The run id as a folder and file name: bytes other than [A-Za-z0-9._-] become '_', at most
// kMaxRunIdBytes bytes kept; "." and ".." become "_". "" stays "".
std::string sanitize_run_id(std::string_view text);

// The run id a launcher gave the process, sanitized, in this order (the first that is set):
//   TESSEL_FR_RUN_ID                     explicit (tessel-run sets it for its workers)
//   TORCHELASTIC_RUN_ID (not "none")     torchrun / tessel-run --rdzv-id
//   SLURM_JOB_ID + SLURM_STEP_ID         srun:   "slurm-<job>.<step>"
//   OMPI_MCA_ess_base_jobid              mpirun: "ompi-<jobid>" (Open MPI 4)
//   PMIX_NAMESPACE                       "pmix-<namespace>" (Open MPI 5, PMIx launchers)
//   SLURM_JOB_ID                         "slurm-<job>" (a batch script without a step)
// "" when none is: the collectives layer then shares "pid-<pid>-<host>" of the first rank
// through the job's store, else uses its own.
std::string run_id_from_env();

// Where a job's dumps go: TESSEL_FR_DUMP_DIR when set (the folder itself: set one per job),
// else /tmp/tessel_fr/<run id> (/tmp/tessel_fr when `run_id` is "").
std::filesystem::path job_dump_dir(std::string_view run_id);

}  // namespace tessel::fr
