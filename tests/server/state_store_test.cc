// The state store on a real directory: round trips, compaction, recovery of every
// corruption kind (the other sessions still load, the bad one stays untouched), orphan
// cleanup, the directory lock, and a failed write at every failure point leaving the
// files exactly as before.
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/file_ops.h"
#include "server/state/format.h"
#include "server/state/store.h"
#include "tests/server/state_testing.h"
#include "tests/testing/status_matchers.h"

namespace echokv::state {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace ::echokv::state::testing;  // NOLINT: test helpers

namespace fs = std::filesystem;

class CountingObserver : public StateObserver {
 public:
  void OnWrite(const WriteStats& stats) override { writes.push_back(stats); }
  void OnStateError(ErrorKind kind) override { errors.push_back(kind); }
  void OnCleanupFailed(const absl::Status& status) override { cleanup_failures.push_back(status); }
  std::vector<WriteStats> writes;
  std::vector<ErrorKind> errors;
  std::vector<absl::Status> cleanup_failures;
};

// A session grown turn by turn, with what each turn wrote (the oracle for read-backs).
struct Grown {
  SavedSession meta;
  std::vector<TurnData> turns;  // still referenced: index = segment in the manifest
};

// Writes `sizes.size()` turns to a new session `id` (the first creates it).
Grown Grow(StateStore* store, const std::string& id, const std::vector<int64_t>& sizes,
           uint64_t seed = 1) {
  Grown g;
  g.meta = MakeMeta(id, 0, seed);
  for (int64_t n : sizes) {
    int64_t begin = static_cast<int64_t>(g.meta.tokens.size());
    ExtendMeta(&g.meta, n, seed);
    g.turns.push_back(MakeTurn(seed, begin, n));
    absl::Status s = store->WriteTurn(g.meta, g.turns.back().segment);
    EXPECT_OK(s);
  }
  return g;
}

std::string SessionPath(const StoreOptions& o, const std::string& id) {
  return o.dir + "/sessions/" + id;
}

void ExpectBlobsEqual(const SessionReader& reader, size_t segment, const NewSegment& want) {
  const SegmentInfo& seg = reader.manifest().segments[segment];
  ASSERT_EQ(seg.blobs.size(), want.blobs.size());
  for (size_t b = 0; b < want.blobs.size(); ++b) {
    EXPECT_EQ(seg.blobs[b].name, want.blobs[b].name);
    EXPECT_EQ(seg.blobs[b].dtype, want.blobs[b].dtype);
    EXPECT_EQ(seg.blobs[b].shape, want.blobs[b].shape);
    ASSERT_OK_AND_ASSIGN(std::string bytes, reader.ReadAll(segment, want.blobs[b].name));
    EXPECT_EQ(bytes, want.blobs[b].data) << want.blobs[b].name;
  }
}

// ---------------- round trips ----------------

TEST(StateStoreTest, TurnsRoundTripThroughARestart) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path(), FsyncPolicy::kAlways);
  const std::string id = TestId(1, "echokv-0");
  Grown g;
  {
    ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
    EXPECT_TRUE(store->OpenAll().sessions.empty());
    g = Grown(Grow(store.get(), id, {5, 3, 8}));
    EXPECT_THAT(store->SessionIds(), ElementsAre(id));
    ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(id));
    ASSERT_EQ(reader->manifest().segments.size(), 3u);
    for (size_t i = 0; i < 3; ++i) ExpectBlobsEqual(*reader, i, g.turns[i].segment);
  }
  EXPECT_TRUE(fs::exists(options.dir + "/FORMAT"));
  EXPECT_TRUE(fs::exists(SessionPath(options, id) + "/manifest"));
  for (int s = 1; s <= 3; ++s) EXPECT_TRUE(fs::exists(SessionPath(options, id) + "/seg-" + std::to_string(s) + ".ekv"));

  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  RecoveryResult r = store->OpenAll();
  EXPECT_TRUE(r.errors.empty());
  EXPECT_TRUE(r.removed.empty());
  ASSERT_EQ(r.sessions.size(), 1u);
  const SessionManifest& m = r.sessions[0];
  EXPECT_EQ(m.meta.id, id);
  EXPECT_EQ(m.meta.tokens, g.meta.tokens);
  EXPECT_EQ(m.meta.tenant, g.meta.tenant);
  EXPECT_EQ(m.meta.compression_config, g.meta.compression_config);
  EXPECT_EQ(m.meta.created, g.meta.created);
  EXPECT_EQ(m.meta.last_used, g.meta.last_used);
  EXPECT_EQ(m.meta.ttl, g.meta.ttl);
  EXPECT_EQ(m.meta.next_position, 16);
  EXPECT_EQ(m.model, kModel);
  ASSERT_EQ(m.segments.size(), 3u);
  EXPECT_EQ(m.segments[1].token_begin, 5);
  EXPECT_EQ(m.segments[1].token_end, 8);
  EXPECT_EQ(m.segments[2].blobs.size(), 6u);  // blob tables come from the headers
  EXPECT_EQ(m.segments[2].file_bytes, fs::file_size(SessionPath(options, id) + "/seg-3.ekv"));

  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(id));
  for (size_t i = 0; i < 3; ++i) ExpectBlobsEqual(*reader, i, g.turns[i].segment);

  // Byte ranges read back without the rest of the blob.
  const std::string& whole = g.turns[2].storage[0];
  std::string part(13, '\0');
  ASSERT_OK(reader->Read(2, "cold.k.0", 7, absl::MakeSpan(part)));
  EXPECT_EQ(part, whole.substr(7, 13));
  std::string tail(5, '\0');
  ASSERT_OK(reader->Read(2, "cold.k.0", whole.size() - 5, absl::MakeSpan(tail)));
  EXPECT_EQ(tail, whole.substr(whole.size() - 5));
  EXPECT_THAT(reader->Read(2, "cold.k.0", whole.size() - 4, absl::MakeSpan(tail)),
              StatusIs(absl::StatusCode::kOutOfRange, "cold.k.0"));
  EXPECT_THAT(reader->Read(2, "nope", 0, absl::MakeSpan(tail)), StatusIs(absl::StatusCode::kNotFound, "nope"));
  EXPECT_THAT(reader->Read(3, "cold.k.0", 0, absl::MakeSpan(tail)), StatusIs(absl::StatusCode::kNotFound, "segment"));

  // Latest-wins and per-turn lookups.
  ASSERT_OK_AND_ASSIGN(auto latest, reader->FindLatest("h2o.0"));
  EXPECT_EQ(latest.segment, 2u);
  EXPECT_EQ(latest.blob->shape, (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(reader->FindAll("cold.v.1").size(), 3u);
  EXPECT_THAT(reader->FindLatest("hot.9"), StatusIs(absl::StatusCode::kNotFound, "hot.9"));

  // Appending continues after the restart.
  int64_t begin = static_cast<int64_t>(g.meta.tokens.size());
  ExtendMeta(&g.meta, 4);
  TurnData t4 = MakeTurn(1, begin, 4);
  ASSERT_OK(store->WriteTurn(g.meta, t4.segment));
  ASSERT_OK_AND_ASSIGN(auto reader2, store->OpenSession(id));
  ASSERT_EQ(reader2->manifest().segments.size(), 4u);
  EXPECT_EQ(reader2->manifest().segments[3].seq, 4u);
  ExpectBlobsEqual(*reader2, 3, t4.segment);
}

TEST(StateStoreTest, SupersedingSegmentRemovesEarlierFiles) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path(), FsyncPolicy::kAlways);
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  const std::string id = TestId(2);
  Grown g = Grow(store.get(), id, {4, 4, 4});
  // A reader opened before the compaction keeps reading the old files.
  ASSERT_OK_AND_ASSIGN(auto old_reader, store->OpenSession(id));

  ExtendMeta(&g.meta, 2);
  TurnData full = MakeTurn(9, 12, 2, /*supersedes=*/true);
  ASSERT_EQ(full.segment.token_begin, 0);
  ASSERT_OK(store->WriteTurn(g.meta, full.segment));
  const std::string sdir = SessionPath(options, id);
  EXPECT_FALSE(fs::exists(sdir + "/seg-1.ekv"));
  EXPECT_FALSE(fs::exists(sdir + "/seg-3.ekv"));
  EXPECT_TRUE(fs::exists(sdir + "/seg-4.ekv"));
  ExpectBlobsEqual(*old_reader, 1, g.turns[1].segment);

  // An evict-mode style superseding turn that keeps its own token range.
  ExtendMeta(&g.meta, 3);
  TurnData evict = MakeTurn(10, 14, 3);
  evict.segment.supersedes_earlier = true;
  ASSERT_OK(store->WriteTurn(g.meta, evict.segment));
  EXPECT_FALSE(fs::exists(sdir + "/seg-4.ekv"));

  // A reader must not outlive its store (store.h): it closes its files through the
  // store's FileOps (the sanitized build caught this test doing it the other way round).
  old_reader.reset();
  store.reset();
  ASSERT_OK_AND_ASSIGN(store, StateStore::Create(options));
  RecoveryResult r = store->OpenAll();
  ASSERT_TRUE(r.errors.empty());
  ASSERT_EQ(r.sessions.size(), 1u);
  ASSERT_EQ(r.sessions[0].segments.size(), 1u);
  EXPECT_EQ(r.sessions[0].segments[0].seq, 5u);
  EXPECT_EQ(r.sessions[0].segments[0].token_begin, 14);
  EXPECT_TRUE(r.sessions[0].segments[0].supersedes_earlier);
  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(id));
  ExpectBlobsEqual(*reader, 0, evict.segment);
}

