#include "tessel/parallel/checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <random>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/process_group.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/parallel/checkpoint/internal/files.h"
#include "tessel/parallel/checkpoint/internal/plan.h"
#include "tessel/parallel/checkpoint/internal/reader.h"
#include "tessel/parallel/checkpoint/metadata.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/internal/host_collectives.h"
#include "tessel/parallel/internal/state_dict_shape.h"
#include "tessel/tensor/ops.h"

namespace tessel::checkpoint {

namespace fs = std::filesystem;
using internal::Box;
using internal::fault_point;
using internal::Holdings;

namespace {

constexpr std::string_view kReservedPrefix = "tessel.";
constexpr std::string_view kStepPrefix = "step_";

std::string step_count_key(const std::string& optimizer) {
  return fmt::format("tessel.optimizer.{}.step_count", optimizer);
}

std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// --- Collectives over an optional group (null: this process alone) ----------------------------

std::vector<int64_t> all_gather(ProcessGroup* group, const std::vector<int64_t>& mine,
                                Nanoseconds timeout) {
  if (group == nullptr) return mine;
  return tessel::internal::all_gather_values(*group, mine, timeout);
}

int64_t broadcast(ProcessGroup* group, int64_t value, Nanoseconds timeout) {
  if (group == nullptr) return value;
  return tessel::internal::broadcast_value(*group, value, 0, timeout);
}

// Every rank's ok flag (1/0); throws on every rank when one failed: the failing rank rethrows
// its own error, the others one of `kind` saying "<what> failed on rank R (see its error);
// <consequence>".
void agree(ProcessGroup* group, const std::exception_ptr& error, Nanoseconds timeout,
           ErrorKind kind, const std::string& what, std::string_view consequence) {
  const std::vector<int64_t> flags = all_gather(group, {error ? 0 : 1}, timeout);
  if (error) std::rethrow_exception(error);
  std::vector<int> failed;
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r] == 0) failed.push_back(static_cast<int>(r));
  }
  if (!failed.empty()) {
    throw_error(kind, fmt::format("{} failed on rank {} (see its error); {}", what,
                                  fmt::join(failed, ", "), consequence));
  }
}

// --- Saving ------------------------------------------------------------------------------------

// A staging buffer reused from save to save (fresh pages cost a fault each).
struct Staging {
  std::unique_ptr<std::byte[]> data;
  size_t capacity = 0;
  std::byte* reserve(size_t bytes) {
    if (bytes > capacity) {
      data.reset(new std::byte[bytes]);
      capacity = bytes;
    }
    return data.get();
  }
};

// What one rank writes: its file as a list of byte ranges in file order (the header, then its
// boxes by name), its generator states, and on rank 0 the checkpoint's metadata (without the
// other ranks' generator states). A copied snapshot (async saves) holds the bytes in a staging
// buffer; otherwise the ranges point into the live tensors, kept in `tensors`.
struct Snapshot {
  int rank = 0;
  int world = 1;
  uint64_t digest = 0;
  bool writes = false;                     // this rank writes a file
  std::span<const std::byte> image;        // a copied snapshot: the whole file
  std::string header;                      // otherwise: the header, then
  std::vector<Tensor> tensors;             // the boxes' tensors (contiguous, on the CPU)
  std::vector<uint64_t> generator_states;  // (seed, offset) per generator
  std::vector<std::string> generator_names;
  CheckpointMetadata meta;

  std::vector<std::span<const std::byte>> file() const {
    if (!image.empty()) return {image};
    std::vector<std::span<const std::byte>> pieces = {
        std::as_bytes(std::span(header.data(), header.size()))};
    for (const Tensor& t : tensors) {
      pieces.emplace_back(static_cast<const std::byte*>(t.data_ptr()), t.nbytes());
    }
    return pieces;
  }
};

// Generator and optimizer names, which every rank must share even when its tensors differ.
uint64_t shared_digest(const CheckpointState& state) {
  CheckpointState names(state.group());
  for (const auto& [name, gen] : state.generators()) names.add_generator(name, *gen);
  return internal::state_digest(names) ^ std::hash<size_t>{}(state.optimizers().size());
}

