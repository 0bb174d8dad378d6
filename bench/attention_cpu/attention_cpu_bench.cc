// bench/attention_cpu: TFLOP/s of flash_cpu beside the math backend (BLAS GEMMs with the score
// matrix materialized) and, when a Python with torch is given, PyTorch's CPU
// scaled_dot_product_attention, all on the same inputs in the same run.
//
//   attention_cpu [--seq 1024] [--dim 64,128] [--batch 1] [--heads 4] [--causal 0,1]
//                 [--dtype f32,bf16] [--iters 3] [--threads 0] [--torch /path/to/python]
//                 [--fma-flops-per-cycle 64] [--ghz <from /proc/cpuinfo>] [--math 1] [--backward 1]
//                 [--block-q 64] [--block-kv 64] [--min-time 0.3] [--rounds 3]
//                 [--isa auto|amx|avx512|avx2|scalar]
// (--math 0 skips the math backend, --backward 0 the backward passes, e.g. to profile.)
// Each figure is the median per-call time of >= --iters calls lasting >= --min-time seconds in
// all, taken in --rounds rounds that alternate the backends (so they share any other load
// alike) — PyTorch included: it runs in a child process that times its calls when told to,
// between ours — each round started once no other thread of the process, and no thread of the
// PyTorch child, burns CPU (OpenBLAS's and OpenMP's workers spin after each call); %peak is
// against the measured FMA rate. The header names the CPU's vector features, the kernels each
// dtype runs, PyTorch's version and CPU capability, and the load average before and after.
//
// Convention: forward flops 4 * B * H * S_q * S_k * D, halved when causal; backward 2.5x.

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../bench_host.h"
#include "tessel/kernels/attention/attention_math.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"

namespace {

using namespace tessel;
using namespace tessel::kernels::attention;
using namespace tessel::bench;

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}
std::vector<std::string> parse_words(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

double cpuinfo_ghz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) return std::stod(line.substr(line.find(':') + 1)) / 1000;
  }
  return 0;
}

// Measured f32 FMA throughput of one core: 12 independent 512-bit FMA chains. Returns GFLOP/s
// per wall second; *per_cpu_second gets GFLOP per second of this thread's CPU time.
__attribute__((target("avx512f"))) double measure_fma_gflops_one_core(double* per_cpu_second) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  const int64_t iters = 20'000'000;
  const double c0 = thread_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < iters; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *per_cpu_second = iters * 12.0 * 16 * 2 / (thread_cpu_seconds() - c0) / 1e9;
  float sink = 0, lanes[16];
  for (int i = 0; i < 12; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    sink += lanes[0];
  }
  if (sink == 12345.0f) std::puts("");
  return iters * 12.0 * 16 * 2 / s / 1e9;
}

struct Inputs {
  DType dtype;
  int64_t sizes[4];
  std::vector<float> f32[4];  // q, k, v, dout
  std::vector<uint16_t> bf16[4];
  std::vector<float> out32[4];  // out, dq, dk, dv
  std::vector<uint16_t> out16[4];

  Inputs(DType dt, int64_t b, int64_t h, int64_t s, int64_t d) : dtype(dt), sizes{b, h, s, d} {
    const auto n = static_cast<size_t>(b * h * s * d);
    std::mt19937 gen(42);
    std::normal_distribution<float> dist;
    for (int t = 0; t < 4; ++t) {
      f32[t].resize(n);
      for (auto& x : f32[t]) x = dist(gen);
      bf16[t].resize(n);
      for (size_t i = 0; i < n; ++i) bf16[t][i] = BFloat16::from_float(f32[t][i]);
      out32[t].assign(n, 0.0f);
      out16[t].assign(n, 0);
    }
  }
  AttentionView in(int t) {
    return dtype == DType::kF32 ? attention_view(f32[t].data(), dtype, sizes)
                                : attention_view(bf16[t].data(), dtype, sizes);
  }
  AttentionView out(int t) {
    return dtype == DType::kF32 ? attention_view(out32[t].data(), dtype, sizes)
                                : attention_view(out16[t].data(), dtype, sizes);
  }
  void dump_f32(const std::string& path) const {  // q, k, v, dout as f32
    std::ofstream f(path, std::ios::binary);
    for (int t = 0; t < 4; ++t) {
      f.write(reinterpret_cast<const char*>(f32[t].data()), f32[t].size() * sizeof(float));
    }
  }
};

