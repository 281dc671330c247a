#include "policies/decode_loop.h"

#include <algorithm>
#include <cassert>

namespace twinstep {

DecodeLoop::DecodeLoop(const PolicySpec& policy, const WorkloadSpec& workload,
                       std::vector<RequestSpec> requests, RunRecord* record)
    : policy_(policy),
      max_concurrency_(workload.max_concurrency),
      requests_(std::move(requests)),
      host_(requests_.size()),
      record_(record) {
  assert(max_concurrency_ > 0);
  free_slot_ns_.assign(static_cast<size_t>(max_concurrency_), 0);
  record_->requests.resize(requests_.size());
  for (size_t i = 0; i < requests_.size(); ++i) {
    RequestSample& r = record_->requests[i];
    r.id = requests_[i].id;
    r.input_len = requests_[i].input_len;
    r.output_len = requests_[i].output_len;
    r.arrival_ns = requests_[i].arrival_ns;
  }
}

void DecodeLoop::admit(int64_t now_ns, Plan& plan) {
  while (next_request_ < static_cast<int32_t>(requests_.size()) && !free_slot_ns_.empty()) {
    const RequestSpec& r = requests_[static_cast<size_t>(next_request_)];
    const int64_t start_ns = std::max(r.arrival_ns, free_slot_ns_.front());
    if (start_ns > now_ns) break;
    free_slot_ns_.pop_front();
    host_[static_cast<size_t>(r.id)].start_ns = start_ns;
    record_->requests[static_cast<size_t>(r.id)].start_ns = start_ns;
    plan.requests.push_back(r.id);
    ++next_request_;
  }
}

void DecodeLoop::wait_oldest(Plan& plan) {
  const Outstanding o = outstanding_.front();
  outstanding_.pop_front();
  plan.host_wait(o.copy_done, o.step);
  plan.host_work(HostOp::kProcessOutputs);
}

bool DecodeLoop::next_plan(int64_t now_ns, Plan& plan) {
  const auto total = static_cast<int32_t>(requests_.size());
  if (finished_count_ == total && outstanding_.empty()) {
    finish_record();
    return false;
  }
  plan.step = step_++;

  const SpecSpec& spec = policy_.spec;
  const bool blocking =
      spec.method == SpecMethod::kConfidence && spec.mode == DraftMode::kHostBlocking;
  if (blocking && !running_.empty() && !verify_pending_) {
    // First half of a host_blocking step: draft, then block on reading the draft lengths.
    // Admission waits for the second half, which sees the same running set.
    plan.host_work(HostOp::kSchedule);
    plan.host_work(HostOp::kPrepareDecode);
    plan.requests.insert(plan.requests.end(), running_.begin(), running_.end());
    plan.launches.push_back({.phase = Phase::kDraft,
                             .mode = policy_.graph_mode,
                             .q_tokens = spec.max_steps,
                             .first_request = 0,
                             .request_count = static_cast<int32_t>(running_.size())});
    plan.launch(StreamId::kCompute, 0);
    const EventId drafted = next_event_++;
    plan.record(StreamId::kCompute, drafted);
    plan.stream_wait(StreamId::kCopy, drafted);
    plan.copy_d2h(StreamId::kCopy, plan.step, 8 * static_cast<int64_t>(running_.size()));
    const EventId read = next_event_++;
    plan.record(StreamId::kCopy, read);
    plan.host_wait(read, plan.step);
    verify_pending_ = true;
    return true;
  }

  admit(now_ns, plan);
  const auto admitted = static_cast<int32_t>(plan.requests.size());
  if (admitted == 0 && running_.empty()) {
    if (!outstanding_.empty()) {
      wait_oldest(plan);  // drain: nothing to launch, results still in flight
      return true;
    }
    if (next_request_ < total && !free_slot_ns_.empty()) {
      const RequestSpec& r = requests_[static_cast<size_t>(next_request_)];
      plan.host_sleep(std::max(r.arrival_ns, free_slot_ns_.front()));
      return true;
    }
    // Unreachable while requests remain: a request is either running, outstanding or pending.
    assert(false && "decode loop has no work but requests remain");
    return false;
  }

  plan.host_work(HostOp::kSchedule);
  if (admitted > 0) {
    plan.host_work(HostOp::kPreparePrefill);
    // Prefill shapes vary per request, so prefill runs eagerly, as in graph-capturing engines.
    plan.launches.push_back({.phase = Phase::kPrefill,
                             .mode = GraphMode::kEager,
                             .q_tokens = 0,
                             .first_request = 0,
                             .request_count = admitted});
    plan.launch(StreamId::kCompute, static_cast<int32_t>(plan.launches.size()) - 1);
  }
  if (!running_.empty()) {
    if (policy_.seq_lens_sync && last_compute_event_ >= 0) plan.host_wait(last_compute_event_);
    plan.host_work(HostOp::kPrepareDecode);
    const auto first = static_cast<int32_t>(plan.requests.size());
    const auto count = static_cast<int32_t>(running_.size());
    plan.requests.insert(plan.requests.end(), running_.begin(), running_.end());
    switch (spec.method) {
      case SpecMethod::kNone:
        plan.launches.push_back({.phase = Phase::kDecode,
                                 .mode = policy_.graph_mode,
                                 .q_tokens = 1,
                                 .first_request = first,
                                 .request_count = count});
        plan.launch(StreamId::kCompute, static_cast<int32_t>(plan.launches.size()) - 1);
        break;
      case SpecMethod::kChain:
        launch_speculative(plan, first, count, spec.draft_tokens - 1);
        break;
      case SpecMethod::kConfidence:
        if (spec.mode == DraftMode::kDevice) {
          launch_speculative(plan, first, count, spec.max_steps);
        } else if (spec.mode == DraftMode::kHostLate) {
          launch_speculative(plan, first, count, host_late_draft_len(plan.step));
        } else {
          // host_blocking, second half: the draft already ran; verify what it proposed.
          launch_speculative(plan, first, count, blocking_draft_len_);
          verify_pending_ = false;
        }
        break;
    }
  }
  running_.insert(running_.end(), plan.requests.begin(), plan.requests.begin() + admitted);

  const EventId compute_done = next_event_++;
  plan.record(StreamId::kCompute, compute_done);
  last_compute_event_ = compute_done;
  plan.stream_wait(StreamId::kCopy, compute_done);
  plan.copy_d2h(
      StreamId::kCopy, plan.step,
      int64_t{policy_.output_copy_bytes_per_request} * static_cast<int64_t>(plan.requests.size()));
  const EventId copy_done = next_event_++;
  plan.record(StreamId::kCopy, copy_done);
  outstanding_.push_back({plan.step, copy_done});

  const size_t depth = policy_.host_schedule == HostSchedule::kLockstep
                           ? 0
                           : static_cast<size_t>(policy_.runahead_depth);
  while (outstanding_.size() > depth) wait_oldest(plan);
  return true;
}

void DecodeLoop::launch_speculative(Plan& plan, int32_t first, int32_t count, int32_t draft_len) {
  const SpecSpec& spec = policy_.spec;
  const bool drafted =
      spec.method == SpecMethod::kConfidence && spec.mode == DraftMode::kHostBlocking;
  const int32_t width = draft_len + 1;  // the committed token plus the drafts
  if (!drafted) {
    plan.launches.push_back({.phase = Phase::kDraft,
                             .mode = policy_.graph_mode,
                             .q_tokens = draft_len,
                             .first_request = first,
                             .request_count = count});
    plan.launch(StreamId::kCompute, static_cast<int32_t>(plan.launches.size()) - 1);
  }
  for (Phase phase : {Phase::kVerify, Phase::kExtend}) {
    plan.launches.push_back({.phase = phase,
                             .mode = policy_.graph_mode,
                             .q_tokens = width,
                             .first_request = first,
                             .request_count = count});
    plan.launch(StreamId::kCompute, static_cast<int32_t>(plan.launches.size()) - 1);
  }
}

int32_t DecodeLoop::host_late_draft_len(int64_t step) const {
  const SpecSpec& spec = policy_.spec;
  int32_t len = spec.min_steps;
  for (const auto& [observed, suggested] : late_suggestions_) {
    if (observed <= step - spec.lag) len = suggested;
  }
  return len;
}

void DecodeLoop::observe(const StepOutputs& out, int64_t /*now_ns*/) {
  const SpecSpec& spec = policy_.spec;
  if (out.draft_only) {
    int32_t len = 0;
    for (const RequestOutput& o : out.outputs) len = std::max(len, o.draft_len);
    blocking_draft_len_ = std::max(len, spec.min_steps);
    return;
  }
  if (spec.method == SpecMethod::kConfidence && spec.mode == DraftMode::kHostLate) {
    // Next length: as far as the draft stayed confident, one further when it never wavered.
    int32_t suggested = 0;
    bool any = false;
    for (const RequestOutput& o : out.outputs) {
      if (o.draft_len == 0) continue;  // prefill output
      any = true;
      suggested = std::max(suggested, o.conf_len + (o.conf_len == o.draft_len ? 1 : 0));
    }
    if (any) {
      late_suggestions_.emplace_back(out.step,
                                     std::clamp(suggested, spec.min_steps, spec.max_steps));
      while (late_suggestions_.size() > size_t(spec.lag) + 8) late_suggestions_.pop_front();
    }
  }
  for (const RequestOutput& o : out.outputs) {
    const auto i = static_cast<size_t>(o.request);
    HostRequest& r = host_[i];
    if (r.finished) continue;  // a step issued before the host knew: discarded
    const int32_t add = std::min(o.tokens, requests_[i].output_len - r.delivered);
    if (add <= 0) continue;
    r.delivered += add;
    if (r.delivered == requests_[i].output_len) r.finished = true;
    pending_chunks_.push_back({o.request, add, o.draft_len});
  }
}

void DecodeLoop::host_work_done(HostOp op, int64_t /*step*/, int64_t now_ns) {
  if (op != HostOp::kProcessOutputs) return;
  for (const RequestOutput& c : pending_chunks_) {
    const auto i = static_cast<size_t>(c.request);
    RequestSample& r = record_->requests[i];
    if (r.first_token_ns < 0) r.first_token_ns = now_ns;
    record_->chunks.push_back({c.request, c.tokens, now_ns});
    if (host_[i].finished && r.end_ns < 0) {
      r.end_ns = now_ns;
      running_.erase(std::find(running_.begin(), running_.end(), c.request));
      free_slot_ns_.push_back(now_ns);
      ++finished_count_;
    }
  }
  pending_chunks_.clear();
}

void DecodeLoop::finish_record() {
  // Group chunks by request, keeping time order within each (a stable counting sort).
  std::vector<ChunkSample>& chunks = record_->chunks;
  std::vector<int32_t> count(requests_.size() + 1, 0);
  for (const ChunkSample& c : chunks) ++count[static_cast<size_t>(c.request) + 1];
  for (size_t i = 1; i < count.size(); ++i) count[i] += count[i - 1];
  for (size_t i = 0; i < requests_.size(); ++i) {
    record_->requests[i].first_chunk = count[i];
    record_->requests[i].chunk_count = count[i + 1] - count[i];
  }
  // Already grouped (one request at a time: concurrency 1): no copy, which at the sweep sizes of
  // bench-sim is 16 MB of the run's peak memory.
  if (std::is_sorted(chunks.begin(), chunks.end(), [](const ChunkSample& a, const ChunkSample& b) {
        return a.request < b.request;
      }))
    return;
  std::vector<ChunkSample> sorted(chunks.size());
  for (const ChunkSample& c : chunks)
    sorted[static_cast<size_t>(count[static_cast<size_t>(c.request)]++)] = c;
  chunks.swap(sorted);
}

}  // namespace twinstep
