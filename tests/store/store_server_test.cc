// The Store served over gRPC: every operation on loopback, in-process and through PrefixStore;
// the token; size limits; timeouts; the worker environment.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "store_test_util.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/store/internal/store_service.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;
using testing::client_options_for;
using testing::contains;
using testing::kTestToken;
using testing::loopback_server_options;
using testing::wait_until;

// How the test reaches the server.
enum class Transport { kLoopback, kInProcess, kPrefixed };

class StoreOverGrpcTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    server_ = std::make_unique<StoreServer>(loopback_server_options());
    store_ = connect();
  }

  std::shared_ptr<Store> connect() {
    switch (GetParam()) {
      case Transport::kLoopback:
        return std::make_shared<StoreClient>(client_options_for(server_->address()));
      case Transport::kInProcess:
        return server_->connect();
      case Transport::kPrefixed:
        return std::make_shared<PrefixStore>(
            "group7", std::make_shared<StoreClient>(client_options_for(server_->address())));
    }
    return nullptr;
  }

  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreOverGrpcTest, SetGetOverwriteBinaryAndEmpty) {
  const std::string binary("\0k\xff\n", 4);
  store_->set("a", "1");
  EXPECT_EQ(store_->get("a", 5s), "1");
  store_->set("a", binary);
  EXPECT_EQ(store_->get("a", 5s), binary);
  store_->set(binary, "");
  EXPECT_EQ(store_->get(binary, 5s), "");
}

TEST_P(StoreOverGrpcTest, GetWaitsForASetFromAnotherClient) {
  auto other = connect();
  std::string got;
  std::thread getter([&] { got = store_->get("late", 30s); });
  // The getter is parked on the server before the key is set (one key per parked call).
  ASSERT_TRUE(wait_until([&] { return server_->stats().waiters > 0; }));
  other->set("late", "value");
  getter.join();
  EXPECT_EQ(got, "value");
}

TEST_P(StoreOverGrpcTest, AddCountsAcrossClients) {
  auto other = connect();
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(other->add("n", -2), 3);
  EXPECT_EQ(store_->add("n", 0), 3);
  store_->set("text", "abc");
  EXPECT_THROW(store_->add("text", 1), InvalidArgument);
}

TEST_P(StoreOverGrpcTest, CompareSetSwapsOnlyOnMatch) {
  EXPECT_EQ(store_->compare_set("k", "", "first"), "first");   // missing key, empty expected
  EXPECT_EQ(store_->compare_set("k", "wrong", "x"), "first");  // mismatch: current value
  EXPECT_EQ(store_->compare_set("k", "first", "second"), "second");
  EXPECT_EQ(store_->get("k", 1s), "second");
  EXPECT_EQ(store_->compare_set("absent", "something", "x"), "");  // missing, non-empty expected
  EXPECT_FALSE(store_->check({"absent"}));
}

TEST_P(StoreOverGrpcTest, CheckDeleteAndWait) {
  EXPECT_TRUE(store_->check({}));
  EXPECT_FALSE(store_->check({"x"}));
  store_->set("x", "1");
  store_->set("y", "2");
  EXPECT_TRUE(store_->check({"x", "y"}));
  store_->wait({"x", "y"}, 5s);
  EXPECT_TRUE(store_->delete_key("x"));
  EXPECT_FALSE(store_->delete_key("x"));
  EXPECT_FALSE(store_->check({"x", "y"}));
  EXPECT_THROW(store_->wait({"x", "y"}, 10ms), Timeout);
}

TEST_P(StoreOverGrpcTest, MultiSetAndMultiGet) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < 37; ++i) {
    keys.push_back(fmt::format("k{}", i));
    values.push_back(std::string(static_cast<size_t>(i), static_cast<char>('a' + i % 26)));
  }
  store_->multi_set(keys, values);
  EXPECT_EQ(store_->multi_get(keys, 5s), values);
  EXPECT_TRUE(store_->multi_get({}, 5s).empty());
  EXPECT_THROW(store_->multi_set({"a", "b"}, {"1"}), InvalidArgument);
}

TEST_P(StoreOverGrpcTest, MultiGetWaitsForEveryKey) {
  auto other = connect();
  std::vector<std::string> got;
  std::thread getter([&] { got = store_->multi_get({"p", "q"}, 30s); });
  ASSERT_TRUE(wait_until([&] { return server_->stats().waiters > 0; }));
  other->set("p", "1");
  other->set("q", "2");
  getter.join();
  EXPECT_EQ(got, (std::vector<std::string>{"1", "2"}));
}

