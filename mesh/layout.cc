#include "tessel/mesh/layout.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "tessel/base/error.h"

namespace tessel {

int64_t MeshDim::size() const {
  int64_t n = 1;
  for (const auto& m : modes) n *= m.size;
  return n;
}

std::vector<MeshMode> MeshDim::canonical_modes() const {
  std::vector<MeshMode> out;
  for (const auto& m : modes) {
    if (m.size == 1) continue;
    // (a, b·s) followed by (b, s) is one mode (a·b, s).
    if (!out.empty() && out.back().stride == m.size * m.stride) {
      out.back() = {out.back().size * m.size, m.stride};
    } else {
      out.push_back(m);
    }
  }
  return out;
}

std::vector<int64_t> MeshDim::offsets() const {
  std::vector<int64_t> out(static_cast<size_t>(size()));
  for (int64_t index = 0; index < size(); ++index) {
    int64_t rest = index, offset = 0;
    for (size_t m = modes.size(); m-- > 0;) {
      offset += (rest % modes[m].size) * modes[m].stride;
      rest /= modes[m].size;
    }
    out[index] = offset;
  }
  return out;
}

MeshLayout MeshLayout::row_major(const std::vector<int64_t>& shape,
                                 const std::vector<std::string>& names) {
  TESSEL_CHECK(!shape.empty(), InvalidArgument, "a mesh needs at least one dimension");
  TESSEL_CHECK(shape.size() == names.size(), InvalidArgument,
               "mesh shape has {} dimensions but {} names were given", shape.size(), names.size());
  std::vector<MeshDim> dims(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    TESSEL_CHECK(shape[i] > 0, InvalidArgument,
                 "mesh dimension '{}' has size {}; sizes must be "
                 "positive",
                 names[i], shape[i]);
    dims[i] = MeshDim{names[i], {MeshMode{shape[i], stride}}};
    stride *= shape[i];
  }
  MeshLayout layout(stride, std::move(dims));
  layout.check_names(names, "mesh dimension names");
  return layout;
}

void MeshLayout::check_names(const std::vector<std::string>& names, const char* what) const {
  std::set<std::string> seen;
  for (const auto& n : names) {
    TESSEL_CHECK(!n.empty(), InvalidArgument, "{}: a name is empty", what);
    TESSEL_CHECK(seen.insert(n).second, InvalidArgument, "{}: '{}' appears twice", what, n);
  }
}

std::vector<int64_t> MeshLayout::shape() const {
  std::vector<int64_t> out;
  for (const auto& d : dims_) out.push_back(d.size());
  return out;
}

std::vector<std::string> MeshLayout::names() const {
  std::vector<std::string> out;
  for (const auto& d : dims_) out.push_back(d.name);
  return out;
}

bool MeshLayout::has_dim(const std::string& name) const {
  return std::any_of(dims_.begin(), dims_.end(), [&](const MeshDim& d) { return d.name == name; });
}

int64_t MeshLayout::dim_index(const std::string& name) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == name) return static_cast<int64_t>(i);
  }
  std::string valid;
  for (const auto& d : dims_) valid += (valid.empty() ? "" : ", ") + d.name;
  throw InvalidArgument(
      fmt::format("mesh has no dimension '{}'; its dimensions are ({})", name, valid));
}

MeshLayout MeshLayout::slice(const std::vector<std::string>& names) const {
  TESSEL_CHECK(!names.empty(), InvalidArgument, "slice of mesh {} names no dimension", str());
  check_names(names, "slice");
  std::vector<MeshDim> dims;
  for (const auto& n : names) dims.push_back(dim(n));
  return MeshLayout(root_size_, std::move(dims));
}

MeshLayout MeshLayout::flatten(const std::vector<std::string>& names,
                               const std::string& new_name) const {
  TESSEL_CHECK(!names.empty(), InvalidArgument, "flatten of mesh {} names no dimension", str());
  check_names(names, "flatten");
  TESSEL_CHECK(!new_name.empty(), InvalidArgument, "flatten: the new dimension needs a name");
  const bool replaces_own = std::find(names.begin(), names.end(), new_name) != names.end();
  TESSEL_CHECK(!has_dim(new_name) || replaces_own, InvalidArgument,
               "flatten: mesh {} already has a dimension '{}'", str(), new_name);
  MeshDim merged{new_name, {}};
  for (const auto& n : names) {
    const auto& modes = dim(n).modes;
    merged.modes.insert(merged.modes.end(), modes.begin(), modes.end());
  }
  const int64_t first = dim_index(names.front());
  std::vector<MeshDim> dims;
  for (int64_t i = 0; i < ndim(); ++i) {
    if (i == first)
      dims.push_back(merged);
    else if (std::find(names.begin(), names.end(), dims_[i].name) == names.end())
      dims.push_back(dims_[i]);
  }
  return MeshLayout(root_size_, std::move(dims));
}

