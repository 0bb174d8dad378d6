#include "attention_cuda_emulator.h"

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tessel/kernels/attention/cuda/internal/warp_primitives.h"
#include "tessel/tensor/dtype.h"

namespace tessel::kernels::attention::cuda {
namespace {

struct Slot {
  const void* ptr = nullptr;
  uint32_t a[4] = {};
  uint32_t b[2] = {};
  float f = 0;
};

struct Warp {
  std::barrier<> barrier{32};
  Slot slots[32];
};

struct Copy {
  void* dst;
  const void* src;
  int bytes;
  bool pred;
};

struct Cta {
  explicit Cta(int threads) : barrier(threads), warps(threads / 32) {
    for (auto& w : warps) w = std::make_unique<Warp>();
  }
  std::barrier<> barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

struct ThreadState {
  int tid = 0;
  Cta* cta = nullptr;
  std::vector<Copy> open;                 // issued, not yet committed
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
};

thread_local ThreadState* t_state = nullptr;

Warp& my_warp() { return *t_state->cta->warps[t_state->tid / 32]; }
int my_lane() { return t_state->tid % 32; }

float half_to_float(uint16_t bits, bool bf16) {
  if (bf16) {
    BFloat16 x;
    x.bits = bits;
    return static_cast<float>(x);
  }
  Half x;
  x.bits = bits;
  return static_cast<float>(x);
}

uint16_t element(uint32_t reg, int half) { return static_cast<uint16_t>(half ? reg >> 16 : reg); }

void perform(const Copy& c) {
  if (c.pred) {
    std::memcpy(c.dst, c.src, c.bytes);
  } else {
    std::memset(c.dst, 0, c.bytes);
  }
}

}  // namespace

int thread_index() { return t_state->tid; }

void cta_sync() { t_state->cta->barrier.arrive_and_wait(); }

float shfl_xor(float v, int mask) {
  Warp& w = my_warp();
  const int lane = my_lane();
  w.slots[lane].f = v;
  w.barrier.arrive_and_wait();
  const float r = w.slots[lane ^ mask].f;
  w.barrier.arrive_and_wait();
  return r;
}

void st_shared_u32(SmemAddr a, uint32_t v) { std::memcpy(a, &v, 4); }
void st_shared_f32(SmemAddr a, float v) { std::memcpy(a, &v, 4); }
float ld_shared_f32(SmemAddr a) {
  float v;
  std::memcpy(&v, a, 4);
  return v;
}
void copy16_to_global(void* dst, SmemAddr src) { std::memcpy(dst, src, 16); }

void ldmatrix_x4(uint32_t (&r)[4], SmemAddr smem_row) {
  Warp& w = my_warp();
  const int lane = my_lane();
  w.slots[lane].ptr = smem_row;
  w.barrier.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const auto* row = static_cast<const uint16_t*>(w.slots[i * 8 + lane / 4].ptr);
    r[i] = row[2 * (lane % 4)] | (uint32_t{row[2 * (lane % 4) + 1]} << 16);
  }
  w.barrier.arrive_and_wait();
}

void ldmatrix_x4_trans(uint32_t (&r)[4], SmemAddr smem_row) {
  Warp& w = my_warp();
  const int lane = my_lane();
  w.slots[lane].ptr = smem_row;
  w.barrier.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const auto* r0 = static_cast<const uint16_t*>(w.slots[i * 8 + 2 * (lane % 4)].ptr);
    const auto* r1 = static_cast<const uint16_t*>(w.slots[i * 8 + 2 * (lane % 4) + 1].ptr);
    r[i] = r0[lane / 4] | (uint32_t{r1[lane / 4]} << 16);
  }
  w.barrier.arrive_and_wait();
}

void emulated_mma_16816(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                        uint32_t b1) {
  Warp& w = my_warp();
  const int lane = my_lane();
  Slot& mine = w.slots[lane];
  for (int i = 0; i < 4; ++i) mine.a[i] = a[i];
  mine.b[0] = b0;
  mine.b[1] = b1;
  w.barrier.arrive_and_wait();
  for (int c = 0; c < 4; ++c) {
    const int row = lane / 4 + (c >= 2 ? 8 : 0), col = 2 * (lane % 4) + (c & 1);
    double acc = d[c];
    for (int k = 0; k < 16; ++k) {
      const Slot& sa = w.slots[(row % 8) * 4 + (k % 8) / 2];
      const Slot& sb = w.slots[col * 4 + (k % 8) / 2];
      const float x = half_to_float(element(sa.a[(row >= 8) + 2 * (k >= 8)], k & 1), bf16);
      const float y = half_to_float(element(sb.b[k >= 8], k & 1), bf16);
      acc += static_cast<double>(x) * y;
    }
    d[c] = static_cast<float>(acc);
  }
  w.barrier.arrive_and_wait();
}

uint32_t emulated_pack2(bool bf16, float lo, float hi) {
  const uint16_t l = bf16 ? BFloat16(lo).bits : Half(lo).bits;
  const uint16_t h = bf16 ? BFloat16(hi).bits : Half(hi).bits;
  return l | (uint32_t{h} << 16);
}

float emulated_to_float(bool bf16, uint16_t bits) { return half_to_float(bits, bf16); }

void cp_async_16(SmemAddr smem, const void* gmem, bool pred) {
  t_state->open.push_back({smem, gmem, 16, pred});
}
void cp_async_4(SmemAddr smem, const void* gmem, bool pred) {
  t_state->open.push_back({smem, gmem, 4, pred});
}
void cp_async_commit() {
  t_state->groups.push_back(std::move(t_state->open));
  t_state->open.clear();
}
void emulated_cp_async_wait(int n) {
  auto& groups = t_state->groups;
  while (static_cast<int>(groups.size()) > n) {
    for (const Copy& c : groups.front()) perform(c);
    groups.erase(groups.begin());
  }
}

float exp2_fast(float x) { return std::exp2(x); }

void atomic_add_f32(float* p, float v) { std::atomic_ref<float>(*p).fetch_add(v); }
void load16(uint32_t (&r)[4], const void* src) { std::memcpy(r, src, 16); }
void store16(void* dst, const uint32_t (&r)[4]) { std::memcpy(dst, r, 16); }

namespace emulator {

void run_grid(const int (&grid)[3], int threads, int smem_bytes,
              const std::function<void(int, int, int, char*)>& body) {
  if (threads % 32 != 0) throw std::logic_error("threads must be a multiple of 32");
  auto* smem = static_cast<char*>(std::aligned_alloc(1024, ((smem_bytes + 1023) / 1024 + 1) * 1024));
  std::unique_ptr<char, decltype(&std::free)> smem_owner(smem, &std::free);
  for (int bz = 0; bz < grid[2]; ++bz) {
    for (int by = 0; by < grid[1]; ++by) {
      for (int bx = 0; bx < grid[0]; ++bx) {
        std::memset(smem, 0xA5, smem_bytes);
        Cta cta(threads);
        std::atomic<bool> leftover{false};
        std::vector<std::thread> team;
        team.reserve(threads);
        for (int tid = 0; tid < threads; ++tid) {
          team.emplace_back([&, tid] {
            ThreadState state;
            state.tid = tid;
            state.cta = &cta;
            t_state = &state;
            body(bx, by, bz, smem);
            if (!state.open.empty() || !state.groups.empty()) leftover = true;
            t_state = nullptr;
          });
        }
        for (auto& th : team) th.join();
        if (leftover) throw std::logic_error("a CTA ended with cp.async copies still queued");
      }
    }
  }
}

}  // namespace emulator
}  // namespace tessel::kernels::attention::cuda
