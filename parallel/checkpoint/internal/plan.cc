#include "tessel/parallel/checkpoint/internal/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tessel/base/error.h"
#include "tessel/parallel/internal/mesh_util.h"

namespace tessel::checkpoint::internal {
namespace {

int64_t row_major_index(const std::vector<int64_t>& coord, const std::vector<int64_t>& shape) {
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + coord[d];
  return index;
}

void check_savable(const StateTensor& t) {
  for (const Placement& p : t.spec->placements()) {
    TESSEL_CHECK(!p.is_partial(), InvalidArgument,
                 "checkpoint: tensor '{}' is {}: a Partial placement cannot be saved; "
                 "redistribute it to Replicate or Shard first",
                 t.name, t.spec->str());
  }
}

// Adds `box` held by `holder` to `h` (a box seen before gains a holder).
void hold(Holdings* h, Box box, int holder) {
  if (shape_numel(box.sizes) == 0) return;
  const auto it = std::find(h->boxes.begin(), h->boxes.end(), box);
  if (it == h->boxes.end()) {
    h->boxes.push_back(std::move(box));
    h->holders.push_back({holder});
  } else {
    h->holders[static_cast<size_t>(it - h->boxes.begin())].push_back(holder);
  }
}

// The holdings of `t` from its spec alone: its mesh must span the ranks holding it.
Holdings holdings_of(const StateTensor& t, int rank, int world) {
  Holdings h;
  if (t.spec == nullptr) {
    if (t.local.numel() == 0) return h;
    h.boxes.push_back({Shape(t.local.shape().size(), 0), t.local.shape()});
    h.holders.emplace_back();
    for (int r = 0; r < world; ++r) h.holders.back().push_back(r);
    return h;
  }
  check_savable(t);
  const DTensorSpec& spec = *t.spec;
  const DeviceMesh& mesh = spec.mesh();
  const std::vector<int64_t> shape = mesh.shape();
  const std::vector<int> ranks = mesh.ranks();
  const int me = ranks[static_cast<size_t>(row_major_index(mesh.coordinate(), shape))];
  TESSEL_CHECK(me == rank, InvalidArgument,
               "checkpoint: tensor '{}' lives on a mesh that puts this process at world rank {} "
               "but it is rank {} of the checkpoint's group (give the state the group the mesh "
               "was made over)",
               t.name, me, rank);
  for (int64_t i = 0; i < mesh.size(); ++i) {
    const int holder = ranks[static_cast<size_t>(i)];
    TESSEL_CHECK(holder >= 0 && holder < world, InvalidArgument,
                 "checkpoint: tensor '{}' lives on a mesh holding rank {} but the checkpoint's "
                 "group has {} ranks",
                 t.name, holder, world);
    auto [offsets, sizes] = spec.region(tessel::internal::unravel(i, shape));
    hold(&h, Box{std::move(offsets), std::move(sizes)}, holder);
  }
  return h;
}

// The number of dimensions of `t`'s global tensor.
size_t global_ndim(const StateTensor& t) {
  return t.spec ? t.spec->global_shape().size() : t.local.shape().size();
}

uint64_t fnv1a(uint64_t h, std::string_view text) {
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.sizes.push_back(hi - lo);
  }
  return out;
}

std::vector<Box> logical_boxes(const Box& box, const Shape& global, const Shape& logical,
                               const std::string& name) {
  if (logical.empty() || logical == global) return {box};
  // k: the last global dimension folded into logical dimension 0.
  size_t k = 0;
  int64_t folded = global.empty() ? 1 : global[0];
  while (k + 1 < global.size() && folded < logical[0]) folded *= global[++k];
  const bool folds = !global.empty() && folded == logical[0] &&
                     Shape(global.begin() + static_cast<std::ptrdiff_t>(k) + 1, global.end()) ==
                         Shape(logical.begin() + 1, logical.end());
  TESSEL_CHECK(folds, InvalidArgument,
               "checkpoint: tensor '{}' has global shape {} and logical shape {}, which is not "
               "its leading dimensions folded into one",
               name, shape_str(global), shape_str(logical));
  std::vector<Box> out;
  if (shape_numel(box.sizes) == 0) return out;
  std::vector<int64_t> index(k, 0);  // over box dims 0..k-1
  while (true) {
    int64_t row = 0;  // the logical row of (offsets + index, offsets[k])
    for (size_t d = 0; d <= k; ++d) {
      row = row * global[d] + box.offsets[d] + (d < k ? index[d] : 0);
    }
    Box piece{Shape{row}, Shape{box.sizes[k]}};
    piece.offsets.insert(piece.offsets.end(),
                         box.offsets.begin() + static_cast<std::ptrdiff_t>(k) + 1,
                         box.offsets.end());
    piece.sizes.insert(piece.sizes.end(), box.sizes.begin() + static_cast<std::ptrdiff_t>(k) + 1,
                       box.sizes.end());
    out.push_back(std::move(piece));
    size_t d = k;
    while (d > 0 && ++index[d - 1] == box.sizes[d - 1]) index[--d] = 0;
    if (d == 0) return out;
  }
}

std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

bool needs_exchange(const std::vector<StateTensor>& tensors, int world) {
  return std::any_of(tensors.begin(), tensors.end(), [world](const StateTensor& t) {
    return t.spec != nullptr && t.spec->mesh().size() != world;
  });
}

std::vector<int64_t> own_boxes(const std::vector<StateTensor>& tensors) {
  std::vector<int64_t> out;
  for (const StateTensor& t : tensors) {
    if (t.spec == nullptr) {
      out.insert(out.end(), t.local.shape().size(), 0);
      out.insert(out.end(), t.local.shape().begin(), t.local.shape().end());
      continue;
    }
    check_savable(t);
    const auto [offsets, sizes] = t.spec->region(t.spec->mesh().coordinate());
    out.insert(out.end(), offsets.begin(), offsets.end());
    out.insert(out.end(), sizes.begin(), sizes.end());
  }
  return out;
}

std::vector<Holdings> gathered_holdings(const std::vector<StateTensor>& tensors,
                                        const std::vector<int64_t>& all, int world) {
  size_t per_rank = 0;
  for (const StateTensor& t : tensors) per_rank += 2 * global_ndim(t);
  TESSEL_CHECK(all.size() == per_rank * static_cast<size_t>(world), Internal,
               "checkpoint: {} gathered box numbers for {} ranks of {} each", all.size(), world,
               per_rank);
  std::vector<Holdings> out(tensors.size());
  for (int r = 0; r < world; ++r) {
    auto at = all.begin() + static_cast<std::ptrdiff_t>(per_rank * static_cast<size_t>(r));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto n = static_cast<std::ptrdiff_t>(global_ndim(tensors[i]));
      Box box{Shape(at, at + n), Shape(at + n, at + 2 * n)};
      at += 2 * n;
      hold(&out[i], std::move(box), r);
    }
  }
  return out;
}