// The save plan of a state whose ranks hold different tensors: every rank's description of its
// tensors, gathered (lengths first), and their union.
internal::SavePlan plan_of_union(const CheckpointState& state, Snapshot& s, Nanoseconds timeout) {
  ProcessGroup* group = state.group().get();
  const std::vector<int64_t> mine = internal::describe(state.tensors());
  const std::vector<int64_t> heads = all_gather(
      group, {static_cast<int64_t>(mine.size()), static_cast<int64_t>(shared_digest(state))},
      timeout);
  size_t longest = 0;
  for (size_t r = 0; r < heads.size() / 2; ++r) {
    TESSEL_CHECK(heads[2 * r + 1] == heads[1], InvalidArgument,
                 "checkpoint: rank {} saves other generators or optimizers than rank 0; every "
                 "rank must add the same ones (its tensors may differ)",
                 r);
    longest = std::max(longest, static_cast<size_t>(heads[2 * r]));
  }
  std::vector<int64_t> padded = mine;
  padded.resize(longest, 0);
  const std::vector<int64_t> all = all_gather(group, padded, timeout);
  std::vector<std::vector<int64_t>> descriptions;
  for (size_t r = 0; r < heads.size() / 2; ++r) {
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(r * longest);
    descriptions.emplace_back(begin, begin + heads[2 * r]);
  }
  internal::UnionOfStates u = internal::union_of(descriptions);
  s.digest = u.digest ^ static_cast<uint64_t>(heads[1]);
  return internal::plan_save(u.infos, std::move(u.holdings), s.rank, s.world, s.rank == 0);
}

// The save plan of `state` on this rank. When a DTensor lives on a sub-mesh of the group, every
// rank's own boxes are exchanged over the state's group (after a check that every rank saves the
// same state, so the exchange cannot be mismatched).
// A state whose ranks hold different tensors exchanges every rank's description instead, and
// its digest becomes the union's (checked again at the commit).
internal::SavePlan plan_of(const CheckpointState& state, Snapshot& s, Nanoseconds timeout) {
  const bool all_files = s.rank == 0;
  if (state.ranks_hold_different_tensors) return plan_of_union(state, s, timeout);
  if (!internal::needs_exchange(state.tensors(), s.world)) {
    return internal::plan_save(state.tensors(), s.rank, s.world, all_files);
  }
  ProcessGroup* group = state.group().get();
  const std::vector<int64_t> digests = all_gather(group, {static_cast<int64_t>(s.digest)}, timeout);
  for (size_t r = 1; r < digests.size(); ++r) {
    TESSEL_CHECK(digests[r] == digests[0], InvalidArgument,
                 "checkpoint: rank {} saves another state than rank 0 (tensor names, shapes, "
                 "dtypes, specs or generators differ); every rank must save the same state",
                 r);
  }
  const std::vector<Holdings> holdings = internal::gathered_holdings(
      state.tensors(), all_gather(group, internal::own_boxes(state.tensors()), timeout), s.world);
  return internal::plan_save(state.tensors(), s.rank, s.world, all_files, &holdings);
}

