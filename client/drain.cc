#include "client/drain.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/cli_util.h"
#include "common/status_macros.h"
#include "proto/echokv/v1/echokv.grpc.pb.h"

namespace echokv::client {
namespace {

namespace v1 = ::echokv::v1;

// A short, printable prefix of a client-supplied string for error messages.
std::string Shorten(absl::string_view s) {
  std::string out(s.substr(0, 64));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return s.size() > 64 ? out + "..." : out;
}

class Mover {
 public:
  Mover(const DrainConfig& config, std::string token, v1::EchoKV::Stub* source)
      : config_(config), token_(std::move(token)), source_(source) {}

  void Context(grpc::ClientContext* ctx, bool unary) const {
    if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
    if (unary) ctx->set_deadline(absl::ToChronoTime(absl::Now() + config_.call_timeout));
  }

  absl::StatusOr<v1::Session> Get(v1::EchoKV::Stub* stub, const std::string& id) const {
    grpc::ClientContext ctx;
    Context(&ctx, true);
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::Session out;
    grpc::Status s = stub->GetSession(&ctx, req, &out);
    if (!s.ok()) return FromGrpcStatus(s);
    return out;
  }

  absl::Status Delete(v1::EchoKV::Stub* stub, const std::string& id) const {
    grpc::ClientContext ctx;
    Context(&ctx, true);
    v1::DeleteSessionRequest req;
    req.set_session_id(id);
    v1::DeleteSessionResponse out;
    return FromGrpcStatus(stub->DeleteSession(&ctx, req, &out));
  }

  // Streams ExportSession on the source into ImportSession (keep_id) on `peer`.
  absl::Status Copy(v1::EchoKV::Stub* peer, const std::string& id) const {
    grpc::ClientContext export_ctx;
    Context(&export_ctx, false);
    v1::ExportSessionRequest req;
    req.set_session_id(id);
    std::unique_ptr<grpc::ClientReader<v1::SessionSnapshotChunk>> reader = source_->ExportSession(&export_ctx, req);
    grpc::ClientContext import_ctx;
    Context(&import_ctx, false);
    v1::Session imported;
    std::unique_ptr<grpc::ClientWriter<v1::ImportSessionRequest>> writer = peer->ImportSession(&import_ctx, &imported);
    v1::ImportSessionRequest header;
    header.mutable_header()->set_keep_id(true);
    bool open = writer->Write(header);
    v1::SessionSnapshotChunk chunk;
    while (open && reader->Read(&chunk)) {
      v1::ImportSessionRequest data;
      data.set_data(std::move(*chunk.mutable_data()));
      open = writer->Write(data);
    }
    if (!open) export_ctx.TryCancel();  // the import failed: stop reading
    grpc::Status exported = reader->Finish();
    if (!exported.ok() && open) {
      import_ctx.TryCancel();  // nothing is created on a cancelled import
      writer->Finish();
      return FromGrpcStatus(exported);
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    if (!status.ok()) return FromGrpcStatus(status);
    if (imported.id() != id) {
      return absl::InternalError(absl::StrCat("the import answered id ", Shorten(imported.id()), ", not ", id));
    }
    return absl::OkStatus();
  }

  // One session to `peer`: check, copy, check again, delete the source. Returns OK
  // when moved, NOT_FOUND when its client deleted it meanwhile, another error when it
  // stays here.
  absl::Status Move(v1::EchoKV::Stub* peer, const std::string& id) const {
    absl::Status last = absl::UnknownError("no attempt");
    for (int attempt = 0; attempt < config_.attempts; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 * attempt, 500)));
      absl::StatusOr<v1::Session> before = Get(source_, id);
      if (absl::IsNotFound(before.status())) return before.status();
      if (!before.ok()) return before.status();
      if (before->busy()) {
        last = absl::FailedPreconditionError("busy with a turn");
        continue;
      }
      absl::Status copied = Copy(peer, id);
      if (absl::IsAlreadyExists(copied)) {
        // A copy of an earlier attempt (or run) that was not undone: ids are unique, so
        // it is this session; replace it with the current state.
        if (absl::Status s = Delete(peer, id); !s.ok() && !absl::IsNotFound(s)) return s;
        copied = Copy(peer, id);
      }
      if (absl::IsNotFound(copied)) return copied;  // deleted between the check and the export
      if (!copied.ok()) return copied;
      absl::StatusOr<v1::Session> after = Get(source_, id);
      if (!after.ok() || after->busy() || after->tokens_seen() != before->tokens_seen()) {
        // Changed (or deleted) while it was copied: undo the copy, try again.
        if (absl::Status s = Delete(peer, id); !s.ok() && !absl::IsNotFound(s)) return s;
        if (absl::IsNotFound(after.status())) return after.status();
        last = absl::AbortedError("changed during the copy");
        continue;
      }
      absl::Status deleted = Delete(source_, id);
      if (deleted.ok()) return absl::OkStatus();
      // A turn started after the last check (FAILED_PRECONDITION), or the client
      // deleted it (NOT_FOUND): the copy must not stay.
      if (absl::Status s = Delete(peer, id); !s.ok() && !absl::IsNotFound(s)) return s;
      if (absl::IsNotFound(deleted)) return deleted;
      last = deleted;
    }
    return last;
  }

