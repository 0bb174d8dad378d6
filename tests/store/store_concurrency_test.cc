// The gRPC store under many concurrent blocking calls, and when its server stops or cannot be
// reached: thousands of parked waits on a few threads; clear errors, never a hang.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "store_test_util.h"
#include "tessel/base/error.h"
#include "tessel/store/internal/store_service.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;
using testing::client_options_for;
using testing::contains;
using testing::kTestToken;
using testing::loopback_server_options;
using testing::thread_count;
using testing::wait_until;

// One Get in flight on gRPC's callback client API (no thread of ours waits for it).
struct AsyncGet {
  grpc::ClientContext context;
  storepb::GetRequest request;
  storepb::GetResponse response;
  grpc::Status status;
};

TEST(StoreConcurrencyTest, TwoThousandParkedWaitsUseFewThreads) {
  constexpr int kCalls = 2000;
  constexpr int kKeys = 97;
  StoreServer server(loopback_server_options());
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = storepb::Store::NewStub(channel);
  StoreClient setter(client_options_for(server.address()));
  setter.set("warm-up", "");  // gRPC's threads exist before the count
  const int threads_before = thread_count();

  std::mutex mutex;
  std::condition_variable all_done;
  int done = 0;
  std::vector<std::unique_ptr<AsyncGet>> calls;
  for (int i = 0; i < kCalls; ++i) {
    auto call = std::make_unique<AsyncGet>();
    call->context.AddMetadata(internal::kStoreTokenMetadata, kTestToken);
    call->context.set_deadline(std::chrono::system_clock::now() + 50s);
    call->request.add_keys(fmt::format("key{}", i % kKeys));
    call->request.set_timeout_ns(Nanoseconds(45s).count());
    call->request.set_want_values(true);
    AsyncGet* raw = call.get();
    stub->async()->Get(&raw->context, &raw->request, &raw->response, [&, raw](grpc::Status status) {
      raw->status = std::move(status);
      std::lock_guard lock(mutex);
      if (++done == kCalls) all_done.notify_all();
    });
    calls.push_back(std::move(call));
  }
  ASSERT_TRUE(wait_until([&] { return server.stats().waiters == kCalls; }))
      << server.stats().waiters << " of " << kCalls << " calls parked";
  const int threads_during = thread_count();
  std::printf("threads: %d before, %d with %d waits parked\n", threads_before, threads_during,
              kCalls);
  EXPECT_LE(threads_during - threads_before, 16)
      << threads_before << " threads before, " << threads_during << " with " << kCalls
      << " waits parked";

  for (int k = 0; k < kKeys; ++k) setter.set(fmt::format("key{}", k), fmt::format("value{}", k));
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(all_done.wait_for(lock, 40s, [&] { return done == kCalls; }))
        << done << " of " << kCalls << " calls completed";
  }
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(calls[i]->status.ok()) << i << ": " << calls[i]->status.error_message();
    ASSERT_EQ(calls[i]->response.values_size(), 1);
    EXPECT_EQ(calls[i]->response.values(0), fmt::format("value{}", i % kKeys));
  }
  EXPECT_EQ(server.stats().waiters, 0u);
}

TEST(StoreConcurrencyTest, CancelledCallLeavesNothingParked) {
  StoreServer server(loopback_server_options());
  auto stub = storepb::Store::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.AddMetadata(internal::kStoreTokenMetadata, kTestToken);
  context.set_deadline(std::chrono::system_clock::now() + 200ms);  // gives up long before
  storepb::GetRequest request;
  request.add_keys("never");
  request.set_timeout_ns(Nanoseconds(60s).count());  // the server would
  storepb::GetResponse response;
  EXPECT_EQ(stub->Get(&context, request, &response).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(wait_until([&] { return server.stats().waiters == 0; }));
}

TEST(StoreConcurrencyTest, ServerStoppedWhileClientsWaitGivesPeerLost) {
  constexpr int kWaiters = 6;
  StoreServer server(loopback_server_options());
  const std::string address = server.address();
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < kWaiters; ++i) {
    clients.push_back(std::make_unique<StoreClient>(client_options_for(address)));
  }
  std::vector<std::string> errors(kWaiters);
  std::vector<std::thread> threads;
  const Stopwatch elapsed;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      try {
        clients[i]->get("never", std::chrono::minutes(10));
        errors[i] = "returned";
      } catch (const PeerLost& e) {
        errors[i] = e.message();
      } catch (const std::exception& e) {
        errors[i] = std::string("wrong error: ") + e.what();
      }
    });
  }
  ASSERT_TRUE(wait_until([&] { return server.stats().waiters == kWaiters; }));
  server.stop();
  for (auto& t : threads) t.join();
  // Far inside the 10-minute timeout: the stop, not the timeout, ended the calls.
  EXPECT_LT(elapsed.elapsed(), std::chrono::minutes(1));
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(e, address)) << e;
    EXPECT_TRUE(contains(e, "stopped")) << e;
  }
  // Later calls on the same clients fail the same way instead of hanging.
  try {
    clients[0]->set("k", "v");
    FAIL() << "a set succeeded on a stopped server";
  } catch (const PeerLost& e) {
    EXPECT_TRUE(contains(e.message(), address)) << e.what();
  }
}

TEST(StoreConcurrencyTest, InProcessClientAfterStopGivesPeerLost) {
  StoreServer server(loopback_server_options());
  auto store = server.connect();
  store->set("k", "v");
  server.stop();
  EXPECT_THROW(store->get("k", 1s), PeerLost);
}

TEST(StoreConcurrencyTest, InProcessClientOutlivingItsServerGivesPeerLost) {
  std::shared_ptr<Store> store;
  {
    StoreServer server(loopback_server_options());
    store = server.connect();
    store->set("k", "v");
  }
  EXPECT_THROW(store->set("k", "v"), PeerLost);
  EXPECT_THROW(store->get("k", 1s), PeerLost);
  store.reset();  // releasing the channel after its server is gone is safe
}

TEST(StoreConcurrencyTest, ConnectAfterStopGivesPeerLost) {
  StoreServer server(loopback_server_options());
  server.stop();
  server.stop();  // idempotent
  EXPECT_THROW(server.connect(), PeerLost);
}

TEST(StoreConcurrencyTest, UnreachableAddressFailsAfterBoundedRetries) {
  std::string address;
  {
    StoreServer gone(loopback_server_options());  // a port that was free a moment ago
    address = gone.address();
  }
  StoreClientOptions options = client_options_for(address);
  options.connect_timeout = 500ms;
  const Stopwatch elapsed;
  try {
    StoreClient client(options);
    FAIL() << "connected to " << address << " with no server";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.message(), address)) << e.what();
    EXPECT_TRUE(contains(e.message(), "attempts")) << e.what();
  }
  // Bounded by connect_timeout plus one backoff window, far from a hang.
  EXPECT_LT(elapsed.elapsed(), 30s);
}

TEST(StoreConcurrencyTest, ManyThreadsShareOneClient) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 200;
  StoreServer server(loopback_server_options());
  StoreClient client(client_options_for(server.address()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) client.add("count", 1);
      client.set(fmt::format("done{}", t), "");
    });
  }
  std::vector<std::string> keys;
  for (int t = 0; t < kThreads; ++t) keys.push_back(fmt::format("done{}", t));
  client.wait(keys, 60s);
  for (auto& t : threads) t.join();
  EXPECT_EQ(client.add("count", 0), kThreads * kAdds);
}

}  // namespace
}  // namespace tessel
