#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "policies/acceptance_spec.h"
#include "policies/decode_loop.h"
#include "policies/error.h"
#include "policies/rng.h"
#include "simulator/acceptance_model.h"
#include "simulator/sim_backend.h"
#include "tests/support/sim_fixtures.h"

namespace twinstep {
namespace {

using testing::kFloorNs;
using testing::kUs;

struct Result {
  RunRecord record;
  double accept_len = 0;  // committed tokens per verify, from the step samples
  double step_ns = 0;     // mean step duration over steps with a verify
  double idle_host_ns = 0;
};

Result simulate(const SpecSpec& spec, const AcceptanceSpec& acc, HostSchedule schedule,
                const HardwareSpec& hw, const HostCostSpec& costs, int32_t requests = 40,
                int32_t output_len = 400, int32_t concurrency = 1) {
  PolicySpec policy;
  policy.host_schedule = schedule;
  policy.spec = spec;
  WorkloadSpec w;
  w.input_len = {64, 64};
  w.output_len = {output_len, output_len};
  w.num_requests = requests;
  w.max_concurrency = concurrency;
  const std::vector<RequestSpec> reqs = generate_requests(w);
  Result r;
  DecodeLoop loop(policy, w, reqs, &r.record);
  HostCostModel host(costs, 1);
  SimOptions options;
  options.spec = spec;
  options.acceptance = acc;
  options.acceptance_seed = 99;
  SimBackend backend(model_preset("tiny-llama"), hw, host, reqs, options);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, r.record);
  int64_t tokens = 0, batch = 0, dur = 0, idle = 0, n = 0;
  for (const StepSample& s : r.record.steps) {
    if (s.batch == 0) continue;
    tokens += s.tokens;
    batch += s.batch;
    dur += s.dur_ns;
    idle += s.idle_host_ns;
    ++n;
  }
  r.accept_len = double(tokens) / double(batch);
  r.step_ns = double(dur) / double(n);
  r.idle_host_ns = double(idle) / double(n);
  return r;
}

SpecSpec chain(int32_t steps) {
  SpecSpec s;
  s.method = SpecMethod::kChain;
  s.steps = steps;
  s.draft_tokens = steps + 1;
  return s;
}

SpecSpec confidence(DraftMode mode, int32_t max_steps, double threshold) {
  SpecSpec s;
  s.method = SpecMethod::kConfidence;
  s.mode = mode;
  s.max_steps = max_steps;
  s.threshold = threshold;
  return s;
}

TEST(SpecSim, ChainCommitsEverythingOrNothing) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  EXPECT_DOUBLE_EQ(simulate(chain(5), {.accept_rate = 1.0}, HostSchedule::kRunahead,
                            testing::ideal_machine(), none)
                       .accept_len,
                   6.0);
  EXPECT_DOUBLE_EQ(simulate(chain(5), {.accept_rate = 0.0}, HostSchedule::kRunahead,
                            testing::ideal_machine(), none)
                       .accept_len,
                   1.0);
}

// Property: the mean committed tokens per verify of a chain matches Σ_{i=0}^{d} a^i.
TEST(SpecSim, ChainAcceptLengthMatchesAnalytic) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  for (double a : {0.3, 0.6, 0.85}) {
    const Result r = simulate(chain(5), {.accept_rate = a}, HostSchedule::kRunahead,
                              testing::ideal_machine(), none, 60, 600);
    EXPECT_NEAR(r.accept_len, chain_accept_len(a, 5), 0.02 * chain_accept_len(a, 5)) << a;
  }
}

