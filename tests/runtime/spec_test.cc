// Speculative decoding on the real runtime (GPU; each test skips without a CUDA device):
//   - verify acceptance on the tiny model against the CPU reference (teacher-forced: the CPU's
//     greedy argmax at every drafted position decides the accepted prefix and the bonus token);
//   - greedy speculative output byte-identical to plain greedy (tiny model and Llama-3-8B shape;
//     tiny MoE and Qwen3-30B-A3B shape, their draft layer an MoE layer), for chain and every
//     confidence mode, >= 256 tokens;
//   - accept lengths equal across reruns;
//   - the fidelity dial: mean accept length of a chain of 8 per fidelity, and acceptance per
//     confidence bucket (printed; the ends of the range asserted);
//   - the draft module (dense and MoE) loaded from a make-checkpoint directory equals the
//     in-memory synthetic one;
//   - each step's bytes_read equal to the simulator's replaying the run's rounds.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <span>

#include "policies/decode_loop.h"
#include "policies/hardware_spec.h"
#include "policies/spec_rules.h"
#include "results/acceptance.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/real_backend.h"
#include "simulator/sim_backend.h"
#include "tests/runtime/cpu_reference.h"
#include "tests/runtime/gpu_skip.h"

namespace twinstep {
namespace {

using runtime::DraftControl;
using runtime::Engine;
using runtime::EngineOptions;
using runtime::OutputRow;

SpecSpec chain(int32_t steps, int32_t draft_tokens) {
  SpecSpec s;
  s.method = SpecMethod::kChain;
  s.steps = steps;
  s.draft_tokens = draft_tokens;
  return s;
}

SpecSpec confidence(DraftMode mode, double threshold = 0.5, int32_t min_steps = 1,
                    int32_t max_steps = 8) {
  SpecSpec s;
  s.method = SpecMethod::kConfidence;
  s.mode = mode;
  s.threshold = threshold;
  s.min_steps = min_steps;
  s.max_steps = max_steps;
  s.lag = 1;
  return s;
}

struct SpecRun {
  RunRecord record;
  std::vector<std::vector<int32_t>> tokens;
  double accept_len = 0;  // tokens committed per verified request-step
  int64_t committed = 0;  // tokens committed by verifies, from the step samples
};

// trace_all: every step traced (RealOptions::trace_first_step / trace_steps).
SpecRun run(Engine& engine, const ModelSpec& model, const WorkloadSpec& w, const SpecSpec& spec,
            HostSchedule schedule = HostSchedule::kRunahead, GraphMode mode = GraphMode::kCudaGraph,
            float temperature = 0.0f, int32_t warmup_launches = 0, bool trace_all = false) {
  PolicySpec p;
  p.host_schedule = schedule;
  p.graph_mode = mode;
  p.spec = spec;
  const std::vector<RequestSpec> requests = generate_requests(w);
  SpecRun r;
  DecodeLoop loop(p, w, requests, &r.record);
  const HostCostModel host(HostCostSpec{}, 1);
  RealOptions ro;
  ro.prepare_mode = mode;
  ro.prepare_max_batch = w.max_concurrency;
  ro.prompt_seed = 3;
  ro.spec = spec;
  ro.temperature = temperature;
  ro.sampling_seed = 77;
  ro.warmup_launches = warmup_launches;
  if (trace_all) ro.trace_steps = int64_t{1} << 40;
  RealBackend backend(engine, model, host, requests, ro);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, r.record);
  for (const RequestSpec& q : requests) r.tokens.push_back(backend.output_tokens(q.id));
  int64_t committed = 0, verified = 0;
  for (const StepSample& s : r.record.steps) {
    if (s.draft_len == 0) continue;
    committed += s.tokens;
    verified += s.batch;
  }
  r.accept_len = verified ? double(committed) / double(verified) : 0;
  r.committed = committed;
  return r;
}

std::vector<int32_t> prompt_of(int32_t request, int32_t len, int64_t vocab) {
  std::vector<int32_t> p;
  for (int32_t t = 0; t < len; ++t) p.push_back(RealBackend::prompt_token(3, request, t, vocab));
  return p;
}

// The options of the speculative engines here: a 512-token cache and the draft module.
EngineOptions draft_options(int32_t max_slots = 1, bool early_exit = false) {
  EngineOptions eo;
  eo.max_slots = max_slots;
  eo.capacity_tokens = 512;
  eo.draft = true;
  eo.draft_early_exit = early_exit;
  return eo;
}

// Drives one request through the engine directly: prefill, then rounds of draft / verify /
// extend (drafts of ctl), reading each round's rows. Returns the verify rows.
DraftControl chain_control(int steps) {
  DraftControl ctl;
  ctl.steps = steps;
  ctl.threshold = 0.5f;
  return ctl;
}

std::vector<OutputRow> direct_rounds(Engine& e, const std::vector<int32_t>& prompt, int rounds,
                                     const DraftControl& ctl, int32_t* first_token,
                                     std::vector<OutputRow>* draft_rows = nullptr) {
  const std::vector<int32_t> slot = {0};
  const std::vector<std::vector<int32_t>> prompts = {prompt};
  cudaStream_t s = e.compute_stream();
  const int64_t p = e.enqueue_prefill(slot, prompts);
  e.enqueue_output_copy(p, 1, s);
  TS_CUDA_CHECK(cudaStreamSynchronize(s));
  *first_token = e.host_outputs(p)[0].token;
  std::vector<OutputRow> out;
  for (int i = 0; i < rounds; ++i) {
    const int64_t d = e.enqueue_draft(slot, ctl, GraphMode::kCudaGraph);
    const int64_t v = e.enqueue_verify(slot, ctl.steps + 1, ctl.threshold, GraphMode::kCudaGraph);
    e.enqueue_extend(slot, ctl.steps + 1, GraphMode::kCudaGraph);
    e.enqueue_output_copy(d, 1, s);
    e.enqueue_output_copy(v, 1, s);
    TS_CUDA_CHECK(cudaStreamSynchronize(s));
    out.push_back(e.host_outputs(v)[0]);
    if (draft_rows) draft_rows->push_back(e.host_outputs(d)[0]);
  }
  return out;
}

constexpr float kTieTolerance = 0.02f;  // as engine_test.cc: bf16 rounding-order near-ties

TEST(SpecTiny, VerifyAcceptanceMatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const LlamaConfig c = llama_config_from_spec(tiny_runtime_spec());
  constexpr double kFidelity = 0.6;  // a mix of accepted and rejected drafts (CPU: ~0.8 agree)
  const EngineOptions eo = draft_options();
  auto engine = Engine::create_synthetic(c, 11, eo, kFidelity);
  const std::vector<int32_t> prompt = prompt_of(0, 40, c.vocab);
  int32_t first = 0;
  const int kSteps = 6, kRounds = 40;
  const std::vector<OutputRow> rows =
      direct_rounds(*engine, prompt, kRounds, chain_control(kSteps), &first);

  testing::CpuLlama cpu(c, 11, kFidelity);
  std::vector<float> logits = cpu.prefill(prompt);
  ASSERT_EQ(cpu.argmax(logits), first);
  int ctx = int(prompt.size());
  int32_t committed = first;  // t_c: committed, not yet processed
  int ties = 0, accepted_total = 0, rejected_rounds = 0;
  for (int i = 0; i < kRounds; ++i) {
    const OutputRow& row = rows[size_t(i)];
    ASSERT_EQ(row.draft_len, kSteps);
    ASSERT_EQ(row.ctx, ctx + row.accepted + 1) << "round " << i;
    // The CPU target over t_c, d_1 .. d_accepted: its argmax after each must be the GPU's
    // verdict (draft j for j < accepted, the bonus at j = accepted), and a rejected draft must
    // differ from it.
    bool diverged = false;
    std::vector<float> l = cpu.decode(committed);
    for (int j = 0; j <= row.accepted; ++j) {
      const int32_t a = cpu.argmax(l);
      const int32_t gpu_pick = j < row.accepted ? row.draft[j] : row.token;
      if (a != gpu_pick) {
        const float gap = l[size_t(a)] - l[size_t(gpu_pick)];
        EXPECT_LT(gap, kTieTolerance)
            << "round " << i << " position " << j << ": CPU " << a << ", GPU " << gpu_pick;
        ++ties;
        diverged = true;  // the sequences part here; nothing later is comparable
        break;
      }
      if (j == row.accepted && j < kSteps) {
        EXPECT_NE(row.draft[j], a) << "round " << i;
      }
      if (j < row.accepted) l = cpu.decode(row.draft[j]);
    }
    if (diverged) break;
    accepted_total += row.accepted;
    rejected_rounds += row.accepted < kSteps;
    ctx += row.accepted + 1;  // the CPU cache holds exactly the accepted prefix too
    committed = row.token;
  }
  std::printf(
      "tiny F=%.2f: %d rounds of %d drafts, %d accepted in all, %d rounds with a "
      "rejection, %d near-ties\n",
      kFidelity, kRounds, kSteps, accepted_total, rejected_rounds, ties);
  EXPECT_LE(ties, 1);
  // Both outcomes exercised (otherwise the comparison above proves little).
  EXPECT_GT(accepted_total, 0);
  EXPECT_GT(rejected_rounds, 0);
}

// Engine::rewind_context (calibrate's rounds from one context): after rounds that grew the
// context, each round after a rewind to the prompt's length commits accepted + 1 tokens past it;
// bad slots and contexts are refused.
TEST(SpecTiny, RoundsAfterARewindStartAtTheRewoundContext) {
  SKIP_WITHOUT_GPU();
  const LlamaConfig c = llama_config_from_spec(tiny_runtime_spec());
  const EngineOptions eo = draft_options();
  auto engine = Engine::create_synthetic(c, 11, eo, 0.6);
  const std::vector<int32_t> prompt = prompt_of(0, 40, c.vocab);
  int32_t first = 0;
  const std::vector<OutputRow> grown = direct_rounds(*engine, prompt, 3, chain_control(6), &first);
  ASSERT_GT(grown.back().ctx, 40 + 3);  // three rounds committed at least a token each
  const std::vector<int32_t> slot = {0};
  cudaStream_t s = engine->compute_stream();
  for (int i = 0; i < 4; ++i) {
    engine->rewind_context(slot, 40);
    engine->enqueue_draft(slot, chain_control(6), GraphMode::kCudaGraph);
    const int64_t v = engine->enqueue_verify(slot, 7, 0.0f, GraphMode::kCudaGraph);
    engine->enqueue_extend(slot, 7, GraphMode::kCudaGraph);
    engine->enqueue_output_copy(v, 1, s);
    TS_CUDA_CHECK(cudaStreamSynchronize(s));
    const OutputRow& row = engine->host_outputs(v)[0];
    EXPECT_EQ(row.ctx, 40 + row.accepted + 1) << "round " << i;
  }
  EXPECT_THROW(engine->rewind_context(slot, 0), Error);
  EXPECT_THROW(engine->rewind_context(slot, 513), Error);
  EXPECT_THROW(engine->rewind_context(std::vector<int32_t>{1}, 40), Error);  // max_slots 1
}

// The device's draft-length decision is policies/spec_rules.h's (the simulator's): draft_len and
// conf_len of every round recomputed on the host from the row's confidences.
TEST(SpecTiny, DeviceDraftLengthFollowsTheSharedRule) {
  SKIP_WITHOUT_GPU();
  const LlamaConfig c = llama_config_from_spec(tiny_runtime_spec());
  const EngineOptions eo = draft_options();
  auto engine = Engine::create_synthetic(c, 13, eo, 0.8);
  const SpecSpec spec = confidence(DraftMode::kDevice, 0.5, 2, 8);
  int32_t first = 0;
  std::vector<OutputRow> drafts;
  const std::vector<OutputRow> rows = direct_rounds(
      *engine, prompt_of(1, 32, c.vocab), 30, runtime::draft_control(spec, 8), &first, &drafts);
  std::set<int32_t> lengths;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::span<const float> conf(drafts[i].confidence, size_t(runtime::kMaxDraftTokens));
    const int32_t want = device_draft_len(spec, conf, 8);
    EXPECT_EQ(drafts[i].draft_len, want) << "round " << i;
    EXPECT_EQ(rows[i].draft_len, want) << "round " << i;
    EXPECT_EQ(rows[i].conf_len, confident_prefix(spec, conf, want)) << "round " << i;
    EXPECT_LE(rows[i].accepted, want);
    lengths.insert(want);
  }
  std::printf("device draft lengths seen:");
  for (int32_t l : lengths) std::printf(" %d", l);
  std::printf("\n");
}

