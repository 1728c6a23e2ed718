// The head of an HTTP/1.x request (request line + header fields) as the HTTP front of
// server/doors/http/http_util.h reads it, before any byte of the body: where it ends in a buffer
// that grows read by read, and its parse (torch-free, no sockets; fuzzed by
// tests/fuzz/fuzz_http_head.cc).
//
// The parse is strict where a lenient one lets two parsers disagree about where a
// request's body ends (request smuggling, RFC 9112 §6.3 and §11.2): the front decides
// the body's size limit and the authentication on this parse, and cpp-httplib reads
// the same bytes again to serve the request, so any head the two could read
// differently is refused with 400 instead:
//   - a header name must be a token (no space before the colon, no control bytes);
//   - a line starting with a space or tab (obsolete line folding) is refused;
//   - Content-Length is one or more digits; repeated, every value must be the same;
//   - Content-Length and Transfer-Encoding together are refused;
//   - a header value holds no control byte but tab (no NUL, no bare CR).
//
//   size_t end = HttpHeadEnd(buf, scanned_before);        // npos: not complete yet
//   HttpRequestHead head;
//   absl::Status s = ParseHttpHead(buf.substr(0, end), &head);  // INVALID_ARGUMENT: why
#ifndef ECHOKV_SERVER_DOORS_HTTP_HTTP_HEAD_H_
#define ECHOKV_SERVER_DOORS_HTTP_HTTP_HEAD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace echokv::server {

// A request's line and headers as the front read them, before any body byte.
struct HttpRequestHead {
  std::string method;              // "POST"
  std::string path;                // the target without its query ("/v1/completions")
  std::string peer;                // the client's address ("127.0.0.1", "::1"); set by the front
  int64_t content_length = -1;     // -1: no Content-Length header
  bool chunked = false;            // Transfer-Encoding names chunked
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in order
  // The first header named `lower_name` ("" if none).
  std::string Header(absl::string_view lower_name) const;
};

// Where the head in `s` ends (just past the empty line: "\r\n\r\n", or a bare "\n\n"
// / "\n\r\n"), or npos when it is not complete yet. `from` is where the previous call
// stopped looking (0 the first time): a terminator that straddles two reads is found,
// and the answer is the same as one call from 0 on the whole buffer.
size_t HttpHeadEnd(absl::string_view s, size_t from);

// Parses a complete head (as delimited by HttpHeadEnd) into `out`. INVALID_ARGUMENT
// with a fixed message naming what is malformed (never the client's bytes).
absl::Status ParseHttpHead(absl::string_view head, HttpRequestHead* out);

}  // namespace echokv::server

#endif  // ECHOKV_SERVER_DOORS_HTTP_HTTP_HEAD_H_
