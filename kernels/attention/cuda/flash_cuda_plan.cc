#include "tessel/kernels/attention/cuda/flash_cuda_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/cpu/fork_join.h"

namespace tessel::kernels::attention::cuda {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // CUDA's limit on gridDim.y and gridDim.z
constexpr int64_t kMaxLen = int64_t{1} << 30;

std::string view_reason(const AttentionView& v, const char* name) {
  if (v.strides[3] != 1 && v.head_dim() > 1) {
    return fmt::format("{} has stride {} along D; flash_cuda needs a contiguous last dimension",
                       name, v.strides[3]);
  }
  const auto addr = reinterpret_cast<uintptr_t>(v.data);
  for (int d = 0; d < 3; ++d) {
    if (v.strides[d] % 8 != 0 && v.sizes[d] > 1) {
      return fmt::format(
          "{} has stride {} along dim {}; flash_cuda needs strides that are "
          "multiples of 8 elements (16-byte aligned rows)",
          name, v.strides[d], d);
    }
  }
  if (addr % 16 != 0) {
    return fmt::format(
        "{} starts at an address that is not 16-byte aligned; flash_cuda needs "
        "16-byte aligned rows",
        name);
  }
  return {};
}

// Converts int64 ids to int32, renumbering all of them (q and kv together, so equality is
// kept) when one does not fit.
void document_ids_int32(const std::vector<int64_t>& q, const std::vector<int64_t>& kv,
                        std::vector<int32_t>& q_out, std::vector<int32_t>& kv_out) {
  auto fits = [](const std::vector<int64_t>& ids) {
    return std::all_of(ids.begin(), ids.end(), [](int64_t x) {
      return x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max();
    });
  };
  if (fits(q) && fits(kv)) {
    q_out.assign(q.begin(), q.end());
    kv_out.assign(kv.begin(), kv.end());
    return;
  }
  std::unordered_map<int64_t, int32_t> renumber;
  auto id = [&](int64_t x) {
    return renumber.emplace(x, static_cast<int32_t>(renumber.size())).first->second;
  };
  q_out.clear();
  kv_out.clear();
  for (int64_t x : q) q_out.push_back(id(x));
  for (int64_t x : kv) kv_out.push_back(id(x));
}

TileClass tile_and(TileClass a, TileClass b) {
  if (a == TileClass::kEmpty || b == TileClass::kEmpty) return TileClass::kEmpty;
  if (a == TileClass::kFull && b == TileClass::kFull) return TileClass::kFull;
  return TileClass::kPartial;
}

// Smallest and largest document id of each 64-token tile of each batch entry.
struct DocRanges {
  std::vector<int64_t> lo, hi;  // [b * tiles + t]
  int64_t tiles = 0;

  DocRanges(const std::vector<int64_t>& ids, int64_t batch, int64_t len) {
    tiles = (len + kMaskTile - 1) / kMaskTile;
    const bool shared = static_cast<int64_t>(ids.size()) == len;
    lo.resize(batch * tiles);
    hi.resize(batch * tiles);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t* row = ids.data() + (shared ? 0 : b * len);
      for (int64_t t = 0; t < tiles; ++t) {
        const auto [mn, mx] =
            std::minmax_element(row + t * kMaskTile, row + std::min(len, (t + 1) * kMaskTile));
        lo[b * tiles + t] = *mn;
        hi[b * tiles + t] = *mx;
      }
    }
  }
  // As MaskEvaluator classifies documents: disjoint ranges -> empty, one shared id -> full.
  TileClass classify(const DocRanges& kv, int64_t b, int64_t ti, int64_t tj) const {
    const int64_t q_lo = lo[b * tiles + ti], q_hi = hi[b * tiles + ti];
    const int64_t k_lo = kv.lo[b * kv.tiles + tj], k_hi = kv.hi[b * kv.tiles + tj];
    if (q_hi < k_lo || k_hi < q_lo) return TileClass::kEmpty;
    if (q_lo == q_hi && k_lo == k_hi) return TileClass::kFull;
    return TileClass::kPartial;
  }
};

