#include "server/state/format.h"

#include <xxhash.h>

#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/state/session_id.h"

namespace echokv::state::internal {

// ---- little-endian helpers ----

void PutU16(std::string* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t GetU16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint64_t Xxh3(absl::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3Stream::Update(absl::string_view bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}
uint64_t Xxh3Stream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

absl::Status KindError(ErrorKind kind, absl::string_view message) {
  absl::Status status;
  switch (kind) {
    case ErrorKind::kChecksum:
    case ErrorKind::kTruncated:
    case ErrorKind::kMissingSegment:
    case ErrorKind::kBadManifest:
      status = absl::DataLossError(message);
      break;
    case ErrorKind::kForeignModel:
    case ErrorKind::kUnknownVersion:
      status = absl::FailedPreconditionError(message);
      break;
    case ErrorKind::kIo:
      status = absl::InternalError(message);
      break;
  }
  return WithErrorKind(status, kind);
}

namespace {

std::string Hex16(uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 0xf];
  return s;
}

bool ParseHex16(absl::string_view s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

bool IsAllZero(absl::string_view bytes) {
  for (char c : bytes) {
    if (c != 0) return false;
  }
  return true;
}

void PutFingerprint(std::string* out, const ModelFingerprint& fp) {
  PutU64(out, fp.low);
  PutU64(out, fp.high);
}
ModelFingerprint GetFingerprint(const char* p) { return {GetU64(p), GetU64(p + 8)}; }

absl::Status CheckMagicAndVersion(absl::string_view bytes, absl::string_view magic,
                                  absl::string_view what, uint32_t* version) {
  if (bytes.substr(0, 8) != magic) {
    return KindError(ErrorKind::kChecksum,
                     absl::StrCat(what, ": bad magic \"", absl::CHexEscape(bytes.substr(0, 8)),
                                  "\" (expected \"", magic, "\")"));
  }
  *version = GetU32(bytes.data() + 8);
  if (*version != kFormatVersion) {
    return KindError(ErrorKind::kUnknownVersion,
                     absl::StrCat(what, ": format version ", *version,
                                  " is not supported (this build reads version ", kFormatVersion,
                                  ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckFingerprint(const ModelFingerprint& got, const ModelFingerprint& expected,
                              absl::string_view what) {
  if (got == expected) return absl::OkStatus();
  return KindError(ErrorKind::kForeignModel,
                   absl::StrCat(what, ": written for model fingerprint ", got.ToHex(),
                                ", this server's model is ", expected.ToHex()));
}

// Maximum nesting of [ and { outside strings; JSON deeper than kMaxJsonDepth is refused
// before parsing (nothing recursive ever sees it).
constexpr int kMaxJsonDepth = 64;
bool JsonDepthWithin(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// Typed field access on a JSON object; every miss is a kBadManifest naming the field.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string what) : j_(j), what_(std::move(what)) {}

  absl::Status Missing(absl::string_view key, absl::string_view expected) const {
    return KindError(ErrorKind::kBadManifest,
                     absl::StrCat(what_, ": field \"", key, "\" is missing or not ", expected));
  }
  absl::StatusOr<int64_t> Int(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_number_integer()) return Missing(key, "an integer");
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Missing(key, "an int64");
    }
    return it->get<int64_t>();
  }
  absl::StatusOr<uint64_t> NonNegative(const char* key) const {
    ECHOKV_ASSIGN_OR_RETURN(int64_t v, Int(key));
    if (v < 0) return Missing(key, "a non-negative integer");
    return static_cast<uint64_t>(v);
  }
  absl::StatusOr<std::string> String(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_string()) return Missing(key, "a string");
    return it->get<std::string>();
  }
  absl::StatusOr<bool> Bool(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_boolean()) return Missing(key, "a boolean");
    return it->get<bool>();
  }
  absl::StatusOr<uint64_t> Hex(const char* key) const {
    ECHOKV_ASSIGN_OR_RETURN(std::string s, String(key));
    uint64_t v;
    if (!ParseHex16(s, &v)) return Missing(key, "16 lowercase hex digits");
    return v;
  }

 private:
  const nlohmann::json& j_;
  std::string what_;
};

}  // namespace

absl::Status ValidateBlobName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxBlobNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("blob name \"", absl::CHexEscape(name.substr(0, 64)),
                                                   "\" must be 1..255 bytes"));
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("blob name \"", absl::CHexEscape(name.substr(0, 64)),
                                                     "\" has a character outside [A-Za-z0-9._:/-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> BlobBytes(DType dtype, const std::vector<int64_t>& shape) {
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  if (shape.size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", shape.size(), " is over ", kMaxRank));
  }
  constexpr uint64_t kMax = uint64_t{1} << 62;
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (d != 0 && n > kMax / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError("blob size overflows 2^62 bytes");
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

// ---- segment ----

absl::StatusOr<std::string> EncodeSegmentHeader(const std::vector<BlobView>& blobs,
                                                SegmentFixed* fixed,
                                                std::vector<BlobInfo>* layout) {
  layout->clear();
  std::string table;
  std::set<absl::string_view> names;
  uint64_t end = 0;
  for (const BlobView& b : blobs) {
    ECHOKV_RETURN_IF_ERROR(ValidateBlobName(b.name));
    if (!names.insert(b.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("blob \"", b.name, "\" appears twice"));
    }
    auto bytes = BlobBytes(b.dtype, b.shape);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("blob \"", b.name, "\": ", bytes.status().message()));
    }
    if (*bytes != b.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "blob \"", b.name, "\" has ", b.data.size(), " bytes; its dtype ", DTypeName(b.dtype),
          " and shape need ", *bytes));
    }
    BlobInfo info{b.name, b.dtype, b.shape, AlignUp(end, kBlobAlignment), *bytes};
    end = info.offset + info.bytes;
    PutU16(&table, static_cast<uint16_t>(b.name.size()));
    table += b.name;
    table.push_back(static_cast<char>(b.dtype));
    table.push_back(static_cast<char>(b.shape.size()));
    for (int64_t d : b.shape) PutU64(&table, static_cast<uint64_t>(d));
    PutU64(&table, info.offset);
    PutU64(&table, info.bytes);
    layout->push_back(std::move(info));
  }
  fixed->blob_count = static_cast<uint32_t>(blobs.size());
  fixed->table_bytes = static_cast<uint32_t>(table.size());
  fixed->payload_offset = AlignUp(kSegmentFixedBytes + table.size(), kBlobAlignment);
  fixed->payload_bytes = end;
  fixed->table_xxh3 = Xxh3(table);