TEST_P(StoreOverGrpcTest, TimeoutsNameTheMissingKeys) {
  store_->set("here", "");
  try {
    store_->wait({"here", "gone1", "gone2"}, 20ms);
    FAIL() << "wait returned for keys nobody set";
  } catch (const Timeout& e) {
    EXPECT_TRUE(contains(e.message(), "gone1'")) << e.what();
    EXPECT_TRUE(contains(e.message(), "gone2'")) << e.what();
  }
  try {
    store_->get("never", 0ms);
    FAIL() << "get returned for a key nobody set";
  } catch (const Timeout& e) {
    EXPECT_TRUE(contains(e.message(), "never'")) << e.what();
  }
  EXPECT_EQ(server_->stats().waiters, 0u);  // timed-out calls leave nothing parked
}

INSTANTIATE_TEST_SUITE_P(Transports, StoreOverGrpcTest,
                         ::testing::Values(Transport::kLoopback, Transport::kInProcess,
                                           Transport::kPrefixed),
                         [](const auto& info) {
                           switch (info.param) {
                             case Transport::kLoopback:
                               return std::string("Loopback");
                             case Transport::kInProcess:
                               return std::string("InProcess");
                             case Transport::kPrefixed:
                               return std::string("Prefixed");
                           }
                           return std::string();
                         });

TEST(StoreServerTest, PrefixStoreKeysLandUnderThePrefix) {
  StoreServer server(loopback_server_options());
  auto client = std::make_shared<StoreClient>(client_options_for(server.address()));
  PrefixStore group("dp0", client);
  group.set("rank", "3");
  EXPECT_EQ(client->get("dp0/rank", 1s), "3");
  EXPECT_FALSE(client->check({"rank"}));
}

TEST(StoreServerTest, ReportsTheAddressItBound) {
  StoreServer server(loopback_server_options());
  EXPECT_GT(server.port(), 0);
  EXPECT_EQ(server.address(), "127.0.0.1:" + std::to_string(server.port()));
  EXPECT_EQ(server.token(), kTestToken);
}

TEST(StoreServerTest, MakesARandomTokenWhenGivenNone) {
  StoreServerOptions options = loopback_server_options();
  options.token.clear();
  StoreServer a(options), b(options);
  EXPECT_EQ(a.token().size(), 64u);
  EXPECT_NE(a.token(), b.token());
  StoreClient client(client_options_for(a.address(), a.token()));
  client.set("k", "v");
  EXPECT_EQ(client.get("k", 1s), "v");
}

TEST(StoreServerTest, RejectsMalformedAddresses) {
  for (const char* address : {"127.0.0.1", "127.0.0.1:99999", ":4000", "host:port"}) {
    StoreServerOptions options = loopback_server_options();
    options.address = address;
    EXPECT_THROW(StoreServer server(options), InvalidArgument) << address;
  }
}

TEST(StoreServerTest, AddressInUseIsAnIoErrorNamingIt) {
  StoreServer first(loopback_server_options());
  StoreServerOptions options = loopback_server_options();
  options.address = first.address();
  try {
    StoreServer second(options);
    FAIL() << "two servers bound " << first.address();
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.message(), first.address())) << e.what();
  }
  StoreClient client(client_options_for(first.address()));  // the first still serves
  client.set("k", "v");
}

TEST(StoreServerTest, InProcessOnlyServerHasNoAddress) {
  StoreServerOptions options = loopback_server_options();
  options.address.clear();
  StoreServer server(options);
  EXPECT_TRUE(server.address().empty());
  auto store = server.connect();
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
}

