// The text layer of the byte-level BPE tokenizer (model/bpe_tokenizer.h): UTF-8
// scanning and repair, and GPT-2's byte <-> unicode table that byte-level vocabularies
// are written in. Internal to model/ (bpe_tokenizer*.cc); no state.
#ifndef ECHOKV_MODEL_BPE_TEXT_H_
#define ECHOKV_MODEL_BPE_TEXT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace echokv::model::bpe_internal {

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not a
// valid sequence; *consumed is the maximal invalid subpart length in that case (>= 1).
size_t Utf8SeqLen(absl::string_view s, size_t i, size_t* consumed);

// Offset of the first invalid byte, or npos when `s` is valid UTF-8.
size_t FindInvalidUtf8(absl::string_view s);

// Replaces each maximal invalid subpart by U+FFFD (Rust from_utf8_lossy / WHATWG).
std::string LossyUtf8(absl::string_view s);

// Decodes the code point of the valid sequence at s[i] (length n).
uint32_t DecodeAt(absl::string_view s, size_t i, size_t n);

// Appends the UTF-8 encoding of `cp` to *out.
void AppendUtf8(uint32_t cp, std::string* out);

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 to
// U+0100.. in byte order.
struct ByteTables {
  std::array<uint32_t, 256> byte_to_cp;
  std::array<int, 512> cp_to_byte;  // -1 where no byte maps to the code point
};
const ByteTables& GetByteTables();

// Raw bytes of a byte-level vocabulary string ("Ġworld" -> " world"); nullopt when a
// character is outside the byte table (then the string stands for its own UTF-8).
std::optional<std::string> ByteLevelToBytes(absl::string_view piece);

// The byte-level vocabulary string of raw bytes (" world" -> "Ġworld").
std::string BytesToByteLevel(absl::string_view bytes);

// True for code points that NFC leaves alone and that never compose with a
// neighbour in this set (so a string made only of them is already NFC).
bool IsNfcInert(uint32_t cp);

}  // namespace echokv::model::bpe_internal

#endif  // ECHOKV_MODEL_BPE_TEXT_H_
