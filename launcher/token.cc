#include "tessel/launcher/token.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "tessel/base/env.h"
#include "tessel/base/error.h"

namespace tessel::launcher {

std::string generate_token() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_system_error("getrandom for the job token", errno);
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

std::string read_token_file(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw_system_error("token file " + path, errno);
  TESSEL_CHECK(S_ISREG(st.st_mode), InvalidArgument, "token file {} is not a regular file", path);
  TESSEL_CHECK((st.st_mode & 077) == 0, InvalidArgument,
               "token file {} has mode {:o}; expected 0600 (chmod 600 {})", path,
               st.st_mode & 0777, path);
  std::ifstream in(path);
  TESSEL_CHECK(in.good(), IoError, "cannot read token file {}", path);
  std::stringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  const auto first = token.find_first_not_of(" \t\r\n");
  const auto last = token.find_last_not_of(" \t\r\n");
  TESSEL_CHECK(first != std::string::npos, InvalidArgument, "token file {} is empty", path);
  return token.substr(first, last - first + 1);
}

std::string load_token(const std::string& token_file) {
  if (!token_file.empty()) return read_token_file(token_file);
  std::string token = env_string(EnvKnob::kRdzvToken);
  TESSEL_CHECK(!token.empty(), InvalidArgument,
               "a multi-node job needs a token on every node: set TESSEL_RDZV_TOKEN or pass "
               "--rdzv-token-file FILE (mode 0600)");
  return token;
}

bool tokens_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace tessel::launcher
