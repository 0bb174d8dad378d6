#include "tessel/nn/module.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessel/base/error.h"

namespace tessel::nn {
namespace {

Tensor filled(const Shape& shape, float start) {
  Tensor t = empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = start + static_cast<float>(i);
  return t;
}

// y = x * w elementwise (plain loops, so the test needs no tensor ops).
class Scale : public Module {
 public:
  explicit Scale(int64_t n) : Module("Scale") {
    weight_ = &register_parameter("weight", filled({n}, 1.0f));
    register_buffer("count", zeros({1}, DType::kI64));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = empty(x.shape());
    const Tensor& w = *weight_;
    for (int64_t i = 0; i < x.numel(); ++i) {
      y.data<float>()[i] = x.data<float>()[i] * w.data<float>()[i % w.numel()];
    }
    return y;
  }
  const Tensor& weight() const { return *weight_; }

 private:
  Tensor* weight_;
};

class Net : public Module {
 public:
  Net() : Module("Net") {
    register_parameter("bias", filled({2, 3}, 10.0f));
    first = register_module("first", std::make_shared<Scale>(4));
    blocks = register_module("blocks", std::make_shared<ModuleList>());
    blocks->push_back(std::make_shared<Scale>(3));
    blocks->push_back(std::make_shared<Scale>(5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = (*first)(x);
    for (size_t i = 0; i < blocks->size(); ++i) y = (*blocks)[i](y);
    return y;
  }
  std::shared_ptr<Scale> first;
  std::shared_ptr<ModuleList> blocks;
};

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& items) {
  std::vector<std::string> out;
  for (const auto& [name, t] : items) out.push_back(name);
  return out;
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

TEST(ModuleTest, NamesAreDottedInRegistrationOrder) {
  Net net;
  EXPECT_EQ(
      names(net.named_parameters()),
      (std::vector<std::string>{"bias", "first.weight", "blocks.0.weight", "blocks.1.weight"}));
  EXPECT_EQ(names(net.named_buffers()),
            (std::vector<std::string>{"first.count", "blocks.0.count", "blocks.1.count"}));
  std::vector<std::string> modules;
  for (auto& [name, m] : net.named_modules()) modules.push_back(name + ":" + m->type_name());
  EXPECT_EQ(modules, (std::vector<std::string>{":Net", "first:Scale", "blocks:ModuleList",
                                               "blocks.0:Scale", "blocks.1:Scale"}));
  EXPECT_EQ(net.parameter("blocks.1.weight").shape(), (Shape{5}));
  EXPECT_TRUE(net.parameter("first.weight").requires_grad());
  EXPECT_FALSE(net.buffer("first.count").requires_grad());
  EXPECT_EQ(&net.submodule("blocks.0"), &(*net.blocks)[0]);
  EXPECT_THROW(net.parameter("first.nothing"), OutOfRange);
  EXPECT_THROW(net.parameter("nothing.weight"), OutOfRange);
  EXPECT_THROW(net.buffer("bias"), OutOfRange);
}

TEST(ModuleTest, RejectsBadOrDuplicateNames) {
  Scale m(2);
  EXPECT_THROW(m.register_parameter("weight", zeros({1})), InvalidArgument);
  EXPECT_THROW(m.register_buffer("count", zeros({1})), InvalidArgument);
  EXPECT_THROW(m.register_parameter("a.b", zeros({1})), InvalidArgument);
  EXPECT_THROW(m.register_parameter("", zeros({1})), InvalidArgument);
  EXPECT_THROW(m.register_module("weight", std::make_shared<Scale>(1)), InvalidArgument);
}

TEST(ModuleTest, TiedParameterIsListedOnce) {
  Module root("Root");
  auto a = root.register_module("a", std::make_shared<Scale>(3));
  auto b = root.register_module("b", std::make_shared<Scale>(3));
  b->set_parameter("weight", a->weight());
  EXPECT_EQ(names(root.named_parameters()), (std::vector<std::string>{"a.weight"}));
  EXPECT_EQ(root.state_dict().count("b.weight"), 0u);
}

TEST(ModuleTest, SetParameterReplacesTheSlotInPlace) {
  Scale m(4);
  const Tensor x = filled({4}, 1.0f);
  // A replacement of another shape (as a shard would be) is what forward then uses.
  m.set_parameter("weight", filled({2}, 3.0f));
  const Tensor y = m(x);
  const std::vector<float> expected = {1 * 3, 2 * 4, 3 * 3, 4 * 4};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y.data<float>()[i], expected[i]);
  EXPECT_EQ(m.named_parameters()[0].second.shape(), (Shape{2}));
  EXPECT_THROW(m.set_parameter("nothing", zeros({1})), OutOfRange);
}

TEST(ModuleTest, StateDictRoundTripsThroughSafetensors) {
  Net source;
  std::mt19937 rng(3);
  for (auto& [name, t] : source.state_dict()) {
    if (t.dtype() == DType::kF32) {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng());
    } else {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = rng();
    }
  }
  const std::string path = testing::TempDir() + "module_test_net.safetensors";
  source.save(path, {{"step", "7"}});