TEST(StateStoreTest, UpdateAndDelete) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  CountingObserver observer;
  options.observer = &observer;
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  const std::string a = TestId(3), b = TestId(4);
  Grown ga = Grow(store.get(), a, {3});
  Grown gb = Grow(store.get(), b, {3, 1});

  ga.meta.last_used += absl::Hours(1);
  ga.meta.ttl = absl::InfiniteDuration();
  ASSERT_OK(store->UpdateSession(ga.meta));
  SavedSession grown = ga.meta;
  ExtendMeta(&grown, 1);
  EXPECT_THAT(store->UpdateSession(grown), StatusIs(absl::StatusCode::kInvalidArgument, "token history"));
  SavedSession unknown = MakeMeta(TestId(99), 0);
  EXPECT_THAT(store->UpdateSession(unknown), StatusIs(absl::StatusCode::kNotFound, TestId(99)));

  ASSERT_OK(store->DeleteSession(b));
  EXPECT_FALSE(fs::exists(SessionPath(options, b)));
  EXPECT_THAT(store->DeleteSession(b), StatusIs(absl::StatusCode::kNotFound, b));
  EXPECT_THAT(store->OpenSession(b), StatusIs(absl::StatusCode::kNotFound, b));
  EXPECT_THAT(store->SessionIds(), ElementsAre(a));
  // Nothing but the live session is left under sessions/.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(options.dir + "/sessions")) left.push_back(e.path().filename());
  EXPECT_THAT(left, ElementsAre(a));
  // The id can be used again.
  Grown again = Grow(store.get(), b, {2});
  EXPECT_TRUE(store->Contains(b));

  store.reset();
  ASSERT_OK_AND_ASSIGN(store, StateStore::Create(options));
  RecoveryResult r = store->OpenAll();
  ASSERT_EQ(r.sessions.size(), 2u);
  EXPECT_EQ(r.sessions[0].meta.id < r.sessions[1].meta.id, true);
  const SessionManifest& ma = r.sessions[0].meta.id == a ? r.sessions[0] : r.sessions[1];
  EXPECT_EQ(ma.meta.last_used, ga.meta.last_used);
  EXPECT_EQ(ma.meta.ttl, absl::InfiniteDuration());

  // Observer: every write reported with its result and size.
  int turns = 0, updates = 0, deletes = 0, failed = 0;
  for (const WriteStats& w : observer.writes) {
    turns += w.op == WriteOp::kTurn;
    updates += w.op == WriteOp::kUpdate;
    deletes += w.op == WriteOp::kDelete;
    failed += w.code != absl::StatusCode::kOk;
    if (w.op == WriteOp::kTurn && w.code == absl::StatusCode::kOk) {
      EXPECT_GT(w.bytes, 128u);
    }
    EXPECT_GE(w.duration, absl::ZeroDuration());
  }
  EXPECT_EQ(turns, 4);
  EXPECT_EQ(updates, 3);
  EXPECT_EQ(deletes, 2);
  EXPECT_EQ(failed, 3);
}

