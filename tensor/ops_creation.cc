// Creation, conversion and copies; dtype promotion and broadcasting rules.
#include <cmath>

#include "tessel/tensor/autograd.h"
#include "tessel/tensor/cpu/cpu_backend.h"
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
                 "shapes {} and {} do not broadcast (dim {}: {} vs {})", shape_str(a), shape_str(b),
                 i, sa, sb);
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend_of(t).fill(t, value);
  return t;
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
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

namespace {

// Fills dst (contiguous) with draws at counter offsets base + (flat index in the global tensor)
// of each of its elements: rows of its box are contiguous runs of the global stream.
void fill_random_box(const Tensor& dst, const ShardInfo& box, RandomDistribution dist, double a,
                     double b, uint64_t seed, uint64_t base) {
  const int64_t rank = dst.dim();
  const Shape& g = box.global_shape;
  // Trailing dims the box covers whole merge with the first partial one into one run.
  int64_t split = rank;  // dims [split, rank) form one contiguous run
  int64_t run = 1;
  while (split > 0) {
    run *= dst.shape()[split - 1];
    --split;
    if (dst.shape()[split] != g[split]) break;
  }
  if (dst.numel() == 0) return;
  const Strides gstrides = contiguous_strides(g);
  const int64_t runs = dst.numel() / run;
  Tensor flat = reshape(dst, {runs, run});
  Shape index(static_cast<size_t>(split), 0);  // position of the run among dims [0, split)
  for (int64_t r = 0; r < runs; ++r) {
    int64_t start = 0;
    for (int64_t d = 0; d < rank; ++d) {
      const int64_t i = d < split ? index[d] : 0;
      start += (box.offset[d] + i) * gstrides[d];
    }
    backend_of(dst).random(select(flat, 0, r), dist, a, b, seed,
                           base + static_cast<uint64_t>(start));
    for (int64_t d = split - 1; d >= 0; --d) {  // next run, row-major
      if (++index[d] < dst.shape()[d]) break;
      index[d] = 0;
    }
  }
}

void random_fill_(const char* op, const Tensor& t, RandomDistribution dist, double a, double b,
                  Generator* gen) {
  internal::check_inplace(op, t);
  TESSEL_CHECK(is_floating(t.dtype()), InvalidArgument, "{}: {} is not floating", op, t.str());
  Generator& g = gen ? *gen : default_generator();
  const ShardInfo* box = t.shard_info();
  const uint64_t count = static_cast<uint64_t>(box ? shape_numel(box->global_shape) : t.numel());
  const uint64_t base = g.reserve(count);
  if (t.is_meta()) return;
  NoGradGuard no_grad;
  Tensor dst = t.is_contiguous() ? t : empty(t.shape(), t.dtype(), t.device());
  if (box) {
    fill_random_box(dst, *box, dist, a, b, g.seed(), base);
  } else {
    backend_of(dst).random(dst, dist, a, b, g.seed(), base);
  }
  if (dst.impl_ptr() != t.impl_ptr()) copy_(t, dst);
}

}  // namespace

void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  random_fill_("uniform_", t, RandomDistribution::kUniform, low, high, gen);
}

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  random_fill_("normal_", t, RandomDistribution::kNormal, mean, std, gen);
}

Tensor to(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), dtype, t.device());
  backend_of(t).copy(t, out);
  if (is_floating(dtype) && needs_grad({t})) {
    const DType from = t.dtype();
    record_op("to", {t}, {out},
              [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{to(g[0], from)}; });
  }
  return out;
}

