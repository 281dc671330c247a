#include "policies/run_record.h"

#include <algorithm>

#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace twinstep {

void reserve_steps(RunRecord& record, int64_t steps) {
  record.steps.reserve(size_t(std::max<int64_t>(steps, 0)));
#ifdef __linux__
  constexpr size_t kHugePageBytes = size_t{2} << 20;
  const size_t bytes = record.steps.capacity() * sizeof(StepSample);
  if (bytes < 2 * kHugePageBytes) return;
  const auto page = uintptr_t(sysconf(_SC_PAGESIZE));
  const auto begin = (uintptr_t(record.steps.data()) + page - 1) / page * page;
  const auto end = uintptr_t(record.steps.data()) + bytes;
  (void)madvise(reinterpret_cast<void*>(begin), (end - begin) / page * page, MADV_HUGEPAGE);
#endif
}

}  // namespace twinstep
