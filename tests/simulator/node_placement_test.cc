// simulator/node_placement.h: a node starts its gap after its predecessor's end, never before its
// predecessor's start; the overlap a tiny predecessor cannot take carries to the next node.
#include "simulator/node_placement.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace twinstep {
namespace {

struct Placed {
  std::vector<int64_t> starts;
  int64_t end = 0;    // the last node's end, the carry left taken (as the simulator does)
  int64_t carry = 0;  // the carry left before it was taken
};

Placed place_all(int64_t start, const std::vector<int64_t>& durs, int64_t gap_ns) {
  Placed p;
  int64_t t = start, prev = 0;
  for (size_t i = 0; i < durs.size(); ++i) {
    prev = place_node(t, gap_ns, p.carry, i > 0, prev);
    p.starts.push_back(prev);
    t = prev + durs[i];
  }
  p.end = t + p.carry;
  return p;
}

// Hand-worked: qkv 5000 ns, rope 836, kv_append 186, attention 9326, o 4608, gap -592 (the
// EP2 shard's PDL overlap). Without the clamp attention would start at 5000 - 592 + 836 - 592 +
// 186 - 592 = 4246, before kv_append (4652); it starts with kv_append and the 406 ns it could not
// take come off o_proj's start.
TEST(NodePlacement, ATinyPredecessorPassesItsOverlapOn) {
  const Placed p = place_all(592, {5000, 836, 186, 9326, 4608}, -592);  // qkv starts at 0
  EXPECT_EQ(p.starts, (std::vector<int64_t>{0, 4408, 4652, 4652, 13978 - 592 - 406}));
  EXPECT_EQ(p.carry, 0);
  // The plain sum: 5 kernels, 4 gaps after the first node's.
  EXPECT_EQ(p.end, 5000 + 836 + 186 + 9326 + 4608 + 5 * -592 + 592);
}

TEST(NodePlacement, PositiveAndSmallGapsAreThePlainSum) {
  const Placed p = place_all(100, {10, 20, 30}, 5);
  EXPECT_EQ(p.starts, (std::vector<int64_t>{105, 120, 145}));
  const Placed q = place_all(0, {100, 100, 100}, -40);
  EXPECT_EQ(q.starts, (std::vector<int64_t>{-40, 20, 80}));
}

// Property: for random durations and gaps, starts never decrease, and the end with the carry
// taken is the plain sum (so collectives' arrivals and a launch's end do not move).
TEST(NodePlacement, StartsNeverGoBackAndTheSumIsKept) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + int(rng() % 40);
    std::vector<int64_t> durs;
    int64_t plain = 0;
    for (int i = 0; i < n; ++i) durs.push_back(int64_t(rng() % 3000));
    const int64_t gap = int64_t(rng() % 2000) - 1500;
    for (int i = 0; i < n; ++i) plain += durs[size_t(i)] + gap;
    const Placed p = place_all(0, durs, gap);
    for (size_t i = 1; i < p.starts.size(); ++i) ASSERT_GE(p.starts[i], p.starts[i - 1]);
    ASSERT_LE(p.carry, 0);
    ASSERT_EQ(p.end, plain);
  }
}

}  // namespace
}  // namespace twinstep
