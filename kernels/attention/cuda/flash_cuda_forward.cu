// FlashAttention-2 forward on tensor cores (mma.sync m16n8k16, bf16/f16 in, f32 accumulate).
// The CTA algorithm first, then the kernel and its launcher. The algorithm is written against
// warp_primitives.h, so tests/kernels/attention_cuda_emulated_test.cc also runs it on the CPU.
//
// One CTA per (query block of kBlockM rows, query head, batch entry); kWarps warps, each owning
// kBlockM / kWarps consecutive query rows. Per key block of kBlockN keys:
//   S = Q K^T (Q, K from shared memory) -> mask -> online softmax (running row max m and row
//   sum l in registers) -> O = O * exp2(m_old - m_new) + P V, with P kept in registers as the
//   A operand of the second product (the S accumulators' layout is the A fragments' layout).
// Loads overlap the products FlashAttention-2's way with one buffer per operand: V of this
// block is fetched (cp.async) while S = Q K^T runs, and K of the next block while softmax and
// P V run. At the end O / l is staged through shared memory for 16-byte stores, and the
// logsumexp (m + log2 l) ln 2 is written per row: O(S) extra memory, no S x S buffer.

#include "tessel/kernels/attention/cuda/internal/flash_tiles.h"

namespace tessel::kernels::attention::cuda {

// Tile shapes, apart from the algorithm (FlashAttention's kernel traits): one set per head dim.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct ForwardTraits {
  static constexpr int kHeadDim = kHeadDim_;  // D of the kernel; smaller D is zero-padded
  static constexpr int kBlockM = kBlockM_;    // query rows per CTA
  static constexpr int kBlockN = kBlockN_;    // keys per step
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMT = kWarpRows / 16;  // m-tiles per warp
  static constexpr int kNT = kBlockN / 8;     // n-tiles of S per m-tile
  static constexpr int kDT = kHeadDim / 8;    // n-tiles of O per m-tile
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kHeadDim * 2;  // Q, K, V
  static_assert(kWarpRows % 16 == 0 && kBlockN % 64 == 0 && kHeadDim % 64 == 0, "tile shape");
};
// FlashAttention-2's choices for sm80/sm90 with 4 warps: 32 query rows per warp, so each K or
// V fragment read from shared memory feeds two products.
using ForwardD64 = ForwardTraits<64, 128, 64, 4>;
using ForwardD128 = ForwardTraits<128, 128, 64, 4>;

