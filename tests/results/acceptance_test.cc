#include "results/acceptance.h"

#include <gtest/gtest.h>

#include <functional>

#include "policies/error.h"
#include "results/compare.h"

namespace twinstep {
namespace {

RunInfo info(const std::string& experiment, const std::string& label, int32_t variant,
             const std::string& backend) {
  RunInfo i;
  i.experiment_name = experiment;
  i.yaml_text = "yaml of " + experiment;
  i.variant_index = variant;
  i.variant_label = label;
  i.backend = backend;
  return i;
}

int64_t store(ResultsDb& db, const RunInfo& i, std::vector<DraftRound> rounds) {
  RunRecord record;
  record.rounds = std::move(rounds);
  const int64_t id = db.begin_run(i);
  db.finish_run(id, record, {}, 1);
  return id;
}

// Rounds of a chain of `len` drafts; accepted[k] for round k, confidence 0.5 + k/100 at every
// position.
std::vector<DraftRound> chain_rounds(int32_t len, std::vector<int32_t> accepted) {
  std::vector<DraftRound> out;
  for (size_t k = 0; k < accepted.size(); ++k) {
    out.push_back({int32_t(k % 2), int64_t(k), len, accepted[k],
                   std::vector<float>(size_t(len), 0.5f + float(k) / 100)});
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Acceptance, RoundsComeBackAsStored) {
  auto db = ResultsDb::open(":memory:");
  const std::vector<DraftRound> rounds = {
      {1, 5, 3, 2, {0.75f, 0.5f, 0.25f}}, {0, 4, 2, 0, {0.125f, 1.0f}}, {1, 6, 1, 1, {0.1f}}};
  const int64_t id = store(db, info("calib", "base", 0, "real"), rounds);
  const std::vector<DraftRound> back = load_draft_rounds(db, id);
  ASSERT_EQ(back.size(), 3u);
  // Ordered by request, then round.
  EXPECT_EQ(back[0].request, 0);
  EXPECT_EQ(back[0].confidence, (std::vector<float>{0.125f, 1.0f}));
  EXPECT_EQ(back[1].step, 5);
  EXPECT_EQ(back[1].accepted, 2);
  EXPECT_EQ(back[1].confidence, (std::vector<float>{0.75f, 0.5f, 0.25f}));
  EXPECT_EQ(back[2].confidence, (std::vector<float>{0.1f}));  // %.9g round-trips a float
  EXPECT_NE(error_of([&] { load_draft_rounds(db, 99); }).find("no run with id 99"),
            std::string::npos);
}

TEST(Acceptance, ResolvesTheNewestCompleteRealRun) {
  auto db = ResultsDb::open(":memory:");
  const int64_t old_f55 = store(db, info("calib", "f=0.55", 0, "real"), chain_rounds(4, {1}));
  const int64_t f90 = store(db, info("calib", "f=0.9", 1, "real"), chain_rounds(4, {4}));
  const int64_t new_f55 = store(db, info("calib", "f=0.55", 0, "real"), chain_rounds(4, {2}));
  store(db, info("calib", "f=0.55", 0, "sim"), chain_rounds(4, {3}));  // a sim run: never
  db.begin_run(info("calib", "f=0.55", 0, "real"));                    // running: never
  AcceptanceSource s;
  s.experiment = "calib";
  s.variant = "f=0.55";
  EXPECT_EQ(resolve_acceptance_run(db, s), new_f55);
  s.variant = "f=0.9";
  EXPECT_EQ(resolve_acceptance_run(db, s), f90);
  s.variant = "";
  EXPECT_EQ(resolve_acceptance_run(db, s), new_f55);
  AcceptanceSource by_id;
  by_id.run_id = old_f55;
  EXPECT_EQ(resolve_acceptance_run(db, by_id), old_f55);

  s.where = "x.yaml:3:5";
  s.experiment = "nope";
  const std::string missing = error_of([&] { resolve_acceptance_run(db, s); });
  EXPECT_EQ(missing.rfind("x.yaml:3:5: ", 0), 0u) << missing;
  EXPECT_NE(missing.find("no complete real run of experiment \"nope\""), std::string::npos);
  by_id.run_id = 4;  // the sim run
  EXPECT_NE(error_of([&] { resolve_acceptance_run(db, by_id); }).find("not a complete real run"),
            std::string::npos);
}

TEST(Acceptance, TableOfAChainRun) {
  const AcceptanceTable t = acceptance_table(chain_rounds(3, {0, 3, 1, 2}), "run 7");
  EXPECT_EQ(t.draft_len, 3);
  EXPECT_EQ(t.rounds(), 4u);
  EXPECT_EQ(t.confidence.size(), 12u);
  EXPECT_FLOAT_EQ(t.confidence[3], 0.51f);  // round 1, position 1
  // Committed per verify: min(accepted, d) + 1 averaged: d = 3: (1 + 4 + 2 + 3) / 4.
  EXPECT_DOUBLE_EQ(t.chain_accept_len(3), 2.5);
  EXPECT_DOUBLE_EQ(t.chain_accept_len(1), (1 + 2 + 2 + 2) / 4.0);
  EXPECT_DOUBLE_EQ(t.chain_accept_len(0), 1.0);

  std::vector<DraftRound> mixed = chain_rounds(3, {1, 2});
  mixed.push_back({0, 9, 2, 1, {0.5f, 0.5f}});
  const std::string e = error_of([&] { acceptance_table(mixed, "run 8"); });
  EXPECT_NE(e.find("run 8 drafted 3 tokens in one round and 2 in another"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { acceptance_table({}, "run 9"); }).find("no verify rounds"),
            std::string::npos);
}

// Each round's start is what its request's earlier rounds committed (accepted + 1 each), with
// the requests' rounds interleaved as a concurrent run stores them. chain_rounds alternates
// requests 0 and 1: request 0 gets accepted 0, 1, 3; request 1 gets 3, 2.
TEST(Acceptance, TableRoundsKnowTheirRequestAndOutputPosition) {
  const AcceptanceTable t = acceptance_table(chain_rounds(3, {0, 3, 1, 2, 3}), "run 7");
  EXPECT_EQ(t.request, (std::vector<int32_t>{0, 1, 0, 1, 0}));
  EXPECT_EQ(t.start, (std::vector<int32_t>{0, 0, 1, 4, 3}));
}

// The tokens another chain run drafted (bonus_from), by hand: chain_rounds(2, {2, 0, 1}) gives
// request 0 a round at 0 (accepted 2 of 2: tokens 0, 1 agreed, confidence 0.50) and one at 3
// (accepted 1: token 3 agreed, token 4 the miss, 0.52), request 1 a round at 0 that missed at once
// (token 0, 0.51). A bonus token (0's 2) and positions past a miss are not drafted text: none.
TEST(Acceptance, DraftedTokensOfAnotherChainRun) {
  AcceptanceTable t;
  add_drafted_tokens(chain_rounds(2, {2, 0, 1}), "run 5", t);
  auto at = [&](int32_t request, int32_t position) {
    const auto it = t.drafted.find(AcceptanceTable::drafted_key(request, position));
    return it == t.drafted.end() ? std::string("none")
                                 : std::string(it->second.agrees ? "agrees " : "misses ") +
                                       std::to_string(it->second.confidence).substr(0, 4);
  };
  EXPECT_EQ(at(0, 0), "agrees 0.50");
  EXPECT_EQ(at(0, 1), "agrees 0.50");
  EXPECT_EQ(at(0, 2), "none");  // round 0's bonus token: not drafted
  EXPECT_EQ(at(0, 3), "agrees 0.52");
  EXPECT_EQ(at(0, 4), "misses 0.52");
  EXPECT_EQ(at(1, 0), "misses 0.51");
  EXPECT_EQ(at(1, 1), "none");  // past the miss
  EXPECT_EQ(t.drafted.size(), 5u);
  EXPECT_EQ(t.drafted_source, "run 5");
  // Loaded beside the source: acceptance.calibrated.bonus_from names the second experiment.
  auto db = ResultsDb::open(":memory:");
  store(db, info("calib", "a", 0, "real"), chain_rounds(3, {3, 1}));
  store(db, info("offset", "b", 0, "real"), chain_rounds(2, {2, 0, 1}));
  AcceptanceSource s;
  s.experiment = "calib";
  s.align_position = true;
  s.bonus_experiment = "offset";
  const AcceptanceTable loaded = load_acceptance_table(db, s);
  EXPECT_EQ(loaded.draft_len, 3);
  EXPECT_EQ(loaded.drafted.size(), 5u);
  EXPECT_NE(loaded.drafted_source.find("experiment offset"), std::string::npos);
  s.bonus_experiment = "missing";
  s.where = "x.yaml:3:5";
  const std::string e = error_of([&] { load_acceptance_table(db, s); });
  EXPECT_EQ(e.find("x.yaml:3:5 (bonus_from): calibrated acceptance: no complete real run of "
                   "experiment \"missing\""),
            0u)
      << e;
}

TEST(Acceptance, HistogramMeanAndTotalVariation) {
  // Tokens per verify 1, 2, 2, 4 and 1, 1, 2, 3.
  const AcceptHistogram a = accept_histogram(chain_rounds(3, {0, 1, 1, 3}));
  const AcceptHistogram b = accept_histogram(chain_rounds(3, {0, 0, 1, 2}));
  EXPECT_EQ(a.count, (std::vector<int64_t>{1, 2, 0, 1}));
  EXPECT_DOUBLE_EQ(a.mean(), 9.0 / 4);
  EXPECT_DOUBLE_EQ(b.mean(), 7.0 / 4);
  EXPECT_DOUBLE_EQ(a.fraction(1), 0.5);
  EXPECT_DOUBLE_EQ(a.fraction(7), 0.0);
  // |1/4 - 2/4| + |2/4 - 1/4| + |0 - 1/4| + |1/4 - 0| = 1, halved.
  EXPECT_DOUBLE_EQ(total_variation(a, b), 0.5);
  EXPECT_DOUBLE_EQ(total_variation(a, a), 0.0);
}

// Two requests: r0 commits 2 and 4 tokens in two rounds, r1 commits 1 in one round. m = 7/3;
// residuals T_r − m·N_r: 6 − 14/3 = 4/3 and 1 − 7/3 = −4/3; SE = sqrt(2 · 32/9) / 3 = 8/9.
TEST(Acceptance, StandardErrorTreatsRequestsAsUnits) {
  const std::vector<DraftRound> rounds = {{0, 1, 3, 1, {0.5f, 0.5f, 0.5f}},
                                          {0, 2, 3, 3, {0.5f, 0.5f, 0.5f}},
                                          {1, 1, 3, 0, {0.5f, 0.5f, 0.5f}}};
  EXPECT_NEAR(accept_len_standard_error(rounds), 8.0 / 9.0, 1e-12);
  EXPECT_EQ(accept_len_standard_error({rounds[0], rounds[1]}), 0.0);  // one request
}

TEST(Acceptance, SimVsRealTable) {
  auto db = ResultsDb::open(":memory:");
  const int64_t sim = store(db, info("e", "chain", 0, "sim"), chain_rounds(3, {0, 1, 1, 3}));
  const int64_t real = store(db, info("e", "chain", 0, "real"), chain_rounds(3, {0, 0, 1, 2}));
  const int64_t lone = store(db, info("e", "other", 1, "sim"), chain_rounds(3, {3}));
  double worst = -1;
  const QueryResult t = sim_vs_real_accept(db, {sim, real, lone}, &worst);
  EXPECT_EQ(t.columns, (std::vector<std::string>{"variant", "tokens", "sim", "real", "diff"}));
  ASSERT_EQ(t.rows.size(), 7u);  // tokens 1..4, mean, mean_se, tv_distance; "other": no real run
  EXPECT_EQ(std::get<std::string>(t.rows[1][1]), "2");
  EXPECT_DOUBLE_EQ(std::get<double>(t.rows[1][2]), 0.5);
  EXPECT_DOUBLE_EQ(std::get<double>(t.rows[1][3]), 0.25);
  EXPECT_EQ(std::get<std::string>(t.rows[4][1]), "mean");
  EXPECT_DOUBLE_EQ(std::get<double>(t.rows[4][4]), 0.5);
  EXPECT_EQ(std::get<std::string>(t.rows[5][1]), "mean_se");
  EXPECT_DOUBLE_EQ(std::get<double>(t.rows[6][2]), 0.5);
  EXPECT_DOUBLE_EQ(worst, 0.5);
}

}  // namespace
}  // namespace twinstep
