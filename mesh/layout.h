#pragma once
// Mesh layouts: how named mesh dimensions map coordinates to positions in a rank list.
//
// A dimension is a list of modes (size, stride), most significant first: coordinate k along the
// dimension is decomposed row-major over the modes' sizes and lands at offset Σ k_m·stride_m in
// the root mesh's rank list. A 2×4 mesh (dp, tp) over ranks 0..7 is dp = [(2, 4)], tp = [(4, 1)].
// Because a dimension may hold several modes, flattening any set of dimensions (adjacent or not)
// and unflattening one are exact: the groups they name are always sets of ranks of the root.
//
// MeshLayout is an immutable value type; all functions are pure and thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessel {

struct MeshMode {
  int64_t size = 1;
  int64_t stride = 1;
  bool operator==(const MeshMode&) const = default;
};

struct MeshDim {
  std::string name;
  std::vector<MeshMode> modes;  // most significant first

  int64_t size() const;
  // The same dimension with size-1 modes dropped and mergeable neighbours merged: two dims
  // name the same ranks exactly when their canonical modes are equal (the group cache key).
  std::vector<MeshMode> canonical_modes() const;
  // Offsets (relative to the mesh origin) of the dimension's members, by index along it.
  std::vector<int64_t> offsets() const;
  bool operator==(const MeshDim&) const = default;
};

class MeshLayout {
 public:
  // A row-major mesh of `shape` with one name per dimension, over `root_size` ranks (the product
  // of the shape). Throws InvalidArgument for empty or non-positive shapes, a name count that
  // differs from the shape's, and empty or duplicate names.
  static MeshLayout row_major(const std::vector<int64_t>& shape,
                              const std::vector<std::string>& names);

  int64_t root_size() const { return root_size_; }
  int64_t ndim() const { return static_cast<int64_t>(dims_.size()); }
  const std::vector<MeshDim>& dims() const { return dims_; }
  std::vector<int64_t> shape() const;
  std::vector<std::string> names() const;
  // Index of the dimension called `name`; throws InvalidArgument listing the names.
  int64_t dim_index(const std::string& name) const;
  const MeshDim& dim(const std::string& name) const { return dims_[dim_index(name)]; }
  bool has_dim(const std::string& name) const;

  // A layout with only `names`, in that order (the sub-mesh a rank sees through mesh[...]).
  // Throws InvalidArgument for unknown or repeated names, or an empty list.
  MeshLayout slice(const std::vector<std::string>& names) const;
  // `names` replaced by one dimension `new_name` (at the first one's position), whose
  // index runs row-major over them in the order given.
  MeshLayout flatten(const std::vector<std::string>& names, const std::string& new_name) const;
  // Dimension `name` split into `sizes` (row-major) named `new_names`. Throws InvalidArgument
  // when the sizes' product differs from the dimension's size or they do not divide its modes.
  MeshLayout unflatten(const std::string& name, const std::vector<int64_t>& sizes,
                       const std::vector<std::string>& new_names) const;
  // This layout's dimensions followed by `other`'s (two slices of one root, e.g. dp and tp
  // joined back into (dp, tp)). Throws InvalidArgument when the roots differ, a name appears in
  // both, or the dimensions overlap (some root offset reached by two coordinates: the joined
  // dimensions would not form a grid of distinct ranks).
  MeshLayout join(const MeshLayout& other) const;

  // The coordinate (one index per dimension of this layout) of root offset `offset` in the
  // sub-mesh whose origin is `origin`; nullopt when the offset lies outside that sub-mesh.
  std::optional<std::vector<int64_t>> coordinate(int64_t offset, int64_t origin) const;
  // The origin of the sub-mesh (of this layout's dimensions) containing root offset `offset`.
  int64_t origin_of(int64_t offset) const;

  // For the group along `dim` that contains root offset `offset`: its origin (equal for all
  // members, distinct across groups: the split colour) and the offset's index along the
  // dimension (the split key).
  struct Membership {
    int64_t color;
    int64_t key;
  };
  static Membership membership(const MeshDim& dim, int64_t offset);

  // "(dp=2, tp=4)"
  std::string str() const;

 private:
  MeshLayout(int64_t root_size, std::vector<MeshDim> dims)
      : root_size_(root_size), dims_(std::move(dims)) {}
  void check_names(const std::vector<std::string>& names, const char* what) const;

  int64_t root_size_ = 1;
  std::vector<MeshDim> dims_;
};

}  // namespace tessel