// A speculative policy with the host schedule and graph mode it runs under.
struct SpecCase {
  const char* label;
  SpecSpec spec;
  HostSchedule schedule;
  GraphMode mode;
};

class TinySpec : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    spec_ = tiny_runtime_spec();
    const EngineOptions eo = draft_options(2);
    engine_ = Engine::create_synthetic(llama_config_from_spec(spec_), 5, eo, 0.85);
    w_.input_len = {40, 40};
    w_.output_len = {300, 300};
    w_.num_requests = 2;
    w_.max_concurrency = 1;
  }
  ModelSpec spec_;
  WorkloadSpec w_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(TinySpec, GreedySpeculativeOutputEqualsPlainGreedy) {
  const SpecRun plain = run(*engine_, spec_, w_, SpecSpec{});
  ASSERT_EQ(plain.tokens[0].size(), 300u);
  const SpecCase cases[] = {
      {"chain(5) graphs", chain(5, 6), HostSchedule::kRunahead, GraphMode::kCudaGraph},
      {"chain(5) eager lockstep", chain(5, 6), HostSchedule::kLockstep, GraphMode::kEager},
      {"confidence device", confidence(DraftMode::kDevice), HostSchedule::kRunahead,
       GraphMode::kCudaGraph},
      {"confidence host_late", confidence(DraftMode::kHostLate), HostSchedule::kRunahead,
       GraphMode::kCudaGraph},
      {"confidence host_blocking", confidence(DraftMode::kHostBlocking), HostSchedule::kRunahead,
       GraphMode::kCudaGraph},
  };
  for (const SpecCase& k : cases) {
    const SpecRun r = run(*engine_, spec_, w_, k.spec, k.schedule, k.mode);
    EXPECT_EQ(r.tokens, plain.tokens) << k.label;
    EXPECT_GE(r.accept_len, 1.0) << k.label;
    // The recorded verify rounds (the database's draft_round) account for every commit.
    int64_t from_rounds = 0;
    for (const DraftRound& d : r.record.rounds) {
      EXPECT_GE(d.draft_len, 1) << k.label;
      EXPECT_LE(d.accepted, d.draft_len) << k.label;
      EXPECT_EQ(d.confidence.size(), size_t(d.draft_len)) << k.label;
      from_rounds += d.accepted + 1;
    }
    EXPECT_EQ(from_rounds, r.committed) << k.label;
    std::printf("tiny %-26s accept length %.3f\n", k.label, r.accept_len);
  }
}

