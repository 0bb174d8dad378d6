// A build without gRPC: the store server and client say so at run time instead of failing to
// link, and the environment helpers still work.
#include <gtest/gtest.h>

#include "tessel/base/error.h"
#include "tessel/store/store_client.h"
#include "tessel/store/store_server.h"

namespace tessel {
namespace {

TEST(StoreStubTest, ServerAndClientAreUnavailable) {
  EXPECT_FALSE(StoreServer::is_available());
  EXPECT_FALSE(StoreClient::is_available());
  EXPECT_THROW(StoreServer server(StoreServerOptions{}), Unavailable);
  StoreClientOptions options;
  options.address = "127.0.0.1:1";
  options.token.assign(8, 't');
  EXPECT_THROW(StoreClient client(options), Unavailable);
}

TEST(StoreStubTest, TokensStillWork) {
  const std::string a = generate_store_token(), b = generate_store_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace tessel
