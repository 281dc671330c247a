// Every rank's timeline in a tensor-parallel real run's stored record (experiments/tp_run.h):
// the bytes that carry a rank's spans to rank 0, the clock offset from matching launches, and
// the append that renumbers flows. CPU only; values checked by hand.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "experiments/tp_run.h"
#include "policies/error.h"

namespace twinstep {
namespace {

constexpr int64_t k2p31 = int64_t(1) << 31;  // past int32 and float's 24-bit mantissa
constexpr int64_t k2p53 = int64_t(1) << 53;  // past double's 53-bit mantissa

size_t count_of(const std::string& bytes, const std::string& what) {
  size_t n = 0;
  for (size_t at = bytes.find(what); at != std::string::npos; at = bytes.find(what, at + 1)) ++n;
  return n;
}

TEST(TpTrace, PackUnpackIsExactAndSetsTheSourceRank) {
  std::string dynamic_name = "rank_local_kernel";  // no static storage: unpack must copy it
  const std::vector<TimelineSpan> spans = {
      {0, Lane::kHost, "launch_graph", 7, k2p31, 1, 1},
      {0, Lane::kCompute, "decode_graph", 7, k2p31 + 1, k2p31 - 1, 1},
      {0, Lane::kCompute, "decode_graph", k2p53 + 1, k2p53 + 1, k2p53 - 1, k2p53 + 3},
      {0, Lane::kCopy, "d2h_outputs", -1, -k2p31 - 5, 0, 2},
      {0, Lane::kCompute, dynamic_name.c_str(), std::numeric_limits<int64_t>::max(),
       std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 0},
  };
  const std::string bytes = pack_timeline(spans);
  // The name table holds each name once: "decode_graph" is used by two spans.
  EXPECT_EQ(count_of(bytes, "decode_graph"), 1u);
  EXPECT_EQ(count_of(bytes, "launch_graph"), 1u);
  dynamic_name = "overwritten_after_pack";

  const std::vector<TimelineSpan> back = unpack_timeline(bytes, 3);
  ASSERT_EQ(back.size(), 5u);
  for (const TimelineSpan& t : back) EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(back[0].lane, Lane::kHost);
  EXPECT_STREQ(back[0].name, "launch_graph");
  EXPECT_EQ(back[0].step, 7);
  EXPECT_EQ(back[0].start_ns, 2147483648);
  EXPECT_EQ(back[0].dur_ns, 1);
  EXPECT_EQ(back[0].flow, 1);
  EXPECT_EQ(back[1].lane, Lane::kCompute);
  EXPECT_EQ(back[1].start_ns, 2147483649);
  EXPECT_EQ(back[1].dur_ns, 2147483647);
  // 2^53 + 1 and 2^53 + 3 are not doubles: a float or double on the way would have rounded them.
  EXPECT_EQ(back[2].step, 9007199254740993);
  EXPECT_EQ(back[2].start_ns, 9007199254740993);
  EXPECT_EQ(back[2].dur_ns, 9007199254740991);
  EXPECT_EQ(back[2].flow, 9007199254740995);
  EXPECT_EQ(back[3].lane, Lane::kCopy);
  EXPECT_EQ(back[3].step, -1);
  EXPECT_EQ(back[3].start_ns, -2147483653);
  EXPECT_EQ(back[3].dur_ns, 0);
  EXPECT_EQ(back[3].flow, 2);
  EXPECT_STREQ(back[4].name, "rank_local_kernel");
  EXPECT_EQ(back[4].step, 9223372036854775807);
  EXPECT_EQ(back[4].start_ns, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(back[4].dur_ns, 9223372036854775807);
  EXPECT_EQ(back[4].flow, 0);
  // Shared names share one interned pointer; distinct names do not.
  EXPECT_EQ(back[1].name, back[2].name);
  EXPECT_NE(back[1].name, back[0].name);
  EXPECT_NE(back[4].name, dynamic_name.c_str());
}

TEST(TpTrace, EmptyTimelineAndMalformedBytes) {
  EXPECT_TRUE(unpack_timeline(pack_timeline({}), 1).empty());
  const std::string bytes = pack_timeline({{0, Lane::kCompute, "decode_graph", 1, 2, 3, 4}});
  EXPECT_THROW(unpack_timeline(std::string_view(bytes).substr(0, bytes.size() - 1), 1), Error);
  EXPECT_THROW(unpack_timeline(bytes + "x", 1), Error);
  EXPECT_THROW(unpack_timeline("", 1), Error);
}

// Rank 1's clock runs 3 s (3e9 ns, past 2^31) behind rank 0's. Its launches start later (its
// host launched late: 200 ns, 900 ns) but end with rank 0's (after the last all-reduce), except
// the prefill, which ends 50 ns later.
TEST(TpTrace, OffsetIsTheMedianOfMatchingLaunchEnds) {
  constexpr int64_t kBehind = 3'000'000'000;
  const std::vector<TimelineSpan> rank0 = {
      {0, Lane::kHost, "launch_graph", 5, 900, 50, 2},  // host lane: not a GPU end
      {0, Lane::kCompute, "prefill", 4, 0, 800, 1},
      {0, Lane::kCompute, "decode_graph", 5, 1000, 4000, 2},   // end 5000
      {0, Lane::kCompute, "qkv_proj", 5, 1000, 100, 0},        // node span (flow 0): ignored
      {0, Lane::kCompute, "decode_graph", 6, 6000, 4000, 3},   // end 10000
      {0, Lane::kCompute, "decode_graph", 6, 11000, 4000, 4},  // end 15000
      {0, Lane::kCompute, "decode_eager", 9, 0, 1, 9},         // not on rank 1
  };
  const std::vector<TimelineSpan> rank1 = {
      {1, Lane::kHost, "launch_graph", 5, 77, 1, 2},
      {1, Lane::kCompute, "qkv_proj", 5, -999'999, 1, 0},
      // Listed in reverse start order: matched by start order within (step, name).
      {1, Lane::kCompute, "decode_graph", 6, 11000 - kBehind, 4000, 4},  // end 15000 - B
      {1, Lane::kCompute, "decode_graph", 6, 6900 - kBehind, 3100, 3},   // end 10000 - B
      {1, Lane::kCompute, "decode_graph", 5, 1200 - kBehind, 3800, 2},   // end 5000 - B
      {1, Lane::kCompute, "prefill", 4, 0 - kBehind, 850, 1},            // end 850 - B
  };
  // Differences: prefill 800 - (850 - B) = B - 50; the three decodes B each. Median: B.
  EXPECT_EQ(timeline_offset_ns(rank0, rank1), std::optional<int64_t>(kBehind));
  // Mirrored: rank 0 onto rank 1's clock.
  EXPECT_EQ(timeline_offset_ns(rank1, rank0), std::optional<int64_t>(-kBehind));
}

TEST(TpTrace, OffsetOfAnEvenCountIsTheUpperMedianAndNoneWithoutCommonLaunches) {
  const std::vector<TimelineSpan> a = {{0, Lane::kCompute, "decode_graph", 1, 0, 100, 1},
                                       {0, Lane::kCompute, "decode_graph", 2, 200, 100, 2}};
  const std::vector<TimelineSpan> b = {{1, Lane::kCompute, "decode_graph", 1, 0, 90, 1},
                                       {1, Lane::kCompute, "decode_graph", 2, 200, 80, 2}};
  // Ends 100 vs 90 (10), 300 vs 280 (20): the upper of the two.
  EXPECT_EQ(timeline_offset_ns(a, b), std::optional<int64_t>(20));
  // Other steps, or launches under other names, or host spans only: nothing to align on.
  const std::vector<TimelineSpan> other_step = {{1, Lane::kCompute, "decode_graph", 3, 0, 1, 1}};
  const std::vector<TimelineSpan> other_name = {{1, Lane::kCompute, "prefill", 1, 0, 1, 1}};
  const std::vector<TimelineSpan> host_only = {{1, Lane::kHost, "decode_graph", 1, 0, 1, 1}};
  EXPECT_EQ(timeline_offset_ns(a, other_step), std::nullopt);
  EXPECT_EQ(timeline_offset_ns(a, other_name), std::nullopt);
  EXPECT_EQ(timeline_offset_ns(a, host_only), std::nullopt);
  EXPECT_EQ(timeline_offset_ns(a, {}), std::nullopt);
}

TEST(TpTrace, AppendShiftsStartsAndMovesFlowsPastTheTimelines) {
  std::vector<TimelineSpan> timeline = {{0, Lane::kHost, "launch_graph", 1, 10, 5, 3},
                                        {0, Lane::kCompute, "decode_graph", 1, 20, 50, 7},
                                        {0, Lane::kCompute, "qkv_proj", 1, 20, 5, 0}};
  const std::vector<TimelineSpan> rank1 = {
      {1, Lane::kHost, "launch_graph", 1, -k2p31, 5, 1},
      {1, Lane::kCompute, "decode_graph", 1, 100, 50, 2},
      {1, Lane::kCompute, "qkv_proj", 1, 100, 5, 0},
  };
  append_rank_timeline(timeline, rank1, k2p53);
  ASSERT_EQ(timeline.size(), 6u);
  // Rank 0's spans unchanged.
  EXPECT_EQ(timeline[0].start_ns, 10);
  EXPECT_EQ(timeline[0].flow, 3);
  EXPECT_EQ(timeline[1].flow, 7);
  // Rank 1's: start + 2^53, flows 1, 2 -> 8, 9 (past rank 0's largest, 7), flow 0 stays 0.
  EXPECT_EQ(timeline[3].rank, 1);
  EXPECT_EQ(timeline[3].start_ns, 9007197107257344);  // 2^53 - 2^31
  EXPECT_EQ(timeline[3].flow, 8);
  EXPECT_EQ(timeline[4].start_ns, 9007199254741092);  // 2^53 + 100
  EXPECT_EQ(timeline[4].dur_ns, 50);
  EXPECT_EQ(timeline[4].flow, 9);
  EXPECT_EQ(timeline[5].flow, 0);
  EXPECT_STREQ(timeline[5].name, "qkv_proj");
  // A third rank's flows move past both: 10, 11.
  append_rank_timeline(timeline, rank1, 0);
  EXPECT_EQ(timeline[6].flow, 10);
  EXPECT_EQ(timeline[7].flow, 11);
  EXPECT_EQ(timeline[7].start_ns, 100);
}

}  // namespace
}  // namespace twinstep
