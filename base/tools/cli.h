#pragma once
// Command-line parsing shared by tessel's tools and examples (programs that link CLI11; not
// installed): validators whose errors name the bad value and the valid range in words, and one
// parse call that turns every CLI11 error into one line and a documented exit status.
//
//   CLI::App app{"train_gpt: ..."};
//   app.add_option("--steps", steps, "optimizer steps")->check(cli::integer_at_least(1));
//   if (auto status = cli::parse(app, argc, argv, "train_gpt")) return *status;
//
// gives `train_gpt: --steps 0: expected an integer of at least 1` and exit status 65.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::cli {

// The statuses of tessel-run (docs/launching.md, "Exit status"), after sysexits.h.
inline constexpr int kExitUsage = 64;     // unknown flag, missing value, stray argument
inline constexpr int kExitBadValue = 65;  // a value that cannot work (out of range, not a number)

namespace detail {

inline std::optional<int64_t> to_integer(const std::string& text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

inline std::optional<double> to_number(const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used != text.size() || !std::isfinite(value)) return std::nullopt;
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace detail

// An integer in [min, max]; the message says the range in words ("at least 1", "from 0 to 3").
inline CLI::Validator integer_in(int64_t min, int64_t max = std::numeric_limits<int64_t>::max()) {
  const std::string range = max == std::numeric_limits<int64_t>::max()
                                ? fmt::format("an integer of at least {}", min)
                                : fmt::format("an integer from {} to {}", min, max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const auto value = detail::to_integer(text);
        if (value && *value >= min && *value <= max) return "";
        return fmt::format("'{}': expected {}", text, range);
      },
      max == std::numeric_limits<int64_t>::max() ? fmt::format("at least {}", min)
                                                 : fmt::format("{} to {}", min, max));
}
inline CLI::Validator integer_at_least(int64_t min) { return integer_in(min); }

// A finite number; `min_exclusive`: greater than min, else at least min.
inline CLI::Validator number_above(double min, bool min_exclusive = true) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const auto value = detail::to_number(text);
        if (value && (min_exclusive ? *value > min : *value >= min)) return "";
        return fmt::format("'{}': expected a number {} {}", text,
                           min_exclusive ? "greater than" : "of at least", min);
      },
      fmt::format("{} {}", min_exclusive ? "greater than" : "at least", min));
}
inline CLI::Validator number_at_least(double min) { return number_above(min, false); }

// One of `choices`, verbatim.
inline CLI::Validator one_of(std::vector<std::string> choices) {
  std::string words;
  for (size_t i = 0; i < choices.size(); ++i) {
    words += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  return CLI::Validator(
      [choices, words](std::string& text) -> std::string {
        for (const std::string& c : choices) {
          if (text == c) return "";
        }
        return fmt::format("'{}': expected {}", text, words);
      },
      words);
}

// Call before adding options: --help will show every option's default.
inline void show_defaults(CLI::App& app) { app.option_defaults()->always_capture_default(); }

// Call after adding options: each --help line reads "--steps INT  optimizer steps (default 400;
// at least 1)", the type in one word and the default and valid range in words.
inline void describe_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;  // a flag
    const std::string type_name = opt->get_type_name();
    const size_t colon = type_name.find(':');
    std::string type = type_name.substr(0, colon);
    if (type == "UINT") type = "INT";
    if (type == "FLOAT") type = "NUMBER";
    const std::string range = colon == std::string::npos ? "" : type_name.substr(colon + 1);
    std::string notes;
    if (!opt->get_default_str().empty()) notes = "default " + opt->get_default_str();
    if (!range.empty()) notes += (notes.empty() ? "" : "; ") + range;
    opt->option_text(type);
    if (!notes.empty()) opt->description(opt->get_description() + " (" + notes + ")");
  }
}

// Parses argv. Returns nullopt to go on; otherwise the status to exit with, after printing the
// help (stdout, 0) or one line `TOOL: MESSAGE` (stderr): kExitBadValue for a value a validator
// refused or that does not convert, `usage_status` for the rest.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv, std::string_view tool,
                                int usage_status = kExitUsage,
                                int bad_value_status = kExitBadValue) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::ValidationError& e) {
    // CLI11 writes "--steps: '0': expected ..."; we write "--steps '0': expected ...".
    std::string message = e.what();
    if (const size_t colon = message.find(": '"); colon != std::string::npos) {
      message.erase(colon, 1);
    }
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(tool.size()), tool.data(), message.c_str());
    return bad_value_status;
  } catch (const CLI::ConversionError& e) {
    // "Could not convert: --ddp = maybe" -> "--ddp 'maybe': not a value this flag takes".
    std::string message = e.what();
    const std::string lead = "Could not convert: ";
    if (const size_t eq = message.find(" = ");
        message.starts_with(lead) && eq != std::string::npos) {
      message =
          fmt::format("{} '{}': not a value this flag takes (see {} --help)",
                      message.substr(lead.size(), eq - lead.size()), message.substr(eq + 3), tool);
    }
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(tool.size()), tool.data(), message.c_str());
    return bad_value_status;
  } catch (const CLI::ExtrasError& e) {
    const std::string message = e.what();
    const size_t colon = message.find(": ");
    std::string args = colon == std::string::npos ? message : message.substr(colon + 2);
    const bool flag = args.starts_with("-");
    std::fprintf(stderr, "%.*s: %s '%s' (see %.*s --help)\n", static_cast<int>(tool.size()),
                 tool.data(), flag ? "unknown flag" : "unexpected argument", args.c_str(),
                 static_cast<int>(tool.size()), tool.data());
    return usage_status;
  } catch (const CLI::ArgumentMismatch& e) {
    // "--steps: 1 required INT missing" and the like: the flag came without its value.
    const std::string message = e.what();
    const std::string flag = message.substr(0, message.find_first_of(": "));
    std::fprintf(stderr, "%.*s: %s needs a value (see %.*s --help)\n",
                 static_cast<int>(tool.size()), tool.data(), flag.c_str(),
                 static_cast<int>(tool.size()), tool.data());
    return usage_status;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%.*s: %s (see %.*s --help)\n", static_cast<int>(tool.size()), tool.data(),
                 e.what(), static_cast<int>(tool.size()), tool.data());
    return usage_status;
  }
}

}  // namespace tessel::cli
