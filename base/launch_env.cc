#include "tessel/base/launch_env.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <optional>

#include "tessel/base/env.h"
#include "tessel/base/error.h"

namespace tessel {
namespace {

std::optional<int> int_var(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  int value = 0;
  const char* end = text + std::char_traits<char>::length(text);
  const auto [ptr, ec] = std::from_chars(text, end, value);
  TESSEL_CHECK(ec == std::errc() && ptr == end && value >= 0, InvalidArgument,
               "environment variable {}='{}' is not a non-negative integer", name, text);
  return value;
}

std::string str_var(const char* name) {
  const char* text = std::getenv(name);
  return text == nullptr ? std::string() : std::string(text);
}

// LOCAL_WORLD_SIZE only tunes how a waiting rank spins, so a value that is not a number counts
// as unset (as atoi reads it) rather than failing the launch.
int lenient_int_var(const char* name) {
  const char* text = std::getenv(name);
  return text == nullptr ? 0 : std::max(0, std::atoi(text));
}

}  // namespace

LaunchEnv read_launch_env() {
  using namespace launch_env;
  LaunchEnv env;
  std::optional<int> local_rank;
  if (auto rank = int_var(kRank), size = int_var(kWorldSize); rank && size) {
    env.launcher = "torchrun";
    env.rank = *rank;
    env.world_size = *size;
    local_rank = int_var(kLocalRank);
  } else if (auto r = int_var(kOmpiRank), s = int_var(kOmpiSize); r && s) {
    env.launcher = "mpirun";
    env.rank = *r;
    env.world_size = *s;
    local_rank = int_var(kOmpiLocalRank);
  } else if (auto r2 = int_var(kSlurmProcId), s2 = int_var(kSlurmNtasks); r2 && s2) {
    env.launcher = "slurm";
    env.rank = *r2;
    env.world_size = *s2;
    local_rank = int_var(kSlurmLocalId);
  }
  env.local_rank = local_rank.value_or(0);
  env.local_rank_set = local_rank.has_value();
  env.local_world_size = lenient_int_var(kLocalWorldSize);
  env.master_addr = str_var(kMasterAddr);
  env.master_port = int_var(kMasterPort).value_or(0);
  env.store_addr = env_string(EnvKnob::kStoreAddr);
  env.restart_count = int_var(kRestartCount).value_or(0);
  env.max_restarts = int_var(kMaxRestarts).value_or(-1);
  TESSEL_CHECK(env.world_size >= 1 && env.rank < env.world_size, InvalidArgument,
               "launcher '{}' gave rank {} but world size {}", env.launcher, env.rank,
               env.world_size);
  return env;
}

}  // namespace tessel