namespace {

// The backend that performs a copy between two devices: the non-CPU side's (the CPU's when
// both are CPU tensors).
Backend& transfer_backend(Device a, Device b) { return backend_for(a.is_cpu() ? b : a); }

// Throws InvalidArgument naming the op when t is a meta tensor whose values would be read.
void check_readable(const char* op, const Tensor& t, Device target) {
  TESSEL_CHECK(!t.is_meta(), InvalidArgument,
               "{}: {} is on the meta device and holds no data to copy to {}; materialise it "
               "first (empty() on a real device, Module::to_empty)",
               op, t.str(), target.str());
}

// Copies contiguous src into contiguous dst of the same dtype on another device (or the same).
void copy_between(const Tensor& src, const Tensor& dst, bool non_blocking) {
  if (dst.is_meta() || src.numel() == 0) return;
  transfer_backend(src.device(), dst.device()).copy_device(src, dst, non_blocking);
}

}  // namespace

Tensor to(const Tensor& t, Device device, bool non_blocking) {
  if (t.device() == device) return t;
  check_device_available(device);
  check_readable("to", t, device);
  Tensor out;
  {
    NoGradGuard no_grad;
    const Tensor src = contiguous(t);
    out = empty(t.shape(), t.dtype(), device);
    copy_between(src, out, non_blocking);
  }
  if (needs_grad({t})) {
    const Device from = t.device();
    record_op("to", {t}, {out},
              [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{to(g[0], from)}; });
  }
  return out;
}

Tensor Tensor::to(Device device) const { return tessel::to(*this, device); }
Tensor Tensor::to(DType dtype) const { return tessel::to(*this, dtype); }

Tensor pin_memory(const Tensor& t) {
  TESSEL_CHECK(t.device().is_cpu(), InvalidArgument,
               "pin_memory: {} is not a CPU tensor (only host memory can be pinned)", t.str());
  if (t.is_pinned()) return t;
  Tensor out = empty_pinned(t.shape(), t.dtype());
  NoGradGuard no_grad;
  cpu::cpu_backend().copy(contiguous(t), out);
  return out;
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

void copy_(const Tensor& dst, const Tensor& src, bool non_blocking) {
  internal::check_inplace("copy_", dst);
  const Shape shape = broadcast_shapes(dst.shape(), src.shape());
  TESSEL_CHECK(shape == dst.shape(), InvalidArgument, "copy_: source {} does not broadcast to {}",
               shape_str(src.shape()), shape_str(dst.shape()));
  if (src.device() == dst.device()) {
    backend_of(dst).copy(internal::broadcast_view(src, dst.shape()), dst);
    return;
  }
  // Across devices: convert on the source's device, move contiguous bytes, then place them.
  check_device_available(dst.device());
  check_readable("copy_", src, dst.device());
  NoGradGuard no_grad;
  const Tensor moved = contiguous(to(src, dst.dtype()));
  if (dst.is_contiguous() && moved.shape() == dst.shape()) {
    copy_between(moved, dst, non_blocking);
    return;
  }
  Tensor staged = empty(moved.shape(), dst.dtype(), dst.device());
  copy_between(moved, staged, false);
  backend_of(dst).copy(internal::broadcast_view(staged, dst.shape()), dst);
}

void fill_(const Tensor& dst, double value) {
  internal::check_inplace("fill_", dst);
  backend_of(dst).fill(dst, value);
}
void zero_(const Tensor& dst) { fill_(dst, 0.0); }

namespace {
// The one element of t as a CPU tensor of `dtype` (a device-to-host copy, which waits for t).
Tensor element_on_host(const char* op, const Tensor& t, DType dtype) {
  TESSEL_CHECK(t.numel() == 1, InvalidArgument, "{}() needs one element, got shape {}", op,
               shape_str(t.shape()));
  check_readable(op, t, Device::cpu());
  NoGradGuard no_grad;
  return to(to(t.as_strided({}, {}, t.offset()), dtype), Device::cpu());
}
}  // namespace

double item(const Tensor& t) {
  if (t.dtype() == DType::kI64 || t.dtype() == DType::kI32) return static_cast<double>(item_int(t));
  return static_cast<double>(*element_on_host("item", t, DType::kF32).data<float>());
}

int64_t item_int(const Tensor& t) {
  return *element_on_host("item_int", t, DType::kI64).data<int64_t>();
}

}  // namespace tessel
