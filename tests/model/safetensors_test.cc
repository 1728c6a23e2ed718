// Tests of the safetensors reader/writer, sharded checkpoints and the checkpoint-vs-config
// check (model/safetensors.h, model/weights.h). Malformed files are written byte by byte;
// every rule's error must carry the right code and name the file, tensor or field.
#include "model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/weights.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::echokv::testing::WriteFileOrDie;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kNotFound = absl::StatusCode::kNotFound;

std::string U64Le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file: length prefix, header text, `data_bytes` bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  return U64Le(header.size()) + header + std::string(data_bytes, '\x5a');
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::echokv::testing::MakeTempDir("echokv_safetensors_test_"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `contents` to dir_/name and returns the path.
  std::string Write(const std::string& name, const std::string& contents) {
    std::string path = dir_ + "/" + name;
    WriteFileOrDie(path, contents);
    return path;
  }
  // Opens a file made of `header` + `data_bytes` data bytes.
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenRaw(const std::string& header,
                                                           size_t data_bytes) {
    return SafetensorsFile::Open(Write("t.safetensors", RawFile(header, data_bytes)));
  }

  std::string dir_;  // scratch directory, removed after each test
};

// ---- file-level rules --------------------------------------------------------------

TEST_F(SafetensorsTest, FileShorterThanHeaderLength) {
  const std::string path = Write("short.safetensors", "\x01\x02\x03\x04\x05");
  EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(kInvalid, "too short"));
  EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(kInvalid, path));
  EXPECT_THAT(SafetensorsFile::Open(Write("empty.safetensors", "")),
              StatusIs(kInvalid, "file is 0 bytes"));
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_THAT(SafetensorsFile::Open(dir_ + "/nope.safetensors"),
              StatusIs(kNotFound, "nope.safetensors"));
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  const std::string path = Write("t.safetensors", U64Le(1000) + "{}" + std::string(8, ' '));
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(kInvalid, "header length 1000 extends beyond the end of the file (18 bytes)"));
}

TEST_F(SafetensorsTest, HeaderLengthOverTheLimitIsRefusedBeforeAnyRead) {
  // A sparse file large enough to hold the claimed header, so only the 100 MB limit can
  // refuse it (the header bytes are never read or copied).
  const std::string path = dir_ + "/huge.safetensors";
  WriteFileOrDie(path, U64Le(100'000'001));
  ASSERT_EQ(truncate(path.c_str(), 8 + 100'000'001 + 8), 0);
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(kInvalid, "header length 100000001 exceeds the 100000000-byte limit"));
  // A claim of 2^64 - 1 must not wrap around in 8 + N.
  const std::string path2 = Write("max.safetensors", U64Le(~0ULL) + "{}");
  EXPECT_THAT(SafetensorsFile::Open(path2), StatusIs(kInvalid, "exceeds the 100000000-byte limit"));
}

TEST_F(SafetensorsTest, InvalidJsonHeader) {
  EXPECT_THAT(OpenRaw("{\"a\": ", 0), StatusIs(kInvalid, "header is not valid JSON"));
  EXPECT_THAT(OpenRaw("", 0), StatusIs(kInvalid, "header is not valid JSON"));
  EXPECT_THAT(OpenRaw("{\"a\": 1} x", 0), StatusIs(kInvalid, "header is not valid JSON"));
}

TEST_F(SafetensorsTest, InvalidUtf8Header) {
  EXPECT_THAT(OpenRaw("{\"w\xff\xfe\": {}}", 0), StatusIs(kInvalid, "header is not valid UTF-8"));
  // An overlong encoding of '/' is not valid UTF-8 either.
  EXPECT_THAT(OpenRaw("{\"\xc0\xaf\": {}}", 0), StatusIs(kInvalid, "not valid UTF-8"));
}

TEST_F(SafetensorsTest, HeaderMustBeAnObject) {
  EXPECT_THAT(OpenRaw("[1, 2, 3]", 0), StatusIs(kInvalid, "header must be a JSON object, got an array"));
  EXPECT_THAT(OpenRaw("42", 0), StatusIs(kInvalid, "header must be a JSON object"));
  EXPECT_THAT(OpenRaw("[[[[[[1]]]]]]", 0), StatusIs(kInvalid, "nested too deeply"));
}

