// The scheduler with fake work (no model): every ready stream decodes every step, the
// prefill token budget, oldest-first prefill, round-robin phases, backpressure, and a
// simulated engine loop (a fake runner advancing fake jobs and streams) for fairness,
// cancellation mid-batch and streams finishing while others continue.
#include "server/engine/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

namespace echokv::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

JobView Prefill(uint64_t id, int64_t remaining) { return {id, JobView::Next::kPrefill, remaining}; }
JobView Phase(uint64_t id) { return {id, JobView::Next::kPhase, 0}; }
JobView Decode(uint64_t id) { return {id, JobView::Next::kDecode, 0}; }

TEST(SchedulerTest, OptionsValidateNamesTheField) {
  SchedulerOptions o;
  o.max_step_tokens = 0;
  EXPECT_THAT(std::string(o.Validate().message()), ::testing::HasSubstr("max_step_tokens"));
  o = SchedulerOptions();
  o.min_prefill_tokens = o.max_step_tokens + 1;
  EXPECT_THAT(std::string(o.Validate().message()), ::testing::HasSubstr("min_prefill_tokens"));
  o = SchedulerOptions();
  o.max_phase_jobs = 0;
  EXPECT_THAT(std::string(o.Validate().message()), ::testing::HasSubstr("max_phase_jobs"));
  EXPECT_TRUE(SchedulerOptions().Validate().ok());
}

TEST(SchedulerTest, EveryReadyStreamDecodesAndBackedUpStreamsAreSkipped) {
  Scheduler s(SchedulerOptions{});
  std::vector<StreamView> streams = {{1, true}, {2, false}, {3, true}};
  Plan p = s.Schedule(streams, {});
  EXPECT_THAT(p.decode_streams, ElementsAre(1, 3));
  EXPECT_THAT(p.prefill, IsEmpty());
  EXPECT_FALSE(p.empty());
  streams = {{2, false}};
  EXPECT_TRUE(s.Schedule(streams, {}).empty());
}

TEST(SchedulerTest, PrefillFillsTheBudgetLeftByDecodeRowsOldestFirst) {
  SchedulerOptions o;
  o.max_step_tokens = 100;
  o.min_prefill_tokens = 10;
  Scheduler s(o);
  std::vector<StreamView> streams;
  for (uint64_t i = 1; i <= 30; ++i) streams.push_back({i, true});
  // Jobs given out of order: the older (lower id) is served first.
  std::vector<JobView> jobs = {Prefill(50, 500), Prefill(40, 45), Decode(60)};
  Plan p = s.Schedule(streams, jobs);
  EXPECT_EQ(p.decode_streams.size(), 30u);
  EXPECT_THAT(p.decode_jobs, ElementsAre(60));
  // 100 - 31 rows = 69 prefill tokens: 45 to job 40 (all it needs), 24 to job 50.
  ASSERT_EQ(p.prefill.size(), 2u);
  EXPECT_EQ(p.prefill[0].job, 40u);
  EXPECT_EQ(p.prefill[0].tokens, 45);
  EXPECT_EQ(p.prefill[1].job, 50u);
  EXPECT_EQ(p.prefill[1].tokens, 24);
  EXPECT_EQ(p.tokens(), 100);
}

TEST(SchedulerTest, PrefillGetsItsMinimumUnderAFullDecodeBatch) {
  SchedulerOptions o;
  o.max_step_tokens = 16;
  o.min_prefill_tokens = 4;
  Scheduler s(o);
  std::vector<StreamView> streams;
  for (uint64_t i = 1; i <= 64; ++i) streams.push_back({i, true});
  std::vector<JobView> jobs = {Prefill(100, 1000)};
  Plan p = s.Schedule(streams, jobs);
  EXPECT_EQ(p.decode_streams.size(), 64u);  // never capped: no stream starves
  ASSERT_EQ(p.prefill.size(), 1u);
  EXPECT_EQ(p.prefill[0].tokens, 4);
}

