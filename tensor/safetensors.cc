#include "tessel/tensor/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "tessel/base/error.h"

namespace tessel {

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kBool:
      return "BOOL";
  }
  throw Internal(fmt::format("unknown DType {}", static_cast<int>(dtype)));
}

namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; big-endian hosts need byte swapping");

constexpr std::string_view kMetadataKey = "__metadata__";

bool parse_safetensors_dtype(std::string_view name, DType* dtype) {
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    if (safetensors_dtype_name(d) == name) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

// A validated header; each entry's bytes are data[begin, end) (offsets in the data area).
using Entry = SafetensorsEntry;
struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

// Parses and validates the JSON header against a data area of `data_bytes` bytes. The entries'
// ranges must tile the data area exactly (no overlap, no gap, nothing past the end), as the
// reference implementation requires.
Header parse_header(std::string_view text, uint64_t data_bytes, std::string_view source) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(
        fmt::format("{}: safetensors header is not valid JSON: {}", source, e.what()));
  }
  TESSEL_CHECK(json.is_object(), InvalidArgument,
               "{}: safetensors header must be a JSON object, got {}", source, json.type_name());
  Header header;
  for (const auto& [name, value] : json.items()) {
    if (name == kMetadataKey) {
      TESSEL_CHECK(value.is_object(), InvalidArgument,
                   "{}: __metadata__ must be an object of strings, got {}", source,
                   value.type_name());
      for (const auto& [key, item] : value.items()) {
        TESSEL_CHECK(item.is_string(), InvalidArgument,
                     "{}: __metadata__ value for '{}' must be a string, got {}", source, key,
                     item.type_name());
        header.metadata[key] = item.get<std::string>();
      }
      continue;
    }
    TESSEL_CHECK(value.is_object(), InvalidArgument,
                 "{}: entry '{}' must be an object with dtype, shape and data_offsets, got {}",
                 source, name, value.type_name());
    Entry entry;
    entry.name = name;
    const auto dtype = value.find("dtype");
    TESSEL_CHECK(dtype != value.end() && dtype->is_string(), InvalidArgument,
                 "{}: entry '{}' has no string 'dtype'", source, name);
    const std::string dtype_text = dtype->get<std::string>();
    TESSEL_CHECK(parse_safetensors_dtype(dtype_text, &entry.dtype), InvalidArgument,
                 "{}: entry '{}' has unsupported dtype '{}' (expected one of F32, BF16, F16, "
                 "I64, I32, BOOL)",
                 source, name, dtype_text);

    const auto shape = value.find("shape");
    TESSEL_CHECK(shape != value.end() && shape->is_array(), InvalidArgument,
                 "{}: entry '{}' has no array 'shape'", source, name);
    uint64_t numel = 1;  // saturates: a huge shape then fails the size check below
    for (const auto& size : *shape) {
      TESSEL_CHECK(
          size.is_number_unsigned() &&
              size.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
          InvalidArgument,
          "{}: entry '{}' has shape {} with a size that is not a non-negative integer", source,
          name, shape->dump());
      const uint64_t s = size.get<uint64_t>();
      if (__builtin_mul_overflow(numel, s, &numel)) numel = std::numeric_limits<uint64_t>::max();
      entry.shape.push_back(static_cast<int64_t>(s));
    }

    const auto offsets = value.find("data_offsets");
    TESSEL_CHECK(offsets != value.end() && offsets->is_array() && offsets->size() == 2 &&
                     (*offsets)[0].is_number_unsigned() && (*offsets)[1].is_number_unsigned(),
                 InvalidArgument,
                 "{}: entry '{}' needs 'data_offsets' as two non-negative integers [begin, end]",
                 source, name);
    entry.begin = (*offsets)[0].get<uint64_t>();
    entry.end = (*offsets)[1].get<uint64_t>();
    TESSEL_CHECK(entry.begin <= entry.end && entry.end <= data_bytes, InvalidArgument,
                 "{}: entry '{}' has data_offsets [{}, {}] outside the {}-byte data area", source,
                 name, entry.begin, entry.end, data_bytes);
    uint64_t expected = 0;
    if (__builtin_mul_overflow(numel, dtype_size(entry.dtype), &expected)) {
      expected = std::numeric_limits<uint64_t>::max();
    }
    TESSEL_CHECK(entry.end - entry.begin == expected, InvalidArgument,
                 "{}: entry '{}' with dtype {} and shape {} needs {} bytes but data_offsets "
                 "[{}, {}] hold {}",
                 source, name, dtype_text, shape->dump(), expected, entry.begin, entry.end,
                 entry.end - entry.begin);
    header.entries.push_back(std::move(entry));
  }

  // The ranges, sorted, must follow each other exactly and end at the end of the data area.
  std::vector<const Entry*> sorted;
  for (const Entry& e : header.entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t position = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : sorted) {
    TESSEL_CHECK(e->begin >= position, InvalidArgument,
                 "{}: entry '{}' data_offsets [{}, {}] overlap entry '{}' [{}, {}]", source,
                 e->name, e->begin, e->end, previous->name, previous->begin, previous->end);
    TESSEL_CHECK(e->begin == position, InvalidArgument,
                 "{}: entry '{}' starts at byte {} but the previous tensor ends at {} (gaps are "
                 "not allowed)",
                 source, e->name, e->begin, position);
    position = e->end;
    previous = e;
  }
  TESSEL_CHECK(position == data_bytes, InvalidArgument,
               "{}: tensors cover {} bytes but the data area holds {} (trailing bytes)", source,
               position, data_bytes);
  return header;
}

