// Weights into L2 ahead of the GEMV that reads them. A decode step alternates weight streams
// (GEMVs, bound by DRAM) with chains of small latency-bound kernels (attention, norms, routing)
// during which DRAM idles; a prefetch issued as such a chain starts lets the next GEMV read part
// of its weights from L2 instead. A hint: nothing is written and no result changes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/status.h"

namespace ds41rt::backend::cuda {

struct l2_range {
    const void *p = nullptr;  // 16-byte aligned
    size_t bytes = 0;         // a tail short of 16 bytes is left out
};
constexpr int L2_RANGES = 8;

// Asks L2 for ranges[0..n) in order, at most `budget` bytes in all (the first ranges whole, the
// last one cut). One small launch in stream order. Its blocks may last until their requests are
// served (the DRAM time of the budget), so a caller that wants them beside other work launches it
// on a side stream. n <= L2_RANGES.
Status l2_prefetch(const l2_range *ranges, int n, size_t budget, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
