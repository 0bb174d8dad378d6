#pragma once
// init_process_group(): the world group of a job, from the environment its launcher set
// (declared in base/launch_env.h, read there by read_launch_env()):
//
//   tessel-run / torchrun   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR + MASTER_PORT or
//                           TESSEL_STORE_ADDR
//   mpirun (Open MPI)       OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   Slurm (srun)            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//   nothing                 a world of one rank
//
// The backend is InitOptions::backend, else TESSEL_PG_BACKEND, else chosen from the device: CUDA
// -> nccl; CPU -> mpi when started by an MPI launcher, gloo otherwise (threads for a world of one
// without a store). The store is InitOptions::store, else a FileStore in TESSEL_STORE_DIR /
// InitOptions::store_dir, else the job's store server (connect_job_store()).
//
//   auto world = init_process_group();                       // CPU, backend from the launcher
//   auto world = init_process_group({.device = Device::cuda(local_rank)});

#include <memory>
#include <string>

#include "tessel/base/launch_env.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/collectives/process_group.h"
#include "tessel/store/store.h"
#include "tessel/tensor/device.h"

namespace tessel {

struct InitOptions {
  std::string backend = {};           // "", "gloo", "mpi", "nccl", "threads", "fake"
  Device device = Device::cpu();      // picks the backend when none is named
  std::shared_ptr<Store> store = {};  // the job's store; found from the environment when null
  std::string store_dir = {};         // a FileStore directory (else TESSEL_STORE_DIR)
  Nanoseconds timeout{0};             // default collective timeout (0: TESSEL_PG_TIMEOUT)
  GlooOptions gloo = {};              // gloo: address/interface (group fields are overwritten)
};

// The job's store from the environment: a FileStore when `store_dir` (or TESSEL_STORE_DIR) is
// set; otherwise the store server at TESSEL_STORE_ADDR or MASTER_ADDR:MASTER_PORT. This is the
// one place where the gRPC store client plugs in; until it lands a server address gives
// Unavailable with a hint to use TESSEL_STORE_DIR. Returns null when nothing is configured.
std::shared_ptr<Store> connect_job_store(const LaunchEnv& env, const std::string& store_dir,
                                         Nanoseconds timeout);

// The CUDA device this process owns: `requested`'s index when it is a CUDA device, else
// cuda:LOCAL_RANK as the launcher named it (tessel-run/torchrun LOCAL_RANK, Open MPI's or
// Slurm's local rank), else the rank, modulo the `visible` devices. Throws InvalidArgument when
// a requested index is not below `visible`, Unavailable when no device is visible.
int process_cuda_device(const LaunchEnv& env, Device requested, int visible);

// Creates the world group (collective over every rank of the job). For a CUDA device, or the
// nccl backend, it first makes process_cuda_device() current on the calling thread (before any
// other CUDA work, so no rank makes a context on GPU 0) and gives it to NCCL. The backends get the
// launcher's local rank and local world size through their options (they read no environment).
// Throws InvalidArgument for a bad backend name or environment, Unavailable for a backend this
// build lacks or a missing store, and whatever the backend throws while connecting.
std::shared_ptr<ProcessGroup> init_process_group(InitOptions options = {});

}  // namespace tessel
