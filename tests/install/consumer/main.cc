// Uses the installed headers and libraries the way a training program would: a 2x2 mesh over
// four rank-threads, an all_reduce along each dimension, and a differentiable attention call.
#include <tessel/base/build_info.h>
#include <tessel/base/error.h>
#include <tessel/collectives/threads/threads_backend.h>
#include <tessel/kernels/attention/sdpa.h>
#include <tessel/mesh/device_mesh.h>
#include <tessel/parallel/fsdp/fsdp.h>
#include <tessel/store/memory_store.h>
#include <tessel/tensor/autograd.h>
#include <tessel/tensor/ops.h>

#include <cstdio>

int main() {
  using namespace tessel;
  std::printf("%s", build_info_text().c_str());
  try {
    parse_duration("soon");
    std::printf("consumer: parse_duration accepted 'soon'\n");
    return 1;
  } catch (const InvalidArgument& e) {
    std::printf("caught %s\n", e.what());
  }

  threads::run_ranks(4, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"});
    Tensor t = from_vector<float>({1.0f});
    mesh.group("tp")->all_reduce(t);
    mesh.group("dp")->all_reduce(t);
    TESSEL_CHECK(item(t) == 4.0, Internal, "rank {}: mesh all_reduce gave {}", pg.rank(), item(t));
  });

  // The store is a library of its own (tessel/store/, tessel::store).
  auto store = std::make_shared<MemoryStore>();
  PrefixStore job("job", store);
  job.set("k", "v");
  TESSEL_CHECK(store->get("job/k") == "v", Internal, "PrefixStore did not prefix its key");

  // FSDP's header at its folder (tessel/parallel/fsdp/); a real sharding run is the tests' job.
  FullyShardOptions fsdp_options;
  (void)fsdp_options;

  Generator gen(1);
  Tensor q = randn({1, 2, 16, 32}, gen).set_requires_grad(true);
  Tensor k = randn({1, 2, 16, 32}, gen);
  Tensor v = randn({1, 2, 16, 32}, gen);
  Tensor out = kernels::scaled_dot_product_attention(q, k, v, {.causal = true});
  backward(sum(out));
  TESSEL_CHECK(q.grad().defined(), Internal, "attention gave q no gradient");
  std::printf("consumer: ok\n");
  return 0;
}
