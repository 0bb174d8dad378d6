// store_load: many store clients in several processes against one StoreServer, beside the
// same operations on an in-process MemoryStore (the raw data structure, no RPC).
//
//   store_load                                   # 4 processes x 500 clients, 5 rounds
//   store_load --processes 8 --clients 1000 --rounds 20 --value-bytes 1024
//   store_load --hostile                         # one client's latency, quiet vs under attack
//
// Every client has its own gRPC channel (its own connection). First every client parks a
// wait on one key and a single set releases them all ("wake": time from that set to each
// client seeing it, measured on the shared monotonic clock); then each client runs rounds of
// set (its own key), get (that key) and wait (that key, present). Reported per op: p50 and
// p99 latency; overall: throughput, and the server process's RSS and thread count.
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <latch>
#include <mutex>
#include <sstream>
#include <thread>

#include "tessel/base/clock.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/store/internal/store_client_channel.h"
#include "tessel/store/internal/store_service.h"
#include "tessel/store/memory_store.h"
#include "tessel/store/store_client.h"
#include "tessel/store/store_server.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;

struct Config {
  int processes = 4;
  int clients = 500;  // per process
  int rounds = 5;
  int value_bytes = 64;
  int timeout_s = 120;
  int solo_ops = 2000;  // sequential ops of one client before the load
};

enum Op { kWake, kSet, kGet, kWait, kOpCount };
constexpr std::array<const char*, kOpCount> kOpNames = {"wake", "set", "get", "wait"};
using Samples = std::array<std::vector<int64_t>, kOpCount>;  // nanoseconds

std::string round_key(int worker, int client, int round) {
  return fmt::format("w{}/c{}/r{}", worker, client, round);
}

// --- a worker process: `clients` clients, each a chain of asynchronous calls ----------------

class Worker;

// One client: its own channel, and one call in flight at a time (the next is issued from the
// previous call's completion, on a gRPC thread).
class LoadClient {
 public:
  LoadClient(Worker& worker, int index, const std::string& address, const std::string& token);
  bool connect(Deadline deadline) {
    return channel_->WaitForConnected(std::chrono::system_clock::now() + deadline.remaining());
  }
  void start();  // parks the wake wait
  Samples& samples() { return samples_; }
  int failures() const { return failures_; }

 private:
  grpc::ClientContext* fresh_context(Nanoseconds timeout);
  void issue_set();
  void issue_get();
  void issue_wait();
  // Records the op's latency (or a failure); false when the chain must stop.
  bool record(Op op, const grpc::Status& status);
  void done();

  Worker& worker_;
  const int index_;
  const std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<storepb::Store::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> context_;
  storepb::SetRequest set_request_;
  storepb::SetResponse set_response_;
  storepb::GetRequest get_request_;
  storepb::GetResponse get_response_;
  int round_ = 0;
  int64_t started_ns_ = 0;
  int failures_ = 0;
  Samples samples_;
};

class Worker {
 public:
  Worker(const Config& config, int index) : config_(config), index_(index) {}

  int run(const std::string& address, const std::string& token) {
    const Deadline deadline = Deadline::after(std::chrono::seconds(config_.timeout_s));
    for (int i = 0; i < config_.clients; ++i) {
      clients_.push_back(std::make_unique<LoadClient>(*this, i, address, token));
      if (!clients_.back()->connect(deadline)) {
        std::fprintf(stderr, "worker %d: client %d could not connect to %s\n", index_, i,
                     address.c_str());
        return 1;
      }
    }
    for (auto& c : clients_) c->start();
    {
      std::unique_lock lock(mutex_);
      if (!finished_.wait_until(lock, deadline.when(), [&] { return done_ == config_.clients; })) {
        std::fprintf(stderr, "worker %d: %d of %d clients finished in time\n", index_, done_,
                     config_.clients);
        return 1;
      }
    }
    // Samples to the parent on stdout: "<op> <n> v1 v2 ...", one line per op.
    int failures = 0;
    for (int op = 0; op < kOpCount; ++op) {
      std::string line = fmt::format("{} ", kOpNames[op]);
      for (auto& c : clients_) {
        for (int64_t v : c->samples()[op]) fmt::format_to(std::back_inserter(line), "{} ", v);
      }
      std::printf("%s\n", line.c_str());
    }
    for (auto& c : clients_) failures += c->failures();
    std::printf("failures %d\n", failures);
    std::fflush(stdout);
    clients_.clear();
    return 0;
  }

