// Crash consistency: a child process runs creates, appends, superseding turns and deletes
// on four sessions in a loop and is killed with SIGKILL at random (seeded) moments. Before
// each operation it reports its intent through a pipe, after each acknowledged one an ack.
// After every kill the parent opens the store and checks: no session is refused, every
// acknowledged turn is there bit for bit, and the one operation in flight is either
// entirely there or entirely absent.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/state/store.h"
#include "tests/server/state_testing.h"
#include "tests/testing/status_matchers.h"

namespace echokv::state {
namespace {

using namespace ::echokv::state::testing;  // NOLINT: test helpers

constexpr int kSessions = 4;
constexpr int kKills = 150;

enum Op : uint32_t { kCreate = 0, kAppend = 1, kSupersede = 2, kDelete = 3 };

// One pipe message (24 bytes: written atomically).
struct Record {
  uint32_t ack = 0;       // 0: about to start, 1: acknowledged
  uint32_t session = 0;   // 0..kSessions-1
  uint32_t op = 0;        // Op
  uint32_t segments = 0;  // segments after the op (0 for a delete)
  int64_t tokens = 0;     // tokens after the op
};
static_assert(sizeof(Record) == 24);

std::string IdOf(uint32_t s) { return TestId(100 + s, s % 2 ? "echokv-3" : ""); }
uint64_t SeedOf(uint32_t s) { return 17 + s; }

// What the parent believes a session holds.
struct Expected {
  bool exists = false;
  int64_t tokens = 0;
  uint32_t segments = 0;
};

void Send(int fd, const Record& r) {
  if (write(fd, &r, sizeof(r)) != sizeof(r)) _exit(3);
}

// The child: never returns.
[[noreturn]] void Child(const std::string& root, uint64_t seed, int fd) {
  StoreOptions options = TestOptions(root, seed % 2 ? FsyncPolicy::kAlways : FsyncPolicy::kNone);
  auto store = StateStore::Create(options);
  if (!store.ok()) _exit(4);
  RecoveryResult found = (*store)->OpenAll();
  if (!found.errors.empty()) _exit(5);
  std::map<uint32_t, SavedSession> live;
  std::map<uint32_t, uint32_t> segments;
  for (const SessionManifest& m : found.sessions) {
    for (uint32_t s = 0; s < kSessions; ++s) {
      if (m.meta.id == IdOf(s)) {
        live[s] = m.meta;
        segments[s] = static_cast<uint32_t>(m.segments.size());
      }
    }
  }
  std::mt19937_64 rng(seed * 7919 + 1);
  for (;;) {
    uint32_t s = static_cast<uint32_t>(rng() % kSessions);
    int64_t n = 1 + static_cast<int64_t>(rng() % 64);
    uint32_t op;
    auto it = live.find(s);
    if (it == live.end()) {
      op = kCreate;
    } else if (it->second.tokens.size() > 2000 || rng() % 20 == 0) {
      op = kDelete;
    } else {
      op = rng() % 5 == 0 ? kSupersede : kAppend;
    }
    SavedSession meta = op == kCreate ? MakeMeta(IdOf(s), 0, SeedOf(s)) : live[s];
    int64_t begin = static_cast<int64_t>(meta.tokens.size());
    uint32_t segs = op == kCreate ? 1 : op == kSupersede ? 1 : op == kAppend ? segments[s] + 1 : 0;
    int64_t tokens_after = op == kDelete ? 0 : begin + n;
    Send(fd, {0, s, op, segs, tokens_after});
    absl::Status status;
    if (op == kDelete) {
      status = (*store)->DeleteSession(IdOf(s));
    } else {
      ExtendMeta(&meta, n, SeedOf(s));
      TurnData turn = MakeTurn(SeedOf(s), begin, n, op == kSupersede);
      status = (*store)->WriteTurn(meta, turn.segment);
    }
    if (!status.ok()) _exit(6);
    if (op == kDelete) {
      live.erase(s);
      segments.erase(s);
    } else {
      live[s] = meta;
      segments[s] = segs;
    }
    Send(fd, {1, s, op, segs, tokens_after});
  }
}

// Checks one session on disk against what must be there; returns a failure message or "".
std::string CheckSession(StateStore* store, const SessionManifest& m, uint32_t s) {
  if (m.meta.tokens.size() != static_cast<size_t>(m.segments.back().token_end)) return "token count";
  for (size_t i = 0; i < m.meta.tokens.size(); ++i) {
    if (m.meta.tokens[i] != TokenAt(SeedOf(s), static_cast<int64_t>(i))) return "token history";
  }
  auto reader = store->OpenSession(m.meta.id);
  if (!reader.ok()) return std::string(reader.status().message());
  for (size_t i = 0; i < m.segments.size(); ++i) {
    const SegmentInfo& seg = m.segments[i];
    TurnData want = TurnForRange(SeedOf(s), seg.token_begin, seg.token_end, seg.supersedes_earlier);
    for (const BlobView& b : want.segment.blobs) {
      auto bytes = (*reader)->ReadAll(i, b.name);
      if (!bytes.ok() || *bytes != b.data) return absl::StrCat("segment ", seg.seq, " blob ", b.name);
    }
  }
  return "";
}

bool Same(const Expected& a, const Expected& b) {
  return a.exists == b.exists && (!a.exists || (a.tokens == b.tokens && a.segments == b.segments));
}

TEST(StateCrashTest, EveryAcknowledgedTurnSurvivesKillNine) {
  TempDir dir(/*in_memory=*/true);
  std::mt19937_64 rng(20261201);
  std::map<uint32_t, Expected> expected;  // the acknowledged state of each session
  int kills = 0, in_flight_present = 0, in_flight_absent = 0;
  int64_t acks_total = 0;
  for (int k = 0; k < kKills; ++k) {
    SCOPED_TRACE(absl::StrCat("kill ", k));
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      Child(dir.path(), static_cast<uint64_t>(k), fds[1]);
    }
    close(fds[1]);
    std::vector<Record> records;
    if (k % 2 == 1) {
      // After the child's first message, so the kill lands among the turns.
      Record first;
      ASSERT_EQ(read(fds[0], &first, sizeof(first)), static_cast<ssize_t>(sizeof(first)));
      records.push_back(first);
      usleep(static_cast<useconds_t>(rng() % 4000));
    } else {
      // At any moment: start-up and recovery (which removes leftovers) included.
      usleep(static_cast<useconds_t>(rng() % 8000));
    }
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the child stopped by itself, exit code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ++kills;
    Record r;
    while (read(fds[0], &r, sizeof(r)) == sizeof(r)) records.push_back(r);
    close(fds[0]);
    bool has_in_flight = false;  // an intent without its ack
    Record in_flight;
    for (const Record& rec : records) {
      if (rec.ack == 0) {
        has_in_flight = true;
        in_flight = rec;
        continue;
      }
      ++acks_total;
      expected[rec.session] = {rec.op != kDelete, rec.tokens, rec.segments};
      has_in_flight = false;
    }

    StoreOptions options = TestOptions(dir.path());
    ASSERT_OK_AND_ASSIGN(auto store, StateStore::Create(options));
    RecoveryResult found = store->OpenAll();
    ASSERT_TRUE(found.errors.empty()) << found.errors[0].status;
    for (const SessionManifest& m : found.sessions) {
      bool ours = false;
      for (uint32_t s = 0; s < kSessions; ++s) ours |= m.meta.id == IdOf(s);
      ASSERT_TRUE(ours) << m.meta.id;
    }
    for (uint32_t s = 0; s < kSessions; ++s) {
      const SessionManifest* m = nullptr;
      for (const SessionManifest& x : found.sessions) {
        if (x.meta.id == IdOf(s)) m = &x;
      }
      Expected got;
      if (m != nullptr) {
        got = {true, static_cast<int64_t>(m->meta.tokens.size()), static_cast<uint32_t>(m->segments.size())};
        ASSERT_EQ(CheckSession(store.get(), *m, s), "") << "session " << s;  // bit for bit
      }
      const Expected acked = expected[s];
      if (Same(got, acked)) {
        if (has_in_flight && in_flight.session == s) ++in_flight_absent;
        continue;
      }
      // Only the operation in flight may differ from the acknowledged state, and then it
      // is there entirely.
      ASSERT_TRUE(has_in_flight && in_flight.session == s)
          << "session " << s << ": acknowledged " << acked.exists << "/" << acked.tokens << "/"
          << acked.segments << ", found " << got.exists << "/" << got.tokens << "/" << got.segments;
      Expected after{in_flight.op != kDelete, in_flight.tokens, in_flight.segments};
      ASSERT_TRUE(Same(got, after)) << "session " << s << " holds half an operation";
      expected[s] = after;  // the next child builds on it
      ++in_flight_present;
    }
  }
  EXPECT_GE(kills, 50);
  EXPECT_GT(acks_total, 200);
  std::cout << kills << " kills, " << acks_total << " acknowledged operations; the operation in "
            << "flight at a kill was found whole " << in_flight_present << " times, absent "
            << in_flight_absent << " times\n";
}

}  // namespace
}  // namespace echokv::state
