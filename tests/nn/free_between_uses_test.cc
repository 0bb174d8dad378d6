// The worked example of docs/execution-model.md, compiled and checked: a wrapper that keeps a
// module's parameters in memory only while forward or backward needs them — FSDP's memory
// pattern without the communication — gives the same gradients as the plain module, and the
// memory statistics show the parameters' bytes given back between uses.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tessel/nn/transformer.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

namespace tessel::nn {
namespace {

// --- begin docs/execution-model.md example ---
// Keeps `m`'s parameters in memory only while its forward or backward runs. The values live in
// `kept` in between (with FSDP: this rank's shard; gathering them is a collective).
void free_between_uses(Module& m) {
  struct State {
    std::vector<Tensor> params, kept;
  };
  auto state = std::make_shared<State>();
  for (const Tensor& p : m.parameters()) {
    state->params.push_back(p);
    state->kept.push_back(clone(detach(p)));
    p.storage().release();
  }
  auto gather = [state] {
    NoGradGuard no_grad;
    for (size_t i = 0; i < state->params.size(); ++i) {
      state->params[i].storage().refill();      // same storage: saved tensors see it
      copy_(state->params[i], state->kept[i]);  // FSDP: all-gather into it
    }
  };
  auto release = [state] {
    for (const Tensor& p : state->params) p.storage().release();
  };
  m.register_forward_pre_hook([gather](Module&, Tensors&) { gather(); });
  m.register_forward_hook([release](Module&, const Tensors&, Tensors&) { release(); });
  m.register_backward_pre_hook([gather](Module&, Tensors&) { gather(); });
  // The module's backward is done when its inputs' gradients are known; free at the end of the
  // whole pass (FSDP also waits for its gradient reductions there).
  m.register_backward_hook(
      [release](Module&, Tensors&, const Tensors&) { queue_callback(release); });
}
// --- end docs/execution-model.md example ---

TEST(FreeBetweenUsesTest, SameGradientsAndTheParametersMemoryIsGivenBack) {
  const AttentionOptions options{.n_embd = 64, .n_head = 4, .dropout = 0.0, .bias = true};
  Generator gen_a(3), gen_b(3);
  Block plain(options, &gen_a), wrapped(options, &gen_b);
  free_between_uses(wrapped);
  int64_t param_bytes = 0;
  for (const Tensor& p : plain.parameters()) param_bytes += static_cast<int64_t>(p.nbytes());

  const Tensor x = randn({2, 16, 64});
  backward(sum(mul(plain(x), plain(x))));
  const int64_t idle = memory_stats(Device::cpu()).allocated_bytes;
  for (const Tensor& p : wrapped.parameters()) EXPECT_TRUE(p.storage().is_released());
  {
    const Tensor y = wrapped(x);
    const Tensor z = wrapped(x);  // twice, as for plain: gradients accumulate over both
    for (const Tensor& p : wrapped.parameters()) EXPECT_TRUE(p.storage().is_released());
    backward(sum(mul(y, z)));
  }
  for (const Tensor& p : wrapped.parameters()) EXPECT_TRUE(p.storage().is_released());
  // Between uses the parameters hold no memory; only their new gradients do.
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes - idle, param_bytes);

  const auto a = plain.named_parameters(), b = wrapped.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(to_vector<float>(a[i].second.grad()), to_vector<float>(b[i].second.grad()))
        << a[i].first;
  }
}

}  // namespace
}  // namespace tessel::nn
