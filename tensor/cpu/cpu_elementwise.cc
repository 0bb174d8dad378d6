// CPU kernels: copy/convert, fill, arange, random, unary, binary and where.
#include <cmath>
#include <numbers>

#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/cpu/cpu_loop.h"
#include "tessel/tensor/cpu/cpu_vector.h"
#include "tessel/tensor/random.h"

namespace tessel::cpu {

CpuBackend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

namespace {

// Applies out = f(x) elementwise with In/Out element types; f maps Compute<In> values.
template <typename In, typename Out, typename F>
void map1(const Tensor& x, const Tensor& out, F f) {
  for_each_strided<2>(out.shape(), {base_ptr(x), base_ptr(out)}, {&x.strides(), &out.strides()},
                      {sizeof(In), sizeof(Out)}, kElementwiseGrain,
                      [&](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> s) {
                        for (int64_t i = 0; i < n; ++i) {
                          const In v = *reinterpret_cast<const In*>(p[0] + i * s[0]);
                          *reinterpret_cast<Out*>(p[1] + i * s[1]) =
                              convert<Out>(f(convert<Compute<In>>(v)));
                        }
                      });
}

template <typename In, typename Out, typename F>
void map2(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  using C = Compute<In>;
  for_each_strided<3>(out.shape(), {base_ptr(a), base_ptr(b), base_ptr(out)},
                      {&a.strides(), &b.strides(), &out.strides()},
                      {sizeof(In), sizeof(In), sizeof(Out)}, kElementwiseGrain,
                      [&](std::array<char*, 3> p, int64_t n, std::array<int64_t, 3> s) {
                        for (int64_t i = 0; i < n; ++i) {
                          const C av = convert<C>(*reinterpret_cast<const In*>(p[0] + i * s[0]));
                          const C bv = convert<C>(*reinterpret_cast<const In*>(p[1] + i * s[1]));
                          *reinterpret_cast<Out*>(p[2] + i * s[2]) = convert<Out>(f(av, bv));
                        }
                      });
}

// m elements of T at src (byte stride) widened to f32, and back.
template <typename T>
void load_tile(const char* src, int64_t stride, float* buf, int64_t m) {
  if (stride == sizeof(T)) {
    const T* x = reinterpret_cast<const T*>(src);
    if constexpr (std::is_same_v<T, float>) {
      std::copy(x, x + m, buf);
    } else {
      widen(x, buf, m);
    }
  } else {
    for (int64_t i = 0; i < m; ++i)
      buf[i] = convert<float>(*reinterpret_cast<const T*>(src + i * stride));
  }
}
template <typename T>
void store_tile(const float* buf, char* dst, int64_t stride, int64_t m) {
  if (stride == sizeof(T)) {
    T* o = reinterpret_cast<T*>(dst);
    if constexpr (std::is_same_v<T, float>) {
      std::copy(buf, buf + m, o);
    } else {
      narrow(buf, o, m);
    }
  } else {
    for (int64_t i = 0; i < m; ++i) *reinterpret_cast<T*>(dst + i * stride) = convert<T>(buf[i]);
  }
}

// A floating unary op on any layout: contiguous f32 runs go straight to the vector kernel,
// everything else passes through f32 tiles.
template <typename T>
void unary_tiles(UnaryOp op, const Tensor& x, const Tensor& out) {
  for_each_strided<2>(out.shape(), {base_ptr(x), base_ptr(out)}, {&x.strides(), &out.strides()},
                      {sizeof(T), sizeof(T)}, kElementwiseGrain,
                      [&](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> s) {
                        if (std::is_same_v<T, float> && s[0] == 4 && s[1] == 4) {
                          unary_f32(op, reinterpret_cast<const float*>(p[0]),
                                    reinterpret_cast<float*>(p[1]), n);
                          return;
                        }
                        float buf[kTile];
                        for (int64_t t = 0; t < n; t += kTile) {
                          const int64_t m = std::min(kTile, n - t);
                          load_tile<T>(p[0] + t * s[0], s[0], buf, m);
                          unary_f32(op, buf, buf, m);
                          store_tile<T>(buf, p[1] + t * s[1], s[1], m);
                        }
                      });
}

// As unary_tiles for a binary op; a broadcast b (stride 0) stays one value.
template <typename T>
void binary_tiles(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  for_each_strided<3>(
      out.shape(), {base_ptr(a), base_ptr(b), base_ptr(out)},
      {&a.strides(), &b.strides(), &out.strides()}, {sizeof(T), sizeof(T), sizeof(T)},
      kElementwiseGrain, [&](std::array<char*, 3> p, int64_t n, std::array<int64_t, 3> s) {
        if (std::is_same_v<T, float> && s[0] == 4 && (s[1] == 4 || s[1] == 0) && s[2] == 4) {
          binary_f32(op, reinterpret_cast<const float*>(p[0]), reinterpret_cast<const float*>(p[1]),
                     s[1] == 0 ? 0 : 1, reinterpret_cast<float*>(p[2]), n);
          return;
        }
        float abuf[kTile], bbuf[kTile];
        const int64_t b_step = s[1] == 0 ? 0 : 1;
        if (b_step == 0) bbuf[0] = convert<float>(*reinterpret_cast<const T*>(p[1]));
        for (int64_t t = 0; t < n; t += kTile) {
          const int64_t m = std::min(kTile, n - t);
          load_tile<T>(p[0] + t * s[0], s[0], abuf, m);
          if (b_step != 0) load_tile<T>(p[1] + t * s[1], s[1], bbuf, m);
          binary_f32(op, abuf, bbuf, b_step, abuf, m);
          store_tile<T>(abuf, p[2] + t * s[2], s[2], m);
        }
      });
}

template <typename T>
void unary_int(UnaryOp op, const Tensor& x, const Tensor& out) {
  switch (op) {
    case UnaryOp::kNeg:
      return map1<T, T>(x, out, [](int64_t v) { return -v; });
    case UnaryOp::kAbs:
      return map1<T, T>(x, out, [](int64_t v) { return v < 0 ? -v : v; });
    case UnaryOp::kRelu:
      return map1<T, T>(x, out, [](int64_t v) { return v > 0 ? v : 0; });
    case UnaryOp::kLogicalNot:
      return map1<T, bool>(x, out, [](int64_t v) { return static_cast<int64_t>(v == 0); });
    default:
      throw InvalidArgument(fmt::format("unary op {} needs a floating-point tensor, got {}",
                                        static_cast<int>(op), dtype_name(x.dtype())));
  }
}

// Integer arithmetic and every comparison (floating arithmetic goes through binary_tiles).
template <typename T>
void binary_generic(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = Compute<T>;
  switch (op) {
    case BinaryOp::kAdd:
      return map2<T, T>(a, b, out, [](C x, C y) { return x + y; });
    case BinaryOp::kSub:
      return map2<T, T>(a, b, out, [](C x, C y) { return x - y; });
    case BinaryOp::kMul:
      return map2<T, T>(a, b, out, [](C x, C y) { return x * y; });
    case BinaryOp::kMaximum:
      return map2<T, T>(a, b, out, [](C x, C y) { return x > y ? x : y; });
    case BinaryOp::kMinimum:
      return map2<T, T>(a, b, out, [](C x, C y) { return x < y ? x : y; });
    case BinaryOp::kEq:
      return map2<T, bool>(a, b, out, [](C x, C y) { return C(x == y); });
    case BinaryOp::kNe:
      return map2<T, bool>(a, b, out, [](C x, C y) { return C(x != y); });
    case BinaryOp::kLt:
      return map2<T, bool>(a, b, out, [](C x, C y) { return C(x < y); });
    case BinaryOp::kLe:
      return map2<T, bool>(a, b, out, [](C x, C y) { return C(x <= y); });
    case BinaryOp::kGt:
      return map2<T, bool>(a, b, out, [](C x, C y) { return C(x > y); });
    case BinaryOp::kGe:
      return map2<T, bool>(a, b, out, [](C x, C y) { return C(x >= y); });
    default:
      break;
  }
  throw InvalidArgument(fmt::format("binary op {} is not defined for dtype {}",
                                    static_cast<int>(op), dtype_name(a.dtype())));
}

}  // namespace

void CpuBackend::copy_device(const Tensor& src, const Tensor& dst, bool) {
  TESSEL_CHECK(src.device().is_cpu() && dst.device().is_cpu(), Internal,
               "the CPU backend copies between CPU tensors only, not {} to {}", src.device().str(),
               dst.device().str());
  copy(src, dst);
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  dispatch_all(src.dtype(), [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    dispatch_all(dst.dtype(), [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      for_each_strided<2>(
          dst.shape(), {base_ptr(src), base_ptr(dst)}, {&src.strides(), &dst.strides()},
          {sizeof(In), sizeof(Out)}, kElementwiseGrain,
          [](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> s) {
            if (s[0] == sizeof(In) && s[1] == sizeof(Out)) {
              const In* x = reinterpret_cast<const In*>(p[0]);
              Out* o = reinterpret_cast<Out*>(p[1]);
              if constexpr (std::is_same_v<Out, float> &&
                            (std::is_same_v<In, BFloat16> || std::is_same_v<In, Half>)) {
                widen(x, o, n);
              } else if constexpr (std::is_same_v<In, float> &&
                                   (std::is_same_v<Out, BFloat16> || std::is_same_v<Out, Half>)) {
                narrow(x, o, n);
              } else {
                for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(x[i]);
              }
            } else {
              for (int64_t i = 0; i < n; ++i) {
                *reinterpret_cast<Out*>(p[1] + i * s[1]) =
                    convert<Out>(*reinterpret_cast<const In*>(p[0] + i * s[0]));
              }
            }
          });
    });
  });
}

void CpuBackend::fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = convert<T>(value);
    for_each_strided<1>(dst.shape(), {base_ptr(dst)}, {&dst.strides()}, {sizeof(T)},
                        kElementwiseGrain,
                        [v](std::array<char*, 1> p, int64_t n, std::array<int64_t, 1> s) {
                          for (int64_t i = 0; i < n; ++i)
                            *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
                        });
  });
}

