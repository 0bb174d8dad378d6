// CPU matmul on oneDNN's matmul primitive (chosen over OpenBLAS by bench/tensor_matmul: faster
// for f32 on this class of CPU, and it has native bf16 kernels on avx512_bf16/AMX where OpenBLAS
// 0.3.21 has none). Primitives are cached per thread by shape, strides and dtype.
#include <omp.h>

#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <string>

#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/base/error.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::cpu {
namespace {

dnnl::memory::data_type to_dnnl(DType dtype) {
  switch (dtype) {
    case DType::kF32: return dnnl::memory::data_type::f32;
    case DType::kBF16: return dnnl::memory::data_type::bf16;
    default: break;
  }
  throw InvalidArgument(fmt::format("matmul kernel supports f32 and bf16, got {}",
                                    dtype_name(dtype)));
}

dnnl::memory::desc describe(const Tensor& t) {
  const dnnl::memory::dims dims(t.shape().begin(), t.shape().end());
  dnnl::memory::dims strides(t.strides().begin(), t.strides().end());
  // oneDNN wants a nonzero stride even on size-1 (broadcast) dims.
  for (size_t i = 0; i < strides.size(); ++i) {
    if (dims[i] == 1) strides[i] = 0;
  }
  return dnnl::memory::desc(dims, to_dnnl(t.dtype()), strides);
}

// The CPU engine, shared by every thread (engines are thread-safe). Never destroyed: the
// per-thread caches below belong to pool workers, which are joined during static destruction.
dnnl::engine& cpu_engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// Matmul primitives keyed by their descriptors, one cache per thread. A oneDNN primitive must
// run only on the thread that created it and never on two threads at once: its
// library-managed scratchpad (operand copies, kernel arguments) is per primitive, so two pool
// threads running one primitive on different row chunks overwrote each other's scratchpad and
// wrote wrong rows. Each thread therefore creates and runs its own primitives (oneDNN shares
// the JIT-compiled kernels between them through its own primitive cache).
// Not thread-safe: each thread uses its own through thread_matmul_cache().
class MatmulCache {
 public:
  dnnl::matmul get(const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                   const dnnl::memory::desc& c, const std::string& key) {
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    dnnl::matmul prim;
    {
      // oneDNN allows concurrent creation, but it initialises its globals (the primitive
      // cache and its lock) lazily inside the uninstrumented library, where ThreadSanitizer
      // cannot see the synchronisation and reports a race. Creation happens once per thread
      // and shape, so serialising it costs nothing in steady state.
      static std::mutex create_mu;
      std::lock_guard<std::mutex> lock(create_mu);
      prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), cpu_engine()));
    }
    if (cache_.size() > 4096) cache_.clear();
    cache_.emplace(key, prim);
    return prim;
  }

 private:
  std::map<std::string, dnnl::matmul> cache_;
};

MatmulCache& thread_matmul_cache() {
  thread_local MatmulCache cache;
  return cache;
}

std::string cache_key(const Tensor& a, const Tensor& b, const Tensor& out) {
  std::string key = std::string(dtype_name(a.dtype())) + dtype_name(out.dtype()).data();
  for (const Tensor* t : {&a, &b, &out}) {
    for (int64_t s : t->shape()) key += fmt::format(",{}", s);
    key += ';';
    for (int64_t s : t->strides()) key += fmt::format(",{}", s);
    key += '|';
  }
  return key;
}

}  // namespace

namespace {

void run_matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  try {
    const auto ad = describe(a), bd = describe(b), cd = describe(out);
    const dnnl::matmul prim = thread_matmul_cache().get(ad, bd, cd, cache_key(a, b, out));
    dnnl::engine& engine = cpu_engine();
    dnnl::memory am(ad, engine, a.data_ptr());
    dnnl::memory bm(bd, engine, b.data_ptr());
    dnnl::memory cm(cd, engine, out.data_ptr());
    dnnl::stream stream(engine);
    prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  } catch (const dnnl::error& e) {
    throw Internal(fmt::format("oneDNN matmul {} x {} -> {} failed: {} (status {})",
                               shape_str(a.shape()), shape_str(b.shape()),
                               shape_str(out.shape()), e.what(), static_cast<int>(e.status)));
  }
}

// t narrowed to [start, start + length) on dim d, unless it broadcasts there (size 1: every
// chunk uses its only index, also a chunk of length 1 that starts past 0).
Tensor narrow_unless_broadcast(const Tensor& t, int64_t d, int64_t start, int64_t length) {
  if (t.shape()[d] == 1) return t;
  Shape shape = t.shape();
  shape[d] = length;
  return t.as_strided(shape, t.strides(), t.offset() + start * t.strides()[d]);
}

// Rows of output per thread below which splitting does not pay.
constexpr int64_t kMinRowsPerThread = 32;

}  // namespace

// oneDNN runs single-threaded in each of tessel's pool threads, which split the work by the
// leading batch dim (or the rows of a 2-D product). Letting oneDNN start its own OpenMP team
// instead left that team spinning after every GEMM while the pool ran the next op, which made
// an MLP's forward + backward 3x slower on two cores.
void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  if (a.size(-1) == 0) {
    fill(out, 0.0);
    return;
  }
  const int64_t rank = out.dim();
  int64_t split_dim = 0;
  while (split_dim < rank - 2 && out.shape()[split_dim] == 1) ++split_dim;
  if (split_dim == rank - 2 &&
      out.shape()[rank - 2] < 2 * kMinRowsPerThread) {  // 2-D and too few rows to share
    split_dim = -1;
  }
  const int64_t extent = split_dim < 0 ? 1 : out.shape()[split_dim];
  const int64_t grain = split_dim == rank - 2 ? kMinRowsPerThread : 1;
  parallel_for(0, extent, grain, [&](int64_t begin, int64_t end) {
    omp_set_num_threads(1);
    if (split_dim < 0 || (begin == 0 && end == extent)) {
      run_matmul(a, b, out);
      return;
    }
    const int64_t len = end - begin;
    run_matmul(narrow_unless_broadcast(a, split_dim, begin, len),
               split_dim == rank - 2 ? b : narrow_unless_broadcast(b, split_dim, begin, len),
               out.as_strided([&] {
                 Shape s = out.shape();
                 s[split_dim] = len;
                 return s;
               }(), out.strides(), out.offset() + begin * out.strides()[split_dim]));
  });
}

}  // namespace tessel::cpu
