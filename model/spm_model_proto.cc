#include "model/spm_model_proto.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace echokv::model {
namespace {

// Field numbers of sentencepiece_model.proto.
constexpr int kPieces = 1, kTrainerSpec = 2, kNormalizerSpec = 3;
constexpr int kPiece = 1, kScore = 2, kType = 3;
constexpr int kModelType = 3, kByteFallback = 35, kUnkId = 40, kBosId = 41, kEosId = 42, kPadId = 43;
constexpr int kName = 1, kAddDummyPrefix = 3, kRemoveExtraWhitespaces = 4, kEscapeWhitespaces = 5;

void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void Tag(int field, int wire, std::string* out) { Varint((static_cast<uint64_t>(field) << 3) | wire, out); }
void IntField(int field, int64_t v, std::string* out) {  // int32 fields: negatives as 10-byte varints
  Tag(field, 0, out);
  Varint(static_cast<uint64_t>(v), out);
}
void BytesField(int field, absl::string_view b, std::string* out) {
  Tag(field, 2, out);
  Varint(b.size(), out);
  out->append(b.data(), b.size());
}
void FloatField(int field, float f, std::string* out) {
  Tag(field, 5, out);
  char b[4];
  std::memcpy(b, &f, 4);
  out->append(b, 4);
}

bool ReadVarint(const unsigned char** p, const unsigned char* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    const unsigned char c = *(*p)++;
    *v |= static_cast<uint64_t>(c & 0x7F) << shift;
    if ((c & 0x80) == 0) return true;
  }
  return false;
}

// Calls fn(number, wire_type, varint, fixed32 bits, bytes) per field; false on bad bytes.
template <typename Fn>
bool Fields(absl::string_view msg, Fn&& fn) {
  const auto* p = reinterpret_cast<const unsigned char*>(msg.data());
  const auto* end = p + msg.size();
  while (p < end) {
    uint64_t tag = 0, v = 0;
    if (!ReadVarint(&p, end, &tag)) return false;
    const int number = static_cast<int>(tag >> 3);
    switch (tag & 7) {
      case 0:
        if (!ReadVarint(&p, end, &v)) return false;
        fn(number, 0, v, 0u, absl::string_view());
        break;
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 2:
        if (!ReadVarint(&p, end, &v) || v > static_cast<uint64_t>(end - p)) return false;
        fn(number, 2, 0, 0u, absl::string_view(reinterpret_cast<const char*>(p), v));
        p += v;
        break;
      case 5: {
        if (end - p < 4) return false;
        uint32_t bits;
        std::memcpy(&bits, p, 4);
        p += 4;
        fn(number, 5, 0, bits, absl::string_view());
        break;
      }
      default:
        return false;
    }
  }
  return true;
}

}  // namespace

std::string SerializeSpmModel(const SpmModelSpec& spec) {
  std::string out;
  for (const SpmPiece& p : spec.pieces) {
    std::string m;
    BytesField(kPiece, p.piece, &m);
    FloatField(kScore, p.score, &m);
    IntField(kType, p.type, &m);
    BytesField(kPieces, m, &out);
  }
  std::string trainer;
  IntField(kModelType, spec.model_type, &trainer);
  IntField(kByteFallback, spec.byte_fallback ? 1 : 0, &trainer);
  IntField(kUnkId, spec.unk_id, &trainer);
  IntField(kBosId, spec.bos_id, &trainer);
  IntField(kEosId, spec.eos_id, &trainer);
  IntField(kPadId, spec.pad_id, &trainer);
  BytesField(kTrainerSpec, trainer, &out);
  std::string norm;
  BytesField(kName, "identity", &norm);
  IntField(kAddDummyPrefix, spec.add_dummy_prefix ? 1 : 0, &norm);
  IntField(kRemoveExtraWhitespaces, spec.remove_extra_whitespaces ? 1 : 0, &norm);
  IntField(kEscapeWhitespaces, spec.escape_whitespaces ? 1 : 0, &norm);
  BytesField(kNormalizerSpec, norm, &out);
  return out;
}

absl::StatusOr<SpmModelSpec> ParseSpmModel(absl::string_view bytes) {
  SpmModelSpec spec;
  // proto2 defaults of the fields read here.
  spec.model_type = 1;
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.pad_id = -1;
  spec.add_dummy_prefix = true;
  spec.remove_extra_whitespaces = true;
  spec.escape_whitespaces = true;
  bool ok = true;
  const bool top = Fields(bytes, [&](int n, int wire, uint64_t, uint32_t, absl::string_view b) {
    if (wire != 2) return;
    if (n == kPieces) {
      SpmPiece piece;
      ok = ok && Fields(b, [&](int f, int w, uint64_t v, uint32_t bits, absl::string_view s) {
             if (f == kPiece && w == 2) piece.piece = std::string(s);
             if (f == kScore && w == 5) std::memcpy(&piece.score, &bits, 4);
             if (f == kType && w == 0) piece.type = static_cast<int>(v);
           });
      spec.pieces.push_back(std::move(piece));
    } else if (n == kTrainerSpec) {
      ok = ok && Fields(b, [&](int f, int w, uint64_t v, uint32_t, absl::string_view) {
             if (w != 0) return;
             const int i = static_cast<int>(static_cast<int64_t>(v));
             if (f == kModelType) spec.model_type = i;
             if (f == kByteFallback) spec.byte_fallback = v != 0;
             if (f == kUnkId) spec.unk_id = i;
             if (f == kBosId) spec.bos_id = i;
             if (f == kEosId) spec.eos_id = i;
             if (f == kPadId) spec.pad_id = i;
           });
    } else if (n == kNormalizerSpec) {
      ok = ok && Fields(b, [&](int f, int w, uint64_t v, uint32_t, absl::string_view) {
             if (w != 0) return;
             if (f == kAddDummyPrefix) spec.add_dummy_prefix = v != 0;
             if (f == kRemoveExtraWhitespaces) spec.remove_extra_whitespaces = v != 0;
             if (f == kEscapeWhitespaces) spec.escape_whitespaces = v != 0;
           });
    }
  });
  if (!top || !ok || spec.pieces.empty()) {
    return absl::InvalidArgumentError("not a SentencePiece ModelProto (bad protobuf bytes or no pieces)");
  }
  return spec;
}

}  // namespace echokv::model
