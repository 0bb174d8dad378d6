// bench_rendezvous: how fast N agents join one tessel-run rendezvous and pass a barrier, and
// how long a job takes from a worker's death to all workers running again.
//
//   bench_rendezvous [--nodes 100,1000] [--big] [--procs 4] [--restart-workers 4]
//
// Agents are simulated by --procs processes, each holding N/procs gRPC channels with their own
// TCP connection (GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL). Each agent sends Join (held until the
// round forms), then ReportDone and WaitEvent (answered when every agent is done: a barrier).
// The peer figure is a plain authenticated unary RPC from every agent over the same channels
// (the floor any rendezvous over gRPC pays). The server runs in this process, so its CPU time
// and RSS are this process's.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tessel/launcher/proto/rendezvous.grpc.pb.h"
#include "tessel/launcher/rendezvous_client.h"
#include "tessel/launcher/rendezvous_server.h"

namespace {

using namespace tessel::launcher;
using Clock = std::chrono::steady_clock;
constexpr char kToken[] = "bench-token";

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Counts async completions; wait() blocks until `n` arrived or 120 s passed.
class Latch {
 public:
  void arrive() {
    std::lock_guard l(mu_);
    ++count_;
    cv_.notify_all();
  }
  bool wait(int n) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, std::chrono::seconds(120), [&] { return count_ >= n; });
  }
  void reset() {
    std::lock_guard l(mu_);
    count_ = 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
};

std::unique_ptr<grpc::ClientContext> context() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->AddMetadata("x-tessel-token", kToken);
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  return c;
}

// One agent process: `count` simulated nodes with ids offset.. offset+count-1. Prints
// "ping_ms join_ms barrier_ms" then one join latency (us) per node.
int agent_main(const std::string& address, int count, int offset) {
  // One TCP connection per agent (local subchannel pool), as tessel-run's agents configure.
  grpc::ChannelArguments args = control_plane_channel_args(/*private_connection=*/true);
  std::vector<std::unique_ptr<proto::Rendezvous::Stub>> stubs;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    channels.push_back(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(proto::Rendezvous::NewStub(channels.back()));
  }
  for (auto& c : channels) {
    if (!c->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(60))) {
      std::fprintf(stderr, "agent: channel to %s did not connect\n", address.c_str());
      return 1;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  char go = 0;
  if (::read(0, &go, 1) != 1) return 1;

  std::vector<std::unique_ptr<grpc::ClientContext>> ctx(static_cast<size_t>(count));
  Latch latch;
  // Peer: one plain authenticated unary RPC per agent (refused as not a member: a full trip).
  std::vector<proto::HeartbeatRequest> hb(static_cast<size_t>(count));
  std::vector<proto::HeartbeatResponse> hbr(static_cast<size_t>(count));
  auto t = Clock::now();
  for (int i = 0; i < count; ++i) {
    ctx[i] = context();
    hb[i].set_node_id("ping");
    stubs[i]->async()->Heartbeat(ctx[i].get(), &hb[i], &hbr[i],
                                 [&](grpc::Status) { latch.arrive(); });
  }
  latch.wait(count);
  const double ping_ms = ms_since(t);

  latch.reset();
  std::vector<proto::JoinRequest> join(static_cast<size_t>(count));
  std::vector<proto::JoinResponse> joined(static_cast<size_t>(count));
  std::vector<double> latency_us(static_cast<size_t>(count));
  std::atomic<int> failed{0};
  t = Clock::now();
  for (int i = 0; i < count; ++i) {
    ctx[i] = context();
    join[i].set_node_id("node" + std::to_string(offset + i));
    join[i].set_host("bench");
    join[i].set_nproc(1);
    join[i].set_requested_rank(-1);
    const auto start = Clock::now();
    stubs[i]->async()->Join(ctx[i].get(), &join[i], &joined[i], [&, i, start](grpc::Status s) {
      latency_us[i] = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (!s.ok()) ++failed;
      latch.arrive();
    });
  }
  latch.wait(count);
  const double join_ms = ms_since(t);

  // Barrier: everyone reports done, then waits for the job's SUCCEEDED event.
  latch.reset();
  std::vector<proto::DoneRequest> done(static_cast<size_t>(count));
  std::vector<proto::DoneResponse> done_r(static_cast<size_t>(count));
  std::vector<proto::WaitEventRequest> wait(static_cast<size_t>(count));
  std::vector<proto::JobEvent> events(static_cast<size_t>(count));
  std::vector<std::unique_ptr<grpc::ClientContext>> ctx2(static_cast<size_t>(count));
  t = Clock::now();
  for (int i = 0; i < count; ++i) {
    ctx[i] = context();
    ctx2[i] = context();
    done[i].set_node_id(join[i].node_id());
    done[i].set_round(joined[i].round());
    wait[i].set_node_id(join[i].node_id());
    wait[i].set_round(joined[i].round());
    stubs[i]->async()->WaitEvent(ctx2[i].get(), &wait[i], &events[i], [&](grpc::Status s) {
      if (!s.ok()) ++failed;
      latch.arrive();
    });
    stubs[i]->async()->ReportDone(ctx[i].get(), &done[i], &done_r[i], [&](grpc::Status s) {
      if (!s.ok()) ++failed;
      latch.arrive();
    });
  }
  latch.wait(2 * count);
  const double barrier_ms = ms_since(t);
  int not_succeeded = 0;
  for (auto& e : events) not_succeeded += e.kind() == proto::JobEvent::SUCCEEDED ? 0 : 1;
  std::printf("%.3f %.3f %.3f %d\n", ping_ms, join_ms, barrier_ms, failed.load() + not_succeeded);
  for (double l : latency_us) std::printf("%.1f\n", l);
  return 0;
}

struct Agent {
  pid_t pid;
  int to, from;
};

Agent spawn_agent(const std::string& self, const std::string& address, int count, int offset) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) std::abort();
  const std::string c = std::to_string(count), o = std::to_string(offset);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    execl(self.c_str(), self.c_str(), "--agent", address.c_str(), c.c_str(), o.c_str(), nullptr);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  return {pid, in[1], out[0]};
}

