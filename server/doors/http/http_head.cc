#include "server/doors/http/http_head.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace echokv::server {
namespace {

// RFC 9110 §5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." /
// "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA.
bool IsTokenChar(char c) {
  if (absl::ascii_isalnum(static_cast<unsigned char>(c))) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// A field value may hold visible bytes, spaces, tabs and obs-text (>= 0x80), not NUL,
// CR, LF or other controls.
bool IsFieldValue(absl::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && u != '\t') || u == 0x7f) return false;
  }
  return true;
}

// 1*DIGIT, at most 18 of them (fits int64_t).
bool ParseLength(absl::string_view s, int64_t* n) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *n = v;
  return true;
}

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed request head: ", what));
}

}  // namespace

std::string HttpRequestHead::Header(absl::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return v;
  }
  return "";
}

size_t HttpHeadEnd(absl::string_view s, size_t from) {
  // A terminator ends at a '\n' preceded by "\n" or "\r\n": looking back two bytes from
  // each '\n' finds one that began before `from`.
  for (size_t i = from; i < s.size(); ++i) {
    if (s[i] != '\n') continue;
    if (i >= 1 && s[i - 1] == '\n') return i + 1;
    if (i >= 2 && s[i - 1] == '\r' && s[i - 2] == '\n') return i + 1;
  }
  return absl::string_view::npos;
}

absl::Status ParseHttpHead(absl::string_view head, HttpRequestHead* out) {
  std::string peer = std::move(out->peer);
  *out = HttpRequestHead{};
  out->peer = std::move(peer);
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  if (lines.empty() || lines[0].empty() || lines[0] == "\r") return Malformed("no request line");
  bool saw_length = false;
  bool saw_transfer_encoding = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (i == 0) {
      std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 3 || !IsToken(parts[0]) || parts[1].empty() || !absl::StartsWith(parts[2], "HTTP/") ||
          !IsFieldValue(parts[1]) || !IsFieldValue(parts[2])) {
        return Malformed("request line");
      }
      out->method = std::string(parts[0]);
      absl::string_view target = parts[1];
      out->path = std::string(target.substr(0, target.find('?')));
      if (out->path.empty()) return Malformed("request target without a path");
      continue;
    }
    if (line.empty()) break;  // the end of the head
    if (line.front() == ' ' || line.front() == '\t') return Malformed("obsolete line folding");
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) return Malformed("header line without a colon");
    const absl::string_view raw_name = line.substr(0, colon);
    if (!IsToken(raw_name)) return Malformed("header name");
    const absl::string_view raw_value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (!IsFieldValue(raw_value)) return Malformed("control byte in a header value");
    std::string name = absl::AsciiStrToLower(raw_name);
    std::string value(raw_value);
    if (name == "content-length") {
      int64_t n = -1;
      if (!ParseLength(value, &n)) return Malformed("Content-Length");
      if (saw_length && n != out->content_length) return Malformed("conflicting Content-Length headers");
      saw_length = true;
      out->content_length = n;
    } else if (name == "transfer-encoding") {
      saw_transfer_encoding = true;
      out->chunked = out->chunked || absl::StrContains(absl::AsciiStrToLower(value), "chunked");
    }
    out->headers.emplace_back(std::move(name), std::move(value));
  }
  if (saw_length && saw_transfer_encoding) return Malformed("both Content-Length and Transfer-Encoding");
  return absl::OkStatus();
}

}  // namespace echokv::server
