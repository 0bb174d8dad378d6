// The CUDA attention kernels' CTA code run on the CPU by the emulator (attention_cuda_emulator.h:
// host threads as CUDA threads, the PTX primitives' documented semantics): forward and backward
// against the math backend with f64 accumulation, over bf16 and f16, head dims 64 and 128 and
// padded ones, lengths 1, odd and spanning several blocks, GQA, and every mask kind. This checks
// the kernels' logic — fragment layouts, swizzles, the online softmax, masks, the pipeline's
// waits — without a GPU; it cannot check timing, occupancy or anything ptxas does.
//
// Also the math backend's CUDA bodies (one thread per element, so plain loops run them here).
//
// The kernel files are included here as C++: their CTA algorithms are plain templates over the
// primitives, and their __global__ kernels and launchers are compiled only by nvcc.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "attention_cuda_emulator.h"
#include "attention_test_util.h"
#include "tessel/kernels/attention/attention_dropout.h"
#include "tessel/kernels/attention/attention_math.h"
#include "tessel/kernels/attention/cuda/flash_cuda_backward.cu"
#include "tessel/kernels/attention/cuda/flash_cuda_forward.cu"
#include "tessel/kernels/attention/cuda/flash_cuda_plan.h"
#include "tessel/kernels/attention/cuda/math_cuda.cu"

namespace tessel::kernels::attention::cuda {
namespace {

using testing::MaskKind;

// A contiguous (B, H, S, D) host buffer of 16-bit floats (bf16 or f16 bits).
struct Half16 {
  DType dtype;
  int64_t sizes[4];
  std::vector<uint16_t> bits;

