// MaskEvaluator: element visibility against hand-derived expectations, and tile classes that
// agree with the elements they cover.

#include "tessel/kernels/attention/attention_mask.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tessel::kernels::attention {
namespace {

AttentionProblem shape_only(int64_t b, int64_t sq, int64_t sk) {
  AttentionProblem p;
  p.q.sizes[0] = p.k.sizes[0] = p.v.sizes[0] = b;
  p.q.sizes[1] = p.k.sizes[1] = p.v.sizes[1] = 1;
  p.q.sizes[2] = sq;
  p.k.sizes[2] = p.v.sizes[2] = sk;
  p.q.sizes[3] = p.k.sizes[3] = p.v.sizes[3] = 8;
  return p;
}

// The visible set as rows of '1'/'0' for batch 0, head 0.
std::vector<std::string> pattern(const AttentionProblem& p, int64_t b = 0) {
  const MaskEvaluator m(p);
  std::vector<std::string> rows;
  for (int64_t i = 0; i < p.q_len(); ++i) {
    std::string row;
    for (int64_t j = 0; j < p.kv_len(); ++j) row += m.visible(b, 0, i, j) ? '1' : '0';
    rows.push_back(row);
  }
  return rows;
}

TEST(AttentionMaskTest, CausalAlignments) {
  AttentionProblem p = shape_only(1, 2, 4);
  p.mask.causal = true;
  EXPECT_EQ(pattern(p), (std::vector<std::string>{"1000", "1100"}));
  p.mask.alignment = MaskAlignment::kBottomRight;
  EXPECT_EQ(pattern(p), (std::vector<std::string>{"1110", "1111"}));
  // More queries than keys, bottom-right: the first rows see nothing.
  AttentionProblem tall = shape_only(1, 4, 2);
  tall.mask.causal = true;
  tall.mask.alignment = MaskAlignment::kBottomRight;
  EXPECT_EQ(pattern(tall), (std::vector<std::string>{"00", "00", "10", "11"}));
}

TEST(AttentionMaskTest, SlidingWindowAndPrefix) {
  AttentionProblem p = shape_only(1, 5, 5);
  p.mask.window_left = 1;
  p.mask.window_right = 1;
  EXPECT_EQ(pattern(p), (std::vector<std::string>{"11000", "11100", "01110", "00111", "00011"}));
  p.mask.window_right = -1;
  p.mask.causal = true;  // causal caps the right window at 0
  EXPECT_EQ(pattern(p), (std::vector<std::string>{"10000", "11000", "01100", "00110", "00011"}));
  AttentionProblem lm = shape_only(2, 4, 4);
  lm.mask.causal = true;
  lm.mask.prefix_lengths = {2, 3};
  EXPECT_EQ(pattern(lm, 0), (std::vector<std::string>{"1100", "1100", "1110", "1111"}));
  EXPECT_EQ(pattern(lm, 1), (std::vector<std::string>{"1110", "1110", "1110", "1111"}));
}

TEST(AttentionMaskTest, DocumentsAndPredicate) {
  AttentionProblem p = shape_only(1, 5, 5);
  p.mask.q_document_ids = {0, 0, 1, 1, 1};
  EXPECT_EQ(pattern(p), (std::vector<std::string>{"11000", "11000", "00111", "00111", "00111"}));
  p.mask.causal = true;
  p.mask.mask_fn = [](int64_t, int64_t, int64_t, int64_t j) { return j != 3; };
  EXPECT_EQ(pattern(p), (std::vector<std::string>{"10000", "11000", "00100", "00100", "00101"}));
}

// For random masks and tiles: empty tiles hold no visible element, full tiles no hidden one.
TEST(AttentionMaskTest, TileClassesAgreeWithElements) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t sq = 1 + gen() % 40, sk = 1 + gen() % 40;
    AttentionProblem p = shape_only(2, sq, sk);
    AttentionMask& m = p.mask;
    m.causal = gen() % 2;
    m.alignment = gen() % 2 ? MaskAlignment::kTopLeft : MaskAlignment::kBottomRight;
    m.window_left = static_cast<int64_t>(gen() % 12) - 1;
    m.window_right = static_cast<int64_t>(gen() % 12) - 1;
    if (gen() % 2) m.prefix_lengths = {static_cast<int64_t>(gen() % 20), 3};
    if (gen() % 2) {
      for (int64_t i = 0; i < 2 * sq; ++i) m.q_document_ids.push_back((i % sq) / 7);
      for (int64_t j = 0; j < 2 * sk; ++j) m.kv_document_ids.push_back((j % sk) / 5);
    }
    const MaskEvaluator eval(p);
    const int64_t bq = 1 + gen() % 9, bk = 1 + gen() % 9;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i0 = 0; i0 < sq; i0 += bq) {
        for (int64_t j0 = 0; j0 < sk; j0 += bk) {
          const int64_t i1 = std::min(sq, i0 + bq), j1 = std::min(sk, j0 + bk);
          const TileClass c = eval.classify(b, i0, i1, j0, j1);
          int64_t seen = 0;
          for (int64_t i = i0; i < i1; ++i) {
            for (int64_t j = j0; j < j1; ++j) seen += eval.visible(b, 0, i, j);
          }
          if (c == TileClass::kEmpty) {
            ASSERT_EQ(seen, 0) << "trial " << trial;
          }
          if (c == TileClass::kFull) {
            ASSERT_EQ(seen, (i1 - i0) * (j1 - j0)) << "trial " << trial;
          }
        }
      }
    }
  }
}

TEST(AttentionMaskTest, CausalTilesAreSkippedAndDiagonalIsPartial) {
  AttentionProblem p = shape_only(1, 256, 256);
  p.mask.causal = true;
  const MaskEvaluator eval(p);
  EXPECT_EQ(eval.classify(0, 0, 64, 64, 128), TileClass::kEmpty);
  EXPECT_EQ(eval.classify(0, 64, 128, 0, 64), TileClass::kFull);
  EXPECT_EQ(eval.classify(0, 64, 128, 64, 128), TileClass::kPartial);
}

}  // namespace
}  // namespace tessel::kernels::attention
