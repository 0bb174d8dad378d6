// matmul through tessel vs the raw GEMM calls on the same shapes, f32 and bf16.
// Peers: a pre-built oneDNN matmul primitive (what tessel calls) run on its own OpenMP team, and
// OpenBLAS cblas_sgemm; for bf16 also the alternative of converting to f32 and calling sgemm
// (OpenBLAS 0.3.21 has no bf16 GEMM).
//
//   build/release/bench/tensor_matmul            # GPT-sized shapes, ~30 s
//   build/release/bench/tensor_matmul --full     # adds larger shapes
//   build/release/bench/tensor_matmul --threads 1 --rounds 15
//
// Each figure is the median over --rounds rounds that alternate tessel, raw oneDNN and the BLAS
// path (so all share whatever else runs on the machine alike); a round's sample of one of them
// is the mean of as many calls as last >= 30 ms. Between samples the bench sleeps 20 ms, longer
// than an OpenMP team spins after its calls. OpenBLAS's workers spin 2^28 cycles (~100 ms) by
// default, which took the second core from whichever contender ran next (tessel's 2-thread
// figures halved on random shapes), so the bench runs with OPENBLAS_THREAD_TIMEOUT=4,
// re-executing itself to set it (OpenBLAS reads it when it loads, before main). OpenMP's wait
// policy is left alone: a passive team sleeps between back-to-back calls and slows raw oneDNN.
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench_dnnl.h"
#include "bench_host.h"
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

// Median seconds per call of each function, over `rounds` rounds that run them in turn.
std::vector<double> alternate(const std::vector<std::function<void()>>& fns, int rounds) {
  using Clock = std::chrono::steady_clock;
  std::vector<int> calls(fns.size(), 1);
  for (size_t f = 0; f < fns.size(); ++f) {  // warm up, and size each sample to >= 30 ms
    fns[f]();
    for (;;) {
      const auto start = Clock::now();
      for (int i = 0; i < calls[f]; ++i) fns[f]();
      if (Clock::now() - start >= std::chrono::milliseconds(30) || calls[f] >= (1 << 20)) break;
      calls[f] *= 2;
    }
  }
  std::vector<std::vector<double>> samples(fns.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t f = 0; f < fns.size(); ++f) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto start = Clock::now();
      for (int i = 0; i < calls[f]; ++i) fns[f]();
      samples[f].push_back(std::chrono::duration<double>(Clock::now() - start).count() / calls[f]);
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) {
    std::sort(s.begin(), s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
    ::execv("/proc/self/exe", argv);  // returns only on failure: run as we are
  }
  bool full = false;
  int rounds = 9;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--full") == 0) full = true;
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      set_num_threads(std::atoi(argv[++i]));
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = std::max(1, std::atoi(argv[++i]));
  }
  const int threads = num_threads();
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  std::vector<GemmShape> shapes = {{512, 512, 512, false},
                                   {1024, 1024, 1024, false},
                                   {2048, 256, 768, true},
                                   {2048, 768, 256, true},
                                   {2048, 768, 3072, true}};
  if (full) shapes.push_back({4096, 4096, 4096, false});

  std::printf("tessel matmul vs raw GEMM, %d threads (GFLOP/s; median of %d alternating rounds)\n",
              threads, rounds);
  const std::string cpu =
      bench::cpu_features({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"});
  std::printf("CPU: %s; oneDNN %d.%d.%d, ISA %s; load average %s\n", cpu.c_str(),
              dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch,
              bench::dnnl_isa_name(), bench::load_average().c_str());
  std::printf("%-22s %-5s %10s %12s %8s %14s %16s\n", "M x K x N", "dtype", "tessel", "raw oneDNN",
              "ratio", "OpenBLAS sgemm", "bf16->f32+sgemm");
  for (const GemmShape& s : shapes) {
    Generator gen(1);
    const Tensor a32 = randn({s.m, s.k}, gen);
    const Tensor b32 = s.transpose_b ? randn({s.n, s.k}, gen) : randn({s.k, s.n}, gen);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const Tensor a = to(a32, dtype), bstore = to(b32, dtype);
      const Tensor b = s.transpose_b ? transpose(bstore, 0, 1) : bstore;
      Tensor c;  // tessel's result (reassigned each call)
      const Tensor raw_c = empty({s.m, s.n}, dtype);
      RawDnnl raw(
          s, dtype == DType::kF32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16,
          a.data_ptr(), bstore.data_ptr(), raw_c.data_ptr());
      std::vector<float> c32(static_cast<size_t>(s.m * s.n));
      const auto trans_b = s.transpose_b ? CblasTrans : CblasNoTrans;
      const int ldb = static_cast<int>(s.transpose_b ? s.k : s.n);
      std::function<void()> blas;
      if (dtype == DType::kF32) {
        blas = [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b, s.m, s.n, s.k, 1.0f, a.data<float>(),
                      s.k, bstore.data<float>(), ldb, 0.0f, c32.data(), s.n);
        };
      } else {
        // The alternative bf16 path: widen both operands to f32, sgemm, narrow the result.
        blas = [&] {
          const Tensor af = to(a, DType::kF32), bf = to(bstore, DType::kF32);
          Tensor cf = empty({s.m, s.n});
          cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b, s.m, s.n, s.k, 1.0f, af.data<float>(),
                      s.k, bf.data<float>(), ldb, 0.0f, cf.data<float>(), s.n);
          c = to(cf, DType::kBF16);
        };
      }
      const std::vector<double> t =
          alternate({[&] { c = matmul(a, b); }, [&] { raw.run(); }, blas}, rounds);
      const std::string name = std::to_string(s.m) + " x " + std::to_string(s.k) + " x " +
                               std::to_string(s.n) + (s.transpose_b ? " (B^T)" : "");
      std::printf("%-22s %-5s %10.1f %12.1f %7.2fx %14s %16s\n", name.c_str(),
                  std::string(dtype_name(dtype)).c_str(), gflops(s, t[0]), gflops(s, t[1]),
                  t[1] / t[0],
                  dtype == DType::kF32 ? std::to_string(int(gflops(s, t[2]))).c_str() : "-",
                  dtype == DType::kBF16 ? std::to_string(int(gflops(s, t[2]))).c_str() : "-");
      std::fflush(stdout);
    }
  }
  std::printf("ratio = raw oneDNN time / tessel time (target >= 0.95); load average %s\n",
              bench::load_average().c_str());
  return 0;
}
