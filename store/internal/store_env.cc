// The parts of the gRPC store that need no gRPC: tokens and the worker environment.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/store/store_client.h"
#include "tessel/store/store_server.h"
#include "tessel/store/store_tls.h"

namespace tessel {

std::string generate_store_token() {
  unsigned char bytes[32];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_system_error("open /dev/urandom for a store token", errno);
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::read(fd, bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw_system_error("read /dev/urandom for a store token", err);
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

std::string read_store_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_system_error(fmt::format("open store token file '{}'", path), errno);
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  const auto first = token.find_first_not_of(" \t\r\n");
  const auto last = token.find_last_not_of(" \t\r\n");
  token = first == std::string::npos ? std::string() : token.substr(first, last - first + 1);
  TESSEL_CHECK(!token.empty(), InvalidArgument, "store token file '{}' is empty", path);
  return token;
}

std::string store_token_from_env(const std::string& address) {
  std::string token = env_string(EnvKnob::kStoreToken);
  if (!token.empty()) return token;
  const std::string file = env_string(EnvKnob::kStoreTokenFile);
  TESSEL_CHECK(!file.empty(), InvalidArgument,
               "neither TESSEL_STORE_TOKEN nor TESSEL_STORE_TOKEN_FILE is set; the store at {} "
               "needs the job's token",
               address);
  return read_store_token_file(file);
}

StoreClientOptions store_client_options_from_env() {
  StoreClientOptions options;
  options.address = env_string(EnvKnob::kStoreAddr);
  TESSEL_CHECK(!options.address.empty(), InvalidArgument,
               "TESSEL_STORE_ADDR is not set; expected host:port of the job's store server "
               "(tessel-run sets it for every worker)");
  options.token = store_token_from_env(options.address);
  options.tls = tls_files_from_env();
  return options;
}

TlsFiles tls_files_from_env() {
  return {env_string(EnvKnob::kTlsCert), env_string(EnvKnob::kTlsKey), env_string(EnvKnob::kTlsCa)};
}

std::shared_ptr<Store> store_client_from_env() {
  return std::make_shared<StoreClient>(store_client_options_from_env());
}

}  // namespace tessel