// With a perfectly informative confidence (signal 1) and threshold 0.5 the device stops at the
// first token the target will reject, so it commits what a chain of max_steps would, while
// drafting no further than needed.
TEST(SpecSim, DeviceModeWithPerfectConfidence) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  const AcceptanceSpec acc{.accept_rate = 0.8, .decay = 1.0, .confidence_signal = 1.0};
  const Result dev = simulate(confidence(DraftMode::kDevice, 8, 0.5), acc, HostSchedule::kRunahead,
                              testing::ideal_machine(), none, 60, 600);
  EXPECT_NEAR(dev.accept_len, chain_accept_len(0.8, 8), 0.02 * chain_accept_len(0.8, 8));
  const Result ch =
      simulate(chain(8), acc, HostSchedule::kRunahead, testing::ideal_machine(), none, 60, 600);
  EXPECT_NEAR(dev.accept_len, ch.accept_len, 0.05 * ch.accept_len);
  EXPECT_LT(dev.step_ns, ch.step_ns);  // fewer draft forwards on average
}

// host_blocking: after the draft the host reads lengths, then schedules and prepares the verify;
// on the ideal machine the GPU idles exactly schedule + prepare per step, host-bound.
TEST(SpecSim, HostBlockingIdlesTheGpuForTheHostRoundTrip) {
  const HostCostSpec costs = testing::fixed_host_costs(30 * kUs, 40 * kUs, 20 * kUs);
  const AcceptanceSpec acc{.accept_rate = 0.7};
  const Result blocking = simulate(confidence(DraftMode::kHostBlocking, 6, 0.5), acc,
                                   HostSchedule::kRunahead, testing::ideal_machine(), costs);
  EXPECT_NEAR(blocking.idle_host_ns, 70.0 * kUs, 1.0 * kUs);
  const Result device = simulate(confidence(DraftMode::kDevice, 6, 0.5), acc,
                                 HostSchedule::kRunahead, testing::ideal_machine(), costs);
  EXPECT_NEAR(device.accept_len, blocking.accept_len, 1e-9);  // same drafts, same acceptance
  EXPECT_LT(device.idle_host_ns, 1.0 * kUs);
  EXPECT_NEAR(blocking.step_ns - device.step_ns, 70.0 * kUs, 2.0 * kUs);
}

// A draft round on the ideal machine: the NEXTN module is 1 + 3 prologue kernels (embedding,
// enorm, hnorm, eh_proj), one layer (10) and 2 epilogue kernels = 16 nodes per forward. A chain
// of 5 drafts runs 4 draft forwards, one verify (23 nodes) and one extend: the draft's KV pass,
// the 4 prologue kernels and the layer's attn_norm, qkv_proj, rope, kv_append (8 nodes).
TEST(SpecSim, ChainStepCostCountsForwards) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  const Result r = simulate(chain(5), {.accept_rate = 0.5}, HostSchedule::kRunahead,
                            testing::ideal_machine(), none, 4, 200);
  EXPECT_NEAR(r.step_ns, double((4 * 16 + 23 + 8) * kFloorNs), 1.0);
}

// Speculative graphs run every row of their batch bucket (Engine::bucket_for), row-exact: 3
// requests in a chain(4) round are priced as 4. On the ideal machine: 3 draft forwards of 16
// nodes, a verify of 4 x 5 = 20 rows (3 x 5 = 15 would be one launch each), two launches of
// each of the 8 projections and the LM head (23 + 9 nodes), and an extend of 20 rows (8 + 2
// nodes): 90 x the floor; 2 requests (bucket 2, 10 rows): 3 x 16 + 23 + 8 = 79.
TEST(SpecSim, RoundsArePricedAtTheBatchBucket) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  const AcceptanceSpec acc{.accept_rate = 0.5};
  for (const auto& [concurrency, nodes] : {std::pair{3, 90}, std::pair{4, 90}, std::pair{2, 79}}) {
    const Result r = simulate(chain(4), acc, HostSchedule::kRunahead, testing::ideal_machine(),
                              none, concurrency, 200, concurrency);
    int checked = 0;
    for (const StepSample& s : r.record.steps) {
      if (s.batch != concurrency || s.draft_len == 0) continue;
      EXPECT_EQ(s.dur_ns, nodes * kFloorNs) << concurrency << " requests, step " << s.step;
      ++checked;
    }
    EXPECT_GT(checked, 10) << concurrency << " requests";
  }
}

