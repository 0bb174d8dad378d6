#include "tessel/collectives/init.h"

#include <fmt/format.h>

#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/dump_coordinator.h"
#include "tessel/collectives/fake/fake_backend.h"
#include "tessel/collectives/mpi/mpi_backend.h"
#include "tessel/collectives/nccl/nccl_backend.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/store/file_store.h"
#include "tessel/store/memory_store.h"
#include "tessel/store/store.h"
#include "tessel/store/store_client.h"
#include "tessel/tensor/cuda/cuda.h"

namespace tessel {
namespace {

// A FileStore directory outlives its job, so a rerun in the same directory would find the
// previous run's keys (Gloo would dial the addresses of processes now gone: "Connection
// refused"). Each rank counts its runs in the directory; the ranks of one run share the count
// and keep their keys under run_<N>/. A rank whose peer is already in a later run joins an
// earlier run that stopped before all its ranks had started: it refuses at once, saying so.
std::shared_ptr<Store> file_store_run(const std::shared_ptr<FileStore>& store, int rank,
                                      int world_size) {
  const int64_t run = store->add(fmt::format("runs/rank_{}", rank), 1);
  for (int r = 0; r < world_size; ++r) {
    const std::string key = fmt::format("runs/rank_{}", r);
    if (r == rank || !store->check({key})) continue;
    const int64_t other = std::stoll(store->get(key));
    TESSEL_CHECK(other <= run, Unavailable,
                 "TESSEL_STORE_DIR {}: rank {} counts {} runs in this directory but rank {} "
                 "only {}: an earlier run stopped before all its ranks started; give this run an "
                 "empty directory (or empty this one)",
                 store->directory(), r, other, rank, run);
  }
  return std::make_shared<PrefixStore>(fmt::format("run_{}", run), store);
}

}  // namespace

std::shared_ptr<Store> connect_job_store(const LaunchEnv& env, const std::string& store_dir,
                                         Nanoseconds timeout) {
  const std::string dir = store_dir.empty() ? env_string(EnvKnob::kStoreDir) : store_dir;
  if (!dir.empty()) return std::make_shared<FileStore>(dir, timeout);
  std::string addr = env.store_addr;
  if (addr.empty() && !env.master_addr.empty() && env.master_port > 0) {
    addr = fmt::format("{}:{}", env.master_addr, env.master_port);
  }
  if (addr.empty()) return nullptr;
  TESSEL_CHECK(StoreClient::is_available(), Unavailable,
               "the job's store server is at '{}' but this build has no gRPC store client; set "
               "TESSEL_STORE_DIR to a directory all ranks share to use a FileStore",
               addr);
  // The address may come from MASTER_ADDR/MASTER_PORT; the token always from the environment.
  StoreClientOptions client;
  client.address = addr;
  client.token = store_token_from_env(addr);
  client.tls = tls_files_from_env();
  client.default_timeout = timeout;
  return std::make_shared<StoreClient>(std::move(client));
}

int process_cuda_device(const LaunchEnv& env, Device requested, int visible) {
  TESSEL_CHECK(visible > 0, Unavailable, "rank {}: a CUDA device is needed and none is visible",
               env.rank);
  if (requested.is_cuda()) {
    TESSEL_CHECK(requested.index >= 0 && requested.index < visible, InvalidArgument,
                 "rank {}: {} requested but {} CUDA devices are visible", env.rank, requested.str(),
                 visible);
    return requested.index;
  }
  return (env.local_rank_set ? env.local_rank : env.rank) % visible;
}

std::shared_ptr<ProcessGroup> init_process_group(InitOptions options) {
  init_logging();
  log_env_knobs_once();
  const LaunchEnv env = read_launch_env();
  set_log_rank(env.rank);
  const Nanoseconds timeout = resolve_group_timeout({.timeout = options.timeout});
  std::string backend = options.backend;
  if (backend.empty()) backend = env_string(EnvKnob::kPgBackend);
  // One GPU per process: its device is current on the main thread before any CUDA call, so no
  // rank makes a context on GPU 0 by default (also for nccl named with a CPU device).
  if (options.device.is_cuda() || backend == "nccl") {
    options.device = Device::cuda(process_cuda_device(env, options.device, cuda::device_count()));
    cuda::set_device(options.device.index);
  }
  if (backend.empty() || backend == "auto") {
    if (options.device.is_cuda()) {
      backend = "nccl";
    } else if (env.launcher == "mpirun" || (env.launcher == "slurm" && mpi::launched())) {
      backend = "mpi";
    } else {
      backend = env.world_size == 1 && !options.store ? "threads" : "gloo";
    }
  }
  ProcessGroupOptions group{.name = "world", .id = 0, .timeout = timeout};
  log_info(LogComponent::kCollectives, "init_process_group: backend {}, rank {} of {} ({})",
           backend, env.rank, env.world_size, env.launcher);
  if (backend == "threads") {
    TESSEL_CHECK(env.world_size == 1, InvalidArgument,
                 "backend 'threads' makes a world of one process, but WORLD_SIZE is {}; use "
                 "threads::create_world for ranks as threads",
                 env.world_size);
    return threads::create_world(1, group).front();
  }
  if (backend == "fake")
    return fake::create_process_group(env.rank, env.world_size, nullptr, group);
  if (backend == "mpi") {
    auto world = mpi::create_world(group);
    if (env.world_size > 1) enable_flight_recorder_dumps(nullptr, world->rank(), world->size());
    return world;
  }
  TESSEL_CHECK(backend == "gloo" || backend == "nccl", InvalidArgument,
               "backend '{}' is not one of auto, gloo, mpi, nccl, threads, fake", backend);
  std::shared_ptr<Store> store = options.store;
  if (!store) {
    store = connect_job_store(env, options.store_dir, timeout);
    if (auto file_store = std::dynamic_pointer_cast<FileStore>(store)) {
      store = file_store_run(file_store, env.rank, env.world_size);
    }
  }
  if (!store && env.world_size == 1) store = std::make_shared<MemoryStore>(timeout);
  TESSEL_CHECK(store != nullptr, Unavailable,
               "rank {} of {}: no store to rendezvous through; set TESSEL_STORE_ADDR (tessel-run "
               "does), MASTER_ADDR/MASTER_PORT, or TESSEL_STORE_DIR",
               env.rank, env.world_size);
  // A restarted job (tessel-run, torchrun --max-restarts) keeps its store, so the previous
  // attempt's rendezvous keys (the addresses of processes now gone) are still there: each
  // attempt rendezvouses under its own prefix.
  std::shared_ptr<Store> rendezvous = store;
  if (env.restart_count > 0) {
    rendezvous = std::make_shared<PrefixStore>(fmt::format("attempt_{}", env.restart_count), store);
  }
  if (backend == "gloo") {
    GlooOptions gloo = options.gloo;
    gloo.group = group;
    if (gloo.local_world_size == 0) gloo.local_world_size = env.local_world_size;
    auto world = gloo::create_process_group(rendezvous, env.rank, env.world_size, gloo);
    if (env.world_size > 1) enable_flight_recorder_dumps(store, env.rank, env.world_size);
    return world;
  }
  if (env.world_size > 1) enable_flight_recorder_dumps(store, env.rank, env.world_size);
  return nccl::create_process_group(
      rendezvous, env.rank, env.world_size,
      NcclOptions{.device = options.device.index,
                  .local_rank = env.local_rank_set ? env.local_rank : -1,
                  .group = group});
}

}  // namespace tessel
