// The Jinja2 lexer (jinja2/lexer.py) for the default delimiters, written out by hand:
// root data up to the first "{{", "{%" or "{#"; then tokens inside the tag until its
// end delimiter (only while brackets are balanced, as Jinja does). Whitespace
// control follows Jinja exactly: "{%-" strips all whitespace before the tag, "-%}"
// all after it; lstrip_blocks strips spaces/tabs between a line start and a block or
// comment tag (not "{{", and not with "{%+"); trim_blocks drops the first newline after
// a block or comment tag (not after "+%}").
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "jinja/ast.h"
#include "jinja/object.h"
#include "jinja/unicode.h"

namespace echokv::jinja::internal {
namespace {

[[noreturn]] void FailAt(size_t offset, std::string message) {
  throw TemplateError{std::move(message), offset};
}

// Python's \s on one code point starting at s[i]; sets *len to its byte length.
bool SpaceAt(const std::string& s, size_t i, size_t* len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *len = 1;
    return IsPySpace(c);
  }
  size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  if (i + n > s.size()) return false;
  const std::u32string cp = Decode(absl::string_view(s).substr(i, n));
  *len = n;
  return !cp.empty() && IsPySpace(cp[0]);
}

// End of the run of whitespace starting at i.
size_t SkipSpace(const std::string& s, size_t i) {
  size_t len = 0;
  while (i < s.size() && SpaceAt(s, i, &len)) i += len;
  return i;
}

// Python str.rstrip() of s[begin, end): the new end.
size_t RStrip(const std::string& s, size_t begin, size_t end) {
  while (end > begin) {
    // Step back one code point.
    size_t p = end - 1;
    while (p > begin && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
    size_t len = 0;
    if (!SpaceAt(s, p, &len)) break;
    end = p;
  }
  return end;
}

bool AllSpace(const std::string& s, size_t begin, size_t end) {
  size_t i = begin, len = 0;
  while (i < end) {
    if (!SpaceAt(s, i, &len)) return false;
    i += len;
  }
  return true;
}

bool StartsWith(const std::string& s, size_t pos, const char* lit) {
  const size_t n = std::strlen(lit);
  return pos + n <= s.size() && s.compare(pos, n, lit) == 0;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// (\d+_)*\d+ at pos: the end, or npos.
size_t MatchDigits(const std::string& s, size_t pos) {
  if (pos >= s.size() || !IsDigit(s[pos])) return std::string::npos;
  size_t i = pos;
  while (true) {
    while (i < s.size() && IsDigit(s[i])) ++i;
    if (i + 1 < s.size() && s[i] == '_' && IsDigit(s[i + 1])) {
      ++i;
      continue;
    }
    return i;
  }
}

// Jinja's float_re at pos: the end, or npos.
size_t MatchFloat(const std::string& s, size_t pos) {
  if (pos > 0 && s[pos - 1] == '.') return std::string::npos;
  size_t i = MatchDigits(s, pos);
  if (i == std::string::npos) return i;
  const auto exponent = [&](size_t j) -> size_t {
    if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
      ++j;
      if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
      return MatchDigits(s, j);
    }
    return std::string::npos;
  };
  // (\.digits)? e[+-]?digits
  if (i < s.size() && s[i] == '.') {
    const size_t frac = MatchDigits(s, i + 1);
    if (frac != std::string::npos) {
      const size_t e = exponent(frac);
      return e != std::string::npos ? e : frac;
    }
    return std::string::npos;
  }
  return exponent(i);
}

// Jinja's integer_re at pos: the end, or npos; *base set for int(x, 0).
size_t MatchInteger(const std::string& s, size_t pos) {
  if (pos >= s.size() || !IsDigit(s[pos])) return std::string::npos;
  if (s[pos] == '0' && pos + 1 < s.size()) {
    const char k = static_cast<char>(s[pos + 1] | 0x20);
    if (k == 'b' || k == 'o' || k == 'x') {
      size_t i = pos + 2;
      const auto ok = [&](char c) {
        return k == 'b' ? (c == '0' || c == '1') : k == 'o' ? (c >= '0' && c <= '7') : IsHex(c);
      };
      size_t end = std::string::npos;
      while (true) {
        if (i < s.size() && s[i] == '_' && i + 1 < s.size() && ok(s[i + 1])) ++i;
        if (i < s.size() && ok(s[i])) {
          ++i;
          end = i;
          continue;
        }
        break;
      }
      if (end != std::string::npos) return end;
    }
  }
  if (s[pos] == '0') {
    size_t i = pos + 1;
    while (true) {
      if (i < s.size() && s[i] == '0') {
        ++i;
      } else if (i + 1 < s.size() && s[i] == '_' && s[i + 1] == '0') {
        i += 2;
      } else {
        return i;
      }
    }
  }
  size_t i = pos + 1;
  while (true) {
    if (i < s.size() && IsDigit(s[i])) {
      ++i;
    } else if (i + 1 < s.size() && s[i] == '_' && IsDigit(s[i + 1])) {
      i += 2;
    } else {
      return i;
    }
  }
}

int64_t ParseInteger(const std::string& text, size_t offset) {
  std::string t;
  for (char c : text) {
    if (c != '_') t.push_back(c);
  }
  int base = 10;
  size_t start = 0;
  if (t.size() > 1 && t[0] == '0') {
    const char k = static_cast<char>(t[1] | 0x20);
    if (k == 'b') base = 2, start = 2;
    if (k == 'o') base = 8, start = 2;
    if (k == 'x') base = 16, start = 2;
  }
  uint64_t v = 0;
  for (size_t i = start; i < t.size(); ++i) {
    const char c = static_cast<char>(t[i] | 0x20);
    const int d = c >= 'a' ? c - 'a' + 10 : c - '0';
    if (v > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) {
      FailAt(offset, "integer literal beyond 64 bits");
    }
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  return static_cast<int64_t>(v);
}

// Python's `value.encode("ascii", "backslashreplace").decode("unicode-escape")` on a
// string literal's body.
std::string Unescape(const std::string& raw, size_t offset) {
  const std::u32string in = Decode(raw);
  std::u32string out;
  const auto hex = [&](size_t start, size_t n, const char* what) -> char32_t {
    if (start + n > in.size()) FailAt(offset, absl::StrCat("truncated ", what, " escape"));
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k) {
      const char32_t c = in[start + k];
      if (c >= 0x80 || !IsHex(static_cast<char>(c))) {
        FailAt(offset, absl::StrCat("truncated ", what, " escape"));
      }
      const char l = static_cast<char>(c | 0x20);
      v = v * 16 + static_cast<uint32_t>(l >= 'a' ? l - 'a' + 10 : l - '0');
    }
    return v;
  };
  for (size_t i = 0; i < in.size(); ++i) {
    const char32_t c = in[i];
    if (c != '\\' || i + 1 >= in.size()) {
      out.push_back(c);
      continue;
    }
    const char32_t e = in[++i];
    switch (e) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back(0x07); break;
      case 'b': out.push_back(0x08); break;
      case 'f': out.push_back(0x0C); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back(0x0B); break;
      case 'x': out.push_back(hex(i + 1, 2, "\\xXX")); i += 2; break;
      case 'u': out.push_back(hex(i + 1, 4, "\\uXXXX")); i += 4; break;
      case 'U': {
        const char32_t v = hex(i + 1, 8, "\\UXXXXXXXX");
        if (v > 0x10FFFF) FailAt(offset, "illegal Unicode character");
        out.push_back(v);
        i += 8;
        break;
      }
      case 'N':
        FailAt(offset, "\\N{...} escapes in string literals are not supported");
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = e - '0';
          for (int k = 0; k < 2 && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '7'; ++k) {
            v = v * 8 + (in[++i] - '0');
          }
          out.push_back(v);
        } else if (e >= 0x80) {
          // backslashreplace turned the character into \xNN / \uNNNN / \UNNNNNNNN and
          // the original backslash escaped that backslash: the result is the text.
          char buf[16];
          std::snprintf(buf, sizeof(buf), e <= 0xFF ? "\\x%02x" : e <= 0xFFFF ? "\\u%04x" : "\\U%08x",
                        static_cast<unsigned>(e));
          for (const char* p = buf; *p; ++p) out.push_back(static_cast<char32_t>(*p));
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return Encode(out);
}

const char* const kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                  "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

constexpr size_t kMaxTokensPerTag = 1000;

class Lexer {
 public:
  Lexer(const std::string& s, bool trim_blocks, bool lstrip_blocks)
      : s_(s), trim_blocks_(trim_blocks), lstrip_blocks_(lstrip_blocks) {}

  std::vector<Token> Run() {
    size_t pos = 0;
    while (pos < s_.size()) {
      size_t p = pos;
      while (true) {
        p = s_.find('{', p);
        if (p == std::string::npos || p + 1 >= s_.size()) {
          p = std::string::npos;
          break;
        }
        const char k = s_[p + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++p;
      }
      if (p == std::string::npos) {
        Emit(TokenType::kData, s_.substr(pos), pos);
        break;
      }
      const char kind = s_[p + 1];
      size_t after = p + 2;
      char sign = 0;
      if (after < s_.size() && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
      size_t raw_end = kind == '%' ? MatchRawBegin(after) : std::string::npos;
      EmitData(pos, p, sign, /*is_variable=*/kind == '{');
      if (raw_end != std::string::npos) {
        pos = Raw(raw_end);
      } else if (kind == '#') {
        pos = Comment(after, p);
      } else {
        pos = Tag(kind == '{', p, after);
      }
    }
    Emit(TokenType::kEof, "", s_.size());
    return std::move(tokens_);
  }

 private:
  void Emit(TokenType type, std::string value, size_t offset) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.offset = offset;
    tokens_.push_back(std::move(t));
  }

  // Data s_[begin, end) before a tag with whitespace-control `sign` (jinja's
  // OptionalLStrip rule).
  void EmitData(size_t begin, size_t end, char sign, bool is_variable) {
    if (sign == '-') {
      end = RStrip(s_, begin, end);
    } else if (sign != '+' && lstrip_blocks_ && !is_variable) {
      size_t l_pos = begin;
      const size_t nl = s_.rfind('\n', end == 0 ? 0 : end - 1);
      if (nl != std::string::npos && nl >= begin && end > begin) l_pos = nl + 1;
      if ((l_pos > begin || line_starting_) && l_pos < end && AllSpace(s_, l_pos, end)) end = l_pos;
    }
    if (end > begin) Emit(TokenType::kData, s_.substr(begin, end - begin), begin);
  }

  // "{%" [sign] \s* "raw" \s* ("-%}" \s* | "%}") starting after the sign: the end, or npos.
  size_t MatchRawBegin(size_t after) {
    size_t i = SkipSpace(s_, after);
    if (!StartsWith(s_, i, "raw")) return std::string::npos;
    i = SkipSpace(s_, i + 3);
    if (StartsWith(s_, i, "-%}")) return SkipSpace(s_, i + 3);
    if (StartsWith(s_, i, "%}")) return i + 2;
    return std::string::npos;
  }

  size_t Raw(size_t pos) {
    // The first "{%" [sign] \s* endraw \s* end-of-block after pos.
    size_t p = pos;
    while (true) {
      p = s_.find("{%", p);
      if (p == std::string::npos) FailAt(pos, "Missing end of raw directive");
      size_t i = p + 2;
      char sign = 0;
      if (i < s_.size() && (s_[i] == '-' || s_[i] == '+')) sign = s_[i++];
      i = SkipSpace(s_, i);
      if (StartsWith(s_, i, "endraw")) {
        i = SkipSpace(s_, i + 6);
        size_t end = BlockEnd(i);
        if (end != std::string::npos) {
          EmitData(pos, p, sign, false);
          line_starting_ = s_[end - 1] == '\n';
          return end;
        }
      }
      p += 2;
    }
  }

  // A block end ("+%}", "-%}" \s*, "%}" [\n]) at i: its end, or npos.
  size_t BlockEnd(size_t i) {
    if (StartsWith(s_, i, "+%}")) return i + 3;
    if (StartsWith(s_, i, "-%}")) return SkipSpace(s_, i + 3);
    if (StartsWith(s_, i, "%}")) {
      i += 2;
      if (trim_blocks_ && i < s_.size() && s_[i] == '\n') ++i;
      return i;
    }
    return std::string::npos;
  }

  size_t Comment(size_t pos, size_t tag_start) {
    const size_t h = s_.find("#}", pos);
    if (h == std::string::npos) FailAt(tag_start, "Missing end of comment tag");
    size_t end;
    if (h > pos && s_[h - 1] == '-') {
      end = SkipSpace(s_, h + 2);
    } else if (h > pos && s_[h - 1] == '+') {
      end = h + 2;
    } else {
      end = h + 2;
      if (trim_blocks_ && end < s_.size() && s_[end] == '\n') ++end;
    }
    line_starting_ = s_[end - 1] == '\n';
    return end;
  }

  size_t Tag(bool variable, size_t tag_start, size_t pos) {
    Emit(variable ? TokenType::kVariableBegin : TokenType::kBlockBegin, "", tag_start);
    std::vector<char> balance;
    const size_t first_token = tokens_.size();
    while (true) {
      // One tag's expression becomes one tree that evaluation walks recursively;
      // bounding its size bounds the C++ stack a template can use.
      if (tokens_.size() - first_token > kMaxTokensPerTag) {
        FailAt(tag_start, absl::StrCat("tag too long (more than ", kMaxTokensPerTag, " tokens)"));
      }
      if (pos >= s_.size()) {
        FailAt(tag_start, variable ? "unexpected end of template, expected '}}'"
                                   : "unexpected end of template, expected '%}'");
      }
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (variable) {
          if (StartsWith(s_, pos, "-}}")) end = SkipSpace(s_, pos + 3);
          else if (StartsWith(s_, pos, "}}")) end = pos + 2;
        } else {
          end = BlockEnd(pos);
        }
        if (end != std::string::npos) {
          Emit(variable ? TokenType::kVariableEnd : TokenType::kBlockEnd, "", pos);
          line_starting_ = s_[end - 1] == '\n';
          return end;
        }
      }
      size_t len = 0;
      if (SpaceAt(s_, pos, &len)) {
        pos = SkipSpace(s_, pos);
        continue;
      }
      size_t e = MatchFloat(s_, pos);
      if (e != std::string::npos) {
        std::string text;
        for (size_t i = pos; i < e; ++i) {
          if (s_[i] != '_') text.push_back(s_[i]);
        }
        Token t;
        t.type = TokenType::kFloat;
        t.value = s_.substr(pos, e - pos);
        t.float_value = std::strtod(text.c_str(), nullptr);
        t.offset = pos;
        tokens_.push_back(std::move(t));
        pos = e;
        continue;
      }
      e = MatchInteger(s_, pos);
      if (e != std::string::npos) {
        Token t;
        t.type = TokenType::kInteger;
        t.value = s_.substr(pos, e - pos);
        t.int_value = ParseInteger(t.value, pos);
        t.offset = pos;
        tokens_.push_back(std::move(t));
        pos = e;
        continue;
      }
      if (IsNameStart(s_[pos])) {
        e = pos;
        while (e < s_.size() && IsNameChar(s_[e])) ++e;
        Emit(TokenType::kName, s_.substr(pos, e - pos), pos);
        pos = e;
        continue;
      }
      if (s_[pos] == '\'' || s_[pos] == '"') {
        const char q = s_[pos];
        size_t i = pos + 1;
        while (i < s_.size() && s_[i] != q) i += s_[i] == '\\' ? 2 : 1;
        if (i < s_.size()) {
          Emit(TokenType::kString, Unescape(s_.substr(pos + 1, i - pos - 1), pos), pos);
          pos = i + 1;
          continue;
        }
      }
      const char* op = nullptr;
      for (const char* candidate : kOperators) {
        if (StartsWith(s_, pos, candidate)) {
          op = candidate;
          break;
        }
      }
      if (op == nullptr) {
        std::string shown;
        const std::u32string c = Decode(absl::string_view(s_).substr(pos, 4));
        AppendUtf8(c.empty() ? U'?' : c[0], &shown);
        FailAt(pos, absl::StrCat("unexpected char '", shown, "'"));
      }
      const char c = op[0];
      if (op[1] == 0 && (c == '{' || c == '(' || c == '[')) {
        balance.push_back(c == '{' ? '}' : c == '(' ? ')' : ']');
      } else if (op[1] == 0 && (c == '}' || c == ')' || c == ']')) {
        if (balance.empty()) FailAt(pos, absl::StrCat("unexpected '", std::string(1, c), "'"));
        if (balance.back() != c) {
          FailAt(pos, absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                                   std::string(1, balance.back()), "'"));
        }
        balance.pop_back();
      }
      Emit(TokenType::kOperator, op, pos);
      pos += std::strlen(op);
    }
  }

  const std::string& s_;       // the source
  bool trim_blocks_;           // drop the newline after a block tag
  bool lstrip_blocks_;         // strip indentation before a block tag
  bool line_starting_ = true;  // the last match ended a line (lstrip at data start)
  std::vector<Token> tokens_;  // the output
};

}  // namespace

std::vector<Token> Tokenize(const std::string& source, bool trim_blocks, bool lstrip_blocks) {
  return Lexer(source, trim_blocks, lstrip_blocks).Run();
}

}  // namespace echokv::jinja::internal