  std::string out;
  out.reserve(fixed->payload_offset);
  out.append(kSegmentMagic.data(), kSegmentMagic.size());
  PutU32(&out, fixed->version);
  PutU32(&out, fixed->flags);
  PutFingerprint(&out, fixed->model);
  PutU64(&out, fixed->seq);
  PutU64(&out, static_cast<uint64_t>(fixed->token_begin));
  PutU64(&out, static_cast<uint64_t>(fixed->token_end));
  PutU32(&out, fixed->blob_count);
  PutU32(&out, fixed->table_bytes);
  PutU64(&out, fixed->payload_offset);
  PutU64(&out, fixed->payload_bytes);
  PutU64(&out, fixed->payload_xxh3);
  PutU64(&out, fixed->table_xxh3);
  out.append(24, '\0');
  fixed->header_xxh3 = Xxh3(out);
  PutU64(&out, fixed->header_xxh3);
  out += table;
  out.resize(fixed->payload_offset, '\0');
  return out;
}

absl::StatusOr<SegmentFixed> DecodeSegmentFixed(absl::string_view bytes,
                                                const ModelFingerprint& expected,
                                                const StateLimits& limits,
                                                absl::string_view what) {
  if (bytes.size() < kSegmentFixedBytes) {
    return KindError(ErrorKind::kTruncated,
                     absl::StrCat(what, ": ", bytes.size(), " bytes, shorter than the ",
                                  kSegmentFixedBytes, "-byte segment header"));
  }
  SegmentFixed f;
  ECHOKV_RETURN_IF_ERROR(CheckMagicAndVersion(bytes, kSegmentMagic, what, &f.version));
  const char* p = bytes.data();
  f.header_xxh3 = GetU64(p + 120);
  if (!ChecksumMatches(Xxh3(bytes.substr(0, 120)), f.header_xxh3)) {
    return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": segment header checksum mismatch"));
  }
  f.flags = GetU32(p + 12);
  f.model = GetFingerprint(p + 16);
  f.seq = GetU64(p + 32);
  f.token_begin = static_cast<int64_t>(GetU64(p + 40));
  f.token_end = static_cast<int64_t>(GetU64(p + 48));
  f.blob_count = GetU32(p + 56);
  f.table_bytes = GetU32(p + 60);
  f.payload_offset = GetU64(p + 64);
  f.payload_bytes = GetU64(p + 72);
  f.payload_xxh3 = GetU64(p + 80);
  f.table_xxh3 = GetU64(p + 88);
  // The checksum matched, so a bad field here was written that way: still refuse it.
  std::string bad;
  if (!IsAllZero(bytes.substr(96, 24))) bad = "reserved bytes are not zero";
  else if ((f.flags & ~kSegmentFlagSupersedes) != 0) bad = absl::StrCat("unknown flags ", f.flags);
  else if (f.token_begin < 0 || f.token_end < f.token_begin) bad = "bad token range";
  else if (f.blob_count > limits.max_blobs) bad = absl::StrCat(f.blob_count, " blobs is over the limit");
  else if (f.table_bytes > limits.max_blob_table_bytes) bad = "blob table is over the size limit";
  else if (f.payload_offset != AlignUp(kSegmentFixedBytes + f.table_bytes, kBlobAlignment)) bad = "bad payload offset";
  else if (f.payload_bytes > (uint64_t{1} << 62)) bad = "payload length is over 2^62";
  if (!bad.empty()) return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": ", bad));
  ECHOKV_RETURN_IF_ERROR(CheckFingerprint(f.model, expected, what));
  return f;
}

