// Tensor parallelism on rank threads, piece by piece: every region function's forward and its
// dual in backward against the whole-tensor math; the parallel layers (column, row, vocabulary,
// fused sections, sequence parallel, the overlapped all_gather) against the unsplit layers they
// replace, outputs and every gradient; loss parallelism against cross_entropy; bad plans.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/embedding.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/norm.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/fsdp/state_dict.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/parallel/tp/parallelize.h"
#include "tessel/parallel/tp/regions.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

void expect_near(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = to_vector<float>(got), w = to_vector<float>(want);
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(g[i] - w[i]) / (1.0 + std::abs(w[i]));
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": element " << at << " is " << g[at] << ", expected " << w[at];
}

// Rank r's piece of dim d of `whole` split `parts` ways (torch.chunk's sizes).
Tensor piece(const Tensor& whole, int64_t d, int parts, int r) {
  const auto [offset, size] = chunk_of(whole.size(d), parts, r);
  return contiguous(narrow(whole, d, offset, size));
}

Tensor leaf(const Tensor& t) { return clone(t).set_requires_grad(true); }

// A different tensor for every (seed, rank), the same wherever it is drawn.
Tensor draw(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, gen);
}

// ---- Regions -----------------------------------------------------------------------------------

// Each function on a (2, 6, 5) activation (dims 1 and 2 split unevenly over 4), against the
// whole-tensor math. c_r: the gradient rank r's consumer sends back; `replicated`: the consumer
// computes the same loss on every rank (c_r equal), else a tensor-parallel one (c_r differ).
TEST(TpRegionsTest, ForwardAndTheDualInBackwardMatchTheWholeTensorMath) {
  for (int tp : {1, 2, 3, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    threads::run_ranks(tp, [&](ProcessGroup& pg) {
      const auto g = pg.shared_from_this();
      const int r = pg.rank();
      const Tensor x = draw({2, 6, 5}, 1);          // the same on every rank
      const Tensor mine = draw({2, 6, 5}, 10 + r);  // this rank's own
      auto c_of = [](int rank, const Shape& s) { return draw(s, 100 + rank); };
      Tensor sum_c = zeros({2, 6, 5});
      for (int q = 0; q < tp; ++q) sum_c = add(sum_c, c_of(q, {2, 6, 5}));
      Tensor sum_x = zeros({2, 6, 5});
      for (int q = 0; q < tp; ++q) sum_x = add(sum_x, draw({2, 6, 5}, 10 + q));

      {  // copy_to: identity; the tensor-parallel consumers' gradients summed.
        Tensor in = leaf(x);
        Tensor y = copy_to_tp_region(in, g);
        expect_near(y, x, 0, "copy_to forward");
        backward(sum(mul(y, c_of(r, y.shape()))));
        expect_near(in.grad(), sum_c, 1e-6, "copy_to backward");
      }
      {  // reduce_from: the sum; a replicated consumer's gradient passes unchanged.
        Tensor in = leaf(mine);
        Tensor y = reduce_from_tp_region(in, g);
        expect_near(y, sum_x, 1e-6, "reduce_from forward");
        backward(sum(mul(y, c_of(0, y.shape()))));
        expect_near(in.grad(), c_of(0, y.shape()), 0, "reduce_from backward");
      }
      {  // scatter (dim 2, uneven): this rank's piece; the pieces' gradients gathered.
        Tensor in = leaf(x);
        Tensor y = scatter_to_tp_region(in, g, 2);
        expect_near(y, piece(x, 2, tp, r), 0, "scatter forward");
        backward(sum(mul(y, piece(c_of(0, x.shape()), 2, tp, r))));
        expect_near(in.grad(), c_of(0, x.shape()), 0, "scatter backward");
      }
      {  // gather_from_tp (dim 2, uneven, global size given): whole; its piece of the gradient.
        Tensor in = leaf(piece(x, 2, tp, r));
        Tensor y = gather_from_tp_region(in, g, -1, 5);
        expect_near(y, x, 0, "gather_from_tp forward");
        backward(sum(mul(y, c_of(0, x.shape()))));
        expect_near(in.grad(), piece(c_of(0, x.shape()), 2, tp, r), 0, "gather_from_tp backward");
      }
      if (6 % tp == 0) {  // sequence shards are even
        {  // gather_from_sp (dim 1): whole; the consumers' gradients summed and split.
          Tensor in = leaf(piece(x, 1, tp, r));
          Tensor y = gather_from_sp_region(in, g, 1);
          expect_near(y, x, 0, "gather_from_sp forward");
          backward(sum(mul(y, c_of(r, y.shape()))));
          expect_near(in.grad(), piece(sum_c, 1, tp, r), 1e-6, "gather_from_sp backward");
        }
        {  // reduce_scatter_to_sp (dim 1): this rank's piece of the sum; gradients gathered.
          Tensor in = leaf(mine);
          Tensor y = reduce_scatter_to_sp_region(in, g, 1);
          expect_near(y, piece(sum_x, 1, tp, r), 1e-6, "reduce_scatter forward");
          backward(sum(mul(y, piece(c_of(0, x.shape()), 1, tp, r))));
          expect_near(in.grad(), c_of(0, x.shape()), 0, "reduce_scatter backward");
        }
        {  // all_gather_linear: gather_from_sp + linear, in 1 to 4 chunks.
          const Tensor w = draw({7, 5}, 3), b = draw({7}, 4);
          for (int64_t chunks : {1, 2, 4}) {
            Tensor in = leaf(piece(x, 1, tp, r)), wl = leaf(w), bl = leaf(b);
            Tensor y = all_gather_linear(in, wl, bl, g, 1, chunks);
            expect_near(y, linear(x, w, b), 1e-5, "all_gather_linear forward");
            const Tensor c = c_of(r, y.shape());
            backward(sum(mul(y, c)));
            Tensor ref_in = leaf(piece(x, 1, tp, r)), ref_w = leaf(w), ref_b = leaf(b);
            backward(sum(mul(linear(gather_from_sp_region(ref_in, g, 1), ref_w, ref_b), c)));
            expect_near(in.grad(), ref_in.grad(), 1e-5, "all_gather_linear input gradient");
            expect_near(wl.grad(), ref_w.grad(), 1e-5, "all_gather_linear weight gradient");
            expect_near(bl.grad(), ref_b.grad(), 1e-5, "all_gather_linear bias gradient");
          }
        }
      }
    });
  }
}

TEST(TpRegionsTest, SequenceShardsMustBeEvenOnEveryRank) {
  std::vector<std::string> messages(2);
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    try {
      reduce_scatter_to_sp_region(zeros({1, 5, 4}), pg.shared_from_this(), 1);
    } catch (const InvalidArgument& e) {
      messages[pg.rank()] = e.what();
    }
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("has size 5, which does not split evenly over the 2 ranks"),
            std::string::npos)
      << messages[0];
}

