// Creation, conversion and copies; dtype promotion and broadcasting rules.
#include <cmath>

#include "tessel/tensor/autograd.h"
#include "tessel/tensor/internal/op_util.h"
#include "tessel/tensor/ops.h"

namespace tessel {

using internal::backend_of;

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa != fb) return fa ? a : b;
  if (fa) return DType::kF32;  // f32 with anything, or bf16 with f16
  if (a == DType::kI64 || b == DType::kI64) return DType::kI64;
  if (a == DType::kI32 || b == DType::kI32) return DType::kI32;
  return DType::kBool;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t sa = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t sb = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    TESSEL_CHECK(sa == sb || sa == 1 || sb == 1, InvalidArgument,
                 "shapes {} and {} do not broadcast (dim {}: {} vs {})", shape_str(a),
                 shape_str(b), i, sa, sb);
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend_of(t).fill(t, value);
  return t;
}
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor scalar_tensor(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return full(t.shape(), 0.0, t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return full(t.shape(), 1.0, t.dtype(), t.device()); }
Tensor full_like(const Tensor& t, double value) {
  return full(t.shape(), value, t.dtype(), t.device());
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  TESSEL_CHECK(step != 0.0 && std::isfinite(start) && std::isfinite(end), InvalidArgument,
               "arange({}, {}, {}): step must be nonzero and bounds finite", start, end, step);
  const double count = std::ceil((end - start) / step);
  Tensor t = empty({count > 0 ? static_cast<int64_t>(count) : 0}, dtype, device);
  backend_of(t).arange(t, start, step);
  return t;
}
Tensor arange(int64_t end, DType dtype, Device device) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype, device);
}

namespace {
Tensor random_tensor(const Shape& shape, Generator& gen, DType dtype, Device device,
                     RandomDistribution dist, double a, double b) {
  TESSEL_CHECK(is_floating(dtype), InvalidArgument, "random tensors must be floating, not {}",
               dtype_name(dtype));
  Tensor t = empty(shape, dtype, device);
  const uint64_t offset = gen.reserve(static_cast<uint64_t>(t.numel()));
  backend_of(t).random(t, dist, a, b, gen.seed(), offset);
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device) {
  return random_tensor(shape, gen, dtype, device, RandomDistribution::kUniform, 0.0, 1.0);
}
Tensor rand(const Shape& shape, DType dtype, Device device) {
  return rand(shape, default_generator(), dtype, device);
}
Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  return random_tensor(shape, gen, dtype, device, RandomDistribution::kNormal, 0.0, 1.0);
}
Tensor randn(const Shape& shape, DType dtype, Device device) {
  return randn(shape, default_generator(), dtype, device);
}

Tensor to(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), dtype, t.device());
  backend_of(t).copy(t, out);
  if (is_floating(dtype) && needs_grad({t})) {
    const DType from = t.dtype();
    record_op("to", {t}, {out}, [from](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{to(g[0], from)};
    });
  }
  return out;
}

Tensor to(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  TESSEL_CHECK(t.device().is_cpu() || device.is_cpu(), NotImplemented,
               "copies between {} and {} are not supported yet", t.device().str(), device.str());
  backend_for(device);  // throws Unavailable when this build has no backend for it
  throw NotImplemented(fmt::format("copying {} from {} to {} needs the CUDA tensor backend",
                                   t.str(), t.device().str(), device.str()));
}

Tensor clone(const Tensor& t) {
  Tensor out = empty_like(t);
  backend_of(t).copy(t, out);
  if (needs_grad({t})) {
    record_op("clone", {t}, {out}, [](const std::vector<Tensor>& g) { return g; });
  }
  return out;
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

void copy_(const Tensor& dst, const Tensor& src) {
  internal::check_inplace("copy_", dst);
  internal::check_same_device("copy_", dst, src);
  const Shape shape = broadcast_shapes(dst.shape(), src.shape());
  TESSEL_CHECK(shape == dst.shape(), InvalidArgument, "copy_: source {} does not broadcast to {}",
               shape_str(src.shape()), shape_str(dst.shape()));
  backend_of(dst).copy(internal::broadcast_view(src, dst.shape()), dst);
}

void fill_(const Tensor& dst, double value) {
  internal::check_inplace("fill_", dst);
  backend_of(dst).fill(dst, value);
}
void zero_(const Tensor& dst) { fill_(dst, 0.0); }

double item(const Tensor& t) {
  TESSEL_CHECK(t.numel() == 1, InvalidArgument, "item() needs one element, got shape {}",
               shape_str(t.shape()));
  Tensor one = empty({}, DType::kF32);
  backend_of(t).copy(t.as_strided({}, {}, t.offset()), one);
  if (t.dtype() == DType::kI64 || t.dtype() == DType::kI32) return static_cast<double>(item_int(t));
  return static_cast<double>(*one.data<float>());
}

int64_t item_int(const Tensor& t) {
  TESSEL_CHECK(t.numel() == 1, InvalidArgument, "item() needs one element, got shape {}",
               shape_str(t.shape()));
  Tensor one = empty({}, DType::kI64);
  backend_of(t).copy(t.as_strided({}, {}, t.offset()), one);
  return *one.data<int64_t>();
}

}  // namespace tessel
