// Bad attention inputs fail with InvalidArgument (or Unavailable) naming the problem.

#include <gtest/gtest.h>

#include <string>

#include "attention_test_util.h"
#include "tessel/base/error.h"
#include "tessel/kernels/attention/attention_math.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"

namespace tessel::kernels::attention {
namespace {

using testing::Buffer;

class AttentionErrorsTest : public ::testing::Test {
 protected:
  AttentionErrorsTest() {
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
  }
  // Runs both backends and checks each throws ErrorType with `needle` in its message.
  template <typename ErrorType>
  void expect_error(const std::string& needle) {
    std::vector<float> lse(64);
    for (int backend = 0; backend < 2; ++backend) {
      try {
        if (backend == 0)
          flash_cpu_forward(p, out.view(), lse.data());
        else
          math_attention_forward(p, out.view(), lse.data());
        ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
      } catch (const ErrorType& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    }
  }
  Buffer q{DType::kF32, 2, 4, 8, 16}, k{DType::kF32, 2, 2, 8, 16}, v = k, out = q;
  AttentionProblem p;
};

TEST_F(AttentionErrorsTest, HeadCountsNotAMultiple) {
  Buffer kv3(DType::kF32, 2, 3, 8, 16);
  p.k = p.v = kv3.view();
  expect_error<InvalidArgument>("not a multiple of the 3 key/value heads");
}

TEST_F(AttentionErrorsTest, KeyAndValueHeadsDiffer) {
  Buffer v1(DType::kF32, 2, 1, 8, 16);
  p.v = v1.view();
  expect_error<InvalidArgument>("k has 2 heads but v has 1");
}

TEST_F(AttentionErrorsTest, HeadDimsDiffer) {
  Buffer k32(DType::kF32, 2, 2, 8, 32);
  p.k = k32.view();
  expect_error<InvalidArgument>("q head dim 16 differs from k head dim 32");
}

TEST_F(AttentionErrorsTest, DtypesDiffer) {
  Buffer kb(DType::kBF16, 2, 2, 8, 16);
  p.k = kb.view();
  expect_error<InvalidArgument>("dtypes differ: q f32, k bf16");
  p.k = k.view();
  p.q.dtype = DType::kI32;
  expect_error<InvalidArgument>("q has dtype i32");
}

TEST_F(AttentionErrorsTest, DevicesDiffer) {
  p.v.device = Device::cuda(0);
  expect_error<InvalidArgument>("devices differ: q cpu, k cpu, v cuda:0");
}

TEST_F(AttentionErrorsTest, NegativeWindow) {
  p.mask.window_left = -5;
  expect_error<InvalidArgument>("window_left -5 is negative");
}

TEST_F(AttentionErrorsTest, DocumentIdsOfWrongLength) {
  p.mask.q_document_ids.assign(7, 0);
  expect_error<InvalidArgument>("7 query document ids; expected S_q = 8 or B * S_q = 16");
  p.mask.q_document_ids.assign(16, 0);
  p.mask.kv_document_ids.assign(9, 0);
  expect_error<InvalidArgument>("9 key document ids");
}

TEST_F(AttentionErrorsTest, OutputShapeAndBadDropout) {
  Buffer small(DType::kF32, 2, 4, 7, 16);
  out = small;
  expect_error<InvalidArgument>("out has sizes (2, 4, 7, 16); expected (2, 4, 8, 16)");
  out = q;
  p.dropout.p = 1.0;
  expect_error<InvalidArgument>("dropout p 1 outside [0, 1)");
}

TEST_F(AttentionErrorsTest, FlashOptions) {
  std::vector<float> lse(64);
  EXPECT_THROW(flash_cpu_forward(p, out.view(), lse.data(), {.block_kv = 24}), InvalidArgument);
  EXPECT_THROW(flash_cpu_forward(p, out.view(), lse.data(), {.block_q = 0}), InvalidArgument);
}

}  // namespace
}  // namespace tessel::kernels::attention
