// Communicator (runtime/comm.h): a non-blocking NCCL communicator for init and a blocking one split
// from it for the collectives; every call checked, every wait with a deadline that ends in
// ncclCommAbort of both and a CommError naming the operation and the rank.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "runtime/comm.h"

namespace twinstep {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::kBF16:
      return ncclBfloat16;
    case CommType::kF32:
      return ncclFloat32;
    case CommType::kI32:
      return ncclInt32;
  }
  return ncclFloat32;
}

size_t type_bytes(CommType t) { return t == CommType::kBF16 ? 2 : 4; }

// NVLink multicast (NVLS) stays off unless the caller's environment asks for it: on shared
// multi-GPU hosts a program using it can put the host's GPUs out of service. NCCL reads the
// variable when it initialises, so every entry point sets it first.
void keep_nvls_off_by_default() { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); }

// ncclCommFinalize, then polls until the communicator settles: true when it finalized cleanly
// within timeout_s. A blocking communicator settles inside the call (no deadline applies there).
bool finalize_within(ncclComm_t comm, double timeout_s) {
  const ncclResult_t r = ncclCommFinalize(comm);
  if (r != ncclSuccess && r != ncclInProgress) return false;
  const Clock::time_point deadline = deadline_after(timeout_s);
  for (;;) {
    ncclResult_t state = ncclInProgress;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
    if (state != ncclInProgress) return state == ncclSuccess;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

std::string Communicator::new_unique_id() {
  keep_nvls_off_by_default();
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw CommError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

std::unique_ptr<Communicator> Communicator::create_world(const CommOptions& options) {
  const int rank = world_rank(), size = world_size();
  const std::string id = bootstrap_world(&Communicator::new_unique_id, options.join_timeout_s);
  return create(id, rank, size, options);
}

std::unique_ptr<Communicator> Communicator::create(const std::string& unique_id, int rank, int size,
                                                   const CommOptions& options) {
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (unique_id.size() != sizeof(ncclUniqueId))
    throw CommError("NCCL init on " + who + ": the unique id has " +
                    std::to_string(unique_id.size()) + " bytes, expected " +
                    std::to_string(sizeof(ncclUniqueId)));
  if (size < 1 || rank < 0 || rank >= size) throw CommError("NCCL init: invalid " + who);
  if (!(options.join_timeout_s > 0) || !(options.op_timeout_s > 0))
    throw CommError("NCCL init: timeouts must be > 0 s");
  keep_nvls_off_by_default();
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof id);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init returns at once; wait_ready polls it with the deadline
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    throw CommError("NCCL init on " + who + ": " + ncclGetErrorString(r));
  }
  std::unique_ptr<Communicator> c(new Communicator(comm, rank, size, options));
  c->wait_ready(c->init_, "NCCL init", options.join_timeout_s);
  c->split_data_communicator();
  return c;
}

void Communicator::split_data_communicator() {
  const std::string what = "NCCL split of the blocking data communicator";
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;  // enqueues return in ~10 us instead of waiting on NCCL's job thread
  const ncclResult_t r = ncclCommSplit(init_, /*color=*/0, /*key=*/rank_, &data_, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    fail(what, std::string("ncclCommSplit: ") + ncclGetErrorString(r) + " (" +
                   ncclGetLastError(init_) + ")");
  // The split of a non-blocking parent runs as a job of the parent: the parent reports its
  // progress, and NCCL writes data_ when the job ends (joined once the parent reports success).
  wait_ready(init_, what, options_.join_timeout_s);
  split_done_ = true;
  if (data_ == nullptr) fail(what, "ncclCommSplit gave no communicator");
  wait_ready(data_, what, options_.join_timeout_s);
}

Communicator::~Communicator() {
  if (aborted_) return;
  // The init communicator first, its finalize polled with the deadline: one that does not settle
  // (a rank stuck or gone) aborts both. The data communicator's finalize is blocking.
  if (!finalize_within(init_, options_.op_timeout_s)) {
    abort_all();
    return;
  }
  ncclCommDestroy(init_);
  if (data_ == nullptr) return;
  if (finalize_within(data_, options_.op_timeout_s))
    ncclCommDestroy(data_);
  else
    ncclCommAbort(data_);
}

void Communicator::abort_all() {
  if (aborted_) return;
  aborted_ = true;
  if (split_done_) {
    // The child first: a collective still running on the device (a peer that never entered it)
    // stops only at its own communicator's abort flag (NCCL unlinks the parent's from it once the
    // split is done), and the parent's abort frees device memory, which can wait for that kernel.
    if (data_ != nullptr) ncclCommAbort(data_);
    ncclCommAbort(init_);
    return;
  }
  // A split in flight: the parent first; its abort ends the split (joining NCCL's job), after
  // which data_ holds its final value: null, or a child to abort as well.
  ncclCommAbort(init_);
  if (data_ != nullptr) ncclCommAbort(data_);
}

std::string Communicator::describe(const Call& call) {
  const std::string n = std::to_string(call.count), peer = std::to_string(call.peer);
  switch (call.kind) {
    case CallKind::kNone:
      return "";
    case CallKind::kAllReduceSum:
      return "all_reduce_sum of " + n + " elements";
    case CallKind::kAllToAll:
      return "all_to_all of " + n + " elements per rank";
    case CallKind::kSend:
      return "send of " + n + " elements to rank " + peer;
    case CallKind::kRecv:
      return "recv of " + n + " elements from rank " + peer;
  }
  return "";
}

void Communicator::fail(const std::string& what, const std::string& why) {
  abort_all();
  throw CommError(what + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                  ": " + why + "; communicator aborted");
}

bool Communicator::in_progress(ncclComm_t comm, const std::string& what) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  if (r != ncclSuccess) fail(what, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r));
  if (state != ncclSuccess && state != ncclInProgress)
    fail(what, std::string(ncclGetErrorString(state)) + " (" + ncclGetLastError(comm) + ")");
  return state == ncclInProgress;
}