  Half16(DType dt, int64_t b, int64_t h, int64_t s, int64_t d)
      : dtype(dt), sizes{b, h, s, d}, bits(static_cast<size_t>(b * h * s * d)) {}
  int64_t numel() const { return static_cast<int64_t>(bits.size()); }
  float at(int64_t i) const {
    if (dtype == DType::kBF16) {
      BFloat16 x;
      x.bits = bits[i];
      return static_cast<float>(x);
    }
    Half x;
    x.bits = bits[i];
    return static_cast<float>(x);
  }
  void set(int64_t i, float v) {
    bits[i] = dtype == DType::kBF16 ? BFloat16(v).bits : Half(v).bits;
  }
  void fill_normal(uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t i = 0; i < numel(); ++i) set(i, dist(gen));
  }
  std::vector<float> values() const {
    std::vector<float> out(numel());
    for (int64_t i = 0; i < numel(); ++i) out[i] = at(i);
    return out;
  }
  AttentionView view() { return attention_view(bits.data(), dtype, sizes); }
  // The same values as f32 (exact), for the references.
  testing::Buffer f32() const {
    testing::Buffer out(DType::kF32, sizes[0], sizes[1], sizes[2], sizes[3]);
    out.f32 = values();
    return out;
  }
};

using Case = testing::KernelCase;
using testing::kernel_case_name;

std::vector<Case> empty_block_cases() {
  return {{DType::kBF16, 1, 2, 1, 300, 40, 64, MaskKind::kCausalBottomRight},
          {DType::kF16, 1, 1, 1, 300, 40, 128, MaskKind::kWindow},
          {DType::kBF16, 2, 1, 1, 260, 100, 64, MaskKind::kDocuments},
          {DType::kBF16, 1, 1, 1, 130, 0, 64, MaskKind::kNone}};
}

template <class T, bool kEpilogueBarrier = true>
void emulate_forward(const FlashParams& p, Elem elem) {
  const LaunchShape s = forward_launch_shape<T>(p);
  emulator::run_grid(s.grid, s.threads, s.smem_bytes, [&](int bx, int by, int bz, char* smem) {
    const int m_block = forward_query_block(bx, s.grid[0]);
    if (elem == Elem::kBf16) {
      flash_forward_cta<T, Elem::kBf16, kEpilogueBarrier>(p, m_block, by, bz, smem);
    } else {
      flash_forward_cta<T, Elem::kF16, kEpilogueBarrier>(p, m_block, by, bz, smem);
    }
  });
}

// The plan of a call over host memory, its mask arrays used in place.
FlashPlan host_plan(const AttentionProblem& problem) {
  FlashPlan plan = make_flash_plan(problem);
  const MaskPlan& m = plan.mask;
  set_mask_arrays(plan.params.mask, m, m.tiles.data(), m.bits.data(), m.prefix.data(),
                  m.q_docs.data(), m.kv_docs.data());
  return plan;
}

// Runs flash_cuda's forward on host memory through the emulator (kEpilogueBarrier false: the
// kernel with its epilogue barrier removed, for the test that the emulator notices).
template <bool kEpilogueBarrier = true>
void forward(const AttentionProblem& problem, Half16& out, std::vector<float>& lse) {
  FlashPlan plan = host_plan(problem);
  plan.params.out = device_view(out.view());
  plan.params.lse = lse.data();
  if (plan.params.q_len == 0) return;
  if (plan.kernel_head_dim == 64) {
    emulate_forward<ForwardD64, kEpilogueBarrier>(plan.params, plan.elem);
  } else {
    emulate_forward<ForwardD128, kEpilogueBarrier>(plan.params, plan.elem);
  }
}

template <class T, class Q, int kD>
void emulate_backward(const FlashParams& p, Elem elem) {
  const BackwardLaunch s = backward_launch_shape<T, Q, kD>(p);
  const bool bf16 = elem == Elem::kBf16;
  const int rows_grid[3] = {s.rows_grid, 1, 1};
  constexpr int kRowThreads = RowChunks<kD>::kThreads;
  if (p.q_len > 0) {
    emulator::run_grid(rows_grid, kRowThreads, 0, [&](int bx, int, int, char*) {
      bf16 ? backward_preprocess_cta<kD, Elem::kBf16>(p, bx)
           : backward_preprocess_cta<kD, Elem::kF16>(p, bx);
    });
  }
  if (p.kv_len > 0) {
    emulator::run_grid(s.dkdv_grid, T::kThreads, T::kSmemBytes,
                       [&](int bx, int by, int bz, char* smem) {
                         bf16 ? flash_backward_dkdv_cta<T, Elem::kBf16>(p, bx, by, bz, smem)
                              : flash_backward_dkdv_cta<T, Elem::kF16>(p, bx, by, bz, smem);
                       });
    if (s.reduce_rows_grid > 0) {
      const int reduce_grid[3] = {s.reduce_rows_grid, 1, 1};
      emulator::run_grid(reduce_grid, kRowThreads, 0, [&](int bx, int, int, char*) {
        bf16 ? backward_reduce_dkdv_cta<kD, Elem::kBf16>(p, bx)
             : backward_reduce_dkdv_cta<kD, Elem::kF16>(p, bx);
      });
    }
  }
  if (p.q_len == 0) return;
  if (p.dq_accum != nullptr) {
    emulator::run_grid(rows_grid, kRowThreads, 0, [&](int bx, int, int, char*) {
      bf16 ? backward_postprocess_cta<kD, Elem::kBf16>(p, bx)
           : backward_postprocess_cta<kD, Elem::kF16>(p, bx);
    });
  } else {
    emulator::run_grid(s.dq_grid, Q::kThreads, Q::kSmemBytes,
                       [&](int bx, int by, int bz, char* smem) {
                         const int m_block = s.dq_grid[0] - 1 - bx;
                         bf16 ? flash_backward_dq_cta<Q, Elem::kBf16>(p, m_block, by, bz, smem)
                              : flash_backward_dq_cta<Q, Elem::kF16>(p, m_block, by, bz, smem);
                       });
  }
}

// Runs flash_cuda's backward on host memory through the emulator. Under GQA/MQA the query heads
// of a group run in parallel with a dK/dV workspace as flash_cuda_backward sets it up, or
// (split_heads false) one CTA per key/value head walks them in turn.
void backward(const AttentionProblem& problem, Half16& out, Half16& dout, std::vector<float>& lse,
              Half16& dq, Half16& dk, Half16& dv, bool deterministic, bool split_heads = true) {
  FlashPlan plan = host_plan(problem);
  FlashParams& f = plan.params;
  f.out = device_view(out.view());
  f.dout = device_view(dout.view());
  f.dq = device_view(dq.view());
  f.dk = device_view(dk.view());
  f.dv = device_view(dv.view());
  f.lse = lse.data();
  std::vector<float> delta(std::max<size_t>(1, lse.size()), -7.0f);
  std::vector<float> dq_accum(std::max<size_t>(1, lse.size() * plan.kernel_head_dim), -7.0f);
  f.delta = delta.data();
  f.dq_accum = deterministic ? nullptr : dq_accum.data();
  // The workspace starts as NaN: a partial the kernels forget to write poisons the sums.
  const int64_t floats = split_heads ? flash_backward_dkdv_workspace_floats(plan) : 0;
  std::vector<float> dkdv_accum(static_cast<size_t>(floats), std::nanf(""));
  if (floats > 0) {
    f.dk_accum = dkdv_accum.data();
    f.dv_accum = f.dk_accum + floats / 2;
  }
  if (plan.kernel_head_dim == 64) {
    emulate_backward<BackwardD64, DqD64, 64>(f, plan.elem);
  } else {
    emulate_backward<BackwardD128, DqD128, 128>(f, plan.elem);
  }
}

class FlashCudaEmulatedTest : public ::testing::TestWithParam<Case> {};

// Random q, k, v and an output gradient for a case, and the problem over them with its mask.
struct Inputs {
  Half16 q, k, v, dout;
  AttentionProblem p;

