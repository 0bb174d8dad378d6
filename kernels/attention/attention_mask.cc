#include "tessel/kernels/attention/attention_mask.h"

#include <algorithm>

namespace tessel::kernels::attention {
namespace {

// AND and OR of tile classes.
TileClass tile_and(TileClass a, TileClass b) {
  if (a == TileClass::kEmpty || b == TileClass::kEmpty) return TileClass::kEmpty;
  if (a == TileClass::kFull && b == TileClass::kFull) return TileClass::kFull;
  return TileClass::kPartial;
}
TileClass tile_or(TileClass a, TileClass b) {
  if (a == TileClass::kFull || b == TileClass::kFull) return TileClass::kFull;
  if (a == TileClass::kEmpty && b == TileClass::kEmpty) return TileClass::kEmpty;
  return TileClass::kPartial;
}

}  // namespace

MaskEvaluator::MaskEvaluator(const AttentionProblem& problem) : mask_(&problem.mask) {
  const AttentionMask& m = problem.mask;
  if (m.alignment == MaskAlignment::kBottomRight) shift_ = problem.kv_len() - problem.q_len();
  left_ = m.window_left;
  right_ = m.window_right;
  if (m.causal) right_ = right_ < 0 ? 0 : std::min<int64_t>(right_, 0);
  has_docs_ = m.has_documents();
  if (has_docs_) {
    q_docs_ = m.q_document_ids.data();
    q_doc_batch_stride_ =
        static_cast<int64_t>(m.q_document_ids.size()) == problem.q_len() ? 0 : problem.q_len();
    if (m.kv_document_ids.empty()) {
      kv_docs_ = q_docs_;
      kv_doc_batch_stride_ = q_doc_batch_stride_;
    } else {
      kv_docs_ = m.kv_document_ids.data();
      kv_doc_batch_stride_ =
          static_cast<int64_t>(m.kv_document_ids.size()) == problem.kv_len() ? 0 : problem.kv_len();
    }
  }
  dense_ = left_ < 0 && right_ < 0 && !has_docs_ && !m.mask_fn;
  bool any_prefix = false;
  for (int64_t len : m.prefix_lengths) any_prefix |= len > 0;
  rows_are_ranges_ = !any_prefix && !has_docs_ && !m.mask_fn;
}

TileClass MaskEvaluator::classify_window(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  // Over the tile, p - j spans [p0 - (j1 - 1), p1 - j0] with p = i + shift.
  const int64_t p0 = i0 + shift_, p1 = i1 - 1 + shift_;
  const int64_t min_back = p0 - (j1 - 1), max_back = p1 - j0;  // p - j
  const int64_t min_fwd = j0 - p1, max_fwd = (j1 - 1) - p0;    // j - p
  if ((left_ >= 0 && min_back > left_) || (right_ >= 0 && min_fwd > right_)) {
    return TileClass::kEmpty;
  }
  if ((left_ < 0 || max_back <= left_) && (right_ < 0 || max_fwd <= right_)) {
    return TileClass::kFull;
  }
  return TileClass::kPartial;
}

TileClass MaskEvaluator::classify_documents(int64_t b, int64_t i0, int64_t i1, int64_t j0,
                                            int64_t j1) const {
  const int64_t* q = q_docs_ + b * q_doc_batch_stride_;
  const int64_t* kv = kv_docs_ + b * kv_doc_batch_stride_;
  const auto [q_lo, q_hi] = std::minmax_element(q + i0, q + i1);
  const auto [kv_lo, kv_hi] = std::minmax_element(kv + j0, kv + j1);
  if (*q_hi < *kv_lo || *kv_hi < *q_lo) return TileClass::kEmpty;
  if (*q_lo == *q_hi && *kv_lo == *kv_hi) return TileClass::kFull;  // one shared document
  return TileClass::kPartial;
}

TileClass MaskEvaluator::classify(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  TileClass c = classify_window(i0, i1, j0, j1);
  const int64_t pre = prefix(b);
  if (pre > 0 && c != TileClass::kFull) {
    const TileClass prefix_class = j1 <= pre   ? TileClass::kFull
                                   : j0 >= pre ? TileClass::kEmpty
                                               : TileClass::kPartial;
    c = tile_or(c, prefix_class);
  }
  if (has_docs_ && c != TileClass::kEmpty) c = tile_and(c, classify_documents(b, i0, i1, j0, j1));
  if (mask_->mask_fn && c == TileClass::kFull) c = TileClass::kPartial;
  return c;
}

}  // namespace tessel::kernels::attention
