#pragma once
// The harness of backend_conformance_test: random problems for one backend kernel (random
// shapes, layouts and values, made on the CPU from a seed), double-precision references, and the
// comparison of a backend's results with them. Nothing here runs a tensor kernel: tensors are
// read and written through their raw memory, so a broken kernel cannot hide in the reference.
//
// A KernelCase makes a Problem (input tensors, output tensors the kernel writes, scalar
// parameters), runs one kernel of a Backend on it, and computes what the outputs must hold. The
// harness checks the CPU backend against the reference, and any other backend against both the
// reference and the CPU backend on the same problem.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tessel/tensor/backend.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/stream.h"

namespace tessel::testing {

using Rng = std::mt19937_64;

// ---- Raw element access -------------------------------------------------------------------------

// Address of element `flat` (row-major over t's shape) of the view t.
inline char* element_ptr(const Tensor& t, int64_t flat) {
  char* p = static_cast<char*>(t.data_ptr());
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.shape()[d];
    p += (flat % size) * t.strides()[d] * static_cast<int64_t>(t.element_size());
    flat /= size;
  }
  return p;
}

inline double read_at(const char* p, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return *reinterpret_cast<const float*>(p);
    case DType::kBF16:
      return static_cast<float>(*reinterpret_cast<const BFloat16*>(p));
    case DType::kF16:
      return static_cast<float>(*reinterpret_cast<const Half*>(p));
    case DType::kI64:
      return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case DType::kI32:
      return *reinterpret_cast<const int32_t*>(p);
    case DType::kBool:
      return *reinterpret_cast<const bool*>(p) ? 1.0 : 0.0;
  }
  return std::nan("");
}

// v as the kernels store it in dtype: floats round (through f32, as the kernels convert; inf
// past the f32 range), integers truncate, bool is v != 0.
inline double round_to(DType dtype, double v) {
  constexpr double kOverflow = 3.4028235677973366e38;  // FLT_MAX + half an ulp
  const float f = std::fabs(v) >= kOverflow ? std::copysign(INFINITY, static_cast<float>(v))
                                            : static_cast<float>(v);
  switch (dtype) {
    case DType::kF32:
      return f;
    case DType::kBF16:
      return static_cast<float>(BFloat16(f));
    case DType::kF16:
      return static_cast<float>(Half(f));
    case DType::kI64:
      return static_cast<double>(static_cast<int64_t>(v));
    case DType::kI32:
      return static_cast<int32_t>(v);
    case DType::kBool:
      return v != 0 ? 1.0 : 0.0;
  }
  return std::nan("");
}

inline void write_at(char* p, DType dtype, double v) {
  switch (dtype) {
    case DType::kF32:
      *reinterpret_cast<float*>(p) = static_cast<float>(round_to(dtype, v));
      return;
    case DType::kBF16:
      *reinterpret_cast<BFloat16*>(p) = BFloat16(static_cast<float>(v));
      return;
    case DType::kF16:
      *reinterpret_cast<Half*>(p) = Half(static_cast<float>(v));
      return;
    case DType::kI64:
      *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(v);
      return;
    case DType::kI32:
      *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v);
      return;
    case DType::kBool:
      *reinterpret_cast<bool*>(p) = v != 0;
      return;
  }
}

inline double read(const Tensor& t, int64_t flat) {
  return read_at(element_ptr(t, flat), t.dtype());
}
inline void write(const Tensor& t, int64_t flat, double v) {
  write_at(element_ptr(t, flat), t.dtype(), v);
}
// Every element of the view, row-major.
inline std::vector<double> read_all(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = read(t, i);
  return out;
}
// Index of element `flat` of `shape` in each dim.
inline std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

// ---- Random values, shapes and layouts ----------------------------------------------------------

using ValueFn = std::function<double(Rng&)>;