// ---- Layers ------------------------------------------------------------------------------------

// Embedding -> Linear up -> gelu -> Linear down -> LayerNorm -> fused (3 sections) projection:
// every layer kind, with sizes that split unevenly (vocabulary 11, hidden 10) where allowed.
class Net : public nn::Module {
 public:
  Net() : Module("Net") {
    Generator gen(7);
    register_module("emb", std::make_shared<nn::Embedding>(11, 8, &gen));
    register_module("up", std::make_shared<nn::Linear>(nn::LinearOptions{8, 10}, &gen));
    register_module("down", std::make_shared<nn::Linear>(nn::LinearOptions{10, 8}, &gen));
    register_module("norm", std::make_shared<nn::LayerNorm>(8));
    register_module("qkv", std::make_shared<nn::Linear>(nn::LinearOptions{8, 3 * 12}, &gen));
    NoGradGuard no_grad;
    normal_(parameter("norm.weight"), 1.0, 0.1, &gen);  // not all ones: a gradient to check
    normal_(parameter("norm.bias"), 0.0, 0.1, &gen);
  }
  Tensor forward(const Tensor& tokens) override {
    const Tensor h = child("down")(gelu(child("up")(child("emb")(tokens))));
    return child("qkv")(child("norm")(h));
  }
};

