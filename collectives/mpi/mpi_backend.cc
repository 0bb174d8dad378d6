#include "tessel/collectives/mpi/mpi_backend.h"

// The C API only: keep Open MPI / MPICH from pulling in their deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <numeric>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/internal/reduce.h"

namespace tessel {
namespace {

// Checks an MPI return code (communicators use MPI_ERRORS_RETURN) and throws CommError with
// MPI's own text.
void mpi_check(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw CommError(fmt::format("{} failed: {} (code {})", call, std::string(text, length), rc));
}

int to_int(int64_t count, std::string_view what) {
  TESSEL_CHECK(count <= INT_MAX, InvalidArgument,
               "MPI {}: {} elements exceed the MPI count limit {}", what, count, INT_MAX);
  return static_cast<int>(count);
}

// Reductions MPI lacks (bf16, f16, bool) as user ops calling tessel's reduce functions.
template <DType D, ReduceOp O>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  internal::reduce_into(D, O, inout, in, *len);
}

constexpr ReduceOp kBaseOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin,
                                 ReduceOp::kProduct};

// MPI's lifetime in this process: initialised with MPI_THREAD_MULTIPLE on first use, user ops
// created then, both released at exit (when tessel initialised MPI).
class MpiRuntime {
 public:
  static MpiRuntime& get() {
    static MpiRuntime runtime;
    return runtime;
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& per_dtype : user_ops_) {
      for (MPI_Op& op : per_dtype) {
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
      }
    }
    if (owns_) MPI_Finalize();
  }

  // The MPI op for `op` (kAvg as kSum) on `dtype`.
  MPI_Op op_for(DType dtype, ReduceOp op) const {
    if (op == ReduceOp::kAvg) op = ReduceOp::kSum;
    const int slot = static_cast<int>(op == ReduceOp::kSum   ? 0
                                      : op == ReduceOp::kMax ? 1
                                      : op == ReduceOp::kMin ? 2
                                                             : 3);
    switch (dtype) {
      case DType::kBF16:
        return user_ops_[0][slot];
      case DType::kF16:
        return user_ops_[1][slot];
      case DType::kBool:
        return user_ops_[2][slot];
      default:
        break;
    }
    static constexpr MPI_Op kBuiltin[] = {MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD};
    return kBuiltin[slot];
  }

 private:
  MpiRuntime() {
    int initialized = 0;
    mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                "MPI_Init_thread");
      owns_ = true;
    } else {
      mpi_check(MPI_Query_thread(&provided), "MPI_Query_thread");
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      throw Unavailable(fmt::format(
          "MPI provides thread level {} but tessel needs MPI_THREAD_MULTIPLE ({}): process "
          "groups run on their callers' and worker threads",
          provided, MPI_THREAD_MULTIPLE));
    }
    create_ops<DType::kBF16>(0);
    create_ops<DType::kF16>(1);
    create_ops<DType::kBool>(2);
  }

  template <DType D>
  void create_ops(int row) {
    MPI_User_function* fns[] = {&user_reduce<D, ReduceOp::kSum>, &user_reduce<D, ReduceOp::kMax>,
                                &user_reduce<D, ReduceOp::kMin>,
                                &user_reduce<D, ReduceOp::kProduct>};
    for (int i = 0; i < 4; ++i)
      mpi_check(MPI_Op_create(fns[i], 1, &user_ops_[row][i]), "MPI_Op_create");
  }

  bool owns_ = false;
  MPI_Op user_ops_[3][4] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                            {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                            {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
};

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;
    case DType::kBool:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

// Owns a communicator (MPI_COMM_WORLD is duplicated so tessel's traffic never mixes with the
// program's own).
class MpiComm {
 public:
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }
  ~MpiComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_;
};

// Byte counts and displacements for the v-collectives.
struct ByteLayout {
  std::vector<int> counts, displs;
  ByteLayout(std::span<const int64_t> elements, size_t element_size, std::string_view what) {
    int64_t offset = 0;
    for (int64_t e : elements) {
      counts.push_back(to_int(e * static_cast<int64_t>(element_size), what));
      displs.push_back(to_int(offset, what));
      offset += e * static_cast<int64_t>(element_size);
    }
  }
};

