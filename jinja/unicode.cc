#include "jinja/unicode.h"

#include <utf8proc.h>

#include <cstdint>

namespace echokv::jinja::internal {
namespace {

utf8proc_category_t Category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

// Python's unconditional full case mappings (Unicode SpecialCasing.txt) that the
// simple mappings of utf8proc lack; the Greek iota-subscript forms are left out.
struct SpecialCase {
  char32_t c;
  const char32_t* upper;  // nullptr: use the simple mapping
  const char32_t* title;
  const char32_t* lower;
};
const SpecialCase kSpecialCases[] = {
    {0x00DF, U"SS", U"Ss", nullptr},
    {0x0130, nullptr, nullptr, U"i\u0307"},
    {0x0149, U"\u02BCN", U"\u02BCN", nullptr},
    {0x01F0, U"J\u030C", U"J\u030C", nullptr},
    {0x0390, U"\u0399\u0308\u0301", U"\u0399\u0308\u0301", nullptr},
    {0x03B0, U"\u03A5\u0308\u0301", U"\u03A5\u0308\u0301", nullptr},
    {0x0587, U"\u0535\u0552", U"\u0535\u0582", nullptr},
    {0x1E96, U"H\u0331", U"H\u0331", nullptr},
    {0x1E97, U"T\u0308", U"T\u0308", nullptr},
    {0x1E98, U"W\u030A", U"W\u030A", nullptr},
    {0x1E99, U"Y\u030A", U"Y\u030A", nullptr},
    {0x1E9A, U"A\u02BE", U"A\u02BE", nullptr},
    {0xFB00, U"FF", U"Ff", nullptr},
    {0xFB01, U"FI", U"Fi", nullptr},
    {0xFB02, U"FL", U"Fl", nullptr},
    {0xFB03, U"FFI", U"Ffi", nullptr},
    {0xFB04, U"FFL", U"Ffl", nullptr},
    {0xFB05, U"ST", U"St", nullptr},
    {0xFB06, U"ST", U"St", nullptr},
    {0xFB13, U"\u0544\u0546", U"\u0544\u0576", nullptr},
    {0xFB14, U"\u0544\u0535", U"\u0544\u0565", nullptr},
    {0xFB15, U"\u0544\u053B", U"\u0544\u056B", nullptr},
    {0xFB16, U"\u054E\u0546", U"\u054E\u0576", nullptr},
    {0xFB17, U"\u0544\u053D", U"\u0544\u056D", nullptr},
};

const SpecialCase* FindSpecial(char32_t c) {
  if (c < 0xDF) return nullptr;
  for (const SpecialCase& s : kSpecialCases) {
    if (s.c == c) return &s;
  }
  return nullptr;
}

}  // namespace

bool IsValidUtf8(absl::string_view s, size_t* bad_offset) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    char32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 4;
      cp = c & 0x07;
    } else {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    if (i + n > s.size()) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) {
        if (bad_offset) *bad_offset = i;
        return false;
      }
      cp = (cp << 6) | (d & 0x3F);
    }
    const bool overlong = (n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
    if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += n;
  }
  return true;
}

std::u32string Decode(absl::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    size_t n;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F;
      n = 2;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F;
      n = 3;
    } else {
      cp = c & 0x07;
      n = 4;
    }
    for (size_t k = 1; k < n && i + k < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Encode(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) AppendUtf8(c, &out);
  return out;
}

size_t CodePointCount(absl::string_view s) {
  size_t n = 0;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  }
  return n;
}

bool IsPySpace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsPrintable(char32_t c) {
  if (c == ' ') return true;
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return false;
    default:
      return true;
  }
}

bool IsAlpha(char32_t c) {
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool IsDecimal(char32_t c) { return Category(c) == UTF8PROC_CATEGORY_ND; }
bool IsDigit(char32_t c) {
  return IsDecimal(c) || (Category(c) == UTF8PROC_CATEGORY_NO && c < 0x2100);
}
bool IsNumeric(char32_t c) {
  const auto k = Category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool IsLowerChar(char32_t c) {
  return Category(c) == UTF8PROC_CATEGORY_LL || (c >= 0x2170 && c <= 0x217F) ||
         (c >= 0x24D0 && c <= 0x24E9) || c == 0xAA || c == 0xBA;
}
bool IsUpperChar(char32_t c) {
  return Category(c) == UTF8PROC_CATEGORY_LU || (c >= 0x2160 && c <= 0x216F) ||
         (c >= 0x24B6 && c <= 0x24CF);
}
bool IsTitleChar(char32_t c) { return Category(c) == UTF8PROC_CATEGORY_LT; }
bool IsCased(char32_t c) { return IsLowerChar(c) || IsUpperChar(c) || IsTitleChar(c); }

bool IsCaseIgnorable(char32_t c) {
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      return c == '\'' || c == '.' || c == ':' || c == 0xB7 || c == 0x2019 || c == 0x2018 ||
             c == 0x2024 || c == 0xFE13 || c == 0xFE52 || c == 0xFE55 || c == 0xFF07 ||
             c == 0xFF0E || c == 0xFF1A || c == 0x00AD;
  }
}

void AppendUpper(char32_t c, std::u32string* out) {
  if (c < 0x80) {
    out->push_back(c >= 'a' && c <= 'z' ? c - 32 : c);
    return;
  }
  if (const SpecialCase* s = FindSpecial(c); s != nullptr && s->upper != nullptr) {
    out->append(s->upper);
    return;
  }
  out->push_back(static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))));
}

void AppendLower(char32_t c, std::u32string* out) {
  if (c < 0x80) {
    out->push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (const SpecialCase* s = FindSpecial(c); s != nullptr && s->lower != nullptr) {
    out->append(s->lower);
    return;
  }
  out->push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

void AppendTitle(char32_t c, std::u32string* out) {
  if (c < 0x80) {
    out->push_back(c >= 'a' && c <= 'z' ? c - 32 : c);
    return;
  }
  if (const SpecialCase* s = FindSpecial(c); s != nullptr && s->title != nullptr) {
    out->append(s->title);
    return;
  }
  out->push_back(static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))));
}

std::string PyUpper(absl::string_view s) {
  bool ascii = true;
  for (char ch : s) ascii &= static_cast<unsigned char>(ch) < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& ch : out) {
      if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 32);
    }
    return out;
  }
  std::u32string out;
  for (char32_t c : Decode(s)) AppendUpper(c, &out);
  return Encode(out);
}

std::string PyLower(absl::string_view s) {
  bool ascii = true;
  for (char ch : s) ascii &= static_cast<unsigned char>(ch) < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& ch : out) {
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
    }
    return out;
  }
  const std::u32string in = Decode(s);
  std::u32string out;
  for (size_t i = 0; i < in.size(); ++i) AppendLowerAt(in, i, &out);
  return Encode(out);
}

void AppendLowerAt(const std::u32string& in, size_t i, std::u32string* out) {
  {
    if (in[i] == 0x03A3) {
      // Final_Sigma: a cased letter before (skipping case-ignorables) and none after.
      bool before = false, after = false;
      for (size_t j = i; j-- > 0;) {
        if (IsCaseIgnorable(in[j])) continue;
        before = IsCased(in[j]);
        break;
      }
      for (size_t j = i + 1; j < in.size(); ++j) {
        if (IsCaseIgnorable(in[j])) continue;
        after = IsCased(in[j]);
        break;
      }
      out->push_back(before && !after ? 0x03C2 : 0x03C3);
      return;
    }
    AppendLower(in[i], out);
  }
}

}  // namespace echokv::jinja::internal