absl::StatusOr<std::vector<BlobInfo>> DecodeBlobTable(absl::string_view bytes,
                                                      const SegmentFixed& fixed,
                                                      absl::string_view what) {
  const uint64_t want = fixed.payload_offset - kSegmentFixedBytes;
  if (bytes.size() != want) {
    return KindError(ErrorKind::kTruncated,
                     absl::StrCat(what, ": blob table has ", bytes.size(), " bytes, expected ", want));
  }
  absl::string_view table = bytes.substr(0, fixed.table_bytes);
  if (!ChecksumMatches(Xxh3(table), fixed.table_xxh3)) {
    return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": blob table checksum mismatch"));
  }
  auto bad = [&](absl::string_view why) {
    return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": blob table: ", why));
  };
  if (!IsAllZero(bytes.substr(fixed.table_bytes))) return bad("padding is not zero");
  std::vector<BlobInfo> blobs;
  std::set<std::string> names;
  size_t pos = 0;
  uint64_t end = 0;
  for (uint32_t i = 0; i < fixed.blob_count; ++i) {
    if (table.size() - pos < 2) return bad("entry runs past the table");
    uint16_t name_len = GetU16(table.data() + pos);
    pos += 2;
    if (table.size() - pos < size_t{name_len} + 2) return bad("entry runs past the table");
    BlobInfo b;
    b.name = std::string(table.substr(pos, name_len));
    pos += name_len;
    if (!ValidateBlobName(b.name).ok()) return bad("bad blob name");
    if (!names.insert(b.name).second) return bad(absl::StrCat("blob \"", b.name, "\" appears twice"));
    uint8_t dtype = static_cast<uint8_t>(table[pos]);
    uint8_t rank = static_cast<uint8_t>(table[pos + 1]);
    pos += 2;
    if (!IsKnownDType(dtype)) return bad(absl::StrCat("unknown dtype ", int{dtype}));
    if (rank > kMaxRank) return bad(absl::StrCat("rank ", int{rank}, " is over ", kMaxRank));
    b.dtype = static_cast<DType>(dtype);
    if (table.size() - pos < size_t{rank} * 8 + 16) return bad("entry runs past the table");
    for (uint8_t r = 0; r < rank; ++r, pos += 8) {
      b.shape.push_back(static_cast<int64_t>(GetU64(table.data() + pos)));
    }
    b.offset = GetU64(table.data() + pos);
    b.bytes = GetU64(table.data() + pos + 8);
    pos += 16;
    auto expect = BlobBytes(b.dtype, b.shape);
    if (!expect.ok() || *expect != b.bytes) return bad(absl::StrCat("blob \"", b.name, "\": bytes do not match its shape"));
    if (b.offset != AlignUp(end, kBlobAlignment)) return bad(absl::StrCat("blob \"", b.name, "\": bad offset"));
    if (b.bytes > fixed.payload_bytes || b.offset > fixed.payload_bytes - b.bytes) {
      return bad(absl::StrCat("blob \"", b.name, "\" runs past the payload"));
    }
    end = b.offset + b.bytes;
    blobs.push_back(std::move(b));
  }
  if (pos != table.size()) return bad("bytes after the last entry");
  if (end != fixed.payload_bytes) return bad("payload length does not match the blobs");
  return blobs;
}

