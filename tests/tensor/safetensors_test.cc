#include "tessel/tensor/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tessel/base/error.h"

namespace tessel {
namespace {

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "safetensors_test_" + name;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors byte string built by hand: little-endian length, header text, data.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// A tensor of `shape` whose bytes are a deterministic function of the seed.
Tensor patterned(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  std::mt19937 rng(seed);
  for (size_t i = 0; i < t.nbytes(); ++i) {
    p[i] = dtype == DType::kBool ? static_cast<uint8_t>(rng() & 1) : static_cast<uint8_t>(rng());
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// The message of the tessel::Error that `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class SafetensorsDTypeTest : public testing::TestWithParam<DType> {};

TEST_P(SafetensorsDTypeTest, RoundTripsThroughAFile) {
  const DType dtype = GetParam();
  TensorMap tensors = {
      {"scalar", patterned({}, dtype, 1)},        {"empty", patterned({0, 3}, dtype, 2)},
      {"one", patterned({1}, dtype, 3)},          {"odd", patterned({3, 5, 7}, dtype, 4)},
      {"large", patterned({1000, 33}, dtype, 5)},
  };
  const std::string path = temp_path(std::string(dtype_name(dtype)));
  save_safetensors(path, tensors, {{"step", "12"}, {"note", "x"}});
  SafetensorsFile loaded = load_safetensors(path);
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(loaded.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(loaded.tensors.at(name), t)) << name;
  }
  EXPECT_EQ(loaded.metadata, (std::map<std::string, std::string>{{"step", "12"}, {"note", "x"}}));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SafetensorsDTypeTest,
                         testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kI64,
                                         DType::kI32, DType::kBool),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(SafetensorsTest, MemoryAndFileFormsAgree) {
  TensorMap tensors = {{"a", patterned({4, 4}, DType::kF32, 7)}};
  const std::string bytes = serialize_safetensors(tensors);
  const std::string path = temp_path("agree");
  save_safetensors(path, tensors);
  std::ifstream in(path, std::ios::binary);
  const std::string on_disk((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(on_disk, bytes);
  // The data area starts 8-byte aligned.
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_TRUE(
      same_bytes(parse_safetensors(as_bytes(bytes), "<memory>").tensors.at("a"), tensors.at("a")));
}

TEST(SafetensorsTest, WritesStridedViewsInRowMajorOrder) {
  const std::vector<float> values = {0, 1, 2, 3, 4, 5};
  Tensor x = from_vector<float>(values, {2, 3});
  Tensor xt = x.as_strided({3, 2}, {1, 3}, 0);  // the transpose
  SafetensorsFile f = parse_safetensors(as_bytes(serialize_safetensors({{"t", xt}})), "<m>");
  const Tensor& t = f.tensors.at("t");
  ASSERT_EQ(t.shape(), (Shape{3, 2}));
  const float* p = t.data<float>();
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) EXPECT_EQ(p[i * 2 + j], values[j * 3 + i]);
  }
}

TEST(SafetensorsTest, ReadsAHandWrittenFile) {
  // Two tensors in the reference layout, written independently of the serializer; the header
  // lists them out of offset order and with spaces, as other writers may.
  const float w[2] = {1.5f, -2.0f};
  const int64_t ids[3] = {7, -1, 1LL << 40};
  std::string data(reinterpret_cast<const char*>(ids), sizeof(ids));
  data.append(reinterpret_cast<const char*>(w), sizeof(w));
  const std::string header =
      R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [24, 32]},)"
      R"( "__metadata__": {"format": "pt"},)"
      R"( "ids": {"dtype": "I64", "shape": [3, 1], "data_offsets": [0, 24]}}   )";
  SafetensorsFile f = parse_safetensors(as_bytes(make_file(header, data)), "<hand>");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors.at("w").data<float>()[1], -2.0f);
  EXPECT_EQ(f.tensors.at("ids").shape(), (Shape{3, 1}));
  EXPECT_EQ(f.tensors.at("ids").data<int64_t>()[2], 1LL << 40);
  EXPECT_EQ(f.metadata.at("format"), "pt");
}

