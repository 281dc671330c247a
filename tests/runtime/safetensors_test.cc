// Safetensors header validation: a valid file round-trips; every malformed header is rejected
// with a CheckpointError naming the file (and the tensor where there is one); random mutations of
// a valid image never crash.
#include "runtime/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "runtime/json_lite.h"

namespace twinstep {
namespace {

std::vector<std::byte> image(const std::string& header, size_t data_bytes, uint64_t size_field = 0,
                             bool override_size = false) {
  std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{0});
  const uint64_t n = override_size ? size_field : header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = std::byte(uint8_t(n >> (8 * i)));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string error_of(const std::string& header, size_t data_bytes) {
  try {
    parse_safetensors_image(image(header, data_bytes), "f.safetensors");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

const char* kValid =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})";

TEST(Safetensors, ParsesValidHeader) {
  const SafetensorsHeader h = parse_safetensors_image(image(kValid, 20), "f");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.tensors[1].begin, 12u);
  EXPECT_EQ(h.tensors[1].end, 20u);
  ASSERT_EQ(h.metadata.size(), 1u);
  EXPECT_EQ(h.metadata[0].second, "pt");
}

TEST(Safetensors, ScalarAndEmptyTensors) {
  const std::string hdr =
      R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"BF16","shape":[0,5],"data_offsets":[4,4]}})";
  const SafetensorsHeader h = parse_safetensors_image(image(hdr, 4), "f");
  EXPECT_EQ(h.tensors.size(), 2u);
}

struct Bad {
  const char* label;
  std::string header;
  size_t data;
  const char* expect;  // substring of the message
};

TEST(Safetensors, RejectsMalformedHeaders) {
  const std::vector<Bad> cases = {
      {"not json", "{", 0, "malformed"},
      {"not an object", "[1,2]", 0, "not a JSON object"},
      {"entry not object", R"({"a":3})", 0, "tensor \"a\": entry is not an object"},
      {"missing offsets", R"({"a":{"dtype":"BF16","shape":[1]}})", 2, "needs dtype"},
      {"unknown dtype", R"({"a":{"dtype":"BF17","shape":[1],"data_offsets":[0,2]}})", 2,
       "unknown dtype"},
      {"dtype not string", R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,2]}})", 2, "string"},
      {"negative dim", R"({"a":{"dtype":"BF16","shape":[-1],"data_offsets":[0,2]}})", 2,
       "non-negative"},
      {"fractional dim", R"({"a":{"dtype":"BF16","shape":[1.5],"data_offsets":[0,2]}})", 2,
       "non-negative integer"},
      {"huge dim", R"({"a":{"dtype":"BF16","shape":[99999999999999999999],"data_offsets":[0,2]}})",
       2, "64 bits"},
      {"overflowing product",
       R"({"a":{"dtype":"F64","shape":[1099511627776,1099511627776],"data_offsets":[0,2]}})", 2,
       "overflows"},
      {"size mismatch", R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", 4,
       "6 bytes but data_offsets span 4"},
      {"end before begin", R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[4,2]}})", 4,
       "< begin"},
      {"past the end", R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})", 4,
       "run past the data section"},
      {"offsets wrong arity", R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0]}})", 2,
       "[begin, end]"},
      {"offset too big",
       R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[18446744073709551616,2]}})", 2,
       "64 bits"},
      {"overlap",
       R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}})",
       6, "overlaps"},
      {"hole",
       R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]}})",
       6, "hole"},
      {"trailing bytes", R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})", 8,
       "trailing"},
      {"duplicate key",
       R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"a":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}})",
       4, "duplicate key"},
      {"unknown field", R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2],"x":1}})", 2,
       "unknown field"},
      {"metadata not strings", R"({"__metadata__":{"k":1}})", 0, "not a string"},
      {"deep nesting", std::string(100, '[') + std::string(100, ']'), 0, "nesting"},
      {"empty name", R"({"":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})", 2, "empty"},
      {"bad escape", R"({"a\q":1})", 0, "escape"},
  };
  for (const Bad& c : cases) {
    const std::string msg = error_of(c.header, c.data);
    EXPECT_NE(msg.find("f.safetensors"), std::string::npos) << c.label << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.label << ": " << msg;
  }
}

