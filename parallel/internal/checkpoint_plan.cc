#include "tessel/parallel/internal/checkpoint_plan.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/base/error.h"
#include "tessel/parallel/internal/mesh_util.h"

namespace tessel::checkpoint::internal {
namespace {

int64_t row_major_index(const std::vector<int64_t>& coord, const std::vector<int64_t>& shape) {
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + coord[d];
  return index;
}

// Every distinct non-empty box of `t` with the group ranks holding it, in first-seen order.
void boxes_of(const StateTensor& t, int rank, int world, std::vector<Box>* boxes,
              std::vector<std::vector<int>>* holders) {
  if (t.spec == nullptr) {
    if (t.local.numel() == 0) return;
    boxes->push_back({Shape(t.local.shape().size(), 0), t.local.shape()});
    holders->emplace_back();
    for (int r = 0; r < world; ++r) holders->back().push_back(r);
    return;
  }
  const DTensorSpec& spec = *t.spec;
  for (const Placement& p : spec.placements()) {
    TESSEL_CHECK(!p.is_partial(), InvalidArgument,
                 "checkpoint: tensor '{}' is {}: a Partial placement cannot be saved; "
                 "redistribute it to Replicate or Shard first",
                 t.name, spec.str());
  }
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
    if (shape_numel(sizes) == 0) continue;
    Box box{std::move(offsets), std::move(sizes)};
    const auto it = std::find(boxes->begin(), boxes->end(), box);
    if (it == boxes->end()) {
      boxes->push_back(std::move(box));
      holders->push_back({holder});
    } else {
      (*holders)[static_cast<size_t>(it - boxes->begin())].push_back(holder);
    }
  }
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

std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

SavePlan plan_save(const std::vector<StateTensor>& tensors, int rank, int world, bool all_files) {
  SavePlan plan;
  std::vector<uint64_t> assigned(static_cast<size_t>(world), 0);  // bytes per writer so far
  std::map<int, std::vector<SafetensorsEntry>> entries;
  for (const StateTensor& t : tensors) {
    PlannedTensor p;
    p.name = t.name;
    p.dtype = t.spec ? t.spec->dtype() : t.local.dtype();
    p.shape = t.spec ? t.spec->global_shape() : t.local.shape();
    p.saved_from = t.spec ? t.spec->str() : "replicated (a plain tensor)";
    std::vector<std::vector<int>> holders;
    boxes_of(t, rank, world, &p.boxes, &holders);
    for (size_t b = 0; b < p.boxes.size(); ++b) {
      // The holder with the fewest bytes so far writes it (ties: the lowest rank).
      int writer = holders[b].front();
      for (int h : holders[b]) {
        if (assigned[h] < assigned[writer] || (assigned[h] == assigned[writer] && h < writer)) {
          writer = h;
        }
      }
      assigned[writer] += static_cast<uint64_t>(shape_numel(p.boxes[b].sizes)) * dtype_size(p.dtype);
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
    TensorRecord t{p.dtype, p.shape, p.saved_from, {}};
    for (size_t b = 0; b < p.boxes.size(); ++b) {
      const SafetensorsEntry* e = by_file.at(p.writers[b]).at(p.name);
      t.shards.push_back({p.boxes[b].offsets, p.boxes[b].sizes, shard_file_name(p.writers[b]),
                          e->begin, e->end});
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
    runs.push_back({begin + static_cast<uint64_t>(element) * element_size, buffer_offset,
                    run_bytes});
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
                               fmt::join(t.spec->mesh().ranks(), ",")));
    } else {
      h = fnv1a(h, typed_shape_str(t.local.dtype(), t.local.shape()));
    }
  }
  for (const auto& [name, gen] : state.generators()) h = fnv1a(h, "gen:" + name);
  for (const auto& [name, opt] : state.optimizers()) h = fnv1a(h, "optim:" + name);
  return h;
}

}  // namespace tessel::checkpoint::internal
