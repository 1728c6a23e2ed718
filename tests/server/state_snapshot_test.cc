// Snapshot streams (ExportSession / ImportSession): round trips in any chunking, the
// stream is the on-disk files in order, and every damaged, truncated, foreign or
// oversized stream is refused with its code while nothing is created.
#include <errno.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/file_ops.h"
#include "server/state/format.h"
#include "server/state/snapshot.h"
#include "server/state/store.h"
#include "server/state/types.h"
#include "tests/server/state_testing.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"

namespace echokv::state {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::HasSubstr;
using namespace ::echokv::state::testing;  // NOLINT: test helpers

namespace fs = std::filesystem;

// A source store holding one session of four turns (the third supersedes).
class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_options_ = TestOptions(src_dir_.path());
    auto store = StateStore::Create(src_options_);
    ASSERT_OK(store.status());
    src_ = *std::move(store);
    meta_ = MakeMeta(id_, 0, 3);
    std::vector<std::pair<int64_t, bool>> turns = {{5, false}, {3, false}, {4, true}, {6, false}};
    for (auto [n, supersedes] : turns) {
      int64_t begin = static_cast<int64_t>(meta_.tokens.size());
      ExtendMeta(&meta_, n, 3);
      turns_.push_back(MakeTurn(3, begin, n, supersedes));
      ASSERT_OK(src_->WriteTurn(meta_, turns_.back().segment));
    }
    dst_options_ = TestOptions(dst_dir_.path());
    auto dst = StateStore::Create(dst_options_);
    ASSERT_OK(dst.status());
    dst_ = *std::move(dst);
  }

  std::string Export(StateStore* store, const std::string& id, size_t chunk) {
    auto exporter = store->Export(id, chunk);
    EXPECT_OK(exporter.status());
    std::string stream, piece;
    for (;;) {
      auto more = (*exporter)->Next(&piece);
      EXPECT_OK(more.status());
      if (!more.ok() || !*more) break;
      EXPECT_LE(piece.size(), chunk);
      EXPECT_FALSE(piece.empty());
      stream += piece;
    }
    EXPECT_EQ(stream.size(), (*exporter)->total_bytes());
    return stream;
  }

  // Feeds `stream` in pieces of `chunk` bytes; the first error, or Finish's result.
  absl::StatusOr<SessionManifest> Import(StateStore* store, absl::string_view stream, size_t chunk,
                                         absl::string_view id = "") {
    auto importer = store->BeginImport();
    for (size_t at = 0; at < stream.size(); at += chunk) {
      absl::Status s = importer->Feed(stream.substr(at, chunk));
      if (!s.ok()) {
        EXPECT_EQ(importer->Feed("more").code(), s.code()) << "errors must be sticky";
        EXPECT_EQ(importer->Finish().status().code(), s.code());
        return s;
      }
    }
    return importer->Finish(id);
  }

  void ExpectSameSession(StateStore* store, const std::string& id) {
    ASSERT_OK_AND_ASSIGN(auto reader, store->OpenSession(id));
    const SessionManifest& m = reader->manifest();
    EXPECT_EQ(m.meta.tokens, meta_.tokens);
    EXPECT_EQ(m.meta.compression_config, meta_.compression_config);
    EXPECT_EQ(m.meta.last_used, meta_.last_used);
    ASSERT_EQ(m.segments.size(), 2u);  // the superseding turn and the one after it
    for (size_t s = 0; s < 2; ++s) {
      const NewSegment& want = turns_[2 + s].segment;
      ASSERT_EQ(m.segments[s].blobs.size(), want.blobs.size());
      for (const BlobView& b : want.blobs) {
        ASSERT_OK_AND_ASSIGN(std::string bytes, reader->ReadAll(s, b.name));
        EXPECT_EQ(bytes, b.data) << b.name;
      }
    }
  }

  // Imports `stream` expecting `code` (message containing `substr`) and no trace on disk.
  void ExpectRefused(absl::string_view stream, size_t chunk, absl::StatusCode code,
                     const std::string& substr, absl::string_view id = "") {
    auto before = TreeOf(dst_options_.dir);
    auto result = Import(dst_.get(), stream, chunk, id);
    EXPECT_THAT(result, StatusIs(code, substr));
    EXPECT_EQ(TreeOf(dst_options_.dir), before) << "an import that failed left files behind";
    EXPECT_TRUE(dst_->SessionIds().empty() || dst_->SessionIds() == known_);
  }

  TempDir src_dir_, dst_dir_{/*in_memory=*/true};
  StoreOptions src_options_, dst_options_;
  std::unique_ptr<StateStore> src_, dst_;
  const std::string id_ = TestId(40, "echokv-1");
  SavedSession meta_;
  std::vector<TurnData> turns_;
  std::vector<std::string> known_;  // ids dst_ holds on purpose
};

