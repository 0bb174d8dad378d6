#include "tessel/parallel/checkpoint/metadata.h"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "tessel/base/error.h"
#include "tessel/tensor/safetensors.h"

namespace tessel::checkpoint {
namespace {

using Json = nlohmann::json;

DType dtype_of(const std::string& name, const std::string& source, const std::string& tensor) {
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    if (safetensors_dtype_name(d) == name) return d;
  }
  throw InvalidArgument(
      fmt::format("{}: tensor '{}' has unknown dtype '{}' (expected F32, BF16, "
                  "F16, I64, I32 or BOOL)",
                  source, tensor, name));
}

// A JSON array of non-negative integers (a shape, offsets or sizes).
Shape shape_of(const Json& j, const std::string& what, const std::string& source,
               const std::string& tensor) {
  TESSEL_CHECK(j.is_array(), InvalidArgument, "{}: tensor '{}': '{}' must be an array, got {}",
               source, tensor, what, j.dump());
  Shape out;
  for (const Json& v : j) {
    TESSEL_CHECK(
        v.is_number_unsigned() &&
            v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        InvalidArgument, "{}: tensor '{}': '{}' {} holds a value that is not a size", source,
        tensor, what, j.dump());
    out.push_back(static_cast<int64_t>(v.get<uint64_t>()));
  }
  return out;
}

const Json& field(const Json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  TESSEL_CHECK(it != j.end(), InvalidArgument, "{} has no '{}'", where, key);
  return *it;
}

// The elements of `shape`, or -1 past 2^62 (sizes from a file may be anything).
int64_t checked_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n) || n > (int64_t{1} << 62)) return -1;
  }
  return n;
}

// Throws unless the shards of `t` lie inside it, do not overlap and cover it exactly.
void check_tiling(const TensorRecord& t, const std::string& source, const std::string& name) {
  const size_t rank = t.shape.size();
  TESSEL_CHECK(checked_numel(t.shape) >= 0, InvalidArgument,
               "{}: tensor '{}' has shape {}, too large to be real", source, name,
               shape_str(t.shape));
  int64_t covered = 0;
  for (size_t i = 0; i < t.shards.size(); ++i) {
    const ShardRecord& s = t.shards[i];
    TESSEL_CHECK(s.offsets.size() == rank && s.sizes.size() == rank, InvalidArgument,
                 "{}: tensor '{}' of shape {} has a shard with offsets {} and sizes {}", source,
                 name, shape_str(t.shape), shape_str(s.offsets), shape_str(s.sizes));
    for (size_t d = 0; d < rank; ++d) {
      TESSEL_CHECK(s.offsets[d] <= t.shape[d] && s.sizes[d] <= t.shape[d] - s.offsets[d],
                   InvalidArgument,
                   "{}: tensor '{}' of shape {} has a shard at offsets {} of sizes {} that "
                   "runs past dimension {}",
                   source, name, shape_str(t.shape), shape_str(s.offsets), shape_str(s.sizes), d);
    }
    covered += shape_numel(s.sizes);
    for (size_t j = 0; j < i; ++j) {
      const ShardRecord& o = t.shards[j];
      bool overlap = shape_numel(s.sizes) > 0 && shape_numel(o.sizes) > 0;
      for (size_t d = 0; d < rank && overlap; ++d) {
        overlap =
            s.offsets[d] < o.offsets[d] + o.sizes[d] && o.offsets[d] < s.offsets[d] + s.sizes[d];
      }
      TESSEL_CHECK(!overlap, InvalidArgument,
                   "{}: tensor '{}' has overlapping shards at offsets {} and {}", source, name,
                   shape_str(s.offsets), shape_str(o.offsets));
    }
  }
  TESSEL_CHECK(covered == shape_numel(t.shape), InvalidArgument,
               "{}: the shards of tensor '{}' cover {} of its {} elements", source, name, covered,
               shape_numel(t.shape));
}

}  // namespace

std::string CheckpointMetadata::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = "tessel-checkpoint";
  j["version"] = kFormatVersion;
  j["step"] = step;
  j["world_size"] = world_size;
  j["metadata"] = metadata;
  nlohmann::ordered_json gens = nlohmann::ordered_json::object();
  for (const auto& [name, states] : generators) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& [seed, offset] : states) list.push_back({seed, offset});
    gens[name] = std::move(list);
  }
  j["generators"] = std::move(gens);
  j["files"] = files;
  nlohmann::ordered_json ts = nlohmann::ordered_json::object();
  for (const auto& [name, t] : tensors) {
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (const ShardRecord& s : t.shards) {
      shards.push_back({{"offsets", s.offsets},
                        {"sizes", s.sizes},
                        {"file", s.file},
                        {"byte_range", {s.begin, s.end}}});
    }
    ts[name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                {"shape", t.shape},
                {"saved_from", t.saved_from},
                {"shards", std::move(shards)}};
  }
  j["tensors"] = std::move(ts);
  return j.dump(1) + "\n";
}