std::string read_all(int fd) {
  std::string s;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) s.append(buf, static_cast<size_t>(n));
  return s;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

long status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::atol(line.c_str() + std::strlen(key));
  }
  return -1;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void bench_rendezvous(const std::string& self, int n, int procs) {
  RendezvousServerOptions o;
  o.bind_address = "127.0.0.1:0";
  o.token = kToken;
  o.min_nodes = o.max_nodes = n;
  o.heartbeat_interval = std::chrono::hours(1);  // simulated agents do not heartbeat
  o.poll_limit = std::chrono::minutes(5);
  RendezvousServer server(o);
  std::vector<Agent> agents;
  for (int p = 0, offset = 0; p < procs; ++p) {
    const int count = n / procs + (p < n % procs ? 1 : 0);
    if (count == 0) continue;
    agents.push_back(spawn_agent(self, server.address(), count, offset));
    offset += count;
  }
  const auto connect_start = Clock::now();
  for (auto& a : agents) {  // "ready\n" once every channel is connected
    char buf[6];
    if (::read(a.from, buf, 6) != 6) std::fprintf(stderr, "agent %d failed to start\n", a.pid);
  }
  const double connect_ms = ms_since(connect_start);
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  for (auto& a : agents) (void)!::write(a.to, "g", 1);
  double ping = 0, join = 0, barrier = 0;
  int errors = 0;
  std::vector<double> lat;
  for (auto& a : agents) {
    std::istringstream in(read_all(a.from));
    double p, j, b;
    int e;
    in >> p >> j >> b >> e;
    ping = std::max(ping, p), join = std::max(join, j), barrier = std::max(barrier, b);
    errors += e;
    double l;
    while (in >> l) lat.push_back(l / 1000.0);
    waitpid(a.pid, nullptr, 0);
    close(a.to);
    close(a.from);
  }
  const double total_ms = ms_since(t0);
  const double cpu = cpu_seconds() - cpu0;
  std::printf("%7d %6d %10.0f %10.1f %10.1f %10.1f %10.1f %10.1f %8.1f %9.2f %8ld %8ld %6d\n", n,
              procs, connect_ms, ping, join, percentile(lat, 0.5), percentile(lat, 0.99), barrier,
              total_ms, cpu, status_kb("VmRSS:") / 1024, status_kb("VmHWM:") / 1024, errors);
  std::fflush(stdout);
}

// ---- restart latency: a real tessel-run job ----------------------------------------------

long long monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Worker: attempt 0 rank 0 records its death time and exits 1; attempt 1 workers record when
// they started and exit 0.
int worker_main(const std::string& dir) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int attempt = std::atoi(std::getenv("TORCHELASTIC_RESTART_COUNT"));
  std::ofstream(dir + "/a" + std::to_string(attempt) + "_r" + std::to_string(rank))
      << monotonic_ns() << "\n";
  if (attempt == 0 && rank == 0) {
    // Wait until every rank of attempt 0 runs, then die.
    const int world = std::atoi(std::getenv("WORLD_SIZE"));
    for (int r = 0; r < world; ++r) {
      while (access((dir + "/a0_r" + std::to_string(r)).c_str(), F_OK) != 0) usleep(1000);
    }
    std::ofstream(dir + "/death") << monotonic_ns() << "\n";
    return 1;
  }
  if (attempt == 0) pause();  // killed by the launcher
  return 0;
}