// `staging`: copy this rank's share there (async saves); null: point into the live tensors.
Snapshot make_snapshot(const CheckpointState& state, Staging* staging, Nanoseconds timeout) {
  ProcessGroup* group = state.group().get();
  Snapshot s;
  s.rank = group ? group->rank() : 0;
  s.world = group ? group->size() : 1;
  s.digest = internal::state_digest(state);
  for (const auto& [key, value] : state.metadata) {
    TESSEL_CHECK(!key.starts_with(kReservedPrefix), InvalidArgument,
                 "checkpoint: metadata key '{}' uses the reserved prefix '{}'", key,
                 kReservedPrefix);
  }
  const internal::SavePlan plan = plan_of(state, s, timeout);
  if (const auto file = plan.files.find(s.rank); file != plan.files.end()) {
    const SafetensorsLayout& layout = file->second;
    std::map<std::string_view, size_t> index;  // tensor name -> position in the state
    for (size_t i = 0; i < state.tensors().size(); ++i) index[state.tensors()[i].name] = i;
    s.writes = true;
    std::byte* image = staging ? staging->reserve(layout.file_bytes) : nullptr;
    if (image) {
      std::memcpy(image, layout.header.data(), layout.header.size());
      s.image = {image, layout.file_bytes};
    } else {
      s.header = layout.header;
    }
    for (const SafetensorsEntry& e : layout.entries) {  // in file order
      const Tensor& local = state.tensors()[index.at(e.name)].local;
      TESSEL_CHECK(local.nbytes() == e.end - e.begin, Internal,
                   "checkpoint: tensor '{}' holds {} bytes but its box needs {}", e.name,
                   local.nbytes(), e.end - e.begin);
      Tensor host =
          local.device().is_cpu() ? contiguous(local) : to(contiguous(local), Device::cpu());
      if (host.nbytes() == 0) continue;
      if (image) {
        std::memcpy(image + e.begin, host.data_ptr(), host.nbytes());
      } else {
        s.tensors.push_back(std::move(host));
      }
    }
  }
  for (const auto& [name, gen] : state.generators()) {
    s.generator_names.push_back(name);
    s.generator_states.push_back(gen->seed());
    s.generator_states.push_back(gen->offset());
  }
  if (s.rank == 0) {
    s.meta = internal::metadata_of(plan, state.step, s.world);
    s.meta.metadata = state.metadata;
    for (const auto& [prefix, opt] : state.optimizers()) {
      s.meta.metadata[step_count_key(prefix)] = std::to_string(opt->step_count());
    }
  }
  return s;
}

std::string parent_of(const std::string& dir) {
  const fs::path parent = fs::path(dir).parent_path();
  return parent.empty() ? "." : parent.string();
}

// The hidden temporary and trash names of `dir` ("/r/.step_00000100.tmp-<nonce>").
std::string hidden_name(const std::string& dir, std::string_view kind, uint64_t nonce) {
  return fmt::format("{}/.{}.{}-{:016x}", parent_of(dir), fs::path(dir).filename().string(), kind,
                     nonce);
}

// Removes the temporary and trash folders in `parent` whose names start with `prefix`: what
// crashed saves left behind (rank 0, while no save of this job is in flight).
void remove_leftovers(const std::string& parent, const std::string& prefix) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(prefix) &&
        (name.find(".tmp-") != std::string::npos || name.find(".trash-") != std::string::npos)) {
      internal::remove_tree(entry.path().string());
    }
  }
}

uint64_t random_nonce() {
  std::random_device device;
  uint64_t n = 0;
  while (n == 0) n = (static_cast<uint64_t>(device()) << 32 | device()) >> 1;
  return n;
}

