#include "attention_cuda_emulator.h"

#include <algorithm>
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

// A copy its issuing thread's wait has retired: complete for that thread, not yet visible to
// any other (the PTX memory model orders it before another thread's accesses only through a
// barrier). `data` is what will land; the issuing thread's own later stores to the same bytes
// update it, so they stay ordered after the copy.
struct Landed {
  char* dst;
  int bytes;
  unsigned char data[16];
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
  std::vector<Landed> landed;             // retired by a wait, published at the next barrier
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

// The bytes [lo, lo + n) and [b, b + m) intersect in [*from, *to).
bool overlap(const char* lo, int n, const char* b, int m, const char** from, const char** to) {
  *from = std::max(lo, b);
  *to = std::min(lo + n, b + m);
  return *from < *to;
}

// Reads shared memory as this thread sees it: memory, then its own landed, unpublished copies.
void read_shared(void* out, const char* a, int bytes) {
  std::memcpy(out, a, bytes);
  for (const Landed& l : t_state->landed) {
    const char *from, *to;
    if (overlap(a, bytes, l.dst, l.bytes, &from, &to)) {
      std::memcpy(static_cast<char*>(out) + (from - a), l.data + (from - l.dst), to - from);
    }
  }
}

// Writes shared memory; a store over this thread's own landed copy also replaces those bytes
// of the copy, so publishing it later cannot undo the store.
void write_shared(char* a, const void* in, int bytes) {
  std::memcpy(a, in, bytes);
  for (Landed& l : t_state->landed) {
    const char *from, *to;
    if (overlap(a, bytes, l.dst, l.bytes, &from, &to)) {
      std::memcpy(l.data + (from - l.dst), static_cast<const char*>(in) + (from - a), to - from);
    }
  }
}

// The latest moment the model allows: the copy lands in shared memory (for every thread) at the
// issuing thread's next barrier, over whatever other threads stored there in between.
void publish_landed() {
  for (const Landed& l : t_state->landed) std::memcpy(l.dst, l.data, l.bytes);
  t_state->landed.clear();
}

}  // namespace

int thread_index() { return t_state->tid; }

// Everyone arrives (no thread touches shared memory any more), each thread's retired copies
// land, and only then does anyone go on: a copy retired before the barrier is visible after it.
void cta_sync() {
  t_state->cta->barrier.arrive_and_wait();
  publish_landed();
  t_state->cta->barrier.arrive_and_wait();
}

float shfl_xor(float v, int mask) {
  Warp& w = my_warp();
  const int lane = my_lane();
  w.slots[lane].f = v;
  w.barrier.arrive_and_wait();
  const float r = w.slots[lane ^ mask].f;
  w.barrier.arrive_and_wait();
  return r;
}

void st_shared_u32(SmemAddr a, uint32_t v) { write_shared(a, &v, 4); }
void st_shared_f32(SmemAddr a, float v) { write_shared(a, &v, 4); }
float ld_shared_f32(SmemAddr a) {
  float v;
  read_shared(&v, a, 4);
  return v;
}
void copy16_to_global(void* dst, SmemAddr src) {
  unsigned char v[16];
  read_shared(v, src, 16);
  std::memcpy(dst, v, 16);
}

void ldmatrix_x4(uint32_t (&r)[4], SmemAddr smem_row) {
  Warp& w = my_warp();
  const int lane = my_lane();
  w.slots[lane].ptr = smem_row;
  w.barrier.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const auto* row = static_cast<const char*>(w.slots[i * 8 + lane / 4].ptr);
    read_shared(&r[i], row + 4 * (lane % 4), 4);
  }
  w.barrier.arrive_and_wait();
}

void ldmatrix_x4_trans(uint32_t (&r)[4], SmemAddr smem_row) {
  Warp& w = my_warp();
  const int lane = my_lane();
  w.slots[lane].ptr = smem_row;
  w.barrier.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const auto* r0 = static_cast<const char*>(w.slots[i * 8 + 2 * (lane % 4)].ptr);
    const auto* r1 = static_cast<const char*>(w.slots[i * 8 + 2 * (lane % 4) + 1].ptr);
    uint16_t lo, hi;
    read_shared(&lo, r0 + 2 * (lane / 4), 2);
    read_shared(&hi, r1 + 2 * (lane / 4), 2);
    r[i] = lo | (uint32_t{hi} << 16);
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
    for (const Copy& c : groups.front()) {
      Landed l{static_cast<char*>(c.dst), c.bytes, {}};
      if (c.pred) std::memcpy(l.data, c.src, c.bytes);  // zero-filled otherwise
      t_state->landed.push_back(l);
    }
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
  auto* smem =
      static_cast<char*>(std::aligned_alloc(1024, ((smem_bytes + 1023) / 1024 + 1) * 1024));
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