// PyTorch's side: a child process that loads the inputs of one configuration when told to and
// times calls of F.scaled_dot_product_attention on request, one command per line on stdin, one
// answer per line on stdout (per-call seconds), so that its rounds alternate with ours.
const char* kTorchScript = R"PY(
import sys, time, torch
import torch.nn.functional as F
threads = int(sys.argv[1])
if threads > 0: torch.set_num_threads(threads)
print("ready", torch.__version__, torch.backends.cpu.get_cpu_capability(),
      torch.get_num_threads(), flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "load":
        path, b, h, s, d, causal, dtype = cmd[1:8]
        b, h, s, d = int(b), int(h), int(s), int(d)
        n = b * h * s * d
        data = torch.from_file(path, size=4 * n, dtype=torch.float32)
        dt = torch.float32 if dtype == "f32" else torch.bfloat16
        q, k, v, do = [data[i * n:(i + 1) * n].view(b, h, s, d).to(dt).clone() for i in range(4)]
        qg, kg, vg = [x.clone().requires_grad_() for x in (q, k, v)]
        causal = causal == "1"
        print("ok", flush=True)
    elif cmd[0] in ("fwd", "fb"):
        calls, min_seconds, warm = int(cmd[1]), float(cmd[2]), cmd[3] == "1"
        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        def fb():
            qg.grad = kg.grad = vg.grad = None
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do)
        fn = fwd if cmd[0] == "fwd" else fb
        if warm: fn()
        walls, cpus = [], []
        while len(walls) < calls or sum(walls) < min_seconds:
            t0, c0 = time.perf_counter(), time.process_time(); fn()
            walls.append(time.perf_counter() - t0); cpus.append(time.process_time() - c0)
        print(" ".join(f"{w!r}:{c!r}" for w, c in zip(walls, cpus)), flush=True)
    else:
        break
)PY";

// The PyTorch child process (see kTorchScript). Not thread-safe. The destructor ends it.
class TorchPeer {
 public:
  TorchPeer() = default;
  TorchPeer(const TorchPeer&) = delete;
  TorchPeer& operator=(const TorchPeer&) = delete;
  ~TorchPeer() { stop(); }

  // Starts `python` on the script; false when it cannot (no torch in that Python, say), with
  // the reason in *info; else *info = "<version> <cpu capability> <threads> threads".
  bool start(const std::string& python, int threads, std::string* info) {
    dir_ = "/tmp/tessel_attention_bench_" + std::to_string(getpid());
    std::system(("mkdir -p " + dir_).c_str());
    const std::string script = dir_ + "/sdpa.py";
    std::ofstream(script) << kTorchScript;
    std::string line;
    if (!child_.start(python, {script, std::to_string(threads)})) {
      return fail("fork or pipe failed", info);
    }
    if (!child_.read_line(&line) || line.rfind("ready ", 0) != 0) {
      return fail(python + " did not start torch (see its error above)", info);
    }
    *info = line.substr(6);
    return true;
  }

  pid_t pid() const { return child_.pid(); }

  // Loads the inputs of one configuration.
  bool load(const Inputs& in, bool causal, const std::string& dtype) {
    const std::string data = dir_ + "/inputs.bin";
    in.dump_f32(data);
    std::string line;
    return child_.ask("load " + data + " " + std::to_string(in.sizes[0]) + " " +
                          std::to_string(in.sizes[1]) + " " + std::to_string(in.sizes[2]) + " " +
                          std::to_string(in.sizes[3]) + " " + (causal ? "1" : "0") + " " + dtype,
                      &line) &&
           line == "ok";
  }

