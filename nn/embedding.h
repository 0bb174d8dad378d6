#pragma once
// Embedding: a lookup table of `num_embeddings` rows of `embedding_dim`, as torch.nn.Embedding.

#include <cstdint>

#include "tessel/nn/module.h"
#include "tessel/tensor/random.h"

namespace tessel::nn {

// Parameter "weight" (num_embeddings, embedding_dim), initialised N(0, 1) from `gen` (the
// default generator when null). Thread-safety and ownership: as Module.
class Embedding : public Module {
 public:
  // Throws InvalidArgument for sizes below 1.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator* gen = nullptr);
  // Integer indices (any shape) -> (indices..., embedding_dim). An index outside
  // [0, num_embeddings) throws OutOfRange naming it.
  Tensor forward(const Tensor& indices) override;

  const Tensor& weight() const { return *weight_; }

 private:
  Tensor* weight_;
};

}  // namespace tessel::nn
