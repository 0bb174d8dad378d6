#include "tessel/launcher/slurm_env.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <memory>

#include "tessel/base/error.h"
#include "tessel/base/launch_env.h"

namespace tessel::launcher {
namespace {

// Slurm's variables read only here (base/launch_env.h has those the workers read too).
constexpr char kStepNumNodes[] = "SLURM_STEP_NUM_NODES";
constexpr char kStepNodeList[] = "SLURM_STEP_NODELIST";
constexpr char kJobNodeList[] = "SLURM_JOB_NODELIST";
constexpr char kCpusPerTask[] = "SLURM_CPUS_PER_TASK";
constexpr char kCpusOnNode[] = "SLURM_CPUS_ON_NODE";
constexpr char kGpusOnNode[] = "SLURM_GPUS_ON_NODE";
constexpr char kStepGpus[] = "SLURM_STEP_GPUS";
constexpr char kJobGpus[] = "SLURM_JOB_GPUS";

constexpr int kBasePort = 29400;  // torchrun's default rendezvous port

const std::string* find(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// A non-negative integer variable; nullopt when unset.
std::optional<long> int_var(const Environment& env, const char* name) {
  const std::string* text = find(env, name);
  if (text == nullptr) return std::nullopt;
  long value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  TESSEL_CHECK(ec == std::errc() && end == text->data() + text->size() && value >= 0,
               InvalidArgument, "{}='{}' is not a non-negative integer", name, *text);
  return value;
}

// Splits at commas outside brackets.
std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string current;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    TESSEL_CHECK(depth >= 0 && depth <= 1, InvalidArgument,
                 "hostlist '{}': brackets do not balance (or nest)", text);
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  TESSEL_CHECK(depth == 0, InvalidArgument, "hostlist '{}': a '[' is not closed", text);
  parts.push_back(current);
  return parts;
}

// "0-2,5" inside brackets -> "0" "1" "2" "5", keeping each range's zero padding.
std::vector<std::string> expand_ranges(const std::string& ranges, const std::string& whole) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= ranges.size()) {
    const size_t comma = std::min(ranges.find(',', start), ranges.size());
    const std::string item = ranges.substr(start, comma - start);
    const size_t dash = item.find('-');
    const std::string lo = item.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    long a = 0, b = 0;
    const auto parse = [&](const std::string& t, long& v) {
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
      return !t.empty() && ec == std::errc() && end == t.data() + t.size() && v >= 0;
    };
    TESSEL_CHECK(parse(lo, a) && parse(hi, b) && a <= b, InvalidArgument,
                 "hostlist '{}': '{}' is not N or LOW-HIGH with LOW <= HIGH", whole, item);
    TESSEL_CHECK(b - a < 100000, InvalidArgument, "hostlist '{}': range '{}' is too long", whole,
                 item);
    for (long v = a; v <= b; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(digits);
    }
    start = comma + 1;
  }
  return out;
}

// Runs `scontrol show node NAME -o` and returns its NodeAddr (empty when it cannot).
std::string scontrol_node_addr(const std::string& node) {
  for (char c : node) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return "";  // not a plain node name: never reaches a shell
  }
  const std::string cmd = "scontrol show node -o '" + node + "' 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return "";
  std::string out;
  char buf[4096];
  while (const size_t n = fread(buf, 1, sizeof(buf), pipe.get())) out.append(buf, n);
  const size_t at = out.find("NodeAddr=");
  if (at == std::string::npos) return "";
  const size_t begin = at + 9;
  return out.substr(begin, out.find_first_of(" \n", begin) - begin);
}