  // One round like time_round's: >= calls calls lasting >= min_seconds, after a warm-up call
  // the first time; appends the per-call wall and CPU seconds (of the whole child process).
  bool time_round(bool backward, int calls, double min_seconds, Calls& out) {
    const bool warm_up = !out.warm;
    out.warm = true;
    return child_.ask_times(std::string(backward ? "fb " : "fwd ") + std::to_string(calls) + " " +
                                std::to_string(min_seconds) + " " + (warm_up ? "1" : "0"),
                            out);
  }

 private:
  bool fail(const std::string& why, std::string* info) {
    *info = why;
    stop();
    return false;
  }
  void stop() {
    child_.stop();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
    dir_.clear();
  }

  PeerProcess child_;
  std::string dir_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string seqs = "1024", dims = "64,128", causals = "0,1", dtypes = "f32,bf16";
  std::string torch_python;
  int64_t batch = 1, heads = 4;
  int iters = 3, threads = 0;
  double min_seconds = 0.3;
  int rounds = 3;
  bool with_math = true, with_backward = true;
  int block_q = FlashCpuOptions{}.block_q, block_kv = FlashCpuOptions{}.block_kv;
  CpuIsa isa = CpuIsa::kAuto;
  double fma_per_cycle = 64, ghz = cpuinfo_ghz();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--seq")
      seqs = value;
    else if (flag == "--dim")
      dims = value;
    else if (flag == "--causal")
      causals = value;
    else if (flag == "--dtype")
      dtypes = value;
    else if (flag == "--batch")
      batch = std::stoll(value);
    else if (flag == "--heads")
      heads = std::stoll(value);
    else if (flag == "--iters")
      iters = std::stoi(value);
    else if (flag == "--min-time")
      min_seconds = std::stod(value);
    else if (flag == "--rounds")
      rounds = std::max(1, std::stoi(value));
    else if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--torch")
      torch_python = value;
    else if (flag == "--math")
      with_math = value != "0";
    else if (flag == "--backward")
      with_backward = value != "0";
    else if (flag == "--block-q")
      block_q = std::stoi(value);
    else if (flag == "--block-kv")
      block_kv = std::stoi(value);
    else if (flag == "--isa") {
      const CpuIsa all[] = {CpuIsa::kAuto, CpuIsa::kAmx, CpuIsa::kAvx512, CpuIsa::kAvx2,
                            CpuIsa::kScalar};
      const auto* it = std::find_if(std::begin(all), std::end(all),
                                    [&](CpuIsa x) { return cpu_isa_name(x) == value; });
      if (it == std::end(all)) {
        std::fprintf(stderr, "--isa %s: expected auto, amx, avx512, avx2 or scalar\n",
                     value.c_str());
        return 2;
      }
      isa = *it;
    } else if (flag == "--fma-flops-per-cycle")
      fma_per_cycle = std::stod(value);
    else if (flag == "--ghz")
      ghz = std::stod(value);
    else {
      std::fprintf(stderr, "unknown flag %s (see the comment at the top of the source)\n",
                   flag.c_str());
      return 2;
    }
  }
  const int cores = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  const std::string isa_name(cpu_isa_name(isa == CpuIsa::kAuto ? detect_cpu_isa() : isa));
  std::printf(
      "CPU: %d threads, isa %s, %.2f GHz (cpuinfo), nominal f32 FMA peak = %d x %.2f GHz x %.0f "
      "flop/cycle = %.1f GFLOP/s\n",
      cores, isa_name.c_str(), ghz, cores, ghz, fma_per_cycle, cores * ghz * fma_per_cycle);
  double fma_per_cpu_second = ghz * fma_per_cycle;  // GFLOP per CPU-second of one core
  if (cpu_isa_supported(CpuIsa::kAvx512)) {
    const double one = measure_fma_gflops_one_core(&fma_per_cpu_second);
    std::printf(
        "measured AVX-512 FMA loop, one core: %.1f GFLOP/s wall, %.1f GFLOP per CPU-second "
        "(= %.2f GHz x %.0f flop/cycle)\n",
        one, fma_per_cpu_second, fma_per_cpu_second / fma_per_cycle, fma_per_cycle);
  }
  // The peak the cores deliver when they run (boost included), not the nominal clock's.
  const double peak = cores * fma_per_cpu_second;  // GFLOP/s
  std::printf(
      "measured peak = %d x %.1f = %.1f GFLOP/s; each figure: median per call over %d "
      "alternating rounds (>= %d calls, >= %.2f s in all, after a warm-up call)\n",
      cores, fma_per_cpu_second, peak, rounds, iters, min_seconds);
  const FlashCpuOptions shown{.isa = isa, .block_q = block_q, .block_kv = block_kv};
  const std::string features = bench::cpu_features(
      {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"});
  std::printf("CPU features: %s; AMX tiles usable: %s\n", features.c_str(),
              cpu_isa_supported(CpuIsa::kAmx) ? "yes" : "no");
  std::printf("flash_cpu kernels: f32 %s, bf16 %s; load average %s\n",
              std::string(flash_cpu_kernel_name(DType::kF32, shown)).c_str(),
              std::string(flash_cpu_kernel_name(DType::kBF16, shown)).c_str(),
              bench::load_average().c_str());
  TorchPeer torch;
  bool with_torch = false;
  if (torch_python.empty()) {
    std::printf("torch: not given (--torch PYTHON)\n");
  } else {
    std::string info;
    with_torch = torch.start(torch_python, threads, &info);
    std::printf("torch: %s: %s%s\n", torch_python.c_str(), with_torch ? "" : "skipped: ",
                with_torch ? ("version, CPU capability, threads: " + info).c_str() : info.c_str());
  }
  std::printf("\n%-5s %6s %4s %6s | %9s %9s %9s %6s %6s %6s %6s | %9s %9s %9s %6s %6s %6s\n",
              "dtype", "S", "D", "causal", "fwd flash", "fwd math", "fwd torch", "x math",
              "x torch", "%peak", "%busy", "f+b flash", "f+b math", "f+b torch", "x math",
              "x torch", "%busy");
  std::printf(
      "%-5s %6s %4s %6s | %9s %9s %9s %6s %7s %6s %6s | %9s %9s %9s %6s %6s %6s | %s | %s\n", "",
      "", "", "", "", "", "", "", "", "", "", "", "", "", "", "", "", "x torch per CPU-s: fwd f+b",
      "fwd ms: min median max (calls)");
  for (const std::string& dtype : parse_words(dtypes)) {
    for (int64_t s : parse_list(seqs)) {
      for (int64_t d : parse_list(dims)) {
        for (int64_t causal : parse_list(causals)) {
          Inputs in(dtype == "bf16" ? DType::kBF16 : DType::kF32, batch, heads, s, d);
          AttentionProblem p;
          p.q = in.in(0);
          p.k = in.in(1);
          p.v = in.in(2);
          p.mask.causal = causal != 0;
          std::vector<float> lse(batch * heads * s);
          const FlashCpuOptions fo{
              .isa = isa, .threads = threads, .block_q = block_q, .block_kv = block_kv};
          const double fwd_flops = 4.0 * batch * heads * s * s * d * (causal ? 0.5 : 1.0);
          const double both_flops = fwd_flops * 3.5;
          auto flash_fwd = [&] { flash_cpu_forward(p, in.out(0), lse.data(), fo); };
          auto flash_both = [&] {
            flash_fwd();
            flash_cpu_backward(p, in.out(0), in.in(3), lse.data(), in.out(1), in.out(2), in.out(3),
                               fo);
          };
          auto math_fwd = [&] { math_attention_forward(p, in.out(0), lse.data()); };
          auto math_both = [&] {
            math_fwd();
            math_attention_backward(p, in.in(3), in.out(1), in.out(2), in.out(3));
          };
          // Alternating rounds, so that every backend sees the same share of whatever else
          // runs on the machine and the ratios compare like with like.
          Calls c_flash_f, c_flash_fb, c_math_f, c_math_fb, c_torch_f, c_torch_fb;
          const int per_round = std::max(1, (iters + rounds - 1) / rounds);
          bool torch_ok = with_torch && torch.load(in, causal != 0, dtype);
          for (int r = 0; r < rounds; ++r) {
            const double round_seconds = min_seconds / rounds;
            // Every round waits for PyTorch's OpenMP team too, which spins after its calls.
            const pid_t peer = with_torch ? torch.pid() : 0;
            time_round(per_round, round_seconds, flash_fwd, c_flash_f, peer);
            if (with_backward) time_round(per_round, round_seconds, flash_both, c_flash_fb, peer);
            if (with_math) time_round(per_round, round_seconds, math_fwd, c_math_f, peer);
            if (with_math && with_backward) {
              time_round(per_round, round_seconds, math_both, c_math_fb, peer);
            }
            if (torch_ok) torch_ok = torch.time_round(false, per_round, round_seconds, c_torch_f);
            if (torch_ok && with_backward) {
              torch_ok = torch.time_round(true, per_round, round_seconds, c_torch_fb);
            }
          }
          const Timing flash_f = summarize(c_flash_f), flash_fb = summarize(c_flash_fb);
          const double tf = flash_f.wall, tfb = flash_fb.wall;
          const double tm = summarize(c_math_f).wall, tmb = summarize(c_math_fb).wall;
          const Timing torch_f = summarize(c_torch_f), torch_fb = summarize(c_torch_fb);
          const double tt = torch_ok ? torch_f.wall : NAN;
          const double ttb = torch_ok ? torch_fb.wall : NAN;
          auto tflops = [](double flops, double sec) { return flops / sec / 1e12; };
          std::printf(
              "%-5s %6lld %4lld %6s | %9.3f %9.3f %9.3f %6.2f %7.2f %5.1f%% %5.1f%% | "
              "%9.3f %9.3f %9.3f %6.2f %6.2f %5.1f%% | %12.2f %6.2f | %.2f %.2f %.2f (%d)\n",
              dtype.c_str(), static_cast<long long>(s), static_cast<long long>(d),
              causal ? "yes" : "no", tflops(fwd_flops, tf), tflops(fwd_flops, tm),
              tflops(fwd_flops, tt), tm / tf, tt / tf, 100.0 * fwd_flops / tf / 1e9 / peak,
              100.0 * fwd_flops / flash_f.cpu / 1e9 / fma_per_cpu_second, tflops(both_flops, tfb),
              tflops(both_flops, tmb), tflops(both_flops, ttb), tmb / tfb, ttb / tfb,
              100.0 * both_flops / flash_fb.cpu / 1e9 / fma_per_cpu_second,
              torch_ok ? torch_f.cpu / flash_f.cpu : NAN,
              torch_ok ? torch_fb.cpu / flash_fb.cpu : NAN, 1e3 * flash_f.wall_lo,
              1e3 * flash_f.wall, 1e3 * flash_f.wall_hi, flash_f.calls);
          std::fflush(stdout);
        }
      }
    }
  }
  std::printf("\nload average %s\n", bench::load_average().c_str());
  std::printf(
      "TFLOP/s columns; 'x math' / 'x torch' = that backend's time / flash time; "
      "%%peak = flash forward / measured peak (wall clock); %%busy = flash forward (or "
      "forward+backward) flops per CPU-second of the process / the FMA loop's flops per "
      "CPU-second (efficiency while running, insensitive to other load); 'x torch per "
      "CPU-s' = PyTorch's CPU seconds per call (its whole process) / ours: with --threads "
      "1 a comparison that other load hardly moves; with more threads OpenMP's "
      "spin-waits count against PyTorch.\n");
  return 0;
}
