// Where a binary finds its model when none is named: echokv ships stories260K (a
// 260K-parameter TinyStories Llama, MIT, see models/stories260K/README.md) so the demo,
// echokv-generate and echokv-server produce real English out of the box.
//
//   ECHOKV_ASSIGN_OR_RETURN(std::string dir, echokv::ResolveModelDir(absl::GetFlag(FLAGS_model)));
//
// Search order: the flag; $ECHOKV_MODEL; <executable dir>/../models/stories260K (an
// installed tree: /opt/echokv/{bin,models}); the source tree's models/stories260K
// (compiled in, so binaries in build/bin find it).
#ifndef ECHOKV_COMMON_DEFAULT_MODEL_H_
#define ECHOKV_COMMON_DEFAULT_MODEL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace echokv {

// The directory name of the embedded model under a models/ folder.
inline constexpr char kDefaultModelName[] = "stories260K";

// Candidate directories of the embedded default model, in search order.
std::vector<std::string> DefaultModelCandidates();

// `flag_value` when non-empty; else $ECHOKV_MODEL; else the first default candidate
// that holds a config.json. InvalidArgument naming --model when there is none.
absl::StatusOr<std::string> ResolveModelDir(const std::string& flag_value);

}  // namespace echokv

#endif  // ECHOKV_COMMON_DEFAULT_MODEL_H_
