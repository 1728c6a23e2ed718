// Internal: the Unicode pieces of Python's str that templates reach (code point
// indexing, str.isspace, str.upper/lower with Python's full case mappings for the
// common special cases, str.isprintable for repr()). Strings are valid UTF-8
// everywhere in the engine (inputs are validated), so decoding never fails here.
//
//   std::u32string cps = Decode("héllo");      // 5 code points
//   std::string up = PyUpper("straße");        // "STRASSE"
#ifndef ECHOKV_JINJA_UNICODE_H_
#define ECHOKV_JINJA_UNICODE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace echokv::jinja::internal {

// False for malformed UTF-8, overlong forms, surrogates and values above U+10FFFF.
bool IsValidUtf8(absl::string_view s, size_t* bad_offset = nullptr);

std::u32string Decode(absl::string_view s);
std::string Encode(std::u32string_view cps);
void AppendUtf8(char32_t c, std::string* out);
size_t CodePointCount(absl::string_view s);

// Python str.isspace() for one character.
bool IsPySpace(char32_t c);
// Python's str.isprintable() for one character (repr() escapes the others).
bool IsPrintable(char32_t c);
bool IsAlpha(char32_t c);    // str.isalpha
bool IsDecimal(char32_t c);  // str.isdecimal (category Nd)
bool IsDigit(char32_t c);    // str.isdigit (approximated by Nd and No)
bool IsNumeric(char32_t c);  // str.isnumeric (Nd, Nl, No)
bool IsCased(char32_t c);
bool IsLowerChar(char32_t c);
bool IsUpperChar(char32_t c);
bool IsTitleChar(char32_t c);
bool IsCaseIgnorable(char32_t c);

// str.upper(), str.lower(), and the title-case mapping of one character (which
// str.capitalize and str.title use for a word's first character).
std::string PyUpper(absl::string_view s);
std::string PyLower(absl::string_view s);
// Appends the lower case of cps[i], with Python's Final_Sigma rule looking at the
// whole of `cps` (str.capitalize / str.title lower inside the full string).
void AppendLowerAt(const std::u32string& cps, size_t i, std::u32string* out);
void AppendTitle(char32_t c, std::u32string* out);
void AppendUpper(char32_t c, std::u32string* out);
void AppendLower(char32_t c, std::u32string* out);

}  // namespace echokv::jinja::internal

#endif  // ECHOKV_JINJA_UNICODE_H_