  explicit Inputs(const Case& c)
      : q(c.dtype, c.b, c.hq, c.sq, c.d),
        k(c.dtype, c.b, c.hkv, c.sk, c.d),
        v(c.dtype, c.b, c.hkv, c.sk, c.d),
        dout(c.dtype, c.b, c.hq, c.sq, c.d) {
    q.fill_normal(1);
    k.fill_normal(2);
    v.fill_normal(3);
    dout.fill_normal(4);
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    testing::configure_mask(c.mask, c.b, c.sq, c.sk, p);
  }
};

TEST_P(FlashCudaEmulatedTest, ForwardMatchesMath) {
  const Case& c = GetParam();
  Inputs in(c);
  Half16 &q = in.q, &k = in.k, &v = in.v;
  const AttentionProblem& p = in.p;

  Half16 out(c.dtype, c.b, c.hq, c.sq, c.d);
  std::vector<float> lse(c.b * c.hq * c.sq, 12345.0f);
  forward(p, out, lse);

  // Reference on the same (exactly widened) inputs, f64 accumulation.
  testing::Buffer qf = q.f32(), kf = k.f32(), vf = v.f32();
  AttentionProblem rp = p;
  rp.q = qf.view();
  rp.k = kf.view();
  rp.v = vf.view();
  testing::Buffer ref(DType::kF32, c.b, c.hq, c.sq, c.d);
  std::vector<float> ref_lse(lse.size());
  math_attention_forward(rp, ref.view(), ref_lse.data(), {.f64_accumulate = true});

  // FlashAttention's rule for bf16: at most twice the error of plain bf16 attention (the math
  // backend rounding its intermediates to bf16). f16 has 3 more mantissa bits than bf16's
  // rounding steps leave: a fixed bound.
  double bound = 4e-3;
  if (c.dtype == DType::kBF16) {
    testing::Buffer m_out(DType::kBF16, c.b, c.hq, c.sq, c.d);
    math_attention_forward(p, m_out.view(), nullptr, {.round_intermediates = true});
    bound = 2 * testing::max_abs_diff(m_out.values(), ref.f32) + 1e-5;
  }
  EXPECT_LE(testing::max_abs_diff(out.values(), ref.f32), bound) << "out";
  EXPECT_LE(testing::max_abs_diff_inf(lse, ref_lse), 1e-3) << "lse";
}

class FlashCudaEmulatedBackwardTest
    : public ::testing::TestWithParam<std::tuple<Case, bool /*deterministic*/>> {};

// The f64 reference gradients of a case, and the bound each of dq, dk, dv must keep to it:
// FlashAttention's rule for bf16 (twice the error of the math backend with bf16
// intermediates), a fixed relative bound for f16.
struct ReferenceGradients {
  testing::Buffer dq, dk, dv;
  double bounds[3];

  ReferenceGradients(const Case& c, Inputs& in)
      : dq(DType::kF32, c.b, c.hq, c.sq, c.d), dk(DType::kF32, c.b, c.hkv, c.sk, c.d), dv(dk) {
    testing::Buffer qf = in.q.f32(), kf = in.k.f32(), vf = in.v.f32(), dof = in.dout.f32();
    AttentionProblem rp = in.p;
    rp.q = qf.view();
    rp.k = kf.view();
    rp.v = vf.view();
    math_attention_backward(rp, dof.view(), dq.view(), dk.view(), dv.view(),
                            {.f64_accumulate = true});
    const testing::Buffer* refs[] = {&dq, &dk, &dv};
    if (c.dtype == DType::kBF16) {
      testing::Buffer m_dq(DType::kBF16, c.b, c.hq, c.sq, c.d),
          m_dk(DType::kBF16, c.b, c.hkv, c.sk, c.d);
      testing::Buffer m_dv = m_dk;
      math_attention_backward(in.p, in.dout.view(), m_dq.view(), m_dk.view(), m_dv.view(),
                              {.round_intermediates = true});
      const testing::Buffer* maths[] = {&m_dq, &m_dk, &m_dv};
      for (int t = 0; t < 3; ++t) {
        bounds[t] = 2 * testing::max_abs_diff(maths[t]->values(), refs[t]->f32) + 1e-4;
      }
    } else {
      for (int t = 0; t < 3; ++t) bounds[t] = 4e-3 * std::max(1.0, testing::max_abs(refs[t]->f32));
    }
  }