// ---- manifest ----

absl::StatusOr<std::string> EncodeManifest(const SessionManifest& manifest) {
  const SavedSession& m = manifest.meta;
  nlohmann::json j = nlohmann::json::object();
  j["id"] = m.id;
  j["tenant"] = m.tenant;
  j["memory"] = std::string(MemoryModeName(m.memory));
  j["compression"] = m.compression_config;
  j["created_us"] = absl::ToUnixMicros(m.created);
  j["last_used_us"] = absl::ToUnixMicros(m.last_used);
  if (m.ttl == absl::InfiniteDuration()) {
    j["ttl_us"] = nullptr;
  } else {
    j["ttl_us"] = absl::ToInt64Microseconds(m.ttl);
  }
  j["next_position"] = m.next_position;
  nlohmann::json segs = nlohmann::json::array();
  for (const SegmentInfo& s : manifest.segments) {
    segs.push_back({{"seq", s.seq},
                    {"token_begin", s.token_begin},
                    {"token_end", s.token_end},
                    {"supersedes", s.supersedes_earlier},
                    {"payload_bytes", s.payload_bytes},
                    {"file_bytes", s.file_bytes},
                    {"payload_xxh3", Hex16(s.payload_xxh3)},
                    {"header_xxh3", Hex16(s.header_xxh3)}});
  }
  j["segments"] = std::move(segs);
  std::string json;
  try {
    json = j.dump();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("session ", m.id, ": manifest is not valid JSON text: ", e.what()));
  }

  std::string out;
  out.reserve(kManifestFixedBytes + AlignUp(json.size(), 4) + 4 * m.tokens.size() + 8);
  out.append(kManifestMagic.data(), kManifestMagic.size());
  PutU32(&out, kFormatVersion);
  PutU32(&out, 0);
  PutFingerprint(&out, manifest.model);
  PutU64(&out, json.size());
  PutU64(&out, m.tokens.size());
  PutU64(&out, 0);
  PutU64(&out, Xxh3(out));
  out += json;
  out.resize(kManifestFixedBytes + AlignUp(json.size(), 4), '\0');
  for (int32_t t : m.tokens) PutU32(&out, static_cast<uint32_t>(t));
  PutU64(&out, Xxh3(absl::string_view(out).substr(kManifestFixedBytes)));
  return out;
}