// EngineOptions::fused_norms (the norms carried by the GEMVs): plain decode (one row) and the
// verify's row-exact chunks run the same m-independent kernels, so speculative decoding stays
// byte-identical to plain greedy decoding of the same engine.
TEST_F(TinySpec, FusedNormsSpeculativeOutputEqualsPlainGreedy) {
  EngineOptions eo = draft_options(2);
  eo.fused_norms = true;
  auto fused = Engine::create_synthetic(llama_config_from_spec(spec_), 5, eo, 0.85);
  const SpecRun plain = run(*fused, spec_, w_, SpecSpec{});
  ASSERT_EQ(plain.tokens[0].size(), 300u);
  for (const SpecSpec& s : {chain(5, 6), confidence(DraftMode::kDevice)}) {
    const SpecRun r = run(*fused, spec_, w_, s);
    EXPECT_EQ(r.tokens, plain.tokens) << spec_method_name(s.method);
    EXPECT_GE(r.accept_len, 1.0) << spec_method_name(s.method);
    std::printf("tiny fused norms %s: accept length %.3f\n", spec_method_name(s.method),
                r.accept_len);
  }
}

// Continuous batching: two requests decoded together. Byte-identity with plain decode holds
// where the attention split is the same for every batch bucket met (kernels/attention.cu: it
// depends on the capacity and the bucket); for the tiny model at capacity 512 it is one 64-token
// tile for buckets 1 and 2, so a request's rows match plain decode whatever its batch.
TEST_F(TinySpec, ConcurrentRequestsMatchPlainGreedy) {
  WorkloadSpec w = w_;
  w.num_requests = 3;
  w.max_concurrency = 2;
  w.output_len = {200, 280};
  const SpecRun plain = run(*engine_, spec_, w, SpecSpec{});
  for (const SpecSpec& s : {chain(5, 6), confidence(DraftMode::kDevice)}) {
    const SpecRun r = run(*engine_, spec_, w, s);
    EXPECT_EQ(r.tokens, plain.tokens) << spec_method_name(s.method);
    int max_batch = 0;
    for (const StepSample& st : r.record.steps) max_batch = std::max(max_batch, st.batch);
    EXPECT_EQ(max_batch, 2);
    std::printf("tiny concurrency 2 %s: accept length %.3f\n", spec_method_name(s.method),
                r.accept_len);
  }
}

