// The Gloo backend's all_to_all (and all_gather, reduce_scatter and all_reduce, which run on it)
// over shared memory between ranks of one host (forked processes):
// which pairs use it (host ids, the option on one end only), exact results when some pairs use
// shared memory and others TCP, views that wrap the rings many times, a count that disagrees
// (an error on both ends), a peer killed or absent mid-call on either transport, and no names
// left in /dev/shm, even by a process that died during the set-up.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "collective_checks.h"
#include "fork_harness.h"
#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/collectives/gloo/internal/shm_channel.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

using std::chrono::seconds;

struct Shm {
  bool enabled = true;
  std::string host_id = {};
  size_t scratch = GlooOptions{}.exchange_scratch_bytes;
};

std::shared_ptr<ProcessGroup> connect(int rank, int size, const std::string& dir, const Shm& shm,
                                      Nanoseconds timeout = seconds(30)) {
  auto store = std::make_shared<FileStore>(dir, seconds(30));
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.group.timeout = timeout;
  options.shared_memory = shm.enabled;
  options.host_id = shm.host_id;
  options.exchange_scratch_bytes = shm.scratch;
  return gloo::create_process_group(store, rank, size, options);
}

void expect_all_succeeded(const std::vector<testing::ProcessOutcome>& outcomes) {
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
  }
}

void check(bool ok, const std::string& what) {
  if (!ok) throw testing::CheckFailure(what);
}

// The all_to_all segments this process has mapped (its own and its peers'), from its maps.
int mapped_segments() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> names;
  for (std::string line; std::getline(maps, line);) {
    const size_t at = line.find("/dev/shm/tessel-a2a-");
    if (at != std::string::npos) names.insert(line.substr(at));
  }
  return static_cast<int>(names.size());
}

// Names in /dev/shm made by any of `pids`.
std::vector<std::string> names_of(const std::vector<int>& pids) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename();
    if (name.rfind("tessel-a2a-", 0) != 0) continue;
    for (int pid : pids) {
      if (name.find(fmt::format("-{}-", pid)) != std::string::npos) found.push_back(name);
    }
  }
  return found;
}

// Rank r's value at (row, col) of its input: an integer that varies with rank, row and column,
// below 256 for bf16 (which holds those exactly).
double value(int rank, int64_t row, int64_t col, DType dtype) {
  const int64_t modulus = dtype == DType::kBF16 ? 251 : 65521;
  return static_cast<double>((rank * 7919 + row * 131 + col) % modulus);
}

// The list form over column blocks of `cols` columns (strided on the way out) into row blocks
// (contiguous), then back from row blocks into column blocks (strided on the way in); checks
// every element against the other ranks' inputs.
void check_column_exchange(ProcessGroup& pg, int64_t rows, int64_t cols, DType dtype) {
  const int n = pg.size(), me = pg.rank();
  Tensor in = empty({rows, cols * n}, dtype);
  Tensor in_f = empty({rows, cols * n});
  auto* p = in_f.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols * n; ++c)
      p[r * cols * n + c] = static_cast<float>(value(me, r, c, dtype));
  }
  copy_(in, in_f);
  Tensor out = empty({rows * n, cols}, dtype);
  std::vector<Tensor> ins, outs;
  for (int j = 0; j < n; ++j) {
    ins.push_back(narrow(in, 1, j * cols, cols));
    outs.push_back(narrow(out, 0, j * rows, rows));
  }
  pg.all_to_all(ins, outs);
  const Tensor got = to(out, DType::kF32);
  const auto* g = got.data<float>();
  for (int j = 0; j < n; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float want = static_cast<float>(value(j, r, me * cols + c, dtype));
        const float have = g[(j * rows + r) * cols + c];
        check(have == want,
              fmt::format("rank {}: from rank {} at ({}, {}): {} != {}", me, j, r, c, have, want));
      }
    }
  }
  // And back: row blocks into column blocks, which must rebuild the input.
  Tensor back = empty({rows, cols * n}, dtype);
  std::vector<Tensor> back_ins, back_outs;
  for (int j = 0; j < n; ++j) {
    back_ins.push_back(narrow(out, 0, j * rows, rows));
    back_outs.push_back(narrow(back, 1, j * cols, cols));
  }
  pg.all_to_all(back_ins, back_outs);
  const Tensor back_f = to(back, DType::kF32), in_again = to(in, DType::kF32);
  check(std::memcmp(back_f.data_ptr(), in_again.data_ptr(), back_f.nbytes()) == 0,
        fmt::format("rank {}: the round trip did not rebuild the input", me));
}

