#pragma once
// Token shard files: tessel's format (a 32-byte header, then uint16 or uint32 tokens) and
// llm.c's .bin shards (a 256 x int32 header, then tokens), read through one memory-mapped
// reader. The format is specified in docs/data.md.
//
//   data::write_token_shard("train_000000.bin", ids, {.token_bytes = 2, .vocab_size = 50257});
//   data::TokenShard shard("train_000000.bin");   // tessel's or llm.c's, by the magic
//   for (size_t i = 0; i < shard.size(); ++i) use(shard[i]);

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace tessel::data {

// tessel's shard header, little-endian, 32 bytes; tokens start at byte 32.
//   0  char[8]  magic "TSLTOKEN"
//   8  uint32   version (1)
//  12  uint32   token width in bytes (2 or 4)
//  16  uint64   token count
//  24  uint32   vocabulary size (0 if unknown); every token is below it
//  28  uint32   reserved, 0
inline constexpr char kShardMagic[8] = {'T', 'S', 'L', 'T', 'O', 'K', 'E', 'N'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 32;

// llm.c's header: 256 int32, [0] magic, [1] version, [2] token count; tokens at byte 1024.
// GPT-2 shards: magic 20240520, version 1, uint16 tokens. Llama 3 shards: magic 20240801,
// version 7, uint32 tokens (llm.c's dev/data/data_common.py).
inline constexpr int32_t kLlmcMagicGpt2 = 20240520;
inline constexpr int32_t kLlmcMagicLlama3 = 20240801;
inline constexpr size_t kLlmcHeaderBytes = 1024;

enum class ShardFormat { kTessel, kLlmc };

struct ShardWriteOptions {
  uint32_t token_bytes = 2;                   // 2 (ids below 65,536) or 4
  uint32_t vocab_size = 0;                    // recorded in the header; 0 = unknown
  ShardFormat format = ShardFormat::kTessel;  // kLlmc writes llm.c's GPT-2 (2) / Llama 3 (4) header
};

// Writes `tokens` as one shard at `path`, atomically (a temporary file in the same folder,
// renamed into place). Throws InvalidArgument naming the first token that does not fit the width
// or is not below vocab_size, IoError if the file cannot be written.
void write_token_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                       const ShardWriteOptions& options = {});

// A shard file mapped read-only. Opening checks the header against the file's size; every
// error (IoError, InvalidArgument) names the file and the byte offset of the bad field.
// Immutable after construction: reads are thread-safe. Movable, not copyable; unmaps on
// destruction.
class TokenShard {
 public:
  explicit TokenShard(const std::filesystem::path& path);
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  size_t size() const { return count_; }
  uint32_t token_bytes() const { return token_bytes_; }
  uint32_t vocab_size() const { return vocab_size_; }  // 0 if the header does not say
  ShardFormat format() const { return format_; }
  const std::filesystem::path& path() const { return path_; }

  uint32_t operator[](size_t i) const {
    return token_bytes_ == 2 ? reinterpret_cast<const uint16_t*>(tokens_)[i]
                             : reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  // Copies tokens [start, start + out.size()) into `out`; throws OutOfRange past the end.
  void read(size_t start, std::span<uint32_t> out) const;

 private:
  void unmap();

  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  size_t count_ = 0;
  uint32_t token_bytes_ = 2;
  uint32_t vocab_size_ = 0;
  ShardFormat format_ = ShardFormat::kTessel;
};

}  // namespace tessel::data