inline int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi) {  // in [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
inline bool coin(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }
inline ValueFn normal_values(double scale) {
  return [scale](Rng& rng) { return scale * std::normal_distribution<double>()(rng); };
}
inline ValueFn uniform_values(double lo, double hi) {
  return [lo, hi](Rng& rng) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
}
inline ValueFn integer_values(int64_t lo, int64_t hi) {
  return [lo, hi](Rng& rng) { return static_cast<double>(uniform_int(rng, lo, hi)); };
}
// `base`, with NaN, +inf and -inf each in about one value of 64.
inline ValueFn with_specials(ValueFn base) {
  return [base](Rng& rng) {
    switch (uniform_int(rng, 0, 63)) {
      case 0:
        return std::nan("");
      case 1:
        return double(INFINITY);
      case 2:
        return -double(INFINITY);
      default:
        return base(rng);
    }
  };
}
// Values that suit the dtype: integers in [-20, 20], bools, or normals of `scale`.
inline ValueFn values_for(DType dtype, double scale = 2.0) {
  if (dtype == DType::kBool) return integer_values(0, 1);
  if (!is_floating(dtype)) return integer_values(-20, 20);
  return normal_values(scale);
}

// A random shape of rank in [min_rank, max_rank]: sizes from a set with odd sizes, sizes past
// the 16-lane vector loops, 1 (for broadcasting) and, when allowed, 0 (empty tensors). About
// 1 in 8 shapes is large (up to `large` elements, past the kernels' parallel grains).
inline Shape random_shape(Rng& rng, int min_rank, int max_rank, bool allow_empty = true,
                          int64_t large = 70000) {
  static const int64_t kSizes[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 33};
  const int rank = static_cast<int>(uniform_int(rng, min_rank, max_rank));
  const bool big = rank > 0 && coin(rng, 0.125);
  for (;;) {
    Shape shape;
    for (int d = 0; d < rank; ++d) {
      shape.push_back(allow_empty && coin(rng, 0.04) ? 0 : kSizes[uniform_int(rng, 0, 11)]);
    }
    if (big && !shape.empty()) {
      const int64_t d = uniform_int(rng, 0, rank - 1);
      const int64_t rest =
          std::max<int64_t>(shape_numel(shape) / std::max<int64_t>(shape[d], 1), 1);
      if (shape[d] != 0) shape[d] = std::max<int64_t>(1, large / rest);
    }
    if (shape_numel(shape) <= 2 * large) return shape;
  }
}

// How a random view may be laid out.
struct Layout {
  bool permute = true;    // dims in a random memory order (transposed views)
  bool gaps = true;       // steps between elements and a leading offset (sliced views)
  bool broadcast = true;  // stride 0 on some dims (expanded views); never for outputs
};
inline constexpr Layout kContiguous{false, false, false};
inline constexpr Layout kAnyLayout{};
inline constexpr Layout kOutputLayout{true, true, false};

// A view of `shape` over fresh CPU storage laid out at random within `layout`. Every storage
// element, gaps included, holds a value from `values`. Contiguous views still sit after and
// before a few guard elements, so writes past either end are caught (check_untouched).
inline Tensor random_view(Rng& rng, const Shape& shape, DType dtype, Layout layout,
                          const ValueFn& values) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> order(rank);
  for (int64_t d = 0; d < rank; ++d) order[d] = d;
  if (layout.permute) std::shuffle(order.begin(), order.end(), rng);
  Strides strides(rank, 0);
  int64_t running = 1;
  for (int64_t k = rank - 1; k >= 0; --k) {  // order.back() is innermost in memory
    const int64_t d = order[k];
    if (layout.broadcast && shape[d] > 1 && coin(rng, 0.25)) continue;  // stride 0
    strides[d] = running * (layout.gaps && coin(rng, 0.3) ? 2 : 1);
    running = strides[d] * shape[d];
  }
  if (shape_numel(shape) == 0) running = 0;
  const int64_t guard = 3;
  const int64_t offset = guard + (layout.gaps ? uniform_int(rng, 0, 2) : 0);
  const Tensor base = empty({offset + running + guard}, dtype);
  for (int64_t i = 0; i < base.numel(); ++i) write(base, i, values(rng));
  return base.as_strided(shape, strides, offset);
}
inline Tensor random_view(Rng& rng, const Shape& shape, DType dtype, Layout layout) {
  return random_view(rng, shape, dtype, layout, values_for(dtype));
}

