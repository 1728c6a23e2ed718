// Tests of the GGUF reader (model/gguf.h) and the half / bfloat16 conversions
// (model/ggml_types.h). Files are assembled byte by byte here, so every validation
// rule can be broken on its own; every prefix of a valid file must be refused (never
// crash); the files gguf's own GGUFWriter wrote (tests/model/testdata/gguf/, made by
// tools/oracle/) are read in gguf_golden_test.cc.
#include "model/gguf.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/ggml_types.h"
#include "tests/testing/status_matchers.h"

namespace echokv::model {
namespace {

using ::echokv::testing::StatusIs;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

template <typename T>
std::string Le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
std::string Str(const std::string& s) { return Le<uint64_t>(s.size()) + s; }

// Assembles a GGUF file. Values are given already encoded (type id + bytes).
class Builder {
 public:
  uint32_t version = 3;
  uint32_t alignment = 32;  // used for padding; add general.alignment to change the file's
  std::string magic = "GGUF";
  Builder& Kv(const std::string& key, GgufValueType type, const std::string& value) {
    kv_.push_back(Str(key) + Le<uint32_t>(static_cast<uint32_t>(type)) + value);
    return *this;
  }
  Builder& Uint32(const std::string& key, uint32_t v) { return Kv(key, GgufValueType::kUint32, Le(v)); }
  Builder& String(const std::string& key, const std::string& v) { return Kv(key, GgufValueType::kString, Str(v)); }
  // A tensor at `offset` (relative to the data section) with raw `data`.
  Builder& Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                  std::string data) {
    std::string t = Str(name) + Le<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) t += Le(d);
    t += Le(type) + Le(offset);
    tensors_.push_back(t);
    if (data_.size() < offset + data.size()) data_.resize(offset + data.size(), '\0');
    data_.replace(offset, data.size(), data);
    return *this;
  }
  std::string Build(uint64_t tensor_count_override = ~0ull, uint64_t kv_count_override = ~0ull) const {
    std::string out = magic + Le(version);
    out += Le<uint64_t>(tensor_count_override != ~0ull ? tensor_count_override : tensors_.size());
    out += Le<uint64_t>(kv_count_override != ~0ull ? kv_count_override : kv_.size());
    for (const std::string& k : kv_) out += k;
    for (const std::string& t : tensors_) out += t;
    if (!tensors_.empty()) {
      while (out.size() % alignment != 0) out.push_back('\0');
      out += data_;
    }
    return out;
  }

 private:
  std::vector<std::string> kv_, tensors_;
  std::string data_;
};

std::string F32s(const std::vector<float>& v) {
  std::string s;
  for (float f : v) s += Le(f);
  return s;
}

absl::StatusOr<std::unique_ptr<GgufFile>> ParseOf(const std::string& bytes) { return GgufFile::Parse(bytes); }

