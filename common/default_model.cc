#include "common/default_model.h"

#include <limits.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/env.h"

namespace echokv {

std::vector<std::string> DefaultModelCandidates() {
  std::vector<std::string> dirs;
  // Installed layout first: a copied or packaged tree must not depend on the source
  // checkout it was built from still existing.
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    const std::string path(exe, static_cast<size_t>(n));
    const size_t slash = path.rfind('/');
    if (slash != std::string::npos) {
      dirs.push_back(absl::StrCat(path.substr(0, slash), "/../models/", kDefaultModelName));
    }
  }
#ifdef ECHOKV_SOURCE_MODELS_DIR
  dirs.push_back(absl::StrCat(ECHOKV_SOURCE_MODELS_DIR, "/", kDefaultModelName));
#endif
  return dirs;
}

absl::StatusOr<std::string> ResolveModelDir(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (std::optional<std::string> env = GetEnv("ECHOKV_MODEL")) return *env;
  const std::vector<std::string> candidates = DefaultModelCandidates();
  for (const std::string& dir : candidates) {
    if (access((dir + "/config.json").c_str(), R_OK) == 0) return dir;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--model: no model directory given, $ECHOKV_MODEL is unset, and the embedded ",
                   kDefaultModelName, " is in none of [", absl::StrJoin(candidates, ", "), "]"));
}

}  // namespace echokv
