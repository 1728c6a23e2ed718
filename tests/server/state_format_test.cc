// Byte formats of the state store, the session id grammar and the model fingerprint,
// tested on their own (no directory involved).
#include <xxhash.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/fingerprint.h"
#include "server/state/format.h"
#include "server/state/session_id.h"
#include "server/state/types.h"
#include "tests/server/state_testing.h"
#include "tests/testing/status_matchers.h"

namespace echokv::state {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::HasSubstr;
using namespace ::echokv::state::testing;  // NOLINT: test helpers

// ---------------- session ids ----------------

TEST(SessionIdTest, AcceptsTheGrammar) {
  const std::string hex = "0123456789abcdef0123456789abcdef";
  for (const std::string& id :
       {hex, "echokv-2." + hex, "a." + hex, "0." + hex, "a-b." + hex, "a--b." + hex,
        std::string(63, 'z') + "." + hex, "x" + std::string(61, '-') + "y." + hex}) {
    EXPECT_TRUE(IsValidSessionId(id)) << id;
    EXPECT_THAT(ValidateSessionId(id), IsOk()) << id;
  }
}

TEST(SessionIdTest, RefusesEverythingElse) {
  const std::string hex = "0123456789abcdef0123456789abcdef";
  const std::vector<std::string> bad = {
      "",
      hex.substr(1),                                  // 31 digits
      hex + "0",                                      // 33 digits: "0" + 32 would need a '.'
      "0123456789ABCDEF0123456789abcdef",             // uppercase
      "0123456789abcdeg0123456789abcdef",             // not hex
      "." + hex,                                      // empty label
      "-a." + hex, "a-." + hex,                       // label starts / ends with '-'
      "Echokv." + hex,                                // uppercase label
      "a_b." + hex, "a b." + hex,                     // bad characters
      std::string(64, 'a') + "." + hex,               // label of 64
      "a.b." + hex,                                   // two labels
      "../" + hex, "../x", "..", ".", "/" + hex,      // path traversal
      "a/." + hex, "x/../" + hex,
      hex + "/", hex + ".", hex + std::string(1, '\0'),
      std::string("a\0b.", 4) + hex,
  };
  for (const std::string& id : bad) {
    EXPECT_FALSE(IsValidSessionId(id)) << absl::CHexEscape(id);
    EXPECT_THAT(ValidateSessionId(id), StatusIs(absl::StatusCode::kInvalidArgument, "session id"))
        << absl::CHexEscape(id);
  }
  EXPECT_THAT(ValidateSessionId(std::string(200, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, "at most 96"));
  // A snapshot's id is the client's: echoed as common/echo.h's short prefix.
  const absl::Status huge = ValidateSessionId(std::string("\x01") + std::string(1 << 20, 'a'));
  EXPECT_THAT(huge, StatusIs(absl::StatusCode::kInvalidArgument, "session id '\\x01aaa"));
  EXPECT_LT(huge.message().size(), 160u) << huge.message();
}

// ---------------- small values ----------------

TEST(TypesTest, DTypesAndModesRoundTripByName) {
  for (uint8_t raw = 1; raw <= 9; ++raw) {
    DType d = static_cast<DType>(raw);
    ASSERT_TRUE(IsKnownDType(raw));
    EXPECT_GT(DTypeSize(d), 0u);
    ASSERT_OK_AND_ASSIGN(DType back, DTypeFromName(DTypeName(d)));
    EXPECT_EQ(back, d);
  }
  EXPECT_FALSE(IsKnownDType(0));
  EXPECT_FALSE(IsKnownDType(10));
  EXPECT_THAT(DTypeFromName("float8"), StatusIs(absl::StatusCode::kInvalidArgument, "float8"));
  EXPECT_EQ(*MemoryModeFromName("tiered"), MemoryMode::kTiered);
  EXPECT_EQ(*MemoryModeFromName("evict"), MemoryMode::kEvict);
  EXPECT_THAT(MemoryModeFromName("Tiered"), StatusIs(absl::StatusCode::kInvalidArgument, "Tiered"));
}

TEST(TypesTest, FingerprintHex) {
  ModelFingerprint fp{0x0011223344556677ull, 0x8899aabbccddeeffull};
  EXPECT_EQ(fp.ToHex(), "8899aabbccddeeff0011223344556677");
  ASSERT_OK_AND_ASSIGN(ModelFingerprint back, ModelFingerprint::FromHex(fp.ToHex()));
  EXPECT_EQ(back, fp);
  EXPECT_FALSE(ModelFingerprint::FromHex("8899AABBccddeeff0011223344556677").ok());
  EXPECT_FALSE(ModelFingerprint::FromHex("8899").ok());
}

TEST(TypesTest, ErrorKindTravelsWithTheStatus) {
  for (ErrorKind kind : kAllErrorKinds) {
    absl::Status s = internal::KindError(kind, "x");
    EXPECT_EQ(ErrorKindOf(s), kind) << ErrorKindName(kind);
  }
  EXPECT_EQ(internal::KindError(ErrorKind::kChecksum, "x").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(internal::KindError(ErrorKind::kForeignModel, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrorKindOf(absl::DataLossError("no kind")), std::nullopt);
  EXPECT_EQ(ErrorKindOf(absl::OkStatus()), std::nullopt);
}

TEST(TypesTest, MetaValidateNamesTheField) {
  SavedSession m = MakeMeta(TestId(1), 4);
  EXPECT_THAT(m.Validate(), IsOk());
  SavedSession bad = m;
  bad.id = "../etc";
  EXPECT_THAT(bad.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "id:"));
  bad = m;
  bad.compression_config = nlohmann::json::array();
  EXPECT_THAT(bad.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "compression_config"));
  bad = m;
  bad.next_position = -1;
  EXPECT_THAT(bad.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "next_position"));
  bad = m;
  bad.ttl = -absl::Seconds(1);
  EXPECT_THAT(bad.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "ttl"));
  bad = m;
  bad.tenant = std::string(1025, 't');
  EXPECT_THAT(bad.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "tenant"));
}