// Every element of t's storage, as bytes (to check later that a kernel wrote only its view).
inline std::vector<char> storage_bytes(const Tensor& t) {
  const char* p = static_cast<const char*>(t.storage().data());
  return std::vector<char>(p, p + t.storage().bytes());
}

// ---- Problems, references and cases -------------------------------------------------------------

// One kernel call's operands, made on the CPU. `in` are read-only inputs (any may be
// undefined); `out` are written by the kernel (outputs and in-place operands) and compared.
struct Problem {
  std::vector<Tensor> in = {};
  std::vector<Tensor> out = {};
  std::vector<int64_t> ints = {};  // integer parameters (dims, ignore_index, ...)
  std::vector<double> reals = {};  // real parameters (eps, fill value, ...)
};

// What one output must hold: values (from the same rounded inputs, in double precision) and,
// for inexact kernels, a per-element measure of the rounding error the computation may carry
// (empty: |value|). See expect_matches for the rule.
struct Expected {
  std::vector<double> value;
  std::vector<double> scale;
};

struct KernelCase {
  std::string name;
  std::function<Problem(Rng&, int iteration)> make;
  std::function<void(Backend&, const Problem&)> run;
  std::function<std::vector<Expected>(const Problem&)> reference;
  double eps = 0;  // 0: results must be exact
  int iterations = 24;
};

// How a result stored in dtype rounds: at most half an ulp relative (2^-24 for f32, 2^-8 for
// bf16, 2^-11 for f16; 0 for integers and bool), and the spacing of its smallest denormals.
struct Rounding {
  double rtol = 0;
  double denormal = 0;
};
inline Rounding rounding_of(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {std::ldexp(1.0, -24), std::ldexp(1.0, -149)};
    case DType::kBF16:
      return {std::ldexp(1.0, -8), std::ldexp(1.0, -133)};
    case DType::kF16:
      return {std::ldexp(1.0, -11), std::ldexp(1.0, -24)};
    default:
      return {};
  }
}

inline std::string describe_tensor(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{} {} strides {} offset {}", dtype_name(t.dtype()), shape_str(t.shape()),
                     shape_str(t.strides()), t.offset());
}
inline std::string describe(const Problem& p) {
  std::string s;
  for (size_t i = 0; i < p.in.size(); ++i)
    s += fmt::format("\n  in[{}]: {}", i, describe_tensor(p.in[i]));
  for (size_t i = 0; i < p.out.size(); ++i)
    s += fmt::format("\n  out[{}]: {}", i, describe_tensor(p.out[i]));
  if (!p.ints.empty()) s += "\n  ints: " + shape_str(p.ints);
  for (double r : p.reals) s += fmt::format("\n  real: {}", r);
  return s;
}

// Compares `got` (a CPU view) with `value`. An element passes when it equals the value or the
// value rounded to its dtype (NaN matches NaN; an overflow to inf or underflow to 0 in f16 is
// right). That is all an exact kernel (eps == 0) or an integer or bool result may do; otherwise
// an element also passes when
//   |got - value| <= factor * (rtol(dtype) |value| + eps * scale + denormal spacing(dtype)).
// Reports at most a few mismatches; returns whether all matched.
inline bool expect_matches(const Tensor& got, const std::vector<double>& value,
                           const std::vector<double>& scale, double eps, double factor,
                           const std::string& what) {
  if (static_cast<int64_t>(value.size()) != got.numel()) {
    ADD_FAILURE() << what << ": reference has " << value.size() << " values, output "
                  << got.numel();
    return false;
  }
  const DType dtype = got.dtype();
  const bool exact = eps == 0 || !is_floating(dtype);
  int reported = 0;
  for (int64_t i = 0; i < got.numel() && reported < 4; ++i) {
    const double g = read(got, i), w = value[i];
    const double rounded = round_to(dtype, w);
    if ((std::isnan(g) && std::isnan(w)) || g == w || g == rounded) continue;
    double tol = 0;
    if (!exact) {
      const double s = scale.empty() ? std::fabs(w) : scale[i];
      const Rounding r = rounding_of(dtype);
      tol = factor * (r.rtol * std::fabs(w) + eps * s + r.denormal);
      if (std::isfinite(g) && std::isfinite(w) && std::fabs(g - w) <= tol) continue;
    }
    ++reported;
    ADD_FAILURE() << what << ": element " << i << " (index " << shape_str(unravel(i, got.shape()))
                  << ") is " << g << ", expected " << w
                  << (exact ? std::string(" exactly") : fmt::format(" (tolerance {})", tol));
  }
  return reported == 0;
}