// Copies `t`'s elements in row-major order to `out` (nbytes() bytes), whatever its strides.
void copy_to_contiguous(const Tensor& t, std::byte* out) {
  const size_t elem = t.element_size();
  if (t.numel() == 0) return;
  if (t.is_contiguous()) {
    std::memcpy(out, t.data_ptr(), t.nbytes());
    return;
  }
  const auto* base = static_cast<const std::byte*>(t.data_ptr());
  const int64_t rank = t.dim();
  std::vector<int64_t> index(rank, 0);
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t offset = 0;
    for (int64_t d = 0; d < rank; ++d) offset += index[d] * t.stride(d);
    std::memcpy(out + n * elem, base + offset * static_cast<int64_t>(elem), elem);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++index[d] < t.size(d)) break;
      index[d] = 0;
    }
  }
}

// The header JSON (padded to 8 bytes) for `entries` in the given order, setting each entry's
// [begin, end) in the data area; returns the JSON and the total data size in *data_bytes.
std::string build_header(std::vector<Entry>& entries,
                         const std::map<std::string, std::string>& metadata, uint64_t* data_bytes) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) json[std::string(kMetadataKey)] = metadata;
  uint64_t position = 0;
  for (Entry& e : entries) {
    TESSEL_CHECK(!e.name.empty() && e.name != kMetadataKey, InvalidArgument,
                 "safetensors: tensor name '{}' is reserved or empty", e.name);
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    nlohmann::ordered_json entry;
    entry["dtype"] = safetensors_dtype_name(e.dtype);
    entry["shape"] = e.shape;
    entry["data_offsets"] = {position, position + bytes};
    json[e.name] = std::move(entry);
    e.begin = position;
    e.end = position + bytes;
    position += bytes;
  }
  std::string text = json.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  *data_bytes = position;
  return text;
}

// The entries of `tensors` (checked: defined, on the CPU), in name order.
std::vector<Entry> entries_of(const TensorMap& tensors) {
  std::vector<Entry> entries;
  for (const auto& [name, t] : tensors) {
    TESSEL_CHECK(t.defined(), InvalidArgument, "safetensors: tensor '{}' is undefined", name);
    TESSEL_CHECK(t.device().is_cpu(), InvalidArgument,
                 "safetensors: tensor '{}' is on {}; copy it to the CPU first", name,
                 t.device().str());
    entries.push_back({name, t.dtype(), t.shape(), 0, 0});
  }
  return entries;
}

std::string length_prefix(uint64_t n) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out;
}

}  // namespace

