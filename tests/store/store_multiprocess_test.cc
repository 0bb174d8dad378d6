// The gRPC store with real processes: clients in several processes against one server, a
// server process that is killed, a client process with the wrong token. Child processes are
// this binary re-executed (fork + exec, so no gRPC state crosses a fork) with --store-child.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "store_test_util.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;
using testing::client_options_for;
using testing::contains;
using testing::kTestToken;
using testing::loopback_server_options;
using testing::wait_until;

// Exit codes of the child modes.
constexpr int kChildOk = 0;
constexpr int kChildWrong = 1;
constexpr int kChildRefused = 3;

// A child process running this binary in a --store-child mode, with TESSEL_STORE_ADDR and
// TESSEL_STORE_TOKEN in its environment; its stdout is readable through out_fd. Killed (if
// still running) and reaped by the destructor.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& args, const std::string& address,
               const std::string& token) {
    int out[2];
    if (::pipe(out) != 0) throw_system_error("pipe", errno);
    pid_ = ::fork();
    if (pid_ < 0) throw_system_error("fork", errno);
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      ::setenv("TESSEL_STORE_ADDR", address.c_str(), 1);
      ::setenv("TESSEL_STORE_TOKEN", token.c_str(), 1);
      std::vector<char*> argv{const_cast<char*>("/proc/self/exe"),
                              const_cast<char*>("--store-child")};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    out_fd_ = out[0];
  }
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
  }

  pid_t pid() const { return pid_; }
  // One line from the child's stdout (blocks until the child writes it or exits).
  std::string read_line() {
    std::string line;
    char c;
    while (::read(out_fd_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }
  // The exit code, waiting up to timeout; -1 when the child is still running then.
  int wait_exit(std::chrono::nanoseconds timeout) {
    int status = 0;
    const bool exited =
        wait_until([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
    if (!exited) return -1;
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool reaped_ = false;
};

class StoreMultiprocessTest : public ::testing::TestWithParam<int> {};

TEST_P(StoreMultiprocessTest, ClientsInSeveralProcessesRendezvous) {
  const int n = GetParam();
  StoreServer server(loopback_server_options());
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (int i = 0; i < n; ++i) {
    children.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{"rendezvous", std::to_string(i), std::to_string(n)},
        server.address(), kTestToken));
  }
  for (int i = 0; i < n; ++i) EXPECT_EQ(children[i]->wait_exit(50s), kChildOk) << "child " << i;

  auto store = server.connect();
  EXPECT_EQ(store->add("arrived", 0), n);
  const std::string leader = store->get("leader", 1s);
  const int leader_index = std::stoi(leader);
  EXPECT_TRUE(leader_index >= 0 && leader_index < n) << leader;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(store->get(fmt::format("rank/{}", i), 1s), fmt::format("addr-{}", i));
    EXPECT_EQ(store->get(fmt::format("saw/{}", i), 1s), leader) << "child " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Processes, StoreMultiprocessTest, ::testing::Values(1, 3, 8));

TEST(StoreProcessFaultTest, KilledServerGivesPeerLost) {
  ChildProcess server_process({"server"}, "", kTestToken);
  const std::string address = server_process.read_line();
  ASSERT_FALSE(address.empty()) << "the server process printed no address";
  StoreClient client(client_options_for(address));
  client.set("alive", "yes");
  EXPECT_EQ(client.get("alive", 5s), "yes");

  std::string error;
  std::thread waiter([&] {
    try {
      client.get("never", std::chrono::minutes(10));
      error = "returned";
    } catch (const PeerLost& e) {
      error = e.message();
    } catch (const std::exception& e) {
      error = std::string("wrong error: ") + e.what();
    }
  });
  ::kill(server_process.pid(), SIGKILL);
  waiter.join();
  EXPECT_TRUE(contains(error, address)) << error;
  EXPECT_NE(server_process.wait_exit(10s), -1);

  EXPECT_THROW(client.set("k", "v"), PeerLost);
  StoreClientOptions options = client_options_for(address);
  options.connect_timeout = 300ms;
  EXPECT_THROW(StoreClient again(options), CommError);
}

TEST(StoreProcessFaultTest, ProcessWithWrongTokenIsRefused) {
  StoreServer server(loopback_server_options());
  ChildProcess wrong({"expect-refused"}, server.address(), "not-the-job-token");
  EXPECT_EQ(wrong.wait_exit(30s), kChildRefused);
  ChildProcess right({"rendezvous", "0", "1"}, server.address(), kTestToken);
  EXPECT_EQ(right.wait_exit(30s), kChildOk);
  EXPECT_EQ(server.connect()->add("arrived", 0), 1);  // only the right one got in
}

// --- child modes ---------------------------------------------------------------------------

// A worker: announces itself, joins a leader election, waits for everyone, checks values.
int run_rendezvous_child(int index, int count) {
  auto store = store_client_from_env();
  store->add("arrived", 1);
  store->set(fmt::format("rank/{}", index), fmt::format("addr-{}", index));
  const std::string desired = std::to_string(index);
  const std::string leader = store->compare_set("leader", "", desired);
  store->set(fmt::format("saw/{}", index), leader);
  std::vector<std::string> keys, expected;
  for (int i = 0; i < count; ++i) {
    keys.push_back(fmt::format("rank/{}", i));
    expected.push_back(fmt::format("addr-{}", i));
  }
  store->wait(keys, 40s);
  if (store->multi_get(keys, 1s) != expected) {
    std::fprintf(stderr, "child %d: multi_get returned other values\n", index);
    return kChildWrong;
  }
  return kChildOk;
}

// A server: prints its address, serves until killed (or two minutes pass).
int run_server_child() {
  StoreServerOptions options = loopback_server_options();
  options.token = env_string(EnvKnob::kStoreToken);
  StoreServer server(options);
  std::printf("%s\n", server.address().c_str());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::minutes(2));  // the parent kills it long before
  return kChildOk;
}

int run_refused_child() {
  try {
    store_client_from_env()->set("intruder", "1");
    return kChildOk;
  } catch (const CommError& e) {
    return contains(e.message(), "UNAUTHENTICATED") ? kChildRefused : kChildWrong;
  }
}

int run_child(int argc, char** argv) {
  try {
    const std::string mode = argc > 2 ? argv[2] : "";
    if (mode == "rendezvous" && argc == 5) {
      return run_rendezvous_child(std::atoi(argv[3]), std::atoi(argv[4]));
    }
    if (mode == "server") return run_server_child();
    if (mode == "expect-refused") return run_refused_child();
    std::fprintf(stderr, "unknown --store-child mode '%s'\n", mode.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store child failed: %s\n", e.what());
  }
  return kChildWrong;
}

}  // namespace
}  // namespace tessel

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--store-child") == 0) {
    return tessel::run_child(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