TEST_F(SnapshotTest, RoundTripsInAnyChunking) {
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{64}, size_t{4096}}) {
    EXPECT_EQ(Export(src_.get(), id_, chunk), stream) << chunk;
  }
  size_t i = 0;
  for (size_t chunk : {size_t{1}, size_t{13}, size_t{1000}, stream.size()}) {
    std::string new_id = TestId(41 + i++);
    ASSERT_OK_AND_ASSIGN(SessionManifest m, Import(dst_.get(), stream, chunk, new_id));
    EXPECT_EQ(m.meta.id, new_id);
    EXPECT_EQ(m.segments.size(), 2u);
    EXPECT_EQ(m.segments[1].blobs.size(), 6u);
    ExpectSameSession(dst_.get(), new_id);
  }
  // Under its own id, then that id is taken.
  ASSERT_OK_AND_ASSIGN(SessionManifest own, Import(dst_.get(), stream, 333));
  EXPECT_EQ(own.meta.id, id_);
  known_ = dst_->SessionIds();
  ExpectRefused(stream, 4096, absl::StatusCode::kAlreadyExists, id_);

  // The imported sessions survive a restart and export to the same stream (the ids
  // aside, which live only in the manifest).
  dst_.reset();
  ASSERT_OK_AND_ASSIGN(dst_, StateStore::Create(dst_options_));
  RecoveryResult r = dst_->OpenAll();
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.sessions.size(), 5u);
  EXPECT_EQ(Export(dst_.get(), id_, 1 << 20), stream);
  ExpectSameSession(dst_.get(), TestId(41));
  // Imported sessions take more turns.
  SavedSession next = meta_;
  next.id = TestId(41);
  int64_t begin = static_cast<int64_t>(next.tokens.size());
  ExtendMeta(&next, 2, 3);
  EXPECT_OK(dst_->WriteTurn(next, MakeTurn(3, begin, 2).segment));
}

TEST_F(SnapshotTest, TheCallerSeesTheManifestEarlyAndMayEditOrRefuse) {
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  const size_t manifest_end = 64 + internal::GetU64(stream.data() + 32);
  auto importer = dst_->BeginImport();
  ASSERT_OK(importer->Feed(absl::string_view(stream).substr(0, manifest_end - 1)));
  EXPECT_EQ(importer->manifest(), nullptr);
  ASSERT_OK(importer->Feed(absl::string_view(stream).substr(manifest_end - 1, 1)));
  ASSERT_NE(importer->manifest(), nullptr);
  EXPECT_EQ(importer->manifest()->meta.tokens, meta_.tokens);
  EXPECT_GT(importer->manifest()->TotalSegmentBytes(), 0u);
  ASSERT_OK(importer->Feed(absl::string_view(stream).substr(manifest_end)));
  ASSERT_OK_AND_ASSIGN(SessionManifest m, importer->Finish(TestId(61), [](SavedSession& meta) {
                         meta.ttl = absl::Seconds(42);
                         return absl::OkStatus();
                       }));
  EXPECT_EQ(m.meta.ttl, absl::Seconds(42));
  ASSERT_OK_AND_ASSIGN(auto reader, dst_->OpenSession(TestId(61)));
  EXPECT_EQ(reader->manifest().meta.ttl, absl::Seconds(42));

  known_ = dst_->SessionIds();
  auto refuse = [](SavedSession&) { return absl::ResourceExhaustedError("max_sessions"); };
  auto before = TreeOf(dst_options_.dir);
  auto second = dst_->BeginImport();
  ASSERT_OK(second->Feed(stream));
  EXPECT_THAT(second->Finish(TestId(62), refuse), StatusIs(absl::StatusCode::kResourceExhausted, "max_sessions"));
  auto third = dst_->BeginImport();
  ASSERT_OK(third->Feed(stream));
  EXPECT_THAT(third->Finish(TestId(63), [](SavedSession& meta) {
                meta.tokens.pop_back();
                return absl::OkStatus();
              }),
              StatusIs(absl::StatusCode::kInvalidArgument, "token history"));
  EXPECT_EQ(TreeOf(dst_options_.dir), before);
}