TEST(StateStoreTest, BadInputIsRefusedAndWritesNothing) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  const std::string id = TestId(5);
  Grown g = Grow(store.get(), id, {4});
  auto before = TreeOf(options.dir);

  SavedSession next = g.meta;
  ExtendMeta(&next, 3);
  TurnData gap = MakeTurn(1, 5, 2);  // begins at 5, the session ends at 4
  EXPECT_THAT(store->WriteTurn(next, gap.segment), StatusIs(absl::StatusCode::kInvalidArgument, "token_begin"));
  TurnData short_end = MakeTurn(1, 4, 2);  // ends at 6, tokens has 7
  EXPECT_THAT(store->WriteTurn(next, short_end.segment), StatusIs(absl::StatusCode::kInvalidArgument, "tokens.size()"));
  TurnData wrong_size = MakeTurn(1, 4, 3);
  wrong_size.segment.blobs[0].data = wrong_size.segment.blobs[0].data.substr(1);
  EXPECT_THAT(store->WriteTurn(next, wrong_size.segment), StatusIs(absl::StatusCode::kInvalidArgument, "cold.k.0"));
  TurnData dup = MakeTurn(1, 4, 3);
  dup.segment.blobs[1].name = "cold.k.0";
  EXPECT_THAT(store->WriteTurn(next, dup.segment), StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
  SavedSession bad_id = next;
  bad_id.id = "../" + id;
  EXPECT_THAT(store->WriteTurn(bad_id, MakeTurn(1, 4, 3).segment), StatusIs(absl::StatusCode::kInvalidArgument, "id"));
  SavedSession non_utf8 = next;
  non_utf8.tenant = "\xc3";
  EXPECT_THAT(store->WriteTurn(non_utf8, MakeTurn(1, 4, 3).segment), StatusIs(absl::StatusCode::kInvalidArgument, "JSON"));
  // A new session must start at token 0 unless its segment supersedes.
  SavedSession fresh = MakeMeta(TestId(6), 0);
  ExtendMeta(&fresh, 3);
  TurnData late = MakeTurn(1, 0, 3);
  late.segment.token_begin = 1;
  EXPECT_THAT(store->WriteTurn(fresh, late.segment), StatusIs(absl::StatusCode::kInvalidArgument, "token_begin"));
  EXPECT_FALSE(store->Contains(TestId(6)));

  EXPECT_EQ(TreeOf(options.dir), before);
  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(id));
  EXPECT_EQ(reader->manifest().segments.size(), 1u);
}

TEST(StateStoreTest, NeverWritesWhatRecoveryWouldRefuse) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  options.limits.max_manifest_json_bytes = 1000;
  options.limits.max_blob_table_bytes = 200;
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  SavedSession meta = MakeMeta(TestId(8), 0);
  ExtendMeta(&meta, 2);
  EXPECT_THAT(store->WriteTurn(meta, MakeTurn(1, 0, 2).segment),
              StatusIs(absl::StatusCode::kInvalidArgument, "blob table"));
  options.limits.max_blob_table_bytes = 1 << 20;
  store.reset();
  ASSERT_OK_AND_ASSIGN(store, StateStore::Create(options));
  meta.compression_config["big"] = std::string(2000, 'x');
  EXPECT_THAT(store->WriteTurn(meta, MakeTurn(1, 0, 2).segment),
              StatusIs(absl::StatusCode::kInvalidArgument, "manifest JSON"));
  meta.compression_config.erase("big");
  ASSERT_OK(store->WriteTurn(meta, MakeTurn(1, 0, 2).segment));
  meta.compression_config["big"] = std::string(2000, 'x');
  EXPECT_THAT(store->UpdateSession(meta), StatusIs(absl::StatusCode::kInvalidArgument, "manifest JSON"));
  EXPECT_TRUE(store->OpenAll().errors.empty());
}