TEST(GgufTest, ReadsEveryScalarTypeAndKeepsFileOrder) {
  Builder b;
  b.Kv("u8", GgufValueType::kUint8, Le<uint8_t>(200))
      .Kv("i8", GgufValueType::kInt8, Le<int8_t>(-5))
      .Kv("u16", GgufValueType::kUint16, Le<uint16_t>(60000))
      .Kv("i16", GgufValueType::kInt16, Le<int16_t>(-30000))
      .Kv("u32", GgufValueType::kUint32, Le<uint32_t>(4000000000u))
      .Kv("i32", GgufValueType::kInt32, Le<int32_t>(-2000000000))
      .Kv("u64", GgufValueType::kUint64, Le<uint64_t>(18000000000000000000ull))
      .Kv("i64", GgufValueType::kInt64, Le<int64_t>(-9000000000000000000ll))
      .Kv("f32", GgufValueType::kFloat32, Le<float>(0.1f))
      .Kv("f64", GgufValueType::kFloat64, Le<double>(0.1))
      .Kv("b", GgufValueType::kBool, Le<uint8_t>(1))
      .String("s", "héllo");
  const std::string bytes = b.Build();
  ASSERT_OK_AND_ASSIGN(auto f, ParseOf(bytes));
  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->metadata().size(), 12u);
  EXPECT_EQ(f->metadata()[0].key, "u8");
  EXPECT_EQ(f->metadata()[11].key, "s");
  EXPECT_EQ(f->GetUint("u8").value(), 200u);
  EXPECT_EQ(f->Find("i8")->i, -5);
  EXPECT_EQ(f->GetUint("u16").value(), 60000u);
  EXPECT_EQ(f->Find("i16")->i, -30000);
  EXPECT_EQ(f->GetUint("u32").value(), 4000000000u);
  EXPECT_EQ(f->Find("i32")->i, -2000000000);
  EXPECT_EQ(f->GetUint("u64").value(), 18000000000000000000ull);
  EXPECT_EQ(f->Find("i64")->i, -9000000000000000000ll);
  EXPECT_EQ(f->GetFloat("f32").value(), static_cast<double>(0.1f));  // exact float32 value
  EXPECT_EQ(f->GetFloat("f64").value(), 0.1);
  EXPECT_TRUE(f->GetBool("b").value());
  EXPECT_EQ(f->GetString("s").value(), "héllo");
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufTest, TypedReadsNameTheKeyAndWhatItHolds) {
  Builder b;
  b.String("general.architecture", "llama").Kv("neg", GgufValueType::kInt32, Le<int32_t>(-1));
  const std::string bytes = b.Build();
  ASSERT_OK_AND_ASSIGN(auto f, ParseOf(bytes));
  EXPECT_THAT(f->GetUint("general.architecture"),
              StatusIs(kInvalid, "metadata 'general.architecture' must be an integer, got a string"));
  EXPECT_THAT(f->GetString("missing.key"), StatusIs(absl::StatusCode::kNotFound, "metadata 'missing.key' is missing"));
  EXPECT_THAT(f->GetUint("neg"), StatusIs(kInvalid, "metadata 'neg' must be >= 0, got -1"));
  EXPECT_THAT(f->GetBool("neg"), StatusIs(kInvalid, "must be a bool, got a int32"));
  EXPECT_THAT(f->GetFloat("neg"), StatusIs(kInvalid, "must be a float32 or float64"));
}

TEST(GgufTest, ArraysOfNumbersStringsAndArrays) {
  std::string ints = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kInt32)) + Le<uint64_t>(3) + Le<int32_t>(-1) +
                     Le<int32_t>(2) + Le<int32_t>(70000);
  std::string strings = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kString)) + Le<uint64_t>(3) + Str("a") +
                        Str("") + Str("Ġworld");
  std::string floats = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kFloat32)) + Le<uint64_t>(2) +
                       Le<float>(1.5f) + Le<float>(-2.25f);
  std::string empty = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kUint8)) + Le<uint64_t>(0);
  // [[1, 2], []] as an array of uint16 arrays.
  std::string inner1 = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kUint16)) + Le<uint64_t>(2) +
                       Le<uint16_t>(1) + Le<uint16_t>(2);
  std::string inner2 = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kUint16)) + Le<uint64_t>(0);
  std::string nested = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kArray)) + Le<uint64_t>(2) + inner1 + inner2;
  Builder b;
  b.Kv("ints", GgufValueType::kArray, ints)
      .Kv("strings", GgufValueType::kArray, strings)
      .Kv("floats", GgufValueType::kArray, floats)
      .Kv("empty", GgufValueType::kArray, empty)
      .Kv("nested", GgufValueType::kArray, nested);
  const std::string bytes = b.Build();
  ASSERT_OK_AND_ASSIGN(auto f, ParseOf(bytes));
  ASSERT_OK_AND_ASSIGN(const GgufValue* a, f->GetArray("ints", GgufValueType::kInt64));
  ASSERT_EQ(a->count, 3u);
  EXPECT_EQ(a->IntAt(0), -1);
  EXPECT_EQ(a->IntAt(2), 70000);
  ASSERT_OK_AND_ASSIGN(const GgufValue* s, f->GetArray("strings", GgufValueType::kString));
  EXPECT_THAT(s->strings, ::testing::ElementsAre("a", "", "Ġworld"));
  ASSERT_OK_AND_ASSIGN(const GgufValue* fl, f->GetArray("floats", GgufValueType::kFloat32));
  EXPECT_EQ(fl->FloatAt(1), -2.25);
  ASSERT_OK_AND_ASSIGN(const GgufValue* e, f->GetArray("empty", GgufValueType::kString));  // empty matches any
  EXPECT_EQ(e->count, 0u);
  ASSERT_OK_AND_ASSIGN(const GgufValue* n, f->GetArray("nested", GgufValueType::kArray));
  ASSERT_EQ(n->arrays.size(), 2u);
  EXPECT_EQ(n->arrays[0].UintAt(1), 2u);
  EXPECT_EQ(n->arrays[1].count, 0u);
  EXPECT_THAT(f->GetArray("ints", GgufValueType::kString),
              StatusIs(kInvalid, "metadata 'ints' must be an array of string, got an array of int32"));
}

