// Helpers for the state store tests: temporary directories, deterministic sessions and
// segments, and a byte-exact picture of a directory tree (to check "nothing changed").
//
//   TempDir dir;
//   StoreOptions options = TestOptions(dir.path());
//   TurnData turn = MakeTurn(/*seed=*/7, meta.tokens.size(), /*new_tokens=*/16);
//   auto before = TreeOf(dir.path());  ...  EXPECT_EQ(TreeOf(dir.path()), before);
#ifndef ECHOKV_TESTS_SERVER_STATE_TESTING_H_
#define ECHOKV_TESTS_SERVER_STATE_TESTING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "server/state/types.h"
#include "server/state/store.h"

namespace echokv::state::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  // in_memory: under /dev/shm when it exists (fsync costs nothing there; for the tests
  // that run hundreds of fault-injected writes).
  explicit TempDir(bool in_memory = false);
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline const ModelFingerprint kModel{0x0123456789abcdefull, 0xfedcba9876543210ull};
inline const ModelFingerprint kOtherModel{0x1111, 0x2222};

StoreOptions TestOptions(const std::string& dir, FsyncPolicy fsync = FsyncPolicy::kNone);

// A session id: 32 hex digits derived from n (optionally with a replica label).
std::string TestId(uint64_t n, const std::string& label = "");

// `n` deterministic bytes for `seed`.
std::string Bytes(uint64_t seed, size_t n);

// One turn's data, owning the bytes its NewSegment views point into.
struct TurnData {
  std::vector<std::string> storage;  // blob bytes
  NewSegment segment;
};
// The segment for token range [token_begin, token_end): per layer (2 layers) cold K and V
// float32 [G=2, token_end - token_begin, d=4], plus latest-wins blobs "hot.0" int64 [2, 3]
// and "h2o.0" float32 [2, token_end]. Content depends only on the arguments, so a test
// can rebuild what any segment on disk must hold from its manifest entry.
TurnData TurnForRange(uint64_t seed, int64_t token_begin, int64_t token_end, bool supersedes);
// A turn appending `new_tokens` tokens after `begin`; superseding: a full snapshot of
// [0, begin + new_tokens).
TurnData MakeTurn(uint64_t seed, int64_t begin, int64_t new_tokens, bool supersedes = false);

// Session meta for `id` with `tokens` token ids derived from seed.
SavedSession MakeMeta(const std::string& id, int64_t tokens, uint64_t seed = 1);
// Token i of a history made by MakeMeta / ExtendMeta.
int32_t TokenAt(uint64_t seed, int64_t i);
void ExtendMeta(SavedSession* meta, int64_t new_tokens, uint64_t seed = 1);

// Every file (path -> bytes) and directory (path + "/" -> "") under root, relative paths.
std::map<std::string, std::string> TreeOf(const std::string& root);

// Reads / writes a whole file (test-side, plain stdio).
std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, const std::string& bytes);

}  // namespace echokv::state::testing

#endif  // ECHOKV_TESTS_SERVER_STATE_TESTING_H_