// confidence/device with the draft's later steps behind conditional IF nodes (skipped once every
// request stopped): the same drafts, so the same tokens and accept lengths as without.
TEST_F(TinySpec, DeviceEarlyExitChangesNothingButTime) {
  const EngineOptions eo = draft_options(2, true);
  auto early = Engine::create_synthetic(llama_config_from_spec(spec_), 5, eo, 0.85);
  const SpecSpec s = confidence(DraftMode::kDevice);
  const SpecRun with = run(*early, spec_, w_, s);
  const SpecRun without = run(*engine_, spec_, w_, s);
  EXPECT_EQ(with.tokens, without.tokens);
  EXPECT_EQ(with.accept_len, without.accept_len);
  EXPECT_EQ(with.tokens, run(*engine_, spec_, w_, SpecSpec{}).tokens);
}

// The untimed warm-up before a run (a prefill and plain decode launches on slot 0 of the
// speculative engine) leaves the speculative run as it was: tokens, accept length, step count.
TEST_F(TinySpec, WarmUpChangesNothingButTime) {
  for (const SpecSpec& s : {chain(5, 6), confidence(DraftMode::kDevice)}) {
    const SpecRun cold = run(*engine_, spec_, w_, s);
    const SpecRun warm = run(*engine_, spec_, w_, s, HostSchedule::kRunahead, GraphMode::kCudaGraph,
                             0.0f, /*warmup_launches=*/32);
    EXPECT_EQ(warm.tokens, cold.tokens) << spec_method_name(s.method);
    EXPECT_EQ(warm.committed, cold.committed) << spec_method_name(s.method);
    EXPECT_EQ(warm.record.steps.size(), cold.record.steps.size()) << spec_method_name(s.method);
  }
}