// The commit protocol (docs/parallel.md, "Checkpoints"). Every step after the first is bounded
// by `timeout`, so a dead or hung rank fails the save everywhere instead of blocking it.
void commit(Snapshot& s, ProcessGroup* group, const std::string& dir, Nanoseconds timeout) {
  fault_point("commit.begin");
  // 1. The plan is computed from the specs on every rank: they must agree.
  const std::vector<int64_t> digests = all_gather(group, {static_cast<int64_t>(s.digest)}, timeout);
  for (size_t r = 1; r < digests.size(); ++r) {
    TESSEL_CHECK(digests[r] == digests[0], InvalidArgument,
                 "checkpoint {}: rank {} saves another state than rank 0 (tensor names, "
                 "shapes, dtypes, specs or generators differ); every rank must save the same "
                 "state",
                 dir, r);
  }
  // 2. Rank 0 clears what crashed saves left and makes the temporary folder; its nonce (0: it
  // failed) names the folder for everyone.
  std::exception_ptr error;
  int64_t nonce = 0;
  if (s.rank == 0) {
    try {
      fs::create_directories(parent_of(dir));
      remove_leftovers(parent_of(dir), "." + fs::path(dir).filename().string() + ".");
      const uint64_t n = random_nonce();
      fs::create_directory(hidden_name(dir, "tmp", n));
      nonce = static_cast<int64_t>(n);
    } catch (const fs::filesystem_error& e) {
      error = std::make_exception_ptr(IoError(
          fmt::format("checkpoint {}: cannot make its temporary folder: {}", dir, e.what())));
    } catch (...) {
      error = std::current_exception();
    }
  }
  nonce = broadcast(group, nonce, timeout);
  if (nonce == 0) {
    if (error) std::rethrow_exception(error);
    throw IoError(
        fmt::format("checkpoint {}: rank 0 could not make the temporary folder (see "
                    "its error); nothing was written",
                    dir));
  }
  const std::string tmp = hidden_name(dir, "tmp", static_cast<uint64_t>(nonce));
  // 3. Each rank writes and fsyncs its file.
  try {
    fault_point("write.begin");
    if (s.writes) {
      internal::write_file_durably(tmp + "/" + internal::shard_file_name(s.rank), s.file());
    }
    fault_point("write.end");
  } catch (...) {
    error = std::current_exception();
  }
  // 4. Every rank reports, with its generator states.
  std::vector<int64_t> report = {error ? 0 : 1};
  for (uint64_t v : s.generator_states) report.push_back(static_cast<int64_t>(v));
  const std::vector<int64_t> reports = all_gather(group, report, timeout);
  std::vector<int> failed;
  for (int r = 0; r < s.world; ++r) {
    if (reports[static_cast<size_t>(r) * report.size()] == 0) failed.push_back(r);
  }
  if (!failed.empty()) {
    if (s.rank == 0) internal::remove_tree(tmp);
    if (error) std::rethrow_exception(error);
    throw IoError(
        fmt::format("checkpoint {}: rank {} could not write its shards (see its "
                    "error); nothing was committed",
                    dir, fmt::join(failed, ", ")));
  }
  // 5. Rank 0 writes the metadata and renames the folder into place: the commit.
  int64_t committed = 1;
  if (s.rank == 0) {
    try {
      for (size_t g = 0; g < s.generator_names.size(); ++g) {
        auto& states = s.meta.generators[s.generator_names[g]];
        for (int r = 0; r < s.world; ++r) {
          const size_t at = static_cast<size_t>(r) * report.size() + 1 + 2 * g;
          states.emplace_back(static_cast<uint64_t>(reports[at]),
                              static_cast<uint64_t>(reports[at + 1]));
        }
      }
      fault_point("metadata.begin");
      const std::string json = s.meta.to_json();
      const std::span<const std::byte> bytes = std::as_bytes(std::span(json.data(), json.size()));
      internal::write_file_durably(tmp + "/" + kMetadataFileName, {&bytes, 1});
      internal::fsync_dir(tmp);
      fault_point("rename.begin");
      internal::replace_dir(tmp, dir);
      fault_point("rename.end");
    } catch (...) {
      error = std::current_exception();
      committed = 0;
      try {
        if (fs::exists(tmp)) internal::remove_tree(tmp);
      } catch (const Error& e) {
        log_warn(LogComponent::kParallel, "checkpoint {}: {}", dir, e.what());
      }
    }
  }
  committed = broadcast(group, committed, timeout);
  if (committed == 0) {
    if (error) std::rethrow_exception(error);
    throw IoError(fmt::format("checkpoint {}: rank 0 could not commit it (see its error)", dir));
  }
}

// --- Loading -----------------------------------------------------------------------------------

// The box of `t` this rank holds: its spec's region, or the whole tensor.
Box box_of(const StateTensor& t) {
  if (t.spec == nullptr) return {Shape(t.local.shape().size(), 0), t.local.shape()};
  for (const Placement& p : t.spec->placements()) {
    TESSEL_CHECK(!p.is_partial(), InvalidArgument,
                 "checkpoint: cannot load into tensor '{}' ({}): a Partial placement has no "
                 "single value per element; load it Replicate or Shard and redistribute",
                 t.name, t.spec->str());
  }
  return {t.spec->local_offset(), t.spec->local_shape()};
}