TEST(GgufTest, TensorTableShapesOffsetsAndData) {
  Builder b;
  b.Uint32("general.alignment", 64);
  b.alignment = 64;
  // A 2 x 3 float32 matrix (dims[0] = 3 contiguous), a Q8_0 row of 32, then a 1-D vector.
  std::string q8 = Le<uint16_t>(0x3C00) + std::string(32, '\x02');  // d = 1.0, q = 2
  b.Tensor("m", {3, 2}, 0, 0, F32s({1, 2, 3, 4, 5, 6}))
      .Tensor("q", {32}, static_cast<uint32_t>(GgmlType::kQ8_0), 64, q8)
      .Tensor("v", {4}, 0, 128, F32s({7, 8, 9, 10}));
  const std::string bytes = b.Build();
  ASSERT_OK_AND_ASSIGN(auto f, ParseOf(bytes));
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  const GgufTensor* m = f->FindTensor("m");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(m->shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(m->nbytes, 24u);
  float row1[3];
  std::memcpy(row1, f->TensorBytes(*m).data() + 12, 12);
  EXPECT_EQ(row1[0], 4.0f);
  const GgufTensor* q = f->FindTensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->nbytes, 34u);
  std::vector<float> out(32);
  ASSERT_OK(DequantizeGgml(q->type, reinterpret_cast<const uint8_t*>(f->TensorBytes(*q).data()), 32, out.data()));
  EXPECT_EQ(out[31], 2.0f);
  EXPECT_EQ(f->FindTensor("nope"), nullptr);
}

// A valid file with metadata of each kind and two tensors, for the truncation sweep.
std::string ValidFile() {
  Builder b;
  std::string strings = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kString)) + Le<uint64_t>(2) + Str("x") +
                        Str("yy");
  b.String("general.architecture", "llama").Uint32("n", 7).Kv("a", GgufValueType::kArray, strings);
  b.Tensor("t0", {4}, 0, 0, F32s({1, 2, 3, 4})).Tensor("t1", {2, 2}, 0, 32, F32s({5, 6, 7, 8}));
  return b.Build();
}

TEST(GgufTest, EveryTruncationIsRefused) {
  const std::string full = ValidFile();
  ASSERT_OK(ParseOf(full).status());
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string cut = full.substr(0, n);
    EXPECT_FALSE(ParseOf(cut).ok()) << "a " << n << "-byte prefix of " << full.size() << " parsed";
  }
}

TEST(GgufTest, HeaderErrors) {
  EXPECT_THAT(ParseOf("GGU"), StatusIs(kInvalid, "not a GGUF file"));
  EXPECT_THAT(ParseOf("GGML" + std::string(20, '\0')), StatusIs(kInvalid, "not a GGUF file"));
  Builder v1;
  v1.version = 1;
  EXPECT_THAT(ParseOf(v1.Build()), StatusIs(kInvalid, "GGUF version 1"));
  Builder big;
  big.version = 0x03000000;  // a big-endian file read on a little-endian host
  EXPECT_THAT(ParseOf(big.Build()), StatusIs(kInvalid, "big-endian"));
  Builder v4;
  v4.version = 4;
  EXPECT_THAT(ParseOf(v4.Build()), StatusIs(kInvalid, "GGUF version 4 is not supported"));
  Builder v2;
  v2.version = 2;
  v2.Uint32("k", 1);
  EXPECT_TRUE(ParseOf(v2.Build()).ok());
  Builder counts;
  EXPECT_THAT(ParseOf(counts.Build(/*tensors=*/0, /*kv=*/1ull << 60)), StatusIs(kInvalid, "metadata entries"));
  EXPECT_THAT(ParseOf(counts.Build(/*tensors=*/1ull << 60, /*kv=*/0)), StatusIs(kInvalid, "tensors, more than"));
}