// The tile map (see flash_cuda_plan.h): window and prefix classes from MaskEvaluator, document
// classes from per-tile id ranges (O(1) per tile), and a predicate evaluated per element.
void build_tile_map(const AttentionProblem& p, MaskPlan& plan) {
  const AttentionMask& m = p.mask;
  const int64_t batch = p.batch(), sq = p.q_len(), sk = p.kv_len();
  const int64_t tq = (sq + kMaskTile - 1) / kMaskTile, tk = (sk + kMaskTile - 1) / kMaskTile;
  const int64_t heads = m.mask_fn ? p.q_heads() : 1;

  AttentionProblem window_prefix;  // the problem's window and prefix parts only
  window_prefix.q = p.q;
  window_prefix.k = p.k;
  window_prefix.v = p.v;
  window_prefix.mask.causal = m.causal;
  window_prefix.mask.alignment = m.alignment;
  window_prefix.mask.window_left = m.window_left;
  window_prefix.mask.window_right = m.window_right;
  window_prefix.mask.prefix_lengths = m.prefix_lengths;
  const MaskEvaluator coarse(window_prefix);
  const MaskEvaluator exact(p);
  const bool docs = m.has_documents();
  const std::vector<int64_t>& kv_ids =
      m.kv_document_ids.empty() ? m.q_document_ids : m.kv_document_ids;
  const DocRanges q_docs(docs ? m.q_document_ids : std::vector<int64_t>(sq), docs ? batch : 1, sq);
  const DocRanges kv_docs(docs ? kv_ids : std::vector<int64_t>(sk), docs ? batch : 1, sk);

  plan.tiles.assign(batch * heads * tq * tk, kTileEmpty);
  // One task per (b, query tile); bits go to per-task lists, numbered once all are done.
  std::vector<std::vector<uint64_t>> task_bits(batch * tq);
  ForkJoin(0).run(batch * tq, [&](int, int64_t task) {
    const int64_t b = task / tq, ti = task % tq;
    const int64_t i0 = ti * kMaskTile, i1 = std::min(sq, i0 + kMaskTile);
    std::vector<uint64_t>& bits = task_bits[task];
    for (int64_t tj = 0; tj < tk; ++tj) {
      const int64_t j0 = tj * kMaskTile, j1 = std::min(sk, j0 + kMaskTile);
      TileClass c = coarse.classify(b, i0, i1, j0, j1);
      if (docs && c != TileClass::kEmpty) c = tile_and(c, q_docs.classify(kv_docs, b, ti, tj));
      for (int64_t hm = 0; hm < heads; ++hm) {
        int32_t& entry = plan.tiles[((b * heads + hm) * tq + ti) * tk + tj];
        if (c == TileClass::kEmpty) {
          entry = kTileEmpty;
        } else if (!m.mask_fn) {
          entry = c == TileClass::kFull ? kTileFull : kTilePartial;
        } else {
          uint64_t words[kMaskTile] = {};
          bool any = false, all = true;
          for (int64_t i = i0; i < i1; ++i) {
            for (int64_t j = j0; j < j1; ++j) {
              const bool vis = exact.visible(b, hm, i, j);
              words[i - i0] |= static_cast<uint64_t>(vis) << (j - j0);
              any |= vis;
              all &= vis;
            }
          }
          if (!any) {
            entry = kTileEmpty;
          } else if (all) {
            entry = kTileFull;
          } else {
            entry = static_cast<int32_t>(bits.size() / kMaskTile);  // task-local for now
            bits.insert(bits.end(), words, words + kMaskTile);
          }
        }
      }
    }
  });
  // Number the bit tiles: task t's local index k becomes offset[t] + k.
  if (m.mask_fn) {
    std::vector<int64_t> offset(batch * tq + 1, 0);
    for (int64_t t = 0; t < batch * tq; ++t) {
      offset[t + 1] = offset[t] + static_cast<int64_t>(task_bits[t].size()) / kMaskTile;
    }
    TESSEL_CHECK(offset.back() <= std::numeric_limits<int32_t>::max(), InvalidArgument,
                 "flash_cuda: the mask predicate leaves {} partial tiles; at most 2^31 fit",
                 offset.back());
    plan.bits.reserve(offset.back() * kMaskTile);
    for (int64_t t = 0; t < batch * tq; ++t) {
      plan.bits.insert(plan.bits.end(), task_bits[t].begin(), task_bits[t].end());
    }
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t hm = 0; hm < heads; ++hm) {
        for (int64_t ti = 0; ti < tq; ++ti) {
          int32_t* row = plan.tiles.data() + ((b * heads + hm) * tq + ti) * tk;
          for (int64_t tj = 0; tj < tk; ++tj) {
            if (row[tj] >= 0) row[tj] += static_cast<int32_t>(offset[b * tq + ti]);
          }
        }
      }
    }
  }
  plan.params.tiles_q = static_cast<int>(tq);
  plan.params.tiles_k = static_cast<int>(tk);
  plan.params.heads = static_cast<int>(heads);
}

}  // namespace

