// The scale-down drain of `echokv-cli drain` (docs/DEPLOY.md "Drain"): a server pod
// that is leaving (its StatefulSet ordinal at or above spec.replicas) moves every
// session to the pods that remain with ExportSession / ImportSession, keeping each
// session's id. Ids name their first owner ("echokv-2.<32 hex>"); a moved session
// lives on the first *heir* of that owner that remains: ordinal j's heirs are j/2,
// j/4, ..., 0 (integer halving), and with R pods left it goes to HomeOrdinal(j, R),
// the first of j, j/2, j/4, ... below R. Removing the highest pods never moves any
// other session, so a client (or the gateway) finds a session on its owner or on the
// first of its heirs that holds it (client/python/echokv/routing.py walks them).
//
// A move is safe against a client still writing to the session: the session is read
// (GetSession: tokens_seen, busy) before the export and again after the import; if it
// changed or got busy, the copy is deleted and the move retried; the source is deleted
// last, and a delete refused because a turn started (FAILED_PRECONDITION) undoes the
// copy as well. A session is therefore on exactly one pod whenever no move is between
// its last check and its delete (one round trip).
//
//   DrainConfig config;
//   config.pod = "echokv-2";                      // this pod: StatefulSet "echokv", ordinal 2
//   config.replicas = 2;                          // or FetchReplicas(KubeApiFromDir(...), "echokv")
//   config.peer = "{pod}.echokv-headless.ns.svc.cluster.local:50051";
//   ECHOKV_ASSIGN_OR_RETURN(DrainReport report, Drain(config, local_channel, peer_channel_for, tokens));
#ifndef ECHOKV_CLIENT_DRAIN_H_
#define ECHOKV_CLIENT_DRAIN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace echokv::client {

// "echokv-12" -> {"echokv", 12}. INVALID_ARGUMENT when the name has no "-<ordinal>".
absl::StatusOr<std::pair<std::string, int>> SplitOrdinal(absl::string_view pod);

// The first of j, j/2, j/4, ..., 0 below `replicas` (>= 1).
int HomeOrdinal(int j, int replicas);

// The owner ordinal a session id names for StatefulSet `statefulset`
// ("echokv-3.<hex>" -> 3), or -1 (no prefix, or another name).
int OwnerOrdinal(absl::string_view session_id, absl::string_view statefulset);

// spec.replicas of a StatefulSet as the Kubernetes API returns it (JSON).
// INVALID_ARGUMENT when it is not there or not a non-negative integer (an absent
// spec.replicas means 1 in the API, but the API server always fills it).
absl::StatusOr<int> ParseStatefulSetReplicas(absl::string_view json);

// "{pod}.h.ns.svc.cluster.local:50051" with pod -> its address; or a map entry.
// INVALID_ARGUMENT when the template has no {pod} and the map no entry.
absl::StatusOr<std::string> PeerAddress(absl::string_view peer_template,
                                        const std::map<std::string, std::string>& peer_map,
                                        absl::string_view pod);

// "echokv-0=127.0.0.1:5001,echokv-1=127.0.0.1:5002" -> map. INVALID_ARGUMENT naming
// the bad entry.
absl::StatusOr<std::map<std::string, std::string>> ParsePeerMap(absl::string_view text);

// The bearer tokens of a directory (one tenant per file, a Kubernetes Secret volume):
// every regular file not starting with '.', trailing whitespace stripped, in name
// order. INVALID_ARGUMENT for an empty file or an unreadable directory.
absl::StatusOr<std::vector<std::string>> ReadTokenDir(const std::string& dir);

// Where the Kubernetes API is and the credentials of this pod's ServiceAccount: a
// directory with `token`, `ca.crt`, `namespace` (the projected volume the chart
// mounts); `url` "" = https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
struct KubeApi {
  std::string url;        // "https://10.96.0.1:443" (tests: "http://127.0.0.1:PORT")
  std::string token;
  std::string ca_file;    // "" with http://
  std::string namespace_;
};
absl::StatusOr<KubeApi> KubeApiFromDir(const std::string& dir, const std::string& url);

// GET /apis/apps/v1/namespaces/NS/statefulsets/NAME -> spec.replicas. UNAVAILABLE when
// the API cannot be reached, PERMISSION_DENIED on 401/403 (RBAC), NOT_FOUND on 404.
absl::StatusOr<int> FetchReplicas(const KubeApi& api, const std::string& statefulset,
                                  absl::Duration timeout);

struct DrainConfig {
  std::string pod;            // this pod's name: <statefulset>-<ordinal>
  int replicas = -1;          // the StatefulSet's spec.replicas
  std::string peer;           // address template of the other pods, "{pod}" replaced
  std::map<std::string, std::string> peer_map;  // or explicit addresses (tests)
  absl::Time deadline = absl::InfiniteFuture();  // no new move after it
  absl::Duration call_timeout = absl::Seconds(60);  // unary calls (the streams have none)
  int attempts = 20;          // tries per session before it is left where it is
  bool dry_run = false;       // plan only: print the moves
};

struct DrainReport {
  bool scaled_away = false;   // ordinal >= replicas: there was something to do
  int moved = 0;
  int gone = 0;               // deleted by their client while the drain ran
  std::vector<std::string> left;  // "<id>: <why>" of sessions left on this pod
  std::vector<std::string> lines; // one per move, for the log ("<id> -> echokv-0")
};

// Makes a channel to `address` (the peers): same credentials as the local one.
using ChannelFactory = std::function<std::shared_ptr<grpc::Channel>(const std::string& address)>;

// Drains the server on `local` (this pod): for every tenant in `tokens` (one Drain per
// tenant; {""} = the server runs without authentication), each of its sessions goes to
// HomeOrdinal(its owner, replicas). Nothing happens unless the pod's ordinal is at
// or above config.replicas (a rolling update keeps the sessions on the pod's volume),
// or when config.replicas is 0 (no pod remains). Errors only for bad configuration;
// sessions that cannot move are reported in `left`.
absl::StatusOr<DrainReport> Drain(const DrainConfig& config, const std::shared_ptr<grpc::Channel>& local,
                                  const ChannelFactory& connect, const std::vector<std::string>& tokens);

}  // namespace echokv::client

#endif  // ECHOKV_CLIENT_DRAIN_H_
