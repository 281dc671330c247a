// Communication between the ranks of one job: the same binary under mpirun, one process per GPU
// (DESIGN.md "Beyond one machine"). MPI bootstraps NCCL (rank 0 makes the unique id, every rank
// receives it) and NCCL carries the collectives. Every wait on other ranks has a deadline, so a
// rank that never joins or a collective that hangs becomes a CommError naming the operation and
// the rank, instead of a job that hangs until its wall-clock limit.
//
// The header needs neither MPI nor NCCL: bootstrap_world() is built everywhere (a build without
// MPI is a world of one rank); Communicator is built where CUDA and NCCL are (twinstep_comm).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "policies/error.h"

typedef struct CUstream_st* cudaStream_t;  // as cuda_runtime.h declares them
typedef struct ncclComm* ncclComm_t;       // as nccl.h declares it

namespace twinstep {

class CommError : public Error {
 public:
  using Error::Error;
};

struct CommOptions {
  double join_timeout_s = 60;  // bootstrap and NCCL init: every rank joins within this
  double op_timeout_s = 300;   // synchronize(): the enqueued collectives complete within this
};

// This process's rank and the number of ranks of MPI_COMM_WORLD (0 and 1 without MPI, or when
// MPI is not initialised). Initialising MPI is the caller's (experiments/distributed.h).
int world_rank();
int world_size();

// Bootstrap exchange over MPI_COMM_WORLD, collective: every rank sends rank 0 a join message;
// once all joined, rank 0 calls make_payload() and sends its result to every rank; every rank
// returns it. Point-to-point messages polled with MPI_Test (not a blocking broadcast) so rank 0
// knows who is missing and no rank blocks past the deadline: a rank that has not joined within
// timeout_s makes every rank throw CommError "rank R of N did not join within T s" (rank 0
// first; the others, a rank that joins late included, when rank 0's verdict reaches them, or at
// 2 x timeout_s when rank 0 itself is missing). A world of one returns make_payload() at once.
std::string bootstrap_world(const std::function<std::string()>& make_payload, double timeout_s);

// Element types of the collectives (NCCL's, for the runtime's buffers).
enum class CommType { kBF16, kF32, kI32 };

// NCCL on the current CUDA device as two communicators of the same ranks: one created
// non-blocking (config.blocking = 0) so that init can be abandoned at a deadline when a rank does
// not join, and a blocking child split from it (ncclCommSplit) that carries every collective. A
// non-blocking communicator finishes each enqueue on an NCCL job thread: ~85 us of host time per
// eager all-reduce, against 10-13 us blocking (2 H200s, NCCL 2.28). Collectives are enqueued on
// the caller's stream (graph capture allowed). Deadlines cover init, the split and synchronize(),
// not an enqueue: NCCL connects at a collective's first use, which waits for the peers. Every
// NCCL call is checked: a failure aborts both communicators and throws CommError naming the
// operation, this rank and ncclGetErrorString's text. Not thread-safe; one per process and device.
class Communicator {
 public:
  // Every MPI rank joins one communicator (rank = MPI rank); bootstrap_world carries the id.
  static std::unique_ptr<Communicator> create_world(const CommOptions& options = {});
  // A communicator of `size` ranks from an id made by new_unique_id() on one rank and carried
  // to the others by any means (bytes of ncclUniqueId).
  static std::unique_ptr<Communicator> create(const std::string& unique_id, int rank, int size,
                                              const CommOptions& options = {});
  static std::string new_unique_id();
  // Finalizes and destroys both (init communicator first, its finalize polled with
  // options.op_timeout_s; the data communicator's finalize is blocking: synchronize() first), or
  // aborts both after a failure or when a finalize fails.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // recv[i] = sum over ranks of send[i], i < count. send == recv allowed (in place).
  void all_reduce_sum(const void* send, void* recv, size_t count, CommType type,
                      cudaStream_t stream);
  // Rank r sends send[p * count .. (p + 1) * count) to rank p, which stores it at
  // recv[r * count ..]; send and recv hold size() * count elements each.
  void all_to_all(const void* send, void* recv, size_t count, CommType type, cudaStream_t stream);
  // Point to point; a send must meet the peer's recv of the same count and type.
  void send(const void* buf, size_t count, CommType type, int peer, cudaStream_t stream);
  void recv(void* buf, size_t count, CommType type, int peer, cudaStream_t stream);
  // Waits until the work enqueued on `stream` is done, polling both communicators' asynchronous
  // error state. Past options.op_timeout_s, or on an NCCL error, aborts both (the Communicator is
  // unusable afterwards; destroying it is safe) and throws CommError naming `what`, this rank, the
  // deadline and the last operation enqueued ("x on rank 0 of 2: did not complete within 3 s (a
  // rank is missing or stuck; last enqueued: all_reduce_sum of 1024 elements); communicator
  // aborted").
  void synchronize(cudaStream_t stream, const std::string& what);

 private:
  Communicator(ncclComm_t init, int rank, int size, const CommOptions& options)
      : init_(init), rank_(rank), size_(size), options_(options) {}
  // Splits data_ off init_ and waits for it with options.join_timeout_s.
  void split_data_communicator();
  // Polls ncclCommGetAsyncError on `comm` until it leaves ncclInProgress (non-blocking mode's
  // rule before the next NCCL call on it), failing at the deadline.
  void wait_ready(ncclComm_t comm, const std::string& what, double timeout_s);
  // True while `comm` is in progress; an asynchronous error fails.
  bool in_progress(ncclComm_t comm, const std::string& what);
  // Aborts both communicators, once: later enqueues and synchronize() throw, the destructor does
  // nothing.
  void abort_all();
  [[noreturn]] void fail(const std::string& what, const std::string& why);

  // The last enqueuing call, for synchronize's message (recorded without building a string).
  enum class CallKind { kNone, kAllReduceSum, kAllToAll, kSend, kRecv };
  struct Call {
    CallKind kind = CallKind::kNone;
    size_t count = 0;
    int peer = -1;
  };
  // "all_reduce_sum of 1024 elements", "send of 4 elements to rank 1", ...; "" for kNone.
  static std::string describe(const Call& call);

  ncclComm_t init_;            // non-blocking: init and split with deadlines, no collectives
  ncclComm_t data_ = nullptr;  // blocking child of init_: every collective; NCCL writes it when
                               // the split's job ends, so its address must stay put
  int rank_;
  int size_;
  CommOptions options_;
  Call last_call_;
  bool split_done_ = false;  // data_ holds the split's final result (null or a communicator)
  bool aborted_ = false;
};

}  // namespace twinstep
