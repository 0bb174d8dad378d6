#include "tests/parallel/fsdp_trace_checks.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/export.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/parallel/fsdp/fsdp.h"

namespace tessel::testing {

std::unique_ptr<nn::GPT> sharded_gpt(const nn::GptConfig& config, const DeviceMesh& mesh,
                                     Device device) {
  std::unique_ptr<nn::GPT> gpt;
  {
    DefaultDeviceGuard meta(Device::meta());
    gpt = std::make_unique<nn::GPT>(config);
  }
  for (int i = 0; i < config.n_layer; ++i) {
    fully_shard(gpt->submodule("transformer.h").child(std::to_string(i)), mesh);
  }
  fully_shard(*gpt, mesh);
  gpt->to_empty(device);
  gpt->init_weights();
  return gpt;
}

std::vector<TraceSlice> exported_slices(uint64_t after, int rank, int world_size) {
  fr::FlightRecorder& recorder = fr::FlightRecorder::global();
  const uint64_t wanted = recorder.recorded() - after;
  if (wanted > recorder.capacity()) {
    ADD_FAILURE() << wanted << " entries wanted, the ring holds " << recorder.capacity();
    return {};
  }
  recorder.set_process_info(rank, world_size);
  fr::DumpSet set;
  set.dumps.push_back(fr::parse_dump(fr::dump_to_string(recorder, {}), "this process"));
  const nlohmann::json trace = nlohmann::json::parse(fr::export_perfetto(set));
  std::map<int64_t, std::string> tracks;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
  }
  std::vector<TraceSlice> out;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["args"]["record_id"].get<uint64_t>() <= after) continue;
    const double ts = e["ts"];
    out.push_back({tracks[e["tid"]], e["name"], e["cat"], ts, ts + e["dur"].get<double>()});
  }
  return out;
}

std::vector<std::string> gathers_during_block_compute(const std::vector<TraceSlice>& slices) {
  std::vector<std::string> out;
  for (const TraceSlice& gather : slices) {
    if (gather.category != "all_gather") continue;
    for (const TraceSlice& span : slices) {
      const bool block = span.track.rfind("compute", 0) == 0 && span.name.rfind("fsdp ", 0) == 0 &&
                         span.name.find(" transformer.h.") != std::string::npos;
      if (block && gather.begin_us < span.end_us && span.begin_us < gather.end_us) {
        out.push_back(gather.name + " during " + span.name);
      }
    }
  }
  return out;
}

}  // namespace tessel::testing
