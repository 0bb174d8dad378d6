#pragma once
// The MPI backend: CPU tensors over the MPI library the job was started with (mpirun, srun).
// MPI is initialised once per process with MPI_THREAD_MULTIPLE (the level is checked: groups run
// on their callers' and worker threads); split() is MPI_Comm_split; bf16/f16 reductions use
// custom MPI ops. Every MPI return code is checked and turned into CommError with MPI's text.
// MPI cannot cancel a blocked call: the watchdog fails the Work at its timeout, and only the
// abort_process policy (MPI_Abort is not used; the process ends) frees a hung rank.
// A build without MPI compiles a stub: mpi_is_available() is false, the factory throws
// Unavailable.

#include <memory>

#include "tessel/collectives/process_group.h"

namespace tessel {

namespace mpi {

// True when this build has the MPI backend.
bool is_available();
// True when this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK in the environment).
bool launched();

// The MPI_COMM_WORLD group (collective over all MPI ranks; initialises MPI on first use; MPI is
// finalised at process exit). Throws Unavailable without MPI or when MPI_THREAD_MULTIPLE is not
// provided, CommError when MPI fails.
std::shared_ptr<ProcessGroup> create_world(ProcessGroupOptions options = {});

}  // namespace mpi

}  // namespace tessel