TEST_F(SnapshotTest, TheStreamIsTheFilesInOrder) {
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  const std::string dir = src_options_.dir + "/sessions/" + id_;
  const std::string manifest = ReadFileOrDie(dir + "/manifest");
  const std::string seg3 = ReadFileOrDie(dir + "/seg-3.ekv");
  const std::string seg4 = ReadFileOrDie(dir + "/seg-4.ekv");
  ASSERT_EQ(stream.size(), 64 + manifest.size() + seg3.size() + seg4.size() + 32);
  EXPECT_EQ(stream.substr(0, 8), "ECHOKVSN");
  EXPECT_EQ(internal::GetU64(stream.data() + 32), manifest.size());
  EXPECT_EQ(internal::GetU64(stream.data() + 40), 2u);
  EXPECT_EQ(stream.substr(64, manifest.size()), manifest);
  EXPECT_EQ(stream.substr(64 + manifest.size(), seg3.size()), seg3);
  EXPECT_EQ(stream.substr(64 + manifest.size() + seg3.size(), seg4.size()), seg4);
  absl::string_view trailer = absl::string_view(stream).substr(stream.size() - 32);
  EXPECT_EQ(trailer.substr(0, 8), "ECHOKVEN");
  EXPECT_EQ(internal::GetU64(trailer.data() + 8), stream.size() - 32);
  EXPECT_EQ(internal::GetU64(trailer.data() + 16),
            internal::Xxh3(absl::string_view(stream).substr(0, stream.size() - 32)));
}

TEST_F(SnapshotTest, AnExportIsASnapshotInTime) {
  ASSERT_OK_AND_ASSIGN(auto exporter, src_->Export(id_, 100));
  std::string stream, piece;
  ASSERT_OK(exporter->Next(&piece).status());
  stream += piece;
  // A superseding turn removes seg-3/seg-4 and a delete removes the directory while the
  // export runs: the stream still reads the state it started from.
  const std::string before = Export(src_.get(), id_, 1 << 20);
  SavedSession next = meta_;
  int64_t begin = static_cast<int64_t>(next.tokens.size());
  ExtendMeta(&next, 1, 3);
  ASSERT_OK(src_->WriteTurn(next, MakeTurn(3, begin, 1, true).segment));
  ASSERT_OK(src_->DeleteSession(id_));
  for (;;) {
    ASSERT_OK_AND_ASSIGN(bool more, exporter->Next(&piece));
    if (!more) break;
    stream += piece;
  }
  EXPECT_EQ(stream, before);
  EXPECT_THAT(src_->Export(id_), StatusIs(absl::StatusCode::kNotFound, id_));
}

TEST_F(SnapshotTest, EveryFlippedByteIsRefused) {
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  const size_t manifest_bytes = internal::GetU64(stream.data() + 32);
  const size_t seg_start = 64 + manifest_bytes;
  int data_loss = 0;
  for (size_t i = 0; i < stream.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("byte ", i, " of ", stream.size()));
    std::string bad = stream;
    bad[i] ^= 0x10;
    auto before = TreeOf(dst_options_.dir);
    absl::StatusOr<SessionManifest> result = Import(dst_.get(), bad, 4096);
    ASSERT_FALSE(result.ok()) << "flipped byte accepted";
    // Which code: magic of the stream -> not a snapshot; any version field -> a format
    // this build does not read; everything else -> corruption.
    bool version = (i >= 8 && i < 12) || (i >= 64 + 8 && i < 64 + 12);
    absl::StatusCode want = i < 8 ? absl::StatusCode::kInvalidArgument
                            : version ? absl::StatusCode::kFailedPrecondition
                                      : absl::StatusCode::kDataLoss;
    if (i >= seg_start && i < stream.size() - 32) {
      // Inside a segment file: its version field, or corruption.
      if (result.status().code() == absl::StatusCode::kFailedPrecondition) {
        EXPECT_THAT(std::string(result.status().message()), HasSubstr("format version"));
        continue;
      }
      want = absl::StatusCode::kDataLoss;
    }
    EXPECT_EQ(result.status().code(), want) << result.status();
    data_loss += result.status().code() == absl::StatusCode::kDataLoss;
    ASSERT_EQ(TreeOf(dst_options_.dir), before);
  }
  EXPECT_GT(data_loss, static_cast<int>(stream.size()) - 64);
  EXPECT_TRUE(dst_->SessionIds().empty());
}

