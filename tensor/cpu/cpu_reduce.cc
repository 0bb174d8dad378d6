// CPU reductions (sum, avg, max, min, product, argmax) over any set of dims. The summation order
// depends only on the shape: rows are cut into fixed blocks of kBlock elements whose partial
// results are combined in order, so results are identical whatever the thread count.
#include <cmath>
#include <limits>
#include <numeric>

#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/cpu/cpu_loop.h"
#include "tessel/tensor/cpu/cpu_vector.h"
#include "tessel/tensor/internal/reduce_layout.h"

namespace tessel::cpu {
namespace {

constexpr int64_t kBlock = 4096;

template <typename C>
struct SumOp {
  static C init() { return C(0); }
  static C combine(C a, C b) { return a + b; }
};
template <typename C>
struct ProductOp {
  static C init() { return C(1); }
  static C combine(C a, C b) { return a * b; }
};
template <typename C>
struct MaxOp {
  static C init() {
    return std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                : std::numeric_limits<C>::lowest();
  }
  static C combine(C a, C b) { return (a != a || a >= b) ? a : b; }  // NaN propagates
};
template <typename C>
struct MinOp {
  static C init() {
    return std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                                : std::numeric_limits<C>::max();
  }
  static C combine(C a, C b) { return (a != a || a <= b) ? a : b; }
};

// Reduces n contiguous values with 16 independent lanes (vectorisable), then the lanes in order.
template <typename Op, typename T>
Compute<T> reduce_block(const T* x, int64_t n) {
  using C = Compute<T>;
  constexpr int kLanes = 16;
  C lanes[kLanes];
  for (C& l : lanes) l = Op::init();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] = Op::combine(lanes[j], convert<C>(x[i + j]));
  }
  C acc = Op::init();
  for (; i < n; ++i) acc = Op::combine(acc, convert<C>(x[i]));
  for (int j = 0; j < kLanes; ++j) acc = Op::combine(acc, lanes[j]);
  return acc;
}

// out[o] = reduce(x[o * R, (o + 1) * R)) for contiguous x.
// kAvg passes the reduced count as divisor; the others 1.
template <typename Op, typename T, typename Out>
void reduce_rows(const T* x, int64_t rows, int64_t r, Out* out, int64_t divisor) {
  using C = Compute<T>;
  const int64_t blocks = std::max<int64_t>((r + kBlock - 1) / kBlock, 1);
  std::vector<C> partial(static_cast<size_t>(rows * blocks));
  parallel_for(0, rows * blocks, std::max<int64_t>(1, kBlock / std::max<int64_t>(r, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t t = b; t < e; ++t) {
                   const int64_t row = t / blocks, blk = t % blocks;
                   const int64_t start = blk * kBlock;
                   const int64_t len = std::min(kBlock, r - start);
                   if constexpr (std::is_same_v<T, float> && std::is_same_v<Op, SumOp<float>>) {
                     partial[t] = sum_f32(x + row * r + start, len);  // same lane order, SIMD clone
                   } else {
                     partial[t] = reduce_block<Op>(x + row * r + start, len);
                   }
                 }
               });
  for (int64_t row = 0; row < rows; ++row) {
    C acc = Op::init();
    for (int64_t blk = 0; blk < blocks; ++blk) acc = Op::combine(acc, partial[row * blocks + blk]);
    out[row] = convert<Out>(divisor == 1 ? acc : acc / C(divisor));
  }
}

// out[j] = reduce_i x[i * cols + j] for contiguous x [r, cols] (reducing leading dims).
template <typename Op, typename T, typename Out>
void reduce_cols(const T* x, int64_t r, int64_t cols, Out* out, int64_t divisor) {
  using C = Compute<T>;
  parallel_for(0, cols, 256, [&](int64_t b, int64_t e) {
    std::vector<C> acc(static_cast<size_t>(e - b), Op::init());
    for (int64_t i = 0; i < r; ++i) {
      const T* row = x + i * cols;
      for (int64_t j = b; j < e; ++j) acc[j - b] = Op::combine(acc[j - b], convert<C>(row[j]));
    }
    for (int64_t j = b; j < e; ++j) {
      out[j] = convert<Out>(divisor == 1 ? acc[j - b] : acc[j - b] / C(divisor));
    }
  });
}

