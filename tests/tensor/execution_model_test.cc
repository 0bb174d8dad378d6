// The execution model on the CPU: streams and events, releasable storage under autograd, the
// meta device, cross-device copies and their errors.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"
#include "tessel/tensor/stream.h"

namespace tessel {
namespace {

// Runs fn and returns the message of the tessel::Error of type E it throws (fails otherwise).
template <typename E, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(StreamTest, CurrentStreamIsPerThreadAndRestoredByTheGuard) {
  const Device cpu = Device::cpu();
  EXPECT_EQ(current_stream(cpu), default_stream(cpu));
  EXPECT_EQ(current_stream(cpu).id(), 0);
  const Stream side = create_stream(cpu);
  const Stream other = create_stream(cpu);
  EXPECT_NE(side, default_stream(cpu));
  EXPECT_NE(side, other);
  {
    StreamGuard guard(side);
    EXPECT_EQ(current_stream(cpu), side);
    std::thread([&] { EXPECT_EQ(current_stream(cpu), default_stream(cpu)); }).join();
    {
      StreamGuard inner(other);
      EXPECT_EQ(current_stream(cpu), other);
    }
    EXPECT_EQ(current_stream(cpu), side);
  }
  EXPECT_EQ(current_stream(cpu), default_stream(cpu));
  EXPECT_TRUE(side.query());
  side.synchronize();
  EXPECT_EQ(side.str(), "cpu stream " + std::to_string(side.id()));
}

TEST(EventTest, CpuEventsCompleteWhenRecordedAndMeasureHostTime) {
  Event start(Device::cpu(), /*enable_timing=*/true);
  Event end(Device::cpu(), true);
  EXPECT_FALSE(start.recorded());
  EXPECT_TRUE(start.query());  // nothing recorded: complete
  start.record();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  end.record(create_stream(Device::cpu()));
  EXPECT_TRUE(end.query());
  end.synchronize();
  EXPECT_GE(start.elapsed(end), std::chrono::milliseconds(20));
  default_stream(Device::cpu()).wait(end);  // trivially satisfied

  Event untimed(Device::cpu());
  untimed.record();
  expect_contains(error_of<InvalidArgument>([&] { untimed.elapsed(end); }), "enable_timing");
  Event never(Device::cpu(), true);
  expect_contains(error_of<InvalidArgument>([&] { start.elapsed(never); }), "recorded");
}

TEST(StreamTest, DevicesThatDoNotExistAreNamed) {
  if (device_count(DeviceType::kCUDA) > 0) GTEST_SKIP() << "this process sees a CUDA device";
  const std::string msg = error_of<Unavailable>([] { create_stream(Device::cuda(0)); });
  expect_contains(msg, "cuda:0");
  expect_contains(error_of<Unavailable>([] { Event e(Device::cuda(1)); }), "cuda:1");
  expect_contains(error_of<Unavailable>([] { empty({2}, DType::kF32, Device::cuda(0)); }),
                  "cuda:0");
  const Tensor x = ones({3});
  const std::string copy = error_of<Unavailable>([&] { to(x, Device::cuda(0)); });
  expect_contains(copy, "cuda:0");
}

// FSDP's pattern: the parameter's memory is given back after forward and refilled (with the
// same values) before backward. Autograd saved a view of the parameter for the gradient of the
// input; it must read the refilled memory.
TEST(ReleasableStorageTest, GradientsMatchARunThatNeverReleased) {
  auto run = [](bool release, int64_t* dropped) {
    Generator gen(7);
    const Tensor w = randn({256, 512}, gen).set_requires_grad(true);
    const Tensor x = randn({8, 256}, gen).set_requires_grad(true);
    const Tensor y = matmul(x, w);  // saves w for dx and x for dw
    if (release) {
      const Tensor keep = clone(detach(w));  // the "shard" this rank keeps
      const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
      w.storage().release();
      *dropped = before - memory_stats(Device::cpu()).allocated_bytes;
      EXPECT_TRUE(w.storage().is_released());
      expect_contains(error_of<InvalidArgument>([&] { w.data<float>(); }), "released");
      w.storage().refill();
      NoGradGuard no_grad;
      copy_(w, keep);  // the "all-gather" back into the same storage
    }
    backward(sum(mul(y, y)));
    return std::make_pair(to_vector<float>(x.grad()), to_vector<float>(w.grad()));
  };
  int64_t dropped = 0;
  const auto plain = run(false, nullptr);
  const auto released = run(true, &dropped);
  EXPECT_EQ(plain.first, released.first);
  EXPECT_EQ(plain.second, released.second);
  EXPECT_EQ(dropped, 256 * 512 * 4);  // the statistics show the parameter's bytes given back
}

TEST(ReleasableStorageTest, WrappedMemoryCannotBeReleased) {
  float data[4] = {1, 2, 3, 4};
  Storage s = Storage::wrap(data, sizeof(data), Device::cpu(), nullptr);
  EXPECT_THROW(s.release(), InvalidArgument);
  Storage own = Storage::allocate(64, Device::cpu());
  own.release();
  own.release();  // idempotent
  own.refill();
  EXPECT_NE(own.data(), nullptr);
  own.refill();  // no-op when not released
}

TEST(MetaDeviceTest, OpsComputeShapesAndAllocateNothing) {
  const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
  Tensor a = randn({1 << 14, 1 << 14}, DType::kF32, Device::meta());  // 1 GiB if it were real
  Tensor b = ones({1 << 14}, DType::kF32, Device::meta());
  Tensor c = gelu(add(matmul(a, a), b));
  EXPECT_EQ(c.shape(), (Shape{1 << 14, 1 << 14}));
  EXPECT_TRUE(c.is_meta());
  EXPECT_EQ(sum(c, {1}).shape(), (Shape{1 << 14}));
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes, before);
  // A meta tensor can be moved to the meta device and made from a real one.
  EXPECT_TRUE(to(ones({2}), Device::meta()).is_meta());
  // Reading one names the device and the op.
  const std::string item_msg = error_of<InvalidArgument>([&] { item(sum(b)); });
  expect_contains(item_msg, "meta");
  expect_contains(item_msg, "item");
  const std::string to_msg = error_of<InvalidArgument>([&] { to(b, Device::cpu()); });
  expect_contains(to_msg, "meta device");
  expect_contains(to_msg, "to:");
  expect_contains(error_of<InvalidArgument>([&] { b.data<float>(); }), "meta device");
  const Tensor host = zeros({1 << 14});
  expect_contains(error_of<InvalidArgument>([&] { copy_(host, b); }), "copy_");
  // Mixing devices in one op is refused, naming both.
  const std::string mix = error_of<InvalidArgument>([&] { add(host, b); });
  expect_contains(mix, "cpu");
  expect_contains(mix, "meta");
}

TEST(MetaDeviceTest, DefaultDeviceGuardScopesFactoryFunctions) {
  EXPECT_EQ(default_device(), Device::cpu());
  {
    DefaultDeviceGuard meta(Device::meta());
    EXPECT_TRUE(zeros({3}).is_meta());
    EXPECT_TRUE(randn({3}).is_meta());
    EXPECT_TRUE(arange(5).is_meta());
    std::thread([] { EXPECT_EQ(default_device(), Device::cpu()); }).join();
    {
      DefaultDeviceGuard cpu(Device::cpu());
      EXPECT_FALSE(zeros({3}).is_meta());
    }
    EXPECT_EQ(default_device(), Device::meta());
  }
  EXPECT_FALSE(zeros({3}).is_meta());
}

TEST(SetDataTest, KeepsIdentityAndAutogradStateAndDropsAStaleGradient) {
  Tensor p = ones({2, 3}).set_requires_grad(true);
  const Tensor alias = p;
  backward(sum(mul(p, 2.0)));
  ASSERT_TRUE(p.grad().defined());
  p.set_data(zeros({6}));
  EXPECT_EQ(alias.shape(), (Shape{6}));  // every handle sees the new data
  EXPECT_TRUE(alias.requires_grad());
  EXPECT_FALSE(alias.grad().defined());  // the (2, 3) gradient no longer fits
  EXPECT_THROW(p.set_data(zeros({2}, DType::kI64)), InvalidArgument);
}

// A shard initialised in place gets exactly its box of the whole tensor's draw, and the
// generator advances as for the whole tensor (row boxes, column boxes, inner boxes of 3-D).
TEST(ShardInitTest, BoxesDrawTheirPartOfTheWholeTensorsValues) {
  const Shape global = {6, 5, 4};
  for (const auto& [offset, size] : std::vector<std::pair<Shape, Shape>>{{{2, 0, 0}, {3, 5, 4}},
                                                                         {{0, 1, 0}, {6, 3, 4}},
                                                                         {{1, 2, 1}, {4, 2, 2}},
                                                                         {{5, 0, 0}, {0, 5, 4}}}) {
    Generator whole_gen(9), box_gen(9);
    Tensor whole = empty(global);
    normal_(whole, 0.5, 2.0, &whole_gen);
    Tensor box = empty(size);
    box.set_shard_info(std::make_shared<ShardInfo>(ShardInfo{global, offset, nullptr}));
    normal_(box, 0.5, 2.0, &box_gen);
    Tensor expected = whole;
    for (int64_t d = 0; d < 3; ++d) expected = narrow(expected, d, offset[d], size[d]);
    EXPECT_EQ(to_vector<float>(box), to_vector<float>(expected)) << shape_str(offset);
    EXPECT_EQ(box_gen.offset(), whole_gen.offset());
    uniform_(box, -1.0, 1.0, &box_gen);
    uniform_(whole, -1.0, 1.0, &whole_gen);
    expected = whole;
    for (int64_t d = 0; d < 3; ++d) expected = narrow(expected, d, offset[d], size[d]);
    EXPECT_EQ(to_vector<float>(box), to_vector<float>(expected)) << shape_str(offset);
  }
  Tensor t = empty({2, 2});
  EXPECT_THROW(t.set_shard_info(std::make_shared<ShardInfo>(ShardInfo{{3, 2}, {2, 0}, nullptr})),
               InvalidArgument);
}

TEST(CopyTest, SameDeviceCopiesConvertAndBroadcast) {
  const Tensor src = from_vector<float>({1.5f, -2.0f, 3.25f});
  Tensor dst = zeros({2, 3}, DType::kBF16);
  copy_(dst, src);
  EXPECT_EQ(to_vector<float>(dst), (std::vector<float>{1.5f, -2.0f, 3.25f, 1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(src.to(DType::kI64).dtype(), DType::kI64);
  EXPECT_EQ(src.to(Device::cpu()).impl_ptr(), src.impl_ptr());
}

}  // namespace
}  // namespace tessel