TEST(GgufTest, MetadataErrorsNameTheKey) {
  {
    Builder b;
    b.Uint32("dup", 1).Uint32("dup", 2);
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "metadata key 'dup' appears twice"));
  }
  {
    Builder b;
    b.Uint32("", 1);
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "metadata entry 0 has an empty key"));
  }
  {
    Builder b;
    b.Kv("k", static_cast<GgufValueType>(13), Le<uint32_t>(0));
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "metadata 'k': value type 13 is not a GGUF value type"));
  }
  {
    Builder b;
    b.Kv("flag", GgufValueType::kBool, Le<uint8_t>(2));
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "metadata 'flag': a bool must be 0 or 1, got 2"));
  }
  {
    Builder b;  // a string claiming more bytes than the file has
    b.Kv("s", GgufValueType::kString, Le<uint64_t>(1000) + "abc");
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "metadata 's': a string of 1000 bytes"));
  }
  {
    Builder b;  // an array whose count cannot fit
    b.Kv("a", GgufValueType::kArray,
         Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kUint64)) + Le<uint64_t>(1ull << 40));
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "metadata 'a': an array of 1099511627776 uint64 values"));
  }
  {
    Builder b;
    b.Kv("a", GgufValueType::kArray, Le<uint32_t>(99) + Le<uint64_t>(0));
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "array element type 99"));
  }
  {
    // Arrays nested 9 deep.
    std::string v = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kUint8)) + Le<uint64_t>(0);
    for (int i = 0; i < 9; ++i) v = Le<uint32_t>(static_cast<uint32_t>(GgufValueType::kArray)) + Le<uint64_t>(1) + v;
    Builder b;
    b.Kv("deep", GgufValueType::kArray, v);
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "metadata 'deep': arrays nested deeper than 8"));
  }
  {
    Builder b;
    b.Kv("general.alignment", GgufValueType::kUint64, Le<uint64_t>(32));
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "'general.alignment' must be a uint32, got a uint64"));
  }
  for (uint32_t bad : {0u, 3u, 48u}) {
    Builder b;
    b.Uint32("general.alignment", bad);
    EXPECT_THAT(ParseOf(b.Build()), StatusIs(kInvalid, "'general.alignment' must be a power of two"));
  }
}

TEST(GgufTest, TensorErrorsNameTheTensor) {
  const uint32_t f32 = 0, q4_0 = static_cast<uint32_t>(GgmlType::kQ4_0);
  auto one = [](Builder b) { return ParseOf(b.Build()); };
  {
    Builder b;
    b.Tensor("w", {4}, f32, 0, F32s({1, 2, 3, 4})).Tensor("w", {4}, f32, 32, F32s({1, 2, 3, 4}));
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'w' appears twice"));
  }
  {
    Builder b;
    b.Tensor("", {4}, f32, 0, F32s({1, 2, 3, 4}));
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor entry 0 has an empty name"));
  }
  {
    Builder b;
    b.Tensor("w", {}, f32, 0, "");
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'w': rank 0 is outside [1, 4]"));
  }
  {
    Builder b;
    b.Tensor("w", {1, 1, 1, 1, 1}, f32, 0, F32s({1}));
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'w': rank 5 is outside [1, 4]"));
  }
  {
    Builder b;
    b.Tensor("w", {4, 0}, f32, 0, "");
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'w': dimension 1 is 0"));
  }
  {
    Builder b;
    b.Tensor("w", {1ull << 31, 1ull << 31}, f32, 0, "");
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'w': the byte size overflows"));
  }
  {
    Builder b;
    b.Tensor("w", {1ull << 40, 1ull << 40}, f32, 0, "");
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'w': the element count overflows 64 bits"));
  }
  {
    Builder b;
    b.Tensor("w", {4}, 4, 0, F32s({1, 2, 3, 4}));  // id 4 was Q4_2, removed from ggml
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'w': type id 4 is not a GGML type"));
  }
  {
    Builder b;
    b.Tensor("w", {48, 2}, q4_0, 0, std::string(2 * 18, '\0'));
    EXPECT_THAT(one(b), StatusIs(kInvalid, "its rows of 48 values are not a whole number of Q4_0 blocks of 32"));
  }
  {
    Builder b;
    b.Tensor("w", {4}, f32, 8, F32s({1, 2, 3, 4}));
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'w': offset 8 is not a multiple of the alignment 32"));
  }
  {
    Builder b;
    b.Tensor("w", {4}, f32, 0, F32s({1, 2, 3, 4}));
    std::string bytes = b.Build();
    bytes.resize(bytes.size() - 4);  // the data section ends 4 bytes short
    EXPECT_THAT(ParseOf(bytes), StatusIs(kInvalid, "tensor 'w' [4] (F32, 16 bytes at data offset 0) runs past"));
  }
  {
    Builder b;  // 16 float32 at 0 (64 bytes) and a tensor at 32
    b.Tensor("a", {16}, f32, 0, F32s(std::vector<float>(16, 1))).Tensor("b", {4}, f32, 32, F32s({1, 2, 3, 4}));
    EXPECT_THAT(one(b), StatusIs(kInvalid, "tensor 'b' (data offset 32) overlaps tensor 'a' (bytes 0..64)"));
  }
  {
    Builder b;  // names from the file are clipped and escaped in messages
    b.Tensor(std::string(200, 'x') + "\n", {4}, 4, 0, F32s({1, 2, 3, 4}));
    absl::Status s = one(b).status();
    EXPECT_THAT(s.message(), HasSubstr("...'"));
    EXPECT_LT(s.message().size(), 200u);
  }
}

