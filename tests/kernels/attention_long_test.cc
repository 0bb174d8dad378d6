// flash_cpu at S = 32,768 (B = H = 1, D = 64, f32): forward and backward run in memory linear in
// S (an S x S f32 matrix would need 4 GiB), and sampled rows match a direct f64 computation.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"

namespace tessel::kernels::attention {
namespace {

using testing::Buffer;
using testing::fill_normal;

// A field of /proc/self/status in KiB ("VmHWM", "VmRSS"); -1 when absent.
int64_t status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false when not permitted.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

TEST(FlashCpuLongTest, Seq32kForwardBackwardStaysLinearInMemory) {
  const int64_t S = 32768, D = 64;
  Buffer q(DType::kF32, 1, 1, S, D), k = q, v = q, dout = q, out = q, dq = q, dk = q, dv = q;
  fill_normal(q, 21);
  fill_normal(k, 22);
  fill_normal(v, 23);
  fill_normal(dout, 24);
  std::vector<float> lse(S);
  AttentionProblem p;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  const double scale = 1.0 / std::sqrt(double(D));

  const bool reset = reset_peak_rss();
  const int64_t rss_before = status_kib("VmRSS");
  const int64_t hwm_before = status_kib("VmHWM");
  ASSERT_GT(rss_before, 0) << "/proc/self/status has no VmRSS";
  flash_cpu_forward(p, out.view(), lse.data());
  flash_cpu_backward(p, out.view(), dout.view(), lse.data(), dq.view(), dk.view(), dv.view());
  const int64_t hwm_after = status_kib("VmHWM");
  // Without a reset the earlier peak may hide ours; the bound still holds for the larger one.
  const int64_t extra_mib =
      (hwm_after - (reset ? rss_before : std::min(rss_before, hwm_before))) / 1024;
  RecordProperty("peak_extra_mib", std::to_string(extra_mib));
  std::printf("peak extra memory: %lld MiB (an S x S f32 matrix: 4096 MiB)\n",
              static_cast<long long>(extra_mib));
  EXPECT_LT(extra_mib, 256);

  const auto qv = q.values(), kv = k.values(), vv = v.values(), gv = dout.values(),
             ov = out.values();
  auto dot = [&](const std::vector<float>& a, int64_t i, const std::vector<float>& b, int64_t j) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(a[i * D + d]) * b[j * D + d];
    return s;
  };
  // Forward rows and dq rows, directly in f64.
  for (int64_t i : {int64_t{0}, int64_t{12345}, S - 1}) {
    std::vector<double> s(S);
    double m = -INFINITY;
    for (int64_t j = 0; j < S; ++j) m = std::max(m, s[j] = dot(qv, i, kv, j) * scale);
    double l = 0;
    for (int64_t j = 0; j < S; ++j) l += (s[j] = std::exp(s[j] - m));
    EXPECT_NEAR(lse[i], m + std::log(l), 1e-4);
    std::vector<double> o(D, 0.0);
    for (int64_t j = 0; j < S; ++j) {
      for (int64_t d = 0; d < D; ++d) o[d] += s[j] / l * vv[j * D + d];
    }
    const double di = dot(gv, i, ov, i);
    std::vector<double> g(D, 0.0);
    for (int64_t j = 0; j < S; ++j) {
      const double ds = s[j] / l * (dot(gv, i, vv, j) - di);
      for (int64_t d = 0; d < D; ++d) g[d] += ds * kv[j * D + d] * scale;
    }
    for (int64_t d = 0; d < D; ++d) {
      ASSERT_NEAR(out.at(i * D + d), o[d], 1e-4) << "out row " << i;
      ASSERT_NEAR(dq.at(i * D + d), g[d], 1e-4) << "dq row " << i;
    }
  }
  // dk and dv rows use the (checked) lse and output for every query.
  for (int64_t j : {int64_t{7}, S - 2}) {
    std::vector<double> gk(D, 0.0), gv_(D, 0.0);
    for (int64_t i = 0; i < S; ++i) {
      const double pij = std::exp(dot(qv, i, kv, j) * scale - lse[i]);
      const double ds = pij * (dot(gv, i, vv, j) - dot(gv, i, ov, i));
      for (int64_t d = 0; d < D; ++d) {
        gv_[d] += pij * gv[i * D + d];
        gk[d] += ds * qv[i * D + d] * scale;
      }
    }
    for (int64_t d = 0; d < D; ++d) {
      ASSERT_NEAR(dv.at(j * D + d), gv_[d], 1e-3) << "dv row " << j;
      ASSERT_NEAR(dk.at(j * D + d), gk[d], 1e-3) << "dk row " << j;
    }
  }
}

}  // namespace
}  // namespace tessel::kernels::attention
