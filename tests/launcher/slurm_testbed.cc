#include "slurm_testbed.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>

namespace tessel::launcher::testing {

using namespace std::chrono_literals;

namespace {

std::string chomp(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

std::unique_ptr<SlurmTestbed> SlurmTestbed::start(const std::string& script, int nodes,
                                                  const std::string& dir, std::string* why,
                                                  bool* skipped) {
  *skipped = false;
  ChildProcess check({script, "check"}, {}, dir + "/testbed-check");
  if (check.wait(30s) != 0) {
    *why = chomp(check.out() + check.err());
    *skipped = true;
    return nullptr;
  }
  std::unique_ptr<SlurmTestbed> bed(new SlurmTestbed(script, dir));
  bed->cluster_ = dir + "/cluster";
  bed->conf_ = bed->cluster_ + "/slurm.conf";
  // The test bed goes with this process, also when it is killed (a ctest timeout).
  ChildProcess start({script, "start", bed->cluster_, std::to_string(nodes)},
                     {"SLURM_TESTBED_OWNER=" + std::to_string(getpid())}, dir + "/testbed-start");
  if (start.wait(120s) != 0) {
    *why = "slurm-testbed.sh start failed: " + start.out() + start.err();
    return nullptr;  // the destructor stops what did start
  }
  return bed;
}

SlurmTestbed::~SlurmTestbed() {
  const std::string prefix = chomp(read_file(cluster_ + "/prefix"));
  ChildProcess stop({script_, "stop", cluster_}, {}, dir_ + "/testbed-stop");
  EXPECT_EQ(stop.wait(60s), 0) << stop.out() << stop.err();
  // Nothing of the cluster is left: no daemon, step or job process (they all carry its
  // SLURM_CONF), and no namespace.
  const auto left = pids_with_env("SLURM_CONF=" + conf_);
  EXPECT_TRUE(left.empty()) << left.size() << " processes of the test bed left, the first "
                            << describe_process(left.front());
  ChildProcess list({"ip", "netns", "list"}, {}, dir_ + "/testbed-netns");
  list.wait(10s);
  EXPECT_TRUE(prefix.empty() || list.out().find(prefix) == std::string::npos) << list.out();
}

void SlurmTestbed::set_path(const std::vector<std::string>& dirs) {
  path_.clear();
  for (const auto& d : dirs) path_ += d + ":";
}

std::unique_ptr<ChildProcess> SlurmTestbed::start_login(const std::vector<std::string>& cmd,
                                                        const std::string& tag,
                                                        const std::vector<std::string>& env) const {
  const char* path = std::getenv("PATH");
  std::vector<std::string> argv{script_, "login", cluster_, "env",
                                "PATH=" + path_ + (path ? path : "/usr/bin:/bin")};
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  return std::make_unique<ChildProcess>(argv, env, dir_ + "/" + tag);
}

std::unique_ptr<ChildProcess> SlurmTestbed::login(const std::vector<std::string>& cmd,
                                                  const std::string& tag,
                                                  const std::vector<std::string>& env,
                                                  std::chrono::seconds timeout) const {
  auto p = start_login(cmd, tag, env);
  EXPECT_TRUE(p->wait(timeout).has_value()) << tag << " did not end in " << timeout.count() << " s";
  return p;
}

int SlurmTestbed::sbatch(std::vector<std::string> args, const std::string& tag,
                         const std::vector<std::string>& env, std::chrono::seconds timeout) const {
  args.insert(args.begin(), {"sbatch", "--parsable"});
  auto submit = login(args, tag + "-submit", env, 30s);
  const std::string id = submit->out().substr(0, submit->out().find_first_of(";\n"));
  EXPECT_FALSE(id.empty()) << submit->err();
  if (id.empty()) return -1;
  const std::regex state(R"(JobState=(\S+).* ExitCode=(\d+):(\d+))");
  std::smatch m;
  std::string text;
  const bool ended = wait_until(
      [&] {
        text = login({"scontrol", "show", "job", "-o", id}, tag + "-state", {}, 30s)->out();
        if (!std::regex_search(text, m, state)) return false;
        const std::string s = m[1];
        return s != "PENDING" && s != "CONFIGURING" && s != "RUNNING" && s != "COMPLETING";
      },
      timeout);
  EXPECT_TRUE(ended) << "job " << id << " did not end: " << text;
  if (!ended) return -1;
  return std::stoi(m[3]) != 0 ? 128 + std::stoi(m[3]) : std::stoi(m[2]);
}

}  // namespace tessel::launcher::testing
