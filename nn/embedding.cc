#include "tessel/nn/embedding.h"

#include "tessel/base/error.h"
#include "tessel/nn/linear.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator* gen)
    : Module("Embedding") {
  TESSEL_CHECK(num_embeddings > 0 && embedding_dim > 0, InvalidArgument,
               "Embedding needs positive sizes, got {} x {}", num_embeddings, embedding_dim);
  weight_ = &register_parameter("weight", normal_init({num_embeddings, embedding_dim}, 1.0, gen));
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(*weight_, indices); }

}  // namespace tessel::nn