  void client_done() {
    std::lock_guard lock(mutex_);
    if (++done_ == config_.clients) finished_.notify_all();
  }
  const Config& config() const { return config_; }
  int index() const { return index_; }

 private:
  const Config config_;
  const int index_;
  std::vector<std::unique_ptr<LoadClient>> clients_;
  std::mutex mutex_;
  std::condition_variable finished_;
  int done_ = 0;
};

LoadClient::LoadClient(Worker& worker, int index, const std::string& address,
                       const std::string& token)
    : worker_(worker), index_(index), token_(token) {
  channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                       internal::store_channel_arguments(StoreClientOptions()));
  stub_ = storepb::Store::NewStub(channel_);
  set_request_.set_value(std::string(static_cast<size_t>(worker.config().value_bytes), 'v'));
}

grpc::ClientContext* LoadClient::fresh_context(Nanoseconds timeout) {
  context_ = std::make_unique<grpc::ClientContext>();
  context_->AddMetadata(internal::kStoreTokenMetadata, token_);
  context_->set_deadline(std::chrono::system_clock::now() + timeout);
  started_ns_ = monotonic_ns();
  return context_.get();
}

bool LoadClient::record(Op op, const grpc::Status& status) {
  if (!status.ok()) {
    if (++failures_ == 1) {
      std::fprintf(stderr, "worker %d client %d: %s failed: %s\n", worker_.index(), index_,
                   kOpNames[op], status.error_message().c_str());
    }
    done();
    return false;
  }
  samples_[op].push_back(monotonic_ns() - started_ns_);
  return true;
}

void LoadClient::start() {
  const Nanoseconds timeout = std::chrono::seconds(worker_.config().timeout_s);
  get_request_.Clear();
  get_request_.add_keys("start");
  get_request_.set_want_values(true);
  get_request_.set_timeout_ns(timeout.count());
  stub_->async()->Get(
      fresh_context(timeout), &get_request_, &get_response_, [this](grpc::Status status) {
        if (!status.ok()) {
          record(kWake, status);
          return;
        }
        // The value is the releasing set's monotonic time (one clock per host).
        samples_[kWake].push_back(monotonic_ns() - std::stoll(get_response_.values(0)));
        issue_set();
      });
}

void LoadClient::issue_set() {
  set_request_.set_key(round_key(worker_.index(), index_, round_));
  stub_->async()->Set(fresh_context(30s), &set_request_, &set_response_,
                      [this](grpc::Status status) {
                        if (record(kSet, status)) issue_get();
                      });
}

void LoadClient::issue_get() {
  get_request_.Clear();
  get_request_.add_keys(set_request_.key());
  get_request_.set_want_values(true);
  get_request_.set_timeout_ns(Nanoseconds(30s).count());
  stub_->async()->Get(fresh_context(30s), &get_request_, &get_response_,
                      [this](grpc::Status status) {
                        if (record(kGet, status)) issue_wait();
                      });
}

void LoadClient::issue_wait() {
  get_request_.set_want_values(false);
  stub_->async()->Get(fresh_context(30s), &get_request_, &get_response_,
                      [this](grpc::Status status) {
                        if (!record(kWait, status)) return;
                        if (++round_ < worker_.config().rounds) {
                          issue_set();
                        } else {
                          done();
                        }
                      });
}

void LoadClient::done() { worker_.client_done(); }

// --- the parent: server, workers, peer, table -----------------------------------------------

struct Summary {
  Samples samples;
  double seconds = 0;  // from the release to the last op
  int failures = 0;
};

int64_t percentile(std::vector<int64_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(i), v.end());
  return v[i];
}

// VmRSS / VmHWM of this process in MiB, and its thread count.
double proc_status_mib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  double kib = -1;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, field, std::strlen(field)) == 0)
      kib = std::atof(line + std::strlen(field) + 1);
  }
  std::fclose(f);
  return kib / 1024.0;
}
int proc_threads() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int n = -1;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "Threads:", 8) == 0) n = std::atoi(line + 8);
  }
  std::fclose(f);
  return n;
}

// Open sockets of this process (the server's connections, one per client channel).
int proc_sockets() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  char target[64];
  while (dirent* entry = ::readdir(dir)) {
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t len = ::readlink(path.c_str(), target, sizeof(target) - 1);
    if (len > 0 && std::strncmp(target, "socket:", 7) == 0) ++n;
  }
  ::closedir(dir);
  return n;
}

struct WorkerProcess {
  pid_t pid = -1;
  int out_fd = -1;
};