// Without early exit a device-decided draft runs every one of max_steps (stopped rows padded):
// 7 draft forwards for max 8 whatever the confidences; with it, only up to the longest draft.
TEST(SpecSim, DeviceDraftWithoutEarlyExitRunsEveryStep) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  SpecSpec all = confidence(DraftMode::kDevice, 8, 0.5);
  all.early_exit = false;
  const AcceptanceSpec acc{.accept_rate = 0.5, .confidence_signal = 1.0};
  const Result padded =
      simulate(all, acc, HostSchedule::kRunahead, testing::ideal_machine(), none, 4, 200);
  EXPECT_NEAR(padded.step_ns, double((7 * 16 + 23 + 8) * kFloorNs), 1.0);  // extend: KV pass
  const Result early = simulate(confidence(DraftMode::kDevice, 8, 0.5), acc,
                                HostSchedule::kRunahead, testing::ideal_machine(), none, 4, 200);
  EXPECT_LT(early.step_ns, padded.step_ns - 2.0 * 16 * kFloorNs);
  EXPECT_DOUBLE_EQ(early.accept_len, padded.accept_len);  // the same drafts
}

// Calibrated acceptance, hand-worked: two measured rounds of 4 drafts, A (all accepted, every
// confidence 0.9) and B (one accepted, confidences 0.9, 0.2, 0.9, 0.9).
AcceptanceSpec two_round_table() {
  auto t = std::make_shared<AcceptanceTable>();
  t->draft_len = 4;
  t->accepted = {4, 1};
  t->confidence = {0.9f, 0.9f, 0.9f, 0.9f, 0.9f, 0.2f, 0.9f, 0.9f};
  t->source = "a hand-made table";
  AcceptanceSpec a;
  a.calibrated = t;
  return a;
}

// align: position, hand-worked on one request's measured text of 4-draft rounds:
//   round 0: start 0, accepted 2 (tokens 0, 1 agreed; the draft missed token 2)
//   round 1: start 3, accepted 4 (tokens 3..6 agreed; token 7 is the bonus)
//   round 2: start 8, accepted 0 (missed token 8)
// Confidence of position q of round k: 0.1 k + 0.01 q.
AcceptanceSpec one_text_table() {
  auto t = std::make_shared<AcceptanceTable>();
  t->draft_len = 4;
  t->accepted = {2, 4, 0};
  t->request = {0, 0, 0};
  t->start = {0, 3, 8};
  for (int k = 0; k < 3; ++k)
    for (int q = 1; q <= 4; ++q) t->confidence.push_back(0.1f * float(k) + 0.01f * float(q));
  t->source = "a hand-made text";
  AcceptanceSpec a;
  a.calibrated = t;
  auto from = std::make_shared<AcceptanceSource>();
  from->align_position = true;
  a.calibrated_from = from;
  return a;
}