TEST_F(TinySpec, AcceptLengthsEqualAcrossReruns) {
  for (const SpecSpec& s : {chain(5, 6), confidence(DraftMode::kDevice)}) {
    const SpecRun a = run(*engine_, spec_, w_, s);
    const SpecRun b = run(*engine_, spec_, w_, s);
    std::vector<int32_t> ca, cb;  // tokens per chunk, the accept sequence as the host saw it
    for (const ChunkSample& c : a.record.chunks) ca.push_back(c.tokens);
    for (const ChunkSample& c : b.record.chunks) cb.push_back(c.tokens);
    EXPECT_EQ(ca, cb);
    EXPECT_EQ(a.accept_len, b.accept_len);
    EXPECT_EQ(a.tokens, b.tokens);
  }
}

// The seed's gate: temperature-sampled requests (plain decode, the engine's sampling graphs)
// between two greedy speculative runs on the same engine change nothing of the second: the
// draft state, KV slots and relay hold no leftovers.
TEST_F(TinySpec, GreedyRerunAfterSampledRequestsIsIdentical) {
  for (const SpecSpec& s : {chain(5, 6), confidence(DraftMode::kDevice)}) {
    const SpecRun a = run(*engine_, spec_, w_, s);
    WorkloadSpec ws = w_;
    ws.num_requests = 3;
    ws.max_concurrency = 2;
    ws.output_len = {30, 120};
    const SpecRun sampled =
        run(*engine_, spec_, ws, SpecSpec{}, HostSchedule::kRunahead, GraphMode::kCudaGraph, 0.9f);
    // Request 0 has the same prompt: sampling must have changed its tokens.
    ASSERT_GE(sampled.tokens[0].size(), 30u);
    EXPECT_NE(std::vector<int32_t>(sampled.tokens[0].begin(), sampled.tokens[0].begin() + 30),
              std::vector<int32_t>(a.tokens[0].begin(), a.tokens[0].begin() + 30));
    const SpecRun b = run(*engine_, spec_, w_, s);
    EXPECT_EQ(b.tokens, a.tokens) << spec_method_name(s.method);
    std::vector<int32_t> ca, cb;  // the accept sequence as the host saw it
    for (const ChunkSample& c : a.record.chunks) ca.push_back(c.tokens);
    for (const ChunkSample& c : b.record.chunks) cb.push_back(c.tokens);
    EXPECT_EQ(ca, cb) << spec_method_name(s.method);
  }
}