WorkerProcess spawn_worker(const Config& config, int index, const std::string& address,
                           const std::string& token) {
  int out[2];
  if (::pipe(out) != 0) throw_system_error("pipe", errno);
  const pid_t pid = ::fork();
  if (pid < 0) throw_system_error("fork", errno);
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    ::setenv("TESSEL_STORE_ADDR", address.c_str(), 1);
    ::setenv("TESSEL_STORE_TOKEN", token.c_str(), 1);  // never on the command line
    const std::vector<std::string> args = {"store_load",
                                           "--worker",
                                           std::to_string(index),
                                           "--clients",
                                           std::to_string(config.clients),
                                           "--rounds",
                                           std::to_string(config.rounds),
                                           "--value-bytes",
                                           std::to_string(config.value_bytes),
                                           "--timeout",
                                           std::to_string(config.timeout_s)};
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  return WorkerProcess{pid, out[0]};
}

std::string read_all(int fd) {
  std::string text;
  char buffer[65536];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
  return text;
}

// The gRPC run: server here, workers in child processes.
// One synchronous round on any Store: set key, get it, wait for it; latencies into s.
void time_round(Store& store, const std::string& key, const std::string& value, Samples& s) {
  int64_t t0 = monotonic_ns();
  store.set(key, value);
  int64_t t1 = monotonic_ns();
  s[kSet].push_back(t1 - t0);
  store.get(key, 30s);
  t0 = monotonic_ns();
  s[kGet].push_back(t0 - t1);
  store.wait({key}, 30s);
  s[kWait].push_back(monotonic_ns() - t0);
}

// One StoreClient alone against the server: the latency of an uncontended call.
Samples run_solo(const std::string& address, const std::string& token, const Config& config,
                 int ops) {
  StoreClientOptions options;
  options.address = address;
  options.token = token;
  StoreClient client(options);
  const std::string value(static_cast<size_t>(config.value_bytes), 'v');
  Samples s;
  for (int i = 0; i < ops; ++i) time_round(client, fmt::format("solo/{}", i), value, s);
  return s;
}

Summary run_grpc(const Config& config, double& rss_idle, double& rss_parked, double& rss_peak,
                 int& threads_parked, int& sockets_parked, Samples& solo) {
  StoreServerOptions options;
  options.address = "127.0.0.1:0";
  StoreServer server(options);
  rss_idle = proc_status_mib("VmRSS:");
  solo = run_solo(server.address(), server.token(), config, config.solo_ops);
  std::vector<WorkerProcess> workers;
  for (int w = 0; w < config.processes; ++w) {
    workers.push_back(spawn_worker(config, w, server.address(), server.token()));
  }
  // Read the workers' output concurrently so no pipe fills.
  std::vector<std::string> outputs(workers.size());
  std::vector<std::thread> readers;
  for (size_t w = 0; w < workers.size(); ++w) {
    readers.emplace_back([&, w] { outputs[w] = read_all(workers[w].out_fd); });
  }
  const size_t total = static_cast<size_t>(config.processes) * config.clients;
  const Deadline deadline = Deadline::after(std::chrono::seconds(config.timeout_s));
  while (server.stats().waiters < total && !deadline.expired()) {
    std::this_thread::sleep_for(5ms);
  }
  Summary summary;
  if (server.stats().waiters < total) {
    std::fprintf(stderr, "only %zu of %zu clients parked their wait in time\n",
                 server.stats().waiters, total);
    summary.failures = 1;
  }
  rss_parked = proc_status_mib("VmRSS:");
  threads_parked = proc_threads();
  sockets_parked = proc_sockets();
  const Stopwatch elapsed;
  server.connect()->set("start", std::to_string(monotonic_ns()));
  for (auto& t : readers) t.join();
  summary.seconds = elapsed.elapsed_seconds();
  for (auto& w : workers) {
    int status = 0;
    ::waitpid(w.pid, &status, 0);
    ::close(w.out_fd);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++summary.failures;
  }
  rss_peak = proc_status_mib("VmHWM:");
  for (const auto& out : outputs) {
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string name;
      words >> name;
      if (name == "failures") {
        int n = 0;
        words >> n;
        summary.failures += n;
        continue;
      }
      for (int op = 0; op < kOpCount; ++op) {
        if (name != kOpNames[op]) continue;
        int64_t v;
        while (words >> v) summary.samples[op].push_back(v);
      }
    }
  }
  return summary;
}

