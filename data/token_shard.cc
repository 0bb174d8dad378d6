#include "tessel/data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/base/unique_fd.h"

namespace tessel::data {

namespace {

template <typename T>
void put(std::vector<unsigned char>& buf, size_t offset, T value) {
  static_assert(std::endian::native == std::endian::little, "shards are little-endian");
  std::memcpy(buf.data() + offset, &value, sizeof(T));
}

template <typename T>
T get(const unsigned char* p, size_t offset) {
  T value;
  std::memcpy(&value, p + offset, sizeof(T));
  return value;
}

}  // namespace

void write_token_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                       const ShardWriteOptions& options) {
  const uint32_t width = options.token_bytes;
  TESSEL_CHECK(width == 2 || width == 4, InvalidArgument,
               "{}: token width {} bytes; expected 2 or 4", path.string(), width);
  const uint64_t limit =
      options.vocab_size ? options.vocab_size : (width == 2 ? 65536ull : 1ull << 32);
  TESSEL_CHECK(width == 4 || limit <= 65536, InvalidArgument,
               "{}: vocabulary size {} does not fit 2-byte tokens; use 4", path.string(),
               options.vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    TESSEL_CHECK(tokens[i] < limit, InvalidArgument,
                 "{}: token {} at index {} is not below {} ({})", path.string(), tokens[i], i,
                 limit, options.vocab_size ? "the vocabulary size" : "the 2-byte limit");
  }
  std::vector<unsigned char> header;
  if (options.format == ShardFormat::kTessel) {
    header.assign(kShardHeaderBytes, 0);
    std::memcpy(header.data(), kShardMagic, sizeof(kShardMagic));
    put<uint32_t>(header, 8, kShardVersion);
    put<uint32_t>(header, 12, width);
    put<uint64_t>(header, 16, tokens.size());
    put<uint32_t>(header, 24, options.vocab_size);
  } else {
    TESSEL_CHECK(tokens.size() <= INT32_MAX, InvalidArgument,
                 "{}: {} tokens do not fit llm.c's int32 count", path.string(), tokens.size());
    header.assign(kLlmcHeaderBytes, 0);
    put<int32_t>(header, 0, width == 2 ? kLlmcMagicGpt2 : kLlmcMagicLlama3);
    put<int32_t>(header, 4, width == 2 ? 1 : 7);
    put<int32_t>(header, 8, static_cast<int32_t>(tokens.size()));
  }

  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw_system_error(fmt::format("cannot create shard {}", tmp.string()), errno);
    out.write(reinterpret_cast<const char*>(header.data()),
              static_cast<std::streamsize>(header.size()));
    if (width == 4) {
      out.write(reinterpret_cast<const char*>(tokens.data()),
                static_cast<std::streamsize>(tokens.size_bytes()));
    } else {
      std::vector<uint16_t> narrow(std::min<size_t>(tokens.size(), 1 << 20));
      for (size_t i = 0; i < tokens.size(); i += narrow.size()) {
        const size_t n = std::min(narrow.size(), tokens.size() - i);
        for (size_t k = 0; k < n; ++k) narrow[k] = static_cast<uint16_t>(tokens[i + k]);
        out.write(reinterpret_cast<const char*>(narrow.data()),
                  static_cast<std::streamsize>(n * 2));
      }
    }
    out.flush();
    if (!out) {
      const int err = errno;
      std::filesystem::remove(tmp);
      throw_system_error(fmt::format("cannot write shard {}", tmp.string()), err);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw IoError(
        fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message()));
  }
}

