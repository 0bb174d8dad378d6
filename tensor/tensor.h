#pragma once
// Tensor: a view of a Storage (offset + shape + strides, in elements) with a dtype and device.
// Copies of a Tensor share the view (like torch.Tensor handles); views share the storage.
//
//   Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
//   float* p = x.data<float>();          // contiguous f32 on the CPU
//   Tensor z = zeros({4, 1024}, DType::kBF16);
//   Tensor m = empty({1 << 20, 4096}, DType::kF32, Device::meta());   // shape only, no memory
//
// Host access: data<T>() and data_ptr() give the address of the first element; they throw for
// a tensor on the meta device or over a released storage (Storage::release). On a device
// other than the CPU the address is device memory, for kernels only.
//
// Thread-safety: a Tensor handle may be copied across threads; concurrent writes to the same
// elements are the caller's to order.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/tensor/device.h"
#include "tessel/tensor/dtype.h"
#include "tessel/tensor/storage.h"

namespace tessel {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);         // product of the sizes; 1 for a scalar shape {}
std::string shape_str(const Shape& shape);       // "(2, 3)"
Strides contiguous_strides(const Shape& shape);  // row-major

struct AutogradMeta;  // defined with autograd; null for tensors that never needed a gradient

// Marks a tensor as one box of a larger logical tensor: a shard made by a parallel wrapper
// (FSDP, tensor parallelism). Initialisers (normal_, uniform_ in ops.h) draw the box's values
// from the global tensor's random stream, so a sharded model is initialised exactly like the
// whole one; checkpoints read where the box lies.
struct ShardInfo {
  Shape global_shape;
  Shape offset;                      // of the box's first element, per dimension
  std::shared_ptr<const void> spec;  // the wrapper's own description (parallel/: a DTensorSpec)
};

// The state behind a Tensor handle. Exposed for backends and autograd; users use Tensor.
struct TensorImpl {
  Storage storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Strides strides;  // in elements
  DType dtype = DType::kF32;
  std::shared_ptr<AutogradMeta> autograd;
  std::shared_ptr<const ShardInfo> shard;  // null unless the tensor is a shard (kept by set_data)
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage.device(); }
  const Shape& shape() const { return impl().shape; }
  const Strides& strides() const { return impl().strides; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  // Size of dimension d; negative d counts from the end. Throws OutOfRange.
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(impl().shape); }
  int64_t offset() const { return impl().offset; }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const Storage& storage() const { return impl().storage; }

  // Address of the first element (storage data + offset). Throws InvalidArgument naming the
  // tensor when it has no memory (meta device, released storage) and is not empty.
  void* data_ptr() const;
  // Typed address; throws InvalidArgument when T does not match dtype().
  template <typename T>
  T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data_ptr());
  }

  // A new view of the same storage. Throws OutOfRange when it would reach past the storage.
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;

  // "Tensor(shape=(2, 3), dtype=f32, device=cpu)"
  std::string str() const;

  // Conversions (ops.h's to(); defined with the ops): this tensor when it already has the
  // device or dtype, else a converted copy. Differentiable.
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  // Makes this tensor (every handle of it) a view of `other`'s data: storage, offset, shape,
  // strides and dtype are taken from `other`, and autograd state (requires_grad, hooks) is kept
  // (like PyTorch's `param.data = other`). The gradient is dropped when it no longer matches.
  // Modules and FSDP use it to move, materialise or shard parameters in place, so references
  // held by optimizers stay valid. Not recorded by autograd; throws InvalidArgument when
  // requires_grad is set and `other` is not floating.
  void set_data(const Tensor& other) const;
  bool is_meta() const { return device().is_meta(); }
  // The box of a larger tensor this tensor is (null when it is not a shard); see ShardInfo.
  const ShardInfo* shard_info() const { return impl().shard.get(); }
  // Throws InvalidArgument when the box does not fit this tensor's shape or the global shape.
  void set_shard_info(std::shared_ptr<const ShardInfo> info) const;
  bool is_pinned() const { return impl().storage.is_pinned(); }

  // Autograd state (see tensor/autograd.h for backward()). A leaf that requires a gradient
  // accumulates it in grad(); grad() is undefined until a backward pass reaches it.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  AutogradMeta* autograd_meta() const { return impl().autograd.get(); }
  // Creates the autograd state on first use. Not thread-safe against a concurrent first call.
  AutogradMeta& ensure_autograd_meta() const;

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  void check_dtype(DType expected) const;
  std::shared_ptr<TensorImpl> impl_;
};

struct Node;  // an operation in the autograd graph (tensor/autograd.h)

// Per-tensor autograd state; created on demand. The graph fields are managed by
// tensor/autograd.cc (use the functions in tensor/autograd.h rather than editing them).
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;         // the op that produced this tensor; null for leaves
  int output_nr = 0;                     // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;  // leaves: the node that accumulates into grad
  // Leaves: hooks run on each incoming gradient, then hooks run once it is accumulated.
  std::vector<std::function<Tensor(const Tensor&)>> grad_hooks;
  std::vector<std::function<void(const Tensor&)>> post_accumulate_grad_hooks;
};

// Uninitialised memory of the given shape (contiguous), on the thread's default device
// (default_device(): the CPU unless a DefaultDeviceGuard says otherwise) unless one is given.
// On the meta device nothing is allocated.
Tensor empty(const Shape& shape, DType dtype = DType::kF32, Device device = default_device());
Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Device device = default_device());
// Uninitialised page-locked host memory (see pinned_allocator() in storage.h).
Tensor empty_pinned(const Shape& shape, DType dtype = DType::kF32);
// A CPU tensor holding a copy of `count` elements at `data`. Throws InvalidArgument when the
// count does not match the shape.
Tensor from_data(const void* data, int64_t count, const Shape& shape, DType dtype);

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  static_assert(!std::is_same_v<T, bool>, "use from_data for bool (std::vector<bool> is packed)");
  return from_data(values.data(), static_cast<int64_t>(values.size()), shape, dtype_of<T>());
}
template <typename T>
Tensor from_vector(const std::vector<T>& values) {
  return from_vector(values, Shape{static_cast<int64_t>(values.size())});
}

}  // namespace tessel