std::string serialize_safetensors(const TensorMap& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  uint64_t data_bytes = 0;
  std::vector<Entry> entries = entries_of(tensors);
  const std::string header = build_header(entries, metadata, &data_bytes);
  std::string out = length_prefix(header.size()) + header;
  const size_t data_start = out.size();
  out.resize(data_start + data_bytes);
  size_t position = data_start;
  for (const auto& [name, t] : tensors) {
    copy_to_contiguous(t, reinterpret_cast<std::byte*>(out.data() + position));
    position += t.nbytes();
  }
  return out;
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  uint64_t data_bytes = 0;
  std::vector<Entry> entries = entries_of(tensors);
  const std::string header = build_header(entries, metadata, &data_bytes);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw_system_error(fmt::format("{}: cannot open for writing", path), errno);
  out.write(length_prefix(header.size()).data(), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::vector<std::byte> buffer;
  for (const auto& [name, t] : tensors) {
    buffer.resize(t.nbytes());
    copy_to_contiguous(t, buffer.data());
    out.write(reinterpret_cast<const char*>(buffer.data()),
              static_cast<std::streamsize>(buffer.size()));
  }
  out.flush();
  TESSEL_CHECK(out.good(), IoError, "{}: writing {} bytes of tensor data failed", path, data_bytes);
}

namespace {

// Reads the 8-byte length and checks it against the `total` bytes available.
uint64_t checked_header_length(const std::byte* prefix, uint64_t total, std::string_view source) {
  TESSEL_CHECK(total >= 8, InvalidArgument,
               "{}: file holds {} bytes, too short for the 8-byte safetensors header length",
               source, total);
  uint64_t n = 0;
  std::memcpy(&n, prefix, 8);
  TESSEL_CHECK(n <= kSafetensorsMaxHeaderBytes, InvalidArgument,
               "{}: safetensors header length {} exceeds the {}-byte limit", source, n,
               kSafetensorsMaxHeaderBytes);
  TESSEL_CHECK(n <= total - 8, InvalidArgument,
               "{}: safetensors header length {} runs past the end of the {}-byte file "
               "(truncated?)",
               source, n, total);
  TESSEL_CHECK(n >= 2, InvalidArgument, "{}: safetensors header length {} is too short for JSON",
               source, n);
  return n;
}

// Any non-zero byte of a BOOL tensor means true; a bool holding another value is undefined.
void normalize_bools(Tensor& t) {
  if (t.dtype() != DType::kBool) return;
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = p[i] != 0;
}

}  // namespace

SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, std::string_view source) {
  const uint64_t n = checked_header_length(bytes.data(), bytes.size(), source);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
  const std::span<const std::byte> data = bytes.subspan(8 + n);
  Header header = parse_header(text, data.size(), source);
  SafetensorsFile file;
  file.metadata = std::move(header.metadata);
  for (const Entry& e : header.entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data.data() + e.begin, e.end - e.begin);
    normalize_bools(t);
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

namespace {

// Opens `path` and reads its validated header; *data_start and *total receive the data area's
// first byte and the file's size.
Header read_header(std::ifstream& in, const std::string& path, uint64_t* data_start,
                   uint64_t* total) {
  in.open(path, std::ios::binary | std::ios::ate);
  if (!in) throw_system_error(fmt::format("{}: cannot open safetensors file", path), errno);
  const auto end = in.tellg();
  TESSEL_CHECK(end >= 0, IoError, "{}: cannot determine the file size", path);
  *total = static_cast<uint64_t>(end);
  in.seekg(0);
  std::byte prefix[8] = {};
  if (*total >= 8) in.read(reinterpret_cast<char*>(prefix), 8);
  const uint64_t n = checked_header_length(prefix, *total, path);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  TESSEL_CHECK(in.good(), IoError, "{}: reading the {}-byte header failed", path, n);
  *data_start = 8 + n;
  return parse_header(text, *total - *data_start, path);
}

}  // namespace

SafetensorsIndex read_safetensors_index(const std::string& path) {
  std::ifstream in;
  SafetensorsIndex index;
  Header header = read_header(in, path, &index.data_start, &index.file_bytes);
  index.metadata = std::move(header.metadata);
  for (Entry& e : header.entries) {
    e.begin += index.data_start;
    e.end += index.data_start;
    std::string name = e.name;
    index.entries.emplace(std::move(name), std::move(e));
  }
  return index;
}

SafetensorsLayout plan_safetensors(const std::vector<SafetensorsEntry>& tensors,
                                   const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout layout;
  layout.entries = tensors;
  std::sort(layout.entries.begin(), layout.entries.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  for (size_t i = 1; i < layout.entries.size(); ++i) {
    TESSEL_CHECK(layout.entries[i].name != layout.entries[i - 1].name, InvalidArgument,
                 "safetensors: tensor name '{}' appears twice", layout.entries[i].name);
  }
  uint64_t data_bytes = 0;
  const std::string json = build_header(layout.entries, metadata, &data_bytes);
  layout.header = length_prefix(json.size()) + json;
  for (Entry& e : layout.entries) {
    e.begin += layout.header.size();
    e.end += layout.header.size();
  }
  layout.file_bytes = layout.header.size() + data_bytes;
  return layout;
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in;
  uint64_t data_start = 0, total = 0;
  Header header = read_header(in, path, &data_start, &total);

  SafetensorsFile file;
  file.metadata = std::move(header.metadata);
  for (const Entry& e : header.entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (e.end > e.begin) {
      in.seekg(static_cast<std::streamoff>(data_start + e.begin));
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
      TESSEL_CHECK(in.good(), IoError, "{}: reading tensor '{}' ({} bytes at offset {}) failed",
                   path, e.name, e.end - e.begin, data_start + e.begin);
    }
    normalize_bools(t);
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

}  // namespace tessel
