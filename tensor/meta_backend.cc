// The meta device's backend: every kernel is a no-op, so building a model on the meta device
// runs its constructors and initialisers (shapes, dtypes, RNG offsets) and allocates nothing.
#include "tessel/tensor/internal/meta_backend.h"

namespace tessel::internal {
namespace {

class MetaBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::kMeta; }
  void copy(const Tensor&, const Tensor&) override {}
  void copy_device(const Tensor&, const Tensor&, bool) override {}
  void fill(const Tensor&, double) override {}
  void arange(const Tensor&, double, double) override {}
  void random(const Tensor&, RandomDistribution, double, double, uint64_t, uint64_t) override {}
  void unary(UnaryOp, const Tensor&, const Tensor&) override {}
  void binary(BinaryOp, const Tensor&, const Tensor&, const Tensor&) override {}
  void where(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void reduce(ReduceOp, const Tensor&, const std::vector<int64_t>&, const Tensor&) override {}
  void argmax(const Tensor&, int64_t, const Tensor&) override {}
  void softmax(const Tensor&, const Tensor&, bool) override {}
  void softmax_backward(const Tensor&, const Tensor&, const Tensor&, bool) override {}
  void layer_norm(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&,
                  const Tensor&) override {}
  void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void rms_norm(const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) override {}
  void rms_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&) override {}
  void embedding(const Tensor&, const Tensor&, const Tensor&) override {}
  void embedding_backward(const Tensor&, const Tensor&, const Tensor&) override {}
  void cross_entropy(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&) override {
  }
  void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                              const Tensor&) override {}
  void matmul(const Tensor&, const Tensor&, const Tensor&) override {}
  void addmm(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void adamw_step(std::span<const AdamWTensors>, const AdamWHyper&) override {}
};

}  // namespace

Backend& meta_backend() {
  static MetaBackend backend;
  return backend;
}

}  // namespace tessel::internal