TEST_F(SafetensorsTest, EmptyHeaderAndSpacePadding) {
  ASSERT_OK_AND_ASSIGN(auto f, OpenRaw("{}      ", 0));
  EXPECT_TRUE(f->tensors().empty());
  ASSERT_OK_AND_ASSIGN(f, OpenRaw(R"({"__metadata__": {"format": "pt"}})", 0));
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_OK_AND_ASSIGN(f, OpenRaw(R"({"__metadata__": null})", 0));
  EXPECT_TRUE(f->metadata().empty());
}

// ---- per-tensor rules -------------------------------------------------------------

TEST_F(SafetensorsTest, UnsupportedDtypeIsNamedWithTheTensor) {
  for (const char* dtype : {"F64", "I64", "I32", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"}) {
    SCOPED_TRACE(dtype);
    const std::string header = std::string(R"({"blk.w": {"dtype": ")") + dtype +
                               R"(", "shape": [0], "data_offsets": [0, 0]}})";
    auto result = OpenRaw(header, 0);
    EXPECT_THAT(result, StatusIs(kInvalid, std::string("dtype ") + dtype + " is not supported"));
    EXPECT_THAT(result, StatusIs(kInvalid, "tensor 'blk.w'"));
  }
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "Q4_K", "shape": [0], "data_offsets": [0, 0]}})", 0),
              StatusIs(kInvalid, "tensor 'w': unknown dtype 'Q4_K'"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": 4, "shape": [0], "data_offsets": [0, 0]}})", 0),
              StatusIs(kInvalid, "tensor 'w': 'dtype' must be a string"));
}

TEST_F(SafetensorsTest, MissingTensorFields) {
  EXPECT_THAT(OpenRaw(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4),
              StatusIs(kInvalid, "tensor 'w': missing 'dtype'"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4),
              StatusIs(kInvalid, "tensor 'w': missing 'shape'"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [1]}})", 4),
              StatusIs(kInvalid, "tensor 'w': missing 'data_offsets'"));
  EXPECT_THAT(OpenRaw(R"({"w": [1, 2]})", 0), StatusIs(kInvalid, "tensor 'w': entry must be an object"));
}

TEST_F(SafetensorsTest, BadShapes) {
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}})", 8),
              StatusIs(kInvalid, "tensor 'w': 'shape' entries must be non-negative integers, got -1"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
              StatusIs(kInvalid, "'shape' entries must be non-negative integers, got 1.5"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}})", 8),
              StatusIs(kInvalid, "'shape' entries must be non-negative integers"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", 8),
              StatusIs(kInvalid, "tensor 'w': 'shape' must be an array"));
}

TEST_F(SafetensorsTest, BadDataOffsets) {
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8),
              StatusIs(kInvalid, "tensor 'w': 'data_offsets' must be [begin, end]"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, -8]}})", 8),
              StatusIs(kInvalid, "'data_offsets' must be non-negative integers"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", 8),
              StatusIs(kInvalid, "tensor 'w': data_offsets [8, 0] end before they begin"));
}

TEST_F(SafetensorsTest, OffsetsOutOfBounds) {
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", 16),
              StatusIs(kInvalid, "tensor 'w': data_offsets [0, 32] extend beyond the data area (16 bytes)"));
  // Far beyond, near 2^64: no wrap-around.
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [18446744073709551615, 18446744073709551615]}})", 0),
              StatusIs(kInvalid, "extend beyond the data area"));
}

TEST_F(SafetensorsTest, GapBetweenTensors) {
  const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})";
  EXPECT_THAT(OpenRaw(header, 24), StatusIs(kInvalid, "gap of 8 bytes before tensor 'b'"));
  // A gap at the very start.
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8),
              StatusIs(kInvalid, "gap of 4 bytes before tensor 'a'"));
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})";
  EXPECT_THAT(OpenRaw(header, 12), StatusIs(kInvalid, "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a'"));
  const std::string same = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  EXPECT_THAT(OpenRaw(same, 8), StatusIs(kInvalid, "overlaps tensor"));
}

TEST_F(SafetensorsTest, TrailingBytes) {
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 12),
              StatusIs(kInvalid, "4 trailing bytes after the last tensor"));
  EXPECT_THAT(OpenRaw("{}", 3), StatusIs(kInvalid, "3 trailing bytes"));
}

TEST_F(SafetensorsTest, SizeMismatch) {
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
              StatusIs(kInvalid, "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}})", 16),
              StatusIs(kInvalid, "shape [2, 2] of BF16 needs 8 bytes"));
}