TEST(SafetensorsTest, RejectsReservedNames) {
  EXPECT_THROW(serialize_safetensors({{"__metadata__", zeros({1})}}), InvalidArgument);
  EXPECT_THROW(serialize_safetensors({{"", zeros({1})}}), InvalidArgument);
}

TEST(SafetensorsTest, MissingFileIsAnIoError) {
  EXPECT_THROW(load_safetensors(temp_path("does_not_exist")), IoError);
}

// Each malformed file must give an InvalidArgument whose message names the file and contains
// the given phrase.
struct BadFile {
  std::string label;
  std::string bytes;
  std::string phrase;
};

std::vector<BadFile> bad_files() {
  const std::string eight(8, 'x');
  const std::string ok_entry = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  std::string huge(8, '\0');
  huge[7] = 0x10;  // 2^60
  std::string past_end = make_file("{}", "");
  past_end[0] = 100;
  return {
      {"empty", "", "too short"},
      {"short_length", "\x02\x00\x00", "too short"},
      {"header_past_end", past_end, "past the end"},
      {"header_too_large", huge + "{}", "exceeds"},
      {"truncated_json", make_file(R"({"a": {"dtype": "F32")", ""), "not valid JSON"},
      {"bad_json", make_file("{not json}", ""), "not valid JSON"},
      {"not_object", make_file("[1, 2]", ""), "must be a JSON object"},
      {"entry_not_object", make_file(R"({"a": 3})", ""), "must be an object"},
      {"unknown_dtype",
       make_file(R"({"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", eight),
       "unsupported dtype 'F64'"},
      {"missing_dtype", make_file(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", "xxxx"),
       "no string 'dtype'"},
      {"negative_size",
       make_file(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", eight),
       "not a non-negative integer"},
      {"float_size",
       make_file(R"({"a": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", eight),
       "not a non-negative integer"},
      {"offsets_out_of_range",
       make_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 80]}})", eight),
       "outside the 8-byte data area"},
      {"offsets_reversed",
       make_file(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", eight),
       "outside"},
      {"offsets_missing", make_file(R"({"a": {"dtype": "F32", "shape": [2]}})", eight),
       "data_offsets"},
      {"size_mismatch",
       make_file(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", eight),
       "needs 12 bytes"},
      {"huge_shape",
       make_file(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],)"
                 R"( "data_offsets": [0, 8]}})",
                 eight),
       "needs"},
      {"overlap",
       make_file(
           "{" + ok_entry + R"(, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
           eight),
       "overlap"},
      {"gap", make_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", eight),
       "gaps"},
      {"trailing_bytes", make_file("{" + ok_entry + "}", eight + "zz"), "trailing"},
      {"metadata_not_strings", make_file(R"({"__metadata__": {"k": 1}})", ""), "must be a string"},
  };
}

TEST(SafetensorsTest, RejectsMalformedFilesWithTheirName) {
  for (const BadFile& bad : bad_files()) {
    const std::string path = temp_path("bad_" + bad.label);
    write_file(path, bad.bytes);
    const std::string message = error_of([&] { load_safetensors(path); });
    EXPECT_NE(message.find("InvalidArgument"), std::string::npos) << bad.label << ": " << message;
    EXPECT_NE(message.find(path), std::string::npos) << bad.label << ": " << message;
    EXPECT_NE(message.find(bad.phrase), std::string::npos) << bad.label << ": " << message;
    // The in-memory parser gives the same verdict.
    const std::string memory_message =
        error_of([&] { parse_safetensors(as_bytes(bad.bytes), "<mem>"); });
    EXPECT_NE(memory_message.find(bad.phrase), std::string::npos)
        << bad.label << ": " << memory_message;
  }
}

