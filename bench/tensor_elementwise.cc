// Elementwise bandwidth: add and gelu through tessel vs memcpy of the same bytes.
// Bandwidth counts bytes read + written: add reads a and b and writes c (3 streams), gelu reads
// x and writes y (2 streams), memcpy reads and writes n bytes (2 streams). The threaded memcpy
// peer splits the copy over tessel's thread pool, like the ops do.
//
//   build/rel/bench/tensor_elementwise [--mb 64] [--threads N]
#include <cstdio>
#include <cstring>
#include <string>

#include "bench_timer.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

using namespace tessel;

int main(int argc, char** argv) {
  int64_t mb = 64;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mb") == 0 && i + 1 < argc) mb = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) set_num_threads(std::atoi(argv[++i]));
  }
  std::printf("elementwise bandwidth, %lld MiB per f32 operand, %d threads (GB/s; median of 7)\n",
              static_cast<long long>(mb), num_threads());
  std::printf("%-6s %-6s %10s %14s %16s %10s\n", "op", "dtype", "tessel", "memcpy 1 thr",
              "memcpy threaded", "ratio");
  const int64_t n = mb * 1024 * 1024 / 4;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Generator gen(1);
    const Tensor a = randn({n}, gen, dtype), b = randn({n}, gen, dtype);
    Tensor out = empty({n}, dtype);
    const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
    char* src = static_cast<char*>(a.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    const double t_copy = bench::median_seconds([&] { std::memcpy(dst, src, bytes); });
    const double t_copy_mt = bench::median_seconds([&] {
      parallel_for(0, static_cast<int64_t>(bytes), 1 << 20, [&](int64_t lo, int64_t hi) {
        std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo));
      });
    });
    const double copy_bw = 2.0 * bytes / t_copy / 1e9, copy_mt_bw = 2.0 * bytes / t_copy_mt / 1e9;
    const double t_add = bench::median_seconds([&] { out = add(a, b); });
    const double t_gelu = bench::median_seconds([&] { out = gelu(a); });
    const double add_bw = 3.0 * bytes / t_add / 1e9, gelu_bw = 2.0 * bytes / t_gelu / 1e9;
    const std::string dt(dtype_name(dtype));
    std::printf("%-6s %-6s %10.1f %14.1f %16.1f %9.2fx\n", "add", dt.c_str(), add_bw, copy_bw,
                copy_mt_bw, add_bw / copy_mt_bw);
    std::printf("%-6s %-6s %10.1f %14.1f %16.1f %9.2fx\n", "gelu", dt.c_str(), gelu_bw, copy_bw,
                copy_mt_bw, gelu_bw / copy_mt_bw);
  }
  std::printf("ratio = tessel bandwidth / threaded memcpy bandwidth\n");
  return 0;
}