TEST_F(SnapshotTest, EveryTruncationIsRefused) {
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  for (size_t n = 0; n < stream.size(); ++n) {
    SCOPED_TRACE(absl::StrCat("first ", n, " bytes"));
    ExpectRefused(absl::string_view(stream).substr(0, n), 512, absl::StatusCode::kInvalidArgument,
                  "snapshot is truncated");
  }
  ExpectRefused(stream + "x", 512, absl::StatusCode::kInvalidArgument, "1 bytes after its end");
  ExpectRefused(stream + stream, 512, absl::StatusCode::kInvalidArgument, "after its end");
}

TEST_F(SnapshotTest, ForeignAndAlienStreams) {
  // From a server with another model.
  TempDir other;
  StoreOptions oo = TestOptions(other.path());
  oo.model = kOtherModel;
  ASSERT_OK_AND_ASSIGN(auto foreign_store, StateStore::Create(oo));
  SavedSession m = MakeMeta(TestId(50), 0);
  ExtendMeta(&m, 3);
  ASSERT_OK(foreign_store->WriteTurn(m, MakeTurn(1, 0, 3).segment));
  const std::string foreign = Export(foreign_store.get(), TestId(50), 1 << 20);
  ExpectRefused(foreign, 100, absl::StatusCode::kFailedPrecondition, kOtherModel.ToHex());

  // Not a snapshot at all: a manifest file, random bytes, text.
  const std::string manifest = ReadFileOrDie(src_options_.dir + "/sessions/" + id_ + "/manifest");
  ExpectRefused(manifest, 100, absl::StatusCode::kInvalidArgument, "not an echokv session snapshot");
  ExpectRefused(Bytes(5, 500), 100, absl::StatusCode::kInvalidArgument, "bad magic");
  ExpectRefused("hello", 100, absl::StatusCode::kInvalidArgument, "truncated");

  // Segments swapped: each is intact, but not where the manifest says.
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  const std::string dir = src_options_.dir + "/sessions/" + id_;
  const std::string mf = ReadFileOrDie(dir + "/manifest");
  const std::string s3 = ReadFileOrDie(dir + "/seg-3.ekv"), s4 = ReadFileOrDie(dir + "/seg-4.ekv");
  std::string swapped = stream.substr(0, 64 + mf.size()) + s4 + s3 + stream.substr(stream.size() - 32);
  ExpectRefused(swapped, 100, absl::StatusCode::kDataLoss, "does not match the manifest");

  // A bad target id.
  ExpectRefused(stream, 100, absl::StatusCode::kInvalidArgument, "session id", "../../etc");
  ExpectRefused(stream, 100, absl::StatusCode::kInvalidArgument, "session id", "ABC");
}

// Rewrites the stream header with other declared sizes (valid checksum).
std::string WithHeader(const std::string& stream, uint64_t manifest_bytes, uint64_t segments) {
  internal::SnapshotHeader h;
  h.model = kModel;
  h.manifest_bytes = manifest_bytes;
  h.segment_count = segments;
  return internal::EncodeSnapshotHeader(h) + stream.substr(64);
}

TEST_F(SnapshotTest, SizeLimitsHoldAgainstLyingStreams) {
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  // Declared sizes far beyond the limits are refused from the 64-byte header alone.
  ExpectRefused(WithHeader(stream, uint64_t{1} << 60, 2).substr(0, 64), 64,
                absl::StatusCode::kResourceExhausted, "over the limit");
  auto importer = dst_->BeginImport();
  EXPECT_THAT(importer->Feed(WithHeader(stream, uint64_t{1} << 60, 2).substr(0, 64)),
              StatusIs(absl::StatusCode::kResourceExhausted, "manifest of 1152921504606846976 bytes"));
  ExpectRefused(WithHeader(stream, internal::GetU64(stream.data() + 32), uint64_t{1} << 40), 4096,
                absl::StatusCode::kResourceExhausted, "segments is over the limit");
  ExpectRefused(WithHeader(stream, 10, 2), 4096, absl::StatusCode::kInvalidArgument, "declares a manifest of 10");
  ExpectRefused(WithHeader(stream, internal::GetU64(stream.data() + 32), 0), 4096,
                absl::StatusCode::kInvalidArgument, "0 segments");
  // A header that disagrees with the manifest it precedes.
  ExpectRefused(WithHeader(stream, internal::GetU64(stream.data() + 32), 3), 4096,
                absl::StatusCode::kDataLoss, "lists 2");
  ExpectRefused(WithHeader(stream, internal::GetU64(stream.data() + 32) - 8, 2), 4096,
                absl::StatusCode::kDataLoss, "snapshot manifest");

  // A store with a small snapshot limit refuses once the manifest shows the total, before
  // any segment byte is written, and counts bytes fed too.
  dst_.reset();
  dst_options_.limits.max_snapshot_bytes = stream.size() - 1;
  ASSERT_OK_AND_ASSIGN(dst_, StateStore::Create(dst_options_));
  const size_t manifest_end = 64 + internal::GetU64(stream.data() + 32);
  auto small = dst_->BeginImport();
  EXPECT_THAT(small->Feed(absl::string_view(stream).substr(0, manifest_end)),
              StatusIs(absl::StatusCode::kResourceExhausted, "over the limit"));
  ExpectRefused(stream, 1 << 20, absl::StatusCode::kResourceExhausted, "limit");

  // A segment header declaring a blob table over the limit: refused at its fixed header.
  dst_.reset();
  dst_options_.limits = StateLimits();
  dst_options_.limits.max_blob_table_bytes = 64;
  ASSERT_OK_AND_ASSIGN(dst_, StateStore::Create(dst_options_));
  auto tight = dst_->BeginImport();
  EXPECT_THAT(tight->Feed(absl::string_view(stream).substr(0, manifest_end + 128)),
              StatusIs(absl::StatusCode::kDataLoss, "blob table is over the size limit"));
}