TEST(SpecSim, AlignedReplayFollowsTheMeasuredText) {
  AcceptanceModel m(one_text_table(), 1);
  auto agrees = [&](int32_t request, int64_t round, int32_t offset, int32_t positions) {
    std::vector<int> out;
    for (int32_t p = 1; p <= positions; ++p)
      out.push_back(m.draw(request, round, p, offset).agrees ? 1 : 0);
    return out;
  };
  // A round at the start replays round 0: two agree, then the miss at token 2.
  EXPECT_EQ(agrees(0, 0, 0, 3), (std::vector<int>{1, 1, 0}));
  // Past the miss the draft goes on from its wrong token 2, as round 0 did: its position 4
  // (0.04, no agreement), not round 1's first token (token 3 of the text: 0.11, agreed).
  EXPECT_FLOAT_EQ(m.draw(0, 0, 4, 0).confidence, 0.04f);
  EXPECT_FALSE(m.draw(0, 0, 4, 0).agrees);
  // Past round 0's last draft after its miss (position 5 from token 0): its last confidence.
  EXPECT_FLOAT_EQ(m.draw(0, 0, 5, 0).confidence, 0.04f);
  EXPECT_FALSE(m.draw(0, 0, 5, 0).agrees);
  // From token 1 (round 0's position 2): position 3 is round 0's position 4, 0.04.
  EXPECT_FLOAT_EQ(m.draw(0, 6, 3, 1).confidence, 0.04f);
  // Starting at token 1 (inside round 0): token 1 agrees, token 2 is the miss.
  EXPECT_EQ(agrees(0, 1, 1, 2), (std::vector<int>{1, 0}));
  // Starting at token 5: tokens 5, 6 agree; 7 is round 1's bonus (never drafted): round 2, which
  // starts after it, stands in with its first draft (a miss, 0.21); 8 is round 2's miss.
  EXPECT_EQ(agrees(0, 2, 5, 4), (std::vector<int>{1, 1, 0, 0}));
  // Confidence is the measured one at the same token: token 5 is round 1's position 3.
  EXPECT_FLOAT_EQ(m.draw(0, 3, 1, 5).confidence, 0.13f);
  EXPECT_FLOAT_EQ(m.draw(0, 4, 1, 7).confidence, 0.21f);  // the bonus: round 2's first
  // Past the measured text (token 9 on): no agreement.
  EXPECT_EQ(agrees(0, 5, 8, 3), (std::vector<int>{0, 0, 0}));
  // A round accepted whole hands on to the text: from token 5 (round 1's position 3), position 4
  // is token 8, past round 1's bonus: round 2's position 1 (0.21).
  EXPECT_FLOAT_EQ(m.draw(0, 7, 4, 5).confidence, 0.21f);
  // A round that begins past the text, or of a request the source never ran, replays in order:
  // one of the three rows from its own position 1 (row 0: 1,1,0; row 1: 1,1,1; row 2: 0,0,0).
  const std::vector<int> fallback = agrees(1, 0, 0, 3);
  EXPECT_TRUE(fallback == (std::vector<int>{1, 1, 0}) || fallback == (std::vector<int>{1, 1, 1}) ||
              fallback == (std::vector<int>{0, 0, 0}));
  // The same (request, round) keeps its alignment whatever offset later draws pass.
  EXPECT_EQ(agrees(0, 1, 99, 2), (std::vector<int>{1, 0}));
}

// A bonus token no round follows (the last round of a text accepted whole; here token 7 of a
// text whose round 2 was never measured) agrees at the table's rate for the simulated round's own
// depth: accepted {2, 4} give P(a >= q | a >= q - 1) = 1, 1, 1/2, 1 for q = 1 .. 4. Reached at
// position 2 (a round from token 6) it always agrees, at position 3 (from token 5) in half; a
// seeded draw per (request, round, position), so reruns repeat it; its confidence is round 1's
// last. With round 2 there (one_text_table), round 2's first draft stands in.
AcceptanceSpec two_round_text() {
  AcceptanceSpec a = one_text_table();
  auto t = std::make_shared<AcceptanceTable>(*a.calibrated);
  t->accepted.pop_back();
  t->request.pop_back();
  t->start.pop_back();
  t->confidence.resize(8);
  a.calibrated = t;
  return a;
}

TEST(SpecSim, AlignedReplayDrawsALastBonusTokenAtTheTablesRate) {
  AcceptanceModel m(two_round_text(), 1);
  int from6 = 0, from5 = 0;
  constexpr int kRounds = 4000;
  for (int64_t k = 0; k < kRounds; ++k) {
    from6 += m.draw(0, 3 * k, 2, 6).agrees;
    from5 += m.draw(0, 3 * k + 2, 3, 5).agrees;
  }
  EXPECT_EQ(from6, kRounds);
  EXPECT_NEAR(double(from5) / kRounds, 0.5, 0.03);
  EXPECT_FLOAT_EQ(m.draw(0, 1, 3, 5).confidence, 0.14f);
  AcceptanceModel again(two_round_text(), 1);
  for (int64_t k = 0; k < 50; ++k)
    EXPECT_EQ(again.draw(0, 3 * k + 2, 3, 5).agrees, m.draw(0, 3 * k + 2, 3, 5).agrees);
  // With round 2 measured, every draw at token 7 is round 2's first: a miss.
  AcceptanceModel full(one_text_table(), 1);
  for (int64_t k = 0; k < 50; ++k) EXPECT_FALSE(full.draw(0, k, 2, 6).agrees);
}