void Communicator::wait_ready(ncclComm_t comm, const std::string& what, double timeout_s) {
  // A non-blocking operation usually settles within microseconds: spin (with yields) for the
  // first 2 ms, then back off to 100 us sleeps. A fixed 1 ms sleep made every eager collective
  // cost over a millisecond (measured on 2 H200s: all-reduce alpha 1.1 ms).
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = deadline_after(timeout_s);
  while (in_progress(comm, what)) {
    if (Clock::now() >= deadline)
      fail(what, "did not complete within " + seconds_text(timeout_s) +
                     " s (a rank did not join or is stuck)");
    if (Clock::now() - start < std::chrono::milliseconds(2))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Checks an enqueueing call on the data communicator. It is blocking, so the call returns once
// the work is enqueued; ncclInProgress (NCCL_COMM_BLOCKING=0 in the environment overrides the
// config) is waited for with the deadline. Errors throw.
#define TS_NCCL_ENQUEUE(expr, what)                                                      \
  do {                                                                                   \
    if (aborted_) throw CommError(std::string(what) + ": the communicator was aborted"); \
    const ncclResult_t ts_r_ = (expr);                                                   \
    if (ts_r_ == ncclInProgress)                                                         \
      wait_ready(data_, what, options_.op_timeout_s);                                    \
    else if (ts_r_ != ncclSuccess)                                                       \
      fail(what, std::string(#expr) + ": " + ncclGetErrorString(ts_r_) + " (" +          \
                     ncclGetLastError(data_) + ")");                                     \
  } while (0)

void Communicator::all_reduce_sum(const void* send, void* recv, size_t count, CommType type,
                                  cudaStream_t stream) {
  last_call_ = Call{CallKind::kAllReduceSum, count, -1};
  // describe() runs only on an error path of the macro: the eager path builds no string.
  TS_NCCL_ENQUEUE(ncclAllReduce(send, recv, count, nccl_type(type), ncclSum, data_, stream),
                  describe(last_call_));
}

void Communicator::all_to_all(const void* send, void* recv, size_t count, CommType type,
                              cudaStream_t stream) {
  last_call_ = Call{CallKind::kAllToAll, count, -1};
  const std::string what = describe(last_call_);
  const size_t bytes = count * type_bytes(type);
  TS_NCCL_ENQUEUE(ncclGroupStart(), what);
  for (int p = 0; p < size_; ++p) {
    // Inside a group the calls only record the operation; ncclGroupEnd launches them.
    TS_NCCL_ENQUEUE(ncclSend(static_cast<const char*>(send) + size_t(p) * bytes, count,
                             nccl_type(type), p, data_, stream),
                    what);
    TS_NCCL_ENQUEUE(ncclRecv(static_cast<char*>(recv) + size_t(p) * bytes, count, nccl_type(type),
                             p, data_, stream),
                    what);
  }
  TS_NCCL_ENQUEUE(ncclGroupEnd(), what);
}

void Communicator::send(const void* buf, size_t count, CommType type, int peer,
                        cudaStream_t stream) {
  const Call call{CallKind::kSend, count, peer};
  const std::string what = describe(call);
  if (peer < 0 || peer >= size_)
    throw CommError(what + ": no such rank (size " + std::to_string(size_) + ")");
  last_call_ = call;
  TS_NCCL_ENQUEUE(ncclSend(buf, count, nccl_type(type), peer, data_, stream), what);
}

void Communicator::recv(void* buf, size_t count, CommType type, int peer, cudaStream_t stream) {
  const Call call{CallKind::kRecv, count, peer};
  const std::string what = describe(call);
  if (peer < 0 || peer >= size_)
    throw CommError(what + ": no such rank (size " + std::to_string(size_) + ")");
  last_call_ = call;
  TS_NCCL_ENQUEUE(ncclRecv(buf, count, nccl_type(type), peer, data_, stream), what);
}

void Communicator::synchronize(cudaStream_t stream, const std::string& what) {
  if (aborted_) throw CommError(what + ": the communicator was aborted");
  const Clock::time_point deadline = deadline_after(options_.op_timeout_s);
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    in_progress(init_, what);  // an asynchronous error on either communicator fails
    in_progress(data_, what);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) fail(what, std::string("CUDA: ") + cudaGetErrorString(q));
    if (Clock::now() >= deadline) {
      std::string why = "did not complete within " + seconds_text(options_.op_timeout_s) +
                        " s (a rank is missing or stuck";
      if (last_call_.kind != CallKind::kNone) why += "; last enqueued: " + describe(last_call_);
      fail(what, why + ")");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace twinstep
