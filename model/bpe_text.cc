// UTF-8 helpers, GPT-2's byte table (model/bpe_text.h) and NfcNormalize
// (model/bpe_tokenizer.h).
#include "model/bpe_text.h"

#include <utf8proc.h>

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "model/bpe_tokenizer.h"

namespace echokv::model {
namespace bpe_internal {

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not a
// valid sequence; *consumed is the maximal invalid subpart length in that case (>= 1).
size_t Utf8SeqLen(absl::string_view s, size_t i, size_t* consumed) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  *consumed = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *consumed = k;
      return 0;
    }
    const unsigned char d = b(i + k);
    const unsigned char l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
    if (d < l || d > h) {
      *consumed = k;
      return 0;
    }
  }
  return need + 1;
}

// Offset of the first invalid byte, or npos when `s` is valid UTF-8.
size_t FindInvalidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t consumed;
    const size_t n = Utf8SeqLen(s, i, &consumed);
    if (n == 0) return i;
    i += n;
  }
  return absl::string_view::npos;
}

// Replaces each maximal invalid subpart by U+FFFD (Rust from_utf8_lossy / WHATWG).
std::string LossyUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t consumed;
    const size_t n = Utf8SeqLen(s, i, &consumed);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += consumed;
    }
  }
  return out;
}

// Decodes the code point of the valid sequence at s[i] (length n).
uint32_t DecodeAt(absl::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[k])); };
  switch (n) {
    case 1: return b(i);
    case 2: return ((b(i) & 0x1F) << 6) | (b(i + 1) & 0x3F);
    case 3: return ((b(i) & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    default:
      return ((b(i) & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) |
             (b(i + 3) & 0x3F);
  }
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 to
// U+0100.. in byte order.
const ByteTables& GetByteTables() {
  static const ByteTables tables = [] {
    ByteTables t;
    t.cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t.byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      t.cp_to_byte[t.byte_to_cp[b]] = b;
    }
    return t;
  }();
  return tables;
}

// Raw bytes of a byte-level vocabulary string ("Ġworld" -> " world"); nullopt when a
// character is outside the byte table (then the string stands for its own UTF-8).
std::optional<std::string> ByteLevelToBytes(absl::string_view piece) {
  const ByteTables& t = GetByteTables();
  std::string out;
  out.reserve(piece.size());
  size_t i = 0;
  while (i < piece.size()) {
    size_t consumed;
    const size_t n = Utf8SeqLen(piece, i, &consumed);
    if (n == 0) return std::nullopt;
    const uint32_t cp = DecodeAt(piece, i, n);
    if (cp >= t.cp_to_byte.size() || t.cp_to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.cp_to_byte[cp]));
    i += n;
  }
  return out;
}

std::string BytesToByteLevel(absl::string_view bytes) {
  const ByteTables& t = GetByteTables();
  std::string out;
  for (unsigned char c : bytes) AppendUtf8(t.byte_to_cp[c], &out);
  return out;
}

// True for code points that NFC leaves alone and that never compose with a
// neighbour in this set (so a string made only of them is already NFC).
bool IsNfcInert(uint32_t cp) {
  return cp < 0x300 || (cp >= 0x4E00 && cp < 0xA000) || (cp >= 0x3000 && cp < 0x302A) ||
         (cp >= 0x3041 && cp < 0x3097) || (cp >= 0x30A1 && cp < 0x30FB) ||
         (cp >= 0xFF01 && cp < 0xFFEF) || (cp >= 0x1F300 && cp < 0x1FB00);
}

}  // namespace bpe_internal

absl::StatusOr<std::string> NfcNormalize(absl::string_view text) {
  using bpe_internal::DecodeAt;
  using bpe_internal::IsNfcInert;
  using bpe_internal::Utf8SeqLen;
  bool inert = true;
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t consumed;
    const size_t n = Utf8SeqLen(text, i, &consumed);
    if (n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("text to normalize is not valid UTF-8 (byte offset ", i, ")"));
    }
    if (inert && !IsNfcInert(DecodeAt(text, i, n))) inert = false;
    i += n;
  }
  if (inert) return std::string(text);
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) {
    return absl::InvalidArgumentError(absl::StrCat("NFC failed: ", utf8proc_errmsg(len)));
  }
  std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(len));
  std::free(result);
  return out;
}

}  // namespace echokv::model