TEST_F(SafetensorsTest, ShapeProductOverflow) {
  // 2^62 * 8 overflows 64 bits; a trailing zero dimension must not hide it.
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 0]}})", 0),
              StatusIs(kInvalid, "tensor 'w': shape [4611686018427387904, 8] of F32 overflows"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8, 0], "data_offsets": [0, 0]}})", 0),
              StatusIs(kInvalid, "overflows"));
  // prod fits but * sizeof(F32) does not.
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0),
              StatusIs(kInvalid, "overflows"));
  // A dimension beyond int64.
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "shape": [0, 18446744073709551615], "data_offsets": [0, 0]}})", 0),
              StatusIs(kInvalid, "shape dimension 18446744073709551615 is too large"));
}

TEST_F(SafetensorsTest, DuplicateNames) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                  "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  EXPECT_THAT(OpenRaw(header, 8), StatusIs(kInvalid, "duplicate tensor name 'w'"));
  EXPECT_THAT(OpenRaw(R"({"w": {"dtype": "F32", "dtype": "I8", "shape": [1], "data_offsets": [0, 4]}})", 4),
              StatusIs(kInvalid, "duplicate key 'dtype'"));
}

TEST_F(SafetensorsTest, BadMetadata) {
  EXPECT_THAT(OpenRaw(R"({"__metadata__": {"format": 1}})", 0),
              StatusIs(kInvalid, "__metadata__ value of 'format' must be a string"));
  EXPECT_THAT(OpenRaw(R"({"__metadata__": ["pt"]})", 0),
              StatusIs(kInvalid, "__metadata__ must be an object of strings"));
  EXPECT_THAT(OpenRaw(R"({"__metadata__": {"a": {"b": "c"}}})", 0),
              StatusIs(kInvalid, "__metadata__ value of 'a' must be a string"));
}

TEST_F(SafetensorsTest, ValidFileIsMappedInOffsetOrder) {
  // Header lists b before a; zero-size tensors are allowed.
  const std::string header = R"({"b": {"dtype": "F16", "shape": [2, 1], "data_offsets": [8, 12]},
                                  "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "z": {"dtype": "BF16", "shape": [3, 0], "data_offsets": [12, 12]}})";
  std::string data = "AAAABBBBCCCC";
  const std::string path = Write("ok.safetensors", U64Le(header.size()) + header + data);
  ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(path));
  EXPECT_EQ(f->path(), path);
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->tensors()[0].name, "a");
  EXPECT_EQ(f->tensors()[1].name, "b");
  EXPECT_EQ(f->tensors()[2].name, "z");
  const TensorView* b = f->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kF16);
  EXPECT_THAT(b->shape, ElementsAre(2, 1));
  EXPECT_EQ(b->nbytes, 4u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b->data), b->nbytes), "CCCC");
  const TensorView* a = f->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a->data), a->nbytes), "AAAABBBB");
  EXPECT_EQ(f->Find("z")->nbytes, 0u);
  EXPECT_EQ(f->Find("missing"), nullptr);
}

// ---- writer ---------------------------------------------------------------------

std::string Bytes(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 37 + seed * 11 + 3) & 0xff);
  return s;
}