MeshLayout MeshLayout::unflatten(const std::string& name, const std::vector<int64_t>& sizes,
                                 const std::vector<std::string>& new_names) const {
  const MeshDim& old = dim(name);
  TESSEL_CHECK(!sizes.empty() && sizes.size() == new_names.size(), InvalidArgument,
               "unflatten '{}': {} sizes but {} names", name, sizes.size(), new_names.size());
  check_names(new_names, "unflatten");
  int64_t product = 1;
  for (int64_t s : sizes) {
    TESSEL_CHECK(s > 0, InvalidArgument, "unflatten '{}': size {} is not positive", name, s);
    product *= s;
  }
  TESSEL_CHECK(product == old.size(), InvalidArgument,
               "unflatten '{}': sizes multiply to {} but the dimension has {} ranks", name, product,
               old.size());
  for (const auto& n : new_names) {
    TESSEL_CHECK(n == name || !has_dim(n), InvalidArgument,
                 "unflatten: mesh {} already has a dimension '{}'", str(), n);
  }
  // Peel the new dimensions off the old one's modes, least significant first.
  std::vector<MeshMode> rest = old.modes;
  std::vector<MeshDim> made(sizes.size());
  for (size_t j = sizes.size(); j-- > 0;) {
    int64_t need = sizes[j];
    std::vector<MeshMode> modes;  // least significant first while collecting
    while (need > 1) {
      MeshMode& m = rest.back();
      if (m.size == 1) {
        rest.pop_back();
      } else if (need % m.size == 0) {
        modes.push_back(m);
        need /= m.size;
        rest.pop_back();
      } else if (m.size % need == 0) {
        modes.push_back({need, m.stride});
        m = {m.size / need, m.stride * need};
        need = 1;
      } else {
        throw InvalidArgument(fmt::format(
            "unflatten '{}' into sizes {}: size {} does not divide the dimension's layout", name,
            fmt::join(sizes, "x"), sizes[j]));
      }
    }
    std::reverse(modes.begin(), modes.end());
    if (modes.empty()) modes.push_back({1, 1});
    made[j] = MeshDim{new_names[j], std::move(modes)};
  }
  std::vector<MeshDim> dims;
  for (const auto& d : dims_) {
    if (d.name == name)
      dims.insert(dims.end(), made.begin(), made.end());
    else
      dims.push_back(d);
  }
  return MeshLayout(root_size_, std::move(dims));
}

MeshLayout MeshLayout::join(const MeshLayout& other) const {
  TESSEL_CHECK(root_size_ == other.root_size_, InvalidArgument,
               "join of mesh {} (over {} ranks) with mesh {} (over {} ranks): the meshes come "
               "from different roots",
               str(), root_size_, other.str(), other.root_size_);
  std::vector<MeshDim> dims = dims_;
  dims.insert(dims.end(), other.dims_.begin(), other.dims_.end());
  std::vector<std::string> names;
  for (const MeshDim& d : dims) names.push_back(d.name);
  std::set<std::string> seen;
  for (const std::string& n : names) {
    TESSEL_CHECK(seen.insert(n).second, InvalidArgument,
                 "join of mesh {} with mesh {}: both have a dimension '{}'", str(), other.str(), n);
  }
  // Every coordinate of the joined grid must land on its own root offset.
  int64_t size = 1;
  for (const MeshDim& d : dims) size *= d.size();
  const auto overlap = [&] {
    return InvalidArgument(fmt::format(
        "join of mesh {} with mesh {}: the dimensions overlap (they do not span {} distinct "
        "ranks of the root's {})",
        str(), other.str(), size, root_size_));
  };
  if (size > root_size_) throw overlap();
  std::vector<int64_t> offsets = {0};
  for (const MeshDim& d : dims) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(d.size()));
    for (int64_t base : offsets) {
      for (int64_t o : d.offsets()) next.push_back(base + o);
    }
    offsets = std::move(next);
  }
  std::vector<bool> hit(static_cast<size_t>(root_size_), false);
  for (int64_t o : offsets) {
    if (o >= root_size_ || hit[static_cast<size_t>(o)]) throw overlap();
    hit[static_cast<size_t>(o)] = true;
  }
  return MeshLayout(root_size_, std::move(dims));
}

MeshLayout::Membership MeshLayout::membership(const MeshDim& dim, int64_t offset) {
  // Every mode (size, stride) made by row_major/flatten/unflatten is a digit range of the
  // root's mixed-radix offsets, so its coordinate is (offset / stride) % size.
  int64_t key = 0, contribution = 0;
  for (const auto& m : dim.modes) {
    const int64_t digit = (offset / m.stride) % m.size;
    key = key * m.size + digit;
    contribution += digit * m.stride;
  }
  return {offset - contribution, key};
}

int64_t MeshLayout::origin_of(int64_t offset) const {
  int64_t origin = offset;
  for (const auto& d : dims_) origin -= offset - membership(d, offset).color;
  return origin;
}

std::optional<std::vector<int64_t>> MeshLayout::coordinate(int64_t offset, int64_t origin) const {
  if (offset < 0 || offset >= root_size_ || origin_of(offset) != origin) return std::nullopt;
  std::vector<int64_t> coord;
  for (const auto& d : dims_) coord.push_back(membership(d, offset).key);
  return coord;
}

std::string MeshLayout::str() const {
  std::string out = "(";
  for (size_t i = 0; i < dims_.size(); ++i) {
    out += fmt::format("{}{}={}", i ? ", " : "", dims_[i].name, dims_[i].size());
  }
  return out + ")";
}

}  // namespace tessel
