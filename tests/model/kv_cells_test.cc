// KvCells (tensor-free position bookkeeping) and the KvCache built on it: append,
// per-group selection, gather, clone, byte accounting, and that failed calls change
// nothing.
#include "model/kv_cells.h"

#include <ATen/ATen.h>

#include <vector>

#include "gtest/gtest.h"
#include "model/kv_cache.h"
#include "tests/testing/status_matchers.h"

namespace echokv::model {
namespace {

using ::echokv::testing::StatusIs;

TEST(KvCellsTest, AppendAllAddsTheSamePositionsToEveryGroup) {
  KvCells cells(2, 3);
  EXPECT_EQ(cells.size(0), 0);
  ASSERT_OK(cells.AppendAll(0, {0, 1, 2}));
  ASSERT_OK(cells.AppendAll(0, {5}));
  EXPECT_EQ(cells.size(0), 4);
  EXPECT_EQ(cells.size(1), 0);
  for (int g = 0; g < 3; ++g) EXPECT_EQ(cells.positions(0, g), (std::vector<int64_t>{0, 1, 2, 5}));
  EXPECT_EQ(cells.TotalEntries(), 4 * 3);
}

TEST(KvCellsTest, AppendRejectsNonIncreasingPositionsAndChangesNothing) {
  KvCells cells(1, 2);
  ASSERT_OK(cells.AppendAll(0, {3, 4}));
  const KvCells before = cells;
  EXPECT_THAT(cells.AppendAll(0, {4}), StatusIs(absl::StatusCode::kInvalidArgument, "not after position 4"));
  EXPECT_THAT(cells.AppendAll(0, {7, 6}), StatusIs(absl::StatusCode::kInvalidArgument, "strictly increasing"));
  EXPECT_THAT(cells.AppendAll(0, {-1}), StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  EXPECT_THAT(cells.AppendAll(1, {9}), StatusIs(absl::StatusCode::kOutOfRange, "layer 1"));
  EXPECT_TRUE(cells == before);
}

TEST(KvCellsTest, SelectKeepsDifferentEntriesPerGroup) {
  KvCells cells(1, 2);
  ASSERT_OK(cells.AppendAll(0, {10, 11, 12, 13, 14}));
  ASSERT_OK(cells.Select(0, {{0, 2, 4}, {1, 3, 4}}));
  EXPECT_EQ(cells.size(0), 3);
  EXPECT_EQ(cells.positions(0, 0), (std::vector<int64_t>{10, 12, 14}));
  EXPECT_EQ(cells.positions(0, 1), (std::vector<int64_t>{11, 13, 14}));
  // A later append continues after each group's last position.
  ASSERT_OK(cells.AppendAll(0, {15}));
  EXPECT_EQ(cells.positions(0, 1), (std::vector<int64_t>{11, 13, 14, 15}));
}

TEST(KvCellsTest, SelectValidatesIndicesAndChangesNothingOnError) {
  KvCells cells(1, 2);
  ASSERT_OK(cells.AppendAll(0, {0, 1, 2, 3}));
  const KvCells before = cells;
  EXPECT_THAT(cells.Select(0, {{0, 1}}), StatusIs(absl::StatusCode::kInvalidArgument, "2 groups"));
  EXPECT_THAT(cells.Select(0, {{0, 1}, {0}}), StatusIs(absl::StatusCode::kInvalidArgument, "same count"));
  EXPECT_THAT(cells.Select(0, {{0, 4}, {0, 1}}), StatusIs(absl::StatusCode::kOutOfRange, "index 4"));
  EXPECT_THAT(cells.Select(0, {{1, 1}, {0, 1}}), StatusIs(absl::StatusCode::kInvalidArgument, "ascending"));
  EXPECT_THAT(cells.Select(0, {{2, 1}, {0, 1}}), StatusIs(absl::StatusCode::kInvalidArgument, "ascending"));
  EXPECT_TRUE(cells == before);
}

// K/V row r of group g holds the value 100*g + position, so gathers are checkable.
at::Tensor Rows(int groups, const std::vector<int64_t>& positions, int d) {
  at::Tensor t = at::empty({groups, static_cast<int64_t>(positions.size()), d}, at::kFloat);
  for (int g = 0; g < groups; ++g)
    for (size_t i = 0; i < positions.size(); ++i) t[g][i].fill_(100.0 * g + positions[i]);
  return t;
}

TEST(KvCacheTest, AppendGrowsAndKeepsContents) {
  KvCache cache(2, 2, 4, at::kFloat);
  for (int64_t p = 0; p < 40; ++p) {  // crosses several capacity doublings
    for (int l = 0; l < 2; ++l) ASSERT_OK(cache.Append(l, Rows(2, {p}, 4), Rows(2, {p}, 4) * 2, {p}));
    cache.set_next_position(p + 1);
  }
  EXPECT_EQ(cache.size(0), 40);
  EXPECT_EQ(cache.next_position(), 40);
  EXPECT_TRUE(at::equal(cache.keys(1), Rows(2, [] {
                          std::vector<int64_t> v(40);
                          for (int i = 0; i < 40; ++i) v[i] = i;
                          return v;
                        }(), 4)));
  EXPECT_EQ(cache.values(0)[1][7][0].item<float>(), 2 * 107.0f);
  // §7 accounting: 2 (K and V) * layers * G * n * d * 4 bytes.
  EXPECT_EQ(cache.KvBytes(), 2 * 2 * 2 * 40 * 4 * 4);
  EXPECT_EQ(cache.FullEquivalentKvBytes(40), cache.KvBytes());
  EXPECT_EQ(cache.PositionBytes(), 2 * 2 * 40 * 8);
}

TEST(KvCacheTest, FailedAppendChangesNothing) {
  KvCache cache(1, 2, 4, at::kFloat);
  ASSERT_OK(cache.Append(0, Rows(2, {0, 1}, 4), Rows(2, {0, 1}, 4), {0, 1}));
  EXPECT_THAT(cache.Append(0, Rows(2, {1}, 4), Rows(2, {1}, 4), {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not after"));
  EXPECT_THAT(cache.Append(0, Rows(3, {2}, 4), Rows(2, {2}, 4), {2}),
              StatusIs(absl::StatusCode::kInvalidArgument, "shape"));
  EXPECT_EQ(cache.size(0), 2);
  EXPECT_TRUE(at::equal(cache.keys(0), Rows(2, {0, 1}, 4)));
}

TEST(KvCacheTest, GatherKeepsPerGroupEntriesAndPositions) {
  KvCache cache(2, 2, 3, at::kFloat);
  const std::vector<int64_t> pos = {0, 1, 2, 3, 4, 5};
  for (int l = 0; l < 2; ++l) ASSERT_OK(cache.Append(l, Rows(2, pos, 3), Rows(2, pos, 3), pos));
  cache.set_next_position(6);
  std::vector<at::Tensor> idx = {at::tensor({0, 3, 5, 1, 2, 4}, at::kLong).view({2, 3}),
                                 at::tensor({4, 5, 0, 1}, at::kLong).view({2, 2})};
  ASSERT_OK_AND_ASSIGN(KvCache g, KvCache::Gather(cache, idx));
  EXPECT_EQ(g.size(0), 3);
  EXPECT_EQ(g.size(1), 2);  // layers may keep different counts
  EXPECT_EQ(g.next_position(), 6);
  EXPECT_EQ(g.cells().positions(0, 0), (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(g.cells().positions(0, 1), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(g.keys(0)[1][2][0].item<float>(), 104.0f);  // group 1, position 4
  EXPECT_EQ(g.values(1)[0][1][2].item<float>(), 5.0f);
  EXPECT_TRUE(at::equal(g.positions(0), at::tensor({0, 3, 5, 1, 2, 4}, at::kLong).view({2, 3})));
  EXPECT_EQ(g.KvBytes(), 2 * 2 * (3 + 2) * 3 * 4);
  // Appending to the gathered cache continues every group at position 6.
  ASSERT_OK(g.Append(1, Rows(2, {6}, 3), Rows(2, {6}, 3), {6}));
  EXPECT_EQ(g.cells().positions(1, 0), (std::vector<int64_t>{4, 5, 6}));
  // The source is untouched.
  EXPECT_EQ(cache.size(0), 6);
  // Bad indices are rejected.
  std::vector<at::Tensor> bad = {at::tensor({0, 9, 1, 2}, at::kLong).view({2, 2}), idx[1]};
  EXPECT_THAT(KvCache::Gather(cache, bad).status(), StatusIs(absl::StatusCode::kOutOfRange, "index 9"));
  EXPECT_THAT(KvCache::Gather(cache, {idx[0]}).status(), StatusIs(absl::StatusCode::kInvalidArgument, "2 layers"));
}

TEST(KvCacheTest, CloneIsDeepAndAppendRowMatchesAppend) {
  KvCache a(1, 2, 4, at::kFloat);
  ASSERT_OK(a.Append(0, Rows(2, {0}, 4), Rows(2, {0}, 4), {0}));
  KvCache b = a.Clone();
  std::vector<float> k(2 * 4), v(2 * 4);
  for (int g = 0; g < 2; ++g)
    for (int i = 0; i < 4; ++i) k[g * 4 + i] = v[g * 4 + i] = 100.0f * g + 1;
  ASSERT_OK(b.AppendRow(0, k.data(), v.data(), 1));
  ASSERT_OK(a.Append(0, Rows(2, {1}, 4), Rows(2, {1}, 4), {1}));
  EXPECT_TRUE(at::equal(a.keys(0), b.keys(0)));
  EXPECT_TRUE(a.cells() == b.cells());
  ASSERT_OK(b.AppendRow(0, k.data(), v.data(), 2));
  EXPECT_EQ(a.size(0), 2);  // the clone's appends do not reach the original
  EXPECT_EQ(b.size(0), 3);
  EXPECT_THAT(b.AppendRow(0, k.data(), v.data(), 2), StatusIs(absl::StatusCode::kInvalidArgument, "not after"));
  EXPECT_EQ(b.size(0), 3);
}

TEST(KvCacheTest, AppendTailCarriesTheLastEntriesOntoAnotherView) {
  KvCache src(1, 2, 2, at::kFloat);
  ASSERT_OK(src.Append(0, Rows(2, {0, 1, 2, 3}, 2), Rows(2, {0, 1, 2, 3}, 2), {0, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(KvCache view, KvCache::Gather(src, {at::tensor({0, 2, 1, 3}, at::kLong).view({2, 2})}));
  ASSERT_OK(view.Append(0, Rows(2, {10, 11}, 2), Rows(2, {10, 11}, 2), {10, 11}));  // "lookahead"
  view.set_next_position(12);
  ASSERT_OK_AND_ASSIGN(KvCache other, KvCache::Gather(src, {at::tensor({3, 0}, at::kLong).view({2, 1})}));
  ASSERT_OK(other.AppendTail(view, 2));
  EXPECT_EQ(other.next_position(), 12);
  EXPECT_EQ(other.cells().positions(0, 0), (std::vector<int64_t>{3, 10, 11}));
  EXPECT_EQ(other.cells().positions(0, 1), (std::vector<int64_t>{0, 10, 11}));
  EXPECT_EQ(other.keys(0)[1][2][0].item<float>(), 111.0f);
  // Tails that differ between groups cannot be carried; too many entries neither.
  EXPECT_THAT(other.AppendTail(view, 3), StatusIs(absl::StatusCode::kInvalidArgument, "differ between groups"));
  EXPECT_THAT(other.AppendTail(view, 9), StatusIs(absl::StatusCode::kOutOfRange, "9 entries"));
}

}  // namespace
}  // namespace echokv::model