// The boxes of `t` this rank holds in the shape it is saved in, each with the view of the local
// tensor holding it (one box unless `t` is folded: see StateTensor::logical_shape).
std::vector<std::pair<Box, Tensor>> logical_pieces(const StateTensor& t) {
  const Box box = box_of(t);
  const Shape& global = t.spec ? t.spec->global_shape() : t.local.shape();
  std::vector<Box> boxes = internal::logical_boxes(box, global, t.logical_shape, t.name);
  std::vector<std::pair<Box, Tensor>> out;
  if (boxes.size() == 1 && boxes[0] == box) {
    out.emplace_back(box, t.local);
    return out;
  }
  // The local tensor's first `folded` dims index the pieces in row-major order.
  const size_t folded = boxes.empty() ? 0 : box.sizes.size() - boxes[0].sizes.size();
  for (size_t i = 0; i < boxes.size(); ++i) {
    Tensor view = t.local;
    int64_t rest = static_cast<int64_t>(i);
    std::vector<int64_t> index(folded);
    for (size_t d = folded; d-- > 0;) {
      index[d] = rest % box.sizes[d];
      rest /= box.sizes[d];
    }
    for (int64_t at : index) view = select(view, 0, at);
    out.emplace_back(std::move(boxes[i]), std::move(view));
  }
  return out;
}

// Checks everything a load needs before anything is written: the tensors, their files, the
// generators and step counts. Returns each generator's (seed, offset) for this rank.
std::vector<std::pair<uint64_t, uint64_t>> validate(const CheckpointState& state,
                                                    const CheckpointMetadata& meta,
                                                    internal::ShardReader& reader,
                                                    const std::string& dir, int rank, int world) {
  const std::string source = dir + "/" + kMetadataFileName;
  for (const StateTensor& t : state.tensors()) {
    const auto it = meta.tensors.find(t.name);
    if (it == meta.tensors.end()) {
      std::vector<std::string> some;
      for (const auto& [name, record] : meta.tensors) {
        if (some.size() == 4) break;
        some.push_back(name);
      }
      throw InvalidArgument(fmt::format(
          "{}: the checkpoint has no tensor '{}' (it holds {} tensors: {}{}; is it another "
          "model's?)",
          source, t.name, meta.tensors.size(), fmt::join(some, ", "),
          meta.tensors.size() > some.size() ? ", ..." : ""));
    }
    const TensorRecord& r = it->second;
    const DType dtype = t.spec ? t.spec->dtype() : t.local.dtype();
    const Shape& shape = !t.logical_shape.empty() ? t.logical_shape
                         : t.spec                 ? t.spec->global_shape()
                                                  : t.local.shape();
    TESSEL_CHECK(r.dtype == dtype && r.shape == shape, InvalidArgument,
                 "{}: tensor '{}' is {} in the checkpoint but {} in the state being loaded (did "
                 "the model change?)",
                 source, t.name, typed_shape_str(r.dtype, r.shape), typed_shape_str(dtype, shape));
    for (const auto& [box, local] : logical_pieces(t)) reader.check(t.name, box);
  }
  std::vector<std::pair<uint64_t, uint64_t>> generators;
  for (const auto& [name, gen] : state.generators()) {
    const auto it = meta.generators.find(name);
    TESSEL_CHECK(it != meta.generators.end(), InvalidArgument,
                 "{}: the checkpoint has no generator '{}'", source, name);
    const auto& states = it->second;
    if (world == meta.world_size) {
      generators.push_back(states[static_cast<size_t>(rank)]);
      continue;
    }
    TESSEL_CHECK(std::all_of(states.begin(), states.end(),
                             [&](const auto& s) { return s == states.front(); }),
                 InvalidArgument,
                 "{}: generator '{}' differs across the {} ranks that saved it, so it cannot be "
                 "restored on {} ranks",
                 source, name, meta.world_size, world);
    generators.push_back(states.front());
  }
  for (const auto& [prefix, opt] : state.optimizers()) {
    TESSEL_CHECK(meta.metadata.contains(step_count_key(prefix)), InvalidArgument,
                 "{}: the checkpoint has no step count of optimizer '{}'", source, prefix);
  }
  return generators;
}