absl::StatusOr<ManifestFixed> DecodeManifestFixed(absl::string_view bytes,
                                                  const ModelFingerprint& expected,
                                                  const StateLimits& limits,
                                                  absl::string_view what) {
  if (bytes.size() < kManifestFixedBytes) {
    return KindError(ErrorKind::kTruncated,
                     absl::StrCat(what, ": ", bytes.size(), " bytes, shorter than the ",
                                  kManifestFixedBytes, "-byte manifest header"));
  }
  ManifestFixed f;
  ECHOKV_RETURN_IF_ERROR(CheckMagicAndVersion(bytes, kManifestMagic, what, &f.version));
  const char* p = bytes.data();
  if (!ChecksumMatches(Xxh3(bytes.substr(0, 56)), GetU64(p + 56))) {
    return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": manifest header checksum mismatch"));
  }
  f.model = GetFingerprint(p + 16);
  f.json_bytes = GetU64(p + 32);
  f.token_count = GetU64(p + 40);
  if (GetU32(p + 12) != 0 || GetU64(p + 48) != 0) {
    return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": unknown flags or reserved bytes set"));
  }
  if (f.json_bytes > limits.max_manifest_json_bytes) {
    return KindError(ErrorKind::kBadManifest,
                     absl::StrCat(what, ": manifest JSON of ", f.json_bytes,
                                  " bytes is over the limit of ", limits.max_manifest_json_bytes));
  }
  if (f.token_count > limits.max_tokens) {
    return KindError(ErrorKind::kBadManifest,
                     absl::StrCat(what, ": ", f.token_count, " tokens is over the limit of ",
                                  limits.max_tokens));
  }
  ECHOKV_RETURN_IF_ERROR(CheckFingerprint(f.model, expected, what));
  return f;
}