// The twin's bytes: a speculative step's bytes_read counts each of its launches (the draft's
// forwards, the verify's rows, the extend) at the step's contexts, as the simulator does. The
// simulator replaying a real run's own rounds (calibrated acceptance aligned on the text: the
// same accepted count in every round, so the same contexts, plans and draft lengths) must give
// every step the bytes the real backend counted. Before, the real backend counted a verify as one
// plain decode step and its drafts not at all. Confidence at threshold 0 drafts its whole width
// (a calibrated table needs rounds of one length) through the device-decided path.
TEST_F(TinySpec, StepBytesEqualTheSimulatorReplayingTheRun) {
  const SpecCase cases[] = {
      {"chain(5) lockstep graphs", chain(5, 6), HostSchedule::kLockstep, GraphMode::kCudaGraph},
      {"chain(3) lockstep eager", chain(3, 4), HostSchedule::kLockstep, GraphMode::kEager},
      {"chain(5) run-ahead graphs", chain(5, 6), HostSchedule::kRunahead, GraphMode::kCudaGraph},
      {"confidence device eager", confidence(DraftMode::kDevice, 0.0, 1, 6),
       HostSchedule::kLockstep, GraphMode::kEager},
      {"confidence device graphs", confidence(DraftMode::kDevice, 0.0, 1, 6),
       HostSchedule::kRunahead, GraphMode::kCudaGraph},
  };
  for (const SpecCase& k : cases) {
    SCOPED_TRACE(k.label);
    const SpecRun real = run(*engine_, spec_, w_, k.spec, k.schedule, k.mode);
    AcceptanceSpec acceptance;
    acceptance.calibrated =
        std::make_shared<const AcceptanceTable>(acceptance_table(real.record.rounds, k.label));
    auto from = std::make_shared<AcceptanceSource>();
    from->align_position = true;
    acceptance.calibrated_from = from;
    PolicySpec p;
    p.host_schedule = k.schedule;
    p.graph_mode = k.mode;
    p.spec = k.spec;
    const std::vector<RequestSpec> requests = generate_requests(w_);
    RunRecord sim;
    DecodeLoop loop(p, w_, requests, &sim);
    const HostCostModel host(HostCostSpec{}, 1);
    SimOptions so;
    so.spec = k.spec;
    so.acceptance = acceptance;
    SimBackend backend(spec_, hardware_preset("h200"), host, requests, so);
    HostProgram* ranks[] = {&loop};
    backend.run(ranks, sim);
    // The replay gives the real run's acceptance: the same steps, tokens and draft lengths.
    ASSERT_EQ(sim.steps.size(), real.record.steps.size());
    int64_t spec_steps = 0;
    for (size_t i = 0; i < sim.steps.size(); ++i) {
      const StepSample& a = real.record.steps[i];
      const StepSample& b = sim.steps[i];
      ASSERT_EQ(b.tokens, a.tokens) << "step " << i;
      ASSERT_EQ(b.draft_len, a.draft_len) << "step " << i;
      EXPECT_EQ(b.bytes_read, a.bytes_read) << "step " << i;
      spec_steps += a.draft_len > 0;
    }
    EXPECT_GT(spec_steps, 20);
  }
}

TEST_F(TinySpec, ErrorsNameWhatIsUnsupported) {
  const std::vector<int32_t> slot = {0};
  DraftControl ctl;
  ctl.steps = 16;
  EXPECT_THROW(engine_->enqueue_draft(slot, ctl, GraphMode::kEager), Error);
  EXPECT_THROW(engine_->enqueue_verify(slot, 17, 0.5f, GraphMode::kEager), Error);
  engine_->set_sampling({0.7f, 1});
  ctl.steps = 2;
  EXPECT_THROW(engine_->enqueue_draft(slot, ctl, GraphMode::kEager), Error);
  engine_->set_sampling({});
}

// Mean accept length of a chain of 8 per fidelity, and the draft's confidence against the
// verify's outcome (draft position j with j <= accepted was judged: accepted iff j < accepted).
void fidelity_sweep(const LlamaConfig& c, const char* label, int prompt_len, int rounds,
                    std::vector<std::pair<double, double>>* accept_by_fidelity) {
  constexpr int kSteps = 8;
  for (double f : {0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0}) {
    EngineOptions eo;
    eo.capacity_tokens = (prompt_len + (kSteps + 1) * (rounds + 1) + 63) / 64 * 64;
    eo.draft = true;
    auto engine = Engine::create_synthetic(c, 21, eo, f);
    double sum = 0;
    int n = 0;
    int bucket_judged[5] = {}, bucket_ok[5] = {};
    for (int req = 0; req < 3; ++req) {
      int32_t first = 0;
      const std::vector<OutputRow> rows = direct_rounds(
          *engine, prompt_of(req, prompt_len, c.vocab), rounds, chain_control(kSteps), &first);
      for (const OutputRow& row : rows) {
        sum += row.accepted + 1;
        ++n;
        for (int j = 0; j <= row.accepted && j < kSteps; ++j) {
          const int b = std::min(4, int(row.confidence[j] * 5));
          ++bucket_judged[b];
          bucket_ok[b] += j < row.accepted;
        }
      }
    }
    const double mean = sum / n;
    accept_by_fidelity->emplace_back(f, mean);
    std::printf(
        "%s fidelity %.2f: mean accept length %.3f (chain of %d, %d rounds); "
        "acceptance per confidence bucket [0-.2 .2-.4 .4-.6 .6-.8 .8-1]:",
        label, f, mean, kSteps, n);
    for (int b = 0; b < 5; ++b) {
      if (bucket_judged[b])
        std::printf(" %.2f(%d)", double(bucket_ok[b]) / bucket_judged[b], bucket_judged[b]);
      else
        std::printf(" -(0)");
    }
    std::printf("\n");
  }
}