void load_dir(CheckpointState& state, ProcessGroup* group, const std::string& dir,
              Nanoseconds timeout) {
  const int rank = group ? group->rank() : 0;
  const int world = group ? group->size() : 1;
  std::exception_ptr error;
  CheckpointMetadata meta;
  std::optional<internal::ShardReader> reader;
  std::vector<std::pair<uint64_t, uint64_t>> generators;
  try {
    meta = read_checkpoint_metadata(dir);
    reader.emplace(dir, meta);
    generators = validate(state, meta, *reader, dir, rank, world);
  } catch (...) {
    error = std::current_exception();
  }
  agree(group, error, timeout, ErrorKind::kInvalidArgument,
        fmt::format("checking checkpoint {}", dir), "nothing was loaded");
  try {
    for (const StateTensor& t : state.tensors()) {
      for (const auto& [box, local] : logical_pieces(t)) reader->read(t.name, box, local);
    }
  } catch (...) {
    error = std::current_exception();
  }
  agree(group, error, timeout, ErrorKind::kIoError, fmt::format("reading checkpoint {}", dir),
        "the state may be partly loaded");
  for (size_t g = 0; g < generators.size(); ++g) {
    Generator& gen = *state.generators()[g].second;
    gen.manual_seed(generators[g].first);
    gen.reserve(generators[g].second);
  }
  for (const auto& [prefix, opt] : state.optimizers()) {
    opt->set_step_count(std::stoll(meta.metadata.at(step_count_key(prefix))));
  }
  state.step = meta.step;
  state.metadata.clear();
  for (const auto& [key, value] : meta.metadata) {
    if (!key.starts_with(kReservedPrefix)) state.metadata.emplace(key, value);
  }
}

// The checkpoint folder `dir` names (itself, or the latest under it), as rank 0 sees it; an
// empty string when there is none. Collective.
std::string resolve(ProcessGroup* group, const std::string& dir, Nanoseconds timeout) {
  int64_t step = -1;  // -2: `dir` itself; -1: nothing
  if (group == nullptr || group->rank() == 0) {
    if (fs::exists(fs::path(dir) / kMetadataFileName)) {
      step = -2;
    } else if (const auto list = list_checkpoints(dir); !list.empty()) {
      step = list.back().first;
    }
  }
  step = broadcast(group, step, timeout);
  if (step == -2) return dir;
  return step < 0 ? std::string() : (fs::path(dir) / step_dir_name(step)).string();
}

}  // namespace

namespace {

// The shape a whole state dict of `model` gives entry `name` when it differs from `t`'s global
// shape (a tensor-parallel layer's sections), else empty.
Shape logical_shape_of(nn::Module& model, const std::string& name, const StateTensor& t) {
  const Shape& global = t.spec ? t.spec->global_shape() : t.local.shape();
  Shape shape = tessel::internal::state_dict_shape(model, name, global);
  return shape == global ? Shape() : shape;
}

}  // namespace

// --- CheckpointState ---------------------------------------------------------------------------

CheckpointState::CheckpointState(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}

void CheckpointState::add(StateTensor t) {
  TESSEL_CHECK(t.local.defined(), InvalidArgument, "checkpoint: tensor '{}' is undefined", t.name);
  TESSEL_CHECK(std::none_of(tensors_.begin(), tensors_.end(),
                            [&](const StateTensor& o) { return o.name == t.name; }),
               InvalidArgument, "checkpoint: tensor '{}' was added twice", t.name);
  tensors_.push_back(std::move(t));
}

void CheckpointState::add_tensor(const std::string& name, const Tensor& t) {
  if (is_dtensor(t)) {
    add_tensor(name, as_dtensor(t));
  } else {
    add({name, t, nullptr});
  }
}

void CheckpointState::add_tensor(const std::string& name, const DTensor& t) {
  TESSEL_CHECK(t.defined(), InvalidArgument, "checkpoint: DTensor '{}' is undefined", name);
  add({name, t.to_local(), std::make_shared<DTensorSpec>(t.spec())});
}

void CheckpointState::add_tensors(const std::string& prefix,
                                  const std::vector<std::pair<std::string, DTensor>>& tensors) {
  for (const auto& [name, t] : tensors) add_tensor(joined(prefix, name), t);
}

void CheckpointState::add_tensors(const std::string& prefix, const nn::StateDict& tensors) {
  for (const auto& [name, t] : tensors) add_tensor(joined(prefix, name), t);
}

