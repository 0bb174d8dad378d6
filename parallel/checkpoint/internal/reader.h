#pragma once
// Private: reads boxes of a checkpoint's tensors from its shard files, pread'ing only the byte
// runs of each shard that fall inside the box (nearby runs are read together). Files are opened
// once and validated when first needed: present, of the recorded size, their safetensors header
// agreeing with the metadata.
//
// Thread-safety: none; one reader per thread.

#include <map>
#include <string>

#include "tessel/base/unique_fd.h"
#include "tessel/parallel/checkpoint/internal/plan.h"
#include "tessel/parallel/checkpoint/metadata.h"
#include "tessel/tensor/safetensors.h"

namespace tessel::checkpoint::internal {

class ShardReader {
 public:
  // `dir`: the checkpoint folder; `meta` must outlive the reader.
  ShardReader(std::string dir, const CheckpointMetadata& meta);

  // Validates every file holding a part of `box` of tensor `name`: it exists, has the size the
  // metadata records, and its header lists `name` with the shard's dtype, sizes and byte range.
  // Throws InvalidArgument (IoError when a file cannot be opened) naming the file and tensor.
  void check(const std::string& name, const Box& box);
  // Reads `box` of tensor `name` into `out` (a tensor of the box's sizes and the tensor's dtype,
  // any strides and device). check() first; throws IoError when a read fails.
  void read(const std::string& name, const Box& box, const Tensor& out);

  // Bytes read from files so far (headers excluded).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct File {
    UniqueFd fd;
    SafetensorsIndex index;
  };
  const TensorRecord& record(const std::string& name) const;
  File& open(const std::string& file, const std::string& tensor);

  std::string dir_;
  const CheckpointMetadata& meta_;
  std::map<std::string, File> files_;
  uint64_t bytes_read_ = 0;
};

}  // namespace tessel::checkpoint::internal