TEST_F(SafetensorsTest, RoundTripF32F16BF16) {
  std::vector<TensorToWrite> tensors = {
      {"model.embed_tokens.weight", DType::kF32, {3, 5}, Bytes(60, 1)},
      {"half", DType::kF16, {7}, Bytes(14, 2)},
      {"brain", DType::kBF16, {2, 1, 3}, Bytes(12, 3)},
      {"scalar", DType::kF32, {}, Bytes(4, 4)},
      {"empty", DType::kF16, {0, 4}, ""},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "h\"i\n"}};
  const std::string path = dir_ + "/rt.safetensors";
  ASSERT_OK(WriteSafetensors(path, tensors, metadata));

  // The header is padded with spaces so the data starts at a multiple of 8, and the data
  // area is the tensors' bytes back to back in the given order.
  const std::string raw = ::echokv::testing::ReadFileOrDie(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_LE(8 + n, raw.size());
  EXPECT_EQ(raw[8], '{');
  std::string all;
  for (const auto& t : tensors) all += t.bytes;
  EXPECT_EQ(raw.substr(8 + n), all);

  ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(path));
  EXPECT_EQ(f->metadata(), metadata);
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    SCOPED_TRACE(t.name);
    const TensorView* v = f->Find(t.name);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->dtype, t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    ASSERT_EQ(v->nbytes, t.bytes.size());
    EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), v->nbytes), 0);
  }
  // Nothing but the file itself is left in the directory (the temporary was renamed).
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(SafetensorsTest, WriterValidatesItsInputs) {
  const std::string path = dir_ + "/bad.safetensors";
  EXPECT_THAT(WriteSafetensors(path, {{"w", DType::kF32, {2, 3}, Bytes(20, 0)}}, {}),
              StatusIs(kInvalid, "tensor 'w' of shape [2, 3] F32 needs 24 bytes, got 20"));
  EXPECT_THAT(WriteSafetensors(path, {{"w", DType::kF32, {1}, Bytes(4, 0)},
                                      {"w", DType::kF32, {1}, Bytes(4, 0)}}, {}),
              StatusIs(kInvalid, "duplicate tensor 'w'"));
  EXPECT_THAT(WriteSafetensors(path, {{"w", DType::kF32, {-2}, ""}}, {}),
              StatusIs(kInvalid, "tensor 'w' has an invalid shape [-2]"));
  EXPECT_THAT(WriteSafetensors(path, {{"__metadata__", DType::kF32, {0}, ""}}, {}),
              StatusIs(kInvalid, "invalid tensor name"));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_THAT(WriteSafetensors(dir_ + "/no/such/dir/x.safetensors", {}, {}),
              StatusIs(kNotFound, "x.safetensors"));
}

// ---- checkpoint directories --------------------------------------------------------

TEST_F(SafetensorsTest, CheckpointSingleFile) {
  ASSERT_OK(WriteSafetensors(dir_ + "/model.safetensors",
                             {{"b", DType::kF32, {1}, Bytes(4, 1)},
                              {"a", DType::kF32, {2}, Bytes(8, 2)}},
                             {}));
  ASSERT_OK_AND_ASSIGN(auto ckpt, Checkpoint::Open(dir_));
  EXPECT_THAT(ckpt->Names(), ElementsAre("a", "b"));
  ASSERT_NE(ckpt->Find("a"), nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ckpt->Find("a")->data), 8), Bytes(8, 2));
  EXPECT_EQ(ckpt->Find("c"), nullptr);
}

TEST_F(SafetensorsTest, CheckpointErrorsFromTheFileCarryItsPath) {
  Write("model.safetensors", RawFile("{", 0));
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, "model.safetensors: header is not valid JSON"));
}

class ShardedTest : public SafetensorsTest {
 protected:
  void WriteShards() {
    ASSERT_OK(WriteSafetensors(dir_ + "/model-00001-of-00002.safetensors",
                               {{"a", DType::kF32, {2}, Bytes(8, 1)},
                                {"b", DType::kF16, {2}, Bytes(4, 2)}},
                               {}));
    ASSERT_OK(WriteSafetensors(dir_ + "/model-00002-of-00002.safetensors",
                               {{"c", DType::kBF16, {3}, Bytes(6, 3)}}, {}));
  }
  void WriteIndex(const std::string& weight_map) {
    Write("model.safetensors.index.json",
          R"({"metadata": {"total_size": 18}, "weight_map": )" + weight_map + "}");
  }
};

TEST_F(ShardedTest, OpensAllShards) {
  WriteShards();
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors"})");
  ASSERT_OK_AND_ASSIGN(auto ckpt, Checkpoint::Open(dir_));
  EXPECT_THAT(ckpt->Names(), ElementsAre("a", "b", "c"));
  ASSERT_NE(ckpt->Find("c"), nullptr);
  EXPECT_EQ(ckpt->Find("c")->dtype, DType::kBF16);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ckpt->Find("c")->data), 6), Bytes(6, 3));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ckpt->Find("b")->data), 4), Bytes(4, 2));
}

TEST_F(ShardedTest, MissingShard) {
  WriteShards();
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00003-of-00003.safetensors"})");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kNotFound, "shard 'model-00003-of-00003.safetensors'"));
}

TEST_F(ShardedTest, ShardNamesMustStayInsideTheDirectory) {
  WriteShards();
  for (const char* bad : {"../model-00002-of-00002.safetensors", "/etc/passwd", "sub/x.safetensors",
                          "..", "a\\\\b.safetensors", ""}) {
    SCOPED_TRACE(bad);
    WriteIndex(std::string(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": ")") +
               bad + "\"}");
    EXPECT_THAT(Checkpoint::Open(dir_),
                StatusIs(kInvalid, "maps tensor 'c' to shard"));
    EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, "not a plain file name"));
  }
}