// kEpilogueBarrier is always true in the library; the emulator's test instantiates false to
// prove that it catches the barrier's absence.
template <class T, Elem E, bool kEpilogueBarrier = true>
TESSEL_DEVICE void flash_forward_cta(const FlashParams& p, int m_block, int h, int b, char* smem) {
  constexpr int kD = T::kHeadDim, kBM = T::kBlockM, kBN = T::kBlockN;
  constexpr int kMT = T::kMT, kNT = T::kNT, kDT = T::kDT;
  const int tid = thread_index(), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int hk = h / (p.q_heads / p.kv_heads);
  const int i0 = m_block * kBM;
  const int rows = imin(kBM, p.q_len - i0);
  const int warp_row0 = warp * T::kWarpRows;

  const uint16_t* q = static_cast<const uint16_t*>(p.q.data) + p.q.offset(b, h, i0);
  const uint16_t* k = static_cast<const uint16_t*>(p.k.data) + p.k.offset(b, hk, 0);
  const uint16_t* v = static_cast<const uint16_t*>(p.v.data) + p.v.offset(b, hk, 0);
  const SmemTile<kBM, kD> sq{smem_address(smem)};
  const SmemTile<kBN, kD> sk{sq.base + sq.kBytes};
  const SmemTile<kBN, kD> sv{sk.base + sk.kBytes};

  int n_lo, n_hi;
  key_block_range(p.mask, p.kv_len, kBN, i0, i0 + rows, &n_lo, &n_hi);
  auto classify = [&](int n) {
    const int j0 = n * kBN, j1 = imin(j0 + kBN, p.kv_len);
    BlockClass c = block_class(p.mask, b, h, i0, i0 + rows, j0, j1);
    if (c == BlockClass::kFull && j1 - j0 < kBN) c = BlockClass::kMasked;
    return c;
  };
  auto next_block = [&](int n) {
    while (n < n_hi && classify(n) == BlockClass::kSkip) ++n;
    return n;
  };

  // Q and the first K.
  load_tile<T::kThreads>(sq, q, p.q.stride_s, rows, p.head_dim, tid);
  int n = next_block(n_lo);
  if (n < n_hi) {
    load_tile<T::kThreads>(sk, k + n * kBN * p.k.stride_s, p.k.stride_s,
                           imin(kBN, p.kv_len - n * kBN), p.head_dim, tid);
  }
  cp_async_commit();

  float o[kMT][kDT][4];
  float row_max[kMT][2], row_sum[kMT][2];  // row max in log2 units of the scaled scores
  TESSEL_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
    TESSEL_UNROLL
    for (int dt = 0; dt < kDT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0;
  }

  while (n < n_hi) {
    const int j0 = n * kBN;
    const BlockClass cls = classify(n);
    // 1. Fetch V of this block while S = Q K^T runs.
    load_tile<T::kThreads>(sv, v + j0 * p.v.stride_s, p.v.stride_s, imin(kBN, p.kv_len - j0),
                           p.head_dim, tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q and this K have landed
    cta_sync();

    // 2. S = Q K^T for the warp's rows. (Per-element mask and dropout bits first: their
    //    Philox and table lookups need registers that S would otherwise compete for.)
    const int row0 = i0 + warp_row0 + g, col0 = j0 + 2 * t;
    const bool tile_masked = cls == BlockClass::kMasked && p.mask.tiles != nullptr;
    ElementBits<kMT, kNT> visible, kept;
    if (tile_masked) visible = visible_bits<false, kMT, kNT>(p, b, h, row0, col0);
    if (p.dropout.threshold != 0) kept = dropout_bits<false, kMT, kNT>(p.dropout, b, h, row0, col0);
    float s[kMT][kNT][4];
    TESSEL_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
      TESSEL_UNROLL
      for (int nt = 0; nt < kNT; ++nt)
        s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0;
    }
    gemm_a_bt<E, kMT, kNT, kD>(s, sq, warp_row0, sk, 0, lane);

    // 3. Fetch the next K while softmax and P V run (every warp is done with sk).
    const int next = next_block(n + 1);
    cp_async_wait<0>();  // V has landed
    cta_sync();
    if (next < n_hi) {
      load_tile<T::kThreads>(sk, k + next * kBN * p.k.stride_s, p.k.stride_s,
                             imin(kBN, p.kv_len - next * kBN), p.head_dim, tid);
    }
    cp_async_commit();

    // 4. Scale to log2 units; mask elements of partial blocks.
    TESSEL_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
      TESSEL_UNROLL
      for (int nt = 0; nt < kNT; ++nt) {
        TESSEL_UNROLL
        for (int c = 0; c < 4; ++c) s[mt][nt][c] *= p.scale_log2;
      }
    }
    if (tile_masked) {
      mask_bits(s, visible);
    } else if (cls == BlockClass::kMasked) {
      mask_window<false>(s, p, row0, col0);
    }

    // 5. Online softmax: new row maxima, rescale O and l, P = exp2(S - m).
    TESSEL_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
      TESSEL_UNROLL
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
        TESSEL_UNROLL
        for (int nt = 0; nt < kNT; ++nt)
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        mx = quad_max(mx);
        // A row that has seen nothing yet keeps m = -inf; subtract 0 then (exp2(-inf) = 0).
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        const float alpha = exp2_fast(row_max[mt][r] - m_use);
        row_max[mt][r] = mx;
        row_sum[mt][r] *= alpha;
        TESSEL_UNROLL
        for (int dt = 0; dt < kDT; ++dt) {
          o[mt][dt][2 * r] *= alpha;
          o[mt][dt][2 * r + 1] *= alpha;
        }
        TESSEL_UNROLL
        for (int nt = 0; nt < kNT; ++nt) {
          TESSEL_UNROLL
          for (int c = 2 * r; c < 2 * r + 2; ++c) {
            const float pr = exp2_fast(s[mt][nt][c] - m_use);
            row_sum[mt][r] += pr;
            s[mt][nt][c] = pr;
          }
        }
      }
    }
    // Dropout acts on the probabilities that multiply V, not on the normaliser l.
    if (p.dropout.threshold != 0) apply_dropout(s, kept, p.dropout.keep_scale);

    // 6. O += P V.
    gemm_p_b<E, kMT, kDT, kBN>(o, s, sv, 0, 0, lane);
    cta_sync();  // every warp is done with sv before the next V lands there
    n = next;
  }
  // A CTA whose rows see no key (bottom-right causal with S_q - S_k >= kBlockM, a mask hiding
  // the whole block, S_k = 0) skips the loop with Q's copies still in flight, and a thread's
  // copies cover other warps' rows of sq. The barrier makes them land before any warp writes
  // its output rows there; without it a late copy turns zeros into Q.
  cp_async_wait<0>();
  if constexpr (kEpilogueBarrier) cta_sync();

  // Epilogue: O / l through shared memory (each warp writes its own rows of sq), logsumexp.
  float inv[kMT][2];
  TESSEL_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
    TESSEL_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(row_sum[mt][r]);
      inv[mt][r] = l > 0 ? 1.0f / l : 0.0f;
      const int row = warp_row0 + mt * 16 + g + 8 * r;
      if (t == 0 && row < rows) {
        const float lse = l > 0 ? (row_max[mt][r] + log2f(l)) * 0.6931471805599453f : -INFINITY;
        p.lse[(static_cast<int64_t>(b) * p.q_heads + h) * p.q_len + i0 + row] = lse;
      }
    }
    TESSEL_UNROLL
    for (int dt = 0; dt < kDT; ++dt) {
      o[mt][dt][0] *= inv[mt][0];
      o[mt][dt][1] *= inv[mt][0];
      o[mt][dt][2] *= inv[mt][1];
      o[mt][dt][3] *= inv[mt][1];
    }
  }
  accumulators_to_tile<E>(o, 1.0f, sq, warp_row0, 0, lane);
  cta_sync();
  uint16_t* out = static_cast<uint16_t*>(p.out.data) + p.out.offset(b, h, i0);
  store_tile<T::kThreads>(sq, out, p.out.stride_s, rows, p.head_dim, tid);
}

