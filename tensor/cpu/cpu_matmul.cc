// CPU matmul on oneDNN's matmul primitive (chosen over OpenBLAS by bench/tensor_matmul: faster
// for f32 on this class of CPU, and it has native bf16 kernels on avx512_bf16/AMX where OpenBLAS
// 0.3.21 has none). Primitives are cached per thread by shape, strides and dtype, with their
// memory objects and argument map: a call sets three data handles and executes, allocating
// nothing (on AMX a 512^3 bf16 product takes about 0.2 ms, so microseconds of per-call
// overhead show).
#include <omp.h>

#include <dnnl.hpp>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::cpu {
namespace {

// Highest tensor rank the oneDNN matmul takes (its DNNL_MAX_NDIMS is 12).
constexpr int kMaxMatmulRank = 12;

dnnl::memory::data_type to_dnnl(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return dnnl::memory::data_type::f32;
    case DType::kBF16:
      return dnnl::memory::data_type::bf16;
    default:
      break;
  }
  throw InvalidArgument(
      fmt::format("matmul kernel supports f32 and bf16, got {}", dtype_name(dtype)));
}

// One operand of a product as oneDNN sees it: address, dims and strides (a view of a tensor,
// possibly a chunk of it).
struct Operand {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  int64_t dims[kMaxMatmulRank] = {};
  int64_t strides[kMaxMatmulRank] = {};
};

Operand operand_of(const Tensor& t) {
  TESSEL_CHECK(t.dim() <= kMaxMatmulRank, InvalidArgument,
               "matmul operand has {} dims; the CPU kernel takes at most {}", t.dim(),
               kMaxMatmulRank);
  Operand o;
  o.data = t.data_ptr();
  o.dtype = t.dtype();
  o.rank = static_cast<int>(t.dim());
  for (int d = 0; d < o.rank; ++d) {
    o.dims[d] = t.shape()[d];
    // oneDNN wants a zero stride on size-1 (broadcast) dims.
    o.strides[d] = o.dims[d] == 1 ? 0 : t.strides()[d];
  }
  return o;
}

// o narrowed to [start, start + length) on dim d, unless it broadcasts there (size 1).
// o narrowed to [start, start + length) on dim d, unless it broadcasts there (size 1: every
// chunk uses its only index, also a chunk of length 1 that starts past 0).
Operand narrow(Operand o, int d, int64_t start, int64_t length) {
  if (o.dims[d] == 1) return o;
  o.data =
      static_cast<char*>(o.data) + start * o.strides[d] * static_cast<int64_t>(dtype_size(o.dtype));
  o.dims[d] = length;
  if (length == 1) o.strides[d] = 0;
  return o;
}

dnnl::memory::desc describe(const Operand& o) {
  return dnnl::memory::desc(dnnl::memory::dims(o.dims, o.dims + o.rank), to_dnnl(o.dtype),
                            dnnl::memory::dims(o.strides, o.strides + o.rank));
}

// The CPU engine, shared by every thread (engines are thread-safe). Never destroyed: the
// per-thread caches below belong to pool workers, which are joined during static destruction.
dnnl::engine& cpu_engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// What identifies a product: dtypes, ranks, dims and strides of a, b and out.
using MatmulKey = std::vector<int64_t>;

struct MatmulKeyHash {
  size_t operator()(const MatmulKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t x : key) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// A primitive with its argument map; only the memories' data handles change per call, so a
// call allocates nothing.
struct CachedMatmul {
  dnnl::matmul prim;
  std::unordered_map<int, dnnl::memory> args;
};

// Matmul primitives keyed by their operands' layouts, one cache per thread. A oneDNN primitive
// must run only on the thread that created it and never on two threads at once: its
// library-managed scratchpad (operand copies, kernel arguments) is per primitive, so two pool
// threads running one primitive on different row chunks overwrote each other's scratchpad and
// wrote wrong rows. Each thread therefore creates and runs its own primitives (oneDNN shares
// the JIT-compiled kernels between them through its own primitive cache).
// Not thread-safe: each thread uses its own through thread_matmul_cache().
class MatmulCache {
 public:
  // The primitive for a x b (+ bias) -> out, with the operands' addresses set; created on
  // first use. bias is null for none.
  CachedMatmul& get(const Operand& a, const Operand& b, const Operand* bias, const Operand& out) {
    key_.clear();
    key_.push_back(bias != nullptr);
    for (const Operand* o : {&a, &b, bias, &out}) {
      if (o == nullptr) continue;
      key_.push_back(static_cast<int64_t>(o->dtype));
      key_.push_back(o->rank);
      key_.insert(key_.end(), o->dims, o->dims + o->rank);
      key_.insert(key_.end(), o->strides, o->strides + o->rank);
    }
    auto it = cache_.find(key_);
    if (it == cache_.end()) {
      if (cache_.size() > 4096) cache_.clear();
      it = cache_.emplace(key_, create(a, b, bias, out)).first;
    }
    CachedMatmul& m = it->second;
    m.args[DNNL_ARG_SRC].set_data_handle(a.data);
    m.args[DNNL_ARG_WEIGHTS].set_data_handle(b.data);
    if (bias != nullptr) m.args[DNNL_ARG_BIAS].set_data_handle(bias->data);
    m.args[DNNL_ARG_DST].set_data_handle(out.data);
    return m;
  }