void CpuBackend::arange(const Tensor& dst, double start, double step) {
  dispatch_all(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(dst.data_ptr());
    parallel_for(0, dst.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = convert<T>(start + static_cast<double>(i) * step);
    });
  });
}

void CpuBackend::random(const Tensor& dst, RandomDistribution dist, double a, double b,
                        uint64_t seed, uint64_t offset) {
  dispatch_floating(dst.dtype(), "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(dst.data_ptr());
    const float fa = static_cast<float>(a), fb = static_cast<float>(b);
    parallel_for(0, dst.numel(), 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t index = offset + static_cast<uint64_t>(i);
        float v = 0.0f;
        switch (dist) {
          case RandomDistribution::kUniform:
            v = fa + (fb - fa) * philox_uniform(seed, index);
            break;
          case RandomDistribution::kNormal:
            v = fa + fb * philox_normal(seed, index);
            break;
          case RandomDistribution::kBernoulli:
            v = philox_uniform(seed, index) < fa ? fb : 0.0f;
            break;
        }
        o[i] = convert<T>(v);
      }
    });
  });
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kIsFloat<T>) {
      if (op == UnaryOp::kLogicalNot) {
        map1<T, bool>(x, out, [](float v) { return static_cast<float>(v == 0.0f); });
      } else {
        unary_tiles<T>(op, x, out);
      }
    } else {
      unary_int<T>(op, x, out);
    }
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kIsFloat<T>) {
      if (binary_f32_supported(op)) return binary_tiles<T>(op, a, b, out);
    }
    binary_generic<T>(op, a, b, out);
  });
}

void CpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_strided<4>(out.shape(), {base_ptr(cond), base_ptr(a), base_ptr(b), base_ptr(out)},
                        {&cond.strides(), &a.strides(), &b.strides(), &out.strides()},
                        {1, sizeof(T), sizeof(T), sizeof(T)}, kElementwiseGrain,
                        [](std::array<char*, 4> p, int64_t n, std::array<int64_t, 4> s) {
                          for (int64_t i = 0; i < n; ++i) {
                            const bool c = *reinterpret_cast<const bool*>(p[0] + i * s[0]);
                            *reinterpret_cast<T*>(p[3] + i * s[3]) =
                                *reinterpret_cast<const T*>(p[c ? 1 : 2] + i * s[c ? 1 : 2]);
                          }
                        });
  });
}

}  // namespace tessel::cpu
