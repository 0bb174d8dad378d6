// Layouts of blocks over pipeline stages: uniform, user-given, balanced by a cost profile.
#include "tessel/parallel/pp/stage_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numeric>

#include "tessel/base/error.h"

namespace tessel::pp {

std::vector<int> uniform_layout(int num_blocks, int num_stages) {
  TESSEL_CHECK(num_blocks >= 0 && num_stages >= 1, InvalidArgument,
               "uniform layout of {} blocks over {} stages: expected blocks >= 0 and stages >= 1",
               num_blocks, num_stages);
  std::vector<int> layout(static_cast<size_t>(num_stages), num_blocks / num_stages);
  for (int s = 0; s < num_blocks % num_stages; ++s) ++layout[static_cast<size_t>(s)];
  return layout;
}

std::string format_layout(const std::vector<int>& layout) {
  return fmt::format("{}", fmt::join(layout, ","));
}

void check_layout(const std::vector<int>& layout, int num_blocks, int num_stages) {
  TESSEL_CHECK(static_cast<int>(layout.size()) == num_stages, InvalidArgument,
               "pipeline layout {} has {} stages; expected {} (ranks x virtual stages)",
               format_layout(layout), layout.size(), num_stages);
  for (size_t s = 0; s < layout.size(); ++s) {
    TESSEL_CHECK(layout[s] >= 0, InvalidArgument,
                 "pipeline layout {}: stage {} holds {} blocks; expected a count >= 0",
                 format_layout(layout), s, layout[s]);
  }
  const int sum = std::accumulate(layout.begin(), layout.end(), 0);
  TESSEL_CHECK(sum == num_blocks, InvalidArgument,
               "pipeline layout {} places {} blocks; the model has {}", format_layout(layout), sum,
               num_blocks);
}

std::vector<int> parse_layout(std::string_view text, int num_blocks, int num_stages) {
  std::vector<int> layout;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    int value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    TESSEL_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size(),
                 InvalidArgument,
                 "pipeline layout '{}': '{}' is not a block count; expected comma-separated "
                 "integers such as 2,3,3,2",
                 text, item);
    layout.push_back(value);
    at = comma + 1;
  }
  check_layout(layout, num_blocks, num_stages);
  return layout;
}

std::vector<int> balanced_layout(std::span<const double> costs, int num_stages) {
  TESSEL_CHECK(costs.size() >= 2 && num_stages >= 1, InvalidArgument,
               "balanced layout: {} costs over {} stages; expected {{embedding, blocks..., head}} "
               "(at least 2 costs) and at least 1 stage",
               costs.size(), num_stages);
  for (size_t i = 0; i < costs.size(); ++i) {
    TESSEL_CHECK(std::isfinite(costs[i]) && costs[i] >= 0, InvalidArgument,
                 "balanced layout: cost {} of layer {} is not a finite non-negative number",
                 costs[i], i);
  }
  const int L = static_cast<int>(costs.size()) - 2;
  const int S = num_stages;
  // prefix[j]: cost of blocks 0..j−1.
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);
  for (int j = 0; j < L; ++j) prefix[j + 1] = prefix[j] + costs[static_cast<size_t>(j) + 1];
  const double head = costs.back();
  auto stage_cost = [&](int s, int from, int to) {
    return prefix[to] - prefix[from] + (s == 0 ? costs[0] : 0.0) + (s == S - 1 ? head : 0.0);
  };
  // best[s][j]: the smallest possible maximum over stages 0..s holding blocks 0..j−1; cut[s][j]
  // the first block of stage s in that arrangement (the largest such cut: blocks go early).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(S, std::vector<int>(L + 1, 0));
  for (int j = 0; j <= L; ++j) best[0][j] = stage_cost(0, 0, j);
  for (int s = 1; s < S; ++s) {
    for (int j = 0; j <= L; ++j) {
      for (int k = 0; k <= j; ++k) {
        const double c = std::max(best[s - 1][k], stage_cost(s, k, j));
        if (c <= best[s][j]) {
          best[s][j] = c;
          cut[s][j] = k;
        }
      }
    }
  }
  std::vector<int> layout(static_cast<size_t>(S), 0);
  int j = L;
  for (int s = S - 1; s > 0; --s) {
    layout[static_cast<size_t>(s)] = j - cut[s][j];
    j = cut[s][j];
  }
  layout[0] = j;
  return layout;
}

std::vector<double> gpt_layer_costs(const nn::GptConfig& config, int64_t seq_len) {
  const double C = static_cast<double>(config.n_embd);
  const double T = static_cast<double>(seq_len);
  const double V = static_cast<double>(config.vocab_size);
  // Forward multiply-accumulates per token; backward costs twice that.
  const double block = 12.0 * C * C + 2.0 * T * C;  // qkv 3C², proj C², MLP 8C²; QKᵀ and AV
  const double head = C * V + V;                    // LM head, softmax cross-entropy
  std::vector<double> costs;
  costs.push_back(3.0 * C);
  for (int64_t l = 0; l < config.n_layer; ++l) costs.push_back(3.0 * block);
  costs.push_back(3.0 * head);
  return costs;
}

}  // namespace tessel::pp