TEST_F(ShardedTest, TensorMissingFromItsShard) {
  WriteShards();
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"})");
  EXPECT_THAT(Checkpoint::Open(dir_),
              StatusIs(kInvalid, "maps tensor 'd' to shard 'model-00002-of-00002.safetensors', "
                                 "which does not contain it"));
}

TEST_F(ShardedTest, TensorInShardButNotListed) {
  WriteShards();
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})");
  EXPECT_THAT(Checkpoint::Open(dir_),
              StatusIs(kInvalid, "shard 'model-00001-of-00002.safetensors' holds tensor 'b'"));
}

TEST_F(ShardedTest, DuplicateTensorAcrossShards) {
  WriteShards();
  ASSERT_OK(WriteSafetensors(dir_ + "/model-00002-of-00002.safetensors",
                             {{"c", DType::kBF16, {3}, Bytes(6, 3)},
                              {"a", DType::kF32, {2}, Bytes(8, 1)}},
                             {}));
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors"})");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, "holds tensor 'a'"));
}

TEST_F(ShardedTest, MalformedIndex) {
  WriteShards();
  Write("model.safetensors.index.json", "{\"weight_map\": ");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, "model.safetensors.index.json: invalid JSON"));
  Write("model.safetensors.index.json", "{\"metadata\": {}}");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, "missing 'weight_map'"));
  Write("model.safetensors.index.json", "{\"weight_map\": [\"a\"]}");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, "'weight_map' must be an object"));
  Write("model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, "weight_map entry for tensor 'a'"));
  Write("model.safetensors.index.json", "{\"weight_map\": {}}");
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kInvalid, "'weight_map' is empty"));
}

TEST_F(SafetensorsTest, PickleCheckpointsAreRefused) {
  for (const char* name : {"pytorch_model.bin", "consolidated.00.pth", "model.pt"}) {
    SCOPED_TRACE(name);
    const std::string sub = dir_ + "/" + std::to_string(std::hash<std::string>()(name));
    std::filesystem::create_directory(sub);
    WriteFileOrDie(sub + "/" + name, "PK\x03\x04 not really a pickle");
    WriteFileOrDie(sub + "/config.json", "{}");
    auto result = Checkpoint::Open(sub);
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 "pickle checkpoints are not supported"));
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kFailedPrecondition, name));
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kFailedPrecondition, "convert to safetensors"));
  }
}

TEST_F(SafetensorsTest, EmptyOrMissingDirectoryIsNotFound) {
  EXPECT_THAT(Checkpoint::Open(dir_), StatusIs(kNotFound, "no model.safetensors"));
  EXPECT_THAT(Checkpoint::Open(dir_ + "/missing"), StatusIs(kNotFound, "missing"));
}

// ---- checkpoint vs config (model/weights.h) ------------------------------------------

// A tiny llama: D=8, H=2, G=1, d=4, I=12, V=16, 2 layers.
ModelConfig TinyConfig() {
  ModelConfig cfg;
  cfg.type = ModelType::kLlama;
  cfg.hidden_size = 8;
  cfg.intermediate_size = 12;
  cfg.num_layers = 2;
  cfg.num_heads = 2;
  cfg.num_kv_heads = 1;
  cfg.head_dim = 4;
  cfg.vocab_size = 16;
  cfg.max_position_embeddings = 32;
  return cfg;
}

