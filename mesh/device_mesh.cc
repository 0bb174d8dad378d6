#include "tessel/mesh/device_mesh.h"

#include <mutex>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/init.h"

namespace tessel {

struct DeviceMesh::State {
  std::mutex mutex;
  std::shared_ptr<ProcessGroup> world;  // guarded by mutex; null once released
  int world_rank = 0;
  std::vector<int> world_ranks;  // global rank of each world group rank
  DeviceMeshOptions options;
  // Groups by the canonical modes of the dimension they run along.
  std::map<std::vector<std::pair<int64_t, int64_t>>, std::shared_ptr<ProcessGroup>> groups;
  int64_t splits = 0;
};

namespace {

std::vector<std::pair<int64_t, int64_t>> cache_key(const MeshDim& dim) {
  std::vector<std::pair<int64_t, int64_t>> key;
  for (const MeshMode& m : dim.canonical_modes()) key.emplace_back(m.size, m.stride);
  return key;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return out + ")";
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, const std::vector<int64_t>& shape,
                       const std::vector<std::string>& names, DeviceMeshOptions options)
    : layout_(MeshLayout::row_major(shape, names)) {
  TESSEL_CHECK(world != nullptr, InvalidArgument, "init_device_mesh needs a world group");
  TESSEL_CHECK(layout_.root_size() == world->size(), InvalidArgument,
               "mesh shape {} has {} ranks but the world has {}", shape_text(shape),
               layout_.root_size(), world->size());
  for (const auto& [dim, timeout] : options.timeouts) {
    layout_.dim_index(dim);  // throws, naming the mesh's dimensions
    TESSEL_CHECK(timeout >= Nanoseconds::zero(), InvalidArgument,
                 "timeout for mesh dimension '{}' is negative", dim);
  }
  for (const auto& [dim, parent] : options.parents) {
    layout_.dim_index(dim);
    TESSEL_CHECK(
        parent != nullptr && parent->size() == world->size() && parent->rank() == world->rank(),
        InvalidArgument,
        "parent group for mesh dimension '{}' must have the world's size {} and rank {}", dim,
        world->size(), world->rank());
  }
  state_ = std::make_shared<State>();
  state_->world_rank = world->rank();
  state_->world_ranks = world->global_ranks();
  state_->options = std::move(options);
  state_->world = std::move(world);
  if (state_->options.eager) {
    groups();
    if (state_->options.release_world) {
      std::lock_guard lock(state_->mutex);
      state_->world.reset();
    }
  }
}

DeviceMesh::DeviceMesh(std::shared_ptr<State> state, MeshLayout layout)
    : state_(std::move(state)), layout_(std::move(layout)) {}

int64_t DeviceMesh::size() const {
  int64_t n = 1;
  for (int64_t s : layout_.shape()) n *= s;
  return n;
}

int64_t DeviceMesh::size(const std::string& dim) const { return layout_.dim(dim).size(); }

std::vector<int64_t> DeviceMesh::coordinate() const {
  const int64_t me = state_->world_rank;
  return *layout_.coordinate(me, layout_.origin_of(me));
}

int64_t DeviceMesh::local_rank(const std::string& dim) const {
  return MeshLayout::membership(layout_.dim(dim), state_->world_rank).key;
}

int64_t DeviceMesh::local_rank() const {
  TESSEL_CHECK(ndim() == 1, InvalidArgument,
               "local_rank() without a dimension needs a 1-D mesh; this one is {}", str());
  return local_rank(layout_.dims()[0].name);
}

std::vector<int> DeviceMesh::ranks() const {
  std::vector<int64_t> offsets = {layout_.origin_of(state_->world_rank)};
  for (const MeshDim& d : layout_.dims()) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(d.size()));
    for (int64_t base : offsets) {
      for (int64_t o : d.offsets()) next.push_back(base + o);
    }
    offsets = std::move(next);
  }
  std::vector<int> out;
  out.reserve(offsets.size());
  for (int64_t o : offsets) out.push_back(state_->world_ranks[static_cast<size_t>(o)]);
  return out;
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& dims) const {
  return DeviceMesh(state_, layout_.slice(dims));
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& dims,
                               const std::string& name) const {
  return DeviceMesh(state_, layout_.flatten(dims, name));
}

DeviceMesh DeviceMesh::unflatten(const std::string& dim, const std::vector<int64_t>& sizes,
                                 const std::vector<std::string>& names) const {
  return DeviceMesh(state_, layout_.unflatten(dim, sizes, names));
}

DeviceMesh DeviceMesh::join(const DeviceMesh& other) const {
  TESSEL_CHECK(state_ == other.state_, InvalidArgument,
               "join of {} with {}: the meshes belong to different families (join views of one "
               "init_device_mesh)",
               str(), other.str());
  return DeviceMesh(state_, layout_.join(other.layout_));
}

