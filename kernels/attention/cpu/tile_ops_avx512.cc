// AVX-512F tile kernels (compiled with -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma).
#include <immintrin.h>

#define TESSEL_TILE_ISA avx512
#include "tessel/kernels/attention/cpu/internal/tile_ops_impl.h"
#include "tessel/kernels/attention/cpu/internal/vec_avx512.h"

namespace tessel::kernels::attention::internal {

// 6 rows x 4 vectors: 24 accumulators + 4 B vectors + 1 broadcast of 32 registers.
const TileOps& tile_ops_avx512() { return avx512::make_tile_ops<avx512::Vec512, 6, 4>("avx512"); }

}  // namespace tessel::kernels::attention::internal