TEST(StateStoreTest, SegmentLimitAsksForCompaction) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  options.limits.max_segments = 2;
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  Grown g = Grow(store.get(), TestId(7), {1, 1});
  ExtendMeta(&g.meta, 1);
  EXPECT_THAT(store->WriteTurn(g.meta, MakeTurn(1, 2, 1).segment),
              StatusIs(absl::StatusCode::kFailedPrecondition, "supersedes"));
  EXPECT_OK(store->WriteTurn(g.meta, MakeTurn(1, 2, 1, /*supersedes=*/true).segment));
}

TEST(StateStoreTest, SessionsWriteInParallel) {
  TempDir dir(/*in_memory=*/true);
  StoreOptions options = TestOptions(dir.path(), FsyncPolicy::kAlways);
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  constexpr int kThreads = 4, kTurns = 25;
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      SavedSession meta = MakeMeta(TestId(70 + t), 0, t);
      for (int i = 0; i < kTurns && results[t].ok(); ++i) {
        int64_t begin = static_cast<int64_t>(meta.tokens.size());
        ExtendMeta(&meta, 3, t);
        TurnData turn = MakeTurn(t, begin, 3, /*supersedes=*/i % 10 == 9);
        results[t] = store->WriteTurn(meta, turn.segment);
        // Readers of the same and other sessions run meanwhile.
        if (results[t].ok()) results[t] = store->OpenSession(TestId(70 + (t + i) % kThreads)).status();
        if (absl::IsNotFound(results[t])) results[t] = absl::OkStatus();  // not created yet
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const absl::Status& s : results) EXPECT_OK(s);
  store.reset();
  ASSERT_OK_AND_ASSIGN(store, StateStore::Create(options));
  RecoveryResult r = store->OpenAll();
  EXPECT_TRUE(r.errors.empty());
  ASSERT_EQ(r.sessions.size(), static_cast<size_t>(kThreads));
  for (const SessionManifest& m : r.sessions) {
    EXPECT_EQ(m.meta.tokens.size(), 3u * kTurns);
    EXPECT_EQ(m.segments.size(), 6u);  // turn 19 superseded, turns 20..24 appended
    ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(m.meta.id));
  }
}

// ---------------- the directory ----------------

TEST(StateStoreTest, OneStorePerDirectory) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  EXPECT_THAT(StateStore::Create(options), StatusIs(absl::StatusCode::kFailedPrecondition, "in use"));
  store.reset();
  EXPECT_OK(StateStore::Create(options).status());
}

TEST(StateStoreTest, RefusesUnknownLayoutAndUnusableDirectories) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  { ASSERT_OK(StateStore::Create(options).status()); }
  EXPECT_EQ(ReadFileOrDie(options.dir + "/FORMAT"), "{\"format\":\"echokv-state\",\"version\":1}\n");
  WriteFileOrDie(options.dir + "/FORMAT", "{\"format\":\"echokv-state\",\"version\":7}\n");
  EXPECT_THAT(StateStore::Create(options), StatusIs(absl::StatusCode::kFailedPrecondition, "layout version 7"));
  WriteFileOrDie(options.dir + "/FORMAT", "hello");
  EXPECT_THAT(StateStore::Create(options), StatusIs(absl::StatusCode::kFailedPrecondition, "FORMAT"));
  WriteFileOrDie(options.dir + "/FORMAT", std::string(5000, ' '));  // too big to be ours
  EXPECT_THAT(StateStore::Create(options), StatusIs(absl::StatusCode::kFailedPrecondition, "over the limit"));
  EXPECT_EQ(ReadFileOrDie(options.dir + "/FORMAT"), std::string(5000, ' '));  // never overwritten

  // A path below a regular file: every error names the directory and the cause.
  WriteFileOrDie(dir.path() + "/file", "x");
  StoreOptions under_file = TestOptions(dir.path() + "/file");
  EXPECT_THAT(StateStore::Create(under_file), StatusIs(absl::StatusCode::kInternal, "Not a directory"));
  StoreOptions empty;
  EXPECT_THAT(StateStore::Create(empty), StatusIs(absl::StatusCode::kInvalidArgument, "dir"));

  // The write probe: a failing create under sessions/ is reported at start.
  PosixFileOps posix;
  FaultInjectingFileOps faults(&posix);
  StoreOptions probe = TestOptions(dir.path() + "/p");
  probe.file_ops = &faults;
  { ASSERT_OK(StateStore::Create(probe).status()); }
  faults.FailAt(FileOp::kOpenWrite, 2, EROFS);  // 1: LOCK, 2: the probe
  EXPECT_THAT(StateStore::Create(probe), StatusIs(absl::StatusCode::kInternal, "not writable"));
  faults.FailAt(FileOp::kOpenWrite, 2, ENOSPC);
  EXPECT_THAT(StateStore::Create(probe), StatusIs(absl::StatusCode::kResourceExhausted, "No space left"));
}

// ---------------- recovery ----------------

// Three sessions; the middle one gets damaged by the test.
struct ThreeSessions {
  std::string good1 = TestId(11), victim = TestId(12, "replica-1"), good2 = TestId(13);
};