CheckpointMetadata CheckpointMetadata::parse(const std::string& text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  TESSEL_CHECK(j.is_object() && j.value("format", "") == "tessel-checkpoint", InvalidArgument,
               "{}: not a tessel checkpoint's metadata (no \"format\": \"tessel-checkpoint\")",
               source);
  const Json& version = field(j, "version", source);
  TESSEL_CHECK(version.is_number_integer() && version.get<int>() == kFormatVersion, InvalidArgument,
               "{}: format version {} is not the supported version {}", source, version.dump(),
               kFormatVersion);
  CheckpointMetadata m;
  try {
    m.step = field(j, "step", source).get<int64_t>();
    m.world_size = field(j, "world_size", source).get<int>();
    m.metadata = field(j, "metadata", source).get<std::map<std::string, std::string>>();
    m.files = field(j, "files", source).get<std::map<std::string, uint64_t>>();
    for (const auto& [name, list] : field(j, "generators", source).items()) {
      auto& states = m.generators[name];
      for (const Json& s : list)
        states.emplace_back(s.at(0).get<uint64_t>(), s.at(1).get<uint64_t>());
      TESSEL_CHECK(states.size() == static_cast<size_t>(m.world_size), InvalidArgument,
                   "{}: generator '{}' has {} states for {} ranks", source, name, states.size(),
                   m.world_size);
    }
  } catch (const Json::exception& e) {
    throw InvalidArgument(fmt::format("{}: malformed field: {}", source, e.what()));
  }
  TESSEL_CHECK(m.world_size >= 1, InvalidArgument, "{}: world_size {} must be >= 1", source,
               m.world_size);
  for (const auto& [name, tj] : field(j, "tensors", source).items()) {
    const std::string where = fmt::format("{}: tensor '{}'", source, name);
    TensorRecord t;
    try {
      t.dtype = dtype_of(field(tj, "dtype", where).get<std::string>(), source, name);
      t.shape = shape_of(field(tj, "shape", where), "shape", source, name);
      t.saved_from = tj.value("saved_from", "");
      for (const Json& sj : field(tj, "shards", where)) {
        ShardRecord s;
        s.offsets = shape_of(field(sj, "offsets", where), "offsets", source, name);
        s.sizes = shape_of(field(sj, "sizes", where), "sizes", source, name);
        s.file = field(sj, "file", where).get<std::string>();
        const Json& range = field(sj, "byte_range", where);
        s.begin = range.at(0).get<uint64_t>();
        s.end = range.at(1).get<uint64_t>();
        t.shards.push_back(std::move(s));
      }
    } catch (const Json::exception& e) {
      throw InvalidArgument(fmt::format("{}: malformed: {}", where, e.what()));
    }
    check_tiling(t, source, name);
    for (const ShardRecord& s : t.shards) {
      // Files are named inside the checkpoint folder: no path may lead out of it.
      TESSEL_CHECK(
          !s.file.empty() && s.file.find('/') == std::string::npos && s.file.front() != '.',
          InvalidArgument,
          "{}: tensor '{}' has a shard in file '{}', which is not a file name inside "
          "the checkpoint's folder",
          source, name, s.file);
      const auto file = m.files.find(s.file);
      TESSEL_CHECK(file != m.files.end(), InvalidArgument,
                   "{}: tensor '{}' has a shard in file '{}', which the checkpoint does not list",
                   source, name, s.file);
      const uint64_t bytes = static_cast<uint64_t>(shape_numel(s.sizes)) * dtype_size(t.dtype);
      TESSEL_CHECK(s.begin <= s.end && s.end - s.begin == bytes && s.end <= file->second,
                   InvalidArgument,
                   "{}: tensor '{}' shard at offsets {} has byte range [{}, {}) in '{}' "
                   "({} bytes), but its box needs {} bytes",
                   source, name, shape_str(s.offsets), s.begin, s.end, s.file, file->second, bytes);
    }
    m.tensors.emplace(name, std::move(t));
  }
  return m;
}

CheckpointMetadata read_checkpoint_metadata(const std::string& dir) {
  const std::string path = dir + "/" + kMetadataFileName;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw_system_error(fmt::format("{}: cannot open the checkpoint's metadata", path), errno);
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TESSEL_CHECK(!in.bad(), IoError, "{}: reading failed", path);
  return CheckpointMetadata::parse(text, path);
}

}  // namespace tessel::checkpoint
