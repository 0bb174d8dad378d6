// The host side of the CUDA attention kernels (runs everywhere, no GPU): the mask resolved into
// the tile map agrees with MaskEvaluator on every element, block classes and block ranges are
// conservative, dropout decisions match the CPU's DropoutMask, and unsupported layouts are
// refused with a reason that names what flash_cuda supports.

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "tessel/base/error.h"
#include "tessel/kernels/attention/attention_dropout.h"
#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/cuda/flash_cuda_plan.h"

namespace tessel::kernels::attention::cuda {
namespace {

using testing::MaskKind;

struct PlanCase {
  MaskKind mask;
  int64_t sq, sk;
};

class FlashCudaPlanTest : public ::testing::TestWithParam<PlanCase> {};

// The plan's mask with its arrays used in place.
struct HostMask {
  MaskPlan plan;
  MaskParams params;
  explicit HostMask(const AttentionProblem& p) : plan(make_mask_plan(p)), params(plan.params) {
    set_mask_arrays(params, plan, plan.tiles.data(), plan.bits.data(), plan.prefix.data(),
                    plan.q_docs.data(), plan.kv_docs.data());
  }
};

TEST_P(FlashCudaPlanTest, MaskAgreesWithMaskEvaluator) {
  const PlanCase& c = GetParam();
  const int64_t B = 2, H = 3, D = 8;
  testing::Qkv in(DType::kBF16, B, H, H, c.sq, c.sk, D, 1);
  AttentionProblem p = in.problem();
  testing::configure_mask(c.mask, B, c.sq, c.sk, p);
  const HostMask m(p);
  const MaskEvaluator ev(p);
  int64_t mismatches = 0;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < c.sq; ++i) {
        for (int j = 0; j < c.sk; ++j) {
          mismatches += visible(m.params, b, h, i, j) != ev.visible(b, h, i, j);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);

  // Block classes (at the kernels' block sizes and odd ones) and ranges never lose a visible
  // element; kFull blocks see everything.
  for (const auto& [bm, bn] : {std::pair{64, 128}, {128, 64}, {128, 128}, {48, 80}}) {
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        for (int i0 = 0; i0 < c.sq; i0 += bm) {
          const int i1 = std::min<int>(c.sq, i0 + bm);
          int lo, hi;
          key_block_range(m.params, static_cast<int>(c.sk), bn, i0, i1, &lo, &hi);
          for (int j0 = 0; j0 < c.sk; j0 += bn) {
            const int j1 = std::min<int>(c.sk, j0 + bn), n = j0 / bn;
            const BlockClass cls = block_class(m.params, b, h, i0, i1, j0, j1);
            bool any = false, all = true;
            for (int i = i0; i < i1; ++i) {
              for (int j = j0; j < j1; ++j) {
                const bool v = ev.visible(b, h, i, j);
                any |= v;
                all &= v;
              }
            }
            if (any) {
              EXPECT_NE(cls, BlockClass::kSkip) << "block " << i0 << "," << j0;
              EXPECT_TRUE(n >= lo && n < hi) << "key block " << n << " outside [" << lo << ", "
                                             << hi << ") for queries from " << i0;
              int qlo, qhi;
              query_block_range(m.params, static_cast<int>(c.sq), bm, j0, j1, &qlo, &qhi);
              EXPECT_TRUE(i0 / bm >= qlo && i0 / bm < qhi) << "query block " << i0 / bm;
            }
            if (cls == BlockClass::kFull) {
              EXPECT_TRUE(all) << "block " << i0 << "," << j0;
            }
          }
        }
      }
    }
  }
}

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> cases;
  for (int k = 0; k < static_cast<int>(MaskKind::kCount); ++k) {
    const auto mask = static_cast<MaskKind>(k);
    if (mask == MaskKind::kDropout) continue;
    for (const auto& [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {130, 200}, {200, 70}}) {
      cases.push_back({mask, sq, sk});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Masks, FlashCudaPlanTest, ::testing::ValuesIn(plan_cases()),
                         [](const ::testing::TestParamInfo<PlanCase>& info) {
                           return std::string(testing::mask_kind_name(info.param.mask)) + "_Sq" +
                                  std::to_string(info.param.sq) + "_Sk" +
                                  std::to_string(info.param.sk);
                         });

TEST(FlashCudaPlanTest, DropoutMatchesCpuMask) {
  testing::Qkv in(DType::kBF16, 1, 1, 1, 4, 4, 8, 1);
  AttentionProblem p = in.problem();
  p.dropout = {0.3, 0xDEADBEEF12345ull, (uint64_t{7} << 32) + 99};
  const DropoutParams d = make_dropout_params(p);
  const DropoutMask mask(p.dropout.p, p.dropout.seed, p.dropout.offset);
  EXPECT_FLOAT_EQ(d.keep_scale, mask.keep_scale());
  std::mt19937 gen(3);
  std::uniform_int_distribution<int> pick(0, 5000);
  for (int n = 0; n < 20000; ++n) {
    const int b = pick(gen) % 7, h = pick(gen) % 33, i = pick(gen), j = pick(gen);
    EXPECT_EQ(dropout_keep(d, b, h, i, j), mask.keep(b, h, i, j));
    // One Philox call decides the group (i, j), (i, j + 8), (i + 8, j), (i + 8, j + 8).
    const int gi = i & ~8, gj = j & ~8;
    bool keep[4];
    dropout_keep4(d, b, h, gi, gj, keep);
    ASSERT_EQ(keep[0], mask.keep(b, h, gi, gj));
    ASSERT_EQ(keep[1], mask.keep(b, h, gi, gj + 8));
    ASSERT_EQ(keep[2], mask.keep(b, h, gi + 8, gj));
    ASSERT_EQ(keep[3], mask.keep(b, h, gi + 8, gj + 8));
  }
  // fill() (the CPU kernels' row at a time) agrees with keep() over any key range.
  std::vector<float> row(301);
  const std::pair<int, int> ranges[] = {{0, 300}, {3, 17}, {8, 8}, {9, 1}, {7, 2}, {250, 50}};
  for (const int i : {0, 5, 13, 21, 4099}) {
    for (const auto& [j0, n] : ranges) {
      std::fill(row.begin(), row.end(), -1.0f);
      mask.fill(1, 2, i, j0, n, row.data());
      for (int j = j0; j < j0 + n; ++j) {
        ASSERT_EQ(row[j - j0], mask.keep(1, 2, i, j) ? mask.keep_scale() : 0.0f)
            << "i " << i << " j " << j << " range " << j0 << "+" << n;
      }
      ASSERT_EQ(row[n], -1.0f) << "fill wrote past its range";
    }
  }
  // fill_rows() (two rows of a group per call) likewise, over tiles at any offset.
  for (const int i0 : {0, 5, 13}) {
    for (const int rows : {1, 9, 24}) {
      for (const auto& [j0, n] : ranges) {
        const int ld = n + 3;
        std::vector<float> tile(static_cast<size_t>(rows * ld), -1.0f);
        mask.fill_rows(1, 2, i0, rows, j0, n, tile.data(), ld);
        for (int r = 0; r < rows; ++r) {
          for (int j = j0; j < j0 + n; ++j) {
            ASSERT_EQ(tile[r * ld + j - j0], mask.keep(1, 2, i0 + r, j) ? mask.keep_scale() : 0.0f)
                << "i " << i0 + r << " j " << j;
          }
          ASSERT_EQ(tile[r * ld + n], -1.0f) << "fill_rows wrote past its row";
        }
      }
    }
  }
}

// About the dropout rate: the fraction kept over many elements is 1 - p, and neighbouring
// groups (and the four words of a group) are not correlated into whole kept or dropped blocks.
TEST(FlashCudaPlanTest, DropoutKeepsOneMinusP) {
  const DropoutMask mask(0.25, 42, 5);
  int64_t kept = 0, total = 0, whole_groups = 0;
  for (int i = 0; i < 256; i += 16) {
    for (int j = 0; j < 256; j += 16) {
      for (int r = 0; r < 8; ++r) {
        for (int c = 0; c < 8; ++c) {
          const int k = mask.keep(0, 0, i + r, j + c) + mask.keep(0, 0, i + r, j + c + 8) +
                        mask.keep(0, 0, i + r + 8, j + c) + mask.keep(0, 0, i + r + 8, j + c + 8);
          kept += k;
          total += 4;
          whole_groups += k == 0 || k == 4;
        }
      }
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / total, 0.75, 0.01);
  // Independent words: P(all kept or all dropped) = 0.75^4 + 0.25^4 ~ 0.32.
  EXPECT_NEAR(static_cast<double>(whole_groups) / (total / 4), 0.32, 0.03);
}

TEST(FlashCudaPlanTest, UnsupportedLayoutsNameWhatIsSupported) {
  auto reason = [](DType dtype, int64_t d, Device device, int64_t q_stride_d = 1) {
    testing::Qkv in(dtype == DType::kF16 ? DType::kBF16 : dtype, 1, 2, 2, 16, 16, d, 1);
    AttentionProblem p = in.problem();
    for (AttentionView* v : {&p.q, &p.k, &p.v}) {
      v->dtype = dtype;
      v->device = device;
    }
    p.q.strides[3] = q_stride_d;
    return flash_cuda_unsupported_reason(p);
  };
  const Device gpu = Device::cuda(0);
  EXPECT_EQ(reason(DType::kBF16, 64, gpu), "");
  EXPECT_EQ(reason(DType::kF16, 128, gpu), "");
  EXPECT_EQ(reason(DType::kBF16, 40, gpu), "");  // padded to 64
  EXPECT_NE(reason(DType::kF32, 64, gpu).find("flash_cuda supports bf16 and f16"),
            std::string::npos);
  EXPECT_NE(reason(DType::kBF16, 256, gpu).find("head dims 8 to 128"), std::string::npos);
  EXPECT_NE(reason(DType::kBF16, 20, gpu).find("multiples of 8"), std::string::npos);
  EXPECT_NE(reason(DType::kBF16, 64, Device::cpu()).find("flash_cuda runs CUDA tensors"),
            std::string::npos);
  EXPECT_NE(reason(DType::kBF16, 64, gpu, 2).find("contiguous last dimension"), std::string::npos);
  // make_flash_plan refuses the same with InvalidArgument.
  testing::Qkv in(DType::kF32, 1, 1, 1, 4, 4, 8, 1);
  EXPECT_THROW(make_flash_plan(in.problem()), InvalidArgument);
}

}  // namespace
}  // namespace tessel::kernels::attention::cuda