// getaddrinfo's first IPv4 address of `host`; empty when it has none.
std::string ipv4_of(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "";
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, text, sizeof(text));
  freeaddrinfo(res);
  return text;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& text) {
  std::vector<std::string> hosts;
  for (const std::string& part : split_top_level(text)) {
    TESSEL_CHECK(!part.empty(), InvalidArgument, "hostlist '{}' has an empty name", text);
    // Expand bracket groups left to right: each turns every name so far into several.
    std::vector<std::string> names{""};
    size_t at = 0;
    while (at < part.size()) {
      const size_t open = part.find('[', at);
      const std::string literal = part.substr(at, open - at);
      for (auto& n : names) n += literal;
      if (open == std::string::npos) break;
      const size_t close = part.find(']', open);
      TESSEL_CHECK(close != std::string::npos, InvalidArgument,
                   "hostlist '{}': a '[' is not closed", text);
      // The left group varies slowest: r[1-2]-n[1-2] is r1-n1 r1-n2 r2-n1 r2-n2.
      const auto suffixes = expand_ranges(part.substr(open + 1, close - open - 1), text);
      std::vector<std::string> next;
      for (const auto& n : names)
        for (const auto& suffix : suffixes) next.push_back(n + suffix);
      names = std::move(next);
      at = close + 1;
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return hosts;
}

std::optional<SlurmStep> read_slurm_step(const Environment& env) {
  if (find(env, launch_env::kSlurmStepId) == nullptr) return std::nullopt;
  SlurmStep step;
  const auto nodes = int_var(env, kStepNumNodes);
  const auto nnodes = nodes ? nodes : int_var(env, launch_env::kSlurmNnodes);
  TESSEL_CHECK(nnodes.has_value() && *nnodes >= 1, InvalidArgument,
               "an srun step ({} is set) without {} or {}", launch_env::kSlurmStepId, kStepNumNodes,
               launch_env::kSlurmNnodes);
  step.nnodes = static_cast<int>(*nnodes);
  step.node_rank = static_cast<int>(int_var(env, launch_env::kSlurmNodeId).value_or(0));
  TESSEL_CHECK(step.node_rank < step.nnodes, InvalidArgument,
               "{}={} is not below the step's {} nodes", launch_env::kSlurmNodeId, step.node_rank,
               step.nnodes);
  if (const std::string* id = find(env, launch_env::kSlurmJobId)) step.job_id = *id;
  const std::string* list = find(env, kStepNodeList);
  if (list == nullptr) list = find(env, kJobNodeList);
  if (list != nullptr) {
    const std::vector<std::string> hosts = expand_hostlist(*list);
    TESSEL_CHECK(static_cast<int>(hosts.size()) >= step.nnodes, InvalidArgument,
                 "the node list '{}' names {} hosts for a step of {} nodes", *list, hosts.size(),
                 step.nnodes);
    step.first_node = hosts.front();
  }
  return step;
}

bool in_slurm_batch_script(const Environment& env) {
  return find(env, launch_env::kSlurmNnodes) != nullptr &&
         find(env, launch_env::kSlurmStepId) == nullptr;
}

std::string resolve_node_address(const std::string& node,
                                 const std::function<std::string(const std::string&)>& slurm_addr) {
  std::string addr = ipv4_of(node);
  if (addr.empty() || addr.rfind("127.", 0) == 0) {
    const std::string from_slurm = slurm_addr ? slurm_addr(node) : scontrol_node_addr(node);
    if (!from_slurm.empty()) {
      const std::string again = ipv4_of(from_slurm);
      if (!again.empty()) addr = again;
    }
  }
  TESSEL_CHECK(!addr.empty(), InvalidArgument,
               "cannot resolve the step's first node '{}' (getaddrinfo, scontrol show node); "
               "give --rdzv-endpoint HOST:PORT or MASTER_ADDR",
               node);
  return addr;
}

std::string slurm_rdzv_endpoint(
    const SlurmStep& step, const Environment& env,
    const std::function<std::string(const std::string&)>& slurm_node_addr) {
  std::string host;
  if (const std::string* addr = find(env, launch_env::kMasterAddr)) {
    host = *addr;
  } else {
    TESSEL_CHECK(!step.first_node.empty(), InvalidArgument,
                 "under srun without {} or {}: no node list to find the rendezvous host; give "
                 "--rdzv-endpoint HOST:PORT",
                 kStepNodeList, kJobNodeList);
    host = resolve_node_address(step.first_node, slurm_node_addr);
  }
  long port = kBasePort;
  if (const auto p = int_var(env, launch_env::kMasterPort)) {
    port = *p;
  } else if (!step.job_id.empty()) {
    long id = 0;
    const auto [end, ec] =
        std::from_chars(step.job_id.data(), step.job_id.data() + step.job_id.size(), id);
    if (ec == std::errc()) port += id % 1000;
  }
  return host + ":" + std::to_string(port);
}

std::optional<int> slurm_nproc_per_node(const std::string& kind, const Environment& env) {
  std::optional<long> gpus = int_var(env, kGpusOnNode);
  if (!gpus) {
    for (const char* name : {kStepGpus, kJobGpus}) {
      if (const std::string* list = find(env, name)) {
        gpus = static_cast<long>(std::count(list->begin(), list->end(), ',') + 1);
        break;
      }
    }
  }
  std::optional<long> cpus = int_var(env, kCpusPerTask);
  if (!cpus) cpus = int_var(env, kCpusOnNode);
  if (kind == "gpu") {
    if (!gpus && !cpus) return std::nullopt;  // not in an allocation: not Slurm's to say
    TESSEL_CHECK(gpus.value_or(0) > 0, InvalidArgument,
                 "--nproc-per-node gpu: the Slurm allocation has no GPUs on this node ({} unset); "
                 "ask for them (--gpus-per-node) or give a number",
                 kGpusOnNode);
    return static_cast<int>(*gpus);
  }
  if (kind == "auto" && gpus.value_or(0) > 0) return static_cast<int>(*gpus);
  if (cpus && *cpus > 0) return static_cast<int>(*cpus);
  return std::nullopt;
}

}  // namespace tessel::launcher
