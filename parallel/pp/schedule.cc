// Actions, schedules and their text form (grammar in schedule.h).
#include "tessel/parallel/pp/schedule.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <optional>

#include "tessel/base/error.h"

namespace tessel::pp {
namespace {

struct KindToken {
  ActionKind kind;
  std::string_view prefix;
};
// Longest prefix first, so "BW" is tried before "B".
constexpr KindToken kKindTokens[] = {
    {ActionKind::kSendActivation, "SEND_F"}, {ActionKind::kRecvActivation, "RECV_F"},
    {ActionKind::kSendGradient, "SEND_B"},   {ActionKind::kRecvGradient, "RECV_B"},
    {ActionKind::kBackward, "BW"},           {ActionKind::kForward, "F"},
    {ActionKind::kBackwardInput, "B"},       {ActionKind::kBackwardWeight, "W"},
};

std::string_view prefix_of(ActionKind kind) {
  for (const auto& k : kKindTokens) {
    if (k.kind == kind) return k.prefix;
  }
  return "STEP";
}

constexpr std::string_view kGrammar =
    "expected F<m>s<s>, B<m>s<s>, W<m>s<s>, BW<m>s<s>, SEND_F<m>s<s>><rank>, "
    "RECV_F<m>s<s><<rank>, SEND_B<m>s<s>><rank>, RECV_B<m>s<s><<rank> or STEP";

// Reads a non-negative decimal number at the front of `rest`; nullopt if there is none.
std::optional<int> take_number(std::string_view& rest) {
  size_t n = 0;
  while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
  if (n == 0 || n > 9) return std::nullopt;
  int value = 0;
  std::from_chars(rest.data(), rest.data() + n, value);
  rest.remove_prefix(n);
  return value;
}

std::optional<Action> try_parse(std::string_view token) {
  if (token == "STEP") return step();
  for (const auto& k : kKindTokens) {
    if (!token.starts_with(k.prefix)) continue;
    std::string_view rest = token.substr(k.prefix.size());
    Action a{.kind = k.kind};
    auto mb = take_number(rest);
    if (!mb || rest.empty() || rest.front() != 's') return std::nullopt;
    rest.remove_prefix(1);
    auto stage = take_number(rest);
    if (!stage) return std::nullopt;
    a.microbatch = *mb;
    a.stage = *stage;
    if (is_send(k.kind) || is_recv(k.kind)) {
      const char arrow = is_send(k.kind) ? '>' : '<';
      if (rest.empty() || rest.front() != arrow) return std::nullopt;
      rest.remove_prefix(1);
      auto peer = take_number(rest);
      if (!peer) return std::nullopt;
      a.peer = *peer;
    }
    if (!rest.empty()) return std::nullopt;
    return a;
  }
  return std::nullopt;
}

std::vector<std::string_view> split_tokens(std::string_view text) {
  std::vector<std::string_view> tokens;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) tokens.push_back(text.substr(i, j - i));
    i = j;
  }
  return tokens;
}

// "where" prefix for a token error: "token 3 'F3x1'" or "line 2, token 3 'F3x1'".
std::vector<Action> parse_tokens(std::string_view text, const std::string& where) {
  std::vector<Action> actions;
  const auto tokens = split_tokens(text);
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto a = try_parse(tokens[i]);
    if (!a) {
      throw InvalidArgument(fmt::format("pipeline schedule: {}token {} '{}' is malformed: {}",
                                        where, i + 1, tokens[i], kGrammar));
    }
    actions.push_back(*a);
  }
  return actions;
}

// Parses "key=<int>" into value; false if the token is not that.
bool take_field(std::string_view token, std::string_view key, int& value) {
  if (!token.starts_with(key) || token.size() <= key.size() || token[key.size()] != '=') {
    return false;
  }
  std::string_view rest = token.substr(key.size() + 1);
  auto n = take_number(rest);
  if (!n || !rest.empty()) return false;
  value = *n;
  return true;
}

}  // namespace

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackwardInput ||
         kind == ActionKind::kBackwardWeight || kind == ActionKind::kBackward;
}
bool is_send(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kSendGradient;
}
bool is_recv(ActionKind kind) {
  return kind == ActionKind::kRecvActivation || kind == ActionKind::kRecvGradient;
}