// The sequence-parallel plan with the norm run whole instead: its input gathered from sequence
// shards (PrepareModuleInput; the gradient sliced back), then c_attn-style column parallelism
// from a Replicate input.
ParallelizePlan net_plan_prepared() {
  const Placement seq = Shard{1};
  return {
      {"emb", RowwiseParallel{.output_layout = seq}},
      {"up", ColwiseParallel{.input_layout = seq}},
      {"down", RowwiseParallel{.output_layout = seq}},
      {"norm", PrepareModuleInput{.input_layouts = {seq}, .desired_input_layouts = {Replicate{}}}},
      {"qkv", ColwiseParallel{.sections = 3}}};
}

ParallelizePlan net_plan(bool sequence_parallel, int64_t overlap) {
  if (!sequence_parallel) {
    return {{"emb", RowwiseParallel{}},
            {"up", ColwiseParallel{}},
            {"down", RowwiseParallel{}},
            {"qkv", ColwiseParallel{.sections = 3}}};
  }
  const Placement seq = Shard{1};
  return {{"emb", RowwiseParallel{.output_layout = seq}},
          {"up", ColwiseParallel{.input_layout = seq, .overlap_chunks = overlap}},
          {"down", RowwiseParallel{.output_layout = seq}},
          {"norm", SequenceParallel{}},
          {"qkv", ColwiseParallel{.input_layout = seq, .sections = 3, .overlap_chunks = overlap}}};
}

// The whole gradient of parameter p (a DTensor: gathered) in `shape`.
Tensor whole_grad(const Tensor& p, const Shape& shape) {
  if (!is_dtensor(p)) return p.grad();
  return reshape(DTensor(p.grad(), as_dtensor(p).spec()).full_tensor(), shape);
}

void check_net(int tp, const ParallelizePlan& plan) {
  Net reference;
  const Tensor tokens = from_vector<int64_t>({0, 3, 10, 7, 5, 1, 9, 2, 4, 8, 6, 10}, {2, 6});
  const Tensor c = draw({2, 6, 36}, 9);  // d loss / d output
  const Tensor out = reference(tokens);
  backward(sum(mul(out, c)));
  const Tensor y_ref = view(detach(out), {2, 6, 3, 12});
  threads::run_ranks(tp, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {tp}, {"tp"});
    Net net;
    parallelize_module(net, mesh, plan);
    const Tensor y = net(tokens);  // (2, 6, 3 sections of this rank's piece of 12)
    const Tensor c_mine = reshape(piece(view(c, {2, 6, 3, 12}), 3, tp, pg.rank()), y.shape());
    const Tensor y_mine = reshape(piece(y_ref, 3, tp, pg.rank()), y.shape());
    expect_near(y, y_mine, 1e-5, "output");
    backward(sum(mul(y, c_mine)));  // the loss is the sum over ranks: a parallel consumer
    for (auto& [name, p] : net.named_parameters()) {
      const Tensor& want = reference.parameter(name);
      expect_near(whole_grad(p, want.shape()), want.grad(), 1e-5, name + " gradient");
    }
  });
}