// The index reader validates like the loader, and its absolute ranges address the bytes.
TEST(SafetensorsIndexTest, HeaderOnlyReadGivesAbsoluteByteRanges) {
  const std::string path = temp_path("index");
  const Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = from_vector<int32_t>({7, 8}, {2});
  save_safetensors(path, {{"b", b}, {"a", a}}, {{"k", "v"}});
  const SafetensorsIndex index = read_safetensors_index(path);
  EXPECT_EQ(index.metadata.at("k"), "v");
  ASSERT_EQ(index.entries.size(), 2u);
  const SafetensorsEntry& e = index.entries.at("a");
  EXPECT_EQ(e.shape, (Shape{2, 3}));
  EXPECT_EQ(e.end - e.begin, 24u);
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(e.begin + 4));
  float second = 0;
  in.read(reinterpret_cast<char*>(&second), 4);
  EXPECT_EQ(second, 2.0f);
  EXPECT_EQ(index.file_bytes, index.entries.at("b").end);
  for (const BadFile& bad : bad_files()) {
    write_file(path, bad.bytes);
    const std::string message = error_of([&] { read_safetensors_index(path); });
    EXPECT_NE(message.find(bad.phrase), std::string::npos) << bad.label << ": " << message;
  }
}

// A planned layout is byte for byte the header save_safetensors writes, with the data where
// the entries say.
TEST(SafetensorsIndexTest, PlannedLayoutMatchesTheWriter) {
  const Tensor a = from_vector<float>({1, 2, 3}, {3});
  const Tensor b = from_vector<int64_t>({4, 5}, {1, 2});
  const std::string bytes = serialize_safetensors({{"a", a}, {"b", b}}, {{"m", "x"}});
  const SafetensorsLayout layout = plan_safetensors(
      {{"b", DType::kI64, {1, 2}, 0, 0}, {"a", DType::kF32, {3}, 0, 0}}, {{"m", "x"}});
  EXPECT_EQ(layout.file_bytes, bytes.size());
  EXPECT_EQ(bytes.substr(0, layout.header.size()), layout.header);
  ASSERT_EQ(layout.entries.size(), 2u);
  EXPECT_EQ(layout.entries[0].name, "a");
  int64_t first_of_b = 0;
  std::memcpy(&first_of_b, bytes.data() + layout.entries[1].begin, 8);
  EXPECT_EQ(first_of_b, 4);
  EXPECT_THROW(plan_safetensors({{"a", DType::kF32, {1}, 0, 0}, {"a", DType::kF32, {1}, 0, 0}}),
               InvalidArgument);
}

TEST(SafetensorsTest, NonZeroBoolBytesLoadAsTrue) {
  const std::string bytes =
      make_file(R"({"m": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}})",
                std::string("\x00\x07\x01", 3));
  Tensor m = parse_safetensors(as_bytes(bytes), "<m>").tensors.at("m");
  const auto* p = static_cast<const uint8_t*>(m.data_ptr());
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[1], 1);
  EXPECT_EQ(p[2], 1);
}

// Bounded random mutation of a valid file: every variant either loads or throws a tessel::Error
// (never crashes or reads out of bounds; run under the asan preset to check the latter).
TEST(SafetensorsTest, SurvivesRandomCorruption) {
  const std::string valid = serialize_safetensors({{"a", patterned({3, 4}, DType::kF32, 1)},
                                                   {"b", patterned({5}, DType::kI64, 2)},
                                                   {"c", patterned({2, 2}, DType::kBool, 3)}},
                                                  {{"k", "v"}});
  std::mt19937 rng(12345);
  int loaded = 0;
  int rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string bytes = valid;
    switch (rng() % 3) {
      case 0:  // flip a few bytes (biased towards the header, where the structure lives)
        for (int k = 0, n = 1 + rng() % 4; k < n; ++k) {
          bytes[rng() % std::min<size_t>(bytes.size(), 200)] = static_cast<char>(rng());
        }
        break;
      case 1:  // truncate
        bytes.resize(rng() % bytes.size());
        break;
      default:  // overwrite one header digit with another
        for (size_t i = 8 + rng() % 150; i < bytes.size(); ++i) {
          if (bytes[i] >= '0' && bytes[i] <= '9') {
            bytes[i] = static_cast<char>('0' + rng() % 10);
            break;
          }
        }
    }
    try {
      parse_safetensors(as_bytes(bytes), "<fuzz>");
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, 4000);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace tessel