// bonus_from's measured tokens come first at a bonus token: token 7 (round 1's bonus) drafted by
// a second run as agreeing with confidence 0.9; token 8 stays round 2's (the source drafted it).
TEST(SpecSim, AlignedReplayTakesABonusTokenFromTheSecondRun) {
  AcceptanceSpec a = one_text_table();
  auto t = std::make_shared<AcceptanceTable>(*a.calibrated);
  t->drafted[AcceptanceTable::drafted_key(0, 7)] = {true, 0.9f};
  t->drafted[AcceptanceTable::drafted_key(0, 8)] = {true, 0.8f};
  a.calibrated = t;
  AcceptanceModel m(a, 1);
  EXPECT_TRUE(m.draw(0, 0, 1, 7).agrees);
  EXPECT_FLOAT_EQ(m.draw(0, 0, 1, 7).confidence, 0.9f);
  EXPECT_FALSE(m.draw(0, 0, 2, 7).agrees);  // token 8: round 2's miss
  EXPECT_FLOAT_EQ(m.draw(0, 0, 2, 7).confidence, 0.21f);
  // Without it, round 2's first draft stands in for token 7 (a miss).
  AcceptanceModel plain(one_text_table(), 1);
  EXPECT_FALSE(plain.draw(0, 0, 1, 7).agrees);
}

// Without align the same table replays its rows in order, ignoring the offset.
TEST(SpecSim, UnalignedReplayIgnoresTheOffset) {
  AcceptanceSpec a = one_text_table();
  auto from = std::make_shared<AcceptanceSource>();
  a.calibrated_from = from;  // align_position false
  AcceptanceModel m(a, 1);
  for (int64_t round = 0; round < 6; ++round) {
    const bool first = m.draw(0, round, 1, 5).agrees;
    const bool third = m.draw(0, round, 3, 5).agrees;
    // Row 0 (1,1,0), row 1 (1,1,1) or row 2 (0,0,0) from its position 1, never a shifted row.
    EXPECT_TRUE((first && !third) || (first && third) || (!first && !third));
  }
}

// A chain of 3 replays A as 3 accepted drafts (4 tokens) and B as 1 (2 tokens): every simulated
// round is one of the two, and they come up about equally often.
TEST(SpecSim, CalibratedChainReplaysMeasuredRounds) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  const Result r = simulate(chain(3), two_round_table(), HostSchedule::kRunahead,
                            testing::ideal_machine(), none, 20, 400);
  int64_t a = 0, b = 0;
  for (const DraftRound& d : r.record.rounds) {
    ASSERT_EQ(d.draft_len, 3);
    ASSERT_EQ(d.confidence.size(), 3u);
    if (d.accepted == 3) {
      EXPECT_EQ(d.confidence, (std::vector<float>{0.9f, 0.9f, 0.9f}));
      ++a;
    } else {
      ASSERT_EQ(d.accepted, 1);
      EXPECT_EQ(d.confidence, (std::vector<float>{0.9f, 0.2f, 0.9f}));
      ++b;
    }
  }
  const double n = double(a + b);
  ASSERT_GT(n, 1000);
  EXPECT_NEAR(double(a) / n, 0.5, 4 * 0.5 / std::sqrt(n));  // binomial, 4 sigma
  // The step samples count the same commits: mean tokens per verify = (4a + 2b) / n.
  EXPECT_NEAR(r.accept_len, (4.0 * double(a) + 2.0 * double(b)) / n, 0.02);
}

