#include "tessel/tensor/random.h"

#include <cmath>
#include <numbers>

namespace tessel {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kM0} * c[0];
    const uint64_t p1 = uint64_t{kM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

namespace {
std::array<uint32_t, 4> philox_at(uint64_t seed, uint64_t index) {
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}
constexpr float kTwoPow24Inv = 1.0f / 16777216.0f;
}  // namespace

float philox_uniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(philox_at(seed, index)[0] >> 8) * kTwoPow24Inv;
}

float philox_normal(uint64_t seed, uint64_t index) {
  const auto r = philox_at(seed, index);
  const float u1 = (static_cast<float>(r[0] >> 8) + 1.0f) * kTwoPow24Inv;  // (0, 1]
  const float u2 = static_cast<float>(r[1] >> 8) * kTwoPow24Inv;
  // log and cos in double, rounded to f32: the correctly rounded f32 values for each of the
  // 2^24 possible arguments (checked exhaustively against long double; the exact values lie at
  // least 9 double ulps from an f32 rounding boundary), so any device whose double log and cos
  // are that accurate (CUDA's: 1 and 2 ulps) draws the same numbers bit for bit. (glibc's f32
  // logf and cosf round 0.7% and 1.3% of these arguments the other way.)
  const float log_u1 = static_cast<float>(std::log(static_cast<double>(u1)));
  const float cos_u2 =
      static_cast<float>(std::cos(static_cast<double>(2.0f * std::numbers::pi_v<float> * u2)));
  return std::sqrt(-2.0f * log_u1) * cos_u2;
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seed_;
}

uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lock(mu_);
  return offset_;
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = seed;
  offset_ = 0;
}

uint64_t Generator::reserve(uint64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t start = offset_;
  offset_ += count;
  return start;
}

Generator& default_generator() {
  static Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace tessel