bool CheckpointState::holds(const std::string& name, const Tensor& local) const {
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const StateTensor& o) {
    return o.name == name && &o.local.impl() == &local.impl();
  });
}

void CheckpointState::add_model(const std::string& prefix, nn::Module& model) {
  for (const auto& [name, t] : model.state_dict()) {
    if (holds(joined(prefix, name), is_dtensor(t) ? as_dtensor(t).to_local() : t)) continue;
    add_tensor(joined(prefix, name), t);
    tensors_.back().logical_shape = logical_shape_of(model, name, tensors_.back());
  }
}

void CheckpointState::add_optimizer(const std::string& prefix, nn::optim::Optimizer& optimizer,
                                    nn::Module& model) {
  const std::vector<Tensor>& params = optimizer.params();
  for (const auto& [name, p] : model.named_parameters()) {
    const auto it = std::find_if(params.begin(), params.end(),
                                 [&](const Tensor& q) { return &q.impl() == &p.impl(); });
    TESSEL_CHECK(it != params.end(), InvalidArgument,
                 "checkpoint: parameter '{}' of the model is not one the optimizer '{}' steps",
                 name, prefix);
    const std::shared_ptr<const DTensorSpec> spec =
        is_dtensor(p) ? std::make_shared<DTensorSpec>(as_dtensor(p).spec()) : nullptr;
    for (const auto& [state_name, t] : optimizer.state(static_cast<size_t>(it - params.begin()))) {
      if (holds(joined(prefix, name + "." + state_name), t)) continue;
      add({joined(prefix, name + "." + state_name), t, spec, {}});
      tensors_.back().logical_shape = logical_shape_of(model, name, tensors_.back());
    }
  }
  const std::pair<std::string, nn::optim::Optimizer*> entry(prefix, &optimizer);
  if (std::find(optimizers_.begin(), optimizers_.end(), entry) == optimizers_.end()) {
    optimizers_.push_back(entry);
  }
}

void CheckpointState::add_generator(const std::string& name, Generator& generator) {
  TESSEL_CHECK(std::none_of(generators_.begin(), generators_.end(),
                            [&](const auto& g) { return g.first == name; }),
               InvalidArgument, "checkpoint: generator '{}' was added twice", name);
  generators_.emplace_back(name, &generator);
}

// --- Free functions ----------------------------------------------------------------------------

void save(const CheckpointState& state, const std::string& dir, const SaveOptions& options) {
  Snapshot s = make_snapshot(state, /*staging=*/nullptr, options.timeout);
  commit(s, state.group().get(), dir, options.timeout);
}

void load(CheckpointState& state, const std::string& dir, const LoadOptions& options) {
  ProcessGroup* group = state.group().get();
  const std::string path = resolve(group, dir, options.timeout);
  TESSEL_CHECK(!path.empty(), InvalidArgument,
               "checkpoint: {} is neither a checkpoint (no {}) nor a folder of committed "
               "checkpoints (no step_<N>/{})",
               dir, kMetadataFileName, kMetadataFileName);
  load_dir(state, group, path, options.timeout);
}

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kStepPrefix) || name.size() == kStepPrefix.size()) continue;
    const std::string digits = name.substr(kStepPrefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        digits.size() > 18) {
      continue;
    }
    if (!fs::exists(entry.path() / kMetadataFileName, ec)) continue;
    out.emplace_back(std::stoll(digits), entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  const auto list = list_checkpoints(root);
  if (list.empty()) return std::nullopt;
  return list.back().second;
}

// --- Checkpointer ------------------------------------------------------------------------------

