// ParseRequest / CheckWire (server/doors/grpc/wire_check.h): invalid UTF-8 in any string field of
// any request is named with its path; malformed wire data is refused as such; valid
// requests parse exactly as protobuf parses them. The oracle for "valid" is protobuf's
// own parser (a request it accepts must pass; one it refuses must be refused).
#include "server/doors/grpc/wire_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "proto/echokv/v1/echokv.pb.h"
#include "server/doors/grpc/request_convert.h"
#include "server/engine/session_store.h"
#include "tests/testing/status_matchers.h"

namespace echokv::server {
namespace {

namespace pb = ::echokv::v1;
using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kBad = std::string("ok\xc3\x28", 4);     // a broken 2-byte sequence
const std::string kSurrogate = "\xed\xa0\x80";            // U+D800 encoded: invalid
const std::string kOverlong = "\xc0\xaf";                 // overlong '/'

// Serializes `m` with one string field replaced by raw bytes: protobuf's C++
// serializer refuses invalid UTF-8 only by logging, so build it as a bytes twin.
template <typename M>
std::string Wire(const M& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

TEST(WireCheckTest, ValidRequestsParseAsProtobufParsesThem) {
  pb::CreateSessionRequest req;
  req.mutable_input()->set_text("Once upon a time ✓ 東京");
  req.mutable_compression()->set_policy("echokv");
  req.set_ttl_seconds(60);
  pb::CreateSessionRequest got;
  ASSERT_THAT(ParseRequest(Wire(req), &got), IsOk());
  EXPECT_EQ(got.SerializeAsString(), req.SerializeAsString());
  pb::ListSessionsRequest empty;
  EXPECT_THAT(ParseRequest("", &empty), IsOk());
}

TEST(WireCheckTest, InvalidUtf8IsNamedWithItsFieldPath) {
  for (const std::string& bad : {kBad, kSurrogate, kOverlong, std::string("\xff")}) {
    {
      pb::CreateSessionRequest req;
      req.mutable_input()->set_text(bad);
      pb::CreateSessionRequest got;
      EXPECT_THAT(ParseRequest(Wire(req), &got),
                  StatusIs(absl::StatusCode::kInvalidArgument, "input.text: not valid UTF-8"));
      // protobuf itself refuses it (so CheckWire and the parser agree).
      EXPECT_FALSE(got.ParseFromString(Wire(req)));
    }
    {
      pb::CreateSessionRequest req;
      auto* chat = req.mutable_input()->mutable_chat();
      chat->add_messages()->set_content("fine");
      chat->add_messages()->set_role("user");
      chat->mutable_messages(1)->set_content(bad);
      pb::CreateSessionRequest got;
      EXPECT_THAT(ParseRequest(Wire(req), &got),
                  StatusIs(absl::StatusCode::kInvalidArgument, "input.chat.messages[1].content: not valid UTF-8"));
    }
    {
      pb::GenerateRequest req;
      req.set_session_id(std::string(32, 'a'));
      req.add_stop("x");
      req.add_stop(bad);
      pb::GenerateRequest got;
      EXPECT_THAT(ParseRequest(Wire(req), &got),
                  StatusIs(absl::StatusCode::kInvalidArgument, "stop[1]: not valid UTF-8"));
    }
    {
      pb::GetSessionRequest req;
      req.set_session_id(bad);
      pb::GetSessionRequest got;
      absl::Status s = ParseRequest(Wire(req), &got);
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "session_id: not valid UTF-8"));
      EXPECT_THAT(std::string(s.message()), Not(HasSubstr(bad)));  // no client bytes echoed
    }
    {
      pb::CompressRequest req;
      req.mutable_input()->set_text("fine");
      req.mutable_compression()->set_bootstrap(bad);
      pb::CompressRequest got;
      EXPECT_THAT(ParseRequest(Wire(req), &got),
                  StatusIs(absl::StatusCode::kInvalidArgument, "compression.bootstrap: not valid UTF-8"));
    }
  }
}

TEST(WireCheckTest, GarbageIsRefusedAsAMalformedMessage) {
  pb::GetSessionRequest got;
  for (const std::string& junk : {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
                                  std::string("\x0a\x10short", 7),  // length 16, 5 bytes follow
                                  std::string("\x00", 1),           // field number 0
                                  std::string("\x0f", 1)}) {        // wire type 7
    EXPECT_THAT(ParseRequest(junk, &got),
                StatusIs(absl::StatusCode::kInvalidArgument, "is not a valid echokv.v1.GetSessionRequest message"))
        << junk.size();
  }
}

// Random bytes: whatever protobuf accepts, ParseRequest accepts with the same result;
// whatever protobuf refuses, ParseRequest refuses (and never crashes).
TEST(WireCheckTest, AgreesWithProtobufOnRandomBytes) {
  std::mt19937 rng(12);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 24, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? (rng() % 3 == 0 ? 0x0a : 0x12) : rng());
    pb::CreateSessionRequest ours, theirs;
    const bool ok = ParseRequest(bytes, &ours).ok();
    const bool proto_ok = theirs.ParseFromString(bytes);
    ASSERT_EQ(ok, proto_ok) << i;
    if (ok) {
      ++accepted;
      EXPECT_EQ(ours.SerializeAsString(), theirs.SerializeAsString());
    }
  }
  EXPECT_GT(accepted, 100);  // the generator reaches valid messages too
}

