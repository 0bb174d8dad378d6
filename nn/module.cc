#include "tessel/nn/module.h"

#include <algorithm>
#include <set>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensors Module::operator()(const Tensors& inputs) {
  Tensors x = inputs;
  // Copies, so a hook may remove itself (or register another) while running.
  const auto pre_hooks = pre_hooks_;
  for (const auto& [id, hook] : pre_hooks) hook(*this, x);
  const bool backward_hooks =
      grad_enabled() && !(backward_pre_hooks_.empty() && backward_hooks_.empty());
  Tensors y = backward_hooks ? call_with_backward_hooks(x) : run_forward(x);
  const auto post_hooks = post_hooks_;
  for (const auto& [id, hook] : post_hooks) hook(*this, x, y);
  return y;
}

Tensor Module::operator()(const Tensor& input) {
  Tensors out = (*this)(Tensors{input});
  TESSEL_CHECK(out.size() == 1, InvalidArgument,
               "{} returned {} outputs; call it with a list (module(Tensors{{...}})) to get them "
               "all",
               type_name_, out.size());
  return out[0];
}

Tensors Module::run_forward(const Tensors& inputs) {
  return forward_wrapper_ ? forward_wrapper_(*this, inputs) : forward_multi(inputs);
}

Tensor Module::forward(const Tensor&) {
  throw NotImplemented(fmt::format("{} has no single-tensor forward", type_name_));
}

Tensors Module::forward_multi(const Tensors& inputs) {
  TESSEL_CHECK(inputs.size() == 1, InvalidArgument, "{} takes one input, got {}", type_name_,
               inputs.size());
  return {forward(inputs[0])};
}

namespace {

// The positions of the tensors that take part in autograd (defined and floating).
std::vector<size_t> differentiable_positions(const Tensors& ts) {
  std::vector<size_t> out;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].defined() && is_floating(ts[i].dtype())) out.push_back(i);
  }
  return out;
}

// Passes ts[positions] through an identity autograd node named `name` whose backward is
// `on_backward` (which may replace the gradients), and returns ts with those replaced.
Tensors through_identity(const char* name, const Tensors& ts, const std::vector<size_t>& positions,
                         std::function<void(Tensors&)> on_backward) {
  Tensors picked;
  for (size_t i : positions) picked.push_back(ts[i]);
  Tensors wrapped = apply_function(
      name, picked, [](FunctionContext&, const Tensors& in) { return in; },
      [on_backward = std::move(on_backward)](FunctionContext&, const Tensors& grads) {
        Tensors g = grads;
        on_backward(g);
        return g;
      });
  Tensors out = ts;
  for (size_t k = 0; k < positions.size(); ++k) out[positions[k]] = wrapped[k];
  return out;
}

}  // namespace

Tensors Module::call_with_backward_hooks(const Tensors& inputs) {
  // Filled by the outputs' node, read by the inputs' node (which runs later in backward).
  auto grad_outputs = std::make_shared<Tensors>();
  auto run_backward_hooks = [this, grad_outputs](Tensors& grad_inputs) {
    const auto hooks = backward_hooks_;
    for (const auto& [id, hook] : hooks) hook(*this, grad_inputs, *grad_outputs);
  };
  const std::vector<size_t> in_pos = differentiable_positions(inputs);
  const bool inputs_tracked = needs_grad(inputs);
  const Tensors x = inputs_tracked
                        ? through_identity("BackwardHook", inputs, in_pos, run_backward_hooks)
                        : inputs;
  Tensors y = run_forward(x);
  if (!needs_grad(y)) return y;
  return through_identity("BackwardPreHook", y, differentiable_positions(y),
                          [this, grad_outputs, inputs_tracked, run_backward_hooks](Tensors& grads) {
                            const auto hooks = backward_pre_hooks_;
                            for (const auto& [id, hook] : hooks) hook(*this, grads);
                            *grad_outputs = grads;
                            if (!inputs_tracked) {
                              Tensors none;
                              run_backward_hooks(none);
                            }
                          });
}

void Module::check_new_name(const std::string& name) const {
  TESSEL_CHECK(!name.empty() && name.find('.') == std::string::npos, InvalidArgument,
               "{}: name '{}' must be non-empty and contain no '.'", type_name_, name);
  for (const Slot& s : parameters_) {
    TESSEL_CHECK(s.name != name, InvalidArgument, "{}: '{}' is already a parameter", type_name_,
                 name);
  }
  for (const Slot& s : buffers_) {
    TESSEL_CHECK(s.name != name, InvalidArgument, "{}: '{}' is already a buffer", type_name_, name);
  }
  for (const auto& [child, module] : children_) {
    TESSEL_CHECK(child != name, InvalidArgument, "{}: '{}' is already a submodule", type_name_,
                 name);
  }
}