TEST(StoreAuthTest, CallWithoutTokenIsUnauthenticated) {
  StoreServer server(loopback_server_options());
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = storepb::Store::NewStub(channel);
  storepb::SetRequest request;
  request.set_key("k");
  storepb::SetResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 10s);
  EXPECT_EQ(stub->Set(&context, request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  storepb::GetRequest get;
  get.add_keys("k");
  get.set_timeout_ns(Nanoseconds(10s).count());
  storepb::GetResponse got;
  grpc::ClientContext get_context;
  get_context.set_deadline(std::chrono::system_clock::now() + 10s);
  EXPECT_EQ(stub->Get(&get_context, get, &got).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server.stats().keys, 0u);
  EXPECT_EQ(server.stats().waiters, 0u);
}

TEST(StoreAuthTest, WrongTokenIsRefusedWithoutEchoingIt) {
  StoreServer server(loopback_server_options());
  const std::string wrong = std::string(kTestToken) + "x";
  for (const std::string& token :
       {wrong, std::string(kTestToken).substr(1), std::string("zq-wrong-zq")}) {
    try {
      StoreClient client(client_options_for(server.address(), token));  // its first call fails
      client.set("k", "v");
      FAIL() << "a client with a wrong token was served";
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e.message(), "UNAUTHENTICATED")) << e.what();
      EXPECT_TRUE(contains(e.message(), server.address())) << e.what();
      EXPECT_FALSE(contains(e.message(), token)) << e.what();
      EXPECT_FALSE(contains(e.message(), kTestToken)) << e.what();
    }
  }
  EXPECT_EQ(server.stats().keys, 0u);
}

TEST(StoreAuthTest, ClientWithoutTokenIsRejectedLocally) {
  StoreClientOptions options = client_options_for("127.0.0.1:1", "");
  EXPECT_THROW(StoreClient client(options), InvalidArgument);
}

// A server with small limits, and a loopback client for it.
struct LimitedStore {
  explicit LimitedStore(StoreLimits limits) {
    StoreServerOptions options = loopback_server_options();
    options.limits = limits;
    server = std::make_unique<StoreServer>(options);
    client = std::make_unique<StoreClient>(client_options_for(server->address()));
  }
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<StoreClient> client;
};

template <typename ErrorType, typename F>
void expect_error_naming(F&& call, const std::string& limit) {
  try {
    call();
    FAIL() << "no error; expected one naming " << limit;
  } catch (const ErrorType& e) {
    EXPECT_TRUE(contains(e.message(), limit)) << e.what();
  }
}

TEST(StoreLimitsTest, KeyAndValueSizes) {
  StoreLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  LimitedStore store(limits);
  store.client->set("12345678", std::string(16, 'v'));  // exactly at both limits
  expect_error_naming<InvalidArgument>([&] { store.client->set("123456789", "v"); },
                                       "max_key_bytes limit is 8");
  expect_error_naming<InvalidArgument>([&] { store.client->set("k", std::string(17, 'v')); },
                                       "max_value_bytes limit is 16");
  expect_error_naming<InvalidArgument>(
      [&] { store.client->compare_set("k", "", std::string(17, 'v')); }, "max_value_bytes");
  expect_error_naming<InvalidArgument>(
      [&] {
        store.client->multi_set({"a", "b"}, {"1", std::string(17, 'v')});
      },
      "max_value_bytes");
  expect_error_naming<InvalidArgument>([&] { store.client->get("123456789", 1s); },
                                       "max_key_bytes");
  EXPECT_FALSE(store.client->check({"a"}));  // the refused multi_set stored nothing
}

TEST(StoreLimitsTest, NumberOfKeys) {
  StoreLimits limits;
  limits.max_keys = 3;
  limits.max_keys_per_call = 4;
  LimitedStore store(limits);
  store.client->multi_set({"a", "b"}, {"1", "2"});
  store.client->add("c", 1);
  store.client->set("a", "overwrite is fine");
  expect_error_naming<CommError>([&] { store.client->set("d", "1"); }, "max_keys limit");
  expect_error_naming<CommError>(
      [&] {
        store.client->multi_set({"a", "e"}, {"1", "2"});
      },
      "max_keys limit");
  expect_error_naming<InvalidArgument>(
      [&] {
        store.client->check({"1", "2", "3", "4", "5"});
      },
      "max_keys_per_call limit is 4");
  EXPECT_TRUE(store.client->delete_key("c"));
  store.client->set("d", "1");  // room again
  EXPECT_EQ(store.server->stats().keys, 3u);
}

TEST(StoreLimitsTest, OutstandingWaits) {
  StoreLimits limits;
  limits.max_waiters = 2;
  LimitedStore store(limits);
  std::vector<std::thread> waiters;
  std::vector<std::string> got(2);
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&, i] { got[i] = store.client->get("gate", 30s); });
  }
  ASSERT_TRUE(wait_until([&] { return store.server->stats().waiters >= 2; }));
  expect_error_naming<CommError>([&] { store.client->wait({"gate"}, 30s); }, "max_waiters limit");
  // Calls that need not wait are still served at the limit.
  store.client->set("here", "1");
  EXPECT_EQ(store.client->get("here", 30s), "1");
  store.client->set("gate", "open");
  for (auto& t : waiters) t.join();
  EXPECT_EQ(got, (std::vector<std::string>{"open", "open"}));
}