// Confidence-scheduled with threshold 0.5: A drafts all 4 (5 tokens), B stops after the 0.2
// (2 drafts proposed, 1 accepted: 2 tokens). Deterministic for the seed.
TEST(SpecSim, CalibratedConfidenceStopsWhereTheMeasuredConfidenceFalls) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  const Result r = simulate(confidence(DraftMode::kDevice, 4, 0.5), two_round_table(),
                            HostSchedule::kRunahead, testing::ideal_machine(), none, 8, 200);
  ASSERT_FALSE(r.record.rounds.empty());
  for (const DraftRound& d : r.record.rounds) {
    if (d.draft_len == 4) {
      EXPECT_EQ(d.accepted, 4);
    } else {
      EXPECT_EQ(d.draft_len, 2);
      EXPECT_EQ(d.accepted, 1);
    }
  }
  const Result again = simulate(confidence(DraftMode::kDevice, 4, 0.5), two_round_table(),
                                HostSchedule::kRunahead, testing::ideal_machine(), none, 8, 200);
  ASSERT_EQ(again.record.rounds.size(), r.record.rounds.size());
  for (size_t i = 0; i < r.record.rounds.size(); ++i) {
    EXPECT_EQ(again.record.rounds[i].accepted, r.record.rounds[i].accepted);
    EXPECT_EQ(again.record.rounds[i].request, r.record.rounds[i].request);
  }
}

// Property: over a random measured table, a simulated chain of d commits, per verify, the
// table's mean of min(accepted, d) + 1 (AcceptanceTable::chain_accept_len), for every d up to
// the measured length; the walk over the table leaves no sampling noise beyond partial coverage.
TEST(SpecSim, CalibratedChainMeanIsTheTableMean) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  auto t = std::make_shared<AcceptanceTable>();
  t->draft_len = 8;
  for (uint64_t k = 0; k < 300; ++k) {
    t->accepted.push_back(int32_t(rng_key(5, 1, k) % 9));
    for (int32_t i = 0; i < 8; ++i) t->confidence.push_back(float(rng_uniform(5, 2, k * 8 + i)));
  }
  AcceptanceSpec acc;
  acc.calibrated = t;
  for (int32_t d : {1, 3, 5, 8}) {
    const Result r =
        simulate(chain(d), acc, HostSchedule::kRunahead, testing::ideal_machine(), none, 40, 600);
    double sum = 0;
    for (const DraftRound& round : r.record.rounds) sum += round.accepted + 1;
    const double mean = sum / double(r.record.rounds.size());
    EXPECT_GT(r.record.rounds.size(), 2 * t->rounds()) << d;
    EXPECT_NEAR(mean, t->chain_accept_len(d), 0.03) << d;
  }
}

// A policy drafting past the measured length is refused before anything runs.
TEST(SpecSim, CalibratedTableTooShortForThePolicy) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  try {
    simulate(chain(5), two_round_table(), HostSchedule::kRunahead, testing::ideal_machine(), none,
             2, 50);
    FAIL() << "a 5-token chain ran on a 4-token calibration";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("measured drafts of 4 tokens, but this policy drafts up "
                                         "to 5"),
              std::string::npos)
        << e.what();
  }
}

// Parametric runs record their rounds too: a chain proposes exactly its draft length, and
// accepted <= drafted; the rounds' commits equal the step samples' (rank 0 only).
TEST(SpecSim, RoundsAgreeWithStepSamples) {
  const HostCostSpec none = testing::fixed_host_costs(0, 0, 0);
  const Result r = simulate(chain(5), {.accept_rate = 0.7}, HostSchedule::kRunahead,
                            testing::ideal_machine(), none, 6, 300);
  int64_t committed = 0;
  for (const DraftRound& d : r.record.rounds) {
    EXPECT_EQ(d.draft_len, 5);
    EXPECT_LE(d.accepted, 5);
    committed += d.accepted + 1;
  }
  int64_t tokens = 0;
  for (const StepSample& s : r.record.steps) tokens += s.batch > 0 ? s.tokens : 0;
  EXPECT_EQ(committed, tokens);
}

}  // namespace
}  // namespace twinstep