// The n blocks of equal width of a matrix's columns (strided views).
std::vector<Tensor> column_blocks(const Tensor& matrix, int n) {
  const int64_t width = matrix.size(1) / n;
  std::vector<Tensor> blocks;
  for (int j = 0; j < n; ++j) blocks.push_back(narrow(matrix, 1, j * width, width));
  return blocks;
}

// Uneven counts through the contiguous form: a different count per pair, and none from an odd
// rank to itself.
void check_uneven(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  auto count = [&](int from, int to) -> int64_t {
    return from == to && from % 2 ? 0 : 1000 * (from + 1) + to;
  };
  std::vector<int64_t> send, recv;
  int64_t send_total = 0, recv_total = 0;
  for (int j = 0; j < n; ++j) {
    send.push_back(count(me, j));
    recv.push_back(count(j, me));
    send_total += send.back();
    recv_total += recv.back();
  }
  Tensor in = empty({send_total}, DType::kI64), out = zeros({recv_total}, DType::kI64);
  auto* p = in.data<int64_t>();
  int64_t at = 0;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < send[static_cast<size_t>(j)]; ++k)
      p[at++] = me * 1'000'000 + j * 10'000 + k;
  }
  pg.all_to_all(in, out, {.send_counts = send, .recv_counts = recv});
  const auto* q = out.data<int64_t>();
  at = 0;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < recv[static_cast<size_t>(j)]; ++k, ++at) {
      check(q[at] == j * 1'000'000 + me * 10'000 + k,
            fmt::format("rank {}: element {} from rank {} is {}", me, k, j, q[at]));
    }
  }
}

// all_gather (which runs as an all_to_all of the input when a peer shares memory), even and
// uneven, large enough to wrap the rings.
void check_all_gather(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  for (bool even : {true, false}) {
    auto count = [&](int r) -> int64_t { return even ? 300000 : 100000 * (r + 1) + r; };
    std::vector<int64_t> counts;
    int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      counts.push_back(count(r));
      total += count(r);
    }
    Tensor in = empty({count(me)}, DType::kI32), out = zeros({total}, DType::kI32);
    auto* p = in.data<int32_t>();
    for (int64_t k = 0; k < count(me); ++k) p[k] = static_cast<int32_t>(me * 1'000'000 + k);
    pg.all_gather(in, out, {.counts = even ? std::vector<int64_t>{} : counts});
    const auto* q = out.data<int32_t>();
    int64_t at = 0;
    for (int r = 0; r < n; ++r) {
      for (int64_t k = 0; k < count(r); ++k, ++at) {
        check(q[at] == r * 1'000'000 + k,
              fmt::format("rank {}: all_gather element {} of rank {} is {}", me, k, r, q[at]));
      }
    }
  }
}

// all_reduce and reduce_scatter (exchanges through the rings where a peer shares memory): f32
// values whose sum depends on the order, so the result must equal rank order's bit for bit on
// every rank; max and avg; bf16 and i64; fewer elements than ranks; large enough to wrap.
void check_reductions(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  auto value = [](int rank, int64_t k) {  // magnitudes apart, so float sums round by order
    return static_cast<float>((k % 7 + 1) * (rank % 2 ? 1e-7 : 1e7)) + static_cast<float>(rank);
  };
  for (int64_t numel : {int64_t{1}, int64_t{n + 1}, int64_t{600001}}) {
    Tensor x = empty({numel});
    for (int64_t k = 0; k < numel; ++k) x.data<float>()[k] = value(me, k);
    Tensor sum = clone(x), max = clone(x), avg = clone(x);
    pg.all_reduce(sum);
    pg.all_reduce(max, {.op = ReduceOp::kMax});
    pg.all_reduce(avg, {.op = ReduceOp::kAvg});
    for (int64_t k = 0; k < numel; ++k) {
      float want = value(0, k), top = value(0, k);
      for (int r = 1; r < n; ++r) {
        want += value(r, k);
        top = std::max(top, value(r, k));
      }
      const float s = sum.data<float>()[k];
      check(std::memcmp(&s, &want, sizeof s) == 0,
            fmt::format("rank {}: all_reduce sum of {} at {} is {:a}, rank order gives {:a}", me,
                        numel, k, s, want));
      check(max.data<float>()[k] == top, fmt::format("rank {}: all_reduce max at {}", me, k));
      check(avg.data<float>()[k] == want / static_cast<float>(n),
            fmt::format("rank {}: all_reduce avg at {}", me, k));
    }
  }
  // Integers and bf16 through reduce_scatter, uneven (rank r's chunk has 3r + 1 elements).
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    counts.push_back(3 * r + 1 + (r == 0 ? 200000 : 0));
    total += counts.back();
  }
  Tensor in = empty({total}, DType::kI64);
  for (int64_t k = 0; k < total; ++k) in.data<int64_t>()[k] = (int64_t{1} << 40) * me + k;
  Tensor out = empty({counts[static_cast<size_t>(me)]}, DType::kI64);
  pg.reduce_scatter(in, out, {.counts = counts});
  int64_t first = 0;
  for (int r = 0; r < me; ++r) first += counts[static_cast<size_t>(r)];
  for (int64_t k = 0; k < out.numel(); ++k) {
    const int64_t want = (int64_t{1} << 40) * (n * (n - 1) / 2) + n * (first + k);
    check(out.data<int64_t>()[k] == want,
          fmt::format("rank {}: reduce_scatter i64 at {} is {}, want {}", me, k,
                      out.data<int64_t>()[k], want));
  }
  std::vector<int64_t> b_counts;
  for (int r = 0; r < n; ++r) b_counts.push_back(1000 + (r < 3 ? 1 : 0));
  Tensor b = full({1000 * n + std::min(n, 3)}, 1.5, DType::kBF16);
  Tensor b_out = empty({b_counts[static_cast<size_t>(me)]}, DType::kBF16);
  pg.reduce_scatter(b, b_out, {.counts = b_counts});
  const Tensor b_f = to(b_out, DType::kF32);
  for (int64_t k = 0; k < b_f.numel(); ++k) {
    check(b_f.data<float>()[k] == 1.5f * static_cast<float>(n),
          fmt::format("rank {}: reduce_scatter bf16 at {} is {}", me, k, b_f.data<float>()[k]));
  }
}

