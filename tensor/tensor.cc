#include "tessel/tensor/tensor.h"

#include <cstring>

#include "tessel/base/error.h"
#include "tessel/tensor/backend.h"

namespace tessel {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

TensorImpl& Tensor::impl() const {
  TESSEL_CHECK(impl_ != nullptr, InvalidArgument, "use of an undefined Tensor");
  return *impl_;
}

namespace {
int64_t wrap_dim(int64_t d, int64_t rank) {
  const int64_t wrapped = d < 0 ? d + rank : d;
  TESSEL_CHECK(wrapped >= 0 && wrapped < rank, OutOfRange,
               "dimension {} is out of range for a tensor with {} dimensions", d, rank);
  return wrapped;
}
}  // namespace

int64_t Tensor::size(int64_t d) const { return impl().shape[wrap_dim(d, dim())]; }
int64_t Tensor::stride(int64_t d) const { return impl().strides[wrap_dim(d, dim())]; }

bool Tensor::is_contiguous() const {
  const TensorImpl& t = impl();
  if (shape_numel(t.shape) == 0) return true;  // no element: any strides describe it
  int64_t expected = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] == 1) continue;
    if (t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

namespace {
[[noreturn]] void throw_no_data(const Tensor& t) {
  if (t.is_meta()) {
    throw InvalidArgument(fmt::format(
        "{} is on the meta device and holds no data; materialise it first (empty() on a real "
        "device, Module::to_empty)",
        t.str()));
  }
  throw InvalidArgument(fmt::format(
      "{} views a released storage (Storage::release); refill() it before use", t.str()));
}
}  // namespace

void* Tensor::data_ptr() const {
  const TensorImpl& t = impl();
  char* base = static_cast<char*>(t.storage.data());
  if (base == nullptr && t.storage.bytes() > 0) [[unlikely]] {
    throw_no_data(*this);
  }
  return base + t.offset * static_cast<int64_t>(dtype_size(t.dtype));
}

void Tensor::set_data(const Tensor& other) const {
  TensorImpl& t = impl();
  const TensorImpl& o = other.impl();
  TESSEL_CHECK(!requires_grad() || is_floating(o.dtype), InvalidArgument,
               "set_data: {} requires a gradient but the new data {} is not floating", str(),
               other.str());
  if (&t == &o) return;
  if (t.autograd && t.autograd->grad.defined()) {
    const Tensor& g = t.autograd->grad;
    if (g.shape() != o.shape || g.dtype() != o.dtype || g.device() != o.storage.device()) {
      t.autograd->grad = Tensor();
    }
  }
  t.storage = o.storage;
  t.offset = o.offset;
  t.shape = o.shape;
  t.strides = o.strides;
  t.dtype = o.dtype;
}

void Tensor::check_dtype(DType expected) const {
  TESSEL_CHECK(dtype() == expected, InvalidArgument, "tensor has dtype {} but {} was requested",
               dtype_name(dtype()), dtype_name(expected));
}

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  TESSEL_CHECK(shape.size() == strides.size(), InvalidArgument,
               "as_strided: shape {} and strides {} differ in length", shape_str(shape),
               shape_str(strides));
  int64_t last = offset;  // highest element index the view touches
  bool empty_view = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    TESSEL_CHECK(shape[i] >= 0 && strides[i] >= 0, InvalidArgument,
                 "as_strided: negative size or stride in shape {} strides {}", shape_str(shape),
                 shape_str(strides));
    if (shape[i] == 0)
      empty_view = true;
    else
      last += (shape[i] - 1) * strides[i];
  }
  const TensorImpl& t = impl();
  const int64_t capacity = static_cast<int64_t>(t.storage.bytes() / dtype_size(t.dtype));
  TESSEL_CHECK(offset >= 0 && (empty_view || last < capacity), OutOfRange,
               "as_strided: view shape {} strides {} offset {} reaches element {} of a storage "
               "holding {}",
               shape_str(shape), shape_str(strides), offset, last, capacity);
  auto view = std::make_shared<TensorImpl>();
  view->storage = t.storage;
  view->offset = offset;
  view->shape = shape;
  view->strides = strides;
  view->dtype = t.dtype;
  return Tensor(std::move(view));
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return fmt::format("Tensor(shape={}, dtype={}, device={})", shape_str(shape()),
                     dtype_name(dtype()), device().str());
}

bool Tensor::requires_grad() const {
  const AutogradMeta* meta = impl().autograd.get();
  return meta != nullptr && meta->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool on) {
  TESSEL_CHECK(!on || is_floating(dtype()), InvalidArgument,
               "only floating-point tensors can require gradients, not {}", dtype_name(dtype()));
  ensure_autograd_meta().requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  const AutogradMeta* meta = impl().autograd.get();
  return meta != nullptr ? meta->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    TESSEL_CHECK(grad.shape() == shape() && grad.dtype() == dtype(), InvalidArgument,
                 "gradient {} does not match tensor {}", grad.str(), str());
  }
  ensure_autograd_meta().grad = grad;
}

AutogradMeta& Tensor::ensure_autograd_meta() const {
  TensorImpl& t = impl();
  if (!t.autograd) t.autograd = std::make_shared<AutogradMeta>();
  return *t.autograd;
}

void Tensor::set_shard_info(std::shared_ptr<const ShardInfo> info) const {
  if (info) {
    bool fits =
        info->global_shape.size() == shape().size() && info->offset.size() == shape().size();
    for (size_t d = 0; fits && d < shape().size(); ++d) {
      fits = info->offset[d] >= 0 && info->offset[d] + shape()[d] <= info->global_shape[d];
    }
    TESSEL_CHECK(fits, InvalidArgument,
                 "set_shard_info: a box of shape {} at offset {} does not fit in {}",
                 shape_str(shape()), shape_str(info->offset), shape_str(info->global_shape));
  }
  impl().shard = std::move(info);
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) {
    TESSEL_CHECK(s >= 0, InvalidArgument, "negative size in shape {}", shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      Storage::allocate(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend_for(device).fill(t, 0.0);
  return t;
}

Tensor empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t s : shape) {
    TESSEL_CHECK(s >= 0, InvalidArgument, "negative size in shape {}", shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      Storage::allocate_pinned(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor from_data(const void* data, int64_t count, const Shape& shape, DType dtype) {
  TESSEL_CHECK(count == shape_numel(shape), InvalidArgument,
               "{} values cannot fill shape {} ({} elements)", count, shape_str(shape),
               shape_numel(shape));
  Tensor t = empty(shape, dtype, Device::cpu());
  if (count > 0) std::memcpy(t.data_ptr(), data, t.nbytes());
  return t;
}

}  // namespace tessel