void WriteThree(const StoreOptions& options, const ThreeSessions& ids) {
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  Grow(store.get(), ids.good1, {3, 2});
  Grow(store.get(), ids.victim, {4, 2, 5}, /*seed=*/7);
  Grow(store.get(), ids.good2, {1});
}

void FlipByte(const std::string& path, int64_t offset) {
  std::string bytes = ReadFileOrDie(path);
  size_t at = offset >= 0 ? static_cast<size_t>(offset) : bytes.size() + offset;
  bytes.at(at) ^= 0x04;
  WriteFileOrDie(path, bytes);
}

void Truncate(const std::string& path, int64_t keep) {
  std::string bytes = ReadFileOrDie(path);
  size_t n = keep >= 0 ? static_cast<size_t>(keep) : bytes.size() + keep;
  fs::resize_file(path, n);
}

struct Damage {
  std::string name;
  std::function<void(const std::string& session_dir, const StoreOptions&)> apply;
  ErrorKind kind;
  std::string file;  // the file the error names
};

TEST(StateStoreTest, EveryCorruptionIsReportedAndTheRestLoads) {
  const std::vector<Damage> damages = {
      {"segment header byte", [](const std::string& d, auto&) { FlipByte(d + "/seg-2.ekv", 40); },
       ErrorKind::kChecksum, "seg-2.ekv"},
      {"segment header checksum", [](const std::string& d, auto&) { FlipByte(d + "/seg-2.ekv", 121); },
       ErrorKind::kChecksum, "seg-2.ekv"},
      {"blob table byte", [](const std::string& d, auto&) { FlipByte(d + "/seg-1.ekv", 131); },
       ErrorKind::kChecksum, "seg-1.ekv"},
      {"segment magic", [](const std::string& d, auto&) { FlipByte(d + "/seg-3.ekv", 0); },
       ErrorKind::kChecksum, "seg-3.ekv"},
      {"manifest body byte", [](const std::string& d, auto&) { FlipByte(d + "/manifest", 70); },
       ErrorKind::kChecksum, "manifest"},
      {"manifest token byte", [](const std::string& d, auto&) { FlipByte(d + "/manifest", -9); },
       ErrorKind::kChecksum, "manifest"},
      {"manifest header byte", [](const std::string& d, auto&) { FlipByte(d + "/manifest", 33); },
       ErrorKind::kChecksum, "manifest"},
      {"segment truncated in payload", [](const std::string& d, auto&) { Truncate(d + "/seg-3.ekv", -1); },
       ErrorKind::kTruncated, "seg-3.ekv"},
      {"segment truncated in header", [](const std::string& d, auto&) { Truncate(d + "/seg-1.ekv", 50); },
       ErrorKind::kTruncated, "seg-1.ekv"},
      {"segment empty", [](const std::string& d, auto&) { Truncate(d + "/seg-1.ekv", 0); },
       ErrorKind::kTruncated, "seg-1.ekv"},
      {"manifest truncated", [](const std::string& d, auto&) { Truncate(d + "/manifest", -3); },
       ErrorKind::kTruncated, "manifest"},
      {"segment grown", [](const std::string& d, auto&) {
         WriteFileOrDie(d + "/seg-2.ekv", ReadFileOrDie(d + "/seg-2.ekv") + "x"); },
       ErrorKind::kChecksum, "seg-2.ekv"},
      {"manifest version",
       [](const std::string& d, auto&) {
         std::string b = ReadFileOrDie(d + "/manifest");
         b[8] = 2;
         WriteFileOrDie(d + "/manifest", b);
       },
       ErrorKind::kUnknownVersion, "manifest"},
      {"segment version",
       [](const std::string& d, auto&) {
         std::string b = ReadFileOrDie(d + "/seg-2.ekv");
         b[8] = 9;
         WriteFileOrDie(d + "/seg-2.ekv", b);
       },
       ErrorKind::kUnknownVersion, "seg-2.ekv"},
      {"missing segment", [](const std::string& d, auto&) { fs::remove(d + "/seg-2.ekv"); },
       ErrorKind::kMissingSegment, "seg-2.ekv"},
      {"missing manifest", [](const std::string& d, auto&) { fs::remove(d + "/manifest"); },
       ErrorKind::kBadManifest, "manifest"},
      {"segment of another session",
       [](const std::string& d, const StoreOptions& o) {
         fs::copy_file(SessionPath(o, TestId(11)) + "/seg-1.ekv", d + "/seg-1.ekv",
                       fs::copy_options::overwrite_existing);
       },
       ErrorKind::kChecksum, "seg-1.ekv"},
      {"manifest of another session",
       [](const std::string& d, const StoreOptions& o) {
         fs::copy_file(SessionPath(o, TestId(11)) + "/manifest", d + "/manifest",
                       fs::copy_options::overwrite_existing);
       },
       ErrorKind::kBadManifest, "manifest"},
      {"foreign model",
       [](const std::string& d, const StoreOptions& o) {
         // The same session written by a server with another model.
         TempDir other;
         StoreOptions oo = TestOptions(other.path());
         oo.model = kOtherModel;
         auto store = StateStore::Create(oo);
         ASSERT_OK(store.status());
         Grow(store->get(), TestId(12, "replica-1"), {4, 2, 5}, 7);
         fs::remove_all(d);
         fs::copy(SessionPath(oo, TestId(12, "replica-1")), d);
       },
       ErrorKind::kForeignModel, "manifest"},
      {"foreign segment",
       [](const std::string& d, const StoreOptions& o) {
         // Only the header's fingerprint differs (checksum recomputed): a segment from
         // another model's session.
         std::string b = ReadFileOrDie(d + "/seg-3.ekv");
         b[16] ^= 1;
         std::string sum;
         internal::PutU64(&sum, internal::Xxh3(absl::string_view(b).substr(0, 120)));
         b.replace(120, 8, sum);
         WriteFileOrDie(d + "/seg-3.ekv", b);
       },
       ErrorKind::kForeignModel, "seg-3.ekv"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    TempDir dir;
    StoreOptions options = TestOptions(dir.path());
    ThreeSessions ids;
    WriteThree(options, ids);
    const std::string victim_dir = SessionPath(options, ids.victim);
    damage.apply(victim_dir, options);
    auto before = TreeOf(victim_dir);

    CountingObserver observer;
    options.observer = &observer;
    ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
    RecoveryResult r = store->OpenAll();
    ASSERT_EQ(r.errors.size(), 1u);
    const StateError& e = r.errors[0];
    EXPECT_EQ(e.kind, damage.kind) << e.status;
    EXPECT_EQ(ErrorKindOf(e.status), damage.kind);
    EXPECT_EQ(e.session_id, ids.victim);
    EXPECT_EQ(e.path, victim_dir + "/" + damage.file);
    EXPECT_THAT(std::string(e.status.message()), HasSubstr(damage.file));
    EXPECT_THAT(observer.errors, ElementsAre(damage.kind));
    ASSERT_EQ(r.sessions.size(), 2u);
    EXPECT_THAT((std::vector<std::string>{r.sessions[0].meta.id, r.sessions[1].meta.id}),
                ::testing::UnorderedElementsAre(ids.good1, ids.good2));
    EXPECT_LT(r.sessions[0].meta.id, r.sessions[1].meta.id);  // by id
    EXPECT_TRUE(r.removed.empty());
    EXPECT_EQ(TreeOf(victim_dir), before) << "a refused session must stay untouched";
    // The store does not know it: no writes land on it, its id cannot be reused.
    EXPECT_FALSE(store->Contains(ids.victim));
    EXPECT_THAT(store->OpenSession(ids.victim), StatusIs(absl::StatusCode::kNotFound, ids.victim));
    SavedSession reuse = MakeMeta(ids.victim, 0);
    ExtendMeta(&reuse, 2);
    EXPECT_THAT(store->WriteTurn(reuse, MakeTurn(1, 0, 2).segment),
                StatusIs(absl::StatusCode::kAlreadyExists, ids.victim));
    EXPECT_EQ(TreeOf(victim_dir), before);
    ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(ids.good1));
    EXPECT_EQ(reader->manifest().segments.size(), 2u);
  }
}

