#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tessel/base/error.h"
#include "tessel/tensor/tensor.h"

namespace tessel {
namespace {

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_THROW(dtype_from_name("f64"), InvalidArgument);
}

TEST(DTypeTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(float(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(float(BFloat16(-2.5f)), -2.5f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float(BFloat16(1.0f + 1.0f / 256)), 1.0f);
  // Just above halfway rounds up.
  EXPECT_EQ(float(BFloat16(1.0f + 1.0f / 256 + 1.0f / 65536)), 1.0f + 1.0f / 128);
  EXPECT_TRUE(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(float(BFloat16(std::numeric_limits<float>::infinity()))));
}

TEST(DTypeTest, HalfConverts) {
  EXPECT_EQ(float(Half(1.5f)), 1.5f);
  EXPECT_EQ(float(Half(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(float(Half(1e6f))));
  EXPECT_NEAR(float(Half(0.1f)), 0.1f, 1e-4);
}

TEST(DeviceTest, ParseAndPrint) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_THROW(parse_device("tpu"), InvalidArgument);
  EXPECT_THROW(parse_device("cuda:-1"), InvalidArgument);
}

TEST(TensorCoreTest, EmptyZerosAndContiguity) {
  Tensor t = zeros({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_THROW(t.size(3), OutOfRange);
  EXPECT_THROW(t.data<int64_t>(), InvalidArgument);
  EXPECT_EQ(t.str(), "Tensor(shape=(2, 3, 4), dtype=f32, device=cpu)");
}

TEST(TensorCoreTest, ScalarAndEmptyShapes) {
  Tensor s = zeros({});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.dim(), 0);
  Tensor e = empty({0, 5}, DType::kI64);
  EXPECT_EQ(e.numel(), 0);
  EXPECT_NE(e.data_ptr(), nullptr);
  EXPECT_THROW(empty({2, -1}), InvalidArgument);
}

TEST(TensorCoreTest, FromVectorCopies) {
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  Tensor t = from_vector(v, {2, 3});
  v[0] = 100;
  EXPECT_EQ(t.data<float>()[0], 1.0f);
  EXPECT_EQ(t.data<float>()[5], 6.0f);
  EXPECT_THROW(from_vector(v, {4, 2}), InvalidArgument);
}

TEST(TensorCoreTest, AsStridedSharesStorageAndChecksBounds) {
  Tensor t = from_vector<int32_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor col = t.as_strided({2}, {3}, 1);  // column 1
  EXPECT_TRUE(col.storage().is_same(t.storage()));
  EXPECT_EQ(col.data<int32_t>()[0], 1);
  EXPECT_FALSE(t.as_strided({3, 2}, {1, 3}, 0).is_contiguous());
  EXPECT_THROW(t.as_strided({2}, {3}, 3), OutOfRange);
  EXPECT_THROW(t.as_strided({7}, {1}, 0), OutOfRange);
}

TEST(TensorCoreTest, GradSlot) {
  Tensor w = zeros({2, 2});
  EXPECT_FALSE(w.requires_grad());
  EXPECT_FALSE(w.grad().defined());
  w.set_requires_grad(true);
  EXPECT_TRUE(w.requires_grad());
  w.set_grad(from_vector<float>({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(w.grad().data<float>()[3], 4.0f);
  Tensor alias = w;  // handles share autograd state
  EXPECT_TRUE(alias.grad().defined());
  EXPECT_THROW(w.set_grad(zeros({4})), InvalidArgument);
  Tensor ids = zeros({3}, DType::kI64);
  EXPECT_THROW(ids.set_requires_grad(true), InvalidArgument);
}

TEST(TensorCoreTest, UndefinedTensorThrows) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW(t.shape(), InvalidArgument);
}

TEST(TensorCoreTest, CudaWithoutADeviceIsUnavailable) {
  if (device_count(DeviceType::kCUDA) > 0) GTEST_SKIP() << "this process sees a CUDA device";
  EXPECT_THROW(empty({4}, DType::kF32, Device::cuda(0)), Unavailable);
}

}  // namespace
}  // namespace tessel
