// tessel-ckpt: looks inside distributed checkpoints and turns one into a single file.
//
//   tessel-ckpt inspect DIR [--verify]     what a checkpoint holds: a summary by name prefix
//                 [--tensors]              (--tensors: every tensor, shard and file)
//                                          (DIR: a checkpoint, or a root of step_<N> folders)
//   tessel-ckpt consolidate DIR OUT.safetensors [--prefix model.]
//                                          the tensors named PREFIX* as one safetensors file,
//                                          the prefix removed (Module::load, Python safetensors)
//   tessel-ckpt export-hf DIR OUT_DIR (--config CONFIG.json | --gpt-heads N)
//                 [--prefix model.] [--dtype f32|bf16|f16] [--max-shard-bytes N]
//                                          a Hugging Face folder (config.json, safetensors) that
//                                          transformers loads: the shapes from CONFIG.json (an
//                                          HF config: LlamaForCausalLM, GPT2LMHeadModel) or, for
//                                          a GPT, read off the tensors with N heads
//
// Exit status: 0 on success, 3 on bad input or usage (one line on stderr saying why).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tessel/base/error.h"
#include "tessel/base/tools/cli.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/checkpoint/hf_export.h"
#include "tessel/parallel/checkpoint/internal/reader.h"
#include "tessel/parallel/checkpoint/metadata.h"

namespace {

namespace fs = std::filesystem;
using namespace tessel;
using namespace tessel::checkpoint;

constexpr int kExitBadInput = 3;

std::string bytes_str(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.2f} MiB", bytes / 1048576.0);
  if (bytes >= (uint64_t{1} << 10)) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

// The checkpoint DIR names: itself, or the latest under a root (listing the root's contents).
std::string pick(const std::string& dir) {
  if (fs::exists(fs::path(dir) / kMetadataFileName)) return dir;
  const auto list = list_checkpoints(dir);
  TESSEL_CHECK(!list.empty(), InvalidArgument,
               "{} is neither a checkpoint (no {}) nor a folder of committed checkpoints", dir,
               kMetadataFileName);
  fmt::print("{}: {} committed checkpoint{}:", dir, list.size(), list.size() == 1 ? "" : "s");
  for (const auto& [step, path] : list) fmt::print(" {}", fs::path(path).filename().string());
  fmt::print("\n");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".step_")) fmt::print("  (not committed: {})\n", name);
  }
  fmt::print("latest: {}\n\n", list.back().second);
  return list.back().second;
}

// The tensors grouped by their first name component ("model", "optim"): count, elements, bytes.
void print_summary(const CheckpointMetadata& m) {
  struct Group {
    int64_t tensors = 0, elements = 0, shards = 0;
    uint64_t bytes = 0;
    std::map<std::string, int64_t> dtypes;
  };
  std::map<std::string, Group> groups;
  for (const auto& [name, t] : m.tensors) {
    Group& g = groups[name.substr(0, name.find('.'))];
    ++g.tensors;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    g.elements += n;
    g.shards += static_cast<int64_t>(t.shards.size());
    for (const ShardRecord& s : t.shards) g.bytes += s.end - s.begin;
    ++g.dtypes[std::string(dtype_name(t.dtype))];
  }
  fmt::print("\ntensors by prefix:\n");
  for (const auto& [prefix, g] : groups) {
    std::string dtypes;
    for (const auto& [dtype, n] : g.dtypes) {
      dtypes += fmt::format("{}{} {}", dtypes.empty() ? "" : ", ", n, dtype);
    }
    fmt::print("  {}.*  {} tensors ({}), {} elements, {} shards, {}\n", prefix, g.tensors, dtypes,
               g.elements, g.shards, bytes_str(g.bytes));
  }
  uint64_t smallest = UINT64_MAX, largest = 0;
  for (const auto& [file, bytes] : m.files) {
    smallest = std::min(smallest, bytes);
    largest = std::max(largest, bytes);
  }
  if (!m.files.empty()) {
    fmt::print("files: {} ({} to {} each)\n", m.files.size(), bytes_str(smallest),
               bytes_str(largest));
  }
  fmt::print("(--tensors lists every tensor with its shards, and every file)\n");
}

// Every tensor with its shards, and every file.
void print_tensors(const CheckpointMetadata& m) {
  fmt::print("\ntensors:\n");
  std::map<std::string, std::pair<int, uint64_t>> per_file;  // shards, bytes
  for (const auto& [name, t] : m.tensors) {
    fmt::print("  {} {}  {} shard{}  saved from {}\n", name, typed_shape_str(t.dtype, t.shape),
               t.shards.size(), t.shards.size() == 1 ? "" : "s", t.saved_from);
    for (const ShardRecord& s : t.shards) {
      fmt::print("    [{}] + [{}]  {} bytes [{}, {})\n", fmt::join(s.offsets, ", "),
                 fmt::join(s.sizes, ", "), s.file, s.begin, s.end);
      ++per_file[s.file].first;
      per_file[s.file].second += s.end - s.begin;
    }
  }
  fmt::print("\nfiles:\n");
  for (const auto& [file, bytes] : m.files) {
    fmt::print("  {}  {}  {} shards ({} of data)\n", file, bytes_str(bytes), per_file[file].first,
               bytes_str(per_file[file].second));
  }
}