Action forward(int microbatch, int stage) { return {ActionKind::kForward, microbatch, stage}; }
Action backward_input(int microbatch, int stage) {
  return {ActionKind::kBackwardInput, microbatch, stage};
}
Action backward_weight(int microbatch, int stage) {
  return {ActionKind::kBackwardWeight, microbatch, stage};
}
Action backward(int microbatch, int stage) { return {ActionKind::kBackward, microbatch, stage}; }
Action step() { return {ActionKind::kStep}; }

std::string to_string(const Action& a) {
  if (a.kind == ActionKind::kStep) return "STEP";
  std::string s = fmt::format("{}{}s{}", prefix_of(a.kind), a.microbatch, a.stage);
  if (is_send(a.kind)) s += fmt::format(">{}", a.peer);
  if (is_recv(a.kind)) s += fmt::format("<{}", a.peer);
  return s;
}

Action parse_action(std::string_view token) {
  auto a = try_parse(token);
  if (!a) {
    throw InvalidArgument(
        fmt::format("pipeline schedule: action '{}' is malformed: {}", token, kGrammar));
  }
  return *a;
}

std::string format_actions(const std::vector<Action>& actions) {
  std::string out;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (i > 0) out += ' ';
    out += to_string(actions[i]);
  }
  return out;
}

std::vector<Action> parse_actions(std::string_view text) { return parse_tokens(text, ""); }

std::string format_schedule(const PipelineSchedule& s) {
  std::string out = fmt::format("pipeline ranks={} stages={} microbatches={}\n", s.num_ranks,
                                s.num_stages, s.num_microbatches);
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    out += fmt::format("{}: {}\n", r, format_actions(s.ranks[r]));
  }
  return out;
}

PipelineSchedule parse_schedule(std::string_view text) {
  PipelineSchedule s;
  bool have_header = false;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    const auto tokens = split_tokens(line);
    if (tokens.empty()) continue;
    if (!have_header) {
      if (tokens.size() != 4 || tokens[0] != "pipeline" ||
          !take_field(tokens[1], "ranks", s.num_ranks) ||
          !take_field(tokens[2], "stages", s.num_stages) ||
          !take_field(tokens[3], "microbatches", s.num_microbatches)) {
        throw InvalidArgument(
            fmt::format("pipeline schedule: line {} '{}' is not a header; expected "
                        "'pipeline ranks=<p> stages=<S> microbatches=<m>' first",
                        line_no, line));
      }
      have_header = true;
      continue;
    }
    std::string_view label = tokens[0];
    int rank = -1;
    if (label.size() < 2 || label.back() != ':') {
      throw InvalidArgument(fmt::format(
          "pipeline schedule: line {} starts with '{}'; expected '<rank>:' (rank {} next)", line_no,
          label, s.ranks.size()));
    }
    std::string_view digits = label.substr(0, label.size() - 1);
    auto n = take_number(digits);
    if (!n || !digits.empty()) {
      throw InvalidArgument(fmt::format(
          "pipeline schedule: line {} starts with '{}'; expected '<rank>:' (rank {} next)", line_no,
          label, s.ranks.size()));
    }
    rank = *n;
    if (rank != static_cast<int>(s.ranks.size())) {
      throw InvalidArgument(fmt::format(
          "pipeline schedule: line {} is for rank {}; expected rank {} (ranks in order, once)",
          line_no, rank, s.ranks.size()));
    }
    const size_t body = line.find(':') + 1;
    s.ranks.push_back(
        parse_tokens(line.substr(body), fmt::format("line {} (rank {}), ", line_no, rank)));
  }
  if (!have_header) {
    throw InvalidArgument("pipeline schedule: empty text; expected a 'pipeline ranks=...' header");
  }
  if (static_cast<int>(s.ranks.size()) != s.num_ranks) {
    throw InvalidArgument(
        fmt::format("pipeline schedule: header says ranks={} but {} rank "
                    "lines follow",
                    s.num_ranks, s.ranks.size()));
  }
  return s;
}

}  // namespace tessel::pp