TEST(TpLayersTest, ColumnRowVocabAndFusedLayersMatchTheWholeLayers) {
  for (int tp : {1, 2, 3, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    check_net(tp, net_plan(false, 0));
  }
}

TEST(TpLayersTest, SequenceParallelLayersMatchTheWholeLayers) {
  for (int tp : {2, 3}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    check_net(tp, net_plan(true, 0));
    check_net(tp, net_plan(true, 2));  // the overlapped all_gather
    check_net(tp, net_plan_prepared());
  }
}

TEST(TpLayersTest, ParametersBecomeDTensorsAndStateDictsKeepTheModulesShapes) {
  Net reference;
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"tp"});
    Net net;
    parallelize_module(net, mesh, net_plan(true, 0));
    EXPECT_EQ(net.child("qkv").type_name(), "ColumnParallelLinear");
    const DTensor qkv = as_dtensor(net.parameter("qkv.weight"));
    EXPECT_EQ(qkv.global_shape(), (Shape{3, 12, 8}));
    EXPECT_EQ(qkv.placements(), (std::vector<Placement>{Shard{1}}));
    EXPECT_EQ(as_dtensor(net.parameter("emb.weight")).local_shape(),
              (Shape{pg.rank() == 0 ? 6 : 5, 8}));  // 11 rows: 6 and 5
    EXPECT_EQ(as_dtensor(net.parameter("norm.weight")).placements(),
              (std::vector<Placement>{Replicate{}}));
    const nn::StateDict full = full_state_dict(net, /*rank0_only=*/false);
    for (auto& [name, t] : reference.named_parameters()) {
      ASSERT_TRUE(full.count(name)) << name;
      expect_near(full.at(name), t, 0, name);
    }
  });
}

// ---- Loss parallelism
// ----------------------------------------------------------------------------

TEST(TpLossTest, LossParallelCrossEntropyMatchesCrossEntropy) {
  const Tensor logits = mul(draw({2, 5, 11}, 5), 3.0);
  const Tensor targets = from_vector<int64_t>({0, 10, 4, -100, 7, 3, 3, 9, 1, 6}, {2, 5});
  Tensor whole = leaf(logits);
  const Tensor want = cross_entropy(reshape(whole, {10, 11}), reshape(targets, {10}));
  backward(want);
  for (int tp : {1, 2, 3, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    threads::run_ranks(tp, [&](ProcessGroup& pg) {
      DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {tp}, {"tp"});
      Tensor mine = leaf(piece(logits, 2, tp, pg.rank()));
      const Tensor loss = loss_parallel_cross_entropy(mine, targets, mesh, 11);
      EXPECT_NEAR(item(loss), item(want), 1e-6);
      backward(loss);
      expect_near(mine.grad(), piece(whole.grad(), 2, tp, pg.rank()), 1e-6, "logits gradient");
    });
  }
}

// ---- Bad input
// -----------------------------------------------------------------------------------

// What each of `ranks` rank threads throws (InvalidArgument or OutOfRange) from `fn`.
std::vector<std::string> errors_of(int ranks, const std::vector<int64_t>& shape,
                                   const std::vector<std::string>& names,
                                   const std::function<void(const DeviceMesh&)>& fn) {
  std::vector<std::string> messages(static_cast<size_t>(ranks), "no error");
  threads::run_ranks(ranks, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), shape, names);
    try {
      fn(mesh);
    } catch (const Error& e) {
      messages[pg.rank()] = e.what();
    }
  });
  return messages;
}

void expect_everywhere(const std::vector<std::string>& messages, const std::string& part) {
  for (const std::string& m : messages) {
    EXPECT_EQ(m, messages[0]);
    EXPECT_NE(m.find(part), std::string::npos) << m;
  }
}

const nn::GptConfig kGpt{
    .vocab_size = 64, .block_size = 8, .n_layer = 2, .n_head = 4, .n_embd = 32};