  absl::StatusOr<std::vector<std::string>> List() const {
    grpc::ClientContext ctx;
    Context(&ctx, true);
    v1::ListSessionsResponse out;
    grpc::Status s = source_->ListSessions(&ctx, v1::ListSessionsRequest(), &out);
    if (!s.ok()) return FromGrpcStatus(s);
    std::vector<std::string> ids;
    for (const v1::Session& session : out.sessions()) ids.push_back(session.id());
    return ids;
  }

 private:
  const DrainConfig& config_;
  std::string token_;
  v1::EchoKV::Stub* source_;
};

}  // namespace

absl::StatusOr<std::pair<std::string, int>> SplitOrdinal(absl::string_view pod) {
  const size_t dash = pod.rfind('-');
  int ordinal = -1;
  if (dash == absl::string_view::npos || dash == 0 || dash + 1 == pod.size() || pod[dash - 1] == '-' ||
      !absl::SimpleAtoi(pod.substr(dash + 1), &ordinal) || ordinal < 0 ||
      !absl::ascii_isdigit(static_cast<unsigned char>(pod[dash + 1]))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pod '", Shorten(pod), "' is not a StatefulSet pod name (<name>-<ordinal>)"));
  }
  return std::make_pair(std::string(pod.substr(0, dash)), ordinal);
}

int HomeOrdinal(int j, int replicas) {
  while (j >= replicas && j > 0) j /= 2;
  return j;
}

int OwnerOrdinal(absl::string_view session_id, absl::string_view statefulset) {
  const size_t dot = session_id.find('.');
  if (dot == absl::string_view::npos) return -1;
  absl::StatusOr<std::pair<std::string, int>> owner = SplitOrdinal(session_id.substr(0, dot));
  if (!owner.ok() || owner->first != statefulset) return -1;
  return owner->second;
}

absl::StatusOr<int> ParseStatefulSetReplicas(absl::string_view json) {
  nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("the StatefulSet from the API is not a JSON object");
  }
  auto spec = doc.find("spec");
  if (spec == doc.end() || !spec->is_object()) return absl::InvalidArgumentError("the StatefulSet has no spec");
  auto replicas = spec->find("replicas");
  if (replicas == spec->end() || !replicas->is_number_integer() || replicas->get<int64_t>() < 0 ||
      replicas->get<int64_t>() > 1000000) {
    return absl::InvalidArgumentError("the StatefulSet's spec.replicas is not a non-negative integer");
  }
  return static_cast<int>(replicas->get<int64_t>());
}

absl::StatusOr<std::string> PeerAddress(absl::string_view peer_template,
                                        const std::map<std::string, std::string>& peer_map,
                                        absl::string_view pod) {
  if (auto it = peer_map.find(std::string(pod)); it != peer_map.end()) return it->second;
  if (!absl::StrContains(peer_template, "{pod}")) {
    return absl::InvalidArgumentError(absl::StrCat("no address for pod ", pod, ": --peer needs {pod} (or --peers ",
                                                   pod, "=HOST:PORT)"));
  }
  return absl::StrReplaceAll(peer_template, {{"{pod}", pod}});
}

absl::StatusOr<std::map<std::string, std::string>> ParsePeerMap(absl::string_view text) {
  std::map<std::string, std::string> out;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty() || !SplitOrdinal(kv.first).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--peers entry '", Shorten(entry), "' is not POD=HOST:PORT"));
    }
    out[std::string(kv.first)] = std::string(kv.second);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ReadTokenDir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::InvalidArgumentError(absl::StrCat("--token-dir ", dir, ": cannot be read"));
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;  // ., .., and a Secret volume's ..data links
    names.push_back(e->d_name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::vector<std::string> tokens;
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    absl::StatusOr<std::string> text = ReadFileToString(path);
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--token-dir: ", text.status().message()));
    std::string token(absl::StripAsciiWhitespace(*text));
    if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("--token-dir: ", path, " is empty"));
    tokens.push_back(std::move(token));
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("--token-dir ", dir, " holds no token file"));
  return tokens;
}

