// mesh_demo: builds a 2-D DeviceMesh and runs an all_reduce along each dimension.
//
//   mesh_demo --threads 8 --shape 2x4           8 ranks as threads of this process
//   mpirun -np 4 mesh_demo --shape 2x2          4 processes over Open MPI
//   tessel-run --standalone --nproc-per-node 4 mesh_demo     4 processes over Gloo
//
// Each rank prints its mesh, its groups and the sums, in rank order.
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/base/tools/cli.h"
#include "tessel/collectives/init.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/mesh/device_mesh.h"

namespace {

using namespace tessel;

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, 'x');) {
    TESSEL_CHECK(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos,
                 InvalidArgument, "--shape '{}' must look like 2x4", text);
    shape.push_back(std::stoll(part));
  }
  TESSEL_CHECK(shape.size() == 2, InvalidArgument, "--shape '{}' must have two sizes, e.g. 2x4",
               text);
  return shape;
}

std::string join(const std::vector<int>& v) { return fmt::format("{}", fmt::join(v, " ")); }

// What one rank does; returns its report.
std::string run_rank(const std::shared_ptr<ProcessGroup>& world,
                     const std::vector<int64_t>& shape) {
  DeviceMesh mesh = init_device_mesh(world, shape, {"dp", "tp"});
  std::string report = mesh.str() + "\n";
  for (const std::string dim : {"dp", "tp"}) {
    auto group = mesh.group(dim);
    Tensor value = from_vector<float>({static_cast<float>(world->rank())});
    group->all_reduce(value);
    report +=
        fmt::format("  {}: ranks [{}], local rank {}, all_reduce(rank) = {}\n", dim,
                    join(group->global_ranks()), mesh.local_rank(dim), value.data<float>()[0]);
  }
  mesh.destroy();
  return report;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  std::string shape_text;
  CLI::App app{"mesh_demo: a 2-D DeviceMesh and one all_reduce along each dimension"};
  cli::show_defaults(app);
  app.add_option("--threads", threads,
                 "ranks as threads of this process (0: one rank per process, from a launcher)")
      ->check(cli::integer_in(0, 1024));
  app.add_option("--shape", shape_text, "mesh shape AxB (default: 2 x half the ranks)");
  cli::describe_options(app);
  if (const auto status = cli::parse(app, argc, argv, "mesh_demo")) return *status;
  try {
    if (threads > 0) {
      const auto shape =
          parse_shape(shape_text.empty() ? "2x" + std::to_string(threads / 2) : shape_text);
      std::vector<std::string> reports(static_cast<size_t>(threads));
      threads::run_ranks(threads, [&](ProcessGroup& pg) {
        reports[static_cast<size_t>(pg.rank())] = run_rank(pg.shared_from_this(), shape);
      });
      for (const auto& r : reports) std::fputs(r.c_str(), stdout);
      return 0;
    }
    auto world = init_process_group();
    const auto shape =
        parse_shape(shape_text.empty() ? "2x" + std::to_string(world->size() / 2) : shape_text);
    const std::string report = run_rank(world, shape);
    // Print in rank order: each rank waits for its turn on the world group.
    for (int r = 0; r < world->size(); ++r) {
      if (r == world->rank()) {
        std::fputs(report.c_str(), stdout);
        std::fflush(stdout);
      }
      world->barrier();
    }
    return 0;
  } catch (const Timeout& e) {
    std::fprintf(stderr, "mesh_demo: %s\n", e.what());
    return 124;                         // a collective timed out (docs/diagnosing-hangs.md)
  } catch (const InvalidArgument& e) {  // a --shape the ranks do not fill
    std::fprintf(stderr, "mesh_demo: %s\n", e.message().c_str());
    return cli::kExitBadValue;
  } catch (const Error& e) {
    std::fprintf(stderr, "mesh_demo: %s\n", e.what());
    return 1;
  }
}
