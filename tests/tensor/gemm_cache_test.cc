// The CUDA matmul's per-thread cache of cuBLASLt setups (tensor/cuda/gemm_cache.h): keys tell
// apart every change of shape, dtype, transpose, epilogue, alignment and device; a repeated
// GEMM is a hit, so a training step's matmuls make their descriptors once; the cache stays
// bounded, forgetting the least recently used entry.
#include "tessel/tensor/cuda/gemm_cache.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tessel/tensor/ops.h"

namespace tessel::cuda {
namespace {

GemmPlan plan_of(const Shape& a, const Shape& b) {
  const Tensor x = empty(a, DType::kF32, Device::meta());
  const Tensor w = empty(b, DType::kF32, Device::meta());
  Shape out = a;
  out.back() = b.back();
  return plan_gemm(x, w, empty(out, DType::kF32, Device::meta()));
}

TEST(GemmCacheTest, KeysDifferInEveryPartOfTheProblem) {
  const GemmPlan plan = plan_of({8, 16}, {16, 32});
  const GemmKeyParts parts{.device = 0, .ab_dtype = DType::kBF16, .d_dtype = DType::kBF16};
  const GemmKey base = gemm_key(plan, parts);
  EXPECT_EQ(gemm_key(plan, parts), base);
  EXPECT_EQ(gemm_key(plan_of({8, 16}, {16, 32}), parts), base) << "same shapes, same key";

  std::vector<std::pair<std::string, GemmKey>> variants = {
      {"M", gemm_key(plan_of({9, 16}, {16, 32}), parts)},
      {"K", gemm_key(plan_of({8, 17}, {17, 32}), parts)},
      {"N", gemm_key(plan_of({8, 16}, {16, 33}), parts)},
      {"batch", gemm_key(plan_of({2, 8, 16}, {2, 16, 32}), parts)},
  };
  GemmPlan transposed = plan;
  transposed.A.transpose = !transposed.A.transpose;
  variants.emplace_back("transpose", gemm_key(transposed, parts));
  auto with = [&](const std::function<void(GemmKeyParts&)>& change) {
    GemmKeyParts p = parts;
    change(p);
    return gemm_key(plan, p);
  };
  variants.emplace_back("device", with([](auto& p) { p.device = 1; }));
  variants.emplace_back("dtype", with([](auto& p) { p.ab_dtype = DType::kF16; }));
  variants.emplace_back("out dtype", with([](auto& p) { p.d_dtype = DType::kF32; }));
  variants.emplace_back("tf32", with([](auto& p) { p.tf32 = true; }));
  variants.emplace_back("epilogue", with([](auto& p) { p.epilogue = 4; }));
  variants.emplace_back("bias dtype", with([](auto& p) { p.bias_dtype = DType::kBF16; }));
  variants.emplace_back("alignment", with([](auto& p) { p.align_a = 16; }));
  for (const auto& [what, key] : variants) EXPECT_NE(key, base) << what;
}

TEST(GemmCacheTest, RepeatedGemmsHit_SetupIsMadeOncePerProblem) {
  GemmCache<int> cache(64);
  int made = 0;
  auto setup = [&](const GemmKey& key) {
    if (int* found = cache.find(key)) return *found;
    return cache.insert(key, ++made);
  };
  // Ten steps of a model with three distinct GEMMs, each called twice per step.
  const GemmKeyParts parts;
  const GemmKey q = gemm_key(plan_of({64, 32}, {32, 96}), parts);
  const GemmKey o = gemm_key(plan_of({64, 32}, {32, 32}), parts);
  const GemmKey mlp = gemm_key(plan_of({64, 32}, {32, 128}), parts);
  for (int step = 0; step < 10; ++step) {
    for (const GemmKey* k : {&q, &o, &mlp, &q, &o, &mlp}) setup(*k);
  }
  EXPECT_EQ(made, 3);
  EXPECT_EQ(cache.counts().misses, 3);
  EXPECT_EQ(cache.counts().hits, 57);
  EXPECT_EQ(setup(q), 1) << "the entry made first is still q's";
}

TEST(GemmCacheTest, BoundedCacheForgetsTheLeastRecentlyUsed) {
  GemmCache<int> cache(2);
  const GemmKeyParts parts;
  const GemmKey a = gemm_key(plan_of({2, 3}, {3, 4}), parts);
  const GemmKey b = gemm_key(plan_of({2, 3}, {3, 5}), parts);
  const GemmKey c = gemm_key(plan_of({2, 3}, {3, 6}), parts);
  cache.insert(a, 1);
  cache.insert(b, 2);
  ASSERT_NE(cache.find(a), nullptr);  // a is now more recent than b
  cache.insert(c, 3);                 // evicts b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.counts().evictions, 1);
  EXPECT_EQ(cache.find(b), nullptr);
  EXPECT_EQ(*cache.find(a), 1);
  EXPECT_EQ(*cache.find(c), 3);
}

}  // namespace
}  // namespace tessel::cuda
