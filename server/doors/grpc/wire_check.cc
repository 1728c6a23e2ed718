#include "server/doors/grpc/wire_check.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/stubs/common.h>
#include <google/protobuf/wire_format_lite.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace echokv::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

constexpr int kMaxDepth = 100;  // protobuf's default recursion limit

absl::Status Malformed(const Descriptor* root, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("request is not a valid ", root->full_name(), " message (", why, ")"));
}

std::string Join(const std::string& prefix, absl::string_view name) {
  return prefix.empty() ? std::string(name) : absl::StrCat(prefix, ".", name);
}

// Walks one message up to the current limit of `in`.
absl::Status Walk(CodedInputStream* in, const Descriptor* d, const std::string& path, int depth,
                  const Descriptor* root) {
  if (depth > kMaxDepth) return Malformed(root, "nested too deeply");
  absl::flat_hash_map<int, int> seen;  // field number -> occurrences (indexes of repeated fields)
  while (true) {
    const uint32_t tag = in->ReadTag();
    if (tag == 0) {
      if (in->ConsumedEntireMessage()) return absl::OkStatus();
      return Malformed(root, "bad field tag");
    }
    const int number = WireFormatLite::GetTagFieldNumber(tag);
    const WireFormatLite::WireType type = WireFormatLite::GetTagWireType(tag);
    const FieldDescriptor* f = d->FindFieldByNumber(number);
    if (type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED || f == nullptr ||
        (f->type() != FieldDescriptor::TYPE_STRING && f->type() != FieldDescriptor::TYPE_MESSAGE)) {
      if (!WireFormatLite::SkipField(in, tag)) return Malformed(root, "truncated or bad field");
      continue;
    }
    std::string name = Join(path, f->name());
    const int index = seen[number]++;
    if (f->is_repeated()) absl::StrAppend(&name, "[", index, "]");
    int length = 0;
    if (!in->ReadVarintSizeAsInt(&length)) return Malformed(root, "bad length");
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      std::string value;
      if (!in->ReadString(&value, length)) return Malformed(root, "truncated string");
      if (!google::protobuf::internal::IsStructurallyValidUTF8(value.data(), static_cast<int>(value.size()))) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": not valid UTF-8 (string fields must be UTF-8 text; ", value.size(), " bytes)"));
      }
      continue;
    }
    const CodedInputStream::Limit limit = in->PushLimit(length);
    if (in->BytesUntilLimit() != length) return Malformed(root, "truncated message field");
    if (absl::Status s = Walk(in, f->message_type(), name, depth + 1, root); !s.ok()) return s;
    in->PopLimit(limit);
  }
}

}  // namespace

absl::Status CheckWire(absl::string_view wire, const Descriptor* descriptor) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(wire.data()), static_cast<int>(wire.size()));
  return Walk(&in, descriptor, "", 0, descriptor);
}

absl::Status ParseRequest(absl::string_view wire, google::protobuf::Message* message) {
  message->Clear();
  if (absl::Status s = CheckWire(wire, message->GetDescriptor()); !s.ok()) return s;
  if (!message->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return Malformed(message->GetDescriptor(), "rejected by the protobuf parser");
  }
  return absl::OkStatus();
}

}  // namespace echokv::server