// First index of the largest value (NaN counts as largest) of n values with a stride.
template <typename T>
int64_t argmax_strided(const T* x, int64_t n, int64_t stride) {
  using C = Compute<T>;
  int64_t best = 0;
  C best_v = convert<C>(x[0]);
  for (int64_t i = 1; i < n && best_v == best_v; ++i) {
    const C v = convert<C>(x[i * stride]);
    if (v > best_v || v != v) {
      best = i;
      best_v = v;
    }
  }
  return best;
}

// x laid out so that the reduced dims form contiguous rows (rows == true: one row of r
// elements per output) or leading columns (rows == false: out[j] combines x[i * outputs + j]).
struct ReduceLayout {
  Tensor src;
  bool rows = true;
};

ReduceLayout reduce_layout(const Tensor& x, const std::vector<int64_t>& dims) {
  switch (internal::reduce_layout_of(x, dims)) {
    case internal::ReduceLayout::kRows:
      return {x, true};
    case internal::ReduceLayout::kColumns:
      return {x, false};
    case internal::ReduceLayout::kCopyToRows:
      break;
  }
  const Tensor view = internal::reduced_dims_last(x, dims);
  Tensor src = empty(view.shape(), x.dtype());
  cpu_backend().copy(view, src);
  return {src, true};
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims,
                        const Tensor& out) {
  const int64_t outputs = out.numel();
  const int64_t r = outputs == 0 ? 0 : x.numel() / outputs;
  if (outputs == 0) return;
  TESSEL_CHECK(r > 0 || op == ReduceOp::kSum || op == ReduceOp::kProduct, InvalidArgument,
               "cannot take the {} over an empty dimension of {}", reduce_op_name(op),
               shape_str(x.shape()));
  const ReduceLayout layout = reduce_layout(x, dims);
  dispatch_all(layout.src.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = Compute<T>;
    const T* px = static_cast<const T*>(layout.src.data_ptr());
    dispatch_all(out.dtype(), [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      Out* o = static_cast<Out*>(out.data_ptr());
      auto run = [&](auto op_tag) {
        using Op = typename decltype(op_tag)::type;
        const int64_t divisor = op == ReduceOp::kAvg ? r : 1;
        if (layout.rows) {
          reduce_rows<Op>(px, outputs, r, o, divisor);
        } else {
          reduce_cols<Op>(px, r, outputs, o, divisor);
        }
      };
      switch (op) {
        case ReduceOp::kSum:
          run(TypeTag<SumOp<C>>{});
          break;
        case ReduceOp::kAvg:
          run(TypeTag<SumOp<C>>{});
          break;
        case ReduceOp::kMax:
          run(TypeTag<MaxOp<C>>{});
          break;
        case ReduceOp::kMin:
          run(TypeTag<MinOp<C>>{});
          break;
        case ReduceOp::kProduct:
          run(TypeTag<ProductOp<C>>{});
          break;
      }
    });
  });
}

void CpuBackend::argmax(const Tensor& x, int64_t dim, const Tensor& out) {
  const int64_t outputs = out.numel();
  if (outputs == 0) return;
  const int64_t r = x.shape()[dim];
  TESSEL_CHECK(r > 0, InvalidArgument, "cannot take the argmax over an empty dimension of {}",
               shape_str(x.shape()));
  const ReduceLayout layout = reduce_layout(x, {dim});
  dispatch_all(layout.src.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(layout.src.data_ptr());
    int64_t* o = out.data<int64_t>();
    const int64_t stride = layout.rows ? 1 : outputs;
    parallel_for(0, outputs, std::max<int64_t>(1, kBlock / r), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        o[j] = argmax_strided(px + (layout.rows ? j * r : j), r, stride);
      }
    });
  });
}

}  // namespace tessel::cpu