TEST(Safetensors, RejectsBadSizeField) {
  EXPECT_THROW(parse_safetensors_image(std::vector<std::byte>(5), "f"), CheckpointError);
  EXPECT_THROW(parse_safetensors_image(image(kValid, 20, 1000, true), "f"), CheckpointError);
  EXPECT_THROW(parse_safetensors_image(image(kValid, 20, ~uint64_t{0}, true), "f"),
               CheckpointError);
  EXPECT_THROW(parse_safetensors_image(image(kValid, 20, 200'000'000, true), "f"), CheckpointError);
}

TEST(Safetensors, MutatedImagesNeverCrash) {
  const std::vector<std::byte> good = image(kValid, 20);
  std::mt19937_64 rng(42);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> m = good;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) m[rng() % m.size()] = std::byte(uint8_t(rng()));
    if (rng() % 8 == 0) m.resize(rng() % m.size());
    try {
      parse_safetensors_image(m, "f");
      ++accepted;
    } catch (const CheckpointError&) {
    }
  }
  EXPECT_GT(accepted, 0);  // some mutations hit only data bytes
}

TEST(Safetensors, WriteThenOpen) {
  const auto dir = std::filesystem::temp_directory_path() / "twinstep_st_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "x.safetensors").string();
  std::vector<TensorSource> t;
  t.push_back({"w", DType::kBF16, {3, 5}, [](std::byte* d, uint64_t off, uint64_t n) {
                 for (uint64_t i = 0; i < n; ++i) {
                   const uint16_t v = uint16_t(off + i);
                   std::memcpy(d + 2 * i, &v, 2);
                 }
               }});
  write_safetensors(path, t, {{"k", "v\"q"}});
  auto f = SafetensorsFile::open(path);
  const TensorInfo* w = f->find("w");
  ASSERT_NE(w, nullptr);
  const auto bytes = f->bytes(*w);
  ASSERT_EQ(bytes.size(), 30u);
  uint16_t v;
  std::memcpy(&v, bytes.data() + 2 * 14, 2);
  EXPECT_EQ(v, 14);
  EXPECT_EQ(f->header().metadata[0].second, "v\"q");
  EXPECT_THROW(SafetensorsFile::open((dir / "missing.safetensors").string()), CheckpointError);
  std::filesystem::remove_all(dir);
}

TEST(JsonLite, Basics) {
  const JsonValue v =
      parse_json(R"( {"a": [1, -2.5e3, "x\u00e9\ud83d\ude00"], "b": null, "c": true} )");
  ASSERT_NE(v.find("a"), nullptr);
  EXPECT_EQ(v.find("a")->items[0].as_u64("a"), 1u);
  EXPECT_DOUBLE_EQ(v.find("a")->items[1].as_double("a"), -2500.0);
  EXPECT_EQ(v.find("a")->items[2].text, "x\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.find("c")->boolean);
  EXPECT_THROW(parse_json("01"), JsonError);
  EXPECT_THROW(parse_json("1 2"), JsonError);
  EXPECT_THROW(parse_json("\"\\ud800\""), JsonError);
  EXPECT_THROW(parse_json("[1,]"), JsonError);
}

// Errors say where: line and column (1-based) and the byte offset.
TEST(JsonLite, ErrorsNameLineAndColumn) {
  auto error_of = [](std::string_view text) {
    try {
      parse_json(text);
    } catch (const JsonError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("01"),
            "JSON: unexpected text after the JSON value at line 1, column 2 (byte 1)");
  // Line 3 starts at byte 12; the value missing after "[1," is where ']' stands, byte 25.
  EXPECT_EQ(error_of("{\n  \"a\": 1,\n  \"rows\": [1,]\n}"),
            "JSON: expected a value, found ']' at line 3, column 14 (byte 25)");
  // Truncated files say so, at the end: "{\"rows\": [\n" is 11 bytes.
  EXPECT_EQ(
      error_of("{\"rows\": [\n"),
      "JSON: expected a value, found end of input (truncated?) at line 2, column 1 (byte 11)");
  EXPECT_EQ(error_of("{\"rows\": [1"),
            "JSON: expected ']', found end of input (truncated?) at line 1, column 12 (byte 11)");
  EXPECT_EQ(error_of("{\"a\": 1.}"),
            "JSON: invalid number: expected a digit, found '}' at line 1, column 9 (byte 8)");
  EXPECT_EQ(error_of("{\"a\": 1, b}"),
            "JSON: expected a string key, found 'b' at line 1, column 10 (byte 9)");
}

}  // namespace
}  // namespace twinstep
