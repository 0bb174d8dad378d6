// CPU kernels: copy/convert, fill, arange, random, unary, binary and where.
#include <cmath>
#include <numbers>

#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/cpu/cpu_loop.h"
#include "tessel/tensor/cpu/cpu_math.h"
#include "tessel/tensor/random.h"

namespace tessel::cpu {

CpuBackend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

namespace {

// 16-bit floats are widened a tile at a time so the math loop runs (vectorised) on f32.
constexpr int64_t kTile = 256;
template <typename T>
inline constexpr bool kIsHalfFloat = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

// Applies out = f(x) elementwise with In/Out element types; f maps Compute<In> values.
template <typename In, typename Out, typename F>
void map1(const Tensor& x, const Tensor& out, F f) {
  for_each_strided<2>(out.shape(), {base_ptr(x), base_ptr(out)}, {&x.strides(), &out.strides()},
                      {sizeof(In), sizeof(Out)}, kElementwiseGrain,
                      [&](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> s) {
                        if constexpr (kIsHalfFloat<In>) {
                          if (s[0] == sizeof(In) && s[1] == sizeof(Out)) {
                            const In* xi = reinterpret_cast<const In*>(p[0]);
                            Out* o = reinterpret_cast<Out*>(p[1]);
                            float buf[kTile];
                            for (int64_t t = 0; t < n; t += kTile) {
                              const int64_t m = std::min(kTile, n - t);
                              for (int64_t i = 0; i < m; ++i) buf[i] = convert<float>(xi[t + i]);
                              for (int64_t i = 0; i < m; ++i) buf[i] = f(buf[i]);
                              for (int64_t i = 0; i < m; ++i) o[t + i] = convert<Out>(buf[i]);
                            }
                            return;
                          }
                        }
                        if (s[0] == sizeof(In) && s[1] == sizeof(Out)) {
                          const In* xi = reinterpret_cast<const In*>(p[0]);
                          Out* o = reinterpret_cast<Out*>(p[1]);
                          for (int64_t i = 0; i < n; ++i) {
                            o[i] = convert<Out>(f(convert<Compute<In>>(xi[i])));
                          }
                        } else {
                          for (int64_t i = 0; i < n; ++i) {
                            const In v = *reinterpret_cast<const In*>(p[0] + i * s[0]);
                            *reinterpret_cast<Out*>(p[1] + i * s[1]) =
                                convert<Out>(f(convert<Compute<In>>(v)));
                          }
                        }
                      });
}

template <typename In, typename Out, typename F>
void map2(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  for_each_strided<3>(
      out.shape(), {base_ptr(a), base_ptr(b), base_ptr(out)},
      {&a.strides(), &b.strides(), &out.strides()}, {sizeof(In), sizeof(In), sizeof(Out)},
      kElementwiseGrain, [&](std::array<char*, 3> p, int64_t n, std::array<int64_t, 3> s) {
        using C = Compute<In>;
        if constexpr (kIsHalfFloat<In>) {
          if (s[0] == sizeof(In) && (s[1] == sizeof(In) || s[1] == 0) && s[2] == sizeof(Out)) {
            const In* ai = reinterpret_cast<const In*>(p[0]);
            const In* bi = reinterpret_cast<const In*>(p[1]);
            const int64_t bstep = s[1] == 0 ? 0 : 1;
            Out* o = reinterpret_cast<Out*>(p[2]);
            float abuf[kTile], bbuf[kTile];
            for (int64_t t = 0; t < n; t += kTile) {
              const int64_t m = std::min(kTile, n - t);
              for (int64_t i = 0; i < m; ++i) abuf[i] = convert<float>(ai[t + i]);
              if (bstep == 0) {
                const float bv = convert<float>(bi[0]);
                for (int64_t i = 0; i < m; ++i) bbuf[i] = bv;
              } else {
                for (int64_t i = 0; i < m; ++i) bbuf[i] = convert<float>(bi[t + i]);
              }
              for (int64_t i = 0; i < m; ++i) abuf[i] = f(abuf[i], bbuf[i]);
              for (int64_t i = 0; i < m; ++i) o[t + i] = convert<Out>(abuf[i]);
            }
            return;
          }
        }
        if (s[0] == sizeof(In) && s[1] == sizeof(In) && s[2] == sizeof(Out)) {
          const In* ai = reinterpret_cast<const In*>(p[0]);
          const In* bi = reinterpret_cast<const In*>(p[1]);
          Out* o = reinterpret_cast<Out*>(p[2]);
          for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(f(convert<C>(ai[i]), convert<C>(bi[i])));
        } else if (s[0] == sizeof(In) && s[1] == 0 && s[2] == sizeof(Out)) {
          const In* ai = reinterpret_cast<const In*>(p[0]);
          const C bv = convert<C>(*reinterpret_cast<const In*>(p[1]));
          Out* o = reinterpret_cast<Out*>(p[2]);
          for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(f(convert<C>(ai[i]), bv));
        } else {
          for (int64_t i = 0; i < n; ++i) {
            const C av = convert<C>(*reinterpret_cast<const In*>(p[0] + i * s[0]));
            const C bv = convert<C>(*reinterpret_cast<const In*>(p[1] + i * s[1]));
            *reinterpret_cast<Out*>(p[2] + i * s[2]) = convert<Out>(f(av, bv));
          }
        }
      });
}

constexpr float kSqrt1_2 = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kGeluCoeff = 0.044715f;

inline float gelu_tanh_inner(float x) { return kSqrt2OverPi * (x + kGeluCoeff * x * x * x); }
inline float sigmoid(float x) { return fast_sigmoid(x); }

template <typename T>
void unary_float(UnaryOp op, const Tensor& x, const Tensor& out) {
  switch (op) {
    case UnaryOp::kNeg: return map1<T, T>(x, out, [](float v) { return -v; });
    case UnaryOp::kExp: return map1<T, T>(x, out, [](float v) { return fast_exp(v); });
    case UnaryOp::kLog: return map1<T, T>(x, out, [](float v) { return std::log(v); });
    case UnaryOp::kSqrt: return map1<T, T>(x, out, [](float v) { return std::sqrt(v); });
    case UnaryOp::kRsqrt: return map1<T, T>(x, out, [](float v) { return 1.0f / std::sqrt(v); });
    case UnaryOp::kTanh: return map1<T, T>(x, out, [](float v) { return fast_tanh(v); });
    case UnaryOp::kRelu: return map1<T, T>(x, out, [](float v) { return v > 0.0f ? v : 0.0f; });
    case UnaryOp::kSilu: return map1<T, T>(x, out, [](float v) { return v * sigmoid(v); });
    case UnaryOp::kGelu:
      return map1<T, T>(x, out,
                        [](float v) { return 0.5f * v * (1.0f + fast_erf(v * kSqrt1_2)); });
    case UnaryOp::kGeluTanh:
      return map1<T, T>(
          x, out, [](float v) { return 0.5f * v * (1.0f + fast_tanh(gelu_tanh_inner(v))); });
    case UnaryOp::kAbs: return map1<T, T>(x, out, [](float v) { return std::fabs(v); });
    case UnaryOp::kSigmoid: return map1<T, T>(x, out, [](float v) { return sigmoid(v); });
    case UnaryOp::kLogicalNot:
      return map1<T, bool>(x, out, [](float v) { return static_cast<float>(v == 0.0f); });
  }
}

template <typename T>
void unary_int(UnaryOp op, const Tensor& x, const Tensor& out) {
  switch (op) {
    case UnaryOp::kNeg: return map1<T, T>(x, out, [](int64_t v) { return -v; });
    case UnaryOp::kAbs: return map1<T, T>(x, out, [](int64_t v) { return v < 0 ? -v : v; });
    case UnaryOp::kRelu: return map1<T, T>(x, out, [](int64_t v) { return v > 0 ? v : 0; });
    case UnaryOp::kLogicalNot:
      return map1<T, bool>(x, out, [](int64_t v) { return static_cast<int64_t>(v == 0); });
    default:
      throw InvalidArgument(fmt::format("unary op {} needs a floating-point tensor, got {}",
                                        static_cast<int>(op), dtype_name(x.dtype())));
  }
}

template <typename T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = Compute<T>;
  switch (op) {
    case BinaryOp::kAdd: return map2<T, T>(a, b, out, [](C x, C y) { return x + y; });
    case BinaryOp::kSub: return map2<T, T>(a, b, out, [](C x, C y) { return x - y; });
    case BinaryOp::kMul: return map2<T, T>(a, b, out, [](C x, C y) { return x * y; });
    case BinaryOp::kDiv:
      if constexpr (kIsFloat<T>) return map2<T, T>(a, b, out, [](C x, C y) { return x / y; });
      break;
    case BinaryOp::kPow:
      if constexpr (kIsFloat<T>) {
        return map2<T, T>(a, b, out, [](C x, C y) { return std::pow(x, y); });
      }
      break;
    case BinaryOp::kMaximum:
      return map2<T, T>(a, b, out, [](C x, C y) { return (x != x || x > y) ? x : y; });
    case BinaryOp::kMinimum:
      return map2<T, T>(a, b, out, [](C x, C y) { return (x != x || x < y) ? x : y; });
    case BinaryOp::kEq: return map2<T, bool>(a, b, out, [](C x, C y) { return C(x == y); });
    case BinaryOp::kNe: return map2<T, bool>(a, b, out, [](C x, C y) { return C(x != y); });
    case BinaryOp::kLt: return map2<T, bool>(a, b, out, [](C x, C y) { return C(x < y); });
    case BinaryOp::kLe: return map2<T, bool>(a, b, out, [](C x, C y) { return C(x <= y); });
    case BinaryOp::kGt: return map2<T, bool>(a, b, out, [](C x, C y) { return C(x > y); });
    case BinaryOp::kGe: return map2<T, bool>(a, b, out, [](C x, C y) { return C(x >= y); });
    case BinaryOp::kGeluBackward:
      if constexpr (kIsFloat<T>) {
        return map2<T, T>(a, b, out, [](float g, float x) {
          const float cdf = 0.5f * (1.0f + fast_erf(x * kSqrt1_2));
          return g * (cdf + x * kInvSqrt2Pi * fast_exp(-0.5f * x * x));
        });
      }
      break;
    case BinaryOp::kGeluTanhBackward:
      if constexpr (kIsFloat<T>) {
        return map2<T, T>(a, b, out, [](float g, float x) {
          const float t = fast_tanh(gelu_tanh_inner(x));
          const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
          return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
        });
      }
      break;
    case BinaryOp::kSiluBackward:
      if constexpr (kIsFloat<T>) {
        return map2<T, T>(a, b, out, [](float g, float x) {
          const float s = sigmoid(x);
          return g * s * (1.0f + x * (1.0f - s));
        });
      }
      break;
    case BinaryOp::kReluBackward:
      return map2<T, T>(a, b, out, [](C g, C x) { return x > C(0) ? g : C(0); });
  }
  throw InvalidArgument(fmt::format("binary op {} is not defined for dtype {}",
                                    static_cast<int>(op), dtype_name(a.dtype())));
}

}  // namespace

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  dispatch_all(src.dtype(), [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    dispatch_all(dst.dtype(), [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      for_each_strided<2>(dst.shape(), {base_ptr(src), base_ptr(dst)},
                          {&src.strides(), &dst.strides()}, {sizeof(In), sizeof(Out)},
                          kElementwiseGrain,
                          [](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> s) {
                            if (s[0] == sizeof(In) && s[1] == sizeof(Out)) {
                              const In* x = reinterpret_cast<const In*>(p[0]);
                              Out* o = reinterpret_cast<Out*>(p[1]);
                              for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(x[i]);
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
                          for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
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
          case RandomDistribution::kUniform: v = fa + (fb - fa) * philox_uniform(seed, index); break;
          case RandomDistribution::kNormal: v = fa + fb * philox_normal(seed, index); break;
          case RandomDistribution::kBernoulli: v = philox_uniform(seed, index) < fa ? fb : 0.0f; break;
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
      unary_float<T>(op, x, out);
    } else {
      unary_int<T>(op, x, out);
    }
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(a.dtype(), [&](auto tag) { binary_typed<typename decltype(tag)::type>(op, a, b, out); });
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
