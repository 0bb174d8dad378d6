#include "tessel/base/error.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace tessel {
namespace {

TEST(ErrorTest, WhatCarriesKindAndMessage) {
  const InvalidArgument e("mesh shape {3,4} has 12 ranks but the world has 8");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(e.message(), "mesh shape {3,4} has 12 ranks but the world has 8");
  EXPECT_STREQ(e.what(), "InvalidArgument: mesh shape {3,4} has 12 ranks but the world has 8");
}

TEST(ErrorTest, ThrowErrorRebuildsTheMatchingSubclass) {
  EXPECT_THROW(throw_error(ErrorKind::kTimeout, "t"), Timeout);
  EXPECT_THROW(throw_error(ErrorKind::kPeerLost, "p"), PeerLost);
  EXPECT_THROW(throw_error(ErrorKind::kCommError, "c"), CommError);
  EXPECT_THROW(throw_error(ErrorKind::kIoError, "i"), IoError);
  EXPECT_THROW(throw_error(ErrorKind::kUnavailable, "u"), Unavailable);
  try {
    throw_error(ErrorKind::kOutOfRange, "index 7 >= 5");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
    EXPECT_EQ(e.message(), "index 7 >= 5");
  }
}

TEST(ErrorTest, CheckMacroFormatsOnlyOnFailure) {
  int formatted = 0;
  auto count = [&] { return ++formatted; };
  TESSEL_CHECK(1 + 1 == 2, InvalidArgument, "never {}", count());
  EXPECT_EQ(formatted, 0);
  try {
    TESSEL_CHECK(false, OutOfRange, "index {} outside [0, {})", 9, 4);
    FAIL() << "TESSEL_CHECK did not throw";
  } catch (const OutOfRange& e) {
    EXPECT_EQ(e.message(), "index 9 outside [0, 4)");
  }
}

TEST(ErrorTest, SystemErrorNamesCallAndErrno) {
  try {
    throw_system_error("open(/nonexistent)", ENOENT);
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("open(/nonexistent)"), std::string::npos);
    EXPECT_NE(e.message().find("No such file"), std::string::npos);
    EXPECT_NE(e.message().find("errno 2"), std::string::npos);
  }
}

TEST(ErrorTest, EveryKindHasAName) {
  for (int k = 0; k <= static_cast<int>(ErrorKind::kInternal); ++k) {
    const auto name = error_kind_name(static_cast<ErrorKind>(k));
    EXPECT_FALSE(name.empty());
    EXPECT_NE(name, "Error") << "kind " << k << " has no name";
  }
}

}  // namespace
}  // namespace tessel