TEST(ExpectedTensorsTest, NamesAndShapes) {
  ModelConfig cfg = TinyConfig();
  std::vector<ExpectedTensor> all = ExpectedTensors(cfg);
  std::map<std::string, std::vector<int64_t>> by_name;
  for (const auto& t : all) by_name[t.name] = t.shape;
  EXPECT_EQ(by_name.size(), all.size());  // unique names
  // embed + 2 layers x 9 + norm + lm_head.
  EXPECT_EQ(all.size(), 21u);
  EXPECT_EQ(all.front().name, "model.embed_tokens.weight");
  EXPECT_THAT(by_name["model.embed_tokens.weight"], ElementsAre(16, 8));
  EXPECT_THAT(by_name["model.layers.1.input_layernorm.weight"], ElementsAre(8));
  EXPECT_THAT(by_name["model.layers.1.self_attn.q_proj.weight"], ElementsAre(8, 8));
  EXPECT_THAT(by_name["model.layers.1.self_attn.k_proj.weight"], ElementsAre(4, 8));
  EXPECT_THAT(by_name["model.layers.1.self_attn.v_proj.weight"], ElementsAre(4, 8));
  EXPECT_THAT(by_name["model.layers.1.self_attn.o_proj.weight"], ElementsAre(8, 8));
  EXPECT_THAT(by_name["model.layers.0.post_attention_layernorm.weight"], ElementsAre(8));
  EXPECT_THAT(by_name["model.layers.0.mlp.gate_proj.weight"], ElementsAre(12, 8));
  EXPECT_THAT(by_name["model.layers.0.mlp.up_proj.weight"], ElementsAre(12, 8));
  EXPECT_THAT(by_name["model.layers.0.mlp.down_proj.weight"], ElementsAre(8, 12));
  EXPECT_THAT(by_name["model.norm.weight"], ElementsAre(8));
  EXPECT_THAT(by_name["lm_head.weight"], ElementsAre(16, 8));
  EXPECT_EQ(by_name.count("model.layers.0.self_attn.q_proj.bias"), 0u);

  cfg.tie_word_embeddings = true;
  EXPECT_EQ(ExpectedTensors(cfg).size(), 20u);
  cfg.qkv_bias = true;  // qwen2: q/k/v biases
  by_name.clear();
  for (const auto& t : ExpectedTensors(cfg)) by_name[t.name] = t.shape;
  EXPECT_EQ(by_name.size(), 26u);
  EXPECT_THAT(by_name["model.layers.1.self_attn.q_proj.bias"], ElementsAre(8));
  EXPECT_THAT(by_name["model.layers.1.self_attn.k_proj.bias"], ElementsAre(4));
  EXPECT_THAT(by_name["model.layers.1.self_attn.v_proj.bias"], ElementsAre(4));
  EXPECT_EQ(by_name.count("model.layers.1.self_attn.o_proj.bias"), 0u);
  cfg.o_bias = true;  // llama attention_bias
  by_name.clear();
  for (const auto& t : ExpectedTensors(cfg)) by_name[t.name] = t.shape;
  EXPECT_EQ(by_name.size(), 28u);
  EXPECT_THAT(by_name["model.layers.0.self_attn.o_proj.bias"], ElementsAre(8));
}

class ValidateCheckpointTest : public SafetensorsTest {
 protected:
  // Writes model.safetensors with every expected tensor (zero bytes), minus `drop`,
  // with `reshape` overriding shapes, plus `extra` tensors.
  absl::StatusOr<std::unique_ptr<Checkpoint>> Build(
      const ModelConfig& cfg, const std::string& drop = "",
      const std::map<std::string, std::vector<int64_t>>& reshape = {},
      const std::map<std::string, std::vector<int64_t>>& extra = {}) {
    std::vector<TensorToWrite> tensors;
    auto add = [&tensors](const std::string& name, const std::vector<int64_t>& shape) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      tensors.push_back({name, DType::kF32, shape, std::string(static_cast<size_t>(n) * 4, '\0')});
    };
    for (const ExpectedTensor& t : ExpectedTensors(cfg)) {
      if (t.name == drop) continue;
      auto it = reshape.find(t.name);
      add(t.name, it == reshape.end() ? t.shape : it->second);
    }
    for (const auto& [name, shape] : extra) add(name, shape);
    absl::Status s = WriteSafetensors(dir_ + "/model.safetensors", tensors, {});
    if (!s.ok()) return s;
    return Checkpoint::Open(dir_);
  }
};

TEST_F(ValidateCheckpointTest, CompleteCheckpointIsAccepted) {
  ModelConfig cfg = TinyConfig();
  ASSERT_OK_AND_ASSIGN(auto ckpt, Build(cfg, "", {},
                                        {{"model.layers.0.self_attn.rotary_emb.inv_freq", {2}}}));
  EXPECT_OK(ValidateCheckpoint(*ckpt, cfg));
}