  void expect_within(const Half16& got_dq, const Half16& got_dk, const Half16& got_dv,
                     const char* what) const {
    const testing::Buffer* refs[] = {&dq, &dk, &dv};
    const Half16* got[] = {&got_dq, &got_dk, &got_dv};
    const char* names[] = {"dq", "dk", "dv"};
    for (int t = 0; t < 3; ++t) {
      EXPECT_LE(testing::max_abs_diff(got[t]->values(), refs[t]->f32), bounds[t])
          << names[t] << " " << what;
    }
  }
};

TEST_P(FlashCudaEmulatedBackwardTest, GradientsMatchMath) {
  const auto& [c, deterministic] = GetParam();
  Inputs in(c);
  Half16 out(c.dtype, c.b, c.hq, c.sq, c.d);
  std::vector<float> lse(c.b * c.hq * c.sq);
  forward(in.p, out, lse);
  Half16 dq = in.q, dk = in.k, dv = in.v;
  for (Half16* g : {&dq, &dk, &dv}) std::fill(g->bits.begin(), g->bits.end(), uint16_t{0x7fc0});
  backward(in.p, out, in.dout, lse, dq, dk, dv, deterministic);
  ReferenceGradients(c, in).expect_within(dq, dk, dv, "");
}

std::vector<Case> forward_cases() {
  std::vector<Case> cases;
  // Every mask kind at lengths that leave partial blocks, both head dims, GQA.
  for (int m = 0; m < static_cast<int>(MaskKind::kCount); ++m) {
    const auto mask = static_cast<MaskKind>(m);
    cases.push_back({DType::kBF16, 2, 2, 1, 130, 200, 64, mask});
    cases.push_back({DType::kF16, 1, 2, 2, 77, 140, 128, mask});
  }
  // Lengths 1 and odd, S_q > S_k, padded head dims.
  cases.push_back({DType::kBF16, 1, 1, 1, 1, 1, 64, MaskKind::kNone});
  cases.push_back({DType::kBF16, 1, 3, 1, 7, 13, 32, MaskKind::kCausalTopLeft});
  cases.push_back({DType::kF16, 1, 1, 1, 150, 40, 80, MaskKind::kCausalBottomRight});
  cases.push_back({DType::kBF16, 1, 2, 1, 129, 257, 128, MaskKind::kCausalTopLeft});
  // Whole 128-row query blocks that see no key, so their CTAs skip the key loop with Q's
  // copies in flight: bottom-right causal with S_q - S_k >= 128, a window that hides blocks 1
  // and 2, documents whose first block lies before every key, and S_k = 0.
  for (const Case& c : empty_block_cases()) cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sweep, FlashCudaEmulatedTest, ::testing::ValuesIn(forward_cases()),
                         kernel_case_name);

// The backward costs about four times the forward under the emulator: every mask kind once,
// alternating the two configurations and the two dQ paths, plus the odd shapes in both paths.
// Batch 2 (the batch strides of the gradients and of the GQA workspace) on the first mask kind
// only: the others take batch 1, which halves the suite's heaviest cases under CI's budget.
std::vector<std::tuple<Case, bool>> backward_cases() {
  std::vector<std::tuple<Case, bool>> cases;
  for (int m = 0; m < static_cast<int>(MaskKind::kCount); ++m) {
    const auto mask = static_cast<MaskKind>(m);
    if (m % 2 == 0) {
      cases.emplace_back(Case{DType::kBF16, m == 0 ? 2 : 1, 2, 1, 130, 200, 64, mask}, m % 4 == 2);
    } else {
      cases.emplace_back(Case{DType::kF16, 1, 2, 2, 77, 140, 128, mask}, m % 4 == 3);
    }
  }
  for (bool deterministic : {false, true}) {
    cases.emplace_back(Case{DType::kBF16, 1, 1, 1, 1, 1, 64, MaskKind::kNone}, deterministic);
    cases.emplace_back(Case{DType::kBF16, 1, 3, 1, 7, 13, 32, MaskKind::kCausalTopLeft},
                       deterministic);
    cases.emplace_back(Case{DType::kF16, 1, 1, 1, 150, 40, 80, MaskKind::kCausalBottomRight},
                       deterministic);
  }
  cases.emplace_back(empty_block_cases()[0], true);
  cases.emplace_back(empty_block_cases()[1], false);
  return cases;
}

// GQA and MQA backward with the query heads of a group in parallel (partial dK, dV per query
// head, then summed) against the f64 reference, beside the serial path (one CTA per key/value
// head) on the same inputs; and the launch: H_q dK/dV CTAs per key block, a reduction over the
// B * H_kv * S_k key rows.
struct GqaCase {
  Case c;
  bool deterministic;
};

class FlashCudaEmulatedGqaTest : public ::testing::TestWithParam<GqaCase> {};

TEST_P(FlashCudaEmulatedGqaTest, ParallelQueryHeadsMatchReferenceAndSerialPath) {
  const auto& [c, deterministic] = GetParam();
  Inputs in(c);
  const AttentionProblem& p = in.p;
  Half16 out(c.dtype, c.b, c.hq, c.sq, c.d);
  std::vector<float> lse(c.b * c.hq * c.sq);
  forward(p, out, lse);
  Half16 dq = in.q, dk = in.k, dv = in.v;
  Half16 dq_serial = in.q, dk_serial = in.k, dv_serial = in.v;
  backward(p, out, in.dout, lse, dq, dk, dv, deterministic, /*split_heads=*/true);
  backward(p, out, in.dout, lse, dq_serial, dk_serial, dv_serial, deterministic,
           /*split_heads=*/false);

  const ReferenceGradients ref(c, in);
  ref.expect_within(dq, dk, dv, "parallel query heads");
  ref.expect_within(dq_serial, dk_serial, dv_serial, "serial query heads");
  const FlashPlan plan = make_flash_plan(p);
  FlashParams f = plan.params;
  float marker = 0;
  f.dk_accum = f.dv_accum = &marker;
  const BackwardLaunch s = backward_launch_shape<BackwardD64, DqD64, 64>(f);
  EXPECT_EQ(s.dkdv_grid[1], c.hq);
  EXPECT_EQ(s.reduce_rows_grid,
            (c.b * c.hkv * c.sk + RowChunks<64>::kRows - 1) / RowChunks<64>::kRows);
  EXPECT_EQ(flash_backward_dkdv_workspace_floats(plan),
            2 * c.b * c.hq * c.sk * plan.kernel_head_dim);
}

// Small (the emulator runs a host thread per CUDA thread); the backward sweep above runs the
// parallel path too, under every mask kind, with two query heads per key/value head.
std::vector<GqaCase> gqa_cases() {
  return {
      {{DType::kBF16, 1, 4, 2, 70, 130, 64, MaskKind::kCausalBottomRight}, false},  // GQA
      {{DType::kF16, 1, 3, 1, 40, 70, 128, MaskKind::kNone}, true},                 // MQA
      {{DType::kBF16, 1, 2, 1, 40, 129, 64, MaskKind::kDropout}, false},            // MQA
  };
}

INSTANTIATE_TEST_SUITE_P(Sweep, FlashCudaEmulatedGqaTest, ::testing::ValuesIn(gqa_cases()),
                         [](const ::testing::TestParamInfo<GqaCase>& info) {
                           return kernel_case_name({info.param.c, info.index}) +
                                  (info.param.deterministic ? "_deterministic" : "_atomic");
                         });

INSTANTIATE_TEST_SUITE_P(Sweep, FlashCudaEmulatedBackwardTest,
                         ::testing::ValuesIn(backward_cases()),
                         [](const ::testing::TestParamInfo<std::tuple<Case, bool>>& info) {
                           return kernel_case_name({std::get<0>(info.param), info.index}) +
                                  (std::get<1>(info.param) ? "_deterministic" : "_atomic");
                         });

// ---- Dropout in the kernels' layouts -----------------------------------------------------------

// The keep bits every thread of the forward (queries as rows), the backward's dK/dV (keys as
// rows, S^T) and the dQ kernel compute for their fragments equal the CPU reference's mask
// (DropoutMask, which the CPU and math backends use) element by element: forward and backward
// drop the same elements, one Philox call per four elements.
TEST(FlashCudaDropoutTest, KernelLayoutsMatchTheCpuMask) {
  AttentionProblem p;
  p.dropout = {0.3, 0x1234567890ull, (uint64_t{3} << 32) + 17};
  const DropoutParams d = make_dropout_params(p);
  const DropoutMask mask(p.dropout.p, p.dropout.seed, p.dropout.offset);
  auto check = [&](auto bits, bool transposed, int kmt, int knt, int row0, int col0,
                   const char* what) {
    for (int idx = 0; idx < kmt * knt * 4; ++idx) {
      const int mt = idx / (knt * 4), nt = (idx / 4) % knt, c = idx % 4;
      const int row = row0 + mt * 16 + 8 * (c / 2), col = col0 + nt * 8 + (c % 2);
      const int i = transposed ? col : row, j = transposed ? row : col;
      const bool kept = (bits.w[idx / 32] >> (idx % 32)) & 1u;
      ASSERT_EQ(kept, mask.keep(1, 3, i, j)) << what << " i " << i << " j " << j;
    }
  };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (const int block : {0, 1, 5}) {
      // Forward: ForwardD64's warp rows (kMT m-tiles) x 64 keys; block offsets as the kernel's.
      using F = ForwardD64;
      const int f_row0 = block * F::kBlockM + 16 * F::kMT + g, f_col0 = block * F::kBlockN + 2 * t;
      check(dropout_bits<false, F::kMT, F::kNT>(d, 1, 3, f_row0, f_col0), false, F::kMT, F::kNT,
            f_row0, f_col0, "forward");
      // dK/dV: 16 keys of warp 3 x a query block.
      using B = BackwardD128;
      const int b_row0 = block * B::kBlockN + 3 * 16 + g, b_col0 = block * B::kBlockM + 2 * t;
      check(dropout_bits<true, 1, B::kNT>(d, 1, 3, b_row0, b_col0), true, 1, B::kNT, b_row0, b_col0,
            "dkdv");
      // dQ: 16 queries of warp 2 x a key block.
      using Q = DqD64;
      const int q_row0 = block * Q::kBlockM + 2 * 16 + g, q_col0 = block * Q::kBlockN + 2 * t;
      check(dropout_bits<false, 1, Q::kNT>(d, 1, 3, q_row0, q_col0), false, 1, Q::kNT, q_row0,
            q_col0, "dq");
    }
  }
}

