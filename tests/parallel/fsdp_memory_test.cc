// FSDP's memory, per rank (real processes over Gloo, so each rank's allocator statistics are
// its own): the peak of a training step stays within
//   (parameters + gradients + optimizer state) / N
//   + the two largest unsharded groups (the one computing and the one prefetched), each with
//     its flat communication buffer (an all_gather's output is held while its rows are copied
//     into the parameters; a reduce_scatter's input while it is in flight): 2 x 2 groups
//   + the activations of this rank's batch (what a forward pass keeps for backward),
// plus 10%; and it is well below the unsharded model's peak.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"
#include "tests/collectives/collective_checks.h"
#include "tests/collectives/fork_harness.h"

namespace tessel {
namespace {

const nn::GptConfig kConfig{
    .vocab_size = 64, .block_size = 16, .n_layer = 6, .n_head = 4, .n_embd = 128, .seed = 1};
constexpr int64_t kRows = 2;  // sequences per rank

std::pair<Tensor, Tensor> batch() {
  Generator gen(5);
  Tensor t = to(mul(rand({kRows, kConfig.block_size + 1}, gen), 63.0), DType::kI64);
  return {narrow(t, 1, 0, kConfig.block_size), narrow(t, 1, 1, kConfig.block_size)};
}

struct Peaks {
  int64_t peak = 0;         // of two training steps (the second prefetches, has AdamW state)
  int64_t activations = 0;  // what the second forward kept for backward
};

Peaks peaks_of_steps(nn::GPT& model) {
  nn::optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  const auto [x, y] = batch();
  reset_peak_memory_stats(Device::cpu());
  Peaks out;
  for (int step = 0; step < 2; ++step) {
    const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
    const Tensor loss = nn::GPT::loss(model(x), y);
    out.activations = memory_stats(Device::cpu()).allocated_bytes - before;
    backward(loss);
    opt.step();
    opt.zero_grad();
  }
  out.peak = memory_stats(Device::cpu()).peak_allocated_bytes;
  return out;
}

TEST(FsdpMemoryTest, PeakStaysWithinTheShardedBound) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  // The unsharded model in this process: its peak, and what its forward keeps (activations).
  int64_t param_bytes = 0, largest_group = 0, root_group = 0;
  Peaks single;
  {
    nn::GPT model(kConfig);
    for (const Tensor& p : model.parameters()) param_bytes += static_cast<int64_t>(p.nbytes());
    int64_t block = 0;
    for (const Tensor& p : model.submodule("transformer.h.0").parameters()) {
      block += static_cast<int64_t>(p.nbytes());
    }
    root_group = param_bytes - block * kConfig.n_layer;
    largest_group = std::max(block, root_group);
    single = peaks_of_steps(model);
  }
  const int64_t activations = single.activations;
  constexpr int kWorld = 4;
  const std::string report = ::testing::TempDir() + "/fsdp_memory_peaks.txt";
  const auto outcomes = testing::run_processes(
      kWorld,
      [&](int rank, const std::string& dir) {
        auto store = std::make_shared<FileStore>(dir);
        GlooOptions options;
        options.hostname = "127.0.0.1";
        options.group.timeout = std::chrono::seconds(30);
        auto world = gloo::create_process_group(store, rank, kWorld, options);
        DeviceMesh mesh = init_device_mesh(world, {kWorld}, {"dp"});
        std::unique_ptr<nn::GPT> model;
        {
          DefaultDeviceGuard meta(Device::meta());
          model = std::make_unique<nn::GPT>(kConfig);
        }
        for (int i = 0; i < kConfig.n_layer; ++i) {
          fully_shard(model->submodule("transformer.h").child(std::to_string(i)), mesh);
        }
        fully_shard(*model, mesh);
        model->to_empty(Device::cpu());
        model->init_weights();
        const int64_t peak = peaks_of_steps(*model).peak;
        std::ofstream(report + std::to_string(rank)) << peak;
        const int64_t bound = 4 * param_bytes / kWorld + 4 * largest_group + activations;
        if (peak > bound * 11 / 10) {
          throw testing::CheckFailure(fmt::format(
              "rank {}: peak {} bytes over the bound {} (+10%): sharded state {}, largest group "
              "{}, activations {}",
              rank, peak, bound, 4 * param_bytes / kWorld, largest_group, activations));
        }
      },
      std::chrono::seconds(120));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
  for (int rank = 0; rank < kWorld; ++rank) {
    int64_t peak = 0;
    std::ifstream(report + std::to_string(rank)) >> peak;
    // The difference shows: a quarter of the state instead of all of it.
    EXPECT_LT(peak, single.peak - 2 * param_bytes) << "rank " << rank;
    std::printf(
        "rank %d: FSDP peak %.2f MiB; unsharded %.2f MiB; parameters %.2f MiB; "
        "activations %.2f MiB\n",
        rank, peak / 1048576.0, single.peak / 1048576.0, param_bytes / 1048576.0,
        activations / 1048576.0);
  }
}

}  // namespace
}  // namespace tessel
