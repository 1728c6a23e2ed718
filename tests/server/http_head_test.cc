// server/doors/http/http_head.h: where a head ends in a buffer read piece by piece, and the strict
// parse that refuses every head two HTTP parsers could read differently (RFC 9112 §6.3,
// §11.2). Each refused case is one a lenient parser accepted before (the old front took
// the last of two Content-Length values, names with a space before the colon, folded
// lines, "+5" as a length).
#include "server/doors/http/http_head.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv::server {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;

absl::Status Parse(const std::string& head, HttpRequestHead* out) {
  const size_t end = HttpHeadEnd(head, 0);
  if (end == absl::string_view::npos) return absl::DataLossError("incomplete head");
  return ParseHttpHead(absl::string_view(head).substr(0, end), out);
}

TEST(HttpHeadEnd, FindsEachTerminatorAndNoEarlierOne) {
  EXPECT_EQ(HttpHeadEnd("GET / HTTP/1.1\r\nA: b\r\n\r\nbody", 0), 24u);
  EXPECT_EQ(HttpHeadEnd("GET / HTTP/1.1\nA: b\n\nbody", 0), 21u);
  EXPECT_EQ(HttpHeadEnd("GET / HTTP/1.1\r\nA: b\n\r\n", 0), 23u);
  EXPECT_EQ(HttpHeadEnd("GET / HTTP/1.1\r\nA: b\r\n", 0), absl::string_view::npos);
  EXPECT_EQ(HttpHeadEnd("GET / HTTP/1.1\r\nA: b\r\n\r", 0), absl::string_view::npos);
}

TEST(HttpHeadEnd, ATerminatorSplitAcrossReadsIsFoundAsInOneCall) {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi";
  const size_t whole = HttpHeadEnd(head, 0);
  ASSERT_NE(whole, absl::string_view::npos);
  for (size_t cut = 0; cut <= head.size(); ++cut) {
    // The front's call pattern: look in the first `cut` bytes, then in everything from
    // where that look stopped (two bytes back, as the front does, or exactly there).
    const size_t first = HttpHeadEnd(absl::string_view(head).substr(0, cut), 0);
    if (first != absl::string_view::npos) {
      EXPECT_EQ(first, whole) << "cut " << cut;
      continue;
    }
    EXPECT_EQ(HttpHeadEnd(head, cut), whole) << "cut " << cut;
    EXPECT_EQ(HttpHeadEnd(head, cut >= 2 ? cut - 2 : 0), whole) << "cut " << cut;
  }
}

TEST(ParseHttpHead, ReadsTheRequestLineAndHeaders) {
  HttpRequestHead h;
  h.peer = "127.0.0.1";
  ASSERT_THAT(Parse("POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
                    "Authorization: Bearer t0k\r\nX-Empty:\r\n\r\n",
                    &h),
              IsOk());
  EXPECT_EQ(h.method, "POST");
  EXPECT_EQ(h.path, "/v1/completions");
  EXPECT_EQ(h.peer, "127.0.0.1");  // kept: the front sets it before the parse
  EXPECT_EQ(h.content_length, 12);
  EXPECT_FALSE(h.chunked);
  EXPECT_EQ(h.Header("authorization"), "Bearer t0k");
  EXPECT_EQ(h.Header("x-empty"), "");
  EXPECT_EQ(h.headers.size(), 4u);
}

TEST(ParseHttpHead, RepeatedEqualLengthsAndChunkedAlonePass) {
  HttpRequestHead h;
  ASSERT_THAT(Parse("POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n", &h), IsOk());
  EXPECT_EQ(h.content_length, 5);
  ASSERT_THAT(Parse("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", &h), IsOk());
  EXPECT_TRUE(h.chunked);
  EXPECT_EQ(h.content_length, -1);  // reset between parses
  ASSERT_THAT(Parse("GET / HTTP/1.0\nUser-Agent: caf\xc3\xa9\t1\n\n", &h), IsOk());  // obs-text and tab
}

TEST(ParseHttpHead, RefusesWhatTwoParsersCouldReadDifferently) {
  const struct {
    std::string head;
    const char* why;
  } cases[] = {
      {"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 99\r\n\r\n", "conflicting Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 99\r\nContent-Length: 5\r\n\r\n", "conflicting Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 9999999999999999999\r\n\r\n", "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "both"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", "both"},
      {"POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\n", "header name"},
      {"POST / HTTP/1.1\r\n Content-Length: 5\r\n\r\n", "folding"},
      {"POST / HTTP/1.1\r\nX-A: 1\r\n\tContent-Length: 5\r\n\r\n", "folding"},
      {"POST / HTTP/1.1\r\n: 5\r\n\r\n", "header name"},
      {"POST / HTTP/1.1\r\nNoColon\r\n\r\n", "colon"},
      {"POST / HTTP/1.1\r\nX-A: a\rb\r\n\r\n", "control byte"},
      {std::string("POST / HTTP/1.1\r\nX-A: a\0b\r\n\r\n", 29), "control byte"},
      {"POST / HTTP/1.1 extra\r\n\r\n", "request line"},
      {"POST  / HTTP/1.1\r\n\r\n", "request line"},
      {"PO(ST / HTTP/1.1\r\n\r\n", "request line"},
      {"POST / FTP/1.1\r\n\r\n", "request line"},
      {"\r\n\r\n", "request line"},
      {"GET ?a=1 HTTP/1.1\r\n\r\n", "without a path"},  // found by fuzz_http_head
  };
  for (const auto& c : cases) {
    HttpRequestHead h;
    EXPECT_THAT(Parse(c.head, &h), StatusIs(absl::StatusCode::kInvalidArgument, c.why))
        << "head: " << ::testing::PrintToString(c.head);
  }
}

TEST(ParseHttpHead, MessagesNeverEchoTheClientsBytes) {
  HttpRequestHead h;
  const absl::Status s = Parse("POST / HTTP/1.1\r\nContent-Length: <script>\r\n\r\n", &h);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().find("<script>"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace echokv::server
