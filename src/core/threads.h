// A fixed pool of worker threads for the CPU backend's data-parallel loops.
//
// parallel_for splits [0, n) into contiguous chunks, one per thread, and returns when all are
// done. The split depends only on n and the thread count, so results that reduce per index
// are deterministic whatever the scheduling. Safe to call from any thread: nested calls, and
// calls while another thread's loop holds the pool, run serially in the caller.
#pragma once

#include <cstdint>
#include <functional>

namespace ds41rt {

// Number of threads parallel_for uses (DS41RT_THREADS or the hardware count).
int thread_count();
// Runs fn(begin, end) over chunks of [0, n). grain: the smallest chunk worth a thread.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)> &fn, int64_t grain = 1);

}  // namespace ds41rt
