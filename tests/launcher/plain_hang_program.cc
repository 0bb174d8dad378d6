// A plain training-loop program for the hang-verdict tests: the shape a new user writes, with
// one rank misbehaving at one step. Nothing here helps the flight recorder beyond what the docs
// ask of a program (set_step per step).
//
//   plain_hang_program HANDLING FAULT CULPRIT [GROUP]
//     HANDLING  none     no try/catch: an error ends in std::terminate (SIGABRT)
//               exit1    catch tessel::Error, exit 1
//               exit124  catch Timeout -> exit 124 (as docs/diagnosing-hangs.md says), else 1
//               abort    catch anything -> std::abort() in the handler
//     FAULT     stop     at step 2 CULPRIT stops taking part (stays alive, sleeps)
//               late     at step 2 CULPRIT sleeps a collective timeout and a second more, then goes
//               on skip     at step 2 CULPRIT leaves out its collective on GROUP and goes on leave
//               CULPRIT leaves the loop one collective early (its last step's GROUP
//                        collective) and waits at the final world barrier
//               crash    at step 2 CULPRIT dies of SIGSEGV before its collective
//               exit     at step 2 CULPRIT exits 0 (leaves the job early)
//               config   every rank asks for a mesh that does not fit the world before any
//                        collective (an ordinary configuration error; CULPRIT is ignored)
//     GROUP     world (default), or a dimension of a 2 x (W/2) (dp, tp) mesh: dp or tp
//
// Each of 5 steps all_reduces on the tp group, then the dp group (world when GROUP is world).
// The collective timeout is TEST_TIMEOUT_MS (default 2000).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/collectives/init.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"

namespace {

constexpr int kSteps = 5;
constexpr int kFaultStep = 2;

[[noreturn]] void sleep_forever() {
  for (;;) pause();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

int run(const std::string& fault, int culprit, const std::string& group_name) {
  tessel::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::milliseconds(env_int("TEST_TIMEOUT_MS", 2000));
  auto world = tessel::init_process_group(options);
  const int rank = world->rank();
  if (fault == "config") {
    (void)tessel::init_device_mesh(world, {world->size() + 1}, {"dp"});
  }
  std::shared_ptr<tessel::ProcessGroup> inner = world, outer = world;
  std::optional<tessel::DeviceMesh> mesh;
  if (group_name != "world") {
    mesh.emplace(
        tessel::init_device_mesh(world, {2, world->size() / 2}, {"dp", "tp"}, {.eager = true}));
    inner = mesh->group("tp");
    outer = mesh->group("dp");
  }
  const auto faulty = group_name == "dp" ? outer : inner;
  auto& recorder = tessel::fr::FlightRecorder::global();
  for (int step = 0; step < kSteps; ++step) {
    recorder.set_step(step);
    const bool mine = rank == culprit;
    if (mine && step == kFaultStep) {
      if (fault == "stop") sleep_forever();
      if (fault == "late") std::this_thread::sleep_for(options.timeout + std::chrono::seconds(1));
      if (fault == "crash") raise(SIGSEGV);
      if (fault == "exit") _exit(0);
    }
    const bool skip = mine && ((fault == "skip" && step == kFaultStep) ||
                               (fault == "leave" && step == kSteps - 1));
    tessel::Tensor t = tessel::from_vector<float>({1.0f, 2.0f});
    for (const auto& g : {inner, outer}) {
      if (!(skip && g == faulty)) g->all_reduce(t);
      if (inner == outer) break;
    }
  }
  world->barrier();
  std::printf("rank %d done\n", rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: plain_hang_program HANDLING FAULT CULPRIT [GROUP]\n");
    return 2;
  }
  const std::string handling = argv[1], fault = argv[2];
  const int culprit = std::atoi(argv[3]);
  const std::string group = argc > 4 ? argv[4] : "world";
  if (handling == "none") return run(fault, culprit, group);
  try {
    return run(fault, culprit, group);
  } catch (const tessel::Timeout& e) {
    std::fprintf(stderr, "%s\n", e.what());
    if (handling == "abort") std::abort();
    return handling == "exit124" ? 124 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    if (handling == "abort") std::abort();
    return 1;
  }
}