SavePlan plan_save(const std::vector<StateTensor>& tensors, int rank, int world, bool all_files,
                   const std::vector<Holdings>* holdings) {
  std::vector<TensorInfo> infos;
  std::vector<Holdings> held;
  for (size_t i = 0; i < tensors.size(); ++i) {
    infos.push_back(info_of(tensors[i]));
    held.push_back(holdings ? (*holdings)[i] : holdings_of(tensors[i], rank, world));
  }
  return plan_save(infos, std::move(held), rank, world, all_files);
}

TensorInfo info_of(const StateTensor& t) {
  return {t.name, t.spec ? t.spec->dtype() : t.local.dtype(),
          t.spec ? t.spec->global_shape() : t.local.shape(), t.logical_shape,
          t.spec ? t.spec->str() : "replicated (a plain tensor)"};
}

SavePlan plan_save(const std::vector<TensorInfo>& infos, std::vector<Holdings> holdings, int rank,
                   int world, bool all_files) {
  SavePlan plan;
  std::vector<uint64_t> assigned(static_cast<size_t>(world), 0);  // bytes per writer so far
  std::map<int, std::vector<SafetensorsEntry>> entries;
  for (size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& t = infos[i];
    PlannedTensor p;
    static_cast<TensorInfo&>(p) = t;
    p.boxes = std::move(holdings[i].boxes);
    const std::vector<std::vector<int>>& holders = holdings[i].holders;
    for (size_t b = 0; b < p.boxes.size(); ++b) {
      // The holder with the fewest bytes so far writes it (ties: the lowest rank).
      int writer = holders[b].front();
      for (int h : holders[b]) {
        if (assigned[h] < assigned[writer] || (assigned[h] == assigned[writer] && h < writer)) {
          writer = h;
        }
      }
      assigned[writer] +=
          static_cast<uint64_t>(shape_numel(p.boxes[b].sizes)) * dtype_size(p.dtype);
      p.writers.push_back(writer);
      if (writer == rank) p.mine = static_cast<int>(b);
      if (all_files || writer == rank) {
        entries[writer].push_back({p.name, p.dtype, p.boxes[b].sizes, 0, 0});
      }
    }
    plan.tensors.push_back(std::move(p));
  }
  for (auto& [writer, list] : entries) {
    plan.files.emplace(writer, plan_safetensors(list, {{"format", "tessel-checkpoint-shard"}}));
  }
  return plan;
}

