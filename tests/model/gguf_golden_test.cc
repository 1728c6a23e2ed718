// The GGUF reader and the GGML block decoders against the `gguf` Python package, the
// format's own implementation (golden files in tests/model/testdata/gguf/, made by
// tools/oracle/make_gguf_goldens.py; layouts in that folder's README.md):
//   dequant/<TYPE>.bin  generated blocks and gguf.quants.dequantize's float32 output:
//                       DequantizeGgml must give the same bits (NaN payloads included);
//   files/*.gguf        files gguf.GGUFWriter wrote, with what gguf.GGUFReader reports in
//                       the .json beside each: every metadata key, type and value (floats
//                       by their bits), the tensor table and every tensor's values.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/ggml_types.h"
#include "model/gguf.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

using Json = nlohmann::json;

const std::string kDir = ECHOKV_GGUF_TESTDATA;

template <typename T>
T At(const std::string& s, size_t off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof(T));
  return v;
}

uint64_t BitsOf(const Json& hex) { return std::stoull(hex.get<std::string>(), nullptr, 16); }

class DequantGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DequantGoldenTest, SameBitsAsTheGgufPackage) {
  const std::string bytes = echokv::testing::ReadFileOrDie(kDir + "/dequant/" + GetParam() + ".bin");
  ASSERT_GE(bytes.size(), 40u);
  ASSERT_EQ(bytes.substr(0, 8), "EKVGGDQ1");
  const uint32_t type = At<uint32_t>(bytes, 8), per_block = At<uint32_t>(bytes, 12);
  const uint32_t block_bytes = At<uint32_t>(bytes, 16), blocks = At<uint32_t>(bytes, 20);
  EXPECT_EQ(std::string(bytes.c_str() + 24), GetParam());
  const GgmlTypeInfo* info = FindGgmlType(type);
  ASSERT_NE(info, nullptr);
  EXPECT_STREQ(info->name, GetParam().c_str());
  EXPECT_EQ(info->block_size, per_block);
  EXPECT_EQ(info->type_size, block_bytes);
  const size_t raw_bytes = size_t{blocks} * block_bytes;
  const size_t out_at = 40 + (raw_bytes + 3) / 4 * 4;
  const int64_t n = int64_t{blocks} * per_block;
  ASSERT_EQ(bytes.size(), out_at + 4 * static_cast<size_t>(n));
  std::vector<float> got(static_cast<size_t>(n));
  ASSERT_OK(DequantizeGgml(type, reinterpret_cast<const uint8_t*>(bytes.data() + 40), n, got.data()));
  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t want = At<uint32_t>(bytes, out_at + 4 * static_cast<size_t>(i));
    uint32_t have;
    std::memcpy(&have, &got[i], 4);
    if (have != want && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " value " << i << " (block " << i / per_block << "): got 0x" << std::hex << have
                    << ", gguf gives 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Types, DequantGoldenTest,
                         ::testing::Values("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K",
                                           "Q3_K", "Q4_K", "Q5_K", "Q6_K"));

void ExpectScalar(const GgufValue& v, GgufValueType type, const Json& want, const Json* bits, const std::string& key) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kUint16:
    case GgufValueType::kUint32:
    case GgufValueType::kUint64:
      EXPECT_EQ(v.u, want.get<uint64_t>()) << key;
      break;
    case GgufValueType::kInt8:
    case GgufValueType::kInt16:
    case GgufValueType::kInt32:
    case GgufValueType::kInt64:
      EXPECT_EQ(v.i, want.get<int64_t>()) << key;
      break;
    case GgufValueType::kFloat32: {
      const float f = static_cast<float>(v.f);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      EXPECT_EQ(b, BitsOf(*bits)) << key;
      break;
    }
    case GgufValueType::kFloat64: {
      uint64_t b;
      std::memcpy(&b, &v.f, 8);
      EXPECT_EQ(b, BitsOf(*bits)) << key;
      break;
    }
    case GgufValueType::kBool:
      EXPECT_EQ(v.u != 0, want.get<bool>()) << key;
      break;
    case GgufValueType::kString:
      EXPECT_EQ(v.s, want.get<std::string>()) << key;
      break;
    case GgufValueType::kArray:
      ADD_FAILURE() << "not a scalar: " << key;
      break;
  }
}

// An array's elements against the JSON list (numeric elements through the accessors).
void ExpectArray(const GgufValue& v, GgufValueType et, const Json& want, const Json* bits, const std::string& key) {
  ASSERT_EQ(v.count, want.size()) << key;
  ASSERT_EQ(v.element_type, et) << key;
  for (size_t k = 0; k < want.size(); ++k) {
    const std::string at = key + "[" + std::to_string(k) + "]";
    switch (et) {
      case GgufValueType::kString:
        EXPECT_EQ(v.strings[k], want[k].get<std::string>()) << at;
        break;
      case GgufValueType::kBool:
        EXPECT_EQ(v.IntAt(k) != 0, want[k].get<bool>()) << at;
        break;
      case GgufValueType::kFloat32: {
        const float f = static_cast<float>(v.FloatAt(k));
        uint32_t b;
        std::memcpy(&b, &f, 4);
        EXPECT_EQ(b, BitsOf((*bits)[k])) << at;
        break;
      }
      case GgufValueType::kFloat64: {
        const double d = v.FloatAt(k);
        uint64_t b;
        std::memcpy(&b, &d, 8);
        EXPECT_EQ(b, BitsOf((*bits)[k])) << at;
        break;
      }
      case GgufValueType::kUint64:
        EXPECT_EQ(v.UintAt(k), want[k].get<uint64_t>()) << at;
        break;
      case GgufValueType::kArray:
        ADD_FAILURE() << "nested arrays are checked by the caller: " << at;
        break;
      default:
        EXPECT_EQ(v.IntAt(k), want[k].get<int64_t>()) << at;
        break;
    }
  }
}

class FileGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FileGoldenTest, MetadataAndTensorsAsTheGgufReaderSeesThem) {
  const Json j = Json::parse(echokv::testing::ReadFileOrDie(kDir + "/files/" + GetParam() + ".json"));
  ASSERT_OK_AND_ASSIGN(auto f, GgufFile::Open(kDir + "/files/" + GetParam() + ".gguf"));
  EXPECT_EQ(f->version(), j["version"].get<uint32_t>());
  EXPECT_EQ(f->alignment(), j["alignment"].get<uint32_t>());
  EXPECT_EQ(f->data_offset(), j["data_offset"].get<uint64_t>());
  EXPECT_EQ(f->file_size(), j["file_bytes"].get<uint64_t>());
  ASSERT_EQ(f->metadata().size(), j["kv_count"].get<size_t>());
  for (size_t i = 0; i < f->metadata().size(); ++i) {
    const GgufKeyValue& kv = f->metadata()[i];
    const Json& m = j["metadata"][i];
    const std::string key = m["key"].get<std::string>();
    ASSERT_EQ(kv.key, key) << "entry " << i;
    ASSERT_EQ(static_cast<uint32_t>(kv.value.type), m["type_id"].get<uint32_t>()) << key;
    const Json* bits = m.contains("bits") ? &m["bits"] : nullptr;
    if (kv.value.type != GgufValueType::kArray) {
      ExpectScalar(kv.value, kv.value.type, m["value"], bits, key);
      continue;
    }
    if (m["element_type"] == "ARRAY") {
      ASSERT_EQ(kv.value.arrays.size(), m["value"].size()) << key;
      for (size_t a = 0; a < kv.value.arrays.size(); ++a) {
        const GgufValue& inner = kv.value.arrays[a];
        const GgufValueType et = m["inner_element_type"] == "STRING" ? GgufValueType::kString : GgufValueType::kInt32;
        ExpectArray(inner, et, m["value"][a], nullptr, key + "[" + std::to_string(a) + "]");
      }
      continue;
    }
    // Element type by name (as the JSON spells gguf's GGUFValueType).
    static const std::pair<const char*, GgufValueType> kNames[] = {
        {"UINT8", GgufValueType::kUint8},     {"INT8", GgufValueType::kInt8},       {"UINT16", GgufValueType::kUint16},
        {"INT16", GgufValueType::kInt16},     {"UINT32", GgufValueType::kUint32},   {"INT32", GgufValueType::kInt32},
        {"FLOAT32", GgufValueType::kFloat32}, {"BOOL", GgufValueType::kBool},       {"STRING", GgufValueType::kString},
        {"UINT64", GgufValueType::kUint64},   {"INT64", GgufValueType::kInt64},     {"FLOAT64", GgufValueType::kFloat64}};
    GgufValueType et = GgufValueType::kUint8;
    for (const auto& [name, t] : kNames) {
      if (m["element_type"] == name) et = t;
    }
    ExpectArray(kv.value, et, m["value"], bits, key);
  }
  ASSERT_EQ(f->tensors().size(), j["tensor_count"].get<size_t>());
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const GgufTensor& t = f->tensors()[i];
    const Json& w = j["tensors"][i];
    const std::string name = w["name"].get<std::string>();
    ASSERT_EQ(t.name, name);
    EXPECT_EQ(t.type, w["type_id"].get<uint32_t>()) << name;
    EXPECT_EQ(t.dims, w["ne"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(t.shape(), w["numpy_shape"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(t.elements, w["n_elements"].get<int64_t>()) << name;
    EXPECT_EQ(t.nbytes, w["n_bytes"].get<uint64_t>()) << name;
    EXPECT_EQ(t.offset, w["offset"].get<uint64_t>()) << name;
    std::vector<float> got(static_cast<size_t>(t.elements));
    absl::string_view raw = f->TensorBytes(t);
    ASSERT_OK(DequantizeGgml(t.type, reinterpret_cast<const uint8_t*>(raw.data()), t.elements, got.data()));
    const std::vector<double> want = w["f32_values"].get<std::vector<double>>();
    ASSERT_EQ(want.size(), got.size()) << name;
    for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(static_cast<double>(got[k]), want[k]) << name << "[" << k << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Files, FileGoldenTest,
                         ::testing::Values("all_types_v3_align64", "all_types_v2_align64", "k_types_v3_align256",
                                           "default_align_v3"));

TEST(GgufGoldenTest, BigEndianFilesAreRefusedByName) {
  EXPECT_THAT(GgufFile::Open(kDir + "/files/big_endian_v3.gguf"),
              echokv::testing::StatusIs(absl::StatusCode::kInvalidArgument, "big-endian"));
}

}  // namespace
}  // namespace echokv::model
