// bootstrap_world and the world rank/size (runtime/comm.h): MPI where built with it, else a
// world of one. No CUDA, no NCCL: the bootstrap and its deadline are tested on CPU under mpirun.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "runtime/comm.h"

#ifdef TWINSTEP_HAVE_MPI
#include <mpi.h>
#endif

namespace twinstep {
namespace {

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

#ifdef TWINSTEP_HAVE_MPI
constexpr int kTagJoin = 0x7a01;     // rank r -> 0: one byte, "I am here"
constexpr int kTagVerdict = 0x7a02;  // 0 -> rank r: 'O' + payload, or 'E' + error message

bool mpi_running() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  return initialised && !finalised;
}

using Clock = std::chrono::steady_clock;
Clock::time_point deadline_after(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
void pause() { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }

std::string missing_message(const std::vector<int>& missing, int size, double timeout_s) {
  std::string who = missing.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < missing.size(); ++i) who += (i ? ", " : "") + std::to_string(missing[i]);
  return who + " of " + std::to_string(size) + " did not join within " + seconds_text(timeout_s) +
         " s";
}

// Rank 0: collect joins until all arrived or the deadline, then send every joined rank the
// verdict. Returns the payload or throws the verdict's error.
std::string bootstrap_root(int size, const std::function<std::string()>& make_payload,
                           double timeout_s) {
  std::vector<MPI_Request> joins(static_cast<size_t>(size), MPI_REQUEST_NULL);
  std::vector<char> join_bytes(static_cast<size_t>(size));
  for (int r = 1; r < size; ++r)
    MPI_Irecv(&join_bytes[size_t(r)], 1, MPI_CHAR, r, kTagJoin, MPI_COMM_WORLD, &joins[size_t(r)]);
  std::vector<bool> joined(static_cast<size_t>(size), false);
  joined[0] = true;
  int pending = size - 1;
  const Clock::time_point deadline = deadline_after(timeout_s);
  while (pending > 0 && Clock::now() < deadline) {
    for (int r = 1; r < size; ++r) {
      if (joined[size_t(r)]) continue;
      int done = 0;
      MPI_Test(&joins[size_t(r)], &done, MPI_STATUS_IGNORE);
      if (done) {
        joined[size_t(r)] = true;
        --pending;
      }
    }
    if (pending > 0) pause();
  }
  std::vector<int> missing;
  for (int r = 1; r < size; ++r) {
    if (joined[size_t(r)]) continue;
    missing.push_back(r);
    MPI_Cancel(&joins[size_t(r)]);  // never matched: completes as cancelled
    MPI_Wait(&joins[size_t(r)], MPI_STATUS_IGNORE);
  }
  std::string verdict(1, 'O');  // 'O' + payload, or 'E' + error message
  std::string error;
  if (!missing.empty()) {
    error = missing_message(missing, size, timeout_s);
  } else {
    try {
      verdict.append(make_payload());
    } catch (const std::exception& e) {
      error = std::string("rank 0 could not make the bootstrap payload: ") + e.what();
    }
  }
  if (!error.empty()) verdict.assign(1, 'E').append(error);
  // Every rank gets the verdict, a missing one too (if it joins late it learns why the job
  // failed instead of waiting for rank 0). The messages are small (sent eagerly), and a rank
  // that never receives is not waited for past the deadline.
  auto* buffer = new std::string(verdict);
  std::vector<MPI_Request> sends;
  for (int r = 1; r < size; ++r) {
    sends.emplace_back();
    MPI_Isend(buffer->data(), int(buffer->size()), MPI_CHAR, r, kTagVerdict, MPI_COMM_WORLD,
              &sends.back());
  }
  const Clock::time_point send_deadline = deadline_after(timeout_s);
  int all_sent = sends.empty();
  while (!all_sent && Clock::now() < send_deadline) {
    MPI_Testall(int(sends.size()), sends.data(), &all_sent, MPI_STATUSES_IGNORE);
    if (!all_sent) pause();
  }
  if (all_sent) {
    delete buffer;
  } else {
    // A peer that never receives: MPI may still read the buffer, so it is left allocated.
    for (MPI_Request& s : sends)
      if (s != MPI_REQUEST_NULL) MPI_Request_free(&s);
  }
  if (!error.empty()) throw CommError("bootstrap: " + error);
  return verdict.substr(1);
}

// Rank r > 0: join, then wait for rank 0's verdict (rank 0 waits timeout_s for the joins, so
// this rank waits twice that before it calls rank 0 missing).
std::string bootstrap_member(int size, double timeout_s) {
  char here = 1;
  MPI_Request join = MPI_REQUEST_NULL;
  MPI_Isend(&here, 1, MPI_CHAR, 0, kTagJoin, MPI_COMM_WORLD, &join);
  const Clock::time_point deadline = deadline_after(2 * timeout_s);
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    MPI_Iprobe(0, kTagVerdict, MPI_COMM_WORLD, &arrived, &status);
    if (arrived) {
      int bytes = 0;
      MPI_Get_count(&status, MPI_CHAR, &bytes);
      std::string verdict(size_t(bytes), '\0');
      MPI_Recv(verdict.data(), bytes, MPI_CHAR, 0, kTagVerdict, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Wait(&join, MPI_STATUS_IGNORE);  // matched by rank 0 before it sent the verdict
      if (verdict.empty() || (verdict[0] != 'O' && verdict[0] != 'E'))
        throw CommError("bootstrap: malformed verdict from rank 0");
      if (verdict[0] == 'E') throw CommError("bootstrap: " + verdict.substr(1));
      return verdict.substr(1);
    }
    if (Clock::now() >= deadline) {
      MPI_Request_free(&join);
      throw CommError("bootstrap: " + missing_message({0}, size, 2 * timeout_s));
    }
    pause();
  }
}
#endif

}  // namespace

int world_rank() {
#ifdef TWINSTEP_HAVE_MPI
  if (mpi_running()) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
#endif
  return 0;
}

int world_size() {
#ifdef TWINSTEP_HAVE_MPI
  if (mpi_running()) {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }
#endif
  return 1;
}

std::string bootstrap_world(const std::function<std::string()>& make_payload, double timeout_s) {
  if (!(timeout_s > 0)) throw CommError("bootstrap: timeout must be > 0 s");
  const int size = world_size();
  if (size == 1) return make_payload();
#ifdef TWINSTEP_HAVE_MPI
  return world_rank() == 0 ? bootstrap_root(size, make_payload, timeout_s)
                           : bootstrap_member(size, timeout_s);
#else
  return make_payload();  // unreachable: world_size() is 1 without MPI
#endif
}

}  // namespace twinstep