TEST_F(SnapshotTest, AnAbandonedImportLeavesNothing) {
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  auto before = TreeOf(dst_options_.dir);
  {
    auto importer = dst_->BeginImport();
    ASSERT_OK(importer->Feed(absl::string_view(stream).substr(0, stream.size() / 2)));
    // Its staging directory exists while it runs, and recovery leaves it alone.
    EXPECT_NE(TreeOf(dst_options_.dir), before);
    RecoveryResult r = dst_->OpenAll();
    EXPECT_TRUE(r.removed.empty());
    ASSERT_OK(importer->Feed(absl::string_view(stream).substr(stream.size() / 2)));
  }  // never finished
  EXPECT_EQ(TreeOf(dst_options_.dir), before);
  EXPECT_TRUE(dst_->SessionIds().empty());
}

TEST_F(SnapshotTest, ExportFindsDamagedPayloads) {
  const std::string seg = src_options_.dir + "/sessions/" + id_ + "/seg-4.ekv";
  std::string bytes = ReadFileOrDie(seg);
  bytes[bytes.size() - 3] ^= 1;
  WriteFileOrDie(seg, bytes);
  ASSERT_OK_AND_ASSIGN(auto exporter, src_->Export(id_, 1 << 20));
  std::string piece;
  absl::Status status;
  for (;;) {
    auto more = exporter->Next(&piece);
    if (!more.ok()) {
      status = more.status();
      break;
    }
    if (!*more) break;
  }
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss, "seg-4.ekv: payload checksum mismatch"));
  EXPECT_EQ(ErrorKindOf(status), ErrorKind::kChecksum);
  EXPECT_THAT(exporter->Next(&piece), StatusIs(absl::StatusCode::kDataLoss, "seg-4.ekv"));
}

TEST_F(SnapshotTest, AFailedImportWriteChangesNothingAtEveryFailurePoint) {
  const std::string stream = Export(src_.get(), id_, 1 << 20);
  const FileOp kOps[] = {FileOp::kOpenWrite, FileOp::kOpenRead, FileOp::kWrite, FileOp::kFsync,
                         FileOp::kClose,     FileOp::kRename,   FileOp::kMkdir};
  int points = 0;
  for (FsyncPolicy policy : {FsyncPolicy::kAlways, FsyncPolicy::kNone}) {
    std::map<FileOp, int> calls;
    {
      TempDir dir(/*in_memory=*/true);
      PosixFileOps posix;
      FaultInjectingFileOps counter(&posix);
      StoreOptions options = TestOptions(dir.path(), policy);
      options.file_ops = &counter;
      ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
      counter.ResetCounts();
      ASSERT_OK(Import(store.get(), stream, 1000).status());
      for (FileOp op : kOps) calls[op] = counter.count(op);
    }
    for (FileOp op : kOps) {
      for (int nth = 1; nth <= calls[op]; ++nth) {
        for (int err : {ENOSPC, EIO}) {
          SCOPED_TRACE(absl::StrCat("fsync=", FsyncPolicyName(policy), " ", FileOpName(op), " #", nth,
                                    " errno ", err));
          ++points;
          TempDir dir(/*in_memory=*/true);
          PosixFileOps posix;
          FaultInjectingFileOps faults(&posix);
          StoreOptions options = TestOptions(dir.path(), policy);
          options.file_ops = &faults;
          ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
          auto before = TreeOf(options.dir);
          faults.FailAt(op, nth, err);
          absl::StatusOr<SessionManifest> result = Import(store.get(), stream, 1000);
          ASSERT_TRUE(faults.fired());
          EXPECT_EQ(result.status().code(),
                    err == EIO ? absl::StatusCode::kInternal : absl::StatusCode::kResourceExhausted)
              << result.status();
          EXPECT_THAT(std::string(result.status().message()), HasSubstr(options.dir));
          EXPECT_EQ(TreeOf(options.dir), before);
          EXPECT_TRUE(store->SessionIds().empty());
          faults.Disarm();
          ASSERT_OK(Import(store.get(), stream, 1000).status());
          ExpectSameSession(store.get(), id_);
        }
      }
    }
  }
  EXPECT_GT(points, 20);
}