TEST_F(ValidateCheckpointTest, MissingTensor) {
  ModelConfig cfg = TinyConfig();
  ASSERT_OK_AND_ASSIGN(auto ckpt, Build(cfg, "model.layers.1.mlp.up_proj.weight"));
  EXPECT_THAT(ValidateCheckpoint(*ckpt, cfg),
              StatusIs(kInvalid,
                       "missing tensor 'model.layers.1.mlp.up_proj.weight' (expected shape [12, 8])"));
}

TEST_F(ValidateCheckpointTest, WrongShape) {
  ModelConfig cfg = TinyConfig();
  ASSERT_OK_AND_ASSIGN(auto ckpt,
                       Build(cfg, "", {{"model.layers.0.self_attn.k_proj.weight", {8, 8}}}));
  EXPECT_THAT(ValidateCheckpoint(*ckpt, cfg),
              StatusIs(kInvalid, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape "
                                 "[8, 8], expected [4, 8]"));
}

TEST_F(ValidateCheckpointTest, UnexpectedTensor) {
  ModelConfig cfg = TinyConfig();
  ASSERT_OK_AND_ASSIGN(auto ckpt,
                       Build(cfg, "", {}, {{"model.layers.2.mlp.up_proj.weight", {12, 8}}}));
  EXPECT_THAT(ValidateCheckpoint(*ckpt, cfg),
              StatusIs(kInvalid, "unexpected tensor 'model.layers.2.mlp.up_proj.weight'"));
}

TEST_F(ValidateCheckpointTest, BiasesMustMatchTheConfig) {
  ModelConfig cfg = TinyConfig();
  cfg.qkv_bias = true;
  ASSERT_OK_AND_ASSIGN(auto ckpt, Build(cfg));
  EXPECT_OK(ValidateCheckpoint(*ckpt, cfg));
  ModelConfig no_bias = TinyConfig();
  EXPECT_THAT(ValidateCheckpoint(*ckpt, no_bias),
              StatusIs(kInvalid, "model.layers.0.self_attn.k_proj.bias"));
  cfg.o_bias = true;
  EXPECT_THAT(ValidateCheckpoint(*ckpt, cfg),
              StatusIs(kInvalid, "missing tensor 'model.layers.0.self_attn.o_proj.bias' "
                                 "(expected shape [8])"));
}

TEST_F(ValidateCheckpointTest, TiedEmbeddingsWithOrWithoutLmHead) {
  ModelConfig cfg = TinyConfig();
  ASSERT_OK_AND_ASSIGN(auto ckpt, Build(cfg));  // untied layout: has lm_head.weight
  cfg.tie_word_embeddings = true;
  EXPECT_OK(ValidateCheckpoint(*ckpt, cfg));  // a matching lm_head is tolerated
  ckpt.reset();
  ModelConfig untied = TinyConfig();
  ASSERT_OK_AND_ASSIGN(ckpt, Build(untied, "", {{"lm_head.weight", {16, 4}}}));
  EXPECT_THAT(ValidateCheckpoint(*ckpt, cfg),
              StatusIs(kInvalid, "tensor 'lm_head.weight' has shape [16, 4], expected [16, 8]"));
  ckpt.reset();
  ASSERT_OK_AND_ASSIGN(ckpt, Build(cfg));  // tied layout: no lm_head
  EXPECT_OK(ValidateCheckpoint(*ckpt, cfg));
  EXPECT_THAT(ValidateCheckpoint(*ckpt, untied),
              StatusIs(kInvalid, "missing tensor 'lm_head.weight' (expected shape [16, 8])"));
}

// ---- the real model -----------------------------------------------------------------

TEST(Stories260KTest, OpensAndMatchesItsConfig) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string dir = data + "/models/stories260K";
  ASSERT_OK_AND_ASSIGN(auto ckpt, Checkpoint::Open(dir));
  EXPECT_EQ(ckpt->Names().size(), 47u);  // embed + 5 layers x 9 + norm; tied, no lm_head
  EXPECT_EQ(ckpt->Find("lm_head.weight"), nullptr);
  const TensorView* embed = ckpt->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->dtype, DType::kF32);
  EXPECT_THAT(embed->shape, ElementsAre(512, 64));
  EXPECT_EQ(embed->nbytes, 512u * 64u * 4u);
  const TensorView* k = ckpt->Find("model.layers.4.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_THAT(k->shape, ElementsAre(32, 64));  // 4 KV heads x head_dim 8
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, LoadModelConfig(dir));
  EXPECT_OK(ValidateCheckpoint(*ckpt, cfg));
}

}  // namespace
}  // namespace echokv::model