int inspect(const std::string& dir, bool verify, bool tensors) {
  const std::string path = pick(dir);
  const CheckpointMetadata m = read_checkpoint_metadata(path);
  uint64_t total = 0;
  for (const auto& [file, bytes] : m.files) total += bytes;
  fmt::print("checkpoint {}\n  step {}, saved by {} rank{}, {} tensors in {} files ({})\n", path,
             m.step, m.world_size, m.world_size == 1 ? "" : "s", m.tensors.size(), m.files.size(),
             bytes_str(total));
  for (const auto& [key, value] : m.metadata) {
    fmt::print("  metadata {} = {}\n", key,
               value.size() > 60 ? value.substr(0, 57) + "..." : value);
  }
  for (const auto& [name, states] : m.generators) {
    const bool same = std::all_of(states.begin(), states.end(),
                                  [&](const auto& s) { return s == states.front(); });
    fmt::print("  generator {}: seed {} offset {}{}\n", name, states.front().first,
               states.front().second, same ? " (every rank)" : " (rank 0; ranks differ)");
  }

  if (tensors) {
    print_tensors(m);
  } else {
    print_summary(m);
  }
  if (verify) {
    checkpoint::internal::ShardReader reader(path, m);
    for (const auto& [name, t] : m.tensors) {
      reader.check(name, {Shape(t.shape.size(), 0), t.shape});
    }
    fmt::print("\nverified: every file is present, of its recorded size, and its header agrees\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessel-ckpt: inspect, consolidate and export distributed checkpoints"};
  app.require_subcommand(1);
  std::string dir, out, prefix = "model.";
  bool verify = false, tensors = false;
  auto* inspect_cmd = app.add_subcommand("inspect", "what a checkpoint holds");
  inspect_cmd->add_option("DIR", dir, "a checkpoint folder, or a root of step_<N> folders")
      ->required();
  inspect_cmd->add_flag("--verify", verify,
                        "check every shard file's presence, size and header against the metadata");
  inspect_cmd->add_flag("--tensors", tensors,
                        "list every tensor with its shards, and every file (default: a summary)");
  auto* consolidate_cmd =
      app.add_subcommand("consolidate", "the tensors named PREFIX* as one safetensors file");
  consolidate_cmd->add_option("DIR", dir, "a checkpoint folder, or a root (its latest)")
      ->required();
  consolidate_cmd->add_option("OUT", out, "the safetensors file to write")->required();
  consolidate_cmd->add_option("--prefix", prefix, "names to keep, removed from them")
      ->capture_default_str();
  auto* export_cmd = app.add_subcommand(
      "export-hf", "the model as a Hugging Face folder (config.json, safetensors)");
  std::string config_path, dtype_name_str;
  int64_t gpt_heads = 0;
  uint64_t max_shard_bytes = nn::HfSaveOptions{}.max_shard_bytes;
  export_cmd->add_option("DIR", dir, "a checkpoint folder, or a root (its latest)")->required();
  export_cmd->add_option("OUT_DIR", out, "the folder to write")->required();
  export_cmd->add_option("--config", config_path,
                         "a Hugging Face config.json (or its folder) giving the shapes");
  export_cmd->add_option("--gpt-heads", gpt_heads,
                         "without --config: a GPT read off the tensors, with this many heads");
  export_cmd->add_option("--prefix", prefix, "the model's names in the checkpoint")
      ->capture_default_str();
  export_cmd->add_option("--dtype", dtype_name_str, "f32, bf16 or f16 (default: the checkpoint's)");
  export_cmd
      ->add_option("--max-shard-bytes", max_shard_bytes,
                   "above this, sharded files with model.safetensors.index.json")
      ->capture_default_str();
  if (const auto status =
          cli::parse(app, argc, argv, "tessel-ckpt", kExitBadInput, kExitBadInput)) {
    return *status;
  }
  try {
    if (*inspect_cmd) return inspect(dir, verify, tensors);
    if (*export_cmd) {
      HfExportOptions options{.prefix = prefix, .gpt_heads = gpt_heads};
      if (!config_path.empty()) {
        if (fs::is_directory(config_path)) {
          options.config = nn::read_hf_config(config_path);
        } else {
          std::ifstream in(config_path);
          TESSEL_CHECK(in.good(), IoError, "{}: cannot open for reading", config_path);
          std::ostringstream text;
          text << in.rdbuf();
          options.config = nn::parse_hf_config(text.str(), config_path);
        }
      }
      if (!dtype_name_str.empty()) options.save.dtype = dtype_from_name(dtype_name_str);
      options.save.max_shard_bytes = max_shard_bytes;
      const int64_t n = export_hf(dir, out, options);
      fmt::print("wrote {} tensors to {} (Hugging Face format)\n", n, out);
      return 0;
    }
    const int64_t n = consolidate(dir, out, prefix);
    fmt::print("wrote {} tensors ({}) to {}\n", n, bytes_str(fs::file_size(out)), out);
    return 0;
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "tessel-ckpt: {}\n", e.what());
    return kExitBadInput;
  } catch (const fs::filesystem_error& e) {
    fmt::print(stderr, "tessel-ckpt: {}\n", e.what());
    return kExitBadInput;
  }
}
