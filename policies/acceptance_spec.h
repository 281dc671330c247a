// How a draft agrees with its target. The simulator draws agreement from an AcceptanceSpec; a real
// run measures it (and takes only draft_fidelity, the synthetic draft's agreement dial).
//
// Parametric: draft position i (1-based) is accepted, given every earlier one was, with
// probability p_i = accept_rate · decay^(i-1). The draft's confidence in position i is
// c_i = (1 − signal)·v + signal·[accepted], v ~ U(0, 1): signal 0 makes confidence noise,
// signal 1 makes it a perfect predictor; acceptance rates do not depend on it.
//
// Calibrated: the verify rounds of a real chain run (RunRecord::rounds, the database's
// draft_round table), each a full draft of the same length with its per-position confidences and
// accepted count. A simulated round replays one of them (the rounds of a run take the table's
// rows in turn from a seeded start): position i's confidence is the recorded one and it is
// accepted iff i <= the recorded count.
// Greedy drafts are autoregressive, so a shorter draft from the same state proposes the same
// leading tokens with the same confidences: any draft up to the recorded length is exact.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace twinstep {

// Verify rounds measured with a fixed draft length (a chain run), for calibrated acceptance.
struct AcceptanceTable {
  int32_t draft_len = 0;          // every round drafted this many tokens
  std::vector<int32_t> accepted;  // per round: leading draft tokens the target accepted
  std::vector<float> confidence;  // per round, draft_len values: draft token i's top-1 prob
  // Per round: its request in the source run and the tokens that request's earlier rounds
  // committed (sum of accepted + 1), i.e. where in the request's output text the round began.
  std::vector<int32_t> request;
  std::vector<int32_t> start;
  std::string source;  // where the rounds came from (for messages and reports)
  // AcceptanceSource::bonus_experiment's tokens, keyed by drafted_key(request, output
  // position): tokens the rounds above never drafted (the bonus token of a round accepted
  // whole) as another chain run of the same texts drafted them, up to and including its miss.
  struct Drafted {
    bool agrees = false;
    float confidence = 0;
  };
  std::unordered_map<uint64_t, Drafted> drafted;
  std::string drafted_source;  // where those came from
  static uint64_t drafted_key(int32_t request, int32_t position) {
    return (uint64_t(uint32_t(request)) << 32) | uint32_t(position);
  }

  size_t rounds() const { return accepted.size(); }
  // Mean tokens committed per verify of a draft of `draft` tokens (<= draft_len):
  // mean over rounds of min(accepted, draft) + 1.
  double chain_accept_len(int32_t draft) const;
};

// Which measured run a calibrated acceptance comes from: the newest complete real run of
// `experiment` (and `variant`, its label, when given) or run `run_id`, in the results database
// at `db` (empty: the database the run writes to). Resolved when the run starts; `where` is the
// YAML position for messages.
struct AcceptanceSource {
  std::string db;
  std::string experiment;
  std::string variant;
  int64_t run_id = 0;
  // align: position. A simulated round of request q that begins t tokens into q's output
  // replays the source round of request q that covers output position t, instead of the next
  // round in order. For a source run that decoded the same texts (same model and draft, same
  // prompts and output lengths, batch 1, greedy): acceptance varies along a text, and a chain
  // of another length meets the text's easy and hard stretches in other proportions per round
  // (a 15-token chain spends few rounds where drafts agree, a 5-token chain more). Rounds past
  // the source's text for that request fall back to the order replay.
  bool align_position = false;
  // bonus_from (with align: position): another chain run of the same texts, with rounds of
  // another length, whose tokens stand in where the source drafted nothing (the bonus token
  // of a round it accepted whole): measured agreement and confidence at that output position
  // instead of a stand-in (simulator/acceptance_model.cc).
  std::string bonus_experiment;
  std::string bonus_variant;
  std::string where;
};

struct AcceptanceSpec {
  // parametric
  double accept_rate = 0.7;
  double decay = 1.0;
  double confidence_signal = 0.4;
  // calibrated (when `calibrated` is set it replaces the parametric model)
  std::shared_ptr<const AcceptanceSource> calibrated_from = nullptr;
  std::shared_ptr<const AcceptanceTable> calibrated = nullptr;
  // The real backend's synthetic draft module: make-checkpoint --draft-fidelity.
  double draft_fidelity = 0.9;
};

// The mean tokens committed per verify of a chain of `draft` tokens with per-position rate a
// (decay 1): Σ_{i=0}^{draft} a^i.
double chain_accept_len(double accept_rate, int32_t draft);
// The inverse: the rate whose chain of `draft` tokens commits `accept_len` tokens per verify
// (1 <= accept_len <= draft + 1), by bisection.
double rate_for_chain_accept_len(double accept_len, int32_t draft);

}  // namespace twinstep
