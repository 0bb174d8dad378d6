#include "tessel/launcher/token.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "tessel/base/env.h"
#include "tessel/base/error.h"

namespace tessel::launcher {
namespace {

TEST(TokenTest, GeneratedTokensAreLongHexAndFresh) {
  const std::string a = generate_token(), b = generate_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

TEST(TokenTest, FileMustBeOwnerOnly) {
  char templ[] = "/tmp/tessel-token-test-XXXXXX";
  ASSERT_NE(mkdtemp(templ), nullptr);
  const std::string path = std::string(templ) + "/token";
  std::ofstream(path) << "  secret-value \n";
  chmod(path.c_str(), 0644);
  try {
    read_token_file(path);
    FAIL() << "a world-readable token file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("644"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("secret-value"), std::string::npos);
  }
  chmod(path.c_str(), 0600);
  EXPECT_EQ(read_token_file(path), "secret-value");
  EXPECT_THROW(read_token_file(path + ".missing"), IoError);
}

TEST(TokenTest, EnvironmentTokenIsNeverShown) {
  setenv("TESSEL_RDZV_TOKEN", "very-secret-token", 1);
  EXPECT_EQ(load_token(""), "very-secret-token");
  EXPECT_EQ(env_knobs_text().find("very-secret-token"), std::string::npos);
  unsetenv("TESSEL_RDZV_TOKEN");
  EXPECT_THROW(load_token(""), InvalidArgument);
}

TEST(TokenTest, ComparesWholeStrings) {
  EXPECT_TRUE(tokens_equal("abc", "abc"));
  EXPECT_FALSE(tokens_equal("abc", "abd"));
  EXPECT_FALSE(tokens_equal("abc", "abcd"));
  EXPECT_FALSE(tokens_equal("", "a"));
}

}  // namespace
}  // namespace tessel::launcher
