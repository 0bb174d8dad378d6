// An FSDP step exported as a Perfetto trace shows communication overlapping compute. On one rank
// of a fake 4-rank world whose collectives take modeled time (fsdp_overlap_test's transport: a
// call sleeps out its time on the group's worker thread, so an async all_gather runs while the
// caller computes), after the step that records the forward order, a step's trace as
// tessel-trace export --perfetto writes it from this rank's flight recorder has every group's
// forward and backward as complete slices on the rank's compute track, and all_gathers
// (prefetches of the next group) running during a block's forward and during a block's backward.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tessel/collectives/fake/fake_backend.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/fsdp_trace_checks.h"

namespace tessel {
namespace {

using testing::gathers_during_block_compute;
using testing::TraceSlice;

const nn::GptConfig kConfig{
    .vocab_size = 256, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 64, .seed = 1};
constexpr int kWorld = 4;

TEST(FsdpTraceTest, AllGathersOverlapBlockComputeInTheExportedTrace) {
  // Every call takes 10 ms: longer than the gap between a prefetch starting and the compute it
  // hides behind, shorter than the test's patience.
  auto pg = fake::create_process_group(0, kWorld,
                                       fake::FakeOptions{.latency = std::chrono::milliseconds(10)});
  const DeviceMesh mesh = init_device_mesh(pg, {kWorld}, {"dp"});
  const std::unique_ptr<nn::GPT> gpt = testing::sharded_gpt(kConfig, mesh, Device::cpu());
  auto step = [&] {
    const Tensor x = zeros({16, kConfig.block_size}, DType::kI64);
    backward(nn::GPT::loss((*gpt)(x), x));
  };
  step();  // records the forward order: prefetching starts with the next step

  // Overlap is seen in wall time: on a machine so loaded that this thread is descheduled for
  // the whole of a prefetch, one step can show none. Up to three steps; one must show both.
  std::string listed;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const uint64_t since = fr::FlightRecorder::global().recorded();
    step();
    const std::vector<TraceSlice> slices = testing::exported_slices(since, 0, kWorld);
    std::vector<std::string> spans;
    for (const TraceSlice& s : slices) {
      if (s.category != "user_span") continue;
      EXPECT_EQ(s.track.rfind("compute", 0), 0u) << s.name << " on " << s.track;
      EXPECT_GE(s.end_us, s.begin_us) << s.name;
      spans.push_back(s.name);
    }
    std::sort(spans.begin(), spans.end());
    std::vector<std::string> expected = {"fsdp backward (root)", "fsdp forward (root)"};
    for (int i = 0; i < kConfig.n_layer; ++i) {
      expected.push_back(fmt::format("fsdp backward transformer.h.{}", i));
      expected.push_back(fmt::format("fsdp forward transformer.h.{}", i));
    }
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(spans, expected);  // one of each, none pending

    const std::vector<std::string> overlaps = gathers_during_block_compute(slices);
    auto during = [&](std::string_view pass) {
      return std::count_if(overlaps.begin(), overlaps.end(), [&](const std::string& o) {
        return o.find(fmt::format("during fsdp {} transformer.h.", pass)) != std::string::npos;
      });
    };
    listed.clear();
    for (const std::string& o : overlaps) listed += "\n  " + o;
    std::printf("step %d: all_gathers during block compute:%s\n", attempt + 2, listed.c_str());
    if (during("forward") >= 1 && during("backward") >= 1) return;
  }
  ADD_FAILURE() << "no step of three had an all_gather running during both a block's forward "
                   "and a block's backward; the last step's overlaps:"
                << listed;
}

}  // namespace
}  // namespace tessel
