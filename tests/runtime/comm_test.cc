// runtime/comm.h on one GPU: a 1-rank NCCL communicator (the collectives' results are the
// inputs, through the blocking communicator split from the init one), checked argument errors,
// the world of one without mpirun, and NCCL init's deadline when rank 1 of 2 never joins. Skips
// without a GPU. The multi-rank bootstrap deadline is tested on CPU under mpirun
// (tests/reliability).
#include "runtime/comm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace twinstep {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p_, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p_); }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

std::vector<float> download(const void* p, size_t n) {
  std::vector<float> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

TEST(Comm, OneRankAllReduceAndAllToAllReturnTheInput) {
  SKIP_WITHOUT_GPU();
  const auto comm = Communicator::create(Communicator::new_unique_id(), 0, 1);
  ASSERT_EQ(comm->rank(), 0);
  ASSERT_EQ(comm->size(), 1);
  constexpr size_t kN = 1000;
  std::vector<float> input(kN);
  for (size_t i = 0; i < kN; ++i) input[i] = 0.25f * float(i) - 7.0f;  // exact in float
  DeviceBuffer send(kN * 4), recv(kN * 4), swapped(kN * 4);
  ASSERT_EQ(cudaMemcpy(send.get(), input.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(recv.get(), 0xff, kN * 4), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  comm->all_reduce_sum(send.get(), recv.get(), kN, CommType::kF32, stream);
  comm->all_to_all(send.get(), swapped.get(), kN, CommType::kF32, stream);
  comm->synchronize(stream, "test collectives");
  // The sum over one rank is the rank's own input, bit for bit; so is its all-to-all block.
  EXPECT_EQ(download(recv.get(), kN), input);
  EXPECT_EQ(download(swapped.get(), kN), input);
  // In place.
  comm->all_reduce_sum(send.get(), send.get(), kN, CommType::kF32, stream);
  comm->synchronize(stream, "in-place all-reduce");
  EXPECT_EQ(download(send.get(), kN), input);
  cudaStreamDestroy(stream);
}

TEST(Comm, WorldOfOneWithoutMpirun) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(world_size(), 1);
  const auto comm = Communicator::create_world();
  EXPECT_EQ(comm->size(), 1);
}

TEST(Comm, ArgumentErrorsNameTheOperation) {
  SKIP_WITHOUT_GPU();
  try {
    Communicator::create("short", 0, 1);
    FAIL() << "a 5-byte unique id was accepted";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "NCCL init on rank 0 of 1: the unique id has 5 bytes, expected 128");
  }
  const auto comm = Communicator::create(Communicator::new_unique_id(), 0, 1);
  DeviceBuffer buf(16);
  try {
    comm->send(buf.get(), 4, CommType::kF32, 1, nullptr);
    FAIL() << "a send to rank 1 of a 1-rank communicator was accepted";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "send of 4 elements to rank 1: no such rank (size 1)");
  }
}

// Rank 0 of 2 alone: the non-blocking init never completes, so create() gives up at the
// deadline, aborts, and names the operation and the rank.
TEST(Comm, NcclInitWithoutTheOtherRankEndsAtTheDeadline) {
  SKIP_WITHOUT_GPU();
  CommOptions o;
  o.join_timeout_s = 2;
  o.op_timeout_s = 2;
  const auto start = std::chrono::steady_clock::now();
  try {
    Communicator::create(Communicator::new_unique_id(), 0, 2, o);
    FAIL() << "a 2-rank communicator was created with one rank";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(),
                 "NCCL init on rank 0 of 2: did not complete within 2 s (a rank did not join or "
                 "is stuck); communicator aborted");
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(s, 2.0);
  EXPECT_LT(s, 20.0) << "the abort after the deadline took too long";
}

}  // namespace
}  // namespace twinstep