// Grid: (query blocks, H_q, B); blockIdx.x counts query blocks from the last, so that under a
// causal mask the longest CTAs start first.
struct LaunchShape {
  int grid[3];
  int threads;
  int smem_bytes;
};
template <class T>
inline LaunchShape forward_launch_shape(const FlashParams& p) {
  return {
      {(p.q_len + T::kBlockM - 1) / T::kBlockM, p.q_heads, p.batch}, T::kThreads, T::kSmemBytes};
}
TESSEL_HD int forward_query_block(int block_x, int grid_x) { return grid_x - 1 - block_x; }

}  // namespace tessel::kernels::attention::cuda

#if defined(__CUDACC__)

#include "tessel/kernels/attention/cuda/internal/flash_launch.h"
#include "tessel/tensor/cuda/cuda_check.h"

namespace tessel::kernels::attention::cuda {

template <class T, Elem E>
__global__ void __launch_bounds__(T::kThreads) flash_forward_kernel(const FlashParams p) {
  extern __shared__ __align__(1024) char smem[];
  flash_forward_cta<T, E>(p, forward_query_block(blockIdx.x, gridDim.x), blockIdx.y, blockIdx.z,
                          smem);
}

template <class T, Elem E>
void launch_forward(const FlashParams& p, cudaStream_t stream) {
  const LaunchShape s = forward_launch_shape<T>(p);
  auto kernel = flash_forward_kernel<T, E>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), s.smem_bytes);
  kernel<<<dim3(s.grid[0], s.grid[1], s.grid[2]), s.threads, s.smem_bytes, stream>>>(p);
  ::tessel::cuda::check_launch("flash_forward_kernel", ::tessel::cuda::current_device());
}

void launch_flash_forward(const FlashParams& p, Elem elem, int kernel_head_dim,
                          cudaStream_t stream) {
  if (p.q_len == 0 || p.q_heads == 0 || p.batch == 0) return;
  const bool bf16 = elem == Elem::kBf16;
  if (kernel_head_dim == 64) {
    bf16 ? launch_forward<ForwardD64, Elem::kBf16>(p, stream)
         : launch_forward<ForwardD64, Elem::kF16>(p, stream);
  } else {
    bf16 ? launch_forward<ForwardD128, Elem::kBf16>(p, stream)
         : launch_forward<ForwardD128, Elem::kF16>(p, stream);
  }
}

}  // namespace tessel::kernels::attention::cuda

#endif  // __CUDACC__
