#include "common/default_model.h"

#include <limits.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/env.h"

namespace echokv {

namespace {
std::string ExeDir();
}  // namespace

std::vector<std::string> DefaultModelCandidates() {
  std::vector<std::string> dirs;
  // Installed layout first: a copied or packaged tree must not depend on the source
  // checkout it was built from still existing.
  if (const std::string exe = ExeDir(); !exe.empty()) {
    dirs.push_back(absl::StrCat(exe, "/../models/", kDefaultModelName));
  }
#ifdef ECHOKV_SOURCE_MODELS_DIR
  dirs.push_back(absl::StrCat(ECHOKV_SOURCE_MODELS_DIR, "/", kDefaultModelName));
#endif
  return dirs;
}

namespace {
std::string ExeDir() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  const std::string path(exe, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}
}  // namespace

std::vector<std::string> ModelsFolders() {
  std::vector<std::string> dirs;
  if (std::optional<std::string> env = GetEnv("ECHOKV_MODELS")) return {*env};  // the operator's folder only
  if (const std::string exe = ExeDir(); !exe.empty()) dirs.push_back(exe + "/../models");
#ifdef ECHOKV_SOURCE_CACHE_MODELS_DIR
  dirs.push_back(ECHOKV_SOURCE_CACHE_MODELS_DIR);
#endif
  return dirs;
}

std::optional<std::string> FindDefaultGguf() {
  for (const std::string& dir : ModelsFolders()) {
    const std::string path = absl::StrCat(dir, "/", kDefaultGgufName);
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ResolveModelDir(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (std::optional<std::string> env = GetEnv("ECHOKV_MODEL")) return *env;
  if (std::optional<std::string> gguf = FindDefaultGguf()) return *gguf;
  const std::vector<std::string> candidates = DefaultModelCandidates();
  for (const std::string& dir : candidates) {
    if (access((dir + "/config.json").c_str(), R_OK) == 0) return dir;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--model: no model directory given, $ECHOKV_MODEL is unset, and the embedded ",
                   kDefaultModelName, " is in none of [", absl::StrJoin(candidates, ", "), "]"));
}

}  // namespace echokv
