#pragma once
// Loss parallelism: the cross-entropy of logits split by vocabulary over the tensor-parallel
// group (GPT's tied LM head on a VocabParallelEmbedding gives them), without gathering the
// logits. Each rank reduces its columns; two all_reduces of one value per row combine them (the
// row maxima, then the sums of exponentials and the target logits together). Backward needs no
// communication: each rank's gradient is softmax - one_hot on its own columns.
//
//   Tensor logits = model(tokens);                              // (B, T, this rank's V piece)
//   Tensor loss = loss_parallel_cross_entropy(logits, targets, mesh["tp"], config.vocab_size);
//   backward(loss);                                              // the same loss on every rank

#include <cstdint>

#include "tessel/mesh/device_mesh.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

// Mean cross-entropy (f32) over the rows of `logits` (..., V piece) against integer `targets`
// (...), rows whose target is ignore_index excluded, as tessel::cross_entropy over the whole
// logits. The vocabulary of `vocab_size` is split as chunk_of(vocab_size, tp, rank) (uneven
// exact); `tp_mesh` is the 1-D tensor-parallel mesh. Collective over its group: every rank calls
// it with the same targets. Throws InvalidArgument when this rank's logits are not its piece,
// OutOfRange (on every rank) for a target outside [0, vocab_size) that is not ignore_index.
// Differentiable in logits.
Tensor loss_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                   const DeviceMesh& tp_mesh, int64_t vocab_size,
                                   int64_t ignore_index = -100);

}  // namespace tessel
