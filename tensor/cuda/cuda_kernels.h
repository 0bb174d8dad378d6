#pragma once
// Private: the launchers of the CUDA kernels (cuda_*.cu), called by the backend's host code
// (cuda_backend*.cc) with raw device addresses, dtypes and Indexers. Every launcher issues its
// kernels on launch.stream (its device already current), checks the launch and throws a
// tessel::Error naming the kernel if it failed. Values are never read on the host; bad
// indices are reported through launch.errors (see DeviceErrorRecord).
//
// Shapes are named once, as in llm.c: R rows and C columns of a row-wise op (softmax, norms,
// cross-entropy: C classes), N indices, D the embedding width.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessel/base/reduce_op.h"
#include "tessel/tensor/backend.h"
#include "tessel/tensor/cuda/cuda_indexer.h"
#include "tessel/tensor/dtype.h"

namespace tessel::cuda {

// Where a kernel reports a bad value it found (an index out of range). One record per device
// in page-locked host memory mapped into the device's address space: the first failing thread
// fills it, the host reads it after a synchronisation (cuda_runtime.cc) and throws.
struct DeviceErrorRecord {
  unsigned int state;  // 0 empty; 1 being written; 2 written
  int check;           // a DeviceCheck
  long long value;     // the bad value
  long long position;  // its position in the index tensor
  long long limit;     // the valid range is [0, limit)
};

enum class DeviceCheck : int {
  kEmbedding = 1,
  kEmbeddingBackward = 2,
  kCrossEntropy = 3,
  kCrossEntropyBackward = 4,
};

// What every launcher needs: the stream (of the current device), the device's multiprocessor
// count (grid sizes) and its error record (device address).
struct Launch {
  cudaStream_t stream = nullptr;
  int device = 0;
  int sm_count = 1;
  DeviceErrorRecord* errors = nullptr;
};

// ---- cuda_elementwise.cu ------------------------------------------------------------------------

// dst[i] = src[i] converted (Indexer operands: src, dst).
void launch_copy(const Launch& l, const Indexer<2>& ix, int64_t numel, const void* src,
                 DType src_dtype, void* dst, DType dst_dtype);
// Every element of dst = the `element_size`-byte pattern `bits` (the value already converted).
void launch_fill(const Launch& l, const Indexer<1>& ix, int64_t numel, void* dst, int element_size,
                 uint64_t bits);
void launch_arange(const Launch& l, int64_t numel, void* dst, DType dtype, double start,
                   double step);
// dst (contiguous floating) from random.h's Philox stream at counter offset + i.
void launch_random(const Launch& l, int64_t numel, void* dst, DType dtype, RandomDistribution dist,
                   float a, float b, uint64_t seed, uint64_t offset);
// Operands: x, out.
void launch_unary(const Launch& l, UnaryOp op, const Indexer<2>& ix, int64_t numel, const void* x,
                  DType x_dtype, void* out, DType out_dtype);
// Operands: a, b, out (a and b one dtype).
void launch_binary(const Launch& l, BinaryOp op, const Indexer<3>& ix, int64_t numel, const void* a,
                   const void* b, DType dtype, void* out, DType out_dtype);
// Operands: cond (bool), a, b, out.
void launch_where(const Launch& l, const Indexer<4>& ix, int64_t numel, const void* cond,
                  const void* a, const void* b, void* out, DType dtype);

// ---- cuda_reduce.cu -----------------------------------------------------------------------------

// out[r] = op over x[r * C .. r * C + C) for contiguous x [R, C]; kAvg divides by C. `scratch`
// holds partial results when C is long (reduce_scratch_bytes says how many bytes).
int64_t reduce_rows_scratch_bytes(int64_t R, int64_t C);
void launch_reduce_rows(const Launch& l, ReduceOp op, const void* x, DType x_dtype, void* out,
                        DType out_dtype, int64_t R, int64_t C, void* scratch);
// out[c] = op over x[r * C + c] for r < R (contiguous x [R, C], reducing the leading dim).
int64_t reduce_cols_scratch_bytes(int64_t R, int64_t C);
void launch_reduce_cols(const Launch& l, ReduceOp op, const void* x, DType x_dtype, void* out,
                        DType out_dtype, int64_t R, int64_t C, void* scratch);
// out[r] (i64) = index of the first largest of x[r * C ..) (NaN largest), contiguous x.
void launch_argmax_rows(const Launch& l, const void* x, DType dtype, int64_t* out, int64_t R,
                        int64_t C);

// ---- cuda_nn.cu ---------------------------------------------------------------------------------
// Row-wise kernels over contiguous [R, C] tensors of one floating dtype.

void launch_softmax(const Launch& l, const void* x, void* out, DType dtype, int64_t R, int64_t C,
                    bool log);
void launch_softmax_backward(const Launch& l, const void* grad_y, const void* y, void* grad_x,
                             DType dtype, int64_t R, int64_t C, bool log);
// weight/bias may be null; mean may be null (rms_norm); mean/rstd f32 [R].
void launch_norm(const Launch& l, const void* x, const void* weight, const void* bias, void* out,
                 float* mean, float* rstd, DType dtype, int64_t R, int64_t C, float eps);
// grad_x (may be null) from grad_y, x, weight (may be null), mean (null: rms_norm), rstd.
void launch_norm_backward_input(const Launch& l, const void* grad_y, const void* x,
                                const void* weight, const float* mean, const float* rstd,
                                void* grad_x, DType dtype, int64_t R, int64_t C);
// grad_weight = sum_r grad_y * xhat, grad_bias = sum_r grad_y (f32 [C]; either may be null;
// mean null for rms_norm), in a fixed order: blocks of rows, then the blocks in order.
int64_t norm_backward_params_scratch_bytes(int64_t R, int64_t C);
void launch_norm_backward_params(const Launch& l, const void* grad_y, const void* x,
                                 const float* mean, const float* rstd, float* grad_weight,
                                 float* grad_bias, DType dtype, int64_t R, int64_t C,
                                 void* scratch);
// out[n, :] = weight[indices[n], :]; weight [V, D] of any dtype (element_size bytes).
void launch_embedding(const Launch& l, const void* weight, int element_size, const int64_t* indices,
                      void* out, int64_t N, int64_t V, int64_t D);
// grad_weight [V, D] f32 += rows of grad [N, D] gathered by index, rows of one index summed in
// the order of their positions (a stable sort of the indices first): deterministic.
int64_t embedding_backward_scratch_bytes(int64_t N, int64_t V);
void launch_embedding_backward(const Launch& l, const void* grad, DType dtype,
                               const int64_t* indices, float* grad_weight, int64_t N, int64_t V,
                               int64_t D, void* scratch);
// loss, lse f32 [R] from logits [R, C] and targets (i64 [R]).
void launch_cross_entropy(const Launch& l, const void* logits, DType dtype, const int64_t* target,
                          int64_t ignore_index, float* loss, float* lse, int64_t R, int64_t C);
void launch_cross_entropy_backward(const Launch& l, const float* grad_loss, const void* logits,
                                   DType dtype, const int64_t* target, const float* lse,
                                   int64_t ignore_index, void* grad_logits, int64_t R, int64_t C);

// ---- cuda_optim.cu ------------------------------------------------------------------------------

// One tensor's f32 arrays for the fused AdamW step.
struct AdamWSlice {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t numel;
};
struct AdamWScalars {
  float lr_decay;  // 1 - lr * weight_decay
  float beta1, beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
};
// Updates every slice: one launch per group of up to kAdamWSlicesPerLaunch slices.
inline constexpr int kAdamWSlicesPerLaunch = 48;
void launch_adamw(const Launch& l, const AdamWSlice* slices, int count, const AdamWScalars& s);

}  // namespace tessel::cuda