namespace {

void put_text(std::vector<int64_t>* out, std::string_view text) {
  out->push_back(static_cast<int64_t>(text.size()));
  for (size_t at = 0; at < text.size(); at += 8) {
    uint64_t word = 0;
    for (size_t i = 0; i < 8 && at + i < text.size(); ++i) {
      word |= static_cast<uint64_t>(static_cast<unsigned char>(text[at + i])) << (8 * i);
    }
    out->push_back(static_cast<int64_t>(word));
  }
}

void put_shape(std::vector<int64_t>* out, const Shape& shape) {
  out->push_back(static_cast<int64_t>(shape.size()));
  out->insert(out->end(), shape.begin(), shape.end());
}

// Reads what put_text/put_shape wrote; throws Internal past the end.
struct Words {
  const std::vector<int64_t>& words;
  size_t at = 0;
  int64_t next() {
    TESSEL_CHECK(at < words.size(), Internal, "checkpoint: a rank's description is truncated");
    return words[at++];
  }
  std::string text() {
    const auto n = static_cast<size_t>(next());
    std::string out;
    for (size_t i = 0; i < n; i += 8) {
      const auto word = static_cast<uint64_t>(next());
      for (size_t j = 0; j < 8 && i + j < n; ++j) {
        out.push_back(static_cast<char>((word >> (8 * j)) & 0xff));
      }
    }
    return out;
  }
  Shape shape(size_t n) {
    Shape out;
    for (size_t i = 0; i < n; ++i) out.push_back(next());
    return out;
  }
  Shape shape() { return shape(static_cast<size_t>(next())); }
};

}  // namespace

std::vector<int64_t> describe(const std::vector<StateTensor>& tensors) {
  const std::vector<int64_t> boxes = own_boxes(tensors);
  std::vector<int64_t> out = {static_cast<int64_t>(tensors.size())};
  auto box = boxes.begin();
  for (const StateTensor& t : tensors) {
    const TensorInfo info = info_of(t);
    put_text(&out, info.name);
    put_text(&out, info.saved_from);
    out.push_back(static_cast<int64_t>(info.dtype));
    put_shape(&out, info.shape);
    put_shape(&out, info.logical_shape);
    const auto n = static_cast<std::ptrdiff_t>(2 * info.shape.size());  // offsets, sizes
    out.insert(out.end(), box, box + n);
    box += n;
  }
  return out;
}

UnionOfStates union_of(const std::vector<std::vector<int64_t>>& descriptions) {
  UnionOfStates u;
  std::map<std::string, size_t> index;      // name -> position in u
  std::vector<std::vector<int>> described;  // per tensor: the ranks describing it
  for (size_t r = 0; r < descriptions.size(); ++r) {
    const int rank = static_cast<int>(r);
    Words in{descriptions[r]};
    const int64_t count = in.next();
    for (int64_t i = 0; i < count; ++i) {
      TensorInfo info;
      info.name = in.text();
      info.saved_from = in.text();
      info.dtype = static_cast<DType>(in.next());
      info.shape = in.shape();
      info.logical_shape = in.shape();
      Shape offsets = in.shape(info.shape.size());
      Shape sizes = in.shape(info.shape.size());
      const auto [it, added] = index.emplace(info.name, u.infos.size());
      if (added) {
        u.infos.push_back(info);
        u.holdings.emplace_back();
        described.emplace_back();
      }
      const TensorInfo& first = u.infos[it->second];
      TESSEL_CHECK(first.dtype == info.dtype && first.shape == info.shape &&
                       first.logical_shape == info.logical_shape,
                   InvalidArgument,
                   "checkpoint: rank {} holds tensor '{}' as {} (saved as {}) but rank {} as {} "
                   "(saved as {}); every rank holding a tensor must hold the same tensor",
                   described[it->second].front(), info.name,
                   typed_shape_str(first.dtype, first.shape),
                   shape_str(first.logical_shape.empty() ? first.shape : first.logical_shape), rank,
                   typed_shape_str(info.dtype, info.shape),
                   shape_str(info.logical_shape.empty() ? info.shape : info.logical_shape));
      described[it->second].push_back(rank);
      hold(&u.holdings[it->second], Box{std::move(offsets), std::move(sizes)}, rank);
    }
  }
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < u.infos.size(); ++i) {
    const TensorInfo& t = u.infos[i];
    const Holdings& held = u.holdings[i];
    // Every element held once: distinct boxes are disjoint and together as large as the tensor.
    int64_t covered = 0;
    for (size_t a = 0; a < held.boxes.size(); ++a) {
      covered += shape_numel(held.boxes[a].sizes);
      for (size_t b = a + 1; b < held.boxes.size(); ++b) {
        TESSEL_CHECK(!intersect(held.boxes[a], held.boxes[b]), InvalidArgument,
                     "checkpoint: tensor '{}' is held in overlapping pieces (offsets {} sizes {} "
                     "on rank {}, offsets {} sizes {} on rank {}); its holders disagree on how "
                     "it is sharded",
                     t.name, shape_str(held.boxes[a].offsets), shape_str(held.boxes[a].sizes),
                     held.holders[a].front(), shape_str(held.boxes[b].offsets),
                     shape_str(held.boxes[b].sizes), held.holders[b].front());
      }
    }
    TESSEL_CHECK(covered == shape_numel(t.shape), InvalidArgument,
                 "checkpoint: {} of the {} elements of tensor '{}' ({}) are held by no rank "
                 "(it is held by rank {}); every element of a saved tensor must be held by some "
                 "rank",
                 shape_numel(t.shape) - covered, shape_numel(t.shape), t.name,
                 typed_shape_str(t.dtype, t.shape), fmt::join(described[i], ", "));
    h = fnv1a(h, fmt::format("{}|{}|{}|{}", t.name, typed_shape_str(t.dtype, t.shape),
                             shape_str(t.logical_shape), held.boxes.size()));
  }
  u.digest = h;
  return u;
}

