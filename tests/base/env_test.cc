#include "tessel/base/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "tessel/base/error.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;

// Sets a variable for one test and restores the old state after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(EnvTest, RegistryIsCompleteAndWellFormed) {
  std::set<std::string_view> names;
  for (const auto& k : env_knobs()) {
    EXPECT_TRUE(k.name.starts_with("TESSEL_")) << k.name;
    EXPECT_FALSE(k.description.empty()) << k.name;
    EXPECT_EQ(k.description.find('\n'), std::string_view::npos) << k.name;
    EXPECT_TRUE(names.insert(k.name).second) << "duplicate knob " << k.name;
    EXPECT_EQ(&env_knob_info(k.knob), &k);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(EnvKnob::kCount));
}

TEST(EnvTest, DefaultsApplyWhenUnsetOrEmpty) {
  ScopedEnv unset("TESSEL_LOG_TIMESTAMPS", nullptr);
  EXPECT_FALSE(env_value(EnvKnob::kLogTimestamps).has_value());
  EXPECT_EQ(env_string(EnvKnob::kLogTimestamps), "1");
  EXPECT_TRUE(env_bool(EnvKnob::kLogTimestamps));
  ScopedEnv empty("TESSEL_LOG_TIMESTAMPS", "");
  EXPECT_EQ(env_value(EnvKnob::kLogTimestamps), "");
  EXPECT_TRUE(env_bool(EnvKnob::kLogTimestamps));
}

TEST(EnvTest, TypedReadsParseAndNameTheVariableOnError) {
  ScopedEnv off("TESSEL_LOG_TIMESTAMPS", "Off");
  EXPECT_FALSE(env_bool(EnvKnob::kLogTimestamps));
  ScopedEnv bad("TESSEL_LOG_TIMESTAMPS", "maybe");
  try {
    env_bool(EnvKnob::kLogTimestamps);
    FAIL() << "accepted 'maybe' as a boolean";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("TESSEL_LOG_TIMESTAMPS='maybe'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(env_int(EnvKnob::kLogTimestamps), InvalidArgument);
  ScopedEnv number("TESSEL_LOG_TIMESTAMPS", "42");
  EXPECT_EQ(env_int(EnvKnob::kLogTimestamps), 42);
  EXPECT_EQ(env_duration(EnvKnob::kLogTimestamps), 42s);
  ScopedEnv duration("TESSEL_LOG_TIMESTAMPS", "3 parsecs");
  EXPECT_THROW(env_duration(EnvKnob::kLogTimestamps), InvalidArgument);
}

TEST(EnvTest, ParseBoolWords) {
  EXPECT_EQ(parse_bool("TRUE"), true);
  EXPECT_EQ(parse_bool("yes"), true);
  EXPECT_EQ(parse_bool("0"), false);
  EXPECT_EQ(parse_bool("no"), false);
  EXPECT_EQ(parse_bool("2"), std::nullopt);
}

TEST(EnvTest, MarkdownTableListsEveryKnob) {
  const std::string table = env_knobs_markdown();
  for (const auto& k : env_knobs()) {
    EXPECT_NE(table.find(fmt::format("| `{}` |", k.name)), std::string::npos) << k.name;
  }
}

// docs/environment.md carries the table verbatim, so the docs cannot drift from the code.
TEST(EnvTest, DocsEnvironmentPageMatchesTheRegistry) {
  std::ifstream in(std::string(TESSEL_SOURCE_DIR) + "/docs/environment.md");
  ASSERT_TRUE(in) << "docs/environment.md is missing";
  std::stringstream buffer;
  buffer << in.rdbuf();
  EXPECT_NE(buffer.str().find(env_knobs_markdown()), std::string::npos)
      << "docs/environment.md is out of date; regenerate its table with "
         "`tessel-info --knobs-markdown`:\n"
      << env_knobs_markdown();
}

}  // namespace
}  // namespace tessel