void check_everything(ProcessGroup& pg) {
  check_reductions(pg);
  check_column_exchange(pg, 3, 5, DType::kF32);        // a few odd-sized rows
  check_column_exchange(pg, 40000, 12, DType::kF32);   // 1.8 MiB per peer: the rings wrap
  check_column_exchange(pg, 20001, 33, DType::kBF16);  // odd rows of 66 bytes
  check_column_exchange(pg, 0, 4, DType::kF32);        // nothing at all
  // Matrices larger than a core's cache: the sends and the own block leave in one pass over
  // the rows, and rows of 66 bytes straddle the rings' ends.
  check_column_exchange(pg, 70001, 16, DType::kF32);
  check_column_exchange(pg, 70001, 33, DType::kBF16);
  check_uneven(pg);
}

class GlooShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
    if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm on this host";
  }
};

// Four ranks standing in two hosts: pairs on one "host" share memory, the others use TCP; every
// result is exact either way, and no name is left in /dev/shm.
TEST_F(GlooShmTest, PairsOnOneHostShareMemoryAndTheRestUseTcp) {
  expect_all_succeeded(testing::run_processes(
      4,
      [](int rank, const std::string& dir) {
        auto pg = connect(rank, 4, dir, {.host_id = fmt::format("host{}", rank / 2)});
        check(mapped_segments() == 0, "segments mapped before any all_to_all");
        check_all_gather(*pg);  // the first call that moves data sets the pairs up
        check(mapped_segments() == 2,
              fmt::format("rank {} maps {} segments after all_gather", rank, mapped_segments()));
        check_everything(*pg);
        // Its own segment and its partner's.
        check(mapped_segments() == 2,
              fmt::format("rank {} maps {} segments, expected 2", rank, mapped_segments()));
        pg->barrier();
        const auto left = names_of({static_cast<int>(::getpid())});
        check(left.empty(), fmt::format("rank {} left {} in /dev/shm", rank, left.size()));
      },
      seconds(120)));
}

// All on this host (the default host id): every pair shares memory; a sub-group made by split
// sets up its own.
TEST_F(GlooShmTest, AllRanksOfThisHostShareMemoryAndSplitsToo) {
  expect_all_succeeded(testing::run_processes(
      3,
      [](int rank, const std::string& dir) {
        auto pg = connect(rank, 3, dir, {});
        check_everything(*pg);
        check(mapped_segments() == 3,
              fmt::format("rank {} maps {} segments, expected 3", rank, mapped_segments()));
        auto sub = pg->split(rank == 2 ? 1 : 0, rank);
        check_everything(*sub);
        const int expected = rank == 2 ? 3 : 5;  // rank 2 is alone in its sub-group
        check(mapped_segments() == expected, fmt::format("rank {} maps {} segments, expected {}",
                                                         rank, mapped_segments(), expected));
      },
      seconds(120)));
}

