#include "tests/server/state_testing.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace echokv::state::testing {

TempDir::TempDir(bool in_memory) {
  const char* tmp = getenv("TMPDIR");
  std::string base = tmp && *tmp ? tmp : "/tmp";
  std::error_code ec;
  if (in_memory && std::filesystem::is_directory("/dev/shm", ec)) base = "/dev/shm";
  std::string pattern = absl::StrCat(base, "/echokv-state-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

StoreOptions TestOptions(const std::string& dir, FsyncPolicy fsync) {
  StoreOptions options;
  options.dir = dir + "/state";
  options.model = kModel;
  options.fsync = fsync;
  return options;
}

std::string TestId(uint64_t n, const std::string& label) {
  std::string hex = absl::StrFormat("%016x%016x", n * 0x9e3779b97f4a7c15ull, n);
  return label.empty() ? hex : absl::StrCat(label, ".", hex);
}

std::string Bytes(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(rng() & 0xff);
  return out;
}

TurnData TurnForRange(uint64_t seed, int64_t token_begin, int64_t token_end, bool supersedes) {
  TurnData t;
  t.segment.token_begin = token_begin;
  t.segment.token_end = token_end;
  t.segment.supersedes_earlier = supersedes;
  const int64_t G = 2, d = 4;
  const int64_t m = token_end - token_begin;
  t.storage.reserve(8);  // the views below point into storage: no reallocation
  uint64_t s = seed * 1000003 + static_cast<uint64_t>(token_begin) * 101 +
               static_cast<uint64_t>(token_end) * 7 + (supersedes ? 1 : 0);
  auto add = [&](const std::string& name, DType dtype, std::vector<int64_t> shape) {
    size_t n = DTypeSize(dtype);
    for (int64_t x : shape) n *= static_cast<size_t>(x);
    t.storage.push_back(Bytes(s++, n));
    t.segment.blobs.push_back({name, dtype, shape, t.storage.back()});
  };
  for (int layer = 0; layer < 2; ++layer) {
    add(absl::StrCat("cold.k.", layer), DType::kFloat32, {G, m, d});
    add(absl::StrCat("cold.v.", layer), DType::kFloat32, {G, m, d});
  }
  add("hot.0", DType::kInt64, {G, 3});
  add("h2o.0", DType::kFloat32, {G, token_end});
  return t;
}

TurnData MakeTurn(uint64_t seed, int64_t begin, int64_t new_tokens, bool supersedes) {
  return TurnForRange(seed, supersedes ? 0 : begin, begin + new_tokens, supersedes);
}

int32_t TokenAt(uint64_t seed, int64_t i) {
  return static_cast<int32_t>((static_cast<uint64_t>(i) * 2654435761u + seed * 97) % 50000);
}

SavedSession MakeMeta(const std::string& id, int64_t tokens, uint64_t seed) {
  SavedSession m;
  m.id = id;
  m.tenant = "tenant-a";
  m.memory = MemoryMode::kTiered;
  m.compression_config = {{"policy", "echokv"}, {"budget", 64}, {"window", 8}};
  m.created = absl::FromUnixMicros(1700000000000000 + static_cast<int64_t>(seed));
  m.last_used = m.created + absl::Seconds(5);
  m.ttl = absl::Minutes(30);
  for (int64_t i = 0; i < tokens; ++i) m.tokens.push_back(TokenAt(seed, i));
  m.next_position = tokens;
  return m;
}

void ExtendMeta(SavedSession* meta, int64_t new_tokens, uint64_t seed) {
  int64_t n = static_cast<int64_t>(meta->tokens.size());
  for (int64_t i = 0; i < new_tokens; ++i) meta->tokens.push_back(TokenAt(seed, n + i));
  meta->next_position = n + new_tokens;
  meta->last_used += absl::Seconds(1);
}

std::map<std::string, std::string> TreeOf(const std::string& root) {
  std::map<std::string, std::string> tree;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::string rel = std::filesystem::relative(it->path(), root).string();
    if (it->is_directory()) {
      tree[rel + "/"] = "";
    } else {
      tree[rel] = ReadFileOrDie(it->path().string());
    }
  }
  return tree;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFileOrDie(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << bytes;
}

}  // namespace echokv::state::testing