TEST(SpecFidelity, TinyAcceptLengthSpansTheRange) {
  SKIP_WITHOUT_GPU();
  std::vector<std::pair<double, double>> acc;
  fidelity_sweep(llama_config_from_spec(tiny_runtime_spec()), "tiny", 64, 40, &acc);
  EXPECT_LE(acc.front().second, 2.0);  // F = 0: agreement by chance only
  EXPECT_GE(acc.back().second, 8.0);   // F = 1: the draft reproduces the target's path
}

TEST(SpecFidelity, Llama8BAcceptLengthSpansTheRange) {
  SKIP_WITHOUT_GPU();
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < (size_t{24} << 30)) GTEST_SKIP() << "needs 24 GB of free GPU memory";
  std::vector<std::pair<double, double>> acc;
  fidelity_sweep(llama_config_from_spec(model_preset("llama-3-8b")), "8B", 512, 24, &acc);
  EXPECT_LE(acc.front().second, 2.0);
  EXPECT_GE(acc.back().second, 8.0);
}

// A preset at full size with its draft module (fidelity 0.9): greedy speculative output of each
// policy equals plain greedy over 257 tokens. Skips unless `free_gb` of GPU memory are free.
void expect_lossless_at_full_size(const char* preset, size_t free_gb,
                                  std::initializer_list<SpecSpec> specs) {
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < (free_gb << 30)) GTEST_SKIP() << "needs " << free_gb << " GB of free GPU memory";
  const ModelSpec& spec = model_preset(preset);
  const EngineOptions eo = draft_options();
  auto engine = Engine::create_synthetic(llama_config_from_spec(spec), 1, eo, 0.9);
  WorkloadSpec w;
  w.input_len = {128, 128};
  w.output_len = {257, 257};
  const SpecRun plain = run(*engine, spec, w, SpecSpec{});
  ASSERT_EQ(plain.tokens[0].size(), 257u);
  for (const SpecSpec& s : specs) {
    const SpecRun r = run(*engine, spec, w, s);
    EXPECT_EQ(r.tokens, plain.tokens)
        << spec_method_name(s.method) << " " << draft_mode_name(s.mode);
    EXPECT_GT(r.accept_len, 1.5) << spec_method_name(s.method) << " " << draft_mode_name(s.mode);
    std::printf("%s %s/%s: accept length %.3f\n", preset, spec_method_name(s.method),
                draft_mode_name(s.mode), r.accept_len);
  }
}

TEST(Spec8B, GreedySpeculativeOutputEqualsPlainGreedy) {
  SKIP_WITHOUT_GPU();
  expect_lossless_at_full_size(
      "llama-3-8b", 24,
      {chain(5, 6), confidence(DraftMode::kDevice), confidence(DraftMode::kHostLate),
       confidence(DraftMode::kHostBlocking)});
}

// An MoE target (tiny, 16 experts top-2 with a shared expert; its draft layer an MoE layer):
// greedy speculative output equals plain greedy for chain and every confidence mode (device with
// early exit: the draft's MoE FFN inside conditional nodes on the side stream), one request at a
// time and two together. Verify rows go through moe_forward in 16-row chunks, so this also holds
// the MoE kernels' rows independent of the rows beside them.
TEST(SpecMoe, TinyGreedySpeculativeOutputEqualsPlainGreedy) {
  SKIP_WITHOUT_GPU();
  const ModelSpec spec = tiny_moe_runtime_spec(true);
  const EngineOptions eo = draft_options(2, true);
  auto engine = Engine::create_synthetic(llama_config_from_spec(spec), 5, eo, 0.85);
  for (const int32_t concurrency : {1, 2}) {
    WorkloadSpec w;
    w.input_len = {40, 40};
    w.output_len = {300, 300};
    w.num_requests = 2;
    w.max_concurrency = concurrency;
    const SpecRun plain = run(*engine, spec, w, SpecSpec{});
    ASSERT_EQ(plain.tokens[0].size(), 300u);
    for (const SpecSpec& s :
         {chain(5, 6), confidence(DraftMode::kDevice), confidence(DraftMode::kHostLate),
          confidence(DraftMode::kHostBlocking)}) {
      const SpecRun r = run(*engine, spec, w, s);
      EXPECT_EQ(r.tokens, plain.tokens)
          << spec_method_name(s.method) << " " << draft_mode_name(s.mode) << " at " << concurrency;
      EXPECT_GT(r.accept_len, 1.5) << spec_method_name(s.method) << " " << draft_mode_name(s.mode);
      std::printf("tiny MoE concurrency %d %s/%s: accept length %.3f\n", concurrency,
                  spec_method_name(s.method), draft_mode_name(s.mode), r.accept_len);
    }
  }
  // Eager lockstep (no graphs) commits the same tokens.
  WorkloadSpec w;
  w.input_len = {40, 40};
  w.output_len = {120, 120};
  EXPECT_EQ(run(*engine, spec, w, chain(5, 6), HostSchedule::kLockstep, GraphMode::kEager).tokens,
            run(*engine, spec, w, SpecSpec{}).tokens);
}