long long read_ns(const std::string& path) {
  std::ifstream in(path);
  long long v = -1;
  in >> v;
  return v;
}

double run_restart(const std::string& self, int workers, bool through_launcher) {
  char templ[] = "/tmp/bench-restart-XXXXXX";
  const std::string dir = mkdtemp(templ);
  const std::string n = std::to_string(workers);
  if (through_launcher) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      execl(TESSEL_RUN_PATH, TESSEL_RUN_PATH, "--standalone", "--nproc-per-node", n.c_str(),
            "--max-restarts", "1", "--log-dir", (dir + "/logs").c_str(), self.c_str(), "--worker",
            dir.c_str(), nullptr);
      _exit(127);
    }
    waitpid(pid, nullptr, 0);
  } else {
    // Peer: the bare minimum a supervisor does — notice one death (waitpid), kill the rest,
    // fork+exec the next attempt. No rendezvous, no logs, no control plane.
    std::vector<pid_t> pids;
    auto spawn = [&](int attempt) {
      pids.clear();
      for (int r = 0; r < workers; ++r) {
        std::vector<std::string> env = {"RANK=" + std::to_string(r), "WORLD_SIZE=" + n,
                                        "TORCHELASTIC_RESTART_COUNT=" + std::to_string(attempt)};
        std::vector<char*> envp;
        for (auto& e : env) envp.push_back(e.data());
        envp.push_back(nullptr);
        std::string worker_flag = "--worker", d = dir, exe = self;
        char* wargv[] = {exe.data(), worker_flag.data(), d.data(), nullptr};
        pid_t p = -1;
        posix_spawn(&p, self.c_str(), nullptr, nullptr, wargv, envp.data());
        pids.push_back(p);
      }
    };
    spawn(0);
    waitpid(pids[0], nullptr, 0);
    for (size_t i = 1; i < pids.size(); ++i) kill(pids[i], SIGKILL), waitpid(pids[i], nullptr, 0);
    spawn(1);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
  }
  const long long death = read_ns(dir + "/death");
  long long last_start = 0;
  for (int r = 0; r < workers; ++r) {
    last_start = std::max(last_start, read_ns(dir + "/a1_r" + std::to_string(r)));
  }
  std::system(("rm -rf " + dir).c_str());
  return (last_start - death) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  std::string self = "/proc/self/exe";
  char buf[4096];
  const ssize_t len = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (len > 0) self.assign(buf, static_cast<size_t>(len));
  if (argc >= 5 && std::string(argv[1]) == "--agent") {
    return agent_main(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  }
  if (argc >= 3 && std::string(argv[1]) == "--worker") return worker_main(argv[2]);

  std::vector<int> sizes = {100, 1000};
  int procs = 4, restart_workers = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--big") sizes.push_back(10000);
    if (a == "--procs" && i + 1 < argc) procs = std::atoi(argv[++i]);
    if (a == "--restart-workers" && i + 1 < argc) restart_workers = std::atoi(argv[++i]);
    if (a == "--nodes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream s(argv[++i]);
      std::string item;
      while (std::getline(s, item, ',')) sizes.push_back(std::stoi(item));
    }
  }
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;  // 2 fds per agent connection on this host
  setrlimit(RLIMIT_NOFILE, &nofile);
  signal(SIGPIPE, SIG_IGN);

  std::printf("rendezvous: N agents (own TCP connection each) join one round, then a barrier\n");
  std::printf("peer = one authenticated unary RPC per agent over the same channels\n\n");
  std::printf("%7s %6s %10s %10s %10s %10s %10s %10s %8s %9s %8s %8s %6s\n", "N", "procs",
              "connect", "peer_rpc", "join_all", "join_p50", "join_p99", "barrier", "total",
              "srv_cpu_s", "rss_MB", "hwm_MB", "errors");
  std::printf("%7s %6s %10s %10s %10s %10s %10s %10s %8s\n", "", "", "ms", "ms", "ms", "ms", "ms",
              "ms", "ms");
  for (int n : sizes) bench_rendezvous(self, n, procs);

  std::printf("\nrestart: worker death -> all %d workers running again (median of 5)\n",
              restart_workers);
  std::vector<double> ours, peer;
  for (int i = 0; i < 5; ++i) {
    ours.push_back(run_restart(self, restart_workers, true));
    peer.push_back(run_restart(self, restart_workers, false));
  }
  const double o = percentile(ours, 0.5), p = percentile(peer, 0.5);
  std::printf("%-44s %10.1f ms\n", "tessel-run --standalone --max-restarts 1", o);
  std::printf("%-44s %10.1f ms\n", "peer: bare waitpid + kill + fork/exec", p);
  std::printf("%-44s %10.2f x\n", "ratio (ours / peer)", p > 0 ? o / p : 0.0);
  return 0;
}