TEST(StoreLimitsTest, OutstandingWaitsFreeUpWhenKeysArrive) {
  StoreLimits limits;
  limits.max_waiters = 1;
  LimitedStore store(limits);
  std::string got;
  std::thread waiter([&] { got = store.client->get("gate", 30s); });
  ASSERT_TRUE(wait_until([&] { return store.server->stats().waiters >= 1; }));
  expect_error_naming<CommError>([&] { store.client->get("other", 30s); }, "max_waiters");
  store.client->set("gate", "open");
  waiter.join();
  EXPECT_EQ(got, "open");
  EXPECT_EQ(store.server->stats().waiters, 0u);
  std::thread second([&] { got = store.client->get("other", 30s); });
  ASSERT_TRUE(wait_until([&] { return store.server->stats().waiters >= 1; }));
  store.client->set("other", "fine");
  second.join();
  EXPECT_EQ(got, "fine");
}

TEST(StoreClientEnvTest, ReadsAddressAndTokenFromTheEnvironment) {
  StoreServer server(loopback_server_options());
  ::setenv("TESSEL_STORE_ADDR", server.address().c_str(), 1);
  ::setenv("TESSEL_STORE_TOKEN", kTestToken, 1);
  auto store = store_client_from_env();
  store->set("env", "ok");
  EXPECT_EQ(store->get("env", 1s), "ok");
  ::unsetenv("TESSEL_STORE_TOKEN");
  ::unsetenv("TESSEL_STORE_ADDR");
}

TEST(StoreClientEnvTest, ReadsTheTokenFromAFile) {
  StoreServer server(loopback_server_options());
  const std::string path = ::testing::TempDir() + "/store_token";
  std::ofstream(path) << "  " << kTestToken << "\n";
  ::setenv("TESSEL_STORE_ADDR", server.address().c_str(), 1);
  ::unsetenv("TESSEL_STORE_TOKEN");
  ::setenv("TESSEL_STORE_TOKEN_FILE", path.c_str(), 1);
  auto store = store_client_from_env();
  store->set("file", "ok");
  EXPECT_EQ(server.connect()->get("file", 1s), "ok");
  ::unsetenv("TESSEL_STORE_TOKEN_FILE");
  ::unsetenv("TESSEL_STORE_ADDR");
}

TEST(StoreClientEnvTest, MissingVariablesAreNamed) {
  ::unsetenv("TESSEL_STORE_ADDR");
  ::unsetenv("TESSEL_STORE_TOKEN");
  ::unsetenv("TESSEL_STORE_TOKEN_FILE");
  expect_error_naming<InvalidArgument>([] { store_client_options_from_env(); },
                                       "TESSEL_STORE_ADDR");
  ::setenv("TESSEL_STORE_ADDR", "127.0.0.1:1", 1);
  expect_error_naming<InvalidArgument>([] { store_client_options_from_env(); },
                                       "TESSEL_STORE_TOKEN");
  ::setenv("TESSEL_STORE_TOKEN_FILE", "/nonexistent/token", 1);
  expect_error_naming<IoError>([] { store_client_options_from_env(); }, "/nonexistent/token");
  ::unsetenv("TESSEL_STORE_TOKEN_FILE");
  ::unsetenv("TESSEL_STORE_ADDR");
}

TEST(StoreClientEnvTest, TokenIsHiddenFromKnobListings) {
  ::setenv("TESSEL_STORE_TOKEN", "zq-secret-zq", 1);
  ::setenv("TESSEL_STORE_ADDR", "10.1.2.3:4567", 1);
  const std::string listing = env_knobs_text();
  EXPECT_FALSE(contains(listing, "zq-secret-zq")) << listing;
  EXPECT_TRUE(contains(listing, "10.1.2.3:4567")) << listing;  // only the token is hidden
  ::unsetenv("TESSEL_STORE_TOKEN");
  ::unsetenv("TESSEL_STORE_ADDR");
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

TEST(StoreLimitsTest, AddRefusesToOverflowACounter) {
  StoreServer server(loopback_server_options());
  StoreClient client(client_options_for(server.address()));
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(client.add("c", max - 1), max - 1);
  try {
    client.add("c", 5);
    FAIL() << "add past INT64_MAX wrapped around";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.message(), "overflows")) << e.what();
  }
  EXPECT_EQ(client.add("c", 0), max - 1);
  EXPECT_EQ(client.add("d", std::numeric_limits<int64_t>::min()),
            std::numeric_limits<int64_t>::min());
  EXPECT_THROW(client.add("d", -1), InvalidArgument);
}