TEST(SchedulerTest, PhasesRoundRobinOnePerStep) {
  Scheduler s(SchedulerOptions{});
  std::vector<JobView> jobs = {Phase(3), Phase(1), Phase(2)};
  std::vector<uint64_t> order;
  for (int i = 0; i < 6; ++i) {
    Plan p = s.Schedule({}, jobs);
    ASSERT_EQ(p.phase_jobs.size(), 1u);
    order.push_back(p.phase_jobs[0]);
  }
  EXPECT_THAT(order, ElementsAre(1, 2, 3, 1, 2, 3));
}

TEST(SchedulerTest, WaitingJobsGetNothing) {
  Scheduler s(SchedulerOptions{});
  std::vector<JobView> jobs = {{7, JobView::Next::kWaiting, 0}, Prefill(8, 0)};
  EXPECT_TRUE(s.Schedule({}, jobs).empty());
}

// ---- a simulated engine loop: the scheduler + a fake runner ----

struct FakeStream {
  uint64_t id;
  int tokens_left;        // finishes after this many decode steps
  bool backed_up = false;
  bool cancelled = false;
  int decoded = 0;
  std::vector<int> steps = {};  // the step numbers at which it decoded
};
struct FakeJob {
  uint64_t id;
  int64_t prefill_left;
  int phases_left;
  int decodes_left;       // lookahead rows, one per step, between phases
  bool cancelled = false;
};

// Runs steps until everything is done; returns the number of steps. Cancelled work is
// removed before each step (the engine's DropCancelled), finished work after it.
struct Sim {
  Scheduler sched;
  std::vector<FakeStream> streams;
  std::vector<FakeJob> jobs;
  std::vector<int64_t> step_tokens;  // tokens each step ran
  int step = 0;

  explicit Sim(const SchedulerOptions& o) : sched(o) {}

  void RunStep(const std::function<void(Sim&)>& mid_batch = nullptr) {
    streams.erase(std::remove_if(streams.begin(), streams.end(), [](const FakeStream& s) { return s.cancelled; }),
                  streams.end());
    jobs.erase(std::remove_if(jobs.begin(), jobs.end(), [](const FakeJob& j) { return j.cancelled; }), jobs.end());
    std::vector<StreamView> sv;
    for (const FakeStream& s : streams) sv.push_back({s.id, !s.backed_up});
    std::vector<JobView> jv;
    for (const FakeJob& j : jobs) {
      JobView v{j.id, JobView::Next::kWaiting, j.prefill_left};
      if (j.prefill_left > 0) {
        v.next = JobView::Next::kPrefill;
      } else if (j.decodes_left > 0) {
        v.next = JobView::Next::kDecode;
      } else if (j.phases_left > 0) {
        v.next = JobView::Next::kPhase;
      }
      jv.push_back(v);
    }
    Plan p = sched.Schedule(sv, jv);
    if (mid_batch) mid_batch(*this);  // e.g. a cancel arriving while the batch runs
    ++step;
    step_tokens.push_back(p.tokens());
    for (uint64_t id : p.decode_streams) {
      for (FakeStream& s : streams) {
        if (s.id == id && !s.cancelled) {
          ++s.decoded;
          --s.tokens_left;
          s.steps.push_back(step);
        }
      }
    }
    for (uint64_t id : p.decode_jobs) {
      for (FakeJob& j : jobs) {
        if (j.id == id) --j.decodes_left;
      }
    }
    for (const Plan::PrefillSlice& sl : p.prefill) {
      for (FakeJob& j : jobs) {
        if (j.id == sl.job) j.prefill_left -= sl.tokens;
      }
    }
    for (uint64_t id : p.phase_jobs) {
      for (FakeJob& j : jobs) {
        if (j.id == id) --j.phases_left;
      }
    }
    streams.erase(std::remove_if(streams.begin(), streams.end(), [](const FakeStream& s) { return s.tokens_left <= 0; }),
                  streams.end());
    jobs.erase(std::remove_if(jobs.begin(), jobs.end(),
                              [](const FakeJob& j) { return j.prefill_left <= 0 && j.phases_left <= 0 && j.decodes_left <= 0; }),
               jobs.end());
  }
};

