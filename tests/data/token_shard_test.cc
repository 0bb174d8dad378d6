// Token shards: write/read round trips in both widths and both formats, llm.c's own shards
// (a committed file written as llm.c's script writes it), and corrupt, truncated or missing
// files, which must fail with the file's name and the offset of the bad field.

#include "tessel/data/token_shard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessel/base/error.h"

namespace tessel::data {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = DATA_FIXTURES;

class TokenShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("tessel_shard_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // Opening `p` fails with an error whose text contains every needle.
  void expect_open_error(const fs::path& p, std::vector<std::string> needles) {
    try {
      TokenShard shard(p);
      ADD_FAILURE() << "opened " << p << " without error";
    } catch (const Error& e) {
      needles.push_back(p.string());
      for (const auto& n : needles) {
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
            << "'" << n << "' not in: " << e.what();
      }
    }
  }

  fs::path dir_;
};

std::vector<uint32_t> sequence(size_t n, uint32_t modulo) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>((i * 2654435761u) % modulo);
  return v;
}

TEST_F(TokenShardTest, RoundTripBothWidthsAndFormats) {
  for (ShardFormat format : {ShardFormat::kTessel, ShardFormat::kLlmc}) {
    for (uint32_t width : {2u, 4u}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{100003}}) {
        const uint32_t vocab = width == 2 ? 50257 : 128256;
        const auto tokens = sequence(n, vocab);
        const fs::path p = dir_ / fmt::format("s_{}_{}_{}.bin", static_cast<int>(format), width, n);
        write_token_shard(p, tokens, {.token_bytes = width, .vocab_size = vocab, .format = format});
        TokenShard shard(p);
        EXPECT_EQ(shard.format(), format);
        EXPECT_EQ(shard.token_bytes(), width);
        EXPECT_EQ(shard.vocab_size(), format == ShardFormat::kTessel ? vocab : 0u);
        ASSERT_EQ(shard.size(), n);
        std::vector<uint32_t> back(n);
        shard.read(0, back);
        EXPECT_EQ(back, tokens) << p;
        const size_t header = format == ShardFormat::kTessel ? kShardHeaderBytes : kLlmcHeaderBytes;
        EXPECT_EQ(fs::file_size(p), header + n * width);
        if (n > 3) {
          std::vector<uint32_t> mid(3);
          shard.read(n - 3, mid);
          EXPECT_EQ(mid[2], tokens[n - 1]);
          EXPECT_THROW(shard.read(n - 2, mid), OutOfRange);
        }
      }
    }
  }
  // Nothing but the shards is left behind (the temporary files were renamed).
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST_F(TokenShardTest, HeaderBytesAreTheDocumentedOnes) {
  const fs::path p = dir_ / "h.bin";
  write_token_shard(p, std::vector<uint32_t>{1, 2, 65535}, {.token_bytes = 2, .vocab_size = 65536});
  const std::string b = read_bytes(p);
  ASSERT_EQ(b.size(), 32u + 6u);
  EXPECT_EQ(b.substr(0, 8), "TSLTOKEN");
  auto u32 = [&](size_t o) {
    uint32_t v;
    std::memcpy(&v, b.data() + o, 4);
    return v;
  };
  uint64_t count;
  std::memcpy(&count, b.data() + 16, 8);
  EXPECT_EQ(u32(8), 1u);
  EXPECT_EQ(u32(12), 2u);
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(u32(24), 65536u);
  EXPECT_EQ(u32(28), 0u);
  EXPECT_EQ(static_cast<unsigned char>(b[36]), 0xFF);
}