// ---- The emulator's model of cp.async -------------------------------------------------------

// Warp 0 copies 16 bytes into shared memory and waits; warp 1 reads them before any barrier
// (stale: the fill pattern) and after one (the data). The issuing thread sees its copy at once.
TEST(CudaEmulatorTest, CopyReachesAnotherWarpOnlyAfterABarrier) {
  const uint32_t src[4] = {1, 2, 3, 4};
  uint32_t own = 0, before = 0, after = 0;
  const int grid[3] = {1, 1, 1};
  emulator::run_grid(grid, 64, 64, [&](int, int, int, char* smem) {
    const int tid = thread_index();
    if (tid == 0) {
      cp_async_16(smem_address(smem), src, true);
      cp_async_commit();
      cp_async_wait<0>();
      own = std::bit_cast<uint32_t>(ld_shared_f32(smem));
    }
    if (tid == 32) before = std::bit_cast<uint32_t>(ld_shared_f32(smem));
    cta_sync();
    if (tid == 32) after = std::bit_cast<uint32_t>(ld_shared_f32(smem));
  });
  EXPECT_EQ(own, 1u) << "the issuing thread sees its copy after its wait";
  EXPECT_EQ(before, 0xA5A5A5A5u) << "another warp saw a copy no barrier had published";
  EXPECT_EQ(after, 1u);
}

