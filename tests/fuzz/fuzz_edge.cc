// libFuzzer target: request bytes at the server's edges.
//   selector % 2 == 0, gRPC: the raw bytes of one request message (type: the
//     (selector / 2)-th method input of echokv.v1.EchoKV) through ParseRequest
//     (wire_check.cc), then what service.cc does with a parsed request (ToInput, ToConfig,
//     ToTtl, ParseMemoryMode, the session id check). Oracle: our parse accepts exactly
//     what protobuf's own parser accepts (wire_check.h: "the two always agree").
//   selector % 2 == 1, HTTP (openai_protocol.cc): (selector / 2) % 3 == 0 a chat
//     completion body, 1 a completion body, 2 session id body field NUL header value.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/echokv/v1/echokv.pb.h"
#include "server/doors/http/openai_protocol.h"
#include "server/doors/grpc/request_convert.h"
#include "server/engine/session_store.h"
#include "server/doors/grpc/wire_check.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace pb = ::echokv::v1;
using google::protobuf::Descriptor;
using google::protobuf::Message;

const std::vector<const Message*>& Prototypes() {
  static const auto* all = [] {
    auto* v = new std::vector<const Message*>();
    const google::protobuf::ServiceDescriptor* service = pb::CreateSessionRequest::descriptor()->file()->FindServiceByName("EchoKV");
    if (service == nullptr) std::abort();
    for (int i = 0; i < service->method_count(); ++i) {
      v->push_back(google::protobuf::MessageFactory::generated_factory()->GetPrototype(service->method(i)->input_type()));
    }
    return v;
  }();
  return *all;
}

void Convert(const Message& msg) {
  const echokv::compression::CompressionConfig defaults;
  auto input_and_config = [&](const pb::Input* input, const pb::CompressionConfig* compression) {
    if (input != nullptr) (void)echokv::server::ToInput(*input);
    if (compression != nullptr) {
      (void)echokv::server::ToConfig(*compression, defaults);
      if (compression->has_memory()) (void)echokv::server::ParseMemoryMode(compression->memory());
    }
  };
  if (auto* m = dynamic_cast<const pb::CreateSessionRequest*>(&msg)) {
    input_and_config(&m->input(), &m->compression());
    (void)echokv::server::ToTtl(m->has_ttl_seconds(), m->ttl_seconds());
  } else if (auto* m = dynamic_cast<const pb::AppendToSessionRequest*>(&msg)) {
    input_and_config(&m->input(), nullptr);
  } else if (auto* m = dynamic_cast<const pb::CompressRequest*>(&msg)) {
    input_and_config(&m->input(), &m->compression());
  } else if (auto* m = dynamic_cast<const pb::ForkSessionRequest*>(&msg)) {
    (void)echokv::server::ToTtl(m->has_ttl_seconds(), m->ttl_seconds());
  } else if (auto* m = dynamic_cast<const pb::ImportSessionRequest*>(&msg)) {
    if (m->has_header()) (void)echokv::server::ToTtl(m->header().has_ttl_seconds(), m->header().ttl_seconds());
  }
  // Every request naming a session goes through the id grammar first.
  const google::protobuf::FieldDescriptor* id = msg.GetDescriptor()->FindFieldByName("session_id");
  if (id != nullptr && id->type() == google::protobuf::FieldDescriptor::TYPE_STRING && !id->is_repeated()) {
    (void)echokv::server::IsValidSessionId(msg.GetReflection()->GetString(msg, id));
  }
}

void Grpc(uint8_t which, absl::string_view wire) {
  const Message* prototype = Prototypes()[which % Prototypes().size()];
  std::unique_ptr<Message> ours(prototype->New());
  std::unique_ptr<Message> theirs(prototype->New());
  const bool ours_ok = echokv::server::ParseRequest(wire, ours.get()).ok();
  const bool theirs_ok = theirs->ParseFromArray(wire.data(), static_cast<int>(wire.size()));
  if (ours_ok != theirs_ok) {
    echokv::fuzz::Violation(std::string("ParseRequest ") + (ours_ok ? "accepted" : "refused") + " a " +
                            prototype->GetTypeName() + " that protobuf " + (theirs_ok ? "accepts" : "refuses"));
  }
  if (ours_ok) Convert(*ours);
}

void Http(uint8_t which, absl::string_view body) {
  echokv::server::HttpError error;
  namespace openai = echokv::server::openai;
  switch (which % 3) {
    case 0: {
      openai::ChatRequest req;
      (void)openai::ParseChatRequest(body, &req, &error);
      break;
    }
    case 1: {
      openai::CompletionRequest req;
      (void)openai::ParseCompletionRequest(body, &req, &error);
      break;
    }
    case 2: {
      auto [field, header] = echokv::fuzz::SplitAtNul(body);
      openai::SessionRef ref;
      (void)openai::ResolveSession(std::string(field), std::string(header), &ref, &error);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every refused string field; the verdicts are what matters here.
  google::protobuf::SetLogHandler(nullptr);
  Prototypes();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const echokv::fuzz::Selected in = echokv::fuzz::Select(data, size);
  if (in.selector % 2 == 0) {
    Grpc(in.selector / 2, in.rest);
  } else {
    Http(in.selector / 2, in.rest);
  }
  return 0;
}