absl::Status ValidateSegmentChain(const std::vector<SegmentInfo>& segments, uint64_t token_count,
                                  absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    return KindError(ErrorKind::kBadManifest, absl::StrCat(what, ": ", why));
  };
  if (segments.empty()) return bad("lists no segment");
  for (size_t i = 0; i < segments.size(); ++i) {
    const SegmentInfo& s = segments[i];
    if (s.seq == 0) return bad("segment seq 0");
    if (s.token_begin < 0 || s.token_end < s.token_begin) {
      return bad(absl::StrCat("segment ", s.seq, " has a bad token range"));
    }
    if (i > 0) {
      if (s.seq <= segments[i - 1].seq) return bad("segment seqs are not increasing");
      if (s.supersedes_earlier) return bad(absl::StrCat("segment ", s.seq, " supersedes earlier segments but is not the first"));
      if (s.token_begin != segments[i - 1].token_end) {
        return bad(absl::StrCat("segment ", s.seq, " starts at token ", s.token_begin,
                                ", the previous one ends at ", segments[i - 1].token_end));
      }
    }
  }
  if (static_cast<uint64_t>(segments.back().token_end) != token_count) {
    return bad(absl::StrCat("segments end at token ", segments.back().token_end, ", the history has ",
                            token_count));
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionManifest> DecodeManifest(absl::string_view bytes,
                                               const ModelFingerprint& expected,
                                               const StateLimits& limits,
                                               absl::string_view what) {
  ECHOKV_ASSIGN_OR_RETURN(ManifestFixed f, DecodeManifestFixed(bytes, expected, limits, what));
  if (bytes.size() < f.file_bytes()) {
    return KindError(ErrorKind::kTruncated, absl::StrCat(what, ": ", bytes.size(), " bytes, the header says ",
                                                         f.file_bytes()));
  }
  if (bytes.size() > f.file_bytes()) {
    return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": ", bytes.size() - f.file_bytes(),
                                                        " bytes after the end the header gives"));
  }
  absl::string_view body = bytes.substr(kManifestFixedBytes, bytes.size() - kManifestFixedBytes - 8);
  if (!ChecksumMatches(Xxh3(body), GetU64(bytes.data() + bytes.size() - 8))) {
    return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": manifest checksum mismatch"));
  }
  absl::string_view json_text = body.substr(0, f.json_bytes);
  if (!IsAllZero(body.substr(f.json_bytes, AlignUp(f.json_bytes, 4) - f.json_bytes))) {
    return KindError(ErrorKind::kChecksum, absl::StrCat(what, ": padding is not zero"));
  }
  if (!JsonDepthWithin(json_text, kMaxJsonDepth)) {
    return KindError(ErrorKind::kBadManifest, absl::StrCat(what, ": JSON nested deeper than ", kMaxJsonDepth));
  }
  nlohmann::json j = nlohmann::json::parse(json_text.begin(), json_text.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return KindError(ErrorKind::kBadManifest, absl::StrCat(what, ": manifest JSON is not an object"));
  }
  Fields fields(j, std::string(what));
  SessionManifest m;
  m.model = f.model;
  SavedSession& meta = m.meta;
  ECHOKV_ASSIGN_OR_RETURN(meta.id, fields.String("id"));
  ECHOKV_ASSIGN_OR_RETURN(meta.tenant, fields.String("tenant"));
  ECHOKV_ASSIGN_OR_RETURN(std::string memory, fields.String("memory"));
  auto mode = MemoryModeFromName(memory);
  if (!mode.ok()) return fields.Missing("memory", "\"tiered\" or \"evict\"");
  meta.memory = *mode;
  auto comp = j.find("compression");
  if (comp == j.end() || !comp->is_object()) return fields.Missing("compression", "an object");
  meta.compression_config = *comp;
  ECHOKV_ASSIGN_OR_RETURN(int64_t created, fields.Int("created_us"));
  ECHOKV_ASSIGN_OR_RETURN(int64_t last_used, fields.Int("last_used_us"));
  meta.created = absl::FromUnixMicros(created);
  meta.last_used = absl::FromUnixMicros(last_used);
  auto ttl = j.find("ttl_us");
  if (ttl != j.end() && ttl->is_null()) {
    meta.ttl = absl::InfiniteDuration();
  } else {
    ECHOKV_ASSIGN_OR_RETURN(int64_t ttl_us, fields.NonNegative("ttl_us"));
    meta.ttl = absl::Microseconds(ttl_us);
  }
  ECHOKV_ASSIGN_OR_RETURN(meta.next_position, fields.Int("next_position"));
  const char* tokens = body.data() + AlignUp(f.json_bytes, 4);
  meta.tokens.resize(f.token_count);
  for (uint64_t i = 0; i < f.token_count; ++i) {
    meta.tokens[i] = static_cast<int32_t>(GetU32(tokens + 4 * i));
  }
  absl::Status valid = meta.Validate();
  if (!valid.ok()) return KindError(ErrorKind::kBadManifest, absl::StrCat(what, ": ", valid.message()));

  auto segs = j.find("segments");
  if (segs == j.end() || !segs->is_array()) return fields.Missing("segments", "an array");
  if (segs->size() > limits.max_segments) {
    return KindError(ErrorKind::kBadManifest, absl::StrCat(what, ": ", segs->size(),
                                                           " segments is over the limit of ",
                                                           limits.max_segments));
  }
  for (const nlohmann::json& e : *segs) {
    if (!e.is_object()) return fields.Missing("segments[]", "an object");
    Fields sf(e, absl::StrCat(what, ": segment entry"));
    SegmentInfo s;
    ECHOKV_ASSIGN_OR_RETURN(s.seq, sf.NonNegative("seq"));
    ECHOKV_ASSIGN_OR_RETURN(s.token_begin, sf.Int("token_begin"));
    ECHOKV_ASSIGN_OR_RETURN(s.token_end, sf.Int("token_end"));
    ECHOKV_ASSIGN_OR_RETURN(s.supersedes_earlier, sf.Bool("supersedes"));
    ECHOKV_ASSIGN_OR_RETURN(s.payload_bytes, sf.NonNegative("payload_bytes"));
    ECHOKV_ASSIGN_OR_RETURN(s.file_bytes, sf.NonNegative("file_bytes"));
    ECHOKV_ASSIGN_OR_RETURN(s.payload_xxh3, sf.Hex("payload_xxh3"));
    ECHOKV_ASSIGN_OR_RETURN(s.header_xxh3, sf.Hex("header_xxh3"));
    m.segments.push_back(std::move(s));
  }
  ECHOKV_RETURN_IF_ERROR(ValidateSegmentChain(m.segments, f.token_count, what));
  return m;
}

