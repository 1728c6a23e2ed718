// The state store on a real, small file system: a tmpfs with size= (and one with few
// inodes), mounted in a private mount namespace of this test process (invisible to the
// rest of the machine, gone when the process exits). Writes fill it until the kernel says
// ENOSPC: the write fails with RESOURCE_EXHAUSTED, the files are exactly as before, and
// the store keeps serving. A read-only file system is refused at start.
//
// Mounting needs root (CI runs as root) or unprivileged user namespaces; without either
// the tests skip with the reason (this is a separate binary so the skip does not hide the
// fault-injection tests of state_store_test, which cover the same paths with a fake).
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/snapshot.h"
#include "server/state/store.h"
#include "tests/server/state_testing.h"
#include "tests/testing/status_matchers.h"

namespace echokv::state {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::HasSubstr;
using namespace ::echokv::state::testing;  // NOLINT: test helpers

bool WriteProcFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

// Enters a private mount namespace once per process; "" on success, else why not.
std::string EnterPrivateMountNamespace() {
  static std::string result = [] {
    if (unshare(CLONE_NEWNS) != 0) {
      int err = errno;
      uid_t uid = getuid();
      gid_t gid = getgid();
      if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
        return absl::StrCat("unshare(CLONE_NEWNS): ", strerror(err),
                            "; unshare(CLONE_NEWUSER|CLONE_NEWNS): ", strerror(errno));
      }
      WriteProcFile("/proc/self/setgroups", "deny");
      if (!WriteProcFile("/proc/self/uid_map", absl::StrCat("0 ", uid, " 1")) ||
          !WriteProcFile("/proc/self/gid_map", absl::StrCat("0 ", gid, " 1"))) {
        return std::string("cannot write the user namespace's id maps");
      }
    }
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      // In a chroot "/" is not a mount point (EINVAL). Our tmpfs mounts can then only
      // leak into other namespaces through a shared mount; with none, nothing propagates.
      const int err = errno;
      std::ifstream mountinfo("/proc/self/mountinfo");
      std::string line;
      bool any_shared = false;
      while (std::getline(mountinfo, line)) any_shared = any_shared || line.find(" shared:") != std::string::npos;
      if (!mountinfo.eof() || any_shared) {
        return absl::StrCat("make / private: ", strerror(err),
                            any_shared ? " (and a shared mount would propagate ours)" : " (no /proc/self/mountinfo)");
      }
    }
    return std::string();
  }();
  return result;
}

// A tmpfs of `options` ("size=256k", ...) mounted on a fresh directory.
class SmallFs {
 public:
  explicit SmallFs(const std::string& options) {
    problem_ = EnterPrivateMountNamespace();
    if (!problem_.empty()) return;
    if (mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, options.c_str()) != 0) {
      problem_ = absl::StrCat("mount tmpfs ", options, ": ", strerror(errno));
      return;
    }
    mounted_ = true;
  }
  ~SmallFs() {
    if (mounted_) umount2(dir_.path().c_str(), MNT_DETACH);
  }
  const std::string& path() const { return dir_.path(); }
  const std::string& problem() const { return problem_; }
  bool Remount(unsigned long flags, const std::string& options) {
    return mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_REMOUNT | flags, options.c_str()) == 0;
  }

 private:
  TempDir dir_;
  std::string problem_;
  bool mounted_ = false;
};

#define SKIP_WITHOUT_MOUNT(fs)                                                     \
  if (!(fs).problem().empty()) {                                                   \
    GTEST_SKIP() << "cannot mount a small file system here: " << (fs).problem();   \
  }

