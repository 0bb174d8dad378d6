#include "tessel/launcher/token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

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
               "token file {} has mode {:o}; expected 0600 (chmod 600 {})", path, st.st_mode & 0777,
               path);
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

namespace {

// `dir`, made 0700 if missing, checked to be a private directory of this user.
void ensure_private_dir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw_system_error("mkdir " + dir, errno);
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) throw_system_error("stat " + dir, errno);
  TESSEL_CHECK(S_ISDIR(st.st_mode) && st.st_uid == getuid() && (st.st_mode & 077) == 0,
               InvalidArgument,
               "{} must be a directory of this user with mode 0700 to hold a local job token "
               "(it has mode {:o}, owner {}); fix it or pass --rdzv-token-file",
               dir, st.st_mode & 0777, st.st_uid);
}

}  // namespace

std::string local_token_path(const std::string& dir, int port) {
  return fmt::format("{}/token-{}", dir, port);
}

void publish_local_token(const std::string& dir, int port, const std::string& token) {
  ensure_private_dir(dir);
  const std::string path = local_token_path(dir, port);
  const std::string tmp = fmt::format("{}.{}", path, getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw_system_error("create " + tmp, errno);
  const bool ok = ::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_system_error("publish the local job token at " + path, err);
  }
}

std::string read_local_token(const std::string& dir, int port) {
  ensure_private_dir(dir);
  try {
    return read_token_file(local_token_path(dir, port));
  } catch (const Error&) {
    return "";
  }
}

void withdraw_local_token(const std::string& dir, int port, const std::string& token) {
  if (read_local_token(dir, port) == token) ::unlink(local_token_path(dir, port).c_str());
}

bool tokens_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace tessel::launcher
