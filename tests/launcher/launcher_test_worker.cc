// The worker program tessel-run starts in the launcher tests. Modes (argv[1]):
//   env                      print every environment variable as "ENV NAME=value", exit 0
//   fail RANK CODE [DIR]     rank RANK exits with CODE at once; others sleep until killed and,
//                            with DIR, record in DIR/stopped_<rank> when SIGTERM reached them
//   sleep                    sleep until killed
//   await FILE               print the environment, then exit 0 once FILE exists
//   grandchild DIR           fork a child that leaves the process group (setsid) and sleeps;
//                            record both pids in DIR/pids_<rank>, then sleep
//   lines N                  print N long numbered lines to stdout, exit 0
//   crash                    exit 1 at once (a crash loop)
//   signals DIR              record SIGUSR1 in DIR/usr1_<rank>; ignore SIGINT and SIGTERM
//                            (recording DIR/int_<rank>); DIR/ready_<rank> once handlers are set
//   first-attempt-fails R   on attempt 0 rank R exits 1 (R = -1: nobody) and the others sleep;
//                            on later attempts print "attempt A world W rank R" and exit 0
//   all_reduce               join the job's Gloo world through the job's store (the launcher's
//                            TESSEL_STORE_ADDR + token), all_reduce rank+1 and print
//                            "all_reduce rank R of W sum S"; exit 1 when S is not W(W+1)/2
//   ring                     all_reduce as above, then print "RING PATH EXISTS" (its flight-
//                            recorder ring file, 1 when it exists), barrier, exit 0
//   store-probe DIR          set + get of its own key in a loop until DIR/stop exists; each
//                            sample counts as "attack" while DIR/attack exists, else "quiet";
//                            prints "store ADDR" first and "probe PHASE n=N p50=US p99=US
//                            max=US" per phase at the end; exit 1 on any store error
//   error-file RANK          rank RANK writes a torchrun-style TORCHELASTIC_ERROR_FILE and
//                            exits 1; the others sleep
//   hang R                   fault hang R: after one all_reduce rank R stops taking part (stays
//                            alive) and the others' next all_reduce times out: they exit 124,
//                            the launcher's collective-timeout status
//   mesh-skip R              a 2x2 (dp, tp) mesh over a Gloo world with a 2 s timeout, four
//                            steps of a tp then a dp all_reduce; rank R leaves out its tp
//                            all_reduce in step 2, then a world all_reduce to end. Exit
//                            124 on a timeout, 1 on another error
//   fault KIND R             Gloo world with a 2 s timeout, one all_reduce, then rank R: stays
//                            (KIND hang), dies of SIGSEGV (crash) or SIGKILL (kill), or exits
//                            0 (exit); the
//                            others' next all_reduce fails: exit 124 on a timeout, 1 otherwise
//   train DIR STEPS EVERY HANG_RANK HANG_STEP TIMEOUT_S PACE_MS
//                            data-parallel least squares on a fixed global stream (12 samples a
//                            step, split over the world), one all_reduce a step (Gloo, TIMEOUT_S
//                            collective timeout), each step at least PACE_MS long. Rank 0
//                            commits DIR/ckpt/step_<N> (tmp + rename) every EVERY steps; every
//                            attempt resumes from the latest. On attempt 0 rank HANG_RANK stops
//                            taking part at step HANG_STEP ("hanging at step S time_ns T", then
//                            alive) and the others time out (124). Prints "resumed from step S
//                            world W attempt A" and "step S loss L world W attempt A time_ns T"
//                            (T: CLOCK_REALTIME ns)
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/init.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/store/store_client.h"

extern char** environ;

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

long long monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

std::string g_stop_file;
std::string g_dir;
int g_rank = -1;

void touch(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f) std::fclose(f);
}

void on_usr1(int) { touch(g_dir + "/usr1_" + std::to_string(g_rank)); }
void on_int(int) { touch(g_dir + "/int_" + std::to_string(g_rank)); }

void on_term(int) {
  if (!g_stop_file.empty()) {
    FILE* f = std::fopen(g_stop_file.c_str(), "w");
    if (f) {
      std::fprintf(f, "%lld\n", monotonic_ns());
      std::fclose(f);
    }
  }
  _exit(143);
}

[[noreturn]] void sleep_forever() {
  for (;;) pause();
}

long long realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// The "train" mode (see the top of the file).
constexpr int kFeatures = 4;
constexpr int kGlobalBatch = 12;  // divisible by every world size the tests use (4, 6)

struct Checkpoint {
  int step = 0;
  std::vector<float> w = std::vector<float>(kFeatures, 0.0f);
};