TEST(WireCheckTest, DeepNestingIsRefusedLikeProtobufDoes) {
  // Unknown field 99 as groups nested 200 deep (start-group tag 0x9b 0x06, end 0x9c 0x06):
  // beyond protobuf's recursion limit, refused without unbounded recursion.
  std::string wire;
  for (int i = 0; i < 200; ++i) wire += "\x9b\x06";
  for (int i = 0; i < 200; ++i) wire += "\x9c\x06";
  pb::CreateSessionRequest got;
  EXPECT_FALSE(got.ParseFromString(wire));
  EXPECT_THAT(ParseRequest(wire, &got), StatusIs(absl::StatusCode::kInvalidArgument, "not a valid"));
  // 10 deep is fine for both.
  std::string shallow;
  for (int i = 0; i < 10; ++i) shallow += "\x9b\x06";
  for (int i = 0; i < 10; ++i) shallow += "\x9c\x06";
  EXPECT_TRUE(got.ParseFromString(shallow));
  EXPECT_THAT(ParseRequest(shallow, &got), IsOk());
}

// Issue 25 point 6: a client's name in a refusal is EchoPrefix'd (common/echo.h): a 1 MB
// policy, bootstrap or memory mode gives a message of a few dozen bytes, still naming the
// field and the length.
TEST(RequestConvertTest, UnknownNamesAreEchoedAsAShortEscapedPrefix) {
  const std::string huge = std::string("bad\x01") + std::string(1 << 20, 'p');
  const std::string length = "(" + std::to_string(huge.size()) + " bytes)";
  pb::CompressionConfig policy;
  policy.set_policy(huge);
  absl::StatusOr<compression::CompressionConfig> p = ToConfig(policy, compression::CompressionConfig{});
  EXPECT_THAT(p.status(), StatusIs(absl::StatusCode::kInvalidArgument, "compression.policy: unknown policy 'bad\\x01p"));
  EXPECT_THAT(p.status().message(), HasSubstr(length));
  EXPECT_LT(p.status().message().size(), 200u) << p.status().message();
  pb::CompressionConfig bootstrap;
  bootstrap.set_bootstrap(huge);
  absl::StatusOr<compression::CompressionConfig> b = ToConfig(bootstrap, compression::CompressionConfig{});
  EXPECT_THAT(b.status(), StatusIs(absl::StatusCode::kInvalidArgument, "compression.bootstrap: unknown bootstrap 'bad"));
  EXPECT_THAT(b.status().message(), HasSubstr(length));
  EXPECT_LT(b.status().message().size(), 200u) << b.status().message();
  absl::StatusOr<MemoryMode> m = ParseMemoryMode(huge);
  EXPECT_THAT(m.status(), StatusIs(absl::StatusCode::kInvalidArgument, "memory: unknown mode 'bad\\x01p"));
  EXPECT_THAT(m.status().message(), HasSubstr(length));
  EXPECT_LT(m.status().message().size(), 200u) << m.status().message();
  // The parsers of compression/ itself (server flags, saved reports) too.
  EXPECT_LT(compression::ParsePolicyKind(huge).status().message().size(), 200u);
  EXPECT_LT(compression::ParseBootstrap(huge).status().message().size(), 200u);
}

}  // namespace
}  // namespace echokv::server
