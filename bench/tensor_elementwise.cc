// Elementwise bandwidth: add and gelu through tessel vs memcpy of the same bytes.
// Bandwidth counts bytes read + written: add reads a and b and writes c (3 streams), gelu reads
// x and writes y (2 streams), memcpy reads and writes n bytes (2 streams). The threaded memcpy
// peer splits the copy over tessel's thread pool, like the ops do.
// A second table times each floating unary kernel and the row-wise softmax / cross-entropy
// kernels in ns per element on 1 Mi elements (cache-resident, so the math is what is timed),
// calling the backend directly into a preallocated output.
//
//   build/release/bench/tensor_elementwise [--mb 64] [--threads N]
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "bench_timer.h"
#include "tessel/tensor/backend.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

using namespace tessel;

namespace {

// ns per element of the floating unary kernels and of softmax / log_softmax / cross-entropy
// rows (1024 x 1024), f32 and bf16, each into a preallocated output.
void print_kernel_times() {
  constexpr int64_t kRows = 1024, kCols = 1024, kN = kRows * kCols;
  const std::pair<const char*, UnaryOp> unary_ops[] = {{"neg", UnaryOp::kNeg},
                                                       {"exp", UnaryOp::kExp},
                                                       {"log", UnaryOp::kLog},
                                                       {"sqrt", UnaryOp::kSqrt},
                                                       {"rsqrt", UnaryOp::kRsqrt},
                                                       {"tanh", UnaryOp::kTanh},
                                                       {"relu", UnaryOp::kRelu},
                                                       {"silu", UnaryOp::kSilu},
                                                       {"gelu", UnaryOp::kGelu},
                                                       {"abs", UnaryOp::kAbs},
                                                       {"gelu_tanh", UnaryOp::kGeluTanh},
                                                       {"sigmoid", UnaryOp::kSigmoid}};
  Backend& cpu = backend_for(Device::cpu());
  Generator gen(2);
  const Tensor x[2] = {randn({kRows, kCols}, gen), randn({kRows, kCols}, gen, DType::kBF16)};
  const Tensor out[2] = {empty({kRows, kCols}), empty({kRows, kCols}, DType::kBF16)};
  const Tensor target = arange(kRows), loss = empty({kRows}), lse = empty({kRows});
  std::printf("\nkernel time, %lld x %lld (ns per element; median of 7)\n",
              static_cast<long long>(kRows), static_cast<long long>(kCols));
  std::printf("%-14s %8s %8s\n", "kernel", "f32", "bf16");
  auto row = [&](const char* name, const std::function<void(int)>& run) {
    const double f32 = bench::median_seconds([&] { run(0); }) / kN * 1e9;
    const double bf16 = bench::median_seconds([&] { run(1); }) / kN * 1e9;
    std::printf("%-14s %8.3f %8.3f\n", name, f32, bf16);
  };
  for (const auto& [name, op] : unary_ops) {
    row(name, [&, op = op](int k) { cpu.unary(op, x[k], out[k]); });
  }
  row("softmax", [&](int k) { cpu.softmax(x[k], out[k], false); });
  row("log_softmax", [&](int k) { cpu.softmax(x[k], out[k], true); });
  row("cross_entropy", [&](int k) { cpu.cross_entropy(x[k], target, -100, loss, lse); });
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mb = 64;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mb") == 0 && i + 1 < argc) mb = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      set_num_threads(std::atoi(argv[++i]));
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
  print_kernel_times();
  return 0;
}