TEST(StateDiskFullTest, FullDiskFailsCleanlyAndTheStoreKeepsServing) {
  for (FsyncPolicy policy : {FsyncPolicy::kAlways, FsyncPolicy::kNone}) {
    SCOPED_TRACE(FsyncPolicyName(policy));
    SmallFs fs("size=384k");
    SKIP_WITHOUT_MOUNT(fs);
    StoreOptions options = TestOptions(fs.path(), policy);
    ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
    // Sessions of ~20 KiB turns until the disk is full.
    std::vector<SavedSession> metas;
    std::vector<std::vector<TurnData>> turns;
    absl::Status full;
    int acknowledged = 0, full_creates = 0, full_appends = 0;
    for (int i = 0; i < 200 && (full_creates == 0 || full_appends == 0); ++i) {
      const bool create = metas.empty() || i % 3 == 0;
      SavedSession meta = create ? MakeMeta(TestId(200 + i), 0, 5) : metas.back();
      int64_t begin = static_cast<int64_t>(meta.tokens.size());
      ExtendMeta(&meta, 150, 5);
      TurnData turn = MakeTurn(5, begin, 150);
      auto before = TreeOf(options.dir);
      absl::Status s = store->WriteTurn(meta, turn.segment);
      if (s.ok()) {
        ++acknowledged;
        if (create) {
          metas.push_back(meta);
          turns.emplace_back();
        } else {
          metas.back() = meta;
        }
        turns.back().push_back(std::move(turn));
        continue;
      }
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, "No space left on device"));
      EXPECT_THAT(std::string(s.message()), HasSubstr(options.dir));
      EXPECT_EQ(TreeOf(options.dir), before) << "a failed write left a trace: " << s;
      full = s;
      (create ? full_creates : full_appends)++;
    }
    ASSERT_FALSE(full.ok()) << "the disk never filled";
    EXPECT_GT(acknowledged, 3);
    EXPECT_GT(full_creates + full_appends, 0);

    // Still serving: every acknowledged turn reads back.
    for (size_t s = 0; s < metas.size(); ++s) {
      ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(metas[s].id));
      ASSERT_EQ(reader->manifest().segments.size(), turns[s].size());
      ASSERT_OK_AND_ASSIGN(std::string k, reader->ReadAll(turns[s].size() - 1, "cold.k.1"));
      EXPECT_EQ(k, turns[s].back().segment.blobs[2].data);
    }
    // A snapshot import cannot fit either, and leaves nothing.
    ASSERT_OK_AND_ASSIGN(auto exporter, store->Export(metas[0].id, 1 << 20));
    std::string stream, piece;
    for (;;) {
      ASSERT_OK_AND_ASSIGN(bool more, exporter->Next(&piece));
      if (!more) break;
      stream += piece;
    }
    {
      auto before = TreeOf(options.dir);
      auto importer = store->BeginImport();
      absl::Status s = importer->Feed(stream);
      if (s.ok()) s = importer->Finish(TestId(999)).status();
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, "No space left"));
      EXPECT_EQ(TreeOf(options.dir), before);
    }
    // Deleting a session frees room; writes land again.
    ASSERT_OK(store->DeleteSession(metas[0].id));
    SavedSession meta = metas.back();
    int64_t begin = static_cast<int64_t>(meta.tokens.size());
    ExtendMeta(&meta, 20, 5);
    TurnData turn = MakeTurn(5, begin, 20);
    ASSERT_OK(store->WriteTurn(meta, turn.segment));
    // And recovery sees exactly the acknowledged state.
    store.reset();
    ASSERT_OK_AND_ASSIGN(store, StateStore::Create(options));
    RecoveryResult r = store->OpenAll();
    EXPECT_TRUE(r.errors.empty());
    EXPECT_TRUE(r.removed.empty());
    EXPECT_EQ(r.sessions.size(), metas.size() - 1);
    for (const SessionManifest& m : r.sessions) EXPECT_OK(store->OpenSession(m.meta.id).status());
  }
}

TEST(StateDiskFullTest, OutOfInodes) {
  SmallFs fs("size=4m,nr_inodes=24");
  SKIP_WITHOUT_MOUNT(fs);
  StoreOptions options = TestOptions(fs.path(), FsyncPolicy::kAlways);
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  absl::Status full;
  int created = 0;
  for (int i = 0; i < 40 && full.ok(); ++i) {
    SavedSession meta = MakeMeta(TestId(300 + i), 0);
    ExtendMeta(&meta, 2);
    auto before = TreeOf(options.dir);
    full = store->WriteTurn(meta, MakeTurn(1, 0, 2).segment);
    if (full.ok()) {
      ++created;
    } else {
      EXPECT_THAT(full, StatusIs(absl::StatusCode::kResourceExhausted, "No space left"));
      EXPECT_EQ(TreeOf(options.dir), before);
    }
  }
  EXPECT_FALSE(full.ok());
  EXPECT_GT(created, 1);
  store.reset();
  ASSERT_OK_AND_ASSIGN(store, StateStore::Create(options));
  RecoveryResult r = store->OpenAll();
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(static_cast<int>(r.sessions.size()), created);
}

TEST(StateDiskFullTest, ReadOnlyFileSystemIsRefusedAtStart) {
  SmallFs fs("size=1m");
  SKIP_WITHOUT_MOUNT(fs);
  StoreOptions options = TestOptions(fs.path());
  {
    ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
    SavedSession meta = MakeMeta(TestId(400), 0);
    ExtendMeta(&meta, 2);
    ASSERT_OK(store->WriteTurn(meta, MakeTurn(1, 0, 2).segment));
  }
  ASSERT_TRUE(fs.Remount(MS_RDONLY, "size=1m")) << strerror(errno);
  auto store = StateStore::Create(options);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kInternal, "Read-only file system"));
  EXPECT_THAT(store.status().message(), HasSubstr(options.dir));
  // A directory that does not exist yet cannot be created there either.
  StoreOptions missing = TestOptions(fs.path() + "/sub");
  EXPECT_THAT(StateStore::Create(missing), StatusIs(absl::StatusCode::kInternal, "Read-only file system"));
}

}  // namespace
}  // namespace echokv::state
