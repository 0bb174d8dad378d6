// matmul through tessel vs the raw GEMM calls on the same shapes, f32 and bf16.
// Peers: a pre-built oneDNN matmul primitive (what tessel calls), OpenBLAS cblas_sgemm, and for
// bf16 the alternative of converting to f32 and calling sgemm (OpenBLAS 0.3.21 has no bf16 GEMM).
//
//   build/rel/bench/tensor_matmul            # GPT-sized shapes, ~20 s
//   build/rel/bench/tensor_matmul --full     # adds larger shapes
//   build/rel/bench/tensor_matmul --threads 1
#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <string>
#include <vector>

#include "bench_timer.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

using namespace tessel;

namespace {

struct GemmShape {
  int64_t m, k, n;
  bool transpose_b;  // b given as [N, K] (a Linear layer's weight)
};

// A oneDNN matmul primitive built once for the shape, executed repeatedly.
class RawDnnl {
 public:
  RawDnnl(const GemmShape& s, dnnl::memory::data_type dt, void* a, void* b, void* c) {
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc ad({s.m, s.k}, dt, tag::ab);
    const dnnl::memory::desc bd({s.k, s.n}, dt, s.transpose_b ? tag::ba : tag::ab);
    const dnnl::memory::desc cd({s.m, s.n}, dt, tag::ab);
    prim_ = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), engine_));
    args_ = {{DNNL_ARG_SRC, dnnl::memory(ad, engine_, a)},
             {DNNL_ARG_WEIGHTS, dnnl::memory(bd, engine_, b)},
             {DNNL_ARG_DST, dnnl::memory(cd, engine_, c)}};
  }
  void run() {
    omp_set_num_threads(num_threads());  // tessel's calls leave this thread's OpenMP count at 1
    prim_.execute(stream_, args_);
    stream_.wait();
  }

 private:
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  dnnl::matmul prim_;
  std::unordered_map<int, dnnl::memory> args_;
};

double gflops(const GemmShape& s, double seconds) { return 2.0 * s.m * s.n * s.k / seconds / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  bool full = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--full") == 0) full = true;
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) set_num_threads(std::atoi(argv[++i]));
  }
  const int threads = num_threads();
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  std::vector<GemmShape> shapes = {{512, 512, 512, false},   {1024, 1024, 1024, false},
                                   {2048, 256, 768, true},   {2048, 768, 256, true},
                                   {2048, 768, 3072, true}};
  if (full) shapes.push_back({4096, 4096, 4096, false});

  std::printf("tessel matmul vs raw GEMM, %d threads (GFLOP/s; median of 7)\n", threads);
  std::printf("%-22s %-5s %10s %12s %8s %14s %16s\n", "M x K x N", "dtype", "tessel",
              "raw oneDNN", "ratio", "OpenBLAS sgemm", "bf16->f32+sgemm");
  for (const GemmShape& s : shapes) {
    Generator gen(1);
    const Tensor a32 = randn({s.m, s.k}, gen);
    const Tensor b32 = s.transpose_b ? randn({s.n, s.k}, gen) : randn({s.k, s.n}, gen);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const Tensor a = to(a32, dtype), bstore = to(b32, dtype);
      const Tensor b = s.transpose_b ? transpose(bstore, 0, 1) : bstore;
      Tensor c;  // tessel's result (reassigned each call)
      const Tensor raw_c = empty({s.m, s.n}, dtype);
      RawDnnl raw(s, dtype == DType::kF32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16,
                  a.data_ptr(), bstore.data_ptr(), raw_c.data_ptr());
      const double t_tessel = bench::median_seconds([&] { c = matmul(a, b); });
      const double t_raw = bench::median_seconds([&] { raw.run(); });
      std::vector<float> c32(static_cast<size_t>(s.m * s.n));
      const auto trans_b = s.transpose_b ? CblasTrans : CblasNoTrans;
      const int ldb = static_cast<int>(s.transpose_b ? s.k : s.n);
      double t_blas = 0;
      if (dtype == DType::kF32) {
        t_blas = bench::median_seconds([&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b, s.m, s.n, s.k, 1.0f, a.data<float>(),
                      s.k, bstore.data<float>(), ldb, 0.0f, c32.data(), s.n);
        });
      } else {
        // The alternative bf16 path: widen both operands to f32, sgemm, narrow the result.
        t_blas = bench::median_seconds([&] {
          const Tensor af = to(a, DType::kF32), bf = to(bstore, DType::kF32);
          Tensor cf = empty({s.m, s.n});
          cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b, s.m, s.n, s.k, 1.0f, af.data<float>(),
                      s.k, bf.data<float>(), ldb, 0.0f, cf.data<float>(), s.n);
          c = to(cf, DType::kBF16);
        });
      }
      const std::string name = std::to_string(s.m) + " x " + std::to_string(s.k) + " x " +
                                std::to_string(s.n) + (s.transpose_b ? " (B^T)" : "");
      std::printf("%-22s %-5s %10.1f %12.1f %7.2fx %14s %16s\n", name.c_str(),
                  std::string(dtype_name(dtype)).c_str(), gflops(s, t_tessel), gflops(s, t_raw),
                  t_raw / t_tessel,
                  dtype == DType::kF32 ? std::to_string(int(gflops(s, t_blas))).c_str() : "-",
                  dtype == DType::kBF16 ? std::to_string(int(gflops(s, t_blas))).c_str() : "-");
    }
  }
  std::printf("ratio = raw oneDNN time / tessel time (target >= 0.95)\n");
  return 0;
}
