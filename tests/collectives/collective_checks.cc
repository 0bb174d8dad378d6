#include "collective_checks.h"

#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "tessel/collectives/internal/reduce.h"
#include "tessel/tensor/ops.h"

namespace tessel::testing {
namespace {

double get(const Tensor& t, int64_t i) {
  const void* p = t.data_ptr();
  switch (t.dtype()) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return static_cast<float>(static_cast<const BFloat16*>(p)[i]);
    case DType::kF16:
      return static_cast<float>(static_cast<const Half*>(p)[i]);
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(p)[i];
    case DType::kBool:
      return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

void put(Tensor& t, int64_t i, double v) {
  void* p = t.data_ptr();
  switch (t.dtype()) {
    case DType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case DType::kBF16:
      static_cast<BFloat16*>(p)[i] = BFloat16(static_cast<float>(v));
      return;
    case DType::kF16:
      static_cast<Half*>(p)[i] = Half(static_cast<float>(v));
      return;
    case DType::kI64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      return;
    case DType::kI32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      return;
    case DType::kBool:
      static_cast<uint8_t*>(p)[i] = v != 0;
      return;
  }
}

// Small integers keep sums exact in bf16 for up to 8 ranks; products stay powers of two.
double value(int rank, int64_t i) { return static_cast<double>((rank * 7 + i * 3) % 11) - 5; }
double product_value(int rank, int64_t i) {
  static constexpr double kValues[] = {1, 2, -1};
  return kValues[(rank + i) % 3];
}

double reduce_values(ReduceOp op, int size, int64_t i, DType dtype) {
  if (op == ReduceOp::kProduct) {
    double p = 1;
    for (int r = 0; r < size; ++r) p *= product_value(r, i);
    return p;
  }
  double acc = value(0, i);
  for (int r = 1; r < size; ++r) {
    const double v = value(r, i);
    if (op == ReduceOp::kMax)
      acc = std::max(acc, v);
    else if (op == ReduceOp::kMin)
      acc = std::min(acc, v);
    else
      acc += v;
  }
  if (op != ReduceOp::kAvg) return acc;
  if (dtype == DType::kI64 || dtype == DType::kI32) {
    return static_cast<double>(static_cast<int64_t>(acc) / size);
  }
  return static_cast<float>(acc) / static_cast<float>(size);
}

// The value as the dtype stores it.
double as_dtype(DType dtype, double v) {
  const float f = static_cast<float>(v);
  switch (dtype) {
    case DType::kF32:
      return f;
    case DType::kBF16:
      return static_cast<float>(BFloat16(f));
    case DType::kF16:
      return static_cast<float>(Half(f));
    case DType::kI64:
      return static_cast<double>(static_cast<int64_t>(v));
    case DType::kI32:
      return static_cast<int32_t>(v);
    case DType::kBool:
      return v != 0;
  }
  return v;
}

// Values written on the host, then moved to `device`.
Tensor filled(DType dtype, int64_t n, const std::function<double(int64_t)>& f, Device device) {
  Tensor t = empty({n}, dtype, Device::cpu());
  for (int64_t i = 0; i < n; ++i) put(t, i, f(i));
  return to(t, device);
}

void expect_equal(const Tensor& t, const std::function<double(int64_t)>& expected,
                  std::string_view what, int rank) {
  const Tensor host = to(t, Device::cpu());  // waits for the device
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double want = as_dtype(t.dtype(), expected(i));
    const double got = get(host, i);
    if (got != want) {
      throw CheckFailure(fmt::format("{} {} n={} on {} rank {}: element {} is {}, expected {}",
                                     what, dtype_name(t.dtype()), t.numel(), t.device().str(), rank,
                                     i, got, want));
    }
  }
}

}  // namespace

std::vector<int64_t> acceptance_counts(bool large) {
  std::vector<int64_t> counts = {0, 1, 37};
  if (large) counts.push_back(1 << 20);
  return counts;
}

void check_all_reduce(ProcessGroup& pg, DType dtype, int64_t count, ReduceOp op, Device device) {
  const int rank = pg.rank();
  Tensor t = filled(
      dtype, count,
      [&](int64_t i) { return op == ReduceOp::kProduct ? product_value(rank, i) : value(rank, i); },
      device);
  pg.all_reduce(t, {.op = op});
  expect_equal(
      t, [&](int64_t i) { return reduce_values(op, pg.size(), i, dtype); },
      fmt::format("all_reduce({})", reduce_op_name(op)), rank);
}

void check_broadcast(ProcessGroup& pg, DType dtype, int64_t count, int root, Device device) {
  Tensor t = filled(
      dtype, count, [&](int64_t i) { return value(pg.rank(), i); }, device);
  pg.broadcast(t, {.root = root});
  expect_equal(
      t, [&](int64_t i) { return value(root, i); }, "broadcast", pg.rank());
}

void check_all_gather(ProcessGroup& pg, DType dtype, int64_t count, bool uneven, Device device) {
  std::vector<int64_t> counts;
  for (int r = 0; r < pg.size(); ++r) counts.push_back(uneven ? count + r : count);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  Tensor in = filled(
      dtype, counts[pg.rank()], [&](int64_t i) { return value(pg.rank(), i); }, device);
  Tensor out = zeros({total}, dtype, device);
  if (uneven) {
    pg.all_gather(in, out, {.counts = counts});
  } else {
    pg.all_gather(in, out);
  }
  expect_equal(
      out,
      [&](int64_t i) {
        int r = 0;
        while (i >= counts[r]) i -= counts[r++];
        return value(r, i);
      },
      uneven ? "all_gather(uneven)" : "all_gather", pg.rank());
}

void check_reduce_scatter(ProcessGroup& pg, DType dtype, int64_t count, bool uneven, ReduceOp op,
                          Device device) {
  std::vector<int64_t> counts;
  for (int r = 0; r < pg.size(); ++r) counts.push_back(uneven ? count + r : count);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t offset = std::accumulate(counts.begin(), counts.begin() + pg.rank(), int64_t{0});
  Tensor in = filled(
      dtype, total, [&](int64_t i) { return value(pg.rank(), i); }, device);
  Tensor out = zeros({counts[pg.rank()]}, dtype, device);
  pg.reduce_scatter(in, out, {.op = op, .counts = counts});
  expect_equal(
      out, [&](int64_t i) { return reduce_values(op, pg.size(), offset + i, dtype); },
      uneven ? "reduce_scatter(uneven)" : "reduce_scatter", pg.rank());
}

void check_all_to_all(ProcessGroup& pg, DType dtype, int64_t count, Device device) {
  const int size = pg.size(), rank = pg.rank();
  // Rank r sends count + j elements to rank j; element k of that chunk depends on (r, j, k).
  auto element = [&](int src, int dst, int64_t k) {
    return static_cast<double>((src * 5 + dst * 3 + k) % 13) - 6;
  };
  std::vector<int64_t> send, recv;
  for (int j = 0; j < size; ++j) {
    send.push_back(count + j);
    recv.push_back(count + rank);
  }
  std::vector<double> chunks;
  for (int j = 0; j < size; ++j) {
    for (int64_t k = 0; k < send[j]; ++k) chunks.push_back(element(rank, j, k));
  }
  Tensor in = filled(
      dtype, static_cast<int64_t>(chunks.size()),
      [&](int64_t i) { return chunks[static_cast<size_t>(i)]; }, device);
  Tensor out = zeros({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, dtype, device);
  pg.all_to_all(in, out, {.send_counts = send, .recv_counts = recv});
  expect_equal(
      out,
      [&](int64_t i) {
        return element(static_cast<int>(i / (count + rank)), rank, i % (count + rank));
      },
      "all_to_all", rank);
}

void check_all_to_all_views(ProcessGroup& pg, DType dtype, int64_t rows) {
  const int size = pg.size(), rank = pg.rank();
  // Rank r holds a [rows + r, W] matrix and sends rank j its columns [c_j, c_j + 8 + j): a
  // strided block whose element k (row-major) depends on (r, j, k).
  auto element = [&](int src, int dst, int64_t k) {
    return static_cast<double>((src * 5 + dst * 3 + k) % 13) - 6;
  };
  auto width = [](int j) { return int64_t{8} + j; };
  std::vector<int64_t> column(static_cast<size_t>(size) + 1, 0);
  for (int j = 0; j < size; ++j) column[j + 1] = column[j] + width(j);
  Tensor matrix = empty({rows + rank, column[size]}, dtype);
  std::vector<Tensor> inputs, outputs;
  for (int j = 0; j < size; ++j) {
    inputs.push_back(narrow(matrix, 1, column[j], width(j)));
    Tensor block = contiguous(inputs.back());
    for (int64_t k = 0; k < block.numel(); ++k) put(block, k, element(rank, j, k));
    copy_(inputs.back(), block);
  }
  // Rank j's block arrives as a [rows + j, width(rank)] view: rows of a contiguous tensor for
  // even j (received in place), a transposed slice for odd j (unpacked element by element).
  int64_t all_rows = 0;
  for (int j = 0; j < size; ++j) all_rows += rows + j;
  Tensor by_rows = zeros({all_rows, width(rank)}, dtype);
  Tensor by_columns = zeros({width(rank), all_rows}, dtype);
  int64_t row = 0;
  for (int j = 0; j < size; ++j) {
    outputs.push_back(j % 2 == 0 ? narrow(by_rows, 0, row, rows + j)
                                 : transpose(narrow(by_columns, 1, row, rows + j), 0, 1));
    row += rows + j;
  }
  const std::vector<Tensor> received = outputs;
  pg.all_to_all(std::move(inputs), std::move(outputs));
  for (int j = 0; j < size; ++j) {
    expect_equal(
        contiguous(received[j]), [&](int64_t k) { return element(j, rank, k); },
        fmt::format("all_to_all(views) from rank {}", j), rank);
  }
}

void check_send_recv_ring(ProcessGroup& pg, DType dtype, int64_t count, Device device) {
  const int size = pg.size(), rank = pg.rank();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  Tensor out = filled(
      dtype, count, [&](int64_t i) { return value(rank, i); }, device);
  Tensor in = zeros({count}, dtype, device);
  // Sends may block until the peer posts its receive (gloo, MPI), so even ranks send first and
  // odd ranks receive first; an odd ring's two adjacent even ranks still unwind from rank 1.
  if (rank % 2 == 0) {
    pg.send(out, next, {.tag = 5});
    pg.recv(in, prev, {.tag = 5});
  } else {
    pg.recv(in, prev, {.tag = 5});
    pg.send(out, next, {.tag = 5});
  }
  expect_equal(
      in, [&](int64_t i) { return value(prev, i); }, "send/recv ring", rank);
}

void check_split(ProcessGroup& pg, int colors, bool with_no_color, Device device) {
  const int rank = pg.rank(), size = pg.size();
  const bool out = with_no_color && rank == size - 1;
  const int color = out ? kNoColor : rank % colors;
  auto sub = pg.split(color, -rank);
  if (out) {
    if (sub != nullptr) throw CheckFailure("split: a kNoColor rank got a group");
    return;
  }
  if (sub == nullptr) throw CheckFailure(fmt::format("split: rank {} got no group", rank));
  // Members: ranks with my colour (excluding the opted-out one), in reverse order of old rank.
  std::vector<int> members;
  for (int r = size - 1; r >= 0; --r) {
    if (r % colors == color && !(with_no_color && r == size - 1)) members.push_back(r);
  }
  const int expected_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  if (sub->size() != static_cast<int>(members.size()) || sub->rank() != expected_rank ||
      sub->global_ranks() != members) {
    throw CheckFailure(fmt::format("split: rank {} got rank {} of {}, expected {} of {}", rank,
                                   sub->rank(), sub->size(), expected_rank, members.size()));
  }
  Tensor t = to(from_vector<int64_t>({static_cast<int64_t>(rank)}), device);
  sub->all_reduce(t);
  const int64_t want = std::accumulate(members.begin(), members.end(), int64_t{0});
  const int64_t got = to_vector<int64_t>(t).front();
  if (got != want) {
    throw CheckFailure(fmt::format("split: sub-group sum is {}, expected {}", got, want));
  }
}

void check_async_batch(ProcessGroup& pg, DType dtype, int64_t count, Device device) {
  const int rank = pg.rank();
  std::vector<Tensor> tensors;
  std::vector<Work> works;
  for (int k = 0; k < 8; ++k) {
    tensors.push_back(filled(
        dtype, count, [&](int64_t i) { return value(rank, i + k); }, device));
    works.push_back(pg.all_reduce(tensors.back(), {.async = true}));
  }
  for (int k = 0; k < 8; ++k) {
    works[k].wait(std::chrono::seconds(60));
    expect_equal(
        tensors[k],
        [&](int64_t i) { return reduce_values(ReduceOp::kSum, pg.size(), i + k, dtype); },
        fmt::format("async all_reduce #{}", k), rank);
  }
}

void check_one_million(ProcessGroup& pg, Device device) {
  const int size = pg.size();
  const int64_t n = 1 << 20;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
    check_all_reduce(pg, dtype, n, ReduceOp::kSum, device);
    check_broadcast(pg, dtype, n, 0, device);
    check_all_gather(pg, dtype, n / size, false, device);
    check_reduce_scatter(pg, dtype, n / size, true, ReduceOp::kSum, device);
    check_all_to_all(pg, dtype, n / (size * size), device);
    if (device.is_cpu()) check_all_to_all_views(pg, dtype, n / (size * (8 + size)));
    if (size > 1) check_send_recv_ring(pg, dtype, n, device);
  }
}

void check_everything(ProcessGroup& pg, const std::vector<int64_t>& counts, Device device) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
    for (int64_t count : counts) {
      for (ReduceOp op :
           {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct}) {
        check_all_reduce(pg, dtype, count, op, device);
      }
      check_broadcast(pg, dtype, count, pg.size() - 1, device);
      check_all_gather(pg, dtype, count, false, device);
      check_all_gather(pg, dtype, count, true, device);
      check_reduce_scatter(pg, dtype, count, false, ReduceOp::kSum, device);
      check_reduce_scatter(pg, dtype, count, true, ReduceOp::kMax, device);
      check_reduce_scatter(pg, dtype, count, true, ReduceOp::kAvg, device);
      check_all_to_all(pg, dtype, count, device);
      if (device.is_cpu()) check_all_to_all_views(pg, dtype, count);
      if (pg.size() > 1) check_send_recv_ring(pg, dtype, count, device);
      check_async_batch(pg, dtype, count, device);
      pg.barrier();
    }
  }
}

}  // namespace tessel::testing