// ---------------- fingerprint ----------------

TEST(FingerprintTest, MatchesTheDocumentedByteStream) {
  // The documented stream, built by hand and hashed in one call of the library's
  // one-shot XXH3-128: the streaming builder must give the same value.
  auto u64 = [](std::string* s, uint64_t v) {
    for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  std::string config = R"({"hidden_size": 8})";
  std::string w1 = Bytes(1, 64), w2 = Bytes(2, 32);
  std::string stream = "echokv-model-fingerprint-v1";
  u64(&stream, config.size());
  stream += config;
  for (auto [name, dtype, dims, data] :
       {std::tuple<std::string, std::string, std::vector<int64_t>, std::string>{"a.weight", "F32", {4, 4}, w1},
        {"b.weight", "F16", {16}, w2}}) {
    u64(&stream, name.size());
    stream += name;
    u64(&stream, dtype.size());
    stream += dtype;
    u64(&stream, dims.size());
    for (int64_t d : dims) u64(&stream, static_cast<uint64_t>(d));
    u64(&stream, data.size());
    stream += data;
  }
  XXH128_hash_t want = XXH3_128bits(stream.data(), stream.size());

  FingerprintBuilder b;
  ASSERT_OK(b.AddConfig(config));
  ASSERT_OK(b.AddTensor("a.weight", "F32", {4, 4}, w1));
  ASSERT_OK(b.AddTensor("b.weight", "F16", {16}, w2));
  ASSERT_OK_AND_ASSIGN(ModelFingerprint got, b.Finish());
  EXPECT_EQ(got.low, want.low64);
  EXPECT_EQ(got.high, want.high64);

  // The one-call form sorts.
  ASSERT_OK_AND_ASSIGN(ModelFingerprint sorted,
                       ComputeModelFingerprint(config, {{"b.weight", "F16", {16}, w2},
                                                        {"a.weight", "F32", {4, 4}, w1}}));
  EXPECT_EQ(sorted, got);
  // Pinned value: a change to the encoding changes every fingerprint on disk.
  EXPECT_EQ(got.ToHex(), absl::StrCat(absl::Hex(want.high64, absl::kZeroPad16),
                                      absl::Hex(want.low64, absl::kZeroPad16)));
}

TEST(FingerprintTest, EveryInputChangesIt) {
  std::string config = R"({"n": 1})";
  std::string w = Bytes(3, 64);
  auto fp = [&](absl::string_view c, absl::string_view name, absl::string_view dtype,
                std::vector<int64_t> shape, absl::string_view data) {
    return *ComputeModelFingerprint(c, {{name, dtype, shape, data}});
  };
  ModelFingerprint base = fp(config, "w", "F32", {16}, w);
  std::string w2 = w;
  w2[63] ^= 1;
  EXPECT_NE(fp(R"({"n": 2})", "w", "F32", {16}, w), base);
  EXPECT_NE(fp(config, "v", "F32", {16}, w), base);
  EXPECT_NE(fp(config, "w", "F16", {16}, w), base);
  EXPECT_NE(fp(config, "w", "F32", {4, 4}, w), base);
  EXPECT_NE(fp(config, "w", "F32", {16}, w2), base);
  EXPECT_EQ(fp(config, "w", "F32", {16}, w), base);
  // Moving a byte between name and dtype is a different stream (lengths are hashed).
  EXPECT_NE(fp(config, "wF", "32", {16}, w), base);
}

TEST(FingerprintTest, RefusesMisuse) {
  FingerprintBuilder b;
  EXPECT_THAT(b.AddTensor("a", "F32", {}, ""), StatusIs(absl::StatusCode::kFailedPrecondition, "AddConfig"));
  EXPECT_FALSE(b.Finish().ok());
  FingerprintBuilder c;
  ASSERT_OK(c.AddConfig("{}"));
  ASSERT_OK(c.AddTensor("b", "F32", {}, ""));
  EXPECT_THAT(c.AddTensor("a", "F32", {}, ""), StatusIs(absl::StatusCode::kInvalidArgument, "strictly increasing"));
  EXPECT_FALSE(c.Finish().ok());
  EXPECT_THAT(ComputeModelFingerprint("{}", {{"a", "F32", {}, ""}, {"a", "F32", {}, ""}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "strictly increasing"));
}

// ---------------- segment header ----------------

internal::SegmentFixed FixedFor(uint64_t seq) {
  internal::SegmentFixed f;
  f.model = kModel;
  f.seq = seq;
  f.token_begin = 10;
  f.token_end = 26;
  return f;
}

TEST(SegmentFormatTest, HeaderRoundTripsAndIsLaidOutAsDocumented) {
  TurnData turn = MakeTurn(5, 10, 16);
  internal::SegmentFixed f = FixedFor(3);
  f.payload_xxh3 = 0xabcdef;
  std::vector<BlobInfo> layout;
  ASSERT_OK_AND_ASSIGN(std::string header, internal::EncodeSegmentHeader(turn.segment.blobs, &f, &layout));
  ASSERT_EQ(header.size(), f.payload_offset);
  EXPECT_EQ(f.payload_offset % 64, 0u);
  EXPECT_EQ(header.substr(0, 8), "ECHOKVSG");
  EXPECT_EQ(internal::GetU32(header.data() + 8), 1u);
  EXPECT_EQ(internal::GetU64(header.data() + 16), kModel.low);
  EXPECT_EQ(internal::GetU64(header.data() + 24), kModel.high);
  EXPECT_EQ(internal::GetU64(header.data() + 32), 3u);
  EXPECT_EQ(internal::GetU64(header.data() + 40), 10u);
  EXPECT_EQ(internal::GetU64(header.data() + 48), 26u);
  EXPECT_EQ(internal::GetU32(header.data() + 56), turn.segment.blobs.size());
  EXPECT_EQ(internal::GetU64(header.data() + 80), 0xabcdefu);
  EXPECT_EQ(internal::GetU64(header.data() + 120), XXH3_64bits(header.data(), 120));
  EXPECT_EQ(internal::GetU64(header.data() + 88), XXH3_64bits(header.data() + 128, f.table_bytes));
  // Blobs: in order, 64-byte aligned, exactly their bytes.
  uint64_t end = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(layout[i].offset % 64, 0u);
    EXPECT_GE(layout[i].offset, end);
    EXPECT_LT(layout[i].offset, end + 64);
    EXPECT_EQ(layout[i].bytes, turn.segment.blobs[i].data.size());
    end = layout[i].offset + layout[i].bytes;
  }
  EXPECT_EQ(f.payload_bytes, end);

  StateLimits limits;
  ASSERT_OK_AND_ASSIGN(internal::SegmentFixed back, internal::DecodeSegmentFixed(header, kModel, limits, "seg"));
  EXPECT_EQ(back.seq, 3u);
  EXPECT_EQ(back.payload_offset, f.payload_offset);
  EXPECT_EQ(back.header_xxh3, f.header_xxh3);
  ASSERT_OK_AND_ASSIGN(std::vector<BlobInfo> blobs,
                       internal::DecodeBlobTable(absl::string_view(header).substr(128), back, "seg"));
  ASSERT_EQ(blobs.size(), layout.size());
  for (size_t i = 0; i < blobs.size(); ++i) {
    EXPECT_EQ(blobs[i].name, layout[i].name);
    EXPECT_EQ(blobs[i].dtype, layout[i].dtype);
    EXPECT_EQ(blobs[i].shape, layout[i].shape);
    EXPECT_EQ(blobs[i].offset, layout[i].offset);
    EXPECT_EQ(blobs[i].bytes, layout[i].bytes);
  }
}

TEST(SegmentFormatTest, EveryHeaderByteIsChecked) {
  TurnData turn = MakeTurn(5, 10, 16);
  internal::SegmentFixed f = FixedFor(3);
  std::vector<BlobInfo> layout;
  ASSERT_OK_AND_ASSIGN(std::string header, internal::EncodeSegmentHeader(turn.segment.blobs, &f, &layout));
  StateLimits limits;
  for (size_t i = 0; i < header.size(); ++i) {
    std::string bad = header;
    bad[i] ^= 0x01;
    auto fixed = internal::DecodeSegmentFixed(bad, kModel, limits, "seg");
    absl::Status status = fixed.status();
    if (fixed.ok()) status = internal::DecodeBlobTable(absl::string_view(bad).substr(128), *fixed, "seg").status();
    ASSERT_FALSE(status.ok()) << "flipped byte " << i << " went unnoticed";
    ErrorKind want = (i >= 8 && i < 12) ? ErrorKind::kUnknownVersion : ErrorKind::kChecksum;
    EXPECT_EQ(ErrorKindOf(status), want) << "byte " << i << ": " << status;
  }
  EXPECT_EQ(ErrorKindOf(internal::DecodeSegmentFixed(header.substr(0, 127), kModel, limits, "seg").status()),
            ErrorKind::kTruncated);
  EXPECT_THAT(internal::DecodeSegmentFixed(header, kOtherModel, limits, "seg"),
              StatusIs(absl::StatusCode::kFailedPrecondition, kModel.ToHex()));
}

TEST(SegmentFormatTest, RefusesBadBlobs) {
  std::string four(4, 'x');
  auto encode = [&](std::vector<BlobView> blobs) {
    internal::SegmentFixed f = FixedFor(1);
    std::vector<BlobInfo> layout;
    return internal::EncodeSegmentHeader(blobs, &f, &layout).status();
  };
  EXPECT_THAT(encode({{"a", DType::kFloat32, {2}, four}}), StatusIs(absl::StatusCode::kInvalidArgument, "need 8"));
  EXPECT_THAT(encode({{"a", DType::kFloat32, {1}, four}, {"a", DType::kFloat32, {1}, four}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
  EXPECT_THAT(encode({{"", DType::kFloat32, {1}, four}}), StatusIs(absl::StatusCode::kInvalidArgument, "1..255"));
  EXPECT_THAT(encode({{"a b", DType::kFloat32, {1}, four}}), StatusIs(absl::StatusCode::kInvalidArgument, "character"));
  EXPECT_THAT(encode({{"a", DType::kFloat32, {-1}, four}}), StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  EXPECT_THAT(encode({{"a", DType::kFloat32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, four}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "rank"));
  EXPECT_THAT(encode({{"a", DType::kFloat32, {int64_t{1} << 40, int64_t{1} << 40}, four}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflow"));
  EXPECT_THAT(encode({{"a", static_cast<DType>(42), {1}, four}}), StatusIs(absl::StatusCode::kInvalidArgument, "dtype"));
  EXPECT_THAT(encode({}), IsOk());  // a segment may carry no blob
}

// ---------------- manifest ----------------

SessionManifest ManifestFor(int64_t tokens) {
  SessionManifest m;
  m.meta = MakeMeta(TestId(9, "echokv-2"), tokens);
  m.model = kModel;
  SegmentInfo s1{1, 0, tokens / 2, false, 100, 356, 0x1111, 0x2222, {}};
  SegmentInfo s2{2, tokens / 2, tokens, false, 200, 456, 0x3333, 0x4444, {}};
  m.segments = {s1, s2};
  return m;
}

void ExpectSameManifest(const SessionManifest& a, const SessionManifest& b) {
  EXPECT_EQ(a.meta.id, b.meta.id);
  EXPECT_EQ(a.meta.tenant, b.meta.tenant);
  EXPECT_EQ(a.meta.memory, b.meta.memory);
  EXPECT_EQ(a.meta.compression_config, b.meta.compression_config);
  EXPECT_EQ(a.meta.created, b.meta.created);
  EXPECT_EQ(a.meta.last_used, b.meta.last_used);
  EXPECT_EQ(a.meta.ttl, b.meta.ttl);
  EXPECT_EQ(a.meta.tokens, b.meta.tokens);
  EXPECT_EQ(a.meta.next_position, b.meta.next_position);
  EXPECT_EQ(a.model, b.model);
  ASSERT_EQ(a.segments.size(), b.segments.size());
  for (size_t i = 0; i < a.segments.size(); ++i) {
    EXPECT_EQ(a.segments[i].seq, b.segments[i].seq);
    EXPECT_EQ(a.segments[i].token_begin, b.segments[i].token_begin);
    EXPECT_EQ(a.segments[i].token_end, b.segments[i].token_end);
    EXPECT_EQ(a.segments[i].supersedes_earlier, b.segments[i].supersedes_earlier);
    EXPECT_EQ(a.segments[i].payload_bytes, b.segments[i].payload_bytes);
    EXPECT_EQ(a.segments[i].file_bytes, b.segments[i].file_bytes);
    EXPECT_EQ(a.segments[i].payload_xxh3, b.segments[i].payload_xxh3);
    EXPECT_EQ(a.segments[i].header_xxh3, b.segments[i].header_xxh3);
  }
}

TEST(ManifestFormatTest, RoundTrips) {
  StateLimits limits;
  for (int64_t tokens : {2, 3, 1001}) {
    SessionManifest m = ManifestFor(tokens);
    m.meta.tokens.back() = -7;  // int32 survives as is
    m.meta.compression_config["nested"] = {{"list", {1, 2.5, "é"}}};
    ASSERT_OK_AND_ASSIGN(std::string bytes, internal::EncodeManifest(m));
    EXPECT_EQ(bytes.substr(0, 8), "ECHOKVMF");
    ASSERT_OK_AND_ASSIGN(SessionManifest back, internal::DecodeManifest(bytes, kModel, limits, "m"));
    ExpectSameManifest(m, back);
  }
  SessionManifest m = ManifestFor(4);
  m.meta.ttl = absl::InfiniteDuration();
  m.meta.memory = MemoryMode::kEvict;
  ASSERT_OK_AND_ASSIGN(std::string bytes, internal::EncodeManifest(m));
  ASSERT_OK_AND_ASSIGN(SessionManifest back, internal::DecodeManifest(bytes, kModel, limits, "m"));
  ExpectSameManifest(m, back);
}

TEST(ManifestFormatTest, EveryByteIsChecked) {
  StateLimits limits;
  ASSERT_OK_AND_ASSIGN(std::string bytes, internal::EncodeManifest(ManifestFor(6)));
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    absl::Status s = internal::DecodeManifest(bad, kModel, limits, "m").status();
    ASSERT_FALSE(s.ok()) << "flipped byte " << i << " went unnoticed";
    ErrorKind want = (i >= 8 && i < 12) ? ErrorKind::kUnknownVersion : ErrorKind::kChecksum;
    EXPECT_EQ(ErrorKindOf(s), want) << "byte " << i << ": " << s;
  }
  for (size_t n : {size_t{0}, size_t{63}, size_t{64}, bytes.size() - 1}) {
    EXPECT_EQ(ErrorKindOf(internal::DecodeManifest(bytes.substr(0, n), kModel, limits, "m").status()),
              ErrorKind::kTruncated)
        << n;
  }
  EXPECT_EQ(ErrorKindOf(internal::DecodeManifest(bytes + "x", kModel, limits, "m").status()), ErrorKind::kChecksum);
  EXPECT_EQ(ErrorKindOf(internal::DecodeManifest(bytes, kOtherModel, limits, "m").status()),
            ErrorKind::kForeignModel);
}

// A manifest whose JSON is `json` (valid checksums): field errors are kBadManifest.
std::string ManifestWithJson(const std::string& json, uint64_t tokens) {
  std::string out = "ECHOKVMF";
  internal::PutU32(&out, 1);
  internal::PutU32(&out, 0);
  internal::PutU64(&out, kModel.low);
  internal::PutU64(&out, kModel.high);
  internal::PutU64(&out, json.size());
  internal::PutU64(&out, tokens);
  internal::PutU64(&out, 0);
  internal::PutU64(&out, internal::Xxh3(out));
  out += json;
  out.resize(64 + internal::AlignUp(json.size(), 4), '\0');
  for (uint64_t i = 0; i < tokens; ++i) internal::PutU32(&out, 5);
  internal::PutU64(&out, internal::Xxh3(absl::string_view(out).substr(64)));
  return out;
}

TEST(ManifestFormatTest, BadFieldsAreBadManifest) {
  StateLimits limits;
  ASSERT_OK_AND_ASSIGN(std::string good, internal::EncodeManifest(ManifestFor(6)));
  nlohmann::json j = nlohmann::json::parse(good.substr(64, internal::GetU64(good.data() + 32)));
  ASSERT_OK(internal::DecodeManifest(ManifestWithJson(j.dump(), 6), kModel, limits, "m").status());
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no id", [](nlohmann::json& j) { j.erase("id"); }, "\"id\""},
      {"bad id", [](nlohmann::json& j) { j["id"] = "../x"; }, "session id"},
      {"memory", [](nlohmann::json& j) { j["memory"] = "cold"; }, "memory"},
      {"compression", [](nlohmann::json& j) { j["compression"] = 3; }, "compression"},
      {"ttl", [](nlohmann::json& j) { j["ttl_us"] = -5; }, "ttl_us"},
      {"position", [](nlohmann::json& j) { j["next_position"] = "x"; }, "next_position"},
      {"segments", [](nlohmann::json& j) { j["segments"] = nlohmann::json::array(); }, "no segment"},
      {"seq order", [](nlohmann::json& j) { j["segments"][1]["seq"] = 1; }, "increasing"},
      {"gap", [](nlohmann::json& j) { j["segments"][1]["token_begin"] = 2; }, "starts at token"},
      {"end", [](nlohmann::json& j) { j["segments"][1]["token_end"] = 5; }, "end at token"},
      {"late supersedes", [](nlohmann::json& j) { j["segments"][1]["supersedes"] = true; }, "not the first"},
      {"hex", [](nlohmann::json& j) { j["segments"][0]["payload_xxh3"] = "12"; }, "payload_xxh3"},
      {"huge", [](nlohmann::json& j) { j["segments"][0]["file_bytes"] = 18446744073709551615ull; }, "file_bytes"},
  };
  for (const Case& c : cases) {
    nlohmann::json e = j;
    c.edit(e);
    absl::Status s = internal::DecodeManifest(ManifestWithJson(e.dump(), 6), kModel, limits, "m").status();
    EXPECT_EQ(ErrorKindOf(s), ErrorKind::kBadManifest) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
  }
  for (const std::string& json : {std::string("[1]"), std::string("{"), std::string(100, '[') + std::string(100, ']')}) {
    EXPECT_EQ(ErrorKindOf(internal::DecodeManifest(ManifestWithJson(json, 0), kModel, limits, "m").status()),
              ErrorKind::kBadManifest)
        << json.substr(0, 10);
  }
  // Limits are checked from the header, before anything is allocated.
  StateLimits tight;
  tight.max_tokens = 5;
  EXPECT_THAT(internal::DecodeManifest(good, kModel, tight, "m"),
              StatusIs(absl::StatusCode::kDataLoss, "6 tokens is over the limit of 5"));
  tight = StateLimits();
  tight.max_manifest_json_bytes = 10;
  EXPECT_THAT(internal::DecodeManifest(good, kModel, tight, "m"), StatusIs(absl::StatusCode::kDataLoss, "limit"));
}

TEST(ManifestFormatTest, NonUtf8StringsAreRefusedWhenWriting) {
  SessionManifest m = ManifestFor(4);
  m.meta.tenant = "\xff\xfe";
  EXPECT_THAT(internal::EncodeManifest(m), StatusIs(absl::StatusCode::kInvalidArgument, "JSON"));
}

// ---------------- snapshot header / trailer ----------------

TEST(SnapshotFormatTest, HeaderAndTrailer) {
  internal::SnapshotHeader h;
  h.model = kModel;
  h.manifest_bytes = 1234;
  h.segment_count = 3;
  std::string bytes = internal::EncodeSnapshotHeader(h);
  ASSERT_EQ(bytes.size(), internal::kSnapshotHeaderBytes);
  ASSERT_OK_AND_ASSIGN(internal::SnapshotHeader back, internal::DecodeSnapshotHeader(bytes, kModel));
  EXPECT_EQ(back.manifest_bytes, 1234u);
  EXPECT_EQ(back.segment_count, 3u);
  EXPECT_THAT(internal::DecodeSnapshotHeader(bytes, kOtherModel),
              StatusIs(absl::StatusCode::kFailedPrecondition, "fingerprint"));
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 1;
    absl::StatusCode want = i < 8    ? absl::StatusCode::kInvalidArgument
                            : i < 12 ? absl::StatusCode::kFailedPrecondition
                                     : absl::StatusCode::kDataLoss;
    EXPECT_EQ(internal::DecodeSnapshotHeader(bad, kModel).status().code(), want) << i;
  }
  std::string trailer = internal::EncodeSnapshotTrailer(100, 0x55);
  EXPECT_OK(internal::CheckSnapshotTrailer(trailer, 100, 0x55));
  EXPECT_THAT(internal::CheckSnapshotTrailer(trailer, 101, 0x55), StatusIs(absl::StatusCode::kDataLoss, "101"));
  EXPECT_THAT(internal::CheckSnapshotTrailer(trailer, 100, 0x56), StatusIs(absl::StatusCode::kDataLoss, "stream checksum"));
}

}  // namespace
}  // namespace echokv::state