// The peer: the same ops on a MemoryStore, called directly. The wake uses one thread per
// client (a MemoryStore wait blocks its caller); the rounds run on `threads` threads.
Summary run_memory(const Config& config, int threads) {
  MemoryStore store;
  const int total = config.processes * config.clients;
  Summary summary;
  {
    std::vector<std::thread> waiters;
    std::vector<int64_t> wake(static_cast<size_t>(total));
    std::latch started(total);
    for (int i = 0; i < total; ++i) {
      waiters.emplace_back([&, i] {
        started.count_down();
        const int64_t set_at = std::stoll(store.get("start", 120s));
        wake[static_cast<size_t>(i)] = monotonic_ns() - set_at;
      });
    }
    // Set once every thread runs (a few may not have reached their wait yet).
    started.wait();
    store.set("start", std::to_string(monotonic_ns()));
    for (auto& t : waiters) t.join();
    summary.samples[kWake] = std::move(wake);
  }
  const std::string value(static_cast<size_t>(config.value_bytes), 'v');
  std::vector<Samples> per_thread(static_cast<size_t>(threads));
  const Stopwatch elapsed;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      Samples& s = per_thread[static_cast<size_t>(t)];
      for (int round = 0; round < config.rounds; ++round) {
        for (int c = t; c < total; c += threads) {
          time_round(store, round_key(c / config.clients, c % config.clients, round), value, s);
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  summary.seconds = elapsed.elapsed_seconds();
  for (auto& s : per_thread) {
    for (int op = kSet; op < kOpCount; ++op) {
      summary.samples[op].insert(summary.samples[op].end(), s[op].begin(), s[op].end());
    }
  }
  return summary;
}

std::string us(int64_t ns) { return fmt::format("{:.1f}", static_cast<double>(ns) / 1000.0); }

// set + get round trips of one client until `until` says stop; nanoseconds each.
std::vector<int64_t> probe_latency(StoreClient& client, const std::function<bool()>& until) {
  std::vector<int64_t> samples;
  for (long i = 0; !until(); ++i) {
    const auto t0 = SteadyClock::now();
    client.set("probe", std::to_string(i));
    client.get("probe", 30s);
    samples.push_back((SteadyClock::now() - t0).count());
    std::this_thread::sleep_for(1ms);
  }
  return samples;
}

int run_hostile() {
  StoreServer server(StoreServerOptions{});
  StoreClientOptions options;
  options.address = server.address();
  options.token = server.token();
  StoreClient client(options);
  const double rss_before = proc_status_mib("VmHWM:");
  const Deadline quiet_end = Deadline::after(3s);
  std::vector<int64_t> quiet = probe_latency(client, [&] { return quiet_end.expired(); });
  // The attack runs in its own process; this one keeps measuring until it exits.
  const pid_t attacker = fork();
  if (attacker == 0) {
    const std::string target = server.address();
    execl(HOSTILE_CLIENT_PATH, HOSTILE_CLIENT_PATH, "--target", target.c_str(), "--big", "8",
          "--big-mib", "250", "--flood", "2000", "--calls", "10:40", "--seconds", "20", nullptr);
    _exit(127);
  }
  int status = 0;
  std::vector<int64_t> attack =
      probe_latency(client, [&] { return waitpid(attacker, &status, WNOHANG) == attacker; });
  const double rss_after = proc_status_mib("VmHWM:");
  std::printf("\nstore_load --hostile: one client's set+get round trip, same server, same run\n");
  std::printf("%-34s %8s %10s %10s %10s\n", "phase", "samples", "p50 us", "p99 us", "max us");
  for (auto [name, v] :
       {std::pair{"alone (3 s)", &quiet}, {"under hostile load (until it ends)", &attack}}) {
    const int64_t max = v->empty() ? 0 : *std::max_element(v->begin(), v->end());
    std::printf("%-34s %8zu %10s %10s %10s\n", name, v->size(), us(percentile(*v, 0.5)).c_str(),
                us(percentile(*v, 0.99)).c_str(), us(max).c_str());
  }
  std::printf(
      "peak RSS of this process (server + the one client): %.1f MiB before the attack, "
      "%.1f MiB after; attacker exit status %d\n",
      rss_before, rss_after, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}

int run_parent(const Config& config, int peer_threads) {
  const int total = config.processes * config.clients;
  std::printf(
      "store_load: %d processes x %d clients = %d clients (one channel each), %d rounds "
      "of set/get/wait, %d-byte values\n",
      config.processes, config.clients, total, config.rounds, config.value_bytes);
  double rss_idle = 0, rss_parked = 0, rss_peak = 0;
  int threads_parked = 0, sockets_parked = 0;
  Samples solo;
  Summary grpc =
      run_grpc(config, rss_idle, rss_parked, rss_peak, threads_parked, sockets_parked, solo);
  Summary memory = run_memory(config, peer_threads);

  std::printf("\none client alone (StoreClient, %d sequential ops each), vs MemoryStore:\n",
              config.solo_ops);
  std::printf("%-6s %8s | %12s %12s | %12s %12s | %9s\n", "op", "samples", "grpc p50 us",
              "grpc p99 us", "memory p50", "memory p99", "p50 ratio");
  for (int op = kSet; op < kOpCount; ++op) {
    auto& g = solo[op];
    auto& m = memory.samples[op];
    const int64_t g50 = percentile(g, 0.50), m50 = percentile(m, 0.50);
    std::printf("%-6s %8zu | %12s %12s | %12s %12s | %8.0fx\n", kOpNames[op], g.size(),
                us(g50).c_str(), us(percentile(g, 0.99)).c_str(), us(m50).c_str(),
                us(percentile(m, 0.99)).c_str(),
                m50 > 0 ? static_cast<double>(g50) / static_cast<double>(m50) : 0.0);
  }
  std::printf(
      "\nall %d clients at once (closed loop: latency includes queueing behind the "
      "other clients):\n",
      total);
  std::printf("%-6s %8s | %12s %12s | %12s %12s | %9s\n", "op", "samples", "grpc p50 us",
              "grpc p99 us", "memory p50", "memory p99", "p50 ratio");
  for (int op = 0; op < kOpCount; ++op) {
    auto& g = grpc.samples[op];
    auto& m = memory.samples[op];
    const int64_t g50 = percentile(g, 0.50), g99 = percentile(g, 0.99);
    const int64_t m50 = percentile(m, 0.50), m99 = percentile(m, 0.99);
    std::printf("%-6s %8zu | %12s %12s | %12s %12s | %8.0fx\n", kOpNames[op], g.size(),
                us(g50).c_str(), us(g99).c_str(), us(m50).c_str(), us(m99).c_str(),
                m50 > 0 ? static_cast<double>(g50) / static_cast<double>(m50) : 0.0);
  }
  const double ops = 3.0 * total * config.rounds;
  const double grpc_rate = ops / grpc.seconds, memory_rate = ops / memory.seconds;
  std::printf(
      "\nthroughput (set+get+wait): grpc %.0f ops/s (incl. the wake), memory %.0f ops/s "
      "on %d threads; memory/grpc %.0fx\n",
      grpc_rate, memory_rate, peer_threads, memory_rate / grpc_rate);
  std::printf(
      "server process: RSS %.1f MiB idle, %.1f MiB with %d waits parked, peak %.1f MiB; "
      "%d threads and %d open sockets with the waits parked\n",
      rss_idle, rss_parked, total, rss_peak, threads_parked, sockets_parked);
  std::printf("(memory peak includes the peer's %d wake threads, run after the grpc figures)\n",
              total);
  if (grpc.failures > 0) {
    std::printf("FAILURES: %d (see stderr)\n", grpc.failures);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tessel

int main(int argc, char** argv) {
  tessel::Config config;
  int worker = -1;
  int peer_threads = 4;
  CLI::App app("store_load: the gRPC store under many clients, beside an in-process MemoryStore");
  app.add_option("--processes", config.processes, "client processes")->check(CLI::Range(1, 64));
  app.add_option("--clients", config.clients, "clients (channels) per process")
      ->check(CLI::Range(1, 5000));
  app.add_option("--rounds", config.rounds, "set/get/wait rounds per client")
      ->check(CLI::Range(1, 100000));
  app.add_option("--value-bytes", config.value_bytes, "bytes per value")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--timeout", config.timeout_s, "seconds before a worker gives up")
      ->check(CLI::Range(1, 3600));
  app.add_option("--peer-threads", peer_threads, "threads for the MemoryStore rounds")
      ->check(CLI::Range(1, 256));
  app.add_option("--solo-ops", config.solo_ops, "sequential ops of the lone client")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--worker", worker, "internal: run as client process N")->group("");
  bool hostile = false;
  app.add_flag("--hostile", hostile,
               "one client's latency alone and under wrong-token load (hostile_client)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (hostile) return tessel::run_hostile();
    if (worker >= 0) {
      const auto options = tessel::store_client_options_from_env();
      return tessel::Worker(config, worker).run(options.address, options.token);
    }
    return tessel::run_parent(config, peer_threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_load: %s\n", e.what());
    return 1;
  }
}