// The routing record (EngineOptions::record_routing) covers verify launches: a traced chain(5)
// run of the tiny MoE at concurrency 2 records one pass per (verify launch, MoE layer), each with
// its verified positions' top-k picks, and commits the same tokens as an engine that records
// nothing (the ring is written beside the computation, never read by it).
TEST(SpecMoe, RecordedRoutingCoversVerifyLaunches) {
  SKIP_WITHOUT_GPU();
  const ModelSpec spec = tiny_moe_runtime_spec(true);
  const LlamaConfig config = llama_config_from_spec(spec);
  EngineOptions eo = draft_options(2);
  auto quiet = Engine::create_synthetic(config, 5, eo, 0.85);
  eo.record_routing = true;
  auto recording = Engine::create_synthetic(config, 5, eo, 0.85);
  WorkloadSpec w;
  w.input_len = {40, 40};
  w.output_len = {120, 120};
  w.num_requests = 2;
  w.max_concurrency = 2;
  const SpecSpec policy = chain(5, 6);
  const SpecRun traced = run(*recording, spec, w, policy, HostSchedule::kRunahead,
                             GraphMode::kCudaGraph, 0.0f, 0, /*trace_all=*/true);
  const RunRecord& record = traced.record;
  EXPECT_EQ(traced.tokens, run(*quiet, spec, w, policy).tokens);

  int64_t verifies = 0, rows = 0;
  for (const StepSample& st : record.steps) {
    if (st.draft_len == 0) continue;
    ++verifies;
    // Every verified position of a chain is a drafted token or the bonus (no padded rows).
    rows += int64_t(st.batch) * (st.draft_len + 1);
  }
  ASSERT_GT(verifies, 20);
  const MoeRoutingStats& got = record.moe_routing;
  EXPECT_EQ(got.passes, verifies * config.layers);
  int64_t picks = 0;
  for (const int64_t n : got.picks) picks += n;
  EXPECT_EQ(picks, rows * config.top_k * config.layers);
  // A pass's distinct experts: at least top_k (one row's), at most every expert.
  EXPECT_GE(got.rank_experts, got.passes * config.top_k);
  EXPECT_LE(got.rank_experts, got.passes * config.num_experts);
}

// The Qwen3-30B-A3B shape with its MoE draft layer (128 experts top-8): lossless at full size.
TEST(SpecMoe, Qwen3GreedySpeculativeOutputEqualsPlainGreedy) {
  SKIP_WITHOUT_GPU();
  // At most 7 drafts: 8 query heads per KV head x 8 positions fill decode_attention's 64 rows.
  expect_lossless_at_full_size("qwen3-30b-a3b", 72,
                               {chain(5, 6), confidence(DraftMode::kDevice, 0.5, 1, 7)});
}

// Dense and MoE (the draft layer an MoE layer with a shared expert).
TEST(SpecCheckpoint, DraftModuleLoadsLikeTheInMemorySynthetic) {
  SKIP_WITHOUT_GPU();
  for (const ModelSpec& spec : {tiny_runtime_spec(), tiny_moe_runtime_spec(true)}) {
    const auto dir = std::filesystem::temp_directory_path() / "twinstep_spec_ck";
    std::filesystem::remove_all(dir);
    write_synthetic_checkpoint(spec, dir.string(), 9, 1 << 20, 0.75);
    auto ck = Checkpoint::open(dir.string());
    ASSERT_TRUE(ck->has_draft()) << spec.name;
    const EngineOptions eo = draft_options();
    auto from_file = Engine::create_from_checkpoint(*ck, eo);
    auto in_memory = Engine::create_synthetic(llama_config_from_spec(spec), 9, eo, 0.75);
    for (const WeightDesc& d : synthetic_weight_list(ck->config(), true, 0.75))
      ASSERT_EQ(from_file->download_weight(d.name), in_memory->download_weight(d.name))
          << spec.name << " " << d.name;
    WorkloadSpec w;
    w.input_len = {24, 24};
    w.output_len = {64, 64};
    EXPECT_EQ(run(*from_file, spec, w, chain(5, 6)).tokens,
              run(*in_memory, spec, w, chain(5, 6)).tokens)
        << spec.name;
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace twinstep