Tensor& Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name);
  TESSEL_CHECK(value.defined(), InvalidArgument, "{}: parameter '{}' is undefined", type_name_,
               name);
  if (requires_grad) value.set_requires_grad(true);
  parameters_.push_back({name, std::make_unique<Tensor>(std::move(value))});
  return *parameters_.back().value;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  TESSEL_CHECK(value.defined(), InvalidArgument, "{}: buffer '{}' is undefined", type_name_, name);
  buffers_.push_back({name, std::make_unique<Tensor>(std::move(value))});
  return *buffers_.back().value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  TESSEL_CHECK(module != nullptr, InvalidArgument, "{}: submodule '{}' is null", type_name_, name);
  children_.emplace_back(name, std::move(module));
}

// Calls fn(dotted_prefix, module) for this module and every descendant, depth first.
template <typename Fn>
void Module::visit(const std::string& prefix, Fn&& fn) const {
  fn(prefix, *this);
  for (const auto& [name, child] : children_) {
    child->visit(prefix.empty() ? name : prefix + "." + name, fn);
  }
}

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Appends (name, tensor) unless the same TensorImpl was listed already.
void add_unique(std::vector<std::pair<std::string, Tensor>>& out, std::set<const void*>& seen,
                std::string name, const Tensor& t) {
  if (seen.insert(t.impl_ptr().get()).second) out.emplace_back(std::move(name), t);
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const void*> seen;
  visit("", [&](const std::string& prefix, const Module& m) {
    for (const Slot& s : m.parameters_) add_unique(out, seen, join_name(prefix, s.name), *s.value);
  });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const void*> seen;
  visit("", [&](const std::string& prefix, const Module& m) {
    for (const Slot& s : m.buffers_) add_unique(out, seen, join_name(prefix, s.name), *s.value);
  });
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  visit("", [&](const std::string& prefix, const Module& m) {
    out.emplace_back(prefix, const_cast<Module*>(&m));
  });
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::children() const {
  return children_;
}

Module& Module::child(std::string_view name) const {
  for (const auto& [child_name, module] : children_) {
    if (child_name == name) return *module;
  }
  throw OutOfRange(fmt::format("{} has no submodule '{}'", type_name_, name));
}

void Module::throw_wrong_type(std::string_view name, const Module& found) const {
  throw InvalidArgument(fmt::format("{}: submodule '{}' is a {}, not the type its caller expects",
                                    type_name_, name, found.type_name()));
}

Module& ModuleList::operator[](size_t i) const {
  TESSEL_CHECK(i < size(), OutOfRange, "ModuleList index {} out of range (size {})", i, size());
  return child(std::to_string(i));
}

std::pair<Module*, std::string_view> Module::resolve(std::string_view dotted_name) {
  Module* m = this;
  std::string_view rest = dotted_name;
  for (size_t dot; (dot = rest.find('.')) != std::string_view::npos;) {
    const std::string_view head = rest.substr(0, dot);
    auto it = std::find_if(m->children_.begin(), m->children_.end(),
                           [&](const auto& c) { return c.first == head; });
    TESSEL_CHECK(it != m->children_.end(), OutOfRange, "{} has no submodule '{}' (in '{}')",
                 m->type_name_, head, dotted_name);
    m = it->second.get();
    rest = rest.substr(dot + 1);
  }
  return {m, rest};
}

Tensor* Module::find_slot(std::vector<Slot>& slots, std::string_view name) {
  for (Slot& s : slots) {
    if (s.name == name) return s.value.get();
  }
  return nullptr;
}

Tensor& Module::parameter(std::string_view dotted_name) {
  auto [m, last] = resolve(dotted_name);
  Tensor* t = m->find_slot(m->parameters_, last);
  TESSEL_CHECK(t != nullptr, OutOfRange, "{} has no parameter '{}'", type_name_, dotted_name);
  return *t;
}

Tensor& Module::buffer(std::string_view dotted_name) {
  auto [m, last] = resolve(dotted_name);
  Tensor* t = m->find_slot(m->buffers_, last);
  TESSEL_CHECK(t != nullptr, OutOfRange, "{} has no buffer '{}'", type_name_, dotted_name);
  return *t;
}

Module& Module::submodule(std::string_view dotted_name) {
  if (dotted_name.empty()) return *this;
  auto [m, last] = resolve(dotted_name);
  for (auto& [name, child] : m->children_) {
    if (name == last) return *child;
  }
  throw OutOfRange(fmt::format("{} has no submodule '{}'", type_name_, dotted_name));
}

void Module::set_submodule(std::string_view dotted_name, std::shared_ptr<Module> module) {
  TESSEL_CHECK(!dotted_name.empty(), InvalidArgument,
               "set_submodule: the name is empty (a module cannot replace itself)");
  TESSEL_CHECK(module != nullptr, InvalidArgument, "set_submodule('{}'): the module is null",
               dotted_name);
  auto [m, last] = resolve(dotted_name);
  for (auto& [name, child] : m->children_) {
    if (name == last) {
      child = std::move(module);
      return;
    }
  }
  throw OutOfRange(fmt::format("{} has no submodule '{}'", type_name_, dotted_name));
}

void Module::map_tensors(const std::function<Tensor(const Tensor&)>& fn) {
  NoGradGuard no_grad;  // moving data is not part of any graph
  visit("", [&](const std::string&, const Module& m) {
    for (const Slot& s : m.parameters_) s.value->set_data(fn(*s.value));
    for (const Slot& s : m.buffers_) s.value->set_data(fn(*s.value));
  });
}

Module& Module::to(Device device) {
  map_tensors([device](const Tensor& t) { return tessel::to(t, device); });
  return *this;
}

Module& Module::to(DType dtype) {
  map_tensors(
      [dtype](const Tensor& t) { return is_floating(t.dtype()) ? tessel::to(t, dtype) : t; });
  return *this;
}

Module& Module::to_empty(Device device) {
  map_tensors([device](const Tensor& t) { return empty(t.shape(), t.dtype(), device); });
  return *this;
}

void Module::set_parameter(std::string_view dotted_name, Tensor value) {
  TESSEL_CHECK(value.defined(), InvalidArgument, "set_parameter('{}'): the value is undefined",
               dotted_name);
  parameter(dotted_name) = std::move(value);
}

StateDict Module::state_dict() const {
  StateDict state;
  for (auto& [name, t] : named_parameters()) state.emplace(name, t);
  for (auto& [name, t] : named_buffers()) state.emplace(name, t);
  return state;
}

namespace {

std::string join_list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

void Module::load_state_dict(const StateDict& state) {
  std::vector<std::pair<std::string, Tensor>> targets = named_parameters();
  for (auto& entry : named_buffers()) targets.push_back(entry);

  // Validate everything first, so a bad dict changes nothing.
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> known;
  for (const auto& [name, dst] : targets) {
    known.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    if (!src.defined() || src.shape() != dst.shape() || src.dtype() != dst.dtype()) {
      mismatched.push_back(fmt::format(
          "{} (expected {} {}, got {})", name, shape_str(dst.shape()), dtype_name(dst.dtype()),
          src.defined() ? shape_str(src.shape()) + " " + std::string(dtype_name(src.dtype()))
                        : "undefined"));
    }
  }
  for (const auto& [name, t] : state) {
    if (!known.count(name)) unexpected.push_back(name);
  }
  std::string problems;
  if (!missing.empty()) problems += "; missing keys: " + join_list(missing);
  if (!unexpected.empty()) problems += "; unexpected keys: " + join_list(unexpected);
  if (!mismatched.empty()) problems += "; mismatched: " + join_list(mismatched);
  TESSEL_CHECK(problems.empty(), InvalidArgument, "{}.load_state_dict: {}", type_name_,
               problems.substr(2));

  NoGradGuard no_grad;  // a copy into parameters is not part of any graph
  for (const auto& [name, dst] : targets) {
    const Tensor& src = state.at(name);
    if (dst.impl_ptr() != src.impl_ptr()) copy_(dst, src);
  }
}

void Module::save(const std::string& path,
                  const std::map<std::string, std::string>& metadata) const {
  save_safetensors(path, state_dict(), metadata);
}

void Module::load(const std::string& path) { load_state_dict(load_safetensors(path).tensors); }

void Module::train(bool on) {
  visit("", [&](const std::string&, const Module& m) { const_cast<Module&>(m).training_ = on; });
}

void Module::zero_grad() {
  for (auto& [name, t] : named_parameters()) t.set_grad(Tensor());
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  const uint64_t id = next_hook_id_++;
  pre_hooks_.emplace_back(id, std::move(hook));
  return {id};
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  const uint64_t id = next_hook_id_++;
  post_hooks_.emplace_back(id, std::move(hook));
  return {id};
}

HookHandle Module::register_backward_pre_hook(BackwardPreHook hook) {
  const uint64_t id = next_hook_id_++;
  backward_pre_hooks_.emplace_back(id, std::move(hook));
  return {id};
}

HookHandle Module::register_backward_hook(BackwardHook hook) {
  const uint64_t id = next_hook_id_++;
  backward_hooks_.emplace_back(id, std::move(hook));
  return {id};
}

void Module::set_attachment(const std::string& key, std::shared_ptr<void> value) {
  if (value) {
    attachments_[key] = std::move(value);
  } else {
    attachments_.erase(key);
  }
}

std::shared_ptr<void> Module::attachment(const std::string& key) const {
  const auto it = attachments_.find(key);
  return it == attachments_.end() ? nullptr : it->second;
}

bool Module::remove_hook(HookHandle handle) {
  auto drop = [&](auto& hooks) {
    const auto before = hooks.size();
    std::erase_if(hooks, [&](const auto& h) { return h.first == handle.id; });
    return hooks.size() != before;
  };
  const bool pre = drop(pre_hooks_);
  const bool post = drop(post_hooks_);
  const bool backward_pre = drop(backward_pre_hooks_);
  const bool backward = drop(backward_hooks_);
  return pre || post || backward_pre || backward;
}

}  // namespace tessel::nn