TEST_F(TokenShardTest, ReadsLlmcShardWrittenByItsScript) {
  TokenShard shard(kFixtures + "/llmc_gpt2.bin");
  std::ifstream in(kFixtures + "/llmc_gpt2.json");
  const auto expected = nlohmann::json::parse(in).get<std::vector<uint32_t>>();
  EXPECT_EQ(shard.format(), ShardFormat::kLlmc);
  EXPECT_EQ(shard.token_bytes(), 2u);
  ASSERT_EQ(shard.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(shard[i], expected[i]) << i;
}

TEST_F(TokenShardTest, WriterRefusesTokensThatDoNotFit) {
  const fs::path p = dir_ / "w.bin";
  try {
    write_token_shard(p, std::vector<uint32_t>{5, 70000}, {.token_bytes = 2});
    FAIL() << "wrote 70000 as a 2-byte token";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token 70000 at index 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_token_shard(p, std::vector<uint32_t>{9}, {.token_bytes = 4, .vocab_size = 9}),
               InvalidArgument);
  EXPECT_THROW(write_token_shard(p, std::vector<uint32_t>{}, {.token_bytes = 3}), InvalidArgument);
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(TokenShardTest, CorruptShardsNameTheFileAndOffset) {
  const fs::path good = dir_ / "good.bin";
  write_token_shard(good, sequence(100, 1000), {.token_bytes = 2, .vocab_size = 1000});
  const std::string bytes = read_bytes(good);

  const fs::path missing = dir_ / "missing.bin";
  expect_open_error(missing, {"cannot open token shard"});

  const fs::path empty = dir_ / "empty.bin";
  write_bytes(empty, "");
  expect_open_error(empty, {"truncated at offset 0"});

  const fs::path truncated = dir_ / "truncated.bin";
  write_bytes(truncated, bytes.substr(0, bytes.size() - 3));
  expect_open_error(truncated, {"ending at offset 232", "file ends at offset 229", "truncated"});

  const fs::path short_header = dir_ / "short_header.bin";
  write_bytes(short_header, bytes.substr(0, 20));
  expect_open_error(short_header, {"truncated at offset 20"});

  const fs::path trailing = dir_ / "trailing.bin";
  write_bytes(trailing, bytes + "xy");
  expect_open_error(trailing, {"trailing bytes", "offset 234"});

  std::string bad = bytes;
  bad[0] = 'X';
  const fs::path magic = dir_ / "magic.bin";
  write_bytes(magic, bad);
  expect_open_error(magic, {"unknown magic at offset 0"});

  bad = bytes;
  bad[8] = 9;
  const fs::path version = dir_ / "version.bin";
  write_bytes(version, bad);
  expect_open_error(version, {"version 9 at offset 8"});

  bad = bytes;
  bad[12] = 3;
  const fs::path width = dir_ / "width.bin";
  write_bytes(width, bad);
  expect_open_error(width, {"token width 3 at offset 12"});

  bad = bytes;
  bad[32 + 2 * 10] = static_cast<char>(0xE8);  // token 10 becomes >= 1000
  bad[32 + 2 * 10 + 1] = 0x03;
  const fs::path range = dir_ / "range.bin";
  write_bytes(range, bad);
  expect_open_error(range, {"token 1000 at offset 52", "vocabulary size 1000"});

  // llm.c's header: a version that does not go with the magic, a negative count, a cut file.
  const std::string llmc = read_bytes(kFixtures + "/llmc_gpt2.bin");
  bad = llmc;
  bad[4] = 2;
  const fs::path llmc_version = dir_ / "llmc_version.bin";
  write_bytes(llmc_version, bad);
  expect_open_error(llmc_version, {"llm.c version 2 at offset 4"});
  bad = llmc;
  bad[11] = static_cast<char>(0x80);
  const fs::path llmc_count = dir_ / "llmc_count.bin";
  write_bytes(llmc_count, bad);
  expect_open_error(llmc_count, {"negative token count", "offset 8"});
  const fs::path llmc_short = dir_ / "llmc_short.bin";
  write_bytes(llmc_short, llmc.substr(0, 600));
  expect_open_error(llmc_short, {"truncated at offset 600", "1024"});
  const fs::path llmc_cut = dir_ / "llmc_cut.bin";
  write_bytes(llmc_cut, llmc.substr(0, llmc.size() - 1));
  expect_open_error(llmc_cut, {"truncated"});
}

TEST_F(TokenShardTest, MovedShardStaysReadable) {
  const fs::path p = dir_ / "m.bin";
  write_token_shard(p, std::vector<uint32_t>{3, 1, 4}, {.token_bytes = 4});
  TokenShard a(p);
  TokenShard b(std::move(a));
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b[2], 4u);
  TokenShard c(p);
  c = std::move(b);
  EXPECT_EQ(c[0], 3u);
}

}  // namespace
}  // namespace tessel::data
