// Portable tile kernels: plain float arithmetic, for CPUs without AVX2 (compiled with the
// baseline flags).
#include <algorithm>
#include <cmath>

#define TESSEL_TILE_ISA scalar
#include "tessel/kernels/attention/cpu/internal/tile_ops_impl.h"

namespace tessel::kernels::attention::internal {
namespace scalar {
namespace {

struct Vec {
  using Reg = float;
  static constexpr int kWidth = 1;
  static Reg zero() { return 0.0f; }
  static Reg set1(float x) { return x; }
  static Reg load(const float* p) { return *p; }
  static void store(float* p, Reg x) { *p = x; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg sub(Reg a, Reg b) { return a - b; }
  static Reg max(Reg a, Reg b) { return std::max(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return a * b + c; }
  static Reg fmsub(Reg a, Reg b, Reg c) { return a * b - c; }
  static float reduce_add(Reg a) { return a; }
  static float reduce_max(Reg a) { return a; }
  static bool any_greater(Reg a, Reg b) { return a > b; }
  static Reg exp2(Reg x) { return std::exp2(x); }
};

}  // namespace
}  // namespace scalar

// 4 rows x 4 columns of scalar accumulators.
const TileOps& tile_ops_scalar() { return scalar::make_tile_ops<scalar::Vec, 4, 4>("scalar"); }

}  // namespace tessel::kernels::attention::internal