absl::StatusOr<KubeApi> KubeApiFromDir(const std::string& dir, const std::string& url) {
  KubeApi api;
  api.url = url;
  if (api.url.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (host == nullptr || *host == '\0') {
      return absl::InvalidArgumentError("no --kube-api and no $KUBERNETES_SERVICE_HOST (not in a pod?)");
    }
    const std::string h = std::string(host).find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
    api.url = absl::StrCat("https://", h, ":", port != nullptr && *port != '\0' ? port : "443");
  }
  absl::StatusOr<std::string> token = ReadFileToString(dir + "/token");
  if (!token.ok()) return absl::InvalidArgumentError(absl::StrCat("--kube-dir: ", token.status().message()));
  api.token = std::string(absl::StripAsciiWhitespace(*token));
  absl::StatusOr<std::string> ns = ReadFileToString(dir + "/namespace");
  if (!ns.ok()) return absl::InvalidArgumentError(absl::StrCat("--kube-dir: ", ns.status().message()));
  api.namespace_ = std::string(absl::StripAsciiWhitespace(*ns));
  if (api.token.empty() || api.namespace_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--kube-dir ", dir, ": empty token or namespace"));
  }
  if (absl::StartsWith(api.url, "https://")) api.ca_file = dir + "/ca.crt";
  return api;
}

absl::StatusOr<int> FetchReplicas(const KubeApi& api, const std::string& statefulset, absl::Duration timeout) {
  httplib::Client http(api.url);
  if (!api.ca_file.empty()) {
    http.set_ca_cert_path(api.ca_file.c_str());
    http.enable_server_certificate_verification(true);
  }
  const time_t secs = static_cast<time_t>(std::max<int64_t>(1, absl::ToInt64Seconds(timeout)));
  http.set_connection_timeout(secs, 0);
  http.set_read_timeout(secs, 0);
  http.set_bearer_token_auth(api.token.c_str());
  const std::string path = absl::StrCat("/apis/apps/v1/namespaces/", api.namespace_, "/statefulsets/", statefulset);
  httplib::Result res = http.Get(path.c_str());
  if (!res) {
    return absl::UnavailableError(absl::StrCat("GET ", api.url, path, ": ", httplib::to_string(res.error())));
  }
  if (res->status == 401 || res->status == 403) {
    return absl::PermissionDeniedError(absl::StrCat("GET ", path, ": HTTP ", res->status,
                                                    " (the ServiceAccount may not get the StatefulSet: RBAC)"));
  }
  if (res->status == 404) return absl::NotFoundError(absl::StrCat("GET ", path, ": no such StatefulSet"));
  if (res->status != 200) return absl::UnavailableError(absl::StrCat("GET ", path, ": HTTP ", res->status));
  return ParseStatefulSetReplicas(res->body);
}

absl::StatusOr<DrainReport> Drain(const DrainConfig& config, const std::shared_ptr<grpc::Channel>& local,
                                  const ChannelFactory& connect, const std::vector<std::string>& tokens) {
  ECHOKV_ASSIGN_OR_RETURN(auto self, SplitOrdinal(config.pod));
  DrainReport report;
  if (config.replicas < 0) return absl::InvalidArgumentError("the StatefulSet's replicas are unknown");
  if (self.second < config.replicas || config.replicas == 0) return report;
  report.scaled_away = true;
  std::unique_ptr<v1::EchoKV::Stub> source = v1::EchoKV::NewStub(local);
  std::map<int, std::unique_ptr<v1::EchoKV::Stub>> peers;
  for (const std::string& token : tokens.empty() ? std::vector<std::string>{""} : tokens) {
    Mover mover(config, token, source.get());
    absl::StatusOr<std::vector<std::string>> ids = mover.List();
    if (!ids.ok()) {
      report.left.push_back(absl::StrCat("(a tenant's sessions): ListSessions: ", DescribeStatus(ids.status())));
      continue;
    }
    for (const std::string& id : *ids) {
      if (absl::Now() >= config.deadline) {
        report.left.push_back(absl::StrCat(id, ": the drain's deadline passed"));
        continue;
      }
      int owner = OwnerOrdinal(id, self.first);
      if (owner < 0) owner = self.second;  // an id without this StatefulSet's prefix: ours
      const int home = HomeOrdinal(owner, config.replicas);
      const std::string pod = absl::StrCat(self.first, "-", home);
      absl::StatusOr<std::string> address = PeerAddress(config.peer, config.peer_map, pod);
      if (!address.ok()) return address.status();
      if (config.dry_run) {
        report.lines.push_back(absl::StrCat(id, " -> ", pod, " (", *address, ") [dry run]"));
        continue;
      }
      auto& stub = peers[home];
      if (stub == nullptr) stub = v1::EchoKV::NewStub(connect(*address));
      absl::Status moved = mover.Move(stub.get(), id);
      if (moved.ok()) {
        ++report.moved;
        report.lines.push_back(absl::StrCat(id, " -> ", pod));
      } else if (absl::IsNotFound(moved)) {
        ++report.gone;
      } else {
        report.left.push_back(absl::StrCat(id, ": ", DescribeStatus(moved)));
      }
    }
  }
  return report;
}

}  // namespace echokv::client