std::shared_ptr<ProcessGroup> DeviceMesh::group(const std::string& dim) const {
  const MeshDim& d = layout_.dim(dim);
  const auto key = cache_key(d);
  std::lock_guard lock(state_->mutex);
  if (auto it = state_->groups.find(key); it != state_->groups.end()) return it->second;

  const DeviceMeshOptions& options = state_->options;
  std::shared_ptr<ProcessGroup> parent = state_->world;
  if (auto it = options.parents.find(dim); it != options.parents.end()) parent = it->second;
  TESSEL_CHECK(parent != nullptr, InvalidArgument,
               "mesh dimension '{}' has no group yet and the world group was released "
               "(DeviceMeshOptions::release_world); create groups eagerly or keep the world",
               dim);
  SplitOptions split_options;
  split_options.name = dim;
  if (auto it = options.timeouts.find(dim); it != options.timeouts.end()) {
    split_options.timeout = it->second;
  }
  const auto membership = MeshLayout::membership(d, state_->world_rank);
  // Every rank knows its group from the layout, so the split needs no colour exchange.
  for (int64_t o : d.offsets()) {
    split_options.members.push_back(static_cast<int>(membership.color + o));
  }
  auto g = parent->split(static_cast<int>(membership.color), static_cast<int>(membership.key),
                         split_options);
  TESSEL_CHECK(g != nullptr && g->size() == d.size() && g->rank() == membership.key, Internal,
               "split for mesh dimension '{}' gave a group of size {} rank {}; expected size {} "
               "rank {}",
               dim, g ? g->size() : 0, g ? g->rank() : -1, d.size(), membership.key);
  ++state_->splits;
  log_debug(LogComponent::kMesh, "made group '{}' ({} ranks) by split #{}", dim, g->size(),
            state_->splits);
  state_->groups.emplace(key, g);
  return g;
}

std::shared_ptr<ProcessGroup> DeviceMesh::group() const {
  TESSEL_CHECK(ndim() == 1, InvalidArgument,
               "group() without a dimension needs a 1-D mesh; this one is {}", str());
  return group(layout_.dims()[0].name);
}

std::vector<std::shared_ptr<ProcessGroup>> DeviceMesh::groups() const {
  std::vector<std::shared_ptr<ProcessGroup>> out;
  for (const MeshDim& d : layout_.dims()) out.push_back(group(d.name));
  return out;
}

int64_t DeviceMesh::splits_made() const {
  std::lock_guard lock(state_->mutex);
  return state_->splits;
}

void DeviceMesh::abort(const std::string& reason) const {
  std::lock_guard lock(state_->mutex);
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (auto& [key, g] : state_->groups) groups.push_back(g);
  for (auto& [dim, parent] : state_->options.parents) groups.push_back(parent);
  groups.push_back(state_->world);
  // All at once: NCCL raises every communicator's abort flag before tearing any down.
  ProcessGroup::abort_together(groups, reason);
}

void DeviceMesh::destroy(Nanoseconds timeout) const {
  std::shared_ptr<ProcessGroup> world;
  {
    std::lock_guard lock(state_->mutex);
    world = state_->world;
  }
  if (world) {
    try {
      BarrierOptions options;
      options.timeout = timeout;
      world->barrier(options).wait();
    } catch (const Error& e) {
      abort(fmt::format("DeviceMesh::destroy: {}", e.what()));
      std::lock_guard lock(state_->mutex);
      state_->groups.clear();
      state_->world.reset();
      throw;
    }
  }
  std::lock_guard lock(state_->mutex);
  state_->groups.clear();
  state_->world.reset();
}

std::string DeviceMesh::str() const {
  const auto coord = coordinate();
  std::string dims;
  for (const auto& n : layout_.names()) dims += (dims.empty() ? "" : ", ") + n;
  return fmt::format("DeviceMesh(shape={}, dims=({}), rank {} at {})", shape_text(layout_.shape()),
                     dims, state_->world_ranks[static_cast<size_t>(state_->world_rank)],
                     shape_text(coord));
}

DeviceMesh init_device_mesh(std::shared_ptr<ProcessGroup> world, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& names, DeviceMeshOptions options) {
  return DeviceMesh(std::move(world), shape, names, std::move(options));
}

DeviceMesh init_device_mesh(Device device, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& names, DeviceMeshOptions options) {
  if (device.is_cuda() && !options.keep_world) {
    options.eager = true;
    options.release_world = true;
  }
  InitOptions init;
  init.device = device;
  return DeviceMesh(init_process_group(init), shape, names, std::move(options));
}

}  // namespace tessel