// docs/ARCHITECTURE.md's tables, implemented separately in Python (python3-xxhash), read
// what the store wrote and what it exported: same sessions, tokens, segments, and per
// blob the same dtype, shape and bytes (their XXH3-64).
TEST_F(SnapshotTest, AnIndependentReaderOfTheDocumentedFormatAgrees) {
  SavedSession evict = MakeMeta(TestId(60), 0, 4);
  evict.memory = MemoryMode::kEvict;
  ExtendMeta(&evict, 9, 4);
  TurnData evict_turn = MakeTurn(4, 0, 9);
  ASSERT_OK(src_->WriteTurn(evict, evict_turn.segment));
  const std::string snapshot_path = src_dir_.path() + "/snapshot.ekvs";
  WriteFileOrDie(snapshot_path, Export(src_.get(), id_, 777));

  ::echokv::testing::CommandResult r = ::echokv::testing::RunCommand(
      absl::StrCat("/usr/bin/python3 ", ECHOKV_STATE_ORACLE, " ", src_options_.dir, " ", snapshot_path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json out = nlohmann::json::parse(r.out);

  auto expect_session = [&](const nlohmann::json& got, const SavedSession& meta,
                            const std::vector<const NewSegment*>& segments) {
    EXPECT_EQ(got["id"], meta.id);
    EXPECT_EQ(got["memory"], std::string(MemoryModeName(meta.memory)));
    EXPECT_EQ(got["tokens"].get<std::vector<int32_t>>(), meta.tokens);
    ASSERT_EQ(got["segments"].size(), segments.size());
    for (size_t s = 0; s < segments.size(); ++s) {
      const nlohmann::json& gs = got["segments"][s];
      EXPECT_EQ(gs["token_begin"], segments[s]->token_begin);
      EXPECT_EQ(gs["token_end"], segments[s]->token_end);
      EXPECT_EQ(gs["supersedes"], segments[s]->supersedes_earlier);
      ASSERT_EQ(gs["blobs"].size(), segments[s]->blobs.size());
      for (size_t b = 0; b < segments[s]->blobs.size(); ++b) {
        const BlobView& want = segments[s]->blobs[b];
        const nlohmann::json& gb = gs["blobs"][b];
        EXPECT_EQ(gb["name"], want.name);
        EXPECT_EQ(gb["dtype"], std::string(DTypeName(want.dtype)));
        EXPECT_EQ(gb["shape"].get<std::vector<int64_t>>(), want.shape);
        EXPECT_EQ(gb["xxh3"], absl::StrCat(absl::Hex(internal::Xxh3(want.data), absl::kZeroPad16)));
      }
    }
  };
  ASSERT_EQ(out["sessions"].size(), 2u);
  expect_session(out["sessions"][id_], meta_, {&turns_[2].segment, &turns_[3].segment});
  expect_session(out["sessions"][TestId(60)], evict, {&evict_turn.segment});
  ASSERT_EQ(out["snapshots"].size(), 1u);
  expect_session(out["snapshots"][0], meta_, {&turns_[2].segment, &turns_[3].segment});

  // And it is a real check: it refuses a damaged file.
  std::string bytes = ReadFileOrDie(snapshot_path);
  bytes[bytes.size() - 40] ^= 1;
  WriteFileOrDie(snapshot_path, bytes);
  r = ::echokv::testing::RunCommand(
      absl::StrCat("/usr/bin/python3 ", ECHOKV_STATE_ORACLE, " ", src_options_.dir, " ", snapshot_path));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checksum"));
}

}  // namespace
}  // namespace echokv::state