// The background writer: one thread per save, started by async_save and joined before the next
// save, by wait() and by the destructor.
class Checkpointer::Writer {
 public:
  ~Writer() { join(); }
  void start(std::function<void()> job) {
    join();
    thread_ = std::thread(std::move(job));
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  Staging staging;  // used by the snapshot, then by the thread; never both at once
  Snapshot snapshot;
  Work work;
  uint64_t saves = 0;
  // A save started and not yet finished (its thread may be blocked in a collective).
  bool in_flight() const { return work.state() != nullptr && !work.is_completed(); }

 private:
  std::thread thread_;
};

Checkpointer::Checkpointer(std::shared_ptr<ProcessGroup> group, std::string root,
                           CheckpointerOptions options)
    : user_group_(group),
      root_(std::move(root)),
      options_(options),
      writer_(std::make_unique<Writer>()) {
  TESSEL_CHECK(options.keep_last >= 0, InvalidArgument,
               "Checkpointer: keep_last must be >= 0, got {}", options.keep_last);
  if (group) {
    group_ = group->split(0, group->rank(), {.name = group->name() + "/checkpoint"});
  }
}

Checkpointer::~Checkpointer() {
  // A save in flight while an error unwinds this scope (a collective failed, a peer is lost), or
  // once the caller's group was aborted, cannot commit on every rank: abort the private group so
  // the writer's collectives fail now rather than each at its timeout (a call already blocked in
  // a backend that cannot be interrupted, Gloo, still ends at its own), then join. Otherwise
  // wait for the save, as wait() does; a failure was logged by the writer.
  const bool failing =
      std::uncaught_exceptions() > 0 || (user_group_ != nullptr && user_group_->aborted());
  if (failing && group_ != nullptr && writer_->in_flight()) {
    group_->abort("the Checkpointer was destroyed with its save in flight while an error unwound");
  }
  writer_->join();
}

Work Checkpointer::async_save(const CheckpointState& state) {
  TESSEL_CHECK(state.group() == user_group_, InvalidArgument,
               "Checkpointer::async_save: the state's group is not the one the Checkpointer "
               "was made with");
  writer_->join();
  writer_->snapshot = make_snapshot(state, &writer_->staging, options_.timeout);
  auto work_state = std::make_shared<WorkState>("checkpoint", 0, fr::OpType::kUserEvent,
                                                ++writer_->saves, 0, options_.timeout);
  work_state->mark_started();
  writer_->work = Work(work_state);
  const std::string dir = (fs::path(root_) / step_dir_name(state.step)).string();
  writer_->start([this, dir, work_state] {
    // Its collectives are the writer's, not the training step's (docs/flight-recorder.md).
    fr::ThreadScope scope("checkpoint writer");
    try {
      commit(writer_->snapshot, group_.get(), dir, options_.timeout);
      if (writer_->snapshot.rank == 0) retain();
      work_state->complete();
    } catch (const std::exception& e) {
      log_warn(LogComponent::kParallel, "checkpoint {} failed: {}", dir, e.what());
      work_state->fail(std::current_exception());
    }
  });
  return writer_->work;
}

void Checkpointer::save(const CheckpointState& state) {
  async_save(state);
  wait();
}

void Checkpointer::wait() {
  writer_->join();
  writer_->work.wait(std::chrono::seconds(0));
}

void Checkpointer::retain() {
  fault_point("retention.begin");
  try {
    remove_leftovers(root_, "." + std::string(kStepPrefix));
    const auto list = list_checkpoints(root_);
    const size_t keep = static_cast<size_t>(options_.keep_last);
    if (keep == 0 || list.size() <= keep) return;
    for (size_t i = 0; i + keep < list.size(); ++i) {
      internal::remove_tree(list[i].second, hidden_name(list[i].second, "trash", random_nonce()));
    }
  } catch (const Error& e) {
    log_warn(LogComponent::kParallel, "checkpoint retention under {}: {}", root_, e.what());
  }
}

std::optional<std::string> Checkpointer::load_latest(CheckpointState& state,
                                                     const LoadOptions& options) {
  TESSEL_CHECK(state.group() == user_group_, InvalidArgument,
               "Checkpointer::load_latest: the state's group is not the one the Checkpointer "
               "was made with");
  wait();
  int64_t step = -1;
  if (group_ == nullptr || group_->rank() == 0) {
    const auto list = list_checkpoints(root_);
    if (!list.empty()) step = list.back().first;
  }
  step = broadcast(group_.get(), step, options.timeout);
  if (step < 0) return std::nullopt;
  const std::string dir = (fs::path(root_) / step_dir_name(step)).string();
  load_dir(state, group_.get(), dir, options.timeout);
  return dir;
}

}  // namespace tessel::checkpoint