TEST(SchedulerSimTest, StreamsDecodeEveryStepWhileALongPrefillRuns) {
  SchedulerOptions o;
  o.max_step_tokens = 64;
  o.min_prefill_tokens = 8;
  Sim sim(o);
  for (uint64_t i = 1; i <= 16; ++i) sim.streams.push_back({i, 20});
  sim.jobs.push_back({100, 4000, 3, 8});
  std::map<uint64_t, std::vector<int>> steps_of;
  while (!sim.streams.empty()) {
    sim.RunStep();
    for (const FakeStream& s : sim.streams) steps_of[s.id] = s.steps;
  }
  // Every stream decoded at steps 1..19 without a gap (it left the list at step 20).
  for (const auto& [id, steps] : steps_of) {
    ASSERT_EQ(steps.size(), 19u) << "stream " << id;
    for (size_t k = 0; k < steps.size(); ++k) EXPECT_EQ(steps[k], static_cast<int>(k) + 1);
  }
  for (int64_t t : sim.step_tokens) EXPECT_LE(t, 64);
  while (!sim.jobs.empty()) sim.RunStep();
}

TEST(SchedulerSimTest, AStreamFinishingLeavesTheOthersRunning) {
  Sim sim(SchedulerOptions{});
  sim.streams = {{1, 3}, {2, 10}, {3, 6}};
  int steps = 0;
  std::vector<size_t> live;
  while (!sim.streams.empty()) {
    sim.RunStep();
    live.push_back(sim.streams.size());
    ++steps;
  }
  EXPECT_EQ(steps, 10);
  EXPECT_THAT(std::vector<size_t>(live.begin(), live.begin() + 6), ElementsAre(3, 3, 2, 2, 2, 1));
}

TEST(SchedulerSimTest, CancellationMidBatchDropsOnlyTheCancelledStreamNextStep) {
  Sim sim(SchedulerOptions{});
  sim.streams = {{1, 100}, {2, 100}, {3, 100}};
  sim.RunStep();
  // A cancel arrives while step 2's batch runs: the cancelled stream still gets this
  // step's row planned but its output is dropped, and it is gone from step 3 on.
  sim.RunStep([](Sim& s) { s.streams[1].cancelled = true; });
  sim.RunStep();
  ASSERT_EQ(sim.streams.size(), 2u);
  EXPECT_EQ(sim.streams[0].id, 1u);
  EXPECT_EQ(sim.streams[1].id, 3u);
  EXPECT_EQ(sim.streams[0].decoded, 3);
  EXPECT_EQ(sim.streams[1].decoded, 3);
}

TEST(SchedulerSimTest, BackedUpReaderIsSkippedUntilItCatchesUpOthersUnaffected) {
  Sim sim(SchedulerOptions{});
  sim.streams = {{1, 100}, {2, 100}};
  sim.streams[1].backed_up = true;
  for (int i = 0; i < 5; ++i) sim.RunStep();
  EXPECT_EQ(sim.streams[0].decoded, 5);
  EXPECT_EQ(sim.streams[1].decoded, 0);
  sim.streams[1].backed_up = false;
  sim.RunStep();
  EXPECT_EQ(sim.streams[1].decoded, 1);
  EXPECT_EQ(sim.streams[0].decoded, 6);
}

TEST(SchedulerSimTest, TwoPrefillJobsBothFinishAndLookaheadRowsJoinTheBatch) {
  SchedulerOptions o;
  o.max_step_tokens = 32;
  o.min_prefill_tokens = 4;
  Sim sim(o);
  sim.jobs = {{1, 100, 2, 4}, {2, 40, 1, 0}};
  int steps = 0;
  while (!sim.jobs.empty() && steps < 100) {
    sim.RunStep();
    ++steps;
  }
  EXPECT_TRUE(sim.jobs.empty());
  // 140 prefill tokens at <= 32 per step, then job 1's 4 lookahead rows and 3 phases
  // (one per step): the run is bounded, never stuck.
  EXPECT_LE(steps, 140 / 32 + 1 + 4 + 3 + 2);
}

}  // namespace
}  // namespace echokv::server
