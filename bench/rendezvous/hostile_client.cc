// hostile_client: traffic a stranger without the job's token can send at a tessel store or
// rendezvous server, for the hostile-load test and bench/store_load --hostile. Every request
// carries a wrong token. Bounded in count and time; exits by itself.
//
//   hostile_client --target 127.0.0.1:PORT --big 8 --big-mib 250      # 8 concurrent 250 MiB Sets
//   hostile_client --target 127.0.0.1:PORT --flood 2000 --calls 10:40  # 2,000 connections
//
// Prints one line per phase: requests sent, how they ended (UNAUTHENTICATED, UNAVAILABLE: the
// connection was refused or closed, other) and how long the phase took. Exit 0 unless a
// request was accepted (which would be a bug in the server).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace {

const std::string kMethod = "/tessel.storepb.Store/Set";

// Tallies how requests ended; wait_all() blocks until `expected` have (bounded).
class Outcomes {
 public:
  void add(const grpc::Status& s) {
    std::lock_guard lock(mutex_);
    ++by_code_[s.error_code()];
    ++done_;
    cv_.notify_all();
  }
  bool wait_all(int expected, std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return done_ >= expected; });
  }
  int count(grpc::StatusCode code) {
    std::lock_guard lock(mutex_);
    return by_code_[code];
  }
  int done() {
    std::lock_guard lock(mutex_);
    return done_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<grpc::StatusCode, int> by_code_;
  int done_ = 0;
};

// A SetRequest {key = "k", value = <bytes zero bytes>} as protobuf wire bytes: the small header
// is copied, the value is one slice over `zeros` (untouched anonymous memory: the zero page).
grpc::ByteBuffer set_request(const char* zeros, size_t bytes) {
  std::string header = {0x0a, 0x01, 'k', 0x12};
  for (uint64_t v = bytes;; v >>= 7) {  // varint length
    header.push_back(static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
    if (v < 0x80) break;
  }
  grpc::Slice slices[2] = {grpc::Slice(header),
                           grpc::Slice(zeros, bytes, grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, bytes > 0 ? 2 : 1);
}

grpc::ChannelArguments private_connection() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  return args;
}

struct Call {
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
};

void report(const char* phase, int sent, Outcomes& o, double seconds, bool finished) {
  std::printf(
      "%s: %d requests, %d UNAUTHENTICATED, %d UNAVAILABLE (refused/closed), %d "
      "DEADLINE_EXCEEDED, %d OK, in %.2f s%s\n",
      phase, sent, o.count(grpc::StatusCode::UNAUTHENTICATED),
      o.count(grpc::StatusCode::UNAVAILABLE), o.count(grpc::StatusCode::DEADLINE_EXCEEDED),
      o.count(grpc::StatusCode::OK), seconds, finished ? "" : " (stopped waiting)");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string target, calls = "10:40";
  int big = 0, big_mib = 250, flood = 0, seconds = 30;
  CLI::App app{"hostile_client: wrong-token traffic at a tessel store/rendezvous server"};
  app.add_option("--target", target, "host:port of the server")->required();
  app.add_option("--big", big, "concurrent large requests");
  app.add_option("--big-mib", big_mib, "size of each large request in MiB");
  app.add_option("--flood", flood, "connections, each sending --calls small requests");
  app.add_option("--calls", calls, "requests per flood connection: N or MIN:MAX");
  app.add_option("--seconds", seconds, "deadline of every request and bound of each phase");
  CLI11_PARSE(app, argc, argv);

  // The flood needs a descriptor per connection.
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);

  const auto deadline = [&] {
    return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
  };
  const auto bound = std::chrono::seconds(seconds + 5);
  int accepted = 0;
  grpc::StubOptions options;

  if (big > 0) {
    const size_t bytes = size_t(big_mib) << 20;
    void* zeros = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (zeros == MAP_FAILED) return 2;
    Outcomes outcomes;
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    std::vector<std::unique_ptr<Call>> in_flight;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < big; ++i) {
      channels.push_back(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                                   private_connection()));
      grpc::GenericStub stub(channels.back());
      auto call = std::make_unique<Call>();
      call->context.AddMetadata("tessel-store-token", "not-the-token");
      call->context.set_deadline(deadline());
      call->request = set_request(static_cast<const char*>(zeros), bytes);
      stub.UnaryCall(&call->context, kMethod, options, &call->request, &call->response,
                     [&outcomes](grpc::Status s) { outcomes.add(s); });
      in_flight.push_back(std::move(call));
    }
    const bool finished = outcomes.wait_all(big, bound);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report(("big (" + std::to_string(big_mib) + " MiB each)").c_str(), big, outcomes, took,
           finished);
    accepted += outcomes.count(grpc::StatusCode::OK);
    for (auto& c : in_flight) c->context.TryCancel();
    outcomes.wait_all(big, std::chrono::seconds(5));
    in_flight.clear();
    munmap(zeros, bytes);
  }

  if (flood > 0) {
    const size_t colon = calls.find(':');
    const int lo = std::stoi(calls.substr(0, colon));
    const int hi = colon == std::string::npos ? lo : std::stoi(calls.substr(colon + 1));
    std::mt19937 rng(12345);
    std::uniform_int_distribution<int> per_connection(lo, hi);
    static const char kSmall[64] = {};
    Outcomes outcomes;
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    std::vector<std::unique_ptr<Call>> in_flight;
    int sent = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < flood; ++c) {
      channels.push_back(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                                   private_connection()));
      grpc::GenericStub stub(channels.back());
      const int n = per_connection(rng);
      for (int i = 0; i < n; ++i) {
        auto call = std::make_unique<Call>();
        call->context.AddMetadata("tessel-store-token", "not-the-token");
        call->context.set_deadline(deadline());
        call->request = set_request(kSmall, sizeof(kSmall));
        stub.UnaryCall(&call->context, kMethod, options, &call->request, &call->response,
                       [&outcomes](grpc::Status s) { outcomes.add(s); });
        in_flight.push_back(std::move(call));
        ++sent;
      }
    }
    const bool finished = outcomes.wait_all(sent, bound);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report(("flood (" + std::to_string(flood) + " connections)").c_str(), sent, outcomes, took,
           finished);
    accepted += outcomes.count(grpc::StatusCode::OK);
    for (auto& c : in_flight) c->context.TryCancel();
    outcomes.wait_all(sent, std::chrono::seconds(5));
    in_flight.clear();
  }
  return accepted == 0 ? 0 : 1;
}
