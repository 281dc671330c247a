// Speculative decoding's acceptance in the results database (table draft_round): the verify
// rounds of a run, the calibrated acceptance table a simulator builds from a measured chain run,
// and the accept-length distribution of simulated against measured runs (`compare --accept`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policies/acceptance_spec.h"
#include "policies/run_record.h"
#include "results/db.h"

namespace twinstep {

// Every verify round of run `run_id`, ordered by request then round (empty without
// speculation). Throws Error for an unknown run or a malformed confidence array.
std::vector<DraftRound> load_draft_rounds(ResultsDb& db, int64_t run_id);

// The run a calibrated acceptance names: run_id when set (it must exist), else the newest
// complete real run of source.experiment (with variant_label source.variant when given).
// Throws Error prefixed with source.where when there is none, or when it is not complete/real.
int64_t resolve_acceptance_run(ResultsDb& db, const AcceptanceSource& source);

// The calibrated table of a measured chain run's rounds. Throws Error (naming `source`) when
// there are no rounds or their draft lengths differ (a confidence run stops drafts early, so
// its rounds say nothing about the positions it never drafted).
AcceptanceTable acceptance_table(const std::vector<DraftRound>& rounds, const std::string& source);

// Adds to t.drafted the text tokens `rounds` (another chain run of the same texts, any length)
// drafted: per request in round order, positions 1 .. min(draft_len, accepted + 1) of each
// round at its output position (agreed up to accepted, the miss after).
void add_drafted_tokens(const std::vector<DraftRound>& rounds, const std::string& source,
                        AcceptanceTable& t);

// Resolves source (resolve_acceptance_run) and builds its table; `source` of the result reads
// "run N (experiment E, variant V) in DB". With source.bonus_experiment, also that experiment's
// newest complete real run (variant bonus_variant when given) into t.drafted.
AcceptanceTable load_acceptance_table(ResultsDb& db, const AcceptanceSource& source);

// Tokens committed per verify round: count[k] rounds committed k + 1 tokens.
struct AcceptHistogram {
  std::vector<int64_t> count;
  int64_t rounds() const;
  double mean() const;              // mean tokens per verify (0 with no rounds)
  double fraction(size_t k) const;  // count[k] / rounds (0 past the end)
};
AcceptHistogram accept_histogram(const std::vector<DraftRound>& rounds);
// The standard error of the mean tokens per verify over `rounds`, with requests as the sampled
// units (a request's rounds share its text, so they are not independent): for the ratio
// m = Σ tokens / Σ rounds over R requests, sqrt(R / (R − 1) · Σ_r (T_r − m·N_r)²) / N, where
// request r has N_r rounds committing T_r tokens. 0 with fewer than two requests.
double accept_len_standard_error(const std::vector<DraftRound>& rounds);
// Total variation distance between two histograms' distributions (0..1).
double total_variation(const AcceptHistogram& a, const AcceptHistogram& b);

}  // namespace twinstep
