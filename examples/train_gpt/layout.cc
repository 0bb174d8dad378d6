#include "layout.h"

#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/init.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

namespace tessel::train_gpt {

Device training_device(const Flags& f, const LaunchEnv& env) {
  Device device = parse_device(f.device);
  if (device.is_cuda()) {
    TESSEL_CHECK(cuda::device_count() > 0, Unavailable,
                 "--device {}: no CUDA device is usable here: {}", f.device,
                 cuda::unavailable_reason());
    if (f.device == "cuda") device.index = env.local_rank;
  }
  check_device_available(device);
  if (device.is_cuda()) cuda::set_device(device.index);  // before any CUDA work: no context on 0
  return device;
}

Layout make_layout(const Flags& f, Device device) {
  Layout l;
  if (read_launch_env().world_size > 1) l.world = init_process_group({.device = device});
  const int64_t world = l.world ? l.world->size() : 1;
  l.tp = f.tp;
  TESSEL_CHECK(l.tp >= 1 && world % l.tp == 0, InvalidArgument,
               "--tp {} does not divide the {} ranks", l.tp, world);
  TESSEL_CHECK(l.tp == 1 || !f.ddp, InvalidArgument,
               "--ddp replicates the whole model; with --tp {} use --dp-shard / --dp-replicate",
               l.tp);
  TESSEL_CHECK(!f.sequence_parallel || f.seq % l.tp == 0, InvalidArgument,
               "--sequence-parallel splits the sequence of {} over --tp {}: make --seq a multiple",
               f.seq, l.tp);
  l.replicate = f.dp_replicate;
  l.cp = f.cp;
  const int64_t cp_tp = l.cp * l.tp;
  TESSEL_CHECK(l.replicate >= 1 && world % (l.replicate * cp_tp) == 0, InvalidArgument,
               "--dp-replicate {} x --cp {} x --tp {} does not divide the {} ranks", l.replicate,
               l.cp, l.tp, world);
  l.shard = f.dp_shard < 0 ? world / (l.replicate * cp_tp) : f.dp_shard;
  TESSEL_CHECK(l.replicate * l.shard * cp_tp == world, InvalidArgument,
               "--dp-replicate {} x --dp-shard {} x --cp {} x --tp {} = {} ranks, but the job has "
               "{}",
               l.replicate, l.shard, l.cp, l.tp, l.replicate * l.shard * cp_tp, world);
  const int64_t dp = l.replicate * l.shard;
  TESSEL_CHECK(f.batch % dp == 0, InvalidArgument,
               "--batch {} (the global batch) does not split evenly over {} data-parallel ranks",
               f.batch, dp);
  TESSEL_CHECK(f.batch / dp % f.grad_accum == 0, InvalidArgument,
               "--grad-accum {}: the {} sequences of each data-parallel rank (--batch {} over {}) "
               "do not split into {} equal micro-batches",
               f.grad_accum, f.batch / dp, f.batch, dp, f.grad_accum);
  if (l.world) {
    std::vector<int64_t> shape = {l.replicate, l.shard};
    std::vector<std::string> names = {"dp_replicate", "dp_shard"};
    if (l.cp > 1) {
      shape.push_back(l.cp);
      names.push_back("cp");
    }
    if (l.tp > 1) {
      shape.push_back(l.tp);
      names.push_back("tp");
    }
    l.mesh = std::make_unique<DeviceMesh>(init_device_mesh(l.world, shape, names));
    l.batch_index = l.mesh->local_rank("dp_replicate") * l.shard + l.mesh->local_rank("dp_shard");
    l.batch_parts = dp;
  }
  return l;
}

double world_mean(ProcessGroup* world, double value) {
  if (world == nullptr) return value;
  Tensor t = to(from_vector<float>({static_cast<float>(value)}), world->default_device());
  world->all_reduce(t, {.op = ReduceOp::kAvg});
  return item(t);
}

}  // namespace tessel::train_gpt
