// A running job under a stranger's traffic (loopback only, bounded): eight concurrent 250 MiB
// requests and a 2,000-connection flood, every request with a wrong token, aimed at the job's
// store/rendezvous server while its workers use the store and its agent heartbeats. The job
// must finish with exit 0; the workers' store latency and the server's memory are printed
// (and the memory bounded: a server that read the requests would hold gigabytes).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "child_process.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;

// VmHWM (peak resident memory) of a process, in KiB; -1 when unreadable.
long peak_rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

TEST(HostileLoadTest, JobSurvivesHugeAndFloodingWrongTokenRequests) {
  const std::string dir = testing::make_temp_dir("hostile");
  ChildProcess job({TESSEL_RUN_PATH, "--standalone", "--nproc-per-node", "2", "--log-dir",
                    dir + "/logs", TEST_WORKER_PATH, "store-probe", dir},
                   {}, dir + "/job");
  std::smatch m;
  const std::regex store_line(R"(\] store (127\.0\.0\.1:\d+))");
  ASSERT_TRUE(testing::wait_until(
      [&] {
        const std::string out = job.out();
        return std::regex_search(out, m, store_line);
      },
      30s))
      << job.err();
  const std::string out = job.out();
  std::regex_search(out, m, store_line);
  const std::string target = m[1];
  std::this_thread::sleep_for(1s);  // quiet samples
  const long before_kib = peak_rss_kib(job.pid());
  { std::ofstream(dir + "/attack") << "1"; }
  ChildProcess big({HOSTILE_CLIENT_PATH, "--target", target, "--big", "8", "--big-mib", "250",
                    "--seconds", "20"},
                   {}, dir + "/big");
  EXPECT_EQ(big.wait(60s), 0) << big.out() << big.err();
  ChildProcess flood({HOSTILE_CLIENT_PATH, "--target", target, "--flood", "2000", "--calls",
                      "10:40", "--seconds", "20"},
                     {}, dir + "/flood");
  EXPECT_EQ(flood.wait(90s), 0) << flood.out() << flood.err();
  std::remove((dir + "/attack").c_str());
  const long peak_kib = peak_rss_kib(job.pid());
  std::this_thread::sleep_for(300ms);
  { std::ofstream(dir + "/stop") << "1"; }
  ASSERT_EQ(job.wait(60s), 0) << job.err();
  std::printf("%s%s", big.out().c_str(), flood.out().c_str());
  std::printf("server (tessel-run) peak RSS: %.1f MiB before the attack, %.1f MiB after it\n",
              before_kib / 1024.0, peak_kib / 1024.0);
  int phases = 0;
  const std::regex probe(R"(probe (quiet|attack) n=(\d+) p50=(\d+) p99=(\d+) max=(\d+))");
  const std::string result = job.out();
  for (std::sregex_iterator it(result.begin(), result.end(), probe), end; it != end; ++it) {
    std::printf("worker store set+get, %s: %s samples, p50 %s us, p99 %s us, max %s us\n",
                (*it)[1].str().c_str(), (*it)[2].str().c_str(), (*it)[3].str().c_str(),
                (*it)[4].str().c_str(), (*it)[5].str().c_str());
    EXPECT_GT(std::stoi((*it)[2]), 0) << "no samples " << (*it)[1];
    ++phases;
  }
  EXPECT_EQ(phases, 4) << result;  // two workers, two phases each
  // Bounded memory: the 2 GB the big requests carry never reach the server.
  EXPECT_LT(peak_kib, 512 * 1024) << "server peak RSS " << peak_kib << " KiB";
}

}  // namespace
}  // namespace tessel::launcher