TEST(StateStoreTest, PayloadCorruptionIsFoundWhenTheSessionIsOpened) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  ThreeSessions ids;
  WriteThree(options, ids);
  const std::string victim_dir = SessionPath(options, ids.victim);
  FlipByte(victim_dir + "/seg-2.ekv", -20);
  auto before = TreeOf(victim_dir);

  CountingObserver observer;
  options.observer = &observer;
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  RecoveryResult r = store->OpenAll();  // headers only: the payload is not read here
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.sessions.size(), 3u);
  auto reader = store->OpenSession(ids.victim);
  EXPECT_THAT(reader, StatusIs(absl::StatusCode::kDataLoss, "seg-2.ekv: payload checksum mismatch"));
  EXPECT_EQ(ErrorKindOf(reader.status()), ErrorKind::kChecksum);
  EXPECT_THAT(observer.errors, ElementsAre(ErrorKind::kChecksum));
  // Refused from now on: no reads, no writes, no export; files untouched.
  EXPECT_THAT(store->OpenSession(ids.victim), StatusIs(absl::StatusCode::kFailedPrecondition, "verification"));
  SavedSession next = MakeMeta(ids.victim, 11, 7);
  ExtendMeta(&next, 1, 7);
  EXPECT_THAT(store->WriteTurn(next, MakeTurn(7, 11, 1).segment),
              StatusIs(absl::StatusCode::kFailedPrecondition, "verification"));
  EXPECT_EQ(TreeOf(victim_dir), before);
  // Deleting it is allowed (an explicit request).
  EXPECT_OK(store->DeleteSession(ids.victim));
  // The others verify and read.
  EXPECT_OK(store->OpenSession(ids.good1).status());
  EXPECT_OK(store->OpenSession(ids.good2).status());
}

TEST(StateStoreTest, ReadErrorsAreIoKind) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  ThreeSessions ids;
  WriteThree(options, ids);
  PosixFileOps posix;
  FaultInjectingFileOps faults(&posix);
  options.file_ops = &faults;
  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  faults.FailAt(FileOp::kPread, 1, EIO);  // the manifest of the first session by name
  RecoveryResult r = store->OpenAll();
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].kind, ErrorKind::kIo);
  EXPECT_EQ(r.errors[0].session_id, std::min({ids.good1, ids.good2, ids.victim}));
  ASSERT_NE(r.errors[0].session_id, ids.victim);
  EXPECT_THAT(r.errors[0].status, StatusIs(absl::StatusCode::kInternal, "Input/output error"));
  EXPECT_EQ(r.sessions.size(), 2u);
  // An I/O error while verifying does not mark the session bad: a retry can succeed.
  faults.FailAt(FileOp::kPread, 2, EIO);
  EXPECT_THAT(store->OpenSession(ids.victim), StatusIs(absl::StatusCode::kInternal, "read"));
  EXPECT_OK(store->OpenSession(ids.victim).status());
}