// Reductions whose chunks outgrow the scratch go in rounds (here the most, 255, each of a few
// hundred elements), with results as exact as in one exchange and scratch that stays small.
TEST_F(GlooShmTest, ReductionsLargerThanTheScratchGoInRounds) {
  expect_all_succeeded(testing::run_processes(
      3,
      [](int rank, const std::string& dir) {
        auto pg = connect(rank, 3, dir, {.host_id = rank == 2 ? "elsewhere" : "", .scratch = 4096});
        check_reductions(*pg);
        empty_cache(Device::cpu());
        reset_peak_memory_stats(Device::cpu());
        const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
        Tensor big = ones({3 * 100000});
        pg->all_reduce(big);
        check(big.data<float>()[299999] == 3.0f, "the all_reduce in rounds summed wrongly");
        const int64_t scratch = memory_stats(Device::cpu()).peak_allocated_bytes - before -
                                static_cast<int64_t>(big.nbytes());
        check(scratch <= 16 << 10, fmt::format("rank {}: the all_reduce held {} bytes of scratch "
                                               "(2 x 100000 elements without rounds)",
                                               rank, scratch));
      },
      seconds(120)));
}

// A pair shares memory only when both ends enable it: rank 2 turns it off, so it talks TCP with
// everyone while ranks 0 and 1 still share memory.
TEST_F(GlooShmTest, BothEndsMustEnableIt) {
  expect_all_succeeded(testing::run_processes(
      3,
      [](int rank, const std::string& dir) {
        auto pg = connect(rank, 3, dir, {.enabled = rank != 2});
        check_all_gather(*pg);  // rank 2 must take the same algorithm as the others
        check_everything(*pg);
        const int expected = rank == 2 ? 0 : 2;
        check(mapped_segments() == expected, fmt::format("rank {} maps {} segments, expected {}",
                                                         rank, mapped_segments(), expected));
      },
      seconds(120)));
}

// A count that disagrees: both ends fail with the same named mismatch, at once, rather than
// misreading the stream, hanging, or (the sender) returning as if all went well. A CommError:
// the group's failure, which the process group dumps for tessel-trace.
TEST_F(GlooShmTest, CountsThatDisagreeFailOnBothEnds) {
  expect_all_succeeded(testing::run_processes(
      2,
      [](int rank, const std::string& dir) {
        auto pg = connect(rank, 2, dir, {}, seconds(20));
        // Rank 0 sends rank 1 ten elements; rank 1 expects twelve. The other direction agrees.
        const std::vector<int64_t> send =
            rank == 0 ? std::vector<int64_t>{4, 10} : std::vector<int64_t>{4, 4};
        const std::vector<int64_t> recv =
            rank == 0 ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{12, 4};
        Tensor in = zeros({rank == 0 ? 14 : 8}), out = zeros({rank == 0 ? 8 : 16});
        const Stopwatch watch;
        try {
          pg->all_to_all(in, out, {.send_counts = send, .recv_counts = recv});
          throw testing::CheckFailure("a mismatched all_to_all returned");
        } catch (const CommError& e) {
          const std::string text = e.what();
          const std::string expected = "rank 0 sends 40 bytes to rank 1, which expects 48";
          check(text.find(expected) != std::string::npos,
                "rank " + std::to_string(rank) + " got: " + text);
        }
        check(watch.elapsed() < seconds(20), "the mismatch was found only at the timeout");
      },
      seconds(60)));
}

// The reductions run as exchanges too: an all_reduce or reduce_scatter whose sizes differ
// between ranks fails on every rank at once, naming the sizes, and leaves the group failed.
TEST_F(GlooShmTest, ReductionsOfDifferentSizesFailOnEveryRank) {
  for (const bool scatter : {false, true}) {
    expect_all_succeeded(testing::run_processes(
        3,
        [scatter](int rank, const std::string& dir) {
          auto pg = connect(rank, 3, dir, {}, seconds(20));
          Tensor warm = ones({6});
          pg->all_reduce(warm);  // sets up; every rank agrees
          check(warm.data<float>()[5] == 3.0f, "the warm-up all_reduce summed wrongly");
          const int64_t n = rank == 1 ? 9 : 6;  // rank 1's chunks are 3, the others' 2
          const Stopwatch watch;
          try {
            if (scatter) {
              Tensor out = zeros({n / 3});
              pg->reduce_scatter(ones({n}), out);
            } else {
              Tensor t = ones({n});
              pg->all_reduce(t);
            }
            throw testing::CheckFailure("a mismatched reduction returned");
          } catch (const CommError& e) {
            const std::string text = e.what();
            check(text.find("the ranks passed different sizes") != std::string::npos &&
                      text.find(scatter ? "reduce_scatter" : "all_reduce") != std::string::npos,
                  "rank " + std::to_string(rank) + " got: " + text);
          }
          check(watch.elapsed() < seconds(20), "the mismatch was found only at the timeout");
          Tensor again = ones({6});
          try {
            pg->all_reduce(again);
            throw testing::CheckFailure("the group went on after a failed exchange");
          } catch (const CommError&) {
          }
        },
        seconds(60)));
  }
}