TEST(GgufTest, OpenNamesThePath) {
  EXPECT_THAT(GgufFile::Open("/nonexistent/model.gguf"),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/model.gguf: cannot open"));
  EXPECT_FALSE(IsGgufFile("/nonexistent/model.gguf"));
  EXPECT_FALSE(IsGgufFile("/"));
}

// Every half bit pattern against the IEEE definition evaluated in double.
TEST(GgmlTypesTest, HalfToFloatIsExactForEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int sign = (h >> 15) ? -1 : 1;
    const int exp = (h >> 10) & 0x1F;
    const int mant = h & 0x3FF;
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    if (exp == 0x1F) {
      if (mant == 0) {
        EXPECT_TRUE(std::isinf(got) && (got < 0) == (sign < 0)) << h;
      } else {
        EXPECT_TRUE(std::isnan(got)) << h;
      }
      continue;
    }
    const double want = exp == 0 ? sign * std::ldexp(mant, -24) : sign * std::ldexp(1024 + mant, exp - 25);
    EXPECT_EQ(static_cast<double>(got), want) << "half 0x" << std::hex << h;
    EXPECT_EQ(std::signbit(got), sign < 0) << h;
  }
}

TEST(GgmlTypesTest, BFloat16IsTheHighHalfOfAFloat) {
  for (float f : {1.0f, -2.5f, 3.0e38f, 1.0e-40f, 0.0f}) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const float want_bits_f = [&] {
      uint32_t b = bits & 0xFFFF0000u;
      float r;
      std::memcpy(&r, &b, 4);
      return r;
    }();
    EXPECT_EQ(BFloat16ToFloat(static_cast<uint16_t>(bits >> 16)), want_bits_f);
  }
}

TEST(GgmlTypesTest, TypeTableAndRefusals) {
  const GgmlTypeInfo* q4k = FindGgmlType(12);
  ASSERT_NE(q4k, nullptr);
  EXPECT_STREQ(q4k->name, "Q4_K");
  EXPECT_EQ(q4k->block_size, 256);
  EXPECT_EQ(q4k->type_size, 144);
  EXPECT_EQ(FindGgmlType(4), nullptr);
  std::vector<float> out(256);
  std::vector<uint8_t> in(1024);
  EXPECT_THAT(DequantizeGgml(16, in.data(), 256, out.data()),
              StatusIs(absl::StatusCode::kUnimplemented, "tensor type IQ2_XXS is not supported"));
  EXPECT_THAT(DequantizeGgml(99, in.data(), 256, out.data()), StatusIs(kInvalid, "type id 99"));
  EXPECT_THAT(DequantizeGgml(2, in.data(), 33, out.data()), StatusIs(kInvalid, "not a whole number of Q4_0 blocks"));
}

}  // namespace
}  // namespace echokv::model