TEST(StateStoreTest, LeftoversOfUnacknowledgedWorkAreRemoved) {
  TempDir dir;
  StoreOptions options = TestOptions(dir.path());
  ThreeSessions ids;
  WriteThree(options, ids);
  const std::string sessions = options.dir + "/sessions";
  const std::string victim_dir = SessionPath(options, ids.victim);
  // A crash after writing seg-4 and manifest.tmp but before the rename; a stale
  // manifest.prev; a create and an import that never committed; a delete that crashed
  // after its rename; things that are not ours.
  WriteFileOrDie(victim_dir + "/seg-4.ekv", "half a segment");
  WriteFileOrDie(victim_dir + "/seg-17.ekv", "");
  WriteFileOrDie(victim_dir + "/manifest.tmp", "half a manifest");
  fs::copy_file(victim_dir + "/manifest", victim_dir + "/manifest.prev");
  WriteFileOrDie(victim_dir + "/notes.txt", "an operator's file");
  fs::create_directory(sessions + "/.tmp-" + TestId(20) + "-1-2-3");
  WriteFileOrDie(sessions + "/.tmp-" + TestId(20) + "-1-2-3/seg-1.ekv", "x");
  fs::create_directory(sessions + "/.del-" + TestId(21) + "-1-2-3");
  WriteFileOrDie(sessions + "/.del-" + TestId(21) + "-1-2-3/manifest", "x");
  fs::create_directory(sessions + "/lost+found");
  WriteFileOrDie(sessions + "/README", "not a session");

  ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
  RecoveryResult r = store->OpenAll();
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.sessions.size(), 3u);
  EXPECT_EQ(r.removed.size(), 6u);
  EXPECT_THAT(r.ignored, ElementsAre(sessions + "/README", sessions + "/lost+found"));
  EXPECT_FALSE(fs::exists(victim_dir + "/seg-4.ekv"));
  EXPECT_FALSE(fs::exists(victim_dir + "/seg-17.ekv"));
  EXPECT_FALSE(fs::exists(victim_dir + "/manifest.tmp"));
  EXPECT_FALSE(fs::exists(victim_dir + "/manifest.prev"));
  EXPECT_TRUE(fs::exists(victim_dir + "/notes.txt"));
  EXPECT_TRUE(fs::exists(sessions + "/lost+found"));
  EXPECT_TRUE(fs::exists(sessions + "/README"));
  EXPECT_FALSE(fs::exists(sessions + "/.tmp-" + TestId(20) + "-1-2-3"));
  EXPECT_FALSE(fs::exists(sessions + "/.del-" + TestId(21) + "-1-2-3"));
  // The next turn takes seq 4 with real content.
  SavedSession meta = r.sessions[2].meta.id == ids.victim ? r.sessions[2].meta : r.sessions[1].meta;
  ASSERT_EQ(meta.id, ids.victim);
  int64_t begin = static_cast<int64_t>(meta.tokens.size());
  ExtendMeta(&meta, 2, 7);
  TurnData t = MakeTurn(7, begin, 2);
  ASSERT_OK(store->WriteTurn(meta, t.segment));
  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(ids.victim));
  ASSERT_EQ(reader->manifest().segments.back().seq, 4u);
  ExpectBlobsEqual(*reader, 3, t.segment);
}

// ---------------- failure at every point ----------------

// What one scenario does to a store prepared by `setup`; `check` verifies the state after
// the operation succeeded (in a fresh store, after OpenAll).
struct Scenario {
  std::string name;
  std::function<void(StateStore*)> setup;
  std::function<absl::Status(StateStore*)> run;
  std::function<void(const RecoveryResult&)> check;
};