// Another warp's store into a retired but unpublished copy's bytes is lost when the copy lands
// at the barrier; the issuing thread's own store after its wait is not.
TEST(CudaEmulatorTest, CopyLandsOverARacingStoreButNotTheIssuersOwn) {
  const uint32_t src[4] = {1, 2, 3, 4};
  uint32_t got[4] = {};
  const int grid[3] = {1, 1, 1};
  emulator::run_grid(grid, 64, 64, [&](int, int, int, char* smem) {
    const int tid = thread_index();
    if (tid == 0) {
      cp_async_16(smem_address(smem), src, true);
      cp_async_commit();
      cp_async_wait<0>();
      st_shared_u32(smem + 4, 20);  // ordered after the copy: stays
    }
    cta_sync();  // (the copy lands here; start over with a second one)
    if (tid == 0) {
      cp_async_16(smem_address(smem + 16), src, true);
      cp_async_commit();
      cp_async_wait<0>();
    }
    if (tid == 32) st_shared_u32(smem + 16, 99);  // races the copy: lost
    cta_sync();
    if (tid == 32) {
      got[0] = std::bit_cast<uint32_t>(ld_shared_f32(smem + 4));
      got[1] = std::bit_cast<uint32_t>(ld_shared_f32(smem + 16));
    }
  });
  EXPECT_EQ(got[0], 20u);
  EXPECT_EQ(got[1], 1u);
}