// The latest committed checkpoint in DIR/ckpt (step 0 and zeros when none).
Checkpoint latest_checkpoint(const std::string& dir) {
  Checkpoint best;
  DIR* d = opendir((dir + "/ckpt").c_str());
  if (d == nullptr) return best;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("step_", 0) != 0 || name.find('.') != std::string::npos) continue;
    Checkpoint c;
    c.step = std::atoi(name.c_str() + 5);
    if (c.step <= best.step) continue;
    FILE* f = std::fopen((dir + "/ckpt/" + name).c_str(), "r");
    if (f == nullptr) continue;
    bool ok = true;
    for (float& v : c.w) ok = ok && std::fscanf(f, "%a", &v) == 1;
    std::fclose(f);
    if (ok) best = c;
  }
  closedir(d);
  return best;
}

void commit_checkpoint(const std::string& dir, const Checkpoint& c) {
  mkdir((dir + "/ckpt").c_str(), 0755);
  const std::string path = dir + "/ckpt/step_" + std::to_string(c.step);
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  for (float v : c.w) std::fprintf(f, "%a\n", static_cast<double>(v));
  std::fflush(f);
  fsync(fileno(f));
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

// Sample i of the global stream: features in -2..2 and a target from fixed weights plus noise.
void sample(long long i, float* x, float* y) {
  const float truth[kFeatures] = {1.0f, -2.0f, 3.0f, 0.5f};
  *y = 0.1f * static_cast<float>(i % 3 - 1);
  for (int j = 0; j < kFeatures; ++j) {
    x[j] = static_cast<float>((i * 7 + j * 3 + i / 5) % 5 - 2);
    *y += truth[j] * x[j];
  }
}

int train(char** argv) {
  const std::string dir = argv[2];
  const int steps = std::atoi(argv[3]), every = std::atoi(argv[4]);
  const int hang_rank = std::atoi(argv[5]), hang_step = std::atoi(argv[6]);
  const int timeout_s = std::atoi(argv[7]), pace_ms = std::atoi(argv[8]);
  const int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  const int attempt = env_int("TORCHELASTIC_RESTART_COUNT");
  Checkpoint c = latest_checkpoint(dir);  // before any rank can commit a newer one
  try {
    tessel::InitOptions options;
    options.backend = "gloo";
    options.timeout = std::chrono::seconds(timeout_s);
    auto pg = tessel::init_process_group(options);
    if (c.step > 0) {
      std::printf("resumed from step %d world %d attempt %d\n", c.step, world, attempt);
    }
    const int per_rank = kGlobalBatch / world;
    for (int step = c.step; step < steps; ++step) {
      const long long started = monotonic_ns();
      tessel::fr::FlightRecorder::global().set_step(step);
      if (attempt == 0 && rank == hang_rank && step == hang_step) {
        std::printf("hanging at step %d time_ns %lld\n", step, realtime_ns());
        std::fflush(stdout);
        sleep_forever();
      }
      std::vector<float> acc(kFeatures + 1, 0.0f);  // gradient sums, then the loss sum
      for (int k = 0; k < per_rank; ++k) {
        float x[kFeatures], y;
        sample(static_cast<long long>(step) * kGlobalBatch + rank * per_rank + k, x, &y);
        float err = -y;
        for (int j = 0; j < kFeatures; ++j) err += c.w[static_cast<size_t>(j)] * x[j];
        for (int j = 0; j < kFeatures; ++j) acc[static_cast<size_t>(j)] += err * x[j];
        acc[kFeatures] += 0.5f * err * err;
      }
      tessel::Tensor t = tessel::from_vector<float>(acc);
      pg->all_reduce(t);
      const float* sum = t.data<float>();
      for (int j = 0; j < kFeatures; ++j) {
        c.w[static_cast<size_t>(j)] -= 0.02f * sum[j] / kGlobalBatch;
      }
      c.step = step + 1;
      std::printf("step %d loss %.9g world %d attempt %d time_ns %lld\n", step,
                  static_cast<double>(sum[kFeatures] / kGlobalBatch), world, attempt,
                  realtime_ns());
      std::fflush(stdout);
      if (rank == 0 && c.step % every == 0) commit_checkpoint(dir, c);
      const long long left_ns = pace_ms * 1000000LL - (monotonic_ns() - started);
      if (left_ns > 0) usleep(static_cast<useconds_t>(left_ns / 1000));  // the step's length
    }
    tessel::Tensor done = tessel::from_vector<float>({1.0f});
    pg->all_reduce(done);  // nobody ends while another still trains
    return 0;
  } catch (const tessel::Timeout& e) {
    std::fprintf(stderr, "train rank %d: %s\n", rank, e.what());
    return 124;
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "train rank %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "env";
  const int rank = env_int("RANK");
  if (mode == "env") {
    for (char** e = environ; *e; ++e) std::printf("ENV %s\n", *e);
    return 0;
  }
  if (mode == "fail" && argc >= 4) {
    const std::string dir = argc >= 5 ? argv[4] : "";
    if (rank == std::atoi(argv[2])) {
      if (!dir.empty()) {
        // Fail only once every other rank is ready to record its SIGTERM.
        const int world = env_int("WORLD_SIZE");
        for (int r = 0; r < world; ++r) {
          const std::string ready = dir + "/ready_" + std::to_string(r);
          while (r != rank && access(ready.c_str(), F_OK) != 0) usleep(1000);
        }
        FILE* f = std::fopen((dir + "/failed_at").c_str(), "w");
        if (f) {
          std::fprintf(f, "%lld\n", monotonic_ns());
          std::fclose(f);
        }
      }
      std::fprintf(stderr, "rank %d giving up: simulated failure\n", rank);
      return std::atoi(argv[3]);
    }
    if (!dir.empty()) {
      g_stop_file = dir + "/stopped_" + std::to_string(rank);
      signal(SIGTERM, on_term);
      FILE* f = std::fopen((dir + "/ready_" + std::to_string(rank)).c_str(), "w");
      if (f) std::fclose(f);
    }
    sleep_forever();
  }
  if (mode == "sleep") sleep_forever();
  if (mode == "store-probe" && argc >= 3) {
    const std::string dir = argv[2];
    auto store = tessel::store_client_from_env();
    std::printf("store %s\n", std::getenv("TESSEL_STORE_ADDR"));
    std::fflush(stdout);
    std::vector<long long> quiet, attack;
    const std::string key = "probe/" + std::to_string(rank);
    for (long i = 0; access((dir + "/stop").c_str(), F_OK) != 0; ++i) {
      const bool under_attack = access((dir + "/attack").c_str(), F_OK) == 0;
      const long long t0 = monotonic_ns();
      try {
        store->set(key, std::to_string(i));
        if (store->get(key, std::chrono::seconds(30)) != std::to_string(i)) return 1;
      } catch (const tessel::Error& e) {
        std::fprintf(stderr, "store error: %s\n", e.what());
        return 1;
      }
      (under_attack ? attack : quiet).push_back(monotonic_ns() - t0);
      usleep(2000);
    }
    for (auto [phase, v] : {std::pair{"quiet", &quiet}, {"attack", &attack}}) {
      std::sort(v->begin(), v->end());
      const auto at = [&](double q) {
        return v->empty()
                   ? 0LL
                   : (*v)[static_cast<size_t>(q * static_cast<double>(v->size() - 1))] / 1000;
      };
      std::printf("probe %s n=%zu p50=%lld p99=%lld max=%lld\n", phase, v->size(), at(0.5),
                  at(0.99), v->empty() ? 0LL : v->back() / 1000);
    }
    return 0;
  }
  if (mode == "error-file" && argc >= 3) {
    if (rank != std::atoi(argv[2])) sleep_forever();
    FILE* f = std::fopen(std::getenv("TORCHELASTIC_ERROR_FILE"), "w");
    if (f == nullptr) return 2;
    std::fprintf(f,
                 "{\"message\": {\"message\": \"ValueError: the loss is nan\", "
                 "\"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n  "
                 "File \\\"train.py\\\", line 7, in <module>\\nValueError: the loss is nan\", "
                 "\"timestamp\": \"1700000000\"}}}\n");
    std::fclose(f);
    return 1;
  }
  if (mode == "await" && argc >= 3) {
    for (char** e = environ; *e; ++e) std::printf("ENV %s\n", *e);
    std::fflush(stdout);
    while (access(argv[2], F_OK) != 0) usleep(10000);  // the test creates it when both run
    return 0;
  }
  if (mode == "grandchild" && argc >= 3) {
    const pid_t child = fork();
    if (child == 0) {
      setsid();  // leaves the worker's process group
      sleep_forever();
    }
    const std::string path = std::string(argv[2]) + "/pids_" + std::to_string(rank);
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    std::fprintf(f, "%d %d\n", getpid(), child);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
    sleep_forever();
  }
  if (mode == "lines" && argc >= 3) {
    const int n = std::atoi(argv[2]);
    std::string pad(3000, 'x');
    for (int i = 0; i < n; ++i) std::printf("line %d rank %d %s end\n", i, rank, pad.c_str());
    return 0;
  }
  if (mode == "crash") return 1;
  if (mode == "first-attempt-fails" && argc >= 3) {
    const int attempt = env_int("TORCHELASTIC_RESTART_COUNT");
    if (attempt > 0) {
      std::printf("attempt %d world %d rank %d\n", attempt, env_int("WORLD_SIZE"), rank);
      return 0;
    }
    if (rank == std::atoi(argv[2])) return 1;
    sleep_forever();
  }
  if (mode == "signals" && argc >= 3) {
    g_dir = argv[2];
    g_rank = rank;
    signal(SIGUSR1, on_usr1);
    signal(SIGINT, on_int);
    signal(SIGTERM, on_int);
    touch(g_dir + "/ready_" + std::to_string(rank));
    sleep_forever();
  }
  if (mode == "all_reduce") {
    try {
      auto world = tessel::init_process_group({.backend = "gloo"});
      tessel::Tensor t = tessel::from_vector<int64_t>({rank + 1});
      world->all_reduce(t);
      const int64_t w = world->size();
      const int64_t sum = t.data<int64_t>()[0];
      std::printf("all_reduce rank %d of %lld sum %lld\n", rank, static_cast<long long>(w),
                  static_cast<long long>(sum));
      return sum == w * (w + 1) / 2 ? 0 : 1;
    } catch (const tessel::Error& e) {
      std::fprintf(stderr, "all_reduce rank %d: %s\n", rank, e.what());
      return 1;
    }
  }
  if (mode == "ring") {
    try {
      auto world = tessel::init_process_group({.backend = "gloo"});
      tessel::Tensor t = tessel::from_vector<int64_t>({rank + 1});
      world->all_reduce(t);
      const std::string ring = tessel::fr::FlightRecorder::global().ring_file();
      std::printf("RING %s %d\n", ring.c_str(), ::access(ring.c_str(), F_OK) == 0 ? 1 : 0);
      std::fflush(stdout);
      world->barrier().wait();  // no rank ends before every rank looked at its ring
      return 0;
    } catch (const tessel::Error& e) {
      std::fprintf(stderr, "ring rank %d: %s\n", rank, e.what());
      return 1;
    }
  }
  if (mode == "mesh-skip" && argc >= 3) {
    const int culprit = std::atoi(argv[2]);
    try {
      tessel::InitOptions options;
      options.backend = "gloo";
      options.timeout = std::chrono::seconds(2);
      auto world = tessel::init_process_group(options);
      auto mesh = tessel::init_device_mesh(world, {2, 2}, {"dp", "tp"}, {.eager = true});
      for (int step = 0; step < 4; ++step) {
        tessel::fr::FlightRecorder::global().set_step(step);
        tessel::Tensor t = tessel::from_vector<float>({1.0f, 2.0f});
        if (!(rank == culprit && step == 2)) mesh.group("tp")->all_reduce(t);
        mesh.group("dp")->all_reduce(t);
      }
      // The end of training, as a real job ends: every rank meets the others (so the ranks
      // that ran out of calls early are still there to dump when the others time out).
      tessel::Tensor done = tessel::from_vector<float>({1.0f});
      world->all_reduce(done);
      return 0;
    } catch (const tessel::Timeout& e) {
      std::fprintf(stderr, "mesh-skip rank %d: %s\n", rank, e.what());
      return 124;
    } catch (const tessel::Error& e) {
      std::fprintf(stderr, "mesh-skip rank %d: %s\n", rank, e.what());
      return 1;
    }
  }
  if ((mode == "fault" && argc >= 4) || (mode == "hang" && argc >= 3)) {
    const std::string kind = mode == "hang" ? "hang" : argv[2];
    const int culprit = std::atoi(argv[mode == "hang" ? 2 : 3]);
    try {
      tessel::InitOptions options;
      options.backend = "gloo";
      options.timeout = std::chrono::seconds(2);
      auto world = tessel::init_process_group(options);
      tessel::Tensor t = tessel::from_vector<float>({1.0f});
      world->all_reduce(t);
      if (rank == culprit) {
        if (kind == "crash") raise(SIGSEGV);
        if (kind == "kill") raise(SIGKILL);
        if (kind == "exit") _exit(0);
        sleep_forever();
      }
      world->all_reduce(t);
      return 0;
    } catch (const tessel::Timeout& e) {
      std::fprintf(stderr, "fault rank %d: %s\n", rank, e.what());
      return 124;
    } catch (const tessel::Error& e) {
      std::fprintf(stderr, "fault rank %d: %s\n", rank, e.what());
      return 1;
    }
  }
  if (mode == "train" && argc >= 9) return train(argv);
  std::fprintf(stderr, "launcher_test_worker: unknown mode '%s'\n", mode.c_str());
  return 2;
}