std::vector<Scenario> Scenarios() {
  const std::string id = TestId(30), other = TestId(31);
  auto setup = [=](StateStore* store) {
    Grow(store, id, {4, 3});
    Grow(store, other, {2});
  };
  auto meta_after = [=](int64_t extra) {
    SavedSession m = MakeMeta(id, 7);
    m.last_used = m.created + absl::Seconds(7);
    ExtendMeta(&m, extra);
    return m;
  };
  auto find = [](const RecoveryResult& r, const std::string& id) -> const SessionManifest* {
    for (const auto& s : r.sessions) {
      if (s.meta.id == id) return &s;
    }
    return nullptr;
  };
  std::vector<Scenario> out;
  out.push_back({"create", setup,
                 [=](StateStore* store) {
                   SavedSession m = MakeMeta(TestId(32), 5);
                   return store->WriteTurn(m, MakeTurn(3, 0, 5).segment);
                 },
                 [=](const RecoveryResult& r) {
                   const SessionManifest* m = find(r, TestId(32));
                   ASSERT_NE(m, nullptr);
                   EXPECT_EQ(m->segments.size(), 1u);
                 }});
  out.push_back({"append", setup,
                 [=](StateStore* store) {
                   return store->WriteTurn(meta_after(2), MakeTurn(1, 7, 2).segment);
                 },
                 [=](const RecoveryResult& r) {
                   const SessionManifest* m = find(r, id);
                   ASSERT_NE(m, nullptr);
                   EXPECT_EQ(m->segments.size(), 3u);
                   EXPECT_EQ(m->meta.tokens.size(), 9u);
                 }});
  out.push_back({"supersede", setup,
                 [=](StateStore* store) {
                   return store->WriteTurn(meta_after(2), MakeTurn(1, 7, 2, true).segment);
                 },
                 [=](const RecoveryResult& r) {
                   const SessionManifest* m = find(r, id);
                   ASSERT_NE(m, nullptr);
                   ASSERT_EQ(m->segments.size(), 1u);
                   EXPECT_EQ(m->segments[0].seq, 3u);
                 }});
  out.push_back({"update", setup,
                 [=](StateStore* store) {
                   SavedSession m = meta_after(0);
                   m.last_used += absl::Hours(2);
                   return store->UpdateSession(m);
                 },
                 [=](const RecoveryResult& r) {
                   const SessionManifest* m = find(r, id);
                   ASSERT_NE(m, nullptr);
                   EXPECT_EQ(m->meta.last_used, meta_after(0).last_used + absl::Hours(2));
                 }});
  out.push_back({"delete", setup, [=](StateStore* store) { return store->DeleteSession(id); },
                 [=](const RecoveryResult& r) {
                   EXPECT_EQ(find(r, id), nullptr);
                   EXPECT_NE(find(r, other), nullptr);
                 }});
  return out;
}

TEST(StateStoreFaultTest, AFailedWriteChangesNothingAtEveryFailurePoint) {
  const FileOp kOps[] = {FileOp::kOpenWrite, FileOp::kOpenRead, FileOp::kWrite, FileOp::kFsync,
                         FileOp::kClose,     FileOp::kRename,   FileOp::kLink,  FileOp::kMkdir};
  int points = 0;
  for (const Scenario& scenario : Scenarios()) {
    for (FsyncPolicy policy : {FsyncPolicy::kAlways, FsyncPolicy::kNone}) {
      // Count the calls of each op in a clean run.
      std::map<FileOp, int> calls;
      {
        TempDir dir(/*in_memory=*/true);
        PosixFileOps posix;
        FaultInjectingFileOps counter(&posix);
        StoreOptions options = TestOptions(dir.path(), policy);
        options.file_ops = &counter;
        ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
        scenario.setup(store.get());
        counter.ResetCounts();
        ASSERT_OK(scenario.run(store.get()));
        for (FileOp op : kOps) calls[op] = counter.count(op);
      }
      for (FileOp op : kOps) {
        for (int nth = 1; nth <= calls[op]; ++nth) {
          for (int err : {ENOSPC, EIO, EDQUOT}) {
            for (bool partial : {false, true}) {
              if (partial && (op != FileOp::kWrite || err != ENOSPC)) continue;
              SCOPED_TRACE(absl::StrCat(scenario.name, " fsync=", FsyncPolicyName(policy), " ",
                                        FileOpName(op), " #", nth, " errno ", err,
                                        partial ? " partial" : ""));
              ++points;
              TempDir dir(/*in_memory=*/true);
              PosixFileOps posix;
              FaultInjectingFileOps faults(&posix);
              StoreOptions options = TestOptions(dir.path(), policy);
              options.file_ops = &faults;
              ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
              scenario.setup(store.get());
              auto before = TreeOf(options.dir);
              faults.FailAt(op, nth, err, partial);
              absl::Status status = scenario.run(store.get());
              ASSERT_TRUE(faults.fired());
              EXPECT_EQ(status.code(), err == EIO ? absl::StatusCode::kInternal
                                                  : absl::StatusCode::kResourceExhausted)
                  << status;
              EXPECT_THAT(std::string(status.message()), HasSubstr(options.dir)) << status;
              EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("errno ", err)));
              EXPECT_EQ(TreeOf(options.dir), before) << status;
              // The store is still usable and the retry lands.
              faults.Disarm();
              ASSERT_OK(scenario.run(store.get()));
              store.reset();
              options.file_ops = nullptr;
              ASSERT_OK_AND_ASSIGN(store, StateStore::Create(options));
              RecoveryResult r = store->OpenAll();
              EXPECT_TRUE(r.errors.empty());
              EXPECT_TRUE(r.removed.empty());
              scenario.check(r);
              for (const SessionManifest& m : r.sessions) EXPECT_OK(store->OpenSession(m.meta.id).status());
            }
          }
        }
      }
    }
  }
  EXPECT_GT(points, 300);
  std::cout << "failure points exercised: " << points << "\n";
}

TEST(StateStoreFaultTest, ErrnoMapping) {
  EXPECT_THAT(ErrnoToStatus(ENOSPC, "write", "/d/f"),
              StatusIs(absl::StatusCode::kResourceExhausted, "write /d/f: No space left on device (errno 28)"));
  EXPECT_THAT(ErrnoToStatus(EDQUOT, "write", "/d/f"), StatusIs(absl::StatusCode::kResourceExhausted, "quota"));
  EXPECT_THAT(ErrnoToStatus(EIO, "fsync", "/d/f"), StatusIs(absl::StatusCode::kInternal, "fsync /d/f: Input/output error"));
  EXPECT_THAT(ErrnoToStatus(EROFS, "create", "/d/f"), StatusIs(absl::StatusCode::kInternal, "Read-only"));
}

}  // namespace
}  // namespace echokv::state
