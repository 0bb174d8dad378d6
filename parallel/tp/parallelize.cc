// parallelize_module: plan resolution (wildcards), validation of the whole plan, then module
// replacement and hooks. See parallelize.h.
#include "tessel/parallel/tp/parallelize.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "tessel/base/error.h"
#include "tessel/nn/attention.h"
#include "tessel/nn/embedding.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/llama_layers.h"
#include "tessel/parallel/tp/layers.h"
#include "tessel/parallel/tp/regions.h"
#include "tessel/tensor/autograd.h"

namespace tessel {
namespace {

constexpr char kFsdpAttachment[] = "tessel.fsdp";  // fsdp.cc's per-module state

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

struct Match {
  std::string path;
  nn::Module* module;
  nn::Module* parent;
  std::string name;  // within the parent
};

// The modules `pattern` names, in registry order; InvalidArgument naming the first component
// that matches nothing, with the children it could have been.
std::vector<Match> resolve(nn::Module& root, const std::string& pattern) {
  TESSEL_CHECK(!pattern.empty(), InvalidArgument,
               "parallelize_module: a plan entry has an empty path (name a submodule)");
  std::vector<Match> level = {{"", &root, nullptr, ""}};
  for (const std::string& part : split_path(pattern)) {
    TESSEL_CHECK(!part.empty(), InvalidArgument,
                 "parallelize_module: plan entry '{}' has an empty path component", pattern);
    std::vector<Match> next;
    for (const Match& m : level) {
      for (auto& [name, child] : m.module->children()) {
        if (part == "*" || part == name) {
          next.push_back({join_path(m.path, name), child.get(), m.module, name});
        }
      }
    }
    if (next.empty()) {
      const Match& closest = level.front();
      std::string children;
      for (auto& [name, child] : closest.module->children()) {
        children += (children.empty() ? "" : ", ") + name;
      }
      throw InvalidArgument(fmt::format(
          "parallelize_module: plan entry '{}' names no module of this {}: {} has no child "
          "'{}' (its children: {})",
          pattern, root.type_name(),
          closest.path.empty() ? std::string("the model") : "'" + closest.path + "'", part,
          children.empty() ? std::string("none") : children));
    }
    level = std::move(next);
  }
  return level;
}

const char* style_name(const ParallelStyle& style) {
  constexpr const char* kNames[] = {"ColwiseParallel", "RowwiseParallel", "SequenceParallel",
                                    "PrepareModuleInput", "PrepareModuleOutput"};
  return kNames[style.index()];
}

bool replaces(const ParallelStyle& style) {
  return std::holds_alternative<ColwiseParallel>(style) ||
         std::holds_alternative<RowwiseParallel>(style);
}

void check_layouts(const std::vector<std::optional<Placement>>& from,
                   const std::vector<std::optional<Placement>>& to, bool partial_gradients,
                   const std::string& path, const char* style) {
  TESSEL_CHECK(from.size() == to.size(), InvalidArgument,
               "parallelize_module: {} for '{}' gives {} layouts but {} desired ones", style, path,
               from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) {
    if (!from[i] || !to[i]) {
      TESSEL_CHECK(!from[i] == !to[i], InvalidArgument,
                   "parallelize_module: {} for '{}': tensor {} has a layout on one side only",
                   style, path, i);
      continue;
    }
    TESSEL_CHECK(!to[i]->is_partial(), InvalidArgument,
                 "parallelize_module: {} for '{}': tensor {} cannot be made {}", style, path, i,
                 to[i]->str());
    TESSEL_CHECK(!partial_gradients || to[i]->is_replicate(), InvalidArgument,
                 "parallelize_module: {} for '{}': partial_gradients needs Replicate() desired "
                 "layouts, tensor {} is {}",
                 style, path, i, to[i]->str());
  }
}

void check_not_shard(nn::Module& m, const std::string& path) {
  for (auto& [name, p] : m.named_parameters()) {
    TESSEL_CHECK(p.shard_info() == nullptr, InvalidArgument,
                 "parallelize_module: parameter '{}' is already a shard ({}); apply tensor "
                 "parallelism once, before fully_shard",
                 join_path(path, name), p.str());
  }
}

// A style against its module (and, for an attention's c_attn, the attention's heads).
void check_entry(const ParallelStyle& style, const Match& m, int64_t tp) {
  auto wrong_type = [&](const char* wants) {
    return InvalidArgument(fmt::format("parallelize_module: {} applies to {}; '{}' is a {}",
                                       style_name(style), wants, m.path, m.module->type_name()));
  };
  if (const auto* col = std::get_if<ColwiseParallel>(&style)) {
    const auto* linear = dynamic_cast<const nn::Linear*>(m.module);
    if (linear == nullptr) throw wrong_type("a Linear");
    check_colwise(*linear, *col);
    if (const auto* attn = dynamic_cast<const nn::CausalSelfAttention*>(m.parent);
        attn != nullptr && m.name == "c_attn") {
      const int64_t heads = attn->options().n_head;
      TESSEL_CHECK(col->sections == 3, InvalidArgument,
                   "parallelize_module: '{}' packs q, k and v of attention: use "
                   "ColwiseParallel{{.sections = 3}} (got sections = {})",
                   m.path, col->sections);
      TESSEL_CHECK(heads % tp == 0, InvalidArgument,
                   "parallelize_module: the attention at '{}' has {} heads, which do not divide "
                   "over the {} ranks of the tensor-parallel group (each rank runs whole heads)",
                   m.path.substr(0, m.path.size() - m.name.size() - 1), heads, tp);
    }
    // A LlamaAttention runs the heads its projections give: q_proj's split must be whole query
    // heads and k_proj's, v_proj's whole K/V heads (grouped-query attention keeps its groups).
    if (const auto* attn = dynamic_cast<const nn::LlamaAttention*>(m.parent); attn != nullptr) {
      const bool query = m.name == "q_proj";
      const int64_t heads = query ? attn->options().n_heads : attn->options().n_kv_heads;
      TESSEL_CHECK(heads % tp == 0, InvalidArgument,
                   "parallelize_module: the attention at '{}' has {} {} heads, which do not "
                   "divide over the {} ranks of the tensor-parallel group (each rank runs whole "
                   "heads): use a tp that divides {}",
                   m.path.substr(0, m.path.size() - m.name.size() - 1), heads,
                   query ? "query" : "key/value", tp, heads);
    }
  } else if (const auto* row = std::get_if<RowwiseParallel>(&style)) {
    if (const auto* linear = dynamic_cast<const nn::Linear*>(m.module)) {
      check_rowwise(*linear, *row);
    } else if (const auto* emb = dynamic_cast<const nn::Embedding*>(m.module)) {
      check_rowwise(*emb, *row);
    } else {
      throw wrong_type("a Linear or an Embedding");
    }
  } else if (const auto* in = std::get_if<PrepareModuleInput>(&style)) {
    check_layouts(in->input_layouts, in->desired_input_layouts, in->partial_gradients, m.path,
                  style_name(style));
  } else if (const auto* out = std::get_if<PrepareModuleOutput>(&style)) {
    check_layouts(out->output_layouts, out->desired_output_layouts, out->partial_gradients, m.path,
                  style_name(style));
  }
  if (replaces(style)) check_not_shard(*m.module, m.path);
}

std::shared_ptr<nn::Module> parallel_layer(const ParallelStyle& style, nn::Module& module,
                                           const DeviceMesh& tp) {
  if (const auto* col = std::get_if<ColwiseParallel>(&style)) {
    return std::make_shared<ColumnParallelLinear>(dynamic_cast<nn::Linear&>(module), tp, *col);
  }
  const auto& row = std::get<RowwiseParallel>(style);
  if (auto* linear = dynamic_cast<nn::Linear*>(&module)) {
    return std::make_shared<RowParallelLinear>(*linear, tp, row);
  }
  return std::make_shared<VocabParallelEmbedding>(dynamic_cast<nn::Embedding&>(module), tp, row);
}

// SequenceParallel: the module's parameters stay whole (attached as Replicate on the tp mesh);
// while it runs, its slots hold copy_to_tp_region of them, so each rank's gradient share from
// its sequence shard is summed over the group in backward.
void apply_sequence_parallel(nn::Module& m, const DeviceMesh& tp) {
  struct Swap {
    std::vector<std::string> names;
    std::vector<Tensor> kept;  // what the slots held before forward (FSDP's tensors, say)
  };
  auto swap = std::make_shared<Swap>();
  for (auto& [name, p] : m.named_parameters()) {
    if (p.shard_info() == nullptr) {
      shard_parameter(p, DTensorSpec(tp, {Replicate{}}, p.shape(), p.dtype()), name);
    }
    swap->names.push_back(name);
  }
  if (swap->names.empty()) return;
  m.register_forward_pre_hook([swap, tp](nn::Module& self, nn::Tensors&) {
    // FSDP's own pre-forward would run after this hook and put its gathered parameters back in
    // the slots, unwrapped: the gradients would silently miss their sum over tp.
    TESSEL_CHECK(self.attachment(kFsdpAttachment) == nullptr, InvalidArgument,
                 "SequenceParallel: this {} is fully_shard'ed on its own; fully_shard the "
                 "module that contains it (its transformer block, the root) instead",
                 self.type_name());
    const auto group = tp.group();
    swap->kept.clear();
    for (const std::string& name : swap->names) {
      const Tensor p = self.parameter(name);
      swap->kept.push_back(p);
      self.set_parameter(name, copy_to_tp_region(p, group));
    }
  });
  m.register_forward_hook([swap](nn::Module& self, const nn::Tensors&, nn::Tensors&) {
    for (size_t i = 0; i < swap->names.size() && i < swap->kept.size(); ++i) {
      self.set_parameter(swap->names[i], swap->kept[i]);
    }
    swap->kept.clear();
  });
}

void convert_all(nn::Tensors& tensors, const DeviceMesh& tp,
                 const std::vector<std::optional<Placement>>& from,
                 const std::vector<std::optional<Placement>>& to, bool partial_gradients,
                 const char* what) {
  TESSEL_CHECK(tensors.size() >= from.size(), InvalidArgument,
               "{}: {} layouts given for a module with {} tensors", what, from.size(),
               tensors.size());
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] && to[i])
      tensors[i] = prepare_layout(tensors[i], tp, *from[i], *to[i], partial_gradients);
  }
}