DeviceView device_view(const AttentionView& view) {
  return DeviceView{view.data, view.strides[0], view.strides[1], view.strides[2], view.strides[3]};
}

std::string flash_cuda_layout_reason(const AttentionProblem& p) {
  if (p.q.dtype != DType::kBF16 && p.q.dtype != DType::kF16) {
    return fmt::format("dtype {}; flash_cuda supports bf16 and f16", dtype_name(p.q.dtype));
  }
  const int64_t d = p.head_dim();
  if (d < 8 || d > kMaxHeadDim || d % 8 != 0) {
    return fmt::format(
        "head dim {}; flash_cuda supports head dims 8 to {} that are multiples "
        "of 8 (64 and 128 natively, others zero-padded)",
        d, kMaxHeadDim);
  }
  for (const auto& [view, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}}) {
    std::string why = view_reason(*view, name);
    if (!why.empty()) return why;
  }
  if (p.q_len() >= kMaxLen || p.kv_len() >= kMaxLen) {
    return fmt::format("sequence lengths {} and {}; flash_cuda supports lengths below 2^30",
                       p.q_len(), p.kv_len());
  }
  if (p.batch() > kMaxGridYZ || p.q_heads() > kMaxGridYZ) {
    return fmt::format("batch {} and {} query heads; flash_cuda supports at most {} of each",
                       p.batch(), p.q_heads(), kMaxGridYZ);
  }
  return {};
}

std::string flash_cuda_unsupported_reason(const AttentionProblem& p) {
  if (!p.q.device.is_cuda()) {
    return fmt::format("tensors are on {}; flash_cuda runs CUDA tensors", p.q.device.str());
  }
  return flash_cuda_layout_reason(p);
}

std::string flash_cuda_output_reason(const AttentionView& view, const AttentionView& like,
                                     const char* what) {
  if (view.dtype != like.dtype) {
    return fmt::format("{} has dtype {}; flash_cuda writes {} like the inputs", what,
                       dtype_name(view.dtype), dtype_name(like.dtype));
  }
  return view_reason(view, what);
}

MaskPlan make_mask_plan(const AttentionProblem& p) {
  const AttentionMask& m = p.mask;
  MaskPlan plan;
  MaskParams& mp = plan.params;
  mp.shift =
      m.alignment == MaskAlignment::kBottomRight ? static_cast<int>(p.kv_len() - p.q_len()) : 0;
  mp.left = m.window_left < 0 ? -1 : static_cast<int>(std::min<int64_t>(m.window_left, kMaxLen));
  int64_t right = m.window_right < 0 ? -1 : std::min<int64_t>(m.window_right, kMaxLen);
  if (m.causal) right = right < 0 ? 0 : std::min<int64_t>(right, 0);
  mp.right = static_cast<int>(right);
  // A window that reaches past both sequences bounds nothing (and this keeps the kernels'
  // position arithmetic within int).
  const int64_t reach = p.q_len() + p.kv_len();
  if (mp.left >= reach) mp.left = -1;
  if (mp.right >= reach) mp.right = -1;

  bool any_prefix = false;
  for (int64_t len : m.prefix_lengths) any_prefix |= len > 0;
  if (!any_prefix && !m.has_documents() && !m.mask_fn) return plan;
  build_tile_map(p, plan);
  if (any_prefix) {
    for (int64_t len : m.prefix_lengths) {
      plan.prefix.push_back(static_cast<int32_t>(std::min<int64_t>(len, kMaxLen)));
    }
  }
  if (m.has_documents()) {
    const std::vector<int64_t>& kv =
        m.kv_document_ids.empty() ? m.q_document_ids : m.kv_document_ids;
    document_ids_int32(m.q_document_ids, kv, plan.q_docs, plan.kv_docs);
    mp.q_docs_stride = static_cast<int64_t>(plan.q_docs.size()) == p.q_len() ? 0 : p.q_len();
    mp.kv_docs_stride = static_cast<int64_t>(plan.kv_docs.size()) == p.kv_len() ? 0 : p.kv_len();
  }
  return plan;
}