// Strangers' connections (no call with the token) are held to a few per address; the job's
// own clients, which make a call with the token as soon as they connect, are never refused.
TEST(StoreAuthTest, StrangersConnectionsAreLimitedTheJobsAreNot) {
  StoreServerOptions options = loopback_server_options();
  options.limits.max_unauthenticated_connections_per_peer = 4;
  StoreServer server(options);
  std::vector<int> strangers;
  for (int i = 0; i < 20; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    strangers.push_back(fd);
  }
  ASSERT_TRUE(wait_until([&] { return server.stats().refused_connections >= 16; }))
      << server.stats().refused_connections << " refused";
  EXPECT_LE(server.stats().unauthenticated_connections, 4u);
  std::vector<std::unique_ptr<StoreClient>> job;
  for (int i = 0; i < 12; ++i) {
    job.push_back(std::make_unique<StoreClient>(client_options_for(server.address())));
  }
  for (int i = 0; i < 12; ++i) job[static_cast<size_t>(i)]->set(fmt::format("k{}", i), "v");
  EXPECT_EQ(server.stats().keys, 12u);
  EXPECT_GE(server.stats().connections, 12u);
  for (int fd : strangers) ::close(fd);
}

// TLS with certificates made by openssl for this test (a CA, the server's for 127.0.0.1, a
// client's).
class StoreTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("openssl version >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "openssl is not installed: cannot make test certificates";
    }
    char templ[] = "/tmp/tessel-store-tls-XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script = fmt::format(
        "cd {0} && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && "
        "openssl req -x509 {1} -keyout ca.key -out ca.crt -days 2 -subj /CN=tessel-test-ca && "
        "openssl req {1} -keyout server.key -out server.csr -subj /CN=127.0.0.1 && "
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
        "-out server.crt -days 2 -extfile san.ext && "
        "openssl req {1} -keyout client.key -out client.csr -subj /CN=tessel-test-client && "
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
        "-out client.crt -days 2",
        dir_, key);
    ASSERT_EQ(std::system((script + " >/dev/null 2>&1").c_str()), 0) << script;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string file(const char* name) const { return dir_ + "/" + name; }
  StoreClientOptions client(const std::string& address, TlsFiles tls) const {
    StoreClientOptions o = client_options_for(address);
    o.tls = std::move(tls);
    o.connect_timeout = std::chrono::milliseconds(1500);
    return o;
  }
  std::string dir_;
};

TEST_F(StoreTlsTest, ServerCertificateEncryptsAndTheTokenStillCounts) {
  StoreServerOptions options = loopback_server_options();
  options.tls = {file("server.crt"), file("server.key"), ""};
  StoreServer server(options);
  StoreClient good(client(server.address(), {"", "", file("ca.crt")}));
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
  EXPECT_THROW(StoreClient(client(server.address(), {})), CommError);  // plaintext: no
  StoreClientOptions wrong_token = client(server.address(), {"", "", file("ca.crt")});
  wrong_token.token = "not-the-token";
  EXPECT_THROW(StoreClient{wrong_token}, CommError);
}

TEST_F(StoreTlsTest, MutualTlsRequiresAClientCertificate) {
  StoreServerOptions options = loopback_server_options();
  options.tls = {file("server.crt"), file("server.key"), file("ca.crt")};
  StoreServer server(options);
  EXPECT_THROW(StoreClient(client(server.address(), {"", "", file("ca.crt")})), CommError);
  StoreClient good(
      client(server.address(), {file("client.crt"), file("client.key"), file("ca.crt")}));
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
}

TEST_F(StoreTlsTest, UnreadableFilesAreNamed) {
  StoreServerOptions options = loopback_server_options();
  options.tls = {file("missing.crt"), file("server.key"), ""};
  try {
    StoreServer server(options);
    FAIL() << "a missing certificate was accepted";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.message(), "missing.crt")) << e.what();
  }
}

}  // namespace
}  // namespace tessel