// The forward kernel with its epilogue barrier removed, on a problem whose first two query
// blocks see no key: the emulator must produce Q's values there instead of zeros (the defect
// a GPU would show), and the kernel as built must produce zeros.
TEST(CudaEmulatorTest, CatchesTheForwardsMissingEpilogueBarrier) {
  const Case c = empty_block_cases()[0];  // bottom-right causal, S_q - S_k = 260
  Inputs in(c);
  auto first_blocks_max = [&](const Half16& out) {
    double m = 0;
    for (int64_t h = 0; h < c.hq; ++h) {
      for (int64_t i = 0; i < 256; ++i) {
        for (int64_t d = 0; d < c.d; ++d) {
          m = std::max(m, std::fabs(double(out.at((h * c.sq + i) * c.d + d))));
        }
      }
    }
    return m;
  };
  Half16 broken(c.dtype, c.b, c.hq, c.sq, c.d), fixed = broken;
  std::vector<float> lse(c.b * c.hq * c.sq);
  forward</*kEpilogueBarrier=*/false>(in.p, broken, lse);
  forward</*kEpilogueBarrier=*/true>(in.p, fixed, lse);
  EXPECT_GT(first_blocks_max(broken), 0.1) << "the emulator let a missing barrier pass";
  EXPECT_EQ(first_blocks_max(fixed), 0.0) << "rows that see no key must be zero";
}

// ---- The math backend's CUDA bodies, run as loops ----------------------------------------

struct MathCase {
  DType dtype;
  MaskKind mask;
};

class MathCudaHostTest : public ::testing::TestWithParam<MathCase> {};