// Reports writes outside t's view: `before` is storage_bytes(t) before the kernel ran.
inline void check_untouched(const Tensor& t, const std::vector<char>& before,
                            const std::string& what) {
  const int64_t esize = static_cast<int64_t>(t.element_size());
  std::vector<bool> in_view(before.size() / esize, false);
  const char* base = static_cast<const char*>(t.storage().data());
  for (int64_t i = 0; i < t.numel(); ++i) in_view[(element_ptr(t, i) - base) / esize] = true;
  const std::vector<char> after = storage_bytes(t);
  for (size_t e = 0; e < in_view.size(); ++e) {
    if (!in_view[e] && std::memcmp(&before[e * esize], &after[e * esize], esize) != 0) {
      ADD_FAILURE() << what << ": storage element " << e << " outside the view was written";
      return;
    }
  }
}

// t (a view of CPU or device memory) with its whole storage copied to fresh memory on
// `device` (also when it is t's own device), as the same view.
inline Tensor transfer(const Tensor& t, Device device) {
  if (!t.defined()) return t;
  const int64_t elements = static_cast<int64_t>(t.storage().bytes() / t.element_size());
  const Tensor moved = empty({elements}, t.dtype(), device);
  copy_(moved, t.as_strided({elements}, {1}, 0));
  return moved.as_strided(t.shape(), t.strides(), t.offset());
}

inline Problem transfer(const Problem& p, Device device) {
  Problem q = p;
  for (Tensor& t : q.in) t = transfer(t, device);
  for (Tensor& t : q.out) t = transfer(t, device);
  return q;
}

// A seed that depends only on the case and the iteration, so a failure reruns identically.
inline uint64_t case_seed(const std::string& name, int iteration) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(iteration + 1);
}

// Calls check(problem, reference, description) for every iteration of the case, each problem
// made from its own seed; stops after the first iteration whose check returns false.
inline void for_each_problem(const KernelCase& c, const std::string& where,
                             const std::function<bool(const Problem&, const std::vector<Expected>&,
                                                      const std::string&)>& check) {
  for (int it = 0; it < c.iterations; ++it) {
    const uint64_t seed = case_seed(c.name, it);
    Rng rng(seed);
    const Problem p = c.make(rng, it);
    const std::string what =
        fmt::format("{}{} iteration {} (seed {:#x}){}", c.name, where, it, seed, describe(p));
    if (!check(p, c.reference(p), what)) return;  // one failing iteration says enough
  }
}

// The CPU backend against the case's reference, and no writes outside its outputs' views.
inline void check_cpu_backend(const KernelCase& c) {
  Backend& cpu = backend_for(Device::cpu());
  for_each_problem(
      c, "", [&](const Problem& p, const std::vector<Expected>& want, const std::string& what) {
        std::vector<std::vector<char>> before;
        for (const Tensor& t : p.out)
          before.push_back(t.defined() ? storage_bytes(t) : std::vector<char>());
        c.run(cpu, p);
        bool ok = true;
        for (size_t k = 0; k < p.out.size(); ++k) {
          if (!p.out[k].defined()) continue;  // an output not wanted this time
          const std::string out = fmt::format("{}\n  out[{}]", what, k);
          ok = expect_matches(p.out[k], want[k].value, want[k].scale, c.eps, 1, out) && ok;
          check_untouched(p.out[k], before[k], out);
        }
        return ok;
      });
}

