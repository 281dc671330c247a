// A job for comm_bootstrap_test.sh under mpirun: every rank but MISSING (or all, with -1) calls
// bootstrap_world with a deadline of TIMEOUT_S seconds; rank 0's payload is "id from rank 0".
// Prints "rank R: payload <p>" or "rank R: <CommError text>" and exits 0 or 3. The missing rank
// sleeps 3 x TIMEOUT_S without joining, then leaves; with `late` it joins after 1.5 x TIMEOUT_S.
//   comm_bootstrap_probe TIMEOUT_S MISSING [late]
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/comm.h"

int main(int argc, char** argv) {
  if (argc != 3 && !(argc == 4 && std::string(argv[3]) == "late")) {
    std::fprintf(stderr, "usage: comm_bootstrap_probe TIMEOUT_S MISSING_RANK [late]\n");
    return 2;
  }
  const double timeout_s = std::atof(argv[1]);
  const int missing = std::atoi(argv[2]);
  const bool late = argc == 4;
  MPI_Init(&argc, &argv);
  const int rank = twinstep::world_rank();
  int status = 0;
  if (rank == missing && !late) {
    usleep(useconds_t(3 * timeout_s * 1e6));
  } else {
    if (rank == missing) usleep(useconds_t(1.5 * timeout_s * 1e6));
    try {
      const std::string p =
          twinstep::bootstrap_world([] { return std::string("id from rank 0"); }, timeout_s);
      std::printf("rank %d: payload %s\n", rank, p.c_str());
    } catch (const twinstep::CommError& e) {
      std::printf("rank %d: %s\n", rank, e.what());
      status = 3;
    }
  }
  std::fflush(stdout);
  MPI_Finalize();
  return status;
}