  Net target;
  const Tensor slot_before = target.parameter("first.weight");
  target.load(path);
  const StateDict a = source.state_dict();
  const StateDict b = target.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(same_values(t, b.at(name))) << name;
  // Loaded in place: the existing tensor holds the new values.
  EXPECT_EQ(slot_before.impl_ptr(), target.parameter("first.weight").impl_ptr());
}

std::string load_error(Module& m, const StateDict& state) {
  try {
    m.load_state_dict(state);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(ModuleTest, LoadStateDictRejectsMissingExtraAndMismatchedKeys) {
  Net net;
  const StateDict original = net.state_dict();
  StateDict copy;
  for (const auto& [name, t] : original) {
    copy.emplace(
        name, t.dtype() == DType::kF32 ? filled(t.shape(), 100.0f) : zeros(t.shape(), t.dtype()));
  }

  StateDict missing = copy;
  missing.erase("blocks.1.weight");
  EXPECT_NE(load_error(net, missing).find("missing keys: blocks.1.weight"), std::string::npos);

  StateDict extra = copy;
  extra["blocks.2.weight"] = zeros({1});
  EXPECT_NE(load_error(net, extra).find("unexpected keys: blocks.2.weight"), std::string::npos);

  StateDict wrong_shape = copy;
  wrong_shape["bias"] = zeros({3, 2});
  EXPECT_NE(load_error(net, wrong_shape).find("bias (expected (2, 3) f32, got (3, 2) f32)"),
            std::string::npos)
      << load_error(net, wrong_shape);

  StateDict wrong_dtype = copy;
  wrong_dtype["first.count"] = zeros({1}, DType::kI32);
  EXPECT_NE(load_error(net, wrong_dtype).find("first.count"), std::string::npos);

  // A rejected dict changed nothing.
  for (const auto& [name, t] : net.state_dict()) {
    EXPECT_TRUE(same_values(t, original.at(name))) << name;
  }
}

TEST(ModuleTest, TrainAndEvalApplyToTheSubtree) {
  Net net;
  EXPECT_TRUE(net.is_training());
  net.eval();
  for (auto& [name, m] : net.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  net.first->train();
  EXPECT_TRUE(net.first->is_training());
  EXPECT_FALSE(net.blocks->is_training());
}

TEST(ModuleTest, ZeroGradDropsGradients) {
  Net net;
  for (const Tensor& p : net.parameters()) p.set_grad(filled(p.shape(), 1.0f));
  net.zero_grad();
  for (const Tensor& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(ModuleTest, HooksFireInOrderAndCanReplaceValues) {
  Net net;
  std::vector<std::string> log;
  auto record_pre = [&](std::string tag) {
    return [&log, tag](Module& m, Tensors&) { log.push_back("pre " + tag + " " + m.type_name()); };
  };
  auto record_post = [&](std::string tag) {
    return [&log, tag](Module& m, const Tensors&, Tensors&) {
      log.push_back("post " + tag + " " + m.type_name());
    };
  };
  net.register_forward_pre_hook(record_pre("net1"));
  net.register_forward_pre_hook(record_pre("net2"));
  net.register_forward_hook(record_post("net1"));
  net.first->register_forward_pre_hook(record_pre("first"));
  const HookHandle removable = net.first->register_forward_hook(record_post("first"));
  net.blocks->register_forward_pre_hook(record_pre("never"));  // the list has no forward call
  (*net.blocks)[1].register_forward_hook(record_post("block1"));

  net(filled({3}, 1.0f));
  EXPECT_EQ(log,
            (std::vector<std::string>{"pre net1 Net", "pre net2 Net", "pre first Scale",
                                      "post first Scale", "post block1 Scale", "post net1 Net"}));

  log.clear();
  EXPECT_TRUE(net.first->remove_hook(removable));
  EXPECT_FALSE(net.first->remove_hook(removable));
  net(filled({3}, 1.0f));
  EXPECT_EQ(log.size(), 5u);

  // A pre-hook may replace the input and a post-hook the output.
  Scale m(2);
  m.register_forward_pre_hook([](Module&, Tensors& x) { x[0] = filled({2}, 5.0f); });
  m.register_forward_hook([](Module&, const Tensors& x, Tensors& y) {
    EXPECT_EQ(x[0].data<float>()[0], 5.0f);
    y[0].data<float>()[1] += 100.0f;
  });
  const Tensor y = m(filled({2}, 0.0f));
  EXPECT_EQ(y.data<float>()[0], 5.0f * 1.0f);
  EXPECT_EQ(y.data<float>()[1], 6.0f * 2.0f + 100.0f);
}

TEST(ModuleTest, ContainerWithoutForwardSaysSo) {
  ModuleList list;
  EXPECT_THROW(list(zeros({1})), NotImplemented);
}

}  // namespace
}  // namespace tessel::nn