// `device`'s backend against the reference and against the CPU backend on the same problem
// (within twice the tolerance: each is within it of the reference).
inline void check_device_backend(const KernelCase& c, Device device) {
  Backend& cpu = backend_for(Device::cpu());
  Backend& dev = backend_for(device);
  for_each_problem(
      c, " on " + device.str(),
      [&](const Problem& p, const std::vector<Expected>& want, const std::string& what) {
        const Problem q = transfer(p, device);
        c.run(cpu, p);
        c.run(dev, q);
        synchronize(device);
        bool ok = true;
        for (size_t k = 0; k < p.out.size(); ++k) {
          if (!p.out[k].defined()) continue;
          const Tensor got = transfer(q.out[k], Device::cpu());
          const std::string out = fmt::format("{}\n  out[{}]", what, k);
          ok = expect_matches(got, want[k].value, want[k].scale, c.eps, 1, out + " vs reference") &&
               ok;
          ok = expect_matches(got, read_all(p.out[k]), want[k].scale, c.eps, 2, out + " vs CPU") &&
               ok;
        }
        return ok;
      });
}

// ---- Helpers for making problems ----------------------------------------------------------------

inline const std::vector<DType> kAllDTypes = {DType::kF32, DType::kBF16, DType::kF16,
                                              DType::kI64, DType::kI32,  DType::kBool};
inline const std::vector<DType> kFloatDTypes = {DType::kF32, DType::kBF16, DType::kF16};
inline const std::vector<DType> kNumericDTypes = {DType::kF32, DType::kBF16, DType::kF16,
                                                  DType::kI64, DType::kI32};
inline const double kEps = std::ldexp(1.0, -24);  // f32 unit roundoff

// The dtype of iteration `it`: every dtype in turn, so each is covered.
inline DType pick(int it, const std::vector<DType>& dtypes) { return dtypes[it % dtypes.size()]; }
// A contiguous output with guard elements around it; its initial values are junk.
inline Tensor output(Rng& rng, const Shape& shape, DType dtype) {
  return random_view(rng, shape, dtype, kContiguous);
}
inline Tensor contiguous_input(Rng& rng, const Shape& shape, DType dtype, const ValueFn& values) {
  return random_view(rng, shape, dtype, kContiguous, values);
}
// A contiguous i64 tensor of `shape` holding `values` (row-major).
inline Tensor index_tensor(Rng& rng, const std::vector<int64_t>& values, const Shape& shape) {
  const Tensor t = output(rng, shape, DType::kI64);
  for (size_t i = 0; i < values.size(); ++i)
    write(t, static_cast<int64_t>(i), static_cast<double>(values[i]));
  return t;
}
inline Tensor index_tensor(Rng& rng, const std::vector<int64_t>& values) {
  return index_tensor(rng, values, {static_cast<int64_t>(values.size())});
}
// Rows and columns of a [..., C] shape (a scalar is one row of one).
inline std::pair<int64_t, int64_t> rows_cols(const Shape& shape) {
  const int64_t cols = shape.empty() ? 1 : shape.back();
  return {cols == 0 ? 0 : shape_numel(shape) / cols, cols};
}
inline std::pair<int64_t, int64_t> rows_cols(const Tensor& t) { return rows_cols(t.shape()); }
// |v| where v is finite, else 0: error scales are built from finite magnitudes only.
inline double mag(double v) { return std::isfinite(v) ? std::fabs(v) : 0.0; }

// ---- Case factories of backend_conformance_nn.cc ------------------------------------------------

KernelCase softmax_case(bool log);
KernelCase softmax_backward_case(bool log);
KernelCase norm_case(bool rms);  // layer_norm, or rms_norm
KernelCase norm_backward_case(bool rms);
KernelCase embedding_case();
KernelCase embedding_backward_case();
KernelCase cross_entropy_case();
KernelCase cross_entropy_backward_case();
KernelCase matmul_case();
KernelCase addmm_case();
KernelCase adamw_case();

// ---- Case factories of backend_conformance_llama.cc (kernels/llama/) --------------------------

KernelCase rope_case(bool backward);
KernelCase swiglu_case(bool backward);

// ---- Case factories of backend_conformance_moe.cc (kernels/moe/) ------------------------------

KernelCase grouped_matmul_case(bool backward);

}  // namespace tessel::testing