// A rank that never calls: the others time out naming it, on either transport.
TEST_F(GlooShmTest, AbsentRankIsNamedOnEitherTransport) {
  for (bool shm : {true, false}) {
    expect_all_succeeded(testing::run_processes(
        3,
        [shm](int rank, const std::string& dir) {
          auto pg = connect(rank, 3, dir, {.enabled = shm}, seconds(3));  // the timeout
          pg->barrier();
          Tensor in = zeros({1000, 12}), out = zeros({1000, 12});
          const std::vector<Tensor> ins = column_blocks(in, 3), outs = column_blocks(out, 3);
          pg->all_to_all(ins, outs);  // sets up, then rank 2 stays away
          FileStore store(dir, seconds(60));
          if (rank == 2) {  // alive, not calling, until the others have seen their timeout
            store.wait({"checked/0", "checked/1"}, seconds(60));
            return;
          }
          try {
            pg->all_to_all(ins, outs);
            throw testing::CheckFailure("all_to_all returned without rank 2");
          } catch (const Timeout& e) {
            check(std::string(e.what()).find("not arrived: world rank 2 (group rank 2)") !=
                      std::string::npos,
                  fmt::format("shm={} rank {}: {}", shm, rank, e.what()));
          }
          store.set("checked/" + std::to_string(rank), "1");
        },
        seconds(60)));
  }
}

// A rank killed in the middle of a large all_to_all: the others fail with the lost peer well
// before their timeout, on either transport.
TEST_F(GlooShmTest, KilledRankFailsTheOthersOnEitherTransport) {
  for (bool shm : {true, false}) {
    const auto timeout = seconds(20);
    auto outcomes = testing::run_processes(
        3,
        [&](int rank, const std::string& dir) {
          auto pg = connect(rank, 3, dir, {.enabled = shm}, timeout);
          Tensor in = zeros({1 << 20, 12}), out = zeros({1 << 20, 12});
          const std::vector<Tensor> ins = column_blocks(in, 3), outs = column_blocks(out, 3);
          pg->all_to_all(ins, outs);  // the set-up is done
          if (rank == 2) {
            // Dies while its call is queued or under way: the others need all of its data, so
            // their calls cannot complete whenever the kill lands.
            pg->all_to_all(ins, outs, {.async = true});
            ::raise(SIGKILL);
          }
          const Stopwatch watch;
          try {
            pg->all_to_all(ins, outs);
            throw testing::CheckFailure("all_to_all returned without rank 2");
          } catch (const PeerLost&) {
          } catch (const CommError&) {
          }
          check(watch.elapsed() < timeout,
                "the error came only with the timeout, after " + format_duration(watch.elapsed()));
        },
        seconds(60));
    ASSERT_EQ(outcomes.size(), 3u);
    EXPECT_EQ(outcomes[2].signal, SIGKILL) << testing::describe(outcomes[2]);
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(outcomes[r].exited && outcomes[r].exit_code == 0)
          << "shm=" << shm << ": " << testing::describe(outcomes[r]);
    }
  }
}

// A name whose process died (during a set-up, before it could unlink it) is swept by the next
// set-up on this host; a live process's name is not.
TEST_F(GlooShmTest, NamesOfDeadProcessesAreSwept) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // its pid is now unused
  const std::string prefix =
      fmt::format("/dev/shm/tessel-a2a-{:x}-", internal::this_pid_namespace());
  const std::string dead = fmt::format("{}{}-00000000deadbeef", prefix, child);
  const std::string alive = fmt::format("{}{}-00000000a11ba11b", prefix, ::getpid());
  std::ofstream(dead) << "left behind";
  std::ofstream(alive) << "in use";
  expect_all_succeeded(testing::run_processes(
      2,
      [](int rank, const std::string& dir) {
        auto pg = connect(rank, 2, dir, {});
        check_column_exchange(*pg, 100, 4, DType::kF32);
        check(mapped_segments() == 2, "the pair did not share memory");
      },
      seconds(60)));
  EXPECT_FALSE(std::filesystem::exists(dead)) << dead << " was not swept";
  EXPECT_TRUE(std::filesystem::exists(alive)) << alive << " (a live process's) was swept";
  std::filesystem::remove(alive);
}

}  // namespace
}  // namespace tessel