void apply_hooks(const ParallelStyle& style, nn::Module& m, const DeviceMesh& tp) {
  if (std::holds_alternative<SequenceParallel>(style)) {
    apply_sequence_parallel(m, tp);
  } else if (const auto* in = std::get_if<PrepareModuleInput>(&style)) {
    m.register_forward_pre_hook([s = *in, tp](nn::Module&, nn::Tensors& inputs) {
      convert_all(inputs, tp, s.input_layouts, s.desired_input_layouts, s.partial_gradients,
                  "PrepareModuleInput");
    });
  } else if (const auto* out = std::get_if<PrepareModuleOutput>(&style)) {
    m.register_forward_hook([s = *out, tp](nn::Module&, const nn::Tensors&, nn::Tensors& outputs) {
      convert_all(outputs, tp, s.output_layouts, s.desired_output_layouts, s.partial_gradients,
                  "PrepareModuleOutput");
    });
  }
}

}  // namespace

Tensor prepare_layout(const Tensor& x, const DeviceMesh& tp_mesh, const Placement& from,
                      const Placement& to, bool partial_gradients) {
  TESSEL_CHECK(!to.is_partial(), InvalidArgument, "prepare_layout: cannot make a tensor {}",
               to.str());
  const auto group = tp_mesh.group();
  Tensor y = x;
  if (from.is_partial()) {
    y = to.is_replicate() ? reduce_from_tp_region(x, group)
                          : reduce_scatter_to_sp_region(x, group, to.dim());
    return partial_gradients ? copy_to_tp_region(y, group) : y;
  }
  if (from.is_replicate()) {
    if (to.is_shard()) return scatter_to_tp_region(x, group, to.dim());
    return partial_gradients ? copy_to_tp_region(x, group) : x;
  }
  // from Shard(d)
  if (to.is_replicate()) {
    return partial_gradients ? gather_from_sp_region(x, group, from.dim())
                             : gather_from_tp_region(x, group, from.dim());
  }
  if (to == from) return x;
  return scatter_to_tp_region(gather_from_tp_region(x, group, from.dim()), group, to.dim());
}

void parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan,
                        const ParallelizeOptions& options) {
  TESSEL_CHECK(mesh.layout().has_dim(options.tp_dim), InvalidArgument,
               "parallelize_module: mesh {} has no dimension '{}' to split over (pass "
               "mesh[\"{}\"] of a mesh that has one)",
               mesh.shape_str(), options.tp_dim, options.tp_dim);
  const DeviceMesh tp = mesh.ndim() == 1 ? mesh : mesh[options.tp_dim];
  for (auto& [path, m] : module.named_modules()) {
    TESSEL_CHECK(m->attachment(kFsdpAttachment) == nullptr, InvalidArgument,
                 "parallelize_module: {} is already under fully_shard; apply tensor "
                 "parallelism first, then fully_shard",
                 path.empty() ? module.type_name() : "'" + path + "'");
  }
  // Resolve and check the whole plan before changing anything.
  std::vector<std::pair<const ParallelStyle*, Match>> entries;
  std::set<std::string> replaced;
  for (const auto& [pattern, style] : plan) {
    for (const Match& m : resolve(module, pattern)) {
      check_entry(style, m, tp.size());
      if (replaces(style)) {
        TESSEL_CHECK(replaced.insert(m.path).second, InvalidArgument,
                     "parallelize_module: '{}' is named by two ColwiseParallel/RowwiseParallel "
                     "entries",
                     m.path);
      }
      entries.emplace_back(&style, m);
    }
  }
  for (auto& [style, m] : entries) {
    if (replaces(*style)) m.parent->set_submodule(m.name, parallel_layer(*style, *m.module, tp));
  }
  for (auto& [style, m] : entries) {
    if (!replaces(*style)) apply_hooks(*style, m.parent->child(m.name), tp);
  }
}

}  // namespace tessel