CheckpointMetadata metadata_of(const SavePlan& plan, int64_t step, int world) {
  CheckpointMetadata m;
  m.step = step;
  m.world_size = world;
  std::map<int, std::map<std::string, const SafetensorsEntry*>> by_file;
  for (const auto& [writer, layout] : plan.files) {
    m.files[shard_file_name(writer)] = layout.file_bytes;
    for (const SafetensorsEntry& e : layout.entries) by_file[writer][e.name] = &e;
  }
  for (const PlannedTensor& p : plan.tensors) {
    TensorRecord t{p.dtype, p.logical_shape.empty() ? p.shape : p.logical_shape, p.saved_from, {}};
    for (size_t b = 0; b < p.boxes.size(); ++b) {
      const SafetensorsEntry* e = by_file.at(p.writers[b]).at(p.name);
      // A folded tensor's box is several logical boxes, back to back in the file's entry.
      uint64_t at = e->begin;
      for (Box& piece : logical_boxes(p.boxes[b], p.shape, p.logical_shape, p.name)) {
        const uint64_t bytes =
            static_cast<uint64_t>(shape_numel(piece.sizes)) * dtype_size(p.dtype);
        t.shards.push_back({std::move(piece.offsets), std::move(piece.sizes),
                            shard_file_name(p.writers[b]), at, at + bytes});
        at += bytes;
      }
    }
    m.tensors.emplace(p.name, std::move(t));
  }
  return m;
}

std::vector<ByteRun> runs_of(const Box& shard, uint64_t begin, size_t element_size,
                             const Box& box) {
  const size_t n = shard.sizes.size();
  std::vector<ByteRun> runs;
  if (shape_numel(box.sizes) == 0) return runs;
  if (n == 0) return {{begin, 0, element_size}};
  const Strides strides = contiguous_strides(shard.sizes);
  // Dimensions after k are whole in the box, so each run spans box.sizes[k] of them.
  size_t k = n - 1;
  while (k > 0 && box.sizes[k] == shard.sizes[k]) --k;
  const uint64_t run_elements = static_cast<uint64_t>(box.sizes[k] * strides[k]);
  const uint64_t run_bytes = run_elements * element_size;
  std::vector<int64_t> index(k, 0);  // over the box's dimensions before k
  uint64_t buffer_offset = 0;
  while (true) {
    int64_t element = 0;
    for (size_t d = 0; d <= k; ++d) {
      const int64_t at = box.offsets[d] - shard.offsets[d] + (d < k ? index[d] : 0);
      element += at * strides[d];
    }
    runs.push_back(
        {begin + static_cast<uint64_t>(element) * element_size, buffer_offset, run_bytes});
    buffer_offset += run_bytes;
    size_t d = k;
    while (d > 0) {
      --d;
      if (++index[d] < box.sizes[d]) break;
      index[d] = 0;
      if (d == 0) return runs;
    }
    if (k == 0) return runs;
  }
}

uint64_t state_digest(const CheckpointState& state) {
  uint64_t h = 14695981039346656037ull;
  for (const StateTensor& t : state.tensors()) {
    h = fnv1a(h, t.name);
    if (t.spec) {
      h = fnv1a(h, t.spec->str());
      h = fnv1a(h, fmt::format("{}|{}", fmt::join(t.spec->shard_order(), ","),
                               shape_str(t.logical_shape)));
    } else {
      h = fnv1a(h, typed_shape_str(t.local.dtype(), t.local.shape()));
    }
  }
  for (const auto& [name, gen] : state.generators()) h = fnv1a(h, "gen:" + name);
  for (const auto& [name, opt] : state.optimizers()) h = fnv1a(h, "optim:" + name);
  return h;
}

}  // namespace tessel::checkpoint::internal