TEST_P(MathCudaHostTest, ForwardAndBackwardMatchCpuMath) {
  const MathCase& mc = GetParam();
  const int64_t B = 2, Hq = 4, Hkv = 2, Sq = 37, Sk = 53, D = 24;
  // f32 inputs, then the same values in the case's dtype (exactly representable after one
  // rounding), so both sides see identical inputs.
  testing::Qkv in(DType::kF32, B, Hq, Hkv, Sq, Sk, D, 5);
  auto narrow = [&](testing::Buffer& f32) {
    if (mc.dtype == DType::kF32) return;
    for (float& x : f32.f32) {
      x = mc.dtype == DType::kBF16 ? static_cast<float>(BFloat16(x)) : static_cast<float>(Half(x));
    }
  };
  for (testing::Buffer* b : {&in.q, &in.k, &in.v, &in.dout}) narrow(*b);
  auto as_dtype = [&](const testing::Buffer& f32) {
    Half16 h(mc.dtype == DType::kF32 ? DType::kBF16 : mc.dtype, f32.sizes[0], f32.sizes[1],
             f32.sizes[2], f32.sizes[3]);
    for (int64_t i = 0; i < h.numel(); ++i) h.set(i, f32.f32[i]);
    return h;
  };
  AttentionProblem ref = in.problem();
  testing::configure_mask(mc.mask, B, Sq, Sk, ref);

  // Views in the case's dtype (f32: the buffers themselves).
  Half16 q16 = as_dtype(in.q), k16 = as_dtype(in.k), v16 = as_dtype(in.v), do16 = as_dtype(in.dout);
  testing::Buffer out32(DType::kF32, B, Hq, Sq, D), dq32 = out32, dk32(DType::kF32, B, Hkv, Sk, D);
  testing::Buffer dv32 = dk32;
  Half16 out16 = q16, dq16 = q16, dk16 = k16, dv16 = v16;
  const bool f32 = mc.dtype == DType::kF32;
  AttentionProblem p = ref;
  if (!f32) {
    p.q = q16.view();
    p.k = k16.view();
    p.v = v16.view();
  }
  const MaskPlan mask = make_mask_plan(p);
  MathParams mp;
  mp.q = device_view(p.q);
  mp.k = device_view(p.k);
  mp.v = device_view(p.v);
  mp.out = device_view(f32 ? out32.view() : out16.view());
  mp.dout = device_view(f32 ? in.dout.view() : do16.view());
  mp.dq = device_view(f32 ? dq32.view() : dq16.view());
  mp.dk = device_view(f32 ? dk32.view() : dk16.view());
  mp.dv = device_view(f32 ? dv32.view() : dv16.view());
  mp.elem = f32 ? MathElem::kF32 : mc.dtype == DType::kBF16 ? MathElem::kBf16 : MathElem::kF16;
  mp.batch = B;
  mp.q_heads = Hq;
  mp.kv_heads = Hkv;
  mp.q_len = Sq;
  mp.kv_len = Sk;
  mp.head_dim = D;
  mp.scale = static_cast<float>(p.softmax_scale());
  mp.mask = mask.params;
  set_mask_arrays(mp.mask, mask, mask.tiles.data(), mask.bits.data(), mask.prefix.data(),
                  mask.q_docs.data(), mask.kv_docs.data());
  mp.dropout = make_dropout_params(p);
  std::vector<float> lse(B * Hq * Sq), probs(B * Hq * Sq * Sk), grads(probs.size());
  mp.lse = lse.data();
  mp.probs = probs.data();
  mp.grads = grads.data();
  mp.kv0 = 0;
  mp.kv_count = B * Hkv;  // one chunk
  const int64_t rows = B * Hq * Sq;
  for (int64_t i = 0; i < rows * Sk; ++i) math_scores_at(mp, i);
  for (int64_t i = 0; i < rows; ++i) math_softmax_row(mp, i);
  for (int64_t i = 0; i < rows * D; ++i) math_output_at(mp, i);
  for (int64_t i = 0; i < rows * Sk; ++i) math_dprobs_at(mp, i);
  for (int64_t i = 0; i < rows; ++i) math_dscores_row(mp, i);
  for (int64_t i = 0; i < rows * D; ++i) math_dq_at(mp, i);
  for (int64_t i = 0; i < B * Hkv * Sk * D; ++i) math_dkv_at(mp, i);

  testing::Buffer r_out = out32, r_dq = dq32, r_dk = dk32, r_dv = dv32;
  std::vector<float> r_lse(lse.size());
  math_attention_forward(ref, r_out.view(), r_lse.data(), {.f64_accumulate = true});
  math_attention_backward(ref, in.dout.view(), r_dq.view(), r_dk.view(), r_dv.view(),
                          {.f64_accumulate = true});
  // f32 accumulation, then one rounding to the output dtype.
  const double rel = f32 ? 1e-5 : mc.dtype == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
  auto values = [&](const testing::Buffer& b32, const Half16& b16) {
    return f32 ? b32.f32 : b16.values();
  };
  const std::pair<std::vector<float>, const testing::Buffer*> results[] = {
      {values(out32, out16), &r_out},
      {values(dq32, dq16), &r_dq},
      {values(dk32, dk16), &r_dk},
      {values(dv32, dv16), &r_dv}};
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (int t = 0; t < 4; ++t) {
    const double scale = std::max(1.0, testing::max_abs(results[t].second->f32));
    EXPECT_LE(testing::max_abs_diff(results[t].first, results[t].second->f32),
              rel * scale + 1e-4 * scale)
        << names[t];
  }
  EXPECT_LE(testing::max_abs_diff_inf(lse, r_lse), 1e-4) << "lse";
}

std::vector<MathCase> math_cases() {
  std::vector<MathCase> cases;
  for (int m = 0; m < static_cast<int>(MaskKind::kCount); ++m) {
    cases.push_back({DType::kF32, static_cast<MaskKind>(m)});
  }
  cases.push_back({DType::kBF16, MaskKind::kCausalTopLeft});
  cases.push_back({DType::kF16, MaskKind::kDocuments});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sweep, MathCudaHostTest, ::testing::ValuesIn(math_cases()),
                         [](const ::testing::TestParamInfo<MathCase>& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_" +
                                  testing::mask_kind_name(info.param.mask);
                         });

}  // namespace
}  // namespace tessel::kernels::attention::cuda