TokenShard::TokenShard(const std::filesystem::path& path) : path_(path) {
  const std::string name = path.string();
  UniqueFd fd(::open(name.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_system_error(fmt::format("cannot open token shard {}", name), errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_system_error(fmt::format("cannot stat {}", name), errno);
  const auto file_bytes = static_cast<size_t>(st.st_size);
  TESSEL_CHECK(file_bytes >= 8, InvalidArgument,
               "token shard {}: truncated at offset {}: {} bytes cannot hold a header", name,
               file_bytes, file_bytes);
  map_bytes_ = file_bytes;
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw_system_error(fmt::format("cannot map token shard {}", name), errno);
  }
  try {
    const auto* p = static_cast<const unsigned char*>(map_);
    size_t header_bytes = 0;
    if (std::memcmp(p, kShardMagic, sizeof(kShardMagic)) == 0) {
      format_ = ShardFormat::kTessel;
      header_bytes = kShardHeaderBytes;
      TESSEL_CHECK(file_bytes >= header_bytes, InvalidArgument,
                   "token shard {}: truncated at offset {}: the header needs {} bytes", name,
                   file_bytes, header_bytes);
      const auto version = get<uint32_t>(p, 8);
      TESSEL_CHECK(version == kShardVersion, InvalidArgument,
                   "token shard {}: version {} at offset 8; this build reads version {}", name,
                   version, kShardVersion);
      token_bytes_ = get<uint32_t>(p, 12);
      TESSEL_CHECK(token_bytes_ == 2 || token_bytes_ == 4, InvalidArgument,
                   "token shard {}: token width {} at offset 12; expected 2 or 4", name,
                   token_bytes_);
      count_ = get<uint64_t>(p, 16);
      vocab_size_ = get<uint32_t>(p, 24);
    } else {
      const auto magic = get<int32_t>(p, 0);
      const auto version = get<int32_t>(p, 4);
      TESSEL_CHECK(magic == kLlmcMagicGpt2 || magic == kLlmcMagicLlama3, InvalidArgument,
                   "token shard {}: unknown magic at offset 0 (bytes {:02x} {:02x} {:02x} {:02x}); "
                   "expected \"TSLTOKEN\" (tessel) or llm.c's {} / {}",
                   name, p[0], p[1], p[2], p[3], kLlmcMagicGpt2, kLlmcMagicLlama3);
      format_ = ShardFormat::kLlmc;
      header_bytes = kLlmcHeaderBytes;
      TESSEL_CHECK(file_bytes >= header_bytes, InvalidArgument,
                   "token shard {}: truncated at offset {}: llm.c's header needs {} bytes", name,
                   file_bytes, header_bytes);
      const int32_t expected_version = magic == kLlmcMagicGpt2 ? 1 : 7;
      TESSEL_CHECK(version == expected_version, InvalidArgument,
                   "token shard {}: llm.c version {} at offset 4; magic {} goes with version {}",
                   name, version, magic, expected_version);
      token_bytes_ = magic == kLlmcMagicGpt2 ? 2 : 4;
      const auto count = get<int32_t>(p, 8);
      TESSEL_CHECK(count >= 0, InvalidArgument,
                   "token shard {}: negative token count {} at offset 8", name, count);
      count_ = static_cast<size_t>(count);
    }
    const bool overflow = count_ > (SIZE_MAX - header_bytes) / token_bytes_;
    const size_t expected_end = overflow ? SIZE_MAX : header_bytes + count_ * token_bytes_;
    TESSEL_CHECK(expected_end == file_bytes, InvalidArgument,
                 "token shard {}: the header says {} tokens of {} bytes (ending at offset {}), but "
                 "the file ends at offset {} ({})",
                 name, count_, token_bytes_, expected_end, file_bytes,
                 expected_end > file_bytes ? "truncated" : "trailing bytes");
    tokens_ = p + header_bytes;
    if (vocab_size_ != 0) {
      for (size_t i = 0; i < count_; ++i) {
        const uint32_t t = (*this)[i];
        TESSEL_CHECK(t < vocab_size_, InvalidArgument,
                     "token shard {}: token {} at offset {} is not below the header's vocabulary "
                     "size {}",
                     name, t, header_bytes + i * token_bytes_, vocab_size_);
      }
    }
  } catch (...) {
    unmap();
    throw;
  }
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      token_bytes_(other.token_bytes_),
      vocab_size_(other.vocab_size_),
      format_(other.format_) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
    token_bytes_ = other.token_bytes_;
    vocab_size_ = other.vocab_size_;
    format_ = other.format_;
  }
  return *this;
}

TokenShard::~TokenShard() { unmap(); }

void TokenShard::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
}

void TokenShard::read(size_t start, std::span<uint32_t> out) const {
  TESSEL_CHECK(start <= count_ && out.size() <= count_ - start, OutOfRange,
               "token shard {}: tokens [{}, {}) requested but it holds {}", path_.string(), start,
               start + out.size(), count_);
  for (size_t i = 0; i < out.size(); ++i) out[i] = (*this)[start + i];
}

}  // namespace tessel::data