// ---- snapshot ----

std::string EncodeSnapshotHeader(const SnapshotHeader& header) {
  std::string out;
  out.append(kSnapshotMagic.data(), kSnapshotMagic.size());
  PutU32(&out, header.version);
  PutU32(&out, 0);
  PutFingerprint(&out, header.model);
  PutU64(&out, header.manifest_bytes);
  PutU64(&out, header.segment_count);
  PutU64(&out, 0);
  PutU64(&out, Xxh3(out));
  return out;
}

absl::StatusOr<SnapshotHeader> DecodeSnapshotHeader(absl::string_view bytes,
                                                    const ModelFingerprint& expected) {
  if (bytes.size() < kSnapshotHeaderBytes) {
    return absl::InvalidArgumentError("snapshot: shorter than its 64-byte header");
  }
  if (bytes.substr(0, 8) != kSnapshotMagic) {
    return absl::InvalidArgumentError(absl::StrCat("snapshot: bad magic \"", absl::CHexEscape(bytes.substr(0, 8)),
                                                   "\" (not an echokv session snapshot)"));
  }
  SnapshotHeader h;
  h.version = GetU32(bytes.data() + 8);
  if (h.version != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("snapshot: format version ", h.version,
                                                      " is not supported (this build reads version ",
                                                      kFormatVersion, ")"));
  }
  if (!ChecksumMatches(Xxh3(bytes.substr(0, 56)), GetU64(bytes.data() + 56))) {
    return absl::DataLossError("snapshot: header checksum mismatch");
  }
  if (GetU32(bytes.data() + 12) != 0 || GetU64(bytes.data() + 48) != 0) {
    return absl::DataLossError("snapshot: unknown flags or reserved bytes set");
  }
  h.model = GetFingerprint(bytes.data() + 16);
  h.manifest_bytes = GetU64(bytes.data() + 32);
  h.segment_count = GetU64(bytes.data() + 40);
  if (h.model != expected) {
    return absl::FailedPreconditionError(absl::StrCat("snapshot: from a model with fingerprint ", h.model.ToHex(),
                                                      ", this server's model is ", expected.ToHex()));
  }
  return h;
}

std::string EncodeSnapshotTrailer(uint64_t bytes_before, uint64_t stream_xxh3) {
  std::string out;
  out.append(kTrailerMagic.data(), kTrailerMagic.size());
  PutU64(&out, bytes_before);
  PutU64(&out, stream_xxh3);
  PutU64(&out, Xxh3(out));
  return out;
}

absl::Status CheckSnapshotTrailer(absl::string_view bytes, uint64_t bytes_before,
                                  uint64_t stream_xxh3) {
  if (bytes.size() != kSnapshotTrailerBytes || bytes.substr(0, 8) != kTrailerMagic ||
      !ChecksumMatches(Xxh3(bytes.substr(0, 24)), GetU64(bytes.data() + 24))) {
    return absl::DataLossError("snapshot: bad trailer");
  }
  if (GetU64(bytes.data() + 8) != bytes_before) {
    return absl::DataLossError(absl::StrCat("snapshot: trailer says ", GetU64(bytes.data() + 8),
                                            " bytes came before it, there were ", bytes_before));
  }
  if (!ChecksumMatches(stream_xxh3, GetU64(bytes.data() + 16))) {
    return absl::DataLossError("snapshot: stream checksum mismatch");
  }
  return absl::OkStatus();
}

}  // namespace echokv::state::internal
