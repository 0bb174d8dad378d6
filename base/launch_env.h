#pragma once
// The launch environment: the variables a launcher sets for each worker (torchrun's names, which
// tessel-run sets too; Open MPI's; Slurm's), declared once here, and read_launch_env(), the one
// reader. They are not tessel's knobs (env.h): other tools define them, so they keep their
// names. docs/environment.md lists them.
//
//   const LaunchEnv env = read_launch_env();   // rank, world size, local rank, store address

#include <string>

namespace tessel {

namespace launch_env {

// torchrun's, which tessel-run sets for every worker.
inline constexpr char kRank[] = "RANK";                        // global rank
inline constexpr char kWorldSize[] = "WORLD_SIZE";             // ranks in the job
inline constexpr char kLocalRank[] = "LOCAL_RANK";             // rank among this node's
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";  // ranks on this node
inline constexpr char kGroupRank[] = "GROUP_RANK";             // this node's rank
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";  // nodes in the job
inline constexpr char kRoleRank[] = "ROLE_RANK";               // rank among the role's workers
inline constexpr char kRoleName[] = "ROLE_NAME";               // the workers' role
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";    // workers of the role
inline constexpr char kMasterAddr[] = "MASTER_ADDR";           // the job's store host
inline constexpr char kMasterPort[] = "MASTER_PORT";           // and port
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";  // restarts so far
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";    // restarts allowed
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";                // the job's id
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";

// Open MPI's mpirun, and what any PMI or PMIx launcher sets (MPI's launch, mpi::launched()).
inline constexpr char kOmpiRank[] = "OMPI_COMM_WORLD_RANK";
inline constexpr char kOmpiSize[] = "OMPI_COMM_WORLD_SIZE";
inline constexpr char kOmpiLocalRank[] = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr char kPmiSize[] = "PMI_SIZE";
inline constexpr char kPmixRank[] = "PMIX_RANK";
inline constexpr char kOmpiJobId[] = "OMPI_MCA_ess_base_jobid";  // the mpirun job (run ids)
inline constexpr char kPmixNamespace[] = "PMIX_NAMESPACE";       // the PMIx job (run ids)

// Slurm's srun.
inline constexpr char kSlurmProcId[] = "SLURM_PROCID";
inline constexpr char kSlurmNtasks[] = "SLURM_NTASKS";
inline constexpr char kSlurmLocalId[] = "SLURM_LOCALID";
inline constexpr char kSlurmNnodes[] = "SLURM_NNODES";  // nodes of the step (tessel-run --nnodes)
inline constexpr char kSlurmNodeId[] = "SLURM_NODEID";  // this node's index in the step
inline constexpr char kSlurmJobId[] = "SLURM_JOB_ID";
inline constexpr char kSlurmStepId[] = "SLURM_STEP_ID";

}  // namespace launch_env

// What the launcher told this process.
struct LaunchEnv {
  std::string launcher = "none";  // "torchrun" (also tessel-run), "mpirun", "slurm", "none"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  bool local_rank_set = false;  // the launcher named the local rank (else local_rank is 0)
  int local_world_size = 0;     // LOCAL_WORLD_SIZE (0: not set or not a positive number)
  std::string master_addr;      // MASTER_ADDR
  int master_port = 0;          // MASTER_PORT
  std::string store_addr;       // TESSEL_STORE_ADDR (host:port; a knob, read through env.h)
  int restart_count = 0;        // TORCHELASTIC_RESTART_COUNT
  int max_restarts = -1;        // TORCHELASTIC_MAX_RESTARTS (-1: not set)
};

// Reads the launcher's variables: RANK/WORLD_SIZE (with LOCAL_RANK) win over Open MPI's, Open
// MPI's over Slurm's; MASTER_ADDR/MASTER_PORT, TESSEL_STORE_ADDR, LOCAL_WORLD_SIZE and
// TORCHELASTIC_RESTART_COUNT whichever launched it. Throws InvalidArgument naming a variable
// whose value is not a non-negative integer, or a rank outside [0, world size). Reads the
// process environment each call; thread-safe as getenv is.
LaunchEnv read_launch_env();

}  // namespace tessel