TEST(TpErrorTest, BadPlansFailOnEveryRankWithOneMessage) {
  expect_everywhere(errors_of(2, {2}, {"tp"},
                              [](const DeviceMesh& mesh) {
                                nn::GPT model(kGpt);
                                parallelize_module(model, mesh,
                                                   {{"transformer.h.*.attn.c_atn",
                                                     ColwiseParallel{.sections = 3}}});
                              }),
                    "plan entry 'transformer.h.*.attn.c_atn' names no module of this GPT: "
                    "'transformer.h.0.attn' has no child 'c_atn' (its children: c_attn, c_proj, "
                    "resid_dropout)");
  expect_everywhere(errors_of(3, {3}, {"tp"},
                              [](const DeviceMesh& mesh) {
                                nn::GPT model(kGpt);
                                parallelize_module(model, mesh, gpt_tp_plan());
                              }),
                    "the attention at 'transformer.h.0.attn' has 4 heads, which do not divide "
                    "over the 3 ranks of the tensor-parallel group");
  expect_everywhere(errors_of(4, {2, 2}, {"dp", "cp"},
                              [](const DeviceMesh& mesh) {
                                nn::GPT model(kGpt);
                                parallelize_module(model, mesh, gpt_tp_plan());
                              }),
                    "mesh (dp=2, cp=2) has no dimension 'tp' to split over");
  expect_everywhere(
      errors_of(2, {2}, {"tp"},
                [](const DeviceMesh& mesh) {
                  nn::GPT model(kGpt);
                  parallelize_module(model, mesh, {{"transformer.ln_f", ColwiseParallel{}}});
                }),
      "ColwiseParallel applies to a Linear; 'transformer.ln_f' is a LayerNorm");
  expect_everywhere(
      errors_of(
          2, {2}, {"tp"},
          [](const DeviceMesh& mesh) {
            nn::GPT model(kGpt);
            parallelize_module(model, mesh, {{"transformer.h.*.attn.c_attn", ColwiseParallel{}}});
          }),
      "'transformer.h.0.attn.c_attn' packs q, k and v of attention: use "
      "ColwiseParallel{.sections = 3}");
  expect_everywhere(errors_of(2, {2}, {"tp"},
                              [](const DeviceMesh& mesh) {
                                nn::GPT model(kGpt);
                                fully_shard(model, mesh);
                                parallelize_module(model, mesh, gpt_tp_plan());
                              }),
                    "is already under fully_shard; apply tensor parallelism first");
  expect_everywhere(errors_of(2, {1, 2}, {"dp", "tp"},
                              [](const DeviceMesh& mesh) {
                                nn::GPT model(kGpt);
                                parallelize_module(model, mesh["tp"],
                                                   gpt_tp_plan({.sequence_parallel = true}));
                                fully_shard(model.submodule("transformer.ln_f"), mesh["dp"]);
                                model(zeros({1, 4}, DType::kI64));
                              }),
                    "SequenceParallel: this LayerNorm is fully_shard'ed on its own");
  // Nothing changed when a later entry is bad: the model still runs whole.
  threads::run_ranks(2, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"tp"});
    nn::GPT model(kGpt);
    ParallelizePlan plan = gpt_tp_plan();
    plan.push_back({"transformer.nothing", SequenceParallel{}});
    EXPECT_THROW(parallelize_module(model, mesh, plan), InvalidArgument);
    EXPECT_EQ(model.submodule("transformer.h.0.attn.c_attn").type_name(), "Linear");
    EXPECT_FALSE(is_dtensor(model.parameter("transformer.wte.weight")));
  });
}

TEST(TpErrorTest, BadTokensAndSequenceLengthsFailOnEveryRank) {
  expect_everywhere(errors_of(2, {2}, {"tp"},
                              [](const DeviceMesh& mesh) {
                                nn::GPT model(kGpt);
                                parallelize_module(model, mesh, gpt_tp_plan());
                                model(from_vector<int64_t>({1, 64, 3}, {1, 3}));
                              }),
                    "token 64 at position 1 is outside the vocabulary [0, 64)");
  expect_everywhere(errors_of(2, {2}, {"tp"},
                              [](const DeviceMesh& mesh) {
                                nn::GPT model(kGpt);
                                parallelize_module(model, mesh,
                                                   gpt_tp_plan({.sequence_parallel = true}));
                                model(zeros({1, 5}, DType::kI64));
                              }),
                    "has size 5, which does not split evenly over the 2 ranks");
}

}  // namespace
}  // namespace tessel