DropoutParams make_dropout_params(const AttentionProblem& p) {
  DropoutParams d;
  if (p.dropout.p <= 0) return d;
  d.threshold = static_cast<uint32_t>(std::min(std::ldexp(p.dropout.p, 32), 4294967295.0));
  if (d.threshold == 0) d.threshold = 1;
  d.keep_scale = static_cast<float>(1.0 / (1.0 - p.dropout.p));
  // attention_dropout.cc's key and counter words.
  const uint64_t key = p.dropout.seed ^ ((p.dropout.offset >> 32) * 0x9E3779B97F4A7C15ull);
  d.key0 = static_cast<uint32_t>(key);
  d.key1 = static_cast<uint32_t>(key >> 32);
  d.offset = static_cast<uint32_t>(p.dropout.offset);
  return d;
}

int64_t flash_backward_dkdv_workspace_floats(const FlashPlan& plan) {
  const FlashParams& f = plan.params;
  if (f.q_heads == f.kv_heads) return 0;
  return 2 * static_cast<int64_t>(f.batch) * f.q_heads * f.kv_len * plan.kernel_head_dim;
}

FlashPlan make_flash_plan(const AttentionProblem& p) {
  const std::string why = flash_cuda_layout_reason(p);
  TESSEL_CHECK(why.empty(), InvalidArgument, "flash_cuda: {}", why);
  FlashPlan plan;
  plan.elem = p.q.dtype == DType::kBF16 ? Elem::kBf16 : Elem::kF16;
  plan.kernel_head_dim = p.head_dim() <= 64 ? 64 : 128;
  FlashParams& f = plan.params;
  f.q = device_view(p.q);
  f.k = device_view(p.k);
  f.v = device_view(p.v);
  f.batch = static_cast<int>(p.batch());
  f.q_heads = static_cast<int>(p.q_heads());
  f.kv_heads = static_cast<int>(std::max<int64_t>(1, p.kv_heads()));
  f.q_len = static_cast<int>(p.q_len());
  f.kv_len = static_cast<int>(p.kv_len());
  f.head_dim = static_cast<int>(p.head_dim());
  f.scale = static_cast<float>(p.softmax_scale());
  f.scale_log2 = static_cast<float>(p.softmax_scale() * 1.4426950408889634);
  plan.mask = make_mask_plan(p);
  f.mask = plan.mask.params;
  f.dropout = make_dropout_params(p);
  return plan;
}

void set_mask_arrays(MaskParams& m, const MaskPlan& plan, const int32_t* tiles,
                     const uint64_t* bits, const int32_t* prefix, const int32_t* q_docs,
                     const int32_t* kv_docs) {
  m.tiles = plan.tiles.empty() ? nullptr : tiles;
  m.bits = plan.bits.empty() ? nullptr : bits;
  m.prefix = plan.prefix.empty() ? nullptr : prefix;
  m.prefix_count = static_cast<int>(plan.prefix.size());
  m.q_docs = plan.q_docs.empty() ? nullptr : q_docs;
  m.kv_docs = plan.kv_docs.empty() ? nullptr : kv_docs;
}

}  // namespace tessel::kernels::attention::cuda
