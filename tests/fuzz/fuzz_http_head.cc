// libFuzzer target: the HTTP front's request heads (server/doors/http/http_head.h), the bytes an
// unauthenticated client controls before anything else runs.
//   Input: the first byte picks a cut point (a read boundary), the rest is the stream
//   of bytes the front reads from a connection.
// Oracles:
//   - HttpHeadEnd finds the same end whether the bytes came in one read or two (cut at
//     the selected point), and an end lies past a '\n' within the buffer;
//   - ParseHttpHead never fails other than INVALID_ARGUMENT, and its message never
//     carries the client's bytes (it is a fixed text);
//   - an accepted head satisfies what the front relies on: the method a token, a path
//     without '?', a Content-Length >= -1 never together with Transfer-Encoding, header
//     names lower-case tokens, values without CR / LF / NUL;
//   - an accepted head, written out again in canonical form, parses to the same head
//     (the parse is a function of the head's meaning, not of its spelling).
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/doors/http/http_head.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using echokv::fuzz::Violation;
using echokv::server::HttpHeadEnd;
using echokv::server::HttpRequestHead;
using echokv::server::ParseHttpHead;

bool LowerToken(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == ':' || absl::ascii_isupper(u)) return false;
  }
  return true;
}

void CheckAccepted(const HttpRequestHead& h) {
  if (!LowerToken(absl::AsciiStrToLower(h.method))) Violation("method is not a token");
  if (h.path.empty() || h.path.find('?') != std::string::npos) Violation("path empty or with a query");
  if (h.content_length < -1) Violation("content_length below -1");
  bool te = false;
  for (const auto& [name, value] : h.headers) {
    if (!LowerToken(name)) Violation("header name not a lower-case token: " + name);
    if (value.find_first_of(std::string("\r\n\0", 3)) != std::string::npos) Violation("CR, LF or NUL in a value");
    if (name == "transfer-encoding") te = true;
  }
  if (te && h.content_length >= 0) Violation("Content-Length with Transfer-Encoding accepted");
  if (h.chunked && !te) Violation("chunked without Transfer-Encoding");
}

std::string Canonical(const HttpRequestHead& h) {
  std::string out = absl::StrCat(h.method, " ", h.path, " HTTP/1.1\r\n");
  for (const auto& [name, value] : h.headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
  out += "\r\n";
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t cut = bytes.empty() ? 0 : data[0] % (bytes.size() + 1);

  const size_t whole = HttpHeadEnd(bytes, 0);
  if (whole != absl::string_view::npos && (whole == 0 || whole > bytes.size() || bytes[whole - 1] != '\n')) {
    Violation("HttpHeadEnd outside the buffer or not after a newline");
  }
  const size_t first = HttpHeadEnd(bytes.substr(0, cut), 0);
  const size_t two_reads = first != absl::string_view::npos ? first : HttpHeadEnd(bytes, cut >= 2 ? cut - 2 : 0);
  if (two_reads != whole) Violation("HttpHeadEnd differs between one read and two");
  if (whole == absl::string_view::npos) return 0;

  HttpRequestHead head;
  const absl::Status s = ParseHttpHead(bytes.substr(0, whole), &head);
  if (!s.ok()) {
    if (s.code() != absl::StatusCode::kInvalidArgument) Violation("a parse error other than INVALID_ARGUMENT");
    if (!absl::StartsWith(s.message(), "malformed request head: ")) Violation("an unexpected message");
    return 0;
  }
  CheckAccepted(head);
  const std::string canonical = Canonical(head);
  HttpRequestHead again;
  const absl::Status s2 = ParseHttpHead(canonical, &again);
  if (!s2.ok()) Violation("the canonical form of an accepted head is refused: " + std::string(s2.message()));
  if (again.method != head.method || again.path != head.path || again.content_length != head.content_length ||
      again.chunked != head.chunked || again.headers != head.headers) {
    Violation("the canonical form parses to another head");
  }
  return 0;
}