  // This thread's stream on the CPU engine.
  dnnl::stream& stream() { return stream_; }

 private:
  static CachedMatmul create(const Operand& a, const Operand& b, const Operand* bias,
                             const Operand& out) {
    const auto ad = describe(a), bd = describe(b), cd = describe(out);
    const auto biasd = bias != nullptr ? describe(*bias) : dnnl::memory::desc();
    CachedMatmul m;
    {
      // oneDNN allows concurrent creation, but it initialises its globals (the primitive
      // cache and its lock) lazily inside the uninstrumented library, where ThreadSanitizer
      // cannot see the synchronisation and reports a race. Creation happens once per thread
      // and shape, so serialising it costs nothing in steady state.
      static std::mutex create_mu;
      std::lock_guard<std::mutex> lock(create_mu);
      const dnnl::matmul::desc desc =
          bias != nullptr ? dnnl::matmul::desc(ad, bd, biasd, cd) : dnnl::matmul::desc(ad, bd, cd);
      m.prim = dnnl::matmul(dnnl::matmul::primitive_desc(desc, cpu_engine()));
    }
    m.args = {{DNNL_ARG_SRC, dnnl::memory(ad, cpu_engine(), a.data)},
              {DNNL_ARG_WEIGHTS, dnnl::memory(bd, cpu_engine(), b.data)},
              {DNNL_ARG_DST, dnnl::memory(cd, cpu_engine(), out.data)}};
    if (bias != nullptr) m.args[DNNL_ARG_BIAS] = dnnl::memory(biasd, cpu_engine(), bias->data);
    return m;
  }

  MatmulKey key_;  // reused, so a lookup allocates nothing once it has grown
  std::unordered_map<MatmulKey, CachedMatmul, MatmulKeyHash> cache_;
  dnnl::stream stream_{cpu_engine()};
};

MatmulCache& thread_matmul_cache() {
  thread_local MatmulCache cache;
  return cache;
}

void run_matmul(const Operand& a, const Operand& b, const Operand* bias, const Operand& out) {
  try {
    MatmulCache& cache = thread_matmul_cache();
    CachedMatmul& m = cache.get(a, b, bias, out);
    m.prim.execute(cache.stream(), m.args);
    cache.stream().wait();
  } catch (const dnnl::error& e) {
    auto dims = [](const Operand& o) { return shape_str(Shape(o.dims, o.dims + o.rank)); };
    throw Internal(fmt::format("oneDNN matmul {} x {} -> {} failed: {} (status {})", dims(a),
                               dims(b), dims(out), e.what(), static_cast<int>(e.status)));
  }
}

// Rows of output per thread below which splitting does not pay.
constexpr int64_t kMinRowsPerThread = 32;

// oneDNN runs single-threaded in each of tessel's pool threads, which split the work by the
// leading batch dim (or the rows of a 2-D product). Letting oneDNN start its own OpenMP team
// instead left that team spinning after every GEMM while the pool ran the next op, which made
// an MLP's forward + backward 3x slower on two cores. bias (undefined for none) is [N],
// broadcast over every other dim.
void gemm(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out) {
  if (out.numel() == 0) return;
  const Operand oa = operand_of(a), ob = operand_of(b), oc = operand_of(out);
  const int rank = oc.rank;
  Operand obias;
  if (bias.defined()) {
    obias.data = bias.data_ptr();
    obias.dtype = bias.dtype();
    obias.rank = rank;
    for (int d = 0; d < rank; ++d) obias.dims[d] = 1;
    obias.dims[rank - 1] = oc.dims[rank - 1];
    obias.strides[rank - 1] = 1;
  }
  const Operand* pbias = bias.defined() ? &obias : nullptr;
  int split_dim = 0;
  while (split_dim < rank - 2 && oc.dims[split_dim] == 1) ++split_dim;
  if (split_dim == rank - 2 &&
      oc.dims[rank - 2] < 2 * kMinRowsPerThread) {  // 2-D and too few rows to share
    split_dim = -1;
  }
  const int64_t extent = split_dim < 0 ? 1 : oc.dims[split_dim];
  const int64_t grain = split_dim == rank - 2 ? kMinRowsPerThread : 1;
  parallel_for(0, extent, grain, [&](int64_t begin, int64_t end) {
    omp_set_num_threads(1);
    if (split_dim < 0 || (begin == 0 && end == extent)) {
      run_matmul(oa, ob, pbias, oc);
      return;
    }
    const int64_t len = end - begin;
    run_matmul(narrow(oa, split_dim, begin, len),
               split_dim == rank - 2 ? ob : narrow(ob, split_dim, begin, len), pbias,
               narrow(oc, split_dim, begin, len));
  });
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() != 0 && a.size(-1) == 0) {
    fill(out, 0.0);
    return;
  }
  gemm(a, b, Tensor(), out);
}

void CpuBackend::addmm(const Tensor& bias, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() != 0 && a.size(-1) == 0) {  // out = bias on every row
    copy(bias.as_strided(out.shape(), {0, 1}, bias.offset()), out);
    return;
  }
  gemm(a, b, bias, out);
}

}  // namespace tessel::cpu
