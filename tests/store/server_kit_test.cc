// StoreServerKit: the job's Store served from a gRPC server the program builds itself (as
// tessel-run's rendezvous server does), with the kit's socket, token and limits.
#include "tessel/store/server_kit.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <thread>

#include "store_test_util.h"
#include "tessel/base/error.h"
#include "tessel/store/store_client.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;
using testing::client_options_for;
using testing::contains;
using testing::kTestToken;
using testing::wait_until;

// The program's own service (rendezvous, in tessel-run): here one that answers every method it
// receives with UNIMPLEMENTED.
class OwnService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Refuse final : public grpc::ServerGenericBidiReactor {
     public:
      Refuse() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "not this program's")); }
      void OnDone() override { delete this; }
    };
    return new Refuse;
  }
};

// A server built by the "program": the kit's parts plus a service of its own.
struct ProgramServer {
  explicit ProgramServer(bool host_store)
      : kit({.address = "127.0.0.1:0", .token = kTestToken, .host_store = host_store}) {
    grpc::ServerBuilder builder;
    kit.attach(builder);
    builder.RegisterCallbackGenericService(&own);
    server = builder.BuildAndStart();
    kit.start();
  }
  ~ProgramServer() {
    kit.stop_accepting();
    kit.stop_store();
    server->Shutdown(std::chrono::system_clock::now() + 1s);
    server->Wait();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(kit.port()); }

  StoreServerKit kit;
  OwnService own;
  std::unique_ptr<grpc::Server> server;
};

TEST(StoreServerKitTest, ServesTheStoreOnTheProgramsServer) {
  ProgramServer program(/*host_store=*/true);
  ASSERT_NE(program.server, nullptr);
  EXPECT_GT(program.kit.port(), 0);
  EXPECT_TRUE(program.kit.hosts_store());
  StoreClient client(client_options_for(program.address()));
  client.set("k", "v");
  EXPECT_EQ(client.get("k", 5s), "v");
  EXPECT_EQ(client.add("n", 3), 3);
  const StoreServerStats stats = program.kit.stats();
  EXPECT_EQ(stats.keys, 2u);
  EXPECT_GE(stats.connections, 1u);
  EXPECT_EQ(stats.unauthenticated_connections, 0u);  // the client's call carried the token
}

TEST(StoreServerKitTest, RefusesAWrongTokenOnTheHeaders) {
  ProgramServer program(/*host_store=*/true);
  try {
    // The client's first call (in its constructor) carries the token.
    StoreClient client(client_options_for(program.address(), std::string(kTestToken) + "x"));
    client.set("k", "v");
    FAIL() << "a call with a wrong token was served";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.message(), "UNAUTHENTICATED")) << e.what();
  }
  EXPECT_EQ(program.kit.stats().keys, 0u);
}

TEST(StoreServerKitTest, WithoutTheStoreItsCallsAreUnimplemented) {
  ProgramServer program(/*host_store=*/false);
  EXPECT_FALSE(program.kit.hosts_store());
  ASSERT_NE(program.server, nullptr);
  // The token is right, but nothing serves the Store: the client's first call is refused.
  EXPECT_THROW(StoreClient(client_options_for(program.address())), CommError);
  EXPECT_EQ(program.kit.stats().keys, 0u);
}

TEST(StoreServerKitTest, StopStoreFailsParkedCalls) {
  ProgramServer program(/*host_store=*/true);
  StoreClient client(client_options_for(program.address()));
  std::thread getter([&] {
    EXPECT_THROW(client.get("never", 60s), Error);  // the server stopped: not a 60 s wait
  });
  ASSERT_TRUE(wait_until([&] { return program.kit.stats().waiters > 0; }));
  program.kit.stop_store();
  getter.join();
}

TEST(StoreServerKitTest, BadOptionsAreNamed) {
  try {
    StoreServerKit kit({.address = "127.0.0.1:0", .token = ""});
    FAIL() << "an empty token was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.message(), "token")) << e.what();
  }
  EXPECT_THROW(StoreServerKit({.address = "no-port-here", .token = kTestToken}), Error);
  StoreServerKit kit({.address = "127.0.0.1:0", .token = kTestToken});
  grpc::ServerBuilder builder;
  kit.attach(builder);
  EXPECT_THROW(kit.attach(builder), InvalidArgument);
}

}  // namespace
}  // namespace tessel
