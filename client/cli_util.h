// Client-side helpers shared by echokv-cli and the server benchmark: building
// echokv.v1 requests from command-line input (text, files, chat JSON, id lists,
// compression flags), grpc::Status -> absl::Status, human-readable formatting of
// sessions, reports and InspectCache tables, a stderr progress bar for the
// SessionProgress stream, and a grpc.health.v1 check.
//
//   InputSpec spec;
//   spec.ids = "1,2,3";
//   ECHOKV_ASSIGN_OR_RETURN(echokv::v1::Input input, BuildInput(spec));
//   std::cout << FormatInspect(inspect_response, /*positions=*/false);
//   ECHOKV_ASSIGN_OR_RETURN(std::string state, CheckHealth(channel, "", absl::Seconds(5)));
#ifndef ECHOKV_CLIENT_CLI_UTIL_H_
#define ECHOKV_CLIENT_CLI_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/echokv/v1/echokv.pb.h"

namespace echokv::client {

// The same code and message (grpc and absl share the canonical code numbering).
absl::Status FromGrpcStatus(const grpc::Status& status);

// "NOT_FOUND: session ... not found" -- the code's canonical name and the message.
std::string DescribeStatus(const absl::Status& status);

// Where the input of `create` / `append` comes from: exactly one of the four.
struct InputSpec {
  std::optional<std::string> text;       // literal text
  std::optional<std::string> file;       // path of a UTF-8 text file
  std::optional<std::string> chat_file;  // path of a JSON [{"role":..,"content":..}]
  std::optional<std::string> ids;        // "1,2,3"
  std::optional<bool> add_special_tokens;  // unset -> server default
};

// Errors: INVALID_ARGUMENT naming the flag (none or several sources, bad ids,
// malformed chat JSON with the entry index), NOT_FOUND for an unreadable file.
absl::StatusOr<echokv::v1::Input> BuildInput(const InputSpec& spec);

// "1, 2,3" -> {1, 2, 3}. Errors: INVALID_ARGUMENT naming the bad entry (empty,
// not an integer, outside int32).
absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view text);

// A JSON array of {"role": string, "content": string} objects (or {"messages": [...]}).
// `source` names the input in errors.
absl::StatusOr<echokv::v1::ChatMessages> ParseChatJson(absl::string_view json,
                                                       absl::string_view source);

// The whole file. Errors: NOT_FOUND / PERMISSION_DENIED naming the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Compression flags; unset fields stay unset (server default).
struct CompressionFlags {
  std::optional<std::string> policy;
  std::optional<int64_t> budget;
  std::optional<int64_t> lookahead;
  std::optional<int64_t> workspace;
  std::optional<int64_t> window;
  std::optional<std::string> bootstrap;
  std::optional<bool> repair;
  std::optional<std::string> cache_dtype;  // float32 | int8
  std::optional<double> target_mass;       // (0, 1] (echokv, snapkv)
};

// Errors: INVALID_ARGUMENT naming the flag when a value does not fit int32 (the
// server checks everything else and names the field).
absl::StatusOr<echokv::v1::CompressionConfig> BuildCompression(const CompressionFlags& flags);

// 1536 -> "1.50 KiB"; exact bytes below 1 KiB.
std::string FormatBytes(int64_t bytes);

// Multi-line, human-readable.
std::string FormatServerInfo(const echokv::v1::ServerInfo& info);
std::string FormatCompression(const echokv::v1::CompressionConfig& config);
std::string FormatSession(const echokv::v1::Session& session);
std::string FormatReport(const echokv::v1::CompressionReport& report);
// A table with one row per layer and KV group (retained, bytes), per-layer subtotals
// when a layer has several groups, totals and the last compression report. With
// `positions`, each row is followed by its retained original positions.
std::string FormatInspect(const echokv::v1::InspectCacheResponse& response, bool positions);
// One line per session: id, tokens, retained, bytes, ratio, idle TTL.
std::string FormatSessionList(const echokv::v1::ListSessionsResponse& response);

// Renders SessionProgress events on a stream (stderr). On a terminal: one bar
// redrawn in place; otherwise (CI logs) one line per phase and per 25 % step.
class ProgressBar {
 public:
  ProgressBar(FILE* out, bool interactive);
  void Update(const echokv::v1::SessionProgress::Progress& progress);
  // Ends the in-place line (terminal) so later output starts on a fresh line.
  void Finish();

 private:
  FILE* out_;                  // not owned
  bool interactive_;           // redraw with '\r'
  std::string phase_;          // phase of the last event
  int last_quarter_ = -1;      // last 25 % step printed (non-interactive)
  bool line_open_ = false;     // a '\r' line is on screen
};

// Credentials for a secured server (docs/SECURITY.md): a bearer token (inline, from a
// file, or $ECHOKV_TOKEN) and TLS (CA bundle; client certificate + key for mTLS).
struct CredentialFlags {
  std::optional<std::string> token;       // --token
  std::optional<std::string> token_file;  // --token_file (trailing newline ignored)
  std::optional<std::string> tls_ca;      // --tls_ca: PEM roots (default: the system's)
  std::optional<std::string> tls_cert;    // --tls_cert: client certificate (mTLS)
  std::optional<std::string> tls_key;     // --tls_key: its private key
  // --tls_server_name: the name to verify in the server's certificate (and to send as
  // SNI) instead of --server's host, e.g. when dialing localhost.
  std::optional<std::string> tls_server_name;
};
struct Credentials {
  std::string bearer;     // "" = send no authorization metadata
  bool tls = false;       // any --tls_* flag
  std::string root_pem;   // "" = system roots
  std::string cert_pem;   // mTLS
  std::string key_pem;
  std::string server_name;  // "" = --server's host
};
// Reads the files; INVALID_ARGUMENT naming the flag for conflicts (--token with
// --token_file, --tls_cert without --tls_key, --tls_server_name without TLS),
// unreadable or empty files. `env_token`
// ($ECHOKV_TOKEN) is used when neither token flag is given.
absl::StatusOr<Credentials> LoadCredentials(const CredentialFlags& flags, const char* env_token);

// grpc.health.v1.Health/Check of `service` ("" = the whole server). Returns the
// status name ("SERVING", "NOT_SERVING", "SERVICE_UNKNOWN", "UNKNOWN"); errors are
// the RPC's (UNAVAILABLE when nothing listens, DEADLINE_EXCEEDED, NOT_FOUND for an
// unknown service name).
absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::ChannelInterface>& channel,
                                        const std::string& service, absl::Duration timeout);

}  // namespace echokv::client

#endif  // ECHOKV_CLIENT_CLI_UTIL_H_
