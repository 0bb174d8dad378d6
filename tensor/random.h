#pragma once
// Counter-based random numbers (Philox4x32-10). Element i of a draw made at (seed, offset) is a
// pure function of (seed, offset + i), so a tensor gets the same numbers whatever the thread
// count or device; a Generator hands out disjoint offset ranges.
//
//   Generator gen(42);
//   Tensor noise = randn({4, 8}, gen);        // offsets [0, 32) of seed 42
//   Tensor more = rand({16}, gen);            // offsets [32, 48)

#include <array>
#include <cstdint>
#include <mutex>

namespace tessel {

// Philox4x32 with 10 rounds: four 32-bit random words for a 128-bit counter and 64-bit key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Values derived from philox4x32({lo(index), hi(index), 0, 0}, {lo(seed), hi(seed)}):
// a uniform float in [0, 1) from word 0 (24 bits), and a standard normal (Box-Muller on words
// 0 and 1).
float philox_uniform(uint64_t seed, uint64_t index);
float philox_normal(uint64_t seed, uint64_t index);

// A seed plus a running offset. Thread-safe.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const;
  uint64_t offset() const;
  // Resets to `seed`, offset 0.
  void manual_seed(uint64_t seed);
  // Returns the current offset and advances it by `count` (the elements of one draw).
  uint64_t reserve(uint64_t count);

 private:
  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide generator used when an op is given none (seed 0 until manual_seed).
Generator& default_generator();
// default_generator().manual_seed(seed).
void manual_seed(uint64_t seed);

}  // namespace tessel