class MpiBackend final : public CommBackend {
 public:
  explicit MpiBackend(std::unique_ptr<MpiComm> comm) : comm_(std::move(comm)) {
    mpi_check(MPI_Comm_rank(comm_->get(), &rank_), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(comm_->get(), &size_), "MPI_Comm_size");
  }

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(Tensor& t, ReduceOp op, const OpContext&) override {
    if (t.numel() == 0) return;
    mpi_check(
        MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), to_int(t.numel(), "all_reduce"),
                      mpi_type(t.dtype()), MpiRuntime::get().op_for(t.dtype(), op), comm_->get()),
        "MPI_Allreduce");
    if (op == ReduceOp::kAvg) internal::divide_by(t.dtype(), t.data_ptr(), t.numel(), size_);
  }

  void broadcast(Tensor& t, int root, const OpContext&) override {
    if (t.nbytes() == 0) return;
    mpi_check(MPI_Bcast(t.data_ptr(), to_int(static_cast<int64_t>(t.nbytes()), "broadcast"),
                        MPI_BYTE, root, comm_->get()),
              "MPI_Bcast");
  }

  void all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts,
                  const OpContext&) override {
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    if (even) {
      const int bytes = to_int(static_cast<int64_t>(in.nbytes()), "all_gather");
      mpi_check(MPI_Allgather(in.data_ptr(), bytes, MPI_BYTE, out.data_ptr(), bytes, MPI_BYTE,
                              comm_->get()),
                "MPI_Allgather");
      return;
    }
    ByteLayout layout(counts, in.element_size(), "all_gather");
    mpi_check(MPI_Allgatherv(in.data_ptr(), layout.counts[rank_], MPI_BYTE, out.data_ptr(),
                             layout.counts.data(), layout.displs.data(), MPI_BYTE, comm_->get()),
              "MPI_Allgatherv");
  }

  void reduce_scatter(const Tensor& in, Tensor& out, std::span<const int64_t> counts, ReduceOp op,
                      const OpContext&) override {
    std::vector<int> recv;
    for (int64_t c : counts) recv.push_back(to_int(c, "reduce_scatter"));
    if (in.numel() == 0) return;
    mpi_check(MPI_Reduce_scatter(in.data_ptr(), out.data_ptr(), recv.data(), mpi_type(in.dtype()),
                                 MpiRuntime::get().op_for(in.dtype(), op), comm_->get()),
              "MPI_Reduce_scatter");
    if (op == ReduceOp::kAvg) internal::divide_by(out.dtype(), out.data_ptr(), out.numel(), size_);
  }

  void all_to_all(const Tensor& in, Tensor& out, std::span<const int64_t> send_counts,
                  std::span<const int64_t> recv_counts, const OpContext&) override {
    ByteLayout send(send_counts, in.element_size(), "all_to_all");
    ByteLayout recv(recv_counts, out.element_size(), "all_to_all");
    mpi_check(MPI_Alltoallv(in.data_ptr(), send.counts.data(), send.displs.data(), MPI_BYTE,
                            out.data_ptr(), recv.counts.data(), recv.displs.data(), MPI_BYTE,
                            comm_->get()),
              "MPI_Alltoallv");
  }

  void send(const Tensor& t, int peer, int tag, const OpContext&) override {
    mpi_check(MPI_Send(t.data_ptr(), to_int(static_cast<int64_t>(t.nbytes()), "send"), MPI_BYTE,
                       peer, tag, comm_->get()),
              "MPI_Send");
  }

  void recv(Tensor& t, int peer, int tag, const OpContext&) override {
    MPI_Status status;
    mpi_check(MPI_Recv(t.data_ptr(), to_int(static_cast<int64_t>(t.nbytes()), "recv"), MPI_BYTE,
                       peer, tag, comm_->get(), &status),
              "MPI_Recv");
    int received = 0;
    mpi_check(MPI_Get_count(&status, MPI_BYTE, &received), "MPI_Get_count");
    TESSEL_CHECK(static_cast<size_t>(received) == t.nbytes(), InvalidArgument,
                 "recv from rank {} tag {}: {} bytes arrived, the tensor holds {}", peer, tag,
                 received, t.nbytes());
  }

  void barrier(const OpContext&) override { mpi_check(MPI_Barrier(comm_->get()), "MPI_Barrier"); }

  std::unique_ptr<CommBackend> split(const SplitRequest& request) override {
    MPI_Comm sub = MPI_COMM_NULL;
    // MPI orders a colour's members by (key, old rank), exactly as ProcessGroup computed.
    mpi_check(
        MPI_Comm_split(comm_->get(), request.color == kNoColor ? MPI_UNDEFINED : request.color,
                       request.key, &sub),
        "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiBackend>(std::make_unique<MpiComm>(sub));
  }

 private:
  std::unique_ptr<MpiComm> comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool mpi::is_available() { return true; }

std::shared_ptr<ProcessGroup> mpi::create_world(ProcessGroupOptions options) {
  MpiRuntime::get();
  MPI_Comm dup = MPI_COMM_NULL;
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  auto backend = std::make_unique<MpiBackend>(std::make_unique<MpiComm>(dup));
  std::vector<int> ranks(static_cast<size_t>(backend->size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  log_debug(LogComponent::kCollectives, "mpi world: rank {} of {}", backend->rank(),
            backend->size());
  return std::make_shared<ProcessGroup>(std::move(backend), std::move(options), std::move(ranks));
}

}  // namespace tessel
