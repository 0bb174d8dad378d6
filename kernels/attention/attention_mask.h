#pragma once
// Evaluates an AttentionMask: per element (b, h, i, j) and per tile of (query block, key block),
// where a tile is classified as empty (skipped), full (no per-element mask) or partial.

#include <cstdint>

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

enum class TileClass : uint8_t { kEmpty, kPartial, kFull };

// A resolved mask for one problem: alignment offset, effective window, per-batch prefix
// lengths, document-id access. Immutable after construction, safe to share across threads.
// Holds a pointer to `problem.mask`, which must outlive it.
class MaskEvaluator {
 public:
  explicit MaskEvaluator(const AttentionProblem& problem);

  // True when query i of (b, h) sees key j.
  bool visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return (window_visible(i, j) || j < prefix(b)) && same_document(b, i, j) &&
           (!mask_->mask_fn || mask_->mask_fn(b, h, i, j));
  }

  // Class of the tile of queries [i0, i1) and keys [j0, j1) (both non-empty) of (b, h).
  // Empty and full are exact for the built-in parts (documents: exact when ids are sorted,
  // otherwise conservative); a mask_fn makes a non-empty tile partial.
  TileClass classify(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;

  // True when every (i, j) is visible (no causal, window, documents or mask_fn).
  bool is_dense() const { return dense_; }

  // True when the visible keys of every query form one range, window_range() (causal and
  // windows only: no prefix, documents or mask_fn).
  bool rows_are_ranges() const { return rows_are_ranges_; }
  // Keys [lo, hi) that the causal/window part lets query i see (unclamped; may be empty).
  void window_range(int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t p = i + shift_;
    *lo = left_ < 0 ? INT64_MIN / 2 : p - left_;
    *hi = right_ < 0 ? INT64_MAX / 2 : p + right_ + 1;
  }

 private:
  bool window_visible(int64_t i, int64_t j) const {
    const int64_t p = i + shift_;
    return (left_ < 0 || p - j <= left_) && (right_ < 0 || j - p <= right_);
  }
  int64_t prefix(int64_t b) const {
    if (mask_->prefix_lengths.empty()) return 0;
    return mask_->prefix_lengths.size() == 1 ? mask_->prefix_lengths[0] : mask_->prefix_lengths[b];
  }
  bool same_document(int64_t b, int64_t i, int64_t j) const {
    if (!has_docs_) return true;
    return q_docs_[b * q_doc_batch_stride_ + i] == kv_docs_[b * kv_doc_batch_stride_ + j];
  }
  TileClass classify_window(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;
  TileClass classify_documents(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;

  const AttentionMask* mask_;
  int64_t shift_ = 0;   // aligned query position = i + shift_
  int64_t left_ = -1;   // -1 unbounded
  int64_t right_ = -1;  // causal makes this min(window_right, 0)
  bool has_docs_ = false;
  bool dense_ = true;
  bool rows_are_ranges_ = true;
  const int64_t* q_docs_ = nullptr;
  const int64_t* kv_docs_ = nullptr;
  int64_t q_doc_batch_stride_ = 0;  // 0 when ids are shared by all batch entries
  int64_t kv_doc_batch_stride_ = 0;
};

}  // namespace tessel::kernels::attention
